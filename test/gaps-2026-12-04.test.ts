// Gaps closed on 2026-12-04, each found by reading the code, on the fake clock (vi.useFakeTimers) the pool's
// injected now() reads.
//
// A retry waits for both the retry cap (pools.maxConcurrentRetries) and its target's rate. The wait estimate read only
// the rate (a second away) and not the retry held by a 20 s stream: the retry waited, then was shed at its last chance
// instead of at once.
//
// The message of a request shed for its target's token rate named pools.tokenBurst for a tokensPerMinute of more than
// three decimals that rounds up to a whole number (6000.9996 read as 6001/min, its default burst of 6000 as one set
// under a minute's worth).
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { rateOf } from '../src/policy/client-rate.ts';
import { targetRates } from '../src/policy/target-rate.ts';
import { ProviderPool, type Acquired, type SlotRequest } from '../src/pools/provider-pool.ts';

beforeEach(() => vi.useFakeTimers({ now: 0 }));
afterEach(() => vi.useRealTimers());

const CLASSES = [
  { name: 'online', minShare: 0, maxQueue: 100 },
  { name: 'batch', minShare: 0, maxQueue: 100 },
];

/** 10 slots, one retry at a time, a request a second (or `rates`). */
function pool(rates = targetRates({ requestsPerMinute: 60, burst: 1 })): ProviderPool {
  return new ProviderPool({ provider: 'p', capacity: 10, retryCapacity: 1, classes: CLASSES, decrease: 0.9, minLimit: 1, rates }, () => Date.now());
}

const req = (extra: Partial<SlotRequest> = {}): SlotRequest => ({ cls: 0, target: 'p/m', retry: false, deadlineAtMs: 600_000, minAttemptMs: 0, signal: new AbortController().signal, ...extra });

/** Its slot, granted at once. */
async function granted(p: ProviderPool, r: SlotRequest) {
  const a = await p.acquire(r);
  if (!a.ok) throw new Error(`not granted: ${a.reason}`);
  return a.slot;
}

/** Answers take 20 s to end (a stream holds its slot): one timed before the test's requests. */
async function answersTake20s(p: ProviderPool): Promise<void> {
  const slot = await granted(p, req());
  slot.answered();
  await vi.advanceTimersByTimeAsync(20_000);
  slot.release();
}

/** What a pending acquire has come to so far (undefined: still waiting). */
function settled(a: Promise<Acquired>): () => Acquired | undefined {
  let out: Acquired | undefined;
  void a.then((r) => (out = r));
  return () => out;
}

describe('the wait a retry expects, held by both the retry cap and its target\'s rate', () => {
  it('is the retry cap\'s when that is longer: a retry that cannot have it before its deadline is shed at once', async () => {
    const p = pool();
    await answersTake20s(p);
    // The one retry allowed is in flight (for another 20 s); the rate's next turn is a second away.
    const inFlight = await granted(p, req({ retry: true }));
    const shed = settled(p.acquire(req({ retry: true, deadlineAtMs: Date.now() + 5_000 })));
    await vi.advanceTimersByTimeAsync(0);
    const at = shed();
    expect(at).toMatchObject({ ok: false, reason: 'deadline' });
    // Told the retry cap's wait, not the rate's second.
    expect(at!.ok === false && at!.reason !== 'aborted' && at!.retryAfterMs).toBeGreaterThanOrEqual(19_000);
    inFlight.release();
    p.close();
  });

  it('counts the holder nearest its end: a retry behind one 19.5 s into a 20 s answer waits and is seated', async () => {
    const p = pool();
    await answersTake20s(p);
    const inFlight = await granted(p, req({ retry: true }));
    await vi.advanceTimersByTimeAsync(19_500);
    // A first attempt takes the rate's turn: the retry's next is a second away, its slots free.
    const first = await granted(p, req());
    const next = settled(p.acquire(req({ retry: true, deadlineAtMs: Date.now() + 5_000 })));
    await vi.advanceTimersByTimeAsync(0);
    // Counted as a whole hold away it was shed at once, told 20 s.
    expect(next()).toBeUndefined();
    await vi.advanceTimersByTimeAsync(500);
    inFlight.answered();
    inFlight.release();
    await vi.advanceTimersByTimeAsync(1_000);
    expect(next()).toMatchObject({ ok: true });
    if (next()?.ok) (next() as Extract<Acquired, { ok: true }>).slot.release();
    first.release();
    p.close();
  });

  it('counts the retries waiting ahead for the cap, not only the one in flight', async () => {
    const p = pool(targetRates({ requestsPerMinute: 6_000, burst: 100 }));
    await answersTake20s(p);
    const inFlight = await granted(p, req({ retry: true }));
    // One retry waits already (its deadline far): a second one's turn of the cap comes after two answers, 40 s.
    const first = settled(p.acquire(req({ retry: true })));
    const second = settled(p.acquire(req({ retry: true, deadlineAtMs: Date.now() + 30_000 })));
    await vi.advanceTimersByTimeAsync(0);
    expect(first()).toBeUndefined();
    expect(second()).toMatchObject({ ok: false, reason: 'deadline' });
    inFlight.release();
    await vi.advanceTimersByTimeAsync(0);
    expect(first()).toMatchObject({ ok: true });
    p.close();
  });

  it('is the rate\'s when that is longer, and the shed names the rate', async () => {
    // A turn every 10 s; the one retry allowed is in flight, timed at a second a slot.
    const p = pool(targetRates({ requestsPerMinute: 6, burst: 1 }));
    const inFlight = await granted(p, req({ retry: true }));
    const a = await p.acquire(req({ retry: true, deadlineAtMs: Date.now() + 5_000 }));
    expect(a).toMatchObject({ ok: false, reason: 'request_rate' });
    expect(a.ok === false && a.reason !== 'aborted' && a.retryAfterMs).toBeGreaterThanOrEqual(9_000);
    inFlight.release();
    p.close();
  });

  it('still waits when both holds end before its deadline, and is granted once both have', async () => {
    const p = pool();
    await answersTake20s(p);
    const inFlight = await granted(p, req({ retry: true }));
    const waiting = settled(p.acquire(req({ retry: true, deadlineAtMs: Date.now() + 60_000 })));
    await vi.advanceTimersByTimeAsync(5_000);
    // The rate's turn came; the cap still holds it.
    expect(waiting()).toBeUndefined();
    inFlight.release();
    await vi.advanceTimersByTimeAsync(0);
    expect(waiting()).toMatchObject({ ok: true });
    p.close();
  });

  it('leaves a first attempt beside the held retries to the rate alone', async () => {
    const p = pool();
    await answersTake20s(p);
    const inFlight = await granted(p, req({ retry: true }));
    const first = settled(p.acquire(req({ deadlineAtMs: Date.now() + 5_000 })));
    await vi.advanceTimersByTimeAsync(1_000);
    expect(first()).toMatchObject({ ok: true });
    inFlight.release();
    p.close();
  });
});

describe('the message of a request shed for its target\'s token rate', () => {
  const shedWhy = (perMinute: { tokensPerMinute: number; tokenBurst?: number }) =>
    new ProviderPool({ provider: 'p', capacity: 10, retryCapacity: 1, classes: CLASSES, decrease: 0.9, minLimit: 1, rates: targetRates(perMinute) }, () => Date.now()).rateShedWhy('token_rate', 'online');

  it('names pools.tokenBurst only when one was set under a minute\'s worth, whatever the decimals of tokensPerMinute', () => {
    // Its default burst (a minute's worth, 6000) with a rate shown rounded to 6001/min: no tokenBurst to blame.
    expect(shedWhy({ tokensPerMinute: 6000.9996 })).toBe("provider p's token rate (6001/min, pools.tokensPerMinute) leaves no turn for class online before the request's deadline");
    expect(shedWhy({ tokensPerMinute: 59.99999 })).not.toMatch(/tokenBurst/);
    // Rates whose 60,000 / interval lands a hair under the whole number in floating point (29, 55): the default still.
    for (const tpm of [29, 55, 58, 110]) expect(shedWhy({ tokensPerMinute: tpm })).not.toMatch(/tokenBurst/);
    // One set under a minute's worth is named, at those rates too.
    expect(shedWhy({ tokensPerMinute: 6000.9996, tokenBurst: 5_999 })).toMatch(/; at most 5999 at once, pools\.tokenBurst\)/);
    expect(shedWhy({ tokensPerMinute: 29, tokenBurst: 28 })).toMatch(/; at most 28 at once, pools\.tokenBurst\)/);
    expect(shedWhy({ tokensPerMinute: 6_000, tokenBurst: 1_000 })).toMatch(/; at most 1000 at once, pools\.tokenBurst\)/);
    expect(rateOf(6000.9996, 6_000).burst).toBe(6_000);
  });
});
