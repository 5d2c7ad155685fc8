// Three gateway instances on one real redis-server, with the network between ONE of them and Redis going bad while the
// other two keep it (a partial partition, a black hole, a slow link), and Redis itself losing the fleet's keys (memory
// pressure, FLUSHALL). Seen from the official `openai` SDK and counted at the bundled mock: every request is answered
// within its deadline, the isolated instance says it is degraded, the others keep sharing, amplification stays bounded,
// and nothing the README promises runs once runs twice.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type { FastifyInstance } from 'fastify';
import { Redis } from 'ioredis';
import OpenAI from 'openai';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { buildServer } from '../src/server.ts';
import { createLogger } from '../src/observability/logger.ts';
import { createMetrics } from '../src/observability/metrics.ts';
import { startMock, type FaultSpec, type MockServer } from '../src/mock/server.ts';
import { defaultConfig, TEST_KEY, testLogSink } from './helpers/stack.ts';
import { startRedis, type RedisHandle } from './helpers/redis-server.ts';
import { startTcpProxy, type TcpProxy } from './helpers/tcp-proxy.ts';
import { startFaultProxy, type FaultProxy } from './helpers/fault-proxy.ts';
import { evictingPolicy } from '../src/state/redis-memory-policy.ts';

let redis: RedisHandle;
let admin: Redis;
beforeAll(async () => {
  redis = await startRedis();
  admin = new Redis(redis.url);
  admin.on('error', () => undefined); // while the test restarts Redis
});
afterAll(async () => {
  admin?.disconnect();
  await redis?.stop();
});

interface Fleet {
  mock: MockServer;
  /** A, B, C: A reaches Redis through the test's proxy (when one is given), B and C directly. */
  urls: string[];
  /** Log lines of each instance, by index. */
  logs: string[][];
  keyPrefix: string;
}

const started: FastifyInstance[] = [];
const mocks: MockServer[] = [];
const proxies: Array<TcpProxy | FaultProxy> = [];
afterEach(async () => {
  await Promise.all(started.splice(0).map((g) => g.close()));
  await Promise.all(mocks.splice(0).map((m) => m.close()));
  await Promise.all(proxies.splice(0).map((p) => p.close()));
  await admin.config('SET', 'maxmemory', '0');
  await admin.config('SET', 'maxmemory-policy', 'noeviction');
  await admin.flushall(); // the memory tests' filler
});

type Overrides = Pick<Parameters<typeof defaultConfig>[1] & object, 'route' | 'provider'> & { state?: Partial<NonNullable<ConfigInput['state']>>; idempotency?: ConfigInput['idempotency'] };

async function startFleet(faults: FaultSpec, overrides: Overrides, proxyPort?: number): Promise<Fleet> {
  const mock = await startMock({ faults, quiet: true, apiKey: TEST_KEY });
  mocks.push(mock);
  const keyPrefix = `part-${randomUUID()}`;
  const urls: string[] = [];
  const logs: string[][] = [];
  for (let i = 0; i < 3; i++) {
    const redisUrl = i === 0 && proxyPort !== undefined ? `redis://127.0.0.1:${proxyPort}` : redis.url;
    const input: ConfigInput = {
      ...defaultConfig(mock.url, overrides),
      state: { redis: redisUrl, keyPrefix, ...overrides.state },
      ...(overrides.idempotency && { idempotency: overrides.idempotency }),
    };
    const config = ConfigSchema.parse(input);
    const lines: string[] = [];
    const g = await buildServer(config, { logger: createLogger(config, testLogSink(lines)), metrics: createMetrics({ defaultMetrics: false }) });
    started.push(g);
    urls.push(await g.listen({ host: '127.0.0.1', port: 0 }));
    logs.push(lines);
  }
  return { mock, urls, logs, keyPrefix };
}

/** An `openai` SDK client of one instance: no SDK retries, so what the test counts is the gateway's own. */
function sdk(url: string, opts: { timeout?: number } = {}): OpenAI {
  return new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0, timeout: opts.timeout ?? 10_000 });
}

interface Seen {
  status: number;
  code?: string;
  shouldRetry?: string | null;
  retryAfter?: string | null;
  ms: number;
}

/** One chat completion through the SDK; what the client saw, and how long it took. */
async function ask(url: string, headers: Record<string, string> = {}, timeout?: number, model = 'gpt-4o'): Promise<Seen> {
  const started = performance.now();
  try {
    const { response } = await sdk(url, { timeout })
      .chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }] }, { headers })
      .withResponse();
    return { status: response.status, ms: performance.now() - started };
  } catch (err) {
    if (err instanceof OpenAI.APIError && err.status !== undefined) {
      return { status: err.status, code: err.code ?? undefined, shouldRetry: err.headers?.get('x-should-retry'), retryAfter: err.headers?.get('retry-after'), ms: performance.now() - started };
    }
    throw err;
  }
}

async function metricValue(url: string, name: string): Promise<number | undefined> {
  const line = (await (await fetch(`${url}/metrics`)).text()).split('\n').find((l) => l.startsWith(name));
  return line === undefined ? undefined : Number(line.split(' ').at(-1));
}

async function eventually(check: () => Promise<boolean> | boolean, timeoutMs = 5_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > end) throw new Error('condition not met in time');
    await sleep(20);
  }
}

const msgs = (lines: string[]) => lines.map((l) => (JSON.parse(l) as { msg: string }).msg);

/** Sums a budget hash's per-second fields of one kind (`r`: requests, `x`: retries), every budget of the fleet's prefix. */
async function budgetCounts(keyPrefix: string): Promise<{ requests: number; retries: number }> {
  let requests = 0;
  let retries = 0;
  for (const key of await admin.keys(`${keyPrefix}:*:budget`)) {
    for (const [field, value] of Object.entries(await admin.hgetall(key))) {
      if (field.startsWith('r:')) requests += Number(value);
      if (field.startsWith('x:')) retries += Number(value);
    }
  }
  return { requests, retries };
}

/** The mock's first attempts and retries (x-retry-attempt), from its request log. */
function upstreamCounts(mock: MockServer): { first: number; retries: number } {
  const log = mock.requests();
  const retries = log.filter((r) => r.headers['x-retry-attempt'] !== undefined && r.headers['x-retry-attempt'] !== '0').length;
  return { first: log.length - retries, retries };
}

const breakerGauge = 'stormgate_breaker_state{target="mock/gpt-4o"}';

describe('a partial partition: one instance of three loses Redis while the provider fails', () => {
  it('degrades alone and answers in time, the other two share the breaker, and it rejoins with nothing counted twice or stuck', async () => {
    const proxy = await startTcpProxy(redis.port);
    proxies.push(proxy);
    const f = await startFleet(
      {},
      {
        route: { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } }, park: false, budget: { ratio: 0.1, windowS: 120, minRetriesPerSecond: 0.05 } },
        provider: { breaker: { consecutiveFailures: 5, openS: 2 } },
        state: { commandTimeoutMs: 100 },
      },
      proxy.port,
    );
    const [a, b, c] = f.urls as [string, string, string];
    for (const url of f.urls) expect((await ask(url)).status).toBe(200);

    await proxy.cut();
    await eventually(async () => (await metricValue(a, 'stormgate_state_degraded')) === 1);
    expect(await (await fetch(`${a}/readyz`)).json()).toMatchObject({ status: 'ready (degraded: local state)', degraded: true });
    for (const url of [b, c]) expect(await metricValue(url, 'stormgate_state_degraded')).toBe(0);

    f.mock.setFaults({ errors: [{ status: 503, rate: 1 }] });
    // Past the 250 ms after the last success within which a run of 5 failures is taken for bad luck.
    await sleep(400);
    // B's failures open the breaker for B and C; C sends nothing upstream.
    for (let i = 0; i < 5; i++) expect((await ask(b)).status).toBe(503);
    await eventually(async () => (await metricValue(c, breakerGauge)) === 1);
    const beforeC = f.mock.stats().total;
    const onC = await ask(c);
    expect(onC).toMatchObject({ status: 503, code: 'circuit_open' });
    expect(Number(onC.retryAfter)).toBeGreaterThan(0);
    expect(f.mock.stats().total).toBe(beforeC);

    // A knows none of it: it decides on its own, in time, and its own breaker opens after its own failures.
    const beforeA = f.mock.stats().total;
    const onA: Seen[] = [];
    for (let i = 0; i < 10; i++) onA.push(await ask(a, { 'x-stormgate-timeout-ms': '5000' }));
    expect(onA.every((s) => s.status === 503 && s.ms < 3_000)).toBe(true);
    expect(onA.at(-1)!.code).toBe('circuit_open');
    expect(f.mock.stats().total - beforeA).toBeLessThanOrEqual(10);
    expect(await metricValue(a, breakerGauge)).toBe(1);

    // The partition heals, then the provider: every instance closes its breaker, none is left open alone.
    await proxy.resume();
    await eventually(async () => (await metricValue(a, 'stormgate_state_degraded')) === 0, 10_000);
    f.mock.setFaults({});
    await eventually(async () => {
      const answers = await Promise.all(f.urls.map((u) => ask(u)));
      return answers.every((x) => x.status === 200);
    }, 15_000);
    for (const url of f.urls) await eventually(async () => (await metricValue(url, breakerGauge)) === 0, 2_000);
    expect(await admin.hget(`${f.keyPrefix}:{mock/gpt-4o}:breaker`, 'state')).toBe('closed');

    // Every upstream attempt counted once in the fleet's budget: A's local ones were added, none twice.
    await sleep(200); // the last batch of counts goes within 50 ms
    const counted = await budgetCounts(f.keyPrefix);
    const sent = upstreamCounts(f.mock);
    expect(counted.retries).toBeLessThanOrEqual(sent.retries);
    expect(counted.requests).toBeLessThanOrEqual(sent.first);
    expect(counted.requests).toBeGreaterThanOrEqual(sent.first - 2);
  });
});

describe('a black hole between one instance and Redis (packets dropped, the connection stays open)', () => {
  it('answers every request within its deadline with bounded added latency, keyed ones included, and returns once packets pass', async () => {
    const proxy = await startTcpProxy(redis.port);
    proxies.push(proxy);
    const f = await startFleet(
      { errors: [{ status: 503, rate: 0.5 }] },
      {
        route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } }, park: false, budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 100 } },
        provider: { breaker: false },
        state: { commandTimeoutMs: 50 },
      },
      proxy.port,
    );
    const a = f.urls[0]!;
    expect((await ask(a)).status).toBe(200);
    const base: Seen[] = [];
    for (let i = 0; i < 10; i++) base.push(await ask(a));
    proxy.swallow(true);
    const seen: Seen[] = [];
    const until = Date.now() + 4_000;
    let n = 0;
    while (Date.now() < until) {
      const keyed: Record<string, string> = n++ % 2 === 0 ? { 'Idempotency-Key': randomUUID() } : {};
      seen.push(await ask(a, { 'x-stormgate-timeout-ms': '2000', ...keyed }));
    }
    expect(await metricValue(a, 'stormgate_state_degraded')).toBe(1);
    // Each request waits for Redis at most a few commandTimeoutMs (a claim, a look, a retry from the budget), never
    // for the hung connection itself.
    expect(seen.every((s) => s.status === 200)).toBe(true);
    expect(Math.max(...seen.map((s) => s.ms))).toBeLessThan(1_000);
    proxy.swallow(false);
    await eventually(async () => (await metricValue(a, 'stormgate_state_degraded')) === 0, 10_000);
    expect((await ask(a)).status).toBe(200);
  });
});

describe('a slow link between one instance and Redis (every command 200 ms, commandTimeoutMs 50)', () => {
  it('adds at most a few commandTimeoutMs to its requests, goes degraded once instead of flapping, and returns once it is fast', async () => {
    const proxy = await startFaultProxy(redis.port);
    proxies.push(proxy);
    // One toxics object for every connection, live ones included: the link turns slow under open connections.
    const link = { up: {} as { latencyMs?: number }, down: {} as { latencyMs?: number } };
    proxy.toxics = () => link;
    const f = await startFleet(
      { errors: [{ status: 503, rate: 0.3 }] },
      { route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } }, park: false, budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 100 } }, provider: { breaker: false } },
      proxy.port,
    );
    const a = f.urls[0]!;
    await eventually(async () => (await metricValue(a, 'stormgate_state_degraded')) === 0);
    expect((await ask(a)).status).toBe(200);
    link.up.latencyMs = 100;
    link.down.latencyMs = 100;
    const seen: Seen[] = [];
    const until = Date.now() + 6_000;
    while (Date.now() < until) seen.push(await ask(a, { 'Idempotency-Key': randomUUID() }));
    expect(seen.every((s) => s.status === 200)).toBe(true);
    expect(Math.max(...seen.map((s) => s.ms))).toBeLessThan(1_000);
    const stateLines = () => msgs(f.logs[0]!).filter((m) => m.startsWith('state store'));
    expect(stateLines()).toEqual(['state store degraded: using local state']);
    delete link.up.latencyMs;
    delete link.down.latencyMs;
    await eventually(async () => (await metricValue(a, 'stormgate_state_degraded')) === 0, 10_000);
    expect(stateLines()).toEqual(['state store degraded: using local state', 'state store recovered: using Redis']);
  });
});

/** Opens the breaker of mock/gpt-4o fleet-wide through B, and has A and C look it up (they answer circuit_open). */
async function openBreakerFleetWide(f: Fleet): Promise<void> {
  const [a, b, c] = f.urls as [string, string, string];
  for (let i = 0; i < 5; i++) expect((await ask(b)).status).toBe(503);
  await eventually(async () => (await metricValue(b, breakerGauge)) === 1);
  const before = f.mock.stats().total;
  for (const url of [a, c]) expect((await ask(url)).code).toBe('circuit_open');
  expect(f.mock.stats().total).toBe(before);
}

/** gpt-4o fails (its breaker opens), gpt-4o-mini answers after 1.5 s: a keyed run long enough to lose Redis under. */
const SPLIT_FAULTS: FaultSpec = { latencyMs: 1_500, models: { 'gpt-4o': { errors: [{ status: 503, rate: 1 }], latencyMs: 0 } } };
const mini = (m: MockServer) => m.requests().filter((r) => r.model === 'gpt-4o-mini').length;

describe('Redis restarted empty (no persistence) while a breaker is open fleet-wide and a keyed run is in flight', () => {
  it('keeps the breaker open fleet-wide and runs the keyed call once: a repeat on another instance waits for the run', async () => {
    const f = await startFleet(SPLIT_FAULTS, { route: { retry: { maxAttempts: 1 }, park: false }, provider: { breaker: { openS: 30 } }, state: { commandTimeoutMs: 200 } });
    const [a, b, c] = f.urls as [string, string, string];
    await openBreakerFleetWide(f);
    const key = randomUUID();
    const run = ask(a, { 'Idempotency-Key': key }, undefined, 'gpt-4o-mini');
    await eventually(() => f.mock.stats().inflight === 1);
    await redis.restart();
    for (const url of f.urls) await eventually(async () => (await metricValue(url, 'stormgate_state_degraded')) === 0, 10_000);

    // The breaker record Redis lost is written back by the instances that hold it: still open for the whole fleet.
    await eventually(async () => (await admin.hget(`${f.keyPrefix}:{mock/gpt-4o}:breaker`, 'state')) === 'open');
    const before = f.mock.stats().total;
    for (const url of f.urls) expect((await ask(url)).code).toBe('circuit_open');
    expect(f.mock.stats().total).toBe(before);

    // So is the claim of the run still going on A: B's repeat waits for it and gets its answer.
    const repeat = await ask(b, { 'Idempotency-Key': key }, undefined, 'gpt-4o-mini');
    expect((await run).status).toBe(200);
    expect(repeat.status).toBe(200);
    expect(mini(f.mock)).toBe(1);
    // And one more on C, after the run: the answer kept in Redis.
    expect((await ask(c, { 'Idempotency-Key': key }, undefined, 'gpt-4o-mini')).status).toBe(200);
    expect(mini(f.mock)).toBe(1);
  });
});

describe('FLUSHALL while a breaker is open fleet-wide (Redis stays up, every key gone)', () => {
  it('keeps it open on every instance, lets one probe through fleet-wide when it half-opens, and closes it everywhere', async () => {
    const f = await startFleet(SPLIT_FAULTS, { route: { retry: { maxAttempts: 1 }, park: false }, provider: { breaker: { openS: 1.5 } }, state: { commandTimeoutMs: 200 } });
    await openBreakerFleetWide(f);
    await admin.flushall();
    const before = f.mock.stats().total;
    for (let i = 0; i < 6; i++) expect((await ask(f.urls[i % 3]!)).code).toBe('circuit_open');
    expect(f.mock.stats().total).toBe(before);
    // The provider is back, slowly: the probe is still out while the others ask.
    f.mock.setFaults({ models: { 'gpt-4o': { latencyMs: 600 } } });
    await sleep(1_800);
    const answers = await Promise.all(Array.from({ length: 9 }, (_, i) => ask(f.urls[i % 3]!)));
    expect(f.mock.stats().total - before).toBe(1);
    expect(answers.filter((x) => x.status === 200)).toHaveLength(1);
    await eventually(async () => (await Promise.all(f.urls.map((u) => ask(u)))).every((x) => x.status === 200), 10_000);
    for (const url of f.urls) await eventually(async () => (await metricValue(url, breakerGauge)) === 0, 2_000);
    expect(await admin.hget(`${f.keyPrefix}:{mock/gpt-4o}:breaker`, 'state')).toBe('closed');
  });
});

/**
 * Fills Redis with keys of its own (not the gateway's, with a time to live when given) until `done` says so, or Redis
 * refuses a write.
 */
async function fillRedis(prefix: string, done: () => Promise<boolean>, ttlMs?: number): Promise<'done' | 'oom'> {
  const junk = 'x'.repeat(64 * 1024);
  for (let i = 0; i < 2_000; i++) {
    try {
      if (ttlMs === undefined) await admin.set(`${prefix}:${i}`, junk);
      else await admin.set(`${prefix}:${i}`, junk, 'PX', ttlMs);
    } catch (err) {
      if (String(err).includes('OOM')) return 'oom';
      throw err;
    }
    if (i % 8 === 7 && (await done())) return 'done';
  }
  throw new Error('Redis neither evicted what the test waited for nor refused a write');
}

async function usedMemory(): Promise<number> {
  return Number(/used_memory:(\d+)/.exec(await admin.info('memory'))![1]);
}

describe('Redis out of memory under maxmemory-policy noeviction (writes refused with OOM, reads answered)', () => {
  it('every instance serves on local state in time, says so, keeps retries bounded, and returns once Redis takes writes', async () => {
    const f = await startFleet(
      { errors: [{ status: 503, rate: 1 }] },
      {
        route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } }, park: false, budget: { ratio: 0.1, windowS: 10, minRetriesPerSecond: 0.2 } },
        provider: { breaker: false },
        state: { commandTimeoutMs: 200 },
      },
    );
    for (const url of f.urls) await eventually(async () => (await metricValue(url, 'stormgate_state_degraded')) === 0);
    await admin.config('SET', 'maxmemory-policy', 'noeviction');
    await admin.config('SET', 'maxmemory', String((await usedMemory()) + 256 * 1024));
    expect(await fillRedis(`junk-${f.keyPrefix}`, async () => false)).toBe('oom');
    // Held there: at the limit, a key that expires (the health check's own) lets the odd write through.
    await admin.config('SET', 'maxmemory', '1');
    const seen: Seen[] = [];
    for (let i = 0; i < 30; i++) seen.push(await ask(f.urls[i % 3]!, { 'x-stormgate-timeout-ms': '3000' }));
    expect(seen.every((s) => s.status === 503 && s.ms < 2_000)).toBe(true);
    for (const url of f.urls) expect(await metricValue(url, 'stormgate_state_degraded')).toBe(1);
    // Each instance's own budget: 30 requests, and retries within three instances' floors (2 each per 10 s) plus their ratios.
    const sent = upstreamCounts(f.mock);
    expect(sent.first).toBe(30);
    expect(sent.retries).toBeLessThanOrEqual(3 * (2 + 1));
    await admin.config('SET', 'maxmemory', '0');
    for (const url of f.urls) await eventually(async () => (await metricValue(url, 'stormgate_state_degraded')) === 0, 8_000);
    for (const lines of f.logs) expect(msgs(lines).filter((m) => m.startsWith('state store'))).toEqual(['state store degraded: using local state', 'state store recovered: using Redis']);
  });
});

for (const policy of ['allkeys-lru', 'volatile-lru'] as const) {
  describe(`Redis evicting the gateway's keys mid-incident (maxmemory-policy ${policy})`, () => {
    it('warns at start, keeps the open breaker on every instance with nothing sent upstream, and answers in time', async () => {
      // A Redis shared with a cache (keys with a time to live, as volatile-lru needs them to evict something else).
      await admin.config('SET', 'maxmemory-policy', policy);
      await admin.config('SET', 'maxmemory-samples', '10');
      await admin.config('SET', 'maxmemory', String((await usedMemory()) + 2 * 1024 * 1024));
      const f = await startFleet(SPLIT_FAULTS, {
        route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } }, park: false, budget: { ratio: 0.1, windowS: 10, minRetriesPerSecond: 0.2 } },
        provider: { breaker: { openS: 30 } },
        state: { commandTimeoutMs: 200 },
      });
      for (const lines of f.logs) {
        await eventually(() => lines.some((l) => l.includes('maxmemory-policy is not noeviction')), 2_000);
        expect(lines.filter((l) => l.includes('maxmemory-policy is not noeviction')).map((l) => JSON.parse(l) as { level: number; maxmemoryPolicy: string })).toEqual([
          expect.objectContaining({ level: 40, maxmemoryPolicy: policy }),
        ]);
      }
      const [a, b] = f.urls as [string, string];
      await openBreakerFleetWide(f);
      const key = randomUUID();
      const run = ask(a, { 'Idempotency-Key': key }, undefined, 'gpt-4o-mini');
      await eventually(() => f.mock.stats().inflight === 1);
      const before = f.mock.stats().total;
      // Everything the gateway wrote is older than the cache's keys: the least recently used, and evicted first.
      const gatewayKeys = async () => (await admin.keys(`${f.keyPrefix}:*`)).length;
      expect(await gatewayKeys()).toBeGreaterThanOrEqual(3); // the breaker, the budget, the claim
      expect(await fillRedis(`junk-${f.keyPrefix}`, async () => (await gatewayKeys()) === 0, 600_000)).toBe('done');
      // The breaker lives on in every instance's view: still open, nothing goes upstream, and the answers come at once.
      const seen: Seen[] = [];
      for (let i = 0; i < 9; i++) seen.push(await ask(f.urls[i % 3]!));
      expect(seen.every((x) => x.code === 'circuit_open' && x.ms < 1_000)).toBe(true);
      expect(f.mock.stats().total).toBe(before);
      // The keyed run's claim went with the rest: as the README says, a repeat on another instance runs it again, once.
      const repeat = await ask(b, { 'Idempotency-Key': key }, undefined, 'gpt-4o-mini');
      expect((await run).status).toBe(200);
      expect(repeat.status).toBe(200);
      expect(mini(f.mock)).toBeLessThanOrEqual(2);
    });
  });
}

describe('reading the eviction policy from INFO memory', () => {
  it('names an evicting policy only when maxmemory is set and the policy is not noeviction', () => {
    const info = (max: number, policy: string) => `# Memory\r\nused_memory:1000\r\nmaxmemory:${max}\r\nmaxmemory_human:x\r\nmaxmemory_policy:${policy}\r\n`;
    expect(evictingPolicy(info(1_000_000, 'volatile-lru'))).toBe('volatile-lru');
    expect(evictingPolicy(info(1_000_000, 'allkeys-lfu'))).toBe('allkeys-lfu');
    expect(evictingPolicy(info(1_000_000, 'noeviction'))).toBeUndefined();
    expect(evictingPolicy(info(0, 'allkeys-lru'))).toBeUndefined();
    expect(evictingPolicy('')).toBeUndefined();
  });
});
