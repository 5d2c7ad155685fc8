// Retry behaviour over real HTTP against the bundled mock: attempts per status, fail-fast statuses, wait hints,
// retry headers and the client's view of a failure.
import { describe, expect, it } from 'vitest';
import { requestLine, startStack, RETRY_LOOP_ONLY, useStacks, type Stack } from './helpers/stack.ts';

const FAST_RETRY = { maxAttempts: 3, backoff: { strategy: 'full-jitter' as const, baseMs: 5, capMs: 20 } };


const start = useStacks({ ...RETRY_LOOP_ONLY, route: { ...RETRY_LOOP_ONLY.route, retry: FAST_RETRY } });

async function chat(s: Stack, body: Record<string, unknown> = {}, headers: Record<string, string> = {}) {
  const res = await fetch(`${s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: 'Bearer client-key', ...headers },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], ...body }),
  });
  return { res, body: (await res.json()) as Record<string, any> };
}

describe('retries over HTTP', () => {
  for (const status of [429, 500, 502, 503, 504, 529]) {
    it(`makes exactly maxAttempts attempts on a persistent ${status}, then returns it with x-should-retry: false`, async () => {
      const s = await start({ faults: { errors: [{ status, rate: 1 }] } });
      const { res, body } = await chat(s);
      expect(s.mock.stats().total).toBe(3);
      expect(res.status).toBe(status);
      expect(res.headers.get('x-should-retry')).toBe('false');
      expect(res.headers.get('x-stormgate-attempts')).toBe('3');
      expect(body.error).toMatchObject({ message: expect.any(String), type: expect.any(String) });
      expect(Object.keys(body.error).sort()).toEqual(['code', 'message', 'param', 'type']);
    });
  }

  it("uses a target's retry in place of the route's as a whole: a field it leaves out is the default, not the route's", async () => {
    // The route allows 1 attempt; the target sets only its backoff, so it gets the default maxAttempts (3).
    const s = await start({
      faults: { errors: [{ status: 503, rate: 1 }] },
      route: { retry: { maxAttempts: 1 }, targets: [{ provider: 'mock', retry: { backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } }] },
    });
    const { res } = await chat(s);
    expect(res.status).toBe(503);
    expect(s.mock.stats().total).toBe(3);
  });

  const failFast: Array<[string, { status: number; code?: string }]> = [
    ['400', { status: 400 }],
    ['404', { status: 404 }],
    ['422', { status: 422 }],
    ['400 context_length_exceeded', { status: 400, code: 'context_length_exceeded' }],
    ['400 content_policy_violation', { status: 400, code: 'content_policy_violation' }],
  ];
  for (const [name, rule] of failFast) {
    it(`reaches the upstream once on ${name} and passes its error through`, async () => {
      const s = await start({ faults: { errors: [{ ...rule, rate: 1, message: 'upstream says no' }] } });
      const { res, body } = await chat(s);
      expect(s.mock.stats().total).toBe(1);
      expect(res.status).toBe(rule.status);
      expect(res.headers.get('x-should-retry')).toBe('false');
      expect(body.error.message).toBe('upstream says no');
      if (rule.code) expect(body.error.code).toBe(rule.code);
    });
  }

  for (const [name, rule] of [
    ['401', { status: 401 }],
    ['402 (billing: Anthropic\'s billing_error, OpenRouter\'s credits)', { status: 402 }],
    ['403', { status: 403 }],
    ['429 insufficient_quota', { status: 429, code: 'insufficient_quota' }],
  ] as const) {
    it(`answers an upstream ${name} once with 502 upstream_auth_error, never the provider's body`, async () => {
      const s = await start({ faults: { errors: [{ ...rule, rate: 1, message: 'Incorrect API key provided: sk-test-st***6789' }] } });
      const { res, body } = await chat(s);
      expect(s.mock.stats().total).toBe(1);
      expect(res.status).toBe(502);
      expect(body.error.code).toBe('upstream_auth_error');
      expect(JSON.stringify(body)).not.toContain('sk-test');
      expect(res.headers.get('x-should-retry')).toBe('false');
    });
  }

  it("tells no retry-after with the upstream_auth_error of a 429 insufficient_quota that carries OpenAI's rate-limit headers", async () => {
    // Every limit has room: the token limit's reset says nothing about a spent quota, which no wait brings back.
    const headers = { 'x-ratelimit-remaining-requests': '499', 'x-ratelimit-remaining-tokens': '29000', 'x-ratelimit-reset-requests': '120ms', 'x-ratelimit-reset-tokens': '2s' };
    const s = await start({ faults: { errors: [{ status: 429, code: 'insufficient_quota', rate: 1, headers }] } });
    const { res, body } = await chat(s);
    expect(body.error.code).toBe('upstream_auth_error');
    expect(res.headers.get('retry-after')).toBeNull();
    expect(res.headers.get('retry-after-ms')).toBeNull();
  });

  it('tells no retry-after with the upstream_auth_error of a 429 insufficient_quota that carries a retry-after of its own', async () => {
    // No wait mends a spent quota: a client told to come back in 20 s came back to the same refusal.
    const s = await start({ faults: { errors: [{ status: 429, code: 'insufficient_quota', rate: 1, headers: { 'retry-after': '20' } }] } });
    const { res, body } = await chat(s);
    expect(body.error.code).toBe('upstream_auth_error');
    expect(res.headers.get('retry-after')).toBeNull();
    expect(res.headers.get('x-should-retry')).toBe('false');
  });

  it('succeeds on a retry and says how many attempts it took', async () => {
    const s = await start({ faults: { errors: [{ status: 503, rate: 1, times: 2 }] } });
    const { res, body } = await chat(s);
    expect(res.status).toBe(200);
    expect(body.object).toBe('chat.completion');
    expect(res.headers.get('x-stormgate-attempts')).toBe('3');
    expect(res.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
  });

  it('marks every retried upstream request with x-retry-attempt and x-retry-reason', async () => {
    const s = await start({ faults: { errors: [{ status: 503, rate: 1, times: 2 }] } });
    await chat(s);
    const seen = s.mock.requests().map((r) => [r.headers['x-retry-attempt'], r.headers['x-retry-reason']]);
    expect(seen).toEqual([
      [undefined, undefined],
      ['1', 'status_503'],
      ['2', 'status_503'],
    ]);
  });

  it('waits out a retry-after-ms hint (times 1 to 1.2) before retrying', async () => {
    const s = await start({ faults: { errors: [{ status: 429, rate: 1, times: 1, headers: { 'retry-after-ms': '300' } }] } });
    const { res } = await chat(s);
    expect(res.status).toBe(200);
    const [first, second] = s.mock.requests();
    const gap = second!.receivedAt - first!.receivedAt;
    expect(gap).toBeGreaterThanOrEqual(290);
    expect(gap).toBeLessThan(2_000);
  });

  it('does not retry on a hint longer than maxWaitHintMs and hands it to the client as retry-after', async () => {
    const s = await start({ faults: { errors: [{ status: 429, rate: 1, headers: { 'retry-after': '60' } }] } });
    const { res } = await chat(s);
    expect(s.mock.stats().total).toBe(1);
    expect(res.status).toBe(429);
    expect(res.headers.get('retry-after')).toBe('60');
    // Sent upstream once: the client may come back after the wait, as the requests its hold-off turns away are told.
    expect(res.headers.get('x-should-retry')).toBe('true');
  });

  it('does not invite the client back after a hint over 60 s, nor after the gateway retried', async () => {
    const s = await start({ faults: { errors: [{ status: 429, rate: 1, headers: { 'retry-after': '600' } }] } });
    const { res } = await chat(s);
    expect(res.headers.get('retry-after')).toBe('600');
    expect(res.headers.get('x-should-retry')).toBe('false');
    await s.close();
    const t = await start({ faults: { errors: [{ status: 503, rate: 1, times: 1 }, { status: 429, rate: 1, headers: { 'retry-after': '30' } }] } });
    const again = await chat(t);
    expect(t.mock.stats().total).toBe(2);
    expect(again.res.status).toBe(429);
    expect(again.res.headers.get('x-should-retry')).toBe('false');
  });

  it('does not retry on a hint longer than the time left before the deadline', async () => {
    const s = await start({ faults: { errors: [{ status: 503, rate: 1, headers: { 'retry-after': '3' } }] } });
    const { res } = await chat(s, {}, { 'x-stormgate-timeout-ms': '2000' });
    expect(s.mock.stats().total).toBe(1);
    expect(res.status).toBe(503);
    // The hint, to the end of the hold-off it started (hint plus a spread of up to a tenth of it), plus the request's
    // own spread (up to a fifth of that).
    expect(Number(res.headers.get('retry-after-ms'))).toBeGreaterThanOrEqual(3000);
    expect(Number(res.headers.get('retry-after-ms'))).toBeLessThanOrEqual(3300 * 1.2 + 1);
  });

  it('ignores a malformed hint and falls back to the backoff', async () => {
    const s = await start({ faults: { errors: [{ status: 429, rate: 1, times: 1, headers: { 'retry-after': 'soon-ish', 'retry-after-ms': '-4' } }] } });
    const { res } = await chat(s);
    expect(res.status).toBe(200);
    expect(s.mock.stats().total).toBe(2);
  });

  it('retries a connection reset before headers and a refused connection as network failures', async () => {
    const s = await start({ faults: { resetRate: 0.5 } });
    const { res } = await chat(s);
    expect(res.status).toBe(200);
    const dead = await startStack({ route: { retry: FAST_RETRY } });
    await dead.mock.close();
    const r = await chat(dead);
    expect(r.res.status).toBe(502);
    expect(r.body.error.code).toBe('upstream_unavailable');
    expect(r.body.error.message).toMatch(/3 attempts/);
    await dead.gateway.close();
  });

  it('logs the code of each network failure that the client\'s message names, not only the reason `network`', async () => {
    // A provider whose baseUrl points nowhere: the operator reads the log line, not the client's message.
    const s = await start();
    await s.mock.close();
    const { res, body } = await chat(s);
    expect(res.status).toBe(502);
    expect(body.error.message).toMatch(/\(last: ECONNREFUSED\)/);
    const line = await requestLine(s);
    expect(line.attempts).toHaveLength(3);
    for (const attempt of line.attempts) expect(attempt).toMatchObject({ reason: 'network', code: 'ECONNREFUSED' });
  });

  it('logs no code for an attempt answered with an HTTP status', async () => {
    const s = await start({ faults: { errors: [{ status: 503, rate: 1 }] } });
    await chat(s);
    const line = await requestLine(s);
    expect(line.attempts).toHaveLength(3);
    for (const attempt of line.attempts) {
      expect(attempt).toMatchObject({ reason: 'status_503', status: 503 });
      expect(attempt).not.toHaveProperty('code');
    }
  });
});
