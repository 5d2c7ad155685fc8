// The targets of one request, in order: the primary, then the next ones. A target that is unavailable (breaker open,
// hold-off) is skipped; when no target can take the request, it parks on the one expected back first, if the one wait
// rule allows it, and is tried again when released.
import type { ParkConfig } from '../config/schema.ts';
import { canWait } from '../policy/retry-wait.ts';
import { abortOutcome, type AttemptResult } from './attempt.ts';
import { classify } from '../policy/outcome.ts';
import type { ParkingLot, Ticket } from './parking-lot.ts';
import { newRun, tryTarget, type RequestContext, type TargetDeps, type TargetPlan, type TargetResult } from './target-attempts.ts';

/** Outcome classes that end the request: the client's own mistakes, a safety decision, a disconnect or the deadline. */
const ENDS_REQUEST = new Set(['aborted', 'client-error', 'context-length', 'content-policy']);

export type Served =
  | { kind: 'ok'; plan: TargetPlan; result: AttemptResult }
  | { kind: 'failed'; plan: TargetPlan; failure: TargetResult & { kind: 'failed' } }
  | { kind: 'unavailable'; plan: TargetPlan; reason: 'breaker' | 'hold-off'; availableAtMs: number }
  | { kind: 'park-full'; plan: TargetPlan; availableAtMs: number }
  | { kind: 'shed'; plan: TargetPlan; shed: TargetResult & { kind: 'shed' } }
  | { kind: 'closing'; plan: TargetPlan };

export interface ServeDeps extends TargetDeps {
  lot: ParkingLot;
}

type Blocked = { plan: TargetPlan; reason: 'breaker' | 'hold-off'; availableAtMs: number };

export async function serveTargets(ctx: RequestContext, plans: TargetPlan[], park: ParkConfig | false, deps: ServeDeps): Promise<Served> {
  const runs = plans.map(() => newRun());
  let lastFailure: Served | undefined;
  let shed: Served | undefined;
  let released: { index: number; ticket: Ticket } | undefined;
  for (;;) {
    const blocked: Blocked[] = [];
    for (let i = 0; i < plans.length; i++) {
      const plan = plans[i]!;
      const run = runs[i]!;
      if (run.done || (released && released.index !== i)) continue;
      // Parked requests go first, in deadline order: a newcomer queues behind them.
      if (!released && park && deps.lot.waiting(plan.key) > 0) {
        blocked.push({ plan, reason: 'breaker', availableAtMs: deps.now() });
        continue;
      }
      const r = await tryTarget(ctx, plan, run, deps, released?.ticket);
      released = undefined;
      if (r.kind === 'ok') return { kind: 'ok', plan, result: r.result };
      if (r.kind === 'unavailable') {
        blocked.push({ plan, reason: r.reason, availableAtMs: r.availableAtMs });
        continue;
      }
      if (r.kind === 'shed') {
        // The provider's pool is full for this request's class: another provider may have room.
        run.done = true;
        shed ??= { kind: 'shed', plan, shed: r };
        continue;
      }
      run.done = true;
      lastFailure = { kind: 'failed', plan, failure: r };
      if (ENDS_REQUEST.has(r.cls.cls)) return lastFailure;
    }
    released?.ticket.done();
    released = undefined;
    if (blocked.length === 0) return (lastFailure ?? shed)!;
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
