// Third-party failure-scenario suite 83: an outside QA team whose agents use the official `@anthropic-ai/sdk`
// (maxRetries: 0 unless a case says) against the gateway's same-family path: `/v1/messages` to Anthropic accounts,
// no translation. Scripted upstreams on 127.0.0.1 answer as Anthropic's docs say it answers ("Streaming Messages",
// "Rate limits", "Errors", "Token counting"). Suites 15, 40, 68, 72 and 80 took the failover of 529s, pings, the bytes
// sent, the documented stop reasons and error types; this one takes what they left least covered:
//  1. what the client sees of the provider on a success: `request-id` (also as `x-request-id`), never the account's
//     `anthropic-ratelimit-*` or organisation headers; the log line's `upstreamRequestId`;
//  2. usage as the gateway bills it: message_delta's cumulative counts (one or more message_delta events), prompt-cache
//     reads and writes as prompt tokens, whole and streamed, and what a broken stream had reported before its break;
//  3. where a stream's first output is: a thinking delta and a `redacted_thinking` block are output (a failure after
//     them is raised, never failed over), an empty thinking block is not (failed over); a turn with no content at all
//     is an answer;
//  4. error events before the first output, as the type they carry stands for: Anthropic's `request_id` and
//     `details: null` beside an overload, an `api_error` on a route whose `retryOn` leaves 500 out, a
//     `rate_limit_error`, and a type Anthropic does not document (a broken stream);
//  5. rate limits: a 429 whose retry-after is past `maxWaitHintMs` on a lone account (the SDK invited back, the next
//     call turned away in Anthropic's shape, nothing upstream), count_tokens through its own 429;
//  6. how each stream ended, in the log line and `stormgate_stream_ends_total` (complete, done-added, cut, stalled,
//     upstream-error, client-gone), and the SDK at its default maxRetries sending a broken stream once.
// Found here: no gateway defect. Reported as a design question: on a count_tokens route (a path the gateway forwards
// without reading its API), an Anthropic error object answered with a 200 is passed on as a success, so countTokens()
// resolves with `input_tokens` undefined, where on /v1/messages the same body is the 529 its type stands for.
// Bounds are generous: a loaded 2-core machine.
import Anthropic from '@anthropic-ai/sdk';
import { describe, expect, it } from 'vitest';
import { json, type Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams, type UpstreamsGateway, type UpstreamsOptions } from './helpers/scripted-upstreams.ts';
import { requestLines, tokens, type Line } from './helpers/usage-readers.ts';
import { aev } from './helpers/tool-stream.ts';
import { scrapeMetrics } from './helpers/stack.ts';

const start = useScriptedUpstreams();

const MODEL = 'claude-sonnet-4-6';
const BACKUP_MODEL = 'claude-haiku-4-5';
type ApiError = InstanceType<typeof Anthropic.APIError>;

/** The headers Anthropic sends with every answer: its request id, the account's limits and organisation. */
const ACCOUNT_HEADERS = {
  'request-id': 'req_011CAcct83',
  'anthropic-organization-id': 'a1b2c3d4-0000-4000-8000-000000000083',
  'anthropic-ratelimit-requests-limit': '4000',
  'anthropic-ratelimit-requests-remaining': '3999',
  'anthropic-ratelimit-requests-reset': '2026-01-01T00:00:01Z',
  'anthropic-ratelimit-input-tokens-limit': '2000000',
  'anthropic-ratelimit-input-tokens-remaining': '1999000',
  'anthropic-ratelimit-output-tokens-limit': '400000',
  'anthropic-ratelimit-output-tokens-remaining': '399950',
  'anthropic-ratelimit-tokens-limit': '2400000',
  'anthropic-ratelimit-tokens-remaining': '2398950',
};
const sse = (steps: Script['steps'], headers: Record<string, string> = {}): Script => ({ headers: { 'content-type': 'text/event-stream; charset=utf-8', ...ACCOUNT_HEADERS, ...headers }, steps });

const usage0 = { input_tokens: 12, cache_creation_input_tokens: 300, cache_read_input_tokens: 9000, output_tokens: 1 };
const messageStart = (model = MODEL, usage: Record<string, unknown> = usage0) =>
  aev('message_start', { message: { id: `msg_01${model.slice(7, 11)}`, type: 'message', role: 'assistant', model, content: [], stop_reason: null, stop_sequence: null, usage } });
const textOpen = (index = 0) => aev('content_block_start', { index, content_block: { type: 'text', text: '' } });
const text = (t: string, index = 0) => aev('content_block_delta', { index, delta: { type: 'text_delta', text: t } });
const stop = (index = 0) => aev('content_block_stop', { index });
const stopDelta = (stop_reason: string, usage: Record<string, unknown>) => aev('message_delta', { delta: { stop_reason, stop_sequence: null }, usage });
const overloadEvent = aev('error', { error: { details: null, type: 'overloaded_error', message: 'Overloaded' }, request_id: 'req_011CEvt83' });

/** A whole streamed text answer, its usage in message_start and message_delta as Anthropic sends them. */
const textStream = (model = MODEL, t = 'Tide at six.') =>
  sse([messageStart(model), textOpen(), aev('ping'), text(t), stop(), stopDelta('end_turn', { ...usage0, output_tokens: 9 }), aev('message_stop')]);
const wholeMessage = (model = MODEL) =>
  json(200, { id: 'msg_01Whole', type: 'message', role: 'assistant', model, content: [{ type: 'text', text: 'Tide at six.' }], stop_reason: 'end_turn', stop_sequence: null, usage: { ...usage0, output_tokens: 9 } }, ACCOUNT_HEADERS);
const anthropicError = (status: number, type: string, message: string, headers: Record<string, string> = {}) =>
  json(status, { type: 'error', error: { type, message }, request_id: 'req_011CErr83' }, { 'request-id': 'req_011CErr83', ...headers });

const ask = { model: MODEL, max_tokens: 1024, messages: [{ role: 'user' as const, content: 'When is high tide?' }] };
const claude = (g: UpstreamsGateway, maxRetries = 0) => new Anthropic({ baseURL: g.s.url, apiKey: 'client-key-83', maxRetries });

type Answer = (body: Record<string, unknown>, n: number) => Script;
/** A primary account and a backup account of another model on one /v1/messages route. */
function accounts(primary: Answer, backup: Answer = () => textStream(BACKUP_MODEL, 'From the backup.'), opts: UpstreamsOptions = {}) {
  return start(
    { primary: { family: 'anthropic', answer: primary }, backup: { family: 'anthropic', answer: backup } },
    [{ provider: 'primary' }, { provider: 'backup', model: BACKUP_MODEL }],
    { path: '/v1/messages', ...opts, route: { name: 'claude', ...opts.route } },
  );
}
/** One account alone on the route. */
function lone(answer: Answer, opts: UpstreamsOptions = {}) {
  return start({ primary: { family: 'anthropic', answer } }, [{ provider: 'primary' }], { path: '/v1/messages', ...opts, route: { name: 'claude', ...opts.route } });
}

/** The error a promise rejected with (the test fails if it resolved). */
async function rejection(p: Promise<unknown>): Promise<ApiError> {
  const got = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(got).toBeInstanceOf(Anthropic.APIError);
  return got as ApiError;
}

async function streamEnds(g: UpstreamsGateway): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const s of await scrapeMetrics(g.s.url)) if (s.name === 'stormgate_stream_ends_total' && s.value !== 0) out[s.labels.end!] = s.value;
  return out;
}

const onlyLine = async (g: UpstreamsGateway): Promise<Line> => (await requestLines(g, 1))[0]!;

describe("what an agent sees of the account on a success", () => {
  it("a stream: the account's request-id (and as x-request-id), none of its anthropic-ratelimit-* or organisation headers; the log names the id", async () => {
    const g = await accounts(() => textStream());
    const { data: stream, response, request_id } = await claude(g).messages.stream(ask).withResponse();
    const msg = await stream.finalMessage();
    expect(msg.content).toEqual([{ type: 'text', text: 'Tide at six.' }]);
    expect(request_id).toBe('req_011CAcct83');
    expect(response.headers.get('x-request-id')).toBe('req_011CAcct83');
    expect(response.headers.get('content-type')).toMatch(/^text\/event-stream/);
    expect([...response.headers.keys()].filter((h) => h.startsWith('anthropic-'))).toEqual([]);
    const line = await onlyLine(g);
    expect(line).toMatchObject({ upstreamRequestId: 'req_011CAcct83', streamEnd: 'complete', outcome: 'success' });
    expect(await streamEnds(g)).toEqual({ complete: 1 });
  });

  it('a whole Message: the same headers; the prompt billed is input plus the cache reads and writes', async () => {
    const g = await accounts(() => wholeMessage());
    const { data: msg, response } = await claude(g).messages.create(ask).withResponse();
    expect(msg.usage).toMatchObject({ input_tokens: 12, cache_read_input_tokens: 9000, cache_creation_input_tokens: 300, output_tokens: 9 });
    expect(response.headers.get('request-id')).toBe('req_011CAcct83');
    expect(response.headers.get('x-request-id')).toBe('req_011CAcct83');
    expect([...response.headers.keys()].filter((h) => h.startsWith('anthropic-'))).toEqual([]);
    expect((await onlyLine(g)).usage).toEqual({ prompt: 9312, completion: 9 });
    expect(await tokens(g)).toEqual({ [`primary/${MODEL} prompt`]: 9312, [`primary/${MODEL} completion`]: 9 });
  });
});

describe('usage in streams', () => {
  it('message_delta counts are cumulative: two of them (the first without a stop_reason) bill the last count once, not their sum', async () => {
    const g = await accounts(() =>
      sse([
        messageStart(),
        textOpen(),
        text('Tide '),
        aev('message_delta', { delta: { stop_reason: null, stop_sequence: null }, usage: { output_tokens: 4 } }),
        text('at six.'),
        stop(),
        stopDelta('end_turn', { ...usage0, output_tokens: 9 }),
        aev('message_stop'),
      ]),
    );
    const msg = await claude(g).messages.stream(ask).finalMessage();
    expect(msg.content).toEqual([{ type: 'text', text: 'Tide at six.' }]);
    expect(msg.usage.output_tokens).toBe(9);
    expect((await onlyLine(g)).usage).toEqual({ prompt: 9312, completion: 9 });
    expect(await tokens(g)).toEqual({ [`primary/${MODEL} prompt`]: 9312, [`primary/${MODEL} completion`]: 9 });
  });

  it('a server tool turn whose message_delta reports more input than message_start (the search results read) bills the later, larger count', async () => {
    const g = await accounts(() =>
      sse([
        messageStart(MODEL, { input_tokens: 25, output_tokens: 1 }),
        aev('content_block_start', { index: 0, content_block: { type: 'server_tool_use', id: 'srvtoolu_01', name: 'web_search', input: {} } }),
        aev('content_block_delta', { index: 0, delta: { type: 'input_json_delta', partial_json: '{"query":"tides"}' } }),
        stop(0),
        aev('content_block_start', { index: 1, content_block: { type: 'web_search_tool_result', tool_use_id: 'srvtoolu_01', content: [] } }),
        stop(1),
        textOpen(2),
        text('Tide at six.', 2),
        stop(2),
        stopDelta('end_turn', { input_tokens: 2679, output_tokens: 40, server_tool_use: { web_search_requests: 1 } }),
        aev('message_stop'),
      ]),
    );
    const msg = await claude(g).messages.stream(ask).finalMessage();
    expect(msg.content.map((b) => b.type)).toEqual(['server_tool_use', 'web_search_tool_result', 'text']);
    expect(msg.usage).toMatchObject({ input_tokens: 2679, output_tokens: 40 });
    expect((await onlyLine(g)).usage).toEqual({ prompt: 2679, completion: 40 });
  });

  it('a stream cut after its first text: the SDK raises, the line says cut (stream_error) with the prompt message_start reported, the backup never asked', async () => {
    const g = await accounts(() => sse([messageStart(), textOpen(), text('Tide '), 50, { destroy: true }]));
    const err = await rejection(claude(g).messages.stream(ask).finalMessage());
    expect(err.message).toMatch(/stream_interrupted|interrupted|cut/i);
    expect(g.seen.primary).toHaveLength(1);
    expect(g.seen.backup).toHaveLength(0);
    const line = await onlyLine(g);
    expect(line).toMatchObject({ streamEnd: 'cut', outcome: 'stream_error', usage: { prompt: 9312, completion: 1 } });
    expect(await streamEnds(g)).toEqual({ cut: 1 });
  });
});

describe('where the first output is', () => {
  it('an overloaded_error after a thinking delta is after the first output: finalMessage() rejects with its type, nothing sent again, upstream-error', async () => {
    const g = await accounts(() =>
      sse([
        messageStart(),
        aev('content_block_start', { index: 0, content_block: { type: 'thinking', thinking: '' } }),
        aev('content_block_delta', { index: 0, delta: { type: 'thinking_delta', thinking: 'The user asks about tides.' } }),
        overloadEvent,
      ]),
    );
    const err = await rejection(claude(g).messages.stream({ ...ask, thinking: { type: 'enabled', budget_tokens: 2048 } }).finalMessage());
    expect(err.message).toMatch(/overloaded_error/);
    expect(g.seen.primary).toHaveLength(1);
    expect(g.seen.backup).toHaveLength(0);
    expect(await onlyLine(g)).toMatchObject({ streamEnd: 'upstream-error', outcome: 'stream_error' });
    expect(await streamEnds(g)).toEqual({ 'upstream-error': 1 });
  });

  it("an empty thinking block is no output: an overload right after it goes to the backup, whose signed thinking reaches finalMessage() whole", async () => {
    const backupThinking = () =>
      sse([
        messageStart(BACKUP_MODEL),
        aev('content_block_start', { index: 0, content_block: { type: 'thinking', thinking: '' } }),
        aev('content_block_delta', { index: 0, delta: { type: 'thinking_delta', thinking: 'Tides follow the moon.' } }),
        aev('content_block_delta', { index: 0, delta: { type: 'signature_delta', signature: 'EqQBCgIYAhIM1gbcDa9GJwZA2b3h' } }),
        stop(0),
        textOpen(1),
        text('Tide at six.', 1),
        stop(1),
        stopDelta('end_turn', { output_tokens: 30 }),
        aev('message_stop'),
      ]);
    const g = await accounts(
      () => sse([messageStart(), aev('content_block_start', { index: 0, content_block: { type: 'thinking', thinking: '' } }), aev('ping'), overloadEvent]),
      backupThinking,
    );
    const { data: stream, response } = await claude(g).messages.stream({ ...ask, thinking: { type: 'enabled', budget_tokens: 2048 } }).withResponse();
    const msg = await stream.finalMessage();
    expect(msg.model).toBe(BACKUP_MODEL);
    expect(msg.content).toEqual([
      { type: 'thinking', thinking: 'Tides follow the moon.', signature: 'EqQBCgIYAhIM1gbcDa9GJwZA2b3h' },
      { type: 'text', text: 'Tide at six.' },
    ]);
    expect(response.headers.get('x-stormgate-target')).toBe(`backup/${BACKUP_MODEL}`);
    expect(g.seen.primary).toHaveLength(2);
    expect(g.seen.backup).toHaveLength(1);
  });

  it('a redacted_thinking block opens with its content: a cut after it is raised, not failed over', async () => {
    const g = await accounts(() =>
      sse([messageStart(), aev('content_block_start', { index: 0, content_block: { type: 'redacted_thinking', data: 'EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlx' } }), 50, { destroy: true }]),
    );
    await rejection(claude(g).messages.stream({ ...ask, thinking: { type: 'enabled', budget_tokens: 2048 } }).finalMessage());
    expect(g.seen.primary).toHaveLength(1);
    expect(g.seen.backup).toHaveLength(0);
    expect(await onlyLine(g)).toMatchObject({ streamEnd: 'cut', outcome: 'stream_error' });
  });

  it('a turn with no content at all (end_turn after a tool result) is an answer: passed on once, not retried, complete', async () => {
    const g = await accounts(() => sse([messageStart(), aev('ping'), stopDelta('end_turn', { output_tokens: 3 }), aev('message_stop')]));
    const msg = await claude(g).messages.stream(ask).finalMessage();
    expect(msg).toMatchObject({ content: [], stop_reason: 'end_turn', model: MODEL });
    expect(g.seen.primary).toHaveLength(1);
    expect(g.seen.backup).toHaveLength(0);
    expect(await onlyLine(g)).toMatchObject({ streamEnd: 'complete', outcome: 'success' });
  });
});

describe('error events before the first output, as the type they carry', () => {
  it("an overload event with Anthropic's request_id and details: null on every attempt: OverloadedError 529 in Anthropic's shape, x-should-retry false, each account asked maxAttempts times", async () => {
    const overloaded = () => sse([messageStart(), aev('ping'), overloadEvent]);
    const g = await accounts(overloaded, overloaded);
    const err = await rejection(claude(g).messages.stream(ask).finalMessage());
    expect(err).toBeInstanceOf(Anthropic.InternalServerError);
    expect(err.status).toBe(529);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect((err.error as { type?: string; error?: { type?: string } }).error?.type).toBe('overloaded_error');
    expect(g.seen.primary).toHaveLength(2);
    expect(g.seen.backup).toHaveLength(2);
  });

  it("an api_error event on a route whose retryOn leaves 500 out is the 500 it stands for: not retried, not failed over", async () => {
    const apiErrorEvent = aev('error', { error: { type: 'api_error', message: 'Internal server error' }, request_id: 'req_011CApi83' });
    const g = await accounts(() => sse([messageStart(), apiErrorEvent]), undefined, { route: { retry: { maxAttempts: 3, retryOn: [429, 503, 529, 'timeout'], backoff: { strategy: 'fixed', baseMs: 5 } } } });
    const err = await rejection(claude(g).messages.stream(ask).finalMessage());
    expect(err.status).toBe(500);
    expect((err.error as { error?: { type?: string } }).error?.type).toBe('api_error');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(g.seen.primary).toHaveLength(1);
    expect(g.seen.backup).toHaveLength(0);
  });

  it('a rate_limit_error event on a lone account is the 429 it stands for: retried, and after the retries a RateLimitError the SDK is not asked to repeat', async () => {
    const g = await lone(() => sse([messageStart(), aev('error', { error: { type: 'rate_limit_error', message: 'Number of request tokens has exceeded your per-minute rate limit' } })]));
    const err = await rejection(claude(g).messages.stream(ask).finalMessage());
    expect(err).toBeInstanceOf(Anthropic.RateLimitError);
    expect((err.error as { error?: { type?: string } }).error?.type).toBe('rate_limit_error');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(g.seen.primary).toHaveLength(2);
    expect(g.seen.primary![1]!.headers['x-retry-attempt']).toBe('1');
  });

  it('an error event of a type Anthropic does not document is a broken stream: the backup answers, marked a fallback', async () => {
    const g = await accounts(() => sse([messageStart(), aev('error', { error: { type: 'quantum_flux_error', message: 'flux' } })]));
    const { data: stream, response } = await claude(g).messages.stream(ask).withResponse();
    expect((await stream.finalMessage()).model).toBe(BACKUP_MODEL);
    expect(response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(g.seen.primary).toHaveLength(2);
  });
});

describe('rate limits', () => {
  it("a 429 whose retry-after is past maxWaitHintMs on a lone account: RateLimitError as Anthropic sent it, invited back; the next call is turned away in Anthropic's shape with nothing sent", async () => {
    const g = await lone(() =>
      anthropicError(429, 'rate_limit_error', 'This request would exceed the rate limit for your organization of 50 requests per minute.', {
        'retry-after': '30',
        'anthropic-ratelimit-requests-limit': '50',
        'anthropic-ratelimit-requests-remaining': '0',
        'anthropic-ratelimit-requests-reset': new Date(Date.now() + 30_000).toISOString(),
      }),
    );
    const err = await rejection(claude(g).messages.create(ask));
    expect(err).toBeInstanceOf(Anthropic.RateLimitError);
    expect(err.requestID).toBe('req_011CErr83');
    expect((err.error as { error?: { type?: string } }).error?.type).toBe('rate_limit_error');
    expect(err.headers?.get('x-should-retry')).toBe('true');
    expect(Number(err.headers?.get('retry-after'))).toBeGreaterThanOrEqual(29);
    expect(Number(err.headers?.get('retry-after'))).toBeLessThanOrEqual(38);
    expect([...(err.headers?.keys() ?? [])].filter((h) => h.startsWith('anthropic-'))).toEqual([]);
    expect(g.seen.primary).toHaveLength(1);

    const held = await rejection(claude(g).messages.create(ask));
    expect(held).toBeInstanceOf(Anthropic.RateLimitError);
    expect(held.error).toMatchObject({ type: 'error', error: { type: 'rate_limit_error', code: 'provider_held_off' } });
    expect(held.requestID).toBeTruthy();
    expect(held.headers?.get('x-should-retry')).toBe('true');
    expect(g.seen.primary).toHaveLength(1);
  });

  it('count_tokens through its own 429 with retry-after 1: waited out, answered once to the SDK with the account\'s request id', async () => {
    const g = await start(
      {
        primary: {
          family: 'anthropic',
          answer: (_b, n) => (n === 1 ? anthropicError(429, 'rate_limit_error', 'Rate limited', { 'retry-after': '1' }) : json(200, { input_tokens: 14 }, { 'request-id': 'req_011CCount83' })),
        },
      },
      [{ provider: 'primary' }],
      { path: '/v1/messages/count_tokens', route: { name: 'count' } },
    );
    const t0 = Date.now();
    const { data, response } = await claude(g).messages.countTokens({ model: MODEL, messages: ask.messages }).withResponse();
    expect(data.input_tokens).toBe(14);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(950);
    expect(response.headers.get('x-request-id')).toBe('req_011CCount83');
    expect(g.seen.primary).toHaveLength(2);
    expect(g.seen.primary![1]!.url).toBe('/v1/messages/count_tokens');
  });
});

describe('how a stream ended, the SDK at its default maxRetries', () => {
  it('a stream stalled after its first text, with the SDK at its default maxRetries: one error event the SDK raises, sent once, stalled', async () => {
    const g = await accounts(() => ({ ...sse([messageStart(), textOpen(), text('Tide ')]), hold: true }), undefined, {
      provider: { timeouts: { connectMs: 1_000, firstTokenMs: 5_000, idleMs: 800 } },
    });
    const err = await rejection(claude(g, 2).messages.stream(ask).finalMessage());
    expect(err.message).toMatch(/stream_interrupted|stall|idle/i);
    expect(g.seen.primary).toHaveLength(1);
    expect(g.seen.backup).toHaveLength(0);
    expect(await onlyLine(g)).toMatchObject({ streamEnd: 'stalled', outcome: 'stream_error' });
    expect(await streamEnds(g)).toEqual({ stalled: 1 });
  });

  it('a stream stopped after its stop_reason without message_stop: finalMessage() resolves, the gateway adds the end (done-added), a success', async () => {
    const g = await accounts(() => sse([messageStart(), textOpen(), text('Tide at six.'), stop(), stopDelta('end_turn', { output_tokens: 9 }), 50, { destroy: true }]));
    const { data: stream, response } = await claude(g, 2).messages.stream(ask).withResponse();
    const msg = await stream.finalMessage();
    expect(msg).toMatchObject({ content: [{ type: 'text', text: 'Tide at six.' }], stop_reason: 'end_turn', model: MODEL });
    expect(response.headers.get('x-stormgate-fallback')).toBeNull();
    expect(g.seen.primary).toHaveLength(1);
    expect(await onlyLine(g)).toMatchObject({ streamEnd: 'done-added', outcome: 'success', usage: { prompt: 9312, completion: 9 } });
    expect(await streamEnds(g)).toEqual({ 'done-added': 1 });
  });

  it("an agent that aborts after the first text: APIUserAbortError, client-gone, the tokens reported so far billed", async () => {
    const g = await accounts(() => ({ ...sse([messageStart(), textOpen(), text('Tide ')]), hold: true }));
    const stream = claude(g, 2).messages.stream(ask);
    stream.on('text', () => stream.abort());
    const err = await stream.finalMessage().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(Anthropic.APIUserAbortError);
    expect(await onlyLine(g)).toMatchObject({ clientGone: true, streamEnd: 'client-gone', outcome: 'client_gone', usage: { prompt: 9312, completion: 1 } });
    expect(await streamEnds(g)).toEqual({ 'client-gone': 1 });
    expect(await tokens(g)).toEqual({ [`primary/${MODEL} prompt`]: 9312, [`primary/${MODEL} completion`]: 1 });
    expect(g.seen.primary).toHaveLength(1);
    expect(g.seen.backup).toHaveLength(0);
  });
});
