/** A source of uniform numbers in [0, 1); policy code takes one as a parameter so tests can fix it. */
export type Random = () => number;

/** A small seeded PRNG (mulberry32) for tests and benchmarks; same seed, same sequence. */
export function seededRandom(seed: number): Random {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
