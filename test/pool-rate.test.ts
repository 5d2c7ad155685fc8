// A provider's request rate (pools.requestsPerMinute), with a fake clock: each target is granted slots at its rate,
// in class order; a request that cannot expect its turn before its deadline is shed at once with the wait; a fleet's
// instance paces at its share; a waiter that leaves spends nothing.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import { rateOf } from '../src/policy/client-rate.ts';
import { Pools } from '../src/pools/pools.ts';
import { ProviderPool, type Acquired, type SlotRequest } from '../src/pools/provider-pool.ts';
import type { TargetRates } from '../src/policy/target-rate.ts';

beforeEach(() => vi.useFakeTimers({ now: 0 }));
afterEach(() => vi.useRealTimers());

const CLASSES = [
  { name: 'online', minShare: 0, maxQueue: 100 },
  { name: 'batch', minShare: 0, maxQueue: 100 },
];

/** A pool of `capacity` slots with `rates` (a request rate of `perMinute` and `burst`, given as numbers). */
function pool(rates: TargetRates | [perMinute: number, burst: number] | undefined, capacity = 50, classes = CLASSES): ProviderPool {
  const r = Array.isArray(rates) ? { requests: rateOf(rates[0], rates[1]) } : rates;
  return new ProviderPool({ provider: 'p', capacity, retryCapacity: capacity, classes, decrease: 0.9, minLimit: 1, rates: r }, () => Date.now());
}

/** 6,000 tokens a minute (one every 10 ms), a minute's worth at once. */
const TOKENS_6K = { tokens: rateOf(6_000, 6_000) };

const req = (extra: Partial<SlotRequest> = {}): SlotRequest => ({ cls: 0, target: 'p/m', retry: false, deadlineAtMs: 600_000, minAttemptMs: 0, signal: new AbortController().signal, ...extra });

/** Asks for a slot and notes when (fake ms) and in what order it is granted; the slot goes back at once. */
function track(p: ProviderPool, label: string, r: SlotRequest, log: Array<[string, number]>): Promise<Acquired> {
  return p.acquire(r).then((a) => {
    if (a.ok) {
      log.push([label, Date.now()]);
      a.slot.release();
    }
    return a;
  });
}

/** TOKENS_6K's minute's worth spent at 0, then `label` (3,000 tokens) waits for its tokens: 30 s. */
async function spentThenLarge(p: ProviderPool, log: Array<[string, number]>, label: string, large: Partial<SlotRequest> = {}): Promise<void> {
  void track(p, 'spent', req({ tokens: 6_000 }), log);
  await vi.advanceTimersByTimeAsync(0);
  void track(p, label, req({ tokens: 3_000, ...large }), log);
  await vi.advanceTimersByTimeAsync(0);
}

describe('a pool with a request rate', () => {
  it('grants a target its slots at the rate, whatever slots are free', async () => {
    const p = pool([60, 1]);
    const log: Array<[string, number]> = [];
    for (const l of ['a', 'b', 'c']) void track(p, l, req(), log);
    await vi.advanceTimersByTimeAsync(0);
    expect(log).toEqual([['a', 0]]);
    await vi.advanceTimersByTimeAsync(999);
    expect(log).toHaveLength(1);
    await vi.advanceTimersByTimeAsync(1);
    expect(log).toEqual([['a', 0], ['b', 1_000]]);
    await vi.advanceTimersByTimeAsync(1_000);
    expect(log).toEqual([['a', 0], ['b', 1_000], ['c', 2_000]]);
    p.close();
  });

  it('lets a burst go at once after a quiet spell, then paces', async () => {
    const p = pool([60, 3]);
    const log: Array<[string, number]> = [];
    for (const l of ['a', 'b', 'c', 'd']) void track(p, l, req(), log);
    await vi.advanceTimersByTimeAsync(0);
    expect(log.map(([, t]) => t)).toEqual([0, 0, 0]);
    await vi.advanceTimersByTimeAsync(1_000);
    expect(log.at(-1)).toEqual(['d', 1_000]);
    // Quiet for the burst's time: three go at once again.
    await vi.advanceTimersByTimeAsync(3_000);
    const again: Array<[string, number]> = [];
    for (const l of ['e', 'f', 'g']) void track(p, l, req(), again);
    await vi.advanceTimersByTimeAsync(0);
    expect(again.map(([, t]) => t)).toEqual([4_000, 4_000, 4_000]);
    p.close();
  });

  it('gives the next turn to the higher class, whoever came first, and paces retries as first attempts', async () => {
    const p = pool([60, 1]);
    const log: Array<[string, number]> = [];
    void track(p, 'first', req(), log);
    await vi.advanceTimersByTimeAsync(0);
    void track(p, 'batch', req({ cls: 1 }), log);
    void track(p, 'online-retry', req({ retry: true }), log);
    await vi.advanceTimersByTimeAsync(2_000);
    expect(log).toEqual([['first', 0], ['online-retry', 1_000], ['batch', 2_000]]);
    p.close();
  });

  it('keeps a lower class its minShare of the turns, as a share of what the rate lets be in flight', async () => {
    const p = pool([60, 1], 50, [{ name: 'online', minShare: 0.5, maxQueue: 100 }, { name: 'batch', minShare: 0.25, maxQueue: 100 }]);
    // Slots are held (answers that take long), so in flight grows by one a turn; the pool has room to spare.
    const order: string[] = [];
    const hold = (label: string, r: SlotRequest) => void p.acquire(r).then((a) => a.ok && order.push(label));
    hold('first', req());
    await vi.advanceTimersByTimeAsync(0);
    for (let i = 0; i < 8; i++) hold('b', req({ cls: 1 }));
    for (let i = 0; i < 8; i++) hold('o', req());
    await vi.advanceTimersByTimeAsync(8_000);
    // A quarter of what is in flight is batch's (a floor of the pool's 50 slots would have given batch every turn).
    expect(order).toEqual(['first', 'o', 'o', 'b', 'o', 'o', 'o', 'b', 'o']);
    p.close();
  });

  it('paces each target apart', async () => {
    const p = pool([60, 1]);
    const log: Array<[string, number]> = [];
    void track(p, 'a1', req(), log);
    void track(p, 'a2', req(), log);
    void track(p, 'b1', req({ target: 'p/other' }), log);
    await vi.advanceTimersByTimeAsync(0);
    expect(log).toEqual([['a1', 0], ['b1', 0]]);
    p.close();
  });

  it('sheds at once a request that cannot expect its turn before its deadline, told the wait', async () => {
    const p = pool([60, 1]);
    const log: Array<[string, number]> = [];
    for (const l of ['a', 'b', 'c', 'd']) void track(p, l, req(), log);
    await vi.advanceTimersByTimeAsync(0);
    // Three ahead of it at one a second (one granted, three waiting): its turn is about 3 s away.
    const late = await p.acquire(req({ deadlineAtMs: 2_500, minAttemptMs: 100 }));
    expect(late).toEqual({ ok: false, reason: 'request_rate', retryAfterMs: 4_000 });
    // One that can wait is queued and gets its turn.
    const patient = track(p, 'patient', req({ deadlineAtMs: 10_000, minAttemptMs: 100 }), log);
    await vi.advanceTimersByTimeAsync(4_000);
    expect((await patient).ok).toBe(true);
    expect(log.at(-1)).toEqual(['patient', 4_000]);
    p.close();
  });

  it('paces an instance of a fleet at its share of the rate', async () => {
    const p = pool([60, 2], 10);
    p.setShare(0.5);
    const log: Array<[string, number]> = [];
    for (const l of ['a', 'b', 'c']) void track(p, l, req(), log);
    await vi.advanceTimersByTimeAsync(4_000);
    // Half of 1 a second, and half of the burst of 2.
    expect(log).toEqual([['a', 0], ['b', 2_000], ['c', 4_000]]);
    // Its share back to the whole: what it owes (c, one request) is owed at the whole rate, whose burst of 2 has room
    // for the next waiter at once, not two seconds after c (its due time read as a time).
    void track(p, 'd', req(), log);
    p.setShare(1);
    await vi.advanceTimersByTimeAsync(0);
    expect(log.at(-1)).toEqual(['d', 4_000]);
    p.close();
  });

  it('spends nothing for a waiter that leaves before its turn', async () => {
    const p = pool([60, 1]);
    const log: Array<[string, number]> = [];
    void track(p, 'a', req(), log);
    const gone = new AbortController();
    const left = p.acquire(req({ signal: gone.signal }));
    await vi.advanceTimersByTimeAsync(500);
    gone.abort();
    expect(await left).toEqual({ ok: false, reason: 'aborted' });
    void track(p, 'b', req(), log);
    await vi.advanceTimersByTimeAsync(500);
    expect(log).toEqual([['a', 0], ['b', 1_000]]);
    p.close();
  });

  it('paces a target by its token rate, each request counted for its estimate', async () => {
    const p = pool(TOKENS_6K);
    const log: Array<[string, number]> = [];
    for (const l of ['a', 'b', 'c']) void track(p, l, req({ tokens: 2_500 }), log);
    await vi.advanceTimersByTimeAsync(0);
    // Two fit the minute's worth; the third waits for the 1,500 tokens it lacks: 15 s.
    expect(log).toEqual([['a', 0], ['b', 0]]);
    await vi.advanceTimersByTimeAsync(14_999);
    expect(log).toHaveLength(2);
    await vi.advanceTimersByTimeAsync(1);
    expect(log.at(-1)).toEqual(['c', 15_000]);
    // One larger than a minute's worth goes once the rate is full again (and overdraws it), not never.
    void track(p, 'huge', req({ tokens: 50_000 }), log);
    await vi.advanceTimersByTimeAsync(70_000);
    expect(log.at(-1)).toEqual(['huge', 75_000]);
    p.close();
  });

  it('holds a request to the rate that binds, of requests and tokens', async () => {
    const p = pool({ requests: rateOf(60, 1), ...TOKENS_6K });
    const log: Array<[string, number]> = [];
    void track(p, 'a', req({ tokens: 10 }), log);
    void track(p, 'b', req({ tokens: 10 }), log);
    void track(p, 'c', req({ tokens: 6_000 }), log);
    await vi.advanceTimersByTimeAsync(3_000);
    // b by the request rate (1 s), though its tokens fit; c's 6,000 tokens (the whole minute's worth) fit again 0.2 s
    // after a's and b's 20 were taken, so the request rate binds it too: its turn at 2 s.
    expect(log).toEqual([['a', 0], ['b', 1_000], ['c', 2_000]]);
    // A newcomer that cannot expect its turn before its deadline is told the longer of the two waits.
    const late = await p.acquire(req({ tokens: 6_000, deadlineAtMs: Date.now() + 5_000 }));
    expect(late.ok).toBe(false);
    expect(!late.ok && late.reason !== 'aborted' && late.retryAfterMs).toBeGreaterThan(50_000);
    p.close();
  });

  it('keeps the tokens coming back for a larger request that waits, from smaller ones of its class and lower classes behind it', async () => {
    const p = pool(TOKENS_6K);
    const log: Array<[string, number]> = [];
    // The minute's worth spent; then one request of 3,000 tokens, and after it small ones of another client and of batch.
    await spentThenLarge(p, log, 'large', { client: 'a' });
    for (let i = 0; i < 20; i++) void track(p, 'small', req({ tokens: 10, client: 'b' }), log);
    for (let i = 0; i < 20; i++) void track(p, 'batch', req({ cls: 1, tokens: 10 }), log);
    await vi.advanceTimersByTimeAsync(29_999);
    expect(log).toEqual([['spent', 0]]);
    await vi.advanceTimersByTimeAsync(1);
    // Its 3,000 tokens back (100 a second): it goes first, then the small ones as their tokens come, online first.
    expect(log.at(-1)).toEqual(['large', 30_000]);
    await vi.advanceTimersByTimeAsync(4_000);
    const after = log.slice(2).map(([l]) => l);
    expect(after.slice(0, 20)).toEqual(Array(20).fill('small'));
    expect(after.slice(20)).toEqual(Array(20).fill('batch'));
    p.close();
  });

  it('lets those behind a held-back request go as soon as it leaves', async () => {
    const p = pool(TOKENS_6K);
    const log: Array<[string, number]> = [];
    const gone = new AbortController();
    await spentThenLarge(p, log, 'large', { signal: gone.signal });
    void track(p, 'small', req({ tokens: 10, client: 'b' }), log);
    await vi.advanceTimersByTimeAsync(500);
    gone.abort();
    await vi.advanceTimersByTimeAsync(0);
    expect(log.at(-1)).toEqual(['small', 500]);
    p.close();
  });

  it('lets a higher class pass a lower one its token rate holds back', async () => {
    const p = pool(TOKENS_6K);
    const log: Array<[string, number]> = [];
    await spentThenLarge(p, log, 'large-batch', { cls: 1 });
    void track(p, 'online', req({ tokens: 10 }), log);
    await vi.advanceTimersByTimeAsync(100);
    expect(log.at(-1)).toEqual(['online', 100]);
    p.close();
  });

  it('says which of its target\'s rates holds a request it sheds, and leaves a shed its slots hold to the capacity', async () => {
    const sheds: string[] = [];
    const observed = (rates: TargetRates, capacity: number) =>
      new ProviderPool({ provider: 'p', capacity, retryCapacity: capacity, classes: CLASSES, decrease: 0.9, minLimit: 1, rates }, () => Date.now(), { onShed: (_cls, reason) => sheds.push(reason) });
    const shedOf = async (p: ProviderPool, r: SlotRequest) => {
      const a = await p.acquire(r);
      return a.ok || a.reason === 'aborted' ? undefined : a.reason;
    };
    // Its turn of a request a second is seconds away (one granted, three waiting).
    const byRequests = observed({ requests: rateOf(60, 1), ...TOKENS_6K }, 50);
    for (let i = 0; i < 4; i++) void byRequests.acquire(req({ tokens: 10 }));
    await vi.advanceTimersByTimeAsync(0);
    expect(await shedOf(byRequests, req({ tokens: 10, deadlineAtMs: Date.now() + 2_500, minAttemptMs: 100 }))).toBe('request_rate');
    expect(byRequests.rateShedWhy('request_rate', 'online')).toBe("provider p's request rate (60/min, pools.requestsPerMinute) leaves no turn for class online before the request's deadline");
    // Its 3,000 tokens are 30 s away, its request's turn at once.
    const byTokens = observed({ requests: rateOf(600, 10), ...TOKENS_6K }, 50);
    void byTokens.acquire(req({ tokens: 6_000 }));
    await vi.advanceTimersByTimeAsync(0);
    expect(await shedOf(byTokens, req({ tokens: 3_000, deadlineAtMs: Date.now() + 10_000 }))).toBe('token_rate');
    expect(byTokens.rateShedWhy('token_rate', 'batch')).toBe("provider p's token rate (6000/min, pools.tokensPerMinute) leaves no turn for class batch before the request's deadline");
    // Its one slot held (an answer takes a second until one is timed), with turns of the rate to spare: the capacity.
    const bySlots = observed({ requests: rateOf(6_000, 100) }, 1);
    void bySlots.acquire(req());
    await vi.advanceTimersByTimeAsync(0);
    expect(await shedOf(bySlots, req({ deadlineAtMs: Date.now() + 500, minAttemptMs: 100 }))).toBe('deadline');
    expect(bySlots.rateShedWhy('deadline', 'online')).toBeUndefined();
    // Counted as deadline sheds all three (stormgate_shed_total's reasons are unchanged).
    expect(sheds).toEqual(['deadline', 'deadline', 'deadline']);
    for (const p of [byRequests, byTokens, bySlots]) p.close();
  });

  it('names pools.tokenBurst too when a burst under a minute\'s worth holds a request its token rate sheds', async () => {
    // 6,000 a minute in bursts of 1,000: a second request of 1,000 tokens waits 10 s for its turn, not the minute's worth.
    const p = new ProviderPool({ provider: 'p', capacity: 50, retryCapacity: 50, classes: CLASSES, decrease: 0.9, minLimit: 1, rates: { tokens: rateOf(6_000, 1_000) } }, () => Date.now());
    const first = await p.acquire(req({ tokens: 1_000 }));
    expect(first.ok).toBe(true);
    const shed = await p.acquire(req({ tokens: 1_000, deadlineAtMs: Date.now() + 5_000 }));
    expect(shed.ok ? undefined : shed.reason).toBe('token_rate');
    expect(p.rateShedWhy('token_rate', 'online')).toBe("provider p's token rate (6000/min, pools.tokensPerMinute; at most 1000 at once, pools.tokenBurst) leaves no turn for class online before the request's deadline");
    p.close();
  });

  // The estimate added a whole round trip for a slot even when 49 of 50 were free, so a request its rate's turn held
  // 1 s was shed at a 3 s deadline, told the provider "is at capacity" and to come back in 5 s.
  it('waits for its rate\'s turn with slots free, whatever the round trip: the rate alone holds it', async () => {
    const p = pool([60, 1]);
    // Answers of 5 s each, so the round trip the estimate uses is about that.
    for (let i = 0; i < 12; i++) {
      const a = await p.acquire(req());
      if (!a.ok) throw new Error('no slot');
      a.slot.answered();
      await vi.advanceTimersByTimeAsync(5_000);
      a.slot.release();
    }
    const log: Array<[string, number]> = [];
    const t0 = Date.now();
    void track(p, 'a', req(), log);
    const b = track(p, 'b', req({ deadlineAtMs: t0 + 3_000, minAttemptMs: 100 }), log);
    await vi.advanceTimersByTimeAsync(1_000);
    expect((await b).ok).toBe(true);
    expect(log).toEqual([['a', t0], ['b', t0 + 1_000]]);
    p.close();
  });

  it('holds back nothing without a rate', async () => {
    const p = pool(undefined);
    const log: Array<[string, number]> = [];
    for (const l of ['a', 'b', 'c']) void track(p, l, req(), log);
    await vi.advanceTimersByTimeAsync(0);
    expect(log.map(([, t]) => t)).toEqual([0, 0, 0]);
    p.close();
  });
});

describe('pools.requestsPerMinute in the config', () => {
  const yaml = (pools: string) => `
providers:
  openai: { family: openai, baseUrl: "http://127.0.0.1:9/v1", apiKey: k, pools: ${pools} }
routes:
  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: openai } ] }
`;

  it('defaults the burst to one second\'s worth, at least one', () => {
    const rateOfPool = (pools: string) => new Pools(parseConfig(yaml(pools), 'gw.yaml', {}), Date.now).of('openai').settings.rates;
    expect(rateOfPool('{ requestsPerMinute: 600 }')).toEqual({ requests: { intervalMs: 100, burst: 10 }, tokens: undefined });
    expect(rateOfPool('{ requestsPerMinute: 30 }')).toEqual({ requests: { intervalMs: 2_000, burst: 1 }, tokens: undefined });
    expect(rateOfPool('{ requestsPerMinute: 600, burst: 3 }')).toEqual({ requests: { intervalMs: 100, burst: 3 }, tokens: undefined });
    // A token rate holds a minute's worth.
    expect(rateOfPool('{ tokensPerMinute: 30000 }')).toEqual({ requests: undefined, tokens: { intervalMs: 2, burst: 30_000 } });
    // Unless tokenBurst says less: a provider that enforces its token limit by the second.
    expect(rateOfPool('{ tokensPerMinute: 30000, tokenBurst: 1000 }')).toEqual({ requests: undefined, tokens: { intervalMs: 2, burst: 1_000 } });
    expect(rateOfPool('{}')).toBeUndefined();
  });

  it('refuses a burst without a rate, naming the file and the path', () => {
    expect(() => parseConfig(yaml('{ burst: 5 }'), 'gw.yaml', {})).toThrow(/gw\.yaml[\s\S]*providers\.openai\.pools\.burst[\s\S]*needs requestsPerMinute/);
    expect(() => parseConfig(yaml('{ requestsPerMinute: 60, tokenBurst: 500 }'), 'gw.yaml', {})).toThrow(/gw\.yaml[\s\S]*providers\.openai\.pools\.tokenBurst[\s\S]*needs tokensPerMinute/);
    expect(() => parseConfig(yaml('{ requestsPerMinute: 0 }'), 'gw.yaml', {})).toThrow(/providers\.openai\.pools\.requestsPerMinute/);
  });
});
