// A twenty-fourth third-party suite, written from the README alone ("Deadlines and timeouts", "Retries" on backoff,
// wait hints and the one wait rule, "Retry budget, circuit breaker, hold-offs, parking", "What the client sees",
// "Errors", the configuration reference for timeoutMs, minAttemptMs, deadlineMarginMs and the provider timers) as a
// team whose agents run on latency budgets would test the gateway's handling of TIME before production: every form
// of a client's timeout (the route's timeoutMs, x-stormgate-timeout-ms, the JS SDKs' x-stainless-timeout per request
// and Anthropic's client-wide one, the Python SDK's x-stainless-read-timeout, a configured deadlineMarginMs), and how
// each meets backoff, wait hints, hold-offs, parking behind an open breaker, per-attempt timers (responseMs,
// firstTokenMs) and failover, on one gateway and on two sharing a real redis-server.
// The invariant behind every scenario: NO UPSTREAM ATTEMPT OUTLIVES ITS CLIENT. Each client call carries an
// x-request-id of its own, which the gateway sends upstream as x-client-request-id, so the mock's request log gives,
// per call, when each attempt arrived and ended; none may arrive after the client got its answer (or gave up), and
// none may still run then. Minutes are compressed into seconds by small timeouts; bounds are generous where a loaded
// 2-core machine decides them, and exact where counts decide them.
// Found: no attempt outlived its client anywhere it was tested (deadlines from each header, backoffs, hints, hold-offs
// across two instances, parking, pool queues, clients leaving mid-wait), and every wait left minAttemptMs. Two design
// questions, pinned here as the gateway behaves: a parked request whose own probes failed gets the provider's 503
// (x-should-retry: false, no retry-after) where one that never probed gets circuit_open with a retry-after; and a wait
// hint that fits the time left only before its x U(1, 1.2) spread was never waited in 18 draws (the hold-off it
// started, spread included, decides), which is safe by the one wait rule.
import { randomUUID } from 'node:crypto';
import { request as httpRequest } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import type { MockServer } from '../src/mock/server.ts';
import { expectOpenAIError, sdkError } from './helpers/openai-error.ts';
import { startRedis } from './helpers/redis-server.ts';
import { defaultConfig, scrapeMetrics, TEST_KEY, useExtraMocks, useGateways, type MetricSample } from './helpers/stack.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();

type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];
const CHAT = '/v1/chat/completions';
const messages = [{ role: 'user' as const, content: 'Summarise the incident in one line.' }];
/** How long after its client is answered an upstream attempt may still be seen ending (the mock's close event). */
const END_SLACK_MS = 300;

interface GatewayOpts {
  route?: Partial<RouteInput>;
  provider?: Partial<ProviderInput>;
  /** A second OpenAI-compatible provider, the chat route's second target. */
  backup?: MockServer;
  /** Adds an anthropic provider on the same mock and a /v1/messages route. */
  messagesRoute?: boolean;
  state?: ConfigInput['state'];
  logs?: string[];
}

/** A gateway whose chat route has the mock (and a backup, when given) as its targets. */
async function gateway(mock: MockServer, o: GatewayOpts = {}): Promise<string> {
  const base = defaultConfig(mock.url, { route: o.route, provider: o.provider });
  const chat = base.routes[0]!;
  const cfg: ConfigInput = { ...base, routes: [chat], state: o.state };
  if (o.backup) {
    cfg.providers = { ...cfg.providers, backup: { family: 'openai', baseUrl: `${o.backup.url}/v1`, apiKey: 'sk-s24-backup' } };
    cfg.routes = [{ ...chat, targets: [{ provider: 'mock' }, { provider: 'backup' }] }];
  }
  if (o.messagesRoute) {
    cfg.providers = { ...cfg.providers, claude: { family: 'anthropic', baseUrl: mock.url, apiKey: TEST_KEY, ...o.provider } };
    cfg.routes = [...cfg.routes, { name: 'messages', match: { path: '/v1/messages' }, targets: [{ provider: 'claude' }], ...o.route }];
  }
  return startGateway(ConfigSchema.parse(cfg), { logs: o.logs });
}

let seq = 0;
const newId = (what: string) => `s24-${what}-${seq++}-${randomUUID().slice(0, 8)}`;

/** The mock's requests for one client call (the gateway sends the call's x-request-id as x-client-request-id). */
const attemptsOf = (mock: MockServer, id: string) => mock.requests().filter((r) => r.headers['x-client-request-id'] === id);

/**
 * The suite's invariant: every upstream attempt of call `id` arrived before its client was done with it and had
 * ended by then (within the mock's close-event slack). Waits a moment first, so that an attempt the gateway would
 * still send (a ghost) has the chance to show.
 */
async function expectNoGhosts(mocks: MockServer[], id: string, clientDoneAt: number, waitMs = 400): Promise<void> {
  await sleep(waitMs);
  for (const mock of mocks) {
    for (const r of attemptsOf(mock, id)) {
      expect(r.receivedAt, `attempt ${r.id} of ${id} arrived after its client was done`).toBeLessThanOrEqual(clientDoneAt + 5);
      expect(r.endedAt, `attempt ${r.id} of ${id} still running`).toBeDefined();
      expect(r.endedAt!, `attempt ${r.id} of ${id} outlived its client by ${r.endedAt! - clientDoneAt} ms`).toBeLessThanOrEqual(clientDoneAt + END_SLACK_MS);
    }
  }
}

/** A raw chat completion (what curl or a Python SDK would send): status, headers, body, and when it was answered. */
async function rawChat(url: string, headers: Record<string, string>, body: object = { model: 'gpt-4o', messages }) {
  const t0 = Date.now();
  const res = await fetch(`${url}${CHAT}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
  const json = (await res.json().catch(() => undefined)) as Record<string, unknown> | undefined;
  const doneAt = Date.now();
  return { status: res.status, headers: res.headers, body: json, ms: doneAt - t0, doneAt };
}

/** The request log line whose reqId is `id` (a request's line follows its answer by a tick or two). */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- a log line is JSON: tests read whatever field they check
async function lineOf(logs: string[], id: string): Promise<Record<string, any>> {
  const until = Date.now() + 2_000;
  for (;;) {
    const line = logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.reqId === id && l.route !== undefined);
    if (line) return line;
    if (Date.now() > until) throw new Error(`no request log line for ${id}`);
    await sleep(20);
  }
}

/** The OpenAI error shape, exactly its four fields, with this code (the type is whatever the gateway's table says). */
function expectErrorShape(body: unknown, code: string): void {
  const e = (body as { error?: Record<string, unknown> } | undefined)?.error;
  expect(e, JSON.stringify(body)).toBeDefined();
  expect(Object.keys(e!).sort()).toEqual(['code', 'message', 'param', 'type']);
  expect(e!.code).toBe(code);
  expect(typeof e!.type).toBe('string');
  expect(typeof e!.message).toBe('string');
}

const sumOf = (samples: MetricSample[], name: string, labels: Record<string, string> = {}) =>
  samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v)).reduce((a, s) => a + s.value, 0);

/** An `openai` SDK client of a gateway that counts its HTTP requests (its own retries included). */
function sdk(url: string, opts: ConstructorParameters<typeof OpenAI>[0] = {}) {
  const counter = { requests: 0 };
  const client = new OpenAI({
    baseURL: `${url}/v1`,
    apiKey: 'sk-s24-client',
    fetch: async (u, init) => {
      counter.requests++;
      return fetch(u, init);
    },
    ...opts,
  });
  return { client, counter };
}

describe('every form of the client timeout sets the deadline (a hung provider)', () => {
  it('answers 504 deadline_exceeded at min(timeouts) minus the margin, for each header the SDKs send, and aborts the attempt', async () => {
    // latencyMs far beyond every deadline: the provider accepts and answers nothing in time.
    const mock = await startMock({ faults: { latencyMs: 30_000 } });
    const logs: string[] = [];
    const url = await gateway(mock, { route: { timeoutMs: 60_000 }, logs });

    // [headers, expected budget after the margin (max(250 ms, 5%), at most half of a client's timeout), source]
    const cases: Array<[Record<string, string>, number, string]> = [
      [{ 'x-stormgate-timeout-ms': '1200' }, 950, 'x-stormgate-timeout-ms'],
      // The Python SDK sends its read timeout as a float's str(): 2.0 seconds.
      [{ 'x-stainless-read-timeout': '2.0' }, 1_750, 'x-stainless-read-timeout'],
      // ... and a fractional one as it is (httpx.Timeout(read=1.5)): 1500 ms, less the margin.
      [{ 'x-stainless-read-timeout': '1.5' }, 1_250, 'x-stainless-read-timeout'],
      // `0` is read as 1 s.
      [{ 'x-stainless-timeout': '0' }, 750, 'x-stainless-timeout'],
      // The smallest wins, whichever header carries it.
      [{ 'x-stainless-timeout': '5', 'x-stormgate-timeout-ms': '1500' }, 1_250, 'x-stormgate-timeout-ms'],
      [{ 'x-stainless-timeout': '1', 'x-stormgate-timeout-ms': '9000' }, 750, 'x-stainless-timeout'],
    ];
    const results = await Promise.all(
      cases.map(async ([headers, budget, source]) => {
        const id = newId('source');
        const r = await rawChat(url, { ...headers, 'x-request-id': id });
        return { id, r, budget, source };
      }),
    );
    for (const { id, r, budget, source } of results) {
      expect(r.status, JSON.stringify(r.body)).toBe(504);
      expectErrorShape(r.body, 'deadline_exceeded');
      expect(r.headers.get('x-should-retry')).toBe('false');
      expect(r.headers.get('x-stormgate-request-id')).toBe(id);
      // Answered at its budget: not before (the gateway waited for the provider) and well before the client's own
      // timeout (the budget plus the margin).
      expect(r.ms).toBeGreaterThanOrEqual(budget - 50);
      expect(r.ms).toBeLessThan(budget + 250 + 1_000);
      const line = await lineOf(logs, id);
      expect(line.deadlineSource).toBe(source);
      expect(line.budgetMs).toBe(budget);
      expect(line.outcome).toBe('deadline');
      // One attempt each, aborted at the deadline.
      expect(attemptsOf(mock, id)).toHaveLength(1);
      await expectNoGhosts([mock], id, r.doneAt, 0);
      expect(attemptsOf(mock, id)[0]!.aborted).toBe(true);
    }
  });

  it("takes the route's timeoutMs when it is the smallest, and a configured deadlineMarginMs whole, or half a shorter client timeout", async () => {
    const mock = await startMock({ faults: { latencyMs: 30_000 } });
    const logs: string[] = [];
    const short = await gateway(mock, { route: { timeoutMs: 1_500 }, logs });
    const margined = await gateway(mock, { route: { timeoutMs: 60_000, deadlineMarginMs: 400 }, logs });
    const ids = { route: newId('route'), whole: newId('whole'), half: newId('half') };
    const [route, whole, half] = await Promise.all([
      rawChat(short, { 'x-stormgate-timeout-ms': '10000', 'x-request-id': ids.route }),
      rawChat(margined, { 'x-stormgate-timeout-ms': '3000', 'x-request-id': ids.whole }),
      rawChat(margined, { 'x-stormgate-timeout-ms': '600', 'x-request-id': ids.half }),
    ]);
    for (const r of [route, whole, half]) expect(r.status).toBe(504);
    // The route's own bound: never longer than timeoutMs.
    expect((await lineOf(logs, ids.route)).deadlineSource).toBe('route');
    expect(route.ms).toBeLessThan(1_500 + 500);
    expect((await lineOf(logs, ids.route)).budgetMs).toBeLessThanOrEqual(1_500);
    // 3000 - 400 kept back whole.
    expect((await lineOf(logs, ids.whole)).budgetMs).toBe(2_600);
    expect(whole.ms).toBeGreaterThanOrEqual(2_550);
    // 600: at most half of it kept back, so 300.
    expect((await lineOf(logs, ids.half)).budgetMs).toBe(300);
    expect(half.ms).toBeGreaterThanOrEqual(250);
    expect(half.ms).toBeLessThan(600 + 400);
    for (const [k, id] of Object.entries(ids)) await expectNoGhosts([mock], id, { route, whole, half }[k as keyof typeof ids].doneAt, 0);
  });

  it('refuses an x-stormgate-timeout-ms that is not a positive number of milliseconds with 400 bad_request, sending nothing upstream', async () => {
    const mock = await startMock();
    const url = await gateway(mock);
    for (const bad of ['abc', '0', '-5', 'Infinity', '10s']) {
      const r = await rawChat(url, { 'x-stormgate-timeout-ms': bad });
      expect(r.status, `x-stormgate-timeout-ms: ${bad}`).toBe(400);
      expectOpenAIError(r.body, 'bad_request');
      expect(r.headers.get('x-should-retry')).toBe('false');
    }
    expect(mock.stats().total).toBe(0);
  });
});

describe('the SDKs, with and without telling the gateway their timeout', () => {
  it("the Anthropic SDK's client-wide 1.5 s timeout (sent as x-stainless-timeout: 1) gets a 504 timeout_error it does not retry", async () => {
    const mock = await startMock({ faults: { latencyMs: 30_000 } });
    const logs: string[] = [];
    const url = await gateway(mock, { messagesRoute: true, logs });
    let sent = 0;
    const id = newId('anthropic');
    const client = new Anthropic({ baseURL: url, apiKey: 'sk-ant-s24-client', timeout: 1_500, fetch: async (u, init) => (sent++, fetch(u, init)) });
    const t0 = Date.now();
    const err = await client.messages
      .create({ model: 'claude-sonnet-4-6', max_tokens: 64, messages: [{ role: 'user', content: 'hi' }] }, { headers: { 'x-request-id': id } })
      .catch((e: unknown) => e);
    const doneAt = Date.now();
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(err).not.toBeInstanceOf(Anthropic.APIConnectionTimeoutError);
    const e = err as InstanceType<typeof Anthropic.APIError>;
    expect(e.status).toBe(504);
    // The gateway's own error on /v1/messages: readable by both SDKs.
    expect(e.error).toMatchObject({ type: 'error', error: { type: 'timeout_error', code: 'deadline_exceeded' } });
    expect(e.headers?.get('x-should-retry')).toBe('false');
    expect(sent).toBe(1);
    // 1 s (1500 ms in whole seconds) less the 250 ms margin.
    expect(doneAt - t0).toBeGreaterThanOrEqual(700);
    expect(doneAt - t0).toBeLessThan(1_500);
    const line = await lineOf(logs, id);
    expect(line).toMatchObject({ route: 'messages', deadlineSource: 'x-stainless-timeout', budgetMs: 750 });
    expect(attemptsOf(mock, id)).toHaveLength(1);
    expect(attemptsOf(mock, id)[0]!.path).toBe('/v1/messages');
    await expectNoGhosts([mock], id, doneAt);
  });

  it("the openai SDK's client-wide timeout, not sent: the SDK gives up itself and retries, and each upstream attempt ends with its client request", async () => {
    const mock = await startMock({ faults: { latencyMs: 30_000 } });
    const logs: string[] = [];
    const url = await gateway(mock, { logs });
    const id = newId('sdk-own');
    const { client, counter } = sdk(url, { timeout: 700, maxRetries: 1 });
    const err = await client.chat.completions.create({ model: 'gpt-4o', messages }, { headers: { 'x-request-id': id } }).catch((e: unknown) => e);
    const doneAt = Date.now();
    expect(err).toBeInstanceOf(OpenAI.APIConnectionTimeoutError);
    expect(counter.requests).toBe(2);
    // The gateway could not know (no timeout header): it sent each of the SDK's requests once, and dropped each
    // when its client left, never retrying for a client that is gone.
    const attempts = attemptsOf(mock, id);
    expect(attempts).toHaveLength(2);
    expect(attempts.map((a) => a.headers['x-stainless-retry-count'])).toEqual(['0', '1']);
    expect(attempts.every((a) => a.headers['x-retry-attempt'] === undefined)).toBe(true);
    // The first attempt ended when the SDK's first request timed out, before the second arrived.
    await expectNoGhosts([mock], id, doneAt);
    expect(attempts[0]!.endedAt!).toBeLessThanOrEqual(attempts[1]!.receivedAt + END_SLACK_MS);
    const lines = logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.reqId === id && l.route === 'chat');
    expect(lines.map((l) => l.outcome)).toEqual(['client_gone', 'client_gone']);
    expect(lines.every((l) => l.deadlineSource === 'route')).toBe(true);
  });

  it("the same, with the README's defaultHeaders: one 504 before the SDK's timeout, which the SDK does not retry, so one upstream attempt", async () => {
    const mock = await startMock({ faults: { latencyMs: 30_000 } });
    const url = await gateway(mock);
    const id = newId('sdk-told');
    const { client, counter } = sdk(url, { timeout: 1_000, maxRetries: 2, defaultHeaders: { 'x-stormgate-timeout-ms': '1000' } });
    const t0 = Date.now();
    const err = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages }, { headers: { 'x-request-id': id } }));
    const doneAt = Date.now();
    expect(err).not.toBeInstanceOf(OpenAI.APIConnectionTimeoutError);
    expect(err.status).toBe(504);
    expect(err.code).toBe('deadline_exceeded');
    expect(err.requestID).toBe(id);
    expect(counter.requests).toBe(1);
    expect(doneAt - t0).toBeLessThan(1_000);
    expect(attemptsOf(mock, id)).toHaveLength(1);
    await expectNoGhosts([mock], id, doneAt);
  });
});

describe('backoff and the one wait rule', () => {
  it('stops retrying when a backoff would leave less than minAttemptMs, and answers at once rather than at the deadline', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 503 }] } });
    const logs: string[] = [];
    // Five attempts allowed, 600 ms between them; the client gives 2 s (1750 ms after the margin).
    const url = await gateway(mock, { route: { park: false, retry: { maxAttempts: 5, backoff: { strategy: 'fixed', baseMs: 600 } } }, provider: { breaker: false }, logs });
    const id = newId('backoff');
    const r = await rawChat(url, { 'x-stormgate-timeout-ms': '2000', 'x-request-id': id });
    // 0 ms: 503; wait 600 (1150 left >= 1000); 600 ms: 503; a wait to 1200 would leave 550: answer now.
    const attempts = attemptsOf(mock, id);
    expect(attempts).toHaveLength(2);
    expect(attempts[1]!.headers['x-retry-attempt']).toBe('1');
    expect(attempts[1]!.headers['x-retry-reason']).toBe('status_503');
    expect(attempts[1]!.receivedAt - attempts[0]!.receivedAt).toBeGreaterThanOrEqual(590);
    expect(r.status).toBe(503);
    expect(r.headers.get('x-should-retry')).toBe('false');
    expect(r.headers.get('x-stormgate-attempts')).toBe('2');
    // Answered after the second attempt, not at the deadline.
    expect(r.ms).toBeLessThan(1_500);
    const line = await lineOf(logs, id);
    expect(line.attempts).toHaveLength(2);
    expect(line.backoffMs).toBeGreaterThanOrEqual(590);
    expect(line.backoffMs).toBeLessThan(1_000);
    await expectNoGhosts([mock], id, r.doneAt);
  });

  it('a client that leaves during a backoff cancels it: no attempt after it left, logged client_gone', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 503 }] } });
    const logs: string[] = [];
    const url = await gateway(mock, { route: { park: false, retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 1_500 } } }, provider: { breaker: false }, logs });
    const id = newId('leave');
    const { client } = sdk(url, { maxRetries: 0 });
    const ac = new AbortController();
    const p = client.chat.completions.create({ model: 'gpt-4o', messages }, { headers: { 'x-request-id': id }, signal: ac.signal }).catch((e: unknown) => e);
    await sleep(400);
    ac.abort();
    expect(await p).toBeInstanceOf(OpenAI.APIUserAbortError);
    const leftAt = Date.now();
    // Long enough for the 1.5 s backoff to have ended had it not been cancelled.
    await expectNoGhosts([mock], id, leftAt, 1_800);
    expect(attemptsOf(mock, id)).toHaveLength(1);
    const line = await lineOf(logs, id);
    expect(line.outcome).toBe('client_gone');
    expect(line.clientGone).toBe(true);
    expect(line.backoffMs).toBeLessThan(1_000);
  });

  it("moves on to the next target when the next backoff would not fit before the deadline (x-stormgate-fallback: deadline)", async () => {
    const mock = await startMock({ faults: { errors: [{ status: 503 }] } });
    const backup = await startMock();
    const url = await gateway(mock, { backup, route: { park: false, retry: { maxAttempts: 5, backoff: { strategy: 'fixed', baseMs: 800 } } }, provider: { breaker: false } });
    const id = newId('deadline-fallback');
    const r = await rawChat(url, { 'x-stormgate-timeout-ms': '2500', 'x-request-id': id });
    // 2250 ms budget: 0 ms 503, wait 800 (1450 left), 800 ms 503, a wait to 1600 would leave 650: the backup, now.
    expect(r.status).toBe(200);
    expect(r.headers.get('x-stormgate-fallback')).toBe('deadline');
    expect(r.headers.get('x-stormgate-target')).toBe('backup/gpt-4o');
    expect(attemptsOf(mock, id)).toHaveLength(2);
    expect(attemptsOf(backup, id)).toHaveLength(1);
    expect(r.ms).toBeLessThan(1_800);
    const fb = sumOf(await scrapeMetrics(url), 'stormgate_fallbacks_total', { route: 'chat', reason: 'deadline' });
    expect(fb).toBe(1);
    await expectNoGhosts([mock, backup], id, r.doneAt);
  });
});

describe('per-attempt timers inside the deadline', () => {
  it('responseMs on a hung primary: the backup answers after one responseMs (x-stormgate-fallback: timeout), the hung attempt aborted', async () => {
    const mock = await startMock({ faults: { hangRate: 1 } });
    const backup = await startMock();
    const url = await gateway(mock, { backup, provider: { timeouts: { responseMs: 400 } } });
    const id = newId('response-ms');
    const { client } = sdk(url, { maxRetries: 0 });
    const t0 = Date.now();
    const res = await client.chat.completions.create({ model: 'gpt-4o', messages }, { headers: { 'x-request-id': id }, timeout: 5_000 }).withResponse();
    const doneAt = Date.now();
    expect(res.data.choices[0]!.message.content).toBeTruthy();
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('timeout');
    expect(res.response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(doneAt - t0).toBeGreaterThanOrEqual(380);
    expect(doneAt - t0).toBeLessThan(2_500);
    // A silent target is not retried when another can answer.
    expect(attemptsOf(mock, id)).toHaveLength(1);
    expect(attemptsOf(backup, id)).toHaveLength(1);
    await expectNoGhosts([mock, backup], id, doneAt);
    expect(attemptsOf(mock, id)[0]!.aborted).toBe(true);
  });

  it('responseMs with no other target: retried only while an attempt fits, then 504 upstream_timeout before the deadline', async () => {
    const mock = await startMock({ faults: { hangRate: 1 } });
    const logs: string[] = [];
    const url = await gateway(mock, { route: { retry: { maxAttempts: 5, backoff: { baseMs: 50, capMs: 50 } } }, provider: { timeouts: { responseMs: 1_000 } }, logs });
    const id = newId('response-ms-alone');
    const r = await rawChat(url, { 'x-stormgate-timeout-ms': '3000', 'x-request-id': id });
    // 2750 ms budget: 0-1000 timeout; <= 50 wait; ~1050-2050 timeout; 700 left < minAttemptMs: answer.
    expect(r.status).toBe(504);
    expectErrorShape(r.body, 'upstream_timeout');
    expect(r.headers.get('x-should-retry')).toBe('false');
    expect(attemptsOf(mock, id)).toHaveLength(2);
    expect(attemptsOf(mock, id)[1]!.headers['x-retry-reason']).toBe('timeout_response');
    expect(r.ms).toBeGreaterThanOrEqual(1_950);
    expect(r.ms).toBeLessThan(2_750 + 500);
    expect((await lineOf(logs, id)).outcome).toBe('gateway_error');
    await expectNoGhosts([mock], id, r.doneAt);
  });

  it('a stream whose first token misses firstTokenMs, with no time for another attempt: 504 upstream_timeout, one attempt', async () => {
    const mock = await startMock({ faults: { stream: { firstTokenDelayMs: 5_000 } } });
    const url = await gateway(mock, { route: { retry: { maxAttempts: 3, backoff: { baseMs: 50, capMs: 50 } } }, provider: { timeouts: { firstTokenMs: 800 } } });
    const id = newId('first-token');
    const { client } = sdk(url, { maxRetries: 2 });
    const t0 = Date.now();
    const err = await sdkError(
      client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }, { headers: { 'x-request-id': id, 'x-stormgate-timeout-ms': '2000' } }),
    );
    const doneAt = Date.now();
    // 1750 ms budget: no first token by 800 ms; a retry then would leave under minAttemptMs.
    expect(err.status).toBe(504);
    expect(err.code).toBe('upstream_timeout');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(doneAt - t0).toBeGreaterThanOrEqual(750);
    expect(doneAt - t0).toBeLessThan(1_750 + 500);
    expect(attemptsOf(mock, id)).toHaveLength(1);
    await expectNoGhosts([mock], id, doneAt);
  });
});

describe('wait hints and hold-offs against the time left', () => {
  it('a hint within the time left is waited out (hint x U(1, 1.2)) and the retry answers', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after-ms': '400' } }] } });
    const url = await gateway(mock);
    const id = newId('short-hint');
    const r = await rawChat(url, { 'x-stormgate-timeout-ms': '5000', 'x-request-id': id });
    expect(r.status).toBe(200);
    const attempts = attemptsOf(mock, id);
    expect(attempts).toHaveLength(2);
    expect(attempts[1]!.headers['x-retry-reason']).toBe('status_429');
    const gap = attempts[1]!.receivedAt - attempts[0]!.endedAt!;
    expect(gap).toBeGreaterThanOrEqual(395);
    expect(gap).toBeLessThan(480 + 1_000);
    await expectNoGhosts([mock], id, r.doneAt);
  });

  it("a hint longer than the time left: no retry, the client is told the hold-off's end; newcomers by their own deadlines", async () => {
    const mock = await startMock({ faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '3' } }] } });
    const url = await gateway(mock);
    const first = newId('hint-first');
    const a = await rawChat(url, { 'x-stormgate-timeout-ms': '2000', 'x-request-id': first });
    expect(a.status).toBe(429);
    expect(a.ms).toBeLessThan(800);
    expect(attemptsOf(mock, first)).toHaveLength(1);
    // Sent upstream once, a hint within 60 s: invited back, at the hold-off's end (its hint plus a spread).
    expect(a.headers.get('x-should-retry')).toBe('true');
    expect(Number(a.headers.get('retry-after'))).toBeGreaterThanOrEqual(3);
    expect(Number(a.headers.get('retry-after-ms'))).toBeGreaterThanOrEqual(3_000);
    expect(Number(a.headers.get('retry-after-ms'))).toBeLessThanOrEqual(3_000 * 1.2 + 1_000);

    // A newcomer whose 1.5 s cannot outlast the hold-off: 429 provider_held_off at once, nothing sent.
    const short = newId('hint-short');
    const b = await rawChat(url, { 'x-stormgate-timeout-ms': '1500', 'x-request-id': short });
    expect(b.status).toBe(429);
    expectErrorShape(b.body, 'provider_held_off');
    expect(b.ms).toBeLessThan(500);
    expect(b.headers.get('x-should-retry')).toBe('true');
    expect(Number(b.headers.get('retry-after-ms'))).toBeGreaterThanOrEqual(1_500);
    expect(attemptsOf(mock, short)).toHaveLength(0);

    // A newcomer with 8 s parks through the rest of the hold-off and is answered after it, within its deadline.
    const long = newId('hint-long');
    const c = await rawChat(url, { 'x-stormgate-timeout-ms': '8000', 'x-request-id': long });
    expect(c.status).toBe(200);
    const held = attemptsOf(mock, long);
    expect(held).toHaveLength(1);
    expect(held[0]!.receivedAt - attemptsOf(mock, first)[0]!.endedAt!).toBeGreaterThanOrEqual(2_950);
    expect(c.ms).toBeLessThan(7_750);
    expect(mock.stats().total).toBe(2);
    for (const [id, r] of [[first, a], [short, b], [long, c]] as const) await expectNoGhosts([mock], id, r.doneAt, 0);
  });

  it('behind an open breaker, a parked request with too little time is answered at once; one with time is answered by the probe', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 503 }] } });
    const url = await gateway(mock, { route: { retry: { maxAttempts: 1 } }, provider: { breaker: { consecutiveFailures: 3 } } });
    // Three failures in a row, none good for 250 ms: the breaker opens.
    for (let i = 0; i < 3; i++) {
      expect((await rawChat(url, {})).status).toBe(503);
      await sleep(120);
    }
    const before = mock.stats().total;
    const openedAt = Date.now();
    expect(sumOf(await scrapeMetrics(url), 'stormgate_breaker_state')).toBe(1);

    // 1.5 s (1250 after the margin) cannot reach the first probe (1 s after the opening) with 1 s still to spare.
    const short = newId('parked-short');
    const s = await rawChat(url, { 'x-stormgate-timeout-ms': '1500', 'x-request-id': short });
    expect(s.status).toBe(503);
    expectErrorShape(s.body, 'circuit_open');
    expect(Number(s.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect(s.ms).toBeLessThan(600);
    expect(mock.stats().total).toBe(before);

    // The provider comes back; a request with 8 s parks, and the lot's probe (its own request) answers it.
    mock.setFaults({});
    const long = newId('parked-long');
    const l = await rawChat(url, { 'x-stormgate-timeout-ms': '8000', 'x-request-id': long });
    expect(l.status).toBe(200);
    expect(l.doneAt - openedAt).toBeLessThan(3_000);
    expect(mock.stats().total).toBe(before + 1);
    expect(attemptsOf(mock, long)).toHaveLength(1);
    await expectNoGhosts([mock], short, s.doneAt, 0);
    await expectNoGhosts([mock], long, l.doneAt, 0);
  });
});

describe('waits that must leave minAttemptMs (1000 ms) for the attempt after them', () => {
  it('a hint that fits only before its jitter: every retry starts with at least minAttemptMs left, else the 429 comes at once', async () => {
    // Six calls, each on a model of its own (a target, and a hold-off, each), each told to come back in 1000 ms
    // under a 2050 ms budget: the hint x U(1, 1.2) leaves 850 to 1050 ms, so most draws must not be waited.
    const models = Array.from({ length: 6 }, (_, i) => `gpt-4o-s24-${i}`);
    const mock = await startMock({
      faults: { models: Object.fromEntries(models.map((m) => [m, { errors: [{ status: 429, times: 1, headers: { 'retry-after-ms': '1000' } }] }])) },
    });
    const url = await gateway(mock);
    const calls = await Promise.all(
      models.map(async (model) => {
        const id = newId('jittered-hint');
        const t0 = Date.now();
        const r = await rawChat(url, { 'x-stormgate-timeout-ms': '2300', 'x-request-id': id }, { model, messages });
        return { id, t0, r };
      }),
    );
    const outcomes: string[] = [];
    for (const { id, t0, r } of calls) {
      const attempts = attemptsOf(mock, id);
      outcomes.push(`${r.status}/${attempts.length} in ${r.ms} ms`);
      if (attempts.length === 2) {
        expect(r.status).toBe(200);
        // The retry started with at least minAttemptMs before the 2050 ms budget ran out (less the test process's own
        // lag between t0 and the send, and the mock's in noting its arrival: 30 ms failed under load, at c8815f1 too).
        expect(t0 + 2_050 - attempts[1]!.receivedAt, `retry of ${id} started with too little time left`).toBeGreaterThanOrEqual(1_000 - 100);
      } else {
        expect(attempts).toHaveLength(1);
        expect(r.status).toBe(429);
        // Not waited: answered at once, told when to come back.
        expect(r.ms).toBeLessThan(700);
        expect(Number(r.headers.get('retry-after-ms'))).toBeGreaterThanOrEqual(800);
      }
      await expectNoGhosts([mock], id, r.doneAt, 0);
    }
    console.info(`jittered 1000 ms hint under a 2050 ms budget: ${outcomes.join(', ')}`);
  });

  it('a parked request carries the probes its deadline leaves room for (1 s and 3 s into the outage), then is answered at once', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 503 }] } });
    const logs: string[] = [];
    const url = await gateway(mock, { route: { retry: { maxAttempts: 1 } }, provider: { breaker: { consecutiveFailures: 3 } }, logs });
    for (let i = 0; i < 3; i++) {
      expect((await rawChat(url, {})).status).toBe(503);
      await sleep(120);
    }
    const openedAt = Date.now();
    // Budget 5035 ms (5300 less 5%): the probes at 1 s and 3 s each leave an attempt's time; the one at 7 s does not.
    // A failed probe costs its request none of its (one) attempts, so it parks again after each.
    const id = newId('parked-probes');
    const r = await rawChat(url, { 'x-stormgate-timeout-ms': '5300', 'x-request-id': id });
    const probes = attemptsOf(mock, id);
    expect(probes).toHaveLength(2);
    expect(probes[0]!.receivedAt - openedAt).toBeGreaterThanOrEqual(700);
    expect(probes[1]!.receivedAt - probes[0]!.receivedAt).toBeGreaterThanOrEqual(1_800);
    // Answered once no probe fits, not at the deadline; the final error names the target that failed last, a
    // parked request's failed probes included.
    expect(r.status).toBe(503);
    expect(r.headers.get('x-should-retry')).toBe('false');
    expect(r.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
    expect(r.doneAt - probes[1]!.endedAt!).toBeLessThan(500);
    expect(r.ms).toBeLessThan(5_035 - 1_000);
    const line = await lineOf(logs, id);
    expect(line.attempts.filter((x: { probe?: boolean }) => x.probe === true)).toHaveLength(2);
    expect(line.parkedMs).toBeGreaterThan(1_500);
    await expectNoGhosts([mock], id, r.doneAt);
  });
});

describe('clients that leave while the gateway holds their request (no attempt after they left)', () => {
  it('a request parked behind an open breaker whose client leaves is never sent, not even when the provider comes back', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 503 }] } });
    const url = await gateway(mock, { route: { retry: { maxAttempts: 1 } }, provider: { breaker: { consecutiveFailures: 3 } } });
    for (let i = 0; i < 3; i++) {
      expect((await rawChat(url, {})).status).toBe(503);
      await sleep(120);
    }
    const id = newId('parked-leaves');
    const ac = new AbortController();
    const p = fetch(`${url}${CHAT}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-request-id': id, 'x-stormgate-timeout-ms': '10000' },
      body: JSON.stringify({ model: 'gpt-4o', messages }),
      signal: ac.signal,
    }).catch((e: unknown) => e);
    await sleep(300);
    expect(sumOf(await scrapeMetrics(url), 'stormgate_parked_requests')).toBe(1);
    ac.abort();
    await p;
    const leftAt = Date.now();
    mock.setFaults({});
    await sleep(100);
    expect(sumOf(await scrapeMetrics(url), 'stormgate_parked_requests')).toBe(0);
    // The lot's first probe is due 1 s after the opening: long past, nothing of this call may have gone.
    await expectNoGhosts([mock], id, leftAt, 1_500);
    expect(attemptsOf(mock, id)).toHaveLength(0);
  });

  it('a request waiting for a pool slot whose client leaves sends nothing; one whose deadline no slot can meet is shed at once', async () => {
    const mock = await startMock({ faults: { latencyMs: 2_500 } });
    const url = await gateway(mock, { provider: { pools: { maxConcurrent: 1 } } });
    const holder = rawChat(url, { 'x-request-id': newId('slot-holder') });
    await sleep(200);
    // A queued request whose client leaves after 300 ms.
    const leaver = newId('slot-leaver');
    const ac = new AbortController();
    const p = fetch(`${url}${CHAT}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-request-id': leaver },
      body: JSON.stringify({ model: 'gpt-4o', messages }),
      signal: ac.signal,
    }).catch((e: unknown) => e);
    await sleep(300);
    ac.abort();
    await p;
    const leftAt = Date.now();
    // A newcomer whose 1.5 s cannot reach the slot (freed about 2.3 s from now).
    const short = newId('slot-short');
    const r = await rawChat(url, { 'x-stormgate-timeout-ms': '1500', 'x-request-id': short });
    expect(r.status).toBe(503);
    expect(r.ms).toBeLessThan(600);
    expectErrorShape(r.body, 'load_shed');
    expect(r.headers.get('x-should-retry')).toBe('true');
    expect(Number(r.headers.get('retry-after-ms'))).toBeGreaterThan(0);
    expect((await holder).status).toBe(200);
    await expectNoGhosts([mock], leaver, leftAt, 300);
    await expectNoGhosts([mock], short, r.doneAt, 0);
    expect(attemptsOf(mock, leaver)).toHaveLength(0);
    expect(attemptsOf(mock, short)).toHaveLength(0);
    expect(mock.stats().total).toBe(1);
  });
});

describe('a request body still arriving at the deadline', () => {
  it('is answered 504 deadline_exceeded at the deadline, nothing sent upstream, the connection closed', async () => {
    const mock = await startMock();
    const url = await gateway(mock);
    const { hostname, port } = new URL(url);
    const body = JSON.stringify({ model: 'gpt-4o', messages });
    const t0 = Date.now();
    const result = await new Promise<{ status: number; text: string; closedAt: number }>((resolve, reject) => {
      const req = httpRequest(
        { host: hostname, port, method: 'POST', path: CHAT, headers: { 'content-type': 'application/json', 'content-length': String(body.length), 'x-stormgate-timeout-ms': '1000' } },
        (res) => {
          let text = '';
          res.on('data', (c: Buffer) => (text += c.toString()));
          res.on('end', () => resolve({ status: res.statusCode!, text, closedAt: Date.now() }));
          res.on('error', reject);
        },
      );
      req.on('error', () => undefined);
      // Half the body, then nothing: a slow link.
      req.write(body.slice(0, 20));
    });
    expect(result.status).toBe(504);
    expectErrorShape(JSON.parse(result.text), 'deadline_exceeded');
    expect(result.closedAt - t0).toBeGreaterThanOrEqual(700);
    expect(result.closedAt - t0).toBeLessThan(2_000);
    expect(mock.stats().total).toBe(0);
  });
});

describe('two gateways on one Redis: a hold-off one instance learnt, obeyed by the other by its clients\' deadlines', () => {
  it('instance B answers a short-deadline newcomer at once and parks a long one until the fleet-wide hold-off ends', async () => {
    const redis = await startRedis();
    try {
      const mock = await startMock();
      const state = { redis: redis.url, keyPrefix: `s24-${randomUUID().slice(0, 8)}`, commandTimeoutMs: 1_000 };
      const a = await gateway(mock, { state });
      const b = await gateway(mock, { state });
      // Both instances have met the target while the provider was fine, so B follows it.
      expect((await rawChat(a, {})).status).toBe(200);
      expect((await rawChat(b, {})).status).toBe(200);
      mock.setFaults({ errors: [{ status: 429, times: 1, headers: { 'retry-after': '2' } }] });
      const startedAtA = newId('fleet-a');
      const hit = await rawChat(a, { 'x-stormgate-timeout-ms': '1500', 'x-request-id': startedAtA });
      expect(hit.status).toBe(429);
      expect(attemptsOf(mock, startedAtA)).toHaveLength(1);
      const hintAt = attemptsOf(mock, startedAtA)[0]!.endedAt!;
      await sleep(100);

      const short = newId('fleet-b-short');
      const s = await rawChat(b, { 'x-stormgate-timeout-ms': '1200', 'x-request-id': short });
      expect(s.status).toBe(429);
      expectErrorShape(s.body, 'provider_held_off');
      expect(s.ms).toBeLessThan(500);
      expect(s.headers.get('x-should-retry')).toBe('true');
      expect(attemptsOf(mock, short)).toHaveLength(0);
      expect(sumOf(await scrapeMetrics(b), 'stormgate_hold_remaining_seconds', { kind: 'hold_off' })).toBeGreaterThan(0.5);

      const long = newId('fleet-b-long');
      const l = await rawChat(b, { 'x-stormgate-timeout-ms': '6000', 'x-request-id': long });
      expect(l.status).toBe(200);
      expect(attemptsOf(mock, long)).toHaveLength(1);
      expect(attemptsOf(mock, long)[0]!.receivedAt - hintAt).toBeGreaterThanOrEqual(1_950);
      expect(l.ms).toBeLessThan(5_750);
      for (const [id, r] of [[startedAtA, hit], [short, s], [long, l]] as const) await expectNoGhosts([mock], id, r.doneAt, 0);
    } finally {
      await redis.stop();
    }
  });
});
