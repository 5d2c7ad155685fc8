// README claims checked by running them (audit 46: config defaults as they act, the metrics table, headers, priority
// pools, the Redis-shared state and the error table), pinned here where no other test held them end to end. Every claim
// checked held; where a first reading of one was wrong, the test says what the README says (a client's `via` text is
// not passed on, only gateways' entries; a hold-off lasts its hint plus a spread; a declared client retry spends budget).
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { Redis } from 'ioredis';
import { request, type IncomingHttpHeaders } from 'node:http';
import { connect } from 'node:net';
import { chatCompletion, useFakeProviders } from './helpers/fake-provider.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { freePort } from './helpers/free-port.ts';
import { RETRY_LOOP_ONLY, TEST_KEY, defaultConfig, requestLine, scrapeMetrics, useExtraMocks, useGateways, useStacks, type MetricSample } from './helpers/stack.ts';

const startStack = useStacks();
const startMock = useExtraMocks();
const startGateway = useGateways();
const redis = useRedisServer();
const startFake = useFakeProviders();

const CHAT = { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] };

function chat(url: string, headers: Record<string, string> = {}, body: unknown = CHAT): Promise<Response> {
  return fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: typeof body === 'string' ? body : JSON.stringify(body) });
}

/** The value of the one series of `name` with exactly these labels (undefined when absent). */
function value(samples: MetricSample[], name: string, labels: Record<string, string> = {}): number | undefined {
  return samples.find((s) => s.name === name && JSON.stringify(Object.entries(s.labels).sort()) === JSON.stringify(Object.entries(labels).sort()))?.value;
}

async function errorOf(res: Response): Promise<{ message: string; type: string; param: string | null; code: string | null }> {
  return ((await res.json()) as { error: { message: string; type: string; param: string | null; code: string | null } }).error;
}

describe('a config that sets nothing but providers and routes', () => {
  it('keeps connections alive 72 s, takes 10 MiB bodies, routes as online, and counts the answer in the documented series', async () => {
    const s = await startStack();
    const res = await chat(s.url);
    expect(res.status).toBe(200);
    expect(res.headers.get('keep-alive')).toBe('timeout=72');
    const answer = (await res.json()) as { usage: { prompt_tokens: number; completion_tokens: number } };
    const line = await requestLine(s);
    expect(line.priority).toBe('online');
    const target = line.target as string;
    expect(target).toBe('mock/gpt-4o');

    const big = await chat(s.url, {}, JSON.stringify({ ...CHAT, pad: 'x'.repeat(10_485_760) }));
    expect(big.status).toBe(413);
    const e = await errorOf(big);
    expect(e.code).toBe('request_too_large');
    expect(e.message).toContain('10485760');
    const justUnder = JSON.stringify({ ...CHAT, pad: '' });
    const fits = await chat(s.url, {}, justUnder.replace('"pad":""', `"pad":"${'x'.repeat(10_485_760 - justUnder.length)}"`));
    expect(fits.status).toBe(200);
    await fits.arrayBuffer();

    const m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_requests_total', { route: 'chat', target, priority: 'online', outcome: 'success' })).toBe(2);
    expect(value(m, 'stormgate_requests_total', { route: 'none', target: 'none', priority: 'none', outcome: 'rejected' })).toBe(1);
    expect(value(m, 'stormgate_tokens_total', { route: 'chat', target, kind: 'prompt' })).toBeGreaterThanOrEqual(answer.usage.prompt_tokens);
    expect(value(m, 'stormgate_tokens_total', { route: 'chat', target, kind: 'completion' })).toBe(answer.usage.completion_tokens * 2);
    expect(value(m, 'stormgate_request_duration_seconds_count', { route: 'chat', attempt: 'first' })).toBe(2);
    expect(value(m, 'stormgate_upstream_attempts_total', { target, status_class: '2xx' })).toBe(2);
    // Default classes online and batch; the pool's limit starts at maxConcurrent, which defaults to maxConnections (64 here).
    for (const priority of ['online', 'batch']) {
      expect(value(m, 'stormgate_pool_in_use', { provider: 'mock', priority })).toBe(0);
      expect(value(m, 'stormgate_pool_queue_depth', { provider: 'mock', priority })).toBe(0);
    }
    expect(value(m, 'stormgate_pool_wait_seconds_count', { provider: 'mock', priority: 'online' })).toBe(2);
    expect(value(m, 'stormgate_pool_limit', { target })).toBe(64);
    // Budget defaults: ratio 0.1 of 2 requests is under the floor, minRetriesPerSecond 10 × windowS 10.
    expect(value(m, 'stormgate_retry_budget_remaining', { route: 'chat' })).toBe(100);
    expect(value(m, 'stormgate_state_degraded')).toBe(0);
    expect(value(m, 'stormgate_waiting_body_bytes')).toBe(0);
    expect(value(m, 'stormgate_breaker_state', { target })).toBe(0);
  });

  it('lowers a request to batch with x-stormgate-priority, counts a declared client retry, and times a stream', async () => {
    const s = await startStack();
    const batch = await chat(s.url, { 'x-stormgate-priority': 'batch', 'x-stainless-retry-count': '1' });
    expect(batch.status).toBe(200);
    await batch.arrayBuffer();
    const stream = await chat(s.url, {}, { ...CHAT, stream: true, stream_options: { include_usage: true } });
    expect(stream.status).toBe(200);
    await stream.text();
    await new Promise((r) => setTimeout(r, 50));
    const m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_requests_total', { route: 'chat', target: 'mock/gpt-4o', priority: 'batch', outcome: 'success' })).toBe(1);
    expect(value(m, 'stormgate_pool_wait_seconds_count', { provider: 'mock', priority: 'batch' })).toBe(1);
    expect(value(m, 'stormgate_client_retries_total', { route: 'chat', how: 'declared' })).toBe(1);
    expect(value(m, 'stormgate_ttft_seconds_count', { route: 'chat' })).toBe(1);
    expect(value(m, 'stormgate_stream_ends_total', { route: 'chat', end: 'complete' })).toBe(1);
    // One budget per priority class (and target), each with its floor of 100: the gauge sums them; the declared client
    // retry took one from batch's, as the budget counts it a retry.
    expect(value(m, 'stormgate_retry_budget_remaining', { route: 'chat' })).toBe(199);
  });
});

describe('the default retry policy', () => {
  it('makes 3 attempts, the first retry waiting at most baseMs 200 and the second at most 400, counted by reason', async () => {
    const s = await startStack({ faults: { errors: [{ status: 500, times: 3 }] }, provider: { breaker: false } });
    const res = await chat(s.url);
    expect(res.status).toBe(500);
    expect(res.headers.get('x-stormgate-attempts')).toBe('3');
    expect(res.headers.get('x-should-retry')).toBe('false');
    await res.arrayBuffer();
    const line = await requestLine(s);
    expect(line.attempts).toHaveLength(3);
    expect(line.backoffMs).toBeLessThanOrEqual(600);
    const m = await scrapeMetrics(s.url);
    const target = 'mock/gpt-4o';
    expect(value(m, 'stormgate_upstream_attempts_total', { target, status_class: '5xx' })).toBe(3);
    expect(m.filter((x) => x.name === 'stormgate_retry_count_total' && x.labels.target === target).reduce((a, x) => a + x.value, 0)).toBe(2);
    expect(value(m, 'stormgate_retried_requests_total', { route: 'chat', result: 'failure' })).toBe(1);
    expect(value(m, 'stormgate_requests_total', { route: 'chat', target, priority: 'online', outcome: 'upstream_error' })).toBe(1);
    expect(value(m, 'stormgate_pool_wait_seconds_count', { provider: 'mock', priority: 'online' })).toBe(3);
  });
});

describe('the default breaker and parking', () => {
  it('opens after 5 failures in a row, and releases the request it parked to a probe after probeWhileParkedMs (1 s), not openS (30 s)', async () => {
    const s = await startStack({ faults: { errors: [{ status: 500, times: 5 }] }, route: { budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 } } });
    const first = await chat(s.url);
    expect(first.status).toBe(500);
    await first.arrayBuffer();
    await new Promise((r) => setTimeout(r, 300));
    // Failures 4 and 5 open the breaker; its third attempt parks, and the probe 1 s after the opening succeeds.
    const started = Date.now();
    const second = chat(s.url);
    await new Promise((r) => setTimeout(r, 500));
    const target = 'mock/gpt-4o';
    let m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_breaker_state', { target })).toBe(1);
    expect(value(m, 'stormgate_parked_requests', { route: 'chat' })).toBe(1);
    const res = await second;
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    const waited = Date.now() - started;
    expect(waited).toBeGreaterThan(700);
    expect(waited).toBeLessThan(5_000);
    expect(s.mock.stats().total).toBe(6);
    m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_breaker_transitions_total', { target, to: 'open' })).toBe(1);
    expect(value(m, 'stormgate_park_outcomes_total', { route: 'chat', outcome: 'released' })).toBe(1);
    expect(value(m, 'stormgate_parked_requests', { route: 'chat' })).toBe(0);
  });
});

describe('a request answered by the fallback', () => {
  it('is counted in stormgate_fallback_requests_total and stormgate_fallbacks_total (from, to, reason)', async () => {
    const backup = await startMock({ apiKey: TEST_KEY });
    const s = await startStack({
      faults: { errors: [{ status: 500 }] },
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl, RETRY_LOOP_ONLY);
        return {
          ...base,
          providers: { ...base.providers, backup: { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: TEST_KEY, breaker: false } },
          routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }, { provider: 'backup' }], ...RETRY_LOOP_ONLY.route }],
        };
      },
    });
    const res = await chat(s.url);
    expect(res.status).toBe(200);
    expect(res.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(res.headers.get('x-stormgate-target')).toBe('backup/gpt-4o');
    await res.arrayBuffer();
    const m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_fallback_requests_total', { route: 'chat' })).toBe(1);
    expect(value(m, 'stormgate_fallbacks_total', { route: 'chat', from: 'mock/gpt-4o', to: 'backup/gpt-4o', reason: 'retries_exhausted' })).toBe(1);
    expect(value(m, 'stormgate_retried_requests_total', { route: 'chat', result: 'success' })).toBe(1);
  });
});

describe('the error table', () => {
  it('answers each documented code with its status, shape and headers', async () => {
    const s = await startStack({
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl, RETRY_LOOP_ONLY);
        return {
          ...base,
          routes: [{ name: 'chat', match: { path: '/v1/chat/completions', models: ['gpt-*'] }, targets: [{ provider: 'mock' }], ...RETRY_LOOP_ONLY.route }],
          passthrough: { provider: 'mock', paths: ['/v1/files'] },
          auth: { keys: { team: 'sk-client-team-a46', paced: 'sk-client-paced-a46' }, limits: { paced: { requestsPerMinute: 12 } } },
        };
      },
    });
    const key = { authorization: 'Bearer sk-client-team-a46' };
    const cases: [() => Promise<Response>, number, string, (res: Response, e: Awaited<ReturnType<typeof errorOf>>) => void][] = [
      [() => chat(s.url), 401, 'invalid_api_key', (res) => expect(res.headers.get('www-authenticate')).toBe('Bearer realm="stormgate"')],
      [() => fetch(`${s.url}/v1/chat/completions`, { headers: key }), 405, 'method_not_allowed', (res) => expect(res.headers.get('allow')).toBe('POST')],
      [() => fetch(`${s.url}/v1/files`, { method: 'POST', headers: key }), 405, 'method_not_allowed', (res) => expect(res.headers.get('allow')).toBe('GET, HEAD')],
      [() => fetch(`${s.url}/v1/nowhere`, { headers: key }), 404, 'unknown_url', () => {}],
      [() => chat(s.url, key, { ...CHAT, model: 'claude-x' }), 404, 'model_not_found', () => {}],
      [() => chat(s.url, { ...key, 'content-type': 'text/plain' }), 415, 'unsupported_media_type', () => {}],
      [() => chat(s.url, key, '{"model":'), 400, 'invalid_json', () => {}],
      [() => chat(s.url, key, { messages: [] }), 400, 'invalid_body', (_r, e) => expect(e.param).toBe('model')],
      [() => chat(s.url, { ...key, 'x-stormgate-timeout-ms': 'soon' }), 400, 'bad_request', () => {}],
      [() => chat(s.url, { ...key, 'idempotency-key': 'bad key\u00e9'.replace('\u00e9', '') + ' ' }), 400, 'invalid_idempotency_key', (_r, e) => expect(e.param).toBe('idempotency-key')],
    ];
    for (const [send, status, code, check] of cases) {
      const res = await send();
      expect(res.status, code).toBe(status);
      expect(res.headers.get('x-should-retry'), code).toBe('false');
      const e = await errorOf(res);
      expect(e.code).toBe(code);
      expect(e).toHaveProperty('param');
      expect(typeof e.type).toBe('string');
      check(res, e);
    }
    // Idempotency: the same key with another body is 422, and nothing more goes upstream.
    const first = await chat(s.url, { ...key, 'idempotency-key': 'a46-key' });
    expect(first.status).toBe(200);
    await first.arrayBuffer();
    const before = s.mock.stats().total;
    const reused = await chat(s.url, { ...key, 'idempotency-key': 'a46-key' }, { ...CHAT, messages: [{ role: 'user', content: 'other' }] });
    expect(reused.status).toBe(422);
    expect((await errorOf(reused)).code).toBe('idempotency_key_reused');
    expect(s.mock.stats().total).toBe(before);
    // requestsPerMinute 12 with no burst set: two requests at once (12 / 6), then 429 client_rate_limited.
    const paced = { authorization: 'Bearer sk-client-paced-a46' };
    for (let i = 0; i < 2; i++) expect((await chat(s.url, paced)).status).toBe(200);
    const limited = await chat(s.url, paced);
    expect(limited.status).toBe(429);
    expect(limited.headers.get('x-should-retry')).toBe('true');
    expect(Number(limited.headers.get('retry-after-ms'))).toBeGreaterThan(0);
    expect((await errorOf(limited)).code).toBe('client_rate_limited');
    const m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_client_limited_total', { client: 'paced', by: 'requests' })).toBe(1);
    // Every refusal above on a managed path is `rejected`, and so is the 404 of a path no route serves (the 405 of an
    // ops path is not): eleven.
    expect(value(m, 'stormgate_requests_total', { route: 'none', target: 'none', priority: 'none', outcome: 'rejected' })).toBe(11);
  });

  it('answers 502 upstream_unavailable for a provider that refuses connections, and 503 circuit_open with retry-after once its breaker opens', async () => {
    const closed = await freePort();
    const s = await startStack({
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl);
        return {
          ...base,
          providers: { down: { family: 'openai', baseUrl: `http://127.0.0.1:${closed}/v1`, apiKey: TEST_KEY, breaker: { consecutiveFailures: 1, openS: 2 } } },
          routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'down' }], retry: { maxAttempts: 1 }, park: false }],
        };
      },
    });
    const refused = await chat(s.url);
    expect(refused.status).toBe(502);
    expect(refused.headers.get('x-should-retry')).toBe('false');
    const e = await errorOf(refused);
    expect(e.code).toBe('upstream_unavailable');
    expect(e.message).toContain('ECONNREFUSED');
    await new Promise((r) => setTimeout(r, 400));
    const open = await chat(s.url);
    expect(open.status).toBe(503);
    expect((await errorOf(open)).code).toBe('circuit_open');
    // retry-after says when it probes again: openS 2 (plus up to 10%), less the time since it opened.
    expect(['1', '2', '3']).toContain(open.headers.get('retry-after'));
    expect(Number(open.headers.get('retry-after-ms'))).toBeLessThanOrEqual(2_200);
    expect(open.headers.get('x-request-id')).toBe(open.headers.get('x-stormgate-request-id'));
    let m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_breaker_state', { target: 'down/gpt-4o' })).toBe(1);
    await new Promise((r) => setTimeout(r, 2_300));
    // An open breaker whose open time is over shows as half-open: its next request probes.
    m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_breaker_state', { target: 'down/gpt-4o' })).toBe(2);
    expect(value(m, 'stormgate_upstream_attempts_total', { target: 'down/gpt-4o', status_class: 'network' })).toBe(1);
    expect(value(m, 'stormgate_requests_total', { route: 'chat', target: 'down/gpt-4o', priority: 'online', outcome: 'unavailable' })).toBe(1);
    expect(value(m, 'stormgate_requests_total', { route: 'chat', target: 'down/gpt-4o', priority: 'online', outcome: 'gateway_error' })).toBe(1);
  });

  it('gives the gateway\'s own errors on a /v1/messages route "type": "error" and the Anthropic error type, code unchanged', async () => {
    const s = await startStack({
      config: (mockUrl) => ({
        ...defaultConfig(mockUrl, RETRY_LOOP_ONLY),
        providers: { claude: { family: 'anthropic', baseUrl: mockUrl, apiKey: TEST_KEY, breaker: false } },
        routes: [{ name: 'messages', match: { path: '/v1/messages', models: ['claude-*'] }, targets: [{ provider: 'claude' }], park: false }],
      }),
    });
    const res = await fetch(`${s.url}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', max_tokens: 5, messages: [{ role: 'user', content: 'hi' }] }) });
    expect(res.status).toBe(404);
    const body = (await res.json()) as { type: string; error: { type: string; code: string } };
    expect(body.type).toBe('error');
    expect(body.error).toMatchObject({ type: 'not_found_error', code: 'model_not_found' });
  });
});

describe('the headers each way', () => {
  it('forwards the listed client headers, appends its via entry after the gateways\' entries, drops keys and hop-by-hop ones; passes back the provider ids, not its organisation', async () => {
    let seen: IncomingHttpHeaders = {};
    const fake = await startFake((req, res) => {
      seen = req.headers;
      req.resume();
      res.writeHead(200, {
        'content-type': 'application/json', 'x-request-id': 'req_a46', 'request-id': 'req_anthropic_a46', 'openai-version': '2020-10-01',
        'openai-model': 'gpt-4o-2024-08-06', 'openai-organization': 'org-provider', 'x-ratelimit-remaining-requests': '9', 'set-cookie': 'p=1',
      });
      res.end(chatCompletion('ok'));
    });
    const s = await startStack({
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl, RETRY_LOOP_ONLY);
        return { ...base, providers: { fake: { family: 'openai', baseUrl: `${fake.origin}/v1`, apiKey: TEST_KEY, breaker: false } }, routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'fake' }], ...RETRY_LOOP_ONLY.route }] };
      },
    });
    const res = await chat(s.url, {
      'anthropic-beta': 'tools-2024', tracestate: 'k=v', baggage: 'user=1', 'idempotency-key': 'a46-headers', 'user-agent': 'a46-agent',
      'api-key': 'client-azure-key', 'x-api-key': 'client-anthropic-key', connection: 'keep-alive, x-hop', 'x-hop': 'hop', via: '1.1 edge-proxy, 1.1 stormgate-0123abcd',
    });
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    expect(seen).toMatchObject({ 'anthropic-beta': 'tools-2024', tracestate: 'k=v', baggage: 'user=1', 'idempotency-key': 'a46-headers', 'user-agent': 'a46-agent', authorization: `Bearer ${TEST_KEY}` });
    // Only the gateways' entries go on, before its own; a proxy's text does not.
    expect(seen.via).toMatch(/^1\.1 stormgate-0123abcd, 1\.1 stormgate-[0-9a-f]{8}$/);
    for (const dropped of ['api-key', 'x-api-key', 'x-hop']) expect(seen[dropped], dropped).toBeUndefined();
    expect(res.headers.get('x-request-id')).toBe('req_a46');
    expect(res.headers.get('request-id')).toBe('req_anthropic_a46');
    expect(res.headers.get('openai-version')).toBe('2020-10-01');
    expect(res.headers.get('openai-model')).toBe('gpt-4o-2024-08-06');
    for (const kept of ['openai-organization', 'x-ratelimit-remaining-requests', 'set-cookie']) expect(res.headers.get(kept), kept).toBeNull();
  });
});

describe('two instances on one Redis', () => {
  function fleetConfig(mockUrl: string, extra: Partial<ConfigInput> = {}): ReturnType<typeof ConfigSchema.parse> {
    const base = defaultConfig(mockUrl);
    return ConfigSchema.parse({ ...base, state: { redis: redis().url }, ...extra });
  }

  it('keep their keys under the default prefix "stormgate", report no degraded state, and share a client\'s rate and an idempotency key\'s answer', async () => {
    const s = await startStack();
    const config = fleetConfig(s.mock.url, { auth: { keys: { team: 'sk-client-fleet-a46', free: 'sk-client-free-a46' }, limits: { team: { requestsPerMinute: 6 } } } });
    const a = await startGateway(config);
    const b = await startGateway(config);
    const key = { authorization: 'Bearer sk-client-fleet-a46' };
    // requestsPerMinute 6 leaves a burst of 1, fleet-wide: A's request spends it, B refuses the next.
    const onA = await chat(a, key);
    expect(onA.status).toBe(200);
    await onA.arrayBuffer();
    const onB = await chat(b, key);
    expect(onB.status).toBe(429);
    expect((await errorOf(onB)).code).toBe('client_rate_limited');
    // An idempotency key answered on A is answered again on B without a request upstream.
    const free = { authorization: 'Bearer sk-client-free-a46', 'idempotency-key': 'a46-fleet' };
    const ran = await chat(a, free);
    expect(ran.status).toBe(200);
    const answer = await ran.text();
    const sent = s.mock.stats().total;
    const replayed = await chat(b, free);
    expect(replayed.status).toBe(200);
    expect(await replayed.text()).toBe(answer);
    expect(s.mock.stats().total).toBe(sent);
    const client = new Redis(redis().url);
    try {
      const keys = await client.keys('*');
      expect(keys.length).toBeGreaterThan(0);
      for (const k of keys) expect(k.startsWith('stormgate:'), k).toBe(true);
    } finally {
      client.disconnect();
    }
    expect((await scrapeMetrics(a)).find((x) => x.name === 'stormgate_state_degraded')?.value).toBe(0);
    expect(value(await scrapeMetrics(b), 'stormgate_requests_total', { route: 'chat', target: 'mock/gpt-4o', priority: 'online', outcome: 'replayed' })).toBe(1);
  });

  it('share the retry budget\'s floor: minRetriesPerSecond 1 × windowS 10 retries, fleet-wide, then B refuses one', async () => {
    const s = await startStack({ faults: { errors: [{ status: 500 }] } });
    const config = fleetConfig(s.mock.url, {
      providers: { mock: { family: 'openai', baseUrl: `${s.mock.url}/v1`, apiKey: TEST_KEY, breaker: false } },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }], retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 1, capMs: 1 } }, budget: { minRetriesPerSecond: 1 }, park: false }],
    });
    const a = await startGateway(config);
    const b = await startGateway(config);
    for (let i = 0; i < 5; i++) {
      const res = await chat(a);
      expect(res.headers.get('x-stormgate-attempts')).toBe('3');
      await res.arrayBuffer();
    }
    const res = await chat(b);
    expect(res.status).toBe(500);
    await res.arrayBuffer();
    // 6 requests × ratio 0.1 is under the floor of 10, which A's 10 retries used up.
    expect(res.headers.get('x-stormgate-attempts')).toBe('1');
    const m = await scrapeMetrics(b);
    expect(value(m, 'stormgate_retry_budget_exhausted_total', { route: 'chat', target: 'mock/gpt-4o' })).toBe(1);
    expect(value(m, 'stormgate_retry_budget_remaining', { route: 'chat' })).toBe(0);
  });
});

describe('priority pools', () => {
  it('shed a newcomer past a full class queue with 503 load_shed, 429 in the lowest class, and lower a client by auth.priority but never raise by header', async () => {
    const s = await startStack({
      faults: { latencyMs: 800 },
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl, RETRY_LOOP_ONLY);
        return {
          ...base,
          providers: { mock: { ...base.providers.mock!, pools: { maxConcurrent: 1, classes: { online: { maxQueue: 0 }, batch: { maxQueue: 0 } } } } },
          routes: [
            { name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }], ...RETRY_LOOP_ONLY.route },
            { name: 'embeddings', match: { path: '/v1/embeddings' }, targets: [{ provider: 'mock' }], priority: 'batch', ...RETRY_LOOP_ONLY.route },
          ],
          auth: { keys: { app: 'sk-client-app-a46', jobs: 'sk-client-jobs-a46' }, priority: { jobs: 'batch' } },
        };
      },
    });
    const app = { authorization: 'Bearer sk-client-app-a46' };
    const busy = chat(s.url, app);
    await new Promise((r) => setTimeout(r, 200));
    let m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_pool_in_use', { provider: 'mock', priority: 'online' })).toBe(1);
    expect(value(m, 'stormgate_pool_client_in_use', { provider: 'mock', priority: 'online', client: 'app' })).toBe(1);
    expect(value(m, 'stormgate_pool_client_in_use', { provider: 'mock', priority: 'batch', client: 'jobs' })).toBe(0);
    const online = await chat(s.url, app);
    const byClient = await chat(s.url, { authorization: 'Bearer sk-client-jobs-a46' });
    const byHeader = await chat(s.url, { ...app, 'x-stormgate-priority': 'batch' });
    for (const [res, status] of [[online, 503], [byClient, 429], [byHeader, 429]] as const) {
      expect(res.status).toBe(status);
      expect(res.headers.get('x-should-retry')).toBe('true');
      expect(Number(res.headers.get('retry-after'))).toBeGreaterThan(0);
      expect((await errorOf(res)).code).toBe('load_shed');
    }
    expect((await busy).status).toBe(200);
    // A batch route's request stays batch whatever its header says.
    const raised = await fetch(`${s.url}/v1/embeddings`, { method: 'POST', headers: { ...app, 'content-type': 'application/json', 'x-stormgate-priority': 'online' }, body: JSON.stringify({ model: 'text-embedding-3-small', input: 'hi' }) });
    expect(raised.status).toBe(200);
    await raised.arrayBuffer();
    expect((await requestLine(s, 'embeddings')).priority).toBe('batch');
    m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_shed_total', { priority: 'online', reason: 'queue_full' })).toBe(1);
    expect(value(m, 'stormgate_shed_total', { priority: 'batch', reason: 'queue_full' })).toBe(2);
    expect(value(m, 'stormgate_requests_total', { route: 'chat', target: 'mock/gpt-4o', priority: 'batch', outcome: 'shed' })).toBe(2);
  });

  it('refuse at start-up a pool whose classes\' minShare adds up to more than 1', () => {
    const input = defaultConfig('http://127.0.0.1:9');
    input.providers.mock = { ...input.providers.mock!, pools: { classes: { online: { minShare: 0.7 }, batch: { minShare: 0.4 } } } };
    expect(ConfigSchema.safeParse(input).success).toBe(false);
    const fine = defaultConfig('http://127.0.0.1:9');
    const parsed = ConfigSchema.parse(fine).providers.mock!.pools;
    expect(parsed.classes).toEqual({ online: { minShare: 0.5, maxShare: 1, maxQueue: 1000 }, batch: { minShare: 0.1, maxShare: 1, maxQueue: 10000 } });
  });
});

describe('holds', () => {
  it('hold a target whose provider refused the key for authHoldS 60 s, and one that asked for 30 s for those 30 s and a spread, each counted and shown', async () => {
    const s = await startStack({
      ...RETRY_LOOP_ONLY,
      faults: { models: { 'gpt-4o': { errors: [{ status: 401 }] }, 'gpt-4o-mini': { errors: [{ status: 429, headers: { 'retry-after': '30' } }] } } },
    });
    const refused = await chat(s.url);
    expect(refused.status).toBe(502);
    expect(refused.headers.get('x-should-retry')).toBe('false');
    expect(refused.headers.get('retry-after')).toBeNull();
    expect((await errorOf(refused)).code).toBe('upstream_auth_error');
    const held = await chat(s.url);
    expect(held.status).toBe(502);
    expect((await errorOf(held)).code).toBe('upstream_auth_error');
    const paused = await chat(s.url, {}, { ...CHAT, model: 'gpt-4o-mini' });
    expect(paused.status).toBe(429);
    await paused.arrayBuffer();
    const heldOff = await chat(s.url, {}, { ...CHAT, model: 'gpt-4o-mini' });
    expect(heldOff.status).toBe(429);
    expect((await errorOf(heldOff)).code).toBe('provider_held_off');
    expect(s.mock.stats().total).toBe(2);
    const m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_credentials_held', { target: 'mock/gpt-4o' })).toBe(1);
    expect(value(m, 'stormgate_credentials_held', { target: 'mock/gpt-4o-mini' })).toBe(0);
    const creds = value(m, 'stormgate_hold_remaining_seconds', { target: 'mock/gpt-4o', kind: 'credentials', tier: 'all' })!;
    expect(creds).toBeGreaterThan(55);
    expect(creds).toBeLessThanOrEqual(60);
    const hold = value(m, 'stormgate_hold_remaining_seconds', { target: 'mock/gpt-4o-mini', kind: 'hold_off', tier: 'all' })!;
    expect(hold).toBeGreaterThan(25);
    expect(hold).toBeLessThanOrEqual(31); // plus the small spread the README names
    expect(value(m, 'stormgate_hold_remaining_seconds', { target: 'mock/gpt-4o', kind: 'hold_off', tier: 'all' })).toBe(0);
    expect(m.some((x) => x.name === 'stormgate_hold_remaining_seconds' && x.labels.tier === 'flex')).toBe(false);
    expect(value(m, 'stormgate_holds_started_total', { target: 'mock/gpt-4o', kind: 'credentials', tier: 'all', reason: 'status_401' })).toBe(1);
    expect(value(m, 'stormgate_holds_started_total', { target: 'mock/gpt-4o-mini', kind: 'hold_off', tier: 'all', reason: 'status_429' })).toBe(1);
  });
});

describe('more of the error table, and the metrics shown only when they mean something', () => {
  it('answers 403 host_not_allowed, 417 expectation_failed, 431 headers_too_large, a doubled Idempotency-Key and an answer too long to keep', async () => {
    const s = await startStack({
      config: (mockUrl) => ({ ...defaultConfig(mockUrl, RETRY_LOOP_ONLY), idempotency: { maxAnswerBytes: 64 }, passthrough: { provider: 'mock', paths: ['/v1/files'] } }),
    });
    const raw = (headers: Record<string, string | string[]>): Promise<{ status: number; body: string; headers: IncomingHttpHeaders }> =>
      new Promise((resolve, reject) => {
        const req = request(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers } }, (res) => {
          let body = '';
          res.on('data', (c: Buffer) => (body += c.toString()));
          res.on('end', () => resolve({ status: res.statusCode!, body, headers: res.headers }));
        });
        req.on('error', reject);
        req.end(JSON.stringify(CHAT));
      });
    const host = await raw({ host: 'rebind.example.com' });
    expect([host.status, JSON.parse(host.body).error.code]).toEqual([403, 'host_not_allowed']);
    const expect417 = await raw({ expect: 'something-else' });
    expect([expect417.status, JSON.parse(expect417.body).error.code]).toEqual([417, 'expectation_failed']);
    expect(expect417.headers.connection).toBe('close');
    const large = await raw({ 'x-padding': 'p'.repeat(17_000) });
    expect([large.status, JSON.parse(large.body).error.code]).toEqual([431, 'headers_too_large']);
    const twice = await raw({ 'idempotency-key': ['k1', 'k2'] });
    expect(twice.status).toBe(400);
    expect(JSON.parse(twice.body).error).toMatchObject({ code: 'invalid_idempotency_key', param: 'idempotency-key' });
    // An answer over idempotency.maxAnswerBytes is given once; a repeat of its key gets 409, nothing upstream.
    const ran = await chat(s.url, { 'idempotency-key': 'a46-long' });
    expect(ran.status).toBe(200);
    await ran.arrayBuffer();
    const sent = s.mock.stats().total;
    const repeat = await chat(s.url, { 'idempotency-key': 'a46-long' });
    expect(repeat.status).toBe(409);
    expect((await errorOf(repeat)).code).toBe('idempotency_answer_not_kept');
    expect(s.mock.stats().total).toBe(sent);
    // A class name in any case lowers; one no class has is ignored and logged.
    const upper = await chat(s.url, { 'x-stormgate-priority': 'BATCH' });
    await upper.arrayBuffer();
    const typo = await chat(s.url, { 'x-stormgate-priority': 'bulk' });
    await typo.arrayBuffer();
    const lines = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines.find((l) => l.reqId === upper.headers.get('x-stormgate-request-id'))?.priority).toBe('batch');
    expect(lines.find((l) => l.reqId === typo.headers.get('x-stormgate-request-id'))).toMatchObject({ priority: 'online', unknownPriority: 'bulk' });
    // Passthrough: counted by path and class, a 4xx of the provider included, never in the managed series.
    const files = await fetch(`${s.url}/v1/files/file-1`);
    expect(files.status).toBe(404);
    await files.arrayBuffer();
    const m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_passthrough_requests_total', { path: '/v1/files', status_class: '4xx' })).toBe(1);
    expect(value(m, 'stormgate_passthrough_requests_total', { path: '/v1/files', status_class: '2xx' })).toBe(0);
    // Nothing was retried or failed over: the 60 s ratios show no retried requests; the routes set no degraded answer.
    expect(m.some((x) => x.name === 'stormgate_retry_success_rate')).toBe(false);
    expect(value(m, 'stormgate_fallback_rate', { route: 'chat' })).toBe(0);
    expect(m.some((x) => x.name === 'stormgate_fallback_rate' && x.labels.route === 'embeddings')).toBe(false);
    expect(m.some((x) => x.name === 'stormgate_degraded_total')).toBe(false);
  });

  it('answers 503 park_queue_full past park.maxQueue, 504 deadline_exceeded at the client\'s own timeout, and 503 no_target for a disabled provider', async () => {
    const s = await startStack({
      faults: { latencyMs: 1_500 },
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl, RETRY_LOOP_ONLY);
        const down = { family: 'openai' as const, baseUrl: 'http://127.0.0.1:9/v1', apiKey: TEST_KEY, breaker: { consecutiveFailures: 1, openS: 60 } };
        return {
          ...base,
          providers: { ...base.providers, down, off: { family: 'openai', baseUrl: 'http://127.0.0.1:9/v1', apiKey: '', optional: true } },
          routes: [
            { name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }], ...RETRY_LOOP_ONLY.route },
            { name: 'parked', match: { path: '/v1/completions' }, targets: [{ provider: 'down' }], retry: { maxAttempts: 1 }, park: { maxQueue: 1 }, timeoutMs: 3_000 },
            { name: 'off', match: { path: '/v1/embeddings' }, targets: [{ provider: 'off' }] },
          ],
        };
      },
    });
    const completion = (): Promise<Response> => fetch(`${s.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', prompt: 'hi' }) });
    const opened = await completion();
    expect(opened.status).toBe(502);
    await opened.arrayBuffer();
    await new Promise((r) => setTimeout(r, 300));
    const waiting = completion();
    await new Promise((r) => setTimeout(r, 200));
    const full = await completion();
    expect(full.status).toBe(503);
    expect(full.headers.get('x-should-retry')).toBe('true');
    expect((await errorOf(full)).code).toBe('park_queue_full');
    const timedOut = await chat(s.url, { 'x-stormgate-timeout-ms': '600' });
    expect(timedOut.status).toBe(504);
    expect(timedOut.headers.get('x-should-retry')).toBe('false');
    expect((await errorOf(timedOut)).code).toBe('deadline_exceeded');
    const off = await fetch(`${s.url}/v1/embeddings`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'e', input: 'hi' }) });
    expect(off.status).toBe(503);
    expect((await errorOf(off)).code).toBe('no_target');
    await (await waiting).arrayBuffer();
    const m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_park_outcomes_total', { route: 'parked', outcome: 'full' })).toBe(1);
    expect(value(m, 'stormgate_requests_total', { route: 'chat', target: 'mock/gpt-4o', priority: 'online', outcome: 'deadline' })).toBe(1);
  });
});

describe('the anthropic provider defaults', () => {
  it('sends anthropic-version 2023-06-01, max_tokens 4096 when the client sets none (plus medium\'s 4096 with reasoning_effort), and drops temperature', async () => {
    const seen: { headers: IncomingHttpHeaders; body: Record<string, unknown> }[] = [];
    const fake = await startFake((req, res) => {
      let text = '';
      req.on('data', (c: Buffer) => (text += c.toString()));
      req.on('end', () => {
        seen.push({ headers: req.headers, body: JSON.parse(text) as Record<string, unknown> });
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ id: 'msg_1', type: 'message', role: 'assistant', model: 'claude-sonnet-4-5', content: [{ type: 'text', text: 'ok' }], stop_reason: 'end_turn', stop_sequence: null, usage: { input_tokens: 3, output_tokens: 1 } }));
      });
    });
    const s = await startStack({
      config: (mockUrl) => ({
        ...defaultConfig(mockUrl, RETRY_LOOP_ONLY),
        providers: { claude: { family: 'anthropic', baseUrl: fake.origin, apiKey: TEST_KEY, breaker: false } },
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'claude', model: 'claude-sonnet-4-5' }], park: false }],
      }),
    });
    for (const extra of [{ temperature: 0.3 }, { reasoning_effort: 'medium' }]) {
      const res = await chat(s.url, {}, { ...CHAT, ...extra });
      expect(res.status).toBe(200);
      await res.arrayBuffer();
    }
    expect(seen[0]!.headers['anthropic-version']).toBe('2023-06-01');
    expect(seen[0]!.headers['x-api-key']).toBe(TEST_KEY);
    expect(seen[0]!.body.max_tokens).toBe(4096);
    expect(seen[0]!.body).not.toHaveProperty('temperature');
    expect(seen[1]!.body.max_tokens).toBe(8192);
    expect(seen[1]!.body.thinking).toEqual({ type: 'enabled', budget_tokens: 4096 });
  });
});

describe('a client\'s undeclared retry', () => {
  it('is a repeat within budget.repeats.windowS (60 s) of an error this instance answered: logged and counted, not taken from the budget', async () => {
    const s = await startStack({ ...RETRY_LOOP_ONLY, faults: { errors: [{ status: 500, times: 3 }] } });
    const failed = await chat(s.url);
    expect(failed.status).toBe(500);
    await failed.arrayBuffer();
    const again = await chat(s.url);
    expect(again.status).toBe(200);
    await again.arrayBuffer();
    const line = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.reqId === again.headers.get('x-stormgate-request-id'));
    expect(line?.clientRetry).toBe('repeat');
    const m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_client_retries_total', { route: 'chat', how: 'repeat' })).toBe(1);
    expect(value(m, 'stormgate_client_retries_total', { route: 'chat', how: 'declared' })).toBe(0);
  });
});

describe('a Redis that stops answering', () => {
  it('costs a request at most about state.commandTimeoutMs (50 ms) per decision: it is answered on local state', async () => {
    const s = await startStack({ faults: { errors: [{ status: 500, firstAttemptsOnly: true }] } });
    const a = await startGateway(ConfigSchema.parse({ ...defaultConfig(s.mock.url), state: { redis: redis().url } }));
    const warm = await chat(a);
    await warm.arrayBuffer();
    const resume = redis().freeze();
    try {
      const started = Date.now();
      // A retry (the budget asks Redis) and a success: answered without waiting on the frozen server.
      const res = await chat(a);
      expect(res.status).toBe(200);
      expect(res.headers.get('x-stormgate-attempts')).toBe('2');
      await res.arrayBuffer();
      expect(Date.now() - started).toBeLessThan(1_500);
    } finally {
      resume();
    }
  });
});

describe('a client that sends its request too slowly', () => {
  it('gets 408 request_timeout after server.requestTimeoutMs, and the connection closes', async () => {
    const s = await startStack({ config: (mockUrl) => ({ ...defaultConfig(mockUrl, RETRY_LOOP_ONLY), server: { host: '127.0.0.1', port: 0, requestTimeoutMs: 500 } }) });
    const { port } = new URL(s.url);
    const socket = connect(Number(port), '127.0.0.1');
    let text = '';
    socket.on('data', (c: Buffer) => (text += c.toString()));
    const closed = new Promise<void>((r) => socket.on('close', () => r()));
    socket.write('POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"model"');
    const started = Date.now();
    await closed;
    expect(Date.now() - started).toBeLessThan(5_000);
    expect(text).toMatch(/^HTTP\/1\.1 408 /);
    expect(text).toContain('"code":"request_timeout"');
  });
});

describe('the series a config names', () => {
  it('start at zero before any traffic: every outcome under the route\'s class and each lower one, every status class, every hand-over', async () => {
    const backup = await startMock({ apiKey: TEST_KEY });
    const s = await startStack({
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl, RETRY_LOOP_ONLY);
        return {
          ...base,
          providers: { ...base.providers, backup: { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: TEST_KEY } },
          routes: [
            { name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock', model: 'm-one' }, { provider: 'backup', model: 'm-two' }] },
            { name: 'bulk', match: { path: '/v1/embeddings' }, targets: [{ provider: 'mock', model: 'e-one' }], priority: 'batch' },
          ],
        };
      },
    });
    const m = await scrapeMetrics(s.url);
    const outcomes = ['success', 'degraded', 'invalid_request', 'upstream_error', 'gateway_error', 'unavailable', 'shed', 'deadline', 'client_gone', 'stream_error', 'replayed'];
    for (const outcome of outcomes) {
      for (const priority of ['online', 'batch']) {
        expect(value(m, 'stormgate_requests_total', { route: 'chat', target: 'mock/m-one', priority, outcome }), `${priority} ${outcome}`).toBe(0);
        expect(value(m, 'stormgate_requests_total', { route: 'chat', target: 'backup/m-two', priority, outcome }), `${priority} ${outcome}`).toBe(0);
      }
      expect(value(m, 'stormgate_requests_total', { route: 'bulk', target: 'mock/e-one', priority: 'batch', outcome })).toBe(0);
      expect(value(m, 'stormgate_requests_total', { route: 'bulk', target: 'mock/e-one', priority: 'online', outcome })).toBeUndefined();
    }
    for (const status_class of ['2xx', '3xx', '4xx', '5xx', 'bad_stream', 'timeout', 'network', 'aborted', 'internal']) {
      expect(value(m, 'stormgate_upstream_attempts_total', { target: 'mock/m-one', status_class }), status_class).toBe(0);
    }
    for (const reason of ['retries_exhausted', 'budget', 'breaker_open', 'held_off', 'shed', 'timeout', 'wait_hint', 'deadline', 'credentials', 'redirect', 'error']) {
      expect(value(m, 'stormgate_fallbacks_total', { route: 'chat', from: 'mock/m-one', to: 'backup/m-two', reason }), reason).toBe(0);
    }
    for (const end of ['complete', 'done-added', 'cut', 'stalled', 'upstream-error', 'client-gone', 'client-stalled', 'recovered', 'shutdown']) {
      expect(value(m, 'stormgate_stream_ends_total', { route: 'chat', end }), end).toBe(0);
    }
  });
});

describe('a wait hint past a minute', () => {
  it('is passed on with its retry-after and x-should-retry: false, and so is the hold-off it starts', async () => {
    const s = await startStack({ ...RETRY_LOOP_ONLY, faults: { errors: [{ status: 429, headers: { 'retry-after': '90' } }] } });
    for (const code of ['rate_limit_exceeded', 'provider_held_off']) {
      const res = await chat(s.url);
      expect(res.status).toBe(429);
      expect(res.headers.get('x-should-retry')).toBe('false');
      expect(res.headers.get('retry-after')).toBe('90');
      expect((await errorOf(res)).code).toBe(code);
    }
    expect(s.mock.stats().total).toBe(1);
  });
});

describe('a replay of an idempotency key\'s answer', () => {
  it('is counted as replayed, and counts no duration, tokens or upstream attempt again', async () => {
    const s = await startStack(RETRY_LOOP_ONLY);
    const headers = { 'idempotency-key': 'a46-replay' };
    const usage: number[] = [];
    for (let i = 0; i < 2; i++) {
      const res = await chat(s.url, headers);
      expect(res.status).toBe(200);
      usage.push(((await res.json()) as { usage: { completion_tokens: number } }).usage.completion_tokens);
    }
    expect(usage[1]).toBe(usage[0]);
    const m = await scrapeMetrics(s.url);
    const target = 'mock/gpt-4o';
    expect(value(m, 'stormgate_requests_total', { route: 'chat', target, priority: 'online', outcome: 'replayed' })).toBe(1);
    expect(value(m, 'stormgate_requests_total', { route: 'chat', target, priority: 'online', outcome: 'success' })).toBe(1);
    expect(value(m, 'stormgate_request_duration_seconds_count', { route: 'chat', attempt: 'first' })).toBe(1);
    expect(value(m, 'stormgate_upstream_attempts_total', { target, status_class: '2xx' })).toBe(1);
    expect(value(m, 'stormgate_tokens_total', { route: 'chat', target, kind: 'completion' })).toBe(usage[0]);
    expect(s.mock.stats().total).toBe(1);
  });
});
