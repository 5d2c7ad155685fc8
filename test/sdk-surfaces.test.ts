// The official SDKs' surfaces as application code calls them, through the gateway to the bundled mock: every call
// shape of the openai SDK, the same through a failover to the Anthropic backup, and the error surfaces (classes,
// fields, x-should-retry) the SDK builds from the gateway's answers.
import OpenAI from 'openai';
import { zodFunction, zodResponseFormat, zodTextFormat } from 'openai/helpers/zod';
import { z } from 'zod';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import type { FaultSpec, MockServer } from '../src/mock/server.ts';
import { expectOpenAIError } from './helpers/openai-error.ts';
import { countingClient, defaultConfig, RETRY_LOOP_ONLY, useExtraMocks, useStacks, type ClientOptions, type Stack } from './helpers/stack.ts';
import { weatherTool as runnable } from './helpers/weather-tool.ts';

const startStack = useStacks(RETRY_LOOP_ONLY);
const startBackup = useExtraMocks();

const sdk = (s: Stack, opts: ClientOptions = {}) => countingClient(s, opts).client;

const messages = [{ role: 'system' as const, content: 'Be brief.' }, { role: 'user' as const, content: 'What is the weather in Paris?' }];
const weatherTool = {
  type: 'function' as const,
  function: { name: 'get_weather', description: 'Weather of a city', parameters: { type: 'object', properties: { x: { type: 'number' } }, required: ['x'] } },
};
const timeTool = { type: 'function' as const, function: { ...weatherTool.function, name: 'get_time', description: 'Local time' } };
const Weather = z.object({ city: z.string(), temp: z.number(), tags: z.array(z.string()), unit: z.enum(['c', 'f']) });
const parsedWeather = { city: 'mock', temp: 1, tags: ['mock'], unit: 'c' };
/** A 1x1 PNG as a data: URL. */
const PNG = 'data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==';

type FunctionCall = OpenAI.ChatCompletionMessageFunctionToolCall;
const callNames = (m: OpenAI.ChatCompletionMessage) => (m.tool_calls ?? []).map((c) => (c as FunctionCall).function.name);

/** Tool calls as a stream's deltas assemble them, by index. */
async function streamedCalls(stream: AsyncIterable<OpenAI.ChatCompletionChunk>) {
  const calls: Record<number, { id?: string; name?: string; args: string }> = {};
  let finish: string | null = null;
  for await (const chunk of stream) {
    finish = chunk.choices[0]?.finish_reason ?? finish;
    for (const t of chunk.choices[0]?.delta?.tool_calls ?? []) {
      const c = (calls[t.index] ??= { args: '' });
      if (t.id) c.id = t.id;
      if (t.function?.name) c.name = t.function.name;
      c.args += t.function?.arguments ?? '';
    }
  }
  return { calls, finish };
}

describe('openai SDK surfaces through the gateway', () => {
  it('chat.completions.create: n choices, logprobs, tools with tool_choice, usage', async () => {
    const s = await startStack();
    const c = sdk(s);
    const two = await c.chat.completions.create({ model: 'gpt-4o', messages, n: 2 });
    expect(two.choices.map((x) => x.index)).toEqual([0, 1]);
    expect(two.usage!.total_tokens).toBeGreaterThan(0);
    const lp = await c.chat.completions.create({ model: 'gpt-4o', messages, logprobs: true, top_logprobs: 2 });
    expect(lp.choices[0]!.logprobs!.content!.map((t) => t.token).join('')).toBe(lp.choices[0]!.message.content);
    expect(lp.choices[0]!.logprobs!.content![0]!.top_logprobs).toHaveLength(2);
    const tool = await c.chat.completions.create({ model: 'gpt-4o', messages, tools: [weatherTool, timeTool], tool_choice: { type: 'function', function: { name: 'get_time' } } });
    expect(tool.choices[0]!.finish_reason).toBe('tool_calls');
    expect(callNames(tool.choices[0]!.message)).toEqual(['get_time']);
    const none = await c.chat.completions.create({ model: 'gpt-4o', messages, tools: [weatherTool], tool_choice: 'none' });
    expect(none.choices[0]!.message.content).toMatch(/^Mock answer/);
  });

  it('streams chat with include_usage, logprobs and parallel tool calls, and chat.completions.stream() assembles them', async () => {
    const s = await startStack();
    const c = sdk(s);
    const stream = await c.chat.completions.create({ model: 'gpt-4o', messages, stream: true, logprobs: true, stream_options: { include_usage: true } });
    let text = '';
    let tokens = '';
    let usage: OpenAI.CompletionUsage | null | undefined;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? '';
      tokens += (chunk.choices[0]?.logprobs?.content ?? []).map((t) => t.token).join('');
      if (chunk.usage) usage = chunk.usage;
    }
    expect(text).toMatch(/^Mock answer to: What is the weather/);
    expect(tokens).toBe(text);
    expect(usage!.completion_tokens).toBeGreaterThan(0);

    const parallel = await streamedCalls(await c.chat.completions.create({ model: 'gpt-4o', messages, stream: true, tools: [weatherTool, timeTool] }));
    expect(parallel.finish).toBe('tool_calls');
    expect(Object.values(parallel.calls).map(({ name, args }) => ({ name, args }))).toEqual([
      { name: 'get_weather', args: '{"x":1}' },
      { name: 'get_time', args: '{"x":1}' },
    ]);
    const final = await c.chat.completions.stream({ model: 'gpt-4o', messages, tools: [weatherTool, timeTool], stream_options: { include_usage: true } }).finalChatCompletion();
    expect(callNames(final.choices[0]!.message)).toEqual(['get_weather', 'get_time']);
    expect(final.usage!.total_tokens).toBeGreaterThan(0);
    const one = await c.chat.completions.stream({ model: 'gpt-4o', messages, tools: [weatherTool, timeTool], parallel_tool_calls: false }).finalChatCompletion();
    expect(callNames(one.choices[0]!.message)).toEqual(['get_weather']);
    const n2 = await c.chat.completions.stream({ model: 'gpt-4o', messages, n: 2 }).finalChatCompletion();
    expect(n2.choices.map((x) => x.message.content)).toEqual([n2.choices[0]!.message.content, n2.choices[0]!.message.content]);
  });

  it('runs tools with runTools(), streamed and not', async () => {
    const s = await startStack();
    const c = sdk(s);
    const calls: unknown[] = [];
    const runner = c.chat.completions.runTools({ model: 'gpt-4o', messages, tools: [runnable(calls)] });
    expect(await runner.finalContent()).toMatch(/^Mock answer/);
    const streamed = c.chat.completions.runTools({ model: 'gpt-4o', messages, stream: true, tools: [runnable(calls)] });
    expect(await streamed.finalContent()).toMatch(/^Mock answer/);
    expect(calls).toEqual([{ x: 1 }, { x: 1 }]);
    expect(s.mock.stats().total).toBe(4);
  });

  it('parses structured outputs (zod response_format, zodFunction, responses.parse), streamed and not', async () => {
    const s = await startStack();
    const c = sdk(s);
    const parsed = await c.chat.completions.parse({ model: 'gpt-4o', messages, response_format: zodResponseFormat(Weather, 'weather') });
    expect(parsed.choices[0]!.message.parsed).toEqual(parsedWeather);
    const streamed = await c.chat.completions.stream({ model: 'gpt-4o', messages, response_format: zodResponseFormat(Weather, 'weather') }).finalChatCompletion();
    expect(streamed.choices[0]!.message.parsed).toEqual(parsedWeather);
    const fn = await c.chat.completions.parse({ model: 'gpt-4o', messages, tools: [zodFunction({ name: 'get_weather', parameters: z.object({ x: z.number() }) })] });
    expect(fn.choices[0]!.message.tool_calls![0]!.function.parsed_arguments).toEqual({ x: 1 });
    const resp = await c.responses.parse({ model: 'gpt-4o', input: 'weather?', text: { format: zodTextFormat(Weather, 'weather') } });
    expect(resp.output_parsed).toEqual(parsedWeather);
  });

  it('embeddings: the SDK\'s default base64 decoded to the same floats as encoding_format float', async () => {
    const s = await startStack();
    const c = sdk(s);
    const b64 = await c.embeddings.create({ model: 'text-embedding-3-small', input: ['one', 'two'] });
    const float = await c.embeddings.create({ model: 'text-embedding-3-small', input: ['one', 'two'], encoding_format: 'float' });
    expect(b64.data).toHaveLength(2);
    expect(b64.data.map((d) => d.embedding)).toEqual(float.data.map((d) => d.embedding));
    expect(float.data[0]!.embedding).toHaveLength(8);
    const raw = await c.embeddings.create({ model: 'text-embedding-3-small', input: 'one', encoding_format: 'base64' });
    expect(typeof raw.data[0]!.embedding).toBe('string');
    expect(b64.usage.prompt_tokens).toBeGreaterThan(0);
  });

  it('legacy completions, streamed (with usage) and not', async () => {
    const s = await startStack();
    const c = sdk(s);
    const whole = await c.completions.create({ model: 'gpt-3.5-turbo-instruct', prompt: 'Say hello' });
    const stream = await c.completions.create({ model: 'gpt-3.5-turbo-instruct', prompt: 'Say hello', stream: true, stream_options: { include_usage: true } });
    let text = '';
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.text ?? '';
      if (chunk.usage) usage = chunk.usage;
    }
    expect(text).toBe(whole.choices[0]!.text);
    expect(usage!.total_tokens).toBe(whole.usage!.total_tokens);
  });

  it('Responses API: create streamed and not, responses.stream() and its finalResponse()', async () => {
    const s = await startStack();
    const c = sdk(s);
    const whole = await c.responses.create({ model: 'gpt-4o', input: 'hello', instructions: 'Be brief.' });
    expect(whole.output_text).toBe('Mock answer to: hello');
    const stream = await c.responses.create({ model: 'gpt-4o', input: 'hello', stream: true });
    let text = '';
    const types = new Set<string>();
    for await (const ev of stream) {
      types.add(ev.type);
      if (ev.type === 'response.output_text.delta') text += ev.delta;
    }
    expect(text).toBe(whole.output_text);
    expect(types).toContain('response.completed');
    const runner = c.responses.stream({ model: 'gpt-4o', input: 'hello' });
    let deltas = '';
    runner.on('response.output_text.delta', (e) => (deltas += e.delta));
    const final = await runner.finalResponse();
    expect(final.status).toBe('completed');
    expect(deltas).toBe(whole.output_text);
    expect(final.output[0]).toMatchObject({ type: 'message', content: [{ type: 'output_text', text: whole.output_text }] });
  });

  it('models.list() pages and iterates, models.retrieve(), and the raw-response helpers', async () => {
    const s = await startStack({
      config: (url) => {
        const base = defaultConfig(url, RETRY_LOOP_ONLY);
        const models = ['gpt-4o', 'meta-llama/Llama-3-8b', 'ft:gpt-4o:acme::abc'];
        return { ...base, routes: base.routes.map((r) => (r.name === 'chat' ? { ...r, match: { ...r.match, models } } : r)) };
      },
    });
    const c = sdk(s);
    const ids: string[] = [];
    for await (const m of c.models.list()) ids.push(m.id);
    expect(ids).toEqual(expect.arrayContaining(['gpt-4o', 'meta-llama/Llama-3-8b', 'ft:gpt-4o:acme::abc']));
    expect((await c.models.list()).data.map((m) => m.id)).toEqual(ids);
    for (const id of ['meta-llama/Llama-3-8b', 'ft:gpt-4o:acme::abc']) expect((await c.models.retrieve(id)).id).toBe(id);

    const answer = await c.chat.completions.create({ model: 'gpt-4o', messages });
    expect(answer._request_id).toMatch(/^req_/);
    const { data, response, request_id } = await c.embeddings.create({ model: 'text-embedding-3-small', input: 'x' }).withResponse();
    expect(data.data).toHaveLength(1);
    expect(request_id).toBe(response.headers.get('x-request-id'));
    expect(response.headers.get('x-stormgate-route')).toBe('embeddings');
    const raw = await c.chat.completions.create({ model: 'gpt-4o', messages }).asResponse();
    expect(raw.status).toBe(200);
    expect(((await raw.json()) as OpenAI.ChatCompletion).object).toBe('chat.completion');
    const streamed = await c.chat.completions.create({ model: 'gpt-4o', messages, stream: true }).withResponse();
    expect(streamed.response.headers.get('content-type')).toMatch(/^text\/event-stream/);
    for await (const _ of streamed.data) void _;
  });

  it('AbortController: mid-stream and before the headers, each aborting the upstream request', async () => {
    const s = await startStack({ faults: { stream: { chunks: 10, chunkDelayMs: 150 } } });
    const c = sdk(s);
    const mid = new AbortController();
    const stream = await c.chat.completions.create({ model: 'gpt-4o', messages, stream: true }, { signal: mid.signal });
    let chunks = 0;
    // The SDK ends the iteration quietly on its own abort.
    for await (const _ of stream) if (++chunks === 2) mid.abort();
    expect(chunks).toBeLessThan(5);

    s.mock.setFaults({ latencyMs: 5_000 });
    const early = new AbortController();
    setTimeout(() => early.abort(), 300);
    const started = Date.now();
    await expect(c.chat.completions.create({ model: 'gpt-4o', messages, stream: true }, { signal: early.signal })).rejects.toBeInstanceOf(OpenAI.APIUserAbortError);
    expect(Date.now() - started).toBeLessThan(2_000);
    const until = Date.now() + 2_000;
    while (s.mock.requests().some((r) => !r.aborted) && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
    expect(s.mock.requests().map((r) => r.aborted)).toEqual([true, true]);
  });

  it('a per-request timeout becomes the gateway\'s deadline; maxRetries is not spent on its 504', async () => {
    const s = await startStack({ faults: { hangRate: 1 } });
    const { client, counter } = countingClient(s);
    const started = Date.now();
    // x-stainless-timeout is whole seconds: 3 s, less the 250 ms margin; 1.15 s before the SDK would give up itself.
    const err = (await client.chat.completions.create({ model: 'gpt-4o', messages }, { timeout: 3_900, maxRetries: 3 }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err).toBeInstanceOf(OpenAI.InternalServerError);
    expect(err.status).toBe(504);
    expect(err.code).toBe('deadline_exceeded');
    expect(Date.now() - started).toBeLessThan(3_900);
    expect(counter.requests).toBe(1);
  });
});

/** The stack's mock as a failing OpenAI primary, a second mock as the Anthropic backup. */
async function viaAnthropic(opts: { faults?: FaultSpec; backupFaults?: FaultSpec; route?: Partial<ConfigInput['routes'][number]> } = {}): Promise<{ s: Stack; backup: MockServer }> {
  const backup = await startBackup({ quiet: true, apiKey: 'backup-key', faults: opts.backupFaults });
  const s = await startStack({
    faults: opts.faults ?? { errors: [{ status: 503, rate: 1 }] },
    config: (url) => {
      const base = defaultConfig(url, { provider: RETRY_LOOP_ONLY.provider, route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 1 } } });
      return {
        ...base,
        providers: { ...base.providers, backup: { family: 'anthropic', baseUrl: backup.url, apiKey: 'backup-key', breaker: false } },
        routes: base.routes.map((r) => (r.name === 'chat' ? { ...r, targets: [{ provider: 'mock' }, { provider: 'backup', model: 'claude-sonnet-4-5' }], ...opts.route } : r)),
      };
    },
  });
  return { s, backup };
}

describe('the same through a failover to the Anthropic backup', () => {
  it('text with a system message, usage and finish_reason, streamed (include_usage) and not', async () => {
    const { s, backup } = await viaAnthropic();
    const c = sdk(s, { maxRetries: 0 });
    const { data, response } = await c.chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(data).toMatchObject({ object: 'chat.completion', model: 'claude-sonnet-4-5', choices: [{ finish_reason: 'stop', message: { role: 'assistant', content: 'Mock answer to: What is the weather in Paris?' } }] });
    expect(data.usage!.total_tokens).toBe(data.usage!.prompt_tokens + data.usage!.completion_tokens);
    expect(response.headers.get('x-stormgate-target')).toBe('backup/claude-sonnet-4-5');
    expect(response.headers.get('x-request-id')).toMatch(/^req_/);
    const stream = await c.chat.completions.create({ model: 'gpt-4o', messages, stream: true, stream_options: { include_usage: true } });
    let text = '';
    let finish: string | null = null;
    let usage: OpenAI.CompletionUsage | null | undefined;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
      if (chunk.usage) usage = chunk.usage;
    }
    expect(text).toBe(data.choices[0]!.message.content);
    expect(finish).toBe('stop');
    expect(usage).toEqual(data.usage);
    expect(backup.requests().map((r) => r.path)).toEqual(['/v1/messages', '/v1/messages']);
  });

  it('parallel tool calls streamed and not, a named tool_choice, parallel_tool_calls false, and runTools over the tool results', async () => {
    const { s } = await viaAnthropic();
    const c = sdk(s, { maxRetries: 0 });
    const whole = await c.chat.completions.create({ model: 'gpt-4o', messages, tools: [weatherTool, timeTool], tool_choice: 'auto' });
    expect(whole.choices[0]!.finish_reason).toBe('tool_calls');
    expect(whole.choices[0]!.message.content).toBeNull();
    expect((whole.choices[0]!.message.tool_calls as FunctionCall[]).map((t) => [t.function.name, JSON.parse(t.function.arguments)])).toEqual([['get_weather', { x: 1 }], ['get_time', { x: 1 }]]);
    const streamed = await streamedCalls(await c.chat.completions.create({ model: 'gpt-4o', messages, stream: true, tools: [weatherTool, timeTool] }));
    expect(streamed.finish).toBe('tool_calls');
    expect(Object.values(streamed.calls).map(({ name, args }) => [name, args])).toEqual([['get_weather', '{"x":1}'], ['get_time', '{"x":1}']]);
    expect(Object.values(streamed.calls).every((call) => /^toolu_/.test(call.id ?? ''))).toBe(true);
    const named = await c.chat.completions.stream({ model: 'gpt-4o', messages, tools: [weatherTool, timeTool], tool_choice: { type: 'function', function: { name: 'get_time' } } }).finalChatCompletion();
    expect(callNames(named.choices[0]!.message)).toEqual(['get_time']);
    const single = await c.chat.completions.create({ model: 'gpt-4o', messages, tools: [weatherTool, timeTool], parallel_tool_calls: false });
    expect(callNames(single.choices[0]!.message)).toEqual(['get_weather']);

    const calls: unknown[] = [];
    const runner = c.chat.completions.runTools({ model: 'gpt-4o', messages, tools: [runnable(calls)] });
    expect(await runner.finalContent()).toMatch(/^Mock answer/);
    const streamedRunner = c.chat.completions.runTools({ model: 'gpt-4o', messages, stream: true, tools: [runnable(calls)] });
    expect(await streamedRunner.finalContent()).toMatch(/^Mock answer/);
    expect(calls).toEqual([{ x: 1 }, { x: 1 }]);
  });

  it('multi-turn with two tool results and an image as a data: URL', async () => {
    const { s, backup } = await viaAnthropic();
    const c = sdk(s, { maxRetries: 0 });
    const history: OpenAI.ChatCompletionMessageParam[] = [
      ...messages,
      {
        role: 'assistant',
        content: null,
        tool_calls: [
          { id: 'call_a', type: 'function', function: { name: 'get_weather', arguments: '{"x":1}' } },
          { id: 'call_b', type: 'function', function: { name: 'get_time', arguments: '{"x":2}' } },
        ],
      },
      { role: 'tool', tool_call_id: 'call_a', content: 'sunny' },
      { role: 'tool', tool_call_id: 'call_b', content: [{ type: 'text', text: 'noon' }] },
      { role: 'user', content: [{ type: 'text', text: 'And this picture?' }, { type: 'image_url', image_url: { url: PNG, detail: 'low' } }] },
    ];
    const answer = await c.chat.completions.create({ model: 'gpt-4o', messages: history, tools: [weatherTool, timeTool], tool_choice: 'none' });
    expect(answer.choices[0]!.message.content).toBe('Mock answer to: And this picture?');
    expect(answer.choices[0]!.finish_reason).toBe('stop');
    expect(backup.stats().byStatus['200']).toBe(1);
  });

  it('structured outputs: parse() with a zod response_format and zodFunction, streamed and not', async () => {
    const { s } = await viaAnthropic();
    const c = sdk(s, { maxRetries: 0 });
    const parsed = await c.chat.completions.parse({ model: 'gpt-4o', messages, response_format: zodResponseFormat(Weather, 'weather') });
    expect(parsed.model).toBe('claude-sonnet-4-5');
    expect(parsed.choices[0]!.message.parsed).toEqual(parsedWeather);
    const streamed = await c.chat.completions.stream({ model: 'gpt-4o', messages, response_format: zodResponseFormat(Weather, 'weather') }).finalChatCompletion();
    expect(streamed.choices[0]!.message.parsed).toEqual(parsedWeather);
    const fn = await c.chat.completions.parse({ model: 'gpt-4o', messages, tools: [zodFunction({ name: 'get_weather', parameters: z.object({ x: z.number() }) })] });
    expect(fn.choices[0]!.message.tool_calls![0]!.function.parsed_arguments).toEqual({ x: 1 });
  });

  it('what Anthropic cannot express gets an OpenAI-shaped error, never a silent wrong answer', async () => {
    const { s, backup } = await viaAnthropic();
    const c = sdk(s);
    for (const extra of [{ n: 2 }, { logprobs: true }, { response_format: { type: 'json_object' as const } }, { stop: '\n' }]) {
      const err = (await c.chat.completions.create({ model: 'gpt-4o', messages, ...extra }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
      // The primary's outage, as it was: the backup was not sent a request it would have answered wrongly.
      expect(err).toBeInstanceOf(OpenAI.InternalServerError);
      expect(err.status).toBe(503);
      expect(err.headers!.get('x-should-retry')).toBe('false');
    }
    expect(backup.stats().total).toBe(0);
    // With the primary up, the primary answers them.
    s.mock.setFaults({});
    expect((await c.chat.completions.create({ model: 'gpt-4o', messages, n: 2 })).choices).toHaveLength(2);
  });

  it('an Anthropic-only route refuses what it cannot express with 400 invalid_body naming the field', async () => {
    const { s } = await viaAnthropic({ route: { targets: [{ provider: 'backup', model: 'claude-sonnet-4-5' }] } });
    const { client, counter } = countingClient(s);
    const err = (await client.chat.completions.create({ model: 'gpt-4o', messages, logprobs: true }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect(err.code).toBe('invalid_body');
    expect(err.param).toBe('logprobs');
    expectOpenAIError({ error: err.error }, 'invalid_body');
    expect(counter.requests).toBe(1);
  });
});

describe('error surfaces the SDK builds from the gateway\'s answers', () => {
  /** Calls and returns the SDK's error, with how many HTTP requests the SDK made for it. */
  async function failure(s: Stack, call: (c: OpenAI) => Promise<unknown>, opts: ClientOptions = {}) {
    const { client, counter } = countingClient(s, opts);
    const err = (await call(client).then(
      () => undefined,
      (e: unknown) => e,
    )) as InstanceType<typeof OpenAI.APIError>;
    expect(err).toBeInstanceOf(OpenAI.APIError);
    return { err, requests: counter.requests };
  }
  const chat = (c: OpenAI) => c.chat.completions.create({ model: 'gpt-4o', messages });

  it('the gateway\'s own errors: OpenAI shape, the right SDK class, code, param, x-should-retry false, one request', async () => {
    const s = await startStack();
    const cases: Array<[(c: OpenAI) => Promise<unknown>, Function, number, string, string | null]> = [
      [(c) => c.models.retrieve('no-such-model'), OpenAI.NotFoundError, 404, 'model_not_found', 'model'],
      [(c) => c.post('/audio/speech', { body: {} }), OpenAI.NotFoundError, 404, 'unknown_url', null],
      [(c) => c.get('/chat/completions'), OpenAI.APIError, 405, 'method_not_allowed', null],
      [(c) => c.chat.completions.create({ messages } as never), OpenAI.BadRequestError, 400, 'invalid_body', 'model'],
      [(c) => c.chat.completions.create({ model: 'gpt-4o', messages }, { headers: { 'x-stormgate-timeout-ms': 'soon' } }), OpenAI.BadRequestError, 400, 'bad_request', null],
    ];
    for (const [call, cls, status, code, param] of cases) {
      const { err, requests } = await failure(s, call);
      expect(err).toBeInstanceOf(cls);
      expect(err.status).toBe(status);
      expect(err.param).toBe(param);
      expectOpenAIError({ error: err.error }, code);
      expect(err.headers!.get('x-should-retry')).toBe('false');
      expect(err.headers!.get('x-stormgate-request-id')).toBeTruthy();
      expect(requests).toBe(1);
    }
  });

  it('upstream errors pass through with their status, code, param and request id; the SDK does not retry them', async () => {
    const cases: Array<[FaultSpec, Function, number, string | null, string]> = [
      [{ errors: [{ status: 400, code: 'context_length_exceeded', param: 'messages', message: 'too long' }] }, OpenAI.BadRequestError, 400, 'context_length_exceeded', 'invalid_request_error'],
      [{ errors: [{ status: 422 }] }, OpenAI.UnprocessableEntityError, 422, null, 'invalid_request_error'],
      [{ errors: [{ status: 429 }] }, OpenAI.RateLimitError, 429, 'rate_limit_exceeded', 'requests'],
      [{ errors: [{ status: 503 }] }, OpenAI.InternalServerError, 503, 'service_unavailable', 'server_error'],
    ];
    for (const [faults, cls, status, code, type] of cases) {
      const s = await startStack({ faults, route: { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } } });
      for (const call of [chat, (c: OpenAI) => c.chat.completions.create({ model: 'gpt-4o', messages, stream: true }), (c: OpenAI) => c.embeddings.create({ model: 'text-embedding-3-small', input: 'x' }), (c: OpenAI) => c.responses.create({ model: 'gpt-4o', input: 'x' })]) {
        const { err, requests } = await failure(s, call);
        expect(err).toBeInstanceOf(cls);
        expect(err.status).toBe(status);
        expect(err.code).toBe(code);
        expect(err.type).toBe(type);
        expect(err.requestID).toMatch(/^req_/);
        expect(err.headers!.get('x-should-retry')).toBe('false');
        expect(requests).toBe(1);
      }
      await s.close();
    }
  });

  it('the gateway\'s failures: 502 upstream_auth_error, 502 upstream_unavailable, 504 deadline_exceeded', async () => {
    const cases: Array<[FaultSpec, number, string, number | undefined]> = [
      [{ errors: [{ status: 401 }] }, 502, 'upstream_auth_error', undefined],
      [{ errors: [{ status: 429, code: 'insufficient_quota', type: 'insufficient_quota' }] }, 502, 'upstream_auth_error', undefined],
      [{ resetRate: 1 }, 502, 'upstream_unavailable', undefined],
      [{ hangRate: 1 }, 504, 'deadline_exceeded', 2_000],
    ];
    for (const [faults, status, code, timeout] of cases) {
      const s = await startStack({ faults, route: { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } } });
      const { err, requests } = await failure(s, (c) => c.chat.completions.create({ model: 'gpt-4o', messages }, timeout ? { timeout } : {}));
      expect(err).toBeInstanceOf(OpenAI.InternalServerError);
      expect(err.status).toBe(status);
      expectOpenAIError({ error: err.error }, code, 'server_error');
      expect(err.headers!.get('x-should-retry')).toBe('false');
      expect(requests).toBe(1);
      await s.close();
    }
  });

  it('a stream broken after its first output raises an APIError with code stream_interrupted in every streaming helper', async () => {
    const s = await startStack({ faults: { stream: { chunks: 5, cutAfterChunks: 2 } } });
    const c = sdk(s, { maxRetries: 0 });
    const drain = async (stream: AsyncIterable<unknown>) => {
      for await (const _ of stream) void _;
    };
    const runs: Array<() => Promise<unknown>> = [
      async () => drain(await c.chat.completions.create({ model: 'gpt-4o', messages, stream: true })),
      async () => drain(await c.completions.create({ model: 'gpt-3.5-turbo-instruct', prompt: 'x', stream: true })),
      async () => drain(await c.responses.create({ model: 'gpt-4o', input: 'x', stream: true })),
      () => c.chat.completions.stream({ model: 'gpt-4o', messages }).finalChatCompletion(),
      () => c.responses.stream({ model: 'gpt-4o', input: 'x' }).finalResponse(),
    ];
    for (const run of runs) {
      const err = (await run().catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
      expect(err).toBeInstanceOf(OpenAI.APIError);
      expect(err.code).toBe('stream_interrupted');
      expect(err.type).toBe('server_error');
    }
  });

  it('x-should-retry: true on a hold-off makes the SDK wait out retry-after and retry; false stops it', async () => {
    // maxAttempts 1: the 429's retry-after (2 s) reaches the client with x-should-retry false, the gateway holds the
    // target off, and the next request gets 429 provider_held_off with x-should-retry true, which the SDK waits out.
    const s = await startStack({ faults: { errors: [{ status: 429, headers: { 'retry-after': '2' }, times: 1 }] }, route: { retry: { maxAttempts: 1 } } });
    const first = await failure(s, chat);
    expect(first.err).toBeInstanceOf(OpenAI.RateLimitError);
    expect(first.err.headers!.get('x-should-retry')).toBe('false');
    // The hint, to the end of the hold-off it started (a spread of up to a tenth more), plus a spread of the client's
    // own past that end (up to a fifth of the wait), so clients told the same end do not come back together.
    expect(Number(first.err.headers!.get('retry-after-ms'))).toBeGreaterThanOrEqual(2000);
    expect(Number(first.err.headers!.get('retry-after-ms'))).toBeLessThanOrEqual(2200 * 1.2 + 1);
    expect(first.requests).toBe(1);

    const { client, counter } = countingClient(s);
    const started = Date.now();
    const { data, response } = await chat(client).withResponse();
    expect((data as OpenAI.ChatCompletion).object).toBe('chat.completion');
    expect(response.status).toBe(200);
    expect(counter.requests).toBe(2);
    expect(Date.now() - started).toBeGreaterThanOrEqual(1_000);

    s.mock.setFaults({ errors: [{ status: 429, headers: { 'retry-after': '2' }, times: 1 }] });
    await failure(s, chat);
    const { err, requests } = await failure(s, chat, { maxRetries: 0 });
    expect(err.status).toBe(429);
    expectOpenAIError({ error: err.error }, 'provider_held_off', 'rate_limit_error');
    expect(err.headers!.get('x-should-retry')).toBe('true');
    expect(Number(err.headers!.get('retry-after-ms'))).toBeGreaterThan(0);
    expect(requests).toBe(1);
  });
});

describe('degraded answers as the SDK reads them', () => {
  const degradedStack = (faults: FaultSpec = { errors: [{ status: 503, rate: 1 }] }) =>
    startStack({
      faults,
      config: (url) => {
        const base = defaultConfig(url, RETRY_LOOP_ONLY);
        return { ...base, routes: base.routes.map((r) => (r.name === 'chat' ? { ...r, degraded: { message: 'Busy; try again soon.' } } : r)) };
      },
    });

  it('gives one choice for each of n, streamed and not', async () => {
    const s = await degradedStack();
    const c = sdk(s, { maxRetries: 0 });
    const { data, response } = await c.chat.completions.create({ model: 'gpt-4o', messages, n: 2 }).withResponse();
    expect(response.headers.get('x-stormgate-degraded')).toBe('true');
    expect(data.choices.map((x) => [x.index, x.message.content])).toEqual([[0, 'Busy; try again soon.'], [1, 'Busy; try again soon.']]);
    const final = await c.chat.completions.stream({ model: 'gpt-4o', messages, n: 2 }).finalChatCompletion();
    expect(final.choices.map((x) => x.message.content)).toEqual(['Busy; try again soon.', 'Busy; try again soon.']);
  });

  it('is not given for structured outputs or a forced tool call: parse() gets the APIError, not a JSON SyntaxError', async () => {
    const s = await degradedStack();
    const c = sdk(s, { maxRetries: 0 });
    const calls: Array<() => Promise<unknown>> = [
      () => c.chat.completions.parse({ model: 'gpt-4o', messages, response_format: zodResponseFormat(Weather, 'weather') }),
      () => c.chat.completions.stream({ model: 'gpt-4o', messages, response_format: zodResponseFormat(Weather, 'weather') }).finalChatCompletion(),
      () => c.chat.completions.create({ model: 'gpt-4o', messages, response_format: { type: 'json_object' } }),
      () => c.chat.completions.create({ model: 'gpt-4o', messages, tools: [weatherTool], tool_choice: 'required' }),
      () => c.chat.completions.create({ model: 'gpt-4o', messages, tools: [weatherTool], tool_choice: { type: 'function', function: { name: 'get_weather' } } }),
    ];
    for (const call of calls) {
      const err = (await call().catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
      expect(err).toBeInstanceOf(OpenAI.InternalServerError);
      expect(err.status).toBe(503);
    }
    // A plain chat still gets the degraded answer.
    expect((await c.chat.completions.create({ model: 'gpt-4o', messages, tools: [weatherTool] })).choices[0]!.message.content).toBe('Busy; try again soon.');
  });
});
