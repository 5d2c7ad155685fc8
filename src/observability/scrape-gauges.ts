// The gauges Prometheus reads where their numbers live (the pools, the breaker board, the hold-offs, the retry budget)
// when it scrapes: the request path pays nothing for them, and a series shows before anything changes it. Kept out of
// the runtime, which only wires, and out of pipeline-metrics.ts, which counts the pipeline's events: these read state,
// whoever changed it.
import type { Config } from '../config/schema.ts';
import type { Pools } from '../pools/pools.ts';
import type { WaitingBodies } from '../pools/waiting-bodies.ts';
import type { TargetKeys } from '../routing/target-keys.ts';
import type { BreakerBoard } from '../state/breaker-board.ts';
import type { HoldOffs } from '../state/hold-offs.ts';
import type { RetryBudget } from '../state/retry-budget.ts';
import type { Metrics } from './metrics.ts';
import { configuredTargetKeys } from './zero-series.ts';

/** stormgate_breaker_state's value for each breaker state (its help text says the same). */
export const BREAKER_STATE_VALUE = { closed: 0, open: 1, 'half-open': 2 } as const;

interface ScrapeSources {
  config: Config;
  targetKeys: TargetKeys;
  pools: Pools;
  /** The bytes of waiting requests' bodies, the instance's. */
  bodies: WaitingBodies;
  board: BreakerBoard;
  holdOffs: HoldOffs;
  budget: RetryBudget;
  now: () => number;
  /** The targets whose breaker record changed since the start (served here, or learnt from the fleet). */
  breakersChanged: () => Iterable<string>;
  /**
   * The targets a hold (hold-off or credential hold) was taken in for since the start: started here, or read from the
   * fleet at a first sight or pushed by it, so an instance that turns requests away for another's hold says so.
   */
  holdsLearnt: () => Iterable<string>;
}

/** Sets the metrics' scrape-time collectors (collectBreakers, collectCredentials, collectHolds, collectPools, collectBudgets). */
export function collectAtScrape(metrics: Metrics, s: ScrapeSources): void {
  const { pools, board, holdOffs, budget, now } = s;
  const knownTargets = configuredTargetKeys(s.config, s.targetKeys);
  /** The targets with a breaker and a hold series: every configured one, and every one served, changed or held since. */
  const reportedTargets = () => {
    const used = [...pools.all()].flatMap((pool) => pool.snapshot().limits.map(([target]) => target));
    return new Set([...knownTargets, ...s.breakersChanged(), ...s.holdsLearnt(), ...used]);
  };
  // A target reported at one scrape and not at the next (a made-up name given back once its last request, a stream
  // that outlived its twin's 404, let go of its pool entry) loses its series, or they stood for good, one set per name.
  const breakerTargets = new Reported((target) => metrics.breakerState.remove({ target }));
  const credentialTargets = new Reported((target) => metrics.credentialsHeld.remove({ target }));
  const holdTargets = new Reported((target) => {
    for (const kind of ['hold_off', 'credentials']) metrics.holdRemaining.remove({ target, kind, tier: 'all' });
    metrics.holdRemaining.remove({ target, kind: 'hold_off', tier: 'flex' });
  });
  metrics.collectBreakers = () => {
    // Breaker states are read when Prometheus scrapes, so every configured target has a series (and a restarted
    // instance reports an open breaker it learnt from Redis) without waiting for a transition.
    // An open breaker whose time is over waits for a request to probe with: half-open, not open, for an alert on a
    // target nobody sends to would otherwise fire forever.
    for (const target of breakerTargets.now(reportedTargets())) {
      const rec = board.current(target);
      metrics.breakerState.set({ target }, BREAKER_STATE_VALUE[rec.state === 'open' && now() >= rec.openUntilMs ? 'half-open' : rec.state]);
    }
  };
  // A refused key shows nowhere else: the breaker stays closed (a 401 is no provider failure) and, with a fallback,
  // every request is answered. Read at scrape time for the same targets as the breaker states.
  metrics.collectCredentials = () => {
    for (const target of credentialTargets.now(reportedTargets())) {
      metrics.credentialsHeld.set({ target }, holdOffs.credentialsHeldUntil(target) === undefined ? 0 : 1);
    }
  };
  // What turns a target away now, and for how long: the hold-offs (the target's, and its flex tier's apart) and the
  // credential holds this instance knows of, another instance's included once the store has told it.
  metrics.collectHolds = () => {
    const left = (untilMs: number | undefined) => (untilMs === undefined ? 0 : Math.max(0, (untilMs - now()) / 1000));
    for (const target of holdTargets.now(reportedTargets())) {
      metrics.holdRemaining.set({ target, kind: 'hold_off', tier: 'all' }, left(holdOffs.until(target)));
      metrics.holdRemaining.set({ target, kind: 'credentials', tier: 'all' }, left(holdOffs.credentialsHeldUntil(target)));
      // A flex tier's series only while it is held: most targets have no flex tier.
      const flexUntil = holdOffs.flexTierUntil(target);
      if (flexUntil === undefined) metrics.holdRemaining.remove({ target, kind: 'hold_off', tier: 'flex' });
      else metrics.holdRemaining.set({ target, kind: 'hold_off', tier: 'flex' }, left(flexUntil));
    }
  };
  collectPoolMetrics(metrics, pools, s.bodies, Object.keys(s.config.auth?.keys ?? {}));
  metrics.collectBudgets = async () => {
    for (const [route, remaining] of await budget.remainingByRoute()) metrics.budgetRemaining.set({ route }, remaining);
  };
}

/** Pool gauges (and the waiting bodies' bytes) are read when Prometheus scrapes, never kept up to date on the request path. */
function collectPoolMetrics(metrics: Metrics, pools: Pools, bodies: WaitingBodies, clients: readonly string[]): void {
  const limitTargets = new Reported((target) => metrics.poolLimit.remove({ target }));
  const collect = () => {
    const limits = new Map<string, number>();
    for (const pool of pools.all()) {
      const snap = pool.snapshot();
      pool.settings.classes.forEach((c, i) => {
        const labels = { provider: pool.settings.provider, priority: c.name };
        metrics.poolInUse.set(labels, snap.inUse[i] ?? 0);
        metrics.poolQueueDepth.set(labels, snap.queued[i] ?? 0);
        // Every client key has its series in every class, at 0 while it holds and waits for nothing.
        const active = new Map(snap.clients[i]);
        for (const client of clients) {
          metrics.poolClientInUse.set({ ...labels, client }, active.get(client)?.held ?? 0);
          metrics.poolClientQueueDepth.set({ ...labels, client }, active.get(client)?.waiting ?? 0);
        }
      });
      for (const [target, limit] of snap.limits) limits.set(target, Math.floor(limit));
    }
    for (const target of limitTargets.now(limits.keys())) metrics.poolLimit.set({ target }, limits.get(target)!);
    metrics.waitingBodyBytes.set(bodies.bytes);
  };
  metrics.collectPools = collect;
}

/** The targets a gauge reported at its last scrape: one left out now has its series removed (`drop`). */
class Reported {
  #last = new Set<string>();

  constructor(private readonly drop: (target: string) => void) {}

  /** This scrape's targets, as a set; the ones of the last scrape not among them are dropped first. */
  now(targets: Iterable<string>): Set<string> {
    const current = new Set(targets);
    for (const target of this.#last) if (!current.has(target)) this.drop(target);
    this.#last = current;
    return current;
  }
}
