// Mutation round 34: tests that kill mutations the existing suite let live, in pools/provider-pool.ts (from client
// displacement to the floors), state/redis-store.ts (permits, hold-offs, demand, refresh, messages) and
// pipeline/live-stream.ts (the wait after the finish and the idle timer). Pool code runs on a clock the test moves;
// the Redis parts on a real redis-server; the stream on a scripted upstream.
import { describe, expect, it } from 'vitest';
import { setTimeout as sleep } from 'node:timers/promises';
import type { LiveStream, StreamEnd } from '../src/pipeline/live-stream.ts';
import { handedOverStream, upstream, type Step } from './helpers/live-stream.ts';
import { ProviderPool, type SlotRequest } from '../src/pools/provider-pool.ts';
import { rateOf } from '../src/policy/client-rate.ts';
import { flush } from './helpers/client-pool.ts';
import { cutAndFleet } from './helpers/redis-stores.ts';

describe('the provider pool under a token rate: the waiter its tokens hold back', () => {
  it('holds no one back once its tokens are there and only the retry cap keeps it waiting', async () => {
    const clock = { now: 0 };
    const classes = [
      { name: 'online', minShare: 0, maxQueue: 100 },
      { name: 'batch', minShare: 0, maxQueue: 100 },
    ];
    const p = new ProviderPool({ provider: 'p', capacity: 10, retryCapacity: 1, classes, decrease: 0.9, minLimit: 1, rates: { tokens: rateOf(6_000, 6_000) } }, () => clock.now);
    const req = (cls: number, extra: Partial<SlotRequest>): SlotRequest => ({ cls, target: 'p/m', retry: false, deadlineAtMs: 600_000, minAttemptMs: 0, signal: new AbortController().signal, ...extra });
    const soon = <T>(a: Promise<T>) => Promise.race([a, flush().then(() => 'pending' as const)]);
    expect(await soon(p.acquire(req(0, { tokens: 6_000 })))).toMatchObject({ ok: true }); // the minute's tokens spent
    // A batch retry of 3,000 tokens waits for them (30 s): the token rate holds it, and those behind it, back.
    const held = p.acquire(req(1, { retry: true, tokens: 3_000 }));
    expect(await soon(held)).toBe('pending');
    // An online retry goes first (a higher class) once its token is there, and takes the only retry place.
    clock.now = 1_000;
    expect(await soon(p.acquire(req(0, { retry: true, tokens: 1 })))).toMatchObject({ ok: true });
    // 31 s: the held retry's tokens are there, but the retry cap keeps it waiting; a batch request of 10 tokens goes.
    clock.now = 31_000;
    expect(await soon(p.acquire(req(1, { tokens: 10 })))).toMatchObject({ ok: true });
    expect(await soon(held)).toBe('pending');
    p.close();
  });
});

describe('the provider pool under a token rate: which waiter it holds back', () => {
  it('moves the hold to a waiter of a higher class, so a newcomer of that class waits behind it', async () => {
    const clock = { now: 0 };
    const classes = [
      { name: 'online', minShare: 0, maxQueue: 100 },
      { name: 'batch', minShare: 0, maxQueue: 100 },
    ];
    const p = new ProviderPool({ provider: 'p', capacity: 10, retryCapacity: 10, classes, decrease: 0.9, minLimit: 1, rates: { tokens: rateOf(6_000, 6_000) } }, () => clock.now);
    const req = (cls: number, tokens: number): SlotRequest => ({ cls, target: 'p/m', retry: false, deadlineAtMs: 600_000, minAttemptMs: 0, signal: new AbortController().signal, tokens });
    const soon = <T>(a: Promise<T>) => Promise.race([a, flush().then(() => 'pending' as const)]);
    expect(await soon(p.acquire(req(0, 6_000)))).toMatchObject({ ok: true });
    const batch = p.acquire(req(1, 3_000));
    expect(await soon(batch)).toBe('pending');
    const online = p.acquire(req(0, 3_000));
    expect(await soon(online)).toBe('pending');
    // 1 s: 100 tokens are there, none for online's 3,000. An online newcomer of 10 comes after that waiter, not before.
    clock.now = 1_000;
    expect(await soon(p.acquire(req(0, 10)))).toBe('pending');
    p.close();
  });
});

describe('the Redis store: hold-offs', () => {
  it('takes at once the longer hold-off Redis answers with, not only its own', async () => {
    const f = await cutAndFleet({ prefix: 'mut34-hold' });
    try {
      const t0 = Date.now();
      // The fleet's hold-off, before this instance looked the target up (its message is not for this instance).
      await f.fleet.setHoldOff('p/h', t0 + 20_000, t0);
      await f.cut.setHoldOff('p/h', t0 + 2_000, t0);
      expect(f.cut.getHoldOff('p/h')).toBeGreaterThanOrEqual(t0 + 19_000);
    } finally {
      await f.close();
    }
  }, 30_000);

  it('while Redis is away, says a hold-off started when the one before ended at that very moment', async () => {
    const f = await cutAndFleet({ prefix: 'mut34-started' });
    try {
      await f.away();
      const t0 = Date.now() + 60_000;
      expect(await f.cut.setHoldOff('p/s', t0 + 1_000, t0)).toBe(true);
      // The first ended at t0 + 1 s: none is in force then, as the memory store and the script judge.
      expect(await f.cut.setHoldOff('p/s', t0 + 2_000, t0 + 1_000)).toBe(true);
    } finally {
      await f.close();
    }
  }, 30_000);
});

describe('the Redis store: probe permits across a degraded spell', () => {
  it('gives back a permit taken locally while degraded, though the probe ends after Redis is back', async () => {
    const f = await cutAndFleet({ prefix: 'mut34-permit' });
    try {
      await f.away();
      // Degraded: the local permit (one probe) is this instance's.
      const permit = await f.cut.takePermit('p/m', 1, 60_000, Date.now());
      expect(permit).not.toBeNull();
      await f.back();
      await f.cut.releasePermit('p/m', permit!); // the probe ends once Redis is back
      await f.away();
      // Away again: the local permit was given back, so the next probe may go here.
      expect(await f.cut.takePermit('p/m', 1, 60_000, Date.now())).not.toBeNull();
    } finally {
      await f.close();
    }
  }, 30_000);
});

const chunk = (content: string, finish: string | null = null): string =>
  `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content }, finish_reason: finish }] })}\n\n`;
const DONE = 'data: [DONE]\n\n';

/** A chat stream handed over with its first output, reading `rest`, with its own idleMs and afterFinishMs. */
function stream(rest: Step[], idleMs: number, afterFinishMs?: number): { live: LiveStream; ended: Promise<StreamEnd> } {
  const controller = new AbortController();
  return handedOverStream({ first: chunk('Hel'), iterator: upstream(controller, rest), controller, idleMs, ...(afterFinishMs !== undefined && { afterFinishMs }) });
}

/** Reads the whole stream; after the part that holds the finish, takes nothing for `pauseMs`. */
async function read(live: LiveStream, pauseMs = 0): Promise<string> {
  let text = '';
  for await (const part of live.body()) {
    text += part;
    if (pauseMs > 0 && part.includes('"finish_reason":"stop"')) await sleep(pauseMs);
  }
  return text;
}

describe('the live stream after the finish', () => {
  it('ends an upstream that pings on after its finish at idleMs plus afterFinishMs, not later', async () => {
    const pings: Step[] = Array.from({ length: 60 }, () => [100, ': ping\n\n'] as Step[]).flat();
    const { live, ended } = stream([chunk('lo', 'stop'), ...pings, 60_000], 1_500, 200);
    const started = performance.now();
    const text = await read(live);
    const tookMs = performance.now() - started;
    expect(text.endsWith(DONE)).toBe(true);
    expect((await ended).kind).toBe('done-added');
    // Pings put the wait off for idleMs (1.5 s) at most, then afterFinishMs (0.2 s): about 1.7 s; a loaded machine's lag allowed.
    expect(tookMs).toBeGreaterThanOrEqual(1_400);
    expect(tookMs).toBeLessThan(2_900);
  });

  it('waits for [DONE] at most idleMs when that is shorter than the default second', async () => {
    const { live, ended } = stream([chunk('lo', 'stop'), 60_000], 150);
    const started = performance.now();
    const text = await read(live);
    expect(text.endsWith(DONE)).toBe(true);
    expect((await ended).kind).toBe('done-added');
    expect(performance.now() - started).toBeLessThan(800);
  });

  it("counts a client's stall afresh at each read, not summed over its pauses", async () => {
    // Stalled after 10 idle periods (2 s) of taking nothing; this client pauses 1.2 s twice, reading in between.
    const { live, ended } = stream([chunk(' a'), chunk(' b'), chunk('c', 'stop'), DONE], 200, 100);
    let text = '';
    let parts = 0;
    for await (const part of live.body()) {
      text += part;
      if (++parts <= 2) await sleep(1_200);
    }
    expect(text.endsWith(DONE)).toBe(true);
    expect((await ended).kind).toBe('complete');
  }, 20_000);

  it("counts a client that takes nothing after the finish in real time, not in idle periods per short wait", async () => {
    // The wait for [DONE] is 100 ms; the client reads nothing for 6 s, less than its 10 idle periods (10 s).
    const { live, ended } = stream([chunk('lo', 'stop'), DONE], 1_000, 100);
    const text = await read(live, 6_000);
    expect(text.endsWith(DONE)).toBe(true);
    expect((await ended).kind).toBe('complete');
  }, 20_000);
});
