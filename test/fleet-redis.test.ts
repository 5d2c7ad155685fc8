// Three gateway instances sharing one real redis-server: breakers, budgets and probe limits hold fleet-wide, and the
// fleet keeps answering when Redis goes away, then shares state again when it is back.
import { setTimeout as sleep } from 'node:timers/promises';
import type { FastifyInstance } from 'fastify';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { buildServer } from '../src/server.ts';
import { createLogger } from '../src/observability/logger.ts';
import { createMetrics } from '../src/observability/metrics.ts';
import { startMock, type FaultSpec, type MockServer } from '../src/mock/server.ts';
import { defaultConfig, TEST_KEY, testLogSink } from './helpers/stack.ts';
import { startRedis, type RedisHandle } from './helpers/redis-server.ts';

let redis: RedisHandle;
beforeAll(async () => {
  redis = await startRedis();
});
afterAll(async () => {
  await redis.stop();
});

interface Fleet {
  mock: MockServer;
  urls: string[];
  logs: string[];
  gateways: FastifyInstance[];
}

let fleet: Fleet | undefined;
afterEach(async () => {
  if (!fleet) return;
  await Promise.all(fleet.gateways.map((g) => g.close()));
  await fleet.mock.close();
  fleet = undefined;
});

let prefixCounter = 0;

async function startFleet(faults: FaultSpec, overrides: Pick<Parameters<typeof defaultConfig>[1] & object, 'route' | 'provider'>): Promise<Fleet> {
  const mock = await startMock({ faults, quiet: true, apiKey: TEST_KEY });
  // Each test gets its own key prefix, so state from one test never leaks into the next.
  const keyPrefix = `fleet${process.pid}-${prefixCounter++}`;
  // A generous command timeout: a slow command on a busy machine must not put an instance on local state mid-test.
  const input: ConfigInput = { ...defaultConfig(mock.url, overrides), state: { redis: redis.url, keyPrefix, commandTimeoutMs: 1000 } };
  const config = ConfigSchema.parse(input);
  const logs: string[] = [];
  const gateways: FastifyInstance[] = [];
  const urls: string[] = [];
  for (let i = 0; i < 3; i++) {
    const sink = testLogSink(logs);
    const g = await buildServer(config, { logger: createLogger(config, sink), metrics: createMetrics({ defaultMetrics: false }) });
    gateways.push(g);
    urls.push(await g.listen({ host: '127.0.0.1', port: 0 }));
  }
  fleet = { mock, urls, logs, gateways };
  return fleet;
}

async function chat(url: string, headers: Record<string, string> = {}, model = 'gpt-4o') {
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }] }),
  });
  return { status: res.status, body: (await res.json()) as { error?: { code: string } } };
}

async function metricValue(url: string, name: string): Promise<number | undefined> {
  const line = (await (await fetch(`${url}/metrics`)).text()).split('\n').find((l) => l.startsWith(name));
  return line === undefined ? undefined : Number(line.split(' ').at(-1));
}

async function eventually(check: () => Promise<boolean> | boolean, timeoutMs = 3_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > end) throw new Error('condition not met in time');
    await sleep(20);
  }
}

describe('a fleet of three gateways on one Redis', () => {
  it('opens the breaker on B and C from failures seen through A, with no upstream request from them', async () => {
    const f = await startFleet({ errors: [{ status: 503, rate: 1 }] }, { route: { retry: { maxAttempts: 1 }, park: false } });
    for (let i = 0; i < 5; i++) expect((await chat(f.urls[0]!)).status).toBe(503);
    const before = f.mock.stats().total;
    // In Redis once A's view has it (A takes its own write after Redis answered). B and C keep nothing of a target
    // they never looked up: they read the fleet's record at their first request to it, before anything goes upstream.
    await eventually(async () => (await metricValue(f.urls[0]!, 'stormgate_breaker_state{target="mock/gpt-4o"}')) === 1);
    expect((await chat(f.urls[1]!)).body.error?.code).toBe('circuit_open');
    expect((await chat(f.urls[2]!)).body.error?.code).toBe('circuit_open');
    expect(f.mock.stats().total).toBe(before);
    for (const url of [f.urls[1]!, f.urls[2]!]) expect(await metricValue(url, 'stormgate_breaker_state{target="mock/gpt-4o"}')).toBe(1);
    // The transition is logged once, by the instance that made it.
    expect(f.logs.filter((l) => l.includes('"msg":"breaker open"'))).toHaveLength(1);
  });

  it('keeps nothing on B and C of model names A learned and the provider then refused (404), however many', async () => {
    // Each name fails twice (its breaker opens, pushed to the fleet), then its probe finds no such model: A gives its
    // place back. B and C never served these names; the fleet's changes must not leave a series or a record each there.
    const names = Array.from({ length: 8 }, (_, i) => `made-up-${i}`);
    const models = Object.fromEntries(names.map((n) => [n, { errors: [{ status: 503, times: 2 }, { status: 404, code: 'model_not_found' }] }]));
    const f = await startFleet({ models }, { route: { retry: { maxAttempts: 1 }, park: false }, provider: { breaker: { consecutiveFailures: 2, openS: 0.1 } } });
    for (const name of names) {
      for (let i = 0; i < 2; i++) expect((await chat(f.urls[0]!, {}, name)).status).toBe(503);
      await eventually(async () => (await chat(f.urls[0]!, {}, name)).status === 404);
    }
    // Time for the fleet's messages to arrive (they do within milliseconds), so the check below could see them.
    await sleep(500);
    for (const url of f.urls.slice(1)) expect(await (await fetch(`${url}/metrics`)).text()).not.toContain('made-up-');
  });

  it('keeps the fleet\'s total retries within the shared budget', async () => {
    const f = await startFleet(
      { errors: [{ status: 503, rate: 1 }] },
      {
        route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } }, park: false, budget: { ratio: 0.1, windowS: 10, minRetriesPerSecond: 0.1 } },
        provider: { breaker: false },
      },
    );
    for (let i = 0; i < 60; i++) expect((await chat(f.urls[i % 3]!)).status).toBe(503);
    const retries = f.mock.stats().total - 60;
    expect(retries).toBeGreaterThanOrEqual(1);
    expect(retries).toBeLessThanOrEqual(6);
  });

  it('lets a single probe through, fleet-wide, when the breaker first half-opens', async () => {
    const f = await startFleet({ errors: [{ status: 503, rate: 1 }] }, { route: { retry: { maxAttempts: 1 }, park: false }, provider: { breaker: { openS: 1 } } });
    for (let i = 0; i < 5; i++) await chat(f.urls[0]!);
    await sleep(1_300);
    f.mock.setFaults({ latencyMs: 600 });
    f.mock.reset();
    const results = await Promise.all(Array.from({ length: 12 }, (_, i) => chat(f.urls[i % 3]!)));
    expect(f.mock.stats().total).toBe(1);
    expect(results.filter((r) => r.status === 200)).toHaveLength(1);
    expect(results.filter((r) => r.body.error?.code === 'circuit_open')).toHaveLength(11);
  });

  it('logs and counts each breaker state change once fleet-wide through a whole cycle, and never a probe that keeps the state', async () => {
    const f = await startFleet({ errors: [{ status: 503, rate: 1 }] }, { route: { retry: { maxAttempts: 1 }, park: false }, provider: { breaker: { openS: 1, closeAfter: 3, halfOpenProbes: 3 } } });
    for (let i = 0; i < 5; i++) expect((await chat(f.urls[0]!)).status).toBe(503);
    await sleep(1_300);
    expect((await chat(f.urls[1]!)).status).toBe(503); // the first probe fails: still open, for another openS
    await sleep(1_300);
    f.mock.setFaults({});
    // Three successful probes, one per gateway: open -> half-open, half-open (no change), -> closed.
    for (const url of [f.urls[1]!, f.urls[2]!, f.urls[0]!]) {
      await sleep(100); // let pub/sub carry the last change to every gateway
      expect((await chat(url)).status).toBe(200);
    }
    const transitions = async (to: string) => {
      let sum = 0;
      for (const url of f.urls) {
        const text = await (await fetch(`${url}/metrics`)).text();
        for (const line of text.split('\n')) if (line.startsWith('stormgate_breaker_transitions_total{') && line.includes(`to="${to}"`)) sum += Number(line.split(' ').at(-1));
      }
      return sum;
    };
    expect({ open: await transitions('open'), halfOpen: await transitions('half-open'), closed: await transitions('closed') }).toEqual({ open: 1, halfOpen: 1, closed: 1 });
    const breakerLines = f.logs.filter((l) => l.includes('"msg":"breaker '));
    expect(breakerLines.map((l) => (JSON.parse(l) as { msg: string }).msg)).toEqual(['breaker open', 'breaker half-open', 'breaker closed']);
    for (const l of breakerLines) {
      const { from, to } = JSON.parse(l) as { from: string; to: string };
      expect(from).not.toBe(to);
    }
  });

  it('shares a provider pool\'s maxConcurrent across the fleet instead of multiplying it', async () => {
    const f = await startFleet({ latencyMs: 200 }, { provider: { maxConnections: 64, pools: { maxConcurrent: 6 } }, route: { retry: { maxAttempts: 1 } } });
    const until = Date.now() + 4_000;
    const statuses: number[] = [];
    const client = async (url: string) => {
      while (Date.now() < until) statuses.push((await chat(url, { 'x-stormgate-timeout-ms': '20000' })).status);
    };
    const load = Promise.all(Array.from({ length: 24 }, (_, i) => client(f.urls[i % 3]!)));
    // Shares follow demand within a few refreshes; measure once every instance has reported its demand.
    await sleep(2_000);
    f.mock.reset();
    await load;
    expect(statuses.every((s) => s === 200)).toBe(true);
    expect(f.mock.stats().maxInflight).toBeLessThanOrEqual(7);
  });

  it('lets the request that got a wait hint wait out the hold-off it started, without tripping over it', async () => {
    // The hold-off ends a little after the hint (its spread); the request's own wait must cover that, with Redis as
    // without: the hold-off is in force locally at once, not after Redis answered.
    const f = await startFleet(
      { errors: [{ status: 429, firstAttemptsOnly: true, headers: { 'retry-after-ms': '150' } }] },
      { route: { retry: { maxAttempts: 2 }, park: false, budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 } }, provider: { breaker: false } },
    );
    for (let i = 0; i < 12; i++) {
      const r = await chat(f.urls[0]!);
      expect(r.body.error?.code).toBeUndefined();
      expect(r.status).toBe(200);
    }
  });

  it('tells a client of another instance what a hint over a minute asked for, on its first sight of the target', async () => {
    const f = await startFleet(
      { errors: [{ status: 429, rate: 1, times: 1, headers: { 'retry-after': '3600' } }] },
      { route: { retry: { maxAttempts: 1 }, park: false }, provider: { breaker: false } },
    );
    expect((await chat(f.urls[0]!)).status).toBe(429);
    const res = await fetch(`${f.urls[1]}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('provider_held_off');
    expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(3_590);
    expect(res.headers.get('x-should-retry')).toBe('false');
    expect(f.mock.stats().total).toBe(1);
  });

  it('answers every request while Redis is down, reports degraded, and shares state again once it is back', async () => {
    const f = await startFleet({}, { route: { retry: { maxAttempts: 1 }, park: false } });
    expect((await chat(f.urls[0]!)).status).toBe(200);
    await redis.stop();
    try {
      const during = await Promise.all(f.urls.flatMap((u) => [chat(u), chat(u)]));
      expect(during.every((r) => r.status === 200)).toBe(true);
      await eventually(async () => (await metricValue(f.urls[0]!, 'stormgate_state_degraded')) === 1);
    } finally {
      await redis.restart();
    }
    await eventually(async () => (await metricValue(f.urls[0]!, 'stormgate_state_degraded')) === 0, 8_000);
    // Shared again: a breaker opened through A is seen by B.
    f.mock.setFaults({ errors: [{ status: 503, rate: 1 }] });
    for (let i = 0; i < 5; i++) await chat(f.urls[0]!);
    await eventually(async () => (await chat(f.urls[1]!)).body.error?.code === 'circuit_open');
  });
});

describe('a gateway started while Redis does not answer', () => {
  it('says it is on local state from its first answer (gauge and /readyz), and moves to Redis once it answers', async () => {
    // Stopped (SIGSTOP), not gone: connections are accepted and nothing answers, so no connection error says so.
    const thawed = redis.freeze();
    const mock = await startMock({ quiet: true, apiKey: TEST_KEY });
    const config = ConfigSchema.parse({ ...defaultConfig(mock.url), state: { redis: redis.url, keyPrefix: `frozen${process.pid}`, commandTimeoutMs: 1000 } });
    let g: FastifyInstance | undefined;
    try {
      g = await buildServer(config, { logger: createLogger(config, testLogSink([])), metrics: createMetrics({ defaultMetrics: false }) });
      const url = await g.listen({ host: '127.0.0.1', port: 0 });
      expect(await metricValue(url, 'stormgate_state_degraded')).toBe(1);
      expect(await (await fetch(`${url}/readyz`)).json()).toMatchObject({ degraded: true });
      thawed();
      await eventually(async () => (await metricValue(url, 'stormgate_state_degraded')) === 0, 8_000);
    } finally {
      thawed();
      await g?.close();
      await mock.close();
    }
  });
});
