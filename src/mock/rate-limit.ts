// The mock's rate limit (FaultSpec.rateLimit) as OpenAI enforces its own: one token bucket per model and limit, a
// minute's worth deep (or burstSeconds' worth), refilled continuously; a request takes 1 from the requests bucket and its estimate from the
// tokens bucket at arrival, or is refused whole (a refused request uses up nothing). Pure: the buckets live in the
// server, and every function takes the time.
import type { RateLimit } from './faults.ts';
import { promptCount } from '../policy/token-estimate.ts';

/** A model's bucket levels at `atMs`; a level is undefined while its limit is unset. */
export interface RateBucket {
  requests: number | undefined;
  tokens: number | undefined;
  atMs: number;
}

/** One limit as the headers report it. */
interface LimitState {
  limit: number;
  /** Whole units left now. */
  remaining: number;
  /** ms until the bucket is full again (OpenAI: "until the rate limit resets to its initial state"). */
  resetMs: number;
}

/** The limits after a request was judged. */
interface RateState {
  requests: LimitState | undefined;
  tokens: LimitState | undefined;
}

/** The verdict on one request, with the bucket to keep. */
export interface RateOutcome {
  admitted: boolean;
  /** The limit named in the refusal (requests first when both refuse). */
  refused: 'requests' | 'tokens' | undefined;
  /** The request's estimate is more than the minute's token limit: no wait makes it fit. */
  tooLarge: boolean;
  /** Tokens the request counts. */
  requested: number;
  /** ms until the request fits every limit (0 when admitted; undefined when tooLarge). */
  retryMs: number | undefined;
  /** Levels after the refill and, when admitted, the spend. */
  bucket: RateBucket;
  state: RateState;
}

const MINUTE_MS = 60_000;

/** What a bucket of this rate holds: a minute's worth, or burstSeconds' worth. */
function depth(limit: RateLimit, perMinute: number): number {
  return limit.burstSeconds === undefined ? perMinute : (perMinute * limit.burstSeconds) / 60;
}

/** Levels at nowMs: a new bucket is full, an old one gains limit / minute per ms, up to its depth. */
export function refill(limit: RateLimit, bucket: RateBucket | undefined, nowMs: number): RateBucket {
  const level = (perMinute: number | undefined, old: number | undefined): number | undefined => {
    if (perMinute === undefined) return undefined;
    if (old === undefined || bucket === undefined) return depth(limit, perMinute);
    return Math.min(depth(limit, perMinute), old + (Math.max(0, nowMs - bucket.atMs) * perMinute) / MINUTE_MS);
  };
  return { requests: level(limit.requestsPerMinute, bucket?.requests), tokens: level(limit.tokensPerMinute, bucket?.tokens), atMs: nowMs };
}

/** What the headers say of a bucket (already refilled to its atMs). */
export function rateState(limit: RateLimit, bucket: RateBucket): RateState {
  const one = (perMinute: number | undefined, level: number | undefined): LimitState | undefined =>
    perMinute === undefined || level === undefined
      ? undefined
      : { limit: perMinute, remaining: Math.max(0, Math.floor(level)), resetMs: ((depth(limit, perMinute) - level) * MINUTE_MS) / perMinute };
  return { requests: one(limit.requestsPerMinute, bucket.requests), tokens: one(limit.tokensPerMinute, bucket.tokens) };
}

/** Judges a request of `tokens` arriving at nowMs; the returned bucket replaces the old one. */
export function rateTake(limit: RateLimit, old: RateBucket | undefined, nowMs: number, tokens: number): RateOutcome {
  const b = refill(limit, old, nowMs);
  const rpm = limit.requestsPerMinute;
  const tpm = limit.tokensPerMinute;
  const requestsWait = rpm !== undefined && b.requests! < 1 ? ((1 - b.requests!) * MINUTE_MS) / rpm : 0;
  // Over the minute's limit, no wait makes it fit. Over a shallower bucket's depth (burstSeconds) alone, it goes once the
  // bucket is full and overdraws it, as a request within a provider's minute's limit is served in the end: refused
  // every time, a call of 4,000 tokens against 20,000 a minute enforced over 5 s could never be answered at all.
  const tooLarge = tpm !== undefined && tokens > tpm;
  const fits = tpm === undefined ? 0 : Math.min(tokens, depth(limit, tpm));
  const tokensWait = tpm !== undefined && !tooLarge && b.tokens! < fits ? ((fits - b.tokens!) * MINUTE_MS) / tpm : 0;
  const refused = requestsWait > 0 ? 'requests' : tooLarge || tokensWait > 0 ? 'tokens' : undefined;
  if (refused === undefined) {
    if (rpm !== undefined) b.requests! -= 1;
    if (tpm !== undefined) b.tokens! -= tokens;
  }
  return {
    admitted: refused === undefined,
    refused,
    tooLarge,
    requested: tokens,
    retryMs: tooLarge ? undefined : Math.max(requestsWait, tokensWait),
    bucket: b,
    state: rateState(limit, b),
  };
}

/** The fields that cap a completion, in OpenAI's order (max_completion_tokens replaced max_tokens); Responses' last. */
const CAP_FIELDS = ['max_completion_tokens', 'max_tokens', 'max_output_tokens'] as const;

/**
 * Tokens a request counts at arrival, as OpenAI counts them: the body's bytes / 4 (rounded up) plus the completion cap
 * it sets, times the choices it asks for (`n`, for each prompt of a legacy completion's batch).
 */
export function requestTokens(bodyBytes: number, body: Readonly<Record<string, unknown>>): number {
  const cap = CAP_FIELDS.map((f) => body[f]).find((v) => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0) as number | undefined;
  const n = typeof body['n'] === 'number' && Number.isSafeInteger(body['n']) && body['n'] > 1 ? body['n'] : 1;
  return Math.ceil(bodyBytes / 4) + (cap ?? 0) * n * promptCount(body['prompt']);
}

/** A duration as OpenAI writes it (Go's time.Duration): `20ms`, `1.2s`, `6m0s`, `1m30.5s`; rounded up to the ms. */
export function goDuration(ms: number): string {
  const whole = Math.ceil(ms);
  if (whole <= 0) return '0s';
  if (whole < 1000) return `${whole}ms`;
  const seconds = (n: number) => `${Number((n / 1000).toFixed(3))}s`;
  if (whole < MINUTE_MS) return seconds(whole);
  const hours = Math.floor(whole / 3_600_000);
  const minutes = Math.floor((whole % 3_600_000) / MINUTE_MS);
  const rest = seconds(whole % MINUTE_MS);
  return hours > 0 ? `${hours}h${minutes}m${rest}` : `${minutes}m${rest}`;
}

/** An RFC 3339 time in whole seconds, rounded up (Anthropic's `anthropic-ratelimit-*-reset`). */
export function rfc3339(atMs: number): string {
  return new Date(Math.ceil(atMs / 1000) * 1000).toISOString().replace('.000Z', 'Z');
}

/** OpenAI's x-ratelimit-* headers, or Anthropic's anthropic-ratelimit-* ones, for the limits that are set. */
export function rateHeaders(family: 'openai' | 'anthropic', state: RateState, nowMs: number): Record<string, string> {
  const h: Record<string, string> = {};
  for (const name of ['requests', 'tokens'] as const) {
    const s = state[name];
    if (s === undefined) continue;
    if (family === 'anthropic') {
      h[`anthropic-ratelimit-${name}-limit`] = String(s.limit);
      h[`anthropic-ratelimit-${name}-remaining`] = String(s.remaining);
      h[`anthropic-ratelimit-${name}-reset`] = rfc3339(nowMs + s.resetMs);
    } else {
      h[`x-ratelimit-limit-${name}`] = String(s.limit);
      h[`x-ratelimit-remaining-${name}`] = String(s.remaining);
      h[`x-ratelimit-reset-${name}`] = goDuration(s.resetMs);
    }
  }
  return h;
}

/**
 * The wait headers of a refusal: none at OpenAI (its RPM and TPM 429s carry none) unless `retryAfter` asks for the
 * variant that sends retry-after-ms and retry-after; Anthropic always sends retry-after, in whole seconds. A request
 * too large to ever fit gets none.
 */
export function refusalHeaders(family: 'openai' | 'anthropic', limit: RateLimit, outcome: RateOutcome): Record<string, string> {
  const ms = outcome.retryMs;
  if (ms === undefined) return {};
  const seconds = String(Math.max(1, Math.ceil(ms / 1000)));
  if (family === 'anthropic') return { 'retry-after': seconds };
  return limit.retryAfter === true ? { 'retry-after-ms': String(Math.ceil(ms)), 'retry-after': seconds } : {};
}

/** The refusal's message, in the provider's own words. */
export function refusalMessage(family: 'openai' | 'anthropic', model: string | undefined, outcome: RateOutcome): string {
  const which = outcome.refused ?? 'requests';
  const s = outcome.state[which]!;
  if (family === 'anthropic') {
    const what = which === 'requests' ? 'requests' : 'tokens';
    return (
      `This request would exceed the rate limit for your organization (mock) of ${s.limit.toLocaleString('en-US')} ${what} per minute. ` +
      'For details, refer to: https://docs.claude.com/en/api/rate-limits. You can see the response headers for current usage. ' +
      'Please reduce the prompt length or the maximum tokens requested, or try again later.'
    );
  }
  const name = model ?? 'default';
  const unit = which === 'requests' ? 'requests per min (RPM)' : 'tokens per min (TPM)';
  const requested = which === 'requests' ? 1 : outcome.requested;
  const learn = 'Visit https://platform.openai.com/account/rate-limits to learn more.';
  if (outcome.tooLarge && which === 'tokens') {
    return `Request too large for ${name} in organization org-mock on ${unit}: Limit ${s.limit}, Requested ${requested}. The input or output tokens must be reduced in order to run successfully. ${learn}`;
  }
  return `Rate limit reached for ${name} in organization org-mock on ${unit}: Limit ${s.limit}, Used ${s.limit - s.remaining}, Requested ${requested}. Please try again in ${goDuration(outcome.retryMs ?? 0)}. ${learn}`;
}
