// With a shared state store, maxConcurrent is the fleet's: each instance takes a share of every provider's pool
// weighted by its demand, refreshed twice a second, so N instances do not send N times the concurrency the provider
// accepts. While the store cannot be asked, an instance keeps the share it had.
import type { StateStore } from '../state/store.ts';
import type { Pools } from './pools.ts';

/** Half a second: shares follow a shift in demand within about a second. */
const REFRESH_MS = 500;

export function shareFleetCapacity(pools: Pools, store: StateStore, now: () => number): () => void {
  const refresh = async () => {
    for (const pool of pools.all()) {
      const demand = pool.demand();
      const fleet = await store.exchangeDemand(pool.settings.provider, demand, now());
      // +1 per instance: an idle instance keeps a small share, so its first requests need not wait for a refresh.
      if (fleet) pool.setShare(Math.min(1, (demand + 1) / (fleet.total + fleet.instances)), Math.max(0, fleet.total - demand));
    }
  };
  const timer = setInterval(() => void refresh(), REFRESH_MS);
  timer.unref();
  void refresh();
  return () => clearInterval(timer);
}
