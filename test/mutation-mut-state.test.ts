// Mutation testing of state/ and pools/: each test here kills a change to the code that the rest of the suite let
// through (a flipped comparison, a dropped call), so it names the behaviour that change would have broken. Times and
// draws are injected: every number is exact.
import { describe, expect, it, vi } from 'vitest';
import { BreakerSchema, ConfigSchema } from '../src/config/schema.ts';
import { Pools } from '../src/pools/pools.ts';
import { defaultConfig } from './helpers/stack.ts';
import { settingsForModel } from '../src/policy/breaker.ts';
import { BreakerBoard, type BreakerCause } from '../src/state/breaker-board.ts';
import { HoldOffs, isSideKey, startsHoldOff, type HoldStart } from '../src/state/hold-offs.ts';
import { MemoryStore, SecondBuckets } from '../src/state/memory-store.ts';
import { fleetShare } from '../src/pools/fleet-share.ts';
import { MAX_WINDOW_S } from '../src/state/store.ts';
import { RetryBudget } from '../src/state/retry-budget.ts';
import { ProviderPool, type PoolClass, type SlotRequest } from '../src/pools/provider-pool.ts';
import { WaitingBodies } from '../src/pools/waiting-bodies.ts';
import type { BreakerRecord } from '../src/state/store.ts';
import type { WaitHint } from '../src/policy/wait-hint.ts';
import { RacedStore } from './helpers/raced-store.ts';

const T = 1_700_000_000_000;
const hint = (delayMs: number, fleetWide = true): WaitHint => ({ delayMs, source: 'retry-after', fleetWide });

describe('the retry budget gauge', () => {
  it('forgets the budgets of a target key given back: a made-up model no longer adds its floor to the route', async () => {
    const budget = new RetryBudget(new MemoryStore(), () => T);
    const cfg = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 1 };
    budget.countRequest(RetryBudget.key('chat', 'p/kept', 'online'), cfg);
    budget.countRequest(RetryBudget.key('chat', 'p/made-up', 'online'), cfg);
    expect((await budget.remainingByRoute()).get('chat')).toBe(20);
    budget.forget('p/made-up');
    expect((await budget.remainingByRoute()).get('chat')).toBe(10);
  });
});

describe('the breaker board, mutants of its batching and compare-and-set', () => {
  const s = settingsForModel(BreakerSchema.parse({}), undefined);
  const OTHER_OPEN: BreakerRecord = { state: 'open', sinceMs: T, openUntilMs: T + 30_000, probeSuccesses: 0, generation: 1 };
  const OTHER_CLOSED: BreakerRecord = { state: 'closed', sinceMs: T, openUntilMs: 0, probeSuccesses: 0, generation: 1 };


  function board(store = new RacedStore()) {
    let now = T;
    const lines: Array<{ from: string; to: string; cause: BreakerCause }> = [];
    const b = new BreakerBoard({ store, now: () => now, random: () => 0, onTransition: (_t, from, to, cause) => lines.push({ from: from.state, to: to.state, cause }) });
    return { b, store, lines, advance: (ms: number) => (now += ms) };
  }

  it('names the reason of the window\'s last failure in the failure-rate line', async () => {
    const { b, lines } = board();
    for (let i = 0; i < 20; i++) await b.record('p/m', s, i % 2 === 0 ? 'failure' : 'success', 10, undefined, i % 2 === 0 ? { reason: 'status_503' } : { reason: 'ok' });
    await b.flush();
    expect(lines).toEqual([{ from: 'closed', to: 'open', cause: { cause: 'failure_rate', failures: 10, requests: 20, reason: 'status_503' } }]);
  });

  it('applies the window\'s failure rate within 50 ms of the outcomes, without being asked to flush', async () => {
    vi.useFakeTimers();
    try {
      const { b, lines } = board();
      for (let i = 0; i < 20; i++) await b.record('p/m', s, i % 2 === 0 ? 'failure' : 'success', 10, undefined);
      await vi.advanceTimersByTimeAsync(49);
      expect(lines).toEqual([]);
      await vi.advanceTimersByTimeAsync(1);
      expect(lines.map((l) => `${l.from}->${l.to}`)).toEqual(['closed->open']);
      b.close();
    } finally {
      vi.useRealTimers();
    }
  });

  it('names a failed probe that reopens a half-open breaker probe_failed, with its reason', async () => {
    const hs = settingsForModel(BreakerSchema.parse({ closeAfter: 2, halfOpenProbes: 2, openS: 1 }), undefined);
    const { b, lines, advance } = board();
    for (let i = 0; i < 5; i++) await b.record('p/m', hs, 'failure', 10, undefined, { reason: 'status_503' });
    advance(2_000);
    const first = await b.admit('p/m', hs, false, 5_000);
    await b.record('p/m', hs, 'success', 10, first.admitted ? first.probe : undefined, { reason: 'ok' });
    expect(b.current('p/m').state).toBe('half-open');
    const second = await b.admit('p/m', hs, false, 5_000);
    // One success, one failure: half of the round failed, which is failureRate: the failure reopens it.
    await b.record('p/m', hs, 'failure', 10, second.admitted ? second.probe : undefined, { reason: 'timeout_response' });
    expect(b.current('p/m').state).toBe('open');
    expect(lines.at(-1)).toEqual({ from: 'half-open', to: 'open', cause: { cause: 'probe_failed', reason: 'timeout_response' } });
  });

  it('does not count outcomes batched in one closed spell in the window of the next (another instance opened and closed it meanwhile)', async () => {
    const { b, store, lines } = board();
    for (let i = 0; i < 20; i++) await b.record('p/m', s, i % 2 === 0 ? 'failure' : 'success', 10, undefined);
    await store.casBreaker('p/m', 0, OTHER_CLOSED);
    await b.flush();
    expect(await store.addOutcomes('p/m', 1, { requests: 0, failures: 0 }, T, 10)).toEqual({ requests: 0, failures: 0 });
    expect(b.current('p/m')).toEqual(OTHER_CLOSED);
    expect(lines).toEqual([]);
  });

  it('counts the outcomes of a new closed spell even when outcomes of the previous one are still unsent', async () => {
    const { b, store } = board();
    await b.record('p/m', s, 'failure', 10, undefined);
    await store.casBreaker('p/m', 0, OTHER_CLOSED);
    await b.record('p/m', s, 'failure', 10, undefined);
    await b.record('p/m', s, 'success', 10, undefined);
    await b.flush();
    expect(await store.addOutcomes('p/m', 1, { requests: 0, failures: 0 }, T, 10)).toEqual({ requests: 2, failures: 1 });
  });

  it('leaves a breaker another instance opened first as that instance wrote it, instead of opening it again', async () => {
    const { b, store, lines } = board();
    for (let i = 0; i < 20; i++) await b.record('p/m', s, i % 2 === 0 ? 'failure' : 'success', 10, undefined);
    store.raceWith = OTHER_OPEN;
    await b.flush();
    expect(store.getBreaker('p/m')).toEqual(OTHER_OPEN);
    expect(lines).toEqual([]);
  });

  it('re-reads once after losing a compare-and-set, and opens on a run of failures when the fresh record is still closed', async () => {
    const { b, store, lines, advance } = board();
    store.raceWith = OTHER_CLOSED;
    for (let i = 0; i < 5; i++) {
      advance(100);
      await b.record('p/m', s, 'failure', 10, undefined);
    }
    expect(store.getBreaker('p/m')).toMatchObject({ state: 'open', generation: 2 });
    expect(lines.map((l) => `${l.from}->${l.to}`)).toEqual(['closed->open']);
  });

  it('sends no outcomes of a target key given back: the store does not keep a window for it again', async () => {
    const { b, store } = board();
    await b.record('p/made-up', s, 'failure', 10, undefined);
    b.forget('p/made-up');
    store.forget('p/made-up');
    await b.flush();
    expect(await store.addOutcomes('p/made-up', 0, { requests: 0, failures: 0 }, T, 10)).toEqual({ requests: 0, failures: 0 });
  });
});

describe('hold-offs, mutants of their edges', () => {
  it('starts a fleet-wide hold-off on 429, 503 and 529 with a positive fleet-wide hint only', () => {
    for (const status of [429, 498, 503, 529]) expect(startsHoldOff(status, hint(1_000))).toBe(true);
    expect(startsHoldOff(500, hint(1_000))).toBe(false);
    expect(startsHoldOff(429, hint(1_000, false))).toBe(false);
    expect(startsHoldOff(429, hint(0))).toBe(false);
    expect(startsHoldOff(429, undefined)).toBe(false);
  });

  it('ends a hold-off and a credential hold at their end, to the millisecond', () => {
    let now = T;
    const holdOffs = new HoldOffs(new MemoryStore(), () => now, () => 0);
    expect(holdOffs.start('p/m', hint(1_000))).toBe(T + 1_000);
    holdOffs.holdCredentials('p/m', 2_000);
    now = T + 999;
    expect(holdOffs.until('p/m')).toBe(T + 1_000);
    now = T + 1_000;
    expect(holdOffs.until('p/m')).toBeUndefined();
    now = T + 1_999;
    expect(holdOffs.credentialsHeldUntil('p/m')).toBe(T + 2_000);
    now = T + 2_000;
    expect(holdOffs.credentialsHeldUntil('p/m')).toBeUndefined();
  });

  it('rounds a credential hold of a fraction of a millisecond up, never ending it early', () => {
    const holdOffs = new HoldOffs(new MemoryStore(), () => T, () => 0);
    holdOffs.holdCredentials('p/m', 1.5);
    expect(holdOffs.credentialsHeldUntil('p/m')).toBe(T + 2);
  });

  it('tells the operator of a credential hold once when it starts, not at every refusal that extends it', () => {
    let now = T;
    const starts: HoldStart[] = [];
    const holdOffs = new HoldOffs(new MemoryStore(), () => now, () => 0, (h) => starts.push(h));
    holdOffs.holdCredentials('p/m', 60_000, { reason: 'status_401', status: 401 });
    now += 1_000;
    holdOffs.holdCredentials('p/m', 60_000, { reason: 'status_401', status: 401 });
    expect(starts).toEqual([{ kind: 'credentials', target: 'p/m', untilMs: T + 60_000, reason: 'status_401', status: 401 }]);
    now = T + 70_000;
    holdOffs.holdCredentials('p/m', 60_000, { reason: 'status_401', status: 401 });
    expect(starts).toHaveLength(2);
  });

  it('tells the operator of a hold-off once when it starts, not at every answer of the 429 storm that extends it', () => {
    let now = T;
    const starts: HoldStart[] = [];
    const holdOffs = new HoldOffs(new MemoryStore(), () => now, () => 0, (h) => starts.push(h));
    holdOffs.start('p/m', hint(5_000), { reason: 'status_429', status: 429 });
    now += 1_000;
    holdOffs.start('p/m', hint(5_000), { reason: 'status_429', status: 429 });
    expect(starts).toEqual([{ kind: 'hold-off', target: 'p/m', untilMs: T + 5_000, hintMs: 5_000, reason: 'status_429', status: 429 }]);
  });

  it('forgets the credential hold of a target key given back, with its hold-off', () => {
    const store = new MemoryStore();
    const holdOffs = new HoldOffs(store, () => T, () => 0);
    holdOffs.start('p/made-up', hint(5_000));
    holdOffs.holdCredentials('p/made-up', 60_000);
    holdOffs.forget('p/made-up');
    expect(holdOffs.until('p/made-up')).toBeUndefined();
    expect(holdOffs.credentialsHeldUntil('p/made-up')).toBeUndefined();
  });

  it('tells both keys a long hint leaves beside its hold-off from a target\'s own key', () => {
    expect(isSideKey('p/m#asked')).toBe(true);
    expect(isSideKey('p/m#long')).toBe(true);
    expect(isSideKey('p/m')).toBe(false);
  });

  it('waits for the first read of every key a hold-off is kept under, the long hint\'s end included', async () => {
    const unread = new Set(['p/m#long']);
    const store = Object.assign(new MemoryStore(), {
      firstRead: (key: string) => (unread.has(key) ? Promise.resolve() : undefined),
    });
    const holdOffs = new HoldOffs(store, () => T, () => 0);
    expect(holdOffs.firstRead('p/m')).toBeInstanceOf(Promise);
    unread.clear();
    expect(holdOffs.firstRead('p/m')).toBeUndefined();
  });
});

describe('per-second buckets', () => {
  it('keep exactly MAX_WINDOW_S seconds, however long they count', () => {
    const b = new SecondBuckets();
    for (let sec = 0; sec < MAX_WINDOW_S + 100; sec++) b.add(sec * 1000, [1]);
    expect(b.size).toBe(MAX_WINDOW_S);
  });
});

describe('the fleet share', () => {
  it('gives the lower classes their floors first when the floors add up to more than the pool, as one pool does', () => {
    const classes = [
      { name: 'online', minShare: 0.8, maxQueue: 100 },
      { name: 'batch', minShare: 0.5, maxQueue: 100 },
    ];
    // Instance A carries 20 batch requests, instance B 20 online ones: batch keeps its floor of 5 of 10 slots.
    expect(fleetShare(10, classes, [0, 20], [20, 20], 2)).toBeCloseTo(0.5);
    expect(fleetShare(10, classes, [20, 0], [20, 20], 2)).toBeCloseTo(0.5);
  });
});

describe('the pools built from the config', () => {
  it('allow a fifth of maxConcurrent in retries unless maxConcurrentRetries says otherwise, as the README says', () => {
    const pools = (extra: object) => new Pools(ConfigSchema.parse(defaultConfig('http://127.0.0.1:1', { provider: { pools: { maxConcurrent: 20, ...extra } } })), () => 0);
    expect(pools({}).of('mock').settings).toMatchObject({ capacity: 20, retryCapacity: 4 });
    expect(pools({ maxConcurrentRetries: 7 }).of('mock').settings.retryCapacity).toBe(7);
  });
});

describe('the provider pool, mutants of admission', () => {
  const TWO: PoolClass[] = [
    { name: 'online', minShare: 0, maxQueue: 10 },
    { name: 'batch', minShare: 0, maxQueue: 10 },
  ];
  function pool(capacity: number, classes: PoolClass[] = TWO, bodies?: WaitingBodies) {
    const clock = { now: 0 };
    const p = new ProviderPool({ provider: 'p', capacity, retryCapacity: capacity, classes, decrease: 0.9, minLimit: 1 }, () => clock.now, {}, bodies);
    return { p, clock };
  }
  const req = (cls: number, extra: Partial<SlotRequest> = {}): SlotRequest => ({ cls, target: 'p/m', retry: false, deadlineAtMs: 60_000, minAttemptMs: 0, signal: new AbortController().signal, ...extra });
  const flush = () => new Promise((r) => setImmediate(r));

  it('does not let a newcomer of a class jump a waiter of that class that may go now (its quota hold just ended)', async () => {
    const { p, clock } = pool(1);
    p.holdLowerClasses('p/m', 10_000);
    const order: string[] = [];
    void p.acquire(req(1)).then((a) => a.ok && order.push('waiter'));
    await flush();
    expect(order).toEqual([]);
    // The hold is over; its timer (real time) has not fired yet: the waiter may go, and goes before the newcomer.
    clock.now = 10_001;
    void p.acquire(req(1)).then((a) => a.ok && order.push('newcomer'));
    await flush();
    expect(order).toEqual(['waiter']);
    p.close();
  });

  it('keeps limiting when the fleet share it is given is not a number', async () => {
    const { p } = pool(2);
    p.setShare(Number.NaN);
    expect((await p.acquire(req(0))).ok).toBe(true);
    expect((await p.acquire(req(0))).ok).toBe(true);
    let third = false;
    void p.acquire(req(0)).then(() => (third = true));
    await flush();
    expect(third).toBe(false);
  });

  it('keeps the entry of a target with requests waiting on it, and the quota hold in it, when asked to forget it', async () => {
    const { p } = pool(4);
    p.holdLowerClasses('p/m', 10_000);
    let first = false;
    void p.acquire(req(1)).then(() => (first = true));
    await flush();
    p.forget('p/m');
    let second = false;
    void p.acquire(req(1)).then(() => (second = true));
    await flush();
    expect([first, second]).toEqual([false, false]);
    p.close();
  });

  it('sheds, at the moment of the grant, a waiter left less than minAttemptMs before its deadline', async () => {
    const { p, clock } = pool(1);
    const held = await p.acquire(req(0));
    const waiting = p.acquire(req(0, { deadlineAtMs: 3_000, minAttemptMs: 500 }));
    await flush();
    clock.now = 2_600;
    if (held.ok) held.slot.release();
    expect(await waiting).toMatchObject({ ok: false, reason: 'deadline' });
  });

  it('still grants the waiter behind more than a thousand that left its lane (the lane compacts)', async () => {
    const { p } = pool(1, [{ name: 'online', minShare: 0, maxQueue: 5_000 }]);
    const held = await p.acquire(req(0));
    const gone = Array.from({ length: 1_030 }, () => new AbortController());
    // Deadlines far enough off that the wait estimate (a round trip per waiter ahead) never sheds them.
    const left = gone.map((c) => p.acquire(req(0, { signal: c.signal, deadlineAtMs: 1e9 })));
    const last = p.acquire(req(0, { deadlineAtMs: 1e9 }));
    await flush();
    for (const c of gone) c.abort();
    await Promise.all(left);
    if (held.ok) held.slot.release();
    const got = await Promise.race([last, flush().then(() => 'still waiting')]);
    expect(got).toMatchObject({ ok: true, queued: true });
  });

  it('lets the only class of a pool fill the whole waiting-body cap: it is no batch class to keep to half', async () => {
    const bodies = new WaitingBodies(1_000);
    const { p } = pool(1, [{ name: 'online', minShare: 0, maxQueue: 10 }], bodies);
    expect((await p.acquire(req(0))).ok).toBe(true);
    const waiting = [p.acquire(req(0, { bodyBytes: 400 })), p.acquire(req(0, { bodyBytes: 400 }))];
    await flush();
    expect(bodies.bytes).toBe(800);
    const shed = await Promise.race([...waiting, flush().then(() => 'waiting')]);
    expect(shed).toBe('waiting');
  });
});
