// An instance that dies mid-run (SIGKILL, the OOM killer, a node lost) under an idempotency key: two gateway processes
// on one real Redis, the run's owner killed while the provider is still working on it, then the agent's retry (the
// same key) sent to the other instance. What it costs is how long that retry waits, and what it gets meanwhile. Before
// leases the dead run's claim lived for the route's timeoutMs + 30 s (measured here: 40 s of 409s with a 10 s route
// timeout; 150 s with the default one); now it lapses within idempotency.leaseMs (a short one here, 2 s).
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { afterEach, describe, expect, it } from 'vitest';
import { startMock, type MockServer } from '../src/mock/server.ts';
import { freePort } from './helpers/free-port.ts';
import { killNow, useGatewayProcesses, waitReady } from './helpers/gateway-process.ts';
import { useRedisServer } from './helpers/redis-server.ts';

const redis = useRedisServer();
const startProcess = useGatewayProcesses();
let mock: MockServer | undefined;
afterEach(async () => {
  await mock?.close();
  mock = undefined;
});

const LEASE_MS = 2_000;

/** A gateway process on the shared Redis in front of the mock; resolves its URL once ready. */
async function startGateway(name: string, keyPrefix: string): Promise<{ url: string; kill: () => Promise<void> }> {
  const port = await freePort();
  const g = startProcess(name, {
    server: { host: '127.0.0.1', port, logLevel: 'warn' },
    providers: { mock: { family: 'openai', baseUrl: `${mock!.url}/v1`, apiKey: 'k' } },
    routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }], timeoutMs: 10_000 }],
    state: { redis: redis().url, keyPrefix },
    idempotency: { leaseMs: LEASE_MS },
  });
  await waitReady(g, port);
  return {
    url: `http://127.0.0.1:${port}`,
    kill: () => killNow(g.proc),
  };
}

const body = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'give user 7 a coupon' }] });

/** One try of the agent's call under `key`, giving up after `timeoutMs` (sent as the gateway's timeout header too). */
function send(url: string, key: string, timeoutMs: number): Promise<Response> {
  return fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-stormgate-timeout-ms': String(timeoutMs) },
    body,
  });
}

describe('an instance killed mid-run under an idempotency key', () => {
  it('holds the key only for its lease: the retry on another instance runs the call within seconds', async () => {
    mock = await startMock({ quiet: true, faults: { latencyMs: 60_000 } });
    const keyPrefix = `crash-${randomUUID()}`;
    const [a, b] = await Promise.all([startGateway('a', keyPrefix), startGateway('b', keyPrefix)]);
    const admin = new Redis(redis().url);
    try {
      const key = `call-${randomUUID()}`;
      // A claims the key and runs the call; the provider is slow. The agent's own try is left hanging on A.
      const first = send(a.url, key, 60_000).catch((err: unknown) => err);
      const claimed = Date.now();
      while (mock.requests().length === 0) await sleep(20);
      const [redisKey] = await admin.keys(`${keyPrefix}:idempotency:*`);
      expect(await admin.get(redisKey!)).toContain('"state":"running"');
      await a.kill();
      const killed = Date.now();
      expect(await first).toBeInstanceOf(Error);
      // The provider answers at once from now on: whatever B gets is the claim's doing, not the provider's.
      mock.setFaults({});
      // The agent retries under the same key on B, each try giving up after 1 s, until it gets an answer.
      const statuses: number[] = [];
      let answer: Response | undefined;
      while (Date.now() - killed < 60_000) {
        const res = await send(b.url, key, 1_000);
        statuses.push(res.status);
        if (res.status !== 409) {
          answer = res;
          break;
        }
        expect(res.headers.get('x-should-retry')).toBe('true');
        expect(((await res.json()) as { error: { code: string } }).error.code).toBe('idempotency_key_in_progress');
      }
      const servedAfterMs = Date.now() - killed;
      console.log(`claim by A ${killed - claimed} ms before the kill; B served ${servedAfterMs} ms after it, statuses ${statuses.join(',')}`);
      expect(answer?.status).toBe(200);
      expect(answer?.headers.get('idempotent-replayed')).toBeNull();
      expect(statuses.slice(0, -1).every((s) => s === 409)).toBe(true);
      // The call ran twice upstream: once on A (its answer lost with it), once on B.
      expect(mock.requests().filter((r) => r.path === '/v1/chat/completions')).toHaveLength(2);
      // The claim was renewed until the kill (every third of the lease), and lapsed within the lease after it.
      expect(servedAfterMs).toBeGreaterThan(LEASE_MS / 2);
      expect(servedAfterMs).toBeLessThan(LEASE_MS + 6_000);
    } finally {
      admin.disconnect();
      await Promise.all([a.kill(), b.kill()]);
    }
  }, 90_000);

  it('keeps the key while its live owner runs past many leases: the repeat on the other instance waits and gets its answer', async () => {
    mock = await startMock({ quiet: true, faults: { latencyMs: 4 * LEASE_MS } });
    const keyPrefix = `crash-${randomUUID()}`;
    const [a, b] = await Promise.all([startGateway('a2', keyPrefix), startGateway('b2', keyPrefix)]);
    try {
      const key = `call-${randomUUID()}`;
      const first = send(a.url, key, 60_000);
      while (mock.requests().length === 0) await sleep(20);
      const repeat = await send(b.url, key, 30_000);
      expect(repeat.status).toBe(200);
      expect(repeat.headers.get('idempotent-replayed')).toBe('true');
      expect((await first).status).toBe(200);
      expect(mock.requests().filter((r) => r.path === '/v1/chat/completions')).toHaveLength(1);
    } finally {
      await Promise.all([a.kill(), b.kill()]);
    }
  }, 60_000);
});
