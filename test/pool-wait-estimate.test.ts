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
//
// Streams hold their slot until they end, long after the first token that ends their round trip. Found by a black-box
// run: 2,000 agents streaming 6 s answers through the default 128 slots queued for up to 50 s, while the ones shed
// (queue full) were told to come back in 1.4 s (8 round trips of 175 ms to the first token), so each SDK spent its
// two retries within seconds and failed: 744 of 2,000 agents.
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

describe('the wait for slots held by streams', () => {
  it('counts in how long an answered attempt holds its slot, not in round trips to its first token', async () => {
    const p = pool(2, 10);
    // Two streams: the first token after 50 ms, the end 6 s later.
    const slots = await Promise.all([p.acquire(req(0, 120_000)), p.acquire(req(0, 120_000))]);
    await vi.advanceTimersByTimeAsync(50);
    for (const a of slots) {
      if (!a.ok) throw new Error('expected a slot');
      p.observe('p/m', 'success', 50);
      a.slot.answered();
    }
    await vi.advanceTimersByTimeAsync(5_950);
    for (const a of slots) if (a.ok) a.slot.release();
    // Both slots busy with the next two streams, four waiting: the last of them waits three holds (18 s), not 150 ms.
    const next = Array.from({ length: 6 }, () => p.acquire(req(0, 120_000)));
    await vi.advanceTimersByTimeAsync(1);
    expect(p.snapshot().queued[0]).toBe(4);
    expect(p.expectedWaitMs(0, 'p/m')).toBeGreaterThanOrEqual(15_000);
    // A request whose deadline comes before that is told so at once, with that wait as its retry-after.
    let answer: Acquired | undefined;
    void p.acquire(req(0, 10_000)).then((a) => (answer = a));
    await vi.advanceTimersByTimeAsync(1);
    expect(answer).toMatchObject({ ok: false, reason: 'deadline' });
    expect((answer as { retryAfterMs: number }).retryAfterMs).toBeGreaterThanOrEqual(15_000);
    void next;
  });

  it('keeps timing by round trips where nothing is held past its answer (unanswered attempts are not timed)', async () => {
    const p = pool(2, 10);
    const a = await p.acquire(req(0, 120_000));
    if (!a.ok) throw new Error('expected a slot');
    // A 429 holds its slot for no time and says nothing about how long answers take: not timed.
    p.observe('p/m', 'rate-limited', 5);
    await vi.advanceTimersByTimeAsync(5);
    a.slot.release();
    const b = await p.acquire(req(0, 120_000));
    if (!b.ok) throw new Error('expected a slot');
    await vi.advanceTimersByTimeAsync(400);
    p.observe('p/m', 'success', 400);
    b.slot.answered();
    b.slot.release();
    expect(p.expectedWaitMs(0, 'p/m')).toBe(400);
  });
});
