// A client's token rate (auth.limits.<name>.tokensPerMinute) settled for a stream whose answer came without usage: the
// official `openai` SDK against the bundled mock (which sends a stream's usage only when asked: include_usage), over
// real HTTP. What the client was charged is read from the next request's refusal: at 3 tokens a minute (a token each
// 20 s, 3 at once) one request overdraws the rate, and the 429's retry-after-ms is the overdraft's time to pay back.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import type { FaultSpec } from '../src/mock/faults.ts';
import { deliveredTokens, settlement, usedTokens } from '../src/policy/client-rate.ts';
import { eventMeaning, outputChars, type OutputTally } from '../src/streaming/stream-events.ts';
import type { SseEvent } from '../src/streaming/sse-parser.ts';
import { recoveryConfig } from './helpers/recovery-config.ts';
import { defaultConfig, RETRY_LOOP_ONLY, TEST_KEY, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';

/** 3 tokens a minute: a token each 20 s, a bucket of 3. */
const TOKENS_PER_MINUTE = 3;
const MS_PER_TOKEN = 60_000 / TOKENS_PER_MINUTE;
/** A user message of 40 characters or more: the mock answers "Mock answer to: " and its first 40, 56 characters a choice. */
const question = 'Tell me everything about retry storms, please.';
const ANSWER_CHARS = 56;
const messages = [{ role: 'user' as const, content: question }];

describe('settlement without usage: the output delivered as the completion', () => {
  it('estimates the output delivered as its characters / 4, rounded up, at most the completion cap reserved (none: unbounded)', () => {
    expect(deliveredTokens(0, 0)).toBe(0);
    expect(deliveredTokens(1, 0)).toBe(1);
    expect(deliveredTokens(16_000, 0)).toBe(4_000);
    expect(deliveredTokens(16_001, 0)).toBe(4_001);
    expect(deliveredTokens(16_000, 500)).toBe(500);
    expect(deliveredTokens(400, 500)).toBe(100);
  });

  it('keeps the prompt and the delivered output without usage; exact with usage; all back when nothing was sent', () => {
    // 4,000 tokens streamed without a cap and no usage: charged its prompt and them, no longer its prompt alone.
    expect(settlement({ prompt: 1_000, completion: 0 }, undefined, true, 16_000)).toBe(4_000);
    // Under a cap of 500, at most the cap: the reservation stands.
    expect(settlement({ prompt: 1_000, completion: 500 }, undefined, true, 16_000)).toBe(0);
    expect(settlement({ prompt: 1_000, completion: 500 }, undefined, true, 400)).toBe(-400);
    // Nothing delivered (an error answer): the cap given back, as before.
    expect(settlement({ prompt: 1_000, completion: 500 }, undefined, true)).toBe(-500);
    expect(settlement({ prompt: 1_000, completion: 500 }, undefined, true, 0)).toBe(-500);
    // With usage, the usage alone, whatever was delivered.
    expect(settlement({ prompt: 1_000, completion: 500 }, 1_200, true, 16_000)).toBe(-300);
    // Never sent upstream: all given back.
    expect(settlement({ prompt: 1_000, completion: 500 }, undefined, false, 16_000)).toBe(-1_500);
  });
});

describe('settlement with usage that came only in part: the output delivered as the least completion', () => {
  it('sums the usage reported, its completion at least the delivered output given (a stream that did not end whole)', () => {
    expect(usedTokens([])).toBeUndefined();
    expect(usedTokens([undefined, undefined], 7)).toBeUndefined();
    expect(usedTokens([{ prompt: 12, completion: 1 }])).toBe(13);
    // An Anthropic stream left mid-answer: message_start's prompt and output of 1, and 28 characters delivered.
    expect(usedTokens([{ prompt: 12, completion: 1 }], 7)).toBe(19);
    // A completion reported larger than the output delivered stands (reasoning not passed on, say).
    expect(usedTokens([{ prompt: 12, completion: 40 }], 7)).toBe(52);
    // A recovered stream: its broken part's usage and its continuation's, the delivered output over both.
    expect(usedTokens([{ prompt: 12, completion: 1 }, { prompt: 20, completion: 14 }], 18)).toBe(12 + 20 + 18);
    expect(usedTokens([undefined, { prompt: 20, completion: 14 }], 10)).toBe(34);
  });
});

describe('the output an event carries (outputChars), counted as its meaning is read', () => {
  const ev = (data: unknown, event: string | null = null): SseEvent => {
    const text = typeof data === 'string' ? data : JSON.stringify(data);
    return { raw: `data: ${text}`, data: text, event };
  };
  const counted = (api: Parameters<typeof eventMeaning>[0], events: SseEvent[]) => {
    const tally: OutputTally = { chars: 0 };
    for (const e of events) eventMeaning(api, e, tally);
    return tally.chars;
  };

  it('counts every choice\'s text, reasoning, refusal and tool calls of a chat stream, and nothing of its role, usage, [DONE] or malformed events', () => {
    const chunk = (delta: object, finish: string | null = null, index = 0) => ev({ object: 'chat.completion.chunk', choices: [{ index, delta, finish_reason: finish }] });
    expect(counted('chat', [
      chunk({ role: 'assistant', content: '' }),
      chunk({ reasoning_content: 'think' }),
      chunk({ content: 'Hello' }),
      chunk({ content: 'Hi' }, null, 1),
      chunk({ refusal: 'no' }),
      chunk({ tool_calls: [{ index: 0, id: 'c', type: 'function', function: { name: 'get', arguments: '' } }] }),
      chunk({ tool_calls: [{ index: 0, function: { arguments: '{"x":1}' } }] }),
      chunk({ content: [{ type: 'thinking', thinking: [{ type: 'text', text: 'hm' }] }] }),
      chunk({ content: '!' }, 'stop'),
      ev({ object: 'chat.completion.chunk', choices: [], usage: { prompt_tokens: 1, completion_tokens: 2 } }),
      ev('{not json'),
      ev('[DONE]'),
    ])).toBe(5 + 5 + 2 + 2 + 3 + 7 + 2 + 1);
    expect(counted('completions', [ev({ object: 'text_completion', choices: [{ index: 0, text: 'abc', finish_reason: null }] })])).toBe(3);
  });

  it('counts reasoning sent under both its names once (vLLM copies `reasoning` into `reasoning_content`)', () => {
    const chunk = (delta: object) => ev({ object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: null }] });
    expect(counted('chat', [chunk({ reasoning: 'think', reasoning_content: 'think' }), chunk({ reasoning: null, reasoning_content: null, content: 'Hi' })])).toBe(5 + 2);
    // One name alone, either of them, counts as before.
    expect(counted('chat', [chunk({ reasoning_content: 'think' }), chunk({ reasoning: 'hmm' })])).toBe(5 + 3);
  });

  it('counts a Responses API stream\'s deltas (not audio\'s, nor an item\'s done) and an Anthropic stream\'s text, thinking and tool input', () => {
    expect(counted('responses', [
      ev({ type: 'response.output_text.delta', delta: 'Hello' }),
      ev({ type: 'response.reasoning_summary_text.delta', delta: 'why' }),
      ev({ type: 'response.function_call_arguments.delta', delta: '{}' }),
      ev({ type: 'response.audio.delta', delta: 'AAAA' }),
      ev({ type: 'response.output_item.done', item: { type: 'message', content: [{ type: 'output_text', text: 'Hello' }] } }),
    ])).toBe(5 + 3 + 2);
    expect(counted('messages', [
      ev({ type: 'message_start', message: { usage: { input_tokens: 10, output_tokens: 1 } } }),
      ev({ type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } }),
      ev({ type: 'content_block_delta', index: 0, delta: { type: 'thinking_delta', thinking: 'hmm' } }),
      ev({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: 'Hello' } }),
      ev({ type: 'content_block_delta', index: 1, delta: { type: 'input_json_delta', partial_json: '{"a":' } }),
      ev({ type: 'message_delta', delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 9 } }),
    ])).toBe(3 + 5 + 5);
    expect(outputChars('chat', { choices: [null, { delta: null }] })).toBe(0);
  });
});

describe('a token rate settled for a stream that came without usage', () => {
  const start = useStacks();
  const startMock = useExtraMocks();

  async function gateway(faults: FaultSpec = {}): Promise<{ stack: Stack; agents: OpenAI }> {
    const stack = await start({
      faults,
      config: (mockUrl) => ({ ...defaultConfig(mockUrl, RETRY_LOOP_ONLY), auth: { keys: { agents: 'key-agents' }, limits: { agents: { tokensPerMinute: TOKENS_PER_MINUTE } } } }),
      // No spread on the retry-after: it is the wait itself.
      deps: { random: () => 0 },
    });
    return { stack, agents: new OpenAI({ baseURL: stack.baseURL, apiKey: 'key-agents', maxRetries: 0 }) };
  }

  /** What a body reserves for its prompt: its bytes / 4, rounded up (the SDK sends the params as JSON, in order). */
  const promptEstimate = (params: object) => Math.ceil(Buffer.byteLength(JSON.stringify(params)) / 4);

  /**
   * The tokens the client was charged so far, read from the refusal of its next request: due - (burst - 1) × interval
   * is the wait, so the charge is burst - 1 + wait / interval, less the time since the first reservation (under 10 s).
   */
  async function charged(stack: Stack, agents: OpenAI): Promise<number> {
    // The first request is settled when it ends, as its log line is written (after the settlement).
    await until(() => stack.logs.some((l) => l.includes('"outcome"')));
    const refused = await agents.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(OpenAI.RateLimitError);
    const waitMs = Number((refused as InstanceType<typeof OpenAI.RateLimitError>).headers.get('retry-after-ms'));
    return TOKENS_PER_MINUTE - 1 + Math.round(waitMs / MS_PER_TOKEN);
  }

  it('charges the prompt and the output delivered (its characters / 4) when a whole stream came without usage', async () => {
    const { stack, agents } = await gateway();
    const params = { model: 'gpt-4o-mini', messages, n: 4, stream: true as const };
    let text = '';
    for await (const chunk of await agents.chat.completions.create(params)) for (const c of chunk.choices) text += c.delta.content ?? '';
    expect(text.length).toBe(4 * ANSWER_CHARS);
    // 224 characters delivered, 56 tokens: charged only its prompt, the client could ask for answers of any length.
    expect(await charged(stack, agents)).toBe(promptEstimate(params) + 56);
  });

  it('charges what was delivered before the client left mid-stream', async () => {
    // 8 chunks of 7 characters a choice; the mock stops after 4 and holds the connection until the client leaves.
    const { stack, agents } = await gateway({ stream: { chunks: 8, stallAfterChunks: 4 } });
    const params = { model: 'gpt-4o-mini', messages, n: 4, stream: true as const };
    const stream = await agents.chat.completions.create(params);
    let text = '';
    for await (const chunk of stream) {
      for (const c of chunk.choices) text += c.delta.content ?? '';
      if (text.length === 4 * 4 * 7) break; // the SDK aborts the request as the loop is left
    }
    // 112 characters delivered: 28 tokens.
    expect(await charged(stack, agents)).toBe(promptEstimate(params) + 28);
  });

  it('charges what was delivered before the upstream cut the stream', async () => {
    // 8 chunks of 7 characters a choice; the mock's socket is destroyed after 2 (the client gets an error event).
    const { stack, agents } = await gateway({ stream: { chunks: 8, cutAfterChunks: 2 } });
    const params = { model: 'gpt-4o-mini', messages, n: 4, stream: true as const };
    let text = '';
    const broke = await (async () => {
      for await (const chunk of await agents.chat.completions.create(params)) for (const c of chunk.choices) text += c.delta.content ?? '';
    })().catch((e: unknown) => e);
    expect(broke).toBeInstanceOf(OpenAI.APIError);
    expect(text.length).toBe(4 * 2 * 7);
    // 56 characters delivered: 14 tokens.
    expect(await charged(stack, agents)).toBe(promptEstimate(params) + 14);
  });

  it('charges what a recovered stream delivered, its continuation\'s output included', async () => {
    // The primary `p` (the stack's mock) cuts after 2 of 8 chunks; the continuation from `q` finishes the answer.
    const q = await startMock();
    const limits = { agents: { tokensPerMinute: TOKENS_PER_MINUTE } };
    const stack = await start({
      faults: { stream: { chunks: 8, cutAfterChunks: 2 } },
      config: (mockUrl) => {
        // The stack's mock takes the stack's key.
        const config = recoveryConfig({ pOrigin: mockUrl, qOrigin: q.url, qPools: {}, extra: { auth: { keys: { agents: 'key-agents' }, limits } } });
        return { ...config, providers: { ...config.providers, p: { ...config.providers.p!, apiKey: TEST_KEY } } };
      },
      deps: { random: () => 0 },
    });
    const agents = new OpenAI({ baseURL: stack.baseURL, apiKey: 'key-agents', maxRetries: 0 });
    const params = { model: 'gpt-4o-mini', messages, stream: true as const };
    let text = '';
    for await (const chunk of await agents.chat.completions.create(params)) for (const c of chunk.choices) text += c.delta.content ?? '';
    expect(q.stats().total).toBe(1);
    expect(stack.logs.find((l) => l.includes('"outcome"'))).toContain('"streamEnd":"recovered"');
    // The continuation's answer is spliced after the 14 characters delivered: the client has the whole answer once.
    expect(text.length).toBe(ANSWER_CHARS);
    // Charged what each stream passed on: the 14 of `p`'s, and all 56 of the continuation's (asked again from the
    // start, which `q` generated and bills, its first 14 cut off for the client), 70 characters: 18 tokens.
    expect(await charged(stack, agents)).toBe(promptEstimate(params) + Math.ceil((14 + ANSWER_CHARS) / 4));
  });

  it('charges no more of the delivered output than the completion cap the request reserved', async () => {
    const { stack, agents } = await gateway();
    // A cap of 5 a choice, 20 for the 4: the mock answers past it (224 characters, 56 tokens).
    const params = { model: 'gpt-4o-mini', messages, n: 4, max_tokens: 5, stream: true as const };
    for await (const chunk of await agents.chat.completions.create(params)) void chunk;
    expect(await charged(stack, agents)).toBe(promptEstimate(params) + 20);
  });

  it('charges the usage the stream reported, when it did', async () => {
    const { stack, agents } = await gateway();
    const params = { model: 'gpt-4o-mini', messages, n: 4, stream: true as const, stream_options: { include_usage: true } };
    let total = 0;
    for await (const chunk of await agents.chat.completions.create(params)) total += chunk.usage?.total_tokens ?? 0;
    expect(total).toBeGreaterThan(0);
    expect(await charged(stack, agents)).toBe(total);
  });

  it('charges what was delivered before the client left an Anthropic stream, whose usage so far says an output of 1', async () => {
    // The translator's usage when the client leaves: message_start's input (the mock's: the prompt's characters / 4)
    // and output_tokens 1; message_delta, with the output's count, would come only at the end.
    const stack = await start({
      faults: { stream: { chunks: 8, stallAfterChunks: 4 } },
      config: (mockUrl) => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: { claude: { family: 'anthropic', baseUrl: mockUrl, apiKey: TEST_KEY, breaker: false } },
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'claude', model: 'claude-sonnet-4-6' }], ...RETRY_LOOP_ONLY.route }],
        auth: { keys: { agents: 'key-agents' }, limits: { agents: { tokensPerMinute: TOKENS_PER_MINUTE } } },
      }),
      deps: { random: () => 0 },
    });
    const agents = new OpenAI({ baseURL: stack.baseURL, apiKey: 'key-agents', maxRetries: 0 });
    let text = '';
    for await (const chunk of await agents.chat.completions.create({ model: 'gpt-4o-mini', messages, stream: true })) {
      for (const c of chunk.choices) text += c.delta.content ?? '';
      if (text.length === 4 * 7) break;
    }
    // 12 prompt tokens (46 characters), and 28 characters delivered: 7 tokens, not the 1 message_start reported.
    expect(await charged(stack, agents)).toBe(Math.ceil(question.length / 4) + 7);
  });
});

async function until(check: () => boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error('timed out waiting');
    await new Promise((r) => setTimeout(r, 10));
  }
}
