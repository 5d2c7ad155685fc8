// The breakers of every target, over the state store: admits attempts (taking a half-open probe permit when one is
// needed: the only breaker decision that waits for the store), records outcomes (batched, at most 50 ms apart, off the
// request path), and applies the pure transitions of policy/breaker.ts with compare-and-set so the fleet agrees.
import type { Logger } from 'pino';
import {
  abortedVerdict,
  afterInconclusiveProbe,
  afterProbe,
  availability,
  changesState,
  opened,
  tripsOnConsecutive,
  tripsOnWindow,
  type Availability,
  type BreakerSettings,
  type BreakerVerdict,
} from '../policy/breaker.ts';
import type { Random } from '../policy/random.ts';
import { INITIAL_BREAKER, type BreakerRecord, type OutcomeWindow, type StateStore } from './store.ts';

const FLUSH_MS = 50;

/** A probe's permit, and the spell of the breaker (its record's sinceMs and state) it was taken in. */
export interface Probe {
  permit: string;
  spellSinceMs: number;
  spellState: BreakerRecord['state'];
}

type Admission =
  | { admitted: true; probe: Probe | undefined }
  | { admitted: false; availableAtMs: number };

interface Pending {
  requests: number;
  failures: number;
  /** The closed breaker's generation the outcomes came in: another generation's window is none of theirs. */
  generation: number;
}

interface BreakerBoardDeps {
  store: StateStore;
  now: () => number;
  random: Random;
  logger?: Logger;
  /**
   * Called when this instance changed the breaker's state (and only then: the fleet logs and counts each change once).
   * A write that keeps the state (a failed probe reopening an open breaker, a probe success while half-open) is not one.
   */
  onTransition?: (target: string, from: BreakerRecord, to: BreakerRecord, cause: BreakerCause) => void;
}

/**
 * What moved a breaker, for its log line: a run of failures, the window's failure rate, a probe's answer, or the
 * failure share of a half-open round of probes (probe_failure_rate: its failures of the probes answered); with the
 * reason of the failure that tripped it (status_503, timeout_response, network, ...), so the one line tells an operator
 * whether the provider errs, hangs or cannot be reached.
 */
export type BreakerCause = (
  | { cause: 'consecutive_failures'; failures: number }
  | { cause: 'failure_rate' | 'probe_failure_rate'; failures: number; requests: number }
  | { cause: 'probe_failed' | 'probe_succeeded' }
) &
  Partial<FailureFacts>;

/** An attempt's outcome as its log line names it: the reason (status_503, network, ...) and a network failure's code. */
export interface FailureFacts {
  reason: string;
  code?: string;
}

export class BreakerBoard {
  readonly #deps: BreakerBoardDeps;
  /** Each target's run of failures while closed, and when it last answered well (-Infinity: not since this instance started). */
  readonly #runs = new Map<string, { failures: number; lastSuccessMs: number }>();
  readonly #pending = new Map<string, Pending & { settings: BreakerSettings }>();
  /**
   * Each target's last failure counted in its window, for the line of a breaker the window opens: the batch that tips
   * it may hold only successes (the one that brings the window to minRequests), the failures written before. With the
   * window's generation and when it was counted: in a fleet the window's failures may all be another instance's, and
   * this one's last failure then belongs to a window long gone.
   */
  readonly #lastFailures = new Map<string, { facts: FailureFacts | undefined; generation: number; atMs: number }>();
  #timer: NodeJS.Timeout | undefined;

  constructor(deps: BreakerBoardDeps) {
    this.#deps = deps;
  }

  current(target: string): BreakerRecord {
    return this.#deps.store.getBreaker(target) ?? INITIAL_BREAKER;
  }

  availability(target: string, s: BreakerSettings | undefined, parked: boolean): Availability {
    if (!s) return { kind: 'closed' };
    return availability(this.current(target), s, this.#deps.now(), parked);
  }

  /** Drops the counts kept for a target key given back (see StateStore.forget). */
  forget(target: string): void {
    this.#runs.delete(target);
    this.#pending.delete(target);
    this.#lastFailures.delete(target);
  }

  /**
   * May an attempt go to the target now? While probing, only permit holders may, at most halfOpenProbes fleet-wide.
   * Judged on the record as this instance has it: the caller waits for the store's first read of a target first
   * (tryTarget, through HoldOffs.firstRead: one batched read brings the breaker record and the hold-offs).
   */
  async admit(target: string, s: BreakerSettings | undefined, parked: boolean, permitTtlMs: number): Promise<Admission> {
    const a = this.availability(target, s, parked);
    if (a.kind === 'closed') return { admitted: true, probe: undefined };
    if (a.kind === 'open') return { admitted: false, availableAtMs: a.probeAtMs };
    const now = this.#deps.now();
    const { sinceMs: spellSinceMs, state: spellState, generation } = this.current(target);
    // For this record only: another instance may have reopened (or closed) the breaker a moment ago, and a permit its
    // probe just gave back must not send a second probe into the outage on a view that has not heard of it yet.
    const permit = await this.#deps.store.takePermit(target, a.probes, permitTtlMs, now, generation);
    // Other probes are out: the answer comes within a probe's round trip.
    return permit ? { admitted: true, probe: { permit, spellSinceMs, spellState } } : { admitted: false, availableAtMs: now + Math.min(permitTtlMs, 1_000) };
  }

  /** Gives back the permit of a probe that never went upstream (shed by the pool, past its deadline): nothing learnt. */
  unused(target: string, probe: Probe): void {
    void this.#deps.store.releasePermit(target, probe.permit);
  }

  /**
   * Records one attempt's outcome; `attemptMs` decides whether an aborted attempt was slow enough to count. Resolves
   * once a transition the outcome causes at once (a probe's result, a run of failures) is written; the window's
   * failure rate is applied later, in batches. `olderUnanswered`: an attempt of this instance to the target, sent
   * before this one, is still out (it may yet be a success that ends a run of failures).
   */
  async record(target: string, s: BreakerSettings | undefined, verdict: BreakerVerdict | 'slow-call', attemptMs: number, probe: Probe | undefined, facts?: FailureFacts, olderUnanswered = false): Promise<void> {
    if (!s) return;
    const v = verdict === 'slow-call' ? abortedVerdict(attemptMs, s) : verdict;
    if (probe !== undefined) return this.#recordProbe(target, s, v, probe, facts);
    if (v === 'ignore' || v === 'ignore-request') return;
    // A run of failures is counted while the breaker is closed only: stragglers that fail while it is open (sent before
    // it opened) would otherwise reopen it at the first failure after probes closed it.
    const now = this.#deps.now();
    const run = this.#runs.get(target) ?? { failures: 0, lastSuccessMs: Number.NEGATIVE_INFINITY };
    run.failures = v === 'failure' && this.current(target).state === 'closed' ? run.failures + 1 : 0;
    if (v === 'success') run.lastSuccessMs = now;
    this.#runs.set(target, run);
    this.#pendingOutcome(target, s, { requests: 1, failures: v === 'failure' ? 1 : 0 }, facts);
    // No quiet period while an attempt sent before this failed one is still out: at start-up, or after an idle spell,
    // the last success is long ago, and a burst's first answers are its fast errors (a 503 comes in milliseconds, a
    // completion in seconds) while the successes sent before them are on their way. Counted from the last success
    // alone, five of them opened the breaker fleet-wide for openS on a provider failing a third of requests (the
    // demo's gpt-4o, every run). Failures of a provider that is down come in the order they were sent: the run's last
    // one has none older still out, and opens it as before.
    const seen = { failures: run.failures, sinceSuccessMs: olderUnanswered ? 0 : now - run.lastSuccessMs };
    if (tripsOnConsecutive(this.current(target), seen, s)) {
      run.failures = 0;
      await this.#transition(target, (rec) => (tripsOnConsecutive(rec, seen, s) ? opened(rec, s, this.#deps.now(), this.#deps.random) : undefined), {
        cause: 'consecutive_failures',
        failures: seen.failures,
        ...facts,
      });
    }
  }

  /** record() for a probe: its verdict moves the half-open breaker, and its permit goes back once that is written. */
  async #recordProbe(target: string, s: BreakerSettings, v: BreakerVerdict, probe: Probe, facts: FailureFacts | undefined): Promise<void> {
    // An answer that is the request's own (a flex-tier request's 498, a request over the token limit) says nothing of
    // the target: no verdict, the permit back at once. Judged inconclusive, it held the fleet's next probe (a
    // default-tier request parked behind it) off for twice probeWhileParkedMs.
    if (v === 'ignore-request') {
      void this.#deps.store.releasePermit(target, probe.permit);
      return;
    }
    // The permit goes back once the probe's verdict is written: given back first, it let the next probe out (here, or
    // on an instance whose view is a moment behind) before the reopen it was to learn from.
    // A probe whose outcome says nothing of the provider's health (cut short too soon to count, or an answer the
    // breaker ignores, such as a 429 without a wait hint) is inconclusive: left as it was, the next probe would be
    // due at once, and the parked requests would each send one, back to back.
    const inconclusive = v === 'ignore';
    // A success can be the answer that completes a half-open round with too many failures in it: the round's failure
    // share reopens the breaker then, not the success (whose line read `breaker open`, probe_succeeded, reason ok).
    const cause = (from: BreakerRecord, to: BreakerRecord): BreakerCause =>
      v === 'success' && to.state === 'open'
        ? { cause: 'probe_failure_rate', failures: from.probeFailures ?? 0, requests: from.probeSuccesses + (from.probeFailures ?? 0) + 1 }
        : { cause: v === 'failure' ? 'probe_failed' : 'probe_succeeded', ...facts };
    try {
      await this.#transition(
        target,
        (rec) =>
          inconclusive
            ? afterInconclusiveProbe(rec, s, this.#deps.now(), probe.spellSinceMs, probe.spellState)
            : afterProbe(rec, v, s, this.#deps.now(), this.#deps.random, probe.spellSinceMs, probe.spellState),
        cause,
      );
    } finally {
      void this.#deps.store.releasePermit(target, probe.permit);
    }
  }

  /**
   * A stream whose first output `record` counted as a success, that the provider then broke (cut, stalled, a server
   * error event; LiveStream's StreamEnd.upstreamBroke): that success turns into a failure in the window it was counted
   * in (`counted.generation`, the breaker's when it was recorded), so a provider that breaks every answer mid-stream
   * opens the breaker by the failure rate. Not in the run of consecutive failures: every stream's first output resets
   * that, so breaks between first outputs never make a run. A stream longer than windowS (most are, at the default
   * 10 s) breaks after its success has left the window: the failure then brings its request along, or the window
   * held more failures than requests (3 of 4 where 3 of 7 were judged in it) and opened on a share never reached.
   */
  streamBroke(target: string, s: BreakerSettings | undefined, counted: { generation: number; atMs: number }, facts: FailureFacts): void {
    if (!s || this.current(target).generation !== counted.generation) return;
    const successGone = this.#deps.now() - counted.atMs >= s.windowS * 1000;
    this.#pendingOutcome(target, s, { requests: successGone ? 1 : 0, failures: 1 }, facts);
  }

  #pendingOutcome(target: string, s: BreakerSettings, add: OutcomeWindow, facts: FailureFacts | undefined): void {
    // Only a closed breaker's window counts outcomes, and only those of its own spell: stragglers answered while it was
    // open or half-open (sent before it opened), written in the batch after probes closed it, filled the fresh window
    // with the outage's failures and reopened it at once.
    const { state, generation } = this.current(target);
    if (state !== 'closed') return;
    const kept = this.#pending.get(target);
    const p = kept?.generation === generation ? kept : { requests: 0, failures: 0, generation, settings: s };
    p.requests += add.requests;
    p.failures += add.failures;
    if (add.failures > 0) this.#lastFailures.set(target, { facts, generation, atMs: this.#deps.now() });
    this.#pending.set(target, p);
    this.#timer ??= setTimeout(() => void this.flush(), FLUSH_MS).unref();
  }

  /** Writes the batched outcome counts and applies the failure-rate rule to the fleet-wide window. */
  async flush(): Promise<void> {
    this.#timer = undefined;
    const batch = [...this.#pending];
    this.#pending.clear();
    await Promise.all(
      batch.map(async ([target, p]) => {
        const rec = this.current(target);
        if (rec.state !== 'closed' || rec.generation !== p.generation) return;
        const window = await this.#deps.store.addOutcomes(target, rec.generation, { requests: p.requests, failures: p.failures }, this.#deps.now(), p.settings.windowS);
        if (tripsOnWindow(rec, window, p.settings)) {
          await this.#transition(target, (r) => (r.generation === rec.generation ? opened(r, p.settings, this.#deps.now(), this.#deps.random) : undefined), {
            cause: 'failure_rate',
            failures: window.failures,
            requests: window.requests,
            ...this.#lastFailureIn(target, rec.generation, p.settings),
          });
        }
      }),
    );
  }

  /** This instance's last failure counted in the target's current window, if it is still in it. */
  #lastFailureIn(target: string, generation: number, s: BreakerSettings): FailureFacts | undefined {
    const last = this.#lastFailures.get(target);
    return last?.generation === generation && this.#deps.now() - last.atMs < s.windowS * 1000 ? last.facts : undefined;
  }

  /**
   * Stops the batching, and writes what it held: the last 50 ms of outcomes count in the fleet's window (a failure
   * rate a stopping instance had seen the start of) instead of going with it.
   */
  async close(): Promise<void> {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    if (this.#pending.size > 0) await this.flush();
  }

  /** A probe that left the state as it was (a failed one reopens an open breaker): a detail, not a transition. */
  #logKept(target: string, to: BreakerRecord): void {
    const openUntil = to.state === 'open' ? new Date(to.openUntilMs).toISOString() : undefined;
    this.#deps.logger?.debug({ target, state: to.state, probeSuccesses: to.probeSuccesses, probeFailures: to.probeFailures, openUntil }, `breaker stays ${to.state}`);
  }

  /** Compare-and-set with one re-read: another instance may have moved first, and then its move stands. */
  async #transition(target: string, step: (rec: BreakerRecord) => BreakerRecord | undefined, cause: BreakerCause | ((from: BreakerRecord, to: BreakerRecord) => BreakerCause)): Promise<void> {
    for (let i = 0; i < 2; i++) {
      const from = this.current(target);
      const to = step(from);
      if (!to) return;
      if (await this.#deps.store.casBreaker(target, from.generation, to)) {
        if (changesState(from, to)) this.#deps.onTransition?.(target, from, to, typeof cause === 'function' ? cause(from, to) : cause);
        else this.#logKept(target, to);
        return;
      }
    }
  }
}
