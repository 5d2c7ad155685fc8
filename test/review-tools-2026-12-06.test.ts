// The openai SDK's tool and structured-output helpers through config/examples/openai-anthropic-failover.yaml when the
// OpenAI primary fails in three ways (a 503, a 429 whose retry-after is past maxWaitHintMs, a stream cut before its
// first output) and the Anthropic backup (a second mock) answers through translation. New beside
// review-sdk-helpers-2026-12-06: nested/nullable zod schemas, tool_choice required and named with
// parallel_tool_calls false, runTools() with a named tool, a manual multi-turn loop with tool results (string and
// text-part content), the SDK's parsed message sent back as it is, n: 2, stop, max_completion_tokens and
// stream_options.include_usage on the backup, and why the request left the primary (x-stormgate-fallback).
// Found no defect: every helper got a valid answer from the backup; n: 2 gets the primary's own failure naming why
// the backup was not tried.
import OpenAI from 'openai';
import { LengthFinishReasonError } from 'openai/core/error';
import { zodFunction, zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';
import { describe, expect, it } from 'vitest';
import { loadConfigFile } from '../src/config/load.ts';
import type { ConfigInput } from '../src/config/schema.ts';
import type { MockServer } from '../src/mock/server.ts';
import { TEST_KEY, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';

const stack = useStacks();
const mocks = useExtraMocks();

type Fault = '503' | '429' | 'cut';
const FAULTS: Fault[] = ['503', '429', 'cut'];

async function control(mock: MockServer, path: string, body: unknown): Promise<void> {
  const res = await fetch(`${mock.url}${path}`, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  expect(res.status).toBe(200);
}

/** The failover example, the stack's mock as OpenAI (failing as `fault` says), a second mock as Anthropic. */
async function failoverStack(fault: Fault): Promise<{ s: Stack; primary: MockServer; backup: MockServer }> {
  const backup = await mocks({ apiKey: TEST_KEY });
  const s = await stack({
    config: (url) => {
      const base = loadConfigFile('config/examples/openai-anthropic-failover.yaml', { OPENAI_BASE_URL: `${url}/v1`, OPENAI_API_KEY: TEST_KEY, ANTHROPIC_BASE_URL: backup.url, ANTHROPIC_API_KEY: TEST_KEY }) as ConfigInput;
      return { ...base, server: { ...base.server, port: 0 } };
    },
  });
  if (fault === '503') await control(s.mock, '/_mock/faults', { errors: [{ status: 503 }] });
  if (fault === '429') await control(s.mock, '/_mock/faults', { errors: [{ status: 429, code: 'rate_limit_exceeded', type: 'requests', headers: { 'retry-after': '120' } }] });
  if (fault === 'cut') await control(s.mock, '/_mock/faults', { stream: { cutAfterChunks: 0 } });
  return { s, primary: s.mock, backup };
}

/** Why the request left the primary, per fault (x-stormgate-fallback). */
const REASON: Record<Fault, string> = { '503': 'retries_exhausted', '429': 'wait_hint', cut: 'retries_exhausted' };

const client = (s: Stack) => new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client', maxRetries: 0, logLevel: 'off' });
const ask = [{ role: 'user' as const, content: 'What is the weather in Paris?' }];
const backupAnswered = (backup: MockServer, n: number) => expect(backup.requests().filter((r) => r.status === 200)).toHaveLength(n);

const Forecast = z.object({
  city: z.string(),
  days: z.array(z.object({ day: z.enum(['mon', 'tue']), high: z.number(), note: z.string().nullable() })),
  alert: z.object({ level: z.number().int(), text: z.string() }).nullable(),
});

const weatherTools = [
  zodFunction({ name: 'get_weather', parameters: z.object({ x: z.number() }) }),
  zodFunction({ name: 'get_time', parameters: z.object({ x: z.number() }) }),
];

describe.each(FAULTS)('the openai SDK tool helpers, the primary failing with %s, the Anthropic backup answering', (fault) => {
  // A streamed tool-call answer's first chunk already opens the call (its id and name), as OpenAI's does, so the mock
  // cannot cut one before its first output: under `cut` the tool tests would check a mid-stream cut, covered elsewhere.
  const itTools = fault === 'cut' ? it.skip : it;
  it('stream() with a nested, nullable zod response_format: parsed valid, usage last', async () => {
    const { s, backup } = await failoverStack(fault);
    const c = client(s);
    const st = c.chat.completions.stream({ model: 'gpt-4o', messages: ask, response_format: zodResponseFormat(Forecast, 'forecast'), stream_options: { include_usage: true } });
    const chunks: OpenAI.ChatCompletionChunk[] = [];
    st.on('chunk', (ch) => chunks.push(ch));
    const final = await st.finalChatCompletion();
    const parsed = final.choices[0]!.message.parsed;
    expect(Forecast.safeParse(parsed).success).toBe(true);
    expect(final.model).toBe('claude-sonnet-4-6');
    expect(chunks.at(-1)!.choices).toEqual([]);
    expect(chunks.at(-1)!.usage!.total_tokens).toBeGreaterThan(0);
    if (fault !== 'cut') {
      const whole = await c.chat.completions.parse({ model: 'gpt-4o', messages: ask, response_format: zodResponseFormat(Forecast, 'forecast') });
      expect(Forecast.safeParse(whole.choices[0]!.message.parsed).success).toBe(true);
      backupAnswered(backup, 2);
    }
  });

  it('the answer says why it left the primary (x-stormgate-fallback) and which target served it', async () => {
    const { s } = await failoverStack(fault);
    const { data, response } = await client(s).chat.completions.create({ model: 'gpt-4o', messages: ask, stream: true }).withResponse();
    for await (const _ of data);
    expect(response.headers.get('x-stormgate-target')).toBe('anthropic/claude-sonnet-4-6');
    expect(response.headers.get('x-stormgate-fallback')).toBe(REASON[fault]);
  });

  itTools("tool_choice 'required' with parallel_tool_calls false: one call, index 0, an id, its arguments whole JSON", async () => {
    const { s, backup } = await failoverStack(fault);
    const c = client(s);
    const deltas: { index: number; delta: string }[] = [];
    const st = c.chat.completions.stream({ model: 'gpt-4o', messages: ask, tools: weatherTools, tool_choice: 'required', parallel_tool_calls: false, stream_options: { include_usage: true } });
    st.on('tool_calls.function.arguments.delta', (e) => deltas.push({ index: e.index, delta: e.arguments_delta }));
    const final = await st.finalChatCompletion();
    const calls = final.choices[0]!.message.tool_calls!;
    expect(calls).toHaveLength(1);
    expect(calls[0]!.id).toMatch(/^toolu_/);
    expect(calls[0]!.function.name).toBe('get_weather');
    expect(JSON.parse(calls[0]!.function.arguments)).toEqual({ x: 1 });
    expect(calls[0]!.function.parsed_arguments).toEqual({ x: 1 });
    expect(deltas.every((d) => d.index === 0)).toBe(true);
    expect(deltas.map((d) => d.delta).join('')).toBe(calls[0]!.function.arguments);
    expect(final.choices[0]!.finish_reason).toBe('tool_calls');
    expect(final.usage!.completion_tokens).toBeGreaterThan(0);
    backupAnswered(backup, 1);
  });

  itTools('a named tool_choice: runTools() calls that tool once and stops; the stream gives only it', async () => {
    const { s } = await failoverStack(fault);
    const c = client(s);
    const called: string[] = [];
    const fn = (name: string) => ({
      type: 'function' as const,
      function: { name, description: `${name} of a city`, parameters: { type: 'object', properties: { x: { type: 'number' } }, required: ['x'] }, parse: (text: string) => JSON.parse(text) as { x: number }, function: (a: { x: number }) => (called.push(`${name}:${a.x}`), 'sunny') },
    });
    const runner = c.chat.completions.runTools({ model: 'gpt-4o', messages: ask, tools: [fn('get_weather'), fn('get_time')], tool_choice: { type: 'function', function: { name: 'get_time' } }, stream: true });
    await runner.done();
    expect(called).toEqual(['get_time:1']);
    const st = c.chat.completions.stream({ model: 'gpt-4o', messages: ask, tools: weatherTools, tool_choice: { type: 'function', function: { name: 'get_time' } } });
    const final = await st.finalChatCompletion();
    expect(final.choices[0]!.message.tool_calls!.map((t) => t.function.name)).toEqual(['get_time']);
  });

  itTools('a manual agent loop: two parallel calls, their results sent back (string and text-part content), then the answer', async () => {
    const { s, primary, backup } = await failoverStack(fault);
    const c = client(s);
    const st = c.chat.completions.stream({ model: 'gpt-4o', messages: ask, tools: weatherTools });
    const done: [string, number][] = [];
    st.on('tool_calls.function.arguments.done', (e) => done.push([e.name, e.index]));
    const first = await st.finalChatCompletion();
    const msg = first.choices[0]!.message;
    expect(done).toEqual([['get_weather', 0], ['get_time', 1]]);
    expect(msg.tool_calls!.map((t) => t.function.parsed_arguments)).toEqual([{ x: 1 }, { x: 1 }]);
    expect(new Set(msg.tool_calls!.map((t) => t.id)).size).toBe(2);
    const history: OpenAI.ChatCompletionMessageParam[] = [
      ...ask,
      { role: 'assistant', content: msg.content, tool_calls: msg.tool_calls!.map(({ id, type, function: f }) => ({ id, type, function: { name: f.name, arguments: f.arguments } })) },
      { role: 'tool', tool_call_id: msg.tool_calls![0]!.id, content: 'sunny, 21C' },
      { role: 'tool', tool_call_id: msg.tool_calls![1]!.id, content: [{ type: 'text', text: '14:00' }] },
    ];
    const answer = c.chat.completions.stream({ model: 'gpt-4o', messages: history, tools: weatherTools, stream_options: { include_usage: true } });
    const last = await answer.finalChatCompletion();
    expect(last.choices[0]!.finish_reason).toBe('stop');
    expect(last.choices[0]!.message.content).toMatch(/^Mock answer/);
    expect(last.choices[0]!.message.tool_calls ?? []).toEqual([]);
    backupAnswered(backup, 2);
    // A 429 whose retry-after is past maxWaitHintMs holds the primary off: the second turn goes straight to the backup.
    if (fault === '429') expect(primary.requests()).toHaveLength(1);
  });

  itTools("the SDK's parsed assistant message sent back as it is (parsed, parsed_arguments, refusal null), tool results after it", async () => {
    const { s, backup } = await failoverStack(fault);
    const c = client(s);
    const first = await c.chat.completions.parse({ model: 'gpt-4o', messages: ask, tools: weatherTools, parallel_tool_calls: false });
    const msg = first.choices[0]!.message;
    expect(msg.tool_calls).toHaveLength(1);
    const history = [...ask, msg, { role: 'tool' as const, tool_call_id: msg.tool_calls![0]!.id, content: '' }] as OpenAI.ChatCompletionMessageParam[];
    const next = await c.chat.completions.parse({ model: 'gpt-4o', messages: history, tools: weatherTools, response_format: zodResponseFormat(Forecast, 'forecast') });
    expect(Forecast.safeParse(next.choices[0]!.message.parsed).success).toBe(true);
    backupAnswered(backup, 2);
  });

  it('stop and max_completion_tokens reach the backup: a cut answer finishes with length, and parse() raises LengthFinishReasonError', async () => {
    const { s } = await failoverStack(fault);
    const c = client(s);
    const st = c.chat.completions.stream({ model: 'gpt-4o', messages: [{ role: 'user', content: 'Tell me a long story about the weather in Paris, please.' }], max_completion_tokens: 2, stop: ['END', 'Paris.'], stream_options: { include_usage: true } });
    const final = await st.finalChatCompletion();
    expect(final.choices[0]!.finish_reason).toBe('length');
    expect(final.usage!.completion_tokens).toBeLessThanOrEqual(2);
    const parse = c.chat.completions.stream({ model: 'gpt-4o', messages: ask, max_completion_tokens: 2, response_format: zodResponseFormat(Forecast, 'forecast') });
    await expect(parse.finalChatCompletion()).rejects.toBeInstanceOf(LengthFinishReasonError);
  });

  it('n: 2 is refused clearly: the primary\'s failure, the backup\'s reason named, never one choice where two were asked for', async () => {
    const { s, backup } = await failoverStack(fault);
    const c = client(s);
    const err = await c.chat.completions.create({ model: 'gpt-4o', messages: ask, n: 2, stream: true }).then(
      async (st) => {
        for await (const _ of st);
        return undefined;
      },
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(OpenAI.APIError);
    const e = err as InstanceType<typeof OpenAI.APIError>;
    expect(e.message).toMatch(/n > 1/);
    // The primary's own failure, as it would be without a backup: its status, and its retry-after when it gave one.
    expect(e.status).toBe(fault === '503' ? 503 : fault === '429' ? 429 : 502);
    expect(e.headers?.get('x-stormgate-target')).toBe('openai/gpt-4o');
    if (fault === '429') expect(e.headers?.get('retry-after')).toBe('120');
    expect(backup.requests()).toHaveLength(0);
  });
});
