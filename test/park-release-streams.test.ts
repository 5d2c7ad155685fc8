// A crowd of streams parked through an outage is released into the provider's pool no faster than the pool's slots
// free up: a parked request leaves the lot when its answer's first token comes, but its stream holds its pool slot
// to the end, so a lot paced by first tokens released the whole crowd at once and the pool's bounded queue shed the
// overflow (503 load_shed, inviting every SDK back) just as the provider recovered.
import { describe, expect, it } from 'vitest';
import { metricSum, useStacks } from './helpers/stack.ts';

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
    const stream = async (i: number) => {
      const res = await fetch(`${s.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'gpt-4o', stream: true, messages: [{ role: 'user', content: `hi ${i}` }] }),
      });
      const text = await res.text();
      return res.status === 200 && text.includes('data: [DONE]') ? 'complete' : `${res.status} ${text.slice(0, 80)}`;
    };
    // Three streams fail and open the breaker; they park to retry: as many retries as the pool runs (maxConcurrentRetries,
    // 1 here) and queues (maxQueue, 2), so the first attempts released beside them find the queue full of retries. The
    // others come once the breaker is open, so each finds it open and parks before its first attempt. (Sent on a timer
    // alone, on a loaded machine the first 503s came back late and four or more went upstream before the breaker
    // opened; a fourth parked retry then found the queue full and ended with its 503. Released retries now wait for a
    // slot whatever the queue holds: test/park-release-pool.test.ts.)
    const openers = [0, 1, 2].map(stream);
    for (const end = Date.now() + 5_000; (await metricSum(s, 'stormgate_breaker_state{target="mock/gpt-4o"}')) !== 1; ) {
      if (Date.now() > end) throw new Error('the breaker did not open');
      await new Promise((r) => setTimeout(r, 10));
    }
    const crowd = 16;
    const others = Array.from({ length: crowd - openers.length }, async (_, k) => {
      // Spread over a third of a second, while the brownout lasts or after it: none of them meets a 503.
      await new Promise((r) => setTimeout(r, k * 25));
      return stream(k + openers.length);
    });
    const statuses = await Promise.all([...openers, ...others]);
    // Sixteen one-second streams through four slots take about four seconds; each had a minute.
    expect(statuses.filter((x) => x !== 'complete')).toEqual([]);
    expect(await metricSum(s, 'stormgate_park_outcomes_total{route="chat",outcome="released"}')).toBeGreaterThanOrEqual(crowd - openers.length);
  }, 60_000);
});

describe('streams released after an outage, still running when the target fails again', () => {
  const stack = useStacks();

  it('do not keep the next probe (and every request parked behind it) in the lot until they end', async () => {
    const s = await stack({
      // Eight-second streams: they outlast the second outage and the deadline of the request parked through it.
      faults: { stream: { chunks: 40, chunkDelayMs: 200 } },
      provider: { breaker: { consecutiveFailures: 2, openS: 1, probeWhileParkedMs: 200, probeWhileParkedMaxMs: 400 } },
      route: { timeoutMs: 4_000 },
    });
    const chat = (stream: boolean, content: string) =>
      fetch(`${s.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'gpt-4o', stream, messages: [{ role: 'user', content }] }),
      });
    // The first outage: two streams park, and are released (one the probe) once it is over.
    s.mock.brownout('503', 600);
    const streams = await Promise.all([chat(true, 'a'), new Promise((r) => setTimeout(r, 50)).then(() => chat(true, 'b'))]);
    expect(streams.map((r) => r.status)).toEqual([200, 200]);
    expect(await metricSum(s, 'stormgate_park_outcomes_total{route="chat",outcome="released"}')).toBeGreaterThanOrEqual(2);
    try {
      // The second: a request fails, opens the breaker again and parks; the provider is back half a second later.
      s.mock.brownout('503', 500);
      const started = Date.now();
      const res = await chat(false, 'c');
      // Its probe goes within a second of the outage's end (probeWhileParkedMaxMs), not once the streams end.
      expect({ status: res.status, body: res.status === 200 ? '' : (await res.text()).slice(0, 200) }).toEqual({ status: 200, body: '' });
      expect(Date.now() - started).toBeLessThan(3_500);
    } finally {
      await Promise.all(streams.map((r) => r.body?.cancel()));
    }
  }, 30_000);
});
