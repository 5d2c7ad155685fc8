// Review 2026-12-06: a client token rate (auth.limits.<name>.tokensPerMinute) against requests whose estimate is more
// than a minute's worth (Claude Code's max_tokens of 32,000 against tokensPerMinute: 20000), over real HTTP with the
// official SDKs at their default retries. Two requests refused by their estimates together: the first is told its own
// wait, the second a slot of the estimate's time (a minute's worth, capped) after it, so past 60 s with
// x-should-retry: false, and its SDK gives up at once, though the rate is full again a second or two later, once the
// request before it settled for its real usage. These tests pin what the gateway does today (README "Client keys":
// the refusal queue); what it should do instead is a design question (see the report).
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { clientRates, reserveTokens, retryAfterOf, spend, type ClientDues } from '../src/policy/client-rate.ts';
import { RETRY_LOOP_ONLY, TEST_KEY, defaultConfig, useStacks, type Stack } from './helpers/stack.ts';

const startStack = useStacks();

const TOKENS_PER_MINUTE = 20_000;
const MAX_TOKENS = 32_000;
/** A prompt of 4,800 characters: the mock bills ~1,200 input tokens, so a settled answer holds the rate ~3.6 s. */
const PROMPT = 'Summarise the retry storm in this log. '.repeat(124).slice(0, 4_800);
const limits = { keys: { agents: 'key-agents' }, limits: { agents: { tokensPerMinute: TOKENS_PER_MINUTE } } };

/** What each HTTP request of an SDK was answered with, its own retries included. */
interface Seen {
  status: number;
  retryAfterMs: number | undefined;
  shouldRetry: string | null;
  atMs: number;
}

function recording(t0: number) {
  const seen: Seen[] = [];
  const fetchRecorded = async (input: string | URL | Request, init?: RequestInit) => {
    const res = await fetch(input, init);
    const ra = res.headers.get('retry-after-ms');
    seen.push({ status: res.status, retryAfterMs: ra === null ? undefined : Number(ra), shouldRetry: res.headers.get('x-should-retry'), atMs: Date.now() - t0 });
    return res;
  };
  return { seen, fetchRecorded };
}

async function anthropicStack(): Promise<Stack> {
  return startStack({
    config: (url) => ({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: { claude: { family: 'anthropic', baseUrl: url, apiKey: TEST_KEY, breaker: false } },
      routes: [{ name: 'messages', match: { path: '/v1/messages' }, targets: [{ provider: 'claude' }], ...RETRY_LOOP_ONLY.route }],
      auth: limits,
    }),
  });
}

describe('a token estimate larger than a minute\'s worth of the client\'s rate (Claude Code: max_tokens 32,000, 20,000 a minute)', () => {
  it('tells the second of two refusals a minute past the first, x-should-retry: false, and the Anthropic SDK gives up at once, though the rate is full again ~4 s later', async () => {
    const s = await anthropicStack();
    const t0 = Date.now();
    const ask = { model: 'claude-sonnet-4-6', max_tokens: MAX_TOKENS, messages: [{ role: 'user' as const, content: PROMPT }] };
    // Streamed, as Claude Code asks (the SDK refuses a whole answer of 32,000 tokens: it may take over 10 minutes).
    const sdk = () => {
      const r = recording(t0);
      const client = new Anthropic({ baseURL: s.url, apiKey: 'key-agents', fetch: r.fetchRecorded });
      return { ...r, ask: () => client.messages.stream(ask).finalMessage() };
    };
    // A first turn: admitted on a full rate (it overdraws it), settled for its usage (~1,215 tokens: ~3.6 s of the rate).
    const first = sdk();
    await first.ask();
    expect(first.seen.map((x) => x.status)).toEqual([200]);

    // Two requests at once (a main turn and a side call): both pass their headers, neither estimate fits the rate yet.
    const [b, c] = [sdk(), sdk()];
    const results = await Promise.allSettled([b.ask(), c.ask()]);
    const [okOne, failedOne] = results[0].status === 'fulfilled' ? [b, c] : [c, b];
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    const failure = results.find((r) => r.status === 'rejected') as PromiseRejectedResult;
    expect(failure.reason).toBeInstanceOf(Anthropic.RateLimitError);

    // The first refused was told its own wait (the settled usage's time: about 3.6 s) and answered when it came back.
    expect(okOne.seen.map((x) => x.status)).toEqual([429, 200]);
    expect(okOne.seen[0]!.retryAfterMs!).toBeLessThan(8_000);
    expect(okOne.seen[0]!.shouldRetry).toBe('true');
    // The second: a slot of its estimate's time (min(33,200, 20,000) tokens × 3 ms = 60 s) after the first's turn, plus a
    // spread of up to a fifth of that: past 60 s, so x-should-retry: false and no retry at all.
    expect(failedOne.seen).toHaveLength(1);
    expect(failedOne.seen[0]!.status).toBe(429);
    expect(failedOne.seen[0]!.retryAfterMs!).toBeGreaterThan(60_000);
    expect(failedOne.seen[0]!.retryAfterMs!).toBeLessThanOrEqual(1.2 * (60_000 + okOne.seen[0]!.retryAfterMs!) + 1);
    expect(failedOne.seen[0]!.shouldRetry).toBe('false');

    // Yet the rate is full again once the admitted one settled (~1,215 tokens, ~3.6 s): the same request sent then is
    // answered at once, about a minute before the time the refused one was told.
    const okAtMs = okOne.seen[1]!.atMs;
    await new Promise((r) => setTimeout(r, Math.max(0, okAtMs + 4_500 - (Date.now() - t0))));
    const later = sdk();
    await later.ask();
    expect(later.seen.map((x) => x.status)).toEqual([200]);
    expect(later.seen[0]!.atMs).toBeLessThan(failedOne.seen[0]!.atMs + failedOne.seen[0]!.retryAfterMs! - 45_000);
    console.log(`refused first told ${okOne.seen[0]!.retryAfterMs} ms (answered at ${okAtMs} ms); refused second told ${failedOne.seen[0]!.retryAfterMs} ms, x-should-retry ${failedOne.seen[0]!.shouldRetry} at ${failedOne.seen[0]!.atMs} ms, raised by its SDK without a retry; the same request at ${later.seen[0]!.atMs} ms: ${later.seen[0]!.status}`);
  }, 30_000);

  it('tells a request that arrives while an oversized one is in flight ~36 s (the headers see one token left), whatever that one will use', async () => {
    const s = await startStack({
      faults: { latencyMs: 1_500 },
      config: (url) => ({ ...defaultConfig(url, RETRY_LOOP_ONLY), auth: limits }),
    });
    const t0 = Date.now();
    const r = recording(t0);
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'key-agents', maxRetries: 0, fetch: r.fetchRecorded });
    const ask = { model: 'gpt-4o', max_tokens: MAX_TOKENS, messages: [{ role: 'user' as const, content: 'hi' }] };
    const inFlight = client.chat.completions.create(ask);
    await new Promise((res) => setTimeout(res, 300));
    const refused = await client.chat.completions.create(ask).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(OpenAI.RateLimitError);
    await inFlight;
    const told = r.seen.find((x) => x.status === 429)!;
    // The reservation in flight (~32,010 tokens × 3 ms = 96 s) leaves one token only 96 - 60 = 36 s on; spread by a fifth.
    expect(told.retryAfterMs!).toBeGreaterThan(30_000);
    expect(told.retryAfterMs!).toBeLessThan(1.2 * 36_100);
    expect(told.shouldRetry).toBe('true');
    // Its settlement (~20 tokens used) leaves the rate full at once: the same request is answered now, ~35 s early.
    const again = await client.chat.completions.create(ask).withResponse();
    expect(again.response.status).toBe(200);
    console.log(`in flight: the refused request told ${told.retryAfterMs} ms; answered at ${Date.now() - t0} ms once the first settled`);
  }, 30_000);
});

describe('the refusal queue by estimate, as policy (README "Client keys")', () => {
  const rates = clientRates({ tokensPerMinute: TOKENS_PER_MINUTE });
  const estimate = MAX_TOKENS + 1_200;

  it('tells the second of two oversized refusals at least a minute past the first turn, so always past 60 s', () => {
    // Whatever the first's own wait (the time the settled usage before it holds the rate), the second's passes 60 s.
    for (const ownMs of [1, 600, 1_800, 10_000]) {
      const nowMs = 1_000_000;
      const dues: ClientDues = { tokens: spend(undefined, nowMs, rates.tokens!, ownMs / rates.tokens!.intervalMs) };
      const b = reserveTokens(dues, nowMs, { ...rates, tokens: rates.tokens! }, estimate);
      expect(b.admitted).toBe(false);
      if (b.admitted) continue;
      const c = reserveTokens({ ...dues, told: b.toldMs }, nowMs, { ...rates, tokens: rates.tokens! }, estimate);
      expect(c.admitted).toBe(false);
      if (c.admitted) continue;
      expect(b.waitMs).toBeCloseTo(ownMs, 0);
      expect(c.waitMs).toBeCloseTo(ownMs + 60_000, 0);
      // Told with its spread of up to a fifth: up to 12 s more than "a minute past its own wait".
      expect(retryAfterOf(c, rates, () => 0)).toBeGreaterThan(60_000);
      expect(retryAfterOf(c, rates, () => 0.999)).toBeGreaterThan(ownMs + 60_000 + 11_000);
    }
  });
});
