// Review of 2026-12-07's changes: the wait hints of src/policy/wait-hint.ts (the windowed
// x-ratelimit-reset-*-{minute,hour,day}, the IETF RateLimit fields) and APIM's quota 403 (src/providers/error-outcome.ts).
// Found:
//  1. A windowed reset sent as a Unix instant (SambaNova's `x-ratelimit-reset-requests-day: 1766229945`, the same
//     header name Cerebras fills with seconds) was read as 1.7 billion seconds: clamped to a 24 h hint, the 429 was
//     not retried and the client was told `retry-after: 86400` for a limit that renewed seconds later.
//  2. The draft 07 `RateLimit` field is a Dictionary (`RateLimit: limit=100, remaining=0, reset=30`, what
//     express-rate-limit's `standardHeaders: 'draft-7'` sends); only draft 08's List (`"default";r=0;t=30`) was read,
//     so a 429 that named only the draft 07 field was retried after the backoff into the limit.
//  3. A `RateLimit` List sent as two field lines (one per policy) is one list (RFC 9651 4.2); only the first line was
//     read, and a used-up policy on the second line gave no hint.
//  4. APIM's quota-by-key 403 in front of an Anthropic-family target was translated to Anthropic's terms before it was
//     read: still the gateway's credentials refused (502 upstream_auth_error, a 60 s hold), not the 429 it stands for.
// Bounds are generous: a loaded 2-core machine.
import { describe, expect, it } from 'vitest';
import { parseWaitHint } from '../src/policy/wait-hint.ts';
import { sdkError } from './helpers/openai-error.ts';
import { healthy, json, type Answer } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';

const gw = useScriptedUpstreams();
const messages = [{ role: 'user' as const, content: 'Summarise the incident.' }];
const ONE = [{ provider: 'a' }];
const NOW = Date.UTC(2026, 11, 7, 12, 0, 0);

describe('a windowed reset that is a Unix instant (SambaNova), not seconds from now', () => {
  it('is read as that instant: 1 h away is a 1 h hint, not a day', () => {
    const inAnHour = String(NOW / 1000 + 3600);
    expect(parseWaitHint({ 'x-ratelimit-remaining-requests-day': '0', 'x-ratelimit-reset-requests-day': inAnHour }, NOW)).toEqual({ delayMs: 3_600_000, source: 'x-ratelimit-reset', fleetWide: false });
    // In Unix milliseconds too, as a bare x-ratelimit-reset is told apart by size.
    expect(parseWaitHint({ 'x-ratelimit-remaining-tokens-minute': '0', 'x-ratelimit-reset-tokens-minute': String(NOW + 2_000) }, NOW)?.delayMs).toBe(2_000);
    // Cerebras' seconds stay seconds.
    expect(parseWaitHint({ 'x-ratelimit-remaining-requests-day': '0', 'x-ratelimit-reset-requests-day': '33011.382867097855' }, NOW)?.delayMs).toBe(33_011_383);
    // An instant already past is no hint.
    expect(parseWaitHint({ 'x-ratelimit-remaining-requests-day': '0', 'x-ratelimit-reset-requests-day': String(NOW / 1000 - 5) }, NOW)).toBeUndefined();
  });

  it('end to end: a 429 whose daily limit renews in 2 s (as an instant) is waited out and retried, not passed on with retry-after: 86400', async () => {
    const at: number[] = [];
    const answer: Answer = (body, n) => {
      at.push(Date.now());
      if (n > 1) return healthy('after the renewal')(body, n);
      return json(
        429,
        { error: { message: 'Requests per day limit exceeded', type: 'rate_limit_exceeded', code: 'rate_limit_exceeded' } },
        { 'x-ratelimit-limit-requests-day': '40', 'x-ratelimit-remaining-requests-day': '0', 'x-ratelimit-reset-requests-day': String(Math.floor(Date.now() / 1000) + 2) },
      );
    };
    const g = await gw({ a: answer }, ONE);
    const res = g.client.chat.completions.create({ model: 'Meta-Llama-3.3-70B-Instruct', messages }).withResponse();
    const outcome = await res.then(
      (r) => ({ ok: true as const, r }),
      (e: unknown) => ({ ok: false as const, e }),
    );
    if (!outcome.ok) {
      const err = await sdkError(Promise.reject(outcome.e));
      throw new Error(`answered ${err.status} retry-after ${err.headers?.get('retry-after')} after ${g.seen.a?.length} upstream request(s)`);
    }
    expect(outcome.r.data.choices[0]?.message.content).toBe('after the renewal');
    expect(at[1]! - at[0]!).toBeGreaterThanOrEqual(500);
    expect(at[1]! - at[0]!).toBeLessThan(6_000);
  });
});

describe("the draft 07 RateLimit field (a Dictionary: limit, remaining, reset)", () => {
  it('a used-up one is a hint of its reset; one with room left, or past, is none', () => {
    expect(parseWaitHint({ ratelimit: 'limit=100, remaining=0, reset=30', 'ratelimit-policy': '100;w=60' }, NOW)).toEqual({ delayMs: 30_000, source: 'ratelimit', fleetWide: false });
    // No `remaining` said: the reset counts, as a RateLimit-Reset without RateLimit-Remaining does.
    expect(parseWaitHint({ ratelimit: 'limit=20, reset=37' }, NOW)?.delayMs).toBe(37_000);
    expect(parseWaitHint({ ratelimit: 'limit=100, remaining=12, reset=30' }, NOW)).toBeUndefined();
    expect(parseWaitHint({ ratelimit: 'limit=100, remaining=0, reset=0' }, NOW)).toBeUndefined();
    expect(parseWaitHint({ ratelimit: 'limit=100, remaining=0, reset=-4' }, NOW)).toBeUndefined();
    // Never a 54-year hold: a reset that is a Unix instant, told apart by size.
    expect(parseWaitHint({ ratelimit: `limit=100, remaining=0, reset=${NOW / 1000 + 2}` }, NOW)?.delayMs).toBe(2_000);
  });

  it('end to end: a 429 from express-rate-limit (draft-7 headers) is waited out, not retried into the limit after the 5 ms backoff', async () => {
    const at: number[] = [];
    const answer: Answer = (body, n) => {
      at.push(Date.now());
      if (n > 1) return healthy('after the window')(body, n);
      return json(429, { message: 'Too many requests, please try again later.' }, { ratelimit: 'limit=5, remaining=0, reset=1', 'ratelimit-policy': '5;w=60' });
    };
    const g = await gw({ a: answer }, ONE);
    const { data } = await g.client.chat.completions.create({ model: 'local', messages }).withResponse();
    expect(data.choices[0]?.message.content).toBe('after the window');
    expect(at[1]! - at[0]!).toBeGreaterThanOrEqual(950);
    expect(at[1]! - at[0]!).toBeLessThan(4_000);
  });
});

describe('a RateLimit List sent as several field lines', () => {
  it('is one list: a used-up policy on the second line is the hint', () => {
    expect(parseWaitHint({ ratelimit: ['"burst";r=5;t=1', '"daily";r=0;t=3600'] }, NOW)).toEqual({ delayMs: 3_600_000, source: 'ratelimit', fleetWide: false });
    expect(parseWaitHint({ ratelimit: ['"burst";r=0;t=2', '"daily";r=900;t=3600'] }, NOW)?.delayMs).toBe(2_000);
  });
});

// Azure API Management in front of an Anthropic-family target (Claude on Azure AI Foundry behind APIM): its quota-by-key
// 403 is APIM's own body, `{"statusCode": 403, "message": "Out of call volume quota. ..."}`, not Anthropic's error. The
// family's translation turned it into "the Anthropic target answered HTTP 403" before it was read, so it stayed the
// gateway's credentials refused: a 502 upstream_auth_error, no retry-after, and the target held 60 s at a time.
describe("APIM's spent quota-by-key in front of an Anthropic-family target", () => {
  const apimQuota = () =>
    json(403, { statusCode: 403, message: 'Out of call volume quota. Quota will be replenished in 00:00:30.' }, { 'retry-after': '30' });

  it('a chat client gets the 429 with retry-after (not 502 upstream_auth_error)', async () => {
    const g = await gw({ a: { answer: apimQuota, family: 'anthropic' } }, [{ provider: 'a', model: 'claude-sonnet-4-6' }]);
    const err = await sdkError(g.client.chat.completions.create({ model: 'claude', messages }));
    expect(err.status).toBe(429);
    expect(Number(err.headers?.get('retry-after'))).toBeGreaterThanOrEqual(30);
    expect(err.message).toContain('Out of call volume quota');
  });

  it("a client of Anthropic's own API gets the 429 too", async () => {
    const g = await gw({ a: { answer: apimQuota, family: 'anthropic' } }, [{ provider: 'a', model: 'claude-sonnet-4-6' }], { path: '/v1/messages' });
    const r = await fetch(`${g.s.baseURL.replace(/\/v1$/, '')}/v1/messages`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01', 'x-api-key': 'sk-client-not-a-provider-key' },
      body: JSON.stringify({ model: 'claude', max_tokens: 16, messages }),
    });
    const body = (await r.json()) as { type?: string; error?: { type?: string; message?: string } };
    expect(r.status).toBe(429);
    expect(Number(r.headers.get('retry-after'))).toBeGreaterThanOrEqual(30);
    // In the shape the Anthropic SDKs read, with APIM's words.
    expect(body.type).toBe('error');
    expect(body.error?.type).toBe('rate_limit_error');
    expect(body.error?.message).toContain('Out of call volume quota');
  });
});
