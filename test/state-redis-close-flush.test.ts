// A stopping instance's batched counts reach the fleet: outcome counts (for the breakers' failure rate) and budget
// request counts are written at most 50 ms apart, and closing the store or the board used to drop the last batch. In a
// rolling restart under a failing provider, each instance that stopped took the start of a failure rate with it.
import { randomUUID } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { BreakerSchema } from '../src/config/schema.ts';
import { settingsForModel } from '../src/policy/breaker.ts';
import { BreakerBoard } from '../src/state/breaker-board.ts';
import { RedisStore } from '../src/state/redis-store.ts';
import { useRedisServer } from './helpers/redis-server.ts';

const BUDGET = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 0 };
const redis = useRedisServer();
const open: RedisStore[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((s) => s.close()));
});

async function pair(): Promise<[RedisStore, RedisStore]> {
  const keyPrefix = `close-${randomUUID()}`;
  const make = () => new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 500, keyPrefix } });
  const stores: [RedisStore, RedisStore] = [make(), make()];
  open.push(stores[1]);
  for (const s of stores) expect(await s.ready()).toBe(true);
  return stores;
}

describe('closing sends what was batched', () => {
  it('a budget\'s request counts not sent yet when the store closes reach Redis', async () => {
    const [a, b] = await pair();
    const now = Date.now();
    a.addRequests('route-1', 40, now);
    await a.close();
    expect(await b.budgetWindow('route-1', BUDGET, now)).toEqual({ requests: 40, retries: 0 });
  });

  it('outcomes counted in the last 50 ms before the board closes count in the fleet\'s window: the other instance\'s next failures open the breaker', async () => {
    const [a, b] = await pair();
    // Opens at a failure share of 50% over at least 10 requests in the window (consecutive failures out of play).
    const s = settingsForModel(BreakerSchema.parse({ consecutiveFailures: 1_000, failureRate: 0.5, minRequests: 10, windowS: 30 }), undefined);
    const now = Date.now();
    const boardA = new BreakerBoard({ store: a, now: () => now, random: () => 0 });
    for (let i = 0; i < 8; i++) await boardA.record('p/m', s, 'failure', 10, undefined);
    await boardA.close();
    await a.close();
    const boardB = new BreakerBoard({ store: b, now: () => now, random: () => 0 });
    for (let i = 0; i < 2; i++) await boardB.record('p/m', s, 'failure', 10, undefined);
    await boardB.flush();
    expect(boardB.current('p/m').state).toBe('open');
    await boardB.close();
  });
});
