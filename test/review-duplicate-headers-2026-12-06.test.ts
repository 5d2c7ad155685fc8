// A proxy in front of the gateway that adds x-stormgate-timeout-ms again: Node joins the two values with ", ", and the
// request was refused 400 as if the client had written a bad number.
import { describe, expect, it } from 'vitest';
import { computeDeadline, timeoutHeaderMs } from '../src/policy/deadline.ts';
import { checkTimeoutHeader } from '../src/http/timeout-header.ts';

describe('x-stormgate-timeout-ms sent twice', () => {
  it('reads the shorter of the joined values', () => {
    expect(timeoutHeaderMs('5000, 5000')).toBe(5000);
    expect(timeoutHeaderMs('8000, 3000')).toBe(3000);
    expect(() => checkTimeoutHeader({ 'x-stormgate-timeout-ms': '5000, 5000' })).not.toThrow();
    const d = computeDeadline({ routeTimeoutMs: 120_000, marginMs: undefined, headers: { 'x-stormgate-timeout-ms': '8000, 3000' } });
    expect(d).toMatchObject({ timeoutMs: 3000, source: 'x-stormgate-timeout-ms' });
  });

  it('still refuses a list with any value that is not a positive number', () => {
    for (const bad of ['5000, abc', '5000, 0', '5000,', ', 5000', '5000, -1', '0x10, 5000', '1,5', '3000,8000']) {
      expect(timeoutHeaderMs(bad), bad).toBeUndefined();
      expect(() => checkTimeoutHeader({ 'x-stormgate-timeout-ms': bad }), bad).toThrow(/positive number of milliseconds/);
    }
  });
});
