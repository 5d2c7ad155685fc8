// The reference model of the priority pools (README "Priority pools" and "Tenants share a class fairly"), shared by
// the seeded model-based fuzzers of the pools: pools-model-fuzz.test.ts (every request of one client, where turns
// between clients and displacement never come into play) and pools-clients-model-fuzz.test.ts (3 to 6 clients). One
// model, so a fix to it is a fix to both. It draws no randomness: the runs' draws stay the drivers'.
import { classLimit, initialLimit, onRateLimited, onSuccess, type LimitSettings, type LimitState } from '../../src/policy/adaptive-limit.ts';
import { MovingAverage } from '../../src/policy/moving-average.ts';
import { canWait } from '../../src/policy/retry-wait.ts';
import type { Acquired, PoolClass, Slot, SlotRequest } from '../../src/pools/provider-pool.ts';

export type Expected =
  | { kind: 'granted'; queued: boolean }
  | { kind: 'shed'; reason: 'queue_full' | 'deadline' | 'body_bytes'; retryAfterMs: number }
  | { kind: 'aborted' };

/** One request for a slot, as the model and as the pool see it (a driver adds its own fields). */
export interface PoolReq {
  id: number;
  req: SlotRequest;
  /** Its client's name ('' for the unnamed client: pools-model-fuzz.test.ts sends every request as that one). */
  client: string;
  ctrl: AbortController;
  /** The model's view: waiting in the queue, holding a slot, or answered without one. */
  state: 'queued' | 'held' | 'done';
  /** Arrival order in the queue (-1: never queued). */
  seq: number;
  expected?: Expected;
  actual?: Acquired;
  slot?: Slot;
  grantedAtMs: number;
  answered: boolean;
  /** The model gave the slot back. */
  slotGiven: boolean;
}

export interface ModelTarget {
  limit: LimitState;
  lowerHeldUntilMs: number;
  inUse: number;
  byClass: number[];
  /** The README's rule: rate-limit signals earlier in the round trip count as in flight when a 429 is judged. */
  refusedFromMs: number;
  refusedInRoundTrip: number;
}

/** A client's standing in a class (policy/client-turns.ts's Standing) and its requests waiting. */
export interface ModelClient {
  held: number;
  servedAt: number;
  waiting: number;
}

/** At a grant from the queue: the granted client's slots of the class, and the fewest any other eligible waiting client held. */
export interface FairGrant {
  held: number;
  fewestOther: number;
  clients: number;
}

/**
 * The pool from the README: a class may use any capacity the others leave idle, keeps minShare of it (of the target's
 * limit once that is cut) under contention; waiters are served by class, then arrival; bounded queues per class (a
 * request the lot released is not shed for a full one); a waiter held back by what does not hold a newcomer back does
 * not keep it from an idle slot; the one wait rule on arrival, at the grant and when minAttemptMs is left; retries at
 * most maxConcurrentRetries; lower classes wait out a nearly spent quota; waiting bodies bounded, batch to half.
 * With clients: within a class, a slot goes to the waiting client that holds the fewest of the class's slots (then
 * served longest ago: a client that comes back counts as served just before the latest grant), then its earliest
 * request; the wait estimate counts the higher classes' queues, the client's own queue and of each other client's at
 * most as many again and one; a full class queue gives a newcomer the place of the newest waiter (not released by the
 * lot) of the fullest client with at least own + 2 waiting. With one client all this is the plain order by class and
 * arrival, the plain estimate (every waiter of its class or a higher one ahead) and no displacement.
 */
export class PoolModel<R extends PoolReq = PoolReq> {
  capacity: number;
  attainable: number;
  retryCapacity: number;
  inUseByClass: number[];
  retriesInUse = 0;
  /** The retries holding slots (their grant times place the retry cap's first round). */
  readonly heldRetries = new Set<R>();
  readonly targets = new Map<string, ModelTarget>();
  /** Waiters in arrival order. */
  queue: R[] = [];
  /**
   * Per class, the clients holding or waiting. A Map, in the order the pool's entries come (a client forgotten once
   * idle comes back at the end): of clients equally full, the README leaves open whose place a newcomer takes, and
   * the pool takes the first; the model follows so that it can say which.
   */
  readonly clients: Array<Map<string, ModelClient>>;
  grants = 0;
  readonly roundTrip = new MovingAverage(1_000);
  readonly slotHold = new MovingAverage(1_000);
  bytes = 0;
  #seq = 0;
  /** What the step resolved, in order: grants and sheds of waiters (the queued path). */
  order: number[] = [];
  /** Per request granted from the queue, how fair its grant was (read and cleared by the clients' driver). */
  readonly fair = new Map<number, FairGrant>();
  onAnswer?: (p: R) => void;
  onNote?: (what: string) => void;

  constructor(
    readonly classes: readonly PoolClass[],
    readonly settings: { capacity: number; retryCapacity: number; maxBytes: number },
    readonly limitSettings: LimitSettings,
    readonly now: () => number,
  ) {
    this.capacity = settings.capacity;
    this.attainable = settings.capacity;
    this.retryCapacity = settings.retryCapacity;
    this.inUseByClass = classes.map(() => 0);
    this.clients = classes.map(() => new Map());
  }

  get inUse(): number {
    return this.inUseByClass.reduce((a, b) => a + b, 0);
  }

  queuedOf(cls: number): number {
    return this.queue.filter((w) => w.req.cls === cls).length;
  }

  waitingOf(cls: number, client: string): number {
    return this.queue.filter((w) => w.req.cls === cls && w.client === client).length;
  }

  use(cls: number, client: string): ModelClient {
    let u = this.clients[cls]!.get(client);
    if (!u) this.clients[cls]!.set(client, (u = { held: 0, servedAt: this.grants - 0.5, waiting: 0 }));
    return u;
  }

  #forgetIdle(cls: number, client: string): void {
    const u = this.clients[cls]!.get(client);
    if (u && u.held === 0 && u.waiting === 0) this.clients[cls]!.delete(client);
  }

  target(key: string): ModelTarget {
    let t = this.targets.get(key);
    if (!t) this.targets.set(key, (t = { limit: initialLimit(this.limitSettings), lowerHeldUntilMs: 0, inUse: 0, byClass: this.classes.map(() => 0), refusedFromMs: Number.NEGATIVE_INFINITY, refusedInRoundTrip: 0 }));
    return t;
  }

  /** Can it take a slot now? `holdEndsLate`: a quota hold ending this very millisecond still holds (its timer is 1 ms after). */
  admissible(r: SlotRequest, holdEndsLate = false): boolean {
    const t = this.target(r.target);
    if (this.inUse >= this.capacity) return false;
    if (r.retry && this.retriesInUse >= this.retryCapacity) return false;
    if (t.inUse >= Math.max(1, Math.floor(t.limit.limit))) return false;
    if (r.cls > 0 && t.byClass[r.cls]! >= classLimit(t.limit, r.cls)) return false;
    if (r.cls > 0 && (holdEndsLate ? t.lowerHeldUntilMs >= this.now() : t.lowerHeldUntilMs > this.now())) return false;
    return true;
  }

  /**
   * "the higher classes' queues, its client's queue, and of each other client's at most as many again and one"; for a
   * retry, at least its wait for the retry cap: a slot's hold per round of the cap that the retries in flight and those
   * ahead of it (the higher classes' waiting retries, and of its own class at most as many as are ahead of it) fill.
   */
  expectedWaitMs(cls: number, target: string, client: string, retry = false): number {
    const higher = this.queue.filter((w) => w.req.cls < cls).length;
    const own = this.waitingOf(cls, client);
    let inClass = own;
    for (const other of new Set(this.queue.filter((w) => w.req.cls === cls && w.client !== client).map((w) => w.client))) {
      inClass += Math.min(this.waitingOf(cls, other), own + 1);
    }
    const t = this.target(target);
    const perRoundTrip = Math.max(1, Math.min(classLimit(t.limit, cls), this.attainable));
    const slotMs = Math.max(this.roundTrip.value, this.slotHold.value);
    const queued = Math.ceil((higher + inClass + 1) / perRoundTrip) * slotMs;
    const held = cls > 0 ? Math.max(queued, t.lowerHeldUntilMs - this.now()) : queued;
    if (!retry) return held;
    const retriesAhead = this.queue.filter((w) => w.req.retry && w.req.cls < cls).length + Math.min(inClass, this.queue.filter((w) => w.req.retry && w.req.cls === cls).length);
    const beyond = Math.min(this.retriesInUse, this.retryCapacity) + retriesAhead + 1 - this.retryCapacity;
    if (beyond <= 0) return held;
    // "each retry in flight expected to end a slot's hold after it began, each place it frees taken by the next retry in
    // line": the places free as the holders end (an unused one at once; with more in flight than the cap, after a
    // fleet share shrank it, a place frees only once the excess has ended), and its own is the one that frees after
    // the retries ahead of it have taken theirs, round after round of slot holds.
    const ends = [...this.heldRetries].map((p) => Math.max(0, slotMs - (this.now() - p.grantedAtMs))).sort((a, b) => a - b);
    const cap = this.retryCapacity;
    const places = ends.length >= cap ? ends.slice(ends.length - cap) : [...Array<number>(cap - ends.length).fill(0), ...ends];
    return Math.max(held, places[retriesAhead % cap]! + Math.floor(retriesAhead / cap) * slotMs);
  }

  /** The waiter a newcomer to a full class queue displaces: undefined, none (the newcomer is shed). */
  displaced(p: R): R | undefined {
    const own = this.waitingOf(p.req.cls, p.client);
    const fuller = [...this.clients[p.req.cls]!.keys()].map((name) => [name, this.waitingOf(p.req.cls, name)] as const).filter(([, n]) => n >= own + 2);
    fuller.sort((a, b) => b[1] - a[1]);
    for (const [name] of fuller) {
      const mine = this.queue.filter((w) => w.req.cls === p.req.cls && w.client === name && !w.req.released);
      if (mine.length > 0) return mine.at(-1);
    }
    return undefined;
  }

  acquire(p: R): { victim?: R } {
    const { req } = p;
    const now = this.now();
    if (req.signal.aborted) return this.#answer(p, { kind: 'aborted' }, false), {};
    const mayGoAhead = this.queue.some((w) => w.req.cls <= req.cls && this.admissible(w.req));
    if (!mayGoAhead && this.admissible(req)) {
      this.#take(p);
      return this.#answer(p, { kind: 'granted', queued: false }, false), {};
    }
    const c = this.classes[req.cls]!;
    const expected = this.expectedWaitMs(req.cls, req.target, p.client, req.retry);
    let victim: R | undefined;
    if (!req.released && this.queuedOf(req.cls) >= c.maxQueue) {
      victim = this.displaced(p);
      if (!victim) return this.#answer(p, { kind: 'shed', reason: 'queue_full', retryAfterMs: expected }, false), {};
    }
    if (!canWait(now, expected, req.deadlineAtMs, req.minAttemptMs)) return this.#answer(p, { kind: 'shed', reason: 'deadline', retryAfterMs: expected }, false), {};
    const bytes = req.bodyBytes ?? 0;
    const lowest = req.cls > 0 && req.cls === this.classes.length - 1;
    const cap = lowest ? this.settings.maxBytes / 2 : this.settings.maxBytes;
    const before = this.bytes - (victim?.req.bodyBytes ?? 0);
    if (victim && before > 0 && before + bytes > cap) this.onNote?.('too large for a displaced body\'s place');
    if (!req.released && before > 0 && before + bytes > cap) return this.#answer(p, { kind: 'shed', reason: 'body_bytes', retryAfterMs: expected }, false), {};
    if (victim && this.bytes > 0 && this.bytes + bytes > cap) this.onNote?.('fit in the place of a displaced body');
    if (victim) {
      this.#leave(victim);
      this.#answer(victim, { kind: 'shed', reason: 'queue_full', retryAfterMs: this.expectedWaitMs(victim.req.cls, victim.req.target, victim.client, victim.req.retry) }, true);
    }
    this.bytes += bytes;
    p.seq = this.#seq++;
    p.state = 'queued';
    this.queue.push(p);
    this.use(req.cls, p.client).waiting++;
    this.drain();
    return victim ? { victim } : {};
  }

  release(p: R): void {
    if (p.slotGiven || p.state !== 'held') return;
    p.slotGiven = true;
    p.state = 'done';
    if (p.answered && this.now() - p.grantedAtMs > 0) this.slotHold.add(this.now() - p.grantedAtMs);
    const t = this.target(p.req.target);
    this.inUseByClass[p.req.cls]!--;
    t.inUse--;
    t.byClass[p.req.cls]!--;
    if (p.req.retry) this.retriesInUse--;
    this.heldRetries.delete(p);
    this.use(p.req.cls, p.client).held--;
    this.#forgetIdle(p.req.cls, p.client);
    this.drain();
  }

  abort(p: R): void {
    if (p.state !== 'queued') return;
    this.#leave(p);
    this.#answer(p, { kind: 'aborted' }, true);
  }

  /** The pool's waiters whose last chance (minAttemptMs before the deadline) is now. */
  expireAt(nowMs: number): void {
    for (const w of [...this.queue]) {
      if (w.req.deadlineAtMs - w.req.minAttemptMs === nowMs) this.#expire(w);
    }
  }

  observe(target: string, signal: 'rate-limited' | 'success', roundTripMs: number): void {
    const t = this.target(target);
    if (signal === 'success') {
      if (roundTripMs > 0) this.roundTrip.add(roundTripMs);
      t.limit = onSuccess(t.limit, this.limitSettings, this.now(), this.roundTrip.value, this.slotHold.value);
    } else {
      const waiting = this.queue.filter((w) => w.req.target === target).length;
      const before = this.classes.map((_, k) => classLimit(t.limit, k));
      if (this.now() - t.refusedFromMs >= this.roundTrip.value) {
        t.refusedFromMs = this.now();
        t.refusedInRoundTrip = 0;
      }
      t.limit = onRateLimited(t.limit, this.limitSettings, this.now(), this.roundTrip.value, { total: t.inUse, byClass: t.byClass, waiting, refusedLately: t.refusedInRoundTrip++ });
      if (this.classes.some((_, k) => classLimit(t.limit, k) > before[k]!)) this.onNote?.('a 429 raised a class limit');
    }
    // Whatever the limit lets in goes now.
    this.drain();
  }

  setShare(share: number, othersDemand: number): void {
    const capacity = Math.max(1, Math.round(this.settings.capacity * share));
    const retryCapacity = Math.max(1, Math.round(this.settings.retryCapacity * share));
    if (capacity <= this.capacity && retryCapacity > this.retryCapacity) this.onNote?.('the retry share grew alone');
    this.capacity = capacity;
    this.attainable = Math.max(this.capacity, this.settings.capacity - othersDemand);
    this.retryCapacity = retryCapacity;
    // Whatever the share lets in goes now.
    this.drain();
  }

  /** "first to classes under their minShare floor, then by class, then by client, then by arrival". */
  drain(): void {
    for (;;) {
      const w = this.#underFloor() ?? this.#byPriority();
      if (!w) return;
      this.#take(w);
      this.#answer(w, { kind: 'granted', queued: true }, true);
    }
  }

  #underFloor(): R | undefined {
    for (let k = this.classes.length - 1; k >= 1; k--) {
      const share = this.classes[k]!.minShare;
      if (this.inUseByClass[k]! >= Math.floor(share * this.capacity)) continue;
      const w = this.#pick(k, (t) => t.byClass[k]! < Math.floor(share * Math.min(this.capacity, t.limit.limit)));
      if (w) return w;
    }
    return undefined;
  }

  #byPriority(): R | undefined {
    for (let k = 0; k < this.classes.length; k++) {
      const w = this.#pick(k);
      if (w) return w;
    }
    return undefined;
  }

  /** Of the class's waiters that may go, the earliest of the client whose turn it is; one with no time left is shed instead. */
  #pick(cls: number, also?: (t: ModelTarget) => boolean): R | undefined {
    for (;;) {
      const eligible = this.queue.filter((x) => x.req.cls === cls && this.admissible(x.req) && (also === undefined || also(this.target(x.req.target))));
      if (eligible.length === 0) return undefined;
      const standing = (x: R) => this.clients[cls]!.get(x.client)!;
      const w = eligible.reduce((best, x) => {
        const a = standing(x);
        const b = standing(best);
        const order = a.held !== b.held ? a.held - b.held : a.servedAt - b.servedAt;
        return order < 0 || (order === 0 && x.seq < best.seq) ? x : best;
      });
      if (canWait(this.now(), 0, w.req.deadlineAtMs, w.req.minAttemptMs)) {
        const others = new Set(eligible.filter((x) => x.client !== w.client).map((x) => x.client));
        const fewestOther = Math.min(...[...others].map((c) => this.clients[cls]!.get(c)!.held));
        this.fair.set(w.id, { held: standing(w).held, fewestOther, clients: others.size + 1 });
        this.#leave(w);
        return w;
      }
      this.#expire(w);
    }
  }

  #expire(w: R): void {
    this.#leave(w);
    this.#answer(w, { kind: 'shed', reason: 'deadline', retryAfterMs: this.expectedWaitMs(w.req.cls, w.req.target, w.client, w.req.retry) }, true);
  }

  #leave(w: R): void {
    this.queue.splice(this.queue.indexOf(w), 1);
    this.bytes -= w.req.bodyBytes ?? 0;
    this.use(w.req.cls, w.client).waiting--;
    this.#forgetIdle(w.req.cls, w.client);
  }

  #take(p: R): void {
    const t = this.target(p.req.target);
    this.inUseByClass[p.req.cls]!++;
    t.inUse++;
    t.byClass[p.req.cls]!++;
    if (p.req.retry) this.retriesInUse++;
    const u = this.use(p.req.cls, p.client);
    u.held++;
    u.servedAt = ++this.grants;
    p.state = 'held';
    p.grantedAtMs = this.now();
    if (p.req.retry) this.heldRetries.add(p);
  }

  #answer(p: R, e: Expected, fromQueue: boolean): void {
    this.onAnswer?.(p);
    if (e.kind !== 'granted') p.state = 'done';
    p.expected = e;
    if (fromQueue) this.order.push(p.id);
  }

  /** No lost wake-up: nobody waits who could take a slot now, with time left for an attempt. */
  idleWhileWaiting(): R | undefined {
    return this.queue.find((w) => this.admissible(w.req, true) && canWait(this.now(), 0, w.req.deadlineAtMs, w.req.minAttemptMs));
  }
}

/** How the pool's answer to a request differs from the model's, if it does. */
export function disagreement(p: PoolReq): string | undefined {
  const a = p.actual;
  const e = p.expected;
  if (e === undefined) return undefined;
  if (p.state === 'queued') return a === undefined ? undefined : `answered ${JSON.stringify(a)} while the model has it waiting`;
  if (a === undefined) return `still waiting while the model answered ${JSON.stringify(e)}`;
  const got = a.ok ? { kind: 'granted', queued: a.queued } : a.reason === 'aborted' ? { kind: 'aborted' } : { kind: 'shed', reason: a.reason, retryAfterMs: a.retryAfterMs };
  if (got.kind !== e.kind || ('queued' in got && 'queued' in e && got.queued !== e.queued) || ('reason' in got && 'reason' in e && got.reason !== e.reason)) {
    return `answered ${JSON.stringify(got)}, the model ${JSON.stringify(e)}`;
  }
  if (got.kind === 'shed' && e.kind === 'shed') {
    // Shed requests are told when to come back: a finite, non-negative wait, the model's estimate.
    const after = got.retryAfterMs!;
    if (!Number.isFinite(after) || after < 0) return `told to come back after ${after} ms`;
    if (Math.abs(after - e.retryAfterMs) > 1e-6) return `told to come back after ${after} ms, the model ${e.retryAfterMs} ms`;
  }
  return undefined;
}
