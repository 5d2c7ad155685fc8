// Third-party failure-scenario suite 46: an outside QA team's suite about FLEETS, written from the README
// ("Retry budget, circuit breaker, hold-offs, parking", "Shared state", "Idempotency keys"): two or three gateway
// instances sharing one real redis-server started by the test on a free loopback port, driven with the official
// `openai` and `@anthropic-ai/sdk` clients against the bundled mock provider, its faults changed at run time through
// its control endpoint, the provider's own request log as the ground truth. Each test has its own `state.keyPrefix`.
// The scenarios are the fleet cases the suites before it (fleet-*.test.ts, suite 43, credential-hold-fleet) leave out:
//  1. Hold-offs: a 429's retry-after seen by one instance sends the others' newcomers to the backup (`held_off`) with
//     nothing to the held-off provider; a daily quota's `retry-after: 3600` as each instance tells it (capped at 60 s
//     inside, the provider's hour to the client, once fleet-wide in the metric); the Anthropic SDK's view of another
//     instance's 529 hold-off; requests parked on three instances for a 2 s hold-off, none reaching the provider.
//  2. Credential holds: a revoked key (401) on one instance makes every instance go to the backup, an instance
//     started after it included.
//  3. Breakers: requests parked on three instances behind a breaker another instance opened: one probe fleet-wide,
//     then all answered; two fleets on one Redis with their own keyPrefix do not share a breaker.
//  4. The retry budget: a storm on one instance leaves the others no retries.
//  5. Redis killed mid-traffic (every request answered, one warning and one recovery per instance); what an instance
//     decided alone while Redis was away (a breaker it opened, a hold-off it learnt) reaches the fleet on Redis's
//     return; a Redis that stops answering (CLIENT PAUSE, SIGSTOP) stalls no request past a few commandTimeoutMs.
//  6. Idempotency keys across instances: replayed byte for byte on the others, a stream replayed as a stream, another
//     body refused, a failed run's key given back to a repeat elsewhere.
//  7. The amplification across the fleet during a brownout under SDK clients with their default retries.
// Found here: one gateway bug, fixed. An instance that turned requests away for a hold another instance started (a
// hold-off or a credential hold read from Redis at its first sight of the target) reported no series for that target
// in stormgate_hold_remaining_seconds nor stormgate_credentials_held: the scrape only listed targets configured with a
// model, served through the pool, or with a breaker change, so a target it never sent to (the point of the hold)
// showed nothing on it while its clients got 429 provider_held_off or the backup (src/runtime.ts now keeps the
// targets a hold was taken in for, src/observability/scrape-gauges.ts reports them). 20 scenarios, run five times,
// once with two copies of the file at once.
import { setTimeout as sleep } from 'node:timers/promises';
import Anthropic from '@anthropic-ai/sdk';
import { Redis } from 'ioredis';
import OpenAI from 'openai';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import type { MockServer } from '../src/mock/server.ts';
import { mockControl } from './helpers/mock-control.ts';
import { expectOpenAIError, sdkError } from './helpers/openai-error.ts';
import { startRedis, type RedisHandle } from './helpers/redis-server.ts';
import { scrapeMetrics, useExtraMocks, useGateways, type MetricSample } from './helpers/stack.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();

// The file's own redis-server; the tests that kill or restart one start another of their own.
let shared: RedisHandle;
beforeAll(async () => {
  shared = await startRedis();
});
afterAll(async () => {
  await shared.stop();
});
// A Redis a test started for itself (to kill, freeze or restart), stopped after the test whatever happened.
const ownRedis: RedisHandle[] = [];
const thaws: (() => void)[] = [];
afterEach(async () => {
  for (const thaw of thaws.splice(0)) thaw();
  await Promise.all(ownRedis.splice(0).map((r) => r.stop()));
});

const KEY = 'sk-tp46-provider-0123456789';
const CLAUDE = 'claude-sonnet-5-5';
const hi = [{ role: 'user' as const, content: 'Where is my parcel?' }];

let prefixes = 0;

interface Fleet {
  urls: string[];
  logs: string[];
  /** Starts one more instance of the same config (one that joins the fleet later). */
  join(): Promise<string>;
}

/**
 * `n` gateways of one YAML config on one Redis; `{{name}}` in it is replaced by that mock's URL. A generous
 * commandTimeoutMs unless the YAML sets its own `state`: a busy machine's slow command must not put an instance on
 * local state mid-test.
 */
async function fleet(n: number, yaml: string, mocks: Record<string, MockServer>, opts: { redis?: RedisHandle; state?: string } = {}): Promise<Fleet> {
  let text = yaml;
  for (const [name, m] of Object.entries(mocks)) text = text.replaceAll(`{{${name}}}`, m.url);
  const redisUrl = (opts.redis ?? shared).url;
  text += `\nstate: { redis: "${redisUrl}", keyPrefix: tp46-${process.pid}-${prefixes++}, ${opts.state ?? 'commandTimeoutMs: 1000'} }\n`;
  const config = parseConfig(text, 'suite46.yaml', {});
  const logs: string[] = [];
  const join = () => startGateway(config, { logs });
  const urls: string[] = [];
  for (let i = 0; i < n; i++) urls.push(await join());
  return { urls, logs, join };
}

function openai(url: string, opts: { maxRetries?: number; counter?: { requests: number } } = {}): OpenAI {
  return new OpenAI({
    baseURL: `${url}/v1`,
    apiKey: 'sk-tp46-client',
    maxRetries: opts.maxRetries ?? 0,
    logLevel: 'off',
    fetch: async (u, init) => {
      if (opts.counter) opts.counter.requests++;
      return fetch(u, init);
    },
  });
}

function anthropic(url: string): Anthropic {
  return new Anthropic({ baseURL: url, apiKey: 'sk-tp46-client', maxRetries: 0, logLevel: 'off' });
}

interface Logged {
  id: number;
  receivedAt: number;
  endedAt?: number;
  status?: number;
  model?: string;
  headers: Record<string, string>;
}

/** Every request the mock received, in order (GET /_mock/requests). */
async function mockLog(m: MockServer): Promise<Logged[]> {
  return (await (await fetch(`${m.url}/_mock/requests?limit=100000`)).json()) as Logged[];
}
async function mockTotal(m: MockServer): Promise<number> {
  return ((await (await fetch(`${m.url}/_mock/stats`)).json()) as { total: number }).total;
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- an answer is JSON: tests read whatever field they check
async function post(url: string, body: unknown = { model: 'gpt-4o', messages: hi }, headers: Record<string, string> = {}): Promise<{ status: number; headers: Headers; text: string; body: any; ms: number }> {
  const started = Date.now();
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    /* not JSON */
  }
  return { status: res.status, headers: res.headers, text, body: parsed, ms: Date.now() - started };
}

const sum = (samples: MetricSample[], name: string, labels: Record<string, string> = {}) =>
  samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v)).reduce((a, s) => a + s.value, 0);

async function fleetSum(urls: string[], name: string, labels: Record<string, string> = {}): Promise<number> {
  let total = 0;
  for (const url of urls) total += sum(await scrapeMetrics(url), name, labels);
  return total;
}

async function eventually(check: () => Promise<boolean> | boolean, timeoutMs = 5_000, what = 'condition'): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`${what} not met within ${timeoutMs} ms`);
    await sleep(25);
  }
}

/** A chat route over a primary `p` and, when `backup`, a backup `b` (both the mock), with the route's `extra` lines. */
function chatRoute(opts: { backup?: boolean; provider?: string; route?: string } = {}): string {
  return `
server: { host: 127.0.0.1, port: 0, logLevel: info }
providers:
  p: { family: openai, baseUrl: "{{p}}/v1", apiKey: ${KEY}, maxConnections: 64${opts.provider ?? ''} }
${opts.backup ? `  b: { family: openai, baseUrl: "{{b}}/v1", apiKey: ${KEY}, maxConnections: 64${opts.provider ?? ''} }` : ''}
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: p }${opts.backup ? ', { provider: b }' : ''} ]
${opts.route ?? ''}
`;
}

describe('hold-offs across a fleet of three', () => {
  it("sends B's and C's newcomers to the backup while A's 429 retry-after lasts (held_off): the held-off provider hears nothing from them", async () => {
    const p = await startMock();
    const b = await startMock();
    await mockControl(p, 'PUT', 'faults', { errors: [{ status: 429, times: 1, headers: { 'retry-after': '20' } }] });
    const f = await fleet(3, chatRoute({ backup: true }), { p, b });

    const first = await openai(f.urls[0]!).chat.completions.create({ model: 'gpt-4o', messages: hi }).withResponse();
    expect(first.data.choices[0]!.message.content).toBeTruthy();
    expect(first.response.headers.get('x-stormgate-target')).toBe('b/gpt-4o');
    expect(await mockTotal(p)).toBe(1);

    await sleep(300); // the hold-off is in Redis once A's answer is out; a margin for a loaded machine
    for (const url of [f.urls[1]!, f.urls[2]!, f.urls[0]!]) {
      for (let i = 0; i < 3; i++) {
        const { data, response } = await openai(url).chat.completions.create({ model: 'gpt-4o', messages: hi }).withResponse();
        expect(data.object).toBe('chat.completion');
        expect(response.headers.get('x-stormgate-target')).toBe('b/gpt-4o');
        expect(response.headers.get('x-stormgate-fallback')).toBe('held_off');
      }
    }
    expect(await mockTotal(p)).toBe(1);
    expect(await mockTotal(b)).toBe(10);
  });

  it("tells a daily quota's retry-after: 3600 to every instance's clients as the provider asked (x-should-retry false), holds it 60 s inside, counts it once", async () => {
    const p = await startMock();
    await mockControl(p, 'PUT', 'faults', { errors: [{ status: 429, times: 1, headers: { 'retry-after': '3600' } }] });
    const f = await fleet(3, chatRoute({ provider: ', breaker: false' }), { p });

    // A gets the provider's own refusal (a hint over maxWaitHintMs is not waited out).
    const a = await post(f.urls[0]!);
    expect(a.status).toBe(429);
    await sleep(300);
    for (const url of [f.urls[1]!, f.urls[2]!]) {
      const counter = { requests: 0 };
      // The SDK's default retries: x-should-retry false keeps it from sending the call again.
      const err = await sdkError(openai(url, { maxRetries: 2, counter }).chat.completions.create({ model: 'gpt-4o', messages: hi }));
      expect(counter.requests).toBe(1);
      expect(err.status).toBe(429);
      expectOpenAIError({ error: err.error }, 'provider_held_off', 'rate_limit_error');
      expect(err.headers?.get('x-should-retry')).toBe('false');
      const retryAfter = Number(err.headers?.get('retry-after'));
      expect(retryAfter).toBeGreaterThanOrEqual(3_590);
      expect(retryAfter).toBeLessThanOrEqual(3_700);
    }
    expect(await mockTotal(p)).toBe(1);

    // Inside, the hold is at most 60 s (plus its spread) on every instance that knows of it, and it started once.
    for (const url of f.urls) {
      const left = sum(await scrapeMetrics(url), 'stormgate_hold_remaining_seconds', { target: 'p/gpt-4o', kind: 'hold_off', tier: 'all' });
      expect(left).toBeGreaterThan(50);
      expect(left).toBeLessThanOrEqual(66);
    }
    expect(await fleetSum(f.urls, 'stormgate_holds_started_total', { target: 'p/gpt-4o', kind: 'hold_off' })).toBe(1);
    expect(await fleetSum(f.urls, 'stormgate_holds_started_total', { reason: 'status_429' })).toBe(1);
  });

  it("gives the Anthropic SDK on B a RateLimitError with retry-after for the 529 hold-off A's account started, and sends nothing", async () => {
    const a = await startMock();
    await mockControl(a, 'PUT', 'faults', { errors: [{ status: 529, times: 1, headers: { 'retry-after': '3' } }] });
    const f = await fleet(
      2,
      `
server: { host: 127.0.0.1, port: 0 }
providers:
  claude: { family: anthropic, baseUrl: "{{a}}", apiKey: ${KEY}, breaker: false }
routes:
  - name: messages
    match: { path: /v1/messages }
    targets: [ { provider: claude } ]
    park: false
`,
      { a },
    );
    // A's own call waits the 3 s hint out and is answered; B's, meanwhile, is turned away at once.
    const onA = anthropic(f.urls[0]!).messages.create({ model: CLAUDE, max_tokens: 32, messages: hi });
    await eventually(async () => (await mockTotal(a)) === 1, 3_000, "A's first attempt");
    await sleep(300);
    const started = Date.now();
    const err = await anthropic(f.urls[1]!)
      .messages.create({ model: CLAUDE, max_tokens: 32, messages: hi })
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    expect(Date.now() - started).toBeLessThan(1_000);
    expect(err).toBeInstanceOf(Anthropic.RateLimitError);
    const e = err as InstanceType<typeof Anthropic.RateLimitError>;
    expect((e.error as { type: string; error: { type: string } }).type).toBe('error');
    expect((e.error as { error: { type: string } }).error.type).toBe('rate_limit_error');
    expect(e.headers?.get('x-should-retry')).toBe('true');
    const retryAfter = Number(e.headers?.get('retry-after'));
    expect(retryAfter).toBeGreaterThanOrEqual(1);
    expect(retryAfter).toBeLessThanOrEqual(4);
    expect(await mockTotal(a)).toBe(1);

    const message = await onA;
    expect(message.content[0]!.type).toBe('text');
    expect(await mockTotal(a)).toBe(2);
  });

  it('parks requests on all three instances for a 2 s hold-off: the provider hears none of them before it ends, and all are answered', async () => {
    const p = await startMock();
    await mockControl(p, 'PUT', 'faults', { errors: [{ status: 429, times: 1, headers: { 'retry-after': '2' } }] });
    const f = await fleet(3, chatRoute({ provider: ', breaker: false' }), { p });
    const onA = post(f.urls[0]!);
    await eventually(async () => (await mockTotal(p)) === 1, 3_000, 'the 429');
    await sleep(300);
    const parked = f.urls.flatMap((url) => Array.from({ length: 4 }, () => openai(url).chat.completions.create({ model: 'gpt-4o', messages: hi })));
    const answers = await Promise.all(parked);
    expect(answers.every((a) => a.object === 'chat.completion')).toBe(true);
    expect((await onA).status).toBe(200);

    const log = await mockLog(p);
    expect(log).toHaveLength(14); // the 429, A's own retry, and the twelve parked: nothing sent twice
    const refusedAt = log[0]!.endedAt ?? log[0]!.receivedAt;
    for (const r of log.slice(1)) expect(r.receivedAt - refusedAt).toBeGreaterThanOrEqual(1_950);
    expect(log.slice(1).every((r) => r.status === 200)).toBe(true);
    // Each instance lets its parked requests go over a release window (a fifth of the 2 s away), not in one burst.
    const parkedAt = log.slice(1).map((r) => r.receivedAt);
    expect(Math.max(...parkedAt) - Math.min(...parkedAt)).toBeGreaterThanOrEqual(100);
  });

  it("holds the fleet off on a 503's retry-after-ms as on a 429's: B's newcomers go to the backup (held_off)", async () => {
    const p = await startMock();
    const b = await startMock();
    await mockControl(p, 'PUT', 'faults', { errors: [{ status: 503, times: 1, headers: { 'retry-after-ms': '8000' } }] });
    const f = await fleet(2, chatRoute({ backup: true }), { p, b });
    expect((await post(f.urls[0]!)).status).toBe(200);
    await sleep(300);
    const onB = await post(f.urls[1]!);
    expect(onB.status).toBe(200);
    expect(onB.headers.get('x-stormgate-fallback')).toBe('held_off');
    const left = sum(await scrapeMetrics(f.urls[1]!), 'stormgate_hold_remaining_seconds', { target: 'p/gpt-4o', kind: 'hold_off', tier: 'all' });
    expect(left).toBeGreaterThan(5);
    expect(left).toBeLessThanOrEqual(9);
    expect(await mockTotal(p)).toBe(1);
    expect(await fleetSum(f.urls, 'stormgate_holds_started_total', { target: 'p/gpt-4o', reason: 'status_503' })).toBe(1);
  });

  it("starts no fleet hold-off on a 429 that carries only x-ratelimit-reset (a token bucket refills): B still sends to the primary", async () => {
    const p = await startMock();
    const b = await startMock();
    await mockControl(p, 'PUT', 'faults', {
      errors: [{ status: 429, times: 1, code: 'rate_limit_exceeded', headers: { 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '1s' } }],
    });
    const f = await fleet(2, chatRoute({ backup: true }), { p, b });
    const onA = await post(f.urls[0]!);
    expect(onA.status).toBe(200);
    await sleep(300);
    const onB = await post(f.urls[1]!);
    expect(onB.status).toBe(200);
    expect(onB.headers.get('x-stormgate-target')).toBe('p/gpt-4o');
    expect(onB.headers.get('x-stormgate-fallback')).toBeNull();
    expect(await fleetSum(f.urls, 'stormgate_holds_started_total')).toBe(0);
  });
});

describe('credential holds across a fleet', () => {
  it("skips a primary whose key A found revoked (401) on every instance, one started after it included, with x-stormgate-fallback: credentials", async () => {
    const p = await startMock();
    const b = await startMock();
    await mockControl(p, 'PUT', 'faults', { errors: [{ status: 401, code: 'invalid_api_key', message: 'Incorrect API key provided: sk-tp46-***' }] });
    const f = await fleet(3, chatRoute({ backup: true }), { p, b });

    const first = await openai(f.urls[0]!).chat.completions.create({ model: 'gpt-4o', messages: hi }).withResponse();
    expect(first.response.headers.get('x-stormgate-fallback')).toBe('credentials');
    expect(await mockTotal(p)).toBe(1);
    await sleep(300);
    const late = await f.join();
    for (const url of [f.urls[1]!, f.urls[2]!, late]) {
      const { data, response } = await openai(url).chat.completions.create({ model: 'gpt-4o', messages: hi }).withResponse();
      expect(data.object).toBe('chat.completion');
      expect(response.headers.get('x-stormgate-target')).toBe('b/gpt-4o');
      expect(response.headers.get('x-stormgate-fallback')).toBe('credentials');
      const samples = await scrapeMetrics(url);
      expect(sum(samples, 'stormgate_credentials_held', { target: 'p/gpt-4o' })).toBe(1);
      expect(sum(samples, 'stormgate_hold_remaining_seconds', { target: 'p/gpt-4o', kind: 'credentials' })).toBeGreaterThan(50);
    }
    expect(await mockTotal(p)).toBe(1);
    expect(await fleetSum([...f.urls, late], 'stormgate_holds_started_total', { target: 'p/gpt-4o', kind: 'credentials', reason: 'status_401' })).toBe(1);
    // The provider's body (which can echo part of the key) reaches no log line as the client's error either.
    expect(f.logs.join('\n')).not.toContain(KEY);
  });
});

describe('breakers across a fleet', () => {
  it('sends one probe fleet-wide for requests parked on three instances behind the breaker A opened, then answers them all', async () => {
    const p = await startMock();
    await mockControl(p, 'PUT', 'faults', { errors: [{ status: 503 }] });
    const f = await fleet(3, chatRoute({ route: '    retry: { maxAttempts: 1 }' }), { p });
    for (let i = 0; i < 5; i++) expect((await post(f.urls[0]!)).status).toBe(503);
    await eventually(async () => sum(await scrapeMetrics(f.urls[0]!), 'stormgate_breaker_state', { target: 'p/gpt-4o' }) === 1, 3_000, 'breaker open');
    const before = await mockTotal(p);
    expect(before).toBe(5);
    await mockControl(p, 'PUT', 'faults', {});

    const parked = f.urls.flatMap((url) => Array.from({ length: 4 }, () => post(url)));
    const answers = await Promise.all(parked);
    expect(answers.map((a) => a.status)).toEqual(Array(12).fill(200));

    const after = (await mockLog(p)).slice(before);
    expect(after).toHaveLength(12); // each parked request sent once: the probe's carried its own request
    // The first probe went alone: nothing else reached the provider before its answer was out.
    const probe = after[0]!;
    const probeEnd = probe.endedAt ?? probe.receivedAt;
    expect(after.slice(1).every((r) => r.receivedAt >= probeEnd)).toBe(true);
    expect(f.logs.filter((l) => l.includes('"msg":"breaker open"'))).toHaveLength(1);
    expect(f.logs.filter((l) => l.includes('"msg":"breaker closed"'))).toHaveLength(1);
  });

  it("keeps two fleets on one Redis apart by keyPrefix: fleet X's open breaker does not turn fleet Y away from its own healthy provider of the same name", async () => {
    const failing = await startMock();
    const healthy = await startMock();
    await mockControl(failing, 'PUT', 'faults', { errors: [{ status: 503 }] });
    const route = chatRoute({ route: '    retry: { maxAttempts: 1 }\n    park: false' });
    const x = await fleet(2, route, { p: failing });
    const y = await fleet(1, route, { p: healthy });
    for (let i = 0; i < 5; i++) expect((await post(x.urls[0]!)).status).toBe(503);
    await eventually(async () => (await post(x.urls[1]!)).body.error?.code === 'circuit_open', 3_000, "X's breaker on its B");
    const yAnswers = await Promise.all(Array.from({ length: 5 }, () => post(y.urls[0]!)));
    expect(yAnswers.map((a) => a.status)).toEqual(Array(5).fill(200));
    expect(sum(await scrapeMetrics(y.urls[0]!), 'stormgate_breaker_state', { target: 'p/gpt-4o' })).toBe(0);
    expect(await mockTotal(healthy)).toBe(5);
  });
});

describe('the retry budget across a fleet', () => {
  it("leaves B no retries after a storm on A spent the fleet's budget; the fleet's retries stay within one budget", async () => {
    const p = await startMock();
    await mockControl(p, 'PUT', 'faults', { errors: [{ status: 503 }] });
    const f = await fleet(
      3,
      chatRoute({
        provider: ', breaker: false',
        route: '    retry: { maxAttempts: 3, backoff: { strategy: fixed, baseMs: 5, capMs: 5 } }\n    park: false\n    budget: { ratio: 0.1, windowS: 10, minRetriesPerSecond: 0.1 }',
      }),
      { p },
    );
    const storm = await Promise.all(Array.from({ length: 40 }, () => post(f.urls[0]!)));
    expect(storm.every((a) => a.status === 503)).toBe(true);
    const afterStorm = await mockTotal(p);
    // 40 requests may retry a tenth of themselves, plus the floor's one retry in the 10 s window (and a rounding).
    expect(afterStorm - 40).toBeLessThanOrEqual(6);

    const onB = [];
    for (let i = 0; i < 10; i++) onB.push(await post(i % 2 ? f.urls[1]! : f.urls[2]!));
    expect(onB.every((a) => a.status === 503 && a.headers.get('x-should-retry') === 'false')).toBe(true);
    const retriedOnB = onB.filter((a) => a.headers.get('x-stormgate-attempts') !== '1').length;
    expect(retriedOnB).toBeLessThanOrEqual(1); // a tenth of their own ten, at most
    expect(await fleetSum([f.urls[1]!, f.urls[2]!], 'stormgate_retry_budget_exhausted_total')).toBeGreaterThanOrEqual(9);
    const total = await mockTotal(p);
    expect(total - 50).toBeLessThanOrEqual(7);
  });
});

describe('the retry budget by priority class, fleet-wide', () => {
  it("keeps a batch storm on A from spending B's online retries: B's batch request is not retried, its online one is", async () => {
    const p = await startMock();
    await mockControl(p, 'PUT', 'faults', { errors: [{ status: 503, firstAttemptsOnly: true }] });
    const f = await fleet(
      3,
      chatRoute({
        provider: ', breaker: false',
        route: '    retry: { maxAttempts: 2, backoff: { strategy: fixed, baseMs: 5, capMs: 5 } }\n    park: false\n    budget: { ratio: 0.1, windowS: 10, minRetriesPerSecond: 0.5 }',
      }),
      { p },
    );
    const batch = { 'x-stormgate-priority': 'batch' };
    const storm = await Promise.all(Array.from({ length: 60 }, () => post(f.urls[0]!, undefined, batch)));
    // A tenth of 60, or the floor's 5 in the window, whichever is more: the rest get the provider's 503.
    const retried = storm.filter((a) => a.status === 200).length;
    expect(retried).toBeGreaterThanOrEqual(4);
    expect(retried).toBeLessThanOrEqual(7);
    for (const url of [f.urls[1]!, f.urls[2]!]) {
      const b = await post(url, undefined, batch);
      expect(b.status).toBe(503);
      expect(b.headers.get('x-stormgate-attempts')).toBe('1');
      const online = await post(url);
      expect(online.status).toBe(200);
      expect(online.headers.get('x-stormgate-attempts')).toBe('2');
    }
  });
});

describe('Redis failing under a fleet', () => {
  it('answers every request while Redis is killed mid-traffic; each instance warns once, goes degraded, and recovers once Redis is back', async () => {
    const redis = await startRedis();
    ownRedis.push(redis);
    const p = await startMock();
    const f = await fleet(
      3,
      chatRoute({ route: '    retry: { maxAttempts: 2 }\n    budget: { ratio: 0.5, minRetriesPerSecond: 5 }' }),
      { p },
      { redis, state: 'commandTimeoutMs: 200' },
    );
    // A tenth of first attempts fail, so requests take retries from the budget (a Redis call) while Redis dies.
    await mockControl(p, 'PUT', 'faults', { errors: [{ status: 503, rate: 0.1, firstAttemptsOnly: true }] });

    const answers: { status: number; ms: number }[] = [];
    const until = Date.now() + 2_000;
    const loops = f.urls.flatMap((url) =>
      [0, 1].map(async () => {
        while (Date.now() < until) answers.push(await post(url));
      }),
    );
    await sleep(600);
    redis.kill();
    await Promise.all(loops);
    expect(answers.length).toBeGreaterThan(30);
    expect(answers.filter((a) => a.status !== 200)).toEqual([]);
    expect(Math.max(...answers.map((a) => a.ms))).toBeLessThan(2_000);

    for (const url of f.urls) {
      await eventually(async () => sum(await scrapeMetrics(url), 'stormgate_state_degraded') === 1, 5_000, 'degraded');
      const ready = (await (await fetch(`${url}/readyz`)).json()) as { degraded?: boolean };
      expect(ready.degraded).toBe(true);
    }
    await redis.restart();
    for (const url of f.urls) await eventually(async () => sum(await scrapeMetrics(url), 'stormgate_state_degraded') === 0, 10_000, 'recovered');
    const lines = f.logs.map((l) => JSON.parse(l) as { msg: string; level: number; degradedMs?: number; redis?: string });
    const recovered = lines.filter((l) => l.msg === 'state store recovered: using Redis');
    expect(recovered).toHaveLength(3);
    for (const l of recovered) {
      expect(l.degradedMs).toBeGreaterThan(0);
      expect(l.redis).toBe(`127.0.0.1:${redis.port}`);
    }
    const warnings = lines.filter((l) => l.level === 40 && /redis|state store/i.test(l.msg));
    expect(warnings).toHaveLength(3);
  });

  it('writes a breaker A opened alone while Redis was away to Redis on its return: B, which saw the target closed, turns requests away with nothing sent', async () => {
    const redis = await startRedis();
    ownRedis.push(redis);
    const p = await startMock();
    const f = await fleet(2, chatRoute({ route: '    retry: { maxAttempts: 1 }\n    park: false' }), { p }, { redis, state: 'commandTimeoutMs: 200' });
    for (const url of f.urls) expect((await post(url)).status).toBe(200);

    await redis.stop();
    await mockControl(p, 'PUT', 'faults', { errors: [{ status: 503 }] });
    // Five failures in a row open it once A has had no success for 250 ms, else a run of twenty does.
    for (let i = 0; i < 20 && sum(await scrapeMetrics(f.urls[0]!), 'stormgate_breaker_state', { target: 'p/gpt-4o' }) !== 1; i++) {
      expect((await post(f.urls[0]!)).status).toBe(503);
    }
    expect(sum(await scrapeMetrics(f.urls[0]!), 'stormgate_breaker_state', { target: 'p/gpt-4o' })).toBe(1);
    expect(sum(await scrapeMetrics(f.urls[1]!), 'stormgate_breaker_state', { target: 'p/gpt-4o' })).toBe(0);
    await redis.restart(); // empty: no persistence

    for (const url of f.urls) await eventually(async () => sum(await scrapeMetrics(url), 'stormgate_state_degraded') === 0, 10_000, 'recovered');
    await eventually(async () => sum(await scrapeMetrics(f.urls[1]!), 'stormgate_breaker_state', { target: 'p/gpt-4o' }) === 1, 5_000, "A's breaker on B");
    const before = await mockTotal(p);
    const onB = await post(f.urls[1]!);
    expect(onB.status).toBe(503);
    expectOpenAIError(onB.body, 'circuit_open', 'server_error');
    expect(await mockTotal(p)).toBe(before);
  });

  it('keeps a hold-off A learnt while Redis was away after its return: B, which had used the target, obeys it', async () => {
    const redis = await startRedis();
    ownRedis.push(redis);
    const p = await startMock();
    const f = await fleet(2, chatRoute({ provider: ', breaker: false', route: '    park: false' }), { p }, { redis, state: 'commandTimeoutMs: 200' });
    for (const url of f.urls) expect((await post(url)).status).toBe(200);

    await redis.stop();
    await mockControl(p, 'PUT', 'faults', { errors: [{ status: 429, times: 1, headers: { 'retry-after': '40' } }] });
    expect((await post(f.urls[0]!)).status).toBe(429);
    await redis.restart();

    for (const url of f.urls) await eventually(async () => sum(await scrapeMetrics(url), 'stormgate_state_degraded') === 0, 10_000, 'recovered');
    await eventually(
      async () => sum(await scrapeMetrics(f.urls[1]!), 'stormgate_hold_remaining_seconds', { target: 'p/gpt-4o', kind: 'hold_off', tier: 'all' }) > 0,
      5_000,
      "A's hold-off on B",
    );
    const before = await mockTotal(p);
    const onB = await post(f.urls[1]!);
    expect(onB.status).toBe(429);
    expectOpenAIError(onB.body, 'provider_held_off', 'rate_limit_error');
    const retryAfter = Number(onB.headers.get('retry-after'));
    expect(retryAfter).toBeGreaterThan(25);
    expect(retryAfter).toBeLessThanOrEqual(48);
    expect(await mockTotal(p)).toBe(before);
  });

  for (const how of ['CLIENT PAUSE ALL', 'SIGSTOP'] as const) {
    it(`stalls no request past a few commandTimeoutMs while Redis answers nothing (${how}): retries and a model first seen meanwhile included`, async () => {
      const redis = await startRedis();
      ownRedis.push(redis);
      const p = await startMock();
      const f = await fleet(3, chatRoute({ provider: ', breaker: false', route: '    park: false\n    retry: { maxAttempts: 2, backoff: { strategy: fixed, baseMs: 10 } }' }), { p }, { redis, state: 'commandTimeoutMs: 100' });
      for (const url of f.urls) expect((await post(url)).status).toBe(200);
      // Every first attempt fails: each request takes a retry from the budget (a Lua call that waits for Redis).
      await mockControl(p, 'PUT', 'faults', { errors: [{ status: 503, firstAttemptsOnly: true }] });

      let admin: Redis | undefined;
      if (how === 'CLIENT PAUSE ALL') {
        admin = new Redis(redis.url);
        await admin.call('CLIENT', 'PAUSE', '3000', 'ALL');
      } else {
        thaws.push(redis.freeze());
      }
      try {
        const started = Date.now();
        const answers = await Promise.all(
          f.urls.flatMap((url) => [post(url), post(url), post(url, { model: 'gpt-4o-mini', messages: hi })]),
        );
        expect(answers.map((a) => a.status)).toEqual(Array(9).fill(200));
        // Far less than the 3 s Redis is away: each Redis wait is cut at commandTimeoutMs.
        expect(Math.max(...answers.map((a) => a.ms))).toBeLessThan(1_500);
        expect(Date.now() - started).toBeLessThan(2_000);
      } finally {
        if (admin) {
          await admin.call('CLIENT', 'UNPAUSE').catch(() => undefined);
          admin.disconnect();
        }
        for (const thaw of thaws.splice(0)) thaw();
      }
      for (const url of f.urls) await eventually(async () => sum(await scrapeMetrics(url), 'stormgate_state_degraded') === 0, 10_000, 'on Redis again');
    });
  }
});

describe('idempotency keys across a fleet of three', () => {
  it('replays the answer of a keyed run on A byte for byte on B and C; another body under the key is refused; one upstream request', async () => {
    const p = await startMock();
    const f = await fleet(3, chatRoute(), { p });
    const body = JSON.stringify({ model: 'gpt-4o', messages: hi });
    const key = { 'idempotency-key': `tp46-${Date.now()}-replay` };
    const run = await post(f.urls[0]!, body, key);
    expect(run.status).toBe(200);
    for (const url of [f.urls[1]!, f.urls[2]!]) {
      const again = await post(url, body, key);
      expect(again.status).toBe(200);
      expect(again.text).toBe(run.text);
      expect(again.headers.get('idempotent-replayed')).toBe('true');
      expect(again.headers.get('x-request-id')).toBe(run.headers.get('x-request-id'));
    }
    // The SDK, with the key in its headers, gets the same completion.
    const viaSdk = await openai(f.urls[2]!).chat.completions.create({ model: 'gpt-4o', messages: hi }, { headers: key });
    expect(viaSdk.id).toBe(run.body.id);

    const other = await post(f.urls[2]!, { model: 'gpt-4o', messages: [{ role: 'user', content: 'Another question' }] }, key);
    expect(other.status).toBe(422);
    expectOpenAIError(other.body, 'idempotency_key_reused');
    expect(await mockTotal(p)).toBe(1);
    expect(await fleetSum(f.urls, 'stormgate_requests_total', { outcome: 'replayed' })).toBe(3);
  });

  it('replays a keyed stream run on A as a stream to the SDK on B, the same text, nothing sent again', async () => {
    const p = await startMock();
    const f = await fleet(2, chatRoute(), { p });
    const key = { 'idempotency-key': `tp46-${Date.now()}-stream` };
    const texts: string[] = [];
    for (const url of f.urls) {
      const stream = await openai(url).chat.completions.create({ model: 'gpt-4o', messages: hi, stream: true }, { headers: key });
      let text = '';
      for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
      texts.push(text);
    }
    expect(texts[0]!.length).toBeGreaterThan(0);
    expect(texts[1]).toBe(texts[0]);
    expect(await mockTotal(p)).toBe(1);
  });

  it("gives a failed run's key back: its repeat on B runs the request again and is answered", async () => {
    const p = await startMock();
    await mockControl(p, 'PUT', 'faults', { errors: [{ status: 503, times: 1 }] });
    const f = await fleet(2, chatRoute({ provider: ', breaker: false', route: '    retry: { maxAttempts: 1 }\n    park: false' }), { p });
    const body = JSON.stringify({ model: 'gpt-4o', messages: hi });
    const key = { 'idempotency-key': `tp46-${Date.now()}-failed` };
    const run = await post(f.urls[0]!, body, key);
    expect(run.status).toBe(503);
    const again = await post(f.urls[1]!, body, key);
    expect(again.status).toBe(200);
    expect(again.headers.get('idempotent-replayed')).toBeNull();
    expect(await mockTotal(p)).toBe(2);
    // And that answer is now the key's, on A too.
    const third = await post(f.urls[0]!, body, key);
    expect(third.text).toBe(again.text);
    expect(third.headers.get('idempotent-replayed')).toBe('true');
    expect(await mockTotal(p)).toBe(2);
  });
});

describe("a fleet's amplification during a brownout", () => {
  it('keeps upstream attempts per client request bounded across three instances under SDK clients with their default retries, and counts them as the provider saw them', async () => {
    const p = await startMock();
    // A floor of 1 retry a second: the default, 10, is more than this run of few calls would spend, which leaves the
    // ratio nothing to bound.
    const f = await fleet(3, chatRoute({ route: '    budget: { minRetriesPerSecond: 1 }' }), { p });
    for (const url of f.urls) expect((await post(url)).status).toBe(200);
    const warm = await mockTotal(p);

    const counter = { requests: 0 };
    let calls = 0;
    let answered = 0;
    const failed: { at: number; status?: number; code?: string | null; shouldRetry?: string | null }[] = [];
    const start = Date.now();
    const until = start + 3_000;
    await mockControl(p, 'POST', 'brownout', { mode: '503', durationMs: 1_500 });
    const agents = Array.from({ length: 30 }, async (_, i) => {
      const client = openai(f.urls[i % 3]!, { maxRetries: 2, counter });
      while (Date.now() < until) {
        calls++;
        const at = Date.now() - start;
        try {
          await client.chat.completions.create({ model: 'gpt-4o', messages: hi }, { timeout: 15_000 });
          answered++;
        } catch (err) {
          const e = err as InstanceType<typeof OpenAI.APIError>;
          failed.push({ at, status: e.status, code: e.code, shouldRetry: e.headers?.get('x-should-retry') });
          await sleep(100);
        }
      }
    });
    await Promise.all(agents);
    const upstream = (await mockTotal(p)) - warm;
    const gatewayRequests = (await fleetSum(f.urls, 'stormgate_requests_total')) - 3;
    expect(gatewayRequests).toBe(counter.requests);
    // The gateway's counts are the provider's: every attempt it sent, once, on whichever instance sent it.
    expect((await fleetSum(f.urls, 'stormgate_upstream_attempts_total')) - 3).toBe(upstream);
    // First attempts, a tenth more as retries, the budget's floor (one a second, fleet-wide) and the probes.
    expect(upstream).toBeLessThanOrEqual(Math.ceil(1.1 * gatewayRequests) + 20);
    // Far from the 3x the SDK's own two retries would make of every call the brownout caught (1.5 to 1.6 measured:
    // the probes and the budget's floor weigh more in a run of few calls).
    expect(upstream / calls).toBeLessThan(2);
    // The SDK's own retries did not multiply the gateway's: the provider's 503s the budget left unretried (the first
    // wave, before the breaker opened) came with x-should-retry false, and the SDK sent nothing again.
    expect(counter.requests).toBe(calls);
    for (const e of failed) expect(e).toMatchObject({ status: 503, shouldRetry: 'false' });
    // Only the first wave failed: every call made after it parked behind the breaker and was answered once the
    // probes found the provider back.
    expect(failed.every((e) => e.at < 500)).toBe(true);
    expect(failed.length).toBeLessThanOrEqual(30);
    expect(answered).toBe(calls - failed.length);
    expect(answered).toBeGreaterThanOrEqual(30);
  });
});
