// The driver both pool fuzzers share (pools-model-fuzz.test.ts, one client; pools-clients-model-fuzz.test.ts, several):
// the drawn pool, the random operations stepped on the pool and the model alike, the clock moved from timer to timer,
// the wind-down. What each fuzzer checks after a step, and the requests it makes, stay in its own file. The draws are
// the ones each fuzzer made before the driver was shared (same order, same odds), so a seed names the same history.
import { expect, vi } from 'vitest';
import { onRecovered, type LimitSettings } from '../../src/policy/adaptive-limit.ts';
import type { Config } from '../../src/config/schema.ts';
import { Pools } from '../../src/pools/pools.ts';
import type { Acquired, PoolClass, ProviderPool } from '../../src/pools/provider-pool.ts';
import { WaitingBodies } from '../../src/pools/waiting-bodies.ts';
import { CLASS_NAMES, poolConfig, PROVIDER, type Gen } from './model-fuzz.ts';
import { disagreement, PoolModel, type PoolReq } from './pool-model.ts';

/** The operations a step may take, by the name a failing case reports. */
export type PoolOp =
  | 'acquire'
  | 'release'
  | 'abort a waiter'
  | 'release and abort, one tick'
  | 'abort a holder'
  | 'success'
  | '429'
  | 'recovered'
  | 'hold lower classes'
  | 'fleet share';

/** How a fuzzer steps: its mix of operations and the few ways its draws differ from the other's. */
export interface PoolSteps<R extends PoolReq> {
  /** Cumulative bounds, in order: a step takes the first operation its roll is under; past the last, time passes. */
  mix: ReadonlyArray<readonly [upTo: number, op: PoolOp]>;
  /** A new request (not yet acquired). */
  newReq: () => R;
  /** The fuzzer's checks after every step (and every timer moment). */
  check: () => Promise<void>;
  /** Acquires as the driver does, with the fuzzer's own bookkeeping around it (default: `driver.acquire`). */
  acquire?: (p: R) => void;
  /** Called before each step and each timer moment: the fuzzer notes what waits before it. */
  beforeStep?: () => void;
  /** Called as the driver gives a request's slot back. */
  gaveBack?: (p: R) => void;
  /** Called after each step's check (not after time passes). */
  afterStep?: () => Promise<void>;
  /** The race of a release and an abort picks the queue's head half the time (the one-client fuzz's draw). */
  raceHead?: boolean;
  /** Fleet shares near the retry share's rounding too (the one-client fuzz's draw). */
  shareNearRetryRounding?: boolean;
  /** Notes in `seen` what the operations reached (races, 429s, quota holds ended): the one-client fuzz lists them. */
  opNotes?: boolean;
}

export class PoolFuzzDriver<R extends PoolReq> {
  readonly classes: PoolClass[];
  readonly capacity: number;
  readonly retryCapacity: number;
  readonly limitSettings: LimitSettings;
  readonly config: Config;
  readonly bodies: WaitingBodies;
  readonly pools: Pools;
  readonly pool: ProviderPool;
  readonly model: PoolModel<R>;
  readonly targets: string[];
  readonly reqs: R[] = [];
  /** Requests whose model answer or pool answer may have come in this step. */
  readonly touched = new Set<R>();
  /** Ids of the queued requests in the order the pool answered them, since the last check. */
  actualOrder: number[] = [];
  step = 0;
  op = '';
  #steps: PoolSteps<R> | undefined;

  /**
   * Draws the pool (classes, capacity, retry share, the adaptive limit's settings) and the targets, and builds the
   * pools as the gateway does, beside the model. `maxQueue` draws a class's queue bound; `hooks` are the pools' own.
   */
  constructor(
    readonly seed: number,
    readonly g: Gen,
    readonly seen: Set<string>,
    maxQueue: () => number,
    hooks: ConstructorParameters<typeof Pools>[2] = {},
  ) {
    const classCount = g.int(2, 3);
    // The config refuses minShare values over 1 in all: each class takes at most what the ones before it left.
    let shareLeft = 1;
    this.classes = CLASS_NAMES.slice(3 - classCount).map((name, k) => {
      const minShare = Math.min(shareLeft, k === 0 ? g.pick([0, 0.5]) : g.pick([0, 0.1, 0.25, 0.5]));
      shareLeft -= minShare;
      return { name, minShare, maxQueue: maxQueue() };
    });
    const capacity = g.int(1, 8);
    const retries = g.chance(0.5) ? undefined : g.int(1, capacity);
    this.capacity = capacity;
    this.retryCapacity = retries ?? Math.max(1, Math.floor(capacity / 5));
    const decrease = g.pick([0.5, 0.7, 0.9]);
    const minLimit = g.int(1, 3);
    this.config = poolConfig(capacity, retries, this.classes, decrease, minLimit);
    this.bodies = new WaitingBodies(this.config.server.maxWaitingBodyBytes!);
    this.pools = new Pools(this.config, this.now, hooks, this.bodies);
    this.pool = this.pools.of(PROVIDER);
    this.limitSettings = { max: capacity, min: minLimit, decrease, minShares: this.classes.map((c) => c.minShare) };
    this.model = new PoolModel<R>(this.classes, { capacity, retryCapacity: this.retryCapacity, maxBytes: this.bodies.maxBytes }, this.limitSettings, this.now);
    this.model.onAnswer = (p) => this.touched.add(p);
    this.model.onNote = (what) => seen.add(what);
    this.targets = ['p/a', 'p/b', 'p/c'].slice(0, g.int(1, 3));
  }

  readonly now = () => Date.now();
  readonly where = () => `seed ${this.seed}, step ${this.step} (${this.op}), t=${this.now()}`;
  readonly held = () => this.reqs.filter((p) => p.state === 'held');
  readonly queued = () => this.model.queue;

  /** Asks the pool and the model alike; `answered` sees the pool's answer as it comes. */
  acquire(p: R, answered?: (a: Acquired) => void): void {
    this.reqs.push(p);
    this.touched.add(p);
    void this.pool.acquire(p.req).then((a) => {
      this.touched.add(p);
      p.actual = a;
      answered?.(a);
      if (a.ok) p.slot = a.slot;
      if (a.ok ? a.queued : p.seq >= 0) this.actualOrder.push(p.id);
    });
    const { victim } = this.model.acquire(p);
    if (victim) this.touched.add(victim);
    if (p.expected?.kind === 'shed') this.seen.add(`shed ${p.expected.reason}`);
    if (p.expected?.kind === 'granted' && !p.expected.queued) this.seen.add('granted at once');
  }

  /** Gives a held slot back (answered or not; now and then twice, which must change nothing). */
  release(p: R): void {
    const g = this.g;
    if (g.chance(0.7)) {
      p.slot!.answered();
      p.answered = true;
    }
    p.slot!.release();
    this.#steps?.gaveBack?.(p);
    if (g.chance(0.1)) p.slot!.release();
    this.model.release(p);
  }

  abort(p: R): void {
    p.ctrl.abort();
    this.model.abort(p);
  }

  /** Checks the model's answers to the requests this step touched: a request's answer, once given, does not change. */
  expectTouchedAgree(label: (p: R) => string): void {
    for (const p of this.touched) {
      const problem = disagreement(p);
      expect(problem && `${label(p)}: ${problem}`, this.where()).toBeUndefined();
    }
    this.touched.clear();
  }

  /** Steps `steps` random operations, each on the pool and the model, with the fuzzer's checks after each. */
  async run(steps: number, how: PoolSteps<R>): Promise<void> {
    this.#steps = how;
    const { g, pool, model, targets } = this;
    const acquire = how.acquire ?? ((p: R) => this.acquire(p));
    for (this.step = 0; this.step < steps; this.step++) {
      how.beforeStep?.();
      const roll = g.random();
      const op = how.mix.find(([upTo]) => roll < upTo)?.[1];
      this.op = op ?? 'time passes';
      if (op === 'acquire') acquire(how.newReq());
      else if (op === 'release') {
        const h = this.held();
        if (h.length > 0) this.release(g.pick(h));
      } else if (op === 'abort a waiter') {
        const q = this.queued();
        if (q.length > 0) {
          this.abort(g.pick(q));
          this.seen.add('aborted while queued');
        }
      } else if (op === 'release and abort, one tick') {
        // A cancellation racing a grant: a slot is given back and a waiter aborts in the same tick, either order.
        const h = this.held();
        const q = this.queued();
        if (h.length > 0 && q.length > 0) {
          const slotOf = g.pick(h);
          const waiter = how.raceHead && g.chance(0.5) ? q[0]! : g.pick(q);
          if (g.chance(0.5)) {
            this.release(slotOf);
            this.abort(waiter);
          } else {
            this.abort(waiter);
            this.release(slotOf);
          }
          if (how.opNotes) this.seen.add('cancellation raced a grant');
        }
      } else if (op === 'abort a holder') {
        const h = this.held();
        if (h.length > 0) g.pick(h).ctrl.abort();
      } else if (op === 'success') {
        const target = g.pick(targets);
        const rtt = g.pick([0, g.int(1, 3_000)]);
        pool.observe(target, 'success', rtt);
        model.observe(target, 'success', rtt);
      } else if (op === '429') {
        const target = g.pick(targets);
        pool.observe(target, 'rate-limited', 0);
        model.observe(target, 'rate-limited', 0);
        if (how.opNotes) this.seen.add('429');
      } else if (op === 'recovered') {
        const target = g.pick(targets);
        pool.recovered(target);
        const t = model.target(target);
        t.limit = onRecovered(t.limit, this.limitSettings);
      } else if (op === 'hold lower classes') {
        const target = g.pick(targets);
        // Even ends: the pool's timer fires a millisecond after, at an odd moment no cut-off shares.
        const untilMs = g.evenAfter(this.now(), g.int(1, 6_000));
        pool.holdLowerClasses(target, untilMs);
        const t = model.target(target);
        t.lowerHeldUntilMs = Math.max(t.lowerHeldUntilMs, untilMs);
      } else if (op === 'fleet share') {
        // Shares on and near the rounding of capacity (and of the retry share) as well as anywhere.
        const { capacity, retryCapacity } = this;
        const shares = [1, g.random(), 0.5, g.int(1, 2 * capacity) / (2 * capacity)];
        if (how.shareNearRetryRounding) shares.push(g.int(1, 2 * retryCapacity) / (2 * retryCapacity));
        const share = g.pick(shares) || 1;
        const others = g.int(0, capacity);
        pool.setShare(share, others);
        model.setShare(share, others);
      } else {
        await this.advance(this.now() + g.pick([1, g.int(1, 300), g.int(1, 4_000)]));
        continue;
      }
      await how.check();
      await how.afterStep?.();
    }
  }

  /** Advances the clock to `untilMs`, stopping at every moment a pool timer fires so the model does the same then. */
  async advance(untilMs: number): Promise<void> {
    const { model } = this;
    for (;;) {
      const t = this.now();
      const moments = [
        ...model.queue.map((w) => w.req.deadlineAtMs - w.req.minAttemptMs),
        ...[...model.targets.values()].map((x) => x.lowerHeldUntilMs + 1),
      ].filter((m) => m > t && m <= untilMs);
      const next = moments.length > 0 ? Math.min(...moments) : untilMs;
      this.#steps!.beforeStep?.();
      await vi.advanceTimersByTimeAsync(next - t);
      model.expireAt(next);
      if ([...model.targets.values()].some((x) => x.lowerHeldUntilMs + 1 === next)) {
        model.drain();
        if (this.#steps!.opNotes) this.seen.add('quota hold ended');
      }
      await this.#steps!.check();
      if (next >= untilMs) return;
    }
  }

  /** Everything given back or cancelled, checked as every step is; the fuzzer then checks nothing is left. */
  async windDown(): Promise<void> {
    this.op = 'wind down';
    for (const p of [...this.queued()]) this.abort(p);
    for (let round = 0; this.held().length > 0; round++) {
      for (const p of this.held()) this.release(p);
      await this.#steps!.check();
      expect(round, 'everything given back').toBeLessThan(1_000);
    }
    await this.#steps!.check();
    expect(this.bodies.bytes, `bytes left, ${this.where()}`).toBe(0);
  }
}
