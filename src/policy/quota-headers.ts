// Reading a provider's remaining quota from its answers: when a limit is nearly spent before it resets, lower classes
// (batch) should wait for the reset instead of spending the rest and collecting 429s that online traffic then shares.
import { parseDurationMs, parseRfc3339Ms, type ResponseHeaders } from './wait-hint.ts';
import { firstHeader } from '../header-bag.ts';

/** "Nearly spent": at most this share of the limit left (and at least one request's worth). */
const LOW_SHARE = 0.02;

function num(v: string | undefined): number | undefined {
  if (v === undefined || !/^\d+(\.\d+)?$/.test(v.trim())) return undefined;
  return Number(v);
}

/** Whether a limit is nearly spent by its remaining value; undefined when the answer gives no readable remaining. */
function nearlySpent(limit: string | undefined, remaining: string | undefined): boolean | undefined {
  const r = num(remaining);
  return r === undefined ? undefined : r <= Math.max(1, (num(limit) ?? 0) * LOW_SHARE);
}

/**
 * When the quota is nearly spent, the time (ms since the epoch) it resets; undefined when it is not, or the headers
 * say nothing usable. Reads OpenAI's x-ratelimit-* (limit, remaining, reset as a duration) and Anthropic's
 * anthropic-ratelimit-* (reset as RFC 3339).
 */
export function quotaLowUntil(h: ResponseHeaders, nowMs: number): number | undefined {
  let until: number | undefined;
  // Remaining first: on almost every answer it is far from zero, and then no reset needs parsing.
  for (const names of OPENAI_LIMITS) {
    if (nearlySpent(firstHeader(h, names.limit), firstHeader(h, names.remaining)) !== true) continue;
    const reset = firstHeader(h, names.reset);
    const ms = reset === undefined ? undefined : parseDurationMs(reset);
    const at = ms === undefined ? undefined : nowMs + ms;
    if (at !== undefined && at > nowMs) until = Math.max(until ?? 0, at);
  }
  if (h['anthropic-ratelimit-requests-remaining'] === undefined && h['anthropic-ratelimit-tokens-remaining'] === undefined) return until;
  for (const names of ANTHROPIC_LIMITS) {
    if (nearlySpent(firstHeader(h, names.limit), firstHeader(h, names.remaining)) !== true) continue;
    const reset = firstHeader(h, names.reset);
    const at = reset === undefined ? undefined : parseRfc3339Ms(reset.trim());
    if (at !== undefined && at > nowMs) until = Math.max(until ?? 0, at);
  }
  return until;
}

/**
 * Does the answer report its quota (a readable remaining of some limit), none of it nearly spent? Then a hold begun on
 * an earlier answer is over, whatever reset that answer announced: the provider's window rolled over (or the reset it
 * gave was skewed), and batch held to it was shed for the whole announced reset (an hour, `1h`) beside a quota of 990
 * of 1,000 left.
 */
export function quotaNotLow(h: ResponseHeaders): boolean {
  let reported = false;
  for (const names of QUOTA_LIMITS) {
    const spent = nearlySpent(firstHeader(h, names.limit), firstHeader(h, names.remaining));
    if (spent === true) return false;
    reported ||= spent !== undefined;
  }
  return reported;
}

/** The headers of one limit: its size, what is left of it, and when it resets. */
interface LimitHeaders {
  limit: string;
  remaining: string;
  reset: string;
}

// Spelled out once, not per answer: every answer is read for each of them, and most carry none.
const OPENAI_LIMITS: readonly LimitHeaders[] = ['requests', 'tokens'].map((kind) => ({
  limit: `x-ratelimit-limit-${kind}`,
  remaining: `x-ratelimit-remaining-${kind}`,
  reset: `x-ratelimit-reset-${kind}`,
}));
const ANTHROPIC_LIMITS: readonly LimitHeaders[] = ['requests', 'tokens', 'input-tokens', 'output-tokens'].map((kind) => ({
  limit: `anthropic-ratelimit-${kind}-limit`,
  remaining: `anthropic-ratelimit-${kind}-remaining`,
  reset: `anthropic-ratelimit-${kind}-reset`,
}));
const QUOTA_LIMITS = [...OPENAI_LIMITS, ...ANTHROPIC_LIMITS];
