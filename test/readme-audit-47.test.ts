// README claims checked by running them (audit 47: the config reference's defaults and its YAML examples, the metrics
// table after the traffic that makes each series, the error table, the passthrough's header lists and rules, the
// headers passed back, the Grafana queries' labels, docker-compose.yml and the Dockerfile read against the repository),
// pinned here where no earlier audit held them end to end. Two README sentences were corrected rather than the code:
// /v1/models answers a wrong method with `allow: GET, HEAD` (fastify serves HEAD with GET), and a route on a path with
// no known API has its adaptive limit labelled with the target and the route's name (`p/omni-moderation-latest mods`).
import { describe, expect, it } from 'vitest';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { connect } from 'node:net';
import { parse as parseYaml } from 'yaml';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { ConfigError, parseConfig } from '../src/config/load.ts';
import { createMetrics } from '../src/observability/metrics.ts';
import { assertFaultSpec } from '../src/mock/faults.ts';
import { chatCompletion, useFakeProviders } from './helpers/fake-provider.ts';
import { rawGet } from './helpers/passthrough-files.ts';
import { RETRY_LOOP_ONLY, TEST_KEY, configServedBy, defaultConfig, requestLine, scrapeMetrics, useExtraMocks, useGateways, useStacks, type MetricSample } from './helpers/stack.ts';

const ROOT = join(import.meta.dirname, '..');
const read = (path: string): string => readFileSync(join(ROOT, path), 'utf8');
const README = read('README.md');

const startStack = useStacks();
const startMock = useExtraMocks();
const startGateway = useGateways();
const startFake = useFakeProviders();

const CHAT = { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] };

function post(url: string, path: string, body: unknown = CHAT, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: typeof body === 'string' || body instanceof Uint8Array ? body : JSON.stringify(body) });
}
const chat = (url: string, headers: Record<string, string> = {}, body: unknown = CHAT): Promise<Response> => post(url, '/v1/chat/completions', body, headers);

/** The value of the one series of `name` with exactly these labels (undefined when absent). */
function value(samples: MetricSample[], name: string, labels: Record<string, string> = {}): number | undefined {
  return samples.find((s) => s.name === name && JSON.stringify(Object.entries(s.labels).sort()) === JSON.stringify(Object.entries(labels).sort()))?.value;
}

type ErrorBody = { message: string; type: string; param: string | null; code: string | null };
async function errorOf(res: Response): Promise<ErrorBody> {
  const body = (await res.json()) as { error: ErrorBody };
  expect(Object.keys(body.error).sort()).toEqual(['code', 'message', 'param', 'type']);
  return body.error;
}

/** A provider of the test's own that records each request's headers and answers with `answer`. */
async function recordingProvider(answer: (req: IncomingMessage, res: ServerResponse) => void): Promise<{ origin: string; seen: IncomingMessage['headers'][]; hits: () => number }> {
  const seen: IncomingMessage['headers'][] = [];
  const fake = await startFake((req, res) => {
    seen.push(req.headers);
    req.resume();
    req.on('end', () => answer(req, res));
  });
  return { origin: fake.origin, seen, hits: fake.hits };
}

const parse = (text: string, env: NodeJS.ProcessEnv = {}): ReturnType<typeof parseConfig> => parseConfig(text, 'gw.yaml', env);
function refusal(text: string, env: NodeJS.ProcessEnv = {}): string {
  try {
    parse(text, env);
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    return (err as Error).message;
  }
  throw new Error('expected the config to be refused');
}
const MINIMAL = `providers:
  openai: { family: openai, baseUrl: https://api.openai.com/v1, apiKey: sk-x }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: openai } ]
`;

describe('the configuration reference', () => {
  it('gives a config that sets nothing but a provider and a route the defaults it states', () => {
    const c = parse(MINIMAL);
    expect(c.server).toMatchObject({ host: '127.0.0.1', port: 8080, bodyLimitBytes: 10_485_760, requestTimeoutMs: 60_000, keepAliveTimeoutMs: 72_000, logLevel: 'info', logSuccessRate: 1 });
    const p = c.providers.openai!;
    expect(p).toMatchObject({ optional: false, authHoldS: 60, maxConnections: 128 });
    expect(p.timeouts).toMatchObject({ connectMs: 5000, firstTokenMs: 30_000, idleMs: 30_000, keepAliveMs: 4000 });
    expect(p.timeouts.responseMs).toBeUndefined();
    expect(p.breaker).toMatchObject({ failureRate: 0.5, windowS: 10, minRequests: 20, consecutiveFailures: 5, slowCallMs: 5000, openS: 30, halfOpenProbes: 3, closeAfter: 3, probeWhileParkedMs: 1000, probeWhileParkedMaxMs: 5000 });
    expect(p.pools).toMatchObject({ decrease: 0.9, minLimit: 1 });
    expect(p.pools.classes).toEqual({ online: { minShare: 0.5, maxShare: 1, maxQueue: 1000 }, batch: { minShare: 0.1, maxShare: 1, maxQueue: 10_000 } });
    const r = c.routes[0]!;
    expect(r).toMatchObject({ strategy: 'fallback', timeoutMs: 120_000, minAttemptMs: 1000, priority: 'online', streamRecovery: 'off' });
    expect(r.retry).toEqual({ maxAttempts: 3, backoff: { strategy: 'full-jitter', baseMs: 200, capMs: 3000 }, retryOn: [429, 500, 502, 503, 504, 520, 524, 529, 'network', 'timeout'], maxWaitHintMs: 20_000 });
    expect(r.budget).toEqual({ ratio: 0.1, windowS: 10, minRetriesPerSecond: 10, repeats: { windowS: 60, countAsRetries: false } });
    expect(r.park).toMatchObject({ maxQueue: 10_000 });
    expect(r.targets[0]).toMatchObject({ weight: 1 });
    expect(c.state).toMatchObject({ commandTimeoutMs: 50, keyPrefix: 'stormgate' });
    expect(c.drain).toEqual({ preStopMs: 5000, graceMs: 30_000 });
    expect(c.idempotency).toMatchObject({ enabled: true, ttlMs: 600_000, maxAnswerBytes: 1_048_576, memoryBytes: 67_108_864, leaseMs: 10_000 });
    expect(c.passthrough).toBeUndefined();
    expect(c.auth).toBeUndefined();
    // An anthropic provider's own defaults, and a passthrough's.
    const a = parse(`${MINIMAL.replace('providers:\n', 'providers:\n  claude: { family: anthropic, baseUrl: https://api.anthropic.com, apiKey: k }\n')}passthrough: { provider: openai, paths: [/v1/files] }\n`);
    expect(a.providers.claude).toMatchObject({ anthropicVersion: '2023-06-01', defaultMaxTokens: 4096, sampling: 'drop' });
    expect(a.passthrough).toMatchObject({ methods: ['GET'], timeoutMs: 120_000 });
  });

  it('loads the YAML the README shows: client keys with priority and limits, the stored responses\' passthrough, an x- anchor block, an egress proxy from an unset variable, a nested default and $${', () => {
    const env = { STORMGATE_KEY_AGENTS: 'ka', STORMGATE_KEY_BATCH: 'kb', STORMGATE_KEY_NB: 'kn', FALLBACK_KEY: 'sk-fallback' };
    const text = `x-provider: &defaults { family: openai, apiKey: "\${OPENAI_KEY:-\${FALLBACK_KEY}}" }
providers:
  openai:
    <<: *defaults
    baseUrl: https://api.openai.com/v1
    proxy: "\${HTTPS_PROXY:-}"
  literal: { family: openai, baseUrl: https://example.com/v1, apiKey: "$\${NOT_A_VAR}" }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: openai } ]
  - name: responses
    match: { path: /v1/responses }
    targets: [ { provider: openai } ]
passthrough: { provider: openai, paths: [/v1/responses/], methods: [GET, POST, DELETE] }
auth:
  keys: { agents: "\${STORMGATE_KEY_AGENTS}", batch-jobs: "\${STORMGATE_KEY_BATCH}", notebooks: "\${STORMGATE_KEY_NB}" }
  priority:                               # optional: the class a client's requests take at most
    batch-jobs: batch
  limits:                                 # optional: rates per client
    agents: { requestsPerMinute: 6000, burst: 200, tokensPerMinute: 2000000 }
    "*": { requestsPerMinute: 600 }       # every client not named, each on its own
`;
    const c = parse(text, env);
    expect(c.providers.openai!.apiKey).toBe('sk-fallback');
    expect(c.providers.openai!.proxy ?? '').toBe('');
    expect(c.providers.literal!.apiKey).toBe('${NOT_A_VAR}');
    expect(c.passthrough).toMatchObject({ paths: ['/v1/responses/'], methods: ['GET', 'POST', 'DELETE'] });
    expect(c.auth!.keys).toEqual({ agents: 'ka', 'batch-jobs': 'kb', notebooks: 'kn' });
    expect(c.auth!.limits!['*']).toMatchObject({ requestsPerMinute: 600 });
  });

  it('takes a target\'s retry whole, its left-out fields at their defaults rather than the route\'s, and false for park, breaker and passthrough', () => {
    const c = parse(`providers:
  openai: { family: openai, baseUrl: https://api.openai.com/v1, apiKey: sk-x, breaker: false }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    retry: { maxAttempts: 5, maxWaitHintMs: 1000 }
    park: false
    targets: [ { provider: openai, retry: { backoff: { baseMs: 10 } } }, { provider: openai, model: gpt-4o-mini } ]
passthrough: false
`);
    const r = c.routes[0]!;
    expect(r.retry).toMatchObject({ maxAttempts: 5, maxWaitHintMs: 1000 });
    expect(r.targets[0]!.retry).toEqual({ maxAttempts: 3, backoff: { strategy: 'full-jitter', baseMs: 10, capMs: 3000 }, retryOn: [429, 500, 502, 503, 504, 520, 524, 529, 'network', 'timeout'], maxWaitHintMs: 20_000 });
    expect(r.targets[1]!.retry).toBeUndefined();
    expect(r.park).toBe(false);
    expect(c.providers.openai!.breaker).toBe(false);
    expect(c.passthrough).toBeUndefined(); // "false (the same as leaving it out)"
  });

  it('refuses a passthrough to an anthropic provider, of a gateway path, of a path without its slash, and a route on /metrics', () => {
    const withClaude = MINIMAL.replace('providers:\n', 'providers:\n  claude: { family: anthropic, baseUrl: https://api.anthropic.com, apiKey: k }\n');
    expect(refusal(`${withClaude}passthrough: { provider: claude, paths: [/v1/files] }\n`)).toMatch(/openai/);
    for (const own of ['/healthz', '/readyz', '/metrics', '/v1/models']) expect(refusal(`${MINIMAL}passthrough: { provider: openai, paths: [${own}] }\n`), own).toMatch(/passthrough/);
    expect(refusal(`${MINIMAL}passthrough: { provider: openai, paths: [/v1/files, /v1/files] }\n`)).toMatch(/passthrough/);
    expect(refusal(MINIMAL.replace('path: /v1/chat/completions', 'path: v1/embeddings'))).toContain('write "/v1/embeddings"');
    expect(refusal(MINIMAL.replace('path: /v1/chat/completions', 'path: /metrics'))).toMatch(/metrics/);
  });
});

describe('the error table', () => {
  it('answers 405 method_not_allowed with allow: POST on a managed path, GET on /v1/models, GET and HEAD on a passthrough path of default methods', async () => {
    const fake = await recordingProvider((_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"data":[]}'));
    const s = await startStack({ config: (mockUrl) => ({ ...configServedBy(mockUrl, 'files', `${fake.origin}/v1`), passthrough: { provider: 'files', paths: ['/v1/files'] } }) });
    const get = await fetch(`${s.url}/v1/chat/completions`);
    expect(get.status).toBe(405);
    expect(get.headers.get('allow')).toBe('POST');
    expect(get.headers.get('x-should-retry')).toBe('false');
    expect((await errorOf(get)).code).toBe('method_not_allowed');
    const models = await post(s.url, '/v1/models', {});
    expect(models.status).toBe(405);
    expect(models.headers.get('allow')?.split(/,\s*/).sort()).toEqual(['GET', 'HEAD']);
    expect((await errorOf(models)).code).toBe('method_not_allowed');
    const upload = await post(s.url, '/v1/files', {});
    expect(upload.status).toBe(405);
    expect(upload.headers.get('allow')?.split(/,\s*/).sort()).toEqual(['GET', 'HEAD']);
    expect((await errorOf(upload)).code).toBe('method_not_allowed');
    expect(fake.hits()).toBe(0);
    expect((await fetch(`${s.url}/v1/models`, { method: 'HEAD' })).status).toBe(200);
    const listed = await fetch(`${s.url}/v1/files`);
    expect(listed.status).toBe(200);
    await listed.arrayBuffer();
  });

  it('answers 404 unknown_url for an unserved path and 404 model_not_found for a model GET /v1/models/{model} does not list, both x-should-retry: false', async () => {
    const s = await startStack({ config: (mockUrl) => ({ ...defaultConfig(mockUrl), routes: [{ name: 'chat', match: { path: '/v1/chat/completions', models: ['gpt-4o'] }, targets: [{ provider: 'mock' }] }] }) });
    const unknown = await post(s.url, '/v1/images/generations', { model: 'dall-e-3', prompt: 'x' });
    expect(unknown.status).toBe(404);
    expect(unknown.headers.get('x-should-retry')).toBe('false');
    expect((await errorOf(unknown)).code).toBe('unknown_url');
    expect(unknown.headers.get('x-request-id')).toBe(unknown.headers.get('x-stormgate-request-id'));
    const nope = await fetch(`${s.url}/v1/models/gpt-nope`);
    expect(nope.status).toBe(404);
    expect(nope.headers.get('x-should-retry')).toBe('false');
    expect((await errorOf(nope)).code).toBe('model_not_found');
    const listed = await fetch(`${s.url}/v1/models/gpt-4o`);
    expect(listed.status).toBe(200);
    expect(((await listed.json()) as { id: string }).id).toBe('gpt-4o');
    const other = await chat(s.url, {}, { ...CHAT, model: 'gpt-3.5' });
    expect(other.status).toBe(404);
    expect((await errorOf(other)).code).toBe('model_not_found');
  });

  it('answers 415 for a content-encoding it cannot decode, 400 invalid_json for a Latin-1 body, 400 bad_request for a timeout header that is no number, each counted rejected', async () => {
    const s = await startStack();
    const zstd = await chat(s.url, { 'content-encoding': 'zstd' });
    expect(zstd.status).toBe(415);
    expect((await errorOf(zstd)).code).toBe('unsupported_media_type');
    const latin1 = await post(s.url, '/v1/chat/completions', Buffer.from('{"model":"gpt-4o","messages":[{"role":"user","content":"caf\xe9"}]}', 'latin1'));
    expect(latin1.status).toBe(400);
    expect((await errorOf(latin1)).code).toBe('invalid_json');
    const badTimeout = await chat(s.url, { 'x-stormgate-timeout-ms': 'soon' });
    expect(badTimeout.status).toBe(400);
    expect((await errorOf(badTimeout)).code).toBe('bad_request');
    const m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_requests_total', { route: 'none', target: 'none', priority: 'none', outcome: 'rejected' })).toBe(3);
    expect(s.mock.requests()).toHaveLength(0);
  });

  it('answers 400 invalid_body (param model) without a model, 415 for text/plain, and 400 bad_request for an undecodable URL and an HTTP/1.1 request without or with two Host headers', async () => {
    const s = await startStack();
    const noModel = await chat(s.url, {}, { messages: CHAT.messages });
    expect(noModel.status).toBe(400);
    const e = await errorOf(noModel);
    expect(e.code).toBe('invalid_body');
    expect(e.param).toBe('model');
    expect(e.message).toContain('you must provide a model parameter');
    const text = await chat(s.url, { 'content-type': 'text/plain' });
    expect(text.status).toBe(415);
    expect((await errorOf(text)).code).toBe('unsupported_media_type');
    const port = Number(new URL(s.url).port);
    const raw = async (head: string): Promise<string> => {
      const socket = connect(port, '127.0.0.1');
      socket.write(head);
      let got = '';
      socket.setEncoding('utf8');
      for await (const chunk of socket) got += chunk as string;
      return got;
    };
    const body = JSON.stringify(CHAT);
    for (const head of [
      `POST /v1/chat/completions% HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`,
      `POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`,
      `POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`,
    ]) {
      const answer = await raw(head);
      expect(answer, head.split('\r\n')[1]).toMatch(/^HTTP\/1\.1 400 /);
      expect(answer).toMatch(/x-should-retry: false/i);
      expect(JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)).error.code).toBe('bad_request');
    }
    expect(s.mock.requests()).toHaveLength(0);
  });

  it('answers 400 invalid_idempotency_key (param idempotency-key) for a 256-character key and 422 idempotency_key_reused for a key sent with another body, neither sent upstream', async () => {
    const s = await startStack();
    const long = await chat(s.url, { 'idempotency-key': 'k'.repeat(256) });
    expect(long.status).toBe(400);
    const e = await errorOf(long);
    expect(e.code).toBe('invalid_idempotency_key');
    expect(e.param).toBe('idempotency-key');
    const first = await chat(s.url, { 'idempotency-key': 'k'.repeat(255) });
    expect(first.status).toBe(200);
    await first.arrayBuffer();
    const reused = await chat(s.url, { 'idempotency-key': 'k'.repeat(255) }, { ...CHAT, messages: [{ role: 'user', content: 'something else' }] });
    expect(reused.status).toBe(422);
    expect((await errorOf(reused)).code).toBe('idempotency_key_reused');
    const requests = s.mock.requests();
    expect(requests).toHaveLength(1);
  });

  it('answers 502 upstream_redirect for a 3xx, naming status and where it pointed, sent once, counted 3xx', async () => {
    const fake = await recordingProvider((_req, res) => res.writeHead(301, { location: 'https://moved.example.com/v1/chat/completions?x=1' }).end());
    const s = await startStack({ config: (mockUrl) => configServedBy(mockUrl, 'moved', `${fake.origin}/v1`) });
    const res = await chat(s.url);
    expect(res.status).toBe(502);
    expect(res.headers.get('x-should-retry')).toBe('false');
    const e = await errorOf(res);
    expect(e.code).toBe('upstream_redirect');
    expect(e.message).toContain('301');
    expect(e.message).toContain('moved.example.com/v1/chat/completions');
    expect(fake.hits()).toBe(1);
    const m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_upstream_attempts_total', { target: 'moved/gpt-4o', status_class: '3xx' })).toBe(1);
  });

  it('answers 502 upstream_bad_response when every attempt got an HTML 200, counted bad_stream', async () => {
    const fake = await recordingProvider((_req, res) => res.writeHead(200, { 'content-type': 'text/html' }).end('<html><body>login</body></html>'));
    const s = await startStack({ config: (mockUrl) => configServedBy(mockUrl, 'html', `${fake.origin}/v1`) });
    const res = await chat(s.url);
    expect(res.status).toBe(502);
    expect(res.headers.get('x-should-retry')).toBe('false');
    expect((await errorOf(res)).code).toBe('upstream_bad_response');
    const m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_upstream_attempts_total', { target: 'html/gpt-4o', status_class: 'bad_stream' })).toBe(fake.hits());
  });

  it('answers 504 upstream_timeout when every attempt passed the provider\'s responseMs, counted timeout', async () => {
    const s = await startStack({ faults: { latencyMs: 2_000 }, route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 2, backoff: { baseMs: 1, capMs: 1 } } }, provider: { ...RETRY_LOOP_ONLY.provider, timeouts: { responseMs: 150 } } });
    const res = await chat(s.url);
    expect(res.status).toBe(504);
    expect(res.headers.get('x-should-retry')).toBe('false');
    expect((await errorOf(res)).code).toBe('upstream_timeout');
    const m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_upstream_attempts_total', { target: 'mock/gpt-4o', status_class: 'timeout' })).toBe(2);
    expect(value(m, 'stormgate_requests_total', { route: 'chat', target: 'mock/gpt-4o', priority: 'online', outcome: 'gateway_error' })).toBe(1);
  });

  it('answers 503 circuit_open with retry-after once the breaker opened, and counts the transition and the state', async () => {
    const s = await startStack({ faults: { errors: [{ status: 500, rate: 1 }] }, route: { park: false, retry: { maxAttempts: 1 } } });
    for (let i = 0; i < 5; i++) {
      const r = await chat(s.url);
      await r.arrayBuffer();
      await new Promise((done) => setTimeout(done, 70));
    }
    const open = await chat(s.url);
    expect(open.status).toBe(503);
    expect(Number(open.headers.get('retry-after'))).toBeGreaterThan(0);
    expect((await errorOf(open)).code).toBe('circuit_open');
    const m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_breaker_transitions_total', { target: 'mock/gpt-4o', to: 'open' })).toBe(1);
    expect(value(m, 'stormgate_breaker_state', { target: 'mock/gpt-4o' })).toBe(1);
    expect(value(m, 'stormgate_requests_total', { route: 'chat', target: 'mock/gpt-4o', priority: 'online', outcome: 'unavailable' })).toBe(1);
  });
});

describe('the metrics table, after the traffic that makes each series', () => {
  it('counts a retried request that succeeded, its retry by reason, and the 60 s retry-success and fallback gauges', async () => {
    let n = 0;
    const fake = await recordingProvider((_req, res) => {
      if (n++ === 0) res.writeHead(503, { 'content-type': 'application/json' }).end('{"error":{"message":"busy","type":"server_error","param":null,"code":null}}');
      else res.writeHead(200, { 'content-type': 'application/json' }).end(chatCompletion('ok'));
    });
    const s = await startStack({ config: (mockUrl) => ({ ...configServedBy(mockUrl, 'flaky', `${fake.origin}/v1`), routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'flaky' }], retry: { backoff: { baseMs: 1, capMs: 1 } } }] }) });
    const first = await chat(s.url);
    expect(first.status).toBe(200);
    expect(first.headers.get('x-stormgate-attempts')).toBe('2');
    await first.arrayBuffer();
    const second = await chat(s.url);
    await second.arrayBuffer();
    const m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_retried_requests_total', { route: 'chat', result: 'success' })).toBe(1);
    expect(value(m, 'stormgate_retry_count_total', { route: 'chat', target: 'flaky/gpt-4o', reason: 'status_503' })).toBe(1);
    expect(value(m, 'stormgate_retry_success_rate', { route: 'chat' })).toBe(1);
    expect(value(m, 'stormgate_fallback_rate', { route: 'chat' })).toBe(0);
  });

  it('times a stream to its first output, counts how it ended and bills its usage when the client asked for it', async () => {
    const s = await startStack();
    const res = await chat(s.url, {}, { ...CHAT, stream: true, stream_options: { include_usage: true } });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
    expect(res.headers.get('x-accel-buffering')).toBe('no');
    const text = await res.text();
    expect(text).toContain('data: [DONE]');
    await requestLine(s);
    const m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_ttft_seconds_count', { route: 'chat' })).toBe(1);
    expect(value(m, 'stormgate_stream_ends_total', { route: 'chat', end: 'complete' })).toBe(1);
    for (const end of ['done-added', 'cut', 'stalled', 'upstream-error', 'client-gone', 'client-stalled', 'recovered', 'shutdown']) expect(value(m, 'stormgate_stream_ends_total', { route: 'chat', end }), end).toBe(0);
    expect(value(m, 'stormgate_tokens_total', { route: 'chat', target: 'mock/gpt-4o', kind: 'completion' })).toBeGreaterThan(0);
  });

  it('counts a passthrough request by configured path and class, from zero series for every class, and not in the managed series', async () => {
    const fake = await recordingProvider((_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"object":"list","data":[]}'));
    const s = await startStack({ config: (mockUrl) => ({ ...configServedBy(mockUrl, 'files', `${fake.origin}/v1`), passthrough: { provider: 'files', paths: ['/v1/files'] } }) });
    const before = await scrapeMetrics(s.url);
    for (const c of ['2xx', '3xx', '4xx', '5xx', 'client_gone']) expect(value(before, 'stormgate_passthrough_requests_total', { path: '/v1/files', status_class: c }), c).toBe(0);
    const res = await fetch(`${s.url}/v1/files/file-abc/content?x=1`);
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    const m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_passthrough_requests_total', { path: '/v1/files', status_class: '2xx' })).toBe(1);
    expect(m.filter((x) => x.name === 'stormgate_requests_total').reduce((sum, x) => sum + x.value, 0)).toBe(0);
    expect(m.filter((x) => x.name === 'stormgate_upstream_attempts_total').reduce((sum, x) => sum + x.value, 0)).toBe(0);
  });

  it('counts a degraded answer by route and reason, and says the reason in x-stormgate-degraded-reason', async () => {
    const s = await startStack({
      faults: { errors: [{ status: 500, rate: 1 }] },
      config: (mockUrl) => ({ ...defaultConfig(mockUrl, RETRY_LOOP_ONLY), routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }], ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 1 }, degraded: { message: 'Try again later.' } }] }),
    });
    const res = await chat(s.url);
    expect(res.status).toBe(200);
    expect(res.headers.get('x-stormgate-degraded')).toBe('true');
    expect(res.headers.get('x-stormgate-degraded-reason')).toBe('failed');
    const body = (await res.json()) as { choices: { message: { content: string } }[] };
    expect(body.choices[0]!.message.content).toBe('Try again later.');
    const m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_degraded_total', { route: 'chat', reason: 'failed' })).toBe(1);
    expect(value(m, 'stormgate_requests_total', { route: 'chat', target: 'mock/gpt-4o', priority: 'online', outcome: 'degraded' })).toBe(1);
  });

  it('keeps the adaptive limit of a route on a path with no known API under the target and the route\'s name, apart from the target\'s own', async () => {
    const fake = await recordingProvider((req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end(req.url!.includes('chat') ? chatCompletion('ok') : '{"results":[]}'));
    const s = await startStack({
      config: (mockUrl) => ({
        ...configServedBy(mockUrl, 'p', `${fake.origin}/v1`),
        routes: [
          { name: 'mods', match: { path: '/v1/moderations' }, targets: [{ provider: 'p' }] },
          { name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'p' }] },
        ],
      }),
    });
    const mods = await post(s.url, '/v1/moderations', { model: 'omni-moderation-latest', input: 'x' });
    expect(mods.status).toBe(200);
    await mods.arrayBuffer();
    const answer = await post(s.url, '/v1/chat/completions', CHAT);
    await answer.arrayBuffer();
    const m = await scrapeMetrics(s.url);
    const limits = m.filter((x) => x.name === 'stormgate_pool_limit').map((x) => x.labels.target).sort();
    expect(limits).toEqual(['p/gpt-4o', 'p/omni-moderation-latest mods']);
  });

  it('has every metric of the table, with the labels it names, on a scrape', async () => {
    const s = await startStack({ config: (mockUrl) => ({ ...defaultConfig(mockUrl), auth: { keys: { agents: 'agents-key-0123' }, limits: { agents: { requestsPerMinute: 600 } } }, routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }], degraded: { message: 'later' } }] }) });
    const res = await chat(s.url, { authorization: 'Bearer agents-key-0123' });
    await res.arrayBuffer();
    const metrics = createMetrics({ defaultMetrics: false });
    const defined = new Map((metrics.registry.getMetricsAsArray() as unknown as { name: string; labelNames?: string[] }[]).map((x) => [x.name, [...(x.labelNames ?? [])].sort()]));
    const table = README.slice(README.indexOf('| `stormgate_requests_total` | counter'), README.indexOf('Plus Node\'s default process metrics'));
    const rows = [...table.matchAll(/^ *\| (`stormgate_[^|]+) \| (\w+) \| *([^|]*?) *\|/gm)];
    expect(rows.length).toBeGreaterThan(25);
    for (const [, names, , labelCell] of rows) {
      const labels = labelCell!.replace(/\([^)]*\)/g, '').split(',').map((l) => l.trim()).filter(Boolean).sort();
      for (const name of [...names!.matchAll(/`(stormgate_\w+)`/g)].map((x) => x[1]!)) {
        expect(defined.get(name), `${name} is defined`).toBeDefined();
        expect(defined.get(name), `${name}'s labels`).toEqual(labels);
      }
    }
    expect(defined.size, 'every metric defined is in the table').toBe(rows.reduce((n, r) => n + [...r[1]!.matchAll(/`stormgate_/g)].length, 0));
    await s.close();
  });
});

describe('rates at their default bursts', () => {
  it('lets a client of requestsPerMinute 30 send ten seconds\' worth (5) at once, then 429 client_rate_limited', async () => {
    const s = await startStack({ config: (mockUrl) => ({ ...defaultConfig(mockUrl), auth: { keys: { agents: 'agents-key-0123' }, limits: { agents: { requestsPerMinute: 30 } } } }) });
    const statuses: number[] = [];
    for (let i = 0; i < 6; i++) {
      const res = await chat(s.url, { authorization: 'Bearer agents-key-0123' });
      statuses.push(res.status);
      if (res.status === 429) {
        expect((await errorOf(res)).code).toBe('client_rate_limited');
        expect(res.headers.get('x-should-retry')).toBe('true');
        expect(Number(res.headers.get('retry-after-ms'))).toBeGreaterThan(0);
      } else await res.arrayBuffer();
    }
    expect(statuses).toEqual([200, 200, 200, 200, 200, 429]);
    const m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_client_limited_total', { client: 'agents', by: 'requests' })).toBe(1);
  });

  it('sends a target of pools.requestsPerMinute 60 one request at once (a second\'s worth), the next after its turn', async () => {
    const s = await startStack({ provider: { pools: { requestsPerMinute: 60 } } });
    const [a, b] = await Promise.all([chat(s.url), chat(s.url)]);
    expect([a.status, b.status]).toEqual([200, 200]);
    await Promise.all([a.arrayBuffer(), b.arrayBuffer()]);
    // The second reached the provider once the bucket had its next token, a second after the first.
    const [first, second] = s.mock.requests().map((r) => r.receivedAt);
    expect(second! - first!).toBeGreaterThanOrEqual(900);
  });
});

describe('headers', () => {
  it('passes back openai-version, openai-model, apim-request-id and request-id, writes application/json for a provider\'s Application/JSON, and drops its rate-limit and organisation headers', async () => {
    const fake = await recordingProvider((_req, res) =>
      res
        .writeHead(200, {
          'content-type': 'Application/JSON',
          'openai-version': '2020-10-01',
          'openai-model': 'gpt-4o-2024-08-06',
          'apim-request-id': 'apim-1',
          'request-id': 'req-anth',
          'openai-organization': 'org-secret',
          'x-ratelimit-remaining-requests': '9',
          'set-cookie': 'a=b',
        })
        .end(chatCompletion('ok')),
    );
    const s = await startStack({ config: (mockUrl) => configServedBy(mockUrl, 'p', `${fake.origin}/v1`) });
    const res = await chat(s.url);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^application\/json/);
    expect(res.headers.get('openai-version')).toBe('2020-10-01');
    expect(res.headers.get('openai-model')).toBe('gpt-4o-2024-08-06');
    expect(res.headers.get('apim-request-id')).toBe('apim-1');
    expect(res.headers.get('request-id')).toBe('req-anth');
    expect(res.headers.get('openai-organization')).toBeNull();
    expect(res.headers.get('x-ratelimit-remaining-requests')).toBeNull();
    expect(res.headers.get('set-cookie')).toBeNull();
    expect(((await res.json()) as { choices: unknown[] }).choices).toHaveLength(1);
  });

  it('on a passthrough path, drops the client\'s credentials, organisation, method overrides, client-identity, x-stormgate-* and retry headers, and answers without the provider\'s rate-limit, cookie and x-stormgate-* headers', async () => {
    const fake = await recordingProvider((_req, res) =>
      res.writeHead(200, { 'content-type': 'application/json', 'x-request-id': 'req-up', 'x-ratelimit-limit-requests': '10', 'openai-organization': 'org-x', 'set-cookie': 'c=d', 'x-stormgate-route': 'fake' }).end('{"object":"list","data":[]}'),
    );
    const s = await startStack({ config: (mockUrl) => ({ ...configServedBy(mockUrl, 'files', `${fake.origin}/v1`), passthrough: { provider: 'files', paths: ['/v1/files'] } }) });
    const dropped = {
      authorization: 'Bearer client-key',
      'proxy-authorization': 'Basic eA==',
      'api-key': 'client-key',
      'x-api-key': 'client-key',
      cookie: 'session=1',
      'openai-organization': 'org-client',
      'openai-project': 'proj-client',
      'x-stormgate-priority': 'batch',
      'x-http-method-override': 'DELETE',
      'x-http-method': 'DELETE',
      'x-method-override': 'DELETE',
      'x-original-method': 'DELETE',
      'x-original-url': '/v1/other',
      'x-rewrite-url': '/v1/other',
      'x-forwarded-for': '10.0.0.1',
      'x-forwarded-host': 'evil.example',
      forwarded: 'for=10.0.0.1',
      'x-real-ip': '10.0.0.1',
      'x-client-ip': '10.0.0.1',
      'true-client-ip': '10.0.0.1',
      'x-retry-attempt': '2',
      'x-retry-reason': 'status_503',
    };
    const res = await fetch(`${s.url}/v1/files`, { headers: { ...dropped, 'x-request-id': 'client-req-0001' } });
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    const sent = fake.seen[0]!;
    for (const name of Object.keys(dropped)) if (name !== 'authorization') expect(sent[name], name).toBeUndefined();
    expect(sent.authorization).toBe('Bearer files-key');
    expect(res.headers.get('x-stormgate-request-id')).toBe('client-req-0001');
    expect(sent['x-client-request-id']).toBe('client-req-0001');
    expect(res.headers.get('x-should-retry')).toBe('false');
    expect(res.headers.get('x-request-id')).toBe('req-up');
    for (const name of ['x-ratelimit-limit-requests', 'openai-organization', 'set-cookie']) expect(res.headers.get(name), name).toBeNull();
    expect(res.headers.get('x-stormgate-route')).toBeNull();
  });
});

describe('passthrough', () => {
  it('forwards HEAD with GET, answers a provider\'s 401 502 upstream_auth_error, puts an HTML 500 in the OpenAI shape, each counted by class', async () => {
    const fake = await recordingProvider((req, res) => {
      if (req.url!.startsWith('/v1/files/denied')) res.writeHead(401, { 'content-type': 'application/json' }).end('{"error":{"message":"Incorrect API key provided: files-key","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}');
      else if (req.url!.startsWith('/v1/files/broken')) res.writeHead(500, { 'content-type': 'text/html' }).end('<html><head><title>500 Internal Server Error</title></head><body><h1>oops</h1></body></html>');
      else res.writeHead(200, { 'content-type': 'application/json', 'x-request-id': 'req-head' }).end(req.method === 'HEAD' ? undefined : '{}');
    });
    const s = await startStack({ config: (mockUrl) => ({ ...configServedBy(mockUrl, 'files', `${fake.origin}/v1`), passthrough: { provider: 'files', paths: ['/v1/files'] } }) });
    const head = await fetch(`${s.url}/v1/files`, { method: 'HEAD' });
    expect(head.status).toBe(200);
    expect(head.headers.get('x-request-id')).toBe('req-head');
    const denied = await fetch(`${s.url}/v1/files/denied`);
    expect(denied.status).toBe(502);
    expect(denied.headers.get('x-should-retry')).toBe('false');
    const d = await errorOf(denied);
    expect(d.code).toBe('upstream_auth_error');
    expect(d.message).not.toContain('files-key');
    const broken = await fetch(`${s.url}/v1/files/broken`);
    expect(broken.status).toBe(500);
    expect(broken.headers.get('content-type')).toMatch(/^application\/json/);
    const b = await errorOf(broken);
    expect(b.message).toContain('500 Internal Server Error');
    expect(b.message).not.toContain('<');
    expect(fake.hits()).toBe(3);
    const m = await scrapeMetrics(s.url);
    expect(value(m, 'stormgate_passthrough_requests_total', { path: '/v1/files', status_class: '2xx' })).toBe(1);
    expect(value(m, 'stormgate_passthrough_requests_total', { path: '/v1/files', status_class: '5xx' })).toBe(2);
  });
});

describe('the Responses API\'s stored responses through passthrough', () => {
  it('forwards GET with its query and DELETE under /v1/responses/, never a create spelled with a trailing slash, doubled slashes or a dot segment, and takes the key out of an error', async () => {
    const fake = await recordingProvider((req, res) => {
      if (req.url!.includes('missing')) res.writeHead(404, { 'content-type': 'application/json' }).end('{"error":{"message":"No response resp_x for key stored-key","type":"invalid_request_error","param":null,"code":null}}');
      else res.writeHead(200, { 'content-type': 'application/json' }).end('{"id":"resp_1","object":"response"}');
    });
    const s = await startStack({
      config: (mockUrl) => ({ ...configServedBy(mockUrl, 'stored', `${fake.origin}/v1`), passthrough: { provider: 'stored', paths: ['/v1/responses/'], methods: ['GET', 'POST', 'DELETE'] } }),
    });
    const create = { model: 'gpt-4o', input: 'hi' };
    for (const path of ['/v1/responses/', '//v1/responses', '/v1/responses%2F', '/v1/responses/%2e']) {
      const res = await post(s.url, path, create);
      expect(res.status, path).toBe(404);
      expect((await errorOf(res)).code).toBe('unknown_url');
    }
    for (const path of ['/v1/responses/.', '/v1/responses/%2E']) {
      const res = await rawGet(`${s.url}${path}`);
      expect(res.status, path).toBe(404);
      expect(JSON.parse(res.body).error.code).toBe('unknown_url');
    }
    expect(fake.hits()).toBe(0);
    const got = await fetch(`${s.url}/v1/responses/resp_1?include[]=file_search_call.results`);
    expect(got.status).toBe(200);
    expect(await got.json()).toEqual({ id: 'resp_1', object: 'response' });
    const deleted = await fetch(`${s.url}/v1/responses/resp_1`, { method: 'DELETE' });
    expect(deleted.status).toBe(200);
    await deleted.arrayBuffer();
    const missing = await fetch(`${s.url}/v1/responses/missing`);
    expect(missing.status).toBe(404);
    expect((await errorOf(missing)).message).toBe('No response resp_x for key [redacted]');
    expect(fake.hits()).toBe(3);
    for (const sent of fake.seen) expect(sent['x-client-request-id']).toBeTruthy();
  });

  it('drops the client\'s hop-by-hop headers (those its connection names, te, keep-alive, upgrade) and expect, and answers with its own keep-alive', async () => {
    const fake = await recordingProvider((_req, res) => res.writeHead(200, { 'content-type': 'application/json', 'keep-alive': 'timeout=1' }).end('{}'));
    const s = await startStack({ config: (mockUrl) => ({ ...configServedBy(mockUrl, 'files', `${fake.origin}/v1`), passthrough: { provider: 'files', paths: ['/v1/files'] } }) });
    const res = await rawGet(`${s.url}/v1/files`, { connection: 'x-hop, keep-alive', 'x-hop': '1', te: 'trailers', 'keep-alive': 'timeout=5', upgrade: 'websocket', expect: '100-continue' });
    expect(res.status).toBe(200);
    expect(res.headers['keep-alive']).toBe('timeout=72');
    const sent = fake.seen[0]!;
    for (const name of ['x-hop', 'te', 'keep-alive', 'upgrade', 'expect']) expect(sent[name], name).toBeUndefined();
    expect(sent.authorization).toBe('Bearer files-key');
  });
});

describe('ops endpoints', () => {
  it('answers /healthz, and /readyz with the state store named and not degraded, without client keys', async () => {
    const s = await startStack({ config: (mockUrl) => ({ ...defaultConfig(mockUrl), auth: { keys: { agents: 'agents-key-0123' } } }) });
    expect((await fetch(`${s.url}/healthz`)).status).toBe(200);
    const ready = await fetch(`${s.url}/readyz`);
    expect(ready.status).toBe(200);
    expect(await ready.json()).toMatchObject({ store: 'memory', degraded: false });
    expect((await fetch(`${s.url}/metrics`)).status).toBe(200);
    expect((await chat(s.url)).status).toBe(401);
  });
});

describe('grafana/', () => {
  const dashboard = JSON.parse(read('grafana/dashboards/stormgate.json')) as { panels: { targets?: { expr: string }[] }[]; templating: { list: { query: { query: string } | string }[] } };
  const exprs = [
    ...dashboard.panels.flatMap((p) => (p.targets ?? []).map((t) => t.expr)),
    ...dashboard.templating.list.map((v) => (typeof v.query === 'string' ? v.query : v.query.query)),
    ...['grafana/prometheus/rules/recording.yml', 'grafana/prometheus/rules/alerts.yml'].flatMap((f) => (parseYaml(read(f)) as { groups: { rules: { expr: string }[] }[] }).groups.flatMap((g) => g.rules.map((r) => String(r.expr)))),
  ];
  const labelsOf = (): Map<string, Set<string>> => {
    const out = new Map<string, Set<string>>();
    for (const m of createMetrics({ defaultMetrics: false }).registry.getMetricsAsArray() as unknown as { name: string; labelNames?: string[]; constructor: { name: string } }[]) {
      const labels = new Set([...(m.labelNames ?? []), 'instance', 'job']);
      out.set(m.name, labels);
      if (m.constructor.name === 'Histogram') for (const suffix of ['_bucket', '_count', '_sum']) out.set(m.name + suffix, suffix === '_bucket' ? new Set([...labels, 'le']) : labels);
    }
    return out;
  };

  it('filters and groups each metric only by labels it has, and matches only label values the README names', () => {
    const labels = labelsOf();
    let checked = 0;
    for (const expr of exprs) {
      for (const sel of expr.matchAll(/(stormgate_\w+)\{([^}]*)\}/g)) {
        for (const matcher of sel[2]!.matchAll(/(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"/g)) {
          expect(labels.get(sel[1]!)?.has(matcher[1]!), `${sel[0]} in ${expr}`).toBe(true);
          if (!matcher[3]!.startsWith('$')) for (const v of matcher[3]!.split('|')) expect(README, `${matcher[1]}="${v}"`).toContain(v);
          checked++;
        }
      }
      // `by (a, b) (inner)`: every raw metric inside carries each grouping label.
      for (const by of expr.matchAll(/by \(([^)]*)\)\s*\(/g)) {
        let depth = 1;
        let i = by.index! + by[0].length;
        for (; i < expr.length && depth > 0; i++) depth += expr[i] === '(' ? 1 : expr[i] === ')' ? -1 : 0;
        const inner = expr.slice(by.index! + by[0].length, i);
        for (const metric of inner.matchAll(/stormgate_\w+/g)) {
          for (const label of by[1]!.split(',').map((l) => l.trim())) expect(labels.get(metric[0])?.has(label), `by (${label}) of ${metric[0]} in ${expr}`).toBe(true);
          checked++;
        }
      }
      for (const lv of expr.matchAll(/label_values\((stormgate_\w+), (\w+)\)/g)) expect(labels.get(lv[1]!)?.has(lv[2]!), lv[0]).toBe(true);
    }
    expect(checked).toBeGreaterThan(40);
  });

  it('selects recorded series only by labels their rule keeps', () => {
    const recorded = new Map<string, Set<string>>();
    for (const rule of (parseYaml(read('grafana/prometheus/rules/recording.yml')) as { groups: { rules: { record: string; expr: string }[] }[] }).groups[0]!.rules) {
      const outer = /^\s*sum(?: by \(([^)]*)\))?/.exec(rule.expr)!;
      recorded.set(rule.record, new Set((outer[1] ?? '').split(',').map((l) => l.trim()).filter(Boolean)));
    }
    for (const expr of exprs) {
      for (const sel of expr.matchAll(/(stormgate:\w+:\w+)\{([^}]*)\}/g)) {
        for (const matcher of sel[2]!.matchAll(/(\w+)\s*(?:=~|!~|!=|=)/g)) expect(recorded.get(sel[1]!)?.has(matcher[1]!), `${sel[0]} in ${expr}`).toBe(true);
      }
    }
  });
});

describe('docker-compose.yml and the Dockerfile', () => {
  const compose = parseYaml(read('docker-compose.yml')) as { services: Record<string, { build?: { target: string }; environment?: string[] | Record<string, string>; command?: string[]; ports?: string[]; stop_grace_period?: string; expose?: string[] }> };
  const dockerfile = read('Dockerfile');
  const pkg = JSON.parse(read('package.json')) as { scripts: Record<string, string>; dependencies: Record<string, string> };

  it('copies paths that exist, builds dist/main.js with npm run build, and runs it on config/docker.yaml, whose port the image exposes and checks', () => {
    for (const copy of dockerfile.matchAll(/^COPY (?!--from)(.+) \S+$/gm)) for (const src of copy[1]!.split(' ')) expect(existsSync(join(ROOT, src)), src).toBe(true);
    expect(pkg.scripts.build).toBe('tsc -p tsconfig.build.json');
    const build = JSON.parse(read('tsconfig.build.json')) as { compilerOptions: { rootDir: string; outDir: string } };
    expect(build.compilerOptions).toMatchObject({ rootDir: 'src', outDir: 'dist' });
    expect(existsSync(join(ROOT, 'src/main.ts'))).toBe(true);
    expect(dockerfile).toContain('CMD ["node", "dist/main.js", "--config", "/app/config/docker.yaml"]');
    expect(dockerfile).toMatch(/^WORKDIR \/app$/m);
    const docker = parse(read('config/docker.yaml'), { STORMGATE_API_KEY: 'k', OPENAI_API_KEY: 'k' });
    expect(docker.server).toMatchObject({ host: '0.0.0.0', port: 8080 });
    expect(dockerfile).toContain('EXPOSE 8080');
    expect(dockerfile).toContain("fetch('http://127.0.0.1:8080/healthz')");
    expect(compose.services.gateway!.ports).toEqual(['8080:8080']);
    // Production dependencies only, yet the runtime needs none of the dev ones: tsx is not needed by dist, and every
    // package dist imports is a dependency.
    expect(dockerfile).toContain('npm ci --omit=dev');
    expect(dockerfile).toMatch(/^USER node$/m);
    // .dockerignore keeps none of what the stages copy out of the build context.
    const ignored = read('.dockerignore').split('\n').map((l) => l.trim().replace(/\/$/, '')).filter((l) => l && !l.startsWith('#'));
    for (const copy of dockerfile.matchAll(/^COPY (?!--from)(.+) \S+$/gm)) for (const src of copy[1]!.split(' ')) expect(ignored, src).not.toContain(src.replace(/^\.\//, ''));
    expect(ignored).toContain('node_modules');
  });

  it('needs at run time only production dependencies: every package src/ imports is one, so npm ci --omit=dev serves dist/', () => {
    const files = readdirSync(join(ROOT, 'src'), { recursive: true, encoding: 'utf8' }).filter((f) => /\.(ts|mjs)$/.test(f));
    const used = new Set<string>();
    for (const f of files) {
      for (const m of read(join('src', f)).matchAll(/(?:from |import\()'([^.'][^']*)'/g)) {
        if (m[1]!.startsWith('node:')) continue;
        used.add(m[1]!.startsWith('@') ? m[1]!.split('/').slice(0, 2).join('/') : m[1]!.split('/')[0]!);
      }
    }
    expect(used.size).toBeGreaterThan(5);
    for (const name of used) expect(Object.keys(pkg.dependencies), name).toContain(name);
  });

  it('passes the gateway exactly the variables config/docker.yaml reads, and the demo\'s set loads it with the compose Redis', () => {
    const env = compose.services.gateway!.environment as string[];
    const passed = env.map((e) => e.split('=')[0]!).sort();
    const reads = [...new Set([...read('config/docker.yaml').matchAll(/\$\{(\w+)/g)].map((m) => m[1]!))].sort();
    expect(passed).toEqual(reads);
    const demo = parse(read('config/docker.yaml'), { STORMGATE_API_KEY: 'demo', OPENAI_BASE_URL: 'http://mock:9000/v1', OPENAI_API_KEY: 'demo', REDIS_URL: 'redis://redis:6379' });
    expect(demo.providers.openai!.baseUrl).toBe('http://mock:9000/v1');
    expect(demo.state.redis).toBe('redis://redis:6379');
    expect(demo.auth!.keys).toEqual({ default: 'demo' });
    expect(demo.providers.anthropic!.optional).toBe(true);
    // Without the client key, it says which variable to set.
    expect(refusal(read('config/docker.yaml'), { OPENAI_API_KEY: 'demo' })).toContain('STORMGATE_API_KEY');
  });

  it('gives the drain room: stop_grace_period above drain.preStopMs + graceMs, the defaults its comment names', () => {
    const c = parse(read('config/docker.yaml'), { STORMGATE_API_KEY: 'k', OPENAI_API_KEY: 'k' });
    expect(c.drain).toEqual({ preStopMs: 5000, graceMs: 30_000 });
    expect(read('docker-compose.yml')).toContain('drain.preStopMs (5 s), then requests get drain.graceMs (30 s)');
    const graceS = Number(/^(\d+)s$/.exec(compose.services.gateway!.stop_grace_period!)![1]);
    expect(graceS * 1000).toBeGreaterThan(c.drain.preStopMs + c.drain.graceMs);
  });

  it('runs the mock with flags its CLI has and a fault spec it takes, from the build stage that has src/ and tsx', async () => {
    const mock = compose.services.mock!;
    expect(mock.build).toEqual({ context: '.', target: 'build' });
    expect(dockerfile).toMatch(/FROM node:20-slim AS build[\s\S]*COPY src \.\/src/);
    const cmd = mock.command!;
    expect(cmd.slice(0, 4)).toEqual(['npm', 'run', 'mock', '--']);
    expect(pkg.scripts.mock).toContain('tsx src/mock/main.ts');
    const cli = read('src/mock/main.ts');
    for (const flag of cmd.filter((a) => a.startsWith('--') && a !== '--')) expect(cli, flag).toContain(`'${flag.slice(2)}'`.replace(/^'(\w+)'$/, '$1:'));
    const spec = JSON.parse(cmd[cmd.indexOf('--faults') + 1]!) as object;
    expect(() => assertFaultSpec(spec)).not.toThrow();
    expect(cmd[cmd.indexOf('--port') + 1]).toBe('9000');
    expect(mock.expose).toEqual(['9000']);
    // The loadgen's brownout is one the mock takes.
    const m = await startMock();
    const brownout = await fetch(`${m.url}/_mock/brownout`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ mode: '503', durationMs: 20000 }) });
    expect(await brownout.json()).toEqual({ ok: true, mode: '503', durationMs: 20000 });
    // grafana/README.md: 20 requests a second, a 20-second brownout every 5 minutes.
    const loadgen = compose.services.loadgen as unknown as { environment: Record<string, string>; command: string[] };
    expect(loadgen.environment).toMatchObject({ RPS: '20', BROWNOUT_EVERY_S: '300' });
    expect(loadgen.command.join('\n')).toContain("JSON.stringify({ mode: '503', durationMs: 20000 })");
  });

  it('serves the loadgen\'s requests through config/docker.yaml in front of the mock: a batch stream with usage and a whole answer, with its client key', async () => {
    const m = await startMock({ apiKey: 'demo' });
    const config = parse(read('config/docker.yaml'), { STORMGATE_API_KEY: 'demo', OPENAI_BASE_URL: `${m.url}/v1`, OPENAI_API_KEY: 'demo' });
    const url = await startGateway(config);
    const headers = { authorization: 'Bearer demo' };
    const stream = await chat(url, { ...headers, 'x-stormgate-priority': 'batch' }, { model: 'gpt-4o-mini', stream: true, stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'hello from the loadgen' }] });
    expect(stream.status).toBe(200);
    expect(await stream.text()).toContain('"usage"');
    const whole = await chat(url, headers, { model: 'gpt-4o-mini', stream: false, messages: [{ role: 'user', content: 'hello from the loadgen' }] });
    expect(whole.status).toBe(200);
    expect(whole.headers.get('x-stormgate-route')).toBe('chat');
    await whole.arrayBuffer();
    const metrics = await scrapeMetrics(url);
    expect(value(metrics, 'stormgate_requests_total', { route: 'chat', target: 'openai/gpt-4o-mini', priority: 'batch', outcome: 'success' })).toBe(1);
    expect(value(metrics, 'stormgate_requests_total', { route: 'chat', target: 'openai/gpt-4o-mini', priority: 'online', outcome: 'success' })).toBe(1);
  });
});

describe('the quick start', () => {
  it('names the default config\'s line when OPENAI_API_KEY is unset, and config/demo.yaml loads', () => {
    const message = (() => {
      try {
        parseConfig(read('config/gateway.yaml'), 'config/gateway.yaml', {});
      } catch (err) {
        return (err as Error).message;
      }
      return '';
    })();
    expect(message).toContain('config/gateway.yaml:7: providers.openai.apiKey: environment variable OPENAI_API_KEY is not set');
    const gateway = parseConfig(read('config/gateway.yaml'), 'config/gateway.yaml', { OPENAI_API_KEY: 'sk-x' });
    expect(gateway.server).toMatchObject({ host: '127.0.0.1', port: 8080 });
    expect(gateway.auth).toBeUndefined();
    const demo = parseConfig(read('config/demo.yaml'), 'config/demo.yaml', {});
    expect(Object.keys(demo.providers).sort()).toEqual(['backup', 'primary']);
  });

  it('serves the quick start\'s curl through config/gateway.yaml against the mock, then a 503 brownout', async () => {
    const m = await startMock({ apiKey: 'any' });
    const config = parseConfig(read('config/gateway.yaml'), 'config/gateway.yaml', { OPENAI_BASE_URL: `${m.url}/v1`, OPENAI_API_KEY: 'any' });
    const url = await startGateway(config);
    const ok = await chat(url);
    expect(ok.status).toBe(200);
    expect(ok.headers.get('x-stormgate-request-id')).toBeTruthy();
    await ok.arrayBuffer();
    const brownout = await fetch(`${m.url}/_mock/brownout`, { method: 'POST', body: JSON.stringify({ mode: '503', durationMs: 15000 }) });
    expect(brownout.status).toBe(200);
    const failing = await chat(url, { 'x-stormgate-timeout-ms': '3000' });
    expect([502, 503, 504]).toContain(failing.status);
    expect(failing.headers.get('x-should-retry')).toBe('false');
    await failing.arrayBuffer();
  });
});

void TEST_KEY;
