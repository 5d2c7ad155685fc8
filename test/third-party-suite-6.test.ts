// A sixth third-party failure-scenario suite, written from the README as an outside team evaluating LLM gateways
// would, on the surface the earlier suites touched least: reasoning models and long-thinking agents. o-series
// requests (`max_completion_tokens`, `reasoning_effort`, `developer` messages, `stream_options.include_usage`) and
// their reasoning-token usage; a model that thinks for seconds after its headers (first-token and idle timers, pings,
// the SDK's own timeout, the route's, a stream started at the client's deadline, ghost requests); reasoning streams
// that break before their content; the Responses API with reasoning items, background responses and stored
// conversations; a reasoning request failed over to Claude (thinking back as `reasoning_content`, tool calls); Claude
// agents streaming thinking on /v1/messages; and the token-rate 429s long prompts meet. Every scenario drives a real
// gateway over HTTP with the official `openai` or `@anthropic-ai/sdk` SDK, in front of the bundled mock or a provider
// of the test's own where the wire must carry what the mock does not (reasoning deltas, thinking blocks).
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import type { FaultSpec, MockServer } from '../src/mock/server.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { expectOpenAIError } from './helpers/openai-error.ts';
import { baseResponse, cc, delta, msgItem, responsesTail, rev, scripted, textDelta, type Script, type Seen } from './helpers/scripted-provider.ts';
import { requestLine, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';

const startStack = useStacks();
const startMock = useExtraMocks();
const startProvider = useFakeProviders();

type RouteInput = ConfigInput['routes'][number];
type Timeouts = NonNullable<ConfigInput['providers'][string]['timeouts']>;
type APIError = InstanceType<typeof OpenAI.APIError>;

/** An upstream: the bundled mock with faults, or a scripted provider (the wire of a real reasoning model). */
type Upstream = ({ mock: FaultSpec } | { script: (body: Record<string, unknown>, n: number) => Script }) & {
  family?: 'openai' | 'anthropic';
  timeouts?: Timeouts;
};

interface Gw {
  s: Stack;
  mocks: Record<string, MockServer>;
  /** Requests each scripted upstream received, with their bodies. */
  seen: Record<string, Seen[]>;
  /** An openai SDK client that never retries by itself (tests that want its retries make their own). */
  openai: OpenAI;
  anthropic: Anthropic;
}

/**
 * A gateway in front of `ups` (provider name = key), breakers off, a budget that never refuses, no parking, two quick
 * attempts per target: each scenario checks its own mechanism. Routes get these defaults under their own fields.
 */
async function gateway(ups: Record<string, Upstream>, routes: RouteInput[]): Promise<Gw> {
  const mocks: Record<string, MockServer> = {};
  const seen: Record<string, Seen[]> = {};
  const providers: ConfigInput['providers'] = {};
  for (const [name, up] of Object.entries(ups)) {
    let origin: string;
    if ('mock' in up) origin = (mocks[name] = await startMock({ faults: up.mock, quiet: true, apiKey: `${name}-key` })).url;
    else origin = (await startProvider(scripted(up.script, (seen[name] = [])))).origin;
    const family = up.family ?? 'openai';
    providers[name] = {
      family,
      baseUrl: family === 'anthropic' ? origin : `${origin}/v1`,
      apiKey: `${name}-key`,
      breaker: false,
      timeouts: { connectMs: 1_000, firstTokenMs: 5_000, idleMs: 5_000, ...up.timeouts },
    };
  }
  const s = await startStack({
    config: () => ({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers,
      routes: routes.map((r) => ({
        retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } },
        budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 },
        park: false,
        ...r,
      })),
    }),
  });
  return {
    s,
    mocks,
    seen,
    openai: new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0 }),
    anthropic: new Anthropic({ baseURL: s.url, apiKey: 'sk-ant-client-not-a-provider-key', maxRetries: 0 }),
  };
}

const chatRoute = (targets: RouteInput['targets'], more: Partial<RouteInput> = {}): RouteInput => ({ name: 'chat', match: { path: '/v1/chat/completions' }, targets, ...more });
const responsesRoute = (targets: RouteInput['targets'], more: Partial<RouteInput> = {}): RouteInput => ({ name: 'responses', match: { path: '/v1/responses' }, targets, ...more });
const messagesRoute = (targets: RouteInput['targets'], more: Partial<RouteInput> = {}): RouteInput => ({ name: 'messages', match: { path: '/v1/messages' }, targets, ...more });

/** The SDK error a promise rejects with (fails the test if it resolves). */
async function rejection(p: Promise<unknown>): Promise<Error> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(Error);
  return err as Error;
}

/** Reads a stream to its end; what the SDK raised while reading it, else undefined (a clean end). */
async function drain<T>(stream: AsyncIterable<T>, each: (event: T) => void = () => undefined): Promise<Error | undefined> {
  try {
    for await (const event of stream) each(event);
    return undefined;
  } catch (e) {
    return e as Error;
  }
}

/** A metric's value summed over its series whose labels include every one of `labels` (`kind="completion"`). */
async function metric(s: Stack, name: string, ...labels: string[]): Promise<number> {
  const text = await (await fetch(`${s.url}/metrics`)).text();
  return text
    .split('\n')
    .filter((l) => l.startsWith(`${name}{`) && labels.every((x) => l.includes(x)))
    .reduce((sum, l) => sum + Number(l.split(' ').at(-1)), 0);
}

// ---- the wire of reasoning models -------------------------------------------------------------------------------

const SSE = { 'content-type': 'text/event-stream' };
const JSON_HEAD = { 'content-type': 'application/json' };
const DONE = 'data: [DONE]\n\n';
const PING = ': ping\n\n';

/** A chat stream's role chunk, as OpenAI sends it at once, before the model has thought. */
const roleChunk = cc([delta({ role: 'assistant', content: '' })]);
/** DeepSeek-R1 / vLLM style: the thinking streams as `reasoning_content` deltas before any content. */
const thought = (text: string) => cc([delta({ reasoning_content: text })]);
const said = (text: string) => cc([delta({ content: text })]);
const finished = cc([delta({}, 'stop')]);

/** An o-series usage: reasoning tokens are part of completion_tokens, as OpenAI bills them. */
const O_USAGE = {
  prompt_tokens: 64,
  completion_tokens: 1600,
  total_tokens: 1664,
  prompt_tokens_details: { cached_tokens: 0, audio_tokens: 0 },
  completion_tokens_details: { reasoning_tokens: 1536, audio_tokens: 0, accepted_prediction_tokens: 0, rejected_prediction_tokens: 0 },
};

/** Pings every `everyMs` for `forMs` (a model thinking behind a proxy's keep-alives). */
const pings = (forMs: number, everyMs = 100): Array<string | number> => Array.from({ length: Math.ceil(forMs / everyMs) }, () => [everyMs, PING]).flat();

/** An Anthropic SSE event. */
const aev = (type: string, fields: Record<string, unknown> = {}) => `event: ${type}\ndata: ${JSON.stringify({ type, ...fields })}\n\n`;
const A_START = aev('message_start', {
  message: { id: 'msg_01', type: 'message', role: 'assistant', model: 'claude-sonnet-4-6', content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 40, output_tokens: 1 } },
});
const aThinkingOpen = aev('content_block_start', { index: 0, content_block: { type: 'thinking', thinking: '', signature: '' } });
const aThinking = (text: string) => aev('content_block_delta', { index: 0, delta: { type: 'thinking_delta', thinking: text } });
const aSignature = aev('content_block_delta', { index: 0, delta: { type: 'signature_delta', signature: 'EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds' } });
const aTextBlock = (text: string) => [
  aev('content_block_stop', { index: 0 }),
  aev('content_block_start', { index: 1, content_block: { type: 'text', text: '' } }),
  aev('content_block_delta', { index: 1, delta: { type: 'text_delta', text } }),
  aev('content_block_stop', { index: 1 }),
  aev('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 120 } }),
  aev('message_stop'),
];
/** A whole Anthropic message with `content` blocks. */
const aMessage = (content: unknown[], stop = 'end_turn') =>
  JSON.stringify({ id: 'msg_01', type: 'message', role: 'assistant', model: 'claude-sonnet-4-6', content, stop_reason: stop, stop_sequence: null, usage: { input_tokens: 40, output_tokens: 120 } });

/** A Responses API reasoning item (no summary asked for: what o-series models emit while they think). */
const reasoningItem = { id: 'rs_1', type: 'reasoning', summary: [] };

// An o-series request as an agent in 2026 sends it: a developer message, the newer token cap, an effort level.
const O_MESSAGES = [
  { role: 'developer' as const, content: 'You are a careful planner. Answer in one word.' },
  { role: 'user' as const, content: 'What is six times seven?' },
];

// ---------------------------------------------------------------------------------------------------------------
describe('o-series requests to an OpenAI target', () => {
  it('pass max_completion_tokens, reasoning_effort, developer messages and stream_options through intact; the reasoning usage reaches the SDK and the token metrics', async () => {
    const g = await gateway({ o: { script: () => ({ headers: SSE, steps: [roleChunk, said('42'), cc([delta({}, 'stop')], { usage: null }), cc([], { usage: O_USAGE }), DONE] }) } }, [chatRoute([{ provider: 'o' }])]);
    const body = {
      model: 'o4-mini',
      messages: O_MESSAGES,
      max_completion_tokens: 4096,
      reasoning_effort: 'high' as const,
      verbosity: 'low' as const,
      store: false,
      stream: true as const,
      stream_options: { include_usage: true },
    };
    let text = '';
    let usage: OpenAI.CompletionUsage | null | undefined;
    const err = await drain(await g.openai.chat.completions.create(body), (c) => {
      text += c.choices[0]?.delta?.content ?? '';
      if (c.usage) usage = c.usage;
    });
    expect(err).toBeUndefined();
    expect(text).toBe('42');
    expect(g.seen.o).toHaveLength(1);
    expect(g.seen.o![0]!.body).toEqual(body); // nothing renamed, dropped or defaulted on the way
    expect(usage?.completion_tokens_details?.reasoning_tokens).toBe(1536);
    expect(await metric(g.s, 'stormgate_tokens_total', 'kind="completion"')).toBe(1600);
    expect(await metric(g.s, 'stormgate_tokens_total', 'kind="prompt"')).toBe(64);
  });

  it('bills a whole o-series answer by its usage, reasoning tokens included, and hands the SDK completion_tokens_details', async () => {
    const answer = { id: 'chatcmpl-o', object: 'chat.completion', created: 1, model: 'o3-2025-04-16', choices: [{ index: 0, message: { role: 'assistant', content: '42', refusal: null }, finish_reason: 'stop' }], usage: O_USAGE };
    const g = await gateway({ o: { script: () => ({ headers: JSON_HEAD, steps: [JSON.stringify(answer)] }) } }, [chatRoute([{ provider: 'o' }])]);
    const res = await g.openai.chat.completions.create({ model: 'o3', messages: O_MESSAGES, max_completion_tokens: 2048, reasoning_effort: 'medium' });
    expect(res.choices[0]!.message.content).toBe('42');
    expect(res.usage?.completion_tokens_details?.reasoning_tokens).toBe(1536);
    expect(g.seen.o![0]!.body).toMatchObject({ max_completion_tokens: 2048, reasoning_effort: 'medium', messages: O_MESSAGES });
    expect(g.seen.o![0]!.body).not.toHaveProperty('max_tokens');
    expect(await metric(g.s, 'stormgate_tokens_total', 'kind="completion"')).toBe(1600);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('a model that thinks after its headers', () => {
  it('counts a reasoning_content delta as the first output: a thinker streaming its thoughts is not timed out at firstTokenMs', async () => {
    // firstTokenMs 1 s; the thoughts start at 100 ms and the answer's text comes at ~1.7 s. The timers leave 800 ms
    // or more for a loaded CI machine, which can starve the gateway for a few hundred ms while bytes wait in its socket.
    const thoughts = ['Six', ' times', ' seven', ' is', ' forty-two.'];
    const g = await gateway(
      { r1: { timeouts: { firstTokenMs: 1_000, idleMs: 2_000 }, script: () => ({ headers: SSE, steps: [roleChunk, ...thoughts.flatMap((t) => [100, thought(t)]), 1_200, said('42'), finished, DONE] }) } },
      [chatRoute([{ provider: 'r1' }])],
    );
    let reasoning = '';
    let text = '';
    const err = await drain(await g.openai.chat.completions.create({ model: 'deepseek-reasoner', messages: O_MESSAGES, stream: true }), (c) => {
      const d = c.choices[0]?.delta as { content?: string | null; reasoning_content?: string } | undefined;
      reasoning += d?.reasoning_content ?? '';
      text += d?.content ?? '';
    });
    expect(err).toBeUndefined();
    expect(reasoning).toBe(thoughts.join(''));
    expect(text).toBe('42');
    expect(g.seen.r1).toHaveLength(1);
    const line = await requestLine(g.s);
    expect(line.ttftMs).toBeLessThan(1_000);
  });

  it('does not count pings as output: a thinker that only pings past firstTokenMs is timed out and retried, and the retry answers', async () => {
    const g = await gateway(
      {
        o: {
          timeouts: { firstTokenMs: 500, idleMs: 5_000 },
          script: (_b, n) => (n === 1 ? { headers: SSE, steps: [roleChunk, ...pings(3_000)], hold: true } : { headers: SSE, steps: [roleChunk, said('42'), finished, DONE] }),
        },
      },
      [chatRoute([{ provider: 'o' }])],
    );
    const started = Date.now();
    const { data: stream, response } = await g.openai.chat.completions.create({ model: 'o4-mini', messages: O_MESSAGES, stream: true }).withResponse();
    let text = '';
    expect(await drain(stream, (c) => (text += c.choices[0]?.delta?.content ?? ''))).toBeUndefined();
    expect(text).toBe('42');
    expect(Date.now() - started).toBeGreaterThanOrEqual(450);
    expect(Date.now() - started).toBeLessThan(2_500);
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(g.seen.o).toHaveLength(2);
    expect(g.seen.o![1]!.headers['x-retry-reason']).toBe('timeout_first_token');
  });

  it("starts the stream at the SDK's own deadline when the model is still thinking, and the answer then arrives after it", async () => {
    // The SDK's per-request timeout (2 s, sent as x-stainless-timeout) is far shorter than the route's (30 s) and
    // firstTokenMs (10 s); the model pings, then answers at ~2.6 s. Direct, the SDK would have its headers at once.
    const g = await gateway(
      { o: { timeouts: { firstTokenMs: 10_000, idleMs: 1_000 }, script: () => ({ headers: SSE, steps: [roleChunk, ...pings(2_600, 200), said('42'), finished, DONE] }) } },
      [chatRoute([{ provider: 'o' }], { timeoutMs: 30_000 })],
    );
    const client = new OpenAI({ baseURL: g.s.baseURL, apiKey: 'sk-client', maxRetries: 2 });
    const started = Date.now();
    const { data: stream, response } = await client.chat.completions.create({ model: 'o3', messages: O_MESSAGES, stream: true }, { timeout: 2_000 }).withResponse();
    const headAfterMs = Date.now() - started;
    let text = '';
    expect(await drain(stream, (c) => (text += c.choices[0]?.delta?.content ?? ''))).toBeUndefined();
    expect(response.status).toBe(200);
    // Deadline 2 s less the 250 ms margin: the head comes at ~1.75 s, not at the first ping, nor with the first token.
    expect(headAfterMs).toBeGreaterThanOrEqual(1_600);
    expect(headAfterMs).toBeLessThan(2_000);
    expect(text).toBe('42');
    expect(g.seen.o).toHaveLength(1);
    expect(g.seen.o![0]!.headers['x-stainless-timeout']).toBeUndefined(); // the client's timeout is the gateway's to keep
    const line = await requestLine(g.s);
    expect(line.startedEarly).toBe(true);
    expect(line.ttftMs).toBeGreaterThanOrEqual(2_400);
  });

  it('leaves no retry once the stream started at the deadline: a thinker cut after it is an error the SDK raises, sent upstream once', async () => {
    const g = await gateway({ o: { timeouts: { firstTokenMs: 10_000, idleMs: 1_000 }, script: () => ({ headers: SSE, steps: [roleChunk, ...pings(2_200, 200), { destroy: true }] }) } }, [
      chatRoute([{ provider: 'o' }], { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } }),
    ]);
    const { data: stream, response } = await g.openai.chat.completions.create({ model: 'o3', messages: O_MESSAGES, stream: true }, { timeout: 2_000 }).withResponse();
    expect(response.status).toBe(200);
    const err = await drain(stream);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as APIError).code).toBe('stream_interrupted');
    expect(g.seen.o).toHaveLength(1);
    const line = await requestLine(g.s);
    expect(line.startedEarly).toBe(true);
    expect(line.outcome).toBe('stream_error');
  });

  it('keeps a thinker that pauses between thoughts alive on its pings past idleMs, once its first thought is out', async () => {
    // Pings 200 ms apart against idleMs 1 s: 800 ms for a loaded CI machine's lag (500 ms left it 300).
    const g = await gateway(
      { r1: { timeouts: { firstTokenMs: 1_000, idleMs: 1_000 }, script: () => ({ headers: SSE, steps: [roleChunk, thought('Hmm,'), ...pings(2_000, 200), thought(' yes.'), said('42'), finished, DONE] }) } },
      [chatRoute([{ provider: 'r1' }])],
    );
    let text = '';
    expect(await drain(await g.openai.chat.completions.create({ model: 'deepseek-reasoner', messages: O_MESSAGES, stream: true }), (c) => (text += c.choices[0]?.delta?.content ?? ''))).toBeUndefined();
    expect(text).toBe('42');
    expect(g.seen.r1).toHaveLength(1);
  });

  it("bounds a retry started early at the deadline by what is left of its own firstTokenMs: its error the SDK raises, never idleMs's wait", async () => {
    // Headers and role chunk at once, the first token 2.4 s later. firstTokenMs 1 s: the first attempt times out and
    // is retried at ~1 s; that retry is in flight at the client's deadline (1.75 s) and starts early; its first token
    // would come at ~3.4 s, past the retry's firstTokenMs (~2 s): the README's early start keeps that bound, so the
    // stream ends with the stall error at ~2 s, however long idleMs (5 s) is.
    const g = await gateway({ o: { timeouts: { firstTokenMs: 1_000, idleMs: 5_000 }, mock: { stream: { firstTokenDelayMs: 2_400, chunks: 2 } } } }, [
      chatRoute([{ provider: 'o' }], { minAttemptMs: 200 }),
    ]);
    const started = Date.now();
    const { data: stream, response } = await g.openai.chat.completions.create({ model: 'o3', messages: O_MESSAGES, stream: true }, { timeout: 2_000 }).withResponse();
    let text = '';
    const err = await drain(stream, (c) => (text += c.choices[0]?.delta?.content ?? ''));
    expect(response.status).toBe(200);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(String((err as Error).message)).toMatch(/no first token within 1000 ms/);
    expect(text).toBe('');
    expect(Date.now() - started).toBeLessThan(3_300);
    expect(g.mocks.o!.requests()).toHaveLength(2);
    expect(await requestLine(g.s)).toMatchObject({ startedEarly: true, streamEnd: 'stalled', outcome: 'stream_error' });
  });

  it("answers 504 at the route's timeoutMs while the model still thinks (the operator's bound, no early start), which the SDK does not retry", async () => {
    let closedAt = 0;
    const g = await gateway({ o: { timeouts: { firstTokenMs: 10_000, idleMs: 1_000 }, script: () => ({ headers: SSE, steps: [roleChunk, ...pings(5_000, 200), said('late'), finished, DONE] }) } }, [
      chatRoute([{ provider: 'o' }], { timeoutMs: 1_000 }),
    ]);
    const client = new OpenAI({
      baseURL: g.s.baseURL,
      apiKey: 'sk-client',
      maxRetries: 2,
      fetch: async (url, init) => {
        const res = await fetch(url, init);
        closedAt = Date.now();
        return res;
      },
    });
    const started = Date.now();
    const err = (await rejection(client.chat.completions.create({ model: 'o3', messages: O_MESSAGES, stream: true }))) as APIError;
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.status).toBe(504);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expectOpenAIError({ error: err.error }, 'deadline_exceeded', 'server_error');
    // timeoutMs less the 250 ms margin: 750 ms.
    expect(closedAt - started).toBeGreaterThanOrEqual(700);
    expect(closedAt - started).toBeLessThan(1_600);
    expect(g.seen.o).toHaveLength(1); // neither the gateway nor the SDK asked again
  });

  it.each([
    ['non-streaming, cut by responseMs', false, { responseMs: 500 }],
    ['streaming, no headers before firstTokenMs', true, { firstTokenMs: 500 }],
  ] as const)(
    'never leaves a retried slow thinker running upstream past the client\'s deadline (%s)',
    async (_name, stream, timeouts) => {
      // Each attempt thinks for 4 s before its headers; the SDK gives up at 2 s and would retry twice itself.
      const g = await gateway({ o: { timeouts: { firstTokenMs: 10_000, idleMs: 5_000, ...timeouts }, mock: { latencyMs: 4_000 } } }, [
        chatRoute([{ provider: 'o' }], { retry: { maxAttempts: 5, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } }, minAttemptMs: 200 }),
      ]);
      const client = new OpenAI({ baseURL: g.s.baseURL, apiKey: 'sk-client', maxRetries: 2 });
      const started = Date.now();
      const err = (await rejection(client.chat.completions.create({ model: 'o3', messages: O_MESSAGES, stream }, { timeout: 2_000 }))) as APIError;
      const answeredAt = Date.now();
      expect(err).toBeInstanceOf(OpenAI.APIError); // the gateway's answer, not the SDK's own timeout
      expect(err.status).toBe(504);
      expect(err.headers?.get('x-should-retry')).toBe('false');
      expect(answeredAt - started).toBeLessThan(2_000);
      const mock = g.mocks.o!;
      // The aborts reach the provider a moment after the client's answer on a loaded machine; a ghost stays in flight.
      await expect.poll(() => mock.stats().inflight, { timeout: 2_000 }).toBe(0);
      const sent = mock.requests().filter((r) => r.path === '/v1/chat/completions');
      expect(sent.length).toBeGreaterThanOrEqual(2); // the gateway did retry the thinker in the time it had
      expect(sent.length).toBeLessThanOrEqual(4);
      for (const r of sent) {
        expect(r.aborted).toBe(true);
        expect(r.endedAt).toBeDefined();
        expect(r.endedAt! - started).toBeLessThan(2_000); // no ghost: every upstream request ended before the client's deadline
      }
    },
  );
});

// ---------------------------------------------------------------------------------------------------------------
describe('a reasoning stream that breaks before its content', () => {
  it('raises an error in the SDK (never a clean end) when cut after the thoughts, and is not retried: the first output went out', async () => {
    const g = await gateway({ r1: { script: () => ({ headers: SSE, steps: [roleChunk, thought('Let me'), 50, thought(' think.'), 50, { destroy: true }] }) } }, [
      chatRoute([{ provider: 'r1' }]),
    ]);
    let reasoning = '';
    const err = await drain(await g.openai.chat.completions.create({ model: 'deepseek-reasoner', messages: O_MESSAGES, stream: true }), (c) => {
      reasoning += (c.choices[0]?.delta as { reasoning_content?: string } | undefined)?.reasoning_content ?? '';
    });
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(String(err)).toMatch(/interrupt|cut|broke|connection/i);
    expect(reasoning).toBe('Let me think.');
    expect(g.seen.r1).toHaveLength(1);
    expect((await requestLine(g.s)).streamEnd).toBe('cut');
  });

  it('raises an error in the SDK when the thinking stalls past idleMs', async () => {
    const g = await gateway({ r1: { timeouts: { idleMs: 400 }, script: () => ({ headers: SSE, steps: [roleChunk, thought('Hmm.')], hold: true }) } }, [chatRoute([{ provider: 'r1' }])]);
    const started = Date.now();
    const err = await drain(await g.openai.chat.completions.create({ model: 'deepseek-reasoner', messages: O_MESSAGES, stream: true }));
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(String(err)).toMatch(/stall/i);
    expect(Date.now() - started).toBeLessThan(2_000);
    expect(g.seen.r1).toHaveLength(1);
  });

  // streamRecovery continues "the rest of a text answer"; a stream cut after its thoughts alone has no text to continue
  // from, so the next target is asked the request afresh, and its reasoning and text carry on the client's stream.
  it('with streamRecovery on, finishes a stream cut after its thoughts but before any text from the next target', async () => {
    const g = await gateway(
      {
        r1: { script: () => ({ headers: SSE, steps: [roleChunk, thought('Let me think.'), 50, { destroy: true }] }) },
        r2: { script: () => ({ headers: SSE, steps: [roleChunk, said('Forty'), said('-two.'), finished, DONE] }) },
      },
      [chatRoute([{ provider: 'r1' }, { provider: 'r2' }], { streamRecovery: 'continue' })],
    );
    let text = '';
    let reasoning = '';
    const err = await drain(await g.openai.chat.completions.create({ model: 'deepseek-reasoner', messages: O_MESSAGES, stream: true }), (c) => {
      text += c.choices[0]?.delta?.content ?? '';
      reasoning += (c.choices[0]?.delta as { reasoning_content?: string } | undefined)?.reasoning_content ?? '';
    });
    expect(err).toBeUndefined();
    expect(reasoning).toBe('Let me think.');
    expect(text).toBe('Forty-two.');
    expect(g.seen.r2).toHaveLength(1);
    expect(await metric(g.s, 'stormgate_stream_ends_total', 'end="recovered"')).toBe(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('the Responses API with reasoning', () => {
  it('passes reasoning effort and encrypted reasoning through, and counts a finished reasoning item as output, so a silent thinker is not timed out', async () => {
    // firstTokenMs 1 s: the reasoning item (no summary asked for) is done at 200 ms; the text comes at ~1.5 s. The
    // margins (800 ms, 700 ms) are for a loaded CI machine, which can starve the gateway while bytes wait in its socket.
    const text = 'Forty-two.';
    const g = await gateway(
      {
        o: {
          timeouts: { firstTokenMs: 1_000, idleMs: 2_000 },
          script: () => ({
            headers: SSE,
            steps: [
              rev('response.created', { response: baseResponse('in_progress') }, 0),
              rev('response.in_progress', { response: baseResponse('in_progress') }, 1),
              rev('response.output_item.added', { output_index: 0, item: reasoningItem }, 2),
              200,
              rev('response.output_item.done', { output_index: 0, item: { ...reasoningItem, encrypted_content: 'gAAAAB-opaque' } }, 3),
              1_300,
              rev('response.output_item.added', { output_index: 1, item: msgItem('', 'in_progress') }, 4),
              rev('response.content_part.added', { item_id: 'msg_1', output_index: 1, content_index: 0, part: { type: 'output_text', text: '', annotations: [] } }, 5),
              textDelta(text, 6),
              ...responsesTail(text, 7),
            ],
          }),
        },
      },
      [responsesRoute([{ provider: 'o' }])],
    );
    const body = {
      model: 'o3',
      input: 'What is six times seven?',
      reasoning: { effort: 'high' as const, summary: null },
      include: ['reasoning.encrypted_content' as const],
      max_output_tokens: 8_000,
      store: false,
      stream: true as const,
    };
    const types: string[] = [];
    let out = '';
    const err = await drain(await g.openai.responses.create(body), (e) => {
      types.push(e.type);
      if (e.type === 'response.output_text.delta') out += e.delta;
    });
    expect(err).toBeUndefined();
    expect(out).toBe(text);
    expect(types.at(-1)).toBe('response.completed');
    expect(g.seen.o).toHaveLength(1);
    expect(g.seen.o![0]!.body).toEqual(body);
  });

  it("starts a Responses stream at the SDK's deadline while its model reasons in silence, and bills its usage", async () => {
    const text = 'Forty-two.';
    const g = await gateway(
      {
        o: {
          timeouts: { firstTokenMs: 10_000, idleMs: 5_000 },
          script: () => ({
            headers: SSE,
            steps: [
              rev('response.created', { response: baseResponse('in_progress') }, 0),
              rev('response.in_progress', { response: baseResponse('in_progress') }, 1),
              2_600, // reasoning, no summary asked for
              rev('response.output_item.added', { output_index: 0, item: msgItem('', 'in_progress') }, 2),
              textDelta(text, 3),
              ...responsesTail(text, 4),
            ],
          }),
        },
      },
      [responsesRoute([{ provider: 'o' }], { timeoutMs: 30_000 })],
    );
    const started = Date.now();
    const { data: stream } = await g.openai.responses.create({ model: 'o3', input: 'What is six times seven?', reasoning: { effort: 'high' }, stream: true }, { timeout: 2_000 }).withResponse();
    const headAfterMs = Date.now() - started;
    let out = '';
    let completed: OpenAI.Responses.Response | undefined;
    const err = await drain(stream, (e) => {
      if (e.type === 'response.output_text.delta') out += e.delta;
      if (e.type === 'response.completed') completed = e.response;
    });
    expect(err).toBeUndefined();
    expect(headAfterMs).toBeGreaterThanOrEqual(1_600);
    expect(headAfterMs).toBeLessThan(2_000);
    expect(out).toBe(text);
    expect(completed?.usage?.output_tokens).toBe(2);
    expect(g.seen.o).toHaveLength(1);
    expect((await requestLine(g.s, 'responses')).startedEarly).toBe(true);
    expect(await metric(g.s, 'stormgate_tokens_total', 'kind="completion"')).toBe(2);
  });

  it.each([
    ['previous_response_id', { previous_response_id: 'resp_earlier_turn' }],
    ['background: true', { background: true }],
  ] as const)('never fails a request with %s over to another provider, where its stored state is not', async (_name, extra) => {
    const g = await gateway({ a: { mock: { errors: [{ status: 503 }] } }, b: { mock: {} } }, [responsesRoute([{ provider: 'a' }, { provider: 'b' }])]);
    const err = (await rejection(g.openai.responses.create({ model: 'o3', input: 'and then?', ...extra }))) as APIError;
    expect(err.status).toBe(503);
    expect(g.mocks.b!.requests()).toHaveLength(0);
    expect(g.mocks.a!.requests()).toHaveLength(2);
    // Without the stored state, the same outage is failed over.
    const res = await g.openai.responses.create({ model: 'o3', input: 'a new conversation' }).withResponse();
    expect(res.response.headers.get('x-stormgate-target')).toMatch(/^b/);
    expect(g.mocks.b!.requests()).toHaveLength(1);
  });

  it('starts a background stream at response.created, and lets its model think in silence longer than idleMs (up to firstTokenMs)', async () => {
    const bg = (status: string, output: unknown[] = []) => ({ ...baseResponse(status, output), background: true });
    const text = 'Done thinking.';
    const g = await gateway(
      {
        o: {
          timeouts: { firstTokenMs: 3_000, idleMs: 400 },
          script: () => ({
            headers: SSE,
            steps: [
              rev('response.created', { response: bg('queued') }, 0),
              1_000, // thinking, no summary: silence longer than idleMs
              rev('response.in_progress', { response: bg('in_progress') }, 1),
              rev('response.output_item.added', { output_index: 0, item: msgItem('', 'in_progress') }, 2),
              textDelta(text, 3),
              ...responsesTail(text, 4),
            ],
          }),
        },
      },
      [responsesRoute([{ provider: 'o' }])],
    );
    const started = Date.now();
    let firstAt = 0;
    let out = '';
    const stream = await g.openai.responses.create({ model: 'o3-pro', input: 'Plan the migration.', background: true, stream: true, reasoning: { effort: 'high' } });
    const err = await drain(stream, (e) => {
      firstAt ||= Date.now();
      if (e.type === 'response.output_text.delta') out += e.delta;
    });
    expect(err).toBeUndefined();
    expect(firstAt - started).toBeLessThan(700); // the client has the id to poll by at once
    expect(out).toBe(text);
    expect(g.seen.o).toHaveLength(1);
  });

  it('does not retry a background stream cut after response.created (the job runs on at the provider): the SDK raises, with the id in hand', async () => {
    const g = await gateway(
      { o: { script: () => ({ headers: SSE, steps: [rev('response.created', { response: { ...baseResponse('queued'), background: true } }, 0), 100, { destroy: true }] }) } },
      [responsesRoute([{ provider: 'o' }])],
    );
    let id: string | undefined;
    const err = await drain(await g.openai.responses.create({ model: 'o3-pro', input: 'Plan the migration.', background: true, stream: true }), (e) => {
      if (e.type === 'response.created') id = e.response.id;
    });
    expect(err).toBeInstanceOf(Error);
    expect(id).toBe('resp_abc123');
    expect(g.seen.o).toHaveLength(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('a reasoning request failed over to Claude', () => {
  /** An OpenAI primary answering 503 to everything, and Claude (a scripted Anthropic provider) as its backup. */
  const claudeBackup = (claude: Upstream) =>
    gateway({ o: { mock: { errors: [{ status: 503 }] } }, claude: { ...claude, family: 'anthropic' } }, [chatRoute([{ provider: 'o' }, { provider: 'claude', model: 'claude-sonnet-4-6' }])]);

  it('sends max_completion_tokens as max_tokens, the developer message as the system prompt and reasoning_effort as thinking within half of max_tokens, and hands thinking back as reasoning_content', async () => {
    const g = await claudeBackup({
      script: () => ({ headers: JSON_HEAD, steps: [aMessage([{ type: 'thinking', thinking: '6 x 7 = 42.', signature: 'sig' }, { type: 'text', text: 'Forty-two.' }])] }),
    });
    const { data, response } = await g.openai.chat.completions.create({ model: 'o3', messages: O_MESSAGES, max_completion_tokens: 3_000, reasoning_effort: 'high' }).withResponse();
    expect(response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    const message = data.choices[0]!.message as OpenAI.ChatCompletionMessage & { reasoning_content?: string };
    expect(message.content).toBe('Forty-two.');
    expect(message.reasoning_content).toBe('6 x 7 = 42.');
    expect(data.choices[0]!.finish_reason).toBe('stop');
    expect(data.model).toBe('claude-sonnet-4-6');
    const sent = g.seen.claude![0]!.body;
    expect(sent.max_tokens).toBe(3_000);
    expect(JSON.stringify(sent.system)).toContain('You are a careful planner.');
    expect((sent.messages as Array<{ role: string }>).map((m) => m.role)).toEqual(['user']); // the developer message is not a turn
    expect(sent.thinking).toEqual({ type: 'enabled', budget_tokens: 1_500 }); // high is 16384, but the answer keeps half of 3000
    for (const k of ['max_completion_tokens', 'reasoning_effort', 'developer']) expect(sent).not.toHaveProperty(k);
  });

  it('moves a non-streaming o-series call that thinks past responseMs to Claude after one attempt, well within the SDK timeout', async () => {
    const g = await gateway(
      {
        o: { mock: { latencyMs: 4_000 }, timeouts: { responseMs: 500 } },
        claude: { family: 'anthropic', script: () => ({ headers: JSON_HEAD, steps: [aMessage([{ type: 'thinking', thinking: 'Quick sum.', signature: 'sig' }, { type: 'text', text: 'Forty-two.' }])] }) },
      },
      [chatRoute([{ provider: 'o' }, { provider: 'claude', model: 'claude-sonnet-4-6' }], { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } })],
    );
    const started = Date.now();
    const { data, response } = await g.openai.chat.completions.create({ model: 'o3', messages: O_MESSAGES, max_completion_tokens: 1_000 }, { timeout: 3_000 }).withResponse();
    expect(Date.now() - started).toBeLessThan(1_500);
    expect(response.headers.get('x-stormgate-fallback')).toBe('timeout');
    expect((data.choices[0]!.message as { reasoning_content?: string }).reasoning_content).toBe('Quick sum.');
    expect(g.mocks.o!.requests()).toHaveLength(1); // a silent target is not retried when another can answer
    expect(g.seen.claude![0]!.body.max_tokens).toBe(1_000);
  });

  it('streams thinking deltas back as reasoning_content chunks before the text, ending in [DONE], with the usage billed to Claude', async () => {
    // firstTokenMs 1 s, the first thinking delta at 100 ms and the text at 1.5 s: 900 ms for a loaded CI machine's lag.
    const g = await claudeBackup({
      timeouts: { firstTokenMs: 1_000 },
      script: () => ({ headers: SSE, steps: [A_START, aThinkingOpen, aev('ping'), 100, aThinking('Six sevens'), 700, aThinking(' are 42.'), aSignature, 700, ...aTextBlock('Forty-two.')] }),
    });
    let reasoning = '';
    let text = '';
    let order = '';
    let usage: OpenAI.CompletionUsage | undefined;
    const stream = await g.openai.chat.completions.create({ model: 'o3', messages: O_MESSAGES, stream: true, stream_options: { include_usage: true }, max_completion_tokens: 2_000 });
    const err = await drain(stream, (c) => {
      const d = c.choices[0]?.delta as { content?: string | null; reasoning_content?: string } | undefined;
      if (d?.reasoning_content) (reasoning += d.reasoning_content), (order += 'r');
      if (d?.content) (text += d.content), (order += 't');
      if (c.usage) usage = c.usage;
    });
    expect(err).toBeUndefined();
    expect(reasoning).toBe('Six sevens are 42.');
    expect(text).toBe('Forty-two.');
    expect(order).toMatch(/^r+t+$/);
    expect(usage).toMatchObject({ prompt_tokens: 40, completion_tokens: 120 });
    expect(g.seen.claude).toHaveLength(1); // the thinking deltas were output: firstTokenMs (1 s) did not cut a 1.5 s think
    expect(await metric(g.s, 'stormgate_tokens_total', 'kind="completion"', 'claude')).toBe(120);
  });

  it("starts a translated thinking stream at the SDK's deadline, when Claude is the only target", async () => {
    const g = await gateway(
      { claude: { family: 'anthropic', timeouts: { firstTokenMs: 10_000, idleMs: 1_000 }, script: () => ({ headers: SSE, steps: [A_START, aThinkingOpen, ...pings(2_600, 200).map((x) => (x === PING ? aev('ping') : x)), aThinking('Done.'), aSignature, ...aTextBlock('Forty-two.')] }) } },
      [chatRoute([{ provider: 'claude', model: 'claude-sonnet-4-6' }], { timeoutMs: 30_000 })],
    );
    const started = Date.now();
    const { data: stream } = await g.openai.chat.completions.create({ model: 'o3', messages: O_MESSAGES, stream: true }, { timeout: 2_000 }).withResponse();
    const headAfterMs = Date.now() - started;
    let reasoning = '';
    let text = '';
    const err = await drain(stream, (c) => {
      const d = c.choices[0]?.delta as { content?: string | null; reasoning_content?: string } | undefined;
      reasoning += d?.reasoning_content ?? '';
      text += d?.content ?? '';
    });
    expect(err).toBeUndefined();
    expect(headAfterMs).toBeGreaterThanOrEqual(1_600);
    expect(headAfterMs).toBeLessThan(2_000);
    expect(reasoning).toBe('Done.');
    expect(text).toBe('Forty-two.');
    expect(g.seen.claude).toHaveLength(1);
  });

  it("answers the primary's outage, not Claude's 400, when an o-series max_completion_tokens is past Claude's maximum", async () => {
    const tooMany = { type: 'error', error: { type: 'invalid_request_error', message: 'max_tokens: 100000 > 64000, which is the maximum allowed number of output tokens for claude-sonnet-4-6' } };
    const g = await claudeBackup({ script: () => ({ status: 400, headers: JSON_HEAD, steps: [JSON.stringify(tooMany)] }) });
    const err = (await rejection(g.openai.chat.completions.create({ model: 'o3', messages: O_MESSAGES, max_completion_tokens: 100_000, reasoning_effort: 'high' }))) as APIError;
    expect(err.status).toBe(503);
    expect(err.message).toMatch(/rejected the request \(400: max_tokens: 100000 > 64000/);
    expect(g.seen.claude![0]!.body.max_tokens).toBe(100_000);
  });

  it('hands back a tool call made after thinking, and sends the next turn (tool call and result) as Anthropic takes it', async () => {
    const g = await claudeBackup({
      script: (_b, n) =>
        n === 1
          ? { headers: JSON_HEAD, steps: [aMessage([{ type: 'thinking', thinking: 'I need the weather.', signature: 'sig' }, { type: 'tool_use', id: 'toolu_01', name: 'get_weather', input: { city: 'Lisbon' } }], 'tool_use')] }
          : { headers: JSON_HEAD, steps: [aMessage([{ type: 'text', text: 'Sunny, 24 C.' }])] },
    });
    const tools: OpenAI.ChatCompletionTool[] = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
    const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: 'developer', content: 'Use tools.' }, { role: 'user', content: 'Weather in Lisbon?' }];
    const first = await g.openai.chat.completions.create({ model: 'o3', messages, tools, reasoning_effort: 'low' });
    const msg = first.choices[0]!.message as OpenAI.ChatCompletionMessage & { reasoning_content?: string };
    expect(first.choices[0]!.finish_reason).toBe('tool_calls');
    expect(msg.reasoning_content).toBe('I need the weather.');
    const call = msg.tool_calls![0]! as OpenAI.ChatCompletionMessageFunctionToolCall;
    expect(call.function.name).toBe('get_weather');
    expect(JSON.parse(call.function.arguments)).toEqual({ city: 'Lisbon' });
    // The agent sends the assistant message back as it got it (reasoning_content included), with the tool's result.
    const second = await g.openai.chat.completions.create({ model: 'o3', tools, messages: [...messages, msg as OpenAI.ChatCompletionAssistantMessageParam, { role: 'tool', tool_call_id: call.id, content: '{"sky":"sunny","c":24}' }] });
    expect(second.choices[0]!.message.content).toBe('Sunny, 24 C.');
    const sent = g.seen.claude![1]!.body as { messages: Array<{ role: string; content: Array<Record<string, unknown>> }> };
    expect(sent.messages.map((m) => m.role)).toEqual(['user', 'assistant', 'user']);
    const use = sent.messages[1]!.content.find((b) => b.type === 'tool_use')!;
    expect(use).toMatchObject({ name: 'get_weather', input: { city: 'Lisbon' } });
    expect(sent.messages[2]!.content[0]).toMatchObject({ type: 'tool_result', tool_use_id: use.id });
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('Claude agents thinking on /v1/messages', () => {
  const thinkingParams = {
    model: 'claude-sonnet-4-6',
    max_tokens: 16_000,
    thinking: { type: 'enabled' as const, budget_tokens: 8_000 },
    messages: [{ role: 'user' as const, content: 'Refactor the billing module.' }],
  };

  it('forwards the thinking request as it is and counts a thinking delta as the first output, not the pings before it', async () => {
    const g = await gateway(
      // firstTokenMs 1 s, the first thinking delta at 150 ms and the text at 1.35 s: room for a loaded CI machine's lag.
      { claude: { family: 'anthropic', timeouts: { firstTokenMs: 1_000, idleMs: 2_000 }, script: () => ({ headers: SSE, steps: [A_START, aThinkingOpen, aev('ping'), 150, aThinking('First, the'), 600, aThinking(' invoices.'), aSignature, 600, ...aTextBlock('Plan ready.')] }) } },
      [messagesRoute([{ provider: 'claude' }])],
    );
    const final = await g.anthropic.messages.stream(thinkingParams).finalMessage();
    expect(final.content.map((b) => b.type)).toEqual(['thinking', 'text']);
    expect(final.content[0]).toMatchObject({ type: 'thinking', thinking: 'First, the invoices.' });
    expect(final.content[1]).toMatchObject({ type: 'text', text: 'Plan ready.' });
    expect(g.seen.claude).toHaveLength(1);
    expect(g.seen.claude![0]!.body).toEqual({ ...thinkingParams, stream: true });
    expect(await metric(g.s, 'stormgate_tokens_total', 'kind="completion"')).toBe(120);
    expect(await metric(g.s, 'stormgate_tokens_total', 'kind="prompt"')).toBe(40);
  });

  it('retries a stream that only pinged past firstTokenMs (empty thinking block, no delta), and the retry answers', async () => {
    const g = await gateway(
      {
        claude: {
          family: 'anthropic',
          timeouts: { firstTokenMs: 500, idleMs: 5_000 },
          script: (_b, n) =>
            n === 1
              ? { headers: SSE, steps: [A_START, aThinkingOpen, ...pings(3_000).map((x) => (x === PING ? aev('ping') : x))], hold: true }
              : { headers: SSE, steps: [A_START, aThinkingOpen, aThinking('Quick.'), aSignature, ...aTextBlock('Plan ready.')] },
        },
      },
      [messagesRoute([{ provider: 'claude' }])],
    );
    const final = await g.anthropic.messages.stream(thinkingParams).finalMessage();
    expect(final.content[1]).toMatchObject({ type: 'text', text: 'Plan ready.' });
    expect(g.seen.claude).toHaveLength(2);
    expect(g.seen.claude![1]!.headers['x-retry-reason']).toBe('timeout_first_token');
  });

  it("starts a thinking stream at the Anthropic SDK's own timeout (sent for its client-wide timeout too), so the SDK does not give up on it", async () => {
    const g = await gateway(
      { claude: { family: 'anthropic', timeouts: { firstTokenMs: 10_000, idleMs: 1_000 }, script: () => ({ headers: SSE, steps: [A_START, aThinkingOpen, ...pings(2_600, 200).map((x) => (x === PING ? aev('ping') : x)), aThinking('Done.'), aSignature, ...aTextBlock('Plan ready.')] }) } },
      [messagesRoute([{ provider: 'claude' }], { timeoutMs: 30_000 })],
    );
    const client = new Anthropic({ baseURL: g.s.url, apiKey: 'sk-ant-client', maxRetries: 0, timeout: 2_000 });
    const final = await client.messages.stream(thinkingParams).finalMessage();
    expect(final.content.map((b) => b.type)).toEqual(['thinking', 'text']);
    expect(g.seen.claude).toHaveLength(1);
    expect(g.seen.claude![0]!.headers['x-stainless-timeout']).toBeUndefined();
    expect((await requestLine(g.s, 'messages')).startedEarly).toBe(true);
  });

  it('raises an error in the Anthropic SDK when the stream is cut mid-thought, and does not run the request again', async () => {
    const g = await gateway(
      { claude: { family: 'anthropic', script: () => ({ headers: SSE, steps: [A_START, aThinkingOpen, aThinking('Let me'), 50, aThinking(' see'), 50, { destroy: true }] }) } },
      [messagesRoute([{ provider: 'claude' }])],
    );
    const err = await rejection(g.anthropic.messages.stream(thinkingParams).finalMessage());
    expect(String(err)).toMatch(/interrupt|cut|stream/i);
    expect(g.seen.claude).toHaveLength(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('token-rate 429s on long prompts', () => {
  // A 429 for the tokens-per-minute limit: the token bucket is empty, the requests one is not (the mock adds
  // x-ratelimit-remaining-requests and a reset-requests of up to a minute to every answer).
  const tokens429 = (reset: string, times: number) => ({
    errors: [{ status: 429, code: 'rate_limit_exceeded', type: 'tokens', message: 'Rate limit reached for o3 on tokens per min (TPM).', headers: { 'x-ratelimit-remaining-tokens': '0', 'x-ratelimit-reset-tokens': reset }, times }],
  });
  const longPrompt = [{ role: 'user' as const, content: 'Review this diff. '.repeat(2_000) }];

  it('waits out x-ratelimit-reset-tokens (not the requests reset a minute away) before its one retry', async () => {
    const g = await gateway({ o: { mock: tokens429('600ms', 1) } }, [chatRoute([{ provider: 'o' }])]);
    const res = await g.openai.chat.completions.create({ model: 'o3', messages: longPrompt, max_completion_tokens: 1_000 });
    expect(res.choices[0]!.message.content).toBeTruthy();
    const sent = g.mocks.o!.requests();
    expect(sent).toHaveLength(2);
    const waited = sent[1]!.receivedAt - sent[0]!.receivedAt;
    expect(waited).toBeGreaterThanOrEqual(590);
    expect(waited).toBeLessThan(600 * 1.2 + 500);
    expect(sent[1]!.headers['x-retry-reason']).toBe('status_429');
  });

  it('spreads the retries of requests told the same reset over hint x U(1, 1.2), and starts no hold-off', async () => {
    const n = 8;
    const g = await gateway({ o: { mock: tokens429('1s', n) } }, [chatRoute([{ provider: 'o' }])]);
    const answers = await Promise.all(Array.from({ length: n }, () => g.openai.chat.completions.create({ model: 'o3', messages: longPrompt })));
    expect(answers).toHaveLength(n);
    const sent = g.mocks.o!.requests();
    expect(sent).toHaveLength(2 * n);
    const firstAt = Math.min(...sent.slice(0, n).map((r) => r.receivedAt));
    const retries = sent.slice(n).map((r) => r.receivedAt - firstAt);
    for (const at of retries) {
      expect(at).toBeGreaterThanOrEqual(990);
      expect(at).toBeLessThan(1_200 + 400);
    }
    expect(Math.max(...retries) - Math.min(...retries)).toBeGreaterThan(10); // not all at once
    // No hold-off: a newcomer right after goes straight upstream.
    await g.openai.chat.completions.create({ model: 'o3', messages: [{ role: 'user', content: 'short' }] });
    expect(g.mocks.o!.requests()).toHaveLength(2 * n + 1);
  });

  // The README: a 429 while every limit has room left is a request larger than what a token limit has left; the
  // token limits' resets are its hint. A long prompt refused with tokens left (fewer than it needs) waits for the token
  // reset instead of going back at the backoff's pace into the same refusal.
  it('waits for the token reset when the provider says tokens remain (fewer than the long prompt needs)', async () => {
    const g = await gateway(
      { o: { mock: { errors: [{ status: 429, code: 'rate_limit_exceeded', headers: { 'x-ratelimit-remaining-requests': '99', 'x-ratelimit-reset-requests': '50s', 'x-ratelimit-remaining-tokens': '1200', 'x-ratelimit-reset-tokens': '1s' }, times: 1 }] } } },
      [chatRoute([{ provider: 'o' }])],
    );
    const started = Date.now();
    await g.openai.chat.completions.create({ model: 'o3', messages: longPrompt });
    // 1 s x random(1, 1.2), never the requests limit's 50 s.
    expect(Date.now() - started).toBeGreaterThanOrEqual(950);
    expect(Date.now() - started).toBeLessThan(5_000);
    expect(g.mocks.o!.requests()).toHaveLength(2);
  });

  it("fails fast with the hint as retry-after when it is longer than the time left before the SDK's timeout", async () => {
    const g = await gateway({ o: { mock: tokens429('3s', 1) } }, [chatRoute([{ provider: 'o' }], { retry: { maxAttempts: 3 } })]);
    const started = Date.now();
    const err = (await rejection(g.openai.chat.completions.create({ model: 'o3', messages: longPrompt }, { timeout: 2_000 }))) as APIError;
    expect(Date.now() - started).toBeLessThan(1_000); // not held until the deadline
    expect(err.status).toBe(429);
    expect(Number(err.headers?.get('retry-after'))).toBeGreaterThanOrEqual(3);
    expect(g.mocks.o!.requests()).toHaveLength(1);
  });

  it('fails fast with the hint as retry-after when it is longer than maxWaitHintMs, and holds nothing off', async () => {
    const g = await gateway({ o: { mock: tokens429('45s', 1) } }, [chatRoute([{ provider: 'o' }], { retry: { maxAttempts: 3, maxWaitHintMs: 5_000 } })]);
    const started = Date.now();
    const err = (await rejection(g.openai.chat.completions.create({ model: 'o3', messages: longPrompt }))) as APIError;
    expect(Date.now() - started).toBeLessThan(1_000);
    expect(err).toBeInstanceOf(OpenAI.RateLimitError);
    const retryAfter = Number(err.headers?.get('retry-after'));
    expect(retryAfter).toBeGreaterThanOrEqual(45);
    expect(retryAfter).toBeLessThanOrEqual(54);
    expect(err.headers?.get('x-should-retry')).toBe('true'); // sent upstream once: the client is invited back after the wait
    expect(g.mocks.o!.requests()).toHaveLength(1);
    expect((await requestLine(g.s)).retriesStopped).toBe('wait_hint');
    // The reset headers never start a hold-off: the next request goes upstream at once (and is answered).
    const res = await g.openai.chat.completions.create({ model: 'o3', messages: [{ role: 'user', content: 'short' }] });
    expect(res.choices).toHaveLength(1);
    expect(g.mocks.o!.requests()).toHaveLength(2);
  });
});
