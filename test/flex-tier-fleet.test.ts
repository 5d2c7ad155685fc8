// A flex tier's hold-off and a location refusal's credential hold, shared by a fleet through one Redis: the gateway
// that never saw Groq's 498 holds its flex requests off Groq and still sends it default-tier ones, and the gateway that
// never saw the location refusal names the location, not the key, to the requests it turns away. Driven with the
// official `openai` SDK against a scripted provider.
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { sdkError } from './helpers/openai-error.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { completion, json, scripted, type Answer, type Seen } from './helpers/scripted-provider.ts';
import { useGateways } from './helpers/stack.ts';

const redisServer = useRedisServer();
const startGateway = useGateways();
const startProvider = useFakeProviders();

const messages = [{ role: 'user' as const, content: 'Summarise the incident report.' }];
const GROQ_498 = { error: { message: 'Flex tier capacity exceeded. Please try again later.', type: 'invalid_request_error', code: 'capacity_exceeded' } };

/** Two gateways on one Redis whose chat route goes to one provider, played by `answer`. */
async function fleet(answer: Answer, prefix: string): Promise<{ clients: OpenAI[]; seen: Seen[] }> {
  const seen: Seen[] = [];
  const p = await startProvider(scripted(answer, seen));
  const input: ConfigInput = {
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    providers: { groq: { family: 'openai', baseUrl: `${p.origin}/v1`, apiKey: 'groq-key-0123456789', breaker: false } },
    routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'groq', model: 'llama-3.3-70b-versatile' }], park: false }],
    // A generous command timeout: a busy machine's slow first command must not put an instance on local state.
    state: { redis: redisServer().url, keyPrefix: `${prefix}${process.pid}`, commandTimeoutMs: 1000 },
  };
  const config = ConfigSchema.parse(input);
  const urls = [await startGateway(config), await startGateway(config)];
  return { seen, clients: urls.map((url) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sk-client', maxRetries: 0 })) };
}

describe('a flex tier hold-off across a fleet on one Redis', () => {
  it("holds the other gateway's flex requests off Groq, and lets its default-tier requests through", async () => {
    const { clients, seen } = await fleet((body) => (body.service_tier === 'flex' ? json(498, GROQ_498, { 'retry-after': '5' }) : completion('from groq', 'llama-3.3-70b-versatile')), 'flex');
    expect((await sdkError(clients[0]!.chat.completions.create({ model: 'llama', messages, service_tier: 'flex' }))).status).toBe(498);
    await sleep(200); // the hold-off reaches the other instance by pub/sub
    const held = await sdkError(clients[1]!.chat.completions.create({ model: 'llama', messages, service_tier: 'flex' }));
    expect(held.status).toBe(429);
    expect((held.error as { code?: string }).code).toBe('provider_held_off');
    const online = await clients[1]!.chat.completions.create({ model: 'llama', messages });
    expect(online.choices[0]!.message.content).toBe('from groq');
    expect(seen.map((s) => s.body.service_tier ?? 'none')).toEqual(['flex', 'none']);
  });

  it('names the location to the requests the other gateway turns away under the hold a location refusal started', async () => {
    const refusal = { error: { message: 'Country, region, or territory not supported', type: 'request_forbidden', code: 'unsupported_country_region_territory' } };
    const { clients, seen } = await fleet(() => json(403, refusal), 'loc');
    expect((await sdkError(clients[0]!.chat.completions.create({ model: 'llama', messages }))).status).toBe(502);
    await sleep(200);
    const held = await sdkError(clients[1]!.chat.completions.create({ model: 'llama', messages }));
    expect(held.status).toBe(502);
    expect(held.message).toContain('does not serve the location the gateway calls from (unsupported_country_region_territory)');
    expect(held.message).toMatch(/is not used for another \d+ s/);
    expect(seen).toHaveLength(1);
  });
});
