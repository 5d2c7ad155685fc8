import { describe, expect, it } from 'vitest';
import { computeDeadline, timeoutHeaderMs } from '../src/policy/deadline.ts';

describe('the request deadline', () => {
  it('uses the route timeout minus the larger of 250 ms and 5% when the client sends nothing', () => {
    expect(computeDeadline({ routeTimeoutMs: 120_000, marginMs: undefined, headers: {} })).toEqual({ budgetMs: 114_000, timeoutMs: 120_000, source: 'route' });
    expect(computeDeadline({ routeTimeoutMs: 2_000, marginMs: undefined, headers: {} }).budgetMs).toBe(1_750);
  });

  it.each(['0x10', '1e3', '0b11', '-5', '0', '', ' ', 'Infinity', '10ms'])('refuses x-stormgate-timeout-ms %j (only a positive decimal)', (v) => {
    expect(timeoutHeaderMs(v)).toBeUndefined();
  });

  it.each([['1500', 1500], [' 250 ', 250], ['99.5', 99.5]])('reads x-stormgate-timeout-ms %j', (v, ms) => {
    expect(timeoutHeaderMs(v)).toBe(ms);
  });

  it('takes x-stormgate-timeout-ms when it is shorter', () => {
    const d = computeDeadline({ routeTimeoutMs: 120_000, marginMs: undefined, headers: { 'x-stormgate-timeout-ms': '10000' } });
    expect(d).toEqual({ budgetMs: 9_500, timeoutMs: 10_000, source: 'x-stormgate-timeout-ms' });
  });

  it('reads the SDK timeout in whole seconds, 0 as 1 s', () => {
    expect(computeDeadline({ routeTimeoutMs: 120_000, marginMs: undefined, headers: { 'x-stainless-timeout': '10' } }).timeoutMs).toBe(10_000);
    expect(computeDeadline({ routeTimeoutMs: 120_000, marginMs: undefined, headers: { 'x-stainless-timeout': '0' } }).timeoutMs).toBe(1_000);
    expect(computeDeadline({ routeTimeoutMs: 120_000, marginMs: undefined, headers: { 'x-stainless-read-timeout': '2.5' } })).toMatchObject({ timeoutMs: 2_500, source: 'x-stainless-read-timeout' });
  });

  it.each([
    ['Anthropic/JS 0.39.0', 2_000],
    ['Anthropic/JS 0.37.0', 2_000],
    ['OpenAI/JS 4.83.0', 2_000],
    ['OpenAI/JS 4.91.1', 2_000],
    ['Anthropic/JS 0.40.0', 2_000_000],
    ['OpenAI/JS 4.92.0', 2_000_000],
    ['OpenAI/JS 4.104.0', 2_000_000],
    ['OpenAI/Python 1.50.0', 2_000_000],
  ])('reads x-stainless-timeout 2000 from %s as %i ms (the releases that sent milliseconds)', (ua, ms) => {
    const d = computeDeadline({ routeTimeoutMs: 3_000_000_000, marginMs: undefined, headers: { 'x-stainless-timeout': '2000', 'user-agent': ua } });
    expect(d.timeoutMs).toBe(ms);
  });

  it('keeps the smallest of every timeout', () => {
    const d = computeDeadline({
      routeTimeoutMs: 60_000,
      marginMs: 100,
      headers: { 'x-stormgate-timeout-ms': '30000', 'x-stainless-timeout': '20', 'x-stainless-read-timeout': '25' },
    });
    expect(d).toEqual({ budgetMs: 19_900, timeoutMs: 20_000, source: 'x-stainless-timeout' });
  });

  it('keeps back a configured margin whole, but at most half of a shorter client timeout', () => {
    // The route's 5 s margin on 60 s; an SDK with a 3 s timeout keeps 1.5 s back, not all 5 s (which left it 50 ms).
    expect(computeDeadline({ routeTimeoutMs: 60_000, marginMs: 5_000, headers: {} }).budgetMs).toBe(55_000);
    expect(computeDeadline({ routeTimeoutMs: 60_000, marginMs: 5_000, headers: { 'x-stainless-timeout': '3' } }).budgetMs).toBe(1_500);
    expect(computeDeadline({ routeTimeoutMs: 60_000, marginMs: 5_000, headers: { 'x-stormgate-timeout-ms': '30000' } }).budgetMs).toBe(25_000);
    expect(computeDeadline({ routeTimeoutMs: 120_000, marginMs: 600, headers: { 'x-stormgate-timeout-ms': '1500' } }).budgetMs).toBe(900);
    // And a margin of 0 stays 0.
    expect(computeDeadline({ routeTimeoutMs: 60_000, marginMs: 100, headers: { 'x-stainless-timeout': '3' } }).budgetMs).toBe(2_900);
    expect(computeDeadline({ routeTimeoutMs: 60_000, marginMs: 0, headers: { 'x-stainless-timeout': '3' } }).budgetMs).toBe(3_000);
  });

  it('ignores a longer client timeout and malformed values', () => {
    expect(computeDeadline({ routeTimeoutMs: 5_000, marginMs: 0, headers: { 'x-stainless-timeout': '600', 'x-stormgate-timeout-ms': '9000' } }).timeoutMs).toBe(5_000);
    for (const value of ['abc', '-5', '', 'Infinity']) {
      expect(computeDeadline({ routeTimeoutMs: 5_000, marginMs: 0, headers: { 'x-stainless-timeout': value, 'x-stormgate-timeout-ms': value } }).timeoutMs).toBe(5_000);
    }
  });
});
