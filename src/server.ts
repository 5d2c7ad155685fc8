// buildServer(config, deps): the fastify routes and hooks, nothing else. Per-route work is resolved here, once;
// the request path only parses, matches and hands over to the pipeline.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { Readable } from 'node:stream';
import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import type { Config } from './config/schema.ts';
import { drainingError, GatewayError } from './errors.ts';
import { errorAnswer } from './pipeline/final-answer.ts';
import { handleManagedRequest, type PipelineAnswer } from './pipeline/handle-request.ts';
import { createRouter } from './routing/router.ts';
import { createModelsList } from './routing/models-list.ts';
import { createMetrics } from './observability/metrics.ts';
import { RequestRecorder } from './observability/pipeline-metrics.ts';
import { createRuntime, type RuntimeDeps } from './runtime.ts';
import { createLogger } from './observability/logger.ts';
import { registerPassthrough } from './providers/passthrough.ts';

export type ServerDeps = Partial<RuntimeDeps>;

interface ParsedBody {
  raw: Buffer;
  json: Record<string, unknown>;
}

declare module 'fastify' {
  interface FastifyRequest {
    stormgate?: PipelineAnswer['summary'];
  }
  interface FastifyInstance {
    /** SIGTERM's graceful shutdown: readiness off, preStopMs of service, then parked answered, new refused, in-flight given graceMs. */
    drain(): Promise<void>;
  }
}

type Phase = 'serving' | 'draining' | 'closing';

const REQUEST_ID = /^[\w.:@-]{1,128}$/;

export async function buildServer(config: Config, deps: ServerDeps = {}): Promise<FastifyInstance> {
  const logger = deps.logger ?? createLogger(config);
  const metrics = deps.metrics ?? createMetrics();
  const runtime = await createRuntime(config, { ...deps, logger, metrics });
  const recorder = new RequestRecorder(metrics, deps.now ?? Date.now);
  const router = createRouter(config);
  const models = createModelsList(router, runtime.pipeline.providers);

  const app = Fastify({
    loggerInstance: logger as FastifyBaseLogger,
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: config.server.bodyLimitBytes,
    // Our own onRequest hook answers during shutdown, in the OpenAI error shape and with x-should-retry.
    return503OnClosing: false,
    forceCloseConnections: 'idle',
    genReqId: (req) => {
      const given = req.headers['x-request-id'];
      return typeof given === 'string' && REQUEST_ID.test(given) ? given : randomUUID();
    },
  });

  let phase: Phase = 'serving';
  app.addHook('onRequest', async (request, reply) => {
    reply.header('x-stormgate-request-id', request.id);
    if (phase === 'closing' && router.paths.has(request.url.split('?')[0]!)) {
      return sendError(reply, drainingError());
    }
  });
  app.decorate('drain', async () => {
    if (phase !== 'serving') return;
    phase = 'draining';
    logger.info({ preStopMs: config.drain.preStopMs }, 'draining: readiness off');
    await sleep(config.drain.preStopMs);
    phase = 'closing';
    runtime.lot.close();
    logger.info({ graceMs: config.drain.graceMs }, 'closing: parked requests answered, new requests refused');
    const grace = sleep(config.drain.graceMs).then(() => logger.warn('grace period over: closing the remaining connections'));
    // A keep-alive connection that turns idle after close() began would otherwise hold the server open until it times out.
    const sweep = setInterval(() => app.server.closeIdleConnections(), 100);
    await Promise.race([app.close(), grace]);
    clearInterval(sweep);
  });
  app.addHook('onResponse', async (request, reply) => {
    if (request.stormgate) recorder.record(request.stormgate, reply.elapsedTime / 1000);
    logRequest(request, reply);
  });
  // Parked requests are answered at once when the server starts closing, so closing never waits out their deadlines.
  app.addHook('preClose', async () => runtime.lot.close());
  app.addHook('onClose', async () => runtime.close());

  app.setErrorHandler((err, request, reply) => sendError(reply, toGatewayError(err, request)));
  app.setNotFoundHandler((request, reply) =>
    sendError(reply, new GatewayError('unknown_url', `no route for ${request.method} ${request.url.split('?')[0]}`)),
  );

  // The managed API lives in its own context, with a JSON parser that keeps the raw bytes to forward unchanged.
  await app.register(async (api) => {
    // Only JSON is accepted on the managed API; anything else gets 415 from fastify.
    api.removeAllContentTypeParsers();
    api.addContentTypeParser('application/json', { parseAs: 'buffer' }, (_req, body, done) => {
      const raw = body as Buffer;
      let json: unknown;
      try {
        json = JSON.parse(raw.toString('utf8'));
      } catch (e) {
        return done(new GatewayError('invalid_json', `the request body is not valid JSON: ${(e as Error).message}`), undefined);
      }
      if (typeof json !== 'object' || json === null || Array.isArray(json)) {
        return done(new GatewayError('invalid_body', 'the request body must be a JSON object'), undefined);
      }
      done(null, { raw, json: json as Record<string, unknown> } satisfies ParsedBody);
    });
    for (const path of router.paths) {
      api.post(path, async (request, reply) => {
        const body = request.body as ParsedBody | undefined;
        if (!body) throw new GatewayError('invalid_body', 'the request needs a JSON body (content-type: application/json)');
        const model = typeof body.json.model === 'string' ? body.json.model : undefined;
        const match = router.match(path, model);
        if ('error' in match) {
          throw match.error === 'model_not_found'
            ? new GatewayError('model_not_found', `the model \`${model ?? ''}\` is not served by this gateway`, { param: 'model' })
            : new GatewayError('unknown_url', `no route for POST ${path}`);
        }
        const answer = await handleManagedRequest(
          {
            route: match.route,
            path,
            query: queryOf(request.url),
            rawBody: body.raw,
            json: body.json,
            headers: request.headers,
            requestId: request.id,
            onClientGone: (listener) => onClientGone(request, reply, listener),
          },
          runtime.pipeline,
        );
        request.stormgate = answer.summary;
        reply.code(answer.status).headers(answer.headers);
        if (answer.body instanceof Readable) return reply.send(answer.body);
        if (Buffer.isBuffer(answer.body)) return reply.send(answer.body);
        return reply.type('application/json').send(answer.body);
      });
      api.route({
        method: ['GET', 'PUT', 'PATCH', 'DELETE'],
        url: path,
        handler: async (request) => {
          throw new GatewayError('method_not_allowed', `${request.method} is not allowed on ${path}; use POST`);
        },
      });
    }
    api.get('/v1/models', async () => models.list());
  });

  if (config.passthrough) await registerPassthrough(app, config.passthrough, config.providers[config.passthrough.provider]!);

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

function sendError(reply: FastifyReply, err: GatewayError): FastifyReply {
  const answer = errorAnswer(err);
  return reply.code(answer.status).headers(answer.headers).type('application/json').send(answer.body);
}

/** fastify's own errors (body too large, bad media type) in the OpenAI shape. */
function toGatewayError(err: unknown, request: FastifyRequest): GatewayError {
  if (err instanceof GatewayError) return err;
  const e = err as { code?: string; statusCode?: number; message?: string };
  switch (e.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return new GatewayError('request_too_large', `the request body is larger than the gateway accepts (${e.message ?? ''})`);
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return new GatewayError('unsupported_media_type', `content-type ${String(request.headers['content-type'])} is not supported; send application/json`);
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
    case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH':
      return new GatewayError('invalid_body', e.message ?? 'the request body is empty or broken');
  }
  if (e.statusCode !== undefined && e.statusCode >= 400 && e.statusCode < 500) return new GatewayError('invalid_body', e.message ?? 'bad request');
  request.log.error({ err }, 'unhandled error');
  return new GatewayError('internal_error', 'the gateway failed to handle the request');
}

/** Calls `listener` when the client closes the connection before its answer is complete; returns its removal. */
function onClientGone(request: FastifyRequest, reply: FastifyReply, listener: () => void): () => void {
  const res = reply.raw;
  if (request.raw.destroyed) {
    listener();
    return () => {};
  }
  const onClose = () => {
    if (!res.writableFinished) listener();
  };
  res.once('close', onClose);
  return () => res.removeListener('close', onClose);
}

function queryOf(url: string): string {
  const i = url.indexOf('?');
  return i === -1 ? '' : url.slice(i);
}

function logRequest(request: FastifyRequest, reply: FastifyReply): void {
  const s = request.stormgate;
  const line = {
    method: request.method,
    path: request.routeOptions.url ?? request.url.split('?')[0],
    status: reply.statusCode,
    durationMs: Math.round(reply.elapsedTime),
    ...(s && {
      route: s.route,
      target: s.target,
      priority: s.priority,
      outcome: s.outcome,
      attempts: s.attempts,
      budgetMs: s.budgetMs,
      deadlineSource: s.deadlineSource,
      ttftMs: s.ttftMs,
      upstreamRequestId: s.upstreamRequestId,
      streamEnd: s.streamEnd?.kind,
      fallback: s.fallback,
      ...(s.skipped.length > 0 && { skipped: s.skipped }),
    }),
  };
  if (s?.streamEnd && s.streamEnd.kind !== 'complete' && s.streamEnd.kind !== 'client-gone') request.log.warn(line, 'stream ended abnormally');
  else request.log.info(line, 'request');
}

