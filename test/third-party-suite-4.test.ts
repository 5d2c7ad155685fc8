// A third-party failure-scenario suite, written from the README alone, in the manner of the suites kept for LLM
// gateways' routers (LiteLLM's cooldowns and fallbacks, Portkey's fallback chains, Kong's ai-proxy timeouts, Envoy AI
// Gateway's retry and header checks): fallback chains three and four deep with each target failing its own way,
// cooldowns that end, context and content-policy errors in the middle of a chain, model rewriting, streams that die
// before their first token or between the choices of `n`, the SDK's own timeout shorter than the route's, and the
// headers a client sees. Every scenario drives a real gateway over HTTP with the official SDKs and counts the attempts
// each upstream saw.
import type { RequestListener } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import type { FaultSpec, MockServer } from '../src/mock/server.ts';
import { requestLine, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { cc, delta, scripted, type Script } from './helpers/scripted-provider.ts';
import { freePort } from './helpers/free-port.ts';
import { expectOpenAIError } from './helpers/openai-error.ts';

const startStack = useStacks();
const startMock = useExtraMocks();
const startProvider = useFakeProviders();

type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];

const messages = [{ role: 'user' as const, content: 'Plan my trip to Lisbon.' }];
const sdk = (s: Stack, opts: NonNullable<ConstructorParameters<typeof OpenAI>[0]> = {}) =>
  new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0, ...opts });

/** One hop of a fallback chain: a bundled mock with faults, a provider of the test's own, or a port nobody listens on. */
type Hop =
  | { name: string; mock: FaultSpec; model?: string; provider?: Partial<ProviderInput>; family?: 'openai' | 'anthropic' }
  | { name: string; handler: RequestListener; model?: string; provider?: Partial<ProviderInput> }
  | { name: string; refused: true; model?: string; provider?: Partial<ProviderInput> };

interface Chain {
  s: Stack;
  /** The bundled mocks of the chain, by hop name. */
  mocks: Record<string, MockServer>;
  /** Requests each fake provider received, by hop name. */
  hits: Record<string, () => number>;
}

/**
 * A chat route whose targets are `hops` in order (LiteLLM's `fallbacks: [{gpt-4o: [b, c]}]`, Portkey's fallback
 * strategy with three targets). Breakers off, a budget that never refuses and no parking unless a scenario asks for
 * them, two attempts per target with a 5 ms backoff, so each scenario checks its own mechanism and its counts.
 */
async function chain(hops: Hop[], route: Partial<RouteInput> = {}, extraProviders: ConfigInput['providers'] = {}): Promise<Chain> {
  const mocks: Record<string, MockServer> = {};
  const hits: Record<string, () => number> = {};
  const providers: ConfigInput['providers'] = {};
  for (const hop of hops) {
    let baseUrl: string;
    let family: 'openai' | 'anthropic' = 'openai';
    if ('mock' in hop) {
      const m = await startMock({ faults: hop.mock, quiet: true, apiKey: `${hop.name}-key` });
      mocks[hop.name] = m;
      family = hop.family ?? 'openai';
      baseUrl = family === 'anthropic' ? m.url : `${m.url}/v1`;
    } else if ('handler' in hop) {
      const p = await startProvider(hop.handler);
      hits[hop.name] = p.hits;
      baseUrl = `${p.origin}/v1`;
    } else {
      baseUrl = `http://127.0.0.1:${await freePort()}/v1`;
    }
    providers[hop.name] = {
      family,
      baseUrl,
      apiKey: `${hop.name}-key`,
      breaker: false,
      timeouts: { connectMs: 2_000, firstTokenMs: 5_000, idleMs: 5_000 },
      ...hop.provider,
    };
  }
  const s = await startStack({
    config: () => ({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: { ...providers, ...extraProviders },
      routes: [
        {
          name: 'chat',
          match: { path: '/v1/chat/completions' },
          targets: hops.map((h) => ({ provider: h.name, ...(h.model !== undefined && { model: h.model }) })),
          retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } },
          budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 },
          park: false,
          ...route,
        },
      ],
    }),
  });
  return { s, mocks, hits };
}

/** Chat requests a mock received. */
const chats = (m: MockServer) => m.requests().filter((r) => r.path === '/v1/chat/completions');

/** A provider's handler that answers every request with one status, headers and JSON body, after reading it. */
const answering =
  (status: number, body: unknown, headers: Record<string, string> = {}): RequestListener =>
  (req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(status, { 'content-type': 'application/json', ...headers });
      res.end(JSON.stringify(body));
    });
  };

/** A raw POST to the gateway's chat completions; the response with its body read as text. */
async function post(s: Stack, body: Record<string, unknown>, headers: Record<string, string> = {}) {
  const res = await fetch(`${s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'gpt-4o', messages, ...body }),
  });
  return { res, text: await res.text() };
}

/** The data payloads of an SSE body, in order ("[DONE]" included). */
const dataOf = (sse: string) =>
  sse
    .split('\n\n')
    .flatMap((ev) => ev.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trim()))
    .filter((d) => d !== '');

const CONTEXT_ERROR = {
  error: {
    message: "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.",
    type: 'invalid_request_error',
    param: 'messages',
    code: 'context_length_exceeded',
  },
};
const POLICY_ERROR = {
  error: { message: 'Your request was rejected as a result of our safety system.', type: 'invalid_request_error', param: null, code: 'content_policy_violation' },
};

describe('a fallback chain four deep, each target failing its own way', () => {
  it('moves on from a 429 with retry-after, a 529 twice and a refused port, and the fourth answers; counts per target exact', async () => {
    const { s, mocks } = await chain([
      { name: 'primary', mock: { errors: [{ status: 429, headers: { 'retry-after': '5' } }] } },
      { name: 'second', mock: { errors: [{ status: 529 }] }, model: 'gpt-4o-second' },
      { name: 'third', refused: true, model: 'gpt-4o-third' },
      { name: 'fourth', mock: {}, model: 'gpt-4.1' },
    ], { park: {} });
    const res = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(res.data.choices[0]!.message.content).toBeTruthy();
    expect(res.data.model).toBe('gpt-4.1');
    // The 429 asked for 5 s with a next target that may answer: no wait, one attempt; the 529 retried once.
    expect(chats(mocks.primary!)).toHaveLength(1);
    expect(chats(mocks.second!)).toHaveLength(2);
    expect(chats(mocks.second!).map((r) => r.model)).toEqual(['gpt-4o-second', 'gpt-4o-second']);
    expect(chats(mocks.fourth!)).toHaveLength(1);
    expect(chats(mocks.fourth!)[0]!.model).toBe('gpt-4.1');
    expect(res.response.headers.get('x-stormgate-target')).toBe('fourth/gpt-4.1');
    expect(res.response.headers.get('x-stormgate-fallback')).toBeTruthy();
    const line = await requestLine(s);
    const byTarget = (line.attempts as Array<{ target: string }>).map((a) => a.target);
    expect(byTarget.filter((t) => t.startsWith('primary')).length).toBe(1);
    expect(byTarget.filter((t) => t.startsWith('second')).length).toBe(2);
    expect(byTarget.filter((t) => t.startsWith('third')).length).toBe(2);
    expect(byTarget.filter((t) => t.startsWith('fourth')).length).toBe(1);
    expect(res.response.headers.get('x-stormgate-attempts')).toBe('6');
    // Retry headers on the retry only: a fallback's first attempt is a request, not a retry.
    expect(chats(mocks.second!).map((r) => [r.headers['x-retry-attempt'], r.headers['x-retry-reason']])).toEqual([[undefined, undefined], ['1', 'status_529']]);
    expect(chats(mocks.fourth!)[0]!.headers['x-retry-attempt']).toBeUndefined();
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics.split('\n').filter((l) => l.startsWith('stormgate_fallbacks_total') && !l.endsWith(' 0')).sort()).toEqual([
      'stormgate_fallbacks_total{route="chat",from="primary/gpt-4o",to="second/gpt-4o-second",reason="held_off"} 1',
      'stormgate_fallbacks_total{route="chat",from="second/gpt-4o-second",to="third/gpt-4o-third",reason="retries_exhausted"} 1',
      'stormgate_fallbacks_total{route="chat",from="third/gpt-4o-third",to="fourth/gpt-4.1",reason="retries_exhausted"} 1',
    ]);
  });
});

describe('cooldown semantics', () => {
  it("skips a target held off by its 429's retry-after while the hold-off lasts, then sends it traffic again", async () => {
    const { s, mocks } = await chain([
      { name: 'primary', mock: { errors: [{ status: 429, headers: { 'retry-after': '1' }, times: 1 }] } },
      { name: 'backup', mock: {}, model: 'gpt-4.1' },
    ], { park: {} });
    const first = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(first.response.headers.get('x-stormgate-target')).toBe('backup/gpt-4.1');
    const during = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(during.response.headers.get('x-stormgate-fallback')).toBe('held_off');
    expect(during.data.model).toBe('gpt-4.1');
    expect(chats(mocks.primary!)).toHaveLength(1);
    await sleep(1_100 + 100 + 200); // the hint, its spread (at most a tenth of it), and some slack
    const after = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(after.response.headers.get('x-stormgate-target')).toBe('primary/gpt-4o');
    expect(after.response.headers.get('x-stormgate-fallback')).toBeNull();
    expect(after.data.model).toBe('gpt-4o');
    expect(chats(mocks.primary!)).toHaveLength(2);
    expect(chats(mocks.backup!)).toHaveLength(2);
  });

  it('skips a target whose breaker opened after a run of 500s, then probes it after openS and closes it on its successes', async () => {
    const { s, mocks } = await chain(
      [
        { name: 'primary', mock: { errors: [{ status: 500, times: 3 }] }, provider: { breaker: { consecutiveFailures: 3, openS: 1, closeAfter: 2 } } },
        { name: 'backup', mock: {}, model: 'gpt-4.1' },
      ],
      { retry: { maxAttempts: 1 } },
    );
    const via = async () => (await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse()).response.headers;
    // Three failures in a row, the last more than 250 ms after the first with no success between: the breaker opens.
    for (let i = 0; i < 3; i++) {
      expect((await via()).get('x-stormgate-fallback')).toBe('retries_exhausted');
      if (i < 2) await sleep(150);
    }
    const open = await via();
    expect(open.get('x-stormgate-fallback')).toBe('breaker_open');
    expect(open.get('x-stormgate-target')).toBe('backup/gpt-4.1');
    expect(chats(mocks.primary!)).toHaveLength(3);
    await sleep(1_100 + 300); // openS plus its jitter (at most a tenth), and slack
    for (let i = 0; i < 2; i++) {
      const h = await via();
      expect(h.get('x-stormgate-target')).toBe('primary/gpt-4o');
      expect(h.get('x-stormgate-fallback')).toBeNull();
    }
    expect(await via()).toBeTruthy();
    expect(chats(mocks.primary!)).toHaveLength(6);
    expect(chats(mocks.backup!)).toHaveLength(4);
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toMatch(/stormgate_breaker_state\{target="primary\/gpt-4o"\} 0/);
    expect(metrics).toMatch(/stormgate_breaker_transitions_total\{target="primary\/gpt-4o",to="open"\} 1/);
    expect(metrics).toMatch(/stormgate_breaker_transitions_total\{target="primary\/gpt-4o",to="closed"\} 1/);
  });
});

describe('a lone target in cooldown', () => {
  it('answers 503 circuit_open with a retry-after within openS while the breaker is open and parking is off, then serves after it', async () => {
    const { s, mocks } = await chain(
      [{ name: 'primary', mock: { errors: [{ status: 500, times: 3 }] }, provider: { breaker: { consecutiveFailures: 3, openS: 2 } } }],
      { retry: { maxAttempts: 1 } },
    );
    for (let i = 0; i < 3; i++) {
      expect((await post(s, {})).res.status).toBe(500);
      await sleep(150);
    }
    const open = await post(s, {});
    expect(open.res.status).toBe(503);
    expectOpenAIError(JSON.parse(open.text), 'circuit_open', (JSON.parse(open.text) as { error: { type: string } }).error.type);
    const retryAfter = Number(open.res.headers.get('retry-after'));
    expect(retryAfter).toBeGreaterThanOrEqual(1);
    expect(retryAfter).toBeLessThanOrEqual(3);
    expect(open.res.headers.get('x-request-id')).toBe(open.res.headers.get('x-stormgate-request-id'));
    expect(chats(mocks.primary!)).toHaveLength(3);
    await sleep(2_200 + 300);
    expect((await post(s, {})).res.status).toBe(200);
    expect(chats(mocks.primary!)).toHaveLength(4);
  });

  it('parks requests behind an open breaker and releases them all after one successful probe; the provider sees only that probe meanwhile', async () => {
    const { s, mocks } = await chain(
      [{ name: 'primary', mock: { errors: [{ status: 500, times: 3 }] }, provider: { breaker: { consecutiveFailures: 3, openS: 30, probeWhileParkedMs: 800 } } }],
      { retry: { maxAttempts: 1 }, park: {} },
    );
    for (let i = 0; i < 3; i++) {
      expect((await post(s, {})).res.status).toBe(500);
      await sleep(150);
    }
    const t0 = Date.now();
    const parked = await Promise.all(Array.from({ length: 5 }, () => sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse()));
    expect(Date.now() - t0).toBeGreaterThanOrEqual(500);
    for (const r of parked) expect(r.data.choices[0]!.message.content).toBeTruthy();
    // Three failures, then the probe, then the four released after it: nothing else reached the provider.
    expect(chats(mocks.primary!)).toHaveLength(3 + 5);
    const probeAt = chats(mocks.primary!)[3]!.receivedAt;
    expect(chats(mocks.primary!).slice(4).every((r) => r.receivedAt >= probeAt)).toBe(true);
  });
});

describe('hold-offs and the fallbacks behind them', () => {
  it('comes back to the held-off primary after its retry-after when the backup fails too, and is answered there with no fallback', async () => {
    const { s, mocks } = await chain([
      { name: 'primary', mock: { errors: [{ status: 429, headers: { 'retry-after': '1' }, times: 1 }] } },
      { name: 'backup', mock: { errors: [{ status: 503 }] }, model: 'gpt-4.1' },
    ], { park: {} });
    const t0 = Date.now();
    const res = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(Date.now() - t0).toBeGreaterThanOrEqual(950);
    expect(res.data.model).toBe('gpt-4o');
    expect(res.response.headers.get('x-stormgate-target')).toBe('primary/gpt-4o');
    expect(res.response.headers.get('x-stormgate-fallback')).toBeNull();
    expect(chats(mocks.primary!)).toHaveLength(2);
    expect(chats(mocks.backup!)).toHaveLength(2);
  });

  it('parks for the hold-off that ends first when both targets answer 429 with retry-after, and is answered there', async () => {
    const { s, mocks } = await chain([
      { name: 'primary', mock: { errors: [{ status: 429, headers: { 'retry-after': '1' }, times: 1 }] } },
      { name: 'backup', mock: { errors: [{ status: 429, headers: { 'retry-after': '3' }, times: 1 }] }, model: 'gpt-4.1' },
    ], { park: {} });
    const t0 = Date.now();
    const res = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    const took = Date.now() - t0;
    expect(res.response.headers.get('x-stormgate-target')).toBe('primary/gpt-4o');
    expect(took).toBeGreaterThanOrEqual(950);
    expect(took).toBeLessThan(2_500);
    expect(chats(mocks.primary!)).toHaveLength(2);
    expect(chats(mocks.backup!)).toHaveLength(1);
  });

  it("parks for the held-off primary when the backup rejects the request as too long for it, and the primary answers", async () => {
    const { s, mocks, hits } = await chain([
      { name: 'primary', mock: { errors: [{ status: 503, headers: { 'retry-after': '1' }, times: 1 }] } },
      { name: 'small', handler: answering(400, CONTEXT_ERROR), model: 'gpt-4o-mini-8k' },
    ], { park: {} });
    const res = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(res.response.headers.get('x-stormgate-target')).toBe('primary/gpt-4o');
    expect(chats(mocks.primary!)).toHaveLength(2);
    expect(hits.small!()).toBe(1);
  });

  it('starts a hold-off on a 529 with retry-after-ms, and not on a 500 with retry-after', async () => {
    const { s, mocks } = await chain([
      { name: 'primary', mock: { errors: [{ status: 529, headers: { 'retry-after-ms': '1500' }, times: 1 }, { status: 500, headers: { 'retry-after': '5' }, times: 1 }] } },
      { name: 'backup', mock: {}, model: 'gpt-4.1' },
    ], { park: {}, retry: { maxAttempts: 1 } });
    const target = async () => (await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse()).response.headers.get('x-stormgate-target');
    expect(await target()).toBe('backup/gpt-4.1');
    expect(await target()).toBe('backup/gpt-4.1'); // held off: the primary is not asked
    expect(chats(mocks.primary!)).toHaveLength(1);
    await sleep(1_500 + 150 + 250);
    expect(await target()).toBe('backup/gpt-4.1'); // the 500, whose retry-after holds nothing off
    expect(await target()).toBe('primary/gpt-4o');
    expect(chats(mocks.primary!)).toHaveLength(3);
  });

  it("waits out an x-ratelimit-reset hint on the primary itself: it starts no hold-off, so others still go there", async () => {
    const { s, mocks } = await chain([
      { name: 'primary', mock: { errors: [{ status: 429, headers: { 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '1s' }, times: 1 }] } },
      { name: 'backup', mock: {}, model: 'gpt-4.1' },
    ], { park: {} });
    const first = sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    await sleep(200);
    const second = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(second.response.headers.get('x-stormgate-target')).toBe('primary/gpt-4o');
    const r1 = await first;
    expect(r1.response.headers.get('x-stormgate-target')).toBe('primary/gpt-4o');
    expect(r1.response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(chats(mocks.primary!)).toHaveLength(3);
    expect(chats(mocks.backup!)).toHaveLength(0);
  });
});

describe('a chain in which every target fails', () => {
  it('answers with the last target\'s failure, naming each target\'s attempts, and the SDK does not send it again', async () => {
    const { s, mocks } = await chain([
      { name: 'primary', mock: { errors: [{ status: 503 }] } },
      { name: 'second', mock: { errors: [{ status: 529 }] }, model: 'gpt-4o-second' },
      { name: 'third', refused: true, model: 'gpt-4o-third' },
    ]);
    let sent = 0;
    const client = sdk(s, { maxRetries: 2, fetch: async (url, init) => (sent++, fetch(url, init)) });
    const err = (await client.chat.completions.create({ model: 'gpt-4o', messages }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(sent).toBe(1);
    expect(err.status).toBe(502);
    expect(err.code).toBe('upstream_unavailable');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.headers?.get('x-stormgate-target')).toBe('third/gpt-4o-third');
    expect(err.message).toContain('6 attempts in all: primary/gpt-4o 2, second/gpt-4o-second 2, third/gpt-4o-third 2');
    expect(chats(mocks.primary!)).toHaveLength(2);
    expect(chats(mocks.second!)).toHaveLength(2);
  });

  it('moves past a silent target after one attempt when another can answer (responseMs), and aborts it upstream', async () => {
    const { s, mocks } = await chain([
      { name: 'primary', mock: { hangRate: 1 }, provider: { timeouts: { connectMs: 2_000, responseMs: 300 } } },
      { name: 'backup', mock: {}, model: 'gpt-4.1' },
    ]);
    const res = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('timeout');
    expect(res.response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(chats(mocks.primary!)).toHaveLength(1);
    await sleep(100);
    expect(chats(mocks.primary!)[0]!.aborted).toBe(true);
    expect(chats(mocks.backup!)).toHaveLength(1);
  });
});

describe('context-window and content-policy errors in the middle of a chain', () => {
  it("gives the client the primary's 503, not the fallback's context error, when the fallback's window is the smaller", async () => {
    const { s, mocks, hits } = await chain([
      { name: 'primary', mock: { errors: [{ status: 503 }] } },
      { name: 'small', handler: answering(400, CONTEXT_ERROR), model: 'gpt-4o-mini-8k' },
    ]);
    let sent = 0;
    const client = sdk(s, { maxRetries: 2, fetch: async (url, init) => (sent++, fetch(url, init)) });
    const err = (await client.chat.completions.create({ model: 'gpt-4o', messages }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err.status).toBe(503);
    expect(err.message).toContain('the fallback small/gpt-4o-mini-8k rejected the request (400');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(sent).toBe(1);
    expect(chats(mocks.primary!)).toHaveLength(2);
    expect(hits.small!()).toBe(1);
  });

  it("goes on to the third target after the second's context error, and the third answers", async () => {
    const { s, mocks, hits } = await chain([
      { name: 'primary', mock: { errors: [{ status: 503 }] } },
      { name: 'small', handler: answering(400, CONTEXT_ERROR), model: 'gpt-4o-mini-8k' },
      { name: 'third', mock: {}, model: 'gpt-4.1' },
    ]);
    const res = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(res.data.model).toBe('gpt-4.1');
    expect(res.response.headers.get('x-stormgate-target')).toBe('third/gpt-4.1');
    expect(chats(mocks.primary!)).toHaveLength(2);
    expect(hits.small!()).toBe(1);
    expect(chats(mocks.third!)).toHaveLength(1);
  });

  it("sends the second target's context error to contextWindowFallback, and that one answers", async () => {
    const big = await startMock({ quiet: true, apiKey: 'big-key' });
    const { s, mocks, hits } = await chain(
      [
        { name: 'primary', mock: { errors: [{ status: 503 }] } },
        { name: 'small', handler: answering(400, CONTEXT_ERROR), model: 'gpt-4o-mini-8k' },
      ],
      { contextWindowFallback: { provider: 'big', model: 'gpt-4.1-1m' } },
      { big: { family: 'openai', baseUrl: `${big.url}/v1`, apiKey: 'big-key', breaker: false } },
    );
    const res = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(res.data.model).toBe('gpt-4.1-1m');
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('context_length');
    expect(chats(mocks.primary!)).toHaveLength(2);
    expect(hits.small!()).toBe(1);
    expect(chats(big)).toHaveLength(1);
  });

  it("passes a fallback's content-policy rejection on to the client and routes no further around it", async () => {
    const { s, mocks, hits } = await chain([
      { name: 'primary', mock: { errors: [{ status: 503 }] } },
      { name: 'moderated', handler: answering(400, POLICY_ERROR), model: 'gpt-4o-moderated' },
      { name: 'third', mock: {}, model: 'gpt-4.1' },
    ]);
    const err = (await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect(err.code).toBe('content_policy_violation');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(chats(mocks.primary!)).toHaveLength(2);
    expect(hits.moderated!()).toBe(1);
    expect(chats(mocks.third!)).toHaveLength(0);
  });
});

describe('model aliasing: the answer says which target served', () => {
  it("answers an alias from the fallback under the fallback's model name, in the body, the chunks and the headers", async () => {
    const { s, mocks } = await chain(
      [
        { name: 'primary', mock: { errors: [{ status: 503 }] }, model: 'gpt-4o' },
        { name: 'backup', mock: {}, model: 'gpt-4.1' },
      ],
      { match: { path: '/v1/chat/completions', models: ['smart'] } },
    );
    const listed = await sdk(s).models.list();
    expect(listed.data.map((m) => m.id)).toEqual(['smart']);
    const whole = await sdk(s).chat.completions.create({ model: 'smart', messages }).withResponse();
    expect(whole.data.model).toBe('gpt-4.1');
    expect(whole.data.usage?.total_tokens).toBeGreaterThan(0);
    expect(whole.response.headers.get('x-stormgate-target')).toBe('backup/gpt-4.1');
    const stream = await sdk(s).chat.completions.create({ model: 'smart', messages, stream: true, stream_options: { include_usage: true } });
    const models = new Set<string>();
    for await (const chunk of stream) models.add(chunk.model);
    expect([...models]).toEqual(['gpt-4.1']);
    expect(chats(mocks.primary!).map((r) => r.model)).toEqual(['gpt-4o', 'gpt-4o', 'gpt-4o', 'gpt-4o']);
    expect(chats(mocks.backup!).map((r) => r.model)).toEqual(['gpt-4.1', 'gpt-4.1']);
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toMatch(/stormgate_tokens_total\{route="chat",target="backup\/gpt-4.1",kind="completion"\} [1-9]/);
    expect(metrics).not.toMatch(/stormgate_tokens_total\{[^}]*target="primary\/gpt-4o"[^}]*\} [1-9]/);
  });
});

/** A stream that sends its head and role chunk, then dies before any output: `how` says how. */
const diesBeforeFirstToken = (how: 'reset' | 'silent'): ((body: Record<string, unknown>) => Script) => () => ({
  steps: [cc([delta({ role: 'assistant', content: '' })]), 20, ...(how === 'reset' ? [{ destroy: true as const }] : [])],
  hold: how === 'silent',
});

describe('streaming fallback before the first token', () => {
  it('serves one coherent stream from the backup when the primary begins a 200 stream and dies: one role chunk, one usage chunk, one [DONE]', async () => {
    const { s, mocks, hits } = await chain([
      { name: 'primary', handler: scripted(diesBeforeFirstToken('reset')) },
      { name: 'backup', mock: {}, model: 'gpt-4.1' },
    ]);
    const { res, text } = await post(s, { stream: true, stream_options: { include_usage: true } });
    expect(res.status).toBe(200);
    expect(res.headers.get('x-stormgate-target')).toBe('backup/gpt-4.1');
    const data = dataOf(text);
    expect(data.filter((d) => d === '[DONE]')).toHaveLength(1);
    expect(data.at(-1)).toBe('[DONE]');
    const chunks = data.filter((d) => d !== '[DONE]').map((d) => JSON.parse(d) as { model: string; error?: unknown; usage?: { total_tokens: number } | null; choices: Array<{ delta: { role?: string } }> });
    expect(chunks.filter((c) => c.error !== undefined)).toHaveLength(0);
    expect(chunks.filter((c) => c.choices[0]?.delta.role === 'assistant')).toHaveLength(1);
    expect(chunks.filter((c) => c.usage)).toHaveLength(1);
    expect(chunks.at(-1)!.usage!.total_tokens).toBeGreaterThan(0);
    expect(new Set(chunks.map((c) => c.model))).toEqual(new Set(['gpt-4.1']));
    // A stream broken before its first output is a retryable `network`: retried once on the primary, then failed over.
    expect(hits.primary!()).toBe(2);
    expect(chats(mocks.backup!)).toHaveLength(1);
    expect(res.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
  });

  it('moves a stream whose primary sent its head and then nothing past firstTokenMs to the backup after one attempt', async () => {
    const { s, mocks, hits } = await chain([
      { name: 'primary', handler: scripted(diesBeforeFirstToken('silent')), provider: { timeouts: { connectMs: 2_000, firstTokenMs: 400, idleMs: 5_000 } } },
      { name: 'backup', mock: {}, model: 'gpt-4.1' },
    ]);
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true, stream_options: { include_usage: true } }).withResponse();
    let text = '';
    let usage = 0;
    for await (const chunk of stream.data) {
      text += chunk.choices[0]?.delta.content ?? '';
      usage += chunk.usage?.total_tokens ?? 0;
    }
    expect(text.length).toBeGreaterThan(0);
    expect(usage).toBeGreaterThan(0);
    expect(stream.response.headers.get('x-stormgate-fallback')).toBe('timeout');
    expect(hits.primary!()).toBe(1);
    expect(chats(mocks.backup!)).toHaveLength(1);
  });
});

/** Choice `i`'s content delta, or its finish, as one chunk of an n > 1 stream. */
const text = (i: number, content: string) => cc([delta({ content }, null, i)]);
const finish = (i: number) => cc([delta({}, 'stop', i)]);
const ROLES = cc([delta({ role: 'assistant', content: '' }, null, 0), delta({ role: 'assistant', content: '' }, null, 1)]);

describe('n > 1 streams, each choice with its own finish_reason', () => {
  const nTwo = async (steps: Script['steps']) => {
    const { s, hits } = await chain([{ name: 'p', handler: scripted(() => ({ steps })) }]);
    return { s, hits, call: () => sdk(s).chat.completions.create({ model: 'gpt-4o', messages, n: 2, stream: true }) };
  };

  it('ends a stream cut after one choice finished but not the other with an error the SDK raises, never a clean end', async () => {
    const { call, hits } = await nTwo([ROLES, text(0, 'Lisbon '), text(1, 'Porto '), finish(0), text(1, 'then Sintra'), 20, { destroy: true }]);
    const stream = await call();
    const seen: string[] = [];
    const err = await (async () => {
      for await (const chunk of stream) for (const c of chunk.choices) if (c.finish_reason) seen.push(`${c.index}:${c.finish_reason}`);
    })().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(String((err as Error).message)).toMatch(/stream/i);
    expect(seen).toEqual(['0:stop']);
    expect(hits.p!()).toBe(1);
  });

  it('completes a stream whose choices all finished and whose provider then closed without [DONE], adding the [DONE]', async () => {
    const { s } = await nTwo([ROLES, text(0, 'Lisbon'), text(1, 'Porto'), finish(0), finish(1)]);
    const { res, text: body } = await post(s, { n: 2, stream: true });
    expect(res.status).toBe(200);
    const data = dataOf(body);
    expect(data.at(-1)).toBe('[DONE]');
    expect(data.some((d) => d.includes('"error"'))).toBe(false);
    const finishes = data.filter((d) => d !== '[DONE]').flatMap((d) => (JSON.parse(d) as { choices: Array<{ index: number; finish_reason: string | null }> }).choices.filter((c) => c.finish_reason).map((c) => c.index));
    expect(finishes).toEqual([0, 1]);
  });

  it('ends a stream whose provider closed cleanly while the second choice was still running with an error, not [DONE]', async () => {
    const { s } = await nTwo([ROLES, text(0, 'Lisbon'), text(1, 'Porto '), finish(0), text(1, 'and')]);
    const { res, text: body } = await post(s, { n: 2, stream: true });
    expect(res.status).toBe(200);
    const data = dataOf(body);
    expect(data).not.toContain('[DONE]');
    expect((JSON.parse(data.at(-1)!) as { error: { code: string } }).error.code).toBe('stream_interrupted');
  });

  it("ends a stream as cut when the second choice was announced in the role chunks before the first token and never finished", async () => {
    // OpenAI sends each choice's role chunk before the first text: choice 1 has begun, though the provider ended cleanly
    // after choice 0's finish (a proxy that closed the chunked body). The same stream with choice 1's role chunk after
    // the first token is a cut; where that chunk falls must not decide it.
    const role = (i: number) => cc([delta({ role: 'assistant', content: '' }, null, i)]);
    let previous: Stack | undefined;
    for (const steps of [
      [role(0), role(1), text(0, 'Lisbon'), finish(0)],
      [role(0), text(0, 'Lisbon'), role(1), finish(0)],
    ]) {
      await previous?.close();
      const { s } = await nTwo(steps);
      previous = s;
      const { res, text: body } = await post(s, { n: 2, stream: true });
      expect(res.status).toBe(200);
      const data = dataOf(body);
      expect(data).not.toContain('[DONE]');
      expect((JSON.parse(data.at(-1)!) as { error: { code: string } }).error.code).toBe('stream_interrupted');
    }
  });

  it('waits for the usage chunk a provider sends a while after both choices finished, and passes one [DONE]', async () => {
    const usage = cc([], { usage: { prompt_tokens: 9, completion_tokens: 4, total_tokens: 13 } });
    const { s } = await nTwo([ROLES, text(0, 'Lisbon'), text(1, 'Porto'), finish(0), finish(1), 1_500, usage, 'data: [DONE]\n\n']);
    const { res, text: body } = await post(s, { n: 2, stream: true, stream_options: { include_usage: true } });
    expect(res.status).toBe(200);
    const data = dataOf(body);
    expect(data.filter((d) => d === '[DONE]')).toHaveLength(1);
    expect(data.at(-1)).toBe('[DONE]');
    expect(data.filter((d) => d.includes('"total_tokens":13'))).toHaveLength(1);
  });

  it('passes exactly one [DONE] when the provider sends its own late, after both choices finished and a quiet second', async () => {
    const { s } = await nTwo([ROLES, text(0, 'Lisbon'), text(1, 'Porto'), finish(0), finish(1), 1_500, 'data: [DONE]\n\n']);
    const { res, text: body } = await post(s, { n: 2, stream: true });
    expect(res.status).toBe(200);
    const data = dataOf(body);
    expect(data.filter((d) => d === '[DONE]')).toHaveLength(1);
    expect(data.some((d) => d.includes('"error"'))).toBe(false);
  });

  it('takes a provider that sends the choices one after the other, reset between them, as cut', async () => {
    const { call } = await nTwo([cc([delta({ role: 'assistant', content: '' }, null, 0)]), text(0, 'Lisbon'), finish(0), 20, { destroy: true }]);
    const stream = await call();
    const err = await (async () => {
      for await (const _ of stream) void _;
    })().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
  });

  it('takes a provider that ignores n, finishes its one choice and ends its response, as whole', async () => {
    const { s } = await nTwo([cc([delta({ role: 'assistant', content: '' }, null, 0)]), text(0, 'Lisbon'), finish(0)]);
    const { res, text: body } = await post(s, { n: 2, stream: true });
    expect(res.status).toBe(200);
    const data = dataOf(body);
    expect(data.at(-1)).toBe('[DONE]');
    expect(data.some((d) => d.includes('"error"'))).toBe(false);
  });
});

describe("the SDK's own timeout, shorter than the route's", () => {
  it("answers a per-request timeout of 2 s with the gateway's 504 before the SDK gives up, aborts the upstream, and the SDK does not retry", async () => {
    // A margin wider than the default 250 ms, so a loaded test machine's scheduling does not decide the race.
    const { s, mocks } = await chain([{ name: 'slow', mock: { latencyMs: 10_000 } }], { timeoutMs: 60_000, deadlineMarginMs: 600 });
    let sent = 0;
    const client = sdk(s, { maxRetries: 2, fetch: async (url, init) => (sent++, fetch(url, init)) });
    const t0 = Date.now();
    const err = (await client.chat.completions.create({ model: 'gpt-4o', messages }, { timeout: 2_000 }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    const took = Date.now() - t0;
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err).not.toBeInstanceOf(OpenAI.APIConnectionTimeoutError);
    expect(err.status).toBe(504);
    expect(err.code).toBe('deadline_exceeded');
    expect(took).toBeGreaterThanOrEqual(1_300);
    expect(took).toBeLessThan(2_000);
    expect(sent).toBe(1);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.headers?.get('x-request-id')).toBe(err.headers?.get('x-stormgate-request-id'));
    expect(err.requestID).toBe(err.headers?.get('x-stormgate-request-id'));
    expect(chats(mocks.slow!)).toHaveLength(1);
    await sleep(100);
    expect(chats(mocks.slow!)[0]!.aborted).toBe(true);
    const line = await requestLine(s);
    expect(line.deadlineSource).toBe('x-stainless-timeout');
    expect(line.budgetMs).toBe(1_400);
  });

  it("answers the SDK's client-wide timeout, sent as x-stormgate-timeout-ms in defaultHeaders, the same way", async () => {
    const { s, mocks } = await chain([{ name: 'slow', mock: { latencyMs: 10_000 } }], { timeoutMs: 60_000, deadlineMarginMs: 600 });
    const client = sdk(s, { timeout: 2_000, defaultHeaders: { 'x-stormgate-timeout-ms': '2000' } });
    const err = (await client.chat.completions.create({ model: 'gpt-4o', messages }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err.status).toBe(504);
    expect(err.code).toBe('deadline_exceeded');
    expect(chats(mocks.slow!)).toHaveLength(1);
  });

  it("gives an Anthropic SDK agent the 504 in Anthropic's shape, with the gateway's request id as request-id", async () => {
    const slow = await startMock({ quiet: true, apiKey: 'slow-key', faults: { latencyMs: 10_000 } });
    const s = await startStack({
      config: () => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: { anthropic: { family: 'anthropic', baseUrl: slow.url, apiKey: 'slow-key', breaker: false } },
        routes: [{ name: 'agents', match: { path: '/v1/messages' }, targets: [{ provider: 'anthropic' }], timeoutMs: 60_000, deadlineMarginMs: 600, park: false }],
      }),
    });
    const client = new Anthropic({ baseURL: s.url, apiKey: 'unused', maxRetries: 2 });
    const t0 = Date.now();
    const err = (await client.messages
      .create({ model: 'claude-sonnet-4-5', max_tokens: 64, messages: [{ role: 'user', content: 'hi' }] }, { timeout: 2_000 })
      .catch((e: unknown) => e)) as InstanceType<typeof Anthropic.APIError>;
    expect(Date.now() - t0).toBeLessThan(2_000);
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(err.status).toBe(504);
    expect((err.error as { type: string; error: { type: string; code: string } }).error).toMatchObject({ type: 'timeout_error', code: 'deadline_exceeded' });
    expect(err.requestID).toBeTruthy();
    expect(err.headers?.get('request-id')).toBe(err.headers?.get('x-stormgate-request-id'));
    expect(slow.requests().filter((r) => r.path === '/v1/messages')).toHaveLength(1);
  });

  it('answers a target that times out on every attempt with 504 upstream_timeout, distinct from the deadline, after maxAttempts', async () => {
    const { s, mocks } = await chain([{ name: 'hung', mock: { hangRate: 1 }, provider: { timeouts: { connectMs: 2_000, responseMs: 300 } } }]);
    const { res, text } = await post(s, {});
    expect(res.status).toBe(504);
    expectOpenAIError(JSON.parse(text), 'upstream_timeout', (JSON.parse(text) as { error: { type: string } }).error.type);
    expect(res.headers.get('x-should-retry')).toBe('false');
    expect(res.headers.get('x-stormgate-attempts')).toBe('2');
    expect(res.headers.get('x-stormgate-target')).toBe('hung/gpt-4o');
    expect(res.headers.get('x-request-id')).toBe(res.headers.get('x-stormgate-request-id'));
    expect(chats(mocks.hung!)).toHaveLength(2);
    expect(chats(mocks.hung!)[1]!.headers['x-retry-reason']).toBe('timeout_response');
  });
});

describe('headers the client sees', () => {
  it("carries the gateway's own headers and the upstream's request id on success, and not the provider's rate-limit headers", async () => {
    const { s, mocks } = await chain([{ name: 'primary', mock: {} }]);
    const res = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }, { headers: { 'x-request-id': 'trip-planner-42' } }).withResponse();
    const h = res.response.headers;
    const upstream = chats(mocks.primary!)[0]!;
    expect(upstream.headers['x-ratelimit-limit-requests']).toBeUndefined();
    expect(h.get('x-stormgate-request-id')).toBe('trip-planner-42');
    expect(upstream.headers['x-client-request-id']).toBe('trip-planner-42');
    expect(h.get('x-stormgate-attempts')).toBe('1');
    expect(h.get('x-stormgate-route')).toBe('chat');
    expect(h.get('x-stormgate-target')).toBe('primary/gpt-4o');
    expect(h.get('x-request-id')).toMatch(/^req_/);
    expect(res.request_id).toBe(h.get('x-request-id'));
    expect(h.get('openai-processing-ms')).not.toBeNull();
    expect([...h.keys()].filter((k) => k.startsWith('x-ratelimit-'))).toEqual([]);
  });

  it("passes none of the provider's rate-limit headers on a 429 either, and tells the SDK the gateway's own wait", async () => {
    const { s, mocks } = await chain([
      { name: 'primary', mock: { errors: [{ status: 429, headers: { 'retry-after': '30', 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '30s' } }] } },
    ], { retry: { maxAttempts: 2, maxWaitHintMs: 1_000 } });
    const { res } = await post(s, {});
    expect(res.status).toBe(429);
    expect([...res.headers.keys()].filter((k) => k.startsWith('x-ratelimit-'))).toEqual([]);
    expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(29);
    expect(res.headers.get('x-should-retry')).toBe('true');
    expect(chats(mocks.primary!)).toHaveLength(1);
  });
});

describe('more of a chain', () => {
  it('skips a fallback held off by its own 429 when the primary fails later, going straight to the third', async () => {
    const { s, mocks } = await chain([
      { name: 'primary', mock: { errors: [{ status: 503 }] } },
      { name: 'second', mock: { errors: [{ status: 429, headers: { 'retry-after': '20' }, times: 1 }] }, model: 'gpt-4o-second' },
      { name: 'third', mock: {}, model: 'gpt-4.1' },
    ], { park: {} });
    for (let i = 0; i < 3; i++) {
      const res = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
      expect(res.response.headers.get('x-stormgate-target')).toBe('third/gpt-4.1');
    }
    expect(chats(mocks.primary!)).toHaveLength(6);
    expect(chats(mocks.second!)).toHaveLength(1);
    expect(chats(mocks.third!)).toHaveLength(3);
    const lines = s.logs.map((l) => JSON.parse(l) as { route?: string; skipped?: unknown });
    expect(JSON.stringify(lines.filter((l) => l.route === 'chat').at(-1)!.skipped)).toContain('second');
  });

  it("fails over on a provider's 408 (its own processing timed out) though retryOn leaves 408 out", async () => {
    const { s, hits, mocks } = await chain([
      { name: 'primary', handler: answering(408, { error: { message: 'Operation timed out', type: 'server_error', param: null, code: 'timeout' } }) },
      { name: 'backup', mock: {}, model: 'gpt-4.1' },
    ]);
    const res = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(res.data.model).toBe('gpt-4.1');
    expect(hits.primary!()).toBe(1);
    expect(chats(mocks.backup!)).toHaveLength(1);
  });

  it("fails over on Cloudflare's 522 whatever retryOn says, but not on its 524 when retryOn leaves it out", async () => {
    const cf = (status: number) => answering(status, '<html><body>cloudflare</body></html>', { 'content-type': 'text/html' });
    const one = await chain([
      { name: 'primary', handler: cf(522) },
      { name: 'backup', mock: {}, model: 'gpt-4.1' },
    ], { retry: { maxAttempts: 2, retryOn: [429], backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } });
    const ok = await sdk(one.s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(ok.data.model).toBe('gpt-4.1');
    expect(one.hits.primary!()).toBe(1);
    await one.s.close();
    const two = await chain([
      { name: 'primary', handler: cf(524) },
      { name: 'backup', mock: {}, model: 'gpt-4.1' },
    ], { retry: { maxAttempts: 2, retryOn: [429], backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } });
    const err = (await sdk(two.s).chat.completions.create({ model: 'gpt-4o', messages }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err.status).toBe(524);
    expect(two.hits.primary!()).toBe(1);
    expect(chats(two.mocks.backup!)).toHaveLength(0);
  });

  it("passes a fallback's content-filter error event before its first output on as a 400, after the primary's 503", async () => {
    const filtered = scripted(() => ({ steps: [cc([delta({ role: 'assistant', content: '' })]), `data: ${JSON.stringify(POLICY_ERROR)}\n\n`] }));
    const { s, mocks, hits } = await chain([
      { name: 'primary', mock: { errors: [{ status: 503 }] } },
      { name: 'moderated', handler: filtered, model: 'gpt-4o-moderated' },
      { name: 'third', mock: {}, model: 'gpt-4.1' },
    ]);
    const { res, text } = await post(s, { stream: true });
    expect(res.status).toBe(400);
    expect((JSON.parse(text) as { error: { code: string } }).error.code).toBe('content_policy_violation');
    expect(chats(mocks.primary!)).toHaveLength(2);
    expect(hits.moderated!()).toBe(1);
    expect(chats(mocks.third!)).toHaveLength(0);
  });

  it('answers a stream whose every target hangs before its headers with a JSON 504 at the SDK deadline, not a stream', async () => {
    const { s, mocks } = await chain([
      { name: 'primary', mock: { hangRate: 1 } },
      { name: 'backup', mock: { hangRate: 1 }, model: 'gpt-4.1' },
    ], { deadlineMarginMs: 600 });
    const err = (await sdk(s)
      .chat.completions.create({ model: 'gpt-4o', messages, stream: true }, { timeout: 2_000 })
      .catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.status).toBe(504);
    expect(err.code).toBe('deadline_exceeded');
    expect(err.headers?.get('content-type')).toMatch(/application\/json/);
    expect(chats(mocks.primary!)).toHaveLength(1);
  });

  it("skips an Anthropic fallback that cannot express n = 2, names it as not tried in the primary's error, and sends it nothing", async () => {
    const { s, mocks } = await chain([
      { name: 'primary', mock: { errors: [{ status: 503 }] } },
      { name: 'claude', mock: {}, family: 'anthropic', model: 'claude-sonnet-4-5' },
    ]);
    const err = (await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, n: 2 }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err.status).toBe(503);
    expect(err.message).toMatch(/not tried: claude\/claude-sonnet-4-5 \(.*n.*\)$/);
    expect(chats(mocks.primary!)).toHaveLength(2);
    expect(mocks.claude!.requests()).toHaveLength(0);
  });

  it('names a non-ASCII model in x-stormgate-target percent-encoded', async () => {
    const { s } = await chain([{ name: 'primary', mock: {} }]);
    const res = await sdk(s).chat.completions.create({ model: 'modèle-français', messages }).withResponse();
    expect(res.response.headers.get('x-stormgate-target')).toBe('primary/mod%C3%A8le-fran%C3%A7ais');
  });
});

describe('the one wait rule under a client deadline', () => {
  it('retries only while a backoff leaves minAttemptMs before the deadline: exactly 3 attempts in a 2 s budget at 400 ms apart', async () => {
    const { s, mocks } = await chain([{ name: 'primary', mock: { errors: [{ status: 503 }] } }], {
      retry: { maxAttempts: 10, backoff: { strategy: 'fixed', baseMs: 400, capMs: 400 } },
    });
    // 2250 ms less the 250 ms margin: a 2 s budget; retries at 400 and 800 ms leave 1.6 and 1.2 s, one at 1.2 s would leave 0.8.
    const t0 = Date.now();
    const { res, text } = await post(s, {}, { 'x-stormgate-timeout-ms': '2250' });
    expect(res.status).toBe(503);
    expect(Date.now() - t0).toBeLessThan(1_900);
    expect(res.headers.get('x-should-retry')).toBe('false');
    expect(res.headers.get('x-stormgate-attempts')).toBe('3');
    expect(chats(mocks.primary!)).toHaveLength(3);
    expect(JSON.parse(text)).toHaveProperty('error');
    expect((await requestLine(s)).retriesStopped).toBe('deadline');
  });

  it('turns a newcomer away at once with 429 provider_held_off when the hold-off outlasts its deadline, rather than parking it to its deadline', async () => {
    const { s, mocks } = await chain([{ name: 'primary', mock: { errors: [{ status: 429, headers: { 'retry-after': '5' }, times: 1 }] } }], { park: {} });
    const first = await post(s, {}, { 'x-stormgate-timeout-ms': '3000' });
    expect(first.res.status).toBe(429);
    expect(Number(first.res.headers.get('retry-after'))).toBeGreaterThanOrEqual(5);
    const t0 = Date.now();
    const second = await post(s, {}, { 'x-stormgate-timeout-ms': '3000' });
    expect(Date.now() - t0).toBeLessThan(1_000);
    expect(second.res.status).toBe(429);
    expectOpenAIError(JSON.parse(second.text), 'provider_held_off', (JSON.parse(second.text) as { error: { type: string } }).error.type);
    expect(Number(second.res.headers.get('retry-after'))).toBeGreaterThanOrEqual(4);
    expect(second.res.headers.get('x-should-retry')).toBe('true');
    expect(second.res.headers.get('retry-after-ms')).not.toBeNull();
    expect(chats(mocks.primary!)).toHaveLength(1);
  });
});

describe('an Anthropic agent on /v1/messages behind a three-deep chain', () => {
  it('moves from an overloaded 529 and a refused port to the third account; the SDK gets its message and one upstream attempt count per target', async () => {
    const overloaded = await startMock({ quiet: true, apiKey: 'a1-key', faults: { errors: [{ status: 529 }] } });
    const third = await startMock({ quiet: true, apiKey: 'a3-key' });
    const refusedUrl = `http://127.0.0.1:${await freePort()}`;
    const s = await startStack({
      config: () => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: {
          a1: { family: 'anthropic', baseUrl: overloaded.url, apiKey: 'a1-key', breaker: false },
          a2: { family: 'anthropic', baseUrl: refusedUrl, apiKey: 'a2-key', breaker: false },
          a3: { family: 'anthropic', baseUrl: third.url, apiKey: 'a3-key', breaker: false },
        },
        routes: [
          {
            name: 'agents',
            match: { path: '/v1/messages' },
            targets: [{ provider: 'a1' }, { provider: 'a2' }, { provider: 'a3', model: 'claude-haiku-4-5' }],
            retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } },
            budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 },
            park: false,
          },
        ],
      }),
    });
    const client = new Anthropic({ baseURL: s.url, apiKey: 'unused', maxRetries: 2 });
    const res = await client.messages.create({ model: 'claude-sonnet-4-6', max_tokens: 64, messages: [{ role: 'user', content: 'hi' }] }).withResponse();
    expect(res.data.model).toBe('claude-haiku-4-5');
    expect(res.data.content[0]!.type).toBe('text');
    expect(res.response.headers.get('x-stormgate-target')).toBe('a3/claude-haiku-4-5');
    expect(res.response.headers.get('x-stormgate-attempts')).toBe('5');
    expect(overloaded.requests().filter((r) => r.path === '/v1/messages')).toHaveLength(2);
    expect(third.requests().filter((r) => r.path === '/v1/messages')).toHaveLength(1);
  });
});
