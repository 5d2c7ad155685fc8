// Review of the Redis-shared retry budget and circuit breaker (2026-12-07): a fleet of two or three RedisStores on one
// real redis-server, against a Redis that restarts empty, loses its data while up (FLUSHALL), is paused (SIGSTOP), and
// instances whose clocks disagree.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it } from 'vitest';
import { BreakerSchema } from '../src/config/schema.ts';
import { settingsForModel } from '../src/policy/breaker.ts';
import { BreakerBoard } from '../src/state/breaker-board.ts';
import { RedisStore } from '../src/state/redis-store.ts';
import { RetryBudget } from '../src/state/retry-budget.ts';
import { useRedisServerWithAdmin } from './helpers/redis-server.ts';
import { eventually } from './helpers/redis-stores.ts';
import { startTcpProxy } from './helpers/tcp-proxy.ts';

const BUDGET = { ratio: 0.2, windowS: 10, minRetriesPerSecond: 0 };
const KEY = RetryBudget.key('chat', 'online', 'p/m');

const server = useRedisServerWithAdmin();
const stores: RedisStore[] = [];
afterEach(async () => {
  await Promise.all(stores.splice(0).map((s) => s.close()));
});

interface Instance {
  store: RedisStore;
  now: () => number;
}

/**
 * n instances of one fleet (one key prefix); instance i's clock is offsetsMs[i] off the machine's. Their commands
 * time out after 5 s unless a test says otherwise: past a 200 ms timeout, a starved event loop (a loaded 2-core CI
 * machine stalls it for a second) had a call answered from local state (a second probe, a retry the fleet had not
 * granted), or three such calls degrade an instance that then wrote back what it held: not what these tests check.
 */
async function fleet(n: number, o: { offsetsMs?: number[]; commandTimeoutMs?: number; keyPrefix?: string } = {}): Promise<Instance[]> {
  const keyPrefix = o.keyPrefix ?? `rv-${randomUUID()}`;
  const out: Instance[] = [];
  for (let i = 0; i < n; i++) {
    const offset = o.offsetsMs?.[i] ?? 0;
    const now = () => Date.now() + offset;
    const store = new RedisStore({ config: { redis: server.redis().url, commandTimeoutMs: o.commandTimeoutMs ?? 5_000, keyPrefix }, now });
    stores.push(store);
    out.push({ store, now });
  }
  for (const { store } of out) expect(await store.ready()).toBe(true);
  return out;
}

/** Takes retries round-robin over the instances until each in turn is refused; returns how many were granted. */
async function drain(instances: Instance[], max = 200): Promise<number> {
  let granted = 0;
  let refusedInARow = 0;
  for (let i = 0; i < max && refusedInARow < instances.length; i++) {
    const { store, now } = instances[i % instances.length]!;
    if (await store.takeRetry(KEY, BUDGET, now())) {
      granted++;
      refusedInARow = 0;
    } else refusedInARow++;
  }
  return granted;
}

describe('the shared retry budget across three instances', () => {
  it('grants ratio × the fleet\'s requests over the window, whoever counted them and whoever retries', async () => {
    const f = await fleet(3);
    f[0]!.store.addRequests(KEY, 50, f[0]!.now());
    f[1]!.store.addRequests(KEY, 30, f[1]!.now());
    f[2]!.store.addRequests(KEY, 20, f[2]!.now());
    await sleep(150);
    expect(await drain(f)).toBe(20);
  });

  it('never grants more than the fleet\'s allowance after Redis restarts empty mid-window: the counts restart together', async () => {
    const f = await fleet(3);
    for (const x of f) x.store.addRequests(KEY, 50, x.now());
    await sleep(150);
    expect(await drain(f)).toBe(30);
    await server.redis().restart();
    await eventually(() => f.every((x) => !x.store.degraded), 10_000);
    // The 150 requests and 30 retries are gone together: the window restarts from what is counted from here.
    expect(await drain(f)).toBe(0);
    for (const x of f) x.store.addRequests(KEY, 10, x.now());
    await sleep(150);
    expect(await drain(f)).toBe(6);
  }, 30_000);
});

describe('a breaker record Redis lost, and an instance that never saw it', () => {
  const s = settingsForModel(BreakerSchema.parse({ openS: 30, halfOpenProbes: 1, closeAfter: 1 }), undefined);

  it('an old instance takes the open a newcomer wrote at a lower generation, rather than ignore it as a late message', async () => {
    const keyPrefix = `rv-${randomUUID()}`;
    const [a] = await fleet(1, { keyPrefix });
    let now = Date.now();
    const boardA = new BreakerBoard({ store: a!.store, now: () => now, random: () => 0 });
    // A's target has a history: opened and closed twice (generation 4 in A's view).
    for (let round = 0; round < 2; round++) {
      for (let i = 0; i < 5; i++) await boardA.record('p/m', s, 'failure', 10, undefined);
      now += 31_000;
      const probe = await boardA.admit('p/m', s, false, 5_000);
      expect(probe.admitted).toBe(true);
      await boardA.record('p/m', s, 'success', 10, probe.admitted ? probe.probe : undefined);
    }
    expect(a!.store.getBreaker('p/m')).toMatchObject({ state: 'closed', generation: 4 });
    // Redis loses the record while it stays up (FLUSHALL, eviction under volatile-lru, or 7 days without a change).
    await server.admin().flushall();
    // A newcomer (autoscaled after the loss) starts from generation 0 and sees the provider fail first.
    const [c] = await fleet(1, { keyPrefix });
    await c!.store.firstRead('p/m');
    const boardC = new BreakerBoard({ store: c!.store, now: () => now, random: () => 0 });
    for (let i = 0; i < 5; i++) await boardC.record('p/m', s, 'failure', 10, undefined);
    expect(c!.store.getBreaker('p/m')).toMatchObject({ state: 'open', generation: 1 });
    // The fleet's breaker is open: A must hold back too, not keep sending into the outage until it trips alone.
    await eventually(() => a!.store.getBreaker('p/m')?.state === 'open', 2_000);
    expect(boardA.availability('p/m', s, false).kind).toBe('open');
  });
});

describe('a paused Redis (SIGSTOP) on the request path', () => {
  it('answers every budget and breaker call within a small bound of commandTimeoutMs, then serves on local state', async () => {
    const f = await fleet(2, { commandTimeoutMs: 100 });
    const [a] = f;
    a!.store.addRequests(KEY, 100, a!.now());
    await sleep(150);
    const resume = server.redis().freeze();
    try {
      const times: number[] = [];
      for (let i = 0; i < 6; i++) {
        const start = performance.now();
        await a!.store.takeRetry(KEY, BUDGET, a!.now());
        await a!.store.takePermit('p/slow', 1, 5_000, a!.now());
        await a!.store.casBreaker('p/slow', 0, { state: 'open', sinceMs: a!.now(), openUntilMs: a!.now() + 30_000, probeSuccesses: 0, generation: i + 1 });
        times.push(performance.now() - start);
      }
      // Three calls in a row, each bounded by commandTimeoutMs (100 ms), and generous slack for a loaded machine.
      expect(Math.max(...times)).toBeLessThan(1_500);
      expect(a!.store.degraded).toBe(true);
      // Degraded: no Redis wait at all. A Redis wait would make every call take commandTimeoutMs (100 ms); a loaded
      // machine's pause (GC, scheduling) delays one call, not five, so the fastest of five is held under that.
      const degradedTimes: number[] = [];
      for (let i = 0; i < 5; i++) {
        const start = performance.now();
        await a!.store.takeRetry(KEY, BUDGET, a!.now());
        degradedTimes.push(performance.now() - start);
      }
      expect(Math.min(...degradedTimes)).toBeLessThan(50);
    } finally {
      resume();
    }
    await eventually(() => !a!.store.degraded, 10_000);
  }, 30_000);
});

describe('instances whose clocks disagree by seconds', () => {
  it('share one budget window when one is 7 s ahead and one 7 s behind', async () => {
    const f = await fleet(3, { offsetsMs: [7_000, -7_000, 0] });
    for (const x of f) x.store.addRequests(KEY, 50, x.now());
    await sleep(150);
    expect(await drain(f)).toBe(30);
  });
});

describe('a breaker held open by three instances, across a Redis restart', () => {
  const s = settingsForModel(BreakerSchema.parse({ openS: 2, halfOpenProbes: 2, closeAfter: 2 }), undefined);

  it('is written back by the instances when Redis returns empty, then lets one probe, then halfOpenProbes, out fleet-wide', async () => {
    const f = await fleet(3);
    const boards = f.map((x) => new BreakerBoard({ store: x.store, now: x.now, random: () => 0 }));
    for (const x of f) await x.store.firstRead('p/r');
    for (let i = 0; i < 5; i++) await boards[0]!.record('p/r', s, 'failure', 10, undefined);
    await eventually(() => f.every((x) => x.store.getBreaker('p/r')?.state === 'open'), 2_000);
    const opened = f[0]!.store.getBreaker('p/r')!;

    await server.redis().restart();
    await eventually(() => f.every((x) => !x.store.degraded), 10_000);
    // Redis came back empty; the instances still held the record, and one of them wrote it back.
    await eventually(async () => (await server.admin().keys('*{p/r}:breaker')).length === 1, 3_000);
    const key = (await server.admin().keys('*{p/r}:breaker'))[0]!;
    expect(await server.admin().hget(key, 'state')).toBe('open');
    expect(Number(await server.admin().hget(key, 'generation'))).toBe(opened.generation);
    for (const x of f) expect(x.store.getBreaker('p/r')).toMatchObject({ state: 'open', generation: opened.generation });

    // Past openUntil: every instance asks at once, one probe goes.
    await sleep(Math.max(0, opened.openUntilMs - Date.now()) + 50);
    const first = await Promise.all(boards.flatMap((b) => [b.admit('p/r', s, false, 5_000), b.admit('p/r', s, false, 5_000)]));
    const firstProbes = first.filter((a) => a.admitted);
    expect(firstProbes).toHaveLength(1);
    const winner = first.findIndex((a) => a.admitted) >> 1;
    const probe = firstProbes[0]!;
    await boards[winner]!.record('p/r', s, 'success', 10, probe.admitted ? probe.probe : undefined);
    await eventually(() => f.every((x) => x.store.getBreaker('p/r')?.state === 'half-open'), 2_000);
    // Half-open: halfOpenProbes (2) fleet-wide, however many ask.
    const second = await Promise.all(boards.flatMap((b) => [b.admit('p/r', s, false, 5_000), b.admit('p/r', s, false, 5_000)]));
    expect(second.filter((a) => a.admitted)).toHaveLength(2);
  }, 30_000);
});

describe('the subscriber connection killed (CLIENT KILL TYPE pubsub)', () => {
  it('resubscribes and re-reads, so a breaker opened while it was not subscribed reaches every instance', async () => {
    const f = await fleet(3);
    for (const x of f) await x.store.firstRead('p/sub');
    await server.admin().client('KILL', 'TYPE', 'pubsub');
    // Written at once, before the killed subscribers are back: the message is lost for them.
    expect(await f[0]!.store.casBreaker('p/sub', 0, { state: 'open', sinceMs: Date.now(), openUntilMs: Date.now() + 30_000, probeSuccesses: 0, generation: 1 })).toBe(true);
    await eventually(() => f.every((x) => x.store.getBreaker('p/sub')?.state === 'open'), 5_000);
    // And they hear the next change by message again.
    expect(await f[1]!.store.casBreaker('p/sub', 1, { state: 'closed', sinceMs: Date.now(), openUntilMs: 0, probeSuccesses: 0, generation: 2 })).toBe(true);
    await eventually(() => f.every((x) => x.store.getBreaker('p/sub')?.state === 'closed'), 2_000);
  });
});

describe('an instance whose clock is minutes off, started while Redis does not answer', () => {
  const cfg = { ratio: 0.5, windowS: 2, minRetriesPerSecond: 0 };

  it.each([
    ['10 min ahead', 600_000],
    ['10 min behind', -600_000],
  ])('%s: what it counted before it first read Redis\'s clock lands in the fleet\'s window as of when it happened', async (_name, skewMs) => {
    const keyPrefix = `rv-${randomUUID()}`;
    const [b] = await fleet(1, { keyPrefix });
    const proxy = await startTcpProxy(server.redis().port);
    await proxy.cut();
    try {
      const now = () => Date.now() + skewMs;
      const a = new RedisStore({ config: { redis: `redis://127.0.0.1:${proxy.port}`, commandTimeoutMs: 200, keyPrefix }, now });
      stores.push(a);
      a.startWithoutRedis();
      // Served on local state: 10 requests and a retry (the local budget's), counted to be sent once Redis answers.
      a.addRequests(KEY, 10, now());
      expect(await a.takeRetry(KEY, cfg, now())).toBe(true);
      await proxy.resume();
      await eventually(async () => !a.degraded && (await a.ready(0)), 8_000);
      // They happened a moment ago: the fleet's window has them now...
      await eventually(async () => (await b!.store.budgetWindow(KEY, cfg, b!.now())).requests === 10, 2_000);
      expect(await b!.store.budgetWindow(KEY, cfg, b!.now())).toEqual({ requests: 10, retries: 1 });
      // ...and, windowS later, no more: stamped in the skewed clock, they stayed in every window for 10 minutes
      // (ahead: 10 requests paying for retries that no request asked for), or never counted at all (behind).
      await sleep(cfg.windowS * 1000 + 1_100);
      expect(await b!.store.budgetWindow(KEY, cfg, b!.now())).toEqual({ requests: 0, retries: 0 });
    } finally {
      await proxy.close();
    }
  }, 30_000);
});
