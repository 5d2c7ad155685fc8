// Two gateway instances sharing one redis-server: what one does, the other sees; and when Redis goes away, both keep
// answering from local state and come back by themselves.
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
import type { BreakerRecord, StateChange } from '../src/state/store.ts';
import { startRedis, useRedisServer, type RedisHandle } from './helpers/redis-server.ts';

const OPEN: BreakerRecord = { state: 'open', sinceMs: 1000, openUntilMs: 6000, probeSuccesses: 0, generation: 1 };
const BUDGET = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 0 };

const redis = useRedisServer();
const stores: RedisStore[] = [];
afterEach(async () => {
  await Promise.all(stores.splice(0).map((s) => s.close()));
});

interface FleetOptions {
  server?: RedisHandle;
  commandTimeoutMs?: number;
  /** Collects every log line of the instances; each line carries `"instance":<index in this file's stores>`. */
  logs?: string[];
}

/** n stores sharing one key prefix on one server, as a fleet would; `join` starts more of the same fleet. */
async function fleet(n: number, opts: FleetOptions = {}): Promise<{ stores: RedisStore[]; join: (n: number) => Promise<RedisStore[]>; keyPrefix: string }> {
  const keyPrefix = `t-${randomUUID()}`;
  const join = async (count: number): Promise<RedisStore[]> => {
    const out: RedisStore[] = [];
    for (let i = 0; i < count; i++) {
      const logs = opts.logs;
      const base = { instance: stores.length };
      const logger = logs ? pino({ level: 'info', base }, new Writable({ write: (c, _e, cb) => cb(void logs.push(String(c))) })) : undefined;
      const url = (opts.server ?? redis()).url;
      const store = new RedisStore({ config: { redis: url, commandTimeoutMs: opts.commandTimeoutMs ?? 200, keyPrefix }, logger });
      stores.push(store);
      out.push(store);
    }
    for (const s of out) expect(await s.ready()).toBe(true);
    return out;
  };
  return { stores: await join(n), join, keyPrefix };
}

/** Polls until check() holds; returns how long it took. */
async function eventually(check: () => boolean, withinMs: number): Promise<number> {
  const start = Date.now();
  while (!check()) {
    if (Date.now() - start > withinMs) throw new Error(`condition not met within ${withinMs} ms`);
    await sleep(5);
  }
  return Date.now() - start;
}

/** Awaits p and returns how long it took. */
async function timed(p: Promise<unknown>): Promise<number> {
  const start = Date.now();
  await p;
  return Date.now() - start;
}

describe('two instances on one Redis', () => {
  it('shows a breaker change on A to B synchronously within 500 ms, firing B.onChange once', async () => {
    const [a, b] = (await fleet(2)).stores;
    const seen: StateChange[] = [];
    b!.onChange((c) => seen.push(c));
    expect(await a!.casBreaker('t1', 0, OPEN)).toBe(true);
    await eventually(() => b!.getBreaker('t1')?.generation === 1, 500);
    expect(b!.getBreaker('t1')).toEqual(OPEN);
    // B's CAS with the generation it now sees succeeds; a stale one fails.
    expect(await b!.casBreaker('t1', 0, { ...OPEN, generation: 9 })).toBe(false);
    await sleep(100);
    expect(seen).toEqual([{ kind: 'breaker', target: 't1', record: OPEN }]);
  });

  it('shows a hold-off set on A to B within 500 ms', async () => {
    const [a, b] = (await fleet(2)).stores;
    await a!.setHoldOff('t1', 5000);
    await eventually(() => b!.getHoldOff('t1') === 5000, 500);
    // B cannot shorten it, and learns the stored end from the refusal.
    await b!.setHoldOff('t1', 4000);
    expect(b!.getHoldOff('t1')).toBe(5000);
  });

  it('teaches a newly started instance the fleet state on first look', async () => {
    const { stores: [a], join } = await fleet(1);
    await a!.casBreaker('t1', 0, OPEN);
    const [late] = await join(1);
    expect(late!.getBreaker('t1')).toBeUndefined(); // first look: not cached yet, read in the background
    await eventually(() => late!.getBreaker('t1')?.generation === 1, 500);
  });

  it('shares the failed probes of a reopened breaker, and reads a record an older instance wrote without them', async () => {
    const { stores: [a, b], join, keyPrefix } = await fleet(2);
    const reopened: BreakerRecord = { ...OPEN, generation: 4, failedProbes: 3 };
    expect(await a!.casBreaker('t1', 0, reopened)).toBe(true);
    await eventually(() => b!.getBreaker('t1')?.generation === 4, 500);
    expect(b!.getBreaker('t1')).toEqual(reopened);
    // Half-open with a probe failed: both counts travel, read back from the hash as well as from the message.
    const half: BreakerRecord = { state: 'half-open', sinceMs: 8000, openUntilMs: 0, probeSuccesses: 2, probeFailures: 1, failedProbes: 3, generation: 5 };
    expect(await b!.casBreaker('t1', 4, half)).toBe(true);
    await eventually(() => a!.getBreaker('t1')?.generation === 5, 500);
    expect(a!.getBreaker('t1')).toEqual(half);
    const [reader] = await join(1);
    await eventually(() => reader!.getBreaker('t1')?.generation === 5, 500);
    expect(reader!.getBreaker('t1')).toEqual(half);
    // Closing ends the run: the fields are written back as none, not left behind from the earlier record.
    const closedRec: BreakerRecord = { state: 'closed', sinceMs: 9000, openUntilMs: 0, probeSuccesses: 0, generation: 6 };
    expect(await a!.casBreaker('t1', 5, closedRec)).toBe(true);
    await eventually(() => b!.getBreaker('t1')?.generation === 6, 500);
    expect(b!.getBreaker('t1')).toEqual(closedRec);
    // A hash from before the field existed (a rolling upgrade): still a valid record, with no failed probes.
    const raw = new Redis(redis().url);
    // This fleet's key: other tests' fleets (other prefixes) hold a {t1} breaker too.
    const key = `${keyPrefix}:{t2}:breaker`;
    await raw.hset(key, 'state', 'open', 'sinceMs', '1000', 'openUntilMs', '6000', 'probeSuccesses', '0', 'generation', '1');
    await raw.quit();
    const [late] = await join(1);
    // The first look reads it in the background.
    expect(late!.getBreaker('t2')).toBeUndefined();
    await eventually(() => late!.getBreaker('t2')?.generation === 1, 500);
    expect(late!.getBreaker('t2')).toEqual(OPEN);
  });

  it('gives no probe permit for a breaker record the fleet has moved past, however the caller sees it', async () => {
    const { stores: [a, b] } = await fleet(2);
    const now = Date.now();
    expect(await a!.casBreaker('t1', 0, OPEN)).toBe(true);
    // Another instance's probe failed and reopened the breaker: generation 2. A caller still judging by generation 1 (its
    // view a moment behind, the permit just given back) would send a second probe into the outage.
    expect(await a!.casBreaker('t1', 1, { ...OPEN, sinceMs: 2000, openUntilMs: 7000, generation: 2, failedProbes: 1 })).toBe(true);
    expect(await b!.takePermit('t1', 1, 5_000, now, 1)).toBeNull();
    const permit = await b!.takePermit('t1', 1, 5_000, now, 2);
    expect(permit).not.toBeNull();
    await b!.releasePermit('t1', permit!);
    // No record at all (flushed, expired): nothing to be behind of.
    expect(await b!.takePermit('t-none', 1, 5_000, now, 7)).not.toBeNull();
  });

  it('does not take a failed-probe count an older instance left behind when it wrote over the record', async () => {
    const { stores: [a], join, keyPrefix } = await fleet(1);
    // A new instance reopens the breaker after three failed probes.
    expect(await a!.casBreaker('t1', 3, { ...OPEN, generation: 4, failedProbes: 3 })).toBe(true);
    // An older instance (its compare-and-set script HSETs only the fields it knows) closes it, and later trips it
    // afresh: neither write touches failedProbes.
    const raw = new Redis(redis().url);
    const key = `${keyPrefix}:{t1}:breaker`;
    expect(await raw.hget(key, 'failedProbes')).toBe('3');
    await raw.hset(key, 'state', 'closed', 'sinceMs', '9000', 'openUntilMs', '0', 'probeSuccesses', '0', 'generation', '5');
    await raw.hset(key, 'state', 'open', 'sinceMs', '20000', 'openUntilMs', '50000', 'probeSuccesses', '0', 'generation', '6');
    await raw.quit();
    const [late] = await join(1);
    late!.getBreaker('t1');
    await eventually(() => late!.getBreaker('t1')?.generation === 6, 500);
    // A fresh opening: parked requests probe after probeWhileParkedMs, not after 2^3 times that.
    expect(late!.getBreaker('t1')!.failedProbes).toBeUndefined();
  });

  it('does not take a half-open failure count that an instance of the release before it re-stamped when it reopened the breaker', async () => {
    const { stores: [a], join, keyPrefix } = await fleet(1);
    // A new instance: half-open, two of its probes failed.
    expect(await a!.casBreaker('t1', 4, { state: 'half-open', sinceMs: 8000, openUntilMs: 0, probeSuccesses: 1, probeFailures: 2, generation: 5 })).toBe(true);
    // An instance of the release before (it knows failedProbes and its stamp, not probeFailures) reopens it on a failed
    // probe: its compare-and-set stamps the generation it writes, and leaves probeFailures behind.
    const raw = new Redis(redis().url);
    const key = `${keyPrefix}:{t1}:breaker`;
    await raw.hset(key, 'state', 'open', 'sinceMs', '9000', 'openUntilMs', '11000', 'probeSuccesses', '0', 'generation', '6', 'failedProbes', '1', 'failedProbesGeneration', '6');
    await raw.quit();
    const [late] = await join(1);
    late!.getBreaker('t1');
    await eventually(() => late!.getBreaker('t1')?.generation === 6, 500);
    // Taken as this spell's, the count would reopen the breaker on its first probe's success (1 success, 2 failures).
    expect(late!.getBreaker('t1')).toEqual({ state: 'open', sinceMs: 9000, openUntilMs: 11000, probeSuccesses: 0, generation: 6, failedProbes: 1 });
  });

  it('shares probe permits across the fleet', async () => {
    const [a, b] = (await fleet(2)).stores;
    const now = Date.now();
    expect(await a!.takePermit('t1', 3, 5000, now)).not.toBeNull();
    expect(await a!.takePermit('t1', 3, 5000, now)).not.toBeNull();
    expect(await b!.takePermit('t1', 3, 5000, now)).not.toBeNull();
    expect(await b!.takePermit('t1', 3, 5000, now)).toBeNull();
  });

  it('shares one retry budget: requests counted on A pay for retries on B', async () => {
    const [a, b] = (await fleet(2)).stores;
    const now = Date.now();
    a!.addRequests('r1', 100, now);
    await sleep(150); // A flushes its batched counts at most 50 ms apart
    for (let i = 0; i < 6; i++) expect(await b!.takeRetry('r1', BUDGET, now)).toBe(true);
    for (let i = 0; i < 4; i++) expect(await a!.takeRetry('r1', BUDGET, now)).toBe(true);
    expect(await a!.takeRetry('r1', BUDGET, now)).toBe(false);
    expect(await b!.budgetWindow('r1', BUDGET, now)).toEqual({ requests: 100, retries: 10 });
  });
});

describe('breaker transitions across the fleet', () => {
  it('counts each state change once fleet-wide, by the instance that made it, through a whole open/probe/close cycle', async () => {
    const [a, b] = (await fleet(2)).stores;
    const s = settingsForModel(BreakerSchema.parse({ openS: 30, halfOpenProbes: 3, closeAfter: 3 }), undefined);
    let now = Date.now();
    const made: string[] = [];
    const seen = { a: 0, b: 0 };
    const board = (store: RedisStore, name: string) =>
      new BreakerBoard({ store, now: () => now, random: () => 0, onTransition: (_t, from, to) => made.push(`${name}:${from.state}->${to.state}`) });
    const boardA = board(a!, 'A');
    const boardB = board(b!, 'B');
    a!.onChange((c) => void (c.kind === 'breaker' && seen.a++));
    b!.onChange((c) => void (c.kind === 'breaker' && seen.b++));
    const probe = async (on: BreakerBoard, verdict: 'success' | 'failure') => {
      const admission = await on.admit('p/m', s, false, 5_000);
      expect(admission.admitted).toBe(true);
      await on.record('p/m', s, verdict, 10, admission.admitted ? admission.probe : undefined);
    };
    /** Waits until both instances hold the same record, so the next step starts from the fleet's state. */
    const settled = () => eventually(() => JSON.stringify(a!.getBreaker('p/m')) === JSON.stringify(b!.getBreaker('p/m')), 1_000);

    for (let i = 0; i < 5; i++) await boardA.record('p/m', s, 'failure', 10, undefined);
    await settled();
    now += 31_000;
    await probe(boardB, 'failure'); // a failed first probe: stays open, a new probe time
    await settled();
    now += 31_000;
    await probe(boardB, 'success'); // open -> half-open, on B
    await settled();
    await probe(boardA, 'success'); // still half-open: no transition
    await settled();
    await probe(boardB, 'success'); // half-open -> closed, on B
    await settled();

    expect(made).toEqual(['A:closed->open', 'B:open->half-open', 'B:half-open->closed']);
    expect(b!.getBreaker('p/m')).toMatchObject({ state: 'closed', generation: 5 });
    // Every instance took in each of the five records once, whether it wrote it or learnt it through pub/sub.
    expect(seen).toEqual({ a: 5, b: 5 });
    boardA.close();
    boardB.close();
  });
});

describe('a breaker record that Redis loses while it stays up (FLUSHALL, eviction, expiry)', () => {
  it('opens and closes again: the next change writes a record back, whatever generation the writer last saw', async () => {
    const f = await fleet(2);
    const [a, b] = f.stores;
    const s = settingsForModel(BreakerSchema.parse({ openS: 30, halfOpenProbes: 3, closeAfter: 1 }), undefined);
    let now = Date.now();
    const boardA = new BreakerBoard({ store: a!, now: () => now, random: () => 0 });
    const boardB = new BreakerBoard({ store: b!, now: () => now, random: () => 0 });
    const admin = new Redis(redis().url);
    const key = (await admin.keys('*breaker')).find((k) => k.includes('p/lost'));
    expect(key).toBeUndefined();
    try {
      // A closed breaker with a history (generation 2: opened and closed once), then its record is lost.
      for (let i = 0; i < 5; i++) await boardA.record('p/lost', s, 'failure', 10, undefined);
      now += 31_000;
      const probe = await boardA.admit('p/lost', s, false, 5_000);
      await boardA.record('p/lost', s, 'success', 10, probe.admitted ? probe.probe : undefined);
      await eventually(() => b!.getBreaker('p/lost')?.state === 'closed' && b!.getBreaker('p/lost')?.generation === 2, 1_000);
      for (const k of await admin.keys('*p/lost*')) await admin.del(k);

      // It still opens, fleet-wide.
      for (let i = 0; i < 5; i++) await boardB.record('p/lost', s, 'failure', 10, undefined);
      expect(b!.getBreaker('p/lost')?.state).toBe('open');
      await eventually(() => a!.getBreaker('p/lost')?.state === 'open', 1_000);
      const stored = (await admin.keys('*p/lost*:breaker'))[0]!;
      expect(await admin.hget(stored, 'state')).toBe('open');
      // And it expires some day, so targets a fleet stopped using do not stay in Redis forever.
      expect(await admin.pttl(stored)).toBeGreaterThan(24 * 3600 * 1000);

      // Lost while open: it still closes after a good probe.
      await admin.del(stored);
      now += 31_000;
      const next = await boardA.admit('p/lost', s, false, 5_000);
      expect(next.admitted).toBe(true);
      await boardA.record('p/lost', s, 'success', 10, next.admitted ? next.probe : undefined);
      expect(a!.getBreaker('p/lost')?.state).toBe('closed');
      await eventually(() => b!.getBreaker('p/lost')?.state === 'closed', 1_000);
    } finally {
      boardA.close();
      boardB.close();
      admin.disconnect();
    }
  });
});

describe('when Redis goes away', () => {
  const TIMEOUT_MS = 100;
  const BOUND_MS = TIMEOUT_MS * 3 + 100;
  let server: RedisHandle;
  beforeAll(async () => {
    server = await startRedis();
  });
  afterEach(async () => {
    await server.restart(); // a failed test may leave it stopped or paused
  });
  afterAll(async () => {
    await server?.stop();
  });

  it('answers every call from local state within the timeout, says so once, and returns to Redis by itself', async () => {
    const logs: string[] = [];
    const { stores: [a, b], join } = await fleet(2, { server, commandTimeoutMs: TIMEOUT_MS, logs });
    const flips: boolean[] = [];
    a!.onDegradedChange((d) => flips.push(d));
    await a!.casBreaker('kept', 0, OPEN);
    await eventually(() => b!.getBreaker('kept')?.generation === 1, 500);

    await server.stop();
    const now = Date.now();
    expect(await timed(a!.addOutcomes('t1', 0, { requests: 1, failures: 1 }, now, 10))).toBeLessThan(BOUND_MS);
    expect(await timed(a!.takePermit('t1', 1, 5000, now))).toBeLessThan(BOUND_MS);
    expect(await timed(a!.releasePermit('t1', 'nope'))).toBeLessThan(BOUND_MS);
    a!.addRequests('r1', 10, now);
    expect(await timed(a!.takeRetry('r1', BUDGET, now))).toBeLessThan(BOUND_MS);
    expect(await timed(a!.budgetWindow('r1', BUDGET, now))).toBeLessThan(BOUND_MS);
    expect(await timed(a!.setHoldOff('t1', now + 60_000))).toBeLessThan(BOUND_MS);
    expect(await timed(a!.casBreaker('t1', 0, OPEN))).toBeLessThan(BOUND_MS);
    expect(a!.degraded).toBe(true);
    // Local state stands in: the window, budget, breaker and hold-off written above are all there.
    expect(await a!.addOutcomes('t1', 0, { requests: 0, failures: 0 }, now, 10)).toEqual({ requests: 1, failures: 1 });
    expect(await a!.budgetWindow('r1', BUDGET, now)).toEqual({ requests: 10, retries: 1 });
    expect(a!.getBreaker('t1')).toEqual(OPEN);
    expect(a!.getHoldOff('t1')).toBe(now + 60_000);
    const changes: StateChange[] = [];
    a!.onChange((c) => changes.push(c));
    expect(await a!.casBreaker('t2', 0, OPEN)).toBe(true);
    expect(changes).toEqual([{ kind: 'breaker', target: 't2', record: OPEN }]);

    await sleep(500); // several failed reconnects later: still one flip, one warning
    expect(flips).toEqual([true]);
    const linesOfA = (msg: string) => logs.filter((l) => l.includes('"instance":0') && l.includes(msg));
    expect(linesOfA('state store degraded: using local state')).toHaveLength(1);

    await server.restart();
    await eventually(() => !a!.degraded && !b!.degraded, 8000);
    expect(flips).toEqual([true, false]);
    expect(linesOfA('state store recovered: using Redis')).toHaveLength(1);
    expect(await a!.ready()).toBe(true);
    expect(await b!.ready()).toBe(true);
    expect(await a!.casBreaker('after', 0, OPEN)).toBe(true);
    await eventually(() => b!.getBreaker('after')?.generation === 1, 500);
    // The restarted Redis came back empty; the instances wrote back the breakers they held.
    const [late] = await join(1);
    late!.getBreaker('kept');
    await eventually(() => late!.getBreaker('kept')?.generation === 1, 1000);
  });

  it('treats a Redis that stops answering like one that is gone, and returns when it answers again', async () => {
    const { stores: [a] } = await fleet(1, { server, commandTimeoutMs: TIMEOUT_MS });
    const admin = new Redis(server.url);
    try {
      await admin.call('CLIENT', 'PAUSE', '1000', 'ALL');
      // One late reply is no outage (a busy event loop can fire the timer first); three in a row are.
      for (let i = 0; i < 3; i++) {
        expect(a!.degraded).toBe(false);
        expect(await timed(a!.takeRetry('r1', BUDGET, Date.now()))).toBeLessThan(BOUND_MS);
      }
      expect(a!.degraded).toBe(true);
      // While degraded the store does not wait on Redis at all.
      expect(await timed(a!.takePermit('t1', 1, 5000, Date.now()))).toBeLessThan(50);
      await eventually(() => !a!.degraded, 3000);
      expect(await a!.takePermit('t1', 1, 5000, Date.now())).not.toBeNull();
    } finally {
      admin.disconnect();
    }
  });
});
