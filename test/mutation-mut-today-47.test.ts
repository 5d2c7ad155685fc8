// Mutation round 47 on three modules no earlier round had mutated on their own: state/breaker-board.ts (the breakers'
// shared view: admission and probe permits, the run of failures, the batched failure-rate window, streams broken after
// their first output, the compare-and-set), pools/fleet-share.ts (each instance's share of maxConcurrent and of the
// rates, the classes the fleet backs, the exchange) and pools/floor-hold.ts (when a newcomer waits for the fleet to
// make room beyond the floor slot). 114 hand mutants: 91 killed by the existing files, 11 killed here, 12 equivalent,
// 0 open (breaker board 61: 47/10/4; fleet share 35: 28/1/6; floor hold 18: 16/0/2).
// Killed here, breaker board: an ignore-request answer (a flex-tier 498, a prompt over the limit) breaking a run of
// failures and counted as a request in the window; the run's count and reason dropped from its consecutive_failures
// line; the second try of a lost compare-and-set opening a breaker another instance had opened (a later openUntil); an
// inconclusive probe of a half-open spell judged by the reopened record's state (restarting the parked wait); a stream
// break exactly windowS after its success not bringing its request along; a flush timer per outcome (a store write per
// outcome, not per 50 ms); a failure-rate line naming this instance's failure from the previous closed spell, from a
// target key given back (forget left it), or exactly windowS old.
// Killed here, fleet share: the exchange splitting what demand leaves over as if this instance were the fleet's only one.
// Equivalent, breaker board: the ignore-request early return in #recordProbe (afterProbe ignores that verdict, and the
// finally gives the permit back); #pendingOutcome's closed-only check (a pending count of an open spell's generation is
// dropped at flush, which drops the closed spell's it replaced as well); flush's closed check beside its generation
// check (every transition bumps the generation); a run's first lastSuccessMs 0 instead of -Infinity (the clock is the
// epoch's: now - 0 is past CONSECUTIVE_QUIET_MS).
// Equivalent, fleet share: fleetShare's Math.max(fleet, own) for a class's want, its part's divisor and the fleet total
// (the exchange's totals always hold this instance's own demand, written in the same script); the `left` cap on the
// lower classes' floors (the schema keeps the minShares at most 1 in all); rateShare's clamp of a share (fleetShare
// clamps it); classesBacked with one more instance (instances weigh only what demand leaves over, and with any left the
// newcomer's class got its whole want, more than one slot).
// Equivalent, floor hold: exchanged's `!floorOnly` (a floor-only exchange gives 0 slots, never more than the hold's);
// end() moving a past untilMs up to now (nothing holds either way; the pool only drains once more).
// No bugs found.
// The board runs on a fake clock over a MemoryStore (two instances share it); the exchange on a stub pool and store.
import { describe, expect, it, vi } from 'vitest';
import { BreakerSchema } from '../src/config/schema.ts';
import { shareFleetCapacity } from '../src/pools/fleet-share.ts';
import type { Pools } from '../src/pools/pools.ts';
import type { PoolClass, ProviderPool } from '../src/pools/provider-pool.ts';
import { settingsForModel } from '../src/policy/breaker.ts';
import { BreakerBoard, type BreakerCause } from '../src/state/breaker-board.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import type { BreakerRecord, StateStore } from '../src/state/store.ts';
import { RacedStore } from './helpers/raced-store.ts';

const T = 1_700_000_000_000;
const breaker = (fields: Record<string, unknown>) => settingsForModel(BreakerSchema.parse({ minRequests: 4, failureRate: 0.5, consecutiveFailures: 100, windowS: 10, ...fields }), undefined);

/** Two instances' boards over one store, on one fake clock, with the transitions each one made. */
function fleet(store = new MemoryStore()) {
  let now = T;
  const lines: Array<{ by: string; from: string; to: string; cause: BreakerCause }> = [];
  const make = (by: string) => new BreakerBoard({ store, now: () => now, random: () => 0, onTransition: (_t, from, to, cause) => lines.push({ by, from: from.state, to: to.state, cause }) });
  return { store, a: make('a'), b: make('b'), lines, advance: (ms: number) => (now += ms), now: () => now };
}

describe('BreakerBoard: the reason a failure-rate opening names', () => {
  const s = breaker({ openS: 1, closeAfter: 1 });

  it("names none of this instance's failures from the breaker's previous closed spell, though still within windowS", async () => {
    const { a, b, lines, advance } = fleet();
    // a's four 503s open the breaker; a second later one probe closes it again: a fresh window, 1.x s after the 503s.
    for (let i = 0; i < 4; i++) await a.record('p/m', s, 'failure', 10, undefined, { reason: 'status_503' });
    await a.flush();
    advance(1_500);
    const probe = await a.admit('p/m', s, false, 5_000);
    await a.record('p/m', s, 'success', 10, probe.admitted ? probe.probe : undefined, { reason: 'ok' });
    expect(a.current('p/m').state).toBe('closed');
    // b's two timeouts and a's two successes tip the new window: a opens it, and none of the failures in it is a's.
    for (let i = 0; i < 2; i++) await b.record('p/m', s, 'failure', 10, undefined, { reason: 'timeout_response' });
    await b.flush();
    for (let i = 0; i < 2; i++) await a.record('p/m', s, 'success', 10, undefined);
    await a.flush();
    const last = lines.at(-1)!;
    expect([last.by, last.to, last.cause.cause]).toEqual(['a', 'open', 'failure_rate']);
    expect(last.cause.reason).toBeUndefined();
    await Promise.all([a.close(), b.close()]);
  });

  it("names none of this instance's failures once it is exactly windowS old: it has left the window", async () => {
    const { a, b, lines, advance } = fleet();
    await a.record('p/m', s, 'failure', 10, undefined, { reason: 'status_503' });
    await a.flush();
    advance(10_000);
    for (let i = 0; i < 2; i++) await b.record('p/m', s, 'failure', 10, undefined, { reason: 'timeout_response' });
    await b.flush();
    for (let i = 0; i < 2; i++) await a.record('p/m', s, 'success', 10, undefined);
    await a.flush();
    expect(lines.map((l) => [l.by, l.to, l.cause.cause, (l.cause as { failures: number }).failures, l.cause.reason])).toEqual([['a', 'open', 'failure_rate', 2, undefined]]);
    await Promise.all([a.close(), b.close()]);
  });

  it('names none of the failures of a target key given back (forget), when the same name comes back within windowS', async () => {
    const { store, a, b, lines } = fleet();
    await a.record('p/other-model', s, 'failure', 10, undefined, { reason: 'status_503' });
    a.forget('p/other-model');
    store.forget('p/other-model');
    for (let i = 0; i < 2; i++) await b.record('p/other-model', s, 'failure', 10, undefined, { reason: 'timeout_response' });
    await b.flush();
    for (let i = 0; i < 2; i++) await a.record('p/other-model', s, 'success', 10, undefined);
    await a.flush();
    expect(lines.map((l) => [l.by, l.to, l.cause.cause, l.cause.reason])).toEqual([['a', 'open', 'failure_rate', undefined]]);
    await Promise.all([a.close(), b.close()]);
  });
});

describe("BreakerBoard: an answer that is the request's own", () => {
  it('does not break a run of failures, whose line then names its length and reason', async () => {
    const { a, lines } = fleet();
    const s = breaker({ consecutiveFailures: 3, minRequests: 4 });
    // Two 503s, a flex-tier 498 and a request over the token limit (ignore-request), then a third 503: a run of three.
    await a.record('p/m', s, 'failure', 10, undefined, { reason: 'status_503' });
    await a.record('p/m', s, 'failure', 10, undefined, { reason: 'status_503' });
    await a.record('p/m', s, 'ignore-request', 10, undefined);
    await a.record('p/m', s, 'ignore-request', 10, undefined);
    await a.record('p/m', s, 'failure', 10, undefined, { reason: 'status_503' });
    expect(lines.map((l) => [l.to, l.cause.cause, (l.cause as { failures: number }).failures, l.cause.reason])).toEqual([['open', 'consecutive_failures', 3, 'status_503']]);
    await a.close();
  });

  it('is no request of the failure-rate window', async () => {
    const { a, lines } = fleet();
    const s = breaker({ minRequests: 4 });
    // Two failures and two such answers: 2 requests judged, under minRequests (not 2 failures of 4).
    for (let i = 0; i < 2; i++) await a.record('p/m', s, 'failure', 10, undefined);
    for (let i = 0; i < 2; i++) await a.record('p/m', s, 'ignore-request', 10, undefined);
    await a.flush();
    expect(lines).toEqual([]);
    await a.close();
  });
});

describe('BreakerBoard: the outcome batches', () => {
  it('writes the outcomes of a steady stream in one batch per 50 ms, not one write per outcome', async () => {
    vi.useFakeTimers({ now: T });
    try {
      const store = new MemoryStore();
      const writes: number[] = [];
      const addOutcomes = store.addOutcomes.bind(store);
      store.addOutcomes = async (target, generation, delta, nowMs, windowS) => {
        writes.push(delta.requests);
        return addOutcomes(target, generation, delta, nowMs, windowS);
      };
      const board = new BreakerBoard({ store, now: () => Date.now(), random: () => 0 });
      const s = breaker({ minRequests: 1000 });
      // An outcome every 10 ms for 200 ms.
      for (let i = 0; i < 20; i++) {
        await board.record('p/m', s, 'success', 10, undefined);
        await vi.advanceTimersByTimeAsync(10);
      }
      await vi.advanceTimersByTimeAsync(100);
      expect(writes.reduce((x, y) => x + y, 0)).toBe(20);
      expect(writes.length).toBeLessThanOrEqual(5);
      await board.close();
    } finally {
      vi.useRealTimers();
    }
  });
});

describe('BreakerBoard: a run of failures that loses the race to open', () => {

  it('leaves the breaker as the instance that opened it first wrote it: no second opening with a later end', async () => {
    const store = new RacedStore();
    const { a, lines, advance } = fleet(store);
    const s = breaker({ minRequests: 1000, consecutiveFailures: 5 });
    const other: BreakerRecord = { state: 'open', sinceMs: T, openUntilMs: T + 30_000, probeSuccesses: 0, generation: 1 };
    for (let i = 0; i < 4; i++) await a.record('p/m', s, 'failure', 10, undefined);
    advance(300);
    store.raceWith = other;
    await a.record('p/m', s, 'failure', 10, undefined);
    expect(store.getBreaker('p/m')).toEqual(other);
    expect(lines).toEqual([]);
    await a.close();
  });
});

describe('BreakerBoard: a probe of a spell that ended', () => {
  it('leaves alone a breaker another probe reopened in the very millisecond its half-open spell began, when its own answer says nothing', async () => {
    const s = breaker({ openS: 1, closeAfter: 2 });
    const { a, advance, now } = fleet();
    for (let i = 0; i < 4; i++) await a.record('p/m', s, 'failure', 10, undefined);
    await a.flush();
    advance(1_500);
    const first = await a.admit('p/m', s, false, 5_000);
    await a.record('p/m', s, 'success', 10, first.admitted ? first.probe : undefined);
    expect(a.current('p/m').state).toBe('half-open');
    // Two probes of the half-open spell go out; one is refused at once, in the same millisecond: 1 of 2 reopens it.
    const [x, y] = [await a.admit('p/m', s, false, 5_000), await a.admit('p/m', s, false, 5_000)];
    await a.record('p/m', s, 'failure', 10, x.admitted ? x.probe : undefined);
    const reopened = a.current('p/m');
    expect(reopened).toMatchObject({ state: 'open', sinceMs: now(), openUntilMs: now() + 1_000 });
    // The other is cut short too soon to count: it belongs to the half-open spell, and restarts no wait.
    await a.record('p/m', s, 'ignore', 10, y.admitted ? y.probe : undefined);
    expect(a.current('p/m')).toEqual(reopened);
    expect(a.availability('p/m', s, false)).toEqual({ kind: 'open', probeAtMs: now() + 1_000 });
  });
});

describe('BreakerBoard: a stream broken after its first output', () => {
  it('brings its request along once its success is exactly windowS old', async () => {
    const { a, lines, advance } = fleet();
    const counted = { generation: a.current('p/m').generation, atMs: T };
    advance(10_000);
    // Two streams begin well now; two counted exactly 10 s ago break: 2 failures of 4 requests, at minRequests.
    for (let i = 0; i < 2; i++) await a.record('p/m', breaker({}), 'success', 10, undefined);
    for (let i = 0; i < 2; i++) a.streamBroke('p/m', breaker({}), counted, { reason: 'stream_cut' });
    await a.flush();
    expect(lines.map((l) => `${l.to} ${l.cause.cause} ${(l.cause as { failures: number }).failures}/${(l.cause as { requests: number }).requests}`)).toEqual(['open failure_rate 2/4']);
  });
});

describe('shareFleetCapacity', () => {
  const CLASSES: PoolClass[] = [
    { name: 'online', minShare: 0.5, maxQueue: 100 },
    { name: 'batch', minShare: 0.1, maxQueue: 100 },
  ];

  async function exchangedShare(fleetAnswer: { totals: number[]; instances: number }, demand: number[]): Promise<number[]> {
    const calls: number[][] = [];
    const pool = {
      settings: { provider: 'p', capacity: 8, classes: CLASSES },
      demandByClass: () => demand,
      setShare: (...args: number[]) => calls.push(args),
      shareOnDemand: () => {},
    } as unknown as ProviderPool;
    const store = { exchangeDemand: async () => fleetAnswer } as unknown as StateStore;
    const stop = shareFleetCapacity({ all: () => [pool].values() } as unknown as Pools, store, () => T);
    await new Promise((r) => setTimeout(r, 20));
    stop();
    return calls[0]!;
  }

  it('splits an idle fleet\'s capacity among all its instances: four idle instances take a quarter each, not all of it', async () => {
    const [share, othersDemand, backed] = await exchangedShare({ totals: [0, 0], instances: 4 }, [0, 0]);
    expect(share).toBeCloseTo(0.25, 12);
    expect(othersDemand).toBe(0);
    expect(backed).toBe(1);
  });
});
