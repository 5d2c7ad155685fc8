// Third-party failure-scenario suite 35: the README sections the suites before it touched least, driven only as a user
// would: the official openai 6.x and @anthropic-ai/sdk clients, the bundled mock provider through its documented
// control endpoint (/_mock/faults, /_mock/brownout, /_mock/stats, /_mock/requests, /_mock/reset), config written as
// the README's YAML, metrics read from /metrics, and a real redis-server where a fleet shares state.
//  1. a route's degraded answer (Failover and API families: `degraded`; stormgate_degraded_total)
//  2. clients that retry without saying so, and those that say so (Retry budget: `budget.repeats`,
//     stormgate_client_retries_total, clientRetry in the log line)
//  3. a stream broken after its first output: streamRecovery, the missing [DONE], the client that gives up first
import { setTimeout as sleep } from 'node:timers/promises';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import type { MockServer } from '../src/mock/server.ts';
import { answerText } from '../src/mock/content.ts';
import { mockControl } from './helpers/mock-control.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { scrapeMetrics, useExtraMocks, useGateways, type MetricSample } from './helpers/stack.ts';
import { expectOpenAIError, sdkError } from './helpers/openai-error.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();
const redis = useRedisServer();

const DEGRADED_TEXT = 'The assistant is busy right now; please try again in a minute.';

// --- the mock, driven through its documented control endpoint -------------------------------------------------

const control = mockControl;
const putFaults = (m: MockServer, spec: unknown) => control(m, 'PUT', 'faults', spec);
const brownout = (m: MockServer, mode: string, durationMs: number) => control(m, 'POST', 'brownout', { mode, durationMs });
const mockStats = (m: MockServer) => control(m, 'GET', 'stats') as Promise<{ total: number; aborted: number; byStatus: Record<string, number> }>;
type Seen = { path: string; headers: Record<string, string>; status?: number | string; aborted: boolean; receivedAt: number; endedAt?: number };
const mockRequests = async (m: MockServer): Promise<Seen[]> => {
  const body = (await control(m, 'GET', 'requests')) as Seen[] | { requests: Seen[] };
  return (Array.isArray(body) ? body : body.requests).filter((r) => r.path.startsWith('/v1/'));
};

// --- the gateway, from YAML ------------------------------------------------------------------------------------

interface Started {
  url: string;
  client: OpenAI;
  logs: string[];
  /** The request log lines (those with a reqId), parsed. */
  lines(): Array<Record<string, unknown>>;
  metrics(): Promise<MetricSample[]>;
}

async function gatewayFrom(yaml: string, env: Record<string, string> = {}): Promise<Started> {
  const config = parseConfig(yaml, 'suite35.yaml', { ...env });
  const logs: string[] = [];
  const url = await startGateway(config, { logs });
  return {
    url,
    logs,
    client: new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused-by-the-gateway', maxRetries: 0, logLevel: 'off' }),
    lines: () =>
      logs
        .flatMap((l) => l.split('\n'))
        .filter((l) => l.includes('"reqId"'))
        .map((l) => JSON.parse(l) as Record<string, unknown>),
    metrics: () => scrapeMetrics(url),
  };
}

function value(samples: MetricSample[], name: string, labels: Record<string, string> = {}): number {
  return samples
    .filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))
    .reduce((a, s) => a + s.value, 0);
}
function series(samples: MetricSample[], name: string): MetricSample[] {
  return samples.filter((s) => s.name === name);
}

const ask = (content: string) => ({ model: 'gpt-4o', messages: [{ role: 'user' as const, content }] });

/** Two mocks, a primary and a backup, and a chat route with a degraded answer over both. */
function degradedYaml(primary: string, backup: string, extra = ''): string {
  return `
server:
  host: 127.0.0.1
  port: 0
  logLevel: info
providers:
  primary:
    family: openai
    baseUrl: ${primary}/v1
    apiKey: sk-primary
    breaker: { consecutiveFailures: 5, openS: 30 }
  backup:
    family: openai
    baseUrl: ${backup}/v1
    apiKey: sk-backup
    breaker: { consecutiveFailures: 5, openS: 30 }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets:
      - { provider: primary }
      - { provider: backup }
    retry: { maxAttempts: 2, backoff: { baseMs: 20, capMs: 50 } }
    park: false
    degraded:
      message: "${DEGRADED_TEXT}"
${extra}`;
}

describe("a route's degraded answer during a provider hiccup", () => {
  it('answers a plain SDK call with the route text as a normal completion, marked and counted, after the targets failed', async () => {
    const [p, b] = [await startMock({ quiet: true }), await startMock({ quiet: true })];
    await brownout(p, '503', 60_000);
    await brownout(b, '503', 60_000);
    const g = await gatewayFrom(degradedYaml(p.url, b.url));
    const before = await g.metrics();
    // Counters for the label values the config names start at zero (Logs and metrics).
    expect(series(before, 'stormgate_degraded_total').length).toBeGreaterThan(0);
    expect(value(before, 'stormgate_degraded_total')).toBe(0);

    const { data, response } = await g.client.chat.completions.create({ ...ask('hi'), n: 3 }, { timeout: 10_000 }).withResponse();
    expect(response.status).toBe(200);
    expect(response.headers.get('x-stormgate-degraded')).toBe('true');
    expect(response.headers.get('x-stormgate-degraded-reason')).toBe('failed');
    expect(response.headers.get('x-stormgate-request-id')).toMatch(/\S/);
    expect(response.headers.get('x-stormgate-route')).toBe('chat');
    expect(data.object).toBe('chat.completion');
    expect(data.model).toBe('gpt-4o');
    // One choice for each of n, and a usage object, as any completion has: code reading usage.total_tokens does not crash.
    expect(data.choices.map((c) => [c.index, c.message.role, c.message.content, c.finish_reason])).toEqual([
      [0, 'assistant', DEGRADED_TEXT, 'stop'],
      [1, 'assistant', DEGRADED_TEXT, 'stop'],
      [2, 'assistant', DEGRADED_TEXT, 'stop'],
    ]);
    expect(data.usage).toEqual(expect.objectContaining({ prompt_tokens: expect.any(Number), completion_tokens: expect.any(Number), total_tokens: expect.any(Number) }));
    // Both targets were tried, each maxAttempts times: the degraded answer comes after the failures, not instead of them.
    expect((await mockStats(p)).total).toBe(2);
    expect((await mockStats(b)).total).toBe(2);

    const after = await g.metrics();
    expect(value(after, 'stormgate_degraded_total', { route: 'chat', reason: 'failed' })).toBe(1);
    expect(value(after, 'stormgate_degraded_total')).toBe(1);
    expect(value(after, 'stormgate_requests_total', { route: 'chat', outcome: 'degraded' })).toBe(1);
    expect(value(after, 'stormgate_requests_total', { route: 'chat', outcome: 'upstream_error' })).toBe(0);
    const line = g.lines().find((l) => l.reqId === response.headers.get('x-stormgate-request-id'));
    expect(line?.outcome, g.logs.join('')).toBe('degraded');
  });

  it('streams the degraded text to a streaming client, one choice for each of n and the usage chunk it asked for, and the SDK ends cleanly', async () => {
    const [p, b] = [await startMock({ quiet: true }), await startMock({ quiet: true })];
    await brownout(p, '503', 60_000);
    await brownout(b, '503', 60_000);
    const g = await gatewayFrom(degradedYaml(p.url, b.url));
    const { data: stream, response } = await g.client.chat.completions
      .create({ ...ask('hi'), stream: true, n: 2, stream_options: { include_usage: true } }, { timeout: 10_000 })
      .withResponse();
    expect(response.headers.get('x-stormgate-degraded')).toBe('true');
    expect(response.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
    const text = ['', ''];
    const usages: unknown[] = [];
    const finish: Array<string | null> = [null, null];
    for await (const chunk of stream) {
      if (chunk.usage) usages.push(chunk.usage);
      for (const c of chunk.choices) {
        text[c.index] += c.delta.content ?? '';
        if (c.finish_reason) finish[c.index] = c.finish_reason;
      }
    }
    expect(text).toEqual([DEGRADED_TEXT, DEGRADED_TEXT]);
    expect(finish).toEqual(['stop', 'stop']);
    expect(usages).toHaveLength(1);
    const m = await g.metrics();
    expect(value(m, 'stormgate_degraded_total', { route: 'chat' })).toBe(1);
  });

  it('gives a structured-output request (json_schema) its error, not a text its parse() would choke on, and tells the SDK not to retry', async () => {
    const [p, b] = [await startMock({ quiet: true }), await startMock({ quiet: true })];
    await brownout(p, '503', 60_000);
    await brownout(b, '503', 60_000);
    const g = await gatewayFrom(degradedYaml(p.url, b.url));
    const sdk = new OpenAI({ baseURL: `${g.url}/v1`, apiKey: 'x', maxRetries: 2, logLevel: 'off' });
    const err = await sdkError(
      sdk.chat.completions.create({
        ...ask('give me json'),
        response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: {} } } },
      }),
    );
    expect(err.status).toBe(503);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.headers?.get('x-stormgate-degraded')).toBeNull();
    // One SDK request: 2 attempts per target, no SDK retry on top.
    expect((await mockStats(p)).total + (await mockStats(b)).total).toBe(4);
    const m = await g.metrics();
    expect(value(m, 'stormgate_degraded_total')).toBe(0);
  });

  it("passes the provider's verdict on the request (a 400) on as it came, never papered over with the degraded text", async () => {
    const [p, b] = [await startMock({ quiet: true }), await startMock({ quiet: true })];
    await putFaults(p, { errors: [{ status: 400, code: 'invalid_value', param: 'messages', message: 'bad messages' }] });
    const g = await gatewayFrom(degradedYaml(p.url, b.url));
    const res = await fetch(`${g.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(ask('hi')),
    });
    expect(res.status).toBe(400);
    expect(res.headers.get('x-stormgate-degraded')).toBeNull();
    const e = expectOpenAIError(await res.json(), 'invalid_value');
    expect(e.param).toBe('messages');
    expect((await mockStats(p)).total).toBe(1);
    expect((await mockStats(b)).total).toBe(0);
  });

  it('answers degraded at once, sending nothing upstream, while both breakers are open and parking is off (reason unavailable)', async () => {
    const [p, b] = [await startMock({ quiet: true }), await startMock({ quiet: true })];
    await brownout(p, '503', 60_000);
    await brownout(b, '503', 60_000);
    const g = await gatewayFrom(degradedYaml(p.url, b.url));
    // Sequential calls: 5 failures in a row on each target open both breakers (consecutiveFailures: 5).
    for (let i = 0; i < 5; i++) await g.client.chat.completions.create(ask(`warm ${i}`), { timeout: 10_000 });
    await sleep(300);
    for (let i = 0; i < 5; i++) await g.client.chat.completions.create(ask(`warm b${i}`), { timeout: 10_000 });
    const m0 = await g.metrics();
    expect(value(m0, 'stormgate_breaker_state', { target: 'primary/gpt-4o' })).toBe(1);
    expect(value(m0, 'stormgate_breaker_state', { target: 'backup/gpt-4o' })).toBe(1);
    const upstreamBefore = (await mockStats(p)).total + (await mockStats(b)).total;

    const t0 = Date.now();
    const { data, response } = await g.client.chat.completions.create(ask('now'), { timeout: 10_000 }).withResponse();
    expect(Date.now() - t0).toBeLessThan(1000);
    expect(response.headers.get('x-stormgate-degraded')).toBe('true');
    expect(data.choices[0]!.message.content).toBe(DEGRADED_TEXT);
    expect((await mockStats(p)).total + (await mockStats(b)).total).toBe(upstreamBefore);
    expect(value(await g.metrics(), 'stormgate_degraded_total', { reason: 'unavailable' })).toBeGreaterThanOrEqual(1);
  });

  it('answers a client whose provider hangs with the degraded text before its own timeout, and leaves nothing running upstream (reason deadline)', async () => {
    const p = await startMock({ quiet: true });
    const b = await startMock({ quiet: true });
    await brownout(p, 'hang', 60_000);
    await brownout(b, 'hang', 60_000);
    const g = await gatewayFrom(degradedYaml(p.url, b.url));
    const t0 = Date.now();
    const { data, response } = await g.client.chat.completions.create(ask('hi'), { timeout: 2000 }).withResponse();
    const took = Date.now() - t0;
    expect(took).toBeLessThan(2000);
    expect(response.headers.get('x-stormgate-degraded')).toBe('true');
    expect(data.choices[0]!.message.content).toBe(DEGRADED_TEXT);
    await sleep(200);
    const seen = [...(await mockRequests(p)), ...(await mockRequests(b))];
    expect(seen.length).toBeGreaterThanOrEqual(1);
    // No ghost: every hung attempt was ended with the request.
    expect(seen.every((r) => r.aborted)).toBe(true);
    expect((await mockStats(p)).total + (await mockStats(b)).total).toBe(seen.length);
    expect(value(await g.metrics(), 'stormgate_degraded_total', { reason: 'deadline' })).toBe(1);
  });

  it('starts a thinking model\'s stream at the client\'s deadline rather than answering it with the degraded text: the real answer comes', async () => {
    const p = await startMock({ quiet: true });
    const b = await startMock({ quiet: true });
    await putFaults(p, { stream: { firstTokenDelayMs: 2500 } });
    const g = await gatewayFrom(degradedYaml(p.url, b.url).replace(/consecutiveFailures: 5, openS: 30 \}/, 'consecutiveFailures: 5, openS: 30 }\n    timeouts: { firstTokenMs: 6000, idleMs: 1000 }'));
    const t0 = Date.now();
    const { data: stream, response } = await g.client.chat.completions
      .create({ ...ask('think first'), stream: true }, { timeout: 10_000, headers: { 'x-stormgate-timeout-ms': '1200' } })
      .withResponse();
    // Headers at the deadline (1200 ms less its margin), well before the model's first token at 2.5 s.
    expect(Date.now() - t0).toBeLessThan(2200);
    expect(response.headers.get('x-stormgate-degraded')).toBeNull();
    const r = await readStream(stream);
    expect(r.err).toBeUndefined();
    expect(r.text).toBe(answerText('think first'));
    expect((await mockStats(b)).total).toBe(0);
    expect(g.lines().at(-1)?.startedEarly).toBe(true);
  });

  it('2 s brownout under 40 agents retrying every 100 ms: every call gets a 200, the provider is not flooded, and real answers come back after it', async () => {
    const [p, b] = [await startMock({ quiet: true }), await startMock({ quiet: true })];
    const g = await gatewayFrom(degradedYaml(p.url, b.url).replace(/openS: 30/g, 'openS: 1'));
    await brownout(p, '503', 2000);
    await brownout(b, '503', 2000);
    const t0 = Date.now();
    const statuses: number[] = [];
    const degradedAt: number[] = [];
    let calls = 0;
    await Promise.all(
      Array.from({ length: 40 }, async (_, agent) => {
        while (Date.now() - t0 < 5000) {
          calls++;
          const res = await fetch(`${g.url}/v1/chat/completions`, {
            method: 'POST',
            headers: { 'content-type': 'application/json', 'x-stormgate-timeout-ms': '3000' },
            body: JSON.stringify(ask(`agent ${agent} call ${calls}`)),
          });
          statuses.push(res.status);
          if (res.headers.get('x-stormgate-degraded') === 'true') degradedAt.push(Date.now() - t0);
          await res.arrayBuffer();
          await sleep(100);
        }
      }),
    );
    expect(new Set(statuses)).toEqual(new Set([200]));
    expect(degradedAt.length).toBeGreaterThan(0);
    // The brownout ended at 2 s; the breakers probe after openS (1 s, +10%), so real answers are back well before 5 s.
    expect(Math.max(...degradedAt)).toBeLessThan(4700);
    const upstream = (await mockStats(p)).total + (await mockStats(b)).total;
    // No amplification: fewer upstream requests than client calls (the breakers took the fixed-interval retries off them).
    expect(upstream).toBeLessThan(calls);
  }, 30_000);

  it('fleet on one redis-server: a breaker instance A opened makes instance B answer degraded at once, sending nothing', async () => {
    const [p, b] = [await startMock({ quiet: true }), await startMock({ quiet: true })];
    await brownout(p, '503', 60_000);
    await brownout(b, '503', 60_000);
    const yaml = degradedYaml(p.url, b.url, `state:\n  redis: ${redis().url}\n  keyPrefix: "suite35-degraded-${Date.now()}:"\n`);
    const a = await gatewayFrom(yaml);
    const bInstance = await gatewayFrom(yaml);
    for (let i = 0; i < 5; i++) await a.client.chat.completions.create(ask(`a ${i}`), { timeout: 10_000 });
    await sleep(300);
    for (let i = 0; i < 5; i++) await a.client.chat.completions.create(ask(`a b${i}`), { timeout: 10_000 });
    await sleep(300);
    const upstreamBefore = (await mockStats(p)).total + (await mockStats(b)).total;
    const { data, response } = await bInstance.client.chat.completions.create(ask('from b'), { timeout: 10_000 }).withResponse();
    expect(response.headers.get('x-stormgate-degraded')).toBe('true');
    expect(data.choices[0]!.message.content).toBe(DEGRADED_TEXT);
    expect((await mockStats(p)).total + (await mockStats(b)).total).toBe(upstreamBefore);
    expect(value(await bInstance.metrics(), 'stormgate_degraded_total', { reason: 'unavailable' })).toBe(1);
  }, 30_000);
});

/** One mock, one chat route with the given budget (YAML lines under the route, indented 4). */
function repeatsYaml(mock: string, routeExtra: string, top = ''): string {
  return `
server: { host: 127.0.0.1, port: 0 }
providers:
  mock:
    family: openai
    baseUrl: ${mock}/v1
    apiKey: sk-mock
    breaker: false
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [{ provider: mock }]
    park: false
${routeExtra}
${top}`;
}

async function rawChat(url: string, body: unknown, headers: Record<string, string> = {}): Promise<Response> {
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  await res.arrayBuffer();
  return res;
}

describe('clients that retry on their own (budget.repeats, x-stainless-retry-count)', () => {
  it('names a body sent again after its error a repeat (log clientRetry, stormgate_client_retries_total), until a repeat succeeds', async () => {
    const m = await startMock({ quiet: true });
    await putFaults(m, { errors: [{ status: 503, times: 3 }] });
    const g = await gatewayFrom(repeatsYaml(m.url, '    retry: { maxAttempts: 1 }'));
    const m0 = await g.metrics();
    expect(value(m0, 'stormgate_client_retries_total', { route: 'chat', how: 'repeat' })).toBe(0);
    expect(series(m0, 'stormgate_client_retries_total').map((s) => s.labels.how).sort()).toEqual(['declared', 'repeat']);
    // A fixed-interval loop, as an agent framework without the SDK's retries runs it.
    for (let i = 0; i < 3; i++) {
      expect((await rawChat(g.url, ask('same question'))).status).toBe(503);
      await sleep(50);
    }
    const m1 = await g.metrics();
    expect(value(m1, 'stormgate_client_retries_total', { route: 'chat', how: 'repeat' })).toBe(2);
    expect(value(m1, 'stormgate_client_retries_total', { route: 'chat', how: 'declared' })).toBe(0);
    expect(g.lines().map((l) => l.clientRetry ?? null)).toEqual([null, 'repeat', 'repeat']);
    // The provider is back: the loop's next call is a repeat that succeeds, and ends the window; the same question
    // asked afterwards is a request again.
    expect((await rawChat(g.url, ask('same question'))).status).toBe(200);
    expect((await rawChat(g.url, ask('same question'))).status).toBe(200);
    expect(g.lines().map((l) => l.clientRetry ?? null)).toEqual([null, 'repeat', 'repeat', 'repeat', null]);
    expect(value(await g.metrics(), 'stormgate_client_retries_total', { how: 'repeat' })).toBe(3);
  });

  it('tells repeats apart by client key, body, x-stormgate-priority and query: another tenant, question, class or query is no repeat', async () => {
    const m = await startMock({ quiet: true });
    await brownout(m, '503', 60_000);
    const g = await gatewayFrom(
      repeatsYaml(m.url, '    retry: { maxAttempts: 1 }', 'auth:\n  keys:\n    alice: "${ALICE_KEY}"\n    bob: "${BOB_KEY}"\n'),
      { ALICE_KEY: 'sk-alice-0123456789abcdef', BOB_KEY: 'sk-bob-0123456789abcdef' },
    );
    const as = (key: string) => ({ authorization: `Bearer ${key}` });
    expect((await rawChat(g.url, ask('shared prompt'), as('sk-alice-0123456789abcdef'))).status).toBe(503);
    expect((await rawChat(g.url, ask('shared prompt'), as('sk-bob-0123456789abcdef'))).status).toBe(503);
    expect((await rawChat(g.url, ask('another prompt'), as('sk-alice-0123456789abcdef'))).status).toBe(503);
    expect((await rawChat(g.url, ask('shared prompt'), { ...as('sk-alice-0123456789abcdef'), 'x-stormgate-priority': 'batch' })).status).toBe(503);
    const withQuery = await fetch(`${g.url}/v1/chat/completions?tenant=b`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...as('sk-alice-0123456789abcdef') },
      body: JSON.stringify(ask('shared prompt')),
    });
    await withQuery.arrayBuffer();
    expect(value(await g.metrics(), 'stormgate_client_retries_total', { how: 'repeat' })).toBe(0);
    expect((await rawChat(g.url, ask('shared prompt'), as('sk-alice-0123456789abcdef'))).status).toBe(503);
    expect(value(await g.metrics(), 'stormgate_client_retries_total', { how: 'repeat' })).toBe(1);
  });

  it("counts the openai and Anthropic SDKs' own retries, invited back, as declared (x-stainless-retry-count above 0), the first try not", async () => {
    const m = await startMock({ quiet: true });
    // A 429 whose hint the gateway would not wait out (over maxWaitHintMs) but within 60 s: the SDK is invited back
    // (What the client sees: x-should-retry true, as the request went upstream once and its retries stopped at the hint).
    await putFaults(m, { errors: [{ status: 429, times: 1, headers: { 'retry-after': '1' } }] });
    const g = await gatewayFrom(
      repeatsYaml(m.url, '    retry: { maxAttempts: 2, maxWaitHintMs: 100 }').replace(
        'routes:\n',
        `  claude:\n    family: anthropic\n    baseUrl: ${m.url}\n    apiKey: sk-ant-mock\n    breaker: false\nroutes:\n  - name: messages\n    match: { path: /v1/messages }\n    targets: [{ provider: claude }]\n    park: false\n    retry: { maxAttempts: 2, maxWaitHintMs: 100 }\n`,
      ),
    );
    const sdk = new OpenAI({ baseURL: `${g.url}/v1`, apiKey: 'x', maxRetries: 2, logLevel: 'off' });
    const answer = await sdk.chat.completions.create(ask('hi'), { timeout: 20_000 });
    expect(answer.choices[0]!.message.content).toBe(answerText('hi'));
    const seen = await mockRequests(m);
    expect(seen.map((r) => r.headers['x-stainless-retry-count'])).toEqual(['0', '1']);
    const metrics = await g.metrics();
    expect(value(metrics, 'stormgate_client_retries_total', { how: 'declared' })).toBe(1);
    expect(g.lines().map((l) => l.clientRetry ?? null)).toEqual([null, 'declared']);

    // The Anthropic SDK on /v1/messages: the same invitation, in Anthropic's error shape, and the same count.
    await putFaults(m, { errors: [{ status: 429, times: 1, headers: { 'retry-after': '1' } }] });
    await control(m, 'POST', 'reset');
    const claude = new Anthropic({ baseURL: g.url, apiKey: 'x', maxRetries: 2, logLevel: 'off' });
    const msg = await claude.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 64, messages: [{ role: 'user', content: 'hi' }] }, { timeout: 20_000 });
    expect(msg.content[0]).toEqual(expect.objectContaining({ type: 'text' }));
    const seenAnthropic = await mockRequests(m);
    expect(seenAnthropic.map((r) => [r.path, r.headers['x-stainless-retry-count']])).toEqual([
      ['/v1/messages', '0'],
      ['/v1/messages', '1'],
    ]);
    expect(value(await g.metrics(), 'stormgate_client_retries_total', { route: 'messages', how: 'declared' })).toBe(1);
  }, 30_000);

  it("passes a 429's hint on uninvited on a route of maxAttempts 1, while the requests its hold-off turns away are invited back", async () => {
    const m = await startMock({ quiet: true });
    await putFaults(m, { errors: [{ status: 429, times: 1, headers: { 'retry-after': '2' } }] });
    const g = await gatewayFrom(repeatsYaml(m.url, '    retry: { maxAttempts: 1 }'));
    const sdk = new OpenAI({ baseURL: `${g.url}/v1`, apiKey: 'x', maxRetries: 0, logLevel: 'off' });
    const first = await sdkError(sdk.chat.completions.create(ask('once'), { timeout: 20_000 }));
    expect(first.status).toBe(429);
    expect(first.headers?.get('x-should-retry')).toBe('false');
    expect(Number(first.headers?.get('retry-after'))).toBeGreaterThanOrEqual(2);
    expect(g.lines().at(-1)?.retriesStopped).toBe('retries_exhausted');
    const next = await sdkError(sdk.chat.completions.create(ask('next one'), { timeout: 20_000 }));
    expect(next.status).toBe(429);
    expect((next.error as { code?: string }).code).toBe('provider_held_off');
    expect(next.headers?.get('x-should-retry')).toBe('true');
    expect(Number(next.headers?.get('retry-after-ms'))).toBeGreaterThan(0);
    expect((await mockStats(m)).total).toBe(1);
  });

  it('with countAsRetries, takes an agent loop\'s repeats from the budget: each is sent once and not retried on top, where without it each is retried', async () => {
    const run = async (countAsRetries: boolean) => {
      const m = await startMock({ quiet: true });
      await brownout(m, '503', 60_000);
      const g = await gatewayFrom(
        repeatsYaml(
          m.url,
          `    retry: { maxAttempts: 2, backoff: { baseMs: 10, capMs: 20 } }\n    budget: { ratio: 1, windowS: 30, minRetriesPerSecond: 0, repeats: { countAsRetries: ${countAsRetries} } }`,
        ),
      );
      for (let i = 0; i < 6; i++) expect((await rawChat(g.url, ask('the same tool turn'))).status).toBe(503);
      const seen = await mockRequests(m);
      return { upstream: seen.length, retries: seen.filter((r) => r.headers['x-retry-attempt']).length, g };
    };
    const off = await run(false);
    const on = await run(true);
    // Off: every call a request, each granted its retry: 12 upstream.
    expect(off.upstream).toBe(12);
    // On: the first call's retry, then 5 repeats counted as the retries they are: the budget (1 retry per request) is
    // spent, so each is served once and the gateway adds nothing.
    expect(on.upstream).toBe(7);
    expect(on.retries).toBe(1);
    const lines = on.g.lines();
    expect(lines.slice(1).every((l) => l.clientRetry === 'repeat')).toBe(true);
    expect(value(await on.g.metrics(), 'stormgate_retry_budget_exhausted_total', { route: 'chat' })).toBe(5);
  }, 30_000);
});

/** A streaming chat route over a primary and a backup, with the given route lines. */
function streamYaml(primary: string, backup: string, routeExtra: string, providerExtra = ''): string {
  return `
server: { host: 127.0.0.1, port: 0 }
providers:
  primary:
    family: openai
    baseUrl: ${primary}/v1
    apiKey: sk-primary
    timeouts: { firstTokenMs: 2000, idleMs: 400 }
${providerExtra}
  backup:
    family: openai
    baseUrl: ${backup}/v1
    apiKey: sk-backup
    timeouts: { firstTokenMs: 2000, idleMs: 400 }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets:
      - { provider: primary }
      - { provider: backup }
${routeExtra}`;
}

async function readStream(s: AsyncIterable<OpenAI.ChatCompletionChunk>): Promise<{ text: string; err?: unknown; finish?: string | null }> {
  let text = '';
  let finish: string | null | undefined;
  try {
    for await (const c of s) {
      text += c.choices[0]?.delta.content ?? '';
      finish = c.choices[0]?.finish_reason ?? finish;
    }
  } catch (err) {
    return { text, err, finish };
  }
  return { text, finish };
}

describe('a stream that breaks after its first output (tool calls and text already committed to the client)', () => {
  it('with streamRecovery, finishes a text stream the primary cut from the backup, byte for byte what the primary would have said', async () => {
    const [p, b] = [await startMock({ quiet: true }), await startMock({ quiet: true })];
    await putFaults(p, { stream: { chunks: 8, cutAfterChunks: 3 } });
    await putFaults(b, { stream: { chunks: 8 } });
    const g = await gatewayFrom(streamYaml(p.url, b.url, '    streamRecovery: continue'));
    const { data: stream, response } = await g.client.chat.completions.create({ ...ask('tell me a story'), stream: true }, { timeout: 10_000 }).withResponse();
    expect(response.headers.get('x-stormgate-attempts')).toBe('1');
    const r = await readStream(stream);
    expect(r.err).toBeUndefined();
    expect(r.text).toBe(answerText('tell me a story'));
    expect(r.finish).toBe('stop');
    const toBackup = await mockRequests(b);
    expect(toBackup).toHaveLength(1);
    expect(toBackup[0]!.headers['x-retry-attempt']).toBe('1');
    expect(toBackup[0]!.headers['x-retry-reason']).toBe('stream_cut');
    const m = await g.metrics();
    expect(value(m, 'stormgate_stream_ends_total', { route: 'chat', end: 'recovered' })).toBe(1);
    expect(value(m, 'stormgate_retry_count_total', { route: 'chat', reason: 'stream_cut' })).toBe(1);
    expect(value(m, 'stormgate_retried_requests_total', { route: 'chat', result: 'success' })).toBe(1);
    expect(value(m, 'stormgate_upstream_attempts_total', { target: 'backup/gpt-4o' })).toBe(1);
    // On the wire: the documented SSE comment where the backup took over, and one [DONE].
    const res = await fetch(`${g.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ ...ask('tell me a story'), stream: true }),
    });
    const raw = await res.text();
    expect(raw).toContain(': stormgate stream recovered from the next target');
    expect(raw.match(/data: \[DONE\]/g)).toHaveLength(1);
  });

  it('with streamRecovery, continues a stream stalled past idleMs, as stream_stalled, and the primary request is ended', async () => {
    const [p, b] = [await startMock({ quiet: true }), await startMock({ quiet: true })];
    await putFaults(p, { stream: { chunks: 6, stallAfterChunks: 2 } });
    await putFaults(b, { stream: { chunks: 6 } });
    const g = await gatewayFrom(streamYaml(p.url, b.url, '    streamRecovery: continue'));
    const stream = await g.client.chat.completions.create({ ...ask('a stall'), stream: true }, { timeout: 10_000 });
    const r = await readStream(stream);
    expect(r.err).toBeUndefined();
    expect(r.text).toBe(answerText('a stall'));
    const toBackup = await mockRequests(b);
    expect(toBackup.map((x) => x.headers['x-retry-reason'])).toEqual(['stream_stalled']);
    await sleep(200);
    // No ghost: the stalled primary request is not left open.
    expect((await mockRequests(p)).every((x) => x.aborted || x.endedAt !== undefined)).toBe(true);
    expect(value(await g.metrics(), 'stormgate_retry_count_total', { reason: 'stream_stalled' })).toBe(1);
  });

  it('without streamRecovery, ends a stream cut after its first output with an error the SDK raises, and sends it nowhere again', async () => {
    const [p, b] = [await startMock({ quiet: true }), await startMock({ quiet: true })];
    await putFaults(p, { stream: { chunks: 8, cutAfterChunks: 3 } });
    const g = await gatewayFrom(streamYaml(p.url, b.url, ''));
    const stream = await g.client.chat.completions.create({ ...ask('cut me'), stream: true }, { timeout: 10_000 });
    const r = await readStream(stream);
    expect(r.err).toBeInstanceOf(OpenAI.APIError);
    expect(r.text.length).toBeGreaterThan(0);
    expect(answerText('cut me').startsWith(r.text)).toBe(true);
    expect((await mockStats(p)).total).toBe(1);
    expect((await mockStats(b)).total).toBe(0);
    const m = await g.metrics();
    expect(value(m, 'stormgate_stream_ends_total', { route: 'chat', end: 'cut' })).toBe(1);
    expect(value(m, 'stormgate_retry_count_total', { route: 'chat' })).toBe(0);
  });

  it('never continues a tool call cut mid-arguments elsewhere, nor a stream of n > 1, even with streamRecovery: the client gets the error', async () => {
    const [p, b] = [await startMock({ quiet: true }), await startMock({ quiet: true })];
    await putFaults(p, { stream: { chunks: 6, cutAfterChunks: 2 } });
    const g = await gatewayFrom(streamYaml(p.url, b.url, '    streamRecovery: continue'));
    const stream = await g.client.chat.completions.create(
      {
        ...ask('book a table'),
        stream: true,
        tools: [{ type: 'function', function: { name: 'book', parameters: { type: 'object', properties: {} } } }],
      },
      { timeout: 10_000 },
    );
    let sawToolCall = false;
    let err: unknown;
    try {
      for await (const c of stream) if (c.choices[0]?.delta.tool_calls) sawToolCall = true;
    } catch (e) {
      err = e;
    }
    expect(sawToolCall).toBe(true);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((await mockStats(b)).total).toBe(0);

    // Nor a text stream of n > 1: there is no one delivered text to continue.
    const two = await g.client.chat.completions.create({ ...ask('two answers'), stream: true, n: 2 }, { timeout: 10_000 });
    const texts = ['', ''];
    let twoErr: unknown;
    try {
      for await (const c of two) for (const ch of c.choices) texts[ch.index] += ch.delta.content ?? '';
    } catch (e) {
      twoErr = e;
    }
    expect(twoErr).toBeInstanceOf(OpenAI.APIError);
    expect(texts[0]!.length).toBeGreaterThan(0);
    expect((await mockStats(b)).total).toBe(0);
  });

  it('gives the client the original failure when the budget refuses the recovery, counted as a refused retry', async () => {
    const [p, b] = [await startMock({ quiet: true }), await startMock({ quiet: true })];
    await putFaults(p, { stream: { chunks: 8, cutAfterChunks: 3 } });
    const g = await gatewayFrom(streamYaml(p.url, b.url, '    streamRecovery: continue\n    budget: { ratio: 0, minRetriesPerSecond: 0 }'));
    const r = await readStream(await g.client.chat.completions.create({ ...ask('no budget'), stream: true }, { timeout: 10_000 }));
    expect(r.err).toBeInstanceOf(OpenAI.APIError);
    expect((r.err as InstanceType<typeof OpenAI.APIError>).message).toMatch(/stream_interrupted|interrupted|cut|closed/i);
    expect((await mockStats(b)).total).toBe(0);
    const m = await g.metrics();
    expect(value(m, 'stormgate_retry_budget_exhausted_total', { route: 'chat' })).toBe(1);
    expect(value(m, 'stormgate_stream_ends_total', { end: 'recovered' })).toBe(0);
  });

  it('aborts the continuation upstream when the client gives up during it: no ghost at the backup', async () => {
    const [p, b] = [await startMock({ quiet: true }), await startMock({ quiet: true })];
    await putFaults(p, { stream: { chunks: 8, cutAfterChunks: 2 } });
    await putFaults(b, { stream: { chunks: 8, chunkDelayMs: 300 } });
    const g = await gatewayFrom(streamYaml(p.url, b.url, '    streamRecovery: continue'));
    const controller = new AbortController();
    const stream = await g.client.chat.completions.create({ ...ask('leave midway'), stream: true }, { timeout: 10_000, signal: controller.signal });
    let text = '';
    const leftAt = answerText('leave midway').length * 0.6;
    try {
      for await (const c of stream) {
        text += c.choices[0]?.delta.content ?? '';
        if (text.length >= leftAt) controller.abort();
      }
    } catch {
      // the SDK raises the abort
    }
    await sleep(500);
    const toBackup = await mockRequests(b);
    expect(toBackup).toHaveLength(1);
    expect(toBackup[0]!.aborted).toBe(true);
    const m = await g.metrics();
    expect(value(m, 'stormgate_stream_ends_total', { route: 'chat', end: 'client-gone' })).toBe(1);
    expect(value(m, 'stormgate_requests_total', { route: 'chat', outcome: 'client_gone' })).toBe(1);
  });
});

describe('the degraded answer, read closely', () => {
  it('gives logprobs, audio and forced tool calls (required, named, allowed_tools required) their error, and an auto tool_choice the text', async () => {
    const [p, b] = [await startMock({ quiet: true }), await startMock({ quiet: true })];
    await brownout(p, '503', 60_000);
    await brownout(b, '503', 60_000);
    const g = await gatewayFrom(degradedYaml(p.url, b.url));
    const tools = [{ type: 'function' as const, function: { name: 'lookup', parameters: { type: 'object', properties: {} } } }];
    const statusOf = async (extra: Record<string, unknown>) => {
      const res = await rawChat(g.url, { ...ask('x'), ...extra });
      return [res.status, res.headers.get('x-stormgate-degraded')];
    };
    expect(await statusOf({ logprobs: true, top_logprobs: 2 })).toEqual([503, null]);
    expect(await statusOf({ modalities: ['text', 'audio'], audio: { voice: 'alloy', format: 'wav' } })).toEqual([503, null]);
    expect(
      await statusOf({ tools, tool_choice: { type: 'allowed_tools', allowed_tools: { mode: 'required', tools: [{ type: 'function', function: { name: 'lookup' } }] } } }),
    ).toEqual([503, null]);
    expect(await statusOf({ tools, tool_choice: { type: 'function', function: { name: 'lookup' } } })).toEqual([503, null]);
    expect(await statusOf({ tools, tool_choice: 'required' })).toEqual([503, null]);
    expect(await statusOf({ tools, tool_choice: 'auto' })).toEqual([200, 'true']);
  });

  it('answers a request parked behind open breakers with the degraded text before its deadline, when no target came back in time', async () => {
    const [p, b] = [await startMock({ quiet: true }), await startMock({ quiet: true })];
    await brownout(p, '503', 60_000);
    await brownout(b, '503', 60_000);
    const g = await gatewayFrom(degradedYaml(p.url, b.url).replace('    park: false\n', '    park: { maxQueue: 100 }\n'));
    // Warm-up calls with short timeouts: once the breakers open they park too, and get their answer at their deadline.
    for (let i = 0; i < 5; i++) await g.client.chat.completions.create(ask(`warm ${i}`), { timeout: 1500 });
    await sleep(300);
    for (let i = 0; i < 5; i++) await g.client.chat.completions.create(ask(`warm b${i}`), { timeout: 1500 });
    const m0 = await g.metrics();
    expect(value(m0, 'stormgate_breaker_state', { target: 'primary/gpt-4o' })).toBe(1);
    expect(value(m0, 'stormgate_breaker_state', { target: 'backup/gpt-4o' })).toBe(1);
    const d0 = value(m0, 'stormgate_degraded_total');
    const t0 = Date.now();
    const { data, response } = await g.client.chat.completions.create(ask('parked'), { timeout: 2500 }).withResponse();
    expect(Date.now() - t0).toBeLessThan(2500);
    expect(response.headers.get('x-stormgate-degraded')).toBe('true');
    expect(data.choices[0]!.message.content).toBe(DEGRADED_TEXT);
    const line = g.lines().find((l) => l.reqId === response.headers.get('x-stormgate-request-id'))!;
    expect(line.parkedMs).toBeGreaterThan(0);
    expect(line.outcome).toBe('degraded');
    // Counted once: as `failed` when the lot released it to a probe that failed, as `unavailable` when its wait ran out
    // (which of the two depends on when the breakers' probes came; both are documented with the metric).
    const m1 = await g.metrics();
    expect(value(m1, 'stormgate_degraded_total') - d0).toBe(1);
    expect(value(m1, 'stormgate_degraded_total', { reason: 'deadline' })).toBe(0);
  }, 30_000);
});

describe('repeats, read closely', () => {
  it('names a body sent again after its client left (aborted mid-request) a repeat', async () => {
    const m = await startMock({ quiet: true });
    await putFaults(m, { latencyMs: 3000 });
    const g = await gatewayFrom(repeatsYaml(m.url, '    retry: { maxAttempts: 1 }'));
    const controller = new AbortController();
    const first = g.client.chat.completions.create(ask('slow one'), { signal: controller.signal }).catch((e: unknown) => e);
    await sleep(300);
    controller.abort();
    await first;
    await sleep(200);
    await putFaults(m, {});
    expect((await rawChat(g.url, ask('slow one'))).status).toBe(200);
    expect(value(await g.metrics(), 'stormgate_client_retries_total', { how: 'repeat' })).toBe(1);
    const lines = g.lines();
    expect(lines.map((l) => [l.outcome, l.clientRetry ?? null])).toEqual([
      ['client_gone', null],
      ['success', 'repeat'],
    ]);
  });

  it('renews the window with each failed repeat: a loop every 0.6 s through a 1 s window is a repeat every time', async () => {
    const m = await startMock({ quiet: true });
    await brownout(m, '503', 60_000);
    const g = await gatewayFrom(repeatsYaml(m.url, '    retry: { maxAttempts: 1 }\n    budget: { repeats: { windowS: 1 } }'));
    for (let i = 0; i < 5; i++) {
      await rawChat(g.url, ask('every 600 ms'));
      await sleep(600);
    }
    expect(value(await g.metrics(), 'stormgate_client_retries_total', { how: 'repeat' })).toBe(4);
    await sleep(1200);
    await rawChat(g.url, ask('every 600 ms'));
    expect(value(await g.metrics(), 'stormgate_client_retries_total', { how: 'repeat' })).toBe(4);
  }, 20_000);

  it('serves a declared retry once when the budget is spent, refusing its own retry (retriesStopped budget)', async () => {
    const m = await startMock({ quiet: true });
    await brownout(m, '503', 60_000);
    const g = await gatewayFrom(
      repeatsYaml(m.url, '    retry: { maxAttempts: 3, backoff: { baseMs: 10, capMs: 20 } }\n    budget: { ratio: 0.1, windowS: 30, minRetriesPerSecond: 0 }'),
    );
    const res = await rawChat(g.url, ask('declared'), { 'x-stainless-retry-count': '1' });
    expect(res.status).toBe(503);
    expect(res.headers.get('x-should-retry')).toBe('false');
    expect((await mockStats(m)).total).toBe(1);
    const line = g.lines().at(-1)!;
    expect(line.clientRetry).toBe('declared');
    expect(line.retriesStopped).toBe('budget');
    const metrics = await g.metrics();
    expect(value(metrics, 'stormgate_retry_budget_exhausted_total', { route: 'chat' })).toBe(1);
    expect(value(metrics, 'stormgate_client_retries_total', { how: 'declared' })).toBe(1);
  });
});


describe('where the three meet: keys, repeats and broken streams', () => {
  it('gives the Idempotency-Key back after a degraded answer: the repeat after the brownout runs the request and gets a real answer', async () => {
    const [p, b] = [await startMock({ quiet: true }), await startMock({ quiet: true })];
    await brownout(p, '503', 60_000);
    await brownout(b, '503', 60_000);
    const g = await gatewayFrom(degradedYaml(p.url, b.url));
    const key = { 'idempotency-key': 'turn-42' };
    const first = await g.client.chat.completions.create(ask('keyed'), { headers: key, timeout: 10_000 }).withResponse();
    expect(first.response.headers.get('x-stormgate-degraded')).toBe('true');
    await brownout(p, '503', 0);
    await brownout(b, '503', 0);
    const second = await g.client.chat.completions.create(ask('keyed'), { headers: key, timeout: 10_000 }).withResponse();
    expect(second.response.headers.get('x-stormgate-degraded')).toBeNull();
    expect(second.response.headers.get('idempotent-replayed')).toBeNull();
    expect(second.data.choices[0]!.message.content).toBe(answerText('keyed'));
  });

  it('names the same streamed turn sent again after its stream broke mid-answer a repeat (the SDK raised, the agent asked again)', async () => {
    const m = await startMock({ quiet: true });
    await putFaults(m, { stream: { chunks: 8, cutAfterChunks: 3 } });
    const g = await gatewayFrom(repeatsYaml(m.url, '    retry: { maxAttempts: 1 }'));
    const body = { ...ask('streamed turn'), stream: true as const };
    const r1 = await readStream(await g.client.chat.completions.create(body, { timeout: 10_000 }));
    expect(r1.err).toBeInstanceOf(OpenAI.APIError);
    await putFaults(m, {});
    const r2 = await readStream(await g.client.chat.completions.create(body, { timeout: 10_000 }));
    expect(r2.err).toBeUndefined();
    expect(g.lines().map((l) => l.clientRetry ?? null)).toEqual([null, 'repeat']);
    expect(value(await g.metrics(), 'stormgate_client_retries_total', { how: 'repeat' })).toBe(1);
  });

  it('bills a recovered stream to the backup that finished it, and the client asking for usage gets one usage chunk, the continuation\'s', async () => {
    const [p, b] = [await startMock({ quiet: true }), await startMock({ quiet: true })];
    await putFaults(p, { stream: { chunks: 8, cutAfterChunks: 3 } });
    const g = await gatewayFrom(streamYaml(p.url, b.url, '    streamRecovery: continue'));
    const stream = await g.client.chat.completions.create(
      { ...ask('bill me'), stream: true, stream_options: { include_usage: true } },
      { timeout: 10_000 },
    );
    const usages: OpenAI.CompletionUsage[] = [];
    let text = '';
    for await (const c of stream) {
      text += c.choices[0]?.delta.content ?? '';
      if (c.usage) usages.push(c.usage);
    }
    expect(text).toBe(answerText('bill me'));
    expect(usages).toHaveLength(1);
    const m = await g.metrics();
    expect(value(m, 'stormgate_tokens_total', { target: 'backup/gpt-4o', kind: 'completion' })).toBe(usages[0]!.completion_tokens);
    expect(value(m, 'stormgate_tokens_total', { target: 'backup/gpt-4o', kind: 'prompt' })).toBe(usages[0]!.prompt_tokens);
    expect(value(m, 'stormgate_tokens_total', { target: 'primary/gpt-4o' })).toBe(0);
  });

  it('continues a cut OpenAI stream at a Claude 4.5 backup by prefill, sent without the trailing space the cut left, the continuation\'s leading one dropped', async () => {
    const p = await startMock({ quiet: true });
    const c = await startMock({ quiet: true });
    // "Mock answer to: ab" in 6 pieces of 3: "Moc", "k a", "nsw", "er ", ... cut after 4: the client has "Mock answer ".
    await putFaults(p, { stream: { chunks: 6, cutAfterChunks: 4 } });
    const g = await gatewayFrom(`
server: { host: 127.0.0.1, port: 0 }
providers:
  primary: { family: openai, baseUrl: ${p.url}/v1, apiKey: sk-primary }
  claude: { family: anthropic, baseUrl: ${c.url}, apiKey: sk-ant-claude }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets:
      - { provider: primary }
      - { provider: claude, model: claude-sonnet-4-5 }
    streamRecovery: continue
`);
    expect(answerText('ab')).toBe('Mock answer to: ab');
    const r = await readStream(await g.client.chat.completions.create({ ...ask('ab'), stream: true }, { timeout: 10_000 }));
    expect(r.err).toBeUndefined();
    expect(r.text).toBe('Mock answer and so the mock continues after 11 characters.');
    const seen = await mockRequests(c);
    expect(seen.map((x) => [x.path, x.headers['x-retry-reason']])).toEqual([['/v1/messages', 'stream_cut']]);
    expect(value(await g.metrics(), 'stormgate_stream_ends_total', { end: 'recovered' })).toBe(1);
  });

  it('answers a batch call shed by a full pool with the degraded text (reason shed) where the route has one', async () => {
    const m = await startMock({ quiet: true });
    await putFaults(m, { latencyMs: 1500 });
    const g = await gatewayFrom(`
server: { host: 127.0.0.1, port: 0 }
providers:
  mock:
    family: openai
    baseUrl: ${m.url}/v1
    apiKey: sk-mock
    pools:
      maxConcurrent: 1
      classes:
        online: { minShare: 0.5, maxQueue: 10 }
        batch: { minShare: 0.1, maxQueue: 0 }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [{ provider: mock }]
    degraded: { message: "${DEGRADED_TEXT}" }
`);
    const busy = rawChat(g.url, ask('holds the slot'));
    await sleep(300);
    const res = await fetch(`${g.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-stormgate-priority': 'batch' },
      body: JSON.stringify(ask('batch job')),
    });
    const body = (await res.json()) as OpenAI.ChatCompletion;
    expect(res.status).toBe(200);
    expect(res.headers.get('x-stormgate-degraded')).toBe('true');
    expect(body.choices[0]!.message.content).toBe(DEGRADED_TEXT);
    expect((await busy).status).toBe(200);
    const metrics = await g.metrics();
    expect(value(metrics, 'stormgate_degraded_total', { reason: 'shed' })).toBe(1);
    expect(value(metrics, 'stormgate_shed_total', { priority: 'batch' })).toBe(1);
    expect((await mockStats(m)).total).toBe(1);
  });

});
