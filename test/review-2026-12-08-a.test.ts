// Review of 2026-12-07's changes (861f50b..519810c), adversarial: usageOfBody rewritten to parse the usage object after
// the last "usage" key (src/streaming/usage.ts), and splice refusing a continuation that is not plain text before the
// seam (src/pipeline/stream-recovery.ts). Nothing found broken; these pin what was tried, so a later rewrite keeps it:
//  - every ordinary body (chat with every usage detail, pretty-printed, an embeddings answer, a Responses answer with
//    its echoed tools and metadata, an Anthropic answer with cache counts) gives the numbers the regex gave before;
//  - the text `"usage": {` inside a JSON string is escaped and never read; Buffer.lastIndexOf and toString both take
//    byte offsets, so multi-byte text before, inside or after the usage object moves nothing;
//  - a continuation's role chunk full of nulls (`content`, `refusal`, `function_call`, `audio`), an empty `tool_calls`
//    and reasoning deltas before its text are still spliced on.
import { describe, expect, it } from 'vitest';
import { usageOf, usageOfBody } from '../src/streaming/usage.ts';
import { DeliveredText } from '../src/pipeline/delivered-text.ts';
import { cc, delta, type Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';
import { deliverData } from './helpers/live-stream.ts';

const read = (body: unknown) => usageOfBody(Buffer.from(typeof body === 'string' ? body : JSON.stringify(body)));

const chatUsage = {
  prompt_tokens: 19, completion_tokens: 10, total_tokens: 29,
  prompt_tokens_details: { cached_tokens: 0, audio_tokens: 0 },
  completion_tokens_details: { reasoning_tokens: 0, audio_tokens: 0, accepted_prediction_tokens: 0, rejected_prediction_tokens: 0 },
};
/** An OpenAI chat completion whose text and tool arguments both hold `"usage": {` with other counts. */
const chat = {
  id: 'chatcmpl-abc', object: 'chat.completion', created: 1, model: 'gpt-4o',
  choices: [{
    index: 0, logprobs: null, finish_reason: 'tool_calls',
    message: {
      role: 'assistant', content: 'The log says "usage": {"prompt_tokens": 99, "completion_tokens": 98}', refusal: null, annotations: [],
      tool_calls: [{ id: 'c', type: 'function', function: { name: 'record', arguments: JSON.stringify({ usage: { prompt_tokens: 7, completion_tokens: 8 } }) } }],
    },
  }],
  usage: chatUsage, service_tier: 'default', system_fingerprint: 'fp_x',
};

describe('usage of a whole answer, read from its usage object', () => {
  it('gives an OpenAI chat completion\'s counts, compact or pretty-printed, past "usage": { in its strings', () => {
    for (const body of [JSON.stringify(chat), JSON.stringify(chat, null, 2), JSON.stringify(chat, null, '\t'), JSON.stringify(chat, null, 2).replaceAll('\n', '\r\n')]) {
      expect(read(body)).toEqual({ prompt: 19, completion: 10 });
    }
  });

  it('gives an embeddings answer\'s prompt, and an Anthropic answer\'s prompt with its cache counts', () => {
    expect(read({ object: 'list', data: [{ object: 'embedding', index: 0, embedding: [0.1] }], model: 'e', usage: { prompt_tokens: 8, total_tokens: 8 } })).toEqual({ prompt: 8, completion: 0 });
    const anthropic = {
      id: 'msg_1', type: 'message', role: 'assistant', model: 'claude-sonnet-4-5',
      content: [{ type: 'tool_use', id: 't', name: 'record', input: { usage: { input_tokens: 1, output_tokens: 2 } } }],
      stop_reason: 'tool_use', stop_sequence: null,
      usage: { input_tokens: 3, cache_creation_input_tokens: 100, cache_read_input_tokens: 2000, cache_creation: { ephemeral_5m_input_tokens: 100, ephemeral_1h_input_tokens: 0 }, output_tokens: 50, service_tier: 'standard' },
    };
    expect(read(anthropic)).toEqual({ prompt: 2103, completion: 50 });
    expect(read(JSON.stringify(anthropic, null, 4))).toEqual({ prompt: 2103, completion: 50 });
  });

  it('gives a Responses answer\'s counts past its echoed tool schema and the metadata after it, both naming "usage"', () => {
    const tools = [{ type: 'function', name: 'report', parameters: { type: 'object', properties: { usage: { type: 'object', properties: { input_tokens: { type: 'integer' } } } } } }];
    const usage = { input_tokens: 36, input_tokens_details: { cached_tokens: 0 }, output_tokens: 87, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 123 };
    const body = { id: 'resp_1', object: 'response', status: 'completed', output: [], tools, usage, user: null, metadata: { usage: 'high', note: '"usage": {"input_tokens": 5}' } };
    expect(read(body)).toEqual({ prompt: 36, completion: 87 });
    expect(read(JSON.stringify(body, null, 2))).toEqual({ prompt: 36, completion: 87 });
  });

  it('counts bytes throughout: multi-byte text before, inside and after the usage object moves nothing', () => {
    const usage = '"usage":{"prompt_tokens":11,"completion_tokens":22,"service_tier":"标准😀"}';
    expect(read(`{"c":"${'😀'.repeat(3000)}",${usage}}`)).toEqual({ prompt: 11, completion: 22 });
    // The 4 KB read ends inside a 4-byte character, past the object's end.
    expect(read(`{${usage},"x":"${'😀'.repeat(3000)}"}`)).toEqual({ prompt: 11, completion: 22 });
    expect(read(`{${usage}}`)).toEqual({ prompt: 11, completion: 22 });
    expect(read('{"usage":{"prompt_tokens":1,"completion_tokens":2,"note":"}]}{\\"x"}}')).toEqual({ prompt: 1, completion: 2 });
  });

  it('has none for usage null, {}, none at all, and a usage object cut by the body\'s end', () => {
    expect(read({ ...chat, usage: null })).toBeUndefined();
    expect(read({ ...chat, usage: {} })).toBeUndefined();
    // Counts that are all null are no usage either (charged by the output, as without usage), whole or streamed.
    expect(read({ ...chat, usage: { prompt_tokens: null, completion_tokens: null, total_tokens: null } })).toBeUndefined();
    expect(usageOf({ choices: [], usage: { prompt_tokens: null, completion_tokens: null } })).toBeUndefined();
    expect(read({ ...chat, usage: undefined })).toBeUndefined();
    const whole = JSON.stringify(chat);
    expect(read(whole.slice(0, whole.indexOf('"total_tokens"')))).toBeUndefined();
  });
});

describe('a continuation\'s events before the seam, as plain text or not', () => {
  it('takes a role chunk of nulls and an empty tool_calls, and reasoning, as plain text', () => {
    const seen = new DeliveredText();
    deliverData(seen, JSON.stringify({ choices: [{ index: 0, delta: { role: 'assistant', content: null, refusal: null, tool_calls: [], function_call: null, audio: null } }] }));
    deliverData(seen, JSON.stringify({ choices: [{ index: 0, delta: { reasoning_content: 'Thinking.', reasoning: null } }] }));
    deliverData(seen, JSON.stringify({ choices: [], usage: null }));
    expect(seen.notPlainText).toBe(false);
  });

  const startUpstreams = useScriptedUpstreams();
  const cut = { destroy: true } as const;
  const messages = [{ role: 'user' as const, content: 'Where is my order?' }];

  it('splices on a continuation that opens with such a role chunk and reasoning before its text', async () => {
    const p: Script = { steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hello' })]), 30, cut] };
    const q: Script = {
      steps: [
        cc([delta({ role: 'assistant', content: null, refusal: null, tool_calls: [], function_call: null, audio: null })]),
        cc([delta({ reasoning_content: 'The user wants a greeting.' })]),
        cc([delta({ content: 'Hel' })]),
        cc([delta({ content: 'lo world' })]),
        cc([delta({}, 'stop')]),
        'data: [DONE]\n\n',
      ],
    };
    const { client } = await startUpstreams({ p: () => p, q: () => q }, [{ provider: 'p' }, { provider: 'q' }], { route: { streamRecovery: 'continue' } });
    const done = await client.chat.completions.stream({ model: 'gpt-4o', messages }).finalChatCompletion();
    expect(done.choices[0]!.message.content).toBe('Hello world');
    expect(done.choices[0]!.finish_reason).toBe('stop');
  });
});
