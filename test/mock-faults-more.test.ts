// The mock's faults for outside teams' failure-scenario suites beyond the first set: a mid-stream error event in each
// API's own shape, the 529 overload brownout, and error rules refused at PUT/PATCH time when their status is no error.
// Checked with the official SDKs against the mock, then once each through the gateway as its README says it handles them.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { beforeAll, describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import type { FaultSpec, MockServer } from '../src/mock/server.ts';
import { RETRY_LOOP_ONLY, TEST_KEY, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';
import { mockWithSdks } from './helpers/mock-sdks.ts';
import { mockCli } from './helpers/mock-cli.ts';

const messages = [{ role: 'user' as const, content: 'hello mock' }];
const chat = { model: 'gpt-4o', messages };
const ask = { model: 'claude-mock', max_tokens: 64, messages };
const post = (url: string, path: string, body: unknown) =>
  fetch(url + path, { method: 'POST', body: JSON.stringify(body), headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01' } });
const control = async (url: string, method: string, path: string, body?: unknown) => {
  const res = await fetch(url + path, { method, ...(body === undefined ? {} : { body: JSON.stringify(body) }) });
  return { status: res.status, body: (await res.json()) as any };
};
/** Every SSE event of a body as [event name or null, data]. */
const events = (sse: string) =>
  sse
    .split('\n\n')
    .filter((e) => e.trim() !== '')
    .map((e) => [/^event: (.*)$/m.exec(e)?.[1] ?? null, /^data: (.*)$/m.exec(e)?.[1] ?? ''] as const);
/** Drains an SDK stream; what it yielded and the error it raised (undefined when it ended cleanly). */
async function drain<T>(stream: AsyncIterable<T>): Promise<{ items: T[]; error: unknown }> {
  const items: T[] = [];
  try {
    for await (const item of stream) items.push(item);
    return { items, error: undefined };
  } catch (error) {
    return { items, error };
  }
}
const chatText = (chunks: OpenAI.ChatCompletionChunk[]) => chunks.map((c) => c.choices[0]?.delta.content ?? '').join('');

describe('the mock alone, with the official SDKs', () => {
  let mock: MockServer;
  let openai: OpenAI;
  let anthropic: Anthropic;
  const sdks = mockWithSdks();
  beforeAll(() => void ({ mock, openai, anthropic } = sdks));

  it('errorAfterChunks: chat ends with OpenAI\'s error data line after N chunks, no finish and no [DONE]; the SDK raises it', async () => {
    mock.setFaults({ stream: { chunks: 5, errorAfterChunks: 2 } });
    const raw = await (await post(mock.url, '/v1/chat/completions', { ...chat, stream: true })).text();
    const evs = events(raw);
    // The role chunk, two content chunks, the error.
    expect(evs).toHaveLength(4);
    expect(JSON.parse(evs[3]![1])).toEqual({ error: { message: expect.any(String), type: 'server_error', param: null, code: null } });
    expect(raw).not.toContain('[DONE]');
    expect(raw).not.toContain('"finish_reason":"stop"');

    const whole = (await openai.chat.completions.create(chat)).choices[0]!.message.content!;
    const { items, error } = await drain(await openai.chat.completions.create({ ...chat, stream: true }));
    expect(error).toBeInstanceOf(OpenAI.APIError);
    expect((error as InstanceType<typeof OpenAI.APIError>).type).toBe('server_error');
    expect(chatText(items)).toBe(whole.slice(0, chatText(items).length));
    expect(chatText(items).length).toBeGreaterThan(0);
    expect(mock.requests().at(-1)).toMatchObject({ chunksSent: 2, status: 200 });
  });

  it('errorAfterChunks: Messages sends event: error overloaded_error; the SDK raises an APIError of that type', async () => {
    mock.setFaults({ stream: { chunks: 4, errorAfterChunks: 1 } });
    const evs = events(await (await post(mock.url, '/v1/messages', { ...ask, stream: true })).text());
    expect(evs.map(([name]) => name)).toEqual(['message_start', 'content_block_start', 'ping', 'content_block_delta', 'error']);
    expect(JSON.parse(evs.at(-1)![1])).toEqual({ type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } });

    const stream = anthropic.messages.stream(ask);
    let text = '';
    stream.on('text', (t) => (text += t));
    const err = (await stream.finalMessage().catch((e: unknown) => e)) as InstanceType<typeof Anthropic.APIError>;
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(err.error).toEqual({ type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } });
    expect(text.length).toBeGreaterThan(0);
  });

  it('errorAfterChunks: the Responses API sends its error event numbered after the last; the SDK yields it, finalResponse() rejects', async () => {
    mock.setFaults({ stream: { chunks: 5, errorAfterChunks: 3 } });
    const evs = events(await (await post(mock.url, '/v1/responses', { model: 'gpt-4.1', input: 'hi', stream: true })).text());
    const last = JSON.parse(evs.at(-1)![1]);
    expect(evs.at(-1)![0]).toBe('error');
    expect(last).toEqual({ type: 'error', sequence_number: evs.length - 1, code: 'server_error', message: expect.any(String), param: null });
    expect(evs.map(([name]) => name)).not.toContain('response.completed');

    // openai 6.x raises only for data with an `error` object: the Responses API's own error event is yielded as an event.
    const { items, error } = await drain(await openai.responses.create({ model: 'gpt-4.1', input: 'hi', stream: true }));
    expect(error).toBeUndefined();
    expect(items.at(-1)).toMatchObject({ type: 'error', code: 'server_error' });
    await expect(openai.responses.stream({ model: 'gpt-4.1', input: 'hi' }).finalResponse()).rejects.toThrow();
  });

  it('errorAfterChunks per model and at run time: PATCH sets it for one model, 0 fails before any content, a bad value is refused', async () => {
    expect((await control(mock.url, 'PATCH', '/_mock/faults', { models: { 'gpt-x': { stream: { errorAfterChunks: 0 } } } })).status).toBe(200);
    const x = await drain(await openai.chat.completions.create({ ...chat, model: 'gpt-x', stream: true }));
    expect(x.error).toBeInstanceOf(OpenAI.APIError);
    expect(chatText(x.items)).toBe('');
    expect((await drain(await openai.chat.completions.create({ ...chat, stream: true }))).error).toBeUndefined();
    for (const bad of [-1, 1.5, '2']) {
      const res = await control(mock.url, 'PATCH', '/_mock/faults', { stream: { errorAfterChunks: bad } });
      expect(res).toEqual({ status: 400, body: { error: 'stream.errorAfterChunks must be a non-negative integer' } });
    }
    expect(mock.faults()).toEqual({ models: { 'gpt-x': { stream: { errorAfterChunks: 0 } } } });
  });

  it('brownout 529: Anthropic\'s 529 overloaded_error on /v1/messages, OpenAI\'s documented 503 overload on its paths', async () => {
    expect((await control(mock.url, 'POST', '/_mock/brownout', { mode: '529', durationMs: 5000 })).body).toEqual({ ok: true, mode: '529', durationMs: 5000 });
    const a = (await anthropic.messages.create(ask).catch((e: unknown) => e)) as InstanceType<typeof Anthropic.APIError>;
    expect(a).toBeInstanceOf(Anthropic.APIError);
    expect(a.status).toBe(529);
    expect(a.error).toMatchObject({ type: 'error', error: { type: 'overloaded_error', message: expect.any(String) }, request_id: expect.any(String) });
    const o = (await openai.chat.completions.create(chat).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(o).toBeInstanceOf(OpenAI.InternalServerError);
    expect(o.status).toBe(503);
    expect(o.error).toMatchObject({ type: 'server_error', message: expect.stringContaining('The engine is currently overloaded, please try again later') });
    expect(mock.stats().byStatus).toMatchObject({ 529: 1, 503: 1 });
    mock.brownout('529', 0);
    await expect(anthropic.messages.create(ask)).resolves.toMatchObject({ type: 'message' });
  });

  it('max_tokens / max_completion_tokens cut a longer chat answer with finish_reason "length", streamed and not, usage consistent', async () => {
    const whole = (await openai.chat.completions.create(chat)).choices[0]!.message.content!;
    expect(whole.length).toBeGreaterThan(12);
    for (const cap of [{ max_tokens: 3 }, { max_completion_tokens: 3 }, { max_tokens: 50, max_completion_tokens: 3 }]) {
      const c = await openai.chat.completions.create({ ...chat, ...cap });
      expect(c.choices[0]).toMatchObject({ finish_reason: 'length', message: { content: whole.slice(0, 12) } });
      expect(c.usage).toMatchObject({ completion_tokens: 3, total_tokens: c.usage!.prompt_tokens + 3 });
      const { items } = await drain(await openai.chat.completions.create({ ...chat, ...cap, stream: true, stream_options: { include_usage: true } }));
      expect(chatText(items)).toBe(whole.slice(0, 12));
      expect(items.map((i) => i.choices[0]?.finish_reason).filter(Boolean)).toEqual(['length']);
      expect(items.at(-1)!.usage).toMatchObject({ completion_tokens: 3 });
    }
    // A cap the answer fits in changes nothing.
    expect((await openai.chat.completions.create({ ...chat, max_tokens: 1000 })).choices[0]).toMatchObject({ finish_reason: 'stop', message: { content: whole } });
  });

  it('max_tokens cuts a longer Messages answer with stop_reason "max_tokens", streamed and not, usage consistent', async () => {
    const whole = ((await anthropic.messages.create(ask)).content[0] as Anthropic.TextBlock).text;
    const m = await anthropic.messages.create({ ...ask, max_tokens: 2 });
    expect(m).toMatchObject({ stop_reason: 'max_tokens', content: [{ type: 'text', text: whole.slice(0, 8) }], usage: { output_tokens: 2 } });
    const streamed = await anthropic.messages.stream({ ...ask, max_tokens: 2 }).finalMessage();
    expect(streamed).toMatchObject({ stop_reason: 'max_tokens', content: [{ type: 'text', text: whole.slice(0, 8) }], usage: { output_tokens: 2 } });
    expect(await anthropic.messages.create({ ...ask, max_tokens: 1000 })).toMatchObject({ stop_reason: 'end_turn', content: [{ text: whole }] });
  });

  it('max_tokens cuts a longer legacy completion with finish_reason "length", streamed and not, usage consistent', async () => {
    const legacy = { model: 'gpt-3.5-turbo-instruct', prompt: 'hello mock' };
    const whole = (await openai.completions.create(legacy)).choices[0]!.text;
    expect(whole.length).toBeGreaterThan(12);
    const c = await openai.completions.create({ ...legacy, max_tokens: 3 });
    expect(c.choices[0]).toMatchObject({ finish_reason: 'length', text: whole.slice(0, 12) });
    expect(c.usage).toMatchObject({ completion_tokens: 3, total_tokens: c.usage!.prompt_tokens + 3 });
    const { items } = await drain(await openai.completions.create({ ...legacy, max_tokens: 3, stream: true, stream_options: { include_usage: true } }));
    expect(items.map((i) => i.choices[0]?.text ?? '').join('')).toBe(whole.slice(0, 12));
    expect(items.map((i) => i.choices[0]?.finish_reason).filter(Boolean)).toEqual(['length']);
    expect(items.at(-1)!.usage).toMatchObject({ completion_tokens: 3 });
    const fits = await openai.completions.create({ ...legacy, max_tokens: 1000 });
    expect(fits.choices[0]).toMatchObject({ finish_reason: 'stop', text: whole });
  });

  it('max_output_tokens cuts a longer Responses API answer: status "incomplete", incomplete_details max_output_tokens, streamed and not', async () => {
    const input = { model: 'gpt-4o', input: 'hello mock' };
    const whole = (await openai.responses.create(input)).output_text;
    expect(whole.length).toBeGreaterThan(12);
    const r = await openai.responses.create({ ...input, max_output_tokens: 3 });
    expect(r).toMatchObject({ status: 'incomplete', incomplete_details: { reason: 'max_output_tokens' }, max_output_tokens: 3, output: [{ type: 'message', status: 'incomplete' }], usage: { output_tokens: 3 } });
    expect(r.output_text).toBe(whole.slice(0, 12));
    // Streamed: the text up to the cap, then the real API's terminal event for it, response.incomplete (no completed).
    const { items } = await drain(await openai.responses.create({ ...input, max_output_tokens: 3, stream: true }));
    const deltas = items.flatMap((e) => (e.type === 'response.output_text.delta' ? [e.delta] : []));
    expect(deltas.join('')).toBe(whole.slice(0, 12));
    expect(items.map((e) => e.type)).not.toContain('response.completed');
    const last = items.at(-1)!;
    expect(last.type).toBe('response.incomplete');
    expect(last.type === 'response.incomplete' && last.response).toMatchObject({ status: 'incomplete', incomplete_details: { reason: 'max_output_tokens' }, output: [{ status: 'incomplete', content: [{ text: whole.slice(0, 12) }] }], usage: { output_tokens: 3 } });
    expect(items.find((e) => e.type === 'response.output_item.done')).toMatchObject({ item: { status: 'incomplete' } });
    // A cap the answer fits in changes nothing.
    expect(await openai.responses.create({ ...input, max_output_tokens: 1000 })).toMatchObject({ status: 'completed', incomplete_details: null, output_text: whole });
  });

  it('an error rule whose status is no error (outside 400-599, not an integer) is refused with 400 and the spec kept', async () => {
    const spec: FaultSpec = { errors: [{ status: 503, rate: 0.5 }] };
    await control(mock.url, 'PUT', '/_mock/faults', spec);
    for (const status of [200, 302, 399, 600, 700, 503.5, '503', null]) {
      const message = `an error rule's status must be an integer from 400 to 599, got ${JSON.stringify(status)}`;
      expect(await control(mock.url, 'PUT', '/_mock/faults', { errors: [{ status }] })).toEqual({ status: 400, body: { error: message } });
      expect(await control(mock.url, 'PATCH', '/_mock/faults', { errors: [{ status, rate: 1 }] })).toEqual({ status: 400, body: { error: message } });
      expect(await control(mock.url, 'PATCH', '/_mock/faults', { models: { m: { errors: [{ status }] } } })).toEqual({ status: 400, body: { error: message } });
    }
    expect((await control(mock.url, 'PUT', '/_mock/faults', { errors: [{}] })).body.error).toBe("an error rule's status must be an integer from 400 to 599, got none");
    // The rate too, as --error refuses it.
    for (const rate of [1.5, -0.1, '0.5']) {
      const message = `an error rule's rate must be a number from 0 to 1, got ${JSON.stringify(rate)}`;
      expect(await control(mock.url, 'PATCH', '/_mock/faults', { errors: [{ status: 503, rate }] })).toEqual({ status: 400, body: { error: message } });
    }
    expect(mock.faults()).toEqual(spec);
    // Both ends of the range are accepted.
    expect((await control(mock.url, 'PATCH', '/_mock/faults', { errors: [{ status: 400 }, { status: 599 }] })).status).toBe(200);
    expect(() => mock.setFaults({ errors: [{ status: 200 }] })).toThrow(/from 400 to 599/);
  });

  it('a misspelt field or a negative delay is refused with 400 and the spec kept, not silently ignored', async () => {
    const spec: FaultSpec = { errors: [{ status: 503, rate: 0.5 }] };
    await control(mock.url, 'PUT', '/_mock/faults', spec);
    const unknown = 'unknown fault spec field "erors"; did you mean "errors"?';
    expect(await control(mock.url, 'PATCH', '/_mock/faults', { erors: [{ status: 503 }] })).toEqual({ status: 400, body: { error: unknown } });
    expect(await control(mock.url, 'PUT', '/_mock/faults', { erors: [{ status: 503 }] })).toEqual({ status: 400, body: { error: unknown } });
    expect(await control(mock.url, 'PATCH', '/_mock/faults', { models: { m: { latencyMS: 5 } } })).toEqual({ status: 400, body: { error: 'unknown fault spec field "latencyMS"; did you mean "latencyMs"?' } });
    expect(await control(mock.url, 'PATCH', '/_mock/faults', { models: { m: { models: { n: { latencyMs: 5 } } } } })).toEqual({ status: 400, body: { error: "models.m: a model's fault spec cannot have models of its own" } });
    for (const k of ['latencyMs', 'capacity', 'hangRate']) {
      expect(await control(mock.url, 'PATCH', '/_mock/faults', { [k]: -5 })).toEqual({ status: 400, body: { error: `${k} must be a non-negative number` } });
    }
    expect(mock.faults()).toEqual(spec);
    // null still removes a field, as documented.
    expect((await control(mock.url, 'PATCH', '/_mock/faults', { errors: null })).body).toEqual({});
  });
});

describe('the flags (npm run mock)', () => {
  const cli = mockCli();
  const run = (args: string[]) => cli(['--quiet', ...args]);

  it('--error-after-chunks merges into the spec\'s stream faults; --error takes the same statuses as PUT /_mock/faults', async () => {
    const { url, child } = await run(['--faults', JSON.stringify({ stream: { chunks: 3 } }), '--error-after-chunks', '1', '--error', '529:0.5']);
    expect((await control(url!, 'GET', '/_mock/faults')).body).toEqual({ stream: { chunks: 3, errorAfterChunks: 1 }, errors: [{ status: 529, rate: 0.5 }] });
    child.kill('SIGKILL');
    for (const args of [['--error', '302'], ['--error', '600:1'], ['--error-after-chunks', '1.5']]) {
      const bad = await run(args);
      const [code] = (await bad.exited) as [number];
      expect(code).toBe(1);
      expect(bad.out()).toContain('usage: npm run mock');
    }
  }, 30_000);
});

describe('through the gateway', () => {
  const startStack = useStacks();
  const startBackup = useExtraMocks();

  /** The stack's mock as the Anthropic provider `claude`, a second mock as `backup` after it. */
  const anthropicStack = async (faults?: FaultSpec): Promise<{ s: Stack; backup: MockServer; client: Anthropic }> => {
    const backup = await startBackup({ apiKey: 'backup-key' });
    const route: ConfigInput['routes'][number] = {
      name: 'messages',
      match: { path: '/v1/messages' },
      targets: [{ provider: 'claude' }, { provider: 'backup' }],
      ...RETRY_LOOP_ONLY.route,
      retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } },
    };
    const s = await startStack({
      faults,
      config: (url) => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: {
          claude: { family: 'anthropic', baseUrl: url, apiKey: TEST_KEY, breaker: false },
          backup: { family: 'anthropic', baseUrl: backup.url, apiKey: 'backup-key', breaker: false },
        },
        routes: [route],
      }),
    });
    return { s, backup, client: new Anthropic({ baseURL: s.url, apiKey: 'client-key', maxRetries: 0, logLevel: 'off' }) };
  };

  it('a chat stream\'s mid-stream error event after the first output ends the client\'s stream with an error the SDK raises', async () => {
    const s = await startStack({ ...RETRY_LOOP_ONLY, faults: { stream: { chunks: 5, errorAfterChunks: 2 } } });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'k', maxRetries: 0, logLevel: 'off' });
    const { items, error } = await drain(await client.chat.completions.create({ ...chat, stream: true }));
    expect(error).toBeInstanceOf(OpenAI.APIError);
    expect(chatText(items).length).toBeGreaterThan(0);
    // After the first output the attempt is not retried.
    expect(s.mock.stats().total).toBe(1);
  });

  it('an Anthropic overloaded_error event after the first output ends the SDK\'s stream with an APIError', async () => {
    const { s, backup, client } = await anthropicStack({ stream: { chunks: 4, errorAfterChunks: 1 } });
    const stream = client.messages.stream(ask);
    let text = '';
    stream.on('text', (t) => (text += t));
    const err = (await stream.finalMessage().catch((e: unknown) => e)) as InstanceType<typeof Anthropic.APIError>;
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(JSON.stringify(err.error)).toContain('overloaded_error');
    expect(text.length).toBeGreaterThan(0);
    expect(s.mock.stats().total + backup.stats().total).toBe(1);
  });

  it('a 529 brownout on /v1/messages is retried per retryOn, then failed over to the next target', async () => {
    const { s, backup, client } = await anthropicStack();
    s.mock.brownout('529', 10_000);
    await expect(client.messages.create(ask)).resolves.toMatchObject({ type: 'message', stop_reason: 'end_turn' });
    expect(s.mock.stats().byStatus).toMatchObject({ 529: expect.any(Number) });
    expect(s.mock.stats().total).toBeGreaterThanOrEqual(1);
    expect(backup.stats().total).toBe(1);
  });

  it('a 529 brownout on an OpenAI path (its 503 overload) is retried per retryOn and reaches the client as a 503', async () => {
    const s = await startStack({ ...RETRY_LOOP_ONLY, route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } } });
    s.mock.brownout('529', 10_000);
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'k', maxRetries: 0, logLevel: 'off' });
    const err = (await client.chat.completions.create(chat).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.status).toBe(503);
    expect(s.mock.stats().total).toBe(3);
  });
});
