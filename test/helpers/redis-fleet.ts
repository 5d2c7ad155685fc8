// A small fleet of in-process gateways on one bundled mock provider, each reaching Redis at the URL the test gives it
// (the server itself, or a proxy in front of it), with each instance's log kept for the test. For tests of Redis
// misbehaving under a running fleet: the official `openai` SDK asks, and the test reads answers, timings, metrics, logs.
import { randomUUID } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import OpenAI from 'openai';
import { afterEach } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../../src/config/schema.ts';
import { startMock, type FaultSpec, type MockServer } from '../../src/mock/server.ts';
import { createLogger } from '../../src/observability/logger.ts';
import { createMetrics } from '../../src/observability/metrics.ts';
import { buildServer } from '../../src/server.ts';
import { defaultConfig, TEST_KEY, testLogSink } from './stack.ts';

export interface RedisFleet {
  mock: MockServer;
  urls: string[];
  /** Raw log lines of each instance, by index. */
  logs: string[][];
  keyPrefix: string;
}

export type FleetOverrides = Pick<Parameters<typeof defaultConfig>[1] & object, 'route' | 'provider'> & {
  state?: Partial<NonNullable<ConfigInput['state']>>;
  idempotency?: ConfigInput['idempotency'];
};

/** What the SDK saw of one request. */
export interface Seen {
  status: number;
  code?: string;
  type?: string;
  shouldRetry?: string | null;
  ms: number;
}

/** A starter of fleets, every gateway and mock closed after each test. */
export function useRedisFleets(): (faults: FaultSpec, redisUrls: string[], overrides?: FleetOverrides) => Promise<RedisFleet> {
  const gateways: FastifyInstance[] = [];
  const mocks: MockServer[] = [];
  afterEach(async () => {
    await Promise.all(gateways.splice(0).map((g) => g.close()));
    await Promise.all(mocks.splice(0).map((m) => m.close()));
  });
  return async (faults, redisUrls, overrides = {}) => {
    const mock = await startMock({ faults, quiet: true, apiKey: TEST_KEY });
    mocks.push(mock);
    const keyPrefix = `f61-${randomUUID()}`;
    const urls: string[] = [];
    const logs: string[][] = [];
    for (const redisUrl of redisUrls) {
      const input: ConfigInput = {
        ...defaultConfig(mock.url, overrides),
        state: { redis: redisUrl, keyPrefix, commandTimeoutMs: 100, ...overrides.state },
        ...(overrides.idempotency && { idempotency: overrides.idempotency }),
      };
      const config = ConfigSchema.parse(input);
      const lines: string[] = [];
      const g = await buildServer(config, { logger: createLogger(config, testLogSink(lines)), metrics: createMetrics({ defaultMetrics: false }) });
      gateways.push(g);
      urls.push(await g.listen({ host: '127.0.0.1', port: 0 }));
      logs.push(lines);
    }
    return { mock, urls, logs, keyPrefix };
  };
}

/** One chat completion through the `openai` SDK (no SDK retries): its status, error code and type, and how long it took. */
export async function askFleet(url: string, headers: Record<string, string> = {}, model = 'gpt-4o'): Promise<Seen> {
  const started = performance.now();
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0, timeout: 15_000 });
  try {
    const { response } = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }] }, { headers }).withResponse();
    return { status: response.status, ms: performance.now() - started };
  } catch (err) {
    if (err instanceof OpenAI.APIError && err.status !== undefined) {
      return { status: err.status, code: err.code ?? undefined, type: err.type ?? undefined, shouldRetry: err.headers?.get('x-should-retry'), ms: performance.now() - started };
    }
    throw err;
  }
}

/** The value of the first sample of `name` (with its labels, when given) on an instance's /metrics. */
export async function metricOf(url: string, name: string): Promise<number | undefined> {
  const line = (await (await fetch(`${url}/metrics`)).text()).split('\n').find((l) => l.startsWith(name));
  return line === undefined ? undefined : Number(line.split(' ').at(-1));
}

/** The log lines of one instance about the state store, parsed. */
export function storeLines(lines: string[]): Array<{ level: number; msg: string; flapping?: boolean; error?: { message: string }; problem?: string; keys?: string; redisError?: string }> {
  return lines.map((l) => JSON.parse(l) as { level: number; msg: string }).filter((l) => l.msg.startsWith('state store'));
}
