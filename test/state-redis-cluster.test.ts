// The Redis store on a real Redis Cluster (three masters on loopback ports): it must join the cluster as readily as a
// single Redis, share its state across instances although each target's keys sit on another master, and still bound
// every command on the request path by commandTimeoutMs.
import { spawn, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pino from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { RedisStore } from '../src/state/redis-store.ts';
import { freePort } from './helpers/free-port.ts';
import { clusterUnavailable, makeCertificates, startRedisCluster, type RedisClusterHandle } from './helpers/redis-cluster.ts';
import { eventually, type LogLine } from './helpers/redis-stores.ts';
import { testLogSink } from './helpers/stack.ts';

const unavailable = clusterUnavailable();
if (unavailable) console.warn(`skipping the Redis Cluster tests: ${unavailable}`);
const tlsUnavailable = unavailable ?? clusterUnavailable({ tls: true });
if (tlsUnavailable && !unavailable) console.warn(`skipping the Redis Cluster TLS test: ${tlsUnavailable}`);

describe.skipIf(unavailable !== undefined)('Redis store on a Redis Cluster', () => {
  let cluster: RedisClusterHandle;
  const stores: RedisStore[] = [];
  beforeAll(async () => {
    cluster = await startRedisCluster(3);
  });
  afterAll(async () => {
    await cluster?.stop();
  });
  afterEach(async () => {
    await Promise.all(stores.splice(0).map((s) => s.close()));
  });

  function clusterStore(keyPrefix: string, commandTimeoutMs = 50) {
    const raw: string[] = [];
    const store = new RedisStore({
      config: { redis: { cluster: cluster.nodes }, commandTimeoutMs, keyPrefix },
      logger: pino({ level: 'debug' }, testLogSink(raw)),
    });
    stores.push(store);
    return { store, lines: () => raw.map((l) => JSON.parse(l) as LogLine) };
  }

  /**
   * Keeps the event loop lagging stepMs at every turn for totalMs, as a gateway busy while it starts (or under a burst
   * of requests) does: each step of connecting (TCP, the connection's setup commands, the reply) then takes a turn.
   */
  async function lag(totalMs: number, stepMs: number): Promise<void> {
    const end = Date.now() + totalMs;
    while (Date.now() < end) {
      const until = Date.now() + stepMs;
      while (Date.now() < until) {
        // spin
      }
      await new Promise((resolve) => setImmediate(resolve));
    }
  }

  it('joins the cluster when connecting to it takes longer than commandTimeoutMs', async () => {
    // ioredis sends its CLUSTER SLOTS and ready check on node connections that are not open yet: bounded by the 50 ms
    // command timeout, connecting had to fit in it too, and the store started degraded ("Failed to refresh slots cache"),
    // as it would for good where connecting (TCP and a TLS handshake) takes longer than that.
    const { store, lines } = clusterStore(`c-${randomUUID()}`);
    const flips: boolean[] = [];
    store.onDegradedChange((d) => flips.push(d));
    await lag(1000, 80);
    expect(await store.ready(5000)).toBe(true);
    expect(flips).toEqual([]);
    expect(lines().filter((l) => l.msg.includes('degraded'))).toEqual([]);
    expect(store.degraded).toBe(false);
  });

  it('shares breaker records, hold-offs and the retry budget between instances, whatever master holds the keys', async () => {
    const keyPrefix = `c-${randomUUID()}`;
    const a = clusterStore(keyPrefix).store;
    const b = clusterStore(keyPrefix).store;
    expect(await a.ready(5000)).toBe(true);
    expect(await b.ready(5000)).toBe(true);
    // Enough targets that their hash tags land on every master.
    const targets = Array.from({ length: 12 }, (_, i) => `p/model-${i}`);
    for (const t of targets) b.getBreaker(t);
    await Promise.all(targets.map((t) => b.firstRead(t)));
    const now = Date.now();
    for (const t of targets) {
      expect(await a.casBreaker(t, 0, { state: 'open', sinceMs: now, openUntilMs: now + 30_000, probeSuccesses: 0, generation: 1 })).toBe(true);
      await a.setHoldOff(t, now + 20_000);
      expect(await a.takePermit(t, 1, 1000, now, 1)).not.toBeNull();
    }
    await eventually(() => targets.every((t) => b.getBreaker(t)?.state === 'open' && b.getHoldOff(t) === now + 20_000), 3000);
    // The fleet's permit is taken: B gets none.
    expect(await b.takePermit(targets[0]!, 1, 1000, now, 1)).toBeNull();

    const budget = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 0 };
    a.addRequests('chat/online/p/model-0', 20, now);
    b.addRequests('chat/online/p/model-0', 20, now);
    const taken = [];
    for (let i = 0; i < 3; i++) taken.push(await a.takeRetry('chat/online/p/model-0', budget, now), await b.takeRetry('chat/online/p/model-0', budget, now));
    // 10% of the fleet's 40 requests: 4 retries, whichever instance asks.
    expect(taken.filter(Boolean)).toHaveLength(4);
    expect(a.degraded || b.degraded).toBe(false);
  });

  it('stays degraded while the master of the failed keys does not answer, though the other masters do', async () => {
    // A master failing over, as its clients see it until its replica takes over. The health check wrote one fixed key,
    // which another master holds: it passed at once, and the store came back, timed out again, and was called flapping.
    const keyPrefix = `c-${randomUUID()}`;
    const { store, lines } = clusterStore(keyPrefix);
    expect(await store.ready(5000)).toBe(true);
    const probeMaster = await cluster.masterOf(`${keyPrefix}:{probe}:probe`);
    let budgetKey = '';
    let master = probeMaster;
    for (let i = 0; master === probeMaster; i++) {
      budgetKey = `chat/online/p/m-${i}`;
      master = await cluster.masterOf(`${keyPrefix}:{${budgetKey}}:budget`);
    }
    const budget = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 1 };
    const flips: boolean[] = [];
    store.onDegradedChange((d) => flips.push(d));
    const thaw = cluster.freeze(master);
    try {
      for (let i = 0; i < 3; i++) await store.takeRetry(budgetKey, budget, Date.now());
      expect(store.degraded).toBe(true);
      // Health checks run every second; two that time out in a row also reconnect the client.
      await new Promise((resolve) => setTimeout(resolve, 3500));
      expect(flips).toEqual([true]);
    } finally {
      thaw();
    }
    await eventually(() => !store.degraded, 5000);
    expect(flips).toEqual([true, false]);
    expect(lines().some((l) => (l as { flapping?: boolean }).flapping)).toBe(false);
    expect(await store.takeRetry(budgetKey, budget, Date.now())).toBe(true);
  });

  it('still answers from local state within about commandTimeoutMs when the cluster stops answering', async () => {
    const { store } = clusterStore(`c-${randomUUID()}`);
    expect(await store.ready(5000)).toBe(true);
    const budget = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 1 };
    expect(await store.takeRetry('chat/online/p/m', budget, Date.now())).toBe(true);
    const thaw = cluster.freeze();
    try {
      const started = Date.now();
      expect(await store.takeRetry('chat/online/p/m', budget, Date.now())).toBe(true);
      // 50 ms, with room for a loaded machine; the nodes' own (connect) timeout is 1 s.
      expect(Date.now() - started).toBeLessThan(700);
    } finally {
      thaw();
    }
  });
});

describe.skipIf(tlsUnavailable !== undefined)('gateway on a Redis Cluster over TLS', () => {
  let dir: string;
  let cluster: RedisClusterHandle | undefined;
  let gateway: ChildProcess | undefined;
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'stormgate-cluster-tls-'));
  });
  afterAll(async () => {
    if (gateway && gateway.exitCode === null && gateway.signalCode === null) gateway.kill('SIGKILL');
    await cluster?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('shares state through a cluster whose certificate names its hosts, not their addresses (as ElastiCache\'s does)', async () => {
    const certs = makeCertificates(dir);
    cluster = await startRedisCluster(3, { tls: certs });
    const port = await freePort();
    const file = join(dir, 'gateway.yaml');
    const seeds = cluster.nodes.map((n) => `{ host: ${n.host}, port: ${n.port} }`).join(', ');
    writeFileSync(file, `server: { host: 127.0.0.1, port: ${port}, logLevel: warn }
providers:
  p: { family: openai, baseUrl: "http://127.0.0.1:9/v1", apiKey: k }
routes:
  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: p } ] }
state: { redis: { cluster: [ ${seeds} ], tls: true }, keyPrefix: "t-${randomUUID()}" }
`);
    const { OPENAI_API_KEY: _drop, STORMGATE_CONFIG: _drop2, ...env } = process.env;
    // The test CA, trusted the way an operator trusts a private one: Node reads it at start only.
    gateway = spawn(process.execPath, ['--import', 'tsx', 'src/main.ts', '--config', file], {
      env: { ...env, NODE_EXTRA_CA_CERTS: certs.ca }, stdio: ['ignore', 'ignore', 'pipe'],
    });
    let stderr = '';
    gateway.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
    let last: unknown;
    await eventually(async () => {
      last = await fetch(`http://127.0.0.1:${port}/readyz`).then((r) => r.json(), () => undefined);
      return (last as { degraded?: boolean } | undefined)?.degraded === false;
    }, 15_000).catch(() => {
      throw new Error(`the gateway never used the cluster: /readyz ${JSON.stringify(last)}\n${stderr}`);
    });
    expect(last).toMatchObject({ status: 'ready', store: 'redis', degraded: false });
  });
});
