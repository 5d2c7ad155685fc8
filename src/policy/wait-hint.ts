// Reads how long the upstream asks us to wait, from the headers of a 429/503/529 answer.
// One function with tests, so no caller confuses seconds with milliseconds (see STYLE.md 3, reply-from).
import { parseDictionary, parseList } from 'structured-headers';
import { firstHeader, type HeaderBag } from '../header-bag.ts';
type WaitHintSource = 'retry-after-ms' | 'retry-after' | 'anthropic-ratelimit-reset' | 'x-ratelimit-reset' | 'ratelimit' | 'retry-info';

export interface WaitHint {
  /** Whole ms to wait, rounded up, at most MAX_WAIT_HINT_MS. */
  delayMs: number;
  source: WaitHintSource;
  /** true when the hint may hold off a whole fleet (retry-after, retry-after-ms); x-ratelimit-reset-* are hints for the one request only */
  fleetWide: boolean;
}

/** Response headers with lower-case names, as undici's `request()` returns them. */
export type ResponseHeaders = HeaderBag;

/** Longest hint reported (24 h); longer valid hints are clamped, not dropped, so the caller still sees it must not wait. */
export const MAX_WAIT_HINT_MS = 24 * 60 * 60 * 1000;

type LimitHeaders = readonly (readonly [reset: string, remaining: string])[];
const ANTHROPIC_LIMITS: LimitHeaders = ['requests', 'tokens', 'input-tokens', 'output-tokens']
  .map(l => [`anthropic-ratelimit-${l}-reset`, `anthropic-ratelimit-${l}-remaining`] as const);
const OPENAI_LIMITS: LimitHeaders = ['requests', 'tokens'].map(l => [`x-ratelimit-reset-${l}`, `x-ratelimit-remaining-${l}`] as const);
// The bare pair many OpenAI-compatible services send (OpenRouter, Together, ...), whose reset is an instant.
const BARE_LIMITS: LimitHeaders = [['x-ratelimit-reset', 'x-ratelimit-remaining']];

/**
 * The upstream's wait hint: the first present, valid and non-zero of retry-after-ms, retry-after,
 * anthropic-ratelimit-*-reset, x-ratelimit-reset-*, x-ratelimit-reset, a used-up x-ratelimit-reset-*-{minute,hour,day}
 * (Cerebras), then the IETF draft's fields of a gateway in front (RateLimit, RateLimit-Reset); never throws.
 * A zero (`retry-after: 0`, `retry-after-ms: 0`, a date or reset already past) says "now", which is no hint: taken at
 * its word, every request told it comes back at once, the storm the jittered backoff is there to spread. It is
 * skipped like a malformed value, and the client is never handed a `retry-after: 0` of the gateway's either.
 */
export function parseWaitHint(headers: ResponseHeaders, localNowMs: number): WaitHint | undefined {
  const nowMs = upstreamNowMs(headers, localNowMs);
  const retryAfterMs = header(headers, 'retry-after-ms');
  const fromMs = retryAfterMs === undefined ? undefined : parseNonNegativeDecimal(retryAfterMs);
  if (fromMs !== undefined && fromMs > 0) return hint(fromMs, 'retry-after-ms', true);

  const retryAfter = header(headers, 'retry-after');
  const fromRetryAfter = retryAfter === undefined ? undefined : parseRetryAfterMs(retryAfter, nowMs);
  if (fromRetryAfter !== undefined && fromRetryAfter > 0) return hint(fromRetryAfter, 'retry-after', true);

  return resetHint(headers, nowMs, latestExhaustedResetMs) ?? windowedResetHint(headers, nowMs) ?? ietfResetHint(headers, nowMs);
}

/**
 * The wait the IETF RateLimit fields name (draft-ietf-httpapi-ratelimit-headers), as an API gateway in front of the
 * provider sends them: the `RateLimit` field of draft 08 on (`"default";r=0;t=30`, Cloudflare's API), the latest `t`
 * (seconds) among its used-up items (`r=0`), or draft 07's (`limit=100, remaining=0, reset=30`, express-rate-limit's
 * `draft-7`), its `reset` unless `remaining` says there is room; else the earlier drafts' `RateLimit-Reset` (seconds
 * from now: Kong's rate-limiting plugin, Botpress; an instant in Unix seconds on GitLab, told apart by size as the bare
 * x-ratelimit-reset is) unless `RateLimit-Remaining` says there is room. Unread, a 429 that named only these was
 * retried at the backoff's pace into the limit. This request's hint only, as the other reset headers are.
 */
function ietfResetHint(headers: ResponseHeaders, nowMs: number): WaitHint | undefined {
  // A Structured Field sent on several lines is one field, its lines joined by commas (RFC 9651 4.2): one line a policy.
  const lines = headers['ratelimit'];
  const field = (Array.isArray(lines) ? lines.join(', ') : lines)?.trim();
  if (field) {
    const ms = exhaustedPolicyResetMs(field, nowMs);
    return ms === undefined || ms <= 0 ? undefined : hint(ms, 'ratelimit', false);
  }
  const reset = header(headers, 'ratelimit-reset');
  const remaining = header(headers, 'ratelimit-remaining');
  if (reset === undefined || (remaining !== undefined && !isZero(remaining))) return undefined;
  const ms = bareResetMs(reset, nowMs);
  return ms === undefined || ms <= 0 ? undefined : hint(ms, 'ratelimit', false);
}

/**
 * The latest `t` of a `RateLimit` field's items whose `r` is 0, in ms; else, for draft 07's Dictionary, its reset
 * (draft07ResetMs); undefined when none is used up, or when the field is neither (RFC 9651 has a malformed field
 * ignored whole).
 */
function exhaustedPolicyResetMs(field: string, nowMs: number): number | undefined {
  let items;
  try {
    items = parseList(field);
  } catch {
    return draft07ResetMs(field, nowMs);
  }
  let latest: number | undefined;
  for (const [, params] of items) {
    const r = params.get('r');
    const t = params.get('t');
    if (r !== 0 || typeof t !== 'number') continue;
    // Seconds from now, as the draft has it; an instant sent in its place is read as one, never as decades.
    const ms = bareResetMs(String(t), nowMs);
    if (ms !== undefined && ms > 0 && (latest === undefined || ms > latest)) latest = ms;
  }
  return latest;
}

/**
 * Draft 07's `RateLimit: limit=100, remaining=0, reset=30`: the reset (seconds, or an instant told apart by size as a
 * `RateLimit-Reset` is) when `remaining` is 0 or not said. Unread, such a 429 was retried after the backoff into the
 * limit.
 */
function draft07ResetMs(field: string, nowMs: number): number | undefined {
  let dict;
  try {
    dict = parseDictionary(field);
  } catch {
    return undefined;
  }
  const remaining = dict.get('remaining')?.[0];
  const reset = dict.get('reset')?.[0];
  if (typeof reset !== 'number' || (remaining !== undefined && remaining !== 0)) return undefined;
  return bareResetMs(String(reset), nowMs);
}

// Cerebras names each limit's window in its headers (`x-ratelimit-remaining-tokens-minute`,
// `x-ratelimit-reset-requests-day`: "Time (in seconds) until your daily request limit resets", `11.382867097854614`).
const WINDOWED_LIMITS: LimitHeaders = ['requests', 'tokens'].flatMap((l) =>
  ['minute', 'hour', 'day'].map((w) => [`x-ratelimit-reset-${l}-${w}`, `x-ratelimit-remaining-${l}-${w}`] as const));

/**
 * The latest reset among the windowed limits whose `remaining` is 0: seconds from now (a Go duration accepted too), or
 * an instant in Unix seconds or ms told apart by size, as a bare x-ratelimit-reset is: SambaNova sends the same names
 * with an instant (`x-ratelimit-reset-requests-day: 1766229945`), which read as seconds was a day's hint, no retry,
 * and `retry-after: 86400` for a limit that renewed seconds later.
 * Only a limit said to be used up counts, never a reset beside room left: such a 429 hit a limit the headers do not
 * show (Cerebras sends no requests-per-minute pair), and its day's reset would be a 9-hour misread. Unread, a
 * tokens-per-minute 429 was retried at the backoff's pace into the same limit, and a spent daily limit reached the
 * client with no retry-after.
 */
function windowedResetHint(headers: ResponseHeaders, nowMs: number): WaitHint | undefined {
  const exhausted = WINDOWED_LIMITS.filter(([, remaining]) => isZero(header(headers, remaining)));
  const ms = latestResetMs(headers, exhausted, (v) => bareResetMs(v, nowMs) ?? parseDurationMs(v));
  return ms === undefined ? undefined : hint(ms, 'x-ratelimit-reset', false);
}

/**
 * The wait of a rate limit's 429 that no limit explains, when no other hint came (the caller's to know it is one, not an
 * account's): every limit the provider counts has room left, so it refused a request larger than what a token limit has
 * left (OpenAI's "Limit 30000, Used 25000, Requested 8000"); a request always fits the requests limit's room of one.
 * The token limits' resets (when they are full again, the first time the request surely fits) are its hint: without
 * it the retries went back at the backoff's pace into the same refusal.
 */
export function tokenRoomHint(headers: ResponseHeaders, localNowMs: number): WaitHint | undefined {
  return resetHint(headers, upstreamNowMs(headers, localNowMs), (h, pairs, parse) => {
    const present = pairs.filter(([, remaining]) => header(h, remaining) !== undefined);
    if (present.length === 0 || present.some(([, remaining]) => isZero(header(h, remaining)))) return undefined;
    return latestResetMs(h, pairs.filter(([reset]) => reset.includes('tokens')), parse);
  });
}

/**
 * How far the upstream's `Date` may stray from the gateway's clock before the two are taken to disagree: the header
 * counts whole seconds (up to 1 s behind the moment it names) and the answer takes a moment to arrive.
 */
const CLOCK_SKEW_TOLERANCE_MS = 2_000;

/**
 * "Now" to measure the upstream's dates against (a `retry-after` HTTP-date, Anthropic's RFC 3339 resets): the answer's
 * own `Date` when it is further than CLOCK_SKEW_TOLERANCE_MS from the gateway's clock, else the gateway's clock. Both
 * dates are the upstream's: with either clock off, a provider asking for 2 s read as an hour (a fleet-wide hold-off,
 * clients told not to retry) or as past (no hint, retries at the backoff's pace into the rate limit). Read against the
 * whole second `Date` names, a hint waits up to a second too long, never too short.
 */
function upstreamNowMs(headers: ResponseHeaders, localNowMs: number): number {
  const date = header(headers, 'date');
  const dateMs = date === undefined ? undefined : parseHttpDateMs(date, localNowMs);
  if (dateMs === undefined) return localNowMs;
  // An answer a cache kept names when it was made; `age` (RFC 9111) is how long ago that was.
  const age = header(headers, 'age');
  const upstreamMs = dateMs + (age !== undefined && /^\d+$/.test(age) ? Number(age) * 1000 : 0);
  // Beyond a day apart it is no clock to trust (a `Date` of 1970, a proxy's frozen one): a 2 s hint read against it was
  // a day's fleet-wide hold-off.
  const skewMs = Math.abs(upstreamMs - localNowMs);
  return skewMs > CLOCK_SKEW_TOLERANCE_MS && skewMs <= MAX_CLOCK_SKEW_MS ? upstreamMs : localNowMs;
}

/** The furthest an upstream's `Date` may be from the gateway's clock and still be read as its clock: a day. */
const MAX_CLOCK_SKEW_MS = 24 * 60 * 60 * 1000;

type ResetPick = (headers: ResponseHeaders, pairs: LimitHeaders, parseResetMs: (v: string) => number | undefined) => number | undefined;

/** The reset `pick` chooses among Anthropic's limits, else among OpenAI's, else the bare pair's. */
function resetHint(headers: ResponseHeaders, nowMs: number, pick: ResetPick): WaitHint | undefined {
  const anthropic = pick(headers, ANTHROPIC_LIMITS, v => {
    const atMs = parseRfc3339Ms(v);
    return atMs === undefined ? undefined : atMs - nowMs;
  });
  if (anthropic !== undefined) return hint(anthropic, 'anthropic-ratelimit-reset', false);
  const openai = pick(headers, OPENAI_LIMITS, parseDurationMs) ?? pick(headers, BARE_LIMITS, v => bareResetMs(v, nowMs));
  return openai === undefined ? undefined : hint(openai, 'x-ratelimit-reset', false);
}

/**
 * A bare `x-ratelimit-reset`, in ms from now: an instant in Unix milliseconds (OpenRouter) or seconds, told apart by
 * size (from 10^12 ms, and 10^9 s, both in 2001), else seconds from now. Read as seconds, an OpenRouter reset would be
 * a wait of 55,000 years; not read, the retries went back at the backoff's pace into the limit.
 */
function bareResetMs(value: string, nowMs: number): number | undefined {
  const n = parseNonNegativeDecimal(value);
  if (n === undefined) return undefined;
  // From 10^15 it would be microseconds, which no provider sends: no hint, rather than a wait of decades.
  if (n >= 1e15) return undefined;
  if (n >= 1e12) return n - nowMs;
  if (n >= 1e9) return n * 1000 - nowMs;
  return n * 1000;
}

/**
 * The wait an error body asks for when no header does: Google's RetryInfo detail (`{"@type":
 * "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "29s"}` in `error.details`), which Gemini's
 * OpenAI-compatible endpoint sends with its 429s and no retry-after. Without it the attempts went back into the same
 * quota at the backoff's pace and the client was told no wait at all. Like x-ratelimit-reset-*, it is this request's
 * hint, not a fleet-wide hold-off (the README's hold-offs are retry-after's). `error` is the body's parsed error object.
 */
export function retryInfoHint(error: unknown): WaitHint | undefined {
  const details = (error as { details?: unknown } | null)?.details;
  if (!Array.isArray(details)) return undefined;
  for (const d of details as unknown[]) {
    const detail = d as { '@type'?: unknown; retryDelay?: unknown } | null;
    if (typeof detail?.['@type'] !== 'string' || !detail['@type'].endsWith('google.rpc.RetryInfo') || typeof detail.retryDelay !== 'string') continue;
    // A protobuf Duration in JSON: seconds with up to nine decimals and an `s`.
    const m = /^(\d+(?:\.\d+)?)s$/.exec(detail.retryDelay.trim());
    const ms = m ? Number(m[1]) * 1000 : 0;
    return ms > 0 ? hint(ms, 'retry-info', false) : undefined;
  }
  return undefined;
}

/** Retry-After as delta-seconds (a non-negative decimal like "1.5" is accepted too) or an HTTP-date; a past date is 0. */
export function parseRetryAfterMs(value: string, nowMs: number): number | undefined {
  const seconds = parseNonNegativeDecimal(value);
  if (seconds !== undefined) return seconds * 1000;
  const at = parseHttpDateMs(value.trim(), nowMs);
  return at === undefined ? undefined : Math.max(0, at - nowMs);
}

// Go accepts both micro signs: U+00B5 and U+03BC.
const GO_UNIT_MS: Record<string, number> = { ns: 1e-6, us: 1e-3, 'µs': 1e-3, 'μs': 1e-3, ms: 1, s: 1000, m: 60_000, h: 3_600_000 };
// `\d+(?:\.\d*)?`, not `\d+\.?\d*`: the latter splits a run of digits between its two halves in every way, and a
// provider's 16 KB header of digits took over a second per answer to refuse.
const GO_PART = '(\\d+(?:\\.\\d*)?|\\.\\d+)(ns|us|µs|μs|ms|s|m|h)';
const GO_DURATION = new RegExp(`^(?:${GO_PART})+$`);
const GO_PARTS = new RegExp(GO_PART, 'g');

/** A Go time.Duration string ("20ms", "6m0s", "1h2m3.5s", "0") in ms; undefined for negative or malformed values. */
export function parseDurationMs(s: string): number | undefined {
  let text = s.trim();
  if (text.startsWith('+')) text = text.slice(1);
  if (text === '0') return 0;
  if (!GO_DURATION.test(text)) return undefined;
  let total = 0;
  for (const [, amount, unit] of text.matchAll(GO_PARTS)) total += Number(amount) * (GO_UNIT_MS[unit ?? ''] ?? Number.NaN);
  return Number.isFinite(total) ? total : undefined;
}

function hint(delayMs: number, source: WaitHintSource, fleetWide: boolean): WaitHint {
  return { delayMs: Math.min(MAX_WAIT_HINT_MS, Math.ceil(delayMs)), source, fleetWide };
}

function header(headers: ResponseHeaders, name: string): string | undefined {
  const trimmed = firstHeader(headers, name)?.trim();
  return trimmed === undefined || trimmed === '' ? undefined : trimmed;
}

// Rejects what Number() would let through: "-1", "Infinity", "1e3", "0x10", "". A run of digits past a double's range
// is still a valid wait, and a long one: Infinity, which hint() clamps to MAX_WAIT_HINT_MS as any wait over a day.
// Dropped instead, it left the answer no hint, or a lower header's shorter one, and the gateway came back at once.
function parseNonNegativeDecimal(value: string): number | undefined {
  const text = value.trim();
  return /^\d+(\.\d+)?$/.test(text) ? Number(text) : undefined;
}

/**
 * The latest reset, in ms from now, among the limits that are used up.
 * When the upstream sends any `remaining` header of the family, only limits whose remaining is 0 count: a reset of a limit
 * with room left says nothing about this refusal, and waiting for it would over-wait. With no remaining headers every reset
 * counts, and the latest one is the safe choice. Resets already past (or due now) are skipped; none left means no hint
 * from this family.
 */
function latestExhaustedResetMs(headers: ResponseHeaders, pairs: LimitHeaders, parseResetMs: (v: string) => number | undefined): number | undefined {
  const anyRemaining = pairs.some(([, remaining]) => header(headers, remaining) !== undefined);
  return latestResetMs(headers, anyRemaining ? pairs.filter(([, remaining]) => isZero(header(headers, remaining))) : pairs, parseResetMs);
}

function latestResetMs(headers: ResponseHeaders, pairs: LimitHeaders, parseResetMs: (v: string) => number | undefined): number | undefined {
  let latest: number | undefined;
  for (const [reset] of pairs) {
    const value = header(headers, reset);
    const resetMs = value === undefined ? undefined : parseResetMs(value);
    if (resetMs === undefined || resetMs <= 0) continue;
    if (latest === undefined || resetMs > latest) latest = resetMs;
  }
  return latest;
}

function isZero(value: string | undefined): boolean {
  return value !== undefined && /^0+$/.test(value);
}

const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];
const MONTH = '(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)';
const TIME = '(\\d{2}):(\\d{2}):(\\d{2})';
const IMF_FIXDATE = new RegExp(`^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), (\\d{2}) ${MONTH} (\\d{4}) ${TIME} GMT$`);
// The two obsolete forms RFC 9110 5.6.7 has every recipient accept: RFC 850's and C's asctime().
const RFC850_DATE = new RegExp(`^(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), (\\d{2})-${MONTH}-(\\d{2}) ${TIME} GMT$`);
const ASCTIME_DATE = new RegExp(`^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) ${MONTH} ( \\d|\\d{2}) ${TIME} (\\d{4})$`);
const RFC3339 = /^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?(?:([Zz])|([+-])(\d{2}):(\d{2}))$/;

// A strict grammar instead of Date.parse, which reads "1" or "May 5" as dates in the local time zone. A server may send
// any of the three formats: dropped, an obsolete one left the gateway retrying into the pause it asked for.
function parseHttpDateMs(value: string, nowMs: number): number | undefined {
  let m = IMF_FIXDATE.exec(value);
  if (m !== null) return utcMs(Number(m[3]), MONTHS.indexOf(m[2] ?? ''), Number(m[1]), Number(m[4]), Number(m[5]), Number(m[6]));
  m = ASCTIME_DATE.exec(value);
  if (m !== null) return utcMs(Number(m[6]), MONTHS.indexOf(m[1] ?? ''), Number(m[2]), Number(m[3]), Number(m[4]), Number(m[5]));
  m = RFC850_DATE.exec(value);
  if (m === null) return undefined;
  // A two-digit year more than 50 years ahead is the latest past year with those digits (RFC 9110 5.6.7).
  const nowYear = new Date(nowMs).getUTCFullYear();
  let year = nowYear - (nowYear % 100) + Number(m[3]);
  if (year > nowYear + 50) year -= 100;
  return utcMs(year, MONTHS.indexOf(m[2] ?? ''), Number(m[1]), Number(m[4]), Number(m[5]), Number(m[6]));
}

export function parseRfc3339Ms(value: string): number | undefined {
  const m = RFC3339.exec(value);
  if (m === null) return undefined;
  const at = utcMs(Number(m[1]), Number(m[2]) - 1, Number(m[3]), Number(m[4]), Number(m[5]), Number(m[6]));
  if (at === undefined) return undefined;
  const fractionMs = m[7] === undefined ? 0 : Number(m[7]) * 1000;
  if (m[8] !== undefined) return at + fractionMs;
  const offsetH = Number(m[10]), offsetM = Number(m[11]);
  if (offsetH > 23 || offsetM > 59) return undefined;
  const sign = m[9] === '-' ? -1 : 1;
  return at + fractionMs - sign * (offsetH * 60 + offsetM) * 60_000;
}

// Date.UTC silently rolls "Feb 30" into March; the round trip rejects such dates. A leap second (:60) is read as :59.
function utcMs(year: number, month: number, day: number, hour: number, minute: number, second: number): number | undefined {
  if (month < 0 || month > 11 || hour > 23 || minute > 59 || second > 60) return undefined;
  const at = Date.UTC(year, month, day, hour, minute, Math.min(second, 59));
  const date = new Date(at);
  return date.getUTCFullYear() === year && date.getUTCMonth() === month && date.getUTCDate() === day ? at : undefined;
}
