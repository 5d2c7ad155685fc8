// Third-party failure-scenario suite 53: an outside QA team's suite, written from the README alone ("Retries" and what
// a retry may repeat, "Streaming" and its response.created rule, "Idempotency keys", "Failover and API families",
// "What the client sees" and its x-should-retry rule), on AGENTS built on the OpenAI RESPONSES API through the gateway
// while the provider misbehaves. Driven with the official `openai` 6.x SDK (responses.create with and without stream,
// responses.stream(...).finalResponse(), `conversation`, `previous_response_id`, `background: true`, function_call
// items and their outputs in the next turn) and the OpenAI Agents SDK's Responses model, against scripted upstreams
// (test/helpers/scripted-provider.ts) that count every request they got.
//  1. Agent loops with previous_response_id through 429/503 bursts: every turn answered, each turn sent upstream at
//     most maxAttempts times, the SDK sending each turn once; a burst longer than the attempts ends the loop with the
//     503 and x-should-retry false (no multiplication by the SDK's maxRetries).
//  2. Requests that add to something stored: a conversation stream stalled or cut after response.created (one upstream
//     request, the SDK raises, the response id seen), a background create that times out (one request, 504), a
//     background stream cut after response.created, a conversation turn through a 429 burst (retried, as a status).
//  3. Tool-call items streamed then cut: an error, never a complete-looking response; cut before the first output:
//     retried, one response.created for the client.
//  4. response.failed / response.incomplete / error events before and after the first output, and the whole-body forms.
//  5. Usage: the SDK's usage is the provider's, and stormgate_tokens_total counts it.
//  6. The SDK's maxRetries with the gateway's retries: x-should-retry true waited out once, false never repeated.
//  7. Failover on /v1/responses: a plain turn to the backup, a previous_response_id turn never.
//  8. An Idempotency-Key on a background create whose SDK times out: one job upstream, the SDK's retry gets its answer.
//  9. The Agents SDK's OpenAIResponsesModel: run() with a tool through 503 bursts on both turns.
// Found here: nothing in the gateway. Noted for agent authors: in openai 6.x, responses.stream(...).finalResponse()
// resolves without `output_text` unless it was asked to parse (text.format), so read the message items (textOf below).
import { Agent, OpenAIResponsesModel, run, setTracingDisabled, tool as agentTool } from '@openai/agents';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import type { ConfigInput } from '../src/config/schema.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { baseResponse, json, msgItem, responsesHead, responsesTail, rev, scripted, textDelta, type Script, type Seen } from './helpers/scripted-provider.ts';
import { configServedBy, metricSum, requestLine, useStacks, type Stack } from './helpers/stack.ts';

setTracingDisabled(true); // nothing leaves 127.0.0.1

const startProvider = useFakeProviders();
const startStack = useStacks();

type Upstream = (body: Record<string, unknown>, n: number) => Script | 'hang';
interface Options {
  timeouts?: Record<string, number>;
  maxRetries?: number;
  /** A second scripted provider `q` behind `p` on every route. */
  backup?: Upstream;
  route?: Record<string, unknown>;
}

/**
 * A gateway whose routes go to one scripted provider `p` (three quick attempts, default retryOn), and an SDK client
 * (maxRetries 2 unless told) whose HTTP requests are counted.
 */
async function gateway(fn: Upstream, opts: Options = {}) {
  const seen: Seen[] = [];
  const backupSeen: Seen[] = [];
  const p = await startProvider(scripted(fn, seen));
  const q = opts.backup ? await startProvider(scripted(opts.backup, backupSeen)) : undefined;
  const s: Stack = await startStack({
    config: (mockUrl) => {
      const c = configServedBy(mockUrl, 'p', `${p.origin}/v1`);
      (c.providers.p as Record<string, unknown>).timeouts = { connectMs: 2_000, firstTokenMs: 30_000, idleMs: 30_000, ...opts.timeouts };
      if (q) c.providers.q = { family: 'openai', baseUrl: `${q.origin}/v1`, apiKey: 'q-key', breaker: false, timeouts: { connectMs: 2_000, firstTokenMs: 30_000, idleMs: 30_000 } } as ConfigInput['providers'][string];
      for (const r of c.routes as Array<Record<string, unknown>>) {
        r.retry = { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 10 } };
        if (q) r.targets = [{ provider: 'p' }, { provider: 'q' }];
        Object.assign(r, opts.route);
      }
      return c;
    },
  });
  const sdk = { requests: 0 };
  const client = new OpenAI({
    baseURL: s.baseURL,
    apiKey: 'client-key',
    maxRetries: opts.maxRetries ?? 2,
    fetch: async (url, init) => {
      sdk.requests++;
      return fetch(url, init);
    },
  });
  return { client, seen, backupSeen, s, sdk };
}

const SSE = { 'content-type': 'text/event-stream' };
const USAGE = { input_tokens: 12, input_tokens_details: { cached_tokens: 0 }, output_tokens: 2, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 14 };
const ARGS = '{"city":"Paris"}';
const fcItem = (status = 'completed', args = ARGS) => ({ id: 'fc_1', type: 'function_call', status, call_id: 'call_1', name: 'get_weather', arguments: args });
const weatherTool = { type: 'function' as const, name: 'get_weather', description: 'Weather of a city', strict: false, parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } };

const resp = (id: string, status: string, output: unknown[], usage: unknown = USAGE) => ({ ...baseResponse(status, output, usage), id });
/** A whole answer (non-stream) with a function call. */
const wholeCall = (id: string) => json(200, resp(id, 'completed', [fcItem()]));
/** A whole answer (non-stream) with text. */
const wholeText = (id: string, text: string) => json(200, resp(id, 'completed', [msgItem(text)]));
const unavailable = json(503, { error: { message: 'overloaded', type: 'server_error', code: null } });
const limited = json(429, { error: { message: 'Rate limit reached for gpt-4.1 on requests per min (RPM)', type: 'requests', code: 'rate_limit_exceeded' } }, { 'retry-after-ms': '20' });

/** A streamed text answer. */
const streamedText = (text: string): Script => ({ headers: SSE, steps: [...responsesHead(), textDelta(text, 4), ...responsesTail(text, 5)] });
/** A streamed function call: created, item added, its arguments in two deltas, done, completed. */
const streamedCall = (id: string, cutAfterFirstDelta = false): Script => {
  const created = rev('response.created', { response: resp(id, 'in_progress', [], null) }, 0);
  const added = rev('response.output_item.added', { output_index: 0, item: fcItem('in_progress', '') }, 1);
  const d1 = rev('response.function_call_arguments.delta', { item_id: 'fc_1', output_index: 0, delta: '{"city":' }, 2);
  if (cutAfterFirstDelta) return { headers: SSE, steps: [created, added, d1, 30, { destroy: true }] };
  return {
    headers: SSE,
    steps: [
      created,
      added,
      d1,
      rev('response.function_call_arguments.delta', { item_id: 'fc_1', output_index: 0, delta: '"Paris"}' }, 3),
      rev('response.function_call_arguments.done', { item_id: 'fc_1', output_index: 0, arguments: ARGS }, 4),
      rev('response.output_item.done', { output_index: 0, item: fcItem() }, 5),
      rev('response.completed', { response: resp(id, 'completed', [fcItem()]) }, 6),
    ],
  };
};
const createdOnly = (id: string) => rev('response.created', { response: resp(id, 'in_progress', [], null) }, 0);

/** Reads a stream to its end: its events, and what the SDK raised, if anything. */
async function drain(stream: AsyncIterable<{ type: string }>): Promise<{ events: Array<{ type: string; [k: string]: unknown }>; err: Error | undefined }> {
  const events: Array<{ type: string }> = [];
  try {
    for await (const e of stream) events.push(e);
    return { events, err: undefined };
  } catch (e) {
    return { events, err: e as Error };
  }
}

async function rejection(p: Promise<unknown>): Promise<InstanceType<typeof OpenAI.APIError>> {
  return p.then(
    () => expect.unreachable('expected a rejection'),
    (e: unknown) => e as InstanceType<typeof OpenAI.APIError>,
  );
}

/**
 * The text of a response's message items. responses.stream().finalResponse() in openai 6.x leaves `output_text` out
 * of a response it was not asked to parse (its snapshot goes through maybeParseResponse, which never adds it), so an
 * agent reading `final.output_text` from a stream gets undefined, gateway or not: read the items.
 */
const textOf = (r: { output: Array<{ type: string; content?: Array<{ type: string; text?: string }> }> }) =>
  r.output.flatMap((o) => (o.type === 'message' ? (o.content ?? []) : [])).map((c) => c.text ?? '').join('');

/** The requests a scripted upstream got that carry `previous_response_id` = id. */
const following = (seen: Seen[], id: string | undefined) => seen.filter((r) => r.body.previous_response_id === id);

// ---------------------------------------------------------------------------------------------------------------
describe('1. an agent loop with previous_response_id through bursts', () => {
  it('three turns (tool call, tool output, answer) through a 429 then two 503s: every turn answered, each turn at most maxAttempts upstream, once from the SDK', async () => {
    // turn 1: 429, call; turn 2: 503, 503, call again; turn 3: text.
    const g = await gateway((body, n) => {
      if (n === 1) return limited;
      if (n === 2) return wholeCall('resp_t1');
      if (n === 3 || n === 4) return unavailable;
      if (n === 5) return wholeCall('resp_t2');
      return wholeText('resp_t3', 'It is 18 degrees in Paris.');
    });
    const r1 = await g.client.responses.create({ model: 'gpt-4.1', input: 'Weather in Paris?', tools: [weatherTool] });
    const call1 = r1.output.find((o) => o.type === 'function_call');
    expect(call1).toMatchObject({ name: 'get_weather', arguments: ARGS, call_id: 'call_1' });
    const r2 = await g.client.responses.create({ model: 'gpt-4.1', previous_response_id: r1.id, input: [{ type: 'function_call_output', call_id: 'call_1', output: '18' }], tools: [weatherTool] });
    expect(r2.id).toBe('resp_t2');
    const r3 = await g.client.responses.create({ model: 'gpt-4.1', previous_response_id: r2.id, input: [{ type: 'function_call_output', call_id: 'call_1', output: '18' }], tools: [weatherTool] });
    expect(r3.output_text).toBe('It is 18 degrees in Paris.');
    expect(g.seen).toHaveLength(6);
    expect(following(g.seen, undefined)).toHaveLength(2);
    expect(following(g.seen, 'resp_t1')).toHaveLength(3);
    expect(following(g.seen, 'resp_t2')).toHaveLength(1);
    // The tool's output went with every attempt of its turn, unchanged.
    for (const r of following(g.seen, 'resp_t1')) expect(r.body.input).toEqual([{ type: 'function_call_output', call_id: 'call_1', output: '18' }]);
    expect(g.seen.map((r) => r.headers['x-retry-attempt'])).toEqual([undefined, '1', undefined, '1', '2', undefined]);
    expect(g.sdk.requests).toBe(3);
  });

  it('the same loop streamed with responses.stream().finalResponse(): the held-back 503s never reach the agent, the tool call arrives whole', async () => {
    const g = await gateway((_b, n) => {
      if (n === 1 || n === 2) return unavailable;
      if (n === 3) return streamedCall('resp_s1');
      if (n === 4) return limited;
      return streamedText('Done.');
    });
    const events: string[] = [];
    const s1 = g.client.responses.stream({ model: 'gpt-4.1', input: 'Weather in Paris?', tools: [weatherTool] });
    s1.on('event', (e) => events.push(e.type));
    const f1 = await s1.finalResponse();
    expect(f1.id).toBe('resp_s1');
    expect(f1.output).toEqual([expect.objectContaining({ type: 'function_call', arguments: ARGS })]);
    expect(events.filter((t) => t === 'response.created')).toHaveLength(1);
    const f2 = await g.client.responses.stream({ model: 'gpt-4.1', previous_response_id: f1.id, input: [{ type: 'function_call_output', call_id: 'call_1', output: '18' }] }).finalResponse();
    expect(textOf(f2)).toBe('Done.');
    expect(g.seen).toHaveLength(5);
    expect(following(g.seen, 'resp_s1')).toHaveLength(2);
    expect(g.sdk.requests).toBe(2);
  });

  it('a 503 burst longer than the attempts ends the turn: the agent gets the 503 with x-should-retry false, the provider maxAttempts requests, not 3 x (maxRetries+1)', async () => {
    const g = await gateway(() => unavailable);
    const err = await rejection(g.client.responses.create({ model: 'gpt-4.1', previous_response_id: 'resp_t1', input: [{ type: 'function_call_output', call_id: 'call_1', output: '18' }] }));
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.status).toBe(503);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(g.seen).toHaveLength(3);
    expect(g.sdk.requests).toBe(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('2. requests that add to something stored at the provider', () => {
  it('a conversation turn whose stream stalls after response.created: one upstream request, the SDK raises, the agent holds the response id', async () => {
    const g = await gateway(() => ({ headers: SSE, steps: [createdOnly('resp_conv1')], hold: true }), { timeouts: { firstTokenMs: 600, idleMs: 300 } });
    const { events, err } = await drain(await g.client.responses.create({ model: 'gpt-4.1', input: 'remember: 3 pm', conversation: 'conv_9', stream: true }));
    expect(events[0]?.type).toBe('response.created');
    expect((events[0] as unknown as { response: { id: string } }).response.id).toBe('resp_conv1');
    expect(err).toBeInstanceOf(Error);
    expect(err!.message).toMatch(/stalled|interrupted/);
    expect(events.some((e) => e.type === 'response.completed')).toBe(false);
    expect(g.seen).toHaveLength(1);
    expect(g.sdk.requests).toBe(1);
  });

  it('a conversation turn whose stream is cut after response.created, before any output: not sent again, the SDK raises, finalResponse() never resolves', async () => {
    const g = await gateway(() => ({ headers: SSE, steps: [createdOnly('resp_conv2'), 30, { destroy: true }] }));
    const stream = g.client.responses.stream({ model: 'gpt-4.1', input: 'and then?', conversation: { id: 'conv_9' } });
    let id: string | undefined;
    stream.on('response.created', (e) => (id = e.response.id));
    const err = await rejection(stream.finalResponse());
    expect(err).toBeInstanceOf(Error);
    expect(id).toBe('resp_conv2');
    expect(g.seen).toHaveLength(1);
    expect(g.sdk.requests).toBe(1);
  });

  it('a conversation turn through a 429 burst is retried as retryOn says (the provider answered: it took nothing) and answered once', async () => {
    const g = await gateway((_b, n) => (n <= 2 ? limited : streamedText('Noted.')));
    const { events, err } = await drain(await g.client.responses.create({ model: 'gpt-4.1', input: 'remember: 3 pm', conversation: 'conv_9', stream: true }));
    expect(err).toBeUndefined();
    expect(events.filter((e) => e.type === 'response.created')).toHaveLength(1);
    expect(events.at(-1)?.type).toBe('response.completed');
    expect(g.seen).toHaveLength(3);
    expect(g.seen.every((r) => r.body.conversation === 'conv_9')).toBe(true);
  });

  it('a conversation turn given a rate_limit_exceeded error event after response.created: the turn has started, so it is not sent again; the SDK raises', async () => {
    const ev = rev('error', { code: 'rate_limit_exceeded', message: 'Rate limit reached for gpt-4.1 on tokens per min', param: null }, 1);
    const g = await gateway((_b, n) => (n === 1 ? { headers: SSE, steps: [createdOnly('resp_conv3'), ev] } : streamedText('Second run.')));
    const { events, err } = await drain(await g.client.responses.create({ model: 'gpt-4.1', input: 'remember: 3 pm', conversation: 'conv_9', stream: true }));
    expect(events[0]?.type).toBe('response.created');
    expect(err).toBeInstanceOf(Error);
    expect(events.some((e) => e.type === 'response.completed')).toBe(false);
    expect(g.seen).toHaveLength(1);
    expect(g.sdk.requests).toBe(1);
  });

  it('a background create that times out once sent: 504 with x-should-retry false, one upstream request (neither gateway nor SDK queue a second job)', async () => {
    const g = await gateway(() => 'hang', { timeouts: { responseMs: 500 } });
    const err = await rejection(g.client.responses.create({ model: 'o3-deep-research', input: 'a market report', background: true }));
    expect(err.status).toBe(504);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(g.seen).toHaveLength(1);
    expect(g.sdk.requests).toBe(1);
    const line = await requestLine(g.s, 'responses');
    expect(line.attempts).toHaveLength(1);
  });

  it('a background stream cut after response.created: one upstream request, the SDK raises, the id to poll is in the agent\'s hands', async () => {
    const g = await gateway(() => ({ headers: SSE, steps: [createdOnly('resp_bg1'), rev('response.queued', { response: resp('resp_bg1', 'queued', [], null) }, 1), 30, { destroy: true }] }));
    const { events, err } = await drain(await g.client.responses.create({ model: 'o3-deep-research', input: 'a market report', background: true, stream: true }));
    expect((events[0] as unknown as { response: { id: string } }).response.id).toBe('resp_bg1');
    expect(err).toBeInstanceOf(Error);
    expect(g.seen).toHaveLength(1);
  });

  it('a background stream refused with a 503 before response.created is retried: nothing was queued', async () => {
    const g = await gateway((_b, n) => (n === 1 ? unavailable : streamedText('Queued and done.')));
    const { events, err } = await drain(await g.client.responses.create({ model: 'o3-deep-research', input: 'a market report', background: true, stream: true }));
    expect(err).toBeUndefined();
    expect(events.at(-1)?.type).toBe('response.completed');
    expect(g.seen).toHaveLength(2);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('3. tool-call items streamed, then cut', () => {
  it('cut inside the function call\'s arguments: the SDK raises, finalResponse() rejects, never a response that looks complete; one upstream request', async () => {
    const g = await gateway(() => streamedCall('resp_cut', true));
    const stream = g.client.responses.stream({ model: 'gpt-4.1', input: 'Weather in Paris?', tools: [weatherTool] });
    const types: string[] = [];
    stream.on('event', (e) => types.push(e.type));
    const err = await rejection(stream.finalResponse());
    expect(err).toBeInstanceOf(Error);
    expect(types).toContain('response.function_call_arguments.delta');
    expect(types).not.toContain('response.completed');
    expect(types).not.toContain('response.function_call_arguments.done');
    expect(g.seen).toHaveLength(1);
    expect(g.sdk.requests).toBe(1);
  });

  it('cut after response.created and before any output (no conversation): retried, the agent sees one response.created and the whole call', async () => {
    const g = await gateway((_b, n) => (n === 1 ? { headers: SSE, steps: [createdOnly('resp_x'), 20, { destroy: true }] } : streamedCall('resp_ok')));
    const { events, err } = await drain(await g.client.responses.create({ model: 'gpt-4.1', input: 'Weather in Paris?', tools: [weatherTool], stream: true }));
    expect(err).toBeUndefined();
    expect(events.filter((e) => e.type === 'response.created')).toHaveLength(1);
    expect((events[0] as unknown as { response: { id: string } }).response.id).toBe('resp_ok');
    const done = events.find((e) => e.type === 'response.function_call_arguments.done') as unknown as { arguments: string };
    expect(done.arguments).toBe(ARGS);
    expect(g.seen).toHaveLength(2);
    expect(g.seen[1]!.headers['x-retry-attempt']).toBe('1');
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('4. response.failed, response.incomplete and error events', () => {
  const failedEvent = (code: string, seq: number, msg = 'The model failed') =>
    rev('response.failed', { response: { ...resp('resp_f', 'failed', [], null), error: { code, message: msg } } }, seq);

  it('response.failed server_error before the first output: retried, the agent gets the second attempt\'s answer', async () => {
    const g = await gateway((_b, n) => (n === 1 ? { headers: SSE, steps: [createdOnly('resp_f'), failedEvent('server_error', 1)] } : streamedText('Fine.')));
    const final = await g.client.responses.stream({ model: 'gpt-4.1', input: 'hi' }).finalResponse();
    expect(textOf(final)).toBe('Fine.');
    expect(g.seen).toHaveLength(2);
  });

  it('response.failed after the first output: the SDK raises (an error event added), finalResponse() does not resolve with the partial text; not retried', async () => {
    const g = await gateway(() => ({ headers: SSE, steps: [...responsesHead(), textDelta('Half an ans', 4), failedEvent('server_error', 5)] }));
    const stream = g.client.responses.stream({ model: 'gpt-4.1', input: 'hi' });
    const err = await rejection(stream.finalResponse());
    expect(err).toBeInstanceOf(Error);
    expect(g.seen).toHaveLength(1);
  });

  it('an error event with rate_limit_exceeded after response.created, every attempt: the agent gets a 429 with the provider\'s message and code', async () => {
    const ev = rev('error', { code: 'rate_limit_exceeded', message: 'Rate limit reached for gpt-4.1 on tokens per min', param: null }, 1);
    const g = await gateway(() => ({ headers: SSE, steps: [createdOnly('resp_r'), ev] }));
    const err = await rejection(g.client.responses.create({ model: 'gpt-4.1', input: 'hi', stream: true }).then(drain).then((d) => (d.err ? Promise.reject(d.err) : d)));
    expect(err.status).toBe(429);
    expect(err.code).toBe('rate_limit_exceeded');
    expect(err.message).toContain('Rate limit reached');
    expect(g.seen).toHaveLength(3);
    expect(g.sdk.requests).toBe(1);
  });

  it('an error event after the first output ends the stream with an error the SDK raises, sequence numbers in order', async () => {
    const ev = rev('error', { code: 'server_error', message: 'boom', param: null }, 5);
    const g = await gateway(() => ({ headers: SSE, steps: [...responsesHead(), textDelta('Par', 4), ev] }));
    const { events, err } = await drain(await g.client.responses.create({ model: 'gpt-4.1', input: 'hi', stream: true }));
    expect(err).toBeInstanceOf(Error);
    expect(events.map((e) => e.type)).toContain('response.output_text.delta');
    const seqs = events.map((e) => e.sequence_number as number);
    expect(seqs).toEqual([...seqs].sort((a, b) => a - b));
    expect(g.seen).toHaveLength(1);
  });

  it('response.incomplete (max_output_tokens) after output is an answer: finalResponse() resolves with status incomplete, not retried', async () => {
    const incomplete = { ...resp('resp_i', 'incomplete', [msgItem('Partly', 'incomplete')]), incomplete_details: { reason: 'max_output_tokens' } };
    const g = await gateway(() => ({ headers: SSE, steps: [...responsesHead(), textDelta('Partly', 4), rev('response.incomplete', { response: incomplete }, 5)] }));
    const events: string[] = [];
    const stream = g.client.responses.stream({ model: 'gpt-4.1', input: 'hi', max_output_tokens: 16 });
    stream.on('event', (e) => events.push(e.type));
    const { err } = await drain(stream);
    expect(err).toBeUndefined();
    expect(events.at(-1)).toBe('response.incomplete');
    expect(g.seen).toHaveLength(1);
  });

  it('a whole answer with status failed (server_error) is retried; status incomplete is passed on as the answer it is', async () => {
    const failedWhole = json(200, { ...resp('resp_w', 'failed', [], null), error: { code: 'server_error', message: 'The model failed' } });
    const incompleteWhole = json(200, { ...resp('resp_w2', 'incomplete', [msgItem('Partly', 'incomplete')]), incomplete_details: { reason: 'max_output_tokens' } });
    const g = await gateway((_b, n) => (n === 1 ? failedWhole : incompleteWhole));
    const r = await g.client.responses.create({ model: 'gpt-4.1', input: 'hi' });
    expect(r.status).toBe('incomplete');
    expect(r.output_text).toBe('Partly');
    expect(g.seen).toHaveLength(2);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('5. usage', () => {
  it('a streamed answer after a retry: the SDK\'s usage is the provider\'s, and stormgate_tokens_total counts it once', async () => {
    const g = await gateway((_b, n) => (n === 1 ? unavailable : streamedText('Fine.')));
    const final = await g.client.responses.stream({ model: 'gpt-4.1', input: 'hi' }).finalResponse();
    expect(final.usage).toMatchObject({ input_tokens: 12, output_tokens: 2, total_tokens: 14 });
    await requestLine(g.s, 'responses');
    expect(await metricSum(g.s, 'stormgate_tokens_total')).toBe(14);
  });

  it('a whole answer: usage passed through, counted once', async () => {
    const g = await gateway(() => wholeText('resp_u', 'Fine.'));
    const r = await g.client.responses.create({ model: 'gpt-4.1', input: 'hi' });
    expect(r.usage).toMatchObject({ input_tokens: 12, output_tokens: 2 });
    await requestLine(g.s, 'responses');
    expect(await metricSum(g.s, 'stormgate_tokens_total')).toBe(14);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('6. the SDK\'s maxRetries beside the gateway\'s retries', () => {
  it('a 429 hint longer than maxWaitHintMs, one upstream request: x-should-retry true with retry-after-ms, the SDK waits and comes back once, answered', async () => {
    const hinted = json(429, { error: { message: 'Rate limit reached', type: 'requests', code: 'rate_limit_exceeded' } }, { 'retry-after-ms': '800' });
    const g = await gateway((_b, n) => (n === 1 ? hinted : wholeText('resp_back', 'Back.')), { route: { retry: { maxAttempts: 3, maxWaitHintMs: 200, backoff: { strategy: 'fixed', baseMs: 10 } } } });
    const t0 = Date.now();
    const r = await g.client.responses.create({ model: 'gpt-4.1', input: 'hi' });
    expect(r.output_text).toBe('Back.');
    expect(Date.now() - t0).toBeGreaterThanOrEqual(750);
    expect(g.seen).toHaveLength(2);
    expect(g.sdk.requests).toBe(2);
    expect(g.seen[1]!.headers['x-stainless-retry-count']).toBe('1');
  });

  it('a 429 burst waited out by the gateway to its last attempt: x-should-retry false, provider maxAttempts requests, SDK one', async () => {
    const g = await gateway(() => limited);
    const err = await rejection(g.client.responses.create({ model: 'gpt-4.1', input: 'hi', previous_response_id: 'resp_t1' }));
    expect(err.status).toBe(429);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(g.seen).toHaveLength(3);
    expect(g.sdk.requests).toBe(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('7. failover on /v1/responses', () => {
  it('a plain turn goes to the backup after the primary\'s 503s; a previous_response_id turn never does (its history lives at the primary)', async () => {
    const g = await gateway(() => unavailable, { backup: () => wholeText('resp_b', 'From the backup.') });
    const r = await g.client.responses.create({ model: 'gpt-4.1', input: 'hi' }).withResponse();
    expect(r.data.output_text).toBe('From the backup.');
    expect(r.response.headers.get('x-stormgate-target')).toMatch(/^q/);
    expect(g.backupSeen).toHaveLength(1);
    const before = g.seen.length;
    const err = await rejection(g.client.responses.create({ model: 'gpt-4.1', input: 'and then?', previous_response_id: 'resp_b' }));
    expect(err.status).toBe(503);
    expect(g.seen.length - before).toBe(3);
    expect(g.backupSeen).toHaveLength(1);
  });

  it('a conversation turn never goes to the backup either', async () => {
    const g = await gateway(() => unavailable, { backup: () => wholeText('resp_b', 'From the backup.') });
    const err = await rejection(g.client.responses.create({ model: 'gpt-4.1', input: 'remember', conversation: 'conv_9' }));
    expect(err.status).toBe(503);
    expect(g.backupSeen).toHaveLength(0);
    expect(g.seen).toHaveLength(3);
  });

  it('a background create never goes to the backup: a job queued there would be polled at the primary', async () => {
    const g = await gateway(() => unavailable, { backup: () => json(200, { ...resp('resp_bq', 'queued', [], null), background: true }) });
    const err = await rejection(g.client.responses.create({ model: 'o3-deep-research', input: 'a report', background: true }));
    expect(err.status).toBe(503);
    expect(g.backupSeen).toHaveLength(0);
    expect(g.seen).toHaveLength(3);
    expect(g.sdk.requests).toBe(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('8. an Idempotency-Key on a background create', () => {
  it('the SDK times out at 1 s, the provider answers at 1.5 s: one job upstream, the SDK\'s own retry gets its answer', async () => {
    const slow: Script = { headers: { 'content-type': 'application/json' }, steps: [1_500, JSON.stringify({ ...resp('resp_job', 'queued', [], null), background: true })] };
    const g = await gateway(() => slow);
    const r = await g.client.responses.create({ model: 'o3-deep-research', input: 'a market report', background: true }, { headers: { 'Idempotency-Key': 'job-7f3a' }, timeout: 1_000 });
    expect(r.id).toBe('resp_job');
    expect(r.status).toBe('queued');
    expect(g.seen).toHaveLength(1);
    expect(g.sdk.requests).toBeGreaterThanOrEqual(2);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('9. the OpenAI Agents SDK on its Responses model', () => {
  it('run() with a tool through 503 bursts on both turns: the tool runs once, the final output arrives, each turn sent by the SDK once', async () => {
    const g = await gateway((body, n) => {
      if (n === 1 || n === 3 || n === 4) return unavailable;
      if (n === 2) return body.stream === true ? streamedCall('resp_a1') : wholeCall('resp_a1');
      return body.stream === true ? streamedText('18 degrees.') : wholeText('resp_a2', '18 degrees.');
    });
    const calls: unknown[] = [];
    const getWeather = agentTool({ name: 'get_weather', description: 'Weather of a city', parameters: z.object({ city: z.string() }), execute: async (input) => (calls.push(input), '18') });
    const model = new OpenAIResponsesModel(g.client as unknown as ConstructorParameters<typeof OpenAIResponsesModel>[0], 'gpt-4.1');
    const agent = new Agent({ name: 'weather', instructions: 'Use the tool.', tools: [getWeather], model });
    const result = await run(agent, 'Weather in Paris?');
    expect(result.finalOutput).toBe('18 degrees.');
    expect(calls).toEqual([{ city: 'Paris' }]);
    expect(g.seen).toHaveLength(5);
    expect(g.sdk.requests).toBe(2);
    // The second turn carries the tool's output.
    expect(JSON.stringify(g.seen[4]!.body.input)).toContain('function_call_output');
  });
});
