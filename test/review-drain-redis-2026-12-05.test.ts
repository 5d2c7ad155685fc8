// Adversarial review of shutdown and of the Redis-shared state across Redis trouble (2026-12-05).
import { spawn, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { writeFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { afterEach, describe, expect, it } from 'vitest';
import { startMock } from '../src/mock/server.ts';
import { RedisStore } from '../src/state/redis-store.ts';
import { openRawStream, readRawRest } from './helpers/chat-stream.ts';
import { defaultConfig, startStack } from './helpers/stack.ts';
import type { BreakerRecord } from '../src/state/store.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { eventually } from './helpers/redis-stores.ts';
import { freePort } from './helpers/free-port.ts';
import { useOneGatewayProcess, waitReady } from './helpers/gateway-process.ts';

const redis = useRedisServer();
const stores: RedisStore[] = [];
afterEach(async () => {
  await Promise.all(stores.splice(0).map((s) => s.close()));
});
const one = useOneGatewayProcess();

/** The real gateway process in front of a mock whose streams take `chunks` x 150 ms; resolves its URL once ready. */
async function startGateway(chunks: number, drain: { preStopMs: number; graceMs: number }): Promise<string> {
  return (await one.start({ faults: { stream: { chunks, chunkDelayMs: 150 } }, drain })).url;
}

/** Stores of one fleet (one key prefix) on the test's Redis, with this command timeout; each closed after the test. */
function fleetOf(commandTimeoutMs: number): (() => RedisStore) & { keyPrefix: string } {
  const keyPrefix = `rev-${randomUUID()}`;
  const make = () => {
    const store = new RedisStore({ config: { redis: redis().url, commandTimeoutMs, keyPrefix } });
    stores.push(store);
    return store;
  };
  return Object.assign(make, { keyPrefix });
}

describe('a signal that arrives twice (npm forwards the one a process group got: Ctrl-C, systemd KillMode=control-group)', () => {
  it('a second SIGTERM during the drain does not kill the process: the stream in flight completes, exit 0', async () => {
    const url = await startGateway(8, { preStopMs: 200, graceMs: 10_000 });
    const reader = await openRawStream(url);
    const exited = one.gateway!.exited;
    one.gateway!.proc.kill('SIGTERM');
    await sleep(50);
    one.gateway!.proc.kill('SIGTERM');
    const text = await readRawRest(reader);
    expect(text.trimEnd().endsWith('data: [DONE]')).toBe(true);
    expect(await exited).toBe(0);
    expect(one.gateway!.proc.signalCode).toBeNull();
  });

  it('a second SIGINT does not kill the process either: the stream in flight completes, exit 0', async () => {
    const url = await startGateway(8, { preStopMs: 0, graceMs: 10_000 });
    const reader = await openRawStream(url);
    const exited = one.gateway!.exited;
    one.gateway!.proc.kill('SIGINT');
    await sleep(50);
    one.gateway!.proc.kill('SIGINT');
    const text = await readRawRest(reader);
    expect(text.trimEnd().endsWith('data: [DONE]')).toBe(true);
    expect(await exited).toBe(0);
    expect(one.gateway!.proc.signalCode).toBeNull();
  });
});

describe('a person\'s second Ctrl-C', () => {
  it('a SIGINT a second or more after the first exits at once (130), without waiting for the stream in flight', async () => {
    const url = await startGateway(60, { preStopMs: 0, graceMs: 30_000 });
    const reader = await openRawStream(url);
    const exited = one.gateway!.exited;
    one.gateway!.proc.kill('SIGINT');
    await sleep(1_300);
    const t = Date.now();
    one.gateway!.proc.kill('SIGINT');
    expect(await exited).toBe(130);
    expect(Date.now() - t).toBeLessThan(3_000);
    expect(one.gateway!.output()).toContain('SIGINT again: exiting now');
    // The stream (60 chunks, 150 ms apart) had far from ended.
    expect((await readRawRest(reader)).includes('data: [DONE]')).toBe(false);
  });
});

describe('`npm start` under a signal sent to its process group (the terminal\'s Ctrl-C, systemd\'s stop)', () => {
  let group: ChildProcess | undefined;
  let dir: string | undefined;
  afterEach(() => {
    if (group?.pid !== undefined && group.exitCode === null && group.signalCode === null) process.kill(-group.pid, 'SIGKILL');
    if (dir) rmSync(dir, { recursive: true, force: true });
    group = dir = undefined;
  });

  it('SIGTERM to the group (npm passes it on: the gateway hears it twice) drains: the stream completes, npm exits 0', async () => {
    const mock = (one.mock = await startMock({ quiet: true, faults: { stream: { chunks: 8, chunkDelayMs: 150 } } }));
    const port = await freePort();
    dir = mkdtempSync(join(tmpdir(), 'stormgate-npm-'));
    const file = join(dir, 'gateway.yaml');
    writeFileSync(file, JSON.stringify({
      server: { host: '127.0.0.1', port, logLevel: 'warn' },
      providers: { mock: { family: 'openai', baseUrl: `${mock.url}/v1`, apiKey: 'k' } },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }] }],
      drain: { preStopMs: 200, graceMs: 10_000 },
    }));
    const { STORMGATE_CONFIG: _drop, ...env } = process.env;
    group = spawn('npm', ['start', '--silent', '--', '--config', file], { env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    group.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    group.stderr!.on('data', (d: Buffer) => (out += d.toString()));
    const exited = once(group, 'exit') as Promise<[number | null, string | null]>;
    await waitReady({ proc: group, file, exited: exited.then(([c]) => c), output: () => out }, port, 30_000);
    const url = `http://127.0.0.1:${port}`;
    const reader = await openRawStream(url);
    process.kill(-group.pid!, 'SIGTERM');
    const text = await readRawRest(reader);
    expect(text.trimEnd().endsWith('data: [DONE]')).toBe(true);
    expect(await exited).toEqual([0, null]);
  });
});

describe('Redis paused (SIGSTOP) longer than a breaker is open, then resumed', () => {
  it('the late run of the open this instance sent before it went degraded does not reopen the breaker it closed since, here or on the fleet', async () => {
    const make = fleetOf(100);
    const a = make();
    const b = make();
    expect(await a.ready()).toBe(true);
    expect(await b.ready()).toBe(true);
    const t = 'p/m';
    a.getBreaker(t);
    b.getBreaker(t);
    await Promise.all([a.firstRead(t), b.firstRead(t)]);
    const thaw = redis().freeze();
    try {
      // The open times out (Redis paused) and is applied on A's view; Redis will run it once resumed.
      const openedAt = Date.now();
      const open: BreakerRecord = { state: 'open', sinceMs: openedAt, openUntilMs: openedAt + 300, probeSuccesses: 0, generation: 1 };
      expect(await a.casBreaker(t, 0, open)).toBe(true);
      for (let i = 0; i < 6 && !a.degraded; i++) {
        await a.setHoldOff(`other/${i}`, Date.now() + 1_000, Date.now());
        await sleep(80);
      }
      await eventually(() => a.degraded, 5_000);
      // Degraded, A probes as the breaker's policy says once openUntil is over: half-open, then closed on a success.
      await sleep(Math.max(0, openedAt + 400 - Date.now()));
      const halfOpen: BreakerRecord = { state: 'half-open', sinceMs: Date.now(), openUntilMs: 0, probeSuccesses: 0, generation: 2 };
      expect(await a.casBreaker(t, 1, halfOpen)).toBe(true);
      const closed: BreakerRecord = { state: 'closed', sinceMs: Date.now() + 1, openUntilMs: 0, probeSuccesses: 0, generation: 3 };
      expect(await a.casBreaker(t, 2, closed)).toBe(true);
    } finally {
      thaw();
    }
    await eventually(() => !a.degraded, 10_000);
    // The resync after recovery (and the subscriber's) have run, and any message has arrived.
    await sleep(1_500);
    expect(a.getBreaker(t)?.state).toBe('closed');
    expect(b.getBreaker(t)?.state).toBe('closed');
    const admin = new Redis(redis().url);
    try {
      expect(await admin.hget(`${make.keyPrefix}:{${t}}:breaker`, 'state')).toBe('closed');
    } finally {
      admin.disconnect();
    }
  });
});

describe('a hold-off that ended a moment ago, read from Redis (its key outlives it by a minute)', () => {
  it('is no change to announce on an instance that first looks the target up (its adaptive limit must not restart at half for it)', async () => {
    const make = fleetOf(500);
    const a = make();
    expect(await a.ready()).toBe(true);
    const t = 'p/held';
    a.getHoldOff(t);
    await a.firstRead(t);
    // A provider's short pause, over now; Redis keeps the key for a late reader.
    await a.setHoldOff(t, Date.now() + 300, Date.now());
    await sleep(500);
    // An instance started (a rolling restart) or reconnected after the hold-off ended.
    const b = make();
    expect(await b.ready()).toBe(true);
    const heard: Array<{ target: string; untilMs: number; atMs: number }> = [];
    b.onChange((c) => c.kind === 'hold-off' && heard.push({ target: c.target, untilMs: c.untilMs, atMs: Date.now() }));
    b.getHoldOff(t);
    await b.firstRead(t);
    // What ended is still known (a capped hold-off's end is read after it passed: HoldOffs.reask), but not as news.
    expect(b.getHoldOff(t)).toBeGreaterThan(0);
    expect(heard.filter((h) => h.untilMs <= h.atMs)).toEqual([]);
  });

  it('leaves the adaptive limit of a gateway that first sends to the target after the hold-off ended where a target never held off has it', async () => {
    const keyPrefix = `rev-${randomUUID()}`;
    const a = new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 500, keyPrefix } });
    stores.push(a);
    expect(await a.ready()).toBe(true);
    a.getHoldOff('mock/gpt-4o');
    await a.firstRead('mock/gpt-4o');
    await a.setHoldOff('mock/gpt-4o', Date.now() + 300, Date.now());
    await sleep(600);
    const s = await startStack({ config: (mockUrl) => ({ ...defaultConfig(mockUrl), state: { redis: redis().url, keyPrefix, commandTimeoutMs: 500 } }) });
    try {
      for (const model of ['gpt-4o', 'gpt-4o-mini']) {
        const res = await fetch(`${s.url}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', authorization: 'Bearer x' },
          body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }] }),
        });
        expect(res.status).toBe(200);
      }
      await sleep(100);
      const text = await (await fetch(`${s.url}/metrics`)).text();
      const limit = (target: string) => Number(text.split('\n').find((l) => l.startsWith(`stormgate_pool_limit{target="${target}"}`))?.split(' ').at(-1));
      expect(limit('mock/gpt-4o-mini')).toBeGreaterThan(0);
      expect(limit('mock/gpt-4o')).toBe(limit('mock/gpt-4o-mini'));
    } finally {
      await s.close();
    }
  });
});

describe('a first read of a target that Redis answers too late (one command timeout: no outage yet)', () => {
  it('is read again, so the instance learns the fleet\'s hold-off instead of sending into it until the next reconnect', async () => {
    const make = fleetOf(100);
    const a = make();
    const b = make();
    expect(await a.ready()).toBe(true);
    expect(await b.ready()).toBe(true);
    const t = 'p/busy';
    a.getHoldOff(t);
    await a.firstRead(t);
    const until = await a.setHoldOff(t, Date.now() + 20_000, Date.now()).then(() => a.getHoldOff(t)!);
    const admin = new Redis(redis().url);
    try {
      // Redis busy for a moment (a slow script, a fork, a loaded host): B's first read of the target times out once.
      await admin.call('CLIENT', 'PAUSE', '400', 'ALL');
      expect(b.getHoldOff(t)).toBeUndefined();
      await b.firstRead(t);
      expect(b.degraded).toBe(false);
      await sleep(600);
      await eventually(() => b.getHoldOff(t) === until, 5_000);
    } finally {
      admin.disconnect();
    }
  });
});

describe('the pub/sub connection lost while the command connection stays', () => {
  it('hears the fleet again and learns what changed while it was not subscribed (a hold-off, an open breaker)', async () => {
    const make = fleetOf(500);
    const a = make();
    const b = make();
    expect(await a.ready()).toBe(true);
    expect(await b.ready()).toBe(true);
    const t = 'p/sub';
    a.getHoldOff(t);
    b.getHoldOff(t);
    await Promise.all([a.firstRead(t), b.firstRead(t)]);
    const admin = new Redis(redis().url);
    try {
      // Every subscriber connection dropped (as a proxy or a client-output-buffer limit does); B changes things at once.
      await admin.call('CLIENT', 'KILL', 'TYPE', 'pubsub');
      const until = Date.now() + 20_000;
      await b.setHoldOff(t, until, Date.now());
      const now = Date.now();
      expect(await b.casBreaker(t, 0, { state: 'open', sinceMs: now, openUntilMs: now + 20_000, probeSuccesses: 0, generation: 1 })).toBe(true);
      await eventually(() => a.getHoldOff(t) === until && a.getBreaker(t)?.state === 'open', 5_000);
      expect(a.degraded).toBe(false);
      // And hears the next change by pub/sub again.
      await b.setHoldOff(t, until + 5_000, Date.now());
      await eventually(() => a.getHoldOff(t) === until + 5_000, 3_000);
    } finally {
      admin.disconnect();
    }
  });
});
