// The retry budget, per route and target: first attempts add to the request count (batched, off the request path);
// a retry takes one from the budget (one round trip). Client-declared retries (x-stainless-retry-count > 0) count as
// retries too, so the budget sees retries from every layer.
import type { BudgetSettings } from '../config/schema.ts';
import type { StateStore } from './store.ts';

export class RetryBudget {
  constructor(
    private readonly store: StateStore,
    private readonly now: () => number,
  ) {}

  static key(route: string, target: string): string {
    return `${route}/${target}`;
  }

  /** A request's first attempt on a target (a fallback's included). */
  countRequest(key: string): void {
    this.store.addRequests(key, 1, this.now());
  }

  /** May the gateway retry? Takes the retry from the budget when it may. */
  tryRetry(key: string, cfg: BudgetSettings): Promise<boolean> {
    return this.store.takeRetry(key, cfg, this.now());
  }

  /** A retry the client made on its own: always served once, counted even when the budget is spent. Resolves to whether it fit. */
  countClientRetry(key: string, cfg: BudgetSettings): Promise<boolean> {
    return this.store.takeRetry(key, cfg, this.now(), true);
  }
}
