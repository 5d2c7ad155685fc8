// One attempt inside the provider's pool: take a slot (by class, then arrival; a retry also under the retry cap),
// attempt, and give the slot back (a stream: when it ends, or at its break when a streamRecovery continuation takes
// over). How it went reaches the target's adaptive limit through recordOutcome (record-outcome.ts), which the caller
// runs before it releases the slot. The attempt loop (target-attempts.ts) and a stream recovery's continuation
// (stream-recovery.ts) both go through here: a continuation that took no slot went past the next target's pool.
import { classify, neverSent, type Classification } from '../policy/outcome.ts';
import { quotaLowUntil, quotaNotLow } from '../policy/quota-headers.ts';
import { runAttempt, type AttemptResult } from './attempt.ts';
import { abortOutcome } from './abort-reasons.ts';
import type { RequestContext, TargetPlan } from './target-attempts.ts';
import type { UpstreamRequest } from '../providers/families.ts';
import type { ShedReason } from '../pools/provider-pool.ts';

export type SlotAttempt =
  | { kind: 'shed'; reason: ShedReason; retryAfterMs: number }
  /** The target went away while the request waited for its slot (a hold-off or credential hold began, the breaker opened). */
  | { kind: 'gone'; reason: 'hold-off' | 'breaker' | 'credentials'; availableAtMs: number }
  /**
   * `release` gives a whole answer's slot back (a stream's goes when its upstream is done): the caller calls it once the
   * outcome has done its work (a hold-off begun, the breaker told), so no request waiting for the slot goes out
   * between the provider's "stop" and the gateway's heeding it.
   */
  | { kind: 'done'; result: AttemptResult; cls: Classification; durationMs: number; release: () => void; slotWaitMs: number }
  /**
   * The deadline passed, by the clock, or the request was aborted (deadline, client gone, shutdown) while it waited
   * for its slot: nothing went upstream (no attempt to record).
   */
  | { kind: 'expired'; result: AttemptResult; cls: Classification };

/**
 * What of a request its slot and attempt read: the request's own context, or the one a stream recovery's continuation
 * makes (its signal, and a deadline that bounds only its wait for the slot).
 */
export type SlotContext = Pick<RequestContext, 'route' | 'api' | 'stream' | 'shape' | 'signal' | 'deadlineAtMs' | 'earlyStart' | 'bodyBytes' | 'client' | 'tokens'>;

type Gone = Extract<SlotAttempt, { kind: 'gone' }>;
/**
 * Is the target still free to take requests, now that the request holds a slot (`queued`: after waiting for it;
 * `late`: past its deadline, so it will not go whatever the answer)?
 * Undefined when it is; else why not and until when. A promise only when the answer needs the fleet's word (asking a
 * provider again at the end of a capped hold-off), so the common case awaits nothing.
 */
export type StillAvailable = (queued: boolean, late: boolean) => Gone | undefined | Promise<Gone | undefined>;

export async function attemptInSlot(
  ctx: SlotContext,
  plan: TargetPlan,
  upstream: UpstreamRequest,
  /** `released`: the parking lot let it go (SlotRequest.released). */
  { retry, released }: { retry: boolean; released: boolean },
  now: () => number,
  stillAvailable?: StillAvailable,
): Promise<SlotAttempt> {
  const askedAtMs = now();
  const acquired = await plan.pool.acquire({
    cls: plan.cls,
    target: plan.limitKey,
    retry,
    released,
    ...(ctx.bodyBytes !== undefined && { bodyBytes: ctx.bodyBytes }),
    deadlineAtMs: ctx.deadlineAtMs,
    minAttemptMs: ctx.route.config.minAttemptMs,
    signal: ctx.signal,
    client: ctx.client,
    ...(ctx.tokens !== undefined && { tokens: ctx.tokens }),
  });
  if (!acquired.ok) {
    if (acquired.reason !== 'aborted') return { kind: 'shed', reason: acquired.reason, retryAfterMs: acquired.retryAfterMs };
    // Aborted in the queue: nothing was sent, so no upstream attempt is counted (stormgate_upstream_attempts_total
    // counts requests sent upstream; amplification divides by it) and a probe's permit goes back unused.
    const result = { outcome: abortOutcome(ctx.signal.reason) };
    return { kind: 'expired', result, cls: classify(result.outcome) };
  }
  // The wait for a slot can outlast the target: a backlog queued before a 429's retry-after or a brownout must not
  // all go out into it the moment slots free up. The slot goes to the next in line; this request parks or moves on.
  // `late`: past its deadline it will not go, so it claims nothing (a claim held every other request back for nothing).
  const late = now() >= ctx.deadlineAtMs;
  const still = stillAvailable?.(acquired.queued, late);
  let gone: Gone | undefined;
  if (still instanceof Promise) {
    gone = await still;
    // The fleet's word took a round trip (Redis): the client, the shutdown or the deadline may have come meanwhile, and
    // an aborted attempt handed to runAttempt counted as one that went upstream (metrics, log, breaker), its turn kept.
    if (!gone && ctx.signal.aborted) return unsentNow(acquired.slot, abortOutcome(ctx.signal.reason));
    if (!gone && now() >= ctx.deadlineAtMs) return unsentNow(acquired.slot, { kind: 'aborted', by: 'deadline' });
  } else gone = still;
  if (gone) {
    acquired.slot.unsent();
    acquired.slot.release();
    return gone;
  }
  // Nothing goes upstream at or past the deadline, whatever its timer says: on a busy event loop the timer can be late,
  // and a request released or woken in an I/O callback reaches this point first. Answered as the timer would have.
  if (late) return unsentNow(acquired.slot, { kind: 'aborted', by: 'deadline' });
  const startedAt = now();
  // For the log line's attempt: the wait in the pool's queue, which neither the backoff nor the attempt's duration holds.
  const slotWaitMs = acquired.queued ? startedAt - askedAtMs : 0;
  const { path, headers, body, translator, errorMeaning, errorEventMeaning, hideUsage } = upstream;
  const answered = plan.pool.sending(plan.key);
  let result: AttemptResult;
  try {
    result = await runAttempt({ client: plan.client, api: ctx.api, path, headers, body, stream: ctx.stream, shape: ctx.shape, translator, errorMeaning, errorEventMeaning, hideUsage, requestSignal: ctx.signal, earlyStart: ctx.earlyStart, now });
  } finally {
    answered();
  }
  const durationMs = now() - startedAt;
  const cls = classify(result.outcome);
  // A connection refused (or the connect timer, or a request the gateway could not send) wrote nothing: the provider
  // counted no request or token of it, so the target's rate turn goes back, as for a request that never left (a retry
  // to a target that refuses connections waits for its backoff, not for a turn its failures spent).
  if (neverSent(result.outcome)) acquired.slot.unsent();
  if (cls.cls === 'success') acquired.slot.answered();
  if (cls.cls === 'success' && result.headers) {
    const lowUntil = quotaLowUntil(result.headers, now());
    if (lowUntil !== undefined) plan.pool.holdLowerClasses(plan.limitKey, lowUntil);
    else if (quotaNotLow(result.headers)) plan.pool.endLowerHold(plan.limitKey);
  }
  if (result.stream) {
    result.stream.whenUpstreamDone(() => acquired.slot.release());
    return { kind: 'done', result, cls, durationMs, release: () => {}, slotWaitMs };
  }
  return { kind: 'done', result, cls, durationMs, release: () => acquired.slot.release(), slotWaitMs };
}

/** A slot given back before anything was sent: its rate turn too, and no attempt to record. */
function unsentNow(slot: { unsent(): void; release(): void }, outcome: AttemptResult['outcome']): SlotAttempt {
  slot.unsent();
  slot.release();
  const result: AttemptResult = { outcome };
  return { kind: 'expired', result, cls: classify(outcome) };
}
