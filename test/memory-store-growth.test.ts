// The in-process store over a long run: what it keeps per key must stay within a window, however long the process
// serves. A budget key that only counts requests (a healthy target, never retried) is never summed, the one place
// that used to drop old seconds.
import { describe, expect, it } from 'vitest';
import { MemoryStore, SecondBuckets } from '../src/state/memory-store.ts';
import { MAX_WINDOW_S } from '../src/state/store.ts';

const T = 1_700_000_000_000; // a second boundary

describe('SecondBuckets', () => {
  it('keeps at most the longest window of seconds when it is only ever added to', () => {
    const b = new SecondBuckets();
    for (let s = 0; s < 3_600; s++) b.add(T + s * 1000, [1, 0]);
    expect(b.size).toBeLessThanOrEqual(MAX_WINDOW_S + 1);
  });

  it('still sums a whole window of the longest length after pruning', () => {
    const b = new SecondBuckets();
    for (let s = 0; s < 1_000; s++) b.add(T + s * 1000, [1, 0]);
    expect(b.sum(T + 999_000, MAX_WINDOW_S, 2)).toEqual([MAX_WINDOW_S, 0]);
    expect(b.sum(T + 999_000, 10, 2)).toEqual([10, 0]);
  });
});

describe('MemoryStore over a long run', () => {
  it('counts a day of requests on a never-retried budget key and still answers for the last window only', async () => {
    const store = new MemoryStore();
    const cfg = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 0 };
    for (let s = 0; s < 86_400; s++) store.addRequests('chat/online/p/m', 10, T + s * 1000);
    expect(await store.budgetWindow('chat/online/p/m', cfg, T + 86_399_000)).toEqual({ requests: 100, retries: 0 });
    await store.close();
  });
});
