// Third-party failure-scenario suite 44: an outside QA team's suite, written from the README alone, on the API
// surfaces other than chat completions, driven with the official SDKs (`openai` 6.x, `@anthropic-ai/sdk`) against the
// bundled mock provider over real HTTP on 127.0.0.1, faults set at run time through its control endpoint
// (PUT /_mock/faults) and upstream attempts read back from GET /_mock/stats:
//  1. The Responses API (`responses.create`, whole and `stream: true`, with function tools and previous_response_id):
//     503 bursts and wait hints retried, a stream cut before its first output failed over, one cut after it ended with
//     an error the client sees (never a clean end), a slow first token failed over, a malformed event, a stream
//     without its terminal `response.completed`.
//  2. Embeddings (the SDK's default base64 encoding, arrays of inputs, `dimensions`): each kind of wait hint on a 429
//     (retry-after-ms, retry-after seconds, retry-after HTTP-date, x-ratelimit-reset-requests with remaining 0), a hint
//     past maxWaitHintMs passed to the client and the hold-off it starts, a 503 burst that outlasts the retries.
//  3. Legacy completions, whole and streamed: a wait hint, a cut after the first output, a stream without [DONE].
//  4. models.list()/models.retrieve() in both SDKs' shapes, a provider listing that fails twice.
//  5. The Anthropic SDK: messages.create with tool use under 529s, messages.stream() cut, slow first token failed over
//     to a second account, an error event before the first output, messages.countTokens retried.
// The mock's Responses API answers text whatever the function tools (it emits no function_call items), so the tool
// scenarios there check that a request with tools and previous_response_id is served, not the call's streaming.
// Found here: no gateway bug. One test was wrong at first: a slow first token on an Anthropic stream with tools is not
// failed over, because the tool_use block opens at once and counts as output (Failover and API families); kept as
// such. Not covered by the README: GET /v1/models answers 200 with an empty list when the provider's listing fails on
// the first fetch (no last good list to serve), so a client cannot tell an outage from no models.
import { setTimeout as sleep } from 'node:timers/promises';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import type { MockServer } from '../src/mock/server.ts';
import { mockControl } from './helpers/mock-control.ts';
import { sdkError } from './helpers/openai-error.ts';
import { useExtraMocks, useGateways } from './helpers/stack.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();

const KEY = 'sk-tp44-provider-0123456789';
const CLAUDE = 'claude-haiku-4-5';
const EMBED = 'text-embedding-3-small';
const tools = [
  { type: 'function' as const, name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } }, strict: false },
];

interface Stats {
  total: number;
  byStatus: Record<string, number>;
}
async function mockStats(m: MockServer): Promise<Stats> {
  return (await (await fetch(`${m.url}/_mock/stats`)).json()) as Stats;
}
const faults = (m: MockServer, spec: unknown) => mockControl(m, 'PUT', 'faults', spec);

/**
 * One gateway: every non-chat API on the primary mock `p`, with the healthy mock `b` as the backup where given. Fast
 * backoff, a budget that never refuses and no breaker, so what is counted is the retry loop alone (unless `holdOff`).
 */
async function gateway(p: MockServer, b?: MockServer, opts: { logs?: string[]; firstTokenMs?: number; idleMs?: number; maxWaitHintMs?: number } = {}): Promise<string> {
  const backup = (fam: 'o' | 'a') => (b ? `, { provider: ${fam === 'o' ? 'backup' : 'claude-backup'} }` : '');
  const timeouts = `timeouts: { connectMs: 2000, firstTokenMs: ${opts.firstTokenMs ?? 5000}, idleMs: ${opts.idleMs ?? 3000} }`;
  const route = (name: string, path: string, fam: 'o' | 'a') => `
  - name: ${name}
    match: { path: ${path} }
    targets: [ { provider: ${fam === 'o' ? 'primary' : 'claude'} }${backup(fam)} ]
    timeoutMs: 20000
    retry: { maxAttempts: 3, backoff: { baseMs: 50, capMs: 200 }, maxWaitHintMs: ${opts.maxWaitHintMs ?? 20000} }
    budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 }
    park: false`;
  const yaml = `
server: { host: 127.0.0.1, port: 0 }
providers:
  primary: { family: openai, baseUrl: "${p.url}/v1", apiKey: ${KEY}, breaker: false, ${timeouts} }
  claude: { family: anthropic, baseUrl: "${p.url}", apiKey: ${KEY}, breaker: false, ${timeouts} }
${
  b
    ? `  backup: { family: openai, baseUrl: "${b.url}/v1", apiKey: ${KEY}, breaker: false }
  claude-backup: { family: anthropic, baseUrl: "${b.url}", apiKey: ${KEY}, breaker: false }`
    : ''
}
routes:${route('responses', '/v1/responses', 'o')}${route('embeddings', '/v1/embeddings', 'o')}${route('completions', '/v1/completions', 'o')}${route(
    'messages',
    '/v1/messages',
    'a',
  )}${route('count-tokens', '/v1/messages/count_tokens', 'a')}
`;
  return startGateway(parseConfig(yaml, 'suite44.yaml', {}), { logs: opts.logs });
}

const openai = (url: string, maxRetries = 0) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sk-tp44-client', maxRetries, logLevel: 'off' });
const anthropic = (url: string, maxRetries = 0) => new Anthropic({ baseURL: url, apiKey: 'sk-tp44-client', maxRetries, logLevel: 'off' });

/** Every event of an openai SDK stream, and what it threw at the end (undefined when it ended cleanly). */
async function drain<T>(stream: AsyncIterable<T>): Promise<{ events: T[]; thrown: unknown }> {
  const events: T[] = [];
  try {
    for await (const e of stream) events.push(e);
    return { events, thrown: undefined };
  } catch (thrown) {
    return { events, thrown };
  }
}

describe('the Responses API through the gateway under faults', () => {
  it('retries a 503 burst on a whole response with function tools and says so in x-stormgate-attempts', async () => {
    const p = await startMock();
    const url = await gateway(p);
    await faults(p, { errors: [{ status: 503, times: 2 }] });
    const { data, response } = await openai(url).responses.create({ model: 'gpt-4o', input: 'weather in Paris?', tools }).withResponse();
    expect(data.object).toBe('response');
    expect(data.status).toBe('completed');
    expect(data.output.length).toBeGreaterThan(0);
    expect(response.headers.get('x-stormgate-attempts')).toBe('3');
    expect(response.headers.get('x-stormgate-route')).toBe('responses');
    expect(response.headers.get('x-stormgate-target')).toMatch(/^primary/);
    expect(response.headers.get('x-stormgate-request-id')).toBeTruthy();
    expect((await mockStats(p)).byStatus).toEqual({ '200': 1, '503': 2 });
  });

  it('serves a turn that continues with previous_response_id and a function_call_output after a 429 with retry-after-ms', async () => {
    const p = await startMock();
    const url = await gateway(p);
    const client = openai(url);
    const first = await client.responses.create({ model: 'gpt-4o', input: 'weather in Paris?', tools });
    await faults(p, { errors: [{ status: 429, times: 1, code: 'rate_limit_exceeded', headers: { 'retry-after-ms': '400' } }] });
    const t0 = Date.now();
    const { data, response } = await client.responses
      .create({ model: 'gpt-4o', previous_response_id: first.id, tools, input: [{ type: 'function_call_output', call_id: 'call_1', output: '{"temp":21}' }] })
      .withResponse();
    expect(Date.now() - t0).toBeGreaterThanOrEqual(380);
    expect(data.status).toBe('completed');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
  });

  it('streams a response after a 429 with retry-after seconds, events in order and response.completed last', async () => {
    const p = await startMock();
    const url = await gateway(p);
    await faults(p, { errors: [{ status: 429, times: 1, headers: { 'retry-after': '1' } }] });
    const t0 = Date.now();
    const { data: stream, response } = await openai(url).responses.create({ model: 'gpt-4o', input: 'hi', tools, stream: true }).withResponse();
    const { events, thrown } = await drain(stream);
    expect(thrown).toBeUndefined();
    expect(Date.now() - t0).toBeGreaterThanOrEqual(950);
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(response.headers.get('content-type')).toMatch(/^text\/event-stream/);
    expect(events[0]?.type).toBe('response.created');
    expect(events.at(-1)?.type).toBe('response.completed');
    const seq = events.map((e) => e.sequence_number);
    expect(seq).toEqual([...seq].sort((a, b) => a - b));
    expect((await mockStats(p)).byStatus).toEqual({ '200': 1, '429': 1 });
  });

  it('fails a stream cut before its first output over to the backup, which answers it whole', async () => {
    const p = await startMock();
    const b = await startMock();
    const url = await gateway(p, b);
    await faults(p, { stream: { cutAfterChunks: 0 } });
    const { data: stream, response } = await openai(url).responses.create({ model: 'gpt-4o', input: 'hi', stream: true }).withResponse();
    const { events, thrown } = await drain(stream);
    expect(thrown).toBeUndefined();
    expect(events.at(-1)?.type).toBe('response.completed');
    expect(response.headers.get('x-stormgate-target')).toMatch(/^backup/);
    expect(response.headers.get('x-stormgate-fallback')).toBeTruthy();
    expect((await mockStats(b)).total).toBe(1);
    expect((await mockStats(p)).total).toBeGreaterThanOrEqual(1);
  });

  it('ends a stream cut after its first output with an error the client sees, and never sends it again', async () => {
    const p = await startMock();
    const b = await startMock();
    const url = await gateway(p, b);
    await faults(p, { stream: { cutAfterChunks: 2 } });
    const stream = await openai(url).responses.create({ model: 'gpt-4o', input: 'hi', stream: true });
    const { events, thrown } = await drain(stream);
    const deltas = events.filter((e) => e.type === 'response.output_text.delta');
    expect(deltas.length).toBe(2);
    expect(events.some((e) => e.type === 'response.completed')).toBe(false);
    // The SDK raises the gateway's closing error event (its data carries an `error` object) as an APIError.
    expect(thrown).toBeInstanceOf(OpenAI.APIError);
    expect(((thrown as InstanceType<typeof OpenAI.APIError>).error as { code?: string }).code).toBe('stream_interrupted');
    expect((await mockStats(p)).total).toBe(1);
    expect((await mockStats(b)).total).toBe(0);
  });

  it('ends a stream stalled after its first output with an error event numbered after the last event', async () => {
    // Plain fetch: the SDK raises this event, so its sequence_number is read off the wire.
    const p = await startMock();
    const url = await gateway(p, undefined, { idleMs: 800 });
    await faults(p, { stream: { stallAfterChunks: 1 } });
    const t0 = Date.now();
    const res = await fetch(`${url}/v1/responses`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', input: 'hi', stream: true }),
    });
    expect(res.status).toBe(200);
    const events = (await res.text())
      .split('\n\n')
      .filter((block) => block.includes('data: '))
      .map((block) => ({ event: /^event: (.*)$/m.exec(block)?.[1], data: JSON.parse(/^data: (.*)$/m.exec(block)![1]!) }));
    expect(Date.now() - t0).toBeLessThan(5000);
    const last = events.at(-1)!;
    expect(last.event).toBe('error');
    expect(last.data).toMatchObject({ type: 'error', code: 'stream_interrupted', error: { code: 'stream_interrupted' } });
    expect(last.data.sequence_number).toBe(events.at(-2)!.data.sequence_number + 1);
    expect(events.some((e) => e.event === 'response.completed')).toBe(false);
    expect((await mockStats(p)).total).toBe(1);
  });

  it('fails a slow first token over to the backup with x-stormgate-fallback: timeout', async () => {
    const p = await startMock();
    const b = await startMock();
    const url = await gateway(p, b, { firstTokenMs: 500 });
    await faults(p, { stream: { firstTokenDelayMs: 4000 } });
    const t0 = Date.now();
    const { data: stream, response } = await openai(url).responses.create({ model: 'gpt-4o', input: 'hi', stream: true }).withResponse();
    const { events, thrown } = await drain(stream);
    expect(thrown).toBeUndefined();
    expect(events.at(-1)?.type).toBe('response.completed');
    expect(Date.now() - t0).toBeLessThan(3500);
    expect(response.headers.get('x-stormgate-fallback')).toBe('timeout');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
  });

  it('drops a malformed event after the first output and finishes the stream, logging droppedMalformed', async () => {
    const p = await startMock();
    const logs: string[] = [];
    const url = await gateway(p, undefined, { logs });
    await faults(p, { stream: { malformedAtChunk: 2 } });
    const stream = openai(url).responses.stream({ model: 'gpt-4o', input: 'hi' });
    const final = await stream.finalResponse();
    expect(final.status).toBe('completed');
    expect((await mockStats(p)).total).toBe(1);
    await sleep(100);
    const line = logs.map((l) => JSON.parse(l)).find((l) => l.droppedMalformed !== undefined);
    expect(line?.msg ?? '').toMatch(/malformed/);
  });

  it('fails a malformed event before the first output over to the backup, the client none the wiser', async () => {
    const p = await startMock();
    const b = await startMock();
    const url = await gateway(p, b);
    await faults(p, { stream: { malformedAtChunk: 0 } });
    const { data: stream, response } = await openai(url).responses.create({ model: 'gpt-4o', input: 'hi', stream: true }).withResponse();
    const { events, thrown } = await drain(stream);
    expect(thrown).toBeUndefined();
    expect(events.at(-1)?.type).toBe('response.completed');
    expect(response.headers.get('x-stormgate-target')).toMatch(/^backup/);
    expect((await mockStats(b)).total).toBe(1);
  });

  it('retries an error event before the first output and answers 502 upstream_bad_response when it never stops', async () => {
    const p = await startMock();
    const url = await gateway(p);
    await faults(p, { stream: { errorAfterChunks: 0 } });
    const err = await sdkError(openai(url, 2).responses.create({ model: 'gpt-4o', input: 'hi', stream: true }));
    expect(err.status).toBe(502);
    expect((err.error as { code?: string }).code).toBe('upstream_bad_response');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect((await mockStats(p)).total).toBe(3);
  });

  it('does not let a stream without response.completed look complete', async () => {
    const p = await startMock();
    const url = await gateway(p);
    await faults(p, { stream: { omitDone: true } });
    const stream = await openai(url).responses.create({ model: 'gpt-4o', input: 'hi', stream: true });
    const { events, thrown } = await drain(stream);
    expect(events.some((e) => e.type === 'response.output_text.delta')).toBe(true);
    expect(events.some((e) => e.type === 'response.completed')).toBe(false);
    expect(thrown).toBeInstanceOf(OpenAI.APIError);
    expect(((thrown as InstanceType<typeof OpenAI.APIError>).error as { code?: string }).code).toBe('stream_interrupted');
  });
});

describe('embeddings through the gateway under 429s and 503s', () => {
  it('retries a 503 burst and decodes the default base64 answer of an array input at the asked dimensions', async () => {
    const p = await startMock();
    const url = await gateway(p);
    await faults(p, { errors: [{ status: 503, times: 2 }] });
    const { data, response } = await openai(url).embeddings.create({ model: EMBED, input: ['one', 'two', 'three'], dimensions: 16 }).withResponse();
    expect(data.data.map((d) => d.index)).toEqual([0, 1, 2]);
    for (const d of data.data) {
      expect(d.embedding).toHaveLength(16);
      expect(d.embedding.every((x) => Number.isFinite(x))).toBe(true);
    }
    expect(response.headers.get('x-stormgate-attempts')).toBe('3');
    expect(response.headers.get('content-type')).toMatch(/^application\/json/);
    expect((await mockStats(p)).byStatus).toEqual({ '200': 1, '503': 2 });
  });

  it('waits out a retry-after HTTP-date', async () => {
    const p = await startMock();
    const url = await gateway(p);
    const at = new Date(Date.now() + 2500).toUTCString();
    await faults(p, { errors: [{ status: 429, times: 1, headers: { 'retry-after': at } }] });
    const t0 = Date.now();
    const { response } = await openai(url).embeddings.create({ model: EMBED, input: 'x' }).withResponse();
    expect(Date.now() - t0).toBeGreaterThanOrEqual(900);
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
  });

  it('waits out x-ratelimit-reset-requests when remaining-requests is 0', async () => {
    const p = await startMock();
    const url = await gateway(p);
    await faults(p, {
      errors: [{ status: 429, times: 1, code: 'rate_limit_exceeded', headers: { 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '600ms' } }],
    });
    const t0 = Date.now();
    const { response } = await openai(url).embeddings.create({ model: EMBED, input: 'x' }).withResponse();
    expect(Date.now() - t0).toBeGreaterThanOrEqual(580);
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
  });

  it('passes a hint past maxWaitHintMs to the SDK as a 429 and holds the provider off for the next call', async () => {
    const p = await startMock();
    const url = await gateway(p, undefined, { maxWaitHintMs: 1000 });
    await faults(p, { errors: [{ status: 429, code: 'rate_limit_exceeded', headers: { 'retry-after': '30' } }] });
    const err = await sdkError(openai(url).embeddings.create({ model: EMBED, input: ['a', 'b'] }));
    expect(err).toBeInstanceOf(OpenAI.RateLimitError);
    expect(err.status).toBe(429);
    expect(Number(err.headers?.get('retry-after'))).toBeGreaterThanOrEqual(30);
    expect(err.headers?.get('x-should-retry')).toBe('true');
    expect((await mockStats(p)).total).toBe(1);
    const again = await sdkError(openai(url).embeddings.create({ model: EMBED, input: 'c' }));
    expect(again.status).toBe(429);
    expect((again.error as { code?: string }).code).toBe('provider_held_off');
    expect((await mockStats(p)).total).toBe(1);
  });

  it('answers a 503 burst past the retries once: the SDK with maxRetries 2 does not multiply it', async () => {
    const p = await startMock();
    const url = await gateway(p);
    await faults(p, { errors: [{ status: 503 }] });
    const err = await sdkError(openai(url, 2).embeddings.create({ model: EMBED, input: 'x' }));
    expect(err).toBeInstanceOf(OpenAI.InternalServerError);
    expect(err.status).toBe(503);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.headers?.get('x-stormgate-attempts')).toBe('3');
    expect((await mockStats(p)).byStatus).toEqual({ '503': 3 });
  });
});

describe('legacy completions through the gateway', () => {
  it('retries a 429 with retry-after-ms on a whole completion', async () => {
    const p = await startMock();
    const url = await gateway(p);
    await faults(p, { errors: [{ status: 429, times: 1, headers: { 'retry-after-ms': '300' } }] });
    const { data, response } = await openai(url).completions.create({ model: 'gpt-4o', prompt: 'Say hi', max_tokens: 50 }).withResponse();
    expect(data.choices[0]?.text.length).toBeGreaterThan(0);
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(response.headers.get('x-stormgate-route')).toBe('completions');
  });

  it('raises a streamed completion cut after its first output as an APIError, sent upstream once', async () => {
    const p = await startMock();
    const url = await gateway(p);
    await faults(p, { stream: { cutAfterChunks: 2 } });
    const stream = await openai(url).completions.create({ model: 'gpt-4o', prompt: 'Say hi', stream: true });
    const { events, thrown } = await drain(stream);
    expect(events.map((e) => e.choices[0]?.text ?? '').join('').length).toBeGreaterThan(0);
    expect(thrown).toBeInstanceOf(OpenAI.APIError);
    expect(String((thrown as Error).message)).toMatch(/stream_interrupted|interrupted|cut|closed/i);
    expect((await mockStats(p)).total).toBe(1);
  });

  it('retries a streamed completion whose first token is too slow on its only target, then answers 504', async () => {
    const p = await startMock();
    const url = await gateway(p, undefined, { firstTokenMs: 300 });
    await faults(p, { stream: { firstTokenDelayMs: 2000 } });
    const t0 = Date.now();
    const err = await sdkError(openai(url, 2).completions.create({ model: 'gpt-4o', prompt: 'Say hi', stream: true }));
    expect(err.status).toBe(504);
    expect((err.error as { code?: string }).code).toBe('upstream_timeout');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(Date.now() - t0).toBeLessThan(6000);
    expect((await mockStats(p)).total).toBe(3);
  });

  it('ends a finished completion stream without [DONE] cleanly', async () => {
    const p = await startMock();
    const url = await gateway(p);
    await faults(p, { stream: { omitDone: true } });
    const stream = await openai(url).completions.create({ model: 'gpt-4o', prompt: 'Say hi', stream: true });
    const { events, thrown } = await drain(stream);
    expect(thrown).toBeUndefined();
    expect(events.some((e) => e.choices[0]?.finish_reason === 'stop')).toBe(true);
  });
});

describe('models through the gateway', () => {
  it('lists and retrieves models with the openai SDK after the provider listing fails twice', async () => {
    const p = await startMock();
    const url = await gateway(p);
    await faults(p, { errors: [{ status: 503, times: 2 }] });
    const ids = [];
    for await (const m of openai(url).models.list()) ids.push(m.id);
    expect(ids).toContain('gpt-4o');
    const one = await openai(url).models.retrieve('gpt-4o');
    expect(one).toMatchObject({ id: 'gpt-4o', object: 'model' });
    const err = await sdkError(openai(url).models.retrieve('no-such-model-tp44'));
    expect(err).toBeInstanceOf(OpenAI.NotFoundError);
    expect((err.error as { code?: string }).code).toBe('model_not_found');
  });

  it('lists only the Claude models in the Anthropic shape for the Anthropic SDK', async () => {
    const p = await startMock();
    const url = await gateway(p);
    const page = await anthropic(url).models.list();
    const ids = page.data.map((m) => m.id);
    expect(ids).toContain(CLAUDE);
    expect(ids.every((id) => id.startsWith('claude'))).toBe(true);
    expect(page.data[0]).toMatchObject({ type: 'model' });
    const one = await anthropic(url).models.retrieve(CLAUDE);
    expect(one.id).toBe(CLAUDE);
    const err = await anthropic(url).models.retrieve('claude-none-tp44').then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(Anthropic.NotFoundError);
  });
});

describe('the Anthropic SDK on /v1/messages under faults', () => {
  const weather = [{ name: 'get_weather', input_schema: { type: 'object' as const, properties: { city: { type: 'string' } } } }];

  it('retries 529 overloaded twice and returns the tool_use block', async () => {
    const p = await startMock();
    const url = await gateway(p);
    await faults(p, { errors: [{ status: 529, times: 2 }] });
    const { data, response } = await anthropic(url)
      .messages.create({ model: CLAUDE, max_tokens: 200, tools: weather, messages: [{ role: 'user', content: 'Weather in Oslo?' }] })
      .withResponse();
    expect(data.stop_reason).toBe('tool_use');
    expect(data.content.some((c) => c.type === 'tool_use' && c.name === 'get_weather')).toBe(true);
    expect(response.headers.get('x-stormgate-attempts')).toBe('3');
    expect((await mockStats(p)).byStatus).toEqual({ '200': 1, '529': 2 });
  });

  it('raises a messages.stream() cut after its first output, never retried', async () => {
    const p = await startMock();
    const url = await gateway(p);
    await faults(p, { stream: { cutAfterChunks: 2 } });
    const stream = anthropic(url).messages.stream({ model: CLAUDE, max_tokens: 200, messages: [{ role: 'user', content: 'Tell me a story' }] });
    let text = '';
    stream.on('text', (t) => (text += t));
    const err = await stream.finalMessage().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(Anthropic.AnthropicError);
    expect(text.length).toBeGreaterThan(0);
    expect((await mockStats(p)).total).toBe(1);
  });

  it('fails a slow first token over to the second account', async () => {
    const p = await startMock();
    const b = await startMock();
    const url = await gateway(p, b, { firstTokenMs: 500 });
    await faults(p, { stream: { firstTokenDelayMs: 4000 } });
    const t0 = Date.now();
    const { data: stream, response } = await anthropic(url)
      .messages.stream({ model: CLAUDE, max_tokens: 200, messages: [{ role: 'user', content: 'Tell me a story' }] })
      .withResponse();
    const msg = await stream.finalMessage();
    expect(msg.stop_reason).toBe('end_turn');
    expect(Date.now() - t0).toBeLessThan(3500);
    expect(response.headers.get('x-stormgate-fallback')).toBe('timeout');
    expect(response.headers.get('x-stormgate-target')).toMatch(/^claude-backup/);
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
  });

  it('counts an opened tool_use block as the first output: a slow tool input is not failed over', async () => {
    // README (Failover and API families): "a block that opens with its content such as a tool_use" is output, so
    // past it only idleMs bounds the gaps, not firstTokenMs.
    const p = await startMock();
    const b = await startMock();
    const url = await gateway(p, b, { firstTokenMs: 500 });
    await faults(p, { stream: { firstTokenDelayMs: 1200 } });
    const { data: stream, response } = await anthropic(url)
      .messages.stream({ model: CLAUDE, max_tokens: 200, tools: weather, messages: [{ role: 'user', content: 'Weather in Oslo?' }] })
      .withResponse();
    const msg = await stream.finalMessage();
    expect(msg.stop_reason).toBe('tool_use');
    expect(msg.content.find((c) => c.type === 'tool_use')).toMatchObject({ name: 'get_weather' });
    expect(response.headers.get('x-stormgate-target')).toMatch(/^claude(?!-backup)/);
    expect(response.headers.get('x-stormgate-fallback')).toBeNull();
    expect((await mockStats(b)).total).toBe(0);
  });

  it('waits out anthropic-ratelimit-requests-reset on a 429 whose remaining is 0', async () => {
    const p = await startMock();
    const url = await gateway(p);
    const reset = new Date(Date.now() + 1500).toISOString();
    await faults(p, {
      errors: [{ status: 429, times: 1, headers: { 'anthropic-ratelimit-requests-remaining': '0', 'anthropic-ratelimit-requests-reset': reset } }],
    });
    const t0 = Date.now();
    const { data, response } = await anthropic(url)
      .messages.create({ model: CLAUDE, max_tokens: 100, messages: [{ role: 'user', content: 'hi' }] })
      .withResponse();
    expect(data.type).toBe('message');
    expect(Date.now() - t0).toBeGreaterThanOrEqual(1000);
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
  });

  it('treats an overloaded_error event before the first output as a 529: retried, then the SDK sees 529', async () => {
    const p = await startMock();
    const url = await gateway(p);
    await faults(p, { stream: { errorAfterChunks: 0 } });
    const err = (await anthropic(url)
      .messages.create({ model: CLAUDE, max_tokens: 100, stream: true, messages: [{ role: 'user', content: 'hi' }] })
      .then(
        () => undefined,
        (e: unknown) => e,
      )) as InstanceType<typeof Anthropic.APIError> | undefined;
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(err?.status).toBe(529);
    expect(err?.headers?.get('x-should-retry')).toBe('false');
    expect((await mockStats(p)).total).toBe(3);
  });

  it('completes a messages.stream() that stopped after its stop_reason without message_stop', async () => {
    const p = await startMock();
    const url = await gateway(p);
    await faults(p, { stream: { omitDone: true } });
    const msg = await anthropic(url).messages.stream({ model: CLAUDE, max_tokens: 200, messages: [{ role: 'user', content: 'hi' }] }).finalMessage();
    expect(msg.stop_reason).toBe('end_turn');
    expect(msg.content[0]).toMatchObject({ type: 'text' });
  });

  it('ends a stream with an error when an event inside a tool call is malformed, rather than drop it', async () => {
    const p = await startMock();
    const url = await gateway(p);
    await faults(p, { stream: { malformedAtChunk: 2 } });
    const stream = anthropic(url).messages.stream({ model: CLAUDE, max_tokens: 200, tools: weather, messages: [{ role: 'user', content: 'Weather in Oslo?' }] });
    const err = await stream.finalMessage().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(Anthropic.AnthropicError);
    expect(String(err)).toMatch(/stream_interrupted|malformed/);
    expect((await mockStats(p)).total).toBe(1);
  });

  it('keeps a count_tokens 429 hint from holding off /v1/messages', async () => {
    const p = await startMock();
    const url = await gateway(p, undefined, { maxWaitHintMs: 1000 });
    await faults(p, { errors: [{ status: 429, times: 1, headers: { 'retry-after': '30' } }] });
    const err = (await anthropic(url)
      .messages.countTokens({ model: CLAUDE, messages: [{ role: 'user', content: 'hi' }] })
      .then(
        () => undefined,
        (e: unknown) => e,
      )) as InstanceType<typeof Anthropic.APIError> | undefined;
    expect(err).toBeInstanceOf(Anthropic.RateLimitError);
    expect(Number(err?.headers?.get('retry-after'))).toBeGreaterThanOrEqual(30);
    const msg = await anthropic(url).messages.create({ model: CLAUDE, max_tokens: 100, messages: [{ role: 'user', content: 'hi' }] });
    expect(msg.type).toBe('message');
    expect((await mockStats(p)).byStatus).toEqual({ '200': 1, '429': 1 });
  });

  it('retries messages.countTokens through a 503 and a 429 with retry-after-ms', async () => {
    const p = await startMock();
    const url = await gateway(p);
    await faults(p, { errors: [{ status: 503, times: 1 }, { status: 429, times: 1, headers: { 'retry-after-ms': '200' } }] });
    const { data, response } = await anthropic(url)
      .messages.countTokens({ model: CLAUDE, messages: [{ role: 'user', content: 'How many tokens is this?' }] })
      .withResponse();
    expect(data.input_tokens).toBeGreaterThan(0);
    expect(response.headers.get('x-stormgate-attempts')).toBe('3');
    expect(response.headers.get('x-stormgate-route')).toBe('count-tokens');
    expect((await mockStats(p)).byStatus).toEqual({ '200': 1, '429': 1, '503': 1 });
  });
});
