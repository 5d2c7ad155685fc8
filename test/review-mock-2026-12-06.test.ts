// Review of the bundled mock provider as outside teams drive it from their failure-scenario suites, with only the README
// to go by: a fault spec, a flag or a brownout that says something other than what was meant is refused with a clear
// message (it used to be kept and ignored, or read as 0: the scenario ran without the fault it asked for), the quota
// headers are written as OpenAI writes them, and the official SDKs pointed directly at the mock read every status and
// every fault as the real APIs'.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import type { FaultSpec, MockServer } from '../src/mock/server.ts';
import { mockWithSdks } from './helpers/mock-sdks.ts';
import { mockCli } from './helpers/mock-cli.ts';

const messages = [{ role: 'user' as const, content: 'hello mock' }];
const chat = { model: 'gpt-4o', messages };
const ask = { model: 'claude-mock', max_tokens: 64, messages };
const control = async (url: string, method: string, path: string, body?: unknown) => {
  const res = await fetch(url + path, { method, ...(body === undefined ? {} : { body: typeof body === 'string' ? body : JSON.stringify(body) }) });
  return { status: res.status, body: (await res.json()) as any };
};

describe('the mock alone, with the official SDKs', () => {
  let mock: MockServer;
  let openai: OpenAI;
  let anthropic: Anthropic;
  const sdks = mockWithSdks();
  beforeAll(() => void ({ mock, openai, anthropic } = sdks));
  afterEach(() => void vi.useRealTimers());

  it('refuses with 400, naming it, a misspelt or out-of-range field inside a stream, an error rule or a model, and keeps the spec', async () => {
    const spec: FaultSpec = { errors: [{ status: 503, rate: 0.5 }] };
    await control(mock.url, 'PUT', '/_mock/faults', spec);
    const refused: Array<[unknown, RegExp]> = [
      // A misspelt field in a stream or a rule: the cut, the rate or the wait hint the scenario asked for never came.
      [{ stream: { cutAfterChunk: 2 } }, /stream.*"cutAfterChunk".*did you mean "cutAfterChunks"/],
      [{ errors: [{ status: 503, rat: 0.3 }] }, /error rule.*"rat".*did you mean "rate"/],
      [{ errors: [{ status: 429, header: { 'retry-after': '2' } }] }, /error rule.*"header".*did you mean "headers"/],
      [{ models: { 'gpt-4o': { stream: { stalAfterChunks: 1 } } } }, /"stalAfterChunks".*did you mean "stallAfterChunks"/],
      // Negative delays and counts, as the top-level ones are refused.
      [{ stream: { chunkDelayMs: -5 } }, /stream\.chunkDelayMs/],
      [{ stream: { cutAfterChunks: -1 } }, /stream\.cutAfterChunks/],
      [{ stream: { firstTokenDelayMs: '100' } }, /stream\.firstTokenDelayMs/],
      [{ errors: [{ status: 503, times: -1 }] }, /times/],
      [{ errors: [{ status: 503, headers: 'retry-after: 2' }] }, /headers/],
      // A share above 1 is no share, as an error rule's rate over 1 is refused; a count of requests is whole.
      [{ resetRate: 1.5 }, /resetRate/],
      [{ hangRate: 7 }, /hangRate/],
      [{ capacity: 2.5 }, /capacity/],
      [{ requestsPerMinute: -5 }, /requestsPerMinute/],
      [{ capacityHeaders: 5 }, /capacityHeaders/],
      [{ models: [] }, /models/],
    ];
    for (const [bad, message] of refused) {
      const put = await control(mock.url, 'PUT', '/_mock/faults', bad);
      expect(put.status, JSON.stringify(bad)).toBe(400);
      expect(put.body.error, JSON.stringify(bad)).toMatch(message);
      expect((await control(mock.url, 'PATCH', '/_mock/faults', bad)).status, JSON.stringify(bad)).toBe(400);
    }
    expect(mock.faults()).toEqual(spec);
    // What the README documents is still taken, in full.
    const full: FaultSpec = {
      resetRate: 1, hangRate: 0, capacity: 3, requestsPerMinute: 60, capacityHeaders: { 'retry-after': '1' },
      errors: [{ status: 429, rate: 0.5, firstAttemptsOnly: true, code: 'c', type: 't', message: 'm', param: null, headers: { 'retry-after-ms': '10' }, times: 2 }],
      stream: { firstTokenDelayMs: 1, chunkDelayMs: 0, chunks: 3, cutAfterChunks: 2, errorAfterChunks: 1, stallAfterChunks: 2, malformedAtChunk: 0, omitDone: true, pingBeforeFirstToken: true },
      models: { 'gpt-4o': { stream: { chunks: 1 } } },
    };
    expect(await control(mock.url, 'PUT', '/_mock/faults', full)).toEqual({ status: 200, body: full });
  });

  it('POST /_mock/brownout refuses a misspelt field or a duration that is no number, rather than browning out for 10 s', async () => {
    for (const bad of [{ mode: 'hang', duration: 100 }, { mode: 'hang', durationMs: '' }, { durationMs: true }, { durationMs: '100' }]) {
      const res = await control(mock.url, 'POST', '/_mock/brownout', bad);
      expect(res.status, JSON.stringify(bad)).toBe(400);
    }
    // Nothing browned out: an answer comes.
    expect((await openai.chat.completions.create(chat)).choices[0]!.message.content).toMatch(/^Mock answer/);
    // The documented bodies still work.
    expect(await control(mock.url, 'POST', '/_mock/brownout', { mode: '429', durationMs: 5000 })).toEqual({ status: 200, body: { ok: true, mode: '429', durationMs: 5000 } });
    expect(await control(mock.url, 'POST', '/_mock/brownout', { durationMs: 0 })).toEqual({ status: 200, body: { ok: true, ended: '429', durationMs: 0 } });
  });

  it('a PUT /_mock/faults body over the size limit is refused with 413, not read as an empty spec that clears every fault', async () => {
    const spec: FaultSpec = { latencyMs: 5, errors: [{ status: 503, rate: 0.5 }] };
    mock.setFaults(spec);
    const huge = JSON.stringify({ latencyMs: 1, pad: 'x'.repeat(17 * 1024 * 1024) });
    const res = await fetch(`${mock.url}/_mock/faults`, { method: 'PUT', body: huge });
    expect(res.status).toBe(413);
    await res.arrayBuffer();
    expect(mock.faults()).toEqual(spec);
  });

  it('advertises x-ratelimit-reset-requests as a Go duration, as OpenAI writes it: 500ms, not 0.5s', async () => {
    // Half a second before a minute ends: the advertised quota resets then.
    vi.useFakeTimers({ toFake: ['Date'] });
    vi.setSystemTime(new Date('2026-12-06T10:00:59.500Z'));
    const res = await fetch(`${mock.url}/v1/chat/completions`, { method: 'POST', body: JSON.stringify(chat) });
    await res.arrayBuffer();
    expect(res.headers.get('x-ratelimit-reset-requests')).toBe('500ms');
    vi.setSystemTime(new Date('2026-12-06T10:00:00.000Z'));
    const whole = await fetch(`${mock.url}/v1/chat/completions`, { method: 'POST', body: JSON.stringify(chat) });
    await whole.arrayBuffer();
    expect(whole.headers.get('x-ratelimit-reset-requests')).toBe('1m0s');
  });

  it('each error status reaches both SDKs as their own error class, with its status, code and wait hint', async () => {
    const classes: Array<[number, unknown, unknown]> = [
      [400, OpenAI.BadRequestError, Anthropic.BadRequestError],
      [401, OpenAI.AuthenticationError, Anthropic.AuthenticationError],
      [403, OpenAI.PermissionDeniedError, Anthropic.PermissionDeniedError],
      [404, OpenAI.NotFoundError, Anthropic.NotFoundError],
      [409, OpenAI.ConflictError, Anthropic.ConflictError],
      [422, OpenAI.UnprocessableEntityError, Anthropic.UnprocessableEntityError],
      [429, OpenAI.RateLimitError, Anthropic.RateLimitError],
      [500, OpenAI.InternalServerError, Anthropic.InternalServerError],
      [503, OpenAI.InternalServerError, Anthropic.InternalServerError],
      [529, OpenAI.InternalServerError, Anthropic.OverloadedError],
      [418, OpenAI.APIError, Anthropic.APIError],
    ];
    for (const [status, openaiClass, anthropicClass] of classes) {
      mock.setFaults({ errors: [{ status, code: 'my_code', headers: { 'retry-after-ms': '1500' } }] });
      const o = (await openai.chat.completions.create(chat).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
      expect(o, String(status)).toBeInstanceOf(openaiClass as typeof OpenAI.APIError);
      expect(o).toMatchObject({ status, code: 'my_code' });
      expect(o.headers?.get('retry-after-ms')).toBe('1500');
      const a = (await anthropic.messages.create(ask).catch((e: unknown) => e)) as InstanceType<typeof Anthropic.APIError>;
      expect(a, String(status)).toBeInstanceOf(anthropicClass as typeof Anthropic.APIError);
      expect(a.status).toBe(status);
      expect(a.requestID).toMatch(/^req_/);
    }
  });

  it('messages of the wrong JSON type is refused in OpenAI\'s words and code (invalid_type), so a suite matching on code sees it', async () => {
    for (const [value, got] of [['nope', 'a string'], [{ role: 'user' }, 'an object'], [3, 'a number']] as const) {
      const err = await openai.chat.completions.create({ model: 'gpt-4o', messages: value as never }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(OpenAI.BadRequestError);
      expect((err as InstanceType<typeof OpenAI.BadRequestError>).error).toEqual({
        message: `Invalid type for 'messages': expected an array of objects, but got ${got} instead.`,
        type: 'invalid_request_error', param: 'messages', code: 'invalid_type',
      });
    }
  });

  it('parallel tool calls stream through both SDKs\' helpers whole, with usage; a cut stream counts as its 200, a client gone mid-stream as aborted', async () => {
    const tools = ['get_weather', 'get_time'].map((name) => ({ type: 'function' as const, function: { name, parameters: { type: 'object', properties: {} } } }));
    const o = await openai.chat.completions.stream({ ...chat, tools, stream_options: { include_usage: true } }).finalChatCompletion();
    expect(o.choices[0]).toMatchObject({ finish_reason: 'tool_calls', message: { tool_calls: [{ function: { name: 'get_weather', arguments: '{"x":1}' } }, { function: { name: 'get_time', arguments: '{"x":1}' } }] } });
    expect(o.usage).toMatchObject({ completion_tokens: expect.any(Number), prompt_tokens: expect.any(Number) });
    const a = await anthropic.messages.stream({ ...ask, tools: [{ name: 'a', input_schema: { type: 'object' } }, { name: 'b', input_schema: { type: 'object' } }] }).finalMessage();
    expect(a).toMatchObject({ stop_reason: 'tool_use', content: [{ type: 'tool_use', name: 'a', input: { x: 1 } }, { type: 'tool_use', name: 'b', input: { x: 1 } }] });
    expect(a.usage.output_tokens).toBeGreaterThan(0);

    mock.reset();
    mock.setFaults({ stream: { cutAfterChunks: 1 } });
    await expect(openai.chat.completions.stream({ ...chat }).finalChatCompletion()).rejects.toThrow();
    mock.setFaults({ stream: { stallAfterChunks: 1 } });
    const ac = new AbortController();
    const stalled = await openai.chat.completions.create({ ...chat, stream: true }, { signal: ac.signal });
    const it = stalled[Symbol.asyncIterator]();
    await it.next();
    ac.abort();
    await it.next().catch(() => undefined);
    await expect.poll(() => mock.requests().filter((r) => r.endedAt !== undefined).length, { timeout: 10_000 }).toBe(2);
    const [cut, gone] = mock.requests();
    expect(cut).toMatchObject({ status: 200, aborted: false, chunksSent: 1 });
    expect(gone).toMatchObject({ status: 200, aborted: true, chunksSent: 1 });
    const stats = mock.stats();
    expect(stats).toMatchObject({ total: 2, aborted: 1, byStatus: { '200': 2 }, inflight: 0 });
    expect(stats.perSecond.reduce((n, s) => n + (s.byStatus['200'] ?? 0), 0)).toBe(2);
  });
});

describe('the flags (npm run mock)', () => {
  const cli = mockCli();
  const refused = async (args: string[], message: RegExp) => {
    const bad = await cli(['--quiet', ...args]);
    if (bad.url !== undefined) bad.child.kill('SIGKILL');
    expect(bad.url, `${args.join(' ')} started: ${bad.out()}`).toBeUndefined();
    const [code] = (await bad.exited) as [number];
    expect(code).toBe(1);
    expect(bad.out()).toMatch(message);
    expect(bad.out()).toContain('usage: npm run mock');
  };

  it('a flag value that is empty, has a part too many or is out of range fails with a message naming it, not read as 0', async () => {
    await refused(['--latency-ms='], /--latency-ms must be a non-negative number, got ""/);
    await refused(['--error', '503:'], /--error expects STATUS:RATE.*"503:"/);
    await refused(['--error', '503:0.3:9'], /--error expects STATUS:RATE.*"503:0\.3:9"/);
    await refused(['--reset-rate', '1.5'], /resetRate/);
  }, 60_000);

  it('--faults that is no JSON object, or holds a misspelt stream field, fails naming the flag', async () => {
    await refused(['--faults', '{bad'], /--faults: .*JSON/);
    await refused(['--faults', 'null', '--latency-ms', '5'], /--faults: fault spec must be a JSON object/);
    await refused(['--faults', JSON.stringify({ stream: { cutAfterChunk: 2 } })], /did you mean "cutAfterChunks"/);
  }, 60_000);
});
