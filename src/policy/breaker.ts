// The circuit breaker's state machine, pure: (record, event, now, random) -> next record, or undefined for "no change".
// Split as in cockatiel: the trip rules (failure rate over a window, consecutive failures) decide *when*; the
// transitions decide *what*. The record is shared by the fleet through the state store, so every function here is
// safe to re-run on another instance's record.
import type { BreakerConfig } from '../config/schema.ts';
import type { BreakerRecord, OutcomeWindow } from '../state/store.ts';
import type { Random } from './random.ts';

/** The settings that apply to one target: the provider's, with the model's overrides. */
export type BreakerSettings = Omit<BreakerConfig, 'models'>;

export function settingsForModel(cfg: BreakerConfig, model: string | undefined): BreakerSettings {
  const { models, ...base } = cfg;
  const override = model === undefined ? undefined : models[model];
  return override ? { ...base, ...override } : base;
}

/**
 * What an attempt's outcome means to the breaker. `ignore-request`: an answer that is the request's own (its service
 * tier, its size), ignored as `ignore` is, but a probe that gets it is no probe at all: its permit goes back unjudged.
 */
export type BreakerVerdict = 'success' | 'failure' | 'ignore' | 'ignore-request';

/** Where a target stands, for the pipeline and the parking lot. */
export type Availability =
  | { kind: 'closed' }
  /**
   * Probes may go through, at most `probes` at a time fleet-wide: one while the breaker is still open (the first probe
   * after an outage), halfOpenProbes once a probe has succeeded.
   */
  | { kind: 'probing'; probes: number }
  | { kind: 'open'; probeAtMs: number };

/**
 * Whether requests may go to the target now. While requests are parked on it, a probe goes probeWhileParkedMs after
 * the breaker opened, whatever openS says, so parked requests learn of a quick recovery within that time. Each probe
 * that fails doubles that wait, up to probeWhileParkedMaxMs (as Envoy's outlier detection lengthens an ejection with
 * each one, up to max_ejection_time): in a long outage a lone parked request must not turn into the fixed one-second
 * retry loop the gateway exists to stop, nor learn of the recovery half a minute late.
 */
export function availability(rec: BreakerRecord, s: BreakerSettings, nowMs: number, parked: boolean): Availability {
  if (rec.state === 'closed') return { kind: 'closed' };
  if (rec.state === 'half-open') return { kind: 'probing', probes: s.halfOpenProbes };
  const probeAtMs = parked ? Math.min(rec.openUntilMs, rec.sinceMs + parkedProbeWaitMs(rec, s)) : rec.openUntilMs;
  return nowMs >= probeAtMs ? { kind: 'probing', probes: 1 } : { kind: 'open', probeAtMs };
}

/** probeWhileParkedMs doubled for each probe that failed in a row, up to probeWhileParkedMaxMs (openUntilMs bounds it too). */
function parkedProbeWaitMs(rec: BreakerRecord, s: BreakerSettings): number {
  const doubled = s.probeWhileParkedMs * 2 ** Math.min(rec.failedProbes ?? 0, 30);
  return Math.min(doubled, Math.max(s.probeWhileParkedMs, s.probeWhileParkedMaxMs));
}

/** When a target the breaker holds back may take a request: the next probe's time, or now when probes may go. */
export function availableAtMs(a: Availability, nowMs: number): number {
  return a.kind === 'open' ? a.probeAtMs : nowMs;
}

/**
 * Opens the breaker: openS plus up to 10% random jitter, so instances do not probe in lockstep. `failedProbes`: the
 * failed probes in a row this opening follows (0 when a closed breaker trips).
 */
export function opened(rec: BreakerRecord, s: BreakerSettings, nowMs: number, random: Random, failedProbes = 0): BreakerRecord {
  return {
    state: 'open',
    sinceMs: nowMs,
    openUntilMs: nowMs + Math.round(s.openS * 1000 * (1 + 0.1 * random())),
    probeSuccesses: 0,
    generation: rec.generation + 1,
    ...(failedProbes > 0 && { failedProbes }),
  };
}

/** The failure-rate rule: at least minRequests in the window and a failure share of at least failureRate. */
export function tripsOnWindow(rec: BreakerRecord, w: OutcomeWindow, s: BreakerSettings): boolean {
  return rec.state === 'closed' && w.requests >= s.minRequests && w.failures / w.requests >= s.failureRate;
}

/**
 * How long an instance must have seen no success from a target for a run of failures to open its breaker. A run of
 * five is an outage at a few requests a second, but at hundreds a second a provider failing 30% of requests (which
 * retries serve) makes one every few seconds (0.3^5 per request), and the breaker, opening fleet-wide, turned that
 * into a full outage for openS. A quarter of a second with no success at all is what such a provider never shows at
 * those rates (0.3^25 at 100 requests a second) and what one that is down shows at once. Longer costs a hard outage
 * its first moments: every request in them fails where it would have parked (a second cost the storm bench's
 * brownout 2.6% of its requests).
 */
export const CONSECUTIVE_QUIET_MS = 250;

/**
 * A run this many times consecutiveFailures long opens the breaker without the quiet period: at volume a provider
 * that is down makes one within milliseconds (20 failures take 100 ms at 200 requests a second, where every one of
 * them would have been better parked), and chance never does for one that answers most requests (0.3^20).
 */
export const LONG_RUN_FACTOR = 4;

/**
 * A target's current run of failures as one instance saw it, and how long it has been since its last success (0 while
 * an attempt sent before the run's latest failure is still out: breaker-board.ts).
 */
interface FailureRun {
  failures: number;
  sinceSuccessMs: number;
}

/**
 * The consecutive-failures rule: one instance seeing that many failures in a row, and no success for
 * CONSECUTIVE_QUIET_MS (or a run LONG_RUN_FACTOR times as long), opens the breaker for the fleet.
 */
export function tripsOnConsecutive(rec: BreakerRecord, run: FailureRun, s: BreakerSettings): boolean {
  if (rec.state !== 'closed' || run.failures < s.consecutiveFailures) return false;
  return run.sinceSuccessMs >= CONSECUTIVE_QUIET_MS || run.failures >= LONG_RUN_FACTOR * s.consecutiveFailures;
}

/**
 * A probe's result. While open, the first probe decides alone: a failure reopens, a success half-opens. While
 * half-open, the probes are judged as Resilience4j's half-open state judges its permitted calls: once closeAfter probes
 * have answered, a failure share of failureRate or more (the rule that trips a closed breaker) reopens it, as do
 * closeAfter failures; closeAfter successes close it (a fresh window: a new generation). One failure no longer reopens:
 * a provider back with a steady 20% error rate failed one probe round in two that way, and the demo's breaker stayed
 * open 85 s after a 20 s brownout, on a provider the closed breaker would never have tripped on.
 * `spellSinceMs`, `spellState`: the record's sinceMs and state when the probe's permit was taken. A result from before
 * the breaker last (re)opened or half-opened says nothing about now: a success would undo the reopen and let a new
 * round of probes out.
 */
export function afterProbe(rec: BreakerRecord, verdict: BreakerVerdict, s: BreakerSettings, nowMs: number, random: Random, spellSinceMs: number, spellState?: BreakerRecord['state']): BreakerRecord | undefined {
  if (rec.state === 'closed' || verdict === 'ignore' || verdict === 'ignore-request') return undefined;
  // Nor does a failure: the breaker has reopened since, on the failure of a probe out together with it (half-open lets
  // several go), and counting it again would double the parked requests' probe wait once more per probe, not per round.
  if (isStale(rec, spellSinceMs, spellState)) return undefined;
  const reopen = () => opened(rec, s, nowMs, random, (rec.failedProbes ?? 0) + 1);
  if (rec.state === 'open' && verdict === 'failure') return reopen();
  // An open record's counts are none of this spell's (a record another release wrote may carry some): the first probe
  // decides alone.
  const halfOpen = rec.state === 'half-open';
  const successes = (halfOpen ? rec.probeSuccesses : 0) + (verdict === 'success' ? 1 : 0);
  const failures = (halfOpen ? (rec.probeFailures ?? 0) : 0) + (verdict === 'failure' ? 1 : 0);
  const answered = successes + failures;
  if (failures >= s.closeAfter || (answered >= s.closeAfter && failures / answered >= s.failureRate)) return reopen();
  if (successes >= s.closeAfter) return { state: 'closed', sinceMs: nowMs, openUntilMs: 0, probeSuccesses: 0, generation: rec.generation + 1 };
  const { probeFailures: _, ...rest } = rec;
  return {
    ...rest,
    state: 'half-open',
    sinceMs: rec.state === 'half-open' ? rec.sinceMs : nowMs,
    probeSuccesses: successes,
    generation: rec.generation + 1,
    ...(failures > 0 && { probeFailures: failures }),
  };
}

/**
 * Has the breaker (re)opened or half-opened since the probe's permit was taken? By sinceMs, and by the state for a
 * reopen in the very millisecond its half-open spell began (a probe refused at once, as a closed port is): sinceMs is
 * the same then, and a half-open spell's late success undid the reopen. Only a reopen ends a half-open spell.
 */
function isStale(rec: BreakerRecord, spellSinceMs: number, spellState: BreakerRecord['state'] | undefined): boolean {
  return rec.sinceMs > spellSinceMs || (rec.state === 'open' && spellState === 'half-open');
}

/**
 * A first probe that went out but got no answer in the time its request had (cut short by its deadline or client, too
 * soon to count as a slow call): not a failure (no new openS), but the parked wait starts again and doubles as after
 * one, and a newcomer waits as long once openS is over. Left as it was, the next probe would be due at once, and in a
 * hang every request with a second left would carry one, a probe a second; the wait's cap bounds how late a slow but
 * healthy provider is found back.
 */
export function afterInconclusiveProbe(rec: BreakerRecord, s: BreakerSettings, nowMs: number, spellSinceMs: number, spellState?: BreakerRecord['state']): BreakerRecord | undefined {
  if (rec.state !== 'open' || isStale(rec, spellSinceMs, spellState)) return undefined;
  const next = { ...rec, sinceMs: nowMs, generation: rec.generation + 1, failedProbes: (rec.failedProbes ?? 0) + 1 };
  return { ...next, openUntilMs: Math.max(rec.openUntilMs, nowMs + parkedProbeWaitMs(next, s)) };
}

/**
 * An attempt cut short by the client's deadline or disconnect counts as a failure only if it had already waited longer
 * than slowCallMs: impatient clients must not open the breaker on a healthy provider, yet a silent one still trips it.
 */
export function abortedVerdict(durationMs: number, s: BreakerSettings): BreakerVerdict {
  return durationMs > s.slowCallMs ? 'failure' : 'ignore';
}

/**
 * After Redis was away: does the breaker this instance opened on its own (from failures it saw while degraded) outrank
 * the fleet's record? Yes while it is still open (before openUntilMs) and the fleet's record is not open and is older
 * (began before it). Newest wins by sinceMs, as generations counted apart during the outage do not compare. Otherwise
 * the fleet's record stands: it closed the breaker after we opened it, or holds it open already.
 */
export function outranksFleet(local: BreakerRecord, fleet: BreakerRecord, nowMs: number): boolean {
  return local.state === 'open' && nowMs < local.openUntilMs && fleet.state !== 'open' && local.sinceMs > fleet.sinceMs;
}

/** Does this record change the breaker's state, or only its details (a probe that left it open or half-open)? */
export function changesState(from: BreakerRecord, to: BreakerRecord): boolean {
  return from.state !== to.state;
}
