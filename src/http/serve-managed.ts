// A managed request from its parsed body to its answer, in one function: every way it ends (replay, error, stream)
// leaves the pipeline once.
import { Readable } from 'node:stream';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Config } from '../config/schema.ts';
import { GatewayError, missingModel } from '../errors.ts';
import { firstHeader } from '../header-bag.ts';
import { clientRetryCount, handleManagedRequest, type PipelineAnswer } from '../pipeline/handle-request.ts';
import { shortModel } from '../pipeline/plan-targets.ts';
import { claimKey, keyedRequest, replayed, replaySummary, type IdempotencyDeps, type KeyClaim } from '../pipeline/idempotent-request.ts';
import type { Arrival } from '../state/client-repeats.ts';
import { IDEMPOTENCY_HEADER } from '../policy/idempotency.ts';
import type { CompiledRoute, Router } from '../routing/router.ts';
import type { Runtime } from '../runtime.ts';
import { tokenEstimate } from '../policy/token-estimate.ts';
import type { ClientLimit } from './client-limits.ts';
import type { Drain } from './drain.ts';
import { printable, type ParsedBody } from './request-body.ts';
import type { RequestEnds } from './request-log.ts';
import { sendAnswer } from './send-answer.ts';
import { checkTimeoutHeader } from './timeout-header.ts';

interface ManagedDeps {
  config: Pick<Config, 'auth' | 'idempotency'>;
  /** auth.limits, when any client has one: a request's tokens are reserved here, its body read. */
  limit?: ClientLimit | undefined;
  runtime: Pick<Runtime, 'pipeline' | 'store' | 'bodies' | 'repeats'>;
  router: Router;
  ends: RequestEnds;
  drain: Drain;
}

/** A managed request: route it, run the pipeline, write its answer. */
type ServeManaged = (path: string, request: FastifyRequest, reply: FastifyReply) => Promise<FastifyReply>;

export function managedHandler({ config, limit, runtime, router, ends, drain }: ManagedDeps): ServeManaged {
  // A Map, not the config's object: a client may be named `constructor`.
  const clientPriorities = new Map(Object.entries(config.auth?.priority ?? {}));
  const idempotencyDeps: IdempotencyDeps = { store: runtime.store, config: config.idempotency, now: runtime.pipeline.now, random: runtime.pipeline.random, bodies: runtime.bodies, runsHere: new Set() };
  return async function serveManaged(path, request, reply) {
    const body = request.body as ParsedBody | undefined;
    if (!body) throw new GatewayError('invalid_body', 'the request needs a JSON body (content-type: application/json)');
    const route = routeFor(router, path, body.json);
    checkTimeoutHeader(request.headers);
    const query = queryOf(request.url);
    // Built only for a request that has a key (or a route whose bodies are keys): the others (nearly all) pay a lookup.
    const keyed =
      request.headers[IDEMPOTENCY_HEADER] === undefined && route.config.idempotency === undefined
        ? undefined
        : keyedRequest(
            { headers: request.headers, client: request.client, path, query, rawBody: body.raw, json: body.json, route, receivedMs: reply.elapsedTime, clientGone: () => reply.raw.destroyed, pastGrace: () => drain.pastGrace },
            idempotencyDeps,
          );
    const { windowS } = route.config.budget.repeats;
    const arrival: Arrival | undefined =
      windowS > 0 ? { client: request.client, path, query, priority: firstHeader(request.headers, 'x-stormgate-priority'), rawBody: body.raw, windowMs: windowS * 1000 } : undefined;
    request.arrival = arrival;
    ends.enterPipeline(request);
    let answer: PipelineAnswer;
    let claim: KeyClaim | undefined;
    /** The pipeline's own stream: under a key, read to its end after the client's copy of it has closed. */
    let pipelineStream: Readable | undefined;
    /**
     * How long the request waited for a run under its key before it ran the request itself (that run gave the key
     * back): not taken from the route's timeout, which a run has whole (its client's timeout headers do not apply).
     */
    let waitedForRunMs = 0;
    try {
      if (keyed) {
        const claimingAtMs = reply.elapsedTime;
        claim = await claimKey(keyed, idempotencyDeps);
        waitedForRunMs = reply.elapsedTime - claimingAtMs;
        if (claim.kind === 'replay') {
          // The summary first: a client that left meanwhile ends the request as it leaves the pipeline, and is counted
          // by its summary (client_gone, under the run's labels).
          request.stormgate = replaySummary(route, claim.answer);
          ends.leavePipeline(request, reply);
          return sendAnswer(reply, { ...replayed(claim.answer), summary: request.stormgate });
        }
        drain.holdRun(claim.ended);
      }
      // After the claim: a replay uses no provider's tokens, and a run refused here gives its key back (below). In
      // the pipeline already: a client that leaves meanwhile ends its request after the reservation is on it, so what
      // was reserved is settled (server.ts) whatever happens next.
      if (limit && request.client !== undefined) await reserveTokens(limit, request, request.client, route, body);
      answer = await handleManagedRequest(
        {
          route,
          path,
          query,
          rawBody: body.raw,
          json: body.json,
          headers: request.headers,
          requestId: request.id,
          // Since onRequest, right after the head arrived: the body's upload (and decoding) took this much of the deadline.
          receivedMs: reply.elapsedTime - waitedForRunMs,
          ...(request.client !== undefined && { client: request.client, clientPriority: clientPriorities.get(request.client) }),
          ...(arrival && runtime.repeats.isRepeat(arrival) && { repeat: true }),
          // Taken once the request is admitted and its tokens reserved: a retry refused again owes its place still.
          ...(limit && request.client !== undefined && clientRetryCount(request.headers) > 0 && limit.retriesRefusal(request.client) && { retriesRefusal: true }),
          onClientGone: (listener) => ends.onClientGone(request, reply, listener),
          onShutdown: drain.onShutdown,
          graceLeftMs: drain.graceLeftMs,
          onDrainStart: drain.onDrainStart,
          ...(keyed && { idempotent: true, waitedForRunMs }),
          ...(request.tokensReserved && { countOutput: true }),
        },
        runtime.pipeline,
      );
      // The request ends (logged, its usage counted) when this stream does, not when the client's copy closes.
      if (answer.body instanceof Readable) pipelineStream = answer.body;
      if (claim?.kind === 'run') {
        answer.summary.idempotency = 'run';
        answer = claim.keep(answer);
      }
    } catch (err) {
      if (claim?.kind === 'run') claim.giveBack();
      ends.leavePipeline(request, reply);
      throw err;
    }
    request.stormgate = answer.summary;
    ends.leavePipeline(request, reply, pipelineStream);
    if (answer.live && pipelineStream) drain.holdStream(answer.live, pipelineStream);
    if (answer.clientStallMs !== undefined) {
      // The socket's own timer: a write whose queue shrank since its last check (the client reads, however slowly)
      // postpones it, so it fires after a stall of one to two times clientStallMs. Once the answer is written, Node
      // puts the keep-alive timeout in its place. Node then reports the destroyed answer as finished: the request's
      // end is taken first, as a client gone.
      reply.raw.setTimeout(answer.clientStallMs, () => {
        if (request.stormgate) request.stormgate.clientStalled = true;
        ends.clientStalled(request, reply);
        reply.raw.destroy();
      });
    }
    return sendAnswer(reply, answer);
  };
}

/**
 * Reserves a request's estimated tokens against its client's token rate once its body is read (admission saw its
 * headers alone), and marks them on the request to settle when it ends; throws the refusal when they do not fit.
 */
async function reserveTokens(limit: ClientLimit, request: FastifyRequest, client: string, route: CompiledRoute, body: ParsedBody): Promise<void> {
  const estimate = tokenEstimate(route.api, body.raw.length, body.json);
  // No promise for a client without a token rate.
  const reserving = limit.reserve(client, estimate);
  if (!reserving) return;
  const refusal = await reserving;
  if (refusal) throw refusal;
  request.tokensReserved = estimate;
}

/** The route for a managed request, or the error for a request without a usable model or one no route serves. */
function routeFor(router: Router, path: string, json: Record<string, unknown>): CompiledRoute {
  const given = json.model;
  if (given !== undefined && typeof given !== 'string') throw missingModel(given);
  const model = given === '' ? undefined : given;
  const match = router.match(path, model);
  if ('error' in match) {
    if (match.error === 'unknown_url') throw new GatewayError('unknown_url', `no route for POST ${path}`);
    if (model === undefined) throw missingModel(given);
    throw new GatewayError('model_not_found', `the model \`${printable(shortModel(model))}\` is not served by this gateway`, { param: 'model' });
  }
  // A route that serves any model still needs one, unless every target names its own.
  if (model === undefined && !match.route.config.targets.every((t) => t.model !== undefined)) throw missingModel(given);
  return match.route;
}

/** The request's query string, forwarded upstream (rewriteUrl has already cut any fragment). */
function queryOf(url: string): string {
  const i = url.indexOf('?');
  return i === -1 ? '' : url.slice(i);
}
