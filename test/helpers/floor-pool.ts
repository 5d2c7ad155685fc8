// A provider pool as one instance of a fleet holds it, for the floor hold's tests (src/pools/floor-hold.ts): online
// above batch, `capacity` slots, the clock the test's fake timers move.
import { ProviderPool, type Acquired, type PoolClass, type SlotRequest } from '../../src/pools/provider-pool.ts';

const ONLINE_BATCH: PoolClass[] = [{ name: 'online', minShare: 0.5, maxQueue: 100 }, { name: 'batch', minShare: 0.1, maxQueue: 100 }];

export function fleetPool(capacity = 6, classes: PoolClass[] = ONLINE_BATCH): ProviderPool {
  return new ProviderPool({ provider: 'p', capacity, retryCapacity: 1, classes, decrease: 0.9, minLimit: 1 }, () => Date.now());
}

/** A slot request of class `cls` (0: the highest) with a deadline far enough to wait out any hold by default. */
export function slotRequest(cls: number, deadlineAtMs = 30_000): SlotRequest {
  return { cls, target: 'p/m', retry: false, deadlineAtMs, minAttemptMs: 1_000, signal: new AbortController().signal };
}

/** The acquisition's answer once it comes: `answer` stays undefined while the request waits. */
export function track(p: Promise<Acquired>): { answer?: Acquired } {
  const out: { answer?: Acquired } = {};
  void p.then((a) => (out.answer = a));
  return out;
}
