// The gateway's own process out of file descriptors (EMFILE: thousands of streams under a low open-files limit) is not
// the provider failing: nothing was sent, and the breaker (shared fleet-wide with Redis) must not open on it.
import { afterEach, describe, expect, it } from 'vitest';
import { Pool } from 'undici';
import { classify, isRetryable, mayHaveRun, OUTCOME_TABLE } from '../src/policy/outcome.ts';
import { transportOutcome } from '../src/providers/transport-errors.ts';
import { metricSum, useStacks } from './helpers/stack.ts';

/** What net.connect raises when the process has no descriptor left for the socket. */
function emfile(): Error {
  return Object.assign(new Error('connect EMFILE 127.0.0.1:443 - Local (undefined:undefined)'), { code: 'EMFILE', errno: -24, syscall: 'connect' });
}

describe('a connection refused by the gateway\'s own open-files limit', () => {
  it('is a local resource failure: retryable, never sent, and no verdict on the provider', () => {
    const outcome = transportOutcome(emfile());
    expect(outcome).toEqual({ kind: 'network', code: 'EMFILE' });
    const c = classify(outcome);
    expect(c.cls).toBe('local-resource');
    expect(OUTCOME_TABLE[c.cls].breaker).toBe('ignore');
    expect(isRetryable(c, ['network'])).toBe(true);
    expect(mayHaveRun(outcome)).toBe(false);
    // A refused connection stays the provider's failure.
    expect(classify(transportOutcome(Object.assign(new Error('refused'), { code: 'ECONNREFUSED' }))).cls).toBe('network');
  });

  const pools: Pool[] = [];
  afterEach(async () => {
    await Promise.all(pools.splice(0).map((p) => p.destroy()));
  });
  const stack = useStacks();

  it('does not open the breaker, and the client is told it is the gateway\'s limit', async () => {
    // Every connection attempt fails as it does when the process is at its descriptor limit.
    const pool = new Pool('http://127.0.0.1:9', { connect: (_opts, cb) => cb(emfile(), null) });
    pools.push(pool);
    const s = await stack({
      deps: { dispatcher: pool },
      provider: { breaker: { consecutiveFailures: 3 } },
      route: { park: false, retry: { maxAttempts: 2, backoff: { strategy: 'full-jitter', baseMs: 1, capMs: 5 } } },
    });
    const answers: Array<{ status: number; code: string; message: string }> = [];
    for (let i = 0; i < 6; i++) {
      const res = await fetch(`${s.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
      });
      const body = (await res.json()) as { error: { code: string; message: string } };
      answers.push({ status: res.status, code: body.error.code, message: body.error.message });
    }
    // Before the fix the third request's failures opened the breaker: the rest got 503 circuit_open.
    expect(answers.map((a) => a.code)).toEqual(Array(6).fill('upstream_unavailable'));
    expect(answers[0]!.message).toContain('open-files limit');
    expect(s.logs.some((l) => l.includes('"breaker open"'))).toBe(false);
    expect(await metricSum(s, 'stormgate_breaker_state{')).toBe(0);
    // Its retries are counted as the gateway's limit, not as the provider's network failing.
    expect(await metricSum(s, 'stormgate_retry_count_total{route="chat",target="mock/gpt-4o",reason="local_resource"}')).toBe(6);
    expect(await metricSum(s, 'stormgate_retry_count_total{route="chat",target="mock/gpt-4o",reason="network"}')).toBe(0);
  });
});
