// Random client cancellations must leak nothing on a fleet either. Two gateways share one real redis-server (breakers,
// probe permits, budgets, pool shares, idempotency keys), an OpenAI-family primary fails over to an Anthropic-family
// backup, and a few hundred openai SDK calls spread over both instances are cancelled at random moments, beside raw
// uploads that send their body slowly and are cut half-way. Midway Redis is stopped and started again, empty. Once all
// have settled: every slot, queue place, parked request and waiting body is given back on both instances, nothing
// runs at either provider, every request the two HTTP servers received is counted once, no probe permit or running
// idempotency claim is left in Redis (nor in an instance's own memory), and both instances answer at once. Seeded
// (STORMGATE_FUZZ_SEED), so a failure can be replayed.
import { request as httpRequest } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import type { FastifyInstance } from 'fastify';
import { Redis } from 'ioredis';
import OpenAI from 'openai';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { createLogger } from '../src/observability/logger.ts';
import { createMetrics } from '../src/observability/metrics.ts';
import { seededRandom } from '../src/policy/random.ts';
import { buildServer } from '../src/server.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { keyedShape, leftOver, MODELS, plan, PRIMARY_FAULTS, run, SLOTS, socketsTo, STORM_PROVIDER, STORM_ROUTE, sums, tally, type Ending } from './helpers/cancel-storm.ts';
import { TEST_KEY, testLogSink, useExtraMocks } from './helpers/stack.ts';

const redis = useRedisServer();
const startMock = useExtraMocks();
const started: FastifyInstance[] = [];
afterEach(async () => {
  await Promise.all(started.splice(0).map((g) => g.close()));
});

const SEED = Number(process.env.STORMGATE_FUZZ_SEED ?? 20_261_204);
const CHAT = '/v1/chat/completions';

/**
 * As test/cancel-fuzz.test.ts, on a fleet: `solo-*` models have the primary alone (they park through its hold-offs and
 * open breaker), every other model fails over to the Anthropic backup. The fleet shares each pool's `maxConcurrent`.
 */
function fleetConfig(primaryUrl: string, backupUrl: string, redisUrl: string, keyPrefix: string): ConfigInput {
  return {
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    // A command timeout a loaded machine keeps to: the outage here is Redis stopped, not a slow command.
    state: { redis: redisUrl, keyPrefix, commandTimeoutMs: 300 },
    providers: {
      mock: { family: 'openai', baseUrl: `${primaryUrl}/v1`, apiKey: TEST_KEY, ...STORM_PROVIDER },
      backup: { family: 'anthropic', baseUrl: backupUrl, apiKey: 'backup-key', ...STORM_PROVIDER },
    },
    routes: [
      { name: 'solo', match: { path: CHAT, models: ['solo-*'] }, targets: [{ provider: 'mock' }], ...STORM_ROUTE },
      { name: 'chat', match: { path: CHAT }, targets: [{ provider: 'mock' }, { provider: 'backup', model: 'claude-sonnet-4-5' }], ...STORM_ROUTE },
    ],
  };
}

/** Anthropic's overloaded answer (529) now and then, and streams that take their time. */
const BACKUP_FAULTS = { latencyMs: 60, latencyJitterMs: 60, errors: [{ status: 529, rate: 0.1 }], stream: { chunks: 4, chunkDelayMs: 40 } };

/** A request whose body goes out in pieces over a few hundred ms, cut after `cutAfterPieces` (none: sent whole). */
interface Upload {
  at: number;
  model: string;
  stream: boolean;
  batch: boolean;
  padBytes: number;
  /** A key of the uploads' own (`slow-key-*`: the body follows the key, so repeats are the same request). */
  key?: string;
  /** x-stormgate-timeout-ms short enough, now and then, for the deadline to pass mid-upload (504 with the body unread). */
  timeoutMs?: number;
  pieces: number;
  pieceGapMs: number;
  cutAfterPieces?: number;
  /** Sent whole: the client leaves this long after its last piece (none: it reads the answer). */
  leaveAfterMs?: number;
  startAtMs: number;
}

/** The slow uploads: most cut after a few pieces, the rest sent whole and then read, or left at a random moment. */
function planUploads(random: () => number, n: number, spreadMs: number): Upload[] {
  return Array.from({ length: n }, () => {
    const pieces = 4 + Math.floor(random() * 5);
    const whole = random() < 0.35;
    const key = random() < 0.25 ? `slow-key-${Math.floor(random() * 4)}` : undefined;
    const shape = key ? keyedShape(key) : { model: MODELS[Math.floor(random() * MODELS.length)]!, stream: random() < 0.5 };
    return {
      at: random() < 0.5 ? 0 : 1,
      ...shape,
      batch: random() < 0.4,
      padBytes: key ? 20_000 + key.length : 2_000 + Math.floor(random() * 60_000),
      key,
      timeoutMs: random() < 0.15 ? 300 + Math.floor(random() * 500) : undefined,
      pieces,
      pieceGapMs: 40 + Math.floor(random() * 100),
      ...(whole ? (random() < 0.5 ? { leaveAfterMs: Math.floor(random() * 1_500) } : {}) : { cutAfterPieces: 1 + Math.floor(random() * (pieces - 1)) }),
      startAtMs: Math.floor(random() * spreadMs),
    };
  });
}

/** An upload's body; under a key, the same for every upload of that key. */
function uploadBody(u: Pick<Upload, 'key' | 'model' | 'stream' | 'padBytes'>): string {
  return JSON.stringify({ model: u.model, stream: u.stream, messages: [{ role: 'user', content: `${u.key ?? 'slow'} ${'x'.repeat(u.padBytes)}` }] });
}

/** The body an SDK call under `key` sends (as the openai SDK serialises it). */
function sdkBody(key: string): string {
  const { model, stream } = keyedShape(key);
  return JSON.stringify({ model, messages: [{ role: 'user', content: `call under ${key}` }], ...(stream && { stream: true }) });
}

/** One slow upload over a connection of its own; how it ended. */
async function upload(urls: string[], u: Upload): Promise<Ending> {
  await sleep(u.startAtMs);
  const body = Buffer.from(uploadBody(u));
  const { hostname, port } = new URL(urls[u.at]!);
  const headers: Record<string, string | number> = { 'content-type': 'application/json', 'content-length': body.length, authorization: 'Bearer sk-client' };
  if (u.batch) headers['x-stormgate-priority'] = 'batch';
  if (u.key) headers['idempotency-key'] = u.key;
  if (u.timeoutMs) headers['x-stormgate-timeout-ms'] = u.timeoutMs;
  return new Promise<Ending>((resolve) => {
    const req = httpRequest({ hostname, port, path: CHAT, method: 'POST', headers, agent: false });
    let settled = false;
    const end = (e: Ending) => {
      if (settled) return;
      settled = true;
      resolve(e);
    };
    req.on('error', () => end('aborted'));
    req.on('response', (res) => {
      res.on('error', () => end('aborted'));
      res.on('close', () => end(res.complete ? (res.statusCode === 200 ? 'ok' : `status ${res.statusCode!}`) : 'aborted'));
      res.resume();
    });
    req.flushHeaders();
    void (async () => {
      const size = Math.ceil(body.length / u.pieces);
      for (let p = 0; p < u.pieces; p++) {
        if (u.cutAfterPieces === p) {
          req.destroy();
          return end('aborted');
        }
        req.write(body.subarray(p * size, (p + 1) * size));
        await sleep(u.pieceGapMs);
      }
      req.end();
      if (u.leaveAfterMs !== undefined) {
        await sleep(u.leaveAfterMs);
        if (!settled) req.destroy();
        end('aborted');
      }
    })();
  });
}

/** Keys of the fleet's prefix, with what a leak looks like in each: a live permit, a running claim, no expiry. */
async function stuckKeys(admin: Redis, prefix: string): Promise<string[]> {
  const stuck: string[] = [];
  const now = Number((await admin.time())[0]) * 1000;
  let cursor = '0';
  do {
    const [next, keys] = await admin.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 500);
    cursor = next;
    for (const key of keys) {
      const pttl = await admin.pttl(key);
      if (pttl === -1) stuck.push(`${key}: no expiry`);
      if (key.endsWith(':permits')) {
        // A permit goes back once its probe's verdict is written: with nothing running, none may be live.
        const live = await admin.zrangebyscore(key, now, '+inf', 'WITHSCORES');
        if (live.length > 0) stuck.push(`${key}: live permits ${JSON.stringify(live)} (now ${now})`);
      }
      if (key.includes(':idempotency:')) {
        const value = (await admin.getBuffer(key))?.subarray(0, 200).toString('utf8') ?? '';
        if (value.startsWith('{"state":"running"')) stuck.push(`${key}: running claim, pttl ${pttl}: ${value.trim()}`);
      }
    }
  } while (cursor !== '0');
  return stuck;
}

describe('random client cancellations on a fleet sharing Redis', () => {
  it(`leak nothing on either instance, in Redis or at the providers through a Redis restart, and count every request once (seed ${SEED})`, async () => {
    const primary = await startMock({ faults: PRIMARY_FAULTS, apiKey: TEST_KEY, seed: SEED });
    const backup = await startMock({ faults: BACKUP_FAULTS, apiKey: 'backup-key', seed: SEED + 1 });
    const r = redis();
    const keyPrefix = `fleetfuzz${process.pid}`;
    const config = ConfigSchema.parse(fleetConfig(primary.url, backup.url, r.url, keyPrefix));
    const logs: string[] = [];
    const urls: string[] = [];
    // Requests the two HTTP servers received on the chat path (those cut before they left the client never came).
    let received = 0;
    for (let i = 0; i < 2; i++) {
      const g = await buildServer(config, { logger: createLogger(config, testLogSink(logs)), metrics: createMetrics({ defaultMetrics: false }) });
      started.push(g);
      g.server.on('request', (req: { url?: string }) => {
        if (req.url?.startsWith(CHAT)) received++;
      });
      urls.push(await g.listen({ host: '127.0.0.1', port: 0 }));
    }
    const clients = urls.map((u) => new OpenAI({ baseURL: `${u}/v1`, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0, timeout: 20_000 }));
    const random = seededRandom(SEED);
    const calls = plan(random, 260, 6_000, 'fleet', 2);
    const uploads = planUploads(random, 40, 6_000);

    // Brownouts of the primary (its breakers open: solo parks, chat fails over to Anthropic), and Redis stopped in the
    // middle of it all, then started again empty.
    const brownouts = [setTimeout(() => primary.brownout('503', 1_200), 1_500), setTimeout(() => primary.brownout('hang', 800), 4_500)];
    const outage = (async () => {
      await sleep(2_500);
      await r.stop();
      await sleep(800);
      await r.restart();
    })();
    const [sdk, slow] = await Promise.all([Promise.all(calls.map((c) => run(clients, c))), Promise.all(uploads.map((u) => upload(urls, u))), outage]);
    brownouts.forEach(clearTimeout);
    const what = `sdk ${JSON.stringify(tally(sdk))} uploads ${JSON.stringify(tally(slow))} (seed ${SEED})`;

    await vi.waitFor(
      async () => {
        const texts = await Promise.all(urls.map(async (u) => (await fetch(`${u}/metrics`)).text()));
        for (const [i, text] of texts.entries()) expect(leftOver(text), `instance ${i}: gauges not back at zero; ${what}`).toEqual([]);
        const counted = texts.reduce((n, t) => n + (sums(t).get('stormgate_requests_total') ?? 0), 0);
        expect(counted, `requests counted vs received; ${what}`).toBe(received);
        expect(primary.stats().inflight, `requests still running at the primary; ${what}`).toBe(0);
        expect(backup.stats().inflight, `requests still running at the backup; ${what}`).toBe(0);
      },
      { timeout: 15_000, interval: 100 },
    );
    expect(sdk.filter((e) => e === 'aborted').length).toBeGreaterThan(40);
    expect(backup.stats().total, 'the Anthropic backup served some').toBeGreaterThan(0);
    for (const port of [primary.port, backup.port]) expect(socketsTo(port)).toBeLessThanOrEqual(2 * SLOTS);

    // Both back on Redis, and nothing left there: no live permit, no running claim, no key without an expiry.
    await vi.waitFor(async () => {
      for (const u of urls) expect(((await (await fetch(`${u}/readyz`)).json()) as { degraded: boolean }).degraded).toBe(false);
    }, { timeout: 10_000, interval: 100 });
    const admin = new Redis(r.url);
    try {
      await vi.waitFor(async () => expect(await stuckKeys(admin, keyPrefix), what).toEqual([]), { timeout: 3_000, interval: 200 });
    } finally {
      admin.disconnect();
    }

    // No key is left in progress in an instance's own memory either: a repeat on each instance runs or gets the
    // answer, and is never told the key is in progress.
    const keyed = new Map<string, string>();
    for (const c of calls) if (c.key) keyed.set(c.key, sdkBody(c.key));
    for (const u of uploads) if (u.key) keyed.set(u.key, uploadBody(u));
    for (const at of [0, 1]) {
      const repeats = await Promise.all(
        [...keyed].map(async ([key, body]) => {
          const res = await fetch(`${urls[at]}${CHAT}`, {
            method: 'POST',
            headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-stormgate-timeout-ms': '2000' },
            body,
          });
          const text = await res.text();
          return { key, status: res.status, code: res.status >= 400 ? (JSON.parse(text) as { error?: { code?: string } }).error?.code : undefined };
        }),
      );
      // (Not 422 either: the repeat is the very request, so it meets the key's record.)
      const refused = repeats.filter((x) => x.code === 'idempotency_key_in_progress' || x.code === 'idempotency_key_reused');
      expect(refused, `instance ${at}: keys left in progress; ${what}`).toEqual([]);
    }

    // A fresh request on each instance is answered promptly (a model the faults leave alone).
    for (const client of clients) {
      const t0 = Date.now();
      await client.chat.completions.create({ model: 'fresh', messages: [{ role: 'user', content: 'still there?' }] });
      expect(Date.now() - t0).toBeLessThan(3_000);
    }
  }, 60_000);
});
