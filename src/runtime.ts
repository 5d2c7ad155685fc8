// Builds everything the pipeline needs from the config, once: provider pools, the state store, breakers, hold-offs,
// the retry budget, the parking lot, and the wiring between them and the metrics. server.ts only adds HTTP.
import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from 'pino';
import type { Dispatcher } from 'undici';
import type { Config } from './config/schema.ts';
import { availability } from './policy/breaker.ts';
import type { Random } from './policy/random.ts';
import { createProviderClients, closeProviderClients } from './providers/provider-client.ts';
import { TargetKeys } from './routing/target-keys.ts';
import { BreakerBoard } from './state/breaker-board.ts';
import { HoldOffs } from './state/hold-offs.ts';
import { RetryBudget } from './state/retry-budget.ts';
import { MemoryStore } from './state/memory-store.ts';
import type { StateStore } from './state/store.ts';
import { ParkingLot, type TargetState } from './pipeline/parking-lot.ts';
import type { PipelineDeps } from './pipeline/handle-request.ts';
import type { Metrics } from './observability/metrics.ts';
import { metricsObserver } from './observability/pipeline-metrics.ts';

export interface RuntimeDeps {
  logger: Logger;
  metrics: Metrics;
  /** Replaces every provider's undici Pool (tests pass a MockAgent or a shared Agent). */
  dispatcher?: Dispatcher;
  /** Replaces the state store built from `config.state`. */
  store?: StateStore;
  now?: () => number;
  random?: Random;
  sleep?: (ms: number, signal: AbortSignal) => Promise<void>;
}

export interface Runtime {
  pipeline: PipelineDeps;
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
      logger.warn({ target, from: from.state, to: to.state, openUntil: to.state === 'open' ? new Date(to.openUntilMs).toISOString() : undefined }, `breaker ${to.state}`);
    },
  });
  const holdOffs = new HoldOffs(store, now, random);
  const targetKeys = new TargetKeys(config);
  const lot = new ParkingLot({
    now,
    stateOf: (target) => targetState(target),
    onParkedChange: (route, delta) => metrics.parked.inc({ route }, delta),
    onOutcome: (route, outcome) => metrics.parkOutcomes.inc({ route, outcome }),
  });

  // The parking lot asks where a target stands; breakers and hold-offs answer.
  function targetState(target: string): TargetState {
    const held = holdOffs.until(target);
    if (held !== undefined) return { mode: 'blocked', availableAtMs: held };
    const s = targetKeys.breakerSettings(target);
    if (!s) return { mode: 'available' };
    const a = availability(board.current(target), s, now(), true);
    if (a.kind === 'closed') return { mode: 'available' };
    if (a.kind === 'probing') return { mode: 'probing', slots: a.probes };
    return { mode: 'blocked', availableAtMs: a.probeAtMs };
  }

  const unsubscribe = store.onChange((change) => {
    if (change.kind === 'breaker') metrics.breakerState.set({ target: change.target }, BREAKER_STATE_VALUE[change.record.state]);
    lot.notify(change.target);
  });
  const unsubscribeDegraded = store.onDegradedChange((degraded) => metrics.stateDegraded.set(degraded ? 1 : 0));
  metrics.stateDegraded.set(store.degraded ? 1 : 0);

  const pipeline: PipelineDeps = {
    providers,
    targetKeys,
    now,
    random,
    sleep: deps.sleep ?? ((ms, signal) => sleep(ms, undefined, { signal })),
    guards: { board, holdOffs, budget: new RetryBudget(store, now) },
    lot,
    ...metricsObserver(metrics),
  };

  return {
    pipeline,
    store,
    lot,
    async close() {
      lot.close();
      board.close();
      unsubscribe();
      unsubscribeDegraded();
      await store.close();
      await closeProviderClients(providers, deps.dispatcher === undefined);
    },
  };
}

async function createStore(config: Config, logger: Logger, now: () => number): Promise<StateStore> {
  const redis = config.state.redis;
  if (redis === undefined || redis === '') return new MemoryStore();
  const { createStateStore } = await import('./state/create-store.ts');
  return createStateStore(config.state, { logger, now });
}
