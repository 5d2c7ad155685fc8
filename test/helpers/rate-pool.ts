// A provider pool with rates on the fake clock (vi.useFakeTimers), a slot request for it, and a grant log: the shape
// the rate mutation tests share.
import { ProviderPool, type Acquired, type SlotRequest } from '../../src/pools/provider-pool.ts';

export const RATE_CLASSES = [
  { name: 'online', minShare: 0, maxQueue: 100 },
  { name: 'batch', minShare: 0, maxQueue: 100 },
];

export function ratePool(rates: ConstructorParameters<typeof ProviderPool>[0]['rates'], capacity = 50, classes = RATE_CLASSES): ProviderPool {
  return new ProviderPool({ provider: 'p', capacity, retryCapacity: capacity, classes, decrease: 0.9, minLimit: 1, rates }, () => Date.now());
}

export const rateReq = (extra: Partial<SlotRequest> = {}): SlotRequest => ({ cls: 0, target: 'p/a', retry: false, deadlineAtMs: 600_000, minAttemptMs: 0, signal: new AbortController().signal, ...extra });

/** Asks for a slot and notes when (fake ms) it is granted; the slot goes back at once unless `hold`. */
export function trackGrant(p: ProviderPool, label: string, r: SlotRequest, log: Array<[string, number]>, hold = false): Promise<Acquired> {
  return p.acquire(r).then((a) => {
    if (a.ok) {
      log.push([label, Date.now()]);
      if (!hold) a.slot.release();
    }
    return a;
  });
}
