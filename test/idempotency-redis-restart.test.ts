// Idempotency keys across a Redis that stopped and came back empty, on a fleet of two gateways: what an instance kept
// in the process while Redis was away (a run it claimed there, an answer it kept there) reaches Redis once the instance
// is back on it, so a repeat on the other instance waits for that run or gets that answer, never runs the call again
// (README "Where keys live"; the coupon twice).
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { eventually } from './helpers/redis-stores.ts';
import { defaultConfig, useGateways, useStacks, type Stack } from './helpers/stack.ts';

const start = useStacks();
const startGateway = useGateways();
const redis = useRedisServer();

const BODY = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'give the user one coupon' }] };
const upstreamChats = (s: Stack, model: string) => s.mock.requests().filter((r) => r.path === '/v1/chat/completions' && r.model === model);

function post(url: string, key: string, model: string, timeoutMs?: number) {
  return fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key, ...(timeoutMs && { 'x-stormgate-timeout-ms': String(timeoutMs) }) },
    body: JSON.stringify({ ...BODY, model }),
  });
}

const fleetConfig = (s: Stack, extra: Partial<ConfigInput> = {}) =>
  ConfigSchema.parse({ ...defaultConfig(s.mock.url), state: { redis: redis().url, keyPrefix: `idem-restart-${Date.now()}-${Math.random()}` }, ...extra });

const degraded = async (url: string) => ((await (await fetch(`${url}/readyz`)).json()) as { degraded: boolean }).degraded;

/** Redis stopped, and both gateways serving on local state. */
async function stopRedis(urls: string[]): Promise<void> {
  await redis().stop();
  await eventually(async () => (await Promise.all(urls.map(degraded))).every(Boolean), 5_000);
}

/** Redis started again, empty, on its port, and both gateways back on it (each store's reconnect and health check). */
async function restartRedis(urls: string[]): Promise<void> {
  await redis().restart();
  await eventually(async () => !(await Promise.all(urls.map(degraded))).some(Boolean), 10_000);
}

describe('a run claimed in the process while Redis was away, on a fleet', () => {
  it('claims its key in Redis once its instance is back on it: a repeat on the other instance waits for it and gets its answer', { timeout: 60_000 }, async () => {
    // The run outlasts Redis's restart (up to 10 s on a loaded machine) and the two leases after it.
    const s = await start({ faults: { models: { 'gpt-4o-slow': { latencyMs: 18_000 } } } });
    // A short lease: the claim made in Redis again lapses within 2.5 s unless the run's renewals reach Redis too. Not
    // the 1 s minimum: an event loop starved for a second (a loaded 2-core CI machine, both gateways in this process)
    // misses every renewal of such a lease, and the claim lapses as the README says it then does.
    const config = fleetConfig(s, { idempotency: { leaseMs: 2500 } });
    const [a, b] = await Promise.all([startGateway(config), startGateway(config)]);
    await stopRedis([a, b]);
    let ended = false;
    const run = post(a, 'k-away', 'gpt-4o-slow').then(async (r) => {
      ended = true;
      return { status: r.status, body: await r.text() };
    });
    await sleep(300);
    await restartRedis([a, b]);
    // Two leases past A's return: its claim in Redis is held by the renewals alone.
    await sleep(5000);
    expect(ended).toBe(false);
    const repeat = await post(b, 'k-away', 'gpt-4o-slow', 25_000);
    const first = await run;
    expect(first.status).toBe(200);
    expect(repeat.status).toBe(200);
    expect(repeat.headers.get('idempotent-replayed')).toBe('true');
    expect(await repeat.text()).toBe(first.body);
    expect(upstreamChats(s, 'gpt-4o-slow')).toHaveLength(1);
  });

  it('writes the answer of a run that ended while Redis was away to Redis once its instance is back: a repeat on the other instance gets it', async () => {
    const s = await start();
    const config = fleetConfig(s);
    const [a, b] = await Promise.all([startGateway(config), startGateway(config)]);
    await stopRedis([a, b]);
    const first = await post(a, 'k-ended-away', 'gpt-4o');
    expect(first.status).toBe(200);
    const body = await first.text();
    await restartRedis([a, b]);
    const repeat = await post(b, 'k-ended-away', 'gpt-4o', 5_000);
    expect(repeat.status).toBe(200);
    expect(repeat.headers.get('idempotent-replayed')).toBe('true');
    expect(await repeat.text()).toBe(body);
    expect(upstreamChats(s, 'gpt-4o')).toHaveLength(1);
  });
});
