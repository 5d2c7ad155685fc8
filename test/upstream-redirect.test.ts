// A provider that answers a managed request with a redirect: a baseUrl on http that the provider moves to https, a
// host that moved. The gateway never follows it (the body and the key would go to a host nobody configured), never
// retries it on that target (it answers the same), fails over like on refused credentials, keeps it from the breaker,
// and, when nothing answers, tells the client (and the operator) what to fix in a 502 of its own.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { classify, isRetryable, mayHaveRun, OUTCOME_TABLE, type AttemptOutcome } from '../src/policy/outcome.ts';
import { RetrySchema, type ConfigInput } from '../src/config/schema.ts';
import { useFakeProviders, type FakeProvider } from './helpers/fake-provider.ts';
import { expectOpenAIError } from './helpers/openai-error.ts';
import { defaultConfig, metricSum, RETRY_LOOP_ONLY, requestLine, useStacks, type Stack } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();

const KEY = 'moved-provider-key-0123456789';
const messages = [{ role: 'user' as const, content: 'hi' }];
const http = (status: number): AttemptOutcome => ({ kind: 'http', status, errorCode: null, hint: undefined });

/** A provider that answers every request with `status` and `location` (none when undefined), after reading its body. */
async function movedProvider(status: number, location: string | undefined): Promise<FakeProvider> {
  return startProvider((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(status, { 'content-type': 'text/html', ...(location !== undefined && { location }) });
      res.end(`<html><body>Moved. key=${KEY}</body></html>`);
    });
  });
}

/**
 * The moved provider first (three attempts allowed, 502 among the statuses retried), the healthy mock after it when
 * `fallback`; `breaker` for the moved one.
 */
function config(mockUrl: string, moved: FakeProvider, opts: { fallback?: boolean; breaker?: ConfigInput['providers'][string]['breaker'] } = {}): ConfigInput {
  const base = defaultConfig(mockUrl, {
    ...RETRY_LOOP_ONLY,
    route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 3, retryOn: [429, 500, 502, 503, 504, 'network', 'timeout'], backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } },
  });
  return {
    ...base,
    providers: { ...base.providers, moved: { family: 'openai', baseUrl: `${moved.origin}/v1`, apiKey: KEY, breaker: opts.breaker ?? false } },
    routes: base.routes.map((r) => ({ ...r, targets: opts.fallback ? [{ provider: 'moved' }, { provider: 'mock' }] : [{ provider: 'moved' }] })),
  };
}

async function chat(s: Stack, extra: Record<string, unknown> = {}): Promise<{ status: number; headers: Headers; body: unknown }> {
  const res = await fetch(`${s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', messages, ...extra }),
  });
  return { status: res.status, headers: res.headers, body: await res.json() };
}

describe('an upstream redirect, in the outcome table', () => {
  for (const status of [301, 302, 303, 307, 308]) {
    it(`classifies ${status} as a redirect: never retried whatever retryOn says, nothing for the breaker, no run of the request`, () => {
      const c = classify(http(status));
      expect(c).toEqual({ cls: 'redirect', retryKey: null, reason: `status_${status}` });
      expect(isRetryable(c, [...RetrySchema.parse({}).retryOn, 502, status as 502])).toBe(false);
      expect(mayHaveRun(http(status))).toBe(false);
    });
  }

  it('hides the provider\'s body and keeps the redirect from the breaker, the hold-offs and the adaptive limit', () => {
    expect(OUTCOME_TABLE.redirect).toEqual({ retryable: false, passThrough: false, breaker: 'ignore', holdOff: false, limit: 'none', failover: 'next', verdict: false, fallback: 'redirect', nextFirst: false });
  });
});

describe('an upstream redirect, over HTTP', () => {
  it('answers 502 upstream_redirect naming the status and where it pointed, after one attempt, and never follows it', async () => {
    const moved = await movedProvider(301, `https://api.example.com/v1/chat/completions?token=${KEY}#frag`);
    const s = await startStack({ config: (url) => config(url, moved) });
    const { status, headers, body } = await chat(s);
    expect(status).toBe(502);
    expect(headers.get('x-should-retry')).toBe('false');
    expect(headers.get('retry-after')).toBeNull();
    const e = expectOpenAIError(body, 'upstream_redirect', 'server_error');
    expect(e.message).toMatch(/answered a redirect \(301, location api\.example\.com\/v1\/chat\/completions\)/);
    expect(e.message).toMatch(/check that provider's baseUrl/);
    // Neither the query that held the key nor the provider's page reaches the client.
    expect(e.message).not.toContain(KEY);
    expect(e.message).not.toContain('Moved');
    expect(moved.hits()).toBe(1);
    expect(s.mock.stats().total).toBe(0);
    const line = await requestLine(s);
    expect(line.attempts.map((a: { reason: string }) => a.reason)).toEqual(['status_301']);
  });

  it('says the key it finds in the location\'s path as [redacted], and only printable text', async () => {
    const moved = await movedProvider(307, `/v2/${KEY}/chat\u0085completions`);
    const s = await startStack({ config: (url) => config(url, moved) });
    const e = expectOpenAIError((await chat(s)).body, 'upstream_redirect', 'server_error');
    expect(e.message).toContain('(307, location /v2/[redacted]/chat?completions)');
  });

  it('says when the redirect named no location', async () => {
    const moved = await movedProvider(302, undefined);
    const s = await startStack({ config: (url) => config(url, moved) });
    const e = expectOpenAIError((await chat(s)).body, 'upstream_redirect', 'server_error');
    expect(e.message).toContain('(302, no location given)');
  });

  it('fails over to the next target at once, with x-stormgate-fallback: redirect', async () => {
    const moved = await movedProvider(308, 'https://elsewhere.example.com/v1/chat/completions');
    const s = await startStack({ config: (url) => config(url, moved, { fallback: true }) });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    const { data, response } = await client.chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(data.choices[0]!.message.content).toMatch(/Mock answer/);
    expect(response.headers.get('x-stormgate-fallback')).toBe('redirect');
    expect(response.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
    expect(moved.hits()).toBe(1);
    expect(await metricSum(s, 'stormgate_fallbacks_total{route="chat",from="moved/gpt-4o",to="mock/gpt-4o",reason="redirect"}')).toBe(1);
    expect(await metricSum(s, 'stormgate_upstream_attempts_total{target="moved/gpt-4o",status_class="3xx"}')).toBe(1);
  });

  it('never opens the breaker: every request is told to fix the baseUrl, not that the provider is down', async () => {
    const moved = await movedProvider(301, 'https://api.example.com/v1/chat/completions');
    const s = await startStack({ config: (url) => config(url, moved, { breaker: { consecutiveFailures: 2, openS: 60 } }) });
    for (let i = 0; i < 4; i++) {
      const { status, body } = await chat(s);
      expect(status).toBe(502);
      expectOpenAIError(body, 'upstream_redirect', 'server_error');
    }
    expect(moved.hits()).toBe(4);
    expect(await metricSum(s, 'stormgate_breaker_state{target="moved/gpt-4o"}')).toBe(0);
  });

  it('treats a redirect to a stream request the same way: a 502 in the OpenAI shape the SDK raises, no stream', async () => {
    const moved = await movedProvider(301, 'https://api.example.com/v1/chat/completions');
    const s = await startStack({ config: (url) => config(url, moved) });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    const err = await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(502);
    expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('upstream_redirect');
    expect(moved.hits()).toBe(1);
  });
});
