// A non-streaming probe runs until responseMs (its attempt's own limit), not firstTokenMs (a streams-only timer): its
// permit must last as long, or a provider that answers slowly but well gets a second probe, then a third, while the
// first is still being answered (found by the recovery QA suite: a slow provider during half-open).
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { useStacks, type Stack } from './helpers/stack.ts';

const start = useStacks();

async function chat(s: Stack) {
  const res = await fetch(`${s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
  });
  return { res, body: (await res.json()) as { error?: { code: string } } };
}

describe('a slow non-streaming probe', () => {
  it('holds its permit until its responseMs, so no second probe goes while it is answered', async () => {
    const s = await start({
      faults: { errors: [{ status: 503 }] },
      route: { retry: { maxAttempts: 1 }, park: false },
      provider: {
        breaker: { consecutiveFailures: 1, openS: 0.3, halfOpenProbes: 1, closeAfter: 1 },
        timeouts: { connectMs: 1000, firstTokenMs: 200, idleMs: 1000, responseMs: 5000 },
      },
    });
    expect((await chat(s)).res.status).toBe(503);
    await sleep(400);
    // Back, but slow: 3 s an answer, well within responseMs (and 2 s of slack for a loaded machine's second request).
    s.mock.setFaults({ latencyMs: 3000 });
    const probe = chat(s);
    // Past firstTokenMs and its permit's grace (700 ms), well before the probe's answer.
    await sleep(1000);
    const second = await chat(s);
    expect(second.body.error?.code).toBe('circuit_open');
    expect((await probe).res.status).toBe(200);
    expect(s.mock.stats().maxInflight).toBe(1);
  });
});
