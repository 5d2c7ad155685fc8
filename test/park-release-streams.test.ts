// A crowd of streams parked through an outage is released into the provider's pool no faster than the pool's slots
// free up: a parked request leaves the lot when its answer's first token comes, but its stream holds its pool slot
// to the end, so a lot paced by first tokens released the whole crowd at once and the pool's bounded queue shed the
// overflow (503 load_shed, inviting every SDK back) just as the provider recovered.
import { describe, expect, it } from 'vitest';
import { useStacks } from './helpers/stack.ts';

describe('streams parked through a brownout', () => {
  const stack = useStacks();

  it('are served once the provider is back, not shed by the pool they were released into', async () => {
    const s = await stack({
      // One-second streams.
      faults: { stream: { chunks: 5, chunkDelayMs: 200 } },
      provider: {
        maxConnections: 4,
        pools: { classes: { online: { minShare: 0.5, maxQueue: 2 }, batch: { minShare: 0.1, maxQueue: 2 } } },
        breaker: { consecutiveFailures: 2, openS: 1, probeWhileParkedMs: 200, probeWhileParkedMaxMs: 500 },
      },
      route: { timeoutMs: 60_000 },
    });
    s.mock.brownout('503', 1_500);
    const crowd = 16;
    const statuses = await Promise.all(
      Array.from({ length: crowd }, async (_, i) => {
        // Spread over the brownout's first half second: each one finds the breaker open and parks.
        await new Promise((r) => setTimeout(r, i * 30));
        const res = await fetch(`${s.url}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ model: 'gpt-4o', stream: true, messages: [{ role: 'user', content: `hi ${i}` }] }),
        });
        const text = await res.text();
        return res.status === 200 && text.includes('data: [DONE]') ? 'complete' : `${res.status} ${text.slice(0, 80)}`;
      }),
    );
    // Sixteen one-second streams through four slots take about four seconds; each had a minute.
    expect(statuses.filter((x) => x !== 'complete')).toEqual([]);
  }, 60_000);
});
