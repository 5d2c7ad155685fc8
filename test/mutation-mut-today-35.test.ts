// Mutation round 35: tests that kill mutations the existing suite let live, in pools/provider-pool.ts (from the floors
// to the end of the file: the floors, the grant, shedWaiting, goesFirst, tokensOf, goesBefore, retryTurnMs),
// state/redis-store.ts (messages, the first read, ready, the breaker CAS, client tokens, demand, forget, close) and its
// subscriber, and pipeline/live-stream.ts (the wait for the usage chunk and [DONE] after the finish, #finishedAt,
// #graceArmed, the end #addedEnd writes, the translator's usage). 84 hand mutations: 66 killed by existing files,
// 3 equivalent, 15 killed now, 0 open (pool 36: 29/0/7; live stream 28: 24/2/2; Redis store 20: 13/1/6). The degraded
// transitions of redis-health.ts and the kept keys of redis-kept-keys.ts were not reached this round.
// Pool code runs on a clock the test moves; the Redis parts on a real redis-server; the stream on a scripted upstream.
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import type { LiveStream, StreamEnd } from '../src/pipeline/live-stream.ts';
import { rateOf } from '../src/policy/client-rate.ts';
import { ProviderPool, retryTurnMs, type Acquired, type PoolObserver, type SlotRequest } from '../src/pools/provider-pool.ts';
import type { StreamTranslator } from '../src/providers/families.ts';
import { RedisKeys } from '../src/state/redis-keys.ts';
import type { BreakerRecord } from '../src/state/store.ts';
import { SseParser } from '../src/streaming/sse-parser.ts';
import { clientReq, flush, slot } from './helpers/client-pool.ts';
import { handedOverStream, readAll, upstream, type Step } from './helpers/live-stream.ts';
import { useRedisServerWithAdmin } from './helpers/redis-server.ts';
import { cutAndFleet, loggedStores, README_ACL } from './helpers/redis-stores.ts';

type Rates = ConstructorParameters<typeof ProviderPool>[0]['rates'];

/** A pool on a clock the test moves; `classes` by name and minShare, each with room to queue. */
function pool(capacity: number, shares: Record<string, number>, rates?: Rates, observer: PoolObserver = {}) {
  const clock = { now: 0 };
  const classes = Object.entries(shares).map(([name, minShare]) => ({ name, minShare, maxQueue: 100 }));
  const p = new ProviderPool({ provider: 'p', capacity, retryCapacity: capacity, classes, decrease: 0.9, minLimit: 1, rates }, () => clock.now, observer);
  return { p, clock };
}
const req = (cls: number, extra: Partial<SlotRequest> = {}): SlotRequest => clientReq(undefined, { cls, ...extra });
/** Which of `waits` have been answered (granted or not) once pending work has run. */
async function answered(waits: Promise<Acquired>[]): Promise<boolean[]> {
  const done = waits.map(() => false);
  waits.forEach((w, i) => void w.then(() => (done[i] = true)));
  await flush();
  return done;
}

describe('the provider pool: the floors', () => {
  it('serves the lowest class under its floor first when several are under theirs', async () => {
    const { p } = pool(4, { critical: 0, online: 0.5, batch: 0.25 });
    const held = await Promise.all([0, 1, 2, 3].map(() => slot(p, req(0))));
    // Both lower classes are under their floors (online 2, batch 1); the online waiter came first.
    const online = p.acquire(req(1));
    const batch = p.acquire(req(2));
    expect(await answered([online, batch])).toEqual([false, false]);
    held[0]!.release();
    // The freed slot goes to batch, the class furthest down (the one every class above it would starve), then online.
    expect(await answered([online, batch])).toEqual([false, true]);
    held[1]!.release();
    expect(await answered([online, batch])).toEqual([true, true]);
    p.close();
  });

  it('serves the highest class by arrival across targets, its own floor being no reason to pass anyone', async () => {
    // A request rate (generous) makes a class's floor at a target a share of what is in flight there plus one.
    const { p } = pool(4, { online: 0.5, batch: 0 }, { requests: rateOf(60_000, 60_000) });
    const batchZ = await Promise.all([slot(p, req(1, { target: 'p/z' })), slot(p, req(1, { target: 'p/z' }))]);
    const batchY = await slot(p, req(1, { target: 'p/y' }));
    const onlineX = await slot(p, req(0, { target: 'p/x' }));
    // Full. Online waits for x (first) and for y; online holds 1 of its floor of 2, and its floor at x is taken.
    const forX = p.acquire(req(0, { target: 'p/x' }));
    const forY = p.acquire(req(0, { target: 'p/y' }));
    expect(await answered([forX, forY])).toEqual([false, false]);
    batchZ[0]!.release();
    expect(await answered([forX, forY])).toEqual([true, false]);
    for (const s of [batchZ[1]!, batchY, onlineX]) s.release();
    expect(await answered([forX, forY])).toEqual([true, true]);
    p.close();
  });
});

describe('the provider pool: the grant', () => {
  it('sheds at the grant a waiter whose time ran out while it waited, and gives the slot to the next', async () => {
    const sheds: string[] = [];
    const { p, clock } = pool(1, { online: 0, batch: 0 }, undefined, { onShed: (cls, reason) => sheds.push(`${cls}:${reason}`) });
    const held = await slot(p, req(0));
    const late = p.acquire(req(0, { deadlineAtMs: 10_000, minAttemptMs: 1_000 }));
    const next = p.acquire(req(0));
    expect(await answered([late, next])).toEqual([false, false]);
    // 9.5 s on the pool's clock (its own timer for the late one has not fired yet): half a second is less than an attempt.
    clock.now = 9_500;
    held.release();
    expect(await late).toMatchObject({ ok: false, reason: 'deadline' });
    expect(await next).toMatchObject({ ok: true });
    expect(sheds).toEqual(['online:deadline']);
    p.close();
  });
});

describe('the provider pool: a request shed behind parked ones (shedWaiting)', () => {
  it("tells it the wait for its own tokens under the target's token rate", async () => {
    const { p } = pool(10, { online: 0, batch: 0 }, { tokens: rateOf(6_000, 6_000) });
    (await slot(p, req(0, { tokens: 6_000 }))).release(); // the minute's tokens spent
    // 3,000 tokens come back in 30 s; one token in 10 ms.
    expect(p.shedWaiting(0, 'p/m', undefined, 3_000)).toBeGreaterThanOrEqual(29_000);
    expect(p.shedWaiting(0, 'p/m', undefined, 1)).toBeLessThan(1_000);
    p.close();
  });
});

describe('the provider pool: a request that names no tokens', () => {
  it('counts for one token under a token rate, so none of the minute left holds it back', async () => {
    const { p } = pool(10, { online: 0, batch: 0 }, { tokens: rateOf(6_000, 6_000) });
    await slot(p, req(0, { tokens: 6_000 }));
    // A token comes back every 10 ms: the clock stands still, so an estimate of 0 waits as one of 1 does.
    const zero = p.acquire(req(0, { tokens: 0 }));
    expect(await answered([zero])).toEqual([false]);
    p.close();
  });
});

describe('the provider pool: a request shed behind parked ones (shedWaiting), counted', () => {
  it('counts it under the reason its wait ran into, the route\'s park.maxWaitMs as such', () => {
    const sheds: string[] = [];
    const { p } = pool(1, { online: 0, batch: 0 }, undefined, { onShed: (cls, reason) => sheds.push(`${cls}:${reason}`) });
    p.shedWaiting(1, 'p/m', undefined, 1, 'max_wait');
    p.shedWaiting(0, 'p/m');
    expect(sheds).toEqual(['batch:max_wait', 'online:deadline']);
    p.close();
  });
});

describe('the turn of a retry under the retry cap (retryTurnMs)', () => {
  it('with a whole round of the cap ahead of it, waits a hold after the place that frees first, not the last', () => {
    // Two places, free in 0.5 s and 20 s; two retries ahead take them, and the first of them to end frees the third's.
    expect(retryTurnMs([-19_500, 0], 0, 20_000, 2, 2)).toBe(20_500);
    expect(retryTurnMs([-19_500, 0], 0, 20_000, 2, 3)).toBe(40_000);
  });
});

const chunk = (content: string, finish: string | null = null): string =>
  `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content }, finish_reason: finish }] })}\n\n`;
const USAGE = `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', choices: [], usage: { prompt_tokens: 3, completion_tokens: 5, total_tokens: 8 } })}\n\n`;
const DONE = 'data: [DONE]\n\n';

/**
 * A translator as a translated stream has one: the events pass as they are, its usage is known from the upstream's
 * first events (as Anthropic's message_start tells it), and its end is the usage chunk the client asked for, then [DONE].
 */
function translator(): StreamTranslator {
  const event = (text: string) => new SseParser().push(Buffer.from(text))[0]!;
  return { push: (ev) => [ev], end: () => [event(USAGE), event(DONE)], usage: () => ({ prompt: 3, completion: 5 }) };
}

/** A chat stream handed over with its first output, reading `rest`; `usage`: the client asked for include_usage. */
function stream(rest: Step[], o: { idleMs: number; afterFinishMs?: number; usage?: boolean; translate?: StreamTranslator }): { live: LiveStream; ended: Promise<StreamEnd> } {
  const controller = new AbortController();
  return handedOverStream({
    first: chunk('Hel'), iterator: upstream(controller, rest), controller, idleMs: o.idleMs, shape: { choices: 1, usage: o.usage ?? false },
    ...(o.afterFinishMs !== undefined && { afterFinishMs: o.afterFinishMs }), ...(o.translate && { translate: o.translate }),
  });
}

describe('the live stream after the finish: the usage chunk', () => {
  it("ends a stream whose usage chunk came, but not [DONE], after afterFinishMs, not idleMs", async () => {
    const { live, ended } = stream([chunk('lo', 'stop'), USAGE, 60_000], { idleMs: 3_000, afterFinishMs: 100, usage: true });
    const started = performance.now();
    const text = await readAll(live);
    expect(text).toContain('"prompt_tokens":3');
    expect(text.endsWith(DONE)).toBe(true);
    expect((await ended).kind).toBe('done-added');
    expect(performance.now() - started).toBeLessThan(2_000);
  });

  it("of a translated stream is the translator's: known before the finish, it is not waited for", async () => {
    const { live, ended } = stream([chunk('lo', 'stop'), 60_000], { idleMs: 3_000, afterFinishMs: 100, usage: true, translate: translator() });
    const started = performance.now();
    const text = await readAll(live);
    // The end the translator writes: the usage chunk the client asked for, then [DONE].
    expect(text.endsWith(USAGE + DONE)).toBe(true);
    const end = await ended;
    expect(end.kind).toBe('done-added');
    expect(end.usage).toEqual({ prompt: 3, completion: 5 });
    expect(performance.now() - started).toBeLessThan(2_000);
  });

  it("of a translated stream whose upstream broke after the finish is the translator's end, then [DONE]", async () => {
    const { live, ended } = stream([chunk('lo', 'stop'), new Error('socket hang up')], { idleMs: 3_000, usage: true, translate: translator() });
    const text = await readAll(live);
    expect(text.endsWith(USAGE + DONE)).toBe(true);
    expect((await ended).kind).toBe('done-added');
  });
});

describe('the Redis store: the first read of a target', () => {
  it('has nothing to wait for once the read is in, nor while Redis is away', async () => {
    const f = await cutAndFleet({ prefix: 'mut35-first' });
    try {
      const reading = f.cut.firstRead('p/first');
      expect(reading).toBeInstanceOf(Promise);
      await reading;
      expect(f.cut.firstRead('p/first')).toBeUndefined();
      await f.away();
      // Away, a target seen for the first time is read once Redis is back: nothing to wait for now.
      expect(f.cut.firstRead('p/while-away')).toBeUndefined();
    } finally {
      await f.close();
    }
  }, 30_000);
});

describe('the Redis store: ready', () => {
  const server = useRedisServerWithAdmin();
  const store = loggedStores('mut35-ready');

  it('is not while Redis refuses it the events channel (it would not hear the fleet), and is once the ACL gives it back', async () => {
    await server.admin().call('ACL', 'SETUSER', 'nochan', 'on', '>mut35-pass', '~*', 'resetchannels', '&elsewhere:*', ...README_ACL);
    try {
      const { store: s } = store(`redis://nochan:mut35-pass@127.0.0.1:${server.redis().port}`);
      expect(await s.ready(1_500)).toBe(false);
      await server.admin().call('ACL', 'SETUSER', 'nochan', 'resetchannels', '&*');
      expect(await s.ready(5_000)).toBe(true);
    } finally {
      await server.admin().call('ACL', 'DELUSER', 'nochan');
    }
  }, 30_000);
});

describe('the Redis store: a breaker write Redis refuses', () => {
  const open = (generation: number): BreakerRecord => ({ state: 'open', sinceMs: Date.now(), openUntilMs: Date.now() + 30_000, probeSuccesses: 0, generation });

  it("takes at once the fleet's record Redis holds instead, for a target it had not looked at", async () => {
    const f = await cutAndFleet({ prefix: 'mut35-cas' });
    try {
      // The fleet opened it before this instance looked the target up (its message is not for this instance).
      expect(await f.fleet.casBreaker('p/cas', 0, open(1))).toBe(true);
      await sleep(300); // its message has gone by
      expect(await f.cut.casBreaker('p/cas', 0, open(1))).toBe(false);
      expect(f.cut.getBreaker('p/cas')).toMatchObject({ state: 'open', generation: 1 });
    } finally {
      await f.close();
    }
  }, 30_000);

  it('takes the record Redis holds as the truth, though older than its own (a Redis restored from an older snapshot)', async () => {
    const f = await cutAndFleet({ prefix: 'mut35-older' });
    try {
      expect(await f.cut.casBreaker('p/old', 0, open(1))).toBe(true);
      const key = new RedisKeys(f.keyPrefix).breaker('p/old');
      const snapshot = await f.admin.hgetall(key);
      expect(await f.cut.casBreaker('p/old', 1, { ...open(2), state: 'half-open' })).toBe(true);
      await f.admin.hset(key, snapshot); // generation 1 again, with no message
      expect(await f.cut.casBreaker('p/old', 2, { ...open(3), state: 'closed' })).toBe(false);
      expect(f.cut.getBreaker('p/old')).toMatchObject({ state: 'open', generation: 1 });
    } finally {
      await f.close();
    }
  }, 30_000);
});

describe("the Redis store: a client's tokens reserved on Redis", () => {
  it('are owed locally too, so a client that spent its minute is still held to it once Redis is away', async () => {
    const f = await cutAndFleet({ prefix: 'mut35-tokens' });
    try {
      const rates = { tokens: rateOf(600, 600) };
      expect(await f.cut.reserveTokens('c1', rates, 600, Date.now())).toBeUndefined();
      await f.away();
      expect(await f.cut.reserveTokens('c1', rates, 600, Date.now())).toMatchObject({ by: 'tokens' });
    } finally {
      await f.close();
    }
  }, 30_000);

  it('and those it answered with (spendTokens) too', async () => {
    const f = await cutAndFleet({ prefix: 'mut35-spent' });
    try {
      const rates = { tokens: rateOf(600, 600) };
      f.cut.spendTokens('c2', rates.tokens, 600, Date.now());
      await f.away();
      expect(await f.cut.reserveTokens('c2', rates, 600, Date.now())).toMatchObject({ by: 'tokens' });
    } finally {
      await f.close();
    }
  }, 30_000);
});

describe('the live stream: the usage told before the first output', () => {
  it("bills an Anthropic stream's input tokens, told in its message_start before the hand-over", async () => {
    const sse = (event: string, data: object) => `event: ${event}\ndata: ${JSON.stringify({ type: event, ...data })}\n\n`;
    const controller = new AbortController();
    const { live, ended } = handedOverStream({
      api: 'messages',
      head: sse('message_start', { message: { id: 'msg_1', role: 'assistant', content: [], usage: { input_tokens: 7, output_tokens: 1 } } }),
      first: sse('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Hello' } }),
      iterator: upstream(controller, [sse('message_delta', { delta: { stop_reason: 'end_turn' }, usage: { output_tokens: 5 } }), sse('message_stop', {})]),
      controller,
    });
    await readAll(live);
    const end = await ended;
    expect(end.kind).toBe('complete');
    expect(end.usage).toEqual({ prompt: 7, completion: 5 });
  });
});
