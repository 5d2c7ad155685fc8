// Idempotency keys when the gateway or its Redis is not at its best: a drain while a run whose client left is still
// going, and a Redis that stopped answering while a run under a key ended. Either way a key must not stay claimed by
// a run that is over (its repeats, fleet-wide, would get 409 until the claim lapsed: timeoutMs plus ttlMs).
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { buildServer } from '../src/server.ts';
import { createLogger } from '../src/observability/logger.ts';
import { createMetrics } from '../src/observability/metrics.ts';
import { KeptKeys } from '../src/state/kept-keys.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { eventually } from './helpers/redis-stores.ts';
import { defaultConfig, testLogSink, useGateways, useStacks, type Stack } from './helpers/stack.ts';

const start = useStacks();
const startGateway = useGateways();
const redis = useRedisServer();

const BODY = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'give the user one coupon' }] };
const upstreamChats = (s: Stack) => s.mock.requests().filter((r) => r.path === '/v1/chat/completions');

function post(url: string, key: string, opts: { signal?: AbortSignal; timeoutMs?: number } = {}) {
  return fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key, ...(opts.timeoutMs && { 'x-stormgate-timeout-ms': String(opts.timeoutMs) }) },
    body: JSON.stringify(BODY),
    signal: opts.signal,
  });
}

const fleetConfig = (s: Stack, extra: Partial<ConfigInput> = {}) =>
  ConfigSchema.parse({ ...defaultConfig(s.mock.url), state: { redis: redis().url, keyPrefix: `idem-out-${Date.now()}-${Math.random()}` }, ...extra });

describe('a drain while a run under a key goes on without its client', () => {
  it.each([
    // The run ends within the grace period: its answer is kept, and the fleet's repeat gets it.
    { graceMs: 3000, replayed: 'true', upstream: 1 },
    // It does not: it is stopped, its key given back, and the fleet's repeat runs it.
    { graceMs: 150, replayed: null, upstream: 2 },
  ])('with graceMs $graceMs, the key is settled or given back before the store closes', async ({ graceMs, replayed, upstream }) => {
    const s = await start({ faults: { latencyMs: 900 } });
    const config = fleetConfig(s, { drain: { preStopMs: 0, graceMs } });
    const draining = await buildServer(config, { logger: createLogger(config, testLogSink([])), metrics: createMetrics({ defaultMetrics: false }) });
    try {
      const a = await draining.listen({ host: '127.0.0.1', port: 0 });
      const b = await startGateway(config);
      const gone = new AbortController();
      const first = post(a, 'k-drain', { signal: gone.signal }).catch(() => undefined);
      await sleep(150);
      gone.abort();
      await first;
      await draining.drain();
      await sleep(100);
      const repeat = await post(b, 'k-drain', { timeoutMs: 3000 });
      expect(repeat.status).toBe(200);
      expect(repeat.headers.get('idempotent-replayed')).toBe(replayed);
      expect(upstreamChats(s)).toHaveLength(upstream);
    } finally {
      await draining.close();
    }
  });
});

describe('a drain while a stream under a key goes on without its client', () => {
  it('past the grace period the stream is interrupted and its key given back by the time the drain returns', async () => {
    const s = await start({ faults: { stream: { chunks: 30, chunkDelayMs: 100 } } });
    const config = fleetConfig(s, { drain: { preStopMs: 0, graceMs: 200 } });
    const draining = await buildServer(config, { logger: createLogger(config, testLogSink([])), metrics: createMetrics({ defaultMetrics: false }) });
    try {
      const a = await draining.listen({ host: '127.0.0.1', port: 0 });
      const b = await startGateway(config);
      const stream = (url: string, timeoutMs?: number, signal?: AbortSignal) =>
        fetch(`${url}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'idempotency-key': 'k-stream-drain', ...(timeoutMs && { 'x-stormgate-timeout-ms': String(timeoutMs) }) },
          body: JSON.stringify({ ...BODY, stream: true }),
          signal,
        });
      const gone = new AbortController();
      const first = await stream(a, undefined, gone.signal);
      await first.body!.getReader().read();
      gone.abort();
      await draining.drain();
      // The run would go on for about 2.5 s more: its key is free now, and the repeat runs it.
      const repeat = await stream(b, 1000);
      expect(repeat.status).toBe(200);
      expect(repeat.headers.get('idempotent-replayed')).toBeNull();
    } finally {
      await draining.close();
    }
  });
});

describe('a drain while a repeat waits for a run on another instance', () => {
  it('past the grace period the repeat is answered 503 gateway_draining, as requests in the pipeline are, not cut at the exit', async () => {
    const s = await start({ faults: { latencyMs: 2500 } });
    const config = fleetConfig(s, { drain: { preStopMs: 0, graceMs: 200 } });
    const b = await startGateway(config);
    const draining = await buildServer(config, { logger: createLogger(config, testLogSink([])), metrics: createMetrics({ defaultMetrics: false }) });
    try {
      const a = await draining.listen({ host: '127.0.0.1', port: 0 });
      const run = post(b, 'k-wait-drain');
      await sleep(150);
      const repeat = post(a, 'k-wait-drain');
      await sleep(150);
      await draining.drain();
      const answer = await repeat;
      expect(answer.status).toBe(503);
      expect(answer.headers.get('x-should-retry')).toBe('true');
      expect(((await answer.json()) as { error: { code: string } }).error.code).toBe('gateway_draining');
      expect((await run).status).toBe(200);
    } finally {
      await draining.close();
    }
  });
});

describe('a Redis that stopped answering while a run under a key ended', () => {
  it('the answer kept in the process reaches Redis when it is back: the repeat gets it, not 409 until the claim lapses', async () => {
    const s = await start({ faults: { latencyMs: 600 } });
    const a = await startGateway(fleetConfig(s));
    const run = post(a, 'k-frozen');
    await sleep(150);
    const thaw = redis().freeze();
    try {
      // Requests under other keys time out on Redis: the store goes over to local state before the run ends.
      await Promise.all([1, 2, 3, 4].map(async (i) => (await post(a, `k-other-${i}`)).text()));
      expect((await run).status).toBe(200);
    } finally {
      thaw();
    }
    // Redis answers again (the store's health check takes it back within a second or two).
    await sleep(2500);
    const repeat = await post(a, 'k-frozen', { timeoutMs: 2000 });
    expect(repeat.status).toBe(200);
    expect(repeat.headers.get('idempotent-replayed')).toBe('true');
    expect(upstreamChats(s)).toHaveLength(5);
  });

  it('a key given back while Redis was away is free again once it is back: the repeat runs it', async () => {
    // A stream cut after its first output (at about 600 ms) is not kept: its key is given back, with Redis frozen.
    const s = await start({ faults: { stream: { chunks: 8, chunkDelayMs: 100, cutAfterChunks: 6 } } });
    const a = await startGateway(fleetConfig(s));
    const stream = (timeoutMs?: number) =>
      fetch(`${a}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': 'k-given-back', ...(timeoutMs && { 'x-stormgate-timeout-ms': String(timeoutMs) }) },
        body: JSON.stringify({ ...BODY, stream: true }),
      });
    const run = await stream();
    const thaw = redis().freeze();
    try {
      await Promise.all([1, 2, 3, 4].map(async (i) => (await post(a, `k-other-${i}`)).text()));
      expect(await run.text()).toContain('stream_interrupted');
    } finally {
      thaw();
    }
    s.mock.setFaults({});
    await sleep(2500);
    const repeat = await stream(2000);
    expect(repeat.status).toBe(200);
    expect(repeat.headers.get('idempotent-replayed')).toBeNull();
    expect(await repeat.text()).toContain('[DONE]');
  });
});

describe('a run claimed in the process while Redis was away', () => {
  it('is waited for by a repeat that comes once Redis is back, not run a second time', async () => {
    const s = await start({ faults: { models: { 'gpt-4o-slow': { latencyMs: 4000 } } } });
    const a = await startGateway(fleetConfig(s));
    const thaw = redis().freeze();
    let run: Promise<Response>;
    try {
      // Requests under other keys time out on Redis: the store goes over to local state, where the run's key is claimed.
      await Promise.all([1, 2, 3, 4].map(async (i) => (await post(a, `k-away-${i}`)).text()));
      run = fetch(`${a}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': 'k-local' },
        body: JSON.stringify({ ...BODY, model: 'gpt-4o-slow' }),
      });
      await sleep(300);
    } finally {
      thaw();
    }
    await sleep(2000);
    const repeat = await fetch(`${a}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': 'k-local' },
      body: JSON.stringify({ ...BODY, model: 'gpt-4o-slow' }),
    });
    expect(repeat.status).toBe(200);
    expect(repeat.headers.get('idempotent-replayed')).toBe('true');
    expect((await run).status).toBe(200);
    expect(upstreamChats(s).filter((r) => r.model === 'gpt-4o-slow')).toHaveLength(1);
  });
});

describe('a run whose lease lapsed in Redis while Redis was away', () => {
  it('claims its key again once Redis is back: the repeat on another instance waits for it, not runs it a second time', async () => {
    const s = await start({ faults: { latencyMs: 6000 } });
    const config = fleetConfig(s, { idempotency: { leaseMs: 1000 } });
    const [a, b] = await Promise.all([startGateway(config), startGateway(config)]);
    const run = post(a, 'k-lease');
    await sleep(300);
    // Frozen three leases long: A's renewals time out, and its claim lapses in Redis (its clock runs on meanwhile).
    const thaw = redis().freeze();
    try {
      await sleep(3000);
    } finally {
      thaw();
    }
    const admin = new Redis(redis().url);
    try {
      // A is back on Redis (its health check takes it back within a second or two) and has made its claim again.
      await eventually(async () => {
        const keys = await admin.keys(`${config.state.keyPrefix}:idempotency:*`);
        return keys.length === 1 && (await admin.get(keys[0]!))?.includes('"state":"running"') === true;
      }, 5000);
    } finally {
      admin.disconnect();
    }
    const repeat = await post(b, 'k-lease', { timeoutMs: 8000 });
    expect(repeat.status).toBe(200);
    expect(repeat.headers.get('idempotent-replayed')).toBe('true');
    expect((await run).status).toBe(200);
    expect(upstreamChats(s)).toHaveLength(1);
  });
});

describe('the in-process store', () => {
  it('counts every record it keeps against memoryBytes, not only the answers\' bodies', () => {
    const cap = 64 * 1024;
    const keys = new KeptKeys(cap);
    const headers: Record<string, string> = {};
    for (let i = 0; i < 10; i++) headers[`x-header-${i}`] = 'v'.repeat(40);
    // Answers not kept (longer than maxAnswerBytes) and empty ones: no body, but a record each, for ttlMs.
    for (let i = 0; i < 20_000; i++) {
      const fingerprint = 'f'.repeat(43);
      if (i % 2) keys.settle(`key-${i}`, { state: 'done', fingerprint, bytes: 5_000_000 }, 600_000, 1_000);
      else keys.settle(`key-${i}`, { state: 'done', fingerprint, bytes: 0, answer: { status: 200, headers, kind: 'whole', body: Buffer.alloc(0) } }, 600_000, 1_000);
    }
    let held = 0;
    for (let i = 0; i < 20_000; i++) if (keys.read(`key-${i}`, 1_000)) held++;
    // Each record takes well over 64 bytes of the process's memory (its key, fingerprint, headers, the Map's entry).
    expect(held).toBeLessThan(cap / 64);
    expect(keys.read('key-19999', 1_000)).toBeDefined();
  });
});
