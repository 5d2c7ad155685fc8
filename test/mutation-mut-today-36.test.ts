// Mutation round 36: tests that kill mutations the existing suite let live, in state/redis-health.ts (the timeouts that
// degrade, the flap window and the doubling of clean checks, clean checks counted in a row, misconfigured on ready,
// answered(), the probe key, the reconnect after probe timeouts, the wait after a refused configuration),
// state/redis-kept-keys.ts (claimAgain after an outage, sendKeyEnds and what it keeps, #endLater, #ownRun, the owner
// checks of readKey, settleKey and sendLocalKeys, the lost claims remembered), state/redis-subscriber.ts (the close
// handler, the PING's answer) and state/redis-store.ts (the first-read batch, demandCount, close). 30 hand mutations:
// 10 killed by existing files, 4 equivalent, 16 killed now, 0 open (health 13: 7/1/5; kept keys 12: 1/2/9; subscriber
// 2: 2/0/0; store 3: 0/1/2). One is a fix: a lost claim was not remembered when another request's lost claim under the
// key had lapsed before it (its end never reached Redis; the claim held the key for its lease).
// Equivalent: demandCount's isFinite (the script sends no value JS reads as Infinity), onConnected's `degraded &&`
// (unproven implies degraded whenever a connection comes up), sendLocalKeys skipping a run claimAgain claims (a second
// claim finds its own record), and claimKey's same-owner update (its earlier claim lapsed, or still holds the key).
// The Redis parts run on a real redis-server; the health machine's checks on an interval the test moves.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import pino from 'pino';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { connectRedis } from '../src/state/redis-client.ts';
import { RedisHealth } from '../src/state/redis-health.ts';
import { RedisKeys } from '../src/state/redis-keys.ts';
import { defineScripts, type ScriptClient } from '../src/state/redis-scripts.ts';
import { RedisStore } from '../src/state/redis-store.ts';
import type { BreakerRecord, StateChange } from '../src/state/store.ts';
import { useRedisServer, useRedisServerWithAdmin } from './helpers/redis-server.ts';
import { answer, cutAndFleet, eventually, running, type LogLine } from './helpers/redis-stores.ts';
import { testLogSink } from './helpers/stack.ts';

const open = (generation: number): BreakerRecord => ({ state: 'open', sinceMs: Date.now(), openUntilMs: Date.now() + 30_000, probeSuccesses: 0, generation });

describe('the Redis store: first reads and close', () => {
  const redis = useRedisServer();
  async function instance(keyPrefix: string): Promise<RedisStore> {
    const s = new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 500, keyPrefix } });
    expect(await s.ready()).toBe(true);
    return s;
  }

  it('has read each of two targets first looked up in the same turn by the time its own first read resolves', async () => {
    const keyPrefix = `mut36-${randomUUID()}`;
    const fleet = await instance(keyPrefix);
    const late = await instance(keyPrefix);
    try {
      // The fleet opened the second target's breaker before the new instance looked it up.
      expect(await fleet.casBreaker('p/two', 0, open(1))).toBe(true);
      await sleep(300); // its message has gone by: the new instance learns of it by reading
      // Two requests, for two targets, in one turn: they share one read; the second one's wait covers its target.
      const first = late.firstRead('p/one');
      const second = late.firstRead('p/two');
      expect(second).toBeInstanceOf(Promise);
      await second;
      expect(late.getBreaker('p/two')).toMatchObject({ state: 'open', generation: 1 });
      await first;
    } finally {
      await Promise.all([fleet.close(), late.close()]);
    }
  });

  it('tells no listener of a change once closed, as the in-process store does not', async () => {
    const s = await instance(`mut36-${randomUUID()}`);
    const heard: StateChange[] = [];
    s.onChange((c) => heard.push(c));
    expect(await s.casBreaker('p/m', 0, open(1))).toBe(true);
    expect(heard).toHaveLength(1);
    await s.close();
    // A request still in the pipeline at shutdown moves the breaker: on local state now, and no one is told.
    await s.casBreaker('p/m', 1, { ...open(2), state: 'half-open' });
    await s.setHoldOff('p/m', Date.now() + 10_000);
    expect(heard).toHaveLength(1);
  });
});

describe('the kept keys: a run claimed in Redis before an outage, claimed again after it', () => {
  it('claims its key again for what is left of its lease only, where Redis lost it meanwhile', async () => {
    const f = await cutAndFleet({ prefix: 'mut36-again' });
    try {
      expect(await f.cut.claimKey('k', running('run', Date.now()), 30_000)).toBeUndefined();
      await f.away();
      const key = new RedisKeys(f.keyPrefix).idempotency('k');
      expect(await f.admin.del(key)).toBe(1); // a Redis restarted without persistence
      await f.back();
      await eventually(async () => (await f.fleet.readKey('k', Date.now()))?.state === 'running', 3_000);
      expect(await f.fleet.readKey('k', Date.now())).toMatchObject({ state: 'running', owner: 'run' });
      const pttl = await f.admin.pttl(key);
      expect(pttl).toBeGreaterThan(15_000);
      expect(pttl).toBeLessThanOrEqual(30_000);
    } finally {
      await f.close();
    }
  }, 30_000);

  it('leaves a claim that lapsed while Redis was away, and stays on Redis', async () => {
    const f = await cutAndFleet({ prefix: 'mut36-lapsed' });
    try {
      expect(await f.cut.claimKey('k', running('run', Date.now()), 400)).toBeUndefined();
      await f.away();
      await sleep(700); // the lease is over, here and in Redis
      const flips: boolean[] = [];
      f.cut.onDegradedChange((d) => flips.push(d));
      await f.back();
      await sleep(500);
      expect(flips).toEqual([false]);
      expect(await f.fleet.readKey('k', Date.now())).toBeUndefined();
    } finally {
      await f.close();
    }
  }, 30_000);
});

describe('the kept keys: how a run ended while Redis was away, sent when it is back', () => {
  it('sends no end whose answer would have lapsed already, and stays on Redis', async () => {
    const f = await cutAndFleet({ prefix: 'mut36-lapsed-end' });
    try {
      const now = Date.now();
      expect(await f.cut.claimKey('k', running('run', now), 30_000)).toBeUndefined();
      await f.away();
      await f.cut.settleKey('k', answer('kept briefly'), 300, Date.now(), 'run');
      await sleep(600); // the answer's ttlMs is over
      const flips: boolean[] = [];
      f.cut.onDegradedChange((d) => flips.push(d));
      await f.back();
      await sleep(500);
      expect(flips).toEqual([false]);
    } finally {
      await f.close();
    }
  }, 30_000);

  it('keeps no end of a write that timed out alone (Redis ran it): a later answer under the key is not written over', async () => {
    const f = await cutAndFleet({ prefix: 'mut36-lone' });
    const key = new RedisKeys(f.keyPrefix).idempotency('k');
    try {
      expect(await f.cut.claimKey('k', running('run', Date.now()), 30_000)).toBeUndefined();
      // Redis holds writes for 300 ms: the end times out here (100 ms), once, and Redis writes it after.
      await f.admin.call('CLIENT', 'PAUSE', '300', 'WRITE');
      await f.cut.settleKey('k', answer('mine'), 60_000, Date.now(), 'run');
      expect(f.cut.degraded).toBe(false);
      await eventually(async () => /"state":"done"/.test((await f.admin.get(key)) ?? ''), 3_000);
      // The answer goes (its record removed), and another run answers under the key.
      await f.admin.del(key);
      expect(await f.fleet.claimKey('k', running('theirs', Date.now()), 30_000)).toBeUndefined();
      await f.fleet.settleKey('k', answer('theirs'), 60_000, Date.now(), 'theirs');
      await f.away();
      await f.back();
      await sleep(500);
      expect(await f.fleet.readKey('k', Date.now())).toEqual(answer('theirs'));
    } finally {
      await f.close();
    }
  }, 30_000);

  it("does not take another request's running claim for its own run, after a claim of its own whose reply was lost", async () => {
    // This instance waits for another's run it saw in Redis for a lease (1 s here) since it last saw it (README).
    const f = await cutAndFleet({ prefix: 'mut36-not-own', keyLeaseMs: 1_000 });
    try {
      expect(await f.fleet.claimKey('k', running('theirs', Date.now()), 30_000)).toBeUndefined();
      // This instance's claim times out (Redis holds writes for 300 ms), and finds the key held when Redis runs it.
      await f.admin.call('CLIENT', 'PAUSE', '300', 'WRITE');
      expect(await f.cut.claimKey('k', running('mine', Date.now()), 30_000)).toMatchObject({ state: 'running' });
      await sleep(400);
      // The request looks again: the claim is another's.
      expect(await f.cut.readKey('k', Date.now())).toMatchObject({ state: 'running', owner: 'theirs' });
      await f.away();
      // Once that sighting is a lease old, a repeat reaching this instance while Redis is away is not told to wait for
      // a run it does not have: this instance's own lost claim (30 s) is not taken for one.
      await sleep(1_100);
      expect(await f.cut.claimKey('k', running('repeat', Date.now()), 30_000)).toBeUndefined();
    } finally {
      await f.close();
    }
  }, 30_000);

  it('forgets a run once its answer is in Redis: no repeat waits for it, and no later return claims its key again', async () => {
    const f = await cutAndFleet({ prefix: 'mut36-settled' });
    try {
      expect(await f.cut.claimKey('k', running('run', Date.now()), 30_000)).toBeUndefined();
      await f.cut.settleKey('k', answer('mine'), 60_000, Date.now(), 'run');
      await f.away();
      await f.admin.del(new RedisKeys(f.keyPrefix).idempotency('k')); // a Redis restarted without persistence
      // Away, a repeat here runs again (as with no key at all), rather than wait for a run that is over.
      expect(await f.cut.claimKey('k', running('repeat', Date.now()), 30_000)).toBeUndefined();
      await f.cut.releaseKey('k', 'repeat');
      await f.back();
      await sleep(300);
      expect(await f.fleet.readKey('k', Date.now())).toBeUndefined();
    } finally {
      await f.close();
    }
  }, 30_000);

  it("leaves a key another run claimed in Redis meanwhile to that run, through the next outage too", async () => {
    const f = await cutAndFleet({ prefix: 'mut36-theirs' });
    try {
      await f.away();
      expect(await f.cut.claimKey('k', running('mine', Date.now()), 30_000)).toBeUndefined();
      expect(await f.fleet.claimKey('k', running('theirs', Date.now()), 30_000)).toBeUndefined();
      await f.back(); // this run's claim finds theirs running in Redis
      await sleep(300);
      await f.fleet.settleKey('k', answer('theirs'), 60_000, Date.now(), 'theirs');
      await f.away();
      await f.cut.settleKey('k', answer('mine'), 60_000, Date.now(), 'mine');
      await f.back();
      await sleep(500);
      // Both ran; the fleet's repeats got theirs, and keep getting it.
      expect(await f.fleet.readKey('k', Date.now())).toEqual(answer('theirs'));
    } finally {
      await f.close();
    }
  }, 30_000);

  it("remembers a claim whose reply was lost, though another request's lost one under the key lapsed before it", async () => {
    const f = await cutAndFleet({ prefix: 'mut36-lost-twice' });
    const key = new RedisKeys(f.keyPrefix).idempotency('k');
    try {
      // A first request's claim times out (Redis holds writes for 300 ms), runs after, and lapses: its lease was short.
      await f.admin.call('CLIENT', 'PAUSE', '300', 'WRITE');
      expect(await f.cut.claimKey('k', running('first', Date.now()), 200)).toMatchObject({ state: 'running' });
      await sleep(800);
      expect(await f.admin.exists(key)).toBe(0);
      // A second request's claim times out too, and takes the key when Redis runs it: it looks again, finds it its own, runs.
      await f.admin.call('CLIENT', 'PAUSE', '300', 'WRITE');
      expect(await f.cut.claimKey('k', running('second', Date.now()), 30_000)).toMatchObject({ state: 'running' });
      await sleep(400);
      expect(await f.cut.readKey('k', Date.now())).toMatchObject({ state: 'running', owner: 'second' });
      expect(f.cut.degraded).toBe(false);
      // It ends while Redis is away: its end reaches Redis at the return, not its claim held there for the lease.
      await f.away();
      await f.cut.settleKey('k', answer('second'), 60_000, Date.now(), 'second');
      await f.back();
      await eventually(async () => (await f.fleet.readKey('k', Date.now()))?.state === 'done', 3_000);
      expect(await f.fleet.readKey('k', Date.now())).toEqual(answer('second'));
    } finally {
      await f.close();
    }
  }, 30_000);

  it('keeps an end Redis refused at the return, and sends it at the next', async () => {
    const f = await cutAndFleet({ prefix: 'mut36-refused-end' });
    const key = new RedisKeys(f.keyPrefix).idempotency('k');
    try {
      expect(await f.cut.claimKey('k', running('run', Date.now()), 30_000)).toBeUndefined();
      await f.away();
      await f.cut.settleKey('k', answer('mine'), 60_000, Date.now(), 'run');
      // Redis comes back refusing writes (OOM under noeviction): the store recovers on the new connection, its end is refused.
      await f.admin.config('SET', 'maxmemory', '1');
      const flips: boolean[] = [];
      f.cut.onDegradedChange((d) => flips.push(d));
      await f.proxy.resume();
      await eventually(() => flips.length >= 2, 8_000);
      expect(flips.slice(0, 2)).toEqual([false, true]);
      expect(await f.admin.get(key)).toMatch(/^\{"state":"running"/);
      await f.admin.config('SET', 'maxmemory', '0');
      await eventually(() => !f.cut.degraded, 8_000);
      // Not the claim of a run that is over, held for the route's timeout: a repeat on the fleet gets the answer.
      await eventually(async () => /^\{"state":"done"/.test((await f.admin.get(key)) ?? ''), 3_000);
    } finally {
      await f.admin.config('SET', 'maxmemory', '0');
      await f.close();
    }
  }, 30_000);
});

/**
 * RedisHealth on a real redis-server, driven as the store drives it (failed, answered, onConnected) by the test: its
 * health checks run when the test moves their interval (fake setInterval only; ioredis keeps its real timers), and
 * the store's clock, which says who flaps, is the test's.
 */
describe('the health machine on a real Redis', () => {
  const server = useRedisServerWithAdmin();
  const made: Array<{ close(): void; client: ScriptClient }> = [];
  afterEach(async () => {
    vi.useRealTimers();
    for (const m of made.splice(0)) {
      m.close();
      m.client.disconnect();
    }
    await server.admin().config('SET', 'maxmemory', '0');
    await server.admin().call('CLIENT', 'UNPAUSE');
  });

  async function healthOn() {
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
    const keyPrefix = `mut36-${randomUUID()}`;
    const client = defineScripts(connectRedis({ redis: server.redis().url, commandTimeoutMs: 200, keyPrefix }, { subscriber: false }));
    await eventually(() => client.status === 'ready', 5_000);
    const clock = { now: 1_000_000 };
    const raw: string[] = [];
    let recovered = 0;
    const health = new RedisHealth({
      client, keys: new RedisKeys(keyPrefix), logger: pino({ level: 'debug' }, testLogSink(raw)), now: () => clock.now, commandTimeoutMs: 200,
      address: 'test', clockRead: () => true, onRecovered: () => recovered++,
    });
    made.push({ close: () => health.close(), client });
    /** One health check (its interval moved a second) and its answer in; `waitMs` for one that is to time out. */
    const check = async (waitMs = 0) => {
      vi.advanceTimersByTime(1_000);
      if (waitMs > 0) await sleep(waitMs);
      await client.ping().catch(() => undefined);
      await new Promise((r) => setImmediate(r));
    };
    /** Health checks until it recovers: how many it took. */
    const checksToRecover = async () => {
      for (let n = 1; n <= 40; n++) {
        await check();
        if (!health.degraded) return n;
      }
      return Number.POSITIVE_INFINITY;
    };
    return { client, clock, health, keyPrefix, check, checksToRecover, recovered: () => recovered, lines: () => raw.map((l) => JSON.parse(l) as LogLine) };
  }

  it('doubles the clean checks it needs at each flap within a minute, up to 16, and needs one again after a quiet minute', async () => {
    const h = await healthOn();
    const needed: number[] = [];
    for (let flap = 0; flap < 6; flap++) {
      h.clock.now += 1_000;
      h.health.failed(new Error('boom'));
      expect(h.health.degraded).toBe(true);
      needed.push(await h.checksToRecover());
    }
    expect(needed).toEqual([1, 2, 4, 8, 16, 16]);
    h.clock.now += 61_000;
    h.health.failed(new Error('boom'));
    expect(await h.checksToRecover()).toBe(1);
  });

  it('counts only clean checks in a row: a failed one between starts the count again', async () => {
    const h = await healthOn();
    h.health.failed(new Error('boom'));
    expect(await h.checksToRecover()).toBe(1);
    h.clock.now += 1_000;
    h.health.failed(new Error('boom')); // a flap: two clean checks needed
    await h.check();
    expect(h.health.degraded).toBe(true);
    // Redis refuses writes (OOM under noeviction) for one check.
    await server.admin().config('SET', 'maxmemory', '1');
    await h.check();
    await server.admin().config('SET', 'maxmemory', '0');
    expect(h.health.degraded).toBe(true);
    await h.check();
    expect(h.health.degraded).toBe(true);
    await h.check();
    expect(h.health.degraded).toBe(false);
  });

  it('checks beside the key that failed, and forgets that key once recovered', async () => {
    const h = await healthOn();
    const keys = new RedisKeys(h.keyPrefix);
    const failedKey = keys.idempotency('k');
    h.health.failed(new Error('boom'), failedKey);
    await h.check();
    expect(h.health.degraded).toBe(false);
    h.clock.now += 120_000;
    h.health.failed(new Error('boom')); // a command of no one key
    await server.admin().del(keys.probe(failedKey), keys.probe());
    await h.check();
    expect(h.health.degraded).toBe(false);
    expect(await server.admin().exists(keys.probe())).toBe(1);
    expect(await server.admin().exists(keys.probe(failedKey))).toBe(0);
  });

  it('counts timeouts in a row only: an answer between them ends the run, so three apart are no outage', async () => {
    const h = await healthOn();
    const timedOut = () => new Error('Command timed out');
    for (let i = 0; i < 3; i++) {
      h.health.failed(timedOut());
      h.health.answered();
    }
    h.health.failed(timedOut());
    expect(h.health.degraded).toBe(false);
  });

  it('drops a connection whose health checks time out twice in a row for a new one', async () => {
    const h = await healthOn();
    let closes = 0;
    h.client.on('close', () => closes++);
    h.health.failed(new Error('boom'));
    await server.admin().call('CLIENT', 'PAUSE', '10000', 'WRITE'); // the checks write: they wait, and time out
    await h.check(400);
    await sleep(100);
    expect(closes).toBe(0);
    await h.check(400);
    await eventually(() => closes === 1, 2_000);
  });
});
