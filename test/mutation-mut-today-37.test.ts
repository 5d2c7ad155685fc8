// Mutation round 37: tests that kill mutations the existing suite let live, in code that landed on 2026-12-05: the
// 429s of a round trip counted as in flight (policy/adaptive-limit.ts refusedLately, pools/provider-pool.ts
// refusedFromMs / refusedInRoundTrip), the live stream's bound on the wait after the last finish (#putIdleOff,
// #rearmIdle), the escaped forms of a provider key (providers/key-echo.ts formsOf), a key pointed to the level below
// (config/schema-walk.ts placesBelow, unknown-key.ts) and the apiKey refinements ($VAR, "Bearer "), and an Anthropic
// error sent as data alone (stream-events.ts) or in a 200 (attempt.ts familyErrorIn200). 87 hand mutations: 52 killed
// by existing files, 12 equivalent, 21 killed now, 2 open (familyErrorIn200's result status and errorCode); the live stream's survivors
// are equivalent (a refresh for a re-arm of the same period, a 0 ms timer for a negative one), so none of these is its. Found on
// the way: a key quoted by Gson (\u003d for "=", a base64 key's padding) reached the client; key-echo.ts has that form now.
// Pool code runs on a clock the test moves; the Anthropic errors in a 200 over real HTTP against scripted upstreams.
import Anthropic from '@anthropic-ai/sdk';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import { initialLimit, onRateLimited, type LimitSettings } from '../src/policy/adaptive-limit.ts';
import { withoutKey, withoutKeyCut } from '../src/providers/key-echo.ts';
import { eventMeaning } from '../src/streaming/stream-events.ts';
import { clientPool, clientReq, slot } from './helpers/client-pool.ts';
import { configErrorOf, validConfigText } from './helpers/config-text.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';
import { json } from './helpers/scripted-provider.ts';

/** A pool of 10 slots on a clock the test moves (its round trip: the pool's initial second). */
function refusingPool() {
  const clock = { now: 0 };
  const p = clientPool({ capacity: 10, now: () => clock.now });
  /** One attempt answered 429 at `atMs` and its slot given back, as a refused attempt does at once. */
  const refused = async (atMs: number) => {
    clock.now = atMs;
    const s = await slot(p, clientReq(undefined));
    p.observe('p/m', 'rate-limited', 0);
    s.release();
  };
  return { p, clock, refused };
}

describe('the 429s earlier in the round trip count as in flight (provider-pool refusedInRoundTrip)', () => {
  it('holds the limit for 8 refusals one at a time, and cuts it at the 9th (1 in flight + 8 refused = 9 of 10, within a tenth)', async () => {
    const { p, refused } = refusingPool();
    for (let i = 0; i < 8; i++) await refused(i);
    expect(p.limitOf('p/m')).toBe(10);
    await refused(8);
    expect(p.limitOf('p/m')).toBeLessThan(10);
  });

  it('counts the refusals of the round trip that began at the first of them, up to one round trip after it, not after', async () => {
    const within = refusingPool();
    for (let i = 0; i < 8; i++) await within.refused(600);
    await within.refused(1_599);
    expect(within.p.limitOf('p/m')).toBeLessThan(10);

    const after = refusingPool();
    for (let i = 0; i < 8; i++) await after.refused(600);
    await after.refused(1_600);
    expect(after.p.limitOf('p/m')).toBe(10);
  });

  it('keeps the count across answers that came meanwhile: a provider that takes 2 answers some of a flood', async () => {
    const { p, clock, refused } = refusingPool();
    for (let i = 0; i < 8; i++) await refused(10);
    clock.now = 20;
    const s = await slot(p, clientReq(undefined));
    p.observe('p/m', 'success', 0);
    s.release();
    await refused(30);
    expect(p.limitOf('p/m')).toBeLessThan(10);
  });
});

describe('the adaptive limit: refusedLately', () => {
  const settings: LimitSettings = { max: 100, min: 1, decrease: 0.9, minShares: [0.5, 0.1] };

  it("counts toward the limit, never toward a class's cap: the refused were of any class", () => {
    // Batch capped at 10, none of it in flight: 9 refusals earlier in the round trip do not make the batch cap binding.
    const st = { ...initialLimit(settings), caps: [100, 10] };
    expect(onRateLimited(st, settings, 1_000, 200, { total: 1, byClass: [1, 0], refusedLately: 9 })).toBe(st);
  });
});

describe('a provider key in its escaped forms (key-echo formsOf)', () => {
  const redacted = (text: string) => `{"m":"${text}"}`;

  it('is taken out whole, never inside a longer form: a key that starts with "/" leaves no "\\" of "\\/" behind', () => {
    const key = '/abcdefgh-0123';
    expect(withoutKey(redacted(`bad key ${key.replaceAll('/', '\\/')}`), key)).toBe(redacted('bad key [redacted]'));
  });

  it('is taken out as an encoder that escapes both "/" and "<" writes it', () => {
    const key = 'sk<abc/def-0123';
    expect(withoutKey(redacted('key sk\\u003cabc\\/def-0123'), key)).toBe(redacted('key [redacted]'));
  });

  it('is taken out as an encoder that escapes neither "/" nor "<" writes it (Python\'s, Node\'s) when it holds a quote, a slash and a "<"', () => {
    const key = 'sk-a"b/c<d-0123';
    expect(withoutKey(JSON.stringify({ m: `key ${key}` }), key)).toBe(redacted('key [redacted]'));
  });

  it('is taken out as PHP writes it ("/" escaped, "<" not) and as Go writes it ("<" escaped, "/" not)', () => {
    const key = 'sk<a/b=0123';
    expect(withoutKey(redacted('key sk<a\\/b=0123'), key)).toBe(redacted('key [redacted]'));
    expect(withoutKey(redacted('key sk\\u003ca/b=0123'), key)).toBe(redacted('key [redacted]'));
  });

  it('cut, loses the longest start of any form at its end, not a shorter start of another form found after it', () => {
    // The text ends with 10 characters of the PHP form, and with 4 of the key as it is ("abcd"): the 10 go.
    expect(withoutKeyCut('{"m":"abcd\\/abcd', 'abcd/abcd-0123')).toBe('{"m":"[redacted]');
    // And of one form, its longest start: "abcdabcd", not "abcd".
    expect(withoutKeyCut('{"m":"abcdabcd', 'abcdabcd-xyz0')).toBe('{"m":"[redacted]');
  });

  it('leaves a text without it the same object, for a key of several forms too', () => {
    const body = Buffer.from('{"error":{"message":"nothing of the key"}}');
    expect(withoutKey(body, 'sk<a/b-0123')).toBe(body);
  });

  it("is taken out as Gson (Java's default encoder) writes it: a base64 key's \"=\" as \\u003d", () => {
    const key = 'ABSKcmV2aWV3Y2ZnLWtleQ+0123=';
    const gson = JSON.stringify({ m: `invalid key ${key}` }).replace(/[<>&=']/g, (c) => `\\u00${c.charCodeAt(0).toString(16)}`);
    expect(withoutKey(gson, key)).toBe('{"m":"invalid key [redacted]"}');
    expect(withoutKeyCut(gson.slice(0, gson.indexOf('+') + 3), key)).toBe('{"m":"invalid key [redacted]');
  });
});

describe('a config key written a level too high (placesBelow)', () => {
  const env = { OPENAI_API_KEY: 'sk-live-SECRET-0123' };

  it('is pointed to where it goes two levels down: a top-level maxAttempts is a route\'s retry.maxAttempts', () => {
    expect(configErrorOf(validConfigText('maxAttempts: 3'), env).message).toBe('gw.yaml:10: unknown key "maxAttempts"; did you mean routes[].retry.maxAttempts?');
  });

  it('is not looked for further than two levels down (routes[].retry.backoff.baseMs is three)', () => {
    expect(configErrorOf(validConfigText('baseMs: 100'), env).message).toMatch(/^gw\.yaml:10: unknown key "baseMs"; valid keys: /);
  });
});

describe("a provider's apiKey with a $ or a bearer in it", () => {
  const env = { OPENAI_API_KEY: 'sk-live-SECRET-0123' };
  const keyOf = (key: string) => parseConfig(validConfigText().replace('apiKey: ${OPENAI_API_KEY}', () => `apiKey: ${JSON.stringify(key)}`), 'gw.yaml', env).providers.openai!.apiKey;

  it('is taken as it is unless it is a whole $NAME: a key may hold a $, or start with "bearer" without the space', () => {
    for (const key of ['pa55$word_x0', '$abc-def-0123', '$1abcdefgh', 'bearer_abcdef0123', 'sk-bearer x']) expect(keyOf(key)).toBe(key);
  });
});

describe('an Anthropic event of data alone (stream-events messagesMeaning)', () => {
  const data = (o: unknown, event: string | null = null) => ({ raw: `data: ${JSON.stringify(o)}`, data: JSON.stringify(o), event });

  it('is a keepalive without a type when it carries no error', () => {
    expect(eventMeaning('messages', data({}))).toBe('keepalive');
    expect(eventMeaning('messages', data({ error: null, usage: { output_tokens: 3 } }))).toBe('keepalive');
  });

  it('is an error without a type under an event name the gateway does not know, as under none', () => {
    expect(eventMeaning('messages', data({ error: { type: 'overloaded_error', message: 'Overloaded' } }, 'proxy_error'))).toBe('error');
  });

  it('is an error with a type that is no string (null), as without one', () => {
    expect(eventMeaning('messages', data({ type: null, error: { type: 'overloaded_error', message: 'Overloaded' } }))).toBe('error');
  });
});

describe('an Anthropic error object in a 200 body that quotes the provider key (attempt familyErrorIn200)', () => {
  const start = useScriptedUpstreams();
  // useScriptedUpstreams gives provider `a` the key a-key-0123456789.
  const quoting = { type: 'error', error: { type: 'overloaded_error', message: 'Overloaded (key a-key-0123456789)' } };

  it('reaches an Anthropic client without the key', async () => {
    const { s } = await start({ a: { answer: () => json(200, quoting), family: 'anthropic' } }, [{ provider: 'a' }], { path: '/v1/messages' });
    const client = new Anthropic({ baseURL: s.url, apiKey: 'client-key', maxRetries: 0, logLevel: 'off' });
    const err = await client.messages.create({ model: 'claude-sonnet-4-6', max_tokens: 16, messages: [{ role: 'user', content: 'hi' }] }).then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(Anthropic.OverloadedError);
    expect(JSON.stringify((err as InstanceType<typeof Anthropic.APIError>).error)).toContain('Overloaded (key [redacted])');
  });

  it('reaches a chat client (translated) without the key', async () => {
    const { client } = await start({ a: { answer: () => json(200, quoting), family: 'anthropic' } }, [{ provider: 'a', model: 'claude-sonnet-4-6' }]);
    const err = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }).then(() => undefined, (e: unknown) => e);
    expect((err as { status?: number }).status).toBe(529);
    expect((err as { message?: string }).message).toContain('Overloaded (key [redacted])');
  });
});
