// A breaker write of one instance that the fleet's Redis does not keep, while the instance stays on Redis: a command
// lost with a Redis Cluster master that failed over (its replica took over without it; the commands to the other
// masters kept answering, so the store never counted three timeouts in a row and never went degraded). The instance's
// view moved alone, and nothing tells it so: it must come back to the fleet's record.
import { randomUUID } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { encodeBreaker } from '../src/state/redis-keys.ts';
import { RedisStore } from '../src/state/redis-store.ts';
import type { BreakerRecord } from '../src/state/store.ts';
import { useRedisServerWithAdmin } from './helpers/redis-server.ts';
import { eventually } from './helpers/redis-stores.ts';

const server = useRedisServerWithAdmin();
const stores: RedisStore[] = [];

afterEach(async () => {
  await server.admin().client('UNPAUSE');
  await Promise.all(stores.splice(0).map((s) => s.close()));
});

describe('a breaker write the fleet\'s Redis did not keep', () => {
  it('heals the view it moved alone, instead of refusing every probe of a breaker open on this instance only', async () => {
    const keyPrefix = `lost-${randomUUID()}`;
    const a = new RedisStore({ config: { redis: server.redis().url, commandTimeoutMs: 100, keyPrefix } });
    const b = new RedisStore({ config: { redis: server.redis().url, commandTimeoutMs: 100, keyPrefix } });
    stores.push(a, b);
    expect(await a.ready()).toBe(true);
    expect(await b.ready()).toBe(true);
    const target = 'p/m';
    const now = Date.now();
    const closed: BreakerRecord = { state: 'closed', sinceMs: now - 60_000, openUntilMs: 0, probeSuccesses: 0, generation: 4 };
    expect(await b.casBreaker(target, 0, closed)).toBe(true);
    a.getBreaker(target);
    await a.firstRead(target);
    expect(a.getBreaker(target)).toEqual(closed);

    // A trips the breaker; the write times out (one timeout: A stays on Redis), and A opens it in its view alone.
    await server.admin().client('PAUSE', 400, 'WRITE');
    const open: BreakerRecord = { state: 'open', sinceMs: now, openUntilMs: now + 300, probeSuccesses: 0, generation: 5 };
    expect(await a.casBreaker(target, 4, open)).toBe(true);
    expect(a.degraded).toBe(false);
    expect(a.getBreaker(target)?.generation).toBe(5);
    await server.admin().client('UNPAUSE');
    // The replica that takes over never had the write: the fleet's record is the closed one, and nobody publishes it.
    const key = `${keyPrefix}:{${target}}:breaker`;
    await eventually(async () => (await server.admin().hget(key, 'generation')) === '5', 2000);
    await server.admin().hset(key, ...encodeBreaker(closed));

    // Past openUntil A asks for a probe permit by its generation 5, which the fleet's record (4) does not have: refused,
    // and before, refused for good: A answered circuit_open while the provider and Redis were fine.
    await new Promise((resolve) => setTimeout(resolve, 350));
    await server.admin().config('RESETSTAT');
    // Every request of the half-open window asks, and is refused alike: the record is read again once, not per request.
    const taken = await Promise.all(Array.from({ length: 20 }, () => a.takePermit(target, 1, 1000, Date.now(), 5)));
    expect(taken.every((t) => t === null)).toBe(true);
    await eventually(() => a.getBreaker(target)?.generation === 4, 3000);
    const reads = /cmdstat_hgetall:calls=(\d+)/.exec(await server.admin().info('commandstats'))?.[1];
    expect(Number(reads ?? 0)).toBeLessThanOrEqual(2);
    expect(a.getBreaker(target)).toEqual(closed);
    expect(await a.takePermit(target, 1, 1000, Date.now(), 4)).not.toBeNull();
  });
});
