// Third-party failure-scenario suite 68: the OpenAI Responses API path and the Anthropic Messages path as a user of the
// official SDKs meets them (openai 6.x `responses.create` / `responses.stream()`, @anthropic-ai/sdk `messages.create`,
// `messages.stream().finalMessage()`, `countTokens`), over real HTTP on 127.0.0.1, the bundled mock provider as both
// the primary and the backup (two instances, so a fault is the primary's alone), faults set at run time through its
// control endpoint.
// Cross-family failover is not a situation here: the README refuses an Anthropic backup on /v1/responses and any other
// family on /v1/messages at start-up (test/third-party-suite-65.test.ts checks the first); the backup is another
// account of the same family, with a model of its own. On what the earlier suites covered least:
//  1. Responses streams broken before the first output in each way the mock breaks them (error event, cut, malformed
//     event, reset, 503): `finalResponse()` is the backup's whole Response, its id, model and usage, the text deltas
//     adding up to the text and the sequence numbers the backup's own, 0 on, no gap;
//  2. a Responses stream broken after N events (cut, stall, error event): `finalResponse()` rejects, never a truncated
//     success; `create({stream: true})` ends on an `error` event numbered after the last; nothing is sent again;
//  3. the openai SDK's AbortController mid-stream: the mock sees the upstream request end; nothing is sent again;
//  4. an SDK `timeout` shorter than the gateway's wait for a retry-after, with and without the SDK's
//     x-stainless-timeout header: no request reaches either provider after the client gave up (no ghost requests);
//  5. Anthropic streams broken before the first output at the primary: `finalMessage()` is the backup's message, its
//     model, stop_reason, tool input parsed whole (or text the deltas' sum), usage; a tool_use block that opened is
//     output already (README), so a break right after it is raised, not failed over;
//  6. Anthropic tool_use streams broken inside the tool input (cut, stall, malformed event, error event):
//     `finalMessage()` rejects, never a tool call with half (or a corrupted) input;
//  7. `countTokens` through a primary's 503 and 529; the error shape each family's SDK gets for bad input and for the
//     gateway's own errors.
// Found here: no gateway defect. Two first drafts misread something else and were fixed: a tool_use block that opens is
// the first output (README: "a block that opens with its content such as a tool_use"), so the mock's error right after
// it is raised, not failed over; a scripted socket destroyed at once drops the bytes still unwritten, so the gateway
// saw a cut before the first output and (rightly) failed over. Reported as design questions: a malformed text event
// after the first output is dropped, and the Anthropic SDK's finalMessage() (built from deltas alone) then resolves
// `end_turn` with text one piece short. Found and fixed after it: a path of Anthropic's API with no route
// (`/v1/messages/batches`, or Claude Code's `/v1/messages/count_tokens` where only `/v1/messages` is routed) got
// `404 unknown_url` in the OpenAI shape only, without `request-id`; from a client that sends anthropic-version it is in
// Anthropic's now.
// Bounds are generous: a loaded 2-core machine.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import type { FaultSpec } from '../src/mock/faults.ts';
import type { MockServer } from '../src/mock/server.ts';
import { mockControl } from './helpers/mock-control.ts';
import { sdkError } from './helpers/openai-error.ts';
import { baseResponse, rev, type Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';
import { useExtraMocks, useGateways } from './helpers/stack.ts';
import { readResponseStream } from './helpers/responses-stream.ts';

const startGateway = useGateways();
const startMockProvider = useExtraMocks();

interface Rig {
  url: string;
  logs: string[];
  primary: MockServer;
  backup: MockServer;
  openai: OpenAI;
  anthropic: Anthropic;
}

/** Two mocks (primary, backup) and a gateway with a Responses, a Messages and a count_tokens route over both. */
async function rig(route: Record<string, unknown> = {}, timeouts: Record<string, number> = {}): Promise<Rig> {
  const primary = await startMockProvider();
  const backup = await startMockProvider();
  const t = { connectMs: 1_000, firstTokenMs: 5_000, idleMs: 5_000, ...timeouts };
  const common = {
    retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 10, capMs: 10 } },
    budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 },
    park: false,
    ...route,
  };
  const input = {
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    providers: {
      oa: { family: 'openai', baseUrl: `${primary.url}/v1`, apiKey: 'oa-key-0123456789', breaker: false, timeouts: t },
      ob: { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: 'ob-key-0123456789', breaker: false, timeouts: t },
      an: { family: 'anthropic', baseUrl: primary.url, apiKey: 'an-key-0123456789', breaker: false, timeouts: t },
      ab: { family: 'anthropic', baseUrl: backup.url, apiKey: 'ab-key-0123456789', breaker: false, timeouts: t },
    },
    routes: [
      { name: 'responses', match: { path: '/v1/responses', models: ['gpt-*'] }, targets: [{ provider: 'oa' }, { provider: 'ob', model: 'gpt-4.1' }], ...common },
      { name: 'messages', match: { path: '/v1/messages', models: ['claude-*'] }, targets: [{ provider: 'an' }, { provider: 'ab', model: 'claude-haiku-4-5' }], ...common },
      { name: 'count', match: { path: '/v1/messages/count_tokens' }, targets: [{ provider: 'an' }, { provider: 'ab' }], ...common },
    ],
  } as ConfigInput;
  const logs: string[] = [];
  const url = await startGateway(ConfigSchema.parse(input), { logs });
  return {
    url,
    logs,
    primary,
    backup,
    openai: new OpenAI({ baseURL: `${url}/v1`, apiKey: 'client-key', maxRetries: 0 }),
    anthropic: new Anthropic({ baseURL: url, apiKey: 'client-key', maxRetries: 0 }),
  };
}

const faults = (mock: MockServer, spec: FaultSpec) => mockControl(mock, 'PUT', 'faults', spec);
const seen = (mock: MockServer) => mock.stats().total;

type ResponseEvent = OpenAI.Responses.ResponseStreamEvent;


const weatherTool: Anthropic.Tool = {
  name: 'get_weather',
  description: 'The weather in a city',
  input_schema: { type: 'object', properties: { x: { type: 'number' } } },
};

describe('a Responses stream broken at the primary before its first output', () => {
  it.each<[string, FaultSpec]>([
    ['an error event', { stream: { errorAfterChunks: 0 } }],
    ['a cut after response.created', { stream: { cutAfterChunks: 0 } }],
    ['a malformed first delta', { stream: { malformedAtChunk: 0 } }],
    ['a connection reset', { resetRate: 1 }],
    ['a 503', { errors: [{ status: 503 }] }],
  ])('(%s) reaches the SDK as the backup\'s whole Response: its id, model, usage, deltas and sequence numbers', async (_name, spec) => {
    const r = await rig();
    await faults(r.primary, spec);
    const { events, final, error } = await readResponseStream(r.openai.responses.stream({ model: 'gpt-4o', input: 'Say hello in five words', store: false }));
    expect(error).toBeUndefined();
    expect(final!.status).toBe('completed');
    expect(final!.model).toBe('gpt-4.1');
    // One Response from start to end: the backup's, the primary's id never shown.
    const created = events.find((e) => e.type === 'response.created') as OpenAI.Responses.ResponseCreatedEvent;
    expect(created.response.id).toBe(final!.id);
    expect(events.filter((e) => e.type === 'response.created')).toHaveLength(1);
    expect(events.map((e) => e.sequence_number)).toEqual(events.map((_, i) => i));
    const text = events.flatMap((e) => (e.type === 'response.output_text.delta' ? [e.delta] : [])).join('');
    const out = final!.output[0] as OpenAI.Responses.ResponseOutputMessage;
    expect(text).toBe((out.content[0] as OpenAI.Responses.ResponseOutputText).text);
    expect(text.length).toBeGreaterThan(0);
    expect(final!.usage!.output_tokens).toBeGreaterThan(0);
    expect(final!.usage!.total_tokens).toBe(final!.usage!.input_tokens + final!.usage!.output_tokens);
    expect(seen(r.primary)).toBe(2);
    expect(seen(r.backup)).toBe(1);
  });

  it('a whole create through a 429 whose retry-after outlasts maxWaitHintMs is the backup\'s answer at once, marked wait_hint', async () => {
    const r = await rig({ retry: { maxAttempts: 3, maxWaitHintMs: 500, backoff: { strategy: 'fixed', baseMs: 10, capMs: 10 } } });
    await faults(r.primary, { errors: [{ status: 429, headers: { 'retry-after': '5' } }] });
    const started = Date.now();
    const { data, response } = await r.openai.responses.create({ model: 'gpt-4o', input: 'hi' }).withResponse();
    expect(Date.now() - started).toBeLessThan(3_000);
    expect(data.model).toBe('gpt-4.1');
    expect(data.output_text.length).toBeGreaterThan(0);
    expect(response.headers.get('x-stormgate-fallback')).toBe('wait_hint');
    expect(seen(r.primary)).toBe(1);
    expect(seen(r.backup)).toBe(1);
  });
});

describe('a Responses stream broken after N events', () => {
  it.each<[string, FaultSpec]>([
    ['cut', { stream: { cutAfterChunks: 2 } }],
    ['stalled past idleMs', { stream: { stallAfterChunks: 2 } }],
    ['ended by the provider\'s error event', { stream: { errorAfterChunks: 2 } }],
  ])('(%s): finalResponse() rejects, never a truncated success, and nothing is sent again', async (_name, spec) => {
    const r = await rig({}, { idleMs: 800 });
    await faults(r.primary, spec);
    const started = Date.now();
    const { events, final, error } = await readResponseStream(r.openai.responses.stream({ model: 'gpt-4o', input: 'Say hello in five words' }));
    expect(final).toBeUndefined();
    expect(error).toBeInstanceOf(Error);
    expect(Date.now() - started).toBeLessThan(8_000);
    expect(events.filter((e) => e.type === 'response.output_text.delta')).toHaveLength(2);
    expect(events.some((e) => e.type === 'response.completed')).toBe(false);
    await sleep(300);
    expect(seen(r.primary)).toBe(1);
    expect(seen(r.backup)).toBe(0);
  });

  it('create({stream: true}) ends on an error event numbered after the last, never on a clean end', async () => {
    const r = await rig();
    await faults(r.primary, { stream: { cutAfterChunks: 2 } });
    const events: ResponseEvent[] = [];
    const stream = await r.openai.responses.create({ model: 'gpt-4o', input: 'Say hello in five words', stream: true });
    let thrown: unknown;
    try {
      for await (const ev of stream) events.push(ev);
    } catch (e) {
      thrown = e;
    }
    // The SDK either raises the error event or hands it over as the last event; either way it is not a clean end.
    const last = events.at(-1)!;
    if (thrown === undefined) {
      expect(last.type).toBe('error');
      expect((last as OpenAI.Responses.ResponseErrorEvent).code).toBe('stream_interrupted');
      expect(last.sequence_number).toBe(events.at(-2)!.sequence_number + 1);
    } else {
      expect(thrown).toBeInstanceOf(OpenAI.APIError);
    }
    expect(events.some((e) => e.type === 'response.completed')).toBe(false);
  });
});

describe("the openai SDK's AbortController mid-stream on /v1/responses", () => {
  it('ends the upstream request at the provider, and nothing is sent again', async () => {
    const r = await rig();
    await faults(r.primary, { stream: { stallAfterChunks: 2 } });
    const controller = new AbortController();
    const stream = r.openai.responses.stream({ model: 'gpt-4o', input: 'Say hello in five words' }, { signal: controller.signal });
    let deltas = 0;
    let error: unknown;
    try {
      for await (const ev of stream) {
        if (ev.type === 'response.output_text.delta' && ++deltas === 2) controller.abort();
      }
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(OpenAI.APIUserAbortError);
    await expect.poll(() => r.primary.stats().inflight, { timeout: 3_000 }).toBe(0);
    await sleep(300);
    expect(seen(r.primary)).toBe(1);
    expect(seen(r.backup)).toBe(0);
  });
});

/** A fetch that drops the SDKs' timeout headers: the gateway learns of the client's timeout only by its disconnect. */
const withoutTimeoutHeaders: typeof fetch = (url, init) => {
  const headers = new Headers(init?.headers);
  headers.delete('x-stainless-timeout');
  headers.delete('x-stainless-read-timeout');
  return fetch(url, { ...init, headers });
};

describe("an SDK timeout shorter than the gateway's wait for a retry-after", () => {
  const hint: FaultSpec = { errors: [{ status: 429, headers: { 'retry-after': '3' } }] };
  const route = { retry: { maxAttempts: 4, maxWaitHintMs: 10_000, backoff: { strategy: 'fixed', baseMs: 10, capMs: 10 } }, timeoutMs: 60_000 };

  it.each([
    ['with x-stainless-timeout', undefined],
    ['without it (only the disconnect tells)', withoutTimeoutHeaders],
  ])('openai responses.create %s: the call ends by its timeout, and no request reaches a provider after it', async (_name, customFetch) => {
    const r = await rig(route);
    await faults(r.primary, hint);
    await faults(r.backup, hint);
    const client = new OpenAI({ baseURL: `${r.url}/v1`, apiKey: 'k', maxRetries: 0, timeout: 1_000, ...(customFetch && { fetch: customFetch }) });
    const started = Date.now();
    const err = await client.responses.create({ model: 'gpt-4o', input: 'hi' }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(Date.now() - started).toBeLessThan(2_500);
    const atGiveUp = seen(r.primary) + seen(r.backup);
    await sleep(4_000);
    expect(seen(r.primary) + seen(r.backup)).toBe(atGiveUp);
    expect(atGiveUp).toBeLessThanOrEqual(2);
  });

  it.each([
    ['with x-stainless-timeout', undefined],
    ['without it (only the disconnect tells)', withoutTimeoutHeaders],
  ])('anthropic messages.create %s: the call ends by its timeout, and no request reaches a provider after it', async (_name, customFetch) => {
    const r = await rig(route);
    await faults(r.primary, hint);
    await faults(r.backup, hint);
    const client = new Anthropic({ baseURL: r.url, apiKey: 'k', maxRetries: 0, timeout: 1_000, ...(customFetch && { fetch: customFetch }) });
    const started = Date.now();
    const err = await client.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 64, messages: [{ role: 'user', content: 'hi' }] }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(Date.now() - started).toBeLessThan(2_500);
    const atGiveUp = seen(r.primary) + seen(r.backup);
    await sleep(4_000);
    expect(seen(r.primary) + seen(r.backup)).toBe(atGiveUp);
    expect(atGiveUp).toBeLessThanOrEqual(2);
  });
});

describe('an Anthropic stream broken at the primary before its first output', () => {
  it.each<[string, FaultSpec]>([
    ['a connection reset', { resetRate: 1 }],
    ['a 529', { errors: [{ status: 529 }] }],
    ['a 503', { errors: [{ status: 503 }] }],
  ])('(%s), a tool_use answer: finalMessage() is the backup\'s message, its tool input whole, stop_reason tool_use, usage', async (_name, spec) => {
    const r = await rig();
    await faults(r.primary, spec);
    const stream = r.anthropic.messages.stream({ model: 'claude-sonnet-4-5', max_tokens: 256, tools: [weatherTool], messages: [{ role: 'user', content: 'Weather in Paris?' }] });
    const partials: string[] = [];
    stream.on('inputJson', (partial) => partials.push(partial));
    const msg = await stream.finalMessage();
    expect(msg.model).toBe('claude-haiku-4-5');
    expect(msg.stop_reason).toBe('tool_use');
    const call = msg.content.find((b) => b.type === 'tool_use') as Anthropic.ToolUseBlock;
    expect(call.name).toBe('get_weather');
    expect(call.input).toEqual({ x: 1 });
    expect(partials.join('')).toBe('{"x":1}');
    expect(msg.usage.input_tokens).toBeGreaterThan(0);
    expect(msg.usage.output_tokens).toBeGreaterThan(0);
    expect(msg.id).toMatch(/^msg_/);
    expect(seen(r.primary)).toBe(2);
    expect(seen(r.backup)).toBe(1);
  });

  it.each<[string, FaultSpec]>([
    ['overloaded_error event', { stream: { errorAfterChunks: 0 } }],
    ['a cut after message_start', { stream: { cutAfterChunks: 0 } }],
    ['a malformed first delta', { stream: { malformedAtChunk: 0 } }],
  ])('(%s), a text answer: finalMessage() is the backup\'s message, its text the deltas\' sum, end_turn, usage', async (_name, spec) => {
    const r = await rig();
    await faults(r.primary, spec);
    const stream = r.anthropic.messages.stream({ model: 'claude-sonnet-4-5', max_tokens: 256, messages: [{ role: 'user', content: 'Say hello in five words' }] });
    const deltas: string[] = [];
    stream.on('text', (d) => deltas.push(d));
    const msg = await stream.finalMessage();
    expect(msg.model).toBe('claude-haiku-4-5');
    expect(msg.stop_reason).toBe('end_turn');
    expect((msg.content[0] as Anthropic.TextBlock).text).toBe(deltas.join(''));
    expect(deltas.join('').length).toBeGreaterThan(0);
    expect(msg.usage.output_tokens).toBeGreaterThan(0);
    expect(seen(r.primary)).toBe(2);
    expect(seen(r.backup)).toBe(1);
  });

  it('an overloaded_error right after a tool_use block opened is after the first output (the block names the call): finalMessage() rejects, nothing sent again', async () => {
    const r = await rig();
    await faults(r.primary, { stream: { errorAfterChunks: 0 } });
    const stream = r.anthropic.messages.stream({ model: 'claude-sonnet-4-5', max_tokens: 256, tools: [weatherTool], messages: [{ role: 'user', content: 'Weather in Paris?' }] });
    const err = await stream.finalMessage().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(String((err as Error).message)).toContain('overloaded_error');
    await sleep(300);
    expect(seen(r.primary)).toBe(1);
    expect(seen(r.backup)).toBe(0);
  });
});

describe('an Anthropic tool_use stream broken inside the tool input', () => {
  it.each<[string, FaultSpec]>([
    ['cut', { stream: { cutAfterChunks: 2 } }],
    ['stalled past idleMs', { stream: { stallAfterChunks: 2 } }],
    ['a malformed delta', { stream: { malformedAtChunk: 2 } }],
    ['the provider\'s overloaded_error', { stream: { errorAfterChunks: 2 } }],
  ])('(%s): finalMessage() rejects, never a tool call with part of its input, and nothing is sent again', async (_name, spec) => {
    const r = await rig({}, { idleMs: 800 });
    await faults(r.primary, spec);
    const stream = r.anthropic.messages.stream({ model: 'claude-sonnet-4-5', max_tokens: 256, tools: [weatherTool], messages: [{ role: 'user', content: 'Weather in Paris?' }] });
    const started = Date.now();
    const result = await stream.finalMessage().then(
      (m) => ({ m }),
      (e: unknown) => ({ e }),
    );
    expect(result).toHaveProperty('e');
    expect((result as { e: unknown }).e).toBeInstanceOf(Anthropic.AnthropicError);
    expect(Date.now() - started).toBeLessThan(8_000);
    await sleep(300);
    expect(seen(r.primary)).toBe(1);
    expect(seen(r.backup)).toBe(0);
  });
});

describe('countTokens and the error shapes each family gets', () => {
  it.each<[string, FaultSpec]>([
    ['503', { errors: [{ status: 503 }] }],
    ['529', { errors: [{ status: 529 }] }],
  ])('countTokens through the primary\'s %s is counted by the backup', async (_name, spec) => {
    const r = await rig();
    await faults(r.primary, spec);
    const count = await r.anthropic.messages.countTokens({ model: 'claude-sonnet-4-5', messages: [{ role: 'user', content: 'Weather in Paris?' }] });
    expect(count.input_tokens).toBeGreaterThan(0);
    expect(seen(r.backup)).toBe(1);
  });

  it("an Anthropic client's model no route serves: a NotFoundError in Anthropic's shape, with its request id", async () => {
    const r = await rig();
    const err = await r.anthropic.messages.create({ model: 'gpt-4o', max_tokens: 64, messages: [{ role: 'user', content: 'hi' }] }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(Anthropic.NotFoundError);
    const body = (err as InstanceType<typeof Anthropic.NotFoundError>).error as { type: string; error: { type: string; code: string } };
    expect(body.type).toBe('error');
    expect(body.error.type).toBe('not_found_error');
    expect(body.error.code).toBe('model_not_found');
    expect((err as InstanceType<typeof Anthropic.NotFoundError>).requestID).toBeTruthy();
    expect(seen(r.primary) + seen(r.backup)).toBe(0);
  });

  it("an Anthropic client's bad JSON and missing model: 400 invalid_request_error in Anthropic's shape, nothing sent upstream", async () => {
    const r = await rig();
    for (const [body, code] of [
      ['{"model": "claude-sonnet-4-5",', 'invalid_json'],
      ['{"max_tokens": 5, "messages": []}', 'invalid_body'],
    ] as const) {
      const res = await fetch(`${r.url}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-api-key': 'k', 'anthropic-version': '2023-06-01' }, body });
      const json = (await res.json()) as { type: string; error: { type: string; code: string } };
      expect(res.status).toBe(400);
      expect(json.type).toBe('error');
      expect(json.error.type).toBe('invalid_request_error');
      expect(json.error.code).toBe(code);
      expect(res.headers.get('request-id')).toBeTruthy();
    }
    expect(seen(r.primary) + seen(r.backup)).toBe(0);
  });

  it("an Anthropic client's request Anthropic refuses (max_tokens missing) is Anthropic's own 400, not failed over", async () => {
    const r = await rig();
    const err = await r.anthropic.messages
      .create({ model: 'claude-sonnet-4-5', messages: [{ role: 'user', content: 'hi' }] } as unknown as Anthropic.MessageCreateParamsNonStreaming)
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    expect(err).toBeInstanceOf(Anthropic.BadRequestError);
    const body = (err as InstanceType<typeof Anthropic.BadRequestError>).error as { type: string; error: { type: string } };
    expect(body.type).toBe('error');
    expect(body.error.type).toBe('invalid_request_error');
    expect(seen(r.primary)).toBe(1);
    expect(seen(r.backup)).toBe(0);
  });

  it("an Anthropic client on a path of Anthropic's API no route serves: NotFoundError in Anthropic's shape with its request id; an openai client's 404 keeps the OpenAI shape", async () => {
    const r = await rig();
    // Message Batches is not routed here (count_tokens is): the SDK reads the gateway's 404 as Anthropic's own.
    const err = await r.anthropic.messages.batches.list().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(Anthropic.NotFoundError);
    const body = (err as InstanceType<typeof Anthropic.NotFoundError>).error as { type: string; error: { type: string; code: string; message: string } };
    expect(body).toMatchObject({ type: 'error', error: { type: 'not_found_error', code: 'unknown_url' } });
    expect(body.error.message).toContain('/v1/messages/batches');
    expect((err as InstanceType<typeof Anthropic.NotFoundError>).requestID).toBeTruthy();
    const plain = await fetch(`${r.url}/v1/messages/batches`, { headers: { authorization: 'Bearer k' } });
    expect(plain.status).toBe(404);
    expect(await plain.json()).toEqual({ error: { message: 'no route for GET /v1/messages/batches', type: 'invalid_request_error', param: null, code: 'unknown_url' } });
    expect(seen(r.primary) + seen(r.backup)).toBe(0);
  });

  it("an openai client's Responses model no route serves: 404 model_not_found in the OpenAI shape", async () => {
    const r = await rig();
    const err = await sdkError(r.openai.responses.create({ model: 'claude-sonnet-4-5', input: 'hi' }));
    expect(err.status).toBe(404);
    expect(err.code).toBe('model_not_found');
    expect(err.type).toBe('invalid_request_error');
    expect(err.requestID).toBeTruthy();
  });

  it('a Responses follow-up by previous_response_id through the primary\'s 503 is not sent to the backup', async () => {
    const r = await rig();
    const first = await r.openai.responses.create({ model: 'gpt-4o', input: 'hi' });
    await faults(r.primary, { errors: [{ status: 503 }] });
    const err = await sdkError(r.openai.responses.create({ model: 'gpt-4o', input: 'and then?', previous_response_id: first.id }));
    expect(err.status).toBeGreaterThanOrEqual(500);
    expect(seen(r.backup)).toBe(0);
  });
});

describe('Responses function calls and terminal events, on scripted providers', () => {
  const startUpstreams = useScriptedUpstreams();
  const usage = { input_tokens: 30, input_tokens_details: { cached_tokens: 0 }, output_tokens: 9, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 39 };
  const call = (args: string, status: string) => ({ id: 'fc_1', type: 'function_call', status, arguments: args, call_id: 'call_7', name: 'get_weather' });
  const pieces = ['{"ci', 'ty":"Par', 'is"}'];
  const head = (model: string) => [
    rev('response.created', { response: { ...baseResponse('in_progress'), id: `resp_${model}`, model } }, 0),
    rev('response.in_progress', { response: { ...baseResponse('in_progress'), id: `resp_${model}`, model } }, 1),
    rev('response.output_item.added', { output_index: 0, item: call('', 'in_progress') }, 2),
  ];
  const argDelta = (delta: string, seq: number) => rev('response.function_call_arguments.delta', { item_id: 'fc_1', output_index: 0, delta }, seq);
  /** A whole function-call stream, as OpenAI sends one, its arguments in three deltas. */
  const wholeCall = (model: string): Script => ({
    steps: [
      ...head(model),
      ...pieces.map((p, i) => argDelta(p, 3 + i)),
      rev('response.function_call_arguments.done', { item_id: 'fc_1', output_index: 0, arguments: pieces.join('') }, 6),
      rev('response.output_item.done', { output_index: 0, item: call(pieces.join(''), 'completed') }, 7),
      rev('response.completed', { response: { ...baseResponse('completed', [call(pieces.join(''), 'completed')], usage), id: `resp_${model}`, model } }, 8),
    ],
  });
  const tools: OpenAI.Responses.Tool[] = [{ type: 'function', name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } }, strict: false }];

  it('a stream cut after the function_call item was added, before its arguments, is the backup\'s call, its arguments whole', async () => {
    const { s, seen: got } = await startUpstreams(
      {
        p: () => ({ steps: [...head('gpt-4o'), { destroy: true }] }),
        q: () => wholeCall('gpt-4.1'),
      },
      [{ provider: 'p' }, { provider: 'q', model: 'gpt-4.1' }],
      { path: '/v1/responses', route: { retry: { maxAttempts: 1 } } },
    );
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'k', maxRetries: 0 });
    const { events, final, error } = await readResponseStream(client.responses.stream({ model: 'gpt-4o', input: 'Weather in Paris?', tools }));
    expect(error).toBeUndefined();
    expect(final!.id).toBe('resp_gpt-4.1');
    const fc = final!.output[0] as OpenAI.Responses.ResponseFunctionToolCall;
    expect(JSON.parse(fc.arguments)).toEqual({ city: 'Paris' });
    expect(events.flatMap((e) => (e.type === 'response.function_call_arguments.delta' ? [e.delta] : [])).join('')).toBe(fc.arguments);
    expect(events.filter((e) => e.type === 'response.output_item.added')).toHaveLength(1);
    expect(final!.usage!.total_tokens).toBe(39);
    expect(got.p).toHaveLength(1);
    expect(got.q).toHaveLength(1);
  });

  it.each([
    // The pause lets the delta leave the provider first: a socket destroyed at once drops what is still unwritten.
    ['cut', [200, { destroy: true } as const]],
    ['a malformed event', ['event: response.function_call_arguments.delta\ndata: {not json\n\n', argDelta(pieces[2]!, 5), rev('response.completed', { response: baseResponse('completed', [call(pieces.join(''), 'completed')], usage) }, 6)]],
  ])('a stream %s inside the arguments: finalResponse() rejects, never a call with part of its arguments', async (_name, rest) => {
    const { s, seen: got } = await startUpstreams(
      { p: () => ({ steps: [...head('gpt-4o'), argDelta(pieces[0]!, 3), ...rest] }), q: () => wholeCall('gpt-4.1') },
      [{ provider: 'p' }, { provider: 'q', model: 'gpt-4.1' }],
      { path: '/v1/responses', route: { retry: { maxAttempts: 1 } } },
    );
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'k', maxRetries: 0 });
    const { final, error } = await readResponseStream(client.responses.stream({ model: 'gpt-4o', input: 'Weather in Paris?', tools }));
    expect(final).toBeUndefined();
    expect(error).toBeInstanceOf(Error);
    expect(got.q).toHaveLength(0);
  });
});

describe('a malformed text event after the first output (dropped and logged, as the README says)', () => {
  const warned = (r: Rig) => r.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.droppedMalformed === 1);

  it('Responses: finalResponse() is whole (response.completed carries the text), the deltas lack the dropped piece, the line warns', async () => {
    const r = await rig();
    await faults(r.primary, { stream: { malformedAtChunk: 2 } });
    const { events, final, error } = await readResponseStream(r.openai.responses.stream({ model: 'gpt-4o', input: 'Say hello in five words' }));
    expect(error).toBeUndefined();
    const deltas = events.flatMap((e) => (e.type === 'response.output_text.delta' ? [e.delta] : []));
    expect(deltas).toHaveLength(4);
    const out = final!.output[0] as OpenAI.Responses.ResponseOutputMessage;
    expect((out.content[0] as OpenAI.Responses.ResponseOutputText).text.length).toBeGreaterThan(deltas.join('').length);
    await expect.poll(() => warned(r), { timeout: 2_000 }).toBeDefined();
    expect(seen(r.backup)).toBe(0);
  });

  // Observed, and reported as a design question rather than pinned: the Anthropic SDK builds finalMessage() from the
  // deltas alone (no final snapshot, unlike response.completed), so its text is one piece short while it ends end_turn:
  // a truncated success only the gateway's log line tells.
  it('Anthropic: finalMessage() resolves end_turn, the line warns', async () => {
    const r = await rig();
    await faults(r.primary, { stream: { malformedAtChunk: 2 } });
    const msg = await r.anthropic.messages.stream({ model: 'claude-sonnet-4-5', max_tokens: 256, messages: [{ role: 'user', content: 'Say hello in five words' }] }).finalMessage();
    expect(msg.stop_reason).toBe('end_turn');
    await expect.poll(() => warned(r), { timeout: 2_000 }).toBeDefined();
  });
});

describe('streams without their terminal event, and a slow first token', () => {
  it('a Responses stream that ends after output_item.done without response.completed: finalResponse() rejects, a clean error', async () => {
    const r = await rig();
    await faults(r.primary, { stream: { omitDone: true } });
    const { events, final, error } = await readResponseStream(r.openai.responses.stream({ model: 'gpt-4o', input: 'Say hello in five words' }));
    expect(final).toBeUndefined();
    expect(error).toBeInstanceOf(Error);
    expect(events.some((e) => e.type === 'response.output_item.done')).toBe(true);
  });

  it('an Anthropic stream that ends after its stop_reason without message_stop: finalMessage() resolves, its tool input whole', async () => {
    const r = await rig();
    await faults(r.primary, { stream: { omitDone: true } });
    const msg = await r.anthropic.messages
      .stream({ model: 'claude-sonnet-4-5', max_tokens: 256, tools: [weatherTool], messages: [{ role: 'user', content: 'Weather in Paris?' }] })
      .finalMessage();
    expect(msg.stop_reason).toBe('tool_use');
    expect((msg.content.find((b) => b.type === 'tool_use') as Anthropic.ToolUseBlock).input).toEqual({ x: 1 });
  });

  it.each(['responses', 'messages'] as const)('a first token slower than firstTokenMs at the primary (%s): the backup\'s stream, the primary attempt ended', async (api) => {
    const r = await rig({ retry: { maxAttempts: 1 } }, { firstTokenMs: 400 });
    await faults(r.primary, { stream: { firstTokenDelayMs: 3_000 } });
    const started = Date.now();
    if (api === 'responses') {
      const final = await r.openai.responses.stream({ model: 'gpt-4o', input: 'Say hello in five words' }).finalResponse();
      expect(final.model).toBe('gpt-4.1');
    } else {
      const msg = await r.anthropic.messages.stream({ model: 'claude-sonnet-4-5', max_tokens: 64, messages: [{ role: 'user', content: 'hi' }] }).finalMessage();
      expect(msg.model).toBe('claude-haiku-4-5');
    }
    expect(Date.now() - started).toBeLessThan(2_500);
    await expect.poll(() => r.primary.stats().inflight, { timeout: 3_000 }).toBe(0);
    expect(seen(r.primary)).toBe(1);
    expect(seen(r.backup)).toBe(1);
  });
});
