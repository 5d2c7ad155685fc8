import { describe, expect, it } from 'vitest';
import { usageOf, usageOfBody } from '../src/streaming/usage.ts';

describe('token usage', () => {
  it('reads chat, embeddings and Responses API usage from a whole body', () => {
    const chat = { id: 'x', choices: [{ message: { content: 'the "usage" word in text' } }], usage: { prompt_tokens: 12, completion_tokens: 34, total_tokens: 46 } };
    expect(usageOfBody(Buffer.from(JSON.stringify(chat)))).toEqual({ prompt: 12, completion: 34 });
    expect(usageOfBody(Buffer.from(JSON.stringify({ data: [], usage: { prompt_tokens: 5, total_tokens: 5 } })))).toEqual({ prompt: 5, completion: 0 });
    const responses = { output: [], usage: { input_tokens: 7, input_tokens_details: { cached_tokens: 3 }, output_tokens: 9, output_tokens_details: { reasoning_tokens: 1 } } };
    expect(usageOfBody(Buffer.from(JSON.stringify(responses)))).toEqual({ prompt: 7, completion: 9 });
    expect(usageOfBody(Buffer.from('{"id":"no usage here"}'))).toBeUndefined();
  });

  it('reads a stream event\'s usage, the Responses API\'s completed event included', () => {
    expect(usageOf({ choices: [], usage: { prompt_tokens: 1, completion_tokens: 2 } })).toEqual({ prompt: 1, completion: 2 });
    expect(usageOf({ type: 'response.completed', response: { usage: { input_tokens: 3, output_tokens: 4 } } })).toEqual({ prompt: 3, completion: 4 });
    expect(usageOf({ choices: [], usage: null })).toBeUndefined();
  });

  it('counts Anthropic\'s prompt-cache reads and writes as prompt tokens, in a whole message and in message_start', () => {
    const usage = { input_tokens: 4, cache_creation_input_tokens: 300, cache_read_input_tokens: 50_000, cache_creation: { ephemeral_5m_input_tokens: 300 }, output_tokens: 9 };
    expect(usageOfBody(Buffer.from(JSON.stringify({ type: 'message', content: [], usage })))).toEqual({ prompt: 50_304, completion: 9 });
    expect(usageOf({ type: 'message_start', message: { usage: { ...usage, output_tokens: 1 } } })).toEqual({ prompt: 50_304, completion: 1 });
    // A chat usage (the translation's) already holds them in prompt_tokens.
    expect(usageOf({ choices: [], usage: { prompt_tokens: 50_304, completion_tokens: 9, prompt_tokens_details: { cached_tokens: 50_000 } } })).toEqual({ prompt: 50_304, completion: 9 });
  });

  it('counts no usage it cannot add to a counter: a negative or NaN count, or digits past what a number holds', () => {
    // prom-client throws on such an increment, and the request was then neither logged nor counted.
    expect(usageOf({ type: 'message_start', message: { usage: { input_tokens: 0, cache_read_input_tokens: -1000, output_tokens: 1 } } })).toBeUndefined();
    expect(usageOf({ usage: { input_tokens: -5, output_tokens: 1 } })).toBeUndefined();
    expect(usageOf({ usage: { input_tokens: 5, cache_creation_input_tokens: 'many', output_tokens: 1 } })).toBeUndefined();
    expect(usageOfBody(Buffer.from(`{"type":"message","content":[],"usage":{"input_tokens":${'9'.repeat(400)},"output_tokens":2}}`))).toBeUndefined();
    expect(usageOfBody(Buffer.from(`{"type":"message","content":[],"usage":{"input_tokens":1,"cache_read_input_tokens":${'9'.repeat(400)},"output_tokens":2}}`))).toBeUndefined();
    expect(usageOf({ usage: { input_tokens: 5, cache_read_input_tokens: null, output_tokens: 1 } })).toEqual({ prompt: 5, completion: 1 });
  });
});
