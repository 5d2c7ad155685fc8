// A client's rates (auth.limits), as GCRA, the generic cell rate algorithm: a token bucket kept as one number, the
// time the bucket would be full again at its rate ("theoretical arrival time", here `due`). One value per rate is what
// lets the Redis store share it across instances in one atomic script (state/redis-scripts.ts mirrors this file).
// Unlike a fixed window, nothing resets at a boundary: clients refused together are not all let in at once later.
import type { ClientLimitConfig } from '../config/schema.ts';
import type { Random } from './random.ts';

/** A rate: one unit (a request, a token) per intervalMs on average, up to `burst` at once after a quiet spell. */
export interface Rate {
  intervalMs: number;
  burst: number;
}

/** A client's rates: requests are counted as they arrive, tokens once their answer says how many were used. */
export interface ClientRates {
  requests?: Rate | undefined;
  tokens?: Rate | undefined;
}

/** Which of a client's rates: the request rate or the token rate. */
export type RateKind = keyof ClientRates;

/** Why a client's request was refused: how long until its turn (see admitClient), and the rate that refused it. */
export interface ClientRefusal {
  waitMs: number;
  by: RateKind;
}

/**
 * What a store keeps for one client, ms: each rate's due time (undefined: never used, or expired, i.e. full), and the
 * latest time a refused request of the client was told to come back (the queue of refused requests, below).
 */
export interface ClientDues {
  requests?: number | undefined;
  tokens?: number | undefined;
  told?: number | undefined;
}

/** A client's entry of auth.limits (or of rates made from it): its own, else the one for every client not named, "*". */
export function limitOf<T>(limits: Readonly<Record<string, T>>, client: string): T | undefined {
  return Object.hasOwn(limits, client) ? limits[client] : limits['*'];
}

/** The rate of `perMinute` with its burst (default: ten seconds' worth, at least one). */
export function rateOf(perMinute: number, burst?: number): Rate {
  return { intervalMs: 60_000 / perMinute, burst: burst ?? Math.max(1, Math.floor(perMinute / 6)) };
}

/** The client's rates from its auth.limits entry; a token rate holds a minute's worth, as providers' limits do. */
export function clientRates(limit: ClientLimitConfig): ClientRates {
  return {
    requests: limit.requestsPerMinute === undefined ? undefined : rateOf(limit.requestsPerMinute, limit.burst),
    tokens: limit.tokensPerMinute === undefined ? undefined : rateOf(limit.tokensPerMinute, Math.max(1, Math.floor(limit.tokensPerMinute))),
  };
}

/**
 * How long until `cost` units fit the rate at nowMs, given the stored due time: 0 when they fit now.
 * With from = max(due, now), that is (from + cost × interval) - burst × interval, written so cost = burst is exactly
 * `from`: in floating point the long form can land a hair past it, and a request exactly on time was refused for a
 * whole interval.
 */
function waitFor(dueMs: number | undefined, nowMs: number, rate: Rate, cost: number): number {
  const allowedAt = Math.max(dueMs ?? 0, nowMs) - (rate.burst - cost) * rate.intervalMs;
  return nowMs < allowedAt ? allowedAt - nowMs : 0;
}

/** The due time after `cost` units are used at nowMs; may run past the burst (a request's tokens are owed all the same). */
export function spend(dueMs: number | undefined, nowMs: number, rate: Rate, cost: number): number {
  return Math.max(dueMs ?? 0, nowMs) + cost * rate.intervalMs;
}

/**
 * Whether a client's request at nowMs fits its rates: one request of the request rate, and at least one token left of
 * the token rate (what the request will use is not known until it is answered). Admitted: the request rate's new due
 * time, to store. Refused: the wait until its turn, the rate that refused, and the told time to store; the rates do not
 * change, so a refused request costs its client nothing.
 * Requests refused together all wait for the same next slot: each is told the slot after the last one told, as in a
 * queue, or they would all come back for that one slot, again and again. The told times run ahead of now only while
 * refusals come faster than the rate, that is while the client's backlog lasts. A token rate has no slot of its own (a
 * request's tokens are unknown): its refusals wait for the queue's end and share the wait. The queue runs at most a
 * minute past a request's own wait: every refusal takes a place, and agents looping on the 429 without reading its
 * retry-after took one each time, which told the client's next request, admitted one slot later, to wait minutes (147 s
 * after a 1,500-call loop); past a minute the SDKs give up anyway (x-should-retry: false).
 */
export function admitClient(dues: ClientDues, nowMs: number, rates: ClientRates):
  | { admitted: true; requestsDue: number | undefined }
  | ({ admitted: false; toldMs: number } & ClientRefusal) {
  const tokenWait = rates.tokens ? waitFor(dues.tokens, nowMs, rates.tokens, 1) : 0;
  const requestWait = rates.requests ? waitFor(dues.requests, nowMs, rates.requests, 1) : 0;
  if (tokenWait > 0 || requestWait > 0) {
    const by = tokenWait >= requestWait ? 'tokens' : 'requests';
    const ownMs = nowMs + Math.max(tokenWait, requestWait);
    const toldMs = Math.min(Math.max(ownMs, (dues.told ?? 0) + slotOf(rates, by)), ownMs + QUEUE_AHEAD_MS);
    return { admitted: false, waitMs: toldMs - nowMs, by, toldMs };
  }
  return { admitted: true, requestsDue: rates.requests ? spend(dues.requests, nowMs, rates.requests, 1) : undefined };
}

/** How far past a refused request's own wait the queue of refused requests may tell it to come back. */
export const QUEUE_AHEAD_MS = 60_000;

/** The time between two turns of the refusal queue: the request rate's interval; none for a token rate. */
function slotOf(rates: ClientRates, by: RateKind): number {
  return by === 'requests' ? (rates.requests?.intervalMs ?? 0) : 0;
}

/**
 * The retry-after a refused request is told: its turn, spread by up to one slot (a fifth of the wait for a token rate),
 * so the queue does not come back in lockstep; never before its turn.
 */
export function retryAfterOf(refusal: ClientRefusal, rates: ClientRates, random: Random): number {
  const spread = refusal.by === 'requests' ? slotOf(rates, 'requests') : 0.2 * refusal.waitMs;
  return Math.ceil(refusal.waitMs + random() * spread);
}
