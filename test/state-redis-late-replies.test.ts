// A Redis that answers late (paused, stopped, busy): the store gave up on a call after commandTimeoutMs and decided
// on local state, but Redis still runs the call when it gets to it. What such a late call leaves in Redis must not
// hold the fleet back once Redis answers again.
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { useRedisServer } from './helpers/redis-server.ts';
import { eventually, loggedStores } from './helpers/redis-stores.ts';

const redisServer = useRedisServer();
let admin: Redis;
const store = loggedStores('late');

beforeAll(() => {
  admin = new Redis(redisServer().url);
});
afterAll(() => admin?.disconnect());

/** Pauses Redis for `ms` (commands queue and run once it ends) and resolves once it has surely ended. */
async function pause(ms: number): Promise<() => Promise<void>> {
  await admin.call('CLIENT', 'PAUSE', String(ms), 'ALL');
  const over = Date.now() + ms + 150;
  return () => sleep(Math.max(0, over - Date.now()));
}

describe('a probe permit asked for while Redis is paused (the call timed out, Redis ran it later)', () => {
  it('does not hold the fleet\'s only permit for the probe\'s whole time limit once the probe is over', async () => {
    const { store: a, keyPrefix } = store(redisServer().url);
    const { store: b } = store(redisServer().url, keyPrefix);
    expect(await a.ready()).toBe(true);
    expect(await b.ready()).toBe(true);
    const resumed = await pause(400);
    // One breaker probe fleet-wide (an open breaker past openUntil), its permit good for the attempt's 30 s limit.
    const permit = await a.takePermit('p/m', 1, 30_500, Date.now());
    expect(permit).not.toBeNull(); // answered from local state after the 100 ms timeout: A probes
    expect(a.degraded).toBe(false); // one late reply is no outage
    await resumed();
    await a.releasePermit('p/m', permit!); // A's probe is over
    // No probe is out anywhere: the fleet's next probe may go.
    expect(await b.takePermit('p/m', 1, 30_500, Date.now())).not.toBeNull();
  });

  it('is given back when the probe ends while the store is degraded on a live, slow connection', async () => {
    const { store: a, keyPrefix } = store(redisServer().url);
    const { store: b } = store(redisServer().url, keyPrefix);
    expect(await a.ready()).toBe(true);
    expect(await b.ready()).toBe(true);
    const permit = await a.takePermit('p/m', 1, 30_500, Date.now());
    expect(permit).not.toBeNull(); // taken in Redis
    const resumed = await pause(600);
    const budget = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 1 };
    for (let i = 0; i < 3; i++) await a.takeRetry('r', budget, Date.now()); // three timeouts in a row: degraded
    expect(a.degraded).toBe(true);
    await a.releasePermit('p/m', permit!); // the probe ends while A is degraded
    await resumed();
    expect(await b.takePermit('p/m', 1, 30_500, Date.now())).not.toBeNull();
  });
});

describe('a Redis slow every few seconds (the store degrades again soon after each recovery)', () => {
  it('needs more clean health checks after each flap, so the degraded state holds instead of flipping every second', async () => {
    const { store: a, lines } = store(redisServer().url);
    expect(await a.ready()).toBe(true);
    const budget = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 1 };
    const recoveryMs: number[] = [];
    for (let flap = 0; flap < 3; flap++) {
      const resumed = await pause(400);
      for (let i = 0; i < 3; i++) await a.takeRetry('r', budget, Date.now()); // three timeouts in a row: degraded
      expect(a.degraded).toBe(true);
      await resumed();
      const fine = Date.now();
      await eventually(() => !a.degraded, 10_000);
      recoveryMs.push(Date.now() - fine);
    }
    // The first recovery takes one health check (a second apart); the third, after two flaps within a minute, four.
    expect(recoveryMs[0]).toBeLessThan(1_600);
    expect(recoveryMs[2]).toBeGreaterThan(2_500);
    expect(lines().some((l) => l.msg?.startsWith('state store degraded') && (l as { flapping?: boolean }).flapping === true)).toBe(true);
  });
});
