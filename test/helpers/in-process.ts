// The resource suites' harness (third-party suites 41 and 59): the gateway built in this process from a config, so a
// test can read its heap, handles and sockets; clients on an Agent of their own; the heap after a forced collection.
import { setTimeout as sleep } from 'node:timers/promises';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import type { FastifyInstance } from 'fastify';
import OpenAI from 'openai';
import { fetch as undiciFetch, request, type Agent } from 'undici';
import { afterEach } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../../src/config/schema.ts';
import { createLogger } from '../../src/observability/logger.ts';
import { createMetrics } from '../../src/observability/metrics.ts';
import { buildServer } from '../../src/server.ts';
import type { StateStore } from '../../src/state/store.ts';
import { parseMetrics, testLogSink, type MetricSample } from './stack.ts';

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;
setFlagsFromString('--no-expose-gc');

/** The JS heap and the memory of Buffers (a kept answer's body lives outside the heap), after forced collections. */
export async function settledHeap(): Promise<number> {
  for (let i = 0; i < 3; i++) {
    gc();
    await sleep(50);
  }
  const { heapUsed, external } = process.memoryUsage();
  return heapUsed + external;
}

export interface InProcessGateway {
  url: string;
  app: FastifyInstance;
  metrics(): Promise<MetricSample[]>;
  metricsText(): Promise<string>;
}

/**
 * Returns a starter for in-process gateways (request log to a sink, no default metrics), each closed after the test
 * with everything else the test handed to `closeAfter`, last started first.
 */
export function useInProcessGateways() {
  const started: Array<{ close(): Promise<void> }> = [];
  afterEach(async () => {
    for (const s of started.splice(0).reverse()) await s.close();
  });
  const closeAfter = <T extends { close(): Promise<void> }>(thing: T): T => {
    started.push(thing);
    return thing;
  };
  /**
   * Each scrape on a connection of its own, closed after it (a kept one would read as a descriptor left over), unless
   * `keptScrapeConnection`.
   */
  const startGateway = async (input: ConfigInput, opts: { store?: StateStore; keptScrapeConnection?: boolean } = {}): Promise<InProcessGateway> => {
    const config = ConfigSchema.parse(input);
    const app = await buildServer(config, { logger: createLogger(config, testLogSink()), metrics: createMetrics({ defaultMetrics: false }), store: opts.store });
    closeAfter({ close: () => app.close() });
    const url = await app.listen({ host: '127.0.0.1', port: 0 });
    const metricsText = async () => (await request(`${url}/metrics`, { reset: !opts.keptScrapeConnection })).body.text();
    return { url, app, metricsText, metrics: async () => parseMetrics(await metricsText()) };
  };
  return { startGateway, closeAfter };
}

/** An openai SDK client of the gateway on an Agent of the test's own (closed by the test before its readings). */
export function sdkOn(url: string, agent: Agent, opts: { apiKey: string; maxRetries?: number }): OpenAI {
  return new OpenAI({
    baseURL: `${url}/v1`,
    apiKey: opts.apiKey,
    maxRetries: opts.maxRetries ?? 0,
    fetch: ((u: string, init: object) => undiciFetch(u, { ...init, dispatcher: agent })) as unknown as typeof fetch,
  });
}

/** Runs `n` tasks, at most `width` at a time. */
export async function pooled<T>(n: number, width: number, task: (i: number) => Promise<T>): Promise<T[]> {
  const out: T[] = new Array(n);
  let next = 0;
  await Promise.all(
    Array.from({ length: width }, async () => {
      while (next < n) {
        const i = next++;
        out[i] = await task(i);
      }
    }),
  );
  return out;
}

/** How many times each value occurs, keys sorted. */
export const tally = (xs: string[]) => Object.fromEntries([...xs.reduce((m, x) => m.set(x, (m.get(x) ?? 0) + 1), new Map<string, number>())].sort());
