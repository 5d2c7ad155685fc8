// A Redis reached by a name that follows the primary (AWS ElastiCache's primary endpoint, Azure Cache, a VIP): on a
// failover the old primary becomes a replica and keeps its clients' connections open, while the name moves to the new
// primary. Every write on the old connection is answered READONLY; only a new connection reaches the primary.
import { Cluster, Redis } from 'ioredis';
import { afterEach, describe, expect, it } from 'vitest';
import { connectRedis, reconnectOnReadOnly, READONLY_RECONNECT_MS } from '../src/state/redis-client.ts';
import { startRedis, type RedisHandle } from './helpers/redis-server.ts';
import { eventually, loggedStores } from './helpers/redis-stores.ts';
import { startTcpProxy, type TcpProxy } from './helpers/tcp-proxy.ts';

const logged = loggedStores('ro');
const cleanup: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c();
});

/** Two servers, A the primary, and a proxy standing in for the DNS name, pointing at A. */
async function primaryAndSpare() {
  const a: RedisHandle = await startRedis();
  const b: RedisHandle = await startRedis();
  // A replica stops first: a primary's shutdown waits for its lagging replicas.
  cleanup.push(() => b.stop(), () => a.stop());
  const proxy: TcpProxy = await startTcpProxy(a.port);
  cleanup.push(() => proxy.close());
  const adminA = new Redis(a.url);
  const adminB = new Redis(b.url);
  cleanup.push(() => void adminA.disconnect(), () => void adminB.disconnect());
  return { a, b, proxy, adminA, adminB };
}

/** B takes over, A follows it; the name still points at A unless `moveName`. */
async function failOver(env: Awaited<ReturnType<typeof primaryAndSpare>>, moveName: boolean): Promise<void> {
  await env.adminB.replicaof('NO', 'ONE');
  await env.adminA.replicaof('127.0.0.1', env.b.port);
  if (moveName) env.proxy.point(env.b.port);
}

const open = (n: number) => ({ state: 'open' as const, sinceMs: Date.now(), openUntilMs: Date.now() + 30_000, probeSuccesses: 0, generation: n });

describe('a failover behind a name that follows the primary (the old primary turns replica, its connections stay open)', () => {
  it('reconnects on READONLY and returns to Redis on the new primary, with one degraded and one recovered line', async () => {
    const env = await primaryAndSpare();
    const { store, keyPrefix, lines } = logged(`redis://127.0.0.1:${env.proxy.port}`);
    expect(await store.ready()).toBe(true);
    expect(await store.casBreaker('p/m', 0, open(1))).toBe(true);
    expect(await env.adminA.hget(`${keyPrefix}:{p/m}:breaker`, 'generation')).toBe('1');

    await failOver(env, true);
    // The next write reaches the demoted primary on the old connection.
    await store.casBreaker('p/m', 1, open(2));
    await eventually(async () => !store.degraded && (await store.ready(0)), 5_000);
    // Back on Redis: writes land on the new primary.
    await store.casBreaker('p/m', 2, open(3));
    expect(await env.adminB.hget(`${keyPrefix}:{p/m}:breaker`, 'generation')).toBe('3');
    const msgs = lines().map((l) => l.msg);
    expect(msgs.filter((m) => m.startsWith('state store degraded'))).toHaveLength(1);
    expect(msgs.filter((m) => m.startsWith('state store recovered'))).toHaveLength(1);
    expect(lines().find((l) => l.msg.startsWith('state store degraded'))?.error?.message).toMatch(/^READONLY/);
  }, 20_000);

  it('while the name still leads to the demoted primary: stays degraded, one line, reconnecting at most once a second', async () => {
    const env = await primaryAndSpare();
    const { store, lines } = logged(`redis://127.0.0.1:${env.proxy.port}`);
    expect(await store.ready()).toBe(true);
    await failOver(env, false);
    const connections = async () => Number(/total_connections_received:(\d+)/.exec(await env.adminA.info('stats'))![1]);
    const before = await connections();
    await store.casBreaker('p/m', 0, open(1));
    expect(store.degraded).toBe(true);
    await new Promise((resolve) => setTimeout(resolve, 3_000));
    // A reconnect at every refused write (the health check's included) would be ~20 a second.
    expect((await connections()) - before).toBeGreaterThanOrEqual(1);
    expect((await connections()) - before).toBeLessThanOrEqual(6);
    expect(store.degraded).toBe(true);
    const msgs = () => lines().map((l) => l.msg);
    expect(msgs().filter((m) => m.startsWith('state store degraded'))).toHaveLength(1);
    expect(msgs().filter((m) => m.startsWith('state store recovered'))).toHaveLength(0);

    // The name moves at last (DNS): the next reconnect finds the primary.
    env.proxy.point(env.b.port);
    await eventually(() => !store.degraded, 5_000);
    expect(msgs().filter((m) => m.startsWith('state store degraded'))).toHaveLength(1);
    expect(msgs().filter((m) => m.startsWith('state store recovered'))).toHaveLength(1);
  }, 20_000);
});

describe('reconnecting on READONLY', () => {
  it('reconnects at the first READONLY, then at most once per READONLY_RECONNECT_MS; never for other errors', () => {
    let now = 1_000_000;
    const decide = reconnectOnReadOnly(() => now);
    const readOnly = new Error("READONLY You can't write against a read only replica. script: abc, on @user_script:8.");
    expect(decide(new Error('OOM command not allowed when used memory > \'maxmemory\'.'))).toBe(false);
    expect(decide(readOnly)).toBe(1);
    now += READONLY_RECONNECT_MS - 1;
    expect(decide(readOnly)).toBe(false);
    now += 1;
    expect(decide(readOnly)).toBe(1);
  });

  it('is set for a URL and for Sentinel, not for a Cluster (whose replicas answer MOVED)', () => {
    const opts = { commandTimeoutMs: 50, keyPrefix: 'x' };
    const url = connectRedis({ ...opts, redis: 'redis://127.0.0.1:1' }, { subscriber: false }) as Redis;
    const sentinel = connectRedis({ ...opts, redis: { sentinels: [{ host: '127.0.0.1', port: 1 }], name: 'm' } }, { subscriber: false }) as Redis;
    const cluster = connectRedis({ ...opts, redis: { cluster: [{ host: '127.0.0.1', port: 1 }] } }, { subscriber: false }) as Cluster;
    try {
      expect(typeof url.options.reconnectOnError).toBe('function');
      expect(typeof sentinel.options.reconnectOnError).toBe('function');
      expect(cluster.options.redisOptions?.reconnectOnError ?? null).toBeNull();
    } finally {
      for (const c of [url, sentinel, cluster]) c.disconnect();
    }
  });
});
