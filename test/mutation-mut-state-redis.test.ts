// Mutation testing of the Redis store's Lua scripts: each test kills a change to a script (a comparison, a field name,
// a clean-up) that the rest of the suite let through. The scripts run on a redis-server of this file's own, called
// directly where only the script is in question, through RedisStores where the fleet's view is.
import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { defineScripts, type ScriptClient } from '../src/state/redis-scripts.ts';
import { RedisStore } from '../src/state/redis-store.ts';
import { describeEachStore } from './helpers/redis-stores.ts';
import { startRedis, useRedisServer, type RedisHandle } from './helpers/redis-server.ts';
import { eventually } from './helpers/redis-stores.ts';
import { startTcpProxy, type TcpProxy } from './helpers/tcp-proxy.ts';

const T = 1_700_000_000_000;

describeEachStore((store) => {
  it('counts failures apart from requests in the outcome window', async () => {
    expect(await store().addOutcomes('a', 0, { requests: 3, failures: 1 }, T, 10)).toEqual({ requests: 3, failures: 1 });
    expect(await store().addOutcomes('a', 0, { requests: 4, failures: 0 }, T + 1_000, 10)).toEqual({ requests: 7, failures: 1 });
  });

  it('gives no probe permit to a caller that judged by a breaker record the store has moved past', async () => {
    await store().casBreaker('a', 0, { state: 'open', sinceMs: T, openUntilMs: T + 5_000, probeSuccesses: 0, generation: 1 });
    expect(await store().takePermit('a', 1, 5_000, T + 5_000, 0)).toBeFalsy();
    expect(await store().takePermit('a', 1, 5_000, T + 5_000, 1)).toBeTruthy();
  });
});

describe('the Lua scripts', () => {
  const redis = useRedisServer();
  let client: ScriptClient;
  beforeAll(() => {
    client = defineScripts(new Redis(redis().url, { lazyConnect: false }));
  });
  afterAll(() => {
    client.disconnect();
  });
  const key = () => `m-${randomUUID()}`;

  it('adds retries taken on local state as retries, not as requests (ADD_COUNTS, then BUDGET)', async () => {
    const k = key();
    const sec = Math.floor(T / 1000);
    await client.sgAddCounts(k, 60_000, 300, 'r', sec, 10);
    await client.sgAddCounts(k, 60_000, 300, 'x', sec, 3);
    // peek: sec, windowS, ratio, floor, mode, ttlMs
    expect(await client.sgBudget(k, sec, 10, '0.5', '0', 'peek', 60_000)).toEqual([10, 3, 1]);
  });

  it('drops the seconds older than the longest window when counts of a new second arrive (ADD_COUNTS)', async () => {
    const k = key();
    const sec = Math.floor(T / 1000);
    await client.sgAddCounts(k, 600_000, 300, 'r', sec - 400, 5);
    await client.sgAddCounts(k, 600_000, 300, 'r', sec, 1);
    expect(await client.hkeys(k)).toEqual([`r:${sec}`]);
  });

  it('drops an instance not heard from within staleMs from the fleet\'s demand (EXCHANGE_DEMAND)', async () => {
    const k = key();
    expect(await client.sgExchangeDemand(k, 'a', '4,1', T, 3_000)).toEqual(['4,1', 1]);
    expect(await client.sgExchangeDemand(k, 'b', '2,2', T + 3_000, 3_000)).toEqual(['6,3', 2]);
    expect(await client.sgExchangeDemand(k, 'b', '2,2', T + 3_001, 3_000)).toEqual(['2,2', 1]);
  });
});

describe('a hold-off in the fleet', () => {
  const redis = useRedisServer();
  const stores: RedisStore[] = [];
  afterEach(async () => {
    await Promise.all(stores.splice(0).map((s) => s.close()));
  });
  async function instance(keyPrefix: string): Promise<RedisStore> {
    const s = new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 500, keyPrefix } });
    stores.push(s);
    expect(await s.ready()).toBe(true);
    return s;
  }

  it('is never shortened in Redis by an instance told a shorter one: one that starts later sees the longer', async () => {
    const keyPrefix = `t-${randomUUID()}`;
    const a = await instance(keyPrefix);
    const b = await instance(keyPrefix);
    await a.setHoldOff('p/m', T + 60_000);
    await b.setHoldOff('p/m', T + 5_000);
    expect(b.getHoldOff('p/m')).toBe(T + 60_000);
    const late = await instance(keyPrefix);
    await late.firstRead?.('p/m');
    expect(late.getHoldOff('p/m')).toBe(T + 60_000);
  });
});

describe('forced retries (the client\'s own) and the budget\'s local stand-in', () => {
  let redis: RedisHandle;
  let proxy: TcpProxy;
  const stores: RedisStore[] = [];
  beforeAll(async () => {
    redis = await startRedis();
    proxy = await startTcpProxy(redis.port);
  });
  afterAll(async () => {
    await proxy?.close();
    await redis?.stop();
  });
  afterEach(async () => {
    await Promise.all(stores.splice(0).map((st) => st.close()));
    await proxy.resume().catch(() => undefined);
  });
  /** A reaches Redis through the proxy (so it can be cut off alone); B reaches it directly. */
  async function pair() {
    const keyPrefix = `f-${randomUUID()}`;
    const a = new RedisStore({ config: { redis: `redis://127.0.0.1:${proxy.port}`, commandTimeoutMs: 100, keyPrefix } });
    const b = new RedisStore({ config: { redis: redis.url, commandTimeoutMs: 100, keyPrefix } });
    stores.push(a, b);
    expect(await a.ready()).toBe(true);
    expect(await b.ready()).toBe(true);
    return { a, b };
  }
  const cutOff = async (a: RedisStore) => {
    await proxy.cut();
    await eventually(() => a.degraded, 3_000);
  };
  const budget = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 0 };

  it('counts a forced retry refused by the fleet\'s budget in the local window too, which stands in when Redis goes', async () => {
    const { a } = await pair();
    const now = Date.now();
    a.addRequests('route/p/m', 10, now);
    expect(await a.takeRetry('route/p/m', budget, now)).toBe(true);
    expect(await a.takeRetry('route/p/m', budget, now, true)).toBe(false);
    await cutOff(a);
    a.addRequests('route/p/m', 10, now);
    // 20 requests allow 2 retries; 2 were served.
    expect(await a.takeRetry('route/p/m', budget, now)).toBe(false);
  });

  it('sends the forced retries it counted while cut off to the fleet\'s budget when Redis is back', async () => {
    const { a, b } = await pair();
    await cutOff(a);
    const now = Date.now();
    expect(await a.takeRetry('route/p/m', budget, now, true)).toBe(false);
    expect(await a.takeRetry('route/p/m', budget, now, true)).toBe(false);
    await proxy.resume();
    await eventually(async () => !a.degraded && (await a.ready(0)), 8_000);
    await eventually(async () => (await b.budgetWindow('route/p/m', budget, Date.now())).retries === 2, 3_000);
  });
});
