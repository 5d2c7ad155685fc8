// The request's log line and count: exactly one per request, whichever way it ends, with what the pipeline decided
// (route, target, attempts, outcome); and the one watch on the response that tells the pipeline its client has gone.
import type { Readable } from 'node:stream';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import { endedBroken } from '../pipeline/stream-ends.ts';
import type { RejectedOutcome } from '../observability/pipeline-metrics.ts';
import { answeredErrorCode, passthroughRequestId } from './send-answer.ts';
import { passthroughUpstreamCode } from './client-errors.ts';

/** `sentNothing`: the client left before the answer's status and headers were written to it. */
type OnEnd = (request: FastifyRequest, reply: FastifyReply, clientGone: boolean, sentNothing: boolean) => void;

/**
 * Calls `onEnd` once per request. fastify runs onResponse only for an answer it finished writing, so a client that
 * leaves first is caught by the response's 'close'. When it leaves while the pipeline still works, the end waits
 * until the pipeline's answer settles (its summary is complete only then); for a stream, until the stream closes.
 */
export class RequestEnds {
  readonly #ended = new WeakSet<FastifyRequest>();
  /**
   * How each closed connection closed, judged when it closed: `byClient` while the request's stream (if any) had not
   * broken (else the gateway closed it itself), `beforeHeaders` when no header had been written (a keyed run writes
   * its answer after that, to no one).
   */
  readonly #closed = new WeakMap<FastifyRequest, { byClient: boolean; beforeHeaders: boolean }>();
  readonly #inPipeline = new WeakSet<FastifyRequest>();
  readonly #streams = new WeakMap<FastifyRequest, Readable>();
  readonly #goneListeners = new WeakMap<FastifyRequest, () => void>();

  constructor(private readonly onEnd: OnEnd) {}

  /** From onRequest: notices a client that closes the connection before its answer is written. */
  watch(request: FastifyRequest, reply: FastifyReply): void {
    const res = reply.raw;
    res.once('close', () => {
      if (res.writableFinished) return;
      this.#goneListeners.get(request)?.();
      this.#clientGone(request, reply);
    });
  }

  /**
   * Calls `listener` (the pipeline's abort) when the client closes the connection before its answer is complete, at
   * once if it already has; returns its removal. The one 'close' listener of watch() serves both.
   */
  onClientGone(request: FastifyRequest, reply: FastifyReply, listener: () => void): () => void {
    // Not request.raw.destroyed: Node destroys a request once its body is read, which a compressed body's decoding outlasts.
    if (reply.raw.destroyed || request.raw.socket?.destroyed) {
      listener();
      return () => {};
    }
    this.#goneListeners.set(request, listener);
    return () => this.#goneListeners.delete(request);
  }

  /** The client took nothing of its answer for too long (PipelineAnswer.clientStallMs): its connection is closed now. */
  clientStalled(request: FastifyRequest, reply: FastifyReply): void {
    this.#clientGone(request, reply);
  }

  /** The answer was written whole. */
  answered(request: FastifyRequest, reply: FastifyReply): void {
    this.#end(request, reply, false);
  }

  enterPipeline(request: FastifyRequest): void {
    this.#inPipeline.add(request);
  }

  /** The pipeline settled (with a stream to watch, if it answered with one). */
  leavePipeline(request: FastifyRequest, reply: FastifyReply, stream?: Readable): void {
    this.#inPipeline.delete(request);
    if (stream) this.#streams.set(request, stream);
    if (this.#closed.has(request)) this.#clientGone(request, reply);
  }

  #clientGone(request: FastifyRequest, reply: FastifyReply): void {
    if (!this.#closed.has(request)) {
      // A stream the upstream broke ended before its connection closed: on a path without an API the gateway knows, no
      // error event can be written, so the gateway closed the connection itself. That close is no client leaving.
      // Judged when the connection closes, not when the line is written: a keyed run read on after its client left
      // may break later (it said status 200 and no clientGone for a client that never got a byte).
      // Nor is a passthrough answer's close after its provider broke it off (notePassthroughBreak).
      const end = request.stormgate?.streamEnd;
      const broken = (end !== undefined && endedBroken(end.kind)) || passthroughUpstreamCode(request) !== undefined;
      this.#closed.set(request, { byClient: !broken, beforeHeaders: !reply.raw.headersSent });
    }
    if (this.#inPipeline.has(request)) return;
    const stream = this.#streams.get(request);
    if (stream && !stream.closed) stream.once('close', () => this.#end(request, reply, true));
    else this.#end(request, reply, true);
  }

  #end(request: FastifyRequest, reply: FastifyReply, closed: boolean): void {
    if (this.#ended.has(request)) return;
    this.#ended.add(request);
    const s = request.stormgate;
    const how = closed ? this.#closed.get(request) : undefined;
    const clientGone = how?.byClient === true;
    // A run under an idempotency key went on without its client (its repeat gets the answer): it ended as it ended.
    if (clientGone && s && s.idempotency !== 'run') s.outcome = 'client_gone';
    this.onEnd(request, reply, clientGone, clientGone && how.beforeHeaders);
  }
}

/**
 * A request with nothing to tell but that it worked: one attempt, on the first target, a whole answer or a stream that
 * completed. Only these are sampled (server.logSuccessRate); retries, fallbacks and failures are always logged.
 */
export function plainSuccess(request: FastifyRequest, clientGone: boolean): boolean {
  const s = request.stormgate;
  if (!s || clientGone || s.outcome !== 'success' || s.attempts.length !== 1 || s.fallback !== undefined || s.skipped.length > 0 || s.unknownPriority !== undefined) return false;
  return s.streamEnd === undefined || (s.streamEnd.kind === 'complete' && s.streamEnd.droppedMalformed === 0);
}

/** Writes the request's line through `log` (observability/logger.ts accessLogger), with the request's id. */
export function logRequest(log: Logger, request: FastifyRequest, reply: FastifyReply, clientGone: boolean, sentNothing: boolean, rejected?: RejectedOutcome): void {
  const s = request.stormgate;
  const errorCode = sentNothing ? undefined : answeredErrorCode(request);
  const traceId = traceIdOf(request.headers.traceparent);
  const upstreamCode = passthroughUpstreamCode(request);
  // A passthrough answer's provider id (a managed request's is in its summary, below): support asks for it.
  const upstreamRequestId = s ? undefined : passthroughRequestId(request);
  const route = request.routeOptions.url;
  const line = {
    reqId: request.id,
    // The W3C trace the client's call belongs to (forwarded upstream as it came): a trace finds its line by it.
    ...(traceId !== undefined && { traceId }),
    method: request.method,
    // A passthrough request's own path (the file it asked for), not its route's pattern (`/v1/files/*`).
    path: route === undefined || route.endsWith('*') ? request.url.split('?')[0]!.slice(0, 512) : route,
    // A client that left before any header was written never saw a status.
    status: sentNothing ? undefined : reply.statusCode,
    // The error's code the client got, so the code a client reports (circuit_open, load_shed) finds its line.
    ...(errorCode !== undefined && { errorCode }),
    // What failed on the way to the provider of a passthrough request (a managed request's attempts say it each).
    ...(upstreamCode !== undefined && { upstreamCode }),
    ...(upstreamRequestId !== undefined && { upstreamRequestId }),
    durationMs: Math.round(reply.elapsedTime),
    ...(clientGone && { clientGone: true }),
    ...(request.client !== undefined && { client: request.client }),
    ...(rejected && { outcome: rejected }),
    ...(s && {
      route: s.route,
      target: s.target,
      priority: s.priority,
      ...(s.unknownPriority !== undefined && { unknownPriority: s.unknownPriority.slice(0, 64) }),
      outcome: s.outcome,
      attempts: s.attempts,
      budgetMs: s.budgetMs,
      deadlineSource: s.deadlineSource,
      ...(s.clientRetry && { clientRetry: s.clientRetry }),
      ...(s.backoffMs !== undefined && { backoffMs: s.backoffMs }),
      ...(s.parkedMs !== undefined && { parkedMs: s.parkedMs }),
      ttftMs: s.ttftMs,
      ...(s.startedEarly && { startedEarly: true }),
      upstreamRequestId: s.upstreamRequestId,
      streamEnd: s.streamEnd?.kind,
      ...(s.clientStalled && { clientStalled: true }),
      ...(s.streamEnd?.droppedMalformed && { droppedMalformed: s.streamEnd.droppedMalformed }),
      ...(s.streamEnd?.recoveryRefused && { recoveryRefused: s.streamEnd.recoveryRefused }),
      fallback: s.fallback,
      retriesStopped: s.retriesStopped,
      ...(s.skipped.length > 0 && { skipped: s.skipped }),
      ...(s.idempotency && { idempotency: s.idempotency }),
      // With `client`, what a chargeback per client key needs: the tokens the provider reported, by target.
      ...(s.usage && { usage: s.usage }),
      ...(s.continuationUsage && { continuationUsage: s.continuationUsage }),
    }),
  };
  const end = s?.streamEnd;
  // A provider that never sends [DONE] (some OpenAI-compatible servers) ended its stream well: no warning each time.
  // One broken and finished by the next target is a provider's failure the client never saw: said as such.
  if (end?.kind === 'recovered') log.warn(line, 'stream recovered from the next target');
  else if (end && end.kind !== 'complete' && end.kind !== 'done-added' && end.kind !== 'client-gone') log.warn(line, 'stream ended abnormally');
  // Dropped events are text the client never saw: worth a warning even when the stream ended well.
  else if (end && end.droppedMalformed > 0) log.warn(line, 'stream events dropped as malformed');
  else log.info(line, 'request');
}

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}(-|$)/;
const ZERO_TRACE_ID = '0'.repeat(32);
const ZERO_PARENT_ID = '0'.repeat(16);

/**
 * The trace id of a W3C `traceparent` (version-traceid-parentid-flags), when the header is valid: version ff, an
 * all-zero trace or parent id, and a version-00 header with more after its flags are not (a later version may add fields).
 */
function traceIdOf(traceparent: string | string[] | undefined): string | undefined {
  if (typeof traceparent !== 'string') return undefined;
  const m = TRACEPARENT.exec(traceparent.trim());
  if (!m || m[1] === 'ff' || (m[1] === '00' && m[4] === '-') || m[2] === ZERO_TRACE_ID || m[3] === ZERO_PARENT_ID) return undefined;
  return m[2];
}
