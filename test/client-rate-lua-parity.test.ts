// The Redis script (state/redis-scripts.ts) against policy/client-rate.ts, step by step: each step reads the due times
// Redis holds, asks both the same question at the same time, and compares the answers and what Redis stores after.
// The store round trip (fleet clock, fallbacks) is client-limits.test.ts's; this is the arithmetic only.
import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { describe, expect, it } from 'vitest';
import { admitClient, clientRates, QUEUE_AHEAD_MS, reserveTokens, retryAfterOf, spend, type ClientDues } from '../src/policy/client-rate.ts';
import { seededRandom } from '../src/policy/random.ts';
import { RedisKeys } from '../src/state/redis-keys.ts';
import { defineScripts } from '../src/state/redis-scripts.ts';
import { useRedisServer } from './helpers/redis-server.ts';

/** The '%.3f' the script stores: within half a microsecond of the policy's due time (plus the double's own rounding). */
const STORED_WITHIN_MS = 0.0005 + 1e-6;

/** A due time Redis holds against the policy's: both none (a full bucket: no key), or the same within the rounding. */
function expectDue(stored: number | undefined, policy: number | undefined): void {
  if (policy === undefined) expect(stored).toBeUndefined();
  else expect(Math.abs(stored! - policy)).toBeLessThanOrEqual(STORED_WITHIN_MS);
}

describe('the client-rate script answers as policy/client-rate.ts does', () => {
  const redis = useRedisServer();

  it.each([
    ['a request rate that does not divide a minute', { requestsPerMinute: 7, burst: 3 }],
    ['a request rate and a small token rate', { requestsPerMinute: 600, tokensPerMinute: 5_000 }],
    ['the largest token rate (60 µs a token) with a request rate', { requestsPerMinute: 6_000_000, burst: 5, tokensPerMinute: 1_000_000_000 }],
    ['a token rate alone', { tokensPerMinute: 90_000 }],
  ])('%s: same admissions and reservations, same waits (rounded up), same refusing rate, same due times stored, settled alike', async (_name, limit) => {
    const client = defineScripts(new Redis(redis().url));
    try {
      const keys = new RedisKeys(`parity-${randomUUID()}`);
      const rates = clientRates(limit);
      const requestsKey = keys.clientRate('a', 'requests', rates.requests);
      const tokensKey = keys.clientRate('a', 'tokens', rates.tokens);
      const toldKey = keys.clientTold('a', rates);
      const dueOf = async (key: string) => {
        const v = await client.get(key);
        return v === null ? undefined : Number(v);
      };
      const random = seededRandom(42);
      // Steps about as long as the spends take to pay back: both sides of the limit come up.
      const stepMs = Math.max(rates.requests?.intervalMs ?? 0, rates.tokens ? rates.tokens.intervalMs * rates.tokens.burst * 0.1 : 0);
      let nowMs = 1_700_000_000_000;
      let refused = 0;
      let reserved = 0;
      let reserveRefused = 0;
      let emptied = 0;
      for (let i = 0; i < 300; i++) {
        nowMs += Math.floor(random() * stepMs);
        const dues: ClientDues = { requests: await dueOf(requestsKey), tokens: await dueOf(tokensKey), told: await dueOf(toldKey) };
        const policy = admitClient(dues, nowMs, rates);
        const [waitMs, by] = await client.sgAdmitClient(
          requestsKey, tokensKey, toldKey, nowMs,
          rates.requests?.intervalMs ?? 0, rates.requests?.burst ?? 0, rates.tokens?.intervalMs ?? 0, rates.tokens?.burst ?? 0, QUEUE_AHEAD_MS,
        );
        if (policy.admitted) {
          expect(waitMs).toBe(0);
          if (policy.requestsDue !== undefined) {
            expect(Math.abs((await dueOf(requestsKey))! - policy.requestsDue)).toBeLessThanOrEqual(STORED_WITHIN_MS);
            // PX: kept until the due time has passed (then the bucket is full, as a missing key is), plus a second.
            expect(await client.pttl(requestsKey)).toBeGreaterThanOrEqual(Math.ceil(policy.requestsDue - nowMs) + 1000 - 500);
          }
        } else {
          refused++;
          expect(waitMs).toBe(Math.ceil(policy.waitMs));
          expect(by).toBe(policy.by === 'tokens' ? 2 : 1);
          expect(await dueOf(requestsKey)).toBe(dues.requests);
          expect(Math.abs((await dueOf(toldKey))! - policy.toldMs)).toBeLessThanOrEqual(STORED_WITHIN_MS);
          expect(await client.pttl(toldKey)).toBeGreaterThanOrEqual(Math.ceil(policy.toldMs - nowMs) + 1000 - 500);
        }
        if (rates.tokens !== undefined && random() < 0.6) {
          // Its body read, the request reserves its estimate (now and then more than the burst), whatever admitClient said.
          const before: ClientDues = { requests: await dueOf(requestsKey), tokens: await dueOf(tokensKey), told: await dueOf(toldKey) };
          const estimate = 1 + Math.floor(random() * random() * rates.tokens.burst * 1.2);
          const reservation = reserveTokens(before, nowMs, { ...rates, tokens: rates.tokens }, estimate);
          const [reserveWaitMs, reserveBy] = await client.sgReserveTokens(
            requestsKey, tokensKey, toldKey, nowMs, rates.requests?.intervalMs ?? 0, rates.tokens.intervalMs, rates.tokens.burst, estimate, QUEUE_AHEAD_MS,
          );
          if (reservation.admitted) {
            reserved++;
            expect(reserveWaitMs).toBe(0);
            expectDue(await dueOf(tokensKey), reservation.tokensDue);
            expect(await dueOf(requestsKey)).toBe(before.requests);
          } else {
            reserveRefused++;
            expect([reserveWaitMs, reserveBy]).toEqual([Math.ceil(reservation.waitMs), 2]);
            // The request admitClient counted is given back; the token rate is as it was.
            expectDue(await dueOf(requestsKey), reservation.requestsDue);
            expectDue(await dueOf(toldKey), reservation.toldMs);
            expect(await dueOf(tokensKey)).toBe(before.tokens);
          }
          // Settled later against what its answer used: up to twice the estimate, or less (given back, to a full
          // bucket at times, where the script deletes the key).
          if (!reservation.admitted) continue;
          nowMs += Math.floor(random() * stepMs);
          const settled = Math.round((random() * 1.6 - 0.6) * estimate);
          const dueBefore = await dueOf(tokensKey);
          await client.sgSpendTokens(tokensKey, nowMs, rates.tokens.intervalMs, settled);
          const dueAfter = spend(dueBefore, nowMs, rates.tokens, settled);
          if (dueAfter === undefined) emptied++;
          expectDue(await dueOf(tokensKey), dueAfter);
        }
      }
      // The sequence reaches both sides of the limit, or it compared nothing worth comparing.
      expect(refused).toBeGreaterThan(10);
      expect(refused).toBeLessThan(290);
      if (rates.tokens !== undefined) {
        expect(reserved).toBeGreaterThan(10);
        expect(reserveRefused).toBeGreaterThan(10);
        expect(emptied).toBeGreaterThan(0);
      }
    } finally {
      client.disconnect();
    }
  });
});

describe('when a refused client is told to come back', () => {
  const rates = clientRates({ requestsPerMinute: 60, burst: 1 }); // one a second

  it('tells requests refused together successive slots, as in a queue, each spread by at most one slot', () => {
    const dues: ClientDues = { requests: 10_400 };
    const answers = [0, 1, 2].map(() => {
      const v = admitClient(dues, 10_000, rates);
      if (v.admitted) throw new Error('admitted');
      dues.told = v.toldMs;
      return { ...v, retryAfterMs: retryAfterOf(v, rates, () => 0.5) };
    });
    expect(answers.map((a) => a.toldMs)).toEqual([10_400, 11_400, 12_400]);
    expect(answers.map((a) => a.waitMs)).toEqual([400, 1_400, 2_400]);
    expect(answers.map((a) => a.retryAfterMs)).toEqual([900, 1_900, 2_900]);
    // At most a minute past its own wait, however long the queue (agents looping on the 429 take a place each time).
    expect(admitClient({ requests: 10_400, told: 500_000 }, 10_000, rates)).toMatchObject({ admitted: false, waitMs: 400 + QUEUE_AHEAD_MS });
    // A queue told in the past is no queue: a later refusal waits for its own slot only.
    const later = admitClient({ requests: 21_000, told: dues.told }, 20_500, rates);
    expect(later).toMatchObject({ admitted: false, waitMs: 500, toldMs: 21_000 });
  });

  it('tells a token refusal when a token is back (or at the queue\'s end), spread by a fifth of the wait, never before it', () => {
    const tokens = clientRates({ tokensPerMinute: 600 });
    const v = admitClient({ tokens: 10_000 + 600 * 100 + 5_000 - 100 }, 10_000, tokens);
    expect(v).toMatchObject({ admitted: false, by: 'tokens', waitMs: 5_000, toldMs: 15_000 });
    if (v.admitted) return;
    expect(retryAfterOf(v, tokens, () => 0.999)).toBe(Math.ceil(5_000 + 0.999 * 1_000));
    expect(retryAfterOf(v, tokens, () => 0)).toBe(5_000);
    expect(admitClient({ tokens: 10_000 + 600 * 100 + 5_000 - 100, told: 18_000 }, 10_000, tokens)).toMatchObject({ waitMs: 8_000, toldMs: 18_000 });
  });
});
