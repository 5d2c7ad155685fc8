// Third-party failure-scenario suite 42: an outside QA team's suite whose CLIENTS ARE THE `openai` 6.x SDK'S
// HIGHER-LEVEL HELPERS, called as application code calls them, against the gateway over real HTTP on 127.0.0.1 with
// faults injected: the bundled mock provider through its documented control endpoint (PUT /_mock/faults), or a
// scripted node:http provider (test/helpers/scripted-provider.ts) where the mock cannot play the fault (a tool loop
// of three turns, one of which hangs). Written from the README ("What the client sees", "Streaming", "Retries",
// "Deadlines and timeouts", "Idempotency keys", "Errors"). The suites before it drove these helpers on healthy paths
// (test/sdk-surfaces.test.ts) or drove `create()` under faults; this one drives the helpers themselves under faults:
//  1. `chat.completions.stream()` (ChatCompletionStream): `content` events, finalContent(), finalChatCompletion(),
//     totalUsage() through a first-attempt 503 and a 429's retry-after; a cut and an upstream error event after the
//     first output (the helper rejects, never resolves a truncated completion); abort() mid-stream and while the
//     gateway is in backoff (the upstream sees the abort, no later attempt); toReadableStream() ->
//     ChatCompletionStream.fromReadableStream() round trips, healthy and cut; a per-request `timeout` shorter than
//     the model's thinking (the stream starts at the deadline and the helper gets the whole answer).
//  2. `chat.completions.parse()` with `zodResponseFormat` through 500 then 502, through a whole outage, and a
//     structured stream cut mid-JSON (an APIError, never a SyntaxError or a half-parsed object).
//  3. `chat.completions.runTools()`: turns that meet a 429 with retry-after and a 503 (mock), a three-turn loop whose
//     second turn hangs (scripted provider, `responseMs`), streamed loops through first-attempt 503s, cut on the
//     answering turn, or broken inside a tool call's arguments (cut, malformed event: the tool never runs), a 429
//     whose hint passes maxWaitHintMs (the SDK invited back, after the hold-off), and an AbortController fired while a
//     turn is in the gateway's backoff. The SDK's own HTTP requests are counted through its `fetch`: every turn
//     succeeds through the gateway's retries, the SDK retries only where the gateway invites it.
//  4. `responses.stream()` and finalResponse() through a first-attempt 503, a mid-stream error event, and abort().
//  5. Request options: `idempotencyKey` (sends nothing), an `Idempotency-Key` header under stream() (a replay the
//     helper assembles; a keyed stream the application aborts, read to its end detached), the same header on a
//     runTools() loop, `withOptions({ maxRetries: 0 })` against the default on a hold-off, `defaultHeaders` with
//     x-stormgate-priority / x-stormgate-timeout-ms, and the APIError subclass, code, x-should-retry and requestID
//     each helper raises for the gateway's own errors and for upstream errors passed on.
// Found here: no gateway bug (30 scenarios, run three times in a row). What the helpers cannot do is listed next.
// SDK limitations, documented rather than worked around in the gateway (none is skipped: each is asserted or noted):
//  - ChatCompletionStream, the runTools() runners and ResponseStream give no access to the HTTP Response (no
//    withResponse()/asResponse()), so x-stormgate-attempts and x-request-id of a helper call are read here through
//    the client's `fetch`; `parse()` is an APIPromise and has withResponse().
//  - `responses.stream().finalResponse()` resolves without the `output_text` convenience that `responses.create()`
//    adds (its ResponseStream finalizes the snapshot through maybeParseResponse, which copies no output_text unless
//    the request has an auto-parseable text format): an application that reads `final.output_text` gets undefined.
//    The text is read from the message item here.
//  - The `idempotencyKey` request option sends no header with the `openai` client (it names no idempotency header,
//    as the README says): the helpers get the gateway's run-once only through `headers: { 'Idempotency-Key' }`.
//  - `runTools(body, { headers })` sends the same headers on every turn of the loop, so an `Idempotency-Key` passed
//    there names the whole loop, and the gateway (as the README documents: the same key with another body) answers
//    turn 2 `422 idempotency_key_reused`. The helper has no per-turn options; a key belongs on each `create()` of a
//    hand-written loop, or `idempotency: { bodyAsKeyMs }` on the route. Tested below as the pitfall it is.
//  - A per-request `timeout` reaches the gateway in whole seconds; the client-wide one not at all (README).
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { ChatCompletionStream } from 'openai/lib/ChatCompletionStream';
import { z } from 'zod';
import { describe, expect, it } from 'vitest';
import type { FaultSpec } from '../src/mock/faults.ts';
import { freePort } from './helpers/free-port.ts';
import { mockControl } from './helpers/mock-control.ts';
import { expectOpenAIError, sdkError, type APIError } from './helpers/openai-error.ts';
import { completion, json, useScriptedGateway, type Script } from './helpers/scripted-provider.ts';
import { defaultConfig, requestLine, RETRY_LOOP_ONLY, useStacks, type ClientOptions, type Stack } from './helpers/stack.ts';
import { weatherTool } from './helpers/weather-tool.ts';

const startStack = useStacks(RETRY_LOOP_ONLY);
const startScripted = useScriptedGateway();

const messages = [{ role: 'user' as const, content: 'What is the weather in Paris?' }];
const ask = { model: 'gpt-4o', messages };
const Weather = z.object({ city: z.string(), temp: z.number(), tags: z.array(z.string()), unit: z.enum(['c', 'f']) });
const parsedWeather = { city: 'mock', temp: 1, tags: ['mock'], unit: 'c' };

/** What the SDK's fetch saw: its HTTP requests (its own retries included) and the last response's headers. */
interface Wire {
  requests: number;
  statuses: number[];
  headers: Headers[];
}

/** An `openai` client of the gateway whose every HTTP request and response is recorded (helpers hide the Response). */
function client(s: Pick<Stack, 'baseURL'>, opts: ClientOptions = {}): { c: OpenAI; wire: Wire } {
  const wire: Wire = { requests: 0, statuses: [], headers: [] };
  const c = new OpenAI({
    baseURL: s.baseURL,
    apiKey: 'sk-qa42-client',
    fetch: async (url, init) => {
      wire.requests++;
      const res = await fetch(url, init);
      wire.statuses.push(res.status);
      wire.headers.push(res.headers);
      return res;
    },
    ...opts,
  });
  return { c, wire };
}

/** Sets the mock's fault spec through its documented control endpoint. */
const faults = (s: Stack, spec: FaultSpec) => mockControl(s.mock, 'PUT', 'faults', spec);

/** Polls until `cond` holds (up to `ms`), failing the test otherwise. */
async function until(cond: () => boolean, ms = 5_000, what = 'condition'): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

/** The rejection of a promise (fails the test if it resolves). */
async function rejection(p: Promise<unknown>): Promise<unknown> {
  return p.then(
    (v) => {
      throw new Error(`resolved where a rejection was expected: ${JSON.stringify(v)?.slice(0, 200)}`);
    },
    (e: unknown) => e,
  );
}

describe('chat.completions.stream() (ChatCompletionStream) under faults', () => {
  it("a first-attempt 503: content events, finalContent(), finalChatCompletion() and totalUsage() agree; one SDK request, the helper's headers upstream", async () => {
    const s = await startStack();
    await faults(s, { errors: [{ status: 503, firstAttemptsOnly: true }] });
    const { c, wire } = client(s);
    const stream = c.chat.completions.stream({ ...ask, stream_options: { include_usage: true } });
    let deltas = '';
    let snapshots = 0;
    stream.on('content', (delta, snapshot) => {
      deltas += delta;
      expect(snapshot).toBe(deltas);
      snapshots++;
    });
    const final = await stream.finalChatCompletion();
    expect(await stream.finalContent()).toBe(deltas);
    expect(final.choices[0]!.message.content).toBe(deltas);
    expect(deltas).toMatch(/^Mock answer to: What is the weather/);
    expect(snapshots).toBeGreaterThan(1);
    expect(final.choices[0]!.finish_reason).toBe('stop');
    const usage = await stream.totalUsage();
    expect(usage.total_tokens).toBe(final.usage!.total_tokens);
    expect(usage.completion_tokens).toBeGreaterThan(0);
    expect(wire.requests).toBe(1);
    expect(wire.headers[0]!.get('x-stormgate-attempts')).toBe('2');
    const upstream = s.mock.requests();
    expect(upstream.map((r) => r.status)).toEqual([503, 200]);
    expect(upstream[1]!.headers['x-retry-attempt']).toBe('1');
    expect(upstream[1]!.headers['x-retry-reason']).toBe('status_503');
    // x-stainless-* goes upstream (README, Headers): the helper's own marker on both attempts
    expect(upstream.map((r) => r.headers['x-stainless-helper-method'])).toEqual(['stream', 'stream']);
    expect(wire.headers[0]!.get('x-request-id')).toBe(upstream[1]!.requestId);
  });

  it("a 429 with retry-after: 1 on the first attempt: the gateway waits it out, the helper resolves; the SDK sent once", async () => {
    const s = await startStack();
    await faults(s, { errors: [{ status: 429, headers: { 'retry-after': '1' }, times: 1 }] });
    const { c, wire } = client(s);
    const started = Date.now();
    const text = await c.chat.completions.stream(ask).finalContent();
    expect(text).toMatch(/^Mock answer to/);
    expect(Date.now() - started).toBeGreaterThanOrEqual(950);
    expect(wire.requests).toBe(1);
    expect(wire.headers[0]!.get('x-stormgate-attempts')).toBe('2');
    expect(s.mock.requests().map((r) => r.status)).toEqual([429, 200]);
  });

  it('a cut after the first output: finalChatCompletion() and finalContent() reject with stream_interrupted; the content events were a prefix; no second upstream request', async () => {
    const s = await startStack();
    await faults(s, { stream: { chunks: 6, cutAfterChunks: 2 } });
    const { c, wire } = client(s);
    const stream = c.chat.completions.stream(ask);
    let deltas = '';
    const errors: unknown[] = [];
    stream.on('content', (d) => (deltas += d));
    stream.on('error', (e) => errors.push(e));
    const err = (await rejection(stream.finalChatCompletion())) as APIError;
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.code).toBe('stream_interrupted');
    const content = (await rejection(stream.finalContent())) as APIError;
    expect(content).toBe(err);
    expect(errors).toEqual([err]);
    expect(deltas.length).toBeGreaterThan(0);
    const whole = (await c.chat.completions.create(ask)).choices[0]!.message.content!;
    expect(whole.startsWith(deltas)).toBe(true);
    expect(deltas.length).toBeLessThan(whole.length);
    expect(wire.requests).toBe(2);
    expect(s.mock.requests()).toHaveLength(2);
  });

  it("an upstream error event mid-stream (the mock's errorAfterChunks): the helper rejects with the APIError, never a clean end", async () => {
    const s = await startStack();
    await faults(s, { stream: { chunks: 6, errorAfterChunks: 3 } });
    const { c, wire } = client(s);
    const stream = c.chat.completions.stream(ask);
    let chunks = 0;
    stream.on('chunk', () => chunks++);
    const err = (await rejection(stream.finalContent())) as APIError;
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.type).toBe('server_error');
    expect(chunks).toBeGreaterThanOrEqual(3);
    expect(wire.requests).toBe(1);
    expect(s.mock.requests()).toHaveLength(1);
  });

  it('abort() mid-stream: APIUserAbortError, the abort event fires, and the upstream request is aborted (no ghost, no retry)', async () => {
    const s = await startStack();
    await faults(s, { stream: { chunks: 20, chunkDelayMs: 150 } });
    const { c } = client(s);
    const stream = c.chat.completions.stream(ask);
    let aborts = 0;
    stream.on('abort', () => aborts++);
    stream.on('content', () => {
      if (stream.currentChatCompletionSnapshot?.choices[0]?.message.content?.length) stream.abort();
    });
    const err = await rejection(stream.finalChatCompletion());
    expect(err).toBeInstanceOf(OpenAI.APIUserAbortError);
    expect(aborts).toBe(1);
    await until(() => s.mock.requests()[0]?.aborted === true, 5_000, 'the upstream to see the abort');
    expect(s.mock.requests()[0]!.chunksSent ?? 0).toBeLessThan(20);
    expect((await requestLine(s)).outcome).toBe('client_gone');
    expect(s.mock.requests()).toHaveLength(1);
  });

  it("abort() while the gateway is in its backoff: APIUserAbortError at once, and no later upstream attempt", async () => {
    const s = await startStack({ route: { retry: { backoff: { strategy: 'fixed', baseMs: 2_000, capMs: 2_000 } } } });
    await faults(s, { errors: [{ status: 503 }] });
    const { c, wire } = client(s);
    const stream = c.chat.completions.stream(ask);
    await until(() => s.mock.requests().length === 1 && s.mock.requests()[0]!.status === 503, 5_000, 'the first 503');
    await sleep(200);
    const aborted = Date.now();
    stream.abort();
    expect(await rejection(stream.finalChatCompletion())).toBeInstanceOf(OpenAI.APIUserAbortError);
    expect(Date.now() - aborted).toBeLessThan(1_000);
    expect((await requestLine(s)).outcome).toBe('client_gone');
    // past the end of the 2 s backoff the abort cancelled: the retry was never sent
    await sleep(2_500);
    expect(s.mock.requests()).toHaveLength(1);
    expect(wire.requests).toBe(1);
  });

  it('toReadableStream() -> ChatCompletionStream.fromReadableStream(): the same completion after a retry; a cut reaches the far side as an error', async () => {
    const s = await startStack();
    await faults(s, { errors: [{ status: 503, firstAttemptsOnly: true }] });
    const { c } = client(s);
    const near = c.chat.completions.stream(ask);
    const far = await ChatCompletionStream.fromReadableStream(near.toReadableStream()).finalChatCompletion();
    expect(far.choices[0]!.message.content).toMatch(/^Mock answer to: What is the weather/);
    expect(far.choices[0]!.finish_reason).toBe('stop');
    expect(s.mock.requests().map((r) => r.status)).toEqual([503, 200]);

    await faults(s, { stream: { chunks: 6, cutAfterChunks: 2 } });
    const cutNear = c.chat.completions.stream(ask);
    const cutFar = ChatCompletionStream.fromReadableStream(cutNear.toReadableStream());
    let farText = '';
    cutFar.on('content', (d) => (farText += d));
    // in one process the near side's APIError itself comes out of the far side's reader
    const err = (await rejection(cutFar.finalChatCompletion())) as APIError;
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.code).toBe('stream_interrupted');
    expect(await rejection(cutNear.finalChatCompletion())).toBe(err);
    expect(far.choices[0]!.message.content!.startsWith(farText)).toBe(true);
    expect(farText.length).toBeLessThan(far.choices[0]!.message.content!.length);
  });

  it("a per-request timeout shorter than the model's thinking, with x-stormgate-timeout-ms: the stream starts at the deadline and finalContent() gets the whole answer", async () => {
    const s = await startStack();
    await faults(s, { stream: { firstTokenDelayMs: 5_000 } });
    const { c, wire } = client(s);
    const started = Date.now();
    const stream = c.chat.completions.stream(ask, { timeout: 4_000, headers: { 'x-stormgate-timeout-ms': '1500' } });
    let connectedAt = 0;
    stream.on('connect', () => (connectedAt = Date.now() - started));
    const text = await stream.finalContent();
    expect(text).toMatch(/^Mock answer to: What is the weather/);
    // the headers came at the gateway's deadline (1500 ms less its margin), before the SDK's own 4 s
    expect(connectedAt).toBeGreaterThan(0);
    expect(connectedAt).toBeLessThan(4_000);
    expect(Date.now() - started).toBeGreaterThanOrEqual(4_500);
    expect(wire.requests).toBe(1);
    expect(s.mock.requests()).toHaveLength(1);
    expect(s.mock.requests()[0]!.headers['x-stainless-timeout']).toBeUndefined();
    expect((await requestLine(s)).startedEarly).toBe(true);
  });

  it('a stream started at the deadline whose model then never speaks: the stall ends it with stream_interrupted, the helper rejects, the upstream is aborted', async () => {
    const s = await startStack({ provider: { breaker: false, timeouts: { firstTokenMs: 2_500 } } });
    await faults(s, { stream: { firstTokenDelayMs: 30_000 } });
    const { c, wire } = client(s);
    const stream = c.chat.completions.stream(ask, { timeout: 10_000, headers: { 'x-stormgate-timeout-ms': '1000' } });
    let connected = false;
    stream.on('connect', () => (connected = true));
    const err = (await rejection(stream.finalContent())) as APIError;
    expect(connected).toBe(true);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.code).toBe('stream_interrupted');
    expect(err.message).toMatch(/first token/);
    expect(wire.requests).toBe(1);
    await until(() => s.mock.requests()[0]?.aborted === true, 5_000, 'the stalled upstream request to be ended');
    expect(s.mock.requests()).toHaveLength(1);
    const line = await requestLine(s);
    expect(line.startedEarly).toBe(true);
    expect(line.streamEnd).toBe('stalled');
  });
});

describe('chat.completions.parse() and structured outputs under faults', () => {
  it('parse() with zodResponseFormat through a 500 then a 502: parsed, x-stormgate-attempts 3 on withResponse(), one SDK request', async () => {
    const s = await startStack();
    await faults(s, { errors: [{ status: 500, times: 1 }, { status: 502, times: 1 }] });
    const { c, wire } = client(s);
    const { data, response, request_id } = await c.chat.completions.parse({ ...ask, response_format: zodResponseFormat(Weather, 'weather') }).withResponse();
    expect(data.choices[0]!.message.parsed).toEqual(parsedWeather);
    expect(response.headers.get('x-stormgate-attempts')).toBe('3');
    expect(request_id).toBe(s.mock.requests()[2]!.requestId);
    expect(s.mock.requests().map((r) => [r.status, r.headers['x-retry-reason']])).toEqual([
      [500, undefined],
      [502, 'status_500'],
      [200, 'status_502'],
    ]);
    expect(wire.requests).toBe(1);
  });

  it('parse() against a whole outage: InternalServerError 503 with x-should-retry false; the default maxRetries adds no request', async () => {
    const s = await startStack();
    await faults(s, { errors: [{ status: 503 }] });
    const { c, wire } = client(s);
    const err = await sdkError(c.chat.completions.parse({ ...ask, response_format: zodResponseFormat(Weather, 'weather') }));
    expect(err).toBeInstanceOf(OpenAI.InternalServerError);
    expect(err.status).toBe(503);
    expect(err.headers!.get('x-should-retry')).toBe('false');
    expect(err.headers!.get('x-stormgate-attempts')).toBe('3');
    expect(wire.requests).toBe(1);
    expect(s.mock.requests()).toHaveLength(3);
  });

  it('a structured stream cut mid-JSON: stream() rejects with the APIError, never a SyntaxError nor a half-parsed object', async () => {
    const s = await startStack();
    await faults(s, { stream: { chunks: 8, cutAfterChunks: 3 } });
    const { c } = client(s);
    const stream = c.chat.completions.stream({ ...ask, response_format: zodResponseFormat(Weather, 'weather') });
    let partial = '';
    stream.on('content.delta', ({ snapshot }) => (partial = snapshot));
    const err = (await rejection(stream.finalChatCompletion())) as APIError;
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.code).toBe('stream_interrupted');
    expect(partial.length).toBeGreaterThan(0);
    expect(() => JSON.parse(partial) as unknown).toThrow();
    expect(s.mock.requests()).toHaveLength(1);
  });
});

describe('chat.completions.runTools() under faults', () => {
  it('turn 1 meets a 429 with retry-after, turn 2 a 503: both answered through the gateway, the SDK sends each turn once, the loop ends right', async () => {
    const s = await startStack();
    await faults(s, {
      errors: [
        { status: 429, headers: { 'retry-after': '1' }, times: 1, firstAttemptsOnly: true },
        { status: 503, times: 1, firstAttemptsOnly: true },
      ],
    });
    const { c, wire } = client(s);
    const calls: unknown[] = [];
    const runner = c.chat.completions.runTools({ ...ask, tools: [weatherTool(calls)] });
    const text = await runner.finalContent();
    expect(text).toMatch(/^Mock answer to/);
    expect(calls).toEqual([{ x: 1 }]);
    expect(runner.messages.map((m) => m.role)).toEqual(['user', 'assistant', 'tool', 'assistant']);
    expect((runner.messages[2] as OpenAI.ChatCompletionToolMessageParam).content).toBe('sunny, 1 degree');
    const usage = await runner.totalUsage();
    const completions = runner.allChatCompletions();
    expect(completions).toHaveLength(2);
    expect(usage.total_tokens).toBe(completions.reduce((n, x) => n + x.usage!.total_tokens, 0));
    expect(wire.requests).toBe(2);
    expect(wire.headers.map((h) => h.get('x-stormgate-attempts'))).toEqual(['2', '2']);
    expect(s.mock.requests().map((r) => [r.status, r.headers['x-retry-reason']])).toEqual([
      [429, undefined],
      [200, 'status_429'],
      [503, undefined],
      [200, 'status_503'],
    ]);
  });

  it('a three-turn loop on a scripted provider whose second turn hangs once: responseMs ends it, the retry answers, every tool ran once', async () => {
    const toolTurn = (n: number, name: string): Script =>
      json(200, {
        id: `chatcmpl-turn${n}`,
        object: 'chat.completion',
        created: 1741290958,
        model: 'gpt-4o',
        choices: [
          {
            index: 0,
            message: { role: 'assistant', content: null, tool_calls: [{ id: `call_${n}`, type: 'function', function: { name, arguments: '{"city":"Paris"}' } }] },
            logprobs: null,
            finish_reason: 'tool_calls',
          },
        ],
        usage: { prompt_tokens: 10 * n, completion_tokens: 5, total_tokens: 10 * n + 5 },
      });
    let hung = 0;
    const g = await startScripted(
      (body) => {
        const turn = (body.messages as Array<{ role: string }>).filter((m) => m.role === 'tool').length;
        if (turn === 0) return toolTurn(1, 'get_weather');
        if (turn === 1 && hung++ === 0) return { status: 200, headers: { 'content-type': 'application/json' }, steps: [], hold: true };
        if (turn === 1) return toolTurn(2, 'get_time');
        const last = completion('Paris: sunny at noon.', 'gpt-4o');
        return { ...last, steps: [JSON.stringify({ ...(JSON.parse(String(last.steps[0])) as object), usage: { prompt_tokens: 40, completion_tokens: 6, total_tokens: 46 } })] };
      },
      { responseMs: 600 },
    );
    const { c, wire } = client(g.s);
    const ran: string[] = [];
    const tool = (name: string, result: string) => ({
      type: 'function' as const,
      function: {
        name,
        description: `${name} of a city`,
        parameters: { type: 'object', properties: { city: { type: 'string' } } },
        function: (a: { city: string }) => (ran.push(`${name}(${a.city})`), result),
        parse: (text: string) => JSON.parse(text) as { city: string },
      },
    });
    const runner = c.chat.completions.runTools({ ...ask, tools: [tool('get_weather', 'sunny'), tool('get_time', 'noon')] });
    expect(await runner.finalContent()).toBe('Paris: sunny at noon.');
    expect(ran).toEqual(['get_weather(Paris)', 'get_time(Paris)']);
    expect(runner.messages.map((m) => m.role)).toEqual(['user', 'assistant', 'tool', 'assistant', 'tool', 'assistant']);
    expect((await runner.totalUsage()).total_tokens).toBe(15 + 25 + 46);
    expect(wire.requests).toBe(3);
    expect(wire.headers.map((h) => h.get('x-stormgate-attempts'))).toEqual(['1', '2', '1']);
    expect(g.seen).toHaveLength(4);
    expect(g.seen[2]!.headers['x-retry-attempt']).toBe('1');
    expect(String(g.seen[2]!.headers['x-retry-reason'])).toMatch(/^timeout/);
    // the retry sent the same turn: two tool messages only in the last request
    expect(g.seen.map((x) => (x.body.messages as unknown[]).length)).toEqual([1, 3, 3, 5]);
  });

  it('a streamed loop whose answering turn is cut after its first output: the runner rejects with stream_interrupted, the tool ran once, no third turn', async () => {
    const s = await startStack();
    const { c, wire } = client(s);
    const calls: unknown[] = [];
    // the cut applies to text answers only once the tool turn is done: set it between the turns
    const runner = c.chat.completions.runTools({ ...ask, stream: true, tools: [weatherTool(calls)] });
    runner.on('functionToolCallResult', () => void faults(s, { stream: { chunks: 6, cutAfterChunks: 2 } }));
    let text = '';
    runner.on('content', (d) => (text += d));
    const err = (await rejection(runner.finalContent())) as APIError;
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.code).toBe('stream_interrupted');
    expect(calls).toEqual([{ x: 1 }]);
    expect(text.length).toBeGreaterThan(0);
    expect(wire.requests).toBe(2);
    expect(s.mock.requests()).toHaveLength(2);
  });

  it('a streamed loop through first-attempt 503s on both turns: the tool call assembled from the retried stream, totalUsage() over both turns', async () => {
    const s = await startStack();
    await faults(s, { errors: [{ status: 503, firstAttemptsOnly: true }] });
    const { c, wire } = client(s);
    const calls: unknown[] = [];
    const runner = c.chat.completions.runTools({ ...ask, stream: true, stream_options: { include_usage: true }, tools: [weatherTool(calls)] });
    expect(await runner.finalContent()).toMatch(/^Mock answer to/);
    expect(calls).toEqual([{ x: 1 }]);
    const completions = runner.allChatCompletions();
    expect(completions.map((x) => x.choices[0]!.finish_reason)).toEqual(['tool_calls', 'stop']);
    expect((await runner.totalUsage()).total_tokens).toBe(completions.reduce((n, x) => n + x.usage!.total_tokens, 0));
    expect((await runner.totalUsage()).total_tokens).toBeGreaterThan(0);
    expect(wire.requests).toBe(2);
    expect(s.mock.requests().map((r) => r.status)).toEqual([503, 200, 503, 200]);
  });

  for (const [fault, spec] of [
    ['cut', { chunks: 6, cutAfterChunks: 1 }],
    ['malformed event', { chunks: 6, malformedAtChunk: 1 }],
  ] as const) {
    it(`a streamed tool turn broken inside the call's arguments (${fault}): the runner rejects and the tool never runs with half its arguments`, async () => {
      const s = await startStack();
      await faults(s, { stream: spec });
      const { c, wire } = client(s);
      const calls: unknown[] = [];
      const runner = c.chat.completions.runTools({ ...ask, stream: true, tools: [weatherTool(calls)] });
      const err = (await rejection(runner.finalContent())) as APIError;
      expect(err).toBeInstanceOf(OpenAI.APIError);
      expect(err.code).toBe('stream_interrupted');
      expect(calls).toEqual([]);
      expect(wire.requests).toBe(1);
      expect(s.mock.requests()).toHaveLength(1);
    });
  }

  it("turn 2 meets a 429 whose retry-after passes maxWaitHintMs: the gateway invites the SDK back (x-should-retry true), its own retry lands after the hold-off and the loop ends", async () => {
    const s = await startStack({ route: { retry: { maxWaitHintMs: 500 } } });
    const { c, wire } = client(s);
    const calls: unknown[] = [];
    const runner = c.chat.completions.runTools({ ...ask, tools: [weatherTool(calls)] });
    runner.on('functionToolCallResult', () => void faults(s, { errors: [{ status: 429, headers: { 'retry-after': '1' }, times: 1 }] }));
    expect(await runner.finalContent()).toMatch(/^Mock answer to/);
    expect(calls).toEqual([{ x: 1 }]);
    expect(wire.statuses).toEqual([200, 429, 200]);
    const invite = wire.headers[1]!;
    expect(invite.get('x-should-retry')).toBe('true');
    expect(Number(invite.get('retry-after-ms'))).toBeGreaterThanOrEqual(1_000);
    expect(s.mock.requests().map((r) => r.status)).toEqual([200, 429, 200]);
    // the SDK's retry says it is one (x-stainless-retry-count), and came after the hold-off the 429 started
    expect(s.mock.requests()[2]!.headers['x-stainless-retry-count']).toBe('1');
    expect(s.mock.requests()[2]!.receivedAt - s.mock.requests()[1]!.receivedAt).toBeGreaterThanOrEqual(1_000);
  });

  it("an AbortController fired while turn 2 is in the gateway's backoff: the runner rejects APIUserAbortError and no later upstream attempt is made", async () => {
    const s = await startStack({ route: { retry: { backoff: { strategy: 'fixed', baseMs: 2_000, capMs: 2_000 } } } });
    const { c, wire } = client(s);
    const calls: unknown[] = [];
    const ctl = new AbortController();
    const runner = c.chat.completions.runTools({ ...ask, tools: [weatherTool(calls)] }, { signal: ctl.signal });
    runner.on('functionToolCallResult', () => void faults(s, { errors: [{ status: 503 }] }));
    await until(() => s.mock.requests().length === 2 && s.mock.requests()[1]!.status === 503, 5_000, "turn 2's first 503");
    await sleep(200);
    ctl.abort();
    expect(await rejection(runner.finalContent())).toBeInstanceOf(OpenAI.APIUserAbortError);
    expect(calls).toEqual([{ x: 1 }]);
    await sleep(2_500);
    expect(s.mock.requests()).toHaveLength(2);
    expect(wire.requests).toBe(2);
  });
});

describe('responses.stream() under faults', () => {
  it('a first-attempt 503: finalResponse() completed, the deltas are its output_text; one SDK request', async () => {
    const s = await startStack();
    await faults(s, { errors: [{ status: 503, firstAttemptsOnly: true }] });
    const { c, wire } = client(s);
    const stream = c.responses.stream({ model: 'gpt-4o', input: 'hello' });
    let deltas = '';
    let created = 0;
    stream.on('response.output_text.delta', (e) => (deltas += e.delta));
    stream.on('response.created', () => created++);
    const final = await stream.finalResponse();
    expect(final.status).toBe('completed');
    // finalResponse() has no output_text (an SDK limitation, see the header): the text is read from the message item
    const item = final.output[0] as OpenAI.Responses.ResponseOutputMessage;
    const text = item.content.map((p) => (p.type === 'output_text' ? p.text : '')).join('');
    expect(text).toBe('Mock answer to: hello');
    expect(deltas).toBe(text);
    expect(created).toBe(1);
    expect(wire.requests).toBe(1);
    expect(wire.headers[0]!.get('x-stormgate-attempts')).toBe('2');
    expect(s.mock.requests().map((r) => r.status)).toEqual([503, 200]);
  });

  it("an error event after the first output: finalResponse() rejects, the deltas so far are a prefix, nothing is sent again", async () => {
    const s = await startStack();
    await faults(s, { stream: { chunks: 6, errorAfterChunks: 2 } });
    const { c, wire } = client(s);
    const stream = c.responses.stream({ model: 'gpt-4o', input: 'hello' });
    let deltas = '';
    stream.on('response.output_text.delta', (e) => (deltas += e.delta));
    // the mock's own `event: error` (code server_error), which the SDK raises as an APIError
    const err = (await rejection(stream.finalResponse())) as APIError;
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.code).toBe('server_error');
    expect(deltas.length).toBeGreaterThan(0);
    expect('Mock answer to: hello'.startsWith(deltas)).toBe(true);
    expect(deltas).not.toBe('Mock answer to: hello');
    expect(wire.requests).toBe(1);
    expect(s.mock.requests()).toHaveLength(1);
  });

  it('abort() mid-stream: the upstream request is aborted and no retry follows', async () => {
    const s = await startStack();
    await faults(s, { stream: { chunks: 20, chunkDelayMs: 150 } });
    const { c } = client(s);
    const stream = c.responses.stream({ model: 'gpt-4o', input: 'hello' });
    stream.on('response.output_text.delta', () => stream.abort());
    expect(await rejection(stream.finalResponse())).toBeInstanceOf(OpenAI.APIUserAbortError);
    await until(() => s.mock.requests()[0]?.aborted === true, 5_000, 'the upstream to see the abort');
    expect((await requestLine(s, 'responses')).outcome).toBe('client_gone');
    expect(s.mock.requests()).toHaveLength(1);
  });
});

describe('request options on the helpers', () => {
  it("the idempotencyKey option sends nothing; an Idempotency-Key header makes a stream() repeat a replay the helper assembles, with no upstream request", async () => {
    const s = await startStack();
    const { c } = client(s);
    await c.chat.completions.stream(ask, { idempotencyKey: 'qa42-option-key' }).finalContent();
    await c.chat.completions.stream(ask, { idempotencyKey: 'qa42-option-key' }).finalContent();
    expect(s.mock.requests()).toHaveLength(2);
    expect(s.mock.requests().map((r) => r.headers['idempotency-key'])).toEqual([undefined, undefined]);

    await faults(s, { errors: [{ status: 503, firstAttemptsOnly: true }] });
    const key = { headers: { 'Idempotency-Key': 'qa42-header-key-1' } };
    const first = await c.chat.completions.stream({ ...ask, stream_options: { include_usage: true } }, key).finalChatCompletion();
    expect(s.mock.requests()).toHaveLength(4);
    const { c: again, wire } = client(s);
    const replay = await again.chat.completions.stream({ ...ask, stream_options: { include_usage: true } }, key).finalChatCompletion();
    expect(replay).toEqual(first);
    expect(wire.headers[0]!.get('idempotent-replayed')).toBe('true');
    expect(s.mock.requests()).toHaveLength(4);
    expect(s.mock.requests()[3]!.headers['idempotency-key']).toBe('qa42-header-key-1');
  });

  it('a keyed stream() the application aborts mid-way: the run is read to its end detached, and the repeat gets the whole completion with no second upstream request', async () => {
    const s = await startStack();
    await faults(s, { stream: { chunks: 10, chunkDelayMs: 60 } });
    const { c } = client(s);
    const key = { headers: { 'Idempotency-Key': 'qa42-abort-then-repeat' } };
    const first = c.chat.completions.stream(ask, key);
    first.on('content', () => first.abort());
    expect(await rejection(first.finalContent())).toBeInstanceOf(OpenAI.APIUserAbortError);
    const { c: again, wire } = client(s);
    const text = await again.chat.completions.stream(ask, key).finalContent();
    expect(text).toMatch(/^Mock answer to: What is the weather in Paris\?$/);
    expect(wire.statuses).toEqual([200]);
    expect(s.mock.requests()).toHaveLength(1);
    expect(s.mock.requests()[0]!.aborted).toBe(false);
  });

  it("runTools() with an Idempotency-Key in its options sends it on every turn: turn 2's other body is 422 idempotency_key_reused (a pitfall of the helper, as documented)", async () => {
    const s = await startStack();
    const { c, wire } = client(s);
    const calls: unknown[] = [];
    const err = await sdkError(c.chat.completions.runTools({ ...ask, tools: [weatherTool(calls)] }, { headers: { 'Idempotency-Key': 'qa42-one-key-per-loop' } }).finalContent());
    expect(err).toBeInstanceOf(OpenAI.UnprocessableEntityError);
    expectOpenAIError({ error: err.error }, 'idempotency_key_reused');
    expect(err.headers!.get('x-should-retry')).toBe('false');
    expect(calls).toEqual([{ x: 1 }]);
    expect(wire.statuses).toEqual([200, 422]);
    expect(s.mock.requests()).toHaveLength(1);
  });

  it('withOptions({ maxRetries: 0 }) against the default on a hold-off: the default waits out retry-after and answers, the copy raises 429 provider_held_off', async () => {
    const s = await startStack({ route: { retry: { maxAttempts: 1 } } });
    await faults(s, { errors: [{ status: 429, headers: { 'retry-after': '2' }, times: 1 }] });
    const { c, wire } = client(s);
    // starts the hold-off: maxAttempts 1 retries nothing, so this one is x-should-retry false
    const first = await sdkError(c.chat.completions.stream(ask).finalContent());
    expect(first).toBeInstanceOf(OpenAI.RateLimitError);
    expect(first.headers!.get('x-should-retry')).toBe('false');
    expect(wire.requests).toBe(1);

    const noRetries = c.withOptions({ maxRetries: 0 });
    const held = await sdkError(noRetries.chat.completions.stream(ask).finalContent());
    expect(held).toBeInstanceOf(OpenAI.RateLimitError);
    expectOpenAIError({ error: held.error }, 'provider_held_off', 'rate_limit_error');
    expect(held.headers!.get('x-should-retry')).toBe('true');
    expect(Number(held.headers!.get('retry-after-ms'))).toBeGreaterThan(0);
    expect(held.requestID).toBe(held.headers!.get('x-stormgate-request-id'));
    expect(wire.requests).toBe(2);

    const started = Date.now();
    const text = await c.chat.completions.stream(ask).finalContent();
    expect(text).toMatch(/^Mock answer to/);
    expect(wire.requests).toBe(4);
    expect(Date.now() - started).toBeGreaterThanOrEqual(500);
    // the provider got the first 429 and the one call after the hold-off, nothing in between
    expect(s.mock.requests().map((r) => r.status)).toEqual([429, 200]);
  });

  it('defaultHeaders through withOptions: x-stormgate-priority batch in the log line; x-stormgate-timeout-ms makes a hang a 504 deadline_exceeded the SDK does not retry', async () => {
    const s = await startStack();
    const { c, wire } = client(s, { timeout: 20_000 });
    const batch = c.withOptions({ defaultHeaders: { 'x-stormgate-priority': 'batch', 'x-stormgate-timeout-ms': '1200' } });
    await batch.chat.completions.stream(ask).finalContent();
    expect((await requestLine(s)).priority).toBe('batch');
    expect(s.mock.requests()[0]!.headers['x-stormgate-priority']).toBeUndefined();

    await faults(s, { hangRate: 1 });
    const started = Date.now();
    const runner = batch.chat.completions.runTools({ ...ask, tools: [weatherTool([])] });
    const err = await sdkError(runner.finalContent());
    expect(Date.now() - started).toBeLessThan(5_000);
    expect(err).toBeInstanceOf(OpenAI.InternalServerError);
    expect(err.status).toBe(504);
    expectOpenAIError({ error: err.error }, 'deadline_exceeded', 'server_error');
    expect(err.headers!.get('x-should-retry')).toBe('false');
    expect(err.requestID).toBe(err.headers!.get('x-stormgate-request-id'));
    expect(wire.requests).toBe(2);
    await until(() => s.mock.requests()[1]?.aborted === true, 5_000, 'the hung upstream request to be aborted');
    expect(s.mock.requests()).toHaveLength(2);
  });

  it("errors through each helper: the gateway's own carry its request id, an upstream 400 keeps the provider's and is never retried", async () => {
    const s = await startStack();
    const { c, wire } = client(s);
    // the gateway's own 400: a malformed x-stormgate-timeout-ms, through stream(), parse() and responses.stream()
    const bad = { headers: { 'x-stormgate-timeout-ms': 'soon' } };
    for (const run of [
      () => c.chat.completions.stream(ask, bad).finalContent(),
      () => c.chat.completions.parse({ ...ask, response_format: zodResponseFormat(Weather, 'w') }, bad),
      () => c.responses.stream({ model: 'gpt-4o', input: 'x' }, bad).finalResponse(),
    ]) {
      const err = await sdkError(run());
      expect(err).toBeInstanceOf(OpenAI.BadRequestError);
      expectOpenAIError({ error: err.error }, 'bad_request');
      expect(err.headers!.get('x-should-retry')).toBe('false');
      expect(err.requestID).toBe(err.headers!.get('x-stormgate-request-id'));
    }
    expect(wire.requests).toBe(3);
    expect(s.mock.requests()).toHaveLength(0);

    // the provider's 400 context_length_exceeded through runTools() and parse(): passed on, its request id, never retried
    await faults(s, { errors: [{ status: 400, code: 'context_length_exceeded', message: "This model's maximum context length is 128000 tokens.", param: 'messages' }] });
    for (const run of [
      () => c.chat.completions.runTools({ ...ask, tools: [weatherTool([])] }).finalContent(),
      () => c.chat.completions.parse({ ...ask, response_format: zodResponseFormat(Weather, 'w') }),
    ]) {
      const before = s.mock.requests().length;
      const err = await sdkError(run());
      expect(err).toBeInstanceOf(OpenAI.BadRequestError);
      expect(err.code).toBe('context_length_exceeded');
      expect(err.param).toBe('messages');
      expect(err.headers!.get('x-should-retry')).toBe('false');
      expect(s.mock.requests()).toHaveLength(before + 1);
      expect(err.requestID).toBe(s.mock.requests()[before]!.requestId);
      expect(err.requestID).not.toBe(err.headers!.get('x-stormgate-request-id'));
    }
    expect(wire.requests).toBe(5);
  });

  it("a provider that refuses connections: runTools() and stream() raise 502 upstream_unavailable with x-should-retry false; the SDK's default retries add nothing", async () => {
    const port = await freePort();
    const s = await startStack({
      config: (url) => {
        const base = defaultConfig(url, RETRY_LOOP_ONLY);
        return { ...base, providers: { mock: { ...base.providers.mock!, baseUrl: `http://127.0.0.1:${port}/v1` } } };
      },
    });
    const { c, wire } = client(s);
    for (const run of [() => c.chat.completions.runTools({ ...ask, tools: [weatherTool([])] }).finalContent(), () => c.chat.completions.stream(ask).finalChatCompletion()]) {
      const err = await sdkError(run());
      expect(err).toBeInstanceOf(OpenAI.InternalServerError);
      expect(err.status).toBe(502);
      expectOpenAIError({ error: err.error }, 'upstream_unavailable', 'server_error');
      expect(err.headers!.get('x-should-retry')).toBe('false');
      expect(err.headers!.get('x-stormgate-attempts')).toBe('3');
      expect(err.requestID).toBe(err.headers!.get('x-stormgate-request-id'));
    }
    expect(wire.requests).toBe(2);
  });
});
