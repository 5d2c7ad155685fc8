// A client's undeclared retry (the same body again soon after the gateway failed it, as LangChain, the Vercel AI SDK
// or a fixed-interval loop send it, with no x-stainless-retry-count) counts as a retry for the retry budget: the watch
// with a fake clock, then the gateway over real HTTP.
import { describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { ClientRepeats, type Arrival } from '../src/state/client-repeats.ts';
import { metricSum, useStacks, type Stack } from './helpers/stack.ts';

const arrival = (body: string, over: Partial<Arrival> = {}): Arrival => ({ client: undefined, path: '/v1/chat/completions', query: '', priority: undefined, rawBody: Buffer.from(body), windowMs: 1_000, ...over });

describe('ClientRepeats', () => {
  it('knows a body failed within its window, per client, path and query, and hashes nothing while nothing failed', () => {
    let now = 0;
    const repeats = new ClientRepeats(() => now);
    const first = arrival('{"a":1}');
    expect(repeats.isRepeat(first)).toBe(false);
    expect(first.key).toBeUndefined();
    repeats.ended(first, true);
    now = 999;
    expect(repeats.isRepeat(arrival('{"a":1}'))).toBe(true);
    const other = arrival('{"a":2}');
    expect(repeats.isRepeat(other)).toBe(false);
    // Same length, so hashed to tell; one of another length is not hashed at all.
    expect(other.key).toBeDefined();
    const longer = arrival('{"a":22}');
    expect(repeats.isRepeat(longer)).toBe(false);
    expect(longer.key).toBeUndefined();
    expect(repeats.isRepeat(arrival('{"a":1}', { client: 'team-b' }))).toBe(false);
    expect(repeats.isRepeat(arrival('{"a":1}', { path: '/v1/embeddings' }))).toBe(false);
    expect(repeats.isRepeat(arrival('{"a":1}', { query: '?x=1' }))).toBe(false);
    expect(repeats.isRepeat(arrival('{"a":1}', { priority: 'batch' }))).toBe(false);
    now = 1_000;
    expect(repeats.isRepeat(arrival('{"a":1}'))).toBe(false);
    expect(repeats.size).toBe(0);
  });

  it('renews the window at each failed repeat and forgets the body once a repeat succeeds', () => {
    let now = 0;
    const repeats = new ClientRepeats(() => now);
    repeats.ended(arrival('q'), true);
    now = 900;
    const again = arrival('q');
    expect(repeats.isRepeat(again)).toBe(true);
    repeats.ended(again, true);
    now = 1_800;
    const third = arrival('q');
    expect(repeats.isRepeat(third)).toBe(true);
    repeats.ended(third, false);
    expect(repeats.isRepeat(arrival('q'))).toBe(false);
    // A success of a request that hashed nothing on arrival (nothing had failed then) has nothing to forget.
    const quiet = arrival('r');
    repeats.ended(quiet, false);
    expect(quiet.key).toBeUndefined();
  });

  it('drops expired entries and, past its cap, the oldest', () => {
    let now = 0;
    const repeats = new ClientRepeats(() => now, 3);
    for (const body of ['a', 'b', 'c']) repeats.ended(arrival(body), true);
    repeats.ended(arrival('d'), true);
    expect(repeats.size).toBe(3);
    expect(repeats.isRepeat(arrival('a'))).toBe(false);
    expect(repeats.isRepeat(arrival('d'))).toBe(true);
    now = 500;
    repeats.ended(arrival('e', { windowMs: 10_000 }), true);
    now = 1_500;
    repeats.ended(arrival('f'), true);
    // b, c and d expired at 1,000 and went at the next failure; e and f stand.
    expect(repeats.size).toBe(2);
    expect(repeats.isRepeat(arrival('e'))).toBe(true);
  });

  it("holds the body lengths of the failures it keeps, no more, through a trickle of failures that never all expire", () => {
    let now = 0;
    const repeats = new ClientRepeats(() => now, 50);
    // A failure every 100 ms, each of a new length, each kept a second: some always kept, so nothing is cleared at once.
    for (let i = 0; i < 2_000; i++, now += 100) repeats.ended(arrival('x'.repeat(i + 1)), true);
    expect(repeats.size).toBe(10);
    expect(repeats.lengthsHeld).toBe(10);
    // A body of a length that is kept no more is not hashed; one still kept is found.
    const old = arrival('x'.repeat(5));
    expect(repeats.isRepeat(old)).toBe(false);
    expect(old.key).toBeUndefined();
    expect(repeats.isRepeat(arrival('x'.repeat(2_000)))).toBe(true);
    // Two failures of one length: the length stays while either is kept.
    now += 10_000;
    repeats.ended(arrival('ab'), true);
    repeats.ended(arrival('cd'), true);
    // A repeat that succeeds is forgotten (its key worked out on arrival, as the gateway does).
    const forget = (body: string) => {
      const a = arrival(body);
      expect(repeats.isRepeat(a)).toBe(true);
      repeats.ended(a, false);
    };
    forget('ab');
    const same = arrival('ef');
    expect(repeats.isRepeat(same)).toBe(false);
    expect(same.key).toBeDefined();
    forget('cd');
    const none = arrival('ef');
    expect(repeats.isRepeat(none)).toBe(false);
    expect(none.key).toBeUndefined();
    expect(repeats.lengthsHeld).toBe(0);
  });
});

const start = useStacks();
const FAST = { maxAttempts: 2, backoff: { strategy: 'fixed' as const, baseMs: 5, capMs: 5 } };
// One retry per request: the first request's retry fits, a second request's retry fits only if it counts as a request.
const BUDGET = { ratio: 1, windowS: 60, minRetriesPerSecond: 0, repeats: { countAsRetries: true } };

async function chat(s: Stack, content: string, headers: Record<string, string> = {}): Promise<number> {
  const res = await fetch(`${s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content }] }),
  });
  await res.arrayBuffer();
  return res.status;
}

async function lines(s: Stack, n: number): Promise<Array<Record<string, unknown>>> {
  for (let i = 0; i < 100; i++) {
    const found = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.route === 'chat');
    if (found.length >= n) return found;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error(`fewer than ${n} request lines`);
}

describe('a client retrying without saying so, through the gateway', () => {
  it('takes its repeat from the retry budget, not as a new request that would enlarge it: the budget spent, the gateway does not retry it', async () => {
    const s = await start({ faults: { errors: [{ status: 503, rate: 1 }] }, route: { retry: FAST, park: false, budget: BUDGET }, provider: { breaker: false } });
    expect(await chat(s, 'book a table')).toBe(503);
    expect(s.mock.stats().total).toBe(2);
    await lines(s, 1);
    // The repeat is a retry: two retries against one request is over the budget, so it is sent once.
    expect(await chat(s, 'book a table')).toBe(503);
    expect(s.mock.stats().total).toBe(3);
    const [first, second] = await lines(s, 2);
    expect(first!.clientRetry).toBeUndefined();
    expect(second).toMatchObject({ clientRetry: 'repeat', retriesStopped: 'budget' });
    expect(await metricSum(s, 'stormgate_client_retries_total{route="chat",how="repeat"}')).toBe(1);
    expect(await metricSum(s, 'stormgate_client_retries_total{route="chat",how="declared"}')).toBe(0);
  });

  it('by default only names a repeat (log, metric): the budget counts it as a request, so its retry fits', async () => {
    const s = await start({ faults: { errors: [{ status: 503, rate: 1 }] }, route: { retry: FAST, park: false, budget: { ...BUDGET, repeats: {} } }, provider: { breaker: false } });
    expect(await chat(s, 'book a table')).toBe(503);
    await lines(s, 1);
    expect(await chat(s, 'book a table')).toBe(503);
    expect(s.mock.stats().total).toBe(4);
    const second = (await lines(s, 2))[1]!;
    expect(second.clientRetry).toBe('repeat');
    expect(second.retriesStopped).toBe('retries_exhausted');
    expect(await metricSum(s, 'stormgate_client_retries_total{route="chat",how="repeat"}')).toBe(1);
  });

  it('watches nothing with windowS 0', async () => {
    const s = await start({ faults: { errors: [{ status: 503, rate: 1 }] }, route: { retry: FAST, park: false, budget: { ...BUDGET, repeats: { windowS: 0, countAsRetries: true } } }, provider: { breaker: false } });
    expect(await chat(s, 'book a table')).toBe(503);
    await lines(s, 1);
    expect(await chat(s, 'book a table')).toBe(503);
    expect(s.mock.stats().total).toBe(4);
    expect((await lines(s, 2))[1]!.clientRetry).toBeUndefined();
  });

  it('tells another body, and a declared retry, apart from a repeat', async () => {
    const s = await start({ faults: { errors: [{ status: 503, rate: 1 }] }, route: { retry: FAST, park: false, budget: BUDGET }, provider: { breaker: false } });
    expect(await chat(s, 'one')).toBe(503);
    await lines(s, 1);
    expect(await chat(s, 'two')).toBe(503);
    expect(await chat(s, 'three', { 'x-stainless-retry-count': '1' })).toBe(503);
    const [, two, three] = await lines(s, 3);
    expect(two!.clientRetry).toBeUndefined();
    expect(three!.clientRetry).toBe('declared');
    expect(await metricSum(s, 'stormgate_client_retries_total{route="chat",how="declared"}')).toBe(1);
  });

  it('forgets a body once its repeat succeeds: the same question asked later is a new request', async () => {
    const s = await start({ faults: { errors: [{ status: 503, rate: 1, times: 1 }] }, route: { retry: { maxAttempts: 1 }, park: false, budget: BUDGET }, provider: { breaker: false } });
    expect(await chat(s, 'weather?')).toBe(503);
    await lines(s, 1);
    expect(await chat(s, 'weather?')).toBe(200);
    await lines(s, 2);
    expect(await chat(s, 'weather?')).toBe(200);
    const found = await lines(s, 3);
    expect(found.map((l) => l.clientRetry)).toEqual([undefined, 'repeat', undefined]);
  });

  it('bounds a fixed-interval agent loop: its own retries are counted as such, and the gateway adds almost none of its own', async () => {
    const s = await start({ faults: { errors: [{ status: 503, rate: 1 }] }, route: { retry: { maxAttempts: 3, backoff: FAST.backoff }, park: false, budget: { minRetriesPerSecond: 1, repeats: { countAsRetries: true } } }, provider: { breaker: false } });
    // Twenty agents, each trying five times, 50 ms apart, without the SDK's retries (so without its header).
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 });
    const agent = async (i: number): Promise<void> => {
      for (let t = 0; t < 5; t++) {
        try {
          await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: `task ${i}` }] });
        } catch {
          await new Promise((r) => setTimeout(r, 50));
        }
      }
    };
    await Promise.all(Array.from({ length: 20 }, (_, i) => agent(i)));
    // 100 calls. Budget: 10% of the 20 first calls plus a floor of 1 a second over 10 s (set: the default, 10 a second,
    // would retry them all): at most 12 retries of the gateway's own, where counting each repeat as a request allowed 20.
    const upstream = s.mock.stats().total;
    expect(upstream).toBeGreaterThanOrEqual(100);
    expect(upstream).toBeLessThanOrEqual(112);
    expect(await metricSum(s, 'stormgate_client_retries_total{route="chat",how="repeat"}')).toBe(80);
  });
});
