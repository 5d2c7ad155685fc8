// The Redis state store: the fleet shares breaker records, hold-offs, probe permits, outcome windows and retry
// budgets through one Redis (or Sentinel, or Cluster). Every multi-step operation is one Lua script (redis-scripts.ts).
// Breaker records and hold-offs are read synchronously on the request path, so they live in a local cache that every
// instance keeps fresh through pub/sub. When Redis cannot answer, the store never throws: it serves from an in-process
// MemoryStore (which it feeds all along, so local windows are warm), says so once, and returns to Redis by itself,
// writing back what it decided alone where that is newer than what Redis holds (a breaker it opened, a hold-off).
// A Redis that refuses the configuration (password, db, ACL) is served around the same way, but reported as such.
// Every time written to Redis is in Redis's clock, and read back in this instance's (fleet-clock.ts): the instances'
// own clocks may disagree by seconds or minutes.
import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import type { Logger } from 'pino';
import type { StateConfig } from '../config/schema.ts';
import { outranksFleet } from '../policy/breaker.ts';
import { MemoryStore } from './memory-store.ts';
import { connectRedis, type RedisConnection } from './redis-client.ts';
import { configProblem, isCommandTimeout, isReadOnly, safeError, type ConfigProblem } from './redis-errors.ts';
import { decodeBreaker, decodeChange, encodeBreaker, encodeChange, RedisKeys } from './redis-keys.ts';
import { defineScripts, type ScriptClient } from './redis-scripts.ts';
import { decodeKeyRecord, encodeKeyRecord } from './kept-keys.ts';
import { FleetClock, redisTimeMs } from './fleet-clock.ts';
import { FleetView, withTimes } from './redis-view.ts';
import { budgetOf, MAX_WINDOW_S, type BreakerRecord, type BudgetConfig, type BudgetWindow, type KeyRecord, type OutcomeWindow, type StateChange, type StateStore } from './store.ts';

export interface RedisStoreOptions {
  /** `state` from the config; `redis` must be set. */
  config: StateConfig;
  logger?: Logger;
  /** Clock for what the caller does not time itself (a hold-off key's expiry, pruning unsent counts). Default: Date.now. */
  now?: () => number;
  /** The most idempotency answer bytes kept in the process while Redis is away (config: idempotency.memoryBytes). */
  keptBytes?: number;
  /** How often Redis's clock is read again, in ms (see CLOCK_READ_MS). Default: 10000. */
  clockReadMs?: number;
}

/** How a run under an idempotency key ended, to be written to Redis: its kept answer, or its owner's claim given back. */
type KeyEnd = { record: KeyRecord & { state: 'done' }; owner: string | undefined; untilMs: number } | { record?: undefined; owner: string; untilMs: number };

/** Batched request counts are sent at most this far apart. */
const FLUSH_INTERVAL_MS = 50;
/** An instance whose demand is older than this has left the fleet's share computation. */
const DEMAND_STALE_MS = 3_000;

/** While degraded on a live connection (timeouts, refused writes), how often a keyed write checks whether Redis takes writes again. */
const PROBE_INTERVAL_MS = 1000;
/**
 * After Redis refused a command for a configuration reason (an ACL without a command the gateway needs), how long the
 * store stays on local state before it tries Redis again: a PING would pass at once, and flapping helps nobody.
 */
const CONFIG_RETRY_MS = 30_000;
/**
 * A store that degrades again within this long of recovering is flapping (a Redis slow every other second): each such
 * flap doubles the health checks in a row that must pass before it recovers again, up to MAX_CLEAN_PROBES. Flipping
 * every second, the gauge read 0 at most scrapes and the degraded alert (`for: 2m`) never fired, two log lines a
 * second said so, and every flip changed where the fleet's state was decided.
 */
const FLAP_WINDOW_MS = 60_000;
const MAX_CLEAN_PROBES = 16;
/** Probes that time out in a row (a second apart) before the store drops the connection for a new one. */
const RECONNECT_AFTER_PROBE_TIMEOUTS = 2;
/** The health check's key expires this long after it is written. */
const PROBE_TTL_MS = 1000;
/** After Redis refused the events channel (ACL), how often the subscriber asks again, so a fixed ACL is picked up. */
const SUBSCRIBE_RETRY_MS = 1000;
/**
 * How often the subscriber connection is asked for a PING, and how long its answer may take before the connection is
 * replaced (see #checkSubscriber). Off the request path: generous, so a slow Redis does not churn connections.
 */
const SUBSCRIBER_CHECK_MS = 5000;
const SUBSCRIBER_ANSWER_MS = 2000;
/**
 * How often Redis's clock is read again: a VM resumed from suspend, or a clock NTP stepped, moves this instance's
 * clock against the fleet's at once, and the shared state would be read that far off until the next reading.
 */
const CLOCK_READ_MS = 10_000;
/** Readings of Redis's clock taken at most, one after another, for one whose round trip is short enough to use. */
const CLOCK_READINGS = 3;
/** How long close() waits for QUIT before it drops the connections. */
const QUIT_WAIT_MS = 200;
/** A hold-off key outlives the hold-off by this much, so a late reader still sees when it ended. */
const HOLD_OFF_GRACE_MS = 60_000;
/**
 * Command timeouts in a row that make the store degraded. One alone is no outage: on a busy event loop the command's
 * timer can fire before the reply that is already waiting in the socket is read, and each such call is answered from
 * local state anyway. A lost connection degrades at once.
 */
const DEGRADE_AFTER_TIMEOUTS = 3;
/**
 * A breaker record lives this long after its last change, so the targets of a fleet that moved on (a model renamed,
 * a provider removed) do not stay in Redis forever. One that expires was closed and idle, or is still in every
 * instance's view and written back by its next change.
 */
const BREAKER_TTL_MS = 7 * 24 * 3600 * 1000;

export class RedisStore implements StateStore {
  readonly kind = 'redis';
  /** Tags our own messages, so a change fires onChange once here even though Redis echoes it back. */
  readonly #id = randomUUID();
  readonly #keys: RedisKeys;
  readonly #client: ScriptClient;
  readonly #sub: RedisConnection;
  readonly #local: MemoryStore;
  readonly #logger: Logger | undefined;
  readonly #now: () => number;
  readonly #view: FleetView;
  /** This instance's clock against Redis's: every time sent to Redis is in Redis's clock, every time read in ours. */
  readonly #clock = new FleetClock();
  /** Redis's clock has been read once (or could not be: then the clocks are taken to agree, as before there was a reading). */
  #clockRead = false;
  #clockTimer: NodeJS.Timeout | undefined;
  /** Targets whose breaker or hold-off this instance has asked about: re-read from Redis after every reconnect. */
  readonly #watched = new Set<string>();
  readonly #toRead = new Set<string>();
  /** Targets re-read because Redis refused a permit for a breaker record this instance's view does not match. */
  readonly #reconciling = new Set<string>();
  /** First reads in flight, by target (see firstRead); the batch of #toRead they belong to. */
  readonly #reading = new Map<string, Promise<void>>();
  #batch: Promise<void> | undefined;
  /** Request counts not yet sent, per budget key and second. */
  readonly #pending = new Map<string, Map<number, number>>();
  /**
   * Retries taken on local state (Redis not yet or no longer usable), per budget key and second: sent when Redis is
   * back, so the fleet's budget counts them instead of granting the same retries again.
   */
  readonly #pendingRetries = new Map<string, Map<number, number>>();
  /** Idempotency keys this instance claimed in Redis (or may have: the claim's answer was lost), until their claims lapse. */
  readonly #claimedInRedis = new Map<string, { owner: string; untilMs: number }>();
  /**
   * How runs under keys of #claimedInRedis ended while Redis was away (a kept answer, or no record: the key given back),
   * each until it would have lapsed in Redis anyway: written when Redis is back. Else the run's claim stayed there for
   * the route's timeout plus ttlMs, and every repeat on the fleet waited for a run that was over, then got a 409.
   */
  readonly #keyEnds = new Map<string, KeyEnd>();
  readonly #degradedListeners = new Set<(degraded: boolean) => void>();
  #flushTimer: NodeJS.Timeout | undefined;
  #probeTimer: NodeJS.Timeout | undefined;
  #subscribeTimer: NodeJS.Timeout | undefined;
  #subscriberTimer: NodeJS.Timeout | undefined;
  #subscriberAsked = false;
  #lastError: unknown;
  /** A configuration problem Redis reported on the current command connection: it stays unused until a new one. */
  #misconfigured: ConfigProblem | undefined;
  /** Configuration problems already logged (once each, not at every reconnect); forgotten when a connection comes up sound. */
  readonly #reported = new Set<string>();
  /** When Redis last refused a command for a configuration reason (Date.now()). */
  #refusedAtMs: number | undefined;
  #degraded = false;
  #subscribed = false;
  #closed = false;

  constructor(opts: RedisStoreOptions) {
    this.#local = new MemoryStore({ ...(opts.keptBytes !== undefined && { keptBytes: opts.keptBytes }) });
    this.#keys = new RedisKeys(opts.config.keyPrefix);
    this.#logger = opts.logger;
    this.#now = opts.now ?? Date.now;
    this.#commandTimeoutMs = opts.config.commandTimeoutMs;
    this.#view = new FleetView((err) => this.#logger?.error({ err }, 'state store change listener threw'));
    this.#client = defineScripts(connectRedis(opts.config, { subscriber: false }));
    this.#sub = connectRedis(opts.config, { subscriber: true });

    // 'connect' comes before AUTH and SELECT are answered: a new connection starts with a clean slate.
    this.#client.on('connect', () => (this.#misconfigured = undefined));
    // Redis's clock is read before the store uses a new connection: the first times it writes must already be in it.
    this.#client.on('ready', () => void this.#readClock().then(() => this.#client.status === 'ready' && this.#onConnected()));
    // A connection that closes without an error event (a killed Redis) must not be reported with an older error.
    this.#client.on('close', () => {
      this.#lastError ??= new Error('connection to Redis closed');
      this.#setDegraded(true);
    });
    // Connection errors are expected while Redis is away; the degraded warning reports the last one. Configuration
    // errors are not: they are logged as such (once each).
    this.#client.on('error', (err: unknown) => this.#connectionError(err, true));
    this.#client.on('node error', (err: unknown) => this.#connectionError(err, true));
    this.#sub.on('ready', () => void this.#subscribe());
    this.#sub.on('close', () => (this.#subscribed = false));
    this.#sub.on('error', (err: unknown) => this.#connectionError(err, false));
    this.#sub.on('node error', (err: unknown) => this.#connectionError(err, false));
    this.#sub.on('message', (channel: string, message: string) => this.#onMessage(channel, message));
    this.#subscriberTimer = setInterval(() => this.#checkSubscriber(), SUBSCRIBER_CHECK_MS).unref();
    this.#clockTimer = setInterval(() => void (this.#usable() && this.#readClock()), opts.clockReadMs ?? CLOCK_READ_MS).unref();
  }

  get degraded(): boolean {
    return this.#degraded;
  }

  /**
   * Resolves true once both connections are up and subscribed; false after timeoutMs, or at once when Redis refused
   * the configuration (a wrong password does not fix itself). Optional: the store works before, on local state.
   */
  async ready(timeoutMs = 5000): Promise<boolean> {
    const until = Date.now() + timeoutMs;
    while (!(this.#client.status === 'ready' && this.#clockRead && this.#subscribed && !this.#misconfigured)) {
      if (this.#closed || this.#misconfigured || Date.now() >= until) return false;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    return true;
  }

  /**
   * The start-up stops waiting for Redis: from here the store serves on local state, and says so (the gauge, /readyz)
   * until Redis answers; else both said "on Redis" until the first commands timed out.
   */
  startWithoutRedis(): void {
    if (!this.#closed && this.#client.status !== 'ready') this.#setDegraded(true);
  }

  async addOutcomes(target: string, generation: number, delta: OutcomeWindow, nowMs: number, windowS: number): Promise<OutcomeWindow> {
    // The local window is fed too, so it is warm if Redis goes away.
    const local = this.#local.addOutcomes(target, generation, delta, nowMs, windowS);
    const key = this.#keys.outcomes(target, generation);
    return this.#run(
      key,
      async (c) => {
        const [requests, failures] = await c.sgAddOutcomes(key, second(this.#clock.toFleet(nowMs)), windowS, delta.requests, delta.failures, (windowS + 5) * 1000);
        return { requests, failures };
      },
      () => local,
    );
  }

  getBreaker(target: string): BreakerRecord | undefined {
    const record = this.#view.breaker(target);
    if (!record) this.#watch(target);
    return record;
  }

  firstRead(target: string): Promise<void> | undefined {
    this.#watch(target);
    return this.#reading.get(target);
  }

  async casBreaker(target: string, expectedGeneration: number, next: BreakerRecord): Promise<boolean> {
    this.#watched.add(target);
    if (this.#usable()) {
      try {
        return await this.#casRemote(target, expectedGeneration, next);
      } catch (err) {
        this.#failed(err, this.#keys.breaker(target));
      }
    }
    return this.#view.casBreaker(target, expectedGeneration, next);
  }

  async takePermit(target: string, max: number, ttlMs: number, nowMs: number, generation?: number): Promise<string | null> {
    const ttl = Math.max(1, Math.ceil(ttlMs));
    const key = this.#keys.permits(target);
    const id = randomUUID();
    return this.#run(
      key,
      (c) =>
        c.sgTakePermit(key, this.#keys.breaker(target), this.#clock.toFleet(nowMs), max, this.#clock.toFleet(nowMs) + ttlMs, ttl, id, generation ?? '').then(
          (taken) => {
            if (taken !== 0) return taken;
            // The fleet's record is not the one this instance judged by. Usually its message is on the way; but where
            // this instance's own write never reached Redis (a command lost with a Cluster master that failed over,
            // too few timeouts in a row to go degraded), its view moved alone, no message or reconnect ever corrects
            // it, and every probe was refused: the breaker stayed open for good on this instance alone. A re-read
            // settles it by the reconnect's rule (what it opened alone and still holds open is written back).
            // One re-read per target at a time: every request of a half-open window is refused alike.
            if (!this.#reconciling.has(target)) {
              this.#reconciling.add(target);
              void this.refresh([target]).finally(() => this.#reconciling.delete(target));
            }
            return null;
          },
          (err: unknown) => {
            // A call that timed out still runs once Redis gets to it (a paused, stopped or busy Redis runs what is
            // queued), and its permit would hold one of the fleet's probes for the attempt's whole limit (up to
            // firstTokenMs) while this instance probes on a local one: the fleet's next probe waited ~30 s after Redis
            // was fine again.
            this.#dropPermit(key, id);
            throw err;
          },
        ),
      // Degraded, the local permits stand alone (the local store keeps no breaker records of its own to check against).
      () => this.#local.takePermit(target, max, ttlMs, nowMs),
    );
  }

  async releasePermit(target: string, permitId: string): Promise<void> {
    // The id may come from either side of a degraded spell; releasing an unknown id is harmless on both.
    await this.#local.releasePermit(target, permitId);
    const key = this.#keys.permits(target);
    if (this.#usable()) await this.#run(key, async (c) => void (await c.zrem(key, permitId)), () => undefined);
    // Degraded on a live connection (a slow Redis), a permit taken from Redis before would otherwise stay taken there
    // for its whole time to live after the probe ended, and hold back the fleet's next probe once Redis is back.
    else this.#dropPermit(key, permitId);
  }

  addRequests(budgetKey: string, n: number, nowMs: number): void {
    this.#local.addRequests(budgetKey, n, nowMs);
    addPending(this.#pending, budgetKey, this.#clock.toFleet(nowMs), n);
    this.#flushTimer ??= setTimeout(() => this.#flush(), FLUSH_INTERVAL_MS).unref();
  }

  async takeRetry(budgetKey: string, cfg: BudgetConfig, nowMs: number, force = false): Promise<boolean> {
    const remote = await this.#budget(budgetKey, cfg, nowMs, force ? 'force' : 'take');
    if (remote === undefined) {
      const allowed = await this.#local.takeRetry(budgetKey, cfg, nowMs, force);
      // Sent with the next flush on a usable Redis (the one after 'ready' at the latest).
      if (allowed || force) addPending(this.#pendingRetries, budgetKey, this.#clock.toFleet(nowMs), 1);
      return allowed;
    }
    // Mirror the fleet's decision locally so the local window stays a fair stand-in.
    if (remote.allowed || force) await this.#local.takeRetry(budgetKey, cfg, nowMs, true);
    return remote.allowed;
  }

  async budgetWindow(budgetKey: string, cfg: BudgetConfig, nowMs: number): Promise<BudgetWindow> {
    const remote = await this.#budget(budgetKey, cfg, nowMs, 'peek');
    return remote ? { requests: remote.requests, retries: remote.retries } : this.#local.budgetWindow(budgetKey, cfg, nowMs);
  }

  // Idempotency keys: in Redis when it is usable, else in the process (a repeat that reaches another instance then
  // runs again, as it would with no key at all).

  async claimKey(key: string, claim: KeyRecord & { state: 'running' }, runningMs: number): Promise<KeyRecord | undefined> {
    // A run this instance claimed while Redis was away is looked for here first: Redis back, its repeats would else
    // claim the key there and run it a second time.
    const here = await this.#local.readKey(key, claim.sinceMs);
    if (here !== undefined || !this.#usable()) return here ?? this.#local.claimKey(key, claim, runningMs);
    const redisKey = this.#keys.idempotency(key);
    try {
      const held = await this.#client.sgClaimKeyBuffer(redisKey, encodeKeyRecord(claim).toString('utf8'), runningMs);
      this.#answered();
      if (held === null) this.#claimedInRedis.set(key, { owner: claim.owner!, untilMs: claim.sinceMs + runningMs });
      // A value this version cannot read (a newer one's, a damaged one) is taken as a request running under the key.
      return held === null ? undefined : (decodeKeyRecord(held) ?? { state: 'running', fingerprint: '', sinceMs: claim.sinceMs });
    } catch (err) {
      this.#failed(err, redisKey);
      // The script may have run, and the claim be this request's in Redis: remembered, so its end reaches Redis. Not
      // over another request's here: that one holds the key, and this claim cannot have taken it.
      const remembered = this.#claimedInRedis.get(key);
      if (remembered === undefined || remembered.owner === claim.owner) this.#claimedInRedis.set(key, { owner: claim.owner!, untilMs: claim.sinceMs + runningMs });
      // Such a claim may turn out not to be its own (the repeat gets the answer): nothing ends it; it goes once lapsed.
      for (const [k, c] of this.#claimedInRedis) if (c.untilMs <= claim.sinceMs) this.#claimedInRedis.delete(k);
      // A lone timeout leaves the store on Redis: the request looks again (readKey) and finds out whether the claim is
      // its own, rather than claiming here while another instance may be running the key. Redis away: claimed here.
      if (this.#usable()) return { state: 'running', fingerprint: claim.fingerprint, sinceMs: claim.sinceMs };
      return this.#local.claimKey(key, claim, runningMs);
    }
  }

  async readKey(key: string, nowMs: number): Promise<KeyRecord | undefined> {
    if (!this.#usable()) return this.#local.readKey(key, nowMs);
    const redisKey = this.#keys.idempotency(key);
    try {
      const raw = await this.#client.getBuffer(redisKey);
      this.#answered();
      return raw === null ? this.#local.readKey(key, nowMs) : decodeKeyRecord(raw);
    } catch (err) {
      this.#failed(err, redisKey);
      return this.#local.readKey(key, nowMs);
    }
  }

  async renewKey(key: string, owner: string, runningMs: number, nowMs: number): Promise<void> {
    await this.#local.renewKey(key, owner, runningMs, nowMs);
    const claimed = this.#claimedInRedis.get(key);
    if (claimed?.owner === owner) claimed.untilMs = nowMs + runningMs;
    if (!this.#usable()) return;
    const redisKey = this.#keys.idempotency(key);
    try {
      await this.#client.sgRenewKey(redisKey, owner, runningMs);
      this.#answered();
    } catch (err) {
      this.#failed(err, redisKey);
    }
  }

  async settleKey(key: string, record: KeyRecord & { state: 'done' }, ttlMs: number, nowMs: number, owner?: string): Promise<void> {
    // A claim taken while Redis was away lives in the process, where its repeats look: it is settled there too.
    const local = (await this.#local.readKey(key, nowMs)) !== undefined;
    if (local || !this.#usable()) await this.#local.settleKey(key, record, ttlMs, nowMs, owner);
    if (!this.#usable()) return this.#endLater(key, { record, owner, untilMs: nowMs + ttlMs });
    const redisKey = this.#keys.idempotency(key);
    try {
      await this.#writeEnd(redisKey, record, owner, ttlMs);
      this.#answered();
      if (owner === undefined || this.#claimedInRedis.get(key)?.owner === owner) this.#claimedInRedis.delete(key);
    } catch (err) {
      this.#failed(err, redisKey);
      if (!local) await this.#local.settleKey(key, record, ttlMs, nowMs, owner);
      this.#endLater(key, { record, owner, untilMs: nowMs + ttlMs });
    }
  }

  /** How a run ended, in Redis: with its owner, not over another request's running claim (redis-scripts.ts SETTLE_KEY). */
  #writeEnd(redisKey: string, record: KeyRecord & { state: 'done' }, owner: string | undefined, ttlMs: number): Promise<unknown> {
    const bytes = encodeKeyRecord(record);
    return owner === undefined ? this.#client.set(redisKey, bytes, 'PX', ttlMs) : this.#client.sgSettleKey(redisKey, owner, bytes, ttlMs);
  }

  async releaseKey(key: string, owner: string): Promise<void> {
    await this.#local.releaseKey(key, owner);
    const until = () => this.#claimedInRedis.get(key)?.untilMs ?? 0;
    if (!this.#usable()) return this.#endLater(key, { owner, untilMs: until() });
    const redisKey = this.#keys.idempotency(key);
    try {
      await this.#client.sgReleaseKey(redisKey, owner);
      this.#answered();
      if (this.#claimedInRedis.get(key)?.owner === owner) this.#claimedInRedis.delete(key);
    } catch (err) {
      this.#failed(err, redisKey);
      this.#endLater(key, { owner, untilMs: until() });
    }
  }

  /**
   * A run's end that did not reach Redis, for a key claimed there: written once Redis is back (#sendKeyEnds). Not
   * after a lone timeout, which leaves the store on Redis: the write it timed out on was sent, and Redis runs it.
   */
  #endLater(key: string, end: KeyEnd): void {
    // A give-back is its owner's: a repeat that gave up waiting does not end the run this instance holds the key for.
    const claimed = this.#claimedInRedis.get(key);
    if (claimed === undefined || (end.owner !== undefined && claimed.owner !== end.owner)) return;
    this.#claimedInRedis.delete(key);
    if (this.#usable()) return;
    this.#keyEnds.set(key, end);
  }

  /** Redis is back: the runs that ended meanwhile end there too, unless their claims have lapsed by themselves. */
  #sendKeyEnds(): void {
    const nowMs = this.#now();
    for (const [key, end] of this.#keyEnds) {
      this.#keyEnds.delete(key);
      if (end.untilMs <= nowMs) continue;
      const redisKey = this.#keys.idempotency(key);
      const sent = end.record ? this.#writeEnd(redisKey, end.record, end.owner, end.untilMs - nowMs) : this.#client.sgReleaseKey(redisKey, end.owner);
      sent.then(
        () => this.#answered(),
        (err: unknown) => {
          this.#failed(err, redisKey);
          if (!this.#usable() && !this.#keyEnds.has(key)) this.#keyEnds.set(key, end);
        },
      );
    }
  }

  getHoldOff(target: string): number | undefined {
    const untilMs = this.#view.holdOff(target);
    if (untilMs === undefined) this.#watch(target);
    return untilMs;
  }

  async setHoldOff(target: string, untilMs: number): Promise<void> {
    this.#watched.add(target);
    // In force here at once, not after the round trip: this instance's own requests (the one that got the hint
    // included) must see it while Redis is being told. Hold-offs only extend, so Redis's answer can only add to it.
    this.#view.putHoldOff(target, untilMs);
    if (!this.#usable()) return;
    try {
      this.#view.putHoldOff(target, await this.#pushHoldOff(target, untilMs));
    } catch (err) {
      this.#failed(err, this.#keys.holdOff(target));
    }
  }

  onChange(listener: (change: StateChange) => void): () => void {
    return this.#view.onChange(listener);
  }

  async exchangeDemand(pool: string, demand: readonly number[], nowMs: number): Promise<{ totals: number[]; instances: number } | undefined> {
    const key = this.#keys.demand(pool);
    return this.#run(
      key,
      async (c) => {
        const [totals, instances] = await c.sgExchangeDemand(key, this.#id, demand.join(','), this.#clock.toFleet(nowMs), DEMAND_STALE_MS);
        // A total that is not a count (another instance's bad value: inf, nan) counts as none, not as NaN in the share.
        return { totals: totals === '' ? [] : totals.split(',').map((t) => demandCount(Number(t))), instances };
      },
      () => undefined,
    );
  }

  onDegradedChange(listener: (degraded: boolean) => void): () => void {
    this.#degradedListeners.add(listener);
    return () => this.#degradedListeners.delete(listener);
  }

  /**
   * Re-reads the breaker records and hold-offs of `targets` from Redis, healing missed messages. Where Redis lost a
   * record this instance still holds (a restarted Redis), writes it back, so the fleet keeps its open breakers.
   */
  async refresh(targets: Iterable<string>): Promise<void> {
    const list = [...targets];
    list.forEach((t) => this.#watched.add(t));
    if (!this.#usable() || list.length === 0) return;
    try {
      await Promise.all(list.map((t) => this.#refreshOne(t)));
    } catch (err) {
      this.#failed(err);
    }
  }

  forget(target: string): void {
    this.#local.forget(target);
    this.#view.forget(target);
    this.#watched.delete(target);
    this.#toRead.delete(target);
    // Taken out of its batch above, so the batch's end would not drop it.
    this.#reading.delete(target);
    for (const pending of [this.#pending, this.#pendingRetries]) for (const key of pending.keys()) if (budgetOf(key, target)) pending.delete(key);
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearTimeout(this.#flushTimer);
    clearInterval(this.#probeTimer);
    clearTimeout(this.#subscribeTimer);
    clearInterval(this.#subscriberTimer);
    clearInterval(this.#clockTimer);
    await Promise.all([quitSoon(this.#client), quitSoon(this.#sub)]);
    this.#view.clearListeners();
    this.#degradedListeners.clear();
    await this.#local.close();
  }

  // ---- Redis operations -------------------------------------------------------------------------------------------

  /** Runs `op` (on `key`'s slot) on Redis when it is usable, else (or when it fails) answers from `fallback`. Never throws. */
  async #run<T>(key: string, op: (c: ScriptClient) => Promise<T>, fallback: () => T | Promise<T>): Promise<T> {
    if (this.#usable()) {
      try {
        const out = await op(this.#client);
        this.#answered();
        return out;
      } catch (err) {
        this.#failed(err, key);
      }
    }
    return fallback();
  }

  /**
   * Removes a permit from Redis without waiting for the answer, even while degraded: Redis runs a connection's commands
   * in order, so this runs after a late call that took it. Not on a connection that is down (what it had queued is
   * lost with it) or that Redis refused the configuration on.
   */
  #dropPermit(key: string, permitId: string): void {
    if (this.#closed || this.#misconfigured || this.#client.status !== 'ready') return;
    this.#client.zrem(key, permitId).catch(() => undefined);
  }

  /** The CAS script; applies the result to the cache (our record on success, the stored one on failure). */
  async #casRemote(target: string, expectedGeneration: number, next: BreakerRecord): Promise<boolean> {
    const fleetRecord = this.#toFleet(next);
    const message = encodeChange({ kind: 'breaker', target, record: fleetRecord }, this.#id);
    const [ok, ...stored] = await this.#client.sgCasBreaker(
      this.#keys.breaker(target), expectedGeneration, BREAKER_TTL_MS, this.#keys.events, message, ...encodeBreaker(fleetRecord),
    );
    this.#answered();
    if (ok === 1) {
      this.#view.putBreaker(target, next, false);
      return true;
    }
    const current = decodeBreaker(stored);
    if (current) this.#view.putBreaker(target, this.#toLocal(current), true);
    return false;
  }

  /** The extend-only hold-off script; returns the hold-off's end as Redis now has it. */
  async #pushHoldOff(target: string, untilMs: number): Promise<number> {
    const ttlMs = Math.max(0, Math.ceil(untilMs - this.#now())) + HOLD_OFF_GRACE_MS;
    const fleetUntilMs = this.#clock.toFleet(untilMs);
    const message = encodeChange({ kind: 'hold-off', target, untilMs: fleetUntilMs }, this.#id);
    const [, stored] = await this.#client.sgSetHoldOff(this.#keys.holdOff(target), fleetUntilMs, ttlMs, this.#keys.events, message);
    return this.#clock.toLocal(Number(stored));
  }

  /** One budget script call, with this instance's unsent request counts for the key; undefined when Redis failed. */
  async #budget(budgetKey: string, cfg: BudgetConfig, nowMs: number, mode: 'peek' | 'take' | 'force') {
    if (!this.#usable()) return undefined;
    // Unsent counts ride along, so this answer counts them; if the call fails they stay counted locally only.
    const pending = this.#pending.get(budgetKey);
    this.#pending.delete(budgetKey);
    try {
      const [requests, retries, allowed] = await this.#client.sgBudget(
        this.#keys.budget(budgetKey), second(this.#clock.toFleet(nowMs)), cfg.windowS, String(cfg.ratio), String(cfg.minRetriesPerSecond * cfg.windowS),
        mode, (cfg.windowS + 5) * 1000, ...pairs(pending),
      );
      this.#answered();
      return { requests, retries, allowed: allowed === 1 };
    } catch (err) {
      this.#failed(err, this.#keys.budget(budgetKey));
      return undefined;
    }
  }

  /** Sends the batched request counts, and retries taken on local state: one script call per budget key and kind. */
  #flush(): void {
    this.#flushTimer = undefined;
    const kinds = [['r', this.#pending], ['x', this.#pendingRetries]] as const;
    if (!this.#usable()) {
      // Keep them for when Redis is back, but only what can still be inside a window.
      const oldest = second(this.#clock.toFleet(this.#now())) - MAX_WINDOW_S;
      for (const [, pending] of kinds) {
        for (const seconds of pending.values()) for (const s of seconds.keys()) if (s <= oldest) seconds.delete(s);
      }
      return;
    }
    for (const [field, pending] of kinds) {
      for (const [budgetKey, seconds] of pending) {
        const key = this.#keys.budget(budgetKey);
        this.#client
          .sgAddCounts(key, (MAX_WINDOW_S + 5) * 1000, MAX_WINDOW_S, field, ...pairs(seconds))
          .catch((err: unknown) => this.#failed(err, key));
      }
      pending.clear();
    }
  }

  /**
   * Re-reads one target and reconciles it with what this instance holds. Redis wins where it has newer state; where it
   * lost ours (a restarted Redis) or holds something older than a breaker we opened while it was away, ours is written
   * back (compare-and-set, so a change another instance makes meanwhile wins), and the fleet learns it by pub/sub.
   */
  async #refreshOne(target: string): Promise<void> {
    const before = this.#view.breaker(target);
    const [raw, hold] = await Promise.all([this.#client.hgetall(this.#keys.breaker(target)), this.#client.get(this.#keys.holdOff(target))]);
    const fromRedis = decodeBreaker(raw);
    const stored = fromRedis && this.#toLocal(fromRedis);
    const cached = this.#view.breaker(target);
    if (!stored) {
      if (cached) await this.#casRemote(target, 0, cached);
    } else if (cached && outranksFleet(cached, stored, this.#now())) {
      // Generations were counted apart while we were away: ours must pass the fleet's for every view to take it.
      const next = { ...cached, generation: Math.max(cached.generation, stored.generation) + 1 };
      if (await this.#casRemote(target, stored.generation, next)) {
        const openUntil = new Date(next.openUntilMs).toISOString();
        this.#logger?.info({ target, openUntil }, 'breaker opened while Redis was away: written back, the fleet keeps it open');
      }
    } else {
      // A message that landed while the read was in flight may be newer than the read: then only move forward.
      this.#view.putBreaker(target, stored, cached === before);
    }

    const storedUntil = hold === null ? 0 : this.#clock.toLocal(Number(hold));
    const cachedUntil = this.#view.holdOff(target) ?? 0;
    if (storedUntil > cachedUntil) this.#view.putHoldOff(target, storedUntil);
    else if (cachedUntil > storedUntil && cachedUntil > this.#now()) await this.#pushHoldOff(target, cachedUntil);
  }

  // ---- the fleet's clock ------------------------------------------------------------------------------------------

  /**
   * Reads Redis's clock (INFO's server_time_usec: the README's ACL allows INFO, not TIME) and, where this instance's is
   * off by more than the tolerance, from then on writes and reads times in Redis's. Never throws: unread, the clocks
   * are taken to agree.
   */
  async #readClock(): Promise<void> {
    try {
      // A reading is as good as half its round trip: one slowed by a busy event loop is taken again, a few times.
      let beforeMs = 0;
      let afterMs = Number.POSITIVE_INFINITY;
      let redisMs: number | undefined;
      for (let i = 0; i < CLOCK_READINGS && !FleetClock.usable(beforeMs, afterMs); i++) {
        beforeMs = this.#now();
        const info = await this.#client.info('server');
        afterMs = this.#now();
        redisMs = redisTimeMs(info);
        if (redisMs === undefined) throw new Error('INFO server has no server_time_usec');
      }
      const skewBeforeMs = this.#clock.skewMs;
      if (this.#clock.observe(beforeMs, redisMs!, afterMs)) {
        if (this.#clock.skewMs === 0) this.#logger?.info("this instance's clock agrees with Redis's again");
        else this.#logger?.warn({ skewMs: this.#clock.skewMs }, "this instance's clock is off Redis's: shared times are kept in Redis's");
        // Stepped since the last reading: what this instance holds moves with its clock, then is read again.
        if (this.#clockRead) {
          this.#view.rebase(this.#clock.skewMs - skewBeforeMs, this.#now());
          void this.refresh(this.#watched);
        }
      }
    } catch (err) {
      if (!this.#clockRead) this.#logger?.warn({ error: safeError(err) }, "state store could not read Redis's clock: instance clocks are taken to agree");
    }
    this.#clockRead = true;
  }

  /** A breaker record of this instance's clock, in Redis's. */
  #toFleet(record: BreakerRecord): BreakerRecord {
    return withTimes(record, (ms) => this.#clock.toFleet(ms));
  }

  /** A breaker record of Redis's clock, in this instance's. */
  #toLocal(record: BreakerRecord): BreakerRecord {
    return withTimes(record, (ms) => this.#clock.toLocal(ms));
  }

  // ---- keeping the view fresh -------------------------------------------------------------------------------------

  #onMessage(channel: string, message: string): void {
    if (channel !== this.#keys.events) return;
    const change = decodeChange(message);
    // Our own changes already fired when we made them.
    if (!change || change.src === this.#id) return;
    // Only targets this instance has looked up: another instance's learned model names (made-up ones it gives back
    // at their 404) would otherwise stay here for good, each in the view, the re-read at every reconnect and the
    // gateway's breaker series. A target looked up later is read from Redis then (firstRead), as by a new instance.
    if (!this.#watched.has(change.target)) return;
    if (change.kind === 'breaker') this.#view.putBreaker(change.target, this.#toLocal(change.record), false);
    else this.#view.putHoldOff(change.target, this.#clock.toLocal(change.untilMs));
  }

  /** First sight of a target: read its fleet state in the background, so a new instance learns of open breakers. */
  #watch(target: string): void {
    if (this.#watched.has(target)) return;
    this.#watched.add(target);
    if (!this.#usable()) return; // the re-read after the next 'ready' covers it
    if (this.#toRead.size === 0) {
      this.#batch = new Promise((resolve) =>
        setImmediate(() => {
          const targets = [...this.#toRead];
          this.#toRead.clear();
          // refresh() never throws, and its commands time out after commandTimeoutMs.
          void this.refresh(targets).finally(() => {
            for (const t of targets) this.#reading.delete(t);
            resolve();
          });
        }),
      );
    }
    this.#toRead.add(target);
    this.#reading.set(target, this.#batch!);
  }

  // ---- connection state -------------------------------------------------------------------------------------------

  #usable(): boolean {
    return !this.#degraded && !this.#closed && this.#clockRead && this.#client.status === 'ready';
  }

  /** A new command connection is ready: configuration problems seen before it may be logged again if they come back. */
  #onConnected(): void {
    if (!this.#misconfigured) this.#reported.clear();
    // Two outages a new connection does not end by itself, and taken for their end, the store recovered, failed its
    // next write and flapped: a Cluster is ready as soon as any node answers, while the slot whose commands failed may
    // still be failing over; and after a READONLY (see reconnectOnReadOnly) a name that still points at the demoted
    // primary leads to it again. The health check's write (beside the failed key) says whether this connection is past
    // it; it runs now, not a second later.
    const unproven = this.#readOnly || (this.#failedKey !== undefined && !(this.#client instanceof Redis));
    if (this.#degraded && unproven) {
      this.#probe();
      return;
    }
    this.#onReady();
  }

  #onReady(): void {
    if (this.#closed) return;
    if (this.#misconfigured) {
      // Up, but not as configured (a database that does not exist leaves the connection on db 0): keep off it.
      this.#setDegraded(true);
      return;
    }
    this.#setDegraded(false);
    this.#flush();
    this.#sendKeyEnds();
    void this.refresh(this.#watched);
  }

  async #subscribe(): Promise<void> {
    try {
      await this.#sub.subscribe(this.#keys.events);
      this.#subscribed = true;
    } catch (err) {
      const problem = configProblem(err);
      if (problem) {
        this.#reportProblem(problem);
        // The connection stays up, so no reconnect would ask again: ask again until the ACL allows the channel.
        clearTimeout(this.#subscribeTimer);
        this.#subscribeTimer = setTimeout(() => {
          if (!this.#closed && !this.#subscribed && this.#sub.status === 'ready') void this.#subscribe();
        }, SUBSCRIBE_RETRY_MS).unref();
      } else this.#logger?.warn({ error: safeError(err) }, 'state store could not subscribe to changes; will retry on reconnect');
      return;
    }
    // Messages sent while we were not subscribed are lost; read the current state instead.
    void this.refresh(this.#watched);
  }

  /**
   * A subscriber only receives, so one whose connection died without closing (its traffic dropped for good: a firewall
   * that forgot it, the old address of a replaced Redis pod) would go unnoticed for hours (TCP keepalive): the store,
   * back on Redis through a new command connection, would report itself not degraded and never again hear a breaker
   * or hold-off another instance changes. A PING it does not answer in time replaces it; the resubscribe re-reads the
   * state. (A Cluster's subscriber is ioredis's own connection, which a PING on the Cluster would not reach.)
   */
  #checkSubscriber(): void {
    if (this.#closed || this.#subscriberAsked || !this.#subscribed || !(this.#sub instanceof Redis) || this.#sub.status !== 'ready') return;
    const sub = this.#sub;
    this.#subscriberAsked = true;
    // Its own timer, not ioredis's commandTimeout: that is per connection, and a SUBSCRIBE it timed out would still be
    // run by a slow Redis, leaving the connection subscribed while the store thinks not.
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), SUBSCRIBER_ANSWER_MS).unref()));
    // An error reply is an answer too: the connection is alive.
    void Promise.race([sub.ping().then(() => true, () => true), late]).then((answered) => {
      clearTimeout(timer);
      this.#subscriberAsked = false;
      if (answered || this.#closed || sub.status !== 'ready') return;
      this.#logger?.debug('state store: the subscriber connection does not answer; reconnecting it');
      sub.disconnect(true);
    });
  }

  /**
   * `key`: what the failed command wrote, when it is one key. The health check writes beside the last such key (same
   * hash tag, so the same Cluster slot): on a Cluster whose master of that slot is failing over, a check on a fixed key
   * that another master holds passed at once, and the store came back, timed out again and was called flapping, each
   * time, until the failover was over.
   */
  #failed(err: unknown, key?: string): void {
    this.#lastError = err;
    if (key !== undefined) this.#failedKey = key;
    if (isReadOnly(err)) this.#readOnly = true;
    const problem = configProblem(err);
    if (problem) {
      this.#reportProblem(problem);
      this.#refusedAtMs = Date.now();
    }
    if (isCommandTimeout(err)) {
      // Timers that fire together (within half a timeout of the one counted) are one wait, not several: after an event
      // loop stall every command in flight times out in the same turn, before the replies already in the socket are
      // read. Counted one by one, one stall with three commands out degraded a healthy Redis (QA: both instances of a
      // fleet, as each released its ~1,000 parked requests after a brownout).
      const nowMs = performance.now();
      if (nowMs - this.#lastTimeoutMs < this.#commandTimeoutMs / 2) return;
      this.#lastTimeoutMs = nowMs;
      if (++this.#timeoutsInARow < DEGRADE_AFTER_TIMEOUTS) return;
    }
    this.#setDegraded(true);
  }

  #timeoutsInARow = 0;
  /** When (performance.now()) the last timeout counted in #timeoutsInARow fired. */
  #lastTimeoutMs = Number.NEGATIVE_INFINITY;
  readonly #commandTimeoutMs: number;
  /** Redis refused a write as a replica since the store last recovered (see #onConnected). */
  #readOnly = false;
  /** The key of the last failed single-key command (see #failed); forgotten on recovery. */
  #failedKey: string | undefined;
  /** Health checks that timed out in a row on the current connection (see #probe). */
  #probeTimeoutsInARow = 0;
  /** Health checks passed in a row while degraded, and how many it takes to recover (see FLAP_WINDOW_MS). */
  #cleanProbes = 0;
  #cleanProbesNeeded = 1;
  #recoveredAtMs = Number.NEGATIVE_INFINITY;

  /**
   * Redis answered: the errors before it are over, so they are forgotten. One timeout is no outage (see
   * DEGRADE_AFTER_TIMEOUTS), and left behind it named a later, unrelated outage: a killed Redis, whose connection
   * closes with no error of its own, was logged as `Command timed out`, which sends an operator after a slow Redis.
   */
  #answered(): void {
    this.#timeoutsInARow = 0;
    this.#lastTimeoutMs = Number.NEGATIVE_INFINITY;
    this.#lastError = undefined;
  }

  /** An 'error' event of a connection: a configuration problem is logged and, on the command connection, bars its use. */
  #connectionError(err: unknown, commands: boolean): void {
    const problem = configProblem(err);
    if (problem) this.#reportProblem(problem);
    if (commands) {
      this.#lastError = err;
      if (problem) this.#misconfigured = problem;
    } else if (!problem) {
      this.#logger?.debug({ error: safeError(err) }, 'state store subscriber connection error');
    }
  }

  /**
   * Logs a configuration problem at error level, once: ioredis reconnects every 2 s at most, and a wrong password
   * would otherwise fill the log (or, as a mere outage warning, hide among them). Never logs the failed command.
   */
  #reportProblem(problem: ConfigProblem): void {
    const key = `${problem.kind}:${problem.redisError}`;
    if (this.#reported.has(key)) return;
    this.#reported.add(key);
    this.#logger?.error({ problem: problem.kind, setting: problem.setting, redisError: problem.redisError }, problem.message);
  }

  #setDegraded(degraded: boolean): void {
    if (this.#closed || this.#degraded === degraded) return;
    this.#degraded = degraded;
    if (degraded) {
      this.#cleanProbesNeeded = Date.now() - this.#recoveredAtMs < FLAP_WINDOW_MS ? Math.min(MAX_CLEAN_PROBES, this.#cleanProbesNeeded * 2) : 1;
      this.#cleanProbes = 0;
      this.#logger?.warn({ error: safeError(this.#lastError), ...(this.#cleanProbesNeeded > 1 && { flapping: true }) }, 'state store degraded: using local state');
      // ioredis reconnects a dropped connection and emits 'ready'; a live but slow one needs a probe to come back.
      this.#probeTimer = setInterval(() => this.#probe(), PROBE_INTERVAL_MS).unref();
    } else {
      this.#timeoutsInARow = 0;
      this.#probeTimeoutsInARow = 0;
      this.#lastError = undefined;
      this.#failedKey = undefined;
      this.#readOnly = false;
      this.#recoveredAtMs = Date.now();
      this.#logger?.info('state store recovered: using Redis');
      clearInterval(this.#probeTimer);
      this.#probeTimer = undefined;
    }
    for (const listener of this.#degradedListeners) listener(degraded);
  }

  #probe(): void {
    // A connection Redis refused the configuration on (a db it does not have left it on db 0) is not written to.
    if (this.#client.status !== 'ready' || this.#misconfigured) return;
    if (this.#refusedAtMs !== undefined && Date.now() - this.#refusedAtMs < CONFIG_RETRY_MS) return;
    // A keyed write, not PING: a Redis Cluster whose slots are down answers PING from every live node, and a Redis
    // that refuses writes (OOM under noeviction) answers reads; either way the store's next write would fail again.
    this.#client.sgProbe(this.#keys.probe(this.#failedKey), PROBE_TTL_MS).then(
      () => {
        if (++this.#cleanProbes >= this.#cleanProbesNeeded) this.#onReady();
      },
      (err: unknown) => {
        this.#cleanProbes = 0;
        this.#lastError = err;
        // ioredis reconnects for it (at most once a second), and the new connection is checked at its 'ready'.
        if (isReadOnly(err)) this.#readOnly = true;
        // Probes that time out in a row on a live connection: Redis is stopped or very slow, or the connection lost
        // traffic for good (a middlebox dropped it: toxiproxy's timeout toxic, a firewall that forgot the connection, a
        // replaced pod's old address). Answers are matched to commands in order, so after a lost one every answer on
        // this connection goes to the command before it, and no probe on it ever passes: a new connection is the way
        // back. On a stopped Redis the new one waits like the old one did.
        if (isCommandTimeout(err) && ++this.#probeTimeoutsInARow >= RECONNECT_AFTER_PROBE_TIMEOUTS) {
          this.#probeTimeoutsInARow = 0;
          this.#logger?.debug('state store: Redis has not answered on this connection for a while; reconnecting');
          this.#client.disconnect(true);
        }
      },
    );
  }
}

function second(ms: number): number {
  return Math.floor(ms / 1000);
}

/** Adds n to the key's count for nowMs's second. */
function addPending(pending: Map<string, Map<number, number>>, key: string, nowMs: number, n: number): void {
  let seconds = pending.get(key);
  if (!seconds) pending.set(key, (seconds = new Map()));
  const sec = second(nowMs);
  seconds.set(sec, (seconds.get(sec) ?? 0) + n);
}

function pairs(seconds: Map<number, number> | undefined): number[] {
  return seconds ? [...seconds].flat() : [];
}

/** QUIT, but never wait long for it: a Redis that is away must not hold up shutdown. */
async function quitSoon(conn: RedisConnection): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    conn.quit().catch(() => undefined),
    new Promise((resolve) => (timer = setTimeout(resolve, QUIT_WAIT_MS))),
  ]);
  clearTimeout(timer);
  conn.disconnect();
}

/** A class's demand as the share computation can use it: a finite count, at least 0. */
function demandCount(n: number): number {
  return Number.isFinite(n) && n > 0 ? n : 0;
}
