// The on-call view: incidents diagnosed from the gateway's log lines alone. Each test drives a gateway with the
// official `openai` SDK through one incident (a brownout, a 429 storm, a Redis outage, a hanging provider, clients
// leaving mid-stream, a refused key, nothing listening) and checks what an SRE relies on: one line per request and a
// bounded number of state-change lines (volume); the line says what happened, attempt by attempt, with the waits and
// the time parked, and a state change names its target and its cause (diagnosability); the line matches what the
// client saw and what the provider got (correctness); no key is written (secrecy); expected events are not `error`.
import { afterEach, describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import type { ConfigInput } from '../src/config/schema.ts';
import { startStack, TEST_KEY, type Stack } from './helpers/stack.ts';
import { startRedis, type RedisHandle } from './helpers/redis-server.ts';
import { freePort } from './helpers/free-port.ts';

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- a log line is JSON: tests read whatever field they check
type Line = Record<string, any>;

const CLIENT_KEY = 'sk-client-not-a-provider-key';
const WRONG_KEY = 'sk-misconfigured-key-4242';
const SECRETS = [TEST_KEY, CLIENT_KEY, WRONG_KEY];

let stack: Stack | undefined;
let redis: RedisHandle | undefined;
afterEach(async () => {
  await stack?.close();
  stack = undefined;
  await redis?.stop();
  redis = undefined;
});

/** One route on the mock, with a breaker that opens and probes quickly. */
function config(mockUrl: string, opts: { route?: Record<string, unknown>; provider?: Record<string, unknown>; top?: Record<string, unknown> } = {}): ConfigInput {
  return {
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    providers: { mock: { family: 'openai', baseUrl: `${mockUrl}/v1`, apiKey: TEST_KEY, breaker: { openS: 1, minRequests: 5 }, ...opts.provider } },
    routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }], timeoutMs: 4000, ...opts.route }],
    ...opts.top,
  } as ConfigInput;
}

/** What one SDK call saw: the gateway's request id and the status (undefined: no answer, or the client left). */
interface Call {
  reqId: string | null;
  status: number | undefined;
}

/**
 * `workers` SDK clients calling in a loop for `forMs`. A streaming call leaves (aborts) after `leaveAfterChunks`
 * chunks when that is set.
 */
async function drive(s: Stack, opts: { workers: number; forMs: number; stream?: boolean; leaveAfterChunks?: number }): Promise<Call[]> {
  const client = new OpenAI({ baseURL: s.baseURL, apiKey: CLIENT_KEY, maxRetries: 0, timeout: 20_000 });
  const calls: Call[] = [];
  const until = Date.now() + opts.forMs;
  const body = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'hi' }] };
  await Promise.all(
    Array.from({ length: opts.workers }, async () => {
      while (Date.now() < until) {
        try {
          if (opts.stream) {
            const ac = new AbortController();
            const { data, response } = await client.chat.completions.create({ ...body, stream: true }, { signal: ac.signal }).withResponse();
            const call: Call = { reqId: response.headers.get('x-stormgate-request-id'), status: response.status };
            calls.push(call);
            let chunks = 0;
            try {
              for await (const _ of data) if (++chunks === opts.leaveAfterChunks) ac.abort();
            } catch (err) {
              if (!(err instanceof OpenAI.APIUserAbortError)) throw err;
            }
          } else {
            const { response } = await client.chat.completions.create(body).withResponse();
            calls.push({ reqId: response.headers.get('x-stormgate-request-id'), status: response.status });
          }
        } catch (err) {
          if (!(err instanceof OpenAI.APIError)) throw err;
          calls.push({ reqId: err.headers?.get('x-stormgate-request-id') ?? null, status: err.status });
        }
        await new Promise((r) => setTimeout(r, 20));
      }
    }),
  );
  return calls;
}

const parsed = (s: Stack): Line[] => s.logs.map((l) => JSON.parse(l) as Line);
const requestLines = (lines: Line[]): Line[] => lines.filter((l) => typeof l.reqId === 'string' && 'outcome' in l);
/** Lines that are no request's: state changes, start-up. */
const otherLines = (lines: Line[]): Line[] => lines.filter((l) => !('outcome' in l) && !String(l.msg).startsWith('Server listening'));

/** Waits (up to 3 s) until every call's request line is written: a line follows its answer by a tick or two. */
async function linesOf(s: Stack, calls: Call[]): Promise<Line[]> {
  const until = Date.now() + 3_000;
  while (requestLines(parsed(s)).length < calls.length && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
  return parsed(s);
}

/**
 * What every incident must show: exactly one line per call, whose status is the one the client saw; the facts an SRE
 * reads off it; no key anywhere; nothing at error level but what `errorsAllowed` names; and every request's time
 * accounted for by its attempts, its backoffs and the time it spent parked (within `slackMs`).
 */
function checkCommon(lines: Line[], calls: Call[], opts: { errorsAllowed?: (l: Line) => boolean; slackMs?: number } = {}): Line[] {
  const text = lines.map((l) => JSON.stringify(l)).join('\n');
  for (const secret of SECRETS) expect(text, `log holds ${secret}`).not.toContain(secret);
  const reqs = requestLines(lines);
  expect(reqs.length).toBe(calls.length);
  const byId = new Map(reqs.map((l) => [l.reqId as string, l]));
  for (const call of calls) {
    const line = byId.get(call.reqId ?? '');
    expect(line, `no line for ${call.reqId}`).toBeDefined();
    if (call.status !== undefined) expect(line!.status).toBe(call.status);
  }
  for (const l of reqs) {
    expect(l).toMatchObject({ route: 'chat', method: 'POST', path: '/v1/chat/completions', deadlineSource: 'route' });
    expect(l.budgetMs).toBeGreaterThan(0);
    expect(Array.isArray(l.attempts)).toBe(true);
    for (const a of l.attempts as Line[]) expect(a).toMatchObject({ target: expect.any(String), reason: expect.any(String), waitMs: expect.any(Number), durationMs: expect.any(Number) });
    // A request that went nowhere says which target it was kept from, and why.
    if (l.outcome === 'unavailable' && l.attempts.length === 0) expect(l.skipped, JSON.stringify(l)).toEqual(expect.arrayContaining([expect.objectContaining({ target: 'mock/gpt-4o' })]));
    if (opts.slackMs !== undefined) {
      const accounted = (l.attempts as Line[]).reduce((sum, a) => sum + a.durationMs, 0) + (l.parkedMs ?? 0) + (l.backoffMs ?? 0);
      expect(l.durationMs - accounted, `time unaccounted for: ${JSON.stringify(l)}`).toBeLessThanOrEqual(opts.slackMs);
    }
  }
  for (const l of lines) if (l.level >= 50 && !opts.errorsAllowed?.(l)) throw new Error(`unexpected error-level line: ${JSON.stringify(l)}`);
  return reqs;
}

/** The mock got exactly the attempts the log lines name. */
function attemptsSent(reqs: Line[]): number {
  return reqs.reduce((n, l) => n + (l.attempts as Line[]).length, 0);
}

/** A breaker line names its target and why it moved. */
function checkBreakerLines(others: Line[]): Line[] {
  const breaker = others.filter((l) => String(l.msg).startsWith('breaker '));
  for (const l of breaker) {
    expect(l, JSON.stringify(l)).toMatchObject({ level: 40, target: 'mock/gpt-4o', from: expect.any(String), to: expect.any(String), cause: expect.any(String) });
    if (l.to === 'open' && l.from === 'closed') expect(l.reason, JSON.stringify(l)).toEqual(expect.any(String));
  }
  return breaker;
}

describe('incidents as the log tells them', () => {
  it('a provider brownout: one line per request, three breaker lines naming their cause, retried 503s at info', async () => {
    stack = await startStack({ config: (url) => config(url, { route: { timeoutMs: 8000 } }) });
    stack.mock.brownout('503', 1500);
    const calls = await drive(stack, { workers: 6, forMs: 3000 });
    const lines = await linesOf(stack, calls);
    const reqs = checkCommon(lines, calls, { slackMs: 500 });
    const others = otherLines(lines);
    const breaker = checkBreakerLines(others);
    expect(breaker.map((l) => l.msg)).toEqual(expect.arrayContaining(['breaker open', 'breaker closed']));
    expect(others.length).toBeLessThanOrEqual(8);
    const opened = breaker.find((l) => l.to === 'open')!;
    expect(opened).toMatchObject({ cause: expect.stringMatching(/consecutive_failures|failure_rate/), reason: 'status_503' });
    const retried = reqs.filter((l) => (l.attempts as Line[]).some((a) => a.reason === 'status_503'));
    expect(retried.length).toBeGreaterThan(0);
    for (const l of retried) expect(l.level).toBe(30);
    expect(attemptsSent(reqs)).toBe(stack.mock.stats().total);
  }, 30_000);

  it('a 429 storm with retry-after: one hold-off line for the target, not one per hold-off, held-off requests name the hold-off and the time parked', async () => {
    stack = await startStack({ config: (url) => config(url, { route: { timeoutMs: 2500 } }) });
    stack.mock.setFaults({ errors: [{ status: 429, headers: { 'retry-after': '1' } }] });
    const storm = drive(stack, { workers: 6, forMs: 3500 });
    await new Promise((r) => setTimeout(r, 2000));
    stack.mock.setFaults({});
    const calls = await storm;
    const lines = await linesOf(stack, calls);
    const reqs = checkCommon(lines, calls, { slackMs: 500 });
    const others = otherLines(lines);
    const holdOffs = others.filter((l) => l.msg === 'hold-off started: the provider asked for a pause');
    // A hold-off of about a second, started again after it is over while the storm lasts (2 s): one line at the first
    // start; the starts after it within HOLD_OFF_LOG_WINDOW_MS (10 s, longer than the run) are counted into one line at
    // the window's end, not written one per start.
    expect(holdOffs).toHaveLength(1);
    expect(others.filter((l) => l.msg === 'hold-off started again: the provider keeps asking for pauses')).toEqual([]);
    for (const l of holdOffs) expect(l).toMatchObject({ level: 40, target: 'mock/gpt-4o', status: 429, retryAfterMs: 1000, until: expect.any(String) });
    const rateLimited = reqs.filter((l) => (l.attempts as Line[]).some((a) => a.reason === 'status_429')).length;
    expect(rateLimited).toBeGreaterThan(holdOffs.length);
    expect(others.length).toBeLessThanOrEqual(holdOffs.length + 6);
    expect(reqs.filter((l) => l.outcome === 'unavailable').length).toBeGreaterThan(0);
    for (const l of reqs.filter((r) => r.outcome === 'unavailable' && r.attempts.length === 0)) expect(l.skipped).toEqual([{ target: 'mock/gpt-4o', reason: expect.stringContaining('held off') }]);
    expect(attemptsSent(reqs)).toBe(stack.mock.stats().total);
  }, 30_000);

  it('a Redis outage with traffic flowing: one degraded line and one recovered line, nothing per request', async () => {
    redis = await startRedis();
    const url = redis.url;
    stack = await startStack({ config: (mockUrl) => config(mockUrl, { top: { state: { redis: url } } }) });
    const r = redis;
    const calls = await Promise.all([
      drive(stack, { workers: 6, forMs: 5000 }),
      (async () => {
        await new Promise((res) => setTimeout(res, 1000));
        await r.stop();
        await new Promise((res) => setTimeout(res, 2000));
        await r.restart();
      })(),
    ]).then(([c]) => c);
    const until = Date.now() + 10_000;
    while (!parsed(stack).some((l) => String(l.msg).startsWith('state store recovered')) && Date.now() < until) await new Promise((res) => setTimeout(res, 50));
    const lines = await linesOf(stack, calls);
    const reqs = checkCommon(lines, calls, { slackMs: 500 });
    for (const l of reqs) expect(l).toMatchObject({ status: 200, outcome: 'success' });
    const others = otherLines(lines);
    expect(others.filter((l) => String(l.msg).startsWith('state store degraded'))).toEqual([expect.objectContaining({ level: 40, error: expect.objectContaining({ message: expect.any(String) }) })]);
    expect(others.filter((l) => String(l.msg).startsWith('state store recovered'))).toEqual([expect.objectContaining({ level: 30 })]);
    expect(others.length).toBeLessThanOrEqual(4);
  }, 40_000);

  it('a hanging provider: timeouts at info with their phase, the breaker lines, requests turned away name the open breaker', async () => {
    stack = await startStack({ config: (url) => config(url, { route: { timeoutMs: 1500 }, provider: { timeouts: { responseMs: 500 } } }) });
    stack.mock.brownout('hang', 2000);
    const calls = await drive(stack, { workers: 6, forMs: 3500 });
    const lines = await linesOf(stack, calls);
    const reqs = checkCommon(lines, calls, { slackMs: 500 });
    const timedOut = reqs.filter((l) => (l.attempts as Line[]).some((a) => a.reason === 'timeout_response'));
    expect(timedOut.length).toBeGreaterThan(0);
    for (const l of timedOut) expect(l.level).toBe(30);
    expect(reqs.filter((l) => l.status === 504).every((l) => l.outcome === 'gateway_error')).toBe(true);
    expect(reqs.filter((l) => l.outcome === 'unavailable').length).toBeGreaterThan(0);
    for (const l of reqs.filter((r) => r.outcome === 'unavailable' && r.attempts.length === 0)) expect(l.skipped).toEqual([{ target: 'mock/gpt-4o', reason: 'circuit breaker open' }]);
    const others = otherLines(lines);
    const breaker = checkBreakerLines(others);
    expect(breaker.find((l) => l.to === 'open')).toMatchObject({ reason: 'timeout_response' });
    expect(others.length).toBeLessThanOrEqual(8);
    // The mock counts a hung request once the gateway gives up on it: each is one timed-out attempt.
    expect(timedOut.reduce((n, l) => n + (l.attempts as Line[]).filter((a) => a.reason === 'timeout_response').length, 0)).toBe(stack.mock.stats().byStatus.hang);
  }, 30_000);

  it('clients leaving mid-stream in bulk: one client_gone line each at info, as many as the mock saw leave', async () => {
    stack = await startStack({ config: (url) => config(url), faults: { stream: { chunks: 20, chunkDelayMs: 30 } } });
    const calls = await drive(stack, { workers: 16, forMs: 1500, stream: true, leaveAfterChunks: 2 });
    const lines = await linesOf(stack, calls);
    const reqs = checkCommon(lines, calls);
    for (const l of reqs) expect(l).toMatchObject({ level: 30, status: 200, clientGone: true, outcome: 'client_gone', streamEnd: 'client-gone', upstreamRequestId: expect.stringMatching(/^req_/) });
    expect(otherLines(lines)).toEqual([]);
    const until = Date.now() + 3_000;
    while (stack.mock.stats().aborted < reqs.length && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
    expect(stack.mock.stats().aborted).toBe(reqs.length);
  }, 30_000);

  it('a refused key: one error line for the credential hold naming target and status, the 401 line with the provider\'s request id', async () => {
    stack = await startStack({ config: (url) => config(url, { provider: { apiKey: WRONG_KEY } }) });
    const calls = await drive(stack, { workers: 4, forMs: 1500 });
    const lines = await linesOf(stack, calls);
    const isHold = (l: Line) => l.msg === 'credentials refused: target held';
    const reqs = checkCommon(lines, calls, { errorsAllowed: isHold });
    const others = otherLines(lines);
    const holds = others.filter(isHold);
    expect(holds).toEqual([expect.objectContaining({ level: 50, target: 'mock/gpt-4o', status: 401, holdS: 60, until: expect.any(String) })]);
    expect(others.length).toBe(1);
    const refused = reqs.filter((l) => (l.attempts as Line[]).some((a) => a.reason === 'status_401'));
    expect(refused.length).toBe(stack.mock.stats().byStatus['401']);
    for (const l of refused) expect(l).toMatchObject({ level: 30, status: 502, upstreamRequestId: expect.stringMatching(/^req_/) });
    for (const l of reqs.filter((r) => r.attempts.length === 0)) {
      expect(l).toMatchObject({ status: 502, outcome: 'unavailable', skipped: [{ target: 'mock/gpt-4o', reason: expect.stringContaining('refused the gateway\'s credentials') }] });
    }
  }, 30_000);

  it('nothing listening: ECONNREFUSED on every attempt, the breaker line names it, the time parked is in the line', async () => {
    const port = await freePort();
    stack = await startStack({ config: (url) => config(url, { provider: { baseUrl: `http://127.0.0.1:${port}/v1` }, route: { timeoutMs: 2500 } }) });
    const calls = await drive(stack, { workers: 6, forMs: 2500 });
    const lines = await linesOf(stack, calls);
    const reqs = checkCommon(lines, calls, { slackMs: 500 });
    for (const l of reqs) {
      expect(l.level).toBe(30);
      expect([502, 503]).toContain(l.status);
      for (const a of l.attempts as Line[]) expect(a).toMatchObject({ reason: 'network', code: 'ECONNREFUSED' });
    }
    const others = otherLines(lines);
    const breaker = checkBreakerLines(others);
    expect(breaker.find((l) => l.to === 'open')).toMatchObject({ reason: 'network', code: 'ECONNREFUSED' });
    expect(others.length).toBeLessThanOrEqual(10);
  }, 30_000);
});
