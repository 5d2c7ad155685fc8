// The mock's rate limit (FaultSpec.rateLimit): a token bucket per model as OpenAI enforces requests and tokens per
// minute, its 429s and headers in OpenAI's and Anthropic's own shapes, set by flag, spec or the control endpoint; and
// the gateway reading such a 429 as the rate limit with a wait hint that it is.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { decide, FaultCounters, type FaultSpec, type RateLimit, type RequestFacts } from '../src/mock/faults.ts';
import { goDuration, rateTake, refill, requestTokens, rfc3339, type RateBucket } from '../src/mock/rate-limit.ts';
import { startMock, type MockServer } from '../src/mock/server.ts';
import { TEST_KEY, useStacks } from './helpers/stack.ts';

const T0 = 1_800_000_000_000;

describe('the rate limit\'s buckets (pure, fake clock)', () => {
  it('takes one request a time from a full bucket and refills a minute\'s worth per minute, continuously', () => {
    const limit: RateLimit = { requestsPerMinute: 3 };
    let b: RateBucket | undefined;
    const take = (atMs: number) => {
      const o = rateTake(limit, b, atMs, 10);
      b = o.bucket;
      return o;
    };
    expect(take(T0)).toMatchObject({ admitted: true, retryMs: 0, state: { requests: { limit: 3, remaining: 2, resetMs: 20_000 }, tokens: undefined } });
    expect(take(T0).state.requests).toEqual({ limit: 3, remaining: 1, resetMs: 40_000 });
    expect(take(T0).state.requests).toEqual({ limit: 3, remaining: 0, resetMs: 60_000 });
    // Empty: the next request fits once a whole request has refilled (20 s at 3 a minute), and is refused whole before.
    expect(take(T0 + 5_000)).toMatchObject({ admitted: false, refused: 'requests', tooLarge: false, retryMs: 15_000, state: { requests: { remaining: 0, resetMs: 55_000 } } });
    expect(b!.requests).toBe(0.25);
    expect(take(T0 + 19_999).admitted).toBe(false);
    expect(take(T0 + 20_000)).toMatchObject({ admitted: true, state: { requests: { remaining: 0, resetMs: 60_000 } } });
    // Never more than a minute's worth, however long the bucket sat.
    expect(refill(limit, b, T0 + 3_600_000).requests).toBe(3);
  });

  it('counts a request\'s tokens at arrival and refuses one larger than what is left, or than the whole limit', () => {
    const limit: RateLimit = { requestsPerMinute: 100, tokensPerMinute: 1_000 };
    const first = rateTake(limit, undefined, T0, 600);
    expect(first.state).toEqual({ requests: { limit: 100, remaining: 99, resetMs: 600 }, tokens: { limit: 1_000, remaining: 400, resetMs: 36_000 } });
    // 600 more need 200 refilled: 12 s at 1,000 a minute. Nothing is spent by the refusal.
    const second = rateTake(limit, first.bucket, T0, 600);
    expect(second).toMatchObject({ admitted: false, refused: 'tokens', tooLarge: false, retryMs: 12_000, requested: 600 });
    expect(second.bucket).toEqual({ requests: 99, tokens: 400, atMs: T0 });
    expect(rateTake(limit, second.bucket, T0 + 12_000, 600)).toMatchObject({ admitted: true, state: { tokens: { remaining: 0 } } });
    // More than a minute's worth never fits: refused with no wait that would help, even from a full bucket.
    expect(rateTake(limit, undefined, T0, 1_001)).toMatchObject({ admitted: false, refused: 'tokens', tooLarge: true, retryMs: undefined });
    // Both limits out: the refusal names the requests, and the wait is the longer one.
    const both = rateTake({ requestsPerMinute: 1, tokensPerMinute: 100 }, { requests: 0.5, tokens: 0, atMs: T0 }, T0, 50);
    expect(both).toMatchObject({ refused: 'requests', retryMs: 30_000 });
  });

  it('holds burstSeconds\' worth in a shallower bucket, at the same rate', () => {
    // 600 a minute enforced as 10 a second: 10 at once after a quiet spell, then one every 100 ms.
    const limit: RateLimit = { requestsPerMinute: 600, tokensPerMinute: 6_000, burstSeconds: 1 };
    let b = rateTake(limit, undefined, T0, 10).bucket;
    expect(b).toEqual({ requests: 9, tokens: 90, atMs: T0 });
    for (let i = 0; i < 9; i++) b = rateTake(limit, b, T0, 10).bucket;
    const refused = rateTake(limit, b, T0, 10);
    expect(refused).toMatchObject({ admitted: false, refused: 'requests', retryMs: 100, state: { requests: { limit: 600, remaining: 0, resetMs: 1_000 } } });
    expect(rateTake(limit, b, T0 + 100, 10).admitted).toBe(true);
    expect(refill(limit, b, T0 + 60_000)).toEqual({ requests: 10, tokens: 100, atMs: T0 + 60_000 });
    // A request over what the shallower bucket holds goes once it is full, and overdraws it; one over the minute's
    // limit never fits.
    const large = rateTake(limit, undefined, T0, 150);
    expect(large).toMatchObject({ admitted: true, tooLarge: false, bucket: { tokens: -50 } });
    expect(rateTake(limit, large.bucket, T0 + 1_000, 150)).toMatchObject({ admitted: false, refused: 'tokens', tooLarge: false, retryMs: 500 });
    expect(rateTake(limit, large.bucket, T0 + 1_500, 150).admitted).toBe(true);
    expect(rateTake(limit, undefined, T0, 6_001)).toMatchObject({ admitted: false, tooLarge: true });
  });

  it('estimates a request as OpenAI counts it: body bytes / 4 plus the completion cap, times n', () => {
    expect(requestTokens(401, {})).toBe(101);
    expect(requestTokens(400, { max_tokens: 50 })).toBe(150);
    expect(requestTokens(400, { max_completion_tokens: 20, max_tokens: 50 })).toBe(120);
    expect(requestTokens(400, { max_tokens: 50, n: 3 })).toBe(250);
    expect(requestTokens(400, { max_output_tokens: 7 })).toBe(107);
    expect(requestTokens(400, { max_tokens: 'lots' })).toBe(100);
  });

  it('writes durations as OpenAI does and resets as Anthropic does', () => {
    expect([0, 6, 19.2, 1_200, 20_000, 59_999.5, 60_000, 90_500, 360_000, 3_723_000].map(goDuration)).toEqual(['0s', '6ms', '20ms', '1.2s', '20s', '1m0s', '1m0s', '1m30.5s', '6m0s', '1h2m3s']);
    expect(rfc3339(Date.UTC(2026, 11, 3, 12, 0, 0, 1))).toBe('2026-12-03T12:00:01Z');
  });

  it('is checked after brownouts and capacity, and before the other faults', () => {
    const refused = rateTake({ requestsPerMinute: 1 }, { requests: 0, tokens: undefined, atMs: T0 }, T0, 1);
    const facts: RequestFacts = { model: 'm', isRetry: false, inflight: 0, modelInflight: 0, brownout: undefined, rate: refused };
    const spec: FaultSpec = { capacity: 1, errors: [{ status: 503 }] };
    const c = new FaultCounters();
    expect(decide(spec, c, { ...facts, brownout: '503' }, () => 0).kind).toBe('brownout');
    expect(decide(spec, c, { ...facts, inflight: 1 }, () => 0).kind).toBe('capacity');
    expect(decide(spec, c, facts, () => 0)).toEqual({ kind: 'rateLimit', outcome: refused });
    // The error rule's counter did not count the refused request.
    expect(c.get('errors.0@*').n).toBe(0);
  });
});

async function post(url: string, path: string, body: object, headers: Record<string, string> = {}) {
  const res = await fetch(url + path, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
  return { status: res.status, headers: res.headers, body: (await res.json()) as Record<string, unknown> };
}
const chat = (url: string, model: string, extra: object = {}) => post(url, '/v1/chat/completions', { model, messages: [{ role: 'user', content: 'hi' }], ...extra });
const messages = (url: string, model: string) => post(url, '/v1/messages', { model, max_tokens: 16, messages: [{ role: 'user', content: 'hi' }] });
const control = async (url: string, method: string, body?: object) => {
  const res = await fetch(`${url}/_mock/faults`, { method, headers: { 'content-type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body) });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
};

describe('the rate limit on the wire', () => {
  let mock: MockServer;
  beforeAll(async () => {
    mock = await startMock({ quiet: true });
  });
  afterAll(async () => {
    await mock.close();
  });
  beforeEach(() => {
    mock.setFaults({});
    mock.reset();
  });

  it('answers OpenAI\'s RPM 429, with its body and x-ratelimit-* headers and no retry-after, and counts down on the answers', async () => {
    mock.setFaults({ rateLimit: { requestsPerMinute: 2 } });
    const ok = [await chat(mock.url, 'gpt-4o'), await chat(mock.url, 'gpt-4o')];
    expect(ok.map((r) => r.status)).toEqual([200, 200]);
    expect(ok.map((r) => r.headers.get('x-ratelimit-limit-requests'))).toEqual(['2', '2']);
    expect(ok.map((r) => r.headers.get('x-ratelimit-remaining-requests'))).toEqual(['1', '0']);
    expect(ok[0]!.headers.get('x-ratelimit-reset-requests')).toMatch(/^(?:2\d|30)(?:\.\d+)?s$/);
    expect(ok[0]!.headers.get('x-ratelimit-limit-tokens')).toBeNull();

    const refused = await chat(mock.url, 'gpt-4o');
    expect(refused.status).toBe(429);
    const error = (refused.body as { error: { message: string } }).error;
    expect(refused.body).toEqual({ error: { message: error.message, type: 'requests', param: null, code: 'rate_limit_exceeded' } });
    expect(error.message).toMatch(
      /^Rate limit reached for gpt-4o in organization org-mock on requests per min \(RPM\): Limit 2, Used 2, Requested 1\. Please try again in (?:29|30)(?:\.\d+)?s\. Visit https:\/\/platform\.openai\.com\/account\/rate-limits to learn more\.$/,
    );
    expect(refused.headers.get('x-ratelimit-remaining-requests')).toBe('0');
    // About a minute until the bucket is full again: time to full, as OpenAI's reset says.
    expect(refused.headers.get('x-ratelimit-reset-requests')).toMatch(/^(?:59(?:\.\d+)?s|1m0s)$/);
    expect(refused.headers.get('retry-after')).toBeNull();
    expect(refused.headers.get('retry-after-ms')).toBeNull();
    const stats = mock.stats();
    expect(stats.byStatus).toEqual({ 200: 2, 429: 1 });
    expect(stats.rateLimited).toEqual({ requests: 1, tokens: 0 });
  });

  it('answers OpenAI\'s TPM 429 and "Request too large", and retry-after-ms and retry-after when asked for', async () => {
    mock.setFaults({ rateLimit: { tokensPerMinute: 300, retryAfter: true } });
    const first = await chat(mock.url, 'gpt-4o-mini', { max_tokens: 200 });
    expect(first.status).toBe(200);
    const left = Number(first.headers.get('x-ratelimit-remaining-tokens'));
    expect(left).toBeGreaterThan(50);
    expect(left).toBeLessThan(100);
    expect(first.headers.get('x-ratelimit-limit-tokens')).toBe('300');
    expect(first.headers.get('x-ratelimit-limit-requests')).toBe('100000');

    const refused = await chat(mock.url, 'gpt-4o-mini', { max_tokens: 200 });
    expect(refused.status).toBe(429);
    expect(refused.body).toMatchObject({ error: { type: 'tokens', param: null, code: 'rate_limit_exceeded' } });
    expect((refused.body as { error: { message: string } }).error.message).toMatch(/^Rate limit reached for gpt-4o-mini in organization org-mock on tokens per min \(TPM\): Limit 300, Used 2\d\d, Requested 2\d\d\. Please try again in \d+(?:\.\d+)?s\./);
    const retryMs = Number(refused.headers.get('retry-after-ms'));
    expect(retryMs).toBeGreaterThan(20_000);
    expect(refused.headers.get('retry-after')).toBe(String(Math.ceil(retryMs / 1000)));

    const tooLarge = await chat(mock.url, 'gpt-4o-mini', { max_tokens: 400 });
    expect(tooLarge.status).toBe(429);
    expect((tooLarge.body as { error: { message: string; type: string } }).error).toMatchObject({ type: 'tokens', message: expect.stringMatching(/^Request too large for gpt-4o-mini in organization org-mock on tokens per min \(TPM\): Limit 300, Requested 4\d\d\. The input or output tokens must be reduced/) });
    expect(tooLarge.headers.get('retry-after')).toBeNull();
    expect(mock.stats().rateLimited).toEqual({ requests: 0, tokens: 2 });
  });

  it('answers Anthropic\'s 429 on /v1/messages, with anthropic-ratelimit-* headers and retry-after in seconds', async () => {
    mock.setFaults({ rateLimit: { requestsPerMinute: 1, tokensPerMinute: 10_000 } });
    const ok = await messages(mock.url, 'claude-sonnet-4-5');
    expect(ok.status).toBe(200);
    expect(ok.headers.get('anthropic-ratelimit-requests-limit')).toBe('1');
    expect(ok.headers.get('anthropic-ratelimit-requests-remaining')).toBe('0');
    expect(ok.headers.get('anthropic-ratelimit-tokens-limit')).toBe('10000');
    const reset = Date.parse(ok.headers.get('anthropic-ratelimit-requests-reset')!);
    expect(ok.headers.get('anthropic-ratelimit-requests-reset')).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    expect(reset - Date.now()).toBeGreaterThan(55_000);
    expect(reset - Date.now()).toBeLessThanOrEqual(61_000);
    // Anthropic's names only: no OpenAI header next to them.
    expect([...ok.headers.keys()].filter((k) => k.startsWith('x-ratelimit'))).toEqual([]);

    const refused = await messages(mock.url, 'claude-sonnet-4-5');
    expect(refused.status).toBe(429);
    expect(refused.body).toEqual({
      type: 'error',
      error: { type: 'rate_limit_error', message: expect.stringMatching(/^This request would exceed the rate limit for your organization \(mock\) of 1 requests per minute\./) },
      request_id: refused.headers.get('request-id'),
    });
    expect(Number(refused.headers.get('retry-after'))).toBeGreaterThanOrEqual(55);
    expect(Number(refused.headers.get('retry-after'))).toBeLessThanOrEqual(60);
    expect(refused.headers.get('anthropic-ratelimit-requests-remaining')).toBe('0');
    expect(mock.stats().byStatus['429']).toBe(1);
  });

  it('gives every model a bucket of its own, at the global limit or at its override', async () => {
    mock.setFaults({ rateLimit: { requestsPerMinute: 2 }, models: { small: { rateLimit: { requestsPerMinute: 1 } }, free: { rateLimit: {} } } });
    const statuses = async (model: string, n: number) => {
      const out: number[] = [];
      for (let i = 0; i < n; i++) out.push((await chat(mock.url, model)).status);
      return out;
    };
    expect(await statuses('a', 3)).toEqual([200, 200, 429]);
    expect(await statuses('b', 3)).toEqual([200, 200, 429]);
    expect(await statuses('small', 2)).toEqual([200, 429]);
    expect(await statuses('free', 4)).toEqual([200, 200, 200, 200]);
    expect((await chat(mock.url, 'small')).headers.get('x-ratelimit-limit-requests')).toBe('1');
    expect(mock.stats().rateLimited.requests).toBe(4);
  });

  it('is set, changed and removed through the control endpoint, which refills the buckets and refuses a malformed limit', async () => {
    expect((await control(mock.url, 'PATCH', { rateLimit: { requestsPerMinute: 1 } })).body).toEqual({ rateLimit: { requestsPerMinute: 1 } });
    expect((await chat(mock.url, 'gpt-4o')).status).toBe(200);
    expect((await chat(mock.url, 'gpt-4o')).status).toBe(429);
    // A new limit starts full.
    await control(mock.url, 'PATCH', { rateLimit: { requestsPerMinute: 2 } });
    expect([(await chat(mock.url, 'gpt-4o')).status, (await chat(mock.url, 'gpt-4o')).status, (await chat(mock.url, 'gpt-4o')).status]).toEqual([200, 200, 429]);
    // Per model, through `models`.
    await control(mock.url, 'PATCH', { models: { 'gpt-4o': { rateLimit: { requestsPerMinute: 3 } } } });
    expect((await chat(mock.url, 'gpt-4o')).headers.get('x-ratelimit-limit-requests')).toBe('3');
    expect((await control(mock.url, 'PATCH', { rateLimit: { requestsPerMinute: -1 } })).status).toBe(400);
    expect((await control(mock.url, 'PATCH', { rateLimit: { rpm: 5 } })).status).toBe(400);
    expect((await control(mock.url, 'PATCH', { rateLimit: { retryAfter: 'yes' } })).status).toBe(400);
    await control(mock.url, 'PATCH', { rateLimit: null, models: null });
    expect((await control(mock.url, 'GET')).body).toEqual({});
    for (let i = 0; i < 5; i++) expect((await chat(mock.url, 'gpt-4o')).status).toBe(200);
    // POST /_mock/reset refills them too.
    mock.setFaults({ rateLimit: { requestsPerMinute: 1 } });
    expect((await chat(mock.url, 'x')).status).toBe(200);
    await fetch(`${mock.url}/_mock/reset`, { method: 'POST' });
    expect((await chat(mock.url, 'x')).status).toBe(200);
  });
});

describe('the rate limit\'s flags', () => {
  let child: ChildProcess | undefined;
  afterEach(() => {
    if (child && child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    child = undefined;
  });

  it('--rate-limit-rpm, --rate-limit-tpm, --rate-limit-burst-seconds and --rate-limit-retry-after set the global rateLimit', async () => {
    // node itself with tsx's loader, not the tsx binary: that one runs the mock in a child of its own, which a kill of
    // the binary would leave listening.
    child = spawn(process.execPath, ['--import', 'tsx', 'src/mock/main.ts', '--port', '0', '--quiet', '--rate-limit-rpm', '120', '--rate-limit-tpm', '5000', '--rate-limit-burst-seconds', '1', '--rate-limit-retry-after'], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout!.on('data', (d: Buffer) => (out += String(d)));
    while (!/listening on (\S+)/.test(out)) await once(child.stdout!, 'data');
    const url = /listening on (\S+)/.exec(out)![1]!;
    expect((await control(url, 'GET')).body).toEqual({ rateLimit: { requestsPerMinute: 120, tokensPerMinute: 5000, burstSeconds: 1, retryAfter: true } });
  }, 30_000);
});

describe('the gateway in front of the rate-limited mock', () => {
  const stack = useStacks();

  it('reads its 429 as a rate limit whose x-ratelimit-reset-requests hint is longer than maxWaitHintMs: one attempt, the hint passed on', async () => {
    const s = await stack({ faults: { rateLimit: { requestsPerMinute: 2 } } });
    const send = () =>
      fetch(`${s.baseURL}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${TEST_KEY}` },
        body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
      });
    expect([(await send()).status, (await send()).status]).toEqual([200, 200]);
    const res = await send();
    const body = (await res.json()) as { error: { code: string; type: string } };
    // README, Retries: a hint longer than retry.maxWaitHintMs (20 s) ends retries on the target and reaches the client
    // as retry-after; x-ratelimit-reset-* starts no hold-off. The mock saw the one attempt.
    expect(res.status).toBe(429);
    expect(body.error).toMatchObject({ code: 'rate_limit_exceeded', type: 'requests' });
    expect(s.mock.stats().total).toBe(3);
    expect(s.mock.stats().rateLimited.requests).toBe(1);
    expect(s.mock.requests().every((r) => r.headers['x-retry-attempt'] === undefined)).toBe(true);
    // Within 60 s and sent upstream once: the client is invited back (x-should-retry: true) after the hint, never past 60 s
    // (README, What the client sees). The message's own "try again in 30s" is shorter: the reset is when the bucket is full.
    expect(res.headers.get('x-stormgate-attempts')).toBe('1');
    expect(res.headers.get('x-should-retry')).toBe('true');
    expect(Number(res.headers.get('retry-after-ms'))).toBeGreaterThanOrEqual(55_000);
    expect(Number(res.headers.get('retry-after-ms'))).toBeLessThanOrEqual(60_000);
    expect(Number(res.headers.get('retry-after'))).toBe(Math.ceil(Number(res.headers.get('retry-after-ms')) / 1000));
  });
});
