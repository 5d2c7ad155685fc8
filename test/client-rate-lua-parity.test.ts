// The Redis script (state/redis-scripts.ts) against policy/client-rate.ts, step by step: each step reads the due times
// Redis holds, asks both the same question at the same time, and compares the answers and what Redis stores after.
// The store round trip (fleet clock, fallbacks) is client-limits.test.ts's; this is the arithmetic only.
import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { describe, expect, it } from 'vitest';
import { admitClient, clientRates, comeBack, spend, type ClientDues } from '../src/policy/client-rate.ts';
import { seededRandom } from '../src/policy/random.ts';
import { RedisKeys } from '../src/state/redis-keys.ts';
import { defineScripts } from '../src/state/redis-scripts.ts';
import { useRedisServer } from './helpers/redis-server.ts';

/** The '%.3f' the script stores: within half a microsecond of the policy's due time (plus the double's own rounding). */
const STORED_WITHIN_MS = 0.0005 + 1e-6;

describe('the client-rate script answers as policy/client-rate.ts does', () => {
  const redis = useRedisServer();

  it.each([
    ['a request rate that does not divide a minute', { requestsPerMinute: 7, burst: 3 }],
    ['a request rate and a small token rate', { requestsPerMinute: 600, tokensPerMinute: 5_000 }],
    ['the largest token rate (60 µs a token) with a request rate', { requestsPerMinute: 6_000_000, burst: 5, tokensPerMinute: 1_000_000_000 }],
    ['a token rate alone', { tokensPerMinute: 90_000 }],
  ])('%s: same admissions, same waits (rounded up), same refusing rate, same due times stored', async (_name, limit) => {
    const client = defineScripts(new Redis(redis().url));
    try {
      const keys = new RedisKeys(`parity-${randomUUID()}`);
      const rates = clientRates(limit);
      const requestsKey = keys.clientRate('a', 'requests', rates.requests);
      const tokensKey = keys.clientRate('a', 'tokens', rates.tokens);
      const dueOf = async (key: string) => {
        const v = await client.get(key);
        return v === null ? undefined : Number(v);
      };
      const random = seededRandom(42);
      // Steps about as long as the spends take to pay back: both sides of the limit come up.
      const stepMs = Math.max(rates.requests?.intervalMs ?? 0, rates.tokens ? rates.tokens.intervalMs * rates.tokens.burst * 0.1 : 0);
      let nowMs = 1_700_000_000_000;
      let refused = 0;
      for (let i = 0; i < 300; i++) {
        nowMs += Math.floor(random() * stepMs);
        const dues: ClientDues = { requests: await dueOf(requestsKey), tokens: await dueOf(tokensKey) };
        const policy = admitClient(dues, nowMs, rates);
        const [waitMs, by] = await client.sgAdmitClient(
          requestsKey, tokensKey, nowMs,
          rates.requests?.intervalMs ?? 0, rates.requests?.burst ?? 0, rates.tokens?.intervalMs ?? 0, rates.tokens?.burst ?? 0,
        );
        if (policy.admitted) {
          expect(waitMs).toBe(0);
          if (policy.requestsDue !== undefined) {
            expect(Math.abs((await dueOf(requestsKey))! - policy.requestsDue)).toBeLessThanOrEqual(STORED_WITHIN_MS);
            // PX: kept until the due time has passed (then the bucket is full, as a missing key is), plus a second.
            expect(await client.pttl(requestsKey)).toBeGreaterThanOrEqual(Math.ceil(policy.requestsDue - nowMs) + 1000 - 50);
          }
        } else {
          refused++;
          expect(waitMs).toBe(Math.ceil(policy.waitMs));
          expect(by).toBe(policy.by === 'tokens' ? 2 : 1);
          expect(await dueOf(requestsKey)).toBe(dues.requests);
        }
        if (rates.tokens !== undefined && random() < 0.6) {
          const tokens = 1 + Math.floor(random() * random() * rates.tokens.burst * 0.4);
          await client.sgSpendTokens(tokensKey, nowMs, rates.tokens.intervalMs, tokens);
          expect(Math.abs((await dueOf(tokensKey))! - spend(dues.tokens, nowMs, rates.tokens, tokens))).toBeLessThanOrEqual(STORED_WITHIN_MS);
        }
      }
      // The sequence reaches both sides of the limit, or it compared nothing worth comparing.
      expect(refused).toBeGreaterThan(10);
      expect(refused).toBeLessThan(290);
    } finally {
      client.disconnect();
    }
  });
});

describe('when a refused client is told to come back (comeBack)', () => {
  const rates = clientRates({ requestsPerMinute: 60, burst: 1 }); // one a second

  it('tells requests refused together successive slots, as in a queue, each spread by at most one slot', () => {
    let told = 0;
    const answers = [0, 1, 2].map(() => {
      const r = comeBack({ waitMs: 400, by: 'requests' }, rates, 10_000, told, () => 0.5);
      told = r.toldMs;
      return r;
    });
    expect(answers.map((a) => a.toldMs)).toEqual([10_400, 11_400, 12_400]);
    expect(answers.map((a) => a.retryAfterMs)).toEqual([900, 1_900, 2_900]);
  });

  it('tells a token refusal when a token is back, spread by a fifth of the wait, never before it', () => {
    const r = comeBack({ waitMs: 5_000, by: 'tokens' }, clientRates({ tokensPerMinute: 600 }), 10_000, 0, () => 0.999);
    expect(r.toldMs).toBe(15_000);
    expect(r.retryAfterMs).toBe(Math.ceil(5_000 + 0.999 * 1_000));
    expect(comeBack({ waitMs: 5_000, by: 'tokens' }, clientRates({ tokensPerMinute: 600 }), 10_000, 0, () => 0).retryAfterMs).toBe(5_000);
  });
});
