// Backoff between attempts on one target, as pure functions of (config, attempt, previous wait, random).
// Formulas follow AWS "Exponential Backoff and Jitter" (2015); cockatiel's ExponentialBackoffGenerators
// hold the same family (noJitter, fullJitter, halfJitter, decorrelatedJitter).
import type { BackoffConfig } from '../config/schema.ts';
import type { Random } from './random.ts';

// 2^64 times any positive base exceeds every cap, and keeps the power finite for huge indexes.
const MAX_DOUBLINGS = 64;

/** Wait before retry number `retryIndex` (0 = the first retry), in whole ms within [0, capMs]. prevDelayMs is the previous wait (decorrelated jitter uses it; undefined before the first retry). */
export function backoffDelayMs(cfg: BackoffConfig, retryIndex: number, prevDelayMs: number | undefined, random: Random): number {
  const { baseMs, capMs } = cfg;
  switch (cfg.strategy) {
    case 'full-jitter':
      return toWholeMs(between(0, exponentialMs(cfg, retryIndex), random), capMs);
    case 'equal-jitter': {
      const half = exponentialMs(cfg, retryIndex) / 2;
      return toWholeMs(half + between(0, half, random), capMs);
    }
    case 'decorrelated-jitter': {
      // AWS: sleep = min(cap, random(base, sleep * 3)). It ignores retryIndex: growth comes from the chain.
      // Polly's V2 formula (cockatiel's default) is a smoother relative; AWS's is simpler to bound.
      const prev = prevDelayMs !== undefined && Number.isFinite(prevDelayMs) ? prevDelayMs : baseMs;
      return toWholeMs(between(baseMs, Math.max(baseMs, prev * 3), random), capMs);
    }
    case 'exponential':
      return toWholeMs(exponentialMs(cfg, retryIndex), capMs);
    case 'fixed':
      return toWholeMs(baseMs, capMs);
  }
}

/** hintMs × U(1, 1.2), rounded up to whole ms, so requests told the same wait do not all wake at once. */
export function jitterWaitHintMs(hintMs: number, random: Random): number {
  // Only ever later than told (Envoy jitters reset headers to random(interval, 1.5 × interval)): waking early earns another 429.
  // NaN and negatives mean "no wait"; Infinity stays Infinity so the caller's cap refuses it.
  const hint = hintMs > 0 ? hintMs : 0;
  return Math.ceil(hint * (1 + 0.2 * unit(random)));
}

function exponentialMs(cfg: BackoffConfig, retryIndex: number): number {
  const doublings = retryIndex > 0 ? Math.min(Math.floor(retryIndex), MAX_DOUBLINGS) : 0;
  return Math.min(cfg.capMs, cfg.baseMs * 2 ** doublings);
}

function between(low: number, high: number, random: Random): number {
  return low + (high - low) * unit(random);
}

// A faulty random() must not push a wait outside its bounds.
function unit(random: Random): number {
  const u = random();
  return u >= 0 && u < 1 ? u : 0;
}

// Math.round rather than floor: floor would never reach the top of the range and would bias the mean down by 0.5 ms.
function toWholeMs(ms: number, capMs: number): number {
  return Math.min(capMs, Math.max(0, Math.round(ms)));
}
