// The fleet's retry budgets in Redis: request counts batched off the request path and retries taken while Redis was
// away are held here until sent, apart from the store's synchronous state.
import type { MemoryStore } from './memory-store.ts';
import type { FleetClock } from './fleet-clock.ts';
import type { RedisHealth } from './redis-health.ts';
import { isCommandTimeout } from './redis-errors.ts';
import type { RedisKeys } from './redis-keys.ts';
import type { ScriptClient } from './redis-scripts.ts';
import { budgetOf, MAX_WINDOW_S, type BudgetConfig, type BudgetWindow } from './store.ts';

/** Batched request counts are sent at most this far apart. */
const FLUSH_INTERVAL_MS = 50;

interface RedisBudgetDeps {
  client: ScriptClient;
  keys: RedisKeys;
  /** The in-process stand-in, fed all along so its windows are warm when Redis goes away. */
  local: MemoryStore;
  health: RedisHealth;
  clock: FleetClock;
  now: () => number;
}

export class RedisBudget {
  readonly #deps: RedisBudgetDeps;
  /** Request counts not yet sent, per budget key and second. */
  readonly #pending = new Map<string, Map<number, number>>();
  /**
   * Retries taken on local state (Redis not yet or no longer usable), per budget key and second: sent when Redis is
   * back, so the fleet's budget counts them instead of granting the same retries again.
   */
  readonly #pendingRetries = new Map<string, Map<number, number>>();
  #flushTimer: NodeJS.Timeout | undefined;

  constructor(deps: RedisBudgetDeps) {
    this.#deps = deps;
  }

  addRequests(budgetKey: string, n: number, nowMs: number): void {
    this.#deps.local.addRequests(budgetKey, n, nowMs);
    addPending(this.#pending, budgetKey, this.#deps.clock.toFleet(nowMs), n);
    this.#flushTimer ??= setTimeout(() => this.flush(), FLUSH_INTERVAL_MS).unref();
  }

  async takeRetry(budgetKey: string, cfg: BudgetConfig, nowMs: number, force: boolean): Promise<boolean> {
    const remote = await this.#budget(budgetKey, cfg, nowMs, force ? 'force' : 'take');
    if (remote === undefined || remote === 'late') {
      const allowed = await this.#deps.local.takeRetry(budgetKey, cfg, nowMs, force);
      // Sent with the next flush on a usable Redis (the one after 'ready' at the latest). Not one whose script timed
      // out: Redis still runs it once it gets to it (a paused or busy Redis runs what is queued), and counts the retry
      // there; sent again, every retry taken while Redis was slow was counted twice, and the fleet's budget ran out at half.
      if ((allowed || force) && remote === undefined) addPending(this.#pendingRetries, budgetKey, this.#deps.clock.toFleet(nowMs), 1);
      return allowed;
    }
    // Mirror the fleet's decision locally so the local window stays a fair stand-in.
    if (remote.allowed || force) await this.#deps.local.takeRetry(budgetKey, cfg, nowMs, true);
    return remote.allowed;
  }

  async budgetWindow(budgetKey: string, cfg: BudgetConfig, nowMs: number): Promise<BudgetWindow> {
    const remote = await this.#budget(budgetKey, cfg, nowMs, 'peek');
    return remote && remote !== 'late' ? { requests: remote.requests, retries: remote.retries } : this.#deps.local.budgetWindow(budgetKey, cfg, nowMs);
  }

  /**
   * Redis's clock was read for the first time, skewMs off this instance's: the counts stamped before (on local state,
   * the clocks taken to agree) move to Redis's clock too. Sent as stamped, an instance started minutes ahead while
   * Redis did not answer put them minutes in the fleet's future, where every window counted them until then (and one
   * behind, in the past, where none did).
   */
  firstClockReading(skewMs: number): void {
    if (skewMs === 0) return;
    for (const pending of [this.#pending, this.#pendingRetries]) {
      for (const [budgetKey, seconds] of pending) {
        const moved = new Map<number, number>();
        // From the middle of the second stamped: off by half a second at most, as the clock's tolerance is.
        for (const [s, n] of seconds) {
          const to = second(s * 1000 + 500 - skewMs);
          moved.set(to, (moved.get(to) ?? 0) + n);
        }
        pending.set(budgetKey, moved);
      }
    }
  }

  /** Drops the unsent counts of the target's budgets (see StateStore.forget). */
  forget(target: string): void {
    for (const pending of [this.#pending, this.#pendingRetries]) for (const key of pending.keys()) if (budgetOf(key, target)) pending.delete(key);
  }

  /** Sends the counts not sent yet (Redis runs them before the QUIT that follows), and stops the batching. */
  close(): void {
    clearTimeout(this.#flushTimer);
    this.flush();
  }

  /**
   * One budget script call, with this instance's unsent request counts for the key; undefined when Redis failed,
   * 'late' when it timed out (Redis may still run it).
   */
  async #budget(budgetKey: string, cfg: BudgetConfig, nowMs: number, mode: 'peek' | 'take' | 'force') {
    const { client, keys, health, clock } = this.#deps;
    if (!health.usable()) return undefined;
    // Unsent counts ride along, so this answer counts them; if the call fails they stay counted locally only.
    const pending = this.#pending.get(budgetKey);
    this.#pending.delete(budgetKey);
    try {
      const [requests, retries, allowed] = await client.sgBudget(
        keys.budget(budgetKey), second(clock.toFleet(nowMs)), cfg.windowS, String(cfg.ratio), String(cfg.minRetriesPerSecond * cfg.windowS),
        mode, (cfg.windowS + 5) * 1000, ...pairs(pending),
      );
      health.answered();
      return { requests, retries, allowed: allowed === 1 };
    } catch (err) {
      health.failed(err, keys.budget(budgetKey));
      return isCommandTimeout(err) ? ('late' as const) : undefined;
    }
  }

  /** Sends the batched request counts, and retries taken on local state: one script call per budget key and kind. */
  flush(): void {
    const { client, keys, health, clock } = this.#deps;
    this.#flushTimer = undefined;
    const kinds = [['r', this.#pending], ['x', this.#pendingRetries]] as const;
    if (!health.usable()) {
      // Keep them for when Redis is back, but only what can still be inside a window.
      const oldest = second(clock.toFleet(this.#deps.now())) - MAX_WINDOW_S;
      for (const [, pending] of kinds) {
        for (const seconds of pending.values()) for (const s of seconds.keys()) if (s <= oldest) seconds.delete(s);
      }
      return;
    }
    for (const [field, pending] of kinds) {
      for (const [budgetKey, seconds] of pending) {
        const key = keys.budget(budgetKey);
        client
          .sgAddCounts(key, (MAX_WINDOW_S + 5) * 1000, MAX_WINDOW_S, field, ...pairs(seconds))
          .catch((err: unknown) => health.failed(err, key));
      }
      pending.clear();
    }
  }
}

/** The second a time falls in: Redis's windows (budgets, outcomes) count by the second. */
export function second(ms: number): number {
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
