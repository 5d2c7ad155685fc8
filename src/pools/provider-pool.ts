// One provider's concurrency, shared by priority classes. An attempt takes a slot and gives it back when its answer is
// over (a stream: when it ends); a request waiting for anything else (backoff, parking) holds none. Waiting requests
// queue by class; within a class the client (auth.keys) holding the fewest of its slots goes first, then arrival. A
// class may use whatever the others leave idle, keeps its minShare under contention, and each target (provider and
// model) also lives under its adaptive limit (policy/adaptive-limit.ts) and, when the provider's rates are configured
// (pools.requestsPerMinute, pools.tokensPerMinute), is granted slots only at those rates: a storm's retries queue here,
// in class order, instead of going out to meet the provider's 429s.
import { classLimit, initialLimit, onRateLimited, onRecovered, onSuccess, type LimitSettings, type LimitState } from '../policy/adaptive-limit.ts';
import { canWait } from '../policy/retry-wait.ts';
import type { RequestSignal } from '../pipeline/request-abort.ts';
import type { WaitingBodies } from './waiting-bodies.ts';
import { MovingAverage } from '../policy/moving-average.ts';
import { FloorHold, onlyTheFloor, sharedSlots } from './floor-hold.ts';
import { newcomer, turnOrder, type Standing } from '../policy/client-turns.ts';
import { rateGiveBack, rateSpend, rateWait, rateWaits, ratesPart, rescaleDues, type RatesAhead, type TargetDues, type TargetRates } from '../policy/target-rate.ts';
import { perMinute, type Rate } from '../policy/client-rate.ts';
import { MAX_TIMER_MS } from '../config/schema.ts';

export interface PoolClass {
  name: string;
  minShare: number;
  /** The most of the pool's capacity the class may hold, idle or not (config: pools.classes.<class>.maxShare); absent, all. */
  maxShare?: number;
  maxQueue: number;
}

interface PoolSettings {
  provider: string;
  capacity: number;
  retryCapacity: number;
  classes: readonly PoolClass[];
  decrease: number;
  minLimit: number;
  /** Each target's rates, the fleet's (pools.requestsPerMinute, tokensPerMinute); an instance paces at its share. */
  rates?: TargetRates | undefined;
}

export interface SlotRequest {
  cls: number;
  target: string;
  retry: boolean;
  deadlineAtMs: number;
  minAttemptMs: number;
  signal: RequestSignal;
  /**
   * Released by the parking lot: admitted when it parked, it has waited, and the lot lets no more go at once than its
   * target's probes or limit. The class queue's bound, there to shed newcomers, does not shed it: released after an
   * outage into a pool with fewer slots than probes (or a retry share smaller than the retries released), such
   * requests were shed `load_shed` just as the provider came back.
   */
  released?: boolean;
  /** Bytes of the request's body: while it waits, they count against server.maxWaitingBodyBytes. */
  bodyBytes?: number;
  /**
   * The client's key (auth.keys) the request came with: a class's slots are shared fairly between its clients, so a
   * tenant flooding its class queues behind its own requests, not in front of everyone else's. Unnamed, one client.
   */
  client?: string;
  /** Its estimated tokens (policy/token-estimate.ts), for a target's token rate: at least 1 counted. */
  tokens?: number;
}

export interface Slot {
  /** Gives the slot back. Safe to call twice. */
  release(): void;
  /** Its attempt was answered: the time from its grant to its release (a stream's: its end) paces the wait estimates. */
  answered(): void;
  /**
   * Nothing was sent on it (its target went away while it waited, or its deadline came): the turn of its target's rates
   * it took goes back. Kept, a backlog granted and parked by a breaker that opened took one turn a second, and the
   * breaker's probe queued behind it waited as long.
   */
  unsent(): void;
}

export type Acquired =
  /** queued: it waited for its slot (what it was admitted on may have changed meanwhile). */
  | { ok: true; slot: Slot; queued: boolean }
  | { ok: false; reason: ShedReason; retryAfterMs: number }
  | { ok: false; reason: 'aborted' };

/**
 * Why a request was shed (stormgate_shed_total's reason label). body_bytes: the bodies of the requests waiting in the
 * instance would pass server.maxWaitingBodyBytes. max_wait: a request parked behind the requests the lot was letting go
 * reached the route's park.maxWaitMs (its deadline still ahead) with no slot for it (see shedWaiting).
 */
export const SHED_REASONS = ['queue_full', 'deadline', 'body_bytes', 'max_wait'] as const;
/**
 * A deadline shed whose wait is its target's rate (pools.requestsPerMinute, pools.tokensPerMinute), not its slots: the
 * client is told that rate, which the operator set, rather than that the provider is at capacity. Counted as deadline.
 */
type RateHold = 'request_rate' | 'token_rate';
/** Why a request was shed, as its answer says it. */
export type ShedReason = (typeof SHED_REASONS)[number] | RateHold;

interface TargetUse {
  inUse: number;
  byClass: number[];
  limit: LimitState;
  /** Lower classes wait until then: the provider's quota is nearly spent. */
  lowerHeldUntilMs: number;
  /** Requests queued for a slot on this target. */
  waiting: number;
  /** Of them, per class, and their tokens (SlotRequest.tokens): a wait for the target's rates counts only those ahead. */
  waitingByClass: number[];
  waitingTokensByClass: number[];
  /** The target's rates' due times (policy/target-rate.ts). */
  dues: TargetDues;
  /**
   * The waiter its token rate holds back, of the highest class and then the earliest: the later ones of its class and
   * those of lower classes wait behind it for the target's tokens. Without it, smaller requests took the tokens as they
   * came back, and one of 3,000 tokens beside a stream of 10-token ones waited until its deadline.
   */
  tokenHold: TokenHold | undefined;
  /** Rate-limit signals of the round trip that began at refusedFromMs (the adaptive limit's `refusedLately`). */
  refusedFromMs: number;
  refusedInRoundTrip: number;
  /** Given back (forget) while a slot was still held (a stream that outlived its twin's 404): dropped at its release. */
  forgottenAs?: string;
}

interface Waiter {
  req: SlotRequest;
  /** Arrival order in the pool: of the waiters of a class that may go, the earliest does, whatever its lane. */
  seq: number;
  lane: Lane;
  /** Out of its lane (granted, expired, aborted): its lane drops it when it comes to the head. */
  gone: boolean;
  enqueuedAtMs: number;
  grant: (slot: Slot) => void;
  /** Leaves the queue without a slot: the one wait rule no longer holds for it, or a fuller client's turn is given away. */
  shed: (reason: ShedReason) => void;
}

/** One client's part of a class in this pool: its standing (slots held, last grant) and its requests waiting. */
interface ClientUse extends Standing {
  waiting: number;
}

/**
 * The waiters of one class and one client for one target, first attempts or retries: admission reads only those
 * (#admissible), so a lane's waiters may all go or none may, and the first waiter of a class that may go is a head of
 * its lanes that may (of the client whose turn it is, the earliest). A queue of thousands held back by one thing (the
 * retry share, its target's limit) is one look, not a scan: a scan bounded to the first 256 let a newcomer take the
 * slot a waiter further down could use.
 */
interface Lane {
  key: string;
  target: TargetUse;
  client: string;
  /** Arrival order; taken from `head` on, and compacted now and then. */
  waiters: Waiter[];
  head: number;
  /** Waiters in it not yet gone. */
  size: number;
}

export interface PoolObserver {
  onWait?: (provider: string, cls: string, seconds: number) => void;
  onShed?: (cls: string, reason: string) => void;
}

/**
 * Round trip assumed before any answer has been timed: an LLM answer takes seconds, and an estimate that is too short
 * tells shed clients to come back before any slot can be free (an SDK then spends its retries in a few hundred ms).
 * The first timed answer replaces it.
 */
const INITIAL_ROUND_TRIP_MS = 1_000;
/** Gone waiters a lane keeps at its front before it copies the rest down (and at least half of it must be gone). */
const LANE_COMPACT_AT = 1_024;
/** The client of requests that name none: without auth.keys, every request is one client's and the queue is by arrival. */
const NO_CLIENT = '';

export class ProviderPool {
  readonly settings: PoolSettings;
  readonly #limitSettings: LimitSettings;
  readonly #targets = new Map<string, TargetUse>();
  /** Per class: its lanes with someone waiting, by target and retry. */
  readonly #lanes: Array<Map<string, Lane>>;
  /** Per class: requests waiting. */
  readonly #queued: number[];
  /** Per class: of them, retries (SlotRequest.retry), which wait for the retry cap too. */
  readonly #retriesQueued: number[];
  #seq = 0;
  #grants = 0;
  readonly #inUseByClass: number[];
  /** Per class: its clients with a slot held or a request waiting. */
  readonly #clients: Array<Map<string, ClientUse>>;
  /**
   * Per class: the most slots held plus requests waiting since the fleet last asked for this pool's demand. A sample
   * taken at the exchange alone misses short-lived demand: online calls that come and go between two exchanges (or are
   * refused at once by a provider another instance's batch flood fills) read as none, and that instance was left one
   * slot while the other took the rest (a third-party fleet run: 30 of 30 online calls answered 429).
   */
  readonly #peakByClass: number[];
  #inUse = 0;
  /** Attempts sent and not yet answered, by breaker target, with when each went out (sending). */
  readonly #unanswered = new Map<string, Map<object, number>>();
  #retriesInUse = 0;
  /** When each retry in flight was granted: the first of them to end frees the retry cap for the next. */
  readonly #retryGrantsAtMs: number[] = [];
  readonly #roundTrip = new MovingAverage(INITIAL_ROUND_TRIP_MS);
  /**
   * How long an answered attempt holds its slot: a stream holds it until it ends, seconds or minutes after the first
   * token that ends its round trip. Slots free at this pace, so the wait estimates (and the retry-after of a shed
   * request) count in it; by round trips, 2,000 streamed agents were told to come back in 1.4 s for a 50 s queue.
   */
  readonly #slotHold = new MovingAverage(INITIAL_ROUND_TRIP_MS);
  /** This instance's share of the fleet's capacity (1 alone; demand-weighted with a shared state store). */
  #capacity: number;
  /**
   * The share this instance can expect at the fleet's next exchange: what the others' last demand leaves. A burst at
   * one instance of an idle fleet starts on an even split; judged by that split, requests the next exchange (half a
   * second away) gives room to were shed. Only the wait estimate reads it: a waiter still without a slot when its
   * deadline nears is shed then (lastChance).
   */
  #attainable: number;
  #retryCapacity: number;
  #holdTimer: NodeJS.Timeout | undefined;
  /** This instance's part of settings.rates: all of them alone, its share of the fleet's capacity in a fleet. */
  #rates: TargetRates | undefined;
  /** One timer for the pool, at the earliest time a waiter held back by its target's rate may go. */
  #rateTimer: NodeJS.Timeout | undefined;
  #rateWakeAtMs = Number.POSITIVE_INFINITY;
  /** Higher classes wait for the fleet to make room before they take a floor slot it did not give (floor-hold.ts). */
  readonly #floor: FloorHold;
  #floorTimer: NodeJS.Timeout | undefined;
  /** Asks the fleet for an exchange now; set by the fleet's sharing (alone, a pool has no one to wait for). */
  #askShare: (() => void) | undefined;
  /** How many classes, from the highest, the last exchange would give a newcomer a slot of its own (fleet-share.ts classesBacked). */
  #backed: number;

  constructor(
    settings: PoolSettings,
    private readonly now: () => number,
    private readonly observer: PoolObserver = {},
    /** Shared by every pool and the parking lot: the bytes of waiting bodies are the instance's, not one provider's. */
    private readonly bodies?: WaitingBodies,
  ) {
    this.settings = settings;
    this.#limitSettings = { max: settings.capacity, min: settings.minLimit, decrease: settings.decrease, minShares: settings.classes.map((c) => c.minShare) };
    this.#capacity = settings.capacity;
    this.#attainable = settings.capacity;
    this.#retryCapacity = settings.retryCapacity;
    this.#rates = settings.rates;
    this.#lanes = settings.classes.map(() => new Map());
    this.#queued = settings.classes.map(() => 0);
    this.#retriesQueued = settings.classes.map(() => 0);
    this.#inUseByClass = settings.classes.map(() => 0);
    this.#clients = settings.classes.map(() => new Map());
    this.#peakByClass = settings.classes.map(() => 0);
    this.#floor = new FloorHold(now);
    this.#backed = settings.classes.length - 1;
  }

  /** In a fleet: `ask` exchanges this pool's demand now, for a newcomer held for room (floor-hold.ts). */
  shareOnDemand(ask: () => void): void {
    this.#askShare = ask;
  }

  /** Index of a class by name, or undefined. */
  classIndex(name: string | undefined): number | undefined {
    if (name === undefined) return undefined;
    // A header sent twice (a batch job's default headers and a proxy's, say) reaches the gateway as `batch, online`:
    // the lowest of the classes it names, as each one alone could only lower the request's class.
    if (name.includes(',')) {
      const named = name.split(',').map((n) => this.classIndex(n)).filter((i) => i !== undefined);
      return named.length === 0 ? undefined : Math.max(...named);
    }
    // Header values are typed by people: `Batch` and ` batch` mean batch.
    const wanted = name.trim().toLowerCase();
    const i = this.settings.classes.findIndex((c) => c.name.toLowerCase() === wanted);
    return i === -1 ? undefined : i;
  }

  async acquire(req: SlotRequest): Promise<Acquired> {
    if (req.signal.aborted) return { ok: false, reason: 'aborted' };
    const t = this.#target(req.target);
    // Its demand goes to the fleet once it waits (the exchange reads the queue), not at the next refresh.
    const askShare = this.#startsFloorHold(req.cls) && this.#floor.arrive();
    if (askShare) this.#armFloorTimer();
    if (!this.#waiterMayGo(req.cls) && this.#admissible(req, t)) {
      // Counted too: a histogram of the waiters alone shows a p95 of the few that queued, or nothing at all.
      this.observer.onWait?.(this.settings.provider, this.settings.classes[req.cls]!.name, 0);
      return { ok: true, slot: this.#take(req, t), queued: false };
    }
    const cls = this.settings.classes[req.cls]!;
    const expected = this.#expectedWait(req.cls, req.target, req.client, tokensOf(req), req.retry);
    const expectedWaitMs = expected.ms;
    const displaced = !req.released && this.#queued[req.cls]! >= cls.maxQueue ? this.#displaced(req) : undefined;
    if (displaced === null) return this.#shed(cls.name, 'queue_full', expectedWaitMs);
    // The one wait rule: a request that cannot expect a slot before its deadline is told so now, not after waiting.
    if (!canWait(this.now(), expectedWaitMs, req.deadlineAtMs, req.minAttemptMs)) return this.#shed(cls.name, expected.heldBy ?? 'deadline', expectedWaitMs);
    const bytes = req.bodyBytes ?? 0;
    if (req.released) this.bodies?.add(bytes);
    else if (this.bodies && !this.#takeBytes(bytes, req.cls, displaced)) return this.#shed(cls.name, 'body_bytes', expectedWaitMs);
    // Only once the newcomer waits: one whose body does not fit took no one's place.
    if (displaced && this.#leave(displaced)) displaced.shed('queue_full');
    return new Promise<Acquired>((resolve) => {
      // Still waiting when less than minAttemptMs is left: shed then, while the client still waits for an answer,
      // rather than hold the request until its deadline and a 504.
      const lastChance = setTimeout(() => {
        if (this.#leave(waiter)) waiter.shed('deadline');
      }, Math.max(0, req.deadlineAtMs - req.minAttemptMs - this.now())).unref();
      const waiter: Waiter = {
        req,
        seq: this.#seq++,
        lane: this.#lane(req, t),
        gone: false,
        shed: () => {},
        enqueuedAtMs: this.now(),
        grant: (slot) => {
          clearTimeout(lastChance);
          req.signal.removeEventListener('abort', onAbort);
          this.observer.onWait?.(this.settings.provider, cls.name, (this.now() - waiter.enqueuedAtMs) / 1000);
          resolve({ ok: true, slot, queued: true });
        },
      };
      const onAbort = () => {
        clearTimeout(lastChance);
        this.#leave(waiter);
        resolve({ ok: false, reason: 'aborted' });
      };
      waiter.shed = (reason) => {
        clearTimeout(lastChance);
        req.signal.removeEventListener('abort', onAbort);
        const expected = this.#expectedWait(req.cls, req.target, req.client, tokensOf(req), req.retry);
        resolve(this.#shed(cls.name, reason === 'deadline' ? (expected.heldBy ?? reason) : reason, expected.ms));
      };
      req.signal.addEventListener('abort', onAbort, { once: true });
      waiter.lane.waiters.push(waiter);
      waiter.lane.size++;
      this.#clientUse(req.cls, waiter.lane.client).waiting++;
      this.#queued[req.cls]!++;
      if (req.retry) this.#retriesQueued[req.cls]!++;
      this.#notePeak(req.cls);
      t.waiting++;
      t.waitingByClass[req.cls]!++;
      t.waitingTokensByClass[req.cls]! += tokensOf(req);
      if (askShare) this.#askShare?.();
      // Waiters ahead may be blocked by their own target's limit or the retry cap, not by capacity.
      this.#drain();
    });
  }

  /**
   * A rough wait for a new request of this class: the queue ahead of it, served at the target's limit per round trip;
   * for a lower class while the target's quota is nearly spent, at least until that hold ends (no slot comes before).
   * Ahead of it in its own class: its client's waiters, and of each other client's as many again and one (its turns
   * alternate with theirs), not a flooding tenant's whole queue. Under its target's rates, at least until they have
   * room for the requests ahead of it on its target and itself (each of `tokens`, as far as it can tell). (A retry's,
   * #expectedWait's with `retry`, also waits for the retry cap: the longest of the holds on it is its wait.)
   */
  expectedWaitMs(cls: number, target: string, client = NO_CLIENT, tokens = 1): number {
    return this.#expectedWait(cls, target, client, tokens).ms;
  }

  /** expectedWaitMs, and the target's rate that makes it, when the wait for a turn of it is longer than for a slot. */
  #expectedWait(cls: number, target: string, client = NO_CLIENT, tokens = 1, retry = false): { ms: number; heldBy: RateHold | undefined } {
    let ahead = 0;
    for (let k = 0; k < cls; k++) ahead += this.#queued[k]!;
    const own = this.#clients[cls]!.get(client)?.waiting ?? 0;
    let aheadInClass = 0;
    for (const [name, use] of this.#clients[cls]!) aheadInClass += name === client ? own : Math.min(use.waiting, own + 1);
    ahead += aheadInClass;
    const t = this.#target(target);
    // A class its maxShare bounds has no more turns a round trip than that share's slots, however idle the pool.
    const perRoundTrip = Math.max(1, Math.min(classLimit(t.limit, cls), this.#attainable, this.#shareSlots(cls)));
    const slotMs = Math.max(this.#roundTrip.value, this.#slotHold.value);
    const slots = Math.ceil((ahead + 1) / perRoundTrip) * slotMs;
    const held = cls > 0 ? Math.max(slots, t.lowerHeldUntilMs - this.now()) : slots;
    // A retry waits for the retry cap as well, whatever else holds it: estimated by the rate alone (a turn a second
    // away), a retry behind one holding the cap for a 20 s stream waited and was shed at its last chance.
    const byRetryCap = retry ? this.#retryCapWait(cls, aheadInClass, slotMs) : 0;
    if (this.#rates === undefined) return { ms: Math.max(held, byRetryCap), heldBy: undefined };
    const rates = rateWaits(t.dues, this.#rates, this.now(), tokens, this.#aheadOnTarget(t, cls, aheadInClass));
    const byRate = Math.max(rates.requests, rates.tokens);
    // A slot free for it and for every request ahead of it: its rate alone holds it, not a round trip for a slot (with
    // 49 of 50 slots free, answers taking 5 s and its turn a second away, a request with 3 s to live was shed, told the
    // provider was at capacity).
    const free = Math.min(this.#capacity - this.#inUse, Math.floor(t.limit.limit) - t.inUse, cls > 0 ? Math.floor(classLimit(t.limit, cls)) - t.byClass[cls]! : Infinity, this.#shareSlots(cls) - this.#inUseByClass[cls]!);
    const bySlots = Math.max(byRate > 0 && ahead + 1 <= free ? (cls > 0 ? Math.max(0, t.lowerHeldUntilMs - this.now()) : 0) : held, byRetryCap);
    if (byRate <= bySlots) return { ms: bySlots, heldBy: undefined };
    return { ms: byRate, heldBy: rates.tokens > rates.requests ? 'token_rate' : 'request_rate' };
  }

  /**
   * The wait of a retry of class `cls` for the retry cap: none while retries in flight and those ahead of it leave
   * room, else a slot's hold per round of the cap they fill (higher classes' waiting retries, and of its own class at
   * most `aheadInClass`, go first).
   */
  #retryCapWait(cls: number, aheadInClass: number, slotMs: number): number {
    let ahead = Math.min(aheadInClass, this.#retriesQueued[cls]!);
    for (let k = 0; k < cls; k++) ahead += this.#retriesQueued[k]!;
    // Room for it and every retry ahead: the common case, answered without looking at the holders.
    if (this.#retriesInUse + ahead + 1 <= this.#retryCapacity) return 0;
    return retryTurnMs(this.#retryGrantsAtMs, this.now(), slotMs, this.#retryCapacity, ahead);
  }

  /**
   * What holds a request shed for its target's rate (`reason`), for its client: which rate, as configured (the fleet's,
   * which this instance paces a share of). Undefined for any other shed: the provider's capacity holds it.
   */
  rateShedWhy(reason: ShedReason, className: string): string | undefined {
    const rate = reason === 'request_rate' ? this.settings.rates?.requests : reason === 'token_rate' ? this.settings.rates?.tokens : undefined;
    if (rate === undefined) return undefined;
    const [what, key] = reason === 'request_rate' ? ['request', 'requestsPerMinute'] : ['token', 'tokensPerMinute'];
    // A token burst under a minute's worth (the default) is pools.tokenBurst's: it holds a request as much as the rate.
    // The minute's worth is the default's, floor(tokensPerMinute), from the unrounded rate: perMinute's three decimals
    // made 6000.9996 a 6001 whose default burst of 6000 read as one set under it. 60,000 / intervalMs can land a hair
    // under a whole rate (29 reads 28.999999999999996), hence the relative margin.
    const burst = reason === 'token_rate' && rate.burst < Math.floor((60_000 / rate.intervalMs) * (1 + 1e-12)) ? `; at most ${rate.burst} at once, pools.tokenBurst` : '';
    return `provider ${this.settings.provider}'s ${what} rate (${perMinute(rate)}/min, pools.${key}${burst}) leaves no turn for class ${className} before the request's deadline`;
  }

  /**
   * The waiters for a target's rates ahead of a newcomer of class `cls`: its target's waiters of higher classes, and of
   * its own class at most those counted ahead of it (at their average estimate). Lower classes and other targets'
   * waiters are not: counted, an online newcomer behind ten batch waiters of its target and five online ones of another
   * was told six turns, and shed, with its turn a second away.
   */
  #aheadOnTarget(t: TargetUse, cls: number, aheadInClass: number): RatesAhead {
    const ahead = { requests: 0, tokens: 0 };
    for (let k = 0; k < cls; k++) {
      ahead.requests += t.waitingByClass[k]!;
      ahead.tokens += t.waitingTokensByClass[k]!;
    }
    const inClass = Math.min(aheadInClass, t.waitingByClass[cls]!);
    if (inClass > 0) {
      ahead.requests += inClass;
      ahead.tokens += (inClass * t.waitingTokensByClass[cls]!) / t.waitingByClass[cls]!;
    }
    return ahead;
  }

  /**
   * The upstream answered an attempt (whose slot is still held; a stream recovery's continuation's too): adapt the
   * target's limit (429/529 mostly shrink it, success grows it).
   */
  observe(target: string, signal: 'rate-limited' | 'success' | 'none', roundTripMs: number): void {
    if (signal === 'none') return;
    const t = this.#target(target);
    if (signal === 'success') {
      // Round trips of answers, not of the instant 429s, pace both the wait estimates and the once-per-round-trip cut.
      if (roundTripMs > 0) this.#roundTrip.add(roundTripMs);
      t.limit = onSuccess(t.limit, this.#limitSettings, this.now(), this.#roundTrip.value, this.#slotHold.value);
    } else {
      const now = this.now();
      if (now - t.refusedFromMs >= this.#roundTrip.value) {
        t.refusedFromMs = now;
        t.refusedInRoundTrip = 0;
      }
      const inUse = { total: t.inUse, byClass: t.byClass, waiting: t.waiting, refusedLately: t.refusedInRoundTrip };
      t.limit = onRateLimited(t.limit, this.#limitSettings, now, this.#roundTrip.value, inUse);
      t.refusedInRoundTrip++;
    }
    // A 429 can raise a class's limit too: refusals judged not to be about our concurrency put the caps back where
    // their burst began, and a batch request waiting for its cap waited beside the room until another answer came.
    this.#drain();
  }

  /** The target's breaker closed after an outage: restart its limit at half and slow-start back. */
  recovered(target: string): void {
    const t = this.#target(target);
    t.limit = onRecovered(t.limit, this.#limitSettings);
  }

  /** Holds lower classes back from the target until the provider's quota resets. */
  holdLowerClasses(target: string, untilMs: number): void {
    const t = this.#target(target);
    if (untilMs <= t.lowerHeldUntilMs) return;
    t.lowerHeldUntilMs = untilMs;
    this.#armHoldTimer();
  }

  /** The target's quota is no longer low (an answer said so): lower classes held back from it go now. */
  endLowerHold(target: string): void {
    const t = this.#targets.get(target);
    if (t === undefined || t.lowerHeldUntilMs <= this.now()) return;
    t.lowerHeldUntilMs = 0;
    this.#armHoldTimer();
    this.#drain();
  }

  /** One timer for the pool, at the end of the earliest hold still in force: each hold's end lets its waiters go. */
  #armHoldTimer(): void {
    const now = this.now();
    let next = Number.POSITIVE_INFINITY;
    for (const t of this.#targets.values()) if (t.lowerHeldUntilMs > now) next = Math.min(next, t.lowerHeldUntilMs);
    clearTimeout(this.#holdTimer);
    this.#holdTimer =
      next === Number.POSITIVE_INFINITY
        ? undefined
        : setTimeout(() => {
            this.#drain();
            this.#armHoldTimer();
            // A reset weeks away (a skewed reset date, `1000h`) is past what a timer can wait: Node fires it in 1 ms,
            // and re-armed at the same delay it spun. Capped, it wakes up once per ~24.8 days and re-arms for the rest.
          }, Math.min(MAX_TIMER_MS, next - now + 1)).unref();
  }

  limitOf(target: string): number {
    return Math.min(this.#target(target).limit.limit, this.#capacity);
  }

  /**
   * An attempt to `target` (a breaker's key: provider/model, whichever route sends it) goes out now; the call returned
   * says it was answered (its whole answer, a stream's first output) or failed. Until then a success may still come
   * from it, which the breaker's consecutive-failures rule waits for (unansweredSince).
   */
  sending(target: string): () => void {
    let sent = this.#unanswered.get(target);
    if (!sent) this.#unanswered.set(target, (sent = new Map()));
    const token = {};
    sent.set(token, this.now());
    return () => {
      sent.delete(token);
      if (sent.size === 0 && this.#unanswered.get(target) === sent) this.#unanswered.delete(target);
    };
  }

  /** Is an attempt to `target` sent `ageMs` ago or earlier still unanswered (sending)? */
  unansweredSince(target: string, ageMs: number): boolean {
    const sent = this.#unanswered.get(target);
    if (!sent) return false;
    const before = this.now() - ageMs;
    for (const at of sent.values()) if (at <= before) return true;
    return false;
  }

  /**
   * Demand on this pool per class, highest first: the most slots in use plus requests waiting at once since the last
   * call (the fleet's exchange), and at least what is in use and waiting now.
   */
  demandByClass(): number[] {
    const demand = this.#queued.map((q, k) => Math.max(this.#peakByClass[k]!, this.#inUseByClass[k]! + q));
    for (let k = 0; k < demand.length; k++) this.#peakByClass[k] = this.#inUseByClass[k]! + this.#queued[k]!;
    return demand;
  }

  #notePeak(cls: number): void {
    const demand = this.#inUseByClass[cls]! + this.#queued[cls]!;
    if (demand > this.#peakByClass[cls]!) this.#peakByClass[cls] = demand;
  }

  /**
   * Takes `share` (0..1] of the configured capacity, so a fleet together stays within maxConcurrent; `othersDemand`,
   * the rest of the fleet's demand at that exchange, bounds what a burst here can expect next; `backed`, the classes
   * from the highest for which a newcomer would get a slot of its own (only those are held for room, floor-hold.ts);
   * `rateShare`, this instance's part of the target's rates (fleet-share.ts rateShare; the share itself by default).
   */
  setShare(share: number, othersDemand = 0, backed = this.settings.classes.length - 1, rateShare = share): void {
    // NaN would become the capacity, which no count of slots in use ever reaches: the pool would stop limiting.
    if (!Number.isFinite(share) || !Number.isFinite(rateShare)) return;
    const before = { slots: this.#capacity, retries: this.#retryCapacity, backed: this.#backed };
    this.#capacity = Math.max(1, Math.round(this.settings.capacity * share));
    this.#attainable = Math.max(this.#capacity, this.settings.capacity - othersDemand);
    this.#retryCapacity = Math.max(1, Math.round(this.settings.retryCapacity * share));
    // The rates by the share itself, not by the slots it rounds to: those, one at least each, summed past the rate.
    const ratesFaster = this.settings.rates !== undefined && this.#ratesTo(ratesPart(this.settings.rates, rateShare));
    if (this.#askShare) {
      const until = this.#floor.untilMs;
      this.#backed = backed;
      this.#floor.exchanged(onlyTheFloor(this.settings.capacity, share, othersDemand) && backed > 0, sharedSlots(this.settings.capacity, share));
      if (backed === 0) this.#floor.end();
      if (this.#floor.untilMs !== until) this.#armFloorTimer();
    }
    // More room lets waiters go now, not at the next slot given back. The retry share rounds apart from the slots: a
    // share from 0.45 to 0.5 of 10 slots and 3 retries keeps 5 slots but makes 1 retry 2, and a retry waiting for it
    // waited beside the room.
    // So do fewer classes held: a class the fleet no longer backs waits for no room it would not get.
    // So do faster rates: a waiter the rate held may go now, not when the timer armed at the slower rate fires.
    if (this.#capacity > before.slots || this.#retryCapacity > before.retries || this.#backed < before.backed || ratesFaster) this.#drain();
  }

  /**
   * Paces at `rates` from now, each target's due times carried over (target-rate.ts rescaleDues); true when a rate
   * got faster or its burst larger, so a waiter it held may go sooner.
   */
  #ratesTo(rates: TargetRates): boolean {
    const from = this.#rates;
    this.#rates = rates;
    if (from === undefined) return true;
    const now = this.now();
    for (const t of this.#targets.values()) rescaleDues(t.dues, from, rates, now);
    const faster = (a: Rate | undefined, b: Rate | undefined) => a !== undefined && b !== undefined && (b.intervalMs < a.intervalMs || b.burst > a.burst);
    return faster(from.requests, rates.requests) || faster(from.tokens, rates.tokens);
  }

  /** For metrics: in use and queued per class, and per named client of each class; each target's limit. */
  snapshot(): { inUse: number[]; queued: number[]; clients: Array<Array<[string, { held: number; waiting: number }]>>; limits: Array<[string, number]> } {
    return {
      inUse: [...this.#inUseByClass],
      queued: [...this.#queued],
      clients: this.#clients.map((m) => [...m].filter(([name]) => name !== NO_CLIENT).map(([name, u]) => [name, { held: u.held, waiting: u.waiting }])),
      limits: [...this.#targets].map(([k, t]) => [k, t.limit.limit]),
    };
  }

  close(): void {
    clearTimeout(this.#holdTimer);
    clearTimeout(this.#floorTimer);
    clearTimeout(this.#rateTimer);
    this.#rateWakeAtMs = Number.POSITIVE_INFINITY;
  }

  /**
   * Does a newcomer of class `cls` start a floor hold? The lowest class never: the floor slot is there for it. Nor one
   * the fleet would give no slot of its own however long it waited.
   */
  #startsFloorHold(cls: number): boolean {
    return cls < Math.min(this.#backed, this.settings.classes.length - 1);
  }

  /** Its waiters go when the hold ends. */
  #armFloorTimer(): void {
    clearTimeout(this.#floorTimer);
    this.#floorTimer = setTimeout(() => this.#drain(), Math.max(0, this.#floor.untilMs - this.now()) + 1).unref();
  }

  /** Drops a target's entry once nothing of it is in flight or queued (its model turned out not to exist). */
  forget(target: string): void {
    // A route on a path the gateway has no API for keeps its own entry, `<target> <route>` (plan-targets.ts limitKey):
    // left out, each made-up model such a route was sent left one behind for good. Rare (a name given back), so a walk.
    const routed = `${target} `;
    for (const [key, t] of this.#targets) {
      if (key !== target && !key.startsWith(routed)) continue;
      if (t.inUse === 0 && t.waiting === 0) this.#targets.delete(key);
      // Kept for what still holds it, and dropped once that lets go, or each made-up name a stream was sent under
      // while its twin got the 404 left an entry (and its gauges) for good.
      else t.forgottenAs = key;
    }
  }

  #target(key: string): TargetUse {
    let t = this.#targets.get(key);
    if (!t) {
      t = { inUse: 0, byClass: this.settings.classes.map(() => 0), limit: initialLimit(this.#limitSettings), lowerHeldUntilMs: 0, waiting: 0, waitingByClass: this.settings.classes.map(() => 0), waitingTokensByClass: this.settings.classes.map(() => 0), dues: {}, tokenHold: undefined, refusedFromMs: Number.NEGATIVE_INFINITY, refusedInRoundTrip: 0 };
      this.#targets.set(key, t);
    }
    return t;
  }

  /**
   * A waiter of class `cls` or a higher one that could take a slot now: a newcomer does not jump it. One held back by
   * what need not hold the newcomer back (the retry share, its own target's limit) does not: behind two retries waiting
   * for the retry share, first attempts queued beside free slots and, the queue full, were shed (12 of 16 streams
   * released after a brownout into a pool with three slots idle).
   */
  #waiterMayGo(cls: number): boolean {
    for (let k = 0; k <= cls; k++) if (this.#first(k) !== undefined) return true;
    return false;
  }

  /** The lane a request waits in (made when none of its kind waits). */
  #lane(req: SlotRequest, t: TargetUse): Lane {
    const client = req.client ?? NO_CLIENT;
    const key = `${req.retry ? 'r' : 'a'} ${req.target}\u0000${client}`;
    const lanes = this.#lanes[req.cls]!;
    let lane = lanes.get(key);
    if (!lane) lanes.set(key, (lane = { key, target: t, client, waiters: [], head: 0, size: 0 }));
    return lane;
  }

  #clientUse(cls: number, client: string): ClientUse {
    const clients = this.#clients[cls]!;
    let use = clients.get(client);
    if (!use) clients.set(client, (use = { ...newcomer(this.#grants), waiting: 0 }));
    return use;
  }

  /** A client's entry goes once it holds and waits for nothing: client names come and go with the keys in use. */
  #forgetIdle(cls: number, client: string, use: ClientUse): void {
    if (use.held === 0 && use.waiting === 0) this.#clients[cls]!.delete(client);
  }

  /**
   * The class queue is full: a newcomer whose client waits for fewer than another client's waiters less one takes the
   * place of that client's newest (shed queue_full, as the newcomer would have been), so a tenant that fills the
   * queue cannot shut the others out of it. Requests the parking lot released, admitted before, keep their place.
   * Null: no one to displace, the newcomer is shed.
   */
  #displaced(req: SlotRequest): Waiter | null {
    const client = req.client ?? NO_CLIENT;
    const own = this.#clients[req.cls]!.get(client)?.waiting ?? 0;
    // Fullest first; one whose waiters the parking lot all released has no place to give, the next may.
    const fuller = [...this.#clients[req.cls]!].filter(([, use]) => use.waiting > own + 1).sort((a, b) => b[1].waiting - a[1].waiting);
    for (const [name] of fuller) {
      const newest = this.#newestOf(req.cls, name);
      if (newest) return newest;
    }
    return null;
  }

  /**
   * Counts a newcomer's body against server.maxWaitingBodyBytes, with the body of the waiter it displaces given back
   * first (it leaves the queue if the newcomer waits); false, counting nothing, when it does not fit.
   */
  #takeBytes(bytes: number, cls: number, displaced: Waiter | undefined): boolean {
    return this.bodies!.takeInPlaceOf(bytes, cls > 0 && cls === this.settings.classes.length - 1, displaced?.req.bodyBytes ?? 0);
  }

  /** A client's newest waiter of the class that the parking lot did not release. */
  #newestOf(cls: number, client: string): Waiter | undefined {
    let newest: Waiter | undefined;
    for (const lane of this.#lanes[cls]!.values()) {
      if (lane.client !== client) continue;
      for (let i = lane.waiters.length - 1; i >= lane.head; i--) {
        const w = lane.waiters[i]!;
        if (newest !== undefined && w.seq < newest.seq) break;
        if (!w.gone && !w.req.released) {
          newest = w;
          break;
        }
      }
    }
    return newest;
  }

  /** Takes a waiter out of its lane (granted, expired or aborted); false when it was out already. */
  #leave(w: Waiter): boolean {
    if (w.gone) return false;
    w.gone = true;
    this.bodies?.give(w.req.bodyBytes ?? 0);
    const lane = w.lane;
    lane.size--;
    const use = this.#clientUse(w.req.cls, lane.client);
    use.waiting--;
    this.#forgetIdle(w.req.cls, lane.client, use);
    this.#queued[w.req.cls]!--;
    if (w.req.retry) this.#retriesQueued[w.req.cls]!--;
    lane.target.waiting--;
    lane.target.waitingByClass[w.req.cls]!--;
    lane.target.waitingTokensByClass[w.req.cls]! -= tokensOf(w.req);
    // The held-back waiter gone (granted, shed, aborted): those behind it look again now.
    if (lane.target.tokenHold?.seq === w.seq) {
      lane.target.tokenHold = undefined;
      this.#armRateTimer(this.now());
    }
    // An empty lane goes: lanes are per target, and targets come and go (made-up model names).
    if (lane.size === 0) this.#lanes[w.req.cls]!.delete(lane.key);
    return true;
  }

  /** The first waiter of a lane still in it. */
  #head(lane: Lane): Waiter | undefined {
    const { waiters } = lane;
    while (lane.head < waiters.length && waiters[lane.head]!.gone) lane.head++;
    if (lane.head >= LANE_COMPACT_AT && lane.head * 2 >= waiters.length) {
      lane.waiters = waiters.slice(lane.head);
      lane.head = 0;
    }
    return lane.waiters[lane.head];
  }

  /**
   * The waiter of class `cls` that can take a slot now (and whose target passes `also`, when given): of the client
   * whose turn it is (policy/client-turns.ts: the fewest of the class's slots held, then served longest ago), the
   * earliest. The one look both a newcomer (may it go first?) and a freed slot (who gets it?) take. Time left is not
   * judged here.
   */
  #first(cls: number, also?: (t: TargetUse) => boolean): Waiter | undefined {
    // A full pool admits no one (#admissible): with a lane per client and target, the look was a scan of thousands.
    if (this.#inUse >= this.#capacity) return undefined;
    let first: Waiter | undefined;
    let firstUse: ClientUse | undefined;
    const clients = this.#clients[cls]!;
    for (const lane of this.#lanes[cls]!.values()) {
      const w = this.#head(lane);
      if (w === undefined) continue;
      const use = clients.get(lane.client)!;
      if (first !== undefined && !goesBefore(use, w, firstUse!, first)) continue;
      if (!this.#admissible(w.req, lane.target, w.seq) || (also !== undefined && !also(lane.target))) continue;
      first = w;
      firstUse = use;
    }
    return first;
  }

  /** `seq`: a waiter's place in arrival order (a newcomer comes after every waiter). */
  #admissible(req: SlotRequest, t: TargetUse, seq = Number.POSITIVE_INFINITY): boolean {
    if (this.#inUse >= this.#capacity) return false;
    if (req.retry && this.#retriesInUse >= this.#retryCapacity) return false;
    if (t.inUse >= Math.max(1, Math.floor(t.limit.limit))) return false;
    if (req.cls > 0 && t.byClass[req.cls]! >= classLimit(t.limit, req.cls)) return false;
    if (req.cls > 0 && t.lowerHeldUntilMs > this.now()) return false;
    if (this.#atMaxShare(req.cls)) return false;
    // A floor hold, once a higher class started it, holds every class: a lower one let in would take the floor slot
    // the held request waits for, and be the request beyond the provider's capacity the hold keeps back. Only a
    // request that can wait it out is held (the estimate leaves the hold out for that reason): one whose deadline is
    // nearer takes the floor slot at once, as it would have without the hold, rather than be shed.
    if (this.#floor.holds() && canWait(this.now(), this.#floor.untilMs - this.now(), req.deadlineAtMs, req.minAttemptMs)) return false;
    // Last: a wake-up is armed only for a waiter the rate alone holds back.
    return this.#rates === undefined || this.#ratesAllow(req, t, this.#rates, seq);
  }

  /** Whether the class holds its maxShare of the pool already: the rest is kept for the others. */
  #atMaxShare(cls: number): boolean {
    return this.#inUseByClass[cls]! >= this.#shareSlots(cls);
  }

  /** The slots the class may hold at most by its maxShare (at least one); without one, no bound. */
  #shareSlots(cls: number): number {
    const maxShare = this.settings.classes[cls]!.maxShare;
    return maxShare !== undefined && maxShare < 1 ? Math.max(1, Math.floor(maxShare * this.#capacity)) : Number.POSITIVE_INFINITY;
  }

  /** Whether the target's rates have room for the request now; if not, the pool looks again when they have. */
  #ratesAllow(req: SlotRequest, t: TargetUse, rates: TargetRates, seq: number): boolean {
    const now = this.now();
    const tokens = tokensOf(req);
    const tokensShort = (n: number) => rates.tokens !== undefined && rateWait(t.dues, { tokens: rates.tokens }, now, n) > 0;
    // Behind the waiter the token rate holds back (the pool's timer wakes it), while its tokens are what hold it: held
    // by something else (the retry cap), it keeps no one from tokens it could not take.
    const hold = t.tokenHold;
    if (hold !== undefined && !goesFirst(req.cls, seq, hold) && tokensShort(hold.tokens)) return false;
    const wait = rateWait(t.dues, rates, now, tokens);
    if (wait === 0) return true;
    this.#armRateTimer(now + wait);
    // A waiter (not a newcomer) its tokens hold back, rather than the request rate every request waits for alike.
    if (seq !== Number.POSITIVE_INFINITY && tokensShort(tokens) && (hold === undefined || goesFirst(req.cls, seq, hold))) t.tokenHold = { cls: req.cls, seq, tokens };
    return false;
  }

  #armRateTimer(atMs: number): void {
    if (atMs >= this.#rateWakeAtMs) return;
    clearTimeout(this.#rateTimer);
    this.#rateWakeAtMs = atMs;
    this.#rateTimer = setTimeout(() => {
      this.#rateWakeAtMs = Number.POSITIVE_INFINITY;
      this.#drain();
    }, Math.ceil(atMs - this.now())).unref();
  }

  #take(req: SlotRequest, t: TargetUse): Slot {
    const client = req.client ?? NO_CLIENT;
    const use = this.#clientUse(req.cls, client);
    use.held++;
    use.servedAt = ++this.#grants;
    this.#inUse++;
    this.#inUseByClass[req.cls]!++;
    this.#notePeak(req.cls);
    t.inUse++;
    t.byClass[req.cls]!++;
    const grantedAtMs = this.now();
    if (req.retry) {
      this.#retriesInUse++;
      this.#retryGrantsAtMs.push(grantedAtMs);
    }
    if (this.#rates) rateSpend(t.dues, this.#rates, grantedAtMs, tokensOf(req));
    let released = false;
    let answered = false;
    let sent = true;
    return {
      answered: () => {
        answered = true;
      },
      unsent: () => {
        if (released || !sent) return;
        sent = false;
        if (this.#rates) rateGiveBack(t.dues, this.#rates, this.now(), tokensOf(req));
      },
      release: () => {
        if (released) return;
        released = true;
        if (answered) this.#timeSlotHold(this.now() - grantedAtMs);
        use.held--;
        this.#forgetIdle(req.cls, client, use);
        this.#inUse--;
        this.#inUseByClass[req.cls]!--;
        t.inUse--;
        t.byClass[req.cls]!--;
        if (t.forgottenAs !== undefined && t.inUse === 0 && t.waiting === 0 && this.#targets.get(t.forgottenAs) === t) this.#targets.delete(t.forgottenAs);
        if (req.retry) {
          this.#retriesInUse--;
          this.#retryGrantsAtMs.splice(this.#retryGrantsAtMs.indexOf(grantedAtMs), 1);
        }
        this.#drain();
      },
    };
  }

  #timeSlotHold(heldMs: number): void {
    if (heldMs <= 0) return;
    this.#slotHold.add(heldMs);
  }

  /** Grants free slots: first to classes under their minShare floor, then by class, then by arrival. */
  #drain(): void {
    for (;;) {
      const waiter = this.#nextUnderFloor() ?? this.#nextByPriority();
      if (!waiter) return;
      waiter.grant(this.#take(waiter.req, waiter.lane.target));
    }
  }

  #nextUnderFloor(): Waiter | undefined {
    for (let k = this.#lanes.length - 1; k >= 1; k--) {
      const minShare = this.settings.classes[k]!.minShare;
      const floor = Math.floor(minShare * this.#capacity);
      if (this.#inUseByClass[k]! < floor) {
        // The floor is a share of what the target takes now, not of the pool: once 429s cut a target's limit to 2, a
        // floor of 2 (a tenth of maxConcurrent 20) was all of it, and online waited behind batch.
        // Under a request rate, of what the rate lets be in flight: with slots to spare, a class under its floor of the
        // pool took every turn of the rate, and online waited behind batch's backlog.
        const w = this.#pick(k, (t) => t.byClass[k]! < Math.floor(minShare * Math.min(this.#capacity, t.limit.limit, this.#rates ? t.inUse + 1 : Infinity)));
        if (w) return w;
      }
    }
    return undefined;
  }

  /** Higher classes first; a lower class gets a slot only when no higher waiter can use it (idle capacity is anyone's). */
  #nextByPriority(): Waiter | undefined {
    for (let k = 0; k < this.#lanes.length; k++) {
      const w = this.#pick(k);
      if (w) return w;
    }
    return undefined;
  }

  /** Takes out the first waiter of the class that can take a slot now (and whose target passes `also`, when given). */
  #pick(cls: number, also?: (t: TargetUse) => boolean): Waiter | undefined {
    const now = this.now();
    for (;;) {
      const w = this.#first(cls, also);
      if (w === undefined) return undefined;
      this.#leave(w);
      // The one wait rule again at the moment of the grant: a slot is no use to an attempt with no time left.
      if (canWait(now, 0, w.req.deadlineAtMs, w.req.minAttemptMs)) return w;
      w.shed('deadline');
    }
  }

  /**
   * A request of class `cls` for `target` shed outside the pool's own queue (it waited behind parked requests the lot
   * was letting go at this pool's limit): counted as the pool's sheds are, with the pool's wait estimate for its client to
   * come back after (without it, a flooding client was told one turn, not its queue). `reason`: what its wait ran into,
   * its deadline or the route's park.maxWaitMs.
   */
  shedWaiting(cls: number, target: string, client?: string, tokens?: number, reason: 'deadline' | 'max_wait' = 'deadline'): number {
    const retryAfterMs = this.expectedWaitMs(cls, target, client, tokens);
    this.#shed(this.settings.classes[cls]!.name, reason, retryAfterMs);
    return retryAfterMs;
  }

  #shed(cls: string, reason: ShedReason, retryAfterMs: number): Acquired {
    this.observer.onShed?.(cls, reason === 'request_rate' || reason === 'token_rate' ? 'deadline' : reason);
    return { ok: false, reason, retryAfterMs };
  }
}

/** The waiter a target's token rate holds back: its class, its place in arrival order and its tokens. */
interface TokenHold {
  cls: number;
  seq: number;
  tokens: number;
}

/** Does a request of class `cls` and arrival `seq` go before the waiter `hold` (of the higher class, then the earlier)? */
function goesFirst(cls: number, seq: number, hold: TokenHold): boolean {
  return cls < hold.cls || (cls === hold.cls && seq <= hold.seq);
}

/** What a request counts for under a token rate: its estimate, at least one token. */
function tokensOf(req: SlotRequest): number {
  return Math.max(1, req.tokens ?? 1);
}

/** Does waiter `w` (of a client using `use`) go before `other`: its client's turn comes first, or it came first. */
function goesBefore(use: ClientUse, w: Waiter, otherUse: ClientUse, other: Waiter): boolean {
  const order = turnOrder(use, otherUse);
  return order !== 0 ? order < 0 : w.seq < other.seq;
}

/**
 * When a retry with `ahead` retries queued before it gets a place under the retry cap: each retry in flight is expected
 * to end a slot's hold after its grant (`grantsAtMs`; now, once that is past), each place it frees goes to the next
 * in line, who holds it a slot's hold. Its own turn is at the place that frees `ahead`-th: the holder nearest its end
 * frees the first (counted a whole hold away, a retry behind one 19.5 s into a 20 s answer was shed at once, told
 * 20 s, where it would have been seated half a second later), but one with another retry ahead of it waits for the
 * second (taken as the first, it was told 0.5 s with the other holder 19 s from its end).
 */
export function retryTurnMs(grantsAtMs: readonly number[], nowMs: number, slotMs: number, capacity: number, ahead: number): number {
  const ends = grantsAtMs.map((at) => Math.max(0, slotMs - (nowMs - at))).sort((a, b) => a - b);
  // The cap's places free at these moments: unused ones now; with more in flight than the cap (a fleet share just
  // shrank it), a place frees only once the excess has ended.
  const places = ends.length >= capacity ? ends.slice(ends.length - capacity) : [...new Array<number>(capacity - ends.length).fill(0), ...ends];
  return places[ahead % capacity]! + Math.floor(ahead / capacity) * slotMs;
}
