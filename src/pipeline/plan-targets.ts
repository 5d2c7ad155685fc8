// The request's targets, in the order they will be tried, with their state key, pool class and retry policy, and how
// to prepare the request in each family's terms (path, headers, body, answer translation) when the target is tried.
// A disabled provider, or a Responses conversation that lives elsewhere, leaves a target out; a request a family
// cannot express skips that target when it comes to it (both logged with the reason).
import type { TargetConfig } from '../config/schema.ts';
import { forwardedRequestHeaders } from '../providers/headers.ts';
import { upstreamVia } from '../http/loop-guard.ts';
import { prepareUpstream, type Prepared } from '../providers/families.ts';
import { RetryBudget } from '../state/retry-budget.ts';
import { flexTierKey } from '../state/hold-offs.ts';
import type { ManagedRequest, PipelineDeps } from './handle-request.ts';
import type { TargetPlan } from './target-attempts.ts';
import { firstHeader } from '../header-bag.ts';
import { IDEMPOTENCY_HEADER, scopedKey } from '../policy/idempotency.ts';

interface Plans {
  plans: TargetPlan[];
  /** For a context_length_exceeded answer, when the route names one. */
  contextFallback: TargetPlan | undefined;
  skipped: Array<{ target: string; reason: string }>;
  /** Targets of the route left out because their provider is disabled: configuration, not the request. */
  disabled: number;
  /** The client's x-stormgate-priority when the first target's pool has no such class (the route's class applies). */
  unknownPriority: string | undefined;
}

/**
 * A client's model name as it appears in labels (log lines, error messages, x-stormgate-target): the body limit is the
 * only bound on the name itself, and one request must not write megabytes into every attempt of its log line.
 */
const MAX_LABEL_MODEL = 128;
export function shortModel(model: string): string {
  return model.length <= MAX_LABEL_MODEL ? model : `${model.slice(0, MAX_LABEL_MODEL)}…`;
}

export function planTargets(req: ManagedRequest, deps: PipelineDeps): Plans {
  const { route } = req;
  const skipped: Plans['skipped'] = [];
  let disabled = 0;
  const forwarded: Record<string, string> = { ...forwardedRequestHeaders(req.headers), 'content-type': 'application/json', 'x-client-request-id': req.requestId, ...(deps.via && { via: upstreamVia(deps.via, req.headers.via) }) };
  // A provider that honours Idempotency-Key knows one caller, the gateway's credentials: forwarded as sent, two client
  // keys that picked the same key shared its answer there (team B got team A's coupon). Scoped as the gateway's own
  // record is, and the same on every repeat of one client's key, so the provider still answers those once.
  const sentKey = forwarded[IDEMPOTENCY_HEADER];
  if (req.client !== undefined && sentKey !== undefined) forwarded[IDEMPOTENCY_HEADER] = scopedKey(req.client, req.path, sentKey);
  const askedPriority = firstHeader(req.headers, 'x-stormgate-priority');
  const clientModel = typeof req.json.model === 'string' ? req.json.model : undefined;
  const anthropicVersion = firstHeader(req.headers, 'anthropic-version');
  // Batch jobs on Groq's flex tier: held off apart from the default tier's requests on the same target.
  const flexTier = req.json.service_tier === 'flex';

  const plan = (target: TargetConfig): TargetPlan | undefined => {
    const client = deps.providers.get(target.provider)!;
    const model = route.upstreamModel(target, clientModel);
    const label = model ? `${target.provider}/${shortModel(model)}` : target.provider;
    if (client.disabled) {
      skipped.push({ target: label, reason: 'provider disabled (optional, no key)' });
      return undefined;
    }
    // Learned here for every target of the route, a fallback's included: a name only planned for one is given its
    // place back there should the request end with a 404 for it (handle-request.ts), once tried it is not.
    const key = deps.targetKeys.key(target.provider, model);
    // Prepared when the target is first tried: a fallback's request (an Anthropic translation, say) costs nothing
    // on the many requests the primary answers.
    let prepared: Prepared | undefined;
    const upstream = (): Prepared => {
      if (prepared) return prepared;
      deps.targetKeys.tried(key);
      prepared = prepareUpstream(client.config, { api: route.api, clientPath: req.path, query: req.query, json: req.json, rawBody: req.rawBody, model, anthropicVersion });
      // Object.assign, not `{ ...forwarded, ...family }`: the same headers (the family's win), without V8's slow path
      // for a second spread (about 0.7 µs a request). No name here is `__proto__`, which assign would not copy as own.
      if (prepared.ok) prepared = { ok: true, request: { ...prepared.request, headers: Object.assign({}, forwarded, prepared.request.headers) } };
      return prepared;
    };
    const pool = deps.pools.of(target.provider);
    // The client's key and its header can each only lower the route's class: the lower of the two applies.
    const asked = deps.pools.classFor(target.provider, route.config.priority, askedPriority);
    const cls = req.clientPriority === undefined ? asked : Math.max(asked, deps.pools.classFor(target.provider, route.config.priority, req.clientPriority));
    const className = pool.settings.classes[cls]!.name;
    return {
      key,
      sharesHoldOffs: route.api !== 'other',
      holdOffKey: flexTier ? flexTierKey(key) : key,
      limitKey: route.api === 'other' ? `${key} ${route.name}` : key,
      label,
      model,
      ownModel: target.model !== undefined,
      client,
      upstream,
      retry: target.retry ?? route.config.retry,
      weight: target.weight,
      breaker: deps.targetKeys.breakerSettings(key),
      budgetKey: RetryBudget.key(route.name, key, className),
      pool,
      cls,
      className,
      lowestClass: cls === pool.settings.classes.length - 1,
    };
  };

  let targets = route.config.targets;
  // A Responses API conversation lives at the provider that holds it: no failover. It is named either by the last
  // response (previous_response_id) or by a Conversations API object (`conversation`, an id or {id}); a fallback
  // that ignores the field (an OpenAI-compatible server) would answer without the history, and the turn would be
  // missing from the conversation the client goes on with. A background response is answered `queued` and then
  // polled, cancelled or streamed by its id (`/v1/responses/{id}`, passed through to one provider): created at a
  // fallback, it runs and bills there while every retrieve and cancel gets a 404 from the first target.
  const pinned = route.api === 'responses' && Boolean(req.json.previous_response_id || req.json.conversation || req.json.background === true);
  if (pinned) targets = targets.slice(0, 1);
  const plans = targets.map(plan).filter((p): p is TargetPlan => p !== undefined);
  disabled = skipped.length;
  const order = route.config.strategy === 'weighted' ? deps.weighted.order(route.name, plans) : plans;
  // A pinned conversation can move to a model with a larger window only at the provider that holds it.
  const wider = route.config.contextWindowFallback;
  const fallback = wider && (!pinned || wider.provider === targets[0]?.provider) ? wider : undefined;
  const first = plans[0];
  const unknownPriority = askedPriority !== undefined && first && first.pool.classIndex(askedPriority) === undefined ? askedPriority : undefined;
  return { plans: order, contextFallback: fallback ? plan(fallback) : undefined, skipped, disabled, unknownPriority };
}
