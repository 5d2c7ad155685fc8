// The wait a provider pool expects for a new request: the one wait rule sheds at once a request that cannot expect a
// slot before its deadline, so the estimate decides who waits and who is told to come back.
//
// A batch request held back for a nearly spent quota (x-ratelimit-remaining at most 2%) gets no slot before the quota
// resets. The one wait rule says such a request is answered at once when that reset is past its deadline, with the
// reset as its retry-after. Found by a black-box run: with the reset 59 s away and a 30 s deadline, the request was
// queued for 27.5 s, then shed with a retry-after estimated from the (empty) queue, so the SDK came back into the
// same hold a second later.
//
// A burst at one instance of an idle fleet: its share starts at an even split (each instance's demand + 1), and the
// next exchange of demand, half a second later, gives it what the others do not use. Found by a black-box run: with
// one idle instance beside it, an instance shed half of a 100-request burst that the next exchange had room for.
// Shedding judges by what the next exchange leaves; admission still keeps to the share in force.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ProviderPool, type Acquired, type SlotRequest } from '../src/pools/provider-pool.ts';

beforeEach(() => vi.useFakeTimers({ now: 0 }));
afterEach(() => vi.useRealTimers());

const pool = (capacity = 4, maxQueue = 10) =>
  new ProviderPool(
    { provider: 'p', capacity, retryCapacity: 1, classes: [{ name: 'online', minShare: 0.5, maxQueue }, { name: 'batch', minShare: 0.1, maxQueue }], decrease: 0.9, minLimit: 1 },
    () => Date.now(),
  );
const req = (cls: number, deadlineAtMs: number, minAttemptMs = 1_000): SlotRequest => ({ cls, target: 'p/m', retry: false, deadlineAtMs, minAttemptMs, signal: new AbortController().signal });

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

describe('the wait a fleet instance expects for a burst', () => {
  it('counts on what the rest of the fleet leaves, not on the even split of an idle fleet', async () => {
    const p = pool(10, 1_000);
    // Two instances, both idle at the last exchange: an even split, and nothing used elsewhere.
    p.setShare(0.5, 0);
    const answers = Array.from({ length: 30 }, () => p.acquire(req(0, 4_000, 500)));
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
    const p = pool(10, 1_000);
    p.setShare(0.5, 0);
    const settled: boolean[] = [];
    const answers = Array.from({ length: 40 }, (_, i) => p.acquire(req(0, 3_000, 500)).then((a) => ((settled[i] = a.ok), a)));
    await vi.advanceTimersByTimeAsync(1);
    // A wait of at most 2.5 s leaves the 0.5 s an attempt needs: at 10 per round trip, 20 waiters (at 5, only 10).
    expect(p.snapshot().inUse[0]).toBe(5);
    expect(p.snapshot().queued[0]).toBe(20);
    expect(settled.filter((ok) => ok === false)).toHaveLength(15);
    const shed = await Promise.all(answers.slice(25));
    expect(shed.every((a) => !a.ok && a.reason === 'deadline')).toBe(true);
  });
});
