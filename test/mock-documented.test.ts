// The mock provider as an outside team drives it: every flag, fault and control endpoint that the README's "The mock
// provider" section and `npm run mock -- --help` document, checked once each, with the official SDKs as clients.
// Items that test/mock.test.ts, mock-cli, mock-rate-limit and mock-quota-per-model already check are left to them.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startMock, type MockServer } from '../src/mock/server.ts';
import { mockWithSdks } from './helpers/mock-sdks.ts';
import { mockCli } from './helpers/mock-cli.ts';

const userMessages = [{ role: 'user' as const, content: 'hello mock' }];
const chatBody = (extra: Record<string, unknown> = {}) => ({ model: 'gpt-4o', messages: userMessages, ...extra });
const messagesBody = (extra: Record<string, unknown> = {}) => ({ model: 'claude-mock', max_tokens: 64, messages: userMessages, ...extra });
const post = (url: string, path: string, body: unknown, headers: Record<string, string> = {}, signal?: AbortSignal) =>
  fetch(url + path, { method: 'POST', body: JSON.stringify(body), headers: { 'content-type': 'application/json', ...headers }, ...(signal ? { signal } : {}) });
const control = async (url: string, method: string, path: string, body?: unknown) => {
  const res = await fetch(url + path, { method, ...(body === undefined ? {} : { body: JSON.stringify(body) }) });
  return { status: res.status, body: (await res.json()) as any };
};
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('the documented flags (npm run mock)', () => {
  const run = mockCli();

  it('--help lists every flag the CLI takes', async () => {
    const { out, exited } = await run(['--help']);
    await exited;
    for (const flag of ['--port', '--host', '--latency-ms', '--capacity', '--rate-limit-rpm', '--rate-limit-tpm', '--rate-limit-retry-after', '--rate-limit-burst-seconds', '--error', '--error-after-chunks', '--reset-rate', '--hang-rate', '--faults', '--faults-file', '--api-key', '--quiet']) {
      expect(out()).toContain(`  ${flag} `);
    }
    expect(out()).toMatch(/\/_mock\/faults.*\/_mock\/stats[\s\S]*\/_mock\/requests.*\/_mock\/reset.*\/_mock\/brownout/);
  }, 30_000);

  it('--faults sets the spec, the single-field flags override its fields and --error adds its rules after the spec\'s', async () => {
    const { url } = await run([
      '--quiet', '--faults', JSON.stringify({ latencyMs: 9, capacity: 1, errors: [{ status: 500, rate: 0.1 }], stream: { chunks: 2 } }),
      '--latency-ms', '25', '--capacity', '4', '--reset-rate', '0.1', '--hang-rate', '0.2', '--error', '503:0.3', '--error', '429',
    ]);
    expect((await control(url!, 'GET', '/_mock/faults')).body).toEqual({
      latencyMs: 25, capacity: 4, resetRate: 0.1, hangRate: 0.2, stream: { chunks: 2 },
      errors: [{ status: 500, rate: 0.1 }, { status: 503, rate: 0.3 }, { status: 429, rate: 1 }],
    });
  }, 30_000);

  it('--faults-file reads the spec from a file; --api-key refuses other keys; a bad flag exits with the usage', async () => {
    const file = join(mkdtempSync(join(tmpdir(), 'mockfid-')), 'faults.json');
    writeFileSync(file, JSON.stringify({ errors: [{ status: 502, rate: 0.5 }] }));
    const { url, child } = await run(['--quiet', '--faults-file', file, '--api-key', 'sekret']);
    expect((await control(url!, 'GET', '/_mock/faults')).body).toEqual({ errors: [{ status: 502, rate: 0.5 }] });
    const openai = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sekret', maxRetries: 0 });
    const statuses = [];
    for (let i = 0; i < 2; i++) statuses.push(await openai.chat.completions.create(chatBody() as OpenAI.ChatCompletionCreateParamsNonStreaming).then(() => 200, (e: { status: number }) => e.status));
    expect(statuses).toEqual([200, 502]);
    await expect(new OpenAI({ baseURL: `${url}/v1`, apiKey: 'other', maxRetries: 0 }).models.list()).rejects.toMatchObject({ status: 401 });
    child.kill('SIGKILL');

    const bad = await run(['--error', '700:2']);
    const [code] = (await bad.exited) as [number];
    expect(code).toBe(1);
    expect(bad.out()).toContain('--error expects STATUS:RATE');
    expect(bad.out()).toContain('usage: npm run mock');
  }, 30_000);
});

describe('the documented faults and control endpoints', () => {
  let mock: MockServer;
  let openai: OpenAI;
  let anthropic: Anthropic;
  const sdks = mockWithSdks();
  beforeAll(() => void ({ mock, openai, anthropic } = sdks));
  const chatStatus = async (extra: Record<string, unknown> = {}) => {
    const res = await post(mock.url, '/v1/chat/completions', chatBody(extra));
    await res.arrayBuffer();
    return res.status;
  };

  it('error rules are checked in order: 503:0.3 then 429:0.1 fails 30 of 100 with 503 and 7 with 429', async () => {
    await control(mock.url, 'PUT', '/_mock/faults', { errors: [{ status: 503, rate: 0.3 }, { status: 429, rate: 0.1 }] });
    const got: number[] = [];
    for (let i = 0; i < 100; i++) got.push(await chatStatus());
    expect(got.filter((s) => s === 503)).toHaveLength(30);
    expect(got.filter((s) => s === 429)).toHaveLength(7);
    expect((await control(mock.url, 'GET', '/_mock/stats')).body.byStatus).toEqual({ '200': 63, '429': 7, '503': 30 });
  });

  it('an error rule\'s code, type, message, param and wait-hint headers reach the SDKs; Anthropic keeps the message', async () => {
    mock.setFaults({ errors: [{ status: 400, code: 'context_length_exceeded', type: 'invalid_request_error', message: 'too long', param: 'messages', headers: { 'retry-after': '7', 'x-custom': 'y' } }] });
    const err = (await openai.chat.completions.create(chatBody() as OpenAI.ChatCompletionCreateParamsNonStreaming).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect(err).toMatchObject({ status: 400, code: 'context_length_exceeded', type: 'invalid_request_error', param: 'messages' });
    expect(err.message).toContain('too long');
    expect(err.headers!.get('retry-after')).toBe('7');
    expect(err.headers!.get('x-custom')).toBe('y');

    mock.setFaults({ errors: [{ status: 529, message: 'busy now', headers: { 'retry-after': '3' } }] });
    const a = (await anthropic.messages.create(messagesBody() as Anthropic.MessageCreateParamsNonStreaming).catch((e: unknown) => e)) as InstanceType<typeof Anthropic.APIError>;
    expect(a.status).toBe(529);
    expect(a.error).toMatchObject({ type: 'error', error: { type: 'overloaded_error', message: 'busy now' } });
    expect(a.headers!.get('retry-after')).toBe('3');
  });

  it('PUT restarts the fault counters, PATCH restarts only the patched fields\' and refuses a bad patch, reset keeps the spec', async () => {
    mock.setFaults({ errors: [{ status: 503, rate: 0.5 }] });
    expect([await chatStatus(), await chatStatus(), await chatStatus()]).toEqual([200, 503, 200]);
    // PUT of the same spec: counting starts over, so the next request is the first of a period again.
    await control(mock.url, 'PUT', '/_mock/faults', { errors: [{ status: 503, rate: 0.5 }] });
    expect(await chatStatus()).toBe(200);
    // A PATCH of another field leaves the errors' count alone (1 counted: the next one fails).
    await control(mock.url, 'PATCH', '/_mock/faults', { latencyMs: 1 });
    expect(await chatStatus()).toBe(503);
    const bad = await control(mock.url, 'PATCH', '/_mock/faults', { capacity: 'lots' });
    expect(bad.status).toBe(400);
    expect((await control(mock.url, 'GET', '/_mock/faults')).body).toEqual({ errors: [{ status: 503, rate: 0.5 }], latencyMs: 1 });
    // reset: counts, log and counters cleared, the spec kept.
    expect(await chatStatus()).toBe(200);
    expect((await control(mock.url, 'POST', '/_mock/reset')).body).toEqual({ ok: true });
    expect((await control(mock.url, 'GET', '/_mock/faults')).body).toEqual({ errors: [{ status: 503, rate: 0.5 }], latencyMs: 1 });
    expect([await chatStatus(), await chatStatus()]).toEqual([200, 503]);
    const stats = (await control(mock.url, 'GET', '/_mock/stats')).body;
    expect(stats).toMatchObject({ total: 2, byStatus: { '200': 1, '503': 1 } });
    expect(stats.perSecond.flatMap((s: { byStatus: Record<string, number> }) => Object.entries(s.byStatus)).reduce((n: number, [, c]: [string, number]) => n + c, 0)).toBe(2);
    expect((await control(mock.url, 'GET', '/_mock/requests')).body.map((e: { status: number }) => e.status)).toEqual([200, 503]);
  });

  it('per-model faults: capacity, latency and stream faults apply to that model alone', async () => {
    await control(mock.url, 'PUT', '/_mock/faults', { models: { 'gpt-4.1': { capacity: 1, latencyMs: 300, stream: { cutAfterChunks: 1 } } } });
    const started = Date.now();
    const [a, b, c] = await Promise.all([
      chatStatus({ model: 'gpt-4.1' }).then((s) => [s, Date.now() - started]),
      sleep(50).then(() => chatStatus({ model: 'gpt-4.1' })).then((s) => [s, Date.now() - started]),
      sleep(50).then(() => chatStatus({ model: 'gpt-4o' })).then((s) => [s, Date.now() - started]),
    ]);
    expect(a![0]).toBe(200);
    expect(a![1]).toBeGreaterThanOrEqual(280);
    expect(b![0]).toBe(429); // that model's one slot is taken
    expect(c![0]).toBe(200); // other models are neither limited nor slowed
    expect(c![1]).toBeLessThan(280);
    const cut = await openai.chat.completions.create({ ...chatBody({ model: 'gpt-4.1' }), stream: true } as OpenAI.ChatCompletionCreateParamsStreaming);
    await expect((async () => {
      for await (const _ of cut) void _;
    })()).rejects.toThrow();
  });

  it('latency grows with load (latencyPerInflightMs) and jitter stays within latencyJitterMs', async () => {
    mock.setFaults({ latencyMs: 200, latencyPerInflightMs: 800 });
    const started = Date.now();
    const times = await Promise.all([0, 40, 80].map((d) => sleep(d).then(() => chatStatus()).then((s) => (expect(s).toBe(200), Date.now() - started))));
    // Arrivals at 0, 40 and 80 ms see 0, 1 and 2 others in flight: done about 200, 1040 and 1880 ms after the start.
    // One in flight would make the first 1000: the bound sits half a second from both, for a loaded machine's lag.
    expect(times[0]!).toBeLessThan(700);
    expect(times[1]!).toBeGreaterThanOrEqual(1_030);
    expect(times[2]!).toBeGreaterThanOrEqual(1_870);

    mock.setFaults({ latencyMs: 100, latencyJitterMs: 100 });
    for (let i = 0; i < 3; i++) {
      const t0 = Date.now();
      expect(await chatStatus()).toBe(200);
      expect(Date.now() - t0).toBeGreaterThanOrEqual(95);
    }
  });

  it('brownouts answer in each family\'s shape; an unknown mode or a negative duration is refused', async () => {
    expect((await control(mock.url, 'POST', '/_mock/brownout', { mode: '429', durationMs: 3000 })).body).toEqual({ ok: true, mode: '429', durationMs: 3000 });
    const a = (await anthropic.messages.create(messagesBody() as Anthropic.MessageCreateParamsNonStreaming).catch((e: unknown) => e)) as InstanceType<typeof Anthropic.APIError>;
    expect(a).toBeInstanceOf(Anthropic.RateLimitError);
    expect(a.error).toMatchObject({ type: 'error', error: { type: 'rate_limit_error' } });
    expect(Number(a.headers!.get('retry-after'))).toBeGreaterThanOrEqual(2);
    await control(mock.url, 'POST', '/_mock/brownout', { mode: '503', durationMs: 3000 });
    await expect(openai.embeddings.create({ model: 'text-embedding-3-small', input: 'x' })).rejects.toBeInstanceOf(OpenAI.InternalServerError);
    expect((await control(mock.url, 'POST', '/_mock/brownout', { mode: 'slow', durationMs: 10 })).status).toBe(400);
    expect((await control(mock.url, 'POST', '/_mock/brownout', { mode: 'hang', durationMs: -1 })).status).toBe(400);
    // The refused calls left the 503 brownout in force.
    expect(await chatStatus()).toBe(503);
    await control(mock.url, 'POST', '/_mock/brownout', { mode: '503', durationMs: 0 });
    expect(await chatStatus()).toBe(200);
  });

  it('"durationMs":0 ends the brownout in force and names it (it answered mode "503" whatever ran), null when none ran', async () => {
    await control(mock.url, 'POST', '/_mock/brownout', { mode: '429', durationMs: 5000 });
    expect(await chatStatus()).toBe(429);
    expect((await control(mock.url, 'POST', '/_mock/brownout', { durationMs: 0 })).body).toEqual({ ok: true, ended: '429', durationMs: 0 });
    expect(await chatStatus()).toBe(200);
    // Nothing in force: nothing ended, whatever mode the call names.
    expect((await control(mock.url, 'POST', '/_mock/brownout', { mode: 'hang', durationMs: 0 })).body).toEqual({ ok: true, ended: null, durationMs: 0 });
    // One whose time ran out is over already.
    await control(mock.url, 'POST', '/_mock/brownout', { mode: '529', durationMs: 50 });
    await sleep(150);
    expect((await control(mock.url, 'POST', '/_mock/brownout', { durationMs: 0 })).body).toEqual({ ok: true, ended: null, durationMs: 0 });
    expect(await chatStatus()).toBe(200);
  });

  it('latency delays answers only: errors come at once; reset leaves a brownout in force; a reset closes before any byte', async () => {
    mock.setFaults({ latencyMs: 400, errors: [{ status: 503, rate: 0.5 }] });
    const timed = async () => {
      const t0 = Date.now();
      return [await chatStatus(), Date.now() - t0] as const;
    };
    const [ok, failed] = [await timed(), await timed()];
    expect(ok[0]).toBe(200);
    expect(ok[1]).toBeGreaterThanOrEqual(380);
    expect(failed[0]).toBe(503);
    expect(failed[1]).toBeLessThan(300);

    mock.setFaults({});
    await control(mock.url, 'POST', '/_mock/brownout', { mode: '503', durationMs: 5000 });
    await control(mock.url, 'POST', '/_mock/reset');
    expect(await chatStatus()).toBe(503);
    await control(mock.url, 'POST', '/_mock/brownout', { durationMs: 0 });
    expect(await chatStatus()).toBe(200);

    mock.setFaults({ resetRate: 1 });
    const err = (await post(mock.url, '/v1/chat/completions', chatBody()).catch((e: unknown) => e)) as { cause?: { code?: string } };
    expect(err.cause?.code).toBe('UND_ERR_SOCKET');
  });

  it('slow first token: the headers and the role chunk come at once, the first content after firstTokenDelayMs', async () => {
    // firstTokenDelayMs 1 s, so that "at once" (under 700 ms) leaves room for a loaded machine's lag.
    mock.setFaults({ stream: { firstTokenDelayMs: 1_000, chunkDelayMs: 30 } });
    const started = Date.now();
    const res = await post(mock.url, '/v1/chat/completions', chatBody({ stream: true }));
    expect(Date.now() - started).toBeLessThan(700);
    const reader = res.body!.getReader();
    const first = new TextDecoder().decode((await reader.read()).value);
    expect(Date.now() - started).toBeLessThan(700);
    expect(JSON.parse(first.slice(6)).choices[0].delta).toMatchObject({ role: 'assistant', content: '' });
    let rest = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      rest += new TextDecoder().decode(value);
    }
    // 1 s before the first content chunk and 30 ms before each of the other four.
    expect(Date.now() - started).toBeGreaterThanOrEqual(1_100);
    expect(rest).toContain('Mock ');
    expect(rest.trimEnd().endsWith('data: [DONE]')).toBe(true);
  });

  it('cuts, malformed events and omitted terminal events fail or end each family\'s stream as documented', async () => {
    mock.setFaults({ stream: { cutAfterChunks: 2 } });
    const anthropicCut = anthropic.messages.stream(messagesBody());
    await expect(anthropicCut.finalMessage()).rejects.toThrow();
    const responsesCut = await openai.responses.create({ model: 'gpt-4o', input: 'hello mock', stream: true });
    const types: string[] = [];
    await expect((async () => {
      for await (const ev of responsesCut) types.push(ev.type);
    })()).rejects.toThrow();
    expect(types.filter((t) => t === 'response.output_text.delta')).toHaveLength(2);
    expect(types).not.toContain('response.completed');

    mock.setFaults({ stream: { malformedAtChunk: 0 } });
    await expect(anthropic.messages.stream(messagesBody()).finalMessage()).rejects.toThrow(/JSON|parse/i);

    mock.setFaults({ stream: { omitDone: true } });
    const anthropicText = await (await post(mock.url, '/v1/messages', messagesBody({ stream: true }))).text();
    expect(anthropicText).toContain('event: message_delta');
    expect(anthropicText).not.toContain('message_stop');
    const responsesText = await (await post(mock.url, '/v1/responses', { model: 'gpt-4o', input: 'x', stream: true })).text();
    expect(responsesText).toContain('response.output_item.done');
    expect(responsesText).not.toContain('response.completed');
  });

  it('capacity holds a hung request\'s slot and hangs answer nothing until the client leaves', async () => {
    mock.setFaults({ capacity: 1, hangRate: 0.5 });
    // The first request is answered, the second hangs and keeps its slot: the third is over capacity.
    expect(await chatStatus()).toBe(200);
    const ac = new AbortController();
    const hung = post(mock.url, '/v1/chat/completions', chatBody(), {}, ac.signal).catch((e: unknown) => e);
    await expect.poll(() => mock.stats().inflight).toBe(1);
    expect(await chatStatus()).toBe(429);
    ac.abort();
    expect(await hung).toBeInstanceOf(Error);
    await expect.poll(() => mock.stats().inflight).toBe(0);
    expect((await control(mock.url, 'GET', '/_mock/stats')).body.byStatus).toEqual({ '200': 1, '429': 1, hang: 1 });
  });
});

describe('wire fidelity with the real APIs', () => {
  let mock: MockServer;
  beforeAll(async () => {
    mock = await startMock({ quiet: true, faults: { requestsPerMinute: 50 } });
  });
  afterAll(async () => {
    await mock.close();
  });

  it('sends the Messages SSE sequence: message_start, content_block_start, ping, deltas, content_block_stop, message_delta with usage, message_stop', async () => {
    const text = await (await post(mock.url, '/v1/messages', messagesBody({ stream: true }))).text();
    const events = [...text.matchAll(/^event: (\S+)\ndata: (.*)$/gm)].map((m) => ({ name: m[1]!, data: JSON.parse(m[2]!) as Record<string, any> }));
    expect(events.every((e) => e.data['type'] === e.name)).toBe(true);
    const names = events.map((e) => e.name);
    expect(names.slice(0, 3)).toEqual(['message_start', 'content_block_start', 'ping']);
    expect(names.slice(-3)).toEqual(['content_block_stop', 'message_delta', 'message_stop']);
    expect(events[0]!.data['message']).toMatchObject({ type: 'message', role: 'assistant', content: [], stop_reason: null, usage: { input_tokens: expect.any(Number), output_tokens: expect.any(Number) } });
    expect(events.at(-2)!.data).toMatchObject({ delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: expect.any(Number) } });
  });

  it('advertises the quota on /v1/messages in Anthropic\'s anthropic-ratelimit-* headers, not OpenAI\'s', async () => {
    const res = await post(mock.url, '/v1/messages', messagesBody());
    await res.arrayBuffer();
    expect(res.headers.get('request-id')).toMatch(/^req_/);
    expect(res.headers.get('anthropic-ratelimit-requests-limit')).toBe('50');
    expect(Number(res.headers.get('anthropic-ratelimit-requests-remaining'))).toBeLessThan(50);
    const reset = Date.parse(res.headers.get('anthropic-ratelimit-requests-reset')!);
    expect(reset - Date.now()).toBeGreaterThan(-1000);
    expect(reset - Date.now()).toBeLessThanOrEqual(61_000);
    expect([...res.headers.keys()].filter((h) => h.startsWith('x-ratelimit-') || h.startsWith('openai-'))).toEqual([]);
    // The same on an error, where a gateway reads them for its wait.
    mock.setFaults({ requestsPerMinute: 50, errors: [{ status: 529 }] });
    const err = await post(mock.url, '/v1/messages', messagesBody());
    await err.arrayBuffer();
    expect(err.headers!.get('anthropic-ratelimit-requests-limit')).toBe('50');
    expect(err.headers!.get('x-ratelimit-limit-requests')).toBeNull();
    mock.setFaults({ requestsPerMinute: 50 });
  });

  it('returns embeddings of the `dimensions` asked for, as text-embedding-3 models do', async () => {
    const openai = new OpenAI({ baseURL: `${mock.url}/v1`, apiKey: 'k', maxRetries: 0 });
    const e = await openai.embeddings.create({ model: 'text-embedding-3-small', input: ['a', 'b'], dimensions: 256 });
    expect(e.data.map((d) => d.embedding.length)).toEqual([256, 256]);
    const norm = Math.hypot(...e.data[0]!.embedding);
    expect(norm).toBeCloseTo(1, 3);
    const floats = await openai.embeddings.create({ model: 'text-embedding-3-small', input: 'a', dimensions: 256, encoding_format: 'float' });
    expect(floats.data[0]!.embedding).toEqual(e.data[0]!.embedding);
    // Without dimensions, the mock's own 8.
    expect((await openai.embeddings.create({ model: 'text-embedding-3-small', input: 'a' })).data[0]!.embedding).toHaveLength(8);
    await expect(openai.embeddings.create({ model: 'text-embedding-3-small', input: 'a', dimensions: 0 })).rejects.toMatchObject({ status: 400, param: 'dimensions' });
  });
});
