// A 48th third-party suite: the SDKs' less-common features through the gateway while the provider misbehaves. An
// outside team drives each scenario as application code would, with the official `openai` SDK (6.x) and
// `@anthropic-ai/sdk` against an in-process gateway and the bundled mock provider over real HTTP on 127.0.0.1, and
// asserts what can be observed: the status, the error's class and code, the headers, the chunks in the order they
// came, and the requests the mock counted (its request log and its /_mock/stats). Covered here:
//  - stream_options.include_usage: the usage chunk after the finish and before [DONE], through a retry before the first
//    token (a 503, and a first-token timeout) and when the stream is cut after it;
//  - parallel tool calls streamed (deltas by index), retried before the first output and cut inside the second call,
//    from an OpenAI provider and translated from an Anthropic backup's tool_use blocks;
//  - n: 2, whole and streamed, through a retry;
//  - the Responses API, whole and streamed, through 503s, a first-token timeout, a lasting outage and an abort;
//  - embeddings with an array input and encoding_format: base64;
//  - .withResponse() headers on streams (x-request-id passthrough, x-stormgate-attempts);
//  - AbortController mid-stream (the upstream request aborted, no further attempt);
//  - the SDK's own timeout and maxRetries against the gateway's deadline (x-stainless-timeout);
//  - Anthropic's messages.stream() and finalMessage() through a 529, a lasting 529 and a cut;
//  - models.list() while one provider's listing hangs.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import { TOOL_ARGUMENTS } from '../src/mock/content.ts';
import type { MockRequestLog, MockServer, MockStats } from '../src/mock/server.ts';
import { mockControl } from './helpers/mock-control.ts';
import { countingClient, RETRY_LOOP_ONLY, TEST_KEY, useExtraMocks, useStacks, type ClientOptions, type Stack, type StackOptions } from './helpers/stack.ts';
import { claudeBackupConfig } from './helpers/claude-backup.ts';
import { toolCalls } from './helpers/chat-stream.ts';

const startStack = useStacks(RETRY_LOOP_ONLY);
const startMock = useExtraMocks();

const CHAT = '/v1/chat/completions';
const RESPONSES = '/v1/responses';
const EMBEDDINGS = '/v1/embeddings';
const MESSAGES = '/v1/messages';

/** Three attempts, 20 ms apart: a retry that the tests can count without waiting for it. */
const FAST_RETRY: StackOptions['route'] = { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 20, capMs: 20 } } };
const FIRST_503: StackOptions['faults'] = { errors: [{ status: 503, firstAttemptsOnly: true }] };

const messages = [{ role: 'user' as const, content: 'What is the weather in Paris and the time in Tokyo?' }];
const weatherTool = {
  type: 'function' as const,
  function: { name: 'get_weather', description: 'Weather of a city', parameters: { type: 'object', properties: { x: { type: 'number' } }, required: ['x'] } },
};
const timeTool = { type: 'function' as const, function: { ...weatherTool.function, name: 'get_time', description: 'Local time' } };

/** An openai SDK client of the stack and the count of HTTP requests it sent (its own retries included). */
const sdk = (s: Stack, opts: ClientOptions = {}) => countingClient(s, { logLevel: 'off', ...opts });

/** The mock's log of one path, oldest first. */
const upstream = (m: MockServer, path: string): MockRequestLog[] => m.requests().filter((r) => r.path === path);
const stats = (m: MockServer) => mockControl(m, 'GET', 'stats') as Promise<MockStats>;

/** Waits (up to 5 s) until the mock has received `n` requests on `path`. */
async function arrived(m: MockServer, path: string, n: number): Promise<void> {
  const until = Date.now() + 5_000;
  while (upstream(m, path).length < n) {
    if (Date.now() > until) throw new Error(`the mock never received ${n} requests on ${path}`);
    await sleep(5);
  }
}

/**
 * A first attempt that never speaks: the mock holds every stream's first token for 10 s, and once the first request
 * has arrived the test lifts that (PATCH /_mock/faults, as a user's script would), so only the retry answers.
 */
async function slowFirstAttemptOnly(m: MockServer, path: string): Promise<void> {
  await arrived(m, path, 1);
  await mockControl(m, 'PATCH', 'faults', { stream: null });
}

/** The SDK error a promise rejects with; fails the test if it resolves. */
async function rejection(p: Promise<unknown>): Promise<unknown> {
  return p.then(
    () => expect.unreachable('expected a rejection'),
    (e: unknown) => e,
  );
}

/** A chat stream's chunks as the SDK yields them, and the error that ended it, if any. */
async function drain<T>(stream: AsyncIterable<T>): Promise<{ items: T[]; error?: unknown }> {
  const items: T[] = [];
  try {
    for await (const c of stream) items.push(c);
    return { items };
  } catch (error) {
    return { items, error };
  }
}

const text = (chunks: OpenAI.ChatCompletionChunk[], choice = 0) =>
  chunks.flatMap((c) => c.choices.filter((x) => x.index === choice).map((x) => x.delta?.content ?? '')).join('');

/** The `data:` payloads of an SSE body, in order. */
const dataEvents = (body: string) =>
  body
    .split('\n\n')
    .flatMap((ev) => ev.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trim()))
    .filter((d) => d !== '');

/**
 * The mock's answer to a body from a fault-free mock of its own, asked directly (no gateway): the reference the
 * gateway's answer must equal (the mock's answers are a function of the body).
 */
async function direct(body: OpenAI.ChatCompletionCreateParamsNonStreaming): Promise<OpenAI.ChatCompletion> {
  const clean = await startMock();
  return new OpenAI({ baseURL: `${clean.url}/v1`, apiKey: TEST_KEY, maxRetries: 0, logLevel: 'off' }).chat.completions.create(body);
}

/** The text of a Response's message items (the SDK adds `output_text` to whole answers, not to a stream's final one). */
const responseText = (r: OpenAI.Responses.Response) =>
  r.output.flatMap((o) => (o.type === 'message' ? o.content.map((c) => (c.type === 'output_text' ? c.text : '')) : [])).join('');

// ---------------------------------------------------------------------------------------------------------------
describe('stream_options.include_usage through faults', () => {
  it('a first-attempt 503: on the wire one role chunk, the finish, then exactly one usage chunk (choices: []) and [DONE] last; headers name 2 attempts and echo the x-request-id', async () => {
    const s = await startStack({ faults: FIRST_503, route: FAST_RETRY });
    const body = { model: 'gpt-4o', messages, stream: true, stream_options: { include_usage: true } };
    const res = await fetch(`${s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: 'Bearer x', 'x-request-id': 'trace-48-usage' },
      body: JSON.stringify(body),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/);
    expect(res.headers.get('x-stormgate-attempts')).toBe('2');
    expect(res.headers.get('x-stormgate-request-id')).toBe('trace-48-usage');
    const events = dataEvents(await res.text());
    expect(events.at(-1)).toBe('[DONE]');
    expect(events.filter((e) => e === '[DONE]')).toHaveLength(1);
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e) as OpenAI.ChatCompletionChunk);
    // The usage chunk is the last before [DONE], right after the finish chunk, and the only one with a usage.
    const last = chunks.at(-1)!;
    expect(last.choices).toEqual([]);
    expect(chunks.at(-2)!.choices[0]!.finish_reason).toBe('stop');
    expect(chunks.filter((c) => c.usage != null)).toHaveLength(1);
    expect(chunks.filter((c) => c.choices[0]?.delta?.role === 'assistant')).toHaveLength(1);
    expect(new Set(chunks.map((c) => c.id)).size).toBe(1);

    const log = upstream(s.mock, CHAT);
    expect(log.map((r) => r.status)).toEqual([503, 200]);
    expect(log[1]!.headers['x-retry-attempt']).toBe('1');
    expect(log[1]!.headers['x-retry-reason']).toBe('status_503');
    expect(log.map((r) => r.headers['x-client-request-id'])).toEqual(['trace-48-usage', 'trace-48-usage']);
    // The answering attempt's id is the one passed back, not the failed attempt's.
    expect(res.headers.get('x-request-id')).toBe(log[1]!.requestId);
    // The same usage the provider reports for this body (the reference asked directly, after the counts above).
    const ref = await direct({ model: 'gpt-4o', messages });
    expect(last.usage).toEqual(ref.usage);
    expect(chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('')).toBe(ref.choices[0]!.message.content);
  });

  it('a first attempt silent past firstTokenMs: the retry (timeout_first_token) streams; the SDK sees one usage chunk, last, after the finish; the silent attempt was aborted', async () => {
    const s = await startStack({ faults: { stream: { firstTokenDelayMs: 10_000 } }, route: FAST_RETRY, provider: { timeouts: { firstTokenMs: 500 } } });
    const { client, counter } = sdk(s);
    const t0 = Date.now();
    const call = client.chat.completions.create({ model: 'gpt-4o', messages, stream: true, stream_options: { include_usage: true } }).withResponse();
    await slowFirstAttemptOnly(s.mock, CHAT);
    const { data: stream, response } = await call;
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    const { items, error } = await drain(stream);
    expect(error).toBeUndefined();
    expect(Date.now() - t0).toBeGreaterThanOrEqual(450);
    const usageAt = items.findIndex((c) => c.usage != null);
    const finishAt = items.findIndex((c) => c.choices[0]?.finish_reason != null);
    expect(usageAt).toBe(items.length - 1);
    expect(finishAt).toBe(items.length - 2);
    expect(items[usageAt]!.usage!.completion_tokens).toBeGreaterThan(0);
    expect(items.filter((c) => c.usage != null)).toHaveLength(1);
    expect(counter.requests).toBe(1);

    const log = upstream(s.mock, CHAT);
    expect(log).toHaveLength(2);
    expect(log[0]!.aborted).toBe(true);
    expect(log[1]!.headers['x-retry-reason']).toBe('timeout_first_token');
    expect(log[1]!.status).toBe(200);
  });

  it('cut after two content chunks: the SDK raises stream_interrupted, never saw a finish or the usage chunk, got a prefix of the answer; nothing is sent again', async () => {
    const s = await startStack({ faults: { stream: { cutAfterChunks: 2 } }, route: FAST_RETRY });
    const { client, counter } = sdk(s);
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true, stream_options: { include_usage: true } });
    const { items, error } = await drain(stream);
    expect(error).toBeInstanceOf(OpenAI.APIError);
    expect((error as InstanceType<typeof OpenAI.APIError>).code).toBe('stream_interrupted');
    expect(items.some((c) => c.usage != null)).toBe(false);
    expect(items.some((c) => c.choices[0]?.finish_reason != null)).toBe(false);
    const ref = (await direct({ model: 'gpt-4o', messages })).choices[0]!.message.content!;
    const got = text(items);
    expect(got.length).toBeGreaterThan(0);
    expect(got.length).toBeLessThan(ref.length);
    expect(ref.startsWith(got)).toBe(true);
    await sleep(300);
    expect(upstream(s.mock, CHAT)).toHaveLength(1);
    expect(counter.requests).toBe(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('parallel tool calls streamed', () => {
  it('a first-attempt 503: two calls assembled by index, each id sent once, whole arguments, finish tool_calls; one SDK request, two upstream', async () => {
    const s = await startStack({ faults: FIRST_503, route: FAST_RETRY });
    const { client, counter } = sdk(s);
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages, tools: [weatherTool, timeTool], stream: true });
    const { items, error } = await drain(stream);
    expect(error).toBeUndefined();
    const calls = toolCalls(items);
    expect(Object.keys(calls)).toEqual(['0', '1']);
    expect([calls[0]!.name, calls[1]!.name]).toEqual(['get_weather', 'get_time']);
    expect([calls[0]!.ids, calls[1]!.ids]).toEqual([1, 1]);
    expect(calls[0]!.id).toMatch(/^call_/);
    expect(calls[0]!.id).not.toBe(calls[1]!.id);
    expect([calls[0]!.args, calls[1]!.args]).toEqual([TOOL_ARGUMENTS, TOOL_ARGUMENTS]);
    expect(items.at(-1)!.choices[0]!.finish_reason).toBe('tool_calls');
    expect(counter.requests).toBe(1);
    expect(upstream(s.mock, CHAT).map((r) => r.status)).toEqual([503, 200]);
  });

  it('cut inside the second call\'s arguments: stream() rejects finalChatCompletion() with stream_interrupted; call 0 whole, call 1 a fragment; no retry, the SDK sent once', async () => {
    // Each call's 7-character arguments come in 5 pieces: a cut after 7 content chunks leaves call 1 with 2 of them.
    const s = await startStack({ faults: { stream: { cutAfterChunks: 7 } }, route: FAST_RETRY });
    const { client, counter } = sdk(s);
    const runner = client.chat.completions.stream({ model: 'gpt-4o', messages, tools: [weatherTool, timeTool] });
    const chunks: OpenAI.ChatCompletionChunk[] = [];
    runner.on('chunk', (c) => chunks.push(c));
    const err = await rejection(runner.finalChatCompletion());
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('stream_interrupted');
    const calls = toolCalls(chunks);
    expect(calls[0]!.args).toBe(TOOL_ARGUMENTS);
    expect(calls[1]!.name).toBe('get_time');
    expect(calls[1]!.args).toBe('{"');
    expect(() => JSON.parse(calls[1]!.args)).toThrow();
    expect(chunks.some((c) => c.choices[0]?.finish_reason != null)).toBe(false);
    await sleep(300);
    expect(upstream(s.mock, CHAT)).toHaveLength(1);
    expect(counter.requests).toBe(1);
  });

  it("DESIGN: a tool call's opening (its id and name, in the role chunk) is the first output: arguments that never come are not retried past firstTokenMs but end at idleMs with stream_interrupted; the upstream request aborted", async () => {
    // README: firstTokenMs runs to the first event with output, a tool-call delta included. The agent has seen the
    // call's name, so a retry (which could name another call) would contradict it; the price is that a provider that
    // names the call and then stalls costs idleMs rather than firstTokenMs.
    const s = await startStack({ faults: { stream: { firstTokenDelayMs: 10_000 } }, route: FAST_RETRY, provider: { timeouts: { firstTokenMs: 1_000, idleMs: 2_000 } } });
    const { client, counter } = sdk(s);
    const t0 = Date.now();
    const { data: stream, response } = await client.chat.completions.create({ model: 'gpt-4o', messages, tools: [weatherTool], stream: true }).withResponse();
    // Started at the opening, well before firstTokenMs would have ended the attempt.
    expect(Date.now() - t0).toBeLessThan(950);
    expect(response.headers.get('x-stormgate-attempts')).toBe('1');
    const { items, error } = await drain(stream);
    expect((error as InstanceType<typeof OpenAI.APIError>).code).toBe('stream_interrupted');
    expect(Date.now() - t0).toBeGreaterThanOrEqual(1_900);
    const calls = toolCalls(items);
    expect([calls[0]!.name, calls[0]!.args]).toEqual(['get_weather', '']);
    await sleep(300);
    const log = upstream(s.mock, CHAT);
    expect(log).toHaveLength(1);
    expect(log[0]!.aborted).toBe(true);
    expect((await stats(s.mock)).inflight).toBe(0);
    expect(counter.requests).toBe(1);
  });

  /** A chat route whose OpenAI primary answers 503 to everything, failed over to an Anthropic backup (translated). */
  async function translated(claudeFaults: StackOptions['faults'] = {}) {
    const claude = await startMock({ apiKey: 'claude-key', faults: claudeFaults });
    const s = await startStack({
      faults: { errors: [{ status: 503 }] },
      config: (url) => claudeBackupConfig(url, claude.url),
    });
    return { s, claude };
  }

  it('failed over to an Anthropic backup (translated) with include_usage: tool_use blocks become calls 0 and 1, then the finish, then one usage chunk', async () => {
    const { s, claude } = await translated();
    const { client, counter } = sdk(s);
    const { data: stream, response } = await client.chat.completions
      .create({ model: 'gpt-4o', messages, tools: [weatherTool, timeTool], stream: true, stream_options: { include_usage: true } })
      .withResponse();
    expect(response.headers.get('x-stormgate-attempts')).toBe('3');
    expect(response.headers.get('x-stormgate-target')).toBe('claude/claude-sonnet-4-5');
    expect(response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    const { items, error } = await drain(stream);
    expect(error).toBeUndefined();
    const calls = toolCalls(items);
    expect([calls[0]!.name, calls[1]!.name]).toEqual(['get_weather', 'get_time']);
    expect([calls[0]!.args, calls[1]!.args]).toEqual([TOOL_ARGUMENTS, TOOL_ARGUMENTS]);
    expect([calls[0]!.ids, calls[1]!.ids]).toEqual([1, 1]);
    expect(calls[0]!.id).toMatch(/^toolu_/);
    expect(items.at(-2)!.choices[0]!.finish_reason).toBe('tool_calls');
    expect(items.at(-1)!.choices).toEqual([]);
    expect(items.filter((c) => c.usage != null)).toHaveLength(1);
    expect(items.at(-1)!.usage!.completion_tokens).toBeGreaterThan(0);
    expect(upstream(s.mock, CHAT).map((r) => r.status)).toEqual([503, 503]);
    expect(upstream(claude, MESSAGES)).toHaveLength(1);
    expect(counter.requests).toBe(1);
  });

  it("the translated backup's stream cut inside its second tool_use: stream_interrupted, call 0 whole, call 1 named with a fragment, no usage chunk; the backup is not asked again", async () => {
    const { s, claude } = await translated({ stream: { cutAfterChunks: 7 } });
    const { client, counter } = sdk(s);
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages, tools: [weatherTool, timeTool], stream: true, stream_options: { include_usage: true } });
    const { items, error } = await drain(stream);
    expect((error as InstanceType<typeof OpenAI.APIError>).code).toBe('stream_interrupted');
    const calls = toolCalls(items);
    expect(calls[0]!.args).toBe(TOOL_ARGUMENTS);
    expect([calls[1]!.name, calls[1]!.args]).toEqual(['get_time', '{"']);
    expect(items.some((c) => c.usage != null || c.choices[0]?.finish_reason != null)).toBe(false);
    await sleep(300);
    expect(upstream(claude, MESSAGES)).toHaveLength(1);
    expect(upstream(s.mock, CHAT)).toHaveLength(2);
    expect(counter.requests).toBe(1);
  });

  it('AbortController fired after the first argument delta: the SDK\'s loop ends quietly (openai 6 swallows its own abort), the mock counts one aborted request and none after it', async () => {
    const s = await startStack({ faults: { stream: { chunkDelayMs: 150 } }, route: FAST_RETRY });
    const { client, counter } = sdk(s);
    const ac = new AbortController();
    const stream = await client.chat.completions.create(
      { model: 'gpt-4o', messages, tools: [weatherTool, timeTool], stream: true, stream_options: { include_usage: true } },
      { signal: ac.signal },
    );
    const seen: OpenAI.ChatCompletionChunk[] = [];
    const err = await (async () => {
      try {
        for await (const c of stream) {
          seen.push(c);
          if (c.choices[0]?.delta?.tool_calls?.[0]?.function?.arguments) ac.abort();
        }
      } catch (e) {
        return e;
      }
      return undefined;
    })();
    // The raw Stream's iterator returns on an AbortError of its own signal (openai 6: `if (isAbortError(e)) return`);
    // only the helpers (stream(), runTools()) raise APIUserAbortError. So the application must look at its signal.
    expect(err).toBeUndefined();
    expect(ac.signal.aborted).toBe(true);
    expect(seen.some((c) => c.choices[0]?.finish_reason != null || c.usage != null)).toBe(false);
    expect(toolCalls(seen)[0]!.args.length).toBeGreaterThan(0);
    // Long enough for any retry the gateway would have made (the stream had 9 more pieces to send at 150 ms).
    await sleep(1_000);
    const st = await stats(s.mock);
    expect(st.total).toBe(1);
    expect(st.aborted).toBe(1);
    expect(st.inflight).toBe(0);
    expect(upstream(s.mock, CHAT)[0]!.chunksSent).toBeLessThan(10);
    expect(counter.requests).toBe(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('n: 2 choices', () => {
  it("a 429 with retry-after-ms: 300 first: the hint is waited, both choices the provider's answer, usage counts both, x-stormgate-attempts 2", async () => {
    const s = await startStack({ faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after-ms': '300' } }] }, route: FAST_RETRY });
    const { client, counter } = sdk(s);
    const t0 = Date.now();
    const { data, response } = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], n: 2 }).withResponse();
    expect(Date.now() - t0).toBeGreaterThanOrEqual(290);
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(data.choices.map((c) => c.index)).toEqual([0, 1]);
    expect(data.choices.every((c) => c.finish_reason === 'stop')).toBe(true);
    const one = await direct({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    expect(data.choices.map((c) => c.message.content)).toEqual([one.choices[0]!.message.content, one.choices[0]!.message.content]);
    expect(data.usage!.completion_tokens).toBe(2 * one.usage!.completion_tokens);
    expect(counter.requests).toBe(1);
    expect(upstream(s.mock, CHAT).map((r) => r.status)).toEqual([429, 200]);
  });

  it('streamed with include_usage after a first-token timeout: each choice whole and finished once, then one usage chunk counting both', async () => {
    const s = await startStack({ faults: { stream: { firstTokenDelayMs: 10_000 } }, route: FAST_RETRY, provider: { timeouts: { firstTokenMs: 500 } } });
    const { client } = sdk(s);
    const call = client.chat.completions.create({ model: 'gpt-4o', messages, n: 2, stream: true, stream_options: { include_usage: true } }).withResponse();
    await slowFirstAttemptOnly(s.mock, CHAT);
    const { data: stream, response } = await call;
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    const { items, error } = await drain(stream);
    expect(error).toBeUndefined();
    const finishes = items.flatMap((c) => c.choices.filter((x) => x.finish_reason != null).map((x) => x.index));
    expect(finishes.sort()).toEqual([0, 1]);
    expect(text(items, 0)).toBe(text(items, 1));
    expect(text(items, 0).length).toBeGreaterThan(0);
    expect(items.filter((c) => c.usage != null)).toHaveLength(1);
    expect(items.at(-1)!.choices).toEqual([]);
    const one = await direct({ model: 'gpt-4o', messages });
    expect(items.at(-1)!.usage!.completion_tokens).toBe(2 * one.usage!.completion_tokens);
    expect(text(items, 0)).toBe(one.choices[0]!.message.content);
  });
  it('streamed, the first attempt cut after its role chunks (before any output): the retry streams; each choice gets one role chunk, not one per attempt', async () => {
    const s = await startStack({ faults: { stream: { cutAfterChunks: 0 } }, route: FAST_RETRY });
    const { client } = sdk(s);
    const call = client.chat.completions.create({ model: 'gpt-4o', messages, n: 2, stream: true }).withResponse();
    await slowFirstAttemptOnly(s.mock, CHAT);
    const { data: stream, response } = await call;
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    const { items, error } = await drain(stream);
    expect(error).toBeUndefined();
    const roles = items.flatMap((c) => c.choices.filter((x) => x.delta?.role === 'assistant').map((x) => x.index));
    expect(roles.sort()).toEqual([0, 1]);
    expect(new Set(items.map((c) => c.id)).size).toBe(1);
    const log = upstream(s.mock, CHAT);
    expect(log).toHaveLength(2);
    // A stream broken before its first output is retried under retryOn's `network`, named bad_stream (README, metrics).
    expect(log[1]!.headers['x-retry-reason']).toBe('bad_stream');
    expect(text(items, 1)).toBe((await direct({ model: 'gpt-4o', messages })).choices[0]!.message.content);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('the Responses API', () => {
  it('whole, through a first-attempt 503: status completed, output_text the answer, x-stormgate-attempts 2 on withResponse(), one SDK request', async () => {
    const s = await startStack({ faults: FIRST_503, route: FAST_RETRY });
    const { client, counter } = sdk(s);
    const { data, response, request_id } = await client.responses.create({ model: 'gpt-4o', input: 'Say hello' }).withResponse();
    expect(data.status).toBe('completed');
    expect(data.output_text.length).toBeGreaterThan(0);
    expect(data.usage!.output_tokens).toBeGreaterThan(0);
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(response.headers.get('x-stormgate-route')).toBe('responses');
    const log = upstream(s.mock, RESPONSES);
    expect(log.map((r) => r.status)).toEqual([503, 200]);
    expect(request_id).toBe(log[1]!.requestId);
    expect(counter.requests).toBe(1);
  });

  it('streamed through a first-attempt 503: one response.created, sequence numbers 0..n-1 without a gap, the deltas are the completed output_text', async () => {
    const s = await startStack({ faults: FIRST_503, route: FAST_RETRY });
    const { client, counter } = sdk(s);
    const stream = await client.responses.create({ model: 'gpt-4o', input: 'Say hello', stream: true });
    const { items, error } = await drain(stream);
    expect(error).toBeUndefined();
    expect(items[0]!.type).toBe('response.created');
    expect(items.at(-1)!.type).toBe('response.completed');
    expect(items.filter((e) => e.type === 'response.created')).toHaveLength(1);
    expect(items.map((e) => e.sequence_number)).toEqual(items.map((_, i) => i));
    const deltas = items.flatMap((e) => (e.type === 'response.output_text.delta' ? [e.delta] : [])).join('');
    const completed = items.at(-1) as OpenAI.Responses.ResponseCompletedEvent;
    expect(deltas).toBe(responseText(completed.response));
    expect(deltas.length).toBeGreaterThan(0);
    expect((items[0] as OpenAI.Responses.ResponseCreatedEvent).response.id).toBe(completed.response.id);
    expect(counter.requests).toBe(1);
    expect(upstream(s.mock, RESPONSES).map((r) => r.status)).toEqual([503, 200]);
  });

  it("streamed after a first-token timeout: the silent attempt's response.created never reaches the client; responses.stream()'s finalResponse() is the retry's", async () => {
    const s = await startStack({ faults: { stream: { firstTokenDelayMs: 10_000 } }, route: FAST_RETRY, provider: { timeouts: { firstTokenMs: 500 } } });
    const { client, counter } = sdk(s);
    const runner = client.responses.stream({ model: 'gpt-4o', input: 'Say hello' });
    const types: string[] = [];
    runner.on('event', (e) => types.push(e.type));
    await slowFirstAttemptOnly(s.mock, RESPONSES);
    const final = await runner.finalResponse();
    expect(final.status).toBe('completed');
    expect(responseText(final).length).toBeGreaterThan(0);
    expect(types.filter((t) => t === 'response.created')).toHaveLength(1);
    expect(types.filter((t) => t === 'response.in_progress')).toHaveLength(1);
    const log = upstream(s.mock, RESPONSES);
    expect(log).toHaveLength(2);
    expect(log[0]!.aborted).toBe(true);
    expect(log[1]!.headers['x-retry-reason']).toBe('timeout_first_token');
    expect(counter.requests).toBe(1);
  });

  it('streamed, the first attempt ending in an error event after response.created (before output): retried; the client\'s events start at sequence 0 with one response.created', async () => {
    const s = await startStack({ faults: { stream: { errorAfterChunks: 0 } }, route: FAST_RETRY });
    const { client, counter } = sdk(s);
    const call = client.responses.create({ model: 'gpt-4o', input: 'Say hello', stream: true });
    await slowFirstAttemptOnly(s.mock, RESPONSES);
    const { items, error } = await drain(await call);
    expect(error).toBeUndefined();
    expect(items.map((e) => e.sequence_number)).toEqual(items.map((_, i) => i));
    expect(items.filter((e) => e.type === 'response.created')).toHaveLength(1);
    expect(items.some((e) => e.type === 'error')).toBe(false);
    expect(items.at(-1)!.type).toBe('response.completed');
    const log = upstream(s.mock, RESPONSES);
    expect(log).toHaveLength(2);
    expect(log[1]!.headers['x-retry-attempt']).toBe('1');
    expect(counter.requests).toBe(1);
  });

  it("a per-request timeout of 2 s shorter than the model's silence: responses.stream() starts at the deadline with response.created at sequence 0, and finalResponse() completes; one upstream request", async () => {
    const s = await startStack({ faults: { stream: { firstTokenDelayMs: 2_600 } }, route: FAST_RETRY, provider: { timeouts: { firstTokenMs: 8_000 } } });
    const { client, counter } = sdk(s, { maxRetries: 2 });
    const t0 = Date.now();
    const { data: stream, response } = await client.responses.create({ model: 'gpt-4o', input: 'Say hello', stream: true }, { timeout: 2_000 }).withResponse();
    expect(Date.now() - t0).toBeLessThan(2_000);
    expect(response.headers.get('x-stormgate-attempts')).toBe('1');
    const { items, error } = await drain(stream);
    expect(error).toBeUndefined();
    expect(Date.now() - t0).toBeGreaterThanOrEqual(2_500);
    expect(items[0]!.type).toBe('response.created');
    expect(items.map((e) => e.sequence_number)).toEqual(items.map((_, i) => i));
    const completed = items.at(-1) as OpenAI.Responses.ResponseCompletedEvent;
    expect(completed.type).toBe('response.completed');
    expect(responseText(completed.response).length).toBeGreaterThan(0);
    expect(upstream(s.mock, RESPONSES)).toHaveLength(1);
    expect(counter.requests).toBe(1);
  });

  it('streamed into a lasting 503: InternalServerError 503 with x-should-retry false before any event; the default maxRetries adds no request; 3 upstream', async () => {
    const s = await startStack({ faults: { errors: [{ status: 503 }] }, route: FAST_RETRY });
    const { client, counter } = sdk(s, { maxRetries: 2 });
    const err = await rejection(client.responses.create({ model: 'gpt-4o', input: 'Say hello', stream: true }));
    expect(err).toBeInstanceOf(OpenAI.InternalServerError);
    const e = err as InstanceType<typeof OpenAI.APIError>;
    expect(e.status).toBe(503);
    expect(e.headers?.get('x-should-retry')).toBe('false');
    expect(e.headers?.get('x-stormgate-attempts')).toBe('3');
    expect(counter.requests).toBe(1);
    expect(upstream(s.mock, RESPONSES).map((r) => r.status)).toEqual([503, 503, 503]);
  });

  it('aborted by the SDK while the gateway waits for the first token: APIUserAbortError, the one upstream request aborted, no retry when firstTokenMs would have passed', async () => {
    const s = await startStack({ faults: { stream: { firstTokenDelayMs: 10_000 } }, route: FAST_RETRY, provider: { timeouts: { firstTokenMs: 600 } } });
    const { client, counter } = sdk(s);
    const ac = new AbortController();
    const call = client.responses.create({ model: 'gpt-4o', input: 'Say hello', stream: true }, { signal: ac.signal });
    await arrived(s.mock, RESPONSES, 1);
    await sleep(100);
    ac.abort();
    expect(await rejection(call)).toBeInstanceOf(OpenAI.APIUserAbortError);
    await sleep(1_200);
    const st = await stats(s.mock);
    expect(st.total).toBe(1);
    expect(st.aborted).toBe(1);
    expect(st.inflight).toBe(0);
    expect(counter.requests).toBe(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('embeddings', () => {
  it('an array of three inputs with encoding_format base64 through a first-attempt 503: three strings in input order that decode to the float answer', async () => {
    const s = await startStack({ faults: FIRST_503, route: FAST_RETRY });
    const { client, counter } = sdk(s);
    const input = ['alpha', 'beta gamma', 'delta'];
    const { data: b64, response } = await client.embeddings.create({ model: 'text-embedding-3-small', input, encoding_format: 'base64' }).withResponse();
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(b64.data.map((d) => d.index)).toEqual([0, 1, 2]);
    expect(b64.data.every((d) => typeof d.embedding === 'string')).toBe(true);
    const floats = await client.embeddings.create({ model: 'text-embedding-3-small', input, encoding_format: 'float' });
    for (let i = 0; i < 3; i++) {
      const buf = Buffer.from(b64.data[i]!.embedding as unknown as string, 'base64');
      const decoded = Array.from(new Float32Array(buf.buffer, buf.byteOffset, buf.byteLength / 4));
      expect(decoded).toEqual(floats.data[i]!.embedding.map((x) => Math.fround(x)));
    }
    // The three vectors differ (each input its own), and the usage counts all three inputs.
    expect(new Set(b64.data.map((d) => d.embedding)).size).toBe(3);
    expect(b64.usage.prompt_tokens).toBe(floats.usage.prompt_tokens);
    expect(counter.requests).toBe(2);
    expect(upstream(s.mock, EMBEDDINGS).map((r) => r.status)).toEqual([503, 200, 503, 200]);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe("the SDK's timeout and maxRetries against the gateway's deadline", () => {
  it("a per-request timeout on a stream: the gateway reads x-stainless-timeout and does not send it upstream; x-stainless-retry-count goes on; answered after a 503", async () => {
    const s = await startStack({ faults: FIRST_503, route: FAST_RETRY });
    const { client } = sdk(s, { maxRetries: 2 });
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }, { timeout: 5_000 });
    const { error } = await drain(stream);
    expect(error).toBeUndefined();
    const log = upstream(s.mock, CHAT);
    expect(log).toHaveLength(2);
    for (const r of log) {
      expect(r.headers['x-stainless-timeout']).toBeUndefined();
      expect(r.headers['x-stainless-retry-count']).toBe('0');
    }
  });

  it('a per-request timeout of 2 s on a stream whose provider never sends a first token: the gateway starts the stream at its deadline, and the SDK raises stream_interrupted once firstTokenMs passes; one upstream request, the SDK never retries', async () => {
    const s = await startStack({ faults: { stream: { firstTokenDelayMs: 20_000 } }, route: FAST_RETRY, provider: { timeouts: { firstTokenMs: 3_000 } } });
    const { client, counter } = sdk(s, { maxRetries: 2 });
    const t0 = Date.now();
    const { data: stream, response } = await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }, { timeout: 2_000 }).withResponse();
    // x-stainless-timeout: 2 less the margin (1 s at most from a client's timeout): headers before the SDK gives up.
    expect(Date.now() - t0).toBeLessThan(2_000);
    expect(response.status).toBe(200);
    const { items, error } = await drain(stream);
    expect(error).toBeInstanceOf(OpenAI.APIError);
    expect((error as InstanceType<typeof OpenAI.APIError>).code).toBe('stream_interrupted');
    expect(items.every((c) => !c.choices[0]?.delta?.content)).toBe(true);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(2_900);
    await sleep(200);
    expect(upstream(s.mock, CHAT)).toHaveLength(1);
    expect(counter.requests).toBe(1);
  });

  it("a 503 whose retry-after-ms outlasts the SDK's per-request timeout: the gateway answers at once inviting the SDK back (x-should-retry true), the SDK waits the hint and its retry is answered after the hold-off", async () => {
    const s = await startStack({ faults: { errors: [{ status: 503, times: 1, headers: { 'retry-after-ms': '2500' } }] }, route: FAST_RETRY });
    const seen: Array<{ status: number; shouldRetry: string | null; retryAfterMs: number }> = [];
    const client = new OpenAI({
      baseURL: s.baseURL,
      apiKey: 'sk-client',
      logLevel: 'off',
      maxRetries: 2,
      fetch: async (url, init) => {
        const res = await fetch(url, init);
        seen.push({ status: res.status, shouldRetry: res.headers.get('x-should-retry'), retryAfterMs: Number(res.headers.get('retry-after-ms')) });
        return res;
      },
    });
    const t0 = Date.now();
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }, { timeout: 2_000 });
    const { error } = await drain(stream);
    expect(error).toBeUndefined();
    expect(seen.map((x) => [x.status, x.shouldRetry])).toEqual([
      [503, 'true'],
      [200, null],
    ]);
    // Told the hold-off's end (the hint and its spread): at least the 2.5 s hint, and the first answer came at once.
    expect(seen[0]!.retryAfterMs).toBeGreaterThanOrEqual(2_500);
    expect(seen[0]!.retryAfterMs).toBeLessThanOrEqual(4_000);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(2_500);
    const log = upstream(s.mock, CHAT);
    expect(log.map((r) => r.status)).toEqual([503, 200]);
    expect(log.map((r) => r.headers['x-stainless-retry-count'])).toEqual(['0', '1']);
  });

  it("DESIGN: the client-wide timeout option (openai 6 sends no x-stainless-timeout for it) on a hung provider: the SDK times out and sends again itself; the mock sees one aborted request per SDK try", async () => {
    // Documented (README, Deadlines and timeouts): the gateway cannot know a client-wide timeout unless
    // x-stormgate-timeout-ms is in defaultHeaders, so here the route's deadline holds and the SDK's retries multiply.
    const s = await startStack({ faults: { hangRate: 1 }, route: FAST_RETRY });
    const { client, counter } = sdk(s, { timeout: 800, maxRetries: 1 });
    const err = await rejection(client.chat.completions.create({ model: 'gpt-4o', messages }));
    expect(err).toBeInstanceOf(OpenAI.APIConnectionTimeoutError);
    expect(counter.requests).toBe(2);
    await sleep(300);
    const log = upstream(s.mock, CHAT);
    expect(log.map((r) => r.headers['x-stainless-retry-count'])).toEqual(['0', '1']);
    expect(log.every((r) => r.aborted)).toBe(true);
    expect((await stats(s.mock)).inflight).toBe(0);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe("Anthropic's messages.stream() and finalMessage()", () => {
  const anthropicConfig = (mockUrl: string): ConfigInput => ({
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    providers: { claude: { family: 'anthropic', baseUrl: mockUrl, apiKey: TEST_KEY, breaker: false } },
    routes: [
      {
        name: 'messages',
        match: { path: MESSAGES },
        targets: [{ provider: 'claude' }],
        retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 20, capMs: 20 } },
        budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 },
        park: false,
      },
    ],
  });
  const anthropic = (s: Stack, opts: ConstructorParameters<typeof Anthropic>[0] = {}) => {
    const counter = { requests: 0 };
    const client = new Anthropic({
      baseURL: s.url,
      apiKey: 'sk-ant-client',
      logLevel: 'off',
      fetch: async (url: string | URL | Request, init?: RequestInit) => {
        counter.requests++;
        return fetch(url, init);
      },
      ...opts,
    });
    return { client, counter };
  };
  const params = { model: 'claude-sonnet-4-6', max_tokens: 256, messages: [{ role: 'user' as const, content: 'Say hello' }] };

  it("a 529 overloaded then success: finalMessage() is whole, the text events are its text, withResponse() names 2 attempts and the answering attempt's request-id", async () => {
    const s = await startStack({ faults: { errors: [{ status: 529, times: 1 }] }, config: anthropicConfig });
    const { client, counter } = anthropic(s);
    const stream = client.messages.stream(params);
    let streamed = '';
    stream.on('text', (t) => (streamed += t));
    const { response, request_id } = await stream.withResponse();
    const msg = await stream.finalMessage();
    expect(msg.role).toBe('assistant');
    expect(msg.stop_reason).toBe('end_turn');
    expect(msg.content[0]!.type).toBe('text');
    expect(streamed).toBe((msg.content[0] as Anthropic.TextBlock).text);
    expect(streamed.length).toBeGreaterThan(0);
    expect(msg.usage.output_tokens).toBeGreaterThan(0);
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    const log = upstream(s.mock, MESSAGES);
    expect(log.map((r) => r.status)).toEqual([529, 200]);
    expect(request_id).toBe(log[1]!.requestId);
    expect(counter.requests).toBe(1);
  });

  it('a lasting 529: finalMessage() rejects with OverloadedError (529, overloaded_error, x-should-retry false) once, though the SDK retries 529s by default; 3 upstream', async () => {
    const s = await startStack({ faults: { errors: [{ status: 529 }] }, config: anthropicConfig });
    const { client, counter } = anthropic(s, { maxRetries: 2 });
    const stream = client.messages.stream(params);
    const err = await rejection(stream.finalMessage());
    expect(err).toBeInstanceOf(Anthropic.APIError);
    const e = err as InstanceType<typeof Anthropic.APIError>;
    expect(e.status).toBe(529);
    expect((e.error as { error?: { type?: string } }).error?.type).toBe('overloaded_error');
    expect(e.headers?.get('x-should-retry')).toBe('false');
    expect(counter.requests).toBe(1);
    expect(upstream(s.mock, MESSAGES).map((r) => r.status)).toEqual([529, 529, 529]);
  });

  it('stream.abort() after the first text: finalMessage() rejects APIUserAbortError, the mock counts one aborted request, nothing after it', async () => {
    const s = await startStack({ faults: { stream: { chunkDelayMs: 150 } }, config: anthropicConfig });
    const { client, counter } = anthropic(s, { maxRetries: 2 });
    const stream = client.messages.stream(params);
    let streamed = '';
    stream.on('text', (t) => {
      streamed += t;
      stream.abort();
    });
    const err = await rejection(stream.finalMessage());
    expect(err).toBeInstanceOf(Anthropic.APIUserAbortError);
    expect(streamed.length).toBeGreaterThan(0);
    await sleep(1_000);
    const st = await stats(s.mock);
    expect(st.total).toBe(1);
    expect(st.aborted).toBe(1);
    expect(st.inflight).toBe(0);
    expect(counter.requests).toBe(1);
  });

  it("the SDK's client-wide timeout of 2 s (sent as x-stainless-timeout) shorter than the model's silence: the stream starts at the deadline and finalMessage() is whole; one upstream request", async () => {
    const s = await startStack({
      faults: { stream: { firstTokenDelayMs: 2_600 } },
      config: (url) => {
        const c = anthropicConfig(url);
        return { ...c, providers: { claude: { ...c.providers['claude']!, timeouts: { firstTokenMs: 8_000 } } } };
      },
    });
    const { client, counter } = anthropic(s, { timeout: 2_000, maxRetries: 2 });
    const t0 = Date.now();
    const stream = client.messages.stream(params);
    let streamed = '';
    stream.on('text', (t) => (streamed += t));
    const { response } = await stream.withResponse();
    const headersAt = Date.now() - t0;
    expect(headersAt).toBeLessThan(2_000);
    expect(response.status).toBe(200);
    const msg = await stream.finalMessage();
    expect(Date.now() - t0).toBeGreaterThanOrEqual(2_500);
    expect(msg.stop_reason).toBe('end_turn');
    expect(streamed).toBe((msg.content[0] as Anthropic.TextBlock).text);
    expect(streamed.length).toBeGreaterThan(0);
    const log = upstream(s.mock, MESSAGES);
    expect(log).toHaveLength(1);
    expect(log[0]!.headers['x-stainless-timeout']).toBeUndefined();
    expect(counter.requests).toBe(1);
  });

  it('cut after the first text: finalMessage() rejects, the text events were a prefix of the answer, nothing is sent again', async () => {
    const s = await startStack({ faults: { stream: { cutAfterChunks: 2 } }, config: anthropicConfig });
    const { client, counter } = anthropic(s, { maxRetries: 2 });
    const stream = client.messages.stream(params);
    let streamed = '';
    stream.on('text', (t) => (streamed += t));
    const err = await rejection(stream.finalMessage());
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(String((err as Error).message)).toMatch(/stream_interrupted|interrupted|cut/i);
    const whole = await new Anthropic({ baseURL: s.mock.url, apiKey: TEST_KEY, maxRetries: 0, logLevel: 'off' }).messages.create(params);
    const full = (whole.content[0] as Anthropic.TextBlock).text;
    expect(streamed.length).toBeGreaterThan(0);
    expect(streamed.length).toBeLessThan(full.length);
    expect(full.startsWith(streamed)).toBe(true);
    await sleep(300);
    expect(upstream(s.mock, MESSAGES).filter((r) => r.stream)).toHaveLength(1);
    expect(counter.requests).toBe(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('models.list()', () => {
  it("one provider's listing hangs: the SDK gets the other provider's models after the 2 s fetch timeout, not at its own timeout; a chat call to the hung one's glob still gets a fast answer once it recovers", async () => {
    const other = await startMock({ apiKey: 'other-key' });
    const s = await startStack({
      config: (mockUrl) => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: {
          main: { family: 'openai', baseUrl: `${mockUrl}/v1`, apiKey: TEST_KEY, breaker: false },
          other: { family: 'openai', baseUrl: `${other.url}/v1`, apiKey: 'other-key', breaker: false },
        },
        routes: [
          { name: 'chat', match: { path: CHAT, models: ['gpt-*'] }, targets: [{ provider: 'main' }], park: false },
          { name: 'embeddings', match: { path: EMBEDDINGS, models: ['text-embedding-*'] }, targets: [{ provider: 'other' }], park: false },
        ],
      }),
    });
    await mockControl(s.mock, 'POST', 'brownout', { mode: 'hang', durationMs: 60_000 });
    const { client } = sdk(s, { timeout: 10_000, maxRetries: 0 });
    const t0 = Date.now();
    const ids: string[] = [];
    for await (const m of client.models.list()) ids.push(m.id);
    const took = Date.now() - t0;
    expect(ids).toEqual(['text-embedding-3-small']);
    expect(took).toBeGreaterThanOrEqual(1_500);
    expect(took).toBeLessThan(6_000);
    // The failed fetch is kept 30 s: the next listing is answered at once, without asking the hung provider again.
    const listings = () => upstream(s.mock, '/v1/models').length;
    const asked = listings();
    expect(asked).toBeGreaterThanOrEqual(1);
    const t1 = Date.now();
    const again: string[] = [];
    for await (const m of client.models.list()) again.push(m.id);
    expect(again).toEqual(['text-embedding-3-small']);
    expect(Date.now() - t1).toBeLessThan(1_000);
    // A model the hung provider would serve cannot be retrieved: the outage, not "no such model".
    const err = await rejection(client.models.retrieve('gpt-4o'));
    expect(err).toBeInstanceOf(OpenAI.APIError);
    const e = err as InstanceType<typeof OpenAI.APIError>;
    expect([e.status, e.code]).toEqual([502, 'upstream_unavailable']);
    expect(e.headers?.get('x-should-retry')).toBe('false');
    expect(listings()).toBe(asked);
    await mockControl(s.mock, 'POST', 'brownout', { mode: 'hang', durationMs: 0 });
    const c = await client.chat.completions.create({ model: 'gpt-4o', messages });
    expect(c.choices[0]!.message.content!.length).toBeGreaterThan(0);
  }, 20_000);
});
