// A batch request held back for a nearly spent quota (x-ratelimit-remaining at most 2%) gets no slot before the quota
// resets. The one wait rule says such a request is answered at once when that reset is past its deadline, with the
// reset as its retry-after. Found by a black-box run: with the reset 59 s away and a 30 s deadline, the request was
// queued for 27.5 s, then shed with a retry-after estimated from the (empty) queue, so the SDK came back into the
// same hold a second later.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ProviderPool, type Acquired, type SlotRequest } from '../src/pools/provider-pool.ts';

beforeEach(() => vi.useFakeTimers({ now: 0 }));
afterEach(() => vi.useRealTimers());

const pool = () =>
  new ProviderPool(
    { provider: 'p', capacity: 4, retryCapacity: 1, classes: [{ name: 'online', minShare: 0.5, maxQueue: 10 }, { name: 'batch', minShare: 0.1, maxQueue: 10 }], decrease: 0.9, minLimit: 1 },
    () => Date.now(),
  );
const req = (cls: number, deadlineAtMs: number): SlotRequest => ({ cls, target: 'p/m', retry: false, deadlineAtMs, minAttemptMs: 1_000, signal: new AbortController().signal });

describe('a lower class held back until the quota resets', () => {
  it('is shed at once, told the reset, when the reset is past its deadline', async () => {
    const p = pool();
    p.holdLowerClasses('p/m', 30_000);
    let answer: Acquired | undefined;
    void p.acquire(req(1, 10_000)).then((a) => (answer = a));
    await vi.advanceTimersByTimeAsync(10);
    expect(answer).toMatchObject({ ok: false, reason: 'deadline' });
    expect((answer as { retryAfterMs: number }).retryAfterMs).toBeGreaterThanOrEqual(29_000);
    expect(p.snapshot().queued).toEqual([0, 0]);
  });

  it('still waits for the reset when its deadline leaves room, and online is not held', async () => {
    const p = pool();
    p.holdLowerClasses('p/m', 5_000);
    expect(p.expectedWaitMs(1, 'p/m')).toBeGreaterThanOrEqual(5_000);
    expect(p.expectedWaitMs(0, 'p/m')).toBe(1_000);
    let answer: Acquired | undefined;
    void p.acquire(req(1, 60_000)).then((a) => (answer = a));
    await vi.advanceTimersByTimeAsync(4_000);
    expect(answer).toBeUndefined();
    await vi.advanceTimersByTimeAsync(1_100);
    expect(answer).toMatchObject({ ok: true });
  });
});
