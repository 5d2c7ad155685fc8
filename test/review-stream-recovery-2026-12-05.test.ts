// Review of streamRecovery (2026-12-05): the seams a continuation leaves in the text the client assembles.
import { describe, expect, it } from 'vitest';
import { streamedText } from './helpers/chat-stream.ts';
import { cc, delta, type Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';

const cut = { destroy: true } as const;
const DONE = 'data: [DONE]\n\n';
const role = cc([delta({ role: 'assistant', content: '' })]);
const said = (t: string) => cc([delta({ content: t })]);
const stop = cc([delta({}, 'stop')]);
const ant = (type: string, body: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...body })}\n\n`;
/** A Claude stream of text deltas, as Anthropic sends it. */
function claude(text: string[]): Script {
  return {
    steps: [
      ant('message_start', { message: { id: 'msg_1', type: 'message', role: 'assistant', model: 'claude-sonnet-4-5', content: [], stop_reason: null, usage: { input_tokens: 20, output_tokens: 1 } } }),
      ant('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
      ...text.map((t) => ant('content_block_delta', { index: 0, delta: { type: 'text_delta', text: t } })),
      ant('content_block_stop', { index: 0 }),
      ant('message_delta', { delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 7 } }),
      ant('message_stop', {}),
    ],
  };
}
const start = useScriptedUpstreams();
const messages = [{ role: 'user' as const, content: 'Write f.' }];

describe('a continuation by prefill after a cut that left whitespace at the end of the delivered text', () => {
  // The prefill goes without its trailing whitespace (Anthropic refuses it), so the model writes that whitespace
  // again; only what the client already has may be taken off the continuation's start, not all of its whitespace.
  it.each([
    ['the indentation of the next line of code', 'def f():\n', ['\n    return 1\n'], 'def f():\n    return 1\n'],
    ['the indentation, sent apart from its line break', 'def f():\n', ['\n', '    return 1\n'], 'def f():\n    return 1\n'],
    ['a paragraph break of which the client had half', 'Title\n', ['\n\nBody.'], 'Title\n\nBody.'],
    ['an indentation the cut split', 'def f():\n  ', ['\n    return 1'], 'def f():\n    return 1'],
  ])('keeps %s (Anthropic target)', async (_what, delivered, continuation, whole) => {
    const { client, seen } = await start(
      { p: () => ({ steps: [role, said(delivered), 30, cut] }), q: { answer: () => claude(continuation), family: 'anthropic' } },
      [{ provider: 'p' }, { provider: 'q', model: 'claude-sonnet-4-5' }],
      { route: { streamRecovery: 'continue' } },
    );
    const { text, err } = await streamedText(await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }));
    expect(err).toBeUndefined();
    expect((seen.q![0]!.body.messages as Array<{ content: unknown }>).at(-1)).toEqual({ role: 'assistant', content: [{ type: 'text', text: delivered.trimEnd() }] });
    expect(text).toBe(whole);
  });

  it('keeps the indentation at an OpenAI-compatible target that takes a prefill, and finishes through the SDK helper', async () => {
    const { client } = await start(
      { p: () => ({ steps: [role, said('```python\ndef f():\n'), 30, cut] }), q: () => ({ steps: [role, said('\n'), said('    return 1\n```'), stop, DONE] }) },
      [{ provider: 'p' }, { provider: 'q' }],
      { route: { streamRecovery: 'continue' }, providers: { q: { prefill: true } } },
    );
    const done = await client.chat.completions.stream({ model: 'gpt-4o', messages }).finalChatCompletion();
    expect(done.choices[0]!.message.content).toBe('```python\ndef f():\n    return 1\n```');
    expect(done.choices[0]!.finish_reason).toBe('stop');
  });
});

describe('a structured answer (response_format) cut in the middle of its JSON', () => {
  const schema = { type: 'object', properties: { a: { type: 'number' }, b: { type: 'string' } }, required: ['a', 'b'], additionalProperties: false };
  const response_format = { type: 'json_schema' as const, json_schema: { name: 'o', strict: true, schema } };
  /** What a grammar-constrained server writes after any prefill: the schema's object from its start. */
  const wholeObject = () => ({ steps: [role, said('{"a": 1, '), said('"b": "x"}'), stop, DONE] });

  it('is not continued by a prefill, which structured decoding answers with a second object: spliced on, the JSON parses', async () => {
    const { client, seen } = await start(
      { p: () => ({ steps: [role, said('{"a": 1, '), 30, cut] }), q: wholeObject },
      [{ provider: 'p' }, { provider: 'q' }],
      { route: { streamRecovery: 'continue' }, providers: { q: { prefill: true } } },
    );
    const done = await client.chat.completions.stream({ model: 'gpt-4o', messages, response_format }).finalChatCompletion();
    // q was asked the request as the client sent it, and its answer began with the delivered text.
    expect(seen.q!).toHaveLength(1);
    expect(seen.q![0]!.body.messages).toEqual(messages);
    expect(JSON.parse(done.choices[0]!.message.content!)).toEqual({ a: 1, b: 'x' });
  });

  it('is not sent to a Claude model as a prefill: the client gets the cut, never an object glued into another', async () => {
    const { client, seen } = await start(
      { p: () => ({ steps: [role, said('{"a": 1, '), 30, cut] }), q: { answer: () => claude(['{"a": 1, "b": "x"}']), family: 'anthropic' } },
      [{ provider: 'p' }, { provider: 'q', model: 'claude-sonnet-4-5' }],
      { route: { streamRecovery: 'continue' } },
    );
    const { text, err } = await streamedText(await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true, response_format }));
    expect(String(err)).toMatch(/cut|ended before the answer was complete/);
    expect(text).toBe('{"a": 1, ');
    expect(seen.q!).toHaveLength(0);
  });
});

describe('an OpenAI-compatible answer spliced on', () => {
  it("keeps the usage its provider put on the chunk where the splice falls (its last, with the finish): the client asked for it", async () => {
    // Some compatible servers (Gemini's) put the usage on the finishing chunk, with its text and finish_reason.
    const usage = { prompt_tokens: 5, completion_tokens: 3, total_tokens: 8 };
    const { client } = await start(
      { p: () => ({ steps: [role, said('Hello wor'), 30, cut] }), q: () => ({ steps: [role, said('Hello'), cc([delta({ content: ' world' }, 'stop')], { usage }), DONE] }) },
      [{ provider: 'p' }, { provider: 'q' }],
      { route: { streamRecovery: 'continue' } },
    );
    const done = await client.chat.completions.stream({ model: 'gpt-4o', messages, stream_options: { include_usage: true } }).finalChatCompletion();
    expect(done.choices[0]!.message.content).toBe('Hello world');
    expect(done.choices[0]!.finish_reason).toBe('stop');
    expect(done.usage).toEqual(usage);
  });
});
