// The adaptive limit against a provider that takes far less than maxConcurrent, over real HTTP: the 429s of its
// capacity are about our concurrency, and must never be judged noise (refusals that come whatever we do).
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { RETRY_LOOP_ONLY, useStacks, type Stack } from './helpers/stack.ts';

const start = useStacks(RETRY_LOOP_ONLY);

async function chat(s: Stack, headers: Record<string, string>) {
  const res = await fetch(`${s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
  });
  await res.arrayBuffer();
  return res.status;
}

describe('the adaptive limit against a provider at a third of maxConcurrent', () => {
  // A flood's first 429s come back at once and its successes a round trip later: a moving average of the refused share
  // read 0.56 where two in three were refused, the limit's cuts were judged not to help (refusals not about our
  // concurrency), and the limit went back to 24 for good, with 83% of the provider's answers 429.
  it('comes down to what the provider takes, and the provider stops answering 429', async () => {
    const capacity = 8;
    const s = await start({
      faults: { latencyMs: 150, capacity },
      provider: { maxConnections: 64, pools: { maxConcurrent: capacity * 3 } },
      route: { retry: { maxAttempts: 1 } },
    });
    let over = false;
    const client = async () => {
      while (!over) if ((await chat(s, { 'x-stormgate-timeout-ms': '4000' })) !== 200) await sleep(20);
    };
    const clients = Array.from({ length: 40 }, client);
    try {
      await sleep(5_000);
      const secondsBefore = new Set(s.mock.stats().perSecond.map((p) => p.second));
      await sleep(3_000);
      const seconds = s.mock.stats().perSecond.filter((p) => !secondsBefore.has(p.second)).slice(0, -1);
      const total = seconds.reduce((n, p) => n + p.total, 0);
      const limited = seconds.reduce((n, p) => n + (p.byStatus['429'] ?? 0), 0);
      const metrics = await (await fetch(`${s.url}/metrics`)).text();
      const limit = Number(metrics.match(/^stormgate_pool_limit\{target="mock\/gpt-4o"\} ([\d.]+)$/m)?.[1]);
      expect(total).toBeGreaterThan(0);
      expect(limited).toBeLessThanOrEqual(Math.max(2, 0.1 * total));
      expect(limit).toBeLessThanOrEqual(capacity * 1.5);
    } finally {
      over = true;
      await Promise.all(clients);
    }
  });
});
