import { describe, expect, it } from 'vitest';
import type { BackoffConfig } from '../src/config/schema.ts';
import { backoffDelayMs, jitterWaitHintMs } from '../src/policy/backoff.ts';
import { seededRandom, type Random } from '../src/policy/random.ts';

const base = 200;
const cap = 3000;
const cfg = (strategy: BackoffConfig['strategy']): BackoffConfig => ({ strategy, baseMs: base, capMs: cap });
const expMs = (retryIndex: number) => Math.min(cap, base * 2 ** retryIndex);
const DRAWS = 10_000;

function draws(strategy: BackoffConfig['strategy'], retryIndex: number, seed: number): number[] {
  const random = seededRandom(seed);
  return Array.from({ length: DRAWS }, () => backoffDelayMs(cfg(strategy), retryIndex, undefined, random));
}
const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
// One assertion per batch: 10,000 expect() calls per case would make the suite slow for no extra evidence.
const summary = (xs: number[]) => ({ min: Math.min(...xs), max: Math.max(...xs), allWholeMs: xs.every(Number.isInteger) });

describe('seededRandom', () => {
  it('repeats its sequence for a seed and stays in [0, 1)', () => {
    const a = seededRandom(42), b = seededRandom(42);
    for (let i = 0; i < 1000; i++) {
      const u = a();
      expect(u).toBe(b());
      expect(u).toBeGreaterThanOrEqual(0);
      expect(u).toBeLessThan(1);
    }
    expect(seededRandom(1)()).not.toBe(seededRandom(2)());
  });
});

describe('backoffDelayMs', () => {
  for (let retryIndex = 0; retryIndex <= 6; retryIndex++) {
    const exp = expMs(retryIndex);

    it(`full-jitter draws whole ms in [0, exp] with mean exp/2 at retry ${retryIndex}`, () => {
      const xs = draws('full-jitter', retryIndex, 1000 + retryIndex);
      const { min, max, allWholeMs } = summary(xs);
      expect(allWholeMs).toBe(true);
      expect(min).toBeGreaterThanOrEqual(0);
      expect(max).toBeLessThanOrEqual(exp);
      expect(Math.abs(mean(xs) - exp / 2)).toBeLessThan(0.03 * (exp / 2));
    });

    it(`equal-jitter draws in [exp/2, exp] with mean 3/4 exp at retry ${retryIndex}`, () => {
      const xs = draws('equal-jitter', retryIndex, 2000 + retryIndex);
      const { min, max, allWholeMs } = summary(xs);
      expect(allWholeMs).toBe(true);
      expect(min).toBeGreaterThanOrEqual(exp / 2);
      expect(max).toBeLessThanOrEqual(exp);
      expect(Math.abs(mean(xs) - 0.75 * exp)).toBeLessThan(0.03 * 0.75 * exp);
    });

    it(`exponential waits exactly min(cap, base * 2^n) at retry ${retryIndex}`, () => {
      expect(backoffDelayMs(cfg('exponential'), retryIndex, undefined, seededRandom(1))).toBe(exp);
    });

    it(`fixed waits exactly base at retry ${retryIndex}`, () => {
      expect(backoffDelayMs(cfg('fixed'), retryIndex, undefined, seededRandom(1))).toBe(base);
    });
  }

  it('never exceeds the cap, even for huge or odd retry indexes', () => {
    const random = seededRandom(7);
    for (const strategy of ['full-jitter', 'equal-jitter', 'decorrelated-jitter', 'exponential'] as const) {
      for (const retryIndex of [30, 64, 1024, 1e9, Number.MAX_SAFE_INTEGER, Infinity]) {
        const x = backoffDelayMs(cfg(strategy), retryIndex, cap, random);
        expect(x).toBeGreaterThanOrEqual(0);
        expect(x).toBeLessThanOrEqual(cap);
      }
    }
    expect(backoffDelayMs(cfg('exponential'), 1e9, undefined, random)).toBe(cap);
    expect(backoffDelayMs(cfg('exponential'), Number.NaN, undefined, random)).toBe(base);
    expect(backoffDelayMs(cfg('exponential'), -3, undefined, random)).toBe(base);
  });

  it('clamps to the cap when the base is above it', () => {
    const small: BackoffConfig = { strategy: 'fixed', baseMs: 5000, capMs: 1000 };
    expect(backoffDelayMs(small, 0, undefined, seededRandom(1))).toBe(1000);
    expect(backoffDelayMs({ ...small, strategy: 'decorrelated-jitter' }, 0, undefined, seededRandom(1))).toBe(1000);
  });

  it('stays within bounds when random() misbehaves', () => {
    for (const bad of [() => 1, () => -0.5, () => Number.NaN, () => 7]) {
      for (const strategy of ['full-jitter', 'equal-jitter', 'decorrelated-jitter'] as const) {
        const x = backoffDelayMs(cfg(strategy), 3, 900, bad);
        expect(x).toBeGreaterThanOrEqual(0);
        expect(x).toBeLessThanOrEqual(cap);
      }
    }
  });

  it('decorrelated-jitter keeps a 10,000-step chain within [base, cap]', () => {
    const random = seededRandom(3);
    const chain: number[] = [];
    for (let i = 0; i < DRAWS; i++) chain.push(backoffDelayMs(cfg('decorrelated-jitter'), i, chain.at(-1), random));
    expect(summary(chain)).toEqual({ min: base, max: cap, allWholeMs: true });
  });

  it('decorrelated-jitter draws from [base, 3 * prev], starting from prev = base', () => {
    const fixed = (u: number): Random => () => u;
    const d = cfg('decorrelated-jitter');
    expect(backoffDelayMs(d, 0, undefined, fixed(0))).toBe(base);
    expect(backoffDelayMs(d, 0, undefined, fixed(0.5))).toBe(2 * base);
    expect(backoffDelayMs(d, 0, 300, fixed(0.5))).toBe(550);
    expect(backoffDelayMs(d, 0, 900, fixed(0.5))).toBe(1450);
    expect(backoffDelayMs(d, 0, 900, fixed(0.999999))).toBe(2700);
    expect(backoffDelayMs(d, 0, 2000, fixed(0.999999))).toBe(cap);
  });

  it('full-jitter spreads 1,000 requests failing together, while exponential wakes them all at once', () => {
    const random = seededRandom(99);
    const bucketShare = (delays: number[]) => {
      const counts = new Map<number, number>();
      for (const d of delays) counts.set(Math.floor(d / 100), (counts.get(Math.floor(d / 100)) ?? 0) + 1);
      return Math.max(...counts.values()) / delays.length;
    };
    const herd = (strategy: BackoffConfig['strategy']) =>
      Array.from({ length: 1000 }, () => backoffDelayMs(cfg(strategy), 4, undefined, random));
    expect(bucketShare(herd('full-jitter'))).toBeLessThanOrEqual(0.15);
    expect(bucketShare(herd('exponential'))).toBe(1);
  });
});

describe('jitterWaitHintMs', () => {
  it('waits between the hint and 1.2 times the hint, in whole ms', () => {
    const random = seededRandom(5);
    for (const hint of [0, 1, 150, 1000, 20_000]) {
      const { min, max, allWholeMs } = summary(Array.from({ length: 1000 }, () => jitterWaitHintMs(hint, random)));
      expect(allWholeMs).toBe(true);
      expect(min).toBeGreaterThanOrEqual(hint);
      expect(max).toBeLessThanOrEqual(Math.ceil(1.2 * hint));
    }
  });

  it('rounds up so a fractional hint is never shortened', () => {
    expect(jitterWaitHintMs(1500.5, () => 0)).toBe(1501);
  });

  it('treats a negative or NaN hint as 0 and keeps an infinite one infinite', () => {
    expect(jitterWaitHintMs(-100, () => 0.5)).toBe(0);
    expect(jitterWaitHintMs(Number.NaN, () => 0.5)).toBe(0);
    expect(jitterWaitHintMs(Infinity, () => 0.5)).toBe(Infinity);
  });
});
