// Shared by the seeded model-based fuzzers of the pools and the parking lot (pools-model-fuzz.test.ts and
// pools-clients-model-fuzz.test.ts): the seeded generator, the settling of a step's promises, the pool's config
// (their one model of the pools is beside it, pool-model.ts).
import { ConfigSchema, type Config } from '../../src/config/schema.ts';
import type { Random } from '../../src/policy/random.ts';
import type { PoolClass } from '../../src/pools/provider-pool.ts';

export function gen(random: Random) {
  const int = (lo: number, hi: number) => lo + Math.floor(random() * (hi - lo + 1));
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(random() * xs.length)]!;
  const chance = (p: number) => random() < p;
  /** An even moment at least `ms` from now: cut-offs are even and hold ends odd, so no two timers tie. */
  const evenAfter = (nowMs: number, ms: number) => 2 * Math.ceil((nowMs + ms) / 2);
  return { int, pick, chance, evenAfter, random };
}
export type Gen = ReturnType<typeof gen>;

/** Lets every promise settled by the step run its callbacks (a grant resolves through two async frames). */
export async function settle(): Promise<void> {
  for (let i = 0; i < 10; i++) await Promise.resolve();
}

export const PROVIDER = 'p';
export const CLASS_NAMES = ['critical', 'online', 'batch'];
/** server.maxWaitingBodyBytes of the fuzzed pools. */
export const MAX_BODY_BYTES = 1_000;

/** A config with one provider whose pool has these settings: the pools are built as the gateway builds them. */
export function poolConfig(capacity: number, retries: number | undefined, classes: readonly PoolClass[], decrease: number, minLimit: number): Config {
  return ConfigSchema.parse({
    server: { maxWaitingBodyBytes: MAX_BODY_BYTES },
    providers: {
      [PROVIDER]: {
        family: 'openai',
        baseUrl: 'http://127.0.0.1:9/v1',
        apiKey: 'sk-test',
        maxConnections: capacity,
        breaker: false,
        pools: { maxConcurrent: capacity, ...(retries !== undefined && { maxConcurrentRetries: retries }), classes: Object.fromEntries(classes.map((c) => [c.name, { minShare: c.minShare, maxQueue: c.maxQueue }])), decrease, minLimit },
      },
    },
    routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: PROVIDER }] }],
  });
}

/** A gauge's value for these labels, from prom-client's get(). */
export function gaugeValue(m: { values: Array<{ value: number; labels: Partial<Record<string, string | number>> }> }, labels: Record<string, string>): number | undefined {
  return m.values.find((v) => Object.entries(labels).every(([k, x]) => v.labels[k] === x))?.value;
}
