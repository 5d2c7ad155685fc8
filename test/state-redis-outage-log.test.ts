// The two log lines of a Redis outage: the warning names the Redis it lost (host:port, never a password), and the
// recovery says how long the store was on local state. One line per transition.
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { redisAddress } from '../src/state/redis-client.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { eventually, loggedStores } from './helpers/redis-stores.ts';
import { TEST_SECRETS } from './helpers/test-secrets.ts';

const server = useRedisServer();
const store = loggedStores('outage-log');

describe('the Redis address in the state store log', () => {
  it('is host:port, with the default port, and never the user or password', () => {
    const secret = TEST_SECRETS[0]!;
    expect(redisAddress(`redis://app:${secret}@redis.internal:6380/2`)).toBe('redis.internal:6380');
    expect(redisAddress(`rediss://:${secret}@cache.example.com`)).toBe('cache.example.com:6379');
    expect(redisAddress('redis://[::1]:7000')).toBe('[::1]:7000');
    expect(redisAddress({ sentinels: [{ host: 's1', port: 26379 }, { host: 's2', port: 26380 }], name: 'main', password: secret })).toBe('sentinel main via s1:26379,s2:26380');
    expect(redisAddress({ cluster: [{ host: 'n1', port: 7000 }, { host: 'n2', port: 7001 }], password: secret })).toBe('cluster n1:7000,n2:7001');
  });
});

describe('a killed Redis, and its return', () => {
  it('warns once naming the Redis, and logs the recovery once with how long the store was degraded', async () => {
    const { store: s, lines } = store(server().url);
    expect(await s.ready()).toBe(true);
    await server().stop();
    await eventually(() => s.degraded, 3_000);
    await sleep(400); // degraded for a while: several failed reconnects, still one warning
    await server().restart();
    await eventually(() => !s.degraded, 8_000);

    const all = lines() as unknown as Array<Record<string, unknown> & { msg: string }>;
    const warnings = all.filter((l) => l.msg.startsWith('state store degraded'));
    const recoveries = all.filter((l) => l.msg.startsWith('state store recovered'));
    expect(warnings).toHaveLength(1);
    expect(recoveries).toHaveLength(1);
    expect(warnings[0]).toMatchObject({ redis: `127.0.0.1:${server().port}`, error: { message: 'connection to Redis closed' } });
    expect(recoveries[0]).toMatchObject({ redis: `127.0.0.1:${server().port}` });
    expect(recoveries[0]!.degradedMs).toBeGreaterThanOrEqual(400);
    expect(recoveries[0]!.degradedMs).toBeLessThan(60_000);
  });
});
