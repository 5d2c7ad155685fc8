// One conformance suite for both state stores: the in-process MemoryStore and the RedisStore on a real redis-server.
// Times are explicit (nowMs), so windows and expiries are checked to the second without waiting.
import { setTimeout as sleep } from 'node:timers/promises';
import { expect, it } from 'vitest';
import type { BreakerRecord, StateChange } from '../src/state/store.ts';
import { describeEachStore } from './helpers/redis-stores.ts';

const T = 1_700_000_000_000; // a second boundary
const OPEN: BreakerRecord = { state: 'open', sinceMs: T, openUntilMs: T + 5000, probeSuccesses: 0, generation: 1 };

describeEachStore((store) => {
  it('sums outcomes over the last windowS seconds and forgets older seconds', async () => {
    await store().addOutcomes('a', 0, { requests: 2, failures: 0 }, T, 10);
    await store().addOutcomes('a', 0, { requests: 1, failures: 1 }, T + 5000, 10);
    expect(await store().addOutcomes('a', 0, { requests: 0, failures: 0 }, T + 9999, 10)).toEqual({ requests: 3, failures: 1 });
    expect(await store().addOutcomes('a', 0, { requests: 0, failures: 0 }, T + 10_000, 10)).toEqual({ requests: 1, failures: 1 });
    expect(await store().addOutcomes('a', 0, { requests: 0, failures: 0 }, T + 15_000, 10)).toEqual({ requests: 0, failures: 0 });
  });

  it('forgets what it keeps for a target key given back: windows, records, hold-offs and budgets of that key only', async () => {
    const budget = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 0 };
    await store().addOutcomes('p/made-up', 0, { requests: 3, failures: 3 }, T, 10);
    await store().casBreaker('p/made-up', 0, OPEN);
    await store().setHoldOff('p/made-up', T + 60_000);
    store().addRequests('chat/online/p/made-up', 100, T);
    store().addRequests('chat/online/p/kept', 100, T);
    expect(await store().takeRetry('chat/online/p/made-up', budget, T)).toBe(true);
    expect(await store().takeRetry('chat/online/p/kept', budget, T)).toBe(true);
    store().forget('p/made-up');
    expect(store().getBreaker('p/made-up')).toBeUndefined();
    expect(store().getHoldOff('p/made-up')).toBeUndefined();
    if (store().kind === 'memory') {
      expect(await store().addOutcomes('p/made-up', 0, { requests: 0, failures: 0 }, T, 10)).toEqual({ requests: 0, failures: 0 });
      expect(await store().budgetWindow('chat/online/p/made-up', budget, T)).toEqual({ requests: 0, retries: 0 });
    }
    expect(await store().budgetWindow('chat/online/p/kept', budget, T)).toEqual({ requests: 100, retries: 1 });
  });

  it('starts a fresh window with a new breaker generation', async () => {
    await store().addOutcomes('a', 0, { requests: 5, failures: 5 }, T, 10);
    expect(await store().addOutcomes('a', 1, { requests: 1, failures: 0 }, T + 100, 10)).toEqual({ requests: 1, failures: 0 });
  });

  it('compare-and-sets the breaker once per generation and refuses a stale one', async () => {
    expect(store().getBreaker('a')).toBeUndefined();
    expect(await store().casBreaker('a', 0, OPEN)).toBe(true);
    expect(store().getBreaker('a')).toEqual(OPEN);
    expect(await store().casBreaker('a', 0, { ...OPEN, sinceMs: T + 1 })).toBe(false);
    expect(store().getBreaker('a')).toEqual(OPEN);
    const halfOpen: BreakerRecord = { ...OPEN, state: 'half-open', sinceMs: T + 5000, generation: 2 };
    expect(await store().casBreaker('a', 1, halfOpen)).toBe(true);
    expect(store().getBreaker('a')).toEqual(halfOpen);
  });

  it('grants at most max permits, frees one on release, and expires them after ttlMs', async () => {
    const first = await store().takePermit('a', 2, 1000, T);
    expect(first).toEqual(expect.any(String));
    expect(await store().takePermit('a', 2, 1000, T + 10)).toEqual(expect.any(String));
    expect(await store().takePermit('a', 2, 1000, T + 20)).toBeNull();
    await store().releasePermit('a', first!);
    expect(await store().takePermit('a', 2, 1000, T + 30)).toEqual(expect.any(String));
    expect(await store().takePermit('a', 2, 1000, T + 40)).toBeNull();
    // The permit taken at T + 10 expires at T + 1010; the one taken at T + 30 is still held.
    expect(await store().takePermit('a', 2, 1000, T + 1010)).toEqual(expect.any(String));
    expect(await store().takePermit('a', 2, 1000, T + 1010)).toBeNull();
  });

  it('allows exactly ratio * requests retries: 10 of 100 requests, the 11th refused', async () => {
    const cfg = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 0 };
    store().addRequests('b', 60, T);
    store().addRequests('b', 40, T + 1000);
    for (let i = 0; i < 10; i++) expect(await store().takeRetry('b', cfg, T + 2000)).toBe(true);
    expect(await store().takeRetry('b', cfg, T + 2000)).toBe(false);
    expect(await store().budgetWindow('b', cfg, T + 2000)).toEqual({ requests: 100, retries: 10 });
    // Once the requests leave the window, so does the allowance, and then the retries.
    expect(await store().budgetWindow('b', cfg, T + 10_500)).toEqual({ requests: 40, retries: 10 });
    expect(await store().budgetWindow('b', cfg, T + 12_000)).toEqual({ requests: 0, retries: 0 });
  });

  it('allows minRetriesPerSecond * windowS retries with no requests at all', async () => {
    const cfg = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 0.5 };
    for (let i = 0; i < 5; i++) expect(await store().takeRetry('b', cfg, T)).toBe(true);
    expect(await store().takeRetry('b', cfg, T)).toBe(false);
  });

  it('counts a forced retry even when the budget refuses it', async () => {
    const cfg = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 0 };
    store().addRequests('b', 10, T);
    expect(await store().takeRetry('b', cfg, T)).toBe(true);
    expect(await store().takeRetry('b', cfg, T, true)).toBe(false);
    expect(await store().budgetWindow('b', cfg, T)).toEqual({ requests: 10, retries: 2 });
  });

  it('only ever extends a hold-off', async () => {
    expect(store().getHoldOff('a')).toBeUndefined();
    await store().setHoldOff('a', T + 5000);
    expect(store().getHoldOff('a')).toBe(T + 5000);
    await store().setHoldOff('a', T + 1000);
    expect(store().getHoldOff('a')).toBe(T + 5000);
    await store().setHoldOff('a', T + 9000);
    expect(store().getHoldOff('a')).toBe(T + 9000);
  });

  it('fires onChange once per change and not for refused writes', async () => {
    const changes: StateChange[] = [];
    store().onChange((c) => changes.push(c));
    await store().casBreaker('a', 0, OPEN);
    await store().casBreaker('a', 0, OPEN);
    await store().setHoldOff('a', T + 5000);
    await store().setHoldOff('a', T + 4000);
    // Long enough for our own published messages to come back from Redis.
    await sleep(200);
    expect(changes).toEqual([
      { kind: 'breaker', target: 'a', record: OPEN },
      { kind: 'hold-off', target: 'a', untilMs: T + 5000 },
    ]);
  });
});
