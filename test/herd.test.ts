// The thundering herd after a shared wait hint: requests the provider told "come back in 1.5 s" all together must not
// all come back together, whether each waits its hint itself or parks on the fleet's hold-off.
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { seededRandom } from '../src/policy/random.ts';
import { waitPastHoldOff } from '../src/policy/hold-off-wait.ts';
import { chatStatus as chat, useStacks } from './helpers/stack.ts';

const start = useStacks();
const N = 40;

describe('a wait hint shared by many requests', () => {
  it('brings them back spread over the hint\'s jitter window, not in one burst at its end', async () => {
    const s = await start({
      // For 300 ms the provider answers every request 503 "come back in 1.5 s"; then it is fine.
      faults: { errors: [{ status: 503, headers: { 'retry-after-ms': '1500' } }] },
      // A budget that never refuses: this test is about when requests come back, not whether they may.
      route: { retry: { maxAttempts: 3, maxWaitHintMs: 5_000 }, timeoutMs: 20_000, budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 } },
      provider: { breaker: false },
      deps: { random: seededRandom(7) },
    });
    const answers = Promise.all(Array.from({ length: N }, () => chat(s.url)));
    // The 300 ms run from the provider's first 503: on a busy machine the requests can take longer than that to arrive.
    while (!s.mock.requests().some((r) => r.status === 503)) await sleep(5);
    await sleep(300);
    s.mock.setFaults({});
    expect((await answers).every((st) => st === 200)).toBe(true);
    // Every request that reached the provider after the first 503s: the held requests' first attempts and retries.
    const requests = s.mock.requests();
    const firstFailure = requests.find((r) => r.status === 503)!.receivedAt;
    const back = requests.filter((r) => r.status === 200 && r.receivedAt > firstFailure).map((r) => r.receivedAt);
    expect(back).toHaveLength(N);
    // Waits of 1.5 s x random(1, 1.2), or the hold-off's end plus up to a fifth of it: about 300 ms of spread.
    const first = Math.min(...back);
    expect(Math.max(...back) - first).toBeGreaterThan(150);
    const perBucket = new Map<number, number>();
    for (const t of back) perBucket.set(Math.floor((t - first) / 50), (perBucket.get(Math.floor((t - first) / 50)) ?? 0) + 1);
    expect(Math.max(...perBucket.values())).toBeLessThanOrEqual(N / 2);
  });
});

describe('a retry that the fleet\'s hold-off outlasts', () => {
  it('waits for the hold-off\'s end plus a jitter of its own (a fifth of the hold-off, at most a second)', () => {
    expect(waitPastHoldOff(1_700, 1_500, () => 0.5)).toBe(1_700);
    expect(waitPastHoldOff(1_200, 1_500, () => 0)).toBe(1_500);
    expect(waitPastHoldOff(1_200, 1_500, () => 0.5)).toBe(1_650);
    expect(waitPastHoldOff(1_000, 20_000, () => 0.999)).toBeCloseTo(20_999);
  });
});
