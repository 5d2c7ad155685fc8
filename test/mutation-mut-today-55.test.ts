// Hand mutation testing of 2026-12-07's changes: the IETF RateLimit hints (draft 07's Dictionary, several field lines,
// `t` as an instant) and SambaNova's windowed instants (policy/wait-hint.ts), a 429 whose type names the account
// (providers/error-outcome.ts errorCodeOfFields), APIM's quota 403 read before a family translates it (pipeline/attempt.ts),
// the x-should-retry: false exemptions (pipeline/target-attempts.ts) and the model_not_found refusal under
// `<provider>/other` (pipeline/record-outcome.ts). Each test kills a mutant that the features' own tests let live.
import { describe, expect, it } from 'vitest';
import { parseWaitHint } from '../src/policy/wait-hint.ts';
import { classify } from '../src/policy/outcome.ts';
import { errorCodeOf } from '../src/providers/error-outcome.ts';
import { sdkError } from './helpers/openai-error.ts';
import { completion, failsThen, json, type Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';
import { requestLine } from './helpers/stack.ts';

const NOW = Date.UTC(2026, 11, 7, 12, 0, 0);
const gw = useScriptedUpstreams();
const ask = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'hi' }] };

describe('wait hints: the RateLimit field (draft 08 List, draft 07 Dictionary) and windowed instants', () => {
  it('waits for the latest of several used-up policies, on one line or several', () => {
    expect(parseWaitHint({ ratelimit: '"burst";r=0;t=2, "daily";r=0;t=3600' }, NOW)?.delayMs).toBe(3_600_000);
    expect(parseWaitHint({ ratelimit: ['"daily";r=0;t=3600', '"burst";r=0;t=2'] }, NOW)?.delayMs).toBe(3_600_000);
  });

  it('an empty or blank RateLimit field is no field: the RateLimit-Reset beside it is read', () => {
    expect(parseWaitHint({ ratelimit: '', 'ratelimit-reset': '30', 'ratelimit-remaining': '0' }, NOW)).toEqual({ delayMs: 30_000, source: 'ratelimit', fleetWide: false });
    expect(parseWaitHint({ ratelimit: ' ', 'ratelimit-reset': '30', 'ratelimit-remaining': '0' }, NOW)?.delayMs).toBe(30_000);
  });

  it("draft 07: no reset is no hint (never another member's number), and one request left is room", () => {
    expect(parseWaitHint({ ratelimit: 'limit=100, remaining=0' }, NOW)).toBeUndefined();
    expect(parseWaitHint({ ratelimit: 'limit=100, remaining=1, reset=30' }, NOW)).toBeUndefined();
  });

  it("an instant is read against the upstream's own clock (its Date), as every other reset is", () => {
    // The upstream's clock is an hour ahead of the gateway's; its limits renew a minute from its now.
    const date = new Date(NOW + 3_600_000).toUTCString();
    const upstreamNowS = (NOW + 3_600_000) / 1000;
    expect(parseWaitHint({ date, 'x-ratelimit-remaining-requests-day': '0', 'x-ratelimit-reset-requests-day': String(upstreamNowS + 60) }, NOW)?.delayMs).toBe(60_000);
    expect(parseWaitHint({ date, ratelimit: `"default";r=0;t=${upstreamNowS + 60}` }, NOW)?.delayMs).toBe(60_000);
    expect(parseWaitHint({ date, ratelimit: `limit=5, remaining=0, reset=${upstreamNowS + 60}` }, NOW)?.delayMs).toBe(60_000);
  });
});

describe('a 429 whose type names the account', () => {
  it('a finer account code beside it is kept (the reason names it)', () => {
    expect(errorCodeOf(429, Buffer.from(JSON.stringify({ error: { message: 'Your account is not active.', type: 'insufficient_quota', param: null, code: 'billing_not_active' } })))).toBe('billing_not_active');
  });

  it('only a 429: another status keeps the code it names', () => {
    const body = { error: { message: "This model's maximum context length is 8192 tokens.", type: 'insufficient_quota', param: 'messages', code: 'context_length_exceeded' } };
    const code = errorCodeOf(400, Buffer.from(JSON.stringify(body)));
    expect(code).toBe('context_length_exceeded');
    expect(classify({ kind: 'http', status: 400, errorCode: code, hint: undefined }).cls).toBe('context-length');
  });
});

describe("APIM's quota 403 in front of an Anthropic-family target", () => {
  it("the request's log line names the status the upstream sent (403), not the 429 it stands for", async () => {
    const apimQuota = (): Script => json(403, { statusCode: 403, message: 'Out of call volume quota. Quota will be replenished in 00:00:30.' }, { 'retry-after': '30' });
    const g = await gw({ a: { answer: apimQuota, family: 'anthropic' } }, [{ provider: 'a', model: 'claude-sonnet-4-6' }]);
    expect((await sdkError(g.client.chat.completions.create({ ...ask, model: 'claude' }))).status).toBe(429);
    const line = await requestLine(g.s);
    expect(line.attempts[0]).toMatchObject({ status: 403 });
  });
});

describe('x-should-retry: false', () => {
  it('beside a wait of any length the gateway waits out (2 s), the wait is kept', async () => {
    const wait2s = () => json(503, { error: { message: 'circuit open', type: 'server_error', param: null, code: 'circuit_open' } }, { 'retry-after': '2', 'x-should-retry': 'false' });
    const g = await gw({ a: failsThen(1, wait2s, 'served') }, [{ provider: 'a' }], { route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } } });
    const { data } = await g.client.chat.completions.create(ask).withResponse();
    expect(data.choices[0]?.message.content).toBe('served');
    expect(g.seen.a![1]!.at - g.seen.a![0]!.at).toBeGreaterThanOrEqual(1_900);
  });

  it("a parked request's probe the breaker does not judge (a 429 with no wait) is an answer: false ends its retries", async () => {
    // 1: a 503 opens the breaker; 2: the probe the parked request carries gets a 429, no wait, x-should-retry: false.
    const answers = [
      () => json(503, { error: { message: 'overloaded', type: 'server_error', param: null, code: null } }),
      () => json(429, { error: { message: 'Too many requests', type: 'requests', param: null, code: 'rate_limit_exceeded' } }, { 'x-should-retry': 'false' }),
    ];
    const g = await gw({ a: (body, n) => (n <= answers.length ? answers[n - 1]!() : completion('served', 'gpt-4o')) }, [{ provider: 'a' }], {
      route: { park: {}, retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } },
      provider: { breaker: { consecutiveFailures: 1, openS: 1, halfOpenProbes: 1, closeAfter: 1, probeWhileParkedMs: 200, probeWhileParkedMaxMs: 400 } },
    });
    const err = await sdkError(g.client.chat.completions.create(ask));
    expect(err.status).toBe(429);
    expect(g.seen.a).toHaveLength(2);
    expect((await requestLine(g.s)).retriesStopped).toBe('upstream_no_retry');
  });
});

describe('a credentials refusal under <provider>/other that is not model_not_found', () => {
  it("still holds the shared key: the gateway's key refused (401) is every unlisted model's", async () => {
    const refused = (): Script => json(401, { error: { message: 'Incorrect API key provided.', type: 'invalid_request_error', param: null, code: 'invalid_api_key' } });
    const g = await gw({ openai: refused }, [{ provider: 'openai' }], { provider: { breaker: {} } });
    // Names unfit for a label are under openai/other at once.
    expect((await sdkError(g.client.chat.completions.create({ ...ask, model: 'one model' }))).status).toBe(502);
    expect((await sdkError(g.client.chat.completions.create({ ...ask, model: 'another model' }))).status).toBe(502);
    expect(g.seen.openai).toHaveLength(1);
  });
});

describe('the key unlisted models share (<provider>/other)', () => {
  it('keeps its series (and guards) from one request to the next: never taken for a learned key given back', async () => {
    const g = await gw({ openai: () => completion('fine', 'x') }, [{ provider: 'openai' }]);
    // Names unfit for a label are under openai/other at once.
    for (const model of ['one model', 'another model']) await g.client.chat.completions.create({ ...ask, model });
    const text = await (await fetch(`${g.s.url}/metrics`)).text();
    const attempts = [...text.matchAll(/^stormgate_upstream_attempts_total\{[^}]*target="openai\/other"[^}]*\} (\d+)$/gm)].reduce((n, m) => n + Number(m[1]), 0);
    expect(attempts).toBe(2);
  });
});
