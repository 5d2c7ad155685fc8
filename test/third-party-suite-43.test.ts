// Third-party failure-scenario suite 43: an outside QA team's suite, written from the README alone, driving the
// gateway with the official SDKs (`openai` 6.x, `@anthropic-ai/sdk`) and plain fetch against the bundled mock provider
// over real HTTP on 127.0.0.1, faults set at run time through its documented control endpoint (PUT /_mock/faults,
// POST /_mock/brownout) and ground truth read back from it (GET /_mock/requests, /_mock/stats). The scenarios are the
// ones the suites before it cover least:
//  1. Every backoff strategy of the Retries table as the provider sees it: 24 requests that fail together, the time
//     each one's retry reached the provider after its first attempt (no jitter: one herd; jitter: a spread).
//  2. Each brownout mode of the control endpoint (`hang`, `529` on an OpenAI path, `429`) through the openai SDK:
//     failover on a hung primary, the SDK's own timeout against a hang (no ghost attempt after the answer), the
//     engine-overloaded 503 passed on after the route's attempts, a 429 brownout's hold-off keeping the provider quiet.
//  3. The README's first incident compressed: a 1.5 s brownout under 60 agents that retry every 100 ms on their own.
//  4. The retry and fallback panels (stormgate_retry_count_total, stormgate_retry_success_rate,
//     stormgate_fallback_rate, stormgate_upstream_attempts_total) against the mock's own counts.
//  5. The Anthropic SDK on /v1/messages: 529 overloaded with and without a backup account, the mock's rate limit
//     (retry-after, anthropic-ratelimit-*), the gateway's own errors in the shape the SDK reads.
//  6. openai -> anthropic family failover through the openai SDK, whole and streamed.
//  7. Two gateway instances on one real redis-server started by the test: a breaker, a hold-off and an idempotency
//     key one instance learnt, obeyed by the other.
//  8. Clients that leave during the gateway's backoff; online requests behind a batch flood; the retry budget under
//     a crowd, on one instance and fleet-wide; a Python SDK's fractional x-stainless-read-timeout.
// Found here: no gateway bug (27 scenarios, run four times, twice with two copies of the file at once). One test was
// wrong at first and is kept as the README has it: a primary silent past `responseMs` is not retried when a backup can
// answer ("When a request moves on": `timeout`), whatever `maxAttempts` allows; the Retries section does not say so.
import { setTimeout as sleep } from 'node:timers/promises';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import type { MockServer } from '../src/mock/server.ts';
import { mockControl } from './helpers/mock-control.ts';
import { expectOpenAIError, sdkError } from './helpers/openai-error.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { scrapeMetrics, useExtraMocks, useGateways, type MetricSample } from './helpers/stack.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();
const redis = useRedisServer();

const KEY = 'sk-tp43-provider-0123456789';
const CLAUDE = 'claude-sonnet-5-5';
const hi = [{ role: 'user' as const, content: 'Where is my parcel?' }];
const chatBody = (extra: Record<string, unknown> = {}) => JSON.stringify({ model: 'gpt-4o', messages: hi, ...extra });

interface Logged {
  id: number;
  receivedAt: number;
  endedAt?: number;
  path: string;
  status?: number;
  aborted: boolean;
  model?: string;
  headers: Record<string, string>;
}

/** Every request the mock received, in order (GET /_mock/requests). */
async function mockLog(m: MockServer): Promise<Logged[]> {
  return (await (await fetch(`${m.url}/_mock/requests?limit=100000`)).json()) as Logged[];
}

interface Stats {
  total: number;
  byStatus: Record<string, number>;
  rateLimited: { requests: number; tokens: number };
}
async function mockStats(m: MockServer): Promise<Stats> {
  return (await (await fetch(`${m.url}/_mock/stats`)).json()) as Stats;
}

let prefixes = 0;
/** A gateway from YAML; `{{name}}` in it is replaced by that mock's URL. */
/** The plainest config: one chat route, one mock target, the route's defaults. */
const ONE_MOCK = `
server: { host: 127.0.0.1, port: 0 }
providers:
  mock: { family: openai, baseUrl: "{{m}}/v1", apiKey: ${KEY}, maxConnections: 64 }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: mock } ]
`;

async function gateway(yaml: string, mocks: Record<string, MockServer>, logs: string[] = []): Promise<string> {
  let text = yaml;
  for (const [name, m] of Object.entries(mocks)) text = text.replaceAll(`{{${name}}}`, m.url);
  return startGateway(parseConfig(text, 'suite43.yaml', {}), { logs });
}

function openai(url: string, opts: { maxRetries?: number; counter?: { requests: number }; headers?: Record<string, string> } = {}): OpenAI {
  return new OpenAI({
    baseURL: `${url}/v1`,
    apiKey: 'sk-tp43-client',
    maxRetries: opts.maxRetries ?? 0,
    logLevel: 'off',
    defaultHeaders: opts.headers,
    fetch: async (u, init) => {
      if (opts.counter) opts.counter.requests++;
      return fetch(u, init);
    },
  });
}

function anthropic(url: string, opts: { maxRetries?: number; counter?: { requests: number }; timeout?: number } = {}): Anthropic {
  return new Anthropic({
    baseURL: url,
    apiKey: 'sk-tp43-client',
    maxRetries: opts.maxRetries ?? 0,
    logLevel: 'off',
    timeout: opts.timeout,
    fetch: async (u: string | URL | Request, init?: RequestInit) => {
      if (opts.counter) opts.counter.requests++;
      return fetch(u, init);
    },
  });
}

const sum = (samples: MetricSample[], name: string, labels: Record<string, string> = {}) =>
  samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v)).reduce((a, s) => a + s.value, 0);

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- an answer is JSON: tests read whatever field they check
async function post(url: string, body = chatBody(), headers: Record<string, string> = {}): Promise<{ status: number; headers: Headers; body: any }> {
  const res = await fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    /* not JSON */
  }
  return { status: res.status, headers: res.headers, body: parsed };
}

/** One mock provider; a single-target chat route with the given retry settings and no breaker, parking or budget limit. */
function loopOnly(retry: string, extraProvider = '', extraRoute = ''): string {
  return `
server: { host: 127.0.0.1, port: 0, logLevel: info }
providers:
  mock: { family: openai, baseUrl: "{{m}}/v1", apiKey: ${KEY}, maxConnections: 64, breaker: false${extraProvider} }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: mock } ]
    retry: ${retry}
    budget: { ratio: 10, minRetriesPerSecond: 1000 }
    park: false
${extraRoute}`;
}

/** The wait between each request's first attempt and its retry, as the provider saw them (ms), one per request. */
function retryWaits(log: Logged[]): number[] {
  const byClient = new Map<string, Logged[]>();
  for (const r of log) {
    const id = r.headers['x-client-request-id']!;
    byClient.set(id, [...(byClient.get(id) ?? []), r]);
  }
  const waits: number[] = [];
  for (const rs of byClient.values()) {
    const first = rs.find((r) => !r.headers['x-retry-attempt']);
    const retry = rs.find((r) => r.headers['x-retry-attempt'] === '1');
    if (first && retry) waits.push(retry.receivedAt - (first.endedAt ?? first.receivedAt));
  }
  return waits;
}

async function herd(strategy: string, n = 24): Promise<number[]> {
  const m = await startMock();
  const url = await gateway(loopOnly(`{ maxAttempts: 2, retryOn: [503], backoff: { strategy: ${strategy}, baseMs: 600, capMs: 2400 } }`), { m });
  await mockControl(m, 'PUT', 'faults', { errors: [{ status: 503, firstAttemptsOnly: true }] });
  const answers = await Promise.all(Array.from({ length: n }, () => post(url)));
  expect(answers.map((a) => a.status)).toEqual(Array(n).fill(200));
  expect(answers.map((a) => a.headers.get('x-stormgate-attempts'))).toEqual(Array(n).fill('2'));
  const waits = retryWaits(await mockLog(m));
  expect(waits).toHaveLength(n);
  return waits;
}
const spread = (xs: number[]) => Math.max(...xs) - Math.min(...xs);
/** Every wait in [lo, hi). */
function expectEachWithin(waits: number[], lo: number, hi: number): void {
  for (const w of waits) {
    expect(w).toBeGreaterThanOrEqual(lo);
    expect(w).toBeLessThan(hi);
  }
}

describe('backoff strategies as the provider sees them: 24 requests that failed together', () => {
  it('fixed: every retry comes baseMs after its failure', async () => {
    const waits = await herd('fixed');
    expectEachWithin(waits, 580, 1100);
  });

  it('exponential (no jitter): the first retries all come back together, exp = baseMs after the failure: the herd', async () => {
    const waits = await herd('exponential');
    expectEachWithin(waits, 580, 1100);
    expect(spread(waits)).toBeLessThan(250);
  });

  it('full-jitter (the default): waits drawn from 0..exp, spread over most of it', async () => {
    const waits = await herd('full-jitter');
    for (const w of waits) expect(w).toBeLessThan(1100);
    expect(spread(waits)).toBeGreaterThan(250);
    expect(Math.min(...waits)).toBeLessThan(300);
  });

  it('equal-jitter: never less than exp/2, spread over exp/2..exp', async () => {
    const waits = await herd('equal-jitter');
    expectEachWithin(waits, 280, 1100);
    expect(spread(waits)).toBeGreaterThan(100);
  });

  it('decorrelated-jitter: never less than baseMs nor more than capMs, and spread', async () => {
    const waits = await herd('decorrelated-jitter');
    expectEachWithin(waits, 580, 2400 + 500);
    expect(spread(waits)).toBeGreaterThan(150);
  });
});

describe('the brownout modes of the control endpoint, through the openai SDK', () => {
  it('hang on the primary: responseMs ends the attempt, the silent target is not retried, the backup answers at once', async () => {
    const primary = await startMock();
    const backup = await startMock();
    const url = await gateway(
      `
server: { host: 127.0.0.1, port: 0 }
providers:
  primary: { family: openai, baseUrl: "{{p}}/v1", apiKey: ${KEY}, breaker: false, timeouts: { responseMs: 400 } }
  backup: { family: openai, baseUrl: "{{b}}/v1", apiKey: ${KEY}, breaker: false }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: primary }, { provider: backup } ]
    retry: { maxAttempts: 2, backoff: { strategy: fixed, baseMs: 50 } }
    budget: { ratio: 10, minRetriesPerSecond: 1000 }
    park: false
`,
      { p: primary, b: backup },
    );
    await mockControl(primary, 'POST', 'brownout', { mode: 'hang', durationMs: 20_000 });
    const counter = { requests: 0 };
    const started = Date.now();
    const { data, response } = await openai(url, { maxRetries: 2, counter }).chat.completions.create({ model: 'gpt-4o', messages: hi }).withResponse();
    expect(Date.now() - started).toBeLessThan(3_000);
    expect(data.choices[0]!.message.content).toBeTruthy();
    expect(counter.requests).toBe(1);
    // "When a request moves on": no answer within responseMs is `timeout`, and a silent target is not retried when
    // another can answer, whatever maxAttempts allows.
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(response.headers.get('x-stormgate-fallback')).toBe('timeout');
    expect(response.headers.get('x-stormgate-target')).toMatch(/^backup/);
    const sent = await mockLog(primary);
    expect(sent).toHaveLength(1);
    expect(sent.every((r) => r.aborted)).toBe(true);
    const metrics = await scrapeMetrics(url);
    expect(sum(metrics, 'stormgate_fallbacks_total', { reason: 'timeout' })).toBe(1);
    expect(sum(metrics, 'stormgate_upstream_attempts_total', { status_class: 'timeout' })).toBe(1);
    expect((await mockLog(backup)).length).toBe(1);
  });

  it("hang with no backup: the SDK's per-request timeout gets 504 deadline_exceeded before it fires, and no attempt starts after it", async () => {
    const m = await startMock();
    const url = await gateway(loopOnly('{ maxAttempts: 3 }'), { m });
    await mockControl(m, 'POST', 'brownout', { mode: 'hang', durationMs: 20_000 });
    const counter = { requests: 0 };
    const started = Date.now();
    const err = await sdkError(openai(url, { maxRetries: 2, counter }).chat.completions.create({ model: 'gpt-4o', messages: hi }, { timeout: 2_000 }));
    const answeredAt = Date.now();
    expect(answeredAt - started).toBeLessThan(2_000);
    expect(err.status).toBe(504);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expectOpenAIError(err.error ? { error: err.error } : {}, 'deadline_exceeded', (err.error as { type: string }).type);
    expect(counter.requests).toBe(1);
    await sleep(1_500);
    const sent = await mockLog(m);
    expect(sent.length).toBeGreaterThanOrEqual(1);
    expect(sent.filter((r) => r.receivedAt > answeredAt)).toEqual([]);
    expect(sent.every((r) => r.aborted)).toBe(true);
  });

  it('529 on an OpenAI path is the engine-overloaded 503: retried maxAttempts times, then passed on with x-should-retry false', async () => {
    const m = await startMock();
    const url = await gateway(loopOnly('{ maxAttempts: 3, backoff: { strategy: fixed, baseMs: 20 } }'), { m });
    await mockControl(m, 'POST', 'brownout', { mode: '529', durationMs: 20_000 });
    const counter = { requests: 0 };
    const err = await sdkError(openai(url, { maxRetries: 2, counter }).chat.completions.create({ model: 'gpt-4o', messages: hi }));
    expect(err.status).toBe(503);
    expect(err.message).toMatch(/overloaded/i);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.headers?.get('x-stormgate-attempts')).toBe('3');
    expect(counter.requests).toBe(1);
    const sent = await mockLog(m);
    expect(sent.map((r) => r.status)).toEqual([503, 503, 503]);
    expect(sent.map((r) => r.headers['x-retry-attempt'])).toEqual([undefined, '1', '2']);
    expect(sent.slice(1).map((r) => r.headers['x-retry-reason'])).toEqual(['status_503', 'status_503']);
  });

  it("a 429 brownout's retry-after holds the provider off: 20 agents, nothing reaches it during the pause, all answered", async () => {
    const m = await startMock();
    const url = await gateway(
      ONE_MOCK,
      { m },
    );
    await mockControl(m, 'POST', 'brownout', { mode: '429', durationMs: 1_500 });
    const counter = { requests: 0 };
    const client = openai(url, { maxRetries: 2, counter });
    const answers = await Promise.all(Array.from({ length: 20 }, () => client.chat.completions.create({ model: 'gpt-4o', messages: hi }, { timeout: 20_000 })));
    expect(answers.every((a) => a.choices[0]!.message.content)).toBe(true);
    expect(counter.requests).toBe(20);
    const sent = await mockLog(m);
    const t0 = sent[0]!.receivedAt;
    const first429 = sent.find((r) => r.status === 429)!;
    expect(first429).toBeDefined();
    // The hold-off is at least a second (the brownout's seconds left, at least 1): nothing goes in its middle.
    expect(sent.filter((r) => r.receivedAt > t0 + 300 && r.receivedAt < t0 + 1_000)).toEqual([]);
    expect(sent.length).toBeLessThanOrEqual(2 * 20 + 5);
  });
});

describe('retries bounded and spread under a crowd', () => {
  it('the retry budget caps a storm: 40 calls against a dead provider cost at most 40 + 10% + the floor upstream', async () => {
    const m = await startMock();
    const logs: string[] = [];
    const url = await gateway(
      `
server: { host: 127.0.0.1, port: 0 }
providers:
  mock: { family: openai, baseUrl: "{{m}}/v1", apiKey: ${KEY}, maxConnections: 64, breaker: false }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: mock } ]
    retry: { maxAttempts: 3, backoff: { strategy: fixed, baseMs: 20 } }
    budget: { minRetriesPerSecond: 1 }
    park: false
`,
      { m },
      logs,
    );
    await mockControl(m, 'POST', 'brownout', { mode: '503', durationMs: 20_000 });
    const answers = await Promise.all(Array.from({ length: 40 }, (_, i) => post(url, chatBody({ user: `u${i}` }))));
    expect(answers.every((a) => a.status === 503 && a.headers.get('x-should-retry') === 'false')).toBe(true);
    const stats = await mockStats(m);
    // The budget: ratio 0.1 of 40 requests, plus a floor of 1 a second over a 10 s window: 14 retries at most (the
    // default floor, 10 a second, would let all 80 through: with the breaker off, only the ratio binds at scale).
    expect(stats.total).toBeLessThanOrEqual(40 + 4 + 10);
    expect(stats.total).toBeGreaterThan(40);
    const metrics = await scrapeMetrics(url);
    const retries = sum(metrics, 'stormgate_retry_count_total');
    expect(retries).toBe(stats.total - 40);
    expect(sum(metrics, 'stormgate_retry_budget_exhausted_total')).toBeGreaterThan(0);
    const lines = logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.route === 'chat');
    expect(lines).toHaveLength(40);
    expect(lines.filter((l) => l.retriesStopped === 'budget').length).toBeGreaterThan(0);
  });

  it("30 requests held off by retry-after: 1 together come back spread over the hint's spread, not in one burst", async () => {
    const m = await startMock();
    const url = await gateway(
      `
server: { host: 127.0.0.1, port: 0 }
providers:
  mock: { family: openai, baseUrl: "{{m}}/v1", apiKey: ${KEY}, maxConnections: 64, breaker: false }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: mock } ]
`,
      { m },
    );
    // Every request in the next 0.9 s gets 429 with retry-after: 1 (the brownout's seconds left, at least 1).
    await mockControl(m, 'POST', 'brownout', { mode: '429', durationMs: 900 });
    const answers = await Promise.all(Array.from({ length: 30 }, () => post(url)));
    // Park is on: the requests that got the hint wait it out, those that came during the hold-off park for its end.
    expect(answers.map((a) => a.status)).toEqual(Array(30).fill(200));
    const sent = await mockLog(m);
    const firstHint = Math.min(...sent.filter((r) => r.status === 429).map((r) => r.endedAt ?? r.receivedAt));
    const back = sent.filter((r) => r.status === 200).map((r) => r.receivedAt - firstHint);
    expect(back).toHaveLength(30);
    expect(Math.min(...back)).toBeGreaterThanOrEqual(900);
    expect(Math.max(...back)).toBeLessThan(1_200 + 1_000);
    // hint x U(1, 1.2) for the ones told, a release window of a fifth of the pause for the parked: not one burst.
    expect(spread(back)).toBeGreaterThan(80);
    expect(sent.filter((r) => r.status === 429).length).toBeLessThanOrEqual(30);
  });

  it("the Python SDK's x-stainless-read-timeout (fractional seconds) sets the deadline: 504 before 1.5 s on a hang", async () => {
    const m = await startMock();
    const url = await gateway(loopOnly('{ maxAttempts: 3 }'), { m });
    await mockControl(m, 'POST', 'brownout', { mode: 'hang', durationMs: 20_000 });
    const started = Date.now();
    const r = await post(url, chatBody(), { 'x-stainless-read-timeout': '1.5' });
    const took = Date.now() - started;
    expect(r.status).toBe(504);
    expectOpenAIError(r.body, 'deadline_exceeded', (r.body as { error: { type: string } }).error.type);
    expect(r.headers.get('x-should-retry')).toBe('false');
    expect(took).toBeGreaterThanOrEqual(1_000);
    expect(took).toBeLessThan(1_500);
  });
});

describe('incident 1 compressed: a 1.5 s brownout under 60 agents that retry every 100 ms on their own', () => {
  it('the provider sees the first wave, the probes and one answer per agent, not an attempt per agent per 100 ms', async () => {
    const m = await startMock();
    const url = await gateway(
      ONE_MOCK,
      { m },
    );
    await mockControl(m, 'POST', 'brownout', { mode: '503', durationMs: 1_500 });
    const brownoutEnd = Date.now() + 1_500;
    const counter = { requests: 0 };
    const client = openai(url, { counter });
    let done = 0;
    const agent = async (i: number) => {
      const until = Date.now() + 20_000;
      while (Date.now() < until) {
        try {
          await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: `agent ${i}` }] }, { timeout: 20_000 });
          done++;
          return;
        } catch {
          await sleep(100);
        }
      }
    };
    await Promise.all(Array.from({ length: 60 }, (_, i) => agent(i)));
    expect(done).toBe(60);
    const sent = await mockLog(m);
    const stats = await mockStats(m);
    // Without the gateway: 60 agents x 15 tries in 1.5 s = 900 upstream requests. Through it: the first wave, the
    // budget's retries, the probes, and one success per agent.
    expect(stats.byStatus['200']).toBe(60);
    expect(stats.total).toBeLessThanOrEqual(60 + 60 + 30);
    // While the breaker is open, only probes go: the last 0.8 s of the brownout sees a handful at most.
    expect(sent.filter((r) => r.receivedAt > brownoutEnd - 800 && r.receivedAt < brownoutEnd).length).toBeLessThanOrEqual(5);
    const metrics = await scrapeMetrics(url);
    expect(sum(metrics, 'stormgate_upstream_attempts_total')).toBe(stats.total);
    expect(sum(metrics, 'stormgate_requests_total')).toBe(counter.requests);
    expect(sum(metrics, 'stormgate_requests_total', { outcome: 'success' })).toBe(60);
    // Every agent's own retry repeats, byte for byte, a body this instance answered with an error moments before.
    expect(sum(metrics, 'stormgate_client_retries_total', { how: 'repeat' })).toBe(counter.requests - 60);
  }, 40_000);
});

describe('the retry and fallback panels against the provider ground truth', () => {
  it('retry_count_total, retried_requests_total, retry_success_rate and upstream_attempts_total match the mock', async () => {
    const m = await startMock();
    const url = await gateway(loopOnly('{ maxAttempts: 2, backoff: { strategy: fixed, baseMs: 10 } }'), { m });
    await mockControl(m, 'PUT', 'faults', { errors: [{ status: 503, rate: 0.4 }] });
    const answers: Array<{ status: number; attempts: string | null }> = [];
    for (let i = 0; i < 10; i++) {
      const batch = await Promise.all(Array.from({ length: 4 }, () => post(url)));
      answers.push(...batch.map((a) => ({ status: a.status, attempts: a.headers.get('x-stormgate-attempts') })));
    }
    const sent = await mockLog(m);
    const metrics = await scrapeMetrics(url);
    const retriedOk = answers.filter((a) => a.attempts === '2' && a.status === 200).length;
    const retriedFail = answers.filter((a) => a.attempts === '2' && a.status !== 200).length;
    expect(retriedOk + retriedFail).toBeGreaterThan(0);
    expect(retriedFail).toBeGreaterThan(0);
    expect(sum(metrics, 'stormgate_upstream_attempts_total')).toBe(sent.length);
    expect(sum(metrics, 'stormgate_retry_count_total')).toBe(sent.filter((r) => r.headers['x-retry-attempt']).length);
    expect(sum(metrics, 'stormgate_retry_count_total', { reason: 'status_503' })).toBe(sent.filter((r) => r.headers['x-retry-attempt']).length);
    expect(sum(metrics, 'stormgate_retried_requests_total', { result: 'success' })).toBe(retriedOk);
    expect(sum(metrics, 'stormgate_retried_requests_total')).toBe(retriedOk + retriedFail);
    expect(sum(metrics, 'stormgate_retry_success_rate', { route: 'chat' })).toBeCloseTo(retriedOk / (retriedOk + retriedFail), 5);
    expect(sum(metrics, 'stormgate_requests_total', { outcome: 'success' })).toBe(answers.filter((a) => a.status === 200).length);
    expect(sum(metrics, 'stormgate_requests_total', { outcome: 'upstream_error' })).toBe(answers.filter((a) => a.status === 503).length);
  });

  it('fallback_rate, fallback_requests_total and fallbacks_total match the answers that named a fallback', async () => {
    const primary = await startMock();
    const backup = await startMock();
    const url = await gateway(
      `
server: { host: 127.0.0.1, port: 0 }
providers:
  primary: { family: openai, baseUrl: "{{p}}/v1", apiKey: ${KEY}, breaker: false }
  backup: { family: openai, baseUrl: "{{b}}/v1", apiKey: ${KEY}, breaker: false }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: primary }, { provider: backup } ]
    retry: { maxAttempts: 1 }
    park: false
`,
      { p: primary, b: backup },
    );
    await mockControl(primary, 'PUT', 'faults', { errors: [{ status: 503, rate: 0.3 }] });
    const answers = [];
    for (let i = 0; i < 20; i++) answers.push(await post(url));
    expect(answers.every((a) => a.status === 200)).toBe(true);
    const fellBack = answers.filter((a) => a.headers.get('x-stormgate-fallback'));
    expect(fellBack).toHaveLength(6);
    expect((await mockLog(backup)).length).toBe(6);
    const metrics = await scrapeMetrics(url);
    expect(sum(metrics, 'stormgate_fallback_rate', { route: 'chat' })).toBeCloseTo(6 / 20, 5);
    expect(sum(metrics, 'stormgate_fallback_requests_total', { route: 'chat' })).toBe(6);
    expect(sum(metrics, 'stormgate_fallbacks_total', { route: 'chat', from: 'primary/gpt-4o' })).toBe(6);
    expect(sum(metrics, 'stormgate_retry_count_total')).toBe(0);
    expect(sum(metrics, 'stormgate_upstream_attempts_total')).toBe(26);
    // A fallback is a request that needed more than one upstream attempt: retried, and each one succeeded.
    expect(sum(metrics, 'stormgate_retried_requests_total', { result: 'success' })).toBe(6);
    expect(sum(metrics, 'stormgate_retry_success_rate', { route: 'chat' })).toBe(1);
  });
});

const MESSAGES_ROUTE = (targets: string, extra = '') => `
server: { host: 127.0.0.1, port: 0 }
providers:
  claude: { family: anthropic, baseUrl: "{{a}}", apiKey: ${KEY}, breaker: false }
  claude2: { family: anthropic, baseUrl: "{{b}}", apiKey: ${KEY}, breaker: false }
routes:
  - name: messages
    match: { path: /v1/messages, models: ["claude-*"] }
    targets: ${targets}
    budget: { ratio: 10, minRetriesPerSecond: 1000 }
${extra}`;
const ask = { model: CLAUDE, max_tokens: 64, messages: [{ role: 'user' as const, content: 'Where is my parcel?' }] };

describe('the Anthropic SDK on /v1/messages', () => {
  it('529 overloaded on the primary account: the backup account answers, the SDK sends once', async () => {
    const a = await startMock();
    const b = await startMock();
    const url = await gateway(MESSAGES_ROUTE('[ { provider: claude }, { provider: claude2 } ]', '    retry: { maxAttempts: 2, backoff: { strategy: fixed, baseMs: 20 } }\n    park: false'), { a, b });
    await mockControl(a, 'POST', 'brownout', { mode: '529', durationMs: 20_000 });
    const counter = { requests: 0 };
    const { data, response } = await anthropic(url, { maxRetries: 2, counter }).messages.create(ask).withResponse();
    expect(data.type).toBe('message');
    expect(data.content[0]!.type).toBe('text');
    expect(counter.requests).toBe(1);
    expect(response.headers.get('x-stormgate-target')).toMatch(/^claude2/);
    expect(response.headers.get('x-stormgate-fallback')).toBeTruthy();
    expect(response.headers.get('x-stormgate-attempts')).toBe('3');
    expect((await mockLog(a)).map((r) => r.status)).toEqual([529, 529]);
  });

  it('529 with no backup: the SDK raises the overloaded_error once (x-should-retry false), after the route\'s attempts', async () => {
    const a = await startMock();
    const b = await startMock();
    const url = await gateway(MESSAGES_ROUTE('[ { provider: claude } ]', '    retry: { maxAttempts: 2, backoff: { strategy: fixed, baseMs: 20 } }\n    park: false'), { a, b });
    await mockControl(a, 'POST', 'brownout', { mode: '529', durationMs: 20_000 });
    const counter = { requests: 0 };
    const err = await anthropic(url, { maxRetries: 2, counter }).messages.create(ask).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(Anthropic.APIError);
    const e = err as InstanceType<typeof Anthropic.APIError>;
    expect(e.status).toBe(529);
    expect((e.error as { error: { type: string } }).error.type).toBe('overloaded_error');
    expect(e.headers?.get('x-should-retry')).toBe('false');
    expect(counter.requests).toBe(1);
    expect((await mockLog(a)).length).toBe(2);
  });

  it("the account's rate limit (retry-after on each 429): three concurrent calls all answered, none retried by the SDK", async () => {
    const a = await startMock();
    const b = await startMock();
    const url = await gateway(MESSAGES_ROUTE('[ { provider: claude } ]'), { a, b });
    await mockControl(a, 'PUT', 'faults', { rateLimit: { requestsPerMinute: 60, burstSeconds: 1 } });
    const counter = { requests: 0 };
    const client = anthropic(url, { maxRetries: 2, counter });
    const started = Date.now();
    const answers = await Promise.all([0, 1, 2].map(() => client.messages.create(ask)));
    expect(answers.every((m) => m.type === 'message')).toBe(true);
    expect(counter.requests).toBe(3);
    expect(Date.now() - started).toBeLessThan(12_000);
    const stats = await mockStats(a);
    expect(stats.rateLimited.requests).toBeGreaterThanOrEqual(1);
    expect(stats.byStatus['200']).toBe(3);
  });

  it("the gateway's own 404 and 504 on /v1/messages: the shape both SDKs read, Anthropic's error type beside the code", async () => {
    const a = await startMock();
    const b = await startMock();
    const url = await gateway(MESSAGES_ROUTE('[ { provider: claude } ]', '    retry: { maxAttempts: 1 }\n    park: false'), { a, b });
    const notFound = await anthropic(url).messages.create({ ...ask, model: 'gpt-4o' }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(notFound).toBeInstanceOf(Anthropic.NotFoundError);
    const nf = notFound as InstanceType<typeof Anthropic.APIError>;
    expect(nf.error).toMatchObject({ type: 'error', error: { type: 'not_found_error', code: 'model_not_found' } });
    expect(nf.headers?.get('x-should-retry')).toBe('false');

    await mockControl(a, 'POST', 'brownout', { mode: 'hang', durationMs: 20_000 });
    const counter = { requests: 0 };
    const started = Date.now();
    const late = await anthropic(url, { maxRetries: 2, counter, timeout: 2_000 }).messages.create(ask).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(Date.now() - started).toBeLessThan(2_000);
    expect(late).toBeInstanceOf(Anthropic.APIError);
    const dl = late as InstanceType<typeof Anthropic.APIError>;
    expect(dl.status).toBe(504);
    expect(dl.error).toMatchObject({ type: 'error', error: { type: 'timeout_error', code: 'deadline_exceeded' } });
    expect(dl.headers?.get('x-should-retry')).toBe('false');
    expect(counter.requests).toBe(1);
  });
});

describe('openai -> anthropic family failover through the openai SDK', () => {
  const config = `
server: { host: 127.0.0.1, port: 0 }
providers:
  primary: { family: openai, baseUrl: "{{p}}/v1", apiKey: ${KEY}, breaker: false }
  claude: { family: anthropic, baseUrl: "{{c}}", apiKey: ${KEY}, breaker: false }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: primary }, { provider: claude, model: ${CLAUDE} } ]
    retry: { maxAttempts: 2, backoff: { strategy: fixed, baseMs: 20 } }
    park: false
`;

  it('a whole answer: a chat.completion from Claude, the Messages API called upstream', async () => {
    const p = await startMock();
    const c = await startMock();
    const url = await gateway(config, { p, c });
    await mockControl(p, 'POST', 'brownout', { mode: '503', durationMs: 20_000 });
    const { data, response } = await openai(url).chat.completions.create({ model: 'gpt-4o', messages: hi }).withResponse();
    expect(data.object).toBe('chat.completion');
    expect(data.choices[0]!.message.content).toBeTruthy();
    expect(data.choices[0]!.finish_reason).toBe('stop');
    expect(response.headers.get('x-stormgate-target')).toBe(`claude/${CLAUDE}`);
    expect(response.headers.get('x-stormgate-fallback')).toBeTruthy();
    const upstream = await mockLog(c);
    expect(upstream.map((r) => r.path)).toEqual(['/v1/messages']);
    expect(upstream[0]!.model).toBe(CLAUDE);
    const metrics = await scrapeMetrics(url);
    expect(sum(metrics, 'stormgate_fallbacks_total', { from: 'primary/gpt-4o', to: `claude/${CLAUDE}` })).toBe(1);
  });

  it('a stream: chunks from Claude through the openai SDK, one finish_reason, nothing from the failed primary', async () => {
    const p = await startMock();
    const c = await startMock();
    const url = await gateway(config, { p, c });
    await mockControl(p, 'POST', 'brownout', { mode: '503', durationMs: 20_000 });
    const stream = await openai(url).chat.completions.create({ model: 'gpt-4o', messages: hi, stream: true });
    let text = '';
    const finishes: string[] = [];
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? '';
      if (chunk.choices[0]?.finish_reason) finishes.push(chunk.choices[0].finish_reason);
    }
    expect(text.length).toBeGreaterThan(0);
    expect(finishes).toEqual(['stop']);
    expect((await mockLog(c)).map((r) => r.path)).toEqual(['/v1/messages']);
    expect((await mockLog(p)).length).toBe(2);
  });
});

describe('two gateway instances on one redis-server started by the test', () => {
  function fleetConfig(prefix: string, route = '', provider = ''): string {
    return `
server: { host: 127.0.0.1, port: 0 }
state: { redis: "${redis().url}", keyPrefix: ${prefix} }
providers:
  mock: { family: openai, baseUrl: "{{m}}/v1", apiKey: ${KEY}, maxConnections: 64${provider} }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: mock } ]
    park: false
${route}`;
  }

  it("a breaker instance A opened turns B's requests away with circuit_open, and the provider hears nothing from B", async () => {
    const m = await startMock();
    const cfg = fleetConfig(`tp43-${++prefixes}`, '    retry: { maxAttempts: 1 }');
    const a = await gateway(cfg, { m });
    const b = await gateway(cfg, { m });
    await mockControl(m, 'POST', 'brownout', { mode: '503', durationMs: 20_000 });
    for (let i = 0; i < 5; i++) expect((await post(a)).status).toBe(503);
    await sleep(300);
    const before = (await mockStats(m)).total;
    const turned = await post(b);
    expect(turned.status).toBe(503);
    expectOpenAIError(turned.body, 'circuit_open', (turned.body as { error: { type: string } }).error.type);
    expect(Number(turned.headers.get('retry-after'))).toBeGreaterThan(0);
    expect(turned.headers.get('x-should-retry')).toBe('false');
    expect((await mockStats(m)).total).toBe(before);
    const opened = sum(await scrapeMetrics(a), 'stormgate_breaker_transitions_total', { to: 'open' }) + sum(await scrapeMetrics(b), 'stormgate_breaker_transitions_total', { to: 'open' });
    expect(opened).toBe(1);
    expect(sum(await scrapeMetrics(b), 'stormgate_breaker_state', { target: 'mock/gpt-4o' })).toBe(1);
  });

  it("a hold-off A learnt from a 429's retry-after is obeyed by B: 429 provider_held_off, the SDK invited back and answered", async () => {
    const m = await startMock();
    const cfg = fleetConfig(`tp43-${++prefixes}`, '    retry: { maxAttempts: 1 }');
    const a = await gateway(cfg, { m });
    const b = await gateway(cfg, { m });
    await mockControl(m, 'PUT', 'faults', { errors: [{ status: 429, times: 1, headers: { 'retry-after': '2' } }] });
    const first = await post(a);
    expect(first.status).toBe(429);
    expect(first.headers.get('x-should-retry')).toBe('false');
    expect(first.headers.get('retry-after')).toBeTruthy();
    await sleep(100);
    const held = await post(b);
    expect(held.status).toBe(429);
    expectOpenAIError(held.body, 'provider_held_off', (held.body as { error: { type: string } }).error.type);
    expect(held.headers.get('x-should-retry')).toBe('true');
    const retryAfter = Number(held.headers.get('retry-after'));
    expect(retryAfter).toBeGreaterThanOrEqual(1);
    expect(retryAfter).toBeLessThanOrEqual(4);
    expect(Number(held.headers.get('retry-after-ms'))).toBeGreaterThan(0);
    expect((await mockStats(m)).total).toBe(1);
    const counter = { requests: 0 };
    const started = Date.now();
    const answer = await openai(b, { maxRetries: 2, counter }).chat.completions.create({ model: 'gpt-4o', messages: hi });
    expect(answer.choices[0]!.message.content).toBeTruthy();
    expect(counter.requests).toBe(2);
    expect(Date.now() - started).toBeLessThan(5_000);
    expect((await mockStats(m)).total).toBe(2);
  });

  it('the retry budget is fleet-wide: 20 calls on each of two instances against a dead provider, one budget between them', async () => {
    const m = await startMock();
    const cfg = fleetConfig(`tp43-${++prefixes}`, '    retry: { maxAttempts: 3, backoff: { strategy: fixed, baseMs: 20 } }\n    budget: { minRetriesPerSecond: 1 }', ', breaker: false');
    const a = await gateway(cfg, { m });
    const b = await gateway(cfg, { m });
    await mockControl(m, 'POST', 'brownout', { mode: '503', durationMs: 20_000 });
    const answers = await Promise.all(Array.from({ length: 40 }, (_, i) => post(i % 2 ? a : b, chatBody({ user: `u${i}` }))));
    expect(answers.every((r) => r.status === 503 && r.headers.get('x-should-retry') === 'false')).toBe(true);
    const stats = await mockStats(m);
    // ratio 0.1 of the fleet's 40 requests plus the fleet-wide floor (1 a second over 10 s): 14 retries, not 2 x 12.
    expect(stats.total - 40).toBeGreaterThan(0);
    expect(stats.total - 40).toBeLessThanOrEqual(14);
    const retries = sum(await scrapeMetrics(a), 'stormgate_retry_count_total') + sum(await scrapeMetrics(b), 'stormgate_retry_count_total');
    expect(retries).toBe(stats.total - 40);
  });

  it('an Idempotency-Key run on A is waited for by its repeat on B: one upstream request, one answer', async () => {
    const m = await startMock();
    const cfg = fleetConfig(`tp43-${++prefixes}`);
    const a = await gateway(cfg, { m });
    const b = await gateway(cfg, { m });
    await mockControl(m, 'PUT', 'faults', { latencyMs: 1_000 });
    const key = `tp43-call-${Date.now()}`;
    const body = chatBody();
    const run = post(a, body, { 'idempotency-key': key });
    await sleep(250);
    const repeat = post(b, body, { 'idempotency-key': key });
    const [r1, r2] = await Promise.all([run, repeat]);
    expect(r1.status).toBe(200);
    expect(r2.status).toBe(200);
    expect(r2.body.id).toBe(r1.body.id);
    expect((await mockLog(m)).length).toBe(1);
    const later = await post(b, body, { 'idempotency-key': key });
    expect(later.status).toBe(200);
    expect(later.headers.get('idempotent-replayed')).toBe('true');
    expect(later.body.id).toBe(r1.body.id);
    const other = await post(b, chatBody({ temperature: 0.5 }), { 'idempotency-key': key });
    expect(other.status).toBe(422);
    expectOpenAIError(other.body, 'idempotency_key_reused', (other.body as { error: { type: string } }).error.type);
    expect(other.headers.get('x-should-retry')).toBe('false');
    expect((await mockLog(m)).length).toBe(1);
  });
});

describe('clients that leave, and online requests behind a batch flood', () => {
  it('a client that aborts during the backoff: the wait is cancelled and no attempt goes after it left', async () => {
    const m = await startMock();
    const logs: string[] = [];
    const url = await gateway(loopOnly('{ maxAttempts: 3, backoff: { strategy: fixed, baseMs: 1500 } }'), { m }, logs);
    await mockControl(m, 'POST', 'brownout', { mode: '503', durationMs: 20_000 });
    const ac = new AbortController();
    const call = openai(url, { maxRetries: 2 }).chat.completions.create({ model: 'gpt-4o', messages: hi }, { signal: ac.signal });
    await sleep(300);
    ac.abort();
    await expect(call).rejects.toBeInstanceOf(OpenAI.APIUserAbortError);
    await sleep(2_000);
    expect((await mockStats(m)).total).toBe(1);
    const line = logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.route === 'chat');
    expect(line?.outcome).toBe('client_gone');
    const metrics = await scrapeMetrics(url);
    expect(sum(metrics, 'stormgate_requests_total', { outcome: 'client_gone' })).toBe(1);
    expect(sum(metrics, 'stormgate_retry_count_total')).toBe(0);
  });

  it('online requests sent after a batch flood into a full pool are answered before most of the batch', async () => {
    const m = await startMock();
    const url = await gateway(
      `
server: { host: 127.0.0.1, port: 0 }
providers:
  mock: { family: openai, baseUrl: "{{m}}/v1", apiKey: ${KEY}, maxConnections: 64, breaker: false, pools: { maxConcurrent: 2 } }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: mock } ]
`,
      { m },
    );
    await mockControl(m, 'PUT', 'faults', { latencyMs: 150 });
    const doneAt: Array<{ cls: string; at: number; status: number }> = [];
    const send = (cls: string) =>
      post(url, chatBody(), cls === 'batch' ? { 'x-stormgate-priority': 'batch' } : {}).then((r) => doneAt.push({ cls, at: Date.now(), status: r.status }));
    const batch = Array.from({ length: 20 }, () => send('batch'));
    await sleep(100);
    const online = Array.from({ length: 4 }, () => send('online'));
    await Promise.all([...batch, ...online]);
    expect(doneAt.every((d) => d.status === 200)).toBe(true);
    const order = doneAt.sort((x, y) => x.at - y.at).map((d) => d.cls);
    const lastOnline = order.lastIndexOf('online');
    // 20 batch at 2 in flight, 150 ms each: 1.5 s of batch. The online four go as the first slots free up.
    expect(lastOnline).toBeLessThan(12);
  });
});
