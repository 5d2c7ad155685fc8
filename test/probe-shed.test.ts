// A probe that the provider's pool sheds (its class queue is full) must give its half-open permit back: it never went
// upstream, and while it holds the permit no other request may probe the target (for up to firstTokenMs).
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { useStacks, type Stack } from './helpers/stack.ts';

const start = useStacks();

async function chat(s: Stack, model: string) {
  const res = await fetch(`${s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }] }),
  });
  return { res, body: (await res.json()) as { error?: { code: string } } };
}

describe('a half-open probe shed by the pool', () => {
  it('gives its probe permit back, so the next request may probe at once', async () => {
    const s = await start({
      faults: { models: { broken: { errors: [{ status: 500, times: 1 }] }, slow: { latencyMs: 600 } } },
      route: { retry: { maxAttempts: 1 }, park: false },
      provider: {
        breaker: { consecutiveFailures: 1, openS: 0.2, halfOpenProbes: 1, closeAfter: 1 },
        // One slot, no queue: a request that finds it taken is shed at once.
        pools: { maxConcurrent: 1, classes: { online: { maxQueue: 0 } } },
      },
    });
    // The breaker of mock/broken opens (one failure), then its open time passes.
    expect((await chat(s, 'broken')).res.status).toBe(500);
    await sleep(300);
    // Another model of the same provider holds the pool's only slot.
    const slow = chat(s, 'slow');
    await sleep(100);
    // The probe for mock/broken takes the permit, then the pool sheds it: it never went upstream.
    const shed = await chat(s, 'broken');
    expect(shed.body.error?.code).toBe('load_shed');
    expect((await slow).res.status).toBe(200);
    // The pool is free again; the target is half-open with one permit: this request must be its probe.
    const probe = await chat(s, 'broken');
    expect(probe.body.error?.code).toBeUndefined();
    expect(probe.res.status).toBe(200);
  });
});
