import { describe, expect, it } from 'vitest';
import { canWait, decideRetryWait, type WaitInputs } from '../src/policy/retry-wait.ts';
import { RetrySchema } from '../src/config/schema.ts';

const retry = RetrySchema.parse({ backoff: { strategy: 'full-jitter', baseMs: 200, capMs: 3000 }, maxWaitHintMs: 20_000 });
const base: WaitInputs = { retry, hint: undefined, retryIndex: 0, prevDelayMs: undefined, nowMs: 0, deadlineAtMs: 60_000, minAttemptMs: 1_000, random: () => 0.5 };

describe('the retry wait', () => {
  it('uses the backoff when the upstream gave no hint', () => {
    expect(decideRetryWait(base)).toEqual({ wait: true, delayMs: 100, fromHint: false });
    expect(decideRetryWait({ ...base, retryIndex: 2 })).toEqual({ wait: true, delayMs: 400, fromHint: false });
  });

  it('uses the hint times U(1, 1.2) when the upstream gave one', () => {
    const d = decideRetryWait({ ...base, hint: { delayMs: 2_000, source: 'retry-after', fleetWide: true }, random: () => 0.5 });
    expect(d).toEqual({ wait: true, delayMs: 2_200, fromHint: true });
  });

  it('does not retry on a hint over maxWaitHintMs and hands it to the client', () => {
    const d = decideRetryWait({ ...base, hint: { delayMs: 30_000, source: 'retry-after', fleetWide: true } });
    expect(d).toEqual({ wait: false, why: 'hint-too-long', retryAfterMs: 30_000 });
  });

  it('does not retry when the wait would leave no time for an attempt before the deadline', () => {
    const d = decideRetryWait({ ...base, hint: { delayMs: 5_000, source: "retry-after", fleetWide: true }, nowMs: 55_000 });
    expect(d).toEqual({ wait: false, why: 'deadline', retryAfterMs: 5_000 });
    expect(decideRetryWait({ ...base, nowMs: 59_000 })).toEqual({ wait: false, why: 'deadline', retryAfterMs: undefined });
  });

  it('waits exactly when wait plus one attempt fits before the deadline', () => {
    expect(canWait(0, 1_000, 2_000, 1_000)).toBe(true);
    expect(canWait(1, 1_000, 2_000, 1_000)).toBe(false);
  });
});
