import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { decide, FaultCounters, firesAt, type FaultSpec } from '../src/mock/faults.ts';
import { startMock, type MockRequestLog, type MockServer } from '../src/mock/server.ts';
import { facts, noRandom } from './helpers/mock-facts.ts';


describe('fault decisions (pure)', () => {
  it('fails exactly 3 of every 10 at rate 0.3, evenly spread', () => {
    const fired = Array.from({ length: 100 }, (_, n) => firesAt(n, 0.3));
    for (let p = 0; p < 10; p++) expect(fired.slice(p * 10, p * 10 + 10).filter(Boolean)).toHaveLength(3);
    expect(Array.from({ length: 7 }, (_, n) => firesAt(n, 1 / 7)).filter(Boolean)).toHaveLength(1);
    // 100 * 0.29 is 28.999999999999996 in floating point; the count must still be exact.
    expect(Array.from({ length: 100 }, (_, n) => firesAt(n, 0.29)).filter(Boolean)).toHaveLength(29);
    expect(firesAt(0, 1)).toBe(true);
    expect(firesAt(5, 0)).toBe(false);
  });

  it('checks brownout, capacity, reset, hang, errors and then answers, in that order', () => {
    const spec: FaultSpec = { capacity: 1, resetRate: 1, hangRate: 1, errors: [{ status: 500 }], latencyMs: 7 };
    const c = new FaultCounters();
    expect(decide(spec, c, facts({ brownout: 'hang', inflight: 5 }), noRandom).kind).toBe('brownout');
    expect(decide(spec, c, facts({ inflight: 1 }), noRandom).kind).toBe('capacity');
    expect(decide(spec, c, facts(), noRandom).kind).toBe('reset');
    expect(decide({ ...spec, resetRate: 0 }, c, facts(), noRandom).kind).toBe('hang');
    expect(decide({ errors: [{ status: 500 }] }, c, facts(), noRandom)).toMatchObject({ kind: 'error', rule: { status: 500 } });
    expect(decide({ latencyMs: 7, latencyPerInflightMs: 2 }, c, facts({ inflight: 3 }), noRandom)).toEqual({ kind: 'answer', latencyMs: 13, stream: {} });
  });

  it('stops a rule after `times` failures and lets retries pass firstAttemptsOnly rules', () => {
    const c = new FaultCounters();
    const spec: FaultSpec = { errors: [{ status: 503, times: 2 }] };
    const kinds = Array.from({ length: 4 }, () => decide(spec, c, facts(), noRandom).kind);
    expect(kinds).toEqual(['error', 'error', 'answer', 'answer']);
    const first: FaultSpec = { errors: [{ status: 429, firstAttemptsOnly: true }] };
    expect(decide(first, c, facts({ isRetry: true }), noRandom).kind).toBe('answer');
    expect(decide(first, c, facts(), noRandom).kind).toBe('error');
  });

  it('counts a per-model override separately from the global rules', () => {
    const c = new FaultCounters();
    const spec: FaultSpec = { errors: [{ status: 503, rate: 0.5 }], models: { 'gpt-4.1': { errors: [{ status: 429, rate: 0.5 }] } } };
    const run = (model: string) => Array.from({ length: 4 }, () => decide(spec, c, facts({ model }), noRandom)).map((d) => (d.kind === 'error' ? d.rule.status : 200));
    expect(run('gpt-4o')).toEqual([200, 503, 200, 503]);
    expect(run('gpt-4.1')).toEqual([200, 429, 200, 429]);
  });
});

describe('mock provider over HTTP', () => {
  let mock: MockServer;
  let openai: OpenAI;
  let anthropic: Anthropic;

  beforeAll(async () => {
    mock = await startMock({ quiet: true });
    openai = new OpenAI({ baseURL: `${mock.url}/v1`, apiKey: 'k', maxRetries: 0, logLevel: 'off' });
    anthropic = new Anthropic({ baseURL: mock.url, apiKey: 'k', maxRetries: 0 });
  });
  afterAll(async () => {
    await mock.close();
  });
  beforeEach(() => {
    mock.setFaults({});
    mock.reset();
  });

  const userMessages: OpenAI.ChatCompletionMessageParam[] = [{ role: 'user', content: 'hello mock' }];
  const chatBody = (extra: Record<string, unknown> = {}) => ({ model: 'gpt-4o', messages: userMessages, ...extra });
  const post = (path: string, body: unknown, init: RequestInit = {}) =>
    fetch(mock.url + path, { method: 'POST', body: JSON.stringify(body), ...init, headers: { 'content-type': 'application/json', ...init.headers } });
  const statuses = async (n: number, headers: Record<string, string> = {}) => {
    const out: number[] = [];
    for (let i = 0; i < n; i++) {
      const res = await post('/v1/chat/completions', chatBody(), { headers });
      await res.arrayBuffer();
      out.push(res.status);
    }
    return out;
  };
  /** Polls the request log until pred holds (abort detection runs on socket close, a tick later). */
  const waitForLog = async (pred: (log: MockRequestLog[]) => boolean, ms = 2000) => {
    const end = Date.now() + ms;
    while (Date.now() < end) {
      if (pred(mock.requests())) return mock.requests();
      await new Promise((r) => setTimeout(r, 10));
    }
    throw new Error(`request log never matched: ${JSON.stringify(mock.requests())}`);
  };
  /** Reads a response body until it ends or fails; returns the text and whether it failed. */
  const readAll = async (res: Response) => {
    const reader = res.body!.getReader();
    const decoder = new TextDecoder();
    let text = '';
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return { text, failed: false };
        text += decoder.decode(value, { stream: true });
      }
    } catch {
      return { text, failed: true };
    }
  };
  const dataLines = (sse: string) => sse.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6));

  describe('shapes, through the official SDKs', () => {
    it('answers a chat completion with a deterministic text and usage', async () => {
      const c = await openai.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hello mock' }], n: 2 });
      expect(c.object).toBe('chat.completion');
      expect(c.id).toMatch(/^chatcmpl-/);
      expect(c.model).toBe('gpt-4o');
      expect(c.choices).toHaveLength(2);
      expect(c.choices[0]!.message.content).toBe('Mock answer to: hello mock');
      expect(c.choices[0]!.finish_reason).toBe('stop');
      expect(c.usage!.total_tokens).toBe(c.usage!.prompt_tokens + c.usage!.completion_tokens);
    });

    it('streams chunks whose text equals the non-stream answer, with usage when asked', async () => {
      const stream = await openai.chat.completions.create({ ...chatBody(), stream: true, stream_options: { include_usage: true } } as OpenAI.ChatCompletionCreateParamsStreaming);
      let text = '';
      const finishes: Array<string | null> = [];
      let usage: OpenAI.CompletionUsage | null | undefined;
      for await (const chunk of stream) {
        for (const ch of chunk.choices) {
          text += ch.delta.content ?? '';
          finishes.push(ch.finish_reason);
        }
        if (chunk.usage) usage = chunk.usage;
      }
      expect(text).toBe('Mock answer to: hello mock');
      expect(finishes.at(-1)).toBe('stop');
      expect(usage?.completion_tokens).toBeGreaterThan(0);
      expect(mock.requests()[0]).toMatchObject({ stream: true, status: 200, chunksSent: 5, aborted: false });
    });

    it('calls the first tool, then answers from the tool result, streamed and not', async () => {
      const tools: OpenAI.ChatCompletionTool[] = [{ type: 'function', function: { name: 'lookup', parameters: { type: 'object' } } }];
      const c = await openai.chat.completions.create({ ...chatBody(), tools });
      const call = c.choices[0]!.message.tool_calls![0]! as OpenAI.ChatCompletionMessageFunctionToolCall;
      expect(c.choices[0]!.finish_reason).toBe('tool_calls');
      expect(call.function).toEqual({ name: 'lookup', arguments: '{"x":1}' });

      const runner = openai.chat.completions.stream({ ...chatBody(), tools });
      const final = await runner.finalChatCompletion();
      const streamed = final.choices[0]!.message.tool_calls![0]! as OpenAI.ChatCompletionMessageFunctionToolCall;
      expect(streamed.function.arguments).toBe('{"x":1}');
      expect(streamed.id).toMatch(/^call_/);

      const after = await openai.chat.completions.create({
        model: 'gpt-4o',
        tools,
        messages: [
          { role: 'user', content: 'hello mock' },
          { role: 'assistant', content: null, tool_calls: [call] },
          { role: 'tool', tool_call_id: call.id, content: '42' },
        ],
      });
      expect(after.choices[0]!.message.content).toBe('Mock answer to: hello mock');
    });

    it('returns 8-dimensional embeddings as base64 (the SDK default) and as floats', async () => {
      const e = await openai.embeddings.create({ model: 'text-embedding-3-small', input: ['a', 'b'] });
      expect(e.data).toHaveLength(2);
      expect(e.data[0]!.embedding).toHaveLength(8);
      const floats = await openai.embeddings.create({ model: 'text-embedding-3-small', input: 'a', encoding_format: 'float' });
      expect(floats.data[0]!.embedding).toEqual(e.data[0]!.embedding);
    });

    it('answers the Responses API, non-stream and streamed', async () => {
      const r = await openai.responses.create({ model: 'gpt-4o', input: 'hello mock' });
      expect(r.status).toBe('completed');
      expect(r.output_text).toBe('Mock answer to: hello mock');
      expect(r.usage!.total_tokens).toBeGreaterThan(0);

      const types: string[] = [];
      let text = '';
      for await (const ev of await openai.responses.create({ model: 'gpt-4o', input: 'hello mock', stream: true })) {
        types.push(ev.type);
        if (ev.type === 'response.output_text.delta') text += ev.delta;
      }
      expect(text).toBe('Mock answer to: hello mock');
      expect(types[0]).toBe('response.created');
      expect(types.at(-1)).toBe('response.completed');
      // The SDK's stream helper accumulates the events; it sets no output_text (the real API sends none).
      const final = await openai.responses.stream({ model: 'gpt-4o', input: 'hello mock' }).finalResponse();
      expect(final.output[0]).toMatchObject({ type: 'message', content: [{ type: 'output_text', text: 'Mock answer to: hello mock' }] });
    });

    it('serves legacy completions and the model list', async () => {
      const c = await openai.completions.create({ model: 'gpt-4o', prompt: 'say hi' });
      expect(c.choices[0]!.text).toBe('Mock answer to: say hi');
      let text = '';
      for await (const chunk of await openai.completions.create({ model: 'gpt-4o', prompt: 'say hi', stream: true })) text += chunk.choices[0]?.text ?? '';
      expect(text).toBe('Mock answer to: say hi');
      const ids = [];
      for await (const m of openai.models.list()) ids.push(m.id);
      expect(ids).toEqual(expect.arrayContaining(['gpt-4o', 'gpt-4o-mini', 'gpt-4.1', 'text-embedding-3-small', 'claude-sonnet-4-5']));
    });

    it("lists and retrieves models in the shape of the API the client asks as (Claude models in Anthropic's)", async () => {
      const models = [];
      for await (const m of anthropic.models.list()) models.push(m);
      expect(models.map((m) => m.id)).toEqual(['claude-haiku-4-5', 'claude-sonnet-4-5', 'claude-opus-4-1']);
      expect(models[1]).toEqual({ type: 'model', id: 'claude-sonnet-4-5', display_name: 'Claude Sonnet 4.5', created_at: '2025-09-29T00:00:00Z' });
      expect(await anthropic.models.retrieve('claude-opus-4-1')).toMatchObject({ type: 'model', id: 'claude-opus-4-1', display_name: 'Claude Opus 4.1' });
      await expect(anthropic.models.retrieve('gpt-4o')).rejects.toMatchObject({ status: 404, error: { type: 'error', error: { type: 'not_found_error' } } });
      expect(await openai.models.retrieve('gpt-4.1')).toMatchObject({ id: 'gpt-4.1', object: 'model', owned_by: 'system' });
      await expect(openai.models.retrieve('claude-opus-4-1')).rejects.toMatchObject({ status: 404, code: 'model_not_found' });
      expect((await fetch(`${mock.url}/v1/models/%E0%A4%A`)).status).toBe(404);
      // Its errors are Anthropic's too: a wrong key is refused in Anthropic's error shape.
      const keyed = await startMock({ apiKey: 'secret' });
      try {
        const res = await fetch(`${keyed.url}/v1/models`, { headers: { 'x-api-key': 'nope', 'anthropic-version': '2023-06-01' } });
        expect(res.status).toBe(401);
        expect(await res.json()).toMatchObject({ type: 'error', error: { type: 'authentication_error' } });
      } finally {
        await keyed.close();
      }
    });

    it('answers Anthropic messages, streamed, with tools and with a prefill', async () => {
      const base = { model: 'claude-mock', max_tokens: 64, messages: [{ role: 'user' as const, content: 'hello mock' }] };
      const m = await anthropic.messages.create(base);
      expect(m.content).toEqual([{ type: 'text', text: 'Mock answer to: hello mock' }]);
      expect(m.stop_reason).toBe('end_turn');

      const streamed = await anthropic.messages.stream(base).finalMessage();
      expect(streamed.content).toEqual([{ type: 'text', text: 'Mock answer to: hello mock' }]);
      expect(streamed.usage.output_tokens).toBe(m.usage.output_tokens);

      const tools = [{ name: 'lookup', input_schema: { type: 'object' as const } }];
      const tool = await anthropic.messages.stream({ ...base, tools }).finalMessage();
      expect(tool.stop_reason).toBe('tool_use');
      expect(tool.content[0]).toMatchObject({ type: 'tool_use', name: 'lookup', input: { x: 1 } });

      const prefill = await anthropic.messages.create({ ...base, messages: [...base.messages, { role: 'assistant', content: 'Sure,' }] });
      expect(prefill.content[0]).toMatchObject({ type: 'text', text: expect.stringContaining('continues') });
    });

    it('fails in each family\'s error shape, with request ids', async () => {
      mock.setFaults({ errors: [{ status: 529 }] });
      const err = await anthropic.messages.create({ model: 'c', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(Anthropic.APIError);
      expect((err as InstanceType<typeof Anthropic.APIError>).status).toBe(529);
      expect((err as InstanceType<typeof Anthropic.APIError>).error).toMatchObject({ type: 'error', error: { type: 'overloaded_error' } });
      expect((err as InstanceType<typeof Anthropic.APIError>).requestID).toMatch(/^req_/);

      mock.setFaults({ errors: [{ status: 429, headers: { 'retry-after-ms': '150' } }] });
      const res = await post('/v1/chat/completions', chatBody());
      expect(res.status).toBe(429);
      expect(res.headers.get('retry-after-ms')).toBe('150');
      expect(res.headers.get('x-request-id')).toMatch(/^req_/);
      expect(await res.json()).toEqual({ error: { message: expect.any(String), type: 'requests', param: null, code: 'rate_limit_exceeded' } });
    });

    it('rejects malformed JSON, unknown paths and wrong API keys', async () => {
      type ErrorBody = { error: { type: string; message: string } };
      const bad = await fetch(`${mock.url}/v1/chat/completions`, { method: 'POST', body: '{"model":' });
      expect(bad.status).toBe(400);
      expect(((await bad.json()) as ErrorBody).error.type).toBe('invalid_request_error');
      const missing = await fetch(`${mock.url}/v1/nothing`);
      expect(missing.status).toBe(404);
      expect(((await missing.json()) as ErrorBody).error.message).toContain('/v1/nothing');

      const keyed = await startMock({ apiKey: 'secret', quiet: true });
      try {
        const wrong = new OpenAI({ baseURL: `${keyed.url}/v1`, apiKey: 'nope', maxRetries: 0 });
        await expect(wrong.chat.completions.create(chatBody() as OpenAI.ChatCompletionCreateParamsNonStreaming)).rejects.toMatchObject({ status: 401, code: 'invalid_api_key' });
        const right = new Anthropic({ baseURL: keyed.url, apiKey: 'secret', maxRetries: 0 });
        await expect(right.messages.create({ model: 'c', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] })).resolves.toMatchObject({ type: 'message' });
        const wrongA = new Anthropic({ baseURL: keyed.url, apiKey: 'nope', maxRetries: 0 });
        await expect(wrongA.messages.create({ model: 'c', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] })).rejects.toMatchObject({ status: 401 });
      } finally {
        await keyed.close();
      }
    });
  });

  describe('faults', () => {
    it('fails exactly 3 of 10 requests at rate 0.3', async () => {
      mock.setFaults({ errors: [{ status: 503, rate: 0.3 }] });
      const got = await statuses(10);
      expect(got.filter((s) => s === 503)).toHaveLength(3);
      expect(mock.stats().byStatus).toEqual({ '200': 7, '503': 3 });
    });

    it('lets retries through a firstAttemptsOnly rule and logs the retry headers', async () => {
      mock.setFaults({ errors: [{ status: 429, firstAttemptsOnly: true }] });
      expect(await statuses(2)).toEqual([429, 429]);
      expect(await statuses(2, { 'x-retry-attempt': '1', 'x-retry-reason': '429' })).toEqual([200, 200]);
      expect(mock.requests()[2]!.headers).toMatchObject({ 'x-retry-attempt': '1', 'x-retry-reason': '429' });
    });

    it('answers 429 at once beyond capacity', async () => {
      mock.setFaults({ capacity: 2, latencyMs: 1500, capacityHeaders: { 'retry-after': '1' } });
      const started = Date.now();
      const results = await Promise.all(
        Array.from({ length: 5 }, async () => {
          const res = await post('/v1/chat/completions', chatBody());
          await res.arrayBuffer();
          return { status: res.status, ms: Date.now() - started, retryAfter: res.headers.get('retry-after') };
        }),
      );
      const rejected = results.filter((r) => r.status === 429);
      expect(rejected).toHaveLength(3);
      expect(rejected.every((r) => r.ms < 1000 && r.retryAfter === '1')).toBe(true);
      expect(mock.stats().maxInflight).toBe(2);
    });

    it('browns out with 503, 429 + retry-after, or hanging, then recovers', async () => {
      mock.brownout('503', 150);
      expect(await statuses(1)).toEqual([503]);
      mock.brownout('429', 5000);
      const res = await post('/v1/chat/completions', chatBody());
      expect(res.status).toBe(429);
      expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(4);
      mock.brownout('hang', 200);
      const hung = await post('/v1/chat/completions', chatBody(), { signal: AbortSignal.timeout(100) }).catch((e: unknown) => e);
      expect(hung).toBeInstanceOf(Error);
      await new Promise((r) => setTimeout(r, 120));
      expect(await statuses(1)).toEqual([200]);
    });

    it('destroys the socket before any byte at resetRate', async () => {
      mock.setFaults({ resetRate: 0.5 });
      const outcomes = [];
      for (let i = 0; i < 4; i++) {
        outcomes.push(await post('/v1/chat/completions', chatBody()).then((r) => r.status, () => 'reset'));
      }
      expect(outcomes).toEqual([200, 'reset', 200, 'reset']);
      await waitForLog((log) => log.filter((e) => e.endedAt !== undefined).length === 4);
      expect(mock.stats().byStatus).toEqual({ '200': 2, reset: 2 });
      expect(mock.requests().every((e) => !e.aborted)).toBe(true);
    });

    it('marks a hanging request aborted when the client goes away', async () => {
      mock.setFaults({ hangRate: 1 });
      const ac = new AbortController();
      const pending = post('/v1/chat/completions', chatBody(), { signal: ac.signal }).catch((e: unknown) => e);
      await waitForLog((log) => log[0]?.status === 'hang');
      expect(mock.stats().inflight).toBe(1);
      ac.abort();
      await pending;
      const [entry] = await waitForLog((log) => log[0]?.aborted === true);
      expect(entry).toMatchObject({ status: 'hang', aborted: true });
      expect(mock.stats()).toMatchObject({ inflight: 0, aborted: 1, byStatus: { hang: 1 } });
    });

    it('marks a request aborted during its latency and cancels the wait', async () => {
      mock.setFaults({ latencyMs: 5000 });
      await post('/v1/chat/completions', chatBody(), { signal: AbortSignal.timeout(50) }).catch(() => undefined);
      const [entry] = await waitForLog((log) => log[0]?.aborted === true);
      expect(entry!.status).toBeUndefined();
      expect(entry!.endedAt! - entry!.receivedAt).toBeLessThan(1000);
    });

    it('keeps an abandoned request in flight until its latency has passed with holdAbandoned', async () => {
      // Latencies long enough that the checks before they pass still fall inside them on a loaded machine.
      mock.setFaults({ latencyMs: 1500, capacity: 1, holdAbandoned: true });
      await post('/v1/chat/completions', chatBody(), { signal: AbortSignal.timeout(50) }).catch(() => undefined);
      await waitForLog((log) => log[0]?.aborted === true);
      // The provider is still working on it: the slot stays taken and a newcomer is turned away.
      expect(mock.stats().inflight).toBe(1);
      expect((await post('/v1/chat/completions', chatBody())).status).toBe(429);
      await new Promise((r) => setTimeout(r, 1550));
      expect(mock.stats().inflight).toBe(0);
      expect((await post('/v1/chat/completions', chatBody())).status).toBe(200);
    });

    it('holds a request hung by a brownout for the latency it would have had, with holdAbandoned', async () => {
      mock.setFaults({ latencyMs: 1500, holdAbandoned: true });
      mock.brownout('hang', 5000);
      await post('/v1/chat/completions', chatBody(), { signal: AbortSignal.timeout(50) }).catch(() => undefined);
      await waitForLog((log) => log[0]?.aborted === true);
      expect(mock.stats().inflight).toBe(1);
      await new Promise((r) => setTimeout(r, 1550));
      expect(mock.stats().inflight).toBe(0);
      mock.brownout('hang', 0);
    });

    it('cuts a stream after N content chunks: no finish, no [DONE]', async () => {
      mock.setFaults({ stream: { cutAfterChunks: 2 } });
      const { text, failed } = await readAll(await post('/v1/chat/completions', chatBody({ stream: true })));
      expect(failed).toBe(true);
      const contents = dataLines(text).map((d) => JSON.parse(d).choices[0].delta.content);
      expect(contents).toEqual(['', 'Mock ', 'answe']); // role chunk + 2 of 5 content chunks
      expect(text).not.toContain('[DONE]');
      expect(mock.requests()[0]).toMatchObject({ chunksSent: 2, aborted: false });
    });

    it('stalls a stream until the client leaves', async () => {
      mock.setFaults({ stream: { stallAfterChunks: 1, pingBeforeFirstToken: true } });
      const ac = new AbortController();
      const res = await post('/v1/messages', { model: 'c', max_tokens: 5, stream: true, messages: [{ role: 'user', content: 'x' }] }, { signal: ac.signal });
      const reader = res.body!.getReader();
      let text = '';
      while (!text.includes('content_block_delta')) text += new TextDecoder().decode((await reader.read()).value);
      expect(text).toContain(': ping');
      ac.abort();
      const [entry] = await waitForLog((log) => log[0]?.aborted === true);
      expect(entry).toMatchObject({ status: 200, chunksSent: 1, aborted: true });
    });

    it('sends a malformed event in place of chunk N, and can omit [DONE]', async () => {
      mock.setFaults({ stream: { malformedAtChunk: 1, omitDone: true, chunkDelayMs: 5, firstTokenDelayMs: 20 } });
      const { text, failed } = await readAll(await post('/v1/chat/completions', chatBody({ stream: true })));
      expect(failed).toBe(false);
      const lines = dataLines(text);
      expect(lines).toContain('{not json');
      expect(lines).not.toContain('[DONE]');
      expect(JSON.parse(lines.at(-1)!).choices[0].finish_reason).toBe('stop');

      const stream = await openai.chat.completions.create({ ...chatBody(), stream: true } as OpenAI.ChatCompletionCreateParamsStreaming);
      await expect((async () => {
        for await (const _ of stream) void _;
      })()).rejects.toThrow();
    });

    it('applies per-model overrides only to that model', async () => {
      mock.setFaults({ latencyMs: 0, models: { 'gpt-4.1': { errors: [{ status: 500, rate: 0.5 }] } } });
      const codes = [];
      for (const model of ['gpt-4.1', 'gpt-4.1', 'gpt-4o', 'gpt-4.1', 'gpt-4.1']) {
        const res = await post('/v1/chat/completions', chatBody({ model }));
        await res.arrayBuffer();
        codes.push(res.status);
      }
      expect(codes).toEqual([200, 500, 200, 200, 500]);
    });
  });

  describe('control', () => {
    it('changes faults, browns out, reports and resets over HTTP', async () => {
      // JSON from the control API; the assertions check its shape.
      const call = async (method: string, path: string, body?: unknown): Promise<any> => {
        const res = await fetch(mock.url + path, { method, ...(body === undefined ? {} : { body: JSON.stringify(body) }) });
        expect(res.status).toBe(200);
        return res.json();
      };
      expect(await call('PUT', '/_mock/faults', { errors: [{ status: 503 }], latencyMs: 1 })).toEqual({ errors: [{ status: 503 }], latencyMs: 1 });
      expect(await call('PATCH', '/_mock/faults', { errors: null, capacity: 9 })).toEqual({ latencyMs: 1, capacity: 9 });
      expect(await call('GET', '/_mock/faults')).toEqual({ latencyMs: 1, capacity: 9 });
      expect(await statuses(1)).toEqual([200]);
      await call('POST', '/_mock/brownout', { mode: '503', durationMs: 100 });
      expect(await statuses(1)).toEqual([503]);

      const stats = await call('GET', '/_mock/stats');
      expect(stats).toMatchObject({ total: 2, inflight: 0, byStatus: { '200': 1, '503': 1 }, byPath: { '/v1/chat/completions': 2 } });
      expect(stats.perSecond.reduce((n: number, s: { total: number }) => n + s.total, 0)).toBe(2);
      const log = await call('GET', '/_mock/requests?limit=1');
      expect(log).toHaveLength(1);
      expect(log[0]).toMatchObject({ method: 'POST', model: 'gpt-4o', status: 503, aborted: false });
      await call('POST', '/_mock/reset');
      expect(await call('GET', '/_mock/stats')).toMatchObject({ total: 0, byStatus: {} });
      expect(await call('GET', '/_mock/requests')).toEqual([]);

      const bad = await fetch(`${mock.url}/_mock/faults`, { method: 'PUT', body: '{"errors": 5}' });
      expect(bad.status).toBe(400);
    });

    it('close() ends hanging requests and frees the port', async () => {
      const m = await startMock({ quiet: true, faults: { hangRate: 1 } });
      const pending = fetch(`${m.url}/v1/chat/completions`, { method: 'POST', body: JSON.stringify(chatBody()) }).catch((e: unknown) => e);
      await new Promise((r) => setTimeout(r, 50));
      await m.close();
      expect(await pending).toBeInstanceOf(Error);
      await expect(fetch(`${m.url}/v1/models`)).rejects.toThrow();
    });
  });
});
