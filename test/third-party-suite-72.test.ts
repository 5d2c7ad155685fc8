// Third-party failure-scenario suite 72: what Anthropic's Messages API sends today (checked against its docs: the
// stop_reason values end_turn, max_tokens, stop_sequence, tool_use, pause_turn, refusal and
// model_context_window_exceeded; a streaming classifier's refusal, which may come with no content at all; server tools'
// `server_tool_use` and `web_search_tool_result` blocks; `citations_delta` and `signature_delta`; `redacted_thinking`;
// pings; `message_delta`'s cumulative usage; 413 `request_too_large`; 529 `overloaded_error`, as a status and as an
// `event: error`; the `request-id` and `x-should-retry` headers) and how the gateway carries it to clients of both
// families, driven by the official SDKs (@anthropic-ai/sdk on /v1/messages, openai on /v1/chat/completions, answered
// by an Anthropic target through the translation) over real HTTP against scripted upstreams. On what the earlier
// suites (anthropic-*, review-anth*, cross-family-agents, families, translation-fuzz, third-party-suite-68) left out:
//  1. a web-search turn that pauses (`pause_turn`), streamed and whole: the native client gets every block as it came
//     (server tool input, result, cited text, the stop reason), the translated client the cited text and `stop`;
//  2. a classifier's refusal with no content: answered (never retried, never failed over around the safety decision),
//     `refusal` on the native path, `content_filter` for an OpenAI client, streamed and whole;
//  3. `model_context_window_exceeded` as `length` for an OpenAI client; a stream stopped after its stop reason
//     without message_stop is whole; thinking signed (`signature_delta`) and redacted blocks reach the native client;
//  4. errors: 413 request_too_large and a 529 with Anthropic's own `x-should-retry: true` and `request-id`, in each
//     family's shape, with the gateway's `x-should-retry`, the provider's key never echoed; every documented error
//     type (409 `conflict_error` included) reaches the Anthropic SDK as sent, with the body's `request_id`; pings then
//     an overload event before the first output fail over; one after it is never a clean end.
// Found here: Anthropic's 409 `conflict_error` (documented in its errors page beside 413 `request_too_large`) was
// missing from the gateway's table of Anthropic error types, so on /v1/messages it reached the Anthropic SDK rewritten
// as `invalid_request_error` (src/providers/anthropic/response.ts ERRORS).
// Bounds are generous: a loaded 2-core machine.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { sdkError } from './helpers/openai-error.ts';
import { completion, json, type Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';

const startUpstreams = useScriptedUpstreams();

const MODEL = 'claude-sonnet-4-6';
/** An Anthropic SSE event, named and typed as the Messages API frames it. */
const aev = (type: string, fields: Record<string, unknown> = {}) => `event: ${type}\ndata: ${JSON.stringify({ type, ...fields })}\n\n`;
const start = (usage: Record<string, unknown> = { input_tokens: 25, output_tokens: 1 }) =>
  aev('message_start', { message: { id: 'msg_01Sx', type: 'message', role: 'assistant', model: MODEL, content: [], stop_reason: null, stop_sequence: null, usage } });
const stopDelta = (stop_reason: string, usage: Record<string, unknown> = { output_tokens: 40 }) => aev('message_delta', { delta: { stop_reason, stop_sequence: null }, usage });
const anthropicSse = (steps: Script['steps']): Script => ({ headers: { 'content-type': 'text/event-stream', 'request-id': 'req_011CStream' }, steps });

/** Anthropic's web search, paused after its first search (the documented `pause_turn`), with cited text. */
const citation = { type: 'web_search_result_location', url: 'https://example.com/tides', title: 'Tides', encrypted_index: 'Eo8BCioIBxgC', cited_text: 'High tide is at 6 am.' };
const searchBlocks = [
  { type: 'server_tool_use', id: 'srvtoolu_01A', name: 'web_search', input: { query: 'tides today' } },
  { type: 'web_search_tool_result', tool_use_id: 'srvtoolu_01A', content: [{ type: 'web_search_result', url: 'https://example.com/tides', title: 'Tides', encrypted_content: 'EqgfCioIARgB', page_age: null }] },
  { type: 'text', text: 'High tide is at 6 am.', citations: [citation] },
];
const pausedSearchStream = anthropicSse([
  start(),
  aev('ping'),
  aev('content_block_start', { index: 0, content_block: { type: 'server_tool_use', id: 'srvtoolu_01A', name: 'web_search', input: {} } }),
  aev('content_block_delta', { index: 0, delta: { type: 'input_json_delta', partial_json: '{"query": "tid' } }),
  aev('content_block_delta', { index: 0, delta: { type: 'input_json_delta', partial_json: 'es today"}' } }),
  aev('content_block_stop', { index: 0 }),
  aev('content_block_start', { index: 1, content_block: searchBlocks[1] }),
  aev('content_block_stop', { index: 1 }),
  aev('content_block_start', { index: 2, content_block: { type: 'text', text: '', citations: [] } }),
  aev('content_block_delta', { index: 2, delta: { type: 'citations_delta', citation } }),
  aev('content_block_delta', { index: 2, delta: { type: 'text_delta', text: 'High tide ' } }),
  aev('content_block_delta', { index: 2, delta: { type: 'text_delta', text: 'is at 6 am.' } }),
  aev('content_block_stop', { index: 2 }),
  stopDelta('pause_turn', { input_tokens: 25, output_tokens: 40, server_tool_use: { web_search_requests: 1 } }),
  aev('message_stop'),
]);
const pausedSearchWhole = json(200, {
  id: 'msg_01Sx', type: 'message', role: 'assistant', model: MODEL, content: searchBlocks, stop_reason: 'pause_turn', stop_sequence: null,
  usage: { input_tokens: 25, output_tokens: 40, server_tool_use: { web_search_requests: 1 } },
}, { 'request-id': 'req_011CWhole' });

/** A streaming classifier's refusal before any text: no content block at all (Anthropic's "Streaming refusals"). */
const emptyRefusalStream = anthropicSse([start(), aev('ping'), stopDelta('refusal', { output_tokens: 0 }), aev('message_stop')]);
const emptyRefusalWhole = json(200, {
  id: 'msg_01Rf', type: 'message', role: 'assistant', model: MODEL, content: [], stop_reason: 'refusal', stop_sequence: null, usage: { input_tokens: 25, output_tokens: 0 },
});

const claude = (url: string) => new Anthropic({ baseURL: url, apiKey: 'client-key', maxRetries: 0 });
const ask = { model: MODEL, max_tokens: 1024, messages: [{ role: 'user' as const, content: 'When is high tide?' }] };
const chatAsk = (model: string) => ({ model, messages: [{ role: 'user' as const, content: 'When is high tide?' }] });
const openaiOk = () => completion('from openai', 'gpt-4o');
const openai503 = () => json(503, { error: { message: 'The server is overloaded', type: 'server_error', param: null, code: null } });

/** Reads an openai SDK stream to its end: its chunks, or the error it raised. */
async function readChat(stream: AsyncIterable<OpenAI.Chat.Completions.ChatCompletionChunk>) {
  const chunks: OpenAI.Chat.Completions.ChatCompletionChunk[] = [];
  let error: unknown;
  try {
    for await (const c of stream) chunks.push(c);
  } catch (e) {
    error = e;
  }
  const text = chunks.map((c) => c.choices[0]?.delta.content ?? '').join('');
  const finish = chunks.flatMap((c) => (c.choices[0]?.finish_reason ? [c.choices[0].finish_reason] : []));
  return { chunks, error, text, finish, usage: chunks.find((c) => c.usage)?.usage };
}

describe('a web search turn that pauses (pause_turn), with server tool blocks and citations', () => {
  it('native /v1/messages, streamed: finalMessage() has every block as Anthropic sent it, the cited text and pause_turn', async () => {
    const g = await startUpstreams({ an: { family: 'anthropic', answer: () => pausedSearchStream }, ab: { family: 'anthropic', answer: () => pausedSearchStream } }, [{ provider: 'an' }, { provider: 'ab' }], { path: '/v1/messages' });
    const stream = claude(g.s.url).messages.stream(ask);
    const msg = await stream.finalMessage();
    expect(msg.stop_reason).toBe('pause_turn');
    expect(msg.content.map((b) => b.type)).toEqual(['server_tool_use', 'web_search_tool_result', 'text']);
    expect((msg.content[0] as { input: unknown }).input).toEqual({ query: 'tides today' });
    const text = msg.content[2] as Anthropic.TextBlock;
    expect(text.text).toBe('High tide is at 6 am.');
    expect(text.citations).toEqual([citation]);
    expect(msg.usage.output_tokens).toBe(40);
    expect(g.seen.an).toHaveLength(1);
    expect(g.seen.ab).toHaveLength(0);
  });

  it('native /v1/messages, whole: the message as Anthropic sent it', async () => {
    const g = await startUpstreams({ an: { family: 'anthropic', answer: () => pausedSearchWhole } }, [{ provider: 'an' }], { path: '/v1/messages' });
    const { data, response } = await claude(g.s.url).messages.create(ask).withResponse();
    expect(data.stop_reason).toBe('pause_turn');
    expect(data.content).toEqual(searchBlocks);
    expect(response.headers.get('request-id')).toBe('req_011CWhole');
  });

  it('an OpenAI client failed over to Anthropic, streamed: the cited text, finish_reason stop, usage from message_delta, no error', async () => {
    const g = await startUpstreams(
      { oa: openai503, an: { family: 'anthropic', answer: () => pausedSearchStream } },
      [{ provider: 'oa' }, { provider: 'an', model: MODEL }],
      { route: { retry: { maxAttempts: 1 } } },
    );
    const { data: stream, response } = await g.client.chat.completions.create({ ...chatAsk('gpt-4o'), stream: true, stream_options: { include_usage: true } }).withResponse();
    expect(response.headers.get('x-stormgate-fallback')).toBeTruthy();
    const r = await readChat(stream);
    expect(r.error).toBeUndefined();
    expect(r.text).toBe('High tide is at 6 am.');
    expect(r.finish).toEqual(['stop']);
    // No tool call for the server tool: it has no chat completions form, and the client defined no such tool.
    expect(r.chunks.some((c) => c.choices[0]?.delta.tool_calls)).toBe(false);
    expect(r.usage).toMatchObject({ prompt_tokens: 25, completion_tokens: 40, total_tokens: 65 });
  });

  it('an OpenAI client, whole: the cited text and finish_reason stop, no tool_calls', async () => {
    const g = await startUpstreams({ oa: openai503, an: { family: 'anthropic', answer: () => pausedSearchWhole } }, [{ provider: 'oa' }, { provider: 'an', model: MODEL }], { route: { retry: { maxAttempts: 1 } } });
    const c = await g.client.chat.completions.create(chatAsk('gpt-4o'));
    expect(c.choices[0]?.message.content).toBe('High tide is at 6 am.');
    expect(c.choices[0]?.message.tool_calls).toBeUndefined();
    expect(c.choices[0]?.finish_reason).toBe('stop');
  });
});

describe("a streaming classifier's refusal with no content (stop_reason refusal, no block)", () => {
  it('native, streamed: passed on untouched (refusal, no content), the backup account never asked', async () => {
    const g = await startUpstreams({ an: { family: 'anthropic', answer: () => emptyRefusalStream }, ab: { family: 'anthropic', answer: () => pausedSearchStream } }, [{ provider: 'an' }, { provider: 'ab' }], { path: '/v1/messages' });
    const msg = await claude(g.s.url).messages.stream(ask).finalMessage();
    expect(msg.stop_reason).toBe('refusal');
    expect(msg.content).toEqual([]);
    expect(g.seen.an).toHaveLength(1);
    expect(g.seen.ab).toHaveLength(0);
  });

  it('native, whole: passed on untouched', async () => {
    const g = await startUpstreams({ an: { family: 'anthropic', answer: () => emptyRefusalWhole }, ab: { family: 'anthropic', answer: () => pausedSearchWhole } }, [{ provider: 'an' }, { provider: 'ab' }], { path: '/v1/messages' });
    const msg = await claude(g.s.url).messages.create(ask);
    expect(msg.stop_reason).toBe('refusal');
    expect(g.seen.ab).toHaveLength(0);
  });

  it('an OpenAI client answered by Anthropic, streamed: finish_reason content_filter, no text, never failed over to the OpenAI backup', async () => {
    const g = await startUpstreams({ an: { family: 'anthropic', answer: () => emptyRefusalStream }, oa: openaiOk }, [{ provider: 'an', model: MODEL }, { provider: 'oa', model: 'gpt-4o' }], {});
    const r = await readChat(await g.client.chat.completions.create({ ...chatAsk('claude'), stream: true }));
    expect(r.error).toBeUndefined();
    expect(r.finish).toEqual(['content_filter']);
    expect(r.text).toBe('');
    expect(g.seen.an).toHaveLength(1);
    expect(g.seen.oa).toHaveLength(0);
  });

  it('an OpenAI client, whole: finish_reason content_filter, content null, never failed over', async () => {
    const g = await startUpstreams({ an: { family: 'anthropic', answer: () => emptyRefusalWhole }, oa: openaiOk }, [{ provider: 'an', model: MODEL }, { provider: 'oa', model: 'gpt-4o' }], {});
    const c = await g.client.chat.completions.create(chatAsk('claude'));
    expect(c.choices[0]?.finish_reason).toBe('content_filter');
    expect(c.choices[0]?.message.content).toBeNull();
    expect(g.seen.oa).toHaveLength(0);
  });
});

describe('other stop reasons and block types', () => {
  const windowStream = anthropicSse([
    start(),
    aev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
    aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'The answer is long' } }),
    aev('content_block_stop', { index: 0 }),
    stopDelta('model_context_window_exceeded'),
    aev('message_stop'),
  ]);

  it('model_context_window_exceeded reaches an OpenAI client as length (streamed and whole), the native client untouched', async () => {
    const whole = json(200, { id: 'msg_01W', type: 'message', role: 'assistant', model: MODEL, content: [{ type: 'text', text: 'The answer is long' }], stop_reason: 'model_context_window_exceeded', stop_sequence: null, usage: { input_tokens: 25, output_tokens: 40 } });
    const g = await startUpstreams({ an: { family: 'anthropic', answer: (b) => (b.stream ? windowStream : whole) } }, [{ provider: 'an', model: MODEL }], {});
    const r = await readChat(await g.client.chat.completions.create({ ...chatAsk('claude'), stream: true }));
    expect(r.error).toBeUndefined();
    expect(r.finish).toEqual(['length']);
    const c = await g.client.chat.completions.create(chatAsk('claude'));
    expect(c.choices[0]?.finish_reason).toBe('length');

    const n = await startUpstreams({ an: { family: 'anthropic', answer: () => windowStream } }, [{ provider: 'an' }], { path: '/v1/messages' });
    const msg = await claude(n.s.url).messages.stream(ask).finalMessage();
    expect(msg.stop_reason).toBe('model_context_window_exceeded');
    expect(msg.content).toMatchObject([{ type: 'text', text: 'The answer is long' }]);
  });

  it('a stream that stopped (max_tokens) without message_stop ends whole for both clients: length, and max_tokens', async () => {
    const noStop = anthropicSse([
      start(),
      aev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
      aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Cut by the limit' } }),
      aev('content_block_stop', { index: 0 }),
      stopDelta('max_tokens'),
    ]);
    const g = await startUpstreams({ an: { family: 'anthropic', answer: () => noStop } }, [{ provider: 'an', model: MODEL }], {});
    const r = await readChat(await g.client.chat.completions.create({ ...chatAsk('claude'), stream: true }));
    expect(r.error).toBeUndefined();
    expect(r.text).toBe('Cut by the limit');
    expect(r.finish).toEqual(['length']);

    const n = await startUpstreams({ an: { family: 'anthropic', answer: () => noStop } }, [{ provider: 'an' }], { path: '/v1/messages' });
    const msg = await claude(n.s.url).messages.stream(ask).finalMessage();
    expect(msg.stop_reason).toBe('max_tokens');
    expect((msg.content[0] as Anthropic.TextBlock).text).toBe('Cut by the limit');
  });

  it('thinking signed by signature_delta and a redacted_thinking block reach the native client intact; the OpenAI client gets the thinking as reasoning_content only', async () => {
    const thinking = anthropicSse([
      start(),
      aev('content_block_start', { index: 0, content_block: { type: 'thinking', thinking: '', signature: '' } }),
      aev('content_block_delta', { index: 0, delta: { type: 'thinking_delta', thinking: 'Tides follow the moon.' } }),
      aev('content_block_delta', { index: 0, delta: { type: 'signature_delta', signature: 'EqQBCgIYAhIM1gbcDa9GJwZA2b3h' } }),
      aev('content_block_stop', { index: 0 }),
      aev('content_block_start', { index: 1, content_block: { type: 'redacted_thinking', data: 'EmwKAhgBEgy3va3pzix/LafPsn4a' } }),
      aev('content_block_stop', { index: 1 }),
      aev('content_block_start', { index: 2, content_block: { type: 'text', text: '' } }),
      aev('content_block_delta', { index: 2, delta: { type: 'text_delta', text: 'At 6 am.' } }),
      aev('content_block_stop', { index: 2 }),
      stopDelta('end_turn'),
      aev('message_stop'),
    ]);
    const n = await startUpstreams({ an: { family: 'anthropic', answer: () => thinking } }, [{ provider: 'an' }], { path: '/v1/messages' });
    const msg = await claude(n.s.url).messages.stream({ ...ask, thinking: { type: 'enabled', budget_tokens: 1024 }, max_tokens: 2048 }).finalMessage();
    expect(msg.content[0]).toMatchObject({ type: 'thinking', thinking: 'Tides follow the moon.', signature: 'EqQBCgIYAhIM1gbcDa9GJwZA2b3h' });
    expect(msg.content[1]).toEqual({ type: 'redacted_thinking', data: 'EmwKAhgBEgy3va3pzix/LafPsn4a' });
    expect(msg.stop_reason).toBe('end_turn');

    const g = await startUpstreams({ an: { family: 'anthropic', answer: () => thinking } }, [{ provider: 'an', model: MODEL }], {});
    const r = await readChat(await g.client.chat.completions.create({ ...chatAsk('claude'), stream: true }));
    expect(r.error).toBeUndefined();
    expect(r.text).toBe('At 6 am.');
    expect(r.chunks.map((c) => (c.choices[0]?.delta as { reasoning_content?: string } | undefined)?.reasoning_content ?? '').join('')).toBe('Tides follow the moon.');
    expect(r.finish).toEqual(['stop']);
  });
});

describe("Anthropic's errors, in each family's shape", () => {
  const tooLarge = () =>
    json(413, { type: 'error', error: { type: 'request_too_large', message: 'Request exceeds the maximum allowed number of bytes.' } }, { 'request-id': 'req_011C413', 'x-should-retry': 'false' });
  const overloaded = () =>
    json(529, { type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } }, { 'request-id': 'req_011C529', 'x-should-retry': 'true' });

  it('413 request_too_large on /v1/messages: sent once, the Anthropic SDK raises it with its type and request id, x-should-retry false', async () => {
    const g = await startUpstreams({ an: { family: 'anthropic', answer: tooLarge } }, [{ provider: 'an' }], { path: '/v1/messages', route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } } });
    const err = (await claude(g.s.url).messages.create(ask).catch((e: unknown) => e)) as InstanceType<typeof Anthropic.APIError>;
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(err.status).toBe(413);
    expect((err.error as { error: { type: string } }).error.type).toBe('request_too_large');
    expect(err.requestID).toBe('req_011C413');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(g.seen.an).toHaveLength(1);
  });

  it('413 request_too_large for an OpenAI client answered by Anthropic: an OpenAI error with its status and code, sent once', async () => {
    const g = await startUpstreams({ an: { family: 'anthropic', answer: tooLarge } }, [{ provider: 'an', model: MODEL }], { route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } } });
    const err = await sdkError(g.client.chat.completions.create(chatAsk('claude')));
    expect(err.status).toBe(413);
    expect(err.code).toBe('request_too_large');
    expect(err.type).toBe('invalid_request_error');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(g.seen.an).toHaveLength(1);
  });

  it("529 with Anthropic's own x-should-retry: true, retried to the end: the gateway's x-should-retry false, Anthropic's type and request id, on both families", async () => {
    const n = await startUpstreams({ an: { family: 'anthropic', answer: overloaded } }, [{ provider: 'an' }], { path: '/v1/messages' });
    const err = (await claude(n.s.url).messages.create(ask).catch((e: unknown) => e)) as InstanceType<typeof Anthropic.APIError>;
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(err.status).toBe(529);
    expect((err.error as { error: { type: string } }).error.type).toBe('overloaded_error');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.requestID).toBe('req_011C529');
    expect(n.seen.an).toHaveLength(2);

    const g = await startUpstreams({ an: { family: 'anthropic', answer: overloaded } }, [{ provider: 'an', model: MODEL }], {});
    const e2 = await sdkError(g.client.chat.completions.create(chatAsk('claude')));
    expect(e2.status).toBe(529);
    expect(e2.code).toBe('overloaded');
    expect(e2.headers?.get('x-should-retry')).toBe('false');
    expect(g.seen.an).toHaveLength(2);
  });

  it.each([
    [409, 'conflict_error'],
    [413, 'request_too_large'],
    [529, 'overloaded_error'],
  ])("a %i %s reaches the Anthropic SDK in Anthropic's documented type, with the body's request_id", async (status, type) => {
    const g = await startUpstreams(
      { an: { family: 'anthropic', answer: () => json(status, { type: 'error', error: { type, message: 'As Anthropic said it.' }, request_id: 'req_011CBody' }, { 'request-id': 'req_011CBody' }) } },
      [{ provider: 'an' }],
      { path: '/v1/messages', route: { retry: { maxAttempts: 1 } } },
    );
    const err = (await claude(g.s.url).messages.create(ask).catch((e: unknown) => e)) as InstanceType<typeof Anthropic.APIError>;
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(err.status).toBe(status);
    expect(err.error).toMatchObject({ type: 'error', error: { type, message: 'As Anthropic said it.' }, request_id: 'req_011CBody' });
    expect(err.requestID).toBe('req_011CBody');
  });

  it("never echoes the provider's key that an error in front of Anthropic quotes back, to either family", async () => {
    const echo = () => json(401, { type: 'error', error: { type: 'authentication_error', message: 'invalid x-api-key: an-key-0123456789' } });
    const n = await startUpstreams({ an: { family: 'anthropic', answer: echo } }, [{ provider: 'an' }], { path: '/v1/messages' });
    const res = await fetch(`${n.s.url}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01', 'x-api-key': 'client-key' }, body: JSON.stringify(ask) });
    const text = await res.text();
    expect(res.status).toBeGreaterThanOrEqual(400);
    expect(text).not.toContain('an-key-0123456789');
    expect(JSON.stringify([...res.headers])).not.toContain('an-key-0123456789');

    const g = await startUpstreams({ an: { family: 'anthropic', answer: echo } }, [{ provider: 'an', model: MODEL }], {});
    const err = await sdkError(g.client.chat.completions.create(chatAsk('claude')));
    expect(JSON.stringify(err.error)).not.toContain('an-key-0123456789');
    expect(err.message).not.toContain('an-key-0123456789');
  });

  it('pings, then an overloaded_error event before the first output: the OpenAI client gets the OpenAI backup\'s answer', async () => {
    const pingsThenOverload = anthropicSse([start(), aev('ping'), aev('ping'), aev('error', { error: { type: 'overloaded_error', message: 'Overloaded' } })]);
    const g = await startUpstreams(
      { an: { family: 'anthropic', answer: () => pingsThenOverload }, oa: (b) => (b.stream ? { steps: [`data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta: { role: 'assistant', content: 'from openai' }, finish_reason: null }] })}\n\n`, `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] })}\n\n`, 'data: [DONE]\n\n'] } : openaiOk()) },
      [{ provider: 'an', model: MODEL }, { provider: 'oa', model: 'gpt-4o' }],
      { route: { retry: { maxAttempts: 1 } } },
    );
    const r = await readChat(await g.client.chat.completions.create({ ...chatAsk('claude'), stream: true }));
    expect(r.error).toBeUndefined();
    expect(r.text).toBe('from openai');
    expect(g.seen.an).toHaveLength(1);
    expect(g.seen.oa).toHaveLength(1);
  });

  it('an overloaded_error event after the first text, then the connection closed cleanly: never a clean end for either client', async () => {
    const midOverload = anthropicSse([
      start(),
      aev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
      aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'High tide' } }),
      aev('ping'),
      aev('error', { error: { type: 'overloaded_error', message: 'Overloaded' } }),
    ]);
    const n = await startUpstreams({ an: { family: 'anthropic', answer: () => midOverload }, ab: { family: 'anthropic', answer: () => pausedSearchStream } }, [{ provider: 'an' }, { provider: 'ab' }], { path: '/v1/messages' });
    const nErr = await claude(n.s.url).messages.stream(ask).finalMessage().then(() => undefined, (e: unknown) => e);
    expect(nErr).toBeInstanceOf(Anthropic.APIError);
    expect(String((nErr as Error).message)).toContain('overloaded_error');
    expect(n.seen.ab).toHaveLength(0);

    const g = await startUpstreams({ an: { family: 'anthropic', answer: () => midOverload }, oa: openaiOk }, [{ provider: 'an', model: MODEL }, { provider: 'oa', model: 'gpt-4o' }], {});
    const r = await readChat(await g.client.chat.completions.create({ ...chatAsk('claude'), stream: true }));
    expect(r.text).toBe('High tide');
    expect(r.error).toBeInstanceOf(OpenAI.APIError);
    expect(r.finish).toEqual([]);
    expect(g.seen.oa).toHaveLength(0);
  });
});
