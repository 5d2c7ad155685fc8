// RedisStores for tests against a real redis-server: each with its own key prefix and a log the test can read, all
// closed after each test. And `eventually`, for state that reaches a store a moment later (pub/sub, a reconnect).
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import pino from 'pino';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect } from 'vitest';
import { MemoryStore } from '../../src/state/memory-store.ts';
import { RedisStore } from '../../src/state/redis-store.ts';
import type { KeyRecord, StateStore } from '../../src/state/store.ts';
import { startRedis, type RedisHandle } from './redis-server.ts';
import { testLogSink } from './stack.ts';
import { startTcpProxy } from './tcp-proxy.ts';

/** The ACL the README gives the gateway's Redis user (its command part). */
export const README_ACL = ['+@scripting', '+@pubsub', '+@hash', '+@string', '+@sortedset', '+@keyspace', '+@connection', '+info'];

/** An idempotency key's record while `owner` runs it (fingerprint 'fp'). */
export const running = (owner: string, sinceMs: number): KeyRecord & { state: 'running' } => ({ state: 'running', fingerprint: 'fp', sinceMs, owner });
/** An idempotency key's whole 200 answer of `text` (fingerprint 'fp'). */
export const answer = (text: string): KeyRecord & { state: 'done' } => ({
  state: 'done',
  fingerprint: 'fp',
  bytes: text.length,
  answer: { status: 200, headers: { 'content-type': 'application/json' }, kind: 'whole', body: Buffer.from(text) },
});

export interface LogLine {
  level: number;
  msg: string;
  problem?: string;
  setting?: string;
  error?: { message: string };
}

interface LoggedStore {
  store: RedisStore;
  keyPrefix: string;
  raw: string[];
  lines: () => LogLine[];
}

/** A factory of logged stores on `url`, each closed after the test that made it; `prefix` starts their key prefixes. */
export function loggedStores(prefix: string): (url: string, keyPrefix?: string) => LoggedStore {
  const stores: RedisStore[] = [];
  afterEach(async () => {
    await Promise.all(stores.splice(0).map((s) => s.close()));
  });
  return (url, keyPrefix = `${prefix}-${randomUUID()}`) => {
    const raw: string[] = [];
    const logger = pino({ level: 'debug' }, testLogSink(raw));
    const store = new RedisStore({ config: { redis: url, commandTimeoutMs: 100, keyPrefix }, logger });
    stores.push(store);
    return { store, keyPrefix, raw, lines: () => raw.map((l) => JSON.parse(l) as LogLine) };
  };
}

export async function eventually(check: () => boolean | Promise<boolean>, withinMs: number): Promise<void> {
  const start = Date.now();
  while (!(await check())) {
    if (Date.now() - start > withinMs) throw new Error(`condition not met within ${withinMs} ms`);
    await sleep(10);
  }
}

/**
 * One conformance suite for both state stores: `suite` runs once with the in-process MemoryStore and once with a
 * RedisStore on a real redis-server started for the file, each test with a fresh store (a fresh key prefix, so no
 * test sees another's keys) that must not have gone over to local state by its end.
 */
export function describeEachStore(suite: (store: () => StateStore) => void): void {
  let redis: RedisHandle | undefined;
  beforeAll(async () => {
    redis = await startRedis();
  });
  afterAll(async () => {
    await redis?.stop();
  });
  const factories: Record<string, () => Promise<StateStore>> = {
    MemoryStore: async () => new MemoryStore(),
    RedisStore: async () => {
      const store = new RedisStore({ config: { redis: redis!.url, commandTimeoutMs: 500, keyPrefix: `t-${randomUUID()}` } });
      expect(await store.ready()).toBe(true);
      return store;
    },
  };
  describe.each(Object.entries(factories))('%s', (_name, create) => {
    let store: StateStore;
    beforeEach(async () => {
      store = await create();
    });
    afterEach(async () => {
      expect(store.degraded).toBe(false);
      await store.close();
    });
    suite(() => store);
  });
}

/**
 * An instance's store that a test cuts off Redis (`away`, through a TCP proxy) and lets back (`back`), and the fleet's
 * store that stays on it, sharing a key prefix; `admin` reads Redis itself. `close` stops all of it. `keyLeaseMs`: the cut
 * store's idempotency.leaseMs, how long a run it saw in Redis is waited for while Redis is away (10000).
 */
export async function cutAndFleet(o: { prefix?: string; commandTimeoutMs?: number; keyLeaseMs?: number } = {}) {
  const own = await startRedis();
  const proxy = await startTcpProxy(own.port);
  const keyPrefix = `${o.prefix ?? 'idem'}-${randomUUID()}`;
  const cut = new RedisStore({ config: { redis: `redis://127.0.0.1:${proxy.port}`, commandTimeoutMs: o.commandTimeoutMs ?? 100, keyPrefix }, ...(o.keyLeaseMs && { keyLeaseMs: o.keyLeaseMs }) });
  const fleet = new RedisStore({ config: { redis: own.url, commandTimeoutMs: 500, keyPrefix } });
  const admin = new Redis(own.url);
  const away = async () => {
    await proxy.cut();
    await eventually(() => cut.degraded, 3_000);
  };
  const back = async () => {
    await proxy.resume();
    await eventually(() => !cut.degraded, 8_000);
  };
  const close = async () => {
    admin.disconnect();
    await cut.close();
    await fleet.close();
    await proxy.close();
    await own.stop();
  };
  expect(await cut.ready()).toBe(true);
  expect(await fleet.ready()).toBe(true);
  return { cut, fleet, admin, proxy, keyPrefix, away, back, close };
}
