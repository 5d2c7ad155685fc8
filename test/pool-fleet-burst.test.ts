// A burst at one instance of an idle fleet: its share starts at an even split (each instance's demand + 1), and the
// next exchange of demand, half a second later, gives it what the others do not use. Found by a black-box run: with
// one idle instance beside it, an instance shed half of a 100-request burst that the next exchange had room for.
// Shedding judges by what the next exchange leaves; admission still keeps to the share in force.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ProviderPool, type SlotRequest } from '../src/pools/provider-pool.ts';

beforeEach(() => vi.useFakeTimers({ now: 0 }));
afterEach(() => vi.useRealTimers());

const pool = () =>
  new ProviderPool(
    { provider: 'p', capacity: 10, retryCapacity: 2, classes: [{ name: 'online', minShare: 0.5, maxQueue: 1_000 }, { name: 'batch', minShare: 0.1, maxQueue: 1_000 }], decrease: 0.9, minLimit: 1 },
    () => Date.now(),
  );
const req = (deadlineAtMs: number): SlotRequest => ({ cls: 0, target: 'p/m', retry: false, deadlineAtMs, minAttemptMs: 500, signal: new AbortController().signal });

describe('the wait a fleet instance expects for a burst', () => {
  it('counts on what the rest of the fleet leaves, not on the even split of an idle fleet', async () => {
    const p = pool();
    // Two instances, both idle at the last exchange: an even split, and nothing used elsewhere.
    p.setShare(0.5, 0);
    const answers = Array.from({ length: 30 }, () => p.acquire(req(4_000)));
    await vi.advanceTimersByTimeAsync(1);
    // 5 in use, 25 queued: at 10 per round trip (1 s at first) the last one expects 3 s, within its 4 s deadline.
    expect(p.snapshot().inUse[0]).toBe(5);
    expect(p.snapshot().queued[0]).toBe(25);
    expect(p.expectedWaitMs(0, 'p/m')).toBe(3_000);
    // The other instance busy with 8: no more than its own 5 slots can come, and the same queue expects 6 s.
    p.setShare(0.5, 8);
    expect(p.expectedWaitMs(0, 'p/m')).toBe(6_000);
    // Admission keeps to the share in force meanwhile: nothing past 5 was let through.
    expect(p.snapshot().inUse[0]).toBe(5);
    void answers;
  });

  it('sheds at once only what even the room the rest of the fleet leaves cannot serve before the deadline', async () => {
    const p = pool();
    p.setShare(0.5, 0);
    const settled: boolean[] = [];
    const answers = Array.from({ length: 40 }, (_, i) => p.acquire(req(3_000)).then((a) => ((settled[i] = a.ok), a)));
    await vi.advanceTimersByTimeAsync(1);
    // A wait of at most 2.5 s leaves the 0.5 s an attempt needs: at 10 per round trip, 20 waiters (at 5, only 10).
    expect(p.snapshot().inUse[0]).toBe(5);
    expect(p.snapshot().queued[0]).toBe(20);
    expect(settled.filter((ok) => ok === false)).toHaveLength(15);
    const shed = await Promise.all(answers.slice(25));
    expect(shed.every((a) => !a.ok && a.reason === 'deadline')).toBe(true);
  });
});
