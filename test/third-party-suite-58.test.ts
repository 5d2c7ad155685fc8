// Third-party failure-scenario suite 58: an outside QA team's gateway suite pointed at stormgate, on what the earlier
// suites covered least: the legacy completions API (`/v1/completions`) streamed and not, through retries, failover,
// cuts and the SDK's own timeout; what `withResponse()` and an error's headers tell a user after a retry, a failover and
// each kind of error; a 200 that is no answer on embeddings (an HTML page, a body cut short under its own
// content-length, `data: null`); 429 wait hints of 0 and hints that differ between a primary and its backup; the
// Anthropic SDK's `messages.stream()` and `countTokens()` through a primary that fails before its first output;
// `n: 2` parallel tool calls and logprobs streamed through a failed first attempt; a structured-output stream helper;
// and the retry budget of two gateways on one real redis-server under a whole brownout.
// Driven with the official `openai` 6.x and `@anthropic-ai/sdk` SDKs over real HTTP on 127.0.0.1 against the bundled
// mock provider, and node:http upstreams of the test's own where the mock cannot misbehave as needed.
// Bounds are generous: a loaded 2-core machine.
// Found here: no gateway bug; everything behaves as the README says. Two first drafts expected what the README
// documents otherwise, and now assert the documented behaviour: the openai 6.x SDK sends no x-stainless-timeout for
// its client-wide `timeout` (only per request; the README's recipe adds x-stormgate-timeout-ms), and a stream at its
// client's deadline starts then (its headers at the deadline) rather than answering 504.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import type { ChatCompletionChunk } from 'openai/resources/chat/completions';
import type { Completion } from 'openai/resources/completions';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import type { MockServer } from '../src/mock/server.ts';
import { toolCalls } from './helpers/chat-stream.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { sdkError } from './helpers/openai-error.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { scripted, type Seen } from './helpers/scripted-provider.ts';
import { configServedBy, countingClient, defaultConfig, RETRY_LOOP_ONLY, TEST_KEY, useExtraMocks, useGateways, useStacks } from './helpers/stack.ts';

const startStack = useStacks();
const startGateway = useGateways();
const startMock = useExtraMocks();
const startUpstream = useFakeProviders();
const redis = useRedisServer();

const MOCK_TEXT = 'Mock answer to: hi';
const FAST_RETRY = { maxAttempts: 3, backoff: { strategy: 'fixed' as const, baseMs: 5, capMs: 5 } };
const LOOP = { route: { ...RETRY_LOOP_ONLY.route, retry: FAST_RETRY }, provider: RETRY_LOOP_ONLY.provider };
type RouteInput = ConfigInput['routes'][number];

/** The mock's log lines of one path. */
const seenOn = (mock: MockServer, path: string) => mock.requests().filter((r) => r.path === path);

/** A gateway over a primary and a backup (each an OpenAI-compatible base URL with /v1), every route primary first. */
async function twoTargets(primaryV1: string, backupV1: string, route: Partial<RouteInput> = {}, providerExtra: Record<string, unknown> = {}) {
  const base = defaultConfig('http://unused', RETRY_LOOP_ONLY);
  const config = ConfigSchema.parse({
    ...base,
    providers: {
      primary: { family: 'openai', baseUrl: primaryV1, apiKey: TEST_KEY, breaker: false, ...providerExtra },
      backup: { family: 'openai', baseUrl: backupV1, apiKey: TEST_KEY, breaker: false },
    },
    routes: base.routes.map((r) => ({ ...r, retry: FAST_RETRY, ...route, targets: [{ provider: 'primary' }, { provider: 'backup' }] })),
  });
  const url = await startGateway(config);
  return { url, client: (opts: ConstructorParameters<typeof OpenAI>[0] = {}) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sk-client', maxRetries: 0, ...opts }) };
}

/** Reads a legacy completion stream as a user's loop does: its text, its chunks, and the error it raised, if any. */
async function readCompletion(stream: AsyncIterable<Completion>) {
  const chunks: Completion[] = [];
  let text = '';
  try {
    for await (const c of stream) {
      chunks.push(c);
      text += c.choices[0]?.text ?? '';
    }
  } catch (err) {
    return { text, chunks, err: err as Error & { code?: string; status?: number } };
  }
  return { text, chunks, err: undefined };
}

describe('legacy completions (/v1/completions) through failures, as the openai SDK reads them', () => {
  it('a streamed completion through a first-attempt 503: the whole text, one SDK request, two upstream, the retry marked x-retry-attempt 1', async () => {
    const s = await startStack({ ...LOOP, faults: { errors: [{ status: 503, firstAttemptsOnly: true }] } });
    const { client, counter } = countingClient(s, { maxRetries: 2 });
    const { data: stream, response } = await client.completions.create({ model: 'gpt-4o', prompt: 'hi', stream: true }).withResponse();
    const { text, chunks, err } = await readCompletion(stream);
    expect(err).toBeUndefined();
    expect(text).toBe(MOCK_TEXT);
    expect(chunks.at(-1)?.choices[0]?.finish_reason).toBe('stop');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(counter.requests).toBe(1);
    const seen = seenOn(s.mock, '/v1/completions');
    expect(seen.map((r) => r.status)).toEqual([503, 200]);
    expect(seen[1]!.headers['x-retry-attempt']).toBe('1');
  });

  it('a streamed completion cut after two chunks: the SDK raises stream_interrupted after a prefix, and nothing is sent again', async () => {
    const s = await startStack({ ...LOOP, faults: { stream: { cutAfterChunks: 2 } } });
    const { client, counter } = countingClient(s, { maxRetries: 2 });
    const stream = await client.completions.create({ model: 'gpt-4o', prompt: 'hi', stream: true });
    const { text, err } = await readCompletion(stream);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err?.code).toBe('stream_interrupted');
    expect(text.length).toBeGreaterThan(0);
    expect(MOCK_TEXT.startsWith(text) && text !== MOCK_TEXT).toBe(true);
    await sleep(200);
    expect(counter.requests).toBe(1);
    expect(seenOn(s.mock, '/v1/completions')).toHaveLength(1);
  });

  it('a streamed completion with include_usage whose primary misses firstTokenMs: the backup answers, exactly one usage chunk, last, with choices []', async () => {
    const slow = await startMock({ faults: { stream: { firstTokenDelayMs: 5_000 } } });
    const backup = await startMock();
    const gw = await twoTargets(`${slow.url}/v1`, `${backup.url}/v1`, {}, { timeouts: { firstTokenMs: 300 } });
    const { data: stream, response } = await gw
      .client()
      .completions.create({ model: 'gpt-4o', prompt: 'hi', stream: true, stream_options: { include_usage: true } })
      .withResponse();
    const { text, chunks, err } = await readCompletion(stream);
    expect(err).toBeUndefined();
    expect(text).toBe(MOCK_TEXT);
    const withUsage = chunks.filter((c) => c.usage);
    expect(withUsage).toHaveLength(1);
    expect(chunks.at(-1)).toBe(withUsage[0]);
    expect(withUsage[0]!.choices).toEqual([]);
    expect(withUsage[0]!.usage!.completion_tokens).toBeGreaterThan(0);
    expect(response.headers.get('x-stormgate-fallback')).toBe('timeout');
    expect(response.headers.get('x-stormgate-target')).toBe('backup/gpt-4o');
    await sleep(200);
    expect(seenOn(slow, '/v1/completions')).toHaveLength(1);
    expect(seenOn(slow, '/v1/completions')[0]!.aborted).toBe(true);
  });

  it('a streamed completion that finishes but never sends [DONE]: the client gets the whole text and a [DONE], within seconds', async () => {
    const s = await startStack({ ...LOOP, faults: { stream: { omitDone: true } } });
    const t0 = Date.now();
    const res = await fetch(`${s.baseURL}/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: 'Bearer x' },
      body: JSON.stringify({ model: 'gpt-4o', prompt: 'hi', stream: true }),
    });
    const body = await res.text();
    expect(res.status).toBe(200);
    expect(Date.now() - t0).toBeLessThan(10_000);
    expect(body.trimEnd().endsWith('data: [DONE]')).toBe(true);
    expect(body).not.toContain('stream_interrupted');
    const text = body
      .split('\n')
      .filter((l) => l.startsWith('data: {'))
      .map((l) => (JSON.parse(l.slice(6)) as Completion).choices[0]?.text ?? '')
      .join('');
    expect(text).toBe(MOCK_TEXT);
  });

  it('a completion cut at max_tokens (finish_reason length) is an answer: passed on once, not retried, streamed and not', async () => {
    const s = await startStack(LOOP);
    const { client } = countingClient(s, { maxRetries: 0 });
    const whole = await client.completions.create({ model: 'gpt-4o', prompt: 'hi', max_tokens: 2 }).withResponse();
    expect(whole.data.choices[0]!.finish_reason).toBe('length');
    expect(whole.data.choices[0]!.text).toBe(MOCK_TEXT.slice(0, 8));
    expect(whole.response.headers.get('x-stormgate-attempts')).toBe('1');
    const { text, chunks, err } = await readCompletion(await client.completions.create({ model: 'gpt-4o', prompt: 'hi', max_tokens: 2, stream: true }));
    expect(err).toBeUndefined();
    expect(text).toBe(MOCK_TEXT.slice(0, 8));
    expect(chunks.at(-1)!.choices[0]!.finish_reason).toBe('length');
    expect(seenOn(s.mock, '/v1/completions')).toHaveLength(2);
  });

  it('echo, logprobs, suffix and best_of through a 503: identical bytes on both attempts, and the legacy logprobs object back whole', async () => {
    const seen: Seen[] = [];
    const answer = {
      id: 'cmpl-1',
      object: 'text_completion',
      created: 1,
      model: 'gpt-3.5-turbo-instruct',
      choices: [
        {
          text: 'hi there',
          index: 0,
          finish_reason: 'stop',
          logprobs: { tokens: ['hi', ' there'], token_logprobs: [null, -0.5], top_logprobs: [null, { ' there': -0.5, ' you': -1.2 }], text_offset: [0, 2] },
        },
      ],
      usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
    };
    const up = await startUpstream(
      scripted(
        (_b, n) =>
          n === 1
            ? { status: 503, headers: { 'content-type': 'application/json' }, steps: ['{"error":{"message":"busy","type":"server_error","param":null,"code":null}}'] }
            : { headers: { 'content-type': 'application/json' }, steps: [JSON.stringify(answer)] },
        seen,
      ),
    );
    const s = await startStack({ config: (m) => ({ ...configServedBy(m, 'instruct', `${up.origin}/v1`), routes: configServedBy(m, 'instruct', `${up.origin}/v1`).routes.map((r) => ({ ...r, retry: FAST_RETRY })) }) });
    const { client } = countingClient(s, { maxRetries: 0 });
    const got = await client.completions.create({ model: 'gpt-3.5-turbo-instruct', prompt: 'hi', echo: true, logprobs: 2, suffix: '!', best_of: 2, n: 1 });
    expect(got.choices[0]!.logprobs).toEqual(answer.choices[0]!.logprobs);
    expect(seen).toHaveLength(2);
    expect(seen[1]!.raw).toBe(seen[0]!.raw);
    expect(seen[0]!.body).toMatchObject({ echo: true, logprobs: 2, suffix: '!', best_of: 2 });
  });

  it('a client that aborts while its streamed completion waits out a 429 retry-after-ms: the wait is cancelled and no retry goes upstream', async () => {
    const s = await startStack({ ...LOOP, faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after-ms': '2000' } }] } });
    const { client } = countingClient(s, { maxRetries: 0 });
    const ac = new AbortController();
    const p = client.completions.create({ model: 'gpt-4o', prompt: 'hi', stream: true }, { signal: ac.signal });
    await sleep(400);
    expect(seenOn(s.mock, '/v1/completions')).toHaveLength(1);
    ac.abort();
    await expect(p).rejects.toBeInstanceOf(OpenAI.APIUserAbortError);
    await sleep(2_500);
    expect(seenOn(s.mock, '/v1/completions')).toHaveLength(1);
  });
});

describe('the SDK\'s maxRetries and timeout on top of the gateway\'s retries: never multiplied', () => {
  it('embeddings at maxRetries 5 against a lasting 503: one SDK request (x-should-retry false), the provider exactly maxAttempts', async () => {
    const s = await startStack({ ...LOOP, faults: { errors: [{ status: 503 }] } });
    const { client, counter } = countingClient(s, { maxRetries: 5 });
    const err = await sdkError(client.embeddings.create({ model: 'text-embedding-3-small', input: ['a', 'b'] }));
    expect(err.status).toBe(503);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(counter.requests).toBe(1);
    expect(seenOn(s.mock, '/v1/embeddings')).toHaveLength(3);
  });

  it('embeddings with a per-request SDK timeout of 2 s against a hung provider: a 504 before it, no SDK retry, the upstream request ended', async () => {
    const s = await startStack({ ...LOOP, faults: { hangRate: 1 } });
    const { client, counter } = countingClient(s, { maxRetries: 2 });
    const t0 = Date.now();
    const err = await sdkError(client.embeddings.create({ model: 'text-embedding-3-small', input: 'a' }, { timeout: 2_000 }));
    expect(err).not.toBeInstanceOf(OpenAI.APIConnectionTimeoutError);
    expect(err.status).toBe(504);
    expect(err.code).toBe('deadline_exceeded');
    expect(Date.now() - t0).toBeLessThan(2_000);
    expect(counter.requests).toBe(1);
    await sleep(300);
    const seen = seenOn(s.mock, '/v1/embeddings');
    expect(seen).toHaveLength(1);
    expect(seen[0]!.aborted).toBe(true);
  });

  it('a per-request timeout of 2 s on a streamed completion whose first token takes 2.5 s: the stream starts at the deadline, the SDK gets all of it, once', async () => {
    const s = await startStack({ ...LOOP, provider: { ...LOOP.provider, timeouts: { firstTokenMs: 8_000 } }, faults: { stream: { firstTokenDelayMs: 2_500 } } });
    const { client, counter } = countingClient(s, { maxRetries: 2 });
    const t0 = Date.now();
    const { data: stream, response } = await client.completions.create({ model: 'gpt-4o', prompt: 'hi', stream: true }, { timeout: 2_000 }).withResponse();
    expect(Date.now() - t0).toBeLessThan(2_000);
    expect(response.status).toBe(200);
    const { text, err } = await readCompletion(stream);
    expect(err).toBeUndefined();
    expect(text).toBe(MOCK_TEXT);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(2_400);
    expect(counter.requests).toBe(1);
    expect(seenOn(s.mock, '/v1/completions')).toHaveLength(1);
  });

  it('the same stream whose first token never comes in firstTokenMs: started at the deadline, then raised as stream_interrupted, nothing sent again', async () => {
    const s = await startStack({ ...LOOP, provider: { ...LOOP.provider, timeouts: { firstTokenMs: 3_000 } }, faults: { stream: { firstTokenDelayMs: 20_000 } } });
    const { client, counter } = countingClient(s, { maxRetries: 2 });
    const stream = await client.completions.create({ model: 'gpt-4o', prompt: 'hi', stream: true }, { timeout: 2_000 });
    const { text, err } = await readCompletion(stream);
    expect(text).toBe('');
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err?.code).toBe('stream_interrupted');
    expect(counter.requests).toBe(1);
    await sleep(200);
    expect(seenOn(s.mock, '/v1/completions')).toHaveLength(1);
    expect(seenOn(s.mock, '/v1/completions')[0]!.aborted).toBe(true);
  });
});

describe('withResponse() and an error\'s headers: what a user can read about each answer', () => {
  it('a success after a retry: request_id is the answering attempt\'s provider id, attempts 2, the route and target named', async () => {
    const s = await startStack({ ...LOOP, faults: { errors: [{ status: 500, firstAttemptsOnly: true }] } });
    const { client } = countingClient(s, { maxRetries: 0 });
    const { data, response, request_id } = await client.completions.create({ model: 'gpt-4o', prompt: 'hi' }).withResponse();
    expect(data.choices[0]!.text).toBe(MOCK_TEXT);
    const seen = seenOn(s.mock, '/v1/completions');
    expect(seen).toHaveLength(2);
    expect(request_id).toBe(seen[1]!.requestId);
    expect(request_id).not.toBe(seen[0]!.requestId);
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(response.headers.get('x-stormgate-route')).toBe('completions');
    expect(response.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
    expect(response.headers.get('x-stormgate-fallback')).toBeNull();
    expect(response.headers.get('x-stormgate-request-id')).toBeTruthy();
  });

  it('upstream errors passed on: a 400 (sent once) and an exhausted 503 keep the provider\'s request id, x-should-retry false', async () => {
    const s = await startStack({ ...LOOP, faults: { models: { bad: { errors: [{ status: 400, code: 'invalid_value', param: 'prompt' }] }, down: { errors: [{ status: 503 }] } } } });
    const { client } = countingClient(s, { maxRetries: 2 });
    const bad = await sdkError(client.completions.create({ model: 'bad', prompt: 'hi' }));
    expect(bad).toBeInstanceOf(OpenAI.BadRequestError);
    expect(bad.code).toBe('invalid_value');
    expect(bad.param).toBe('prompt');
    expect(bad.headers?.get('x-should-retry')).toBe('false');
    expect(bad.headers?.get('x-stormgate-attempts')).toBe('1');
    let seen = seenOn(s.mock, '/v1/completions');
    expect(seen).toHaveLength(1);
    expect(bad.requestID).toBe(seen[0]!.requestId);
    const down = await sdkError(client.completions.create({ model: 'down', prompt: 'hi' }));
    expect(down.status).toBe(503);
    expect(down.headers?.get('x-should-retry')).toBe('false');
    expect(down.headers?.get('x-stormgate-attempts')).toBe('3');
    seen = seenOn(s.mock, '/v1/completions');
    expect(seen).toHaveLength(4);
    expect(down.requestID).toBe(seen[3]!.requestId);
  });

  it('an error the gateway made itself (a deadline from x-stormgate-timeout-ms): err.requestID is the gateway\'s id, x-should-retry false', async () => {
    const s = await startStack({ ...LOOP, faults: { hangRate: 1 } });
    const { client } = countingClient(s, { maxRetries: 0 });
    const late = await sdkError(client.completions.create({ model: 'gpt-4o', prompt: 'hi' }, { headers: { 'x-stormgate-timeout-ms': '600' } }));
    expect(late.status).toBe(504);
    expect(late.headers?.get('x-should-retry')).toBe('false');
    expect(late.requestID).toBeTruthy();
    expect(late.requestID).toBe(late.headers?.get('x-stormgate-request-id'));
  });

  it('a hold-off\'s 429: x-should-retry true with retry-after-ms and retry-after that agree, and the SDK that waits it out is answered', async () => {
    const s = await startStack({
      ...LOOP,
      route: { ...LOOP.route, retry: { ...FAST_RETRY, maxWaitHintMs: 500 } },
      faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '2' } }] },
    });
    const { client: first } = countingClient(s, { maxRetries: 0 });
    const told = await sdkError(first.completions.create({ model: 'gpt-4o', prompt: 'hi' }));
    expect(told.status).toBe(429);
    expect(told.headers?.get('x-should-retry')).toBe('true');
    const ms = Number(told.headers?.get('retry-after-ms'));
    const sec = Number(told.headers?.get('retry-after'));
    expect(ms).toBeGreaterThan(1_000);
    expect(ms).toBeLessThanOrEqual(3_500);
    expect(sec).toBe(Math.ceil(ms / 1_000));
    const { client, counter } = countingClient(s, { maxRetries: 2 });
    const got = await client.completions.create({ model: 'gpt-4o', prompt: 'hi' });
    expect(got.choices[0]!.text).toBe(MOCK_TEXT);
    expect(counter.requests).toBeGreaterThanOrEqual(1);
    expect(seenOn(s.mock, '/v1/completions')).toHaveLength(2);
  });
});

describe('embeddings: a 200 that is no answer, and 429 wait hints', () => {
  it('a primary answering 200 with an HTML page: retried, then the backup answers; the SDK decodes base64 vectors equal to the backup\'s floats', async () => {
    const page = await startUpstream((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/html' });
      res.end('<!doctype html><html><body>Please sign in to the Wi-Fi</body></html>');
    });
    const backup = await startMock();
    const gw = await twoTargets(`${page.origin}/v1`, `${backup.url}/v1`);
    const inputs = ['alpha', 'beta', 'gamma'];
    const { data, response } = await gw.client().embeddings.create({ model: 'text-embedding-3-small', input: inputs }).withResponse();
    expect(page.hits()).toBe(3);
    expect(response.headers.get('x-stormgate-target')).toBe('backup/text-embedding-3-small');
    expect(response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    const direct = (await (
      await fetch(`${backup.url}/v1/embeddings`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: 'Bearer k' },
        body: JSON.stringify({ model: 'text-embedding-3-small', input: inputs, encoding_format: 'float' }),
      })
    ).json()) as { data: { embedding: number[] }[] };
    expect(data.data.map((d) => d.index)).toEqual([0, 1, 2]);
    expect(data.data.map((d) => d.embedding)).toEqual(direct.data.map((d) => d.embedding));
  });

  it('a 200 whose JSON a proxy cut short under its own content-length: retried on the same target, and the retry answers', async () => {
    let n = 0;
    const full = JSON.stringify({ object: 'list', data: [{ object: 'embedding', index: 0, embedding: [0.6, 0.8] }], model: 'e', usage: { prompt_tokens: 1, total_tokens: 1 } });
    const up = await startUpstream((req, res) => {
      req.resume();
      req.on('end', () => {
        const body = ++n === 1 ? full.slice(0, 60) : full;
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(body)) });
        res.end(body);
      });
    });
    const s = await startStack({ config: (m) => ({ ...configServedBy(m, 'up', `${up.origin}/v1`), routes: configServedBy(m, 'up', `${up.origin}/v1`).routes.map((r) => ({ ...r, retry: FAST_RETRY })) }) });
    const { client } = countingClient(s, { maxRetries: 0 });
    const { data, response } = await client.embeddings.create({ model: 'e', input: 'x', encoding_format: 'float' }).withResponse();
    expect(data.data[0]!.embedding).toEqual([0.6, 0.8]);
    expect(up.hits()).toBe(2);
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
  });

  it('a 200 with "data": null (an error some routers deliver with a 200) is a failed attempt: retried, and the SDK gets the vectors', async () => {
    let n = 0;
    const up = await startUpstream((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(
          ++n === 1
            ? JSON.stringify({ object: 'list', data: null, error: { message: 'upstream model crashed' } })
            : JSON.stringify({ object: 'list', data: [{ object: 'embedding', index: 0, embedding: [1, 0] }], model: 'e', usage: { prompt_tokens: 1, total_tokens: 1 } }),
        );
      });
    });
    const s = await startStack({ config: (m) => ({ ...configServedBy(m, 'up', `${up.origin}/v1`), routes: configServedBy(m, 'up', `${up.origin}/v1`).routes.map((r) => ({ ...r, retry: FAST_RETRY })) }) });
    const { client } = countingClient(s, { maxRetries: 0 });
    const got = await client.embeddings.create({ model: 'e', input: 'x', encoding_format: 'float' });
    expect(got.data[0]!.embedding).toEqual([1, 0]);
    expect(up.hits()).toBe(2);
  });

  it('a 429 with retry-after: 0 on a retrying route: retried at once and answered, with no hold-off for the next request', async () => {
    const s = await startStack({ ...LOOP, faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '0' } }] } });
    const { client, counter } = countingClient(s, { maxRetries: 0 });
    const t0 = Date.now();
    const first = await client.embeddings.create({ model: 'text-embedding-3-small', input: 'a' }).withResponse();
    expect(Date.now() - t0).toBeLessThan(2_000);
    expect(first.response.headers.get('x-stormgate-attempts')).toBe('2');
    const next = await client.embeddings.create({ model: 'text-embedding-3-small', input: 'b' }).withResponse();
    expect(next.response.headers.get('x-stormgate-attempts')).toBe('1');
    expect(next.response.headers.get('x-stormgate-fallback')).toBeNull();
    expect(counter.requests).toBe(2);
    expect(seenOn(s.mock, '/v1/embeddings').map((r) => r.status)).toEqual([429, 200, 200]);
  });

  it('hints that differ by target: the primary\'s retry-after 30 holds it off and moves on, the backup\'s retry-after-ms 300 is waited out; the next call skips the primary', async () => {
    const primary = await startMock({ faults: { errors: [{ status: 429, headers: { 'retry-after': '30' } }] } });
    const backup = await startMock({ faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after-ms': '300' } }] } });
    const gw = await twoTargets(`${primary.url}/v1`, `${backup.url}/v1`);
    const t0 = Date.now();
    const first = await gw.client().embeddings.create({ model: 'text-embedding-3-small', input: 'a' }).withResponse();
    const took = Date.now() - t0;
    expect(took).toBeGreaterThanOrEqual(290);
    expect(took).toBeLessThan(5_000);
    expect(first.response.headers.get('x-stormgate-target')).toBe('backup/text-embedding-3-small');
    expect(seenOn(primary, '/v1/embeddings')).toHaveLength(1);
    expect(seenOn(backup, '/v1/embeddings').map((r) => r.status)).toEqual([429, 200]);
    const next = await gw.client().embeddings.create({ model: 'text-embedding-3-small', input: 'b' }).withResponse();
    expect(next.response.headers.get('x-stormgate-fallback')).toBe('held_off');
    expect(next.response.headers.get('x-stormgate-attempts')).toBe('1');
    expect(seenOn(primary, '/v1/embeddings')).toHaveLength(1);
  });
});

describe('chat streams through a failed first attempt: tool calls, n > 1, logprobs, structured outputs', () => {
  const tools = ['get_weather', 'get_time'].map((name) => ({
    type: 'function' as const,
    function: { name, parameters: { type: 'object', properties: { x: { type: 'integer' } } } },
  }));

  it('n: 2 with two parallel tool calls through a first-attempt 503: each choice has both calls whole, ids distinct, finish tool_calls', async () => {
    const s = await startStack({ ...LOOP, faults: { errors: [{ status: 503, firstAttemptsOnly: true }] } });
    const { client, counter } = countingClient(s, { maxRetries: 0 });
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], tools, n: 2, stream: true });
    const chunks: ChatCompletionChunk[] = [];
    for await (const c of stream) chunks.push(c);
    const ids = new Set<string>();
    for (const choice of [0, 1]) {
      const calls = toolCalls(chunks, choice);
      expect(Object.keys(calls)).toEqual(['0', '1']);
      expect([calls[0]!.name, calls[1]!.name]).toEqual(['get_weather', 'get_time']);
      for (const call of Object.values(calls)) {
        expect(JSON.parse(call.args)).toEqual({ x: 1 });
        expect(call.ids).toBe(1);
        ids.add(call.id!);
      }
      const finishes = chunks.flatMap((c) => c.choices.filter((x) => x.index === choice && x.finish_reason));
      expect(finishes.map((f) => f.finish_reason)).toEqual(['tool_calls']);
    }
    expect(ids.size).toBe(4);
    expect(counter.requests).toBe(1);
    expect(seenOn(s.mock, '/v1/chat/completions')).toHaveLength(2);
  });

  it('a stream with logprobs failed over after a first-token timeout: every content delta carries its logprobs, their tokens the text', async () => {
    const slow = await startMock({ faults: { stream: { firstTokenDelayMs: 5_000 } } });
    const backup = await startMock();
    const gw = await twoTargets(`${slow.url}/v1`, `${backup.url}/v1`, {}, { timeouts: { firstTokenMs: 300 } });
    const stream = await gw.client().chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], logprobs: true, top_logprobs: 2, stream: true });
    let text = '';
    let tokens = '';
    for await (const c of stream) {
      const ch = c.choices[0];
      if (!ch?.delta?.content) continue;
      text += ch.delta.content;
      expect(ch.logprobs?.content?.length).toBeGreaterThan(0);
      for (const lp of ch.logprobs!.content!) {
        tokens += lp.token;
        expect(lp.top_logprobs).toHaveLength(2);
      }
    }
    expect(text).toBe(MOCK_TEXT);
    expect(tokens).toBe(text);
    expect(seenOn(slow, '/v1/chat/completions')).toHaveLength(1);
  });

  it('chat.completions.stream() with a zod response_format through a first-attempt 500: finalChatCompletion() is parsed, one SDK request', async () => {
    const s = await startStack({ ...LOOP, faults: { errors: [{ status: 500, firstAttemptsOnly: true }] } });
    const { client, counter } = countingClient(s, { maxRetries: 2 });
    const Weather = z.object({ city: z.string(), celsius: z.number(), rainy: z.boolean() });
    const stream = client.chat.completions.stream({ model: 'gpt-4o', messages: [{ role: 'user', content: 'weather?' }], response_format: zodResponseFormat(Weather, 'weather') });
    const final = await stream.finalChatCompletion();
    expect(final.choices[0]!.message.parsed).toEqual({ city: 'mock', celsius: 1, rainy: true });
    expect(counter.requests).toBe(1);
    expect(seenOn(s.mock, '/v1/chat/completions').map((r) => r.status)).toEqual([500, 200]);
  });

});

describe('the Anthropic SDK through a primary that fails before its first output', () => {
  /** A gateway with /v1/messages and its count_tokens, each over two Anthropic accounts (two mocks). */
  async function anthropicPair(primary: MockServer, backup: MockServer, firstTokenMs?: number) {
    const route = (name: string, path: string) => ({ name, match: { path }, retry: FAST_RETRY, park: false as const, targets: [{ provider: 'first' }, { provider: 'second' }] });
    const config = ConfigSchema.parse({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: {
        first: { family: 'anthropic', baseUrl: primary.url, apiKey: 'sk-ant-first', breaker: false, ...(firstTokenMs ? { timeouts: { firstTokenMs } } : {}) },
        second: { family: 'anthropic', baseUrl: backup.url, apiKey: 'sk-ant-second', breaker: false },
      },
      routes: [route('messages', '/v1/messages'), route('count', '/v1/messages/count_tokens')],
    });
    const url = await startGateway(config);
    return new Anthropic({ baseURL: url, apiKey: 'sk-client', maxRetries: 2 });
  }

  it('messages.stream() whose first account misses firstTokenMs: the second streams the whole message, the text events are its text, the first asked once', async () => {
    const primary = await startMock({ faults: { stream: { firstTokenDelayMs: 5_000 } } });
    const backup = await startMock();
    const client = await anthropicPair(primary, backup, 300);
    const stream = client.messages.stream({ model: 'claude-sonnet-4-5', max_tokens: 256, messages: [{ role: 'user', content: 'hi' }] });
    let text = '';
    stream.on('text', (t) => (text += t));
    const final = await stream.finalMessage();
    const block = final.content[0];
    expect(block?.type).toBe('text');
    expect(text).toBe((block as { text: string }).text);
    expect(text).toBe(MOCK_TEXT);
    expect(final.stop_reason).toBe('end_turn');
    expect(seenOn(primary, '/v1/messages')).toHaveLength(1);
    expect(seenOn(backup, '/v1/messages')).toHaveLength(1);
    expect(seenOn(backup, '/v1/messages')[0]!.headers['x-api-key']).toBe('sk-ant-second');
  });

  it('messages.stream() whose first account browns out with 529: retried there, then the second answers; the SDK sends it once', async () => {
    const primary = await startMock();
    primary.brownout('529', 30_000);
    const backup = await startMock();
    const client = await anthropicPair(primary, backup);
    const final = await client.messages.stream({ model: 'claude-sonnet-4-5', max_tokens: 256, messages: [{ role: 'user', content: 'hi' }] }).finalMessage();
    expect((final.content[0] as { text: string }).text).toBe(MOCK_TEXT);
    expect(seenOn(primary, '/v1/messages')).toHaveLength(3);
    expect(seenOn(backup, '/v1/messages')).toHaveLength(1);
    expect(seenOn(backup, '/v1/messages')[0]!.headers['x-stainless-retry-count']).toBe('0');
  });

  it('messages.countTokens() through a first-attempt 503: retried, and the count comes back', async () => {
    const primary = await startMock({ faults: { errors: [{ status: 503, firstAttemptsOnly: true }] } });
    const backup = await startMock();
    const client = await anthropicPair(primary, backup);
    const got = await client.messages.countTokens({ model: 'claude-sonnet-4-5', messages: [{ role: 'user', content: 'hello there' }] });
    expect(got.input_tokens).toBeGreaterThan(0);
    expect(seenOn(primary, '/v1/messages/count_tokens').map((r) => r.status)).toEqual([503, 200]);
    expect(seenOn(backup, '/v1/messages/count_tokens')).toHaveLength(0);
  });
});

describe('two gateways on one real redis-server under a whole brownout', () => {
  it('the retry budget is the fleet\'s: 40 calls split over both instances get the floor\'s 5 retries in all, not 5 each', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 503 }] } });
    const base = defaultConfig(mock.url, { provider: { breaker: false } });
    const config = ConfigSchema.parse({
      ...base,
      state: { redis: redis().url, keyPrefix: `suite58-${process.pid}`, commandTimeoutMs: 1_000 },
      routes: base.routes.map((r) => ({ ...r, park: false, retry: FAST_RETRY, budget: { ratio: 0, windowS: 60, minRetriesPerSecond: 5 / 60 } })),
    });
    const urls = [await startGateway(config), await startGateway(config)];
    const clients = urls.map((u) => new OpenAI({ baseURL: `${u}/v1`, apiKey: 'sk-client', maxRetries: 2 }));
    for (let i = 0; i < 20; i++) {
      await Promise.all(
        clients.map((c, k) =>
          sdkError(c.embeddings.create({ model: 'text-embedding-3-small', input: `call ${i} on ${k}` })).then((e) => {
            expect(e.status).toBe(503);
            expect(e.headers?.get('x-should-retry')).toBe('false');
          }),
        ),
      );
    }
    const upstream = seenOn(mock, '/v1/embeddings').length;
    expect(upstream - 40).toBeGreaterThanOrEqual(4);
    expect(upstream - 40).toBeLessThanOrEqual(6);
  });
});

describe('legacy completion streams of n > 1 from a server of its own (vLLM-style framing)', () => {
  const chunk = (index: number, text: string, finish: string | null) =>
    `data: ${JSON.stringify({ id: 'cmpl-v', object: 'text_completion', created: 1, model: 'm', choices: [{ index, text, logprobs: null, finish_reason: finish }] })}\n\n`;

  async function servedBy(fn: Parameters<typeof scripted>[0]) {
    const up = await startUpstream(scripted(fn));
    const s = await startStack({ config: (m) => ({ ...configServedBy(m, 'vllm', `${up.origin}/v1`), routes: configServedBy(m, 'vllm', `${up.origin}/v1`).routes.map((r) => ({ ...r, retry: FAST_RETRY })) }) });
    return { up, client: countingClient(s, { maxRetries: 0 }).client };
  }

  it('n: 2 where choice 0 finished and choice 1 had begun when the server closed without [DONE]: a cut the SDK raises, not a whole answer', async () => {
    const { up, client } = await servedBy(() => ({ steps: [chunk(0, 'Hello', null), chunk(1, 'Hi', null), chunk(0, ' world', 'stop'), chunk(1, ' the', null)] }));
    const stream = await client.completions.create({ model: 'm', prompt: 'x', n: 2, stream: true });
    const { chunks, err } = await readCompletion(stream);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err?.code).toBe('stream_interrupted');
    expect(chunks.filter((c) => c.choices[0]?.finish_reason)).toHaveLength(1);
    expect(up.hits()).toBe(1);
  });

  it('n: 2 with both choices finished, then the server goes quiet without [DONE]: the client gets a [DONE] within seconds, the answer whole', async () => {
    const { client } = await servedBy(() => ({ steps: [chunk(0, 'Hello', null), chunk(1, 'Hi', null), chunk(0, ' world', 'stop'), chunk(1, ' there', 'stop')], hold: true }));
    const t0 = Date.now();
    const stream = await client.completions.create({ model: 'm', prompt: 'x', n: 2, stream: true });
    const { chunks, err } = await readCompletion(stream);
    expect(err).toBeUndefined();
    expect(Date.now() - t0).toBeLessThan(8_000);
    const byChoice = [0, 1].map((i) => chunks.flatMap((c) => c.choices.filter((x) => x.index === i).map((x) => x.text)).join(''));
    expect(byChoice).toEqual(['Hello world', 'Hi there']);
  });

  it('vLLM\'s finish_reason "abort" after output on a legacy completion stream, then [DONE]: the SDK raises stream_interrupted, never a clean end', async () => {
    const { up, client } = await servedBy(() => ({ steps: [chunk(0, 'Hello', null), chunk(0, ' wor', 'abort'), 'data: [DONE]\n\n'] }));
    const stream = await client.completions.create({ model: 'm', prompt: 'x', stream: true });
    const { text, err } = await readCompletion(stream);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err?.code).toBe('stream_interrupted');
    expect(text).toBe('Hello wor');
    expect(up.hits()).toBe(1);
  });
});
