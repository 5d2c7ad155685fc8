// Tests written from a mutation run over src/policy/: each pins a behaviour that a wrong change to the policy code
// (a flipped comparison, a dropped guard) left the module's unit tests passing; some were caught only by the slow
// model fuzz or by an integration test, most by nothing at all. Pure functions, fixed clocks, fixed draws.
import { describe, expect, it } from 'vitest';
import { BreakerSchema } from '../src/config/schema.ts';
import { afterProbe, availableAtMs, opened, outranksFleet, settingsForModel, tripsOnConsecutive, tripsOnWindow } from '../src/policy/breaker.ts';
import { classLimit, initialLimit, onRateLimited, onSuccess, type LimitSettings, type LimitState } from '../src/policy/adaptive-limit.ts';
import { computeDeadline, longestBudgetMs } from '../src/policy/deadline.ts';
import { leavesUntil, waitPastHoldOff, waitsOutOwnHoldOff } from '../src/policy/hold-off-wait.ts';
import { accountStatusOfError, classify, isContextLengthMessage, mayHaveRun, namesError, OUTCOME_TABLE, type AttemptOutcome } from '../src/policy/outcome.ts';
import { parseWaitHint, retryInfoHint, type WaitHint } from '../src/policy/wait-hint.ts';
import { INITIAL_BREAKER, type BreakerRecord } from '../src/state/store.ts';

const breakerSettings = settingsForModel(BreakerSchema.parse({}), undefined);

describe('the breaker rules, at their edges', () => {
  const open = opened(INITIAL_BREAKER, breakerSettings, 0, () => 0);
  const half: BreakerRecord = { ...open, state: 'half-open', probeSuccesses: 1 };

  it('tells a held-back request the probe time while open, and now while probes may go', () => {
    expect(availableAtMs({ kind: 'open', probeAtMs: 30_000 }, 1_000)).toBe(30_000);
    expect(availableAtMs({ kind: 'probing', probes: 1 }, 1_000)).toBe(1_000);
  });

  it('trips only a closed breaker: a record another instance already opened or half-opened is not opened again', () => {
    // The board re-checks the rule on the fleet's freshest record inside its transition: there the state check is
    // what keeps a second instance from reopening (new openUntilMs, new generation) a breaker already open.
    const run = { failures: 100, sinceSuccessMs: Number.POSITIVE_INFINITY };
    expect(tripsOnConsecutive(INITIAL_BREAKER, run, breakerSettings)).toBe(true);
    expect(tripsOnConsecutive(open, run, breakerSettings)).toBe(false);
    expect(tripsOnConsecutive(half, run, breakerSettings)).toBe(false);
    const window = { requests: 100, failures: 100 };
    expect(tripsOnWindow(INITIAL_BREAKER, window, breakerSettings)).toBe(true);
    expect(tripsOnWindow(open, window, breakerSettings)).toBe(false);
    expect(tripsOnWindow(half, window, breakerSettings)).toBe(false);
  });

  it('lets the first probe after an open spell decide alone, whatever probe successes an open record carries', () => {
    // closeAfter is 3: two successes left in an open record (written by another release) must not make the first
    // probe's success close the breaker.
    const carried: BreakerRecord = { ...open, probeSuccesses: 2 };
    expect(afterProbe(carried, 'success', breakerSettings, 31_000, () => 0, carried.sinceMs)).toMatchObject({ state: 'half-open', probeSuccesses: 1 });
  });

  it('after Redis was away, lets the fleet\'s record stand when it began in the very millisecond ours opened', () => {
    const mine: BreakerRecord = { state: 'open', sinceMs: 50_000, openUntilMs: 80_000, probeSuccesses: 0, generation: 3 };
    const fleet: BreakerRecord = { state: 'closed', sinceMs: 50_000, openUntilMs: 0, probeSuccesses: 0, generation: 7 };
    expect(outranksFleet(mine, fleet, 60_000)).toBe(false);
    expect(outranksFleet(mine, { ...fleet, sinceMs: 49_999 }, 60_000)).toBe(true);
  });
});

describe('the deadline, at its edges', () => {
  it('keeps a configured margin of 0 as no margin, not as "use the default"', () => {
    expect(computeDeadline({ routeTimeoutMs: 5_000, marginMs: 0, headers: {} })).toEqual({ budgetMs: 5_000, timeoutMs: 5_000, source: 'route' });
  });

  it('never gives a request more than its own timeout when the margin would leave nothing', () => {
    // The sliver kept for a timeout the margin eats is at most 50 ms, and never longer than the timeout itself.
    expect(computeDeadline({ routeTimeoutMs: 120_000, marginMs: undefined, headers: { 'x-stormgate-timeout-ms': '10' } }).budgetMs).toBe(10);
    expect(computeDeadline({ routeTimeoutMs: 120_000, marginMs: undefined, headers: { 'x-stormgate-timeout-ms': '200' } }).budgetMs).toBe(50);
  });

  it('names the route as the source when a client timeout only equals it', () => {
    expect(computeDeadline({ routeTimeoutMs: 10_000, marginMs: 0, headers: { 'x-stormgate-timeout-ms': '10000' } }).source).toBe('route');
  });

  it('gives a path with no routes no time rather than a negative one', () => {
    expect(longestBudgetMs([], {})).toBe(0);
  });
});

describe('the hold-off waits, at their edges', () => {
  const hint = (delayMs: number): WaitHint => ({ delayMs, source: 'retry-after', fleetWide: true });

  it('moves a request on to the next target only for a pause of a second or more', () => {
    expect(leavesUntil(hint(999), 5_000)).toBeUndefined();
    expect(leavesUntil(hint(1_000), 5_000)).toBe(5_000);
    expect(leavesUntil(undefined, 5_000)).toBeUndefined();
    expect(leavesUntil(hint(5_000), undefined)).toBeUndefined();
  });

  it('has a request that left for its own hold-off wait the rest out itself only where it cannot park for it', () => {
    const park = { maxQueue: 10 };
    expect(waitsOutOwnHoldOff(false, 5_000, 0)).toBe(true);
    expect(waitsOutOwnHoldOff(park, 60_000, 0)).toBe(false);
    // park.maxWaitMs bounds the request's whole time parked, its last millisecond included.
    expect(waitsOutOwnHoldOff({ ...park, maxWaitMs: 5_000 }, 5_000, 0)).toBe(false);
    expect(waitsOutOwnHoldOff({ ...park, maxWaitMs: 5_000 }, 5_001, 0)).toBe(true);
    expect(waitsOutOwnHoldOff({ ...park, maxWaitMs: 5_000 }, 4_000, 1_001)).toBe(true);
  });

  it('keeps a retry\'s own wait when the hold-off ends exactly with it: no spread on top', () => {
    expect(waitPastHoldOff(1_500, 1_500, () => 0.5)).toBe(1_500);
  });
});

describe('the outcome table, at its edges', () => {
  const http = (status: number, errorCode: string | null = null): AttemptOutcome => ({ kind: 'http', status, errorCode, hint: undefined });

  it('reads a 1xx that ends an exchange as a bad gateway, retried under 502', () => {
    expect(classify(http(101))).toEqual({ cls: 'server-error', retryKey: 502, reason: 'status_101' });
  });

  it('gives the gateway running out of file descriptors its own class, which never blames the provider', () => {
    for (const code of ['EMFILE', 'ENFILE']) {
      expect(classify({ kind: 'network', code })).toEqual({ cls: 'local-resource', retryKey: 'network', reason: 'local_resource' });
    }
    expect(OUTCOME_TABLE['local-resource'].breaker).toBe('ignore');
  });

  it('names the deadline, not the client, as the reason of an attempt the deadline cut short', () => {
    expect(classify({ kind: 'aborted', by: 'deadline' }).reason).toBe('deadline');
    expect(classify({ kind: 'aborted', by: 'client' }).reason).toBe('client_abort');
  });

  it('cuts the adaptive limit on 429 and 529 only, and lets a fleet-wide hint on 429 or a 5xx hold the target off', () => {
    expect(OUTCOME_TABLE['rate-limited']).toMatchObject({ breaker: 'ignore', holdOff: true, limit: 'rate-limited' });
    expect(OUTCOME_TABLE.overloaded).toMatchObject({ breaker: 'failure', holdOff: true, limit: 'rate-limited' });
    expect(OUTCOME_TABLE['server-error']).toMatchObject({ breaker: 'failure', holdOff: true, limit: 'none' });
    const cutters = Object.entries(OUTCOME_TABLE).filter(([, row]) => row.limit === 'rate-limited').map(([cls]) => cls);
    expect(cutters.sort()).toEqual(['overloaded', 'rate-limited']);
  });

  it('knows a request the egress proxy refused, or could not carry, never reached the provider', () => {
    for (const code of ['PROXY_407', 'PROXY_CLOSED', 'PROXY_ECONNREFUSED', 'PROXY_ENOTFOUND']) {
      expect(mayHaveRun({ kind: 'network', code }), code).toBe(false);
    }
  });

  it('counts Cloudflare\'s 520 and 524 (the origin took the request) as may-have-run, and its 521 to 523 not', () => {
    expect([520, 521, 522, 523, 524].map((status) => mayHaveRun(http(status)))).toEqual([true, false, false, false, true]);
  });

  it('reads the account errors of an error event by code or by type', () => {
    expect(accountStatusOfError('insufficient_quota', undefined)).toBe(429);
    expect(accountStatusOfError(undefined, 'insufficient_quota')).toBe(429);
    expect(accountStatusOfError(undefined, 'billing_error')).toBe(402);
    expect(accountStatusOfError('invalid_api_key', undefined)).toBe(401);
    expect(accountStatusOfError(undefined, 'authentication_error')).toBe(401);
    expect(accountStatusOfError(undefined, 'permission_error')).toBe(403);
    expect(accountStatusOfError('rate_limit_exceeded', 'requests')).toBeUndefined();
  });

  it('takes a code as naming the error only when it is neither the status in digits nor the type said again', () => {
    expect(namesError('400', 'invalid_request_error')).toBe(false);
    expect(namesError('invalid_request_error', 'invalid_request_error')).toBe(false);
    expect(namesError('context_length_exceeded', 'invalid_request_error')).toBe(true);
  });

  it('reads a context-length message after leading white space, but not one quoted inside another message', () => {
    expect(isContextLengthMessage("\n  This model's maximum context length is 8192 tokens. However, you requested 9000 tokens.")).toBe(true);
    expect(isContextLengthMessage("Invalid value: \"This model's maximum context length is 8192 tokens\"")).toBe(false);
  });
});

describe('the wait hints, at their edges', () => {
  const now = Date.UTC(2015, 9, 21, 7, 28, 0);

  it('skips a retry-after-ms of 0 like a malformed one, for the next header or none', () => {
    expect(parseWaitHint({ 'retry-after-ms': '0' }, now)).toBeUndefined();
    expect(parseWaitHint({ 'retry-after-ms': '0', 'retry-after': '2' }, now)).toEqual({ delayMs: 2_000, source: 'retry-after', fleetWide: true });
  });

  it('rounds a fractional hint up, never down: waking early earns another 429', () => {
    expect(parseWaitHint({ 'retry-after-ms': '150.2' }, now)?.delayMs).toBe(151);
    expect(parseWaitHint({ 'x-ratelimit-reset-requests': '1.2ms' }, now)?.delayMs).toBe(2);
  });

  it('gives no hint from resets due right now', () => {
    expect(parseWaitHint({ 'x-ratelimit-reset-requests': '0s' }, now)).toBeUndefined();
    expect(parseWaitHint({ 'anthropic-ratelimit-requests-reset': new Date(now).toISOString() }, now)).toBeUndefined();
  });

  it('refuses an RFC 3339 offset past 23:59', () => {
    expect(parseWaitHint({ 'anthropic-ratelimit-requests-reset': '2015-10-22T07:28:05+24:00' }, now)).toBeUndefined();
    expect(parseWaitHint({ 'anthropic-ratelimit-requests-reset': '2015-10-21T08:28:05+00:60' }, now)).toBeUndefined();
    expect(parseWaitHint({ 'anthropic-ratelimit-requests-reset': '2015-10-21T08:28:05+01:00' }, now)?.delayMs).toBe(5_000);
  });

  it('reads Google\'s RetryInfo detail in seconds as this request\'s hint, and a zero as none', () => {
    const retryInfo = (retryDelay: string) => ({ details: [{ '@type': 'type.googleapis.com/google.rpc.ErrorInfo' }, { '@type': 'type.googleapis.com/google.rpc.RetryInfo', retryDelay }] });
    expect(retryInfoHint(retryInfo('29s'))).toEqual({ delayMs: 29_000, source: 'retry-info', fleetWide: false });
    expect(retryInfoHint(retryInfo('0.0015s'))?.delayMs).toBe(2);
    expect(retryInfoHint(retryInfo('0s'))).toBeUndefined();
    expect(retryInfoHint(retryInfo('29'))).toBeUndefined();
    expect(retryInfoHint({ details: 'none' })).toBeUndefined();
    expect(retryInfoHint(null)).toBeUndefined();
  });
});

describe('the adaptive limit, at its edges', () => {
  const settings: LimitSettings = { max: 100, min: 1, decrease: 0.9, minShares: [0.5, 0.1] };
  /** In flight at the limit: the limit binds, so 429s count (no clamp: nothing was seen above the floors). */
  const NONE = { total: 1_000, byClass: [0, 0] };

  it('ends a burst of rate-limit signals after exactly ten quiet round trips', () => {
    const st = onRateLimited(initialLimit(settings), settings, 0, 100, NONE);
    expect(st.burst).toBeDefined();
    expect(onSuccess(st, settings, 999, 100).burst).toBeDefined();
    expect(onSuccess(st, settings, 1_000, 100).burst).toBeUndefined();
  });

  it('judges refusals noise at the mean of the burst\'s shares, not at its last one', () => {
    // A burst whose worst round trip refused 3 in 10 under a limit of 60; the next, sent under 30 (half), refuses 2 in
    // 10: cutting did not make them fewer as it would have had they been about our concurrency.
    const st: LimitState = {
      ...initialLimit(settings), limit: 30, caps: [30, 30], lastDecreaseAtMs: 0, lastSignalAtMs: 50,
      burst: { fromLimit: 60, fromCaps: [60, 60], peakShare: 0.3, peakLimit: 60, shareSum: 0.3, windows: 1 },
      tally: { ok: 8, refused: 1, limit: 30, fromMs: 0 },
    };
    const judged = onRateLimited(st, settings, 100, 100, { total: 30, byClass: [30, 0] });
    expect(judged.noiseShare).toBeCloseTo(0.25, 9);
    expect(judged.slowStartTo).toBe(60);
  });

  it('never judges noise a share under one in ten that halving the limit merely halved', () => {
    // The burst's worst round trip refused 1 in 10 under 60; under 30, 1 in 20: fewer, as our concurrency's would be.
    const st: LimitState = {
      ...initialLimit(settings), limit: 30, caps: [30, 30], lastDecreaseAtMs: 0, lastSignalAtMs: 50,
      burst: { fromLimit: 60, fromCaps: [60, 60], peakShare: 0.1, peakLimit: 60, shareSum: 0.1, windows: 1 },
      tally: { ok: 19, refused: 0, limit: 30, fromMs: 0 },
    };
    expect(onRateLimited(st, settings, 100, 100, { total: 30, byClass: [30, 0] }).noiseShare).toBeUndefined();
    // 2 in 20 is as many as before: noise.
    expect(onRateLimited({ ...st, tally: { ok: 18, refused: 1, limit: 30, fromMs: 0 } }, settings, 100, 100, { total: 30, byClass: [30, 0] }).noiseShare).toBeCloseTo(0.1, 9);
  });

  it('takes a 429 as about our concurrency from nine tenths of the limit in flight, and not below', () => {
    const st = initialLimit(settings);
    expect(onRateLimited(st, settings, 0, 100, { total: 89, byClass: [89, 0] })).toBe(st);
    expect(onRateLimited(st, settings, 0, 100, { total: 90, byClass: [90, 0] }).limit).toBeLessThan(90);
  });

  it('takes a 429 as about our concurrency when a class is at its cap, however few the rest have in flight', () => {
    const st: LimitState = { ...initialLimit(settings), caps: [100, 10] };
    expect(onRateLimited(st, settings, 0, 100, { total: 9, byClass: [0, 9] })).not.toBe(st);
    expect(onRateLimited(st, settings, 0, 100, { total: 8, byClass: [0, 8] })).toBe(st);
  });

  it('clamps nothing to what was in flight when nothing was (a 429 while requests wait for a slot)', () => {
    const st = onRateLimited(initialLimit(settings), settings, 0, 100, { total: 0, byClass: [0, 0], waiting: 3 });
    // The once-per-round-trip cut, batch first: the limit online lives under is untouched.
    expect(st.limit).toBe(100);
    expect(classLimit(st, 1)).toBe(90);
  });

  it('slow-starts back to half the burst\'s start only once a round trip has passed without a signal', () => {
    // A 429 with 20 in flight: clamped to 19, and half of where the burst began (50) noted to slow-start back to.
    const st = onRateLimited(initialLimit(settings), settings, 1_000, 100, { total: 20, byClass: [20, 0], waiting: 5 });
    expect(st.limit).toBe(19);
    expect(onSuccess(st, settings, 1_099, 100).limit).toBe(19);
    expect(onSuccess(st, settings, 1_100, 100)).toMatchObject({ limit: 20, slowStartTo: 50 });
  });

  it('keeps slow-starting to the higher target when a burst ends during a slow start after an outage', () => {
    const st: LimitState = { ...initialLimit(settings), limit: 20, caps: [20, 20], slowStartTo: 80, recoverTo: 30, lastSignalAtMs: 0 };
    expect(onSuccess(st, settings, 1_000, 100)).toMatchObject({ limit: 21, slowStartTo: 80 });
  });

  it('grows at least 1/limit per success, and at most one slot, whatever the slot hold and the round trip say', () => {
    const cut: LimitState = { ...initialLimit(settings), limit: 50, caps: [50, 50] };
    // A slot given back before its round trip's answer came (holdMs < roundTripMs): still 1/limit.
    expect(onSuccess(cut, settings, 1e9, 1_000, 500).limit).toBeCloseTo(50.02, 9);
    // A 30 s stream over a 100 ms round trip is 300 round trips: one slot, not six.
    expect(onSuccess(cut, settings, 1e9, 100, 30_000).limit).toBe(51);
  });

  it('reads rate-limit signals again once refusals all but stop (under a third of their usual share)', () => {
    const noisy: LimitState = { ...initialLimit(settings), noiseShare: 0.3, tally: { ok: 39, refused: 0, limit: 100, fromMs: 0 } };
    // Forty answers over two round trips, none refused.
    expect(onSuccess(noisy, settings, 200, 100).noiseShare).toBeUndefined();
    // Refused at about the usual share: still noise.
    expect(onSuccess({ ...noisy, tally: { ok: 27, refused: 12, limit: 100, fromMs: 0 } }, settings, 200, 100).noiseShare).toBe(0.3);
  });

  it('cuts a class\'s cap from what it may use under the limit, when its cap was left above a limit cut since', () => {
    // The noise judgment gives the classes back the caps the burst began with while the limit slow-starts back: a cap
    // above the limit. The next cut starts from the limit (29 x 0.9), not from the cap (60 x 0.9, above the limit).
    const st: LimitState = { ...initialLimit(settings), limit: 29, caps: [60, 60] };
    expect(classLimit(onRateLimited(st, settings, 0, 100, NONE), 1)).toBe(26);
  });
});
