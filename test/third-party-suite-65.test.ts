// Third-party failure-scenario suite 65: an outside reviewer's gateway suite (the kind LiteLLM's router tests, Portkey's
// gateway tests and Envoy's retry tests run), written from the README alone and driven only as a user would: the
// official `openai` 6.x SDK over real HTTP on 127.0.0.1, YAML configs written from the README's examples and its
// configuration reference (loaded as `--config` loads them), the bundled mock provider with its control endpoint
// (`/_mock/brownout`, `/_mock/faults`, `/_mock/requests`, `/_mock/stats`) changing faults at run time.
// On what the earlier suites covered least:
//  1. the SDK's own retries on top of the gateway's: a 429 whose retry-after outlasts `maxWaitHintMs` is answered once
//     with `x-should-retry: true` and the hold-off's end, the SDK (maxRetries 2) comes back once, after it (spacing
//     measured at the mock), declared (`stormgate_client_retries_total{how="declared"}`), and is answered; 30 agents
//     at once in the same brownout each come back after the hold-off, spread, all answered; a lasting 503 costs the
//     provider the route's attempts and the SDK none of its retries;
//  2. the README's metrics after scripted runs, `stormgate_request_duration_seconds` by its `attempt` label (first,
//     retry) included, which no test read: a stream with include_usage through a 503 before its first byte and a whole
//     answer; then a first-try, a retried, a failed-over and a failed call (retry success rate 2/3, fallback rate 1/4);
//  3. a stream cut after its first byte: the SDK's iteration raises (never a clean end), nothing is sent again;
//  4. a per-request SDK `timeout` shorter than the route's on a stream whose first token is slow at the primary: the
//     gateway moves on at firstTokenMs and the backup's stream reaches the SDK before its timeout;
//  5. embeddings with an array input and `encoding_format: base64` through a 503 and a retry, vectors byte-equal;
//  6. a provider at capacity answering 429 with retry-after: no retry goes out during the second it asked for;
//  7. faults on one model of a route: a 429's hold-off is gpt-4o's alone (gpt-4o-mini goes straight through); a
//     per-model breaker override keyed by an OpenRouter-style name (`openai/gpt-4.1`) applies to that model only;
//  8. the Anthropic SDK (maxRetries 2) on /v1/messages invited back after a 429 hold-off, answered, 2 upstream requests;
//  9. the Responses API: streamed through a failover within its family, usage billed to the backup once; an
//     Anthropic backup on /v1/responses refused at start-up at its line.
// Found here: no gateway defect. Three first drafts misread something other than the gateway and were fixed: the
// openai SDK returns base64 strings as they came when the caller asks for `encoding_format: base64` (it decodes only
// when the caller did not ask); `responses.stream().finalResponse()` has no `output_text` field (openai 6.30; read
// the output items); a YAML line number miscounted. Reported as a design question: agents turned away during a
// hold-off are told its end as then known, and a 429 with retry-after answered to a request sent before the hold-off
// began can extend it; such an agent comes back to a second `429 provider_held_off` (an extra round trip, nothing
// upstream), so the README's "not turned away again when it comes back" holds only when no answer extends the hold-off.
// Bounds are generous: a loaded 2-core machine.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { ConfigError, parseConfig } from '../src/config/load.ts';
import type { MockRequestLog, MockServer } from '../src/mock/server.ts';
import { mockControl } from './helpers/mock-control.ts';
import { sdkError } from './helpers/openai-error.ts';
import { scrapeMetrics, TEST_KEY, useExtraMocks, useGateways, type MetricSample } from './helpers/stack.ts';

const startGateway = useGateways();
const startMockProvider = useExtraMocks();

/** A gateway from YAML text, as `npm start -- --config gw.yaml` loads it, with the mocks' URLs in its environment. */
async function gatewayFrom(yaml: string, env: Record<string, string>): Promise<string> {
  const config = parseConfig(yaml, 'gw.yaml', { OPENAI_API_KEY: TEST_KEY, ...env });
  return startGateway(config);
}

function client(url: string, opts: Partial<ConstructorParameters<typeof OpenAI>[0]> = {}): OpenAI {
  return new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused-by-the-gateway', ...opts });
}

/** The sum of a metric's samples whose labels include `labels`. */
function metric(samples: MetricSample[], name: string, labels: Record<string, string> = {}): number {
  return samples
    .filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))
    .reduce((sum, s) => sum + s.value, 0);
}

async function mockRequests(mock: MockServer): Promise<MockRequestLog[]> {
  return (await mockControl(mock, 'GET', 'requests')) as MockRequestLog[];
}

const messages = [{ role: 'user' as const, content: 'hi' }];

describe("the SDK's retries on top of the gateway's", () => {
  const yaml = `
server: { host: 127.0.0.1, port: 0, logLevel: info }
providers:
  openai: { family: openai, baseUrl: "\${OPENAI_BASE_URL}", apiKey: "\${OPENAI_API_KEY}", breaker: false }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: openai } ]
    retry: { maxAttempts: 3, maxWaitHintMs: 500, backoff: { baseMs: 50, capMs: 200 } }
`;

  it("a 429 whose retry-after outlasts maxWaitHintMs: answered once with x-should-retry true, the SDK comes back after the hold-off, declared, and is answered (2 upstream requests)", async () => {
    const mock = await startMockProvider({ apiKey: TEST_KEY });
    const url = await gatewayFrom(yaml, { OPENAI_BASE_URL: `${mock.url}/v1` });
    await mockControl(mock, 'POST', 'brownout', { mode: '429', durationMs: 1500 });
    const started = Date.now();
    const { data, response } = await client(url, { maxRetries: 2 }).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(data.choices[0]!.message.content).toBeTruthy();
    expect(response.status).toBe(200);

    const seen = await mockRequests(mock);
    expect(seen.map((r) => r.status)).toEqual([429, 200]);
    // The mock asked for 2 s (its brownout's seconds left, rounded up); the SDK waited at least that before its retry.
    expect(seen[1]!.receivedAt - seen[0]!.receivedAt).toBeGreaterThanOrEqual(1950);
    expect(Date.now() - started).toBeLessThan(6000);
    // The second request is the SDK's own retry (it says so), not a gateway retry.
    expect(seen[1]!.headers['x-stainless-retry-count']).toBe('1');
    expect(seen[1]!.headers['x-retry-attempt']).toBeUndefined();

    const m = await scrapeMetrics(url);
    expect(metric(m, 'stormgate_client_retries_total', { route: 'chat', how: 'declared' })).toBe(1);
    expect(metric(m, 'stormgate_requests_total', { route: 'chat', outcome: 'success' })).toBe(1);
    expect(metric(m, 'stormgate_requests_total', { route: 'chat', outcome: 'upstream_error' }) + metric(m, 'stormgate_requests_total', { route: 'chat', outcome: 'unavailable' })).toBe(1);
    expect(metric(m, 'stormgate_holds_started_total', { kind: 'hold_off', reason: 'status_429' })).toBe(1);
    expect(metric(m, 'stormgate_retry_count_total', { route: 'chat' })).toBe(0);
  });

  it('a lasting 503: the provider gets the route\'s 3 attempts, the SDK (maxRetries 4) none of its own: one SDK request, x-should-retry false', async () => {
    const mock = await startMockProvider({ apiKey: TEST_KEY, faults: { errors: [{ status: 503 }] } });
    const url = await gatewayFrom(yaml, { OPENAI_BASE_URL: `${mock.url}/v1` });
    const err = await sdkError(client(url, { maxRetries: 4 }).chat.completions.create({ model: 'gpt-4o', messages }));
    expect(err.status).toBe(503);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.headers?.get('x-stormgate-attempts')).toBe('3');
    const stats = (await mockControl(mock, 'GET', 'stats')) as { total: number };
    expect(stats.total).toBe(3);
    const seen = await mockRequests(mock);
    expect(seen.map((r) => r.headers['x-stainless-retry-count'])).toEqual(['0', '0', '0']);
    expect(seen.map((r) => r.headers['x-retry-attempt'])).toEqual([undefined, '1', '2']);
    const m = await scrapeMetrics(url);
    expect(metric(m, 'stormgate_client_retries_total')).toBe(0);
    expect(metric(m, 'stormgate_retry_count_total', { route: 'chat', reason: 'status_503' })).toBe(2);
  });
});

describe("the Anthropic SDK's retries on top of the gateway's, on /v1/messages", () => {
  it('a 429 whose retry-after outlasts maxWaitHintMs: the SDK (maxRetries 2) is invited back once and answered after the hold-off (2 upstream requests)', async () => {
    const mock = await startMockProvider({ apiKey: TEST_KEY });
    const url = await gatewayFrom(
      `
providers:
  claude: { family: anthropic, baseUrl: "\${ANTHROPIC_BASE_URL}", apiKey: "\${OPENAI_API_KEY}", breaker: false }
routes:
  - name: messages
    match: { path: /v1/messages }
    targets: [ { provider: claude } ]
    retry: { maxAttempts: 3, maxWaitHintMs: 500 }
`,
      { ANTHROPIC_BASE_URL: mock.url },
    );
    await mockControl(mock, 'POST', 'brownout', { mode: '429', durationMs: 1500 });
    const sdk = new Anthropic({ baseURL: url, apiKey: 'unused-by-the-gateway', maxRetries: 2 });
    const message = await sdk.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 64, messages });
    expect(message.content.length).toBeGreaterThan(0);
    const seen = await mockRequests(mock);
    expect(seen.map((r) => r.status)).toEqual([429, 200]);
    expect(seen[1]!.receivedAt - seen[0]!.receivedAt).toBeGreaterThanOrEqual(1950);
    const m = await scrapeMetrics(url);
    expect(metric(m, 'stormgate_client_retries_total', { route: 'messages', how: 'declared' })).toBe(1);
  });
});

describe('the README metrics after a scripted run', () => {
  it("request_duration_seconds by attempt (first, retry), ttft, tokens, attempts, retries and stream ends agree with what the SDK and the mock saw", async () => {
    const mock = await startMockProvider({ apiKey: TEST_KEY });
    const url = await gatewayFrom(
      `
server: { host: 127.0.0.1, port: 0 }
providers:
  openai: { family: openai, baseUrl: "\${OPENAI_BASE_URL}", apiKey: "\${OPENAI_API_KEY}" }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: openai } ]
    retry: { maxAttempts: 3, backoff: { baseMs: 50, capMs: 200 } }
`,
      { OPENAI_BASE_URL: `${mock.url}/v1` },
    );
    const sdk = client(url, { maxRetries: 0 });

    // 1: a stream with include_usage whose first attempt is refused 503 before any byte: retried, streamed once.
    await mockControl(mock, 'PUT', 'faults', { errors: [{ status: 503, firstAttemptsOnly: true, times: 1 }] });
    const stream = await sdk.chat.completions.create({ model: 'gpt-4o', messages, stream: true, stream_options: { include_usage: true } });
    let text = '';
    const usages: OpenAI.CompletionUsage[] = [];
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? '';
      if (chunk.usage) usages.push(chunk.usage);
    }
    expect(text).toBeTruthy();
    expect(usages).toHaveLength(1);

    // 2: a whole answer at the first attempt.
    await mockControl(mock, 'PUT', 'faults', {});
    const whole = await sdk.chat.completions.create({ model: 'gpt-4o', messages });
    const completion = usages[0]!.completion_tokens + whole.usage!.completion_tokens;
    const prompt = usages[0]!.prompt_tokens + whole.usage!.prompt_tokens;

    const seen = await mockRequests(mock);
    expect(seen.map((r) => r.status)).toEqual([503, 200, 200]);

    const m = await scrapeMetrics(url);
    const route = { route: 'chat' };
    expect(metric(m, 'stormgate_requests_total', { ...route, outcome: 'success' })).toBe(2);
    expect(metric(m, 'stormgate_request_duration_seconds_count', { ...route, attempt: 'retry' })).toBe(1);
    expect(metric(m, 'stormgate_request_duration_seconds_count', { ...route, attempt: 'first' })).toBe(1);
    expect(metric(m, 'stormgate_ttft_seconds_count', route)).toBe(1);
    expect(metric(m, 'stormgate_upstream_attempts_total', { status_class: '5xx' })).toBe(1);
    expect(metric(m, 'stormgate_upstream_attempts_total', { status_class: '2xx' })).toBe(2);
    expect(metric(m, 'stormgate_upstream_attempts_total')).toBe(3);
    expect(metric(m, 'stormgate_retry_count_total', { ...route, reason: 'status_503' })).toBe(1);
    expect(metric(m, 'stormgate_retried_requests_total', { ...route, result: 'success' })).toBe(1);
    expect(metric(m, 'stormgate_retried_requests_total', { ...route, result: 'failure' })).toBe(0);
    expect(metric(m, 'stormgate_fallback_requests_total', route)).toBe(0);
    expect(metric(m, 'stormgate_stream_ends_total', { ...route, end: 'complete' })).toBe(1);
    expect(metric(m, 'stormgate_stream_ends_total', route)).toBe(1);
    expect(metric(m, 'stormgate_tokens_total', { ...route, kind: 'completion' })).toBe(completion);
    expect(metric(m, 'stormgate_tokens_total', { ...route, kind: 'prompt' })).toBe(prompt);
    expect(metric(m, 'stormgate_breaker_state')).toBe(0);
    // The retried one's duration includes its backoff; both are under the few seconds the run took.
    expect(metric(m, 'stormgate_request_duration_seconds_sum', route)).toBeLessThan(5);
  });
});

describe('a stream cut after its first byte', () => {
  it('raises in the SDK (never a clean end) with the text so far, and nothing is sent again by the gateway or the SDK', async () => {
    const mock = await startMockProvider({ apiKey: TEST_KEY, faults: { stream: { chunks: 6, cutAfterChunks: 2 } } });
    const url = await gatewayFrom(
      `
providers:
  openai: { family: openai, baseUrl: "\${OPENAI_BASE_URL}", apiKey: "\${OPENAI_API_KEY}" }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: openai } ]
    retry: { maxAttempts: 3, retryOn: [429, 500, 502, 503, 504, network, timeout] }
`,
      { OPENAI_BASE_URL: `${mock.url}/v1` },
    );
    const stream = await client(url, { maxRetries: 2 }).chat.completions.create({
      model: 'gpt-4o',
      messages,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    let finish: string | null | undefined;
    let raised: unknown;
    try {
      for await (const chunk of stream) {
        text += chunk.choices[0]?.delta.content ?? '';
        finish ??= chunk.choices[0]?.finish_reason;
      }
    } catch (err) {
      raised = err;
    }
    expect(raised, 'the SDK must raise a cut stream, not end it cleanly').toBeInstanceOf(Error);
    expect(text).not.toBe('');
    expect(finish ?? null).toBeNull();
    await sleep(300);
    const stats = (await mockControl(mock, 'GET', 'stats')) as { total: number };
    expect(stats.total).toBe(1);
    const m = await scrapeMetrics(url);
    expect(metric(m, 'stormgate_requests_total', { route: 'chat', outcome: 'stream_error' })).toBe(1);
    expect(metric(m, 'stormgate_stream_ends_total', { route: 'chat', end: 'cut' })).toBe(1);
    expect(metric(m, 'stormgate_retry_count_total')).toBe(0);
  });
});

describe("the SDK's per-request timeout shorter than the route's", () => {
  it('a slow first token at the primary: the backup streams before the SDK gives up, the primary attempt aborted, nothing sent twice', async () => {
    const primary = await startMockProvider({ apiKey: TEST_KEY, faults: { stream: { firstTokenDelayMs: 6000 } } });
    const backup = await startMockProvider({ apiKey: TEST_KEY });
    const url = await gatewayFrom(
      `
providers:
  openai: { family: openai, baseUrl: "\${OPENAI_BASE_URL}", apiKey: "\${OPENAI_API_KEY}", timeouts: { firstTokenMs: 800 } }
  backup: { family: openai, baseUrl: "\${BACKUP_BASE_URL}", apiKey: "\${OPENAI_API_KEY}" }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    timeoutMs: 30000
    targets: [ { provider: openai }, { provider: backup } ]
    retry: { maxAttempts: 3, retryOn: [429, 500, 502, 503, 504, network, timeout] }
`,
      { OPENAI_BASE_URL: `${primary.url}/v1`, BACKUP_BASE_URL: `${backup.url}/v1` },
    );
    const started = Date.now();
    const { data: stream, response } = await client(url, { maxRetries: 2 })
      .chat.completions.create({ model: 'gpt-4o', messages, stream: true }, { timeout: 3000 })
      .withResponse();
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
    expect(text).toBeTruthy();
    expect(Date.now() - started).toBeLessThan(3000);
    expect(response.headers.get('x-stormgate-fallback')).toBe('timeout');
    expect(response.headers.get('x-stormgate-target')).toMatch(/^backup/);
    await sleep(200);
    const p = await mockRequests(primary);
    const b = await mockRequests(backup);
    expect(p).toHaveLength(1);
    expect(p[0]!.aborted).toBe(true);
    expect(b).toHaveLength(1);
    expect(b[0]!.headers['x-stainless-timeout']).toBeUndefined();
  });
});

describe('embeddings with an array input, base64, through a retry', () => {
  it('decodes every vector in order, equal to the provider\'s own, and counts the prompt tokens once', async () => {
    const mock = await startMockProvider({ apiKey: TEST_KEY });
    const url = await gatewayFrom(
      `
providers:
  openai: { family: openai, baseUrl: "\${OPENAI_BASE_URL}", apiKey: "\${OPENAI_API_KEY}" }
routes:
  - name: embeddings
    match: { path: /v1/embeddings }
    targets: [ { provider: openai } ]
    retry: { maxAttempts: 3, backoff: { baseMs: 50, capMs: 200 } }
`,
      { OPENAI_BASE_URL: `${mock.url}/v1` },
    );
    const input = Array.from({ length: 12 }, (_, i) => `document number ${i}: ${'lorem ipsum '.repeat(i + 1)}`);
    const direct = await new OpenAI({ baseURL: `${mock.url}/v1`, apiKey: TEST_KEY, maxRetries: 0 }).embeddings.create({
      model: 'text-embedding-3-small',
      input,
      encoding_format: 'base64',
      dimensions: 64,
    });
    await mockControl(mock, 'POST', 'reset');
    await mockControl(mock, 'PUT', 'faults', { errors: [{ status: 503, firstAttemptsOnly: true, times: 1 }] });

    const { data, response } = await client(url, { maxRetries: 0 })
      .embeddings.create({ model: 'text-embedding-3-small', input, encoding_format: 'base64', dimensions: 64 })
      .withResponse();
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(data.data.map((d) => d.index)).toEqual(input.map((_, i) => i));
    // The SDK hands base64 back as it came when the caller asked for it; the caller decodes (float32, little-endian).
    expect(data.data.map((d) => d.embedding)).toEqual(direct.data.map((d) => d.embedding));
    for (const d of data.data) {
      const bytes = Buffer.from(d.embedding as unknown as string, 'base64');
      const floats = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
      expect(floats).toHaveLength(64);
      expect([...floats].every(Number.isFinite)).toBe(true);
    }
    const seen = await mockRequests(mock);
    expect(seen.map((r) => r.status)).toEqual([503, 200]);
    const m = await scrapeMetrics(url);
    expect(metric(m, 'stormgate_tokens_total', { route: 'embeddings', kind: 'prompt' })).toBe(data.usage.prompt_tokens);
    expect(metric(m, 'stormgate_tokens_total', { route: 'embeddings', kind: 'completion' })).toBe(0);
    expect(metric(m, 'stormgate_request_duration_seconds_count', { route: 'embeddings', attempt: 'retry' })).toBe(1);
  });
});

describe("a provider at capacity answering 429 with retry-after", () => {
  it('holds the target off for the second it asked: nothing reaches the mock meanwhile, and every call is answered', async () => {
    const mock = await startMockProvider({
      apiKey: TEST_KEY,
      faults: { capacity: 2, latencyMs: 400, capacityHeaders: { 'retry-after': '1' } },
    });
    const url = await gatewayFrom(
      `
providers:
  openai: { family: openai, baseUrl: "\${OPENAI_BASE_URL}", apiKey: "\${OPENAI_API_KEY}" }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: openai } ]
    retry: { maxAttempts: 4 }
`,
      { OPENAI_BASE_URL: `${mock.url}/v1` },
    );
    const sdk = client(url, { maxRetries: 0 });
    const answers = await Promise.all(Array.from({ length: 6 }, () => sdk.chat.completions.create({ model: 'gpt-4o', messages })));
    expect(answers.every((a) => a.choices[0]!.message.content)).toBe(true);

    const seen = await mockRequests(mock);
    const refused = seen.filter((r) => r.status === 429);
    expect(refused.length).toBeGreaterThan(0);
    const heldFrom = Math.min(...refused.map((r) => r.endedAt ?? r.receivedAt));
    // No retry went out while the hold-off was in force (the second the mock asked for, from its first 429); the
    // first tries of the burst may straggle in late (the SDK, the gateway and the mock share one event loop here).
    const early = seen.filter((r) => r.headers['x-retry-attempt'] !== undefined && r.receivedAt < heldFrom + 1000);
    expect(early.map((r) => ({ at: r.receivedAt - heldFrom, status: r.status, retry: r.headers['x-retry-attempt'] }))).toEqual([]);
    expect(seen.filter((r) => r.headers['x-retry-attempt'] !== undefined).length).toBeGreaterThan(0);
    const m = await scrapeMetrics(url);
    expect(metric(m, 'stormgate_holds_started_total', { kind: 'hold_off', reason: 'status_429' })).toBeGreaterThanOrEqual(1);
    expect(metric(m, 'stormgate_requests_total', { route: 'chat', outcome: 'success' })).toBe(6);
  });
});

describe('faults on one model of a route', () => {
  it("a 429 with retry-after for gpt-4o holds off gpt-4o alone: gpt-4o-mini on the same route and provider goes straight through", async () => {
    const mock = await startMockProvider({
      apiKey: TEST_KEY,
      faults: { models: { 'gpt-4o': { errors: [{ status: 429, headers: { 'retry-after': '5' } }] } } },
    });
    const url = await gatewayFrom(
      `
providers:
  openai: { family: openai, baseUrl: "\${OPENAI_BASE_URL}", apiKey: "\${OPENAI_API_KEY}" }
routes:
  - name: chat
    match: { path: /v1/chat/completions, models: ["gpt-4o*"] }
    targets: [ { provider: openai } ]
    retry: { maxAttempts: 3, maxWaitHintMs: 1000 }
`,
      { OPENAI_BASE_URL: `${mock.url}/v1` },
    );
    const sdk = client(url, { maxRetries: 0 });
    const err = await sdkError(sdk.chat.completions.create({ model: 'gpt-4o', messages }));
    expect(err.status).toBe(429);
    expect(err.headers?.get('x-should-retry')).toBe('true');
    expect(Number(err.headers?.get('retry-after-ms'))).toBeGreaterThanOrEqual(4500);

    const started = Date.now();
    const mini = await sdk.chat.completions.create({ model: 'gpt-4o-mini', messages }).withResponse();
    expect(mini.response.status).toBe(200);
    expect(Date.now() - started).toBeLessThan(1500);
    // gpt-4o is still held off: turned away at once, without going upstream.
    const again = await sdkError(sdk.chat.completions.create({ model: 'gpt-4o', messages }, { timeout: 2000 }));
    expect(again.status).toBe(429);
    const seen = await mockRequests(mock);
    expect(seen.map((r) => `${r.model} ${r.status}`)).toEqual(['gpt-4o 429', 'gpt-4o-mini 200']);
  });
});

describe('the Responses API through a retry and a failover within its family', () => {
  it('refuses at start-up, at its line, an Anthropic backup on /v1/responses (a fallback only within the API family)', () => {
    const yaml = `
providers:
  openai: { family: openai, baseUrl: "https://api.openai.com/v1", apiKey: "\${OPENAI_API_KEY}" }
  anthropic: { family: anthropic, baseUrl: "https://api.anthropic.com", apiKey: "\${ANTHROPIC_API_KEY}" }
routes:
  - name: responses
    match: { path: /v1/responses }
    targets:
      - { provider: openai }
      - { provider: anthropic, model: claude-sonnet-4-6 }
`;
    let refused: unknown;
    try {
      parseConfig(yaml, 'gw.yaml', { OPENAI_API_KEY: TEST_KEY, ANTHROPIC_API_KEY: 'claude-key' });
    } catch (err) {
      refused = err;
    }
    expect(refused).toBeInstanceOf(ConfigError);
    expect(String((refused as Error).message)).toMatch(/^gw\.yaml:10: routes\[0\]\.targets\[1\]: .*\/v1\/responses/);
  });

  it('streams the backup\'s response after the primary\'s 503s, its usage billed to the backup once', async () => {
    const primary = await startMockProvider({ apiKey: TEST_KEY, faults: { errors: [{ status: 503 }] } });
    const backup = await startMockProvider({ apiKey: TEST_KEY });
    const url = await gatewayFrom(
      `
providers:
  openai: { family: openai, baseUrl: "\${OPENAI_BASE_URL}", apiKey: "\${OPENAI_API_KEY}", breaker: false }
  backup: { family: openai, baseUrl: "\${BACKUP_BASE_URL}", apiKey: "\${OPENAI_API_KEY}" }
routes:
  - name: responses
    match: { path: /v1/responses }
    targets: [ { provider: openai }, { provider: backup } ]
    retry: { maxAttempts: 2, backoff: { baseMs: 50, capMs: 100 } }
`,
      { OPENAI_BASE_URL: `${primary.url}/v1`, BACKUP_BASE_URL: `${backup.url}/v1` },
    );
    const sdk = client(url, { maxRetries: 2 });
    const stream = sdk.responses.stream({ model: 'gpt-4.1', input: 'hello', store: false });
    const deltas: string[] = [];
    stream.on('response.output_text.delta', (e) => deltas.push(e.delta));
    const final = await stream.finalResponse();
    expect(final.status).toBe('completed');
    // The stream helper's final Response carries no output_text convenience field (openai 6.30): read the items.
    const finalText = final.output
      .flatMap((item) => (item.type === 'message' ? item.content : []))
      .map((c) => (c.type === 'output_text' ? c.text : ''))
      .join('');
    expect(finalText).toBe(deltas.join(''));
    expect(finalText).toBeTruthy();

    const whole = await sdk.responses.create({ model: 'gpt-4.1', input: 'hello again', store: false }).withResponse();
    expect(whole.response.headers.get('x-stormgate-fallback')).toBeTruthy();
    expect(whole.data.output_text).toBeTruthy();

    expect((await mockRequests(primary)).length).toBe(4);
    expect((await mockRequests(backup)).map((r) => r.status)).toEqual([200, 200]);
    const m = await scrapeMetrics(url);
    const billed = (kind: string) => metric(m, 'stormgate_tokens_total', { route: 'responses', kind });
    expect(billed('completion')).toBe(final.usage!.output_tokens + whole.data.usage!.output_tokens);
    expect(billed('prompt')).toBe(final.usage!.input_tokens + whole.data.usage!.input_tokens);
    expect(metric(m, 'stormgate_tokens_total', { route: 'responses', target: 'openai/gpt-4.1' })).toBe(0);
    expect(metric(m, 'stormgate_fallback_requests_total', { route: 'responses' })).toBe(2);
    expect(metric(m, 'stormgate_ttft_seconds_count', { route: 'responses' })).toBe(1);
  });
});

describe("a fleet of SDK agents invited back by the gateway", () => {
  it('30 agents in a 429 brownout whose hint outlasts maxWaitHintMs: each comes back once, after the hold-off, spread out, and all are answered', async () => {
    const mock = await startMockProvider({ apiKey: TEST_KEY });
    const url = await gatewayFrom(
      `
providers:
  openai: { family: openai, baseUrl: "\${OPENAI_BASE_URL}", apiKey: "\${OPENAI_API_KEY}" }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: openai } ]
    retry: { maxAttempts: 3, maxWaitHintMs: 500 }
    park: false
`,
      { OPENAI_BASE_URL: `${mock.url}/v1` },
    );
    await mockControl(mock, 'POST', 'brownout', { mode: '429', durationMs: 1800 });
    const sdk = client(url, { maxRetries: 2 });
    const results = await Promise.allSettled(
      Array.from({ length: 30 }, (_, i) => sdk.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: `agent ${i}` }] })),
    );
    expect(results.filter((r) => r.status === 'rejected').map((r) => String((r as PromiseRejectedResult).reason))).toEqual([]);

    const seen = await mockRequests(mock);
    const refused = seen.filter((r) => r.status === 429);
    const answered = seen.filter((r) => r.status === 200);
    expect(answered).toHaveLength(30);
    // No request is sent upstream more than twice (its refusal and its answer).
    expect(seen.length).toBeLessThanOrEqual(60);
    const firstRefusal = Math.min(...refused.map((r) => r.endedAt ?? r.receivedAt));
    // Every comeback (x-stainless-retry-count above 0) waited the hold-off out (the mock asked for 2 s) and was
    // answered; what the provider refused were first tries only, sent before the gateway had its 429 (the SDKs, the
    // gateway and the mock share one event loop here, so stragglers of the first wave can arrive late).
    const comebacks = seen.filter((r) => Number(r.headers['x-stainless-retry-count']) > 0);
    expect(comebacks.map((r) => r.status).every((s) => s === 200)).toBe(true);
    expect(comebacks.filter((r) => r.receivedAt < firstRefusal + 1950).map((r) => r.receivedAt - firstRefusal)).toEqual([]);
    expect(refused.every((r) => r.headers['x-stainless-retry-count'] === '0')).toBe(true);
    // The comebacks are spread, not one burst within a few milliseconds.
    const back = answered.map((r) => r.receivedAt).sort((a, b) => a - b);
    expect(back.at(-1)! - back[0]!).toBeGreaterThan(100);
    const m = await scrapeMetrics(url);
    // Each agent came back once; a few may come back twice: those told the hold-off's end before a 429 answered to a
    // request already in flight extended it (reported as a design question), turned away again without going upstream.
    const declared = metric(m, 'stormgate_client_retries_total', { route: 'chat', how: 'declared' });
    expect(declared).toBeGreaterThanOrEqual(30);
    expect(declared).toBeLessThanOrEqual(30 + refused.length);
    expect(metric(m, 'stormgate_requests_total', { route: 'chat', outcome: 'success' })).toBe(30);
  });
});

describe('the retry and fallback panels after a scripted run of four calls', () => {
  it('first-try, retried, failed-over and failed calls: the ratios, counters and histograms the README names agree with the mocks', async () => {
    const down = { errors: [{ status: 503 }] };
    const primary = await startMockProvider({
      apiKey: TEST_KEY,
      faults: { models: { 'm-retry': { errors: [{ status: 503, firstAttemptsOnly: true }] }, 'm-over': down, 'm-fail': down } },
    });
    const backup = await startMockProvider({ apiKey: TEST_KEY, faults: { models: { 'm-fail': down } } });
    const url = await gatewayFrom(
      `
providers:
  primary: { family: openai, baseUrl: "\${PRIMARY_URL}", apiKey: "\${OPENAI_API_KEY}", breaker: false }
  backup: { family: openai, baseUrl: "\${BACKUP_URL}", apiKey: "\${OPENAI_API_KEY}", breaker: false }
routes:
  - name: chat
    match: { path: /v1/chat/completions, models: ["m-*"] }
    targets: [ { provider: primary }, { provider: backup } ]
    retry: { maxAttempts: 2, backoff: { baseMs: 20, capMs: 50 } }
    park: false
`,
      { PRIMARY_URL: `${primary.url}/v1`, BACKUP_URL: `${backup.url}/v1` },
    );
    const sdk = client(url, { maxRetries: 2 });
    for (const model of ['m-ok', 'm-retry', 'm-over']) {
      const { response } = await sdk.chat.completions.create({ model, messages }).withResponse();
      expect(response.status, model).toBe(200);
    }
    const err = await sdkError(sdk.chat.completions.create({ model: 'm-fail', messages }));
    expect(err.status).toBe(503);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.headers?.get('x-stormgate-attempts')).toBe('4');

    const p = await mockRequests(primary);
    const b = await mockRequests(backup);
    expect(p.map((r) => `${r.model} ${r.status}`)).toEqual(['m-ok 200', 'm-retry 503', 'm-retry 200', 'm-over 503', 'm-over 503', 'm-fail 503', 'm-fail 503']);
    expect(b.map((r) => `${r.model} ${r.status}`)).toEqual(['m-over 200', 'm-fail 503', 'm-fail 503']);

    const m = await scrapeMetrics(url);
    const route = { route: 'chat' };
    expect(metric(m, 'stormgate_requests_total', { ...route, outcome: 'success' })).toBe(3);
    expect(metric(m, 'stormgate_requests_total', { ...route, outcome: 'upstream_error' })).toBe(1);
    expect(metric(m, 'stormgate_retried_requests_total', { ...route, result: 'success' })).toBe(2);
    expect(metric(m, 'stormgate_retried_requests_total', { ...route, result: 'failure' })).toBe(1);
    expect(metric(m, 'stormgate_retry_success_rate', route)).toBeCloseTo(2 / 3, 5);
    expect(metric(m, 'stormgate_fallback_requests_total', route)).toBe(1);
    expect(metric(m, 'stormgate_fallback_rate', route)).toBeCloseTo(1 / 4, 5);
    expect(metric(m, 'stormgate_fallbacks_total', { ...route, reason: 'retries_exhausted' })).toBe(2);
    expect(metric(m, 'stormgate_fallbacks_total', route)).toBe(2);
    expect(metric(m, 'stormgate_retry_count_total', { ...route, reason: 'status_503' })).toBe(4);
    expect(metric(m, 'stormgate_retry_count_total', route)).toBe(4);
    expect(metric(m, 'stormgate_upstream_attempts_total', { status_class: '5xx' })).toBe(7);
    expect(metric(m, 'stormgate_upstream_attempts_total', { status_class: '2xx' })).toBe(3);
    expect(metric(m, 'stormgate_request_duration_seconds_count', { ...route, attempt: 'first' })).toBe(1);
    expect(metric(m, 'stormgate_request_duration_seconds_count', { ...route, attempt: 'retry' })).toBe(3);
    expect(metric(m, 'stormgate_client_retries_total')).toBe(0);
    expect(metric(m, 'stormgate_retry_budget_exhausted_total')).toBe(0);
  });
});

describe('per-model breaker overrides for model names with dots and slashes (OpenRouter style)', () => {
  it('opens the breaker of the model its override names after one failure, while its sibling keeps the provider default', async () => {
    const down = { errors: [{ status: 503 }] };
    const primary = await startMockProvider({ apiKey: TEST_KEY, faults: { models: { 'openai/gpt-4.1': down, 'openai/gpt-4.1-mini': down } } });
    const backup = await startMockProvider({ apiKey: TEST_KEY });
    const url = await gatewayFrom(
      `
providers:
  router:
    family: openai
    baseUrl: "\${PRIMARY_URL}"
    apiKey: "\${OPENAI_API_KEY}"
    breaker:
      consecutiveFailures: 5
      openS: 30
      models:
        "openai/gpt-4.1": { consecutiveFailures: 1 }
  backup: { family: openai, baseUrl: "\${BACKUP_URL}", apiKey: "\${OPENAI_API_KEY}", breaker: false }
routes:
  - name: chat
    match: { path: /v1/chat/completions, models: ["openai/*"] }
    targets: [ { provider: router }, { provider: backup } ]
    retry: { maxAttempts: 1 }
    park: false
`,
      { PRIMARY_URL: `${primary.url}/v1`, BACKUP_URL: `${backup.url}/v1` },
    );
    const sdk = client(url, { maxRetries: 0 });
    const fallbacks: Array<string | null> = [];
    for (const model of ['openai/gpt-4.1', 'openai/gpt-4.1', 'openai/gpt-4.1-mini', 'openai/gpt-4.1-mini']) {
      const { response } = await sdk.chat.completions.create({ model, messages }).withResponse();
      fallbacks.push(response.headers.get('x-stormgate-fallback'));
    }
    expect(fallbacks).toEqual(['retries_exhausted', 'breaker_open', 'retries_exhausted', 'retries_exhausted']);
    expect((await mockRequests(primary)).map((r) => r.model)).toEqual(['openai/gpt-4.1', 'openai/gpt-4.1-mini', 'openai/gpt-4.1-mini']);
    const m = await scrapeMetrics(url);
    expect(metric(m, 'stormgate_breaker_state', { target: 'router/openai/gpt-4.1' })).toBe(1);
    expect(metric(m, 'stormgate_breaker_state', { target: 'router/openai/gpt-4.1-mini' })).toBe(0);
  });
});
