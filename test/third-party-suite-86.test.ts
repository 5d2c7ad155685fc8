// Third-party suite 86, written from the README's "Idempotency keys" ("Where keys live", "A crash costs a lease") as an
// outside QA team evaluating LLM gateways would test IDEMPOTENCY KEYS ACROSS REDIS TROUBLE IN A FLEET: agents on the
// official `openai` SDK, its own retries on (a short timeout, so the SDK itself sends the call again under the same
// Idempotency-Key, each attempt to the next gateway of the fleet), while Redis is stopped and restarted empty, frozen
// (SIGSTOP) or has its writes paused (CLIENT PAUSE WRITE). Each gateway has a bundled mock provider of its own, so the
// suite counts what went upstream per key and per instance. The claim checked is the README's: a key runs once, except
// where it says otherwise (a failed run gives its key back; while Redis is away, or in the moment before an instance is
// back on it, a repeat on an instance that never saw the run runs it again), and never twice on one instance; every
// answer a client sees is the run's (`idempotent-replayed: true` on a repeat) or an OpenAI-shaped error with the right
// status (409 idempotency_key_in_progress with x-should-retry: true). Bounds are generous (a loaded 2-core machine).
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type { FastifyInstance } from 'fastify';
import OpenAI from 'openai';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { startMock, type FaultSpec, type MockServer } from '../src/mock/server.ts';
import { createLogger } from '../src/observability/logger.ts';
import { createMetrics } from '../src/observability/metrics.ts';
import { buildServer } from '../src/server.ts';
import { metricOf } from './helpers/redis-fleet.ts';
import { useRedisServerWithAdmin } from './helpers/redis-server.ts';
import { eventually } from './helpers/redis-stores.ts';
import { defaultConfig, TEST_KEY, testLogSink } from './helpers/stack.ts';

const { redis, admin } = useRedisServerWithAdmin({ maxRetriesPerRequest: 1 });
const unhandled: unknown[] = [];
const onUnhandled = (err: unknown) => void unhandled.push(err);
beforeAll(() => {
  process.on('unhandledRejection', onUnhandled);
});
afterAll(() => {
  process.off('unhandledRejection', onUnhandled);
});

// ---------------------------------------------------------------------------------------------------------------
// A fleet: N in-process gateways on one Redis, each with its own mock provider (what went upstream, and from where).

interface Fleet {
  urls: string[];
  mocks: MockServer[];
  logs: string[][];
}
interface Upstream {
  key: string | undefined;
  instance: number;
  at: number;
  stream: boolean;
}

const gateways: FastifyInstance[] = [];
const mocks: MockServer[] = [];
const thaws: Array<() => void> = [];
afterEach(async () => {
  for (const thaw of thaws.splice(0)) thaw();
  await Promise.all(gateways.splice(0).map((g) => g.close()));
  await Promise.all(mocks.splice(0).map((m) => m.close()));
  // A test that stopped Redis and failed before restarting it leaves it running for the next.
  if ((await admin().ping().catch(() => 'down')) !== 'PONG') await redis().restart();
  expect(unhandled.splice(0)).toEqual([]);
});

type FleetOptions = Pick<Parameters<typeof defaultConfig>[1] & object, 'route' | 'provider'> & { idempotency?: ConfigInput['idempotency'] };

async function startFleet(n: number, faults: FaultSpec, o: FleetOptions = {}): Promise<Fleet> {
  const keyPrefix = `tp86-${randomUUID()}`;
  const fleet: Fleet = { urls: [], mocks: [], logs: [] };
  for (let i = 0; i < n; i++) {
    const mock = await startMock({ faults, quiet: true, apiKey: TEST_KEY });
    mocks.push(mock);
    const input: ConfigInput = { ...defaultConfig(mock.url, o), state: { redis: redis().url, keyPrefix, commandTimeoutMs: 100 }, idempotency: o.idempotency ?? {} };
    const config = ConfigSchema.parse(input);
    const lines: string[] = [];
    const g = await buildServer(config, { logger: createLogger(config, testLogSink(lines)), metrics: createMetrics({ defaultMetrics: false }) });
    gateways.push(g);
    fleet.urls.push(await g.listen({ host: '127.0.0.1', port: 0 }));
    fleet.mocks.push(mock);
    fleet.logs.push(lines);
  }
  for (const url of fleet.urls) await eventually(async () => (await metricOf(url, DEGRADED)) === 0, 5_000);
  return fleet;
}

const DEGRADED = 'stormgate_state_degraded';
const degradedOn = async (url: string) => (await metricOf(url, DEGRADED)) === 1;
const allOnRedis = async (f: Fleet, withinMs = 20_000) => {
  for (const url of f.urls) await eventually(async () => !(await degradedOn(url)), withinMs);
};

/** Every chat completion the fleet's providers received, with the Idempotency-Key it carried and the instance that sent it. */
function upstream(f: Fleet): Upstream[] {
  return f.mocks.flatMap((m, instance) =>
    m.requests()
      .filter((r) => r.path.endsWith('/chat/completions'))
      .map((r) => ({ key: r.headers['idempotency-key'], instance, at: r.receivedAt, stream: r.stream })),
  );
}
const upstreamOf = (f: Fleet, key: string) => upstream(f).filter((u) => u.key === key);

// ---------------------------------------------------------------------------------------------------------------
// Agents: the `openai` SDK with its own retries, each HTTP attempt sent to the next instance of the fleet.

/** One HTTP attempt as the agent's SDK saw it. */
interface Attempt {
  key: string;
  instance: number;
  at: number;
  status: number | 'aborted';
  code?: string | undefined;
  shouldRetry?: string | null;
  retryAfterMs?: string | null;
  replayed?: string | null;
}

/** A fetch for the SDK that sends attempt n to instance (first + n) mod N and records what came back. */
function roundRobin(urls: string[], first: number, key: string, seen: Attempt[]): (input: string | URL | Request, init?: RequestInit) => Promise<Response> {
  let n = first;
  return async (input, init) => {
    const instance = n++ % urls.length;
    const target = new URL(input instanceof Request ? input.url : String(input));
    target.host = new URL(urls[instance]!).host;
    const at = Date.now();
    try {
      const res = await fetch(target, init);
      const attempt: Attempt = { key, instance, at, status: res.status, replayed: res.headers.get('idempotent-replayed') };
      if (res.status >= 400) {
        attempt.shouldRetry = res.headers.get('x-should-retry');
        attempt.retryAfterMs = res.headers.get('retry-after-ms');
        attempt.code = ((await res.clone().json()) as { error?: { code?: string } }).error?.code;
      }
      seen.push(attempt);
      return res;
    } catch (err) {
      seen.push({ key, instance, at, status: 'aborted' });
      throw err;
    }
  };
}

interface AgentEnd {
  key: string;
  status: number | string;
  id?: string;
  content?: string | null;
  replayed?: string | null;
  ms: number;
  error?: string;
}

const prompt = (key: string) => `call ${key}`;
const newKey = (i: number) => `k86-${i}-${randomUUID().slice(0, 8)}`;

async function agent(urls: string[], first: number, key: string, seen: Attempt[], o: { timeoutMs: number; maxRetries: number }): Promise<AgentEnd> {
  const client = new OpenAI({ baseURL: `${urls[0]}/v1`, apiKey: 'sk-client-not-a-provider-key', maxRetries: o.maxRetries, timeout: o.timeoutMs, fetch: roundRobin(urls, first, key, seen) });
  const started = Date.now();
  try {
    const { data, response } = await client.chat.completions
      .create({ model: 'gpt-4o', messages: [{ role: 'user', content: prompt(key) }] }, { headers: { 'Idempotency-Key': key } })
      .withResponse();
    return { key, status: response.status, id: data.id, content: data.choices[0]?.message.content, replayed: response.headers.get('idempotent-replayed'), ms: Date.now() - started };
  } catch (err) {
    return { key, status: err instanceof OpenAI.APIError ? (err.status ?? 'connection') : 'threw', error: String(err), ms: Date.now() - started };
  }
}

/** One keyed call on one instance, no SDK retries: what it got. */
async function once(url: string, key: string, o: { timeoutMs?: number; content?: string } = {}): Promise<AgentEnd & { code?: string; shouldRetry?: string | null }> {
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0, timeout: o.timeoutMs ?? 15_000 });
  const started = Date.now();
  try {
    const { data, response } = await client.chat.completions
      .create({ model: 'gpt-4o', messages: [{ role: 'user', content: o.content ?? prompt(key) }] }, { headers: { 'Idempotency-Key': key } })
      .withResponse();
    return { key, status: response.status, id: data.id, content: data.choices[0]?.message.content, replayed: response.headers.get('idempotent-replayed'), ms: Date.now() - started };
  } catch (err) {
    if (err instanceof OpenAI.APIError && err.status !== undefined) {
      return { key, status: err.status, code: err.code ?? undefined, shouldRetry: err.headers?.get('x-should-retry'), ms: Date.now() - started };
    }
    return { key, status: 'threw', error: String(err), ms: Date.now() - started };
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The crowd: 36 agents on 3 instances, provider at 1-3 s, SDK timeout 1.2 s and 3 retries, Redis trouble mid-run.

const AGENTS = 36;
const AGENT_BOUND_MS = 25_000;

interface Crowd {
  f: Fleet;
  keys: string[];
  ends: AgentEnd[];
  seen: Attempt[];
  /** From the trouble's start to 2 s after every instance is back on Redis: where the README allows a second run. */
  window: { from: number; to: number };
}

async function crowd(trouble: (f: Fleet) => Promise<void>, o: FleetOptions = {}): Promise<Crowd> {
  const f = await startFleet(3, { latencyMs: 1_000, latencyJitterMs: 2_000 }, o);
  const keys = Array.from({ length: AGENTS }, (_, i) => newKey(i));
  const seen: Attempt[] = [];
  const runs = keys.map((key, i) => sleep(i * 15).then(() => agent(f.urls, i, key, seen, { timeoutMs: 1_200, maxRetries: 3 })));
  await eventually(() => new Set(upstream(f).map((u) => u.key)).size >= AGENTS / 2, 5_000);
  const from = Date.now();
  await trouble(f);
  await allOnRedis(f);
  const window = { from, to: Date.now() + 2_000 };
  const ends = await Promise.all(runs);
  return { f, keys, ends, seen, window };
}

/** The README's rules, checked on a crowd's record. Returns the keys that ran twice. */
function checkCrowd(c: Crowd, o: { strict: boolean }): string[] {
  const why = (x: unknown) => JSON.stringify(x);
  // Every agent got its answer, with the content of its own call, within its bound.
  for (const end of c.ends) {
    expect(end.status, why(end)).toBe(200);
    expect(end.content, why(end)).toContain(prompt(end.key));
    expect(end.ms, why(end)).toBeLessThan(AGENT_BOUND_MS);
  }
  // Every answer an SDK saw on the way was a 200, or the 409 that invites it back with the same key.
  for (const a of c.seen.filter((x) => x.status !== 200 && x.status !== 'aborted')) {
    expect(a, why(a)).toMatchObject({ status: 409, code: 'idempotency_key_in_progress', shouldRetry: 'true', retryAfterMs: '1000' });
  }
  const twice: string[] = [];
  for (const key of c.keys) {
    const runs = upstreamOf(c.f, key).sort((x, y) => x.at - y.at);
    const detail = why({ key, runs, attempts: c.seen.filter((a) => a.key === key), window: c.window });
    expect(runs.length, detail).toBeGreaterThanOrEqual(1);
    // Never twice on one instance: there, a run (its answer, or its claim) is always known.
    expect(new Set(runs.map((r) => r.instance)).size, detail).toBe(runs.length);
    if (o.strict) expect(runs.length, detail).toBe(1);
    // A second run only where the README allows one: while Redis was in trouble, or in the moment before an instance was back on it.
    for (const r of runs.slice(1)) {
      expect(r.at, detail).toBeGreaterThanOrEqual(c.window.from);
      expect(r.at, detail).toBeLessThanOrEqual(c.window.to);
    }
    if (runs.length > 1) twice.push(key);
    // The SDK's own retry that got the answer of a run it did not start got it as a repeat.
    const end = c.ends.find((e) => e.key === key)!;
    const answered = c.seen.filter((a) => a.key === key && a.status === 200);
    expect(answered, detail).toHaveLength(1);
    if (runs.length === 1 && c.seen.filter((a) => a.key === key).length > 1 && runs[0]!.instance !== answered[0]!.instance) {
      expect(end.replayed, detail).toBe('true');
    }
  }
  return twice;
}

/** Once the fleet is back on Redis: a repeat of every key on another instance than its first gets an answer kept, nothing runs. */
async function repeatAll(c: Crowd, twice: string[]): Promise<void> {
  await sleep(1_000); // what instances kept while away reaches Redis (sent on recovery)
  const before = upstream(c.f).length;
  const repeats = await Promise.all(c.keys.map((key, i) => once(c.f.urls[(i + 1) % c.f.urls.length]!, key, { timeoutMs: 10_000 })));
  for (const [i, r] of repeats.entries()) {
    const end = c.ends[i]!;
    expect(r, JSON.stringify({ r, end })).toMatchObject({ status: 200, replayed: 'true', content: end.content });
    // A key that ran once has one answer: the agent's. One that ran twice has two, on different instances.
    if (!twice.includes(r.key)) expect(r.id, JSON.stringify({ r, end })).toBe(end.id);
  }
  expect(upstream(c.f).length).toBe(before);
}

describe('a crowd of 36 agents on 3 instances, the SDK retrying under each agent\'s key', () => {
  it('with Redis healthy throughout: exactly one upstream request per key, and every retry that found the run gets its answer replayed', async () => {
    const c = await crowd(async () => undefined);
    const twice = checkCrowd(c, { strict: true });
    expect(twice).toEqual([]);
    // The SDK did retry, across instances: the claim is tested, not bypassed.
    expect(c.seen.filter((a) => a.status === 'aborted').length).toBeGreaterThan(5);
    expect(c.ends.filter((e) => e.replayed === 'true').length).toBeGreaterThan(5);
    await repeatAll(c, twice);
  }, 60_000);

  it('with Redis stopped mid-run and restarted empty 1.5 s later: a second run only inside the outage, never two on one instance, every agent answered', async () => {
    const c = await crowd(async () => {
      await redis().stop();
      await sleep(1_500);
      await redis().restart();
    });
    const twice = checkCrowd(c, { strict: false });
    await repeatAll(c, twice);
  }, 60_000);

  it('with Redis frozen (SIGSTOP) for 1.5 s mid-run: the same, and the fleet back on Redis after it', async () => {
    const c = await crowd(async () => {
      const thaw = redis().freeze();
      thaws.push(thaw);
      await sleep(1_500);
      thaw();
    });
    const twice = checkCrowd(c, { strict: false });
    await repeatAll(c, twice);
  }, 60_000);

  it('with Redis frozen 1.5 s and idempotency.waitForRedisMs 10000: exactly one upstream request per key, every agent answered', async () => {
    const c = await crowd(
      async () => {
        const thaw = redis().freeze();
        thaws.push(thaw);
        await sleep(1_500);
        thaw();
      },
      { idempotency: { waitForRedisMs: 10_000 } },
    );
    expect(checkCrowd(c, { strict: true })).toEqual([]);
    await repeatAll(c, []);
  }, 60_000);

  it('with Redis writes paused (CLIENT PAUSE 1500 WRITE) mid-run: the same', async () => {
    const c = await crowd(async () => {
      await admin().call('CLIENT', 'PAUSE', '1500', 'WRITE');
      await sleep(1_600);
    });
    const twice = checkCrowd(c, { strict: false });
    await repeatAll(c, twice);
  }, 60_000);
});

// ---------------------------------------------------------------------------------------------------------------
// One key at a time: a repeat on another instance while Redis goes away.

describe('a repeat waiting on instance B for the run on A while Redis goes away', () => {
  it('Redis stopped, the run ending while it is away, Redis back empty: the repeat gets the run\'s answer replayed, one upstream request', async () => {
    const f = await startFleet(2, { latencyMs: 2_500 });
    const [a, b] = f.urls as [string, string];
    const key = newKey(0);
    const run = once(a, key, { timeoutMs: 20_000 });
    await eventually(() => upstreamOf(f, key).length === 1, 3_000);
    const repeat = once(b, key, { timeoutMs: 20_000 });
    await sleep(400); // B has found A's run in Redis
    await redis().stop();
    const answer = await run; // ends on A while Redis is away
    expect(answer.status).toBe(200);
    await sleep(300);
    await redis().restart();
    const replay = await repeat;
    expect(replay, JSON.stringify(replay)).toMatchObject({ status: 200, replayed: 'true', id: answer.id, content: answer.content });
    expect(upstreamOf(f, key)).toHaveLength(1);
    // And after: once the fleet is on Redis, a third repeat on B gets it as well.
    await allOnRedis(f);
    expect(await once(b, key)).toMatchObject({ status: 200, replayed: 'true', id: answer.id });
    expect(upstreamOf(f, key)).toHaveLength(1);
  }, 40_000);

  it('Redis restarted empty while the run still goes: the run claims its key again, and an SDK agent rotating between A and B gets one run', async () => {
    const f = await startFleet(2, { latencyMs: 4_000 });
    const key = newKey(1);
    const seen: Attempt[] = [];
    // SDK timeout 1.5 s, 4 retries: A, B, A, B, A, each attempt waiting for the run (or invited back by a 409).
    const end = agent(f.urls, 0, key, seen, { timeoutMs: 1_500, maxRetries: 4 });
    await eventually(() => upstreamOf(f, key).length === 1, 3_000);
    await redis().stop();
    await sleep(500);
    await redis().restart();
    await allOnRedis(f);
    const got = await end;
    expect(got, JSON.stringify({ got, seen })).toMatchObject({ status: 200, replayed: 'true' });
    expect(upstreamOf(f, key), JSON.stringify(seen)).toHaveLength(1);
    for (const x of seen.filter((s) => s.status !== 200 && s.status !== 'aborted')) expect(x).toMatchObject({ status: 409, code: 'idempotency_key_in_progress', shouldRetry: 'true' });
    expect(new Set(seen.map((s) => s.instance))).toEqual(new Set([0, 1]));
  }, 40_000);
});

// ---------------------------------------------------------------------------------------------------------------
// Runs that fail give their key back; bodies that differ are refused.

describe('a run that fails gives its key back', () => {
  const ONE_ATTEMPT = { route: { retry: { maxAttempts: 1 } }, provider: { breaker: false } } as const;

  it("the provider's 503 on A is the client's, not retried by its SDK (x-should-retry: false); the next repeat, on B, runs again (two upstream requests, as documented) and a repeat on C replays B's answer", async () => {
    const f = await startFleet(3, {}, ONE_ATTEMPT);
    f.mocks[0]!.setFaults({ errors: [{ status: 503, times: 1 }] });
    const key = newKey(2);
    const seen: Attempt[] = [];
    const failed = await agent(f.urls, 0, key, seen, { timeoutMs: 10_000, maxRetries: 2 });
    expect(failed).toMatchObject({ status: 503 });
    expect(seen).toEqual([expect.objectContaining({ instance: 0, status: 503, shouldRetry: 'false', code: 'service_unavailable' })]);
    const again = await once(f.urls[1]!, key);
    expect(again).toMatchObject({ status: 200, replayed: null });
    expect(upstreamOf(f, key).map((u) => u.instance)).toEqual([0, 1]);
    expect(await once(f.urls[2]!, key)).toMatchObject({ status: 200, replayed: 'true', id: again.id });
    expect(await once(f.urls[0]!, key)).toMatchObject({ status: 200, replayed: 'true', id: again.id });
    expect(upstreamOf(f, key)).toHaveLength(2);
  }, 30_000);

  it('a run on A that fails while Redis is frozen gives its key back once Redis answers again: a repeat on B runs at once rather than wait out the lease', async () => {
    // The gateway cuts the run itself (responseMs 800 ms, provider at 3 s): an error, not an answer.
    const f = await startFleet(2, { latencyMs: 3_000 }, { route: { retry: { maxAttempts: 1, retryOn: [429] } }, provider: { breaker: false, timeouts: { responseMs: 800 } } });
    const [a, b] = f.urls as [string, string];
    const key = newKey(3);
    const run = once(a, key, { timeoutMs: 20_000 });
    await eventually(() => upstreamOf(f, key).length === 1, 3_000);
    const thaw = redis().freeze();
    thaws.push(thaw);
    const failed = await run;
    expect(failed).toMatchObject({ status: 504 });
    await sleep(300);
    thaw();
    await allOnRedis(f);
    await sleep(500);
    f.mocks[1]!.setFaults({ latencyMs: 200 });
    const again = await once(b, key, { timeoutMs: 5_000 });
    expect(again, JSON.stringify(again)).toMatchObject({ status: 200, replayed: null });
    expect(again.ms).toBeLessThan(3_000);
    expect(upstreamOf(f, key).map((u) => u.instance)).toEqual([0, 1]);
  }, 30_000);
});

describe('the same key with another body', () => {
  it('is 422 idempotency_key_reused on another instance, while the run goes and after its answer, and nothing more goes upstream', async () => {
    const f = await startFleet(2, { latencyMs: 1_500 });
    const [a, b] = f.urls as [string, string];
    const key = newKey(4);
    const run = once(a, key);
    await eventually(() => upstreamOf(f, key).length === 1, 3_000);
    const during = await once(b, key, { content: 'another call' });
    expect(during).toMatchObject({ status: 422, code: 'idempotency_key_reused', shouldRetry: 'false' });
    expect((await run).status).toBe(200);
    expect(await once(b, key, { content: 'another call' })).toMatchObject({ status: 422, code: 'idempotency_key_reused' });
    expect(upstreamOf(f, key)).toHaveLength(1);
  }, 30_000);

  it('is 422 on the instance that kept the answer while Redis was away, and after Redis is back on the other, nothing more upstream', async () => {
    const f = await startFleet(2, { latencyMs: 300 });
    const [a, b] = f.urls as [string, string];
    const key = newKey(5);
    await redis().stop();
    await eventually(() => degradedOn(a), 5_000);
    expect((await once(a, key)).status).toBe(200);
    expect(await once(a, key, { content: 'another call' })).toMatchObject({ status: 422, code: 'idempotency_key_reused' });
    await redis().restart();
    await allOnRedis(f);
    await sleep(1_000); // A's kept answer reaches Redis
    expect(await once(b, key, { content: 'another call' })).toMatchObject({ status: 422, code: 'idempotency_key_reused' });
    expect(await once(b, key)).toMatchObject({ status: 200, replayed: 'true' });
    expect(upstreamOf(f, key)).toHaveLength(1);
  }, 30_000);
});

// ---------------------------------------------------------------------------------------------------------------
// Streams.

/** A keyed stream through the SDK on one instance: its chunk ids, its text, and whether it came as a repeat. */
async function readStream(url: string, key: string): Promise<{ ids: string[]; text: string; replayed: string | null }> {
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sk-client-not-a-provider-key', maxRetries: 2, timeout: 20_000 });
  const { data, response } = await client.chat.completions
    .create({ model: 'gpt-4o', stream: true, messages: [{ role: 'user', content: prompt(key) }] }, { headers: { 'Idempotency-Key': key } })
    .withResponse();
  const ids = new Set<string>();
  let text = '';
  for await (const chunk of data) {
    ids.add(chunk.id);
    text += chunk.choices[0]?.delta.content ?? '';
  }
  return { ids: [...ids], text, replayed: response.headers.get('idempotent-replayed') };
}

describe('a keyed stream with a repeat on another instance across Redis trouble', () => {
  it('Redis frozen (SIGSTOP) 1.5 s: the repeat waits through the freeze and gets the same events, marked replayed; one upstream request', async () => {
    const f = await startFleet(2, { stream: { chunks: 8, chunkDelayMs: 300 } });
    const [a, b] = f.urls as [string, string];
    const key = newKey(6);
    const read = (url: string) => readStream(url, key);
    const run = read(a);
    await eventually(() => upstreamOf(f, key).length === 1, 3_000);
    const repeat = read(b);
    await sleep(400); // B has found A's run in Redis
    const thaw = redis().freeze();
    thaws.push(thaw);
    await sleep(1_500);
    thaw();
    const [first, second] = await Promise.all([run, repeat]);
    expect(first.text).toContain(prompt(key).slice(0, 10));
    expect(second).toEqual({ ...first, replayed: 'true' });
    expect(first.replayed).toBeNull();
    expect(upstreamOf(f, key)).toEqual([expect.objectContaining({ instance: 0, stream: true })]);
    await allOnRedis(f);
  }, 40_000);

  it('Redis restarted empty mid-stream: the run claims its key again, and a repeat on B once the fleet is back waits for it and replays it; one upstream request', async () => {
    const f = await startFleet(2, { stream: { chunks: 10, chunkDelayMs: 400 } });
    const [a, b] = f.urls as [string, string];
    const key = newKey(7);
    const run = readStream(a, key);
    await eventually(() => upstreamOf(f, key).length === 1, 3_000);
    await sleep(300);
    await redis().stop();
    await sleep(500);
    await redis().restart();
    await allOnRedis(f);
    await sleep(300); // A's claim sent again
    const repeat = readStream(b, key);
    const [first, second] = await Promise.all([run, repeat]);
    expect(second).toEqual({ ...first, replayed: 'true' });
    expect(upstreamOf(f, key)).toHaveLength(1);
  }, 40_000);
});
