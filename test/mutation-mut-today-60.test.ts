// Hand mutation testing of the pools (src/pools/*.ts), the retry budgets (state/retry-budget.ts, state/redis-budget.ts)
// and the wait policies (policy/wait-hint.ts, backoff.ts, retry-wait.ts, deadline.ts, adaptive-limit.ts).
// 38 hand mutants: 32 killed by the existing files, 5 killed here, 1 equivalent, 0 open. No bug in the code.
// Killed here: the clock-skew tolerance and the day's bound on the upstream's Date, each at its edge (> read as >=,
// <= as <); the caps growing back lowest class first; the noise judgment without "the share stayed at least half
// the worst"; the default maxConcurrentRetries rounded up instead of down.
// Equivalent: RedisBudget.flush dropping, while Redis is away, a held count exactly MAX_WINDOW_S old (< for <=): the
// budget script's window (WINDOW_LUA) counts only seconds after sec - windowS, so no window ever counted it.
// Pure functions on fixed clocks; the pools built from a parsed config.
import { describe, expect, it } from 'vitest';
import { ConfigSchema } from '../src/config/schema.ts';
import { classLimit, initialLimit, onRateLimited, onSuccess, type LimitSettings, type LimitState } from '../src/policy/adaptive-limit.ts';
import { MAX_WAIT_HINT_MS, parseWaitHint } from '../src/policy/wait-hint.ts';
import { Pools } from '../src/pools/pools.ts';
import { defaultConfig } from './helpers/stack.ts';

describe("the upstream's Date against the gateway's clock, at the edges", () => {
  const now = Date.UTC(2025, 5, 2, 12, 0, 0); // a whole second, as a Date header names one
  const httpDate = (ms: number) => new Date(ms).toUTCString();
  const day = 24 * 60 * 60 * 1000;

  it("keeps the gateway's clock at exactly 2 s apart, and reads the upstream's from just beyond", () => {
    // The retry-after names 4 s after the gateway's now: within the tolerance, measured from the gateway's clock.
    expect(parseWaitHint({ date: httpDate(now + 2_000), 'retry-after': httpDate(now + 4_000) }, now)?.delayMs).toBe(4000);
    expect(parseWaitHint({ date: httpDate(now - 2_000), 'retry-after': httpDate(now + 4_000) }, now)?.delayMs).toBe(4000);
    // A millisecond further apart, the clocks disagree: 2 s after the upstream's own now.
    expect(parseWaitHint({ date: httpDate(now + 2_000), 'retry-after': httpDate(now + 4_000) }, now - 1)?.delayMs).toBe(2000);
  });

  it("reads a Date exactly a day off as the upstream's clock, and one a second further as no clock", () => {
    const aDayAhead = { date: httpDate(now + day), 'retry-after': httpDate(now + day + 2_000) };
    expect(parseWaitHint(aDayAhead, now)).toEqual({ delayMs: 2000, source: 'retry-after', fleetWide: true });
    // Beyond a day: the gateway's clock, by which the date is a day away (clamped to the longest hint).
    expect(parseWaitHint(aDayAhead, now - 1_000)?.delayMs).toBe(MAX_WAIT_HINT_MS);
  });
});

describe('the adaptive limit with three classes', () => {
  it("grows the caps back top class first: the middle class's before batch's", () => {
    // online, standard, batch; both lower caps cut to 4 under a limit of 10, long after the last 429.
    const s: LimitSettings = { max: 10, min: 1, decrease: 0.5, minShares: [0, 0.1, 0.1] };
    let st: LimitState = { ...initialLimit(s), caps: [10, 4, 4] };
    for (let i = 0; i < 5; i++) st = onSuccess(st, s, 10_000 + i, 100);
    // One slot per round trip (1/cap per success): five successes give standard a fifth slot, and batch's cap waits.
    expect(classLimit(st, 1)).toBe(5);
    expect(st.caps[2]).toBe(4);
  });
});

describe("the adaptive limit's judgment that refusals are noise", () => {
  const settings: LimitSettings = { max: 100, min: 1, decrease: 0.9, minShares: [0.5, 0.1] };
  /** A burst whose worst round trip refused half of what was sent under 60; the limit now 30 (half), and `tally` since. */
  const underHalf = (ok: number, refused: number): LimitState => ({
    ...initialLimit(settings), limit: 30, caps: [30, 30], lastDecreaseAtMs: 0, lastSignalAtMs: 50,
    burst: { fromLimit: 60, fromCaps: [60, 60], peakShare: 0.5, peakLimit: 60, shareSum: 0.5, windows: 1 },
    tally: { ok, refused, limit: 30, fromMs: 0 },
  });
  const inFlight = { total: 30, byClass: [30, 0] };

  it('is not made when the refused share fell below half the worst under half the limit: cutting helped', () => {
    // 2 in 11 after half in the worst round trip: more than a provider taking 30 would refuse (none), but the cut did
    // make them far fewer, so they are about our concurrency and the cuts go on.
    const judged = onRateLimited(underHalf(9, 1), settings, 100, 100, inFlight);
    expect(judged.noiseShare).toBeUndefined();
    expect(judged.slowStartTo).toBeUndefined();
    expect(classLimit(judged, 1)).toBeLessThan(29);
  });

  it('is made when the share stayed at half the worst or more', () => {
    // 4 in 10 after 5 in 10: cutting the limit in half barely changed them.
    const judged = onRateLimited(underHalf(6, 3), settings, 100, 100, inFlight);
    expect(judged.noiseShare).toBeCloseTo(0.45, 9);
    expect(judged.slowStartTo).toBe(60);
  });
});

describe('the pools built from the config', () => {
  const pools = (maxConcurrent: number) =>
    new Pools(ConfigSchema.parse(defaultConfig('http://127.0.0.1:1', { provider: { pools: { maxConcurrent } } })), () => 0);

  it('allow a fifth of maxConcurrent in retries rounded down, never more than a fifth, and at least one', () => {
    expect(pools(14).of('mock').settings.retryCapacity).toBe(2);
    expect(pools(9).of('mock').settings.retryCapacity).toBe(1);
    expect(pools(4).of('mock').settings.retryCapacity).toBe(1);
  });
});
