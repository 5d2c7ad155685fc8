// Mutation testing of the day's changes, second pass (errors that are only a string, TGI's context and 424 errors,
// vLLM's finish_reason "abort", streamRecovery after reasoning alone and as a retry): each test kills mutants the
// other files let live.
import { describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { streamedText } from './helpers/chat-stream.ts';
import type { ChatCompletionChunk } from 'openai/resources/chat/completions';
import type { MockServer } from '../src/mock/server.ts';
import { ConfigSchema } from '../src/config/schema.ts';
import { normaliseUpstreamErrorBody, upstreamErrorFields } from '../src/errors.ts';
import { recordOutcome } from '../src/pipeline/record-outcome.ts';
import type { Guards, TargetPlan } from '../src/pipeline/target-attempts.ts';
import { DeliveredText } from '../src/pipeline/delivered-text.ts';
import { classify, isContextLengthMessage, isRetryable, type AttemptOutcome } from '../src/policy/outcome.ts';
import { notAnAnswer } from '../src/providers/answer-shape.ts';
import { errorEventForClient, eventMeaning } from '../src/streaming/stream-events.ts';
import type { SseEvent } from '../src/streaming/sse-parser.ts';
import { createMetrics } from '../src/observability/metrics.ts';
import { zeroSeries } from '../src/observability/zero-series.ts';
import { TargetKeys } from '../src/routing/target-keys.ts';
import { defaultConfig, useExtraMocks } from './helpers/stack.ts';
import { cc, delta, recoveringToNext, useScriptedGateway, type ConfigShape, type Script } from './helpers/scripted-provider.ts';
import { deliverData } from './helpers/live-stream.ts';

describe('an error that is only its message', () => {
  it('is wrapped whole when the string is empty: an empty message tells the client nothing', () => {
    expect(normaliseUpstreamErrorBody(500, Buffer.from('{"error":""}')).error.message).toBe('upstream answered 500: {"error":""}');
    expect(upstreamErrorFields({ error: '' })).toBeUndefined();
  });

  it('is a string: an `error` that is an object without a message, or a number, is wrapped whole', () => {
    expect(normaliseUpstreamErrorBody(500, Buffer.from('{"error":{"code":"boom"}}')).error.message).toBe('upstream answered 500: {"error":{"code":"boom"}}');
    expect(normaliseUpstreamErrorBody(502, Buffer.from('{"error":42}')).error.message).toBe('upstream answered 502: {"error":42}');
    expect(upstreamErrorFields({ error: 42 })).toBeUndefined();
  });
});

/** The zero series of the retry counter, by route, target and reason, once the config's series are zeroed. */
async function zeroedRetries(recovery: 'off' | 'continue'): Promise<string[]> {
  const input = defaultConfig('http://127.0.0.1:9');
  for (const r of input.routes) {
    r.targets = [{ provider: 'mock', model: 'gpt-4o' }];
    r.retry = { retryOn: [503] };
    if (r.name === 'chat') r.streamRecovery = recovery;
  }
  const config = ConfigSchema.parse(input);
  const metrics = createMetrics({ defaultMetrics: false });
  zeroSeries(config, metrics, new TargetKeys(config));
  const text = await metrics.registry.metrics();
  return text.split('\n').filter((l) => l.startsWith('stormgate_retry_count_total{'));
}

describe('the retry counter at zero', () => {
  it("has the stream_cut and stream_stalled series of a route with streamRecovery: continue, beside retryOn's", async () => {
    const lines = await zeroedRetries('continue');
    const chat = lines.filter((l) => l.includes('route="chat"'));
    expect(chat).toEqual(expect.arrayContaining([
      'stormgate_retry_count_total{route="chat",target="mock/gpt-4o",reason="status_503"} 0',
      'stormgate_retry_count_total{route="chat",target="mock/gpt-4o",reason="stream_cut"} 0',
      'stormgate_retry_count_total{route="chat",target="mock/gpt-4o",reason="stream_stalled"} 0',
    ]));
    // Only the route that recovers streams counts retries for a break.
    expect(lines.filter((l) => !l.includes('route="chat"') && /reason="stream_/.test(l))).toEqual([]);
  });

  it('has no stream_* series without streamRecovery: such a route never retries a break', async () => {
    const lines = await zeroedRetries('off');
    expect(lines.filter((l) => /reason="stream_/.test(l))).toEqual([]);
    expect(lines).toContain('stormgate_retry_count_total{route="chat",target="mock/gpt-4o",reason="status_503"} 0');
  });
});

/** A DeliveredText that noted one chat chunk per delta, in order. */
function delivered(...deltas: Array<Record<string, unknown>>): DeliveredText {
  const d = new DeliveredText();
  for (const delta of deltas) deliverData(d, JSON.stringify({ object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: null }] }));
  return d;
}

describe('what a stream delivered, for streamRecovery', () => {
  it('counts reasoning under either name: `reasoning_content` (DeepSeek, vLLM before 0.10) or `reasoning` (vLLM, Ollama, OpenRouter)', () => {
    expect(delivered({ reasoning: 'Let me think.' }).reasoning).toBe(true);
    expect(delivered({ reasoning_content: 'Let me think.' }).reasoning).toBe(true);
    expect(delivered({ role: 'assistant', content: '' }, { reasoning: '' }).reasoning).toBe(false);
  });

  it('keeps all the text, piece after piece', () => {
    const d = delivered({ role: 'assistant', content: '' }, { content: 'Hel' }, { content: 'lo' }, { reasoning: 'x' }, { content: ', world' });
    expect(d.text).toBe('Hello, world');
    expect(d.notPlainText).toBe(false);
  });

  it.each([
    ['a legacy function_call', { function_call: { name: 'get_weather', arguments: '' } }],
    ['audio', { audio: { id: 'audio_1', data: 'UklGR', transcript: 'Hel' } }],
    ['a list of content parts', { content: [{ type: 'text', text: 'Hel' }] }],
    ['a refusal', { refusal: 'I cannot help with that.' }],
    ['a tool call', { tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'f', arguments: '' } }] }],
  ])('takes %s for output no continuation can follow', (_what, delta) => {
    expect(delivered({ content: 'Hel' }, delta).notPlainText).toBe(true);
  });

  it('takes the fields some servers send as null on every delta for nothing: the text can still be continued', () => {
    const d = delivered({ role: 'assistant', content: 'Hel', function_call: null, audio: null, refusal: null, tool_calls: null }, { content: 'lo', function_call: null, tool_calls: [] });
    expect(d.notPlainText).toBe(false);
    expect(d.text).toBe('Hello');
  });
});

const http = (status: number): AttemptOutcome => ({ kind: 'http', status, errorCode: null, hint: undefined });

describe("a provider's 424 (its model failed while generating)", () => {
  it('is the provider\'s failure, retried under its own status only when retryOn lists it', () => {
    expect(classify(http(424))).toEqual({ cls: 'server-error', retryKey: 424, reason: 'status_424' });
    expect(isRetryable(classify(http(424)), [424])).toBe(true);
    expect(isRetryable(classify(http(424)), [408, 500, 'network'])).toBe(false);
  });
});

describe("Hugging Face TGI's context-window errors", () => {
  it.each([
    'Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 `inputs` tokens and 200 `max_new_tokens`',
    'Input validation error: `inputs` must have less than 1024 tokens. Given: 2000',
  ])('reads %j as context_length_exceeded', (message) => {
    expect(isContextLengthMessage(message)).toBe(true);
  });

  it.each([
    // The client's own max_new_tokens past the model's limit: a parameter to change, not a longer window to find.
    'Input validation error: `max_new_tokens` must be <= 4096. Given: 5000',
    'Input validation error: `temperature` must be strictly positive',
    'Input validation error: `inputs` cannot be empty',
  ])('does not read %j as one', (message) => {
    expect(isContextLengthMessage(message)).toBe(false);
  });
});

const WHOLE = { stream: false, contentType: 'application/json', ownFamily: true } as const;
const abortedAnswer = (api: 'chat' | 'completions') =>
  Buffer.from(JSON.stringify({ id: 'x', object: api === 'chat' ? 'chat.completion' : 'text_completion', choices: [api === 'chat' ? { index: 0, message: { role: 'assistant', content: 'Hel' }, finish_reason: 'abort' } : { index: 0, text: 'Hel', finish_reason: 'abort' }] }));

describe('a whole answer vLLM aborted', () => {
  it.each(['chat', 'completions'] as const)('is a %s answer cut short that ran: retried as a broken answer, not passed on', (api) => {
    expect(notAnAnswer({ api, ...WHOLE }, abortedAnswer(api))).toEqual({ detail: 'the provider aborted the answer (finish_reason "abort")', ran: true });
  });

  it('is judged only in the OpenAI shape: another family\'s body is its translator\'s to judge', () => {
    expect(notAnAnswer({ api: 'chat', ...WHOLE, ownFamily: false }, abortedAnswer('chat'))).toBeUndefined();
  });

  it('is not an answer that only quotes the words in its text', () => {
    const quoting = Buffer.from(JSON.stringify({ object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content: 'vLLM writes "finish_reason":"abort"' }, finish_reason: 'stop' }] }));
    expect(notAnAnswer({ api: 'chat', ...WHOLE }, quoting)).toBeUndefined();
  });
});

const sse = (data: unknown): SseEvent => {
  const text = JSON.stringify(data);
  return { raw: `data: ${text}`, data: text, event: null };
};
const choice = (index: number, finish: string | null, content = '') => ({ index, delta: { content }, finish_reason: finish });

describe('a stream vLLM aborted', () => {
  it('is an error event whichever choice it aborted: with n > 1, the others finishing does not make it whole', () => {
    expect(eventMeaning('chat', sse({ object: 'chat.completion.chunk', choices: [choice(0, 'abort')] }))).toBe('error');
    expect(eventMeaning('chat', sse({ object: 'chat.completion.chunk', choices: [choice(0, null, 'Hi'), choice(1, 'abort')] }))).toBe('error');
    expect(eventMeaning('chat', sse({ object: 'chat.completion.chunk', choices: [choice(0, 'stop'), choice(1, 'abort')] }))).toBe('error');
    expect(eventMeaning('completions', sse({ object: 'text_completion', choices: [{ index: 0, text: '', finish_reason: 'abort' }] }))).toBe('error');
  });

  it('ends with an error that says the provider aborted it', () => {
    const out = errorEventForClient('chat', sse({ object: 'chat.completion.chunk', choices: [choice(0, 'abort')] }));
    expect(out).toContain('the upstream stream failed: the provider aborted the answer (finish_reason \\"abort\\")');
  });

  it('gives an error event with neither a message nor choices the words it always had', () => {
    expect(errorEventForClient('chat', sse({ status: 'failed' }))).toContain('the upstream stream failed: the upstream sent an error event');
  });
});

// Streams cut after their reasoning alone, over real HTTP: p thinks, then is cut before its text.
const cut = { destroy: true } as const;
const role = cc([delta({ role: 'assistant', content: '' })]);
const thought = (text: string) => cc([delta({ reasoning_content: text })]);
const said = (text: string) => cc([delta({ content: text })]);
const stop = cc([delta({}, 'stop')]);
const DONE = 'data: [DONE]\n\n';
const thinksThenCut: Script = { steps: [role, thought('Let me think.'), 30, cut] };

async function read(client: OpenAI): Promise<{ text: string; err: Error | undefined }> {
  const stream = (await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'What is six times seven?' }], stream: true })) as AsyncIterable<ChatCompletionChunk>;
  return streamedText(stream);
}

const startRecovering = useScriptedGateway(recoveringToNext());
const startExtraMock = useExtraMocks();
let claude: MockServer | undefined;
/** q is a Claude model that refuses a prefill (4.6): no text to continue, it is asked afresh all the same. */
const toClaude: ConfigShape = (c, origin) => {
  recoveringToNext()(c, origin);
  c.providers.q = { family: 'anthropic', baseUrl: claude!.url, apiKey: 'claude-key', breaker: false };
  for (const r of c.routes) if (r.name === 'chat') r.targets = [{ provider: 'p' }, { provider: 'q', model: 'claude-sonnet-4-6' }];
};
const startToClaude = useScriptedGateway(toClaude);

describe('a stream cut after its reasoning alone, finished by the next target', () => {
  it('passes the next answer on as it begins, its leading paragraph break kept: the client has no text it would repeat', async () => {
    const { client } = await startRecovering((_b, n) => (n === 1 ? thinksThenCut : { steps: [role, thought('Six times seven.'), said('\n\nForty'), said('-two.'), stop, DONE] }));
    const { text, err } = await read(client);
    expect(err).toBeUndefined();
    expect(text).toBe('\n\nForty-two.');
  });

  it('asks another family\'s model that takes no prefill: with nothing to splice onto, it answers afresh as a failover would', async () => {
    claude = await startExtraMock({ apiKey: 'claude-key' });
    const { client } = await startToClaude(() => thinksThenCut);
    const { text, err } = await read(client);
    expect(err).toBeUndefined();
    expect(text.length).toBeGreaterThan(0);
    expect(claude.stats().total).toBe(1);
  });
});

describe("recordOutcome and the target's adaptive limit", () => {
  it('tells the limit before it waits for the breaker: the in-flight count it judges a 429 by is the one the provider saw', async () => {
    const order: string[] = [];
    let written!: () => void;
    const board = { record: () => new Promise<void>((r) => (written = r)).then(() => void order.push('breaker written')) };
    const guards = { board, holdOffs: {}, budget: {} } as unknown as Guards;
    const plan = { key: 'p/m', limitKey: 'p/m', breaker: {}, sharesHoldOffs: true, client: { config: { authHoldS: 60 } }, pool: { observe: (_k: string, signal: string) => void order.push(`limit: ${signal}`), unansweredSince: () => false } } as unknown as TargetPlan;
    const result = { outcome: { kind: 'http', status: 429, errorCode: 'rate_limit_exceeded', hint: undefined }, status: 429 } as const;
    const recorded = recordOutcome(guards, plan, result, classify(result.outcome), 5, undefined);
    expect(order).toEqual(['limit: rate-limited']);
    written();
    await recorded;
    expect(order).toEqual(['limit: rate-limited', 'breaker written']);
  });
});
