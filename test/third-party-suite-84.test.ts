// Third-party failure-scenario suite 84: the OpenAI Responses API (`/v1/responses`) as agents drive it through the
// official `openai` 6.x SDK (maxRetries: 0), on what suites 68, 76 and 14 covered least. Written from OpenAI's docs
// (background mode: `background: true` answers `queued`, polled with GET /v1/responses/{id} while `queued` or
// `in_progress`, streamed and resumed by `sequence_number` with `starting_after`, cancelled; `incomplete_details.reason`
// `max_output_tokens` | `content_filter`; `response.failed` and the `error` event; usage with
// `input_tokens_details.cached_tokens` and `output_tokens_details.reasoning_tokens`, which are parts of input_tokens
// and output_tokens, not additions) and from openai-node #1983/#1984: `responses.stream({ response_id, starting_after })`
// asks for the whole replay (`?stream=true`, no cursor) and filters the events before the cursor itself.
// What the gateway promises, from the README ("What a retry may repeat", "Streaming", "Failover and API families",
// "Passthrough"), and checked here on node:http upstreams of the suite's own over real HTTP on 127.0.0.1:
//  1. background streams: an error (`response.failed`, `error` with rate_limit_exceeded) after `response.created`
//     and before any output is the client's, never retried (the job was queued); a stream cut after its 200 but
//     before `response.created` is not sent again either (502, x-should-retry false); a 429 or 500 the provider
//     answered is retried at the first target, never failed over; a whole background create whose Response is
//     `failed` (rate_limit_exceeded) is its 429, not sent again; poll and resume through passthrough, the SDK's
//     `responses.stream({ response_id, starting_after })` included;
//  2. `previous_response_id` is retried like any request (a timeout, a stream cut before its first output) but only at
//     the first target, and a 429 hint past maxWaitHintMs invites the client back rather than moving it to q; a
//     `conversation` is not sent again after a failed Response, streamed or whole;
//  3. a function-call tool loop: arguments streamed whole, the `function_call_output` turn through a 500, byte for byte;
//  4. `store: false` with `include: ["reasoning.encrypted_content"]` fails over, billed to the target that answered;
//  5. usage: cached and reasoning tokens are not counted twice; `response.incomplete` (content_filter, no output)
//     is an answer, not a failure to retry or route around; 500 and 429 before a stream starts are retried, the
//     client's one stream numbered from 0, the stream's end kind in the log and metrics.
// Found here: no gateway defect. Two first drafts misread the SDK, not the gateway: the stream helper's finalResponse()
// has no `output_text`, and takes only `response.completed` as its final snapshot, so a stream that ends in
// `response.incomplete` resolves with `status: "in_progress"` (openai 6.30); those cases read the events instead.
// Bounds are generous: a loaded 2-core machine.
import type { IncomingMessage, RequestListener, ServerResponse } from 'node:http';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { sdkError } from './helpers/openai-error.ts';
import { readResponseStream } from './helpers/responses-stream.ts';
import { baseResponse, json, msgItem, play, responsesHead, responsesTail, rev, scripted, textDelta, type Answer, type Script, type Seen } from './helpers/scripted-provider.ts';
import { metricSum, requestLine, useStacks, type Stack } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();

type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];
type ResponseEvent = OpenAI.Responses.ResponseStreamEvent;

const MODEL = 'gpt-4.1';
const usage = { input_tokens: 12, input_tokens_details: { cached_tokens: 0 }, output_tokens: 2, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 14 };
const RATE = 'Rate limit reached for gpt-4.1 in organization org-x on requests per min (RPM): Limit 500, Used 500, Requested 1.';

/** A whole stream of `Hello`: head (0-3), two deltas (4, 5), tail (6-9). */
const full = (): string[] => [...responsesHead(), textDelta('Hel', 4), textDelta('lo', 5), ...responsesTail('Hello', 6)];
const errorEvent = (code: string, message: string, seq: number) => `event: error\ndata: ${JSON.stringify({ type: 'error', code, message, param: null, sequence_number: seq })}\n\n`;
const failedResponse = (code: string, message: string, extra: Record<string, unknown> = {}) => ({ ...baseResponse('failed'), error: { code, message }, ...extra });
const serverError = (status = 500) => json(status, { error: { message: 'The server had an error while processing your request.', type: 'server_error', param: null, code: null } });
const rateLimited = (retryAfter = '0') => json(429, { error: { message: RATE, type: 'requests', param: null, code: 'rate_limit_exceeded' } }, { 'retry-after': retryAfter });
const completed = (text: string, extra: Record<string, unknown> = {}) => json(200, { ...baseResponse('completed', [msgItem(text)], usage), ...extra });

// The background job's Response as each poll finds it, and its whole event sequence (created queued, in_progress, text).
const BG = 'resp_bg84';
const bgResponse = (status: string, output: unknown[] = [], u: unknown = null) => ({ ...baseResponse(status, output, u), id: BG, background: true });
const job = (): string[] => [
  rev('response.created', { response: bgResponse('queued') }, 0),
  rev('response.in_progress', { response: bgResponse('in_progress') }, 1),
  ...responsesHead().slice(2),
  textDelta('Hel', 4),
  textDelta('lo', 5),
  ...responsesTail('Hello', 6).slice(0, 3),
  rev('response.completed', { response: bgResponse('completed', [msgItem('Hello')], usage) }, 9),
];

interface Provider {
  origin: string;
  seen: Seen[];
  /** Creates only (POST /v1/responses). */
  creates: () => Seen[];
}

/**
 * A Responses API provider: POST /v1/responses plays `create`; any other call (a poll, a resume, a cancel, reaching it
 * through passthrough) is answered by `other`, given its method and URL, and recorded as `METHOD url`.
 */
async function provider(create: Answer | ((b: Record<string, unknown>, n: number) => Script | 'hang'), other?: (method: string, url: string, n: number) => Script | undefined): Promise<Provider> {
  const seen: Seen[] = [];
  const creates = scripted(create, seen);
  let others = 0;
  const handler: RequestListener = (req: IncomingMessage, res: ServerResponse) => {
    if (req.method === 'POST' && req.url === '/v1/responses') return creates(req, res);
    req.resume();
    seen.push({ body: {}, headers: req.headers, url: `${req.method} ${req.url}`, at: Date.now() });
    const s = other?.(req.method ?? '', req.url ?? '', ++others) ?? json(404, { error: { message: 'not found', type: 'invalid_request_error', param: null, code: null } });
    void play(res, s);
  };
  const p = await startProvider(handler);
  return { origin: p.origin, seen, creates: () => seen.filter((x) => x.url === '/v1/responses') };
}

const timeouts = { connectMs: 2_000, firstTokenMs: 5_000, idleMs: 5_000 };

/** A gateway whose /v1/responses route goes to p, then q; passthrough of the stored responses' calls to p, as the README says. */
async function gateway(p: Provider, q?: Provider, o: { route?: Partial<RouteInput>; p?: Partial<ProviderInput> } = {}): Promise<{ s: Stack; client: OpenAI }> {
  const s = await startStack({
    config: () => ({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: {
        p: { family: 'openai', baseUrl: `${p.origin}/v1`, apiKey: 'p-key-0123456789', breaker: false, timeouts, ...o.p },
        ...(q && { q: { family: 'openai', baseUrl: `${q.origin}/v1`, apiKey: 'q-key-0123456789', breaker: false, timeouts } }),
      },
      routes: [
        {
          name: 'responses',
          match: { path: '/v1/responses' },
          targets: [{ provider: 'p' }, ...(q ? [{ provider: 'q' }] : [])],
          retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 10, capMs: 10 } },
          budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 },
          park: false,
          timeoutMs: 20_000,
          ...o.route,
        },
      ],
      passthrough: { provider: 'p', paths: ['/v1/responses/'], methods: ['GET', 'POST', 'DELETE'] },
    }),
  });
  return { s, client: new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-agent', maxRetries: 0 }) };
}

/** Every event a raw `create({ stream: true })` or `retrieve(id, { stream: true })` yields, and what it raised. */
async function drain(stream: AsyncIterable<ResponseEvent>): Promise<{ events: ResponseEvent[]; error?: unknown }> {
  const events: ResponseEvent[] = [];
  try {
    for await (const e of stream) events.push(e);
    return { events };
  } catch (error) {
    return { events, error };
  }
}

const series = (s: Stack, line: string) => metricSum(s, `${line} `);
/** The text of a Response's messages (the stream helper's finalResponse() has no output_text). */
const textOf = (r: OpenAI.Responses.Response) =>
  r.output.flatMap((o) => (o.type === 'message' ? o.content : [])).map((c) => (c.type === 'output_text' ? c.text : '')).join('');

// ---------------------------------------------------------------------------------------------------------------

describe('a background stream: the job is queued at its response.created', () => {
  it.each<[string, string, string]>([
    ['a response.failed server_error', rev('response.failed', { response: failedResponse('server_error', 'The model failed to generate a response.', { id: BG, background: true }) }, 2), 'The model failed to generate a response.'],
    ['an error event rate_limit_exceeded', errorEvent('rate_limit_exceeded', RATE, 2), RATE],
  ])('%s after response.created, before any output, is the client\'s: the id to poll, the provider\'s error raised, never sent again or to q', async (_name, failure, words) => {
    const p = await provider(() => ({ steps: [...job().slice(0, 2), failure] }));
    const q = await provider(() => ({ steps: job() }));
    const { s, client } = await gateway(p, q);
    const { events, error } = await drain(await client.responses.create({ model: 'o3-deep-research', input: 'a report', background: true, stream: true }));
    expect(events[0]).toMatchObject({ type: 'response.created', response: { id: BG, status: 'queued' } });
    expect(error).toBeInstanceOf(OpenAI.APIError);
    expect((error as Error).message).toContain(words);
    expect(events.some((e) => e.type === 'response.completed')).toBe(false);
    expect(p.creates()).toHaveLength(1);
    expect(q.seen).toHaveLength(0);
    const line = await requestLine(s, 'responses');
    expect(line.streamEnd).toBe('upstream-error');
    expect(line.attempts).toHaveLength(1);
    expect(await series(s, 'stormgate_stream_ends_total{route="responses",end="upstream-error"}')).toBe(1);
  });

  it('cut after its 200 but before response.created: 502 with x-should-retry false, one job at most, none at q', async () => {
    const p = await provider(() => ({ steps: [50, { destroy: true }] }));
    const q = await provider(() => ({ steps: job() }));
    const { client } = await gateway(p, q);
    const err = await sdkError(client.responses.create({ model: 'o3-deep-research', input: 'a report', background: true, stream: true }));
    expect(err.status).toBe(502);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(p.creates()).toHaveLength(1);
    expect(q.seen).toHaveLength(0);
  });

  it('resumed with the SDK helper responses.stream({ response_id, starting_after }) through passthrough: the whole replay asked, finalResponse() whole, one job', async () => {
    const p = await provider(
      () => ({ steps: [...job().slice(0, 5), 30, { destroy: true }] }),
      (method, url) => (method === 'GET' && url.startsWith(`/v1/responses/${BG}?stream=true`) ? { steps: job() } : undefined),
    );
    const { client } = await gateway(p);
    const first = await drain(await client.responses.create({ model: 'o3-deep-research', input: 'a report', background: true, stream: true }));
    expect(first.error).toBeInstanceOf(OpenAI.APIError);
    const cursor = first.events.at(-1)!.sequence_number;
    expect(cursor).toBe(4);
    const resumed = client.responses.stream({ response_id: BG, starting_after: cursor });
    const seenAfter: number[] = [];
    resumed.on('event', (e) => seenAfter.push(e.sequence_number));
    const final = await resumed.finalResponse();
    expect(final.status).toBe('completed');
    expect(textOf(final)).toBe('Hello');
    // The helper filters what the agent already had; the replay itself came whole from the provider.
    expect(seenAfter).toEqual([5, 6, 7, 8, 9]);
    expect(p.seen.map((x) => x.url)).toEqual(['/v1/responses', `GET /v1/responses/${BG}?stream=true`]);
  });
});

describe('a whole background create', () => {
  it.each<[string, Script]>([
    ['a 429', rateLimited()],
    ['a 500', serverError()],
  ])('through %s the provider answered is retried at p, never queued at q; polled through passthrough to completed', async (_name, failure) => {
    const p = await provider(
      (_b, n) => (n === 1 ? failure : json(200, bgResponse('queued'))),
      (method, url, n) => (method === 'GET' && url === `/v1/responses/${BG}` ? json(200, n < 2 ? bgResponse('in_progress') : bgResponse('completed', [msgItem('Hello')], usage)) : undefined),
    );
    const q = await provider(() => json(200, { ...bgResponse('queued'), id: 'resp_q' }));
    const { client } = await gateway(p, q);
    let r = await client.responses.create({ model: 'o3-deep-research', input: 'a report', background: true });
    expect(r).toMatchObject({ id: BG, status: 'queued', background: true });
    while (r.status === 'queued' || r.status === 'in_progress') r = await client.responses.retrieve(r.id);
    expect(r.status).toBe('completed');
    expect(r.output_text).toBe('Hello');
    expect(p.creates()).toHaveLength(2);
    expect(p.creates()[1]!.raw).toBe(p.creates()[0]!.raw);
    expect(q.seen).toHaveLength(0);
  });

  it('whose Response is failed with rate_limit_exceeded is its 429 at once, x-should-retry false: the provider stored it', async () => {
    const p = await provider(() => json(200, failedResponse('rate_limit_exceeded', RATE, { id: BG, background: true })));
    const { client } = await gateway(p);
    const err = await sdkError(client.responses.create({ model: 'o3-deep-research', input: 'a report', background: true }));
    expect(err).toBeInstanceOf(OpenAI.RateLimitError);
    expect(err.message).toContain('Rate limit reached for gpt-4.1');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(p.creates()).toHaveLength(1);
  });
});

describe('previous_response_id and conversation: the state lives at p', () => {
  const follow = { model: MODEL, input: 'and then?', previous_response_id: 'resp_turn1' };

  it('a follow-up that timed out after it was sent is retried at p (it only stores one response more), never sent to q', async () => {
    const p = await provider((_b, n) => (n === 1 ? 'hang' : completed('from p', { id: 'resp_turn2', previous_response_id: 'resp_turn1' })));
    const q = await provider(() => completed('from q'));
    const { client } = await gateway(p, q, { p: { timeouts: { ...timeouts, responseMs: 500 } } });
    const r = await client.responses.create(follow);
    expect(r.output_text).toBe('from p');
    expect(p.creates().map((x) => x.body.previous_response_id)).toEqual(['resp_turn1', 'resp_turn1']);
    expect(q.seen).toHaveLength(0);
  });

  it('a follow-up whose 429 hint outlasts maxWaitHintMs is that 429 at once, the client invited back after the hint; q never asked', async () => {
    const p = await provider(() => rateLimited('5'));
    const q = await provider(() => completed('from q'));
    const { client } = await gateway(p, q, { route: { retry: { maxAttempts: 3, maxWaitHintMs: 500, backoff: { strategy: 'fixed', baseMs: 10, capMs: 10 } } } });
    const started = Date.now();
    const err = await sdkError(client.responses.create(follow));
    expect(Date.now() - started).toBeLessThan(3_000);
    expect(err).toBeInstanceOf(OpenAI.RateLimitError);
    expect(err.headers?.get('x-should-retry')).toBe('true');
    expect(Number(err.headers?.get('retry-after'))).toBeGreaterThanOrEqual(5);
    expect(p.creates()).toHaveLength(1);
    expect(q.seen).toHaveLength(0);
    // A new conversation meanwhile goes to q at once: only the follow-up is pinned to p.
    expect((await client.responses.create({ model: MODEL, input: 'new' })).output_text).toBe('from q');
  });

  it('a follow-up stream cut after response.created, before output, is retried at p; the SDK gets one stream numbered from 0', async () => {
    const p = await provider((_b, n) => ({ steps: n === 1 ? [...responsesHead().slice(0, 2), 20, { destroy: true }] : full() }));
    const q = await provider(() => ({ steps: full() }));
    const { client } = await gateway(p, q);
    const { events, final, error } = await readResponseStream(client.responses.stream(follow));
    expect(error).toBeUndefined();
    expect(textOf(final!)).toBe('Hello');
    expect(events.map((e) => e.sequence_number)).toEqual(events.map((_e, i) => i));
    expect(events.filter((e) => e.type === 'response.created')).toHaveLength(1);
    expect(p.creates()).toHaveLength(2);
    expect(q.seen).toHaveLength(0);
  });

  it('a conversation turn whose stream failed after response.created is not sent again (the turn is in the conversation), where one without is retried', async () => {
    const failedStream = { steps: [...responsesHead().slice(0, 2), rev('response.failed', { response: failedResponse('server_error', 'The model failed.') }, 2)] };
    const p = await provider((b, n) => (b.conversation ? failedStream : n === 2 ? failedStream : { steps: full() }));
    const { client } = await gateway(p);
    const turn = await drain(await client.responses.create({ model: MODEL, input: 'remember: 3 pm', conversation: 'conv_84', stream: true }));
    expect(turn.events.map((e) => e.type)).toEqual(['response.created', 'response.in_progress', 'response.failed']);
    expect(turn.error).toBeInstanceOf(OpenAI.APIError);
    expect(p.creates()).toHaveLength(1);
    const plain = await readResponseStream(client.responses.stream({ model: MODEL, input: 'hi' }));
    expect(textOf(plain.final!)).toBe('Hello');
    expect(p.creates()).toHaveLength(3);
  });

  it('a whole conversation turn whose Response is failed (server_error) is 502 at once with x-should-retry false', async () => {
    const p = await provider(() => json(200, failedResponse('server_error', 'The model failed.')));
    const q = await provider(() => completed('from q'));
    const { client } = await gateway(p, q);
    const err = await sdkError(client.responses.create({ model: MODEL, input: 'remember: 3 pm', conversation: { id: 'conv_84' } }));
    expect(err.status).toBe(502);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(p.creates()).toHaveLength(1);
    expect(q.seen).toHaveLength(0);
  });
});

describe('an agent tool loop on function calls', () => {
  const tools: OpenAI.Responses.Tool[] = [{ type: 'function', name: 'get_weather', description: 'Weather of a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] }, strict: true }];
  const call = { id: 'fc_1', type: 'function_call', status: 'completed', call_id: 'call_84', name: 'get_weather', arguments: '{"city":"Zürich"}' };
  const callStream = (): string[] => [
    rev('response.created', { response: { ...baseResponse('in_progress'), id: 'resp_turn1' } }, 0),
    rev('response.in_progress', { response: { ...baseResponse('in_progress'), id: 'resp_turn1' } }, 1),
    rev('response.output_item.added', { output_index: 0, item: { ...call, status: 'in_progress', arguments: '' } }, 2),
    rev('response.function_call_arguments.delta', { item_id: 'fc_1', output_index: 0, delta: '{"city":' }, 3),
    rev('response.function_call_arguments.delta', { item_id: 'fc_1', output_index: 0, delta: '"Zürich"}' }, 4),
    rev('response.function_call_arguments.done', { item_id: 'fc_1', output_index: 0, arguments: call.arguments }, 5),
    rev('response.output_item.done', { output_index: 0, item: call }, 6),
    rev('response.completed', { response: { ...baseResponse('completed', [call], usage), id: 'resp_turn1' } }, 7),
  ];

  it('streams the call whole, then sends its function_call_output turn through a 500 to p again byte for byte, never to q', async () => {
    const p = await provider((b, n) => (b.previous_response_id === undefined ? { steps: callStream() } : n === 2 ? serverError() : completed('It is 18 °C in Zürich.', { id: 'resp_turn2' })));
    const q = await provider(() => completed('from q'));
    const { client } = await gateway(p, q);
    const turn1 = await client.responses.stream({ model: MODEL, input: 'Weather in Zürich?', tools }).finalResponse();
    const fc = turn1.output.find((o) => o.type === 'function_call') as OpenAI.Responses.ResponseFunctionToolCall;
    expect(JSON.parse(fc.arguments)).toEqual({ city: 'Zürich' });
    const turn2 = await client.responses.create({ model: MODEL, tools, previous_response_id: turn1.id, input: [{ type: 'function_call_output', call_id: fc.call_id, output: '{"temp_c":18}' }] });
    expect(turn2.output_text).toBe('It is 18 °C in Zürich.');
    const followUps = p.creates().slice(1);
    expect(followUps).toHaveLength(2);
    expect(followUps[1]!.raw).toBe(followUps[0]!.raw);
    expect(followUps[0]!.body.input).toEqual([{ type: 'function_call_output', call_id: 'call_84', output: '{"temp_c":18}' }]);
    expect(q.seen).toHaveLength(0);
  });
});

describe('store: false with encrypted reasoning', () => {
  it('a stateless whole turn fails over from p\'s lasting 500s to q with its input byte for byte; q\'s encrypted reasoning back; q billed', async () => {
    const reasoning = { id: 'rs_2', type: 'reasoning', summary: [], encrypted_content: 'gAAAAABo-q-blob==' };
    const p = await provider(() => serverError());
    const q = await provider(() => completed('Ships Monday.', { output: [reasoning, msgItem('Ships Monday.')], store: false, usage: { ...usage, output_tokens: 40, output_tokens_details: { reasoning_tokens: 32 }, total_tokens: 52 } }));
    const { s, client } = await gateway(p, q);
    const body = {
      model: 'o4-mini',
      store: false,
      include: ['reasoning.encrypted_content' as const],
      input: [
        { role: 'user' as const, content: 'Where is order 7?' },
        { id: 'rs_1', type: 'reasoning' as const, summary: [], encrypted_content: 'gAAAAABo-p-blob==' },
        { type: 'function_call_output' as const, call_id: 'call_1', output: '{"status":"packed"}' },
      ],
    };
    const { data, response } = await client.responses.create(body).withResponse();
    expect(data.output[0]).toEqual(reasoning);
    expect(data.output_text).toBe('Ships Monday.');
    expect(response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(p.creates()).toHaveLength(3);
    expect(q.seen).toHaveLength(1);
    expect(q.seen[0]!.raw).toBe(p.creates()[0]!.raw);
    expect(await series(s, 'stormgate_tokens_total{route="responses",target="q/o4-mini",kind="completion"}')).toBe(40);
    expect(await metricSum(s, 'stormgate_tokens_total{route="responses",target="p/')).toBe(0);
  });
});

describe('usage, incomplete answers, and failures before the stream starts', () => {
  // cached_tokens is part of input_tokens, reasoning_tokens part of output_tokens (OpenAI's usage object).
  const agentUsage = { input_tokens: 2006, input_tokens_details: { cached_tokens: 1920 }, output_tokens: 512, output_tokens_details: { reasoning_tokens: 448 }, total_tokens: 2518 };

  it.each([true, false])('counts cached and reasoning tokens once, inside input and output tokens (stream: %s)', async (stream) => {
    const done = { ...baseResponse('completed', [msgItem('Hello')], agentUsage), metadata: { usage: 'nightly-eval' } };
    const p = await provider(() => (stream ? { steps: [...full().slice(0, -1), rev('response.completed', { response: done }, 9)] } : json(200, done)));
    const { s, client } = await gateway(p);
    const r = stream ? await client.responses.stream({ model: MODEL, input: 'hi' }).finalResponse() : await client.responses.create({ model: MODEL, input: 'hi' });
    expect(r.usage).toMatchObject(agentUsage);
    expect(await series(s, 'stormgate_tokens_total{route="responses",target="p/gpt-4.1",kind="prompt"}')).toBe(2006);
    expect(await series(s, 'stormgate_tokens_total{route="responses",target="p/gpt-4.1",kind="completion"}')).toBe(512);
  });

  it('a response.incomplete for content_filter before any output is the answer: passed on as the stream\'s end, nothing retried or sent to q', async () => {
    const incomplete = { ...baseResponse('incomplete', [], { ...usage, output_tokens: 0, total_tokens: 12 }), incomplete_details: { reason: 'content_filter' } };
    const p = await provider(() => ({ steps: [...responsesHead().slice(0, 2), rev('response.incomplete', { response: incomplete }, 2)] }));
    const q = await provider(() => ({ steps: full() }));
    const { s, client } = await gateway(p, q);
    // Read raw: the SDK's stream helper takes only response.completed as its final snapshot (openai 6.30).
    const { events, error } = await drain(await client.responses.create({ model: MODEL, input: 'something filtered', stream: true }));
    expect(error).toBeUndefined();
    expect(events.map((e) => e.type)).toEqual(['response.created', 'response.in_progress', 'response.incomplete']);
    expect(events.at(-1)).toMatchObject({ response: { status: 'incomplete', incomplete_details: { reason: 'content_filter' }, output: [] } });
    expect(p.creates()).toHaveLength(1);
    expect(q.seen).toHaveLength(0);
    expect((await requestLine(s, 'responses')).streamEnd).toBe('complete');
    expect(await series(s, 'stormgate_tokens_total{route="responses",target="p/gpt-4.1",kind="prompt"}')).toBe(12);
  });

  it('a 500 then a 429 before the stream starts are retried at p: one SDK stream numbered from 0, three attempts logged, ended complete', async () => {
    const p = await provider((_b, n) => (n === 1 ? serverError() : n === 2 ? rateLimited() : { steps: full() }));
    const { s, client } = await gateway(p);
    const { events, final, error } = await readResponseStream(client.responses.stream({ model: MODEL, input: 'hi' }));
    expect(error).toBeUndefined();
    expect(textOf(final!)).toBe('Hello');
    expect(events.map((e) => e.sequence_number)).toEqual(events.map((_e, i) => i));
    expect(p.creates().map((x) => x.headers['x-retry-reason'] ?? null)).toEqual([null, 'status_500', 'status_429']);
    const line = await requestLine(s, 'responses');
    expect(line.attempts).toHaveLength(3);
    expect(line.streamEnd).toBe('complete');
    expect(await series(s, 'stormgate_stream_ends_total{route="responses",end="complete"}')).toBe(1);
  });

  it('a lasting 429 before the stream starts is the RateLimitError with the provider\'s words once retries are over, told not to retry', async () => {
    const p = await provider(() => rateLimited());
    const { client } = await gateway(p);
    const err = await sdkError(client.responses.stream({ model: MODEL, input: 'hi' }).finalResponse());
    expect(err).toBeInstanceOf(OpenAI.RateLimitError);
    expect(err.code).toBe('rate_limit_exceeded');
    expect(err.message).toContain('Rate limit reached for gpt-4.1');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(p.creates()).toHaveLength(3);
  });
});
