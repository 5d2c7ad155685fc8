// A fleet whose instances' wall clocks disagree (NTP skew of seconds, a VM resumed from suspend minutes behind or
// ahead) shares one Redis: what one instance writes must mean the same to the others. Two RedisStores on one real
// redis-server, one of them on a skewed clock (injected, as libfaketime would skew a process), checked both ways.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it } from 'vitest';
import { BreakerSchema } from '../src/config/schema.ts';
import { settingsForModel } from '../src/policy/breaker.ts';
import { BreakerBoard } from '../src/state/breaker-board.ts';
import { FleetClock, redisTimeMs } from '../src/state/fleet-clock.ts';
import { RedisStore } from '../src/state/redis-store.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { useStacks, type Stack } from './helpers/stack.ts';

const redis = useRedisServer();
const startStack = useStacks();
const stores: RedisStore[] = [];
afterEach(async () => {
  await Promise.all(stores.splice(0).map((s) => s.close()));
});

interface Instance {
  store: RedisStore;
  now: () => number;
}

/** Two instances of one fleet: `a` on a clock skewMs off, `b` on the machine's. */
async function skewedFleet(skewMs: number): Promise<{ a: Instance; b: Instance }> {
  const keyPrefix = `skew-${randomUUID()}`;
  const make = (offsetMs: number): Instance => {
    const now = () => Date.now() + offsetMs;
    const store = new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 500, keyPrefix }, now });
    stores.push(store);
    return { store, now };
  };
  const a = make(skewMs);
  const b = make(0);
  expect(await a.store.ready()).toBe(true);
  expect(await b.store.ready()).toBe(true);
  return { a, b };
}

const SKEWS = [
  ['2 s ahead', 2_000],
  ['2 s behind', -2_000],
  ['30 s ahead', 30_000],
  ['30 s behind', -30_000],
  ['10 min ahead', 600_000],
  ['10 min behind', -600_000],
] as const;

describe.each(SKEWS)('one instance %s of the fleet', (_name, skewMs) => {
  it('keeps the retry budget fleet-wide: no instance wipes the counts of the others or gets a budget of its own', async () => {
    const { a, b } = await skewedFleet(skewMs);
    const cfg = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 0 };
    a.store.addRequests('chat/online/p/m', 100, a.now());
    b.store.addRequests('chat/online/p/m', 100, b.now());
    await sleep(150); // batched counts go out at most 50 ms apart
    let granted = 0;
    for (let i = 0; i < 20; i++) {
      if (await b.store.takeRetry('chat/online/p/m', cfg, b.now())) granted++;
      if (await a.store.takeRetry('chat/online/p/m', cfg, a.now())) granted++;
    }
    // 200 requests in the window: 20 retries, for the fleet as a whole.
    expect(granted).toBe(20);
    expect(await b.store.budgetWindow('chat/online/p/m', cfg, b.now())).toEqual({ requests: 200, retries: 20 });
    expect(await a.store.budgetWindow('chat/online/p/m', cfg, a.now())).toEqual({ requests: 200, retries: 20 });
  });

  it("sums every instance's outcomes in the breaker's window: none wipes the others' counts", async () => {
    const { a, b } = await skewedFleet(skewMs);
    await a.store.addOutcomes('p/m', 0, { requests: 15, failures: 15 }, a.now(), 10);
    await b.store.addOutcomes('p/m', 0, { requests: 15, failures: 15 }, b.now(), 10);
    expect(await a.store.addOutcomes('p/m', 0, { requests: 0, failures: 0 }, a.now(), 10)).toEqual({ requests: 30, failures: 30 });
    expect(await b.store.addOutcomes('p/m', 0, { requests: 0, failures: 0 }, b.now(), 10)).toEqual({ requests: 30, failures: 30 });
  });

  it('keeps a hold-off as long on every instance as the provider asked, whichever instance started it', async () => {
    const { a, b } = await skewedFleet(skewMs);
    for (const [from, to, target] of [[a, b, 'p/ab'], [b, a, 'p/ba']] as const) {
      expect(to.store.getHoldOff(target)).toBeUndefined();
      await to.store.firstRead(target);
      await from.store.setHoldOff(target, from.now() + 5_000);
      await expectWithin(() => to.store.getHoldOff(target) !== undefined, 2_000);
      const leftMs = to.store.getHoldOff(target)! - to.now();
      // A little off is fine (the clocks are compared through Redis, to within a round trip); seconds off is not.
      expect(leftMs).toBeGreaterThan(3_500);
      expect(leftMs).toBeLessThanOrEqual(5_500);
    }
  });

  it('keeps a breaker open for openS on every instance, whichever opened it', async () => {
    const { a, b } = await skewedFleet(skewMs);
    const s = settingsForModel(BreakerSchema.parse({ openS: 30 }), undefined);
    const boards = [a, b].map((i) => new BreakerBoard({ store: i.store, now: i.now, random: () => 0 }));
    try {
      for (const [opener, other, target] of [[0, 1, 'p/ab'], [1, 0, 'p/ba']] as const) {
        const watcher = [a, b][other]!;
        watcher.store.getBreaker(target);
        await watcher.store.firstRead(target);
        for (let i = 0; i < 5; i++) await boards[opener]!.record(target, s, 'failure', 10, undefined);
        await expectWithin(() => watcher.store.getBreaker(target)?.state === 'open', 2_000);
        const seen = boards[other]!.availability(target, s, false);
        expect(seen.kind).toBe('open');
        const leftMs = (seen.kind === 'open' ? seen.probeAtMs : 0) - watcher.now();
        expect(leftMs).toBeGreaterThan(28_500);
        expect(leftMs).toBeLessThanOrEqual(30_500);
      }
    } finally {
      boards.forEach((board) => board.close());
    }
  });

  it('gives out one probe permit at a time fleet-wide, whichever instance asks first', async () => {
    const { a, b } = await skewedFleet(skewMs);
    for (const [first, second, target] of [[a, b, 'p/ab'], [b, a, 'p/ba']] as const) {
      expect(await first.store.takePermit(target, 1, 5_000, first.now())).toEqual(expect.any(String));
      expect(await second.store.takePermit(target, 1, 5_000, second.now())).toBeNull();
    }
  });

  it('counts every instance in the pool shares, and each one once', async () => {
    const { a, b } = await skewedFleet(skewMs);
    await b.store.exchangeDemand('p', [6], b.now());
    for (let round = 0; round < 3; round++) {
      await sleep(100);
      expect(await a.store.exchangeDemand('p', [4], a.now())).toEqual({ totals: [10], instances: 2 });
      await sleep(100);
      expect(await b.store.exchangeDemand('p', [6], b.now())).toEqual({ totals: [10], instances: 2 });
    }
  });

  it('lets an idempotency key run once while its claim holds, and gives it back when the claim lapses', async () => {
    const { a, b } = await skewedFleet(skewMs);
    const claim = (i: Instance, owner: string) => i.store.claimKey('k', { state: 'running', fingerprint: 'f', sinceMs: i.now(), owner }, 1_000);
    expect(await claim(a, 'a1')).toBeUndefined();
    expect(await claim(b, 'b1')).toMatchObject({ state: 'running', fingerprint: 'f' });
    await sleep(1_200);
    expect(await claim(b, 'b2')).toBeUndefined();
    expect(await claim(a, 'a2')).toMatchObject({ state: 'running' });
  });
});

describe('an instance whose clock is stepped while it runs (a VM resumed, NTP stepping it back)', () => {
  it.each([['ahead', 30_000], ['back', -600_000]] as const)('reads the fleet right again within a clock reading: stepped %s', async (_name, stepMs) => {
    const keyPrefix = `step-${randomUUID()}`;
    let offsetMs = 0;
    const now = () => Date.now() + offsetMs;
    const a = new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 500, keyPrefix }, now, clockReadMs: 200 });
    const b = new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 500, keyPrefix } });
    stores.push(a, b);
    expect(await a.ready()).toBe(true);
    expect(await b.ready()).toBe(true);
    a.getHoldOff('p/m');
    await a.firstRead('p/m');
    await b.setHoldOff('p/m', Date.now() + 20_000);
    await expectWithin(() => a.getHoldOff('p/m') !== undefined, 2_000);
    offsetMs = stepMs;
    // Its view moves with its clock, and it writes nothing of the step back: the fleet's hold-off keeps its end.
    await expectWithin(() => Math.abs(a.getHoldOff('p/m')! - now() - (b.getHoldOff('p/m')! - Date.now())) < 500, 3_000);
    await sleep(500);
    expect(b.getHoldOff('p/m')! - Date.now()).toBeLessThanOrEqual(20_000);
    expect(a.getHoldOff('p/m')! - now()).toBeLessThanOrEqual(20_500);
  });
});

describe('a clock step on an instance serving requests', () => {
  /** The adaptive limit of the stack's one target, as the gateway reports it. */
  async function limitOf(s: Stack): Promise<number> {
    const text = await (await fetch(`${s.url}/metrics`)).text();
    return Number(text.split('\n').find((l) => l.startsWith('stormgate_pool_limit{target="mock/gpt-4o"}'))?.split(' ')[1]);
  }

  // The view moves its times with the clock and announces them again; a hold-off over long ago announced again was
  // taken for one that had just ended, and the target's limit restarted at half once more (32 -> 16) for nothing.
  it('leaves the adaptive limit of a target whose hold-off ended before the step as it was', async () => {
    let offsetMs = 0;
    const now = () => Date.now() + offsetMs;
    const store = new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 500, keyPrefix: `step-limit-${randomUUID()}` }, now, clockReadMs: 200 });
    stores.push(store);
    expect(await store.ready()).toBe(true);
    const s = await startStack({
      faults: { errors: [{ status: 429, rate: 1, times: 1, headers: { 'retry-after': '1' } }] },
      route: { retry: { maxAttempts: 1 }, park: false },
      provider: { breaker: false },
      deps: { store, now },
    });
    const res = await fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }) });
    expect(res.status).toBe(429);
    // The hold-off (1 s, spread up to 1.2 s) ends, and the limit restarts at half, once.
    await expectWithin(() => store.getHoldOff('mock/gpt-4o')! < now() - 300, 3_000);
    await sleep(200);
    const limit = await limitOf(s);
    expect(limit).toBeLessThan(64);
    offsetMs = 30_000;
    // Read again within 200 ms: the view moves 30 s ahead with the clock.
    await expectWithin(() => store.getHoldOff('mock/gpt-4o')! > now() - 10_000, 3_000);
    await sleep(300);
    expect(await limitOf(s)).toBe(limit);
  });
});

describe('FleetClock', () => {
  it('leaves times as they are for a clock within half a second of Redis, to the millisecond', () => {
    const clock = new FleetClock();
    expect(clock.observe(1_000, 1_400, 1_010)).toBe(false);
    expect(clock.toFleet(123_456)).toBe(123_456);
    expect(clock.toLocal(123_456)).toBe(123_456);
  });

  it("translates both ways for a clock off Redis's, keeps 0 (not set) as 0, and follows a clock that was stepped", () => {
    const clock = new FleetClock();
    expect(clock.observe(630_000, 30_005, 630_010)).toBe(true);
    expect(clock.skewMs).toBe(600_000);
    expect(clock.toFleet(700_000)).toBe(100_000);
    expect(clock.toLocal(100_000)).toBe(700_000);
    expect(clock.toFleet(0)).toBe(0);
    // A reading a little different keeps the skew in use, so records read back compare equal.
    expect(clock.observe(640_000, 40_200, 640_010)).toBe(false);
    // NTP stepped the clock back: the skew follows.
    expect(clock.observe(50_000, 50_002, 50_004)).toBe(true);
    expect(clock.skewMs).toBe(0);
  });

  // A clock about half a second off reads a little under or over it, reading after reading (half the round trip is
  // noise): judged by the rounded skew, 0 then 501 then 0, each flip moved the view and re-read every target watched.
  it('keeps its skew for a clock that moves less than the tolerance about the tolerance itself', () => {
    const clock = new FleetClock();
    expect(clock.observe(10_000, 9_499, 10_000)).toBe(true);
    expect(clock.skewMs).toBe(501);
    for (const offMs of [499, 501, 480, 520, 499]) expect(clock.observe(20_000, 20_000 - offMs, 20_000)).toBe(false);
    expect(clock.skewMs).toBe(501);
  });

  it('does not use a reading whose round trip was too slow to tell skew from delay', () => {
    const clock = new FleetClock();
    expect(clock.observe(0, 30_000, 5_000)).toBe(false);
    expect(clock.skewMs).toBe(0);
  });

  it("reads Redis's time from INFO server", () => {
    expect(redisTimeMs('# Server\r\nredis_version:7.0.15\r\nserver_time_usec:1796184981764084\r\nuptime_in_seconds:0\r\n')).toBe(1796184981764.084);
    expect(redisTimeMs('# Server\r\nredis_version:5.0.0\r\n')).toBeUndefined();
  });
});

async function expectWithin(check: () => boolean, withinMs: number): Promise<void> {
  const start = Date.now();
  while (!check()) {
    if (Date.now() - start > withinMs) throw new Error(`condition not met within ${withinMs} ms`);
    await sleep(5);
  }
}
