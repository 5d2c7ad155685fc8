// A fourteenth third-party failure-scenario suite, written from the README alone (its top, "Retries", "Idempotency
// keys", "Failover and API families", "Hold-offs", "Deadlines and timeouts", "Streaming", "What the client sees",
// "Paths", "Logs and metrics") as a team whose agents run on OpenAI's Responses API would test a gateway before
// putting it in front of them: `responses.create` and `responses.stream`, background responses resumed with
// `responses.retrieve(id, { stream: true, starting_after })`, `previous_response_id` chains, function tools and their
// `function_call_output` turns, `store: false` with encrypted reasoning passed back, idempotency keys on tool calls.
// Black box over real HTTP: a provider of the test's own plays the Responses API's exact event sequences and failures
// (the helpers of test/helpers/scripted-provider.ts), the bundled mock where its answers are enough, and the agents'
// client is the official `openai` SDK at its DEFAULT maxRetries (2) wherever a scenario is about retries multiplying,
// so what is counted is what the provider received. Bounds are generous: the suite runs on a loaded 2-core machine.
// Found here: a 404 for a `previous_response_id` the provider does not have (or an `input` item not kept under
// `store: false`) was read as "no such model": a model learned from traffic gave its target key back and was never
// learned again, so its traffic, metrics and breaker moved to `<provider>/other` for good.
import type { IncomingMessage, RequestListener, ServerResponse } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { sdkError } from './helpers/openai-error.ts';
import { baseResponse, msgItem, play as playScript, responsesHead, responsesTail, rev, scripted, textDelta, type Script, type Seen } from './helpers/scripted-provider.ts';
import { metricSum, requestLine, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();
const startMock = useExtraMocks();

type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];
type Answer = (body: Record<string, unknown>, n: number) => Script;

const MODEL = 'gpt-4.1';
const usage = { input_tokens: 12, input_tokens_details: { cached_tokens: 0 }, output_tokens: 2, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 14 };

// ---------------------------------------------------------------------------------------------------------------
// What providers send: whole Responses, the event sequences of a stream, and their failures as OpenAI words them.

const json = (body: unknown, status = 200, headers: Record<string, string> = {}): Script => ({ status, headers: { 'content-type': 'application/json', ...headers }, steps: [JSON.stringify(body)] });
const completed = (text = 'Hello', id = 'resp_abc123'): Script => json({ ...baseResponse('completed', [msgItem(text)], usage), id });
/** A whole stream: head (0-3), two deltas (4, 5), tail (6-9). */
const full = (): string[] => [...responsesHead(), textDelta('Hel', 4), textDelta('lo', 5), ...responsesTail('Hello', 6)];
const created = (seq = 0, extra: Record<string, unknown> = {}) => rev('response.created', { response: { ...baseResponse('in_progress'), ...extra } }, seq);
const inProgress = (seq = 1) => rev('response.in_progress', { response: baseResponse('in_progress') }, seq);
/** The Responses API's own `error` event: code and message at the top, no `error` object. */
const errorEvent = (code: string, message: string, seq: number) => `event: error\ndata: ${JSON.stringify({ type: 'error', code, message, param: null, sequence_number: seq })}\n\n`;
const failedEvent = (code: string, message: string, seq: number) => rev('response.failed', { response: { ...baseResponse('failed'), error: { code, message } } }, seq);
const overloaded = json({ error: { message: 'The server is overloaded', type: 'server_error', param: null, code: null } }, 503);
const QUOTA = 'You exceeded your current quota, please check your plan and billing details.';
const RATE = 'Rate limit reached for gpt-4.1 in organization org-x on requests per min (RPM): Limit 500, Used 500, Requested 1.';

const textOf = (r: { output: unknown[] }) =>
  (r.output as Array<{ type: string; content?: Array<{ text?: string }> }>).flatMap((o) => (o.type === 'message' ? (o.content ?? []) : [])).map((c) => c.text ?? '').join('');

// ---------------------------------------------------------------------------------------------------------------
// Setting up: providers p (the account holding the conversations) and q (a second account, or another provider of the
// same family), a gateway whose /v1/responses route goes p then q, and SDK clients that count their HTTP requests.

interface Provider {
  seen: Seen[];
  /** Upstream requests with when each arrived and when its connection closed. */
  times: Array<{ at: number; closedAt?: number }>;
}

/**
 * A provider of the Responses API: POST /v1/responses plays `create`'s script; anything else (a retrieve, a resume,
 * a cancel: passthrough) is answered by `other`, given the method and URL.
 */
async function provider(create: Answer, other?: (method: string, url: string) => Script | undefined): Promise<Provider & { origin: string }> {
  const seen: Seen[] = [];
  const times: Provider['times'] = [];
  const play = scripted(create, seen);
  const handler: RequestListener = (req: IncomingMessage, res: ServerResponse) => {
    const t: { at: number; closedAt?: number } = { at: Date.now() };
    times.push(t);
    res.on('close', () => (t.closedAt = Date.now()));
    if (req.method === 'POST' && req.url === '/v1/responses') return play(req, res);
    req.resume();
    seen.push({ body: {}, headers: req.headers, url: `${req.method} ${req.url}`, at: Date.now() });
    const s = other?.(req.method ?? '', req.url ?? '') ?? json({ error: { message: 'no such path', type: 'invalid_request_error', param: null, code: null } }, 404);
    void playScript(res, s);
  };
  const p = await startProvider(handler);
  return { origin: p.origin, seen, times };
}

interface GwOptions {
  q?: { origin: string };
  route?: Partial<RouteInput>;
  p?: Partial<ProviderInput>;
  /** Serve the stored responses' calls (retrieve, resume, cancel) from p, as the README says to. */
  passthrough?: boolean;
  routes?: RouteInput[];
  providers?: ConfigInput['providers'];
}

const timeouts = { connectMs: 2_000, firstTokenMs: 5_000, idleMs: 5_000 };

async function gateway(p: { origin: string }, o: GwOptions = {}): Promise<Stack> {
  return startStack({
    config: () => ({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: {
        p: { family: 'openai', baseUrl: `${p.origin}/v1`, apiKey: 'p-key', breaker: false, timeouts, ...o.p },
        ...(o.q && { q: { family: 'openai', baseUrl: `${o.q.origin}/v1`, apiKey: 'q-key', breaker: false, timeouts } }),
        ...o.providers,
      },
      routes: [
        {
          name: 'responses',
          match: { path: '/v1/responses' },
          targets: [{ provider: 'p' }, ...(o.q ? [{ provider: 'q' }] : [])],
          retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 10 } },
          budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 },
          timeoutMs: 20_000,
          ...o.route,
        },
        ...(o.routes ?? []),
      ],
      ...(o.passthrough && { passthrough: { provider: 'p', paths: ['/v1/responses/'], methods: ['GET', 'POST', 'DELETE'] } }),
    }),
  });
}

/** The official SDK at its defaults (maxRetries 2), counting each HTTP request it makes. */
function agent(s: Stack, opts: ConstructorParameters<typeof OpenAI>[0] = {}): { client: OpenAI; requests: () => number } {
  let n = 0;
  const client = new OpenAI({
    baseURL: s.baseURL,
    apiKey: 'sk-agent',
    fetch: (input, init) => {
      n++;
      return fetch(input, init);
    },
    ...opts,
  });
  return { client, requests: () => n };
}

/** Every event a raw `create({ stream: true })` yields, and the error it raised, if any. */
async function drain(stream: AsyncIterable<OpenAI.Responses.ResponseStreamEvent>): Promise<{ events: OpenAI.Responses.ResponseStreamEvent[]; error?: unknown }> {
  const events: OpenAI.Responses.ResponseStreamEvent[] = [];
  try {
    for await (const e of stream) events.push(e);
    return { events };
  } catch (error) {
    return { events, error };
  }
}

/** The value of one series of a metric (labels in the order the registry prints them). */
async function series(s: Stack, line: string): Promise<number> {
  return metricSum(s, `${line} `);
}

// ---------------------------------------------------------------------------------------------------------------

describe('a Responses stream cut, before and after its first output', () => {
  it('retries a stream cut after response.created and in_progress (no output yet): the SDK gets one whole stream, one request', async () => {
    const p = await provider((_b, n) => ({ steps: n === 1 ? [created(), inProgress(), 30, { destroy: true }] : full() }));
    const s = await gateway(p);
    const { client, requests } = agent(s);
    const { events } = await drain(await client.responses.create({ model: MODEL, input: 'hi', stream: true }));
    expect(events.filter((e) => e.type === 'response.created')).toHaveLength(1);
    expect(events.map((e) => e.sequence_number)).toEqual(events.map((_e, i) => i));
    expect(events.at(-1)!.type).toBe('response.completed');
    expect(p.seen).toHaveLength(2);
    expect(p.seen[1]!.headers['x-retry-reason']).toBeDefined();
    expect(requests()).toBe(1);
  });

  it('ends a stream cut after its first delta with an error event the SDK raises, numbered on; never completed, never sent again', async () => {
    const p = await provider(() => ({ steps: [...responsesHead(), textDelta('Hel', 4), 20, { destroy: true }] }));
    const s = await gateway(p);
    const { client, requests } = agent(s);
    const { events, error } = await drain(await client.responses.create({ model: MODEL, input: 'hi', stream: true }));
    expect(error).toBeInstanceOf(OpenAI.APIError);
    expect(String((error as Error).message)).toMatch(/interrupted|cut|stream/i);
    expect(events.map((e) => e.type)).not.toContain('response.completed');
    expect(events.at(-1)).toMatchObject({ type: 'response.output_text.delta', delta: 'Hel' });
    expect((await requestLine(s, 'responses')).streamEnd).toBe('cut');
    // The finalResponse() of responses.stream() rejects too: a partial response is never handed over as the answer.
    await expect(client.responses.stream({ model: MODEL, input: 'hi' }).finalResponse()).rejects.toThrow();
    expect(p.seen).toHaveLength(2);
    expect(requests()).toBe(2);
  });

  it('the raw wire: the error event after a cut carries a sequence_number one past the last event passed', async () => {
    const p = await provider(() => ({ steps: [...responsesHead(), textDelta('Hel', 4), textDelta('lo', 5), 20, { destroy: true }] }));
    const s = await gateway(p);
    const res = await fetch(`${s.baseURL}/responses`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, input: 'hi', stream: true }) });
    const text = await res.text();
    const last = text.trim().split('\n\n').at(-1)!;
    expect(last).toMatch(/^event: error\n/);
    const data = JSON.parse(last.split('\n').find((l) => l.startsWith('data:'))!.slice(5)) as { sequence_number: number; error?: { code?: string } };
    expect(data.sequence_number).toBe(6);
    expect(data.error?.code).toBe('stream_interrupted');
  });

  it('ends a stream that stalls after its first delta at idleMs with an error the SDK raises', async () => {
    const p = await provider(() => ({ steps: [...responsesHead(), textDelta('Hel', 4)], hold: true }));
    const s = await gateway(p, { p: { timeouts: { ...timeouts, idleMs: 600 } } });
    const started = Date.now();
    await expect(agent(s).client.responses.stream({ model: MODEL, input: 'hi' }).finalResponse()).rejects.toThrow(/stall|idle|interrupt/i);
    expect(Date.now() - started).toBeLessThan(4_000);
    expect(p.seen).toHaveLength(1);
  });
});

describe('error events inside a 200 stream, before the first output', () => {
  it('retries a response.failed server_error after response.created, and the SDK gets the retry\'s stream', async () => {
    const p = await provider((_b, n) => ({ steps: n === 1 ? [created(), inProgress(), failedEvent('server_error', 'The model produced invalid content.', 2)] : full() }));
    const s = await gateway(p);
    const { client, requests } = agent(s);
    const final = await client.responses.stream({ model: MODEL, input: 'hi' }).finalResponse();
    expect(textOf(final)).toBe('Hello');
    expect(p.seen).toHaveLength(2);
    expect(requests()).toBe(1);
  });

  it('does not multiply retries: a lasting server_error event is 3 upstream attempts and 1 SDK request, x-should-retry false', async () => {
    const p = await provider(() => ({ steps: [created(), errorEvent('server_error', 'An error occurred while processing your request.', 1)] }));
    const s = await gateway(p);
    const { client, requests } = agent(s);
    const err = await sdkError(client.responses.create({ model: MODEL, input: 'hi', stream: true }));
    expect(err.status).toBe(502);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(p.seen).toHaveLength(3);
    expect(requests()).toBe(1);
  });

  it("answers a lasting rate_limit_exceeded error event as the 429 it stands for, with the provider's words: 3 upstream, 1 SDK request", async () => {
    const p = await provider(() => ({ steps: [created(), errorEvent('rate_limit_exceeded', RATE, 1)] }));
    const s = await gateway(p, { p: { breaker: { minRequests: 2, failureRate: 0.5 } } });
    const { client, requests } = agent(s);
    for (let i = 0; i < 2; i++) {
      const err = await sdkError(client.responses.stream({ model: MODEL, input: 'hi' }).finalResponse());
      expect(err).toBeInstanceOf(OpenAI.RateLimitError);
      expect(err.code).toBe('rate_limit_exceeded');
      expect(err.message).toContain('Rate limit reached for gpt-4.1');
      expect(err.headers?.get('x-should-retry')).toBe('false');
    }
    expect(p.seen).toHaveLength(6);
    expect(p.seen.filter((x) => x.headers['x-retry-reason'] !== undefined).every((x) => x.headers['x-retry-reason'] === 'status_429')).toBe(true);
    expect(requests()).toBe(2);
    // A rate limit opens no breaker: six failures at a failure rate of 1 over minRequests 2 would have.
    expect(await series(s, 'stormgate_breaker_state{target="p/gpt-4.1"}')).toBe(0);
  });

  it('moves a rate_limit_exceeded error event on to the second account once retries are over (retries_exhausted)', async () => {
    const p = await provider(() => ({ steps: [created(), errorEvent('rate_limit_exceeded', RATE, 1)] }));
    const q = await provider(() => ({ steps: full() }));
    const s = await gateway(p, { q });
    const { data, response } = await agent(s).client.responses.create({ model: MODEL, input: 'hi', stream: true }).withResponse();
    const { events } = await drain(data);
    expect(events.at(-1)!.type).toBe('response.completed');
    expect(response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(p.seen).toHaveLength(3);
    expect(q.seen).toHaveLength(1);
  });

  it("takes insufficient_quota after response.created as the gateway's billing: the second account answers, and the next call skips p", async () => {
    const p = await provider(() => ({ steps: [created(), failedEvent('insufficient_quota', QUOTA, 1)] }));
    const q = await provider(() => ({ steps: full() }));
    const s = await gateway(p, { q });
    const { client } = agent(s);
    for (let i = 0; i < 2; i++) {
      const { data, response } = await client.responses.create({ model: MODEL, input: 'hi', stream: true }).withResponse();
      expect((await drain(data)).events.at(-1)!.type).toBe('response.completed');
      expect(response.headers.get('x-stormgate-fallback')).toBe('credentials');
    }
    expect(p.seen).toHaveLength(1);
    expect(q.seen).toHaveLength(2);
    expect(await series(s, 'stormgate_credentials_held{target="p/gpt-4.1"}')).toBe(1);
  });

  it("answers a lone target's insufficient_quota event with 502 upstream_auth_error: no provider words, no retry-after, no SDK retry", async () => {
    const p = await provider(() => ({ steps: [created(), errorEvent('insufficient_quota', `${QUOTA} (key sk-proj-****p-key)`, 1)] }));
    const s = await gateway(p);
    const { client, requests } = agent(s);
    const err = await sdkError(client.responses.create({ model: MODEL, input: 'hi', stream: true }));
    expect(err.status).toBe(502);
    expect(err.code).toBe('upstream_auth_error');
    expect(err.message).not.toContain('exceeded your current quota');
    expect(err.message).not.toContain('p-key');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.headers?.get('retry-after')).toBeNull();
    expect(p.seen).toHaveLength(1);
    expect(requests()).toBe(1);
  });
});

describe('error events after the first output', () => {
  it('passes a response.failed after text on with an error event added, so the SDK raises rather than resolving a partial response', async () => {
    const p = await provider(() => ({ steps: [...responsesHead(), textDelta('Hel', 4), failedEvent('server_error', 'The model stopped.', 5)] }));
    const s = await gateway(p);
    const { client, requests } = agent(s);
    const { events, error } = await drain(await client.responses.create({ model: MODEL, input: 'hi', stream: true }));
    expect(error).toBeInstanceOf(OpenAI.APIError);
    expect(events.map((e) => e.type)).toContain('response.failed');
    await expect(client.responses.stream({ model: MODEL, input: 'hi' }).finalResponse()).rejects.toThrow();
    expect(p.seen).toHaveLength(2);
    expect(requests()).toBe(2);
  });

  it('ends the stream on a rate_limit_exceeded error event after text with the error the SDK raises: no retry, no clean end', async () => {
    const p = await provider(() => ({ steps: [...responsesHead(), textDelta('Hel', 4), errorEvent('rate_limit_exceeded', RATE, 5)] }));
    const s = await gateway(p);
    const { events, error } = await drain(await agent(s).client.responses.create({ model: MODEL, input: 'hi', stream: true }));
    expect(error).toBeInstanceOf(OpenAI.APIError);
    expect(String((error as Error).message)).toContain('Rate limit reached');
    expect(events.map((e) => e.type)).not.toContain('response.completed');
    expect(p.seen).toHaveLength(1);
  });

  it("holds the target after an insufficient_quota mid-answer: that stream ends with the error, the next call goes to q for `credentials`", async () => {
    const p = await provider(() => ({ steps: [...responsesHead(), textDelta('Hel', 4), errorEvent('insufficient_quota', QUOTA, 5)] }));
    const q = await provider(() => ({ steps: full() }));
    const s = await gateway(p, { q });
    const { client } = agent(s);
    const first = await drain(await client.responses.create({ model: MODEL, input: 'hi', stream: true }));
    expect(first.error).toBeInstanceOf(OpenAI.APIError);
    const { data, response } = await client.responses.create({ model: MODEL, input: 'hi', stream: true }).withResponse();
    expect((await drain(data)).events.at(-1)!.type).toBe('response.completed');
    expect(response.headers.get('x-stormgate-fallback')).toBe('credentials');
    expect(p.seen).toHaveLength(1);
    expect(q.seen).toHaveLength(1);
  });
});

describe('response.incomplete', () => {
  it('passes a stream ending in response.incomplete (max_output_tokens) on as it is: no retry, no error event, its usage counted', async () => {
    const inc = { ...baseResponse('incomplete', [msgItem('Hel', 'incomplete')], { ...usage, output_tokens: 16, total_tokens: 28 }), incomplete_details: { reason: 'max_output_tokens' } };
    const p = await provider(() => ({ steps: [...responsesHead(), textDelta('Hel', 4), rev('response.incomplete', { response: inc }, 5)] }));
    const s = await gateway(p);
    const { client, requests } = agent(s);
    const { events, error } = await drain(await client.responses.create({ model: MODEL, input: 'hi', stream: true, max_output_tokens: 16 }));
    expect(error).toBeUndefined();
    expect(events.at(-1)).toMatchObject({ type: 'response.incomplete', response: { status: 'incomplete', incomplete_details: { reason: 'max_output_tokens' } } });
    expect(p.seen).toHaveLength(1);
    expect(requests()).toBe(1);
    expect(await series(s, 'stormgate_tokens_total{route="responses",target="p/gpt-4.1",kind="completion"}')).toBe(16);
  });

  it('returns a whole Response whose status is incomplete as the answer, not a failure to retry', async () => {
    const p = await provider(() => json({ ...baseResponse('incomplete', [msgItem('Hel', 'incomplete')], usage), incomplete_details: { reason: 'max_output_tokens' } }));
    const s = await gateway(p);
    const r = await agent(s).client.responses.create({ model: MODEL, input: 'hi', max_output_tokens: 16 });
    expect(r.status).toBe('incomplete');
    expect(r.incomplete_details?.reason).toBe('max_output_tokens');
    expect(p.seen).toHaveLength(1);
  });
});

describe('a 429 with retry-after under 30 concurrent agents', () => {
  it('holds the target off for everyone until the hint ends, then brings them back spread out, not as a herd', async () => {
    let t0 = 0;
    const p = await provider(() => {
      t0 ||= Date.now();
      return Date.now() - t0 < 900
        ? json({ error: { message: RATE, type: 'requests', param: null, code: 'rate_limit_exceeded' } }, 429, { 'retry-after': '1' })
        : completed();
    });
    const s = await gateway(p, { route: { retry: { maxAttempts: 3, backoff: { strategy: 'full-jitter', baseMs: 100, capMs: 1000 } } } });
    const { client, requests } = agent(s);
    const results = await Promise.all(
      Array.from({ length: 30 }, async (_x, i) => {
        await sleep(i * 10);
        return client.responses.create({ model: MODEL, input: `agent ${i}` }).then(
          (r) => r.output_text,
          (e: unknown) => e,
        );
      }),
    );
    expect(results.every((r) => r === 'Hello')).toBe(true);
    expect(requests()).toBe(30);
    const at = p.times.map((t) => t.at - t0);
    const rejected = at.filter((x) => x < 900).length;
    // Once the first 429 came back, nothing went to the provider until its retry-after was over...
    expect(at.filter((x) => x >= 150 && x < 950)).toEqual([]);
    // ...each agent then went once more (those that got the 429) or once (those that waited for it)...
    expect(at.length).toBe(30 + rejected);
    // ...and the ones that came back did not all come back in the same moment.
    const after = at.filter((x) => x >= 950).sort((a, b) => a - b);
    expect(after.length).toBe(30);
    const busiest = Math.max(...after.map((x) => after.filter((y) => y >= x && y < x + 20).length));
    expect(busiest).toBeLessThan(after.length);
    expect(after.at(-1)! - after[0]!).toBeGreaterThanOrEqual(60);
  });
});

describe('previous_response_id: a conversation lives where it was stored', () => {
  const follow = { model: MODEL, input: 'and then?', previous_response_id: 'resp_turn1' };

  it('never sends a follow-up to the second account, however p fails: p\'s 503 reaches the client after its own retries', async () => {
    const p = await provider(() => overloaded);
    const q = await provider(() => completed('from q'));
    const s = await gateway(p, { q });
    const { client, requests } = agent(s);
    const err = await sdkError(client.responses.create(follow));
    expect(err.status).toBe(503);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(p.seen).toHaveLength(3);
    expect(q.seen).toHaveLength(0);
    expect(requests()).toBe(1);
    // A new conversation does fail over.
    expect((await client.responses.create({ model: MODEL, input: 'new' })).output_text).toBe('from q');
  });

  it('waits a hold-off on p out for a follow-up (parked), where a new conversation moves to q at once', async () => {
    let limited = true;
    const p = await provider(() => (limited ? ((limited = false), json({ error: { message: RATE, type: 'requests', param: null, code: 'rate_limit_exceeded' } }, 429, { 'retry-after': '1' })) : completed('from p')));
    const q = await provider(() => completed('from q'));
    const s = await gateway(p, { q });
    const { client } = agent(s);
    const started = Date.now();
    expect((await client.responses.create({ model: MODEL, input: 'new' })).output_text).toBe('from q');
    const r = await client.responses.create(follow);
    expect(r.output_text).toBe('from p');
    expect(Date.now() - started).toBeGreaterThanOrEqual(900);
    expect(q.seen).toHaveLength(1);
    expect(p.seen.map((x) => x.body.previous_response_id ?? null)).toEqual([null, 'resp_turn1']);
  });

  it("answers a follow-up while p's credentials are held with 502 upstream_auth_error at once; nothing goes to p or q", async () => {
    const p = await provider(() => json({ error: { message: QUOTA, type: 'insufficient_quota', param: null, code: 'insufficient_quota' } }, 429));
    const q = await provider(() => completed('from q'));
    const s = await gateway(p, { q });
    const { client, requests } = agent(s);
    expect((await client.responses.create({ model: MODEL, input: 'new' })).output_text).toBe('from q');
    const err = await sdkError(client.responses.create(follow));
    expect(err.status).toBe(502);
    expect(err.code).toBe('upstream_auth_error');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(p.seen).toHaveLength(1);
    expect(q.seen).toHaveLength(1);
    expect(requests()).toBe(2);
  });

  it("sends a follow-up of a turn the second account answered to p, whose 404 the client gets as it is (the README's warning)", async () => {
    let pDown = true;
    const notFound = json({ error: { message: "Previous response with id 'resp_q1' not found.", type: 'invalid_request_error', param: 'previous_response_id', code: 'previous_response_not_found' } }, 404);
    const p = await provider(() => (pDown ? overloaded : notFound));
    const q = await provider(() => completed('from q', 'resp_q1'));
    const s = await gateway(p, { q });
    const { client, requests } = agent(s);
    const first = await client.responses.create({ model: MODEL, input: 'new' });
    expect(first.id).toBe('resp_q1');
    pDown = false;
    const err = await sdkError(client.responses.create({ model: MODEL, input: 'and then?', previous_response_id: first.id }));
    expect(err).toBeInstanceOf(OpenAI.NotFoundError);
    expect(err.param).toBe('previous_response_id');
    expect(q.seen).toHaveLength(1);
    expect(requests()).toBe(2);
  });

  it("keeps the model's own breaker and metric series after a 404 for an unknown previous_response_id (a 404 that names no model)", async () => {
    // A route serving any model learns `gpt-4.1` as its own target key. A 404 about the previous response (expired,
    // or stored elsewhere) says nothing about the model: read as "no such model", it gave the key back and refused
    // to learn it again, so every later gpt-4.1 request was counted under p/other, sharing one breaker with every
    // other unlisted model.
    const notFound = json({ error: { message: "Previous response with id 'resp_gone' not found.", type: 'invalid_request_error', param: 'previous_response_id', code: 'previous_response_not_found' } }, 404);
    const itemGone = json({ error: { message: "Item with id 'rs_1' not found. Items are not persisted when `store` is set to false.", type: 'invalid_request_error', param: 'input', code: null } }, 404);
    const p = await provider((b) => (b.previous_response_id ? notFound : Array.isArray(b.input) ? itemGone : completed()));
    const s = await gateway(p);
    const { client, requests } = agent(s);
    await client.responses.create({ model: MODEL, input: 'hi' });
    const err = await sdkError(client.responses.create({ model: MODEL, input: 'more', previous_response_id: 'resp_gone' }));
    expect(err.status).toBe(404);
    expect(err.message).toContain('resp_gone');
    const err2 = await sdkError(client.responses.create({ model: MODEL, store: false, input: [{ type: 'item_reference', id: 'rs_1' }] }));
    expect(err2.status).toBe(404);
    await client.responses.create({ model: MODEL, input: 'hi again' });
    expect(p.seen).toHaveLength(4);
    expect(requests()).toBe(4);
    expect(await series(s, 'stormgate_upstream_attempts_total{target="p/gpt-4.1",status_class="2xx"}')).toBe(2);
    expect(await metricSum(s, 'stormgate_upstream_attempts_total{target="p/other"')).toBe(0);
    // The operator sees which reference was missing.
    const params = s.logs.flatMap((l) => ((JSON.parse(l) as { attempts?: Array<{ param?: string }> }).attempts ?? []).flatMap((a) => (a.param ? [a.param] : [])));
    expect(params).toEqual(['previous_response_id', 'input']);
  });

  it("passes a 404 about an input item on a target that names its own model to the client, as the client's, rather than failing over", async () => {
    // A target with a model of its own answering 404 is the operator's model missing (a retired model, a deleted
    // deployment): the next target is tried. A 404 that names `input` (an item not kept under store: false) is the
    // client's reference: the backup has no such item either, and sending the turn there only hid the reason.
    const itemGone = json({ error: { message: "Item with id 'rs_1' not found. Items are not persisted when `store` is set to false.", type: 'invalid_request_error', param: 'input', code: null } }, 404);
    const p = await provider(() => itemGone);
    const q = await provider(() => completed('from q'));
    const s = await gateway(p, { route: { targets: [{ provider: 'p', model: 'gpt-4.1' }, { provider: 'q', model: 'gpt-4.1' }] }, q });
    const { client } = agent(s);
    const err = await sdkError(client.responses.create({ model: MODEL, store: false, input: [{ type: 'item_reference', id: 'rs_1' }] }));
    expect(err).toBeInstanceOf(OpenAI.NotFoundError);
    expect(err.param).toBe('input');
    expect(q.seen).toHaveLength(0);
  });
});

describe('background responses through the gateway', () => {
  const bg = { background: true, status: 'queued', id: 'resp_bg' };
  const bgResp = (status: string) => ({ ...baseResponse(status), ...bg, status });
  /** The background job's whole event sequence: created (queued), in_progress, text, completed. */
  const job = (): string[] => [
    rev('response.created', { response: bgResp('queued') }, 0),
    rev('response.in_progress', { response: bgResp('in_progress') }, 1),
    ...responsesHead().slice(2),
    textDelta('Hel', 4),
    textDelta('lo', 5),
    ...responsesTail('Hello', 6),
  ];
  /** A resume: the job's events after `starting_after`. */
  const resume = (method: string, url: string): Script | undefined => {
    const m = /^\/v1\/responses\/resp_bg(?:\?(.*))?$/.exec(url);
    if (method !== 'GET' || !m) return undefined;
    const q = new URLSearchParams(m[1] ?? '');
    if (q.get('stream') !== 'true') return json({ ...baseResponse('completed', [msgItem('Hello')], usage), ...bg, status: 'completed' });
    return { steps: job().slice(Number(q.get('starting_after')) + 1) };
  };

  it('resumes a background stream cut after its first delta with retrieve(stream, starting_after): the whole text, one job at the provider', async () => {
    const p = await provider(() => ({ steps: [...job().slice(0, 5), 20, { destroy: true }] }), resume);
    const s = await gateway(p, { passthrough: true });
    const { client } = agent(s);
    const first = await drain(await client.responses.create({ model: MODEL, input: 'long job', background: true, stream: true }));
    expect(first.error).toBeInstanceOf(OpenAI.APIError);
    expect(first.events[0]).toMatchObject({ type: 'response.created', response: { id: 'resp_bg' } });
    const last = first.events.at(-1)!.sequence_number;
    expect(last).toBe(4);
    const rest = await drain(await client.responses.retrieve('resp_bg', { stream: true, starting_after: last }));
    expect(rest.error).toBeUndefined();
    const text = [...first.events, ...rest.events].flatMap((e) => (e.type === 'response.output_text.delta' ? [e.delta] : [])).join('');
    expect(text).toBe('Hello');
    expect(rest.events.map((e) => e.sequence_number)).toEqual([5, 6, 7, 8, 9]);
    expect(p.seen.filter((x) => x.url === '/v1/responses')).toHaveLength(1);
    expect(p.seen.map((x) => x.url)).toContain('GET /v1/responses/resp_bg?stream=true&starting_after=4');
  });

  it('keeps a resumed stream through a silence longer than idleMs but within firstTokenMs (the model thinking)', async () => {
    // Added by the gateway's team: a resumed stream cut at idleMs ended in a bare `terminated` mid-thought.
    const thinking = (method: string, url: string): Script | undefined => {
      const m = /^\/v1\/responses\/resp_bg\?stream=true&starting_after=(\d+)$/.exec(url);
      if (method !== 'GET' || !m) return undefined;
      const rest = job().slice(Number(m[1]) + 1);
      return { steps: [rest[0]!, 1_500, ...rest.slice(1)] };
    };
    const p = await provider(() => ({ steps: [...job().slice(0, 5), 20, { destroy: true }] }), thinking);
    const s = await gateway(p, { passthrough: true, p: { timeouts: { ...timeouts, idleMs: 500, firstTokenMs: 5_000 } } });
    const { client } = agent(s);
    const first = await drain(await client.responses.create({ model: MODEL, input: 'long job', background: true, stream: true }));
    const rest = await drain(await client.responses.retrieve('resp_bg', { stream: true, starting_after: first.events.at(-1)!.sequence_number }));
    expect(rest.error).toBeUndefined();
    expect(rest.events.map((e) => e.sequence_number)).toEqual([5, 6, 7, 8, 9]);
  });

  it('gives a background stream its response.created before any output, and after the client leaves does not create it again', async () => {
    // The job is queued for a while before its first output; the agent leaves as soon as it has the id.
    const p = await provider(() => ({ steps: [...job().slice(0, 4), 1_500, ...job().slice(4)] }), (method, url) => (method === 'POST' && url === '/v1/responses/resp_bg/cancel' ? json(bgResp('cancelled')) : resume(method, url)));
    const s = await gateway(p, { passthrough: true });
    const { client, requests } = agent(s);
    const ac = new AbortController();
    const started = Date.now();
    const stream = await client.responses.create({ model: MODEL, input: 'long job', background: true, stream: true }, { signal: ac.signal });
    let id = '';
    try {
      for await (const e of stream) {
        if (e.type === 'response.created') {
          id = e.response.id;
          ac.abort();
        }
      }
    } catch {
      // the agent's own abort
    }
    expect(id).toBe('resp_bg');
    expect(Date.now() - started).toBeLessThan(1_400);
    await sleep(300);
    expect(p.times[0]!.closedAt).toBeDefined();
    expect((await client.responses.retrieve(id)).status).toBe('completed');
    expect((await client.responses.cancel(id)).status).toBe('cancelled');
    expect(p.seen.filter((x) => x.url === '/v1/responses')).toHaveLength(1);
    expect(requests()).toBe(3);
  });

  it('keeps a background create on p while p is down: 503 to the client, nothing queued at q where no retrieve would find it', async () => {
    const p = await provider(() => overloaded);
    const q = await provider(() => ({ steps: job() }));
    const s = await gateway(p, { q });
    const err = await sdkError(agent(s).client.responses.create({ model: MODEL, input: 'job', background: true, stream: true }));
    expect(err.status).toBe(503);
    expect(q.seen).toHaveLength(0);
  });
});

describe('store: false and encrypted reasoning passed back', () => {
  it('fails a stateless turn over to the second account with its input byte for byte, and streams back its encrypted reasoning', async () => {
    const reasoning = { id: 'rs_1', type: 'reasoning', summary: [], encrypted_content: 'gAAAAABo-opaque-blob==' };
    const p = await provider(() => overloaded);
    const answerReasoning = { id: 'rs_2', type: 'reasoning', summary: [], encrypted_content: 'gAAAAABo-next-blob==' };
    const q = await provider(() => ({
      steps: [
        created(),
        inProgress(),
        rev('response.output_item.added', { output_index: 0, item: { ...answerReasoning, encrypted_content: null } }, 2),
        rev('response.output_item.done', { output_index: 0, item: answerReasoning }, 3),
        rev('response.output_item.added', { output_index: 1, item: msgItem('', 'in_progress') }, 4),
        rev('response.content_part.added', { item_id: 'msg_1', output_index: 1, content_index: 0, part: { type: 'output_text', text: '', annotations: [] } }, 5),
        rev('response.output_text.delta', { item_id: 'msg_1', output_index: 1, content_index: 0, delta: 'The order ships Monday.', logprobs: [] }, 6),
        rev('response.completed', { response: { ...baseResponse('completed', [answerReasoning, msgItem('The order ships Monday.')], usage), store: false } }, 7),
      ],
    }));
    const s = await gateway(p, { q });
    const input: OpenAI.Responses.ResponseInput = [
      { role: 'user', content: 'Where is order 7?' },
      reasoning as OpenAI.Responses.ResponseReasoningItem,
      { type: 'function_call', call_id: 'call_1', name: 'lookup_order', arguments: '{"id":7}' },
      { type: 'function_call_output', call_id: 'call_1', output: '{"status":"packed"}' },
    ];
    const body = {
      model: 'o4-mini',
      store: false,
      include: ['reasoning.encrypted_content' as const],
      tools: [{ type: 'function' as const, name: 'lookup_order', parameters: { type: 'object', properties: { id: { type: 'number' } } }, strict: false }],
      input,
    };
    const { data, response } = await agent(s).client.responses.create({ ...body, stream: true }).withResponse();
    const { events, error } = await drain(data);
    expect(error).toBeUndefined();
    expect(response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    const done = events.find((e) => e.type === 'response.output_item.done');
    expect(done).toMatchObject({ item: answerReasoning });
    expect(events.at(-1)).toMatchObject({ type: 'response.completed' });
    expect(q.seen).toHaveLength(1);
    expect(q.seen[0]!.body).toEqual({ ...body, stream: true });
    expect(q.seen[0]!.body).toEqual(p.seen[0]!.body);
  });
});

describe('idempotency keys on an agent loop with a function tool (the coupon incident)', () => {
  it('issues one coupon when the tool call times out at the agent and its SDK retries under the same key, and the turn completes', async () => {
    const coupons: string[] = [];
    const tool = await startProvider((req, res) => {
      let raw = '';
      req.on('data', (d: Buffer) => (raw += d.toString()));
      req.on('end', () => {
        // The tool commits 400 ms in, after the agent's 300 ms timeout.
        setTimeout(() => {
          const code = `COUPON-${coupons.length + 1}`;
          coupons.push(code);
          res.writeHead(200, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ code, user: (JSON.parse(raw) as { user: string }).user }));
        }, 400);
      });
    });
    const call = { type: 'function_call', id: 'fc_1', call_id: 'call_7', name: 'issue_coupon', arguments: '{"user":"u-42"}', status: 'completed' };
    const p = await provider((b) => (b.previous_response_id ? completed('Your coupon is COUPON-1.', 'resp_turn2') : json({ ...baseResponse('completed', [call], usage), id: 'resp_turn1' })));
    const s = await gateway(p, {
      providers: { coupons: { family: 'openai', baseUrl: `${tool.origin}/v1`, apiKey: 'coupons-key', breaker: false } },
      routes: [{ name: 'coupon-tool', match: { path: '/v1/tools/coupon' }, targets: [{ provider: 'coupons', model: 'coupon-tool' }], retry: { retryOn: [429, 503] }, timeoutMs: 10_000 }],
    });
    const { client, requests } = agent(s);
    const turn1 = await client.responses.create({ model: MODEL, input: 'Give u-42 a coupon', tools: [{ type: 'function', name: 'issue_coupon', parameters: { type: 'object', properties: { user: { type: 'string' } } }, strict: false }] });
    const fc = turn1.output.find((o): o is OpenAI.Responses.ResponseFunctionToolCall => o.type === 'function_call')!;
    const result = await client.post<{ code: string }>('/tools/coupon', { body: JSON.parse(fc.arguments) as object, headers: { 'Idempotency-Key': fc.call_id }, timeout: 300 });
    expect(result.code).toBe('COUPON-1');
    const turn2 = await client.responses.create({ model: MODEL, previous_response_id: turn1.id, input: [{ type: 'function_call_output', call_id: fc.call_id, output: JSON.stringify(result) }] });
    expect(turn2.output_text).toContain('COUPON-1');
    expect(coupons).toEqual(['COUPON-1']);
    expect(tool.hits()).toBe(1);
    // turn 1, the tool call and its SDK retry (or retries), turn 2
    expect(requests()).toBeGreaterThanOrEqual(4);
    expect(p.seen[1]!.body.input).toEqual([{ type: 'function_call_output', call_id: 'call_7', output: '{"code":"COUPON-1","user":"u-42"}' }]);
  });

  it('refuses the same key with another body (422 idempotency_key_reused), sending nothing upstream, and the SDK does not retry it', async () => {
    const p = await provider(() => completed());
    const s = await gateway(p);
    const { client, requests } = agent(s);
    await client.responses.create({ model: MODEL, input: 'turn A' }, { headers: { 'Idempotency-Key': 'turn-9' } });
    const err = await sdkError(client.responses.create({ model: MODEL, input: 'turn B' }, { headers: { 'Idempotency-Key': 'turn-9' } }));
    expect(err.status).toBe(422);
    expect(err.code).toBe('idempotency_key_reused');
    expect(p.seen).toHaveLength(1);
    expect(requests()).toBe(2);
  });
});

describe("the SDK's own timeout shorter than the route's", () => {
  it('starts a stream at the client\'s deadline while the model thinks, so the SDK is not timed out and gets the whole answer', async () => {
    const p = await provider(() => ({ steps: [created(), inProgress(), 2_600, ...full().slice(2)] }));
    const s = await gateway(p);
    const { client, requests } = agent(s);
    const final = await client.responses.stream({ model: 'o4-mini', input: 'think' }, { timeout: 2_000 }).finalResponse();
    expect(textOf(final)).toBe('Hello');
    expect(p.seen).toHaveLength(1);
    expect(requests()).toBe(1);
    expect((await requestLine(s, 'responses')).startedEarly).toBe(true);
  });

  it('answers a slow whole response with 504 before the SDK gives up, aborts it upstream, and the SDK does not retry', async () => {
    const p = await provider(() => ({ headers: { 'content-type': 'application/json' }, steps: [3_000, JSON.stringify(baseResponse('completed', [msgItem('late')], usage))] }));
    const s = await gateway(p);
    const { client, requests } = agent(s);
    const started = Date.now();
    const err = await sdkError(client.responses.create({ model: MODEL, input: 'hi' }, { timeout: 2_000 }));
    expect(err.status).toBe(504);
    expect(err.code).toBe('deadline_exceeded');
    expect(Date.now() - started).toBeLessThan(2_000);
    expect(requests()).toBe(1);
    expect(p.seen).toHaveLength(1);
    await sleep(200);
    expect(p.times[0]!.closedAt! - p.times[0]!.at).toBeLessThan(2_500);
  });
});

describe('usage and token metrics for Responses streams', () => {
  it("counts a completed stream's usage (the bundled mock's), as the SDK saw it, under the target that answered", async () => {
    const mock = await startMock({ apiKey: 'p-key' });
    const s = await gateway({ origin: mock.url });
    const { client } = agent(s);
    const final = await client.responses.stream({ model: MODEL, input: 'Summarise the incident in one line.' }).finalResponse();
    expect(final.usage!.input_tokens).toBeGreaterThan(0);
    const prompt = 'stormgate_tokens_total{route="responses",target="p/gpt-4.1",kind="prompt"}';
    const completion = 'stormgate_tokens_total{route="responses",target="p/gpt-4.1",kind="completion"}';
    expect(await series(s, prompt)).toBe(final.usage!.input_tokens);
    expect(await series(s, completion)).toBe(final.usage!.output_tokens);
    expect(await series(s, 'stormgate_stream_ends_total{route="responses",end="complete"}')).toBe(1);
    expect(await metricSum(s, 'stormgate_ttft_seconds_count{route="responses"')).toBe(1);
  });

  it('counts no tokens for a stream cut after its first output, and counts it as a stream error', async () => {
    const p = await provider(() => ({ steps: [...responsesHead(), textDelta('Hel', 4), 20, { destroy: true }] }));
    const s = await gateway(p);
    await drain(await agent(s).client.responses.create({ model: MODEL, input: 'hi', stream: true }));
    expect(await metricSum(s, 'stormgate_tokens_total{route="responses"')).toBe(0);
    expect(await series(s, 'stormgate_stream_ends_total{route="responses",end="cut"}')).toBe(1);
    expect(await series(s, 'stormgate_requests_total{route="responses",target="p/gpt-4.1",priority="online",outcome="stream_error"}')).toBe(1);
  });
});
