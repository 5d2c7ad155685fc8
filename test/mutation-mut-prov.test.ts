// Mutation-testing gaps in providers/ and routing/: each test pins a behaviour a wrong change went unnoticed by.
import { createServer, type Server } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Pool } from 'undici';
import { requestWhole } from '../src/providers/whole-answer.ts';
import { AnswerCut } from '../src/providers/transport-errors.ts';
import { RequestAbort } from '../src/pipeline/request-abort.ts';
import { failedResponse, notAnAnswer } from '../src/providers/answer-shape.ts';
import { errorCodeOf, errorVerdict, httpOutcome } from '../src/providers/error-outcome.ts';
import { cutOutcome, transportOutcome } from '../src/providers/transport-errors.ts';
import { prepareUpstream } from '../src/providers/families.ts';
import { parseConfig } from '../src/config/load.ts';
import { errors } from 'undici';
import { AnthropicStreamTranslator, toAnthropicRequest, toAnthropicShape, toOpenAIError } from '../src/providers/anthropic/index.ts';
import { toFinishReason } from '../src/providers/anthropic/response.ts';
import { createRouter, globMatcher } from '../src/routing/router.ts';
import { MAX_LEARNED_MODELS, TargetKeys } from '../src/routing/target-keys.ts';
import { WeightedPicker } from '../src/routing/weighted.ts';

describe('requestWhole: caps and broken bodies', () => {
  let server: Server;
  let pool: Pool;
  beforeAll(async () => {
    server = createServer((req, res) => {
      req.resume();
      const url = req.url ?? '/';
      if (url === '/exact') return res.end('y'.repeat(100));
      if (url === '/big') {
        res.writeHead(200);
        for (let i = 0; i < 10; i++) res.write('x'.repeat(1_000));
        return res.end();
      }
      const cut = /^\/cut-(\d+)$/.exec(url);
      if (cut) {
        // Headers and part of the body, then the connection goes.
        res.writeHead(Number(cut[1]), { 'content-type': 'application/json', 'content-length': '100', 'retry-after': '7' });
        res.write('{"error":');
        setTimeout(() => res.socket?.destroy(), 20);
        return;
      }
      const hang = /^\/hang-(\d+)$/.exec(url);
      if (hang) {
        res.writeHead(Number(hang[1]), { 'content-type': 'application/json' });
        res.write('{"partial":');
        return; // never ends
      }
      res.writeHead(404).end();
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    pool = new Pool(`http://127.0.0.1:${(server.address() as { port: number }).port}`, { connections: 4 });
  });
  afterAll(async () => {
    await pool.destroy();
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
  const get = (path: string, signal = new RequestAbort().signal, maxBytes = 1_000_000) =>
    requestWhole(pool, { path, method: 'GET', headers: {}, body: '', signal, maxBytes: () => maxBytes });

  it('takes a body of exactly maxBytes as whole', async () => {
    const a = await get('/exact', undefined, 100);
    expect(a.whole).toBe(true);
    expect(a.body.toString()).toBe('y'.repeat(100));
  });

  it('keeps the bytes of the chunk the cap falls in, not zeros', async () => {
    const a = await get('/big', undefined, 2_500);
    expect(a.whole).toBe(false);
    expect(a.body.toString()).toBe('x'.repeat(2_500));
  });

  it("resolves an error status whose body broke off with its status and headers (a 429's retry-after)", async () => {
    const a = await get('/cut-429');
    expect(a).toMatchObject({ statusCode: 429, whole: false });
    expect(a.headers['retry-after']).toBe('7');
    const r = await get('/cut-302');
    expect(r).toMatchObject({ statusCode: 302, whole: false });
  });

  it('rejects a 2xx whose body broke off with AnswerCut', async () => {
    await expect(get('/cut-200')).rejects.toBeInstanceOf(AnswerCut);
  });

  it("rejects with the signal's own reason (not an AnswerCut, not an answer) when it aborts mid-body", async () => {
    for (const status of [200, 500]) {
      const abort = new RequestAbort();
      const reason = new Error(`deadline ${status}`);
      const pending = get(`/hang-${status}`, abort.signal);
      setTimeout(() => abort.abort(reason), 50);
      await expect(pending).rejects.toBe(reason);
    }
  });
});

const judge = (api: Parameters<typeof notAnAnswer>[0]['api'], body: string, ownFamily = true, contentType = 'application/json') =>
  notAnAnswer({ api, stream: false, contentType, ownFamily }, Buffer.from(body))?.detail;

describe('notAnAnswer: the bytes', () => {
  it('takes any JSON content-type, vendor types included', () => {
    expect(judge('chat', '{"choices":[{"index":0}]}', true, 'application/vnd.openai+json; charset=utf-8')).toBeUndefined();
  });

  it("refuses another family's body that does not end its object", () => {
    expect(judge('chat', '{"type":"message","content":[]', false)).toMatch(/not a whole JSON object/);
  });

  it('reads strings with escaped quotes and escaped backslashes to their real end', () => {
    // Two escaped quotes in one string, brackets between them.
    expect(judge('chat', String.raw`{"choices":[{"text":"a\"}]\"{"}]}`)).toBeUndefined();
    expect(judge('chat', String.raw`{"choices":[{"text":"a\"}]\"{"}]`)).toMatch(/cut before its end/);
    // A string ending in an escaped backslash: its quote closes it.
    expect(judge('chat', String.raw`{"choices":[{"text":"a\\"}]}`)).toBeUndefined();
    expect(judge('chat', String.raw`{"choices":[{"text":"a\\"}]`)).toMatch(/cut before its end/);
  });

  it('finds the key after the same word as a value, and judges it', () => {
    expect(judge('chat', '{"model":"choices","choices":null,"error":{"message":"x"}}')).toMatch(/2xx with an error/);
    expect(judge('chat', '{"model":"choices","choices":[]}')).toMatch(/choices are empty/);
  });
});

describe('failedResponse', () => {
  it('reads only a Responses answer whose own status is failed', () => {
    const failed = Buffer.from('{"object":"response","status":"failed","output":[],"error":{"code":"server_error"}}');
    expect(failedResponse('responses', failed)).toMatchObject({ status: 'failed' });
    expect(failedResponse('chat', failed)).toBeUndefined();
    expect(failedResponse('responses', Buffer.from('{"status":"completed","output":[{"type":"web_search_call","status":"failed"}]}'))).toBeUndefined();
  });
});

describe('errorCodeOf', () => {
  const code = (status: number, error: unknown) => errorCodeOf(status, Buffer.from(JSON.stringify({ error })));
  it('takes the type over a code that is only digits or the type again', () => {
    expect(code(429, { code: '429', type: 'insufficient_quota' })).toBe('insufficient_quota');
    expect(code(400, { code: 'invalid_request_error', type: 'invalid_request_error', message: "This model's maximum context length is 8192 tokens" })).toBe('context_length_exceeded');
  });
  it('reads a context-length message only on a 4xx', () => {
    expect(code(500, { message: "This model's maximum context length is 8192 tokens", type: 'server_error' })).toBe('server_error');
  });
});

describe('httpOutcome', () => {
  it("takes the body's RetryInfo when the headers give no wait", () => {
    const body = Buffer.from(JSON.stringify({ error: { code: 429, status: 'RESOURCE_EXHAUSTED', details: [{ '@type': 'type.googleapis.com/google.rpc.RetryInfo', retryDelay: '3s' }] } }));
    const o = httpOutcome(429, {}, body, 0);
    expect(o).toMatchObject({ kind: 'http', status: 429 });
    expect(o.kind === 'http' && o.hint?.delayMs).toBe(3_000);
  });

  it("reads the token limits' reset as a 429's wait only for a rate limit, not for an account's refusal", () => {
    // OpenAI's headers with room left in every limit: a rate-limited 429 waits for the token limit's reset; a spent
    // quota (insufficient_quota) waits for no reset, and an upstream_auth_error must carry no retry-after.
    const headers = { 'x-ratelimit-remaining-requests': '499', 'x-ratelimit-remaining-tokens': '29000', 'x-ratelimit-reset-requests': '120ms', 'x-ratelimit-reset-tokens': '2s' };
    const body = (code: string) => Buffer.from(JSON.stringify({ error: { message: 'no', type: code, code } }));
    const hintOf = (o: ReturnType<typeof httpOutcome>) => (o.kind === 'http' ? o.hint : undefined);
    expect(hintOf(httpOutcome(429, headers, body('rate_limit_exceeded'), 0))?.delayMs).toBe(2_000);
    for (const code of ['insufficient_quota', 'billing_not_active', 'access_terminated']) expect(hintOf(httpOutcome(429, headers, body(code), 0))).toBeUndefined();
  });

  it("prefers the body's RetryInfo, a wait the provider said, over the token limits' reset, a guess", () => {
    const headers = { 'x-ratelimit-remaining-requests': '499', 'x-ratelimit-remaining-tokens': '1200', 'x-ratelimit-reset-tokens': '2s' };
    const body = Buffer.from(JSON.stringify({ error: { code: 429, status: 'RESOURCE_EXHAUSTED', details: [{ '@type': 'type.googleapis.com/google.rpc.RetryInfo', retryDelay: '7s' }] } }));
    const o = httpOutcome(429, headers, body, 0);
    expect(o.kind === 'http' && o.hint?.delayMs).toBe(7_000);
  });
});

describe('errorVerdict', () => {
  const err = (e: Partial<{ message: string; code: string; type: string; param: string | null }>) => ({ message: undefined, code: undefined, type: undefined, param: null, ...e });
  it('reads a rate-limit code inside a 2xx as a 429, answered with a rate_limit_error', () => {
    const v = errorVerdict(err({ code: 'rate_limit_exceeded', message: 'slow down' }), 'the stream failed', '');
    expect(v.outcome).toMatchObject({ kind: 'http', status: 429, errorCode: 'rate_limit_exceeded' });
    expect(JSON.parse(v.answer!.toString()).error).toEqual({ message: 'slow down', type: 'rate_limit_error', param: null, code: 'rate_limit_exceeded' });
  });
  it('reads a code that blames the request (an unusable image) as a 400', () => {
    const v = errorVerdict(err({ code: 'invalid_image', message: 'bad image' }), 'the stream failed', '');
    expect(v.outcome).toMatchObject({ kind: 'http', status: 400, errorCode: 'invalid_image' });
    expect(JSON.parse(v.answer!.toString()).error.type).toBe('invalid_request_error');
  });
  it('reads an over-long prompt from the message when no code names it', () => {
    const v = errorVerdict(err({ message: "This model's maximum context length is 8192 tokens" }), 'the stream failed', '');
    expect(v.outcome).toMatchObject({ kind: 'http', status: 400, errorCode: 'context_length_exceeded' });
  });
  it("keeps the provider's code printable and short in the failure", () => {
    const v = errorVerdict(err({ code: 'x\u0000'.padEnd(100, 'y') }), 'the stream failed', '');
    expect(v.failure).toBe(`the stream failed: x?${'y'.repeat(62)}...`);
    expect(v.outcome).toBeUndefined();
  });
});

describe('transport outcomes', () => {
  const coded = (code: string) => Object.assign(new Error(code), { code });
  it('keeps what is not a lost connection when it cuts an answer', () => {
    expect(cutOutcome(coded('UND_ERR_INVALID_ARG'), 'cut')).toEqual({ kind: 'internal', code: 'UND_ERR_INVALID_ARG' });
    expect(cutOutcome(coded('UND_ERR_BODY_TIMEOUT'), 'cut')).toEqual({ kind: 'timeout', phase: 'idle' });
    expect(cutOutcome(coded('ECONNRESET'), 'cut')).toEqual({ kind: 'bad-stream', detail: 'cut (ECONNRESET)', ran: true });
  });
  it("reads brotli's and zlib's codes as an answer that does not decode", () => {
    for (const code of ['ERR__ERROR_FORMAT_PADDING_1', 'Z_DATA_ERROR', 'ERR_BROTLI_DECOMPRESSION_FAILED']) {
      expect(transportOutcome(coded(code))).toMatchObject({ kind: 'bad-stream', ran: true });
    }
  });
  it('reads a parser error reported as the cause of another as an answer that is not HTTP', () => {
    expect(transportOutcome(new Error('wrapped', { cause: new errors.HTTPParserError('Response does not match the HTTP/1.1 protocol') }))).toMatchObject({ kind: 'bad-stream', ran: true });
  });
  it('reads a parser error that carries an llhttp code (HPE_*, once undici names it) as an answer that is not HTTP', () => {
    const named = Object.assign(new errors.HTTPParserError('Response does not match the HTTP/1.1 protocol'), { code: 'HPE_INVALID_CONSTANT' });
    expect(transportOutcome(named)).toMatchObject({ kind: 'bad-stream', ran: true });
  });
  it('refuses to send a header with a line break as the gateway\'s own fault', () => {
    expect(transportOutcome(coded('ERR_INVALID_CHAR'))).toEqual({ kind: 'internal', code: 'ERR_INVALID_CHAR' });
  });
});

describe('prepareUpstream', () => {
  const config = parseConfig(
    `providers:
  oa: { family: openai, baseUrl: "https://api.example.com/v1", apiKey: k }
  az: { family: azure-openai, baseUrl: "https://res.openai.azure.com", apiKey: az-key, apiVersion: "2024-10-21" }
  an: { family: anthropic, baseUrl: "https://api.anthropic.com/v1", apiKey: an-key }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: oa } ]
`,
    'test.yaml',
  );
  const prep = (provider: string, api: Parameters<typeof prepareUpstream>[1]['api'], clientPath: string, raw: string, model: string | undefined, query = '') => {
    const json = JSON.parse(raw) as Record<string, unknown>;
    return prepareUpstream(config.providers[provider]!, { api, clientPath, query, json, rawBody: Buffer.from(raw), model });
  };
  it("passes the client's bytes on unchanged when the model stays", () => {
    const raw = '{"model":"gpt-4o","temperature":1.0,"messages":[]}';
    const p = prep('oa', 'chat', '/v1/chat/completions', raw, 'gpt-4o');
    expect(p.ok && p.request.body.toString()).toBe(raw);
  });
  it('strips only a whole /v1 segment from the client path', () => {
    const p = prep('oa', 'other', '/v1beta/models', '{}', undefined);
    expect(p.ok && p.request.path).toBe('/v1/v1beta/models');
    const q = prep('oa', 'chat', '/v1/chat/completions', '{"model":"m"}', 'm');
    expect(q.ok && q.request.path).toBe('/v1/chat/completions');
  });
  it("refuses an azure deployment named '.', and keeps one api-version, the provider's", () => {
    expect(prep('az', 'chat', '/v1/chat/completions', '{"model":"."}', '.')).toMatchObject({ ok: false, param: 'model' });
    const p = prep('az', 'chat', '/v1/chat/completions', '{"model":"d"}', 'd', '?api-version=1999-01-01');
    expect(p.ok && p.request.path).toBe('/openai/deployments/d/chat/completions?api-version=2024-10-21');
  });
  it('sends a translated chat request to /v1/messages once, whether or not the base URL ends in /v1', () => {
    const p = prep('an', 'chat', '/v1/chat/completions', '{"model":"claude","messages":[{"role":"user","content":"hi"}]}', 'claude');
    expect(p.ok && p.request.path).toBe('/v1/messages');
  });
  it('reads an Anthropic stream as having no usage before message_start, and refuses a body that is not a message', () => {
    const p = prep('an', 'chat', '/v1/chat/completions', '{"model":"claude","messages":[{"role":"user","content":"hi"}]}', 'claude');
    if (!p.ok) throw new Error(p.reason);
    const t = p.request.translator!;
    expect(t.stream().usage()).toBeUndefined();
    expect(() => t.body(Buffer.from('{"content":[]}'))).toThrow(/not an Anthropic message/);
    // An error event names a status only with a type Anthropic documents.
    const meaning = p.request.errorEventMeaning!;
    expect(meaning(Buffer.from('{"type":"error","error":{"type":"overloaded_error","message":"busy"}}'))?.status).toBe(529);
    expect(meaning(Buffer.from('{"type":"error","error":{"type":"mystery_error","message":"?"}}'))).toBeUndefined();
  });
});

describe('toAnthropicRequest: fields read by value', () => {
  const msgs = [{ role: 'user', content: 'hi' }];
  const tr = (extra: Record<string, unknown>) => toAnthropicRequest({ model: 'gpt-4o', messages: msgs, ...extra } as never, { model: 'claude', defaultMaxTokens: 1024 });
  it('refuses any top_logprobs above 0, and n or max_tokens that are not integers', () => {
    expect(tr({ top_logprobs: 1 })).toMatchObject({ ok: false, param: 'logprobs' });
    expect(tr({ n: 1.5 })).toMatchObject({ ok: false, param: 'n', reason: 'n must be a positive integer' });
    expect(tr({ max_tokens: 1.5 })).toMatchObject({ ok: false, param: 'max_tokens' });
  });
  it('asks for a usage chunk only for a stream', () => {
    expect(tr({ stream_options: { include_usage: true } })).toMatchObject({ ok: true, includeUsage: false });
    expect(tr({ stream: true, stream_options: { include_usage: true } })).toMatchObject({ ok: true, includeUsage: true });
  });
  it('sends safety_identifier over user, and hashes an id shorter than a digest', () => {
    const both = tr({ user: 'u@example.com', safety_identifier: 'a'.repeat(32) });
    expect(both.ok && both.body.metadata).toEqual({ user_id: 'a'.repeat(32) });
    const short = tr({ user: 'abcdef0123456789' });
    expect(short.ok && short.body.metadata?.user_id).toMatch(/^[0-9a-f]{64}$/);
  });
});

describe('toOpenAIError', () => {
  it('reads account problems only from an invalid_request_error', () => {
    expect(toOpenAIError(400, { type: 'error', error: { type: 'invalid_request_error', message: 'Your credit balance is too low to access the Anthropic API.' } }).status).toBe(402);
    expect(toOpenAIError(500, { type: 'error', error: { type: 'api_error', message: 'Your credit balance is too low' } }).status).toBe(500);
  });
  it('reads an unknown 4xx without a type as the request\'s fault, and an unknown 5xx as the server\'s', () => {
    expect(toOpenAIError(418, 'teapot')).toMatchObject({ status: 418, body: { error: { type: 'invalid_request_error' } } });
    expect(toOpenAIError(599, 'gone')).toMatchObject({ status: 599, body: { error: { type: 'server_error' } } });
  });
});

describe('Anthropic answers read in OpenAI terms', () => {
  it('gives an error event inside a 200 the status its type stands for', () => {
    expect(toOpenAIError(200, { type: 'error', error: { type: 'overloaded_error', message: 'busy' } }).status).toBe(529);
  });
  it('reads an over-long prompt only from an invalid_request_error', () => {
    expect(toOpenAIError(500, { error: { type: 'api_error', message: 'prompt is too long' } }).body.error.code).toBeNull();
    expect(toOpenAIError(400, { error: { type: 'invalid_request_error', message: 'prompt is too long: 215000 tokens > 200000 maximum' } }).body.error.code).toBe('context_length_exceeded');
  });
  it("names the Anthropic error type a status stands for before the body's own type", () => {
    const body = { error: { message: 'busy', type: 'server_error', param: null, code: null } };
    expect(toAnthropicShape(529, body as never).error.type).toBe('overloaded_error');
  });
  it("reads a stop_reason named like an Object property as a plain stop", () => {
    expect(toFinishReason('constructor')).toBe('stop');
  });
  it('sends one finish chunk for two message_deltas, and a tool input given whole at its start', () => {
    const t = new AnthropicStreamTranslator({ model: 'claude', includeUsage: false, id: 'x', created: 1 });
    const push = (type: string, data: Record<string, unknown>) => t.push({ event: type, data: JSON.stringify({ type, ...data }) });
    const out = [
      ...push('message_start', { message: { id: 'm', model: 'claude', usage: {} } }),
      ...push('content_block_start', { index: 0, content_block: { type: 'tool_use', id: 't1', name: 'f', input: { a: 1 } } }),
      ...push('content_block_stop', { index: 0 }),
      ...push('message_delta', { delta: { stop_reason: 'tool_use' }, usage: {} }),
      ...push('message_delta', { delta: { stop_reason: 'end_turn' }, usage: {} }),
      ...push('message_stop', {}),
    ];
    const chunks = out.filter((e) => e.startsWith('data: {')).map((e) => JSON.parse(e.slice(6)) as { choices: { delta: { tool_calls?: { function: { arguments?: string } }[] }; finish_reason: string | null }[] });
    expect(chunks.filter((c) => c.choices[0]!.finish_reason !== null).map((c) => c.choices[0]!.finish_reason)).toEqual(['tool_calls']);
    expect(chunks.flatMap((c) => c.choices[0]!.delta.tool_calls ?? []).map((tc) => tc.function.arguments).join('')).toBe('{"a":1}');
  });
});

describe('chunk ids', () => {
  it("keeps the id it was given over the message's", () => {
    const t = new AnthropicStreamTranslator({ model: 'claude', includeUsage: false, id: 'given', created: 1 });
    const [first] = t.push({ event: 'message_start', data: JSON.stringify({ type: 'message_start', message: { id: 'msg_1', model: 'claude', usage: {} } }) });
    expect(JSON.parse(first!.slice(6)).id).toBe('given');
  });
});

describe('routing', () => {
  it('does not let a middle part of a glob overlap its last part', () => {
    expect(globMatcher('a*bc*c')('abc')).toBe(false);
    expect(globMatcher('a*bc*c')('abcc')).toBe(true);
  });
  const config = parseConfig(
    `providers:
  oa: { family: openai, baseUrl: "https://api.example.com/v1", apiKey: k }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: oa, model: pinned } ]
`,
    'test.yaml',
  );
  it("sends the target's model over the client's", () => {
    const m = createRouter(config).match('/v1/chat/completions', 'asked');
    if (!('route' in m)) throw new Error('no route');
    expect(m.route.upstreamModel(config.routes[0]!.targets[0]!, 'asked')).toBe('pinned');
  });
  it("never spends a learning place on the name 'other'", () => {
    const keys = new TargetKeys(config);
    expect(keys.key('oa', 'other')).toBe('oa/other');
    for (let i = 0; i < MAX_LEARNED_MODELS; i++) expect(keys.key('oa', `m-${i}`)).toBe(`oa/m-${i}`);
  });
  it('forgets the oldest refusal past its bound, so that name may be learned again', () => {
    const keys = new TargetKeys(config);
    for (let i = 0; i <= 1_024; i++) {
      keys.key('oa', `gone-${i}`);
      keys.forget('oa', `gone-${i}`);
    }
    expect(keys.key('oa', 'gone-0')).toBe('oa/gone-0');
    expect(keys.key('oa', 'gone-1')).toBe('oa/other');
  });
  it('counts a model named only in a breaker override as configured, never learned', () => {
    const withOverride = parseConfig(
      `providers:
  oa: { family: openai, baseUrl: "https://api.example.com/v1", apiKey: k, breaker: { models: { special: { openS: 5 } } } }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: oa } ]
`,
      'test.yaml',
    );
    const keys = new TargetKeys(withOverride);
    for (let i = 0; i < MAX_LEARNED_MODELS; i++) keys.key('oa', `m-${i}`);
    expect(keys.key('oa', 'special')).toBe('oa/special');
  });
  it('breaks a tie for the first in config order, and skips an unavailable target', () => {
    const targets = [{ key: 'a', weight: 1 }, { key: 'b', weight: 1 }];
    expect(new WeightedPicker(() => true).order('r', targets).map((t) => t.key)).toEqual(['a', 'b']);
    const noA = new WeightedPicker((t) => t.key !== 'a');
    expect([1, 2, 3].map(() => noA.order('r', targets)[0]!.key)).toEqual(['b', 'b', 'b']);
  });
  it('keeps every target, in config order, when none is available', () => {
    const picker = new WeightedPicker(() => false);
    const targets = [{ key: 'a', weight: 1 }, { key: 'b', weight: 1 }];
    expect(picker.order('r', targets)).toEqual(targets);
  });
});
