// Regular expressions run on text a client or a provider chooses must take time linear in its length: a backtracking
// pattern that is quadratic on a crafted 50 KB string holds the event loop (every request of the gateway) for seconds,
// and a 10 MB body (server.bodyLimitBytes) for hours. Each case below took seconds before its pattern was rewritten.
import { describe, expect, it } from 'vitest';
import { toAnthropicRequest } from '../src/providers/anthropic/index.ts';
import { parseDurationMs, parseWaitHint } from '../src/policy/wait-hint.ts';
import { globMatcher } from '../src/routing/router.ts';
import { errorAnswer, withSkipNote } from '../src/pipeline/final-answer.ts';
import { GatewayError } from '../src/errors.ts';

const N = 50_000;
/** Well under what any of these took before (2-30 s), and far above what a linear scan of 50 KB takes on a busy machine. */
const LIMIT_MS = 250;

function timed<T>(fn: () => T): { ms: number; value: T } {
  const start = performance.now();
  const value = fn();
  return { ms: performance.now() - start, value };
}

describe('patterns on client- and provider-controlled text run in linear time', () => {
  it('a chat image_url that is "data:" and 50 KB without a comma (translated for an Anthropic target)', () => {
    const request = { model: 'gpt-4o', messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: `data:${'x'.repeat(N)}` } }] }] };
    const { ms, value } = timed(() => toAnthropicRequest(request as never, { model: 'claude-sonnet-4-5', defaultMaxTokens: 1024 }));
    expect(value).toMatchObject({ ok: false, param: 'messages[0].content[0].image_url.url' });
    expect(ms).toBeLessThan(LIMIT_MS);
  });

  it('a chat file part whose file_data is "data:" and 50 KB without a comma', () => {
    const request = { model: 'gpt-4o', messages: [{ role: 'user', content: [{ type: 'file', file: { file_data: `data:${'x'.repeat(N)}` } }] }] };
    const { ms, value } = timed(() => toAnthropicRequest(request as never, { model: 'claude-sonnet-4-5', defaultMaxTokens: 1024 }));
    expect(value).toMatchObject({ ok: false });
    expect(ms).toBeLessThan(LIMIT_MS);
  });

  it('still reads data: URLs with parameters before ;base64', () => {
    const png = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk';
    for (const url of [`data:image/png;base64,${png}`, `data:image/png;name=a.png;base64,${png}`, `data:image/png;charset=x;base64,${png}`]) {
      const r = toAnthropicRequest({ model: 'gpt-4o', messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url } }] }] } as never, { model: 'claude-sonnet-4-5', defaultMaxTokens: 1024 });
      expect(r.ok ? r.body.messages[0]!.content : r.reason).toEqual([{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: png } }]);
    }
  });

  it('an x-ratelimit-reset-requests header of 16 KB of digits (a Go duration with no unit)', () => {
    const value = '1'.repeat(16_000) + 'x';
    const { ms, value: parsed } = timed(() => parseDurationMs(value));
    expect(parsed).toBeUndefined();
    expect(ms).toBeLessThan(LIMIT_MS);
    const hint = timed(() => parseWaitHint({ 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': value }, Date.now()));
    expect(hint.ms).toBeLessThan(LIMIT_MS);
    // Go's forms still parse, "1." included (Go accepts it).
    expect([parseDurationMs('1m30.5s'), parseDurationMs('20ms'), parseDurationMs('1.s'), parseDurationMs('.5s'), parseDurationMs('6m0s')]).toEqual([90_500, 20, 1000, 500, 360_000]);
  });

  it('a model name of 50 KB against a route glob with two stars', () => {
    const glob = globMatcher('*gpt*mini');
    const { ms, value } = timed(() => glob('gpt'.repeat(N / 3)));
    expect(value).toBe(false);
    expect(ms).toBeLessThan(LIMIT_MS);
    expect(['gpt-4o-mini', 'my-gpt-mini', 'gptmini'].map((m) => glob(m))).toEqual([true, true, true]);
    expect(['gpt-4o-mini-2', 'gpt-4o', 'gpt\nmini'].map((m) => glob(m))).toEqual([false, false, true]);
    expect([globMatcher('*')(''), globMatcher('a*a')('a'), globMatcher('a*a')('aa'), globMatcher('gpt-4o*')('gpt-4o'), globMatcher('a*b*c')('abc'), globMatcher('a*b*c')('acb')]).toEqual([true, false, true, true, true, false]);
  });

  it('an upstream error message of 50 KB of spaces before its last word, when a note is appended to it', () => {
    const answer = errorAnswer(new GatewayError('upstream_unavailable', `overloaded${' '.repeat(N)}x`));
    const { ms, value } = timed(() => withSkipNote(answer, 'a/gpt-4o', [{ target: 'b/claude', reason: 'n > 1' }]));
    expect(value.body.error.message.endsWith('x; not tried: b/claude (n > 1)')).toBe(true);
    expect(ms).toBeLessThan(LIMIT_MS);
    const plain = withSkipNote(errorAnswer(new GatewayError('upstream_unavailable', 'upstream failed.  ')), 'a', [{ target: 'b', reason: 'r' }]);
    expect(plain.body.error.message).toBe('upstream failed; not tried: b (r)');
  });
});
