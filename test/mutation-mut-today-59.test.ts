// Hand mutation testing of the latest changes: waiting for Redis in an outage's first idempotency.waitForRedisMs
// (state/redis-kept-keys.ts #claimAway, redis-health.ts degradedForMs) and the store's defaults for it and for
// keyLeaseMs (redis-store.ts), a repeat's 409 naming where its run is (pipeline/idempotent-request.ts runsHere), the
// idle timer that decides a stall after the turn's reads (pipeline/live-stream.ts #progressedReads), the breaker's
// "older attempt still unanswered" (pools/provider-pool.ts unansweredSince), usage read from a whole body
// (streaming/usage.ts usageAt, objectEnd, tokens), the completion a recovered stream keeps (delivered-text.ts) and a
// splice refused for a tool call begun before its seam (stream-recovery.ts splice).
// 30 hand mutants: 17 killed by the existing files, 11 killed here, 2 equivalent, 0 open. No bug in the code.
// Equivalent (Node >= 20, the engines' floor: refresh() of a cleared timer does nothing): the idle timer's deferred
// verdict refreshing its timer though #rearmIdle replaced it (the old one was cleared), and that verdict run after the
// stream ended (#finish cleared the timer and the stream's end aborted its upstream already).
// The Redis parts run on a real redis-server the test cuts the store off (a TCP proxy), the store's clock the test's.
import { setTimeout as sleep } from 'node:timers/promises';
import { randomUUID } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { GatewayError } from '../src/errors.ts';
import { claimKey, type IdempotencyDeps } from '../src/pipeline/idempotent-request.ts';
import { DeliveredText } from '../src/pipeline/delivered-text.ts';
import { ProviderPool } from '../src/pools/provider-pool.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import { RedisStore } from '../src/state/redis-store.ts';
import type { KeyRecord, StateStore } from '../src/state/store.ts';
import { usageOf, usageOfBody } from '../src/streaming/usage.ts';
import { deliverData, handedOverStream, readAll } from './helpers/live-stream.ts';
import { startRedis } from './helpers/redis-server.ts';
import { cutAndFleet, eventually, running } from './helpers/redis-stores.ts';
import { startTcpProxy } from './helpers/tcp-proxy.ts';
import { cc, delta, DONE, type Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';
import { requestLine } from './helpers/stack.ts';

/** A store on its own redis-server behind a proxy, its clock the test's (`clock.t`); `away` cuts it off Redis. */
async function storeOnClock(waitForRedisMs?: number) {
  const redis = await startRedis();
  const proxy = await startTcpProxy(redis.port);
  const clock = { t: Date.now() };
  const store = new RedisStore({
    config: { redis: `redis://127.0.0.1:${proxy.port}`, commandTimeoutMs: 100, keyPrefix: `mut59-${randomUUID()}` },
    now: () => clock.t,
    ...(waitForRedisMs !== undefined && { waitForRedisMs }),
  });
  expect(await store.ready()).toBe(true);
  return {
    store,
    clock,
    away: async () => {
      await proxy.cut();
      await eventually(() => store.degraded, 3_000);
    },
    close: async () => {
      await store.close();
      await proxy.close();
      await redis.stop();
    },
  };
}

describe('idempotency.waitForRedisMs: how long into an outage a keyed request the instance knows nothing of waits for Redis', () => {
  it('waits for Redis until waitForRedisMs after the store degraded, and from that very millisecond runs on local state', async () => {
    const s = await storeOnClock(2_000);
    try {
      await s.away();
      const from = s.clock.t; // the store's clock stands still: it degraded at this instant
      s.clock.t = from + 1_999;
      expect(await s.store.claimKey('a', running('ra', s.clock.t), 30_000)).toMatchObject({ state: 'running' });
      s.clock.t = from + 2_000;
      expect(await s.store.claimKey('b', running('rb', s.clock.t), 30_000)).toBeUndefined();
    } finally {
      await s.close();
    }
  }, 30_000);

  it('with its default (0) waits not at all, not even in the millisecond the store degraded', async () => {
    const s = await storeOnClock();
    try {
      await s.away();
      expect(await s.store.claimKey('a', running('ra', s.clock.t), 30_000)).toBeUndefined();
    } finally {
      await s.close();
    }
  }, 30_000);
});

describe("RedisStore's keyLeaseMs default (idempotency.leaseMs: 10000)", () => {
  it("waits, Redis away, for another request's run it saw for 10 s from the sighting, not less", async () => {
    const f = await cutAndFleet({ prefix: 'mut59-lease' });
    try {
      const t = Date.now();
      expect(await f.fleet.claimKey('k', running('theirs', t), 60_000)).toBeUndefined();
      expect(await f.cut.readKey('k', t)).toMatchObject({ state: 'running', owner: 'theirs' });
      await f.away();
      expect(await f.cut.claimKey('k', running('repeat', t + 9_999), 60_000)).toMatchObject({ state: 'running', owner: 'theirs' });
      expect(await f.cut.claimKey('k', running('later', t + 10_000), 60_000)).toBeUndefined();
    } finally {
      await f.close();
    }
  }, 30_000);
});

/** claimKey's deps on `store`, with the instance's set of runs going. */
const depsOn = (store: StateStore, runsHere = new Set<string>()): IdempotencyDeps => ({
  store,
  config: { enabled: true, ttlMs: 600_000, maxAnswerBytes: 1024 * 1024, memoryBytes: 64 * 1024 * 1024, leaseMs: 10_000 },
  now: () => Date.now(),
  random: () => 0.5,
  runsHere,
});
const keyed = (key: string, owner: string, waitMs: number) => ({
  key, fingerprint: 'fp', owner, keptMs: 600_000, runningMs: 60_000, waitUntilMs: Date.now() + waitMs, clientGone: () => false, pastGrace: () => false,
});

describe("a repeat's 409 idempotency_key_in_progress, by where the state store is", () => {
  /** A store that always holds `theirs`'s run under every key (another instance's, on a Redis that is up or away). */
  const holding = (degraded: boolean): StateStore => {
    const record: KeyRecord = { state: 'running', fingerprint: 'fp', sinceMs: Date.now(), owner: 'theirs' };
    return { degraded, claimKey: async () => record, readKey: async () => record, releaseKey: async () => undefined } as unknown as StateStore;
  };
  const refusal = async (store: StateStore) => {
    const err = await claimKey(keyed('k', 'mine', 10), depsOn(store)).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(GatewayError);
    expect((err as GatewayError).code).toBe('idempotency_key_in_progress');
    return (err as GatewayError).message;
  };

  it("says the run is still running when the store is on Redis, though the run is another instance's", async () => {
    expect(await refusal(holding(false))).toMatch(/is still running; send it again/);
    expect(await refusal(holding(true))).toMatch(/may still be running on another instance \(the state store is away\)/);
  });
});

describe("the instance's set of runs going (runsHere)", () => {
  it('forgets a run once it has ended: a set that only grew held every keyed request the instance ever ran', async () => {
    const runsHere = new Set<string>();
    const deps = depsOn(new MemoryStore(), runsHere);
    const claim = await claimKey(keyed('k', 'owner-1', 1_000), deps);
    if (claim.kind !== 'run') throw new Error('expected a run');
    expect([...runsHere]).toEqual(['owner-1']);
    claim.giveBack();
    await claim.ended;
    await sleep(0);
    expect(runsHere.size).toBe(0);
  });
});

const chunk = (content: string, finish: string | null = null): string =>
  `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content }, finish_reason: finish }] })}\n\n`;

describe('the idle timer, fired in a starved turn whose reads then bring an event', () => {
  it('keeps the stream though the next read has already begun by the time the stall is judged (the reads counted, not the wait)', async () => {
    const IDLE_MS = 100;
    const controller = new AbortController();
    let reads = 0;
    // Like undici's body: a read fails once its request is aborted.
    const read = (value: string, afterMs: number, starve: boolean) =>
      new Promise<IteratorResult<Buffer>>((resolve, reject) => {
        controller.signal.addEventListener('abort', () => reject(controller.signal.reason as Error), { once: true });
        setTimeout(() => resolve({ value: Buffer.from(value), done: false }), afterMs);
        // The event comes just after the idle timer expires, in a turn the process is starved in (the busy wait): the
        // idle timer runs first; the read then brings the event, and the client's next read begins in that same turn.
        if (starve) setImmediate(() => {
          for (const until = performance.now() + 3 * IDLE_MS; performance.now() < until; );
        });
      });
    const iterator: AsyncIterator<Buffer> = {
      next: () => {
        reads++;
        if (reads === 1) return read(chunk('lo'), IDLE_MS + 5, true);
        if (reads === 2) return read(chunk('!', 'stop') + DONE, IDLE_MS / 2, false);
        return Promise.resolve({ value: undefined, done: true });
      },
    };
    const { live, ended } = handedOverStream({ first: chunk('Hel'), iterator, controller, idleMs: IDLE_MS, apiKey: 'sk-mut59-provider-key' });
    const text = await readAll(live);
    expect(text).not.toContain('stalled');
    expect(text).toContain('"!"');
    expect(text.endsWith(DONE)).toBe(true);
    expect((await ended).kind).toBe('complete');
  });
});

describe("the breaker's older attempts still unanswered (ProviderPool unansweredSince)", () => {
  it('counts an attempt sent in the same millisecond as the failed one: a burst goes out in one', () => {
    const clock = { t: 1_000 };
    const pool = new ProviderPool({ provider: 'p', capacity: 10, retryCapacity: 10, classes: [{ name: 'online', minShare: 1, maxQueue: 10 }], decrease: 0.9, minLimit: 1 }, () => clock.t);
    const other = pool.sending('p/m');
    const failed = pool.sending('p/m');
    clock.t = 1_003;
    failed(); // a fast 503, 3 ms after both went out
    expect(pool.unansweredSince('p/m', 3)).toBe(true);
    expect(pool.unansweredSince('p/m', 4)).toBe(false); // sent after it: no answer it may yet give ends the run
    other();
    expect(pool.unansweredSince('p/m', 3)).toBe(false);
  });
});

describe("usage from a whole answer's body (usageOfBody)", () => {
  it('reads a usage object of 2 KB (a provider that pretty-prints every detail), not only one as short as OpenAI\'s', () => {
    const details = Object.fromEntries(Array.from({ length: 80 }, (_, i) => [`detail_${i}_tokens`, i]));
    const usage = { prompt_tokens: 12, completion_tokens: 34, total_tokens: 46, ...details };
    const body = Buffer.from(JSON.stringify({ id: 'chatcmpl-1', object: 'chat.completion', choices: [], usage }, null, 2));
    const object = JSON.stringify(usage, null, 2);
    expect(object.length).toBeGreaterThan(1_500);
    expect(object.length).toBeLessThan(4_000);
    expect(usageOfBody(body)).toEqual({ prompt: 12, completion: 34 });
    expect(usageOf(JSON.parse(body.toString()))).toEqual({ prompt: 12, completion: 34 });
  });

  it('reads a usage object that holds a list (per-modality counts) to its own end, not to the list\'s', () => {
    const usage = { prompt_tokens: 12, completion_tokens: 34, total_tokens: 46, prompt_tokens_details: { modalities: [{ modality: 'TEXT', tokens: 10 }, { modality: 'IMAGE', tokens: 2 }] } };
    const body = Buffer.from(JSON.stringify({ id: 'chatcmpl-1', object: 'chat.completion', choices: [], usage }));
    expect(usageOfBody(body)).toEqual({ prompt: 12, completion: 34 });
  });
});

describe('the completion a recovered stream goes on as (DeliveredText.completion)', () => {
  it("is the first chunk's id and created, whatever id a later chunk carries", () => {
    const d = new DeliveredText();
    deliverData(d, JSON.stringify({ id: 'chatcmpl-first', created: 1, object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content: 'Hel' }, finish_reason: null }] }));
    deliverData(d, JSON.stringify({ id: 'chatcmpl-other', created: 2, object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content: 'lo' }, finish_reason: null }] }));
    expect(d.completion).toEqual({ id: 'chatcmpl-first', created: 1 });
    expect(d.text).toBe('Hello');
  });
});

describe("a continuation whose text reaches the seam in the very delta that opens a tool call", () => {
  const startUpstreams = useScriptedUpstreams();
  const cutAfterHello: Script = { steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hello' })]), 30, { destroy: true }] };
  const call = { index: 0, id: 'call_1', type: 'function', function: { name: 'track_order', arguments: '' } };

  it('is not spliced on (a tool call is not the rest of the text): the client gets the break, the log says no_match', async () => {
    const q: Script = {
      steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hello world', tool_calls: [call] })]), cc([delta({ tool_calls: [{ index: 0, function: { arguments: '{}' } }] })]), cc([delta({}, 'tool_calls')]), DONE],
    };
    const { client, s, seen } = await startUpstreams({ p: () => cutAfterHello, q: () => q }, [{ provider: 'p' }, { provider: 'q' }], { route: { streamRecovery: 'continue' } });
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'Where is my order?' }], stream: true });
    let text = '';
    const read = async () => {
      for await (const c of stream) text += c.choices[0]?.delta?.content ?? '';
    };
    await expect(read()).rejects.toThrow();
    expect(text).toBe('Hello');
    expect(seen.q!).toHaveLength(1);
    expect((await requestLine(s)).recoveryRefused).toBe('no_match');
  });
});
