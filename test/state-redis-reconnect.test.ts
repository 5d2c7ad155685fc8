// One gateway cut off from a Redis that keeps running (and keeps its data), while the rest of the fleet still reaches
// it: what the cut-off instance decided alone (a breaker it opened, a hold-off it was told) must reach the fleet when
// it reconnects, and what the fleet decided meanwhile must reach it.
import { randomUUID } from 'node:crypto';
import { Writable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import pino from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { BreakerSchema } from '../src/config/schema.ts';
import { settingsForModel } from '../src/policy/breaker.ts';
import { BreakerBoard } from '../src/state/breaker-board.ts';
import { RedisStore } from '../src/state/redis-store.ts';
import type { BreakerRecord } from '../src/state/store.ts';
import { startRedis, type RedisHandle } from './helpers/redis-server.ts';
import { eventually } from './helpers/redis-stores.ts';
import { startTcpProxy, type TcpProxy } from './helpers/tcp-proxy.ts';

const s = settingsForModel(BreakerSchema.parse({ openS: 30 }), undefined);

let redis: RedisHandle;
let proxy: TcpProxy;
let admin: Redis;
const stores: RedisStore[] = [];

beforeAll(async () => {
  redis = await startRedis();
  proxy = await startTcpProxy(redis.port);
  admin = new Redis(redis.url);
});
afterAll(async () => {
  admin?.disconnect();
  await proxy?.close();
  await redis?.stop();
});
afterEach(async () => {
  await Promise.all(stores.splice(0).map((st) => st.close()));
  await proxy.resume().catch(() => undefined); // a failed test may leave it cut
});

/**
 * Instance A reaches Redis through the proxy (so it can be cut off alone); B reaches it directly. Commands time out
 * after 5 s: past 100 ms, a starved event loop (a loaded 2-core CI machine stalls it for a second) had a store's read
 * or retry answered from local state (the store's rule for a timeout), or three such degrade A before it was cut off.
 * A cut drops A's connections, which degrades it at once; only a connection whose traffic is swallowed needs A's
 * commands to time out: `aTimeoutMs` then.
 */
async function pair(logs: string[] = [], aTimeoutMs = 5_000) {
  const keyPrefix = `r-${randomUUID()}`;
  const logger = pino({ level: 'debug' }, new Writable({ write: (c, _e, cb) => cb(void logs.push(String(c))) }));
  const config = (url: string, commandTimeoutMs: number) => ({ redis: url, commandTimeoutMs, keyPrefix });
  const a = new RedisStore({ config: config(`redis://127.0.0.1:${proxy.port}`, aTimeoutMs), logger });
  const b = new RedisStore({ config: config(redis.url, 5_000) });
  stores.push(a, b);
  expect(await a.ready()).toBe(true);
  expect(await b.ready()).toBe(true);
  return { a, b, keyPrefix };
}


async function cutOff(a: RedisStore): Promise<void> {
  await proxy.cut();
  await eventually(() => a.degraded, 3_000);
}

async function reconnect(a: RedisStore): Promise<void> {
  await proxy.resume();
  await eventually(async () => !a.degraded && (await a.ready(0)), 8_000);
}

describe('an instance cut off from Redis, then back', () => {
  it('writes back a breaker it opened while cut off, over the older closed record Redis kept, so the fleet keeps it open', async () => {
    const logs: string[] = [];
    const { a, b, keyPrefix } = await pair(logs);
    const now = Date.now();
    // An earlier outage came and went: Redis holds a closed record of generation 2.
    expect(await a.casBreaker('p/m', 0, { state: 'open', sinceMs: now - 60_000, openUntilMs: now - 30_000, probeSuccesses: 0, generation: 1 })).toBe(true);
    expect(await a.casBreaker('p/m', 1, { state: 'closed', sinceMs: now - 20_000, openUntilMs: 0, probeSuccesses: 0, generation: 2 })).toBe(true);
    await eventually(() => b.getBreaker('p/m')?.generation === 2, 1_000);

    await cutOff(a);
    const transitionsA: string[] = [];
    const transitionsB: string[] = [];
    const boardA = new BreakerBoard({ store: a, now: Date.now, random: () => 0, onTransition: (_t, from, to) => transitionsA.push(`${from.state}->${to.state}`) });
    const boardB = new BreakerBoard({ store: b, now: Date.now, random: () => 0, onTransition: (_t, from, to) => transitionsB.push(`${from.state}->${to.state}`) });
    for (let i = 0; i < 5; i++) await boardA.record('p/m', s, 'failure', 10, undefined);
    expect(transitionsA).toEqual(['closed->open']);
    expect(boardA.availability('p/m', s, false).kind).toBe('open');
    expect(boardB.availability('p/m', s, false).kind).toBe('closed');

    await reconnect(a);
    await eventually(() => b.getBreaker('p/m')?.state === 'open', 3_000);
    // Give a late re-read (the subscriber's) the chance to undo it: nothing may.
    await sleep(300);
    expect(boardA.availability('p/m', s, false).kind).toBe('open');
    expect(boardB.availability('p/m', s, false).kind).toBe('open');
    const stored = await admin.hgetall(`${keyPrefix}:{p/m}:breaker`);
    expect(stored.state).toBe('open');
    expect(Number(stored.generation)).toBeGreaterThan(2);
    expect(b.getBreaker('p/m')).toEqual(a.getBreaker('p/m'));
    // One change, counted once fleet-wide: by A, which made it; B learnt it.
    expect(transitionsA).toEqual(['closed->open']);
    expect(transitionsB).toEqual([]);
    expect(logs.filter((l) => l.includes('breaker opened while Redis was away'))).toHaveLength(1);
    boardA.close();
    boardB.close();
  });

  it('takes the fleet\'s record when it is newer, or when the breaker opened alone has already run its time', async () => {
    const { a, b } = await pair();
    const now = Date.now();
    const open: BreakerRecord = { state: 'open', sinceMs: now, openUntilMs: now + 30_000, probeSuccesses: 0, generation: 1 };
    expect(await a.casBreaker('fleet-closed-it', 0, open)).toBe(true);
    const closedBefore: BreakerRecord = { state: 'closed', sinceMs: now - 5_000, openUntilMs: 0, probeSuccesses: 0, generation: 3 };
    expect(await b.casBreaker('ran-its-time', 0, closedBefore)).toBe(true);
    await eventually(() => b.getBreaker('fleet-closed-it')?.generation === 1 && a.getBreaker('ran-its-time')?.generation === 3, 1_000);

    await cutOff(a);
    // The fleet closes the breaker A still holds open...
    const closedLater: BreakerRecord = { state: 'closed', sinceMs: Date.now(), openUntilMs: 0, probeSuccesses: 0, generation: 2 };
    expect(await b.casBreaker('fleet-closed-it', 1, closedLater)).toBe(true);
    // ...and A opens one alone, for a short time that ends before it reconnects.
    const shortOpen: BreakerRecord = { state: 'open', sinceMs: Date.now(), openUntilMs: Date.now() + 200, probeSuccesses: 0, generation: 4 };
    expect(await a.casBreaker('ran-its-time', 3, shortOpen)).toBe(true);
    await sleep(300);

    await reconnect(a);
    await eventually(() => a.getBreaker('fleet-closed-it')?.state === 'closed' && a.getBreaker('ran-its-time')?.state === 'closed', 3_000);
    expect(a.getBreaker('fleet-closed-it')).toEqual(closedLater);
    expect(a.getBreaker('ran-its-time')).toEqual(closedBefore);
    expect(b.getBreaker('ran-its-time')).toEqual(closedBefore);
  });

  it('adds the requests and retries it counted while cut off to the fleet\'s budget, so the fleet does not grant those retries again', async () => {
    const { a, b } = await pair();
    const budget = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 0.1 }; // a floor of 1 retry per window
    await cutOff(a);
    const now = Date.now();
    a.addRequests('route/p/m', 5, now);
    expect(await a.takeRetry('route/p/m', budget, now)).toBe(true); // the floor, on local state
    expect(await a.takeRetry('route/p/m', budget, now)).toBe(false);

    await reconnect(a);
    await eventually(async () => (await b.budgetWindow('route/p/m', budget, Date.now())).retries === 1, 3_000);
    expect(await b.budgetWindow('route/p/m', budget, Date.now())).toEqual({ requests: 5, retries: 1 });
    expect(await b.takeRetry('route/p/m', budget, Date.now())).toBe(false);
  });

  it('writes back hold-offs and credential holds it was told while cut off, extending the fleet\'s shorter ones', async () => {
    const { a, b } = await pair();
    const now = Date.now();
    await b.setHoldOff('p/m', now + 5_000);
    await eventually(() => a.getHoldOff('p/m') === now + 5_000, 1_000);

    await cutOff(a);
    await a.setHoldOff('p/m', now + 60_000);
    await a.setHoldOff('p/m#credentials', now + 120_000);
    expect(b.getHoldOff('p/m')).toBe(now + 5_000);

    await reconnect(a);
    await eventually(() => b.getHoldOff('p/m') === now + 60_000 && b.getHoldOff('p/m#credentials') === now + 120_000, 3_000);
    expect(a.getHoldOff('p/m')).toBe(now + 60_000);
  });
});

describe('a connection whose traffic a middlebox drops for a while, then passes again (toxiproxy\'s timeout toxic)', () => {
  it('is replaced: the store returns to Redis, rather than waiting forever for the answers that were lost', async () => {
    const { a, b } = await pair([], 100);
    const budget = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 1 };
    proxy.swallow(true);
    try {
      for (let i = 0; i < 3; i++) await a.takeRetry('r', budget, Date.now()); // lost, each of them: degraded
      expect(a.degraded).toBe(true);
      await sleep(1_500);
    } finally {
      proxy.swallow(false);
    }
    // Redis answers every command from here on, but the first answers on that connection belong to commands it never
    // got: a client that matches answers to commands in order is off by the lost ones for as long as it keeps it.
    await eventually(() => !a.degraded, 6_000);
    // And what it reads from here on is its own answers: the fleet's state, not another command's.
    const now = Date.now();
    expect(await b.casBreaker('p/m', 0, { state: 'open', sinceMs: now, openUntilMs: now + 30_000, probeSuccesses: 0, generation: 1 })).toBe(true);
    a.getBreaker('p/m');
    await eventually(() => a.getBreaker('p/m')?.state === 'open', 2_000);
    expect(await a.takePermit('p/m', 1, 5_000, Date.now(), 1)).toEqual(expect.any(String));
  });
});

describe('a path to Redis that goes dead for good while a new connection gets through (a replaced pod\'s old address)', () => {
  it('replaces both connections: back on Redis, and hearing the fleet\'s changes again, not only reporting itself back', async () => {
    const { a, b } = await pair([], 100);
    a.getBreaker('p/m');
    a.getHoldOff('p/m');
    await sleep(100); // A has read the target: it follows its changes from here on
    proxy.strand();
    const budget = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 1 };
    for (let i = 0; i < 3; i++) await a.takeRetry('r', budget, Date.now());
    expect(a.degraded).toBe(true);
    await eventually(() => !a.degraded, 6_000);
    // Only the subscriber tells A what another instance changes; it receives and never sends, so it has to be asked.
    const now = Date.now();
    expect(await b.casBreaker('p/m', 0, { state: 'open', sinceMs: now, openUntilMs: now + 30_000, probeSuccesses: 0, generation: 1 })).toBe(true);
    await b.setHoldOff('p/m', now + 30_000);
    await eventually(() => a.getBreaker('p/m')?.state === 'open' && a.getHoldOff('p/m') === now + 30_000, 9_000);
  }, 20_000);
});
