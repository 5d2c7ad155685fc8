// A provider hang under the default retry budget: the requests it caught time out (first token), the breaker opens,
// and their retries wait parked for the probes. When the probes find the provider back, those retries are released at
// the pace of the parking lot and the adaptive limit: counted in the budget, but not refused by it (a retry refused
// then would turn a request the provider can now answer, with time left before its deadline, into a 504).
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { useStacks, type Stack, metricSum } from './helpers/stack.ts';

const start = useStacks();
const N = 40;

async function streamChat(s: Stack, timeoutMs: number): Promise<{ status: number; code?: string; fallback: string | null }> {
  const res = await fetch(`${s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-stormgate-timeout-ms': String(timeoutMs) },
    body: JSON.stringify({ model: 'gpt-4o', stream: true, messages: [{ role: 'user', content: 'hi' }] }),
  });
  const text = await res.text();
  const code = res.status === 200 ? undefined : (JSON.parse(text) as { error: { code: string } }).error.code;
  return { status: res.status, code, fallback: res.headers.get('x-stormgate-fallback') };
}

describe('requests caught by a provider hang, under the default retry budget', () => {
  it('retry once the breaker\'s probes find the provider back: the parked retries are counted, not refused', async () => {
    const s = await start({
      // The provider hangs (no headers) until the test ends the hang.
      faults: { hangRate: 1 },
      provider: {
        timeouts: { connectMs: 1_000, firstTokenMs: 1_000, idleMs: 5_000, keepAliveMs: 4_000 },
        breaker: { consecutiveFailures: 5, openS: 1, probeWhileParkedMs: 200, halfOpenProbes: 3, closeAfter: 3 },
      },
      // The default budget (10% of requests over 10 s, floor 1 retry/s): a floor of 10 retries in the window.
      route: { budget: { ratio: 0.1, windowS: 10, minRetriesPerSecond: 1 }, minAttemptMs: 300 },
    });
    // N clients whose first attempts all go into the hang: they time out at the first token, together.
    const answers = Promise.all(Array.from({ length: N }, () => streamChat(s, 10_000)));
    await sleep(2_000);
    s.mock.setFaults({});
    const results = await answers;
    const failed = results.filter((r) => r.status !== 200);
    // Every client is answered: the provider is fine after the hang and each had more than 6 s left.
    expect(failed).toEqual([]);
    // The retries were counted in the budget all the same (they spent it: none left for a retry straight back into the
    // target), and none was refused.
    expect(s.mock.requests().filter((r) => r.status === 200 && r.headers['x-retry-attempt'] !== undefined).length).toBeGreaterThan(N / 2);
    expect(await metricSum(s, 'stormgate_retry_budget_remaining{route="chat"}')).toBe(0);
    expect(await metricSum(s, 'stormgate_retry_budget_exhausted_total')).toBe(0);
  });

  it('waits in the park for the probes when the breaker is open, even with no retry left in the budget', async () => {
    const s = await start({
      faults: { hangRate: 1 },
      provider: {
        timeouts: { connectMs: 1_000, firstTokenMs: 300, idleMs: 5_000, keepAliveMs: 4_000 },
        breaker: { consecutiveFailures: 1, openS: 30, probeWhileParkedMs: 100, closeAfter: 1 },
      },
      // No retry is ever granted by the budget: whatever retries here is counted, not taken.
      route: { budget: { ratio: 0, windowS: 10, minRetriesPerSecond: 0 }, minAttemptMs: 300 },
    });
    // The first request's timeout (at 300 ms) opens the breaker; the second's comes 200 ms later, when a parked request
    // could already probe: the breaker is still open (the probe hangs too), so its retry must wait for the probes
    // rather than be taken from the budget.
    const first = streamChat(s, 5_000);
    await sleep(200);
    const second = streamChat(s, 5_000);
    await sleep(400);
    s.mock.setFaults({});
    expect(await first).toEqual({ status: 200, code: undefined, fallback: null });
    expect(await second).toEqual({ status: 200, code: undefined, fallback: null });
    expect(await metricSum(s, 'stormgate_retry_budget_exhausted_total')).toBe(0);
  });
});
