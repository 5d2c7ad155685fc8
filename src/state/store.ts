// Where the fleet's shared counters live. One interface, two implementations: in-process (memory-store.ts, the
// default) and Redis (redis-store.ts). The pipeline never knows which it has. Policy (when to trip, how much budget)
// is pure code in policy/; a store only counts, compares-and-sets, and tells every instance what changed.
import type { ClientRates, ClientRefusal, Rate } from '../policy/client-rate.ts';

export type { ClientRefusal };

/** The breaker state of one target, as the whole fleet sees it. Serialisable; `generation` is the CAS token. */
export interface BreakerRecord {
  state: 'closed' | 'open' | 'half-open';
  /** When the current state began, ms since the epoch. */
  sinceMs: number;
  /** While open: when probing may begin (openS with jitter after sinceMs). */
  openUntilMs: number;
  /** While half-open: probe successes so far. */
  probeSuccesses: number;
  /** While half-open: probe failures so far (absent: none, as in records written before it existed). */
  probeFailures?: number;
  /** Bumped by every transition; a fresh window starts with each generation. */
  generation: number;
  /**
   * Probes that failed in a row since the breaker last closed (absent: none, as in records written before it existed).
   * Each one doubles the wait before the next probe for parked requests.
   */
  failedProbes?: number;
}

/** Longest window any config may ask for (schema: windowS <= 300); bounds what either store keeps per key. */
export const MAX_WINDOW_S = 300;

export const INITIAL_BREAKER: BreakerRecord = { state: 'closed', sinceMs: 0, openUntilMs: 0, probeSuccesses: 0, generation: 0 };

/** Sums over a sliding window of whole seconds. */
export interface OutcomeWindow {
  requests: number;
  failures: number;
}

export interface BudgetWindow {
  requests: number;
  retries: number;
}

export interface BudgetConfig {
  ratio: number;
  windowS: number;
  minRetriesPerSecond: number;
}

/** What a request under an idempotency key was answered, kept for the key's repeats. */
export interface KeptAnswer {
  status: number;
  headers: Record<string, string>;
  /** `whole`: the answer's body as sent; `stream`: the SSE bytes the client was sent, its end included. */
  kind: 'whole' | 'stream';
  body: Buffer;
  /** The target key the run was counted under (RequestSummary.target): its replays are counted there too. */
  target?: string;
  /** The priority class the run was counted under: its replays are counted there too. */
  priority?: string;
}

/** An idempotency key's record: a request running under it, or how it ended. */
export type KeyRecord =
  /** `owner`: the claim's own id, so the request that took it knows it again (a claim whose reply was lost). */
  | { state: 'running'; fingerprint: string; sinceMs: number; owner?: string }
  /** `answer` absent: the answer was longer than idempotency.maxAnswerBytes (`bytes` long) and is not kept. */
  | { state: 'done'; fingerprint: string; answer?: KeptAnswer; bytes: number };

/** Something another instance (or this one) changed. */
export type StateChange =
  | { kind: 'breaker'; target: string; record: BreakerRecord }
  | { kind: 'hold-off'; target: string; untilMs: number };

export interface StateStore {
  readonly kind: 'memory' | 'redis';
  /** True while the shared store cannot be reached and local state stands in for it. */
  readonly degraded: boolean;

  /**
   * Adds outcome counts to the target's window for the breaker `generation` (a new generation starts a fresh window)
   * and returns the window's fleet-wide sums over the last `windowS` seconds, the current one included.
   * Called in batches (at most every 50 ms), never awaited on the request path.
   */
  addOutcomes(target: string, generation: number, delta: OutcomeWindow, nowMs: number, windowS: number): Promise<OutcomeWindow>;

  /** The breaker record as last seen (pushed by every instance); undefined when nothing was ever written. Synchronous. */
  getBreaker(target: string): BreakerRecord | undefined;
  /**
   * While the fleet's record of a target this instance has not looked at yet is being read (its first sight): resolves
   * once it is in (or the read failed). Undefined when there is nothing to wait for. Optional: a store without a fleet
   * has nothing to read.
   */
  firstRead?(target: string): Promise<void> | undefined;
  /** Writes `next` only if the stored generation is still `expectedGeneration`; on success tells every instance. */
  casBreaker(target: string, expectedGeneration: number, next: BreakerRecord): Promise<boolean>;

  /**
   * Takes one of at most `max` half-open probe permits; permits expire after ttlMs so a dead instance cannot hold them.
   * `generation`: of the breaker record the caller judged by; no permit once the stored record has moved past it.
   */
  takePermit(target: string, max: number, ttlMs: number, nowMs: number, generation?: number): Promise<string | null>;
  releasePermit(target: string, permitId: string): Promise<void>;

  /** Counts first attempts (requests) towards a retry budget; batched, never awaited on the request path. */
  addRequests(budgetKey: string, n: number, nowMs: number): void;
  /**
   * Takes one retry from the budget: allowed while retries < max(ratio * requests, minRetriesPerSecond * windowS) over
   * the window. With `force`, the retry is counted even when the budget is spent (the client retried on its own; it is
   * served once anyway). Returns whether the budget had room. One round trip.
   */
  takeRetry(budgetKey: string, cfg: BudgetConfig, nowMs: number, force?: boolean): Promise<boolean>;
  /** The budget's sums over the window, for the remaining-budget metric. */
  budgetWindow(budgetKey: string, cfg: BudgetConfig, nowMs: number): Promise<BudgetWindow>;

  /**
   * Admits one request of a client under its rates (auth.limits; policy/client-rate.ts): undefined when admitted (the
   * request counted), else the ms until one would be and the rate that refused (nothing counted). Fleet-wide on
   * Redis, one round trip; local while Redis is away.
   */
  admitClient(client: string, rates: ClientRates, nowMs: number): Promise<ClientRefusal | undefined>;
  /**
   * Reserves a request's estimated tokens against its client's token rate once its body is read (reserveTokens in
   * policy/client-rate.ts): undefined when admitted (the estimate spent), else the ms until it would fit, with the
   * request admitClient counted given back and nothing reserved. Fleet-wide on Redis, one round trip; local while
   * Redis is away.
   */
  reserveTokens(client: string, rates: ClientRates & { tokens: Rate }, estimate: number, nowMs: number): Promise<ClientRefusal | undefined>;
  /**
   * Counts tokens against a client's token rate: a settled reservation's difference, negative to give some back; may
   * overdraw it. Never awaited on the request path.
   */
  spendTokens(client: string, rate: Rate, tokens: number, nowMs: number): void;

  /** When the target's hold-off ends, as last seen; undefined when none. Synchronous. */
  getHoldOff(target: string): number | undefined;
  /**
   * Extends (never shortens) the target's hold-off to untilMs and tells every instance. Resolves true when this call
   * started it: no hold-off of the key was in force at nowMs, as the fleet has it (Redis's answer, or local state when
   * Redis is away), so that of instances told at once only one counts the start.
   */
  setHoldOff(target: string, untilMs: number, nowMs?: number): Promise<boolean>;

  /**
   * Tells the fleet this instance's demand on a provider's pool per priority class (the most slots in use plus
   * waiting since the last exchange, highest class first) and returns the fleet's total demand per class and its
   * instance count, so each instance can take a share of the pool by what it needs, higher classes first. Undefined
   * when the fleet cannot be asked (Redis away): the caller then keeps the share it had.
   */
  exchangeDemand(pool: string, demand: readonly number[], nowMs: number): Promise<{ totals: number[]; instances: number } | undefined>;

  /**
   * Claims an idempotency key (an opaque, already scoped and hashed string) for a request about to run: `claim` is
   * written unless the key has a record, and lapses after runningMs, so an instance that died mid-request cannot hold
   * it. Undefined when this request got the key; else the record already there (the request to wait for, or the
   * answer to replay).
   */
  claimKey(key: string, claim: KeyRecord & { state: 'running' }, runningMs: number): Promise<KeyRecord | undefined>;
  /** The key's record, undefined when it has none (never used, given back, or expired). */
  readKey(key: string, nowMs: number): Promise<KeyRecord | undefined>;
  /** Extends the owner's running claim (a stream still being read) to runningMs from now; nothing for another record. */
  renewKey(key: string, owner: string, runningMs: number, nowMs: number): Promise<void>;
  /**
   * Keeps how the request under the key ended, for ttlMs. With its `owner`, not over another request's running claim
   * (one taken after the owner's lapsed, its instance cut off from Redis meanwhile): that run's answer is the one to keep.
   */
  settleKey(key: string, record: KeyRecord & { state: 'done' }, ttlMs: number, nowMs: number, owner?: string): Promise<void>;
  /** Gives the key back (the run ended without an answer to keep): removes the owner's running claim, nothing else. */
  releaseKey(key: string, owner: string): Promise<void>;

  /** Called for every change, from this instance or another. Returns an unsubscribe function. */
  onChange(listener: (change: StateChange) => void): () => void;
  /** Called when `degraded` flips. */
  onDegradedChange(listener: (degraded: boolean) => void): () => void;

  /**
   * Drops what this instance keeps for a target key given back (a made-up model the provider answered 404): its
   * windows, records, permits and budgets, so such names cannot grow memory without bound. Shared state expires.
   */
  forget(target: string): void;

  close(): Promise<void>;
}

/** Does a budget key (`route/class/target`, state/retry-budget.ts) count the target's retries? */
export function budgetOf(budgetKey: string, target: string): boolean {
  return budgetKey.endsWith(`/${target}`);
}

/** Allowed retries in a window: the ratio of requests, with a fleet-wide floor so a quiet route can still retry. */
export function retryAllowance(cfg: BudgetConfig, requests: number): number {
  return Math.max(cfg.ratio * requests, cfg.minRetriesPerSecond * cfg.windowS);
}

/** The floor, in retries a second, of a retry after the provider said it is at its limit (a 429, a 529). */
const AT_LIMIT_FLOOR_PER_SECOND = 1;

/**
 * The budget a retry is taken from. The floor is for a quiet route's flaky provider (a 503 now and then); a retry
 * after a rate limit adds to the very load the provider refuses, and with no wait hint nothing else (no breaker, no
 * hold-off) stops it: under 5 requests a second, 10 retries a second re-sent every request maxAttempts times.
 */
export function budgetForRetry(cfg: BudgetConfig, providerAtLimit: boolean): BudgetConfig {
  if (!providerAtLimit || cfg.minRetriesPerSecond <= AT_LIMIT_FLOOR_PER_SECOND) return cfg;
  return { ...cfg, minRetriesPerSecond: AT_LIMIT_FLOOR_PER_SECOND };
}
