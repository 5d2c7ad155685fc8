// A path open to some methods answers the others 405 with `allow`, not 404: the client found the place, with the wrong
// verb.
import { METHODS } from 'node:http';
import type { FastifyInstance } from 'fastify';
import { methodNotAllowed } from '../errors.ts';

/**
 * Has fastify route every method Node hands over (all but CONNECT, which never reaches a request handler): it routes
 * seven by default, and the rest (TRACE, PROPFIND, QUERY) got 404 on a path that serves POST. Call before any route.
 */
export function routeEveryMethod(app: FastifyInstance): void {
  for (const method of METHODS) if (method !== 'CONNECT' && !app.supportedMethods.includes(method)) app.addHttpMethod(method);
}

/**
 * 405 for the methods a path does not serve, with `allow`. It answers in onRequest, before the body is parsed, so a
 * wrong method gets 405 whatever its content type.
 */
export function methodGuard(api: FastifyInstance, url: string, allowed: readonly string[], shown = url.replace(/\/\*$/, '/{model}'), config: object = {}): void {
  api.route({
    method: api.supportedMethods.filter((m) => !allowed.includes(m)),
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
