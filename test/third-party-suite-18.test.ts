// An eighteenth third-party failure-scenario suite, written from the README alone ("Logs and metrics" and its metrics
// table, "Retries", "Failover and API families", "Streaming", "Idempotency keys", "What the client sees") as a FinOps /
// LLM-observability team would test the gateway before trusting its numbers for chargeback: does what the gateway
// reports about tokens, attempts and requests match exactly what the provider billed and what the clients got, when
// things fail?
// Black box: real gateways over real HTTP, the official `openai` SDK (and `@anthropic-ai/sdk` on /v1/messages) as
// clients with their own retries off, and scripted upstreams whose every bill the test wrote: distinctive token counts
// per upstream answer, so a count summed from the wrong answer, twice, or under the wrong target cannot match by chance.
// The ground truth is (a) what each upstream was asked (its own request count) and answered (the usage it sent), and
// (b) what each client was told. Timing bounds are generous: the suite runs on a loaded 2-core machine.
import { setTimeout as sleep } from 'node:timers/promises';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { cc, delta, DONE, json, rev, baseResponse, msgItem, responsesHead, textDelta, scripted, type Answer, type Script, type Seen } from './helpers/scripted-provider.ts';
import { scrapeMetrics, useGateways } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startGateway = useGateways();

type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];
type Family = 'openai' | 'anthropic';

const CHAT = '/v1/chat/completions';
const messages = [{ role: 'user' as const, content: 'Reconcile the March invoice.' }];
/** Quick retries with no jitter, a budget that never refuses, no breaker and no parking. */
const QUIET: Partial<RouteInput> = {
  retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } },
  budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 },
  park: false,
  timeoutMs: 20_000,
};

// ---------------------------------------------------------------------------------------------------------------
// Upstreams whose bills the test knows, and a gateway in front of them.

interface Up {
  family?: Family;
  answer: Answer;
}

interface Gw {
  url: string;
  logs: string[];
  /** What each upstream received, by provider name. */
  seen: Record<string, Seen[]>;
}

async function gateway(ups: Record<string, Up | Answer>, routes: RouteInput[], extra: Partial<ConfigInput> = {}, provider: Partial<ProviderInput> = {}): Promise<Gw> {
  const providers: ConfigInput['providers'] = {};
  const seen: Record<string, Seen[]> = {};
  for (const [name, u] of Object.entries(ups)) {
    const { answer, family = 'openai' } = typeof u === 'function' ? { answer: u } : u;
    seen[name] = [];
    const p = await startProvider(scripted(answer, seen[name]));
    providers[name] = {
      family,
      baseUrl: family === 'openai' ? `${p.origin}/v1` : p.origin,
      apiKey: `${name}-provider-key-0123456789`,
      breaker: false,
      timeouts: { connectMs: 1_000, firstTokenMs: 5_000, idleMs: 5_000 },
      ...provider,
    } as ProviderInput;
  }
  const config = ConfigSchema.parse({ server: { host: '127.0.0.1', port: 0, logLevel: 'info' }, providers, routes, ...extra });
  const logs: string[] = [];
  const url = await startGateway(config, { logs });
  return { url, logs, seen };
}

const route = (name: string, path: string, targets: RouteInput['targets'], more: Partial<RouteInput> = {}): RouteInput => ({ name, match: { path }, targets, ...QUIET, ...more });

const sdk = (url: string, apiKey = 'sk-client-not-a-provider-key') => new OpenAI({ baseURL: `${url}/v1`, apiKey, maxRetries: 0 });

// OpenAI-family bills.
interface Bill {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  [k: string]: unknown;
}
const bill = (prompt: number, completion: number, extra: Record<string, unknown> = {}): Bill => ({ prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion, ...extra });

/** A whole chat completion with `usage`, carrying the provider's request id. */
const chatAnswer = (text: string, usage: Bill, opts: { id?: string; n?: number; finish?: string } = {}): Script =>
  json(
    200,
    {
      id: 'chatcmpl-bill',
      object: 'chat.completion',
      created: 1741290958,
      model: 'gpt-4o-2024-08-06',
      choices: Array.from({ length: opts.n ?? 1 }, (_, index) => ({ index, message: { role: 'assistant', content: text }, logprobs: null, finish_reason: opts.finish ?? 'stop' })),
      usage,
    },
    { 'x-request-id': opts.id ?? 'req_openai_1' },
  );

/** A chat stream of `parts`; with `usage`, the usage chunk OpenAI sends for include_usage; `cutAfter` parts, a reset. */
function chatStream(parts: string[], usage?: Bill, opts: { id?: string; cutAfter?: number; usageInEvery?: boolean } = {}): Script {
  const u = (x: unknown) => (usage ? { usage: x } : {});
  const steps: Script['steps'] = [cc([delta({ role: 'assistant', content: '' })], u(null))];
  parts.forEach((p, i) => {
    if (opts.cutAfter !== undefined && i === opts.cutAfter) steps.push(50, { destroy: true });
    // vLLM's continuous_usage_stats: every chunk carries the usage so far.
    steps.push(cc([delta({ content: p })], opts.usageInEvery && usage ? { usage: bill(usage.prompt_tokens, i + 1) } : u(null)));
  });
  steps.push(cc([delta({}, 'stop')], u(null)));
  if (usage) steps.push(cc([], { usage }));
  steps.push(DONE);
  return { headers: { 'content-type': 'text/event-stream', 'x-request-id': opts.id ?? 'req_openai_stream' }, steps };
}

// Anthropic bills: input tokens apart from the prompt cache's reads and writes, all three billed as prompt tokens.
interface ABill {
  input_tokens: number;
  cache_creation_input_tokens: number;
  cache_read_input_tokens: number;
  output_tokens: number;
}
const aBill = (input: number, cacheWrite: number, cacheRead: number, output: number): ABill => ({
  input_tokens: input,
  cache_creation_input_tokens: cacheWrite,
  cache_read_input_tokens: cacheRead,
  output_tokens: output,
});
const promptOf = (b: ABill) => b.input_tokens + b.cache_creation_input_tokens + b.cache_read_input_tokens;

const aMessage = (text: string, usage: ABill, model = 'claude-haiku-4-5') => ({
  id: 'msg_01Bill',
  type: 'message',
  role: 'assistant',
  model,
  content: [{ type: 'text', text }],
  stop_reason: 'end_turn',
  stop_sequence: null,
  usage,
});
const aWhole = (text: string, usage: ABill, id = 'req_anthropic_1'): Script => json(200, aMessage(text, usage), { 'request-id': id });
const aev = (type: string, data: Record<string, unknown> = {}) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
/** Anthropic's SSE sequence: input in message_start (output 1 so far), the final output count in message_delta. */
function aStream(parts: string[], usage: ABill, opts: { id?: string; cutAfter?: number } = {}): Script {
  const start = aMessage('', { ...usage, output_tokens: 1 });
  const steps: Script['steps'] = [aev('message_start', { message: { ...start, content: [], stop_reason: null } }), aev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } })];
  parts.forEach((p, i) => {
    if (opts.cutAfter !== undefined && i === opts.cutAfter) steps.push(50, { destroy: true });
    steps.push(aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: p } }));
  });
  steps.push(aev('content_block_stop', { index: 0 }), aev('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: usage.output_tokens } }), aev('message_stop'));
  return { headers: { 'content-type': 'text/event-stream', 'request-id': opts.id ?? 'req_anthropic_stream' }, steps };
}

const down503: Script = json(503, { error: { message: 'The server is overloaded', type: 'server_error', code: null } });

// ---------------------------------------------------------------------------------------------------------------
// Reading /metrics and the request log.

const scrape = scrapeMetrics;

/** Every series of stormgate_tokens_total with a non-zero count, as `route target kind` -> tokens. */
async function tokens(url: string): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const s of await scrape(url)) if (s.name === 'stormgate_tokens_total' && s.value !== 0) out[`${s.labels.route} ${s.labels.target} ${s.labels.kind}`] = s.value;
  return out;
}

/** Every series of a counter with a non-zero count, by the labels named. */
async function counts(url: string, name: string, labels: string[]): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const s of await scrape(url)) {
    const key = labels.map((l) => s.labels[l]).join(' ');
    if (s.name === name && s.value !== 0) out[key] = (out[key] ?? 0) + s.value;
  }
  return out;
}

async function until(what: string, check: () => Promise<boolean> | boolean, withinMs = 5_000): Promise<void> {
  for (const end = Date.now() + withinMs; !(await check()); ) {
    if (Date.now() > end) throw new Error(`timed out waiting until ${what}`);
    await sleep(20);
  }
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- a log line is JSON: tests read whatever field they check
type Line = Record<string, any>;
/** The request log lines (one per request), once `n` of them are written. */
async function requestLines(gw: Gw, n: number): Promise<Line[]> {
  const lines = () => gw.logs.map((l) => JSON.parse(l) as Line).filter((l) => typeof l.reqId === 'string' && typeof l.durationMs === 'number');
  await until(`${n} request log lines`, () => lines().length >= n);
  return lines();
}

/** Reads an SDK chat stream to its end: its text, the last usage chunk it carried, and whether it raised. */
async function drain(stream: AsyncIterable<OpenAI.ChatCompletionChunk>): Promise<{ text: string; usage: OpenAI.CompletionUsage | undefined; broke: boolean; usageChunks: number }> {
  let text = '';
  let usage: OpenAI.CompletionUsage | undefined;
  let usageChunks = 0;
  try {
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? '';
      if (chunk.usage) {
        usage = chunk.usage;
        usageChunks++;
      }
    }
  } catch {
    return { text, usage, broke: true, usageChunks };
  }
  return { text, usage, broke: false, usageChunks };
}

// ---------------------------------------------------------------------------------------------------------------

describe('stormgate_tokens_total against the provider\'s bill, for answers that went well', () => {
  it('counts each API\'s usage exactly once, as sent: chat (n = 2, reasoning tokens), embeddings, Responses whole and streamed', async () => {
    const chatBill = bill(1301, 57, { prompt_tokens_details: { cached_tokens: 1024 }, completion_tokens_details: { reasoning_tokens: 32 } });
    const nBill = bill(211, 2 * 19);
    const embedBill = { prompt_tokens: 512, total_tokens: 512 };
    const respUsage = { input_tokens: 700, input_tokens_details: { cached_tokens: 300 }, output_tokens: 90, output_tokens_details: { reasoning_tokens: 64 }, total_tokens: 790 };
    const respStreamUsage = { ...respUsage, input_tokens: 703, output_tokens: 91, total_tokens: 794 };
    const gw = await gateway(
      {
        chatp: (body) => (body.n === 2 ? chatAnswer('two', nBill, { n: 2 }) : chatAnswer('one', chatBill)),
        embedp: () => json(200, { object: 'list', data: [{ object: 'embedding', index: 0, embedding: [0.1, 0.2] }], model: 'text-embedding-3-small', usage: embedBill }),
        respp: (body) =>
          body.stream === true
            ? { steps: [...responsesHead(), textDelta('Paid.', 4), rev('response.output_text.done', { item_id: 'msg_1', output_index: 0, content_index: 0, text: 'Paid.', logprobs: [] }, 5), rev('response.completed', { response: baseResponse('completed', [msgItem('Paid.')], respStreamUsage) }, 6)] }
            : json(200, { ...baseResponse('completed', [msgItem('Paid.')], respUsage), metadata: { usage: 'nightly-eval' } }),
      },
      [
        route('chat', CHAT, [{ provider: 'chatp' }]),
        route('embeddings', '/v1/embeddings', [{ provider: 'embedp' }]),
        route('responses', '/v1/responses', [{ provider: 'respp' }]),
      ],
    );
    const client = sdk(gw.url);
    const one = await client.chat.completions.create({ model: 'gpt-4o', messages });
    // The client sees the provider's usage as it was sent, details included.
    expect(one.usage).toEqual(chatBill);
    const two = await client.chat.completions.create({ model: 'gpt-4o', messages, n: 2 });
    expect(two.choices).toHaveLength(2);
    expect(two.usage).toEqual(nBill);
    const emb = await client.embeddings.create({ model: 'text-embedding-3-small', input: 'invoice 0042' });
    expect(emb.usage).toEqual(embedBill);
    const resp = await client.responses.create({ model: 'gpt-4.1', input: 'Is it paid?' });
    expect(resp.usage).toEqual(respUsage);
    let streamedUsage: unknown;
    for await (const ev of await client.responses.create({ model: 'gpt-4.1', input: 'Is it paid?', stream: true })) if (ev.type === 'response.completed') streamedUsage = ev.response.usage;
    expect(streamedUsage).toEqual(respStreamUsage);

    await requestLines(gw, 5);
    // Completion tokens include the reasoning tokens (as OpenAI bills them); cached prompt tokens are prompt tokens.
    expect(await tokens(gw.url)).toEqual({
      'chat chatp/gpt-4o prompt': 1301 + 211,
      'chat chatp/gpt-4o completion': 57 + 38,
      'embeddings embedp/text-embedding-3-small prompt': 512,
      'responses respp/gpt-4.1 prompt': 700 + 703,
      'responses respp/gpt-4.1 completion': 90 + 91,
    });
    // One upstream request per client request: nothing to bill twice.
    expect([gw.seen.chatp!.length, gw.seen.embedp!.length, gw.seen.respp!.length]).toEqual([2, 1, 2]);
  });

  it('counts a chat stream\'s usage only when the client asked for include_usage, and a cumulative usage in every chunk once', async () => {
    const final = bill(880, 3);
    const gw = await gateway(
      {
        p: (body) => {
          const include = (body.stream_options as { include_usage?: boolean } | undefined)?.include_usage === true;
          // vLLM with continuous_usage_stats: usage so far on every chunk, whether or not the client asked.
          if (body.user === 'vllm') return chatStream(['a', 'b', 'c'], final, { usageInEvery: true });
          return chatStream(['a', 'b', 'c'], include ? final : undefined);
        },
      },
      [route('chat', CHAT, [{ provider: 'p' }])],
    );
    const client = sdk(gw.url);
    const withUsage = await drain(await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true, stream_options: { include_usage: true } }));
    expect(withUsage).toMatchObject({ text: 'abc', broke: false, usageChunks: 1 });
    expect(withUsage.usage).toEqual(final);
    const without = await drain(await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }));
    expect(without).toMatchObject({ text: 'abc', broke: false, usageChunks: 0 });
    await requestLines(gw, 2);
    // README: "an OpenAI-compatible chat or completions stream only when the client asked for include_usage, so streams
    // without it are not billed here": the provider billed 2 x (880 + 3); the gateway knows of one.
    expect(await tokens(gw.url)).toEqual({ 'chat p/gpt-4o prompt': 880, 'chat p/gpt-4o completion': 3 });

    const cumulative = await drain(await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true, stream_options: { include_usage: true }, user: 'vllm' }));
    expect(cumulative.usage).toEqual(final);
    await requestLines(gw, 3);
    // The running totals are not added up: the last (largest) is the bill.
    expect(await tokens(gw.url)).toEqual({ 'chat p/gpt-4o prompt': 2 * 880, 'chat p/gpt-4o completion': 2 * 3 });
  });
});

describe('retries and failover: the answer that reached the client is what is billed, to the target that gave it', () => {
  it('bills a retried answer once, to its target; attempts and requests match what the provider and the client saw', async () => {
    const answer = bill(640, 21);
    const gw = await gateway({ p: (_b, n) => (n <= 2 ? down503 : chatAnswer('ok', answer, { id: 'req_third' })) }, [route('chat', CHAT, [{ provider: 'p' }])]);
    const { data, response } = await sdk(gw.url).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(data.usage).toEqual(answer);
    expect(response.headers.get('x-stormgate-attempts')).toBe('3');
    const [line] = await requestLines(gw, 1);
    expect(gw.seen.p).toHaveLength(3);
    expect(line!.attempts.map((a: Line) => a.reason)).toEqual(['status_503', 'status_503', 'ok']);
    expect(line!.upstreamRequestId).toBe('req_third');
    expect(await tokens(gw.url)).toEqual({ 'chat p/gpt-4o prompt': 640, 'chat p/gpt-4o completion': 21 });
    expect(await counts(gw.url, 'stormgate_upstream_attempts_total', ['target', 'status_class'])).toEqual({ 'p/gpt-4o 5xx': 2, 'p/gpt-4o 2xx': 1 });
    expect(await counts(gw.url, 'stormgate_requests_total', ['route', 'target', 'outcome'])).toEqual({ 'chat p/gpt-4o success': 1 });
    expect(await counts(gw.url, 'stormgate_retry_count_total', ['target', 'reason'])).toEqual({ 'p/gpt-4o status_503': 2 });
  });

  it('bills only the answer passed on when the provider billed a broken whole answer before it (vLLM\'s finish_reason "abort")', async () => {
    // README (Streaming): "a whole answer so finished is a broken one, retried". The provider ran, and billed, both.
    const broken = bill(640, 7);
    const good = bill(640, 22);
    const gw = await gateway({ p: (_b, n) => (n === 1 ? chatAnswer('The answ', broken, { finish: 'abort', id: 'req_aborted' }) : chatAnswer('The answer is 42.', good, { id: 'req_good' })) }, [route('chat', CHAT, [{ provider: 'p' }])]);
    const done = await sdk(gw.url).chat.completions.create({ model: 'gpt-4o', messages });
    expect(done.choices[0]!.message.content).toBe('The answer is 42.');
    expect(done.usage).toEqual(good);
    const [line] = await requestLines(gw, 1);
    expect(gw.seen.p).toHaveLength(2);
    expect(line!.attempts).toHaveLength(2);
    expect(line!.attempts[0].reason).not.toBe('ok');
    // What the gateway counts is the answer's bill: the broken attempt's 647 tokens are the provider's to reconcile.
    expect(await tokens(gw.url)).toEqual({ 'chat p/gpt-4o prompt': 640, 'chat p/gpt-4o completion': 22 });
    expect(await counts(gw.url, 'stormgate_upstream_attempts_total', ['target', 'status_class'])).toEqual({ 'p/gpt-4o bad_stream': 1, 'p/gpt-4o 2xx': 1 });
  });

  it('bills an Anthropic backup\'s answer to the backup, its prompt-cache reads and writes as prompt tokens, whole and streamed', async () => {
    const wholeBill = aBill(20, 300, 5_000, 44);
    const streamBill = aBill(21, 0, 5_000, 45);
    const gw = await gateway(
      {
        openai: () => down503,
        claude: { family: 'anthropic', answer: (body) => (body.stream === true ? aStream(['Pa', 'id.'], streamBill, { id: 'req_claude_stream' }) : aWhole('Paid.', wholeBill, 'req_claude_whole')) },
      },
      [route('chat', CHAT, [{ provider: 'openai' }, { provider: 'claude', model: 'claude-haiku-4-5' }], { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } })],
    );
    const client = sdk(gw.url);
    const { data, response } = await client.chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(response.headers.get('x-stormgate-target')).toBe('claude/claude-haiku-4-5');
    // The answer's usage is the fallback's own (README), translated: cache reads and writes in prompt_tokens.
    expect(data.usage).toMatchObject({ prompt_tokens: 5_320, completion_tokens: 44, total_tokens: 5_364, prompt_tokens_details: { cached_tokens: 5_000 } });
    const streamed = await drain(await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true, stream_options: { include_usage: true } }));
    expect(streamed).toMatchObject({ text: 'Paid.', broke: false, usageChunks: 1 });
    expect(streamed.usage).toMatchObject({ prompt_tokens: 5_021, completion_tokens: 45, total_tokens: 5_066 });
    // And a stream whose client did not ask for usage: Anthropic reports it in every stream (README), so it is billed.
    const quiet = await drain(await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }));
    expect(quiet).toMatchObject({ text: 'Paid.', usageChunks: 0 });

    const lines = await requestLines(gw, 3);
    expect(await tokens(gw.url)).toEqual({
      'chat claude/claude-haiku-4-5 prompt': promptOf(wholeBill) + 2 * promptOf(streamBill),
      'chat claude/claude-haiku-4-5 completion': 44 + 2 * 45,
    });
    expect(gw.seen.openai).toHaveLength(6);
    expect(gw.seen.claude).toHaveLength(3);
    // The log names the target that answered and Anthropic's own request id, for a join with its usage export.
    expect(lines.map((l) => [l.target, l.upstreamRequestId, l.attempts.map((a: Line) => a.target)])).toEqual([
      ['claude/claude-haiku-4-5', 'req_claude_whole', ['openai/gpt-4o', 'openai/gpt-4o', 'claude/claude-haiku-4-5']],
      ['claude/claude-haiku-4-5', 'req_claude_stream', ['openai/gpt-4o', 'openai/gpt-4o', 'claude/claude-haiku-4-5']],
      ['claude/claude-haiku-4-5', 'req_claude_stream', ['openai/gpt-4o', 'openai/gpt-4o', 'claude/claude-haiku-4-5']],
    ]);
    expect(await counts(gw.url, 'stormgate_upstream_attempts_total', ['target', 'status_class'])).toEqual({ 'openai/gpt-4o 5xx': 6, 'claude/claude-haiku-4-5 2xx': 3 });
    expect(await counts(gw.url, 'stormgate_requests_total', ['target', 'outcome'])).toEqual({ 'claude/claude-haiku-4-5 success': 3 });
  });
});

describe('streams that break after their first output', () => {
  it('bills what the provider reported before the cut: nothing from an OpenAI stream, the prompt from an Anthropic one', async () => {
    const anthropicBill = aBill(33, 0, 2_000, 60);
    const gw = await gateway(
      {
        openai: () => chatStream(['The ', 'answer ', 'is'], bill(900, 3), { cutAfter: 2 }),
        claude: { family: 'anthropic', answer: () => aStream(['The ', 'answer ', 'is'], anthropicBill, { cutAfter: 2 }) },
      },
      [route('chat', CHAT, [{ provider: 'openai' }], { match: { path: CHAT, models: ['gpt-4o'] } }), route('claude-chat', CHAT, [{ provider: 'claude', model: 'claude-haiku-4-5' }], { match: { path: CHAT, models: ['claude-*'] } })],
    );
    const client = sdk(gw.url);
    const o = await drain(await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true, stream_options: { include_usage: true } }));
    const a = await drain(await client.chat.completions.create({ model: 'claude-haiku-4-5', messages, stream: true, stream_options: { include_usage: true } }));
    expect(o).toMatchObject({ text: 'The answer ', broke: true, usage: undefined });
    expect(a).toMatchObject({ text: 'The answer ', broke: true, usage: undefined });
    const lines = await requestLines(gw, 2);
    expect(lines.map((l) => [l.outcome, l.streamEnd])).toEqual([
      ['stream_error', 'cut'],
      ['stream_error', 'cut'],
    ]);
    // README: "a stream's usage as its provider reports it": Anthropic told its input (2,033) and 1 output token in
    // message_start before the cut; the OpenAI stream's usage chunk never came.
    expect(await tokens(gw.url)).toEqual({ 'claude-chat claude/claude-haiku-4-5 prompt': 2_033, 'claude-chat claude/claude-haiku-4-5 completion': 1 });
    expect(await counts(gw.url, 'stormgate_requests_total', ['route', 'outcome'])).toEqual({ 'chat stream_error': 1, 'claude-chat stream_error': 1 });
    expect(await counts(gw.url, 'stormgate_upstream_attempts_total', ['target', 'status_class'])).toEqual({ 'openai/gpt-4o 2xx': 1, 'claude/claude-haiku-4-5 2xx': 1 });
  });

  it('bills a streamRecovery continuation to the target that sent it, as the usage chunk the client got says', async () => {
    const backupBill = bill(1_001, 9);
    const gw = await gateway(
      {
        primary: () => chatStream(['The answer ', 'is 42.'], bill(1_001, 5), { cutAfter: 1, id: 'req_primary' }),
        backup: () => chatStream(['The answer is 42.'], backupBill, { id: 'req_backup' }),
      },
      [route('chat', CHAT, [{ provider: 'primary' }, { provider: 'backup' }], { streamRecovery: 'continue', retry: { maxAttempts: 1 } })],
    );
    const { data, response } = await sdk(gw.url).chat.completions.create({ model: 'gpt-4o', messages, stream: true, stream_options: { include_usage: true } }).withResponse();
    const got = await drain(data);
    expect(got).toMatchObject({ text: 'The answer is 42.', broke: false, usageChunks: 1 });
    // The client's usage is the continuation's: the provider that finished the answer billed it.
    expect(got.usage).toEqual(backupBill);
    expect(response.headers.get('x-stormgate-attempts')).toBe('1');
    const [line] = await requestLines(gw, 1);
    expect(line!.streamEnd).toBe('recovered');
    expect(line!.attempts.map((a: Line) => a.target)).toEqual(['primary/gpt-4o', 'backup/gpt-4o']);
    expect([gw.seen.primary!.length, gw.seen.backup!.length]).toEqual([1, 1]);
    expect(await counts(gw.url, 'stormgate_upstream_attempts_total', ['target', 'status_class'])).toEqual({ 'primary/gpt-4o 2xx': 1, 'backup/gpt-4o 2xx': 1 });
    expect(await counts(gw.url, 'stormgate_retry_count_total', ['target', 'reason'])).toEqual({ 'backup/gpt-4o stream_cut': 1 });
    // README: tokens are "billed to the target that answered"; these 1,010 are backup's bill, not primary's.
    expect(await tokens(gw.url)).toEqual({ 'chat backup/gpt-4o prompt': 1_001, 'chat backup/gpt-4o completion': 9 });
  });

  it('bills both providers of a recovered stream: the cut Anthropic primary what it reported, the continuation its own', async () => {
    // A cut stream without recovery bills what its provider reported (the test above): recovering it must not lose
    // that bill, nor put the continuation's on the provider that broke.
    const claudeBill = aBill(33, 0, 2_000, 60);
    const backupBill = bill(1_001, 9);
    const gw = await gateway(
      {
        claude: { family: 'anthropic', answer: () => aStream(['The answer ', 'is 42.'], claudeBill, { cutAfter: 1 }) },
        backup: () => chatStream(['The answer is 42.'], backupBill),
      },
      [route('chat', CHAT, [{ provider: 'claude', model: 'claude-haiku-4-5' }, { provider: 'backup', model: 'gpt-4o' }], { streamRecovery: 'continue', retry: { maxAttempts: 1 } })],
    );
    const got = await drain(await sdk(gw.url).chat.completions.create({ model: 'gpt-4o', messages, stream: true, stream_options: { include_usage: true } }));
    expect(got).toMatchObject({ text: 'The answer is 42.', broke: false, usageChunks: 1 });
    expect(got.usage).toEqual(backupBill);
    const [line] = await requestLines(gw, 1);
    expect(line!.streamEnd).toBe('recovered');
    // The log line bills as the counter does: the broken part to its target, the continuation apart.
    expect(line).toMatchObject({ usage: { prompt: 2_033, completion: 1 }, continuationUsage: { target: 'backup/gpt-4o', usage: { prompt: 1_001, completion: 9 } } });
    expect(await tokens(gw.url)).toEqual({
      'chat claude/claude-haiku-4-5 prompt': 2_033,
      'chat claude/claude-haiku-4-5 completion': 1,
      'chat backup/gpt-4o prompt': 1_001,
      'chat backup/gpt-4o completion': 9,
    });
  });
});

describe('idempotency keys: a replay is never billed again', () => {
  it('bills a run once however often its answer is replayed, whole or streamed, and counts the replays as replayed', async () => {
    const whole = bill(4_000, 120);
    const streamed = bill(4_001, 3);
    const gw = await gateway({ p: (body) => (body.stream === true ? chatStream(['x', 'y', 'z'], streamed) : chatAnswer('coupon', whole)) }, [route('chat', CHAT, [{ provider: 'p' }])]);
    const client = sdk(gw.url);
    const key = { headers: { 'Idempotency-Key': 'call-7f1e' } };
    const usages = [];
    for (let i = 0; i < 3; i++) usages.push((await client.chat.completions.create({ model: 'gpt-4o', messages }, key)).usage);
    expect(usages).toEqual([whole, whole, whole]);
    const skey = { headers: { 'Idempotency-Key': 'call-stream-2b' } };
    const s1 = await drain(await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true, stream_options: { include_usage: true } }, skey));
    const s2 = await drain(await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true, stream_options: { include_usage: true } }, skey));
    expect([s1.usage, s2.usage]).toEqual([streamed, streamed]);
    const lines = await requestLines(gw, 5);
    expect(lines.map((l) => l.idempotency)).toEqual(['run', 'replayed', 'replayed', 'run', 'replayed']);
    expect(gw.seen.p).toHaveLength(2);
    expect(await tokens(gw.url)).toEqual({ 'chat p/gpt-4o prompt': 8_001, 'chat p/gpt-4o completion': 123 });
    expect(await counts(gw.url, 'stormgate_requests_total', ['outcome'])).toEqual({ success: 2, replayed: 3 });
    expect(await counts(gw.url, 'stormgate_upstream_attempts_total', ['status_class'])).toEqual({ '2xx': 2 });
  });

  it('bills a run whose client left once, when it ends, and not again for the repeat that gets its answer', async () => {
    const answer = bill(2_500, 40);
    const gw = await gateway({ p: () => ({ ...chatAnswer('late', answer), steps: [900, ...chatAnswer('late', answer).steps] }) }, [route('chat', CHAT, [{ provider: 'p' }])]);
    const client = sdk(gw.url);
    const key = { headers: { 'Idempotency-Key': 'call-timeout-1' } };
    // The agent's timeout cuts its first call; its retry, with the same key, waits for the run.
    await expect(client.chat.completions.create({ model: 'gpt-4o', messages }, { ...key, timeout: 300 })).rejects.toThrow();
    const again = await client.chat.completions.create({ model: 'gpt-4o', messages }, key);
    expect(again.usage).toEqual(answer);
    const lines = await requestLines(gw, 2);
    expect(gw.seen.p).toHaveLength(1);
    const run = lines.find((l) => l.idempotency === 'run')!;
    expect(run).toMatchObject({ outcome: 'success', clientGone: true });
    expect(await tokens(gw.url)).toEqual({ 'chat p/gpt-4o prompt': 2_500, 'chat p/gpt-4o completion': 40 });
    expect(await counts(gw.url, 'stormgate_requests_total', ['outcome'])).toEqual({ success: 1, replayed: 1 });
    expect(await counts(gw.url, 'stormgate_upstream_attempts_total', ['status_class'])).toEqual({ '2xx': 1 });
  });
});

describe('chargeback per client key (auth.keys) from the request log', () => {
  it('names the client, the answering target and the provider\'s request id on every line, retried and failed-over ones included', async () => {
    let n = 0;
    const gw = await gateway(
      {
        primary: (body) => (body.user === 'flaky' ? down503 : chatAnswer('a', bill(100 + ++n, 10), { id: `req_p_${n}` })),
        backup: () => chatAnswer('b', bill(777, 11), { id: 'req_b_1' }),
      },
      [route('chat', CHAT, [{ provider: 'primary' }, { provider: 'backup' }], { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } })],
      { auth: { keys: { 'team-a': 'sk-team-a-6d1f0c2e', 'team-b': 'sk-team-b-9a7c4b11' } } },
    );
    const a = sdk(gw.url, 'sk-team-a-6d1f0c2e');
    const b = sdk(gw.url, 'sk-team-b-9a7c4b11');
    const billed = [
      (await a.chat.completions.create({ model: 'gpt-4o', messages })).usage!,
      (await a.chat.completions.create({ model: 'gpt-4o', messages })).usage!,
      (await b.chat.completions.create({ model: 'gpt-4o', messages, user: 'flaky' })).usage!,
    ];
    await expect(sdk(gw.url, 'sk-nobody').chat.completions.create({ model: 'gpt-4o', messages })).rejects.toMatchObject({ status: 401 });
    const lines = await requestLines(gw, 4);
    const served = lines.filter((l) => l.outcome === 'success');
    expect(served.map((l) => [l.client, l.target, l.upstreamRequestId, l.attempts.length])).toEqual([
      ['team-a', 'primary/gpt-4o', 'req_p_1', 1],
      ['team-a', 'primary/gpt-4o', 'req_p_2', 1],
      ['team-b', 'backup/gpt-4o', 'req_b_1', 3],
    ]);
    expect(billed.map((u) => u.prompt_tokens)).toEqual([101, 102, 777]);
    // Every upstream request is in some line's attempts: the provider's request count is the lines' attempts.
    expect(served.reduce((sum, l) => sum + l.attempts.length, 0)).toBe(gw.seen.primary!.length + gw.seen.backup!.length);
    // The refused request went nowhere, and is counted as rejected with no route.
    expect(lines.find((l) => l.status === 401)?.client).toBeUndefined();
    expect(await counts(gw.url, 'stormgate_requests_total', ['route', 'outcome'])).toEqual({ 'chat success': 3, 'none rejected': 1 });
    // The tokens counter sums the route's targets: which team spent them is in the log, each line's usage next to its client.
    expect(await tokens(gw.url)).toEqual({ 'chat primary/gpt-4o prompt': 203, 'chat primary/gpt-4o completion': 20, 'chat backup/gpt-4o prompt': 777, 'chat backup/gpt-4o completion': 11 });
    const byClient: Record<string, { prompt: number; completion: number }> = {};
    for (const l of served) {
      const sum = (byClient[l.client] ??= { prompt: 0, completion: 0 });
      sum.prompt += l.usage.prompt;
      sum.completion += l.usage.completion;
    }
    expect(byClient).toEqual({ 'team-a': { prompt: 203, completion: 20 }, 'team-b': { prompt: 777, completion: 11 } });
  });
});

describe('attempts and requests when clients leave', () => {
  it('counts a whole answer whose client left as one aborted attempt and one client_gone request, billing nothing', async () => {
    const gw = await gateway({ p: () => ({ ...chatAnswer('late', bill(10, 10)), steps: [1_500, ...chatAnswer('late', bill(10, 10)).steps] }) }, [route('chat', CHAT, [{ provider: 'p' }])]);
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 300);
    await expect(sdk(gw.url).chat.completions.create({ model: 'gpt-4o', messages }, { signal: ac.signal })).rejects.toThrow();
    const [line] = await requestLines(gw, 1);
    expect(line).toMatchObject({ outcome: 'client_gone', clientGone: true });
    expect(gw.seen.p).toHaveLength(1);
    expect(await counts(gw.url, 'stormgate_upstream_attempts_total', ['status_class'])).toEqual({ aborted: 1 });
    expect(await counts(gw.url, 'stormgate_requests_total', ['outcome'])).toEqual({ client_gone: 1 });
    expect(await tokens(gw.url)).toEqual({});
  });

  it('bills an Anthropic stream whose client left mid-answer what Anthropic reported so far, once', async () => {
    const usage = aBill(50, 0, 0, 300);
    const gw = await gateway(
      { claude: { family: 'anthropic', answer: () => ({ ...aStream(['one ', 'two ', 'three'], usage), steps: aStream(['one ', 'two ', 'three'], usage).steps.flatMap((s, i) => (i === 3 ? [s, 2_000] : [s])) }) } },
      [route('chat', CHAT, [{ provider: 'claude', model: 'claude-haiku-4-5' }])],
    );
    const ac = new AbortController();
    const stream = await sdk(gw.url).chat.completions.create({ model: 'gpt-4o', messages, stream: true }, { signal: ac.signal });
    let text = '';
    // The SDK ends its iteration quietly on its own abort.
    for await (const c of stream) {
      text += c.choices[0]?.delta?.content ?? '';
      if (text === 'one ') ac.abort();
    }
    // The client left before the last part (sent 2 s later) came.
    expect(text).not.toContain('three');
    const [line] = await requestLines(gw, 1);
    expect(line).toMatchObject({ outcome: 'client_gone', streamEnd: 'client-gone' });
    expect(await counts(gw.url, 'stormgate_upstream_attempts_total', ['status_class'])).toEqual({ '2xx': 1 });
    expect(await tokens(gw.url)).toEqual({ 'chat claude/claude-haiku-4-5 prompt': 50, 'chat claude/claude-haiku-4-5 completion': 1 });
  });
});

describe('Anthropic\'s own API (/v1/messages) with the Anthropic SDK', () => {
  it('passes the usage through untouched and bills prompt-cache tokens as prompt tokens, whole, streamed and after a failover', async () => {
    const whole = aBill(12, 2_048, 30_000, 77);
    const streamed = aBill(13, 0, 30_000, 78);
    const gw = await gateway(
      {
        main: { family: 'anthropic', answer: () => json(529, { type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } }) },
        second: { family: 'anthropic', answer: (body) => (body.stream === true ? aStream(['Paid', ' in full.'], streamed) : aWhole('Paid in full.', whole)) },
      },
      [route('claude', '/v1/messages', [{ provider: 'main' }, { provider: 'second' }], { retry: { maxAttempts: 1 } })],
    );
    const client = new Anthropic({ baseURL: gw.url, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0 });
    const msg = await client.messages.create({ model: 'claude-sonnet-4-6', max_tokens: 256, messages });
    expect(msg.usage).toMatchObject(whole);
    const final = await client.messages.stream({ model: 'claude-sonnet-4-6', max_tokens: 256, messages }).finalMessage();
    expect(final.usage).toMatchObject(streamed);
    await requestLines(gw, 2);
    expect(await tokens(gw.url)).toEqual({ 'claude second/claude-sonnet-4-6 prompt': promptOf(whole) + promptOf(streamed), 'claude second/claude-sonnet-4-6 completion': 77 + 78 });
    expect(await counts(gw.url, 'stormgate_upstream_attempts_total', ['target', 'status_class'])).toEqual({ 'main/claude-sonnet-4-6 5xx': 2, 'second/claude-sonnet-4-6 2xx': 2 });
    expect(await counts(gw.url, 'stormgate_fallbacks_total', ['from', 'to', 'reason'])).toEqual({ 'main/claude-sonnet-4-6 second/claude-sonnet-4-6 retries_exhausted': 2 });
  });
});
