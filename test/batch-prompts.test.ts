// A legacy completion (POST /v1/completions) with a batch of prompts: `prompt` a list of strings or of token lists is
// answered with `n` choices for each prompt (index prompt × n + k), in one answer or one stream. Follow-ups of
// third-party-suite-69 (the stream's expected choices):
// - the token estimate (src/policy/token-estimate.ts: pools.tokensPerMinute, auth.limits.*.tokensPerMinute and the cap
//   on what a stream without usage is billed) reserved the completion cap × n once, not for each prompt: a batch of 20
//   prompts with max_tokens 500 reserved 500 tokens and used up to 10,000;
// - the bundled mock answered a batch from its first prompt alone, and a legacy completion's `n` not at all (one
//   choice whatever was asked), so no suite could reproduce batch behaviour against it.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { ConfigSchema } from '../src/config/schema.ts';
import { requestTokens } from '../src/mock/rate-limit.ts';
import { estimatedTokens, promptCount, tokenEstimate } from '../src/policy/token-estimate.ts';
import { streamShapeOf } from '../src/streaming/stream-events.ts';
import { startMock, type MockServer } from '../src/mock/server.ts';
import { defaultConfig, RETRY_LOOP_ONLY, useExtraMocks, useGateways, useStacks } from './helpers/stack.ts';

const MODEL = 'gpt-3.5-turbo-instruct';
const PROMPTS = ['The capital of France is', 'Write a haiku about the sea, please, in English'];
const estimateOf = (body: Record<string, unknown>) => tokenEstimate('completions', Buffer.byteLength(JSON.stringify(body)), body);

describe('the token estimate of a legacy completion with a batch of prompts', () => {
  it('reserves the completion cap × n for each prompt of a batch of strings or of token lists', () => {
    expect(tokenEstimate('completions', 400, { prompt: ['a', 'b', 'c'], max_tokens: 16, n: 2 })).toEqual({ prompt: 100, completion: 96 });
    expect(tokenEstimate('completions', 400, { prompt: [[791, 6864], [791, 6864, 315]], max_tokens: 10 })).toEqual({ prompt: 100, completion: 20 });
    expect(estimatedTokens('completions', 400, { prompt: ['a', 'b', 'c', 'd'], max_tokens: 25, n: 3 })).toBe(100 + 300);
    // One prompt: a string, a token list (a list of numbers), a batch of one; a list of mixed kinds is no batch (the
    // provider refuses it) and counts once.
    for (const prompt of ['a', [791, 6864, 315], ['a'], [[791, 6864]], ['a', 1], [], undefined]) {
      expect(tokenEstimate('completions', 400, { prompt, max_tokens: 10, n: 2 }).completion).toBe(20);
    }
    // Chat has no batch: a stray `prompt` list changes nothing.
    expect(tokenEstimate('chat', 400, { prompt: ['a', 'b'], max_tokens: 10, n: 2 }).completion).toBe(20);
    // Capped as a single prompt's is.
    expect(tokenEstimate('completions', 400, { prompt: Array(1000).fill('a'), max_tokens: 100_000, n: 128 }).completion).toBe(10_000_000);
    // Without a cap, the prompt alone, whatever the batch.
    expect(tokenEstimate('completions', 400, { prompt: ['a', 'b'], n: 2 })).toEqual({ prompt: 100, completion: 0 });
  });

  it('counts every prompt\'s text in the prompt part (the whole body\'s bytes / 4)', () => {
    const one = estimateOf({ model: MODEL, prompt: ['x'.repeat(800)] });
    const two = estimateOf({ model: MODEL, prompt: ['x'.repeat(800), 'y'.repeat(800)] });
    // The second prompt's 800 characters, its quotes and comma: ~201 tokens more.
    expect(two.prompt - one.prompt).toBeGreaterThanOrEqual(200);
    expect(two.prompt - one.prompt).toBeLessThanOrEqual(202);
    // Token lists: each id's digits and comma, at bytes / 4, are more than the ids themselves (the safe side).
    const ids = Array.from({ length: 100 }, (_, i) => 10_000 + i);
    expect(estimateOf({ model: MODEL, prompt: [ids, ids] }).prompt).toBeGreaterThanOrEqual(200);
  });

  it('counts prompts by one rule for the estimate, the stream\'s expected choices and the mock\'s rate limit', () => {
    for (const [prompt, count] of [[PROMPTS, 2], [[[1], [2], [3]], 3], [[1, 2, 3], 1], ['a', 1], [['a'], 1], [['a', 1], 1]] as const) {
      expect(promptCount(prompt)).toBe(count);
      expect(streamShapeOf('completions', { prompt, n: 2 }).choices).toBe(2 * count);
      const body = { prompt, max_tokens: 10, n: 2 };
      expect(tokenEstimate('completions', 400, body).completion).toBe(20 * count);
      expect(requestTokens(400, body)).toBe(100 + 20 * count);
    }
  });
});

describe('a batch against a client token rate, over HTTP', () => {
  const startGateway = useGateways();
  const startMock = useExtraMocks();

  it('reserves max_tokens × n for each prompt: a batch whose reservation no longer fits is refused with that estimate', async () => {
    const mock = await startMock();
    const config = ConfigSchema.parse({ ...defaultConfig(mock.url, RETRY_LOOP_ONLY), auth: { keys: { agents: 'key-agents' }, limits: { agents: { tokensPerMinute: 1_000 } } } });
    const url = await startGateway(config);
    const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'key-agents', maxRetries: 0 });
    const body = { model: MODEL, prompt: ['a', 'b', 'c', 'd'], max_tokens: 150, n: 2 };
    const estimate = Math.ceil(JSON.stringify(body).length / 4) + 150 * 2 * 4;
    // The first fits the full rate (1,200 + ~20 of 1,000: one larger than a minute's worth goes when the rate is full),
    // and is settled to what it used; the second's 1,200 no longer fit. Counted once, each reserved 300 and both went.
    const first = await client.completions.create(body);
    expect(first.choices).toHaveLength(8);
    const refused = (await client.completions.create(body).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(refused).toBeInstanceOf(OpenAI.RateLimitError);
    expect(refused.code).toBe('client_rate_limited');
    expect(refused.message).toContain(`estimate: ${estimate} tokens`);
    expect(mock.stats().total).toBe(1);
  });
});

/** Reads a completion stream: each choice's text and finish_reasons by index, the chunks' usage, the error raised. */
async function readChoices(stream: AsyncIterable<OpenAI.Completion>) {
  const texts: string[] = [];
  const finishes: string[][] = [];
  let usage: OpenAI.CompletionUsage | undefined;
  let err: unknown;
  try {
    for await (const c of stream) {
      if (c.usage) usage = c.usage;
      for (const ch of c.choices) {
        texts[ch.index] = (texts[ch.index] ?? '') + ch.text;
        finishes[ch.index] ??= [];
        if (ch.finish_reason) finishes[ch.index]!.push(ch.finish_reason);
      }
    }
  } catch (e) {
    err = e;
  }
  return { texts, finishes, usage, err };
}

describe('the mock answers a legacy completion as OpenAI does: n choices for each prompt', () => {
  const withMock = async (run: (openai: OpenAI, mock: MockServer) => Promise<void>) => {
    const mock = await startMock({ quiet: true });
    try {
      await run(new OpenAI({ baseURL: `${mock.url}/v1`, apiKey: 'k', maxRetries: 0, logLevel: 'off' }), mock);
    } finally {
      await mock.close();
    }
  };

  it('answers a batch of strings with n choices each, indexed prompt × n + k, each from its own prompt, usage summing all', () =>
    withMock(async (openai) => {
      const singles = await Promise.all(PROMPTS.map((prompt) => openai.completions.create({ model: MODEL, prompt })));
      const batch = await openai.completions.create({ model: MODEL, prompt: PROMPTS, n: 2 });
      expect(batch.choices.map((c) => c.index)).toEqual([0, 1, 2, 3]);
      expect(batch.choices.map((c) => c.text)).toEqual([0, 0, 1, 1].map((p) => singles[p]!.choices[0]!.text));
      expect(batch.choices.every((c) => c.finish_reason === 'stop')).toBe(true);
      expect(singles[0]!.choices[0]!.text).not.toBe(singles[1]!.choices[0]!.text);
      const prompt = singles[0]!.usage!.prompt_tokens + singles[1]!.usage!.prompt_tokens;
      const completion = 2 * (singles[0]!.usage!.completion_tokens + singles[1]!.usage!.completion_tokens);
      expect(batch.usage).toEqual({ prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion });
    }));

  it('honours n for one prompt, and counts a token list as one prompt and a list of token lists as a batch', () =>
    withMock(async (openai) => {
      const three = await openai.completions.create({ model: MODEL, prompt: 'hello mock', n: 3 });
      expect(three.choices.map((c) => c.index)).toEqual([0, 1, 2]);
      expect(new Set(three.choices.map((c) => c.text)).size).toBe(1);
      expect(three.usage!.completion_tokens).toBe(3 * (await openai.completions.create({ model: MODEL, prompt: 'hello mock' })).usage!.completion_tokens);
      expect((await openai.completions.create({ model: MODEL, prompt: [791, 6864, 315] })).choices).toHaveLength(1);
      const lists = await openai.completions.create({ model: MODEL, prompt: [[791, 6864], [791, 6864, 315]] });
      expect(lists.choices.map((c) => c.index)).toEqual([0, 1]);
      expect(lists.choices[0]!.text).not.toBe(lists.choices[1]!.text);
    }));

  it('cuts each choice at max_tokens with finish_reason "length"', () =>
    withMock(async (openai) => {
      const c = await openai.completions.create({ model: MODEL, prompt: PROMPTS, n: 2, max_tokens: 2 });
      expect(c.choices.map((ch) => [ch.index, ch.finish_reason, ch.text.length])).toEqual([0, 1, 2, 3].map((i) => [i, 'length', 8]));
      expect(c.usage!.completion_tokens).toBe(8);
    }));

  it('streams every choice by its index, each with its own text and one finish_reason, then the usage of all', () =>
    withMock(async (openai) => {
      const whole = await openai.completions.create({ model: MODEL, prompt: PROMPTS, n: 2 });
      const s = await readChoices(await openai.completions.create({ model: MODEL, prompt: PROMPTS, n: 2, stream: true, stream_options: { include_usage: true } }));
      expect(s.err).toBeUndefined();
      expect(s.texts).toEqual(whole.choices.map((c) => c.text));
      expect(s.finishes).toEqual([['stop'], ['stop'], ['stop'], ['stop']]);
      expect(s.usage).toEqual(whole.usage);
    }));
});

describe('a batch through the gateway against the mock', () => {
  const startStack = useStacks(RETRY_LOOP_ONLY);

  it('passes on every prompt\'s n choices, whole and streamed', async () => {
    const s = await startStack();
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'k', maxRetries: 0 });
    const whole = await client.completions.create({ model: MODEL, prompt: PROMPTS, n: 2 });
    expect(whole.choices.map((c) => c.index)).toEqual([0, 1, 2, 3]);
    const streamed = await readChoices(await client.completions.create({ model: MODEL, prompt: PROMPTS, n: 2, stream: true }));
    expect(streamed.err).toBeUndefined();
    expect(streamed.texts).toEqual(whole.choices.map((c) => c.text));
    expect(streamed.finishes).toEqual([['stop'], ['stop'], ['stop'], ['stop']]);
  });
});
