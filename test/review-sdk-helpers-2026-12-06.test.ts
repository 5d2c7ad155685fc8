// The official SDKs' higher-level helpers (not just `create`) through the gateway, configured from
// config/examples/openai-anthropic-failover.yaml (plus a Responses API route, OpenAI alone), against the bundled mock:
// parse() with a strict zod schema, runTools() over several turns, stream() and its events, the Responses API's
// create/stream/parse, embeddings with `dimensions`, withResponse() headers and AbortController, each when the primary
// answers, when a brownout (set through the mock's control endpoint) sends every request to the Anthropic backup, and
// when the primary answers on a retry before the first byte. Then the Anthropic SDK's helpers through /v1/messages
// (config/examples/anthropic-agents.yaml): messages.stream(), countTokens, messages.parse(), and
// beta.messages.toolRunner() / thread(), which keep the conversation on the provider (message threads), with the first
// account browned out. Found: the mock ignored `thread`, so toolRunner() failed against it (now it holds threads per
// instance); and a thread continued at the backup account while the primary was down got the primary's 529 with the
// backup's 404 `thread_not_found` as a note, which the SDK cannot act on, so the conversation was stuck until the
// primary came back: a thread-state error now reaches the client as it came, and the SDK replays the conversation.
import Anthropic from '@anthropic-ai/sdk';
import { zodOutputFormat } from '@anthropic-ai/sdk/helpers/zod';
import { betaZodTool } from '@anthropic-ai/sdk/helpers/beta/zod';
import OpenAI from 'openai';
import { zodFunction, zodResponseFormat, zodTextFormat } from 'openai/helpers/zod';
import { z } from 'zod';
import { describe, expect, it } from 'vitest';
import { loadConfigFile } from '../src/config/load.ts';
import { classify } from '../src/policy/outcome.ts';
import { errorCodeOf } from '../src/providers/error-outcome.ts';
import type { ConfigInput } from '../src/config/schema.ts';
import type { MockServer } from '../src/mock/server.ts';
import { TEST_KEY, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';

const stack = useStacks();
const mocks = useExtraMocks();

type Mode = 'primary' | 'failover' | 'retry';
const MODES: Mode[] = ['primary', 'failover', 'retry'];

/** POST to the mock's control endpoint, as an operator would. */
async function control(mock: MockServer, path: string, body: unknown): Promise<void> {
  const res = await fetch(`${mock.url}${path}`, { method: path.endsWith('faults') ? 'PUT' : 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  expect(res.status).toBe(200);
}

/**
 * The failover example with the stack's mock as OpenAI and a second mock as Anthropic, a Responses API route added;
 * `failover` browns the primary out, `retry` fails each first attempt at it with a 503.
 */
async function failoverStack(mode: Mode, streamFaults?: Record<string, number>): Promise<{ s: Stack; backup: MockServer; upstream: MockServer }> {
  const backup = await mocks({ apiKey: TEST_KEY });
  const s = await stack({
    config: (url) => {
      const base = loadConfigFile('config/examples/openai-anthropic-failover.yaml', { OPENAI_BASE_URL: `${url}/v1`, OPENAI_API_KEY: TEST_KEY, ANTHROPIC_BASE_URL: backup.url, ANTHROPIC_API_KEY: TEST_KEY }) as ConfigInput;
      return {
        ...base,
        server: { ...base.server, port: 0 },
        routes: [...base.routes, { name: 'responses', match: { path: '/v1/responses' }, targets: [{ provider: 'openai' }], retry: { maxAttempts: 3, backoff: { strategy: 'full-jitter', baseMs: 50, capMs: 200 } } }],
      };
    },
  });
  if (streamFaults) {
    await control(s.mock, '/_mock/faults', { stream: streamFaults });
    await control(backup, '/_mock/faults', { stream: streamFaults });
  }
  if (mode === 'failover') await control(s.mock, '/_mock/brownout', { mode: '503', durationMs: 60_000 });
  if (mode === 'retry') await control(s.mock, '/_mock/faults', { errors: [{ status: 503, firstAttemptsOnly: true }], ...(streamFaults ? { stream: streamFaults } : {}) });
  return { s, backup, upstream: mode === 'failover' ? backup : s.mock };
}

const client = (s: Stack) => new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client', maxRetries: 0, logLevel: 'off' });
const modelOf = (mode: Mode) => (mode === 'failover' ? 'claude-sonnet-4-6' : 'gpt-4o');
const targetOf = (mode: Mode) => (mode === 'failover' ? 'anthropic/claude-sonnet-4-6' : 'openai/gpt-4o');

const Weather = z.object({ city: z.string(), temp: z.number(), tags: z.array(z.string()), unit: z.enum(['c', 'f']) });
const parsedWeather = { city: 'mock', temp: 1, tags: ['mock'], unit: 'c' };
const ask = [{ role: 'user' as const, content: 'What is the weather in Paris?' }];

function tools(calls: string[]) {
  const tool = (name: string) => ({
    type: 'function' as const,
    function: {
      name,
      description: `${name} of a city`,
      parameters: { type: 'object', properties: { x: { type: 'number' } }, required: ['x'] },
      parse: (text: string) => JSON.parse(text) as { x: number },
      function: (args: { x: number }) => {
        calls.push(name);
        return `${name}: ${args.x}`;
      },
    },
  });
  return [tool('get_weather'), tool('get_time')];
}

describe.each(MODES)('the openai SDK helpers, %s', (mode) => {
  it('parse() with a strict zod response_format and a strict zodFunction: parsed set, refusal null, the answering model named', async () => {
    const { s } = await failoverStack(mode);
    const c = client(s);
    const { data, response } = await c.chat.completions.parse({ model: 'gpt-4o', messages: ask, response_format: zodResponseFormat(Weather, 'weather') }).withResponse();
    expect(data).toMatchObject({ object: 'chat.completion', model: modelOf(mode) });
    expect(data.id).toBeTruthy();
    expect(data.created).toBeGreaterThan(1_700_000_000);
    expect(data.choices[0]!.finish_reason).toBe('stop');
    expect(data.choices[0]!.message.parsed).toEqual(parsedWeather);
    expect(data.choices[0]!.message.refusal).toBeNull();
    expect(response.headers.get('x-stormgate-target')).toBe(targetOf(mode));
    expect(response.headers.get('x-request-id')).toBeTruthy();
    const fn = await c.chat.completions.parse({ model: 'gpt-4o', messages: ask, tools: [zodFunction({ name: 'get_weather', parameters: z.object({ x: z.number() }) })] });
    expect(fn.choices[0]!.finish_reason).toBe('tool_calls');
    expect(fn.choices[0]!.message.tool_calls![0]!.function.parsed_arguments).toEqual({ x: 1 });
  });

  it('runTools() over several turns, streamed and not: every call answered once, the final content the last turn\'s', async () => {
    const { s, upstream } = await failoverStack(mode);
    const c = client(s);
    for (const stream of [false, true]) {
      const calls: string[] = [];
      const run = (messages: OpenAI.ChatCompletionMessageParam[]) =>
        stream ? c.chat.completions.runTools({ model: 'gpt-4o', messages, tools: tools(calls), stream: true }) : c.chat.completions.runTools({ model: 'gpt-4o', messages, tools: tools(calls) });
      const runner = run(ask);
      expect(await runner.finalContent()).toMatch(/^Mock answer/);
      const first = runner.messages.length;
      // A second turn: the user asks again, the model calls the tools again, then answers.
      const again = run([...(runner.messages as OpenAI.ChatCompletionMessageParam[]), { role: 'user', content: 'And tomorrow?' }]);
      expect(await again.finalContent()).toMatch(/^Mock answer/);
      expect(calls).toEqual(['get_weather', 'get_time', 'get_weather', 'get_time']);
      expect(first).toBeGreaterThan(2);
      const final = await again.finalChatCompletion();
      expect(final.model).toBe(modelOf(mode));
      expect(final.choices[0]!.finish_reason).toBe('stop');
    }
    expect(upstream.requests().filter((r) => r.status === 200)).toHaveLength(8);
  });

  it('stream(): content.delta / content.done with parsed, tool_calls.function.arguments.delta / done with parsed_arguments, finalChatCompletion() with usage', async () => {
    const { s } = await failoverStack(mode);
    const c = client(s);
    const text = c.chat.completions.stream({ model: 'gpt-4o', messages: ask, response_format: zodResponseFormat(Weather, 'weather'), stream_options: { include_usage: true } });
    let deltas = '';
    const done: unknown[] = [];
    const chunks: OpenAI.ChatCompletionChunk[] = [];
    text.on('content.delta', (e) => (deltas += e.delta));
    text.on('content.done', (e) => done.push(e.parsed));
    text.on('chunk', (ch) => chunks.push(ch));
    const final = await text.finalChatCompletion();
    expect(final.choices[0]!.message.parsed).toEqual(parsedWeather);
    expect(final.choices[0]!.message.refusal).toBeNull();
    expect(JSON.parse(deltas)).toEqual(parsedWeather);
    expect(done).toEqual([parsedWeather]);
    expect(final.usage!.total_tokens).toBe(final.usage!.prompt_tokens + final.usage!.completion_tokens);
    expect(final.usage!.completion_tokens).toBeGreaterThan(0);
    expect(final.model).toBe(modelOf(mode));
    // Every chunk of one answer: one id, one created, one model; the usage chunk last, with no choices.
    expect(new Set(chunks.map((ch) => ch.id)).size).toBe(1);
    expect(new Set(chunks.map((ch) => ch.created)).size).toBe(1);
    expect(new Set(chunks.map((ch) => ch.model))).toEqual(new Set([modelOf(mode)]));
    expect(chunks.every((ch) => ch.object === 'chat.completion.chunk')).toBe(true);
    expect(chunks.at(-1)!.choices).toEqual([]);
    expect(chunks.slice(0, -1).every((ch) => ch.usage == null)).toBe(true);

    const fnArgs: { name: string; parsed: unknown; index: number }[] = [];
    let argDeltas = 0;
    const tooling = c.chat.completions.stream({
      model: 'gpt-4o',
      messages: ask,
      tools: [zodFunction({ name: 'get_weather', parameters: z.object({ x: z.number() }) }), zodFunction({ name: 'get_time', parameters: z.object({ x: z.number() }) })],
    });
    tooling.on('tool_calls.function.arguments.delta', () => argDeltas++);
    tooling.on('tool_calls.function.arguments.done', (e) => fnArgs.push({ name: e.name, parsed: e.parsed_arguments, index: e.index }));
    const tf = await tooling.finalChatCompletion();
    expect(fnArgs).toEqual([{ name: 'get_weather', parsed: { x: 1 }, index: 0 }, { name: 'get_time', parsed: { x: 1 }, index: 1 }]);
    expect(argDeltas).toBeGreaterThan(1);
    expect(tf.choices[0]!.finish_reason).toBe('tool_calls');
    expect(tf.choices[0]!.message.tool_calls!.map((t) => t.function.parsed_arguments)).toEqual([{ x: 1 }, { x: 1 }]);
  });

  it('withResponse() on a stream: the route, target, attempts and request id headers, before the first chunk is read', async () => {
    const { s } = await failoverStack(mode);
    const c = client(s);
    const { data, response, request_id } = await c.chat.completions.create({ model: 'gpt-4o', messages: ask, stream: true }).withResponse();
    expect(response.headers.get('x-stormgate-target')).toBe(targetOf(mode));
    expect(response.headers.get('x-stormgate-route')).toBe('chat');
    expect(Number(response.headers.get('x-stormgate-attempts'))).toBeGreaterThanOrEqual(mode === 'primary' ? 1 : 2);
    if (mode === 'failover') expect(response.headers.get('x-stormgate-fallback')).toBeTruthy();
    expect(request_id).toBeTruthy();
    expect(request_id).toBe(response.headers.get('x-request-id'));
    let text = '';
    for await (const ch of data) text += ch.choices[0]?.delta?.content ?? '';
    expect(text).toMatch(/^Mock answer/);
  });

  it('AbortController mid-stream (stream() helper): the SDK raises its abort, and the gateway aborts the upstream request', async () => {
    const { s, upstream } = await failoverStack(mode, { chunks: 20, chunkDelayMs: 100 });
    const c = client(s);
    const ac = new AbortController();
    const runner = c.chat.completions.stream({ model: 'gpt-4o', messages: ask }, { signal: ac.signal });
    let deltas = 0;
    runner.on('content.delta', () => {
      if (++deltas === 2) ac.abort();
    });
    const err = await runner.finalChatCompletion().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.APIUserAbortError);
    expect(runner.aborted).toBe(true);
    const until = Date.now() + 3_000;
    const answered = () => upstream.requests().filter((r) => r.status === 200);
    while (!answered()[0]?.aborted && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
    expect(answered()).toHaveLength(1);
    expect(answered()[0]!.aborted).toBe(true);
    expect(answered()[0]!.chunksSent ?? 0).toBeLessThan(20);
  });
});

describe.each(['primary', 'retry'] as Mode[])('the Responses API and embeddings, %s', (mode) => {
  it('responses.create, responses.stream() events and finalResponse(), responses.parse with a strict zod text format', async () => {
    const { s } = await failoverStack(mode);
    const c = client(s);
    const { data: whole, response } = await c.responses.create({ model: 'gpt-4o', input: 'hello', instructions: 'Be brief.' }).withResponse();
    expect(whole.output_text).toBe('Mock answer to: hello');
    expect(whole.status).toBe('completed');
    expect(response.headers.get('x-stormgate-route')).toBe('responses');
    const runner = c.responses.stream({ model: 'gpt-4o', input: 'hello' });
    let deltas = '';
    let doneText: string | undefined;
    runner.on('response.output_text.delta', (e) => (deltas += e.delta));
    runner.on('response.output_text.done', (e) => (doneText = e.text));
    const final = await runner.finalResponse();
    expect(deltas).toBe(whole.output_text);
    expect(doneText).toBe(whole.output_text);
    expect(final.status).toBe('completed');
    expect(final.usage!.output_tokens).toBeGreaterThan(0);
    const parsed = await c.responses.parse({ model: 'gpt-4o', input: 'weather?', text: { format: zodTextFormat(Weather, 'weather') } });
    expect(parsed.output_parsed).toEqual(parsedWeather);
    const streamedParse = await c.responses.stream({ model: 'gpt-4o', input: 'weather?', text: { format: zodTextFormat(Weather, 'weather') } }).finalResponse();
    expect(streamedParse.output_parsed).toEqual(parsedWeather);
  });

  it('embeddings.create with dimensions, the SDK\'s base64 default and floats alike', async () => {
    const { s } = await failoverStack(mode);
    const c = client(s);
    const b64 = await c.embeddings.create({ model: 'text-embedding-3-small', input: ['one', 'two'], dimensions: 4 });
    const float = await c.embeddings.create({ model: 'text-embedding-3-small', input: ['one', 'two'], dimensions: 4, encoding_format: 'float' });
    expect(b64.data.map((d) => d.embedding.length)).toEqual([4, 4]);
    expect(b64.data.map((d) => d.embedding)).toEqual(float.data.map((d) => d.embedding));
    expect(b64.data.map((d) => d.index)).toEqual([0, 1]);
  });
});

describe('the Anthropic SDK on /v1/messages (anthropic-agents.yaml), the first account browned out', () => {
  async function agents(brownout: boolean): Promise<{ s: Stack; backup: MockServer; upstream: MockServer }> {
    const backup = await mocks({ apiKey: TEST_KEY });
    const s = await stack({
      config: (url) => {
        const base = loadConfigFile('config/examples/anthropic-agents.yaml', { ANTHROPIC_UPSTREAM_URL: url, ANTHROPIC_API_KEY: TEST_KEY, ANTHROPIC_BACKUP_UPSTREAM_URL: backup.url, ANTHROPIC_BACKUP_API_KEY: TEST_KEY }) as ConfigInput;
        return { ...base, server: { ...base.server, port: 0 } };
      },
    });
    if (brownout) await control(s.mock, '/_mock/brownout', { mode: '529', durationMs: 60_000 });
    return { s, backup, upstream: brownout ? backup : s.mock };
  }
  const claude = (s: Stack) => new Anthropic({ baseURL: s.url, apiKey: 'sk-ant-client', maxRetries: 0, logLevel: 'off' });
  const tool = { name: 'get_weather', description: 'Weather of a city', input_schema: { type: 'object' as const, properties: { x: { type: 'number' } }, required: ['x'] } };

  it.each([false, true])('messages.stream(): on(\'text\'), on(\'inputJson\'), finalMessage(), and countTokens (brownout %s)', async (brownout) => {
    const { s, upstream } = await agents(brownout);
    const c = claude(s);
    const textStream = c.messages.stream({ model: 'claude-sonnet-4-5', max_tokens: 100, messages: [{ role: 'user', content: 'hello' }] });
    let text = '';
    textStream.on('text', (d) => (text += d));
    const msg = await textStream.finalMessage();
    expect(msg.content).toEqual([{ type: 'text', text, citations: null }].map((b) => expect.objectContaining({ type: b.type, text: b.text })));
    expect(text).toBe('Mock answer to: hello');
    expect(msg.stop_reason).toBe('end_turn');
    expect(msg.usage.output_tokens).toBeGreaterThan(0);
    const { response } = await c.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 100, messages: [{ role: 'user', content: 'hi' }] }).withResponse();
    expect(response.headers.get('request-id')).toBeTruthy();

    const toolStream = c.messages.stream({ model: 'claude-sonnet-4-5', max_tokens: 100, tools: [tool], messages: [{ role: 'user', content: 'weather?' }] });
    let partial = '';
    let snapshot: unknown;
    toolStream.on('inputJson', (d, snap) => {
      partial += d;
      snapshot = snap;
    });
    const toolMsg = await toolStream.finalMessage();
    expect(toolMsg.stop_reason).toBe('tool_use');
    expect(JSON.parse(partial)).toEqual({ x: 1 });
    expect(snapshot).toEqual({ x: 1 });
    expect(toolMsg.content.find((b) => b.type === 'tool_use')).toMatchObject({ name: 'get_weather', input: { x: 1 } });

    const count = await c.messages.countTokens({ model: 'claude-sonnet-4-5', messages: [{ role: 'user', content: 'hello there' }] });
    expect(count.input_tokens).toBeGreaterThan(0);
    expect(upstream.requests().filter((r) => r.status === 200).map((r) => r.path)).toEqual(['/v1/messages', '/v1/messages', '/v1/messages', '/v1/messages/count_tokens']);
  });

  it.each([false, true])('messages.parse() and messages.stream() with a zod output format, and beta.messages.toolRunner() over several turns (brownout %s)', async (brownout) => {
    const { s, upstream } = await agents(brownout);
    const c = claude(s);
    const parsed = await c.messages.parse({ model: 'claude-sonnet-4-6', max_tokens: 200, messages: [{ role: 'user', content: 'weather?' }], output_config: { format: zodOutputFormat(Weather) } });
    expect(parsed.parsed_output).toEqual(parsedWeather);
    const streamed = await c.messages.stream({ model: 'claude-sonnet-4-6', max_tokens: 200, messages: [{ role: 'user', content: 'weather?' }], output_config: { format: zodOutputFormat(Weather) } }).finalMessage();
    expect(streamed.parsed_output).toEqual(parsedWeather);

    const calls: unknown[] = [];
    const weather = betaZodTool({ name: 'get_weather', description: 'Weather of a city', inputSchema: z.object({ x: z.number() }), run: (input) => {
      calls.push(input);
      return `sunny, ${input.x} degree`;
    } });
    for (const stream of [false, true]) {
      const runner = c.beta.messages.toolRunner({ model: 'claude-sonnet-4-6', max_tokens: 200, tools: [weather], messages: [{ role: 'user', content: 'weather?' }], ...(stream ? { stream: true as const } : {}) });
      const final = await runner.runUntilDone();
      expect(final.stop_reason).toBe('end_turn');
      expect(final.content.some((b) => b.type === 'text')).toBe(true);
    }
    expect(calls).toEqual([{ x: 1 }, { x: 1 }]);
    const answered = upstream.requests().filter((r) => r.status === 200);
    expect(answered).toHaveLength(6);
    // The runner's turns are on a message thread (its beta header passed on), each after the first sending only its new messages.
    expect(answered.slice(2).every((r) => r.headers['anthropic-beta']?.includes('message-threads-2026-08-12'))).toBe(true);
  });

  it('a thread started at the first account and continued after it browns out: the backup\'s 404 thread_not_found reaches the SDK whole, which replays the conversation there', async () => {
    const { s, backup } = await agents(false);
    const c = claude(s);
    const thread = c.beta.messages.thread({ model: 'claude-sonnet-4-6', max_tokens: 200 });
    const first = await thread.send({ role: 'user', content: 'hello' });
    expect(first.content[0]).toMatchObject({ type: 'text', text: 'Mock answer to: hello' });
    await control(s.mock, '/_mock/brownout', { mode: '529', durationMs: 60_000 });
    const second = await thread.send({ role: 'user', content: 'and again' });
    expect(second.content[0]).toMatchObject({ type: 'text', text: 'Mock answer to: and again' });
    expect(backup.requests().map((r) => r.status)).toEqual([404, 200]);
    const third = await thread.send({ role: 'user', content: 'once more' });
    expect(third.content[0]).toMatchObject({ type: 'text', text: 'Mock answer to: once more' });
    expect(backup.requests().map((r) => r.status)).toEqual([404, 200, 200]);
  });

  it('an AbortController mid-stream ends the helper with its abort error and aborts the upstream request (backup account)', async () => {
    const { s, upstream } = await agents(true);
    await control(upstream, '/_mock/faults', { stream: { chunks: 20, chunkDelayMs: 100 } });
    const c = claude(s);
    const ac = new AbortController();
    const st = c.messages.stream({ model: 'claude-sonnet-4-5', max_tokens: 100, messages: [{ role: 'user', content: 'hello' }] }, { signal: ac.signal });
    let n = 0;
    st.on('text', () => {
      if (++n === 2) ac.abort();
    });
    const err = await st.finalMessage().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Anthropic.APIUserAbortError);
    const until = Date.now() + 3_000;
    const answered = () => upstream.requests().filter((r) => r.status === 200);
    while (!answered()[0]?.aborted && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
    expect(answered()[0]!.aborted).toBe(true);
  });
});

describe('an Anthropic message thread a target cannot continue, classified', () => {
  it('is read from error.details.error_code and ends the request as it came (the SDK replays), never a fallback\'s rejection', () => {
    const body = (code: string) => Buffer.from(JSON.stringify({ type: 'error', error: { type: 'not_found_error', message: 'No thread state found.', details: { error_code: code } } }));
    for (const code of ['thread_not_found', 'thread_already_continued', 'thread_continue_in_flight', 'thread_unsupported_request']) {
      const status = code === 'thread_not_found' ? 404 : 400;
      expect(errorCodeOf(status, body(code))).toBe(code);
      expect(classify({ kind: 'http', status, errorCode: code, hint: undefined }).cls).toBe('thread-state');
    }
    // Another details code is no thread state: the error's type stays what classification reads.
    expect(errorCodeOf(400, body('tool_reference_unresolved'))).toBe('not_found_error');
  });
});
