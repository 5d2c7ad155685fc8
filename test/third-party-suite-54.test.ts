// Third-party failure-scenario suite 54: an outside QA team's suite, written from the README alone ("Streaming": idleMs
// counts the upstream's silence only, "a client that reads slowly (TCP backpressure) is not an upstream stall", the
// client-stalled rule of ten idle periods; "Idempotency keys": a keyed run outlives its stalled client; "Deadlines and
// timeouts": the deadline counts from the request's head and a body still arriving at it is answered 504; "Errors":
// 413 request_too_large, 408 request_timeout; "Logs and metrics": client_gone, stormgate_stream_ends_total), on SLOW
// CONSUMERS, BACKPRESSURE, LARGE PAYLOADS AND LONG STREAMS. Driven as application code would (the official `openai`
// 6.x SDK, `@anthropic-ai/sdk`, and node:http where a slow reader or a slow uploader needs the socket itself) against
// the bundled mock or a scripted upstream that honours backpressure (it writes only when its socket drains, and counts
// what it wrote), all over real HTTP on 127.0.0.1.
//  1. A slow reader of a fast stream: the upstream is held back (its writes stop, bounded far below the stream), the
//     idle timer does not fire for it, and the whole stream arrives in order; an SDK consumer that sleeps as it goes.
//  2. A reader that stops and leaves, or stops and stays: the upstream request is aborted, one attempt only, logged and
//     counted as the client's doing (client-gone, client-stalled); the stalled reader's pool slot comes back at the
//     stall limit; with an Idempotency-Key the run is read to its end and a repeat gets the whole stream.
//  3. Request bodies at and past server.bodyLimitBytes (declared, chunked, gzip that inflates past it): 413 in the
//     OpenAI shape, x-should-retry false, nothing upstream; at the limit, passed whole.
//  4. Large payloads: 4096 embeddings inputs, a 6.6 MB whole answer, a large answer to a client that pauses, a 26 MB
//     answer read steadily but slowly (never taken for a stall).
//  5. Long streams: 5000 text chunks, 3000 tool-call argument deltas, 2000 reasoning deltas; a stall past idleMs in the
//     middle (text, tool call) raises in the SDK, never a clean end; a pause under idleMs completes.
//  6. 50 slow streams at once beside a fast call.
//  7. Slow uploads: waited for, upstream asked only once the body is whole; a client that leaves mid-upload; past the
//     client's deadline, 504 with nothing upstream; past server.requestTimeoutMs, 408.
//  8. Anthropic /v1/messages streams to a slow reader (native, and translated for a chat client), stalled, abandoned.
// Found here: nothing contrary to the README. Noted: the idle timer counts the time an upstream takes to resume after
// backpressure as its silence (measured: up to ~160 ms on loopback after a reader's full stop), so an idleMs of
// 150 ms ended a stalled reader's stream as `stalled` (the upstream's fault) in 2 of 9 runs instead of
// `client-stalled`; these tests keep idleMs at 300 ms and more where a reader pauses. And @anthropic-ai/sdk's
// messages.stream() helper reads the whole stream into its own queue whatever the loop does (no backpressure reaches
// the gateway through it); messages.create({ stream: true }) reads as the loop asks.
import Anthropic from '@anthropic-ai/sdk';
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { request as httpRequest, type IncomingMessage } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { gzipSync } from 'node:zlib';
import OpenAI from 'openai';
import type { ChatCompletionChunk } from 'openai/resources/chat/completions';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import type { FaultSpec } from '../src/mock/faults.ts';
import { toolCalls } from './helpers/chat-stream.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { expectOpenAIError } from './helpers/openai-error.ts';
import { dataOf, pacedUpstream, until, type PacedRequest, type Piece } from './helpers/paced-upstream.ts';
import { cc, delta } from './helpers/scripted-provider.ts';
import { configServedBy, defaultConfig, metricSum, requestLine, RETRY_LOOP_ONLY, useStacks, type Stack } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();

// ---------- a scripted upstream that honours backpressure (test/helpers/paced-upstream.ts) ----------

type Answer = (body: Record<string, unknown>, n: number) => { status?: number; headers?: Record<string, string>; pieces: Iterable<Piece> };

interface Upstream {
  origin: string;
  requests: PacedRequest[];
}

async function upstream(answer: Answer): Promise<Upstream> {
  const { listener, requests } = pacedUpstream((rec, n) => answer(JSON.parse(rec.body) as Record<string, unknown>, n));
  const p = await startProvider(listener);
  return { origin: p.origin, requests };
}

interface GatewayOptions {
  timeouts?: Record<string, number>;
  server?: Record<string, unknown>;
  route?: Record<string, unknown>;
  /** Fields of the provider's own (maxConnections, pools, ...). */
  provider?: Record<string, unknown>;
  /** Top-level config fields (idempotency, ...). */
  top?: Record<string, unknown>;
  /** The chat route goes to the Anthropic provider (translated) with this model. */
  chatToClaude?: string;
}

/** A gateway whose routes (chat, embeddings, ..., and Anthropic's /v1/messages) all go to one scripted upstream. */
async function gatewayTo(up: Upstream, opts: GatewayOptions = {}): Promise<Stack> {
  return startStack({
    config: (mockUrl) => {
      const c = configServedBy(mockUrl, 'p', `${up.origin}/v1`);
      const timeouts = { connectMs: 2_000, firstTokenMs: 10_000, idleMs: 10_000, ...opts.timeouts };
      Object.assign(c.providers.p as Record<string, unknown>, { timeouts, ...opts.provider });
      c.providers.claude = { family: 'anthropic', baseUrl: up.origin, apiKey: 'claude-key', breaker: false, timeouts } as ConfigInput['providers'][string];
      c.routes.push({ name: 'messages', match: { path: '/v1/messages' }, targets: [{ provider: 'claude' }], ...RETRY_LOOP_ONLY.route });
      for (const r of c.routes as Array<Record<string, unknown>>) {
        r.retry = { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 10 } };
        Object.assign(r, opts.route);
      }
      if (opts.chatToClaude) c.routes.find((r) => r.name === 'chat')!.targets = [{ provider: 'claude', model: opts.chatToClaude }];
      Object.assign(c.server!, opts.server);
      Object.assign(c, opts.top);
      return c;
    },
  });
}

/** A gateway in front of the bundled mock (retry loop only) with the given faults and provider timeouts. */
async function gatewayToMock(faults: FaultSpec, timeouts: Record<string, number> = {}, server: Record<string, unknown> = {}): Promise<Stack> {
  return startStack({
    faults,
    config: (mockUrl) => {
      const c = defaultConfig(mockUrl, RETRY_LOOP_ONLY);
      (c.providers.mock as Record<string, unknown>).timeouts = { connectMs: 2_000, firstTokenMs: 10_000, idleMs: 10_000, ...timeouts };
      c.providers.claude = { family: 'anthropic', baseUrl: mockUrl, apiKey: 'sk-test-stormgate-0123456789', breaker: false, timeouts: { connectMs: 2_000, firstTokenMs: 10_000, idleMs: 10_000, ...timeouts } } as ConfigInput['providers'][string];
      c.routes.push({ name: 'messages', match: { path: '/v1/messages' }, targets: [{ provider: 'claude' }], ...RETRY_LOOP_ONLY.route });
      Object.assign(c.server!, server);
      return c;
    },
  });
}

const sdk = (s: Stack, maxRetries = 0) => new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries });
const claude = (s: Stack) => new Anthropic({ baseURL: s.url, apiKey: 'client-key', maxRetries: 0 });

// ---------- stream bodies ----------

/** The text of content chunk i: numbered and padded, so order and completeness are checked by the text alone. */
const word = (i: number, pad = 0) => `<${i}>${'.'.repeat(pad)}`;
const role = cc([delta({ role: 'assistant', content: '' })]);
const DONE = 'data: [DONE]\n\n';

/** A chat stream of `n` numbered text chunks (each padded by `pad` dots), a finish and [DONE]; `pauseAt`: a pause before chunk i. */
function* textStream(n: number, pad = 0, pause?: { at: number; ms: number }): Generator<Piece> {
  yield role;
  for (let i = 0; i < n; i++) {
    if (pause && i === pause.at) yield { pauseMs: pause.ms };
    yield cc([delta({ content: word(i, pad) })]);
  }
  yield cc([delta({}, 'stop')]);
  yield DONE;
}
const textOf = (n: number, pad = 0, from = 0) => Array.from({ length: n - from }, (_, k) => word(from + k, pad)).join('');

/** Reads an SDK chat stream, sleeping `napMs` after every `every` chunks: the text, the finish, the chunks, and what it raised. */
async function consume(stream: AsyncIterable<ChatCompletionChunk>, napMs = 0, every = 1) {
  let text = '';
  let finish: string | null = null;
  const chunks: ChatCompletionChunk[] = [];
  let err: unknown;
  try {
    for await (const chunk of stream) {
      chunks.push(chunk);
      text += chunk.choices[0]?.delta?.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
      if (napMs > 0 && chunks.length % every === 0) await sleep(napMs);
    }
  } catch (e) {
    err = e;
  }
  return { text, finish, chunks, err };
}

// ---------- raw HTTP ----------

const CHAT_BODY = (extra: Record<string, unknown> = {}) => JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], ...extra });

/** A request on its own connection whose answer is left unread until the test reads it: node:http, so the socket can be paused. */
function rawPost(s: Stack, path: string, body: string | Buffer, headers: Record<string, string> = {}): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(`${s.url}${path}`, { method: 'POST', agent: false, headers: { 'content-type': 'application/json', ...headers } }, resolve);
    req.on('error', reject);
    req.end(body);
  });
}

/** Reads an answer's body to its end (or to its connection's close); whether it ended cleanly. */
async function readBody(res: IncomingMessage): Promise<{ text: string; complete: boolean }> {
  const parts: Buffer[] = [];
  res.on('data', (d: Buffer) => parts.push(d));
  res.resume(); // a stream paused by hand stays paused when a 'data' listener is added
  const complete = await new Promise<boolean>((resolve) => {
    res.on('end', () => resolve(true));
    res.on('error', () => resolve(false));
    res.on('close', () => resolve(res.complete));
  });
  return { text: Buffer.concat(parts).toString(), complete };
}

/** The OpenAI error shape, exactly its four fields, with `code` (whatever its type). */
function gatewayError(body: unknown, code: string): void {
  const e = (body as { error: Record<string, unknown> }).error;
  expect(Object.keys(e).sort()).toEqual(['code', 'message', 'param', 'type']);
  expect(e.code).toBe(code);
}



// ======================================================================================================

describe('a slow reader of a fast stream', () => {
  it('holds the upstream back instead of buffering it: a 3 s pause (idleMs 1 s) stops the upstream far short of its 48 MB, and then the whole stream arrives in order', async () => {
    // 12,000 chunks of ~4 KB: about 48 MB, far more than the sockets' buffers on the way hold.
    const N = 12_000;
    const PAD = 4_000;
    const up = await upstream(() => ({ pieces: textStream(N, PAD) }));
    const s = await gatewayTo(up, { timeouts: { idleMs: 1_000 } });
    const res = await rawPost(s, '/v1/chat/completions', CHAT_BODY({ stream: true }));
    expect(res.statusCode).toBe(200);
    res.pause();
    await sleep(3_000);
    const heldBack = up.requests[0]!.written;
    // The upstream was made to wait for its socket, and had written a bounded share of the stream when the reader paused.
    expect(up.requests[0]!.waits).toBeGreaterThan(0);
    expect(up.requests[0]!.finished).toBe(false);
    expect(heldBack).toBeLessThan(24 * 1024 * 1024); // measured: about 8.5 MB in the sockets' buffers on the way
    const { text, complete } = await readBody(res);
    expect(complete).toBe(true);
    const events = dataOf(text);
    expect(events.at(-1)).toBe('[DONE]');
    const content = events
      .slice(0, -1)
      .map((d) => (JSON.parse(d) as ChatCompletionChunk).choices[0]?.delta?.content ?? '')
      .join('');
    expect(content).toBe(textOf(N, PAD));
    expect(text).not.toContain('stream_interrupted');
    expect(up.requests).toHaveLength(1);
    expect(up.requests[0]!.finished).toBe(true);
    const line = await requestLine(s);
    expect(line.streamEnd).toBe('complete');
    expect(line.outcome).toBe('success');
  }, 30_000);

  it('an SDK loop that sleeps as it reads (700 ms every 1200 of 6000 chunks of 4 KB, idleMs 500) gets every chunk, in order, with no error', async () => {
    const N = 6_000;
    const up = await upstream(() => ({ pieces: textStream(N, 4_000) }));
    const s = await gatewayTo(up, { timeouts: { idleMs: 500 } });
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    let heldAtFirstNap: boolean | undefined;
    let text = '';
    let finish: string | null = null;
    let n = 0;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
      if (++n % 1_200 === 0) {
        await sleep(700);
        // 24 MB in all: at the first nap the upstream is still held back by the reader, not done.
        heldAtFirstNap ??= !up.requests[0]!.finished;
      }
    }
    expect(heldAtFirstNap).toBe(true);
    expect(text).toBe(textOf(N, 4_000));
    expect(finish).toBe('stop');
    expect(up.requests).toHaveLength(1);
    expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="complete"}')).toBe(1);
    expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="stalled"}')).toBe(0);
  }, 30_000);

  it('a reader that stops and then disconnects: the upstream answer is aborted, sent once, and the request logged and counted as client_gone', async () => {
    const up = await upstream(() => ({ pieces: textStream(20_000, 2_000) }));
    const s = await gatewayTo(up, { timeouts: { idleMs: 5_000 } });
    const res = await rawPost(s, '/v1/chat/completions', CHAT_BODY({ stream: true }));
    expect(res.statusCode).toBe(200);
    res.pause();
    await sleep(800);
    res.destroy();
    expect(await until(() => up.requests[0]!.aborted, 5_000)).toBe(true);
    await sleep(500); // no attempt after the client left
    expect(up.requests).toHaveLength(1);
    expect(up.requests[0]!.finished).toBe(false);
    const line = await requestLine(s);
    expect(line.outcome).toBe('client_gone');
    expect(line.clientGone).toBe(true);
    expect(line.attempts).toHaveLength(1);
    expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="client-gone"}')).toBe(1);
    expect(await metricSum(s, 'stormgate_requests_total{route="chat",target="p/gpt-4o",priority="online",outcome="client_gone"}')).toBe(1);
  }, 20_000);

  it('a reader that takes nothing for ten idle periods while staying connected is given up on: its connection closed, the upstream aborted (client-stalled)', async () => {
    // idleMs 500: ten idle periods are 5 s, counted once the buffers on the way are full.
    const up = await upstream(() => ({ pieces: textStream(20_000, 4_000) }));
    const s = await gatewayTo(up, { timeouts: { idleMs: 500 } });
    const res = await rawPost(s, '/v1/chat/completions', CHAT_BODY({ stream: true }));
    expect(res.statusCode).toBe(200);
    res.pause(); // and never read again; the socket stays open
    const connections = () => new Promise<number>((resolve) => s.gateway.server.getConnections((_e, n) => resolve(n)));
    expect(await connections()).toBe(1);
    const t0 = performance.now();
    expect(await until(async () => (await connections()) === 0, 25_000)).toBe(true);
    expect(performance.now() - t0).toBeGreaterThan(4_000);
    expect(await until(() => up.requests[0]!.aborted, 5_000)).toBe(true);
    expect(up.requests).toHaveLength(1);
    expect(up.requests[0]!.finished).toBe(false);
    expect(up.requests[0]!.written).toBeLessThan(24 * 1024 * 1024);
    expect(await until(async () => (await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="client-stalled"}')) === 1, 3_000)).toBe(true);
    expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="stalled"}')).toBe(0);
    const line = await requestLine(s);
    expect(line.streamEnd).toBe('client-stalled');
    expect(line.outcome).toBe('client_gone');
    res.destroy();
  }, 40_000);

  it("a stalled reader's pool slot is freed at the stall limit: the call queued behind it on a pool of one is answered then", async () => {
    const up = await upstream((body) =>
      body.stream === true
        ? { pieces: textStream(20_000, 4_000) }
        : { headers: { 'content-type': 'application/json' }, pieces: [JSON.stringify({ id: 'c', object: 'chat.completion', created: 1, model: 'gpt-4o', choices: [{ index: 0, message: { role: 'assistant', content: 'behind the stall' }, finish_reason: 'stop' }] })] },
    );
    const s = await gatewayTo(up, { timeouts: { idleMs: 300 }, provider: { maxConnections: 1 } });
    const stalled = await rawPost(s, '/v1/chat/completions', CHAT_BODY({ stream: true }));
    expect(stalled.statusCode).toBe(200);
    stalled.pause();
    const t0 = performance.now();
    const answer = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'next' }] });
    const waitedMs = performance.now() - t0;
    expect(answer.choices[0]!.message.content).toBe('behind the stall');
    // Ten idle periods of 300 ms: the slot came back no sooner than that, and not much later.
    expect(waitedMs).toBeGreaterThan(2_500);
    expect(waitedMs).toBeLessThan(15_000);
    expect(up.requests).toHaveLength(2);
    expect(up.requests[0]!.aborted).toBe(true);
    expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="client-stalled"}')).toBe(1);
    stalled.destroy();
  }, 30_000);

  it('with an Idempotency-Key, a reader that takes nothing has its connection closed, but the run is read to its end, and a repeat gets the whole stream', async () => {
    const N = 3_000; // 12 MB
    const up = await upstream(() => ({ pieces: textStream(N, 4_000) }));
    const s = await gatewayTo(up, { timeouts: { idleMs: 300 }, top: { idempotency: { maxAnswerBytes: 32 * 1024 * 1024 } } });
    const key = { 'idempotency-key': 'slow-reader-0001' };
    const first = await rawPost(s, '/v1/chat/completions', CHAT_BODY({ stream: true }), key);
    expect(first.statusCode).toBe(200);
    first.pause();
    const connections = () => new Promise<number>((resolve) => s.gateway.server.getConnections((_e, n) => resolve(n)));
    expect(await until(async () => (await connections()) === 0, 20_000)).toBe(true);
    // The run went on without its client: the upstream answer was read to its end, not aborted.
    expect(await until(() => up.requests[0]!.finished, 10_000)).toBe(true);
    expect(up.requests[0]!.aborted).toBe(false);
    first.destroy();
    const repeat = await rawPost(s, '/v1/chat/completions', CHAT_BODY({ stream: true }), key);
    expect(repeat.statusCode).toBe(200);
    expect(repeat.headers['idempotent-replayed']).toBe('true');
    const { text } = await readBody(repeat);
    const content = dataOf(text)
      .filter((d) => d !== '[DONE]')
      .map((d) => (JSON.parse(d) as ChatCompletionChunk).choices[0]?.delta?.content ?? '')
      .join('');
    expect(content).toBe(textOf(N, 4_000));
    expect(up.requests).toHaveLength(1);
  }, 40_000);

  it('an SDK stream aborted mid-way by its caller: the mock sees its one request aborted, and nothing is sent again', async () => {
    const s = await gatewayToMock({ stream: { chunks: 400, chunkDelayMs: 10 } });
    const stream = await sdk(s, 2).chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    let seen = 0;
    const reading = (async () => {
      for await (const _ of stream) if (++seen === 20) stream.controller.abort();
    })().catch((e: unknown) => e);
    await reading;
    // The SDK hands over what it had already read before it stops.
    expect(seen).toBeGreaterThanOrEqual(20);
    expect(seen).toBeLessThan(400);
    expect(await until(() => s.mock.stats().aborted === 1, 5_000)).toBe(true);
    await sleep(500);
    expect(s.mock.stats().total).toBe(1);
    expect(s.mock.requests()[0]!.aborted).toBe(true);
    expect(s.mock.requests()[0]!.chunksSent).toBeLessThan(400);
    expect((await requestLine(s)).outcome).toBe('client_gone');
  });
});

// ======================================================================================================

describe('request bodies at and past server.bodyLimitBytes', () => {
  const LIMIT = 200_000;
  /** A chat body of exactly `bytes` bytes. */
  const bodyOf = (bytes: number) => {
    const empty = CHAT_BODY({ messages: [{ role: 'user', content: '' }] });
    return CHAT_BODY({ messages: [{ role: 'user', content: 'a'.repeat(bytes - empty.length) }] });
  };

  it('a body of exactly the limit is passed whole; one byte more is 413 request_too_large naming the limit, x-should-retry false, nothing upstream', async () => {
    const s = await gatewayToMock({}, {}, { bodyLimitBytes: LIMIT });
    const at = bodyOf(LIMIT);
    expect(Buffer.byteLength(at)).toBe(LIMIT);
    const ok = await fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: at });
    expect(ok.status).toBe(200);
    await ok.json();
    expect(s.mock.stats().total).toBe(1);
    expect(Number(s.mock.requests()[0]!.headers['content-length'])).toBeGreaterThanOrEqual(LIMIT - 100);

    const over = await fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: bodyOf(LIMIT + 1) });
    expect(over.status).toBe(413);
    expect(over.headers.get('x-should-retry')).toBe('false');
    const e = expectOpenAIError(await over.json(), 'request_too_large');
    expect(e.message).toContain(String(LIMIT));
    expect(s.mock.stats().total).toBe(1);
  });

  it('the openai SDK gets the 413 as an APIError and does not send it again (maxRetries 2); it counts as rejected', async () => {
    const s = await gatewayToMock({}, {}, { bodyLimitBytes: LIMIT });
    let sent = 0;
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'k', maxRetries: 2, fetch: (u, i) => (sent++, fetch(u, i)) });
    const err = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x'.repeat(LIMIT) }] }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(413);
    expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('request_too_large');
    expect(sent).toBe(1);
    expect(s.mock.stats().total).toBe(0);
    expect(await metricSum(s, 'stormgate_requests_total{route="none",target="none",priority="none",outcome="rejected"}')).toBe(1);
  });

  it('a chunked upload (no content-length) that grows past the limit is 413 too, with nothing upstream', async () => {
    const s = await gatewayToMock({}, {}, { bodyLimitBytes: LIMIT });
    const body = Buffer.from(bodyOf(LIMIT * 3));
    const res = await new Promise<IncomingMessage>((resolve, reject) => {
      const req = httpRequest(`${s.baseURL}/chat/completions`, { method: 'POST', agent: false, headers: { 'content-type': 'application/json', 'transfer-encoding': 'chunked' } }, resolve);
      req.on('error', reject);
      for (let i = 0; i < body.length; i += 16_384) req.write(body.subarray(i, i + 16_384));
      req.end();
    });
    expect(res.statusCode).toBe(413);
    expectOpenAIError(JSON.parse((await readBody(res)).text), 'request_too_large');
    expect(s.mock.stats().total).toBe(0);
  });

  it('a gzip body of 2 KB that inflates past the limit is 413; one that inflates under it reaches the upstream decoded', async () => {
    const s = await gatewayToMock({}, {}, { bodyLimitBytes: LIMIT });
    const bomb = gzipSync(bodyOf(LIMIT * 5));
    expect(bomb.length).toBeLessThan(4_000);
    const res = await rawPost(s, '/v1/chat/completions', bomb, { 'content-encoding': 'gzip' });
    expect(res.statusCode).toBe(413);
    expectOpenAIError(JSON.parse((await readBody(res)).text), 'request_too_large');
    expect(s.mock.stats().total).toBe(0);

    const fine = await rawPost(s, '/v1/chat/completions', gzipSync(bodyOf(LIMIT - 10)), { 'content-encoding': 'gzip' });
    expect(fine.statusCode).toBe(200);
    const answer = JSON.parse((await readBody(fine)).text) as { choices: Array<{ message: { content: string } }> };
    expect(answer.choices[0]!.message.content).toBe(`Mock answer to: ${'a'.repeat(40)}`);
    expect(s.mock.stats().total).toBe(1);
  });
});

// ======================================================================================================

describe('large payloads', () => {
  it('4096 embeddings inputs in one call: every vector back, in order, from one upstream request that got every input', async () => {
    const s = await gatewayToMock({});
    const input = Array.from({ length: 4_096 }, (_, i) => `document ${i}: ${'lorem ipsum '.repeat(8)}`);
    const direct = new OpenAI({ baseURL: `${s.mock.url}/v1`, apiKey: 'sk-test-stormgate-0123456789', maxRetries: 0 });
    const viaGateway = await sdk(s).embeddings.create({ model: 'text-embedding-3-small', input, dimensions: 64 });
    expect(viaGateway.data).toHaveLength(4_096);
    expect(viaGateway.data.map((d) => d.index)).toEqual(input.map((_, i) => i));
    const reference = await direct.embeddings.create({ model: 'text-embedding-3-small', input, dimensions: 64 });
    expect(viaGateway.data.map((d) => d.embedding)).toEqual(reference.data.map((d) => d.embedding));
    const logged = s.mock.requests().filter((r) => r.path === '/v1/embeddings');
    expect(logged).toHaveLength(2); // the gateway's one, and the reference call made straight to the mock
    expect(viaGateway.usage).toEqual(reference.usage);
  });

  const BIG = 'big answer '.repeat(600_000); // 6.6 MB
  const bigCompletion = () =>
    JSON.stringify({
      id: 'chatcmpl-big',
      object: 'chat.completion',
      created: 1741290958,
      model: 'gpt-4o-2024-08-06',
      choices: [{ index: 0, message: { role: 'assistant', content: BIG }, logprobs: null, finish_reason: 'stop' }],
      usage: { prompt_tokens: 9, completion_tokens: 1_650_000, total_tokens: 1_650_009 },
    });
  const sha = (t: string) => createHash('sha256').update(t).digest('hex');
  /** The answer in 64 KB pieces, as a server streams a large body. */
  const inPieces = (buf: Buffer): Piece[] => Array.from({ length: Math.ceil(buf.length / 65_536) }, (_, i) => buf.subarray(i * 65_536, (i + 1) * 65_536));

  it('a 6.6 MB whole answer reaches the SDK byte for byte, with the upstream usage, in one attempt', async () => {
    const up = await upstream(() => ({ headers: { 'content-type': 'application/json' }, pieces: inPieces(Buffer.from(bigCompletion())) }));
    const s = await gatewayTo(up);
    const { data, response } = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }).withResponse();
    expect(sha(data.choices[0]!.message.content!)).toBe(sha(BIG));
    expect(data.usage?.completion_tokens).toBe(1_650_000);
    expect(response.headers.get('x-stormgate-attempts')).toBe('1');
    expect(up.requests).toHaveLength(1);
  });

  it('a large whole answer to a client that reads it slowly (pauses of 2 s and 1 s, under ten idle periods of 500 ms) arrives whole', async () => {
    const body = bigCompletion();
    const up = await upstream(() => ({ headers: { 'content-type': 'application/json' }, pieces: inPieces(Buffer.from(body)) }));
    const s = await gatewayTo(up, { timeouts: { idleMs: 500 } });
    const res = await rawPost(s, '/v1/chat/completions', CHAT_BODY());
    expect(res.statusCode).toBe(200);
    res.pause();
    await sleep(2_000);
    const parts: Buffer[] = [];
    let pausedOnce = false;
    res.on('data', (d: Buffer) => {
      parts.push(d);
      if (!pausedOnce && Buffer.concat(parts).length > 1_000_000) {
        pausedOnce = true;
        res.pause();
        setTimeout(() => res.resume(), 1_000);
      }
    });
    res.resume();
    await once(res, 'end');
    const text = Buffer.concat(parts).toString();
    expect(text.length).toBe(body.length);
    expect(sha(text)).toBe(sha(body));
    expect(pausedOnce).toBe(true);
    const line = await requestLine(s);
    expect(line.outcome).toBe('success');
    expect(line.clientStalled).toBeUndefined();
  }, 20_000);

  it('a 26 MB whole answer read steadily but slowly (1 MB, then 150 ms of nothing, over and over; stall limit 0.5 s) is never taken for a stalled client', async () => {
    const body = JSON.stringify({
      id: 'chatcmpl-huge',
      object: 'chat.completion',
      created: 1,
      model: 'gpt-4o',
      choices: [{ index: 0, message: { role: 'assistant', content: BIG.repeat(4) }, logprobs: null, finish_reason: 'stop' }],
    });
    const up = await upstream(() => ({ headers: { 'content-type': 'application/json' }, pieces: inPieces(Buffer.from(body)) }));
    const s = await gatewayTo(up, { timeouts: { idleMs: 50 } });
    const res = await rawPost(s, '/v1/chat/completions', CHAT_BODY());
    expect(res.statusCode).toBe(200);
    const parts: Buffer[] = [];
    let sincePause = 0;
    let pauses = 0;
    res.on('data', (d: Buffer) => {
      parts.push(d);
      sincePause += d.length;
      if (sincePause >= 1_000_000) {
        sincePause = 0;
        pauses++;
        res.pause();
        setTimeout(() => res.resume(), 150);
      }
    });
    const ended = await new Promise<boolean>((resolve) => {
      res.on('end', () => resolve(true));
      res.on('close', () => resolve(res.complete));
    });
    expect(ended).toBe(true);
    expect(pauses).toBeGreaterThan(20);
    const text = Buffer.concat(parts).toString();
    expect(text.length).toBe(body.length);
    expect(sha(text)).toBe(sha(body));
    const line = await requestLine(s);
    expect(line.clientStalled).toBeUndefined();
    expect(line.outcome).toBe('success');
  }, 30_000);
});

// ======================================================================================================

describe('long streams', () => {
  const ask = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'hi' }], stream: true as const };

  it('5000 text chunks arrive through the SDK in order and complete', async () => {
    const up = await upstream(() => ({ pieces: textStream(5_000) }));
    const s = await gatewayTo(up, { timeouts: { idleMs: 1_000 } });
    const got = await consume(await sdk(s).chat.completions.create(ask));
    expect(got.err).toBeUndefined();
    expect(got.text).toBe(textOf(5_000));
    expect(got.chunks.filter((c) => (c.choices[0]?.delta?.content ?? '') !== '')).toHaveLength(5_000);
    expect(got.finish).toBe('stop');
  });

  /** A tool call whose arguments come in `n` deltas; `stallAt`: the upstream goes silent (and keeps the connection) before delta i. */
  function* toolStream(n: number, stallAt?: number): Generator<Piece> {
    yield role;
    yield cc([delta({ tool_calls: [{ index: 0, id: 'call_big', type: 'function', function: { name: 'write_file', arguments: '' } }] })]);
    yield cc([delta({ tool_calls: [{ index: 0, function: { arguments: '{"lines":[' } }] })]);
    for (let i = 0; i < n; i++) {
      if (i === stallAt) yield { pauseMs: 60_000 };
      yield cc([delta({ tool_calls: [{ index: 0, function: { arguments: `${i === 0 ? '' : ','}${i}` } }] })]);
    }
    yield cc([delta({ tool_calls: [{ index: 0, function: { arguments: ']}' } }] })]);
    yield cc([delta({}, 'tool_calls')]);
    yield DONE;
  }

  it('a tool call whose arguments come in 3000 deltas is assembled exactly, finish_reason tool_calls', async () => {
    const up = await upstream(() => ({ pieces: toolStream(3_000) }));
    const s = await gatewayTo(up, { timeouts: { idleMs: 1_000 } });
    const got = await consume(await sdk(s).chat.completions.create(ask));
    expect(got.err).toBeUndefined();
    expect(got.finish).toBe('tool_calls');
    const calls = toolCalls(got.chunks);
    expect(Object.keys(calls)).toEqual(['0']);
    expect(calls[0]!.ids).toBe(1);
    expect(calls[0]!.name).toBe('write_file');
    expect(JSON.parse(calls[0]!.args)).toEqual({ lines: Array.from({ length: 3_000 }, (_, i) => i) });
  });

  it('2000 reasoning deltas then the text: every reasoning delta reaches the client, then the answer', async () => {
    const up = await upstream(() => ({
      pieces: (function* () {
        yield role;
        for (let i = 0; i < 2_000; i++) yield cc([delta({ reasoning_content: `r${i};` })]);
        yield cc([delta({ content: 'forty-two' })]);
        yield cc([delta({}, 'stop')]);
        yield DONE;
      })(),
    }));
    const s = await gatewayTo(up, { timeouts: { idleMs: 1_000 } });
    const got = await consume(await sdk(s).chat.completions.create(ask));
    expect(got.err).toBeUndefined();
    const reasoning = got.chunks.map((c) => (c.choices[0]?.delta as { reasoning_content?: string } | undefined)?.reasoning_content ?? '').join('');
    expect(reasoning).toBe(Array.from({ length: 2_000 }, (_, i) => `r${i};`).join(''));
    expect(got.text).toBe('forty-two');
    expect(got.finish).toBe('stop');
  });

  it('a stall past idleMs after 1500 of 3000 chunks: the SDK raises stream_interrupted with exactly the first 1500, never a clean end; one attempt', async () => {
    const up = await upstream(() => ({ pieces: textStream(3_000, 0, { at: 1_500, ms: 60_000 }) }));
    const s = await gatewayTo(up, { timeouts: { idleMs: 500 } });
    const t0 = performance.now();
    const got = await consume(await sdk(s).chat.completions.create(ask));
    expect(got.err).toBeInstanceOf(OpenAI.APIError);
    expect((got.err as InstanceType<typeof OpenAI.APIError>).code).toBe('stream_interrupted');
    expect(String((got.err as Error).message)).toMatch(/stall/i);
    expect(got.text).toBe(textOf(1_500));
    expect(got.finish).toBeNull();
    expect(performance.now() - t0).toBeLessThan(8_000);
    expect(await until(() => up.requests[0]!.aborted, 5_000)).toBe(true);
    expect(up.requests).toHaveLength(1);
    const line = await requestLine(s);
    expect(line.streamEnd).toBe('stalled');
    expect(line.outcome).toBe('stream_error');
    expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="stalled"}')).toBe(1);
  }, 20_000);

  it('a pause shorter than idleMs (400 ms of 1 s) in the middle of 2000 chunks: the stream completes', async () => {
    const up = await upstream(() => ({ pieces: textStream(2_000, 0, { at: 1_000, ms: 400 }) }));
    const s = await gatewayTo(up, { timeouts: { idleMs: 1_000 } });
    const got = await consume(await sdk(s).chat.completions.create(ask));
    expect(got.err).toBeUndefined();
    expect(got.text).toBe(textOf(2_000));
    expect(got.finish).toBe('stop');
    expect((await requestLine(s)).streamEnd).toBe('complete');
  });

  it('a tool call stalled past idleMs half-way through its arguments: the SDK raises, and no finish_reason ever came', async () => {
    const up = await upstream(() => ({ pieces: toolStream(3_000, 1_500) }));
    const s = await gatewayTo(up, { timeouts: { idleMs: 500 } });
    const got = await consume(await sdk(s).chat.completions.create(ask));
    expect(got.err).toBeInstanceOf(OpenAI.APIError);
    expect(got.finish).toBeNull();
    const args = toolCalls(got.chunks)[0]!.args;
    expect(args).toBe(`{"lines":[${Array.from({ length: 1_500 }, (_, i) => i).join(',')}`);
    expect(up.requests).toHaveLength(1);
  }, 20_000);

});

// ======================================================================================================

describe('many slow streams at once', () => {
  it('50 slow streams read by slow consumers all complete, and a fast call beside them is answered within 2 s', async () => {
    const s = await gatewayToMock({ stream: { chunks: 40, chunkDelayMs: 30 } }, { idleMs: 2_000 });
    const client = sdk(s);
    const streams = Array.from({ length: 50 }, async (_, i) => {
      const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: `stream ${i}` }], stream: true });
      return consume(stream, 10);
    });
    await sleep(300);
    const t0 = performance.now();
    const fast = await client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'quick' }] });
    const fastMs = performance.now() - t0;
    expect(fast.choices[0]!.message.content).toBe('Mock answer to: quick');
    expect(fastMs).toBeLessThan(2_000);
    const results = await Promise.all(streams);
    results.forEach((r, i) => {
      expect(r.err).toBeUndefined();
      expect(r.text).toBe(`Mock answer to: stream ${i}`);
      expect(r.finish).toBe('stop');
    });
    expect(s.mock.stats().total).toBe(51);
    expect(s.mock.stats().aborted).toBe(0);
    expect(s.mock.stats().maxInflight).toBeGreaterThanOrEqual(40);
    expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="complete"}')).toBe(50);
  }, 30_000);
});

// ======================================================================================================

describe('slow uploads', () => {
  /** Sends `body` in `pieces` parts `gapMs` apart on its own connection; the answer, and when the last part was written. */
  function trickle(s: Stack, body: string, pieces: number, gapMs: number, headers: Record<string, string> = {}) {
    let lastWrittenAt = 0;
    const answer = new Promise<IncomingMessage>((resolve, reject) => {
      const req = httpRequest(`${s.baseURL}/chat/completions`, {
        method: 'POST',
        agent: false,
        headers: { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(body)), ...headers },
      }, resolve);
      req.on('error', reject);
      void (async () => {
        const size = Math.ceil(body.length / pieces);
        for (let i = 0; i < pieces; i++) {
          if (req.destroyed) return;
          req.write(body.slice(i * size, (i + 1) * size));
          lastWrittenAt = performance.now();
          if (i < pieces - 1) await sleep(gapMs);
        }
        req.end();
      })();
    });
    return { answer, lastWrittenAt: () => lastWrittenAt };
  }

  it('a body sent in 5 parts over 1.2 s is waited for: the upstream is asked once, after the last part, with the whole body', async () => {
    const up = await upstream(() => ({ headers: { 'content-type': 'application/json' }, pieces: [JSON.stringify({ id: 'c', object: 'chat.completion', created: 1, model: 'gpt-4o', choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }] })] }));
    const s = await gatewayTo(up);
    const content = 'slow upload '.repeat(2_000);
    const t = trickle(s, CHAT_BODY({ messages: [{ role: 'user', content }] }), 5, 300);
    const res = await t.answer;
    expect(res.statusCode).toBe(200);
    expect(JSON.parse((await readBody(res)).text).choices[0].message.content).toBe('ok');
    expect(up.requests).toHaveLength(1);
    // Not streamed upstream as it came: the upstream request began only once the body was whole.
    expect(up.requests[0]!.arrivedAt).toBeGreaterThanOrEqual(t.lastWrittenAt());
    expect((JSON.parse(up.requests[0]!.body).messages as Array<{ content: string }>)[0]!.content).toBe(content);
  });

  it('a client that leaves half-way through its upload: nothing upstream, and no connection left open', async () => {
    const s = await gatewayToMock({});
    const body = CHAT_BODY({ messages: [{ role: 'user', content: 'z'.repeat(50_000) }] });
    const req = httpRequest(`${s.baseURL}/chat/completions`, { method: 'POST', agent: false, headers: { 'content-type': 'application/json', 'content-length': String(body.length) } });
    req.on('error', () => undefined);
    req.write(body.slice(0, 20_000));
    await sleep(300);
    const connections = () => new Promise<number>((resolve) => s.gateway.server.getConnections((_e, n) => resolve(n)));
    expect(await connections()).toBe(1);
    req.destroy();
    expect(await until(async () => (await connections()) === 0, 5_000)).toBe(true);
    await sleep(300);
    expect(s.mock.stats().total).toBe(0);
  });

  it("a body still arriving at the client's deadline (x-stormgate-timeout-ms 1500, body over 4 s): 504 deadline_exceeded before the body is whole, nothing upstream", async () => {
    const s = await gatewayToMock({});
    const t0 = performance.now();
    const t = trickle(s, CHAT_BODY({ messages: [{ role: 'user', content: 'x'.repeat(8_000) }] }), 8, 500, { 'x-stormgate-timeout-ms': '1500' });
    const res = await t.answer;
    const tookMs = performance.now() - t0;
    expect(res.statusCode).toBe(504);
    expect(res.headers['x-should-retry']).toBe('false');
    gatewayError(JSON.parse((await readBody(res)).text), 'deadline_exceeded');
    expect(tookMs).toBeLessThan(3_000);
    expect(tookMs).toBeGreaterThan(900);
    await sleep(200);
    expect(s.mock.stats().total).toBe(0);
    expect(await metricSum(s, 'stormgate_requests_total{route="none",target="none",priority="none",outcome="deadline"}')).toBe(1);
  });

  it('a body that stops half-way: 408 request_timeout after server.requestTimeoutMs (1 s), in the OpenAI shape, nothing upstream', async () => {
    const s = await gatewayToMock({}, {}, { requestTimeoutMs: 1_000 });
    const body = CHAT_BODY({ messages: [{ role: 'user', content: 'y'.repeat(4_000) }] });
    const t0 = performance.now();
    const res = await new Promise<IncomingMessage>((resolve, reject) => {
      const req = httpRequest(`${s.baseURL}/chat/completions`, { method: 'POST', agent: false, headers: { 'content-type': 'application/json', 'content-length': String(body.length) } }, resolve);
      req.on('error', reject);
      req.write(body.slice(0, 2_000)); // and never the rest
    });
    const tookMs = performance.now() - t0;
    expect(res.statusCode).toBe(408);
    gatewayError(JSON.parse((await readBody(res)).text), 'request_timeout');
    expect(tookMs).toBeGreaterThan(900);
    expect(tookMs).toBeLessThan(4_000);
    expect(s.mock.stats().total).toBe(0);
  });
});

// ======================================================================================================

describe('Anthropic /v1/messages streams', () => {
  const ev = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
  /** Anthropic's real event sequence with `n` numbered text deltas. */
  function* messagesStream(n: number, pad = 20): Generator<Piece> {
    yield ev('message_start', { message: { id: 'msg_01slow', type: 'message', role: 'assistant', model: 'claude-sonnet-4-6', content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 10, output_tokens: 1 } } });
    yield ev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } });
    yield ev('ping', {});
    for (let i = 0; i < n; i++) yield ev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: word(i, pad) } });
    yield ev('content_block_stop', { index: 0 });
    yield ev('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: n } });
    yield ev('message_stop', {});
  }

  it('3000 text deltas of 8 KB to an SDK reader that sleeps 700 ms every 600 events (idleMs 500): the whole message, events in order', async () => {
    const up = await upstream(() => ({ pieces: messagesStream(3_000, 8_000) }));
    const s = await gatewayTo(up, { timeouts: { idleMs: 500 } });
    // messages.create({ stream: true }) reads as the loop asks; the messages.stream() helper reads the whole stream into
    // its own queue at once, whatever the loop does, so no backpressure would reach the gateway through it.
    const stream = await claude(s).messages.create({ model: 'claude-sonnet-4-6', max_tokens: 4_000, messages: [{ role: 'user', content: 'hi' }], stream: true });
    const types: string[] = [];
    let text = '';
    let stop: string | null = null;
    let heldAtFirstNap: boolean | undefined;
    for await (const e of stream) {
      types.push(e.type);
      if (e.type === 'content_block_delta' && e.delta.type === 'text_delta') text += e.delta.text;
      if (e.type === 'message_delta') stop = e.delta.stop_reason;
      if (types.length % 600 === 0) {
        await sleep(700);
        // 24 MB in all: at the first nap the upstream is still held back by the reader, not done.
        heldAtFirstNap ??= !up.requests[0]!.finished;
      }
    }
    expect(heldAtFirstNap).toBe(true);
    expect(text).toBe(textOf(3_000, 8_000));
    expect(stop).toBe('end_turn');
    expect(types[0]).toBe('message_start');
    expect(types.at(-1)).toBe('message_stop');
    expect(types.filter((t) => t === 'content_block_delta')).toHaveLength(3_000);
    expect(up.requests).toHaveLength(1);
    expect((await requestLine(s, 'messages')).streamEnd).toBe('complete');
  }, 30_000);

  it('translated for a chat client: an openai SDK loop that sleeps 700 ms every 600 of 3000 chunks of 8 KB (idleMs 500) gets every delta of the Claude stream', async () => {
    const up = await upstream(() => ({ pieces: messagesStream(3_000, 8_000) }));
    const s = await gatewayTo(up, { timeouts: { idleMs: 500 }, chatToClaude: 'claude-sonnet-4-6' });
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    let text = '';
    let finish: string | null = null;
    let n = 0;
    let heldAtFirstNap: boolean | undefined;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
      if (++n % 600 === 0) {
        await sleep(700);
        heldAtFirstNap ??= !up.requests[0]!.finished;
      }
    }
    expect(heldAtFirstNap).toBe(true);
    expect(text).toBe(textOf(3_000, 8_000));
    expect(finish).toBe('stop');
    expect(up.requests).toHaveLength(1);
    expect((await requestLine(s)).streamEnd).toMatch(/^(complete|done-added)$/);
  }, 30_000);

  it('the mock stalling after 200 of 400 deltas (idleMs 400): the SDK raises, finalMessage rejects, one upstream request', async () => {
    const s = await gatewayToMock({ stream: { chunks: 400, stallAfterChunks: 200 } }, { idleMs: 400 });
    const stream = claude(s).messages.stream({ model: 'claude-sonnet-4-6', max_tokens: 1_000, messages: [{ role: 'user', content: 'hi' }] });
    let deltas = 0;
    const raised = await (async () => {
      for await (const e of stream) if (e.type === 'content_block_delta') deltas++;
    })().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(raised).toBeInstanceOf(Anthropic.APIError);
    expect(deltas).toBe(200);
    await expect(stream.finalMessage()).rejects.toBeInstanceOf(Anthropic.APIError);
    expect(await until(() => s.mock.stats().aborted === 1, 5_000)).toBe(true);
    expect(s.mock.stats().total).toBe(1);
    expect((await requestLine(s, 'messages')).streamEnd).toBe('stalled');
  }, 20_000);

  it('a reader that stops and leaves mid-stream: the mock sees its one request aborted, logged client_gone', async () => {
    const s = await gatewayToMock({ stream: { chunks: 400, chunkDelayMs: 10 } });
    const stream = claude(s).messages.stream({ model: 'claude-sonnet-4-6', max_tokens: 1_000, messages: [{ role: 'user', content: 'hi' }] });
    let deltas = 0;
    await (async () => {
      for await (const e of stream) {
        if (e.type === 'content_block_delta' && ++deltas === 10) {
          await sleep(300);
          stream.abort();
        }
      }
    })().catch(() => undefined);
    expect(deltas).toBeGreaterThanOrEqual(10);
    expect(deltas).toBeLessThan(400);
    expect(await until(() => s.mock.stats().aborted === 1, 5_000)).toBe(true);
    await sleep(300);
    expect(s.mock.stats().total).toBe(1);
    expect(s.mock.requests()[0]!.chunksSent).toBeLessThan(400);
    const line = await requestLine(s, 'messages');
    expect(line.outcome).toBe('client_gone');
    expect(line.clientGone).toBe(true);
  });
});
