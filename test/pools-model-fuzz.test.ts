// Seeded model-based tests of the hand-written concurrency code: the priority pools (provider-pool.ts, through
// pools.ts, with the waiting bodies' bytes) and the parking lot. Each is driven with thousands of random operations
// (slots of random classes and targets taken and given back, cancellations at random times, 429s and successes to the
// adaptive limit, quota holds, fleet shares, time passing) beside a plain model written from the README's "Priority
// pools" and "Parking" paragraphs, and the two must agree after every step. The adaptive limit's own arithmetic is the
// policy's (fuzzed in policy-model-fuzz.test.ts): the model runs the same pure functions on the same inputs, and
// checks how the pool uses it. A disagreement found this way also has a small named test (at the end).
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { createMetrics, type Metrics } from '../src/observability/metrics.ts';
import { collectAtScrape } from '../src/observability/scrape-gauges.ts';
import { ParkingLot, type TargetState } from '../src/pipeline/parking-lot.ts';
import { seededRandom } from '../src/policy/random.ts';
import { fleetShare } from '../src/pools/fleet-share.ts';
import { Pools } from '../src/pools/pools.ts';
import type { Acquired, PoolClass, Slot, SlotRequest } from '../src/pools/provider-pool.ts';
import { WaitingBodies } from '../src/pools/waiting-bodies.ts';
import { TargetKeys } from '../src/routing/target-keys.ts';
import { CLASS_NAMES, gaugeValue, gen, poolConfig, PROVIDER, settle, type Gen } from './helpers/model-fuzz.ts';
import { beginWait, expectRouteQueues, letAllGo, lotQueries, parkOptions, takeOutcome, unparked, type LotOutcome, type LotReq } from './helpers/lot-model.ts';
import { PoolFuzzDriver } from './helpers/pool-fuzz-driver.ts';
import type { PoolReq } from './helpers/pool-model.ts';

/**
 * A failing case names its seed and step. FUZZ_SEED moves the runs to other seeds and FUZZ_SEEDS multiplies how many
 * (`FUZZ_SEEDS=50 npx vitest run test/pools-model-fuzz.test.ts` for a longer hunt); the default stays within seconds.
 */
const SEEDS = Number(process.env.FUZZ_SEEDS ?? 1);
const BASE_SEED = Number(process.env.FUZZ_SEED ?? 20_250_301);

// ------------------------------------------------------------------------------------------------------------------
// The provider pool, as the README's "Priority pools" paragraphs describe it (the model: test/helpers/pool-model.ts).
// ------------------------------------------------------------------------------------------------------------------

async function runPoolFuzz(seed: number, steps: number, seen: Set<string>): Promise<void> {
  const g: Gen = gen(seededRandom(seed));
  const d = new PoolFuzzDriver<PoolReq>(seed, g, seen, () => g.int(0, 6));
  const { classes, bodies, pools, pool, model, targets, now, where } = d;
  const metrics = createMetrics({ defaultMetrics: false });
  collectAtScrape(metrics, { config: d.config, targetKeys: new TargetKeys(d.config, now), pools, bodies, board: {} as never, holdOffs: {} as never, budget: {} as never, now, breakersChanged: () => [], holdsLearnt: () => [] });
  const classCount = classes.length;

  const newReq = (): PoolReq => {
    const cls = g.int(0, classCount - 1);
    const ctrl = new AbortController();
    if (g.chance(0.03)) ctrl.abort();
    const minAttemptMs = g.pick([0, 200, 1_000]);
    const req: SlotRequest = {
      cls,
      target: g.pick(targets),
      retry: g.chance(0.25),
      deadlineAtMs: g.evenAfter(now(), g.int(0, 20_000)),
      minAttemptMs,
      signal: ctrl.signal,
      ...(g.chance(0.1) && { released: true }),
      ...(g.chance(0.8) && { bodyBytes: g.int(0, 400) }),
    };
    // One client, the unnamed one: the shared model's turns between clients and displacement stay out of play.
    return { id: d.reqs.length, req, client: '', ctrl, state: 'done', seq: -1, grantedAtMs: 0, answered: false, slotGiven: false };
  };

  const check = async (): Promise<void> => {
    await settle();
    expect(d.actualOrder, `order of the queue's answers, ${where()}`).toEqual(model.order);
    d.actualOrder = [];
    model.order = [];
    d.expectTouchedAgree((p) => `request ${p.id} (class ${p.req.cls}, ${p.req.target}${p.req.retry ? ', retry' : ''}${p.req.released ? ', released' : ''})`);
    const snap = pool.snapshot();
    expect(snap.inUse, `in use by class, ${where()}`).toEqual(model.inUseByClass);
    expect(snap.queued, `queued by class, ${where()}`).toEqual(classes.map((_, k) => model.queuedOf(k)));
    for (const [key, t] of model.targets) expect(pool.limitOf(key), `${key}'s limit, ${where()}`).toBeCloseTo(Math.min(t.limit.limit, model.capacity), 9);
    expect(bodies.bytes, `waiting body bytes, ${where()}`).toBe(model.bytes);
    // The README's bounds, whatever the model says: within the capacity, the retry share, each queue's maxQueue.
    if (model.inUse > model.capacity) seen.add('over capacity after a share shrank');
    for (const [k, c] of classes.entries()) {
      const newcomers = model.queue.filter((w) => w.req.cls === k && !w.req.released).length;
      expect(newcomers, `class ${k}'s queue, ${where()}`).toBeLessThanOrEqual(c.maxQueue);
    }
    const idle = model.idleWhileWaiting();
    expect(idle && `request ${idle.id} (class ${idle.req.cls}, ${idle.req.target}) waits beside a slot it could take`, `lost wake-up, ${where()}`).toBeUndefined();
    if (model.queue.length > 0) seen.add('waiting');
    if (model.queue.some((w) => w.req.cls > 0 && model.target(w.req.target).lowerHeldUntilMs > now())) seen.add('lower class held');
  };

  const gauges = async (): Promise<void> => {
    for (const [k, c] of classes.entries()) {
      const labels = { provider: PROVIDER, priority: c.name };
      // Reading one pool gauge collects them all, as a scrape does.
      await metrics.poolInUse.get();
      expect(gaugeValue(await metrics.poolInUse.get(), labels), `stormgate_pool_in_use ${c.name}, ${where()}`).toBe(model.inUseByClass[k]);
      expect(gaugeValue(await metrics.poolQueueDepth.get(), labels), `stormgate_pool_queue_depth ${c.name}, ${where()}`).toBe(model.queuedOf(k));
    }
    expect(gaugeValue(await metrics.waitingBodyBytes.get(), {}), `stormgate_waiting_body_bytes, ${where()}`).toBe(model.bytes);
  };

  await d.run(steps, {
    mix: [
      [0.36, 'acquire'],
      [0.58, 'release'],
      [0.64, 'abort a waiter'],
      [0.67, 'release and abort, one tick'],
      [0.69, 'abort a holder'],
      [0.77, 'success'],
      [0.83, '429'],
      [0.84, 'recovered'],
      [0.86, 'hold lower classes'],
      [0.9, 'fleet share'],
    ],
    newReq,
    check,
    afterStep: async () => {
      if (d.step % 97 === 0) await gauges();
    },
    raceHead: true,
    shareNearRetryRounding: true,
    opNotes: true,
  });

  // Everything given back or cancelled: nothing in use, nothing queued, no bytes held, and the gauges say so.
  await d.windDown();
  expect(pool.snapshot().inUse.every((n) => n === 0) && pool.snapshot().queued.every((n) => n === 0), where()).toBe(true);
  await gauges();
  pools.close();
}

describe('the provider pool against the README model', () => {
  beforeEach(() => vi.useFakeTimers({ now: 1_000_000 }));
  afterEach(() => vi.useRealTimers());

  it('admits, queues, sheds, grants and forgets as the README says, through thousands of random operations', async () => {
    const seen = new Set<string>();
    for (let s = 0; s < 12 * SEEDS; s++) await runPoolFuzz(BASE_SEED + s, 600, seen);
    if (process.env.FUZZ_SEEN) console.log([...seen]);
    for (const what of ['waiting', 'granted at once', 'shed queue_full', 'shed deadline', 'shed body_bytes', 'aborted while queued', 'cancellation raced a grant', '429', 'lower class held', 'quota hold ended']) {
      expect(seen, `the runs reached: ${what}`).toContain(what);
    }
  }, 60_000 * SEEDS);
});

// ------------------------------------------------------------------------------------------------------------------
// The parking lot, as the README's "Parking" paragraph describes it.
// ------------------------------------------------------------------------------------------------------------------

async function runLotFuzz(seed: number, steps: number, seen: Set<string>): Promise<void> {
  const g: Gen = gen(seededRandom(seed));
  const now = () => Date.now();
  const targets = ['p/a', 'p/b'].slice(0, g.int(1, 2));
  const routes = new Map(['chat', 'batch-chat'].map((r) => [r, g.int(1, 6)]));
  const minAttemptMs = g.pick([0, 200, 1_000]);
  const classes = g.int(1, 3);
  const states = new Map<string, TargetState>(targets.map((t) => [t, { mode: 'blocked', availableAtMs: g.evenAfter(now(), g.int(0, 3_000)) }]));
  /** Since when each target's state is what it is (non-blocked: the lot must have let what may go go within 1.25 s). */
  const stateSince = new Map<string, number>(targets.map((t) => [t, now()]));
  const bodies = new WaitingBodies(1_000);
  const metrics: Metrics = createMetrics({ defaultMetrics: false });
  /** Outcomes of waits the lot reported (answers at the door are taken out), in the order their promises settle: [kind, when, target pumped]. */
  const outcomes: Array<LotOutcome<TargetState>> = [];
  let pumped: string | undefined;
  const lot = new ParkingLot({
    now,
    random: g.random,
    stateOf: (target) => {
      pumped = target;
      return states.get(target)!;
    },
    onParkedChange: (route, delta) => metrics.parked.inc({ route }, delta),
    onOutcome: (route, outcome) => {
      metrics.parkOutcomes.inc({ route, outcome });
      outcomes.push([outcome, now(), outcome === 'released' ? pumped : undefined, outcome === 'released' ? states.get(pumped!) : undefined]);
    },
    bodies,
  });
  const reqs: LotReq[] = [];
  let seq = 0;
  let step = 0;
  let op = '';
  const where = () => `seed ${seed}, step ${step} (${op}), t=${now()}`;
  const problems: string[] = [];
  const fail = (what: string) => problems.push(`${what}, ${where()}`);

  const { parked, inflight, cutoff, ahead } = lotQueries(reqs, minAttemptMs);

  /** The wait ended at `atMs` with `kind`: check it against the README. */
  const ended = (r: LotReq, kind: string, atMs: number, releasedFrom: string | undefined, stateThen: TargetState | undefined) => {
    const waited = r.parkedMs + (atMs - r.parkedAtMs);
    r.parkedMs = waited;
    if (kind === 'released') {
      const state = stateThen!;
      seen.add(`released while ${state.mode}`);
      if (releasedFrom !== r.target) fail(`request ${r.id} released by a pump of ${releasedFrom}, parked for ${r.target}`);
      // Nothing parked is sent while the target is unavailable; never with less than minAttemptMs left; never past maxWaitMs.
      if (state.mode === 'blocked') fail(`request ${r.id} released while ${r.target} is blocked`);
      if (atMs >= cutoff(r)) fail(`request ${r.id} released with ${r.deadlineAtMs - atMs} ms left (minAttemptMs ${minAttemptMs})`);
      if (r.maxWaitMs !== undefined && waited > r.maxWaitMs) fail(`request ${r.id} released after ${waited} ms parked in all (maxWaitMs ${r.maxWaitMs})`);
      if (r.notBeforeMs !== undefined && !r.awaySincePark && atMs < r.notBeforeMs) fail(`request ${r.id} released at ${atMs}, before its notBeforeMs ${r.notBeforeMs}`);
      // As many at a time as the target's limit (its probes: streams begun do not count), a class counting its own and higher.
      r.state = 'released';
      r.streaming = false;
      if (state.mode !== 'blocked' && inflight(r.target, r.cls, state.mode === 'probing') > state.slots) {
        fail(`request ${r.id} (class ${r.cls}) released beyond ${state.mode} slots ${state.slots}: ${inflight(r.target, r.cls, state.mode === 'probing')} out`);
      }
      // Release order: of the same class, one ahead of it that parked no later and has no moment of its own to wait for
      // goes first (the release window spreads the parked in order).
      for (const a of parked(r.target)) {
        if (a.cls === r.cls && ahead(a, r) && a.seq < r.seq && a.notBeforeMs === undefined && r.notBeforeMs === undefined && atMs < cutoff(a)) {
          fail(`request ${r.id} (deadline ${r.deadlineAtMs}) released ahead of request ${a.id} (deadline ${a.deadlineAtMs})`);
        }
      }
      return;
    }
    r.state = 'done';
    if (kind === 'timeout') {
      seen.add('timeout');
      // Answered when less than minAttemptMs is left, or once it has waited maxWaitMs in all: not before, not after.
      const due = Math.min(r.parkedAtMs + (r.waitLeftMs ?? Number.POSITIVE_INFINITY), cutoff(r));
      if (atMs !== Math.max(due, r.parkedAtMs)) fail(`request ${r.id} timed out at ${atMs}, due at ${due}`);
      if (r.maxWaitMs !== undefined && waited > r.maxWaitMs) fail(`request ${r.id} waited ${waited} ms in all (maxWaitMs ${r.maxWaitMs})`);
    }
  };

  const park = (r: LotReq, notBeforeMs?: number): void => {
    const before = outcomes.length;
    beginWait(r, now(), notBeforeMs);
    r.awaySincePark = states.get(r.target)!.mode === 'blocked';
    r.seq = seq++;
    // The model's answer at the door: the route's queue, the client gone, the bodies' bytes.
    const routeCount = reqs.filter((x) => x.state === 'parked' && x.route === r.route).length;
    const cap = r.lowest ? bodies.maxBytes / 2 : bodies.maxBytes;
    const parkedBytes = reqs.filter((x) => x.state === 'parked').reduce((a, x) => a + x.bytes, 0);
    const expected = routeCount >= routes.get(r.route)! ? 'full' : r.ctrl.signal.aborted ? 'aborted' : parkedBytes > 0 && parkedBytes + r.bytes > cap ? 'full' : 'parked';
    if (expected === 'full') seen.add(routeCount >= routes.get(r.route)! ? 'route queue full' : 'bodies full');
    r.state = expected === 'parked' ? 'parked' : 'done';
    let immediate = true;
    void lot
      .park(r.target, parkOptions(r, routes.get(r.route)!, minAttemptMs))
      .then((res) => {
        if (immediate) {
          if (res.kind !== expected) fail(`request ${r.id} answered ${res.kind} at the door, the model ${expected}`);
          return;
        }
        const o = takeOutcome(outcomes, res.kind, r.target);
        if (o === undefined) return fail(`request ${r.id} answered ${res.kind}, which the lot did not report`);
        if (res.kind === 'released') r.ticket = res.ticket;
        ended(r, res.kind, o[1], o[2], o[3]);
      });
    // Answered at the door (the lot's first outcome in the call is the answer) or parked (outcomes are the pump's).
    const first = outcomes[before];
    immediate = first !== undefined && ['full', 'aborted', 'closing'].includes(first[0]);
    if (immediate) outcomes.splice(before, 1);
    else if (expected !== 'parked') fail(`request ${r.id} parked, the model ${expected}`);
  };

  const newReq = (): LotReq => {
    const ctrl = new AbortController();
    if (g.chance(0.03)) ctrl.abort();
    const cls = g.int(0, classes - 1);
    const r: LotReq = {
      id: reqs.length,
      target: g.pick(targets),
      route: g.pick([...routes.keys()]),
      cls,
      deadlineAtMs: g.evenAfter(now(), g.int(0, 12_000)),
      maxWaitMs: g.chance(0.5) ? undefined : g.int(0, 6_000),
      bytes: g.chance(0.7) ? g.int(0, 300) : 0,
      lowest: classes > 1 && cls === classes - 1,
      ctrl,
      ...unparked(now()),
    };
    reqs.push(r);
    return r;
  };

  const check = async (): Promise<void> => {
    await settle();
    if (problems.length > 0) expect(problems).toEqual([]);
    expect(outcomes, `outcomes without a request, ${where()}`).toEqual([]);
    for (const t of targets) {
      const mine = parked(t);
      expect(lot.waiting(t), `${t} waiting, ${where()}`).toBe(mine.length);
      for (let k = 0; k < classes; k++) expect(lot.waiting(t, k), `${t} waiting up to class ${k}, ${where()}`).toBe(mine.filter((r) => r.cls <= k).length);
      // No lost wake-up: a target back for 1.25 s (the release window, at most 1 s, and the lot's re-check) has let go
      // everything its limit allows, but what waits for a moment of its own.
      const state = states.get(t)!;
      if (state.mode !== 'blocked' && now() - stateSince.get(t)! >= 1_250) {
        for (const r of mine) {
          if (r.notBeforeMs !== undefined && r.notBeforeMs > now() - 250) continue;
          if (inflight(t, r.cls, state.mode === 'probing') < state.slots) {
            expect.fail(`request ${r.id} (class ${r.cls}) still parked on ${t}, ${state.mode} with ${state.slots} slots for ${now() - stateSince.get(t)!} ms, ${where()}`);
          }
        }
      }
    }
    await expectRouteQueues(reqs, routes, metrics, where());
    expect(bodies.bytes, `waiting body bytes, ${where()}`).toBe(parked().reduce((a, r) => a + r.bytes, 0));
    if (parked().length > 0) seen.add('parked');
  };

  const setState = (t: string, next: TargetState, notify: boolean) => {
    states.set(t, next);
    stateSince.set(t, now());
    if (next.mode === 'blocked') for (const r of parked(t)) r.awaySincePark = true;
    if (notify) lot.notify(t);
  };

  for (step = 0; step < steps; step++) {
    const roll = g.random();
    if (roll < 0.34) {
      op = 'park';
      const r = newReq();
      park(r, g.chance(0.08) ? now() + g.int(1, 1_500) : undefined);
    } else if (roll < 0.42) {
      op = 'client leaves';
      const p = parked();
      if (p.length > 0) {
        const r = g.pick(p);
        r.ctrl.abort();
        seen.add('aborted while parked');
      }
    } else if (roll < 0.56) {
      op = 'attempt over';
      const out = reqs.filter((r) => r.state === 'released');
      if (out.length > 0) {
        const r = g.pick(out);
        r.state = 'done';
        r.ticket!.done();
        if (g.chance(0.1)) r.ticket!.done();
        // A probe that failed: the target is away again and the request parks for what is left of its maxWaitMs.
        if (g.chance(0.35) && now() < cutoff(r)) {
          op = 'probe failed, parks again';
          setState(r.target, { mode: 'blocked', availableAtMs: g.evenAfter(now(), g.int(0, 3_000)) }, true);
          // What the last done() let go has gone by the time the request comes back to park.
          await settle();
          park(r);
          seen.add('parked again after a failed probe');
        }
      }
    } else if (roll < 0.6) {
      op = 'stream begins';
      const out = reqs.filter((r) => r.state === 'released' && !r.streaming);
      if (out.length > 0) {
        const r = g.pick(out);
        r.streaming = true;
        r.ticket!.streaming();
        seen.add('streaming');
      }
    } else if (roll < 0.7) {
      op = 'target state';
      const t = g.pick(targets);
      const before = states.get(t)!;
      const next: TargetState = g.pick([
        { mode: 'blocked', availableAtMs: g.evenAfter(now(), g.int(0, 3_000)) },
        { mode: 'probing', slots: g.int(1, 3) },
        { mode: 'available', slots: g.int(1, 5) },
      ]);
      // The runtime tells the lot of every change it makes; from one open state to another the lot also looks again by itself.
      setState(t, next, before.mode === 'blocked' || next.mode === 'blocked' || g.chance(0.5));
    } else if (roll < 0.72) {
      op = 'forget';
      const t = g.pick(targets);
      lot.forget(t);
    } else {
      op = 'time passes';
      await vi.advanceTimersByTimeAsync(g.pick([1, g.int(1, 400), g.int(1, 2_500)]));
      // A blocked target's time is up: the lot wakes at availableAtMs; the runtime would say whether it is back.
      for (const t of targets) {
        const st = states.get(t)!;
        if (st.mode === 'blocked' && st.availableAtMs <= now() && g.chance(0.7)) setState(t, { mode: 'probing', slots: g.int(1, 3) }, true);
      }
    }
    await check();
  }

  // Everything leaves: nothing parked, no bytes, no gauge left over; then the lot closes.
  op = 'wind down';
  letAllGo(reqs);
  await check();
  for (const t of targets) expect(lot.waiting(t)).toBe(0);
  expect(bodies.bytes).toBe(0);
  lot.close();
  const late = newReq();
  park(late);
  await settle();
  expect(problems.filter((p) => !p.includes(`request ${late.id} `))).toEqual([]);
  for (const t of targets) lot.forget(t);
  expect(lot.size).toBe(0);
}

describe('the parking lot against the README model', () => {
  beforeEach(() => vi.useFakeTimers({ now: 1_000_000 }));
  afterEach(() => vi.useRealTimers());

  it('bounds, orders, paces, times out and forgets parked requests as the README says, through thousands of random operations', async () => {
    const seen = new Set<string>();
    for (let s = 0; s < 10 * SEEDS; s++) await runLotFuzz(BASE_SEED + s, 500, seen);
    if (process.env.FUZZ_SEEN) console.log([...seen]);
    for (const what of ['parked', 'released while available', 'released while probing', 'timeout', 'route queue full', 'bodies full', 'aborted while parked', 'parked again after a failed probe', 'streaming']) {
      expect(seen, `the runs reached: ${what}`).toContain(what);
    }
  }, 60_000 * SEEDS);
});

describe('class and fleet share', () => {
  it('takes the route\'s class, lowered and never raised by the header, whatever its case or spacing', () => {
    const g = gen(seededRandom(BASE_SEED));
    const config = poolConfig(4, undefined, CLASS_NAMES.map((name) => ({ name, minShare: 0, maxQueue: 1 })), 0.9, 1);
    const pools = new Pools(config, () => 0);
    const spell = (name: string) => g.pick([name, name.toUpperCase(), ` ${name} `, name[0]!.toUpperCase() + name.slice(1)]);
    for (let i = 0; i < 2_000; i++) {
      const route = g.pick(CLASS_NAMES);
      const asked = g.pick([undefined, 'bulk', '', ...CLASS_NAMES]);
      const got = pools.classFor(PROVIDER, route, asked === undefined ? undefined : spell(asked === '' ? ' ' : asked));
      const base = CLASS_NAMES.indexOf(route);
      const lower = asked === undefined ? -1 : CLASS_NAMES.indexOf(asked);
      expect(got, `${route}, asked ${asked}`).toBe(Math.max(base, lower));
    }
  });

  it('hands the fleet its capacity once over, each lower class its floor and the higher ones the rest', () => {
    const g = gen(seededRandom(BASE_SEED + 1));
    for (let i = 0; i < 3_000; i++) {
      const capacity = g.int(1, 200);
      const classes: PoolClass[] = CLASS_NAMES.slice(g.int(0, 1)).map((name, k) => ({ name, minShare: k === 0 ? 0 : g.pick([0, 0.1, 0.25, 0.5]), maxQueue: 1 }));
      const instances = g.int(1, 5);
      const demands = Array.from({ length: instances }, () => classes.map(() => (g.chance(0.4) ? 0 : g.int(0, 3 * capacity))));
      const fleet = classes.map((_, k) => demands.reduce((a, d) => a + d[k]!, 0));
      const shares = demands.map((own) => fleetShare(capacity, classes, own, fleet, instances));
      const label = JSON.stringify({ capacity, classes: classes.map((c) => c.minShare), demands });
      for (const share of shares) expect(share >= 0 && share <= 1, label).toBe(true);
      // "N instances do not send N times the concurrency the provider accepts": the shares add up to one pool.
      expect(shares.reduce((a, b) => a + b, 0), label).toBeCloseTo(1, 9);
    }
    // One instance all online, another all batch, both far past capacity: batch keeps its floor, online has the rest.
    for (const minShare of [0.1, 0.25, 0.5]) {
      const classes: PoolClass[] = [{ name: 'online', minShare: 0.5, maxQueue: 1 }, { name: 'batch', minShare, maxQueue: 1 }];
      const fleet = [500, 500];
      expect(fleetShare(40, classes, [500, 0], fleet, 2)).toBeCloseTo(1 - minShare, 9);
      expect(fleetShare(40, classes, [0, 500], fleet, 2)).toBeCloseTo(minShare, 9);
    }
  });
});

describe('cases the models found', () => {
  beforeEach(() => vi.useFakeTimers({ now: 0 }));
  afterEach(() => vi.useRealTimers());

  const twoClasses: PoolClass[] = [{ name: 'online', minShare: 0.5, maxQueue: 10 }, { name: 'batch', minShare: 0.1, maxQueue: 10 }];
  const slotReq = (extra: Partial<SlotRequest> = {}): SlotRequest => ({ cls: 0, target: 'p/m', retry: false, deadlineAtMs: 60_000, minAttemptMs: 0, signal: new AbortController().signal, ...extra });

  it('lets a retry waiting for the retry share go when a new fleet share grows that share but not the slots', async () => {
    // maxConcurrent 10, maxConcurrentRetries 3: at a share of 0.45, 5 slots (4.5) and 1 retry (1.35); at 0.5, still
    // 5 slots but 2 retries. The retry queued behind the first waited beside the room it had until some slot was given back.
    const pool = new Pools(poolConfig(10, 3, twoClasses, 0.9, 1), () => Date.now()).of(PROVIDER);
    pool.setShare(0.45);
    const first = await pool.acquire(slotReq({ retry: true }));
    expect(first.ok).toBe(true);
    let second: Acquired | undefined;
    void pool.acquire(slotReq({ retry: true })).then((a) => (second = a));
    await settle();
    expect(second).toBeUndefined();
    pool.setShare(0.5);
    await settle();
    expect(second).toMatchObject({ ok: true, queued: true });
    expect(pool.snapshot()).toMatchObject({ inUse: [2, 0], queued: [0, 0] });
  });

  it('lets a batch request waiting for its class limit go when a 429 judged not to be about concurrency puts the caps back', async () => {
    // A provider refusing about half of everything whatever the concurrency: the cuts of the burst took batch's cap to
    // 1 and the limit to 2; then the refusals were judged noise and the caps went back to where the burst began. The
    // batch request waiting for its cap waited beside the room until another answer came.
    vi.setSystemTime(1_000);
    const pool = new Pools(poolConfig(4, undefined, [{ name: 'online', minShare: 0, maxQueue: 10 }, { name: 'batch', minShare: 0.25, maxQueue: 10 }], 0.5, 2), () => Date.now()).of(PROVIDER);
    pool.observe('p/m', 'success', 100);
    const slots: Slot[] = [];
    for (const cls of [0, 0, 1, 1]) {
      const a = await pool.acquire(slotReq({ cls }));
      if (a.ok) slots.push(a.slot);
    }
    let waiter: Acquired | undefined;
    void pool.acquire(slotReq({ cls: 1 })).then((a) => (waiter = a));
    // Two round trips of answers, about half refused, with all four slots in flight.
    for (const [from, answers] of [[1_000, 11], [1_100, 10]] as const) {
      for (let i = 0; i < answers; i++) {
        vi.setSystemTime(from + i);
        pool.observe('p/m', i % 2 === 0 ? 'rate-limited' : 'success', 100);
      }
    }
    vi.setSystemTime(1_200);
    for (const slot of slots.slice(0, 3)) slot.release();
    await settle();
    expect(waiter, 'batch at its cap: one in flight').toBeUndefined();
    expect(pool.limitOf('p/m')).toBe(2);
    pool.observe('p/m', 'rate-limited', 100);
    await settle();
    expect(waiter).toMatchObject({ ok: true, queued: true });
    expect(pool.snapshot()).toMatchObject({ inUse: [0, 2], queued: [0, 0] });
  });
});
