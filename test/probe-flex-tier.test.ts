// A parked flex-tier request released as the breaker's probe, answered with Groq's 498 capacity_exceeded: the answer is
// the flex tier's, not the target's, so the default-tier request parked behind it must be the next probe at once, on
// this instance and on another that shares the breaker through Redis, not twice probeWhileParkedMs later (the wait an
// inconclusive probe starts). Driven with the official `openai` SDK against a scripted Groq; bounds are generous: the
// wrong behaviour waits at least 4.2 s, the right one a round trip (about 0.2 s) and, across the fleet, the permit poll of a second.
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { completion, json, scripted, type Script, type Seen } from './helpers/scripted-provider.ts';
import { useGateways } from './helpers/stack.ts';

const redisServer = useRedisServer();
const startGateway = useGateways();
const startProvider = useFakeProviders();

const messages = [{ role: 'user' as const, content: 'Summarise the incident report.' }];
const GROQ_498 = { error: { message: 'Flex tier capacity exceeded. Please try again later.', type: 'invalid_request_error', code: 'capacity_exceeded' } };
const PARKED_WAIT_MS = 2_000;

/** Groq, down (503) until `up()`; then a flex request gets a 498 (200 ms later), any other an answer. Each request's arrival time is kept. */
function groq() {
  const seen: Seen[] = [];
  const at: Array<{ tier: string; ms: number }> = [];
  let down = true;
  const answer = (body: Record<string, unknown>): Script => {
    at.push({ tier: String(body.service_tier ?? 'default'), ms: performance.now() });
    if (down) return json(503, { error: { message: 'down', type: 'server_error', code: null } });
    if (body.service_tier !== 'flex') return completion('from groq', 'llama-3.3-70b-versatile');
    const answer498 = json(498, GROQ_498);
    return { ...answer498, steps: [200, ...answer498.steps] };
  };
  return { seen, at, answer, up: () => (down = false) };
}

async function gateways(n: number, g: ReturnType<typeof groq>, redis: boolean): Promise<OpenAI[]> {
  const p = await startProvider(scripted(g.answer, g.seen));
  const input: ConfigInput = {
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    providers: {
      groq: {
        family: 'openai',
        baseUrl: `${p.origin}/v1`,
        apiKey: 'groq-key-0123456789',
        breaker: { consecutiveFailures: 2, openS: 30, probeWhileParkedMs: PARKED_WAIT_MS, probeWhileParkedMaxMs: 4 * PARKED_WAIT_MS },
      },
    },
    routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'groq', model: 'llama-3.3-70b-versatile' }], retry: { maxAttempts: 1 }, timeoutMs: 20_000 }],
    ...(redis && { state: { redis: redisServer().url, keyPrefix: `probeflex${process.pid}`, commandTimeoutMs: 1000 } }),
  };
  const config = ConfigSchema.parse(input);
  const urls: string[] = [];
  for (let i = 0; i < n; i++) urls.push(await startGateway(config));
  return urls.map((url) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sk-client', maxRetries: 0 }));
}

async function openBreaker(client: OpenAI, g: ReturnType<typeof groq>): Promise<void> {
  for (let i = 0; i < 2; i++) await client.chat.completions.create({ model: 'llama', messages }).catch(() => undefined);
  expect(g.at).toHaveLength(2);
  g.up();
}

/** How long after the flex probe reached Groq the default-tier request did. */
function gapMs(g: ReturnType<typeof groq>): number {
  const after = g.at.slice(2);
  expect(after.map((a) => a.tier)).toEqual(['flex', 'default']);
  return after[1]!.ms - after[0]!.ms;
}

describe("a flex request's probe answered with Groq's 498", () => {
  it('lets the default-tier request parked behind it probe at once, on the same instance', async () => {
    const g = groq();
    const [client] = await gateways(1, g, false);
    await openBreaker(client!, g);
    // Both park; the flex request's earlier deadline puts it first in the lot, so it is the probe.
    const flex = client!.chat.completions.create({ model: 'llama', messages, service_tier: 'flex' }, { headers: { 'x-stormgate-timeout-ms': '10000' } });
    const online = client!.chat.completions.create({ model: 'llama', messages }, { headers: { 'x-stormgate-timeout-ms': '15000' } });
    expect(await flex.then(() => 200, (e: { status?: number }) => e.status)).toBe(498);
    expect((await online).choices[0]!.message.content).toBe('from groq');
    // The 498 came 200 ms after the flex probe arrived; the default-tier probe must follow within a round trip.
    expect(gapMs(g)).toBeLessThan(PARKED_WAIT_MS);
  });

  it("lets another instance's parked default-tier request probe once the flex probe's permit is back, through Redis", async () => {
    const g = groq();
    const [a, b] = await gateways(2, g, true);
    await openBreaker(a!, g);
    await sleep(200); // the open breaker reaches the other instance by pub/sub
    const flex = a!.chat.completions.create({ model: 'llama', messages, service_tier: 'flex' }, { headers: { 'x-stormgate-timeout-ms': '10000' } });
    // The other instance's request comes once the flex probe is on its way: the permit is out, so it parks.
    while (g.at.length < 3) await sleep(10);
    const online = b!.chat.completions.create({ model: 'llama', messages }, { headers: { 'x-stormgate-timeout-ms': '15000' } });
    expect(await flex.then(() => 200, (e: { status?: number }) => e.status)).toBe(498);
    expect((await online).choices[0]!.message.content).toBe('from groq');
    // Not twice probeWhileParkedMs after the 498: at most the poll for a permit out elsewhere (a second).
    expect(gapMs(g)).toBeLessThan(PARKED_WAIT_MS + 1_500);
  });
});
