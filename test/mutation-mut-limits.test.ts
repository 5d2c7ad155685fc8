// Mutation-testing gaps in client rate limits (policy/client-rate.ts, http/client-limits.ts, the stores' admitClient,
// reserveTokens and spendTokens): each test pins a behaviour that a wrong change to that code went unnoticed by. Policy and wiring on a
// fake clock and a fixed random source, as the rest of the client-limit tests do.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { clientLimits } from '../src/http/client-limits.ts';
import { admitClient, clientRates, spend } from '../src/policy/client-rate.ts';
import { ConfigSchema } from '../src/config/schema.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import { RedisStore } from '../src/state/redis-store.ts';
import { describeEachStore } from './helpers/redis-stores.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { cc, delta, DONE, type Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';
import { defaultConfig, RETRY_LOOP_ONLY, useExtraMocks, useGateways } from './helpers/stack.ts';

type Limits = Parameters<typeof clientLimits>[0];

/** clientLimits on a memory store, its clock at `clock.now`, a random source fixed at `random`. */
function limitsOn(limits: Limits, random: number) {
  const clock = { now: 0 };
  const store = new MemoryStore();
  const limited: string[] = [];
  const limit = clientLimits(limits, { store, now: () => clock.now, random: () => random, onLimited: (c, by) => limited.push(`${c}:${by}`) })!;
  return { limit, clock, store, limited };
}

describe('admitClient: the rate that refused', () => {
  it('names the token rate when both rates would wait as long (as the Redis script does)', () => {
    const rates = clientRates({ requestsPerMinute: 60, burst: 1, tokensPerMinute: 60 }); // both one a second
    // Each would fit in exactly 1 s: the next request's slot, the token used up a minute ago back.
    const v = admitClient({ requests: 1000, tokens: spend(undefined, 0, rates.tokens!, 60) }, 0, rates);
    expect(v).toMatchObject({ admitted: false, waitMs: 1000, by: 'tokens' });
  });
});

describe('clientLimits: what a refused client is told', () => {
  it('spreads requests refused by the request rate over a whole slot, not only a fifth of their wait', async () => {
    const { limit } = limitsOn({ agents: { requestsPerMinute: 60, burst: 1 } }, 0.5);
    expect(await limit.admit('agents')).toBeUndefined();
    const refusal = await limit.admit('agents');
    // The next slot is 1,000 ms away; half a slot (500 ms) of spread on top.
    expect(refusal?.retryAfterMs).toBe(1500);
    expect(refusal?.shouldRetry).toBe(true);
  });

  it('spreads requests refused by the token rate over a fifth of their wait', async () => {
    const { limit } = limitsOn({ agents: { tokensPerMinute: 600 } }, 0.5); // ten a second
    expect(await limit.admit('agents')).toBeUndefined();
    limit.settle('agents', { prompt: 0, completion: 0 }, { usage: [{ prompt: 600, completion: 10 } as never], sentUpstream: true }); // ten over: one token back in 1,100 ms
    const refusal = await limit.admit('agents');
    // Half of a fifth of the wait (110 ms) on top: told back together, they would all come for the same tokens.
    expect(refusal?.retryAfterMs).toBe(1210);
  });

  it('never tells a client to come back before its next slot, for a rate that does not divide a minute', async () => {
    const { limit } = limitsOn({ agents: { requestsPerMinute: 7, burst: 1 } }, 0);
    expect(await limit.admit('agents')).toBeUndefined();
    // The slot is 8,571.43 ms away: told 8,572, since at 8,571 it would be refused again.
    expect((await limit.admit('agents'))?.retryAfterMs).toBe(8572);
  });
});

describe('clientLimits: tokens used', () => {
  it('counts nothing for a client with a request rate only (and does not fail the request\'s end)', async () => {
    const { limit, store } = limitsOn({ agents: { requestsPerMinute: 60, burst: 1 } }, 0);
    const spent: unknown[] = [];
    store.spendTokens = (...args) => void spent.push(args);
    expect(() => limit.settle('agents', { prompt: 0, completion: 0 }, { usage: [{ prompt: 10, completion: 5 } as never], sentUpstream: true })).not.toThrow();
    expect(spent).toEqual([]);
  });

  it('counts the tokens of a client that has its rates from "*", as it admits it by them', async () => {
    const { limit, limited } = limitsOn({ '*': { tokensPerMinute: 600 } }, 0);
    expect(await limit.admit('agents')).toBeUndefined();
    limit.settle('agents', { prompt: 0, completion: 0 }, { usage: [{ prompt: 600, completion: 10 } as never], sentUpstream: true });
    expect((await limit.admit('agents'))?.code).toBe('client_rate_limited');
    expect(limited).toEqual(['agents:tokens']);
    expect(await limit.admit('batch')).toBeUndefined(); // a rate of its own
  });
});

describeEachStore((store) => {
  it('admitClient: names the token rate when both rates would wait as long', async () => {
    const s = store();
    const rates = clientRates({ requestsPerMinute: 60, burst: 1, tokensPerMinute: 60 }); // both one a second
    const now = Date.now();
    expect(await s.admitClient('agents', rates, now)).toBeUndefined();
    s.spendTokens('agents', rates.tokens!, 60, now); // a minute's worth: one back in 1 s, when the next request's slot is
    expect(await s.admitClient('agents', rates, now)).toEqual({ waitMs: 1000, by: 'tokens' });
  });

  it('admitClient: never tells a wait shorter than the token rate\'s, for a rate that does not divide a minute', async () => {
    const s = store();
    const rates = clientRates({ tokensPerMinute: 7 }); // one per 8,571.43 ms
    const now = Date.now();
    expect(await s.admitClient('agents', rates, now)).toBeUndefined();
    s.spendTokens('agents', rates.tokens!, 7, now);
    const refusal = await s.admitClient('agents', rates, now);
    expect(refusal?.by).toBe('tokens');
    // Not a millisecond short (told 8,571 it would be refused again), give or take floating point at Date.now()'s size.
    expect(refusal!.waitMs).toBeGreaterThan(60_000 / 7 - 0.01);
    expect(refusal!.waitMs).toBeLessThan(60_000 / 7 + 1);
  });
});

describe('client rate limits: the gateway\'s own endpoints', () => {
  const startGateway = useGateways();
  const startMock = useExtraMocks();

  it('are not held to "*"\'s rate: a health check or a scrape has no client', async () => {
    const mock = await startMock();
    const config = ConfigSchema.parse({
      ...defaultConfig(mock.url, RETRY_LOOP_ONLY),
      auth: { keys: { agents: 'key-agents' }, limits: { '*': { requestsPerMinute: 1, burst: 1 } } },
    });
    const url = await startGateway(config);
    const statuses: number[] = [];
    for (let i = 0; i < 3; i++) for (const path of ['/healthz', '/metrics']) statuses.push((await fetch(`${url}${path}`)).status);
    expect(statuses).toEqual([200, 200, 200, 200, 200, 200]);
  });
});

describe('spendTokens on Redis', () => {
  const redis = useRedisServer();

  it('keeps the tokens a client used on this instance too, so it is held to them while Redis is away', async () => {
    const store = new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 500, keyPrefix: `tok-${randomUUID()}` } });
    try {
      expect(await store.ready()).toBe(true);
      const rates = clientRates({ tokensPerMinute: 60 });
      const now = Date.now();
      expect(await store.admitClient('agents', rates, now)).toBeUndefined();
      store.spendTokens('agents', rates.tokens!, 120, now); // a minute over
      expect((await store.admitClient('agents', rates, now))?.by).toBe('tokens');
      await redis().stop();
      try {
        expect(await store.admitClient('agents', rates, now + 1)).toMatchObject({ by: 'tokens', waitMs: expect.closeTo(60_999, 0) }) // 61 s until one is back, less the 1 ms gone;
        expect(store.degraded).toBe(true);
      } finally {
        await redis().restart();
      }
    } finally {
      await store.close();
    }
  });

  it('writes the tokens an instance on a skewed clock spent in the fleet\'s time, so another instance holds the client as long', async () => {
    const keyPrefix = `tok-${randomUUID()}`;
    const ahead = () => Date.now() + 30_000; // a VM 30 s ahead of the fleet
    const a = new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 500, keyPrefix }, now: ahead });
    const b = new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 500, keyPrefix } });
    try {
      expect(await a.ready()).toBe(true);
      expect(await b.ready()).toBe(true);
      const rates = clientRates({ tokensPerMinute: 60 });
      a.spendTokens('agents', rates.tokens!, 120, ahead()); // a minute over: one token back in 61 s
      await a.admitClient('other', rates, ahead()); // after the spend, on a's connection
      const refusal = await b.admitClient('agents', rates, Date.now());
      expect(refusal?.by).toBe('tokens');
      expect(refusal!.waitMs).toBeGreaterThan(55_000);
      expect(refusal!.waitMs).toBeLessThan(65_000); // not 91 s: a's clock is not the fleet's
    } finally {
      await Promise.all([a.close(), b.close()]);
    }
  });
});

describe('MemoryStore: a client with both rates', () => {
  it('keeps its request rate\'s due time when its tokens are counted', async () => {
    const store = new MemoryStore();
    const rates = clientRates({ requestsPerMinute: 60, burst: 1, tokensPerMinute: 6000 });
    expect(await store.admitClient('agents', rates, 0)).toBeUndefined();
    store.spendTokens('agents', rates.tokens!, 10, 0);
    expect(await store.admitClient('agents', rates, 0)).toEqual({ waitMs: 1000, by: 'requests' });
  });
});

describe('client rate limits: a replayed answer', () => {
  const startGateway = useGateways();
  const startMock = useExtraMocks();

  // A replay reserves nothing (serve-managed.ts reserves after the key's claim, for a run only) and has no usage.
  it('counts no tokens for an answer replayed for a repeated idempotency key: no provider used any', async () => {
    const mock = await startMock();
    const call = async (url: string, key: string) => {
      const res = await fetch(`${url}/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: 'Bearer key-agents', 'content-type': 'application/json', 'idempotency-key': key },
        body: JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] }),
      });
      const body = (await res.json()) as { usage?: { total_tokens: number } };
      await sleep(50); // counted as the request ends, after its answer is sent
      return { status: res.status, tokens: body.usage?.total_tokens ?? 0 };
    };
    // How many tokens the mock's answer reports, on a gateway without limits.
    const probe = await startGateway(ConfigSchema.parse({ ...defaultConfig(mock.url, RETRY_LOOP_ONLY), auth: { keys: { agents: 'key-agents' } } }));
    const { tokens } = await call(probe, 'probe');
    expect(tokens).toBeGreaterThan(0);
    // What each request reserves (its body's bytes / 4, more than the answer uses) and one answer: once the first is
    // settled to what it used, one more reservation fits, and none after that.
    const estimate = Math.ceil(JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] }).length / 4);
    const url = await startGateway(ConfigSchema.parse({
      ...defaultConfig(mock.url, RETRY_LOOP_ONLY),
      auth: { keys: { agents: 'key-agents' }, limits: { agents: { tokensPerMinute: estimate + tokens } } },
    }));
    expect((await call(url, 'k1')).status).toBe(200);
    expect((await call(url, 'k1')).status).toBe(200); // replayed
    expect((await call(url, 'k2')).status).toBe(200); // the reservation left
    expect((await call(url, 'k3')).status).toBe(429);
  });
});

describe('client rate limits: a recovered stream', () => {
  const start = useScriptedUpstreams();

  it('counts the tokens of a streamRecovery continuation, which another target answered', async () => {
    const events = { 'content-type': 'text/event-stream' };
    const u = { usage: null };
    // p is cut after its first words, reporting no usage; q's continuation (the answer again, its text
    // already sent dropped) reports 1,290 tokens.
    const cut = (): Script => ({ headers: events, steps: [cc([delta({ role: 'assistant', content: '' })], u), cc([delta({ content: 'Net ' })], u), 50, { destroy: true }] });
    const rest = (): Script => ({ headers: events, steps: [cc([delta({ role: 'assistant', content: '' })], u), cc([delta({ content: 'Net ' })], u), cc([delta({ content: '30.' })], u), cc([delta({}, 'stop')], u), cc([], { usage: { prompt_tokens: 1234, completion_tokens: 56, total_tokens: 1290 } }), DONE] });
    const { s } = await start({ p: cut, q: rest }, [{ provider: 'p' }, { provider: 'q' }], {
      provider: { streamUsage: true },
      route: { streamRecovery: 'continue', retry: { maxAttempts: 1 } },
      extra: { auth: { keys: { agents: 'key-agents' }, limits: { agents: { tokensPerMinute: 1000 } } } },
    });
    const call = () => fetch(`${s.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: 'Bearer key-agents', 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'Payment terms?' }], stream: true }),
    });
    const first = await call();
    expect(first.status).toBe(200);
    expect(await first.text()).toContain('30.');
    await sleep(100); // counted as the request ends
    const second = await call();
    expect(second.status).toBe(429);
    expect(await second.json()).toMatchObject({ error: { code: 'client_rate_limited' } });
  });
});
