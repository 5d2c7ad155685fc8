// A fifteenth third-party failure-scenario suite, written from the README alone ("Anthropic clients (/v1/messages)",
// "Retries", "Retry budget, circuit breaker, hold-offs, parking", "Deadlines and timeouts", "Streaming", "What the
// client sees", "Errors", config/examples/anthropic-agents.yaml) as a team running Claude agents through the gateway
// would test it before putting it in front of them: the official `@anthropic-ai/sdk` as the client, at its DEFAULT
// maxRetries (2) wherever retries multiplying is the point; Claude Code-like traffic (long streaming tool-use turns,
// thinking blocks whose signatures go back in the next turn, prompt-caching `cache_control` and `anthropic-beta`
// flags, count_tokens beside message creation); a primary Anthropic account and a backup account. Black box over real
// HTTP: two providers of the test's own play Anthropic's wire format and its failures (529 overloaded_error as a
// status and as an `error` event inside a 200 stream, 429 with `retry-after` and `anthropic-ratelimit-*` headers, 413,
// 400, 401/403/402, 500, cut streams, pings), and what is asserted is what the SDK sees (its error classes, `status`,
// `type`, `error.error`, `requestID`, `_request_id`) and what each account received. Bounds are generous: the suite
// runs on a loaded 2-core machine.
// Found here: the agents a hold-off turned away (and the one whose 429 started it) were all told the same
// retry-after-ms, to its last millisecond; the SDK waits exactly that, so they all came back at once.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import Anthropic from '@anthropic-ai/sdk';
import { describe, expect, it } from 'vitest';
import { ConfigError, parseConfig } from '../src/config/load.ts';
import type { ConfigInput } from '../src/config/schema.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { scripted, type Script, type Seen } from './helpers/scripted-provider.ts';
import { metricSum, requestLine, TEST_KEY, useGateways, useStacks, type Stack } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();
const startGateway = useGateways();

type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];
type ApiError = InstanceType<typeof Anthropic.APIError>;
type Answer = (body: Record<string, unknown>, n: number, url: string) => Script;

const MODEL = 'claude-sonnet-4-6';
const BACKUP_KEY = 'backup-key';

// ---------------------------------------------------------------------------------------------------------------
// Anthropic's wire format: events framed as Anthropic sends them, whole messages, and its error bodies.

const ev = (type: string, fields: object = {}) => `event: ${type}\ndata: ${JSON.stringify({ type, ...fields })}\n\n`;
const usage = { input_tokens: 40, output_tokens: 12, cache_creation_input_tokens: 0, cache_read_input_tokens: 3000 };
const message = (text = 'Shipped.', id = 'msg_01') => ({ id, type: 'message', role: 'assistant', model: MODEL, content: [{ type: 'text', text }], stop_reason: 'end_turn', stop_sequence: null, usage });
const start = () => ev('message_start', { message: { ...message(), content: [], stop_reason: null, usage: { ...usage, output_tokens: 1 } } });
const ping = ev('ping');
const textOpen = (index = 0) => ev('content_block_start', { index, content_block: { type: 'text', text: '' } });
const textDelta = (text: string, index = 0) => ev('content_block_delta', { index, delta: { type: 'text_delta', text } });
const thinkingOpen = (index = 0) => ev('content_block_start', { index, content_block: { type: 'thinking', thinking: '', signature: '' } });
const thinkingDelta = (thinking: string, index = 0) => ev('content_block_delta', { index, delta: { type: 'thinking_delta', thinking } });
const signatureDelta = (signature: string, index = 0) => ev('content_block_delta', { index, delta: { type: 'signature_delta', signature } });
const toolOpen = (index: number, id = 'toolu_01', name = 'edit_file') => ev('content_block_start', { index, content_block: { type: 'tool_use', id, name, input: {} } });
const inputJson = (partial: string, index: number) => ev('content_block_delta', { index, delta: { type: 'input_json_delta', partial_json: partial } });
const blockStop = (index = 0) => ev('content_block_stop', { index });
const finish = (reason = 'end_turn') => ev('message_delta', { delta: { stop_reason: reason, stop_sequence: null }, usage: { output_tokens: 12 } });
const stop = ev('message_stop');
const errorEvent = (type: string, text: string) => ev('error', { error: { type, message: text } });
const SSE = { 'content-type': 'text/event-stream', 'request-id': 'req_stream_01' };

/** A whole text stream, as one script. */
const textStream = (text = 'Shipped.'): Script => ({ headers: SSE, steps: [start(), textOpen(), textDelta(text), blockStop(), finish(), stop] });
const json = (status: number, body: unknown, headers: Record<string, string> = {}): Script => ({ status, headers: { 'content-type': 'application/json', ...headers }, steps: [JSON.stringify(body)] });
const errorBody = (type: string, text: string) => ({ type: 'error', error: { type, message: text } });
/** A healthy account: whole messages, streams, token counts. */
const healthy =
  (text = 'Shipped.'): Answer =>
  (body, _n, url) =>
    url.includes('count_tokens') ? json(200, { input_tokens: 3042 }) : body.stream === true ? textStream(text) : json(200, message(text), { 'request-id': 'req_whole_01' });
const overloaded = (headers: Record<string, string> = {}) => json(529, errorBody('overloaded_error', 'Overloaded'), { 'request-id': 'req_529', ...headers });

// ---------------------------------------------------------------------------------------------------------------
// Setting up: the two accounts, a gateway in front of them as the README's example routes them, and agents.

interface Account {
  origin: string;
  seen: Seen[];
  /** Each request: when it arrived, its path, and when its connection closed. */
  times: Array<{ at: number; url: string; closedAt?: number }>;
  /** Requests received, on `/v1/messages` unless another path is given. */
  hits(path?: string): number;
}

/** An account that reads each request and never answers it (a long whole answer still being written). */
const HANG: Answer = () => ({ steps: [] });

async function account(answer: Answer): Promise<Account> {
  const seen: Seen[] = [];
  const times: Account['times'] = [];
  const play = scripted((body, n) => answer(body, n, seen.at(-1)?.url ?? ''), seen);
  const p = await startProvider((req: IncomingMessage, res: ServerResponse) => {
    const t: Account['times'][number] = { at: Date.now(), url: req.url ?? '' };
    times.push(t);
    res.on('close', () => (t.closedAt = Date.now()));
    if (answer === HANG) {
      req.on('data', () => {});
      req.on('end', () => seen.push({ body: {}, headers: req.headers, url: req.url ?? '', at: Date.now() }));
      return;
    }
    play(req, res);
  });
  return { origin: p.origin, seen, times, hits: (path = '/v1/messages') => times.filter((t) => t.url === path).length };
}

interface GwOptions {
  route?: Partial<RouteInput>;
  primary?: Partial<ProviderInput>;
  backupProvider?: Partial<ProviderInput>;
  countRoute?: Partial<RouteInput>;
}

/** The primary account `claude` and, when given, the backup account `claude-backup` behind /v1/messages and count_tokens. */
async function gateway(primary: Account, backup?: Account, opts: GwOptions = {}): Promise<Stack> {
  const timeouts = { connectMs: 2_000, firstTokenMs: 10_000, idleMs: 10_000 };
  return startStack({
    config: () => ({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: {
        claude: { family: 'anthropic', baseUrl: primary.origin, apiKey: TEST_KEY, breaker: false, maxConnections: 64, timeouts, ...opts.primary },
        ...(backup && { 'claude-backup': { family: 'anthropic' as const, baseUrl: backup.origin, apiKey: BACKUP_KEY, breaker: false, maxConnections: 64, timeouts, ...opts.backupProvider } }),
      },
      routes: [
        {
          name: 'agents',
          match: { path: '/v1/messages', models: ['claude-*'] },
          targets: [{ provider: 'claude' }, ...(backup ? [{ provider: 'claude-backup' }] : [])],
          timeoutMs: 20_000,
          budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 },
          retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 10, capMs: 10 }, maxWaitHintMs: 5_000 },
          ...opts.route,
        },
        { name: 'count', match: { path: '/v1/messages/count_tokens' }, targets: [{ provider: 'claude' }], timeoutMs: 10_000, retry: { maxAttempts: 2, maxWaitHintMs: 5_000 }, ...opts.countRoute },
      ],
    }),
  });
}

/** What each of the SDK's HTTP requests got back, its own retries included. */
interface Wire {
  status: number;
  shouldRetry: string | null;
}

/** An agent: the official SDK at its defaults (maxRetries 2, its 10-minute timeout) unless told, recording its HTTP requests. */
function agent(s: Stack, opts: { maxRetries?: number; timeout?: number } = {}): { client: Anthropic; wire: Wire[]; sent: Headers[] } {
  const wire: Wire[] = [];
  const sent: Headers[] = [];
  const client = new Anthropic({
    baseURL: s.url,
    apiKey: 'client-secret-key',
    ...opts,
    fetch: async (input, init) => {
      sent.push(new Headers(init?.headers));
      const res = await fetch(input, init);
      wire.push({ status: res.status, shouldRetry: res.headers.get('x-should-retry') });
      return res;
    },
  });
  return { client, wire, sent };
}

const ask = { model: MODEL, max_tokens: 1024, messages: [{ role: 'user' as const, content: 'Fix the failing test in src/cart.ts.' }] };
const tools = [{ name: 'edit_file', description: 'Edit a file', input_schema: { type: 'object' as const, properties: { path: { type: 'string' }, patch: { type: 'string' } }, required: ['path', 'patch'] } }];
const fail = (p: Promise<unknown>) => p.then(() => new Error('resolved'), (e: unknown) => e) as Promise<ApiError>;
const textOf = (m: Anthropic.Message) => m.content.flatMap((b) => (b.type === 'text' ? [b.text] : [])).join('');

// ---------------------------------------------------------------------------------------------------------------

describe('overloaded_error (529), as a status and inside a 200 stream', () => {
  it('retries a 529 on the primary account, then the backup account answers; the SDK sends the call once', async () => {
    const primary = await account(() => overloaded());
    const backup = await account(healthy('From the backup.'));
    const s = await gateway(primary, backup);
    const { client, wire } = agent(s);
    const { data, response } = await client.messages.create(ask).withResponse();
    expect(textOf(data)).toBe('From the backup.');
    expect(response.headers.get('x-stormgate-target')).toBe('claude-backup/claude-sonnet-4-6');
    expect(response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect([primary.hits(), backup.hits(), wire.length]).toEqual([3, 1, 1]);
    // The backup got the backup account's key, never the agent's nor the primary's.
    expect(backup.seen[0]!.headers['x-api-key']).toBe(BACKUP_KEY);
  });

  it('529 on both accounts: the SDK raises an OverloadedError (status 529, overloaded_error) and does not send it again', async () => {
    const primary = await account(() => overloaded());
    const backup = await account(() => overloaded());
    const s = await gateway(primary, backup);
    const { client, wire } = agent(s);
    const err = await fail(client.messages.create(ask));
    expect(err).toBeInstanceOf(Anthropic.OverloadedError);
    expect(err.status).toBe(529);
    expect(err.type).toBe('overloaded_error');
    expect(err.error).toMatchObject({ type: 'error', error: { type: 'overloaded_error', message: expect.stringContaining('Overloaded') } });
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect([primary.hits(), backup.hits()]).toEqual([3, 3]);
    expect(wire).toEqual([{ status: 529, shouldRetry: 'false' }]);
  });

  it("a 529 with retry-after holds the primary off: the agents after it go straight to the backup (held_off)", async () => {
    const primary = await account(() => overloaded({ 'retry-after': '20' }));
    const backup = await account(healthy());
    const s = await gateway(primary, backup);
    const { client, wire } = agent(s);
    const first = await client.messages.create(ask).withResponse();
    expect(first.response.headers.get('x-stormgate-target')).toBe('claude-backup/claude-sonnet-4-6');
    for (let i = 0; i < 5; i++) {
      const { response } = await client.messages.create(ask).withResponse();
      expect(response.headers.get('x-stormgate-fallback')).toBe('held_off');
    }
    // One request met the overload; a hint of a second or more moves it on at once, not retried in place.
    expect([primary.hits(), backup.hits(), wire.length]).toEqual([1, 6, 6]);
  });

  it('an overloaded_error event before the first content is the 529 it stands for: retried, and the SDK reads one whole stream', async () => {
    const primary = await account((_b, n) => (n === 1 ? { headers: SSE, steps: [start(), ping, errorEvent('overloaded_error', 'Overloaded')] } : textStream('Fixed it.')));
    const s = await gateway(primary);
    const { client, wire } = agent(s);
    const types: string[] = [];
    const stream = client.messages.stream(ask);
    stream.on('streamEvent', (e) => types.push(e.type));
    expect(textOf(await stream.finalMessage())).toBe('Fixed it.');
    // The first attempt's message_start never reached the agent: one message_start, one stream.
    expect(types.filter((t) => t === 'message_start')).toHaveLength(1);
    expect([primary.hits(), wire.length]).toEqual([2, 1]);
    expect(primary.seen[1]!.headers['x-retry-reason']).toBe('status_529');
  });

  it('overloaded_error events before the first content on every attempt of both accounts reach the SDK as an OverloadedError, not a 502', async () => {
    const overloadedStream: Answer = () => ({ headers: SSE, steps: [start(), ping, errorEvent('overloaded_error', 'Overloaded')] });
    const primary = await account(overloadedStream);
    const backup = await account(overloadedStream);
    const s = await gateway(primary, backup);
    const { client, wire } = agent(s);
    const err = await fail(client.messages.stream(ask).finalMessage());
    expect(err).toBeInstanceOf(Anthropic.OverloadedError);
    expect(err.status).toBe(529);
    expect(err.type).toBe('overloaded_error');
    expect([primary.hits(), backup.hits()]).toEqual([3, 3]);
    expect(wire).toEqual([{ status: 529, shouldRetry: 'false' }]);
  });

  it('an overloaded_error event after the first content: the SDK raises it, never a clean end, and nothing is sent again', async () => {
    const primary = await account(() => ({ headers: SSE, steps: [start(), textOpen(), textDelta('I will edit '), 50, errorEvent('overloaded_error', 'Overloaded')] }));
    const backup = await account(healthy());
    const s = await gateway(primary, backup);
    const { client, wire } = agent(s);
    const types: string[] = [];
    const iterate = async () => {
      for await (const e of await client.messages.create({ ...ask, stream: true })) types.push(e.type);
    };
    const err = await fail(iterate());
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(err.type).toBe('overloaded_error');
    expect(err.error).toMatchObject({ type: 'error', error: { type: 'overloaded_error' } });
    expect(types).toEqual(['message_start', 'content_block_start', 'content_block_delta']);
    expect([primary.hits(), backup.hits(), wire.length]).toEqual([1, 0, 1]);
  });
});

describe('rate limits under 30 concurrent agents', () => {
  const limited = (retryAfter: string, extra: Record<string, string> = {}) =>
    json(429, errorBody('rate_limit_error', 'This request would exceed the rate limit for your organization of 50 requests per minute.'), {
      'retry-after': retryAfter,
      'anthropic-ratelimit-requests-limit': '50',
      'anthropic-ratelimit-requests-remaining': '0',
      'anthropic-ratelimit-requests-reset': new Date(Date.now() + Number(retryAfter) * 1000).toISOString(),
      'request-id': 'req_429',
      ...extra,
    });

  it('30 agents told retry-after 1: a hold-off, the retries spread after it (no herd), every call answered, each sent once by its SDK', async () => {
    let firstLimitedAt = 0;
    let limitUntil = 0;
    const primary = await account(() => {
      if (limitUntil === 0) limitUntil = Date.now() + 400;
      if (Date.now() < limitUntil) {
        firstLimitedAt ||= Date.now();
        return limited('1');
      }
      return json(200, message());
    });
    const s = await gateway(primary);
    const { client, wire } = agent(s);
    const answers = await Promise.all(Array.from({ length: 30 }, () => client.messages.create(ask)));
    expect(answers.every((m) => textOf(m) === 'Shipped.')).toBe(true);
    expect(wire).toHaveLength(30);
    const firstWave = primary.times.filter((t) => t.at < limitUntil);
    const retries = primary.times.filter((t) => t.at >= limitUntil);
    // The hold-off kept the calls that came after the first 429 away from the account: every call was answered by
    // one request after the wait, and at most the few already in flight were refused first.
    expect(firstWave.length).toBeGreaterThanOrEqual(1);
    expect(firstWave.length).toBeLessThanOrEqual(30);
    expect(retries.length).toBe(30);
    // None came back before the second the provider asked for, and they came back spread, not in one burst.
    const retryTimes = retries.map((t) => t.at);
    expect(Math.min(...retryTimes) - firstLimitedAt).toBeGreaterThanOrEqual(950);
    expect(Math.max(...retryTimes) - Math.min(...retryTimes)).toBeGreaterThanOrEqual(50);
  });

  // Found here: every agent a hold-off turned away (429 provider_held_off, x-should-retry: true) was told the same
  // retry-after-ms, to the hold-off's last millisecond, and so was the one whose 429 started it: the SDKs, which wait
  // exactly what they are told, all came back at once, 30 requests upstream within a few ms, the herd the README's
  // hold-offs exist to prevent. Each is now told the end plus a spread of its own, as the gateway's own retries are.
  it("30 agents turned away by a hold-off longer than maxWaitHintMs come back at its end spread out, not all at once, and are answered", async () => {
    let limitedAt = 0;
    const primary = await account(() => {
      if (limitedAt === 0) {
        limitedAt = Date.now();
        return limited('2');
      }
      return json(200, message());
    });
    const s = await gateway(primary, undefined, { route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 10, capMs: 10 }, maxWaitHintMs: 1_000 } } });
    const { client, wire } = agent(s);
    const first = client.messages.create(ask);
    while (limitedAt === 0) await sleep(5);
    await sleep(50);
    const answers = await Promise.all([first, ...Array.from({ length: 29 }, () => client.messages.create(ask))]);
    expect(answers.every((m) => textOf(m) === 'Shipped.')).toBe(true);
    // Each agent was turned away once, invited back (x-should-retry: true), and answered on its SDK's one retry.
    expect(wire.filter((w) => w.status === 429 && w.shouldRetry === 'true')).toHaveLength(30);
    expect(wire).toHaveLength(60);
    const back = primary.times.slice(1).map((t) => t.at);
    expect(back).toHaveLength(30);
    expect(Math.min(...back) - limitedAt).toBeGreaterThanOrEqual(1_950);
    // Spread over up to a fifth of the 2 s (at most a second), as the gateway's own retries past a hold-off are.
    expect(Math.max(...back) - Math.min(...back)).toBeGreaterThanOrEqual(150);
  });

  it('30 agents, the primary account limited with retry-after 20: all answered by the backup, the primary asked nothing during the hold-off', async () => {
    const primary = await account(() => limited('20'));
    const backup = await account(healthy());
    const s = await gateway(primary, backup);
    const { client, wire } = agent(s);
    const wave = () => Promise.all(Array.from({ length: 30 }, () => client.messages.create(ask).withResponse()));
    const first = await wave();
    expect(first.every(({ response }) => response.headers.get('x-stormgate-target') === 'claude-backup/claude-sonnet-4-6')).toBe(true);
    const afterFirst = primary.hits();
    expect(afterFirst).toBeGreaterThanOrEqual(1);
    expect(afterFirst).toBeLessThanOrEqual(30);
    const second = await wave();
    expect(second.every(({ response }) => response.headers.get('x-stormgate-fallback') === 'held_off')).toBe(true);
    expect(primary.hits()).toBe(afterFirst);
    expect(backup.hits()).toBe(60);
    expect(wire).toHaveLength(60);
  });

  it('30 agents told only anthropic-ratelimit-requests-reset (no retry-after): each waits its own reset, jittered, and is answered', async () => {
    let limitUntil = 0;
    let reset = 0;
    const primary = await account(() => {
      // The whole first wave must land inside the 429 window: on a loaded 2-core machine the 30 first attempts took
      // 400 ms and more to arrive, and the late ones were answered 200 before the reset (a flake, not early retries).
      if (limitUntil === 0) {
        limitUntil = Date.now() + 1_500;
        reset = Date.now() + 2_100;
      }
      if (Date.now() >= limitUntil) return json(200, message());
      return json(429, errorBody('rate_limit_error', 'Number of requests has exceeded your per-minute rate limit'), {
        'anthropic-ratelimit-requests-limit': '50',
        'anthropic-ratelimit-requests-remaining': '0',
        'anthropic-ratelimit-requests-reset': new Date(reset).toISOString(),
      });
    });
    const s = await gateway(primary);
    const { client, wire } = agent(s);
    const answers = await Promise.all(Array.from({ length: 30 }, () => client.messages.create(ask)));
    expect(answers.every((m) => textOf(m) === 'Shipped.')).toBe(true);
    expect(wire).toHaveLength(30);
    const retries = primary.times.filter((t) => t.at >= limitUntil).map((t) => t.at);
    expect(retries).toHaveLength(30);
    expect(primary.hits()).toBeLessThanOrEqual(60);
    // The reset is an RFC 3339 time in whole seconds at Anthropic; here in ms: nothing came back before it.
    expect(Math.min(...retries)).toBeGreaterThanOrEqual(reset - 60);
    expect(Math.max(...retries) - Math.min(...retries)).toBeGreaterThanOrEqual(50);
  });

  it("an agent that gives up during the gateway's wait for a retry-after cancels the wait: nothing more goes upstream", async () => {
    const primary = await account(() => json(429, errorBody('rate_limit_error', 'rate limited'), { 'retry-after': '2' }));
    const s = await gateway(primary);
    const { client, wire } = agent(s);
    const controller = new AbortController();
    const call = fail(client.messages.create(ask, { signal: controller.signal }));
    await sleep(300);
    controller.abort();
    expect(await call).toBeInstanceOf(Anthropic.APIUserAbortError);
    await sleep(2_700);
    expect(primary.hits()).toBe(1);
    expect(wire).toHaveLength(0);
    const line = await requestLine(s, 'agents');
    expect(line.outcome).toBe('client_gone');
  });

  it('a bare 429 after the gateway\'s attempts: x-should-retry false, and the SDK at maxRetries 2 does not send it again', async () => {
    const primary = await account(() => json(429, errorBody('rate_limit_error', 'Number of request tokens has exceeded your per-minute rate limit'), { 'request-id': 'req_429' }));
    const s = await gateway(primary);
    const { client, wire } = agent(s);
    const err = await fail(client.messages.create(ask));
    expect(err).toBeInstanceOf(Anthropic.RateLimitError);
    expect(err.status).toBe(429);
    expect(err.type).toBe('rate_limit_error');
    expect(err.requestID).toBe('req_429');
    expect(primary.hits()).toBe(3);
    expect(wire).toEqual([{ status: 429, shouldRetry: 'false' }]);
  });

  it('a retry-after longer than maxWaitHintMs: the SDK is invited back at the hold-off\'s end (x-should-retry true), and its one retry is answered', async () => {
    const primary = await account((_b, n) => (n === 1 ? limited('2') : json(200, message())));
    const s = await gateway(primary, undefined, { route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 10, capMs: 10 }, maxWaitHintMs: 1_000 } } });
    const { client, wire } = agent(s);
    const t0 = Date.now();
    expect(textOf(await client.messages.create(ask))).toBe('Shipped.');
    expect(Date.now() - t0).toBeGreaterThanOrEqual(1_900);
    expect(wire[0]).toEqual({ status: 429, shouldRetry: 'true' });
    expect(wire).toHaveLength(2);
    // The provider was asked once more, after the two seconds it asked for.
    expect(primary.hits()).toBe(2);
    expect(primary.times[1]!.at - primary.times[0]!.at).toBeGreaterThanOrEqual(1_950);
  });
});

describe("the client's errors pass as they came; the gateway's credentials are its own", () => {
  it('400 invalid_request_error reaches the SDK as Anthropic sent it: never retried, never failed over', async () => {
    const text = 'messages.1.content.0.tool_result: unexpected `tool_use_id` found in `tool_result` blocks: toolu_99';
    const primary = await account(() => json(400, errorBody('invalid_request_error', text), { 'request-id': 'req_400' }));
    const backup = await account(healthy());
    const s = await gateway(primary, backup);
    const { client, wire } = agent(s);
    const err = await fail(client.messages.create(ask));
    expect(err).toBeInstanceOf(Anthropic.BadRequestError);
    expect([err.status, err.type, err.apiMessage, err.requestID]).toEqual([400, 'invalid_request_error', text, 'req_400']);
    // As Anthropic sent it, with the OpenAI shape's param and code added.
    expect(err.error).toEqual({ type: 'error', error: { type: 'invalid_request_error', message: text, param: null, code: null } });
    expect([primary.hits(), backup.hits()]).toEqual([1, 0]);
    expect(wire).toEqual([{ status: 400, shouldRetry: 'false' }]);
  });

  it('413 request_too_large passes as it came: not retried, not failed over (the backup has the same size limit)', async () => {
    const primary = await account(() => json(413, errorBody('request_too_large', 'Request exceeds the maximum allowed number of bytes.'), { 'request-id': 'req_413' }));
    const backup = await account(healthy());
    const s = await gateway(primary, backup);
    const { client, wire } = agent(s);
    const err = await fail(client.messages.create(ask));
    expect(err.status).toBe(413);
    expect(err.type).toBe('request_too_large');
    expect(err.requestID).toBe('req_413');
    expect([primary.hits(), backup.hits()]).toEqual([1, 0]);
    expect(wire).toEqual([{ status: 413, shouldRetry: 'false' }]);
  });

  it("a body over the gateway's own limit: a 413 in Anthropic's shape (request_too_large), nothing sent upstream", async () => {
    const primary = await account(healthy());
    const s = await gateway(primary);
    const { client, wire } = agent(s);
    const screenshot = { type: 'image' as const, source: { type: 'base64' as const, media_type: 'image/png' as const, data: 'A'.repeat(11 * 1024 * 1024) } };
    const err = await fail(client.messages.create({ ...ask, messages: [{ role: 'user', content: [screenshot, { type: 'text', text: 'What is wrong here?' }] }] }));
    expect(err.status).toBe(413);
    expect(err.type).toBe('request_too_large');
    expect(err.error).toMatchObject({ type: 'error', error: { type: 'request_too_large', code: 'request_too_large' } });
    expect(err.requestID).toBe(err.headers?.get('x-stormgate-request-id'));
    expect(primary.hits()).toBe(0);
    expect(wire).toEqual([{ status: 413, shouldRetry: 'false' }]);
  });

  it.each([
    [401, 'authentication_error', `invalid x-api-key: ${TEST_KEY}`],
    [403, 'permission_error', `Your API key ${TEST_KEY} does not have permission to use the specified resource.`],
    [402, 'billing_error', 'Your organization has no payment method on file.'],
    [400, 'invalid_request_error', 'Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.'],
  ])('a %i %s is the gateway\'s own credentials: the SDK gets a 502 api_error it parses, with no provider text or key', async (status, type, text) => {
    const primary = await account(() => json(status, errorBody(type, text), { 'request-id': 'req_auth' }));
    const s = await gateway(primary);
    const { client, wire } = agent(s);
    const err = await fail(client.messages.create(ask));
    expect(err).toBeInstanceOf(Anthropic.InternalServerError);
    expect(err.status).toBe(502);
    expect(err.type).toBe('api_error');
    expect(err.error).toMatchObject({ type: 'error', error: { type: 'api_error', code: 'upstream_auth_error' } });
    const shown = JSON.stringify(err.error) + err.message;
    expect(shown).not.toContain(TEST_KEY);
    expect(shown).not.toContain(text);
    expect(err.requestID).toBe(err.headers?.get('x-stormgate-request-id'));
    expect(primary.hits()).toBe(1);
    expect(wire).toEqual([{ status: 502, shouldRetry: 'false' }]);
    // Held for the credentials: the next call is answered at once, without a request to the account.
    expect((await fail(client.messages.create(ask))).status).toBe(502);
    expect(primary.hits()).toBe(1);
  });

  it('a 401 on the primary account: the backup account answers, and the primary is held (asked nothing more)', async () => {
    const primary = await account(() => json(401, errorBody('authentication_error', 'invalid x-api-key')));
    const backup = await account(healthy('From the backup.'));
    const s = await gateway(primary, backup);
    const { client } = agent(s);
    const first = await client.messages.create(ask).withResponse();
    expect(first.response.headers.get('x-stormgate-fallback')).toBe('credentials');
    const second = await client.messages.create(ask).withResponse();
    expect(second.response.headers.get('x-stormgate-fallback')).toBe('credentials');
    expect(textOf(second.data)).toBe('From the backup.');
    expect([primary.hits(), backup.hits()]).toEqual([1, 2]);
  });

  it('a billing_error event inside a 200 stream before the first output is the credentials path: the backup streams the answer', async () => {
    const primary = await account(() => ({ headers: SSE, steps: [start(), errorEvent('billing_error', 'Your credit balance is too low to access the Anthropic API.')] }));
    const backup = await account(healthy('From the backup.'));
    const s = await gateway(primary, backup);
    const { client, wire } = agent(s);
    expect(textOf(await client.messages.stream(ask).finalMessage())).toBe('From the backup.');
    expect([primary.hits(), backup.hits(), wire.length]).toEqual([1, 1, 1]);
  });

  it('a billing_error event after the first output ends that stream (the SDK raises) and holds the account: the next call goes to the backup', async () => {
    const primary = await account(() => ({ headers: SSE, steps: [start(), textOpen(), textDelta('Looking at '), 30, errorEvent('billing_error', 'Your credit balance is too low to access the Anthropic API.')] }));
    const backup = await account(healthy('From the backup.'));
    const s = await gateway(primary, backup);
    const { client } = agent(s);
    const err = await fail(client.messages.stream(ask).finalMessage());
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(err).not.toBeInstanceOf(Anthropic.APIUserAbortError);
    const next = await client.messages.stream(ask).withResponse();
    expect(next.response.headers.get('x-stormgate-fallback')).toBe('credentials');
    expect(textOf(await next.data.finalMessage())).toBe('From the backup.');
    expect([primary.hits(), backup.hits()]).toEqual([1, 1]);
  });

  it('500 api_error is retried (x-retry-attempt, x-retry-reason upstream) and answered; the SDK sends once', async () => {
    const primary = await account((_b, n) => (n === 1 ? json(500, errorBody('api_error', 'Internal server error')) : json(200, message())));
    const s = await gateway(primary);
    const { client, wire } = agent(s);
    expect(textOf(await client.messages.create(ask))).toBe('Shipped.');
    expect(primary.hits()).toBe(2);
    expect(primary.seen[1]!.headers).toMatchObject({ 'x-retry-attempt': '1', 'x-retry-reason': 'status_500' });
    expect(wire).toHaveLength(1);
  });
});

describe("a coding agent's streams", () => {
  it("a long streaming tool-use turn with a signed thinking block reaches the SDK whole, and the next turn goes upstream as written", async () => {
    const patch = '--- a/src/cart.ts\n+++ b/src/cart.ts\n@@ -1 +1 @@\n-return total\n+return total + tax\n';
    const args = JSON.stringify({ path: 'src/cart.ts', patch });
    const chunks = args.match(/.{1,12}/gs)!;
    const primary = await account((_b, n) =>
      n === 1
        ? {
            headers: SSE,
            steps: [
              start(), ping, thinkingOpen(0), thinkingDelta('The test expects tax '), 40, thinkingDelta('to be added.'), signatureDelta('EqQBCkgIARABGAIiQL2signature=='), blockStop(0),
              textOpen(1), textDelta("I'll fix the total.", 1), blockStop(1), toolOpen(2), inputJson('', 2),
              ...chunks.flatMap((c) => [inputJson(c, 2), 10]), blockStop(2), finish('tool_use'), stop,
            ],
          }
        : json(200, message('Done: the test passes.')),
    );
    const s = await gateway(primary);
    const { client, wire, sent } = agent(s);
    const beta = { headers: { 'anthropic-beta': 'interleaved-thinking-2025-05-14,prompt-caching-2024-07-31' } };
    const system = [{ type: 'text' as const, text: 'You are a coding agent.', cache_control: { type: 'ephemeral' as const } }];
    const first = await client.messages.stream({ ...ask, system, tools, thinking: { type: 'enabled', budget_tokens: 2048 } }, beta).finalMessage();
    expect(first.stop_reason).toBe('tool_use');
    expect(first.content).toEqual([
      { type: 'thinking', thinking: 'The test expects tax to be added.', signature: 'EqQBCkgIARABGAIiQL2signature==' },
      expect.objectContaining({ type: 'text', text: "I'll fix the total." }),
      expect.objectContaining({ type: 'tool_use', id: 'toolu_01', name: 'edit_file', input: { path: 'src/cart.ts', patch } }),
    ]);
    // The agent's next turn: its thinking block with its signature, the call, and the tool's result.
    const next = {
      ...ask,
      system,
      tools,
      thinking: { type: 'enabled' as const, budget_tokens: 2048 },
      messages: [...ask.messages, { role: 'assistant' as const, content: first.content }, { role: 'user' as const, content: [{ type: 'tool_result' as const, tool_use_id: 'toolu_01', content: 'patched', cache_control: { type: 'ephemeral' as const } }] }],
    };
    expect(textOf(await client.messages.create(next, beta))).toBe('Done: the test passes.');
    expect(primary.seen[1]!.body).toEqual(JSON.parse(JSON.stringify(next)));
    expect(primary.seen.map((x) => x.headers['anthropic-beta'])).toEqual([beta.headers['anthropic-beta'], beta.headers['anthropic-beta']]);
    expect(primary.seen.map((x) => x.headers['anthropic-version'])).toEqual([sent[0]!.get('anthropic-version'), sent[1]!.get('anthropic-version')]);
    expect(sent[0]!.get('anthropic-version')).toMatch(/^\d{4}-\d{2}-\d{2}$/);
    expect(wire).toHaveLength(2);
    // Prompt-cache reads are billed as prompt tokens: both answers' 40 input tokens and 3000 cache reads.
    expect(await metricSum(s, 'stormgate_tokens_total{route="agents",target="claude/claude-sonnet-4-6",kind="prompt"}')).toBe(2 * 3040);
  });

  it.each([
    ['its connection reset', { destroy: true as const }],
    ['its response ended', ''],
  ])('a stream cut in the middle of a tool_use input_json_delta (%s): the SDK raises and never sees a complete tool call', async (_, cut) => {
    const primary = await account(() => ({ headers: SSE, steps: [start(), textOpen(0), textDelta("I'll edit it.", 0), blockStop(0), toolOpen(1), inputJson('{"path": "src/ca', 1), 30, inputJson('rt.ts", "patch": "--- a', 1), 30, cut] }));
    const backup = await account(healthy());
    const s = await gateway(primary, backup);
    const { client, wire } = agent(s);
    const stream = client.messages.stream({ ...ask, tools });
    const blocks: string[] = [];
    stream.on('contentBlock', (b) => blocks.push(b.type));
    const err = await fail(stream.finalMessage());
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(err).not.toBeInstanceOf(Anthropic.APIUserAbortError);
    // The text block was complete; the tool call never was.
    expect(blocks).toEqual(['text']);
    expect([primary.hits(), backup.hits(), wire.length]).toEqual([1, 0, 1]);
  });

  it('pings during a long thinking pause keep the stream alive past idleMs, and only content counts as its first token', async () => {
    const pings = (ms: number) => Array.from({ length: ms / 100 }, () => [100, ping]).flat();
    const primary = await account(() => ({
      headers: SSE,
      steps: [start(), thinkingOpen(0), ...pings(800), thinkingDelta('Reading the test.'), ...pings(800), thinkingDelta(' Now the fix.'), signatureDelta('sig'), blockStop(0), textOpen(1), textDelta('Fixed.', 1), blockStop(1), finish(), stop],
    }));
    const s = await gateway(primary, undefined, { primary: { timeouts: { connectMs: 2_000, firstTokenMs: 3_000, idleMs: 400 } } });
    const { client, wire } = agent(s);
    const msg = await client.messages.stream({ ...ask, thinking: { type: 'enabled', budget_tokens: 2048 } }).finalMessage();
    expect(msg.content[0]).toEqual({ type: 'thinking', thinking: 'Reading the test. Now the fix.', signature: 'sig' });
    expect(textOf(msg)).toBe('Fixed.');
    expect([primary.hits(), wire.length]).toEqual([1, 1]);
    // Its first token is the first thinking delta, after 800 ms of pings; not message_start, not a ping.
    const line = await requestLine(s, 'agents');
    expect(line.ttftMs).toBeGreaterThanOrEqual(750);
  });

  it.each([
    ['a redacted_thinking block', ev('content_block_start', { index: 0, content_block: { type: 'redacted_thinking', data: 'EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP' } })],
    ['a web_search_tool_result block', ev('content_block_start', { index: 0, content_block: { type: 'web_search_tool_result', tool_use_id: 'srvtoolu_01', content: [{ type: 'web_search_result', url: 'https://example.com', title: 'Example', encrypted_content: 'Eu8BCioIAhgBIiQ', page_age: null }] } })],
  ])('%s is a first output: a pause past firstTokenMs after it is not timed out', async (_, opening) => {
    const primary = await account(() => ({ headers: SSE, steps: [start(), opening, blockStop(0), 700, textOpen(1), textDelta('Fixed.', 1), blockStop(1), finish(), stop] }));
    const s = await gateway(primary, undefined, { primary: { timeouts: { connectMs: 2_000, firstTokenMs: 300, idleMs: 5_000 } } });
    const { client, wire } = agent(s);
    const msg = await client.messages.stream(ask).finalMessage();
    expect(msg.content).toHaveLength(2);
    expect(textOf(msg)).toBe('Fixed.');
    expect([primary.hits(), wire.length]).toEqual([1, 1]);
  });

  it("the SDK's timeout shorter than the route's: a 504 timeout_error before the SDK gives up, the upstream request aborted, no SDK retry", async () => {
    const primary = await account(HANG);
    const s = await gateway(primary);
    // Sent as x-stainless-timeout: 3; the route's timeoutMs is 20 s.
    const { client, wire, sent } = agent(s, { timeout: 3_000 });
    const t0 = Date.now();
    const err = await fail(client.messages.create(ask));
    const took = Date.now() - t0;
    expect(sent[0]!.get('x-stainless-timeout')).toBe('3');
    expect(err).not.toBeInstanceOf(Anthropic.APIConnectionTimeoutError);
    expect(err.status).toBe(504);
    expect(err.error).toMatchObject({ type: 'error', error: { type: 'timeout_error', code: 'deadline_exceeded' } });
    expect(err.requestID).toBe(err.headers?.get('x-stormgate-request-id'));
    expect(took).toBeLessThan(3_000);
    expect(took).toBeGreaterThanOrEqual(2_500);
    expect(wire).toEqual([{ status: 504, shouldRetry: 'false' }]);
    await sleep(100);
    expect(primary.times[0]!.closedAt).toBeDefined();
    expect(primary.hits()).toBe(1);
    // The timeout header is the gateway's, not the provider's.
    expect(primary.seen[0]!.headers['x-stainless-timeout']).toBeUndefined();
  });

  it('the agent aborting mid tool-use stream aborts the upstream request at once; neither account is asked again', async () => {
    const primary = await account(() => ({ headers: SSE, steps: [start(), toolOpen(0), ...Array.from({ length: 100 }, (_, i) => [inputJson(i === 0 ? '{"patch": "' : 'x', 0), 30]).flat()] }));
    const backup = await account(healthy());
    const s = await gateway(primary, backup);
    const { client, wire } = agent(s);
    const stream = client.messages.stream({ ...ask, tools });
    let deltas = 0;
    stream.on('inputJson', () => {
      if (++deltas === 3) stream.abort();
    });
    expect(await fail(stream.finalMessage())).toBeInstanceOf(Anthropic.APIUserAbortError);
    const abortedAt = Date.now();
    await sleep(500);
    expect(primary.times[0]!.closedAt).toBeDefined();
    expect(primary.times[0]!.closedAt! - abortedAt).toBeLessThan(400);
    expect([primary.hits(), backup.hits(), wire.length]).toEqual([1, 0, 1]);
  });
});

describe('request ids', () => {
  it("passes Anthropic's request-id back on answers and streams, the provider's on its errors, and the gateway's on its own", async () => {
    const primary = await account((body, n) => (n === 3 ? json(404, errorBody('not_found_error', 'model: claude-nope'), { 'request-id': 'req_404' }) : healthy()(body, n, '/v1/messages')));
    const s = await gateway(primary);
    const { client } = agent(s, { maxRetries: 0 });
    const whole = await client.messages.create(ask);
    expect(whole._request_id).toBe('req_whole_01');
    const { response, request_id } = await client.messages.create({ ...ask, stream: true }).withResponse();
    expect(request_id).toBe('req_stream_01');
    expect(response.headers.get('x-request-id')).toBe('req_stream_01');
    expect(response.headers.get('x-stormgate-request-id')).toBeTruthy();
    const upstream = await fail(client.messages.create({ ...ask, model: 'claude-nope' }));
    expect([upstream.status, upstream.type, upstream.requestID]).toEqual([404, 'not_found_error', 'req_404']);
    // The gateway's own error (no route serves this model): its own id, where the SDK reads it.
    const own = await fail(client.messages.create({ ...ask, model: 'gpt-4o' }));
    expect(own.status).toBe(404);
    expect(own.type).toBe('not_found_error');
    expect(own.requestID).toBe(own.headers?.get('x-stormgate-request-id'));
    expect(own.requestID).toBeTruthy();
  });
});

describe('the breaker and the backup account', () => {
  it("the primary's breaker opens on 500s: new requests go to the backup at once (breaker_open), and the primary is asked nothing more", async () => {
    const primary = await account(() => json(500, errorBody('api_error', 'Internal server error')));
    const backup = await account(healthy('From the backup.'));
    const s = await gateway(primary, backup, { primary: { breaker: { consecutiveFailures: 5, openS: 30 } } });
    const { client, wire } = agent(s);
    const fallbacks: Array<string | null> = [];
    for (let i = 0; i < 8; i++) {
      const { data, response } = await client.messages.create(ask).withResponse();
      expect(textOf(data)).toBe('From the backup.');
      fallbacks.push(response.headers.get('x-stormgate-fallback'));
      if (i < 3) await sleep(150);
    }
    // Five failures in a row open it (the second request's third attempt is not sent: it moves on at once).
    const opened = fallbacks.indexOf('breaker_open');
    expect(fallbacks.slice(0, opened)).toEqual(['retries_exhausted']);
    expect(fallbacks.slice(opened).every((f) => f === 'breaker_open')).toBe(true);
    expect(primary.hits()).toBe(5);
    expect(backup.hits()).toBe(8);
    expect(wire).toHaveLength(8);
  });
});

describe('the breaker with no backup account', () => {
  it("an open breaker and no backup: a 503 the SDK parses (code circuit_open, a retry-after), which it does not send again", async () => {
    const primary = await account(() => json(500, errorBody('api_error', 'Internal server error')));
    const s = await gateway(primary, undefined, { primary: { breaker: { consecutiveFailures: 3, openS: 30 } }, route: { park: false, retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 10, capMs: 10 } } } });
    const { client, wire } = agent(s);
    expect((await fail(client.messages.create(ask))).status).toBe(500);
    const err = await fail(client.messages.create(ask));
    expect(err.status).toBe(503);
    expect(err.type).toBe('api_error');
    expect(err.error).toMatchObject({ type: 'error', error: { type: 'api_error', code: 'circuit_open' } });
    expect(Number(err.headers?.get('retry-after'))).toBeGreaterThan(0);
    expect(err.requestID).toBe(err.headers?.get('x-stormgate-request-id'));
    expect(primary.hits()).toBe(3);
    expect(wire.map((w) => w.shouldRetry)).toEqual(['false', 'false']);
  });
});

describe('count_tokens beside message creation', () => {
  it("count_tokens goes upstream during /v1/messages' hold-off (hold-offs are per path), and message creation stays held off", async () => {
    const primary = await account((_b, _n, url) => (url.includes('count_tokens') ? json(200, { input_tokens: 3042 }) : json(429, errorBody('rate_limit_error', 'rate limited'), { 'retry-after': '30' })));
    const s = await gateway(primary);
    // maxRetries 0: a 30 s retry-after would have the SDK wait it out.
    const { client } = agent(s, { maxRetries: 0 });
    expect(await fail(client.messages.create(ask))).toBeInstanceOf(Anthropic.RateLimitError);
    expect((await client.messages.countTokens({ model: MODEL, messages: ask.messages })).input_tokens).toBe(3042);
    const held = await fail(client.messages.create(ask));
    expect(held.error).toMatchObject({ type: 'error', error: { type: 'rate_limit_error', code: 'provider_held_off' } });
    expect(Number(held.headers?.get('retry-after'))).toBeGreaterThan(25);
    expect([primary.hits(), primary.hits('/v1/messages/count_tokens')]).toEqual([1, 1]);
  });

  it("a count_tokens 429's retry-after is that request's own wait: it is retried after it, while the other agents' counts go upstream", async () => {
    const primary = await account((_b, n) => (n === 1 ? json(429, errorBody('rate_limit_error', 'Number of token counting requests has exceeded your rate limit'), { 'retry-after': '1' }) : json(200, { input_tokens: 3042 })));
    const s = await gateway(primary);
    const { client, wire } = agent(s);
    const count = () => client.messages.countTokens({ model: MODEL, messages: ask.messages });
    const t0 = Date.now();
    const limited = count().then((r) => ({ r, at: Date.now() - t0 }));
    await sleep(200);
    const others = await Promise.all(Array.from({ length: 5 }, () => count().then(() => Date.now() - t0)));
    expect(Math.max(...others)).toBeLessThan(900);
    const { r, at } = await limited;
    expect(r.input_tokens).toBe(3042);
    expect(at).toBeGreaterThanOrEqual(950);
    expect(primary.hits('/v1/messages/count_tokens')).toBe(7);
    expect(wire).toHaveLength(6);
  });
});

describe('the config, as the README and config/examples/anthropic-agents.yaml give it', () => {
  const text = (backupFamily: string, countFamily = 'anthropic') => `providers:
  anthropic: { family: anthropic, baseUrl: "https://api.anthropic.com", apiKey: sk-ant-a }
  backup: { family: ${backupFamily}, baseUrl: "https://example.com/v1", apiKey: sk-b }
  counter: { family: ${countFamily}, baseUrl: "https://example.com", apiKey: sk-c }
routes:
  - name: claude-agents
    match: { path: /v1/messages, models: ["claude-*"] }
    targets: [ { provider: anthropic }, { provider: backup, model: claude-haiku-4-5 } ]
  - name: claude-token-count
    match: { path: /v1/messages/count_tokens }
    targets: [ { provider: counter } ]
`;

  it.each(['openai', 'azure-openai'])('refuses a %s backup on /v1/messages at start-up, naming the route and the family', (family) => {
    let err: unknown;
    try {
      parseConfig(text(family), 'gw.yaml', {});
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ConfigError);
    expect(String((err as Error).message)).toMatch(/routes\[0\]|claude-agents/);
    expect(String((err as Error).message)).toMatch(/anthropic/);
  });

  it('starts with an openai target on count_tokens (the family is checked only on the APIs the gateway knows)', () => {
    expect(() => parseConfig(text('anthropic', 'openai'), 'gw.yaml', {})).not.toThrow();
  });

  it("the example as shipped: the primary account's 429 sends the agents to the backup account, while count_tokens still goes to the primary", async () => {
    const primary = await account((_b, _n, url) => (url.includes('count_tokens') ? json(200, { input_tokens: 3042 }) : json(429, errorBody('rate_limit_error', 'rate limited'), { 'retry-after': '30' })));
    const backup = await account(healthy('From the backup.'));
    const config = parseConfig(readFileSync('config/examples/anthropic-agents.yaml', 'utf8'), 'anthropic-agents.yaml', {
      ANTHROPIC_API_KEY: TEST_KEY,
      ANTHROPIC_BACKUP_API_KEY: BACKUP_KEY,
      ANTHROPIC_UPSTREAM_URL: primary.origin,
      ANTHROPIC_BACKUP_UPSTREAM_URL: backup.origin,
    });
    const url = await startGateway(config);
    const client = new Anthropic({ baseURL: url, apiKey: 'client-secret-key' });
    for (let i = 0; i < 4; i++) expect(textOf(await client.messages.create(ask))).toBe('From the backup.');
    expect((await client.messages.countTokens({ model: MODEL, messages: ask.messages })).input_tokens).toBe(3042);
    expect([primary.hits(), backup.hits(), primary.hits('/v1/messages/count_tokens')]).toEqual([1, 4, 1]);
  });
});
