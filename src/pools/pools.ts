// The priority pools of every provider, built once from the config, and the request's class in them.
import type { Config } from '../config/schema.ts';
import { ProviderPool, type PoolObserver } from './provider-pool.ts';
import type { WaitingBodies } from './waiting-bodies.ts';
import { targetRates } from '../policy/target-rate.ts';

export class Pools {
  readonly #pools = new Map<string, ProviderPool>();
  /** Does any provider's pool have a token rate (pools.tokensPerMinute)? Only then is a request's estimate needed. */
  readonly countTokens: boolean;

  constructor(config: Config, now: () => number, observer: PoolObserver = {}, bodies?: WaitingBodies) {
    this.countTokens = Object.values(config.providers).some((p) => p.pools.tokensPerMinute !== undefined);
    for (const [name, p] of Object.entries(config.providers)) {
      const capacity = p.pools.maxConcurrent ?? p.maxConnections;
      this.#pools.set(
        name,
        new ProviderPool(
          {
            provider: name,
            capacity,
            retryCapacity: p.pools.maxConcurrentRetries ?? Math.max(1, Math.floor(capacity / 5)),
            classes: Object.entries(p.pools.classes).map(([cls, c]) => ({ name: cls, ...c })),
            decrease: p.pools.decrease,
            minLimit: p.pools.minLimit,
            rates: targetRates(p.pools),
          },
          now,
          observer,
          bodies,
        ),
      );
    }
  }

  of(provider: string): ProviderPool {
    return this.#pools.get(provider)!;
  }

  all(): IterableIterator<ProviderPool> {
    return this.#pools.values();
  }

  /**
   * The request's class in a provider's pool: the route's priority, lowered (never raised) by x-stormgate-priority,
   * so a batch job cannot promote itself.
   */
  classFor(provider: string, routePriority: string, requested: string | undefined): number {
    const pool = this.of(provider);
    const base = pool.classIndex(routePriority) ?? 0;
    const asked = pool.classIndex(requested);
    return asked !== undefined && asked > base ? asked : base;
  }

  close(): void {
    for (const p of this.#pools.values()) p.close();
  }
}
