// A fifth third-party failure-scenario suite, written from the README as an outside team evaluating LLM gateways
// would, on the surfaces the earlier suites touched least: /v1/embeddings, /v1/completions and /v1/responses under
// faults; weighted targets with one failing (LiteLLM simple-shuffle with a deployment down, Portkey loadbalance);
// the model listing and unknown models; retry policies that differ per route and per target (Envoy retry_on and
// retriable_status_codes per route, LiteLLM RetryPolicy per error type); batch against online when the pool is full;
// a retry budget spent, as the client sees it; context-window errors that must fail fast rather than fail over; very
// large bodies; and many concurrent streams with one target cut mid-stream. Every scenario drives a real gateway over
// HTTP with the official `openai` SDK and counts what each bundled mock provider received.
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import type { FaultSpec, MockServer } from '../src/mock/server.ts';
import { countingClient, metricSum, requestLine, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';
import { expectOpenAIError, sdkError } from './helpers/openai-error.ts';
import { freePort } from './helpers/free-port.ts';

const startStack = useStacks();
const startMock = useExtraMocks();

type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];

const messages = [{ role: 'user' as const, content: 'Summarise the incident report.' }];

/** Fast, deterministic retries, a budget that never refuses and no parking, unless a scenario asks otherwise. */
const FAST: Partial<RouteInput> = {
  retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } },
  budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 },
  park: false,
};

interface Gw {
  s: Stack;
  m: Record<string, MockServer>;
  /** An SDK client with its own retries off (each test that wants them makes its own). */
  client: OpenAI;
  /** Requests mock `name` received on `path`. */
  seen(name: string, path?: string): Array<ReturnType<MockServer['requests']>[number]>;
}

/**
 * A gateway in front of one bundled mock per entry of `mocks` (provider name = mock name, OpenAI family, breaker off),
 * with the routes `routes` builds; `providers` overrides fields of a provider, `extra` adds top-level config.
 */
async function gw(
  mocks: Record<string, FaultSpec>,
  routes: RouteInput[],
  opts: { providers?: Record<string, Partial<ProviderInput>>; extra?: Partial<ConfigInput>; refused?: string[] } = {},
): Promise<Gw> {
  const m: Record<string, MockServer> = {};
  const providers: ConfigInput['providers'] = {};
  // Providers on a port nobody listens on: every connection refused.
  for (const name of opts.refused ?? []) {
    providers[name] = { family: 'openai', baseUrl: `http://127.0.0.1:${await freePort()}/v1`, apiKey: `${name}-key`, breaker: false };
  }
  for (const [name, faults] of Object.entries(mocks)) {
    m[name] = await startMock({ faults, quiet: true, apiKey: `${name}-key` });
    providers[name] = {
      family: 'openai',
      baseUrl: `${m[name].url}/v1`,
      apiKey: `${name}-key`,
      breaker: false,
      timeouts: { connectMs: 1_000, firstTokenMs: 3_000, idleMs: 3_000 },
      ...opts.providers?.[name],
    };
  }
  const s = await startStack({
    config: () => ({ server: { host: '127.0.0.1', port: 0, logLevel: 'info' }, providers, routes, ...opts.extra }),
  });
  const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0 });
  return { s, m, client, seen: (name, path) => m[name]!.requests().filter((r) => path === undefined || r.path === path) };
}

const route = (name: string, path: string, targets: RouteInput['targets'], more: Partial<RouteInput> = {}): RouteInput => ({
  name,
  match: { path },
  targets,
  ...FAST,
  ...more,
});

const CONTEXT_ERROR = {
  status: 400,
  code: 'context_length_exceeded',
  type: 'invalid_request_error',
  param: 'messages',
  message: "This model's maximum context length is 8192 tokens. However, your messages resulted in 9100 tokens.",
};

// ---------------------------------------------------------------------------------------------------------------
describe('embeddings under faults', () => {
  const EMB = 'text-embedding-3-small';

  it('retries a 503 on the same target, and the SDK decodes the base64 vectors it asked for, equal to the provider\'s own', async () => {
    const g = await gw({ a: { errors: [{ status: 503, times: 1 }] } }, [route('emb', '/v1/embeddings', [{ provider: 'a' }])]);
    const input = ['alpha', 'beta', 'gamma'];
    const res = await g.client.embeddings.create({ model: EMB, input });
    expect(res.data.map((d) => d.index)).toEqual([0, 1, 2]);
    const direct = await new OpenAI({ baseURL: `${g.m.a!.url}/v1`, apiKey: 'a-key', maxRetries: 0 }).embeddings.create({ model: EMB, input });
    expect(res.data.map((d) => d.embedding)).toEqual(direct.data.map((d) => d.embedding));
    expect(res.data[0]!.embedding.every((x) => typeof x === 'number' && Number.isFinite(x))).toBe(true);
    const sent = g.seen('a', '/v1/embeddings');
    expect(sent).toHaveLength(3); // 503, its retry, and the direct call
    expect(sent[1]!.headers['x-retry-attempt']).toBe('1');
    expect(sent[1]!.headers['x-retry-reason']).toBe('status_503');
  });

  it("waits out a 429's retry-after-ms on an embeddings call, not the backoff, before its one retry", async () => {
    const g = await gw({ a: { errors: [{ status: 429, headers: { 'retry-after-ms': '400' }, times: 1 }] } }, [
      route('emb', '/v1/embeddings', [{ provider: 'a' }]),
    ]);
    const t0 = Date.now();
    const res = await g.client.embeddings.create({ model: EMB, input: 'hello' });
    expect(Date.now() - t0).toBeGreaterThanOrEqual(390);
    expect(res.data).toHaveLength(1);
    const sent = g.seen('a', '/v1/embeddings');
    expect(sent).toHaveLength(2);
    expect(sent[1]!.receivedAt - sent[0]!.receivedAt).toBeGreaterThanOrEqual(390);
  });

  it('moves a hung embeddings call to the same model at the backup at responseMs, after one attempt, and aborts it upstream', async () => {
    const g = await gw(
      { a: { hangRate: 1 }, b: {} },
      [route('emb', '/v1/embeddings', [{ provider: 'a' }, { provider: 'b' }])],
      { providers: { a: { timeouts: { connectMs: 1_000, firstTokenMs: 3_000, idleMs: 3_000, responseMs: 300 } } } },
    );
    const t0 = Date.now();
    const res = await g.client.embeddings.create({ model: EMB, input: ['x', 'y'] }).withResponse();
    expect(Date.now() - t0).toBeLessThan(2_000);
    expect(res.data.data).toHaveLength(2);
    expect(res.response.headers.get('x-stormgate-target')).toBe(`b/${EMB}`);
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('timeout');
    expect(g.seen('a', '/v1/embeddings')).toHaveLength(1);
    await sleep(100);
    expect(g.seen('a', '/v1/embeddings')[0]!.aborted).toBe(true);
    expect(g.seen('b', '/v1/embeddings')).toHaveLength(1);
  });

  it("passes the provider's 400 for an input too long on at once: no retry, nothing to the backup, and the SDK does not retry", async () => {
    const g = await gw(
      { a: { errors: [{ status: 400, message: "This model's maximum context length is 8192 tokens, however you requested 9000 tokens", param: 'input' }] }, b: {} },
      [route('emb', '/v1/embeddings', [{ provider: 'a' }, { provider: 'b' }])],
    );
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const err = await sdkError(client.embeddings.create({ model: EMB, input: 'very long' }));
    expect(err.status).toBe(400);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect(counter.requests).toBe(1);
    expect(g.seen('a', '/v1/embeddings')).toHaveLength(1);
    expect(g.seen('b', '/v1/embeddings')).toHaveLength(0);
  });

  it("serves embeddings from the backup when the primary refuses the gateway's key, telling the client only by a header", async () => {
    const g = await gw({ a: { errors: [{ status: 401, code: 'invalid_api_key' }] }, b: {} }, [route('emb', '/v1/embeddings', [{ provider: 'a' }, { provider: 'b' }])]);
    const res = await g.client.embeddings.create({ model: EMB, input: 'hello' }).withResponse();
    expect(res.data.data).toHaveLength(1);
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('credentials');
    // The key is held: the next call goes straight to the backup.
    await g.client.embeddings.create({ model: EMB, input: 'again' });
    expect(g.seen('a', '/v1/embeddings')).toHaveLength(1);
    expect(g.seen('b', '/v1/embeddings')).toHaveLength(2);
  });

  it("skips an embeddings primary held off by its 429's retry-after for the backup, then comes back to it", async () => {
    const g = await gw({ a: { errors: [{ status: 429, headers: { 'retry-after': '1' }, times: 1 }] }, b: {} }, [
      route('emb', '/v1/embeddings', [{ provider: 'a' }, { provider: 'b' }], { retry: { maxAttempts: 2, maxWaitHintMs: 500 } }),
    ]);
    const first = await g.client.embeddings.create({ model: EMB, input: 'one' }).withResponse();
    expect(first.response.headers.get('x-stormgate-target')).toBe(`b/${EMB}`);
    const during = await g.client.embeddings.create({ model: EMB, input: 'two' }).withResponse();
    expect(during.response.headers.get('x-stormgate-fallback')).toBe('held_off');
    expect(g.seen('a', '/v1/embeddings')).toHaveLength(1);
    await sleep(1_500);
    const after = await g.client.embeddings.create({ model: EMB, input: 'three' }).withResponse();
    expect(after.response.headers.get('x-stormgate-target')).toBe(`a/${EMB}`);
    expect(g.seen('a', '/v1/embeddings')).toHaveLength(2);
  });

  it("answers an embeddings call on a hung lone target at the route's timeoutMs with 504, and the SDK does not retry it", async () => {
    const g = await gw({ a: { hangRate: 1 } }, [route('emb', '/v1/embeddings', [{ provider: 'a' }], { timeoutMs: 800, deadlineMarginMs: 0 })]);
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const t0 = Date.now();
    const err = await sdkError(client.embeddings.create({ model: EMB, input: 'x' }));
    expect(Date.now() - t0).toBeLessThan(1_500);
    expect(err.status).toBe(504);
    expect(err.code).toBe('deadline_exceeded');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(counter.requests).toBe(1);
  });

  it('keeps 2,048 inputs of one call whole and in order across a retry', async () => {
    const g = await gw({ a: { errors: [{ status: 502, times: 1 }] } }, [route('emb', '/v1/embeddings', [{ provider: 'a' }])]);
    const input = Array.from({ length: 2048 }, (_, i) => `document number ${i}`);
    const res = await g.client.embeddings.create({ model: EMB, input });
    expect(res.data).toHaveLength(2048);
    expect(res.data.every((d, i) => d.index === i)).toBe(true);
    expect(res.usage.prompt_tokens).toBeGreaterThan(2048);
    expect(g.seen('a', '/v1/embeddings')).toHaveLength(2);
  });

  it('refuses at start-up an embeddings fallback to another model, whose vectors would live in another space', async () => {
    await expect(
      gw({ a: {}, b: {} }, [route('emb', '/v1/embeddings', [{ provider: 'a', model: EMB }, { provider: 'b', model: 'text-embedding-3-large' }])]),
    ).rejects.toThrow(/embedding|model/i);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('legacy completions under faults', () => {
  it('retries a 500 on the same target and the SDK gets the text', async () => {
    const g = await gw({ a: { errors: [{ status: 500, times: 1 }] } }, [route('cmp', '/v1/completions', [{ provider: 'a' }])]);
    const res = await g.client.completions.create({ model: 'gpt-3.5-turbo-instruct', prompt: 'Say hi' });
    expect(res.choices[0]!.text.length).toBeGreaterThan(0);
    const sent = g.seen('a', '/v1/completions');
    expect(sent.map((r) => r.headers['x-retry-reason'])).toEqual([undefined, 'status_500']);
  });

  it("streams the backup's completion when the primary answers 503 twice, in one coherent stream", async () => {
    const g = await gw({ a: { errors: [{ status: 503 }] }, b: {} }, [route('cmp', '/v1/completions', [{ provider: 'a' }, { provider: 'b' }])]);
    const { data: stream, response } = await g.client.completions.create({ model: 'gpt-3.5-turbo-instruct', prompt: 'Say hi', stream: true }).withResponse();
    let text = '';
    let finish: string | null = null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.text ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    expect(text.length).toBeGreaterThan(0);
    expect(finish).toBe('stop');
    expect(response.headers.get('x-stormgate-target')).toBe('b/gpt-3.5-turbo-instruct');
    expect(response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(g.seen('a', '/v1/completions')).toHaveLength(2);
    expect(g.seen('b', '/v1/completions')).toHaveLength(1);
  });

  it('ends a completion stream cut after its first chunks with an error the SDK raises, and sends it nowhere again', async () => {
    const g = await gw({ a: { stream: { chunks: 6, cutAfterChunks: 2 } }, b: {} }, [route('cmp', '/v1/completions', [{ provider: 'a' }, { provider: 'b' }])]);
    const stream = await g.client.completions.create({ model: 'gpt-3.5-turbo-instruct', prompt: 'Say hi', stream: true });
    let got = '';
    const err = await (async () => {
      for await (const chunk of stream) got += chunk.choices[0]?.text ?? '';
    })().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(Error);
    expect(got.length).toBeGreaterThan(0);
    expect(g.seen('a', '/v1/completions')).toHaveLength(1);
    expect(g.seen('b', '/v1/completions')).toHaveLength(0);
  });

  it("sends a completion the primary finds too long to the route's contextWindowFallback", async () => {
    const g = await gw(
      { a: { errors: [{ ...CONTEXT_ERROR, param: 'prompt' }] }, big: {} },
      [route('cmp', '/v1/completions', [{ provider: 'a' }], { contextWindowFallback: { provider: 'big', model: 'gpt-3.5-turbo-instruct-16k' } })],
    );
    const res = await g.client.completions.create({ model: 'gpt-3.5-turbo-instruct', prompt: 'a long prompt' }).withResponse();
    expect(res.data.model).toBe('gpt-3.5-turbo-instruct-16k');
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('context_length');
    expect(g.seen('a', '/v1/completions')).toHaveLength(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('the Responses API under faults', () => {
  it('retries a 503 and the SDK reads output_text', async () => {
    const g = await gw({ a: { errors: [{ status: 503, times: 1 }] } }, [route('resp', '/v1/responses', [{ provider: 'a' }])]);
    const r = await g.client.responses.create({ model: 'gpt-4.1', input: 'Say hi' });
    expect(r.status).toBe('completed');
    expect(r.output_text.length).toBeGreaterThan(0);
    expect(g.seen('a', '/v1/responses')).toHaveLength(2);
  });

  it("streams the backup's response when the primary answers 500 on every attempt, and the SDK's finalResponse is whole", async () => {
    const g = await gw({ a: { errors: [{ status: 500 }] }, b: {} }, [route('resp', '/v1/responses', [{ provider: 'a' }, { provider: 'b' }])]);
    const stream = g.client.responses.stream({ model: 'gpt-4.1', input: 'Say hi' });
    const deltas: string[] = [];
    stream.on('response.output_text.delta', (e) => deltas.push(e.delta));
    const final = await stream.finalResponse();
    expect(final.status).toBe('completed');
    // (The SDK's finalResponse() has no output_text convenience, even straight from a provider: read the item.)
    const item = final.output[0] as { content: Array<{ text: string }> };
    expect(deltas.join('')).toBe(item.content[0]!.text);
    expect(deltas.join('').length).toBeGreaterThan(0);
    expect(g.seen('a', '/v1/responses')).toHaveLength(2);
    expect(g.seen('b', '/v1/responses')).toHaveLength(1);
  });

  it("passes a 429 whose retry-after outlasts maxWaitHintMs to the client at once, with the wait, after one upstream request", async () => {
    const g = await gw({ a: { errors: [{ status: 429, headers: { 'retry-after': '30' } }] } }, [
      route('resp', '/v1/responses', [{ provider: 'a' }], { retry: { maxAttempts: 3, maxWaitHintMs: 1_000 } }),
    ]);
    const t0 = Date.now();
    const err = await sdkError(g.client.responses.create({ model: 'gpt-4.1', input: 'Say hi' }));
    expect(Date.now() - t0).toBeLessThan(1_000);
    expect(err.status).toBe(429);
    const retryAfter = Number(err.headers?.get('retry-after'));
    expect(retryAfter).toBeGreaterThanOrEqual(29);
    expect(retryAfter).toBeLessThanOrEqual(37);
    expect(g.seen('a', '/v1/responses')).toHaveLength(1);
  });

  it('gives the SDK one response.created and rising sequence numbers when the primary broke after its own response.created', async () => {
    const g = await gw({ a: { stream: { cutAfterChunks: 0 } }, b: {} }, [route('resp', '/v1/responses', [{ provider: 'a' }, { provider: 'b' }])]);
    const stream = await g.client.responses.create({ model: 'gpt-4.1', input: 'Say hi', stream: true });
    const types: string[] = [];
    const seqs: number[] = [];
    for await (const e of stream) {
      types.push(e.type);
      seqs.push(e.sequence_number);
    }
    expect(types.filter((t) => t === 'response.created')).toHaveLength(1);
    expect(types[0]).toBe('response.created');
    expect(types.at(-1)).toBe('response.completed');
    expect(seqs.every((n, i) => i === 0 || n > seqs[i - 1]!)).toBe(true);
    expect(g.seen('b', '/v1/responses')).toHaveLength(1);
  });

  it('does not fail a conversation continued by previous_response_id over to another provider, which has no such response', async () => {
    const g = await gw({ a: { errors: [{ status: 503 }] }, b: {} }, [route('resp', '/v1/responses', [{ provider: 'a' }, { provider: 'b' }])]);
    const err = await sdkError(g.client.responses.create({ model: 'gpt-4.1', input: 'and then?', previous_response_id: 'resp_abc123' }));
    expect(err.status).toBe(503);
    expect(g.seen('a', '/v1/responses')).toHaveLength(2);
    expect(g.seen('b', '/v1/responses')).toHaveLength(0);
  });

  it('ends a Responses stream cut after its first output with an error the SDK raises, never a completed response', async () => {
    const g = await gw({ a: { stream: { chunks: 6, cutAfterChunks: 2 } }, b: {} }, [route('resp', '/v1/responses', [{ provider: 'a' }, { provider: 'b' }])]);
    const stream = g.client.responses.stream({ model: 'gpt-4.1', input: 'Say hi' });
    const err = await stream.finalResponse().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(Error);
    expect(g.seen('b', '/v1/responses')).toHaveLength(0);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('weighted targets with one failing', () => {
  it('splits 40 calls 30/10 for weights 3:1 when both are healthy, each answer under its target\'s model', async () => {
    const g = await gw({ a: {}, b: {} }, [
      route('chat', '/v1/chat/completions', [
        { provider: 'a', model: 'gpt-4o', weight: 3 },
        { provider: 'b', model: 'gpt-4o-mini', weight: 1 },
      ], { strategy: 'weighted', match: { path: '/v1/chat/completions', models: ['smart'] } }),
    ]);
    const models: string[] = [];
    for (let i = 0; i < 40; i++) models.push((await g.client.chat.completions.create({ model: 'smart', messages })).model);
    expect(models.filter((m) => m === 'gpt-4o')).toHaveLength(30);
    expect(models.filter((m) => m === 'gpt-4o-mini')).toHaveLength(10);
    expect(g.seen('a', '/v1/chat/completions')).toHaveLength(30);
    expect(g.seen('b', '/v1/chat/completions')).toHaveLength(10);
  });

  it('answers every call when one weighted target answers 503, and stops sending it traffic once its breaker opens', async () => {
    const g = await gw(
      { a: {}, b: { errors: [{ status: 503 }] } },
      [route('chat', '/v1/chat/completions', [{ provider: 'a' }, { provider: 'b' }], { strategy: 'weighted', retry: { maxAttempts: 1 } })],
      { providers: { b: { breaker: { consecutiveFailures: 3, openS: 30 } } } },
    );
    for (let i = 0; i < 24; i++) {
      const r = await g.client.chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
      expect(r.response.headers.get('x-stormgate-target')).toBe('a/gpt-4o');
      await sleep(30);
    }
    const failing = g.seen('b', '/v1/chat/completions').length;
    expect(failing).toBeGreaterThanOrEqual(3);
    expect(failing).toBeLessThanOrEqual(8);
    for (let i = 0; i < 10; i++) await g.client.chat.completions.create({ model: 'gpt-4o', messages });
    expect(g.seen('b', '/v1/chat/completions')).toHaveLength(failing);
  });

  it('answers every call from the live target when the other weighted target refuses connections', async () => {
    const g = await gw({ a: {} }, [route('chat', '/v1/chat/completions', [{ provider: 'dead' }, { provider: 'a' }], { strategy: 'weighted' })], { refused: ['dead'] });
    const answers = [];
    for (let i = 0; i < 10; i++) answers.push((await g.client.chat.completions.create({ model: 'gpt-4o', messages }).withResponse()).response.headers);
    expect(answers.every((h) => h.get('x-stormgate-target') === 'a/gpt-4o')).toBe(true);
    expect(g.seen('a', '/v1/chat/completions')).toHaveLength(10);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('the model list and unknown models', () => {
  const routes = (): RouteInput[] => [
    route('alias', '/v1/chat/completions', [{ provider: 'a', model: 'gpt-4o' }], { match: { path: '/v1/chat/completions', models: ['smart'] } }),
    route('chat', '/v1/chat/completions', [{ provider: 'a' }], { match: { path: '/v1/chat/completions', models: ['gpt-4.1*', 'gpt-4o'] } }),
    route('emb', '/v1/embeddings', [{ provider: 'a' }], { match: { path: '/v1/embeddings', models: ['text-embedding-3-small'] } }),
  ];

  it("lists the exact names and the provider's models the globs let through, and nothing else", async () => {
    const g = await gw({ a: {} }, routes());
    const ids = [];
    for await (const model of g.client.models.list()) ids.push(model.id);
    expect(ids.sort()).toEqual(['gpt-4.1', 'gpt-4o', 'smart', 'text-embedding-3-small']);
    expect((await g.client.models.retrieve('smart')).id).toBe('smart');
    const err = await sdkError(g.client.models.retrieve('gpt-4o-mini'));
    expect(err.status).toBe(404);
    expect(err.code).toBe('model_not_found');
  });

  it('answers a model no route serves with 404 model_not_found, sends nothing upstream, and the SDK does not retry it', async () => {
    const g = await gw({ a: {} }, routes());
    const { client, counter } = countingClient(g.s, { maxRetries: 3 });
    const err = await sdkError(client.chat.completions.create({ model: 'gpt-5-imaginary', messages }));
    expect(err).toBeInstanceOf(OpenAI.NotFoundError);
    expect(err.code).toBe('model_not_found');
    expect(err.message).toContain('gpt-5-imaginary');
    expect(counter.requests).toBe(1);
    expect(g.seen('a')).toHaveLength(0);
  });

  it('answers a chat model asked of the embeddings path with 404 model_not_found: routes are per path', async () => {
    const g = await gw({ a: {} }, routes());
    const err = await sdkError(g.client.embeddings.create({ model: 'gpt-4o', input: 'x' }));
    expect(err.status).toBe(404);
    expect(err.code).toBe('model_not_found');
    expect(g.seen('a', '/v1/embeddings')).toHaveLength(0);
  });

  it("still lists the config's own names, at once, while the provider's model list answers 503", async () => {
    const g = await gw({ a: { errors: [{ status: 503 }] } }, routes());
    const t0 = Date.now();
    const ids = [];
    for await (const model of g.client.models.list()) ids.push(model.id);
    expect(Date.now() - t0).toBeLessThan(3_000);
    expect(ids).toEqual(expect.arrayContaining(['smart', 'gpt-4o', 'text-embedding-3-small']));
  });

  it('retrieves and serves vLLM- and Ollama-style model ids, with a slash or a colon, that the SDK percent-encodes in the path', async () => {
    const ids = ['meta-llama/Llama-3.1-8B-Instruct', 'llama3.1:8b'];
    const g = await gw({ a: {} }, [route('local', '/v1/chat/completions', [{ provider: 'a' }], { match: { path: '/v1/chat/completions', models: ids } })]);
    for (const id of ids) {
      expect((await g.client.models.retrieve(id)).id).toBe(id);
      expect((await g.client.chat.completions.create({ model: id, messages })).choices[0]!.message.content).toBeTruthy();
    }
    const listed = [];
    for await (const m of g.client.models.list()) listed.push(m.id);
    expect(listed.sort()).toEqual([...ids].sort());
  });

  it("matches a glob's dots literally: gpt-4.1* serves gpt-4.1-mini, not gpt-401", async () => {
    const g = await gw({ a: {} }, [route('chat', '/v1/chat/completions', [{ provider: 'a' }], { match: { path: '/v1/chat/completions', models: ['gpt-4.1*'] } })]);
    expect((await g.client.chat.completions.create({ model: 'gpt-4.1-mini', messages })).choices[0]).toBeTruthy();
    expect((await sdkError(g.client.chat.completions.create({ model: 'gpt-401', messages }))).code).toBe('model_not_found');
  });

  it("lists the config's own names within the listing's 2 s timeout while the provider's model list hangs, and a second listing at once", async () => {
    const g = await gw({ a: { hangRate: 1 } }, routes());
    let t0 = Date.now();
    const ids = [];
    for await (const model of g.client.models.list()) ids.push(model.id);
    expect(Date.now() - t0).toBeLessThan(3_500);
    expect(ids).toEqual(expect.arrayContaining(['smart', 'gpt-4o', 'text-embedding-3-small']));
    t0 = Date.now();
    for await (const model of g.client.models.list()) expect(model.id).toBeTruthy();
    // At once, not at the 2 s timeout again: the bound leaves a loaded machine's lag room.
    expect(Date.now() - t0).toBeLessThan(1_500);
  });

  it('answers an unknown path with 404 unknown_url in the OpenAI shape', async () => {
    const g = await gw({ a: {} }, routes());
    const res = await fetch(`${g.s.baseURL}/audio/speech`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"model":"tts-1"}' });
    expect(res.status).toBe(404);
    expectOpenAIError(await res.json(), 'unknown_url');
    expect(g.seen('a')).toHaveLength(0);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('retry policies that differ per route and per target', () => {
  it('gives two routes on one path their own maxAttempts: 3 attempts for one model, 1 for the other, under the same 503s', async () => {
    const g = await gw({ a: { errors: [{ status: 503 }] } }, [
      route('premium', '/v1/chat/completions', [{ provider: 'a' }], { match: { path: '/v1/chat/completions', models: ['gpt-4o'] }, retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5 } } }),
      route('cheap', '/v1/chat/completions', [{ provider: 'a' }], { match: { path: '/v1/chat/completions', models: ['gpt-4o-mini'] }, retry: { maxAttempts: 1 } }),
    ]);
    expect((await sdkError(g.client.chat.completions.create({ model: 'gpt-4o', messages }))).status).toBe(503);
    expect((await sdkError(g.client.chat.completions.create({ model: 'gpt-4o-mini', messages }))).status).toBe(503);
    const sent = g.seen('a', '/v1/chat/completions');
    expect(sent.filter((r) => r.model === 'gpt-4o')).toHaveLength(3);
    expect(sent.filter((r) => r.model === 'gpt-4o-mini')).toHaveLength(1);
  });

  it("fails a 503 over to the backup without retrying it when retryOn lists only 429 (the provider did not run it)", async () => {
    const g = await gw({ a: { errors: [{ status: 503 }] }, b: {} }, [
      route('chat', '/v1/chat/completions', [{ provider: 'a' }, { provider: 'b' }], { retry: { maxAttempts: 3, retryOn: [429] } }),
    ]);
    const r = await g.client.chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(r.response.headers.get('x-stormgate-target')).toBe('b/gpt-4o');
    expect(g.seen('a', '/v1/chat/completions')).toHaveLength(1);
    expect(g.seen('b', '/v1/chat/completions')).toHaveLength(1);
  });

  it('neither retries nor fails over a 500 when retryOn leaves it out (the provider may have run it)', async () => {
    const g = await gw({ a: { errors: [{ status: 500 }] }, b: {} }, [
      route('chat', '/v1/chat/completions', [{ provider: 'a' }, { provider: 'b' }], { retry: { maxAttempts: 3, retryOn: [429, 503] } }),
    ]);
    const err = await sdkError(g.client.chat.completions.create({ model: 'gpt-4o', messages }));
    expect(err.status).toBe(500);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(g.seen('a', '/v1/chat/completions')).toHaveLength(1);
    expect(g.seen('b', '/v1/chat/completions')).toHaveLength(0);
  });

  it("takes each target's own retry policy: one attempt on the primary, three on the backup", async () => {
    const g = await gw({ a: { errors: [{ status: 503 }] }, b: { errors: [{ status: 503, times: 2 }] } }, [
      route('chat', '/v1/chat/completions', [
        { provider: 'a', retry: { maxAttempts: 1 } },
        { provider: 'b', retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5 } } },
      ]),
    ]);
    const r = await g.client.chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(r.data.choices[0]!.message.content).toBeTruthy();
    expect(g.seen('a', '/v1/chat/completions')).toHaveLength(1);
    expect(g.seen('b', '/v1/chat/completions')).toHaveLength(3);
    expect(r.response.headers.get('x-stormgate-attempts')).toBe('4');
  });

  it('retries a status an operator added to retryOn (Envoy retriable_status_codes: 409)', async () => {
    const g = await gw({ a: { errors: [{ status: 409, times: 1, message: 'conflict, try again' }] } }, [
      route('chat', '/v1/chat/completions', [{ provider: 'a' }], { retry: { maxAttempts: 2, retryOn: [409, 503], backoff: { strategy: 'fixed', baseMs: 5 } } }),
    ]);
    const r = await g.client.chat.completions.create({ model: 'gpt-4o', messages });
    expect(r.choices[0]!.message.content).toBeTruthy();
    expect(g.seen('a', '/v1/chat/completions').map((x) => x.headers['x-retry-reason'])).toEqual([undefined, 'status_409']);
  });

  it("waits each route's own backoff: 300 ms on one, 5 ms on the other", async () => {
    const g = await gw({ a: { errors: [{ status: 503, rate: 0.5 }] } }, [
      route('slow', '/v1/chat/completions', [{ provider: 'a' }], { match: { path: '/v1/chat/completions', models: ['gpt-4o'] }, retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 300 } } }),
      route('fast', '/v1/chat/completions', [{ provider: 'a' }], { match: { path: '/v1/chat/completions', models: ['gpt-4o-mini'] }, retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5 } } }),
    ]);
    // rate 0.5 fails the 2nd, 4th, ... request: prime one success so each call's first attempt fails.
    await g.client.chat.completions.create({ model: 'gpt-4o', messages });
    let t0 = Date.now();
    await g.client.chat.completions.create({ model: 'gpt-4o', messages });
    const slow = Date.now() - t0;
    t0 = Date.now();
    await g.client.chat.completions.create({ model: 'gpt-4o-mini', messages });
    const fast = Date.now() - t0;
    expect(slow).toBeGreaterThanOrEqual(290);
    expect(fast).toBeLessThan(200);
    expect(g.seen('a', '/v1/chat/completions')).toHaveLength(5);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('batch and online when the pool is full', () => {
  const pooled = (faults: FaultSpec) =>
    gw({ a: faults }, [route('chat', '/v1/chat/completions', [{ provider: 'a' }])], {
      providers: {
        a: {
          maxConnections: 8,
          pools: { maxConcurrent: 2, classes: { online: { minShare: 0.5, maxQueue: 10 }, batch: { minShare: 0, maxQueue: 0 } } },
        },
      },
    });
  const batch = { headers: { 'x-stormgate-priority': 'batch' } };

  it('sheds a batch call with 429 load_shed and a retry hint while online waits for its slot and is served', async () => {
    const g = await pooled({ latencyMs: 500 });
    const running = [g.client.chat.completions.create({ model: 'gpt-4o', messages }, batch), g.client.chat.completions.create({ model: 'gpt-4o', messages }, batch)];
    await sleep(100);
    const shed = await sdkError(g.client.chat.completions.create({ model: 'gpt-4o', messages }, batch));
    expect(shed).toBeInstanceOf(OpenAI.RateLimitError);
    expect(shed.code).toBe('load_shed');
    expect(shed.headers?.get('x-should-retry')).toBe('true');
    expect(Number(shed.headers?.get('retry-after-ms'))).toBeGreaterThan(0);
    const t0 = Date.now();
    const online = await g.client.chat.completions.create({ model: 'gpt-4o', messages });
    expect(online.choices[0]!.message.content).toBeTruthy();
    expect(Date.now() - t0).toBeGreaterThanOrEqual(300);
    await Promise.all(running);
    expect(g.seen('a', '/v1/chat/completions')).toHaveLength(3);
  });

  it("lets the SDK's own retry bring a shed batch call back after the wait it was told, and it is served", async () => {
    const g = await pooled({ latencyMs: 400 });
    const running = [g.client.chat.completions.create({ model: 'gpt-4o', messages }, batch), g.client.chat.completions.create({ model: 'gpt-4o', messages }, batch)];
    await sleep(100);
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const r = await client.chat.completions.create({ model: 'gpt-4o', messages }, batch);
    expect(r.choices[0]!.message.content).toBeTruthy();
    expect(counter.requests).toBe(2);
    await Promise.all(running);
    expect(g.seen('a', '/v1/chat/completions')).toHaveLength(3);
  });

  it('serves a waiting online call before batch calls that queued ahead of it', async () => {
    const g = await gw({ a: { latencyMs: 200 } }, [route('chat', '/v1/chat/completions', [{ provider: 'a' }])], {
      providers: { a: { maxConnections: 4, pools: { maxConcurrent: 1, classes: { online: { minShare: 0.5, maxQueue: 10 }, batch: { minShare: 0, maxQueue: 10 } } } } },
    });
    const calls = [g.client.chat.completions.create({ model: 'gpt-4o', messages }, batch)];
    await sleep(50);
    for (let i = 0; i < 3; i++) calls.push(g.client.chat.completions.create({ model: 'gpt-4o', messages }, batch));
    await sleep(50);
    calls.push(g.client.chat.completions.create({ model: 'gpt-4o-mini', messages }));
    await Promise.all(calls);
    expect(g.seen('a', '/v1/chat/completions').map((r) => r.model)).toEqual(['gpt-4o', 'gpt-4o-mini', 'gpt-4o', 'gpt-4o', 'gpt-4o']);
  });

  it("ignores a priority name no class has, serves the route's class, and says so in the log line", async () => {
    const g = await pooled({});
    await g.client.chat.completions.create({ model: 'gpt-4o', messages }, { headers: { 'x-stormgate-priority': 'bulk' } });
    const line = await requestLine(g.s);
    expect(line.priority).toBe('online');
    expect(line.unknownPriority).toBeTruthy();
  });

  it('does not let a batch route be promoted to online by the header', async () => {
    const g = await gw({ a: {} }, [route('chat', '/v1/chat/completions', [{ provider: 'a' }], { priority: 'batch' })]);
    await g.client.chat.completions.create({ model: 'gpt-4o', messages }, { headers: { 'x-stormgate-priority': 'online' } });
    expect((await requestLine(g.s)).priority).toBe('batch');
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('a retry budget spent, as the client sees it', () => {
  const NO_BUDGET = { ratio: 0, windowS: 10, minRetriesPerSecond: 0 };

  it("answers the provider's 503 after one attempt, says the budget stopped the retries, and the SDK does not send it again", async () => {
    const g = await gw({ a: { errors: [{ status: 503 }] } }, [route('chat', '/v1/chat/completions', [{ provider: 'a' }], { retry: { maxAttempts: 3 }, budget: NO_BUDGET })]);
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const err = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages }));
    expect(err.status).toBe(503);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(counter.requests).toBe(1);
    expect(g.seen('a', '/v1/chat/completions')).toHaveLength(1);
    expect((await requestLine(g.s)).retriesStopped).toBe('budget');
    expect(await metricSum(g.s, 'stormgate_retry_budget_exhausted_total{route="chat"')).toBe(1);
  });

  it("names the spent budget in the gateway's own error when the one attempt timed out", async () => {
    const g = await gw({ a: { hangRate: 1 } }, [route('chat', '/v1/chat/completions', [{ provider: 'a' }], { retry: { maxAttempts: 3 }, budget: NO_BUDGET })], {
      providers: { a: { timeouts: { connectMs: 1_000, firstTokenMs: 3_000, idleMs: 3_000, responseMs: 200 } } },
    });
    const err = await sdkError(g.client.chat.completions.create({ model: 'gpt-4o', messages }));
    expect(err.status).toBe(504);
    expect(err.code).toBe('upstream_timeout');
    expect(err.message).toContain('retry budget');
    expect(g.seen('a', '/v1/chat/completions')).toHaveLength(1);
  });

  it('moves to the backup when the budget refuses the retry, and says why', async () => {
    const g = await gw({ a: { errors: [{ status: 503 }] }, b: {} }, [
      route('chat', '/v1/chat/completions', [{ provider: 'a' }, { provider: 'b' }], { retry: { maxAttempts: 3 }, budget: NO_BUDGET }),
    ]);
    const r = await g.client.chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(r.response.headers.get('x-stormgate-fallback')).toBe('budget');
    expect(g.seen('a', '/v1/chat/completions')).toHaveLength(1);
  });

  it('grants exactly the floor of minRetriesPerSecond x windowS retries in a window, then none', async () => {
    const g = await gw({ a: { errors: [{ status: 503 }] } }, [
      route('chat', '/v1/chat/completions', [{ provider: 'a' }], { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5 } }, budget: { ratio: 0, windowS: 10, minRetriesPerSecond: 0.2 } }),
    ]);
    for (let i = 0; i < 5; i++) expect((await sdkError(g.client.chat.completions.create({ model: 'gpt-4o', messages }))).status).toBe(503);
    expect(g.seen('a', '/v1/chat/completions')).toHaveLength(5 + 2);
  });

  it("keeps each priority class's budget apart: a batch flood that spent its retries leaves online's retry", async () => {
    const g = await gw({ a: { errors: [{ status: 503, firstAttemptsOnly: true }] } }, [
      route('chat', '/v1/chat/completions', [{ provider: 'a' }], { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5 } }, budget: { ratio: 0, windowS: 10, minRetriesPerSecond: 0.2 } }),
    ]);
    const batch = { headers: { 'x-stormgate-priority': 'batch' } };
    for (let i = 0; i < 2; i++) expect((await g.client.chat.completions.create({ model: 'gpt-4o', messages }, batch)).choices[0]).toBeTruthy();
    expect((await sdkError(g.client.chat.completions.create({ model: 'gpt-4o', messages }, batch))).status).toBe(503);
    const online = await g.client.chat.completions.create({ model: 'gpt-4o', messages });
    expect(online.choices[0]!.message.content).toBeTruthy();
    expect(g.seen('a', '/v1/chat/completions')).toHaveLength(2 * 2 + 1 + 2);
  });

  it("keeps each route's budget apart on one provider: a route that spent its retries leaves another route's", async () => {
    const g = await gw({ a: { errors: [{ status: 503, firstAttemptsOnly: true }] } }, [
      route('spent', '/v1/chat/completions', [{ provider: 'a' }], { match: { path: '/v1/chat/completions', models: ['gpt-4o'] }, retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5 } }, budget: { ratio: 0, windowS: 10, minRetriesPerSecond: 0.1 } }),
      route('other', '/v1/chat/completions', [{ provider: 'a' }], { match: { path: '/v1/chat/completions', models: ['gpt-4o-mini'] }, retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5 } }, budget: { ratio: 0, windowS: 10, minRetriesPerSecond: 0.1 } }),
    ]);
    await g.client.chat.completions.create({ model: 'gpt-4o', messages });
    expect((await sdkError(g.client.chat.completions.create({ model: 'gpt-4o', messages }))).status).toBe(503);
    expect((await g.client.chat.completions.create({ model: 'gpt-4o-mini', messages })).choices[0]!.message.content).toBeTruthy();
  });

  it("serves once, but never retries, an SDK retry that arrives when the budget is spent (x-stainless-retry-count counts)", async () => {
    const g = await gw({ a: { errors: [{ status: 503 }] } }, [route('chat', '/v1/chat/completions', [{ provider: 'a' }], { retry: { maxAttempts: 3 }, budget: { ratio: 0, windowS: 10, minRetriesPerSecond: 0 } })]);
    const res = await fetch(`${g.s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-stainless-retry-count': '1' },
      body: JSON.stringify({ model: 'gpt-4o', messages }),
    });
    expect(res.status).toBe(503);
    expect(res.headers.get('x-should-retry')).toBe('false');
    expect(g.seen('a', '/v1/chat/completions')).toHaveLength(1);
  });

  it('answers a stream whose retry the budget refused with a JSON error and a real status, not a 200 stream', async () => {
    const g = await gw({ a: { errors: [{ status: 503 }] } }, [route('chat', '/v1/chat/completions', [{ provider: 'a' }], { retry: { maxAttempts: 3 }, budget: NO_BUDGET })]);
    const res = await fetch(`${g.s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages, stream: true }),
    });
    expect(res.status).toBe(503);
    expect(res.headers.get('content-type')).toMatch(/application\/json/);
    expect((await res.json()) as unknown).toHaveProperty('error');
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('context-window errors: fail fast, or the fallback meant for them', () => {
  it('passes context_length_exceeded on at once without a contextWindowFallback: no retry, no backup, no SDK retry', async () => {
    const g = await gw({ a: { errors: [CONTEXT_ERROR] }, b: {} }, [route('chat', '/v1/chat/completions', [{ provider: 'a' }, { provider: 'b' }], { retry: { maxAttempts: 3 } })]);
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const err = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages }));
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect(err.code).toBe('context_length_exceeded');
    expect(err.message).toContain('maximum context length');
    expect(counter.requests).toBe(1);
    expect(g.seen('a', '/v1/chat/completions')).toHaveLength(1);
    expect(g.seen('b', '/v1/chat/completions')).toHaveLength(0);
  });

  it("streams the contextWindowFallback's answer when the primary's context error comes before the stream", async () => {
    const g = await gw({ a: { errors: [CONTEXT_ERROR] }, big: {} }, [
      route('chat', '/v1/chat/completions', [{ provider: 'a' }], { contextWindowFallback: { provider: 'big', model: 'gpt-4.1' } }),
    ]);
    const { data: stream, response } = await g.client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }).withResponse();
    let text = '';
    for await (const c of stream) text += c.choices[0]?.delta.content ?? '';
    expect(text.length).toBeGreaterThan(0);
    expect(response.headers.get('x-stormgate-fallback')).toBe('context_length');
    expect(response.headers.get('x-stormgate-target')).toBe('big/gpt-4.1');
  });

  it("gives the client the contextWindowFallback's own context error when the prompt is too long for it as well, as a 400", async () => {
    const g = await gw({ a: { errors: [CONTEXT_ERROR] }, big: { errors: [{ ...CONTEXT_ERROR, message: "This model's maximum context length is 128000 tokens." }] } }, [
      route('chat', '/v1/chat/completions', [{ provider: 'a' }], { contextWindowFallback: { provider: 'big', model: 'gpt-4.1' } }),
    ]);
    const err = await sdkError(g.client.chat.completions.create({ model: 'gpt-4o', messages }));
    expect(err.status).toBe(400);
    expect(err.code).toBe('context_length_exceeded');
    expect(g.seen('big', '/v1/chat/completions')).toHaveLength(1);
  });

  it("passes on a context error that the primary's retry after a 503 answered, without asking the backup", async () => {
    const g = await gw({ a: { errors: [{ status: 503, times: 1 }, CONTEXT_ERROR] }, b: {} }, [
      route('chat', '/v1/chat/completions', [{ provider: 'a' }, { provider: 'b' }], { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5 } } }),
    ]);
    const err = await sdkError(g.client.chat.completions.create({ model: 'gpt-4o', messages }));
    expect(err.status).toBe(400);
    expect(err.code).toBe('context_length_exceeded');
    expect(g.seen('a', '/v1/chat/completions')).toHaveLength(2);
    expect(g.seen('b', '/v1/chat/completions')).toHaveLength(0);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('very large request bodies', () => {
  it('sends a 4 MB prompt again, whole, on the retry after a 503, and answers it', async () => {
    const g = await gw({ a: { errors: [{ status: 503, times: 1 }] } }, [route('chat', '/v1/chat/completions', [{ provider: 'a' }])]);
    const big = 'lorem ipsum '.repeat(350_000); // ~4.2 MB
    const r = await g.client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: big }] });
    expect(r.choices[0]!.message.content).toBeTruthy();
    const sent = g.seen('a', '/v1/chat/completions');
    expect(sent).toHaveLength(2);
    const len = sent.map((x) => Number(x.headers['content-length'] ?? NaN));
    expect(len[0]).toBeGreaterThan(4_000_000);
    expect(len[1]).toBe(len[0]);
  });

  it('answers a body over bodyLimitBytes with 413 in the OpenAI shape, sends nothing upstream, and the SDK does not retry', async () => {
    const g = await gw({ a: {} }, [route('chat', '/v1/chat/completions', [{ provider: 'a' }])], { extra: { server: { host: '127.0.0.1', port: 0, bodyLimitBytes: 1_000_000 } } });
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const err = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x'.repeat(1_500_000) }] }));
    expect(err.status).toBe(413);
    expect(typeof err.code).toBe('string');
    expect(counter.requests).toBe(1);
    expect(g.seen('a')).toHaveLength(0);
  });

  it('fails a 2 MB prompt over from a refused primary to the backup', async () => {
    const g = await gw({ b: {} }, [route('chat', '/v1/chat/completions', [{ provider: 'dead' }, { provider: 'b' }])], { refused: ['dead'] });
    const r = await g.client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'y'.repeat(2_000_000) }] }).withResponse();
    expect(r.response.headers.get('x-stormgate-target')).toBe('b/gpt-4o');
    expect(Number(g.seen('b', '/v1/chat/completions')[0]!.headers['content-length'])).toBeGreaterThan(2_000_000);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('many concurrent streams with one target cut mid-stream', () => {
  const collect = async (stream: AsyncIterable<OpenAI.Chat.Completions.ChatCompletionChunk>) => {
    let text = '';
    let finish: string | null = null;
    try {
      for await (const c of stream) {
        text += c.choices[0]?.delta.content ?? '';
        finish = c.choices[0]?.finish_reason ?? finish;
      }
      return { ok: true as const, text, finish };
    } catch (err) {
      return { ok: false as const, text, finish, err };
    }
  };

  it('ends exactly the streams on the cut target with an error the SDK raises; the rest complete; none is sent twice', async () => {
    const g = await gw({ a: { stream: { chunks: 6, chunkDelayMs: 20, cutAfterChunks: 2 } }, b: { stream: { chunks: 6, chunkDelayMs: 20 } } }, [
      route('chat', '/v1/chat/completions', [{ provider: 'a' }, { provider: 'b' }], { strategy: 'weighted' }),
    ]);
    const results = await Promise.all(
      Array.from({ length: 20 }, async () => {
        const { data, response } = await g.client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }).withResponse();
        return { target: response.headers.get('x-stormgate-target'), ...(await collect(data)) };
      }),
    );
    const onA = results.filter((r) => r.target === 'a/gpt-4o');
    const onB = results.filter((r) => r.target === 'b/gpt-4o');
    expect(onA).toHaveLength(10);
    expect(onB).toHaveLength(10);
    for (const r of onA) {
      expect(r.ok).toBe(false);
      expect(r.text.length).toBeGreaterThan(0);
      expect(r.finish).toBeNull();
    }
    for (const r of onB) {
      expect(r.ok).toBe(true);
      expect(r.finish).toBe('stop');
    }
    expect(g.seen('a', '/v1/chat/completions')).toHaveLength(10);
    expect(g.seen('b', '/v1/chat/completions')).toHaveLength(10);
  });

  it('ends 20 concurrent streams that stall after their first chunks at idleMs, each with an error the SDK raises', async () => {
    const g = await gw({ a: { stream: { chunks: 6, stallAfterChunks: 2 } } }, [route('chat', '/v1/chat/completions', [{ provider: 'a' }])], {
      providers: { a: { timeouts: { connectMs: 1_000, firstTokenMs: 3_000, idleMs: 400 } } },
    });
    const t0 = Date.now();
    const results = await Promise.all(Array.from({ length: 20 }, async () => collect(await g.client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }))));
    expect(Date.now() - t0).toBeLessThan(2_500);
    for (const r of results) {
      expect(r.ok).toBe(false);
      expect(r.text.length).toBeGreaterThan(0);
    }
    await sleep(100);
    expect(g.seen('a', '/v1/chat/completions').every((r) => r.aborted)).toBe(true);
  });

  it('queues 12 concurrent streams behind maxConnections 4 and serves them all, never more than 4 at the provider', async () => {
    const g = await gw({ a: { stream: { chunks: 4, chunkDelayMs: 50 } } }, [route('chat', '/v1/chat/completions', [{ provider: 'a' }])], { providers: { a: { maxConnections: 4 } } });
    const results = await Promise.all(Array.from({ length: 12 }, async () => collect(await g.client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }))));
    expect(results.every((r) => r.ok && r.finish === 'stop')).toBe(true);
    expect(g.m.a!.stats().maxInflight).toBeLessThanOrEqual(4);
    expect(g.seen('a', '/v1/chat/completions')).toHaveLength(12);
  });

  it('serves all 20 concurrent streams from the backup when the primary dies before any output', async () => {
    const g = await gw({ a: { stream: { cutAfterChunks: 0 } }, b: { stream: { chunks: 4, chunkDelayMs: 10 } } }, [
      route('chat', '/v1/chat/completions', [{ provider: 'a' }, { provider: 'b' }]),
    ]);
    const results = await Promise.all(
      Array.from({ length: 20 }, async () => {
        const { data, response } = await g.client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }).withResponse();
        return { target: response.headers.get('x-stormgate-target'), ...(await collect(data)) };
      }),
    );
    for (const r of results) {
      expect(r.ok).toBe(true);
      expect(r.target).toBe('b/gpt-4o');
      expect(r.finish).toBe('stop');
    }
    expect(new Set(results.map((r) => r.text)).size).toBe(1);
    expect(g.seen('b', '/v1/chat/completions')).toHaveLength(20);
  });

  it('with streamRecovery: continue, completes every stream the primary cut, from the backup, with the whole text', async () => {
    const g = await gw({ a: { stream: { chunks: 6, chunkDelayMs: 10, cutAfterChunks: 2 } }, b: { stream: { chunks: 6 } } }, [
      route('chat', '/v1/chat/completions', [{ provider: 'a' }, { provider: 'b' }], { streamRecovery: 'continue' }),
    ]);
    const direct = await collect(
      await new OpenAI({ baseURL: `${g.m.b!.url}/v1`, apiKey: 'b-key', maxRetries: 0 }).chat.completions.create({ model: 'gpt-4o', messages, stream: true }),
    );
    const results = await Promise.all(
      Array.from({ length: 10 }, async () => collect(await g.client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }))),
    );
    for (const r of results) {
      expect(r.ok).toBe(true);
      expect(r.finish).toBe('stop');
      expect(r.text).toBe(direct.text);
    }
    expect(g.seen('a', '/v1/chat/completions')).toHaveLength(10);
  });
});
