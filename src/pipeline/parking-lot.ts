// Park, do not drop: requests for a target that is unavailable (breaker open, hold-off) wait here, holding no
// connection and no slot, and are released in deadline order when it is available again, at most as many at a time as
// the target's adaptive limit allows (after an outage it restarts at half and slow-starts: one controller for new and
// parked traffic), so the recovery is not a new storm. While the target is unavailable nothing parked is sent, except
// the breaker's probes. The requests parked when a target comes back leave spread over a short window (a fifth of how
// long it was away, at most a second), in turns between clients, then deadline order: a provider that said "come back
// at T" must not see them all at T. Within a class, the clients (auth.keys) take turns: the one with the fewest of its
// released requests of the class still out goes first, then deadline order, so a tenant that flooded the lot during
// an outage is not all released before another tenant's requests after it.
// A target's flex service tier (TargetPlan.holdOffKey) parks under a key of its own, for the hold-off that holds that
// tier alone, but in its target's queue: one order and one limit for everything released to the target. Kept apart,
// each tier's queue was paced to the limit, and twice the limit left for the target when a target-wide hold-off ended.
import type { RequestSignal } from './request-abort.ts';
import { targetOfHoldOffKey } from '../state/hold-offs.ts';
import type { WaitingBodies } from '../pools/waiting-bodies.ts';
import { newcomer, turnOrder, type Standing } from '../policy/client-turns.ts';

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
export const PARK_OUTCOMES = ['released', 'moved', 'full', 'timeout', 'aborted', 'closing'] as const;

type ParkResult =
  | { kind: 'released'; ticket: Ticket }
  /**
   * One of its alternates came back, or may be probed and has no one parked to carry its probe, while its own target
   * is still away: it looks at every target again. `probe`: the key of the alternate whose probe it is to carry.
   */
  | { kind: 'moved'; probe?: string }
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
  /** The client's key (auth.keys): the clients of a class take turns (unnamed: one client). */
  client?: string;
  /**
   * The keys of the request's other targets, unavailable too when it parked: should one come back (its breaker closed,
   * its hold-off over) while the request's own key is still away, the request leaves the lot (`moved`) to try it, at
   * a random moment of the next second, as the parked of a key that came back leave over a window. Parked for the one
   * expected back first, it was otherwise told only at its last chance, and a backup that came back waited out the
   * primary's outage unused. One only probing takes, at once, as many as it has probe slots, to carry its probes.
   */
  alternates?: readonly string[];
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
  /** The key it parked under (the target's, or its flex tier's): whose state says whether it may go. */
  key: string;
  tier: Tier;
  cls: number;
  client: LotClient;
  /** Arrival order in the lot: a full route's queue gives a fuller client's newest place away. */
  seq: number;
  /** Its body's bytes, counted against the waiting bodies' cap while it is parked. */
  bytes: number;
  deadlineAtMs: number;
  /** When it times out (deadline - minAttemptMs): its moment in a release window comes before it. */
  cutoffMs: number;
  /** Its moment in the release window after the target came back; undefined: as soon as a slot is free. */
  notBeforeMs: number | undefined;
  /** ParkOptions.alternates: those not available when it parked (one available then would move it at once, in a loop). */
  alternates: readonly string[] | undefined;
  /**
   * When it leaves for an alternate that came back (a moment of the second after); undefined: none back (yet, or any
   * more: one away again before the moment takes it back).
   */
  moveAtMs: number | undefined;
  settle: (r: ParkResult) => void;
}

/** The requests of a target's queue parked under one key: the target's own, or its flex tier's. */
interface Tier {
  parked: number;
  /** Since when the key has been unavailable to its parked requests, while it is. */
  blockedSinceMs: number | undefined;
  /** The end of its current release window: newcomers park behind the requests spread over it. */
  spreadUntilMs: number;
  /** Where its key stood when the lot last looked (#pump): the state its requests are released by. */
  state: TargetState;
}

/**
 * A client's part of a class of a target's queue: its standing there (released requests of the class still out, last
 * release) and its requests of the class parked. Per class, as in the pools: its batch requests out do not cost it
 * its online turns.
 */
interface LotClient extends Standing {
  name: string;
  cls: number;
  parked: number;
}

/** A target's queue: the requests parked for it under any of its keys, in one order, released under one limit. */
interface Queue {
  /** By class, then deadline, whatever key they parked under. */
  entries: Entry[];
  tiers: Map<string, Tier>;
  inflight: number;
  /** Released and not yet done, per class. */
  inflightByClass: number[];
  /** Of those, the ones whose answer is a stream that has begun (Ticket.streaming), per class. */
  streamingByClass: number[];
  timer: NodeJS.Timeout | undefined;
  timerAtMs: number;
  /** Per class, clients with a request of it parked or out. */
  clients: Map<string, LotClient>[];
  releases: number;
  /**
   * The alternates its entries watch, each with how many watch it: only with some does a pump look at other targets'
   * states, and only a notify of one of their targets pumps the queue. A count alone made every pump scan the queue
   * (n² to park n requests: 20,000 took 7 s of event loop, not 1 s) and every notify of any target scan every entry.
   */
  watched: Map<string, number>;
  /** Entries given a moment to leave for an alternate (Entry.moveAtMs), not gone yet. */
  moving: number;
}

const NO_TIMER = Number.POSITIVE_INFINITY;
/** A new tier's state until the lot first looks. */
const AVAILABLE: TargetState = { mode: 'available', slots: 0 };
/** The release window after an unavailable spell: this share of the spell, as the wait hints' random(1, 1.2)... */
const RELEASE_SPREAD_SHARE = 0.2;
/** ...and at most this long, so the end of a long outage does not hold the parked back for long. */
const MAX_RELEASE_SPREAD_MS = 1_000;
/**
 * How long the requests moved to carry an alternate's probes (ParkingLot.#probeMoves) count against its probe slots:
 * a moved request that found no permit (another's probe out) parks again, for the alternate, and must not draw the
 * next one after it at once; and one lost on its way (its client gone) must not leave the alternate unprobed.
 */
const PROBE_MOVE_GAP_MS = 1_000;

export class ParkingLot {
  readonly #deps: ParkingLotDeps;
  readonly #queues = new Map<string, Queue>();
  readonly #perRoute = new Map<string, number>();
  /** Per route, each client's requests parked: whose place a full route's queue gives away. */
  readonly #perRouteClient = new Map<string, Map<string, number>>();
  /**
   * Per alternate key that is probing (half-open, or open past its parked probe time), the requests moved from the lot
   * to carry its probes, in the window that began at `sinceMs` (PROBE_MOVE_GAP_MS): at most its probe slots per window.
   * Lot-wide: a target's probes are its own, whichever queues watch it. Dropped once the lot sees it not probing.
   */
  readonly #probeMoves = new Map<string, { sinceMs: number; n: number }>();
  #seq = 0;
  #closing = false;

  constructor(deps: ParkingLotDeps) {
    this.#deps = deps;
  }

  /**
   * Requests a newcomer parked under `key` queues behind (so the deadline order holds): those parked for its target
   * under that key or the target's own, whose hold-offs hold it too (a flex request queues behind the default tier's,
   * a default-tier request never behind the flex tier's, which its hold-off may hold alone). With `cls`, only those of
   * that class or a higher one: a newcomer does not queue behind lower classes.
   */
  waiting(key: string, cls?: number): number {
    const target = targetOfHoldOffKey(key);
    const entries = this.#queues.get(target)?.entries;
    // Asked on every request: the common answer (none parked) allocates nothing, nor does any other.
    if (entries === undefined || entries.length === 0) return 0;
    let n = 0;
    for (const e of entries) if ((cls === undefined || e.cls <= cls) && (e.key === key || e.key === target)) n++;
    return n;
  }

  park(key: string, opts: ParkOptions): Promise<ParkResult> {
    if (this.#closing) return Promise.resolve(this.#count(opts.route, { kind: 'closing' }));
    const clientName = opts.client ?? '';
    const displaced = (this.#perRoute.get(opts.route) ?? 0) >= opts.maxQueue ? this.#displaced(opts.route, clientName, opts.cls ?? 0) : undefined;
    if (displaced === null) return Promise.resolve(this.#count(opts.route, { kind: 'full' }));
    if (opts.signal.aborted) return Promise.resolve(this.#count(opts.route, { kind: 'aborted' }));
    const bytes = opts.bodyBytes ?? 0;
    if (this.#deps.bodies && !this.#deps.bodies.takeInPlaceOf(bytes, opts.lowestClass === true, displaced?.bytes ?? 0)) return Promise.resolve(this.#count(opts.route, { kind: 'full' }));
    // Only once the newcomer parks: one turned away for its body took no one's place.
    if (displaced) this.#giveUp(displaced, { kind: 'full' });
    const target = targetOfHoldOffKey(key);
    const q = this.#queue(target);
    const tier = this.#tier(q, key);
    const cls = opts.cls ?? 0;
    const client = lotClient(q, cls, clientName);
    // It parks behind the release windows of the requests it queues behind (waiting()): its own key's and its target's.
    const windowEndMs = Math.max(tier.spreadUntilMs, q.tiers.get(target)?.spreadUntilMs ?? 0);
    return new Promise<ParkResult>((resolve) => {
      let waitTimer: NodeJS.Timeout | undefined;
      const cutoffMs = opts.deadlineAtMs - opts.minAttemptMs;
      const entry: Entry = {
        route: opts.route,
        key,
        tier,
        cls,
        client,
        seq: this.#seq++,
        bytes,
        deadlineAtMs: opts.deadlineAtMs,
        cutoffMs,
        notBeforeMs: notBefore(windowEndMs > this.#deps.now() ? Math.min(windowEndMs, cutoffMs - 1) : undefined, opts.notBeforeMs),
        alternates: this.#watchable(opts.alternates),
        moveAtMs: undefined,
        settle: (r) => {
          clearTimeout(waitTimer);
          if (entry.alternates) unwatch(q, entry);
          opts.signal.removeEventListener('abort', onAbort);
          this.#perRoute.set(opts.route, (this.#perRoute.get(opts.route) ?? 1) - 1);
          this.#countClient(opts.route, clientName, -1);
          // The entry's own count: what it took is what it gives back.
          this.#deps.bodies?.give(entry.bytes);
          this.#deps.onParkedChange?.(opts.route, -1);
          resolve(this.#count(opts.route, r));
        },
      };
      const onAbort = () => this.#giveUp(entry, { kind: 'aborted' });
      opts.signal.addEventListener('abort', onAbort, { once: true });
      const waitMs = Math.min(opts.maxWaitMs ?? Number.POSITIVE_INFINITY, cutoffMs - this.#deps.now());
      waitTimer = setTimeout(() => this.#giveUp(entry, { kind: 'timeout' }), Math.max(0, waitMs));
      insertByDeadline(q.entries, entry);
      for (const a of entry.alternates ?? []) q.watched.set(a, (q.watched.get(a) ?? 0) + 1);
      tier.parked++;
      client.parked++;
      this.#perRoute.set(opts.route, (this.#perRoute.get(opts.route) ?? 0) + 1);
      this.#countClient(opts.route, clientName, 1);
      this.#deps.onParkedChange?.(opts.route, 1);
      this.#pump(target, q);
    });
  }

  #countClient(route: string, client: string, delta: number): void {
    let counts = this.#perRouteClient.get(route);
    if (!counts) this.#perRouteClient.set(route, (counts = new Map()));
    const n = (counts.get(client) ?? 0) + delta;
    if (n > 0) counts.set(client, n);
    else counts.delete(client);
  }

  /**
   * The route's queue is full: the newest request of its class or a lower one of the client with the most parked on
   * the route, when that is at least two more than the newcomer's client has (so the swap leaves it no fewer), as in
   * the pools: a tenant that filled the queue in an outage would otherwise turn every other tenant's newcomers away.
   * Never one of a higher class: a batch newcomer turned online requests away. Null: no one to displace.
   */
  #displaced(route: string, client: string, cls: number): Entry | null {
    const counts = this.#perRouteClient.get(route);
    if (!counts) return null;
    const own = counts.get(client) ?? 0;
    // No one fuller: the common case of a flood's own newcomers, answered without a scan.
    let fuller = false;
    for (const n of counts.values()) if (n > own + 1) fuller = true;
    if (!fuller) return null;
    let newest: Entry | undefined;
    let most = own + 1;
    for (const q of this.#queues.values()) {
      for (const e of q.entries) {
        if (e.route !== route || e.cls < cls) continue;
        const n = counts.get(e.client.name) ?? 0;
        if (n > most || (n === most && newest !== undefined && e.seq > newest.seq)) [newest, most] = [e, n];
      }
    }
    return newest ?? null;
  }

  /** Takes a parked entry out of its queue and answers it (once: an entry released or answered is out already). */
  #giveUp(e: Entry, r: ParkResult): void {
    const q = this.#queues.get(targetOfHoldOffKey(e.key));
    const i = q ? q.entries.indexOf(e) : -1;
    if (i === -1) return;
    takeOut(q!, i);
    e.settle(r);
  }

  /**
   * The state of a target or of its flex tier may have changed (a breaker transition, a hold-off, a timer): release what
   * may go, and move what was parked elsewhere watching it.
   */
  notify(key: string): void {
    const target = targetOfHoldOffKey(key);
    for (const [t, q] of this.#queues) if (t === target || watches(q, target)) this.#pump(t, q);
  }

  /** The alternates worth watching: those not available now. */
  #watchable(keys: readonly string[] | undefined): readonly string[] | undefined {
    const away = keys?.filter((k) => this.#deps.stateOf(k).mode !== 'available');
    return away && away.length > 0 ? away : undefined;
  }

  /**
   * Entries whose own key is away and one of whose alternates is back leave at a random moment of the next second
   * (never past half their time left), as a key's own parked leave over its release window: a backup that closed its
   * breaker must not get every request parked for the primary in one burst. An alternate only probing takes as many
   * as it has probe slots, at once, first in the queue's order, once per PROBE_MOVE_GAP_MS: with no newcomers (agents
   * that each wait for their answer, all parked) nothing else probes it, and a backup that recovered while the
   * primary's own probe hung waited out that probe's permit (30 s) unused. Returns when to look again: the next such
   * moment, the end of an alternate's hold-off, or the end of a probing alternate's window.
   */
  #moveToAlternates(q: Queue, now: number): number {
    let next = Number.POSITIVE_INFINITY;
    let anyBack = false;
    /** Probing alternates with probe slots the lot may still fill, and how many. */
    let probing: Map<string, number> | undefined;
    const states = new Map<string, TargetState>();
    for (const a of q.watched.keys()) {
      const s = this.#deps.stateOf(a);
      states.set(a, s);
      if (s.mode !== 'probing') this.#probeMoves.delete(a);
      if (s.mode === 'available') anyBack = true;
      else if (s.mode === 'blocked') next = Math.min(next, s.availableAtMs);
      else {
        const free = this.#probeMovesLeft(a, s.slots, now);
        if (free > 0) (probing ??= new Map()).set(a, free);
        else {
          // Looked at again when the window ends; or, while the alternate's own parked hold its probes (they may leave
          // without one: their clients gone, their wait over), a window from now. Never at a moment past: woken for the
          // end of a window long over, the lot looked every millisecond while the one moved waited for a permit.
          const moved = this.#probeMoves.get(a);
          const windowEndMs = moved === undefined ? now : moved.sinceMs + PROBE_MOVE_GAP_MS;
          next = Math.min(next, windowEndMs > now ? windowEndMs : now + PROBE_MOVE_GAP_MS);
        }
      }
    }
    // A probe is carried only by a request whose own key is away: with every key of the queue back (its parked being
    // let go, each release's end a pump), looking for one scanned every parked request per pump.
    let probesLeft = 0;
    if (probing !== undefined && awayParked(q)) for (const n of probing.values()) probesLeft += n;
    // Nothing back, no probe to carry and no one about to leave: nothing to look for entry by entry (the common case
    // of every pump).
    if (!anyBack && probesLeft === 0 && q.moving === 0) return next;
    for (let i = 0; i < q.entries.length; ) {
      const e = q.entries[i]!;
      // Past its cut-off, it times out (the release loop below): never sent anywhere with no time left.
      if (!e.alternates || e.tier.state.mode === 'available' || now >= e.cutoffMs) {
        i++;
        continue;
      }
      const alternateBack = anyBack && e.alternates.some((a) => states.get(a)!.mode === 'available');
      if (e.moveAtMs !== undefined && !alternateBack) {
        // The alternate it was to leave for is away again: gone at its moment, it found every target away and parked
        // again, a `moved` for nothing, in a new place a full queue may have given a newcomer meanwhile. It stays, and
        // gets a new moment once one is back.
        e.moveAtMs = undefined;
        q.moving--;
      }
      if (e.moveAtMs === undefined) {
        if (alternateBack) {
          e.moveAtMs = now + Math.min(MAX_RELEASE_SPREAD_MS * this.#deps.random(), (e.deadlineAtMs - now) / 2, e.cutoffMs - 1 - now);
          q.moving++;
        } else if (probesLeft > 0) {
          const a = e.alternates.find((k) => (probing!.get(k) ?? 0) > 0);
          if (a !== undefined) {
            probing!.set(a, probing!.get(a)! - 1);
            probesLeft--;
            this.#probeMoved(a, now);
            // Looked at again once its window is over: a probe still wanted then goes with the next in order.
            next = Math.min(next, now + PROBE_MOVE_GAP_MS);
            takeOut(q, i);
            e.settle({ kind: 'moved', probe: a });
            continue;
          }
        }
      }
      if (e.moveAtMs !== undefined && e.moveAtMs <= now) {
        takeOut(q, i);
        e.settle({ kind: 'moved' });
        continue;
      }
      if (e.moveAtMs !== undefined) next = Math.min(next, e.moveAtMs);
      i++;
    }
    return next;
  }

  /**
   * How many more requests the lot may move to carry a probing alternate's probes now: its probe slots, less those
   * released from its own queue and still out (they are its probes; a stream begun is no probe any more, as in hasSlot)
   * and those moved in the current window; none while requests parked for the alternate itself wait for its probes.
   * Counted only by the moved, a half-open alternate with one of its three probes out had three more moved, and the
   * last found no permit and parked again.
   */
  #probeMovesLeft(key: string, slots: number, now: number): number {
    const own = this.#queues.get(targetOfHoldOffKey(key));
    if (own && this.#holdsOwnProbes(own)) return 0;
    const out = own ? inflightUpTo(own, own.inflightByClass.length - 1, true) : 0;
    const moved = this.#probeMoves.get(key);
    return slots - out - (moved === undefined || now >= moved.sinceMs + PROBE_MOVE_GAP_MS ? 0 : moved.n);
  }

  /**
   * Are requests parked in the target's queue under a key that is not blocked (they may carry its probes)? Those of a
   * flex tier its own hold-off holds carry none: counted, they kept the lot from probing the target until it ended.
   */
  #holdsOwnProbes(q: Queue): boolean {
    for (const [k, tier] of q.tiers) if (tier.parked > 0 && this.#deps.stateOf(k).mode !== 'blocked') return true;
    return false;
  }

  #probeMoved(key: string, now: number): void {
    const moved = this.#probeMoves.get(key);
    if (moved === undefined || now >= moved.sinceMs + PROBE_MOVE_GAP_MS) this.#probeMoves.set(key, { sinceMs: now, n: 1 });
    else moved.n++;
  }

  /** Targets the lot keeps a queue for (a flex tier's requests are in their target's). */
  get size(): number {
    return this.#queues.size;
  }

  /**
   * Drops the queue of a target key given back (a made-up model name the provider answered 404), once nothing waits
   * on it or was released from it, under either of its keys: a queue is kept per target ever parked on, so such names
   * would grow the lot without bound. Requests still parked or in flight keep theirs (the last to leave drops nothing;
   * the key's next 404, or none, as for the pools).
   */
  forget(key: string): void {
    const target = targetOfHoldOffKey(key);
    this.#probeMoves.delete(key);
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
    if (!q) this.#queues.set(target, (q = { entries: [], tiers: new Map(), inflight: 0, inflightByClass: [], streamingByClass: [], timer: undefined, timerAtMs: NO_TIMER, clients: [], releases: 0, watched: new Map(), moving: 0 }));
    return q;
  }

  #tier(q: Queue, key: string): Tier {
    let tier = q.tiers.get(key);
    if (!tier) q.tiers.set(key, (tier = { parked: 0, blockedSinceMs: undefined, spreadUntilMs: 0, state: AVAILABLE }));
    return tier;
  }

  #pump(target: string, q: Queue): void {
    if (q.entries.length === 0) return;
    const now = this.#deps.now();
    // Where each key its requests parked under stands, read once a pump: the target's, and its flex tier's, which the
    // tier's own hold-off may block alone. Blocked keys wake the lot when they end; the others release.
    let blockedUntilMs = Number.POSITIVE_INFINITY;
    let open = false;
    let back: Tier[] | undefined;
    let backSinceMs = Number.POSITIVE_INFINITY;
    for (const [key, tier] of q.tiers) {
      if (tier.parked === 0) continue;
      const state = (tier.state = this.#deps.stateOf(key));
      if (state.mode === 'blocked') {
        tier.blockedSinceMs ??= now;
        blockedUntilMs = Math.min(blockedUntilMs, state.availableAtMs);
        continue;
      }
      open = true;
      if (tier.blockedSinceMs !== undefined) {
        (back ??= []).push(tier);
        backSinceMs = Math.min(backSinceMs, tier.blockedSinceMs);
      }
    }
    const moveAtMs = q.watched.size > 0 ? this.#moveToAlternates(q, now) : Number.POSITIVE_INFINITY;
    if (!open) {
      this.#wakeAt(target, q, Math.min(blockedUntilMs, moveAtMs));
      return;
    }
    // Keys back at once (a target-wide hold-off over) share one window, their requests their moments in one order.
    if (back) this.#spread(q, back, backSinceMs, now);
    let next = Number.POSITIVE_INFINITY;
    let i = 0;
    while (i < q.entries.length) {
      const entry = q.entries[i]!;
      // Past its cut-off by the clock, though its timer has not fired: a busy event loop runs I/O callbacks (a probe's
      // answer, whose breaker change releases parked requests) before any due timer, and a request released now would
      // reach undici before its deadline's timer could stop it. It times out now, as its timer would have.
      if (now >= entry.cutoffMs) {
        takeOut(q, i);
        entry.settle({ kind: 'timeout' });
        continue;
      }
      const state = entry.tier.state;
      // Held by its key's own hold-off (a flex tier's): it holds back nobody parked under another key.
      if (!inItsWindow(entry, now)) {
        if (state.mode !== 'blocked') next = Math.min(next, entry.notBeforeMs!);
        i++;
        continue;
      }
      // Entries are in class order: one that may not go now (its class and the higher ones have `limit` out, whatever
      // key they parked under) holds back every one after it.
      if (!hasSlot(q, entry)) break;
      // The class's turn may be another client's (a later entry, which may go as well): the entry at i then waits on.
      const j = turnAt(q, i, now);
      const released = q.entries[j]!;
      const { cls, client } = released;
      client.held++;
      client.servedAt = ++q.releases;
      takeOut(q, j);
      q.inflight++;
      q.inflightByClass[cls] = (q.inflightByClass[cls] ?? 0) + 1;
      let reported = false;
      let streaming = false;
      released.settle({
        kind: 'released',
        ticket: {
          done: () => {
            if (reported) return;
            reported = true;
            client.held--;
            forgetIdle(q, client);
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
    // The next moment in the release window, or the end of a key's unavailability; and, while requests of a key that
    // is not blocked wait (a probe's answer moves the breaker and answers raise the limit), a re-check soon in case
    // nothing reports back.
    let openLeft = false;
    for (const tier of q.tiers.values()) if (tier.parked > 0 && tier.state.mode !== 'blocked') openLeft = true;
    this.#wakeAt(target, q, Math.min(next, blockedUntilMs, moveAtMs, openLeft ? now + 250 : Number.POSITIVE_INFINITY));
  }

  /**
   * Keys are back: each request parked under them now gets its moment in the window, never past half its time left
   * nor its cut-off. The random moments are sorted before they are handed out in turns, then deadline order: drawn
   * per request, a request unlucky in window after window (a provider that keeps asking for short pauses) would wait
   * out its whole deadline while later ones went.
   */
  #spread(q: Queue, back: Tier[], sinceMs: number, now: number): void {
    const windowMs = Math.min(MAX_RELEASE_SPREAD_MS, RELEASE_SPREAD_SHARE * (now - sinceMs));
    for (const tier of back) {
      tier.blockedSinceMs = undefined;
      tier.spreadUntilMs = now + windowMs;
    }
    const coming = back.length === q.tiers.size ? q.entries : q.entries.filter((e) => back.includes(e.tier));
    const moments = coming.map(() => windowMs * this.#deps.random()).sort((a, b) => a - b);
    // Handed out in turns: in a class, each client's n-th request before any client's next, then deadline order. In
    // deadline order alone, a flood parked in the outage took the window's first moments, and a quiet client's request
    // parked after it the last, slots free or not.
    const round = new Map<LotClient, number>();
    const rounds = coming.map((e) => {
      const n = round.get(e.client) ?? 0;
      round.set(e.client, n + 1);
      return n;
    });
    const byTurn = (a: number, b: number) => coming[a]!.cls - coming[b]!.cls || rounds[a]! - rounds[b]! || a - b;
    const inTurns = coming.map((_, i) => i).sort(byTurn);
    inTurns.forEach((k, i) => {
      const e = coming[k]!;
      e.notBeforeMs = now + Math.min(moments[i]!, (e.deadlineAtMs - now) / 2, e.cutoffMs - 1 - now);
    });
  }

  #wakeAt(target: string, q: Queue, atMs: number): void {
    // Nothing to wake for: a timer at Infinity would fire at once (Node takes it as 1 ms, with a warning), in a loop.
    if (!Number.isFinite(atMs)) return;
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

/** Takes the i-th entry out of its queue; the last of its key to leave ends the key's spell away (the next starts afresh). */
function takeOut(q: Queue, i: number): void {
  const [entry] = q.entries.splice(i, 1);
  if (--entry!.tier.parked === 0) entry!.tier.blockedSinceMs = undefined;
  entry!.client.parked--;
  forgetIdle(q, entry!.client);
}

function lotClient(q: Queue, cls: number, name: string): LotClient {
  const clients = (q.clients[cls] ??= new Map());
  let c = clients.get(name);
  if (!c) clients.set(name, (c = { name, cls, parked: 0, ...newcomer(q.releases) }));
  return c;
}

/** Does an entry of the queue watch a key of the target (an alternate of its, or that alternate's flex tier)? */
function watches(q: Queue, target: string): boolean {
  for (const a of q.watched.keys()) if (targetOfHoldOffKey(a) === target) return true;
  return false;
}

/** Are requests parked in the queue under a key that is away (not available when the lot last looked)? */
function awayParked(q: Queue): boolean {
  for (const tier of q.tiers.values()) if (tier.parked > 0 && tier.state.mode !== 'available') return true;
  return false;
}

/** A parked entry with alternates leaves: it watches them no more. */
function unwatch(q: Queue, e: Entry): void {
  for (const a of e.alternates!) {
    const n = q.watched.get(a)! - 1;
    if (n > 0) q.watched.set(a, n);
    else q.watched.delete(a);
  }
  if (e.moveAtMs !== undefined) q.moving--;
}

/** A client's entry goes once nothing of it is parked or out: client names come and go with the keys in use. */
function forgetIdle(q: Queue, c: LotClient): void {
  if (c.held === 0 && c.parked === 0) q.clients[c.cls]!.delete(c.name);
}

/** May the entry leave now, by its key's state and its moment in the release window? */
function inItsWindow(e: Entry, now: number): boolean {
  return e.tier.state.mode !== 'blocked' && (e.notBeforeMs === undefined || e.notBeforeMs <= now);
}

/**
 * Is there a slot for the entry: fewer of its class and the higher ones out than its key's state allows? While
 * probing, the slots are the breaker's probes: a stream begun is no probe any more.
 */
function hasSlot(q: Queue, e: Entry): boolean {
  const { state } = e.tier;
  return state.mode !== 'blocked' && inflightUpTo(q, e.cls, state.mode === 'probing') < state.slots;
}

/**
 * The entry whose turn it is, from the i-th (which may go now) on: of the entries of its class that may go now, the
 * earliest-deadline one of the client with the fewest of the class's released requests out (of those, the one served
 * longest ago). With one client in the class (no auth.keys), the i-th; with more, the scan ends once each has shown
 * its first, or once the one found is of a client none goes before (a release of thousands at once scanned the class
 * to its end each time: 4,096 slots for 6,000 parked, 0.3 s in one pump).
 */
function turnAt(q: Queue, i: number, now: number): number {
  const first = q.entries[i]!;
  let clients = 0;
  let foremost = first.client;
  for (const c of q.clients[first.cls]!.values()) {
    if (c.parked === 0) continue;
    clients++;
    if (turnOrder(c, foremost) < 0) foremost = c;
  }
  let best = i;
  const seen = new Set<LotClient>([first.client]);
  for (let j = i + 1; j < q.entries.length && seen.size < clients; j++) {
    if (turnOrder(q.entries[best]!.client, foremost) <= 0) break;
    const e = q.entries[j]!;
    if (e.cls !== first.cls) break;
    if (seen.has(e.client) || now >= e.cutoffMs || !inItsWindow(e, now) || !hasSlot(q, e)) continue;
    seen.add(e.client);
    if (turnOrder(e.client, q.entries[best]!.client) < 0) best = j;
  }
  return best;
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
