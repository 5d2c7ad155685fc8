import { describe, expect, it } from 'vitest';
import { MAX_WAIT_HINT_MS, parseDurationMs, parseRetryAfterMs, parseWaitHint, tokenRoomHint } from '../src/policy/wait-hint.ts';

const now = Date.UTC(2015, 9, 21, 7, 28, 0); // Wed, 21 Oct 2015 07:28:00 GMT
const iso = (offsetMs: number) => new Date(now + offsetMs).toISOString();

describe('parseDurationMs (Go durations)', () => {
  it.each([
    ['20ms', 20], ['17ms', 17], ['1s', 1000], ['0.5s', 500], ['.5s', 500], ['6m0s', 360_000], ['1m30.5s', 90_500],
    ['2h', 7_200_000], ['1h2m3.5s', 3_723_500], ['0', 0], ['0s', 0], ['+1s', 1000], ['500us', 0.5], ['500µs', 0.5],
    ['500μs', 0.5], ['1000000ns', 1], ['1.5ms', 1.5],
  ])('reads %s as %d ms', (text, ms) => {
    expect(parseDurationMs(text)).toBeCloseTo(ms, 9);
  });

  it.each(['', ' ', '-1s', '1', '1x', 's', '1 s', '1s2', 'Infinity', 'NaN', '1d', '1e3s', '1..5s', `${'9'.repeat(400)}h`])(
    'rejects %j', text => {
      expect(parseDurationMs(text)).toBeUndefined();
    });
});

describe('parseRetryAfterMs', () => {
  it.each([['0', 0], ['1', 1000], ['120', 120_000], ['1.5', 1500], [' 2 ', 2000]])('reads delta-seconds %j', (value, ms) => {
    expect(parseRetryAfterMs(value, now)).toBe(ms);
  });

  it('reads an HTTP-date in the future as the time until it', () => {
    expect(parseRetryAfterMs('Wed, 21 Oct 2015 07:28:30 GMT', now)).toBe(30_000);
  });

  it('reads an HTTP-date in the past as 0', () => {
    expect(parseRetryAfterMs('Wed, 21 Oct 2015 07:27:00 GMT', now)).toBe(0);
  });

  // RFC 9110 5.6.7: a recipient must accept the two obsolete formats too (test/third-party-suite-37.test.ts).
  it.each([
    ['Wednesday, 21-Oct-15 07:28:30 GMT', 30_000], ['Wed Oct 21 07:28:30 2015', 30_000], ['Wed Oct 21 07:29:00 2015', 60_000],
    ['Sun Nov  6 08:49:37 1994', 0], ['Sunday, 06-Nov-94 08:49:37 GMT', 0],
  ])('reads the obsolete HTTP-date %j', (value, ms) => {
    expect(parseRetryAfterMs(value, now)).toBe(ms);
  });

  it('reads an RFC 850 year more than 50 years ahead as the latest past one with those digits', () => {
    const in2060 = Date.UTC(2060, 0, 1);
    expect(parseRetryAfterMs('Friday, 01-Jan-60 00:00:30 GMT', in2060)).toBe(30_000);
    expect(parseRetryAfterMs('Thursday, 01-Jan-99 00:00:00 GMT', in2060)).toBe(Date.UTC(2099, 0, 1) - in2060); // 39 years ahead: 2099
    expect(parseRetryAfterMs('Sunday, 01-Jan-11 00:00:00 GMT', in2060)).toBe(0); // 2111 is 51 years ahead: 2011
    expect(parseRetryAfterMs('Friday, 01-Jan-66 00:00:00 GMT', now)).toBe(0); // 1966 from 2015, not 2066
    expect(parseRetryAfterMs('Thursday, 01-Jan-65 00:00:00 GMT', now)).toBe(Date.UTC(2065, 0, 1) - now); // 50 years ahead: kept
  });

  it.each(['-1', '1e3', '0x10', 'Infinity', 'NaN', '', 'soon', '1.', '21 Oct 2015 07:28:30 GMT',
    'Wed, 21 Oct 2015 07:28:30 PST', 'Wed, 30 Feb 2015 07:28:30 GMT', 'Wed, 21 Oct 2015 25:28:30 GMT', '2015-10-21T07:28:30Z',
    'Wed, 21-Oct-15 07:28:30 GMT', 'Wednesday, 21-Oct-2015 07:28:30 GMT', 'Wednesday, 21-Oct-15 07:28:30', 'Wed Oct 21 07:28:30 2015 GMT',
    'Wed Oct 21 7:28:30 2015', 'Wed Oct 32 07:28:30 2015'])(
    'rejects %j', value => {
      expect(parseRetryAfterMs(value, now)).toBeUndefined();
    });
});

describe('parseWaitHint', () => {
  it('reads retry-after-ms, fractional values rounded up, as a fleet-wide hint', () => {
    expect(parseWaitHint({ 'retry-after-ms': '150' }, now)).toEqual({ delayMs: 150, source: 'retry-after-ms', fleetWide: true });
    expect(parseWaitHint({ 'retry-after-ms': '1500.5' }, now)?.delayMs).toBe(1501);
  });

  it('reads retry-after as seconds, fractional seconds or an HTTP-date, as a fleet-wide hint', () => {
    expect(parseWaitHint({ 'retry-after': '2' }, now)).toEqual({ delayMs: 2000, source: 'retry-after', fleetWide: true });
    expect(parseWaitHint({ 'retry-after': '1.5' }, now)?.delayMs).toBe(1500);
    expect(parseWaitHint({ 'retry-after': 'Wed, 21 Oct 2015 07:28:05 GMT' }, now)?.delayMs).toBe(5000);
    // A date already past says "now": no hint (the backoff decides; test/provider-quirks.test.ts).
    expect(parseWaitHint({ 'retry-after': 'Tue, 20 Oct 2015 07:28:05 GMT' }, now)).toBeUndefined();
  });

  it('prefers retry-after-ms over retry-after over anthropic resets over x-ratelimit resets', () => {
    const all = {
      'retry-after-ms': '100', 'retry-after': '2',
      'anthropic-ratelimit-requests-reset': iso(3000), 'x-ratelimit-reset-requests': '4s',
    };
    expect(parseWaitHint(all, now)?.source).toBe('retry-after-ms');
    const { 'retry-after-ms': _ms, ...noMs } = all;
    expect(parseWaitHint(noMs, now)?.source).toBe('retry-after');
    const { 'retry-after': _s, ...noRetryAfter } = noMs;
    expect(parseWaitHint(noRetryAfter, now)).toEqual({ delayMs: 3000, source: 'anthropic-ratelimit-reset', fleetWide: false });
    const { 'anthropic-ratelimit-requests-reset': _a, ...openaiOnly } = noRetryAfter;
    expect(parseWaitHint(openaiOnly, now)).toEqual({ delayMs: 4000, source: 'x-ratelimit-reset', fleetWide: false });
  });

  it('falls through to the next source when a value is malformed', () => {
    expect(parseWaitHint({ 'retry-after-ms': 'soon', 'retry-after': '3' }, now)?.source).toBe('retry-after');
    expect(parseWaitHint({ 'retry-after': '-5', 'x-ratelimit-reset-tokens': '1s' }, now)?.source).toBe('x-ratelimit-reset');
  });

  it.each([
    ['retry-after-ms', '-1'], ['retry-after-ms', 'NaN'], ['retry-after-ms', 'Infinity'], ['retry-after-ms', ''],
    ['retry-after-ms', '1e3'], ['retry-after', 'garbage'], ['retry-after', '-1'], ['retry-after', 'Infinity'],
    ['retry-after', ''], ['anthropic-ratelimit-requests-reset', 'tomorrow'], ['anthropic-ratelimit-requests-reset', '2015-13-01T00:00:00Z'],
    ['x-ratelimit-reset-requests', '-1s'], ['x-ratelimit-reset-requests', '5'], ['x-ratelimit-reset-requests', '1y'],
  ])('ignores %s: %j without throwing', (name, value) => {
    expect(() => parseWaitHint({ [name]: value }, now)).not.toThrow();
    expect(parseWaitHint({ [name]: value }, now)).toBeUndefined();
  });

  it('returns undefined when no hint header is present', () => {
    expect(parseWaitHint({}, now)).toBeUndefined();
    expect(parseWaitHint({ 'content-type': 'application/json', 'retry-after': undefined }, now)).toBeUndefined();
  });

  it('uses the first element of an array value', () => {
    expect(parseWaitHint({ 'retry-after': ['3', '9'] }, now)?.delayMs).toBe(3000);
    expect(parseWaitHint({ 'retry-after-ms': [], 'retry-after': '1' }, now)?.source).toBe('retry-after');
  });

  it('clamps a huge but valid hint to 24 h so the caller can still refuse to wait', () => {
    expect(parseWaitHint({ 'retry-after': '999999999' }, now)?.delayMs).toBe(MAX_WAIT_HINT_MS);
    expect(parseWaitHint({ 'x-ratelimit-reset-requests': '9999h' }, now)?.delayMs).toBe(MAX_WAIT_HINT_MS);
  });

  describe("the upstream's clock (its Date header) against the gateway's", () => {
    const httpDate = (ms: number) => new Date(ms).toUTCString();
    const hour = 3_600_000;

    it('reads a retry-after HTTP-date against the answer\'s Date when the clocks disagree by more than 2 s', () => {
      // An upstream an hour ahead asking for 2 s: not an hour's hold-off; an hour behind: not a date already past.
      for (const skew of [hour, -hour, 3_000, -3_000]) {
        const headers = { date: httpDate(now + skew), 'retry-after': httpDate(now + skew + 2_000) };
        expect(parseWaitHint(headers, now), `skew ${skew}`).toEqual({ delayMs: 2000, source: 'retry-after', fleetWide: true });
      }
    });

    it("keeps the gateway's clock when the Date is within 2 s of it (its whole second and the answer's travel)", () => {
      // Date a second and a half behind (as a whole second): the 2 s asked for are measured from the gateway's now.
      const headers = { date: httpDate(now - 1_000), 'retry-after': httpDate(now + 2_000) };
      expect(parseWaitHint(headers, now + 500)?.delayMs).toBe(1500);
    });

    it('ignores a Date more than a day from the gateway\'s clock (1970, a frozen proxy): no clock to read by', () => {
      expect(parseWaitHint({ date: httpDate(0), 'retry-after': httpDate(2_000) }, now)).toBeUndefined();
      expect(parseWaitHint({ date: httpDate(now + 2 * 24 * hour), 'retry-after': httpDate(now + 2_000) }, now)?.delayMs).toBe(2000);
      expect(parseWaitHint({ date: httpDate(now - 23 * hour), 'retry-after': httpDate(now - 23 * hour + 2_000) }, now)?.delayMs).toBe(2000);
    });

    it("ignores a malformed Date, and adds a cache's age to the Date it kept", () => {
      expect(parseWaitHint({ date: 'yesterday', 'retry-after': httpDate(now + 2_000) }, now)?.delayMs).toBe(2000);
      expect(parseWaitHint({ date: httpDate(now - hour), 'retry-after': httpDate(now + 2_000) }, now)?.delayMs).toBe(hour + 2000);
      // Made 30 s ago by a clock in step with the gateway's, kept by a cache: 2 s from now, not 32.
      const cached = { date: httpDate(now - 30_000), age: '30', 'retry-after': httpDate(now + 2_000) };
      expect(parseWaitHint(cached, now)?.delayMs).toBe(2000);
      expect(parseWaitHint({ ...cached, age: 'x' }, now)?.delayMs).toBe(32_000);
    });

    it("reads Anthropic's resets against it too, for the wait hint and for the token room", () => {
      const skew = -90_000; // the gateway's clock 90 s ahead of Anthropic's
      const reset = new Date(now + skew + 7_000).toISOString();
      const headers = { date: httpDate(now + skew), 'anthropic-ratelimit-tokens-reset': reset };
      expect(parseWaitHint(headers, now)).toEqual({ delayMs: 7000, source: 'anthropic-ratelimit-reset', fleetWide: false });
      const room = { ...headers, 'anthropic-ratelimit-tokens-remaining': '10', 'anthropic-ratelimit-requests-remaining': '5' };
      expect(tokenRoomHint(room, now)?.delayMs).toBe(7000);
      // Durations (retry-after seconds, x-ratelimit-reset-*) need no clock.
      expect(parseWaitHint({ date: httpDate(now + hour), 'retry-after': '3' }, now)?.delayMs).toBe(3000);
    });
  });

  describe('anthropic-ratelimit-*-reset', () => {
    it('reads RFC 3339 with an offset and fractional seconds, rounded up to whole ms', () => {
      const at = '2015-10-21T09:28:02.5005+02:00'; // 07:28:02.5005Z
      expect(parseWaitHint({ 'anthropic-ratelimit-tokens-reset': at }, now)?.delayMs).toBe(2501);
      expect(parseWaitHint({ 'anthropic-ratelimit-tokens-reset': '2015-10-21T02:58:01-04:30' }, now)?.delayMs).toBe(1000);
    });

    it('uses the latest future reset when no remaining headers are sent', () => {
      const headers = {
        'anthropic-ratelimit-requests-reset': iso(1000), 'anthropic-ratelimit-tokens-reset': iso(7000),
        'anthropic-ratelimit-input-tokens-reset': iso(-5000), 'anthropic-ratelimit-output-tokens-reset': iso(4000),
      };
      expect(parseWaitHint(headers, now)?.delayMs).toBe(7000);
    });

    it('uses only the resets of exhausted limits when remaining headers are sent', () => {
      const headers = {
        'anthropic-ratelimit-requests-reset': iso(1000), 'anthropic-ratelimit-requests-remaining': '0',
        'anthropic-ratelimit-tokens-reset': iso(60_000), 'anthropic-ratelimit-tokens-remaining': '12000',
        'anthropic-ratelimit-output-tokens-reset': iso(2000), 'anthropic-ratelimit-output-tokens-remaining': '0',
      };
      expect(parseWaitHint(headers, now)?.delayMs).toBe(2000);
    });

    it('gives no hint when remaining headers show no limit exhausted', () => {
      const headers = { 'anthropic-ratelimit-requests-reset': iso(1000), 'anthropic-ratelimit-requests-remaining': '3' };
      expect(parseWaitHint(headers, now)).toBeUndefined();
    });

    it('gives no hint when every reset is in the past', () => {
      expect(parseWaitHint({ 'anthropic-ratelimit-requests-reset': iso(-1000) }, now)).toBeUndefined();
    });
  });

  describe('a bare x-ratelimit-reset (OpenRouter, Together and other OpenAI-compatible services)', () => {
    it('reads Unix milliseconds and seconds as instants, smaller numbers as seconds from now', () => {
      expect(parseWaitHint({ 'x-ratelimit-reset': String(now + 4_000), 'x-ratelimit-remaining': '0' }, now))
        .toEqual({ delayMs: 4000, source: 'x-ratelimit-reset', fleetWide: false });
      expect(parseWaitHint({ 'x-ratelimit-reset': String(now / 1000 + 7) }, now)?.delayMs).toBe(7000);
      expect(parseWaitHint({ 'x-ratelimit-reset': '12' }, now)?.delayMs).toBe(12_000);
      expect(parseWaitHint({ 'x-ratelimit-reset': '1.5' }, now)?.delayMs).toBe(1500);
    });

    it('skips a past instant, a malformed value and a limit with room left; yields to the other hints', () => {
      expect(parseWaitHint({ 'x-ratelimit-reset': String(now - 1_000) }, now)).toBeUndefined();
      expect(parseWaitHint({ 'x-ratelimit-reset': '-3' }, now)).toBeUndefined();
      expect(parseWaitHint({ 'x-ratelimit-reset': 'soon' }, now)).toBeUndefined();
      // Microseconds: no hint, not decades.
      expect(parseWaitHint({ 'x-ratelimit-reset': String((now + 4_000) * 1000) }, now)).toBeUndefined();
      expect(parseWaitHint({ 'x-ratelimit-reset': String(now + 4_000), 'x-ratelimit-remaining': '3' }, now)).toBeUndefined();
      expect(parseWaitHint({ 'x-ratelimit-reset': String(now + 4_000), 'retry-after': '2' }, now)?.delayMs).toBe(2000);
      expect(parseWaitHint({ 'x-ratelimit-reset': String(now + 4_000), 'x-ratelimit-reset-requests': '1s' }, now)?.delayMs).toBe(1000);
    });

    it("reads an instant against the answer's Date when the clocks disagree", () => {
      const headers = { date: new Date(now - 600_000).toUTCString(), 'x-ratelimit-reset': String(now - 600_000 + 3_000) };
      expect(parseWaitHint(headers, now)?.delayMs).toBe(3000);
    });
  });

  describe('x-ratelimit-reset-*', () => {
    it('uses the larger reset when no remaining headers are sent', () => {
      const headers = { 'x-ratelimit-reset-requests': '1s', 'x-ratelimit-reset-tokens': '6m0s' };
      expect(parseWaitHint(headers, now)).toEqual({ delayMs: 360_000, source: 'x-ratelimit-reset', fleetWide: false });
    });

    it('uses only the exhausted limit when remaining headers are sent', () => {
      const headers = {
        'x-ratelimit-reset-requests': '17ms', 'x-ratelimit-remaining-requests': '0',
        'x-ratelimit-reset-tokens': '6m0s', 'x-ratelimit-remaining-tokens': '149984',
      };
      expect(parseWaitHint(headers, now)?.delayMs).toBe(17);
    });

    it('on a 429 with room left in every limit, waits for the token limits to be full again (a request larger than what is left)', () => {
      const headers = {
        'x-ratelimit-reset-requests': '40s', 'x-ratelimit-remaining-requests': '12',
        'x-ratelimit-reset-tokens': '3s', 'x-ratelimit-remaining-tokens': '1200',
      };
      expect(tokenRoomHint(headers, now)).toEqual({ delayMs: 3000, source: 'x-ratelimit-reset', fleetWide: false });
      // Another status with the same headers (OpenAI sends them on every answer): they say nothing about it.
      expect(parseWaitHint(headers, now)).toBeUndefined();
      // An exhausted limit is still the one that counts.
      expect(parseWaitHint({ ...headers, 'x-ratelimit-remaining-requests': '0' }, now)?.delayMs).toBe(40_000);
      expect(tokenRoomHint({ ...headers, 'x-ratelimit-remaining-requests': '0' }, now)).toBeUndefined();
    });

    it('on an Anthropic 429 with room left, takes the latest of the token limits, never the requests limit', () => {
      const headers = {
        'anthropic-ratelimit-requests-reset': iso(50_000), 'anthropic-ratelimit-requests-remaining': '40',
        'anthropic-ratelimit-input-tokens-reset': iso(2_000), 'anthropic-ratelimit-input-tokens-remaining': '900',
        'anthropic-ratelimit-output-tokens-reset': iso(1_000), 'anthropic-ratelimit-output-tokens-remaining': '8000',
      };
      expect(tokenRoomHint(headers, now)?.delayMs).toBe(2000);
      expect(parseWaitHint(headers, now)).toBeUndefined();
    });

    it('rounds a sub-millisecond reset up to 1 ms', () => {
      expect(parseWaitHint({ 'x-ratelimit-reset-tokens': '500us' }, now)?.delayMs).toBe(1);
    });
  });

  describe('the IETF RateLimit field', () => {
    it("reads an item's t as seconds, and an instant sent as t as an instant, never as decades", () => {
      expect(parseWaitHint({ ratelimit: '"default";r=0;t=30' }, now)?.delayMs).toBe(30_000);
      expect(parseWaitHint({ ratelimit: `"default";r=0;t=${now / 1000 + 12}` }, now)?.delayMs).toBe(12_000);
      expect(parseWaitHint({ ratelimit: `"default";r=0;t=${now / 1000 - 12}` }, now)).toBeUndefined();
    });
  });
});
