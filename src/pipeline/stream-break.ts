// What a stream's break after its first output means to its target's breaker (StreamEnd.upstreamBroke): a cut or a
// stall is the provider failing; an error event is judged by the outcome table as the same error before the first
// output is. Pure: the live stream reports what broke, this says whether it counts and how the breaker's line names it.
import { classify, OUTCOME_TABLE } from '../policy/outcome.ts';
import { errorCodeOf, errorVerdict } from '../providers/error-outcome.ts';
import { withoutKey } from '../providers/key-echo.ts';
import type { FailureFacts } from '../state/breaker-board.ts';
import type { SseEvent } from '../streaming/sse-parser.ts';
import type { UpstreamStreamError } from '../streaming/stream-events.ts';
import { AttemptTimeout } from './abort-reasons.ts';

/** The status a family's own error event stands for (UpstreamRequest.errorEventMeaning). */
export type ErrorEventMeaning = (data: Buffer) => { status: number; body: Buffer } | undefined;

/** A cut or a stall of the upstream after the stream began, as the breaker's line names it. */
export function brokenBy(reason: unknown, err: unknown): FailureFacts {
  if (reason instanceof AttemptTimeout) return { reason: 'stream_stalled' };
  const code = (err as { code?: unknown } | null)?.code;
  return { reason: 'stream_cut', ...(typeof code === 'string' && { code: code.slice(0, 64) }) };
}

/**
 * Whether an error event that ends a stream after it began is the provider failing (a server error, `overloaded_error`),
 * judged by the outcome table as the same error before the first output is (attempt.ts failureResult): one that blames
 * the request, a rate limit or the gateway's own account says nothing against the provider's health. A family's own
 * event is read by its family, as there: Anthropic's names no code, only a type (`invalid_request_error`,
 * `rate_limit_error` on /v1/messages), which its translation for a chat client keeps; read as codes alone, a request's
 * fault counted against the provider. `ev` is the event as the client gets it: the upstream's, or its translation.
 * `apiKey`, the key the provider was sent, is kept out of the code the breaker's log line names.
 */
export function errorEventBreaks(err: UpstreamStreamError | undefined, ev: SseEvent, familyMeaning: ErrorEventMeaning | undefined, apiKey: string): FailureFacts | undefined {
  const verdict = errorVerdict(err, 'error event', apiKey);
  const meaning = verdict.outcome === undefined && ev.data !== null ? familyMeaning?.(Buffer.from(ev.data)) : undefined;
  const outcome = verdict.outcome ?? (meaning && { kind: 'http' as const, status: meaning.status, errorCode: errorCodeOf(meaning.status, meaning.body), hint: undefined });
  if (outcome !== undefined && OUTCOME_TABLE[classify(outcome).cls].breaker !== 'failure') return undefined;
  return { reason: 'stream_error', ...(err?.code !== undefined && { code: withoutKey(err.code, apiKey).slice(0, 64) }) };
}
