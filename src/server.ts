// buildServer(config, deps): the fastify routes and hooks, nothing else. Per-route work is resolved here, once;
// the request path only parses, matches and hands over to the pipeline.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type { IncomingMessage, OutgoingHttpHeaders, ServerResponse } from 'node:http';
import { Readable } from 'node:stream';
import type { Socket } from 'node:net';
import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import type { Config, RouteConfig } from './config/schema.ts';
import { drainingError, GatewayError, methodNotAllowed, missingModel, type OpenAIErrorBody } from './errors.ts';
import { toAnthropicShape } from './providers/anthropic/index.ts';
import { errorAnswer } from './pipeline/final-answer.ts';
import { handleManagedRequest, type PipelineAnswer } from './pipeline/handle-request.ts';
import { claimKey, keyedRequest, replayed, replaySummary, type IdempotencyDeps, type KeyClaim } from './pipeline/idempotent-request.ts';
import { IDEMPOTENCY_HEADER } from './policy/idempotency.ts';
import type { LiveStream } from './pipeline/live-stream.ts';
import { createRouter, type CompiledRoute } from './routing/router.ts';
import { asAnthropicModel, asAnthropicPage, createModelsList } from './routing/models-list.ts';
import { createMetrics } from './observability/metrics.ts';
import { RequestRecorder } from './observability/pipeline-metrics.ts';
import { createRuntime, type RuntimeDeps } from './runtime.ts';
import { accessLogger, createLogger } from './observability/logger.ts';
import { registerPassthrough } from './providers/passthrough.ts';
import { answerClientError, answerUnmetExpectation, markAnsweredEarly, toGatewayError } from './http/client-errors.ts';
import { closeSweep } from './http/close-sweep.ts';
import { continueWanted } from './http/expect-continue.ts';
import { safeHeaders } from './http/header-safe.ts';
import { longestBudgetMs, timeoutHeaderMs } from './policy/deadline.ts';
import { contentEncoding, decodeBody, parseJsonBody, printable, type ParsedBody } from './http/request-body.ts';
import { logRequest, plainSuccess, RequestEnds } from './http/request-log.ts';
import { clientAuth } from './http/client-auth.ts';
import { hostAllowance, hostHeaderFault } from './http/host-header.ts';
import { StreamBody, writeOpening } from './streaming/stream-body.ts';

export type ServerDeps = Partial<RuntimeDeps>;

declare module 'fastify' {
  interface FastifyRequest {
    stormgate?: PipelineAnswer['summary'];
    /** The client's name in auth.keys, when the gateway has client keys. */
    client?: string;
  }
  interface FastifyInstance {
    /** SIGTERM's graceful shutdown: readiness off, preStopMs of service, then parked answered, new refused, in-flight given graceMs. */
    drain(): Promise<void>;
  }
}

type Phase = 'serving' | 'draining' | 'closing';

/**
 * Each response's reply, for the close sweep to answer a request whose body is still arriving when the server closes.
 * A property, not a WeakMap: a WeakMap's value that holds its key (reply.raw) kept every reply alive through the young
 * generation's collections, so each request was promoted and the old generation grew until a full collection (a 20 ms
 * pause at 500 requests/s).
 */
const REPLY = Symbol('stormgate.reply');
type RawWithReply = ServerResponse & { [REPLY]?: FastifyReply };

const REQUEST_ID = /^[\w.:@-]{1,128}$/;

/** After the drain's grace period, how long interrupted streams get to write their error event (and close() to finish) before the exit. */
const STREAM_GOODBYE_MS = 500;

/** Methods a path answers 405 for when it does not serve them; a method fastify does not route at all gets 404. */
const ALL_METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'];

/** The gateway's own endpoints for Prometheus and the orchestrator. */
const OPS_PATHS: ReadonlySet<string> = new Set(['/metrics', '/healthz', '/readyz']);

export async function buildServer(config: Config, deps: ServerDeps = {}): Promise<FastifyInstance> {
  const logger = deps.logger ?? createLogger(config);
  const access = accessLogger(logger);
  const metrics = deps.metrics ?? createMetrics();
  const runtime = await createRuntime(config, { ...deps, logger, metrics });
  const recorder = new RequestRecorder(metrics, deps.now ?? Date.now);
  const router = createRouter(config);
  const models = createModelsList(router, runtime.pipeline.providers);

  const app = Fastify({
    loggerInstance: logger as FastifyBaseLogger,
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: config.server.bodyLimitBytes,
    // fastify turns Node's request timeout off by default: a client that never finishes its body would hold its
    // connection (and a file descriptor) forever. Node answers 408 through clientErrorHandler below.
    requestTimeout: config.server.requestTimeoutMs,
    // Node checks the timeouts on this interval (30 s by default, which would stretch a 60 s limit to 90 s).
    http: {
      connectionsCheckingInterval: Math.min(30_000, Math.max(250, Math.floor(config.server.requestTimeoutMs / 4))),
      headersTimeout: Math.min(60_000, config.server.requestTimeoutMs),
      // Node would answer a missing Host header itself, with an empty 400; onRequest answers in the OpenAI shape.
      requireHostHeader: false,
    },
    // Our own onRequest hook answers during shutdown, in the OpenAI error shape and with x-should-retry.
    return503OnClosing: false,
    forceCloseConnections: 'idle',
    genReqId: requestIdOf,
    // A fragment is the client's own and has no place in a request line (RFC 9112 3.2), but Node passes one on. Cut
    // here, before routing, it reaches no upstream URL (the query of a managed route, a passthrough path), and a `?`
    // inside it is not read as a query.
    rewriteUrl: (req) => withoutFragment(req.url!),
    // Errors fastify raises before any route or hook runs (a URL it cannot decode): the OpenAI shape too.
    // No hook runs for these, so the log line is written here.
    frameworkErrors: (err, request, reply) => {
      reply.header('x-stormgate-request-id', request.id);
      sendError(reply, toGatewayError(err, request));
      ends.answered(request, reply);
    },
    // Requests Node's HTTP parser refuses (headers or URL too large, a malformed request line, too slow to arrive).
    clientErrorHandler: (err, socket) => answerClientError(err, socket, logger as FastifyBaseLogger),
  });
  // An `expect` other than 100-continue: Node would answer an empty 417 itself; this answers in the OpenAI shape.
  app.server.on('checkExpectation', (req, res) => answerUnmetExpectation(req, res, requestIdOf(req), logger as FastifyBaseLogger));
  // `expect: 100-continue` (curl sends it with large bodies) asks whether the body is wanted before it is sent. Node
  // answers 100 Continue at once, before any hook: a client with a wrong key, method or path, or a draining instance's,
  // uploaded its whole body for a 401, 405 or 503. The request goes through the hooks like any other instead, and
  // its 100 Continue only when its body is about to be read (preParsing below); refused before, it never sends the body
  // (Node closes the connection after such an answer, since the body may still come).
  app.server.on('checkContinue', (req, res) => app.server.emit('request', req, res));
  const passthroughPaths = config.passthrough?.paths.map((p) => p.replace(/\/+$/, '')) ?? [];
  const isPassthrough = (path: string) => passthroughPaths.some((p) => path === p || path.startsWith(`${p}/`));
  // A callback hook, as the managed API's own preParsing: no promise per request.
  app.addHook('preParsing', (request, reply, payload, done) => {
    // Any other expectation was answered 417 (checkExpectation), and an HTTP/1.0 client is never sent a 100 (RFC 9110
    // 15.2). A 404 is told to continue too: fastify reads its body before the not-found handler answers. A request
    // whose headers decide its answer (a content-length past bodyLimitBytes, a managed path's content-type that is not
    // JSON) gets its 413 or 415 before a byte is read: told to continue, curl uploaded all of it first.
    if (
      request.headers.expect !== undefined &&
      request.raw.httpVersionMinor === 1 &&
      request.raw.httpVersionMajor === 1 &&
      continueWanted(request.headers, { managed: router.paths.has(request.routeOptions.url ?? ''), passthrough: isPassthrough(request.url.split('?')[0]!) }, config.server.bodyLimitBytes)
    ) {
      reply.raw.writeContinue();
    }
    done(null, payload);
  });
  const hostAllowed = hostAllowance(config.server);
  const sweep = closeSweep(app.server, (res) => {
    const reply = (res as RawWithReply)[REPLY];
    const path = reply?.request.url.split('?')[0] ?? '';
    // A passthrough request forwards its body as it arrives, and its answer is the provider's to give: it is cut.
    if (!reply || isPassthrough(path)) return false;
    // The body's rest is never read: the connection closes after the answer.
    reply.header('connection', 'close');
    sendError(reply, drainingError());
    return true;
  });

  // Math.random, not the policy's random source: sampling log lines must not shift a seeded test's jitter.
  const { logSuccessRate } = config.server;
  const ends = new RequestEnds((request, reply, gone) => {
    const summary = request.stormgate;
    if (summary) recorder.record(summary, reply.elapsedTime / 1000);
    // A managed path's request refused before the pipeline (bad body, no model, no key, draining) has no summary, yet
    // it is a client request answered: without this count a client sending only invalid requests would not show.
    // (A 504 here is a deadline that passed while the body was still arriving: answerAtDeadline.)
    else if (reply.statusCode >= 400 && router.paths.has(request.routeOptions.url ?? '')) recorder.rejected(reply.statusCode === 500 ? 'gateway_error' : reply.statusCode === 504 ? 'deadline' : 'rejected');
    if (logSuccessRate < 1 && plainSuccess(request, gone) && Math.random() >= logSuccessRate) return;
    // Scrapes and probes come every few seconds from machines: a line each would bury the requests; failures still show.
    if (!summary && reply.statusCode < 400 && OPS_PATHS.has(request.routeOptions.url ?? '')) return;
    logRequest(access, request, reply, gone);
  });

  /** Streams being sent, and the aborts of requests still in the pipeline, for the end of a drain's grace period. */
  const live = new Set<LiveStream>();
  /** Runs under idempotency keys not yet ended in the store (pipeline/idempotent-request.ts), for a drain to wait for. */
  const detachedRuns = new Set<Promise<void>>();
  const inPipeline = new Set<() => void>();
  let pastGrace = false;
  /** The pipeline's abort for when the grace period is over (at once if it is); returns its removal. */
  const onShutdown = (listener: () => void): (() => void) => {
    if (pastGrace) {
      listener();
      return () => {};
    }
    inPipeline.add(listener);
    return () => inPipeline.delete(listener);
  };
  const auth = clientAuth(config.auth?.keys);
  // A Map, not the config's object: a client may be named `constructor`.
  const clientPriorities = new Map(Object.entries(config.auth?.priority ?? {}));
  /** With client keys configured, a request without one of them is answered 401 here; the ops endpoints stay open. */
  const admitted = (request: FastifyRequest, reply: FastifyReply): boolean => {
    if (auth === undefined || OPS_PATHS.has(request.routeOptions.url ?? '')) return true;
    const verdict = auth(request.headers);
    if (verdict.ok) {
      request.client = verdict.client;
      return true;
    }
    sendError(reply, unauthorized(verdict.reason));
    return false;
  };
  let phase: Phase = 'serving';
  // A callback hook: an async one costs every request a promise and a tick.
  app.addHook('onRequest', (request, reply, done) => {
    reply.header('x-stormgate-request-id', request.id);
    ends.watch(request, reply);
    (reply.raw as RawWithReply)[REPLY] = reply;
    // Pipelined behind an answer still being written: Node hands this one the connection when that answer is done,
    // with the socket timer it left (a whole answer's stall limit, PipelineAnswer.clientStallMs), where a request on
    // an idle connection gets the server's. Nothing would hear that timer, and Node's default closes the connection:
    // this request was cut once it waited on its provider longer than the limit.
    if (reply.raw.socket === null) reply.raw.once('socket', (socket: Socket) => socket.setTimeout(app.server.timeout));
    // Answered here, done() is not called: fastify goes no further.
    const hostFault = hostHeaderFault(request.raw);
    if (hostFault !== undefined) {
      sendError(reply, new GatewayError('bad_request', hostFault));
    } else if (hostAllowed !== undefined && request.headers.host !== undefined && !hostAllowed(request.headers.host)) {
      sendError(reply, new GatewayError('host_not_allowed', `the gateway does not answer to "${printable(request.headers.host, 100)}": on a loopback address it answers its local names only, since a DNS name pointed at this machine is how a web page would reach it (DNS rebinding); a proxy that sends that name needs it in server.allowedHosts`));
    } else if (request.headers.via !== undefined && runtime.loop.cameBack(request.headers.via)) {
      logger.error({ reqId: request.id, path: request.url.split('?')[0] }, 'a request this gateway sent upstream came back to it: a provider baseUrl points at the gateway itself');
      sendError(reply, new GatewayError('loop_detected', 'the request came back to the gateway that sent it upstream: a provider\'s baseUrl points at the gateway itself (is OPENAI_BASE_URL, or the variable the config reads, set to the gateway\'s address where it was started?)'));
    } else if (!admitted(request, reply)) {
      // Answered 401 by admitted().
    } else if (phase === 'closing' && router.paths.has(request.url.split('?')[0]!)) sendError(reply, drainingError());
    else done();
  });
  app.decorate('drain', async () => {
    if (phase !== 'serving') return;
    phase = 'draining';
    logger.info({ preStopMs: config.drain.preStopMs }, 'draining: readiness off');
    await sleep(config.drain.preStopMs);
    phase = 'closing';
    runtime.lot.close();
    logger.info({ graceMs: config.drain.graceMs }, 'closing: parked requests answered, new requests refused');
    // Idle connections are closed as they turn idle (the preClose sweep), so only requests in flight hold close().
    const closed = app.close();
    const graceOver = new AbortController();
    const graceTimer = sleep(config.drain.graceMs, true, { signal: graceOver.signal }).catch(() => false);
    const outOfTime = await Promise.race([closed.then(() => false), graceTimer]);
    // Closed in time: the grace timer must not keep the process (or a test) alive, nor log a late warning.
    graceOver.abort();
    if (outOfTime) {
      logger.warn({ streams: live.size, requests: inPipeline.size }, 'grace period over: ending the remaining streams and requests');
      pastGrace = true;
      // A stream cut by the exit would end in a reset the SDKs report as a network error; an error event says why.
      for (const stream of live) stream.interrupt();
      // Requests not answered yet stop where they are (no new attempt goes upstream) and get 503 gateway_draining.
      for (const abort of inPipeline) abort();
      // So do requests whose body is still arriving: they never reached the pipeline, and must not hold the exit.
      sweep.cutUnfinishedBodies();
      // Ended streams let close() finish, which runs onClose (the state store's last flush); it gets a moment, no more.
      await Promise.race([closed, sleep(STREAM_GOODBYE_MS)]);
    }
  });
  app.addHook('onResponse', (request, reply, done) => {
    markAnsweredEarly(request);
    ends.answered(request, reply);
    done();
  });
  // Parked requests are answered at once when the server starts closing, so closing never waits out their deadlines;
  // connections no answer is owed on are closed as they turn idle, so closing waits for requests in flight alone.
  // A request whose body has not arrived whole has not reached the pipeline: a drain gives it its grace period to
  // arrive, a close without a drain (SIGINT, app.close()) none, and it is answered 503 gateway_draining at once.
  app.addHook('preClose', async () => {
    sweep.start();
    if (phase !== 'closing') sweep.cutUnfinishedBodies();
    runtime.lot.close();
  });
  app.addHook('onClose', async () => {
    sweep.stop();
    // Runs under idempotency keys whose clients left hold no connection, so close() did not wait for them: a drain
    // does, before the store closes, or their answers (or their keys given back) never reached it and the keys stayed
    // claimed. Past the grace period they were interrupted with the rest, and end at once.
    if (phase === 'closing') await Promise.allSettled([...detachedRuns]);
    await runtime.close();
  });

  app.setErrorHandler((err, request, reply) => {
    // Headers already on the wire (a stream that broke): nothing can be said in the OpenAI shape any more.
    if (reply.raw.headersSent) {
      request.log.warn({ err }, 'error after the answer started');
      reply.raw.destroy();
      return;
    }
    // Whatever the failed answer had set (a header that could not be written, a stream's content type) must not
    // leak into the error, or writing the error would fail the same way.
    clearHeaders(request, reply);
    if (request.stormgate?.outcome === 'success') request.stormgate.outcome = 'gateway_error';
    return sendError(reply, toGatewayError(err, request));
  });
  app.setNotFoundHandler((request, reply) =>
    sendError(reply, new GatewayError('unknown_url', `no route for ${request.method} ${request.url.split('?')[0]}`)),
  );

  // The managed API lives in its own context, with a JSON parser that keeps the raw bytes to forward unchanged.
  await app.register(async (api) => {
    const bodyLimit = config.server.bodyLimitBytes;
    const routesByPath = new Map<string, RouteConfig[]>();
    for (const r of router.routes) routesByPath.set(r.config.match.path, [...(routesByPath.get(r.config.match.path) ?? []), r.config]);
    // A callback hook, not an async one: the common case (no content-encoding) costs no promise.
    api.addHook('preParsing', (request, reply, payload, done) => {
      // The deadline counts from the request's head (handle-request.ts), the upload included: a body still arriving
      // when it passes is answered then, not once the upload ends, long after the client gave up.
      const routes = request.method === 'POST' && !request.raw.complete ? routesByPath.get(request.routeOptions.url ?? '') : undefined;
      if (routes) answerAtDeadline(request, reply, longestBudgetMs(routes, request.headers));
      if (request.headers['content-encoding'] === undefined) return done(null, payload);
      try {
        const encoding = contentEncoding(request.headers['content-encoding']);
        done(null, encoding ? decodeBody(payload, encoding, bodyLimit) : payload);
      } catch (err) {
        done(err as GatewayError);
      }
    });
    // Only JSON is accepted on the managed API; anything else gets 415 from fastify.
    api.removeAllContentTypeParsers();
    api.addContentTypeParser('application/json', { parseAs: 'buffer' }, (_req, body, done) => {
      const parsed = parseJsonBody(body as Buffer);
      if (parsed instanceof GatewayError) return done(parsed, undefined);
      done(null, parsed);
    });
    // A route on Anthropic's own API (or on another path of it, served by Anthropic targets only) answers errors in a
    // shape the Anthropic SDKs read too.
    const anthropic = new Set(
      router.routes
        .filter((r) => r.api === 'messages' || (r.api === 'other' && r.config.targets.every((t) => config.providers[t.provider]?.family === 'anthropic')))
        .map((r) => r.config.match.path),
    );
    for (const path of router.paths) {
      const routeConfig = { anthropic: anthropic.has(path) };
      api.post(path, { config: routeConfig }, async (request, reply) => serveManaged(path, request, reply));
      methodGuard(api, path, ['POST'], path, routeConfig);
    }
    // A client that sends anthropic-version (the Anthropic SDKs) reads the listing in Anthropic's shape.
    // Its errors too (a client key refused, a model not found): the Anthropic SDKs raise either shape, but read the type.
    // And it is listed only the models of the routes on Anthropic's API: the rest (a `smart` alias on chat
    // completions) it cannot call, and Claude Code, offered one, got 404 model_not_found on /v1/messages.
    const modelsConfig = { anthropicByHeader: true };
    const callable = (request: FastifyRequest) => (sentAnthropicVersion(request) ? anthropic : undefined);
    api.get('/v1/models', { config: modelsConfig }, async (request) => {
      const list = await models.list(callable(request));
      return sentAnthropicVersion(request) ? asAnthropicPage(list) : list;
    });
    methodGuard(api, '/v1/models', ['GET', 'HEAD'], undefined, modelsConfig);
    // The SDK's models.retrieve(id). A wildcard, not a parameter: ids may hold a '/' (vLLM, OpenRouter) and run long.
    api.get('/v1/models/*', { config: modelsConfig }, async (request) => {
      const id = (request.params as { '*': string })['*'];
      if (id === '') throw new GatewayError('model_not_found', 'no model named: use GET /v1/models/{model}', { param: 'model' });
      const found = await models.retrieve(id, callable(request));
      if (!found) throw new GatewayError('model_not_found', `the model \`${printable(id)}\` does not exist or is not served by this gateway`, { param: 'model' });
      return sentAnthropicVersion(request) ? asAnthropicModel(found) : found;
    });
    methodGuard(api, '/v1/models/*', ['GET', 'HEAD'], undefined, modelsConfig);
  });

  /**
   * Answers 504 deadline_exceeded when the deadline passes before the body has arrived whole, and closes the
   * connection: the rest of the body is not read (the client has given up on the answer anyway).
   */
  function answerAtDeadline(request: FastifyRequest, reply: FastifyReply, budgetMs: number): void {
    const timer = setTimeout(() => {
      if (request.raw.complete || reply.sent || reply.raw.headersSent) return;
      reply.header('connection', 'close');
      sendError(reply, new GatewayError('deadline_exceeded', `the request's deadline of ${budgetMs} ms passed while its body was still arriving`));
    }, Math.max(0, budgetMs - reply.elapsedTime));
    const clear = () => clearTimeout(timer);
    request.raw.once('end', clear);
    reply.raw.once('close', clear);
  }

  /** A managed request: route it, run the pipeline, write its answer. */
  async function serveManaged(path: string, request: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
    const body = request.body as ParsedBody | undefined;
    if (!body) throw new GatewayError('invalid_body', 'the request needs a JSON body (content-type: application/json)');
    const route = routeFor(path, body.json);
    checkTimeoutHeader(request.headers['x-stormgate-timeout-ms']);
    // Built only for a request that has a key (or a route whose bodies are keys): the others (nearly all) pay a lookup.
    const keyed =
      request.headers[IDEMPOTENCY_HEADER] === undefined && route.config.idempotency === undefined
        ? undefined
        : keyedRequest(
            { headers: request.headers, client: request.client, path, query: queryOf(request.url), rawBody: body.raw, json: body.json, route, receivedMs: reply.elapsedTime, clientGone: () => reply.raw.destroyed, pastGrace: () => pastGrace },
            idempotencyDeps,
          );
    ends.enterPipeline(request);
    let answer: PipelineAnswer;
    let claim: KeyClaim | undefined;
    /** The pipeline's own stream: under a key, read to its end after the client's copy of it has closed. */
    let pipelineStream: Readable | undefined;
    try {
      if (keyed) {
        claim = await claimKey(keyed, idempotencyDeps);
        if (claim.kind === 'replay') {
          ends.leavePipeline(request, reply);
          request.stormgate = replaySummary(route, claim.answer);
          return sendAnswer(reply, { ...replayed(claim.answer), summary: request.stormgate });
        }
        const { ended } = claim;
        detachedRuns.add(ended);
        void ended.then(() => detachedRuns.delete(ended));
      }
      answer = await handleManagedRequest(
        {
          route,
          path,
          query: queryOf(request.url),
          rawBody: body.raw,
          json: body.json,
          headers: request.headers,
          requestId: request.id,
          // Since onRequest, right after the head arrived: the body's upload (and decoding) took this much of the deadline.
          receivedMs: reply.elapsedTime,
          ...(request.client !== undefined && { clientPriority: clientPriorities.get(request.client) }),
          onClientGone: (listener) => ends.onClientGone(request, reply, listener),
          onShutdown,
          ...(keyed && { idempotent: true }),
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
    if (answer.live && pipelineStream) {
      const stream = answer.live;
      live.add(stream);
      pipelineStream.once('close', () => live.delete(stream));
      // Its first output came just as the grace period ran out: it ends after it, with the error event.
      if (pastGrace) stream.interrupt();
    }
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
  }

  const idempotencyDeps: IdempotencyDeps = { store: runtime.store, config: config.idempotency, now: runtime.pipeline.now, random: runtime.pipeline.random };

  /** The route for a managed request, or the error for a request without a usable model or one no route serves. */
  function routeFor(path: string, json: Record<string, unknown>): CompiledRoute {
    const given = json.model;
    if (given !== undefined && typeof given !== 'string') throw missingModel(given);
    const model = given === '' ? undefined : given;
    const match = router.match(path, model);
    if ('error' in match) {
      if (match.error === 'unknown_url') throw new GatewayError('unknown_url', `no route for POST ${path}`);
      if (model === undefined) throw missingModel(given);
      throw new GatewayError('model_not_found', `the model \`${printable(model)}\` is not served by this gateway`, { param: 'model' });
    }
    // A route that serves any model still needs one, unless every target names its own.
    if (model === undefined && !match.route.config.targets.every((t) => t.model !== undefined)) throw missingModel(given);
    return match.route;
  }

  if (config.passthrough) {
    const { paths, methods } = config.passthrough;
    await registerPassthrough(app, config.passthrough, config.providers[config.passthrough.provider]!, config.routes.map((r) => r.match.path), runtime.loop.via);
    // The path is open, the method is not: 405 with `allow`, as on the managed paths (HEAD goes with GET).
    const allowed = methods.includes('GET') ? [...methods, 'HEAD'] : methods;
    for (const path of paths) {
      methodGuard(app, path, allowed);
      methodGuard(app, `${path}/*`, allowed, `${path}/...`);
    }
  }

  app.get('/metrics', async (_request, reply) => {
    reply.type(metrics.registry.contentType);
    return metrics.registry.metrics();
  });
  app.get('/healthz', async () => ({ status: 'ok' }));
  app.get('/readyz', async (_request, reply) => {
    const state = { store: runtime.store.kind, degraded: runtime.store.degraded };
    if (phase !== 'serving') return reply.code(503).send({ status: phase, ...state });
    // Degraded (Redis away) is still ready: the gateway serves on local state; the body names it.
    return { status: runtime.store.degraded ? 'ready (degraded: local state)' : 'ready', ...state };
  });

  return app;
}

/** The client's `x-request-id` when it is a usable one, else a fresh id. */
function requestIdOf(req: IncomingMessage): string {
  const given = req.headers['x-request-id'];
  return typeof given === 'string' && REQUEST_ID.test(given) ? given : randomUUID();
}

/** What a client without a valid key is told; never the key it sent. */
function unauthorized(reason: 'missing' | 'invalid'): GatewayError {
  const message =
    reason === 'missing'
      ? 'this gateway needs a client key: send it as your API key (Authorization: Bearer <key>, x-api-key or api-key)'
      : 'the client key sent is not one of this gateway\'s keys';
  return new GatewayError('invalid_api_key', message, { headers: { 'www-authenticate': 'Bearer realm="stormgate"' } });
}

function sendError(reply: FastifyReply, err: GatewayError): FastifyReply {
  const answer = errorAnswer(err);
  reply.header('x-request-id', reply.request.id);
  return reply.code(answer.status).headers(safeHeaders({ ...answer.headers, ...err.headers })).type('application/json').send(clientShaped(reply, answer.status, answer.body));
}

/**
 * Is the request on a route whose clients speak Anthropic's API (the route's `anthropic` config), or on the model
 * listing by a client that sent `anthropic-version` (the listing answers it in Anthropic's shape)?
 */
function speaksAnthropic(reply: FastifyReply): boolean {
  const config = reply.request.routeOptions.config as { anthropic?: boolean; anthropicByHeader?: boolean } | undefined;
  return config?.anthropic === true || (config?.anthropicByHeader === true && sentAnthropicVersion(reply.request));
}

/** A client that sends anthropic-version speaks Anthropic's API (the Anthropic SDKs always send it). */
function sentAnthropicVersion(request: FastifyRequest): boolean {
  return request.headers['anthropic-version'] !== undefined;
}

/**
 * An error body as the route's clients read it: the OpenAI shape; for Anthropic's API that shape with Anthropic's
 * `type: "error"` and error type, and the request id also as `request-id`, the header the Anthropic SDKs read.
 */
function clientShaped(reply: FastifyReply, status: number, body: OpenAIErrorBody): OpenAIErrorBody {
  if (!speaksAnthropic(reply)) return body;
  if (reply.getHeader('request-id') === undefined) reply.header('request-id', reply.getHeader('x-request-id') ?? reply.request.id);
  return toAnthropicShape(status, body);
}

/** Writes the pipeline's answer. A stream that cannot be sent is closed, so its upstream connection is not left open. */
function sendAnswer(reply: FastifyReply, answer: PipelineAnswer): FastifyReply {
  reply.code(answer.status);
  const { body } = answer;
  if (!(body instanceof Readable)) {
    // An error the gateway made itself has no provider's id: the SDKs show ours instead (err.requestID, request_id),
    // which is the one the gateway's log lines carry.
    if (answer.status >= 400 && answer.headers['x-request-id'] === undefined) reply.header('x-request-id', reply.request.id);
    reply.headers(safeHeaders(answer.headers));
    return Buffer.isBuffer(body) ? reply.send(body) : reply.type('application/json').send(answer.status >= 400 ? clientShaped(reply, answer.status, body as OpenAIErrorBody) : body);
  }
  try {
    return sendStream(reply, body, answer.headers);
  } catch (err) {
    body.destroy();
    throw err;
  }
}

/**
 * A stream's first output is the time to first token: its head and first chunk leave now, in one write, not after
 * the ticks reply.send(stream) takes to start its pipe (every pending promise of the request runs first). fastify
 * still runs onResponse on the response's 'finish' (so the request is logged and counted once). The body is
 * destroyed when the response closes first (the client left; the body's 'close' aborts the upstream), and the
 * response when the body fails: what stream.pipeline() does, without the AbortController it makes and aborts per
 * call (with a DOMException and an event dispatch each, a sixteenth of a stream's CPU).
 */
function sendStream(reply: FastifyReply, body: Readable, headers: Record<string, string>): FastifyReply {
  const res = reply.raw;
  // The answer's headers go straight into the head, not through fastify's reply (set one by one, then copied out).
  // Throws before hijacking when a header value cannot be written: the error handler answers then.
  res.writeHead(reply.statusCode, Object.assign(reply.getHeaders() as OutgoingHttpHeaders, safeHeaders(headers)));
  reply.hijack();
  // The pipeline's own body, not read by anyone else (an idempotency key's copy): written straight into the response.
  if (!(body instanceof StreamBody && body.writeTo(res))) {
    writeOpening(res, body.read());
    body.pipe(res);
  }
  body.once('error', (err) => {
    reply.log.warn({ err }, 'stream answer failed after it started');
    res.destroy();
  });
  res.once('close', () => {
    if (!body.destroyed) body.destroy();
  });
  // The client left before this listener was there (its 'close' has fired): the body goes now, as it would have then.
  if (res.destroyed && !body.destroyed) body.destroy();
  // Destroyed before its end without an error (a client that stopped reading: pipeline's client-stalled): pipe()
  // only unpipes (writeTo only stops), which would leave the connection and its unread megabytes open for as long as
  // the client keeps it.
  body.once('close', () => {
    if (!res.writableEnded) res.destroy();
  });
  return reply;
}

/** Forgets every header an answer had set (in fastify and on the raw response), keeping the request id. */
function clearHeaders(request: FastifyRequest, reply: FastifyReply): void {
  for (const name of Object.keys(reply.getHeaders())) reply.removeHeader(name);
  for (const name of reply.raw.getHeaderNames()) reply.raw.removeHeader(name);
  reply.header('x-stormgate-request-id', request.id);
}

/**
 * 405 for the methods a path does not serve, with `allow`. It answers in onRequest, before the body is parsed, so a
 * wrong method gets 405 whatever its content type.
 */
function methodGuard(api: FastifyInstance, url: string, allowed: readonly string[], shown = url.replace(/\/\*$/, '/{model}'), config: object = {}): void {
  api.route({
    method: ALL_METHODS.filter((m) => !allowed.includes(m)),
    url,
    config,
    // HEAD comes with GET unless told otherwise; it is allowed exactly when GET is.
    exposeHeadRoute: false,
    onRequest: async (request) => {
      throw methodNotAllowed(request.method, shown, allowed);
    },
    handler: async () => undefined,
  });
}

/** A deadline the client asked for but wrote wrong must not be ignored in silence: the request would run for minutes. */
function checkTimeoutHeader(value: string | string[] | undefined): void {
  if (value === undefined) return;
  const text = Array.isArray(value) ? value[0]! : value;
  if (timeoutHeaderMs(text) === undefined) {
    throw new GatewayError('bad_request', `x-stormgate-timeout-ms must be a positive number of milliseconds, got "${printable(text, 40)}"`);
  }
}

/** The request's query string, forwarded upstream (rewriteUrl has already cut any fragment). */
function queryOf(url: string): string {
  const i = url.indexOf('?');
  return i === -1 ? '' : url.slice(i);
}

function withoutFragment(url: string): string {
  const hash = url.indexOf('#');
  return hash === -1 ? url : url.slice(0, hash);
}

