// A path open to some methods answers the others 405 with `allow`, not 404: the client found the place, with the wrong
// verb.
import type { FastifyInstance } from 'fastify';
import { methodNotAllowed } from '../errors.ts';

/** Methods a path answers 405 for when it does not serve them; a method fastify does not route at all gets 404. */
const ALL_METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'];

/**
 * 405 for the methods a path does not serve, with `allow`. It answers in onRequest, before the body is parsed, so a
 * wrong method gets 405 whatever its content type.
 */
export function methodGuard(api: FastifyInstance, url: string, allowed: readonly string[], shown = url.replace(/\/\*$/, '/{model}'), config: object = {}): void {
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
