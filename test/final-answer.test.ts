import { describe, expect, it } from 'vitest';
import { unavailableAnswer } from '../src/pipeline/final-answer.ts';

describe('unavailableAnswer', () => {
  it('never tells a client to come back at once: a window ending as the answer is written is at least 100 ms, 1 s in retry-after', () => {
    const held = unavailableAnswer({ reason: 'hold-off', target: 'mock/gpt-4o', retryAfterMs: 0 });
    expect(held.headers).toMatchObject({ 'retry-after-ms': '100', 'retry-after': '1', 'x-should-retry': 'true' });
    expect(held.body.error.message).toBe('target mock/gpt-4o asked for no requests for another 1 s');
    const open = unavailableAnswer({ reason: 'breaker', target: 'mock/gpt-4o', retryAfterMs: 0 });
    expect(open.headers).toMatchObject({ 'retry-after-ms': '100', 'retry-after': '1' });
    expect(open.body.error.message).toMatch(/retry in 1 s$/);
    expect(unavailableAnswer({ reason: 'hold-off', target: 't', retryAfterMs: 2_500 }).headers).toMatchObject({ 'retry-after-ms': '2500', 'retry-after': '3' });
  });
});
