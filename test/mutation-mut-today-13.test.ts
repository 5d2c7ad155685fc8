// Mutation tests for the day's changes (QA rev13): a load_shed that names the target's rate holding it
// (src/pools/provider-pool.ts #expectedWait, the waiter's last-chance shed), a rate turn given back by `slot.unsent()`
// (once, and never after release), the delivered output as a completion (src/policy/client-rate.ts deliveredTokens,
// usedTokens; src/http/client-limits.ts settle; src/server.ts: a recovered stream's usage came only in part), and the
// config errors that quote a value at a key named for a quantity (src/config/zod-issues.ts). Each test kills a mutant
// that the suites of the day let live; pool tests run on a fake clock.
import OpenAI from 'openai';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { z } from 'zod';
import { describeZodIssues } from '../src/config/zod-issues.ts';
import { clientLimits } from '../src/http/client-limits.ts';
import { deliveredTokens, rateOf } from '../src/policy/client-rate.ts';
import { ratePool, rateReq, trackGrant } from './helpers/rate-pool.ts';
import type { StateStore } from '../src/state/store.ts';
import { recoveryConfig } from './helpers/recovery-config.ts';
import { TEST_KEY, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';

const pool = ratePool;
const req = rateReq;
const track = trackGrant;

describe('which wait a shed names (fake clock)', () => {
  beforeEach(() => vi.useFakeTimers({ now: 0 }));
  afterEach(() => vi.useRealTimers());

  it('names the request rate when it and the token rate hold a request exactly as long', async () => {
    // A request and a token every 2 s, one at once: both turns of the next request are at 2 s.
    const p = pool({ requests: rateOf(30, 1), tokens: rateOf(30, 1) });
    const first = await p.acquire(req({ tokens: 1 }));
    expect(first.ok).toBe(true);
    expect(await p.acquire(req({ tokens: 1, deadlineAtMs: 1_500 }))).toEqual({ ok: false, reason: 'request_rate', retryAfterMs: 2_000 });
    p.close();
  });

  it('names the capacity when its slots hold a request as long as its rate does (the rate is named only when longer)', async () => {
    // Its one slot held (a round trip of 1 s until one is timed) and its rate's next turn at 1 s.
    const p = pool({ requests: rateOf(60, 1) }, 1);
    const first = await p.acquire(req());
    expect(first.ok).toBe(true);
    expect(await p.acquire(req({ deadlineAtMs: 1_000, minAttemptMs: 100 }))).toEqual({ ok: false, reason: 'deadline', retryAfterMs: 1_000 });
    p.close();
  });

  it('names the rate when a waiter that could wait at first is shed at its last chance, its turns taken by a higher class', async () => {
    const p = pool({ requests: rateOf(60, 1) });
    const log: Array<[string, number]> = [];
    void track(p, 'a', req(), log);
    await vi.advanceTimersByTimeAsync(0);
    // Its turn at 1 s: it waits, its last chance at 4.9 s.
    const batch = p.acquire(req({ cls: 1, deadlineAtMs: 5_000, minAttemptMs: 100 }));
    await vi.advanceTimersByTimeAsync(500);
    // Six online requests go first, at 1 s to 6 s: the batch's turn is at 7 s, past its deadline.
    for (let i = 0; i < 6; i++) void track(p, `online${i}`, req(), log);
    await vi.advanceTimersByTimeAsync(4_400);
    const shed = await batch;
    expect(shed.ok).toBe(false);
    expect(!shed.ok && shed.reason).toBe('request_rate');
    expect(p.rateShedWhy(!shed.ok && shed.reason !== 'aborted' ? shed.reason : 'deadline', 'batch')).toMatch(/request rate \(60\/min, pools\.requestsPerMinute\)/);
    p.close();
  });
});

describe('a rate turn given back by slot.unsent() (fake clock)', () => {
  beforeEach(() => vi.useFakeTimers({ now: 0 }));
  afterEach(() => vi.useRealTimers());

  it('goes back once however often it is called: a second call gives back no turn that another request spent', async () => {
    // 6,000 tokens a minute (10 ms each), all at once: a's 1,000 and b's 5,000 spend them all, up to 60 s.
    const p = pool({ tokens: rateOf(6_000, 6_000) });
    const a = await p.acquire(req({ tokens: 1_000 }));
    const b = await p.acquire(req({ tokens: 5_000 }));
    expect(a.ok && b.ok).toBe(true);
    if (a.ok) {
      a.slot.unsent();
      a.slot.unsent();
    }
    // a's 1,000 back: 6,000 more fit once b's 5,000 have, at 50 s; not at 40 s, as a's given back twice would have it.
    const log: Array<[string, number]> = [];
    void track(p, 'c', req({ tokens: 6_000 }), log);
    await vi.advanceTimersByTimeAsync(50_000);
    expect(log).toEqual([['c', 50_000]]);
    p.close();
  });

  it('gives back nothing once the slot was released (its request was sent, and its answer came)', async () => {
    const p = pool({ requests: rateOf(60, 1) });
    const a = await p.acquire(req());
    expect(a.ok).toBe(true);
    if (a.ok) {
      a.slot.release();
      a.slot.unsent();
    }
    const log: Array<[string, number]> = [];
    void track(p, 'b', req(), log);
    await vi.advanceTimersByTimeAsync(1_000);
    expect(log).toEqual([['b', 1_000]]);
    p.close();
  });
});

describe('the output delivered as a completion', () => {
  it('counts no output of a negative count of characters', () => {
    expect(deliveredTokens(-4, 0)).toBe(0);
    expect(deliveredTokens(-4, 10)).toBe(0);
  });

  it('settles a stream whose usage came in part to at least its delivered output, at most its completion cap', () => {
    const spent: number[] = [];
    const store = { spendTokens: (_c: string, _r: unknown, tokens: number) => void spent.push(tokens) } as unknown as StateStore;
    const limits = clientLimits({ agents: { tokensPerMinute: 6_000 } }, { store, now: () => 0, random: () => 0, onLimited: () => {} })!;
    const reserved = { prompt: 12, completion: 3 };
    // message_start's usage (12 in, 1 out) and 28 characters delivered (7 tokens), under a cap of 3: 15, as reserved.
    limits.settle('agents', reserved, { usage: [{ prompt: 12, completion: 1 }], sentUpstream: true, outputChars: 28, usagePartial: true });
    expect(spent).toEqual([]);
    // Uncapped, the 7 tokens delivered; ended whole, the usage alone.
    limits.settle('agents', { prompt: 12, completion: 0 }, { usage: [{ prompt: 12, completion: 1 }], sentUpstream: true, outputChars: 28, usagePartial: true });
    limits.settle('agents', reserved, { usage: [{ prompt: 12, completion: 1 }], sentUpstream: true, outputChars: 28, usagePartial: false });
    expect(spent).toEqual([7, -2]);
  });
});

describe('a config error at a key named for a quantity', () => {
  it('quotes the value only at a key that ends with the quantity\'s name, not at one that holds it inside', () => {
    const schema = z.strictObject({ refreshTokensSecret: z.number(), maxTokens: z.number() });
    const data = { refreshTokensSecret: 'sk-secret', maxTokens: 'lots' };
    const messages = describeZodIssues(schema, schema.safeParse(data).error!.issues, data).map((i) => i.message);
    expect(messages).toEqual(['expected number, received string', 'expected number, received string ("lots")']);
  });
});

describe("a recovered stream's usage, settled against its client's token rate", () => {
  const start = useStacks();
  const startMock = useExtraMocks();
  const TOKENS_PER_MINUTE = 3;
  const MS_PER_TOKEN = 60_000 / TOKENS_PER_MINUTE;

  /** The tokens charged so far, read from the next request's refusal (as test/client-rate-delivered.test.ts does). */
  async function charged(stack: Stack, agents: OpenAI): Promise<number> {
    const deadline = Date.now() + 10_000;
    while (!stack.logs.some((l) => l.includes('"outcome"'))) {
      if (Date.now() > deadline) throw new Error('timed out waiting for the log line');
      await new Promise((r) => setTimeout(r, 10));
    }
    const refused = await agents.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(OpenAI.RateLimitError);
    const waitMs = Number((refused as InstanceType<typeof OpenAI.RateLimitError>).headers.get('retry-after-ms'));
    return TOKENS_PER_MINUTE - 1 + Math.round(waitMs / MS_PER_TOKEN);
  }

  it('counts its completion as at least the output both providers passed on: the broken part reported none of its own', async () => {
    // `p` cuts after 2 of 8 chunks (14 characters) before its usage chunk; `q`, asked afresh, answers all 56 with usage.
    const q = await startMock({ apiKey: 'q-key-0123456789' });
    const stack = await start({
      faults: { stream: { chunks: 8, cutAfterChunks: 2 } },
      config: (mockUrl) => {
        const config = recoveryConfig({ pOrigin: mockUrl, qOrigin: q.url, qPools: {}, extra: { auth: { keys: { agents: 'key-agents' }, limits: { agents: { tokensPerMinute: TOKENS_PER_MINUTE } } } } });
        return { ...config, providers: { ...config.providers, p: { ...config.providers.p!, apiKey: TEST_KEY } } };
      },
      deps: { random: () => 0 },
    });
    const agents = new OpenAI({ baseURL: stack.baseURL, apiKey: 'key-agents', maxRetries: 0 });
    const params = { model: 'gpt-4o-mini', messages: [{ role: 'user' as const, content: 'Tell me everything about retry storms, please.' }], stream: true as const, stream_options: { include_usage: true } };
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const chunk of await agents.chat.completions.create(params)) usage ??= chunk.usage ?? undefined;
    expect(stack.logs.find((l) => l.includes('"outcome"'))).toContain('"streamEnd":"recovered"');
    expect(usage).toBeDefined();
    // 70 characters passed on by the two streams: 18 tokens, more than the 14 `q` reported for its own answer.
    const delivered = Math.ceil((14 + 56) / 4);
    expect(usage!.completion_tokens).toBeLessThan(delivered);
    expect(await charged(stack, agents)).toBe(usage!.prompt_tokens + delivered);
  });
});
