// The Redis state store: the fleet shares breaker records, hold-offs, probe permits, outcome windows and retry
// budgets through one Redis (or Sentinel, or Cluster). Every multi-step operation is one Lua script (redis-scripts.ts).
// Breaker records and hold-offs are read synchronously on the request path, so they live in a local cache that every
// instance keeps fresh through pub/sub. When Redis cannot answer, the store never throws: it serves from an in-process
// MemoryStore (which it feeds all along, so local windows are warm), says so once, and returns to Redis by itself.
import { randomUUID } from 'node:crypto';
import type { Logger } from 'pino';
import type { StateConfig } from '../config/schema.ts';
import { MemoryStore } from './memory-store.ts';
import { connectRedis, type RedisConnection } from './redis-client.ts';
import { decodeBreaker, decodeChange, encodeBreaker, encodeChange, RedisKeys } from './redis-keys.ts';
import { defineScripts, MAX_WINDOW_S, type ScriptClient } from './redis-scripts.ts';
import { FleetView } from './redis-view.ts';
import type { BreakerRecord, BudgetConfig, BudgetWindow, OutcomeWindow, StateChange, StateStore } from './store.ts';

export interface RedisStoreOptions {
  /** `state` from the config; `redis` must be set. */
  config: StateConfig;
  logger?: Logger;
  /** Clock for what the caller does not time itself (a hold-off key's expiry, pruning unsent counts). Default: Date.now. */
  now?: () => number;
}

/** Batched request counts are sent at most this far apart. */
const FLUSH_INTERVAL_MS = 50;
/** An instance whose demand is older than this has left the fleet's share computation. */
const DEMAND_STALE_MS = 3_000;

/** While degraded on a live connection (timeouts), how often a PING checks whether Redis answers again. */
const PROBE_INTERVAL_MS = 1000;
/** How long close() waits for QUIT before it drops the connections. */
const QUIT_WAIT_MS = 200;
/** A hold-off key outlives the hold-off by this much, so a late reader still sees when it ended. */
const HOLD_OFF_GRACE_MS = 60_000;

export class RedisStore implements StateStore {
  readonly kind = 'redis';
  /** Tags our own messages, so a change fires onChange once here even though Redis echoes it back. */
  readonly #id = randomUUID();
  readonly #keys: RedisKeys;
  readonly #client: ScriptClient;
  readonly #sub: RedisConnection;
  readonly #local = new MemoryStore();
  readonly #logger: Logger | undefined;
  readonly #now: () => number;
  readonly #view: FleetView;
  /** Targets whose breaker or hold-off this instance has asked about: re-read from Redis after every reconnect. */
  readonly #watched = new Set<string>();
  readonly #toRead = new Set<string>();
  /** Request counts not yet sent, per budget key and second. */
  readonly #pending = new Map<string, Map<number, number>>();
  readonly #degradedListeners = new Set<(degraded: boolean) => void>();
  #flushTimer: NodeJS.Timeout | undefined;
  #probeTimer: NodeJS.Timeout | undefined;
  #lastError: unknown;
  #degraded = false;
  #subscribed = false;
  #closed = false;

  constructor(opts: RedisStoreOptions) {
    this.#keys = new RedisKeys(opts.config.keyPrefix);
    this.#logger = opts.logger;
    this.#now = opts.now ?? Date.now;
    this.#view = new FleetView((err) => this.#logger?.error({ err }, 'state store change listener threw'));
    this.#client = defineScripts(connectRedis(opts.config, { subscriber: false }));
    this.#sub = connectRedis(opts.config, { subscriber: true });

    this.#client.on('ready', () => this.#onReady());
    this.#client.on('close', () => this.#setDegraded(true));
    // Connection errors are expected while Redis is away; the degraded warning reports the last one.
    this.#client.on('error', (err: unknown) => (this.#lastError = err));
    this.#sub.on('ready', () => void this.#subscribe());
    this.#sub.on('close', () => (this.#subscribed = false));
    this.#sub.on('error', (err: unknown) => this.#logger?.debug({ err }, 'state store subscriber connection error'));
    this.#sub.on('message', (channel: string, message: string) => this.#onMessage(channel, message));
  }

  get degraded(): boolean {
    return this.#degraded;
  }

  /** Resolves true once both connections are up and subscribed, false after timeoutMs. Optional: the store works before. */
  async ready(timeoutMs = 5000): Promise<boolean> {
    const until = Date.now() + timeoutMs;
    while (!(this.#client.status === 'ready' && this.#subscribed)) {
      if (this.#closed || Date.now() >= until) return false;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    return true;
  }

  async addOutcomes(target: string, generation: number, delta: OutcomeWindow, nowMs: number, windowS: number): Promise<OutcomeWindow> {
    // The local window is fed too, so it is warm if Redis goes away.
    const local = this.#local.addOutcomes(target, generation, delta, nowMs, windowS);
    return this.#run(
      async (c) => {
        const [requests, failures] = await c.sgAddOutcomes(
          this.#keys.outcomes(target, generation), second(nowMs), windowS, delta.requests, delta.failures, (windowS + 5) * 1000,
        );
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

  async casBreaker(target: string, expectedGeneration: number, next: BreakerRecord): Promise<boolean> {
    this.#watched.add(target);
    if (this.#usable()) {
      try {
        return await this.#casRemote(target, expectedGeneration, next);
      } catch (err) {
        this.#failed(err);
      }
    }
    return this.#view.casBreaker(target, expectedGeneration, next);
  }

  async takePermit(target: string, max: number, ttlMs: number, nowMs: number): Promise<string | null> {
    const ttl = Math.max(1, Math.ceil(ttlMs));
    return this.#run(
      (c) => c.sgTakePermit(this.#keys.permits(target), nowMs, max, nowMs + ttlMs, ttl, randomUUID()),
      () => this.#local.takePermit(target, max, ttlMs, nowMs),
    );
  }

  async releasePermit(target: string, permitId: string): Promise<void> {
    // The id may come from either side of a degraded spell; releasing an unknown id is harmless on both.
    await this.#local.releasePermit(target, permitId);
    await this.#run(async (c) => void (await c.zrem(this.#keys.permits(target), permitId)), () => undefined);
  }

  addRequests(budgetKey: string, n: number, nowMs: number): void {
    this.#local.addRequests(budgetKey, n, nowMs);
    let seconds = this.#pending.get(budgetKey);
    if (!seconds) this.#pending.set(budgetKey, (seconds = new Map()));
    const sec = second(nowMs);
    seconds.set(sec, (seconds.get(sec) ?? 0) + n);
    this.#flushTimer ??= setTimeout(() => this.#flush(), FLUSH_INTERVAL_MS).unref();
  }

  async takeRetry(budgetKey: string, cfg: BudgetConfig, nowMs: number, force = false): Promise<boolean> {
    const remote = await this.#budget(budgetKey, cfg, nowMs, force ? 'force' : 'take');
    if (remote === undefined) return this.#local.takeRetry(budgetKey, cfg, nowMs, force);
    // Mirror the fleet's decision locally so the local window stays a fair stand-in.
    if (remote.allowed || force) await this.#local.takeRetry(budgetKey, cfg, nowMs, true);
    return remote.allowed;
  }

  async budgetWindow(budgetKey: string, cfg: BudgetConfig, nowMs: number): Promise<BudgetWindow> {
    const remote = await this.#budget(budgetKey, cfg, nowMs, 'peek');
    return remote ? { requests: remote.requests, retries: remote.retries } : this.#local.budgetWindow(budgetKey, cfg, nowMs);
  }

  getHoldOff(target: string): number | undefined {
    const untilMs = this.#view.holdOff(target);
    if (untilMs === undefined) this.#watch(target);
    return untilMs;
  }

  async setHoldOff(target: string, untilMs: number): Promise<void> {
    this.#watched.add(target);
    if (this.#usable()) {
      try {
        this.#view.putHoldOff(target, await this.#pushHoldOff(target, untilMs));
        return;
      } catch (err) {
        this.#failed(err);
      }
    }
    this.#view.putHoldOff(target, untilMs);
  }

  onChange(listener: (change: StateChange) => void): () => void {
    return this.#view.onChange(listener);
  }

  async exchangeDemand(pool: string, demand: number, nowMs: number): Promise<{ total: number; instances: number } | undefined> {
    return this.#run(
      async (c) => {
        const [total, instances] = await c.sgExchangeDemand(this.#keys.demand(pool), this.#id, demand, nowMs, DEMAND_STALE_MS);
        return { total: Number(total), instances };
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

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearTimeout(this.#flushTimer);
    clearInterval(this.#probeTimer);
    await Promise.all([quitSoon(this.#client), quitSoon(this.#sub)]);
    this.#view.clearListeners();
    this.#degradedListeners.clear();
    await this.#local.close();
  }

  // ---- Redis operations -------------------------------------------------------------------------------------------

  /** Runs `op` on Redis when it is usable, else (or when it fails) answers from `fallback`. Never throws. */
  async #run<T>(op: (c: ScriptClient) => Promise<T>, fallback: () => T | Promise<T>): Promise<T> {
    if (this.#usable()) {
      try {
        return await op(this.#client);
      } catch (err) {
        this.#failed(err);
      }
    }
    return fallback();
  }

  /** The CAS script; applies the result to the cache (our record on success, the stored one on failure). */
  async #casRemote(target: string, expectedGeneration: number, next: BreakerRecord): Promise<boolean> {
    const message = encodeChange({ kind: 'breaker', target, record: next }, this.#id);
    const [ok, ...stored] = await this.#client.sgCasBreaker(
      this.#keys.breaker(target), expectedGeneration, this.#keys.events, message, ...encodeBreaker(next),
    );
    if (ok === 1) {
      this.#view.putBreaker(target, next, false);
      return true;
    }
    const current = decodeBreaker(stored);
    if (current) this.#view.putBreaker(target, current, true);
    return false;
  }

  /** The extend-only hold-off script; returns the hold-off's end as Redis now has it. */
  async #pushHoldOff(target: string, untilMs: number): Promise<number> {
    const ttlMs = Math.max(0, Math.ceil(untilMs - this.#now())) + HOLD_OFF_GRACE_MS;
    const message = encodeChange({ kind: 'hold-off', target, untilMs }, this.#id);
    const [, stored] = await this.#client.sgSetHoldOff(this.#keys.holdOff(target), untilMs, ttlMs, this.#keys.events, message);
    return Number(stored);
  }

  /** One budget script call, with this instance's unsent request counts for the key; undefined when Redis failed. */
  async #budget(budgetKey: string, cfg: BudgetConfig, nowMs: number, mode: 'peek' | 'take' | 'force') {
    if (!this.#usable()) return undefined;
    // Unsent counts ride along, so this answer counts them; if the call fails they stay counted locally only.
    const pending = this.#pending.get(budgetKey);
    this.#pending.delete(budgetKey);
    try {
      const [requests, retries, allowed] = await this.#client.sgBudget(
        this.#keys.budget(budgetKey), second(nowMs), cfg.windowS, String(cfg.ratio), String(cfg.minRetriesPerSecond * cfg.windowS),
        mode, (cfg.windowS + 5) * 1000, ...pairs(pending),
      );
      return { requests, retries, allowed: allowed === 1 };
    } catch (err) {
      this.#failed(err);
      return undefined;
    }
  }

  /** Sends the batched request counts: one script call per budget key. */
  #flush(): void {
    this.#flushTimer = undefined;
    if (!this.#usable()) {
      // Keep them for when Redis is back, but only what can still be inside a window.
      const oldest = second(this.#now()) - MAX_WINDOW_S;
      for (const seconds of this.#pending.values()) for (const s of seconds.keys()) if (s <= oldest) seconds.delete(s);
      return;
    }
    for (const [budgetKey, seconds] of this.#pending) {
      this.#client
        .sgAddRequests(this.#keys.budget(budgetKey), (MAX_WINDOW_S + 5) * 1000, MAX_WINDOW_S, ...pairs(seconds))
        .catch((err: unknown) => this.#failed(err));
    }
    this.#pending.clear();
  }

  /** Re-reads one target; Redis wins where it has state, and gets ours back where it lost it. */
  async #refreshOne(target: string): Promise<void> {
    const [raw, hold] = await Promise.all([this.#client.hgetall(this.#keys.breaker(target)), this.#client.get(this.#keys.holdOff(target))]);
    const stored = decodeBreaker(raw);
    const cached = this.#view.breaker(target);
    if (stored) this.#view.putBreaker(target, stored, true);
    else if (cached) await this.#casRemote(target, 0, cached);

    const storedUntil = hold === null ? 0 : Number(hold);
    const cachedUntil = this.#view.holdOff(target) ?? 0;
    if (storedUntil > cachedUntil) this.#view.putHoldOff(target, storedUntil);
    else if (cachedUntil > storedUntil && cachedUntil > this.#now()) await this.#pushHoldOff(target, cachedUntil);
  }

  // ---- keeping the view fresh -------------------------------------------------------------------------------------

  #onMessage(channel: string, message: string): void {
    if (channel !== this.#keys.events) return;
    const change = decodeChange(message);
    // Our own changes already fired when we made them.
    if (!change || change.src === this.#id) return;
    this.#watched.add(change.target);
    if (change.kind === 'breaker') this.#view.putBreaker(change.target, change.record, false);
    else this.#view.putHoldOff(change.target, change.untilMs);
  }

  /** First sight of a target: read its fleet state in the background, so a new instance learns of open breakers. */
  #watch(target: string): void {
    if (this.#watched.has(target)) return;
    this.#watched.add(target);
    if (!this.#usable()) return; // the re-read after the next 'ready' covers it
    if (this.#toRead.size === 0) {
      setImmediate(() => {
        const targets = [...this.#toRead];
        this.#toRead.clear();
        void this.refresh(targets);
      });
    }
    this.#toRead.add(target);
  }

  // ---- connection state -------------------------------------------------------------------------------------------

  #usable(): boolean {
    return !this.#degraded && !this.#closed && this.#client.status === 'ready';
  }

  #onReady(): void {
    if (this.#closed) return;
    this.#setDegraded(false);
    this.#flush();
    void this.refresh(this.#watched);
  }

  async #subscribe(): Promise<void> {
    try {
      await this.#sub.subscribe(this.#keys.events);
      this.#subscribed = true;
    } catch (err) {
      this.#logger?.warn({ err }, 'state store could not subscribe to changes; will retry on reconnect');
      return;
    }
    // Messages sent while we were not subscribed are lost; read the current state instead.
    void this.refresh(this.#watched);
  }

  #failed(err: unknown): void {
    this.#lastError = err;
    this.#setDegraded(true);
  }

  #setDegraded(degraded: boolean): void {
    if (this.#closed || this.#degraded === degraded) return;
    this.#degraded = degraded;
    if (degraded) {
      this.#logger?.warn({ err: this.#lastError }, 'state store degraded: using local state');
      // ioredis reconnects a dropped connection and emits 'ready'; a live but slow one needs a probe to come back.
      this.#probeTimer = setInterval(() => this.#probe(), PROBE_INTERVAL_MS).unref();
    } else {
      this.#logger?.info('state store recovered: using Redis');
      clearInterval(this.#probeTimer);
      this.#probeTimer = undefined;
    }
    for (const listener of this.#degradedListeners) listener(degraded);
  }

  #probe(): void {
    if (this.#client.status !== 'ready') return;
    this.#client.ping().then(
      () => this.#onReady(),
      (err: unknown) => (this.#lastError = err),
    );
  }
}

function second(ms: number): number {
  return Math.floor(ms / 1000);
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
