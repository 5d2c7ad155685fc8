// Lower classes held back from one target (its quota is nearly spent) must be let go when that target's hold ends,
// whatever holds the pool's other targets have meanwhile: one timer per pool was replaced by the latest hold's, and a
// batch request for the first target then waited for an unrelated release, or until it was shed at its deadline.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ProviderPool, type SlotRequest } from '../src/pools/provider-pool.ts';

beforeEach(() => vi.useFakeTimers({ now: 0 }));
afterEach(() => vi.useRealTimers());

describe('a pool holding lower classes back from two targets', () => {
  it('lets a held batch request go when its own target\'s hold ends, though another target\'s hold came later', async () => {
    const p = new ProviderPool(
      { provider: 'p', capacity: 4, retryCapacity: 1, classes: [{ name: 'online', minShare: 0.5, maxQueue: 10 }, { name: 'batch', minShare: 0, maxQueue: 10 }], decrease: 0.9, minLimit: 1 },
      () => Date.now(),
    );
    const req = (target: string): SlotRequest => ({ cls: 1, target, retry: false, deadlineAtMs: 60_000, minAttemptMs: 0, signal: new AbortController().signal });
    // p/a's quota resets in 2 s; then p/b's, sooner, in 500 ms.
    p.holdLowerClasses('p/a', 2_000);
    p.holdLowerClasses('p/b', 500);
    let granted = false;
    void p.acquire(req('p/a')).then((a) => (granted = a.ok));
    await vi.advanceTimersByTimeAsync(1_000);
    expect(granted).toBe(false);
    // p/a's hold is over and the pool is idle: the batch request must have its slot now.
    await vi.advanceTimersByTimeAsync(1_100);
    expect(granted).toBe(true);
  });
});
