// An SRE's reading of a fleet's metrics after an incident: summed over the instances, the counters must agree with
// what the provider saw. Three gateways on one real Redis in front of the bundled mock.
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { startMock, type FaultSpec, type MockServer } from '../src/mock/server.ts';
import { chatStatus as chat, defaultConfig, TEST_KEY, useGateways } from './helpers/stack.ts';
import { startRedis, type RedisHandle } from './helpers/redis-server.ts';

let redis: RedisHandle;
beforeAll(async () => {
  redis = await startRedis();
});
afterAll(async () => {
  await redis.stop();
});

let mock: MockServer | undefined;
afterEach(async () => {
  await mock?.close();
  mock = undefined;
});
const gateway = useGateways();

let prefixCounter = 0;

async function fleet(faults: FaultSpec, overrides: Parameters<typeof defaultConfig>[1]): Promise<{ mock: MockServer; urls: string[] }> {
  mock = await startMock({ faults, quiet: true, apiKey: TEST_KEY });
  const input: ConfigInput = {
    ...defaultConfig(mock.url, overrides),
    state: { redis: redis.url, keyPrefix: `fleet-sre${process.pid}-${prefixCounter++}`, commandTimeoutMs: 1000 },
  };
  const config = ConfigSchema.parse(input);
  const urls = [];
  for (let i = 0; i < 3; i++) urls.push(await gateway(config));
  return { mock, urls };
}

/** A counter summed over every instance's /metrics (every series whose line starts with `name`). */
async function fleetSum(urls: string[], name: string): Promise<number> {
  let sum = 0;
  for (const url of urls) {
    const text = await (await fetch(`${url}/metrics`)).text();
    for (const line of text.split('\n')) if (line.startsWith(name)) sum += Number(line.split(' ').at(-1));
  }
  return sum;
}

describe('a fleet\'s retry count after a brownout', () => {
  it('counts every retry the provider saw, those released from the parking lot and the probes included', async () => {
    // The first 503s open the breaker (two in a row); the requests that got them park, the lot's probes find the
    // provider back, and they are released: each goes upstream again, a retry (x-retry-attempt), as the provider sees.
    const f = await fleet(
      { errors: [{ status: 503, times: 6 }] },
      { route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 10, capMs: 10 } } }, provider: { breaker: { consecutiveFailures: 2, openS: 1 } } },
    );
    const statuses = await Promise.all(Array.from({ length: 12 }, (_, i) => chat(f.urls[i % 3]!)));
    expect(statuses.every((s) => s === 200)).toBe(true);
    await sleep(100);
    const retriesSeen = f.mock.requests().filter((r) => Number(r.headers['x-retry-attempt'] ?? 0) > 0).length;
    expect(retriesSeen).toBeGreaterThan(0);
    expect(await fleetSum(f.urls, 'stormgate_retry_count_total')).toBe(retriesSeen);
    // And the amplification the recording rules compute from the counters is what the provider saw.
    expect(await fleetSum(f.urls, 'stormgate_upstream_attempts_total')).toBe(f.mock.stats().total);
  });
});

describe('a fleet\'s shed count after a 429 storm', () => {
  it('counts as shed only the requests answered load_shed, not the ones that parked behind the release and were served', async () => {
    // A 429 with retry-after holds the target off fleet-wide; the requests that came meanwhile park, and are released
    // at the pool's limit once it ends. Newcomers during the release queue behind them in the lot (pacing), and are served.
    const f = await fleet(
      { latencyMs: 100, errors: [{ status: 429, times: 1, headers: { 'retry-after-ms': '400' } }] },
      { route: { retry: { maxAttempts: 3 } }, provider: { breaker: false, pools: { maxConcurrent: 2 } } },
    );
    const first = chat(f.urls[0]!);
    await sleep(50);
    const parked = Array.from({ length: 24 }, (_, i) => chat(f.urls[i % 3]!));
    await sleep(450);
    // The hold-off is over: the lot lets its requests go two at a time; these arrive behind them.
    const newcomers: Array<Promise<number>> = [];
    for (let i = 0; i < 12; i++) {
      newcomers.push(chat(f.urls[i % 3]!));
      await sleep(25);
    }
    const statuses = await Promise.all([first, ...parked, ...newcomers]);
    const answeredShed = statuses.filter((s) => s === 503 || s === 429).length;
    expect(await fleetSum(f.urls, 'stormgate_requests_total{route="chat",target="mock/gpt-4o",priority="online",outcome="shed"}')).toBe(answeredShed);
    expect(await fleetSum(f.urls, 'stormgate_shed_total')).toBe(answeredShed);
  });
});
