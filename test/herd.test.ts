// The thundering herd after a shared wait hint: requests the provider told "come back in 1.5 s" all together must not
// all come back together, whether each waits its hint itself or parks on the fleet's hold-off.
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { seededRandom } from '../src/policy/random.ts';
import { pastHoldOff, toldPastHoldOff, waitPastHoldOff } from '../src/policy/hold-off-wait.ts';
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

describe('clients a hold-off turns away', () => {
  // The SDKs wait exactly the retry-after-ms they are told: told the hold-off's end alone, 30 agents came back within a
  // few ms of it (test/third-party-suite-15.test.ts).
  it('are each told its end plus a spread of their own (a fifth, at most a second), never past the minute they are invited back for', () => {
    expect(toldPastHoldOff(2_000, () => 0.5)).toBe(2_200);
    expect(toldPastHoldOff(20_000, () => 0.5)).toBe(20_500);
    expect(toldPastHoldOff(59_800, () => 0.999)).toBe(60_000);
    // A longer wait is the provider's word, told as it is: the SDKs are not invited back for it.
    expect(toldPastHoldOff(90_000, () => 0.9)).toBe(90_000);
    // The request that started it is told the same, unless its own hint is the longer one.
    expect(pastHoldOff(2_000, 12_100, 10_000, () => 0.5)).toBe(2_100 + 0.5 * 420);
    expect(pastHoldOff(70_000, 71_000, 10_000, () => 0.5)).toBe(70_000);
    expect(pastHoldOff(undefined, 12_100, 10_000, () => 0.5)).toBeUndefined();
  });
});
