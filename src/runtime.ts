// Builds everything the pipeline needs from the config, once: provider pools, the state store, breakers, hold-offs,
// the retry budget, the parking lot, and the wiring between them and the metrics. server.ts only adds HTTP.
import { loopGuard, type LoopGuard } from './http/loop-guard.ts';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from 'pino';
import type { Dispatcher } from 'undici';
import type { Config } from './config/schema.ts';
import { configWarnings } from './config/warnings.ts';
import type { Random } from './policy/random.ts';
import { createProviderClients, closeProviderClients } from './providers/provider-client.ts';
import { TargetKeys } from './routing/target-keys.ts';
import { BreakerBoard } from './state/breaker-board.ts';
import { HoldOffs, isCredentialHoldKey, isFlexTierKey, isSideKey, targetOfCredentialHold, targetOfHoldOffKey } from './state/hold-offs.ts';
import { ClientRepeats } from './state/client-repeats.ts';
import { RetryBudget } from './state/retry-budget.ts';
import { MemoryStore } from './state/memory-store.ts';
import type { StateStore } from './state/store.ts';
import { ParkingLot } from './pipeline/parking-lot.ts';
import { targetStateOf } from './pipeline/target-state.ts';
import { Pools } from './pools/pools.ts';
import { defaultWaitingBodyBytes, WaitingBodies } from './pools/waiting-bodies.ts';
import { WeightedPicker } from './routing/weighted.ts';
import { holdOffUntil, type TargetPlan } from './pipeline/target-attempts.ts';
import { shareFleetCapacity } from './pools/fleet-share.ts';
import type { PipelineDeps } from './pipeline/handle-request.ts';
import type { Metrics } from './observability/metrics.ts';
import { forgetTargetSeries, metricsObserver } from './observability/pipeline-metrics.ts';
import { BREAKER_STATE_VALUE, collectAtScrape } from './observability/scrape-gauges.ts';
import { zeroSeries } from './observability/zero-series.ts';
import { HoldOffLog } from './observability/hold-off-log.ts';
import { asAbortSignal, type RequestSignal } from './pipeline/request-abort.ts';

export interface RuntimeDeps {
  logger: Logger;
  /** The instance's name (loop-guard.ts instanceName), which its log lines carry; a new one when not given. */
  instance?: string;
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
  /** The bytes of waiting request bodies across the instance (server.maxWaitingBodyBytes). */
  bodies: WaitingBodies;
  /** Requests failed lately, so a client's undeclared retry of one counts as a retry. */
  repeats: ClientRepeats;
  close(): Promise<void>;
}

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
    onTransition: (target, from, to, cause) => {
      metrics.breakerTransitions.inc({ target, to: to.state });
      // Only real state changes come here: the board logs a probe that leaves the state as it was at debug level.
      logger.warn({ target, from: from.state, to: to.state, ...cause, openUntil: to.state === 'open' ? new Date(to.openUntilMs).toISOString() : undefined }, `breaker ${to.state}`);
    },
  });
  // One line per hold that starts (not per answer that extends it): the operator's record of what turned a target away.
  // A hold-off started again and again (a share of 429s with short hints) is one line, then one per window counting
  // the starts since (hold-off-log.ts). Counted once fleet-wide, as breaker transitions are: by the instance the store
  // says started it.
  const holdOffLog = new HoldOffLog(logger, now);
  const holdOffs = new HoldOffs(
    store,
    now,
    random,
    (h) => {
      if (h.kind === 'hold-off') holdOffLog.started(h);
      // A refused key is the configuration's fault and stays until someone fixes it: error level, as a Redis misconfiguration.
      else logger.error({ target: h.target, reason: h.reason, status: h.status, holdS: Math.round((h.untilMs - now()) / 1000), until: new Date(h.untilMs).toISOString() }, 'credentials refused: target held');
    },
    (h) => metrics.holdsStarted.inc({ target: h.target, kind: h.kind === 'hold-off' ? 'hold_off' : 'credentials', tier: h.tier ?? 'all', reason: h.reason }),
  );
  const targetKeys = new TargetKeys(config, now);
  const bodies = new WaitingBodies(config.server.maxWaitingBodyBytes ?? defaultWaitingBodyBytes());
  const pools = new Pools(
    config,
    now,
    {
      onWait: (provider, priority, seconds) => metrics.poolWait.observe({ provider, priority }, seconds),
      onShed: (priority, reason) => metrics.shed.inc({ priority, reason }),
    },
    bodies,
  );
  const poolOf = (target: string) => pools.of(target.slice(0, target.indexOf('/')));
  const stopSharing = store.kind === 'redis' ? shareFleetCapacity(pools, store, now) : () => {};
  const lot = new ParkingLot({
    now,
    random,
    stateOf: targetStateOf({
      holdOffs,
      board,
      breakerSettings: (target) => targetKeys.breakerSettings(target),
      limitOf: (target) => poolOf(target).limitOf(target),
      now,
    }),
    onParkedChange: (route, delta) => metrics.parked.inc({ route }, delta),
    onOutcome: (route, outcome) => metrics.parkOutcomes.inc({ route, outcome }),
    bodies,
  });

  // After an outage (a breaker that closes again, a provider that asked for a pause), the target's adaptive limit
  // restarts at half and slow-starts: new and parked requests ramp up together under that one limit.
  const lastBreakerState = new Map<string, string>();
  // The targets a hold was taken in for (another instance's included), for the hold gauges: a target this instance
  // never sent to has no pool series, yet its requests are turned away for the fleet's hold.
  const heldTargets = new Set<string>();
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
      if (!isSideKey(change.target)) {
        heldTargets.add(isCredentialHoldKey(change.target) ? targetOfCredentialHold(change.target) : targetOfHoldOffKey(change.target));
      }
      // A credential hold has no capacity to regain; requests parked on the target for another reason go at once and
      // skip it (target-state.ts), to the next target or to their 502.
      if (isCredentialHoldKey(change.target)) {
        lot.notify(targetOfCredentialHold(change.target));
        return;
      }
      // A side key (what a long hint asked for, why a credential hold is in force) only changes what held requests are
      // told; the hold-off's own key moves the rest.
      if (isSideKey(change.target)) return;
      // A flex tier's hold-off cut no limit (a 498 does not): nothing to recover, only its requests to move (the lot
      // keeps them in their target's queue, under the tier's key: TargetPlan.holdOffKey).
      if (isFlexTierKey(change.target)) {
        lot.notify(change.target);
        return;
      }
      // The short hold of a request asking a provider again: the limit restarted at half when the capped hold-off ended.
      if (!holdOffs.isReaskHold(change.target, change.untilMs)) recoverWhenOver(change.target, change.untilMs);
    }
    lot.notify(change.target);
  });
  const unsubscribeDegraded = store.onDegradedChange((degraded) => metrics.stateDegraded.set(degraded ? 1 : 0));
  metrics.stateDegraded.set(store.degraded ? 1 : 0);

  for (const p of providers.values()) {
    if (p.disabled) logger.warn({ provider: p.name }, `provider ${p.name} is optional and has no key: disabled, its targets are skipped`);
    // Said at every start, so a setting made for a test server does not reach production unnoticed.
    if (p.config.tls?.rejectUnauthorized === false) {
      logger.warn({ provider: p.name }, `provider ${p.name} has tls.rejectUnauthorized: false: the gateway accepts any certificate there, so anyone on the way can read its requests and its key; trust its CA with tls.caFile instead`);
    }
  }
  // Settings that load but cannot do what they say (a baseUrl with no /v1, a retryOn status never retried, ...).
  for (const warning of configWarnings(config)) logger.warn(warning);
  const weighted = new WeightedPicker<TargetPlan>(
    (plan) =>
      holdOffUntil(holdOffs, plan) === undefined &&
      holdOffs.credentialsHeldUntil(plan.key) === undefined &&
      board.availability(plan.key, plan.breaker, false).kind !== 'open',
  );
  const budget = new RetryBudget(store, now);
  collectAtScrape(metrics, { config, targetKeys, pools, bodies, board, holdOffs, budget, now, breakersChanged: () => lastBreakerState.keys(), holdsLearnt: () => heldTargets });
  const series = zeroSeries(config, metrics, targetKeys);
  const observer = metricsObserver(metrics);
  const loop = loopGuard(deps.instance);
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
      series.zeroOnce(route, target);
      observer.onAttempt!(route, target, result, durationMs);
    },
    onTargetForgotten: (key) => {
      series.forget(key);
      clearTimeout(recoveries.get(key));
      recoveries.delete(key);
      board.forget(key);
      budget.forget(key);
      holdOffs.forget(key);
      lastBreakerState.delete(key);
      heldTargets.delete(key);
      pools.of(key.slice(0, key.indexOf('/'))).forget(key);
      lot.forget(key);
      weighted.forget(key);
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
    bodies,
    repeats: new ClientRepeats(now),
    async close() {
      for (const timer of recoveries.values()) clearTimeout(timer);
      lot.close();
      await board.close();
      stopSharing();
      pools.close();
      unsubscribe();
      unsubscribeDegraded();
      holdOffLog.close();
      await store.close();
      await closeProviderClients(providers, deps.dispatcher === undefined);
    },
  };
}

async function createStore(config: Config, logger: Logger, now: () => number): Promise<StateStore> {
  const redis = config.state.redis;
  const keptBytes = config.idempotency.memoryBytes;
  if (redis === undefined || redis === '') return new MemoryStore({ keptBytes });
  const { RedisStore } = await import('./state/redis-store.ts');
  const { leaseMs: keyLeaseMs, waitForRedisMs } = config.idempotency;
  const store = new RedisStore({ config: config.state, logger, now, keptBytes, keyLeaseMs, waitForRedisMs });
  // An instance that served before it subscribed would miss what the fleet decides meanwhile (a breaker opened, a
  // credential hold) for every target it has not asked Redis about yet. A Redis that is away does not hold up the
  // start for long: the store serves on local state and catches up when Redis comes.
  if (!(await store.ready(STORE_STARTUP_WAIT_MS))) {
    logger.warn({ redis: store.address, waitedMs: STORE_STARTUP_WAIT_MS }, 'starting on local state: Redis is not ready yet');
    store.startWithoutRedis();
  }
  return store;
}

/** How long the start-up waits for Redis before serving on local state. */
const STORE_STARTUP_WAIT_MS = 1_000;
