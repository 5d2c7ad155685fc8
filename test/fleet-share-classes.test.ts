// A fleet's maxConcurrent is handed out by class, not by raw demand: one instance flooded with batch and another
// serving online users must not leave the online users a sliver of the provider (the noisy neighbour, across instances).
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { fleetShare } from '../src/pools/fleet-share.ts';
import { ProviderPool } from '../src/pools/provider-pool.ts';
import { defaultConfig, TEST_KEY, useExtraMocks, useGateways } from './helpers/stack.ts';
import { useRedisServer } from './helpers/redis-server.ts';

const redisServer = useRedisServer();

const startGateway = useGateways();
const startMock = useExtraMocks();

const CLASSES = [
  { name: 'online', minShare: 0.7, maxQueue: 500 },
  { name: 'batch', minShare: 0.1, maxQueue: 20_000 },
];

describe('the fleet share of a pool', () => {
  it('gives an instance serving online users what they need, before another instance\'s batch flood', () => {
    // 24 slots; instance A: 150 batch requests, instance B: 13 online.
    const a = fleetShare(24, CLASSES, [0, 150], [13, 150], 2);
    const b = fleetShare(24, CLASSES, [13, 0], [13, 150], 2);
    expect(b * 24).toBeGreaterThanOrEqual(13);
    // Batch keeps at least its minShare, and the fleet stays within its capacity.
    expect(a * 24).toBeGreaterThanOrEqual(2.4);
    expect(a + b).toBeLessThanOrEqual(1 + 1e-9);
  });

  it('counts as demand the calls an instance served between two exchanges, not only those in flight at the exchange', async () => {
    // Online calls of 100 ms, one at a time: at the moment of an exchange there is mostly none in flight. Read as no
    // demand, the instance was left one slot of 6 while another instance's batch flood took the rest, and its calls met
    // the provider's 429s (test/third-party-suite-8.test.ts).
    const pool = new ProviderPool({ provider: 'p', capacity: 6, retryCapacity: 1, classes: CLASSES, decrease: 0.9, minLimit: 1 }, () => 0);
    const signal = new AbortController().signal;
    for (let i = 0; i < 2; i++) {
      const a = await pool.acquire({ cls: 0, target: 'p/m', retry: false, deadlineAtMs: 60_000, minAttemptMs: 0, signal });
      if (!a.ok) throw new Error('no slot');
      a.slot.release();
    }
    const demand = pool.demandByClass();
    expect(demand).toEqual([1, 0]);
    expect(fleetShare(6, CLASSES, demand, [1, 150], 2) * 6).toBeGreaterThanOrEqual(2);
    // The next exchange counts from this one: nothing since, nothing asked for.
    expect(pool.demandByClass()).toEqual([0, 0]);
  });

  it('splits an idle fleet evenly and a single class by demand, as before', () => {
    expect(fleetShare(24, CLASSES, [0, 0], [0, 0], 3)).toBeCloseTo(1 / 3);
    expect(fleetShare(6, CLASSES, [8, 0], [24, 0], 3)).toBeCloseTo(1 / 3);
  });

  it('keeps online traffic on one instance fast while another instance carries a batch flood', async () => {
    // The fleet's pool takes 8 at a time; each answer takes 300 ms. The provider takes more, so the moments when the
    // instances' shares overlap (exchanged twice a second, while the slots of the old share are still held) are not
    // 429s: what is checked is who waits.
    const mock = await startMock({ faults: { latencyMs: 300, capacity: 20 }, quiet: true, apiKey: TEST_KEY });
    const base = defaultConfig(mock.url, { route: { timeoutMs: 60_000 }, provider: { maxConnections: 64, pools: { maxConcurrent: 8, classes: { online: { minShare: 0.7, maxQueue: 500 }, batch: { minShare: 0.1, maxQueue: 20_000 } } } } });
    const input: ConfigInput = { ...base, state: { redis: redisServer().url, keyPrefix: `share${process.pid}`, commandTimeoutMs: 1000 } };
    const config = ConfigSchema.parse(input);
    const urls = [await startGateway(config), await startGateway(config)];
    const batchClient = new OpenAI({ baseURL: `${urls[0]}/v1`, apiKey: 'unused', maxRetries: 0, defaultHeaders: { 'x-stormgate-priority': 'batch' } });
    const onlineClient = new OpenAI({ baseURL: `${urls[1]}/v1`, apiKey: 'unused', maxRetries: 0 });
    const ask = (c: OpenAI) => c.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    let stop = false;
    // 60 batch agents on instance A, closed loop.
    const flood = Promise.all(Array.from({ length: 60 }, async () => {
      while (!stop) await ask(batchClient).catch(() => sleep(100));
    }));
    await sleep(1_500);
    // Online on instance B: 10 requests a second for 3 s, about 3 slots' worth.
    const latencies: number[] = [];
    const online: Promise<void>[] = [];
    try {
      for (let i = 0; i < 30; i++) {
        online.push((async () => {
          const t = Date.now();
          await ask(onlineClient);
          latencies.push(Date.now() - t);
        })());
        await sleep(100);
      }
      await Promise.all(online);
    } finally {
      // Also when an online request fails: the flood's agents must not outlive the test (they would loop for ever in
      // the worker, against gateways that are gone).
      stop = true;
      await flood;
    }
    latencies.sort((x, y) => x - y);
    // By total demand alone B got 1 of the 8 slots (2 of 62 demand): online waited seconds (its 30th request ~9 s,
    // 300 ms each through one slot). The slowest bound is generous: a loaded CI run saw 1.6 s, the tail of the machine.
    expect(latencies[Math.floor(latencies.length / 2)]!).toBeLessThan(700);
    expect(latencies.at(-1)!).toBeLessThan(3_000);
  }, 30_000);
});
