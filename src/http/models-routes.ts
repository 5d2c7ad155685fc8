// GET /v1/models over HTTP (what it lists is routing/models-list.ts): an Anthropic SDK reads it in Anthropic's shape.
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { GatewayError } from '../errors.ts';
import { shortModel } from '../pipeline/plan-targets.ts';
import { asAnthropicModel, asAnthropicPage, type createModelsList } from '../routing/models-list.ts';
import { methodGuard } from './method-guard.ts';
import { printable } from './request-body.ts';
import { sentAnthropicVersion } from './send-answer.ts';

/** The model listing and models.retrieve(id), on the managed API; `anthropic` holds the paths of the routes on Anthropic's API. */
export function modelsRoutes(api: FastifyInstance, models: ReturnType<typeof createModelsList>, anthropic: ReadonlySet<string>): void {
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
    if (!found) throw new GatewayError('model_not_found', `the model \`${printable(shortModel(id))}\` does not exist or is not served by this gateway`, { param: 'model' });
    return sentAnthropicVersion(request) ? asAnthropicModel(found) : found;
  });
  methodGuard(api, '/v1/models/*', ['GET', 'HEAD'], undefined, modelsConfig);
}
