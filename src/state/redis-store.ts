// The Redis state store: the fleet shares breaker records, hold-offs, probe permits, outcome windows and retry budgets
// through one Redis (or Sentinel, or Cluster). Every multi-step operation is one Lua script (redis-scripts.ts). Breaker
// records and hold-offs are read synchronously on the request path, so they live in a local cache that every instance
// keeps fresh through pub/sub. When Redis cannot answer, the store never throws: it serves from an in-process
// MemoryStore (which it feeds all along, so local windows are warm), says so once, and returns to Redis by itself,
// writing back what it decided alone where that is newer than what Redis holds (a breaker it opened, a hold-off). A
// Redis that refuses the configuration (password, db, ACL) is served around the same way, but reported as such. Every
// time written to Redis is in Redis's clock, and read back in this instance's (fleet-clock.ts): the instances' own
// clocks may disagree by seconds or minutes. Its parts, each in its own file: connection health, the subscriber, the
// clock reader, retry budgets, idempotency keys.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from 'pino';
import type { StateConfig } from '../config/schema.ts';
import { outranksFleet } from '../policy/breaker.ts';
import { QUEUE_AHEAD_MS, type ClientRates, type ClientRefusal, type Rate } from '../policy/client-rate.ts';
import { MemoryStore } from './memory-store.ts';
import { connectRedis, redisAddress, type RedisConnection } from './redis-client.ts';
import { decodeBreaker, encodeBreaker, encodeChange, RedisKeys, type ChangeMessage } from './redis-keys.ts';
import { defineScripts, type ScriptClient } from './redis-scripts.ts';
import { FleetClock } from './fleet-clock.ts';
import { FleetView, withTimes } from './redis-view.ts';
import { RedisClockReader } from './redis-clock-reader.ts';
import { RedisHealth } from './redis-health.ts';
import { RedisBudget, second } from './redis-budget.ts';
import { RedisKeptKeys } from './redis-kept-keys.ts';
import { RedisSubscriber } from './redis-subscriber.ts';
import { MemoryPolicyCheck } from './redis-memory-policy.ts';
import type { BreakerRecord, BudgetConfig, BudgetWindow, KeyRecord, OutcomeWindow, StateChange, StateStore } from './store.ts';

interface RedisStoreOptions {
  /** `state` from the config; `redis` must be set. */
  config: StateConfig;
  logger?: Logger;
  /** Clock for what the caller does not time itself (a hold-off key's expiry, pruning unsent counts). Default: Date.now. */
  now?: () => number;
  /** The most idempotency answer bytes kept in the process while Redis is away (config: idempotency.memoryBytes). */
  keptBytes?: number;
  /** How long a run's claim on its idempotency key lasts unrenewed (config: idempotency.leaseMs). Default: 10000. */
  keyLeaseMs?: number;
  /** How long into an outage a keyed request the instance knows nothing of waits for Redis (config: idempotency.waitForRedisMs). Default: 0. */
  waitForRedisMs?: number;
  /** How often Redis's clock is read again, in ms (see CLOCK_READ_MS in redis-clock-reader.ts). Default: 10000. */
  clockReadMs?: number;
}

/** An instance whose demand is older than this has left the fleet's share computation. */
const DEMAND_STALE_MS = 3_000;

/** How long close() waits for QUIT before it drops the connections. */
const QUIT_WAIT_MS = 200;
/** A hold-off key outlives the hold-off by this much, so a late reader still sees when it ended. */
const HOLD_OFF_GRACE_MS = 60_000;
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
  /** Targets whose breaker or hold-off this instance has asked about: re-read from Redis after every reconnect. */
  readonly #watched = new Set<string>();
  readonly #toRead = new Set<string>();
  /**
   * Per target, the last breaker write whose answer never came (a command timeout): Redis still runs it once it gets to
   * it (a paused Redis resumed), maybe after this instance, degraded, moved its view on (open, then half-open and closed
   * by its own probes). See #refreshOne.
   */
  readonly #unanswered = new Map<string, BreakerRecord>();
  /** Targets re-read because Redis refused a permit for a breaker record this instance's view does not match. */
  readonly #reconciling = new Set<string>();
  /** First reads in flight, by target (see firstRead); the batch of #toRead they belong to. */
  readonly #reading = new Map<string, Promise<void>>();
  #batch: Promise<void> | undefined;
  readonly #health: RedisHealth;
  readonly #budget: RedisBudget;
  readonly #keptKeys: RedisKeptKeys;
  readonly #subscriber: RedisSubscriber;
  readonly #clockReader: RedisClockReader;
  /** Where `state.redis` points, for the log (redisAddress: host:port, never a credential). */
  readonly address: string;

  constructor(opts: RedisStoreOptions) {
    this.#local = new MemoryStore({ ...(opts.keptBytes !== undefined && { keptBytes: opts.keptBytes }) });
    this.#keys = new RedisKeys(opts.config.keyPrefix);
    this.#logger = opts.logger;
    this.#now = opts.now ?? Date.now;
    this.address = redisAddress(opts.config.redis!);
    this.#view = new FleetView((err) => this.#logger?.error({ err }, 'state store change listener threw'));
    this.#client = defineScripts(connectRedis(opts.config, { subscriber: false }));
    this.#sub = connectRedis(opts.config, { subscriber: true });
    this.#health = new RedisHealth({
      client: this.#client, keys: this.#keys, logger: this.#logger, now: this.#now, commandTimeoutMs: opts.config.commandTimeoutMs,
      address: this.address,
      clockRead: () => this.#clockReader.done,
      onRecovered: () => {
        this.#budget.flush();
        this.#keptKeys.sendKeyEnds();
        this.#keptKeys.claimAgain();
        this.#keptKeys.sendLocalKeys();
        void this.refresh(this.#watched);
      },
    });
    const parts = { client: this.#client, keys: this.#keys, local: this.#local, health: this.#health, now: this.#now };
    const keyLeaseMs = opts.keyLeaseMs ?? 10_000;
    const waitForRedisMs = opts.waitForRedisMs ?? 0;
    this.#budget = new RedisBudget({ ...parts, clock: this.#clock });
    this.#keptKeys = new RedisKeptKeys({ ...parts, keyLeaseMs, waitForRedisMs });
    this.#subscriber = new RedisSubscriber({
      sub: this.#sub, channel: this.#keys.events, id: this.#id, health: this.#health, logger: this.#logger,
      onChange: (change) => this.#onMessage(change),
      // Our own write, run late: a re-read settles it by #refreshOne's rule (this instance may have moved on since).
      onOwnChange: (change) => {
        if (change.kind === 'breaker' && this.#unanswered.has(change.target) && sameSpell(this.#unanswered.get(change.target)!, this.#toLocal(change.record))) this.#reconcile(change.target);
      },
      // Messages sent while we were not subscribed are lost; read the current state instead.
      onSubscribed: () => void this.refresh(this.#watched),
    });
    this.#clockReader = new RedisClockReader({
      client: this.#client, clock: this.#clock, health: this.#health, logger: this.#logger, now: this.#now, clockReadMs: opts.clockReadMs,
      onStep: (skewDeltaMs) => {
        this.#view.rebase(skewDeltaMs, this.#now());
        void this.refresh(this.#watched);
      },
      onFirstReading: (skewMs) => this.#budget.firstClockReading(skewMs),
    });
    // Redis's clock is read before the store uses a new connection: the first times it writes must already be in it.
    this.#client.on('ready', () => void this.#clockReader.read().then(() => this.#client.status === 'ready' && this.#health.onConnected()));
    const memoryPolicy = new MemoryPolicyCheck(this.#client, this.#logger);
    this.#client.on('ready', () => void memoryPolicy.check());
  }

  get degraded(): boolean {
    return this.#health.degraded;
  }

  /**
   * Resolves true once both connections are up and subscribed; false after timeoutMs, or at once when Redis refused
   * the configuration (a wrong password does not fix itself). Optional: the store works before, on local state.
   */
  async ready(timeoutMs = 5000): Promise<boolean> {
    const until = Date.now() + timeoutMs;
    while (!(this.#client.status === 'ready' && this.#clockReader.done && this.#subscriber.subscribed && !this.#health.misconfigured)) {
      if (this.#health.closed || this.#health.misconfigured || Date.now() >= until) return false;
      await sleep(10);
    }
    return true;
  }

  /**
   * The start-up stops waiting for Redis: from here the store serves on local state, and says so (the gauge, /readyz)
   * until Redis answers; else both said "on Redis" until the first commands timed out.
   */
  startWithoutRedis(): void {
    if (!this.#health.closed && this.#client.status !== 'ready') this.#health.setDegraded(true);
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
    if (this.#health.usable()) {
      try {
        return await this.#casRemote(target, expectedGeneration, next);
      } catch (err) {
        this.#unanswered.set(target, next);
        this.#health.failed(err, this.#keys.breaker(target));
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
            // 0: the fleet's breaker record is not the generation this instance judged by.
            this.#reconcile(target);
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
    if (this.#health.usable()) await this.#run(key, async (c) => void (await c.zrem(key, permitId)), () => undefined);
    // Degraded on a live connection (a slow Redis), a permit taken from Redis before would otherwise stay taken there
    // for its whole time to live after the probe ended, and hold back the fleet's next probe once Redis is back.
    else this.#dropPermit(key, permitId);
  }

  // Retry budgets and idempotency keys hold writes of their own until Redis takes them: kept by their own parts.

  addRequests(budgetKey: string, n: number, nowMs: number): void {
    this.#budget.addRequests(budgetKey, n, nowMs);
  }

  takeRetry(budgetKey: string, cfg: BudgetConfig, nowMs: number, force = false): Promise<boolean> {
    return this.#budget.takeRetry(budgetKey, cfg, nowMs, force);
  }

  budgetWindow(budgetKey: string, cfg: BudgetConfig, nowMs: number): Promise<BudgetWindow> {
    return this.#budget.budgetWindow(budgetKey, cfg, nowMs);
  }

  claimKey(key: string, claim: KeyRecord & { state: 'running' }, runningMs: number): Promise<KeyRecord | undefined> {
    return this.#keptKeys.claimKey(key, claim, runningMs);
  }

  readKey(key: string, nowMs: number): Promise<KeyRecord | undefined> {
    return this.#keptKeys.readKey(key, nowMs);
  }

  renewKey(key: string, owner: string, runningMs: number, nowMs: number): Promise<void> {
    return this.#keptKeys.renewKey(key, owner, runningMs, nowMs);
  }

  settleKey(key: string, record: KeyRecord & { state: 'done' }, ttlMs: number, nowMs: number, owner?: string): Promise<void> {
    return this.#keptKeys.settleKey(key, record, ttlMs, nowMs, owner);
  }

  releaseKey(key: string, owner: string): Promise<void> {
    return this.#keptKeys.releaseKey(key, owner);
  }

  getHoldOff(target: string): number | undefined {
    const untilMs = this.#view.holdOff(target);
    if (untilMs === undefined) this.#watch(target);
    return untilMs;
  }

  async setHoldOff(target: string, untilMs: number, nowMs = 0): Promise<boolean> {
    this.#watched.add(target);
    // Redis away: this instance's view is the fleet it knows of.
    const startedHere = (this.#view.holdOff(target) ?? 0) <= nowMs;
    // In force here at once, not after the round trip: this instance's own requests (the one that got the hint
    // included) must see it while Redis is being told. Hold-offs only extend, so Redis's answer can only add to it.
    this.#view.putHoldOff(target, untilMs);
    if (!this.#health.usable()) return startedHere;
    try {
      const pushed = await this.#pushHoldOff(target, untilMs, nowMs);
      this.#view.putHoldOff(target, pushed.untilMs);
      return pushed.started;
    } catch (err) {
      this.#health.failed(err, this.#keys.holdOff(target));
      return startedHere;
    }
  }

  onChange(listener: (change: StateChange) => void): () => void {
    return this.#view.onChange(listener);
  }

  // Away from Redis each instance holds a client to its whole rates on its own: more than the limit across a fleet,
  // for as long as Redis is away, rather than refusing every request.
  admitClient(client: string, rates: ClientRates, nowMs: number): Promise<ClientRefusal | undefined> {
    const { requests, tokens } = rates;
    const requestsKey = this.#keys.clientRate(client, 'requests', requests);
    return this.#run(
      requestsKey,
      async (c) => {
        const [waitMs, by] = await c.sgAdmitClient(
          requestsKey, this.#keys.clientRate(client, 'tokens', tokens), this.#keys.clientTold(client, rates), this.#clock.toFleet(nowMs),
          requests?.intervalMs ?? 0, requests?.burst ?? 0, tokens?.intervalMs ?? 0, tokens?.burst ?? 0, QUEUE_AHEAD_MS,
        );
        return waitMs > 0 ? { waitMs, by: by === 2 ? 'tokens' : 'requests' } : undefined;
      },
      () => this.#local.admitClient(client, rates, nowMs),
    );
  }

  // The estimate reserved in Redis is kept locally too, as spendTokens keeps its tokens: settled on both, the local
  // debt stays what this instance admitted, for the while Redis is away.
  reserveTokens(client: string, rates: ClientRates & { tokens: Rate }, estimate: number, nowMs: number): Promise<ClientRefusal | undefined> {
    const { requests, tokens } = rates;
    const tokensKey = this.#keys.clientRate(client, 'tokens', tokens);
    return this.#run(
      tokensKey,
      async (c) => {
        const [waitMs] = await c.sgReserveTokens(
          this.#keys.clientRate(client, 'requests', requests), tokensKey, this.#keys.clientTold(client, rates), this.#clock.toFleet(nowMs),
          requests?.intervalMs ?? 0, tokens.intervalMs, tokens.burst, estimate, QUEUE_AHEAD_MS,
        );
        if (waitMs > 0) return { waitMs, by: 'tokens' as const };
        this.#local.spendTokens(client, tokens, estimate, nowMs);
        return undefined;
      },
      () => this.#local.reserveTokens(client, rates, estimate, nowMs),
    );
  }

  // Not awaited (the request has been answered), so not through #run: its failure and its answer still count toward
  // Redis's health. The local debt is kept too, as addOutcomes keeps its window warm: an instance that loses Redis
  // still holds a client to the tokens it answered here. (Its local request due times are not: they start full.)
  spendTokens(client: string, rate: Rate, tokens: number, nowMs: number): void {
    this.#local.spendTokens(client, rate, tokens, nowMs);
    const key = this.#keys.clientRate(client, 'tokens', rate);
    if (!this.#health.usable()) return;
    this.#client.sgSpendTokens(key, this.#clock.toFleet(nowMs), rate.intervalMs, tokens).then(
      () => this.#health.answered(),
      (err: unknown) => this.#health.failed(err, key),
    );
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
    return this.#health.onDegradedChange(listener);
  }

  /**
   * Re-reads the breaker records and hold-offs of `targets` from Redis, healing missed messages. Where Redis lost a
   * record this instance still holds (a restarted Redis), writes it back, so the fleet keeps its open breakers.
   */
  async refresh(targets: Iterable<string>): Promise<void> {
    const list = [...targets];
    list.forEach((t) => this.#watched.add(t));
    if (!this.#health.usable() || list.length === 0) return;
    // The first failure, with the target it was read for: its keys' slot is the one to check (and to name).
    let failure: { err: unknown; target: string } | undefined;
    await Promise.all(list.map((target) => this.#refreshOne(target).catch((err: unknown) => void (failure ??= { err, target }))));
    if (failure) this.#health.failed(failure.err, this.#keys.breaker(failure.target));
  }

  forget(target: string): void {
    this.#local.forget(target);
    this.#view.forget(target);
    this.#watched.delete(target);
    this.#toRead.delete(target);
    // Taken out of its batch above, so the batch's end would not drop it.
    this.#reading.delete(target);
    this.#unanswered.delete(target);
    this.#budget.forget(target);
  }

  async close(): Promise<void> {
    if (this.#health.closed) return;
    // The budget's last counts go first: a closed store sends nothing.
    this.#budget.close();
    this.#health.close();
    this.#subscriber.close();
    this.#clockReader.close();
    await Promise.all([quitSoon(this.#client), quitSoon(this.#sub)]);
    this.#view.clearListeners();
    await this.#local.close();
  }

  // ---- Redis operations -------------------------------------------------------------------------------------------

  /** Runs `op` (on `key`'s slot) on Redis when it is usable, else (or when it fails) answers from `fallback`. Never throws. */
  async #run<T>(key: string, op: (c: ScriptClient) => Promise<T>, fallback: () => T | Promise<T>): Promise<T> {
    if (this.#health.usable()) {
      try {
        const out = await op(this.#client);
        this.#health.answered();
        return out;
      } catch (err) {
        this.#health.failed(err, key);
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
    if (this.#health.closed || this.#health.misconfigured || this.#client.status !== 'ready') return;
    this.#client.zrem(key, permitId).catch(() => undefined);
  }

  /**
   * Re-reads a target whose breaker record in Redis is not the one this instance judged by. Usually the fleet's message
   * is on the way; but where this instance's own write never reached Redis (a command lost with a Cluster master that
   * failed over, too few timeouts in a row to go degraded), its view moved alone, no message or reconnect ever corrects
   * it, and every probe was refused: the breaker stayed open for good on this instance alone. A re-read settles it by
   * the reconnect's rule (what it opened alone and still holds open is written back). One re-read per target at a
   * time: every request of a half-open window is refused alike.
   */
  #reconcile(target: string): void {
    if (this.#reconciling.has(target)) return;
    this.#reconciling.add(target);
    void this.refresh([target]).finally(() => this.#reconciling.delete(target));
  }

  /** The CAS script; applies the result to the cache (our record on success, the stored one on failure). */
  async #casRemote(target: string, expectedGeneration: number, next: BreakerRecord): Promise<boolean> {
    const fleetRecord = this.#toFleet(next);
    const message = encodeChange({ kind: 'breaker', target, record: fleetRecord }, this.#id);
    const [ok, ...stored] = await this.#client.sgCasBreaker(
      this.#keys.breaker(target), expectedGeneration, BREAKER_TTL_MS, this.#keys.events, message, ...encodeBreaker(fleetRecord),
    );
    this.#health.answered();
    if (ok === 1) {
      this.#view.putBreaker(target, next, false);
      return true;
    }
    const current = decodeBreaker(stored);
    if (current) this.#view.putBreaker(target, this.#toLocal(current), true);
    return false;
  }

  /**
   * The extend-only hold-off script; returns the hold-off's end as Redis now has it, and whether this push started it
   * (none in force at nowMs).
   */
  async #pushHoldOff(target: string, untilMs: number, nowMs = 0): Promise<{ untilMs: number; started: boolean }> {
    const ttlMs = Math.max(0, Math.ceil(untilMs - this.#now())) + HOLD_OFF_GRACE_MS;
    const fleetUntilMs = this.#clock.toFleet(untilMs);
    const message = encodeChange({ kind: 'hold-off', target, untilMs: fleetUntilMs }, this.#id);
    const [, stored, started] = await this.#client.sgSetHoldOff(this.#keys.holdOff(target), fleetUntilMs, ttlMs, this.#keys.events, message, this.#clock.toFleet(nowMs));
    return { untilMs: this.#clock.toLocal(Number(stored)), started: started === 1 };
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
    // Redis holds our own write that timed out, run late, and our view moved on from it while degraded (a paused Redis:
    // the open it was sent before the store went degraded ran on resume, after this instance had probed and closed the
    // breaker alone); taken as the fleet's word, it reopened the breaker here and on every instance. No other instance
    // changed it since (it would not be that record), so our newer one stands.
    const late = this.#unanswered.get(target);
    const ownLateWrite = !!late && !!stored && sameSpell(late, stored) && !!cached && cached.generation > late.generation && cached.sinceMs >= stored.sinceMs;
    // Past it (a later write stands in Redis), it cannot run any more: its compare-and-set expects an older generation.
    // Read back as our view holds it (our own message heard, see onOwnChange), it has run and we know: settled, as a
    // write answered in time. Kept, it let a close this instance made alone in a later outage replace the fleet's open.
    if (late && stored && (stored.generation > late.generation || (cached && sameSpell(cached, late) && sameSpell(late, stored)))) this.#unanswered.delete(target);
    if (!stored) {
      if (cached) await this.#casRemote(target, 0, cached);
    } else if (cached && (ownLateWrite || outranksFleet(cached, stored, this.#now()))) {
      // Generations were counted apart while we were away: ours must pass the fleet's for every view to take it.
      const next = { ...cached, generation: Math.max(cached.generation, stored.generation) + 1 };
      if (await this.#casRemote(target, stored.generation, next)) {
        this.#unanswered.delete(target);
        const openUntil = new Date(next.openUntilMs).toISOString();
        if (ownLateWrite) this.#logger?.info({ target, state: next.state }, 'breaker write Redis ran late (after its timeout) replaced by this instance\'s newer record');
        else this.#logger?.info({ target, openUntil }, 'breaker opened while Redis was away: written back, the fleet keeps it open');
      }
    } else {
      // A message that landed while the read was in flight may be newer than the read: then only move forward.
      this.#view.putBreaker(target, stored, cached === before);
    }

    const storedUntil = hold === null ? 0 : this.#clock.toLocal(Number(hold));
    const cachedUntil = this.#view.holdOff(target) ?? 0;
    if (storedUntil > cachedUntil) this.#view.putHoldOff(target, storedUntil, this.#now());
    else if (cachedUntil > storedUntil && cachedUntil > this.#now()) await this.#pushHoldOff(target, cachedUntil);
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

  /** A change another instance made, heard by the subscriber. */
  #onMessage(change: ChangeMessage): void {
    // Only targets this instance has looked up: another instance's learned model names (made-up ones it gives back
    // at their 404) would otherwise stay here for good, each in the view, the re-read at every reconnect and the
    // gateway's breaker series. A target looked up later is read from Redis then (firstRead), as by a new instance.
    if (!this.#watched.has(change.target)) return;
    if (change.kind === 'breaker') {
      const record = this.#toLocal(change.record);
      const current = this.#view.breaker(change.target);
      // Not newer than the view: a late message, or a record whose generations restarted because Redis lost the one we
      // hold (FLUSHALL, eviction, its 7 days without a change) and an instance that never saw it (a newcomer, at 0)
      // wrote first. Dropped as late, its open was ignored here until this instance tripped the breaker on its own.
      // Redis's record tells the two apart: a re-read (one per target at a time) takes it as it stands.
      if (current && current.generation >= record.generation && !sameSpell(current, record)) this.#reconcile(change.target);
      else this.#view.putBreaker(change.target, record, false);
    } else this.#view.putHoldOff(change.target, this.#clock.toLocal(change.untilMs), this.#now());
  }

  /**
   * The first reads of a batch of targets. One that fails while the store stays on Redis (a single command timeout is no
   * outage) is read again at the target's next lookup (every request looks its target up): kept as watched, it was never
   * read again until the next reconnect, and the instance sent into the fleet's open breaker or hold-off meanwhile,
   * having missed the message that started it. Degraded, the recovery's re-read covers it.
   */
  async #firstReads(targets: string[]): Promise<void> {
    if (!this.#health.usable()) return;
    await Promise.all(
      targets.map((t) =>
        this.#refreshOne(t).catch((err: unknown) => {
          this.#health.failed(err, this.#keys.breaker(t));
          if (!this.#health.degraded) this.#watched.delete(t);
        }),
      ),
    );
  }

  /** First sight of a target: read its fleet state in the background, so a new instance learns of open breakers. */
  #watch(target: string): void {
    if (this.#watched.has(target)) return;
    this.#watched.add(target);
    if (!this.#health.usable()) return; // the re-read after the next 'ready' covers it
    if (this.#toRead.size === 0) {
      this.#batch = new Promise((resolve) =>
        setImmediate(() => {
          const targets = [...this.#toRead];
          const batch = this.#batch;
          this.#toRead.clear();
          // Never throws, and its commands time out after commandTimeoutMs.
          void this.#firstReads(targets).finally(() => {
            // A target read again meanwhile (its read here failed) belongs to the next batch.
            for (const t of targets) if (this.#reading.get(t) === batch) this.#reading.delete(t);
            resolve();
          });
        }),
      );
    }
    this.#toRead.add(target);
    this.#reading.set(target, this.#batch!);
  }
}

/** Are these the same breaker record as written (a late write recognised in Redis)? */
function sameSpell(a: BreakerRecord, b: BreakerRecord): boolean {
  return a.generation === b.generation && a.state === b.state && a.sinceMs === b.sinceMs;
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
