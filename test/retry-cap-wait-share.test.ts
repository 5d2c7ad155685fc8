// The wait a retry expects for the retry cap (pools.maxConcurrentRetries) when the fleet's share has just shrunk it
// below the retries already in flight: those are in flight together and end within a slot's hold, as the slots of a
// shrunk share do (the slot estimate counts only the queue, not what is in flight). Counted a cap's worth per round,
// 10 retries in flight and a new cap of 2 read as five rounds, and a retry that one round would seat was shed at once.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ProviderPool, type Acquired, type SlotRequest } from '../src/pools/provider-pool.ts';

beforeEach(() => vi.useFakeTimers({ now: 0 }));
afterEach(() => vi.useRealTimers());

const req = (extra: Partial<SlotRequest> = {}): SlotRequest => ({ cls: 0, target: 'p/m', retry: false, deadlineAtMs: 600_000, minAttemptMs: 0, signal: new AbortController().signal, ...extra });

async function granted(p: ProviderPool, r: SlotRequest) {
  const a = await p.acquire(r);
  if (!a.ok) throw new Error(`not granted: ${a.reason}`);
  return a.slot;
}

function settled(a: Promise<Acquired>): () => Acquired | undefined {
  let out: Acquired | undefined;
  void a.then((r) => (out = r));
  return () => out;
}

describe('a retry behind more retries in flight than a shrunk fleet share allows', () => {
  it('expects them to end within a slot\'s hold, and waits for the room rather than being shed at once', async () => {
    const p = new ProviderPool({ provider: 'p', capacity: 50, retryCapacity: 10, classes: [{ name: 'online', minShare: 0, maxQueue: 100 }], decrease: 0.9, minLimit: 1 }, () => Date.now());
    // Answers hold their slot 2 s.
    const timed = await granted(p, req());
    timed.answered();
    await vi.advanceTimersByTimeAsync(2_000);
    timed.release();
    const inFlight = [];
    for (let i = 0; i < 10; i++) inFlight.push(await granted(p, req({ retry: true })));
    // The fleet's exchange: a fifth of the fleet's capacity, so 10 slots and 2 retries.
    p.setShare(0.2);
    const retry = settled(p.acquire(req({ retry: true, deadlineAtMs: Date.now() + 5_000 })));
    await vi.advanceTimersByTimeAsync(0);
    expect(retry()).toBeUndefined();
    // The retries in flight end within their hold: the waiting one is seated once they leave room under the new cap.
    await vi.advanceTimersByTimeAsync(1_500);
    for (const s of inFlight.slice(0, 9)) s.release();
    await vi.advanceTimersByTimeAsync(0);
    expect(retry()).toMatchObject({ ok: true });
    inFlight[9]!.release();
    p.close();
  });
});
