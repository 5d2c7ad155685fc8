// The request pipeline, top to bottom: deadline -> for each target (primary, then the next ones): attempt loop ->
// answer (whole body, or a stream whose first output has arrived) or the final error.
import { Readable } from 'node:stream';
import type { ProviderClient } from '../providers/provider-client.ts';
import { forwardedRequestHeaders, forwardedResponseHeaders } from '../providers/headers.ts';
import { computeDeadline } from '../policy/deadline.ts';
import type { CompiledRoute } from '../routing/router.ts';
import type { TargetConfig } from '../config/schema.ts';
import { GatewayError, type OpenAIErrorBody } from '../errors.ts';
import { ClientGone, DeadlineReached } from './abort-reasons.ts';
import { errorAnswer, failureAnswer } from './final-answer.ts';
import { tryTarget, type AttemptRecord, type TargetDeps, type TargetResult } from './target-attempts.ts';
import type { StreamEnd } from './live-stream.ts';

type HeaderBag = Record<string, string | string[] | undefined>;

export interface ManagedRequest {
  route: CompiledRoute;
  /** The client's path, e.g. /v1/chat/completions, and its query string ("" or "?a=b"). */
  path: string;
  query: string;
  rawBody: Buffer;
  json: Record<string, unknown>;
  headers: HeaderBag;
  requestId: string;
  /** Fires when the client goes away. */
  clientSignal: AbortSignal;
}

export interface PipelineDeps extends TargetDeps {
  providers: ReadonlyMap<string, ProviderClient>;
  onStreamEnd?: (route: string, end: StreamEnd) => void;
}

/** What the server writes back, plus the facts the request log line needs. */
export interface PipelineAnswer {
  status: number;
  headers: Record<string, string>;
  body: Buffer | OpenAIErrorBody | Readable;
  summary: RequestSummary;
}

export interface RequestSummary {
  route: string;
  target: string | undefined;
  outcome: 'success' | 'upstream_error' | 'gateway_error' | 'deadline' | 'client_gone';
  attempts: AttemptRecord[];
  budgetMs: number;
  deadlineSource: string;
  ttftMs?: number;
  upstreamRequestId?: string;
  /** For streams, filled in when the stream ends. */
  streamEnd?: StreamEnd;
}

export function targetLabel(target: TargetConfig): string {
  return target.model ? `${target.provider}/${target.model}` : target.provider;
}

export async function handleManagedRequest(req: ManagedRequest, deps: PipelineDeps): Promise<PipelineAnswer> {
  const { route } = req;
  const deadline = computeDeadline({ routeTimeoutMs: route.config.timeoutMs, marginMs: route.config.deadlineMarginMs, headers: req.headers });
  const deadlineAtMs = deps.now() + deadline.budgetMs;
  const controller = new AbortController();
  const deadlineTimer = setTimeout(() => controller.abort(new DeadlineReached(deadline.budgetMs)), deadline.budgetMs);
  const onClientGone = () => controller.abort(new ClientGone());
  if (req.clientSignal.aborted) onClientGone();
  else req.clientSignal.addEventListener('abort', onClientGone, { once: true });
  const stream = req.json.stream === true;
  const summary: RequestSummary = {
    route: route.name,
    target: undefined,
    outcome: 'gateway_error',
    attempts: [],
    budgetMs: deadline.budgetMs,
    deadlineSource: deadline.source,
  };
  const baseHeaders = {
    ...forwardedRequestHeaders(req.headers),
    'content-type': 'application/json',
    'x-client-request-id': req.requestId,
  };
  let handedToStream = false;
  try {
    let last: (TargetResult & { ok: false }) | undefined;
    let lastTarget = '';
    for (const target of route.config.targets) {
      const client = deps.providers.get(target.provider)!;
      const label = targetLabel(target);
      const result = await tryTarget(
        {
          route,
          api: route.api,
          targetLabel: label,
          client,
          path: client.upstreamPath(req.path, req.query),
          headers: { ...baseHeaders, ...client.authHeaders() },
          body: upstreamBody(req, target),
          stream,
          signal: controller.signal,
          deadlineAtMs,
          attempts: summary.attempts,
        },
        deps,
      );
      lastTarget = label;
      if (result.ok) {
        summary.target = label;
        summary.outcome = 'success';
        const answer = successAnswer(req, result.result, summary, deps);
        handedToStream = answer.body instanceof Readable;
        return answer;
      }
      last = result;
      // The client's own mistakes and its disconnects end the request; other failures move on to the next target.
      if (result.cls.cls === 'aborted' || result.cls.cls === 'client-error' || result.cls.cls === 'context-length' || result.cls.cls === 'content-policy') break;
    }
    const failed = last!;
    summary.target = lastTarget;
    const outcome = failed.result.outcome;
    summary.outcome = outcome.kind === 'aborted' ? (outcome.by === 'client' ? 'client_gone' : 'deadline') : outcome.kind === 'http' ? 'upstream_error' : 'gateway_error';
    const answer = failureAnswer({
      result: failed.result,
      cls: failed.cls,
      retryAfterMs: failed.retryAfterMs,
      attempts: summary.attempts.length,
      target: lastTarget,
      budgetMs: deadline.budgetMs,
    });
    return { ...answer, headers: { ...answer.headers, ...stormgateHeaders(summary) }, summary };
  } catch (err) {
    const answer = errorAnswer(new GatewayError('internal_error', `the gateway failed: ${(err as Error).message}`));
    return { ...answer, summary };
  } finally {
    // The deadline bounds the time until the answer starts; a stream that has started is bounded by its idle timer.
    clearTimeout(deadlineTimer);
    if (!handedToStream) req.clientSignal.removeEventListener('abort', onClientGone);
  }
}

function upstreamBody(req: ManagedRequest, target: TargetConfig): Buffer | string {
  if (!target.model || target.model === req.json.model) return req.rawBody;
  return JSON.stringify({ ...req.json, model: target.model });
}

function stormgateHeaders(summary: RequestSummary): Record<string, string> {
  return {
    'x-stormgate-attempts': String(summary.attempts.length),
    'x-stormgate-target': summary.target ?? '',
    'x-stormgate-route': summary.route,
  };
}

function successAnswer(req: ManagedRequest, result: TargetResult['result'], summary: RequestSummary, deps: PipelineDeps): PipelineAnswer {
  const upstream = result.headers ?? {};
  const upstreamId = upstream['x-request-id'];
  if (upstreamId !== undefined) summary.upstreamRequestId = Array.isArray(upstreamId) ? upstreamId[0] : upstreamId;
  const headers = { ...forwardedResponseHeaders(upstream), ...stormgateHeaders(summary) };
  if (result.stream) {
    summary.ttftMs = result.ttftMs;
    const live = result.stream;
    live.onEnd = (end) => {
      summary.streamEnd = end;
      deps.onStreamEnd?.(req.route.name, end);
    };
    headers['content-type'] = 'text/event-stream; charset=utf-8';
    headers['cache-control'] = 'no-cache';
    headers['x-accel-buffering'] = 'no';
    return { status: result.status ?? 200, headers, body: Readable.from(live.body(), { objectMode: false }), summary };
  }
  return { status: result.status ?? 200, headers, body: result.body ?? Buffer.alloc(0), summary };
}
