// Review of the Redis-shared probe permits and retry budget (2026-12-06): RedisStores of one fleet on a real
// redis-server, held to the in-process store's rule for the same calls.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it } from 'vitest';
import { MemoryStore } from '../src/state/memory-store.ts';
import { RedisStore } from '../src/state/redis-store.ts';
import type { StateStore } from '../src/state/store.ts';
import { useRedisServerWithAdmin } from './helpers/redis-server.ts';

const { redis, admin } = useRedisServerWithAdmin();
const stores: RedisStore[] = [];
afterEach(async () => {
  await Promise.all(stores.splice(0).map((s) => s.close()));
});

async function fleetOfTwo(): Promise<[RedisStore, RedisStore]> {
  const keyPrefix = `rp-${randomUUID()}`;
  const made = [0, 1].map(() => new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 200, keyPrefix } }));
  stores.push(...made);
  for (const s of made) expect(await s.ready()).toBe(true);
  return [made[0]!, made[1]!];
}

/** A long probe's permit, then a short one's that lapses; then the fleet asks for two more permits of at most two. */
async function permitsAfterAShortOneLapsed(a: StateStore, b: StateStore): Promise<Array<string | null>> {
  expect(await a.takePermit('t1', 2, 10_000, Date.now())).not.toBeNull();
  expect(await b.takePermit('t1', 2, 200, Date.now())).not.toBeNull();
  await sleep(600);
  return [await b.takePermit('t1', 2, 10_000, Date.now()), await a.takePermit('t1', 2, 10_000, Date.now())];
}

describe('half-open probe permits across a fleet', () => {
  it('a short-lived permit does not take a longer one with it when it lapses (no third probe of two)', async () => {
    const memory = new MemoryStore();
    const [fromMemory0, fromMemory1] = await permitsAfterAShortOneLapsed(memory, memory);
    expect(fromMemory0).not.toBeNull();
    expect(fromMemory1).toBeNull();

    const [a, b] = await fleetOfTwo();
    const [first, second] = await permitsAfterAShortOneLapsed(a, b);
    // The short permit's slot is free again; the long one still holds the other.
    expect(first).not.toBeNull();
    expect(second).toBeNull();
  });
});

describe('a retry taken while Redis is slow', () => {
  it('is counted once in the fleet\'s budget: the late script counts it, the flush after does not again', async () => {
    const [a] = await fleetOfTwo();
    const cfg = { ratio: 0, windowS: 10, minRetriesPerSecond: 1 };
    // Scripts wait while writes are paused: the take times out (100 ms here) and is answered from local state...
    await admin().call('CLIENT', 'PAUSE', '400', 'WRITE');
    expect(await a.takeRetry('chat/online/p/m', cfg, Date.now())).toBe(true);
    // ...and Redis still runs it once the pause is over.
    await sleep(600);
    // A request's count starts the batch flush that carries what was held back for Redis.
    a.addRequests('chat/online/p/m', 1, Date.now());
    await sleep(300);
    expect(await a.budgetWindow('chat/online/p/m', cfg, Date.now())).toEqual({ requests: 1, retries: 1 });
  });
});
