// A ninth third-party failure-scenario suite, written from the README ("Retries", "Failover and API families": the
// embeddings bullet, "Priority pools", "Errors", the configuration reference) as a team running batch and RAG
// pipelines would test the gateway's non-chat traffic: /v1/embeddings above all, with /v1/completions and /v1/models
// where they meet it. What such a team fears: a vector from another model silently mixed into an index, a batch of
// 2,048 inputs sent again and again into a token limit it can never fit, a 3 MB answer cut on the wire and handed on as
// if whole, base64 vectors re-encoded on the way, an indexing job that left and whose requests run on (ghosts), and
// batch embeddings crowding out online chat. Every scenario drives a real gateway over HTTP with the official `openai`
// SDK (base64 by default, which it decodes; float on request; token arrays; dimensions) against the bundled mock
// provider or a scripted upstream, and counts what each upstream received. Bounds are generous: a loaded 2-core machine.
import type { IncomingMessage, RequestListener, ServerResponse } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import { ConfigSchema } from '../src/config/schema.ts';
import type { FaultSpec, MockServer } from '../src/mock/server.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { type APIError, expectOpenAIError, sdkError } from './helpers/openai-error.ts';
import { countingClient, metricSum, requestLine, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';

const startStack = useStacks();
const startMock = useExtraMocks();
const startFake = useFakeProviders();

type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];

const EMB = 'text-embedding-3-small';

/** Fast, deterministic retries, a budget that never refuses and no parking, unless a scenario asks otherwise. */
const FAST: Partial<RouteInput> = {
  retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } },
  budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 },
  park: false,
};

const route = (name: string, path: string, targets: RouteInput['targets'], more: Partial<RouteInput> = {}): RouteInput => ({
  name,
  match: { path },
  targets,
  ...FAST,
  ...more,
});

/** One upstream: a bundled mock (its fault spec) or a scripted one (a node:http handler). */
type Upstream = { mock: FaultSpec } | { handler: RequestListener };

interface Gw {
  s: Stack;
  m: Record<string, MockServer>;
  client: OpenAI;
  seen(name: string, path?: string): ReturnType<MockServer['requests']>;
}

/** A gateway in front of the named upstreams (OpenAI family, breaker off), with `routes`; `providers` overrides fields. */
async function gw(
  ups: Record<string, Upstream>,
  routes: RouteInput[],
  opts: { providers?: Record<string, Partial<ProviderInput>>; extra?: Partial<ConfigInput> } = {},
): Promise<Gw> {
  const m: Record<string, MockServer> = {};
  const providers: ConfigInput['providers'] = {};
  for (const [name, up] of Object.entries(ups)) {
    let origin: string;
    if ('mock' in up) {
      m[name] = await startMock({ faults: up.mock, quiet: true, apiKey: `${name}-key` });
      origin = m[name].url;
    } else {
      origin = (await startFake(up.handler)).origin;
    }
    providers[name] = {
      family: 'openai',
      baseUrl: `${origin}/v1`,
      apiKey: `${name}-key`,
      breaker: false,
      timeouts: { connectMs: 1_000, firstTokenMs: 5_000, idleMs: 5_000 },
      ...opts.providers?.[name],
    };
  }
  const s = await startStack({ config: () => ({ server: { host: '127.0.0.1', port: 0, logLevel: 'info' }, providers, routes, ...opts.extra }) });
  const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0 });
  return { s, m, client, seen: (name, path = '/v1/embeddings') => m[name]!.requests().filter((r) => r.path === path) };
}

/** OpenAI's 429 for one request larger than the whole tokens-per-minute limit, and the headers it comes with. */
const TOO_LARGE =
  'Request too large for text-embedding-3-small in organization org-abc on tokens per min (TPM): Limit 1000000, Requested 1350000. The input or output tokens must be reduced in order to run successfully. Visit https://platform.openai.com/account/rate-limits to learn more.';
const TOO_LARGE_HEADERS = {
  'x-ratelimit-limit-requests': '3000',
  'x-ratelimit-remaining-requests': '2999',
  'x-ratelimit-limit-tokens': '1000000',
  'x-ratelimit-remaining-tokens': '1000000',
  'x-ratelimit-reset-requests': '20ms',
  'x-ratelimit-reset-tokens': '0s',
};

/** A float32 little-endian vector as base64, as OpenAI sends it for encoding_format base64. */
const b64 = (v: number[]): string => Buffer.from(new Float32Array(v).buffer).toString('base64');

/** A whole embeddings answer for `n` inputs, each vector `dims` long and distinct by index. */
function embeddingsBody(n: number, opts: { dims?: number; base64?: boolean; model?: string } = {}): string {
  const dims = opts.dims ?? 8;
  const data = Array.from({ length: n }, (_, index) => {
    const v = Array.from({ length: dims }, (_, d) => Math.fround(((index + 1) * (d + 1)) / 1e4));
    return { object: 'embedding', index, embedding: opts.base64 ? b64(v) : v };
  });
  return JSON.stringify({ object: 'list', data, model: opts.model ?? EMB, usage: { prompt_tokens: n * 3, total_tokens: n * 3 } });
}

/** A scripted provider: reads each request's JSON body into `bodies`, then lets `answer` write the response. */
function scripted(answer: (res: ServerResponse, body: Record<string, unknown>, n: number, req: IncomingMessage) => void | Promise<void>, bodies: Array<Record<string, unknown>> = []): RequestListener {
  return (req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (d: Buffer) => chunks.push(d));
    req.on('end', () => {
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as Record<string, unknown>;
      bodies.push(body);
      void answer(res, body, bodies.length, req);
    });
  };
}

const jsonAnswer = (res: ServerResponse, status: number, text: string, headers: Record<string, string> = {}) => {
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(text)), ...headers });
  res.end(text);
};

// ---------------------------------------------------------------------------------------------------------------
describe('what the SDK sends and gets back: base64, float, dimensions, token arrays', () => {
  it("passes the provider's base64 vectors through byte for byte, and the SDK decodes them to the provider's own floats", async () => {
    const g = await gw({ a: { mock: {} } }, [route('emb', '/v1/embeddings', [{ provider: 'a' }])]);
    const input = ['the cat sat', 'on the mat', 'ünïcödé ✓'];
    const body = JSON.stringify({ model: EMB, input, encoding_format: 'base64' });
    const post = (url: string, key: string) =>
      fetch(`${url}/v1/embeddings`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` }, body }).then((r) => r.text());
    const viaGateway = JSON.parse(await post(g.s.url, 'sk-client')) as { data: Array<{ embedding: string }> };
    const direct = JSON.parse(await post(g.m.a!.url, 'a-key')) as { data: Array<{ embedding: string }> };
    expect(viaGateway.data.map((d) => d.embedding)).toEqual(direct.data.map((d) => d.embedding));
    expect(typeof viaGateway.data[0]!.embedding).toBe('string');
    // The SDK's default (base64, decoded) gives the same floats as asking for float.
    const decoded = await g.client.embeddings.create({ model: EMB, input });
    const floats = await g.client.embeddings.create({ model: EMB, input, encoding_format: 'float' });
    expect(decoded.data.map((d) => d.embedding)).toEqual(floats.data.map((d) => d.embedding));
    expect(decoded.data[0]!.embedding).toHaveLength(8);
  });

  it("hands the answer's bytes on unchanged, escapes and spacing included, so the base64 the SDK decodes is the provider's", async () => {
    // A provider that escapes '/' in its JSON strings (\/, as PHP and some Java encoders do) and pretty-prints.
    const v = [0.1, -0.25, 0.5, 1e-7, -3.4e38, 0, 0.333, -0.999];
    const raw = b64(v);
    const escaped = raw.replaceAll('/', '\\/');
    const text = `{\n  "object": "list",\n  "data": [ { "object": "embedding", "index": 0, "embedding": "${escaped}" } ],\n  "model": "${EMB}",\n  "usage": { "prompt_tokens": 4, "total_tokens": 4 }\n}`;
    const g = await gw({ a: { handler: scripted((res) => jsonAnswer(res, 200, text)) } }, [route('emb', '/v1/embeddings', [{ provider: 'a' }])]);
    const res = await fetch(`${g.s.url}/v1/embeddings`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: EMB, input: 'x', encoding_format: 'base64' }) });
    expect(res.status).toBe(200);
    expect(await res.text()).toBe(text);
    const sdk = await g.client.embeddings.create({ model: EMB, input: 'x' });
    expect(sdk.data[0]!.embedding).toEqual(v.map((x) => Math.fround(x)));
  });

  it('sends dimensions, encoding_format, user and token-array inputs upstream exactly as the SDK wrote them', async () => {
    const bodies: Array<Record<string, unknown>> = [];
    const g = await gw({ a: { handler: scripted((res, body) => jsonAnswer(res, 200, embeddingsBody(Array.isArray(body.input) && Array.isArray(body.input[0]) ? body.input.length : 1, { dims: 4 })), bodies) } }, [
      route('emb', '/v1/embeddings', [{ provider: 'a' }]),
    ]);
    await g.client.embeddings.create({ model: EMB, input: [[1, 2, 3], [40, 50]], dimensions: 4, user: 'indexer-7' });
    await g.client.embeddings.create({ model: EMB, input: [9906, 1917], encoding_format: 'float', dimensions: 4 });
    expect(bodies[0]).toEqual({ model: EMB, input: [[1, 2, 3], [40, 50]], dimensions: 4, user: 'indexer-7', encoding_format: 'base64' });
    expect(bodies[1]).toEqual({ model: EMB, input: [9906, 1917], encoding_format: 'float', dimensions: 4 });
  });

  it('decodes vectors of the dimensions asked for (256 floats each) for a batch of 64, in order', async () => {
    const g = await gw({ a: { handler: scripted((res, body) => jsonAnswer(res, 200, embeddingsBody((body.input as unknown[]).length, { dims: Number(body.dimensions), base64: body.encoding_format === 'base64' }))) } }, [
      route('emb', '/v1/embeddings', [{ provider: 'a' }]),
    ]);
    const res = await g.client.embeddings.create({ model: EMB, input: Array.from({ length: 64 }, (_, i) => `chunk ${i}`), dimensions: 256 });
    expect(res.data).toHaveLength(64);
    expect(res.data.every((d, i) => d.index === i && d.embedding.length === 256)).toBe(true);
    expect(res.data[5]!.embedding[9]).toBe(Math.fround((6 * 10) / 1e4));
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('token limits and huge batches', () => {
  it('waits for the token limit to reset when a 2,048-input batch is more than the tokens left, then is answered on the retry', async () => {
    const headers = {
      'x-ratelimit-limit-requests': '5000',
      'x-ratelimit-remaining-requests': '4999',
      'x-ratelimit-limit-tokens': '1000000',
      'x-ratelimit-remaining-tokens': '1200',
      'x-ratelimit-reset-requests': '12ms',
      'x-ratelimit-reset-tokens': '600ms',
    };
    const g = await gw(
      {
        a: {
          mock: {
            errors: [{ status: 429, code: 'rate_limit_exceeded', type: 'tokens', message: 'Rate limit reached for text-embedding-3-small on tokens per min (TPM): Limit 1000000, Used 998800, Requested 8192.', headers, times: 1 }],
          },
        },
      },
      [route('emb', '/v1/embeddings', [{ provider: 'a' }])],
    );
    const input = Array.from({ length: 2048 }, (_, i) => `passage ${i} of the handbook`);
    const t0 = Date.now();
    const res = await g.client.embeddings.create({ model: EMB, input });
    expect(Date.now() - t0).toBeGreaterThanOrEqual(590);
    expect(res.data).toHaveLength(2048);
    const sent = g.seen('a');
    expect(sent).toHaveLength(2);
    // Not the 5 ms backoff: the token limit's reset, which is when the batch first fits.
    expect(sent[1]!.receivedAt - sent[0]!.receivedAt).toBeGreaterThanOrEqual(590);
    expect(sent[1]!.headers['x-retry-reason']).toBe('status_429');
  });

  it("does not hold the provider off for every request on a token limit's reset: a small call right after the refused batch goes straight through", async () => {
    const headers = { 'x-ratelimit-remaining-requests': '4999', 'x-ratelimit-remaining-tokens': '1200', 'x-ratelimit-reset-tokens': '1s' };
    const g = await gw({ a: { mock: { errors: [{ status: 429, code: 'rate_limit_exceeded', headers, times: 1 }] } } }, [route('emb', '/v1/embeddings', [{ provider: 'a' }])]);
    const big = g.client.embeddings.create({ model: EMB, input: Array.from({ length: 500 }, (_, i) => `row ${i}`) });
    await sleep(150);
    const t0 = Date.now();
    const small = await g.client.embeddings.create({ model: EMB, input: 'one query' });
    expect(Date.now() - t0).toBeLessThan(500);
    expect(small.data).toHaveLength(1);
    expect((await big).data).toHaveLength(500);
  });

  it('fails a batch whose token-limit reset outlasts the wait it may take over to the same model at the backup', async () => {
    const headers = { 'x-ratelimit-remaining-requests': '10', 'x-ratelimit-remaining-tokens': '900', 'x-ratelimit-reset-tokens': '45s' };
    const g = await gw(
      { a: { mock: { errors: [{ status: 429, code: 'rate_limit_exceeded', headers }] } }, b: { mock: {} } },
      [route('emb', '/v1/embeddings', [{ provider: 'a', model: EMB }, { provider: 'b', model: EMB }], { retry: { maxAttempts: 3, maxWaitHintMs: 2_000 } })],
    );
    const t0 = Date.now();
    const res = await g.client.embeddings.create({ model: EMB, input: Array.from({ length: 300 }, (_, i) => `row ${i}`) }).withResponse();
    expect(Date.now() - t0).toBeLessThan(1_500);
    expect(res.data.data).toHaveLength(300);
    expect(res.data.model).toBe(EMB);
    expect(res.response.headers.get('x-stormgate-target')).toBe(`b/${EMB}`);
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('wait_hint');
    expect(g.seen('a')).toHaveLength(1);
  });

  it('answers a lone target\'s token-limit 429 whose reset is past the wait with that 429 and its wait, after one upstream request', async () => {
    const headers = { 'x-ratelimit-remaining-requests': '10', 'x-ratelimit-remaining-tokens': '900', 'x-ratelimit-reset-tokens': '30s' };
    const g = await gw({ a: { mock: { errors: [{ status: 429, code: 'rate_limit_exceeded', headers }] } } }, [
      route('emb', '/v1/embeddings', [{ provider: 'a' }], { retry: { maxAttempts: 3, maxWaitHintMs: 2_000 } }),
    ]);
    const { client, counter } = countingClient(g.s, { maxRetries: 0 });
    const err = await sdkError(client.embeddings.create({ model: EMB, input: Array.from({ length: 300 }, (_, i) => `row ${i}`) }));
    expect(err.status).toBe(429);
    expect(err.code).toBe('rate_limit_exceeded');
    const retryAfter = Number(err.headers?.get('retry-after'));
    expect(retryAfter).toBeGreaterThanOrEqual(29);
    expect(retryAfter).toBeLessThanOrEqual(37);
    expect(counter.requests).toBe(1);
    expect(g.seen('a')).toHaveLength(1);
  });

  it("sends a batch larger than the provider's whole token limit (OpenAI's 'Request too large') upstream once, and tells the SDK not to send it again", async () => {
    // OpenAI's answer to one request larger than the TPM limit itself: a 429 rate_limit_exceeded with every limit's
    // room intact and the token reset at 0s, which no wait ends ("The input or output tokens must be reduced").
    // No retry can fit it (before, it was sent maxAttempts times), and the client must not be invited to send it again.
    const g = await gw({ a: { mock: { errors: [{ status: 429, code: 'rate_limit_exceeded', type: 'tokens', message: TOO_LARGE, headers: { ...TOO_LARGE_HEADERS, 'retry-after': '20' } }] } } }, [
      route('emb', '/v1/embeddings', [{ provider: 'a' }], { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } }),
    ]);
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const err = await sdkError(client.embeddings.create({ model: EMB, input: Array.from({ length: 2048 }, (_, i) => `long passage ${i}`) }));
    expect(err.status).toBe(429);
    expect(err.code).toBe('rate_limit_exceeded');
    expect(err.message).toContain('Request too large');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.headers?.get('retry-after')).toBeNull();
    expect(counter.requests).toBe(1);
    expect(g.seen('a')).toHaveLength(1);
  });

  it("fails a 'Request too large' over to a target with a limit of its own, and holds the first target off for no one: the next small call goes to it at once", async () => {
    // The refusal comes with retry-after, as a rate limit's does: read as one, it held the target off for every
    // request (of every instance) that would have fitted.
    const answered: string[] = [];
    const a = scripted((res, body) => {
      const big = Array.isArray(body['input']) && body['input'].length > 100;
      answered.push(big ? 'refused' : 'served');
      if (big) jsonAnswer(res, 429, JSON.stringify({ error: { message: TOO_LARGE, type: 'tokens', param: null, code: 'rate_limit_exceeded' } }), { ...TOO_LARGE_HEADERS, 'retry-after': '20' });
      else jsonAnswer(res, 200, embeddingsBody(1));
    });
    const g = await gw({ a: { handler: a }, b: { mock: {} } }, [
      route('emb', '/v1/embeddings', [{ provider: 'a' }, { provider: 'b' }], { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } }),
    ]);
    const big = await g.client.embeddings.create({ model: EMB, input: Array.from({ length: 2048 }, (_, i) => `long passage ${i}`) }).withResponse();
    expect(big.response.headers.get('x-stormgate-target')).toContain('b');
    expect(big.data.data).toHaveLength(2048);
    const small = await g.client.embeddings.create({ model: EMB, input: 'one short passage' }).withResponse();
    expect(small.response.headers.get('x-stormgate-target')).toContain('a');
    expect(answered).toEqual(['refused', 'served']);
    expect(g.seen('b')).toHaveLength(1);
    // The refusal's own reason in the log, not a rate limit's.
    const line = await requestLine(g.s, 'emb');
    expect(JSON.stringify(line.attempts)).toContain('request_over_rate_limit');
  });

  it("leaves the client the primary's outage, not a fallback's 'Request too large', when the primary was down: that limit is the fallback's own", async () => {
    // The primary (a larger limit) is down; the fallback's TPM limit is smaller than the batch. Told the fallback's
    // 429 "The input or output tokens must be reduced" (x-should-retry: false), the job would cut a batch the primary
    // takes once it is back: a fallback's own limits are a note on the primary's failure (README "Failover").
    const g = await gw(
      {
        a: { mock: { errors: [{ status: 503, message: 'the primary is overloaded' }] } },
        b: { mock: { errors: [{ status: 429, code: 'rate_limit_exceeded', type: 'tokens', message: TOO_LARGE, headers: { ...TOO_LARGE_HEADERS, 'retry-after': '20' } }] } },
      },
      [route('emb', '/v1/embeddings', [{ provider: 'a' }, { provider: 'b' }])],
    );
    const err = await sdkError(g.client.embeddings.create({ model: EMB, input: Array.from({ length: 2048 }, (_, i) => `long passage ${i}`) }));
    expect(err.status).toBe(503);
    expect(err.message).toMatch(/the primary is overloaded/);
    expect(err.message).toMatch(/the fallback b\/.* rejected the request \(429: Request too large/);
    expect(g.seen('a')).toHaveLength(2);
    expect(g.seen('b')).toHaveLength(1);
  });

  it('holds a batch-class embeddings call for the reset when the last answer said the token quota is nearly spent, while online chat goes at once', async () => {
    let n = 0;
    const quota = (): Record<string, string> =>
      n++ === 0
        ? { 'x-ratelimit-limit-tokens': '1000000', 'x-ratelimit-remaining-tokens': '9000', 'x-ratelimit-reset-tokens': '1s', 'x-ratelimit-limit-requests': '5000', 'x-ratelimit-remaining-requests': '4000' }
        : {};
    const chat = JSON.stringify({ id: 'c', object: 'chat.completion', created: 1, model: 'gpt-4o', choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }], usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } });
    const arrived: Array<{ path: string; at: number }> = [];
    const g = await gw(
      { a: { handler: scripted((res, body, _n, req) => { arrived.push({ path: req.url ?? '', at: Date.now() }); jsonAnswer(res, 200, 'messages' in body ? chat : embeddingsBody(1), quota()); }) } },
      [route('emb', '/v1/embeddings', [{ provider: 'a' }], { priority: 'batch' }), route('chat', '/v1/chat/completions', [{ provider: 'a' }])],
    );
    await g.client.embeddings.create({ model: EMB, input: 'first batch' }); // its answer: 0.9% of the token quota left
    const t0 = Date.now();
    const batch = g.client.embeddings.create({ model: EMB, input: 'second batch' });
    await sleep(50);
    await g.client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    const chatMs = Date.now() - t0;
    await batch;
    const batchMs = Date.now() - t0;
    expect(chatMs).toBeLessThan(600);
    expect(batchMs).toBeGreaterThanOrEqual(850);
    expect(arrived.map((a) => a.path)).toEqual(['/v1/embeddings', '/v1/chat/completions', '/v1/embeddings']);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('requests the client must fix: 413 and 400, never retried', () => {
  it('answers a 2,048-input batch over bodyLimitBytes with 413 request_too_large in the OpenAI shape; nothing goes upstream, the SDK does not retry', async () => {
    const g = await gw({ a: { mock: {} } }, [route('emb', '/v1/embeddings', [{ provider: 'a' }])], { extra: { server: { host: '127.0.0.1', port: 0, logLevel: 'info', bodyLimitBytes: 256 * 1024 } } });
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const input = Array.from({ length: 2048 }, (_, i) => `paragraph ${i} `.repeat(20));
    const err = await sdkError(client.embeddings.create({ model: EMB, input }));
    expect(err.status).toBe(413);
    expectOpenAIError(err.error === undefined ? undefined : { error: err.error }, 'request_too_large');
    expect(err.message).toMatch(/bodyLimitBytes/);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(counter.requests).toBe(1);
    expect(g.seen('a')).toHaveLength(0);
    // The same job split to fit is served.
    const half = await client.embeddings.create({ model: EMB, input: input.slice(0, 256) });
    expect(half.data).toHaveLength(256);
  });

  it("passes OpenAI's 400 for more than 2,048 inputs on at once: one upstream request, no backup, no SDK retry", async () => {
    const g = await gw(
      {
        a: { mock: { errors: [{ status: 400, code: null as unknown as string, param: null, message: "'$.input' is invalid. Please check the API reference: https://platform.openai.com/docs/api-reference." }] } },
        b: { mock: {} },
      },
      [route('emb', '/v1/embeddings', [{ provider: 'a' }, { provider: 'b' }], { retry: { maxAttempts: 3, retryOn: [400, 429, 500, 503] } })],
    );
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const err = await sdkError(client.embeddings.create({ model: EMB, input: Array.from({ length: 2049 }, (_, i) => `row ${i}`) }));
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect(err.message).toContain("'$.input' is invalid");
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(counter.requests).toBe(1);
    expect(g.seen('a')).toHaveLength(1);
    expect(g.seen('b')).toHaveLength(0);
  });

  it("passes a too-long input's 400 (vLLM's words, no code) on at once, and sends it to no backup", async () => {
    const message = "This model's maximum context length is 8192 tokens. However, you requested 12000 tokens in the input.";
    const g = await gw({ a: { mock: { errors: [{ status: 400, code: 'BadRequestError', type: 'BadRequestError', message }] } }, b: { mock: {} } }, [
      route('emb', '/v1/embeddings', [{ provider: 'a' }, { provider: 'b' }]),
    ]);
    const err = await sdkError(g.client.embeddings.create({ model: EMB, input: 'a very long document' }));
    expect(err.status).toBe(400);
    expect(err.message).toContain('maximum context length');
    expect(g.seen('a')).toHaveLength(1);
    expect(g.seen('b')).toHaveLength(0);
  });

  it("gives the primary's outage, not the backup's 400, when the backup finds the input too long after the primary failed", async () => {
    const g = await gw(
      {
        a: { mock: { errors: [{ status: 503 }] } },
        b: { mock: { errors: [{ status: 400, code: 'context_length_exceeded', param: 'input', message: "This model's maximum context length is 512 tokens, however you requested 900 tokens." }] } },
      },
      [route('emb', '/v1/embeddings', [{ provider: 'a' }, { provider: 'b' }])],
    );
    const err = await sdkError(g.client.embeddings.create({ model: EMB, input: 'a passage the backup deployment finds too long' }));
    expect(err.status).toBe(503);
    expect(err.message).toMatch(/fallback b\/?.*rejected the request \(400/);
    expect(g.seen('a')).toHaveLength(2);
    expect(g.seen('b')).toHaveLength(1);
  });

  it('refuses a body that is not JSON, or has no model, with a 400 in the OpenAI shape and sends nothing upstream', async () => {
    const g = await gw({ a: { mock: {} } }, [route('emb', '/v1/embeddings', [{ provider: 'a' }])]);
    const post = (body: string) => fetch(`${g.s.url}/v1/embeddings`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
    const broken = await post('{"model": "text-embedding-3-small", "input": ["a", "b"');
    expect(broken.status).toBe(400);
    expectOpenAIError(await broken.json(), 'invalid_json');
    const noModel = await post(JSON.stringify({ input: ['a'] }));
    expect(noModel.status).toBe(400);
    expect(expectOpenAIError(await noModel.json(), 'invalid_body').param).toBe('model');
    expect(g.seen('a')).toHaveLength(0);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('failover: the same model at another provider, never another model', () => {
  it('retries 500s on the primary, then serves the same model from the backup, and the answer says where it came from', async () => {
    const bodies: Array<Record<string, unknown>> = [];
    const g = await gw(
      {
        a: { mock: { errors: [{ status: 500 }] } },
        b: { handler: scripted((res, body) => jsonAnswer(res, 200, embeddingsBody((body.input as unknown[]).length, { base64: true, model: String(body.model) })), bodies) },
      },
      [route('emb', '/v1/embeddings', [{ provider: 'a', model: EMB }, { provider: 'b', model: EMB }], { match: { path: '/v1/embeddings', models: ['rag-embedder'] } })],
    );
    const res = await g.client.embeddings.create({ model: 'rag-embedder', input: ['q1', 'q2', 'q3'] }).withResponse();
    expect(res.data.data).toHaveLength(3);
    expect(res.data.model).toBe(EMB);
    expect(res.response.headers.get('x-stormgate-target')).toBe(`b/${EMB}`);
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(res.response.headers.get('x-stormgate-attempts')).toBe('3');
    expect(g.seen('a').map((r) => r.model)).toEqual([EMB, EMB]);
    expect(bodies.map((b) => b.model)).toEqual([EMB]);
    // The vectors the SDK decoded are the backup's, whole.
    expect(res.data.data[2]!.embedding[0]).toBe(Math.fround(3 / 1e4));
  });

  it('fails a 503 over to the backup at once when the primary names the client\'s model and the backup is asked the same name', async () => {
    const g = await gw({ a: { mock: { errors: [{ status: 503 }] } }, b: { mock: {} } }, [
      route('emb', '/v1/embeddings', [{ provider: 'a' }, { provider: 'b' }], { retry: { maxAttempts: 1 } }),
    ]);
    const res = await g.client.embeddings.create({ model: EMB, input: 'query' }).withResponse();
    expect(res.response.headers.get('x-stormgate-target')).toBe(`b/${EMB}`);
    expect(g.seen('b').map((r) => r.model)).toEqual([EMB]);
    // The backup's vector is the one the same model gives at the primary (the mock's are the model's, not the host's).
    g.m.a!.setFaults({});
    const primary = await g.client.embeddings.create({ model: EMB, input: 'query' });
    expect(primary.data[0]!.embedding).toEqual(res.data.data[0]!.embedding);
  });

  it('refuses at start-up a contextWindowFallback or weighted target of another embedding model', () => {
    const base = {
      providers: { a: { family: 'openai', baseUrl: 'http://127.0.0.1:1/v1', apiKey: 'k' }, b: { family: 'openai', baseUrl: 'http://127.0.0.1:2/v1', apiKey: 'k' } },
    } as const;
    const withCwf = ConfigSchema.safeParse({
      ...base,
      routes: [{ name: 'emb', match: { path: '/v1/embeddings' }, targets: [{ provider: 'a', model: EMB }], contextWindowFallback: { provider: 'b', model: 'text-embedding-3-large' } }],
    });
    expect(withCwf.success).toBe(false);
    expect(JSON.stringify(withCwf.error?.issues)).toMatch(/same model/);
    const weighted = ConfigSchema.safeParse({
      ...base,
      routes: [{ name: 'emb', match: { path: '/v1/embeddings' }, strategy: 'weighted', targets: [{ provider: 'a', model: EMB, weight: 3 }, { provider: 'b', model: 'text-embedding-ada-002', weight: 1 }] }],
    });
    expect(weighted.success).toBe(false);
    const anthropic = ConfigSchema.safeParse({
      providers: { ...base.providers, c: { family: 'anthropic', baseUrl: 'http://127.0.0.1:3', apiKey: 'k' } },
      routes: [{ name: 'emb', match: { path: '/v1/embeddings' }, targets: [{ provider: 'a' }, { provider: 'c' }] }],
    });
    expect(anthropic.success).toBe(false);
    expect(JSON.stringify(anthropic.error?.issues)).toMatch(/no embeddings API/);
  });

  it('answers every call of a steady indexing job from the backup once the primary\'s breaker opens, with the primary seeing only its probes', async () => {
    const g = await gw({ a: { mock: { errors: [{ status: 503 }] } }, b: { mock: {} } }, [route('emb', '/v1/embeddings', [{ provider: 'a' }, { provider: 'b' }])], {
      providers: { a: { breaker: { failureRate: 0.5, minRequests: 4, windowS: 10, openS: 30 } } },
    });
    for (let i = 0; i < 20; i++) {
      const res = await g.client.embeddings.create({ model: EMB, input: [`batch ${i} a`, `batch ${i} b`] });
      expect(res.data).toHaveLength(2);
    }
    expect(g.seen('b')).toHaveLength(20);
    expect(g.seen('a').length).toBeLessThanOrEqual(6);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('answers cut on the wire', () => {
  /** A 3 MB base64 embeddings answer (2,048 vectors of 1,536 floats would be ~25 MB; 512 of 1,536 is ~4 MB). */
  const BIG = embeddingsBody(512, { dims: 1536, base64: true });

  it('retries a 3 MB embeddings answer whose connection dies mid-body, and the SDK gets the whole batch', async () => {
    expect(BIG.length).toBeGreaterThan(3_000_000);
    const g = await gw(
      {
        a: {
          handler: scripted((res, _body, n) => {
            if (n > 1) return jsonAnswer(res, 200, BIG);
            res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(BIG.length) });
            res.write(BIG.slice(0, 1_500_000), () => res.socket?.destroy());
          }),
        },
      },
      [route('emb', '/v1/embeddings', [{ provider: 'a' }])],
    );
    const res = await g.client.embeddings.create({ model: EMB, input: Array.from({ length: 512 }, (_, i) => `p${i}`) }).withResponse();
    expect(res.data.data).toHaveLength(512);
    expect(res.data.data[511]!.embedding).toHaveLength(1536);
    expect(res.response.headers.get('x-stormgate-attempts')).toBe('2');
  });

  it("retries a 3 MB answer a proxy truncated under its own content-length (it ends cleanly, the JSON never closes)", async () => {
    const cut = BIG.slice(0, 2_000_000);
    const g = await gw({ a: { handler: scripted((res, _b, n) => jsonAnswer(res, 200, n === 1 ? cut : BIG)) } }, [route('emb', '/v1/embeddings', [{ provider: 'a' }])]);
    const res = await g.client.embeddings.create({ model: EMB, input: Array.from({ length: 512 }, (_, i) => `p${i}`) }).withResponse();
    expect(res.data.data).toHaveLength(512);
    expect(res.response.headers.get('x-stormgate-attempts')).toBe('2');
    const line = await requestLine(g.s, 'emb');
    expect(JSON.stringify(line.attempts)).toMatch(/bad_stream|bad-stream/);
  });

  it("retries an answer cut right after a '}' inside it (a truncation that happens to end in a brace)", async () => {
    const whole = embeddingsBody(40, { dims: 16 });
    const at = whole.indexOf('}', whole.length / 2) + 1; // after one embedding object: the text ends in '}'
    const g = await gw({ a: { handler: scripted((res, _b, n) => jsonAnswer(res, 200, n === 1 ? whole.slice(0, at) : whole)) } }, [route('emb', '/v1/embeddings', [{ provider: 'a' }])]);
    const res = await g.client.embeddings.create({ model: EMB, input: Array.from({ length: 40 }, (_, i) => `p${i}`), encoding_format: 'float' }).withResponse();
    expect(res.data.data).toHaveLength(40);
    expect(res.response.headers.get('x-stormgate-attempts')).toBe('2');
  });

  it('ends with 502 upstream_bad_response when every attempt is cut, and the SDK does not send it again', async () => {
    const g = await gw({ a: { handler: scripted((res) => jsonAnswer(res, 200, BIG.slice(0, 1_000_000))) } }, [route('emb', '/v1/embeddings', [{ provider: 'a' }])]);
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const err = await sdkError(client.embeddings.create({ model: EMB, input: ['x'] }));
    expect(err.status).toBe(502);
    expect(err.code).toBe('upstream_bad_response');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(counter.requests).toBe(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe("the client's timeout and the client leaving", () => {
  it("answers a slow embeddings call 504 before the SDK's per-request timeout (x-stainless-timeout), and aborts it upstream", async () => {
    const g = await gw({ a: { mock: { latencyMs: 10_000 } } }, [route('emb', '/v1/embeddings', [{ provider: 'a' }])]);
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const t0 = Date.now();
    const err = await sdkError(client.embeddings.create({ model: EMB, input: ['slow'] }, { timeout: 2_000 }));
    const took = Date.now() - t0;
    // An APIError with the gateway's status, not the SDK's own APIConnectionTimeoutError.
    expect(err).not.toBeInstanceOf(OpenAI.APIConnectionTimeoutError);
    expect(err.status).toBe(504);
    expect(err.code).toBe('deadline_exceeded');
    expect(took).toBeLessThan(2_000);
    expect(took).toBeGreaterThan(1_000);
    expect(counter.requests).toBe(1);
    await sleep(100);
    expect(g.seen('a')).toHaveLength(1);
    expect(g.seen('a')[0]!.aborted).toBe(true);
  });

  it("does not start a retry whose wait hint outlasts the client's timeout: the 503 and its wait at once", async () => {
    const g = await gw({ a: { mock: { errors: [{ status: 503, headers: { 'retry-after': '5' } }] } } }, [route('emb', '/v1/embeddings', [{ provider: 'a' }], { retry: { maxAttempts: 3 } })]);
    const t0 = Date.now();
    const err = await sdkError(g.client.embeddings.create({ model: EMB, input: 'x' }, { timeout: 3_000 }));
    expect(Date.now() - t0).toBeLessThan(1_000);
    expect(err.status).toBe(503);
    expect(Number(err.headers?.get('retry-after'))).toBeGreaterThanOrEqual(5);
    expect(g.seen('a')).toHaveLength(1);
  });

  it('aborts the upstream request when the indexing job aborts mid-request, and sends no retry (no ghost)', async () => {
    const g = await gw({ a: { mock: { latencyMs: 3_000 } } }, [route('emb', '/v1/embeddings', [{ provider: 'a' }])]);
    const ac = new AbortController();
    const p = g.client.embeddings.create({ model: EMB, input: Array.from({ length: 100 }, (_, i) => `r${i}`) }, { signal: ac.signal });
    await sleep(300);
    ac.abort();
    await expect(p).rejects.toBeInstanceOf(OpenAI.APIUserAbortError);
    await sleep(300);
    const sent = g.seen('a');
    expect(sent).toHaveLength(1);
    expect(sent[0]!.aborted).toBe(true);
    const line = await requestLine(g.s, 'emb');
    expect(line.status === 499 || /client/i.test(JSON.stringify(line))).toBe(true);
  });

  it('cancels the backoff when the client leaves during it: the retry is never sent', async () => {
    const g = await gw({ a: { mock: { errors: [{ status: 503, headers: { 'retry-after-ms': '1000' } }] } } }, [route('emb', '/v1/embeddings', [{ provider: 'a' }], { retry: { maxAttempts: 3 } })]);
    const ac = new AbortController();
    const p = g.client.embeddings.create({ model: EMB, input: 'x' }, { signal: ac.signal });
    await sleep(250);
    ac.abort();
    await expect(p).rejects.toBeInstanceOf(OpenAI.APIUserAbortError);
    await sleep(1_500);
    expect(g.seen('a')).toHaveLength(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('usage and metrics', () => {
  it("counts an embeddings batch's prompt tokens under the target that answered, and no completion tokens", async () => {
    const g = await gw({ a: { mock: { errors: [{ status: 503 }] } }, b: { mock: {} } }, [route('emb', '/v1/embeddings', [{ provider: 'a' }, { provider: 'b' }], { retry: { maxAttempts: 1 } })]);
    const res = await g.client.embeddings.create({ model: EMB, input: Array.from({ length: 2048 }, (_, i) => `doc ${i}`) });
    expect(res.usage.prompt_tokens).toBeGreaterThan(2048);
    expect(await metricSum(g.s, `stormgate_tokens_total{route="emb",target="b/${EMB}",kind="prompt"}`)).toBe(res.usage.prompt_tokens);
    expect(await metricSum(g.s, 'stormgate_tokens_total{route="emb",target="a')).toBe(0);
    expect(await metricSum(g.s, 'stormgate_tokens_total{route="emb",target="b/text-embedding-3-small",kind="completion"}')).toBe(0);
    expect(await metricSum(g.s, 'stormgate_fallback_requests_total{route="emb"}')).toBe(1);
  });

  it('counts the tokens of every call of a concurrent batch job exactly once, retries and all', async () => {
    const g = await gw({ a: { mock: { errors: [{ status: 502, rate: 0.5, firstAttemptsOnly: true }] } } }, [route('emb', '/v1/embeddings', [{ provider: 'a' }], { retry: { maxAttempts: 2 } })]);
    const results = await Promise.all(Array.from({ length: 16 }, (_, j) => g.client.embeddings.create({ model: EMB, input: Array.from({ length: 32 }, (_, i) => `job ${j} row ${i}`) })));
    const total = results.reduce((sum, r) => sum + r.usage.prompt_tokens, 0);
    expect(await metricSum(g.s, 'stormgate_tokens_total{route="emb"')).toBe(total);
    expect(await metricSum(g.s, 'stormgate_requests_total{route="emb"')).toBe(16);
    expect(g.seen('a').length).toBeGreaterThanOrEqual(24);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('batch embeddings beside online chat', () => {
  it('keeps online chat fast while a batch-class embeddings flood fills the pool, and sheds batch with 429 and a wait', async () => {
    const g = await gw(
      { a: { mock: { latencyMs: 150 } } },
      [
        route('emb', '/v1/embeddings', [{ provider: 'a' }], { priority: 'batch' }),
        route('chat', '/v1/chat/completions', [{ provider: 'a' }]),
      ],
      { providers: { a: { maxConnections: 4, pools: { maxConcurrent: 4, classes: { online: { minShare: 0.5, maxQueue: 100 }, batch: { minShare: 0.25, maxQueue: 8 } } } } } },
    );
    const batch = Array.from({ length: 40 }, (_, i) => g.client.embeddings.create({ model: EMB, input: [`b${i}`] }).then(() => 200, (e: APIError) => e));
    await sleep(100);
    const chatMs: number[] = [];
    for (let i = 0; i < 5; i++) {
      const t = Date.now();
      await g.client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
      chatMs.push(Date.now() - t);
    }
    const outcomes = await Promise.all(batch);
    const shed = outcomes.filter((o): o is APIError => o !== 200);
    expect(shed.length).toBeGreaterThan(0);
    for (const e of shed) {
      expect(e.status).toBe(429);
      expect(e.code).toBe('load_shed');
      expect(Number(e.headers?.get('retry-after-ms'))).toBeGreaterThan(0);
    }
    expect(outcomes.filter((o) => o === 200).length).toBeGreaterThanOrEqual(8);
    // Online waited at most for one batch answer in flight to end, never behind the batch queue.
    expect(Math.max(...chatMs)).toBeLessThan(1_000);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('completions and models beside embeddings', () => {
  it('lists the embeddings alias and retrieves it, and a chat model on the embeddings path is 404 model_not_found', async () => {
    const g = await gw({ a: { mock: {} } }, [
      route('emb', '/v1/embeddings', [{ provider: 'a', model: EMB }], { match: { path: '/v1/embeddings', models: ['rag-embedder'] } }),
      route('chat', '/v1/chat/completions', [{ provider: 'a' }], { match: { path: '/v1/chat/completions', models: ['gpt-4o'] } }),
    ]);
    const ids = [];
    for await (const m of g.client.models.list()) ids.push(m.id);
    expect(ids).toContain('rag-embedder');
    expect((await g.client.models.retrieve('rag-embedder')).id).toBe('rag-embedder');
    const err = await sdkError(g.client.embeddings.create({ model: 'gpt-4o', input: 'x' }));
    expect(err.status).toBe(404);
    expect(err.code).toBe('model_not_found');
    expect(g.seen('a')).toHaveLength(0);
  });

  it('retries a legacy completion with a token-array prompt after a 503 and fails it over to the same model, prompt intact', async () => {
    const bodies: Array<Record<string, unknown>> = [];
    const answer = JSON.stringify({ id: 'cmpl-1', object: 'text_completion', created: 1, model: 'gpt-3.5-turbo-instruct', choices: [{ index: 0, text: ' world', finish_reason: 'stop', logprobs: null }], usage: { prompt_tokens: 2, completion_tokens: 1, total_tokens: 3 } });
    const g = await gw({ a: { mock: { errors: [{ status: 503 }] } }, b: { handler: scripted((res) => jsonAnswer(res, 200, answer), bodies) } }, [
      route('cmpl', '/v1/completions', [{ provider: 'a' }, { provider: 'b' }]),
    ]);
    const res = await g.client.completions.create({ model: 'gpt-3.5-turbo-instruct', prompt: [[15496, 11]], max_tokens: 1 });
    expect(res.choices[0]!.text).toBe(' world');
    expect(bodies[0]!.prompt).toEqual([[15496, 11]]);
    expect(g.seen('a', '/v1/completions')).toHaveLength(2);
  });
});
