// A client's request rate (auth.limits), as GCRA, the generic cell rate algorithm: a token bucket kept as one number,
// the time the client's next request is due at its rate ("theoretical arrival time"). One value per client is what
// lets the Redis store share it across instances in one atomic script (state/redis-scripts.ts mirrors `admit`).
// Unlike a fixed window, nothing resets at a boundary: clients refused together are not all let in at once later.

/** A rate: one request per intervalMs on average, up to `burst` at once after a quiet spell. */
export interface Rate {
  intervalMs: number;
  burst: number;
}

/** The rate of `requestsPerMinute` with its burst (default: ten seconds' worth, at least one). */
export function rateOf(requestsPerMinute: number, burst?: number): Rate {
  return { intervalMs: 60_000 / requestsPerMinute, burst: burst ?? Math.max(1, Math.floor(requestsPerMinute / 6)) };
}

/**
 * Whether a request at nowMs fits the rate, given the stored due time (undefined: none yet). Admitted: the due time to
 * store. Refused: how long until one request would fit; nothing changes, so a refused request costs its client nothing.
 */
export function admit(dueMs: number | undefined, nowMs: number, rate: Rate): { admitted: true; dueMs: number } | { admitted: false; waitMs: number } {
  const from = Math.max(dueMs ?? 0, nowMs);
  // (from + interval) - burst × interval, written so a burst of 1 is exactly `from`: in floating point the long form
  // can land a hair past it, and a request exactly on time was refused for a whole interval.
  const allowedAt = from - (rate.burst - 1) * rate.intervalMs;
  return nowMs < allowedAt ? { admitted: false, waitMs: allowedAt - nowMs } : { admitted: true, dueMs: from + rate.intervalMs };
}
