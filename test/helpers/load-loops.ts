// Closed-loop load for the black-box suites: a number of workers each calling again as soon as it has its answer.
import { setTimeout as sleep } from 'node:timers/promises';

/** `workers` loops calling `fn` until `ms` have passed (each pausing `pauseMs` between calls); every answer. */
export async function loopFor<T>(ms: number, workers: number, fn: () => Promise<T>, pauseMs = 0): Promise<T[]> {
  const until = performance.now() + ms;
  const out: T[] = [];
  await Promise.all(
    Array.from({ length: workers }, async () => {
      while (performance.now() < until) {
        out.push(await fn());
        if (pauseMs > 0) await sleep(pauseMs);
      }
    }),
  );
  return out;
}
