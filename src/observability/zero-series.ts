// Makes the series a dashboard reads exist at zero before their first event: a counter's first increments count in
// rate() and increase() only if a scrape saw it at zero before. The label values come from the config (routes, their
// target keys, pool classes) and the fixed sets the code counts under; a key learned from traffic starts at its first
// attempt. Kept out of the runtime, which only wires, and out of pipeline-metrics.ts, which counts events as they come:
// this reads the config, before any event.
import type { Config } from '../config/schema.ts';
import { DEGRADED_REASONS } from '../pipeline/degraded-answer.ts';
import { CLIENT_RETRY_KINDS, REQUEST_OUTCOMES } from '../pipeline/handle-request.ts';
import { STREAM_END_KINDS } from '../pipeline/stream-ends.ts';
import { PARK_OUTCOMES } from '../pipeline/parking-lot.ts';
import { FALLBACK_REASONS } from '../pipeline/serve-targets.ts';
import { limitOf } from '../policy/client-rate.ts';
import { passthroughBase } from '../providers/passthrough.ts';
import { retryReasons } from '../policy/outcome.ts';
import { SHED_REASONS } from '../pools/provider-pool.ts';
import type { TargetKeys } from '../routing/target-keys.ts';
import { HOLD_REASONS } from '../state/hold-offs.ts';
import type { Metrics } from './metrics.ts';
import { REJECTED_LABELS, STATUS_CLASSES } from './pipeline-metrics.ts';

type Route = Config['routes'][number];

/** A route's series for a target key, started at zero once per key until the key is given back. */
interface TargetSeries {
  /** Called at every attempt: does something only the first time the route sends to the key. */
  zeroOnce(route: string, target: string): void;
  /** The key was given back (see TargetKeys.forget): if it comes back, its series start at zero again. */
  forget(target: string): void;
}

/**
 * Zeroes every series the config names, now. A route's series for a target key start at zero once: the keys the config
 * names now, those learnt from traffic (a route of any model) at their first attempt, through what this returns.
 */
export function zeroSeries(config: Config, metrics: Metrics, keys: TargetKeys): TargetSeries {
  // The target keys zeroed, by route: asked at every attempt, so by two lookups of the names as they come, not of a
  // string joined from them (hashed anew each time).
  const zeroed = new Map(config.routes.map((r) => [r.name, new Set<string>()]));
  const routesByName = new Map(config.routes.map((r) => [r.name, r]));
  const zeroOnce = (route: string, target: string): void => {
    const targets = zeroed.get(route)!;
    if (targets.has(target)) return;
    targets.add(target);
    zeroTargetSeries(config, metrics, routesByName.get(route)!, target);
  };
  for (const route of config.routes) if (route.park !== false) metrics.parked.inc({ route: route.name }, 0);
  zeroCounters(config, metrics, keys, zeroOnce);
  return {
    zeroOnce,
    forget: (target) => {
      for (const targets of zeroed.values()) targets.delete(target);
    },
  };
}

/**
 * Counters start at zero for the label values the config names, so the first increments show in rate() and
 * increase(): each route's primary target keys (the keys its traffic is counted under: a target's model, or each
 * model the route matches; a route of any model learns its keys from traffic).
 */
function zeroCounters(config: Config, metrics: Metrics, keys: TargetKeys, zeroTarget: (route: string, target: string) => void): void {
  for (const route of config.routes) {
    const r = { route: route.name };
    for (const result of ['success', 'failure']) metrics.retriedRequests.inc({ ...r, result }, 0);
    for (const how of CLIENT_RETRY_KINDS) metrics.clientRetries.inc({ ...r, how }, 0);
    metrics.fallbackRequests.inc(r, 0);
    if (route.park !== false) for (const outcome of PARK_OUTCOMES) metrics.parkOutcomes.inc({ ...r, outcome }, 0);
    if (route.degraded) for (const reason of DEGRADED_REASONS) metrics.degraded.inc({ ...r, reason }, 0);
    for (const attempt of ['first', 'retry']) metrics.requestDuration.zero({ ...r, attempt });
    if (route.match.path !== '/v1/embeddings') {
      metrics.ttft.zero(r);
      for (const end of STREAM_END_KINDS) metrics.streamEnds.inc({ ...r, end }, 0);
    }
    const byTarget = route.targets.map((t) => routeTargetKeys(route, t, keys));
    for (const targets of byTarget) for (const target of targets) zeroTarget(route.name, target);
    // Each hand-over the route can make, for every reason: a first fallback shows in increase() from its first burst.
    for (let i = 0; i < byTarget.length; i++) {
      for (const from of byTarget[i]!) {
        for (const to of byTarget.slice(i + 1).flat()) for (const reason of FALLBACK_REASONS) metrics.fallbacks.inc({ ...r, from, to, reason }, 0);
      }
    }
    // The context-window fallback's series, and the one hand-over to it: a prompt too long for every target.
    if (route.contextWindowFallback) {
      const wider = routeTargetKeys(route, route.contextWindowFallback, keys);
      for (const target of wider) zeroTarget(route.name, target);
      for (const from of byTarget.flat()) for (const to of wider) if (from !== to) metrics.fallbacks.inc({ ...r, from, to, reason: 'context_length' }, 0);
    }
  }
  // Each client with a rate, for each of its rates: the first refusals of a client show from their first burst.
  const limits = config.auth?.limits ?? {};
  for (const client of Object.keys(config.auth?.keys ?? {})) {
    const limit = limitOf(limits, client);
    if (limit?.requestsPerMinute !== undefined) metrics.clientLimited.inc({ client, by: 'requests' }, 0);
    if (limit?.tokensPerMinute !== undefined) metrics.clientLimited.inc({ client, by: 'tokens' }, 0);
  }
  for (const p of Object.values(config.providers)) {
    for (const cls of Object.keys(p.pools.classes)) for (const reason of SHED_REASONS) metrics.shed.inc({ priority: cls, reason }, 0);
  }
  metrics.requests.inc(REJECTED_LABELS, 0);
  for (const path of config.passthrough?.paths ?? []) {
    for (const status_class of PASSTHROUGH_CLASSES) metrics.passthroughRequests.inc({ path: passthroughBase(path), status_class }, 0);
  }
}

/** Every value of stormgate_passthrough_requests_total's status_class: an answer's class, or none (the client left). */
const PASSTHROUGH_CLASSES = ['2xx', '3xx', '4xx', '5xx', 'client_gone'] as const;


/**
 * The reasons a streamRecovery continuation is counted as a retry for: how the stream it finishes broke (stream-break.ts:
 * cut, stalled, or the provider's own error event after the first output, an overload mid-answer).
 */
const RECOVERY_REASONS = ['stream_cut', 'stream_stalled', 'stream_error'];

/**
 * One route's series for one of its target keys, at zero, every label value the code can give them: a counter's
 * first increments count in increase() only if a scrape saw it at zero before.
 */
function zeroTargetSeries(config: Config, metrics: Metrics, route: Route, target: string): void {
  if (config.providers[target.slice(0, target.indexOf('/'))]?.breaker !== false) {
    for (const to of ['open', 'half-open', 'closed']) metrics.breakerTransitions.inc({ target, to }, 0);
  }
  for (const reason of HOLD_REASONS.holdOff) metrics.holdsStarted.inc({ target, kind: 'hold_off', tier: 'all', reason }, 0);
  for (const reason of HOLD_REASONS.flexTier) metrics.holdsStarted.inc({ target, kind: 'hold_off', tier: 'flex', reason }, 0);
  for (const reason of HOLD_REASONS.credentials) metrics.holdsStarted.inc({ target, kind: 'credentials', tier: 'all', reason }, 0);
  for (const priority of routeClasses(config, route)) {
    for (const outcome of REQUEST_OUTCOMES) metrics.requests.inc({ route: route.name, target, priority, outcome }, 0);
  }
  metrics.budgetExhausted.inc({ route: route.name, target }, 0);
  for (const kind of ['prompt', 'completion']) metrics.tokens.inc({ route: route.name, target, kind }, 0);
  const reasons = new Set(targetRetryOn(route, target).flatMap((retryOn) => retryReasons(retryOn)));
  if (route.streamRecovery === 'continue') for (const reason of RECOVERY_REASONS) reasons.add(reason);
  for (const reason of reasons) metrics.retries.inc({ route: route.name, target, reason }, 0);
  for (const status_class of STATUS_CLASSES) metrics.upstreamAttempts.inc({ target, status_class }, 0);
}

/**
 * The retryOn lists a target key is retried under: those of the route's targets of its provider, each its own `retry`
 * or else the route's (plan-targets.ts). A target's own replaces the route's whole, so the route's reasons alone left
 * a target that retries 429s where its route does not without its first 429 retries in increase().
 */
function targetRetryOn(route: Route, target: string): Array<Route['retry']['retryOn']> {
  const provider = target.slice(0, target.indexOf('/'));
  // The key was made from one of these targets (routeTargetKeys), so at least one matches.
  return everyTarget(route)
    .filter((t) => t.provider === provider)
    .map((t) => (t.retry ?? route.retry).retryOn);
}

/**
 * The classes a route's requests are counted under: its own and each lower one of its targets' pools, as
 * x-stormgate-priority and auth.priority can lower a request's class (Pools.classFor), never raise it.
 */
function routeClasses(config: Config, route: Route): string[] {
  const out = new Set([route.priority]);
  for (const t of everyTarget(route)) {
    const classes = Object.keys(config.providers[t.provider]?.pools.classes ?? {});
    for (const name of classes.slice(Math.max(0, classes.indexOf(route.priority)))) out.add(name);
  }
  return [...out];
}

/** A route's targets and its context-window fallback, if any. */
function everyTarget(route: Route): Array<Route['targets'][number]> {
  return route.contextWindowFallback ? [...route.targets, route.contextWindowFallback] : route.targets;
}

/** The keys a route's traffic to one target is counted under. */
function routeTargetKeys(route: Route, t: Route['targets'][number], keys: TargetKeys): string[] {
  if (t.model) return [keys.key(t.provider, t.model)];
  // A route that serves any model, or patterns (`gpt-*`), names no key: its models are learned from traffic (past
  // the limit, `other`), so a key made up here would be a series no request is ever counted under.
  const named = route.match.models?.filter((x) => !x.includes('*')) ?? [];
  return named.map((m) => keys.key(t.provider, m));
}

/** Every target key the config names: each route target's model, or the models the route matches. */
export function configuredTargetKeys(config: Config, keys: TargetKeys): string[] {
  const out = new Set<string>();
  for (const route of config.routes) {
    for (const t of everyTarget(route)) for (const k of routeTargetKeys(route, t, keys)) out.add(k);
  }
  return [...out];
}
