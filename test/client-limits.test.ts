// auth.limits: a client's request rate, as GCRA (policy/client-rate.ts) on a fake clock, in both state stores (a real
// redis-server for the Redis one), and end to end: gateways with client keys, the official `openai` SDK as the client,
// the bundled mock upstream, one gateway and two sharing a real Redis.
import { randomUUID } from 'node:crypto';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { admitClient, clientRates, rateOf, reserveTokens, settlement, spend, type ClientDues, type Rate } from '../src/policy/client-rate.ts';
import { tokenEstimate } from '../src/policy/token-estimate.ts';
import { clientLimits } from '../src/http/client-limits.ts';
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

  it('reserves a request\'s estimate when it fits what is left, else refuses it with the wait until it does and gives back the request counted', () => {
    const rates = clientRates({ requestsPerMinute: 60, burst: 5, tokensPerMinute: 6000 }); // tokens: 100 a second
    const withTokens = { ...rates, tokens: rates.tokens! };
    const t = 1_000_000;
    const dues: ClientDues = { requests: t + 1000 }; // admitClient counted this request
    expect(reserveTokens(dues, t, withTokens, 4_000)).toEqual({ admitted: true, tokensDue: t + 40_000 });
    dues.tokens = t + 40_000;
    // 2,000 left: 3,000 do not fit until 1,000 more are back (10 s); the request admitClient counted is given back.
    expect(reserveTokens(dues, t, withTokens, 3_000)).toEqual({ admitted: false, by: 'tokens', waitMs: 10_000, toldMs: t + 10_000, requestsDue: undefined });
    expect(reserveTokens({ ...dues, requests: t + 3000 }, t, withTokens, 3_000)).toMatchObject({ admitted: false, requestsDue: t + 2000 });
    // Refused behind one told to come at t + 10 s: a slot of its own estimate's time (30 s) after it.
    expect(reserveTokens({ ...dues, told: t + 10_000 }, t, withTokens, 3_000)).toMatchObject({ admitted: false, waitMs: 40_000 });
    // More than a minute's worth fits only a full bucket, which it overdraws; it could never fit otherwise.
    expect(reserveTokens({}, t, { tokens: rates.tokens! }, 9_000)).toEqual({ admitted: true, tokensDue: t + 90_000 });
    expect(reserveTokens({ tokens: t + 1 }, t, { tokens: rates.tokens! }, 9_000)).toMatchObject({ admitted: false, waitMs: 1 });
  });

  it('settles a reservation to the tokens used; without usage it keeps the prompt\'s estimate and gives back the completion cap', () => {
    expect(settlement({ prompt: 1_500, completion: 500 }, 1_700, true)).toBe(-300);
    expect(settlement({ prompt: 1_500, completion: 500 }, 2_600, true)).toBe(600);
    expect(settlement({ prompt: 1_500, completion: 500 }, 0, true)).toBe(-2_000);
    expect(settlement({ prompt: 1_500, completion: 500 }, undefined, true)).toBe(-500);
    // A give-back that leaves the bucket full: no due time, as for a rate never used.
    const { tokens } = clientRates({ tokensPerMinute: 6000 });
    expect(spend(10_000, 5_000, tokens!, -600)).toBeUndefined();
    expect(spend(10_000, 5_000, tokens!, -400)).toBe(6_000);
  });

  it('estimates a request\'s tokens as its body\'s bytes / 4 plus the completion cap its API names', () => {
    expect(tokenEstimate('chat', 4_001, { max_tokens: 100 })).toEqual({ prompt: 1_001, completion: 100 });
    // max_completion_tokens replaced max_tokens: sent both, the newer counts; n choices, n caps.
    expect(tokenEstimate('chat', 400, { max_tokens: 100, max_completion_tokens: 300, n: 2 })).toEqual({ prompt: 100, completion: 600 });
    expect(tokenEstimate('responses', 400, { max_output_tokens: 50, max_tokens: 9 })).toEqual({ prompt: 100, completion: 50 });
    expect(tokenEstimate('messages', 400, { max_tokens: 1024 })).toEqual({ prompt: 100, completion: 1024 });
    expect(tokenEstimate('completions', 400, { max_tokens: 16, n: 3 })).toEqual({ prompt: 100, completion: 48 });
    expect(tokenEstimate('embeddings', 400, { max_tokens: 16 })).toEqual({ prompt: 100, completion: 0 });
    // No cap, or one a provider would refuse: the prompt alone.
    expect(tokenEstimate('chat', 400, {})).toEqual({ prompt: 100, completion: 0 });
    expect(tokenEstimate('chat', 400, { max_tokens: '100' })).toEqual({ prompt: 100, completion: 0 });
    expect(tokenEstimate('chat', 400, { max_tokens: null, max_completion_tokens: null })).toEqual({ prompt: 100, completion: 0 });
    expect(tokenEstimate('chat', 400, { max_tokens: 1e15 }).completion).toBe(10_000_000);
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

describeEachStore((store) => {
  it('reserveTokens: reserves what fits, refuses what does not with the request admitClient counted given back', async () => {
    const s = store();
    const rates = clientRates({ requestsPerMinute: 60, burst: 1, tokensPerMinute: 6000 });
    const withTokens = { ...rates, tokens: rates.tokens! };
    const now = Date.now();
    expect(await s.admitClient('a', rates, now)).toBeUndefined();
    expect(await s.reserveTokens('a', withTokens, 5_000, now)).toBeUndefined();
    expect(await s.admitClient('a', rates, now + 1000)).toBeUndefined();
    // 1,000 left (plus the second's 100 back): 2,000 wait 9 s, and the request counted a moment ago is given back.
    expect(await s.reserveTokens('a', withTokens, 2_000, now + 1000)).toEqual({ waitMs: 9_000, by: 'tokens' });
    expect(await s.admitClient('a', rates, now + 1000)).toBeUndefined();
    // Settled for less than reserved: the difference is back at once.
    s.spendTokens('a', rates.tokens!, -4_000, now + 1000);
    expect(await s.reserveTokens('a', withTokens, 2_000, now + 1000)).toBeUndefined();
  });
});

describe('clientLimits: a reservation settled', () => {
  it('keeps the prompt\'s estimate of a request answered without usage, and reserves nothing without a token rate', async () => {
    const store = new MemoryStore();
    const limit = clientLimits({ agents: { tokensPerMinute: 600 }, batch: { requestsPerMinute: 60 } }, { store, now: () => 0, random: () => 0, onLimited: () => {} })!;
    const spent: number[] = [];
    const spendTokens = store.spendTokens.bind(store);
    store.spendTokens = (client, rate, tokens, nowMs) => {
      spent.push(tokens);
      spendTokens(client, rate, tokens, nowMs);
    };
    expect(limit.reserve('batch', { prompt: 10, completion: 10 })).toBeUndefined();
    expect(await limit.reserve('agents', { prompt: 400, completion: 200 })).toBeUndefined();
    expect((await limit.reserve('agents', { prompt: 1, completion: 0 }))?.code).toBe('client_rate_limited');
    limit.settle('agents', { prompt: 400, completion: 200 }, { usage: [undefined, undefined], sentUpstream: true });
    limit.settle('agents', { prompt: 400, completion: 200 }, { usage: [{ prompt: 300, completion: 50 } as never, { prompt: 20, completion: 30 } as never], sentUpstream: true });
    limit.settle('agents', { prompt: 400, completion: 200 }, { usage: [{ prompt: 400, completion: 200 } as never], sentUpstream: true });
    expect(spent).toEqual([-200, -200]);
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

  it('settles each request\'s reservation to the tokens its answer used, and refuses one whose estimate no longer fits until enough are back', async () => {
    const { url } = await gateway({ agents: { tokensPerMinute: 60 } });
    const agents = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'key-agents', maxRetries: 0 });
    // What each reserves: its body's bytes / 4 (no completion cap), more than the mock's answer uses.
    const estimate = Math.ceil(JSON.stringify({ model: 'gpt-4o-mini', messages }).length / 4);
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
    // Admitted while its estimate fitted what was left, each settled to what it used (less: the rest given back), so
    // more were admitted than 60 / estimate, and the one refused found fewer than its estimate left.
    expect(answered).toBeGreaterThan(Math.floor(60 / estimate));
    expect(used).toBeLessThanOrEqual(60);
    expect(used + estimate).toBeGreaterThan(60);
    expect(refused).toBeInstanceOf(OpenAI.RateLimitError);
    const err = refused as InstanceType<typeof OpenAI.RateLimitError>;
    expect(err.code).toBe('client_rate_limited');
    expect(err.message).toContain('60 tokens per minute');
    expect(err.message).toContain(`estimate: ${estimate} tokens`);
    // The tokens missing for its estimate, at a token a second, are the wait (less the time the requests took), plus
    // up to a fifth.
    const waitMs = Number(err.headers.get('retry-after-ms'));
    expect(waitMs).toBeGreaterThan((used + estimate - 60) * 1000 - 5_000);
    expect(waitMs).toBeLessThanOrEqual((used + estimate - 60) * 1000 * 1.2 + 1);
    const samples = parseMetrics(await (await fetch(`${url}/metrics`)).text());
    expect(samples.find((s) => s.name === 'stormgate_client_limited_total' && s.labels.client === 'agents')?.labels.by).toBe('tokens');
  });

  it.each(['in-process', 'Redis'] as const)(
    'bounds a burst sent at once by the token rate (%s store): each request reserves its prompt estimate and completion cap as it is admitted',
    async (where) => {
      // 50 requests at once, ~2,000 tokens each (a 7,600-character prompt, ~1,900 tokens, and max_tokens 100), against
      // 10,000 tokens a minute: counted only once answered, all 50 were let in (10 minutes' worth).
      const mock = await startMock({ faults: { latencyMs: 300 } });
      const config = ConfigSchema.parse({
        ...defaultConfig(mock.url, RETRY_LOOP_ONLY),
        ...(where === 'Redis' && { state: { redis: redis().url, keyPrefix: `burst-${randomUUID()}`, commandTimeoutMs: 1000 } }),
        auth: { keys: { agents: 'key-agents' }, limits: { agents: { tokensPerMinute: 10_000 } } },
      });
      const url = await startGateway(config);
      const body = JSON.stringify({ model: 'gpt-4o-mini', max_tokens: 100, messages: [{ role: 'user', content: 'x'.repeat(7_600) }] });
      const answers = await Promise.all(Array.from({ length: 50 }, () => fetch(`${url}/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: 'Bearer key-agents', 'content-type': 'application/json' },
        body,
      }).then(async (a) => ({ status: a.status, json: (await a.json()) as { usage?: { total_tokens: number }; error?: { code: string } }, retryAfterMs: Number(a.headers.get('retry-after-ms')) }))));
      const admitted = answers.filter((a) => a.status === 200);
      const used = admitted.reduce((sum, a) => sum + a.json.usage!.total_tokens, 0);
      // Each reserves ~2,000 of the 10,000: four fit (the fifth finds ~1,950 left), never more than a minute's worth.
      expect(admitted.length).toBeGreaterThanOrEqual(4);
      expect(admitted.length).toBeLessThanOrEqual(5);
      expect(used).toBeLessThanOrEqual(10_000);
      expect(mock.stats().total).toBe(admitted.length);
      const refused = answers.filter((a) => a.status === 429);
      expect(refused.length).toBe(50 - admitted.length);
      expect(refused.every((a) => a.json.error?.code === 'client_rate_limited')).toBe(true);
      // Told to come back in the queue, each a reservation's time (~2,000 tokens at 10,000 a minute: ~12 s) after the
      // one before, up to a minute past its own wait, not all at the moment the first of them fits.
      const waits = refused.map((a) => a.retryAfterMs).sort((x, y) => x - y);
      expect(waits[0]).toBeLessThan(12_000 * 1.2);
      expect(waits[3]!).toBeGreaterThan(30_000);
      expect(waits.at(-1)!).toBeLessThanOrEqual((12_000 + 60_000) * 1.2 + 1);
    },
  );

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
