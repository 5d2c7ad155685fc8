// The attempt loop on one target: attempt, classify, and either answer, wait and retry, or give up on this target.
// Every wait goes through the one wait rule and is cut short when the request's signal fires.
import type { CompiledRoute } from '../routing/router.ts';
import type { ProviderClient } from '../providers/provider-client.ts';
import { classify, isRetryable, type Classification } from '../policy/outcome.ts';
import { decideRetryWait } from '../policy/retry-wait.ts';
import type { Random } from '../policy/random.ts';
import type { ApiKind } from '../routing/router.ts';
import { abortOutcome, runAttempt, type AttemptResult } from './attempt.ts';

export interface AttemptRecord {
  target: string;
  attempt: number;
  /** `ok`, `status_503`, `network`, `timeout_first_token`, ... */
  reason: string;
  status?: number;
  /** The wait before this attempt. */
  waitMs: number;
  durationMs: number;
}

export interface TargetContext {
  route: CompiledRoute;
  api: ApiKind;
  targetLabel: string;
  client: ProviderClient;
  path: string;
  headers: Record<string, string>;
  body: Buffer | string;
  stream: boolean;
  signal: AbortSignal;
  deadlineAtMs: number;
  attempts: AttemptRecord[];
}

export interface TargetDeps {
  now: () => number;
  random: Random;
  sleep: (ms: number, signal: AbortSignal) => Promise<void>;
  onAttempt?: (route: string, target: string, result: AttemptResult, durationMs: number) => void;
  onRetry?: (route: string, target: string, reason: string, waitMs: number) => void;
}

export type TargetResult =
  | { ok: true; result: AttemptResult }
  | { ok: false; result: AttemptResult; cls: Classification; retryAfterMs: number | undefined };

export async function tryTarget(ctx: TargetContext, deps: TargetDeps): Promise<TargetResult> {
  const { retry, minAttemptMs } = ctx.route.config;
  let prevDelayMs: number | undefined;
  let waitMs = 0;
  for (let attempt = 0; ; attempt++) {
    const startedAt = deps.now();
    const result = await runAttempt({
      client: ctx.client,
      api: ctx.api,
      path: ctx.path,
      headers: ctx.headers,
      body: ctx.body,
      stream: ctx.stream,
      requestSignal: ctx.signal,
      now: deps.now,
    });
    const durationMs = deps.now() - startedAt;
    const cls = classify(result.outcome);
    ctx.attempts.push({ target: ctx.targetLabel, attempt, reason: cls.reason, status: result.status, waitMs, durationMs });
    deps.onAttempt?.(ctx.route.name, ctx.targetLabel, result, durationMs);
    if (cls.cls === 'success') return { ok: true, result };
    const hint = result.outcome.kind === 'http' ? result.outcome.hint : undefined;
    if (!isRetryable(cls, retry.retryOn) || attempt + 1 >= retry.maxAttempts) {
      return { ok: false, result, cls, retryAfterMs: hint?.delayMs };
    }
    const decision = decideRetryWait({
      retry,
      hint,
      retryIndex: attempt,
      prevDelayMs,
      nowMs: deps.now(),
      deadlineAtMs: ctx.deadlineAtMs,
      minAttemptMs,
      random: deps.random,
    });
    if (!decision.wait) return { ok: false, result, cls, retryAfterMs: decision.retryAfterMs };
    deps.onRetry?.(ctx.route.name, ctx.targetLabel, cls.reason, decision.delayMs);
    try {
      await deps.sleep(decision.delayMs, ctx.signal);
    } catch {
      const aborted = { outcome: abortOutcome(ctx.signal.reason) };
      return { ok: false, result: aborted, cls: classify(aborted.outcome), retryAfterMs: undefined };
    }
    if (!decision.fromHint) prevDelayMs = decision.delayMs;
    waitMs = decision.delayMs;
    ctx.headers = { ...ctx.headers, 'x-retry-attempt': String(attempt + 1), 'x-retry-reason': cls.reason };
  }
}
