// stormgate_retry_budget_remaining during an incident: the gauge reports every budget of the route the instance has
// served, not only those it happened to retry on. Two instances sharing one Redis budget otherwise disagree (one that
// retried only batch requests reported the batch budget alone: half the route's remaining retries), and a route that
// has not retried yet on this instance had no value at all.
import { describe, expect, it } from 'vitest';
import { useStacks, metricSum, type Stack } from './helpers/stack.ts';

const start = useStacks();

async function chat(s: Stack, priority: 'online' | 'batch'): Promise<number> {
  const res = await fetch(`${s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-stormgate-priority': priority },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
  });
  await res.arrayBuffer();
  return res.status;
}

describe('the retry budget remaining gauge', () => {
  // A floor of 10 retries per class over the window (1/s for 10 s), far above what 10% of a few requests allows.
  const budget = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 1 };

  it('has a value for a route that served requests but has not retried yet', async () => {
    const s = await start({ route: { budget } });
    expect(await chat(s, 'online')).toBe(200);
    const text = await (await fetch(`${s.url}/metrics`)).text();
    expect(text).toMatch(/^stormgate_retry_budget_remaining\{route="chat"\} 10$/m);
  });

  it('sums the budgets of every class the route served, not only the class that retried', async () => {
    // Every other request gets a 503: the batch request's first attempt fails and is retried, the online one is not.
    const s = await start({ route: { budget }, faults: { errors: [{ status: 503, rate: 0.5 }] }, provider: { breaker: false } });
    expect(await chat(s, 'online')).toBe(200); // 1st request: passes
    expect(await chat(s, 'batch')).toBe(200); // 2nd fails, its retry (3rd) passes
    // online: 10 left; batch: 10 - 1 retry = 9.
    expect(await metricSum(s, 'stormgate_retry_budget_remaining{route="chat"}')).toBe(19);
  });
});
