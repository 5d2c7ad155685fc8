// Percentiles and medians for the overhead bench. Nearest-rank on a sorted copy: with a few thousand samples
// per run that is exact enough, and it never interpolates a latency that no request actually had.

/** The p-th percentile (0..100) by nearest rank; NaN for no samples. */
export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length, Math.max(1, rank)) - 1]!;
}

/** Median of the rounds: one noisy round (a GC pause, a neighbour's burst) does not move it. */
export function median(values: readonly number[]): number {
  return percentile(values, 50);
}

/**
 * A share as a percentage with `digits` decimals, more where those would round a share short of all to 100% or one
 * above none to 0%: a report said "success rate 100.0%" for 8,996 of 9,000. NaN is `n/a`.
 */
export function percent(share: number, digits = 1): string {
  if (Number.isNaN(share)) return 'n/a';
  let d = digits;
  const shown = () => (100 * share).toFixed(d);
  const edge = (s: string) => (share < 1 && Number(s) >= 100) || (share > 0 && Number(s) <= 0);
  while (edge(shown()) && d < 6) d++;
  return `${shown()}%`;
}
