// Requests parked through an outage are released into the provider's pool at what the lot allows (the breaker's
// probes, the target's adaptive limit), which may be more than the pool seats at once: its capacity, its retry cap, a
// class's share. Released, they had been admitted and had waited; the pool's bounded queue, there to shed newcomers,
// must not shed them (503 load_shed, inviting every SDK back) just as the provider comes back.
import { describe, expect, it } from 'vitest';
import { metricSum, useStacks, type Stack } from './helpers/stack.ts';

const stack = useStacks();

async function chat(s: Stack, i: number): Promise<string> {
  const res = await fetch(`${s.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: `hi ${i}` }] }),
  });
  const text = await res.text();
  return res.status === 200 ? 'ok' : `${res.status} ${text.slice(0, 120)}`;
}

async function untilBreakerOpen(s: Stack): Promise<void> {
  for (const end = Date.now() + 5_000; (await metricSum(s, 'stormgate_breaker_state{target="mock/gpt-4o"}')) !== 1; ) {
    if (Date.now() > end) throw new Error('the breaker did not open');
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** A pool with a queue of one per class, and a breaker that opens after `consecutiveFailures` and probes three at a time. */
function smallPool(o: { maxConnections: number; consecutiveFailures: number; maxAttempts: number }): Promise<Stack> {
  return stack({
    faults: { latencyMs: 100 },
    provider: {
      maxConnections: o.maxConnections,
      pools: { classes: { online: { minShare: 0.5, maxQueue: 1 }, batch: { minShare: 0.1, maxQueue: 1 } } },
      breaker: { consecutiveFailures: o.consecutiveFailures, openS: 1, halfOpenProbes: 3, closeAfter: 3, probeWhileParkedMs: 200, probeWhileParkedMaxMs: 400 },
    },
    route: { timeoutMs: 30_000, retry: { maxAttempts: o.maxAttempts } },
  });
}

describe('requests parked through an outage, released into a small pool', () => {
  it('are served when the half-open breaker lets more probes go than the pool has slots and queue', async () => {
    // One slot and a queue of one; the half-open breaker lets three probes go at a time.
    const s = await smallPool({ maxConnections: 1, consecutiveFailures: 1, maxAttempts: 1 });
    s.mock.brownout('503', 400);
    // One request fails and opens the breaker; the crowd comes once it is open and parks before its first attempt.
    expect(await chat(s, 0)).toMatch(/^503/);
    await untilBreakerOpen(s);
    const crowd = await Promise.all(Array.from({ length: 8 }, (_, i) => chat(s, i + 1)));
    expect(crowd.filter((x) => x !== 'ok')).toEqual([]);
    expect(await metricSum(s, 'stormgate_park_outcomes_total{route="chat",outcome="released"}')).toBeGreaterThanOrEqual(8);
  }, 30_000);

  it('are served when more parked retries are released than the pool runs retries and queues', async () => {
    // Four slots, so one retry at a time (maxConcurrentRetries: a fifth), and a queue of one.
    const s = await smallPool({ maxConnections: 4, consecutiveFailures: 2, maxAttempts: 3 });
    s.mock.brownout('503', 800);
    // Four requests fail together and open the breaker; each parks to retry once the target is back.
    const retried = await Promise.all([0, 1, 2, 3].map((i) => chat(s, i)));
    expect(retried.filter((x) => x !== 'ok')).toEqual([]);
    expect(await metricSum(s, 'stormgate_park_outcomes_total{route="chat",outcome="released"}')).toBeGreaterThanOrEqual(3);
  }, 30_000);
});
