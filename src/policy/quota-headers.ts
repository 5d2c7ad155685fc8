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
  const consider = (limit: string | undefined, remaining: string | undefined, resetAtMs: () => number | undefined) => {
    if (nearlySpent(limit, remaining) !== true) return;
    const at = resetAtMs();
    if (at !== undefined && at > nowMs) until = Math.max(until ?? 0, at);
  };
  for (const kind of OPENAI_KINDS) {
    consider(firstHeader(h, `x-ratelimit-limit-${kind}`), firstHeader(h, `x-ratelimit-remaining-${kind}`), () => {
      const reset = firstHeader(h, `x-ratelimit-reset-${kind}`);
      const ms = reset === undefined ? undefined : parseDurationMs(reset);
      return ms === undefined ? undefined : nowMs + ms;
    });
  }
  if (h['anthropic-ratelimit-requests-remaining'] === undefined && h['anthropic-ratelimit-tokens-remaining'] === undefined) return until;
  for (const kind of ANTHROPIC_KINDS) {
    consider(firstHeader(h, `anthropic-ratelimit-${kind}-limit`), firstHeader(h, `anthropic-ratelimit-${kind}-remaining`), () => {
      const reset = firstHeader(h, `anthropic-ratelimit-${kind}-reset`);
      return reset === undefined ? undefined : parseRfc3339Ms(reset.trim());
    });
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
  const low = (limit: string | undefined, remaining: string | undefined): boolean => {
    const spent = nearlySpent(limit, remaining);
    reported ||= spent !== undefined;
    return spent === true;
  };
  for (const kind of OPENAI_KINDS) if (low(firstHeader(h, `x-ratelimit-limit-${kind}`), firstHeader(h, `x-ratelimit-remaining-${kind}`))) return false;
  for (const kind of ANTHROPIC_KINDS) if (low(firstHeader(h, `anthropic-ratelimit-${kind}-limit`), firstHeader(h, `anthropic-ratelimit-${kind}-remaining`))) return false;
  return reported;
}

const OPENAI_KINDS = ['requests', 'tokens'];
const ANTHROPIC_KINDS = ['requests', 'tokens', 'input-tokens', 'output-tokens'];
