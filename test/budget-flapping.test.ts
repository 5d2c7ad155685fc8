// A flapping provider under a retry budget that grants nothing: every other request fails, so the breaker opens and
// closes again and again. A retry the parking lot releases is counted but not refused, for the retries a hang caught
// (test/budget-after-hang.test.ts); it must not turn into a retry budget bypass for every request, up to maxAttempts,
// each time the breaker closes and the provider fails again.
import { describe, expect, it } from 'vitest';
import { useStacks, type Stack } from './helpers/stack.ts';

const start = useStacks();
const N = 24;

function chat(s: Stack, id: string) {
  return fetch(`${s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-stormgate-timeout-ms': '10000', 'x-stainless-test-id': id },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
  }).then((res) => res.status);
}

interface LoggedAttempt {
  target: string;
  reason: string;
  probe?: boolean;
}

describe('a flapping provider, with a budget that grants no retry', () => {
  it('releases each request\'s deferred retry unrefused once; a released retry that fails again pays from the budget', async () => {
    const s = await start({
      faults: { latencyMs: 50, errors: [{ status: 503, rate: 0.5 }] },
      provider: { breaker: { consecutiveFailures: 1, openS: 30, probeWhileParkedMs: 50, halfOpenProbes: 1, closeAfter: 1 } },
      route: { budget: { ratio: 0, windowS: 10, minRetriesPerSecond: 0 }, retry: { maxAttempts: 5, backoff: { baseMs: 10, capMs: 20 } }, minAttemptMs: 200 },
    });
    const statuses = await Promise.all(Array.from({ length: N }, (_, i) => chat(s, `r${i}`)));
    const lines = s.logs.map((l) => JSON.parse(l) as { attempts?: LoggedAttempt[] }).filter((l) => Array.isArray(l.attempts));
    // Per request: its attempts that were not the breaker's probes (a probe is the breaker's attempt, not a retry).
    const sent = lines.map((l) => l.attempts!.filter((a) => !a.probe).length);
    expect(statuses.length).toBe(N);
    // The first attempt, and at most one retry released unrefused after the target came back.
    expect(Math.max(...sent)).toBeLessThanOrEqual(2);
  });
});
