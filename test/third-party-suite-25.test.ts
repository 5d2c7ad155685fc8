// A twenty-fifth third-party suite, written from the README alone ("Logs and metrics" and its metrics table, "What the
// client sees", "Errors", "Headers", "Retries", "Failover and API families", "Retry budget, circuit breaker, hold-offs,
// parking", "Health, readiness, shutdown") as an outside on-call team would test the gateway before being paged for it.
// Theme: INCIDENT RECONSTRUCTION. For each failed or slow client request, can the engineer tell from ONLY the gateway's
// JSON log line (one per request), the x-stormgate-* / x-request-id response headers and /metrics exactly what
// happened: how many attempts, on which targets, for which reasons, how long each waited (backoff, hint, parked, pool
// slot), why retries stopped, whether and why it failed over, which instance served it, and how the client's
// x-request-id / traceparent meet the upstream's x-request-id and the provider's own request log (the bundled mock's)?
// And do the surfaces agree: attempts in log lines = the provider's count = stormgate_upstream_attempts_total; retries
// in log lines = stormgate_retry_count_total (by reason); fallbacks = stormgate_fallbacks_total; every failed request's
// line has the client's status and error code. No secret (provider keys, client keys, Authorization) may appear in any
// log line, metric, error body or header, for a provider's 401/403 and for config errors too.
// Found and fixed: the line did not carry the error code its client got (errorCode added, src/http/send-answer.ts,
// src/http/request-log.ts). Design questions (pinned as the gateway behaves): `skipped` reasons are prose, not the
// fallback reason codes; no line names the instance (its via name goes upstream only); an instance that turned a
// request away for a fleet hold-off on a learnt target has no stormgate_hold_remaining_seconds series for it.
// Clients are the official `openai` and `@anthropic-ai/sdk` SDKs over real HTTP against the bundled mock; the fleet
// scenario runs two instances on a real redis-server. Timing bounds are generous (a loaded 2-core machine); counts exact.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import type { MockServer } from '../src/mock/server.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { parseMetrics, useExtraMocks, useGateways, type MetricSample } from './helpers/stack.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();
const redis = useRedisServer();

// Credentials (all listed in test/helpers/test-secrets.ts, so the run's log sweep checks them too).
const PROVIDER_KEY = 'sk-proj-provider-secret-abcdef0123456789';
const ANTHROPIC_KEY = 'sk-ant-pentest-9b2e7d4c1a6f3e8b0d5c';
const BACKUP_KEY = 'backup-key';
const CLIENT_KEY = 'sk-client-not-a-provider-key';
const CLIENT_X_API_KEY = 'client-x-api-key';
const WRONG_KEY = 'sk-misconfigured-key-4242';
const SECRETS = [PROVIDER_KEY, ANTHROPIC_KEY, BACKUP_KEY, CLIENT_KEY, CLIENT_X_API_KEY, WRONG_KEY];
const TRACEPARENT = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
const CHAT = '/v1/chat/completions';
const messages = [{ role: 'user' as const, content: 'Reconstruct the incident.' }];

type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- a log line is JSON: tests read whatever field they check
type Line = Record<string, any>;

/** Everything a client or an operator could read this test: error bodies, headers, /metrics. Swept for secrets. */
let seenTexts: string[] = [];
let allLogs: string[][] = [];
afterEach(() => {
  // The secrecy sweep, after every scenario: logs, what clients were answered, and /metrics scrapes.
  const texts = [...allLogs.flat(), ...seenTexts];
  for (const secret of SECRETS) {
    const leak = texts.find((t) => t.includes(secret));
    expect(leak, `secret ${secret.slice(0, 8)}... leaked`).toBeUndefined();
    expect(texts.some((t) => /bearer\s+sk-/i.test(t)), 'an Authorization header leaked').toBe(false);
  }
  seenTexts = [];
  allLogs = [];
});

let seq = 0;
const newId = (what: string) => `s25-${what}-${seq++}-${randomUUID().slice(0, 8)}`;

function newLogs(): string[] {
  const logs: string[] = [];
  allLogs.push(logs);
  return logs;
}

interface Topology {
  primary: MockServer;
  /** An OpenAI-compatible second target. */
  backup?: MockServer;
  /** An anthropic-family second target (on this mock), claude-sonnet-4-6. */
  claude?: MockServer;
  route?: Partial<RouteInput>;
  provider?: Partial<ProviderInput>;
  /** The primary's key (default PROVIDER_KEY). */
  primaryKey?: string;
  /** Adds a /v1/messages route served by an anthropic provider on the primary mock. */
  messagesRoute?: Partial<RouteInput>;
  /** Adds a second chat route for model `solo` with the primary alone. */
  soloRoute?: Partial<RouteInput>;
  state?: ConfigInput['state'];
}

function configOf(t: Topology): ConfigInput {
  const providers: ConfigInput['providers'] = {
    mock: { family: 'openai', baseUrl: `${t.primary.url}/v1`, apiKey: t.primaryKey ?? PROVIDER_KEY, maxConnections: 64, ...t.provider },
  };
  const targets: RouteInput['targets'] = [{ provider: 'mock' }];
  if (t.backup) {
    providers.backup = { family: 'openai', baseUrl: `${t.backup.url}/v1`, apiKey: BACKUP_KEY, breaker: false };
    targets.push({ provider: 'backup' });
  }
  if (t.claude) {
    providers.claude = { family: 'anthropic', baseUrl: t.claude.url, apiKey: ANTHROPIC_KEY, breaker: false };
    targets.push({ provider: 'claude', model: 'claude-sonnet-4-6' });
  }
  const routes: RouteInput[] = [];
  if (t.soloRoute) routes.push({ name: 'solo', match: { path: CHAT, models: ['solo'] }, targets: [{ provider: 'mock' }], ...t.soloRoute });
  routes.push({ name: 'chat', match: { path: CHAT }, targets, ...t.route });
  if (t.messagesRoute) {
    providers.anthropic = { family: 'anthropic', baseUrl: t.primary.url, apiKey: ANTHROPIC_KEY, breaker: false };
    routes.push({ name: 'messages', match: { path: '/v1/messages' }, targets: [{ provider: 'anthropic' }], ...t.messagesRoute });
  }
  return { server: { host: '127.0.0.1', port: 0, logLevel: 'info' }, providers, routes, state: t.state };
}

async function gateway(t: Topology, logs = newLogs()): Promise<{ url: string; logs: string[] }> {
  const url = await startGateway(ConfigSchema.parse(configOf(t)), { logs });
  return { url, logs };
}

/** An `openai` SDK client (no retries of its own) whose raw answers are kept for the secrecy sweep. */
function openai(url: string, opts: ConstructorParameters<typeof OpenAI>[0] = {}): OpenAI {
  return new OpenAI({
    baseURL: `${url}/v1`,
    apiKey: CLIENT_KEY,
    maxRetries: 0,
    fetch: async (u, init) => {
      const res = await fetch(u, init);
      if (!(res.headers.get('content-type') ?? '').includes('event-stream')) {
        seenTexts.push(await res.clone().text().catch(() => ''));
      }
      seenTexts.push(JSON.stringify([...res.headers.entries()]));
      return res;
    },
    ...opts,
  });
}

interface Outcome {
  status: number;
  headers: Headers;
  code?: string | null;
  message?: string;
  requestID?: string | null;
}

/** One non-streaming chat call with the SDK, carrying the client's own x-request-id and traceparent. */
async function chat(client: OpenAI, id: string, o: { model?: string; headers?: Record<string, string>; signal?: AbortSignal } = {}): Promise<Outcome> {
  try {
    const { response, request_id } = await client.chat.completions
      .create({ model: o.model ?? 'gpt-4o', messages }, { headers: { 'x-request-id': id, traceparent: TRACEPARENT, ...o.headers }, signal: o.signal })
      .withResponse();
    return { status: response.status, headers: response.headers, requestID: request_id };
  } catch (err) {
    if (!(err instanceof OpenAI.APIError) || err.status === undefined) throw err;
    return { status: err.status, headers: err.headers!, code: err.code, message: err.message, requestID: err.requestID };
  }
}

/** The request's log line (reqId `id`), waited for: a line follows its answer by a tick or two. */
async function lineOf(logs: string[], id: string, withinMs = 3_000): Promise<Line> {
  const until = Date.now() + withinMs;
  for (;;) {
    const line = requestLines(logs).find((l) => l.reqId === id);
    if (line) return line;
    if (Date.now() > until) throw new Error(`no request log line for ${id}:\n${logs.join('')}`);
    await sleep(20);
  }
}

/** The one-per-request lines (they carry method and path), parsed. */
const requestLines = (logs: string[]): Line[] => logs.map((l) => JSON.parse(l) as Line).filter((l) => l.reqId !== undefined && l.method !== undefined);
const otherLines = (logs: string[]): Line[] => logs.map((l) => JSON.parse(l) as Line).filter((l) => l.reqId === undefined);

async function metrics(url: string): Promise<MetricSample[]> {
  const text = await (await fetch(`${url}/metrics`)).text();
  seenTexts.push(text);
  return parseMetrics(text);
}
const sumOf = (samples: MetricSample[], name: string, labels: Record<string, string> = {}) =>
  samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v)).reduce((a, s) => a + s.value, 0);

/** The provider's log of the client call `id` (the gateway forwards it as x-client-request-id). */
const upstreamOf = (mock: MockServer, id: string) => mock.requests().filter((r) => r.headers['x-client-request-id'] === id);

/** What the log line's attempts say, compactly: target and reason of each. */
const attemptTrail = (line: Line) => (line.attempts as Line[]).map((a) => `${a.target} ${a.reason}`);

/** The correlation every failed call must offer: the client's ids reach the provider, the provider's come back. */
function expectCorrelated(line: Line, out: Outcome, id: string, provider: MockServer[]): void {
  expect(out.headers.get('x-stormgate-request-id')).toBe(id);
  expect(line.reqId).toBe(id);
  expect(line.status).toBe(out.status);
  // A failed call's line carries the error code its client got (errorCode), so either finds the other.
  expect(line.errorCode ?? null).toBe(out.status >= 400 ? (out.code ?? null) : null);
  const sent = provider.flatMap((m) => upstreamOf(m, id));
  expect(sent.length, 'attempts in the line = requests the provider logged for this call').toBe(line.attempts.length);
  for (const r of sent) expect(r.headers.traceparent).toBe(TRACEPARENT);
  for (const r of sent) for (const s of SECRETS.filter((x) => x !== PROVIDER_KEY && x !== ANTHROPIC_KEY && x !== BACKUP_KEY)) expect(JSON.stringify(r.headers)).not.toContain(s);
  // Either id a developer quotes finds the line: the one the SDK shows is the provider's (passed on) or the gateway's.
  expect([line.upstreamRequestId, line.reqId]).toContain(out.requestID);
  if (line.upstreamRequestId !== undefined) expect(sent.map((r) => r.requestId)).toContain(line.upstreamRequestId);
}

describe('one request, reconstructed from its line, its headers and the provider log', () => {
  it('a 503 burst answered on the third attempt: every attempt, its reason and its backoff; x-retry-* and ids match the provider log', async () => {
    const primary = await startMock({ apiKey: PROVIDER_KEY, faults: { errors: [{ status: 503, times: 2 }] } });
    const { url, logs } = await gateway({ primary, route: { retry: { maxAttempts: 3, backoff: { strategy: 'equal-jitter', baseMs: 80, capMs: 400 } } }, provider: { breaker: false } });
    const id = newId('burst');
    const before = await metrics(url);
    const out = await chat(openai(url), id);
    expect(out.status).toBe(200);
    expect(out.headers.get('x-stormgate-attempts')).toBe('3');
    expect(out.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
    expect(out.headers.get('x-stormgate-route')).toBe('chat');
    expect(out.headers.get('x-stormgate-fallback')).toBeNull();

    const line = await lineOf(logs, id);
    expect(line.outcome).toBe('success');
    expect(line.status).toBe(200);
    expect(attemptTrail(line)).toEqual(['mock/gpt-4o status_503', 'mock/gpt-4o status_503', 'mock/gpt-4o ok']);
    expect(line.attempts.map((a: Line) => a.status)).toEqual([503, 503, 200]);
    // equal-jitter: the first retry waits exp/2 + random(0, exp/2) with exp = 80, the second with exp = 160.
    expect(line.attempts[0].waitMs).toBe(0);
    expect(line.attempts[1].waitMs).toBeGreaterThanOrEqual(38);
    expect(line.attempts[2].waitMs).toBeGreaterThanOrEqual(78);
    expect(line.backoffMs).toBe(line.attempts[1].waitMs + line.attempts[2].waitMs);
    expect(line.retriesStopped).toBeUndefined();
    expect(line.fallback).toBeUndefined();

    // The provider's own log says the same: three requests, the retries marked with their number and reason.
    const sent = upstreamOf(primary, id);
    expect(sent.map((r) => r.status)).toEqual([503, 503, 200]);
    expect(sent.map((r) => r.headers['x-retry-attempt'])).toEqual([undefined, '1', '2']);
    expect(sent.map((r) => r.headers['x-retry-reason'])).toEqual([undefined, 'status_503', 'status_503']);
    expect(sent[2]!.requestId).toBe(out.headers.get('x-request-id'));
    expect(out.requestID).toBe(sent[2]!.requestId);
    expect(line.upstreamRequestId).toBe(sent[2]!.requestId);
    expectCorrelated(line, out, id, [primary]);

    const after = await metrics(url);
    const d = (name: string, labels: Record<string, string>) => sumOf(after, name, labels) - sumOf(before, name, labels);
    expect(d('stormgate_upstream_attempts_total', { target: 'mock/gpt-4o', status_class: '5xx' })).toBe(2);
    expect(d('stormgate_upstream_attempts_total', { target: 'mock/gpt-4o', status_class: '2xx' })).toBe(1);
    expect(d('stormgate_retry_count_total', { route: 'chat', target: 'mock/gpt-4o', reason: 'status_503' })).toBe(2);
    expect(d('stormgate_retried_requests_total', { route: 'chat' })).toBe(1);
    expect(d('stormgate_requests_total', { route: 'chat', outcome: 'success' })).toBe(1);
  });

  it("a 429 with a short retry-after-ms is waited out (hint x U(1, 1.2)), and the hold-off it started gets its own line and count", async () => {
    const primary = await startMock({ apiKey: PROVIDER_KEY, faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after-ms': '400' } }] } });
    const { url, logs } = await gateway({ primary, provider: { breaker: false } });
    const id = newId('hint');
    const out = await chat(openai(url), id);
    expect(out.status).toBe(200);
    expect(out.headers.get('x-stormgate-attempts')).toBe('2');
    const line = await lineOf(logs, id);
    expect(attemptTrail(line)).toEqual(['mock/gpt-4o status_429', 'mock/gpt-4o ok']);
    const waited = (line.backoffMs ?? 0) + (line.parkedMs ?? 0);
    expect(waited).toBeGreaterThanOrEqual(395);
    expect(waited).toBeLessThan(480 + 1_500);
    expect(line.attempts[1].waitMs).toBeGreaterThanOrEqual(395);
    const sent = upstreamOf(primary, id);
    expect(sent[1]!.headers['x-retry-reason']).toBe('status_429');
    expect(sent[1]!.receivedAt - sent[0]!.receivedAt).toBeGreaterThanOrEqual(395);
    const hold = otherLines(logs).filter((l) => l.retryAfterMs !== undefined);
    expect(hold).toHaveLength(1);
    expect(hold[0]).toMatchObject({ target: 'mock/gpt-4o', status: 429, retryAfterMs: 400 });
    expect(Date.parse(hold[0]!.until)).toBeGreaterThan(hold[0]!.time);
    const m = await metrics(url);
    expect(sumOf(m, 'stormgate_holds_started_total', { target: 'mock/gpt-4o', kind: 'hold_off', reason: 'status_429' })).toBe(1);
    expect(sumOf(m, 'stormgate_retry_count_total', { reason: 'status_429' })).toBe(1);
  });

  it('a 429 whose retry-after is past maxWaitHintMs: retriesStopped wait_hint, then the hold-off turns the next call away with no attempt', async () => {
    const primary = await startMock({ apiKey: PROVIDER_KEY, faults: { errors: [{ status: 429, headers: { 'retry-after': '30' } }] } });
    const { url, logs } = await gateway({ primary, route: { park: false, retry: { maxWaitHintMs: 5_000 } } });
    const client = openai(url);
    const first = newId('hint-long');
    const a = await chat(client, first);
    expect(a.status).toBe(429);
    expect(a.code).toBe('rate_limit_exceeded');
    expect(a.headers.get('x-should-retry')).toBe('true');
    const ra = Number(a.headers.get('retry-after'));
    expect(ra).toBeGreaterThanOrEqual(30);
    expect(ra).toBeLessThanOrEqual(38);
    const la = await lineOf(logs, first);
    expect(la).toMatchObject({ status: 429, outcome: 'upstream_error', retriesStopped: 'wait_hint', target: 'mock/gpt-4o' });
    expect(attemptTrail(la)).toEqual(['mock/gpt-4o status_429']);
    expectCorrelated(la, a, first, [primary]);

    const second = newId('held');
    const b = await chat(client, second);
    expect(b.status).toBe(429);
    expect(b.code).toBe('provider_held_off');
    expect(b.headers.get('x-should-retry')).toBe('true');
    // The gateway's own error names its own request: the SDK's requestID finds the line.
    expect(b.requestID).toBe(second);
    expect(Number(b.headers.get('retry-after'))).toBeGreaterThanOrEqual(25);
    const lb = await lineOf(logs, second);
    expect(lb).toMatchObject({ status: 429, outcome: 'unavailable', errorCode: 'provider_held_off' });
    expect(lb.attempts).toEqual([]);
    expect(lb.skipped).toEqual([{ target: 'mock/gpt-4o', reason: expect.stringMatching(/held off/) }]);
    expect(upstreamOf(primary, second)).toHaveLength(0);
    const m = await metrics(url);
    const remaining = sumOf(m, 'stormgate_hold_remaining_seconds', { target: 'mock/gpt-4o', kind: 'hold_off' });
    expect(remaining).toBeGreaterThan(20);
    expect(remaining).toBeLessThanOrEqual(38);
    expect(sumOf(m, 'stormgate_upstream_attempts_total')).toBe(primary.requests().length);
  });

  it('connection resets on every attempt: 502 upstream_unavailable, each attempt a network failure with its code, retries_exhausted', async () => {
    const primary = await startMock({ apiKey: PROVIDER_KEY, faults: { resetRate: 1 } });
    const { url, logs } = await gateway({ primary, route: { park: false, retry: { maxAttempts: 3, backoff: { baseMs: 10, capMs: 20 } } }, provider: { breaker: false } });
    const id = newId('reset');
    const out = await chat(openai(url), id);
    expect(out.status).toBe(502);
    expect(out.code).toBe('upstream_unavailable');
    expect(out.headers.get('x-should-retry')).toBe('false');
    expect(out.headers.get('x-stormgate-attempts')).toBe('3');
    expect(out.message).toContain('3 attempts');
    const line = await lineOf(logs, id);
    expect(line).toMatchObject({ status: 502, outcome: 'gateway_error', retriesStopped: 'retries_exhausted' });
    expect(attemptTrail(line)).toEqual(Array(3).fill('mock/gpt-4o network'));
    for (const a of line.attempts) expect(typeof a.code).toBe('string');
    expect(out.message).toContain(line.attempts[2].code);
    expect(line.upstreamRequestId).toBeUndefined();
    expectCorrelated(line, out, id, [primary]);
    expect(upstreamOf(primary, id).map((r) => r.status)).toEqual(['reset', 'reset', 'reset']);
    const m = await metrics(url);
    expect(sumOf(m, 'stormgate_upstream_attempts_total', { target: 'mock/gpt-4o', status_class: 'network' })).toBe(3);
    expect(sumOf(m, 'stormgate_retry_count_total', { reason: 'network' })).toBe(2);
    expect(sumOf(m, 'stormgate_requests_total', { route: 'chat', outcome: 'gateway_error' })).toBe(1);
  });

  it('a first-token timeout fails over to the backup at once (fallback timeout), and the silent attempt is cut at the provider', async () => {
    const primary = await startMock({ apiKey: PROVIDER_KEY, faults: { stream: { firstTokenDelayMs: 5_000 } } });
    const backup = await startMock({ apiKey: BACKUP_KEY });
    const { url, logs } = await gateway({ primary, backup, provider: { breaker: false, timeouts: { firstTokenMs: 400 } } });
    const id = newId('ttft');
    const { data, response } = await openai(url)
      .chat.completions.create({ model: 'gpt-4o', messages, stream: true }, { headers: { 'x-request-id': id, traceparent: TRACEPARENT } })
      .withResponse();
    let text = '';
    for await (const chunk of data) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text.length).toBeGreaterThan(0);
    expect(response.headers.get('x-stormgate-target')).toBe('backup/gpt-4o');
    expect(response.headers.get('x-stormgate-fallback')).toBe('timeout');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    const line = await lineOf(logs, id);
    expect(attemptTrail(line)).toEqual(['mock/gpt-4o timeout_first_token', 'backup/gpt-4o ok']);
    expect(line).toMatchObject({ outcome: 'success', fallback: 'timeout', target: 'backup/gpt-4o', streamEnd: 'complete' });
    expect(line.attempts[0].durationMs).toBeGreaterThanOrEqual(390);
    expect(line.ttftMs).toBeGreaterThanOrEqual(390);
    expect(upstreamOf(primary, id)).toHaveLength(1);
    expect(upstreamOf(primary, id)[0]!.aborted).toBe(true);
    expect(line.upstreamRequestId).toBe(upstreamOf(backup, id)[0]!.requestId);
    expect(response.headers.get('x-request-id')).toBe(line.upstreamRequestId);
    const m = await metrics(url);
    expect(sumOf(m, 'stormgate_fallbacks_total', { from: 'mock/gpt-4o', to: 'backup/gpt-4o', reason: 'timeout' })).toBe(1);
    expect(sumOf(m, 'stormgate_fallbacks_total')).toBe(1);
    expect(sumOf(m, 'stormgate_upstream_attempts_total', { target: 'mock/gpt-4o', status_class: 'timeout' })).toBe(1);
    expect(sumOf(m, 'stormgate_retry_count_total')).toBe(0);
  });

  it('a stream cut mid-answer: the client got an error, the line says stream_error / cut with one attempt, and nothing was retried', async () => {
    const primary = await startMock({ apiKey: PROVIDER_KEY, faults: { stream: { chunks: 6, chunkDelayMs: 20, cutAfterChunks: 2 } } });
    const { url, logs } = await gateway({ primary, provider: { breaker: false } });
    const id = newId('cut');
    const { data, response } = await openai(url)
      .chat.completions.create({ model: 'gpt-4o', messages, stream: true }, { headers: { 'x-request-id': id, traceparent: TRACEPARENT } })
      .withResponse();
    let chunks = 0;
    const err = await (async () => {
      for await (const c of data) if (c.choices[0]?.delta?.content) chunks++;
    })().then(() => undefined, (e: unknown) => e);
    expect(err, 'the SDK raises the cut').toBeDefined();
    expect(chunks).toBe(2);
    expect(response.status).toBe(200);
    const line = await lineOf(logs, id);
    expect(line).toMatchObject({ status: 200, outcome: 'stream_error', streamEnd: 'cut' });
    expect(line.level).toBe(40);
    expect(attemptTrail(line)).toEqual(['mock/gpt-4o ok']);
    expect(line.upstreamRequestId).toBe(upstreamOf(primary, id)[0]!.requestId);
    expect(upstreamOf(primary, id)).toHaveLength(1);
    const m = await metrics(url);
    expect(sumOf(m, 'stormgate_stream_ends_total', { route: 'chat', end: 'cut' })).toBe(1);
    expect(sumOf(m, 'stormgate_requests_total', { route: 'chat', outcome: 'stream_error' })).toBe(1);
    expect(sumOf(m, 'stormgate_retry_count_total')).toBe(0);
  });
  it("the gateway's own early errors (no route, a bad timeout header, bad JSON) carry their errorCode and the client's id too", async () => {
    const primary = await startMock({ apiKey: PROVIDER_KEY });
    const { url, logs } = await gateway({ primary });
    const cases: Array<[string, RequestInit, number, string]> = [
      ['/v1/nowhere', { method: 'POST', body: '{}' }, 404, 'unknown_url'],
      [CHAT, { method: 'POST', body: JSON.stringify({ model: 'gpt-4o', messages }), headers: { 'x-stormgate-timeout-ms': 'soon' } }, 400, 'bad_request'],
      [CHAT, { method: 'POST', body: '{"model": ' }, 400, 'invalid_json'],
    ];
    for (const [path, init, status, code] of cases) {
      const id = newId('early');
      const res = await fetch(`${url}${path}`, { ...init, headers: { 'content-type': 'application/json', 'x-request-id': id, authorization: `Bearer ${CLIENT_KEY}`, ...(init.headers as Record<string, string>) } });
      const text = await res.text();
      seenTexts.push(text);
      expect(res.status).toBe(status);
      expect((JSON.parse(text) as { error: { code: string } }).error.code).toBe(code);
      expect(res.headers.get('x-request-id')).toBe(id);
      const line = await lineOf(logs, id);
      expect(line).toMatchObject({ status, errorCode: code });
    }
    expect(primary.requests()).toHaveLength(0);
  });
});

describe('why retries stopped, and where the time went', () => {
  it('the budget refuses the retry: the backup answers (fallback budget); alone on its route, the provider 503 goes back with retriesStopped budget', async () => {
    const primary = await startMock({ apiKey: PROVIDER_KEY, faults: { errors: [{ status: 503 }] } });
    const backup = await startMock({ apiKey: BACKUP_KEY });
    const noBudget = { budget: { ratio: 0, minRetriesPerSecond: 0 }, park: false as const };
    const { url, logs } = await gateway({ primary, backup, route: noBudget, soloRoute: noBudget, provider: { breaker: false } });
    const client = openai(url);
    const viaBackup = newId('budget-fb');
    const a = await chat(client, viaBackup);
    expect(a.status).toBe(200);
    expect(a.headers.get('x-stormgate-fallback')).toBe('budget');
    expect(a.headers.get('x-stormgate-target')).toBe('backup/gpt-4o');
    const la = await lineOf(logs, viaBackup);
    expect(attemptTrail(la)).toEqual(['mock/gpt-4o status_503', 'backup/gpt-4o ok']);
    expect(la.fallback).toBe('budget');
    expectCorrelated(la, a, viaBackup, [primary, backup]);

    const alone = newId('budget-solo');
    const b = await chat(client, alone, { model: 'solo' });
    expect(b.status).toBe(503);
    expect(b.headers.get('x-should-retry')).toBe('false');
    const lb = await lineOf(logs, alone);
    expect(lb).toMatchObject({ route: 'solo', status: 503, outcome: 'upstream_error', retriesStopped: 'budget' });
    expect(attemptTrail(lb)).toEqual(['mock/solo status_503']);
    expectCorrelated(lb, b, alone, [primary]);
    const m = await metrics(url);
    expect(sumOf(m, 'stormgate_retry_budget_exhausted_total', { route: 'chat', target: 'mock/gpt-4o' })).toBe(1);
    expect(sumOf(m, 'stormgate_retry_budget_exhausted_total', { route: 'solo' })).toBe(1);
    expect(sumOf(m, 'stormgate_fallbacks_total', { route: 'chat', from: 'mock/gpt-4o', to: 'backup/gpt-4o', reason: 'budget' })).toBe(1);
    expect(sumOf(m, 'stormgate_retry_count_total')).toBe(0);
  });

  it('the deadline: retries stop when the next backoff would leave less than minAttemptMs (retriesStopped deadline); a hung provider gets 504 deadline_exceeded', async () => {
    const primary = await startMock({ apiKey: PROVIDER_KEY, faults: { errors: [{ status: 503 }], models: { hung: { latencyMs: 30_000, errors: [] } } } });
    const { url, logs } = await gateway({ primary, route: { park: false, minAttemptMs: 300, retry: { maxAttempts: 10, backoff: { strategy: 'fixed', baseMs: 400 } } }, provider: { breaker: false } });
    const client = openai(url);
    const id = newId('deadline-stop');
    const out = await chat(client, id, { headers: { 'x-stormgate-timeout-ms': '1500' } });
    expect(out.status).toBe(503);
    expect(out.headers.get('x-should-retry')).toBe('false');
    const line = await lineOf(logs, id);
    expect(line).toMatchObject({ status: 503, retriesStopped: 'deadline', budgetMs: 1_250, deadlineSource: 'x-stormgate-timeout-ms' });
    expect(line.attempts.length).toBeGreaterThanOrEqual(2);
    expect(line.attempts.length).toBeLessThanOrEqual(3);
    // The stop was due: one more fixed 400 ms wait and minAttemptMs would not have fit in the 1250 ms budget.
    expect(line.durationMs + 400 + 300).toBeGreaterThan(1_250 - 50);
    expect(line.durationMs).toBeLessThan(1_250);
    expect(line.backoffMs).toBe((line.attempts as Line[]).reduce((s, a) => s + a.waitMs, 0));
    expectCorrelated(line, out, id, [primary]);

    const hung = newId('deadline-hung');
    const h = await chat(client, hung, { model: 'hung', headers: { 'x-stormgate-timeout-ms': '1200' } });
    expect(h.status).toBe(504);
    expect(h.code).toBe('deadline_exceeded');
    expect(h.headers.get('x-should-retry')).toBe('false');
    expect(h.requestID).toBe(hung);
    const lh = await lineOf(logs, hung);
    expect(lh).toMatchObject({ status: 504, outcome: 'deadline', budgetMs: 950, errorCode: 'deadline_exceeded' });
    expect(lh.attempts).toHaveLength(1);
    await sleep(100);
    expect(upstreamOf(primary, hung)[0]!.aborted).toBe(true);
    const m = await metrics(url);
    expect(sumOf(m, 'stormgate_upstream_attempts_total', { target: 'mock/hung', status_class: 'aborted' })).toBe(1);
    expect(sumOf(m, 'stormgate_requests_total', { route: 'chat', outcome: 'deadline' })).toBe(1);
  });

  it('a client that leaves during a hint wait or mid-attempt: clientGone, no status, no further attempt, the attempt aborted at the provider', async () => {
    const primary = await startMock({
      apiKey: PROVIDER_KEY,
      faults: { errors: [{ status: 429, headers: { 'retry-after-ms': '1500' } }], models: { slow: { latencyMs: 5_000, errors: [] } } },
    });
    const { url, logs } = await gateway({ primary, route: { retry: { maxWaitHintMs: 5_000 } }, provider: { breaker: false } });
    const client = openai(url);
    const waiting = newId('gone-wait');
    const inflight = newId('gone-flight');
    const leave = (ms: number) => AbortSignal.timeout(ms);
    await Promise.all([
      expect(chat(client, waiting, { signal: leave(300) })).rejects.toThrow(),
      expect(chat(client, inflight, { model: 'slow', signal: leave(300) })).rejects.toThrow(),
    ]);
    const lw = await lineOf(logs, waiting);
    expect(lw).toMatchObject({ clientGone: true, outcome: 'client_gone' });
    expect(lw.status).toBeUndefined();
    expect(attemptTrail(lw)).toEqual(['mock/gpt-4o status_429']);
    const waited = (lw.backoffMs ?? 0) + (lw.parkedMs ?? 0);
    expect(waited).toBeGreaterThan(100);
    expect(waited).toBeLessThan(1_400);
    const lf = await lineOf(logs, inflight);
    expect(lf).toMatchObject({ clientGone: true, outcome: 'client_gone' });
    expect(lf.attempts).toHaveLength(1);
    // Past the hint: no ghost attempt for either call.
    await sleep(1_700);
    expect(upstreamOf(primary, waiting)).toHaveLength(1);
    expect(upstreamOf(primary, inflight)).toHaveLength(1);
    expect(upstreamOf(primary, inflight)[0]!.aborted).toBe(true);
    const m = await metrics(url);
    expect(sumOf(m, 'stormgate_requests_total', { route: 'chat', outcome: 'client_gone' })).toBe(2);
    expect(sumOf(m, 'stormgate_upstream_attempts_total', { target: 'mock/slow', status_class: 'aborted' })).toBe(1);
    expect(sumOf(m, 'stormgate_retry_count_total')).toBe(0);
  });

  it('a full pool: the queued attempt names its slotWaitMs, outside its durationMs and backoffMs; stormgate_pool_wait_seconds counts every attempt', async () => {
    const primary = await startMock({ apiKey: PROVIDER_KEY, faults: { latencyMs: 300 } });
    const { url, logs } = await gateway({ primary, provider: { breaker: false, pools: { maxConcurrent: 1 } } });
    const client = openai(url);
    const ids = [newId('pool'), newId('pool'), newId('pool')];
    const outs = await Promise.all(ids.map((id) => chat(client, id)));
    expect(outs.map((o) => o.status)).toEqual([200, 200, 200]);
    const lines = await Promise.all(ids.map((id) => lineOf(logs, id)));
    const waits = lines.map((l) => l.attempts[0].slotWaitMs ?? 0).sort((a, b) => a - b);
    expect(waits[0]).toBeLessThan(100);
    expect(waits[1]).toBeGreaterThanOrEqual(200);
    expect(waits[2]).toBeGreaterThanOrEqual(450);
    for (const l of lines) {
      expect(l.attempts).toHaveLength(1);
      expect(l.backoffMs).toBeUndefined();
      expect(l.attempts[0].durationMs).toBeGreaterThanOrEqual(290);
      // The slot wait is not in the attempt's duration: with it, a queued attempt would take its wait plus 300 ms.
      if ((l.attempts[0].slotWaitMs ?? 0) >= 200) expect(l.attempts[0].durationMs).toBeLessThan(l.attempts[0].slotWaitMs + 250);
      expect(l.durationMs).toBeGreaterThanOrEqual((l.attempts[0].slotWaitMs ?? 0) + l.attempts[0].durationMs - 5);
    }
    const m = await metrics(url);
    expect(sumOf(m, 'stormgate_pool_wait_seconds_count', { provider: 'mock' })).toBe(3);
    expect(sumOf(m, 'stormgate_pool_wait_seconds_sum', { provider: 'mock' })).toBeGreaterThanOrEqual((waits[1]! + waits[2]!) / 1000 - 0.05);
  });
});

describe('breakers, parking and failover across API families', () => {
  it('a breaker opened by a 503 run: its own line (cause, reason), circuit_open with no attempt, and attempts in lines = the provider log', async () => {
    const primary = await startMock({ apiKey: PROVIDER_KEY, faults: { errors: [{ status: 503 }] } });
    const breaker = { consecutiveFailures: 3, openS: 30 };
    const { url, logs } = await gateway({ primary, route: { park: false, retry: { maxAttempts: 1 } }, provider: { breaker } });
    const client = openai(url);
    let open: Outcome | undefined;
    let openId = '';
    for (let i = 0; i < 20 && !open; i++) {
      const id = newId('trip');
      const o = await chat(client, id);
      if (o.code === 'circuit_open') [open, openId] = [o, id];
      else await sleep(120);
    }
    expect(open, 'the breaker opened').toBeDefined();
    expect(open!.status).toBe(503);
    expect(open!.requestID).toBe(openId);
    const ra = Number(open!.headers.get('retry-after'));
    expect(ra).toBeGreaterThanOrEqual(1);
    expect(ra).toBeLessThanOrEqual(34);
    const lo = await lineOf(logs, openId);
    expect(lo).toMatchObject({ status: 503, outcome: 'unavailable', errorCode: 'circuit_open' });
    expect(lo.attempts).toEqual([]);
    expect(lo.skipped).toEqual([{ target: 'mock/gpt-4o', reason: expect.stringMatching(/breaker open/) }]);
    expect(upstreamOf(primary, openId)).toHaveLength(0);
    const change = otherLines(logs).filter((l) => l.cause !== undefined && l.target === 'mock/gpt-4o');
    expect(change).toHaveLength(1);
    expect(change[0]).toMatchObject({ cause: 'consecutive_failures', reason: 'status_503' });
    const m = await metrics(url);
    expect(sumOf(m, 'stormgate_breaker_state', { target: 'mock/gpt-4o' })).toBe(1);
    expect(sumOf(m, 'stormgate_breaker_transitions_total', { target: 'mock/gpt-4o', to: 'open' })).toBe(1);
    // Every attempt in the lines went to the provider, and nothing else did.
    expect(requestLines(logs).reduce((s, l) => s + l.attempts.length, 0)).toBe(primary.requests().length);

  });

  it('failover to an anthropic-family backup: the OpenAI SDK sees the backup by header, and its request id is the Anthropic request-id', async () => {
    const primary = await startMock({ apiKey: PROVIDER_KEY, faults: { errors: [{ status: 503 }] } });
    const claude = await startMock({ apiKey: ANTHROPIC_KEY });
    const { url, logs } = await gateway({ primary, claude, route: { park: false, retry: { maxAttempts: 2, backoff: { baseMs: 10, capMs: 20 } } }, provider: { breaker: false } });
    const id = newId('claude');
    const out = await chat(openai(url), id);
    expect(out.status).toBe(200);
    expect(out.headers.get('x-stormgate-target')).toBe('claude/claude-sonnet-4-6');
    expect(out.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(out.headers.get('x-stormgate-attempts')).toBe('3');
    const sentClaude = upstreamOf(claude, id);
    expect(sentClaude).toHaveLength(1);
    expect(sentClaude[0]!.path).toBe('/v1/messages');
    expect(sentClaude[0]!.headers['x-api-key']).toBe(ANTHROPIC_KEY);
    expect(out.headers.get('x-request-id')).toBe(sentClaude[0]!.requestId);
    expect(out.requestID).toBe(sentClaude[0]!.requestId);
    const line = await lineOf(logs, id);
    expect(attemptTrail(line)).toEqual(['mock/gpt-4o status_503', 'mock/gpt-4o status_503', 'claude/claude-sonnet-4-6 ok']);
    expect(line).toMatchObject({ outcome: 'success', fallback: 'retries_exhausted', target: 'claude/claude-sonnet-4-6', upstreamRequestId: sentClaude[0]!.requestId });
    expectCorrelated(line, out, id, [primary, claude]);
    const m = await metrics(url);
    expect(sumOf(m, 'stormgate_fallbacks_total', { from: 'mock/gpt-4o', to: 'claude/claude-sonnet-4-6', reason: 'retries_exhausted' })).toBe(1);
    expect(sumOf(m, 'stormgate_fallback_requests_total', { route: 'chat' })).toBe(1);
    expect(sumOf(m, 'stormgate_retry_count_total', { target: 'mock/gpt-4o', reason: 'status_503' })).toBe(1);
    expect(sumOf(m, 'stormgate_upstream_attempts_total')).toBe(primary.requests().length + claude.requests().length);
  });

  it("the Anthropic SDK on /v1/messages: a 529 retried, then 529s passed on; err.requestID is the provider's request-id, which the line names", async () => {
    const primary = await startMock({ faults: { errors: [{ status: 529, times: 1 }] } });
    const { url, logs } = await gateway({ primary, messagesRoute: { park: false, retry: { maxAttempts: 2, backoff: { baseMs: 10, capMs: 20 } } } });
    const anthropic = new Anthropic({
      baseURL: url,
      apiKey: CLIENT_KEY,
      maxRetries: 0,
      fetch: async (u, init) => {
        const res = await fetch(u, init);
        seenTexts.push(await res.clone().text(), JSON.stringify([...res.headers.entries()]));
        return res;
      },
    });
    const body = { model: 'claude-sonnet-4-6', max_tokens: 64, messages };
    const ok = newId('msg-ok');
    const { response, request_id } = await anthropic.messages.create(body, { headers: { 'x-request-id': ok, traceparent: TRACEPARENT } }).withResponse();
    const sent = upstreamOf(primary, ok);
    expect(sent.map((r) => r.status)).toEqual([529, 200]);
    expect(request_id).toBe(sent[1]!.requestId);
    expect(response.headers.get('x-request-id')).toBe(sent[1]!.requestId);
    const lineOk = await lineOf(logs, ok);
    expect(attemptTrail(lineOk)).toEqual(['anthropic/claude-sonnet-4-6 status_529', 'anthropic/claude-sonnet-4-6 ok']);
    expect(lineOk.upstreamRequestId).toBe(sent[1]!.requestId);
    for (const r of sent) expect(r.headers['x-api-key']).toBe(ANTHROPIC_KEY);

    primary.setFaults({ errors: [{ status: 529 }] });
    const failed = newId('msg-529');
    const err = await anthropic.messages.create(body, { headers: { 'x-request-id': failed } }).then(
      () => undefined,
      (e: unknown) => e as InstanceType<typeof Anthropic.APIError>,
    );
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(err!.status).toBe(529);
    expect(err!.headers?.get('x-should-retry')).toBe('false');
    const lineFail = await lineOf(logs, failed);
    expect(lineFail).toMatchObject({ status: 529, retriesStopped: 'retries_exhausted', route: 'messages' });
    expect(lineFail.errorCode ?? null).toBe((err!.error as { error?: { code?: string | null } } | undefined)?.error?.code ?? null);
    const sentFail = upstreamOf(primary, failed);
    expect(sentFail).toHaveLength(2);
    expect(err!.requestID).toBe(sentFail[1]!.requestId);
    expect(lineFail.upstreamRequestId).toBe(sentFail[1]!.requestId);
  });

  it("the provider refuses the gateway's key (401) or echoes it in a 403: 502 upstream_auth_error, a credential hold with its line and count, no key anywhere", async () => {
    const primary = await startMock({ apiKey: PROVIDER_KEY });
    const echoing = await startMock({
      faults: { errors: [{ status: 403, code: 'forbidden', message: `Key ${PROVIDER_KEY} is not allowed on this project` }] },
    });
    const wrong = await gateway({ primary, primaryKey: WRONG_KEY, route: { park: false } });
    const echo = await gateway({ primary: echoing, route: { park: false } });
    const client = openai(wrong.url, { defaultHeaders: { 'x-api-key': CLIENT_X_API_KEY } });

    const first = newId('auth401');
    const a = await chat(client, first);
    expect(a.status).toBe(502);
    expect(a.code).toBe('upstream_auth_error');
    expect(a.headers.get('x-should-retry')).toBe('false');
    expect(a.headers.get('retry-after')).toBeNull();
    const la = await lineOf(wrong.logs, first);
    expect(la).toMatchObject({ status: 502, outcome: 'upstream_error', errorCode: 'upstream_auth_error' });
    expect(attemptTrail(la)).toEqual(['mock/gpt-4o status_401']);
    // The refused key's 401 has the provider's id in the line, though the client got the gateway's own error.
    expect(la.upstreamRequestId).toBe(upstreamOf(primary, first)[0]!.requestId);
    const hold = otherLines(wrong.logs).filter((l) => l.holdS !== undefined);
    expect(hold).toHaveLength(1);
    expect(hold[0]).toMatchObject({ level: 50, target: 'mock/gpt-4o', reason: 'status_401' });

    const second = newId('auth-held');
    const b = await chat(client, second);
    expect(b.status).toBe(502);
    expect(b.code).toBe('upstream_auth_error');
    const lb = await lineOf(wrong.logs, second);
    expect(lb.attempts).toEqual([]);
    expect(lb.skipped).toEqual([{ target: 'mock/gpt-4o', reason: expect.stringMatching(/held for \d+ s more: the provider refused/) }]);
    expect(upstreamOf(primary, second)).toHaveLength(0);
    const m = await metrics(wrong.url);
    expect(sumOf(m, 'stormgate_holds_started_total', { target: 'mock/gpt-4o', kind: 'credentials', reason: 'status_401' })).toBe(1);
    expect(sumOf(m, 'stormgate_credentials_held', { target: 'mock/gpt-4o' })).toBe(1);
    // The mock saw the gateway's key, never the client's (Authorization or x-api-key).
    for (const r of primary.requests()) {
      expect(r.headers.authorization).toBe(`Bearer ${WRONG_KEY}`);
      expect(r.headers['x-api-key']).toBeUndefined();
    }

    const echoed = newId('auth403');
    const c = await chat(openai(echo.url), echoed);
    expect(c.status).toBe(502);
    expect(c.code).toBe('upstream_auth_error');
    expect(c.message).not.toContain(PROVIDER_KEY);
    const lc = await lineOf(echo.logs, echoed);
    expect(attemptTrail(lc)).toEqual(['mock/gpt-4o status_403']);
    await metrics(echo.url);
    // (the afterEach sweep checks every body, header, line and scrape of this test for the keys)
  });

  it('config errors name the setting, never the key: a key with a line break or a zero-width space, an unknown field beside it, a proxy password', () => {
    const yaml = (provider: string) => `
providers:
  openai:
${provider}
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: openai } ]
`;
    const cases = [
      `    { family: openai, baseUrl: "http://127.0.0.1:9/v1", apiKey: "${PROVIDER_KEY}\\u200b" }`,
      `    { family: openai, baseUrl: "http://127.0.0.1:9/v1", apiKey: "${PROVIDER_KEY}\\nX-Injected: 1" }`,
      `    { family: openai, baseUrl: "http://127.0.0.1:9/v1", apiKey: "${PROVIDER_KEY}", apikey: "${PROVIDER_KEY}" }`,
      `    { family: openai, baseUrl: "http://127.0.0.1:9/v1", apiKey: "\${S25_KEY}", proxy: "http://user:${PROVIDER_KEY}@127.0.0.1:%zz" }`,
      `    { family: openai, baseUrl: "http://127.0.0.1:9/v1", apiKey: "\${S25_KEY}", timeouts: { connectMs: "\${S25_KEY}" } }`,
    ];
    for (const provider of cases) {
      let message = '';
      try {
        parseConfig(yaml(provider), 'gateway.yaml', { S25_KEY: PROVIDER_KEY });
      } catch (err) {
        message = (err as Error).message;
      }
      expect(message, `refused: ${provider.slice(0, 60)}`).not.toBe('');
      expect(message).toMatch(/gateway\.yaml/);
      expect(message, `leaks the key: ${message}`).not.toContain(PROVIDER_KEY);
      seenTexts.push(message);
    }
  });
});

describe('the surfaces agree, over a mixed burst and across a fleet', () => {
  it('over a burst of mixed faults: attempts, retries by reason, fallbacks and statuses agree between lines, the provider logs and /metrics', async () => {
    const primary = await startMock({
      apiKey: PROVIDER_KEY,
      faults: { resetRate: 0.1, errors: [{ status: 503, rate: 0.3 }, { status: 500, rate: 0.1 }, { status: 400, rate: 0.05, code: 'invalid_value', message: 'bad' }] },
    });
    const backup = await startMock({ apiKey: BACKUP_KEY, faults: { errors: [{ status: 503, rate: 0.2 }] } });
    const { url, logs } = await gateway({
      primary,
      backup,
      route: { park: false, budget: { ratio: 10, minRetriesPerSecond: 1000 }, retry: { maxAttempts: 2, backoff: { baseMs: 5, capMs: 10 } } },
      provider: { breaker: false },
    });
    const client = openai(url);
    const calls: Array<{ id: string; out: Outcome }> = [];
    const ids = Array.from({ length: 40 }, () => newId('mix'));
    for (let i = 0; i < ids.length; i += 8) {
      const batch = ids.slice(i, i + 8);
      calls.push(...(await Promise.all(batch.map(async (id) => ({ id, out: await chat(client, id) })))));
    }
    const lines = await Promise.all(calls.map((c) => lineOf(logs, c.id)));
    expect(requestLines(logs)).toHaveLength(calls.length);
    const m = await metrics(url);

    // Attempts: lines = the providers' logs = stormgate_upstream_attempts_total = x-stormgate-attempts.
    const attemptsInLines = lines.reduce((s, l) => s + l.attempts.length, 0);
    expect(attemptsInLines).toBe(primary.requests().length + backup.requests().length);
    expect(sumOf(m, 'stormgate_upstream_attempts_total')).toBe(attemptsInLines);
    for (const [i, c] of calls.entries()) {
      expect(lines[i]!.status, c.id).toBe(c.out.status);
      expect(Number(c.out.headers.get('x-stormgate-attempts')), c.id).toBe(lines[i]!.attempts.length);
      expect(c.out.headers.get('x-stormgate-target'), c.id).toBe(lines[i]!.target);
      expect(c.out.headers.get('x-stormgate-fallback'), c.id).toBe(lines[i]!.fallback ?? null);
      expect(upstreamOf(primary, c.id).length + upstreamOf(backup, c.id).length, c.id).toBe(lines[i]!.attempts.length);
      if (c.out.status >= 400) {
        expect(lines[i]!.outcome, c.id).not.toBe('success');
        // The error code the client got, in its line.
        expect(lines[i]!.errorCode ?? null, `${c.id}: ${JSON.stringify(lines[i])}`).toBe(c.out.code ?? null);
      }
    }

    // Retries: an attempt after the first on its target; its reason is what the attempt before it failed with.
    const retryReasons = new Map<string, number>();
    for (const l of lines) {
      const as = l.attempts as Line[];
      for (let k = 1; k < as.length; k++) {
        if (as[k]!.target !== as[k - 1]!.target) continue;
        const key = `${as[k]!.target} ${as[k - 1]!.reason}`;
        retryReasons.set(key, (retryReasons.get(key) ?? 0) + 1);
      }
    }
    const retryMetric = new Map<string, number>();
    for (const s of m.filter((x) => x.name === 'stormgate_retry_count_total' && x.value > 0)) retryMetric.set(`${s.labels.target} ${s.labels.reason}`, s.value);
    expect(Object.fromEntries(retryMetric)).toEqual(Object.fromEntries(retryReasons));
    const retriesAtProviders = [...primary.requests(), ...backup.requests()].filter((r) => r.headers['x-retry-attempt'] !== undefined).length;
    expect(retriesAtProviders).toBe([...retryReasons.values()].reduce((a, b) => a + b, 0));

    // Fallbacks: lines with one = stormgate_fallbacks_total, by reason.
    const fbLines = new Map<string, number>();
    for (const l of lines.filter((x) => x.fallback)) fbLines.set(l.fallback, (fbLines.get(l.fallback) ?? 0) + 1);
    const fbMetric = new Map<string, number>();
    for (const s of m.filter((x) => x.name === 'stormgate_fallbacks_total' && x.value > 0)) fbMetric.set(s.labels.reason!, (fbMetric.get(s.labels.reason!) ?? 0) + s.value);
    expect(Object.fromEntries(fbMetric)).toEqual(Object.fromEntries(fbLines));
    expect(sumOf(m, 'stormgate_fallback_requests_total')).toBe(lines.filter((l) => l.fallback && l.outcome === 'success').length);

    // Outcomes: each line once in stormgate_requests_total.
    const outcomes = new Map<string, number>();
    for (const l of lines) outcomes.set(l.outcome, (outcomes.get(l.outcome) ?? 0) + 1);
    for (const [outcome, n] of outcomes) expect(sumOf(m, 'stormgate_requests_total', { route: 'chat', outcome }), outcome).toBe(n);
    // The burst exercised what it meant to: retries, fallbacks and failures all happened.
    expect(retryReasons.size).toBeGreaterThan(0);
    expect(fbLines.size).toBeGreaterThan(0);
    expect(calls.some((c) => c.out.status >= 400)).toBe(true);
  });

  it('a two-instance fleet on Redis: the instance that served each call is known, a hold-off started on one turns the other away, counts sum once', async () => {
    const primary = await startMock({ apiKey: PROVIDER_KEY, faults: { errors: [{ status: 429, headers: { 'retry-after': '20' } }] } });
    const state = { redis: redis().url, keyPrefix: `s25-${randomUUID().slice(0, 8)}`, commandTimeoutMs: 1_000 };
    const topo: Topology = { primary, route: { park: false, retry: { maxWaitHintMs: 5_000 } }, state };
    const a = await gateway(topo);
    const b = await gateway(topo);
    const first = newId('fleet-a');
    const oa = await chat(openai(a.url), first);
    expect(oa.status).toBe(429);
    expect(oa.code).toBe('rate_limit_exceeded');
    const la = await lineOf(a.logs, first);
    expect(la.retriesStopped).toBe('wait_hint');
    // Which instance served it: its line is in A's log alone, and the provider saw A's via entry.
    expect(requestLines(b.logs).some((l) => l.reqId === first)).toBe(false);
    const viaA = upstreamOf(primary, first)[0]!.headers.via;
    expect(viaA).toMatch(/^1\.1 stormgate-[0-9a-f]{8}$/);

    // B hears of the hold-off through Redis and sends nothing.
    let ob: Outcome | undefined;
    let second = '';
    for (let i = 0; i < 20; i++) {
      second = newId('fleet-b');
      ob = await chat(openai(b.url), second);
      if (ob.code === 'provider_held_off') break;
      await sleep(100);
    }
    expect(ob!.code).toBe('provider_held_off');
    expect(ob!.headers.get('x-should-retry')).toBe('true');
    const lb = await lineOf(b.logs, second);
    expect(lb.attempts).toEqual([]);
    expect(lb.skipped).toEqual([{ target: 'mock/gpt-4o', reason: expect.stringMatching(/held off/) }]);
    expect(requestLines(a.logs).some((l) => l.reqId === second)).toBe(false);
    // The hold-off's start is logged where it started.
    expect(otherLines(a.logs).filter((l) => l.retryAfterMs !== undefined)).toHaveLength(1);
    expect(otherLines(b.logs).filter((l) => l.retryAfterMs !== undefined)).toHaveLength(0);

    const [ma, mb] = await Promise.all([metrics(a.url), metrics(b.url)]);
    const fleet = (name: string, labels: Record<string, string> = {}) => sumOf(ma, name, labels) + sumOf(mb, name, labels);
    expect(fleet('stormgate_holds_started_total', { target: 'mock/gpt-4o', kind: 'hold_off' })).toBe(1);
    expect(fleet('stormgate_upstream_attempts_total')).toBe(primary.requests().length);
    const attemptsInLines = [...requestLines(a.logs), ...requestLines(b.logs)].reduce((s, l) => s + l.attempts.length, 0);
    expect(attemptsInLines).toBe(primary.requests().length);
    // Both instances show the hold-off: B, which turned a request away for it but never sent an attempt to this learnt
    // target, has its series too (it had none until the hold gauges took in the targets a hold was heard of).
    const held = (ms: MetricSample[]) => sumOf(ms, 'stormgate_hold_remaining_seconds', { target: 'mock/gpt-4o', kind: 'hold_off' });
    expect(held(ma)).toBeGreaterThan(10);
    expect(held(mb)).toBeGreaterThan(10);
    // Each instance names itself upstream with one via entry; the provider's log tells the two apart.
    const vias = new Set(primary.requests().map((r) => r.headers.via));
    expect(vias.size).toBe(1);
    expect([...vias][0]).toBe(viaA);
  });
});
