// What onRequest refuses before a body is read: a client refused here never uploads the body its headers condemned.
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import type { Config } from '../config/schema.ts';
import { drainingError, GatewayError } from '../errors.ts';
import { clientAuth, presentedKey, withoutKeyInQuery } from './client-auth.ts';
import type { ClientLimit } from './client-limits.ts';
import type { Drain } from './drain.ts';
import { hostAllowance, hostHeaderFault } from './host-header.ts';
import type { LoopGuard } from './loop-guard.ts';
import { printable } from './request-body.ts';
import { sendError } from './send-answer.ts';

interface AdmissionDeps {
  config: Pick<Config, 'server' | 'auth'>;
  loop: LoopGuard;
  logger: Logger;
  /** The managed API's paths: refused while the instance is closing. */
  managedPaths: ReadonlySet<string>;
  /** The gateway's own endpoints, open without a client key. */
  opsPaths: ReadonlySet<string>;
  drain: Pick<Drain, 'phase'>;
  /** auth.limits, when any client has one. */
  limit?: ClientLimit | undefined;
}

/**
 * True when the request goes on; false when it has been answered (a wrong Host, a loop, no client key, closing, a
 * client over its rate). A promise only for a client with a rate limit, which the state store is asked about.
 */
type Admission = (request: FastifyRequest, reply: FastifyReply) => boolean | Promise<boolean>;

export function admission({ config, loop, logger, managedPaths, opsPaths, drain, limit }: AdmissionDeps): Admission {
  const hostAllowed = hostAllowance(config.server);
  const auth = clientAuth(config.auth?.keys);
  /** With client keys configured, a request without one of them is answered 401 here; the ops endpoints stay open. */
  const admitted = (request: FastifyRequest, reply: FastifyReply): boolean => {
    if (auth === undefined || opsPaths.has(request.routeOptions.url ?? '')) return true;
    const verdict = auth(request.headers);
    if (verdict.ok) {
      request.client = verdict.client;
      const url = request.raw.url;
      if (url !== undefined && url.includes('?')) request.raw.url = withoutKeyInQuery(url, presentedKey(request.headers)!);
      return true;
    }
    sendError(reply, unauthorized(verdict.reason));
    return false;
  };
  /** Last, so a request refused for any other reason does not use up its client's rate. */
  const withinRate = (request: FastifyRequest, reply: FastifyReply): boolean | Promise<boolean> => {
    const refusal = request.client === undefined ? undefined : limit?.admit(request.client);
    if (refusal === undefined) return true;
    return refusal.then((err) => {
      if (err === undefined) return true;
      sendError(reply, err);
      return false;
    });
  };
  return (request, reply) => {
    const hostFault = hostHeaderFault(request.raw);
    if (hostFault !== undefined) {
      sendError(reply, new GatewayError('bad_request', hostFault));
    } else if (hostAllowed !== undefined && request.headers.host !== undefined && !hostAllowed(request.headers.host)) {
      sendError(reply, new GatewayError('host_not_allowed', `the gateway does not answer to "${printable(request.headers.host, 100)}": on a loopback address it answers its local names only, since a DNS name pointed at this machine is how a web page would reach it (DNS rebinding); a proxy that sends that name needs it in server.allowedHosts`));
    } else if (request.headers.via !== undefined && loop.cameBack(request.headers.via)) {
      logger.error({ reqId: request.id, path: request.url.split('?')[0] }, 'a request this gateway sent upstream came back to it: a provider baseUrl points at the gateway itself');
      sendError(reply, new GatewayError('loop_detected', 'the request came back to the gateway that sent it upstream: a provider\'s baseUrl points at the gateway itself (is OPENAI_BASE_URL, or the variable the config reads, set to the gateway\'s address where it was started?)'));
    } else if (!admitted(request, reply)) {
      // Answered 401 by admitted().
    } else if (drain.phase === 'closing' && managedPaths.has(request.routeOptions.url ?? '')) {
      // The route matched, not the URL as sent: the router decodes `/v1/chat/%63ompletions` and serves it.
      sendError(reply, drainingError());
    } else return withinRate(request, reply);
    return false;
  };
}

/** What a client without a valid key is told; never the key it sent. */
function unauthorized(reason: 'missing' | 'invalid'): GatewayError {
  const message =
    reason === 'missing'
      ? 'this gateway needs a client key: send it as your API key (Authorization: Bearer <key>, x-api-key or api-key)'
      : 'the client key sent is not one of this gateway\'s keys';
  return new GatewayError('invalid_api_key', message, { headers: { 'www-authenticate': 'Bearer realm="stormgate"' } });
}
