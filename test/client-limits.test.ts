// auth.limits: a client's request rate, as GCRA (policy/client-rate.ts) on a fake clock, in both state stores (a real
// redis-server for the Redis one), and end to end: gateways with client keys, the official `openai` SDK as the client,
// the bundled mock upstream, one gateway and two sharing a real Redis.
import { randomUUID } from 'node:crypto';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { admitClient, clientRates, rateOf, spend, type ClientDues, type Rate } from '../src/policy/client-rate.ts';
import type { StateStore } from '../src/state/store.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import { RedisStore } from '../src/state/redis-store.ts';
import { describeEachStore } from './helpers/redis-stores.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { defaultConfig, parseMetrics, RETRY_LOOP_ONLY, useExtraMocks, useGateways } from './helpers/stack.ts';

const messages = [{ role: 'user' as const, content: 'hi' }];

/** A client with a request rate only: each call asks at nowMs and answers 0 (admitted) or the wait. */
function requestsAt(rate: Rate): (nowMs: number) => number {
  const dues: ClientDues = {};
  return (nowMs) => {
    const v = admitClient(dues, nowMs, { requests: rate });
    if (!v.admitted) return v.waitMs;
    dues.requests = v.requestsDue;
    return 0;
  };
}

/** A store's answer for a client with a request rate only: 0 admitted, else the wait. */
async function take(store: Pick<StateStore, 'admitClient'>, client: string, rate: Rate, nowMs: number): Promise<number> {
  return (await store.admitClient(client, { requests: rate }, nowMs))?.waitMs ?? 0;
}

describe('the rate policy (GCRA)', () => {
  it('admits a burst at once, then one request per interval, and tells a refused request when one would fit', () => {
    const at = requestsAt(rateOf(60, 3)); // one per second, three at once
    expect([at(0), at(0), at(0)]).toEqual([0, 0, 0]);
    expect(at(0)).toBe(1000);
    expect(at(400)).toBe(600);
    // A refused request changed nothing: the slot is still due at 1000.
    expect(at(999)).toBe(1);
    expect(at(1000)).toBe(0);
    expect(at(1000)).toBe(1000);
    // A quiet spell refills the burst, never past it.
    expect([at(60_000), at(60_000), at(60_000)]).toEqual([0, 0, 0]);
    expect(at(60_000)).toBe(1000);
  });

  it('admits while any tokens are left, counts them once answered, and holds an overdrawn client until they are paid back', () => {
    const { tokens } = clientRates({ tokensPerMinute: 6000 }); // 100 a second, a minute's worth at once
    const dues: ClientDues = {};
    const at = (nowMs: number) => {
      const v = admitClient(dues, nowMs, { tokens });
      return v.admitted ? 0 : v.waitMs;
    };
    expect(at(0)).toBe(0);
    dues.tokens = spend(dues.tokens, 0, tokens!, 5_999);
    expect(at(0)).toBe(0); // one token left
    dues.tokens = spend(dues.tokens, 0, tokens!, 3_000); // overdrawn by 2,999
    expect(at(0)).toBeCloseTo(30_000, 6);
    expect(at(29_999)).toBeCloseTo(1, 6);
    expect(at(30_000)).toBe(0);
    // Both rates: the longer wait, and the rate that set it.
    expect(admitClient({ tokens: dues.tokens }, 0, { tokens, requests: rateOf(60, 1) })).toMatchObject({ admitted: false, waitMs: expect.closeTo(30_000, 6), by: 'tokens' });
    expect(admitClient({ requests: 2000 }, 0, { tokens, requests: rateOf(60, 1) })).toMatchObject({ admitted: false, waitMs: 2000, by: 'requests' });
  });

  it('defaults the burst to ten seconds of the rate, at least one', () => {
    expect(rateOf(600)).toEqual({ intervalMs: 100, burst: 100 });
    expect(rateOf(3)).toEqual({ intervalMs: 20_000, burst: 1 });
    expect(rateOf(0.5, 2)).toEqual({ intervalMs: 120_000, burst: 2 });
  });

  it('keeps a rate that does not divide a minute exactly', () => {
    const at = requestsAt(rateOf(7, 1));
    let admitted = 0;
    // A client asking every millisecond for ten minutes: 8,571.43 ms apart, never rounded down to a faster rate.
    for (let t = 0; t < 600_000; t += 1) if (at(t) === 0) admitted++;
    expect(admitted).toBe(70);
  });
});

describeEachStore((store) => {
  it('admitClient: admits the burst, refuses with the wait until the next slot, per client', async () => {
    const s = store();
    const now = Date.now();
    const rate = rateOf(60, 2);
    expect(await take(s, 'a', rate, now)).toBe(0);
    expect(await take(s, 'a', rate, now)).toBe(0);
    expect(await take(s, 'a', rate, now)).toBe(1000);
    // Refused behind the one told to come at now + 1000: the slot after it, as in a queue.
    expect(await take(s, 'a', rate, now + 300)).toBe(1700);
    expect(await take(s, 'b', rate, now)).toBe(0);
    expect(await take(s, 'a', rate, now + 1000)).toBe(0);
  });
});

describe('admitClient on Redis', () => {
  const redis = useRedisServer();

  it('is one rate for the fleet, and each instance keeps the client to it alone while Redis is away', async () => {
    const keyPrefix = `rate-${randomUUID()}`;
    const a = new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 500, keyPrefix } });
    const b = new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 500, keyPrefix } });
    try {
      expect(await a.ready()).toBe(true);
      expect(await b.ready()).toBe(true);
      const rate = rateOf(6, 2); // one per 10 s, two at once
      const now = Date.now();
      expect(await take(a, 'agents', rate, now)).toBe(0);
      expect(await take(b, 'agents', rate, now)).toBe(0);
      expect(await take(a, 'agents', rate, now)).toBeGreaterThan(9_000);
      expect(await take(b, 'agents', rate, now)).toBeGreaterThan(9_000);
      await redis().stop();
      try {
        // Degraded: the local rate, from nothing (a burst of its own) rather than every request refused.
        expect(await take(a, 'agents', rate, now + 1)).toBe(0);
        expect(a.degraded).toBe(true);
      } finally {
        await redis().restart();
      }
    } finally {
      await Promise.all([a.close(), b.close()]);
    }
  });
});

describe('the queue of refused requests on Redis', () => {
  const redis = useRedisServer();

  it('is the fleet\'s: requests refused on two instances are told successive slots, not each instance its own queue', async () => {
    const keyPrefix = `told-${randomUUID()}`;
    const a = new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 500, keyPrefix } });
    const b = new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 500, keyPrefix } });
    try {
      expect(await a.ready()).toBe(true);
      expect(await b.ready()).toBe(true);
      const rate = rateOf(60, 1); // one a second
      const now = Date.now();
      expect(await take(a, 'agents', rate, now)).toBe(0);
      const waits: number[] = [];
      for (let i = 0; i < 6; i++) waits.push(await take(i % 2 ? b : a, 'agents', rate, now));
      expect(waits).toEqual([1000, 2000, 3000, 4000, 5000, 6000]);
    } finally {
      await Promise.all([a.close(), b.close()]);
    }
  });
});

describe('client rate limits, end to end', () => {
  const startGateway = useGateways();
  const startMock = useExtraMocks();
  const redis = useRedisServer();

  async function gateway(limits: NonNullable<ConfigInput['auth']>['limits'], extra: Partial<ConfigInput> = {}, logs: string[] = []) {
    const mock = await startMock();
    const base = defaultConfig(mock.url, RETRY_LOOP_ONLY);
    const config = ConfigSchema.parse({ ...base, auth: { keys: { agents: 'key-agents', batch: 'key-batch', other: 'key-other' }, limits }, ...extra });
    return { url: await startGateway(config, { logs }), config };
  }

  it('refuses a client past its rate with 429 client_rate_limited and a wait the SDK honours; other clients go on', async () => {
    const logs: string[] = [];
    const { url } = await gateway({ agents: { requestsPerMinute: 120, burst: 2 } }, {}, logs);
    const agents = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'key-agents', maxRetries: 0 });
    const other = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'key-other', maxRetries: 0 });
    await agents.chat.completions.create({ model: 'gpt-4o-mini', messages });
    await agents.chat.completions.create({ model: 'gpt-4o-mini', messages });
    const refused = await agents.chat.completions.create({ model: 'gpt-4o-mini', messages }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(OpenAI.RateLimitError);
    const err = refused as InstanceType<typeof OpenAI.RateLimitError>;
    expect(err.status).toBe(429);
    expect(err.code).toBe('client_rate_limited');
    expect(err.type).toBe('rate_limit_error');
    expect(err.headers.get('x-should-retry')).toBe('true');
    const waitMs = Number(err.headers.get('retry-after-ms'));
    // Told the half second to the next slot (less the time the two answers took), spread over one more slot.
    expect(waitMs).toBeGreaterThan(0);
    expect(waitMs).toBeLessThanOrEqual(1000);
    expect(Number(err.headers.get('retry-after'))).toBe(Math.ceil(waitMs / 1000));
    // Another client is not held by this one's rate.
    for (let i = 0; i < 5; i++) await other.chat.completions.create({ model: 'gpt-4o-mini', messages });
    // The SDK's own retry waits what it was told and gets in.
    const patient = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'key-agents', maxRetries: 2 });
    const done = await patient.chat.completions.create({ model: 'gpt-4o-mini', messages });
    expect(done.choices[0]?.message.content).toBeTruthy();
    const samples = parseMetrics(await (await fetch(`${url}/metrics`)).text());
    expect(samples.find((s) => s.name === 'stormgate_client_limited_total' && s.labels.client === 'agents')?.value).toBeGreaterThanOrEqual(1);
    expect(samples.find((s) => s.name === 'stormgate_client_limited_total' && s.labels.client === 'other')).toBeUndefined();
    const line = logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.status === 429);
    expect(line).toMatchObject({ client: 'agents' });
  });

  it('"*" gives every client not named its own rate; a refused request never reaches the provider, nor has its body read', async () => {
    const mock = await startMock();
    const config = ConfigSchema.parse({
      ...defaultConfig(mock.url, RETRY_LOOP_ONLY),
      auth: { keys: { agents: 'key-agents', batch: 'key-batch' }, limits: { '*': { requestsPerMinute: 60, burst: 1 }, batch: { requestsPerMinute: 60, burst: 3 } } },
    });
    const url = await startGateway(config);
    const call = (key: string) => fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o-mini', messages }),
    });
    expect((await call('key-agents')).status).toBe(200);
    const refused = await call('key-agents');
    expect(refused.status).toBe(429);
    expect(await refused.json()).toMatchObject({ error: { code: 'client_rate_limited', type: 'rate_limit_error', param: null } });
    expect([(await call('key-batch')).status, (await call('key-batch')).status, (await call('key-batch')).status]).toEqual([200, 200, 200]);
    expect((await call('key-batch')).status).toBe(429);
    expect(mock.stats().total).toBe(4);
    // Refused from its headers: a client over its rate is not made to upload a body first (Expect: 100-continue aside,
    // the answer comes before the gateway reads one).
    const slow = await fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: 'Bearer key-agents', 'content-type': 'application/json' },
      body: new ReadableStream({ start(c) { c.enqueue(new TextEncoder().encode('{"model":')); /* never closed */ } }),
      duplex: 'half',
    } as RequestInit);
    expect(slow.status).toBe(429);
  });

  it('counts the tokens of each answered request, and refuses a client that used its minute\'s worth until they are back', async () => {
    const { url } = await gateway({ agents: { tokensPerMinute: 60 } });
    const agents = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'key-agents', maxRetries: 0 });
    let used = 0;
    let answered = 0;
    let refused: unknown;
    while (refused === undefined && answered < 40) {
      await agents.chat.completions.create({ model: 'gpt-4o-mini', messages }).then(
        (r) => {
          used += r.usage!.total_tokens;
          answered++;
        },
        (e: unknown) => (refused = e),
      );
    }
    // Admitted while any of the 60 tokens were left: the last one admitted overdrew them.
    expect(used).toBeGreaterThanOrEqual(60);
    expect(refused).toBeInstanceOf(OpenAI.RateLimitError);
    const err = refused as InstanceType<typeof OpenAI.RateLimitError>;
    expect(err.code).toBe('client_rate_limited');
    expect(err.message).toContain('60 tokens per minute');
    // The overdraft, at a token a second, is the wait (less the time the requests took), plus up to a fifth.
    const waitMs = Number(err.headers.get('retry-after-ms'));
    expect(waitMs).toBeGreaterThan((used - 60) * 1000 - 5_000);
    expect(waitMs).toBeLessThanOrEqual(Math.max(1, used - 60 + 1) * 1000 * 1.2 + 1);
    const samples = parseMetrics(await (await fetch(`${url}/metrics`)).text());
    expect(samples.find((s) => s.name === 'stormgate_client_limited_total' && s.labels.client === 'agents')?.labels.by).toBe('tokens');
  });

  it('spreads clients refused together over the slots they wait for, so they do not all come back for one', async () => {
    const { url } = await gateway({ agents: { requestsPerMinute: 600, burst: 5 } });
    const call = () => fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: 'Bearer key-agents', 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o-mini', messages }),
    });
    // When each refused request is told to come back, as a time: the told wait from when its answer came.
    const backAt = (await Promise.all(Array.from({ length: 30 }, () => call().then((a) => ({ a, at: Date.now() })))))
      .filter(({ a }) => a.status === 429)
      .map(({ a, at }) => at + Number(a.headers.get('retry-after-ms')))
      .sort((x, y) => x - y);
    // However many the loaded machine let through, 5 at once and one per 100 ms: at least a dozen are refused.
    expect(backAt.length).toBeGreaterThanOrEqual(12);
    // Refused for slots 100 ms apart, they are told times about a slot apart (less how long the answers took to come),
    // not all the same next slot within a fifth of its wait.
    expect(backAt.at(-1)! - backAt[0]!).toBeGreaterThan((backAt.length - 1) * 100 * 0.6);
  });

  it('holds a client to one rate across two gateways sharing Redis', async () => {
    const mock = await startMock();
    const keyPrefix = `limits-${randomUUID()}`;
    const config = ConfigSchema.parse({
      ...defaultConfig(mock.url, RETRY_LOOP_ONLY),
      state: { redis: redis().url, keyPrefix, commandTimeoutMs: 1000 },
      auth: { keys: { agents: 'key-agents' }, limits: { agents: { requestsPerMinute: 6, burst: 4 } } },
    });
    const urls = [await startGateway(config), await startGateway(config)];
    const statuses: number[] = [];
    for (let i = 0; i < 8; i++) {
      const client = new OpenAI({ baseURL: `${urls[i % 2]}/v1`, apiKey: 'key-agents', maxRetries: 0 });
      statuses.push(await client.chat.completions.create({ model: 'gpt-4o-mini', messages }).then(() => 200, (e: { status: number }) => e.status));
    }
    expect(statuses).toEqual([200, 200, 200, 200, 429, 429, 429, 429]);
    expect(mock.stats().total).toBe(4);
  });

  it('a limit for a client that has no key fails at start-up, with the path and the clients there are', () => {
    const yaml = `
providers:
  openai: { family: openai, baseUrl: "http://127.0.0.1:9/v1", apiKey: k }
routes:
  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: openai } ] }
auth:
  keys: { agents: key-a }
  limits:
    agnets: { requestsPerMinute: 600 }
`;
    expect(() => parseConfig(yaml, 'gateway.yaml', {})).toThrow(/auth\.limits\.agnets[\s\S]*no client "agnets" in auth\.keys; expected one of: agents, \*/);
    expect(() => parseConfig(yaml.replace('agnets: { requestsPerMinute: 600 }', 'agents: { requestsPerMinute: 0 }'), 'gateway.yaml', {})).toThrow(/auth\.limits\.agents\.requestsPerMinute/);
    expect(() => parseConfig(yaml.replace('agnets: { requestsPerMinute: 600 }', 'agents: {}'), 'gateway.yaml', {})).toThrow(/auth\.limits\.agents[\s\S]*sets no rate: expected requestsPerMinute, tokensPerMinute or both/);
    expect(() => parseConfig(yaml.replace('agnets: { requestsPerMinute: 600 }', 'agents: { tokensPerMinute: 1000, burst: 5 }'), 'gateway.yaml', {})).toThrow(/auth\.limits\.agents\.burst[\s\S]*needs requestsPerMinute/);
  });
});

describe('MemoryStore.admitClient', () => {
  it('keeps one due time per client', async () => {
    const s = new MemoryStore();
    const rate = rateOf(60, 1);
    expect(await take(s, 'x', rate, 0)).toBe(0);
    expect(await take(s, 'x', rate, 10)).toBe(990);
    expect(await take(s, 'y', rate, 10)).toBe(0);
  });
});
