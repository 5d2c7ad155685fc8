// The in-process state store: the default when no Redis is configured, and the Redis store's stand-in while Redis
// cannot be reached. Same semantics as the Redis store, for one instance.
import { randomUUID } from 'node:crypto';
import { admitClient, reserveTokens, spend, type ClientDues, type ClientRates, type ClientRefusal, type Rate } from '../policy/client-rate.ts';
import {
  budgetOf,
  MAX_WINDOW_S,
  retryAllowance,
  type BreakerRecord,
  type BudgetConfig,
  type BudgetWindow,
  type KeyRecord,
  type OutcomeWindow,
  type StateChange,
  type StateStore,
} from './store.ts';
import { KeptKeys } from './kept-keys.ts';

/** What the in-process store keeps of idempotency keys' answers at most, unless told otherwise (config: idempotency.memoryBytes). */
const DEFAULT_KEPT_BYTES = 64 * 1024 * 1024;

/**
 * Per-second buckets; the window is the sum over the last windowS seconds. Seconds older than the longest window any
 * config may ask for go when a new second begins: a budget key that only ever counts requests (a healthy target, never
 * retried) is never summed, and kept a bucket for every second it had traffic, for as long as the process ran.
 */
export class SecondBuckets {
  readonly #buckets = new Map<number, number[]>();

  add(nowMs: number, values: number[]): void {
    const sec = Math.floor(nowMs / 1000);
    const b = this.#buckets.get(sec);
    if (b) values.forEach((v, i) => (b[i] = (b[i] ?? 0) + v));
    else {
      for (const s of this.#buckets.keys()) if (s <= sec - MAX_WINDOW_S) this.#buckets.delete(s);
      this.#buckets.set(sec, [...values]);
    }
  }

  /** Seconds held. */
  get size(): number {
    return this.#buckets.size;
  }

  sum(nowMs: number, windowS: number, width: number): number[] {
    const sec = Math.floor(nowMs / 1000);
    const out = new Array<number>(width).fill(0);
    for (const [s, values] of this.#buckets) {
      if (s <= sec - windowS) {
        this.#buckets.delete(s);
        continue;
      }
      values.forEach((v, i) => (out[i] = (out[i] ?? 0) + v));
    }
    return out;
  }
}

export class MemoryStore implements StateStore {
  readonly kind = 'memory';
  readonly degraded = false;
  readonly #outcomes = new Map<string, { generation: number; buckets: SecondBuckets }>();
  readonly #breakers = new Map<string, BreakerRecord>();
  readonly #permits = new Map<string, Map<string, number>>();
  readonly #budgets = new Map<string, SecondBuckets>();
  readonly #holdOffs = new Map<string, number>();
  /** Each limited client's due times (policy/client-rate.ts); one entry per client with a key. */
  readonly #clients = new Map<string, ClientDues>();
  readonly #listeners = new Set<(change: StateChange) => void>();
  readonly #keys: KeptKeys;

  constructor(opts: { keptBytes?: number } = {}) {
    this.#keys = new KeptKeys(opts.keptBytes ?? DEFAULT_KEPT_BYTES);
  }

  async addOutcomes(target: string, generation: number, delta: OutcomeWindow, nowMs: number, windowS: number): Promise<OutcomeWindow> {
    let w = this.#outcomes.get(target);
    if (!w || w.generation !== generation) {
      w = { generation, buckets: new SecondBuckets() };
      this.#outcomes.set(target, w);
    }
    w.buckets.add(nowMs, [delta.requests, delta.failures]);
    const [requests = 0, failures = 0] = w.buckets.sum(nowMs, windowS, 2);
    return { requests, failures };
  }

  getBreaker(target: string): BreakerRecord | undefined {
    return this.#breakers.get(target);
  }

  async casBreaker(target: string, expectedGeneration: number, next: BreakerRecord): Promise<boolean> {
    const current = this.#breakers.get(target)?.generation ?? 0;
    if (current !== expectedGeneration) return false;
    this.#breakers.set(target, next);
    this.#emit({ kind: 'breaker', target, record: next });
    return true;
  }

  async takePermit(target: string, max: number, ttlMs: number, nowMs: number, generation?: number): Promise<string | null> {
    const stored = this.#breakers.get(target)?.generation;
    if (generation !== undefined && stored !== undefined && stored !== generation) return null;
    let permits = this.#permits.get(target);
    if (!permits) this.#permits.set(target, (permits = new Map()));
    for (const [id, expiresAt] of permits) if (expiresAt <= nowMs) permits.delete(id);
    if (permits.size >= max) return null;
    const id = randomUUID();
    permits.set(id, nowMs + ttlMs);
    return id;
  }

  async releasePermit(target: string, permitId: string): Promise<void> {
    this.#permits.get(target)?.delete(permitId);
  }

  addRequests(budgetKey: string, n: number, nowMs: number): void {
    this.#budget(budgetKey).add(nowMs, [n, 0]);
  }

  async takeRetry(budgetKey: string, cfg: BudgetConfig, nowMs: number, force = false): Promise<boolean> {
    const buckets = this.#budget(budgetKey);
    const [requests = 0, retries = 0] = buckets.sum(nowMs, cfg.windowS, 2);
    const allowed = retries + 1 <= retryAllowance(cfg, requests);
    if (allowed || force) buckets.add(nowMs, [0, 1]);
    return allowed;
  }

  async budgetWindow(budgetKey: string, cfg: BudgetConfig, nowMs: number): Promise<BudgetWindow> {
    const [requests = 0, retries = 0] = this.#budget(budgetKey).sum(nowMs, cfg.windowS, 2);
    return { requests, retries };
  }

  async admitClient(client: string, rates: ClientRates, nowMs: number): Promise<ClientRefusal | undefined> {
    const dues = this.#dues(client);
    const verdict = admitClient(dues, nowMs, rates);
    if (verdict.admitted) {
      dues.requests = verdict.requestsDue;
      return undefined;
    }
    dues.told = verdict.toldMs;
    return { waitMs: verdict.waitMs, by: verdict.by };
  }

  async reserveTokens(client: string, rates: ClientRates & { tokens: Rate }, estimate: number, nowMs: number): Promise<ClientRefusal | undefined> {
    const dues = this.#dues(client);
    const verdict = reserveTokens(dues, nowMs, rates, estimate);
    if (verdict.admitted) {
      dues.tokens = verdict.tokensDue;
      return undefined;
    }
    dues.told = verdict.toldMs;
    dues.requests = verdict.requestsDue;
    return { waitMs: verdict.waitMs, by: verdict.by };
  }

  spendTokens(client: string, rate: Rate, tokens: number, nowMs: number): void {
    const dues = this.#dues(client);
    dues.tokens = spend(dues.tokens, nowMs, rate, tokens);
  }

  #dues(client: string): ClientDues {
    let dues = this.#clients.get(client);
    if (!dues) this.#clients.set(client, (dues = {}));
    return dues;
  }

  getHoldOff(target: string): number | undefined {
    return this.#holdOffs.get(target);
  }

  async setHoldOff(target: string, untilMs: number, nowMs = 0): Promise<boolean> {
    const current = this.#holdOffs.get(target) ?? 0;
    if (current >= untilMs) return false;
    this.#holdOffs.set(target, untilMs);
    this.#emit({ kind: 'hold-off', target, untilMs });
    return current <= nowMs;
  }

  async exchangeDemand(_pool: string, demand: readonly number[]): Promise<{ totals: number[]; instances: number }> {
    return { totals: [...demand], instances: 1 };
  }

  async claimKey(key: string, claim: KeyRecord & { state: 'running' }, runningMs: number): Promise<KeyRecord | undefined> {
    return this.#keys.claim(key, claim, runningMs);
  }

  async readKey(key: string, nowMs: number): Promise<KeyRecord | undefined> {
    return this.#keys.read(key, nowMs);
  }

  async renewKey(key: string, owner: string, runningMs: number, nowMs: number): Promise<void> {
    this.#keys.renew(key, owner, runningMs, nowMs);
  }

  async settleKey(key: string, record: KeyRecord & { state: 'done' }, ttlMs: number, nowMs: number, owner?: string): Promise<void> {
    this.#keys.settle(key, record, ttlMs, nowMs, owner);
  }

  async releaseKey(key: string, owner: string): Promise<void> {
    this.#keys.release(key, owner);
  }

  /** The idempotency records this store holds, each with when it lapses (the Redis store's stand-in: see KeptKeys.held). */
  heldKeys(nowMs: number): Generator<[key: string, record: KeyRecord, untilMs: number]> {
    return this.#keys.held(nowMs);
  }

  onChange(listener: (change: StateChange) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  onDegradedChange(): () => void {
    return () => {};
  }

  forget(target: string): void {
    for (const map of [this.#outcomes, this.#breakers, this.#permits, this.#holdOffs]) map.delete(target);
    for (const key of this.#budgets.keys()) if (budgetOf(key, target)) this.#budgets.delete(key);
  }

  async close(): Promise<void> {
    this.#listeners.clear();
  }

  #budget(key: string): SecondBuckets {
    let b = this.#budgets.get(key);
    if (!b) this.#budgets.set(key, (b = new SecondBuckets()));
    return b;
  }

  #emit(change: StateChange): void {
    for (const l of this.#listeners) l(change);
  }
}
