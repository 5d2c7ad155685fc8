// Adversarial review of the retry budget's default floor (minRetriesPerSecond 10, Finagle's, up from 1), from a user's
// and an operator's side: the default config (breaker, parking, budget as they come), the bundled mock behind the
// gateway, the official openai SDK as the client. Each test reports what it measured (upstream requests per call).
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { ConfigSchema } from '../src/config/schema.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import { RetryBudget } from '../src/state/retry-budget.ts';
import { countingClient, defaultConfig, useExtraMocks, useGateways, useStacks, TEST_KEY } from './helpers/stack.ts';
import { useRedisServer } from './helpers/redis-server.ts';

const start = useStacks();
const gatewayOf = useGateways();
const extraMock = useExtraMocks();
const redis = useRedisServer();
const messages = [{ role: 'user' as const, content: 'Say something useful' }];

/** `perSecond` calls a second for `ms`, each started on its own schedule whatever the earlier ones are doing (open loop). */
async function openLoop<T>(perSecond: number, ms: number, call: (i: number) => Promise<T>): Promise<PromiseSettledResult<T>[]> {
  const calls: Array<Promise<PromiseSettledResult<T>>> = [];
  const t0 = performance.now();
  for (let i = 0; i < (perSecond * ms) / 1000; i++) {
    const due = t0 + (i * 1000) / perSecond;
    const wait = due - performance.now();
    if (wait > 0) await sleep(wait);
    // Settled at once: a call that fails while later ones are still being started is no unhandled rejection.
    calls.push(
      call(i).then(
        (value) => ({ status: 'fulfilled', value }) as const,
        (reason: unknown) => ({ status: 'rejected', reason }) as const,
      ),
    );
  }
  return Promise.all(calls);
}

/** Chat (plain and streamed) and embeddings calls in turn, as an app mixes them; resolves once a stream is read to its end. */
function mixedCall(client: OpenAI, i: number): Promise<unknown> {
  if (i % 3 === 0) return client.chat.completions.create({ model: 'gpt-4o', messages });
  if (i % 3 === 1) return client.embeddings.create({ model: 'text-embedding-3-small', input: `doc ${i}` });
  return (async () => {
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    if (text === '') throw new Error('empty stream');
    return text;
  })();
}

function report(name: string, figures: Record<string, number | string>): void {
  console.log(`[budget-floor] ${name}: ${JSON.stringify(figures)}`);
}

const ratio = (a: number, b: number) => Math.round((a / b) * 1000) / 1000;

describe('the retry budget floor of 10 a second, at its defaults', () => {
  it('answers every one of 150 mixed calls (chat, streams, embeddings) sent together while 30% of first attempts get 503', async () => {
    const s = await start({ faults: { errors: [{ status: 503, rate: 0.3, firstAttemptsOnly: true }] } });
    // maxRetries 0: the gateway alone must absorb the failures, none may reach the SDK.
    const { client, counter } = countingClient(s, { maxRetries: 0 });
    const results = await Promise.allSettled(Array.from({ length: 150 }, (_, i) => mixedCall(client, i)));
    const failed = results.filter((r) => r.status === 'rejected');
    const stats = s.mock.stats();
    report('flaky 30% burst', { calls: 150, sdkRequests: counter.requests, upstream: stats.total, upstream503: stats.byStatus['503'] ?? 0, failed: failed.length, amplification: ratio(stats.total, 150) });
    expect(failed.map((r) => String((r as PromiseRejectedResult).reason))).toEqual([]);
    expect(counter.requests).toBe(150);
    // 45 first attempts fail, each is retried once and passes: nothing more is sent.
    expect(stats.byStatus['503']).toBe(45);
    expect(stats.total).toBe(195);
    // The burst did not spend the budget: the single calls that follow it are retried too (a floor of 1 a second,
    // 10 retries over the window, refused them once the burst had taken its 10).
    for (let i = 0; i < 10; i++) await client.chat.completions.create({ model: 'gpt-4o', messages });
    expect(counter.requests).toBe(160);
    expect(s.mock.stats().byStatus['503']).toBe(48);
  });

  it('keeps a dead provider\'s load near one request per call for 40 calls at once (breaker and parking at their defaults)', async () => {
    const s = await start({ faults: { errors: [{ status: 503, rate: 1 }] } });
    // The SDK's defaults but its timeout, which the gateway answers before (x-stainless-timeout).
    const { client, counter } = countingClient(s, { timeout: 3_000 });
    const t0 = performance.now();
    const results = await Promise.allSettled(Array.from({ length: 40 }, () => client.chat.completions.create({ model: 'gpt-4o', messages })));
    const upstream = s.mock.stats().total;
    report('dead provider, 40 at once', { calls: 40, sdkRequests: counter.requests, upstream, perCall: ratio(upstream, 40), perSdkRequest: ratio(upstream, counter.requests), ms: Math.round(performance.now() - t0) });
    expect(results.every((r) => r.status === 'rejected')).toBe(true);
    expect(upstream / 40).toBeLessThan(1.5);
  });

  it('keeps a dead provider\'s load near one request per call at 100 calls a second for 3 s, open loop', async () => {
    const s = await start({ faults: { errors: [{ status: 503, rate: 1 }] } });
    const { client, counter } = countingClient(s, { timeout: 3_000 });
    const t0 = performance.now();
    const results = await openLoop(100, 3_000, () => client.chat.completions.create({ model: 'gpt-4o', messages }));
    const upstream = s.mock.stats().total;
    report('dead provider, 100/s for 3 s', { calls: results.length, sdkRequests: counter.requests, upstream, perCall: ratio(upstream, results.length), perSdkRequest: ratio(upstream, counter.requests), ms: Math.round(performance.now() - t0) });
    expect(results.every((r) => r.status === 'rejected')).toBe(true);
    expect(upstream / results.length).toBeLessThan(1.5);
  });

  it('grants the floor once to a fleet of two instances sharing Redis, not once to each', async () => {
    const mock = await extraMock({ faults: { errors: [{ status: 503, rate: 1 }] }, apiKey: TEST_KEY });
    // No breaker: it would stop the retries before the budget does; the budget is what is under test.
    const config = ConfigSchema.parse({ ...defaultConfig(mock.url, { provider: { breaker: false } }), state: { redis: redis().url, keyPrefix: `floor${process.pid}`, commandTimeoutMs: 1000 } });
    const urls = [await gatewayOf(config), await gatewayOf(config)];
    const clients = urls.map((u) => new OpenAI({ baseURL: `${u}/v1`, apiKey: 'sk-client', maxRetries: 0 }));
    // 60 calls at each instance: 120 requests over the window, whose tenth (12) is under the floor's 100 (10 a second
    // over 10 s). Each call would take two retries (maxAttempts 3): 240 wanted, 100 the fleet's to give.
    const results = await Promise.allSettled(clients.flatMap((c) => Array.from({ length: 60 }, () => c.chat.completions.create({ model: 'gpt-4o', messages }))));
    const upstream = mock.stats().total;
    report('fleet of 2 on Redis, dead provider, no breaker', { calls: 120, upstream, retries: upstream - 120, perCall: ratio(upstream, 120) });
    expect(results.every((r) => r.status === 'rejected')).toBe(true);
    expect(upstream - 120).toBeGreaterThanOrEqual(90);
    expect(upstream - 120).toBeLessThanOrEqual(110);
  });

  it('sends no retry storm into bare 429s (no retry-after) when a provider\'s capacity drops, at 50 calls a second', async () => {
    const s = await start({ faults: { latencyMs: 100 } });
    const { client, counter } = countingClient(s);
    let status429 = 0;
    const results = await openLoop(50, 6_000, async (i) => {
      // Capacity drops to 2 in flight after the first second: most attempts get a bare 429.
      if (i === 50) s.mock.setFaults({ latencyMs: 100, capacity: 2 });
      return client.chat.completions.create({ model: 'gpt-4o', messages }).catch((err: unknown) => {
        if (err instanceof OpenAI.APIError && err.status === 429) status429++;
        throw err;
      });
    });
    const stats = s.mock.stats();
    const calls = results.length;
    report('bare 429s, capacity 2, 50/s', { calls, sdkRequests: counter.requests, upstream: stats.total, upstream429: stats.byStatus['429'] ?? 0, ok: results.filter((r) => r.status === 'fulfilled').length, clients429: status429, perCall: ratio(stats.total, calls), perSdkRequest: ratio(stats.total, counter.requests) });
    expect(stats.total / calls).toBeLessThan(1.5);
  });

  // A provider that refuses every request with a bare 429 (a rate limit without a wait hint) is neither a breaker
  // failure nor a hold-off, so the budget alone bounds the retries. With the floor of 10 for them too, below 5 calls
  // a second each call got all of maxAttempts: 3 upstream requests per call (90 for 30 calls), all refused. A retry
  // after a rate limit has a floor of 1 a second (budgetForRetry): 1.33 (40).
  it('sends a small deployment\'s calls about once each into a provider refusing all with bare 429s (5 calls a second)', async () => {
    const s = await start({ faults: { errors: [{ status: 429, rate: 1 }] } });
    const { client, counter } = countingClient(s);
    const results = await openLoop(5, 6_000, () => client.chat.completions.create({ model: 'gpt-4o', messages }));
    const upstream = s.mock.stats().total;
    report('bare 429s for all, 5/s', { calls: results.length, sdkRequests: counter.requests, upstream, perCall: ratio(upstream, results.length) });
    expect(results.every((r) => r.status === 'rejected')).toBe(true);
    expect(upstream / results.length).toBeLessThan(1.5);
  });
});

describe('the floor of a retry after a rate limit', () => {
  it('is 1 a second, not the configured 10, while other retries get the whole floor; the ratio applies to both', async () => {
    const now = 1_000_000;
    const budget = new RetryBudget(new MemoryStore(), () => now);
    const cfg = ConfigSchema.parse({ providers: { p: { family: 'openai', baseUrl: 'http://127.0.0.1:1/v1', apiKey: 'k' } }, routes: [{ name: 'r', match: { path: '/v1/x' }, targets: [{ provider: 'p' }] }] }).routes[0]!.budget;
    expect(cfg.minRetriesPerSecond).toBe(10);
    const take = async (key: string, atLimit: boolean, n: number) => {
      let granted = 0;
      for (let i = 0; i < n; i++) if (await budget.tryRetry(key, cfg, atLimit)) granted++;
      return granted;
    };
    // A quiet route: 1 a second over the 10 s window after 429s, 10 a second after anything else.
    expect(await take('r/online/a', true, 30)).toBe(10);
    expect(await take('r/online/b', false, 150)).toBe(100);
    // Past the floor, the ratio: 500 requests allow 50 retries, after a 429 as after a 503.
    for (let i = 0; i < 500; i++) budget.countRequest('r/online/c', cfg);
    expect(await take('r/online/c', true, 80)).toBe(50);
  });
});
