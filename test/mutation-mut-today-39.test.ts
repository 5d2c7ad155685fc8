// Mutation round on the 2026-12-05 changes to shutdown and the Redis state (the late breaker write, first reads that
// time out, the close flushes, hold-offs over when read): each test here kills a mutant the earlier tests let live.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import pino from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { BreakerSchema } from '../src/config/schema.ts';
import { settingsForModel } from '../src/policy/breaker.ts';
import { BreakerBoard } from '../src/state/breaker-board.ts';
import { RedisStore } from '../src/state/redis-store.ts';
import { FleetView } from '../src/state/redis-view.ts';
import type { BreakerRecord, StateChange } from '../src/state/store.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { eventually } from './helpers/redis-stores.ts';
import { defaultConfig, startStack, TEST_KEY, testLogSink } from './helpers/stack.ts';

const redis = useRedisServer();
const stores: RedisStore[] = [];
const admins: Redis[] = [];
afterEach(async () => {
  for (const a of admins.splice(0)) a.disconnect();
  await Promise.all(stores.splice(0).map((s) => s.close()));
});

function fleet(commandTimeoutMs = 500) {
  const keyPrefix = `m39-${randomUUID()}`;
  const make = (timeoutMs = commandTimeoutMs) => {
    const store = new RedisStore({ config: { redis: redis().url, commandTimeoutMs: timeoutMs, keyPrefix } });
    stores.push(store);
    return store;
  };
  const admin = new Redis(redis().url);
  admins.push(admin);
  const field = (target: string, name: string) => admin.hget(`${keyPrefix}:{${target}}:breaker`, name);
  return { keyPrefix, make, admin, field };
}

const record = (state: BreakerRecord['state'], generation: number, sinceMs: number, openUntilMs = 0): BreakerRecord => ({
  state, sinceMs, openUntilMs, probeSuccesses: 0, generation,
});

describe('FleetView.putHoldOff with the time it is read at', () => {
  it('keeps a hold-off that ends exactly at nowMs without a word, and announces one that ends a millisecond later', () => {
    const view = new FleetView(() => undefined);
    const heard: StateChange[] = [];
    view.onChange((c) => heard.push(c));
    view.putHoldOff('p/over', 10_000, 10_000);
    expect(view.holdOff('p/over')).toBe(10_000);
    expect(heard).toEqual([]);
    view.putHoldOff('p/live', 10_001, 10_000);
    expect(heard).toEqual([{ kind: 'hold-off', target: 'p/live', untilMs: 10_001 }]);
  });
});

describe('a hold-off message heard after the hold-off ended (a slow subscriber, a late message)', () => {
  it('is kept without a word: no hold-off change for a hold-off already over', async () => {
    const { make } = fleet();
    const a = make();
    const b = make();
    expect(await a.ready()).toBe(true);
    expect(await b.ready()).toBe(true);
    const t = 'p/late-message';
    a.getHoldOff(t);
    await a.firstRead(t);
    const heard: number[] = [];
    a.onChange((c) => c.kind === 'hold-off' && heard.push(c.untilMs));
    const until = Date.now() - 50;
    await b.setHoldOff(t, until, Date.now());
    await eventually(() => a.getHoldOff(t) === until, 3_000);
    expect(heard).toEqual([]);
  });
});

describe('closing the breaker board', () => {
  it('waits for its last batch\'s breaker decision: the batch that tips the window opens the breaker in Redis before the store closes', async () => {
    const { make, field } = fleet();
    const a = make();
    expect(await a.ready()).toBe(true);
    const s = settingsForModel(BreakerSchema.parse({ consecutiveFailures: 1_000, failureRate: 0.5, minRequests: 10, windowS: 30 }), undefined);
    const now = Date.now();
    const board = new BreakerBoard({ store: a, now: () => now, random: () => 0 });
    for (let i = 0; i < 10; i++) await board.record('p/m', s, 'failure', 10, undefined);
    await board.close();
    await a.close();
    expect(await field('p/m', 'state')).toBe('open');
  });

  it('is awaited by the gateway\'s close: the failures answered just before it stopped open the breaker on the fleet', async () => {
    const { keyPrefix, field } = fleet();
    const s = await startStack({
      faults: { errors: [{ status: 500 }] },
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl, {
          route: { retry: { maxAttempts: 1 }, park: false },
          provider: { breaker: { consecutiveFailures: 1_000, failureRate: 0.5, minRequests: 4, windowS: 30 } },
        });
        return { ...base, state: { redis: redis().url, keyPrefix, commandTimeoutMs: 500 } };
      },
    });
    let closed = false;
    try {
      const send = () =>
        fetch(`${s.url}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', authorization: `Bearer ${TEST_KEY}` },
          body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
        }).then((r) => r.status);
      // Three failures reach Redis's window (below minRequests); the fourth is the last batch, still held at close.
      expect(await Promise.all([send(), send(), send()])).toEqual([500, 500, 500]);
      await sleep(300);
      expect(await field('mock/gpt-4o', 'state')).not.toBe('open');
      expect(await send()).toBe(500);
      closed = true;
      await s.close();
      expect(await field('mock/gpt-4o', 'state')).toBe('open');
    } finally {
      if (!closed) await s.close();
    }
  });
});

describe('a breaker write that timed out once, run late by a Redis busy for a moment (the store stays on Redis)', () => {
  async function lateOpen() {
    const f = fleet();
    const a = f.make(100);
    const b = f.make();
    expect(await a.ready()).toBe(true);
    expect(await b.ready()).toBe(true);
    const t = 'p/late';
    a.getBreaker(t);
    b.getBreaker(t);
    await Promise.all([a.firstRead(t), b.firstRead(t)]);
    await f.admin.call('CLIENT', 'PAUSE', '400', 'ALL');
    const now = Date.now();
    const open = record('open', 1, now, now + 60_000);
    // Answered too late: applied on A's view alone; Redis runs it once the pause is over.
    expect(await a.casBreaker(t, 0, open)).toBe(true);
    expect(a.degraded).toBe(false);
    await eventually(async () => (await f.field(t, 'generation')) === '1', 5_000);
    await eventually(() => b.getBreaker(t)?.generation === 1, 3_000);
    return { ...f, a, b, t, open };
  }

  it('is the record A holds: heard back, it is left as it is (not written again under a new generation)', async () => {
    const { a, t, field, open } = await lateOpen();
    // A hears its own message and re-reads the target.
    await sleep(500);
    await a.refresh([t]);
    expect(await field(t, 'generation')).toBe('1');
    expect(a.getBreaker(t)).toEqual(open);
  });

  it('once another instance has moved the breaker on, a re-read leaves the fleet\'s record as it is', async () => {
    const { a, b, t, field } = await lateOpen();
    const half = record('half-open', 2, Date.now() + 5);
    expect(await b.casBreaker(t, 1, half)).toBe(true);
    const closed = record('closed', 3, Date.now() + 10);
    expect(await b.casBreaker(t, 2, closed)).toBe(true);
    await eventually(() => a.getBreaker(t)?.generation === 3, 3_000);
    await a.refresh([t]);
    await sleep(200);
    expect(await field(t, 'generation')).toBe('3');
    expect(a.getBreaker(t)).toEqual(closed);
    expect(b.getBreaker(t)).toEqual(closed);
  });
});

describe('first reads that time out', () => {
  it('count toward the store\'s health: a Redis that answers none of them takes the store to local state', async () => {
    const { make } = fleet();
    const a = make(100);
    expect(await a.ready()).toBe(true);
    const thaw = redis().freeze();
    try {
      // Nothing but first reads goes to Redis, each a batch of its own, more than half a timeout apart.
      for (let i = 0; i < 8 && !a.degraded; i++) {
        a.getHoldOff(`p/first-${i}`);
        await a.firstRead(`p/first-${i}`);
        await sleep(80);
      }
      expect(a.degraded).toBe(true);
    } finally {
      thaw();
    }
  });
});

/** Takes `store` to local state on a frozen Redis: hold-off writes, each timing out, more than half a timeout apart. */
async function degrade(store: RedisStore): Promise<void> {
  for (let i = 0; i < 8 && !store.degraded; i++) {
    await store.setHoldOff(`other/${i}`, Date.now() + 1_000, Date.now());
    await sleep(80);
  }
  await eventually(() => store.degraded, 5_000);
}

describe('breaker writes that timed out and ran late (Redis paused), after the store went to local state and moved on', () => {
  it('replaces the late one with a newer record of the same spell (a half-open probe\'s success), but not with a record of an earlier spell', async () => {
    const { keyPrefix, make, field } = fleet();
    const raw: string[] = [];
    const a = new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 100, keyPrefix }, logger: pino({ level: 'info' }, testLogSink(raw)) });
    stores.push(a);
    const b = make();
    expect(await a.ready()).toBe(true);
    expect(await b.ready()).toBe(true);
    const probe = 'p/probe';
    const earlier = 'p/earlier';
    for (const t of [probe, earlier]) {
      a.getBreaker(t);
      b.getBreaker(t);
    }
    await Promise.all([probe, earlier].flatMap((t) => [a.firstRead(t), b.firstRead(t)]));
    const t0 = Date.now();
    expect(await a.casBreaker(probe, 0, record('open', 1, t0, t0 + 100))).toBe(true);
    const half = record('half-open', 2, Date.now());
    let openedAt = 0;
    const thaw = redis().freeze();
    try {
      // Both time out: applied on A's view, run by Redis once it resumes.
      expect(await a.casBreaker(probe, 1, half)).toBe(true);
      await sleep(80);
      openedAt = Date.now();
      expect(await a.casBreaker(earlier, 0, record('open', 1, openedAt, openedAt + 60_000))).toBe(true);
      await degrade(a);
      // On local state: a probe's success (half-open keeps its sinceMs), and a record of a spell before the late open
      // (its sinceMs earlier, as after this instance's clock stepped back).
      expect(await a.casBreaker(probe, 2, { ...half, probeSuccesses: 1, generation: 3 })).toBe(true);
      expect(await a.casBreaker(earlier, 1, record('closed', 2, openedAt - 1_000))).toBe(true);
    } finally {
      thaw();
    }
    await eventually(() => !a.degraded, 10_000);
    await sleep(1_500);
    expect(await field(probe, 'probeSuccesses')).toBe('1');
    expect(a.getBreaker(probe)).toMatchObject({ state: 'half-open', sinceMs: half.sinceMs, probeSuccesses: 1, generation: 4 });
    await eventually(() => b.getBreaker(probe)?.generation === 4, 3_000);
    const lines = raw.map((l) => JSON.parse(l) as { msg: string; target?: string; state?: string });
    expect(lines.filter((l) => l.msg.includes('ran late'))).toEqual([
      expect.objectContaining({ target: probe, state: 'half-open', msg: "breaker write Redis ran late (after its timeout) replaced by this instance's newer record" }),
    ]);
    expect(await field(earlier, 'state')).toBe('open');
    expect(a.getBreaker(earlier)).toMatchObject({ state: 'open', sinceMs: openedAt, generation: 1 });
  });

  it('an open Redis ran late and A read back before the outage is the fleet\'s record like any other: A\'s lone close on local state does not replace it', async () => {
    const { admin, make, field } = fleet();
    const a = make(100);
    const b = make();
    expect(await a.ready()).toBe(true);
    expect(await b.ready()).toBe(true);
    const t = 'p/settled';
    a.getBreaker(t);
    b.getBreaker(t);
    await Promise.all([a.firstRead(t), b.firstRead(t)]);
    await admin.call('CLIENT', 'PAUSE', '400', 'ALL');
    const openedAt = Date.now();
    expect(await a.casBreaker(t, 0, record('open', 1, openedAt, openedAt + 300))).toBe(true);
    expect(a.degraded).toBe(false);
    await eventually(async () => (await field(t, 'generation')) === '1', 5_000);
    // A hears its own write back and reads it again (onOwnChange): settled, as if it had been answered in time.
    await sleep(500);
    const thaw = redis().freeze();
    try {
      await degrade(a);
      await sleep(Math.max(0, openedAt + 400 - Date.now()));
      expect(await a.casBreaker(t, 1, record('half-open', 2, Date.now()))).toBe(true);
      expect(await a.casBreaker(t, 2, record('closed', 3, Date.now() + 1))).toBe(true);
    } finally {
      thaw();
    }
    await eventually(() => !a.degraded, 10_000);
    await sleep(1_500);
    // As for an open answered in time: on its return the fleet's record wins over what A decided alone (but an open).
    expect(await field(t, 'state')).toBe('open');
    expect(a.getBreaker(t)?.state).toBe('open');
    expect(b.getBreaker(t)?.state).toBe('open');
  });
});

describe('a message on the events channel that is not a change (another program, a release that writes another shape)', () => {
  it('is passed over: the store hears the next change', async () => {
    const { keyPrefix, make, admin } = fleet();
    const a = make();
    const b = make();
    expect(await a.ready()).toBe(true);
    expect(await b.ready()).toBe(true);
    const t = 'p/after-garbage';
    a.getHoldOff(t);
    await a.firstRead(t);
    for (const junk of ['not json', '{"kind":"hold-off"}', 'null']) await admin.publish(`${keyPrefix}:events`, junk);
    const until = Date.now() + 20_000;
    await b.setHoldOff(t, until, Date.now());
    await eventually(() => a.getHoldOff(t) === until, 3_000);
    expect(a.degraded).toBe(false);
  });
});
