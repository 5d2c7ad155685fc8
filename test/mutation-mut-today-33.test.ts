// Mutation round 33: tests that kill mutations the existing suite let live, in pools/provider-pool.ts (priority pools,
// slot waits, adaptive limit), state/redis-store.ts, the Redis-shared retry budget (state/redis-budget.ts and its
// script) and the client limit paths. Pool code runs on a clock the test moves; the Redis parts on a real redis-server.
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { clientLimits } from '../src/http/client-limits.ts';
import { QUEUE_AHEAD_MS, rateOf, reserveTokens, type Rate } from '../src/policy/client-rate.ts';
import { FleetClock } from '../src/state/fleet-clock.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import { RedisBudget } from '../src/state/redis-budget.ts';
import type { RedisHealth } from '../src/state/redis-health.ts';
import { RedisKeys } from '../src/state/redis-keys.ts';
import { defineScripts, type ScriptClient } from '../src/state/redis-scripts.ts';
import { ProviderPool, type PoolClass, type SlotRequest } from '../src/pools/provider-pool.ts';
import { clientReq, slot } from './helpers/client-pool.ts';

import { useRedisServer } from './helpers/redis-server.ts';
import { cutAndFleet } from './helpers/redis-stores.ts';

const flush = () => new Promise((r) => setImmediate(r));
const ONLINE_BATCH: PoolClass[] = [
  { name: 'online', minShare: 0, maxQueue: 100 },
  { name: 'batch', minShare: 0, maxQueue: 100 },
];

type Rates = ConstructorParameters<typeof ProviderPool>[0]['rates'];

function pool(capacity: number, opts: { retryCapacity?: number; classes?: PoolClass[]; rates?: Rates } = {}) {
  const clock = { now: 0 };
  const p = new ProviderPool(
    { provider: 'p', capacity, retryCapacity: opts.retryCapacity ?? capacity, classes: opts.classes ?? ONLINE_BATCH, decrease: 0.9, minLimit: 1, rates: opts.rates },
    () => clock.now,
  );
  return { p, clock };
}
const req = (cls: number, extra: Partial<SlotRequest> = {}): SlotRequest => clientReq(undefined, { cls, ...extra });

describe('the provider pool: demand the fleet is told', () => {
  it('counts requests that queued and left before the exchange in the peak demand', async () => {
    const { p } = pool(1);
    p.demandByClass(); // resets the peak
    const held = await slot(p, req(0));
    const aborts = [new AbortController(), new AbortController(), new AbortController()];
    const waits = aborts.map((a) => p.acquire(req(0, { signal: a.signal })));
    await flush();
    for (const a of aborts) a.abort();
    expect((await Promise.all(waits)).map((w) => w.ok)).toEqual([false, false, false]);
    // One in use and three waiting at once: the exchange hears 4, not the 1 left now.
    expect(p.demandByClass()[0]).toBe(4);
    held.release();
  });

  it('counts slots held at the last exchange in the next one, though they were given back since', async () => {
    const { p } = pool(5);
    const held = await Promise.all([slot(p, req(1)), slot(p, req(1)), slot(p, req(1))]);
    expect(p.demandByClass()).toEqual([0, 3]);
    for (const h of held) h.release();
    // Held for part of the interval: still demand at this exchange; none at the one after.
    expect(p.demandByClass()).toEqual([0, 3]);
    expect(p.demandByClass()).toEqual([0, 0]);
  });
});

describe('the provider pool under a token rate: the wait a newcomer is told', () => {
  it("counts a higher class's waiter for its own tokens, not for one", async () => {
    // 6,000 tokens a minute (100 a second), the minute's worth spent at 0.
    const { p } = pool(50, { rates: { tokens: rateOf(6_000, 6_000) } });
    (await slot(p, req(0, { tokens: 6_000 }))).release();
    const big = p.acquire(req(0, { tokens: 3_000 }));
    await flush();
    // A batch newcomer of 10 tokens goes after online's 3,000: 30.1 s, not 0.11 s.
    expect(p.expectedWaitMs(1, 'p/m', undefined, 10)).toBeGreaterThanOrEqual(30_000);
    p.close();
    void big;
  });

  it('lets a waiter its token rate held go at once when the fleet gives this instance a larger part of a token-only rate', async () => {
    // One slot, so the larger share adds no slot (and no retry place) that would let the waiter go by itself.
    const { p } = pool(1, { rates: { tokens: rateOf(6_000, 6_000) } });
    p.setShare(0.5); // 50 tokens a second here, a burst of 3,000
    (await slot(p, req(0, { tokens: 3_000 }))).release();
    let granted = false;
    const waiting = p.acquire(req(0, { tokens: 600 })).then((a) => {
      granted = a.ok;
      if (a.ok) a.slot.release();
    });
    await flush();
    expect(granted).toBe(false); // 12 s away at this part
    // The whole rate: the 3,000 owed leave room for 600 now, not when the timer armed at the half rate fires.
    p.setShare(1);
    await flush();
    expect(granted).toBe(true);
    await waiting;
    p.close();
  });

  it("counts the tokens of its own client's waiters ahead of it in its class, not one each", async () => {
    const { p } = pool(50, { rates: { tokens: rateOf(6_000, 6_000) } });
    (await slot(p, req(0, { tokens: 6_000 }))).release();
    const big = p.acquire(req(0, { tokens: 3_000, client: 'a' }));
    await flush();
    // Behind its own client's 3,000 tokens: 30.1 s at 100 a second, not 0.11 s.
    expect(p.expectedWaitMs(0, 'p/m', 'a', 10)).toBeGreaterThanOrEqual(30_000);
    p.close();
    void big;
  });
});

describe('on a real Redis: the fleet retry budget (RedisBudget) and the client token script', () => {
  const redis = useRedisServer();
  let client: ScriptClient;
  beforeAll(() => {
    client = defineScripts(new Redis(redis().url));
  });
  afterAll(() => client.disconnect());

  /** A RedisBudget on the test's Redis, with a health the test turns off (`up.usable = false`), and its local stand-in. */
  function budget(prefix: string, now = () => 1_000_000) {
    const up = { usable: true };
    const health = { usable: () => up.usable, answered: () => undefined, failed: () => undefined } as unknown as RedisHealth;
    const local = new MemoryStore();
    const b = new RedisBudget({ client, keys: new RedisKeys(prefix), local, health, clock: new FleetClock(), now });
    return { b, local, up };
  }
  const CFG = { ratio: 0.5, windowS: 10, minRetriesPerSecond: 0 };

  it("mirrors the retries the fleet allowed into the local window even where the local window alone would refuse them", async () => {
    const nowMs = 1_000_000;
    const other = budget('t33-mirror');
    const me = budget('t33-mirror');
    // The fleet's requests came through another instance: this one's local window has none, and would allow no retry.
    other.b.addRequests('p/m', 10, nowMs);
    other.b.flush();
    await client.ping();
    expect(await me.b.takeRetry('p/m', CFG, nowMs, false)).toBe(true);
    expect(await me.b.takeRetry('p/m', CFG, nowMs, false)).toBe(true);
    // Redis away: the local stand-in knows this instance took two.
    expect((await me.local.budgetWindow('p/m', CFG, nowMs)).retries).toBe(2);
    other.b.close();
    me.b.close();
  });

  it("sends no batched counts of a target it forgot: a made-up model's budget is not written to Redis after it", async () => {
    const nowMs = 1_000_000;
    const { b, up } = budget('t33-forget');
    const keys = new RedisKeys('t33-forget');
    b.addRequests('r/online/p/made-up', 3, nowMs);
    up.usable = false;
    // Degraded: a retry taken on local state waits to be sent too.
    await b.takeRetry('r/online/p/made-up', { ratio: 1, windowS: 10, minRetriesPerSecond: 1 }, nowMs, true);
    up.usable = true;
    b.addRequests('r/online/p/kept', 2, nowMs);
    b.forget('p/made-up');
    b.flush();
    await client.ping();
    expect(await client.exists(keys.budget('r/online/p/made-up'))).toBe(0);
    expect(await client.hgetall(keys.budget('r/online/p/kept'))).toEqual({ [`r:${Math.floor(nowMs / 1000)}`]: '2' });
    b.close();
  });

  it("reserves a client's estimate past its token burst whole in Redis, as the local policy does: the bucket overdraws", async () => {
    const keys = new RedisKeys('t33-overdraw');
    const tokens = rateOf(600, 600); // 10 a second, a burst of 600
    const rates = { tokens };
    const at = (ms: number, estimate: number) =>
      client.sgReserveTokens(keys.clientRate('agents', 'requests', undefined), keys.clientRate('agents', 'tokens', tokens), keys.clientTold('agents', rates), ms, 0, tokens.intervalMs, tokens.burst, estimate, QUEUE_AHEAD_MS);
    // 1,000 tokens from a full bucket of 600: let in, and owed for 1,000 (due 100 s on).
    expect(await at(0, 1_000)).toEqual([0]);
    // 10 more a second later: the debt holds them ~40 s, as the in-process policy says (not 1 s, as for 600 spent).
    const local = reserveTokens({ tokens: 1_000 * tokens.intervalMs }, 1_000, { tokens }, 10);
    expect(local).toMatchObject({ admitted: false, waitMs: 40_000 });
    const [waitMs] = await at(1_000, 10);
    expect(waitMs).toBe(40_000);
  });

  it('keeps counts batched during an outage for as long as a window can hold them, and sends them once Redis is back', async () => {
    const clock = { now: 1_000_000 };
    const { b, up } = budget('t33-outage', () => clock.now);
    const keys = new RedisKeys('t33-outage');
    up.usable = false;
    b.addRequests('r/online/p/m', 4, clock.now);
    // A flush in the outage, 5 s on: those counts are still inside a window (up to MAX_WINDOW_S), so they are kept.
    clock.now += 5_000;
    b.flush();
    up.usable = true;
    b.flush();
    await client.ping();
    expect(await client.hgetall(keys.budget('r/online/p/m'))).toEqual({ 'r:1000': '4' });
    b.close();
  });
});

describe('client limits: settling a stream whose usage came in part', () => {
  it("charges at least the completion its client was passed, not the partial usage's count", () => {
    const spent: number[] = [];
    const store = {
      admitClient: () => Promise.resolve(undefined),
      reserveTokens: () => Promise.resolve(undefined),
      spendTokens: (_client: string, _rate: Rate, tokens: number) => void spent.push(tokens),
    };
    const limit = clientLimits({ agents: { tokensPerMinute: 6_000 } }, { store, now: () => 0, random: () => 0, onLimited: () => {} })!;
    // Reserved 100 + 1,000; the stream broke after 2,000 characters (500 tokens) with only message_start's usage (1 out).
    limit.settle('agents', { prompt: 100, completion: 1_000 }, { usage: [{ prompt: 100, completion: 1 }], sentUpstream: true, outputChars: 2_000, usagePartial: true });
    expect(spent).toEqual([100 + 500 - 1_100]);
  });
});

describe('RedisStore: client token reservations while Redis goes away', () => {
  it('keeps the tokens it reserved on Redis in its local debt, so losing Redis does not refill the bucket', async () => {
    const f = await cutAndFleet({ prefix: 't33-reserve' });
    try {
      const tokens = rateOf(600, 600);
      const now = Date.now();
      expect(await f.cut.reserveTokens('agents', { tokens }, 500, now)).toBeUndefined();
      await f.away();
      // Local state now: 500 of the burst of 600 were reserved here, so another 500 must wait.
      expect(await f.cut.reserveTokens('agents', { tokens }, 500, now + 100)).toMatchObject({ by: 'tokens' });
    } finally {
      await f.close();
    }
  });
});
