// OpenRouter (and other OpenAI-compatible services) answer a rate limit's 429 with `x-ratelimit-reset`, an instant in
// Unix milliseconds, and `x-ratelimit-remaining: 0`, often with no retry-after. The gateway read no hint from it: the
// retries went back at the backoff's pace into the limit, and the client was told no wait. Now the instant is the
// request's hint (README "Wait hints"), as the OpenAI-style reset headers are: waited out when it fits, passed on as
// `retry-after` when it does not. Real HTTP: a scripted upstream and the official `openai` SDK.
import { describe, expect, it } from 'vitest';
import { sdkError } from './helpers/openai-error.ts';
import { failsThen, json } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';

const startUpstreams = useScriptedUpstreams();
const ask = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'hi' }] };

/** OpenRouter's 429: the reset `inMs` from now, as Unix milliseconds, and nothing left. */
const limited = (inMs: number) =>
  json(429, { error: { message: 'Rate limit exceeded: free-models-per-min.', code: 429 } }, {
    'x-ratelimit-limit': '20',
    'x-ratelimit-remaining': '0',
    'x-ratelimit-reset': String(Date.now() + inMs),
  });

describe("a 429 whose only hint is a bare x-ratelimit-reset in Unix milliseconds (OpenRouter's)", () => {
  it('is waited out (about 1.5 s, not the backoff of milliseconds) and retried', async () => {
    const g = await startUpstreams({ up: failsThen(1, () => limited(1_500), 'ok') }, [{ provider: 'up' }]);
    const { data, response } = await g.client.chat.completions.create(ask).withResponse();
    expect(data.choices[0]?.message.content).toBe('ok');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    const waitedMs = g.seen.up![1]!.at - g.seen.up![0]!.at;
    expect(waitedMs).toBeGreaterThanOrEqual(1_400);
    expect(waitedMs).toBeLessThan(6_000);
  });

  it('longer than maxWaitHintMs, is passed on at once with the reset as retry-after', async () => {
    const g = await startUpstreams({ up: () => limited(45_000) }, [{ provider: 'up' }], { route: { retry: { maxAttempts: 3, maxWaitHintMs: 20_000 } } });
    const startedAt = Date.now();
    const err = await sdkError(g.client.chat.completions.create(ask));
    expect(Date.now() - startedAt).toBeLessThan(3_000);
    expect(err.status).toBe(429);
    expect(err.headers?.get('x-stormgate-attempts')).toBe('1');
    const retryAfterS = Number(err.headers?.get('retry-after'));
    expect(retryAfterS).toBeGreaterThanOrEqual(40);
    expect(retryAfterS).toBeLessThanOrEqual(46);
    expect(g.seen.up).toHaveLength(1);
  });
});
