// A request that parks behind others while the target is back (its hold-off over, its breaker never opened) waits for
// the lot's pacing, not for a breaker: if no slot comes before its deadline, it is told the provider is at capacity
// and when to come back (load_shed, x-should-retry: true), never "its circuit breaker is open; retry in 0 s".
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { defaultConfig, TEST_KEY, useStacks } from './helpers/stack.ts';
import { useRedisServer } from './helpers/redis-server.ts';

const redisServer = useRedisServer();

const start = useStacks();

async function chat(url: string, headers: Record<string, string> = {}): Promise<number> {
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
  });
  await res.arrayBuffer();
  return res.status;
}

describe('a newcomer parked behind requests the lot is releasing', () => {
  it('is answered load_shed with a retry hint, not circuit_open, when no slot comes before its deadline', async () => {
    const s = await start({
      // The first request is told "come back in 1 s" (a fleet-wide hold-off); every answer after it takes 2 s.
      faults: { latencyMs: 2_000, errors: [{ status: 429, times: 1, headers: { 'retry-after': '1' } }] },
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl, { route: { retry: { maxAttempts: 1 } }, provider: { pools: { maxConcurrent: 1 } } });
        return { ...base, state: { redis: redisServer().url, keyPrefix: `park-behind-${process.pid}`, commandTimeoutMs: 1000 } };
      },
    });
    // A gets the 429 (no retry): the target is held off for about a second.
    expect(await chat(s.url)).toBe(429);
    // B and C park on the hold-off; when it ends the lot lets one go (a limit of 1) and C waits for its slot.
    const parked = [chat(s.url), chat(s.url)];
    await sleep(1_500);
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toContain('stormgate_breaker_state{target="mock/gpt-4o"} 0');
    // E comes now, with 2.5 s to live: it queues behind C, and no slot frees before it must be answered.
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: TEST_KEY, maxRetries: 0, defaultHeaders: { 'x-stormgate-timeout-ms': '2500' } });
    const err = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(OpenAI.APIError);
    const e = err as InstanceType<typeof OpenAI.APIError>;
    // The breaker was never open: the answer must not say so, nor tell the client not to come back.
    expect(e.code).not.toBe('circuit_open');
    expect(e.message).not.toContain('circuit breaker');
    expect(e.status).toBe(503);
    expect(e.code).toBe('load_shed');
    expect(e.headers?.get('x-should-retry')).toBe('true');
    expect(Number(e.headers?.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect((await Promise.all(parked)).every((st) => st === 200)).toBe(true);
    // Counted as the pool's own sheds are.
    expect(await (await fetch(`${s.url}/metrics`)).text()).toMatch(/^stormgate_shed_total\{priority="online",reason="deadline"\} 1$/m);
  }, 20_000);
});
