// A client's rates (auth.limits), as GCRA, the generic cell rate algorithm: a token bucket kept as one number, the
// time the bucket would be full again at its rate ("theoretical arrival time", here `due`). One value per rate is what
// lets the Redis store share it across instances in one atomic script (state/redis-scripts.ts mirrors this file).
// Unlike a fixed window, nothing resets at a boundary: clients refused together are not all let in at once later.
import type { ClientLimitConfig } from '../config/schema.ts';
import type { Random } from './random.ts';
import { BYTES_PER_TOKEN } from './token-estimate.ts';

/** A rate: one unit (a request, a token) per intervalMs on average, up to `burst` at once after a quiet spell. */
export interface Rate {
  intervalMs: number;
  burst: number;
}

/** A client's rates: requests are counted as they arrive, tokens as an estimate once a body is read, then as used. */
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

/** A rate as configured, per minute (to three decimals: 60,000 / intervalMs is not always a whole number in floating point). */
export function perMinute(rate: Rate): number {
  return Math.round((60_000 / rate.intervalMs) * 1000) / 1000;
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
export function waitFor(dueMs: number | undefined, nowMs: number, rate: Rate, cost: number): number {
  const allowedAt = Math.max(dueMs ?? 0, nowMs) - (rate.burst - cost) * rate.intervalMs;
  return nowMs < allowedAt ? allowedAt - nowMs : 0;
}

/**
 * The due time after `cost` units are used at nowMs; may run past the burst (a request's tokens are owed all the same).
 * A negative cost gives units back (a reservation settled for less); undefined when that leaves the bucket full, as a
 * due time not after nowMs is (the Redis script deletes the key then).
 */
export function spend(dueMs: number | undefined, nowMs: number, rate: Rate, cost: number): number | undefined {
  const dueAfter = Math.max(dueMs ?? 0, nowMs) + cost * rate.intervalMs;
  return dueAfter > nowMs ? dueAfter : undefined;
}

/**
 * Whether a client's request at nowMs fits its rates, from its headers alone: one request of the request rate, and at
 * least one token left of the token rate (what the request will use is estimated once its body is read: reserveTokens).
 * Admitted: the request rate's new due time, to store. Refused: the wait until its turn, the rate that refused, and
 * the told time to store; the rates do not change, so a refused request costs its client nothing.
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
    return { admitted: false, ...queued(dues, nowMs, by, Math.max(tokenWait, requestWait), slotOf(rates, by)) };
  }
  return { admitted: true, requestsDue: rates.requests ? spend(dues.requests, nowMs, rates.requests, 1) : undefined };
}

/**
 * Whether a request's estimated tokens (tokenEstimate: its prompt and its completion cap) fit what is left of its
 * client's token rate at nowMs, once its body is read; admitClient let it in by its headers. Counting a request's
 * tokens only once it was answered let a burst sent at once through whole: 50 requests of 2,000 tokens against 10,000
 * a minute. Providers count a request the same way at arrival (OpenAI: its prompt plus its max_tokens).
 * Admitted: the token rate's due time with the estimate spent (settled against the answer's usage later: settlement).
 * A request of more than the burst (a minute's worth) fits once the bucket is full, as it never would otherwise, and
 * overdraws it. Refused: the wait until the estimate fits, in the queue of refused requests with a slot of the time
 * its estimate takes to come back (the 45 refused of that burst are told about 12 s apart, up to a minute past their
 * own wait, not all the moment one of them fits), and the request rate's due time with the request admitClient counted given back: a refused
 * request still costs its client nothing. The token rate does not change.
 */
export function reserveTokens(dues: ClientDues, nowMs: number, rates: ClientRates & { tokens: Rate }, estimate: number):
  | { admitted: true; tokensDue: number | undefined }
  | ({ admitted: false; toldMs: number; requestsDue: number | undefined } & ClientRefusal) {
  const cost = Math.min(estimate, rates.tokens.burst);
  const wait = waitFor(dues.tokens, nowMs, rates.tokens, cost);
  if (wait > 0) {
    const requestsDue = rates.requests && dues.requests !== undefined ? spend(dues.requests, nowMs, rates.requests, -1) : dues.requests;
    return { admitted: false, ...queued(dues, nowMs, 'tokens', wait, cost * rates.tokens.intervalMs), requestsDue };
  }
  return { admitted: true, tokensDue: spend(dues.tokens, nowMs, rates.tokens, estimate) };
}

/** A request's token estimate, reserved as it is admitted: its prompt's and its completion cap (0 when it sets none). */
export interface TokenEstimate {
  prompt: number;
  completion: number;
}

/**
 * The tokens to spend (negative: to give back) once a request that reserved `reserved` has ended, given the tokens its
 * answer says it used (undefined when no usage came: an error answer, a stream or a whole answer without usage, a
 * client gone before the end), whether any attempt of it went upstream, and the characters of output its client was
 * passed (text, reasoning and tool arguments: a stream's StreamEnd.outputChars, a whole answer's
 * RequestSummary.outputChars). With usage, what was reserved becomes what was used. Without it,
 * the prompt's estimate is kept (the prompt was sent, and a provider counts it even for most failures) and the
 * completion becomes the output delivered (deliveredTokens): given back whatever was generated, a client that streamed
 * 4,000 tokens and left before the usage chunk (or whose provider sends none) paid its prompt alone, and outran its rate
 * by as much; so did one whose server answers whole without usage (vLLM, llama.cpp, proxies). A request no provider
 * was sent (shed by a pool, a target unavailable, the deadline or its client gone before an attempt, an error of the
 * gateway's) gives it all back: it used no provider's tokens, and kept, a client whose SDK retries a load_shed paid its
 * estimate again at each retry until its own rate refused it.
 */
export function settlement(reserved: TokenEstimate, usedTokens: number | undefined, sentUpstream: boolean, outputChars = 0): number {
  if (usedTokens !== undefined) return usedTokens - reserved.prompt - reserved.completion;
  if (!sentUpstream) return -(reserved.prompt + reserved.completion);
  return deliveredTokens(outputChars, reserved.completion) - reserved.completion;
}

/**
 * The tokens a request's answers say it used: prompt and completion summed over those that reported usage (a
 * recovered stream's broken part and its continuation), undefined when none did (settlement then goes by the output
 * delivered). `deliveredCompletion` (deliveredTokens of the output its client was passed) is the least completion
 * counted, for a stream whose usage came only in part (it did not end whole, or broke before its recovery): an
 * Anthropic stream tells its prompt and an output of 1 in message_start and its output's count in message_delta, at
 * the end, so a client that left mid-stream was charged its prompt and 1 token of the thousands it was passed. A
 * whole stream's usage is its provider's own count, taken as it is (0, the default).
 */
export function usedTokens(usage: readonly ({ prompt: number; completion: number } | undefined)[], deliveredCompletion = 0): number | undefined {
  let reported = false;
  let prompt = 0;
  let completion = 0;
  for (const u of usage) {
    if (u === undefined) continue;
    reported = true;
    prompt += u.prompt;
    completion += u.completion;
  }
  return reported ? prompt + Math.max(completion, deliveredCompletion) : undefined;
}

/**
 * The completion tokens of `outputChars` characters of output, by the rule the estimate uses for bodies (4 to a token,
 * rounded up), at most the completion cap the request reserved; a request without one (`completionCap` 0: a cap of 0
 * is refused by providers) is not bounded. Providers count what they generated, which is at least what was delivered:
 * hidden reasoning and a stream's undelivered rest are not seen here.
 */
export function deliveredTokens(outputChars: number, completionCap: number): number {
  const tokens = Math.ceil(Math.max(0, outputChars) / BYTES_PER_TOKEN);
  return completionCap > 0 ? Math.min(tokens, completionCap) : tokens;
}

/**
 * A refusal by `by`, told its place in the queue of refused requests: its own wait, or a slot after the last one told
 * (forgotten TOLD_KEPT_MS after it, as the Redis scripts' key expires).
 */
function queued(dues: ClientDues, nowMs: number, by: RateKind, waitMs: number, slotMs: number): { waitMs: number; by: RateKind; toldMs: number } {
  const ownMs = nowMs + waitMs;
  const lastMs = dues.told !== undefined && nowMs < dues.told + TOLD_KEPT_MS ? dues.told : 0;
  const toldMs = Math.min(Math.max(ownMs, lastMs + slotMs), ownMs + QUEUE_AHEAD_MS);
  return { waitMs: toldMs - nowMs, by, toldMs };
}

/**
 * How long past the last told time the queue remembers it: the Redis scripts keep the told key until then (PX: the
 * time to it plus a second). The in-process store kept it for good, and with a reservation's slot (the time its
 * estimate takes to come back, up to a minute) a refusal seconds after the queue had run out was told a whole slot
 * after it, where the fleet's told it its own wait.
 */
const TOLD_KEPT_MS = 1_000;

/** How far past a refused request's own wait the queue of refused requests may tell it to come back. */
export const QUEUE_AHEAD_MS = 60_000;

/**
 * The time between two turns of the refusal queue, as admitClient refuses: the request rate's interval; none for a
 * token rate, as what a request will use is not known from its headers (reserveTokens has the estimate's time).
 */
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
