// How fast a breaker change made on one gateway instance reaches another through Redis: two RedisStores on a
// throwaway redis-server (never the one on 6379), CAS writes on A, and the time until B's synchronous getBreaker
// shows each one. B learns of it by pub/sub; its onChange fires when its local view has taken the change in.
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { RedisStore } from '../../src/state/redis-store.ts';
import type { BreakerRecord } from '../../src/state/store.ts';
import { startRedis } from '../../test/helpers/redis-server.ts';
import { percentile } from '../lib/stats.ts';

export interface PropagationResult {
  writes: number;
  p50Ms: number;
  p99Ms: number;
  maxMs: number;
  /** Writes B never showed within the wait. */
  missed: number;
}

const TARGET = 'mock/gpt-4o';
const WAIT_MS = 1_000;
/** A pause between writes, so each is timed alone rather than queued behind the last. */
const GAP_MS = 5;

export async function measurePropagation(writes = 200): Promise<PropagationResult> {
  const redis = await startRedis();
  const config = { redis: redis.url, commandTimeoutMs: 50, keyPrefix: 'bench' };
  const a = new RedisStore({ config });
  const b = new RedisStore({ config });
  try {
    if (!(await a.ready()) || !(await b.ready())) throw new Error(`redis stores did not connect to ${redis.url}`);
    b.getBreaker(TARGET); // B now watches the target, as a gateway does once a request asks about it.
    let waiting: { generation: number; resolve: () => void } | undefined;
    b.onChange((c) => {
      // The check is B's synchronous read, the one the request path makes.
      if (c.kind === 'breaker' && waiting && b.getBreaker(TARGET)?.generation === waiting.generation) waiting.resolve();
    });
    const samples: number[] = [];
    let missed = 0;
    for (let gen = 0; gen < writes; gen++) {
      const next: BreakerRecord = { state: gen % 2 === 0 ? 'open' : 'closed', sinceMs: Date.now(), openUntilMs: Date.now() + 5000, probeSuccesses: 0, generation: gen + 1 };
      const seen = new Promise<void>((resolve) => (waiting = { generation: gen + 1, resolve }));
      const started = performance.now();
      if (!(await a.casBreaker(TARGET, gen, next))) throw new Error(`CAS ${gen} -> ${gen + 1} on A was refused`);
      const shown = await Promise.race([seen.then(() => true), sleep(WAIT_MS).then(() => false)]);
      if (shown) samples.push(performance.now() - started);
      else missed++;
      waiting = undefined;
      await sleep(GAP_MS);
    }
    return { writes, p50Ms: percentile(samples, 50), p99Ms: percentile(samples, 99), maxMs: Math.max(...samples), missed };
  } finally {
    await a.close();
    await b.close();
    await redis.stop();
  }
}
