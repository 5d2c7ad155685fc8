// Reading a provider's remaining quota from its answers: when a limit is nearly spent before it resets, lower classes
// (batch) should wait for the reset instead of spending the rest and collecting 429s that online traffic then shares.
import { parseDurationMs, parseRfc3339Ms, type ResponseHeaders } from './wait-hint.ts';

/** "Nearly spent": at most this share of the limit left (and at least one request's worth). */
const LOW_SHARE = 0.02;

function header(h: ResponseHeaders, name: string): string | undefined {
  const v = h[name];
  return Array.isArray(v) ? v[0] : v;
}

function num(v: string | undefined): number | undefined {
  if (v === undefined || !/^\d+(\.\d+)?$/.test(v.trim())) return undefined;
  return Number(v);
}

/**
 * When the quota is nearly spent, the time (ms since the epoch) it resets; undefined when it is not, or the headers
 * say nothing usable. Reads OpenAI's x-ratelimit-* (limit, remaining, reset as a duration) and Anthropic's
 * anthropic-ratelimit-* (reset as RFC 3339).
 */
export function quotaLowUntil(h: ResponseHeaders, nowMs: number): number | undefined {
  let until: number | undefined;
  const consider = (limit: string | undefined, remaining: string | undefined, resetAtMs: number | undefined) => {
    const l = num(limit);
    const r = num(remaining);
    if (r === undefined || resetAtMs === undefined || resetAtMs <= nowMs) return;
    if (r <= Math.max(1, (l ?? 0) * LOW_SHARE)) until = Math.max(until ?? 0, resetAtMs);
  };
  for (const kind of ['requests', 'tokens']) {
    const reset = header(h, `x-ratelimit-reset-${kind}`);
    const resetMs = reset === undefined ? undefined : parseDurationMs(reset);
    consider(header(h, `x-ratelimit-limit-${kind}`), header(h, `x-ratelimit-remaining-${kind}`), resetMs === undefined ? undefined : nowMs + resetMs);
  }
  for (const kind of ['requests', 'tokens', 'input-tokens', 'output-tokens']) {
    const reset = header(h, `anthropic-ratelimit-${kind}-reset`);
    consider(header(h, `anthropic-ratelimit-${kind}-limit`), header(h, `anthropic-ratelimit-${kind}-remaining`), reset === undefined ? undefined : parseRfc3339Ms(reset));
  }
  return until;
}
