// Mutation tests for the day's changes (QA rev12): providers' request and token rates per target (pools.requestsPerMinute,
// burst, tokensPerMinute): the pure pacing math (src/policy/target-rate.ts) and its enforcement in the pool
// (src/pools/provider-pool.ts: #ratesAllow, #armRateTimer, #take's spend, expectedWaitMs, setShare's part, the floor
// under a rate), with a fake clock.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { rateOf } from '../src/policy/client-rate.ts';
import { rateGiveBack, rateSpend, rateWait, ratesPart, targetRates, type TargetDues } from '../src/policy/target-rate.ts';
import { ratePool, rateReq, trackGrant } from './helpers/rate-pool.ts';
import { attemptInSlot } from '../src/pipeline/slot-attempt.ts';
import { RequestAbort } from '../src/pipeline/request-abort.ts';
import type { TargetPlan } from '../src/pipeline/target-attempts.ts';

beforeEach(() => vi.useFakeTimers({ now: 0 }));
afterEach(() => vi.useRealTimers());

const pool = ratePool;
const req = rateReq;
const track = trackGrant;

describe('the wait estimate under a target\'s rates', () => {
  it('counts ahead of an online newcomer neither the batch waiters of its target nor the online waiters of another', async () => {
    const p = pool({ requests: rateOf(60, 1) });
    const log: Array<[string, number]> = [];
    void track(p, 'a', req(), log);
    void track(p, 'b', req({ target: 'p/b' }), log);
    for (let i = 0; i < 10; i++) void track(p, `batch-a${i}`, req({ cls: 1 }), log);
    for (let i = 0; i < 5; i++) void track(p, `online-b${i}`, req({ target: 'p/b' }), log);
    await vi.advanceTimersByTimeAsync(0);
    expect(log).toEqual([['a', 0], ['b', 0]]);
    // Its target's next turn is at 1 s, and online goes before batch: it can wait for it.
    const newcomer = track(p, 'online-a', req({ deadlineAtMs: 2_500, minAttemptMs: 100 }), log);
    await vi.advanceTimersByTimeAsync(1_000);
    expect((await newcomer).ok).toBe(true);
    expect(log).toContainEqual(['online-a', 1_000]);
    p.close();
  });

  it('counts the waiters ahead on its target for their own tokens, not its own', async () => {
    // 12,000 tokens a minute (one every 5 ms), a minute's worth at once.
    const p = pool({ tokens: rateOf(12_000, 12_000) });
    const log: Array<[string, number]> = [];
    void track(p, 'full', req({ tokens: 12_000 }), log);
    for (let i = 0; i < 3; i++) void track(p, `small${i}`, req({ tokens: 10 }), log);
    await vi.advanceTimersByTimeAsync(0);
    // 4,000 tokens behind 30: its turn once 4,030 are back, at 20.15 s; its deadline 30 s.
    const big = track(p, 'big', req({ tokens: 4_000, deadlineAtMs: 30_000, minAttemptMs: 100 }), log);
    await vi.advanceTimersByTimeAsync(20_150);
    expect((await big).ok).toBe(true);
    expect(log.at(-1)).toEqual(['big', 20_150]);
    p.close();
  });
});

describe('a turn of a target\'s rates on which nothing was sent', () => {
  it('goes back, so the next waiter goes at once (a backlog parked by a breaker drains, not one a second)', async () => {
    const p = pool({ requests: rateOf(60, 1), tokens: rateOf(6_000, 6_000) });
    const log: Array<[string, number]> = [];
    const first = await p.acquire(req({ tokens: 6_000 }));
    expect(first.ok).toBe(true);
    const next = track(p, 'next', req({ tokens: 6_000 }), log);
    await vi.advanceTimersByTimeAsync(10);
    expect(log).toEqual([]);
    if (first.ok) {
      first.slot.unsent();
      first.slot.release();
    }
    await vi.advanceTimersByTimeAsync(0);
    expect((await next).ok).toBe(true);
    expect(log).toEqual([['next', 10]]);
    p.close();
  });
});

describe('a waiter granted its turn after its target went away (slot-attempt.ts)', () => {
  it('gives the turn back as it parks: the next waiter goes at once, not a turn later', async () => {
    const p = pool({ requests: rateOf(60, 1) });
    const first = await p.acquire(req());
    expect(first.ok).toBe(true);
    const plan = { pool: p, cls: 0, limitKey: 'p/a' } as unknown as TargetPlan;
    const ctx = { route: { config: { minAttemptMs: 0 } }, api: 'chat', stream: false, shape: {}, signal: new RequestAbort(), deadlineAtMs: 600_000 } as never;
    const upstream = { path: '/v1/chat/completions', headers: {}, body: '{}' } as never;
    // Queued for the rate's next turn (1 s), and found the breaker open when it came: nothing is sent.
    const parked = attemptInSlot(ctx, plan, upstream, { retry: false, released: false }, Date.now, () => ({ kind: 'gone', reason: 'breaker', availableAtMs: 30_000 }));
    const log: Array<[string, number]> = [];
    void track(p, 'next', req(), log);
    await vi.advanceTimersByTimeAsync(1_000);
    expect((await parked).kind).toBe('gone');
    expect(log).toEqual([['next', 1_000]]);
    p.close();
  });
});

describe('the one rate timer of a pool', () => {
  it('is not moved later by another target\'s longer wait: the earlier waiter still goes at its turn', async () => {
    const p = pool({ requests: rateOf(60, 1), tokens: rateOf(6_000, 6_000) });
    const log: Array<[string, number]> = [];
    void track(p, 'a', req({ tokens: 1 }), log);
    void track(p, 'b', req({ target: 'p/b', tokens: 6_000 }), log);
    await vi.advanceTimersByTimeAsync(0);
    // a's target's next turn at 1 s; b's target has no tokens left for 30 s.
    void track(p, 'a2', req({ tokens: 1 }), log);
    void track(p, 'b2', req({ target: 'p/b', tokens: 3_000 }), log);
    await vi.advanceTimersByTimeAsync(1_000);
    expect(log).toContainEqual(['a2', 1_000]);
    await vi.advanceTimersByTimeAsync(29_000);
    expect(log.at(-1)).toEqual(['b2', 30_000]);
    p.close();
  });

  it('wakes every waiter in turn, with the timer fired once already', async () => {
    const p = pool({ requests: rateOf(60, 1) });
    const log: Array<[string, number]> = [];
    for (const l of ['a', 'b', 'c', 'd']) void track(p, l, req(), log);
    await vi.advanceTimersByTimeAsync(3_000);
    expect(log).toEqual([['a', 0], ['b', 1_000], ['c', 2_000], ['d', 3_000]]);
    p.close();
  });

  it('still wakes the waiters once the fleet cuts the instance\'s part of the rate while they wait', async () => {
    const p = pool({ requests: rateOf(60, 1) }, 10);
    const log: Array<[string, number]> = [];
    for (const l of ['a', 'b', 'c']) void track(p, l, req(), log);
    await vi.advanceTimersByTimeAsync(500);
    p.setShare(0.5);
    // At 0.5 s, a's half a request still owed takes 1 s at the half rate: b at 1.5 s; after it, one every 2 s.
    await vi.advanceTimersByTimeAsync(3_000);
    expect(log).toEqual([['a', 0], ['b', 1_500], ['c', 3_500]]);
    p.close();
  });
});

describe('the wait estimate under a target\'s rates, further', () => {
  it('counts the higher classes\' waiters of its target ahead of a batch newcomer: shed at once, told the wait', async () => {
    const p = pool({ requests: rateOf(60, 1) });
    const log: Array<[string, number]> = [];
    void track(p, 'a', req(), log);
    for (let i = 0; i < 5; i++) void track(p, `online${i}`, req(), log);
    await vi.advanceTimersByTimeAsync(0);
    const batch = await p.acquire(req({ cls: 1, deadlineAtMs: 3_000, minAttemptMs: 100 }));
    expect(batch).toEqual({ ok: false, reason: 'request_rate', retryAfterMs: 6_000 });
    p.close();
  });

  it('forgets the tokens of waiters that left', async () => {
    const p = pool({ tokens: rateOf(6_000, 6_000) });
    const log: Array<[string, number]> = [];
    void track(p, 'full', req({ tokens: 6_000 }), log);
    void track(p, 'small', req({ tokens: 10 }), log);
    const gone = new AbortController();
    const left = [1, 2, 3].map(() => p.acquire(req({ tokens: 5_000, signal: gone.signal })));
    await vi.advanceTimersByTimeAsync(0);
    gone.abort();
    await Promise.all(left);
    // Behind one waiter of 10 tokens: its turn at 0.2 s.
    const newcomer = track(p, 'newcomer', req({ tokens: 10, deadlineAtMs: 3_000, minAttemptMs: 100 }), log);
    await vi.advanceTimersByTimeAsync(200);
    expect((await newcomer).ok).toBe(true);
    expect(log.at(-1)).toEqual(['newcomer', 200]);
    p.close();
  });

  it('counts a request without an estimate, or of none, for one token', async () => {
    const p = pool({ tokens: rateOf(60, 60) });
    const log: Array<[string, number]> = [];
    for (let i = 0; i < 60; i++) void track(p, `n${i}`, req({ tokens: 0 }), log);
    void track(p, 'last', req(), log);
    await vi.advanceTimersByTimeAsync(0);
    expect(log).toHaveLength(60);
    await vi.advanceTimersByTimeAsync(1_000);
    expect(log.at(-1)).toEqual(['last', 1_000]);
    p.close();
  });
});

describe('an instance of a fleet left only the pool\'s floor slot', () => {
  it('paces at its share of the rate, not at that slot\'s part (a tenth): those, one at least each, summed past the rate', async () => {
    const p = pool({ requests: rateOf(60, 1) }, 10);
    p.setShare(0.04);
    const log: Array<[string, number]> = [];
    for (const l of ['a', 'b']) void track(p, l, req(), log);
    await vi.advanceTimersByTimeAsync(24_999);
    expect(log).toEqual([['a', 0]]);
    await vi.advanceTimersByTimeAsync(1);
    expect(log).toEqual([['a', 0], ['b', 25_000]]);
    p.close();
  });
});

describe('the pure pacing math', () => {
  it('gives a fleet\'s instance its share of the rate and of its burst, at least one', () => {
    expect(ratesPart({ requests: { intervalMs: 100, burst: 10 }, tokens: { intervalMs: 2, burst: 30_000 } }, 0.25)).toEqual({
      requests: { intervalMs: 400, burst: 2 },
      tokens: { intervalMs: 8, burst: 7_500 },
    });
    expect(ratesPart({ requests: { intervalMs: 100, burst: 3 } }, 0.1).requests).toEqual({ intervalMs: 1_000, burst: 1 });
  });

  it('waits for those ahead and the request, and gives back a turn on which nothing was sent', () => {
    const rates = targetRates({ requestsPerMinute: 60, burst: 2, tokensPerMinute: 600 })!;
    expect(rates).toEqual({ requests: { intervalMs: 1_000, burst: 2 }, tokens: { intervalMs: 100, burst: 600 } });
    const dues: TargetDues = {};
    expect(rateWait(dues, rates, 0, 100, { requests: 1, tokens: 100 })).toBe(0);
    expect(rateWait(dues, rates, 0, 100, { requests: 2, tokens: 100 })).toBe(1_000);
    expect(rateWait(dues, rates, 0, 500, { requests: 0, tokens: 300 })).toBe(20_000);
    rateSpend(dues, rates, 0, 600);
    expect(dues).toEqual({ requests: 1_000, tokens: 60_000 });
    rateGiveBack(dues, rates, 0, 600);
    expect(dues).toEqual({ requests: undefined, tokens: undefined });
  });
});
