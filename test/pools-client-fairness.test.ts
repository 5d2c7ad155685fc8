// A class's slots shared between its clients (auth.keys), with a fake clock: the client holding the fewest goes first,
// a full queue gives a flooding client's newest place to a newcomer of another, and a client's wait estimate counts its
// turns, not a flooding tenant's whole queue. Unnamed requests are one client, served by arrival as before. End to end:
// two tenants' `openai` SDK clients through a gateway with client keys, in front of the bundled mock.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import type { Acquired, ProviderPool, Slot, SlotRequest } from '../src/pools/provider-pool.ts';
import { clientPool, clientReq, flush, slot } from './helpers/client-pool.ts';
import { defaultConfig, RETRY_LOOP_ONLY, scrapeMetrics, useStacks, type Stack } from './helpers/stack.ts';

function pool({ capacity = 2, maxQueue = 100, retryCapacity = capacity }: { capacity?: number; maxQueue?: number; retryCapacity?: number } = {}) {
  const clock = { now: 0 };
  const sheds: string[] = [];
  const p = clientPool({ capacity, maxQueue, retryCapacity, now: () => clock.now, observer: { onShed: (cls, reason) => sheds.push(`${cls} ${reason}`) } });
  return { p, clock, sheds };
}

const req = clientReq;

/** Queues requests named `label` and records, in `order`, the order in which they are granted; their slots in `held`. */
function queue(p: ProviderPool, order: string[], held: Slot[], label: string, r: SlotRequest): Promise<Acquired> {
  const acquired = p.acquire(r);
  void acquired.then((a) => {
    if (!a.ok) return;
    order.push(label);
    held.push(a.slot);
  });
  return acquired;
}

/** Frees the earliest held slot, one at a time, `n` times. */
async function freeSlots(held: Slot[], n: number): Promise<void> {
  for (let i = 0; i < n; i++) {
    held.shift()!.release();
    await flush();
  }
}

describe('the fair share between clients of a class', () => {
  it('gives a freed slot to the client holding fewer, not to the flooding one that queued first', async () => {
    const { p } = pool();
    const held = [await slot(p, req('flood')), await slot(p, req('flood'))];
    const order: string[] = [];
    for (let i = 0; i < 6; i++) void queue(p, order, held, `flood${i}`, req('flood'));
    void queue(p, order, held, 'quiet0', req('quiet'));
    void queue(p, order, held, 'quiet1', req('quiet'));
    await flush();
    await freeSlots(held, 4);
    // Flood holds both slots, quiet none: quiet's first goes, then the two clients take turns, whoever holds fewer.
    expect(order).toEqual(['quiet0', 'flood0', 'quiet1', 'flood1']);
  });

  it('alternates between clients that hold as many, each by its own arrival order', async () => {
    const { p } = pool({ capacity: 1 });
    const held = [await slot(p, req(undefined))];
    const order: string[] = [];
    for (let i = 0; i < 3; i++) void queue(p, order, held, `a${i}`, req('a'));
    for (let i = 0; i < 3; i++) void queue(p, order, held, `b${i}`, req('b'));
    await flush();
    // One slot, so both hold none whenever it is free: the client served longer ago goes.
    await freeSlots(held, 6);
    expect(order).toEqual(['a0', 'b0', 'a1', 'b1', 'a2', 'b2']);
  });

  it('goes by slots held before turns: a client holding three waits for one holding one, though served earlier', async () => {
    const { p } = pool({ capacity: 4 });
    const held = [await slot(p, req('long')), await slot(p, req('long')), await slot(p, req('long')), await slot(p, req('short'))];
    const order: string[] = [];
    void queue(p, order, held, 'long0', req('long'));
    void queue(p, order, held, 'short0', req('short'));
    await flush();
    await freeSlots(held, 1);
    // long now holds two, short one: short's goes, though long was served longer ago and queued first.
    expect(order).toEqual(['short0']);
  });

  it('keeps the order of arrival for requests of no client, as before (one client)', async () => {
    const { p } = pool({ capacity: 1 });
    const held = [await slot(p, req(undefined))];
    const order: string[] = [];
    for (let i = 0; i < 4; i++) void queue(p, order, held, `n${i}`, req(undefined, i % 2 ? { target: 'p/other' } : {}));
    await flush();
    await freeSlots(held, 4);
    expect(order).toEqual(['n0', 'n1', 'n2', 'n3']);
  });

  it('does not put a lower class ahead of a higher one: the share is within a class', async () => {
    const { p } = pool({ capacity: 1 });
    const held = [await slot(p, req('online-heavy'))];
    const order: string[] = [];
    void queue(p, order, held, 'batch-quiet', req('quiet', { cls: 1 }));
    void queue(p, order, held, 'online-heavy', req('online-heavy'));
    await flush();
    await freeSlots(held, 2);
    expect(order).toEqual(['online-heavy', 'batch-quiet']);
  });

  it('shares the retry slots by client too', async () => {
    const { p } = pool({ capacity: 4, retryCapacity: 1 });
    const held = [await slot(p, req('flood', { retry: true }))];
    const order: string[] = [];
    for (let i = 0; i < 3; i++) void queue(p, order, held, `flood${i}`, req('flood', { retry: true }));
    void queue(p, order, held, 'quiet0', req('quiet', { retry: true }));
    await flush();
    expect(order).toEqual([]);
    await freeSlots(held, 2);
    expect(order).toEqual(['quiet0', 'flood0']);
  });
});

describe('a full class queue', () => {
  it('gives the newest place of the client waiting the most to a newcomer of another client', async () => {
    const { p, sheds } = pool({ capacity: 1, maxQueue: 4 });
    const held = [await slot(p, req('flood'))];
    const order: string[] = [];
    const flood = Array.from({ length: 4 }, (_, i) => queue(p, order, held, `flood${i}`, req('flood')));
    const quiet = queue(p, order, held, 'quiet0', req('quiet'));
    // The flooding client's newest is shed as a newcomer to a full queue would have been: queue_full, with a wait.
    const displaced = await flood[3]!;
    expect(displaced).toMatchObject({ ok: false, reason: 'queue_full' });
    expect(displaced.ok === false && displaced.reason === 'queue_full' && displaced.retryAfterMs).toBeGreaterThan(0);
    expect(sheds).toEqual(['online queue_full']);
    // Its own newcomer now finds the queue full and no one to displace (3 of flood against 1 of quiet is one too few).
    expect(await p.acquire(req('flood'))).toMatchObject({ ok: false, reason: 'queue_full' });
    await freeSlots(held, 4);
    expect(order).toEqual(['quiet0', 'flood0', 'flood1', 'flood2']);
    expect((await quiet).ok).toBe(true);
  });

  it('sheds the newcomer when no client waits for two more than its own', async () => {
    const { p } = pool({ capacity: 1, maxQueue: 2 });
    const held = [await slot(p, req('a'))];
    const order: string[] = [];
    void queue(p, order, held, 'a0', req('a'));
    void queue(p, order, held, 'b0', req('b'));
    expect(await p.acquire(req('c'))).toMatchObject({ ok: false, reason: 'queue_full' });
    expect(await p.acquire(req('a'))).toMatchObject({ ok: false, reason: 'queue_full' });
    await freeSlots(held, 2);
    expect(order).toEqual(['b0', 'a0']);
  });

  it('displaces no one for a newcomer the deadline sheds anyway', async () => {
    const { p } = pool({ capacity: 1, maxQueue: 2 });
    const held = [await slot(p, req('flood'))];
    const order: string[] = [];
    const flood = [queue(p, order, held, 'flood0', req('flood')), queue(p, order, held, 'flood1', req('flood'))];
    // A deadline nearer than a round trip (the estimate assumes 1 s before any answer is timed).
    expect(await p.acquire(req('quiet', { deadlineAtMs: 100 }))).toMatchObject({ ok: false, reason: 'deadline' });
    await freeSlots(held, 2);
    expect(order).toEqual(['flood0', 'flood1']);
    expect((await flood[1]!).ok).toBe(true);
  });

  it('keeps the place of a request the parking lot released', async () => {
    const { p } = pool({ capacity: 1, maxQueue: 2 });
    const held = [await slot(p, req('flood'))];
    const order: string[] = [];
    void queue(p, order, held, 'flood0', req('flood'));
    void queue(p, order, held, 'flood1', req('flood', { released: true }));
    // flood0 is flood's newest not released: it goes, flood1 stays.
    void queue(p, order, held, 'quiet0', req('quiet'));
    await flush();
    await freeSlots(held, 3);
    expect(order).toEqual(['quiet0', 'flood1']);
  });
});

describe("a client's wait estimate", () => {
  it("counts its own turns among the class's clients, not a flooding tenant's whole queue", async () => {
    const { p } = pool({ capacity: 1 });
    await slot(p, req('flood'));
    for (let i = 0; i < 50; i++) void p.acquire(req('flood'));
    await flush();
    // One slot and no answer timed yet: a round trip of 1 s per request ahead. Ahead of a quiet client: one of flood's
    // (then its own turn); of flood's next: all 50.
    expect(p.expectedWaitMs(0, 'p/m', 'quiet')).toBe(2_000);
    expect(p.expectedWaitMs(0, 'p/m', 'flood')).toBe(51_000);
    // A quiet client with a deadline of 5 round trips waits, where behind 50 it would have been shed at once.
    void p.acquire(req('quiet', { deadlineAtMs: 5_000 }));
    await flush();
    expect(p.snapshot().queued[0]).toBe(51);
    expect(await p.acquire(req('flood', { deadlineAtMs: 5_000 }))).toMatchObject({ ok: false, reason: 'deadline' });
  });

  it('is the whole queue for requests of no client, as before', async () => {
    const { p } = pool({ capacity: 1 });
    await slot(p, req(undefined));
    for (let i = 0; i < 9; i++) void p.acquire(req(undefined));
    await flush();
    expect(p.expectedWaitMs(0, 'p/m')).toBe(10 * 1_000);
  });

  it('forgets a client once it holds and waits for nothing', async () => {
    const { p } = pool({ capacity: 1 });
    const first = await slot(p, req('gone'));
    const waiting = new AbortController();
    void p.acquire(req('gone', { signal: waiting.signal }));
    await flush();
    waiting.abort();
    first.release();
    await flush();
    // Nothing of 'gone' left: a newcomer of another client waits behind no one.
    expect(p.expectedWaitMs(0, 'p/m', 'other')).toBe(1_000);
  });
});

describe('tenants sharing a class, end to end', () => {
  const start = useStacks();
  const messages = [{ role: 'user' as const, content: 'hi' }];

  /** A gateway with two client keys, in front of a mock that takes `latencyMs` per answer, `maxConcurrent` at once. */
  function tenants(maxConcurrent: number, latencyMs: number, online: { maxQueue?: number } = {}): Promise<Stack> {
    return start({
      faults: { latencyMs },
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl, { ...RETRY_LOOP_ONLY, provider: { breaker: false, pools: { maxConcurrent, classes: { online: { minShare: 0.5, ...online }, batch: {} } } } });
        return { ...base, auth: { keys: { flood: 'key-flood', quiet: 'key-quiet' } } };
      },
    });
  }
  const sdk = (s: Stack, apiKey: string) => new OpenAI({ baseURL: s.baseURL, apiKey, maxRetries: 0 });

  it("serves a quiet tenant's requests beside a flooding tenant's queue, not after it", async () => {
    const s = await tenants(4, 300);
    const flood = sdk(s, 'key-flood');
    const quiet = sdk(s, 'key-quiet');
    const t0 = Date.now();
    const doneAt = (p: Promise<unknown>) => p.then(() => Date.now() - t0);
    const floodCalls = Array.from({ length: 24 }, () => doneAt(flood.chat.completions.create({ model: 'gpt-4o', messages })));
    // The quiet tenant comes once the flood holds every slot and queues 20 more.
    await new Promise((r) => setTimeout(r, 100));
    const quietCalls = Array.from({ length: 4 }, () => doneAt(quiet.chat.completions.create({ model: 'gpt-4o', messages })));
    const [floodDone, quietDone] = [await Promise.all(floodCalls), await Promise.all(quietCalls)];
    const floodLast = Math.max(...floodDone);
    const quietLast = Math.max(...quietDone);
    // 28 answers of 300 ms, 4 at a time: about 2.1 s for the last. The quiet tenant's four are done within about three
    // round trips of their arrival (~1 s: two of them go at the first slots freed, two at the next); behind the flood's
    // queue they would have come last, after ~2.1 s.
    expect(quietLast).toBeLessThan(floodLast * 0.7);
    // Nothing was shed or refused: the flood's requests all waited their turn.
    expect(s.mock.requests().filter((r) => r.status === 200)).toHaveLength(28);
  });

  it('shows which client holds the slots and who waits, per class', async () => {
    const s = await tenants(2, 400);
    const flood = sdk(s, 'key-flood');
    const calls = Array.from({ length: 8 }, () => flood.chat.completions.create({ model: 'gpt-4o', messages }));
    await new Promise((r) => setTimeout(r, 200));
    const byClient = async (name: string) =>
      Object.fromEntries((await scrapeMetrics(s.url)).filter((m) => m.name === name && m.labels.priority === 'online').map((m) => [m.labels.client, m.value]));
    expect(await byClient('stormgate_pool_client_in_use')).toEqual({ flood: 2, quiet: 0 });
    expect(await byClient('stormgate_pool_client_queue_depth')).toEqual({ flood: 6, quiet: 0 });
    await Promise.all(calls);
    // Holding and waiting for nothing, back at 0 (not a stale 2).
    expect(await byClient('stormgate_pool_client_in_use')).toEqual({ flood: 0, quiet: 0 });
    // The log lines: the two first calls went at once, the six queued show their wait for a slot (in 400 ms steps).
    const lines = s.logs.map((l) => JSON.parse(l) as { client?: string; attempts?: Array<{ slotWaitMs?: number }> }).filter((l) => l.client === 'flood' && l.attempts);
    const waits = lines.map((l) => l.attempts![0]!.slotWaitMs ?? 0).sort((a, b) => a - b);
    expect(waits).toHaveLength(8);
    expect(waits.slice(0, 2)).toEqual([0, 0]);
    expect(waits[2]).toBeGreaterThan(250);
    expect(waits[7]).toBeGreaterThan(1_000);
  });

  it("gives a quiet tenant the place of the flooding tenant's newest when the class queue is full", async () => {
    const s = await tenants(2, 400, { maxQueue: 4 });
    const flood = sdk(s, 'key-flood');
    const quiet = sdk(s, 'key-quiet');
    const outcome = (p: Promise<unknown>) => p.then(() => 'ok', (e: unknown) => (e instanceof OpenAI.APIError ? `${e.status} ${e.code}` : String(e)));
    const floodCalls = Array.from({ length: 6 }, () => outcome(flood.chat.completions.create({ model: 'gpt-4o', messages })));
    // Two in flight, four queued: the queue is full.
    await new Promise((r) => setTimeout(r, 150));
    const shed = await flood.chat.completions.create({ model: 'gpt-4o', messages }).catch((e: unknown) => e);
    expect(shed).toBeInstanceOf(OpenAI.APIError);
    expect((shed as InstanceType<typeof OpenAI.APIError>).code).toBe('load_shed');
    expect(await outcome(quiet.chat.completions.create({ model: 'gpt-4o', messages }))).toBe('ok');
    const results = await Promise.all(floodCalls);
    // One of the flood's six gave its place (told to come back, as any shed request), five were answered.
    expect(results.filter((r) => r === 'ok')).toHaveLength(5);
    expect(results.filter((r) => r !== 'ok')).toEqual(['503 load_shed']);
  });
});
