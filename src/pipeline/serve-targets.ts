// The targets of one request, in order: the primary, then the fallbacks. A target that is unavailable (breaker open,
// hold-off) or full (shed) is passed over at once; one that failed after its retries hands over to the next. When no
// target can take the request, it parks on the one expected back first, if the one wait rule allows it, and is tried
// again when released. A context_length_exceeded answer goes to the route's contextWindowFallback, if any.
import type { ParkConfig } from '../config/schema.ts';
import { canWait } from '../policy/retry-wait.ts';
import { abortOutcome, type AttemptResult } from './attempt.ts';
import { classify } from '../policy/outcome.ts';
import type { ParkingLot, Ticket } from './parking-lot.ts';
import { newRun, tryTarget, type RequestContext, type TargetDeps, type TargetPlan, type TargetResult } from './target-attempts.ts';

/** Outcome classes that end the request: the client's own mistakes, a safety decision, a disconnect or the deadline. */
const ENDS_REQUEST = new Set(['aborted', 'client-error', 'context-length', 'content-policy']);

export type FallbackReason =
  | 'retries_exhausted'
  | 'budget'
  | 'wait_hint'
  | 'timeout'
  | 'credentials'
  | 'error'
  | 'breaker_open'
  | 'held_off'
  | 'shed'
  | 'context_length';

export type Served =
  | { kind: 'ok'; plan: TargetPlan; result: AttemptResult; fallback: FallbackReason | undefined }
  | { kind: 'failed'; plan: TargetPlan; failure: TargetResult & { kind: 'failed' } }
  | { kind: 'unavailable'; plan: TargetPlan; reason: 'breaker' | 'hold-off'; availableAtMs: number }
  | { kind: 'park-full'; plan: TargetPlan; availableAtMs: number }
  | { kind: 'shed'; plan: TargetPlan; shed: TargetResult & { kind: 'shed' } }
  | { kind: 'closing'; plan: TargetPlan }
  /** No target could even be tried: each one's family cannot express the request. */
  | { kind: 'no-target'; plan: TargetPlan };

export interface ServeDeps extends TargetDeps {
  lot: ParkingLot;
  onFallback?: (route: string, from: string, to: string, reason: FallbackReason) => void;
}

type Blocked = { plan: TargetPlan; reason: 'breaker' | 'hold-off'; availableAtMs: number };

export async function serveTargets(
  ctx: RequestContext,
  plans: TargetPlan[],
  contextFallback: TargetPlan | undefined,
  park: ParkConfig | false,
  deps: ServeDeps,
): Promise<Served> {
  const runs = plans.map(() => newRun());
  let lastFailure: Served | undefined;
  let shed: Served | undefined;
  let released: { index: number; ticket: Ticket } | undefined;
  let left: { plan: TargetPlan; reason: FallbackReason } | undefined;
  let fallback: FallbackReason | undefined;
  const attempt = async (plan: TargetPlan, run: ReturnType<typeof newRun>, hasNext: boolean, ticket?: Ticket) => {
    if (left && left.plan !== plan) {
      deps.onFallback?.(ctx.route.name, left.plan.key, plan.key, left.reason);
      fallback = left.reason;
    }
    return tryTarget(ctx, plan, run, deps, hasNext, ticket);
  };
  for (;;) {
    const blocked: Blocked[] = [];
    for (let i = 0; i < plans.length; i++) {
      const plan = plans[i]!;
      const run = runs[i]!;
      if (run.done || (released && released.index !== i)) continue;
      // Parked requests go first, in deadline order: a newcomer queues behind them.
      if (!released && park && deps.lot.waiting(plan.key) > 0) {
        blocked.push({ plan, reason: 'breaker', availableAtMs: deps.now() });
        left = { plan, reason: 'breaker_open' };
        continue;
      }
      const r = await attempt(plan, run, runs.slice(i + 1).some((n) => !n.done), released?.ticket);
      released = undefined;
      if (r.kind === 'ok') return { kind: 'ok', plan, result: r.result, fallback };
      if (r.kind === 'unavailable') {
        blocked.push({ plan, reason: r.reason, availableAtMs: r.availableAtMs });
        left = { plan, reason: r.reason === 'breaker' ? 'breaker_open' : 'held_off' };
        continue;
      }
      run.done = true;
      if (r.kind === 'skipped') {
        ctx.skipped.push({ target: plan.label, reason: r.reason });
        continue;
      }
      if (r.kind === 'shed') {
        // The provider's pool is full for this request's class: another provider may have room.
        shed ??= { kind: 'shed', plan, shed: r };
        left = { plan, reason: 'shed' };
        continue;
      }
      lastFailure = { kind: 'failed', plan, failure: r };
      if (r.cls.cls === 'context-length' && contextFallback && plan !== contextFallback) {
        left = { plan, reason: 'context_length' };
        const c = await attempt(contextFallback, newRun(), false);
        if (c.kind === 'ok') return { kind: 'ok', plan: contextFallback, result: c.result, fallback };
        if (c.kind === 'skipped') ctx.skipped.push({ target: contextFallback.label, reason: c.reason });
        return c.kind === 'failed' ? { kind: 'failed', plan: contextFallback, failure: c } : lastFailure;
      }
      if (ENDS_REQUEST.has(r.cls.cls)) return lastFailure;
      left = { plan, reason: fallbackReason(r) };
    }
    released?.ticket.done();
    released = undefined;
    if (blocked.length === 0) return lastFailure ?? shed ?? { kind: 'no-target', plan: plans[0]! };
    const first = blocked.reduce((a, b) => (b.availableAtMs < a.availableAtMs ? b : a));
    const unavailable: Served = { kind: 'unavailable', ...first };
    const now = deps.now();
    if (!park || !canWait(now, Math.max(0, first.availableAtMs - now), ctx.deadlineAtMs, ctx.route.config.minAttemptMs)) {
      return lastFailure ?? shed ?? unavailable;
    }
    const parked = await deps.lot.park(first.plan.key, {
      route: ctx.route.name,
      deadlineAtMs: ctx.deadlineAtMs,
      signal: ctx.signal,
      maxQueue: park.maxQueue,
      maxWaitMs: park.maxWaitMs,
    });
    switch (parked.kind) {
      case 'released':
        released = { index: plans.indexOf(first.plan), ticket: parked.ticket };
        break;
      case 'full':
        return { kind: 'park-full', plan: first.plan, availableAtMs: first.availableAtMs };
      case 'closing':
        return { kind: 'closing', plan: first.plan };
      case 'timeout':
        return lastFailure ?? unavailable;
      case 'aborted': {
        const result = { outcome: abortOutcome(ctx.signal.reason) };
        return { kind: 'failed', plan: first.plan, failure: { kind: 'failed', result, cls: classify(result.outcome), retryAfterMs: undefined } };
      }
    }
  }
}

function fallbackReason(r: TargetResult & { kind: 'failed' }): FallbackReason {
  if (r.why) return r.why;
  switch (r.cls.cls) {
    case 'credentials':
      return 'credentials';
    case 'timeout':
      return 'timeout';
    default:
      return 'error';
  }
}
