// A parked request's probe answered with a bare 429 (no wait hint): the provider is up but rate-limiting. The breaker
// does not count a 429, so its verdict leaves the breaker open with the next probe due at once; the request must not
// then probe again and again, in a tight loop, until its deadline (a chaos run saw 21 upstream requests in 10 ms for
// one embeddings call with maxAttempts 1, and 72 for one chat call).
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { useStacks, type Stack } from './helpers/stack.ts';

const startStack = useStacks();

async function openBreaker(s: Stack): Promise<void> {
  const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
  for (let i = 0; i < 2; i++) {
    await client.chat.completions
      .create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] }, { headers: { 'x-stormgate-timeout-ms': '2000' } })
      .catch(() => undefined);
  }
  const metrics = await (await fetch(`${s.url}/metrics`)).text();
  expect(metrics).toMatch(/stormgate_breaker_state\{target="mock\/gpt-4o-mini"\} 1/);
}

const sentFor = (s: Stack, id: string) => s.mock.requests().filter((r) => r.headers['x-client-request-id'] === id);

describe('a probe answered with a bare 429', () => {
  for (const maxAttempts of [1, 3]) {
    it(`costs the parked request an attempt instead of being sent again at once (maxAttempts ${maxAttempts})`, async () => {
      const s = await startStack({
        faults: { resetRate: 1 },
        route: { retry: { maxAttempts, backoff: { strategy: 'fixed', baseMs: 50, capMs: 50 } }, budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 } },
        provider: { breaker: { consecutiveFailures: 2, openS: 30, probeWhileParkedMs: 200, probeWhileParkedMaxMs: 1000 } },
      });
      await openBreaker(s);
      s.mock.setFaults({ errors: [{ status: 429, rate: 1, code: 'rate_limit_exceeded' }] });
      const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
      const err = await client.chat.completions
        .create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] }, { headers: { 'x-request-id': 'parked-probe-429', 'x-stormgate-timeout-ms': '3000' } })
        .then(() => undefined, (e: unknown) => e as { status?: number; headers?: Headers });
      // The parked request probes, gets the provider's 429 and ends with it once its attempts are spent: never more
      // upstream requests than its maxAttempts.
      const sent = sentFor(s, 'parked-probe-429');
      expect(sent.length).toBeGreaterThanOrEqual(1);
      expect(sent.length).toBeLessThanOrEqual(maxAttempts);
      // The provider's 429 once its attempts are spent, or, still parked at its deadline, circuit_open.
      expect(maxAttempts === 1 ? [429] : [429, 503]).toContain(err?.status);
    });
  }

  it('does not let a crowd of parked requests probe one after another at once', async () => {
    const s = await startStack({
      faults: { resetRate: 1 },
      route: { retry: { maxAttempts: 1 }, budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 } },
      provider: { breaker: { consecutiveFailures: 2, openS: 30, probeWhileParkedMs: 200, probeWhileParkedMaxMs: 1000 } },
    });
    await openBreaker(s);
    s.mock.setFaults({ errors: [{ status: 429, rate: 1, code: 'rate_limit_exceeded' }] });
    s.mock.reset();
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        client.chat.completions
          .create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] }, { headers: { 'x-request-id': `crowd-${i}`, 'x-stormgate-timeout-ms': '1500' } })
          .catch(() => undefined),
      ),
    );
    // Probes go one round at a time: a 429 says the provider is there but refusing, so the next probe waits (as after
    // a probe that got no answer) instead of going the moment the last one came back.
    const sent = s.mock.requests().filter((r) => r.path === '/v1/chat/completions');
    expect(sent.length).toBeLessThanOrEqual(4);
  });
});
