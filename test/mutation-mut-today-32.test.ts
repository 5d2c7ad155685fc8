// Mutation round 32: tests that kill mutations the existing suite let live, in pipeline/target-state.ts, early-start.ts,
// idempotent-request.ts and policy/idempotency.ts, pools/ (fleet share, waiting bodies, Pools), state/redis-view.ts
// and state/redis-keys.ts. Times and draws are injected where the module is pure.
import { Readable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { getHeapStatistics } from 'node:v8';
import { describe, expect, it } from 'vitest';
import { BreakerSchema, ConfigSchema } from '../src/config/schema.ts';
import { GatewayError } from '../src/errors.ts';
import { EarlyStart } from '../src/pipeline/early-start.ts';
import type { PipelineAnswer, RequestSummary } from '../src/pipeline/handle-request.ts';
import { claimKey, keyedRequest } from '../src/pipeline/idempotent-request.ts';
import type { LiveStream } from '../src/pipeline/live-stream.ts';
import { targetStateOf } from '../src/pipeline/target-state.ts';
import { settingsForModel } from '../src/policy/breaker.ts';
import { idempotencyKeyOf, nextLookMs, repeatVerdict } from '../src/policy/idempotency.ts';
import { classesBacked, fleetShare, rateShare, shareFleetCapacity } from '../src/pools/fleet-share.ts';
import { Pools } from '../src/pools/pools.ts';
import type { PoolClass, ProviderPool } from '../src/pools/provider-pool.ts';
import { defaultWaitingBodyBytes, WaitingBodies } from '../src/pools/waiting-bodies.ts';
import type { CompiledRoute } from '../src/routing/router.ts';
import { BreakerBoard } from '../src/state/breaker-board.ts';
import { flexTierKey, HoldOffs } from '../src/state/hold-offs.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import { decodeBreaker, decodeChange, encodeBreaker, encodeChange, RedisKeys } from '../src/state/redis-keys.ts';
import { FleetView, withTimes } from '../src/state/redis-view.ts';
import type { BreakerRecord, StateChange, StateStore } from '../src/state/store.ts';
import { configServedBy } from './helpers/stack.ts';

const T = 1_700_000_000_000;

describe('targetStateOf: where a target stands for the parking lot', () => {
  const settings = settingsForModel(BreakerSchema.parse({ halfOpenProbes: 3, openS: 30, probeWhileParkedMs: 2_000 }), undefined);
  const setup = async (limit: number) => {
    const now = () => T;
    const store = new MemoryStore();
    const holdOffs = new HoldOffs(store, now, () => 0);
    const board = new BreakerBoard({ store, now, random: () => 0 });
    const stateOf = targetStateOf({ holdOffs, board, breakerSettings: () => settings, limitOf: () => limit, now });
    return { store, stateOf };
  };

  it('gives parked requests the whole slots of a fractional adaptive limit, rounded down', async () => {
    const { stateOf } = await setup(2.7);
    expect(stateOf('p/m')).toEqual({ mode: 'available', slots: 2 });
  });

  it("lets a half-open breaker's probes go, as many as halfOpenProbes", async () => {
    const { store, stateOf } = await setup(8);
    await store.casBreaker('p/m', 0, { state: 'half-open', sinceMs: T - 1_000, openUntilMs: T - 1_000, probeSuccesses: 0, generation: 2 });
    expect(stateOf('p/m')).toEqual({ mode: 'probing', slots: 3 });
  });

  it("blocks an open breaker's parked requests until the parked probe's time, not now", async () => {
    const { store, stateOf } = await setup(8);
    await store.casBreaker('p/m', 0, { state: 'open', sinceMs: T - 500, openUntilMs: T + 29_500, probeSuccesses: 0, generation: 1 });
    expect(stateOf('p/m')).toEqual({ mode: 'blocked', availableAtMs: T + 1_500 });
  });

  it("gives a flex tier's parked requests its target's adaptive limit: the tier key has no limit of its own", () => {
    const now = () => T;
    const store = new MemoryStore();
    const stateOf = targetStateOf({
      holdOffs: new HoldOffs(store, now, () => 0),
      board: new BreakerBoard({ store, now, random: () => 0 }),
      breakerSettings: () => undefined,
      limitOf: (t) => (t === 'groq/llama' ? 5 : 1),
      now,
    });
    expect(stateOf(flexTierKey('groq/llama'))).toEqual({ mode: 'available', slots: 5 });
  });
});

describe('EarlyStart', () => {
  it("a withdrawn offer that was already replaced leaves the newer attempt's offer in place", () => {
    const early = new EarlyStart();
    const started: string[] = [];
    const withdrawFirst = early.offer(() => started.push('first'));
    early.offer(() => started.push('second'));
    withdrawFirst();
    expect(early.take()).toBe(true);
    expect(started).toEqual(['second']);
    expect(early.take()).toBe(false);
  });
});

describe('fleetShare', () => {
  const CLASSES: PoolClass[] = [
    { name: 'online', minShare: 0, maxQueue: 100 },
    { name: 'batch', minShare: 0.2, maxQueue: 100 },
  ];

  it("counts each class's demand with headroom (an eighth and one), and tops a lower class's floor up only to its demand", () => {
    // 20 slots; this instance 4 online, the fleet 8 online and 5 batch, 2 instances. Wanted with headroom: online
    // 8+1+1 = 10, batch 5+1+1 = 7. Batch's floor 4, online its 10, batch 3 more to its 7: 3 left over. This instance's
    // part: 10 * 4/8 of online, and 3 * (4+1)/(13+2) of what is left: 6 of 20.
    expect(fleetShare(20, CLASSES, [4, 0], [8, 5], 2)).toBeCloseTo(0.3, 12);
  });

  it('answers an even split among the instances when the fleet sent a count that is no number', () => {
    expect(fleetShare(10, CLASSES, [1, 0], [Number.NaN, 0], 4)).toBe(0.25);
  });
});

describe('classesBacked and the exchange', () => {
  const CLASSES: PoolClass[] = [
    { name: 'online', minShare: 0, maxQueue: 100 },
    { name: 'batch', minShare: 0.2, maxQueue: 100 },
  ];

  it('never counts the lowest class, even where a newcomer of it would get a slot', () => {
    expect(classesBacked(10, CLASSES, [0, 0], [0, 0], 2)).toBe(1);
  });

  it("backs a class whose newcomer's share rounds to one slot, as sharedSlots rounds it", () => {
    // 15 online calls elsewhere: a newcomer here would get 10 * 1/16 of the slots, 0.625, which rounds to one.
    expect(classesBacked(10, CLASSES, [0, 0], [15, 0], 2)).toBe(1);
    // 40 elsewhere: 10/41 rounds to none.
    expect(classesBacked(10, CLASSES, [0, 0], [40, 0], 2)).toBe(0);
  });

  it("hands the pool its part of the fleet's rates, not its share of the slots", async () => {
    const calls: number[][] = [];
    const pool = {
      settings: { provider: 'p', capacity: 4, classes: CLASSES },
      demandByClass: () => [3, 0],
      setShare: (...args: number[]) => calls.push(args),
      shareOnDemand: () => {},
    } as unknown as ProviderPool;
    const store = { exchangeDemand: async () => ({ totals: [3, 0], instances: 4 }) } as unknown as StateStore;
    const stop = shareFleetCapacity({ all: () => [pool].values() } as unknown as Pools, store, () => T);
    await sleep(20);
    stop();
    const [share, , , rate] = calls[0]!;
    expect(share).toBeGreaterThan(0.5);
    expect(rate).toBeCloseTo(rateShare(share!, 4, 4), 12);
    expect(rate).not.toBeCloseTo(share!, 6);
  });
});

describe('keyedRequest', () => {
  it("lets a repeat wait for the run only until its own client's deadline, counted from the request's arrival", () => {
    const deps = { store: new MemoryStore(), config: { enabled: true, ttlMs: 60_000, maxAnswerBytes: 1 << 20, memoryBytes: 1 << 26, leaseMs: 10_000 }, now: () => T, random: () => 0 };
    const route = { config: { timeoutMs: 10_000, deadlineMarginMs: 0 }, api: 'chat' } as unknown as CompiledRoute;
    const body = { model: 'gpt-4o', messages: [] };
    const keyed = keyedRequest(
      // Its head arrived 4 s ago (a slow upload): 6 s of its 10 s are left.
      { route, path: '/v1/chat/completions', query: '', rawBody: Buffer.from(JSON.stringify(body)), json: body, headers: { 'idempotency-key': 'k-1' }, client: undefined, receivedMs: 4_000, clientGone: () => false, pastGrace: () => false },
      deps,
    );
    expect(keyed?.waitUntilMs).toBe(T + 6_000);
  });
});

describe('a repeat waiting for a run', () => {
  it('gives up before a look that would end past its deadline, not one look after it', async () => {
    // A clock the looks move: each read of the key is one look (75 ms, random 0) later.
    let now = T;
    let reads = 0;
    const store = new MemoryStore();
    const readKey = store.readKey.bind(store);
    store.readKey = async (key, _nowMs) => {
      reads++;
      now += 75;
      return readKey(key, now);
    };
    const deps = { store, config: { enabled: true, ttlMs: 60_000, maxAnswerBytes: 1 << 20, memoryBytes: 1 << 26, leaseMs: 10_000 }, now: () => now, random: () => 0 };
    const keyed = (owner: string) => ({ key: 'k', fingerprint: 'fp', owner, keptMs: 60_000, runningMs: 60_000, waitUntilMs: T + 100, clientGone: () => false, pastGrace: () => false });
    expect((await claimKey(keyed('first'), deps)).kind).toBe('run');
    // Looks at T (ok: the next ends at T+75), then at T+75: the next would end at T+150, past T+100, so it stops.
    const err = await claimKey(keyed('second'), deps).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(GatewayError);
    expect((err as GatewayError).code).toBe('idempotency_key_in_progress');
    expect(reads).toBe(1);
  });
});

describe('WaitingBodies', () => {
  it('defaults its cap to a quarter of the heap limit', () => {
    expect(defaultWaitingBodyBytes()).toBe(Math.floor(getHeapStatistics().heap_size_limit / 4));
  });

  it('lets a body larger than the cap wait when nothing else does', () => {
    const bodies = new WaitingBodies(100);
    expect(bodies.take(200, false)).toBe(true);
    expect(bodies.take(1, false)).toBe(false);
  });
});

describe('Pools', () => {
  it("counts requests' tokens when any one provider's pool has a token rate, not only when all have", () => {
    const base = configServedBy('http://127.0.0.1:1', 'other', 'http://127.0.0.1:2/v1');
    const config = { ...base, providers: { ...base.providers, other: { ...base.providers.other!, pools: { tokensPerMinute: 60_000 } } } };
    expect(new Pools(ConfigSchema.parse(config), () => 0).countTokens).toBe(true);
  });
});

describe('FleetView', () => {
  const OPEN: BreakerRecord = { state: 'open', sinceMs: T, openUntilMs: T + 30_000, probeSuccesses: 0, generation: 3 };
  const view = () => {
    const errors: unknown[] = [];
    const v = new FleetView((err) => errors.push(err));
    const changes: StateChange[] = [];
    v.onChange((c) => changes.push(c));
    return { v, changes, errors };
  };

  it('takes in a message of the generation it holds once: a repeat of it is no change', () => {
    const { v, changes } = view();
    v.putBreaker('p/m', OPEN, false);
    v.putBreaker('p/m', { ...OPEN }, false);
    v.putBreaker('p/m', { ...OPEN, generation: 2, state: 'closed' }, false);
    expect(changes).toHaveLength(1);
    expect(v.breaker('p/m')).toEqual(OPEN);
  });

  it("takes in what Redis answered when any field differs, even at the same generation, and only then", () => {
    const { v, changes } = view();
    v.putBreaker('p/m', OPEN, true);
    v.putBreaker('p/m', { ...OPEN }, true);
    expect(changes).toHaveLength(1);
    v.putBreaker('p/m', { ...OPEN, sinceMs: T + 1 }, true);
    v.putBreaker('p/m', { ...OPEN, sinceMs: T + 1, probeFailures: 2 }, true);
    expect(changes).toHaveLength(3);
    expect(v.breaker('p/m')).toEqual({ ...OPEN, sinceMs: T + 1, probeFailures: 2 });
  });

  it('compare-and-sets a target it has no record of against generation 0, and tells its listeners', () => {
    const { v, changes } = view();
    expect(v.casBreaker('p/m', 0, OPEN)).toBe(true);
    expect(changes).toEqual([{ kind: 'breaker', target: 'p/m', record: OPEN }]);
    expect(v.casBreaker('p/m', 0, { ...OPEN, generation: 4 })).toBe(false);
  });

  it('moves its times by a clock step: 0 stays 0, a hold-off already over moves without a word, no step moves nothing', () => {
    const { v, changes } = view();
    v.putBreaker('p/m', { ...OPEN, openUntilMs: 0 }, false);
    v.putHoldOff('live', T + 10_000);
    v.putHoldOff('over', T - 10_000);
    changes.length = 0;
    v.rebase(0, T);
    expect(changes).toEqual([]);
    v.rebase(5_000, T);
    expect(v.breaker('p/m')).toMatchObject({ sinceMs: T + 5_000, openUntilMs: 0 });
    expect(v.holdOff('live')).toBe(T + 15_000);
    expect(v.holdOff('over')).toBe(T - 5_000);
    expect(changes.map((c) => c.target).sort()).toEqual(['live', 'p/m']);
  });

  it('extends a hold-off only when it moves, and forgets a target whole', () => {
    const { v, changes } = view();
    v.putHoldOff('p/m', T + 1_000);
    v.putHoldOff('p/m', T + 1_000);
    v.putHoldOff('p/m', T + 500);
    expect(changes).toHaveLength(1);
    v.putBreaker('p/m', OPEN, false);
    v.forget('p/m');
    expect(v.holdOff('p/m')).toBeUndefined();
    expect(v.breaker('p/m')).toBeUndefined();
  });

  it('keeps telling the other listeners when one throws, and reports the error', () => {
    const { v, changes, errors } = view();
    v.onChange(() => {
      throw new Error('listener');
    });
    const after: StateChange[] = [];
    v.onChange((c) => after.push(c));
    v.putHoldOff('p/m', T + 1_000);
    expect(changes).toHaveLength(1);
    expect(after).toHaveLength(1);
    expect(errors).toHaveLength(1);
  });

  it('withTimes maps both times of a record', () => {
    expect(withTimes(OPEN, (ms) => ms + 7)).toEqual({ ...OPEN, sinceMs: T + 7, openUntilMs: T + 30_007 });
  });
});

describe('the Redis wire format', () => {
  /** The hash tag Redis Cluster slots a key by: what is between the first `{` and the next `}`. */
  const tag = (key: string) => /\{([^}]*)\}/.exec(key)?.[1];
  const REC: BreakerRecord = { state: 'half-open', sinceMs: T, openUntilMs: T + 30_000, probeSuccesses: 1, generation: 7, failedProbes: 2, probeFailures: 1 };
  const fields = (r: BreakerRecord) => {
    const flat = encodeBreaker(r);
    const h: Record<string, string> = {};
    for (let i = 0; i < flat.length; i += 2) h[flat[i]!] = flat[i + 1]!;
    return h;
  };

  it('puts every key and the channel under the prefix and a colon, and each prefix has its own channel', () => {
    const keys = new RedisKeys('gw');
    for (const k of [keys.breaker('p/m'), keys.outcomes('p/m', 1), keys.idempotency('abc'), keys.demand('p'), keys.events]) expect(k.startsWith('gw:')).toBe(true);
    expect(new RedisKeys('a').events).not.toBe(new RedisKeys('b').events);
  });

  it("gives each breaker generation a window of its own, and every key of one target one hash tag", () => {
    const keys = new RedisKeys('gw');
    expect(keys.outcomes('p/m', 1)).not.toBe(keys.outcomes('p/m', 2));
    expect(new Set([keys.breaker('p/m'), keys.outcomes('p/m', 2), keys.permits('p/m'), keys.holdOff('p/m')].map(tag))).toEqual(new Set(['p/m']));
  });

  it('slots each idempotency key by itself, and a probe beside a key in that key\'s slot', () => {
    const keys = new RedisKeys('gw');
    expect(tag(keys.idempotency('abc'))).toBe('abc');
    expect(tag(keys.probe(keys.idempotency('abc')))).toBe('abc');
    expect(tag(keys.probe(keys.breaker('p/m')))).toBe('p/m');
  });

  it("names a client's due time by its rate: a raised rate is a fresh key", () => {
    const keys = new RedisKeys('gw');
    const slow = keys.clientRate('team', 'requests', { intervalMs: 60_000, burst: 1 });
    const fast = keys.clientRate('team', 'requests', { intervalMs: 1_000, burst: 5 });
    expect(slow).not.toBe(fast);
    expect(tag(slow)).toBe(tag(fast));
  });

  it('reads back what it writes, probe counts included, and leaves a count of none out', () => {
    expect(decodeBreaker(fields(REC))).toEqual(REC);
    expect(decodeBreaker(encodeBreaker(REC))).toEqual(REC);
    expect(decodeBreaker(fields({ ...REC, failedProbes: 0, probeFailures: 0 }))).toEqual({ state: 'half-open', sinceMs: T, openUntilMs: T + 30_000, probeSuccesses: 1, generation: 7 });
  });

  it('refuses a record of an unknown state or with a field that is no number', () => {
    expect(decodeBreaker({ ...fields(REC), state: 'ajar' })).toBeUndefined();
    expect(decodeBreaker({ ...fields(REC), sinceMs: 'soon' })).toBeUndefined();
  });

  it("counts probe failures only under their own stamp, or a published record's (no stamps at all)", () => {
    const { failedProbesGeneration: _f, probeFailuresGeneration: _p, ...published } = fields(REC);
    expect(decodeBreaker(published)).toEqual(REC);
    // The release before probeFailures had its stamp: failedProbesGeneration, and probeFailures unstamped.
    const { probeFailuresGeneration: _q, ...older } = fields(REC);
    expect(decodeBreaker(older)).toEqual({ ...REC, probeFailures: undefined });
    expect(decodeBreaker(older)?.probeFailures).toBeUndefined();
  });

  it('reads a published change back, and nothing else on the channel', () => {
    const change: StateChange = { kind: 'hold-off', target: 'p/m', untilMs: T };
    expect(decodeChange(encodeChange(change, 'i-1'))).toEqual({ ...change, src: 'i-1' });
    expect(decodeChange(JSON.stringify(change))).toBeUndefined();
    expect(decodeChange('{"kind":"hold-off","target":"p/m","src":"i-1","untilMs":1e400}')).toBeUndefined();
  });
});

describe('idempotency: what the suite left open', () => {
  const config = { enabled: true, ttlMs: 60_000, maxAnswerBytes: 1 << 20, memoryBytes: 1 << 26, leaseMs: 10_000 };

  it('gives the key back when a streamed answer is cut short without its end: the run ends, the next request runs', async () => {
    const store = new MemoryStore();
    const deps = { store, config, now: Date.now, random: () => 0 };
    const keyed = (owner: string) => ({ key: 'k', fingerprint: 'fp', owner, keptMs: 60_000, runningMs: 60_000, waitUntilMs: Date.now() + 5_000, clientGone: () => false, pastGrace: () => false });
    const run = await claimKey(keyed('first'), deps);
    if (run.kind !== 'run') throw new Error('expected a run');
    const upstream = new Readable({ read() {} });
    const summary: RequestSummary = { route: 'chat', target: 'mock/gpt-4o', outcome: 'success', attempts: [], budgetMs: 0, deadlineSource: 'route', skipped: [] };
    const answer: PipelineAnswer = { status: 200, headers: { 'content-type': 'text/event-stream' }, body: upstream, live: { clientStallMs: 10_000 } as unknown as LiveStream, summary };
    const sent = run.keep(answer).body as Readable;
    sent.on('error', () => {});
    sent.resume();
    upstream.push(Buffer.from('data: {"a":1}\n\n'));
    await sleep(20);
    upstream.destroy();
    expect(await Promise.race([run.ended.then(() => 'ended'), sleep(2_000).then(() => 'still held')])).toBe('ended');
    expect(await store.readKey('k', Date.now())).toBeUndefined();
  });

  it('reads `background` as a Responses API field only: a chat body that says it is no background run', () => {
    const deps = { store: new MemoryStore(), config, now: () => T, random: () => 0 };
    const body = { model: 'gpt-4o', messages: [], background: true };
    const keyedOn = (api: string) =>
      keyedRequest(
        { route: { config: { timeoutMs: 10_000, deadlineMarginMs: 0 }, api } as unknown as CompiledRoute, path: '/v1/x', query: '', rawBody: Buffer.from(JSON.stringify(body)), json: body, headers: { 'idempotency-key': 'k-1' }, client: undefined, receivedMs: 0, clientGone: () => false, pastGrace: () => false },
        deps,
      );
    expect(keyedOn('chat')?.committedAtCreated).toBe(false);
    expect(keyedOn('responses')?.committedAtCreated).toBe(true);
  });

  it('takes a key with a comma in it: only ", " is how Node joins a header sent twice', () => {
    expect(idempotencyKeyOf({ 'idempotency-key': 'order-1,line-2' })).toBe('order-1,line-2');
    expect(idempotencyKeyOf({ 'idempotency-key': 'a, b' })).toBeInstanceOf(Error);
  });

  it('spreads the looks of waiting repeats over 75 to 149 ms, so they do not align', () => {
    expect(nextLookMs(() => 0)).toBe(75);
    expect(nextLookMs(() => 0.999)).toBe(149);
  });

  it('waits for a running record that carries no fingerprint (one this version could not read) rather than refuse it', () => {
    expect(repeatVerdict({ state: 'running', fingerprint: '', sinceMs: T, owner: 'o' }, 'fp')).toBe('wait');
    expect(repeatVerdict({ state: 'running', fingerprint: 'other', sinceMs: T, owner: 'o' }, 'fp')).toBe('mismatch');
  });
});
