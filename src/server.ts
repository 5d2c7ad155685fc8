// buildServer(config, deps): the fastify routes and hooks, nothing else. Per-route work is resolved here, once;
// the request path only parses, matches and hands over to the pipeline.
import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import type { Config, RouteConfig } from './config/schema.ts';
import { drainingError, GatewayError } from './errors.ts';
import type { PipelineAnswer } from './pipeline/handle-request.ts';
import { createRouter } from './routing/router.ts';
import { createModelsList } from './routing/models-list.ts';
import { createMetrics } from './observability/metrics.ts';
import { keptTargetLabel, RequestRecorder, type RejectedOutcome } from './observability/pipeline-metrics.ts';
import { createRuntime, type RuntimeDeps } from './runtime.ts';
import { accessLogger, createLogger } from './observability/logger.ts';
import { instanceName } from './http/loop-guard.ts';
import { endPassthroughCall, passthroughBase, registerPassthrough } from './providers/passthrough.ts';
import { admission } from './http/admission.ts';
import { clientLimits } from './http/client-limits.ts';
import { answerClientError, answerConnect, answerUnmetExpectation, markAnsweredEarly, toGatewayError } from './http/client-errors.ts';
import { closeSweep } from './http/close-sweep.ts';
import { gracefulDrain } from './http/drain.ts';
import { continueWanted } from './http/expect-continue.ts';
import { methodGuard, routeEveryMethod } from './http/method-guard.ts';
import { modelsRoutes } from './http/models-routes.ts';
import { longestBudgetMs } from './policy/deadline.ts';
import { reachedProvider } from './policy/outcome.ts';
import { endedWhole } from './pipeline/stream-ends.ts';
import type { TokenEstimate } from './policy/client-rate.ts';
import { contentEncoding, decodeBody, parseJsonBody } from './http/request-body.ts';
import { logRequest, plainSuccess, RequestEnds } from './http/request-log.ts';
import { clearHeaders, sendError } from './http/send-answer.ts';
import { managedHandler } from './http/serve-managed.ts';
import type { Arrival } from './state/client-repeats.ts';

export type ServerDeps = Partial<RuntimeDeps>;

declare module 'fastify' {
  interface FastifyRequest {
    stormgate?: PipelineAnswer['summary'];
    /** The client's name in auth.keys, when the gateway has client keys. */
    client?: string;
    /** A managed request, as the watch for clients' undeclared retries knows it (state/client-repeats.ts). */
    arrival?: Arrival;
    /** What the request reserved of its client's token rate (auth.limits), settled when it ends. */
    tokensReserved?: TokenEstimate;
  }
}

/**
 * Each response's reply, for the close sweep to answer a request whose body is still arriving when the server closes.
 * A property, not a WeakMap: a WeakMap's value that holds its key (reply.raw) kept every reply alive through the young
 * generation's collections, so each request was promoted and the old generation grew until a full collection (a 20 ms
 * pause at 500 requests/s).
 */
const REPLY = Symbol('stormgate.reply');
type RawWithReply = ServerResponse & { [REPLY]?: FastifyReply };

const REQUEST_ID = /^[\w.:@-]{1,128}$/;

/** The gateway's own endpoints for Prometheus and the orchestrator. */
const OPS_PATHS: ReadonlySet<string> = new Set(['/metrics', '/healthz', '/readyz']);
/** Outcomes a client does not retry: every other one makes a repeat of the request soon after a retry. */
const ANSWERED: ReadonlySet<string> = new Set(['success', 'degraded', 'replayed']);

export async function buildServer(config: Config, deps: ServerDeps = {}): Promise<FastifyInstance> {
  // Every line names the instance (the name its Via entry upstream carries): logs shipped without a pod's labels, or a
  // provider quoting the Via, still say which instance of the fleet it was.
  const instance = instanceName();
  const logger = (deps.logger ?? createLogger(config)).child({ instance });
  const access = accessLogger(logger);
  const metrics = deps.metrics ?? createMetrics();
  const runtime = await createRuntime(config, { ...deps, logger, metrics, instance });
  const now = deps.now ?? Date.now;
  const recorder = new RequestRecorder(metrics, now, keptTargetLabel(runtime.pipeline.targetKeys));
  const router = createRouter(config);
  const models = createModelsList(router, runtime.pipeline.providers);

  const app = Fastify({
    loggerInstance: logger as FastifyBaseLogger,
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: config.server.bodyLimitBytes,
    // fastify turns Node's request timeout off by default: a client that never finishes its body would hold its
    // connection (and a file descriptor) forever. Node answers 408 through clientErrorHandler below.
    requestTimeout: config.server.requestTimeoutMs,
    // Above a load balancer's idle timeout (72 s, fastify's own default, against AWS ALB's 60 s), so the balancer, not
    // the gateway, closes an idle connection, and never sends into one being closed.
    keepAliveTimeout: config.server.keepAliveTimeoutMs,
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
    clientErrorHandler: (err, socket) => answerClientError(err, socket, logger as FastifyBaseLogger, answerTimedOut),
  });
  // Node keeps a request's first 2,000 headers and drops the rest without a word: a second Host line behind 2,000
  // others passed the one-Host check. Their size stays bounded by Node's 16 KB of headers.
  app.server.maxHeadersCount = 0;
  // Every method Node parses, so a path's method guard answers TRACE or PROPFIND 405 too, not 404.
  routeEveryMethod(app);
  // CONNECT never reaches a route: without a listener Node closed the connection unanswered.
  app.server.on('connect', (_req: IncomingMessage, socket: Socket) => answerConnect(socket, logger as FastifyBaseLogger));
  // An `expect` other than 100-continue: Node would answer an empty 417 itself; this answers in the OpenAI shape.
  app.server.on('checkExpectation', (req, res) => answerUnmetExpectation(req, res, requestIdOf(req), logger as FastifyBaseLogger));
  // `expect: 100-continue` (curl sends it with large bodies) asks whether the body is wanted before it is sent. Node
  // answers 100 Continue at once, before any hook: a client with a wrong key, method or path, or a draining instance's,
  // uploaded its whole body for a 401, 405 or 503. The request goes through the hooks like any other instead, and
  // its 100 Continue only when its body is about to be read (preParsing below); refused before, it never sends the body
  // (Node closes the connection after such an answer, since the body may still come).
  app.server.on('checkContinue', (req, res) => app.server.emit('request', req, res));
  const passthroughPaths = config.passthrough?.paths.map(passthroughBase) ?? [];
  /**
   * The configured passthrough path a request falls under. Not a managed route's own request: a passthrough path under
   * the route's (`/v1/responses/`) is, without its slash, the route's path, which passthrough does not serve.
   */
  const passthroughPathOf = (request: FastifyRequest) => {
    if (router.paths.has(request.routeOptions.url ?? '')) return undefined;
    const path = request.url.split('?')[0]!;
    return passthroughPaths.find((p) => path === p || path.startsWith(`${p}/`));
  };
  const isPassthrough = (request: FastifyRequest) => passthroughPathOf(request) !== undefined;
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
      continueWanted(request.headers, { managed: router.paths.has(request.routeOptions.url ?? ''), passthrough: isPassthrough(request) }, config.server.bodyLimitBytes)
    ) {
      reply.raw.writeContinue();
    }
    done(null, payload);
  });
  // A request whose body stopped arriving for requestTimeoutMs: its 408 goes through its own reply, so its line and
  // count say what it got. A passthrough one's body went upstream as it came: its upstream call is ended with the
  // 408 as the reason, which the error handler then answers (the connection closed after it).
  const answerTimedOut = (res: ServerResponse, error: GatewayError): boolean => {
    const reply = (res as RawWithReply)[REPLY];
    if (!reply || reply.sent) return false;
    if (isPassthrough(reply.request)) return !reply.raw.headersSent && endPassthroughCall(reply.request, error);
    // The body's rest is never read: the connection closes after the answer.
    reply.header('connection', 'close');
    sendError(reply, error);
    return true;
  };
  const sweep = closeSweep(app.server, (res) => {
    const reply = (res as RawWithReply)[REPLY];
    // A passthrough request forwards its body as it arrives, and its answer is the provider's to give: it is cut.
    if (!reply || isPassthrough(reply.request)) return false;
    // The body's rest is never read: the connection closes after the answer.
    reply.header('connection', 'close');
    sendError(reply, drainingError());
    return true;
  });

  const limit = clientLimits(config.auth?.limits, {
    store: runtime.store, now, random: deps.random ?? Math.random, onLimited: (client, by) => metrics.clientLimited.inc({ client, by }),
  });

  // Math.random, not the policy's random source: sampling log lines must not shift a seeded test's jitter.
  const { logSuccessRate } = config.server;
  const ends = new RequestEnds((request, reply, gone, sentNothing) => {
    const summary = request.stormgate;
    if (summary) recorder.record(summary, reply.elapsedTime / 1000);
    // What the request reserved of its client's token rate, settled against the tokens its answer used (none came
    // without a summary: an error before the pipeline answered), or without usage the output its answer passed on,
    // all of it given back when no attempt went upstream (of the summary's attempts, those that reached a provider: a
    // connection refused wrote nothing). A replay reserved nothing: it used no provider tokens. A stream that did not
    // end whole, or that its provider broke (a recovered one), has the usage it reported before its end at most: its
    // completion counts at least the output passed on.
    if (request.tokensReserved && request.client !== undefined) {
      const end = summary?.streamEnd;
      limit?.settle(request.client, request.tokensReserved, {
        usage: summary ? [summary.usage, summary.continuationUsage?.usage] : [],
        sentUpstream: summary !== undefined && summary.attempts.some(reachedProvider),
        outputChars: end?.outputChars ?? summary?.outputChars,
        usagePartial: end !== undefined && (!endedWhole(end.kind) || end.upstreamBroke !== undefined),
      });
    }
    if (summary && request.arrival) runtime.repeats.ended(request.arrival, !ANSWERED.has(summary.outcome));
    let rejected: RejectedOutcome | undefined;
    // A managed path's request refused before the pipeline (bad body, no model, no key, draining) has no summary, yet
    // it is a client request answered: without this count a client sending only invalid requests would not show.
    // (A 504 here is a deadline that passed while the body was still arriving: answerAtDeadline.) One whose client left
    // before any answer (a repeat waiting for its idempotency key's run) has no status to go by: counted all the same.
    // A path no route serves too (a client with `/v1` twice in its base URL): the dashboards show it, not only the logs.
    if (!summary && (router.paths.has(request.routeOptions.url ?? '') || request.is404)) {
      if (sentNothing) rejected = 'client_gone';
      else if (reply.statusCode >= 400) rejected = reply.statusCode === 500 ? 'gateway_error' : reply.statusCode === 504 ? 'deadline' : 'rejected';
      if (rejected) recorder.rejected(rejected);
    }
    // Passthrough requests (none has a summary): the metrics' other series are the managed routes'.
    const passthroughPath = summary ? undefined : passthroughPathOf(request);
    if (passthroughPath !== undefined) {
      metrics.passthroughRequests.inc({ path: passthroughPath, status_class: sentNothing ? 'client_gone' : `${Math.floor(reply.statusCode / 100)}xx` });
    }
    if (logSuccessRate < 1 && plainSuccess(request, gone) && Math.random() >= logSuccessRate) return;
    // Scrapes and probes come every few seconds from machines: a line each would bury the requests; failures still show.
    if (!summary && reply.statusCode < 400 && OPS_PATHS.has(request.routeOptions.url ?? '')) return;
    // Its line says the outcome its count has, so a search of the logs finds what the metric counted.
    logRequest(access, request, reply, gone, sentNothing, rejected);
  });

  const drain = gracefulDrain(app, config.drain, logger, runtime, sweep);
  const admit = admission({ config, loop: runtime.loop, logger, managedPaths: router.paths, opsPaths: OPS_PATHS, drain, limit });
  // A callback hook: an async one costs every request a promise and a tick.
  app.addHook('onRequest', (request, reply, done) => {
    reply.header('x-stormgate-request-id', request.id);
    // Draining: the load balancer sends new connections elsewhere, but a keep-alive client stays on its connection
    // (an L4 balancer, kube-proxy, keeps it where it is) and met the closing instance's 503s, or its idle close as it
    // sent. Closed after this answer, the client's next request opens a connection the balancer sends to a ready one.
    if (drain.phase !== 'serving') reply.header('connection', 'close');
    ends.watch(request, reply);
    (reply.raw as RawWithReply)[REPLY] = reply;
    // Pipelined behind an answer still being written: Node hands this one the connection when that answer is done,
    // with the socket timer it left (a whole answer's stall limit, PipelineAnswer.clientStallMs), where a request on
    // an idle connection gets the server's. Nothing would hear that timer, and Node's default closes the connection:
    // this request was cut once it waited on its provider longer than the limit.
    if (reply.raw.socket === null) reply.raw.once('socket', (socket: Socket) => socket.setTimeout(app.server.timeout));
    // Answered here (at once, or once a limited client's rates are read), done() is not called: fastify goes no further.
    // A failure reading the rates goes to the error handler, rather than leave the request hanging unanswered.
    const admitted = admit(request, reply);
    if (admitted === true) done();
    else if (admitted !== false) admitted.then((ok) => ok && done(), (err: unknown) => done(err as Error));
  });
  app.addHook('onResponse', (request, reply, done) => {
    markAnsweredEarly(request);
    ends.answered(request, reply);
    done();
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
    // A passthrough upload answered before all of it came in (the client's deadline, the provider gone mid-upload):
    // its rest is never read, so the connection can carry no next request. Kept open, the next one hung unanswered.
    // Draining, the onRequest hook's close, which clearHeaders took off, holds for an error too.
    if (drain.phase !== 'serving' || (!request.raw.complete && isPassthrough(request))) reply.header('connection', 'close');
    if (request.stormgate?.outcome === 'success') request.stormgate.outcome = 'gateway_error';
    return sendError(reply, toGatewayError(err, request));
  });
  app.setNotFoundHandler((request, reply) =>
    sendError(reply, new GatewayError('unknown_url', `no route for ${request.method} ${request.url.split('?')[0]}`)),
  );

  const serveManaged = managedHandler({ config, limit, runtime, router, ends, drain });
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
      // serveManaged's own promise: an async wrapper would add one more, and the ticks of resolving it with another.
      api.post(path, { config: routeConfig }, (request, reply) => serveManaged(path, request, reply));
      methodGuard(api, path, ['POST'], path, routeConfig);
    }
    modelsRoutes(api, models, anthropic);
  });

  if (config.passthrough) {
    const { paths, methods } = config.passthrough;
    await registerPassthrough(app, config.passthrough, config.providers[config.passthrough.provider]!, config.routes.map((r) => r.match.path), runtime.loop.via);
    // The path is open, the method is not: 405 with `allow`, as on the managed paths (HEAD goes with GET).
    const allowed = methods.includes('GET') ? [...methods, 'HEAD'] : methods;
    for (const path of paths) {
      methodGuard(app, path, allowed);
      // Under the path without its slash: `/v1/files/` guarded as `/v1/files//*` left a wrong method under it a 404.
      const bare = passthroughBase(path);
      methodGuard(app, `${bare}/*`, allowed, `${bare}/...`);
    }
  }

  // A probe or scraper set up with the wrong verb learns that, not that the path is gone.
  for (const path of OPS_PATHS) methodGuard(app, path, ['GET', 'HEAD']);
  app.get('/metrics', async (_request, reply) => {
    reply.type(metrics.registry.contentType);
    return metrics.registry.metrics();
  });
  app.get('/healthz', async () => ({ status: 'ok' }));
  app.get('/readyz', async (_request, reply) => {
    const state = { store: runtime.store.kind, degraded: runtime.store.degraded };
    if (drain.phase !== 'serving') return reply.code(503).send({ status: drain.phase, ...state });
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

function withoutFragment(url: string): string {
  const hash = url.indexOf('#');
  return hash === -1 ? url : url.slice(0, hash);
}

