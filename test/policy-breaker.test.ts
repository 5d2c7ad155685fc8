// The breaker's state machine and the board that runs it over a state store, with a fake clock.
import { describe, expect, it } from 'vitest';
import { BreakerSchema } from '../src/config/schema.ts';
import { abortedVerdict, afterProbe, availability, changesState, CONSECUTIVE_QUIET_MS, LONG_RUN_FACTOR, opened, outranksFleet, settingsForModel, tripsOnConsecutive, tripsOnWindow } from '../src/policy/breaker.ts';
import { BreakerBoard } from '../src/state/breaker-board.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import { INITIAL_BREAKER, type BreakerRecord } from '../src/state/store.ts';

const cfg = BreakerSchema.parse({ models: { 'gpt-4o': { openS: 60 } } });
const s = settingsForModel(cfg, undefined);
const closed: BreakerRecord = INITIAL_BREAKER;

describe('the breaker state machine', () => {
  it('opens on a 50% failure rate once the window holds minRequests', () => {
    expect(tripsOnWindow(closed, { requests: 19, failures: 19 }, s)).toBe(false);
    expect(tripsOnWindow(closed, { requests: 20, failures: 9 }, s)).toBe(false);
    expect(tripsOnWindow(closed, { requests: 20, failures: 10 }, s)).toBe(true);
  });

  it('opens at once on consecutiveFailures failures in a row, once no success has come for CONSECUTIVE_QUIET_MS', () => {
    const long = Number.POSITIVE_INFINITY;
    expect(tripsOnConsecutive(closed, { failures: 4, sinceSuccessMs: long }, s)).toBe(false);
    expect(tripsOnConsecutive(closed, { failures: 5, sinceSuccessMs: long }, s)).toBe(true);
    // A run among many requests that keep succeeding (a provider failing a share of them) is not an outage.
    expect(tripsOnConsecutive(closed, { failures: 5, sinceSuccessMs: CONSECUTIVE_QUIET_MS - 1 }, s)).toBe(false);
    expect(tripsOnConsecutive(closed, { failures: 5, sinceSuccessMs: CONSECUTIVE_QUIET_MS }, s)).toBe(true);
    // A run four times as long is an outage at any rate: no need to wait for the quiet period.
    expect(tripsOnConsecutive(closed, { failures: LONG_RUN_FACTOR * 5 - 1, sinceSuccessMs: 10 }, s)).toBe(false);
    expect(tripsOnConsecutive(closed, { failures: LONG_RUN_FACTOR * 5, sinceSuccessMs: 10 }, s)).toBe(true);
  });

  it('stays open for openS plus up to 10% jitter, and a new generation starts', () => {
    expect(opened(closed, s, 1_000, () => 0)).toEqual({ state: 'open', sinceMs: 1_000, openUntilMs: 31_000, probeSuccesses: 0, generation: 1 });
    expect(opened(closed, s, 1_000, () => 0.999).openUntilMs).toBe(33_997);
  });

  it('probes after openS, or every probeWhileParkedMs while requests are parked', () => {
    const open = opened(closed, s, 0, () => 0);
    expect(availability(open, s, 29_999, false)).toEqual({ kind: 'open', probeAtMs: 30_000 });
    expect(availability(open, s, 30_000, false)).toEqual({ kind: 'probing', probes: 1 });
    expect(availability(open, s, 500, true)).toEqual({ kind: 'open', probeAtMs: 1_000 });
    expect(availability(open, s, 1_000, true)).toEqual({ kind: 'probing', probes: 1 });
    expect(availability({ ...open, state: 'half-open' }, s, 1_000, true)).toEqual({ kind: 'probing', probes: 3 });
  });

  it('doubles the wait for parked requests with each failed probe, up to probeWhileParkedMaxMs and openS, and starts over once closed', () => {
    // A lone request parked through a two-minute outage: probes at 1, 3, 7 s, then every probeWhileParkedMaxMs (5 s).
    let rec = opened(closed, s, 0, () => 0);
    const probes: number[] = [];
    for (let now = 0; now <= 120_000; now += 100) {
      if (availability(rec, s, now, true).kind !== 'probing') continue;
      probes.push(now);
      rec = afterProbe(rec, 'failure', s, now, () => 0, rec.sinceMs)!;
    }
    expect(probes.slice(0, 6)).toEqual([1_000, 3_000, 7_000, 12_000, 17_000, 22_000]);
    expect(probes).toHaveLength(25);
    expect(rec.failedProbes).toBe(25);
    // A cap above openS: the breaker's own open time bounds the wait.
    const slow = { ...s, probeWhileParkedMaxMs: 60_000 };
    let r2 = opened(closed, slow, 0, () => 0);
    for (let i = 0; i < 6; i++) r2 = afterProbe(r2, 'failure', slow, r2.sinceMs + 100_000, () => 0, r2.sinceMs)!;
    expect(availability(r2, slow, r2.sinceMs + 29_999, true).kind).toBe('open');
    expect(availability(r2, slow, r2.sinceMs + 30_000, true).kind).toBe('probing');
    // A probe that succeeds after the outage: half-open keeps the count (a failure there doubles again), closing ends it.
    rec = afterProbe(rec, 'success', s, 121_000, () => 0, rec.sinceMs)!;
    expect(rec).toMatchObject({ state: 'half-open', failedProbes: 25 });
    for (let i = 0; i < 2; i++) rec = afterProbe(rec, 'success', s, 121_100, () => 0, rec.sinceMs)!;
    expect(rec.state).toBe('closed');
    const reopened = opened(rec, s, 200_000, () => 0);
    expect(reopened.failedProbes).toBeUndefined();
    expect(availability(reopened, s, 201_000, true)).toEqual({ kind: 'probing', probes: 1 });
  });

  it('closes after closeAfter probe successes with a fresh window; the first probe\'s failure reopens it alone', () => {
    const open = opened(closed, s, 0, () => 0);
    expect(afterProbe(open, 'failure', s, 31_000, () => 0, open.sinceMs)).toMatchObject({ state: 'open', sinceMs: 31_000, openUntilMs: 61_000, failedProbes: 1 });
    let rec = afterProbe(open, 'success', s, 31_000, () => 0, open.sinceMs)!;
    expect(rec).toMatchObject({ state: 'half-open', sinceMs: 31_000, probeSuccesses: 1 });
    rec = afterProbe(rec, 'success', s, 31_100, () => 0, rec.sinceMs)!;
    expect(rec).toMatchObject({ state: 'half-open', sinceMs: 31_000, probeSuccesses: 2 });
    const closedAgain = afterProbe(rec, 'success', s, 31_300, () => 0, rec.sinceMs)!;
    expect(closedAgain).toMatchObject({ state: 'closed', probeSuccesses: 0 });
    expect(closedAgain.probeFailures).toBeUndefined();
    expect(closedAgain.generation).toBeGreaterThan(rec.generation);
  });

  it('judges the half-open probes together: once closeAfter have answered, a failure share of failureRate reopens it', () => {
    const half = afterProbe(opened(closed, s, 0, () => 0), 'success', s, 31_000, () => 0, 0)!;
    const step = (rec: BreakerRecord, v: 'success' | 'failure', at: number) => afterProbe(rec, v, s, at, () => 0, rec.sinceMs)!;
    // One failure among the first probes: a provider with a few errors left is not sent back for another openS.
    let rec = step(half, 'failure', 31_100);
    expect(rec).toMatchObject({ state: 'half-open', probeSuccesses: 1, probeFailures: 1 });
    rec = step(rec, 'success', 31_200);
    expect(rec).toMatchObject({ state: 'half-open', probeSuccesses: 2, probeFailures: 1 });
    const closedAgain = step(rec, 'success', 31_300);
    expect(closedAgain).toMatchObject({ state: 'closed' });
    expect(closedAgain.probeFailures).toBeUndefined();
    // Two of three failed (0.67 >= failureRate 0.5): reopened, and the reopen counts as one more failed probe.
    const reopened = step(step(half, 'failure', 31_100), 'failure', 31_200);
    expect(reopened).toMatchObject({ state: 'open', sinceMs: 31_200, openUntilMs: 61_200, failedProbes: 1 });
    expect(reopened.probeFailures).toBeUndefined();
    // A failure share under failureRate, but closeAfter failures: reopened all the same (failureRate 1 never ends).
    const lenient = { ...s, failureRate: 1 };
    let r2 = afterProbe(opened(closed, lenient, 0, () => 0), 'success', lenient, 31_000, () => 0, 0)!;
    for (let i = 0; i < 2; i++) r2 = afterProbe(r2, 'failure', lenient, 31_100 + i, () => 0, r2.sinceMs)!;
    expect(r2.state).toBe('half-open');
    expect(afterProbe(r2, 'failure', lenient, 31_200, () => 0, r2.sinceMs)).toMatchObject({ state: 'open' });
  });

  it('lets the first probe decide alone whatever half-open counts an open record carries (another release wrote it)', () => {
    // An open record with a half-open spell's counts left in it (an instance of the release before reopened the breaker
    // and left probeFailures in the Redis hash): its first probe's success half-opens, it does not reopen on them.
    const open: BreakerRecord = { ...opened(closed, s, 0, () => 0), probeFailures: 2 };
    const half = afterProbe(open, 'success', s, 31_000, () => 0, open.sinceMs);
    expect(half).toMatchObject({ state: 'half-open', probeSuccesses: 1 });
    expect(half!.probeFailures).toBeUndefined();
  });

  it('finds a provider back with a 20% error rate in one round far more often than one failure reopening it did', () => {
    // Seeded outcomes, one in five failing: the share of rounds that close the breaker (the first probe included).
    let seed = 7;
    const draw = () => ((seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31) / 2 ** 31 < 0.2 ? 'failure' : 'success');
    let closes = 0;
    const rounds = 2_000;
    for (let i = 0; i < rounds; i++) {
      let rec: BreakerRecord = opened(closed, s, 0, () => 0);
      while (rec.state !== 'closed' && !(rec.state === 'open' && rec.sinceMs > 0)) rec = afterProbe(rec, draw(), s, 31_000, () => 0, rec.sinceMs) ?? rec;
      if (rec.state === 'closed') closes++;
    }
    // 0.8 x (0.8 x 0.96 + 0.2 x 0.64) = 0.72 (a second failure among four probes reopens); one failure reopening: 0.8^3 = 0.51.
    expect(closes / rounds).toBeGreaterThan(0.67);
    expect(closes / rounds).toBeLessThan(0.77);
  });

  it('ignores a probe result from before the breaker last reopened or half-opened, so a late answer does not undo the reopen', () => {
    const open = opened(closed, s, 0, () => 0);
    const half = afterProbe(open, 'success', s, 31_000, () => 0, open.sinceMs)!;
    // Probes out in the half-open spell: two fail (reopened), another's success comes after.
    const reopened = afterProbe(afterProbe(half, 'failure', s, 31_200, () => 0, half.sinceMs)!, 'failure', s, 31_200, () => 0, half.sinceMs)!;
    expect(reopened.state).toBe('open');
    expect(afterProbe(reopened, 'success', s, 31_230, () => 0, half.sinceMs)).toBeUndefined();
    // A probe taken in this open spell counts as before; a straggler of the old half-open spell does not count in the new one.
    const halfAgain = afterProbe(reopened, 'success', s, 61_300, () => 0, reopened.sinceMs)!;
    expect(halfAgain).toMatchObject({ state: 'half-open', probeSuccesses: 1 });
    expect(afterProbe(halfAgain, 'failure', s, 61_400, () => 0, half.sinceMs)).toBeUndefined();
  });

  it('counts the half-open spell\'s probes failing together as one failed probe: the others came from the spell it ended', () => {
    // halfOpenProbes (3) probes out together after a success; the provider is down again and all three fail.
    const open = opened(closed, s, 0, () => 0);
    const half = afterProbe(open, 'success', s, 1_000, () => 0, open.sinceMs)!;
    let rec = half;
    for (const at of [1_200, 1_200, 1_210]) rec = afterProbe(rec, 'failure', s, at, () => 0, half.sinceMs) ?? rec;
    expect(rec).toMatchObject({ state: 'open', sinceMs: 1_200, failedProbes: 1 });
    // The README's schedule: the next probe for parked requests 2 s after this reopening, not 8 s after the last answer.
    expect(availability(rec, s, 3_200, true)).toEqual({ kind: 'probing', probes: 1 });
  });

  it('counts an attempt cut short by the client as a failure only past slowCallMs', () => {
    expect(abortedVerdict(4_999, s)).toBe('ignore');
    expect(abortedVerdict(5_001, s)).toBe('failure');
  });

  it('tells a state change from a record that keeps the state (a probe that leaves it open or half-open)', () => {
    const open = opened(closed, s, 0, () => 0);
    const half = afterProbe(open, 'success', s, 31_000, () => 0, 0)!;
    const oneFailed = afterProbe(half, 'failure', s, 31_100, () => 0, half.sinceMs)!;
    expect(changesState(closed, open)).toBe(true);
    expect(changesState(open, half)).toBe(true);
    expect(changesState(half, afterProbe(half, 'success', s, 31_100, () => 0, half.sinceMs)!)).toBe(false);
    expect(changesState(half, oneFailed)).toBe(false);
    expect(changesState(open, afterProbe(open, 'failure', s, 31_000, () => 0, 0)!)).toBe(false);
    expect(changesState(oneFailed, afterProbe(oneFailed, 'failure', s, 31_200, () => 0, half.sinceMs)!)).toBe(true);
  });

  it('after Redis was away, lets a breaker opened alone and still open outrank only an older record that is not open', () => {
    const mine: BreakerRecord = { state: 'open', sinceMs: 50_000, openUntilMs: 80_000, probeSuccesses: 0, generation: 3 };
    const closedBefore: BreakerRecord = { state: 'closed', sinceMs: 40_000, openUntilMs: 0, probeSuccesses: 0, generation: 7 };
    expect(outranksFleet(mine, closedBefore, 60_000)).toBe(true);
    expect(outranksFleet(mine, { ...closedBefore, state: 'half-open', probeSuccesses: 1 }, 60_000)).toBe(true);
    expect(outranksFleet(mine, INITIAL_BREAKER, 60_000)).toBe(true);
    // The fleet closed it after we opened it; ours has run its time; the fleet holds it open already; ours is not open.
    expect(outranksFleet(mine, { ...closedBefore, sinceMs: 55_000 }, 60_000)).toBe(false);
    expect(outranksFleet(mine, closedBefore, 80_000)).toBe(false);
    expect(outranksFleet(mine, { ...closedBefore, state: 'open', openUntilMs: 70_000 }, 60_000)).toBe(false);
    expect(outranksFleet({ ...mine, state: 'half-open' }, closedBefore, 60_000)).toBe(false);
  });

  it('applies per-model overrides', () => {
    expect(settingsForModel(cfg, 'gpt-4o').openS).toBe(60);
    expect(settingsForModel(cfg, 'gpt-4.1').openS).toBe(30);
  });
});

describe('the breaker board over a store', () => {
  function board() {
    let now = 10_000;
    const store = new MemoryStore();
    const transitions: string[] = [];
    const b = new BreakerBoard({ store, now: () => now, random: () => 0, onTransition: (t, from, to) => transitions.push(`${t}:${from.state}->${to.state}`) });
    return { b, store, transitions, advance: (ms: number) => (now += ms), now: () => now };
  }

  it('opens the breaker on the fifth failure in a row and refuses attempts until the probe time', async () => {
    const { b, transitions, advance } = board();
    for (let i = 0; i < 4; i++) b.record('p/m', s, 'failure', 10, undefined);
    expect((await b.admit('p/m', s, false, 1_000)).admitted).toBe(true);
    b.record('p/m', s, 'failure', 10, undefined);
    await Promise.resolve();
    expect(transitions).toEqual(['p/m:closed->open']);
    expect(await b.admit('p/m', s, false, 1_000)).toEqual({ admitted: false, availableAtMs: 40_000 });
    advance(30_000);
    const probe = await b.admit('p/m', s, false, 1_000);
    expect(probe.admitted && probe.probe).toBeTruthy();
  });

  it('starts the parked wait again, doubled, after a probe its request\'s deadline cut short, instead of probing again at once', async () => {
    const { b, transitions, advance } = board();
    for (let i = 0; i < 5; i++) await b.record('p/m', s, 'failure', 10, undefined);
    advance(1_000);
    const probe = await b.admit('p/m', s, true, 1_000);
    expect(probe.admitted && probe.probe).toBeTruthy();
    // The provider hangs; the request that carried the probe reaches its deadline 900 ms later: no verdict.
    advance(900);
    await b.record('p/m', s, 'slow-call', 900, probe.admitted ? probe.probe : undefined);
    expect(transitions).toEqual(['p/m:closed->open']);
    // The next parked probe waits again (it was due at once before), twice as long as after a failed probe; the breaker
    // itself is as it was (no reopen: its open time is unchanged).
    expect(b.availability('p/m', s, true)).toEqual({ kind: 'open', probeAtMs: 13_900 });
    expect(b.current('p/m')).toMatchObject({ state: 'open', failedProbes: 1, openUntilMs: 40_000 });
    advance(2_000);
    expect(b.availability('p/m', s, true).kind).toBe('probing');
    // Past openS, where any newcomer may probe: one cut short holds the next off as long, not a probe a second.
    advance(30_000);
    const late = await b.admit('p/m', s, false, 1_000);
    expect(late.admitted && late.probe).toBeTruthy();
    advance(900);
    await b.record('p/m', s, 'slow-call', 900, late.admitted ? late.probe : undefined);
    expect(b.availability('p/m', s, false)).toEqual({ kind: 'open', probeAtMs: 44_800 + 4_000 });
  });

  it('forgets the run of failures of a target key given back', async () => {
    const { b, transitions } = board();
    for (let i = 0; i < 4; i++) b.record('p/m', s, 'failure', 10, undefined);
    b.forget('p/m');
    b.record('p/m', s, 'failure', 10, undefined);
    await Promise.resolve();
    expect(transitions).toEqual([]);
  });

  it('a success resets the run of failures', async () => {
    const { b, transitions } = board();
    for (let i = 0; i < 4; i++) b.record('p/m', s, 'failure', 10, undefined);
    b.record('p/m', s, 'success', 10, undefined);
    for (let i = 0; i < 4; i++) b.record('p/m', s, 'failure', 10, undefined);
    await b.flush();
    expect(transitions).toEqual([]);
  });

  it('does not open on runs of failures among successes that keep coming: a provider failing a share of requests', async () => {
    const { b, transitions, advance } = board();
    // 300 requests a second, 30% failing: runs of fourteen successes, then six failures (more than
    // consecutiveFailures). Retries serve nearly all of them, and the failure rate (30%) is under failureRate.
    for (let i = 0; i < 600; i++) {
      await b.record('p/m', s, i % 20 < 14 ? 'success' : 'failure', 10, undefined);
      advance(3);
    }
    await b.flush();
    expect(transitions).toEqual([]);
    // The provider goes down: the run that began after its last success opens the breaker.
    let failures = 0;
    while (transitions.length === 0 && failures < 1_000) {
      advance(3);
      await b.record('p/m', s, 'failure', 10, undefined);
      failures++;
    }
    expect(transitions).toEqual(['p/m:closed->open']);
    // At 300 requests a second the run reaches LONG_RUN_FACTOR x consecutiveFailures (its first six came before the
    // loop) before CONSECUTIVE_QUIET_MS passes.
    expect(failures).toBe(LONG_RUN_FACTOR * 5 - 6);
  });

  it('at a few requests a second, opens on a run of consecutiveFailures once CONSECUTIVE_QUIET_MS has passed without a success', async () => {
    const { b, transitions, advance } = board();
    await b.record('p/m', s, 'success', 10, undefined);
    for (let i = 0; i < 5; i++) {
      advance(40);
      await b.record('p/m', s, 'failure', 10, undefined);
    }
    // Five failures in 200 ms: not yet a quarter second without a success.
    expect(transitions).toEqual([]);
    advance(50);
    await b.record('p/m', s, 'failure', 10, undefined);
    expect(transitions).toEqual(['p/m:closed->open']);
  });

  it('at start-up and after an idle spell, does not open on a burst\'s fast errors while attempts sent before them are still out', async () => {
    const { b, transitions, advance } = board();
    // A fresh instance, a burst of 30 against a provider failing a third of requests: its 503s come in 2 ms, the
    // answers of the attempts sent before them seconds later. A last success at -Infinity made the first five a trip.
    for (let i = 0; i < 10; i++) await b.record('p/m', s, 'failure', 2, undefined, undefined, true);
    advance(2_000);
    for (let i = 0; i < 20; i++) await b.record('p/m', s, 'success', 2_000, undefined, undefined, i < 19);
    // A minute idle, then the same burst: the success a minute ago is no quiet period either.
    advance(60_000);
    for (let i = 0; i < 10; i++) await b.record('p/m', s, 'failure', 2, undefined, undefined, true);
    advance(2_000);
    await b.record('p/m', s, 'success', 2_000, undefined, undefined, true);
    await b.flush();
    expect(transitions).toEqual([]);
  });

  it('opens on the failure with no older attempt still out, as before; a run of LONG_RUN_FACTOR x consecutiveFailures whatever is out', async () => {
    const { b, transitions } = board();
    // A provider down from the start: a burst's failures, the attempts sent before each still out, then the last one.
    for (let i = 0; i < 6; i++) await b.record('p/m', s, 'failure', 2, undefined, undefined, true);
    expect(transitions).toEqual([]);
    await b.record('p/m', s, 'failure', 2, undefined, undefined, false);
    expect(transitions).toEqual(['p/m:closed->open']);
    // Older attempts hanging while newer ones fail fast: the long run opens it.
    const other = board();
    for (let i = 0; i < LONG_RUN_FACTOR * 5 - 1; i++) await other.b.record('p/m', s, 'failure', 2, undefined, undefined, true);
    expect(other.transitions).toEqual([]);
    await other.b.record('p/m', s, 'failure', 2, undefined, undefined, true);
    expect(other.transitions).toEqual(['p/m:closed->open']);
  });

  it('opens on the failure rate over the window when failures are not consecutive', async () => {
    const { b, transitions } = board();
    for (let i = 0; i < 20; i++) b.record('p/m', s, i % 2 === 0 ? 'failure' : 'success', 10, undefined);
    await b.flush();
    expect(transitions).toEqual(['p/m:closed->open']);
  });

  it('sends one probe after an outage, then at most halfOpenProbes, and closes after closeAfter successes', async () => {
    const { b, transitions, advance } = board();
    for (let i = 0; i < 5; i++) await b.record('p/m', s, 'failure', 10, undefined);
    advance(31_000);
    const first = await Promise.all([1, 2].map(() => b.admit('p/m', s, false, 5_000)));
    expect(first.filter((p) => p.admitted)).toHaveLength(1);
    const probe = first.find((p) => p.admitted)!;
    await b.record('p/m', s, 'success', 10, probe.admitted ? probe.probe : undefined);
    const next = await Promise.all([1, 2, 3, 4].map(() => b.admit('p/m', s, false, 5_000)));
    expect(next.filter((p) => p.admitted)).toHaveLength(3);
    for (const p of next) if (p.admitted) await b.record('p/m', s, 'success', 10, p.probe);
    // The second success keeps it half-open: a new record, not a transition (counted and logged once per change).
    expect(transitions).toEqual(['p/m:closed->open', 'p/m:open->half-open', 'p/m:half-open->closed']);
    expect((await b.admit('p/m', s, false, 1_000)).admitted).toBe(true);
  });

  it('keeps a breaker open after a failed probe with a new probe time, and reports no open->open transition', async () => {
    const { b, store, transitions, advance } = board();
    for (let i = 0; i < 5; i++) await b.record('p/m', s, 'failure', 10, undefined);
    for (let cycle = 0; cycle < 3; cycle++) {
      advance(31_000);
      const probe = await b.admit('p/m', s, false, 5_000);
      expect(probe.admitted).toBe(true);
      await b.record('p/m', s, 'failure', 10, probe.admitted ? probe.probe : undefined);
      expect(store.getBreaker('p/m')).toMatchObject({ state: 'open', generation: cycle + 2 });
      expect((await b.admit('p/m', s, false, 1_000)).admitted).toBe(false);
    }
    // Half-open, then failed probes: the second (two of three) reopens it, a change.
    advance(31_000);
    const ok = await b.admit('p/m', s, false, 5_000);
    await b.record('p/m', s, 'success', 10, ok.admitted ? ok.probe : undefined);
    for (let i = 0; i < 2; i++) {
      const bad = await b.admit('p/m', s, false, 5_000);
      await b.record('p/m', s, 'failure', 10, bad.admitted ? bad.probe : undefined);
    }
    expect(transitions).toEqual(['p/m:closed->open', 'p/m:open->half-open', 'p/m:half-open->open']);
  });

  it('ignores rate limits and short aborted attempts', async () => {
    const { b, transitions } = board();
    for (let i = 0; i < 10; i++) b.record('p/m', s, 'ignore', 10, undefined);
    for (let i = 0; i < 10; i++) b.record('p/m', s, 'slow-call', 100, undefined);
    await b.flush();
    expect(transitions).toEqual([]);
    for (let i = 0; i < 5; i++) b.record('p/m', s, 'slow-call', 6_000, undefined);
    await Promise.resolve();
    expect(transitions).toEqual(['p/m:closed->open']);
  });
});
