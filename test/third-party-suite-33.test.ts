// A thirty-third third-party suite, written from the README alone ("Idempotency keys" above all, "Health, readiness,
// shutdown" on drains and restarts, "Errors" and its idempotency codes, "Client keys" (auth.limits), "Paths"
// (passthrough), "Logs and metrics", "The mock provider"), as an outside team evaluating LLM gateways would test THE
// COUPON INCIDENT UNDER PRODUCTION FAILURES: a tool call that commits after its client's timeout, retried by the
// agent's SDK, while the things around it fail: the client leaves mid-run, a crowd of retries arrives at once, the answer is too large to keep, the key is malformed or
// reused on another path, an instance is SIGKILLed mid-run (a lease, not minutes), Redis goes away and comes back
// (stopped, or restarted empty), and an instance is drained with runs whose clients left. Every test counts what the
// provider (the bundled mock) received, because the claim is "runs once", and what the client got (status, error
// code, `idempotent-replayed`, bytes). Timings are scaled down and bounds are generous (a loaded 2-core machine).
import { request as httpRequest } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import Anthropic from '@anthropic-ai/sdk';
import { Redis as IORedis } from 'ioredis';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import type { MockServer } from '../src/mock/server.ts';
import { freePort } from './helpers/free-port.ts';
import { useGatewayProcesses, waitReady } from './helpers/gateway-process.ts';
import { startRedis, useRedisServer, type RedisHandle } from './helpers/redis-server.ts';
import { scrapeMetrics, TEST_KEY, useExtraMocks, useGateways } from './helpers/stack.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();
const redisServer = useRedisServer();
const startProcess = useGatewayProcesses();

type RouteInput = ConfigInput['routes'][number];

const CHAT = '/v1/chat/completions';
const body = (content: string, extra: Record<string, unknown> = {}) => ({ model: 'gpt-4o', messages: [{ role: 'user', content }], ...extra });

// ---------------------------------------------------------------------------------------------------------------
// Setting up: a config in front of one mock, gateways (in-process, or a real process to SIGKILL / SIGTERM), raw calls.

interface ConfigOptions {
  route?: Partial<RouteInput>;
  idempotency?: ConfigInput['idempotency'];
  auth?: ConfigInput['auth'];
  /** A Redis state store (its URL) under a key prefix of the test's own. */
  redis?: string;
  prefix?: string;
  drain?: ConfigInput['drain'];
  port?: number;
  server?: Partial<ConfigInput['server']>;
}

function configInput(mock: MockServer, o: ConfigOptions = {}): ConfigInput {
  return {
    server: { host: '127.0.0.1', port: o.port ?? 0, logLevel: 'info', ...o.server },
    providers: {
      mock: { family: 'openai', baseUrl: `${mock.url}/v1`, apiKey: TEST_KEY, maxConnections: 64, breaker: false },
      claude: { family: 'anthropic', baseUrl: mock.url, apiKey: TEST_KEY, maxConnections: 64, breaker: false },
    },
    routes: [
      { name: 'chat', match: { path: CHAT }, targets: [{ provider: 'mock' }], timeoutMs: 20_000, ...o.route },
      { name: 'embeddings', match: { path: '/v1/embeddings' }, targets: [{ provider: 'mock' }], timeoutMs: 20_000 },
      { name: 'responses', match: { path: '/v1/responses' }, targets: [{ provider: 'mock' }], timeoutMs: 20_000 },
      { name: 'messages', match: { path: '/v1/messages' }, targets: [{ provider: 'claude' }], timeoutMs: 20_000 },
    ],
    ...(o.idempotency && { idempotency: o.idempotency }),
    ...(o.auth && { auth: o.auth }),
    ...(o.redis && { state: { redis: o.redis, keyPrefix: o.prefix ?? 'tp33', commandTimeoutMs: 200 } }),
    ...(o.drain && { drain: o.drain }),
  };
}

interface Gw {
  url: string;
  logs: string[];
}

async function gateway(mock: MockServer, o: ConfigOptions = {}): Promise<Gw> {
  const logs: string[] = [];
  const url = await startGateway(ConfigSchema.parse(configInput(mock, o)), { logs });
  return { url, logs };
}

let prefixes = 0;
const freshPrefix = () => `tp33-${process.pid}-${++prefixes}`;

interface Answer {
  status: number;
  headers: Headers;
  text: string;
  ms: number;
}

/** One POST with fetch, its whole body read. */
async function post(url: string, path: string, payload: unknown, headers: Record<string, string> = {}, signal?: AbortSignal): Promise<Answer> {
  const t0 = Date.now();
  const res = await fetch(`${url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof payload === 'string' ? payload : JSON.stringify(payload),
    signal,
  });
  const text = await res.text();
  return { status: res.status, headers: res.headers, text, ms: Date.now() - t0 };
}

const errorOf = (a: Answer) => (JSON.parse(a.text) as { error: { code: string; param?: string | null } }).error;

interface Stats {
  total: number;
  inflight: number;
  aborted: number;
  byStatus: Record<string, number>;
  byPath: Record<string, number>;
}
const stats = async (mock: MockServer) => (await (await fetch(`${mock.url}/_mock/stats`)).json()) as Stats;
const mockLog = async (mock: MockServer) =>
  (await (await fetch(`${mock.url}/_mock/requests`)).json()) as { path: string; receivedAt: number; aborted: boolean; headers: Record<string, string>; requestId?: string; status?: number }[];

async function until<T>(what: string, get: () => Promise<T>, ok: (v: T) => boolean, withinMs = 10_000): Promise<T> {
  const deadline = Date.now() + withinMs;
  for (;;) {
    const v = await get();
    if (ok(v)) return v;
    if (Date.now() > deadline) throw new Error(`${what}: still ${JSON.stringify(v)} after ${withinMs} ms`);
    await sleep(25);
  }
}

const readyz = async (url: string) => (await fetch(`${url}/readyz`).then((r) => r.json(), () => ({}))) as { store?: string; degraded?: boolean };
const backOnRedis = (url: string) => until(`${url} back on Redis`, () => readyz(url), (r) => r.store === 'redis' && r.degraded === false, 15_000);

async function requestsOutcome(url: string, outcome: string): Promise<number> {
  return (await scrapeMetrics(url)).filter((s) => s.name === 'stormgate_requests_total' && s.labels.outcome === outcome).reduce((n, s) => n + s.value, 0);
}

const logLines = (logs: string[]) => logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === 'request');

// ---------------------------------------------------------------------------------------------------------------

describe('the tool call that commits after its client timed out, on one instance', () => {
  it("runs a keyed call under the route's timeout, ignoring the client's x-stormgate-timeout-ms that cuts the same call without a key", async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 1_200 } });
    const g = await gateway(mock);
    const unkeyed = await post(g.url, CHAT, body('commit coupon'), { 'x-stormgate-timeout-ms': '500' });
    expect(unkeyed.status).toBe(504);
    expect(errorOf(unkeyed).code).toBe('deadline_exceeded');
    const keyed = await post(g.url, CHAT, body('commit coupon'), { 'x-stormgate-timeout-ms': '500', 'idempotency-key': 'coupon-call-1' });
    expect(keyed.status).toBe(200);
    expect(keyed.ms).toBeGreaterThanOrEqual(1_100);
    expect((await stats(mock)).total).toBe(2);
  });

  it('a client that leaves does not stop the run: the repeat gets the answer replayed, the run is logged clientGone, the repeat counted replayed and not timed', async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 800 } });
    const g = await gateway(mock);
    const gone = post(g.url, CHAT, body('coupon for u9'), { 'idempotency-key': 'u9' }, AbortSignal.timeout(200));
    await expect(gone).rejects.toThrow();
    await until('the run answered upstream', () => stats(mock), (s) => s.byStatus['200'] === 1);
    const upstreamId = (await mockLog(mock))[0]!.requestId;
    const runLine = await until('the run logged', async () => logLines(g.logs).find((l) => l.idempotency === 'run'), (l) => l !== undefined, 3_000);
    expect(runLine).toMatchObject({ idempotency: 'run', clientGone: true, outcome: 'success' });
    const durationsBefore = (await scrapeMetrics(g.url)).filter((s) => s.name === 'stormgate_request_duration_seconds_count').reduce((n, s) => n + s.value, 0);

    const repeat = await post(g.url, CHAT, body('coupon for u9'), { 'idempotency-key': 'u9' });
    expect(repeat.status).toBe(200);
    expect(repeat.headers.get('idempotent-replayed')).toBe('true');
    expect(repeat.headers.get('x-request-id')).toBe(upstreamId);
    expect(repeat.ms).toBeLessThan(500);
    expect((await stats(mock)).total).toBe(1);
    expect(await requestsOutcome(g.url, 'replayed')).toBe(1);
    const durationsAfter = (await scrapeMetrics(g.url)).filter((s) => s.name === 'stormgate_request_duration_seconds_count').reduce((n, s) => n + s.value, 0);
    expect(durationsAfter).toBe(durationsBefore);
    await until('the replay logged', async () => logLines(g.logs).find((l) => l.idempotency === 'replayed'), (l) => l !== undefined, 3_000);
  });

  it('replays a stream byte for byte, with its status and x-stormgate-* / x-request-id headers and idempotent-replayed', async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { stream: { chunks: 6, chunkDelayMs: 20 } } });
    const g = await gateway(mock);
    const first = await post(g.url, CHAT, body('stream the plan', { stream: true }), { 'idempotency-key': 'stream-1' });
    const again = await post(g.url, CHAT, body('stream the plan', { stream: true }), { 'idempotency-key': 'stream-1' });
    expect(first.status).toBe(200);
    expect(first.text).toContain('data: [DONE]');
    expect(again.status).toBe(200);
    expect(again.text).toBe(first.text);
    expect(again.headers.get('content-type')).toBe(first.headers.get('content-type'));
    for (const h of ['x-request-id', 'x-stormgate-target', 'x-stormgate-route']) expect(again.headers.get(h), h).toBe(first.headers.get(h));
    expect(first.headers.get('idempotent-replayed')).toBeNull();
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect((await stats(mock)).total).toBe(1);
  });

  it('reads a stream whose client left after its first chunk to its end, logs it then with its usage billed, and the repeat gets every chunk', async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { stream: { chunks: 6, chunkDelayMs: 150 } } });
    const g = await gateway(mock);
    const streamBody = body('long plan', { stream: true, stream_options: { include_usage: true } });
    const ctl = new AbortController();
    const res = await fetch(`${g.url}${CHAT}`, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': 'left-stream' }, body: JSON.stringify(streamBody), signal: ctl.signal });
    const reader = res.body!.getReader();
    let seen = '';
    while (!seen.includes('"content"')) seen += new TextDecoder().decode((await reader.read()).value);
    ctl.abort();
    await until('the upstream stream ended', () => stats(mock), (s) => s.inflight === 0 && s.total === 1);
    const runLine = await until('the run logged', async () => logLines(g.logs).find((l) => l.idempotency === 'run'), (l) => l !== undefined, 3_000);
    expect(runLine).toMatchObject({ clientGone: true, outcome: 'success' });
    const tokens = (await scrapeMetrics(g.url)).filter((m) => m.name === 'stormgate_tokens_total' && m.labels.kind === 'completion').reduce((n, m) => n + m.value, 0);
    expect(tokens).toBeGreaterThan(0);
    const repeat = await post(g.url, CHAT, streamBody, { 'idempotency-key': 'left-stream' });
    expect(repeat.status).toBe(200);
    expect(repeat.headers.get('idempotent-replayed')).toBe('true');
    const deltas = repeat.text.split('\n').filter((l) => l.startsWith('data: {') && /"content":"[^"]/.test(l));
    expect(deltas).toHaveLength(6);
    expect(repeat.text.trimEnd().endsWith('data: [DONE]')).toBe(true);
    const s = await stats(mock);
    expect(s.total).toBe(1);
    expect(s.aborted).toBe(0);
  });

  it('a crowd of 20 retries of one call while it runs: one upstream request, the same answer to all, the key forwarded upstream', async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 700 } });
    const g = await gateway(mock);
    const answers = await Promise.all(Array.from({ length: 20 }, () => post(g.url, CHAT, body('one coupon'), { 'idempotency-key': 'herd-1' })));
    expect(answers.map((a) => a.status)).toEqual(Array(20).fill(200));
    expect(new Set(answers.map((a) => a.text)).size).toBe(1);
    const log = await mockLog(mock);
    expect(log).toHaveLength(1);
    expect(log[0]!.headers['idempotency-key']).toBe('herd-1');
  });

  it("answers a repeat whose own deadline comes first 409 idempotency_key_in_progress (x-should-retry, retry-after-ms 1000), and the SDK comes back for the answer", async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 2_500 } });
    const g = await gateway(mock);
    const run = post(g.url, CHAT, body('slow tool'), { 'idempotency-key': 'slow-1' });
    await until('the run upstream', () => stats(mock), (s) => s.inflight === 1);
    const early = await post(g.url, CHAT, body('slow tool'), { 'idempotency-key': 'slow-1', 'x-stormgate-timeout-ms': '600' });
    expect(early.status).toBe(409);
    expect(errorOf(early).code).toBe('idempotency_key_in_progress');
    expect(early.headers.get('x-should-retry')).toBe('true');
    expect(early.headers.get('retry-after-ms')).toBe('1000');
    expect(early.ms).toBeLessThan(1_500);

    const client = new OpenAI({ baseURL: `${g.url}/v1`, apiKey: 'unused', maxRetries: 5 });
    const viaSdk = await client.chat.completions.create(body('slow tool') as never, { headers: { 'Idempotency-Key': 'slow-1' }, timeout: 900 });
    const first = JSON.parse((await run).text) as { id: string };
    expect(viaSdk.id).toBe(first.id);
    expect((await stats(mock)).total).toBe(1);
    expect(await requestsOutcome(g.url, 'rejected')).toBeGreaterThanOrEqual(2);
  });

  it('a run that ends in an error gives the key back: the next repeat runs the request again', async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { errors: [{ status: 500, times: 1 }] } });
    // As the README advises for a call that must never run twice: 500 left out of retryOn.
    const g = await gateway(mock, { route: { retry: { retryOn: [429, 503] } } });
    const failed = await post(g.url, CHAT, body('coupon u3'), { 'idempotency-key': 'u3' });
    expect(failed.status).toBe(500);
    const again = await post(g.url, CHAT, body('coupon u3'), { 'idempotency-key': 'u3' });
    expect(again.status).toBe(200);
    expect(again.headers.get('idempotent-replayed')).toBeNull();
    expect((await stats(mock)).byStatus).toEqual({ '500': 1, '200': 1 });
  });

  it('keeps no answer over idempotency.maxAnswerBytes: the repeat gets 409 idempotency_answer_not_kept, not a second run; a new key runs it', async () => {
    const mock = await startMock({ apiKey: TEST_KEY });
    const g = await gateway(mock, { idempotency: { maxAnswerBytes: 100 } });
    expect((await post(g.url, CHAT, body('big answer'), { 'idempotency-key': 'big-1' })).status).toBe(200);
    const repeat = await post(g.url, CHAT, body('big answer'), { 'idempotency-key': 'big-1' });
    expect(repeat.status).toBe(409);
    expect(errorOf(repeat).code).toBe('idempotency_answer_not_kept');
    expect((await stats(mock)).total).toBe(1);
    expect((await post(g.url, CHAT, body('big answer'), { 'idempotency-key': 'big-2' })).status).toBe(200);
    expect((await stats(mock)).total).toBe(2);
  });

  it('scopes a key by path and by client key: the same key on /v1/embeddings or from another team runs its own call', async () => {
    const mock = await startMock({ apiKey: TEST_KEY });
    const g = await gateway(mock, { auth: { keys: { agents: 'sk-agents-33', tools: 'sk-tools-33' } } });
    const as = (k: string) => ({ authorization: `Bearer ${k}`, 'idempotency-key': 'shared-key' });
    const chat = await post(g.url, CHAT, body('same key'), as('sk-agents-33'));
    const emb = await post(g.url, '/v1/embeddings', { model: 'text-embedding-3-small', input: 'same key' }, as('sk-agents-33'));
    const otherTeam = await post(g.url, CHAT, body('same key'), as('sk-tools-33'));
    const replay = await post(g.url, CHAT, body('same key'), as('sk-agents-33'));
    expect([chat.status, emb.status, otherTeam.status, replay.status]).toEqual([200, 200, 200, 200]);
    expect([emb, otherTeam].map((a) => a.headers.get('idempotent-replayed'))).toEqual([null, null]);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(replay.text).toBe(chat.text);
    expect((await stats(mock)).byPath).toEqual({ [CHAT]: 2, '/v1/embeddings': 1 });
  });

  it('refuses a key that is not 1 to 255 visible ASCII characters, or sent twice, 400 invalid_idempotency_key, and sends nothing upstream', async () => {
    const mock = await startMock({ apiKey: TEST_KEY });
    const g = await gateway(mock);
    for (const key of ['k'.repeat(256), 'two words', 'caf\u00e9']) {
      const a = await post(g.url, CHAT, body('x'), { 'idempotency-key': key });
      expect(a.status, JSON.stringify(key)).toBe(400);
      expect(errorOf(a)).toMatchObject({ code: 'invalid_idempotency_key', param: 'idempotency-key' });
    }
    const twice = await new Promise<{ status: number; text: string }>((resolve, reject) => {
      const payload = JSON.stringify(body('x'));
      const u = new URL(`${g.url}${CHAT}`);
      const req = httpRequest({ host: u.hostname, port: u.port, path: u.pathname, method: 'POST', headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload), 'idempotency-key': ['a-1', 'a-2'] } }, (res) => {
        let text = '';
        res.on('data', (d: Buffer) => (text += d.toString()));
        res.on('end', () => resolve({ status: res.statusCode!, text }));
      });
      req.on('error', reject);
      req.end(payload);
    });
    expect(twice.status).toBe(400);
    expect((JSON.parse(twice.text) as { error: { code: string } }).error.code).toBe('invalid_idempotency_key');
    expect((await stats(mock)).total).toBe(0);
    expect(await requestsOutcome(g.url, 'rejected')).toBe(4);
    expect((await post(g.url, CHAT, body('x'), { 'idempotency-key': '~'.repeat(255) })).status).toBe(200);
  });

  it('with idempotency.enabled false the header is only forwarded, and bodyAsKeyMs ignored: every repeat runs, the provider sees the key each time', async () => {
    const mock = await startMock({ apiKey: TEST_KEY });
    const g = await gateway(mock, { idempotency: { enabled: false }, route: { idempotency: { bodyAsKeyMs: 60_000 } } });
    const a = await post(g.url, CHAT, body('no keys here'), { 'idempotency-key': 'off-1' });
    const b = await post(g.url, CHAT, body('no keys here'), { 'idempotency-key': 'off-1' });
    expect([a.status, b.status]).toEqual([200, 200]);
    expect(b.headers.get('idempotent-replayed')).toBeNull();
    const log = await mockLog(mock);
    expect(log.map((r) => r.headers['idempotency-key'])).toEqual(['off-1', 'off-1']);
    const keyless = await post(g.url, CHAT, body('no keys here'));
    expect(keyless.headers.get('idempotent-replayed')).toBeNull();
    expect((await stats(mock)).total).toBe(3);
  });

  it('bodyAsKeyMs: a keyless retry within N ms gets the answer, another query string is another call, after N ms it runs anew', async () => {
    const mock = await startMock({ apiKey: TEST_KEY });
    const g = await gateway(mock, { route: { idempotency: { bodyAsKeyMs: 600 } } });
    const first = await post(g.url, CHAT, body('coupon for user 12'));
    const retry = await post(g.url, CHAT, body('coupon for user 12'));
    expect(retry.headers.get('idempotent-replayed')).toBe('true');
    expect(retry.text).toBe(first.text);
    const otherQuery = await post(g.url, `${CHAT}?shard=2`, body('coupon for user 12'));
    expect(otherQuery.headers.get('idempotent-replayed')).toBeNull();
    expect((await stats(mock)).total).toBe(2);
    await sleep(900);
    const later = await post(g.url, CHAT, body('coupon for user 12'));
    expect(later.status).toBe(200);
    expect(later.headers.get('idempotent-replayed')).toBeNull();
    expect((await stats(mock)).total).toBe(3);
  });

  it("keeps no degraded answer (the gateway's own 200): the key is given back and the next repeat runs the request", async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { errors: [{ status: 503, times: 2 }] } });
    const g = await gateway(mock, { route: { retry: { maxAttempts: 2, backoff: { baseMs: 10 } }, park: false, degraded: { message: 'The coupon service is busy.' } } });
    const degraded = await post(g.url, CHAT, body('coupon u4'), { 'idempotency-key': 'u4' });
    expect(degraded.status).toBe(200);
    expect(degraded.headers.get('x-stormgate-degraded')).toBe('true');
    const again = await post(g.url, CHAT, body('coupon u4'), { 'idempotency-key': 'u4' });
    expect(again.status).toBe(200);
    expect(again.headers.get('x-stormgate-degraded')).toBeNull();
    expect(again.headers.get('idempotent-replayed')).toBeNull();
    expect((await stats(mock)).byStatus).toEqual({ '503': 2, '200': 1 });
  });

  it('keeps an answer for idempotency.ttlMs after it was given, then a repeat runs anew', async () => {
    const mock = await startMock({ apiKey: TEST_KEY });
    const g = await gateway(mock, { idempotency: { ttlMs: 700 } });
    await post(g.url, CHAT, body('ttl coupon'), { 'idempotency-key': 'ttl-1' });
    await sleep(200);
    expect((await post(g.url, CHAT, body('ttl coupon'), { 'idempotency-key': 'ttl-1' })).headers.get('idempotent-replayed')).toBe('true');
    await sleep(900);
    const late = await post(g.url, CHAT, body('ttl coupon'), { 'idempotency-key': 'ttl-1' });
    expect(late.status).toBe(200);
    expect(late.headers.get('idempotent-replayed')).toBeNull();
    expect((await stats(mock)).total).toBe(2);
  });

  it('keeps at most idempotency.memoryBytes of answers in the process, dropping the oldest first', async () => {
    const mock = await startMock({ apiKey: TEST_KEY });
    const g = await gateway(mock, { idempotency: { memoryBytes: 4_000 } });
    for (let i = 1; i <= 12; i++) expect((await post(g.url, CHAT, body(`coupon batch ${i}`), { 'idempotency-key': `mem-${i}` })).status).toBe(200);
    const newest = await post(g.url, CHAT, body('coupon batch 12'), { 'idempotency-key': 'mem-12' });
    expect(newest.headers.get('idempotent-replayed')).toBe('true');
    const oldest = await post(g.url, CHAT, body('coupon batch 1'), { 'idempotency-key': 'mem-1' });
    expect(oldest.status).toBe(200);
    expect(oldest.headers.get('idempotent-replayed')).toBeNull();
    expect((await stats(mock)).total).toBe(13);
  });

  it("answers a repeat 409 at once when the waiting repeats' bodies would pass half of server.maxWaitingBodyBytes; the one that fits gets the answer", async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 1_500 } });
    const g = await gateway(mock, { server: { maxWaitingBodyBytes: 20_000 } });
    const big = body(`summarise: ${'x'.repeat(6_000)}`);
    const run = post(g.url, CHAT, big, { 'idempotency-key': 'bytes-1' });
    await until('the run upstream', () => stats(mock), (s) => s.inflight === 1);
    const waiting = post(g.url, CHAT, big, { 'idempotency-key': 'bytes-1' });
    await sleep(150);
    const refused = await post(g.url, CHAT, big, { 'idempotency-key': 'bytes-1' });
    expect(refused.status).toBe(409);
    expect(errorOf(refused).code).toBe('idempotency_key_in_progress');
    expect(refused.headers.get('x-should-retry')).toBe('true');
    expect(refused.ms).toBeLessThan(700);
    const [first, second] = await Promise.all([run, waiting]);
    expect(second.status).toBe(200);
    expect(second.text).toBe(first.text);
    expect((await stats(mock)).total).toBe(1);
  });

  it('Anthropic SDK on /v1/messages, timeout 1 s, provider at 1.5 s: its retry under the same key gets the run\'s message, one upstream request', async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 1_500 } });
    const g = await gateway(mock);
    let sent = 0;
    const client = new Anthropic({ baseURL: g.url, apiKey: 'unused', maxRetries: 2, fetch: ((u, i) => (sent++, fetch(u, i))) as typeof fetch });
    const msg = await client.messages.create(
      { model: 'claude-sonnet-4-5', max_tokens: 64, messages: [{ role: 'user', content: 'book the refund' }] },
      { headers: { 'Idempotency-Key': 'refund-1' }, timeout: 1_000 },
    );
    expect(msg.type).toBe('message');
    expect(sent).toBe(2);
    expect((await stats(mock)).byPath).toEqual({ '/v1/messages': 1 });
  });

  it('answers the same key with another body 422 idempotency_key_reused at once, even while the run is going, and sends it nowhere', async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 1_500 } });
    const g = await gateway(mock);
    const run = post(g.url, CHAT, body('coupon for u5'), { 'idempotency-key': 'u5' });
    await until('the run upstream', () => stats(mock), (s) => s.inflight === 1);
    const other = await post(g.url, CHAT, body('coupon for u6'), { 'idempotency-key': 'u5' });
    expect(other.status).toBe(422);
    expect(errorOf(other).code).toBe('idempotency_key_reused');
    expect(other.ms).toBeLessThan(700);
    expect((await run).status).toBe(200);
    const after = await post(g.url, CHAT, body('coupon for u6'), { 'idempotency-key': 'u5' });
    expect(after.status).toBe(422);
    expect((await stats(mock)).total).toBe(1);
  });

  it("a repeat that gives up while waiting holds its body's bytes meanwhile, then counts client_gone with route none, and the run goes on", async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 1_500 } });
    const g = await gateway(mock);
    const payload = body(`summarise: ${'y'.repeat(5_000)}`);
    const run = post(g.url, CHAT, payload, { 'idempotency-key': 'gone-1' });
    await until('the run upstream', () => stats(mock), (s) => s.inflight === 1);
    const ctl = new AbortController();
    const repeat = post(g.url, CHAT, payload, { 'idempotency-key': 'gone-1' }, ctl.signal).catch(() => 'aborted');
    const gauge = async () => (await scrapeMetrics(g.url)).find((s) => s.name === 'stormgate_waiting_body_bytes')?.value ?? -1;
    await until('the repeat holding its body', gauge, (v) => v >= 5_000, 1_000);
    ctl.abort();
    expect(await repeat).toBe('aborted');
    await until('the body given back', gauge, (v) => v === 0, 1_000);
    expect((await run).status).toBe(200);
    const gone = (await scrapeMetrics(g.url)).filter((s) => s.name === 'stormgate_requests_total' && s.labels.outcome === 'client_gone');
    expect(gone.filter((s) => s.value > 0).map((s) => [s.labels.route, s.value])).toEqual([['none', 1]]);
    expect((await stats(mock)).total).toBe(1);
  });

  it('on /v1/messages answers key errors in the shape both SDKs read: type "error" at the top, the code unchanged', async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 1_500 } });
    const g = await gateway(mock);
    const msg = (text: string) => ({ model: 'claude-sonnet-4-5', max_tokens: 32, messages: [{ role: 'user', content: text }] });
    const bad = await post(g.url, '/v1/messages', msg('x'), { 'idempotency-key': 'has space' });
    expect(bad.status).toBe(400);
    expect(JSON.parse(bad.text)).toMatchObject({ type: 'error', error: { type: 'invalid_request_error', code: 'invalid_idempotency_key' } });
    const run = post(g.url, '/v1/messages', msg('refund 2'), { 'idempotency-key': 'refund-2' });
    await until('the run upstream', () => stats(mock), (s) => s.inflight === 1);
    const busy = await post(g.url, '/v1/messages', msg('refund 2'), { 'idempotency-key': 'refund-2', 'x-stormgate-timeout-ms': '500' });
    expect(busy.status).toBe(409);
    expect(JSON.parse(busy.text)).toMatchObject({ type: 'error', error: { code: 'idempotency_key_in_progress' } });
    const reused = await post(g.url, '/v1/messages', msg('refund 3'), { 'idempotency-key': 'refund-2' });
    expect(reused.status).toBe(422);
    expect(JSON.parse(reused.text)).toMatchObject({ type: 'error', error: { code: 'idempotency_key_reused' } });
    expect((await run).status).toBe(200);
    expect((await stats(mock)).total).toBe(1);
  });

  it('passthrough paths read no keys: each call is forwarded, even under a key a managed path refuses', async () => {
    const mock = await startMock({ apiKey: TEST_KEY });
    const input = configInput(mock);
    const logs: string[] = [];
    const url = await startGateway(ConfigSchema.parse({ ...input, passthrough: { provider: 'mock', paths: ['/v1/files'], methods: ['GET', 'POST'] } }), { logs });
    const a = await post(url, '/v1/files', { purpose: 'batch' }, { 'idempotency-key': 'file-1' });
    const b = await post(url, '/v1/files', { purpose: 'batch' }, { 'idempotency-key': 'file-1' });
    const c = await post(url, '/v1/files', { purpose: 'batch' }, { 'idempotency-key': 'k'.repeat(300) });
    expect([a, b, c].map((x) => x.headers.get('idempotent-replayed'))).toEqual([null, null, null]);
    expect(c.status).not.toBe(400);
    const log = await mockLog(mock);
    expect(log.map((r) => r.path)).toEqual(['/v1/files', '/v1/files', '/v1/files']);
  });

  it('keeps a background Responses stream that broke after response.created: the repeat gets the same response id, no second job', async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { stream: { chunks: 6, chunkDelayMs: 30, cutAfterChunks: 2 } } });
    const g = await gateway(mock);
    const job = { model: 'gpt-4o', input: 'nightly report', background: true, stream: true };
    const first = await post(g.url, '/v1/responses', job, { 'idempotency-key': 'job-1' });
    expect(first.status).toBe(200);
    const id = /"type":"response\.created".*?"id":"(resp_[^"]+)"/.exec(first.text)?.[1];
    expect(id).toBeDefined();
    const repeat = await post(g.url, '/v1/responses', job, { 'idempotency-key': 'job-1' });
    expect(repeat.status).toBe(200);
    expect(repeat.text).toContain(id);
    expect((await stats(mock)).total).toBe(1);
  });

  it("repeats reserve none of their client's token rate (the reservation follows the key's claim): six waiting repeats under a 300-token rate all get the answer", async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 1_000 } });
    const g = await gateway(mock, { auth: { keys: { agents: 'sk-agents-33' }, limits: { agents: { tokensPerMinute: 300 } } } });
    // About 130 tokens' estimate each (its bytes / 4 plus max_tokens 100): the run's and two more would pass 300.
    const payload = body('issue the coupon for order 5521', { max_tokens: 100 });
    const headers = { authorization: 'Bearer sk-agents-33', 'idempotency-key': 'rate-1' };
    const run = post(g.url, CHAT, payload, headers);
    await until('the run upstream', () => stats(mock), (s) => s.inflight === 1);
    const repeats = await Promise.all(Array.from({ length: 6 }, () => post(g.url, CHAT, payload, headers)));
    const first = await run;
    expect(first.status).toBe(200);
    expect(repeats.map((r) => r.status)).toEqual(Array(6).fill(200));
    expect(new Set(repeats.map((r) => r.text))).toEqual(new Set([first.text]));
    expect((await stats(mock)).total).toBe(1);
  });
});

describe('a fleet on Redis: another instance, a SIGKILL, Redis going away, a drain', () => {
  it('a repeat on another instance while a stream runs waits for it, gets it byte for byte within 150 ms of its end, and one after that is replayed too', async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { stream: { chunks: 8, chunkDelayMs: 150 } } });
    const prefix = freshPrefix();
    const a = await gateway(mock, { redis: redisServer().url, prefix });
    const b = await gateway(mock, { redis: redisServer().url, prefix });
    const payload = body('fleet stream', { stream: true });
    const run = post(a.url, CHAT, payload, { 'idempotency-key': 'fleet-1' }).then((r) => ({ ...r, endedAt: Date.now() }));
    await until('the run upstream', () => stats(mock), (s) => s.inflight === 1);
    const waiting = post(b.url, CHAT, payload, { 'idempotency-key': 'fleet-1' }).then((r) => ({ ...r, endedAt: Date.now() }));
    const [first, second] = await Promise.all([run, waiting]);
    expect(second.status).toBe(200);
    expect(second.text).toBe(first.text);
    expect(second.endedAt - first.endedAt).toBeLessThan(400);
    const later = await post(b.url, CHAT, payload, { 'idempotency-key': 'fleet-1' });
    expect(later.headers.get('idempotent-replayed')).toBe('true');
    expect(later.text).toBe(first.text);
    expect((await stats(mock)).total).toBe(1);
  });

  it('renews a claim while its run outlasts the lease: a repeat on another instance after two leases waits for the run, not beside it', async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 3_500 } });
    const o: ConfigOptions = { redis: redisServer().url, prefix: freshPrefix(), idempotency: { leaseMs: 1_000 } };
    const a = await gateway(mock, o);
    const b = await gateway(mock, o);
    const run = post(a.url, CHAT, body('long tool'), { 'idempotency-key': 'long-1' });
    await until('the run upstream', () => stats(mock), (s) => s.inflight === 1);
    await sleep(2_200);
    const repeat = await post(b.url, CHAT, body('long tool'), { 'idempotency-key': 'long-1' });
    const answered = await run;
    expect([answered.status, repeat.status]).toEqual([200, 200]);
    expect(repeat.text).toBe(answered.text);
    expect((await stats(mock)).total).toBe(1);
  });

  it('a claim whose reply Redis sent late (Redis paused 350 ms, a lone timeout) is looked at again: two instances racing for one key run it once and both get the answer', async () => {
    const redis: RedisHandle = await startRedis();
    const admin = new IORedis(redis.url);
    try {
      const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 800 } });
      const o: ConfigOptions = { redis: redis.url, prefix: freshPrefix() };
      const a = await gateway(mock, o);
      const b = await gateway(mock, o);
      // Longer than commandTimeoutMs (200), too short for the store to call Redis away: both claims time out, both
      // reach Redis, and one wins there.
      await admin.client('PAUSE', 350, 'ALL');
      const [x, y] = await Promise.all([
        post(a.url, CHAT, body('paused coupon'), { 'idempotency-key': 'paused-1' }),
        post(b.url, CHAT, body('paused coupon'), { 'idempotency-key': 'paused-1' }),
      ]);
      expect([x.status, y.status]).toEqual([200, 200]);
      expect(y.text).toBe(x.text);
      expect((await stats(mock)).total).toBe(1);
    } finally {
      admin.disconnect();
      await redis.stop();
    }
  }, 40_000);

  it('an instance SIGKILLed mid-run holds the key for a lease, not timeoutMs + 30 s: the repeat on another instance runs it about a second later', async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 2_000 } });
    const prefix = freshPrefix();
    const port = await freePort();
    const o: ConfigOptions = { redis: redisServer().url, prefix, idempotency: { leaseMs: 1_000 } };
    const pod = startProcess('pod-a', configInput(mock, { ...o, port }));
    await waitReady(pod, port);
    const b = await gateway(mock, o);
    const run = post(`http://127.0.0.1:${port}`, CHAT, body('crash coupon'), { 'idempotency-key': 'crash-1' }).catch(() => undefined);
    await until('the run upstream', () => stats(mock), (s) => s.inflight === 1);
    await sleep(200);
    pod.proc.kill('SIGKILL');
    const killedAt = Date.now();
    await pod.exited;
    await run;
    const repeat = await post(b.url, CHAT, body('crash coupon'), { 'idempotency-key': 'crash-1' });
    expect(repeat.status).toBe(200);
    expect(repeat.headers.get('idempotent-replayed')).toBeNull();
    const log = await mockLog(mock);
    expect(log).toHaveLength(2);
    const rerunAfterMs = log[1]!.receivedAt - killedAt;
    expect(rerunAfterMs).toBeGreaterThanOrEqual(300);
    expect(rerunAfterMs).toBeLessThan(3_000);
  }, 40_000);

  it('Redis stopped mid-run: the answer kept on the instance goes to Redis once it is back, and another instance replays it', async () => {
    const redis: RedisHandle = await startRedis();
    try {
      const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 1_500 } });
      const prefix = freshPrefix();
      const a = await gateway(mock, { redis: redis.url, prefix });
      const b = await gateway(mock, { redis: redis.url, prefix });
      const run = post(a.url, CHAT, body('outage coupon'), { 'idempotency-key': 'outage-1' });
      await until('the run upstream', () => stats(mock), (s) => s.inflight === 1);
      await redis.stop();
      const answered = await run;
      expect(answered.status).toBe(200);
      await redis.restart();
      await Promise.all([backOnRedis(a.url), backOnRedis(b.url)]);
      await sleep(1_500);
      const repeat = await post(b.url, CHAT, body('outage coupon'), { 'idempotency-key': 'outage-1' });
      expect(repeat.status).toBe(200);
      expect(repeat.headers.get('idempotent-replayed')).toBe('true');
      expect(repeat.text).toBe(answered.text);
      expect((await stats(mock)).total).toBe(1);
    } finally {
      await redis.stop();
    }
  }, 40_000);

  /**
   * Two instances on one Redis: a keyed 5 s run on A, Redis (re)started empty at `restartAt` (mid-run, or after
   * stopping it before the run), then a repeat on B once both are back on Redis: it waits for A's run, which ran once.
   */
  async function runAcrossRedisRestart(text: string, restartAt: 'mid-run' | 'away-before-run'): Promise<void> {
    const redis: RedisHandle = await startRedis();
    try {
      const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 5_000 } });
      const prefix = freshPrefix();
      const a = await gateway(mock, { redis: redis.url, prefix });
      const b = await gateway(mock, { redis: redis.url, prefix });
      if (restartAt === 'away-before-run') {
        await redis.stop();
        await until('A degraded to local state', () => readyz(a.url), (r) => r.degraded === true);
      }
      const run = post(a.url, CHAT, body(text), { 'idempotency-key': text });
      await until('the run upstream', () => stats(mock), (s) => s.inflight === 1);
      await redis.restart();
      await Promise.all([backOnRedis(a.url), backOnRedis(b.url)]);
      await sleep(1_500);
      const repeat = await post(b.url, CHAT, body(text), { 'idempotency-key': text });
      const answered = await run;
      expect([answered.status, repeat.status]).toEqual([200, 200]);
      expect(repeat.text).toBe(answered.text);
      expect((await stats(mock)).total).toBe(1);
    } finally {
      await redis.stop();
    }
  }

  it('Redis restarted empty mid-run: the running instance claims its key again, and a repeat on another instance waits for the run', async () => {
    await runAcrossRedisRestart('flushed-coupon', 'mid-run');
  }, 40_000);

  it('Redis away before the run: the claim taken in the process goes to Redis when it is back, and a repeat on another instance waits for the run', async () => {
    await runAcrossRedisRestart('local-coupon', 'away-before-run');
  }, 40_000);

  it('Redis frozen while a run fails: once Redis answers again the key is given back, and a repeat on another instance runs at once rather than after the lease', async () => {
    const redis: RedisHandle = await startRedis();
    let thaw: (() => void) | undefined;
    try {
      // The run fails at its route's deadline (1.5 s; timeouts are not retried here), while Redis is frozen.
      const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 5_000 } });
      const prefix = freshPrefix();
      const o: ConfigOptions = { redis: redis.url, prefix, route: { timeoutMs: 1_500, retry: { retryOn: [429, 503] } } };
      const a = await gateway(mock, o);
      const b = await gateway(mock, o);
      const run = post(a.url, CHAT, body('frozen coupon'), { 'idempotency-key': 'frozen-1' });
      await until('the run upstream', () => stats(mock), (s) => s.inflight === 1);
      thaw = redis.freeze();
      const failed = await run;
      expect(failed.status).toBe(504);
      expect(errorOf(failed).code).toBe('deadline_exceeded');
      await fetch(`${mock.url}/_mock/faults`, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: '{}' });
      await sleep(500);
      thaw();
      thaw = undefined;
      await Promise.all([backOnRedis(a.url), backOnRedis(b.url)]);
      await sleep(1_500);
      // The default lease is 10 s: a claim left in Redis would answer this repeat 409 at its 4 s deadline.
      const repeat = await post(b.url, CHAT, body('frozen coupon'), { 'idempotency-key': 'frozen-1', 'x-stormgate-timeout-ms': '4000' });
      expect(repeat.status).toBe(200);
      const log = await mockLog(mock);
      expect(log).toHaveLength(2);
      expect(log[0]!.aborted).toBe(true);
    } finally {
      thaw?.();
      await redis.stop();
    }
  }, 40_000);

  it('at the grace end a run whose client waits, and a repeat waiting for it, both get 503 gateway_draining with retry-after, and the process exits 0', async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 4_000 } });
    const port = await freePort();
    const pod = startProcess('pod-repeats', configInput(mock, { port, drain: { preStopMs: 0, graceMs: 500 } }));
    await waitReady(pod, port);
    const origin = `http://127.0.0.1:${port}`;
    const run = post(origin, CHAT, body('drained coupon'), { 'idempotency-key': 'drained-1' });
    await until('the run upstream', () => stats(mock), (s) => s.inflight === 1);
    const repeat = post(origin, CHAT, body('drained coupon'), { 'idempotency-key': 'drained-1' });
    await sleep(200);
    pod.proc.kill('SIGTERM');
    for (const a of await Promise.all([run, repeat])) {
      expect(a.status).toBe(503);
      expect(errorOf(a).code).toBe('gateway_draining');
      expect(a.headers.get('x-should-retry')).toBe('true');
      expect(Number(a.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    }
    expect(await pod.exited).toBe(0);
    expect((await stats(mock)).total).toBe(1);
  }, 40_000);

  it('SIGTERM waits for a run whose client left, within graceMs, and its answer outlives the instance on Redis', async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 1_500 } });
    const prefix = freshPrefix();
    const port = await freePort();
    const o: ConfigOptions = { redis: redisServer().url, prefix };
    const pod = startProcess('pod-drain', configInput(mock, { ...o, port, drain: { preStopMs: 0, graceMs: 8_000 } }));
    await waitReady(pod, port);
    const t0 = Date.now();
    await expect(post(`http://127.0.0.1:${port}`, CHAT, body('drain coupon'), { 'idempotency-key': 'drain-1' }, AbortSignal.timeout(300))).rejects.toThrow();
    await sleep(100);
    pod.proc.kill('SIGTERM');
    expect(await pod.exited).toBe(0);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(1_300);
    const s = await stats(mock);
    expect(s.byStatus).toEqual({ '200': 1 });
    expect(s.aborted).toBe(0);
    const b = await gateway(mock, o);
    const repeat = await post(b.url, CHAT, body('drain coupon'), { 'idempotency-key': 'drain-1' });
    expect(repeat.status).toBe(200);
    expect(repeat.headers.get('idempotent-replayed')).toBe('true');
    expect((await stats(mock)).total).toBe(1);
  }, 40_000);

  it('past graceMs the run is interrupted and its key given back: a repeat on another instance runs it at once, not after the lease', async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 3_000 } });
    const prefix = freshPrefix();
    const port = await freePort();
    const o: ConfigOptions = { redis: redisServer().url, prefix };
    const pod = startProcess('pod-grace', configInput(mock, { ...o, port, drain: { preStopMs: 0, graceMs: 300 } }));
    await waitReady(pod, port);
    await expect(post(`http://127.0.0.1:${port}`, CHAT, body('cut coupon'), { 'idempotency-key': 'cut-1' }, AbortSignal.timeout(200))).rejects.toThrow();
    await sleep(100);
    pod.proc.kill('SIGTERM');
    expect(await pod.exited).toBe(0);
    const b = await gateway(mock, o);
    // The default lease is 10 s: a key still held would answer this repeat 409 at its 6 s deadline.
    const repeat = await post(b.url, CHAT, body('cut coupon'), { 'idempotency-key': 'cut-1', 'x-stormgate-timeout-ms': '6000' });
    expect(repeat.status).toBe(200);
    expect(repeat.headers.get('idempotent-replayed')).toBeNull();
    const log = await mockLog(mock);
    expect(log).toHaveLength(2);
    expect(log[0]!.aborted).toBe(true);
  }, 40_000);
});
