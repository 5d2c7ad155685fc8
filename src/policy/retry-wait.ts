// The one wait rule, for retries: wait only if, after the wait, an attempt still has time before the deadline.
// An upstream wait hint replaces the backoff (with a little jitter so clients told the same time do not wake together);
// a hint longer than the route accepts ends retries on that target and is handed to the client.
import type { RetryConfig } from '../config/schema.ts';
import { backoffDelayMs, jitterWaitHintMs } from './backoff.ts';
import type { Random } from './random.ts';
import type { WaitHint } from './wait-hint.ts';

type WaitDecision =
  | { wait: true; delayMs: number; fromHint: boolean }
  | { wait: false; why: 'hint-too-long' | 'deadline'; retryAfterMs: number | undefined };

export interface WaitInputs {
  retry: RetryConfig;
  hint: WaitHint | undefined;
  /** 0 for the first retry. */
  retryIndex: number;
  prevDelayMs: number | undefined;
  nowMs: number;
  deadlineAtMs: number;
  minAttemptMs: number;
  random: Random;
}

export function decideRetryWait(i: WaitInputs): WaitDecision {
  // A hint of no wait at all is no hint (parseWaitHint drops it too): every request told "0" would retry at once,
  // together; the jittered backoff spreads them.
  const hint = i.hint !== undefined && i.hint.delayMs > 0 ? i.hint : undefined;
  if (hint && hint.delayMs > i.retry.maxWaitHintMs) {
    return { wait: false, why: 'hint-too-long', retryAfterMs: hint.delayMs };
  }
  const delayMs = hint
    ? jitterWaitHintMs(hint.delayMs, i.random)
    : backoffDelayMs(i.retry.backoff, i.retryIndex, i.prevDelayMs, i.random);
  if (!canWait(i.nowMs, delayMs, i.deadlineAtMs, i.minAttemptMs)) {
    return { wait: false, why: 'deadline', retryAfterMs: hint?.delayMs };
  }
  return { wait: true, delayMs, fromHint: hint !== undefined };
}

/** The one wait rule: a wait is worth taking only if an attempt of at least minAttemptMs fits after it. */
export function canWait(nowMs: number, waitMs: number, deadlineAtMs: number, minAttemptMs: number): boolean {
  return nowMs + waitMs + minAttemptMs <= deadlineAtMs;
}
