// Park, do not drop: requests for a target that is unavailable (breaker open, hold-off) wait here, holding no
// connection and no slot, and are released in deadline order when it is available again, at most as many at a time as
// the target's adaptive limit allows (after an outage it restarts at half and slow-starts: one controller for new and
// parked traffic), so the recovery is not a new storm. While the target is unavailable nothing parked is sent, except
// the breaker's probes. The requests parked when a target comes back leave spread over a short window (a fifth of how
// long it was away, at most a second), in deadline order: a provider that said "come back at T" must not see them all
// at T.
import type { RequestSignal } from './request-abort.ts';
import type { WaitingBodies } from '../pools/waiting-bodies.ts';

export type TargetState =
  /** Released requests may be in flight up to `slots` at a time: the target's adaptive limit. */
  | { mode: 'available'; slots: number }
  /** Probes may go: at most `slots` at a time. */
  | { mode: 'probing'; slots: number }
  | { mode: 'blocked'; availableAtMs: number };

export interface Ticket {
  /** Tells the lot the released request's attempt is over, so the next may go. */
  done(): void;
  /**
   * Its answer is a stream, which holds its pool slot until done(): it still counts against the target's limit, but
   * no longer against its probes. Counted there, streams released after one outage kept the next outage's probe (and
   * every request parked behind it) in the lot until they ended, minutes for a long answer.
   */
  streaming(): void;
}

/** How a parked request leaves the lot (stormgate_park_outcomes_total's outcome label). */
export const PARK_OUTCOMES = ['released', 'full', 'timeout', 'aborted', 'closing'] as const;

type ParkResult =
  | { kind: 'released'; ticket: Ticket }
  | { kind: 'full' }
  | { kind: 'timeout' }
  | { kind: 'aborted' }
  | { kind: 'closing' };

interface ParkOptions {
  route: string;
  deadlineAtMs: number;
  signal: RequestSignal;
  maxQueue: number;
  maxWaitMs: number | undefined;
  /** The one wait rule: a request is never released with less than this left before its deadline; it times out then. */
  minAttemptMs: number;
  /**
   * Not released before then, whatever the target's state says (the probe permits are out until then), unless the
   * target comes back from being unavailable first: the release window then decides (a breaker another instance's
   * probe closed lets the parked go before the probe time they parked with).
   */
  notBeforeMs?: number;
  /**
   * The request's priority class in the target's pool (0, the highest, by default). Higher classes leave first, and a
   * class is paced only by what the lot released of its own and higher classes: released batch requests waiting for
   * their class's few slots must not keep online requests parked behind them (the noisy neighbour, back in the lot).
   */
  cls?: number;
  /** Bytes of the request's body: while it is parked, they count against server.maxWaitingBodyBytes. */
  bodyBytes?: number;
  /** Its class is its pool's lowest (batch): its body may fill only half of server.maxWaitingBodyBytes. */
  lowestClass?: boolean;
}

interface ParkingLotDeps {
  now: () => number;
  /** Uniform in [0, 1): where in the release window each request leaves. */
  random: () => number;
  stateOf: (target: string) => TargetState;
  onParkedChange?: (route: string, delta: number) => void;
  onOutcome?: (route: string, outcome: (typeof PARK_OUTCOMES)[number]) => void;
  /** The bytes of waiting bodies, shared with the pools: a parked request holds its body as a queued one does. */
  bodies?: WaitingBodies;
}

interface Entry {
  route: string;
  cls: number;
  deadlineAtMs: number;
  /** When it times out (deadline - minAttemptMs): its moment in a release window comes before it. */
  cutoffMs: number;
  /** Its moment in the release window after the target came back; undefined: as soon as a slot is free. */
  notBeforeMs: number | undefined;
  settle: (r: ParkResult) => void;
}

interface Queue {
  entries: Entry[];
  inflight: number;
  /** Released and not yet done, per class. */
  inflightByClass: number[];
  /** Of those, the ones whose answer is a stream that has begun (Ticket.streaming), per class. */
  streamingByClass: number[];
  timer: NodeJS.Timeout | undefined;
  timerAtMs: number;
  /** Since when the target has been unavailable to this queue, while it is. */
  blockedSinceMs: number | undefined;
  /** The end of the current release window: newcomers park behind the requests spread over it. */
  spreadUntilMs: number;
}

const NO_TIMER = Number.POSITIVE_INFINITY;
/** The release window after an unavailable spell: this share of the spell, as the wait hints' random(1, 1.2)... */
const RELEASE_SPREAD_SHARE = 0.2;
/** ...and at most this long, so the end of a long outage does not hold the parked back for long. */
const MAX_RELEASE_SPREAD_MS = 1_000;

export class ParkingLot {
  readonly #deps: ParkingLotDeps;
  readonly #queues = new Map<string, Queue>();
  readonly #perRoute = new Map<string, number>();
  #closing = false;

  constructor(deps: ParkingLotDeps) {
    this.#deps = deps;
  }

  /**
   * Requests waiting for a target (new arrivals queue behind them, so the deadline order holds); with `cls`, only those
   * of that class or a higher one: a newcomer does not queue behind lower classes.
   */
  waiting(target: string, cls?: number): number {
    const entries = this.#queues.get(target)?.entries;
    // Asked on every request: the common answer (none parked) allocates nothing.
    if (entries === undefined || entries.length === 0) return 0;
    return cls === undefined ? entries.length : entries.filter((e) => e.cls <= cls).length;
  }

  park(target: string, opts: ParkOptions): Promise<ParkResult> {
    if (this.#closing) return Promise.resolve(this.#count(opts.route, { kind: 'closing' }));
    if ((this.#perRoute.get(opts.route) ?? 0) >= opts.maxQueue) return Promise.resolve(this.#count(opts.route, { kind: 'full' }));
    if (opts.signal.aborted) return Promise.resolve(this.#count(opts.route, { kind: 'aborted' }));
    const bytes = opts.bodyBytes ?? 0;
    if (this.#deps.bodies && !this.#deps.bodies.take(bytes, opts.lowestClass === true)) return Promise.resolve(this.#count(opts.route, { kind: 'full' }));
    const q = this.#queue(target);
    return new Promise<ParkResult>((resolve) => {
      let waitTimer: NodeJS.Timeout | undefined;
      const cutoffMs = opts.deadlineAtMs - opts.minAttemptMs;
      const entry: Entry = {
        route: opts.route,
        cls: opts.cls ?? 0,
        deadlineAtMs: opts.deadlineAtMs,
        cutoffMs,
        notBeforeMs: notBefore(q.spreadUntilMs > this.#deps.now() ? Math.min(q.spreadUntilMs, cutoffMs - 1) : undefined, opts.notBeforeMs),
        settle: (r) => {
          clearTimeout(waitTimer);
          opts.signal.removeEventListener('abort', onAbort);
          this.#perRoute.set(opts.route, (this.#perRoute.get(opts.route) ?? 1) - 1);
          this.#deps.bodies?.give(bytes);
          this.#deps.onParkedChange?.(opts.route, -1);
          resolve(this.#count(opts.route, r));
        },
      };
      const leave = (r: ParkResult) => {
        const i = q.entries.indexOf(entry);
        if (i === -1) return;
        q.entries.splice(i, 1);
        // Nobody left waiting: a later spell away starts afresh (and so does its release window).
        if (q.entries.length === 0) q.blockedSinceMs = undefined;
        entry.settle(r);
      };
      const onAbort = () => leave({ kind: 'aborted' });
      opts.signal.addEventListener('abort', onAbort, { once: true });
      const waitMs = Math.min(opts.maxWaitMs ?? Number.POSITIVE_INFINITY, cutoffMs - this.#deps.now());
      waitTimer = setTimeout(() => leave({ kind: 'timeout' }), Math.max(0, waitMs));
      insertByDeadline(q.entries, entry);
      this.#perRoute.set(opts.route, (this.#perRoute.get(opts.route) ?? 0) + 1);
      this.#deps.onParkedChange?.(opts.route, 1);
      this.#pump(target, q);
    });
  }

  /** The target's state may have changed (a breaker transition, a hold-off, a timer): release what may go. */
  notify(target: string): void {
    const q = this.#queues.get(target);
    if (q) this.#pump(target, q);
  }

  /** Targets the lot keeps a queue for. */
  get size(): number {
    return this.#queues.size;
  }

  /**
   * Drops the queue of a target key given back (a made-up model name the provider answered 404), once nothing waits
   * on it or was released from it: a queue is kept per target ever parked on, so such names would grow the lot
   * without bound. Requests still parked or in flight keep theirs (the last to leave drops nothing; the key's next
   * 404, or none, as for the pools).
   */
  forget(target: string): void {
    const q = this.#queues.get(target);
    if (!q || q.entries.length > 0 || q.inflight > 0) return;
    clearTimeout(q.timer);
    this.#queues.delete(target);
  }

  /** Answers every parked request at once (shutdown). */
  close(): void {
    this.#closing = true;
    for (const q of this.#queues.values()) {
      clearTimeout(q.timer);
      for (const e of q.entries.splice(0)) e.settle({ kind: 'closing' });
    }
  }

  #queue(target: string): Queue {
    let q = this.#queues.get(target);
    if (!q) this.#queues.set(target, (q = { entries: [], inflight: 0, inflightByClass: [], streamingByClass: [], timer: undefined, timerAtMs: NO_TIMER, blockedSinceMs: undefined, spreadUntilMs: 0 }));
    return q;
  }

  #pump(target: string, q: Queue): void {
    if (q.entries.length === 0) return;
    const state = this.#deps.stateOf(target);
    const now = this.#deps.now();
    if (state.mode === 'blocked') {
      q.blockedSinceMs ??= now;
      this.#wakeAt(target, q, state.availableAtMs);
      return;
    }
    if (q.blockedSinceMs !== undefined) this.#spread(q, now);
    const limit = state.slots;
    let next = Number.POSITIVE_INFINITY;
    let i = 0;
    while (i < q.entries.length) {
      const entry = q.entries[i]!;
      // Past its cut-off by the clock, though its timer has not fired: a busy event loop runs I/O callbacks (a probe's
      // answer, whose breaker change releases parked requests) before any due timer, and a request released now would
      // reach undici before its deadline's timer could stop it. It times out now, as its timer would have.
      if (now >= entry.cutoffMs) {
        q.entries.splice(i, 1);
        entry.settle({ kind: 'timeout' });
        continue;
      }
      if (entry.notBeforeMs !== undefined && entry.notBeforeMs > now) {
        next = Math.min(next, entry.notBeforeMs);
        i++;
        continue;
      }
      // Entries are in class order: one that may not go now (its class and the higher ones have `limit` out) holds
      // back every one after it.
      // While probing, the slots are the breaker's probes: a stream begun is no probe any more.
      if (inflightUpTo(q, entry.cls, state.mode === 'probing') >= limit) break;
      q.entries.splice(i, 1);
      q.inflight++;
      q.inflightByClass[entry.cls] = (q.inflightByClass[entry.cls] ?? 0) + 1;
      const cls = entry.cls;
      let reported = false;
      let streaming = false;
      entry.settle({
        kind: 'released',
        ticket: {
          done: () => {
            if (reported) return;
            reported = true;
            q.inflight--;
            q.inflightByClass[cls]!--;
            if (streaming) q.streamingByClass[cls]!--;
            this.#pump(target, q);
          },
          streaming: () => {
            if (reported || streaming) return;
            streaming = true;
            q.streamingByClass[cls] = (q.streamingByClass[cls] ?? 0) + 1;
            this.#pump(target, q);
          },
        },
      });
    }
    if (q.entries.length === 0) return;
    // The next moment in the release window; and, since a probe's answer moves the breaker and answers raise the
    // limit, a re-check soon in case nothing reports back.
    this.#wakeAt(target, q, Math.min(next, now + 250));
  }

  /**
   * The target is back: each request parked now gets its moment in the window, never past half its time left nor its
   * cut-off. The random moments are sorted before they are handed out in deadline order: drawn per request, a request
   * unlucky in window after window (a provider that keeps asking for short pauses) would wait out its whole deadline
   * while later ones went.
   */
  #spread(q: Queue, now: number): void {
    const windowMs = Math.min(MAX_RELEASE_SPREAD_MS, RELEASE_SPREAD_SHARE * (now - q.blockedSinceMs!));
    q.blockedSinceMs = undefined;
    q.spreadUntilMs = now + windowMs;
    const moments = q.entries.map(() => windowMs * this.#deps.random()).sort((a, b) => a - b);
    q.entries.forEach((e, i) => {
      e.notBeforeMs = now + Math.min(moments[i]!, (e.deadlineAtMs - now) / 2, e.cutoffMs - 1 - now);
    });
  }

  #wakeAt(target: string, q: Queue, atMs: number): void {
    if (q.timer !== undefined && q.timerAtMs <= atMs) return;
    clearTimeout(q.timer);
    q.timerAtMs = atMs;
    q.timer = setTimeout(() => {
      q.timer = undefined;
      q.timerAtMs = NO_TIMER;
      this.#pump(target, q);
    }, Math.max(0, atMs - this.#deps.now()));
    q.timer.unref();
  }

  #count(route: string, r: ParkResult): ParkResult {
    this.#deps.onOutcome?.(route, r.kind);
    return r;
  }
}

/** The later of two moments an entry may not leave before, either unset. */
function notBefore(a: number | undefined, b: number | undefined): number | undefined {
  return a === undefined ? b : b === undefined ? a : Math.max(a, b);
}

/** Released requests of class `cls` and the higher ones still out; `attemptsOnly`: less those streaming an answer. */
function inflightUpTo(q: Queue, cls: number, attemptsOnly: boolean): number {
  let n = 0;
  for (let k = 0; k <= cls; k++) n += (q.inflightByClass[k] ?? 0) - (attemptsOnly ? (q.streamingByClass[k] ?? 0) : 0);
  return n;
}

/** Keeps entries ordered by class, highest first, then by deadline, earliest first; equal ones keep arrival order. */
function insertByDeadline(entries: Entry[], entry: Entry): void {
  let lo = 0;
  let hi = entries.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    const m = entries[mid]!;
    if (m.cls < entry.cls || (m.cls === entry.cls && m.deadlineAtMs <= entry.deadlineAtMs)) lo = mid + 1;
    else hi = mid;
  }
  entries.splice(lo, 0, entry);
}
