// Seeded property and model-based tests of the pure policy code and the in-process store's breaker and budget.
// Each model below is written from the README's words (Retries, Retry budget, Circuit breaker, Hold-offs, Parking,
// Adaptive concurrency, Deadlines), not from the code: the code and the model are driven with the same random event
// sequences and must agree at every step. A disagreement found this way also has a small named test (at the end).
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { BreakerSchema, type BackoffConfig, type RetryConfig } from '../src/config/schema.ts';
import { classLimit, initialLimit, onRateLimited, onRecovered, onSuccess, type LimitSettings, type LimitState } from '../src/policy/adaptive-limit.ts';
import { backoffDelayMs, jitterWaitHintMs } from '../src/policy/backoff.ts';
import { settingsForModel, type Availability, type BreakerSettings } from '../src/policy/breaker.ts';
import { computeDeadline, longestBudgetMs } from '../src/policy/deadline.ts';
import { pastHoldOff, waitPastHoldOff } from '../src/policy/hold-off-wait.ts';
import { idempotencyKeyOf, nextLookMs } from '../src/policy/idempotency.ts';
import { MovingAverage } from '../src/policy/moving-average.ts';
import { classify, isRetryable, OUTCOME_TABLE, type AttemptOutcome } from '../src/policy/outcome.ts';
import { quotaLowUntil } from '../src/policy/quota-headers.ts';
import { seededRandom, type Random } from '../src/policy/random.ts';
import { canWait, decideRetryWait } from '../src/policy/retry-wait.ts';
import { MAX_WAIT_HINT_MS, parseDurationMs, parseWaitHint, type ResponseHeaders } from '../src/policy/wait-hint.ts';
import { BreakerBoard } from '../src/state/breaker-board.ts';
import { HoldOffs, MAX_HOLD_OFF_MS } from '../src/state/hold-offs.ts';
import { MemoryStore, SecondBuckets } from '../src/state/memory-store.ts';
import { RetryBudget } from '../src/state/retry-budget.ts';
import { MAX_WINDOW_S, type BudgetConfig } from '../src/state/store.ts';

/**
 * A failing case names its seed and the step that disagreed. FUZZ_SEED moves the runs to other seeds and FUZZ_SEEDS
 * multiplies how many (`FUZZ_SEEDS=30 npx vitest run test/policy-model-fuzz.test.ts` for a longer hunt); the default
 * keeps the file within a few seconds.
 */
const SEEDS = Number(process.env.FUZZ_SEEDS ?? 1);
const BASE_SEED = Number(process.env.FUZZ_SEED ?? 20_240_601);

/** Small helpers over one seeded source. */
function gen(random: Random) {
  const int = (lo: number, hi: number) => lo + Math.floor(random() * (hi - lo + 1));
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(random() * xs.length)]!;
  const chance = (p: number) => random() < p;
  return { int, pick, chance, random };
}
type Gen = ReturnType<typeof gen>;

// ------------------------------------------------------------------------------------------------------------------
// The circuit breaker, as the README's "Circuit breaker" and "Parking" paragraphs describe it.
// ------------------------------------------------------------------------------------------------------------------

type Verdict = 'success' | 'failure' | 'ignore' | 'slow-call';

interface ModelProbe {
  /** The spell (open or half-open period) the permit was taken in: a result from an earlier spell is not counted. */
  spell: number;
  permit: string;
}

/** The README's breaker for one target on one instance, with its probe permits. */
class BreakerModel {
  state: 'closed' | 'open' | 'half-open' = 'closed';
  sinceMs = 0;
  openUntilMs = 0;
  probeSuccesses = 0;
  probeFailures = 0;
  failedProbes = 0;
  /** Counts every (re)open and half-open: the spell a probe belongs to. */
  spell = 0;
  /** Closed spells: the window is fresh for each ("closeAfter successes close it with a fresh window"). */
  closedSpell = 0;
  /** The instance's run of failures while closed, and its last success. */
  run = 0;
  lastSuccessMs = Number.NEGATIVE_INFINITY;
  /** Per-second buckets of the current closed spell's outcomes: [requests, failures]. */
  window = new Map<number, [number, number]>();
  /** Outcomes recorded since the last flush (written in batches at most 50 ms apart), by the closed spell they came in. */
  pending: { closedSpell: number; requests: number; failures: number }[] = [];
  flushDueMs: number | undefined;
  permits = new Map<string, number>();
  #nextPermit = 0;
  /** What the sequences reached, so a generator that stopped reaching a state fails the test instead of passing idly. */
  readonly seen = new Set<string>();

  constructor(private readonly s: BreakerSettings, private readonly random: Random) {}

  /** "Open for openS plus up to 10% jitter". */
  #open(nowMs: number, failedProbes: number): void {
    this.state = 'open';
    this.sinceMs = nowMs;
    this.openUntilMs = nowMs + Math.round(this.s.openS * 1000 * (1 + 0.1 * this.random()));
    this.probeSuccesses = 0;
    this.probeFailures = 0;
    this.failedProbes = failedProbes;
    this.spell++;
  }

  #close(nowMs: number): void {
    this.state = 'closed';
    this.sinceMs = nowMs;
    this.openUntilMs = 0;
    this.probeSuccesses = 0;
    this.probeFailures = 0;
    // "the count starts over when the breaker closes"
    this.failedProbes = 0;
    this.spell++;
    this.closedSpell++;
    this.window.clear();
  }

  /**
   * "the first goes probeWhileParkedMs after the breaker opened, whatever openS says, and each probe that fails doubles
   * the wait, up to probeWhileParkedMaxMs and never past openS".
   */
  parkedWaitMs(failedProbes: number): number {
    return Math.min(this.s.probeWhileParkedMs * 2 ** failedProbes, Math.max(this.s.probeWhileParkedMs, this.s.probeWhileParkedMaxMs));
  }

  availability(nowMs: number, parked: boolean): Availability {
    if (this.state === 'closed') return { kind: 'closed' };
    // "after a probe succeeds, up to halfOpenProbes at a time"
    if (this.state === 'half-open') return { kind: 'probing', probes: this.s.halfOpenProbes };
    const probeAtMs = parked ? Math.min(this.openUntilMs, this.sinceMs + this.parkedWaitMs(this.failedProbes)) : this.openUntilMs;
    // "then one probe"
    return nowMs >= probeAtMs ? { kind: 'probing', probes: 1 } : { kind: 'open', probeAtMs };
  }

  admit(nowMs: number, parked: boolean, ttlMs: number): { admitted: true; probe: ModelProbe | undefined } | { admitted: false; availableAtMs: number } {
    const a = this.availability(nowMs, parked);
    if (a.kind === 'closed') return { admitted: true, probe: undefined };
    if (a.kind === 'open') return { admitted: false, availableAtMs: a.probeAtMs };
    // Permits expire after their ttl, so a probe that hangs holds its place no longer.
    for (const [id, expiresAt] of this.permits) if (expiresAt <= nowMs) this.permits.delete(id);
    // "While the permits are out ... a parked request waits for them (at most a second, or the permit's time)".
    if (this.permits.size >= a.probes) {
      this.seen.add(`permits-taken-${this.state}`);
      return { admitted: false, availableAtMs: nowMs + Math.min(ttlMs, 1_000) };
    }
    const permit = `m${this.#nextPermit++}`;
    this.permits.set(permit, nowMs + ttlMs);
    return { admitted: true, probe: { spell: this.spell, permit } };
  }

  /** An attempt that carried no probe. */
  outcome(nowMs: number, verdict: Verdict, attemptMs: number): void {
    const v = this.#verdict(verdict, attemptMs);
    if (v === 'ignore') return;
    // "requests already in flight when it opened and failing after it do not start the next run"
    this.run = v === 'failure' && this.state === 'closed' ? this.run + 1 : 0;
    if (v === 'success') this.lastSuccessMs = nowMs;
    // Only a closed breaker's window counts: "with a fresh window" once probes close it.
    if (this.state === 'closed') {
      const p = this.pending.find((x) => x.closedSpell === this.closedSpell);
      if (p) {
        p.requests++;
        if (v === 'failure') p.failures++;
      } else this.pending.push({ closedSpell: this.closedSpell, requests: 1, failures: v === 'failure' ? 1 : 0 });
      this.flushDueMs ??= nowMs + 50;
    }
    // "at once when one instance sees consecutiveFailures failures in a row while it is closed and no success from the
    // target for 250 ms, or a run four times as long"
    if (this.state === 'closed' && this.run >= this.s.consecutiveFailures && (nowMs - this.lastSuccessMs >= 250 || this.run >= 4 * this.s.consecutiveFailures)) {
      this.seen.add(nowMs - this.lastSuccessMs >= 250 ? 'consecutive' : 'long-run');
      this.run = 0;
      this.#open(nowMs, 0);
    }
  }

  /** "over windowS (10 s), at least minRequests (20) requests were made and the failure share reached failureRate". */
  flush(nowMs: number): void {
    this.flushDueMs = undefined;
    const batch = this.pending;
    this.pending = [];
    const mine = batch.filter((p) => p.closedSpell === this.closedSpell);
    // The rule is applied as outcomes come in, to the window they land in.
    if (this.state !== 'closed' || mine.length === 0) return;
    const sec = Math.floor(nowMs / 1000);
    for (const p of mine) {
      const b = this.window.get(sec) ?? [0, 0];
      b[0] += p.requests;
      b[1] += p.failures;
      this.window.set(sec, b);
    }
    let requests = 0, failures = 0;
    for (const [s, [r, f]] of this.window) {
      if (s <= sec - this.s.windowS) this.window.delete(s);
      else {
        requests += r;
        failures += f;
      }
    }
    if (requests >= this.s.minRequests && failures / requests >= this.s.failureRate) {
      this.seen.add('window');
      this.#open(nowMs, 0);
    }
  }

  probeResult(nowMs: number, probe: ModelProbe, verdict: Verdict, attemptMs: number): void {
    this.permits.delete(probe.permit);
    const v = this.#verdict(verdict, attemptMs);
    // "A result that arrives after a reopen (a probe of the spell before it) is not counted"
    if (this.state === 'closed' || probe.spell !== this.spell) {
      this.seen.add('stale-probe');
      return;
    }
    if (v === 'ignore') {
      // "is no failure (the breaker stays as it was), but the wait starts again and doubles as after one"
      if (this.state !== 'open') return;
      this.seen.add('inconclusive');
      this.failedProbes++;
      this.sinceMs = nowMs;
      this.openUntilMs = Math.max(this.openUntilMs, nowMs + this.parkedWaitMs(this.failedProbes));
      this.spell++;
      return;
    }
    // "The first probe's failure reopens it"
    if (this.state === 'open' && v === 'failure') {
      this.seen.add('first-probe-failed');
      return this.#open(nowMs, this.failedProbes + 1);
    }
    if (this.state === 'open') {
      this.state = 'half-open';
      this.sinceMs = nowMs;
      this.probeSuccesses = 0;
      this.probeFailures = 0;
      this.spell++;
    }
    if (v === 'success') this.probeSuccesses++;
    else this.probeFailures++;
    const answered = this.probeSuccesses + this.probeFailures;
    // "once closeAfter of them have answered, a failure share of failureRate or more reopens it, as do closeAfter failures"
    if (this.probeFailures >= this.s.closeAfter || (answered >= this.s.closeAfter && this.probeFailures / answered >= this.s.failureRate)) {
      this.seen.add('half-open-reopened');
      return this.#open(nowMs, this.failedProbes + 1);
    }
    // "closeAfter (3) successes close it with a fresh window"
    if (this.probeSuccesses >= this.s.closeAfter) {
      this.seen.add(this.state === 'half-open' && answered > 1 ? 'closed-after-half-open' : 'closed-at-first-probe');
      this.#close(nowMs);
    }
  }

  /** "an attempt cut short by the client's deadline or disconnect counts only if it had waited longer than slowCallMs" */
  #verdict(v: Verdict, attemptMs: number): 'success' | 'failure' | 'ignore' {
    if (v !== 'slow-call') return v;
    return attemptMs > this.s.slowCallMs ? 'failure' : 'ignore';
  }
}

function randomBreakerSettings(g: Gen): BreakerSettings {
  const probeWhileParkedMs = g.pick([50, 200, 1_000, 1_500]);
  return settingsForModel(
    BreakerSchema.parse({
      failureRate: g.pick([0.1, 0.25, 0.5, 0.75, 1]),
      windowS: g.int(1, 5),
      minRequests: g.int(1, 12),
      consecutiveFailures: g.int(1, 6),
      slowCallMs: g.pick([100, 1_000, 5_000]),
      openS: g.pick([0.5, 1, 2, 5]),
      halfOpenProbes: g.int(1, 4),
      closeAfter: g.int(1, 4),
      probeWhileParkedMs,
      probeWhileParkedMaxMs: g.chance(0.8) ? probeWhileParkedMs * g.int(1, 8) : g.pick([50, 100, 400]),
    }),
    undefined,
  );
}

interface Outstanding {
  real: { permit: string; spellSinceMs: number; spellState: "closed" | "open" | "half-open" };
  model: ModelProbe;
}

async function runBreakerSequence(seed: number, steps: number, seen: Set<string>): Promise<void> {
  const g = gen(seededRandom(seed));
  const s = randomBreakerSettings(g);
  const T = 'p/m';
  let now = g.int(1, 10) * 1_000_000 + g.int(0, 999);
  const store = new MemoryStore();
  const board = new BreakerBoard({ store, now: () => now, random: seededRandom(seed ^ 0x5eed) });
  const model = new BreakerModel(s, seededRandom(seed ^ 0x5eed));
  const probes: Outstanding[] = [];
  const log: string[] = [];
  const fail = (what: string, real: unknown, expected: unknown) => {
    throw new Error(`seed ${seed}: ${what} after\n  ${log.slice(-12).join('\n  ')}\n  settings ${JSON.stringify(s)}\n  real ${JSON.stringify(real)}\n  model ${JSON.stringify(expected)}`);
  };
  const check = () => {
    const rec = board.current(T);
    const seen = { state: rec.state, sinceMs: rec.state === 'closed' && rec.generation === 0 ? 0 : rec.sinceMs, openUntilMs: rec.openUntilMs, probeSuccesses: rec.probeSuccesses, probeFailures: rec.probeFailures ?? 0, failedProbes: rec.failedProbes ?? 0 };
    const want = { state: model.state, sinceMs: model.sinceMs, openUntilMs: model.openUntilMs, probeSuccesses: model.probeSuccesses, probeFailures: model.probeFailures, failedProbes: model.failedProbes };
    if (JSON.stringify(seen) !== JSON.stringify(want)) fail('record differs', seen, want);
    for (const parked of [false, true]) {
      const a = board.availability(T, s, parked), b = model.availability(now, parked);
      if (JSON.stringify(a) !== JSON.stringify(b)) fail(`availability(parked: ${parked}) differs`, a, b);
    }
    // Invariants the README states outright.
    if (rec.state === 'open' && !(rec.openUntilMs >= rec.sinceMs && Number.isFinite(rec.openUntilMs))) fail('open without an end', rec, undefined);
  };
  // The board writes its batched outcomes 50 ms after the first one; the model's timer and the board's fire together.
  const advance = async (ms: number) => {
    const until = now + ms;
    while (model.flushDueMs !== undefined && model.flushDueMs <= until) {
      now = model.flushDueMs;
      log.push(`flush at ${now}`);
      await board.flush();
      board.close();
      model.flush(now);
      check();
    }
    now = until;
  };
  for (let step = 0; step < steps; step++) {
    const roll = g.random();
    if (roll < 0.3) {
      const verdict = g.pick<Verdict>(['success', 'failure', 'failure', 'ignore', 'slow-call']);
      const attemptMs = g.pick([10, s.slowCallMs, s.slowCallMs + 1, 3 * s.slowCallMs]);
      log.push(`${now}: outcome ${verdict} ${attemptMs}ms`);
      await board.record(T, s, verdict, attemptMs, undefined);
      model.outcome(now, verdict, attemptMs);
    } else if (roll < 0.5) {
      const parked = g.chance(0.5);
      const ttlMs = g.pick([100, 1_500, 5_000]);
      log.push(`${now}: admit parked=${parked} ttl=${ttlMs}`);
      const a = await board.admit(T, s, parked, ttlMs);
      const b = model.admit(now, parked, ttlMs);
      const shape = (x: typeof a | typeof b) => (x.admitted ? { admitted: true, probe: x.probe !== undefined } : x);
      if (JSON.stringify(shape(a)) !== JSON.stringify(shape(b))) fail('admission differs', shape(a), shape(b));
      if (a.admitted && a.probe && b.admitted && b.probe) probes.push({ real: a.probe, model: b.probe });
    } else if (roll < 0.7 && probes.length > 0) {
      const [p] = probes.splice(g.int(0, probes.length - 1), 1);
      const verdict = g.pick<Verdict>(['success', 'success', 'failure', 'ignore', 'slow-call']);
      const attemptMs = g.pick([10, s.slowCallMs + 1]);
      log.push(`${now}: probe ${p!.model.permit} ${verdict} ${attemptMs}ms`);
      await board.record(T, s, verdict, attemptMs, p!.real);
      model.probeResult(now, p!.model, verdict, attemptMs);
    } else if (roll < 0.72 && probes.length > 0) {
      const [p] = probes.splice(g.int(0, probes.length - 1), 1);
      log.push(`${now}: probe ${p!.model.permit} unused`);
      board.unused(T, p!.real);
      model.permits.delete(p!.model.permit);
    } else {
      const ms = g.pick([0, 1, g.int(1, 60), g.int(100, 400), g.int(500, 3_000), Math.round(s.openS * 1_000 * g.pick([0.5, 1, 1.1]))]);
      log.push(`${now}: advance ${ms}`);
      await advance(ms);
    }
    check();
  }
  board.close();
  for (const x of model.seen) seen.add(x);
}

describe('the circuit breaker against the README model', () => {
  beforeAll(() => {
    // The board's 50 ms batch timer is driven by the test (advance), never by real time.
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
  });
  afterAll(() => {
    vi.useRealTimers();
  });

  it('agrees with the model at every step of thousands of random event sequences (board over the memory store)', async () => {
    const seen = new Set<string>();
    for (let i = 0; i < 300 * SEEDS; i++) await runBreakerSequence(BASE_SEED + i, 200, seen);
    expect([...seen].sort()).toEqual([
      'closed-after-half-open', 'closed-at-first-probe', 'consecutive', 'first-probe-failed', 'half-open-reopened', 'inconclusive',
      'long-run', 'permits-taken-half-open', 'permits-taken-open', 'stale-probe', 'window',
    ]);
  });
});

// ------------------------------------------------------------------------------------------------------------------
// The retry budget, as the README's "Retry budget" paragraph describes it, through RetryBudget over the memory store.
// ------------------------------------------------------------------------------------------------------------------

/**
 * "over a sliding window of windowS seconds, retries may be at most ratio of requests, with a floor of
 * minRetriesPerSecond". The window is kept in whole seconds (the current one and the windowS - 1 before it).
 */
class BudgetModel {
  readonly events: { sec: number; requests: number; retries: number }[] = [];
  constructor(private readonly cfg: BudgetConfig) {}

  window(nowMs: number): { requests: number; retries: number } {
    const sec = Math.floor(nowMs / 1000);
    let requests = 0, retries = 0;
    for (const e of this.events) {
      if (e.sec > sec - this.cfg.windowS && e.sec <= sec) {
        requests += e.requests;
        retries += e.retries;
      }
    }
    return { requests, retries };
  }

  allowance(requests: number): number {
    return Math.max(this.cfg.ratio * requests, this.cfg.minRetriesPerSecond * this.cfg.windowS);
  }

  request(nowMs: number, n: number): void {
    this.events.push({ sec: Math.floor(nowMs / 1000), requests: n, retries: 0 });
  }

  /** A client's own retry (force) is counted whatever the budget says; the answer is whether it had room. */
  retry(nowMs: number, force: boolean): boolean {
    const w = this.window(nowMs);
    const allowed = w.retries + 1 <= this.allowance(w.requests);
    if (allowed || force) this.events.push({ sec: Math.floor(nowMs / 1000), requests: 0, retries: 1 });
    return allowed;
  }
}

describe('the retry budget against the README model', () => {
  it('grants exactly the retries the model grants, and never more than ratio x requests or the floor', async () => {
    let granted = 0, refused = 0, recovered = 0;
    for (let i = 0; i < 200 * SEEDS; i++) {
      const seed = BASE_SEED + 7_000 + i;
      const g = gen(seededRandom(seed));
      const cfg = { ratio: g.pick([0, 0.1, 0.25, 1, 2.5]), windowS: g.int(1, 12), minRetriesPerSecond: g.pick([0, 0.05, 0.3, 1, 3]) };
      let now = g.int(0, 1e9);
      const budget = new RetryBudget(new MemoryStore(), () => now);
      const key = RetryBudget.key('r', 'p/m', 'online');
      const model = new BudgetModel(cfg);
      const where = (step: number, what: string) => `seed ${seed} step ${step} (${what}) cfg ${JSON.stringify(cfg)} now ${now}`;
      /** expect() only on a failure: a message built per step made the run seconds slower. */
      const same = (real: unknown, want: unknown, step: number, what: string) => {
        if (JSON.stringify(real) !== JSON.stringify(want)) expect(real, where(step, what)).toEqual(want);
      };
      for (let step = 0; step < 300; step++) {
        const roll = g.random();
        if (roll < 0.35) {
          budget.countRequest(key, cfg);
          model.request(now, 1);
        } else if (roll < 0.7) {
          const force = g.chance(0.15);
          const real = force ? await budget.countRetry(key, cfg) : await budget.tryRetry(key, cfg);
          same(real, model.retry(now, force), step, `retry force=${force}`);
          if (real) granted++;
          else refused++;
          // The README's bound, at the moment of every retry it let through.
          const w = model.window(now);
          if (real && w.retries > model.allowance(w.requests) + 1e-9) expect(w.retries, where(step, 'bound')).toBeLessThanOrEqual(model.allowance(w.requests));
        } else if (roll < 0.95) {
          now += g.pick([0, 1, g.int(1, 999), g.int(1_000, 3_000)]);
        } else {
          // A quiet spell as long as the window: the budget is whole again (the floor alone, with no traffic).
          now += cfg.windowS * 1000 + g.int(0, 5_000);
          const fresh = await budget.tryRetry(key, cfg);
          same(fresh, cfg.minRetriesPerSecond * cfg.windowS >= 1, step, 'after a quiet window');
          model.retry(now, false);
          if (fresh) recovered++;
        }
        const store = (budget as unknown as { store: MemoryStore }).store;
        const w = await store.budgetWindow(key, cfg, now);
        same(w, model.window(now), step, 'window');
        // Reported once the budget served a request or saw a retry: whole retries, never negative.
        const remaining = (await budget.remainingByRoute()).get('r');
        if (model.events.length > 0) same(remaining, Math.max(0, Math.floor(model.allowance(w.requests) - w.retries)), step, 'remaining');
      }
    }
    // The generator reaches both answers and the recovery.
    expect(granted).toBeGreaterThan(1_000);
    expect(refused).toBeGreaterThan(1_000);
    expect(recovered).toBeGreaterThan(10);
  });

  it('keeps at most MAX_WINDOW_S + 1 seconds of buckets per key however long it runs, and sums only whole numbers', () => {
    const g = gen(seededRandom(BASE_SEED + 11));
    const b = new SecondBuckets();
    let now = 1_700_000_000_000;
    let maxSize = 0;
    for (let i = 0; i < 20_000; i++) {
      now += g.pick([0, 10, 400, 1_000, 7_000]);
      b.add(now, [g.int(0, 3), g.int(0, 1)]);
      maxSize = Math.max(maxSize, b.size);
      if (g.chance(0.01)) {
        const [r = 0, f = 0] = b.sum(now, g.int(1, MAX_WINDOW_S), 2);
        expect(Number.isInteger(r) && Number.isInteger(f) && r >= 0 && f >= 0).toBe(true);
      }
    }
    expect(maxSize).toBeLessThanOrEqual(MAX_WINDOW_S + 1);
  });
});

// ------------------------------------------------------------------------------------------------------------------
// Backoff: the README's table, for every strategy and attempt, odd configs included.
// ------------------------------------------------------------------------------------------------------------------

const STRATEGIES: BackoffConfig['strategy'][] = ['full-jitter', 'equal-jitter', 'decorrelated-jitter', 'exponential', 'fixed'];

/** The README's bounds of one wait: `exp = min(capMs, baseMs * 2^attempt)`. */
function backoffBounds(cfg: BackoffConfig, attempt: number, prev: number | undefined): [number, number] {
  const a = attempt > 0 ? Math.min(Math.floor(attempt), 64) : 0;
  const exp = Math.min(cfg.capMs, cfg.baseMs * 2 ** a);
  const cap = (x: number) => Math.min(cfg.capMs, x);
  switch (cfg.strategy) {
    case 'full-jitter':
      return [0, exp];
    case 'equal-jitter':
      return [exp / 2, exp];
    case 'decorrelated-jitter': {
      // "min(capMs, random(baseMs, previous wait * 3))"; before the first retry the previous wait is baseMs.
      const p = prev === undefined || !Number.isFinite(prev) ? cfg.baseMs : prev;
      return [cap(cfg.baseMs), cap(Math.max(cfg.baseMs, p * 3))];
    }
    case 'exponential':
      return [exp, exp];
    case 'fixed':
      return [cap(cfg.baseMs), cap(cfg.baseMs)];
  }
}

describe('backoff and the retry wait', () => {
  it('keeps every wait of every strategy a whole number of ms within the README bounds, for any attempt and config', () => {
    const g = gen(seededRandom(BASE_SEED + 21));
    const attempts = [0, 1, 2, 5, 30, 63, 64, 65, 1_000, 2 ** 31, 1e300, Number.MAX_VALUE, Infinity, -1, -Infinity, Number.NaN, 0.5, 2.7];
    const prevs = [undefined, 0, 1, 50, 3_000, 1e12, Infinity, Number.NaN, -5];
    const randoms: Random[] = [() => 0, () => 0.999_999_999, () => 0.5, () => 1, () => -0.1, () => Number.NaN, g.random];
    let n = 0;
    for (let i = 0; i < 20_000 * SEEDS; i++) {
      const capMs = g.pick([0, 1, 7, 200, 3_000, 30_000, 2 ** 31 - 1]);
      const cfg: BackoffConfig = { strategy: g.pick(STRATEGIES), baseMs: g.pick([1, 3, 100, 200, 5_000, 2 ** 31 - 1]), capMs };
      const attempt = g.pick(attempts);
      const prev = g.pick(prevs);
      const random = g.pick(randoms);
      const ms = backoffDelayMs(cfg, attempt, prev, random);
      const [lo, hi] = backoffBounds(cfg, attempt, prev);
      const ok = Number.isInteger(ms) && ms >= 0 && ms <= capMs && ms >= Math.floor(lo) && ms <= Math.ceil(hi);
      if (!ok) expect({ cfg, attempt, prev, ms, lo, hi }).toBe('within bounds');
      n++;
    }
    expect(n).toBeGreaterThan(0);
  });

  it('takes its jitter from the random it is given and from nothing else', () => {
    const spy = vi.spyOn(Math, 'random').mockImplementation(() => {
      throw new Error('Math.random() called: policy code must use the injected random');
    });
    try {
      for (const strategy of STRATEGIES) {
        const cfg: BackoffConfig = { strategy, baseMs: 100, capMs: 10_000 };
        const a = seededRandom(5), b = seededRandom(5);
        const xs = Array.from({ length: 50 }, (_, i) => backoffDelayMs(cfg, i % 8, i * 37, a));
        const ys = Array.from({ length: 50 }, (_, i) => backoffDelayMs(cfg, i % 8, i * 37, b));
        expect(xs).toEqual(ys);
        if (strategy.endsWith('jitter')) {
          // The extremes of the random reach the extremes of the range: the wait is drawn from it, not fixed.
          expect(backoffDelayMs(cfg, 3, 100, () => 0)).toBeLessThan(backoffDelayMs(cfg, 3, 100, () => 0.999));
        }
      }
      const hint = jitterWaitHintMs(1_000, seededRandom(9));
      expect(hint).toBe(jitterWaitHintMs(1_000, seededRandom(9)));
    } finally {
      spy.mockRestore();
    }
  });

  it('jitters a wait hint into [hint, 1.2 x hint], whole ms, and never below the hint', () => {
    const g = gen(seededRandom(BASE_SEED + 22));
    for (let i = 0; i < 20_000; i++) {
      const hint = g.pick([0, 1, 0.4, 999.5, g.int(1, MAX_WAIT_HINT_MS), MAX_WAIT_HINT_MS, -3, Number.NaN]);
      const ms = jitterWaitHintMs(hint, g.pick<Random>([g.random, () => 0, () => 0.9999, () => 2, () => Number.NaN]));
      const h = hint > 0 ? hint : 0;
      const ok = Number.isInteger(ms) && ms >= Math.ceil(h) && ms <= Math.ceil(h * 1.2);
      if (!ok) expect({ hint, ms }).toBe('within [hint, 1.2 x hint]');
    }
    // Infinity stays Infinity, so the caller's cap refuses it rather than waiting some finite time.
    expect(jitterWaitHintMs(Infinity, () => 0.5)).toBe(Infinity);
  });

  it('waits only when an attempt of minAttemptMs still fits before the deadline, and honours a hint over the backoff', () => {
    const g = gen(seededRandom(BASE_SEED + 23));
    for (let i = 0; i < 8_000; i++) {
      const retry: RetryConfig = {
        maxAttempts: 3,
        retryOn: [429, 503],
        maxWaitHintMs: g.pick([0, 1_000, 20_000]),
        backoff: { strategy: g.pick(STRATEGIES), baseMs: g.pick([1, 200]), capMs: g.pick([200, 3_000]) },
      };
      const nowMs = g.int(0, 1e12);
      const hintMs = g.pick([undefined, 0, 1, 500, 19_999, 20_000, 20_001, MAX_WAIT_HINT_MS]);
      const inputs = {
        retry,
        hint: hintMs === undefined ? undefined : { delayMs: hintMs, source: 'retry-after' as const, fleetWide: true },
        retryIndex: g.int(0, 20),
        prevDelayMs: g.pick([undefined, 0, 300]),
        nowMs,
        deadlineAtMs: nowMs + g.pick([-10, 0, 500, 1_000, 2_000, 30_000, 200_000]),
        minAttemptMs: g.pick([0, 1_000]),
        random: g.random,
      };
      const d = decideRetryWait(inputs);
      const hinted = hintMs !== undefined && hintMs > 0;
      if (hinted && hintMs > retry.maxWaitHintMs) {
        expect(d).toEqual({ wait: false, why: 'hint-too-long', retryAfterMs: hintMs });
      } else if (d.wait) {
        expect(Number.isInteger(d.delayMs) && d.delayMs >= 0).toBe(true);
        expect(nowMs + d.delayMs + inputs.minAttemptMs).toBeLessThanOrEqual(inputs.deadlineAtMs);
        expect(d.fromHint).toBe(hinted);
        if (hinted) expect(d.delayMs).toBeGreaterThanOrEqual(hintMs);
        else expect(d.delayMs).toBeLessThanOrEqual(retry.backoff.capMs);
      } else {
        expect(d.why).toBe('deadline');
        // A hint that does not fit is handed to the client; a backoff that does not fit is no hint.
        expect(d.retryAfterMs).toBe(hinted ? hintMs : undefined);
        // Refused only when the longest wait the jitter could have drawn would not have fitted either... or the one drawn.
        const longest = hinted ? Math.ceil(hintMs * 1.2) : Math.ceil(backoffBounds(retry.backoff, inputs.retryIndex, inputs.prevDelayMs)[1]);
        expect(canWait(nowMs, longest, inputs.deadlineAtMs, inputs.minAttemptMs)).toBe(false);
      }
    }
  });
});

// ------------------------------------------------------------------------------------------------------------------
// Wait hints: the README's precedence over generated header sets, and safety on noise.
// ------------------------------------------------------------------------------------------------------------------

/** One generated header value and what the README says it means: a wait in ms (0: "now"), invalid, or unknown noise. */
type HintValue = { text: string; ms: number | 'invalid' | 'noise' };

const NOISE_ALPHABET = ['0', '1', '5', '9', '.', ':', '-', '+', ' ', ',', 'e', 'E', 'x', 's', 'm', 'h', 'T', 'Z', 'G', 'M', '\u0663', '\u00b5', 'Wed', 'GMT', 'Infinity', 'NaN', '\t'];

function noise(g: Gen): HintValue {
  return { text: Array.from({ length: g.int(0, 12) }, () => g.pick(NOISE_ALPHABET)).join(''), ms: 'noise' };
}

/** Invalid in every wait-hint header. */
const INVALID_ANYWHERE = ['-5', '1e3', '0x10', 'Infinity', 'NaN', 'soon', '\u0663', '\u0661\u0662', '1,000', '5 5', '--1', '1e-3'];

function decimalMs(g: Gen, scale: number): HintValue {
  const roll = g.random();
  if (roll < 0.1) return { text: '0', ms: 0 };
  if (roll < 0.15) return { text: '00', ms: 0 };
  // Longer than a day: clamped to 24 h, still a hint.
  if (roll < 0.2) return { text: '9'.repeat(g.pick([12, 30, 400])), ms: MAX_WAIT_HINT_MS };
  if (roll < 0.5) {
    const whole = g.int(0, 90), frac = g.int(1, 999);
    const text = `${whole}.${String(frac).padStart(3, '0')}`;
    return { text: g.chance(0.2) ? ` ${text} ` : text, ms: Number(text) * scale };
  }
  const n = g.int(1, 200_000);
  return { text: String(n), ms: n * scale };
}

function retryAfter(g: Gen, nowMs: number): HintValue {
  const roll = g.random();
  if (roll < 0.5) return decimalMs(g, 1000);
  if (roll < 0.6) return { text: g.pick([...INVALID_ANYWHERE, '1.', '.5', '+5', 'Wed, 21 Oct 2015 07:28:00 UTC', '2030-01-01T00:00:00Z', 'Wed, 30 Feb 2031 07:28:00 GMT']), ms: 'invalid' };
  // An IMF-fixdate, near or far, past or future; toUTCString() writes exactly that form.
  const at = (Math.floor(nowMs / 1000) + g.pick([g.int(-3_600, 3_600), g.int(-1e9, 1e9), 0, 1])) * 1000;
  if (at < Date.UTC(1000, 0, 1) || at > Date.UTC(9999, 11, 31)) return { text: 'soon', ms: 'invalid' };
  return { text: new Date(at).toUTCString(), ms: Math.max(0, at - nowMs) };
}

function rfc3339(g: Gen, nowMs: number): HintValue {
  if (g.chance(0.15)) return { text: g.pick([...INVALID_ANYWHERE, '2031-02-30T00:00:00Z', '2031-01-01T24:00:00Z', '2031-01-01T00:00:00+24:00', '2031-01-01T00:00:00', 'Wed, 21 Oct 2015 07:28:00 GMT']), ms: 'invalid' };
  const at = nowMs + g.pick([g.int(-60_000, 120_000), g.int(-1e10, 1e10), 0]);
  // Written in a random offset, as a provider in any time zone could.
  const offsetMin = g.pick([0, g.int(-23 * 60 - 59, 23 * 60 + 59)]);
  const shifted = new Date(at + offsetMin * 60_000);
  if (!(shifted.getUTCFullYear() >= 1000 && shifted.getUTCFullYear() <= 9999)) return { text: 'never', ms: 'invalid' };
  const local = shifted.toISOString(); // 2031-01-01T00:00:00.123Z, in the offset's local time
  const abs = Math.abs(offsetMin);
  const zone = offsetMin === 0 && g.chance(0.5) ? g.pick(['Z', 'z']) : `${offsetMin < 0 ? '-' : '+'}${String(Math.floor(abs / 60)).padStart(2, '0')}:${String(abs % 60).padStart(2, '0')}`;
  const fraction = g.pick(['', local.slice(19, 23), `${local.slice(19, 23)}000`]);
  const sep = g.pick(['T', 't', ' ']);
  const text = `${local.slice(0, 10)}${sep}${local.slice(11, 19)}${fraction}${zone}`;
  return { text, ms: fraction === '' ? Math.floor(at / 1000) * 1000 - nowMs : at - nowMs };
}

const GO_UNITS: [string, number][] = [['h', 3_600_000], ['m', 60_000], ['s', 1000], ['ms', 1], ['us', 1e-3], ['\u00b5s', 1e-3], ['ns', 1e-6]];

function goDuration(g: Gen): HintValue {
  if (g.chance(0.15)) return { text: g.pick([...INVALID_ANYWHERE, '-1s', '1', '1d', '1e3s', '1 s', 's', '1..5s', '١s']), ms: 'invalid' };
  if (g.chance(0.1)) return { text: '0', ms: 0 };
  const parts = Array.from({ length: g.int(1, 3) }, () => {
    const [unit, ms] = g.pick(GO_UNITS);
    const amount = g.pick([String(g.int(0, 90)), `${g.int(0, 9)}.${g.int(0, 99)}`, `.${g.int(1, 9)}`]);
    return { text: `${amount}${unit}`, ms: Number(amount) * ms };
  });
  return { text: parts.map((p) => p.text).join(''), ms: parts.reduce((sum, p) => sum + p.ms, 0) };
}

const ANTHROPIC = ['requests', 'tokens', 'input-tokens', 'output-tokens'];
const OPENAI = ['requests', 'tokens'];

/** The README: retry-after-ms, retry-after, anthropic-ratelimit-*-reset, x-ratelimit-reset-*, the first valid non-zero. */
function expectedHint(values: Map<string, HintValue>): { ms: number; source: string } | undefined | 'unknown' {
  const v = (name: string) => values.get(name);
  const present = (name: string) => v(name) !== undefined && v(name)!.text.trim() !== '';
  if ([...values.values()].some((x) => x.ms === 'noise')) return 'unknown';
  const wait = (name: string) => (present(name) && typeof v(name)!.ms === 'number' ? (v(name)!.ms as number) : undefined);
  for (const [name, source] of [['retry-after-ms', 'retry-after-ms'], ['retry-after', 'retry-after']] as const) {
    const ms = wait(name);
    if (ms !== undefined && ms > 0) return { ms, source };
  }
  // "the reset headers count only for a limit whose remaining is 0 when the provider says"
  const family = (limits: string[], reset: (l: string) => string, remaining: (l: string) => string) => {
    const anyRemaining = limits.some((l) => present(remaining(l)));
    let latest: number | undefined;
    for (const l of limits) {
      if (anyRemaining && !/^0+$/.test(v(remaining(l))?.text.trim() ?? '')) continue;
      const ms = wait(reset(l));
      if (ms !== undefined && ms > 0 && (latest === undefined || ms > latest)) latest = ms;
    }
    return latest;
  };
  const a = family(ANTHROPIC, (l) => `anthropic-ratelimit-${l}-reset`, (l) => `anthropic-ratelimit-${l}-remaining`);
  if (a !== undefined) return { ms: a, source: 'anthropic-ratelimit-reset' };
  const o = family(OPENAI, (l) => `x-ratelimit-reset-${l}`, (l) => `x-ratelimit-remaining-${l}`);
  if (o !== undefined) return { ms: o, source: 'x-ratelimit-reset' };
  return undefined;
}

function randomHintHeaders(g: Gen, nowMs: number, noisy: boolean): Map<string, HintValue> {
  const values = new Map<string, HintValue>();
  const maybe = (name: string, make: () => HintValue) => {
    if (g.chance(0.5)) return;
    values.set(name, noisy && g.chance(0.2) ? noise(g) : make());
  };
  maybe('retry-after-ms', () => (g.chance(0.15) ? { text: g.pick([...INVALID_ANYWHERE, '1.', '+5']), ms: 'invalid' } : decimalMs(g, 1)));
  maybe('retry-after', () => retryAfter(g, nowMs));
  const remaining = () => g.pick<HintValue>([{ text: '0', ms: 'invalid' }, { text: '000', ms: 'invalid' }, { text: '12', ms: 'invalid' }, { text: 'x', ms: 'invalid' }, { text: '  ', ms: 'invalid' }]);
  for (const l of ANTHROPIC) {
    if (g.chance(0.3)) maybe(`anthropic-ratelimit-${l}-reset`, () => rfc3339(g, nowMs));
    if (g.chance(0.3)) maybe(`anthropic-ratelimit-${l}-remaining`, remaining);
  }
  for (const l of OPENAI) {
    if (g.chance(0.5)) maybe(`x-ratelimit-reset-${l}`, () => goDuration(g));
    if (g.chance(0.4)) maybe(`x-ratelimit-remaining-${l}`, remaining);
  }
  return values;
}

describe('wait hints against the README precedence', () => {
  it('finds the hint the README says for generated header sets, in whole ms up to 24 h', () => {
    let hinted = 0;
    const sources = new Set<string>();
    for (let i = 0; i < 15_000 * SEEDS; i++) {
      const g = gen(seededRandom(BASE_SEED + 100_000 + i));
      const nowMs = g.pick([Date.UTC(2015, 9, 21, 7, 28, 0), g.int(1e12, 2e12), g.int(1e12, 2e12) + 0.5]);
      const values = randomHintHeaders(g, Math.floor(nowMs), false);
      const headers: ResponseHeaders = Object.fromEntries([...values].map(([k, v]) => [k, v.text]));
      const real = parseWaitHint(headers, Math.floor(nowMs));
      const want = expectedHint(values);
      const expected = want === undefined || want === 'unknown' ? want : { delayMs: Math.min(MAX_WAIT_HINT_MS, Math.ceil(want.ms)), source: want.source, fleetWide: want.source.startsWith('retry-after') };
      if (JSON.stringify(real) !== JSON.stringify(expected)) expect({ headers, nowMs, real }).toEqual({ headers, nowMs, real: expected });
      if (real) {
        hinted++;
        sources.add(real.source);
      }
    }
    expect(hinted).toBeGreaterThan(5_000);
    expect([...sources].sort()).toEqual(['anthropic-ratelimit-reset', 'retry-after', 'retry-after-ms', 'x-ratelimit-reset']);
  });

  it('never throws on noise and never returns NaN, a negative, zero or Infinity, for any header value', () => {
    for (let i = 0; i < 15_000 * SEEDS; i++) {
      const g = gen(seededRandom(BASE_SEED + 200_000 + i));
      const nowMs = g.pick([0, g.int(1e12, 2e12), 8.64e15]);
      const values = randomHintHeaders(g, nowMs, true);
      const headers: ResponseHeaders = Object.fromEntries([...values].map(([k, v]) => [k, g.chance(0.05) ? [v.text, 'x'] : v.text]));
      if (g.chance(0.05)) headers['retry-after'] = g.pick(['9'.repeat(400), `${'9'.repeat(400)}.5`, '1'.padEnd(5000, '0'), ' '.repeat(1000), '\u0000']);
      const real = parseWaitHint(headers, nowMs);
      if (real !== undefined && !(Number.isInteger(real.delayMs) && real.delayMs > 0 && real.delayMs <= MAX_WAIT_HINT_MS)) expect({ headers, real }).toBe('a positive whole wait of at most 24 h');
      const low = quotaLowUntil(headers, nowMs);
      if (low !== undefined && !(Number.isFinite(low) && low > nowMs)) expect({ headers, low }).toBe('a reset after now');
    }
  });

  it('reads Go durations part by part, whatever the combination of units', () => {
    for (let i = 0; i < 20_000; i++) {
      const g = gen(seededRandom(BASE_SEED + 300_000 + i));
      const d = goDuration(g);
      const real = parseDurationMs(d.text);
      if (typeof d.ms === 'number') {
        if (real === undefined || Math.abs(real - d.ms) > 1e-9 * Math.max(1, d.ms)) expect({ text: d.text, real }).toEqual({ text: d.text, real: d.ms });
      } else if (real !== undefined) expect({ text: d.text, real }).toEqual({ text: d.text, real: undefined });
    }
  });
});

// ------------------------------------------------------------------------------------------------------------------
// Deadlines: "the smallest of the route's timeoutMs, x-stormgate-timeout-ms, x-stainless-timeout (whole seconds; 0 is
// read as 1 s) and x-stainless-read-timeout, minus a margin (deadlineMarginMs, default the larger of 250 ms and 5%)".
// ------------------------------------------------------------------------------------------------------------------

type DeadlineSource = 'route' | 'x-stormgate-timeout-ms' | 'x-stainless-timeout' | 'x-stainless-read-timeout';

/** A header value and the timeout in ms the README reads from it: undefined when it is to be ignored, 'unknown' for noise. */
function timeoutValue(g: Gen, unitMs: number): { text: string; ms: number | undefined | 'unknown' } {
  const roll = g.random();
  if (roll < 0.15) return { text: g.pick(['-1', '-0.5', 'abc', '', '  ', 'Infinity', 'NaN', '\u0663', '9'.repeat(400), '1,5']), ms: undefined };
  if (roll < 0.25) return { text: g.pick(['1e3', '0x10', '0b11', '-0', '+5', '.5', '5.']), ms: 'unknown' };
  if (roll < 0.35) return { text: '0', ms: unitMs === 1 ? undefined : 1_000 };
  const n = g.pick([g.int(1, 600), g.int(1, 10) / 10, g.int(1, 1e6), 1e12]);
  // Seconds: only a 0 (the JS SDK's truncated sub-second timeout) is read as 1 s; a fraction is the Python SDK's exact timeout.
  const ms = unitMs === 1 ? n : n * unitMs;
  return { text: g.chance(0.1) ? ` ${n} ` : String(n), ms };
}

describe('the deadline against the README', () => {
  it('takes the smallest timeout of all sources, then the margin, for any header values', () => {
    for (let i = 0; i < 15_000 * SEEDS; i++) {
      const g = gen(seededRandom(BASE_SEED + 400_000 + i));
      const routeTimeoutMs = g.pick([1, 40, 200, 1_000, 30_000, 120_000, 2 ** 31 - 1]);
      const marginMs = g.pick([undefined, 0, 100, 250, 10_000, 2 ** 31 - 1]);
      const sources: [DeadlineSource, number][] = [['x-stormgate-timeout-ms', 1], ['x-stainless-timeout', 1000], ['x-stainless-read-timeout', 1000]];
      const headers: Record<string, string | string[]> = {};
      let expected: { timeoutMs: number; source: DeadlineSource } | undefined = { timeoutMs: routeTimeoutMs, source: 'route' };
      for (const [name, unit] of sources) {
        if (g.chance(0.4)) continue;
        const v = timeoutValue(g, unit);
        headers[name] = g.chance(0.05) ? [v.text, '1'] : v.text;
        if (v.ms === 'unknown') expected = undefined;
        else if (expected !== undefined && v.ms !== undefined && v.ms < expected.timeoutMs) expected = { timeoutMs: v.ms, source: name };
      }
      const d = computeDeadline({ routeTimeoutMs, marginMs, headers });
      const bad = !(Number.isFinite(d.budgetMs) && d.budgetMs > 0 && d.budgetMs <= d.timeoutMs && d.timeoutMs <= routeTimeoutMs);
      if (bad) expect({ routeTimeoutMs, marginMs, headers, d }).toBe('a positive budget within the smallest timeout');
      if (expected === undefined) continue;
      // A configured margin is kept back whole, but from a client's shorter timeout at most half of it.
      const share = (ms: number) => (expected!.timeoutMs >= routeTimeoutMs ? ms : Math.min(ms, Math.round(expected!.timeoutMs / 2)));
      const margin = marginMs === undefined ? Math.max(250, Math.round(expected.timeoutMs * 0.05)) : share(marginMs);
      // "minus a margin"; a margin as long as the timeout itself leaves a sliver (50 ms at most) rather than nothing.
      const minus = (timeoutMs: number, m: number) => Math.max(Math.min(timeoutMs, 50), timeoutMs - m);
      // "never more than the route's own timeout less its margin gives": a client asking for more never gets less.
      const budgetMs = marginMs === undefined ? minus(expected.timeoutMs, margin) : Math.min(minus(expected.timeoutMs, margin), minus(routeTimeoutMs, marginMs));
      const want = { budgetMs, timeoutMs: expected.timeoutMs, source: expected.source };
      if (JSON.stringify(d) !== JSON.stringify(want)) expect({ routeTimeoutMs, marginMs, headers, d }).toEqual({ routeTimeoutMs, marginMs, headers, d: want });
      // A request whose route is not known yet gets the longest its routes would give it.
      const other = { timeoutMs: g.pick([500, 60_000]), deadlineMarginMs: g.pick([undefined, 100]) };
      const longest = longestBudgetMs([{ timeoutMs: routeTimeoutMs, deadlineMarginMs: marginMs }, other], headers);
      expect(longest).toBeGreaterThanOrEqual(d.budgetMs);
    }
  });
});

// ------------------------------------------------------------------------------------------------------------------
// Adaptive concurrency: never below its floor nor above maxConcurrent, never NaN, one cut per round trip.
// ------------------------------------------------------------------------------------------------------------------

describe('the adaptive limit under random answers', () => {
  it('stays within [minLimit, maxConcurrent], finite, with every class limit within the top one', () => {
    let cuts = 0, grew = 0, noise = 0;
    for (let i = 0; i < 300 * SEEDS; i++) {
      const seed = BASE_SEED + 500_000 + i;
      const g = gen(seededRandom(seed));
      const max = g.pick([1, 2, 5, 20, 128, 300]);
      const s: LimitSettings = {
        max,
        // A floor above the ceiling too: the config allows minLimit > maxConcurrent.
        min: g.chance(0.9) ? g.int(1, max) : g.int(max + 1, 2 * max + 1),
        decrease: g.pick([0.1, 0.5, 0.9, 0.99]),
        minShares: Array.from({ length: g.int(1, 3) }, (_, k) => (k === 0 ? 0.5 : g.pick([0, 0.1, 0.5, 1]))),
      };
      let st: LimitState = initialLimit(s);
      let now = g.int(0, 1e12);
      // The provider: random answers, or one that takes `capacity` in flight and refuses a share of the rest
      // whatever the concurrency (another client of the same key), as the README's noise paragraph describes.
      const simulated = g.chance(0.6);
      const capacity = g.int(1, max * 2);
      const refusedShare = g.pick([0, 0.05, 0.3, 0.5]);
      const fixedRtt = g.pick([1, 50, 400]);
      const fail = (step: number, what: string, why: string, before: LimitState) => expect({ seed, step, what, s, before, st }).toBe(why);
      for (let step = 0; step < 400; step++) {
        const rtt = simulated ? fixedRtt : g.pick([0, 1, 50, 400, 2_000]);
        const before = st;
        const total = simulated ? Math.max(1, Math.floor(st.limit)) : g.int(0, Math.ceil(st.limit) + 3);
        const refused = simulated ? total > capacity || g.random() < refusedShare : g.random() < 0.45;
        let what: string;
        if (refused) {
          const byClass = s.minShares.map(() => 0);
          for (let k = 0; k < total; k++) byClass[g.int(0, byClass.length - 1)]!++;
          what = `rate-limited rtt=${rtt} inUse=${total} ${JSON.stringify(byClass)}`;
          st = onRateLimited(st, s, now, rtt, { total, byClass, waiting: simulated ? 1 : g.pick([0, 0, 3]) });
          if (st.limit > before.limit) fail(step, what, 'a refusal never raises the limit', before);
          if (st.lastDecreaseAtMs !== before.lastDecreaseAtMs) {
            cuts++;
            // "at most once per round trip"
            if (now - before.lastDecreaseAtMs < rtt) fail(step, what, 'one cut per round trip', before);
          }
          if (st.noiseShare !== undefined && before.noiseShare === undefined) noise++;
        } else if (simulated || g.random() < 0.9) {
          const holdMs = g.pick([undefined, 0, rtt, 30_000]);
          what = `success rtt=${rtt} hold=${holdMs}`;
          st = onSuccess(st, s, now, rtt, holdMs);
          // "successes add one per round trip" (+1 per success in slow start): never more than one slot at once.
          if (st.limit - before.limit > 1 + 1e-9) fail(step, what, 'at most one slot more per success', before);
          if (st.limit > before.limit) grew++;
        } else {
          what = 'recovered';
          st = onRecovered(st, s);
        }
        now += simulated ? g.int(0, Math.ceil(rtt / Math.max(1, total))) : g.pick([0, 1, rtt, 10 * rtt, g.int(0, 5_000)]);
        const ok = Number.isFinite(st.limit) && st.limit >= Math.min(s.min, s.max) && st.limit <= s.max
          && st.caps.every((c) => Number.isFinite(c))
          && (st.slowStartTo === undefined || Number.isFinite(st.slowStartTo))
          && s.minShares.every((_, k) => classLimit(st, k) >= 1 && classLimit(st, k) <= classLimit(st, 0) && classLimit(st, k) <= s.max);
        if (!ok) fail(step, what, 'a limit within its floor and ceiling', before);
      }
    }
    expect(cuts).toBeGreaterThan(1_000);
    expect(grew).toBeGreaterThan(1_000);
    expect(noise).toBeGreaterThan(0);
  });
});

// ------------------------------------------------------------------------------------------------------------------
// Hold-offs and the small policies around waits.
// ------------------------------------------------------------------------------------------------------------------

describe('hold-offs, waits past them, and the small policies', () => {
  it('starts a hold-off of at least the hint, never past 60 s for a hint within it, at most 60 s plus a second beyond', async () => {
    const g = gen(seededRandom(BASE_SEED + 600_000));
    for (let i = 0; i < 1_000; i++) {
      let now = g.int(1e12, 2e12);
      const store = new MemoryStore();
      const holdOffs = new HoldOffs(store, () => now, g.pick<Random>([g.random, () => 0, () => 0.9999]));
      const delayMs = g.pick([1, 150, 1_000, 59_999, 60_000, 60_001, 120_000, MAX_WAIT_HINT_MS]);
      const until = holdOffs.start('p/m', { delayMs, source: 'retry-after', fleetWide: true });
      expect(Number.isInteger(until)).toBe(true);
      expect(until).toBeGreaterThanOrEqual(now + Math.min(delayMs, MAX_HOLD_OFF_MS));
      if (delayMs <= MAX_HOLD_OFF_MS) expect(until).toBeLessThanOrEqual(now + MAX_HOLD_OFF_MS);
      else {
        expect(until).toBeLessThanOrEqual(now + MAX_HOLD_OFF_MS + 1_000);
        // Every request held off meanwhile is told what the provider asked for.
        expect(holdOffs.askedUntil('p/m')).toBe(Math.max(until, now + delayMs));
      }
      // Only ever extended: a shorter hint later does not end it sooner.
      now += g.int(0, 500);
      holdOffs.start('p/m', { delayMs: 1, source: 'retry-after', fleetWide: true });
      expect(store.getHoldOff('p/m')).toBeGreaterThanOrEqual(until);
      await store.close();
    }
  });

  it('waits past a hold-off by at most a fifth of it (a second at most), and tells the client at least its end', () => {
    const g = gen(seededRandom(BASE_SEED + 600_001));
    for (let i = 0; i < 5_000; i++) {
      const own = g.pick([0, 10, 1_000, 20_000]);
      const held = g.pick([0, 5, 999, 5_000, 60_000]);
      const w = waitPastHoldOff(own, held, g.pick<Random>([g.random, () => 0, () => 0.9999]));
      if (held <= own) expect(w).toBe(own);
      else expect(w >= held && w <= held + Math.min(1_000, 0.2 * held)).toBe(true);
      const now = g.int(0, 1e12);
      const retryAfter = g.pick([undefined, 0, 500, 30_000]);
      const holdUntil = g.pick([undefined, now - 5, now + 10_000]);
      const told = pastHoldOff(retryAfter, holdUntil, now, () => 0);
      if (retryAfter === undefined) expect(told).toBeUndefined();
      else expect(told).toBe(holdUntil === undefined ? retryAfter : Math.max(retryAfter, holdUntil - now));
    }
  });

  it('keeps a moving average within its samples, and its first sample as its value', () => {
    const g = gen(seededRandom(BASE_SEED + 600_002));
    for (let i = 0; i < 2_000; i++) {
      const avg = new MovingAverage(g.pick([0, 1_000, 1e9]), g.pick([0.01, 0.2, 1]));
      const xs = Array.from({ length: g.int(1, 50) }, () => g.pick([0, 1, g.int(0, 60_000), 1e9]));
      for (const x of xs) avg.add(x);
      expect(avg.value).toBeGreaterThanOrEqual(Math.min(...xs) - 1e-6);
      expect(avg.value).toBeLessThanOrEqual(Math.max(...xs) + 1e-6);
    }
  });

  it('reads idempotency keys from any header value without throwing, and looks again 75 to 150 ms later', () => {
    const g = gen(seededRandom(BASE_SEED + 600_003));
    const chars = ['a', 'Z', '0', '-', ' ', ',', '\t', '\u00e9', '\u0000', '\x7f', '~', '!', 'stainless-node-retry-'];
    for (let i = 0; i < 5_000; i++) {
      const text = Array.from({ length: g.pick([0, 1, 8, 40, 300]) }, () => g.pick(chars)).join('');
      const k = idempotencyKeyOf({ 'idempotency-key': g.chance(0.05) ? [text, text] : text });
      if (typeof k === 'string') expect(/^[\x21-\x7e]{1,255}$/.test(k)).toBe(true);
      else expect(k instanceof Error).toBe(true);
      const look = nextLookMs(g.random);
      expect(look >= 75 && look < 150 && Number.isInteger(look)).toBe(true);
    }
  });

  it('classifies every upstream outcome as the README says: never-retried statuses, what the breaker counts', () => {
    const g = gen(seededRandom(BASE_SEED + 600_004));
    const everyStatus = Array.from({ length: 200 }, (_, i) => 400 + i);
    const codes = [null, '', 'rate_limit_exceeded', 'insufficient_quota', 'context_length_exceeded', 'content_policy_violation', 'server_error', 'x'];
    for (let i = 0; i < 5_000; i++) {
      const status = g.pick([g.int(100, 599), 400, 401, 402, 403, 404, 422, 429, 500, 503, 529]);
      const outcome: AttemptOutcome = g.pick<AttemptOutcome>([
        { kind: 'http', status, errorCode: g.pick(codes), hint: undefined },
        { kind: 'network', code: g.pick(['ECONNRESET', 'ECONNREFUSED', 'EMFILE', 'ENFILE', 'PROXY_407', '']) },
        { kind: 'timeout', phase: g.pick(['connect', 'headers', 'first-token', 'idle', 'response'] as const) },
        { kind: 'aborted', by: g.pick(['client', 'deadline', 'shutdown'] as const) },
      ]);
      const c = classify(outcome);
      const row = OUTCOME_TABLE[c.cls];
      const retryable = isRetryable(c, [...everyStatus, 'network', 'timeout']);
      if (outcome.kind === 'http') {
        const code = outcome.errorCode;
        // "Never retried, whatever retryOn says: 400, 401, 403, 404, 422", credentials, redirects.
        if ([400, 401, 402, 403, 404, 422].includes(status) || (status >= 300 && status < 400)) expect(retryable, `${status} ${code}`).toBe(false);
        if (status === 429 && code === 'insufficient_quota') expect(retryable).toBe(false);
        // "429s are the provider's rate limit and do not count"; "Failures are 5xx, 529".
        if (status === 429) expect(row.breaker).not.toBe('failure');
        if (status >= 500 && code !== 'context_length_exceeded' && code !== 'content_policy_violation') expect(row.breaker, `${status} ${code}`).toBe('failure');
      } else if (outcome.kind === 'network') {
        expect(row.breaker).toBe(outcome.code === 'EMFILE' || outcome.code === 'ENFILE' ? 'ignore' : 'failure');
      } else if (outcome.kind === 'timeout') {
        expect(row.breaker).toBe('failure');
      } else if (outcome.kind === 'aborted') {
        // Counted only past slowCallMs; a drain never.
        expect(row.breaker).toBe(outcome.by === 'shutdown' ? 'ignore' : 'slow-call');
        expect(retryable).toBe(false);
      }
    }
  });
});

// ------------------------------------------------------------------------------------------------------------------
// What the fuzz found, each as a small deterministic case.
// ------------------------------------------------------------------------------------------------------------------

describe('cases the models found', () => {
  const s = settingsForModel(BreakerSchema.parse({}), undefined);

  function board() {
    let now = 1_000_000;
    const transitions: string[] = [];
    const b = new BreakerBoard({ store: new MemoryStore(), now: () => now, random: () => 0, onTransition: (_t, from, to) => transitions.push(`${from.state}->${to.state}`) });
    return { b, transitions, advance: (ms: number) => (now += ms) };
  }

  async function probe(b: BreakerBoard) {
    const a = await b.admit('p/m', s, false, 5_000);
    if (!a.admitted || !a.probe) throw new Error('no probe permit');
    return a.probe;
  }

  it('does not count stragglers answered while the breaker was open in the fresh window probes closed it with', async () => {
    const { b, transitions, advance } = board();
    for (let i = 0; i < 5; i++) await b.record('p/m', s, 'failure', 10, undefined);
    advance(31_000);
    await b.record('p/m', s, 'success', 10, await probe(b));
    const [p2, p3] = [await probe(b), await probe(b)];
    // Requests sent before the breaker opened time out together now (firstTokenMs after they went): not probes.
    for (let i = 0; i < 20; i++) await b.record('p/m', s, 'failure', 30_000, undefined);
    await b.record('p/m', s, 'success', 10, p2);
    await b.record('p/m', s, 'success', 10, p3);
    expect(transitions).toEqual(['closed->open', 'open->half-open', 'half-open->closed']);
    // The batch they were in is written after the close: "closeAfter successes close it with a fresh window".
    await b.flush();
    expect(b.current('p/m').state).toBe('closed');
    expect(transitions).toEqual(['closed->open', 'open->half-open', 'half-open->closed']);
  });

  it('does not let a half-open probe\'s late success undo a reopen made in the millisecond the half-open spell began', async () => {
    const { b, transitions, advance } = board();
    for (let i = 0; i < 5; i++) await b.record('p/m', s, 'failure', 10, undefined);
    advance(31_000);
    await b.record('p/m', s, 'success', 10, await probe(b));
    // halfOpenProbes (3) go out at once; two are refused at once (a closed port answers within the millisecond).
    const [p2, p3, p4] = [await probe(b), await probe(b), await probe(b)];
    await b.record('p/m', s, 'failure', 1, p2);
    await b.record('p/m', s, 'failure', 1, p3);
    expect(b.current('p/m').state).toBe('open');
    const reopened = b.current('p/m');
    // The third one's answer comes later: a probe of the spell the reopen ended, not counted.
    advance(200);
    await b.record('p/m', s, 'success', 200, p4);
    expect(b.current('p/m')).toEqual(reopened);
    expect(transitions).toEqual(['closed->open', 'open->half-open', 'half-open->open']);
  });

  it('clamps a retry-after too long for a double to 24 h instead of dropping it for a lower header\'s hint', () => {
    const now = Date.UTC(2030, 0, 1);
    const huge = '9'.repeat(400);
    expect(parseWaitHint({ 'retry-after': huge }, now)).toEqual({ delayMs: MAX_WAIT_HINT_MS, source: 'retry-after', fleetWide: true });
    expect(parseWaitHint({ 'retry-after-ms': huge, 'x-ratelimit-reset-requests': '79m' }, now)).toEqual({ delayMs: MAX_WAIT_HINT_MS, source: 'retry-after-ms', fleetWide: true });
  });

  it('keeps the adaptive limit at or below maxConcurrent when minLimit is set above it', () => {
    const s2: LimitSettings = { max: 4, min: 10, decrease: 0.9, minShares: [0.5, 0.1] };
    let st = initialLimit(s2);
    st = onRateLimited(st, s2, 1_000, 100, { total: 4, byClass: [4, 0], waiting: 2 });
    expect(st.limit).toBeLessThanOrEqual(4);
    st = onRecovered(st, s2);
    expect(st.limit).toBeLessThanOrEqual(4);
    expect(classLimit(st, 0)).toBeLessThanOrEqual(4);
  });
});
