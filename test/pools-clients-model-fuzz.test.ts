// Seeded model-based tests of tenant fair share (README "Tenants share a class fairly", and the parking lot's turns
// and full queue in "Retry budget, circuit breaker, hold-offs, parking"): the priority pools and the parking lot driven
// with 3 to 6 clients (one of them often flooding, sometimes the unnamed client) beside a plain model, as in
// pools-model-fuzz.test.ts (both share the pool model, test/helpers/pool-model.ts, and its driver,
// test/helpers/pool-fuzz-driver.ts; the lot request and its plain questions, test/helpers/lot-model.ts; the generator
// and the pool's config, test/helpers/model-fuzz.ts). Beside the model's answers, after every step: slots within the
// limits; each class's per-client counts (snapshot().clients) equal both the model's and those the answers given so
// far imply; the waiting bodies' bytes equal the bodies still waiting; every request answered once (granted, shed,
// aborted; in the lot released, full, timeout, aborted); a displaced request is of a client with at least the
// newcomer's own + 2 waiting (the fullest), never of a higher class nor one the lot released; a freed slot goes to the
// eligible client holding the fewest of its class's slots, in the pools and the lot.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { createMetrics, type Metrics } from '../src/observability/metrics.ts';
import { ParkingLot, type TargetState } from '../src/pipeline/parking-lot.ts';
import { seededRandom } from '../src/policy/random.ts';
import type { SlotRequest } from '../src/pools/provider-pool.ts';
import { WaitingBodies } from '../src/pools/waiting-bodies.ts';
import { flexTierKey, isFlexTierKey, targetOfHoldOffKey } from '../src/state/hold-offs.ts';
import { gen, MAX_BODY_BYTES, settle, type Gen } from './helpers/model-fuzz.ts';
import { beginWait, expectRouteQueues, letAllGo, lotQueries, parkOptions, takeOutcome, unparked, type LotOutcome, type LotReq as BaseLotReq } from './helpers/lot-model.ts';
import { PoolFuzzDriver } from './helpers/pool-fuzz-driver.ts';
import type { PoolReq } from './helpers/pool-model.ts';

/**
 * A failing case names its seed and step. FUZZ_SEED moves the runs to other seeds and FUZZ_SEEDS multiplies how many
 * (`FUZZ_SEEDS=30 npx vitest run test/pools-clients-model-fuzz.test.ts` for a longer hunt); the default stays within seconds.
 * FUZZ_TRACE=1 prints the lot's keys, parked and released requests after each step (with FUZZ_STEPS and -t to narrow).
 */
const SEEDS = Number(process.env.FUZZ_SEEDS ?? 1);
const BASE_SEED = Number(process.env.FUZZ_SEED ?? 20_250_611);
/** Steps per seed (FUZZ_STEPS): longer histories reach states short ones do not. */
const STEPS = Number(process.env.FUZZ_STEPS ?? 500);


/** 3 to 6 clients; the first floods (it sends about half the requests); the last is sometimes the unnamed one (''). */
function clientsOf(g: Gen): { names: string[]; next: () => string } {
  const names = ['ann', 'bob', 'cat', 'dan', 'eve', 'fay'].slice(0, g.int(3, 6));
  if (g.chance(0.4)) names[names.length - 1] = '';
  const flood = g.pick([0.3, 0.5, 0.7]);
  return { names, next: () => (g.chance(flood) ? names[0]! : g.pick(names)) };
}

/** Bodies from nothing to past the cap: the cap (batch: half of it) is often near. */
function bodyBytes(g: Gen): number {
  return g.pick([0, g.int(0, 300), g.int(200, 600), g.int(500, 1_200)]);
}


// ------------------------------------------------------------------------------------------------------------------
// The provider pool, with clients.
// ------------------------------------------------------------------------------------------------------------------

/** A request of the pool fuzz with clients: the model's, and what the driver tracks besides. */
interface ClientPoolReq extends PoolReq {
  /** The driver gave the pool's slot back. */
  gaveBack: boolean;
  /** The check that first saw its answer. */
  answeredAt?: number;
}

/** Per class, per client (by name): slots held and requests waiting, as a sorted plain object. */
type ClientCounts = Array<Record<string, { held: number; waiting: number }>>;

function sortedCounts(entries: Iterable<readonly [string, { held: number; waiting: number }]>): Record<string, { held: number; waiting: number }> {
  return Object.fromEntries([...entries].map(([n, u]) => [n, { held: u.held, waiting: u.waiting }] as const).sort((a, b) => (a[0] < b[0] ? -1 : 1)));
}

async function runPoolFuzz(seed: number, steps: number, seen: Set<string>): Promise<{ steps: number }> {
  const g: Gen = gen(seededRandom(seed));
  /** Every answer the pool gives is a wait (granted) or a shed; an abort is neither. */
  const told = { waits: 0, sheds: 0 };
  const d = new PoolFuzzDriver<ClientPoolReq>(seed, g, seen, () => (g.chance(0.7) ? g.int(1, 8) : g.int(8, 24)), { onWait: () => told.waits++, onShed: () => told.sheds++ });
  const { classes, bodies, pools, pool, model, targets, reqs, now, where } = d;
  const classCount = classes.length;
  const clients = clientsOf(g);
  /** Requests the parking lot released: a few, or many (a release after an outage). */
  const releasedShare = g.pick([0.05, 0.1, 0.3]);
  /** Sometimes most of one client's requests come from the lot (its backlog released after an outage). */
  const releasedClient = g.chance(0.3) ? g.pick(clients.names) : undefined;
  /** How busy: the share of steps that bring a newcomer. */
  const arrivals = g.pick([0.3, 0.4, 0.55]);
  /** Checks so far: a request's answer is dated by the check that first sees it. */
  let checks = 0;
  /** A newcomer to a full queue this step, and each class's waiters per client (by the answers so far) before it came. */
  let door: { p: ClientPoolReq; waiting: Map<string, number>; releasedOnly: Set<string> } | undefined;
  let waitingBeforeStep = new Set<ClientPoolReq>();

  const newReq = (): ClientPoolReq => {
    const cls = g.int(0, classCount - 1);
    const ctrl = new AbortController();
    if (g.chance(0.03)) ctrl.abort();
    const client = clients.next();
    const req: SlotRequest = {
      cls,
      target: g.pick(targets),
      retry: g.chance(0.25),
      deadlineAtMs: g.evenAfter(now(), g.int(0, 20_000)),
      minAttemptMs: g.pick([0, 200, 1_000]),
      signal: ctrl.signal,
      ...(g.chance(client === releasedClient ? 0.95 : releasedShare) && { released: true }),
      ...(g.chance(0.85) && { bodyBytes: bodyBytes(g) }),
      ...(client !== '' || g.chance(0.5) ? { client } : {}),
    };
    return { id: reqs.length, req, client, ctrl, state: 'done', seq: -1, grantedAtMs: 0, answered: false, slotGiven: false, gaveBack: false };
  };
  /** What the pool's answers so far say: requests holding a slot, and requests not answered yet. */
  const holding = () => reqs.filter((p) => p.actual?.ok === true && !p.gaveBack);
  const waitingNow = () => reqs.filter((p) => p.actual === undefined);
  const countsFromAnswers = (named: boolean): ClientCounts =>
    classes.map((_, k) => {
      const m = new Map<string, { held: number; waiting: number }>();
      const add = (p: ClientPoolReq, what: 'held' | 'waiting') => {
        if (p.req.cls !== k || (named && p.client === '')) return;
        const u = m.get(p.client) ?? { held: 0, waiting: 0 };
        u[what]++;
        m.set(p.client, u);
      };
      for (const p of holding()) add(p, 'held');
      for (const p of waitingNow()) add(p, 'waiting');
      return sortedCounts(m);
    });

  const check = async (): Promise<void> => {
    await settle();
    expect(d.actualOrder, `order of the queue's answers, ${where()}`).toEqual(model.order);
    // A freed slot went to the eligible waiting client holding the fewest of the class's slots (the order above is
    // the pool's; eligibility is the pool's #first: admissible, and under a floor, of a target under it).
    for (const id of d.actualOrder) {
      const a = reqs[id]!.actual;
      const f = model.fair.get(id);
      if (!a?.ok || !a.queued || f === undefined) continue;
      if (f.clients > 1) seen.add('fair grant between clients');
      if (f.clients > 1 && f.held > 0 && f.held === f.fewestOther) seen.add('fair grant, ties on slots held');
      expect(f.held, `request ${id} (client ${reqs[id]!.client}) granted holding ${f.held} of its class's slots while another eligible client held ${f.fewestOther}, ${where()}`).toBeLessThanOrEqual(f.fewestOther);
    }
    model.fair.clear();
    d.actualOrder = [];
    model.order = [];
    d.expectTouchedAgree((p) => `request ${p.id} (class ${p.req.cls}, client '${p.client}', ${p.req.target}${p.req.retry ? ', retry' : ''}${p.req.released ? ', released' : ''})`);
    // Displaced this step: waiting before, shed queue_full now. Only a newcomer to a full queue displaces, one at most,
    // of its class, not released by the lot, of a client then with at least its own + 2 waiting, and the fullest such.
    const displaced = [...waitingBeforeStep].filter((p) => p.actual?.ok === false && p.actual.reason === 'queue_full');
    if (displaced.length > 0) {
      seen.add('displaced');
      expect(displaced.length, `displaced at once, ${where()}`).toBe(1);
      expect(door, `request ${displaced[0]!.id} displaced with no newcomer at the door, ${where()}`).toBeDefined();
      const v = displaced[0]!;
      const { p, waiting, releasedOnly } = door!;
      const own = waiting.get(p.client) ?? 0;
      const theirs = waiting.get(v.client) ?? 0;
      const label = `request ${v.id} (class ${v.req.cls}, client '${v.client}', ${theirs} waiting) displaced by request ${p.id} (class ${p.req.cls}, client '${p.client}', ${own} waiting), ${where()}`;
      expect(v.req.cls, label).toBe(p.req.cls);
      expect(v.req.released ?? false, label).toBe(false);
      expect(theirs, label).toBeGreaterThanOrEqual(own + 2);
      const fullest = Math.max(...[...waiting].filter(([c, n]) => n >= own + 2 && !releasedOnly.has(c)).map(([, n]) => n));
      expect(theirs, `not the fullest: ${label}`).toBe(fullest);
      if ([...waiting].some(([c, n]) => n >= own + 2 && releasedOnly.has(c))) seen.add('displaced past a client of released waiters only');
      expect(p.actual === undefined || p.actual.ok, `the newcomer that displaced is answered ${JSON.stringify(p.actual)}: ${label}`).toBe(true);
      if (v.client === '' || p.client === '') seen.add('displaced with the unnamed client');
    }
    door = undefined;
    const snap = pool.snapshot();
    expect(snap.inUse, `in use by class, ${where()}`).toEqual(model.inUseByClass);
    expect(snap.queued, `queued by class, ${where()}`).toEqual(classes.map((_, k) => model.queuedOf(k)));
    // Per client: the pool's counts, those its answers imply, and the model's.
    const fromAnswers = countsFromAnswers(true);
    expect(snap.clients.map((c) => sortedCounts(c)), `per-client counts against the answers, ${where()}`).toEqual(fromAnswers);
    const modelCounts = model.clients.map((m) => sortedCounts([...m].filter(([n]) => n !== '')));
    expect(modelCounts, `per-client counts against the model, ${where()}`).toEqual(fromAnswers);
    for (const [k, m] of model.clients.entries()) for (const [n, u] of m) expect({ n, k, waiting: u.waiting }, where()).toEqual({ n, k, waiting: model.waitingOf(k, n) });
    for (const [key, t] of model.targets) expect(pool.limitOf(key), `${key}'s limit, ${where()}`).toBeCloseTo(Math.min(t.limit.limit, model.capacity), 9);
    // Bytes: the bodies still waiting, by the answers.
    expect(bodies.bytes, `waiting body bytes, ${where()}`).toBe(waitingNow().reduce((a, p) => a + (p.req.bodyBytes ?? 0), 0));
    expect(bodies.bytes, `waiting body bytes against the model, ${where()}`).toBe(model.bytes);
    // Every answer once: each one the pool counted is an answer given, no more.
    const answered = reqs.filter((p) => p.actual !== undefined);
    expect(told.waits + told.sheds + answered.filter((p) => !p.actual!.ok && p.actual!.reason === 'aborted').length, `answers counted against answers given, ${where()}`).toBe(answered.length);
    // Slots within the limits: the pool never grants past its capacity or the retry share (a share that shrank may
    // leave more in use, with no grant until it is back under).
    const inUse = holding().length;
    const grantedNow = holding().filter((p) => p.answeredAt === checks);
    if (inUse > model.capacity) {
      seen.add('over capacity after a share shrank');
      expect(grantedNow.map((p) => p.id), `granted with ${inUse} in use, capacity ${model.capacity}, ${where()}`).toEqual([]);
    }
    const retriesHeld = holding().filter((p) => p.req.retry).length;
    if (retriesHeld > model.retryCapacity) {
      expect(grantedNow.filter((p) => p.req.retry).map((p) => p.id), `retries granted with ${retriesHeld} in flight, retry share ${model.retryCapacity}, ${where()}`).toEqual([]);
    }
    checks++;
    for (const [k, c] of classes.entries()) {
      const newcomers = model.queue.filter((w) => w.req.cls === k && !w.req.released).length;
      expect(newcomers, `class ${k}'s queue, ${where()}`).toBeLessThanOrEqual(c.maxQueue);
    }
    const idle = model.idleWhileWaiting();
    expect(idle && `request ${idle.id} (class ${idle.req.cls}, ${idle.req.target}) waits beside a slot it could take`, `lost wake-up, ${where()}`).toBeUndefined();
    if (model.queue.length > 0) seen.add('waiting');
    if (new Set(model.queue.map((w) => w.client)).size >= 3) seen.add('three clients waiting');
  };

  /** The driver's acquire, noting first who waits in the class when the newcomer comes to a full queue (it may displace). */
  const acquire = (p: ClientPoolReq): void => {
    if (!p.req.released && model.queuedOf(p.req.cls) >= classes[p.req.cls]!.maxQueue) {
      const waiting = new Map<string, number>();
      const unreleased = new Map<string, number>();
      for (const w of waitingNow()) {
        if (w.req.cls !== p.req.cls || w === p) continue;
        waiting.set(w.client, (waiting.get(w.client) ?? 0) + 1);
        if (!w.req.released) unreleased.set(w.client, (unreleased.get(w.client) ?? 0) + 1);
      }
      door = { p, waiting, releasedOnly: new Set([...waiting.keys()].filter((c) => !unreleased.has(c))) };
      seen.add('full queue');
    }
    d.acquire(p, () => (p.answeredAt = checks));
  };

  await d.run(steps, {
    mix: [
      [arrivals, 'acquire'],
      [0.6, 'release'],
      [0.66, 'abort a waiter'],
      [0.69, 'release and abort, one tick'],
      [0.76, 'success'],
      [0.81, '429'],
      [0.82, 'recovered'],
      [0.84, 'hold lower classes'],
      [0.87, 'fleet share'],
    ],
    newReq,
    check,
    acquire,
    gaveBack: (p) => (p.gaveBack = true),
    // Displacement is judged against what waited before the step (or the timer moment).
    beforeStep: () => (waitingBeforeStep = new Set(waitingNow())),
  });

  // Everything given back or cancelled: every request answered once, nothing in use or waiting, no bytes held.
  d.op = 'wind down';
  waitingBeforeStep = new Set();
  await d.windDown();
  expect(reqs.filter((p) => p.actual === undefined).map((p) => p.id), `never answered, ${where()}`).toEqual([]);
  expect(pool.snapshot().inUse.every((n) => n === 0) && pool.snapshot().queued.every((n) => n === 0), where()).toBe(true);
  expect(pool.snapshot().clients.flat(), `clients left, ${where()}`).toEqual([]);
  pools.close();
  return { steps };
}

describe('the provider pool with clients against the README model', () => {
  beforeEach(() => vi.useFakeTimers({ now: 1_000_000 }));
  afterEach(() => vi.useRealTimers());

  it('shares each class between clients, displaces the fullest client and counts each client as the README says', async () => {
    const seen = new Set<string>();
    let steps = 0;
    for (let s = 0; s < 8 * SEEDS; s++) steps += (await runPoolFuzz(BASE_SEED + s, STEPS, seen)).steps;
    if (process.env.FUZZ_SEEN) console.log('pool', steps, 'steps', [...seen]);
    for (const what of ['waiting', 'three clients waiting', 'granted at once', 'full queue', 'displaced', 'fair grant between clients', 'shed queue_full', 'shed deadline', 'shed body_bytes', 'aborted while queued']) {
      expect(seen, `the runs reached: ${what}`).toContain(what);
    }
  }, 60_000 * SEEDS);
});

// ------------------------------------------------------------------------------------------------------------------
// The parking lot, with clients.
// ------------------------------------------------------------------------------------------------------------------

/** A request of the lot fuzz with clients: the shared one, with its client and the key it parks under. */
interface LotReq extends BaseLotReq {
  /** The key it parks under: its target's, or (a flex-tier request) its target's flex key. */
  key: string;
  flex: boolean;
  client: string;
  /** The model has it displaced by a newcomer (answered full while parked). */
  displacedBy?: { newcomer: LotReq; counts: Map<string, number> };
}

/**
 * The flex tier in the lot fuzz. 'off': no flex keys (the draws of the runs before it). 'coupled': as production's
 * targetStateOf composes it, the flex key stands where its target does but for its own hold-off (a 498), which holds
 * it alone, ends by the clock (no notify: the lot's own timer) and may be extended. 'independent': each key's state is
 * scripted on its own (blocked, probing, available with any slots), which production never does (a flex key's slots
 * are its target's); there the pump's one order may keep a request whose key has a slot behind one of the other key
 * that has none ("one that may not go now holds back every one after it"), which the check allows only there.
 */
type FlexMode = 'off' | 'coupled' | 'independent';

async function runLotFuzz(seed: number, steps: number, seen: Set<string>, flexMode: FlexMode = 'off'): Promise<{ steps: number }> {
  const g: Gen = gen(seededRandom(seed));
  const now = () => Date.now();
  const targets = ['p/a', 'p/b'].slice(0, g.int(1, 2));
  const withFlex = flexMode !== 'off';
  /** Every key requests park under: the targets', then (with the flex tier) their flex keys. */
  const keys = withFlex ? [...targets, ...targets.map(flexTierKey)] : targets;
  /** The keys whose state the run scripts (a coupled flex key's is derived from its target's and its own hold-off). */
  const scripted = flexMode === 'independent' ? keys : targets;
  const keysOf = (t: string) => (withFlex ? [t, flexTierKey(t)] : [t]);
  const routes = new Map(['chat', 'batch-chat'].map((r) => [r, g.chance(0.7) ? g.int(2, 8) : g.int(8, 24)]));
  const minAttemptMs = g.pick([0, 200, 1_000]);
  const classes = g.pick([1, 2, 3, 3]);
  const clients = clientsOf(g);
  /**
   * Release windows with every moment 0 (the lot's random), or drawn: with moments 0, a request parked while its
   * target was away may go as soon as the target is back, so who may go when a release is made is known at once;
   * drawn, only a second after the target came back (and after it parked).
   */
  const zeroSpread = g.chance(0.5);
  const states = new Map<string, TargetState>(scripted.map((t) => [t, { mode: 'blocked', availableAtMs: g.evenAfter(now(), g.int(0, 3_000)) }]));
  /** Coupled: when each target's flex tier's own hold-off ends (a 498's), if one was ever started. */
  const flexHold = new Map<string, number>();
  /** Where a key stands at `atMs`: the lot's stateOf. */
  const stateOfKey = (key: string, atMs = now()): TargetState => {
    if (flexMode !== 'coupled' || !isFlexTierKey(key)) return states.get(key)!;
    const target = targetOfHoldOffKey(key);
    const ts = states.get(target)!;
    const held = flexHold.get(target);
    if (held === undefined || held <= atMs) return ts;
    return { mode: 'blocked', availableAtMs: ts.mode === 'blocked' ? Math.max(held, ts.availableAtMs) : held };
  };
  /** Coupled: the flex keys' states as last seen, to date their changes. */
  const derived = new Map<string, string>();
  const stateSince = new Map<string, number>(keys.map((t) => [t, now()]));
  /** When each key last came back from being blocked. */
  const backAt = new Map<string, number>(keys.map((t) => [t, Number.NEGATIVE_INFINITY]));
  /** When a parked request of each target last left unreleased (timed out, aborted, displaced): no pump follows. */
  const leftAt = new Map<string, number>();
  const bodies = new WaitingBodies(MAX_BODY_BYTES);
  const metrics: Metrics = createMetrics({ defaultMetrics: false });
  /** Outcomes of waits the lot reported (answers at the door are taken out), in the order their promises settle: [kind, when, target pumped]. */
  const outcomes: Array<LotOutcome<Map<string, TargetState>>> = [];
  let reported = 0;
  let answers = 0;
  let parkCalls = 0;
  let pumped: string | undefined;
  const lot = new ParkingLot({
    now,
    random: zeroSpread ? () => 0 : g.random,
    stateOf: (key) => {
      pumped = targetOfHoldOffKey(key);
      return stateOfKey(key);
    },
    onParkedChange: (route, delta) => metrics.parked.inc({ route }, delta),
    onOutcome: (route, outcome) => {
      reported++;
      metrics.parkOutcomes.inc({ route, outcome });
      outcomes.push([outcome, now(), outcome === 'released' ? pumped : undefined, outcome === 'released' ? new Map(keysOf(pumped!).map((k) => [k, stateOfKey(k)])) : undefined]);
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
  /** The request whose park() call is being answered (until its own answer is handled), and the releases it let go to judge then. */
  let newcomer: LotReq | undefined;
  let judging: Array<(newcomerReleased: boolean) => void> = [];
  /** Those released in the newcomer's park() call before its own answer is handled (they may have gone after it). */
  let sameCall: LotReq[] = [];
  const judgeAll = (newcomerReleased: boolean) => {
    for (const judge of judging) judge(newcomerReleased);
    judging = [];
    sameCall = [];
    newcomer = undefined;
  };

  const { parked, inflight, cutoff, ahead } = lotQueries(reqs, minAttemptMs);
  /**
   * Surely past its moment in the release window at `atMs`: its own notBeforeMs passed (or the target was away since
   * it parked: the window after decides), and its window moment too: within a second of it parking (a newcomer waits
   * for the window in force) or of the target coming back; with moments 0, at once once its target was away.
   */
  /**
   * When a key last came back, as of `atMs`: a coupled flex key's hold-off ends by the clock, and the lot may release by
   * it (its own timer) before the run dates the change after the time step.
   */
  const backAtOf = (key: string, atMs: number) => {
    const b = backAt.get(key)!;
    if (flexMode !== 'coupled' || !isFlexTierKey(key)) return b;
    const held = flexHold.get(targetOfHoldOffKey(key));
    return held !== undefined && held <= atMs && stateOfKey(key, atMs).mode !== 'blocked' ? Math.max(b, held) : b;
  };
  const mayGo = (a: LotReq, atMs: number) => {
    if (a.notBeforeMs !== undefined && a.notBeforeMs > atMs && !a.awaySincePark) return false;
    if (zeroSpread && a.awaySincePark) return true;
    return atMs >= Math.max(a.parkedAtMs, a.awaySincePark ? backAtOf(a.key, atMs) : Number.NEGATIVE_INFINITY) + 1_000;
  };
  /** Has the request a slot under `state` (its key's): fewer of its class and the higher ones out on its target, over both tiers. */
  const hasSlot = (a: LotReq, state: TargetState, extra = 0) => state.mode !== 'blocked' && inflight(a.target, a.cls, state.mode === 'probing') + extra < state.slots;
  /** Released requests of a class still out on a target, of a client. */
  const out = (target: string, cls: number, client: string) => reqs.filter((x) => x.state === 'released' && x.target === target && x.cls === cls && x.client === client).length;

  /** The wait ended at `atMs` with `kind`: check it against the README. */
  const ended = (r: LotReq, kind: string, atMs: number, releasedFrom: string | undefined, statesThen: Map<string, TargetState> | undefined, judged = true, others: LotReq[] = []) => {
    const waited = r.parkedMs + (atMs - r.parkedAtMs);
    r.parkedMs = waited;
    if (kind === 'released') {
      // Released by its own key's state: a flex request by its tier's (held off alone, it stays even with its target
      // available), a default-tier one by its target's (never held by the flex tier's hold-off).
      const state = statesThen!.get(r.key)!;
      seen.add(`released while ${state.mode}`);
      if (r.flex) {
        seen.add('flex released');
        if (statesThen!.get(r.target)!.mode === 'probing' && state.mode === 'probing') seen.add('flex released as a probe');
      } else if (withFlex && statesThen!.get(flexTierKey(r.target))!.mode === 'blocked') seen.add('default released while the flex tier is blocked');
      if (r.state !== 'parked') fail(`request ${r.id} released while the model has it ${r.state}`);
      if (releasedFrom !== r.target) fail(`request ${r.id} released by a pump of ${releasedFrom}, parked for ${r.target}`);
      if (state.mode === 'blocked') fail(`request ${r.id} released while ${r.key} is blocked`);
      if (atMs >= cutoff(r)) fail(`request ${r.id} released with ${r.deadlineAtMs - atMs} ms left (minAttemptMs ${minAttemptMs})`);
      if (r.maxWaitMs !== undefined && waited > r.maxWaitMs) fail(`request ${r.id} released after ${waited} ms parked in all (maxWaitMs ${r.maxWaitMs})`);
      if (r.notBeforeMs !== undefined && !r.awaySincePark && atMs < r.notBeforeMs) fail(`request ${r.id} released at ${atMs}, before its notBeforeMs ${r.notBeforeMs}`);
      // Turns: of the requests of its class on its target that could go too (a slot for one is a slot for all of the
      // class there), none of a client with fewer of the class out, and none of its own client's ahead of it.
      const mine = out(r.target, r.cls, r.client);
      // With flex keys, a rival's own key must let it go then, with a slot (coupled, a slot for one is one for all of
      // the class; independent, the keys' slots differ: counted as if a newcomer released in the same call were out).
      const pending = newcomer !== undefined && newcomer !== r && newcomer.target === r.target ? 1 : 0;
      const rivals = parked(r.target)
        .filter((a) => a !== r && a.cls === r.cls && atMs < cutoff(a) && mayGo(a, atMs))
        .filter((a) => !withFlex || a.key === r.key || (flexMode === 'coupled' ? statesThen!.get(a.key)!.mode !== 'blocked' : hasSlot(a, statesThen!.get(a.key)!, pending)))
        .map((a) => ({ a, theirs: out(r.target, r.cls, a.client) }));
      const judge = (newcomerReleased: boolean) => {
        for (const { a, theirs: counted } of rivals) {
          // The newcomer released in its own park() call may have gone before this one: not a rival then, and out.
          if (newcomerReleased && a === newcomer) continue;
          const theirs = counted + (newcomerReleased && newcomer !== undefined && newcomer !== r && newcomer.client === a.client && newcomer.target === r.target && newcomer.cls === r.cls ? 1 : 0);
          if (a.client === r.client) {
            if (ahead(a, r)) fail(`request ${r.id} (client '${r.client}', deadline ${r.deadlineAtMs}) released ahead of its client's request ${a.id} (deadline ${a.deadlineAtMs})`);
            continue;
          }
          seen.add('released between clients');
          if (theirs < mine) fail(`request ${r.id} (client '${r.client}', ${mine} of class ${r.cls} out) released before request ${a.id} (client '${a.client}', ${theirs} out)`);
          if (theirs === mine && mine > 0) seen.add('released between clients with as many out');
        }
      };
      // Within a park() call, the newcomer's own answer is handled after the others the call settled (its promise is
      // only then awaited): judged once it is known whether the newcomer went too.
      if (newcomer !== undefined && newcomer !== r) judging.push(judge);
      else if (judged) judge(false);
      r.state = 'released';
      r.streaming = false;
      if (newcomer !== undefined && newcomer !== r) sameCall.push(r);
      // Independent keys' slots differ: released in the same call under the other key's larger limit, others may
      // have gone after the newcomer (with one limit, whatever order they went in, all fit in it).
      const later = flexMode === 'independent' ? others.filter((x) => x.target === r.target && x.cls <= r.cls && x.key !== r.key && x.state === 'released').length : 0;
      if (state.mode !== 'blocked' && inflight(r.target, r.cls, state.mode === 'probing') - later > state.slots) {
        fail(`request ${r.id} (class ${r.cls}${r.flex ? ', flex' : ''}) released beyond ${state.mode} slots ${state.slots}: ${inflight(r.target, r.cls, state.mode === 'probing')} out`);
      }
      return;
    }
    if (kind === 'full') {
      // Displaced: only by a newcomer to the route's full queue, of a client then with at least its own + 2 parked on
      // the route, the fullest, of the newcomer's class or a lower one.
      const by = r.displacedBy;
      if (by === undefined) return fail(`request ${r.id} (client '${r.client}') answered full while parked, the model has it ${r.state}`);
      const n = by.newcomer;
      const own = by.counts.get(n.client) ?? 0;
      const theirs = by.counts.get(r.client) ?? 0;
      const label = `request ${r.id} (class ${r.cls}, client '${r.client}', ${theirs} parked on ${r.route}) displaced by request ${n.id} (class ${n.cls}, client '${n.client}', ${own} parked)`;
      if (r.cls < n.cls) fail(`${label}: a higher class`);
      if (theirs < own + 2) fail(`${label}: not two more`);
      const fullest = Math.max(...reqs.filter((x) => (x.state === 'parked' || x === r) && x.route === r.route && x.cls >= n.cls).map((x) => by.counts.get(x.client) ?? 0));
      if (theirs !== fullest) fail(`${label}: not the fullest (${fullest})`);
      r.displacedBy = undefined;
      seen.add('displaced');
      if (r.cls > n.cls) seen.add('displaced a lower class');
    }
    if (r.state !== 'parked' && kind !== 'full') fail(`request ${r.id} answered ${kind} while the model has it ${r.state}`);
    r.state = 'done';
    leftAt.set(r.target, atMs);
    if (kind === 'timeout') {
      seen.add('timeout');
      const due = Math.min(r.parkedAtMs + (r.waitLeftMs ?? Number.POSITIVE_INFINITY), cutoff(r));
      if (atMs !== Math.max(due, r.parkedAtMs)) fail(`request ${r.id} timed out at ${atMs}, due at ${due}`);
    }
  };

  const park = (r: LotReq, notBeforeMs?: number): void => {
    const before = outcomes.length;
    parkCalls++;
    beginWait(r, now(), notBeforeMs);
    r.awaySincePark = stateOfKey(r.key).mode === 'blocked';
    r.seq = seq++;
    // The model's answer at the door: the route's queue (a fuller client's newest of the class or a lower one gives
    // its place), the client gone, the bodies' bytes (the displaced one's given back).
    const onRoute = reqs.filter((x) => x.state === 'parked' && x.route === r.route);
    const counts = new Map<string, number>();
    for (const x of onRoute) counts.set(x.client, (counts.get(x.client) ?? 0) + 1);
    const full = onRoute.length >= routes.get(r.route)!;
    let victim: LotReq | undefined;
    if (full) {
      const own = counts.get(r.client) ?? 0;
      for (const e of onRoute) {
        const n = counts.get(e.client)!;
        if (e.cls < r.cls || n < own + 2) continue;
        const best = victim === undefined ? -1 : counts.get(victim.client)!;
        if (n > best || (n === best && e.seq > victim!.seq)) victim = e;
      }
      seen.add('route queue full');
    }
    const cap = r.lowest ? bodies.maxBytes / 2 : bodies.maxBytes;
    const parkedBytes = parked().reduce((a, x) => a + x.bytes, 0) - (victim?.bytes ?? 0);
    const expected = full && !victim ? 'full' : r.ctrl.signal.aborted ? 'aborted' : parkedBytes > 0 && parkedBytes + r.bytes > cap ? 'full' : 'parked';
    if (expected === 'full' && !full) seen.add('bodies full');
    if (victim && expected === 'parked' && parkedBytes + victim.bytes > 0 && parkedBytes + victim.bytes + r.bytes > cap) seen.add('parked in the place of a displaced body');
    if (victim && expected === 'full') seen.add('too large for a displaced body\'s place');
    if (expected === 'parked' && victim) {
      victim.state = 'done';
      victim.displacedBy = { newcomer: r, counts };
    }
    r.state = expected === 'parked' ? 'parked' : 'done';
    const immediate = expected !== 'parked';
    void lot
      .park(r.key, { ...parkOptions(r, routes.get(r.route)!, minAttemptMs), ...(r.client !== '' || g.chance(0.5) ? { client: r.client } : {}) })
      .then((res) => {
        answers++;
        // The newcomer's own release, handled after the others of its call: judged only if it went alone.
        const judged = newcomer !== r || judging.length === 0;
        const others = newcomer === r ? sameCall : [];
        if (newcomer === r) judgeAll(res.kind === 'released');
        if (immediate) {
          if (res.kind !== expected) fail(`request ${r.id} (client '${r.client}') answered ${res.kind} at the door, the model ${expected}`);
          return;
        }
        const o = takeOutcome(outcomes, res.kind, r.target);
        if (o === undefined) return fail(`request ${r.id} answered ${res.kind}, which the lot did not report`);
        if (res.kind === 'released') r.ticket = res.ticket;
        ended(r, res.kind, o[1], o[2], o[3], judged, others);
      });
    // Answered at the door: the lot's first outcome in the call is the answer. Parked in a victim's place: the first is the victim's.
    const first = outcomes[before];
    if (!immediate) newcomer = r;
    if (immediate) {
      if (first?.[0] === expected) outcomes.splice(before, 1);
      else fail(`request ${r.id} (client '${r.client}') not answered ${expected} at the door (the lot reported ${first?.[0]})`);
    } else if (victim && first?.[0] !== 'full') fail(`request ${r.id} (client '${r.client}') parked without displacing request ${victim.id} (client '${victim.client}')`);
  };

  const newReq = (): LotReq => {
    const ctrl = new AbortController();
    if (g.chance(0.03)) ctrl.abort();
    const cls = g.int(0, classes - 1);
    const target = g.pick(targets);
    const flex = withFlex && g.chance(0.45);
    const r: LotReq = {
      id: reqs.length,
      target,
      key: flex ? flexTierKey(target) : target,
      flex,
      route: g.pick([...routes.keys()]),
      cls,
      client: clients.next(),
      deadlineAtMs: g.evenAfter(now(), g.int(0, 12_000)),
      maxWaitMs: g.chance(0.5) ? undefined : g.int(0, 6_000),
      bytes: g.chance(0.8) ? bodyBytes(g) : 0,
      lowest: classes > 1 && cls === classes - 1,
      ctrl,
      ...unparked(now()),
    };
    reqs.push(r);
    return r;
  };

  const check = async (): Promise<void> => {
    await settle();
    judgeAll(false);
    if (problems.length > 0) expect.fail(problems.join('\n'));
    expect(outcomes, `outcomes without a request, ${where()}`).toEqual([]);
    expect(answers, `answers against outcomes reported, ${where()}`).toBe(reported);
    expect(reqs.filter((r) => r.displacedBy !== undefined).map((r) => r.id), `displaced and never answered, ${where()}`).toEqual([]);
    for (const key of keys) {
      // A flex newcomer queues behind those parked under its key or its target's; a default-tier one never behind flex ones.
      const t = targetOfHoldOffKey(key);
      const mine = parked(t).filter((r) => r.key === key || r.key === t);
      expect(lot.waiting(key), `${key} waiting, ${where()}`).toBe(mine.length);
      for (let k = 0; k < classes; k++) expect(lot.waiting(key, k), `${key} waiting up to class ${k}, ${where()}`).toBe(mine.filter((r) => r.cls <= k).length);
      if (key !== t && mine.some((r) => r.key === t) && mine.some((r) => r.key === key)) seen.add('flex and default parked together');
    }
    // No lost wake-up: a request whose own key has let requests go, with a slot, for a while (past any release window:
    // its key's, and for a flex one its target's, which flex newcomers queue behind) is not parked still.
    for (const r of parked()) {
      const state = stateOfKey(r.key);
      if (state.mode === 'blocked' || now() - stateSince.get(r.key)! < 1_250) continue;
      if (r.flex && now() - backAt.get(r.target)! < 1_250) continue;
      if (r.notBeforeMs !== undefined && r.notBeforeMs > now() - 250) continue;
      if (!hasSlot(r, state)) continue;
      if (flexMode === 'independent') {
        // The other key's state, changed unnotified, is not yet the lot's (its re-check comes within 250 ms).
        if (keysOf(r.target).some((k) => now() - stateSince.get(k)! < 1_250)) continue;
        // Nor is a blocker that left (timed out, aborted): leaving pumps nothing, the re-check 250 ms on does.
        if (now() - (leftAt.get(r.target) ?? Number.NEGATIVE_INFINITY) < 300) continue;
        // The pump's one order: an entry ahead that may not go for want of a slot (its key's) holds back every one after it.
        const blocker = parked(r.target).find((a) => a !== r && a.key !== r.key && ahead(a, r) && stateOfKey(a.key).mode !== 'blocked' && !hasSlot(a, stateOfKey(a.key)));
        if (blocker) {
          seen.add(r.flex ? 'flex held behind a default-tier request with no slot' : 'default held behind a flex request with no slot');
          continue;
        }
      }
      expect.fail(`request ${r.id} (class ${r.cls}${r.flex ? ', flex' : ''}) still parked on ${r.key}, ${state.mode} with ${state.slots} slots for ${now() - stateSince.get(r.key)!} ms, ${where()}`);
    }
    await expectRouteQueues(reqs, routes, metrics, where());
    expect(bodies.bytes, `waiting body bytes, ${where()}`).toBe(parked().reduce((a, r) => a + r.bytes, 0));
    if (new Set(parked().map((r) => r.client)).size >= 3) seen.add('three clients parked');
  };

  /** A key's state changed to `next` (as the lot will read it): dates it, and marks its parked as away when blocked. */
  const changed = (key: string, before: TargetState, next: TargetState) => {
    if (before.mode === 'blocked' && next.mode !== 'blocked') backAt.set(key, now());
    stateSince.set(key, now());
    if (next.mode === 'blocked') for (const r of parked()) if (r.key === key) r.awaySincePark = true;
  };
  /** Coupled: the flex keys' states follow their targets' and their own hold-offs (which end by the clock). */
  const deriveFlex = () => {
    if (flexMode !== 'coupled') return;
    for (const t of targets) {
      const key = flexTierKey(t);
      const next = stateOfKey(key);
      const was = derived.get(key);
      if (was === JSON.stringify(next)) continue;
      derived.set(key, JSON.stringify(next));
      changed(key, was === undefined ? next : (JSON.parse(was) as TargetState), next);
    }
  };
  deriveFlex();
  const setState = (t: string, next: TargetState, notify: boolean) => {
    changed(t, states.get(t)!, next);
    states.set(t, next);
    deriveFlex();
    // Either key of a target wakes its one queue.
    if (notify) lot.notify(withFlex && g.chance(0.5) ? g.pick(keysOf(targetOfHoldOffKey(t))) : t);
  };
  /** Coupled: a 498 holds off the target's flex tier alone (a start, or an extension), until `untilMs`. */
  const holdFlex = (t: string, untilMs: number) => {
    flexHold.set(t, Math.max(untilMs, flexHold.get(t) ?? 0));
    deriveFlex();
    lot.notify(g.pick(keysOf(t)));
    seen.add('flex tier held off alone');
  };

  for (step = 0; step < steps; step++) {
    const roll = g.random();
    if (roll < 0.4) {
      op = 'park';
      park(newReq(), g.chance(0.08) ? now() + g.int(1, 1_500) : undefined);
    } else if (roll < 0.46) {
      op = 'client leaves';
      const p = parked();
      if (p.length > 0) g.pick(p).ctrl.abort();
    } else if (roll < 0.6) {
      op = 'attempt over';
      const outNow = reqs.filter((r) => r.state === 'released');
      if (outNow.length > 0) {
        const r = g.pick(outNow);
        r.state = 'done';
        r.ticket!.done();
        if (g.chance(0.1)) r.ticket!.done();
        if (g.chance(0.35) && now() < cutoff(r)) {
          op = 'probe failed, parks again';
          // What the done() let go is judged as things stood then, before the target is away again.
          await settle();
          if (r.flex && flexMode === 'coupled' && g.chance(0.5)) {
            // Its 498: the flex tier alone is held off, and it parks again under the flex key.
            op = 'flex probe got a 498, parks again';
            holdFlex(r.target, g.evenAfter(now(), g.int(0, 3_000)) + 1);
          } else {
            const key = r.flex && flexMode === 'independent' && g.chance(0.5) ? r.key : r.target;
            setState(key, { mode: 'blocked', availableAtMs: g.evenAfter(now(), g.int(0, 3_000)) }, true);
          }
          await settle();
          park(r);
          seen.add('parked again after a failed probe');
        }
      }
    } else if (roll < 0.64) {
      op = 'stream begins';
      const outNow = reqs.filter((r) => r.state === 'released' && !r.streaming);
      if (outNow.length > 0) {
        const r = g.pick(outNow);
        r.streaming = true;
        r.ticket!.streaming();
      }
    } else if (roll < 0.72) {
      op = 'target state';
      const t = g.pick(scripted);
      if (flexMode === 'coupled' && g.chance(0.3)) {
        op = 'flex tier held off';
        holdFlex(t, g.evenAfter(now(), g.int(0, 3_000)) + 1);
        await check();
        continue;
      }
      const before = states.get(t)!;
      const next: TargetState = g.pick([
        { mode: 'blocked', availableAtMs: g.evenAfter(now(), g.int(0, 3_000)) },
        { mode: 'probing', slots: g.int(1, 3) },
        { mode: 'available', slots: g.int(1, 5) },
      ]);
      setState(t, next, before.mode === 'blocked' || next.mode === 'blocked' || g.chance(0.5));
    } else if (roll < 0.73) {
      op = 'forget';
      lot.forget(g.pick(keys));
    } else {
      op = 'time passes';
      await vi.advanceTimersByTimeAsync(g.pick([1, g.int(1, 400), g.int(1, 2_500)]));
      for (const t of scripted) {
        const st = states.get(t)!;
        if (st.mode === 'blocked' && st.availableAtMs <= now() && g.chance(0.7)) setState(t, { mode: 'probing', slots: g.int(1, 3) }, true);
      }
      // Coupled: flex hold-offs that ended meanwhile (the lot's own timer woke it; nobody notified).
      deriveFlex();
    }
    await check();
    if (process.env.FUZZ_TRACE) console.log(`${step} ${op} t=${now()} ${keys.map((k) => `${k}:${JSON.stringify(stateOfKey(k))}`).join(' ')} parked=${parked().map((r) => `${r.id}${r.target.slice(2)}${r.flex ? 'f' : ''}c${r.cls}d${r.deadlineAtMs}nb${r.notBeforeMs ?? ''}`).join(',')} out=${reqs.filter((r) => r.state === 'released').map((r) => `${r.id}${r.target.slice(2)}${r.flex ? 'f' : ''}c${r.cls}${r.streaming ? 's' : ''}`).join(',')}`);
  }

  // Everything leaves: nothing parked, no bytes, every park answered once; then the lot closes.
  op = 'wind down';
  letAllGo(reqs);
  await check();
  for (const k of keys) expect(lot.waiting(k)).toBe(0);
  expect(bodies.bytes, `bytes left, ${where()}`).toBe(0);
  expect(answers, `every park answered once, ${where()}`).toBe(parkCalls);
  lot.close();
  for (const k of keys) lot.forget(k);
  expect(lot.size).toBe(0);
  return { steps };
}


describe('the parking lot with clients against the README model', () => {
  beforeEach(() => vi.useFakeTimers({ now: 1_000_000 }));
  afterEach(() => vi.useRealTimers());

  it('releases by client turns and gives a full route queue\'s places away as the README says', async () => {
    const seen = new Set<string>();
    let steps = 0;
    for (let s = 0; s < 8 * SEEDS; s++) steps += (await runLotFuzz(BASE_SEED + s, STEPS, seen)).steps;
    if (process.env.FUZZ_SEEN) console.log('lot', steps, 'steps', [...seen]);
    for (const what of ['released while available', 'released while probing', 'released between clients', 'three clients parked', 'route queue full', 'displaced', 'displaced a lower class', 'bodies full', 'timeout', 'parked again after a failed probe']) {
      expect(seen, `the runs reached: ${what}`).toContain(what);
    }
  }, 60_000 * SEEDS);

  // README "Hold-offs" (a 498 holds off the flex tier alone) and "Parking": flex requests park under the flex key in
  // their target's queue, released by their own key's state in one order and under one limit with the default tier's.
  it('releases flex-tier requests by their own key, in the target\'s one order and limit, as the README says', async () => {
    const seen = new Set<string>();
    let steps = 0;
    for (let s = 0; s < 6 * SEEDS; s++) steps += (await runLotFuzz(BASE_SEED + s, STEPS, seen, 'coupled')).steps;
    for (let s = 0; s < 2 * SEEDS; s++) steps += (await runLotFuzz(BASE_SEED + 1_000 + s, STEPS, seen, 'independent')).steps;
    if (process.env.FUZZ_SEEN) console.log('lot flex', steps, 'steps', [...seen]);
    for (const what of ['flex released', 'flex released as a probe', 'default released while the flex tier is blocked', 'flex tier held off alone', 'flex and default parked together', 'released between clients', 'timeout', 'displaced', 'parked again after a failed probe']) {
      expect(seen, `the runs reached: ${what}`).toContain(what);
    }
  }, 60_000 * SEEDS);
});
