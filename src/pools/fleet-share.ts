// With a shared state store, maxConcurrent is the fleet's: each instance takes a share of every provider's pool by
// its demand, refreshed twice a second, so N instances do not send N times the concurrency the provider accepts.
// Demand is exchanged per priority class and the fleet's capacity is handed out as one pool would hand it out: each
// lower class with demand keeps its minShare floor, then higher classes first, so an instance whose clients are all
// batch cannot take the slots another instance's online users need (by total demand alone, 150 batch agents on one
// instance left 3 of 24 slots to the online traffic of another, which queued for seconds). While the store cannot be
// asked, an instance keeps the share it had. An instance left only the pool's floor slot holds its online newcomers
// until the others have made room (floor-hold.ts).
import type { StateStore } from '../state/store.ts';
import type { Pools } from './pools.ts';
import type { PoolClass, ProviderPool } from './provider-pool.ts';

/** Half a second: shares follow a shift in demand within about a second. */
export const REFRESH_MS = 500;

/**
 * Slots a class's demand is counted for: what it holds and waits for, plus room for the arrivals of the next half
 * second (an eighth, and one), so a class does not live exactly at its demand with every newcomer waiting for the
 * next exchange.
 */
function withHeadroom(demand: number): number {
  return demand > 0 ? demand + Math.ceil(demand / 8) + 1 : 0;
}

/**
 * This instance's share (0..1] of a pool of `capacity`: the fleet's capacity given to classes (floors of the lower
 * classes first, then highest class first), each class's part split by the instances' demand in it, and what demand
 * leaves over split by demand plus one per instance (an idle instance keeps a small share, so its first requests need
 * not wait for a refresh).
 */
export function fleetShare(capacity: number, classes: readonly PoolClass[], own: readonly number[], fleet: readonly number[], instances: number): number {
  const want = classes.map((_, k) => withHeadroom(Math.max(fleet[k] ?? 0, own[k] ?? 0)));
  const alloc = classes.map(() => 0);
  let left = capacity;
  for (let k = 1; k < classes.length; k++) {
    alloc[k] = Math.min(want[k]!, classes[k]!.minShare * capacity, left);
    left -= alloc[k]!;
  }
  for (let k = 0; k < classes.length; k++) {
    const more = Math.min(want[k]! - alloc[k]!, left);
    alloc[k]! += more;
    left -= more;
  }
  let mine = 0;
  for (let k = 0; k < classes.length; k++) {
    const d = own[k] ?? 0;
    const total = Math.max(fleet[k] ?? 0, d);
    if (d > 0 && total > 0) mine += (alloc[k]! * d) / total;
  }
  const ownTotal = own.reduce((a, b) => a + b, 0);
  const fleetTotal = Math.max(fleet.reduce((a, b) => a + b, 0), ownTotal);
  mine += (left * (ownTotal + 1)) / (fleetTotal + Math.max(1, instances));
  const share = mine / capacity;
  // NaN (a fleet total no count could be) would become the pool's capacity, and no request would ever wait for a slot.
  return Number.isFinite(share) ? Math.min(1, Math.max(0, share)) : 1 / Math.max(1, instances);
}

/** The most of a target's rates the fleet keeps for its instances' floors: a tenth. */
const RATE_FLOOR_RESERVE = 0.1;

/**
 * This instance's part (0..1] of the fleet's rates (pools.requestsPerMinute, tokensPerMinute), from its share of the
 * pool: the share itself, not its slots (rounded to whole slots, at least one each, the parts summed to 1.5 times the
 * rate for 6 instances of a pool of 4, and to 1.1 times for shares of 0.45 and 0.55 of 10). Each instance keeps a
 * floor (one slot's part of the rate, as its floor slot gave it, but at most a tenth of the rate over the fleet), and
 * the floors are taken out of the rate before the shares split it, so the parts of the fleet sum to the rate, not
 * above it. The floor paces an idle instance's requests after its first (its burst of one takes that at once) until
 * the next exchange counts its demand, and while the store cannot be asked.
 */
export function rateShare(share: number, capacity: number, instances: number): number {
  const n = Math.max(1, instances);
  const floor = Math.min(1 / Math.max(1, capacity), RATE_FLOOR_RESERVE / n);
  return floor + (1 - n * floor) * Math.min(1, Math.max(0, share));
}

/**
 * For how many classes, from the highest, a newcomer of that class would get a slot of its own from the fleet (its share of `capacity`
 * rounding to one), the lowest class left out (the floor hold never holds it). Only those are worth holding for room
 * (floor-hold.ts): where the others' demand is as high a class (40 online calls on another instance leave a newcomer
 * here a forty-first of the slots) or the instances outnumber the slots, no exchange ever makes room, and the hold only
 * delayed the newcomer by its cap before it took the floor slot all the same.
 */
export function classesBacked(capacity: number, classes: readonly PoolClass[], own: readonly number[], fleet: readonly number[], instances: number): number {
  let k = 0;
  for (; k < classes.length - 1; k++) {
    const plusOne = (xs: readonly number[]) => classes.map((_, j) => (xs[j] ?? 0) + (j === k ? 1 : 0));
    // As sharedSlots (floor-hold.ts) counts them; that module imports this one.
    if (Math.round(capacity * fleetShare(capacity, classes, plusOne(own), plusOne(fleet), instances)) < 1) break;
  }
  return k;
}

export function shareFleetCapacity(pools: Pools, store: StateStore, now: () => number): () => void {
  const exchange = async (pool: ProviderPool) => {
    const demand = pool.demandByClass();
    const fleet = await store.exchangeDemand(pool.settings.provider, demand, now());
    if (!fleet) return;
    const own = demand.reduce((a, b) => a + b, 0);
    const total = fleet.totals.reduce((a, b) => a + b, 0);
    const { capacity, classes } = pool.settings;
    const share = fleetShare(capacity, classes, demand, fleet.totals, fleet.instances);
    pool.setShare(share, Math.max(0, total - own), classesBacked(capacity, classes, demand, fleet.totals, fleet.instances), rateShare(share, capacity, fleet.instances));
  };
  const refresh = async () => {
    for (const pool of pools.all()) await exchange(pool);
  };
  // A newcomer held for room the fleet has not made (floor-hold.ts) is demand the others should hear now.
  for (const pool of pools.all()) pool.shareOnDemand(() => void exchange(pool));
  const timer = setInterval(() => void refresh(), REFRESH_MS);
  timer.unref();
  void refresh();
  return () => clearInterval(timer);
}
