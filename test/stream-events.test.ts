// What an SSE event means for the first-token timer and the end of a stream, per API. An output event the gateway
// does not recognise holds the stream back (nothing reaches the client) until the first-token timeout retries it,
// and the provider runs, and bills, the request again.
import { describe, expect, it } from 'vitest';
import { cutShort, eventMeaning } from '../src/streaming/stream-events.ts';
import type { SseEvent } from '../src/streaming/sse-parser.ts';

const ev = (data: unknown, event: string | null = null): SseEvent => {
  const text = typeof data === 'string' ? data : JSON.stringify(data);
  return { raw: `${event ? `event: ${event}\n` : ''}data: ${text}`, data: text, event };
};
const chunk = (delta: Record<string, unknown>, finish: string | null = null) => ({ object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: finish }] });

describe('chat chunks', () => {
  it('counts text, tool calls, reasoning, refusals and audio as output; a role-only or usage chunk is not', () => {
    expect(eventMeaning('chat', ev(chunk({ content: 'Hi' })))).toBe('output');
    expect(eventMeaning('chat', ev(chunk({ tool_calls: [{ index: 0, function: { arguments: '{' } }] })))).toBe('output');
    expect(eventMeaning('chat', ev(chunk({ reasoning_content: 'thinking' })))).toBe('output');
    expect(eventMeaning('chat', ev(chunk({ refusal: 'no' })))).toBe('output');
    // gpt-4o-audio with modalities ["text", "audio"]: the answer comes as audio pieces and their transcript, no content.
    expect(eventMeaning('chat', ev(chunk({ audio: { id: 'audio_1', data: 'UklGR', transcript: 'Hel' } })))).toBe('output');
    expect(eventMeaning('chat', ev(chunk({ role: 'assistant', content: '' })))).toBe('keepalive');
    expect(eventMeaning('chat', ev({ object: 'chat.completion.chunk', choices: [], usage: { total_tokens: 3 } }))).toBe('keepalive');
    expect(eventMeaning('chat', ev(chunk({}, 'stop')))).toBe('finish');
    expect(eventMeaning('chat', ev('[DONE]'))).toBe('done');
    expect(eventMeaning('chat', ev('{"choices":[{"delta":'))).toBe('malformed');
  });
});

// vLLM's finish_reason "abort" after the first output: the answer cut short, with what its chunk still carries.
describe('an answer vLLM aborted', () => {
  it('leaves the chunk\'s own text, and another choice\'s finish, with the abort taken out', () => {
    const short = cutShort('chat', ev(chunk({ content: 'lo' }, 'abort')));
    expect(short?.why).toContain('finish_reason "abort"');
    expect(JSON.parse(short!.left!.data!)).toEqual(chunk({ content: 'lo' }));
    const two = { object: 'chat.completion.chunk', choices: [{ index: 0, delta: {}, finish_reason: 'stop' }, { index: 1, delta: {}, finish_reason: 'abort' }] };
    expect(JSON.parse(cutShort('chat', ev(two))!.left!.data!).choices.map((c: { finish_reason: unknown }) => c.finish_reason)).toEqual(['stop', null]);
    expect(cutShort('completions', ev({ object: 'text_completion', choices: [{ index: 0, text: 'lo', finish_reason: 'abort' }] }))?.left?.data).toContain('"text":"lo","finish_reason":null');
  });

  it('leaves nothing of a chunk that carried only the abort, and is no other event', () => {
    expect(cutShort('chat', ev(chunk({}, 'abort')))).toEqual({ left: undefined, why: expect.stringContaining('abort') });
    expect(cutShort('chat', ev(chunk({ content: 'abort' })))).toBeUndefined();
    expect(cutShort('chat', ev({ error: { message: 'engine dead' }, choices: [{ index: 0, delta: {}, finish_reason: 'abort' }] }))).toBeUndefined();
    expect(cutShort('responses', ev({ type: 'abort' }))).toBeUndefined();
  });
});

describe('Responses API events', () => {
  it('counts every delta, partial image and finished output item as output, and progress events as keep-alives', () => {
    for (const type of [
      'response.output_text.delta',
      'response.function_call_arguments.delta',
      'response.reasoning_summary_text.delta',
      'response.audio.delta',
      'response.audio.transcript.delta',
      'response.code_interpreter_call_code.delta',
      'response.mcp_call_arguments.delta',
      'response.image_generation_call.partial_image',
      'response.output_item.done',
    ]) {
      expect(eventMeaning('responses', ev({ type }, type)), type).toBe('output');
    }
    for (const type of ['response.created', 'response.in_progress', 'response.output_item.added', 'response.web_search_call.searching']) {
      expect(eventMeaning('responses', ev({ type }, type)), type).toBe('keepalive');
    }
    expect(eventMeaning('responses', ev({ type: 'response.completed' }, 'response.completed'))).toBe('finish');
    expect(eventMeaning('responses', ev({ type: 'response.failed' }, 'response.failed'))).toBe('error');
  });
});

describe('a path without a known API', () => {
  it('counts any data as output, whatever its format; an error event is still an error', () => {
    expect(eventMeaning('other', ev({ type: 'message_start', message: {} }, 'message_start'))).toBe('output');
    expect(eventMeaning('other', ev('not json at all'))).toBe('output');
    expect(eventMeaning('other', { raw: ': ping', data: null, event: null })).toBe('keepalive');
    expect(eventMeaning('other', ev({ error: { message: 'x' } }, 'error'))).toBe('error');
  });
});

describe('Anthropic Messages events (routes on /v1/messages)', () => {
  const a = (data: Record<string, unknown>) => ev(data, String(data.type));
  it('counts a content delta with something in it, and a block that opens with content, as output', () => {
    expect(eventMeaning('messages', a({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'Hi' } }))).toBe('output');
    // Extended thinking: a reasoning model's first output is its thinking, long before any text.
    expect(eventMeaning('messages', a({ type: 'content_block_delta', index: 0, delta: { type: 'thinking_delta', thinking: 'Let me' } }))).toBe('output');
    expect(eventMeaning('messages', a({ type: 'content_block_delta', index: 1, delta: { type: 'input_json_delta', partial_json: '{"x"' } }))).toBe('output');
    expect(eventMeaning('messages', a({ type: 'content_block_delta', index: 0, delta: { type: 'signature_delta', signature: 'EqQB' } }))).toBe('output');
    expect(eventMeaning('messages', a({ type: 'content_block_start', index: 0, content_block: { type: 'tool_use', id: 'toolu_1', name: 'lookup', input: {} } }))).toBe('output');
    expect(eventMeaning('messages', a({ type: 'content_block_start', index: 0, content_block: { type: 'redacted_thinking', data: 'xyz' } }))).toBe('output');
  });

  it('reads empty blocks, pings and the message\'s start as keep-alives, its stop_reason as the finish and message_stop as the end', () => {
    expect(eventMeaning('messages', a({ type: 'message_start', message: { id: 'msg_1', content: [], usage: { input_tokens: 5 } } }))).toBe('keepalive');
    expect(eventMeaning('messages', a({ type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } }))).toBe('keepalive');
    expect(eventMeaning('messages', a({ type: 'content_block_start', index: 0, content_block: { type: 'thinking', thinking: '' } }))).toBe('keepalive');
    expect(eventMeaning('messages', a({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: '' } }))).toBe('keepalive');
    expect(eventMeaning('messages', a({ type: 'ping' }))).toBe('keepalive');
    expect(eventMeaning('messages', a({ type: 'content_block_stop', index: 0 }))).toBe('keepalive');
    expect(eventMeaning('messages', a({ type: 'some_future_event' }))).toBe('keepalive');
    expect(eventMeaning('messages', a({ type: 'message_delta', delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 9 } }))).toBe('finish');
    expect(eventMeaning('messages', a({ type: 'message_delta', delta: { stop_reason: null }, usage: { output_tokens: 9 } }))).toBe('keepalive');
    expect(eventMeaning('messages', a({ type: 'message_stop' }))).toBe('done');
    expect(eventMeaning('messages', a({ type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } }))).toBe('error');
    expect(eventMeaning('messages', ev('{"type":"content_block_delta",', 'content_block_delta'))).toBe('malformed');
    // `[DONE]` is chat's, not Anthropic's: on this API it is not JSON.
    expect(eventMeaning('messages', ev('[DONE]'))).toBe('malformed');
  });
});
