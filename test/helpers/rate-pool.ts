// A provider pool on the fake clock (vi.useFakeTimers), with rates or a retry cap of its own, a slot request for it,
// and a grant log: the shape the rate and retry cap mutation tests share.
import { ProviderPool, type Acquired, type SlotRequest } from '../../src/pools/provider-pool.ts';

export const RATE_CLASSES = [
  { name: 'online', minShare: 0, maxQueue: 100 },
  { name: 'batch', minShare: 0, maxQueue: 100 },
];

type PoolSettings = ConstructorParameters<typeof ProviderPool>[0];

export function ratePool(rates: PoolSettings['rates'], capacity = 50, classes = RATE_CLASSES): ProviderPool {
  return fakeClockPool({ capacity, retryCapacity: capacity, classes, rates });
}

/** `capacity` slots, of which retries hold at most `retryCapacity` (pools.maxConcurrentRetries); no rates. */
export function retryCapPool(capacity: number, retryCapacity: number): ProviderPool {
  return fakeClockPool({ capacity, retryCapacity, classes: RATE_CLASSES });
}

function fakeClockPool(s: Pick<PoolSettings, 'capacity' | 'retryCapacity' | 'classes' | 'rates'>): ProviderPool {
  return new ProviderPool({ provider: 'p', decrease: 0.9, minLimit: 1, ...s }, () => Date.now());
}

export const rateReq = (extra: Partial<SlotRequest> = {}): SlotRequest => ({ cls: 0, target: 'p/a', retry: false, deadlineAtMs: 600_000, minAttemptMs: 0, signal: new AbortController().signal, ...extra });
/** A retry's slot request. */
export const retryReq = (extra: Partial<SlotRequest> = {}): SlotRequest => rateReq({ retry: true, ...extra });

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
