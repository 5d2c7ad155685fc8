// A burst against a provider failing a share of requests, at start-up and after an idle spell: its 503s come in
// milliseconds, its answers tens of milliseconds later, so the burst's first outcomes are all failures. The
// consecutive-failures rule counted its quiet period from the last success (none yet, or one long ago) and opened the
// breaker fleet-wide for openS on every `npm run demo` (the primary's gpt-4o, failing about a third of first attempts).
// No quiet period now while an attempt sent before the failure is still out (its success may be on its way).
import OpenAI from 'openai';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { TEST_KEY, useStacks, type Stack } from './helpers/stack.ts';

const start = useStacks();

function burst(s: Stack, count: number): Promise<Array<PromiseSettledResult<unknown>>> {
  const client = new OpenAI({ baseURL: s.baseURL, apiKey: TEST_KEY, maxRetries: 0 });
  return Promise.allSettled(Array.from({ length: count }, (_, i) => client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: `burst ${i}` }] })));
}

async function opened(s: Stack): Promise<number> {
  const text = await (await fetch(`${s.url}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith('stormgate_breaker_transitions_total{target="mock/gpt-4o",to="open"}'));
  return line === undefined ? 0 : Number(line.split(' ').pop());
}

describe('the breaker under a burst whose fast errors come before its answers', () => {
  it('stays closed at start-up and after an idle spell against a provider failing a third of first attempts', async () => {
    const s = await start({
      faults: { latencyMs: 40, latencyJitterMs: 40, errors: [{ status: 503, rate: 0.35, firstAttemptsOnly: true }] },
      route: { retry: { maxAttempts: 3, backoff: { strategy: 'full-jitter', baseMs: 20, capMs: 200 } } },
    });
    const first = await burst(s, 30);
    await sleep(1_000);
    const second = await burst(s, 30);
    expect([...first, ...second].filter((r) => r.status === 'fulfilled')).toHaveLength(60);
    if ((await opened(s)) > 0) for (const l of s.logs) if (l.includes('"breaker')) console.log('breaker line of the failed run:', l.slice(0, 800));
    expect(await opened(s)).toBe(0);
    // The retries served what the first attempts lost.
    expect(s.mock.requests().length).toBeGreaterThan(60);
  });

  it('still opens on a provider that fails every request, burst or not', async () => {
    const s = await start({
      faults: { latencyMs: 40, errors: [{ status: 503, rate: 1 }] },
      // Requests that come to the open breaker park for its probe: the deadline answers them.
      route: { timeoutMs: 2_000, retry: { maxAttempts: 3, backoff: { strategy: 'full-jitter', baseMs: 20, capMs: 200 } } },
    });
    const results = await burst(s, 30);
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(0);
    expect(await opened(s)).toBe(1);
    // Opened within the burst: far fewer attempts reached the provider than its 30 requests' 90.
    expect(s.mock.requests().length).toBeLessThan(60);
  });
});
