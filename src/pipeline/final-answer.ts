// What the client gets when no target produced an answer: the upstream's own error when the client's request was
// at fault (or the upstream's last status after retries), else the gateway's error naming what happened.
import { GatewayError, normaliseUpstreamErrorBody, retryHeaders, type OpenAIErrorBody } from '../errors.ts';
import { OUTCOME_TABLE, type Classification } from '../policy/outcome.ts';
import { forwardedResponseHeaders } from '../providers/headers.ts';
import type { AttemptResult } from './attempt.ts';

export interface ErrorAnswer {
  status: number;
  headers: Record<string, string>;
  body: OpenAIErrorBody;
}

export interface FailureFacts {
  result: AttemptResult;
  cls: Classification;
  retryAfterMs: number | undefined;
  attempts: number;
  target: string;
  budgetMs: number;
}

export function failureAnswer(f: FailureFacts): ErrorAnswer {
  const { outcome } = f.result;
  if (outcome.kind === 'http' && OUTCOME_TABLE[f.cls.cls].passThrough) {
    const upstreamHeaders = f.result.headers ? forwardedResponseHeaders(f.result.headers) : {};
    delete upstreamHeaders['content-type'];
    return {
      status: outcome.status,
      headers: { ...upstreamHeaders, ...retryHeaders(false, f.retryAfterMs) },
      body: normaliseUpstreamErrorBody(outcome.status, f.result.body),
    };
  }
  return errorAnswer(gatewayErrorFor(f));
}

export function errorAnswer(err: GatewayError): ErrorAnswer {
  return { status: err.status, headers: retryHeaders(err.shouldRetry, err.retryAfterMs), body: err.toBody() };
}

function gatewayErrorFor(f: FailureFacts): GatewayError {
  const tried = `${f.attempts} attempt${f.attempts === 1 ? '' : 's'}`;
  const { outcome } = f.result;
  const opts = { retryAfterMs: f.retryAfterMs };
  switch (outcome.kind) {
    case 'http':
      // Only credential problems get here: the provider's body may echo part of the key, so it is never passed on.
      return new GatewayError('upstream_auth_error', `provider target ${f.target} rejected the gateway's credentials or billing (${f.cls.reason}); this is a gateway configuration problem, not the request's`, opts);
    case 'network':
      return new GatewayError('upstream_unavailable', `upstream ${f.target} could not be reached after ${tried} (last: ${outcome.code})`, opts);
    case 'timeout':
      return new GatewayError('upstream_timeout', `upstream ${f.target} timed out after ${tried} (last: ${outcome.phase.replace('-', ' ')} timeout)`, opts);
    case 'bad-stream':
      return new GatewayError('upstream_bad_response', `upstream ${f.target} sent a broken stream after ${tried} (last: ${outcome.detail})`, opts);
    case 'aborted':
      return new GatewayError('deadline_exceeded', `the request's deadline of ${f.budgetMs} ms passed after ${tried} (last target: ${f.target})`, opts);
    case 'ok':
      return new GatewayError('internal_error', 'a successful attempt was treated as a failure', opts);
  }
}

/**
 * A target that cannot take the request now. A breaker is the provider's problem: x-should-retry stays false. A
 * hold-off is a window the gateway knows the end of: the SDK is invited back when that is at most 60 s away.
 */
export function unavailableAnswer(u: { reason: 'breaker' | 'hold-off'; target: string; retryAfterMs: number }): ErrorAnswer {
  const seconds = Math.ceil(u.retryAfterMs / 1000);
  return u.reason === 'breaker'
    ? errorAnswer(new GatewayError('circuit_open', `target ${u.target} is unavailable: its circuit breaker is open; retry in ${seconds} s`, { retryAfterMs: u.retryAfterMs }))
    : errorAnswer(new GatewayError('provider_held_off', `target ${u.target} asked for no requests for another ${seconds} s`, { retryAfterMs: u.retryAfterMs, shouldRetry: true }));
}
