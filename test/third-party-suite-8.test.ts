// An eighth third-party failure-scenario suite, written from the README ("Priority pools, adaptive concurrency, load
// shedding"; "Retry budget, circuit breaker, hold-offs, parking"; "Client keys") as an outside team would test the
// incident the gateway exists for: batch jobs and online traffic share one provider, and on a 429 the online users
// starve. Batch traffic floods the gateway, marked each way the README offers (the x-stormgate-priority header, a
// client key held to batch, a route of its own), while online requests trickle in; then the provider pushes back: its
// capacity drops (bare 429s), it answers 429 with retry-after, it says its quota is nearly spent (x-ratelimit-*), it
// browns out and comes back; and two gateways share one real redis-server. What is asserted is what users see: online
// keeps succeeding with bounded latency, batch waits or is shed with an OpenAI-shaped error that says when to come
// back, batch is not starved once capacity returns, the provider sees no retry storm (the mock's own counts), and the
// pool metrics match what the clients saw. Every scenario drives real gateways over HTTP with the official `openai` SDK.
// Timing bounds are generous: the suite runs on a loaded 2-core machine.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import type { FaultSpec, MockServer } from '../src/mock/server.ts';
import { expectOpenAIError } from './helpers/openai-error.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { defaultConfig, metricSum, TEST_KEY, useExtraMocks, useGateways, useStacks, type StackOptions } from './helpers/stack.ts';

const startStack = useStacks();
const startGateway = useGateways();
const startExtraMock = useExtraMocks();
const redisServer = useRedisServer();

type APIError = InstanceType<typeof OpenAI.APIError>;

const messages = [{ role: 'user' as const, content: 'Summarise this ticket.' }];
const BATCH = { 'x-stormgate-priority': 'batch' };

/** What one SDK call came to: its status (200 or the error's), how long it took, and the error's headers and body. */
interface Outcome {
  status: number;
  ms: number;
  endedAt: number;
  headers?: Headers;
  error?: unknown;
}

async function call(client: OpenAI, headers: Record<string, string> = {}, opts: { stream?: boolean; timeoutMs?: number } = {}): Promise<Outcome> {
  const t = Date.now();
  const reqOpts = { headers, ...(opts.timeoutMs !== undefined && { timeout: opts.timeoutMs }) };
  try {
    if (opts.stream) {
      const stream = await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }, reqOpts);
      for await (const _ of stream) void _;
    } else {
      await client.chat.completions.create({ model: 'gpt-4o', messages }, reqOpts);
    }
    return { status: 200, ms: Date.now() - t, endedAt: Date.now() };
  } catch (e) {
    if (!(e instanceof OpenAI.APIError)) throw e;
    const err = e as APIError;
    return { status: err.status ?? 0, ms: Date.now() - t, endedAt: Date.now(), headers: err.headers, error: err.error };
  }
}

const sdk = (baseURL: string, opts: ConstructorParameters<typeof OpenAI>[0] = {}) => new OpenAI({ baseURL, apiKey: 'sk-client', maxRetries: 0, ...opts });

/** `n` batch agents sending one request after another until `stop()`; their outcomes, as they come. */
function flood(client: OpenAI, n: number, headers: Record<string, string> = BATCH, opts: { stream?: boolean } = {}) {
  const outcomes: Outcome[] = [];
  let stopped = false;
  const agents = Promise.all(
    Array.from({ length: n }, async () => {
      while (!stopped) {
        const o = await call(client, headers, opts);
        outcomes.push(o);
        // A shed agent waits what it was told (a batch job's loop), at least a little: it must not spin.
        if (o.status !== 200) await sleep(Math.min(2_000, Math.max(50, Number(o.headers?.get('retry-after-ms') ?? 200))));
      }
    }),
  );
  return {
    outcomes,
    async stop() {
      stopped = true;
      await agents;
    },
  };
}

/** Online users: `n` requests, one every `everyMs`, each its own call; resolves with their outcomes. */
async function trickle(client: OpenAI, n: number, everyMs: number, headers: Record<string, string> = {}, opts: { stream?: boolean } = {}): Promise<Outcome[]> {
  const calls: Array<Promise<Outcome>> = [];
  for (let i = 0; i < n; i++) {
    calls.push(call(client, headers, opts));
    await sleep(everyMs);
  }
  return Promise.all(calls);
}

const pct = (xs: number[], p: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(xs.length * p))]!;
const okShare = (os: Outcome[]) => os.filter((o) => o.status === 200).length / Math.max(1, os.length);

/** A provider of `capacity` concurrent requests, 150 ms each, behind a pool sized to it (as the README asks). */
function capped(capacity: number, more: Partial<StackOptions> = {}): StackOptions {
  return {
    faults: { latencyMs: 150, capacity, ...more.faults },
    provider: { maxConnections: 64, pools: { maxConcurrent: capacity }, ...more.provider },
    route: { timeoutMs: 30_000, ...more.route },
    ...(more.config && { config: more.config }),
  };
}

async function until(what: string, check: () => Promise<boolean> | boolean, withinMs = 10_000): Promise<void> {
  for (const end = Date.now() + withinMs; !(await check()); ) {
    if (Date.now() > end) throw new Error(`timed out waiting until ${what}`);
    await sleep(20);
  }
}

describe('a batch flood marked by header next to online users', () => {
  it('keeps every online call fast while 40 batch agents flood a provider that takes 6 at a time, and never exceeds it', async () => {
    const s = await startStack(capped(6));
    const client = sdk(s.baseURL);
    const batch = flood(client, 40);
    await sleep(1_000);
    let online: Outcome[];
    try {
      online = await trickle(client, 30, 100);
    } finally {
      await batch.stop();
    }
    expect(online.map((o) => o.status)).toEqual(online.map(() => 200));
    // Alone, a call takes 150 ms; online jumps the batch queue and waits at most for a slot to free.
    expect(pct(online.map((o) => o.ms), 0.5)).toBeLessThan(800);
    expect(Math.max(...online.map((o) => o.ms))).toBeLessThan(2_500);
    // Batch got the rest: it ran, and the provider never saw more than it takes (so no 429 at all).
    expect(batch.outcomes.filter((o) => o.status === 200).length).toBeGreaterThan(40);
    expect(s.mock.stats().maxInflight).toBeLessThanOrEqual(6);
    expect(s.mock.stats().byStatus['429'] ?? 0).toBe(0);
  }, 30_000);

  it('serves online streams their first token promptly while batch streams hold the slots until they end', async () => {
    // Half-second streams: a batch stream holds its slot for all of it.
    const s = await startStack(capped(4, { faults: { latencyMs: 50, capacity: 4, stream: { chunks: 5, chunkDelayMs: 100 } } }));
    const client = sdk(s.baseURL);
    const batch = flood(client, 20, BATCH, { stream: true });
    await sleep(1_000);
    const ttft: number[] = [];
    try {
      await Promise.all(
        Array.from({ length: 8 }, async (_, i) => {
          await sleep(i * 250);
          const t = Date.now();
          const stream = await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true });
          let first: number | undefined;
          for await (const chunk of stream) if (first === undefined && chunk.choices[0]?.delta.content) first = Date.now() - t;
          ttft.push(first!);
        }),
      );
    } finally {
      await batch.stop();
    }
    // A free slot comes within one batch stream's length (about 0.55 s); online waits for no more than that.
    expect(ttft).toHaveLength(8);
    expect(Math.max(...ttft)).toBeLessThan(2_500);
    expect(s.mock.stats().maxInflight).toBeLessThanOrEqual(4);
  }, 30_000);
});

describe('a batch flood marked by client key (auth.priority)', () => {
  const withKeys = (mockUrl: string): ConfigInput => {
    const base = defaultConfig(mockUrl, { provider: { maxConnections: 64, pools: { maxConcurrent: 4 } }, route: { timeoutMs: 30_000 } });
    return { ...base, auth: { keys: { agents: 'sk-agents-0123456789', 'batch-jobs': 'sk-batch-0123456789' }, priority: { 'batch-jobs': 'batch' } } };
  };

  it("keeps the agents' key fast while the batch team's key floods, and the batch key cannot claim online with the header", async () => {
    const s = await startStack({ faults: { latencyMs: 150, capacity: 4 }, config: withKeys });
    const batchClient = sdk(s.baseURL, { apiKey: 'sk-batch-0123456789' });
    const agents = sdk(s.baseURL, { apiKey: 'sk-agents-0123456789' });
    // The batch team asks for online: the key holds it to batch.
    const batch = flood(batchClient, 30, { 'x-stormgate-priority': 'online' });
    await sleep(800);
    let online: Outcome[];
    try {
      online = await trickle(agents, 20, 100);
      // Mid-flood, the pool's gauges say who holds the provider: all of it batch or online, never more than 4.
      const inUse = await metricSum(s, 'stormgate_pool_in_use{provider="mock"');
      expect(inUse).toBeLessThanOrEqual(4);
      expect(await metricSum(s, 'stormgate_pool_queue_depth{provider="mock",priority="batch"}')).toBeGreaterThan(0);
      expect(await metricSum(s, 'stormgate_pool_queue_depth{provider="mock",priority="online"}')).toBe(0);
    } finally {
      await batch.stop();
    }
    expect(online.every((o) => o.status === 200)).toBe(true);
    expect(pct(online.map((o) => o.ms), 0.5)).toBeLessThan(800);
    expect(Math.max(...online.map((o) => o.ms))).toBeLessThan(2_500);
    const lines = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.route === 'chat');
    expect(lines.filter((l) => l.client === 'batch-jobs').every((l) => l.priority === 'batch')).toBe(true);
    expect(lines.filter((l) => l.client === 'agents').every((l) => l.priority === 'online')).toBe(true);
  }, 30_000);
});

describe('a batch route of its own on the same upstream model', () => {
  it('shares the target with the online route, and online calls stay fast while the batch model name floods it', async () => {
    const s = await startStack({
      faults: { latencyMs: 150, capacity: 4 },
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl, { provider: { maxConnections: 64, pools: { maxConcurrent: 4 } }, route: { timeoutMs: 30_000 } });
        return {
          ...base,
          routes: [
            { name: 'chat-batch', match: { path: '/v1/chat/completions', models: ['gpt-4o-batch'] }, targets: [{ provider: 'mock', model: 'gpt-4o' }], priority: 'batch', timeoutMs: 30_000 },
            ...base.routes,
          ],
        };
      },
    });
    const client = sdk(s.baseURL);
    const outcomes: Outcome[] = [];
    let stopped = false;
    const batch = Promise.all(
      Array.from({ length: 30 }, async () => {
        while (!stopped) {
          const t = Date.now();
          const ok = await client.chat.completions.create({ model: 'gpt-4o-batch', messages }).then(() => true, () => false);
          outcomes.push({ status: ok ? 200 : 0, ms: Date.now() - t, endedAt: Date.now() });
          if (!ok) await sleep(100);
        }
      }),
    );
    await sleep(800);
    let online: Outcome[];
    try {
      online = await trickle(client, 20, 100);
    } finally {
      stopped = true;
      await batch;
    }
    expect(online.every((o) => o.status === 200)).toBe(true);
    expect(pct(online.map((o) => o.ms), 0.5)).toBeLessThan(800);
    expect(outcomes.filter((o) => o.status === 200).length).toBeGreaterThan(20);
    // The provider saw one model, never beyond what it takes.
    expect(new Set(s.mock.requests().map((r) => r.model))).toEqual(new Set(['gpt-4o']));
    expect(s.mock.stats().maxInflight).toBeLessThanOrEqual(4);
  }, 30_000);
});

/** Upstream requests the mock received from `fromMs` on, and how many of them it answered 429. */
function upstreamSince(mock: MockServer, fromMs: number, toMs = Number.POSITIVE_INFINITY) {
  const rs = mock.requests().filter((r) => r.receivedAt >= fromMs && r.receivedAt < toMs);
  return { total: rs.length, rateLimited: rs.filter((r) => r.status === 429).length };
}

describe('the provider pushes back during a batch flood', () => {
  it('keeps online succeeding when the capacity drops from 8 to 3 (bare 429s), and gives batch its throughput back when it returns', async () => {
    const s = await startStack(capped(8, { route: { timeoutMs: 30_000 } }));
    const client = sdk(s.baseURL);
    const batch = flood(client, 30);
    await sleep(1_000);
    s.mock.patchFaults({ capacity: 3 });
    const droppedAt = Date.now();
    let online: Outcome[];
    try {
      online = await trickle(client, 40, 100);
      // The target's limit came down to what the provider takes (within reach of it), and the 429s with it: over the
      // last second of the drop, most upstream requests were answered, not refused.
      expect(await metricSum(s, 'stormgate_pool_limit{target="mock/gpt-4o"}')).toBeLessThanOrEqual(5);
      const tail = upstreamSince(s.mock, Date.now() - 1_500);
      expect(tail.rateLimited / Math.max(1, tail.total)).toBeLessThan(0.34);
      // Capacity returns: the limit grows back and batch gets the provider's whole capacity again.
      s.mock.patchFaults({ capacity: 8 });
      await until('the limit has grown back', async () => (await metricSum(s, 'stormgate_pool_limit{target="mock/gpt-4o"}')) >= 7, 15_000);
      const before = batch.outcomes.filter((o) => o.status === 200).length;
      await sleep(1_500);
      const served = batch.outcomes.filter((o) => o.status === 200).length - before;
      // 8 at a time, 150 ms each: about 80 in 1.5 s; the 3-slot provider would have done 30.
      expect(served).toBeGreaterThan(40);
    } finally {
      await batch.stop();
    }
    // Batch slowed down rather than failed: the 429s were absorbed by the limit and the retries the budget allows.
    expect(okShare(batch.outcomes)).toBeGreaterThanOrEqual(0.95);
    expect(okShare(online)).toBeGreaterThanOrEqual(0.95);
    expect(pct(online.map((o) => o.ms), 0.5)).toBeLessThan(1_000);
    // No retry storm: through the whole drop, the provider saw at most a few upstream requests per logical one.
    const all = upstreamSince(s.mock, droppedAt);
    const logical = batch.outcomes.filter((o) => o.endedAt >= droppedAt).length + online.length;
    expect(all.total).toBeLessThan(logical * 1.5);
  }, 60_000);

  it('holds everyone off a 429 with retry-after, sends the provider nothing meanwhile, and serves online users as soon as it ends', async () => {
    const s = await startStack(capped(6));
    const client = sdk(s.baseURL);
    const batch = flood(client, 30);
    await sleep(800);
    // The provider answers every request 429 with retry-after for 2 s.
    s.mock.brownout('429', 2_000);
    const startedAt = Date.now();
    let online: Outcome[];
    try {
      online = await trickle(client, 10, 100);
    } finally {
      await batch.stop();
    }
    // Every online call was answered, none later than the hold-off's end (2 s, plus its spread) and a round trip.
    expect(online.map((o) => o.status)).toEqual(online.map(() => 200));
    expect(Math.max(...online.map((o) => o.endedAt - startedAt))).toBeLessThan(5_000);
    // The provider saw the 429s of the attempts already on their way (the pool's 6, a few more at most), then silence:
    // not 30 agents' retries.
    const during = upstreamSince(s.mock, startedAt, startedAt + 2_000);
    expect(during.rateLimited).toBeLessThanOrEqual(12);
    expect(during.total).toBeLessThanOrEqual(12);
    // Batch waited rather than fail: the agents' calls that met the 429s were answered once it ended.
    expect(batch.outcomes.filter((o) => o.endedAt > startedAt + 2_000 && o.status === 200).length).toBeGreaterThan(10);
    expect(batch.outcomes.filter((o) => o.status !== 200)).toEqual([]);
  }, 30_000);

  it("waits out 429s whose hint is an x-ratelimit reset, within the retry budget: no retry storm, online still served", async () => {
    // The provider takes 3 at a time; its 429s carry OpenAI's token-bucket headers, no retry-after (no hold-off).
    const s = await startStack(
      capped(6, {
        faults: { latencyMs: 150, capacity: 3, capacityHeaders: { 'x-ratelimit-limit-requests': '600', 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '300ms' } },
      }),
    );
    const client = sdk(s.baseURL);
    const batch = flood(client, 30);
    const startedAt = Date.now();
    await sleep(800);
    let online: Outcome[];
    try {
      online = await trickle(client, 30, 100);
    } finally {
      await batch.stop();
    }
    expect(okShare(online)).toBeGreaterThanOrEqual(0.9);
    // Retries are at most a tenth of requests per class, plus one a second per class: the provider saw about as
    // many requests as the clients made, not three times as many.
    const logical = batch.outcomes.length + online.length;
    const seconds = (Date.now() - startedAt) / 1000;
    expect(upstreamSince(s.mock, startedAt).total).toBeLessThan(logical * 1.25 + 2 * seconds + 10);
  }, 30_000);

  it('holds batch back while the quota headers say the provider is nearly spent, and lets online go at once', async () => {
    // A provider of our own: its first answer says 1 request of 100 is left this window, which resets in 1.5 s.
    let n = 0;
    const arrivals: number[] = [];
    const upstream: Server = createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        n++;
        arrivals.push(Date.now());
        const body = JSON.stringify({ id: `c${n}`, object: 'chat.completion', created: 1, model: 'gpt-4o', choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }] });
        const quota = n === 1 ? { 'x-ratelimit-limit-requests': '100', 'x-ratelimit-remaining-requests': '1', 'x-ratelimit-reset-requests': '1.5s' } : {};
        res.writeHead(200, { 'content-type': 'application/json', ...quota });
        res.end(body);
      });
    });
    await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
    try {
      const port = (upstream.address() as AddressInfo).port;
      const s = await startStack({
        config: (mockUrl) => {
          const base = defaultConfig(mockUrl, { route: { timeoutMs: 20_000 } });
          return { ...base, providers: { mock: { family: 'openai', baseUrl: `http://127.0.0.1:${port}/v1`, apiKey: 'k', maxConnections: 8 } } };
        },
      });
      const client = sdk(s.baseURL);
      const t0 = Date.now();
      expect((await call(client)).status).toBe(200);
      const [b, o] = await Promise.all([call(client, BATCH), call(client)]);
      expect([b.status, o.status]).toEqual([200, 200]);
      expect(o.ms).toBeLessThan(600);
      // Batch went only after the reset, 1.5 s after the first answer.
      expect(b.endedAt - t0).toBeGreaterThanOrEqual(1_300);
      expect(b.ms).toBeLessThan(6_000);
      expect(n).toBe(3);
      expect(arrivals[2]! - t0).toBeGreaterThanOrEqual(1_300);
    } finally {
      await new Promise((r) => upstream.close(r));
    }
  }, 30_000);

  it('parks online and batch through a 503 brownout, sends only probes, and releases online first when it ends', async () => {
    const s = await startStack({
      faults: { latencyMs: 150 },
      provider: {
        maxConnections: 16,
        pools: { maxConcurrent: 2 },
        breaker: { consecutiveFailures: 2, openS: 1, probeWhileParkedMs: 200, probeWhileParkedMaxMs: 400 },
      },
      route: { timeoutMs: 30_000 },
    });
    const client = sdk(s.baseURL);
    expect((await call(client)).status).toBe(200);
    s.mock.brownout('503', 1_500);
    const startedAt = Date.now();
    // Ten batch jobs first, then five online users, all during the brownout.
    const batch = Array.from({ length: 10 }, () => call(client, BATCH));
    await sleep(300);
    const online = Array.from({ length: 5 }, () => call(client));
    const [b, o] = [await Promise.all(batch), await Promise.all(online)];
    expect([...b, ...o].map((x) => x.status)).toEqual([...b, ...o].map(() => 200));
    // During the brownout the provider saw each call once at most (the breaker opens on 2 failures in a row once no
    // success has come for 250 ms: the 503s come back in milliseconds, so most of the first wave gets out), then only
    // the parked requests' probes (at 0.2, 0.6, 1 and 1.4 s): no call was retried on its own, 10 agents' worth.
    const during = s.mock.requests().filter((r) => r.receivedAt >= startedAt && r.receivedAt < startedAt + 1_500);
    expect(during.filter((r) => (r.headers['x-retry-attempt'] ?? '0') === '0').length).toBeLessThanOrEqual(15);
    expect(during.filter((r) => (r.headers['x-retry-attempt'] ?? '0') !== '0').length).toBeLessThanOrEqual(6);
    // Released by class: every online user was answered before most of the batch jobs, which parked earlier.
    expect(Math.max(...o.map((x) => x.endedAt))).toBeLessThanOrEqual(pct(b.map((x) => x.endedAt), 0.5));
  }, 30_000);
});

describe('a 429 with retry-after while online and batch wait', () => {
  it('releases the online users parked behind the hold-off before the batch jobs that parked earlier', async () => {
    const s = await startStack({
      faults: { latencyMs: 150, errors: [{ status: 429, times: 1, headers: { 'retry-after': '1' } }] },
      provider: { maxConnections: 16, pools: { maxConcurrent: 2 } },
      route: { timeoutMs: 30_000 },
    });
    const client = sdk(s.baseURL);
    // The first batch job meets the 429 and holds the target off for a second; the rest park behind it.
    const batch = [call(client, BATCH)];
    await sleep(100);
    for (let i = 0; i < 9; i++) batch.push(call(client, BATCH));
    await sleep(200);
    const online = Array.from({ length: 5 }, () => call(client));
    const [b, o] = [await Promise.all(batch), await Promise.all(online)];
    expect([...b, ...o].map((x) => x.status)).toEqual([...b, ...o].map(() => 200));
    expect(Math.max(...o.map((x) => x.endedAt))).toBeLessThanOrEqual(pct(b.map((x) => x.endedAt), 0.5));
    // One 429, then one request per call: the provider saw no retries beyond the one the hint asked for.
    expect(s.mock.stats().byStatus['429']).toBe(1);
    expect(s.mock.stats().total).toBe(16);
  }, 30_000);
});

/** Two pool classes with small queues, a provider that holds each answer `latencyMs`. */
function smallQueues(latencyMs: number, slots: number, online: number, batch: number): StackOptions {
  return {
    faults: { latencyMs },
    provider: { maxConnections: 16, pools: { maxConcurrent: slots, classes: { online: { minShare: 0.5, maxQueue: online }, batch: { minShare: 0.1, maxQueue: batch } } } },
    route: { timeoutMs: 30_000 },
  };
}

function expectShed(o: Outcome, status: number, type: string): number {
  expect(o.status).toBe(status);
  expectOpenAIError(o.error === undefined ? undefined : { error: o.error }, 'load_shed', type);
  expect(o.headers!.get('x-should-retry')).toBe('true');
  const ms = Number(o.headers!.get('retry-after-ms'));
  const s = Number(o.headers!.get('retry-after'));
  expect(ms).toBeGreaterThanOrEqual(100);
  expect(ms).toBeLessThanOrEqual(60_000);
  expect(s).toBe(Math.ceil(ms / 1000));
  return ms;
}

describe('load shedding, as clients and metrics see it', () => {
  it('sheds batch past its queue with 429 load_shed and a retry hint, still queues online, and counts each shed once', async () => {
    const s = await startStack(smallQueues(600, 2, 5, 3));
    const client = sdk(s.baseURL);
    const first = [call(client, BATCH), call(client, BATCH)];
    await until('both slots are taken', () => s.mock.stats().inflight === 2);
    const burst = await Promise.all([...Array.from({ length: 8 }, () => call(client, BATCH)), ...first, call(client)]);
    const shed = burst.filter((o) => o.status !== 200);
    // 2 running, 3 queued: 5 of the 8 are shed at once, told to come back later (the queue's wait, at least 0.6 s).
    expect(shed).toHaveLength(5);
    for (const o of shed) {
      expect(o.ms).toBeLessThan(500);
      expect(expectShed(o, 429, 'rate_limit_error')).toBeGreaterThanOrEqual(600);
    }
    // The online call queued and was served first (the batch queue was full, not its own).
    expect(burst.at(-1)!.status).toBe(200);
    expect(burst.at(-1)!.ms).toBeLessThan(1_500);
    expect(await metricSum(s, 'stormgate_shed_total{priority="batch",reason="queue_full"}')).toBe(5);
    expect(await metricSum(s, 'stormgate_shed_total{priority="online"')).toBe(0);
    // Nothing shed was sent upstream.
    expect(s.mock.stats().total).toBe(6);
  }, 30_000);

  it('sheds online past its own queue with 503 load_shed (not 429), x-should-retry true and a retry hint', async () => {
    const s = await startStack(smallQueues(600, 2, 2, 10));
    const client = sdk(s.baseURL);
    const calls = Array.from({ length: 7 }, () => call(client));
    const all = await Promise.all(calls);
    const shed = all.filter((o) => o.status !== 200);
    expect(shed).toHaveLength(3);
    for (const o of shed) expectShed(o, 503, 'server_error');
    expect(await metricSum(s, 'stormgate_shed_total{priority="online",reason="queue_full"}')).toBe(3);
  }, 30_000);

  it('tells a batch call that cannot expect a slot before its deadline so at once, while an online call of the same deadline is served', async () => {
    const s = await startStack(smallQueues(400, 1, 10, 50));
    const client = sdk(s.baseURL);
    // Round trips are timed (0.4 s) before the queue builds.
    expect((await call(client)).status).toBe(200);
    const backlog = Array.from({ length: 15 }, () => call(client, BATCH));
    await until('the batch backlog is queued', async () => (await metricSum(s, 'stormgate_pool_queue_depth{provider="mock",priority="batch"}')) >= 14);
    const [late, online] = await Promise.all([call(client, { ...BATCH, 'x-stormgate-timeout-ms': '2500' }), call(client, { 'x-stormgate-timeout-ms': '2500' })]);
    // 15 ahead at 0.4 s each is 6 s: no slot before 2.5 s. Told now, with the queue's wait to come back after.
    expect(late.ms).toBeLessThan(800);
    expect(expectShed(late, 429, 'rate_limit_error')).toBeGreaterThanOrEqual(2_500);
    expect(online.status).toBe(200);
    expect(online.ms).toBeLessThan(1_500);
    expect(await metricSum(s, 'stormgate_shed_total{priority="batch",reason="deadline"}')).toBe(1);
    expect((await Promise.all(backlog)).every((o) => o.status === 200)).toBe(true);
  }, 30_000);

  it('serves a batch burst twice its queue in the end through the SDK\'s own retries, each shed call coming back once told', async () => {
    const s = await startStack(smallQueues(200, 2, 10, 8));
    let sent = 0;
    const client = sdk(s.baseURL, {
      maxRetries: 5,
      fetch: async (url, init) => {
        sent++;
        return fetch(url, init);
      },
    });
    const all = await Promise.all(Array.from({ length: 20 }, () => call(client, BATCH)));
    expect(all.every((o) => o.status === 200)).toBe(true);
    // 10 fit at once (2 running, 8 queued); the others came back after the wait they were told, not in a loop.
    expect(sent).toBeGreaterThanOrEqual(21);
    expect(sent).toBeLessThanOrEqual(45);
    expect(s.mock.stats().total).toBe(20);
  }, 30_000);
});

describe('clients whose deadline a wait would pass', () => {
  it("tells online and batch calls with 2 s left at once during a 5 s hold-off: 429 provider_held_off with the wait, x-should-retry true", async () => {
    const s = await startStack({ faults: { latencyMs: 50, errors: [{ status: 429, times: 1, headers: { 'retry-after': '5' } }] }, route: { timeoutMs: 30_000 } });
    const client = sdk(s.baseURL);
    // The first call meets the 429 and waits the hold-off out itself (parked, within maxWaitHintMs).
    const first = call(client, BATCH);
    await until('the hold-off began', () => s.mock.stats().total === 1);
    await sleep(50);
    const [b, o] = await Promise.all([call(client, { ...BATCH, 'x-stormgate-timeout-ms': '2000' }), call(client, { 'x-stormgate-timeout-ms': '2000' })]);
    for (const x of [b, o]) {
      expect(x.status).toBe(429);
      expect(x.ms).toBeLessThan(800);
      expectOpenAIError({ error: x.error }, 'provider_held_off', 'rate_limit_error');
      expect(x.headers!.get('x-should-retry')).toBe('true');
      expect(Number(x.headers!.get('retry-after'))).toBeGreaterThanOrEqual(4);
      // The hold-off's end (5 s and its spread) plus a spread of each client's own past it, at most 1 s.
      expect(Number(x.headers!.get('retry-after'))).toBeLessThanOrEqual(7);
    }
    expect((await first).status).toBe(200);
    // Only the first call and its one retry reached the provider.
    expect(s.mock.stats().total).toBe(2);
  }, 30_000);

  it('sheds a batch call at once while the quota resets in 20 s and its deadline is sooner, telling it when; online goes', async () => {
    let n = 0;
    const upstream: Server = createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        n++;
        const body = JSON.stringify({ id: `c${n}`, object: 'chat.completion', created: 1, model: 'gpt-4o', choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }] });
        res.writeHead(200, { 'content-type': 'application/json', 'x-ratelimit-limit-requests': '1000', 'x-ratelimit-remaining-requests': '3', 'x-ratelimit-reset-requests': '20s' });
        res.end(body);
      });
    });
    await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
    try {
      const port = (upstream.address() as AddressInfo).port;
      const s = await startStack({
        config: (mockUrl) => ({ ...defaultConfig(mockUrl), providers: { mock: { family: 'openai', baseUrl: `http://127.0.0.1:${port}/v1`, apiKey: 'k', maxConnections: 8 } } }),
      });
      const client = sdk(s.baseURL);
      expect((await call(client)).status).toBe(200);
      const [b, o] = await Promise.all([call(client, { ...BATCH, 'x-stormgate-timeout-ms': '5000' }), call(client, { 'x-stormgate-timeout-ms': '5000' })]);
      expect(o.status).toBe(200);
      expect(b.ms).toBeLessThan(800);
      const waitMs = expectShed(b, 429, 'rate_limit_error');
      expect(waitMs).toBeGreaterThanOrEqual(15_000);
      expect(waitMs).toBeLessThanOrEqual(21_000);
      expect(n).toBe(2);
    } finally {
      await new Promise((r) => upstream.close(r));
    }
  }, 30_000);
});

describe('three classes: critical, online, batch', () => {
  it('serves critical first, then online, then batch; sheds online with 503 and batch with 429', async () => {
    const s = await startStack({
      faults: { latencyMs: 400 },
      provider: {
        maxConnections: 16,
        pools: { maxConcurrent: 1, classes: { critical: { minShare: 0.2, maxQueue: 10 }, online: { minShare: 0.2, maxQueue: 2 }, batch: { minShare: 0, maxQueue: 2 } } },
      },
      route: { timeoutMs: 30_000, priority: 'critical' },
    });
    const client = sdk(s.baseURL);
    const busy = call(client, BATCH);
    await until('the slot is taken', () => s.mock.stats().inflight === 1);
    const order: string[] = [];
    const tagged = (name: string, h: Record<string, string>) => call(client, h).then((o) => (o.status === 200 && order.push(name), o));
    const b = [tagged('batch', BATCH), tagged('batch', BATCH), tagged('batch', BATCH)];
    await sleep(50);
    const on = [tagged('online', { 'x-stormgate-priority': 'online' }), tagged('online', { 'x-stormgate-priority': 'online' }), tagged('online', { 'x-stormgate-priority': 'online' })];
    await sleep(50);
    const cr = [tagged('critical', {})];
    const [bs, os, cs] = [await Promise.all(b), await Promise.all(on), await Promise.all(cr)];
    await busy;
    expect(cs[0]!.status).toBe(200);
    expect(bs.filter((o) => o.status === 429)).toHaveLength(1);
    expect(os.filter((o) => o.status === 503)).toHaveLength(1);
    expectShed(bs.find((o) => o.status === 429)!, 429, 'rate_limit_error');
    expectShed(os.find((o) => o.status === 503)!, 503, 'server_error');
    expect(order).toEqual(['critical', 'online', 'online', 'batch', 'batch']);
  }, 30_000);
});

describe('batch is not starved', () => {
  it('keeps its minShare of the provider while online agents want all of it', async () => {
    const s = await startStack({
      faults: { latencyMs: 150 },
      provider: { maxConnections: 16, pools: { maxConcurrent: 4, classes: { online: { minShare: 0.5, maxQueue: 100 }, batch: { minShare: 0.25, maxQueue: 100 } } } },
      route: { timeoutMs: 30_000 },
    });
    const client = sdk(s.baseURL);
    const online = flood(client, 12, {});
    await sleep(500);
    let batch: Outcome[];
    try {
      batch = await Promise.all(Array.from({ length: 6 }, () => call(client, BATCH)));
    } finally {
      await online.stop();
    }
    // One slot of four is batch's under contention: 6 calls of 150 ms in about a second, not after online stops.
    expect(batch.every((o) => o.status === 200)).toBe(true);
    expect(Math.max(...batch.map((o) => o.ms))).toBeLessThan(4_000);
    expect(online.outcomes.every((o) => o.status === 200)).toBe(true);
  }, 30_000);
});

describe('the pool metrics', () => {
  it('match the provider: in use per class, queue depth per class, waits counted once per call, and all back to zero', async () => {
    const s = await startStack(smallQueues(1_500, 4, 20, 20));
    const client = sdk(s.baseURL);
    const batch = Array.from({ length: 10 }, () => call(client, BATCH));
    await until('four are upstream', () => s.mock.stats().inflight === 4);
    const online = Array.from({ length: 3 }, () => call(client));
    await until('the online calls are queued', async () => (await metricSum(s, 'stormgate_pool_queue_depth{provider="mock",priority="online"}')) === 3);
    expect(await metricSum(s, 'stormgate_pool_in_use{provider="mock",priority="batch"}')).toBe(4);
    expect(await metricSum(s, 'stormgate_pool_in_use{provider="mock",priority="online"}')).toBe(0);
    expect(await metricSum(s, 'stormgate_pool_queue_depth{provider="mock",priority="batch"}')).toBe(6);
    expect(s.mock.stats().inflight).toBe(4);
    // The next four slots go to online (3) and batch (1).
    await until('online holds the slots freed', async () => (await metricSum(s, 'stormgate_pool_in_use{provider="mock",priority="online"}')) === 3);
    expect(await metricSum(s, 'stormgate_pool_in_use{provider="mock",priority="batch"}')).toBe(1);
    await Promise.all([...batch, ...online]);
    expect(await metricSum(s, 'stormgate_pool_in_use{provider="mock"')).toBe(0);
    expect(await metricSum(s, 'stormgate_pool_queue_depth{provider="mock"')).toBe(0);
    expect(await metricSum(s, 'stormgate_pool_wait_seconds_count{provider="mock",priority="batch"}')).toBe(10);
    expect(await metricSum(s, 'stormgate_pool_wait_seconds_count{provider="mock",priority="online"}')).toBe(3);
    expect(await metricSum(s, 'stormgate_shed_total')).toBe(0);
  }, 30_000);
});

describe('two gateways on one redis-server', () => {
  /** Two instances of one fleet in front of one mock; `pools` and the mock's faults as the scenario needs. */
  async function fleet(faults: FaultSpec, provider: Partial<ConfigInput['providers'][string]>) {
    const mock = await startExtraMock({ faults, apiKey: TEST_KEY });
    const base = defaultConfig(mock.url, { route: { timeoutMs: 30_000 }, provider: { maxConnections: 64, ...provider } });
    const config = ConfigSchema.parse({ ...base, state: { redis: redisServer().url, keyPrefix: `tp8-${process.pid}-${Math.random().toString(36).slice(2)}`, commandTimeoutMs: 1_000 } });
    const logs: string[][] = [[], []];
    const [a, b] = [await startGateway(config, { logs: logs[0] }), await startGateway(config, { logs: logs[1] })];
    return { mock, a: sdk(`${a}/v1`), b: sdk(`${b}/v1`), urls: [a, b], logs };
  }

  it("holds instance B off a 429's retry-after met by A's batch flood: B's online users wait it out and are served, the provider sees nothing meanwhile", async () => {
    const f = await fleet({ latencyMs: 150, capacity: 10 }, { pools: { maxConcurrent: 8 } });
    const batch = flood(f.a, 20);
    await sleep(1_000);
    f.mock.brownout('429', 2_000);
    const startedAt = Date.now();
    await sleep(200);
    let online: Outcome[];
    try {
      online = await trickle(f.b, 10, 100);
    } finally {
      await batch.stop();
    }
    expect(online.map((o) => o.status)).toEqual(online.map(() => 200));
    expect(Math.max(...online.map((o) => o.endedAt - startedAt))).toBeLessThan(5_500);
    // The hold-off is the fleet's: B sent nothing into it (its users' calls all came after the first 429s), and A's
    // 20 agents did not retry into it either.
    const during = upstreamSince(f.mock, startedAt + 300, startedAt + 1_900);
    expect(during.total).toBeLessThanOrEqual(2);
    expect(upstreamSince(f.mock, startedAt, startedAt + 2_000).rateLimited).toBeLessThanOrEqual(12);
  }, 30_000);

  it("keeps serving instance B's occasional online users while A floods batch at a provider that refuses past its capacity", async () => {
    // The fleet shares maxConcurrent 6 = the provider's capacity. A's 40 batch agents want all of it; B's online users
    // call now and then, one at a time (every 400 ms, answered in 100 ms): between two exchanges of demand (twice a
    // second) B has had a call in flight, though at the moment of the exchange it mostly has none.
    const f = await fleet({ latencyMs: 100, capacity: 6 }, { pools: { maxConcurrent: 6 } });
    const batch = flood(f.a, 40);
    await sleep(1_500);
    const onlineFrom = Date.now();
    let online: Outcome[];
    try {
      online = await trickle(f.b, 15, 400);
    } finally {
      await batch.stop();
    }
    // Once the fleet has exchanged B's demand (the README's half-second delay, and a second for good measure), every
    // one of B's users is answered. Before the fix, demand was sampled at the exchange alone: B's calls read as none,
    // A kept all six slots, and B's calls met the provider's 429 (x-should-retry: false) two times in three.
    // And the first ones too: B's first online call waits (about a second) for A's batch to shrink rather than meet
    // the provider's 429 (the floor hold, test/fleet-online-first.test.ts).
    expect(online.map((o) => o.status)).toEqual(online.map(() => 200));
    const settled = online.filter((o) => o.endedAt - o.ms >= onlineFrom + 1_500);
    expect(settled.length).toBeGreaterThanOrEqual(10);
    expect(settled.map((o) => o.status)).toEqual(settled.map(() => 200));
    expect(pct(settled.map((o) => o.ms), 0.5)).toBeLessThan(600);
    // Batch on A got the rest.
    expect(batch.outcomes.filter((o) => o.status === 200).length).toBeGreaterThan(30);
  }, 40_000);
});
