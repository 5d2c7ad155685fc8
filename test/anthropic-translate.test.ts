// The OpenAI <-> Anthropic translation, checked against the real shapes: requests are typed as the openai SDK's
// params and must come out assignable to @anthropic-ai/sdk's; the translated stream is read by the openai SDK itself.
import type Anthropic from '@anthropic-ai/sdk';
import type OpenAI from 'openai';
import { ChatCompletionStream } from 'openai/lib/ChatCompletionStream';
import { Stream } from 'openai/streaming';
import { describe, expect, it } from 'vitest';
import { classify } from '../src/policy/outcome.ts';
import {
  AnthropicStreamError,
  AnthropicStreamTranslator,
  toAnthropicRequest,
  toOpenAIError,
  toOpenAIResponse,
  type AnthropicRequestOptions,
} from '../src/providers/anthropic/index.ts';
import { eventMeaning } from '../src/streaming/stream-events.ts';
import { chat, hi, timeTool, weatherTool } from './fixtures/anthropic/requests.ts';
import { chunks, sseEvents, translateStream } from './fixtures/anthropic/sse.ts';
import { message, text, textStream, toolStream, toolUse, usage, wire, type WireEvent } from './fixtures/anthropic/wire.ts';

const OPTS: AnthropicRequestOptions = { model: 'claude-sonnet-5-5', defaultMaxTokens: 4096 };

/** Translates and checks that what is sent would type-check as the Anthropic SDK's own params. */
function translated(params: OpenAI.ChatCompletionCreateParams, opts: AnthropicRequestOptions = OPTS): Anthropic.MessageCreateParams {
  const result = toAnthropicRequest(params, opts);
  if (!result.ok) throw new Error(`refused: ${result.reason}`);
  return result.body;
}
const refusal = (params: OpenAI.ChatCompletionCreateParams, opts = OPTS) => toAnthropicRequest(params, opts);

describe('toAnthropicRequest', () => {
  it('moves system and developer messages to the top-level system prompt and keeps the turns', () => {
    const body = translated(chat([
      { role: 'system', content: 'You are terse.' },
      { role: 'developer', content: [{ type: 'text', text: 'Answer in French.' }] },
      { role: 'user', content: 'Hello' },
      { role: 'assistant', content: 'Bonjour.' },
      { role: 'user', content: [{ type: 'text', text: 'How are you?' }] },
    ]));
    expect(body).toMatchObject({ model: 'claude-sonnet-5-5', max_tokens: 4096, system: 'You are terse.\n\nAnswer in French.' });
    expect(body.messages).toEqual([
      { role: 'user', content: [{ type: 'text', text: 'Hello' }] },
      { role: 'assistant', content: [{ type: 'text', text: 'Bonjour.' }] },
      { role: 'user', content: [{ type: 'text', text: 'How are you?' }] },
    ]);
  });

  it('merges consecutive same-role turns and opens an assistant-first history with a user turn', () => {
    const body = translated(chat([{ role: 'assistant', content: 'How can I help?' }, { role: 'user', content: 'a' }, { role: 'user', content: 'b' }]));
    expect(body.messages.map((m) => m.role)).toEqual(['user', 'assistant', 'user']);
    expect(body.messages[2]!.content).toEqual([{ type: 'text', text: 'a' }, { type: 'text', text: 'b' }]);
  });

  it('gives other servers\' tool-call ids the characters Anthropic takes, the call and its result alike', () => {
    const body = translated(chat([
      { role: 'user', content: 'Weather?' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'functions.get_weather:0', type: 'function', function: { name: 'get_weather', arguments: '{}' } }] },
      { role: 'tool', tool_call_id: 'functions.get_weather:0', content: 'sunny' },
    ], { tools: [weatherTool] }));
    expect(body.messages[1]!.content).toMatchObject([{ type: 'tool_use', id: 'functions_get_weather_0' }]);
    expect(body.messages[2]!.content).toMatchObject([{ type: 'tool_result', tool_use_id: 'functions_get_weather_0' }]);
  });

  it('gives a tool-call id used again in a later turn (servers that number each answer\'s calls) a new one, its result alike', () => {
    const round = (result: string): OpenAI.ChatCompletionMessageParam[] => [
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_0', type: 'function', function: { name: 'get_time', arguments: '{}' } }] },
      { role: 'tool', tool_call_id: 'call_0', content: result },
    ];
    const body = translated(chat([{ role: 'user', content: 'Time, twice?' }, ...round('14:00'), ...round('14:01'), ...round('14:02')], { tools: [timeTool] }));
    const ids = body.messages.map((m) => (m.content as Array<{ id?: string; tool_use_id?: string }>).map((b) => b.id ?? b.tool_use_id));
    // Anthropic answers 400 "`tool_use` ids must be unique" to the same id twice in a conversation.
    expect(ids.slice(1)).toEqual([['call_0'], ['call_0'], ['call_0_2'], ['call_0_2'], ['call_0_3'], ['call_0_3']]);
    // Two calls of one answer under one id (and ids that differ only in characters Anthropic refuses): paired in order.
    const same = translated(chat([
      { role: 'user', content: 'Time and weather?' },
      { role: 'assistant', content: null, tool_calls: [
        { id: '0', type: 'function', function: { name: 'get_time', arguments: '{}' } },
        { id: '0', type: 'function', function: { name: 'get_weather', arguments: '{}' } },
        { id: 'call.1', type: 'function', function: { name: 'get_time', arguments: '{}' } },
        { id: 'call_1', type: 'function', function: { name: 'get_time', arguments: '{}' } },
      ] },
      { role: 'tool', tool_call_id: '0', content: '14:00' },
      { role: 'tool', tool_call_id: '0', content: 'sunny' },
      { role: 'tool', tool_call_id: 'call_1', content: '14:01' },
      { role: 'tool', tool_call_id: 'call.1', content: '14:02' },
    ], { tools: [weatherTool, timeTool] }));
    expect((same.messages[1]!.content as Array<{ id: string }>).map((b) => b.id)).toEqual(['0', '0_2', 'call_1', 'call_1_2']);
    expect(same.messages[2]!.content).toMatchObject([
      { tool_use_id: '0', content: '14:00' }, { tool_use_id: '0_2', content: 'sunny' }, { tool_use_id: 'call_1_2', content: '14:01' }, { tool_use_id: 'call_1', content: '14:02' },
    ]);
  });

  it('sends a conversation that ends on the assistant\'s turn (a prefill to Anthropic) without the trailing whitespace it refuses', () => {
    const body = translated(chat([{ role: 'user', content: 'Tell me a story' }, { role: 'assistant', content: 'Once upon a time ' }]));
    expect(body.messages.at(-1)).toEqual({ role: 'assistant', content: [{ type: 'text', text: 'Once upon a time' }] });
    const blank = translated(chat([{ role: 'user', content: 'Tell me a story' }, { role: 'assistant', content: 'Once' }, { role: 'assistant', content: ' \n' }]));
    expect(blank.messages.at(-1)).toEqual({ role: 'assistant', content: [{ type: 'text', text: 'Once' }] });
  });

  it('turns data: image URLs into base64 sources and http(s) URLs into url sources', () => {
    const body = translated(chat([{ role: 'user', content: [
      { type: 'text', text: 'Compare' },
      { type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgo=', detail: 'high' } },
      { type: 'image_url', image_url: { url: 'https://example.com/cat.jpg' } },
    ] }]));
    expect(body.messages[0]!.content).toEqual([
      { type: 'text', text: 'Compare' },
      { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'iVBORw0KGgo=' } },
      { type: 'image', source: { type: 'url', url: 'https://example.com/cat.jpg' } },
    ]);
    const tiff = chat([{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'data:image/tiff;base64,AAAA' } }] }]);
    expect(refusal(tiff)).toMatchObject({ ok: false, reason: expect.stringContaining('image/tiff') });
  });

  it('maps tools and every tool_choice, with parallel_tool_calls false as disable_parallel_tool_use', () => {
    const withChoice = (tool_choice?: OpenAI.ChatCompletionToolChoiceOption, parallel_tool_calls?: boolean) => {
      const extra = { ...(tool_choice ? { tool_choice } : {}), ...(parallel_tool_calls === undefined ? {} : { parallel_tool_calls }) };
      return translated(chat([hi], { tools: [weatherTool, timeTool], ...extra }));
    };
    const plain = withChoice();
    expect(plain.tools).toEqual([
      { name: 'get_weather', description: 'Weather by city', input_schema: weatherTool.type === 'function' ? weatherTool.function.parameters : {} },
      { name: 'get_time', input_schema: { type: 'object' } },
    ]);
    expect(plain.tool_choice).toBeUndefined();
    expect(withChoice('auto').tool_choice).toEqual({ type: 'auto' });
    expect(withChoice('required').tool_choice).toEqual({ type: 'any' });
    expect(withChoice('none')).toMatchObject({ tool_choice: { type: 'none' }, tools: expect.any(Array) });
    expect(withChoice({ type: 'function', function: { name: 'get_time' } }).tool_choice).toEqual({ type: 'tool', name: 'get_time' });
    expect(withChoice('required', false).tool_choice).toEqual({ type: 'any', disable_parallel_tool_use: true });
    expect(withChoice(undefined, false).tool_choice).toEqual({ type: 'auto', disable_parallel_tool_use: true });
    const onlyTime = [{ type: 'function', function: { name: 'get_time' } }];
    const allowed = withChoice({ type: 'allowed_tools', allowed_tools: { mode: 'required', tools: onlyTime } });
    expect(allowed).toMatchObject({ tool_choice: { type: 'any' }, tools: [{ name: 'get_time' }] });
  });

  it('round-trips a tool call: tool_calls become tool_use, tool messages merge into one user turn of tool_results', () => {
    const body = translated(chat([
      { role: 'user', content: 'Weather in Paris and the time?' },
      { role: 'assistant', content: null, tool_calls: [
        { id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"location":"Paris"}' } },
        { id: 'call_2', type: 'function', function: { name: 'get_time', arguments: '' } },
      ] },
      { role: 'tool', tool_call_id: 'call_1', content: '18°C' },
      { role: 'tool', tool_call_id: 'call_2', content: [{ type: 'text', text: '14:00' }] },
      { role: 'user', content: 'Thanks' },
    ], { tools: [weatherTool, timeTool] }));
    expect(body.messages[1]).toEqual({ role: 'assistant', content: [
      { type: 'tool_use', id: 'call_1', name: 'get_weather', input: { location: 'Paris' } },
      { type: 'tool_use', id: 'call_2', name: 'get_time', input: {} },
    ] });
    expect(body.messages[2]).toEqual({ role: 'user', content: [
      { type: 'tool_result', tool_use_id: 'call_1', content: '18°C' },
      { type: 'tool_result', tool_use_id: 'call_2', content: [{ type: 'text', text: '14:00' }] },
      { type: 'text', text: 'Thanks' },
    ] });
    expect(body.messages).toHaveLength(3);
    const broken = chat([hi, { role: 'assistant', tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: '{"a":' } }] }]);
    expect(refusal(broken)).toMatchObject({ ok: false, reason: expect.stringContaining('not valid JSON') });
  });

  it('sets stop sequences, max tokens and user; leaves temperature out unless the target takes it', () => {
    const user = '3f2b8c1e-9d4a-4e7b-8f6c-2a1d0e9b7c5a'; // a uuid goes as it is (test/anthropic-fidelity.test.ts: others hashed)
    const body = translated(chat([hi], { stop: 'END', temperature: 1.7, top_p: 0.9, user }));
    expect(body).toMatchObject({ stop_sequences: ['END'], max_tokens: 4096, metadata: { user_id: user } });
    expect(body).not.toHaveProperty('temperature');
    expect(body).not.toHaveProperty('top_p');
    expect(translated(chat([hi], { stop: ['a', 'b'], max_tokens: 100, max_completion_tokens: 200 }))).toMatchObject({ stop_sequences: ['a', 'b'], max_tokens: 200 });
    expect(translated(chat([hi], { max_tokens: 100 })).max_tokens).toBe(100);
    const forwarded = toAnthropicRequest(chat([hi], { temperature: 1.7, top_p: 0.9 }), { ...OPTS, sampling: 'forward' });
    expect(forwarded).toMatchObject({ ok: true, body: { temperature: 1 } });
    // Newer Claude models refuse the two together: top_p goes only without a temperature.
    expect(forwarded.ok && 'top_p' in forwarded.body).toBe(false);
    expect(toAnthropicRequest(chat([hi], { top_p: 0.9 }), { ...OPTS, sampling: 'forward' })).toMatchObject({ ok: true, body: { top_p: 0.9 } });
    expect(refusal(chat([hi], { temperature: 0.2 }), { ...OPTS, sampling: 'refuse' })).toMatchObject({ ok: false });
  });

  it('maps json_schema response formats and remembers include_usage for the stream', () => {
    const schema = { type: 'object', properties: { a: { type: 'string' } }, required: ['a'], additionalProperties: false };
    const body = translated(chat([hi], { response_format: { type: 'json_schema', json_schema: { name: 'x', schema, strict: true } } }));
    expect(body.output_config).toEqual({ format: { type: 'json_schema', schema } });
    const streamed = toAnthropicRequest({ model: 'gpt-5', messages: [hi], stream: true, stream_options: { include_usage: true } }, OPTS);
    expect(streamed).toMatchObject({ ok: true, body: { stream: true }, includeUsage: true });
    expect(toAnthropicRequest(chat([hi]), OPTS)).toMatchObject({ ok: true, includeUsage: false });
  });

  it('writes the JSON Schema constraints Anthropic\'s structured outputs refuse into descriptions, for formats and strict tools', () => {
    // What the openai SDK's zodResponseFormat writes for .int().min(1).max(10), .max(280), .email(), .array().max(3).
    const schema = {
      $schema: 'http://json-schema.org/draft-07/schema#',
      type: 'object',
      properties: {
        score: { type: 'integer', minimum: 1, maximum: 10 },
        summary: { type: 'string', description: 'One line.', maxLength: 280 },
        email: { type: 'string', format: 'email', pattern: '^\\S+@\\S+$' },
        tags: { type: 'array', items: { type: 'string', enum: ['a', 'b'] }, maxItems: 3 },
        parts: { type: 'array', items: { $ref: '#/$defs/part' }, minItems: 1 },
      },
      required: ['score', 'summary', 'email', 'tags', 'parts'],
      additionalProperties: false,
      $defs: { part: { type: 'object', properties: { n: { type: 'number', exclusiveMinimum: 0 } }, required: ['n'] } },
    };
    const body = translated(chat([hi], { response_format: { type: 'json_schema', json_schema: { name: 'review', schema, strict: true } } }));
    // Anthropic answers 400 to each of these ("For 'integer' type, property 'minimum' is not supported").
    expect(body.output_config).toEqual({ format: { type: 'json_schema', schema: {
      $defs: { part: { type: 'object', properties: { n: { type: 'number', description: '{exclusiveMinimum: 0}' } }, additionalProperties: false, required: ['n'] } },
      type: 'object',
      properties: {
        score: { type: 'integer', description: '{minimum: 1, maximum: 10}' },
        summary: { type: 'string', description: 'One line.\n\n{maxLength: 280}' },
        email: { type: 'string', format: 'email', description: '{pattern: "^\\\\S+@\\\\S+$"}' },
        tags: { type: 'array', items: { enum: ['a', 'b'] }, description: '{maxItems: 3}' },
        parts: { type: 'array', items: { $ref: '#/$defs/part' }, minItems: 1 },
      },
      additionalProperties: false,
      required: ['score', 'summary', 'email', 'tags', 'parts'],
    } } });
    // A schema used twice, as zodResponseFormat writes it (draft-07 definitions): the definitions stay definitions.
    const reused = { type: 'object', properties: { a: { $ref: '#/definitions/s0' } }, required: ['a'], additionalProperties: false, definitions: { s0: { type: 'string', maxLength: 9 } } };
    expect(translated(chat([hi], { response_format: { type: 'json_schema', json_schema: { name: 'r', schema: reused, strict: true } } })).output_config!.format!.schema).toEqual({
      definitions: { s0: { type: 'string', description: '{maxLength: 9}' } },
      type: 'object', properties: { a: { $ref: '#/definitions/s0' } }, additionalProperties: false, required: ['a'],
    });
    const nullable = { type: 'object', properties: { o: { type: ['object', 'null'], properties: { n: { type: 'integer', minimum: 0 } } } }, additionalProperties: false };
    expect(translated(chat([hi], { response_format: { type: 'json_schema', json_schema: { name: 'n', schema: nullable } } })).output_config!.format!.schema).toEqual({
      type: 'object', properties: { o: { type: ['object', 'null'], properties: { n: { type: 'integer', description: '{minimum: 0}' } }, additionalProperties: false } }, additionalProperties: false,
    });
    const strictTool = { type: 'function' as const, function: { name: 'rate', strict: true, parameters: { type: 'object', properties: { stars: { type: 'integer', minimum: 1 } }, required: ['stars'], additionalProperties: false } } };
    const looseTool = { type: 'function' as const, function: { name: 'find', parameters: { type: 'object', properties: { q: { type: 'string', minLength: 1 } } } } };
    expect(translated(chat([hi], { tools: [strictTool, looseTool] })).tools).toEqual([
      { name: 'rate', strict: true, input_schema: { type: 'object', properties: { stars: { type: 'integer', description: '{minimum: 1}' } }, additionalProperties: false, required: ['stars'] } },
      // Not decoded under its schema: Anthropic takes any JSON Schema there, so it goes as it is.
      { name: 'find', input_schema: { type: 'object', properties: { q: { type: 'string', minLength: 1 } } } },
    ]);
    // An object that allows other properties has no Anthropic form: the target is skipped, not sent something narrower.
    const open = { type: 'object', properties: { a: { type: 'string' } }, additionalProperties: { type: 'string' } };
    expect(refusal(chat([hi], { response_format: { type: 'json_schema', json_schema: { name: 'x', schema: open } } }))).toMatchObject({ ok: false, param: 'response_format.json_schema.schema' });
  });

  it.each<[string, Partial<OpenAI.ChatCompletionCreateParamsNonStreaming>, string]>([
    ['n > 1', { n: 2 }, 'n'],
    ['logprobs', { logprobs: true }, 'logprobs'],
    ['logprobs', { top_logprobs: 3 }, 'logprobs'],
    ['logit_bias', { logit_bias: { '50256': -100 } }, 'logit_bias'],
    ['presence_penalty', { presence_penalty: 0.5 }, 'presence_penalty'],
    ['frequency_penalty', { frequency_penalty: -1 }, 'frequency_penalty'],
    ['audio', { modalities: ['text', 'audio'], audio: { voice: 'alloy', format: 'wav' } }, 'audio'],
    ['function_call', { functions: [{ name: 'f' }], function_call: 'auto' }, 'function_call'],
    ['json_object', { response_format: { type: 'json_object' } }, 'response_format'],
    ['web_search_options', { web_search_options: {} }, 'web_search_options'],
    ['only function tools', { tools: [{ type: 'custom', custom: { name: 'grammar' } }] }, 'tools[0].type'],
  ])('refuses what Anthropic cannot express: %s', (reason, extra, param) => {
    expect(refusal(chat([hi], extra))).toEqual({ ok: false, reason: expect.stringContaining(reason), param });
  });

  // What OpenAI itself answers 400 to must not be spread, dropped or defaulted into something that looks fine.
  it.each<[string, Record<string, unknown>, string]>([
    ['a string tool schema', { tools: [{ type: 'function', function: { name: 'a', parameters: 'str' } }] }, 'tools[0].function.parameters'],
    ['an array tool schema', { tools: [{ type: 'function', function: { name: 'a', parameters: ['x'] } }] }, 'tools[0].function.parameters'],
    ['tools that are not a list', { tools: 'x' }, 'tools'],
    ['tool_choice required without tools', { tool_choice: 'required' }, 'tool_choice'],
    ['a named tool_choice without tools', { tool_choice: { type: 'function', function: { name: 'a' } } }, 'tool_choice'],
    ['an unknown tool_choice', { tools: [{ type: 'function', function: { name: 'a' } }], tool_choice: 'always' }, 'tool_choice'],
    ['a tool_choice of no known type', { tools: [{ type: 'function', function: { name: 'a' } }], tool_choice: { type: 'tool' } }, 'tool_choice'],
    ['a function tool_choice without a name', { tools: [{ type: 'function', function: { name: 'a' } }], tool_choice: { type: 'function' } }, 'tool_choice.function.name'],
    ['max_tokens that is not a number', { max_tokens: 'x' }, 'max_tokens'],
    ['max_completion_tokens of 0', { max_completion_tokens: 0 }, 'max_completion_tokens'],
    ['stop that is not text', { stop: 5 }, 'stop'],
    ['a whitespace-only stop sequence, which Anthropic refuses', { stop: ['\n'] }, 'stop'],
    ['two tools of one name', { tools: [{ type: 'function', function: { name: 'a' } }, { type: 'function', function: { name: 'a' } }] }, 'tools[1].function.name'],
  ])('refuses a malformed request with its param: %s', (_name, extra, param) => {
    const result = toAnthropicRequest({ model: 'gpt-5', messages: [hi], ...extra } as unknown as OpenAI.ChatCompletionCreateParams, OPTS);
    expect(result).toMatchObject({ ok: false, param });
  });

  it.each<[string, unknown, string]>([
    ['messages that are not a list', 'x', 'messages'],
    ['user content that is a number', [{ role: 'user', content: 5 }], 'messages[0].content'],
    ['a null content part', [{ role: 'user', content: [null] }], 'messages[0].content[0]'],
  ])('names the message field at fault: %s', (_name, messages, param) => {
    const result = toAnthropicRequest({ model: 'gpt-5', messages } as unknown as OpenAI.ChatCompletionCreateParams, OPTS);
    expect(result).toMatchObject({ ok: false, param });
  });

  it('refuses a last user message with no text rather than turn the conversation into a prefill', () => {
    const result = toAnthropicRequest(
      { model: 'gpt-5', messages: [{ role: 'user', content: 'Write a poem' }, { role: 'assistant', content: 'Roses are red' }, { role: 'user', content: '  \n' }] } as OpenAI.ChatCompletionCreateParams,
      OPTS,
    );
    expect(result).toMatchObject({ ok: false, param: 'messages[2].content' });
    // Still a user turn at the end without it (a tool result, another question): nothing to refuse.
    for (const last of [' ', '']) {
      const ok = toAnthropicRequest(
        {
          model: 'gpt-5',
          messages: [
            { role: 'user', content: 'hi' },
            { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{}' } }] },
            { role: 'tool', tool_call_id: 'c1', content: 'ok' },
            { role: 'user', content: last },
          ],
        } as OpenAI.ChatCompletionCreateParams,
        OPTS,
      );
      expect(ok.ok).toBe(true);
    }
    expect(toAnthropicRequest({ model: 'gpt-5', messages: [{ role: 'user', content: 'hi' }, { role: 'user', content: ' ' }] } as OpenAI.ChatCompletionCreateParams, OPTS).ok).toBe(true);
  });

  it('leaves out whitespace-only text, which Anthropic refuses as a block and which says nothing', () => {
    const body = translated(
      chat([
        { role: 'user', content: 'hi' },
        { role: 'assistant', content: '\n\n', tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'f', arguments: '{}' } }] },
        { role: 'tool', tool_call_id: 'call_1', content: 'ok' },
        { role: 'user', content: [{ type: 'text', text: ' ' }, { type: 'text', text: 'go on' }] },
      ]),
    );
    const blocks = body.messages.flatMap((m): Array<{ type: string; text?: string }> => (Array.isArray(m.content) ? m.content : [{ type: 'text', text: m.content as string }]));
    expect(blocks.filter((b) => b.type === 'text' && (b.text ?? '').trim() === '')).toEqual([]);
    expect(blocks.some((b) => b.type === 'tool_use')).toBe(true);
  });

  it('still drops tool_choice auto or none when there are no tools, and accepts a null schema', () => {
    expect(translated(chat([hi], { tool_choice: 'auto' }))).not.toHaveProperty('tool_choice');
    expect(translated(chat([hi], { tool_choice: 'none' }))).not.toHaveProperty('tools');
    const nullSchema = { type: 'function', function: { name: 'a', parameters: null } } as unknown as OpenAI.ChatCompletionTool;
    expect(translated(chat([hi], { tools: [nullSchema] })).tools).toEqual([{ name: 'a', input_schema: { type: 'object' } }]);
  });

  it('defines the tools a history calls when the request sends none (a final summary), under tool_choice none', () => {
    const history = chat([
      { role: 'user', content: 'Weather in Paris and the time?' },
      { role: 'assistant', content: null, tool_calls: [
        { id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"location":"Paris"}' } },
        { id: 'call_2', type: 'function', function: { name: 'get_time', arguments: '{}' } },
      ] },
      { role: 'tool', tool_call_id: 'call_1', content: '18°C' },
      { role: 'tool', tool_call_id: 'call_2', content: '14:00' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_3', type: 'function', function: { name: 'get_weather', arguments: '{"location":"Lyon"}' } }] },
      { role: 'tool', tool_call_id: 'call_3', content: '20°C' },
      { role: 'user', content: 'Summarize all that in one line.' },
    ]);
    // Anthropic answers 400 "Requests which include `tool_use` or `tool_result` blocks must define tools"; OpenAI takes it.
    expect(translated(history)).toMatchObject({
      tools: [{ name: 'get_weather', input_schema: { type: 'object' } }, { name: 'get_time', input_schema: { type: 'object' } }],
      tool_choice: { type: 'none' },
    });
    expect(translated({ ...history, tools: [], tool_choice: 'auto' })).toMatchObject({ tools: [{ name: 'get_weather' }, { name: 'get_time' }], tool_choice: { type: 'none' } });
    // The request's own tools are sent as they are.
    expect(translated({ ...history, tools: [timeTool] })).toMatchObject({ tools: [{ name: 'get_time' }] });
    expect(translated({ ...history, tools: [timeTool] })).not.toHaveProperty('tool_choice');
  });

  it('refuses audio input and the legacy function role, and accepts zero penalties', () => {
    expect(refusal(chat([{ role: 'user', content: [{ type: 'input_audio', input_audio: { data: 'AAA', format: 'wav' } }] }]))).toMatchObject({ ok: false });
    expect(refusal(chat([hi, { role: 'function', name: 'f', content: '1' }]))).toMatchObject({ ok: false, reason: expect.stringContaining('function') });
    expect(refusal(chat([{ role: 'system', content: 'only a system prompt' }]))).toMatchObject({ ok: false });
    expect(refusal(chat([hi], { presence_penalty: 0, frequency_penalty: 0, n: 1, logprobs: false }))).toMatchObject({ ok: true });
  });
});

describe('toOpenAIResponse', () => {
  it('answers a text message as a chat.completion from the model that answered', () => {
    const cached = usage({ input_tokens: 25, output_tokens: 12, cache_read_input_tokens: 100, cache_creation_input_tokens: 5 });
    const msg = message([text('Hello'), text(', world!')], { usage: cached });
    const completion: OpenAI.ChatCompletion = toOpenAIResponse(msg, { model: 'fallback', created: 1_700_000_000 });
    expect(completion).toEqual({
      id: 'chatcmpl-msg_01XFDUDYJgAACzvnptvVoYEL',
      object: 'chat.completion',
      created: 1_700_000_000,
      model: 'claude-sonnet-5-5',
      choices: [{ index: 0, message: { role: 'assistant', content: 'Hello, world!', refusal: null }, logprobs: null, finish_reason: 'stop' }],
      usage: { prompt_tokens: 130, completion_tokens: 12, total_tokens: 142, prompt_tokens_details: { cached_tokens: 100 } },
    });
  });

  it('answers tool_use with content null and tool_calls whose arguments are JSON', () => {
    const msg = message([toolUse('toolu_1', 'get_weather', { location: 'Paris' })], { stop_reason: 'tool_use' });
    const { message: out, finish_reason } = toOpenAIResponse(msg, { model: 'm' }).choices[0]!;
    expect(finish_reason).toBe('tool_calls');
    expect(out.content).toBeNull();
    expect(out.tool_calls).toEqual([{ id: 'toolu_1', type: 'function', function: { name: 'get_weather', arguments: '{"location":"Paris"}' } }]);
  });

  it.each<[Anthropic.StopReason, string]>([
    ['end_turn', 'stop'], ['stop_sequence', 'stop'], ['pause_turn', 'stop'], ['max_tokens', 'length'],
    ['model_context_window_exceeded', 'length'], ['tool_use', 'tool_calls'], ['refusal', 'content_filter'],
  ])('maps stop_reason %s to finish_reason %s', (stop_reason, finish) => {
    expect(toOpenAIResponse(message([text('x')], { stop_reason }), { model: 'm' }).choices[0]!.finish_reason).toBe(finish);
  });
});

describe('toOpenAIError', () => {
  const anthropicError = (type: string, msg: string) => ({ type: 'error', error: { type, message: msg }, request_id: 'req_1' });
  it.each([
    [400, 'invalid_request_error', 400, 'invalid_request_error', null],
    [401, 'authentication_error', 401, 'authentication_error', 'invalid_api_key'],
    [403, 'permission_error', 403, 'permission_error', null],
    [404, 'not_found_error', 404, 'invalid_request_error', null],
    [413, 'request_too_large', 413, 'invalid_request_error', 'request_too_large'],
    [429, 'rate_limit_error', 429, 'rate_limit_error', 'rate_limit_exceeded'],
    [500, 'api_error', 500, 'server_error', null],
    [529, 'overloaded_error', 529, 'server_error', 'overloaded'],
  ])('maps HTTP %i %s to %i %s (code %s), keeping the message', (status, type, outStatus, outType, code) => {
    const expected = { status: outStatus, body: { error: { message: 'why', type: outType, param: null, code } } };
    expect(toOpenAIError(status, anthropicError(type, 'why'))).toEqual(expected);
  });

  it('names an over-long prompt context_length_exceeded, which the gateway never retries', () => {
    const tooLong = anthropicError('invalid_request_error', 'prompt is too long: 215000 tokens > 200000 maximum');
    const { status, body } = toOpenAIError(400, JSON.stringify(tooLong));
    expect(body.error.code).toBe('context_length_exceeded');
    const gatewayClass = (s: number, raw: unknown) =>
      classify({ kind: 'http', status: s, errorCode: toOpenAIError(s, raw).body.error.code, hint: undefined }).cls;
    expect(gatewayClass(status, tooLong)).toBe('context-length');
    expect(gatewayClass(529, anthropicError('overloaded_error', 'Overloaded'))).toBe('overloaded');
  });

  it('wraps a body that is not Anthropic-shaped by its status', () => {
    const html = toOpenAIError(413, '<html>413 Request Entity Too Large</html>');
    expect(html).toMatchObject({ status: 413, body: { error: { type: 'invalid_request_error', code: 'request_too_large' } } });
    expect(toOpenAIError(502, null)).toMatchObject({ status: 502, body: { error: { type: 'server_error' } } });
  });
});

describe('the completion id of a message without one (a compatible server)', () => {
  it('is made for each answer, whole or streamed, and shared by all of one stream\'s chunks', () => {
    const ids = [1, 2].map(() => toOpenAIResponse({ ...message([text('x')]), id: undefined as unknown as string }, { model: 'm' }).id);
    for (const id of ids) expect(id).toMatch(/^chatcmpl-[0-9a-f]{32}$/);
    expect(ids[0]).not.toBe(ids[1]);
    const streamIds = [1, 2].map(() => {
      const events = textStream().map((e) => (e.type === 'message_start' ? { ...e, message: { ...e.message, id: undefined as unknown as string } } : e));
      return [...new Set(chunks(translateStream(events)).map((c) => c.id))];
    });
    for (const one of streamIds) expect(one).toEqual([expect.stringMatching(/^chatcmpl-[0-9a-f]{32}$/)]);
    expect(streamIds[0]).not.toEqual(streamIds[1]);
  });
});

describe('AnthropicStreamTranslator', () => {
  it('streams a text answer: role first, deltas, finish, usage, [DONE] last, pings as comments', () => {
    const out = translateStream(textStream());
    const all = chunks(out);
    expect(all[0]!.choices[0]!.delta).toEqual({ role: 'assistant', content: '' });
    expect(all.map((c) => c.choices[0]?.delta.content ?? '').join('')).toBe('Hello, world!');
    expect(all.at(-2)!.choices[0]).toMatchObject({ delta: {}, finish_reason: 'stop' });
    expect(all.at(-1)).toMatchObject({ choices: [], usage: { prompt_tokens: 35, completion_tokens: 15, total_tokens: 50 } });
    expect(out.at(-1)).toBe('data: [DONE]\n\n');
    expect(out).toContain(': ping\n\n');
    const envelope = { id: 'chatcmpl-msg_01XFDUDYJgAACzvnptvVoYEL', object: 'chat.completion.chunk', created: 1_700_000_000 };
    for (const c of all) expect(c).toMatchObject({ ...envelope, model: 'claude-sonnet-5-5', system_fingerprint: null });
    // The gateway's own reading of the translated events: the role chunk and the ping keep alive, text is output.
    const meanings = sseEvents(out).map((e) => eventMeaning('chat', e));
    expect(meanings).toEqual(['keepalive', 'keepalive', 'output', 'output', 'output', 'finish', 'keepalive', 'done']);
    expect(chunks(translateStream(textStream(), false)).every((c) => c.usage === undefined && c.choices.length === 1)).toBe(true);
  });

  it('streams tool calls indexed among tool calls, with fragments that join to valid JSON', () => {
    const all = chunks(translateStream(toolStream()));
    expect(all.map((c) => c.choices[0]?.delta).find((d) => d && 'reasoning_content' in d)).toEqual({ reasoning_content: 'The user wants weather.' });
    const calls = all.flatMap((c) => c.choices[0]?.delta.tool_calls ?? []);
    expect(calls.filter((c) => c.id)).toEqual([
      { index: 0, id: 'toolu_01A', type: 'function', function: { name: 'get_weather', arguments: '' } },
      { index: 1, id: 'toolu_01B', type: 'function', function: { name: 'get_time', arguments: '' } },
    ]);
    const args = (i: number) => calls.filter((c) => c.index === i).map((c) => c.function?.arguments ?? '').join('');
    expect(JSON.parse(args(0))).toEqual({ location: 'Paris', unit: 'c' });
    expect(JSON.parse(args(1))).toEqual({});
    expect(all.find((c) => c.choices[0]?.finish_reason)?.choices[0]?.finish_reason).toBe('tool_calls');
  });

  it('turns an error event into the error payload SDKs raise, and stops there', () => {
    const t = new AnthropicStreamTranslator({ includeUsage: false });
    const [start, block] = wire(textStream());
    t.push(start!);
    t.push(block!);
    const error: WireEvent = { type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' }, request_id: null };
    const sdkError = { message: 'Overloaded', type: 'server_error', param: null, code: 'overloaded' };
    expect(t.push(wire([error])[0]!)).toEqual([`data: ${JSON.stringify({ error: sdkError })}\n\n`]);
    expect(t.push({ event: 'message_stop', data: '{"type":"message_stop"}' })).toEqual([]);
  });

  it('throws a typed error on a malformed event', () => {
    const t = new AnthropicStreamTranslator({ includeUsage: false });
    expect(() => t.push({ event: 'content_block_delta', data: '{not json' })).toThrow(AnthropicStreamError);
    expect(() => t.push({ event: 'content_block_delta', data: '{not json' })).toThrow(expect.objectContaining({ code: 'malformed_event' }));
  });

  it('ends a finished answer whose message_stop never came, and never invents an end for a cut one', () => {
    expect(translateStream(textStream().slice(0, -1)).at(-1)).toBe('data: [DONE]\n\n');
    expect(translateStream(textStream().slice(0, 4)).some((e) => e.includes('[DONE]') || e.includes('finish_reason":"'))).toBe(false);
  });

  it('produces a stream the openai SDK reads and accumulates into the same answer', async () => {
    const sdkRead = async (events: WireEvent[]) => {
      const response = new Response(translateStream(events).join(''), { headers: { 'content-type': 'text/event-stream' } });
      const stream = Stream.fromSSEResponse<OpenAI.ChatCompletionChunk>(response, new AbortController());
      return ChatCompletionStream.fromReadableStream(stream.toReadableStream()).finalChatCompletion();
    };
    const textAnswer = await sdkRead(textStream());
    expect(textAnswer.choices[0]).toMatchObject({ finish_reason: 'stop', message: { role: 'assistant', content: 'Hello, world!' } });
    const toolAnswer = await sdkRead(toolStream());
    expect(toolAnswer.choices[0]!.finish_reason).toBe('tool_calls');
    const toolArgs = toolAnswer.choices[0]!.message.tool_calls?.map((c) => c.type === 'function' && JSON.parse(c.function.arguments));
    expect(toolArgs).toEqual([{ location: 'Paris', unit: 'c' }, {}]);
    const boom: WireEvent = { type: 'error', error: { type: 'api_error', message: 'boom' }, request_id: null };
    const failing = new Response(translateStream([textStream()[0]!, boom]).join(''));
    await expect(async () => {
      for await (const _ of Stream.fromSSEResponse<OpenAI.ChatCompletionChunk>(failing, new AbortController())) void _;
    }).rejects.toThrow('boom');
  });
});
