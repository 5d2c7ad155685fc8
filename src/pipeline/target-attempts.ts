// The attempt loop on one target: gate (hold-off, breaker) -> attempt -> record -> classify -> answer, or take a
// retry from the budget, wait by the one wait rule, and go again. Every wait is cut short by the request's signal.
import type { ProviderClient } from '../providers/provider-client.ts';
import { classify, maySendAgain, OUTCOME_TABLE, type Classification } from '../policy/outcome.ts';
import { canWait, decideRetryWait } from '../policy/retry-wait.ts';
import { availableAtMs, type BreakerSettings } from '../policy/breaker.ts';
import type { Random } from '../policy/random.ts';
import { HOLD_OFF_SLACK_MS, leavesUntil, pastHoldOff, waitPastHoldOff } from '../policy/hold-off-wait.ts';
import type { ApiKind, CompiledRoute } from '../routing/router.ts';
import type { BreakerBoard } from '../state/breaker-board.ts';
import type { HoldOffs } from '../state/hold-offs.ts';
import type { RetryBudget } from '../state/retry-budget.ts';
import type { AttemptResult } from './attempt.ts';
import { failureCode, judgeStreamEnd, recordOutcome } from './record-outcome.ts';
import { GatewayShutdown, abortOutcome } from './abort-reasons.ts';
import { attemptInSlot, type SlotAttempt, type StillAvailable } from './slot-attempt.ts';
import type { ProviderPool, ShedReason } from '../pools/provider-pool.ts';
import type { Prepared } from '../providers/families.ts';
import type { RetryConfig } from '../config/schema.ts';
import type { Ticket } from './parking-lot.ts';
import type { StreamShape } from '../streaming/stream-events.ts';
import { RequestAbort, type RequestSignal } from './request-abort.ts';
import type { EarlyStart } from './early-start.ts';

export interface AttemptRecord {
  target: string;
  /** Requests the gateway had sent this target for the request before this one, probes included (x-retry-attempt). */
  attempt: number;
  /** `ok`, `status_503`, `network`, `timeout_first_token`, ... */
  reason: string;
  status?: number;
  /** The wait before this attempt (backoff, wait hint, parked). */
  waitMs: number;
  /** Its wait for a slot in the provider's pool, when it queued for one (the pool's share between clients shows here). */
  slotWaitMs?: number;
  durationMs: number;
  probe?: boolean;
  /**
   * A network failure's code (ECONNREFUSED, ENOTFOUND, ERR_SSL_WRONG_VERSION_NUMBER, ...): the reason alone says
   * `network`, and what the operator fixes (a host, a port, http for https) is in the code the client's message names.
   */
  code?: string;
  /** A 404's `param` when it names a field other than the model (previous_response_id, input): not an unknown model. */
  param?: string;
}

/** Everything about one target of one request that does not change between attempts. */
export interface TargetPlan {
  /** Breaker, hold-off and budget key, and the metric label: `<provider>/<model or other>`. */
  key: string;
  /**
   * Whether the target's fleet-wide hold-offs apply to this request, and its answers start them: not on a route on a
   * path the gateway has no API for, whose endpoint has rate limits of its own (Anthropic's count_tokens: separate
   * from, and independent of, message creation's). Shared, a count_tokens 429 with retry-after turned every agent's
   * /v1/messages away for as long; there a wait hint is the request's own, as an x-ratelimit-reset hint is.
   */
  sharesHoldOffs: boolean;
  /**
   * The key of the hold-offs that hold this request off, and the one it parks under: the target's, or for a request
   * that asks for the flex service tier (`service_tier: "flex"`) that tier's (HoldOffs.flexTierKey), which a 498
   * capacity_exceeded holds off alone and the target's own hold-offs hold too. The parking lot keeps both keys' requests
   * in their target's queue, in one order and under one limit.
   */
  holdOffKey: string;
  /**
   * The key of the adaptive limit (and quota hold) the request's slot is taken under in its provider's pool: the
   * target's, or for such a route the target's and the route's, for the same reason: a burst of count_tokens 429s cut
   * the limit every agent's /v1/messages lives under to its floor.
   */
  limitKey: string;
  /** For x-stormgate-target: the provider and the upstream model as sent. */
  label: string;
  /** The upstream model: the target's override, else the client's. */
  model: string | undefined;
  /** The target sends a model of its own (its `model`), whatever the client named: a 404 for it is the config's. */
  ownModel: boolean;
  client: ProviderClient;
  /** The request in this family's terms (headers: the forwarded client headers and the provider's credentials), prepared once, on first use. */
  upstream: () => Prepared;
  /** The retry policy on this target: its own, else the route's. */
  retry: RetryConfig;
  weight: number;
  breaker: BreakerSettings | undefined;
  budgetKey: string;
  pool: ProviderPool;
  /** The request's class in the pool: index (0 = highest) and name. */
  cls: number;
  className: string;
  /** Is it the pool's lowest class (shed with 429, not 503)? */
  lowestClass: boolean;
}

/** What changes between attempts on one target of one request. */
interface TargetRun {
  /** Attempts that count towards maxAttempts. */
  attempts: number;
  /** Requests sent to the target, probes included (numbers x-retry-attempt). */
  sent: number;
  prevDelayMs: number | undefined;
  waitMs: number;
  /** The client already retried on its own and the budget is spent: serve once, never retry. */
  noRetries: boolean;
  /** The next attempt is a retry already taken from the budget. */
  retryPaid: boolean;
  /** The first attempt is counted in the budget already. */
  counted: boolean;
  /**
   * A retry the parking lot released went unrefused already. Once per request and target: a provider that fails again
   * once back (a flapping one, its breaker closing and reopening) would otherwise have every request retried up to
   * maxAttempts, past the budget, one release after another.
   */
  releasedUnrefused: boolean;
  /** The last failure, answered if a deferred retry (after parking) is refused by the budget. */
  lastFailure: (TargetResult & { kind: 'failed' }) | undefined;
  done: boolean;
}

/** A target a request left out, and why; `param` when the request field at fault is known. */
export interface SkippedTarget {
  target: string;
  reason: string;
  param?: string;
}

export interface RequestContext {
  route: CompiledRoute;
  api: ApiKind;
  stream: boolean;
  /** What a whole streamed answer holds (the request's `n`, include_usage). */
  shape: StreamShape;
  /**
   * The request commits at the provider as it is taken (a Responses API request with a `conversation`, or with
   * `background: true`: StreamShape.startsAtCreated): once an attempt may have been taken unanswered, it is not sent
   * again (policy/outcome.ts maySendAgain).
   */
  commitsOnSend: boolean;
  signal: RequestSignal;
  deadlineAtMs: number;
  /** A stream on the client's deadline: the deadline starts an answer that has begun upstream (early-start.ts). */
  earlyStart?: EarlyStart;
  /** A stream's first output is in hand: the answer has started, the deadline no longer applies (its idle timer does). */
  onStreamStarted?: () => void;
  attempts: AttemptRecord[];
  /** Targets this request skipped, with the reason (shared with the request's log line). */
  skipped: SkippedTarget[];
  /** May the request park while its targets are unavailable? */
  parkable: boolean;
  /**
   * A wait the request took: parked, or a backoff (a wait hint's included) before a retry. For its log line: a wait that
   * led to no attempt (the deadline came, the target went away meanwhile) shows in no attempt's waitMs.
   */
  onWaited?: (kind: 'parked' | 'backoff', ms: number) => void;
  /** The client's own retry count (x-stainless-retry-count), 0 when none. */
  clientRetries: number;
  /** Bytes of the request's body, counted against server.maxWaitingBodyBytes while it waits (queued or parked). */
  bodyBytes?: number;
  /** The client's key's name (auth.keys): its requests wait for slots in turn with other clients' (SlotRequest.client). */
  client?: string;
  /** Its estimated tokens (policy/token-estimate.ts): what a target's token rate counts each attempt for. */
  tokens?: number;
  /** While the instance drains, the time left before its grace period is over (ManagedRequest.graceLeftMs). */
  graceLeftMs?: () => number | undefined;
  /** Registers a call for when the instance's drain begins (ManagedRequest.onDrainStart); returns its removal. */
  onDrainStart?: (listener: () => void) => () => void;
}

export interface Guards {
  board: BreakerBoard;
  holdOffs: HoldOffs;
  budget: RetryBudget;
}

export interface TargetDeps {
  now: () => number;
  random: Random;
  sleep: (ms: number, signal: RequestSignal) => Promise<void>;
  guards: Guards;
  onAttempt?: (route: string, target: string, result: AttemptResult, durationMs: number) => void;
  onRetry?: (route: string, target: string, reason: string, waitMs: number) => void;
  onBudgetExhausted?: (route: string, target: string) => void;
}

export type TargetResult =
  | { kind: 'ok'; result: AttemptResult }
  /** The target's API family cannot express this request; `param`: the request field at fault, when known. */
  | { kind: 'skipped'; reason: string; param?: string }
  /** The provider refused the gateway's credentials or billing lately: nothing is sent to it until `untilMs`. */
  | { kind: 'auth-held'; untilMs: number }
  /** The provider's pool could not give the request a slot in time (or its class queue is full). */
  | { kind: 'shed'; reason: ShedReason; retryAfterMs: number; className: string; lowestClass: boolean }
  /** `why`: what ended the retries here, when it was not the outcome itself (for the fallback reason). */
  | { kind: 'failed'; result: AttemptResult; cls: Classification; retryAfterMs: number | undefined; why?: RetriesStopped }
  /** `own`: the hold-off this request's own answer started, whose hint its retry policy accepted (it may park past maxWaitHintMs by the spread). */
  | { kind: 'unavailable'; reason: 'breaker' | 'hold-off'; availableAtMs: number; own?: true };

type Unavailable = TargetResult & { kind: 'unavailable' };

/**
 * What stopped a target's retries when the outcome itself did not (a fallback reason, and the log's retriesStopped).
 * `held_off`, `breaker_open`: the retry was due when the target went away, and the request ended without coming back.
 * `upstream_no_retry`: the provider's own `x-should-retry: false` (Classification.upstreamNoRetry).
 */
export type RetriesStopped = 'retries_exhausted' | 'budget' | 'wait_hint' | 'deadline' | 'timeout' | 'shed' | 'held_off' | 'breaker_open' | 'upstream_no_retry';

export function newRun(): TargetRun {
  return { attempts: 0, sent: 0, prevDelayMs: undefined, waitMs: 0, noRetries: false, retryPaid: false, counted: false, releasedUnrefused: false, lastFailure: undefined, done: false };
}

/**
 * Why a target turns requests away now, and until when: its hold-off, else its breaker (open, or probing with no
 * permit for this request); undefined when neither holds it back.
 */
export function heldBack(guards: Guards, plan: TargetPlan, parkable: boolean, nowMs: number): { reason: 'hold-off' | 'breaker'; availableAtMs: number } | undefined {
  const heldUntil = holdOffUntil(guards.holdOffs, plan);
  if (heldUntil !== undefined) return { reason: 'hold-off', availableAtMs: heldUntil };
  const view = guards.board.availability(plan.key, plan.breaker, parkable);
  if (view.kind === 'closed') return undefined;
  return { reason: 'breaker', availableAtMs: availableAtMs(view, nowMs) };
}

/** When the target's hold-off ends, if one is in force and applies to the plan's requests (sharesHoldOffs). */
export function holdOffUntil(holdOffs: HoldOffs, plan: TargetPlan): number | undefined {
  return plan.sharesHoldOffs ? holdOffs.until(plan.holdOffKey) : undefined;
}

/**
 * The target's state now, for a request that was admitted before it waited for a pool slot. A credential hold begun
 * meanwhile too: a queue behind the first 401 of a revoked key went out with it one by one as slots freed up, each one
 * more refusal and a round trip lost before the backup.
 */
function goneMeanwhile(guards: Guards, plan: TargetPlan, parkable: boolean, nowMs: number): Extract<SlotAttempt, { kind: 'gone' }> | undefined {
  const authHeldUntil = guards.holdOffs.credentialsHeldUntil(plan.key);
  if (authHeldUntil !== undefined) return { kind: 'gone', reason: 'credentials', availableAtMs: authHeldUntil };
  const held = heldBack(guards, plan, parkable, nowMs);
  return held && { kind: 'gone', ...held };
}

/** The target's hold-off as a reason it went away, if one is in force. */
function heldOff(guards: Guards, plan: TargetPlan): Extract<SlotAttempt, { kind: 'gone' }> | undefined {
  const heldUntil = holdOffUntil(guards.holdOffs, plan);
  return heldUntil === undefined ? undefined : { kind: 'gone', reason: 'hold-off', availableAtMs: heldUntil };
}

/**
 * For a request that holds its slot and is about to go (slot-attempt.ts): is the target still there? After a wait for
 * the slot, whatever began meanwhile (goneMeanwhile); else a hold-off begun since this request looked (by another one
 * that asks again, below). And at the end of a hold-off capped short of what the provider asked for, is this request
 * the one that asks again (HoldOffs.reask)? Claimed here, as it goes: a claim made earlier held the others back for
 * nothing when its request never went (a breaker, the budget, a shed), and turned its own request away while it
 * waited for a slot. `probe`: the breaker's probe claims too, and looks at nothing else again.
 */
export function stillThere(guards: Guards, plan: TargetPlan, parkable: boolean, now: () => number, probe = false): StillAvailable {
  return (queued, late) => {
    // A probe is the breaker's one attempt, allowed whatever the state: it looks at nothing again, yet claims the asking
    // again like any other (three probes at a time went into the provider's likely refusal, where one asks).
    const gone = probe ? undefined : queued ? goneMeanwhile(guards, plan, parkable, now()) : heldOff(guards, plan);
    // Past its deadline the request does not go: its claim would hold the others back for nothing.
    if (gone !== undefined || late || !plan.sharesHoldOffs) return gone;
    return guards.holdOffs.reask(plan.holdOffKey)?.then((asks) => (asks ? undefined : probe ? heldOff(guards, plan) : goneMeanwhile(guards, plan, parkable, now())));
  };
}

/**
 * The request's other targets that may still answer: `later` ones in order, and `earlier` ones it left unavailable (held
 * off, breaker open), which it comes back for through the parking lot.
 */
export interface OtherTargets {
  later: boolean;
  earlier: boolean;
}

export async function tryTarget(ctx: RequestContext, plan: TargetPlan, run: TargetRun, deps: TargetDeps, others: OtherTargets, ticket?: Ticket): Promise<TargetResult> {
  const result = await attemptsOn(ctx, plan, run, deps, others, ticket);
  if (result.kind === 'unavailable') heldBackRetry(run, result);
  return result;
}

async function attemptsOn(ctx: RequestContext, plan: TargetPlan, run: TargetRun, deps: TargetDeps, others: OtherTargets, ticket?: Ticket): Promise<TargetResult> {
  const hasNext = others.later;
  const { minAttemptMs } = ctx.route.config;
  const { retry } = plan;
  const { board, holdOffs } = deps.guards;
  const prepared = plan.upstream();
  if (!prepared.ok) return { kind: 'skipped', reason: prepared.reason, ...paramOf(prepared) };
  const upstream = prepared.request;
  // An instance that just started (a restart, a new one the autoscaler added) knows nothing of the fleet's breaker,
  // hold-off and credential hold of a target until it has read them: judged clear meanwhile, its first requests (a
  // burst, if a load balancer held them for it) went upstream into an open breaker or a hold-off. Once per target, one
  // batched Redis read that brings all three, bounded by commandTimeoutMs.
  const reading = holdOffs.firstRead(plan.holdOffKey);
  if (reading) await reading;
  for (;;) {
    // Checked before the hold-off: a refused key does not come back by itself, so this is never waited for.
    const authHeldUntil = holdOffs.credentialsHeldUntil(plan.key);
    if (authHeldUntil !== undefined) return { kind: 'auth-held', untilMs: authHeldUntil };
    const heldUntil = holdOffUntil(holdOffs, plan);
    if (heldUntil !== undefined) return { kind: 'unavailable', reason: 'hold-off', availableAtMs: heldUntil };
    // The attempt's own limit (runAttempt's): firstTokenMs is a streams-only timer; a non-streaming probe runs until
    // responseMs, and a permit gone at firstTokenMs let a second and third probe out while a slow provider was still
    // answering the first. Without responseMs, firstTokenMs still bounds the permit: a hung probe must not hold it
    // until its request's deadline.
    const { firstTokenMs, responseMs } = plan.client.config.timeouts;
    const attemptLimitMs = ctx.stream ? firstTokenMs : (responseMs ?? firstTokenMs);
    const permitTtlMs = Math.min(attemptLimitMs, ctx.deadlineAtMs - deps.now());
    // The permit outlives the attempt by a moment: a probe ends at its limit or its request's deadline and its verdict
    // is written a round trip later; a permit that expired at that very instant let a parked request elsewhere, woken
    // for it, send a second probe into the outage first.
    const admission = await board.admit(plan.key, plan.breaker, ticket !== undefined, Math.max(permitTtlMs, 1) + PERMIT_GRACE_MS);
    if (!admission.admitted) {
      // A request that may park learns of a recovery within probeWhileParkedMs; one that may not waits for openS.
      // A newcomer sees the breaker open until openUntil; parked, it may be the probe sooner (now, once probing). When
      // its own view was probing too, the permits are out: admission says when one may be back.
      const parkedView = board.availability(plan.key, plan.breaker, ctx.parkable);
      const ownView = board.availability(plan.key, plan.breaker, ticket !== undefined);
      const at = parkedView.kind === 'open' ? parkedView.probeAtMs : parkedView.kind === 'probing' && ownView.kind === 'open' ? deps.now() : admission.availableAtMs;
      return { kind: 'unavailable', reason: 'breaker', availableAtMs: at };
    }
    // A retry the target's unavailability deferred (the breaker opened, a hold-off outlasted its wait) and that the
    // parking lot has now released (`ticket`) is paced like one that waits out a hold-off: nothing went to the target
    // while it was away, the probes or the hold-off's end said it is back, and the lot lets it go at the adaptive limit
    // (restarted at half) over the release window. It is counted in the budget but not refused: after a hang the
    // window holds few requests (parked newcomers count only once they go), and the budget would refuse nearly every
    // request the hang caught, with the provider answering again and time left before their deadlines. Once only: a
    // released retry that fails, parks and is released again (the target keeps coming back and failing) is taken.
    if (run.sent === 0) {
      // Once: a first attempt that found the target gone while it waited for a slot comes back here after parking.
      if (!run.counted) await countFirstAttempt(ctx, plan, run, deps);
      run.counted = true;
    } else if (!run.retryPaid && !admission.probe) {
      const unrefused = ticket !== undefined && !run.releasedUnrefused;
      if (!(await payRetry(ctx, plan, run, deps, unrefused))) return { ...run.lastFailure!, why: 'budget' };
      if (unrefused) run.releasedUnrefused = true;
    }
    run.retryPaid = false;

    // A retry is any request to a target this request was sent to before, whatever went between: a parked request
    // that tried the backup and comes back to the primary is its retry there (paid from the budget above), numbered by
    // the requests sent there before it, and the provider and stormgate_retry_count_total must see it as one.
    const retryOf = run.sent > 0 ? ctx.attempts.findLast((a) => a.target === plan.label) : undefined;
    const headers = retryOf ? { ...upstream.headers, 'x-retry-attempt': String(run.sent), 'x-retry-reason': retryOf.reason } : upstream.headers;
    // A probe holds the parking lot's probing slot no longer than the breaker's permit: one that hangs must not keep
    // the next probe (and every parked request) waiting until its own deadline. done() is once only.
    const heldTicket = ticket;
    const slotTimer = admission.probe && heldTicket ? setTimeout(() => heldTicket.done(), Math.max(permitTtlMs, 1)) : undefined;
    // A probe is the breaker's one attempt, allowed whatever the state: only other requests look again (stillThere).
    const attempt = await attemptInSlot(ctx, plan, { ...upstream, headers }, { retry: run.sent > 0, released: ticket !== undefined }, deps.now, stillThere(deps.guards, plan, ctx.parkable, deps.now, admission.probe !== undefined));
    clearTimeout(slotTimer);
    // Nothing went upstream: a probe's permit goes back at once (or nobody may probe until it expires), and the lot's place.
    const notSent = () => {
      if (admission.probe) board.unused(plan.key, admission.probe);
      ticket?.done();
    };
    if (attempt.kind === 'shed') {
      notSent();
      // A retry with no slot in time: the request already went upstream, so it ends with that attempt's failure
      // (x-should-retry: false), not a load_shed that invites the SDK to send it all over again on top of ours.
      if (run.lastFailure) return { ...run.lastFailure, why: 'shed' };
      return { kind: 'shed', reason: attempt.reason, retryAfterMs: attempt.retryAfterMs, className: plan.className, lowestClass: plan.lowestClass };
    }
    if (attempt.kind === 'gone') {
      // A probe's too: one that lost the claim to ask a capped hold-off's provider again never went.
      notSent();
      if (attempt.reason === 'credentials') return { kind: 'auth-held', untilMs: attempt.availableAtMs };
      // The retry this attempt would have been was paid for: the one that goes once the target is back uses it.
      if (run.sent > 0) run.retryPaid = true;
      return { kind: 'unavailable', reason: attempt.reason, availableAtMs: attempt.availableAtMs };
    }
    if (attempt.kind === 'expired') {
      // Past the deadline, or aborted in the pool's queue, before it was sent: not an attempt for the log, the metrics or the breaker.
      notSent();
      return { kind: 'failed', result: attempt.result, cls: attempt.cls, retryAfterMs: undefined };
    }
    const { result, cls, durationMs } = attempt;
    // Before any await: a deadline that fires while this attempt is recorded must not cut an answer already begun.
    if (result.stream) ctx.onStreamStarted?.();
    // A retry is counted when it goes upstream, as the provider sees it (x-retry-attempt): one the parking lot released,
    // or one that carried a probe, is a retry too, and a backoff cut short by the client or the deadline sent nothing.
    // Counted at the backoff instead, a fleet's retry count missed the retries an outage parked, the ones it makes most.
    if (retryOf) deps.onRetry?.(ctx.route.name, plan.key, retryOf.reason, run.waitMs);
    // Numbered as sent (x-retry-attempt), not by run.attempts: a failed probe costs none, and shared its number with the next.
    const sentBefore = run.sent++;
    const row = OUTCOME_TABLE[cls.cls];
    const code = failureCode(result);
    ctx.attempts.push({
      target: plan.label,
      attempt: sentBefore,
      reason: cls.reason,
      status: result.status,
      waitMs: run.waitMs,
      ...(attempt.slotWaitMs > 0 && { slotWaitMs: Math.round(attempt.slotWaitMs) }),
      durationMs,
      ...(admission.probe && { probe: true }),
      ...(code !== undefined && { code }),
      ...(result.outcome.kind === 'http' && result.outcome.param !== undefined && { param: result.outcome.param }),
    });
    // A failed probe was the breaker's attempt, lent by a parked request: it costs the request none of its own. A probe
    // the breaker does not judge (a 429 without a wait hint: the provider is there but refusing) is an answer the
    // request got, and costs one: free, it would be sent again at once, parked and released, until the deadline.
    const freeProbe = admission.probe !== undefined && row.breaker === 'failure';
    if (!freeProbe) run.attempts++;
    deps.onAttempt?.(ctx.route.name, plan.key, result, durationMs);
    const hint = result.outcome.kind === 'http' ? result.outcome.hint : undefined;
    let ownHoldOff: number | undefined;
    // The window a stream's success is counted in, for the failure its provider may still make of it (streamBroke).
    const judgedIn = result.stream && { generation: board.current(plan.key).generation, atMs: deps.now() };
    try {
      // Awaited: a transition this outcome causes (the breaker opening) must steer this request's next step.
      ownHoldOff = await recordOutcome(deps.guards, plan, result, cls, durationMs, admission.probe);
    } finally {
      attempt.release();
    }
    // A stream holds its pool slot to its end (slot-attempt.ts; a recovered one, to its break), and a released request
    // holds its place in the lot as long: given back at the first token, the lot released a parked crowd of streams as
    // fast as first tokens came, far faster than slots freed up, and the pool's bounded queue shed the overflow as the
    // provider came back.
    const releasedStream = cls.cls === 'success' ? result.stream : undefined;
    if (releasedStream && ticket) {
      const held = ticket;
      held.streaming();
      releasedStream.whenUpstreamDone(() => held.done());
    } else ticket?.done();
    ticket = undefined;

    if (cls.cls === 'success') {
      // A probe's verdict was its first output: the breaker's round is judged on answers begun, not on how they end.
      if (result.stream) judgeStreamEnd(deps.guards, plan, result.stream, admission.probe ? undefined : judgedIn);
      return { kind: 'ok', result };
    }
    // A wait the client is told lasts to the target's hold-off's end (the one this answer started, its hint plus a spread of
    // up to a tenth, or another's): told only the hint, an SDK invited back came during the hold-off's spread and was turned away again.
    // Past that end, a spread of its own: every client told the same end would come back at once.
    const failed = (retryAfterMs: number | undefined, why?: RetriesStopped): TargetResult & { kind: 'failed' } =>
      (run.lastFailure = { kind: 'failed', result, cls, retryAfterMs: pastHoldOff(retryAfterMs, holdOffUntil(holdOffs, plan), deps.now(), deps.random), ...(why && { why }) });
    if (!maySendAgain(cls, result.outcome, retry.retryOn, ctx.commitsOnSend)) return failed(hint?.delayMs);
    if (run.attempts >= retry.maxAttempts) return failed(hint?.delayMs, 'retries_exhausted');
    // The provider said a repeat will not help (x-should-retry: false): not here; the next target is failover's call.
    // A wait it names is still its word on when one will (a gateway in front says false with the retry-after it means:
    // stormgate's own open breaker, a hold-off): waited out as without the header, or a chain of gateways failed what
    // it used to serve a second later. A failed probe costs the request nothing, this word included.
    if (cls.upstreamNoRetry && hint === undefined && !freeProbe) return failed(undefined, 'upstream_no_retry');
    // A client's own retry the spent budget let through once: the retry it would need now is the one refused, counted
    // here rather than at its first attempt, which needed none when it was answered.
    if (run.noRetries) {
      deps.onBudgetExhausted?.(ctx.route.name, plan.key);
      return failed(hint?.delayMs, 'budget');
    }
    // A silent target (no headers, no first token in time) is not retried when another target can answer.
    if (OUTCOME_TABLE[cls.cls].nextFirst && hasNext) return failed(undefined, 'timeout');
    const decision = decideRetryWait({
      retry,
      hint,
      retryIndex: run.attempts - 1,
      prevDelayMs: run.prevDelayMs,
      nowMs: deps.now(),
      deadlineAtMs: ctx.deadlineAtMs,
      minAttemptMs,
      random: deps.random,
    });
    // A hint too long, or one the time left cannot wait out, is the hint's doing; a backoff that does not fit, the deadline's.
    if (!decision.wait) return failed(decision.retryAfterMs, decision.why === 'deadline' && !hint ? 'deadline' : 'wait_hint');
    // The failure to answer with should the retry go no further: what stops it (the budget, a shed, the target gone
    // meanwhile) names itself below; retries_exhausted is for maxAttempts spent, not for a retry that never went.
    failed(hint?.delayMs);
    // A retry that waits out the provider's wait hint past a hold-off is paced by it: nothing goes to the target until
    // it ends, and what goes then is paced by the pool's limit, restarted at half. It is counted in the budget but not
    // refused: a burst of 429s with retry-after ends as the provider asked, not in 429s the SDK is told not to retry.
    const holdOffEnd = holdOffUntil(holdOffs, plan);
    const paced = decision.fromHint && holdOffEnd !== undefined;
    // The target went away (its breaker opened, someone's hold-off outlasts this wait): the retry waits for it,
    // parked or elsewhere. The hold-off this very answer started is waited out here, like its hint, unless the request
    // leaves for the next target meanwhile, as every newcomer does (leavesUntil): waiting, it took seconds longer than
    // they did (with parking off, 20 s of a primary's retry-after while a healthy backup answered every newcomer).
    // An earlier target it left counts too: the request parks for whichever is back first (a fallback's 3 s hint waited
    // out in place while the primary's 1 s hold-off had long ended). Only here: a silent fallback is still retried
    // while the earlier target is away, since that one may not be back before the deadline.
    const movesOnUntil = hasNext || others.earlier ? leavesUntil(hint, ownHoldOff) : undefined;
    const unavailable: Unavailable | undefined =
      movesOnUntil !== undefined ? { kind: 'unavailable', reason: 'hold-off', availableAtMs: movesOnUntil, own: true } : unavailableNow(ctx, plan, deps, decision.delayMs, ownHoldOff);
    if (unavailable) {
      // Paced, it is paid now; any other is paid when it goes: released by the parking lot, it is paced too (counted,
      // not refused the first time, see the admission above); tried again without parking, it is taken from the budget.
      // One that moves on is paid only if it comes back: the next target answers most of them, and a retry counted for
      // each left the primary's budget spent on retries it never got.
      if (paced && movesOnUntil === undefined) run.retryPaid = await payRetry(ctx, plan, run, deps, true);
      return unavailable;
    }
    // The hold-off this very answer started already has its random spread: waiting to its end keeps the wait within
    // hint x [1, 1.2]. Someone else's longer one gets a spread of its own on top (waitPastHoldOff).
    // Past its end by HOLD_OFF_SLACK_MS: a timer may fire a millisecond early, and the request would find the target
    // still held off after the wait it was told to take.
    const heldForMs = (holdOffEnd ?? 0) - deps.now() + HOLD_OFF_SLACK_MS;
    const delayMs =
      holdOffEnd !== undefined && holdOffEnd === ownHoldOff
        ? Math.max(decision.delayMs, heldForMs)
        : waitPastHoldOff(decision.delayMs, heldForMs, deps.random);
    if (!canWait(deps.now(), delayMs, ctx.deadlineAtMs, minAttemptMs)) return failed(delayMs, hint || holdOffEnd !== undefined ? 'wait_hint' : 'deadline');
    // Draining, the grace end is a deadline for the retry, by the one wait rule: a wait that leaves less than
    // minAttemptMs before it would hold the client (and the exit) to the grace end, only to be cut there with the same
    // 503 gateway_draining. The request gets that answer now, told to come back (to another instance) when the wait is over.
    // The next target takes no wait: it may answer within the grace period.
    const drained = (retryAfterMs: number | undefined): TargetResult & { kind: 'failed' } => {
      if (hasNext) return failed(hint?.delayMs);
      const outcome = abortOutcome(new GatewayShutdown());
      return { kind: 'failed', result: { outcome }, cls: classify(outcome), retryAfterMs };
    };
    if (!graceHolds(ctx, delayMs)) return drained(delayMs);
    if (!(await payRetry(ctx, plan, run, deps, paced))) return { ...run.lastFailure!, why: 'budget' };
    const sleptFromMs = deps.now();
    // A drain that begins during the wait weighs it then (below).
    const waitLeftMs = () => Math.max(0, sleptFromMs + delayMs - deps.now());
    const wake = drainWakes(ctx, waitLeftMs);
    try {
      await deps.sleep(delayMs, wake?.signal ?? ctx.signal);
      ctx.onWaited?.('backoff', delayMs);
    } catch {
      ctx.onWaited?.('backoff', deps.now() - sleptFromMs);
      // Its retry no longer fits before the grace end: the next target now, as once the wait would have been over; with
      // none, the drain's 503 now, told to come back (to another instance) when the wait would have ended.
      if (wake?.woken()) return drained(waitLeftMs());
      const aborted = { outcome: abortOutcome(ctx.signal.reason) };
      // Cut by the drain's grace end: come back (to another instance) when the wait would have ended.
      return { kind: 'failed', result: aborted, cls: classify(aborted.outcome), retryAfterMs: ctx.signal.reason instanceof GatewayShutdown ? waitLeftMs() : undefined };
    } finally {
      wake?.stop();
    }
    // A wait that began before the drain had no grace end to be weighed against: it is weighed now it is over. With
    // less than minAttemptMs left, the attempt would only go upstream to be cut at the grace end.
    if (!graceHolds(ctx, 0)) return drained(undefined);
    if (!decision.fromHint) run.prevDelayMs = decision.delayMs;
    run.waitMs = delayMs;
    run.retryPaid = true;
  }
}

/**
 * Draining, the one wait rule with the grace end for a deadline: whether a wait of `waitMs` from now leaves minAttemptMs
 * for an attempt before the grace period is over (always, when the instance is not draining). Weighed again once a wait
 * is over (waitMs 0): one that began before SIGTERM had no grace end to be weighed against.
 */
export function graceHolds(ctx: RequestContext, waitMs: number): boolean {
  const graceLeftMs = ctx.graceLeftMs?.();
  return graceLeftMs === undefined || canWait(0, waitMs, graceLeftMs, ctx.route.config.minAttemptMs);
}

/** The reason a backoff is woken with when the drain's start finds its retry past the grace end (drainWakes). */
const WOKEN_BY_DRAIN = Symbol('woken by the drain');

/**
 * For a backoff begun before SIGTERM: the signal it sleeps on, which follows the request's own and is aborted too when
 * the drain begins and the wait left (`waitLeftMs`) no longer fits before the grace end (graceHolds, the one rule).
 * Weighed only once over, the wait was slept out (1.2 s and more) while a backup could have answered at once, spending
 * the grace the request had left; with no backup, the client waited for the same 503 gateway_draining, and the
 * instance's exit with it. Undefined while draining already (the wait was weighed before it began) or outside a
 * drainable server.
 */
function drainWakes(ctx: RequestContext, waitLeftMs: () => number): { signal: RequestSignal; woken: () => boolean; stop: () => void } | undefined {
  if (ctx.onDrainStart === undefined || ctx.graceLeftMs?.() !== undefined) return undefined;
  const wake = new RequestAbort();
  const follow = () => wake.abort(ctx.signal.reason);
  if (ctx.signal.aborted) follow();
  else ctx.signal.addEventListener('abort', follow, { once: true });
  const stopWatching = ctx.onDrainStart(() => {
    if (!graceHolds(ctx, waitLeftMs())) wake.abort(WOKEN_BY_DRAIN);
  });
  return {
    signal: wake,
    woken: () => wake.reason === WOKEN_BY_DRAIN,
    stop: () => {
      ctx.signal.removeEventListener('abort', follow);
      stopWatching();
    },
  };
}

/** The request field a family's refusal names, when the family says (a translator's `param`). */
function paramOf(prepared: Prepared & { ok: false }): { param?: string } {
  const param = 'param' in prepared ? prepared.param : undefined;
  return typeof param === 'string' ? { param } : {};
}

/**
 * Pays now for the retry of a request that waited out, outside the parking lot, the hold-off its own answer started
 * (serve-targets.ts): paced, as the same wait taken before it left would have been.
 */
export async function payWaitedOutRetry(ctx: RequestContext, plan: TargetPlan, run: TargetRun, deps: TargetDeps): Promise<void> {
  // Once: a wait that found the target held off still (the hold-off's end read a millisecond late) pays nothing more.
  if (!run.retryPaid) run.retryPaid = await payRetry(ctx, plan, run, deps, true);
}

/** Pays for a retry: one paced by a hold-off is counted in the budget and always allowed; any other is taken from it. */
async function payRetry(ctx: RequestContext, plan: TargetPlan, run: TargetRun, deps: TargetDeps, paced: boolean): Promise<boolean> {
  if (!paced) return takeRetry(ctx, plan, run, deps);
  await deps.guards.budget.countRetry(plan.budgetKey, ctx.route.config.budget);
  return true;
}

async function takeRetry(ctx: RequestContext, plan: TargetPlan, run: TargetRun, deps: TargetDeps): Promise<boolean> {
  const failure = run.lastFailure?.cls.cls;
  const providerAtLimit = failure !== undefined && OUTCOME_TABLE[failure].limit === 'rate-limited';
  if (await deps.guards.budget.tryRetry(plan.budgetKey, ctx.route.config.budget, providerAtLimit)) return true;
  deps.onBudgetExhausted?.(ctx.route.name, plan.key);
  return false;
}

/**
 * The target went away with a retry of this request due (held off, its breaker open): should the request end without
 * coming back for it (the hold-off too long, the deadline too near, parking off), its failure says why the retry never
 * went. Told `retries_exhausted`, the log line said maxAttempts were spent after one attempt.
 */
function heldBackRetry(run: TargetRun, unavailable: Unavailable): void {
  if (run.lastFailure) run.lastFailure.why = unavailable.reason === 'breaker' ? 'breaker_open' : 'held_off';
}

/** How long a probe permit outlives its attempt's own limit, for the verdict to be written. */
const PERMIT_GRACE_MS = 500;

function unavailableNow(ctx: RequestContext, plan: TargetPlan, deps: TargetDeps, waitMs: number, ownHoldOffUntil: number | undefined): Unavailable | undefined {
  const heldUntil = holdOffUntil(deps.guards.holdOffs, plan);
  if (heldUntil !== undefined && heldUntil > (ownHoldOffUntil ?? deps.now() + waitMs)) return { kind: 'unavailable', reason: 'hold-off', availableAtMs: heldUntil };
  // An open breaker lets nothing through but the parking lot's probes, however soon a parked request may probe: the
  // retry waits for them in the lot (and is paid when the lot releases it), rather than be taken from the budget now
  // only to be refused admission after its backoff. A request that may park is told when it may probe.
  if (deps.guards.board.availability(plan.key, plan.breaker, false).kind !== 'open') return undefined;
  const a = deps.guards.board.availability(plan.key, plan.breaker, ctx.parkable);
  return { kind: 'unavailable', reason: 'breaker', availableAtMs: availableAtMs(a, deps.now()) };
}

/**
 * A request's first attempt on a target is a request, not a retry, for the budget; unless the client says it is
 * retrying on its own (x-stainless-retry-count > 0): then it counts as a retry, and when the budget is spent it is
 * served once but never retried by the gateway.
 */
async function countFirstAttempt(ctx: RequestContext, plan: TargetPlan, run: TargetRun, deps: TargetDeps): Promise<void> {
  const { budget } = deps.guards;
  if (ctx.clientRetries > 0 && ctx.attempts.length === 0) {
    if (!(await budget.countRetry(plan.budgetKey, ctx.route.config.budget))) run.noRetries = true;
    return;
  }
  budget.countRequest(plan.budgetKey, ctx.route.config.budget);
}
