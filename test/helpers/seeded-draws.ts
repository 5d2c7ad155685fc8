// Draws for the seeded generators of the fuzz tests, on the code base's own seeded PRNG: same seed, same case.
import { seededRandom, type Random } from '../../src/policy/random.ts';

export type Rng = Random;
export const prng: (seed: number) => Rng = seededRandom;
/** A whole number from lo to hi, both included. */
export const int = (r: Rng, lo: number, hi: number): number => lo + Math.floor(r() * (hi - lo + 1));
export const pick = <T>(r: Rng, xs: readonly T[]): T => xs[int(r, 0, xs.length - 1)]!;
export const chance = (r: Rng, p: number): boolean => r() < p;
