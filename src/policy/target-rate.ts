// A target's rates (pools.requestsPerMinute, pools.tokensPerMinute), as the pool paces its grants: the same GCRA as a
// client's rates (client-rate.ts), one due time per rate, kept in the pool rather than a store: a grant is
// synchronous, and a fleet splits the rates by the pool's share (fleet-share.ts) instead of asking Redis each time.
import { rateOf, spend, waitFor, type ClientDues, type ClientRates, type Rate, type RateKind } from './client-rate.ts';

/** A target's rates, each optional: the same pair as a client's. */
export type TargetRates = ClientRates;

/** Each rate's due time (undefined: full); a target has no queue of refused requests to tell. */
export type TargetDues = Omit<ClientDues, 'told'>;

/**
 * The rates of a pool's config: requests with a burst of one second's worth by default (providers enforce a minute's
 * limit over shorter spans: OpenAI's 60,000 a minute as 1,000 a second), tokens with a minute's worth by default, as
 * providers' token limits hold (tokenBurst for one that enforces them over shorter spans too).
 */
export function targetRates(perMinute: {
  requestsPerMinute?: number | undefined;
  burst?: number | undefined;
  tokensPerMinute?: number | undefined;
  tokenBurst?: number | undefined;
}): TargetRates | undefined {
  const { requestsPerMinute: rpm, tokensPerMinute: tpm } = perMinute;
  if (rpm === undefined && tpm === undefined) return undefined;
  return {
    requests: rpm === undefined ? undefined : rateOf(rpm, perMinute.burst ?? Math.max(1, Math.floor(rpm / 60))),
    tokens: tpm === undefined ? undefined : rateOf(tpm, perMinute.tokenBurst ?? Math.max(1, Math.floor(tpm))),
  };
}

/** Requests waiting for a target ahead of another, and their tokens (estimated, each as it will count). */
export interface RatesAhead {
  requests: number;
  tokens: number;
}

/**
 * How long until a request of `tokens` fits the rates at nowMs, after the requests `ahead` of it: 0 when it fits now.
 * A request of more tokens than the burst fits once the bucket is full (and overdraws it), as it never would otherwise.
 * Those ahead count for their own tokens: counted for the newcomer's, 4,000 behind three of 10 was told a minute's
 * wait for a turn 20 s away, and shed.
 */
export function rateWait(dues: TargetDues, rates: TargetRates, nowMs: number, tokens: number, ahead: RatesAhead = { requests: 0, tokens: 0 }): number {
  const waits = rateWaits(dues, rates, nowMs, tokens, ahead);
  return Math.max(waits.requests, waits.tokens);
}

/** rateWait by each rate (0 for one not set): which of them holds a request, for the client to be told. */
export function rateWaits(dues: TargetDues, rates: TargetRates, nowMs: number, tokens: number, ahead: RatesAhead = { requests: 0, tokens: 0 }): Record<RateKind, number> {
  return {
    requests: rates.requests ? waitFor(dues.requests, nowMs, rates.requests, ahead.requests + 1) : 0,
    tokens: rates.tokens ? waitFor(dues.tokens, nowMs, rates.tokens, ahead.tokens + Math.min(tokens, rates.tokens.burst)) : 0,
  };
}

/** The due times once a request of `tokens` is sent at nowMs. */
export function rateSpend(dues: TargetDues, rates: TargetRates, nowMs: number, tokens: number): void {
  if (rates.requests) dues.requests = spend(dues.requests, nowMs, rates.requests, 1);
  if (rates.tokens) dues.tokens = spend(dues.tokens, nowMs, rates.tokens, tokens);
}

/** The due times once a request of `tokens` spent at the rates is given back at nowMs: nothing was sent on it. */
export function rateGiveBack(dues: TargetDues, rates: TargetRates, nowMs: number, tokens: number): void {
  if (rates.requests) dues.requests = spend(dues.requests, nowMs, rates.requests, -1);
  if (rates.tokens) dues.tokens = spend(dues.tokens, nowMs, rates.tokens, -tokens);
}

/**
 * The least part of a rate an instance paces at: a part of 0 (no demand here, and none left over by the others')
 * would be an infinite interval, whose due times are not numbers. An instance this far down still has its burst of one
 * for a first request, and what it owes is carried to the part the next exchange gives it (rescaleDues).
 */
export const LEAST_RATE_PART = 1e-6;

/** An instance's part of the fleet's rates: `share` of each (at least LEAST_RATE_PART), and of its burst (at least one). */
export function ratesPart(rates: TargetRates, share: number): TargetRates {
  const s = Math.max(LEAST_RATE_PART, share);
  // A share summed in floating point lands a hair under a whole part (0.9999999999999999 alone), and its burst of 10 was 9.
  const part = (r: Rate | undefined): Rate | undefined => r && { intervalMs: r.intervalMs / s, burst: Math.max(1, Math.floor(r.burst * s + 1e-9)) };
  return { requests: part(rates.requests), tokens: part(rates.tokens) };
}

/**
 * The due times carried from the rates `from` to the rates `to` at nowMs (the fleet's exchange changed this
 * instance's part): each keeps what it owes in units, not in time. A due time is a time, and read as it is under a
 * faster rate, a request sent under a part of a millionth (an instance idle at the exchange) owed 10^6 intervals: the
 * instance was stranded for days after its part grew to a half. Read as it is under a slower rate, it forgave units
 * spent, which the fleet sent beyond its rate.
 */
export function rescaleDues(dues: TargetDues, from: TargetRates, to: TargetRates, nowMs: number): void {
  dues.requests = carried(dues.requests, from.requests, to.requests, nowMs);
  dues.tokens = carried(dues.tokens, from.tokens, to.tokens, nowMs);
}

function carried(dueMs: number | undefined, from: Rate | undefined, to: Rate | undefined, nowMs: number): number | undefined {
  if (dueMs === undefined || dueMs <= nowMs || from === undefined || to === undefined) return dueMs;
  return nowMs + (dueMs - nowMs) * (to.intervalMs / from.intervalMs);
}
