// A fleet's split of a target's rates (pools.requestsPerMinute, tokensPerMinute), with fake time and no Redis: each
// instance's share as the exchange computes it (fleetShare), the part of the rates it paces at (rateShare), and what
// the fleet sends in sum. Before: each instance paced at its share rounded to whole slots, at least one each, and the
// fleet sent up to 2.25 times the rate (one busy instance and five idle of a pool of 4 slots).
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { rateOf } from '../src/policy/client-rate.ts';
import { LEAST_RATE_PART, rateSpend, rateWait, ratesPart, rescaleDues, type TargetDues, type TargetRates } from '../src/policy/target-rate.ts';
import { fleetShare, rateShare, REFRESH_MS } from '../src/pools/fleet-share.ts';
import { ProviderPool, type Acquired, type SlotRequest } from '../src/pools/provider-pool.ts';

const CLASSES = [
  { name: 'online', minShare: 0, maxQueue: 100 },
  { name: 'batch', minShare: 0.25, maxQueue: 100 },
];

/** 600 requests a minute, a burst of one second's worth (the default). */
const RATES: TargetRates = { requests: rateOf(600, 10) };
const PER_SECOND = 10;
const BURST = 10;

/** Each instance's share of a pool of `capacity`, from its online demand, as the exchange computes it. */
function shares(capacity: number, demands: readonly number[]): number[] {
  const total = demands.reduce((a, b) => a + b, 0);
  return demands.map((d) => fleetShare(capacity, CLASSES, [d, 0], [total, 0], demands.length));
}

/** What an instance paced at before: its share rounded to whole slots, at least one. */
const slotPart = (share: number, capacity: number) => Math.max(1, Math.round(capacity * share)) / capacity;

const sum = (xs: readonly number[]) => xs.reduce((a, b) => a + b, 0);

/** The fleet's request rate in sum, as a multiple of the configured one. */
function fleetRate(parts: readonly number[]): number {
  return sum(parts.map((p) => RATES.requests!.intervalMs / ratesPart(RATES, p).requests!.intervalMs));
}

// [case, capacity, each instance's demand, the fleet's rate before (a multiple of the configured)]
const CASES: Array<[string, number, number[], number]> = [
  ['6 busy instances, a pool of 4 slots', 4, [20, 20, 20, 20, 20, 20], 1.5],
  ['10 busy instances, a pool of 4 slots', 4, Array<number>(10).fill(20), 2.5],
  ['1 busy and 5 idle instances, a pool of 4 slots', 4, [50, 0, 0, 0, 0, 0], 2.25],
  ['1 busy and 5 idle instances, a pool of 10 slots', 10, [100, 0, 0, 0, 0, 0], 1.5],
  ['1 busy and 1 idle instance, a pool of 10 slots', 10, [100, 0], 1.1],
  ['shares of 0.45 and 0.55 of 10 slots', 10, [9, 11], 1.1],
  ['2 busy instances, a pool of 3 slots', 3, [20, 20], 4 / 3],
  ['3 busy instances, a pool of 10 slots', 10, [20, 20, 20], 0.9],
];

describe('the fleet\'s sum of its instances\' parts of a target\'s rates', () => {
  it.each(CASES)('%s: the configured rate, where shares rounded to slots sent more (or less)', (_, capacity, demands, before) => {
    const s = shares(capacity, demands);
    expect(sum(s)).toBeCloseTo(1, 9);
    expect(fleetRate(s.map((x) => slotPart(x, capacity)))).toBeCloseTo(before, 9);
    const parts = s.map((x) => rateShare(x, capacity, demands.length));
    expect(fleetRate(parts)).toBeCloseTo(1, 9);
    expect(fleetRate(parts)).toBeLessThanOrEqual(1 + 1e-9);
    // No instance is left without a pace: one slot's part, or a tenth of the rate over the fleet.
    for (const p of parts) expect(p).toBeGreaterThanOrEqual(Math.min(1 / capacity, 0.1 / demands.length) - 1e-12);
  });

  it('keeps an idle instance\'s floor out of the busy one\'s part: at most a tenth of the rate over the fleet', () => {
    expect(shares(10, [100, 0, 0, 0, 0, 0]).map((x) => rateShare(x, 10, 6))).toEqual([
      expect.closeTo(0.1 / 6 + 0.9, 9),
      ...Array<unknown>(5).fill(expect.closeTo(0.1 / 6, 9)),
    ]);
    // Few instances of a large pool: one slot's part each, as the floor slot paced before.
    expect(rateShare(0, 100, 2)).toBeCloseTo(0.01, 12);
    expect(rateShare(1, 100, 2)).toBeCloseTo(0.01 + 0.98, 12);
    // Alone: the whole rate.
    expect(rateShare(1, 4, 1)).toBe(1);
  });
});

/** One instance of a simulated fleet: busy (sends as fast as its part lets it) from `busyFromMs` on. */
interface Instance {
  busyFromMs: number;
  dues: TargetDues;
  rates: TargetRates;
  sent: number[];
}

/**
 * A fleet of instances on a pool of `capacity`, exchanging demand every REFRESH_MS (a busy instance counts 50 waiting,
 * an idle one none), each paced at its part of RATES; `split` the old rule (slots, due times kept) or the new one.
 * Returns every request's send time, ms.
 */
function simulate(capacity: number, busyFromMs: readonly number[], durationMs: number, split: 'slots' | 'share'): number[] {
  const fleet: Instance[] = busyFromMs.map((b) => ({ busyFromMs: b, dues: {}, rates: RATES, sent: [] }));
  for (let at = 0; at < durationMs; at += REFRESH_MS) {
    const s = shares(capacity, fleet.map((i) => (i.busyFromMs < at || i.sent.length > 0 ? 50 : 0)));
    fleet.forEach((inst, k) => {
      const next = split === 'slots' ? ratesPart(RATES, slotPart(s[k]!, capacity)) : ratesPart(RATES, rateShare(s[k]!, capacity, fleet.length));
      if (split === 'share') rescaleDues(inst.dues, inst.rates, next, at);
      inst.rates = next;
      let now = Math.max(at, inst.busyFromMs);
      for (;;) {
        now += rateWait(inst.dues, inst.rates, now, 1);
        if (now >= at + REFRESH_MS || now >= durationMs) break;
        rateSpend(inst.dues, inst.rates, now, 1);
        inst.sent.push(now);
      }
    });
  }
  return fleet.flatMap((i) => i.sent).sort((a, b) => a - b);
}

/** The most requests sent in any window of `windowMs`. */
function mostIn(sent: readonly number[], windowMs: number): number {
  let most = 0;
  for (let i = 0, j = 0; i < sent.length; i++) {
    while (sent[i]! - sent[j]! >= windowMs) j++;
    most = Math.max(most, i - j + 1);
  }
  return most;
}

describe('a simulated fleet paced at its parts of 600 requests a minute (burst 10), a minute long', () => {
  // [case, capacity, when each instance starts sending; sent in the minute and in the busiest second, before and now]
  const RUNS: Array<[string, number, number[], [number, number], [number, number]]> = [
    ['6 busy instances, a pool of 4 slots', 4, [0, 0, 0, 0, 0, 0], [906, 24], [600, 12]],
    ['10 busy instances, a pool of 4 slots', 4, Array<number>(10).fill(0), [1_510, 40], [600, 10]],
    ['1 busy instance, 5 that start at 10 s, a pool of 10 slots', 10, [0, 10_000, 10_000, 10_000, 10_000, 10_000], [705, 19], [590, 18]],
    ['1 busy instance, 5 that start one after another, a pool of 10 slots', 10, [0, 5_000, 15_000, 25_000, 35_000, 45_000], [649, 15], [579, 18]],
    ['2 busy instances, a pool of 3 slots', 3, [0, 0], [810, 24], [608, 18]],
  ];

  it.each(RUNS)('%s: at most the rate, one burst and each instance\'s burst of one', (_, capacity, busyFrom, before, now) => {
    const slots = simulate(capacity, busyFrom, 60_000, 'slots');
    expect([slots.length, mostIn(slots, 1_000)]).toEqual(before);
    const share = simulate(capacity, busyFrom, 60_000, 'share');
    expect([share.length, mostIn(share, 1_000)]).toEqual(now);
    const floors = busyFrom.length;
    expect(share.length).toBeLessThanOrEqual(60 * PER_SECOND + BURST + floors);
    expect(mostIn(share, 1_000)).toBeLessThanOrEqual(PER_SECOND + BURST + floors);
    // The rate is used, less what the floors of instances idle at an exchange keep (at most a tenth while they are).
    expect(share.length).toBeGreaterThanOrEqual(0.95 * 60 * PER_SECOND);
  });
});

describe('due times carried over a change of an instance\'s part', () => {
  it('keeps what is owed in units: a request sent under a millionth is one interval at the new part, not 10^6', () => {
    const tiny = ratesPart(RATES, LEAST_RATE_PART);
    const half = ratesPart(RATES, 0.5);
    const dues: TargetDues = {};
    rateSpend(dues, tiny, 0, 1);
    expect(rateWait(dues, tiny, 500, 1)).toBeGreaterThan(9e7);
    rescaleDues(dues, tiny, half, 500);
    // A unit less 500 ms of a millionth's pace: 200 ms at the half part (its burst of 5 lets the next go at once).
    expect(dues.requests).toBeCloseTo(500 + 200, 2);
    expect(rateWait(dues, half, 500, 1)).toBe(0);
  });

  it('keeps what is owed when the part shrinks, rather than forgiving it; leaves a full bucket full', () => {
    const whole = ratesPart(RATES, 1);
    const tenth = ratesPart(RATES, 0.1);
    const dues: TargetDues = { requests: 1_000 };
    rescaleDues(dues, whole, tenth, 0);
    expect(dues.requests).toBe(10_000);
    const full: TargetDues = { requests: 400 };
    rescaleDues(full, whole, tenth, 500);
    expect(full.requests).toBe(400);
    const none: TargetDues = {};
    rescaleDues(none, whole, tenth, 0);
    expect(none).toEqual({ requests: undefined, tokens: undefined });
  });

  it('gives a whole share summed a hair under 1 its whole burst', () => {
    expect(ratesPart(RATES, 1 - 1e-15).requests!.burst).toBe(BURST);
    expect(ratesPart(RATES, 0.5).requests!.burst).toBe(5);
    expect(ratesPart(RATES, 0.49).requests!.burst).toBe(4);
  });

  it('gives a part of 0 (nothing left over for an idle instance) the least part, a finite pace', () => {
    expect(ratesPart(RATES, 0).requests).toEqual({ intervalMs: 100 / LEAST_RATE_PART, burst: 1 });
  });
});

describe('an idle instance\'s first requests (fake clock)', () => {
  beforeEach(() => vi.useFakeTimers({ now: 0 }));
  afterEach(() => vi.useRealTimers());

  const req = (): SlotRequest => ({ cls: 0, target: 'p/m', retry: false, deadlineAtMs: 600_000, minAttemptMs: 0, signal: new AbortController().signal });
  const pool = () => new ProviderPool({ provider: 'p', capacity: 10, retryCapacity: 10, classes: CLASSES, decrease: 0.9, minLimit: 1, rates: { requests: rateOf(60, 1) } }, () => Date.now());
  function track(p: ProviderPool, label: string, log: Array<[string, number]>): Promise<Acquired> {
    return p.acquire(req()).then((a) => {
      if (a.ok) {
        log.push([label, Date.now()]);
        a.slot.release();
      }
      return a;
    });
  }

  it('sends its first at once, and its second at the part the next exchange gives it, not at its idle floor\'s', async () => {
    // Two instances, 10 slots, the other's demand fills the pool: this one's share is 0, its part of the rate 0.05
    // (one every 20 s). Before, its floor slot paced it at a tenth (one every 10 s), and its share grown to a half
    // at the next exchange, the due time of 10 s still held its second request.
    const p = pool();
    const idle = shares(10, [0, 50])[0]!;
    expect(idle).toBe(0);
    p.setShare(idle, 50, 1, rateShare(idle, 10, 2));
    const log: Array<[string, number]> = [];
    void track(p, 'first', log);
    void track(p, 'second', log);
    await vi.advanceTimersByTimeAsync(0);
    expect(log).toEqual([['first', 0]]);
    await vi.advanceTimersByTimeAsync(REFRESH_MS);
    const grown = shares(10, [2, 50])[0]!;
    p.setShare(grown, 50, 1, rateShare(grown, 10, 2));
    // What was owed: 0.975 of a request, at the new part.
    const part = rateShare(grown, 10, 2);
    await vi.advanceTimersByTimeAsync(Math.ceil(0.975 * (1_000 / part)) + 1);
    expect(log.map(([l]) => l)).toEqual(['first', 'second']);
    expect(log[1]![1]).toBeCloseTo(500 + 0.975 * (1_000 / part), -1);
    p.close();
  });

  it('is not stranded by a request sent under the least part when its part grows', async () => {
    const p = pool();
    p.setShare(0, 50, 1, 0);
    const log: Array<[string, number]> = [];
    void track(p, 'first', log);
    await vi.advanceTimersByTimeAsync(REFRESH_MS);
    p.setShare(0.5, 50, 1, 0.5);
    // What the first owes: a request, at half the rate 2 s (read as a time, 10^9 ms, and the second shed at once).
    const second = track(p, 'second', log);
    await vi.advanceTimersByTimeAsync(2_000);
    expect((await second).ok).toBe(true);
    expect(log).toEqual([['first', 0], ['second', 2_500]]);
    p.close();
  });
});
