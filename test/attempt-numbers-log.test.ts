// The request line's `attempt` numbers: a new user saw two entries of one request's `attempts` both `attempt: 0`, a
// failed breaker probe and the request's own attempt after it. A failed probe is the breaker's, lent by a parked
// request, and costs it none of its maxAttempts; numbered by those, a probe and the attempt after it shared a number.
// Each entry is now numbered by the requests the gateway had sent that target before it, probes included, the number
// the provider sees in x-retry-attempt.
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import { requestLine, startStack, TEST_KEY, type Stack } from './helpers/stack.ts';

let stack: Stack | undefined;
afterEach(async () => {
  await stack?.close();
  stack = undefined;
});

describe('the attempts of a request line', () => {
  it('number a failed probe and the attempt after it apart, as x-retry-attempt told the provider', { timeout: 30_000 }, async () => {
    stack = await startStack({
      config: (url) => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: {
          mock: {
            family: 'openai',
            baseUrl: `${url}/v1`,
            apiKey: TEST_KEY,
            // Opened by the first failure; while the request is parked it is probed every 200 to 400 ms, never by openS.
            breaker: { consecutiveFailures: 1, openS: 60, probeWhileParkedMs: 200, probeWhileParkedMaxMs: 400, closeAfter: 1 },
          },
        },
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }], timeoutMs: 15_000, retry: { maxAttempts: 3, backoff: { baseMs: 10, capMs: 20 } } }],
      }),
    });
    stack.mock.brownout('503', 2_000);
    const client = new OpenAI({ baseURL: stack.baseURL, apiKey: 'unused', maxRetries: 0, logLevel: 'off' });
    await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });

    const line = await requestLine(stack);
    const attempts = line.attempts as Array<{ attempt: number; probe?: boolean; reason: string }>;
    // The first attempt opened the breaker; at least one probe failed in the brownout before one found it over.
    expect(attempts.filter((a) => a.probe && a.reason === 'status_503').length, JSON.stringify(attempts)).toBeGreaterThanOrEqual(1);
    expect(attempts.at(-1)!.reason).toBe('ok');
    expect(attempts.map((a) => a.attempt)).toEqual(attempts.map((_, i) => i));
    const sent = stack.mock.requests().map((r) => Number(r.headers['x-retry-attempt'] ?? 0));
    expect(sent).toEqual(attempts.map((a) => a.attempt));
  });
});
