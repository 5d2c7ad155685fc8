// Random client cancellations must leak nothing. A few hundred openai SDK calls (streamed and not, online and batch,
// some under idempotency keys, some with their own deadline) go through a small pool to a faulty provider with a
// backup, and a random share of them is cancelled at a random moment: before the headers, queued for a slot, parked,
// in a backoff, mid-stream. Once all have settled, every slot, queue place, parked request and waiting body must be
// given back, no request may still run at the provider, every request must be counted once, and the gateway must serve
// a second wave as it served the first. The storm is seeded (STORMGATE_FUZZ_SEED), so a failure can be replayed.
import OpenAI from 'openai';
import { describe, expect, it, vi } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import type { MockServer, MockStats } from '../src/mock/server.ts';
import { seededRandom } from '../src/policy/random.ts';
import { leftOver, plan, PRIMARY_FAULTS, run, SLOTS, socketsTo, STORM_PROVIDER, STORM_ROUTE, sums, tally, type Call } from './helpers/cancel-storm.ts';
import { TEST_KEY, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';

const start = useStacks();
const startBackup = useExtraMocks();

const SEED = Number(process.env.STORMGATE_FUZZ_SEED ?? 20_261_203);

/**
 * Two routes on the chat path: `solo-*` models have the primary alone (so they park through its hold-offs and open
 * breaker), every other model fails over to the backup. A small pool, quick breakers, short timers.
 */
function fuzzConfig(mockUrl: string, backupUrl: string): ConfigInput {
  return {
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    providers: {
      mock: { family: 'openai', baseUrl: `${mockUrl}/v1`, apiKey: TEST_KEY, ...STORM_PROVIDER },
      backup: { family: 'openai', baseUrl: `${backupUrl}/v1`, apiKey: 'backup-key', ...STORM_PROVIDER },
    },
    routes: [
      { name: 'solo', match: { path: '/v1/chat/completions', models: ['solo-*'] }, targets: [{ provider: 'mock' }], ...STORM_ROUTE },
      { name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }, { provider: 'backup' }], ...STORM_ROUTE },
    ],
  };
}

const BACKUP_FAULTS = { latencyMs: 60, latencyJitterMs: 60, errors: [{ status: 503, rate: 0.1 }], stream: { chunks: 4, chunkDelayMs: 40 } };

async function mockStats(mock: MockServer): Promise<MockStats> {
  return (await (await fetch(`${mock.url}/_mock/stats`)).json()) as MockStats;
}

/** Fires one wave; resolves once every call has settled, with how they ended. */
async function wave(client: OpenAI, calls: Call[]): Promise<Record<string, number>> {
  return tally(await Promise.all(calls.map((c) => run([client], c))));
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
