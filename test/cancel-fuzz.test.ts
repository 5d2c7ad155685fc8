// Random client cancellations must leak nothing. A few hundred openai SDK calls (streamed and not, online and batch,
// some under idempotency keys, some with their own deadline) go through a small pool to a faulty provider with a
// backup, and a random share of them is cancelled at a random moment: before the headers, queued for a slot, parked,
// in a backoff, mid-stream. Once all have settled, every slot, queue place, parked request and waiting body must be
// given back, no request may still run at the provider, every request must be counted once, and the gateway must serve
// a second wave as it served the first. The storm is seeded (STORMGATE_FUZZ_SEED), so a failure can be replayed.
import { Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it, vi } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import type { MockServer, MockStats } from '../src/mock/server.ts';
import { seededRandom } from '../src/policy/random.ts';
import { TEST_KEY, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';

const start = useStacks();
const startBackup = useExtraMocks();

const SEED = Number(process.env.STORMGATE_FUZZ_SEED ?? 20_261_203);
const SLOTS = 4;

/**
 * Two routes on the chat path: `solo-*` models have the primary alone (so they park through its hold-offs and open
 * breaker), every other model fails over to the backup. A small pool, quick breakers, short timers.
 */
function fuzzConfig(mockUrl: string, backupUrl: string): ConfigInput {
  const pools = { maxConcurrent: SLOTS, classes: { online: { minShare: 0.5, maxQueue: 40 }, batch: { minShare: 0.25, maxQueue: 40 } } };
  const breaker = { consecutiveFailures: 3, minRequests: 10, openS: 1, probeWhileParkedMs: 200, probeWhileParkedMaxMs: 400 };
  const timeouts = { connectMs: 1_000, firstTokenMs: 1_500, idleMs: 700, responseMs: 2_500 };
  const policy = {
    timeoutMs: 6_000,
    minAttemptMs: 300,
    retry: { maxAttempts: 3, backoff: { baseMs: 300, capMs: 1_000 }, maxWaitHintMs: 2_000 },
    budget: { ratio: 1, windowS: 10, minRetriesPerSecond: 50 },
    park: { maxQueue: 60 },
  };
  return {
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    providers: {
      mock: { family: 'openai', baseUrl: `${mockUrl}/v1`, apiKey: TEST_KEY, maxConnections: SLOTS, pools, breaker, timeouts },
      backup: { family: 'openai', baseUrl: `${backupUrl}/v1`, apiKey: 'backup-key', maxConnections: SLOTS, pools, breaker, timeouts },
    },
    routes: [
      { name: 'solo', match: { path: '/v1/chat/completions', models: ['solo-*'] }, targets: [{ provider: 'mock' }], ...policy },
      { name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }, { provider: 'backup' }], ...policy },
    ],
  };
}

/** Per model: latency, 429 with retry-after, 503, hangs, a slow first token, streams that stall mid-way. */
const PRIMARY_FAULTS = {
  latencyMs: 40,
  latencyJitterMs: 120,
  stream: { chunks: 6, chunkDelayMs: 40 },
  models: {
    'gpt-4o': { errors: [{ status: 503, rate: 0.15 }, { status: 429, rate: 0.1, headers: { 'retry-after': '1' } }], hangRate: 0.03 },
    'slow-first': { stream: { chunks: 5, firstTokenDelayMs: 700, chunkDelayMs: 60 }, latencyMs: 150 },
    staller: { stream: { chunks: 6, chunkDelayMs: 30, stallAfterChunks: 2 } },
    'solo-a': { errors: [{ status: 503, rate: 0.3 }, { status: 429, rate: 0.1, headers: { 'retry-after-ms': '800' } }] },
  },
};
const BACKUP_FAULTS = { latencyMs: 60, latencyJitterMs: 60, errors: [{ status: 503, rate: 0.1 }], stream: { chunks: 4, chunkDelayMs: 40 } };

const MODELS = ['gpt-4o', 'gpt-4o', 'gpt-4o', 'slow-first', 'staller', 'solo-a', 'solo-a'];

type Cancel = { kind: 'none' } | { kind: 'early' | 'timed'; afterMs: number } | { kind: 'mid-stream'; afterChunks: number };

interface Call {
  i: number;
  model: string;
  stream: boolean;
  batch: boolean;
  key?: string;
  timeoutMs?: number;
  cancel: Cancel;
  startAtMs: number;
}

/** The storm's calls, drawn from the seeded source: arrival times over `spreadMs`, each one's shape and cancellation. */
function plan(random: () => number, n: number, spreadMs: number, wave: string): Call[] {
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(random() * xs.length)]!;
  return Array.from({ length: n }, (_, i) => {
    const stream = random() < 0.5;
    const r = random();
    const cancel: Cancel =
      r < 0.45 ? { kind: 'none' }
      : r < 0.55 ? { kind: 'early', afterMs: Math.floor(random() * 30) }
      : r < 0.85 || !stream ? { kind: 'timed', afterMs: 30 + Math.floor(random() * 3_000) }
      : { kind: 'mid-stream', afterChunks: 1 + Math.floor(random() * 3) };
    return {
      i,
      model: pick(MODELS),
      stream,
      batch: random() < 0.4,
      // A few keys, so repeats meet their run in flight and after its answer.
      key: random() < 0.2 ? `${wave}-key-${Math.floor(random() * 12)}` : undefined,
      timeoutMs: random() < 0.3 ? 800 + Math.floor(random() * 4_000) : undefined,
      cancel,
      startAtMs: Math.floor(random() * spreadMs),
    };
  });
}

type Ending = 'ok' | 'aborted' | `status ${number}` | `error ${string}`;

/** One SDK call as planned; how it ended. A keyed call's body follows its key, so repeats are the same call. */
async function run(client: OpenAI, c: Call): Promise<Ending> {
  await sleep(c.startAtMs);
  const ctrl = new AbortController();
  const timer = c.cancel.kind === 'early' || c.cancel.kind === 'timed' ? setTimeout(() => ctrl.abort(), c.cancel.afterMs) : undefined;
  const headers: Record<string, string> = {};
  if (c.batch) headers['x-stormgate-priority'] = 'batch';
  if (c.key) headers['Idempotency-Key'] = c.key;
  if (c.timeoutMs) headers['x-stormgate-timeout-ms'] = String(c.timeoutMs);
  const messages = [{ role: 'user' as const, content: c.key ? `call under ${c.key}` : `call ${c.i}` }];
  // The key decides the body (model, stream or not), so a repeat is never 422 idempotency_key_reused.
  const h = c.key ? [...c.key].reduce((a, ch) => (a * 31 + ch.charCodeAt(0)) >>> 0, 7) : 0;
  const stream = c.key ? h % 2 === 0 : c.stream;
  const model = c.key ? MODELS[(h >>> 1) % MODELS.length]! : c.model;
  try {
    if (stream) {
      const s = await client.chat.completions.create({ model, messages, stream: true }, { headers, signal: ctrl.signal });
      let chunks = 0;
      for await (const chunk of s) {
        if (chunk.choices[0]?.delta?.content) chunks++;
        if (c.cancel.kind === 'mid-stream' && chunks >= c.cancel.afterChunks) ctrl.abort();
      }
    } else {
      await client.chat.completions.create({ model, messages }, { headers, signal: ctrl.signal });
    }
    return 'ok';
  } catch (err) {
    if (ctrl.signal.aborted || err instanceof OpenAI.APIUserAbortError) return 'aborted';
    if (err instanceof OpenAI.APIError && err.status !== undefined) return `status ${err.status}`;
    return `error ${(err as Error).message.slice(0, 60)}`;
  } finally {
    clearTimeout(timer);
  }
}

/** The sum of the series of one metric (every label set) on a gateway's /metrics, by the metric's name. */
function sums(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (line.startsWith('#') || line === '') continue;
    const name = line.slice(0, line.search(/[{ ]/));
    out.set(name, (out.get(name) ?? 0) + Number(line.split(' ').at(-1)));
  }
  return out;
}

/** Series of the gauges that must be back at zero once nothing runs, with their values when they are not. */
function leftOver(text: string): string[] {
  const gauges = ['stormgate_pool_in_use', 'stormgate_pool_queue_depth', 'stormgate_waiting_body_bytes', 'stormgate_parked_requests'];
  return text.split('\n').filter((l) => gauges.some((g) => l.startsWith(`${g}{`) || l.startsWith(`${g} `)) && !l.endsWith(' 0'));
}

/** Sockets of this process connected to a port (the gateway's connections to a mock: the mocks answer in the same process). */
function socketsTo(port: number): number {
  const handles = (process as unknown as { _getActiveHandles(): unknown[] })._getActiveHandles();
  return handles.filter((h) => h instanceof Socket && h.remotePort === port && !h.destroyed).length;
}

async function mockStats(mock: MockServer): Promise<MockStats> {
  return (await (await fetch(`${mock.url}/_mock/stats`)).json()) as MockStats;
}

/** Fires one wave; resolves once every call has settled, with how they ended. */
async function wave(client: OpenAI, calls: Call[]): Promise<Record<string, number>> {
  const endings = await Promise.all(calls.map((c) => run(client, c)));
  const tally: Record<string, number> = {};
  for (const e of endings) tally[e] = (tally[e] ?? 0) + 1;
  return tally;
}

/** Waits (generously: a loaded 2-core machine, keyed runs going on without their clients) until nothing is left running. */
async function settled(s: Stack, backup: MockServer, received: () => number, what: string): Promise<void> {
  await vi.waitFor(
    async () => {
      const text = await (await fetch(`${s.url}/metrics`)).text();
      expect(leftOver(text), `${what}: gauges not back at zero (seed ${SEED})`).toEqual([]);
      // Each request the gateway received is counted once, answered or abandoned.
      expect(sums(text).get('stormgate_requests_total'), `${what}: requests counted vs received (seed ${SEED})`).toBe(received());
      expect((await mockStats(s.mock)).inflight, `${what}: requests still running at the primary (seed ${SEED})`).toBe(0);
      expect((await mockStats(backup)).inflight, `${what}: requests still running at the backup (seed ${SEED})`).toBe(0);
    },
    { timeout: 12_000, interval: 100 },
  );
}

describe('random client cancellations under faults', () => {
  it(`leak no slot, queue place, parked request, waiting body or upstream request, and count every request once (seed ${SEED})`, async () => {
    const backup = await startBackup({ apiKey: 'backup-key', faults: BACKUP_FAULTS, seed: SEED });
    const s = await start({ faults: PRIMARY_FAULTS, config: (url) => fuzzConfig(url, backup.url) });
    // Requests the gateway's HTTP server received on the chat path: those cancelled before they left the client never came.
    let received = 0;
    s.gateway.server.on('request', (req: { url?: string }) => {
      if (req.url?.startsWith('/v1/chat/completions')) received++;
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0, timeout: 20_000 });
    const random = seededRandom(SEED);

    // Two brownouts of the primary in the first wave: its breakers open (solo parks, chat fails over), then it hangs.
    const brownouts = [setTimeout(() => s.mock.brownout('503', 1_200), 2_000), setTimeout(() => s.mock.brownout('hang', 800), 4_500)];
    const first = await wave(client, plan(random, 300, 6_000, 'w1'));
    brownouts.forEach(clearTimeout);
    await settled(s, backup, () => received, `after the first wave ${JSON.stringify(first)}`);
    expect(first.aborted ?? 0).toBeGreaterThan(50);

    // The connections to each provider are the pool's keep-alive ones, no more.
    expect(socketsTo(s.mock.port)).toBeLessThanOrEqual(SLOTS);
    expect(socketsTo(backup.port)).toBeLessThanOrEqual(SLOTS);

    // A fresh request is answered promptly (a model the faults leave alone).
    const t0 = Date.now();
    await client.chat.completions.create({ model: 'fresh', messages: [{ role: 'user', content: 'still there?' }] });
    expect(Date.now() - t0).toBeLessThan(3_000);

    // The second wave behaves as the first, and leaves nothing behind either.
    const second = await wave(client, plan(random, 120, 3_000, 'w2'));
    await settled(s, backup, () => received, `after the second wave ${JSON.stringify(second)}`);
    expect(socketsTo(s.mock.port)).toBeLessThanOrEqual(SLOTS);
    expect(socketsTo(backup.port)).toBeLessThanOrEqual(SLOTS);
    expect(second.ok ?? 0).toBeGreaterThan(0);
  }, 60_000);
});
