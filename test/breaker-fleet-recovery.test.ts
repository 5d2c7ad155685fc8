// The breaker's recovery across a fleet on one real Redis, from the recovery QA suite: an instance that joins (or
// restarts) while the fleet's breaker is open or half-open must hold to the fleet's record from its first request.
import type { FastifyInstance } from 'fastify';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ConfigSchema, type Config, type ConfigInput } from '../src/config/schema.ts';
import { buildServer } from '../src/server.ts';
import { createLogger } from '../src/observability/logger.ts';
import { createMetrics } from '../src/observability/metrics.ts';
import { startMock, type MockServer } from '../src/mock/server.ts';
import { defaultConfig, TEST_KEY, testLogSink } from './helpers/stack.ts';
import { startRedis, type RedisHandle } from './helpers/redis-server.ts';

let redis: RedisHandle;
beforeAll(async () => {
  redis = await startRedis();
});
afterAll(async () => {
  await redis.stop();
});

const gateways: FastifyInstance[] = [];
let mock: MockServer | undefined;
afterEach(async () => {
  await Promise.all(gateways.splice(0).map((g) => g.close()));
  await mock?.close();
  mock = undefined;
});

let prefixCounter = 0;

async function gateway(config: Config): Promise<string> {
  const g = await buildServer(config, { logger: createLogger(config, testLogSink([])), metrics: createMetrics({ defaultMetrics: false }) });
  gateways.push(g);
  return g.listen({ host: '127.0.0.1', port: 0 });
}

async function chat(url: string) {
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
  });
  return { status: res.status, body: (await res.json()) as { error?: { code: string } } };
}

describe('an instance that joins the fleet while its breaker is open', () => {
  // 60 s: two gateways built and 25 requests, no wait of its own, took 29 s of the default 30 on a loaded 2-core machine.
  it('sends none of its first requests upstream: it knows the fleet\'s breaker before it serves', { timeout: 60_000 }, async () => {
    mock = await startMock({ faults: { errors: [{ status: 503, rate: 1 }] }, quiet: true, apiKey: TEST_KEY });
    const input: ConfigInput = {
      ...defaultConfig(mock.url, { route: { retry: { maxAttempts: 1 }, park: false }, provider: { breaker: { openS: 60 } } }),
      state: { redis: redis.url, keyPrefix: `fleet-recovery${process.pid}-${prefixCounter++}`, commandTimeoutMs: 1000 },
    };
    const config = ConfigSchema.parse(input);
    const a = await gateway(config);
    for (let i = 0; i < 5; i++) expect((await chat(a)).status).toBe(503);
    const before = mock.stats().total;
    // A restarted instance (or a new one the autoscaler adds) with a burst of requests waiting for it: every one of
    // them must see the fleet's open breaker, none may go to the provider as if it were closed.
    const b = await gateway(config);
    const results = await Promise.all(Array.from({ length: 20 }, () => chat(b)));
    expect(mock.stats().total - before).toBe(0);
    expect(results.every((r) => r.body.error?.code === 'circuit_open')).toBe(true);
  });
});
