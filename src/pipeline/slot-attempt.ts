// One attempt inside the provider's pool: take a slot (by class, then arrival; a retry also under the retry cap),
// attempt, give the slot back (a stream: when it ends), and tell the target's adaptive limit how it went.
import { classify, OUTCOME_TABLE, type Classification } from '../policy/outcome.ts';
import { quotaLowUntil } from '../policy/quota-headers.ts';
import { abortOutcome, runAttempt, type AttemptResult } from './attempt.ts';
import type { RequestContext, TargetPlan } from './target-attempts.ts';
import type { UpstreamRequest } from '../providers/families.ts';

export type SlotAttempt =
  | { kind: 'shed'; reason: 'queue_full' | 'deadline'; retryAfterMs: number }
  | { kind: 'done'; result: AttemptResult; cls: Classification; durationMs: number };

export async function attemptInSlot(
  ctx: RequestContext,
  plan: TargetPlan,
  upstream: UpstreamRequest,
  retry: boolean,
  now: () => number,
): Promise<SlotAttempt> {
  const acquired = await plan.pool.acquire({
    cls: plan.cls,
    target: plan.key,
    retry,
    deadlineAtMs: ctx.deadlineAtMs,
    minAttemptMs: ctx.route.config.minAttemptMs,
    signal: ctx.signal,
  });
  if (!acquired.ok) {
    if (acquired.reason !== 'aborted') return { kind: 'shed', reason: acquired.reason, retryAfterMs: acquired.retryAfterMs };
    const result = { outcome: abortOutcome(ctx.signal.reason) };
    return { kind: 'done', result, cls: classify(result.outcome), durationMs: 0 };
  }
  const startedAt = now();
  const { path, headers, body, translator } = upstream;
  const result = await runAttempt({ client: plan.client, api: ctx.api, path, headers, body, stream: ctx.stream, shape: ctx.shape, translator, requestSignal: ctx.signal, earlyStart: ctx.earlyStart, now });
  const durationMs = now() - startedAt;
  const cls = classify(result.outcome);
  // Observed while the slot is still held: the limit learns how many were in flight when the provider said no.
  plan.pool.observe(plan.key, OUTCOME_TABLE[cls.cls].limit, durationMs);
  if (result.stream) result.stream.whenDone(() => acquired.slot.release());
  else acquired.slot.release();
  if (cls.cls === 'success' && result.headers) {
    const lowUntil = quotaLowUntil(result.headers, now());
    if (lowUntil !== undefined) plan.pool.holdLowerClasses(plan.key, lowUntil);
  }
  return { kind: 'done', result, cls, durationMs };
}
