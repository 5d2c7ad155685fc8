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

/** An instance's part of the fleet's rates: `share` of each, and of its burst (at least one). */
export function ratesPart(rates: TargetRates, share: number): TargetRates {
  const part = (r: Rate | undefined): Rate | undefined => r && { intervalMs: r.intervalMs / share, burst: Math.max(1, Math.floor(r.burst * share)) };
  return { requests: part(rates.requests), tokens: part(rates.tokens) };
}
