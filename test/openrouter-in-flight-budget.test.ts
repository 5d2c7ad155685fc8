// OpenRouter's in-flight spending budget: it charges a request when it finishes, so it caps the estimated cost of the
// paid requests running at once, and answers one past it `402` with `error.metadata.limit_source:
// "openrouter_in_flight_budget"` and a `retry-after`: transient, unlike a spent balance. The gateway read every 402 as
// its own billing refused (README "Retries": credentials held for authHoldS, 60 s, fleet-wide; clients answered 502
// upstream_auth_error, `x-should-retry: false`), so a burst of concurrent agents, exactly what fills the budget, took
// OpenRouter out for a minute. It is now the 429 it stands for: retried after its retry-after, a hold-off, and passed
// on as a 429. A spent balance's 402 keeps the credentials path. Real HTTP: scripted upstreams and the `openai` SDK.
import { describe, expect, it } from 'vitest';
import { sdkError } from './helpers/openai-error.ts';
import { failsThen, json } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';

const startUpstreams = useScriptedUpstreams();
const ask = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'hi' }] };

const inFlightFull = () =>
  json(402, { error: { code: 402, message: 'In-flight spending budget exhausted: your running requests already use your balance. Retry shortly.', metadata: { limit_source: 'openrouter_in_flight_budget' } } }, { 'retry-after': '1' });
const balanceSpent = () => json(402, { error: { code: 402, message: 'Insufficient credits. Add more using https://openrouter.ai/credits' } });

describe("OpenRouter's 402 for a full in-flight budget", () => {
  it('is retried after its retry-after and answered', async () => {
    const g = await startUpstreams({ up: failsThen(1, inFlightFull, 'ok') }, [{ provider: 'up' }]);
    const { data, response } = await g.client.chat.completions.create(ask).withResponse();
    expect(data.choices[0]?.message.content).toBe('ok');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(g.seen.up![1]!.at - g.seen.up![0]!.at).toBeGreaterThanOrEqual(950);
    expect(g.seen.up?.[1]?.headers['x-retry-reason']).toBe('status_429');
  });

  it('reaches the client as a 429 with its retry-after when not retried, and holds no credentials', async () => {
    const g = await startUpstreams({ up: inFlightFull }, [{ provider: 'up' }], { route: { retry: { maxAttempts: 1 } } });
    const err = await sdkError(g.client.chat.completions.create(ask));
    expect(err.status).toBe(429);
    expect(Number(err.headers?.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect(JSON.stringify(err.error)).toContain('In-flight spending budget');
    // Seconds later the target takes requests again: no 60 s credentials hold.
    await new Promise((r) => setTimeout(r, 1_400));
    await sdkError(g.client.chat.completions.create(ask));
    expect(g.seen.up).toHaveLength(2);
  });

  it('a spent balance (402 without it) keeps the credentials path: 502 upstream_auth_error', async () => {
    const g = await startUpstreams({ up: balanceSpent }, [{ provider: 'up' }]);
    const err = await sdkError(g.client.chat.completions.create(ask));
    expect(err.status).toBe(502);
    expect((err.error as { code?: string } | undefined)?.code).toBe('upstream_auth_error');
    expect(g.seen.up).toHaveLength(1);
  });
});
