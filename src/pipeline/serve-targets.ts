// The targets of one request, in order: the primary, then the fallbacks. A target that is unavailable (breaker open,
// hold-off), full (shed) or held for refused credentials is passed over at once; one that failed after its retries
// hands over to the next. When no target can take the request, it parks on the one expected back first, if the one
// wait rule allows it, and is tried again when released. A context_length_exceeded answer goes to the route's
// contextWindowFallback, if any.
// The first target in order that judges the request has the last word on it: the primary's rejection (400, 404, 422,
// context too long) ends the request, whatever happened before (a park included). A 404 from a target that sends a
// model of its own is no such verdict: the name is the operator's (a retired model), so the next target is tried.
// A fallback that rejects the request after an earlier target in order was down (failed, breaker open, held off, held
// for its credentials, shed) speaks about its own limits or translation, not about a request the primary might well
// have taken: the client gets the earlier failure, with the rejection as a note, never a 4xx telling it to change its
// request.
import type { ParkConfig } from '../config/schema.ts';
import { canWait } from '../policy/retry-wait.ts';
import { HOLD_OFF_SLACK_MS, waitsOutOwnHoldOff } from '../policy/hold-off-wait.ts';
import type { AttemptResult } from './attempt.ts';
import { GatewayShutdown, abortOutcome } from './abort-reasons.ts';
import { classify, mayHaveRun, maySendAgain, OUTCOME_TABLE } from '../policy/outcome.ts';
import type { ParkingLot, Ticket } from './parking-lot.ts';
import { graceHolds, heldBack, newRun, payWaitedOutRetry, tryTarget, type OtherTargets, type RequestContext, type SkippedTarget, type TargetDeps, type TargetPlan, type TargetResult } from './target-attempts.ts';

/** Whether the request ended with an upstream's verdict on the request itself (passed on without notes). */
export function endedWithVerdict(served: Served): boolean {
  return served.kind === 'failed' && OUTCOME_TABLE[served.failure.cls.cls].verdict;
}

/**
 * Did it end with a verdict on the client's own request (its outcome `invalid_request`)? Not a 404 for a target's own
 * model (a retired model, a deleted deployment): that name is the operator's, and every request of the route gets it.
 * Nor a 404 for a URL the provider does not have (a wrong `baseUrl`): the operator's too.
 */
export function endedWithClientVerdict(served: Served): boolean {
  if (served.kind !== 'failed' || !OUTCOME_TABLE[served.failure.cls.cls].verdict) return false;
  const { outcome } = served.failure.result;
  return !ownModelNotFound(served.plan, served.failure) && !(outcome.kind === 'http' && outcome.unknownUrl);
}

export const FALLBACK_REASONS = [
  'retries_exhausted',
  'budget',
  'wait_hint',
  'deadline',
  'timeout',
  'credentials',
  'redirect',
  'error',
  'breaker_open',
  'held_off',
  'shed',
  'context_length',
  'upstream_no_retry',
] as const;
export type FallbackReason = (typeof FALLBACK_REASONS)[number];

type Failure = TargetResult & { kind: 'failed' };

/** A fallback that rejected the request after an earlier target failed for availability: a note on the answer. */
interface Rejection {
  plan: TargetPlan;
  failure: Failure;
}

export type Served = (
  | { kind: 'ok'; plan: TargetPlan; result: AttemptResult; fallback: FallbackReason | undefined }
  | { kind: 'failed'; plan: TargetPlan; failure: Failure }
  | { kind: 'unavailable'; plan: TargetPlan; reason: 'breaker' | 'hold-off'; availableAtMs: number }
  | { kind: 'park-full'; plan: TargetPlan; availableAtMs: number }
  | { kind: 'shed'; plan: TargetPlan; shed: TargetResult & { kind: 'shed' } }
  | { kind: 'closing'; plan: TargetPlan }
  /** The provider refused the gateway's credentials lately and no other target could answer. */
  | { kind: 'auth-held'; plan: TargetPlan; untilMs: number }
  /** No target could even be tried: each one's family cannot express the request as sent (`skips` say why). */
  | { kind: 'no-target'; plan: TargetPlan; skips: SkippedTarget[] }
) & { rejected?: Rejection };

export interface ServeDeps extends TargetDeps {
  lot: ParkingLot;
  onFallback?: (route: string, from: string, to: string, reason: FallbackReason) => void;
}

type Failed = Served & { kind: 'failed' };

/**
 * Why a target cannot take the request now. `pacing`: nothing holds the target any more (no hold-off, its breaker
 * closed), but requests parked before this one are still being let go at its adaptive limit: the wait is for capacity.
 */
type Blocked = { plan: TargetPlan; reason: 'breaker' | 'hold-off' | 'pacing'; availableAtMs: number; own?: true };

export async function serveTargets(
  ctx: RequestContext,
  plans: TargetPlan[],
  contextFallback: TargetPlan | undefined,
  park: ParkConfig | false,
  deps: ServeDeps,
): Promise<Served> {
  const runs = plans.map(() => newRun());
  /**
   * The end of the hold-off each target's answer to this request started, once it left for it: looked at again (every
   * target is, after a release that left others unlooked), the target is held off by that same hold-off, still its own.
   */
  const ownHoldOffs: Array<number | undefined> = plans.map(() => undefined);
  /** The failure to answer with: the latest a target ended with (a fallback's rejection after an outage aside). */
  let lastFailure: Failed | undefined;
  let shed: Served | undefined;
  let authHeld: Served | undefined;
  let rejected: Rejection | undefined;
  /** The first target (by its index in `plans`) that was down, full, held or failed: a later one's rejection is not the client's fault. */
  let firstDown = Number.POSITIVE_INFINITY;
  const markDown = (i: number): void => {
    firstDown = Math.min(firstDown, i);
  };
  const downBefore = (at: number): boolean => firstDown < at;
  const skips: SkippedTarget[] = [];
  let released: { index: number; ticket: Ticket } | undefined;
  /**
   * Time spent parked so far: `park.maxWaitMs` bounds the request's whole wait, not each one. A request released to a
   * probe that failed parks again; given a fresh limit each time, one waited to its deadline (18 s with a 10 s limit).
   */
  let parkedMs = 0;
  let left: { plan: TargetPlan; reason: FallbackReason } | undefined;
  let fallback: FallbackReason | undefined;
  // A hand-over is recorded only to a target after the first: a parked request that goes back to the primary is not
  // a fallback, whichever target it tried last.
  // It is counted once the request went to that target: one found held off, with its breaker open, its pool full or
  // unable to express the request was sent nothing, and counting it made stormgate_fallbacks_total{to} promise the
  // backup traffic it never got (in a chaos run, 556 hand-overs for 331 requests the backup saw).
  // A hand-over to a target found unavailable is owed until the request is sent there: parked for that target and
  // released to it, the request comes back with `left` naming that very target, and the hand-over was never counted.
  // Kept per target: a request that finds the backup and then a third target unavailable owes both hand-overs, and
  // released to the backup it was counted from the third (and with the third's reason), a target it was never sent to.
  const owed = new Map<TargetPlan, { plan: TargetPlan; reason: FallbackReason }>();
  /**
   * The last target the request was sent to, and why it left it: where a pass starts again (released or moved from the
   * lot, a last look, a wait outside it) the request comes from there, not from the last target the pass before looked
   * at, which may be one after it in order, found unavailable and never sent anything.
   */
  let lastSent: { plan: TargetPlan; reason: FallbackReason } | undefined;
  const leave = (plan: TargetPlan, reason: FallbackReason): void => {
    left = { plan, reason };
    if (runs[plans.indexOf(plan)]!.sent > 0) lastSent = left;
  };
  /**
   * The request's wait in the lot ran out (its last chance before its deadline, or park.maxWaitMs): it looks at every
   * target once more, and parks no more. Parked for the target expected back first, it is told when another comes
   * back (`moved`), or sent to carry the probe of one only probing; without this last look, a backup merely half-open,
   * which no newcomer probed, found 25 of 30 parked requests ending in 503 circuit_open at their deadlines.
   */
  let lastLook = false;
  /**
   * What bounded the request's last wait in the lot, when it ran out: its deadline, or the route's park.maxWaitMs. One
   * whose maxWaitMs ran out behind the requests being let go after a hold-off, 20 s before its deadline, was counted as a
   * deadline shed and told no slot could come before its deadline.
   */
  let waitBound: 'deadline' | 'max_wait' = 'deadline';
  /** How long the request was parked before the lot moved it to a target that came back, until an attempt shows it. */
  let movedWaitMs: number | undefined;
  /**
   * The key of the target the lot moved the request to carry a probe for (ParkResult `moved`'s probe), for its next
   * park: with the breaker open, that probe is a parked request's, and the request parks for that target even when
   * another (the primary, its own probe out) says it is probing too. Parked for the primary again, it waited there,
   * and the lot moved one request a second in a loop until the backup's openS was over.
   */
  let probeFor: string | undefined;
  /** The target a request going to `plan` is handed over from, if it is a fallback at all. */
  const handedFrom = (plan: TargetPlan) => (plan === plans[0] ? undefined : left && left.plan !== plan ? left : owed.get(plan));
  const attempt = async (plan: TargetPlan, run: ReturnType<typeof newRun>, others: OtherTargets, ticket?: Ticket) => {
    const from = handedFrom(plan);
    if (from) notePassedOver(from);
    const sentBefore = run.sent;
    // Moved from the lot: the time parked is the wait before the first attempt it leads to, wherever that goes.
    if (movedWaitMs !== undefined) run.waitMs = movedWaitMs;
    const r = await tryTarget(ctx, plan, run, deps, others, ticket);
    if (run.sent > sentBefore) movedWaitMs = undefined;
    // The log's `skipped` lists the targets left without an attempt: one passed over earlier (down when the request
    // first came, back when it came again, from the lot) is no longer one.
    if (run.sent > sentBefore) forgetSkipped(ctx, plan);
    if (run.sent > sentBefore) owed.delete(plan);
    if (from && run.sent > sentBefore) {
      deps.onFallback?.(ctx.route.name, from.plan.key, plan.key, from.reason);
      fallback = from.reason;
    } else if (from && r.kind === 'unavailable') {
      notePassedOver({ plan, reason: r.reason === 'breaker' ? 'breaker_open' : 'held_off' });
      owed.set(plan, from);
    }
    return r;
  };
  /** A target left without an attempt (its breaker open, its provider holding requests off) is named in the log line. */
  const notePassedOver = ({ plan, reason }: { plan: TargetPlan; reason: FallbackReason }) => {
    const why = reason === 'breaker_open' ? 'circuit breaker open' : reason === 'held_off' ? 'held off: the provider asked for a pause' : undefined;
    if (why && !ctx.attempts.some((a) => a.target === plan.label) && !ctx.skipped.some((s) => s.target === plan.label)) ctx.skipped.push({ target: plan.label, reason: why });
  };
  /**
   * The request ends without an attempt on the targets that held it back (its only target's breaker open, a hold-off):
   * the log line names them as it names a fallback's passed-over targets, or it says `unavailable` and nothing of why.
   */
  const noteBlocked = (blocked: Blocked[]): void => {
    for (const b of blocked) {
      if (b.reason !== 'pacing') {
        notePassedOver({ plan: b.plan, reason: b.reason === 'breaker' ? 'breaker_open' : 'held_off' });
        continue;
      }
      // Back, but its parked requests still being let go: what held the request there last is capacity, whatever
      // held it when it first passed the target over (a hold-off since ended).
      if (ctx.attempts.some((a) => a.target === b.plan.label)) continue;
      const i = ctx.skipped.findIndex((s) => s.target === b.plan.label);
      const skip = { target: b.plan.label, reason: PACING_WHY };
      if (i >= 0) ctx.skipped[i] = skip;
      else ctx.skipped.push(skip);
    }
  };
  const ok = (plan: TargetPlan, result: AttemptResult): Served => ({ kind: 'ok', plan, result, fallback: plan === plans[0] ? undefined : fallback });
  // Whatever the request ends with carries the fallback's rejection, if there was one: not a success, and not a verdict
  // on the request (the rejection itself, or the primary's own 400, 404, 422, context length or content policy).
  const end = (served: Served): Served =>
    rejected && served.kind !== 'ok' && !endedWithVerdict(served) ? { ...served, rejected } : served;
  /**
   * The failure to end with when no target answered: the latest failure, else a credential hold, else a shed, else
   * `otherwise`, made only when it is the answer (making a shed counts it).
   */
  const worst = (otherwise: () => Served): Served => end(lastFailure ?? authHeld ?? shed ?? otherwise());
  /**
   * The request left a target for the hold-off its own answer started (leavesUntil), and no other target answered; it
   * cannot park for that target (parking off, a hold-off longer than park.maxWaitMs): it waits the rest out itself, as
   * it would have had it stayed, and its retry there is paced as that wait's would have been. `cannot`: the wait does
   * not fit before the deadline or the drain's grace end.
   */
  const waitOutOwnHoldOff = async (own: Blocked): Promise<'back' | 'cannot' | Served> => {
    const startMs = deps.now();
    const waitMs = Math.max(0, own.availableAtMs - startMs) + HOLD_OFF_SLACK_MS;
    const { minAttemptMs } = ctx.route.config;
    if (!canWait(startMs, waitMs, ctx.deadlineAtMs, minAttemptMs) || !graceHolds(ctx, waitMs)) return 'cannot';
    const index = plans.indexOf(own.plan);
    const endedBy = (reason: unknown): Served => {
      const result = { outcome: abortOutcome(reason) };
      return { kind: 'failed', plan: own.plan, failure: { kind: 'failed', result, cls: classify(result.outcome), retryAfterMs: undefined } };
    };
    try {
      await deps.sleep(waitMs, ctx.signal);
    } catch {
      return endedBy(ctx.signal.reason);
    } finally {
      ctx.onWaited?.('backoff', deps.now() - startMs);
    }
    // A wait that began before SIGTERM is weighed against the grace end now it is over, as a backoff's is
    // (target-attempts.ts): with less than minAttemptMs left, the attempt would only be cut there. The same answer as
    // a wait the grace end cut.
    if (!graceHolds(ctx, 0)) return endedBy(new GatewayShutdown());
    runs[index]!.waitMs = deps.now() - startMs;
    await payWaitedOutRetry(ctx, own.plan, runs[index]!, deps);
    return 'back';
  };
  for (;;) {
    // A pass starts at the first target again: the request comes from the last one it was sent to.
    left = lastSent;
    const blocked: Blocked[] = [];
    /** Whether this pass left targets unlooked at (it was for the one the lot released): the next pass does. */
    let unlooked = false;
    for (let i = 0; i < plans.length; i++) {
      const plan = plans[i]!;
      const run = runs[i]!;
      if (run.done) continue;
      if (released && released.index !== i) {
        unlooked = true;
        continue;
      }
      // Parked requests go first, in deadline order: a newcomer queues behind them, for what holds them (its real end,
      // so the one wait rule and the answer, should it not wait, say the truth).
      // A route that neither starts nor obeys hold-offs (count_tokens: TargetPlan.sharesHoldOffs), with an adaptive limit
      // of its own, queues behind them only for the breaker: behind /v1/messages requests parked for a hold-off (one
      // queue per target), it waited that hold-off out.
      const holding = !released && park && deps.lot.waiting(plan.holdOffKey, plan.cls) > 0 ? whatHolds(plan, ctx.parkable, deps) : undefined;
      if (holding && (plan.sharesHoldOffs || holding.reason === 'breaker')) {
        blocked.push({ plan, ...holding });
        // Queued behind the backup's parked requests after the primary went away, the request owes that hand-over as
        // one that found the backup unavailable does: released to it, it was answered by the backup with no fallback
        // counted (58 of 3,080 in a brownout with both breakers open).
        const from = handedFrom(plan);
        if (from) owed.set(plan, from);
        leave(plan, holding.reason === 'hold-off' ? 'held_off' : holding.reason === 'pacing' ? 'shed' : 'breaker_open');
        markDown(i);
        continue;
      }
      const ticket = released?.ticket;
      released = undefined;
      const failedBefore = run.lastFailure;
      let r: TargetResult;
      let streaming = false;
      const others = { later: runs.slice(i + 1).some((n) => !n.done), earlier: runs.slice(0, i).some((n) => !n.done) };
      try {
        r = await attempt(plan, run, others, ticket);
        streaming = r.kind === 'ok' && r.result.stream !== undefined;
      } finally {
        // A released request gives its place in the lot back however the target answered (a throw included); a stream
        // gives it back when it ends (target-attempts.ts).
        if (!streaming) ticket?.done();
      }
      if (r.kind === 'ok') return ok(plan, r.result);
      if (r.kind === 'unavailable') {
        if (r.own) ownHoldOffs[i] = r.availableAtMs;
        const own = r.own ?? (r.reason === 'hold-off' && r.availableAtMs <= (ownHoldOffs[i] ?? Number.NEGATIVE_INFINITY) ? true : undefined);
        blocked.push({ plan, reason: r.reason, availableAtMs: r.availableAtMs, ...(own && { own }) });
        // It failed before it went away (a failed probe, a breaker that opened during the retries, on that very failure
        // perhaps). Should the request end without an answer, it ends with this failure: it went upstream, and a
        // load_shed or hold-off from a target it never reached would invite the SDK to send it all over again.
        if (run.lastFailure && run.lastFailure !== failedBefore) lastFailure = { kind: 'failed', plan, failure: run.lastFailure };
        leave(plan, r.reason === 'breaker' ? 'breaker_open' : 'held_off');
        markDown(i);
        continue;
      }
      run.done = true;
      if (r.kind === 'skipped') {
        const skip = { target: plan.label, reason: r.reason, ...(r.param !== undefined && { param: r.param }) };
        ctx.skipped.push(skip);
        skips.push(skip);
        continue;
      }
      if (r.kind === 'auth-held') {
        // Never parked for and never retried: a refused key comes back only when someone fixes the configuration.
        authHeld ??= { kind: 'auth-held', plan, untilMs: r.untilMs };
        const refused = deps.guards.holdOffs.credentialsHeldFor(plan.key) === undefined ? "the gateway's credentials or billing" : 'the location the gateway calls from';
        ctx.skipped.push({ target: plan.label, reason: `held for ${Math.ceil((r.untilMs - deps.now()) / 1000)} s more: the provider refused ${refused}` });
        leave(plan, 'credentials');
        markDown(i);
        continue;
      }
      if (r.kind === 'shed') {
        // The provider's pool is full for this request's class: another provider may have room. Shed by all, the client
        // is told the soonest any of them expects a turn for it: told the first's, it came back after the primary's
        // 20 s wait where the backup had room in 2.
        if (shed?.kind !== 'shed' || r.retryAfterMs < shed.shed.retryAfterMs) shed = { kind: 'shed', plan, shed: r };
        leave(plan, 'shed');
        markDown(i);
        continue;
      }
      if (r.cls.cls === 'context-length' && contextFallback && plan !== contextFallback) {
        leave(plan, 'context_length');
        const c = await attempt(contextFallback, newRun(), { later: false, earlier: false });
        if (c.kind === 'ok') return ok(contextFallback, c.result);
        if (c.kind === 'skipped') ctx.skipped.push({ target: contextFallback.label, reason: c.reason });
        const last: Failed = c.kind === 'failed' ? { kind: 'failed', plan: contextFallback, failure: c } : { kind: 'failed', plan, failure: r };
        if (!downBefore(i) || OUTCOME_TABLE[last.failure.cls.cls].failover !== 'reject') return end(last);
        rejected ??= { plan: last.plan, failure: last.failure };
        leave(plan, 'error');
        continue;
      }
      if (ownModelNotFound(plan, r)) {
        // The operator's model name, not the client's (a retired model, a deleted Azure deployment): that target is
        // out of service for this route, and the next one may well answer the request as it is. After an earlier
        // target was down it is a fallback's rejection like any other: taken as the last failure, the 404 (a backup
        // server with no /v1/responses, say) hid the primary's 503 and told the client its valid request was not found.
        if (downBefore(i)) rejected ??= { plan, failure: r };
        else lastFailure = { kind: 'failed', plan, failure: r };
        leave(plan, 'error');
        markDown(i);
        continue;
      }
      if (downBefore(i) && fallbacksOwnLimit(r)) {
        // A fallback's limits, not the client's mistake: the request moves on (or parks for the target that was down).
        rejected ??= { plan, failure: r };
        leave(plan, 'error');
        continue;
      }
      lastFailure = { kind: 'failed', plan, failure: r };
      if (OUTCOME_TABLE[r.cls.cls].failover !== 'next') return end(lastFailure);
      // A request the provider may already have run goes to the next target only with the route's consent to run it
      // twice: a route that leaves `timeout` out of retryOn (it creates something) gets no second run anywhere; nor does
      // a request that commits at the provider as it is taken (maySendAgain).
      if (mayHaveRun(r.result.outcome) && !maySendAgain(r.cls, r.result.outcome, plan.retry.retryOn, ctx.commitsOnSend)) return end(lastFailure);
      leave(plan, r.why ?? OUTCOME_TABLE[r.cls.cls].fallback);
      markDown(i);
    }
    released?.ticket.done();
    released = undefined;
    // The target released for gave no answer (a fallback's rejection, or it is unavailable again): the others, down
    // when the request parked, are looked at again before it ends or parks again; they may be back sooner.
    if (unlooked) continue;
    if (blocked.length === 0) return worst(() => rejectedAsFailure(rejected) ?? { kind: 'no-target', plan: plans[0]!, skips });
    const probing = probeFor === undefined ? undefined : blocked.find((b) => b.plan.holdOffKey === probeFor && b.reason === 'breaker' && b.availableAtMs <= deps.now());
    probeFor = undefined;
    const first = probing ?? blocked.reduce((a, b) => (b.availableAtMs < a.availableAtMs ? b : a));
    // Behind parked requests the lot is letting go, the request waited for a slot: when none comes in time it is shed
    // (the provider at capacity, a wait to come back after), not told of a breaker that never opened. Made only when
    // it is the answer: the shed is counted then, not for every request that parks behind the release and is served
    // (one instance of a fleet counted 159 sheds through a 429 storm in which no client was shed).
    const unavailableAt = (b: Blocked) => (): Served =>
      b.reason === 'pacing'
        ? { kind: 'shed', plan: b.plan, shed: { kind: 'shed', reason: waitBound, retryAfterMs: b.plan.pool.shedWaiting(b.plan.cls, b.plan.limitKey, ctx.client, ctx.tokens, waitBound), className: b.plan.className, lowestClass: b.plan.lowestClass } }
        : { kind: 'unavailable', plan: b.plan, reason: b.reason, availableAtMs: b.availableAtMs };
    const unavailable = unavailableAt(first);
    const now = deps.now();
    const waitMs = Math.max(0, first.availableAtMs - now);
    // A hold-off is the provider's own wait hint: parked or retrying, the route waits out at most maxWaitHintMs of it.
    // The one this request's own answer started was judged by its hint, which the retry policy accepted: its spread
    // (up to a tenth more) must not turn the wait the request left to come back for into a refusal.
    const hintTooLong = first.reason === 'hold-off' && !first.own && waitMs > first.plan.retry.maxWaitHintMs;
    const own = blocked.find((b) => b.own);
    if (own && waitsOutOwnHoldOff(park, own.availableAtMs - now, parkedMs)) {
      const outcome = await waitOutOwnHoldOff(own);
      if (outcome === 'back') continue;
      if (outcome !== 'cannot') return end(outcome);
    }
    if (!park || lastLook || hintTooLong || !canWait(now, waitMs, ctx.deadlineAtMs, ctx.route.config.minAttemptMs)) {
      noteBlocked(blocked);
      return worst(unavailable);
    }
    const maxWaitMs = park.maxWaitMs === undefined ? undefined : Math.max(0, park.maxWaitMs - parkedMs);
    // The lot's own choice of timer (parking-lot.ts: the sooner of maxWaitMs and the deadline less minAttemptMs).
    waitBound = maxWaitMs !== undefined && maxWaitMs < ctx.deadlineAtMs - ctx.route.config.minAttemptMs - now ? 'max_wait' : 'deadline';
    const parked = await deps.lot.park(first.plan.holdOffKey, {
      route: ctx.route.name,
      deadlineAtMs: ctx.deadlineAtMs,
      signal: ctx.signal,
      maxQueue: park.maxQueue,
      maxWaitMs,
      minAttemptMs: ctx.route.config.minAttemptMs,
      cls: first.plan.cls,
      client: ctx.client,
      ...(ctx.bodyBytes !== undefined && { bodyBytes: ctx.bodyBytes, lowestClass: first.plan.cls > 0 && first.plan.lowestClass }),
      // A target that is probing may still have no permit for this request (others hold them, here or on another
      // instance): it waits for them rather than be released at once, refused, and parked again in a loop.
      ...(first.availableAtMs > now && { notBeforeMs: first.availableAtMs }),
      alternates: blocked.filter((b) => b !== first && b.reason !== 'pacing').map((b) => b.plan.holdOffKey),
    });
    // Only a wait that ran out is what bounded the request: after any other, a later shed is its deadline's.
    if (parked.kind !== 'timeout') waitBound = 'deadline';
    const waited = deps.now() - now;
    parkedMs += waited;
    ctx.onWaited?.('parked', waited);
    // A request that ends here names the targets that held it back (noteBlocked); one that goes on is noted later.
    switch (parked.kind) {
      case 'released':
        released = { index: plans.indexOf(first.plan), ticket: parked.ticket };
        // The log's attempt record shows the time parked as the wait before the attempt it leads to.
        runs[released.index]!.waitMs = deps.now() - now;
        break;
      case 'moved':
        // Another target came back (or may be probed, and this request is to carry the probe) while the one it parked
        // for is still away: every target is looked at again. Not noted now: the backup that then answered it would be
        // named as passed over. A probe the backup's breaker gives only to parked requests (open, before openS is
        // over) it takes by parking for the backup, which releases it at once with the probe slot free.
        movedWaitMs = waited;
        probeFor = parked.probe;
        break;
      case 'full':
        noteBlocked(blocked);
        // A request that already went upstream ends with what it got there, not with an invitation to come back.
        return end(lastFailure ?? { kind: 'park-full', plan: first.plan, availableAtMs: first.availableAtMs });
      case 'closing':
        noteBlocked(blocked);
        return end({ kind: 'closing', plan: first.plan });
      case 'timeout':
        if (blocked.length === 1) {
          // Answered for what holds the target now, not when the request parked: a hold-off that has ended since (the
          // request then waited behind the release at the target's limit) is a shed, not `provider_held_off` "for
          // another 1 s", and a breaker that reopened after a failed probe tells its new probe time.
          const holdsNow = { plan: first.plan, ...whatHolds(first.plan, ctx.parkable, deps) };
          noteBlocked([holdsNow]);
          return worst(unavailableAt(holdsNow));
        }
        // Other targets to look at once more: that last look notes them as they are then. Noted now, a target whose
        // hold-off ended as the wait did (the request then pacing behind the release) was named held off.
        lastLook = true;
        break;
      case 'aborted': {
        noteBlocked(blocked);
        const result = { outcome: abortOutcome(ctx.signal.reason) };
        return end({ kind: 'failed', plan: first.plan, failure: { kind: 'failed', result, cls: classify(result.outcome), retryAfterMs: undefined } });
      }
    }
  }
}

function forgetSkipped(ctx: RequestContext, plan: TargetPlan): void {
  const i = ctx.skipped.findIndex((s) => s.target === plan.label);
  if (i >= 0) ctx.skipped.splice(i, 1);
}

/** A target left at the end because the requests parked for it before this one were still being let go at its limit. */
const PACING_WHY = 'at capacity: the requests parked for it before this one were still being let go at its limit';

/**
 * Why a target with parked requests is unavailable, and until when: its hold-off, else its breaker, else (back, its
 * parked requests being released at its limit) the lot's pacing, now.
 */
function whatHolds(plan: TargetPlan, parkable: boolean, deps: ServeDeps): Omit<Blocked, 'plan'> {
  return heldBack(deps.guards, plan, parkable, deps.now()) ?? { reason: 'pacing', availableAtMs: deps.now() };
}

/**
 * A 404 from a target that sends a model of its own in place of the client's, or a 400 that names the model
 * (Together's `model_not_available` for a model that needs a dedicated endpoint; Azure's `OperationNotSupported` for
 * a deployment whose model does not serve the API asked, as a Responses-only one): it names no fault of the request
 * (the client never chose that name) but the target's configuration, like a redirect or a refused key.
 */
function ownModelNotFound(plan: TargetPlan, r: Failure): boolean {
  const { outcome } = r.result;
  if (!plan.ownModel || outcome.kind !== 'http') return false;
  // A 404 that names another field (an `input` item not kept under store: false) is the client's reference, which the
  // next target does not have either.
  return (outcome.status === 404 && outcome.param === undefined) || (outcome.status === 400 && outcome.errorCode !== null && MODEL_UNAVAILABLE_CODES.has(outcome.errorCode));
}

/** Codes that say the model named cannot be used here, whatever the status. */
const MODEL_UNAVAILABLE_CODES: ReadonlySet<string> = new Set(['model_not_found', 'model_not_available', 'OperationNotSupported']);

/**
 * A verdict on the request that, from a fallback after an earlier target was down, speaks of that fallback's own limits:
 * a rejection (400, 422, context too long), or one that hands over to the next target (a request larger than its
 * token limit per minute: told "the input or output tokens must be reduced", the client cut a request the primary
 * takes once back). A safety decision (content policy) ends the request wherever it comes from.
 */
function fallbacksOwnLimit(r: Failure): boolean {
  const row = OUTCOME_TABLE[r.cls.cls];
  return row.failover === 'reject' || (row.verdict && row.failover === 'next');
}

function rejectedAsFailure(rejected: Rejection | undefined): Failed | undefined {
  return rejected && { kind: 'failed', plan: rejected.plan, failure: rejected.failure };
}
