// A revoked key, as the on-call sees it: the provider's 401 is no provider failure (the breaker stays closed) and, with
// a fallback, every client is answered, so stormgate_credentials_held is the one figure that names the target whose
// key was refused, for as long as its credential hold lasts.
import { describe, expect, it } from 'vitest';
import { useStacks, type Stack } from './helpers/stack.ts';

const start = useStacks();

async function chat(s: Stack): Promise<number> {
  const res = await fetch(`${s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
  });
  await res.arrayBuffer();
  return res.status;
}

async function metricsText(s: Stack): Promise<string> {
  return (await fetch(`${s.url}/metrics`)).text();
}

describe('stormgate_credentials_held', () => {
  it('is 0 for a target whose key is accepted', async () => {
    const s = await start();
    expect(await chat(s)).toBe(200);
    expect(await metricsText(s)).toMatch(/^stormgate_credentials_held\{target="mock\/gpt-4o"\} 0$/m);
  });

  it('is 1 while the target is held for its refused key, and 0 once the hold is over', async () => {
    const s = await start({ faults: { errors: [{ status: 401, code: 'invalid_api_key' }] }, provider: { authHoldS: 1 } });
    expect(await chat(s)).toBe(502);
    const text = await metricsText(s);
    expect(text).toMatch(/^stormgate_credentials_held\{target="mock\/gpt-4o"\} 1$/m);
    // The breaker says nothing of it: a refused key is not a provider failure.
    expect(text).toMatch(/^stormgate_breaker_state\{target="mock\/gpt-4o"\} 0$/m);
    await expect.poll(async () => metricsText(s), { timeout: 3_000, interval: 100 }).toMatch(/^stormgate_credentials_held\{target="mock\/gpt-4o"\} 0$/m);
  });
});
