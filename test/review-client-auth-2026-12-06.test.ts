// Review of client keys and client limits (auth.keys, auth.limits) as a platform team serving many tenants meets them:
// the official openai and @anthropic-ai/sdk clients over real HTTP, a provider of the test's own, a throwaway Redis.
import { randomUUID } from 'node:crypto';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { clientLimits } from '../src/http/client-limits.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import { failsOnce, useFakeProviders } from './helpers/fake-provider.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { defaultConfig, parseMetrics, RETRY_LOOP_ONLY, TEST_KEY, useExtraMocks, useGateways } from './helpers/stack.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();
const startProvider = useFakeProviders();

const AGENTS_KEY = 'sg-review-1206-agents-3f9c';
const OTHER_KEY = 'sg-review-1206-other-7a2d';
const KEYS = { agents: AGENTS_KEY, other: OTHER_KEY };
const messages = [{ role: 'user' as const, content: 'hi' }];
const MODEL = 'claude-sonnet-4-5';

type Limits = NonNullable<ConfigInput['auth']>['limits'];

/** The bundled mock as an OpenAI provider (chat) and an Anthropic one (/v1/messages), behind client keys. */
async function tenants(limits?: Limits, extra: Partial<ConfigInput> = {}): Promise<{ url: string; logs: string[] }> {
  const mock = await startMock({ apiKey: TEST_KEY });
  const base = defaultConfig(mock.url, RETRY_LOOP_ONLY);
  const logs: string[] = [];
  const config = ConfigSchema.parse({
    ...base,
    providers: { ...base.providers, claude: { family: 'anthropic', baseUrl: mock.url, apiKey: TEST_KEY, breaker: false } },
    routes: [...base.routes, { name: 'messages', match: { path: '/v1/messages' }, targets: [{ provider: 'claude' }], ...RETRY_LOOP_ONLY.route }],
    auth: { keys: KEYS, ...(limits && { limits }) },
    ...extra,
  });
  return { url: await startGateway(config, { logs }), logs };
}

const post = (url: string, headers: Record<string, string>, body: object = { model: 'gpt-4o', messages }) =>
  fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });

describe('a client key as each SDK sends it', () => {
  it('is refused 401 in each family\'s shape, with www-authenticate, and never logged', async () => {
    const { url, logs } = await tenants();
    // Anthropic's SDK on /v1/messages: AuthenticationError, read from Anthropic's shape, with its request id; no retry.
    let sent = 0;
    const claude = new Anthropic({ baseURL: url, apiKey: `${AGENTS_KEY}x`, maxRetries: 2, fetch: (i, init) => (sent++, fetch(i, init)) });
    const err = await claude.messages.create({ model: MODEL, max_tokens: 16, messages }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Anthropic.AuthenticationError);
    const e = err as InstanceType<typeof Anthropic.AuthenticationError>;
    expect(e.error).toMatchObject({ type: 'error', error: { type: 'authentication_error' } });
    expect(e.requestID).toBeTruthy();
    expect(e.headers.get('www-authenticate')).toBe('Bearer realm="stormgate"');
    expect(sent).toBe(1);
    // OpenAI's SDK on chat completions and the Responses API: its AuthenticationError, the OpenAI shape.
    const openai = new OpenAI({ baseURL: `${url}/v1`, apiKey: AGENTS_KEY.toUpperCase(), maxRetries: 2 });
    for (const call of [() => openai.chat.completions.create({ model: 'gpt-4o', messages }), () => openai.responses.create({ model: 'gpt-4o', input: 'hi' })]) {
      const o = await call().catch((x: unknown) => x);
      expect(o).toBeInstanceOf(OpenAI.AuthenticationError);
      expect((o as InstanceType<typeof OpenAI.AuthenticationError>).code).toBe('invalid_api_key');
      expect((o as InstanceType<typeof OpenAI.AuthenticationError>).headers.get('www-authenticate')).toBe('Bearer realm="stormgate"');
    }
    // The right key with the spaces a pasted value brings is the key; another case, a Basic credential or the key in
    // the query alone is not; a wrong Bearer is not rescued by a right x-api-key beside it (the Bearer is the key sent).
    expect((await post(`${url}/v1/chat/completions`, { authorization: `Bearer  ${AGENTS_KEY} ` })).status).toBe(200);
    expect((await post(`${url}/v1/chat/completions`, { 'x-api-key': ` ${AGENTS_KEY}` })).status).toBe(200);
    expect((await post(`${url}/v1/chat/completions`, { authorization: `Basic ${Buffer.from(`u:${AGENTS_KEY}`).toString('base64')}` })).status).toBe(401);
    expect((await post(`${url}/v1/chat/completions?api-key=${AGENTS_KEY}`, {})).status).toBe(401);
    expect((await post(`${url}/v1/chat/completions`, { authorization: 'Bearer sg-wrong', 'x-api-key': AGENTS_KEY })).status).toBe(401);
    // Anthropic's SDK with the right key, by x-api-key and by authToken (Bearer).
    for (const opts of [{ apiKey: AGENTS_KEY }, { apiKey: null, authToken: OTHER_KEY }]) {
      const ok = await new Anthropic({ baseURL: url, maxRetries: 0, ...opts }).messages.create({ model: MODEL, max_tokens: 16, messages });
      expect(ok.content[0]).toMatchObject({ type: 'text' });
    }
    const all = logs.join('');
    for (const key of [AGENTS_KEY, OTHER_KEY, AGENTS_KEY.toUpperCase()]) expect(all).not.toContain(key);
  });
});

describe("a client's SDK retrying the 429s of its own rate", () => {
  it("does not spend the route's retry budget, which another client's provider failure then lacks", async () => {
    // The provider fails the other client's request once: the gateway retries it if the budget has room.
    const provider = await startProvider(failsOnce('flaky'));
    const base = defaultConfig('http://127.0.0.1:9', RETRY_LOOP_ONLY);
    const logs: string[] = [];
    const config = ConfigSchema.parse({
      ...base,
      providers: { mock: { family: 'openai', baseUrl: `${provider.origin}/v1`, apiKey: TEST_KEY, breaker: false } },
      // Three retries a minute at least: what one client's SDK retrying the 429s of its rate used up before.
      routes: base.routes.map((r) => ({ ...r, budget: { ratio: 0.1, windowS: 60, minRetriesPerSecond: 0.05 }, retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } })),
      auth: { keys: KEYS, limits: { agents: { requestsPerMinute: 600, burst: 1 } } },
    });
    const url = await startGateway(config, { logs });
    // Eight at once against a burst of one: seven refused 429 client_rate_limited, each retried by the SDK when told.
    const agents = new OpenAI({ baseURL: `${url}/v1`, apiKey: AGENTS_KEY, maxRetries: 10 });
    await Promise.all(Array.from({ length: 8 }, () => agents.chat.completions.create({ model: 'gpt-4o', messages })));
    const lines = logs.filter((l) => l.includes('"msg":"request"')).map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines.filter((l) => l.status === 429).length).toBeGreaterThanOrEqual(7);
    // The SDK's retries still say they are the client's (declared), as they are.
    expect(lines.filter((l) => l.status === 200 && l.clientRetry === 'declared').length).toBeGreaterThanOrEqual(4);
    // No provider refused anything: the budget for the other client's one failure is whole.
    const other = new OpenAI({ baseURL: `${url}/v1`, apiKey: OTHER_KEY, maxRetries: 0 });
    const answer = await other.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'flaky' }] });
    expect(answer.choices[0]!.message.content).toBe('ok');
    expect(provider.hits()).toBe(8 + 2);
  });
});

describe('clientLimits.retriesRefusal: which declared retries are a refusal\'s', () => {
  it('one per refusal told to come back within the minute, until a while after the last time told; none for others', async () => {
    let nowMs = 0;
    const limit = clientLimits({ agents: { requestsPerMinute: 60, burst: 1 }, slow: { requestsPerMinute: 0.5, burst: 1 } }, { store: new MemoryStore(), now: () => nowMs, random: () => 0, onLimited: () => {} })!;
    // Never refused: a declared retry is the client's retry of something else (a provider's 503).
    expect(limit.retriesRefusal('agents')).toBe(false);
    expect(await limit.admit('agents')).toBeUndefined();
    expect((await limit.admit('agents'))?.code).toBe('client_rate_limited');
    expect((await limit.admit('agents'))?.code).toBe('client_rate_limited');
    // Two refusals: two retries are theirs, a third is not.
    expect([limit.retriesRefusal('agents'), limit.retriesRefusal('agents'), limit.retriesRefusal('agents')]).toEqual([true, true, false]);
    // A refusal whose retry never came is forgotten once well past the time it was told.
    expect((await limit.admit('agents'))?.code).toBe('client_rate_limited');
    nowMs = 60_000;
    expect(limit.retriesRefusal('agents')).toBe(false);
    // A refusal told past the minute (x-should-retry: false) is not retried by the SDKs: nothing is owed.
    expect(await limit.admit('slow')).toBeUndefined();
    expect((await limit.admit('slow'))?.retryAfterMs).toBeGreaterThan(60_000);
    expect(limit.retriesRefusal('slow')).toBe(false);
  });
});

describe('client limits on /v1/messages, as Claude agents meet them', () => {
  it('a request rate: the Anthropic SDK waits the retry-after it is told and gets in', async () => {
    const { url } = await tenants({ agents: { requestsPerMinute: 60, burst: 1 } });
    const once = new Anthropic({ baseURL: url, apiKey: AGENTS_KEY, maxRetries: 0 });
    await once.messages.create({ model: MODEL, max_tokens: 16, messages });
    const refused = await once.messages.create({ model: MODEL, max_tokens: 16, messages }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(Anthropic.RateLimitError);
    const r = refused as InstanceType<typeof Anthropic.RateLimitError>;
    expect(r.error).toMatchObject({ type: 'error', error: { type: 'rate_limit_error' } });
    const waitMs = Number(r.headers.get('retry-after-ms'));
    expect(waitMs).toBeGreaterThan(0);
    expect(waitMs).toBeLessThanOrEqual(2_000);
    expect(r.headers.get('x-should-retry')).toBe('true');
    const started = Date.now();
    const patient = new Anthropic({ baseURL: url, apiKey: AGENTS_KEY, maxRetries: 3 });
    await patient.messages.create({ model: MODEL, max_tokens: 16, messages });
    expect(Date.now() - started).toBeLessThan(10_000);
  });

  it("a token rate smaller than one request's max_tokens: admitted when the rate is full, the next told when it is, and the SDK's retry gets in", async () => {
    const { url } = await tenants({ agents: { tokensPerMinute: 600 } });
    let sent = 0;
    const told: string[] = [];
    const claude = new Anthropic({
      baseURL: url,
      apiKey: AGENTS_KEY,
      maxRetries: 2,
      fetch: async (i, init) => {
        sent++;
        const res = await fetch(i, init);
        if (res.status === 429) told.push(`${res.headers.get('retry-after-ms')} ${res.headers.get('x-should-retry')}`);
        return res;
      },
    });
    const big = { model: MODEL, max_tokens: 2000, messages };
    // Its estimate (2,000 and its prompt) is over the minute's 600: admitted on a full rate, it overdraws it...
    await claude.messages.create(big);
    expect(sent).toBe(1);
    // ...and is settled to the few tokens the answer used: the next is told to come back once the rate is full again
    // (within a second or so, not the minutes its estimate would take), and the SDK's retry then gets in.
    const started = Date.now();
    await claude.messages.create(big);
    expect(Date.now() - started).toBeLessThan(15_000);
    expect(told).toHaveLength(sent - 2);
    for (const t of told) {
      const [ms, retry] = t.split(' ');
      expect(Number(ms)).toBeLessThanOrEqual(3_000);
      expect(retry).toBe('true');
    }
  });
});

describe('client limits shared through Redis, with Redis stopped and started again', () => {
  const redis = useRedisServer();

  it('answers every request at once, holds each instance to the rate alone while Redis is away, and the fleet to one rate after', async () => {
    const mock = await startMock({ apiKey: TEST_KEY });
    const logs: string[] = [];
    const config = ConfigSchema.parse({
      ...defaultConfig(mock.url, RETRY_LOOP_ONLY),
      state: { redis: redis().url, keyPrefix: `auth-${randomUUID()}`, commandTimeoutMs: 500 },
      auth: { keys: KEYS, limits: { agents: { requestsPerMinute: 6, burst: 2, tokensPerMinute: 60_000 } } },
    });
    const urls = [await startGateway(config, { logs }), await startGateway(config, { logs })];
    const round = async (n: number): Promise<number[]> => {
      const statuses: number[] = [];
      for (let i = 0; i < n; i++) {
        const started = Date.now();
        const client = new OpenAI({ baseURL: `${urls[i % 2]}/v1`, apiKey: AGENTS_KEY, maxRetries: 0, timeout: 20_000 });
        statuses.push(await client.chat.completions.create({ model: 'gpt-4o', messages, max_tokens: 50 }).then(() => 200, (e: { status: number }) => e.status));
        expect(Date.now() - started).toBeLessThan(5_000);
      }
      return statuses;
    };
    expect(await round(4)).toEqual([200, 200, 429, 429]);
    await redis().stop();
    try {
      // Each instance alone: its own burst of two, then refused.
      expect(await round(6)).toEqual([200, 200, 200, 200, 429, 429]);
    } finally {
      await redis().restart();
    }
    // The fresh Redis holds nothing: once both instances are back on it, a burst of two for the fleet, then refused.
    await expect.poll(() => logs.filter((l) => l.includes('state store recovered')).length, { timeout: 15_000, interval: 200 }).toBe(2);
    expect(await round(4)).toEqual([200, 200, 429, 429]);
    const samples = parseMetrics(await (await fetch(`${urls[0]}/metrics`)).text());
    const limited = samples.filter((s) => s.name === 'stormgate_client_limited_total');
    expect([...new Set(limited.map((s) => s.labels.client))]).toEqual(['agents']);
    const all = logs.join('');
    expect(all).not.toContain(AGENTS_KEY);
  });
});
