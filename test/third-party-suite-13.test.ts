// A thirteenth third-party failure-scenario suite, written from the README alone ("Logs and metrics" and its metrics
// table, "Retry budget, circuit breaker, hold-offs, parking", "Priority pools", "Health, readiness, shutdown") and the
// PromQL of the shipped dashboard (grafana/), as an outside SRE team would test what it will be watching on Grafana
// during an incident: does each panel count what the README says it counts, exactly, when we know the ground truth?
// Black box: real gateways over real HTTP, the official `openai` SDK as the client (no SDK retries, so every HTTP
// request is one the test made), the bundled mock provider (or a scripted one) upstream, and its own request log as
// what the provider saw. The ground truth is what the clients were told (`x-stormgate-attempts`,
// `x-stormgate-fallback`, statuses and codes); each scenario then reads /metrics (and, for a fleet of two gateways on
// one real redis-server, a real Prometheus running the shipped recording rules and the dashboard's queries) and
// asserts the counts the README defines. Timing bounds are generous: the suite runs on a loaded 2-core machine.
import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import type { FaultSpec, MockServer } from '../src/mock/server.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { dashboardQueries, query, readDashboard, SHIPPED, startPrometheus, withoutGrafanaVariables, type PrometheusHandle } from './helpers/prometheus.ts';
import { startRedis, useRedisServer } from './helpers/redis-server.ts';
import { json, scripted, streamed } from './helpers/scripted-provider.ts';
import { parseMetrics, scrapeMetrics, TEST_KEY, useExtraMocks, useGateways } from './helpers/stack.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();
const startFake = useFakeProviders();
const redisServer = useRedisServer();

type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];

const CHAT = '/v1/chat/completions';
const messages = [{ role: 'user' as const, content: 'What is on call today?' }];
/** Quick retries with no jitter, a budget that never refuses, no breaker and no parking, unless a scenario says so. */
const QUIET_ROUTE: Partial<RouteInput> = {
  retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5 } },
  budget: { ratio: 10, minRetriesPerSecond: 1000 },
  park: false,
  timeoutMs: 20_000,
  minAttemptMs: 100,
};

// ---------------------------------------------------------------------------------------------------------------
// Setting up: gateways in front of mocks, an SDK that records what each call was told, and a /metrics reader.

interface GwOptions {
  route?: Partial<RouteInput>;
  primary?: Partial<ProviderInput>;
  /** A second mock as the route's fallback target `backup`. */
  backup?: MockServer;
  extra?: (c: ConfigInput) => void;
  /** Gateways sharing the file's redis-server (default 1, in-process state). */
  instances?: number;
  redisUrl?: string;
}

interface Gw {
  urls: string[];
  url: string;
  logs: string[][];
}

let prefixes = 0;

async function gateways(mock: MockServer | string, opts: GwOptions = {}): Promise<Gw> {
  const n = opts.instances ?? 1;
  const baseUrl = typeof mock === 'string' ? mock : `${mock.url}/v1`;
  const input: ConfigInput = {
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    providers: {
      primary: { family: 'openai', baseUrl, apiKey: TEST_KEY, maxConnections: 64, breaker: false, ...opts.primary },
      ...(opts.backup && { backup: { family: 'openai', baseUrl: `${opts.backup.url}/v1`, apiKey: TEST_KEY, breaker: false } }),
    },
    routes: [
      {
        name: 'chat',
        match: { path: CHAT, models: ['gpt-4o', 'gpt-4o-mini'] },
        targets: [{ provider: 'primary' }, ...(opts.backup ? [{ provider: 'backup' }] : [])],
        ...QUIET_ROUTE,
        ...opts.route,
      },
    ],
    ...((n > 1 || opts.redisUrl) && { state: { redis: opts.redisUrl ?? redisServer().url, keyPrefix: `tp13-${process.pid}-${++prefixes}`, commandTimeoutMs: 200 } }),
  };
  opts.extra?.(input);
  const config = ConfigSchema.parse(input);
  const logs = Array.from({ length: n }, () => [] as string[]);
  const urls: string[] = [];
  for (let i = 0; i < n; i++) urls.push(await startGateway(config, { logs: logs[i] }));
  return { urls, url: urls[0]!, logs };
}

const sdk = (url: string, opts: ConstructorParameters<typeof OpenAI>[0] = {}) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sk-agent-7Hq2', maxRetries: 0, ...opts });

/** What one SDK call was told. */
interface Told {
  status: number;
  attempts: number;
  fallback: string | null;
  target: string | null;
  shouldRetry: string | null;
  code?: string;
  requestId: string | null;
}

function told(status: number, h: Headers | undefined, code?: string): Told {
  return {
    status,
    attempts: Number(h?.get('x-stormgate-attempts') ?? 0),
    fallback: h?.get('x-stormgate-fallback') ?? null,
    target: h?.get('x-stormgate-target') ?? null,
    shouldRetry: h?.get('x-should-retry') ?? null,
    code,
    requestId: h?.get('x-stormgate-request-id') ?? null,
  };
}

async function chat(client: OpenAI, model = 'gpt-4o', reqOpts: OpenAI.RequestOptions = {}): Promise<Told> {
  try {
    const { response } = await client.chat.completions.create({ model, messages }, reqOpts).withResponse();
    return told(200, response.headers);
  } catch (e) {
    if (!(e instanceof OpenAI.APIError) || e.status === undefined) throw e;
    return told(e.status, e.headers, (e.error as { code?: string } | undefined)?.code);
  }
}

/** A streamed call read to its end: what it was told, and whether the SDK raised mid-stream. */
async function chatStream(client: OpenAI, model = 'gpt-4o'): Promise<Told & { chunks: number; broke: boolean }> {
  let chunks = 0;
  try {
    const { data, response } = await client.chat.completions.create({ model, messages, stream: true }, {}).withResponse();
    const t = told(200, response.headers);
    try {
      for await (const _ of data) chunks++;
    } catch {
      return { ...t, chunks, broke: true };
    }
    return { ...t, chunks, broke: false };
  } catch (e) {
    if (!(e instanceof OpenAI.APIError) || e.status === undefined) throw e;
    return { ...told(e.status, e.headers, (e.error as { code?: string } | undefined)?.code), chunks, broke: false };
  }
}

async function all<T>(n: number, fn: (i: number) => Promise<T>): Promise<T[]> {
  return Promise.all(Array.from({ length: n }, (_, i) => fn(i)));
}

const scrape = scrapeMetrics;

/** The sum of a metric's samples whose labels include `where`, over every instance given. */
async function metric(urls: string | string[], name: string, where: Record<string, string> = {}): Promise<number> {
  let sum = 0;
  for (const url of [urls].flat()) {
    for (const s of await scrape(url)) if (s.name === name && Object.entries(where).every(([k, v]) => s.labels[k] === v)) sum += s.value;
  }
  return sum;
}

/** The value of a gauge's one series, or undefined when it has none. */
async function gauge(url: string, name: string, where: Record<string, string> = {}): Promise<number | undefined> {
  const found = (await scrape(url)).filter((s) => s.name === name && Object.entries(where).every(([k, v]) => s.labels[k] === v));
  if (found.length > 1) throw new Error(`${name} ${JSON.stringify(where)}: ${found.length} series`);
  return found[0]?.value;
}

async function until(what: string, check: () => Promise<boolean> | boolean, withinMs = 10_000): Promise<void> {
  for (const end = Date.now() + withinMs; !(await check()); ) {
    if (Date.now() > end) throw new Error(`timed out waiting until ${what}`);
    await sleep(20);
  }
}

/** Request log lines (one per request), once `n` of them are written. */
async function requestLines(logs: string[], n: number): Promise<Array<Record<string, unknown>>> {
  const lines = () => logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.route === 'chat' && 'outcome' in l);
  await until(`${n} request log lines`, () => lines().length >= n, 3_000);
  return lines();
}

const chatHits = (mock: MockServer) => mock.requests().filter((r) => r.path === CHAT);
const sumAttempts = (ts: Told[]) => ts.reduce((s, t) => s + t.attempts, 0);

// ---------------------------------------------------------------------------------------------------------------

describe('the retry panels: stormgate_retry_count_total, stormgate_retried_requests_total and the retry success rate', () => {
  it('counts retries by route, target and reason as the attempts the clients saw minus one, after first-try successes, retried successes and exhausted retries', async () => {
    // gpt-4o: exactly every other first attempt fails with a 503, retries pass; gpt-4o-mini: every attempt fails.
    const mock = await startMock({
      faults: { models: { 'gpt-4o': { errors: [{ status: 503, rate: 0.5, firstAttemptsOnly: true }] }, 'gpt-4o-mini': { errors: [{ status: 503 }] } } },
    });
    const gw = await gateways(mock);
    const client = sdk(gw.url);
    const ok = await all(20, () => chat(client, 'gpt-4o'));
    const exhausted = await all(4, () => chat(client, 'gpt-4o-mini'));

    expect(ok.map((t) => t.status)).toEqual(ok.map(() => 200));
    expect(ok.filter((t) => t.attempts === 1)).toHaveLength(10);
    expect(ok.filter((t) => t.attempts === 2)).toHaveLength(10);
    expect(exhausted.map((t) => [t.status, t.attempts, t.shouldRetry])).toEqual(exhausted.map(() => [503, 3, 'false']));

    expect(await metric(gw.url, 'stormgate_retry_count_total', { route: 'chat', target: 'primary/gpt-4o', reason: 'status_503' })).toBe(10);
    expect(await metric(gw.url, 'stormgate_retry_count_total', { route: 'chat', target: 'primary/gpt-4o-mini', reason: 'status_503' })).toBe(8);
    expect(await metric(gw.url, 'stormgate_retry_count_total')).toBe(sumAttempts([...ok, ...exhausted]) - 24);
    // Every attempt went upstream once, as the provider saw it, and the retries are those it saw with x-retry-attempt.
    expect(await metric(gw.url, 'stormgate_upstream_attempts_total')).toBe(sumAttempts([...ok, ...exhausted]));
    expect(chatHits(mock)).toHaveLength(42);
    expect(chatHits(mock).filter((r) => r.headers['x-retry-attempt'] !== undefined && r.headers['x-retry-attempt'] !== '0')).toHaveLength(18);
    expect(await metric(gw.url, 'stormgate_upstream_attempts_total', { status_class: '5xx' })).toBe(22);

    expect(await metric(gw.url, 'stormgate_retried_requests_total', { route: 'chat', result: 'success' })).toBe(10);
    expect(await metric(gw.url, 'stormgate_retried_requests_total', { route: 'chat', result: 'failure' })).toBe(4);
    expect(await gauge(gw.url, 'stormgate_retry_success_rate', { route: 'chat' })).toBeCloseTo(10 / 14, 10);
    expect(await gauge(gw.url, 'stormgate_fallback_rate', { route: 'chat' })).toBe(0);
    expect(await metric(gw.url, 'stormgate_requests_total', { route: 'chat', outcome: 'success' })).toBe(20);
    expect(await metric(gw.url, 'stormgate_requests_total', { route: 'chat', outcome: 'upstream_error' })).toBe(4);
    expect(await metric(gw.url, 'stormgate_request_duration_seconds_count', { route: 'chat', attempt: 'first' })).toBe(10);
    expect(await metric(gw.url, 'stormgate_request_duration_seconds_count', { route: 'chat', attempt: 'retry' })).toBe(14);
    // Exhausted retries name it in the log line; nothing else stopped a retry.
    const lines = await requestLines(gw.logs[0]!, 24);
    expect(lines.filter((l) => l.retriesStopped === 'retries_exhausted')).toHaveLength(4);
    expect(lines.filter((l) => l.retriesStopped !== undefined && l.retriesStopped !== 'retries_exhausted')).toEqual([]);
  });

  it('counts a failover as a retried request and a fallback, but its first attempt on the fallback as no retry', async () => {
    const mock = await startMock({ faults: { models: { 'gpt-4o-mini': { errors: [{ status: 503 }] } } } });
    const backup = await startMock();
    const gw = await gateways(mock, { backup, route: { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5 } } } });
    const client = sdk(gw.url);
    const first = await all(6, () => chat(client, 'gpt-4o'));
    const failedOver = await all(4, () => chat(client, 'gpt-4o-mini'));

    expect(first.map((t) => [t.status, t.attempts, t.fallback])).toEqual(first.map(() => [200, 1, null]));
    expect(failedOver.map((t) => [t.status, t.attempts, t.fallback, t.target])).toEqual(failedOver.map(() => [200, 3, 'retries_exhausted', 'backup/gpt-4o-mini']));
    // Attempts = requests + retries + hand-overs: the sum the amplification panel divides.
    const retries = await metric(gw.url, 'stormgate_retry_count_total', { route: 'chat' });
    const handOvers = await metric(gw.url, 'stormgate_fallbacks_total', { route: 'chat' });
    expect(retries).toBe(4);
    expect(await metric(gw.url, 'stormgate_retry_count_total', { target: 'primary/gpt-4o-mini', reason: 'status_503' })).toBe(4);
    expect(await metric(gw.url, 'stormgate_fallbacks_total', { route: 'chat', from: 'primary/gpt-4o-mini', to: 'backup/gpt-4o-mini', reason: 'retries_exhausted' })).toBe(4);
    expect(handOvers).toBe(4);
    expect(sumAttempts([...first, ...failedOver])).toBe(10 + retries + handOvers);
    expect(await metric(gw.url, 'stormgate_upstream_attempts_total')).toBe(18);
    expect(chatHits(backup).filter((r) => r.headers['x-retry-attempt'] !== undefined)).toEqual([]);

    expect(await metric(gw.url, 'stormgate_fallback_requests_total', { route: 'chat' })).toBe(4);
    expect(await gauge(gw.url, 'stormgate_fallback_rate', { route: 'chat' })).toBeCloseTo(0.4, 10);
    expect(await metric(gw.url, 'stormgate_retried_requests_total', { route: 'chat', result: 'success' })).toBe(4);
    expect(await metric(gw.url, 'stormgate_retried_requests_total', { route: 'chat', result: 'failure' })).toBe(0);
    expect(await gauge(gw.url, 'stormgate_retry_success_rate', { route: 'chat' })).toBe(1);
    // Billed to the target that answered.
    expect(await metric(gw.url, 'stormgate_requests_total', { route: 'chat', target: 'backup/gpt-4o-mini', outcome: 'success' })).toBe(4);
    expect(await metric(gw.url, 'stormgate_tokens_total', { target: 'backup/gpt-4o-mini', kind: 'prompt' })).toBeGreaterThan(0);
    expect(await metric(gw.url, 'stormgate_tokens_total', { target: 'primary/gpt-4o-mini' })).toBe(0);
  });

  it('has no retry success rate when nothing was retried, and a fallback rate of 0 when requests were all first-try', async () => {
    const mock = await startMock();
    const gw = await gateways(mock);
    expect(await gauge(gw.url, 'stormgate_retry_success_rate', { route: 'chat' })).toBeUndefined();
    expect(await gauge(gw.url, 'stormgate_fallback_rate', { route: 'chat' })).toBeUndefined();
    await all(3, () => chat(sdk(gw.url)));
    expect(await gauge(gw.url, 'stormgate_retry_success_rate', { route: 'chat' })).toBeUndefined();
    expect(await gauge(gw.url, 'stormgate_fallback_rate', { route: 'chat' })).toBe(0);
  });
});

describe('the budget panels: stormgate_retry_budget_exhausted_total and stormgate_retry_budget_remaining', () => {
  const noBudget: Partial<RouteInput> = { budget: { ratio: 0, minRetriesPerSecond: 0 } };

  it('counts each refused retry once, makes no retry of it, and tells the client not to retry', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 503 }] } });
    const gw = await gateways(mock, { route: noBudget });
    const got = await all(5, () => chat(sdk(gw.url)));
    expect(got.map((t) => [t.status, t.attempts, t.shouldRetry])).toEqual(got.map(() => [503, 1, 'false']));
    expect(await metric(gw.url, 'stormgate_retry_budget_exhausted_total', { route: 'chat', target: 'primary/gpt-4o' })).toBe(5);
    expect(await metric(gw.url, 'stormgate_retry_count_total')).toBe(0);
    expect(await metric(gw.url, 'stormgate_retried_requests_total')).toBe(0);
    expect(await gauge(gw.url, 'stormgate_retry_budget_remaining', { route: 'chat' })).toBe(0);
    const lines = await requestLines(gw.logs[0]!, 5);
    expect(lines.map((l) => l.retriesStopped)).toEqual(lines.map(() => 'budget'));
    expect(chatHits(mock)).toHaveLength(5);
  });

  it('moves a refused retry on to the next target, as a hand-over for `budget`', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 503 }] } });
    const backup = await startMock();
    const gw = await gateways(mock, { backup, route: noBudget });
    const got = await all(4, () => chat(sdk(gw.url)));
    expect(got.map((t) => [t.status, t.attempts, t.fallback])).toEqual(got.map(() => [200, 2, 'budget']));
    expect(await metric(gw.url, 'stormgate_retry_budget_exhausted_total', { route: 'chat', target: 'primary/gpt-4o' })).toBe(4);
    expect(await metric(gw.url, 'stormgate_fallbacks_total', { from: 'primary/gpt-4o', to: 'backup/gpt-4o', reason: 'budget' })).toBe(4);
    expect(await metric(gw.url, 'stormgate_retry_count_total')).toBe(0);
    expect(await metric(gw.url, 'stormgate_fallback_requests_total')).toBe(4);
  });

  it('shows the retries left in the window: ratio x requests, minus the retries taken', async () => {
    // A floor of 0, a ratio of 0.5: 10 requests allow 5 retries; the last two requests take 2.
    const mock = await startMock();
    const gw = await gateways(mock, { route: { budget: { ratio: 0.5, minRetriesPerSecond: 0, windowS: 60 } } });
    const client = sdk(gw.url);
    const got: Told[] = [];
    for (let i = 0; i < 8; i++) got.push(await chat(client));
    expect(await gauge(gw.url, 'stormgate_retry_budget_remaining', { route: 'chat' })).toBe(4);
    mock.setFaults({ errors: [{ status: 503, times: 2 }] });
    for (let i = 0; i < 2; i++) got.push(await chat(client));
    expect(got.map((t) => t.status)).toEqual(got.map(() => 200));
    expect(sumAttempts(got)).toBe(12);
    expect(await metric(gw.url, 'stormgate_retry_count_total')).toBe(2);
    expect(await gauge(gw.url, 'stormgate_retry_budget_remaining', { route: 'chat' })).toBe(3);
  });
});

describe('the breaker panels during a brownout and its recovery', () => {
  it('moves stormgate_breaker_state 0 -> 1 -> 2 -> 1 -> 2 -> 0 and counts one transition to each state, a failed probe none', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 503 }] } });
    const gw = await gateways(mock, {
      primary: { breaker: { consecutiveFailures: 3, openS: 1, closeAfter: 2, halfOpenProbes: 1 } },
      route: { retry: { maxAttempts: 1 } },
    });
    const client = sdk(gw.url);
    const T = 'primary/gpt-4o';
    const state = () => gauge(gw.url, 'stormgate_breaker_state', { target: T });
    const transitions = async () => ({
      open: await metric(gw.url, 'stormgate_breaker_transitions_total', { target: T, to: 'open' }),
      'half-open': await metric(gw.url, 'stormgate_breaker_transitions_total', { target: T, to: 'half-open' }),
      closed: await metric(gw.url, 'stormgate_breaker_transitions_total', { target: T, to: 'closed' }),
    });
    expect(await transitions()).toEqual({ open: 0, 'half-open': 0, closed: 0 });

    const browned: Told[] = [];
    for (let i = 0; i < 3; i++) browned.push(await chat(client));
    expect(browned.map((t) => t.status)).toEqual([503, 503, 503]);
    expect(await state()).toBe(1);
    expect(await transitions()).toEqual({ open: 1, 'half-open': 0, closed: 0 });
    // Open: turned away by the gateway, nothing upstream, an `unavailable` outcome and no upstream error.
    const turned = await all(4, () => chat(client));
    expect(turned.map((t) => [t.status, t.code, t.attempts])).toEqual(turned.map(() => [503, 'circuit_open', 0]));
    expect(chatHits(mock)).toHaveLength(3);
    expect(await metric(gw.url, 'stormgate_requests_total', { outcome: 'unavailable' })).toBe(4);

    // Its open time over, the gauge reads 2 before any request probes; that is not a transition.
    await until('the breaker reads half-open', async () => (await state()) === 2, 5_000);
    expect(await transitions()).toEqual({ open: 1, 'half-open': 0, closed: 0 });
    // The probe fails (the brownout goes on): open again for another openS, still not a change.
    expect((await chat(client)).status).toBe(503);
    expect(chatHits(mock)).toHaveLength(4);
    expect(await state()).toBe(1);
    expect(await transitions()).toEqual({ open: 1, 'half-open': 0, closed: 0 });

    // Recovery: the next probe succeeds (half-open), the second success closes it.
    mock.setFaults({});
    await until('the breaker reads half-open again', async () => (await state()) === 2, 5_000);
    expect((await chat(client)).status).toBe(200);
    expect(await transitions()).toEqual({ open: 1, 'half-open': 1, closed: 0 });
    expect(await state()).toBe(2);
    expect((await chat(client)).status).toBe(200);
    expect(await state()).toBe(0);
    expect(await transitions()).toEqual({ open: 1, 'half-open': 1, closed: 1 });
    expect(await metric(gw.url, 'stormgate_upstream_attempts_total', { target: T, status_class: '5xx' })).toBe(4);
    expect(await metric(gw.url, 'stormgate_upstream_attempts_total', { target: T, status_class: '2xx' })).toBe(2);
    expect(await metric(gw.url, 'stormgate_requests_total', { outcome: 'upstream_error' })).toBe(4);
  });

  it('sends newcomers to the backup while the primary breaker is open, each a hand-over for `breaker_open`', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 503 }] } });
    const backup = await startMock();
    const gw = await gateways(mock, { backup, primary: { breaker: { consecutiveFailures: 3, openS: 60 } }, route: { retry: { maxAttempts: 1 } } });
    const client = sdk(gw.url);
    const failing: Told[] = [];
    for (let i = 0; i < 3; i++) failing.push(await chat(client));
    expect(failing.map((t) => [t.status, t.attempts, t.fallback])).toEqual(failing.map(() => [200, 2, 'retries_exhausted']));
    expect(await gauge(gw.url, 'stormgate_breaker_state', { target: 'primary/gpt-4o' })).toBe(1);
    const newcomers = await all(4, () => chat(client));
    expect(newcomers.map((t) => [t.status, t.attempts, t.fallback])).toEqual(newcomers.map(() => [200, 1, 'breaker_open']));
    expect(await metric(gw.url, 'stormgate_fallbacks_total', { from: 'primary/gpt-4o', to: 'backup/gpt-4o', reason: 'retries_exhausted' })).toBe(3);
    expect(await metric(gw.url, 'stormgate_fallbacks_total', { from: 'primary/gpt-4o', to: 'backup/gpt-4o', reason: 'breaker_open' })).toBe(4);
    expect(await metric(gw.url, 'stormgate_fallback_requests_total')).toBe(7);
    expect(await gauge(gw.url, 'stormgate_fallback_rate', { route: 'chat' })).toBe(1);
    // Only the three that tried the primary needed more than one attempt; a fallback's first attempt is no retry.
    expect(await metric(gw.url, 'stormgate_retried_requests_total', { result: 'success' })).toBe(3);
    expect(await metric(gw.url, 'stormgate_retry_count_total')).toBe(0);
    expect(chatHits(mock)).toHaveLength(3);
  });

  it('never moves the breaker on bare 429s: the provider is there, refusing', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 429 }] } });
    const gw = await gateways(mock, { primary: { breaker: { consecutiveFailures: 2, minRequests: 2 } }, route: { retry: { maxAttempts: 1 } } });
    const got = await all(8, () => chat(sdk(gw.url)));
    expect(got.map((t) => t.status)).toEqual(got.map(() => 429));
    expect(await gauge(gw.url, 'stormgate_breaker_state', { target: 'primary/gpt-4o' })).toBe(0);
    expect(await metric(gw.url, 'stormgate_breaker_transitions_total')).toBe(0);
    expect(await metric(gw.url, 'stormgate_upstream_attempts_total', { status_class: '4xx' })).toBe(8);
    expect(await metric(gw.url, 'stormgate_requests_total', { outcome: 'upstream_error' })).toBe(8);
  });

  it('shows parked requests while the breaker is open, and each leaves the lot once, released, with no retry counted', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 503, times: 3 }], latencyMs: 20 } });
    const gw = await gateways(mock, {
      primary: { breaker: { consecutiveFailures: 3, openS: 30, probeWhileParkedMs: 1_500, closeAfter: 1 } },
      route: { retry: { maxAttempts: 1 }, park: {} },
    });
    const client = sdk(gw.url);
    for (let i = 0; i < 3; i++) expect((await chat(client)).status).toBe(503);
    expect(await gauge(gw.url, 'stormgate_breaker_state', { target: 'primary/gpt-4o' })).toBe(1);
    const parked = all(6, () => chat(client));
    await until('six requests parked', async () => (await gauge(gw.url, 'stormgate_parked_requests', { route: 'chat' })) === 6, 3_000);
    expect(chatHits(mock)).toHaveLength(3);
    const got = await parked;
    expect(got.map((t) => [t.status, t.attempts, t.fallback])).toEqual(got.map(() => [200, 1, null]));
    expect(await gauge(gw.url, 'stormgate_parked_requests', { route: 'chat' })).toBe(0);
    expect(await metric(gw.url, 'stormgate_park_outcomes_total', { route: 'chat', outcome: 'released' })).toBe(6);
    expect(await metric(gw.url, 'stormgate_park_outcomes_total', { route: 'chat' })).toBe(6);
    expect(await metric(gw.url, 'stormgate_retry_count_total')).toBe(0);
    expect(await gauge(gw.url, 'stormgate_breaker_state', { target: 'primary/gpt-4o' })).toBe(0);
    expect(chatHits(mock)).toHaveLength(9);
  });
});

describe('hold-offs as the panels show them', () => {
  it('sends newcomers to the backup while the primary is held off, each a hand-over for `held_off`, and nothing to the primary', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '3' } }] } });
    const backup = await startMock();
    // Parking on (the default): the request that got the hint moves on only where it can come back.
    const gw = await gateways(mock, { backup, route: { park: {} } });
    const client = sdk(gw.url);
    const first = await chat(client);
    expect([first.status, first.attempts, first.fallback]).toEqual([200, 2, 'held_off']);
    const newcomers = await all(5, () => chat(client));
    expect(newcomers.map((t) => [t.status, t.attempts, t.fallback, t.target])).toEqual(newcomers.map(() => [200, 1, 'held_off', 'backup/gpt-4o']));
    expect(chatHits(mock)).toHaveLength(1);
    expect(await metric(gw.url, 'stormgate_fallbacks_total', { from: 'primary/gpt-4o', to: 'backup/gpt-4o', reason: 'held_off' })).toBe(6);
    expect(await metric(gw.url, 'stormgate_fallback_requests_total')).toBe(6);
    expect(await gauge(gw.url, 'stormgate_fallback_rate', { route: 'chat' })).toBe(1);
    expect(await metric(gw.url, 'stormgate_retry_count_total')).toBe(0);
    expect(await metric(gw.url, 'stormgate_retry_budget_exhausted_total')).toBe(0);
    // Retried requests: the first (two attempts); the newcomers made one each.
    expect(await metric(gw.url, 'stormgate_retried_requests_total', { result: 'success' })).toBe(1);
    expect(await metric(gw.url, 'stormgate_upstream_attempts_total', { target: 'primary/gpt-4o' })).toBe(1);
    expect(await metric(gw.url, 'stormgate_upstream_attempts_total', { target: 'backup/gpt-4o' })).toBe(6);
    // The held-off primary is named in each newcomer's log line as skipped, and is a hand-over all the same.
    const lines = await requestLines(gw.logs[0]!, 6);
    expect(lines.filter((l) => JSON.stringify(l.skipped ?? []).includes('primary/gpt-4o'))).toHaveLength(5);
  });

  it('counts a retry that waited out a wait hint, and never refuses it, however spent the budget', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 429, times: 3, headers: { 'retry-after-ms': '200' } }] } });
    const gw = await gateways(mock, { route: { budget: { ratio: 0, minRetriesPerSecond: 0 }, park: {} } });
    const got = await all(3, () => chat(sdk(gw.url)));
    expect(got.map((t) => [t.status, t.attempts])).toEqual(got.map(() => [200, 2]));
    expect(await metric(gw.url, 'stormgate_retry_count_total', { target: 'primary/gpt-4o', reason: 'status_429' })).toBe(3);
    expect(await metric(gw.url, 'stormgate_retry_budget_exhausted_total')).toBe(0);
    expect(await metric(gw.url, 'stormgate_retried_requests_total', { result: 'success' })).toBe(3);
  });

  it('turns newcomers away with 429 provider_held_off, outcome `unavailable`, nothing upstream, when nothing else can take them', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '5' } }] } });
    const gw = await gateways(mock, { route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5 }, maxWaitHintMs: 500 } } });
    const client = sdk(gw.url);
    const first = await chat(client);
    expect([first.status, first.attempts, first.shouldRetry]).toEqual([429, 1, 'true']);
    const turned = await all(4, () => chat(client));
    expect(turned.map((t) => [t.status, t.code, t.shouldRetry])).toEqual(turned.map(() => [429, 'provider_held_off', 'true']));
    expect(chatHits(mock)).toHaveLength(1);
    expect(await metric(gw.url, 'stormgate_requests_total', { route: 'chat', outcome: 'unavailable' })).toBe(4);
    expect(await metric(gw.url, 'stormgate_requests_total', { route: 'chat', outcome: 'upstream_error' })).toBe(1);
    expect(await metric(gw.url, 'stormgate_upstream_attempts_total')).toBe(1);
    expect(await metric(gw.url, 'stormgate_retry_count_total')).toBe(0);
    expect(await metric(gw.url, 'stormgate_retry_budget_exhausted_total')).toBe(0);
    const lines = await requestLines(gw.logs[0]!, 5);
    expect(lines.find((l) => l.status === 429 && l.outcome === 'upstream_error')?.retriesStopped).toBe('wait_hint');
  });
});

describe('the pool panels during a batch flood', () => {
  it('shows 4 in use and 3 queued for a batch class of maxQueue 3, sheds the rest with 429 load_shed, counted once each', async () => {
    const mock = await startMock({ faults: { latencyMs: 1_200 } });
    const gw = await gateways(mock, {
      primary: { pools: { maxConcurrent: 4, classes: { online: { minShare: 0.5, maxQueue: 10 }, batch: { minShare: 0.1, maxQueue: 3 } } } },
    });
    const client = sdk(gw.url);
    const BATCH = { headers: { 'x-stormgate-priority': 'batch' } };
    const flood = all(20, () => chat(client, 'gpt-4o', BATCH));
    await until('four batch requests upstream', () => mock.stats().inflight === 4, 5_000);
    await until('the batch queue reported full', async () => (await gauge(gw.url, 'stormgate_pool_queue_depth', { provider: 'primary', priority: 'batch' })) === 3, 3_000);
    expect(await gauge(gw.url, 'stormgate_pool_in_use', { provider: 'primary', priority: 'batch' })).toBe(4);
    expect(await gauge(gw.url, 'stormgate_pool_in_use', { provider: 'primary', priority: 'online' })).toBe(0);
    expect(await gauge(gw.url, 'stormgate_pool_limit', { target: 'primary/gpt-4o' })).toBe(4);
    // Online, sent into the flood, queues ahead of the batch backlog.
    const online = all(2, () => chat(client));
    await until('online queued', async () => (await gauge(gw.url, 'stormgate_pool_queue_depth', { provider: 'primary', priority: 'online' })) === 2, 3_000);
    const got = await flood;
    const onlineGot = await online;
    expect(onlineGot.map((t) => t.status)).toEqual([200, 200]);
    const shed = got.filter((t) => t.status === 429);
    expect(shed).toHaveLength(13);
    expect(shed.map((t) => [t.code, t.shouldRetry, t.attempts])).toEqual(shed.map(() => ['load_shed', 'true', 0]));
    expect(got.filter((t) => t.status === 200)).toHaveLength(7);
    expect(await metric(gw.url, 'stormgate_shed_total', { priority: 'batch', reason: 'queue_full' })).toBe(13);
    expect(await metric(gw.url, 'stormgate_shed_total', { priority: 'online' })).toBe(0);
    expect(await metric(gw.url, 'stormgate_requests_total', { route: 'chat', priority: 'batch', outcome: 'shed' })).toBe(13);
    expect(await metric(gw.url, 'stormgate_requests_total', { route: 'chat', priority: 'online', outcome: 'success' })).toBe(2);
    // Every attempt that got a slot waited (or not) once; the shed ones none.
    expect(await metric(gw.url, 'stormgate_pool_wait_seconds_count', { provider: 'primary', priority: 'batch' })).toBe(7);
    expect(await metric(gw.url, 'stormgate_pool_wait_seconds_count', { provider: 'primary', priority: 'online' })).toBe(2);
    expect(await metric(gw.url, 'stormgate_upstream_attempts_total')).toBe(9);
    expect(mock.stats().maxInflight).toBeLessThanOrEqual(4);
    // Online was served before the batch queue: its two answers came in the second wave, before the last batch ones.
    expect(await gauge(gw.url, 'stormgate_pool_in_use', { provider: 'primary', priority: 'batch' })).toBe(0);
    expect(await gauge(gw.url, 'stormgate_pool_queue_depth', { provider: 'primary', priority: 'batch' })).toBe(0);
  });
});

describe('clients that leave (ghost request prevention)', () => {
  it('counts a client that left mid-answer as client_gone, cancels its upstream request, and counts no upstream failure', async () => {
    const mock = await startMock({ faults: { latencyMs: 2_000 } });
    const gw = await gateways(mock, { primary: { breaker: { consecutiveFailures: 2, minRequests: 2, slowCallMs: 5000 } } });
    const client = sdk(gw.url);
    const got = await all(6, async () => {
      const ac = new AbortController();
      setTimeout(() => ac.abort(), 300);
      return chat(client, 'gpt-4o', { signal: ac.signal }).catch((e: unknown) => (e instanceof OpenAI.APIUserAbortError ? 'aborted' : Promise.reject(e)));
    });
    expect(got).toEqual(got.map(() => 'aborted'));
    await until('the mock saw every request leave', () => mock.stats().aborted === 6, 3_000);
    await requestLines(gw.logs[0]!, 6);
    expect(await metric(gw.url, 'stormgate_requests_total', { route: 'chat', outcome: 'client_gone' })).toBe(6);
    expect(await metric(gw.url, 'stormgate_requests_total', { route: 'chat' })).toBe(6);
    expect(await metric(gw.url, 'stormgate_upstream_attempts_total', { status_class: '5xx' })).toBe(0);
    expect(await metric(gw.url, 'stormgate_upstream_attempts_total', { status_class: 'aborted' })).toBe(6);
    expect(await metric(gw.url, 'stormgate_upstream_attempts_total')).toBe(6);
    expect(await metric(gw.url, 'stormgate_retry_count_total')).toBe(0);
    expect(await metric(gw.url, 'stormgate_retried_requests_total')).toBe(0);
    expect(await metric(gw.url, 'stormgate_breaker_transitions_total')).toBe(0);
    expect(await gauge(gw.url, 'stormgate_breaker_state', { target: 'primary/gpt-4o' })).toBe(0);
    // Out of the per-instance rates: nothing else came, so neither gauge has a value.
    expect(await gauge(gw.url, 'stormgate_fallback_rate', { route: 'chat' })).toBeUndefined();
    expect(await gauge(gw.url, 'stormgate_retry_success_rate', { route: 'chat' })).toBeUndefined();
    expect(chatHits(mock)).toHaveLength(6);
  });

  it('sends nothing upstream for a client that left while queued for a pool slot', async () => {
    const mock = await startMock({ faults: { latencyMs: 1_500 } });
    const gw = await gateways(mock, { primary: { pools: { maxConcurrent: 1 } } });
    const client = sdk(gw.url);
    const holder = chat(client);
    await until('the slot taken', () => mock.stats().inflight === 1, 3_000);
    const left = await all(3, async () => {
      const ac = new AbortController();
      setTimeout(() => ac.abort(), 300);
      return chat(client, 'gpt-4o', { signal: ac.signal }).catch((e: unknown) => (e instanceof OpenAI.APIUserAbortError ? 'aborted' : Promise.reject(e)));
    });
    expect(left).toEqual(['aborted', 'aborted', 'aborted']);
    expect((await holder).status).toBe(200);
    await requestLines(gw.logs[0]!, 4);
    expect(chatHits(mock)).toHaveLength(1);
    expect(await metric(gw.url, 'stormgate_upstream_attempts_total')).toBe(1);
    expect(await metric(gw.url, 'stormgate_requests_total', { outcome: 'client_gone' })).toBe(3);
    expect(await metric(gw.url, 'stormgate_pool_wait_seconds_count', { provider: 'primary' })).toBe(1);
    expect(await gauge(gw.url, 'stormgate_pool_queue_depth', { provider: 'primary', priority: 'online' })).toBe(0);
    expect(await gauge(gw.url, 'stormgate_fallback_rate', { route: 'chat' })).toBe(0);
  });

  it('counts a stream whose client left mid-answer as client-gone in the stream ends, and no stream error', async () => {
    const mock = await startMock({ faults: { stream: { chunks: 30, chunkDelayMs: 100 } } });
    const gw = await gateways(mock);
    const client = sdk(gw.url);
    await all(3, async () => {
      const ac = new AbortController();
      const stream = await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }, { signal: ac.signal });
      let n = 0;
      try {
        for await (const _ of stream) if (++n === 3) ac.abort();
      } catch (e) {
        if (!(e instanceof OpenAI.APIUserAbortError)) throw e;
      }
    });
    await until('three request lines', async () => (await metric(gw.url, 'stormgate_requests_total', { outcome: 'client_gone' })) === 3, 5_000);
    expect(await metric(gw.url, 'stormgate_stream_ends_total', { route: 'chat', end: 'client-gone' })).toBe(3);
    expect(await metric(gw.url, 'stormgate_stream_ends_total', { route: 'chat' })).toBe(3);
    expect(await metric(gw.url, 'stormgate_requests_total', { outcome: 'stream_error' })).toBe(0);
    expect(await metric(gw.url, 'stormgate_ttft_seconds_count', { route: 'chat' })).toBe(3);
    await until('the mock saw the streams end', () => mock.requests().every((r) => r.endedAt !== undefined), 3_000);
    expect(mock.requests().every((r) => r.aborted && (r.chunksSent ?? 0) < 30)).toBe(true);
  });
});

describe('streams cut after the first byte', () => {
  it('are stream errors with an error event, never retried: stream_ends cut, attempts 2xx, no retry counted', async () => {
    const mock = await startMock({ faults: { stream: { chunks: 6, cutAfterChunks: 2 } } });
    const gw = await gateways(mock);
    const got = await all(4, () => chatStream(sdk(gw.url)));
    expect(got.map((t) => [t.status, t.attempts, t.broke])).toEqual(got.map(() => [200, 1, true]));
    await until('four stream ends', async () => (await metric(gw.url, 'stormgate_stream_ends_total', { route: 'chat', end: 'cut' })) === 4, 3_000);
    expect(await metric(gw.url, 'stormgate_requests_total', { route: 'chat', outcome: 'stream_error' })).toBe(4);
    expect(await metric(gw.url, 'stormgate_retry_count_total')).toBe(0);
    expect(await metric(gw.url, 'stormgate_upstream_attempts_total', { status_class: '2xx' })).toBe(4);
    expect(await metric(gw.url, 'stormgate_upstream_attempts_total', { status_class: 'bad_stream' })).toBe(0);
    expect(await metric(gw.url, 'stormgate_retried_requests_total')).toBe(0);
    expect(chatHits(mock)).toHaveLength(4);
  });

  it('retries a stream broken before its first output, as bad_stream, and the client sees one whole stream', async () => {
    // Every odd request: the headers of a stream, then the connection closed before any content; the others whole.
    const fake = await startFake(scripted((_body, n) => (n % 2 === 1 ? { steps: [20, { destroy: true }] } : streamed('whole'))));
    const gw = await gateways(`${fake.origin}/v1`);
    const client = sdk(gw.url);
    const got: Array<Told & { broke: boolean }> = [];
    for (let i = 0; i < 3; i++) got.push(await chatStream(client));
    expect(got.map((t) => [t.status, t.attempts, t.broke])).toEqual(got.map(() => [200, 2, false]));
    expect(await metric(gw.url, 'stormgate_upstream_attempts_total', { status_class: 'bad_stream' })).toBe(3);
    expect(await metric(gw.url, 'stormgate_retry_count_total', { reason: 'bad_stream' })).toBe(3);
    expect(await metric(gw.url, 'stormgate_retry_count_total')).toBe(3);
    await until('three stream ends', async () => (await metric(gw.url, 'stormgate_stream_ends_total', { route: 'chat', end: 'complete' })) === 3, 3_000);
    expect(await metric(gw.url, 'stormgate_stream_ends_total', { route: 'chat' })).toBe(3);
  });
});

describe('label cardinality', () => {
  it('puts no request id, client key or provider key on /metrics, even when an upstream error body quotes the provider key', async () => {
    const PROVIDER_KEY = 'sk-proj-Zq81LeakedInErrorBody4u7TvX';
    const CLIENT_KEY = 'sk-agent-client-Wm3kP9';
    let n = 0;
    const fake = await startFake(
      scripted(() =>
        ++n % 2 === 1
          ? json(401, { error: { message: `Incorrect API key provided: ${PROVIDER_KEY}. You can find your API key at https://platform.openai.com/account/api-keys.`, type: 'invalid_request_error', param: null, code: 'invalid_api_key' } })
          : json(500, { error: { message: `upstream crashed handling key ${PROVIDER_KEY}`, type: 'server_error', param: null, code: null } }),
      ),
    );
    const mock = await startMock();
    const gw = await gateways(`${fake.origin}/v1`, {
      backup: mock,
      primary: { apiKey: PROVIDER_KEY, authHoldS: 0.2 },
      extra: (c) => {
        c.auth = { keys: { agents: CLIENT_KEY } };
      },
    });
    const client = sdk(gw.url, { apiKey: CLIENT_KEY });
    const ids = Array.from({ length: 6 }, (_, i) => `trace-${i}-7f3a9c2e-b1d4-4e8a-9f00-${String(i).padStart(12, '0')}`);
    const got: Told[] = [];
    for (const id of ids) {
      got.push(await chat(client, 'gpt-4o', { headers: { 'x-request-id': id } }));
      await sleep(250);
    }
    expect(got.every((t) => t.status === 200)).toBe(true);
    const text = await (await fetch(`${gw.url}/metrics`)).text();
    for (const secret of [PROVIDER_KEY, CLIENT_KEY, PROVIDER_KEY.slice(-12), 'LeakedInErrorBody', ...ids, ...got.map((t) => t.requestId!)]) expect(text).not.toContain(secret);
    const targets = new Set(parseMetrics(text).flatMap((s) => [s.labels.target, s.labels.from, s.labels.to]).filter((x) => x !== undefined));
    expect([...targets].sort()).toEqual(['backup/gpt-4o', 'backup/gpt-4o-mini', 'none', 'primary/gpt-4o', 'primary/gpt-4o-mini']);
    // The refused key held the target, as the credentials gauge says, and the breaker stayed closed for it.
    expect(await metric(gw.url, 'stormgate_fallbacks_total', { reason: 'credentials' })).toBeGreaterThan(0);
    expect(await metric(gw.url, 'stormgate_breaker_transitions_total', { target: 'primary/gpt-4o', to: 'open' })).toBe(0);
  });

  it('keeps made-up model names off the labels: a route of named models answers 404, a route of any model shares <provider>/other past 32', async () => {
    const mock = await startMock();
    const gw = await gateways(mock, {
      extra: (c) => {
        c.routes.push({ name: 'any', match: { path: '/v1/completions' }, targets: [{ provider: 'primary' }], ...QUIET_ROUTE });
      },
    });
    const client = sdk(gw.url);
    const named = await all(5, (i) => chat(client, `made-up-chat-model-${i}`));
    expect(named.map((t) => [t.status, t.code])).toEqual(named.map(() => [404, 'model_not_found']));
    const huge = `gpt-${'x'.repeat(300)}`;
    for (let i = 0; i < 40; i++) await client.completions.create({ model: `tenant-model-${i}`, prompt: 'hi' });
    await client.completions.create({ model: huge, prompt: 'hi' });
    await client.completions.create({ model: 'has "quotes" and\nnewline', prompt: 'hi' }).catch(() => undefined);
    const samples = await scrape(gw.url);
    const targets = new Set(samples.flatMap((s) => [s.labels.target, s.labels.from, s.labels.to]).filter((x): x is string => x !== undefined));
    expect([...targets].filter((t) => t.includes('made-up'))).toEqual([]);
    expect([...targets].filter((t) => t.includes('xxxxxxxx'))).toEqual([]);
    expect([...targets].filter((t) => t.includes('quotes'))).toEqual([]);
    const learned = [...targets].filter((t) => t.startsWith('primary/tenant-model-'));
    expect(learned).toHaveLength(32);
    expect(targets.has('primary/other')).toBe(true);
    expect(await metric(gw.url, 'stormgate_requests_total', { route: 'any', target: 'primary/other', outcome: 'success' })).toBeGreaterThanOrEqual(9);
    // The 404s are the gateway's own refusals before any route took them.
    expect(await metric(gw.url, 'stormgate_requests_total', { route: 'none', outcome: 'rejected' })).toBe(5);
    for (const s of samples) for (const v of Object.values(s.labels)) expect(v.length, `${s.name} ${JSON.stringify(s.labels)}`).toBeLessThanOrEqual(160);
  });
});

describe('every metric and label of the README table', () => {
  /** The README's metrics table: each row's names and its labels (parenthesised values dropped). */
  function readmeTable(): Array<{ name: string; labels: string[] }> {
    const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
    const rows = readme.split('\n').filter((l) => /^\s*\| `stormgate_/.test(l));
    return rows.flatMap((row) => {
      const cells = row.split('|').map((c) => c.trim());
      const names = [...cells[1]!.matchAll(/`(stormgate_\w+)`/g)].map((m) => m[1]!);
      const labels = cells[3]!
        .replace(/\([^)]*\)/g, '')
        .split(',')
        .map((l) => l.trim())
        .filter((l) => l !== '');
      return names.map((name) => ({ name, labels }));
    });
  }

  it('exports each one, with exactly the labels the table names, after traffic that should produce it', async () => {
    const table = readmeTable();
    expect(table.length).toBeGreaterThanOrEqual(27);
    const mock = await startMock({ faults: { models: { 'gpt-4o-mini': { errors: [{ status: 503, rate: 0.5, firstAttemptsOnly: true }] } } } });
    const backup = await startMock();
    const gw = await gateways(mock, {
      backup,
      primary: { breaker: { consecutiveFailures: 5 } },
      route: { degraded: { message: 'busy' }, park: {} },
      // A client key with a rate (README "Client keys"), so the client-limit counter has a client to count.
      // A passthrough path, so its counter has a path to count.
      extra: (c) => {
        c.auth = { keys: { agents: 'sk-agent-7Hq2' }, limits: { agents: { requestsPerMinute: 1, burst: 4 } } };
        c.passthrough = { provider: 'primary', paths: ['/v1/files'] };
      },
    });
    const client = sdk(gw.url);
    await chat(client, 'gpt-4o');
    await chat(client, 'gpt-4o-mini');
    await chat(client, 'gpt-4o-mini');
    await chatStream(client, 'gpt-4o');
    expect((await chat(client, 'gpt-4o')).code).toBe('client_rate_limited');
    const samples = await scrape(gw.url);
    const missing: string[] = [];
    for (const { name, labels } of table) {
      const histogram = samples.some((s) => s.name === `${name}_bucket`);
      const series = samples.filter((s) => s.name === (histogram ? `${name}_count` : name));
      if (series.length === 0) {
        missing.push(`${name}: no series`);
        continue;
      }
      for (const s of series) {
        const got = Object.keys(s.labels).sort();
        if (JSON.stringify(got) !== JSON.stringify([...labels].sort())) missing.push(`${name}: labels ${got.join(',')}, README ${labels.join(',')}`);
      }
    }
    expect(missing).toEqual([]);
    // And nothing exported under the prefix that the table leaves out.
    const documented = new Set(table.map((t) => t.name));
    const exported = new Set(samples.map((s) => s.name.replace(/_(bucket|sum|count)$/, '')).filter((n) => n.startsWith('stormgate_')));
    expect([...exported].filter((n) => !documented.has(n))).toEqual([]);
  });
});

describe('health, readiness and the state store', () => {
  it('keeps /healthz, /readyz and /metrics open behind client keys, and counts a request without a key as `rejected` with route none', async () => {
    const mock = await startMock();
    const gw = await gateways(mock, { extra: (c) => (c.auth = { keys: { agents: 'sk-agent-key-Rt5' } }) });
    for (const path of ['/healthz', '/readyz', '/metrics']) expect((await fetch(`${gw.url}${path}`)).status, path).toBe(200);
    expect(await (await fetch(`${gw.url}/readyz`)).json()).toMatchObject({ store: 'memory', degraded: false });
    const refused = await chat(sdk(gw.url, { apiKey: 'sk-wrong' }));
    expect([refused.status, refused.code]).toEqual([401, 'invalid_api_key']);
    expect(await metric(gw.url, 'stormgate_requests_total', { route: 'none', target: 'none', priority: 'none', outcome: 'rejected' })).toBe(1);
    expect(await metric(gw.url, 'stormgate_upstream_attempts_total')).toBe(0);
    expect(await gauge(gw.url, 'stormgate_state_degraded')).toBe(0);
  });

  it('serves on local state with stormgate_state_degraded 1 and /readyz degraded while Redis is away, and returns by itself', async () => {
    const redis = await startRedis();
    try {
      await redis.stop();
      const mock = await startMock();
      const gw = await gateways(mock, { redisUrl: redis.url });
      expect((await chat(sdk(gw.url))).status).toBe(200);
      expect(await gauge(gw.url, 'stormgate_state_degraded')).toBe(1);
      const ready = await fetch(`${gw.url}/readyz`);
      expect(ready.status).toBe(200);
      expect(await ready.json()).toMatchObject({ store: 'redis', degraded: true });
      await redis.restart();
      await until('the store back on Redis', async () => (await gauge(gw.url, 'stormgate_state_degraded')) === 0, 15_000);
      expect(await (await fetch(`${gw.url}/readyz`)).json()).toMatchObject({ store: 'redis', degraded: false });
    } finally {
      await redis.stop();
    }
  });
});

describe('a fleet of two gateways on one redis-server, scraped by one real Prometheus running the shipped rules', () => {
  it('sums both instances in the dashboard queries and recording rules, and counts one breaker opening fleet-wide once', async () => {
    // Every other first attempt fails with a 503 and is retried; gpt-4o-mini fails always, to open the breaker.
    const faults: FaultSpec = { models: { 'gpt-4o': { errors: [{ status: 503, rate: 0.5, firstAttemptsOnly: true }] }, 'gpt-4o-mini': { errors: [{ status: 503 }] } } };
    const mock = await startMock({ faults });
    const gw = await gateways(mock, {
      instances: 2,
      primary: { breaker: { consecutiveFailures: 3, openS: 60 } },
      route: { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5 } } },
    });
    let prom: PrometheusHandle | undefined;
    try {
      prom = await startPrometheus({ scrapeTargets: gw.urls.map((u) => new URL(u).host), ruleFiles: [SHIPPED.recordingRules, SHIPPED.alertRules] });
      const p = prom;
      const scalar = async (q: string): Promise<number | undefined> => {
        const r = await query(p.url, q);
        if (r.status !== 'success') throw new Error(`${q}: ${r.error}`);
        const result = r.data!.result as Array<{ value: [number, string] }>;
        if (result.length > 1) throw new Error(`${q}: ${result.length} series`);
        return result[0] ? Number(result[0].value[1]) : undefined;
      };
      // Both instances scraped twice at their zeroed counters before any traffic (increase() counts from there).
      await until('both instances scraped twice', async () => (await scalar('sum(count_over_time(up{job="stormgate"}[1m]))')) !== undefined && (await scalar('min(count_over_time(up[1m]))'))! >= 2, 20_000);

      const clients = gw.urls.map((u) => sdk(u));
      const got = (await Promise.all(clients.map((c) => all(10, () => chat(c, 'gpt-4o'))))).flat();
      expect(got.map((t) => t.status)).toEqual(got.map(() => 200));
      const retries = sumAttempts(got) - got.length;
      expect(retries).toBe(10);
      const perInstance = await Promise.all(gw.urls.map((u) => metric(u, 'stormgate_retry_count_total', { route: 'chat' })));
      expect(perInstance[0]! + perInstance[1]!).toBe(retries);

      await until(
        'Prometheus has the requests and retries of both',
        async () => (await scalar('sum(stormgate_retry_count_total{route="chat"})')) === retries && (await scalar('sum(stormgate_requests_total{route="chat"})')) === 20,
        10_000,
      );
      // The dashboard's own panels, with its variables as "All".
      const panels = dashboardQueries(readDashboard());
      const panel = (title: string, refId = 'A') => withoutGrafanaVariables(panels.find((q) => q.panel.endsWith(` ${title}`) && q.refId === refId)!.expr);
      const retriesByReason = await query(prom.url, panel('Retries by reason'));
      expect((retriesByReason.data!.result as Array<{ metric: Record<string, string> }>).map((r) => r.metric)).toContainEqual({ route: 'chat', reason: 'status_503' });
      // The rules' next evaluation after both instances' scrapes with every request in them.
      const scraped = Date.now() / 1000;
      await until('the recording rules evaluated after that', async () => ((await scalar('timestamp(stormgate:retried_requests:ratio_rate5m{route="chat"})')) ?? 0) > scraped + 0.5, 10_000);
      expect(await scalar('stormgate:retry_success:ratio_rate5m{route="chat"}')).toBe(1);
      // 10 of 20 requests retried, 10 retries for 20 requests, 30 attempts for 20: rates extrapolate each instance a
      // little differently, hence the tolerance.
      expect(await scalar('stormgate:retried_requests:ratio_rate5m{route="chat"}')).toBeCloseTo(0.5, 1);
      expect(await scalar('stormgate:retry:ratio_rate5m{route="chat"}')).toBeCloseTo(0.5, 1);
      expect(await scalar('stormgate:amplification:ratio_rate5m')).toBeCloseTo(1.5, 1);
      expect(await scalar('stormgate:fallback:ratio_rate5m{route="chat"}')).toBe(0);
      expect(await scalar(panel('State store'))).toBe(0);
      for (const u of gw.urls) expect(await (await fetch(`${u}/readyz`)).json()).toMatchObject({ store: 'redis', degraded: false });

      // A brownout of gpt-4o-mini seen by the first instance opens the breaker fleet-wide: one transition in all.
      // Three failures in a row: the first request's two attempts and the second's first; the second's retry then
      // finds the breaker open and ends with its 503, and the third is turned away.
      const browned: Told[] = [];
      for (let i = 0; i < 3; i++) browned.push(await chat(clients[0]!, 'gpt-4o-mini'));
      expect(browned.map((t) => [t.status, t.code ?? null, t.attempts])).toEqual([[503, 'service_unavailable', 2], [503, 'service_unavailable', 1], [503, 'circuit_open', 0]]);
      await until('both instances see the breaker open', async () => (await Promise.all(gw.urls.map((u) => gauge(u, 'stormgate_breaker_state', { target: 'primary/gpt-4o-mini' })))).every((v) => v === 1), 5_000);
      const onB = await chat(clients[1]!, 'gpt-4o-mini');
      expect([onB.status, onB.code]).toEqual([503, 'circuit_open']);
      await until('Prometheus has the opening', async () => (await scalar('sum(stormgate_breaker_transitions_total{target="primary/gpt-4o-mini", to="open"})')) === 1, 10_000);
      await sleep(1_500);
      expect(await scalar('sum(stormgate_breaker_transitions_total{target="primary/gpt-4o-mini", to="open"})')).toBe(1);
      const breakerPanel = await query(prom.url, panel('Breaker state per target'));
      const open = (breakerPanel.data!.result as Array<{ metric: Record<string, string>; value: [number, string] }>).find((r) => r.metric.target === 'primary/gpt-4o-mini');
      expect(open?.value[1]).toBe('1');
      expect(await scalar('count(stormgate_breaker_state{target="primary/gpt-4o-mini"} == 1)')).toBe(2);
      expect(await scalar('sum(stormgate_requests_total{route="chat", outcome="unavailable"})')).toBe(2);
      expect(await scalar('sum(stormgate_requests_total{route="chat", outcome="upstream_error"})')).toBe(2);
      expect(await scalar('sum(stormgate_upstream_attempts_total{target="primary/gpt-4o-mini"})')).toBe(3);
    } finally {
      await prom?.stop();
    }
  }, 60_000);
});
