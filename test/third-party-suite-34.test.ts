// A thirty-fourth third-party suite, written from the README alone (its top: "The incidents it exists to prevent";
// "What happens to a request"; "Tests and benchmarks" on `bench:storm`; "Deployment" on keep-alive and a fleet on
// Redis; "The mock provider"; with "Retry budget, circuit breaker, hold-offs, parking" and "Failover and API families"
// where the incidents need them), as an outside team evaluating LLM gateways would REPLAY THE README'S OWN INCIDENT
// LIST against it, scaled down: a brownout under agents with naive 1 s retries (upstream amplification counted at the
// mock's /_mock/stats and /_mock/requests), a shared 429 `retry-after` and the herd after it, ghost requests after
// client timeouts, SDK retries on top of gateway retries, the pipeline's documented order of checks, a keep-alive
// client riding an outage, a fleet of three instances sharing breaker, hold-off and budget through a real
// redis-server that is then stopped and restarted empty, and failover of tool calls to an Anthropic-family backup.
// Timings are scaled down and bounds are generous (a loaded 2-core machine).
import { Agent, request as httpRequest, type IncomingMessage } from 'node:http';
import type { Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import type { FaultSpec, MockRequestLog, MockServer, MockStats } from '../src/mock/server.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { scrapeMetrics, TEST_KEY, useExtraMocks, useGateways } from './helpers/stack.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();
const redisServer = useRedisServer();

type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];

const CHAT = '/v1/chat/completions';
const chatBody = (content: string, model = 'gpt-4o') => ({ model, messages: [{ role: 'user' as const, content }] });

// ---------------------------------------------------------------------------------------------------------------
// Setting up: one OpenAI-family mock (and, where a test wants one, an Anthropic-family backup), a gateway in front.

interface Setup {
  route?: Partial<RouteInput>;
  provider?: Partial<ProviderInput>;
  /** An Anthropic-family backup target (a second mock) after the primary. */
  claude?: MockServer;
  redis?: string;
  prefix?: string;
  auth?: ConfigInput['auth'];
}

function configInput(mock: MockServer, o: Setup = {}): ConfigInput {
  const targets: RouteInput['targets'] = [{ provider: 'mock' }];
  if (o.claude) targets.push({ provider: 'claude', model: 'claude-sonnet-4-5' });
  return {
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    providers: {
      mock: { family: 'openai', baseUrl: `${mock.url}/v1`, apiKey: TEST_KEY, maxConnections: 256, ...o.provider },
      ...(o.claude && { claude: { family: 'anthropic', baseUrl: o.claude.url, apiKey: TEST_KEY, maxConnections: 64, breaker: false } }),
      anthropic: { family: 'anthropic', baseUrl: mock.url, apiKey: TEST_KEY, maxConnections: 64, ...o.provider },
    },
    routes: [
      { name: 'chat', match: { path: CHAT, models: ['gpt-4o'] }, targets, timeoutMs: 20_000, ...o.route },
      { name: 'messages', match: { path: '/v1/messages' }, targets: [{ provider: 'anthropic' }], timeoutMs: 20_000, ...o.route },
    ],
    ...(o.auth && { auth: o.auth }),
    ...(o.redis && { state: { redis: o.redis, keyPrefix: o.prefix ?? 'tp34', commandTimeoutMs: 200 } }),
  };
}

async function gateway(mock: MockServer, o: Setup = {}): Promise<string> {
  return startGateway(ConfigSchema.parse(configInput(mock, o)));
}

const sdk = (url: string, opts: ConstructorParameters<typeof OpenAI>[0] = {}) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sk-unused', ...opts });

/** An SDK client whose HTTP requests (its own retries included) are counted. */
function countingSdk(url: string, opts: ConstructorParameters<typeof OpenAI>[0] = {}) {
  const counter = { requests: 0 };
  const client = sdk(url, {
    fetch: async (u, init) => {
      counter.requests++;
      return fetch(u, init);
    },
    ...opts,
  });
  return { client, counter };
}

/** What the mock says about itself, over HTTP, as an evaluator reads it. */
async function mockStats(mock: MockServer): Promise<MockStats> {
  return (await (await fetch(`${mock.url}/_mock/stats`)).json()) as MockStats;
}
async function mockLog(mock: MockServer, limit = 10_000): Promise<MockRequestLog[]> {
  return (await (await fetch(`${mock.url}/_mock/requests?limit=${limit}`)).json()) as MockRequestLog[];
}

async function post(url: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(`${url}${CHAT}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: typeof body === 'string' ? body : JSON.stringify(body) });
  const json = (await res.json().catch(() => undefined)) as { error?: { code?: string; type?: string } } | undefined;
  return { status: res.status, headers: res.headers, json };
}

async function metric(url: string, name: string): Promise<number> {
  return (await scrapeMetrics(url)).filter((s) => s.name === name).reduce((sum, s) => sum + s.value, 0);
}

async function until(what: string, check: () => Promise<boolean> | boolean, withinMs = 10_000): Promise<void> {
  const end = Date.now() + withinMs;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

// ---------------------------------------------------------------------------------------------------------------
describe('the incident list at the top of the README, replayed', () => {
  it('a 4 s brownout under open-loop agents with naive 1 s retries: direct, the provider sees ≥1.8x the logical requests; through the gateway at most 0.35x, and every call succeeds', async () => {
    // bench:storm, scaled: 30 logical requests/s for 7 s, a 503 brownout from 1 s to 5 s, clients retrying every
    // second. The README: "Through the gateway the provider sees 0.03 requests per logical request during the
    // brownout (2.9x and 3.6x directly)". Probing every second at most, so the recovery is found within a second.
    const direct = await startMock({ faults: { latencyMs: 20 } });
    const behind = await startMock({ faults: { latencyMs: 20 } });
    const url = await gateway(behind, {
      route: { timeoutMs: 15_000 },
      provider: { breaker: { probeWhileParkedMs: 500, probeWhileParkedMaxMs: 1000 } },
    });
    const naive = async (client: OpenAI, i: number) => {
      for (let tries = 1; tries <= 12; tries++) {
        try {
          await client.chat.completions.create(chatBody(`call ${i}`));
          return tries;
        } catch {
          await sleep(1000);
        }
      }
      return 0;
    };
    const directClient = new OpenAI({ baseURL: `${direct.url}/v1`, apiKey: 'any', maxRetries: 0, timeout: 15_000 });
    const gwClient = sdk(url, { maxRetries: 0, timeout: 15_000 });
    const t0 = Date.now();
    const brownStart = t0 + 1000;
    const brownEnd = brownStart + 4000;
    const calls: Array<Promise<[number, number]>> = [];
    const arrivals: number[] = [];
    const timer = setTimeout(() => {
      direct.brownout('503', 4000);
      behind.brownout('503', 4000);
    }, 1000);
    for (let i = 0; i < 210; i++) {
      const at = t0 + (i * 1000) / 30;
      await sleep(Math.max(0, at - Date.now()));
      arrivals.push(Date.now());
      calls.push(Promise.all([naive(directClient, i), naive(gwClient, i)]));
    }
    const results = await Promise.all(calls);
    clearTimeout(timer);

    const logicalInBrownout = arrivals.filter((a) => a >= brownStart && a < brownEnd).length;
    const upstreamInBrownout = async (m: MockServer) => (await mockLog(m)).filter((r) => r.receivedAt >= brownStart && r.receivedAt < brownEnd).length;
    const directAmp = (await upstreamInBrownout(direct)) / logicalInBrownout;
    const gwAmp = (await upstreamInBrownout(behind)) / logicalInBrownout;
    expect(logicalInBrownout).toBeGreaterThan(100);
    expect(directAmp).toBeGreaterThanOrEqual(1.8);
    expect(gwAmp).toBeLessThanOrEqual(0.35);
    // Every call through the gateway was answered, and hardly any needed the client's own retry.
    expect(results.every(([, gw]) => gw > 0)).toBe(true);
    const clientRetriesThroughGateway = results.reduce((n, [, gw]) => n + gw - 1, 0);
    expect(clientRetriesThroughGateway).toBeLessThanOrEqual(0.2 * results.length);
    const stats = await mockStats(behind);
    expect(stats.byStatus['200']).toBe(210);
  }, 60_000);

  it('a shared 429 with retry-after 2: nothing goes upstream until the hold-off ends, then the herd comes back spread out, not in one burst', async () => {
    const mock = await startMock();
    const url = await gateway(mock);
    const { client, counter } = countingSdk(url);
    mock.brownout('429', 2000);
    const calls = await Promise.all(Array.from({ length: 30 }, (_, i) => client.chat.completions.create(chatBody(`herd ${i}`))));
    expect(calls).toHaveLength(30);
    expect(counter.requests).toBe(30); // the gateway carried them: the SDK sent each once
    const log = await mockLog(mock);
    const refused = log.filter((r) => r.status === 429);
    const answered = log.filter((r) => r.status === 200);
    expect(refused.length).toBeGreaterThanOrEqual(1);
    expect(answered).toHaveLength(30);
    const firstRefusal = Math.min(...refused.map((r) => r.receivedAt));
    // "no instance sends that target new attempts until it ends": the hint was 2 s (times 1 to 1.2).
    const backAt = answered.map((r) => r.receivedAt).sort((a, b) => a - b);
    expect(backAt[0]! - firstRefusal).toBeGreaterThanOrEqual(1900);
    expect(refused.every((r) => r.receivedAt - firstRefusal < 500)).toBe(true);
    // "a provider that said 'come back in 1.5 s' to 40 requests sees them return over about 300 ms".
    const spread = backAt.at(-1)! - backAt[0]!;
    expect(spread).toBeGreaterThanOrEqual(120);
    expect(spread).toBeLessThan(2000);
  }, 30_000);

  it('ghost requests: a provider hang under clients with a 1.5 s timeout is answered 504 before the timeout, sent once by the SDK, and no upstream request outlives its client', async () => {
    const mock = await startMock();
    const url = await gateway(mock);
    const { client, counter } = countingSdk(url);
    mock.brownout('hang', 5000);
    const started = Date.now();
    const outcomes = await Promise.all(
      Array.from({ length: 10 }, async (_, i) => {
        const t = Date.now();
        const err = await client.chat.completions.create(chatBody(`ghost ${i}`), { timeout: 1500 }).then(
          () => undefined,
          (e: unknown) => e,
        );
        return { err, ms: Date.now() - t };
      }),
    );
    for (const { err, ms } of outcomes) {
      expect(err).toBeInstanceOf(OpenAI.APIError);
      expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(504);
      expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('deadline_exceeded');
      expect(ms).toBeLessThan(1500);
    }
    expect(counter.requests).toBe(10); // x-should-retry: false, so the SDK's 2 retries stayed off
    await until('the mock to see every upstream request end', async () => (await mockLog(mock)).every((r) => r.endedAt !== undefined), 3000);
    const log = await mockLog(mock);
    expect(log.length).toBeGreaterThanOrEqual(10);
    for (const r of log) expect(r.endedAt! - started).toBeLessThanOrEqual(1500 + 150);
  }, 30_000);

  it('a client that gives up (an abort, no timeout header) ends the gateway\'s retrying at once: no upstream attempt starts after it left', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 503 }] } });
    const url = await gateway(mock, {
      route: { park: false, retry: { maxAttempts: 10, backoff: { strategy: 'fixed', baseMs: 300, capMs: 300 } }, budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 } },
      provider: { breaker: false },
    });
    const controller = new AbortController();
    const call = sdk(url, { maxRetries: 0 }).chat.completions.create(chatBody('ghost'), { signal: controller.signal });
    await sleep(800);
    controller.abort();
    const leftAt = Date.now();
    await expect(call).rejects.toThrow();
    await sleep(1200);
    const log = await mockLog(mock);
    expect(log.length).toBeGreaterThanOrEqual(2);
    expect(log.every((r) => r.receivedAt <= leftAt + 50)).toBe(true);
  }, 20_000);

  it('the recovery from a brownout in front of a concurrency-limited provider brings no 429s: the parked backlog is released at the pool\'s pace', async () => {
    // "in this scenario (a provider with a concurrency limit) the recovery brings no 429s".
    const mock = await startMock({ faults: { latencyMs: 100, capacity: 8 } });
    const url = await gateway(mock, { provider: { pools: { maxConcurrent: 8 }, breaker: { probeWhileParkedMs: 500, probeWhileParkedMaxMs: 1000 } } });
    mock.brownout('503', 2000);
    const client = sdk(url, { maxRetries: 0 });
    const calls = await Promise.all(Array.from({ length: 80 }, (_, i) => client.chat.completions.create(chatBody(`backlog ${i}`)).then(() => 200, (e: { status?: number }) => e.status ?? 0)));
    const stats = await mockStats(mock);
    expect(stats.byStatus['429'] ?? 0).toBe(0);
    expect(calls.filter((s) => s === 200).length).toBeGreaterThanOrEqual(72);
    expect(stats.byStatus['200']).toBe(calls.filter((s) => s === 200).length);
  }, 30_000);

  it("a fleet's burst faster than the provider's rate limit: without a pool rate it is answered 429 past what the retry budget allows; with pools.requestsPerMinute 5% under the limit every call waits its turn and none meets a 429", async () => {
    // The top's incident: "a fleet's requests sent faster than the provider's rate limit, to be answered 429 (with
    // pools.requestsPerMinute and tokensPerMinute they wait their turn in the gateway instead)". The mock enforces
    // 600 RPM over a second (a bucket of 10), with 429s without retry-after, as OpenAI's.
    const rate: FaultSpec = { rateLimit: { requestsPerMinute: 600, burstSeconds: 1 } };
    const burst = async (provider: Partial<ProviderInput>) => {
      const mock = await startMock({ faults: rate });
      const url = await gateway(mock, { provider, route: { retry: { maxAttempts: 5 }, budget: { minRetriesPerSecond: 1 } } });
      const { client, counter } = countingSdk(url);
      const outcomes = await Promise.all(Array.from({ length: 30 }, (_, i) => client.chat.completions.create(chatBody(`burst ${i}`)).then(() => undefined, (e: unknown) => e as InstanceType<typeof OpenAI.APIError>)));
      return { failed: outcomes.filter((e) => e !== undefined), sdkRequests: counter.requests, stats: await mockStats(mock), log: await mockLog(mock) };
    };
    const unpaced = await burst({});
    expect(unpaced.stats.rateLimited.requests).toBeGreaterThan(0);
    const retries = unpaced.log.filter((r) => r.headers['x-retry-attempt'] !== undefined);
    expect(retries.every((r) => r.headers['x-retry-reason'] === 'status_429')).toBe(true);
    // The budget: a tenth of the 30 requests, with a floor of 1 a second over its 10 s window (set: the default floor
    // of 10 a second would retry the whole burst).
    expect(retries.length).toBeLessThanOrEqual(10 + 3);
    expect(unpaced.failed.length).toBeGreaterThan(0);
    for (const err of unpaced.failed) {
      expect(err.status).toBe(429);
      expect(err.code).toBe('rate_limit_exceeded');
      expect(err.headers?.get('x-should-retry')).toBe('false');
    }
    expect(unpaced.sdkRequests).toBe(30);

    const paced = await burst({ pools: { requestsPerMinute: 570 } });
    expect(paced.failed).toHaveLength(0);
    expect(paced.stats.byStatus['429'] ?? 0).toBe(0);
    expect(paced.stats.total).toBe(30);
  }, 40_000);

  it('an SDK retrying on top of a gateway retrying: against a provider answering 503, the openai SDK sends each call once and the provider gets the route\'s 3 attempts', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 503 }] } });
    const url = await gateway(mock, {
      route: { park: false, retry: { maxAttempts: 3, backoff: { strategy: 'full-jitter', baseMs: 20, capMs: 50 } }, budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 } },
      provider: { breaker: false },
    });
    const { client, counter } = countingSdk(url); // default maxRetries: 2
    const errors = await Promise.all(Array.from({ length: 4 }, (_, i) => client.chat.completions.create(chatBody(`sdk ${i}`)).catch((e: unknown) => e)));
    for (const e of errors) {
      const err = e as InstanceType<typeof OpenAI.APIError>;
      expect(err.status).toBe(503);
      expect(err.headers?.get('x-should-retry')).toBe('false');
      expect(err.headers?.get('x-stormgate-attempts')).toBe('3');
    }
    expect(counter.requests).toBe(4);
    expect((await mockStats(mock)).byStatus['503']).toBe(12);
    const retried = (await mockLog(mock)).filter((r) => r.headers['x-retry-attempt'] !== undefined);
    expect(retried.map((r) => r.headers['x-retry-reason'])).toEqual(Array(8).fill('status_503'));
  }, 30_000);

  it('the same with the Anthropic SDK on /v1/messages: one HTTP request per call, 3 upstream attempts, x-should-retry false', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 503 }] } });
    const url = await gateway(mock, {
      route: { park: false, retry: { maxAttempts: 3, backoff: { strategy: 'full-jitter', baseMs: 20, capMs: 50 } }, budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 } },
      provider: { breaker: false },
    });
    let sent = 0;
    const claude = new Anthropic({ baseURL: url, apiKey: 'sk-ant-unused', fetch: async (u, init) => (sent++, fetch(u, init)) });
    const err = (await claude.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 64, messages: [{ role: 'user', content: 'hi' }] }).catch((e: unknown) => e)) as InstanceType<typeof Anthropic.APIError>;
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(err.status).toBe(503);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(sent).toBe(1);
    expect((await mockStats(mock)).byPath['/v1/messages']).toBe(3);
  }, 30_000);
});

// ---------------------------------------------------------------------------------------------------------------
describe('"What happens to a request": the order of the checks', () => {
  const keys = { agents: 'sk-agents-0123456789abcdef' };

  it('the client key is checked before the body is parsed: a wrong key with a broken body is 401, the right key with it 400, and nothing goes upstream', async () => {
    const mock = await startMock();
    const url = await gateway(mock, { auth: { keys } });
    const wrong = await post(url, '{"model": "gpt-4o", broken', { authorization: 'Bearer sk-wrong' });
    expect(wrong.status).toBe(401);
    expect(wrong.json?.error?.code).toBe('invalid_api_key');
    const right = await post(url, '{"model": "gpt-4o", broken', { authorization: `Bearer ${keys.agents}` });
    expect(right.status).toBe(400);
    expect(right.json?.error?.code).toBe('invalid_json');
    expect((await mockStats(mock)).total).toBe(0);
  });

  it("a client past its rate gets 429 client_rate_limited from its headers alone, before its body is read", async () => {
    const mock = await startMock();
    const url = await gateway(mock, { auth: { keys, limits: { agents: { requestsPerMinute: 6, burst: 1 } } } });
    const first = await post(url, chatBody('first'), { authorization: `Bearer ${keys.agents}` });
    expect(first.status).toBe(200);
    // The second request announces a body and never sends it: its answer can only come from its headers.
    const port = Number(new URL(url).port);
    const res = await new Promise<IncomingMessage>((resolve, reject) => {
      const req = httpRequest({ host: '127.0.0.1', port, method: 'POST', path: CHAT, headers: { authorization: `Bearer ${keys.agents}`, 'content-type': 'application/json', 'content-length': '5000' } });
      req.on('response', resolve);
      req.on('error', reject);
      req.setTimeout(5000, () => reject(new Error('no answer before the body')));
      req.flushHeaders();
    });
    const text = await new Promise<string>((resolve) => {
      let s = '';
      res.on('data', (d: Buffer) => (s += d.toString()));
      res.on('end', () => resolve(s));
      res.on('close', () => resolve(s));
    });
    expect(res.statusCode).toBe(429);
    expect((JSON.parse(text) as { error: { code: string } }).error.code).toBe('client_rate_limited');
    expect(Number(res.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    expect(res.headers['x-should-retry']).toBe('true');
    expect((await mockStats(mock)).total).toBe(1);
  });

  it('the body is parsed before the route is chosen: a broken body naming an unknown model is 400 invalid_json, a valid one 404 model_not_found', async () => {
    const mock = await startMock();
    const url = await gateway(mock);
    const broken = await post(url, '{"model": "no-such-model", "messages": [');
    expect(broken.status).toBe(400);
    expect(broken.json?.error?.code).toBe('invalid_json');
    const unknown = await post(url, chatBody('hi', 'no-such-model'));
    expect(unknown.status).toBe(404);
    expect(unknown.json?.error?.code).toBe('model_not_found');
    expect(unknown.headers.get('x-should-retry')).toBe('false');
    expect((await mockStats(mock)).total).toBe(0);
  });

  it('the route is chosen before the Idempotency-Key is claimed: a 404 under a key leaves the key free for the call it was meant for, which then runs once', async () => {
    const mock = await startMock();
    const url = await gateway(mock);
    const key = `tp34-${process.pid}-${Date.now()}`;
    const miss = await post(url, chatBody('coupon', 'no-such-model'), { 'idempotency-key': key });
    expect(miss.status).toBe(404);
    const run = await post(url, chatBody('coupon'), { 'idempotency-key': key });
    expect(run.status).toBe(200);
    const again = await post(url, chatBody('coupon'), { 'idempotency-key': key });
    expect(again.status).toBe(200);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect((await mockStats(mock)).total).toBe(1);
  });

  it('the deadline is the smallest of timeoutMs, x-stormgate-timeout-ms, x-stainless-timeout and x-stainless-read-timeout, less the margin: each answered 504 before its client gives up', async () => {
    const mock = await startMock({ faults: { latencyMs: 10_000 } });
    const url = await gateway(mock);
    const cases: Array<{ headers: Record<string, string>; clientMs: number }> = [
      { headers: { 'x-stormgate-timeout-ms': '1500', 'x-stainless-timeout': '5' }, clientMs: 1500 },
      { headers: { 'x-stormgate-timeout-ms': '9000', 'x-stainless-timeout': '2' }, clientMs: 2000 },
      { headers: { 'x-stainless-timeout': '5', 'x-stainless-read-timeout': '1.2' }, clientMs: 1200 },
    ];
    const answers = await Promise.all(
      cases.map(async (c) => {
        const t = Date.now();
        const a = await post(url, chatBody('slow'), c.headers);
        return { ...a, ms: Date.now() - t, clientMs: c.clientMs };
      }),
    );
    for (const a of answers) {
      expect(a.status).toBe(504);
      expect(a.json?.error?.code).toBe('deadline_exceeded');
      expect(a.headers.get('x-should-retry')).toBe('false');
      expect(a.ms).toBeLessThan(a.clientMs);
      expect(a.ms).toBeGreaterThanOrEqual(a.clientMs - 250 - 150);
    }
  }, 20_000);

  it('a wait hint replaces the backoff, times U(1, 1.2): a 429 with retry-after-ms 1000 is retried 1 to 1.2 s later, marked x-retry-attempt 1 and x-retry-reason status_429', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after-ms': '1000' } }] } });
    const url = await gateway(mock);
    const answer = await post(url, chatBody('hint'));
    expect(answer.status).toBe(200);
    expect(answer.headers.get('x-stormgate-attempts')).toBe('2');
    const [first, retry] = await mockLog(mock);
    expect(first!.status).toBe(429);
    expect(first!.headers['x-retry-attempt']).toBeUndefined();
    expect(retry!.headers['x-retry-attempt']).toBe('1');
    expect(retry!.headers['x-retry-reason']).toBe('status_429');
    const waited = retry!.receivedAt - first!.receivedAt;
    expect(waited).toBeGreaterThanOrEqual(1000);
    expect(waited).toBeLessThan(1200 + 400);
  }, 20_000);
});

// ---------------------------------------------------------------------------------------------------------------
describe('"Deployment": a keep-alive client rides an outage on the connection it has', () => {
  it('20 calls answered 503 circuit_open through a provider outage all go over one connection, and answers say Keep-Alive: timeout=72', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 503 }] } });
    const url = await gateway(mock, { route: { park: false, retry: { maxAttempts: 1 } }, provider: { breaker: { consecutiveFailures: 3 } } });
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    const sockets = new Set<Socket>();
    const port = Number(new URL(url).port);
    const statuses: number[] = [];
    const codes = new Set<string>();
    let keepAlive: string | undefined;
    try {
      for (let i = 0; i < 20; i++) {
        const payload = JSON.stringify(chatBody(`ka ${i}`));
        const { status, text, ka } = await new Promise<{ status: number; text: string; ka: string | undefined }>((resolve, reject) => {
          const req = httpRequest({ agent, host: '127.0.0.1', port, method: 'POST', path: CHAT, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) } }, (res) => {
            let s = '';
            res.on('data', (d: Buffer) => (s += d.toString()));
            res.on('end', () => resolve({ status: res.statusCode!, text: s, ka: res.headers['keep-alive'] as string | undefined }));
          });
          req.on('socket', (s) => sockets.add(s));
          req.on('error', reject);
          req.end(payload);
        });
        statuses.push(status);
        codes.add((JSON.parse(text) as { error: { code: string } }).error.code);
        keepAlive ??= ka;
        if (i === 4) await sleep(300); // "no success from the target for 250 ms"
      }
    } finally {
      agent.destroy();
    }
    expect(statuses.every((s) => s === 503)).toBe(true);
    expect(codes.has('circuit_open')).toBe(true);
    expect(sockets.size).toBe(1);
    expect(keepAlive).toBe('timeout=72');
  }, 20_000);
});

// ---------------------------------------------------------------------------------------------------------------
describe('"Deployment" and "Shared state": a fleet of three instances on one real Redis', () => {
  let prefixes = 0;
  const fleetSetup = (o: Setup = {}): Setup => ({ ...o, redis: redisServer().url, prefix: `tp34-${process.pid}-${++prefixes}` });

  it('a breaker one instance opens holds the whole fleet: the others, and an instance started afterwards, send nothing upstream', async () => {
    const mock = await startMock();
    const setup = fleetSetup({ route: { park: false, retry: { maxAttempts: 1 } }, provider: { breaker: { consecutiveFailures: 5, openS: 30 } } });
    const [a, b, c] = await Promise.all([gateway(mock, setup), gateway(mock, setup), gateway(mock, setup)]);
    // b and c look the target up with a success before the outage, so they hear of the breaker by pub/sub.
    expect((await post(b, chatBody('before'))).status).toBe(200);
    expect((await post(c, chatBody('before'))).status).toBe(200);
    mock.setFaults({ errors: [{ status: 503 }] });
    await sleep(300);
    await until('instance a to open the breaker', async () => (await post(a, chatBody('fail'))).json?.error?.code === 'circuit_open');
    mock.reset();
    await sleep(200);
    for (const other of [b, c]) {
      for (let i = 0; i < 3; i++) {
        const r = await post(other, chatBody(`other ${i}`));
        expect(r.status).toBe(503);
        expect(r.json?.error?.code).toBe('circuit_open');
        expect(Number(r.headers.get('retry-after'))).toBeGreaterThan(1);
      }
    }
    const d = await gateway(mock, setup); // a restarted pod
    const fresh = await post(d, chatBody('fresh'));
    expect(fresh.json?.error?.code).toBe('circuit_open');
    expect((await mockStats(mock)).total).toBe(0);
    // "Each state change ... is logged and counted once, by the instance that made it".
    const opened = await Promise.all([a, b, c, d].map(async (g) => (await scrapeMetrics(g)).filter((m) => m.name === 'stormgate_breaker_transitions_total' && m.labels.to === 'open').reduce((n, m) => n + m.value, 0)));
    expect(opened.reduce((x, y) => x + y, 0)).toBe(1);
  }, 30_000);

  it("a 429's retry-after on one instance holds off the target on all three: the others answer 429 provider_held_off, x-should-retry true, and the provider sees one request until it ends", async () => {
    const mock = await startMock({ faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '3' } }] } });
    const setup = fleetSetup({ route: { park: false, retry: { maxAttempts: 1, maxWaitHintMs: 500 } } });
    const [a, b, c] = await Promise.all([gateway(mock, setup), gateway(mock, setup), gateway(mock, setup)]);
    const started = Date.now();
    const first = await post(a, chatBody('first'));
    expect(first.status).toBe(429);
    await sleep(200);
    const toldMs: number[] = [];
    for (const other of [b, c, a, b, c, a]) {
      const r = await post(other, chatBody('during'));
      expect(r.status).toBe(429);
      expect(r.json?.error?.code).toBe('provider_held_off');
      expect(r.headers.get('x-should-retry')).toBe('true');
      const after = Number(r.headers.get('retry-after'));
      expect(after).toBeGreaterThanOrEqual(1);
      expect(after).toBeLessThanOrEqual(5);
      toldMs.push(Date.now() + Number(r.headers.get('retry-after-ms')));
    }
    // "plus a spread of its own so that those turned away do not all come back at its end at once".
    expect(new Set(toldMs.map((t) => Math.round(t / 20))).size).toBeGreaterThanOrEqual(3);
    expect(Math.min(...toldMs)).toBeGreaterThanOrEqual(started + 3000 - 100);
    expect((await mockStats(mock)).total).toBe(1);
    // "each hold that starts, once fleet-wide".
    const holds = await Promise.all([a, b, c].map((g) => metric(g, 'stormgate_holds_started_total')));
    expect(holds.reduce((x, y) => x + y, 0)).toBe(1);
    await sleep(Math.max(0, started + 3000 * 1.2 + 300 - Date.now()));
    expect((await post(c, chatBody('after'))).status).toBe(200);
  }, 30_000);

  it('the retry budget is the fleet\'s: three instances on one Redis retry about as much as one would, three on their own about three times as much', async () => {
    const failing: FaultSpec = { errors: [{ status: 503 }] };
    const route: Partial<RouteInput> = { park: false, retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 20, capMs: 20 } }, budget: { ratio: 0.1, windowS: 10, minRetriesPerSecond: 1 } };
    const retriesOf = async (setup: Setup) => {
      const mock = await startMock({ faults: failing });
      const fleet = await Promise.all([gateway(mock, setup), gateway(mock, setup), gateway(mock, setup)]);
      await Promise.all(fleet.flatMap((g) => Array.from({ length: 10 }, (_, i) => post(g, chatBody(`budget ${i}`)))));
      return (await mockLog(mock)).filter((r) => r.headers['x-retry-attempt'] !== undefined).length;
    };
    const shared = await retriesOf(fleetSetup({ route, provider: { breaker: false } }));
    const alone = await retriesOf({ route, provider: { breaker: false } });
    expect(shared).toBeGreaterThan(0);
    expect(alone).toBeGreaterThanOrEqual(2 * shared);
  }, 30_000);

  it('Redis stopped and restarted empty: no request fails, every instance reports degraded and comes back, and a breaker opened while Redis was away still holds the fleet', async () => {
    const mock = await startMock();
    const setup = fleetSetup({ route: { park: false, retry: { maxAttempts: 1 } }, provider: { breaker: { consecutiveFailures: 5, openS: 30 } } });
    const fleet = await Promise.all([gateway(mock, setup), gateway(mock, setup), gateway(mock, setup)]);
    const [a, b] = fleet as [string, string, string];
    for (const g of fleet) expect((await post(g, chatBody('before'))).status).toBe(200);
    for (const g of fleet) expect(await metric(g, 'stormgate_state_degraded')).toBe(0);

    await redisServer().stop();
    try {
      for (const g of fleet) for (let i = 0; i < 3; i++) expect((await post(g, chatBody(`away ${i}`))).status).toBe(200);
      await until('every instance to report degraded', async () => (await Promise.all(fleet.map((g) => metric(g, 'stormgate_state_degraded')))).every((v) => v === 1));
      // While Redis is away, instance a alone sees the provider fail and opens its breaker on local state.
      mock.setFaults({ errors: [{ status: 503 }] });
      await sleep(300);
      await until('instance a to open the breaker alone', async () => (await post(a, chatBody('fail'))).json?.error?.code === 'circuit_open');
    } finally {
      await redisServer().restart();
    }
    await until('every instance back on Redis', async () => (await Promise.all(fleet.map((g) => metric(g, 'stormgate_state_degraded')))).every((v) => v === 0), 15_000);
    mock.reset();
    await sleep(300);
    const r = await post(b, chatBody('after'));
    expect(r.json?.error?.code).toBe('circuit_open');
    expect((await mockStats(mock)).total).toBe(0);
  }, 45_000);
  it('parked requests on three instances during an outage: the fleet sends one probe per round, not one per instance, and every parked call is answered once the provider is back', async () => {
    const mock = await startMock();
    const setup = fleetSetup({ route: { retry: { maxAttempts: 1 } }, provider: { breaker: { consecutiveFailures: 5, openS: 30, probeWhileParkedMs: 1000, probeWhileParkedMaxMs: 2000 } } });
    const fleet = await Promise.all([gateway(mock, setup), gateway(mock, setup), gateway(mock, setup)]);
    for (const g of fleet) expect((await post(g, chatBody('before'))).status).toBe(200);
    mock.brownout('503', 4500);
    const brownEnd = Date.now() + 4500;
    await sleep(300);
    // The breaker opens on instance 0's failures; its own failing requests park from then on.
    const early = Array.from({ length: 6 }, (_, i) => post(fleet[0]!, chatBody(`early ${i}`)));
    await until('the breaker to open fleet-wide', async () => (await metric(fleet[2]!, 'stormgate_breaker_state')) === 1, 5000);
    const openedAt = Date.now();
    const parked = fleet.flatMap((g) => Array.from({ length: 5 }, (_, i) => post(g, chatBody(`parked ${i}`))));
    const answers = await Promise.all([...early, ...parked]);
    expect(answers.map((r) => r.status).filter((s) => s !== 200).length).toBeLessThanOrEqual(6); // only the early ones may have failed
    expect(answers.slice(6).every((r) => r.status === 200)).toBe(true);
    const probes = (await mockLog(mock)).filter((r) => r.receivedAt > openedAt + 100 && r.receivedAt < brownEnd);
    // Rounds at about 1 s and 3 s after the breaker opened: a pair per round would be 4 or more.
    expect(probes.length).toBeGreaterThanOrEqual(1);
    expect(probes.length).toBeLessThanOrEqual(3);
  }, 30_000);

  it('retries an instance spent on local state while Redis was away are added to the fleet\'s window on its return: another instance is not granted them again', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 503 }] } });
    const route: Partial<RouteInput> = { park: false, retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 20, capMs: 20 } }, budget: { ratio: 0.1, windowS: 10, minRetriesPerSecond: 1 } };
    const setup = fleetSetup({ route, provider: { breaker: false } });
    const [a, b] = await Promise.all([gateway(mock, setup), gateway(mock, setup)]);
    expect((await post(b, chatBody('look the target up'))).status).toBe(503);
    await redisServer().stop();
    try {
      await until('instance a to be degraded', async () => (await metric(a, 'stormgate_state_degraded')) === 1);
      mock.reset();
      await Promise.all(Array.from({ length: 10 }, (_, i) => post(a, chatBody(`alone ${i}`))));
    } finally {
      await redisServer().restart();
    }
    const retriesOnA = (await mockLog(mock)).filter((r) => r.headers['x-retry-attempt'] !== undefined).length;
    expect(retriesOnA).toBeGreaterThanOrEqual(5); // the floor let instance a retry on its own
    await until('both instances back on Redis', async () => (await metric(a, 'stormgate_state_degraded')) === 0 && (await metric(b, 'stormgate_state_degraded')) === 0, 15_000);
    await sleep(200); // counts are written in batches at most 50 ms apart
    mock.reset();
    await Promise.all(Array.from({ length: 10 }, (_, i) => post(b, chatBody(`after ${i}`))));
    const retriesOnB = (await mockLog(mock)).filter((r) => r.headers['x-retry-attempt'] !== undefined).length;
    // The floor is the fleet's (10 retries in the 10 s window); a merges what it spent, so b has little left.
    expect(retriesOnA + retriesOnB).toBeLessThanOrEqual(14);
  }, 45_000);

  it('an instance started while Redis is down serves from its first answer and says so: stormgate_state_degraded 1 and /readyz degraded: true', async () => {
    const mock = await startMock();
    const setup = fleetSetup();
    await redisServer().stop();
    try {
      const started = Date.now();
      const g = await gateway(mock, setup);
      expect(Date.now() - started).toBeLessThan(5000);
      expect((await post(g, chatBody('first'))).status).toBe(200);
      expect(await metric(g, 'stormgate_state_degraded')).toBe(1);
      const ready = (await (await fetch(`${g}/readyz`)).json()) as { degraded?: boolean };
      expect(ready.degraded).toBe(true);
    } finally {
      await redisServer().restart();
    }
  }, 30_000);
});

// ---------------------------------------------------------------------------------------------------------------
describe('"Failover and API families": tool calls fail over to an Anthropic-family backup', () => {
  const tools: OpenAI.Chat.Completions.ChatCompletionTool[] = [
    { type: 'function', function: { name: 'issue_coupon', description: 'Issue a coupon', parameters: { type: 'object', properties: { x: { type: 'number' } }, required: ['x'] } } },
  ];

  it('an OpenAI brownout moves a tool-calling agent to Claude: the tool call comes back in the OpenAI shape, and the tool result turn is accepted by the strict Messages API', async () => {
    const primary = await startMock();
    const claude = await startMock();
    const url = await gateway(primary, { claude });
    primary.brownout('503', 30_000);
    const client = sdk(url);
    const first = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'give me a coupon' }], tools }).withResponse();
    expect(first.response.headers.get('x-stormgate-target')).toMatch(/^claude/);
    expect(first.response.headers.get('x-stormgate-fallback')).toBeTruthy();
    const call = first.data.choices[0]!;
    expect(call.finish_reason).toBe('tool_calls');
    const toolCall = call.message.tool_calls![0]! as OpenAI.Chat.Completions.ChatCompletionMessageToolCall & { type: 'function' };
    expect(toolCall.function.name).toBe('issue_coupon');
    expect(typeof JSON.parse(toolCall.function.arguments)).toBe('object');

    const second = await client.chat.completions.create({
      model: 'gpt-4o',
      tools,
      messages: [
        { role: 'user', content: 'give me a coupon' },
        { role: 'assistant', content: null, tool_calls: [toolCall] },
        { role: 'tool', tool_call_id: toolCall.id, content: '{"coupon":"SAVE10"}' },
      ],
    });
    expect(second.choices[0]!.finish_reason).toBe('stop');
    expect(second.choices[0]!.message.content).toBeTruthy();
    const backup = (await mockLog(claude)).filter((r) => r.path === '/v1/messages');
    expect(backup.map((r) => r.status)).toEqual([200, 200]);
  }, 30_000);

  it('the same streamed: the SDK assembles the translated tool call from the backup\'s events', async () => {
    const primary = await startMock();
    const claude = await startMock();
    const url = await gateway(primary, { claude });
    primary.brownout('503', 30_000);
    const stream = sdk(url).chat.completions.stream({ model: 'gpt-4o', messages: [{ role: 'user', content: 'give me a coupon' }], tools });
    const done = await stream.finalChatCompletion();
    const choice = done.choices[0]!;
    expect(choice.finish_reason).toBe('tool_calls');
    const toolCall = choice.message.tool_calls![0]! as OpenAI.Chat.Completions.ChatCompletionMessageToolCall & { type: 'function' };
    expect(toolCall.function.name).toBe('issue_coupon');
    expect(JSON.parse(toolCall.function.arguments)).toEqual({ x: 1 });
    expect((await mockStats(claude)).byStatus['200']).toBe(1);
  }, 30_000);
});

// ---------------------------------------------------------------------------------------------------------------
describe('"The mock provider": the harness an evaluator measures with', () => {
  it('faults are deterministic and checked in order: 503:0.3 then 429:0.1 fails exactly 30 and 7 of 100; stats, the request log and reset do what they say', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 503, rate: 0.3 }, { status: 429, rate: 0.1 }] } });
    for (let i = 0; i < 100; i++) {
      const res = await fetch(`${mock.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: 'Bearer any' }, body: JSON.stringify(chatBody(`m ${i}`)) });
      await res.arrayBuffer();
    }
    const direct = await fetch(`${mock.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(chatBody('headers')) });
    await direct.arrayBuffer();
    // "Without rateLimit, the x-ratelimit-*-requests headers only advertise the spec's requestsPerMinute (default 100000)".
    expect(direct.headers.get('x-ratelimit-limit-requests')).toBe('100000');
    const stats = await mockStats(mock);
    expect(stats.total).toBe(101);
    expect(stats.byStatus).toEqual({ '200': 64, '503': 30, '429': 7 });
    expect(await mockLog(mock, 5)).toHaveLength(5);
    expect((await fetch(`${mock.url}/_mock/reset`, { method: 'POST' })).ok).toBe(true);
    expect((await mockStats(mock)).total).toBe(0);
    const spec = (await (await fetch(`${mock.url}/_mock/faults`)).json()) as FaultSpec;
    expect(spec.errors?.map((e) => e.status)).toEqual([503, 429]);
  });
});
