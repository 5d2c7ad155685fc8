// Mutation round 44 on the retry budget's code paths: the budget math and its stores (state/store.ts, memory-store.ts,
// retry-budget.ts, the Redis script and redis-budget.ts) and where the pipeline pays for a retry (target-attempts.ts,
// stream-recovery.ts, client-declared retries and repeats). A test for each mutant the existing tests let live. Every
// budget is set here explicitly: the default floor (minRetriesPerSecond) is not what these tests are about.
import { randomUUID } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { MemoryStore } from '../src/state/memory-store.ts';
import { RedisKeys } from '../src/state/redis-keys.ts';
import { RedisStore } from '../src/state/redis-store.ts';
import { RetryBudget } from '../src/state/retry-budget.ts';
import { useRedisServerWithAdmin } from './helpers/redis-server.ts';
import { defaultConfig, metricSum, useStacks } from './helpers/stack.ts';
import { describeEachStore } from './helpers/redis-stores.ts';

const T = 1_700_000_000_000;

describe('forgetting a target key given back (a made-up model the provider answered 404)', () => {
  // No floor: the budget is the ratio of the requests counted, so a window that lost its counts shows at once.
  const cfg = { ratio: 0.5, windowS: 10, minRetriesPerSecond: 0 };

  it("keeps the budget of another provider's target whose key merely ends the same (azure-openai/x is not openai/x)", async () => {
    const store = new MemoryStore();
    const budget = new RetryBudget(store, () => T);
    const kept = RetryBudget.key('chat', 'azure-openai/x', 'online');
    const gone = RetryBudget.key('chat', 'openai/x', 'online');
    for (let i = 0; i < 4; i++) {
      budget.countRequest(kept, cfg);
      budget.countRequest(gone, cfg);
    }
    expect((await budget.remainingByRoute()).get('chat')).toBe(4);
    store.forget('openai/x');
    budget.forget('openai/x');
    // The other provider's window still holds its 4 requests, and so its 2 retries; the forgotten one none.
    expect(await store.budgetWindow(kept, cfg, T)).toEqual({ requests: 4, retries: 0 });
    expect(await store.budgetWindow(gone, cfg, T)).toEqual({ requests: 0, retries: 0 });
    expect((await budget.remainingByRoute()).get('chat')).toBe(2);
    expect(await budget.tryRetry(kept, cfg)).toBe(true);
  });
});

// Both stores, the same answers: the Redis store's script (redis-scripts.ts BUDGET) and what redis-budget.ts sends it.
describeEachStore((store) => {
  it('grants a quiet route its floor, minRetriesPerSecond x windowS, with no request counted: 5 for 0.5/s over 10 s', async () => {
    const cfg = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 0.5 };
    for (let i = 0; i < 5; i++) expect(await store().takeRetry('chat/online/p/m', cfg, T)).toBe(true);
    expect(await store().takeRetry('chat/online/p/m', cfg, T)).toBe(false);
    expect(await store().budgetWindow('chat/online/p/m', cfg, T)).toEqual({ requests: 0, retries: 5 });
  });

  it("counts a forced retry (the client's own) in the window even when the budget is spent, and says it did not fit", async () => {
    const cfg = { ratio: 0.5, windowS: 10, minRetriesPerSecond: 0 };
    store().addRequests('chat/online/p/m', 2, T);
    expect(await store().takeRetry('chat/online/p/m', cfg, T, true)).toBe(true);
    expect(await store().takeRetry('chat/online/p/m', cfg, T, true)).toBe(false);
    expect(await store().takeRetry('chat/online/p/m', cfg, T, true)).toBe(false);
    expect(await store().budgetWindow('chat/online/p/m', cfg, T)).toEqual({ requests: 2, retries: 3 });
    // The forced retries past the budget spent the room 4 more requests make: 6 requests allow 3, and 3 were served.
    store().addRequests('chat/online/p/m', 4, T);
    expect(await store().takeRetry('chat/online/p/m', cfg, T)).toBe(false);
  });
});

describe('on a real Redis: the budget script (BUDGET) on a budget no request was counted in yet', () => {
  const { redis, admin } = useRedisServerWithAdmin();
  const stores: RedisStore[] = [];
  afterEach(async () => {
    await Promise.all(stores.splice(0).map((st) => st.close()));
  });

  it('gives the budget hash it writes an expiry of the window and a little more: no key is kept for ever', async () => {
    const keyPrefix = `t44-${randomUUID()}`;
    const store = new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 500, keyPrefix } });
    stores.push(store);
    expect(await store.ready()).toBe(true);
    const cfg = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 1 };
    // Retries alone (a client's own, and one the floor grants) write the hash: no batched request count ever set its expiry.
    expect(await store.takeRetry('chat/online/p/m', cfg, Date.now(), true)).toBe(true);
    expect(await store.takeRetry('chat/online/p/m', cfg, Date.now())).toBe(true);
    const pttl = await admin().pttl(new RedisKeys(keyPrefix).budget('chat/online/p/m'));
    expect(pttl).toBeGreaterThan(10_000 - 5_000);
    expect(pttl).toBeLessThanOrEqual(15_000);
    expect(store.degraded).toBe(false);
  });

  /** Two instances of a fleet on the test's Redis, sharing a key prefix. */
  async function fleet() {
    const keyPrefix = `t44-${randomUUID()}`;
    const open = () => new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 500, keyPrefix } });
    const [a, b] = [open(), open()];
    stores.push(a, b);
    expect(await a.ready()).toBe(true);
    expect(await b.ready()).toBe(true);
    return { a, b, keys: new RedisKeys(keyPrefix) };
  }

  it("sends the request counts it batched when it closes: an instance shut down keeps its requests in the fleet's budget", async () => {
    const { a, b } = await fleet();
    const cfg = { ratio: 0.5, windowS: 10, minRetriesPerSecond: 0 };
    const now = Date.now();
    // Counted within the batching interval before the shutdown: only close() can send them.
    a.addRequests('chat/online/p/m', 10, now);
    await a.close();
    expect(await b.budgetWindow('chat/online/p/m', cfg, now)).toEqual({ requests: 10, retries: 0 });
  });

  it('writes nothing to Redis of a target key given back: its batched counts are dropped with it', async () => {
    const { a, keys } = await fleet();
    const now = Date.now();
    a.addRequests('chat/online/p/made-up', 3, now);
    a.addRequests('chat/online/p/kept', 2, now);
    a.forget('p/made-up');
    await a.close();
    expect(await admin().exists(keys.budget('chat/online/p/made-up'))).toBe(0);
    expect(await admin().exists(keys.budget('chat/online/p/kept'))).toBe(1);
  });
});

describe('over HTTP: a client-declared retry (x-stainless-retry-count) that found the budget spent', () => {
  const start = useStacks();

  it('is served once and not retried even when the provider asks it to wait (a paced retry is otherwise always let through)', async () => {
    const s = await start({
      // The provider's 429 asks for 200 ms: the hold-off it starts would pace a retry, which the budget counts but never refuses.
      faults: { errors: [{ status: 429, rate: 1, times: 1, headers: { 'retry-after-ms': '200' } }] },
      route: { retry: { maxAttempts: 3 }, park: false, budget: { ratio: 0, windowS: 10, minRetriesPerSecond: 0 } },
      provider: { breaker: false },
    });
    const res = await fetch(`${s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-stainless-retry-count': '1' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    });
    await res.arrayBuffer();
    expect(res.status).toBe(429);
    expect(s.mock.stats().total).toBe(1);
  });
});

describe("over HTTP: a request that leaves its target for the hold-off its own 429 started", () => {
  const start = useStacks();

  it("takes nothing from that target's budget: the next target answers it, and the retry it would have made never went", async () => {
    // A floor of 1 retry per budget over the window (0.1/s for 10 s), no ratio: each budget shows what it was charged.
    const budget = { ratio: 0, windowS: 10, minRetriesPerSecond: 0.1 };
    const s = await start({
      // The primary's one answer asks for 2 s, past the second after which a request moves on to the next target.
      faults: { errors: [{ status: 429, rate: 1, times: 1, headers: { 'retry-after': '2' } }] },
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl);
        const mock = base.providers['mock']!;
        return {
          ...base,
          providers: { mock: { ...mock, breaker: false }, backup: { ...mock, breaker: false } },
          routes: base.routes.map((r) => ({ ...r, targets: [{ provider: 'mock' }, { provider: 'backup' }], park: false, budget })),
        };
      },
    });
    const res = await fetch(`${s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    });
    await res.arrayBuffer();
    expect(res.status).toBe(200);
    expect(s.mock.stats().total).toBe(2);
    // Both budgets whole: the primary's retry was never made, so never paid.
    expect(await metricSum(s, 'stormgate_retry_budget_remaining{route="chat"}')).toBe(2);
  });
});
