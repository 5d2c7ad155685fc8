// Hand mutation testing of 2026-12-07's changes, a third round after mutation-mut-today-54 and -55: the order of the
// wait-hint sources and the earlier drafts' RateLimit-Reset (policy/wait-hint.ts), APIM's bandwidth quota
// (providers/error-outcome.ts) and which limits end a lower-class hold (policy/quota-headers.ts quotaNotLow). Each test
// kills a mutant that the features' own tests let live.
import { describe, expect, it } from 'vitest';
import { quotaLowUntil, quotaNotLow } from '../src/policy/quota-headers.ts';
import { parseWaitHint } from '../src/policy/wait-hint.ts';
import { httpOutcome, isQuotaRefusal } from '../src/providers/error-outcome.ts';

const NOW = Date.UTC(2026, 11, 7, 12, 0, 0);

describe("RateLimit-Reset (the IETF draft's earlier fields: Kong, Botpress, GitLab)", () => {
  it('is a hint on its own: only a RateLimit-Remaining with room left makes it none', () => {
    expect(parseWaitHint({ 'ratelimit-reset': '30' }, NOW)).toEqual({ delayMs: 30_000, source: 'ratelimit', fleetWide: false });
    expect(parseWaitHint({ 'ratelimit-reset': '30', 'ratelimit-remaining': '3' }, NOW)).toBeUndefined();
  });

  it('a reset of 0 says "now", which is no hint (never a wait of 0 ms)', () => {
    expect(parseWaitHint({ 'ratelimit-reset': '0', 'ratelimit-remaining': '0' }, NOW)).toBeUndefined();
    expect(parseWaitHint({ 'ratelimit-reset': '0' }, NOW)).toBeUndefined();
  });
});

describe("the order of the reset sources: a provider's own windowed limits before a gateway's RateLimit in front", () => {
  it("a used-up Cerebras window is the hint, not the RateLimit field of the limiter in front of it", () => {
    const headers = {
      'x-ratelimit-remaining-tokens-minute': '0',
      'x-ratelimit-reset-tokens-minute': '5',
      ratelimit: '"default";r=0;t=60',
    };
    expect(parseWaitHint(headers, NOW)).toEqual({ delayMs: 5_000, source: 'x-ratelimit-reset', fleetWide: false });
  });
});

describe("API Management's quota 403 (quota-by-key), before any family translates it", () => {
  const apim = (message: string) => Buffer.from(JSON.stringify({ statusCode: 403, message }));

  it('a spent bandwidth quota is the 429 of a limit whose end is known, as a spent call volume is', () => {
    const body = apim('Out of bandwidth quota. Quota will be replenished in 00:05:00.');
    expect(isQuotaRefusal(403, { 'retry-after': '300' }, body, NOW)).toBe(true);
    expect(httpOutcome(403, { 'retry-after': '300' }, body, NOW)).toMatchObject({ status: 429, hint: { delayMs: 300_000, fleetWide: true } });
    // Without the Retry-After its end is not known: the credentials path stays.
    expect(httpOutcome(403, {}, body, NOW)).toMatchObject({ status: 403 });
  });
});

describe('quotaNotLow: whether an answer ends a lower-class hold begun on an earlier one', () => {
  it('never while a limit is nearly spent, even one whose reset is missing (quotaLowUntil has none to hold to)', () => {
    const spentNoReset = { 'x-ratelimit-limit-requests': '1000', 'x-ratelimit-remaining-requests': '5', 'x-ratelimit-limit-tokens': '100000', 'x-ratelimit-remaining-tokens': '90000' };
    expect(quotaLowUntil(spentNoReset, NOW)).toBeUndefined();
    expect(quotaNotLow(spentNoReset)).toBe(false);
  });

  it("reads Anthropic's limits too: room left there ends the hold, one nearly spent keeps it", () => {
    expect(quotaNotLow({ 'anthropic-ratelimit-requests-limit': '1000', 'anthropic-ratelimit-requests-remaining': '990' })).toBe(true);
    expect(quotaNotLow({ 'anthropic-ratelimit-requests-limit': '1000', 'anthropic-ratelimit-requests-remaining': '990', 'anthropic-ratelimit-output-tokens-limit': '80000', 'anthropic-ratelimit-output-tokens-remaining': '100' })).toBe(false);
  });
});
