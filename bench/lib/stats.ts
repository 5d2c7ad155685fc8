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
