// Builds everything the pipeline needs from the config, once: provider pools, the state store, breakers, hold-offs,
// the retry budget, the parking lot, and the wiring between them and the metrics. server.ts only adds HTTP.
import { loopGuard, type LoopGuard } from './http/loop-guard.ts';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from 'pino';
import type { Dispatcher } from 'undici';
import type { Config } from './config/schema.ts';
import { availability } from './policy/breaker.ts';
import { retryReasons } from './policy/outcome.ts';
import type { Random } from './policy/random.ts';
import { createProviderClients, closeProviderClients } from './providers/provider-client.ts';
import { TargetKeys } from './routing/target-keys.ts';
import { BreakerBoard } from './state/breaker-board.ts';
import { HoldOffs, isCredentialHoldKey, isLongHintKey, targetOfCredentialHold } from './state/hold-offs.ts';
import { RetryBudget } from './state/retry-budget.ts';
import { MemoryStore } from './state/memory-store.ts';
import type { StateStore } from './state/store.ts';
import { PARK_OUTCOMES, ParkingLot, type TargetState } from './pipeline/parking-lot.ts';
import { Pools } from './pools/pools.ts';
import { WeightedPicker } from './routing/weighted.ts';
import type { TargetPlan } from './pipeline/target-attempts.ts';
import { shareFleetCapacity } from './pools/fleet-share.ts';
import { DEGRADED_REASONS } from './pipeline/degraded-answer.ts';
import { REQUEST_OUTCOMES, type PipelineDeps } from './pipeline/handle-request.ts';
import { STREAM_END_KINDS } from './pipeline/live-stream.ts';
import { FALLBACK_REASONS } from './pipeline/serve-targets.ts';
import type { Metrics } from './observability/metrics.ts';
import { forgetTargetSeries, metricsObserver, REJECTED_LABELS, STATUS_CLASSES } from './observability/pipeline-metrics.ts';
import { asAbortSignal, type RequestSignal } from './pipeline/request-abort.ts';

export interface RuntimeDeps {
  logger: Logger;
  metrics: Metrics;
  /** Replaces every provider's undici Pool (tests pass a MockAgent or a shared Agent). */
  dispatcher?: Dispatcher;
  /** Replaces the state store built from `config.state`. */
  store?: StateStore;
  now?: () => number;
  random?: Random;
  sleep?: (ms: number, signal: RequestSignal) => Promise<void>;
}

export interface Runtime {
  pipeline: PipelineDeps;
  loop: LoopGuard;
  store: StateStore;
  lot: ParkingLot;
  close(): Promise<void>;
}

const BREAKER_STATE_VALUE = { closed: 0, open: 1, 'half-open': 2 } as const;

export async function createRuntime(config: Config, deps: RuntimeDeps): Promise<Runtime> {
  const now = deps.now ?? Date.now;
  const random = deps.random ?? Math.random;
  const { logger, metrics } = deps;
  const providers = createProviderClients(config, deps.dispatcher);
  const store = deps.store ?? (await createStore(config, logger, now));
  const board = new BreakerBoard({
    store,
    now,
    random,
    logger,
    onTransition: (target, from, to) => {
      metrics.breakerTransitions.inc({ target, to: to.state });
      // Only real state changes come here: the board logs a probe that leaves the state as it was at debug level.
      logger.warn({ target, from: from.state, to: to.state, openUntil: to.state === 'open' ? new Date(to.openUntilMs).toISOString() : undefined }, `breaker ${to.state}`);
    },
  });
  const holdOffs = new HoldOffs(store, now, random);
  const targetKeys = new TargetKeys(config, now);
  const pools = new Pools(config, now, {
    onWait: (provider, priority, seconds) => metrics.poolWait.observe({ provider, priority }, seconds),
    onShed: (priority, reason) => metrics.shed.inc({ priority, reason }),
  });
  const poolOf = (target: string) => pools.of(target.slice(0, target.indexOf('/')));
  const stopSharing = store.kind === 'redis' ? shareFleetCapacity(pools, store, now) : () => {};
  const lot = new ParkingLot({
    now,
    random,
    stateOf: (target) => targetState(target),
    onParkedChange: (route, delta) => metrics.parked.inc({ route }, delta),
    onOutcome: (route, outcome) => metrics.parkOutcomes.inc({ route, outcome }),
  });

  // The parking lot asks where a target stands; breakers and hold-offs answer.
  function targetState(target: string): TargetState {
    // Nothing waits for a credential hold: requests parked for another reason go, and skip the target at once.
    if (holdOffs.credentialsHeldUntil(target) !== undefined) return { mode: 'available', slots: Number.MAX_SAFE_INTEGER };
    const held = holdOffs.until(target);
    if (held !== undefined) return { mode: 'blocked', availableAtMs: held };
    const available: TargetState = { mode: 'available', slots: Math.max(1, Math.floor(poolOf(target).limitOf(target))) };
    const s = targetKeys.breakerSettings(target);
    if (!s) return available;
    const a = availability(board.current(target), s, now(), true);
    if (a.kind === 'closed') return available;
    if (a.kind === 'probing') return { mode: 'probing', slots: a.probes };
    return { mode: 'blocked', availableAtMs: a.probeAtMs };
  }

  // After an outage (a breaker that closes again, a provider that asked for a pause), the target's adaptive limit
  // restarts at half and slow-starts: new and parked requests ramp up together under that one limit.
  const lastBreakerState = new Map<string, string>();
  // Once per hold-off, when it is over: every 429 that extends it would otherwise halve the limit again.
  const recoveries = new Map<string, NodeJS.Timeout>();
  const recoverWhenOver = (target: string, untilMs: number): void => {
    clearTimeout(recoveries.get(target));
    const timer = setTimeout(() => {
      recoveries.delete(target);
      poolOf(target).recovered(target);
    }, Math.max(0, untilMs - now()));
    recoveries.set(target, timer.unref());
  };
  const unsubscribe = store.onChange((change) => {
    if (change.kind === 'breaker') {
      metrics.breakerState.set({ target: change.target }, BREAKER_STATE_VALUE[change.record.state]);
      const before = lastBreakerState.get(change.target) ?? 'closed';
      lastBreakerState.set(change.target, change.record.state);
      if (change.record.state === 'closed' && before !== 'closed') poolOf(change.target).recovered(change.target);
    } else {
      // A credential hold has no capacity to regain; requests parked on the target for another reason go at once and
      // skip it (targetState), to the next target or to their 502.
      if (isCredentialHoldKey(change.target)) {
        lot.notify(targetOfCredentialHold(change.target));
        return;
      }
      // What a long hint asked for only changes what held-off requests are told; the hold-off's own key moves the rest.
      if (isLongHintKey(change.target)) return;
      recoverWhenOver(change.target, change.untilMs);
    }
    lot.notify(change.target);
  });
  const knownTargets = configuredTargetKeys(config, targetKeys);
  /** The targets with a breaker and a credential series: every configured one, and every one served or changed since. */
  const reportedTargets = () => {
    const used = [...pools.all()].flatMap((pool) => pool.snapshot().limits.map(([target]) => target));
    return new Set([...knownTargets, ...lastBreakerState.keys(), ...used]);
  };
  metrics.collectBreakers = () => {
    // Breaker states are read when Prometheus scrapes, so every configured target has a series (and a restarted
    // instance reports an open breaker it learnt from Redis) without waiting for a transition.
    // An open breaker whose time is over waits for a request to probe with: half-open, not open, for an alert on a
    // target nobody sends to would otherwise fire forever.
    for (const target of reportedTargets()) {
      const rec = board.current(target);
      metrics.breakerState.set({ target }, BREAKER_STATE_VALUE[rec.state === 'open' && now() >= rec.openUntilMs ? 'half-open' : rec.state]);
    }
  };
  // A refused key shows nowhere else: the breaker stays closed (a 401 is no provider failure) and, with a fallback,
  // every request is answered. Read at scrape time for the same targets as the breaker states.
  metrics.collectCredentials = () => {
    for (const target of reportedTargets()) {
      metrics.credentialsHeld.set({ target }, holdOffs.credentialsHeldUntil(target) === undefined ? 0 : 1);
    }
  };
  collectPoolMetrics(metrics, pools);
  for (const route of config.routes) if (route.park !== false) metrics.parked.inc({ route: route.name }, 0);
  const unsubscribeDegraded = store.onDegradedChange((degraded) => metrics.stateDegraded.set(degraded ? 1 : 0));
  metrics.stateDegraded.set(store.degraded ? 1 : 0);

  for (const p of providers.values()) {
    if (p.disabled) logger.warn({ provider: p.name }, `provider ${p.name} is optional and has no key: disabled, its targets are skipped`);
  }
  const weighted = new WeightedPicker<TargetPlan>(
    (plan) =>
      holdOffs.until(plan.key) === undefined &&
      holdOffs.credentialsHeldUntil(plan.key) === undefined &&
      board.availability(plan.key, plan.breaker, false).kind !== 'open',
  );
  const budget = new RetryBudget(store, now);
  metrics.collectBudgets = async () => {
    for (const [route, remaining] of await budget.remainingByRoute()) metrics.budgetRemaining.set({ route }, remaining);
  };
  // A route's series for a target key start at zero once: the keys the config names now, those learnt from traffic
  // (a route of any model) at their first attempt.
  const zeroed = new Set<string>();
  const routesByName = new Map(config.routes.map((r) => [r.name, r]));
  const zeroOnce = (route: string, target: string): void => {
    const seen = `${route}\n${target}`;
    if (zeroed.has(seen)) return;
    zeroed.add(seen);
    zeroTargetSeries(config, metrics, routesByName.get(route)!, target);
  };
  zeroCounters(config, metrics, targetKeys, zeroOnce);
  const observer = metricsObserver(metrics);
  const loop = loopGuard();
  const pipeline: PipelineDeps = {
    via: loop.via,
    providers,
    weighted,
    pools,
    targetKeys,
    now,
    random,
    sleep: deps.sleep ?? ((ms, signal) => sleep(ms, undefined, { signal: asAbortSignal(signal) })),
    guards: { board, holdOffs, budget },
    lot,
    ...observer,
    onAttempt: (route, target, result, durationMs) => {
      zeroOnce(route, target);
      observer.onAttempt!(route, target, result, durationMs);
    },
    onTargetForgotten: (key) => {
      for (const seen of zeroed) if (seen.endsWith(`\n${key}`)) zeroed.delete(seen);
      clearTimeout(recoveries.get(key));
      recoveries.delete(key);
      board.forget(key);
      budget.forget(key);
      holdOffs.forget(key);
      lastBreakerState.delete(key);
      pools.of(key.slice(0, key.indexOf('/'))).forget(key);
      lot.forget(key);
      void forgetTargetSeries(metrics, key);
    },
  };
  // A learned model idle long enough to give its place to a new name leaves nothing behind, as a 404'd name does not.
  targetKeys.onEvicted = pipeline.onTargetForgotten;

  return {
    pipeline,
    loop,
    store,
    lot,
    async close() {
      for (const timer of recoveries.values()) clearTimeout(timer);
      lot.close();
      board.close();
      stopSharing();
      pools.close();
      unsubscribe();
      unsubscribeDegraded();
      await store.close();
      await closeProviderClients(providers, deps.dispatcher === undefined);
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
  }
  for (const p of Object.values(config.providers)) {
    for (const cls of Object.keys(p.pools.classes)) for (const reason of ['queue_full', 'deadline']) metrics.shed.inc({ priority: cls, reason }, 0);
  }
  metrics.requests.inc(REJECTED_LABELS, 0);
}

/**
 * One route's series for one of its target keys, at zero, every label value the code can give them: a counter's
 * first increments count in increase() only if a scrape saw it at zero before.
 */
function zeroTargetSeries(config: Config, metrics: Metrics, route: Config['routes'][number], target: string): void {
  if (config.providers[target.slice(0, target.indexOf('/'))]?.breaker !== false) {
    for (const to of ['open', 'half-open', 'closed']) metrics.breakerTransitions.inc({ target, to }, 0);
  }
  for (const outcome of REQUEST_OUTCOMES) metrics.requests.inc({ route: route.name, target, priority: route.priority, outcome }, 0);
  metrics.budgetExhausted.inc({ route: route.name, target }, 0);
  for (const kind of ['prompt', 'completion']) metrics.tokens.inc({ route: route.name, target, kind }, 0);
  for (const reason of retryReasons(route.retry.retryOn)) metrics.retries.inc({ route: route.name, target, reason }, 0);
  for (const status_class of STATUS_CLASSES) metrics.upstreamAttempts.inc({ target, status_class }, 0);
}

/** The keys a route's traffic to one target is counted under. */
function routeTargetKeys(route: Config['routes'][number], t: Config['routes'][number]['targets'][number], keys: TargetKeys): string[] {
  if (t.model) return [keys.key(t.provider, t.model)];
  // A route that serves any model, or patterns (`gpt-*`), names no key: its models are learned from traffic (past
  // the limit, `other`), so a key made up here would be a series no request is ever counted under.
  const named = route.match.models?.filter((x) => !x.includes('*')) ?? [];
  return named.map((m) => keys.key(t.provider, m));
}

/** Every target key the config names: each route target's model, or the models the route matches. */
function configuredTargetKeys(config: Config, keys: TargetKeys): string[] {
  const out = new Set<string>();
  for (const route of config.routes) for (const t of route.targets) for (const k of routeTargetKeys(route, t, keys)) out.add(k);
  return [...out];
}

/** Pool (and breaker) gauges are read when Prometheus scrapes, never kept up to date on the request path. */
function collectPoolMetrics(metrics: Metrics, pools: Pools): void {
  const collect = () => {
    for (const pool of pools.all()) {
      const snap = pool.snapshot();
      pool.settings.classes.forEach((c, i) => {
        metrics.poolInUse.set({ provider: pool.settings.provider, priority: c.name }, snap.inUse[i] ?? 0);
        metrics.poolQueueDepth.set({ provider: pool.settings.provider, priority: c.name }, snap.queued[i] ?? 0);
      });
      for (const [target, limit] of snap.limits) metrics.poolLimit.set({ target }, Math.floor(limit));
    }
  };
  metrics.collectPools = collect;
}

async function createStore(config: Config, logger: Logger, now: () => number): Promise<StateStore> {
  const redis = config.state.redis;
  const keptBytes = config.idempotency.memoryBytes;
  if (redis === undefined || redis === '') return new MemoryStore({ keptBytes });
  const { RedisStore } = await import('./state/redis-store.ts');
  const store = new RedisStore({ config: config.state, logger, now, keptBytes });
  // An instance that served before it subscribed would miss what the fleet decides meanwhile (a breaker opened, a
  // credential hold) for every target it has not asked Redis about yet. A Redis that is away does not hold up the
  // start for long: the store serves on local state and catches up when Redis comes.
  if (!(await store.ready(STORE_STARTUP_WAIT_MS))) {
    logger.warn({ waitedMs: STORE_STARTUP_WAIT_MS }, 'starting on local state: Redis is not ready yet');
    store.startWithoutRedis();
  }
  return store;
}

/** How long the start-up waits for Redis before serving on local state. */
const STORE_STARTUP_WAIT_MS = 1_000;
