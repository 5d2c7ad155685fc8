// Adversarial review of the Anthropic family (2026-12-05): the chat translation (request, answer, stream) and the
// /v1/messages route, driven with the official SDKs over real HTTP against scripted upstreams on 127.0.0.1.
import Anthropic from '@anthropic-ai/sdk';
import { describe, expect, it } from 'vitest';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';
import { json, type Script } from './helpers/scripted-provider.ts';
import { metricSum } from './helpers/stack.ts';
import { AnthropicStreamTranslator } from '../src/providers/anthropic/index.ts';
import { eventMeaning } from '../src/streaming/stream-events.ts';

const start = useScriptedUpstreams();

/** An Anthropic SSE event as Anthropic frames it: its name, then data carrying the same type. */
const aev = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
const messageStart = (usage: Record<string, unknown> = { input_tokens: 12, output_tokens: 1 }) =>
  aev('message_start', { message: { id: 'msg_01', type: 'message', role: 'assistant', model: 'claude-sonnet-4-5', content: [], stop_reason: null, stop_sequence: null, usage } });
const textBlock = (index: number, text: string) => [
  aev('content_block_start', { index, content_block: { type: 'text', text: '' } }),
  aev('content_block_delta', { index, delta: { type: 'text_delta', text } }),
  aev('content_block_stop', { index }),
];
const finish = (stop_reason: string, usage: Record<string, unknown> = { output_tokens: 9 }) => [aev('message_delta', { delta: { stop_reason, stop_sequence: null }, usage }), aev('message_stop', {})];
/** An error as a proxy in front of Anthropic may write it: data alone, no `event:` line and no `type`. */
const bareError = (type: string, message: string) => `data: ${JSON.stringify({ error: { type, message } })}\n\n`;
const whole = (steps: string[]): Script => ({ steps });

/** Timers far beyond the bounds asserted: an error read as a keepalive holds the stream until one of them. */
const longTimers = { provider: { timeouts: { connectMs: 1_000, firstTokenMs: 30_000, idleMs: 30_000 } } };

const anthropicClient = (url: string) => new Anthropic({ baseURL: url, apiKey: 'client-key', maxRetries: 0, logLevel: 'off' });
const ask = { model: 'claude-sonnet-4-6', max_tokens: 256, messages: [{ role: 'user' as const, content: 'hi' }] };

describe('an error object without a type in an Anthropic stream (no `event: error`, no `"type": "error"`)', () => {
  it('on /v1/messages, before the first output, is the 529 its overloaded_error stands for: retried, then raised as an OverloadedError', async () => {
    const { s, seen } = await start({ a: { answer: () => ({ steps: [messageStart(), bareError('overloaded_error', 'Overloaded')], hold: true }), family: 'anthropic' } }, [{ provider: 'a' }], {
      path: '/v1/messages',
      ...longTimers,
    });
    const t0 = Date.now();
    const err = await anthropicClient(s.url).messages.create({ ...ask, stream: true }).then(async (st) => {
      for await (const _ of st) void _;
    }).then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(Anthropic.OverloadedError);
    expect((err as InstanceType<typeof Anthropic.APIError>).status).toBe(529);
    expect(seen.a).toHaveLength(2); // FAST: two attempts
    expect(Date.now() - t0).toBeLessThan(10_000); // not held until the first-token timeout (30 s)
  });

  it('on /v1/messages, after the first output, ends the stream with an error the SDK raises, naming the overload', async () => {
    const { s } = await start({ a: { answer: () => ({ steps: [messageStart(), aev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }), aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Hel' } }), bareError('overloaded_error', 'Overloaded')], hold: true }), family: 'anthropic' } }, [{ provider: 'a' }], {
      path: '/v1/messages',
      ...longTimers,
    });
    const t0 = Date.now();
    let text = '';
    const err = await (async () => {
      const st = await anthropicClient(s.url).messages.create({ ...ask, stream: true });
      for await (const ev of st) if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
    })().then(() => undefined, (e: unknown) => e);
    expect(text).toBe('Hel');
    expect(String((err as Error | undefined)?.message)).toMatch(/Overloaded/);
    expect(Date.now() - t0).toBeLessThan(10_000); // not held until the idle timeout (30 s)
  });

  it('on a chat completion translated for Anthropic, before the first output, is the 529 it stands for', async () => {
    const { client, seen } = await start({ a: { answer: () => ({ steps: [messageStart(), bareError('overloaded_error', 'Overloaded')], hold: true }), family: 'anthropic' } }, [{ provider: 'a', model: 'claude-sonnet-4-5' }], longTimers);
    const t0 = Date.now();
    const err = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true }).then(async (st) => {
      for await (const _ of st) void _;
    }).then(() => undefined, (e: unknown) => e);
    expect((err as { status?: number }).status).toBe(529);
    expect(seen.a).toHaveLength(2);
    expect(Date.now() - t0).toBeLessThan(10_000);
  });

  it('on a chat completion translated for Anthropic, after the first output, ends the stream with the error the SDK raises', async () => {
    const { client } = await start({ a: { answer: () => ({ steps: [messageStart(), aev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }), aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Hel' } }), bareError('overloaded_error', 'Overloaded')], hold: true }), family: 'anthropic' } }, [{ provider: 'a', model: 'claude-sonnet-4-5' }], longTimers);
    const t0 = Date.now();
    let text = '';
    const err = await (async () => {
      const st = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
      for await (const c of st) text += c.choices[0]?.delta.content ?? '';
    })().then(() => undefined, (e: unknown) => e);
    expect(text).toBe('Hel');
    expect(String((err as Error | undefined)?.message)).toMatch(/Overloaded/);
    expect(Date.now() - t0).toBeLessThan(10_000);
  });
});

describe('an error object in an Anthropic event, read alone', () => {
  const data = (o: unknown) => ({ raw: `data: ${JSON.stringify(o)}`, data: JSON.stringify(o), event: null });
  it('is an error without a type, and stays what its type says with one (a type Anthropic adds may carry a part\'s error)', () => {
    expect(eventMeaning('messages', data({ error: { type: 'overloaded_error', message: 'Overloaded' } }))).toBe('error');
    expect(eventMeaning('messages', data({ error: 'boom' }))).toBe('error');
    expect(eventMeaning('messages', data({ type: 'some_future_event', error: { type: 'tool_error' } }))).toBe('keepalive');
    const t = new AnthropicStreamTranslator({ includeUsage: false, model: 'm' });
    expect(t.push({ event: null, data: JSON.stringify({ type: 'some_future_event', error: { type: 'tool_error' } }) })).toEqual([]);
    const [out] = t.push({ event: null, data: JSON.stringify({ error: { type: 'overloaded_error', message: 'Overloaded' } }) });
    expect(JSON.parse(out!.slice('data: '.length))).toEqual({ error: { message: 'Overloaded', type: 'server_error', param: null, code: 'overloaded' } });
    expect(t.push({ event: 'message_stop', data: '{"type":"message_stop"}' })).toEqual([]); // the stream is over
  });
});

describe('a whole Anthropic stream translated for a chat client', () => {
  it('parallel tool calls, thinking and a server tool block, streamed, come back with their own indexes and ids', async () => {
    const steps = [
      messageStart({ input_tokens: 5, cache_read_input_tokens: 100, cache_creation_input_tokens: 20, output_tokens: 1 }),
      aev('ping', {}),
      aev('content_block_start', { index: 0, content_block: { type: 'thinking', thinking: '' } }),
      aev('content_block_delta', { index: 0, delta: { type: 'thinking_delta', thinking: 'hmm' } }),
      aev('content_block_delta', { index: 0, delta: { type: 'signature_delta', signature: 'sig' } }),
      aev('content_block_stop', { index: 0 }),
      aev('content_block_start', { index: 1, content_block: { type: 'redacted_thinking', data: 'xx' } }),
      aev('content_block_stop', { index: 1 }),
      ...textBlock(2, 'Checking both.'),
      aev('content_block_start', { index: 3, content_block: { type: 'tool_use', id: 'toolu_A', name: 'get_weather', input: {} } }),
      aev('content_block_delta', { index: 3, delta: { type: 'input_json_delta', partial_json: '{"city":' } }),
      aev('content_block_delta', { index: 3, delta: { type: 'input_json_delta', partial_json: '"Paris"}' } }),
      aev('content_block_stop', { index: 3 }),
      aev('content_block_start', { index: 4, content_block: { type: 'tool_use', id: 'toolu_B', name: 'get_time', input: {} } }),
      aev('content_block_stop', { index: 4 }),
      ...finish('tool_use', { output_tokens: 40, input_tokens: null }),
    ];
    const { client } = await start({ a: { answer: () => whole(steps), family: 'anthropic' } }, [{ provider: 'a', model: 'claude-sonnet-4-5' }]);
    const tools = ['get_weather', 'get_time'].map((name) => ({ type: 'function' as const, function: { name, parameters: { type: 'object', properties: {} } } }));
    const final = await client.chat.completions.stream({ model: 'gpt-4o', messages: [{ role: 'user', content: 'w?' }], tools, stream_options: { include_usage: true } }).finalChatCompletion();
    const m = final.choices[0]!.message as typeof final.choices[0]['message'] & { reasoning_content?: string };
    expect(m.content).toBe('Checking both.');
    expect(m.tool_calls?.map((c) => [c.id, (c as { function: { name: string; arguments: string } }).function.name, (c as { function: { arguments: string } }).function.arguments])).toEqual([
      ['toolu_A', 'get_weather', '{"city":"Paris"}'],
      ['toolu_B', 'get_time', '{}'],
    ]);
    expect(final.choices[0]!.finish_reason).toBe('tool_calls');
    expect(final.usage).toMatchObject({ prompt_tokens: 125, completion_tokens: 40, total_tokens: 165, prompt_tokens_details: { cached_tokens: 100 } });
  });
});

describe('usage of a chat stream translated from Anthropic', () => {
  it('keeps the prompt tokens of message_start when message_delta reports its input as 0 (SGLang, compatible servers)', async () => {
    // Anthropic's message_delta counts are cumulative; an Anthropic-compatible server that writes input_tokens: 0 there
    // (SGLang sent it so, by design, in 2026) does not undo the input it reported in message_start: counts only grow.
    const steps = [
      messageStart({ input_tokens: 25, cache_read_input_tokens: 100, output_tokens: 1 }),
      ...textBlock(0, 'Hello'),
      ...finish('end_turn', { input_tokens: 0, cache_read_input_tokens: 0, output_tokens: 40 }),
    ];
    const { client, s } = await start({ a: { answer: () => whole(steps), family: 'anthropic' } }, [{ provider: 'a', model: 'claude-sonnet-4-5' }]);
    const final = await client.chat.completions.stream({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream_options: { include_usage: true } }).finalChatCompletion();
    expect(final.usage).toMatchObject({ prompt_tokens: 125, completion_tokens: 40, total_tokens: 165, prompt_tokens_details: { cached_tokens: 100 } });
    // And the gateway's own count, which bills the target and a client's token rate.
    expect(await metricSum(s, 'stormgate_tokens_total{route="chat",target="a/claude-sonnet-4-5",kind="prompt"}')).toBe(125);
  });
});

describe('an Anthropic error object answered with a 200 (a relay that puts its errors in a 200 body)', () => {
  const overloaded = { type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } };
  it('on /v1/messages is the 529 its type stands for: retried, then the SDK raises an OverloadedError with Anthropic\'s own body', async () => {
    const { s, seen } = await start({ a: { answer: () => json(200, overloaded), family: 'anthropic' } }, [{ provider: 'a' }], { path: '/v1/messages' });
    const err = await anthropicClient(s.url).messages.create(ask).then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(Anthropic.OverloadedError);
    expect((err as InstanceType<typeof Anthropic.APIError>).error).toMatchObject(overloaded);
    expect(seen.a).toHaveLength(2);
  });

  it('on a chat completion translated for Anthropic is the 529 it stands for, in the OpenAI shape', async () => {
    const { client, seen } = await start({ a: { answer: () => json(200, overloaded), family: 'anthropic' } }, [{ provider: 'a', model: 'claude-sonnet-4-6' }]);
    const err = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }).then(() => undefined, (e: unknown) => e);
    expect((err as { status?: number }).status).toBe(529);
    expect((err as { code?: string }).code).toBe('overloaded');
    expect(seen.a).toHaveLength(2);
  });
});
