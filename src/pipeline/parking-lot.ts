// Park, do not drop: requests for a target that is unavailable (breaker open, hold-off) wait here, holding no
// connection and no slot, and are released in deadline order when it is available again, at most as many at a time as
// the target's adaptive limit allows (after an outage it restarts at half and slow-starts: one controller for new and
// parked traffic), so the recovery is not a new storm. While the target is unavailable nothing parked is sent, except
// the breaker's probes.

export type TargetState =
  /** Released requests may be in flight up to `slots` at a time: the target's adaptive limit. */
  | { mode: 'available'; slots: number }
  /** Probes may go: at most `slots` at a time. */
  | { mode: 'probing'; slots: number }
  | { mode: 'blocked'; availableAtMs: number };

export interface Ticket {
  /** Tells the lot the released request's attempt is over, so the next may go. */
  done(): void;
}

export type ParkResult =
  | { kind: 'released'; ticket: Ticket }
  | { kind: 'full' }
  | { kind: 'timeout' }
  | { kind: 'aborted' }
  | { kind: 'closing' };

export interface ParkOptions {
  route: string;
  deadlineAtMs: number;
  signal: AbortSignal;
  maxQueue: number;
  maxWaitMs: number | undefined;
}

export interface ParkingLotDeps {
  now: () => number;
  stateOf: (target: string) => TargetState;
  onParkedChange?: (route: string, delta: number) => void;
  onOutcome?: (route: string, outcome: 'released' | 'full' | 'timeout' | 'aborted' | 'closing') => void;
}

interface Entry {
  route: string;
  deadlineAtMs: number;
  settle: (r: ParkResult) => void;
}

interface Queue {
  entries: Entry[];
  inflight: number;
  timer: NodeJS.Timeout | undefined;
  timerAtMs: number;
}

const NO_TIMER = Number.POSITIVE_INFINITY;

export class ParkingLot {
  readonly #deps: ParkingLotDeps;
  readonly #queues = new Map<string, Queue>();
  readonly #perRoute = new Map<string, number>();
  #closing = false;

  constructor(deps: ParkingLotDeps) {
    this.#deps = deps;
  }

  /** Requests waiting for a target (new arrivals queue behind them, so the deadline order holds). */
  waiting(target: string): number {
    return this.#queues.get(target)?.entries.length ?? 0;
  }

  park(target: string, opts: ParkOptions): Promise<ParkResult> {
    if (this.#closing) return Promise.resolve(this.#count(opts.route, { kind: 'closing' }));
    if ((this.#perRoute.get(opts.route) ?? 0) >= opts.maxQueue) return Promise.resolve(this.#count(opts.route, { kind: 'full' }));
    if (opts.signal.aborted) return Promise.resolve(this.#count(opts.route, { kind: 'aborted' }));
    const q = this.#queue(target);
    return new Promise<ParkResult>((resolve) => {
      let waitTimer: NodeJS.Timeout | undefined;
      const entry: Entry = {
        route: opts.route,
        deadlineAtMs: opts.deadlineAtMs,
        settle: (r) => {
          clearTimeout(waitTimer);
          opts.signal.removeEventListener('abort', onAbort);
          this.#perRoute.set(opts.route, (this.#perRoute.get(opts.route) ?? 1) - 1);
          this.#deps.onParkedChange?.(opts.route, -1);
          resolve(this.#count(opts.route, r));
        },
      };
      const leave = (r: ParkResult) => {
        const i = q.entries.indexOf(entry);
        if (i === -1) return;
        q.entries.splice(i, 1);
        entry.settle(r);
      };
      const onAbort = () => leave({ kind: 'aborted' });
      opts.signal.addEventListener('abort', onAbort, { once: true });
      if (opts.maxWaitMs !== undefined) waitTimer = setTimeout(() => leave({ kind: 'timeout' }), opts.maxWaitMs);
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
    if (!q) this.#queues.set(target, (q = { entries: [], inflight: 0, timer: undefined, timerAtMs: NO_TIMER }));
    return q;
  }

  #pump(target: string, q: Queue): void {
    if (q.entries.length === 0) return;
    const state = this.#deps.stateOf(target);
    if (state.mode === 'blocked') {
      this.#wakeAt(target, q, state.availableAtMs);
      return;
    }
    const limit = state.slots;
    while (q.entries.length > 0 && q.inflight < limit) {
      const entry = q.entries.shift()!;
      q.inflight++;
      let reported = false;
      entry.settle({
        kind: 'released',
        ticket: {
          done: () => {
            if (reported) return;
            reported = true;
            q.inflight--;
            this.#pump(target, q);
          },
        },
      });
    }
    // A probe's answer moves the breaker and answers raise the limit; re-check soon in case nothing reports back.
    if (q.entries.length > 0) this.#wakeAt(target, q, this.#deps.now() + 250);
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

/** Keeps entries ordered by deadline, earliest first; equal deadlines keep arrival order. */
function insertByDeadline(entries: Entry[], entry: Entry): void {
  let lo = 0;
  let hi = entries.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (entries[mid]!.deadlineAtMs <= entry.deadlineAtMs) lo = mid + 1;
    else hi = mid;
  }
  entries.splice(lo, 0, entry);
}
