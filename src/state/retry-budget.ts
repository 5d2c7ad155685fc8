// The retry budget, per route, target and priority class: first attempts add to the request count (batched, off
// the request path); a retry takes one from the budget (one round trip). Client-declared retries (x-stainless-retry-count > 0) count as
// retries too, so the budget sees retries from every layer.
import type { BudgetSettings } from '../config/schema.ts';
import { budgetForRetry, budgetOf, retryAllowance, type StateStore } from './store.ts';

export class RetryBudget {
  /** Every budget used so far, for the remaining-budget gauge. */
  readonly #seen = new Map<string, { route: string; cfg: BudgetSettings }>();

  constructor(
    private readonly store: StateStore,
    private readonly now: () => number,
  ) {}

  /**
   * One budget per priority class: a batch flood's retries are a share of the batch traffic, and never spend the
   * retries the online requests on the same route and target are owed.
   */
  static key(route: string, target: string, priorityClass: string): string {
    return `${route}/${priorityClass}/${target}`;
  }

  /**
   * A request's first attempt on a target (a fallback's included). The budget is reported in the remaining-budget
   * gauge from then on: a budget that has only served requests has its whole allowance left, and an instance that
   * retried on one class alone still reports the others (the fleet's instances read the same budgets).
   */
  countRequest(key: string, cfg: BudgetSettings): void {
    this.#remember(key, cfg);
    this.store.addRequests(key, 1, this.now());
  }

  /**
   * May the gateway retry? Takes the retry from the budget when it may. `providerAtLimit`: the failure retried said the
   * provider is at its limit (budgetForRetry: the floor is lower).
   */
  tryRetry(key: string, cfg: BudgetSettings, providerAtLimit = false): Promise<boolean> {
    this.#remember(key, cfg);
    return this.store.takeRetry(key, budgetForRetry(cfg, providerAtLimit), this.now());
  }

  /** Retries each route's budgets still allow in their current window, summed over its budgets (each priority class and target). */
  async remainingByRoute(): Promise<Map<string, number>> {
    const out = new Map<string, number>();
    // Side by side: each is a Redis round trip, and every budget that served a request is here (a class and target each).
    const seen = [...this.#seen];
    const windows = await Promise.all(seen.map(([key, { cfg }]) => this.store.budgetWindow(key, cfg, this.now())));
    seen.forEach(([, { route, cfg }], i) => {
      const w = windows[i]!;
      out.set(route, (out.get(route) ?? 0) + Math.max(0, Math.floor(retryAllowance(cfg, w.requests) - w.retries)));
    });
    return out;
  }

  /** Forgets the budgets of a target key given back (see StateStore.forget). */
  forget(target: string): void {
    for (const key of this.#seen.keys()) if (budgetOf(key, target)) this.#seen.delete(key);
  }

  /**
   * A retry served whatever the budget says (the client's own; one paced by the provider's hold-off), counted even
   * when the budget is spent. Resolves to whether it fit.
   */
  countRetry(key: string, cfg: BudgetSettings): Promise<boolean> {
    this.#remember(key, cfg);
    return this.store.takeRetry(key, cfg, this.now(), true);
  }

  /** A budget that has served a request or seen a retry is reported in the remaining-budget gauge. */
  #remember(key: string, cfg: BudgetSettings): void {
    // Called for every request: nothing to allocate once the budget is known.
    if (!this.#seen.has(key)) this.#seen.set(key, { route: key.slice(0, key.indexOf('/')), cfg });
  }
}
