// Starts the bundled mock provider and a gateway in front of it over real HTTP, for integration and e2e tests.
import { appendFileSync } from 'node:fs';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { afterEach } from 'vitest';
import type { FastifyInstance } from 'fastify';
import { ConfigSchema, type Config, type ConfigInput } from '../../src/config/schema.ts';
import { buildServer, type ServerDeps } from '../../src/server.ts';
import { createLogger } from '../../src/observability/logger.ts';
import { createMetrics } from '../../src/observability/metrics.ts';
import { startMock, type MockOptions, type MockServer } from '../../src/mock/server.ts';
import type { FaultSpec } from '../../src/mock/faults.ts';
import OpenAI from 'openai';

export const TEST_KEY = 'sk-test-stormgate-0123456789';

type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];

/**
 * For tests that count attempts through failures: no breaker, a budget that never refuses, no parking, so what they
 * check is the retry loop alone.
 */
export const RETRY_LOOP_ONLY: Pick<StackOptions, 'route' | 'provider'> = {
  route: { budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 }, park: false },
  provider: { breaker: false },
};

export interface StackOptions {
  faults?: FaultSpec;
  /** Overrides merged into every route (retry, timeoutMs, ...). */
  route?: Partial<RouteInput>;
  provider?: Partial<ProviderInput>;
  /** Replaces the whole config; gets the mock's base URL. */
  config?: (mockUrl: string) => ConfigInput;
  deps?: ServerDeps;
}

export interface Stack {
  mock: MockServer;
  gateway: FastifyInstance;
  config: Config;
  /** The gateway's base URL including /v1, ready for `new OpenAI({ baseURL })`. */
  baseURL: string;
  url: string;
  logs: string[];
  close(): Promise<void>;
}

export function defaultConfig(mockUrl: string, opts: Pick<StackOptions, 'route' | 'provider'> = {}): ConfigInput {
  const route = (name: string, path: string): RouteInput => ({
    name,
    match: { path },
    targets: [{ provider: 'mock' }],
    ...opts.route,
  });
  return {
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    providers: { mock: { family: 'openai', baseUrl: `${mockUrl}/v1`, apiKey: TEST_KEY, maxConnections: 64, ...opts.provider } },
    routes: [
      route('chat', '/v1/chat/completions'),
      route('embeddings', '/v1/embeddings'),
      route('completions', '/v1/completions'),
      route('responses', '/v1/responses'),
    ],
  };
}

/** The default config (retry loop only) with every route served by one more OpenAI-compatible provider alone. */
export function configServedBy(mockUrl: string, name: string, baseUrl: string): ConfigInput {
  const base = defaultConfig(mockUrl, RETRY_LOOP_ONLY);
  return {
    ...base,
    providers: { ...base.providers, [name]: { family: 'openai', baseUrl, apiKey: `${name}-key`, breaker: false } },
    routes: base.routes.map((r) => ({ ...r, targets: [{ provider: name }] })),
  };
}

export async function startStack(opts: StackOptions = {}): Promise<Stack> {
  const mock = await startMock({ faults: opts.faults, quiet: true, apiKey: TEST_KEY });
  const input = opts.config ? opts.config(mock.url) : defaultConfig(mock.url, opts);
  const config = ConfigSchema.parse(input);
  const logs: string[] = [];
  const sink = testLogSink(logs);
  const gateway = await buildServer(config, {
    logger: createLogger(config, sink),
    metrics: createMetrics({ defaultMetrics: false }),
    ...opts.deps,
  });
  const url = await gateway.listen({ host: '127.0.0.1', port: 0 });
  return {
    mock,
    gateway,
    config,
    url,
    baseURL: `${url}/v1`,
    logs,
    async close() {
      await gateway.close();
      await mock.close();
    },
  };
}

/**
 * Keeps a gateway's log lines for the test (when given a list: thousands of lines kept would weigh on a heap reading),
 * and appends them to the run's log directory for the secrecy check.
 */
export function testLogSink(lines?: string[]): Writable {
  const dir = process.env.STORMGATE_TEST_LOG_DIR;
  const file = dir ? join(dir, `${process.pid}.log`) : undefined;
  return new Writable({
    write(chunk, _enc, cb) {
      lines?.push(String(chunk));
      if (file) appendFileSync(file, chunk);
      cb();
    },
  });
}

/** Starts stacks for one test file and closes every one a test started, after each test. */
export function useStacks(defaults: StackOptions = {}): (opts?: StackOptions) => Promise<Stack> {
  const started: Stack[] = [];
  afterEach(async () => {
    await Promise.all(started.splice(0).map((s) => s.close()));
  });
  return async (opts = {}) => {
    const stack = await startStack({ ...defaults, ...opts, route: { ...defaults.route, ...opts.route }, provider: { ...defaults.provider, ...opts.provider } });
    started.push(stack);
    return stack;
  };
}

/**
 * Starts gateways of a given config for one test file (several of one fleet, say) and closes them after each test;
 * each start resolves the gateway's URL. `logs` collects its log lines; `port`, when given, is the one it listens on.
 */
export function useGateways(): (config: Config, opts?: { logs?: string[]; port?: number }) => Promise<string> {
  const started: FastifyInstance[] = [];
  afterEach(async () => {
    await Promise.all(started.splice(0).map((g) => g.close()));
  });
  return async (config, opts = {}) => {
    const gateway = await buildServer(config, { logger: createLogger(config, testLogSink(opts.logs ?? [])), metrics: createMetrics({ defaultMetrics: false }) });
    started.push(gateway);
    return gateway.listen({ host: '127.0.0.1', port: opts.port ?? 0 });
  };
}

/** Starts extra mock providers (a backup, say) for one test file and closes them after each test. */
export function useExtraMocks(): (opts?: MockOptions) => Promise<MockServer> {
  const started: MockServer[] = [];
  afterEach(async () => {
    await Promise.all(started.splice(0).map((m) => m.close()));
  });
  return async (opts = {}) => {
    const mock = await startMock({ quiet: true, ...opts });
    started.push(mock);
    return mock;
  };
}

/** One gpt-4o chat completion sent to a gateway's origin with fetch; its status, once the body is read. */
export async function chatStatus(url: string): Promise<number> {
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
  });
  await res.arrayBuffer();
  return res.status;
}

/** One sample of a /metrics scrape. */
export interface MetricSample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** The samples of a Prometheus text exposition (comments left out); a line it cannot read fails the test. */
export function parseMetrics(text: string): MetricSample[] {
  const out: MetricSample[] = [];
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m) throw new Error(`unparsable /metrics line: ${line}`);
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]!] = l[2]!;
    out.push({ name: m[1]!, labels, value: Number(m[3]) });
  }
  return out;
}

/** A gateway's /metrics, as samples. */
export async function scrapeMetrics(url: string): Promise<MetricSample[]> {
  return parseMetrics(await (await fetch(`${url}/metrics`)).text());
}

/** The sum of a metric's series on a stack's /metrics whose line starts with `name` (labels included, to pick some). */
export async function metricSum(s: Stack, name: string): Promise<number> {
  const text = await (await fetch(`${s.url}/metrics`)).text();
  return text
    .split('\n')
    .filter((l) => l.startsWith(name))
    .reduce((sum, l) => sum + Number(l.split(' ').at(-1)), 0);
}

/**
 * The request log line of the first request on `route`, once written: a request's line follows its answer by a tick or
 * two (a stream's, its close), so it is waited for (up to a second) rather than read at once.
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- a log line is JSON: tests read whatever field they check
export async function requestLine(s: Stack, route = 'chat'): Promise<Record<string, any>> {
  const until = Date.now() + 1_000;
  for (;;) {
    const line = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.route === route);
    if (line) return line;
    if (Date.now() > until) throw new Error(`no request log line for route ${route}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

export type ClientOptions = NonNullable<ConstructorParameters<typeof OpenAI>[0]>;

/** An `openai` SDK client of the stack's gateway whose HTTP requests are counted (its own retries included). */
export function countingClient(s: Stack, opts: ClientOptions = {}): { client: OpenAI; counter: { requests: number } } {
  const counter = { requests: 0 };
  const client = new OpenAI({
    baseURL: s.baseURL,
    apiKey: 'sk-client-not-a-provider-key',
    fetch: async (url, init) => {
      counter.requests++;
      return fetch(url, init);
    },
    ...opts,
  });
  return { client, counter };
}

/** An SDK client's fetch that records each answer's headers and, given a list, its body text (teed off, unread by the SDK). */
export function recordingFetch(heads: Headers[], bodies?: Array<Promise<string>>): typeof fetch {
  return async (url, init) => {
    const r = await fetch(url, init);
    heads.push(r.headers);
    bodies?.push(r.clone().text());
    return r;
  };
}

/** What the SDK's HTTP requests were answered with: status, x-should-retry and the error code, one entry each. */
interface Answered {
  status: number;
  shouldRetry: string | null;
  code?: string;
}

/** An `openai` SDK client of the stack's gateway that records every answer its HTTP requests got (its own retries included). */
export function recordingClient(s: Stack, opts: ClientOptions = {}): { client: OpenAI; seen: Answered[] } {
  const seen: Answered[] = [];
  const client = new OpenAI({
    baseURL: s.baseURL,
    apiKey: 'sk-client-not-a-provider-key',
    fetch: async (url, init) => {
      const res = await fetch(url, init);
      const body = (await res.clone().json().catch(() => undefined)) as { error?: { code?: string } } | undefined;
      seen.push({ status: res.status, shouldRetry: res.headers.get('x-should-retry'), code: body?.error?.code });
      return res;
    },
    ...opts,
  });
  return { client, seen };
}
