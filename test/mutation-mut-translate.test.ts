// Mutation-testing gaps in the cross-family translation (providers/anthropic/, providers/families.ts): each test pins
// a behaviour that a wrong change to that code went unnoticed by. Through the exported functions, as the translation's
// own tests are; what the client receives is the point of each one.
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import { prepareUpstream } from '../src/providers/families.ts';
import { AnthropicStreamTranslator, toAnthropicRequest, toOpenAIError, toOpenAIResponse } from '../src/providers/anthropic/index.ts';
import { toOpenAIUsage } from '../src/providers/anthropic/response.ts';
import { toAnthropicSchema } from '../src/providers/anthropic/json-schema.ts';
import { thinkingFields } from '../src/providers/anthropic/thinking.ts';
import { ToolNames } from '../src/providers/anthropic/tool-names.ts';

const config = parseConfig(
  `providers:
  an: { family: anthropic, baseUrl: "https://api.anthropic.com/v1", apiKey: an-key }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: an } ]
`,
  'test.yaml',
);
const prep = (raw: string, model: string | undefined) =>
  prepareUpstream(config.providers['an']!, { api: 'chat', clientPath: '/v1/chat/completions', query: '', json: JSON.parse(raw) as Record<string, unknown>, rawBody: Buffer.from(raw), model });
const HI = '{"messages":[{"role":"user","content":"hi"}]}';

const msgs = [{ role: 'user', content: 'hi' }];
const tr = (extra: Record<string, unknown>, messages: unknown[] = msgs) =>
  toAnthropicRequest({ model: 'gpt-4o', messages, ...extra } as never, { model: 'claude-sonnet-4-5', defaultMaxTokens: 1024 });
const body = (extra: Record<string, unknown>, messages?: unknown[]) => {
  const r = tr(extra, messages);
  if (!r.ok) throw new Error(`refused: ${r.reason}`);
  return r.body as unknown as Record<string, unknown>;
};

describe('families: a chat request for an Anthropic target', () => {
  it('is refused, naming model, when there is no model to send (Anthropic requires one)', () => {
    expect(prep(HI, undefined)).toMatchObject({ ok: false, param: 'model' });
  });
  it('reads a 200 message whose content is not a list as no answer, not an empty successful completion', () => {
    const p = prep(HI, 'claude');
    if (!p.ok) throw new Error(p.reason);
    const msg = { id: 'msg_1', type: 'message', role: 'assistant', model: 'claude', stop_reason: 'end_turn', usage: { input_tokens: 1, output_tokens: 1 } };
    expect(() => p.request.translator!.body(Buffer.from(JSON.stringify({ ...msg, content: null })))).toThrow(/not an Anthropic message/);
    expect(() => p.request.translator!.body(Buffer.from(JSON.stringify({ ...msg, content: 'hi' })))).toThrow(/not an Anthropic message/);
  });
  it("reads an error event whose type is only an Object property name (toString) as naming no status", () => {
    const p = prep(HI, 'claude');
    if (!p.ok) throw new Error(p.reason);
    for (const type of ['toString', 'constructor', '__proto__']) {
      expect(p.request.errorEventMeaning!(Buffer.from(JSON.stringify({ type: 'error', error: { type, message: 'x' } })))).toBeUndefined();
    }
  });
});

describe('toAnthropicRequest: defaults that change nothing are taken', () => {
  it('takes top_logprobs 0 and an empty logit_bias, which ask for nothing', () => {
    expect(tr({ top_logprobs: 0 })).toMatchObject({ ok: true });
    expect(tr({ logit_bias: {} })).toMatchObject({ ok: true });
  });
});

describe('toAnthropicRequest: the end user', () => {
  it('sends no metadata.user_id for an empty user: no one user, not the hash of "" shared by every such request', () => {
    expect(body({ user: '' })['metadata']).toBeUndefined();
    expect(body({ safety_identifier: '' })['metadata']).toBeUndefined();
  });
});

describe('toAnthropicRequest: images', () => {
  it('sends a plain http image URL as a url source, as it sends an https one (Anthropic fetches either)', () => {
    const content = (url: string) => [{ role: 'user', content: [{ type: 'text', text: 'what is it?' }, { type: 'image_url', image_url: { url } }] }];
    const first = (b: Record<string, unknown>) => (b['messages'] as Array<{ content: unknown[] }>)[0]!.content[1];
    expect(first(body({}, content('http://example.com/cat.png')))).toEqual({ type: 'image', source: { type: 'url', url: 'http://example.com/cat.png' } });
    // Bytes whose signature says nothing: the URL's image/jpg, not a registered type, is read as image/jpeg.
    expect(first(body({}, content('data:image/jpg;base64,AAAAAAAA')))).toEqual({ type: 'image', source: { type: 'base64', media_type: 'image/jpeg', data: 'AAAAAAAA' } });
  });
  it('refuses a file part that is not a PDF, naming it, rather than sending it to Anthropic as one', () => {
    const file = (file_data: string) => [{ role: 'user', content: [{ type: 'file', file: { file_data, filename: 'notes.txt' } }] }];
    expect(tr({}, file('data:text/plain;base64,aGVsbG8='))).toMatchObject({ ok: false, param: 'messages[0].content[0].file' });
    const pdf = body({}, file('data:application/pdf;base64,JVBERi0='));
    // The filename goes as the document's title, which Claude reads (and cites by).
    expect((pdf['messages'] as Array<{ content: unknown[] }>)[0]!.content[0]).toEqual({
      type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: 'JVBERi0=' }, title: 'notes.txt',
    });
  });
});

describe('toAnthropicRequest: the assistant\'s turns', () => {
  it('keeps what the assistant refused with (message.refusal, content null) as its text', () => {
    const b = body({}, [{ role: 'user', content: 'help me' }, { role: 'assistant', content: null, refusal: 'I cannot help with that.' }, { role: 'user', content: 'why?' }]);
    expect(b['messages']).toEqual([
      { role: 'user', content: [{ type: 'text', text: 'help me' }] },
      { role: 'assistant', content: [{ type: 'text', text: 'I cannot help with that.' }] },
      { role: 'user', content: [{ type: 'text', text: 'why?' }] },
    ]);
  });
});

describe('toAnthropicRequest: tool calls in the history', () => {
  it('refuses arguments that are a JSON array: Anthropic takes a tool input as an object only', () => {
    const history = [
      { role: 'user', content: 'go' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '[1,2]' } }] },
      { role: 'tool', tool_call_id: 'c1', content: 'ok' },
    ];
    expect(tr({}, history)).toMatchObject({ ok: false, param: 'messages[1].tool_calls[0].function.arguments' });
  });
});

describe('toOpenAIError', () => {
  it("gives Anthropic's billing_error OpenAI's insufficient_quota code, which OpenAI clients look for", () => {
    const e = toOpenAIError(402, { type: 'error', error: { type: 'billing_error', message: 'no credit' } });
    expect(e).toMatchObject({ status: 402, body: { error: { type: 'insufficient_quota', code: 'insufficient_quota', message: 'no credit' } } });
  });
  it("passes on the error's own details.error_code where its type names no code", () => {
    const e = toOpenAIError(400, { type: 'error', error: { type: 'invalid_request_error', message: 'bad', details: { error_code: 'model_not_available' } } });
    expect(e.body.error.code).toBe('model_not_available');
  });
});

describe('toOpenAIUsage', () => {
  it("reports Anthropic's thinking tokens as OpenAI's reasoning_tokens", () => {
    expect(toOpenAIUsage({ input_tokens: 5, output_tokens: 40, output_tokens_details: { thinking_tokens: 30 } } as never)).toMatchObject({
      completion_tokens: 40, completion_tokens_details: { reasoning_tokens: 30 },
    });
  });
});

describe('toOpenAIResponse', () => {
  it('gives a tool call whose tool_use has no input the arguments "{}", which clients JSON.parse', () => {
    const msg = { id: 'msg_1', type: 'message', role: 'assistant', model: 'claude', stop_reason: 'tool_use', usage: { input_tokens: 1, output_tokens: 1 },
      content: [{ type: 'tool_use', id: 'toolu_1', name: 'get_time' }] };
    const out = toOpenAIResponse(msg as never, { model: 'claude' });
    expect(out.choices[0]!.message.tool_calls).toEqual([{ id: 'toolu_1', type: 'function', function: { name: 'get_time', arguments: '{}' } }]);
    expect(out.choices[0]!.finish_reason).toBe('tool_calls');
  });
});

describe('AnthropicStreamTranslator', () => {
  it("reads an event whose data carries no type by the event's name, as an SSE reader does", () => {
    const t = new AnthropicStreamTranslator({ model: 'claude', includeUsage: false });
    expect(t.push({ event: 'message_start', data: JSON.stringify({ message: { id: 'msg_1', model: 'claude', usage: { input_tokens: 3 } } }) })).toHaveLength(1);
    expect(t.push({ event: 'ping', data: '{}' })).toEqual([': ping\n\n']);
    expect(t.push({ event: 'message_delta', data: JSON.stringify({ delta: { stop_reason: 'max_tokens' }, usage: { output_tokens: 9 } }) })).toEqual([
      expect.stringContaining('"finish_reason":"length"'),
    ]);
    expect(t.push({ event: 'message_stop', data: '{}' }).at(-1)).toBe('data: [DONE]\n\n');
  });
});

describe('AnthropicStreamTranslator: text a block starts with', () => {
  it("passes on text and thinking that arrive in content_block_start itself, not only in deltas", () => {
    const t = new AnthropicStreamTranslator({ model: 'claude', includeUsage: false });
    t.push({ event: 'message_start', data: JSON.stringify({ type: 'message_start', message: { id: 'msg_1', model: 'claude', usage: { input_tokens: 3 } } }) });
    const chunks = [
      ...t.push({ event: 'content_block_start', data: JSON.stringify({ type: 'content_block_start', index: 0, content_block: { type: 'thinking', thinking: 'Let me' } }) }),
      ...t.push({ event: 'content_block_start', data: JSON.stringify({ type: 'content_block_start', index: 1, content_block: { type: 'text', text: 'Hel' } }) }),
      ...t.push({ event: 'content_block_delta', data: JSON.stringify({ type: 'content_block_delta', index: 1, delta: { type: 'text_delta', text: 'lo' } }) }),
    ].map((c) => (JSON.parse(c.slice('data: '.length)) as { choices: [{ delta: Record<string, unknown> }] }).choices[0].delta);
    expect(chunks).toEqual([{ reasoning_content: 'Let me' }, { content: 'Hel' }, { content: 'lo' }]);
  });
});

describe('toOpenAIError: an answer that is no error Anthropic documents', () => {
  it('gives a redirect (not followed) with no Anthropic error body the 502 of a bad gateway, not a 500 of its own', () => {
    const e = toOpenAIError(302, '<html>moved</html>');
    expect(e).toMatchObject({ status: 502, body: { error: { type: 'server_error', code: null } } });
  });
});

describe('AnthropicStreamTranslator: a stream that stops without a stop_reason', () => {
  it('still ends the choice with finish_reason "stop" before [DONE], as OpenAI clients wait for one', () => {
    const t = new AnthropicStreamTranslator({ model: 'claude', includeUsage: false });
    t.push({ event: 'message_start', data: JSON.stringify({ type: 'message_start', message: { id: 'msg_1', model: 'claude', usage: { input_tokens: 3 } } }) });
    t.push({ event: 'content_block_start', data: JSON.stringify({ type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } }) });
    t.push({ event: 'content_block_delta', data: JSON.stringify({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'hi' } }) });
    const out = t.push({ event: 'message_stop', data: JSON.stringify({ type: 'message_stop' }) });
    expect(out).toEqual([expect.stringContaining('"finish_reason":"stop"'), 'data: [DONE]\n\n']);
  });
});

describe('AnthropicStreamTranslator: chunks with nothing in them', () => {
  const start = (t: AnthropicStreamTranslator) => {
    t.push({ event: 'message_start', data: JSON.stringify({ type: 'message_start', message: { id: 'msg_1', model: 'claude', usage: { input_tokens: 3 } } }) });
    t.push({ event: 'content_block_start', data: JSON.stringify({ type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } }) });
  };
  it('sends no chunk for an empty text delta', () => {
    const t = new AnthropicStreamTranslator({ model: 'claude', includeUsage: false });
    start(t);
    expect(t.push({ event: 'content_block_delta', data: JSON.stringify({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: '' } }) })).toEqual([]);
  });
  it('sends the role chunk first even when the stream begins with its message_delta (no message_start)', () => {
    const t = new AnthropicStreamTranslator({ model: 'claude', includeUsage: false });
    const out = t.push({ event: 'message_delta', data: JSON.stringify({ type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 1 } }) });
    expect(out).toEqual([expect.stringContaining('"role":"assistant"'), expect.stringContaining('"finish_reason":"stop"')]);
  });
  it('sends the role chunk first even when the stream begins with a content block (no message_start)', () => {
    const t = new AnthropicStreamTranslator({ model: 'claude', includeUsage: false });
    const out = t.push({ event: 'content_block_start', data: JSON.stringify({ type: 'content_block_start', index: 0, content_block: { type: 'text', text: 'Hi' } }) });
    expect(out).toEqual([expect.stringContaining('"role":"assistant"'), expect.stringContaining('"content":"Hi"')]);
  });
});

describe('thinkingFields', () => {
  const budgets = { low: 2048, medium: 4096, high: 8192, xhigh: 16384 };
  const request = { model: 'claude-opus-4-7', max_tokens: 3000, messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }] } as never;
  it("adaptive (Claude 4.7 and later): keeps the client's own max_tokens, which covers thinking and answer, as OpenAI's max_completion_tokens does", () => {
    expect(thinkingFields({ effort: 'low', request, clientMaxTokens: true, budgets })?.max_tokens).toBe(3000);
  });
  it("adaptive: adds the effort's budget to the provider's default, so the answer keeps the room it has without thinking", () => {
    expect(thinkingFields({ effort: 'low', request, clientMaxTokens: false, budgets })?.max_tokens).toBe(5048);
  });
  it('thinks with top_p 0.95, the lowest Anthropic takes with thinking, and not under it', () => {
    const sampled = (top_p: number) => ({ ...(request as object), model: 'claude-sonnet-4-5', top_p }) as never;
    expect(thinkingFields({ effort: 'low', request: sampled(0.95), clientMaxTokens: false, budgets })?.thinking).toEqual({ type: 'enabled', budget_tokens: 2048 });
    expect(thinkingFields({ effort: 'low', request: sampled(0.94), clientMaxTokens: false, budgets })).toBeUndefined();
  });
});

describe('ToolNames', () => {
  it('keeps a name Anthropic takes as it is, even when a name respelled before it in the request would become it', () => {
    const names = new ToolNames(['fs.read', 'fs_read']);
    expect(names.of('fs_read')).toBe('fs_read');
    expect(names.of('fs.read')).toBe('fs_read_2');
    expect(names.respelled).toEqual(new Map([['fs_read_2', 'fs.read']]));
  });
  it('gives long names that respell alike names Anthropic still takes, suffix and all (at most 128 characters)', () => {
    const long = ['mcp.server.', 'mcp/server/'].map((p) => p + 'x'.repeat(200));
    const names = new ToolNames(long);
    const given = long.map((n) => names.of(n));
    expect(new Set(given).size).toBe(2);
    for (const g of given) expect(g).toMatch(/^[a-zA-Z0-9_-]{1,128}$/);
  });
});

describe('toAnthropicSchema', () => {
  it('sends a oneOf as an anyOf (the structured-output subset has no oneOf), not a property left unconstrained', () => {
    const schema = { type: 'object', properties: { v: { oneOf: [{ type: 'string' }, { type: 'integer' }] } }, required: ['v'], additionalProperties: false };
    expect(toAnthropicSchema(schema, 'response_format.json_schema.schema')).toEqual({
      type: 'object', properties: { v: { anyOf: [{ type: 'string' }, { type: 'integer' }] } }, additionalProperties: false, required: ['v'],
    });
  });
  it('keeps a string format Anthropic takes, and writes one it does not (a regex) into the description', () => {
    expect(toAnthropicSchema({ type: 'string', format: 'email' }, 's')).toEqual({ type: 'string', format: 'email' });
    expect(toAnthropicSchema({ type: 'string', format: 'regex' }, 's')).toEqual({ type: 'string', description: '{format: "regex"}' });
  });
});
