// Third-party failure-scenario suite 40: an outside QA team's suite for LLM gateways whose CLIENT is the Anthropic SDK
// (`@anthropic-ai/sdk`) on /v1/messages, written from the README alone ("Failover and API families" with "Anthropic
// clients (/v1/messages)", "Retries" and its wait hints, "Deadlines and timeouts", "Streaming", "What the client sees",
// "Errors", "Retry budget, circuit breaker, hold-offs, parking" with "Shared state") and driven over real HTTP on
// 127.0.0.1. Upstreams are the bundled mock (two Anthropic accounts) or the suite's own node:http Anthropic fake where
// the mock cannot produce the fault (a 400 of Anthropic's, stop sequences, prompt-cache usage, reset headers, a hang).
// A fleet of two gateway instances shares a real redis-server the suite starts on a free port.
// What is asserted is what an agent on the Anthropic SDK sees: the Message and its fields, the SDK's error classes and
// `requestID`, how many HTTP requests the SDK sent (its own retries counted through its `fetch`), and what each upstream
// received.
// The brief asked for the reverse of the usual failover (an Anthropic client with an OpenAI-family backup). The README
// says that is refused at start-up ("Only `anthropic` targets serve `/v1/messages`"): the refusal is tested, and the
// failover itself is left as a skipped test describing the design question.
// Found here: no gateway bug (30 scenarios pass, three runs in a row). Noted for the maintainers: the SDK's beta
// surface (`client.beta.messages`, POST /v1/messages?beta=true, which Claude Code uses) is served by the /v1/messages
// route, though the README does not say so; the test pins it.
import type { IncomingHttpHeaders, ServerResponse } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import Anthropic from '@anthropic-ai/sdk';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import type { MockServer } from '../src/mock/server.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { scrapeMetrics, useExtraMocks, useGateways } from './helpers/stack.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();
const startProvider = useFakeProviders();
const redis = useRedisServer();

const BACKUP_MODEL = 'claude-haiku-4-5';
const ask = (content: string) => ({ model: 'claude-sonnet-4-6', max_tokens: 256, messages: [{ role: 'user' as const, content }] });

interface Opts {
  primary: string;
  backup?: string;
  primaryExtra?: string;
  backupExtra?: string;
  retry?: string;
  routeExtra?: string;
  top?: string;
}

/** The README's /v1/messages route: two Anthropic accounts (the backup on another model), or the primary alone. */
function yaml(o: Opts): string {
  return `
server: { host: 127.0.0.1, port: 0, logLevel: info }
${o.top ?? ''}
providers:
  primary: { family: anthropic, baseUrl: "${o.primary}", apiKey: sk-ant-primary-0123456789, breaker: false${o.primaryExtra ? `, ${o.primaryExtra}` : ''} }
${o.backup ? `  backup: { family: anthropic, baseUrl: "${o.backup}", apiKey: sk-ant-backup-0123456789, breaker: false${o.backupExtra ? `, ${o.backupExtra}` : ''} }` : ''}
routes:
  - name: claude
    match: { path: /v1/messages, models: ["claude-*"] }
    targets: [ { provider: primary }${o.backup ? `, { provider: backup, model: ${BACKUP_MODEL} }` : ''} ]
    retry: ${o.retry ?? '{ maxAttempts: 2, backoff: { baseMs: 10, capMs: 20 } }'}
    budget: { ratio: 10, minRetriesPerSecond: 100 }
    park: false
${o.routeExtra ? `    ${o.routeExtra}\n` : ''}`;
}

async function gateway(o: Opts, logs: string[] = []): Promise<string> {
  return startGateway(parseConfig(yaml(o), 'suite40.yaml', {}), { logs });
}

/** An Anthropic SDK client of the gateway whose HTTP requests (its own retries included) are counted. */
function claude(url: string, o: { maxRetries?: number; timeout?: number; counter?: { requests: number }; headers?: Record<string, string> } = {}): Anthropic {
  return new Anthropic({
    baseURL: url,
    apiKey: 'sk-ant-client-not-a-provider-key',
    maxRetries: o.maxRetries ?? 0,
    ...(o.timeout !== undefined ? { timeout: o.timeout } : {}),
    logLevel: 'off',
    defaultHeaders: o.headers ?? {},
    fetch: async (u: string | URL | Request, init?: RequestInit) => {
      if (o.counter) o.counter.requests++;
      return fetch(u, init);
    },
  });
}

// ---- the suite's own Anthropic upstream -------------------------------------------------------------------------

interface Hit {
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- a request body is whatever JSON the gateway sent
  body: any;
  headers: IncomingHttpHeaders;
  at: number;
}
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- as above
type Reply = (res: ServerResponse, n: number, body: any) => void | Promise<void>;

/** A node:http server speaking Anthropic's Messages API as `reply` says, recording what it was sent. */
async function fakeAnthropic(reply: Reply): Promise<{ origin: string; hits: Hit[] }> {
  const hits: Hit[] = [];
  const p = await startProvider((req, res) => {
    let raw = '';
    req.on('data', (d: Buffer) => (raw += d.toString()));
    req.on('end', () => {
      const body = raw === '' ? {} : (JSON.parse(raw) as unknown);
      hits.push({ body, headers: req.headers, at: Date.now() });
      void reply(res, hits.length, body);
    });
  });
  return { origin: p.origin, hits };
}

const json = (res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}) => {
  res.writeHead(status, { 'content-type': 'application/json', ...headers });
  res.end(JSON.stringify(body));
};
const anthropicError = (type: string, message: string) => ({ type: 'error', error: { type, message } });
const overloaded = (res: ServerResponse, n: number, headers: Record<string, string> = {}) =>
  json(res, 529, anthropicError('overloaded_error', 'Overloaded'), { 'request-id': `req_primary_${n}`, ...headers });

/** The API error a call the test expects to fail raised (its class, status, type and request id are asserted). */
async function apiError(call: Promise<unknown>): Promise<InstanceType<typeof Anthropic.APIError>> {
  return (await call.then(
    () => undefined,
    (e: unknown) => e,
  )) as InstanceType<typeof Anthropic.APIError>;
}

/** Anthropic's 429 for a spent per-minute requests limit: its reset 30 s away, `extra` headers beside it. */
function requestsSpent(res: ServerResponse, extra: Record<string, string> = {}): void {
  json(res, 429, anthropicError('rate_limit_error', 'Number of requests has exceeded your per-minute rate limit'), {
    ...extra,
    'anthropic-ratelimit-requests-limit': '50',
    'anthropic-ratelimit-requests-remaining': '0',
    'anthropic-ratelimit-requests-reset': new Date(Date.now() + 30_000).toISOString(),
  });
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- a Message's fields, as the test writes them
const message = (extra: Record<string, any> = {}) => ({
  id: 'msg_01Backup',
  type: 'message',
  role: 'assistant',
  model: BACKUP_MODEL,
  content: [{ type: 'text', text: 'Your parcel is in Lyon.' }],
  stop_reason: 'end_turn',
  stop_sequence: null,
  usage: { input_tokens: 31, output_tokens: 7, cache_creation_input_tokens: 0, cache_read_input_tokens: 0 },
  ...extra,
});

const sse = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;

const weatherTool = {
  name: 'get_weather',
  description: 'Weather in a city',
  input_schema: { type: 'object' as const, properties: { city: { type: 'string' } }, required: ['city'] },
};

const requestsTo = (m: MockServer, path = '/v1/messages') => m.requests().filter((r) => r.path === path);

// ---- the reverse direction ---------------------------------------------------------------------------------------

describe('the reverse direction: an OpenAI-family backup behind /v1/messages', () => {
  it('is refused at start-up, naming the target and its family, rather than sending it a body it cannot read', () => {
    const text = `
providers:
  claude: { family: anthropic, baseUrl: "http://127.0.0.1:9", apiKey: sk-ant-0123456789 }
  gpt: { family: openai, baseUrl: "http://127.0.0.1:9/v1", apiKey: sk-0123456789 }
routes:
  - name: claude
    match: { path: /v1/messages }
    targets: [ { provider: claude }, { provider: gpt, model: gpt-4o } ]
`;
    expect(() => parseConfig(text, 'reverse.yaml', {})).toThrow(/\/v1\/messages.*anthropic targets only.*"gpt" is openai/s);
  });

  // Design question, not built: an agent on the Anthropic SDK whose Claude account is down cannot be failed over to an
  // OpenAI-family backup (chat completions translated back into Messages, stream and not, tools included). The README
  // refuses such a config at start-up; a gateway that offers "failover to a backup provider incl. the other API
  // family" might be expected to serve this direction too. Left for the maintainers.
  it.skip('fails an Anthropic SDK call over from a 529 overloaded Claude to an OpenAI-family backup, translated back into a Message', () => {});
});

// ---- failover between two Anthropic accounts, seen by the Anthropic SDK -----------------------------------------

describe('Anthropic SDK on /v1/messages: the primary overloaded, the backup account answers', () => {
  it('a whole Message from the backup after the primary\'s 529s: its model, text, stop_reason and usage, one SDK request', async () => {
    const primary = await startMock();
    const backup = await startMock();
    const url = await gateway({ primary: primary.url, backup: backup.url });
    primary.brownout('529', 60_000);
    const counter = { requests: 0 };
    const { data: msg, response, request_id: requestId } = await claude(url, { maxRetries: 2, counter }).messages.create(ask('Where is my parcel?')).withResponse();
    expect(counter.requests).toBe(1);
    expect(response.headers.get('x-stormgate-target')).toBe(`backup/${BACKUP_MODEL}`);
    expect(response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(response.headers.get('x-stormgate-attempts')).toBe('3');
    expect(msg.type).toBe('message');
    expect(msg.role).toBe('assistant');
    expect(msg.model).toBe(BACKUP_MODEL);
    expect(msg.content).toEqual([expect.objectContaining({ type: 'text', text: 'Mock answer to: Where is my parcel?' })]);
    expect(msg.stop_reason).toBe('end_turn');
    expect(msg.usage.input_tokens).toBeGreaterThan(0);
    expect(msg.usage.output_tokens).toBeGreaterThan(0);
    // The SDK's request id is the answering account's.
    const answered = requestsTo(backup);
    expect(answered).toHaveLength(1);
    expect(requestId).toBe(answered[0]!.requestId);
    expect(answered[0]!.model).toBe(BACKUP_MODEL);
    expect(answered[0]!.headers['x-api-key']).toBe('sk-ant-backup-0123456789');
    expect(requestsTo(primary).map((r) => r.status)).toEqual([529, 529]);
    expect(requestsTo(primary).every((r) => r.headers['x-api-key'] === 'sk-ant-primary-0123456789')).toBe(true);
  });

  it('a stream from the backup that hits max_tokens: stop_reason max_tokens, the text the deltas carried, usage within the cap', async () => {
    const primary = await startMock();
    const backup = await startMock();
    const url = await gateway({ primary: primary.url, backup: backup.url });
    primary.brownout('529', 60_000);
    const counter = { requests: 0 };
    const stream = claude(url, { maxRetries: 2, counter }).messages.stream({
      ...ask('Tell me a long story about a parcel that travelled across the whole of Europe by train and by boat'),
      max_tokens: 4,
    });
    let deltas = '';
    stream.on('text', (t) => (deltas += t));
    const final = await stream.finalMessage();
    expect(counter.requests).toBe(1);
    expect(final.stop_reason).toBe('max_tokens');
    expect(final.model).toBe(BACKUP_MODEL);
    const text = final.content.map((b) => (b.type === 'text' ? b.text : '')).join('');
    expect(text).toBe(deltas);
    expect(text.length).toBeGreaterThan(0);
    expect(final.usage.output_tokens).toBeGreaterThan(0);
    expect(final.usage.output_tokens).toBeLessThanOrEqual(4);
    expect(requestsTo(backup)).toHaveLength(1);
    expect(requestsTo(backup)[0]!.stream).toBe(true);
  });

  it('the system prompt, stop sequences, tools and metadata reach the backup as written (only the model is the target\'s), and its stop_sequence reaches the SDK', async () => {
    const primary = await fakeAnthropic((res, n) => overloaded(res, n));
    const backup = await fakeAnthropic((res) =>
      json(res, 200, message({ content: [{ type: 'text', text: 'Step 1: open the box.' }], stop_reason: 'stop_sequence', stop_sequence: '###' }), { 'request-id': 'req_backup_1' }),
    );
    const url = await gateway({ primary: primary.origin, backup: backup.origin });
    const body = {
      model: 'claude-sonnet-4-6',
      max_tokens: 300,
      system: [
        { type: 'text' as const, text: 'You are a courier support agent.' },
        { type: 'text' as const, text: 'Answer in numbered steps.', cache_control: { type: 'ephemeral' as const } },
      ],
      stop_sequences: ['###', 'END'],
      temperature: 0.2,
      metadata: { user_id: 'c0ffee00-1234-4321-abcd-0123456789ab' },
      tools: [weatherTool],
      tool_choice: { type: 'auto' as const },
      messages: [{ role: 'user' as const, content: 'How do I return a parcel?' }],
    };
    const msg = await claude(url).messages.create(body);
    expect(msg.stop_reason).toBe('stop_sequence');
    expect(msg.stop_sequence).toBe('###');
    expect(msg.content).toEqual([{ type: 'text', text: 'Step 1: open the box.' }]);
    expect(msg._request_id).toBe('req_backup_1');
    expect(primary.hits).toHaveLength(2);
    expect(backup.hits).toHaveLength(1);
    const sent = backup.hits[0]!.body;
    expect(sent).toEqual({ ...body, model: BACKUP_MODEL });
    expect(backup.hits[0]!.headers['x-api-key']).toBe('sk-ant-backup-0123456789');
    // The SDK's own anthropic-version goes on, to both accounts.
    expect(backup.hits[0]!.headers['anthropic-version']).toMatch(/^\d{4}-\d{2}-\d{2}$/);
    expect(backup.hits[0]!.headers['anthropic-version']).toBe(primary.hits[0]!.headers['anthropic-version']);
  });

  it('a streamed tool_use whose input arrives in pieces is assembled by the SDK; usage is the Message\'s, and /metrics bills the cache reads and writes as prompt tokens', async () => {
    const primary = await fakeAnthropic((res, n) => overloaded(res, n));
    const backup = await fakeAnthropic(async (res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream', 'request-id': 'req_backup_stream' });
      const start = message({ content: [], stop_reason: null, usage: { input_tokens: 20, cache_read_input_tokens: 100, cache_creation_input_tokens: 7, output_tokens: 1 } });
      res.write(sse('message_start', { message: start }));
      res.write(sse('content_block_start', { index: 0, content_block: { type: 'tool_use', id: 'toolu_01A', name: 'get_weather', input: {} } }));
      res.write(sse('ping', {}));
      await sleep(20);
      res.write(sse('content_block_delta', { index: 0, delta: { type: 'input_json_delta', partial_json: '{"ci' } }));
      await sleep(20);
      res.write(sse('content_block_delta', { index: 0, delta: { type: 'input_json_delta', partial_json: 'ty": "Paris"}' } }));
      res.write(sse('content_block_stop', { index: 0 }));
      res.write(sse('message_delta', { delta: { stop_reason: 'tool_use', stop_sequence: null }, usage: { output_tokens: 15 } }));
      res.write(sse('message_stop', {}));
      res.end();
    });
    const url = await gateway({ primary: primary.origin, backup: backup.origin });
    const stream = claude(url).messages.stream({ ...ask('Weather in Paris?'), tools: [weatherTool], tool_choice: { type: 'tool', name: 'get_weather' } });
    const final = await stream.finalMessage();
    expect(final.stop_reason).toBe('tool_use');
    expect(final.content).toEqual([{ type: 'tool_use', id: 'toolu_01A', name: 'get_weather', input: { city: 'Paris' } }]);
    expect(final.usage.output_tokens).toBe(15);
    expect(final.usage.input_tokens).toBe(20);
    expect(final.usage.cache_read_input_tokens).toBe(100);
    expect(backup.hits[0]!.body.tool_choice).toEqual({ type: 'tool', name: 'get_weather' });
    expect(backup.hits[0]!.body.stream).toBe(true);
    const samples = await scrapeMetrics(url);
    const tokens = (kind: string) =>
      samples.filter((s) => s.name === 'stormgate_tokens_total' && s.labels.route === 'claude' && s.labels.kind === kind && s.labels.target?.startsWith('backup')).reduce((a, s) => a + s.value, 0);
    expect(tokens('prompt')).toBe(127);
    expect(tokens('completion')).toBe(15);
  });

  it('a stream whose message_delta repeats the input and cache counts (cumulative, as Anthropic now sends them) is billed once, not twice', async () => {
    const primary = await fakeAnthropic(async (res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream', 'request-id': 'req_cumulative' });
      const usage = { input_tokens: 20, cache_read_input_tokens: 100, cache_creation_input_tokens: 7 };
      res.write(sse('message_start', { message: message({ content: [], stop_reason: null, usage: { ...usage, output_tokens: 1 } }) }));
      res.write(sse('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }));
      res.write(sse('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Your parcel ' } }));
      res.write(sse('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'is in Lyon.' } }));
      res.write(sse('content_block_stop', { index: 0 }));
      res.write(sse('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { ...usage, output_tokens: 9 } }));
      res.write(sse('message_stop', {}));
      res.end();
    });
    const url = await gateway({ primary: primary.origin });
    const final = await claude(url).messages.stream(ask('Where is my parcel?')).finalMessage();
    expect(final.content).toEqual([expect.objectContaining({ type: 'text', text: 'Your parcel is in Lyon.' })]);
    expect(final.usage).toMatchObject({ input_tokens: 20, cache_read_input_tokens: 100, cache_creation_input_tokens: 7, output_tokens: 9 });
    const samples = await scrapeMetrics(url);
    const tokens = (kind: string) => samples.filter((s) => s.name === 'stormgate_tokens_total' && s.labels.route === 'claude' && s.labels.kind === kind).reduce((a, s) => a + s.value, 0);
    expect(tokens('prompt')).toBe(127);
    expect(tokens('completion')).toBe(9);
  });

  it('a primary stream that sent message_start and a ping, then nothing: after firstTokenMs the backup\'s stream is the only one the SDK sees', async () => {
    const primary = await fakeAnthropic((res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream', 'request-id': 'req_primary_silent' });
      res.write(sse('message_start', { message: message({ id: 'msg_01Primary', model: 'claude-sonnet-4-6', content: [], stop_reason: null }) }));
      res.write(sse('ping', {}));
      // then silence: no first output
    });
    const backup = await fakeAnthropic(async (res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream', 'request-id': 'req_backup_stream' });
      res.write(sse('message_start', { message: message({ content: [], stop_reason: null, usage: { input_tokens: 12, output_tokens: 1 } }) }));
      res.write(sse('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }));
      res.write(sse('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Step 1: open the box.' } }));
      res.write(sse('content_block_stop', { index: 0 }));
      res.write(sse('message_delta', { delta: { stop_reason: 'stop_sequence', stop_sequence: '###' }, usage: { output_tokens: 6 } }));
      res.write(sse('message_stop', {}));
      res.end();
    });
    const url = await gateway({ primary: primary.origin, backup: backup.origin, primaryExtra: 'timeouts: { firstTokenMs: 1000 }' });
    const counter = { requests: 0 };
    const stream = claude(url, { maxRetries: 2, counter, timeout: 10_000 }).messages.stream({ ...ask('How do I return it?'), stop_sequences: ['###'] });
    const starts: string[] = [];
    stream.on('streamEvent', (e) => {
      if (e.type === 'message_start') starts.push(e.message.id);
    });
    const final = await stream.finalMessage();
    expect(starts).toEqual(['msg_01Backup']);
    expect(final.id).toBe('msg_01Backup');
    expect(final.stop_reason).toBe('stop_sequence');
    expect(final.stop_sequence).toBe('###');
    expect(final.content).toEqual([expect.objectContaining({ type: 'text', text: 'Step 1: open the box.' })]);
    expect(final.usage.output_tokens).toBe(6);
    const { response } = await stream.withResponse();
    expect(response.headers.get('x-stormgate-fallback')).toBe('timeout');
    expect(response.headers.get('request-id')).toBe('req_backup_stream');
    expect(counter.requests).toBe(1);
    expect(primary.hits).toHaveLength(1);
    expect(backup.hits[0]!.body.stop_sequences).toEqual(['###']);
  });

  it('the SDK\'s beta surface (client.beta.messages, POST /v1/messages?beta=true, as Claude Code sends) is the same route: failed over, the betas forwarded', async () => {
    const primary = await fakeAnthropic((res, n) => overloaded(res, n));
    const backup = await fakeAnthropic((res) => json(res, 200, message(), { 'request-id': 'req_backup_beta' }));
    const url = await gateway({ primary: primary.origin, backup: backup.origin });
    const counter = { requests: 0 };
    const { data: msg, response } = await claude(url, { maxRetries: 2, counter })
      .beta.messages.create({ ...ask('hi'), betas: ['token-efficient-tools-2025-02-19'] })
      .withResponse();
    expect(msg.content[0]).toMatchObject({ type: 'text', text: 'Your parcel is in Lyon.' });
    expect(response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(counter.requests).toBe(1);
    expect(primary.hits).toHaveLength(2);
    expect(backup.hits).toHaveLength(1);
    expect(backup.hits[0]!.headers['anthropic-beta']).toBe('token-efficient-tools-2025-02-19');
  });

  it('a server-side web search streamed before the text is the stream\'s first output: a pause longer than firstTokenMs after it fails nothing over, the search is not run twice', async () => {
    const primary = await fakeAnthropic(async (res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream', 'request-id': 'req_primary_search' });
      res.write(sse('message_start', { message: message({ model: 'claude-sonnet-4-6', content: [], stop_reason: null, usage: { input_tokens: 40, output_tokens: 1 } }) }));
      res.write(sse('content_block_start', { index: 0, content_block: { type: 'server_tool_use', id: 'srvtoolu_01', name: 'web_search', input: {} } }));
      res.write(sse('content_block_delta', { index: 0, delta: { type: 'input_json_delta', partial_json: '{"query": "parcel Lyon"}' } }));
      res.write(sse('content_block_stop', { index: 0 }));
      const results = [{ type: 'web_search_result', url: 'https://example.com/a', title: 'A', encrypted_content: 'abc', page_age: null }];
      res.write(sse('content_block_start', { index: 1, content_block: { type: 'web_search_tool_result', tool_use_id: 'srvtoolu_01', content: results } }));
      res.write(sse('content_block_stop', { index: 1 }));
      await sleep(1_500); // the model reads the results: longer than firstTokenMs, within idleMs
      res.write(sse('content_block_start', { index: 2, content_block: { type: 'text', text: '' } }));
      res.write(sse('content_block_delta', { index: 2, delta: { type: 'text_delta', text: 'It is in Lyon.' } }));
      res.write(sse('content_block_stop', { index: 2 }));
      res.write(sse('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 30 } }));
      res.write(sse('message_stop', {}));
      res.end();
    });
    const backup = await fakeAnthropic((res) => json(res, 200, message()));
    const url = await gateway({ primary: primary.origin, backup: backup.origin, primaryExtra: 'timeouts: { firstTokenMs: 1000, idleMs: 5000 }' });
    const final = await claude(url)
      .messages.stream({ ...ask('Where is my parcel?'), tools: [{ type: 'web_search_20250305', name: 'web_search', max_uses: 1 }] })
      .finalMessage();
    expect(final.content.map((b) => b.type)).toEqual(['server_tool_use', 'web_search_tool_result', 'text']);
    expect(final.content[0]).toMatchObject({ input: { query: 'parcel Lyon' } });
    expect(final.content[2]).toMatchObject({ text: 'It is in Lyon.' });
    expect(primary.hits).toHaveLength(1);
    expect(backup.hits).toHaveLength(0);
  });

  it('an overloaded_error event after the first output ends the stream with an error the SDK raises; nothing is sent again, to either account', async () => {
    const primary = await startMock();
    const backup = await startMock();
    const url = await gateway({ primary: primary.url, backup: backup.url });
    primary.setFaults({ stream: { errorAfterChunks: 2 } });
    const counter = { requests: 0 };
    const stream = claude(url, { maxRetries: 2, counter }).messages.stream(ask('Tell me about my parcel, in detail please'));
    let text = '';
    stream.on('text', (t) => (text += t));
    const err = await stream.finalMessage().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(String((err as Error).message)).toMatch(/overloaded/i);
    expect(text.length).toBeGreaterThan(0);
    expect(counter.requests).toBe(1);
    expect(requestsTo(primary)).toHaveLength(1);
    expect(requestsTo(backup)).toHaveLength(0);
  });
});

// ---- errors as the Anthropic SDK raises them ----------------------------------------------------------------------

describe('errors the Anthropic SDK raises, and how often it sends', () => {
  it('the primary\'s 400 invalid_request_error is the client\'s: BadRequestError with Anthropic\'s type, message and request-id, no failover, no SDK retry', async () => {
    const primary = await fakeAnthropic((res) =>
      json(res, 400, anthropicError('invalid_request_error', 'messages.0.content: Input should be a valid list'), { 'request-id': 'req_primary_400' }),
    );
    const backup = await fakeAnthropic((res) => json(res, 200, message()));
    const url = await gateway({ primary: primary.origin, backup: backup.origin });
    const counter = { requests: 0 };
    const err = await apiError(claude(url, { maxRetries: 2, counter }).messages.create(ask('hi')));
    expect(err).toBeInstanceOf(Anthropic.BadRequestError);
    expect(err.status).toBe(400);
    expect(err.type).toBe('invalid_request_error');
    expect(err.message).toContain('Input should be a valid list');
    expect(err.requestID).toBe('req_primary_400');
    expect(counter.requests).toBe(1);
    expect(primary.hits).toHaveLength(1);
    expect(backup.hits).toHaveLength(0);
  });

  it('the primary\'s 413 request_too_large: ContentTooLargeError as Anthropic sent it, not failed over, not retried by the SDK', async () => {
    const primary = await fakeAnthropic((res) => json(res, 413, anthropicError('request_too_large', 'Request exceeds the maximum allowed number of bytes.'), { 'request-id': 'req_primary_413' }));
    const backup = await fakeAnthropic((res) => json(res, 200, message()));
    const url = await gateway({ primary: primary.origin, backup: backup.origin });
    const counter = { requests: 0 };
    const err = await apiError(claude(url, { maxRetries: 2, counter }).messages.create(ask('hi')));
    expect(err).toBeInstanceOf(Anthropic.ContentTooLargeError);
    expect(err.type).toBe('request_too_large');
    expect(err.requestID).toBe('req_primary_413');
    expect(counter.requests).toBe(1);
    expect(primary.hits).toHaveLength(1);
    expect(backup.hits).toHaveLength(0);
  });

  it('Anthropic\'s own x-should-retry: true on its 529 is not passed on: after the gateway\'s retries the SDK is told not to retry, and sends once', async () => {
    const primary = await fakeAnthropic((res, n) => overloaded(res, n, { 'x-should-retry': 'true' }));
    const url = await gateway({ primary: primary.origin });
    const counter = { requests: 0 };
    const err = await apiError(claude(url, { maxRetries: 2, counter }).messages.create(ask('hi')));
    expect(err).toBeInstanceOf(Anthropic.OverloadedError);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.requestID).toBe('req_primary_2');
    expect(counter.requests).toBe(1);
    expect(primary.hits).toHaveLength(2);
  });

  it('an error object answered with a 200 is no Message: the backup\'s answer reaches the SDK, not an empty turn', async () => {
    const primary = await fakeAnthropic((res, n) => json(res, 200, anthropicError('overloaded_error', 'Overloaded'), { 'request-id': `req_primary_${n}` }));
    const backup = await fakeAnthropic((res) => json(res, 200, message(), { 'request-id': 'req_backup_ok' }));
    const url = await gateway({ primary: primary.origin, backup: backup.origin });
    const msg = await claude(url).messages.create(ask('hi'));
    expect(msg.type).toBe('message');
    expect(msg.content[0]).toMatchObject({ type: 'text', text: 'Your parcel is in Lyon.' });
    expect(msg._request_id).toBe('req_backup_ok');
    expect(backup.hits).toHaveLength(1);
  });

  it('a hold-off from a retry-after of 120 s: the agents it turns away get 429 provider_held_off with x-should-retry false, and the SDK does not come back', async () => {
    const primary = await fakeAnthropic((res, n) => overloaded(res, n, { 'retry-after': '120' }));
    const url = await gateway({ primary: primary.origin });
    await claude(url).messages.create(ask('first')).catch(() => undefined);
    expect(primary.hits).toHaveLength(1);
    const counter = { requests: 0 };
    const started = Date.now();
    const err = await apiError(claude(url, { maxRetries: 2, counter }).messages.create(ask('second')));
    expect(err).toBeInstanceOf(Anthropic.RateLimitError);
    expect((err.error as { error?: { code?: string } }).error?.code).toBe('provider_held_off');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(Number(err.headers?.get('retry-after'))).toBeGreaterThan(60);
    expect(err.requestID).toBeTruthy();
    expect(counter.requests).toBe(1);
    expect(Date.now() - started).toBeLessThan(2_000);
    expect(primary.hits).toHaveLength(1);
  });

  it('the gateway\'s own 404 for a model no route serves: NotFoundError in Anthropic\'s shape with the gateway\'s request id, nothing upstream', async () => {
    const primary = await startMock();
    const url = await gateway({ primary: primary.url });
    const counter = { requests: 0 };
    const err = await apiError(claude(url, { maxRetries: 2, counter }).messages.create({ ...ask('hi'), model: 'gpt-4o' }));
    expect(err).toBeInstanceOf(Anthropic.NotFoundError);
    expect(err.status).toBe(404);
    expect(err.type).toBe('not_found_error');
    expect((err.error as { type?: string }).type).toBe('error');
    expect(err.requestID).toBeTruthy();
    expect(err.requestID).toBe(err.headers?.get('x-request-id'));
    expect(counter.requests).toBe(1);
    expect(requestsTo(primary)).toHaveLength(0);
  });

  it('a lasting 529 on both accounts: OverloadedError once (x-should-retry false), though the SDK retries 529s by default', async () => {
    const primary = await startMock();
    const backup = await startMock();
    const url = await gateway({ primary: primary.url, backup: backup.url });
    primary.brownout('529', 60_000);
    backup.brownout('529', 60_000);
    const counter = { requests: 0 };
    const err = await apiError(claude(url, { maxRetries: 2, counter }).messages.create(ask('hi')));
    expect(err).toBeInstanceOf(Anthropic.OverloadedError);
    expect(err.status).toBe(529);
    expect(err.type).toBe('overloaded_error');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.requestID).toBe(requestsTo(backup).at(-1)!.requestId);
    expect(counter.requests).toBe(1);
    expect(requestsTo(primary)).toHaveLength(2);
    expect(requestsTo(backup)).toHaveLength(2);
  });

  it('x-should-retry: true is honoured: a 529 with retry-after 2 s holds the lone account off; the next SDK call gets 429 provider_held_off, waits and comes back once', async () => {
    const primary = await fakeAnthropic((res, n) => (n === 1 ? overloaded(res, n, { 'retry-after': '2' }) : json(res, 200, message(), { 'request-id': `req_ok_${n}` })));
    const url = await gateway({ primary: primary.origin, retry: '{ maxAttempts: 2, maxWaitHintMs: 500, backoff: { baseMs: 10, capMs: 20 } }' });
    // The first agent meets the 529 itself: its hint is longer than maxWaitHintMs, so it is answered with it.
    const first = await apiError(claude(url).messages.create(ask('first')));
    expect(first).toBeInstanceOf(Anthropic.OverloadedError);
    expect(Number(first.headers?.get('retry-after'))).toBeGreaterThanOrEqual(2);
    // The second comes during the hold-off: told to come back, it does, once, and is answered.
    const counter = { requests: 0 };
    const seen: Array<{ status: number; shouldRetry: string | null; type?: string }> = [];
    const started = Date.now();
    const client = new Anthropic({
      baseURL: url,
      apiKey: 'sk-ant-client-not-a-provider-key',
      maxRetries: 2,
      logLevel: 'off',
      fetch: async (u: string | URL | Request, init?: RequestInit) => {
        counter.requests++;
        const res = await fetch(u, init);
        const b = (await res.clone().json().catch(() => undefined)) as { error?: { type?: string } } | undefined;
        seen.push({ status: res.status, shouldRetry: res.headers.get('x-should-retry'), type: b?.error?.type });
        return res;
      },
    });
    const msg = await client.messages.create(ask('second'));
    expect(msg.content[0]).toMatchObject({ type: 'text', text: 'Your parcel is in Lyon.' });
    expect(counter.requests).toBe(2);
    expect(seen[0]).toEqual({ status: 429, shouldRetry: 'true', type: 'rate_limit_error' });
    expect(seen[1]!.status).toBe(200);
    expect(Date.now() - started).toBeGreaterThanOrEqual(1_000);
    expect(primary.hits).toHaveLength(2);
    expect(primary.hits[1]!.at - primary.hits[0]!.at).toBeGreaterThanOrEqual(1_900);
  });
});

// ---- wait hints in Anthropic's headers, and the SDK's own timeout ------------------------------------------------

describe("Anthropic's rate-limit headers and the SDK's timeout", () => {
  it('a 429 whose output-tokens limit is spent waits for that limit\'s reset (~1 s), not the requests reset a minute away, and the SDK sends once', async () => {
    const primary = await fakeAnthropic((res, n) => {
      if (n > 1) return json(res, 200, message());
      const at = (ms: number) => new Date(Date.now() + ms).toISOString();
      json(res, 429, anthropicError('rate_limit_error', 'This request would exceed your organization\'s rate limit of 8,000 output tokens per minute.'), {
        'anthropic-ratelimit-requests-limit': '50',
        'anthropic-ratelimit-requests-remaining': '49',
        'anthropic-ratelimit-requests-reset': at(60_000),
        'anthropic-ratelimit-output-tokens-limit': '8000',
        'anthropic-ratelimit-output-tokens-remaining': '0',
        'anthropic-ratelimit-output-tokens-reset': at(1_000),
      });
    });
    const url = await gateway({ primary: primary.origin });
    const counter = { requests: 0 };
    const started = Date.now();
    const msg = await claude(url, { maxRetries: 2, counter }).messages.create(ask('hi'));
    const took = Date.now() - started;
    expect(msg.content[0]).toMatchObject({ type: 'text' });
    expect(counter.requests).toBe(1);
    expect(primary.hits).toHaveLength(2);
    const waited = primary.hits[1]!.at - primary.hits[0]!.at;
    expect(waited).toBeGreaterThanOrEqual(800);
    expect(took).toBeLessThan(10_000);
    expect(primary.hits[1]!.headers['x-retry-attempt']).toBe('1');
    expect(primary.hits[1]!.headers['x-retry-reason']).toBe('status_429');
  });

  it('Anthropic\'s usual 429 (retry-after 1 beside a requests reset 30 s away): retry-after decides, the call is answered after about a second', async () => {
    const primary = await fakeAnthropic((res, n) =>
      n > 1
        ? json(res, 200, message())
        : requestsSpent(res, { 'retry-after': '1' }),
    );
    const url = await gateway({ primary: primary.origin });
    const counter = { requests: 0 };
    const msg = await claude(url, { maxRetries: 2, counter }).messages.create(ask('hi'));
    expect(msg.type).toBe('message');
    expect(counter.requests).toBe(1);
    expect(primary.hits).toHaveLength(2);
    const waited = primary.hits[1]!.at - primary.hits[0]!.at;
    expect(waited).toBeGreaterThanOrEqual(950);
    expect(waited).toBeLessThan(5_000);
  });

  it('a requests reset 30 s away on a lone account: RateLimitError with that wait as retry-after, and no hold-off (the next call goes upstream)', async () => {
    const primary = await fakeAnthropic((res, n) =>
      n > 1
        ? json(res, 200, message())
        : requestsSpent(res, { 'request-id': 'req_primary_429' }),
    );
    const url = await gateway({ primary: primary.origin });
    const err = await apiError(claude(url).messages.create(ask('hi')));
    expect(err).toBeInstanceOf(Anthropic.RateLimitError);
    expect(err.type).toBe('rate_limit_error');
    expect(err.requestID).toBe('req_primary_429');
    const retryAfter = Number(err.headers?.get('retry-after'));
    expect(retryAfter).toBeGreaterThanOrEqual(28);
    expect(retryAfter).toBeLessThanOrEqual(37);
    expect(primary.hits).toHaveLength(1);
    const msg = await claude(url).messages.create(ask('another agent'));
    expect(msg.type).toBe('message');
    expect(primary.hits).toHaveLength(2);
  });

  it('a requests reset past the SDK\'s timeout moves the call to the backup at once (wait_hint), answered well before the SDK would give up', async () => {
    const primary = await fakeAnthropic((res) =>
      requestsSpent(res),
    );
    const backup = await fakeAnthropic((res) => json(res, 200, message(), { 'request-id': 'req_backup_rl' }));
    const url = await gateway({ primary: primary.origin, backup: backup.origin });
    const counter = { requests: 0 };
    const started = Date.now();
    const { response, request_id: requestId } = await claude(url, { maxRetries: 2, counter, timeout: 8_000 }).messages.create(ask('hi')).withResponse();
    expect(Date.now() - started).toBeLessThan(3_000);
    expect(requestId).toBe('req_backup_rl');
    expect(response.headers.get('x-stormgate-fallback')).toBe('wait_hint');
    expect(counter.requests).toBe(1);
    expect(primary.hits).toHaveLength(1);
    expect(backup.hits).toHaveLength(1);
  });

  it('the SDK\'s client-wide timeout (sent as x-stainless-timeout) with a hung primary and responseMs 1 s: the backup answers in time, one SDK request', async () => {
    const primary = await fakeAnthropic(() => undefined); // accepts, never answers
    const backup = await fakeAnthropic((res) => json(res, 200, message(), { 'request-id': 'req_backup_t' }));
    const url = await gateway({ primary: primary.origin, backup: backup.origin, primaryExtra: 'timeouts: { responseMs: 1000 }' });
    const counter = { requests: 0 };
    const started = Date.now();
    const { response, request_id: requestId } = await claude(url, { maxRetries: 2, counter, timeout: 6_000 }).messages.create(ask('hi')).withResponse();
    const took = Date.now() - started;
    expect(requestId).toBe('req_backup_t');
    expect(response.headers.get('x-stormgate-fallback')).toBe('timeout');
    expect(counter.requests).toBe(1);
    expect(took).toBeGreaterThanOrEqual(900);
    expect(took).toBeLessThan(5_000);
    expect(primary.hits).toHaveLength(1);
    expect(primary.hits[0]!.headers['x-stainless-timeout']).toBeUndefined();
  });

  it('the SDK\'s per-request timeout with a hung lone account: GatewayTimeoutError (504 timeout_error) before the SDK gives up, sent once', async () => {
    const primary = await fakeAnthropic(() => undefined);
    const url = await gateway({ primary: primary.origin });
    const counter = { requests: 0 };
    const started = Date.now();
    const err = await apiError(claude(url, { maxRetries: 2, counter }).messages.create(ask('hi'), { timeout: 3_000 }));
    const took = Date.now() - started;
    expect(err).toBeInstanceOf(Anthropic.GatewayTimeoutError);
    expect(err.type).toBe('timeout_error');
    expect((err.error as { error?: { code?: string } }).error?.code).toBe('deadline_exceeded');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(counter.requests).toBe(1);
    expect(took).toBeLessThan(3_000);
    expect(took).toBeGreaterThanOrEqual(1_500);
  });
});

// ---- a fleet of two instances on one Redis ------------------------------------------------------------------------

describe('two gateway instances sharing a real Redis, seen by the Anthropic SDK', () => {
  const fleetYaml = (primary: string, backup: string) => ({
    primary,
    backup,
    top: `state: { redis: "${redis().url}", keyPrefix: suite40-${Date.now()}-${Math.random().toString(36).slice(2, 8)} }`,
    primaryExtra: 'breaker: { consecutiveFailures: 3, openS: 30 }',
    retry: '{ maxAttempts: 1 }',
  });

  it('a breaker opened by one instance\'s 529s sends the other instance\'s agents straight to the backup (breaker_open), the primary sent nothing by it', async () => {
    const primary = await startMock();
    const backup = await startMock();
    const o = fleetYaml(primary.url, backup.url);
    const text = yaml(o).replace('breaker: false, breaker:', 'breaker:');
    const a = await startGateway(parseConfig(text, 'a.yaml', {}));
    const b = await startGateway(parseConfig(text, 'b.yaml', {}));
    primary.brownout('529', 60_000);
    for (let i = 0; i < 4; i++) {
      const { response } = await claude(a).messages.create(ask(`agent a ${i}`)).withResponse();
      expect(response.headers.get('x-stormgate-target')).toBe(`backup/${BACKUP_MODEL}`);
      await sleep(300); // no success for 250 ms: a run of failures opens the breaker
    }
    const sentByA = requestsTo(primary).length;
    expect(sentByA).toBeGreaterThanOrEqual(3);
    const counter = { requests: 0 };
    for (let i = 0; i < 3; i++) {
      const { data: msg, response } = await claude(b, { maxRetries: 2, counter }).messages.create(ask(`agent b ${i}`)).withResponse();
      expect(msg.model).toBe(BACKUP_MODEL);
      expect(response.headers.get('x-stormgate-fallback')).toBe('breaker_open');
    }
    expect(counter.requests).toBe(3);
    expect(requestsTo(primary)).toHaveLength(sentByA);
  });

  it('a 529 with retry-after 3 s on one instance holds the primary off on the other: its agents go straight to the backup (held_off)', async () => {
    const primary = await fakeAnthropic((res, n) => overloaded(res, n, { 'retry-after': '3' }));
    const backup = await fakeAnthropic((res, n) => json(res, 200, message(), { 'request-id': `req_backup_${n}` }));
    const o = fleetYaml(primary.origin, backup.origin);
    const text = yaml({ ...o, primaryExtra: undefined });
    const a = await startGateway(parseConfig(text, 'a.yaml', {}));
    const b = await startGateway(parseConfig(text, 'b.yaml', {}));
    const first = await claude(a).messages.create(ask('agent a')).withResponse();
    expect(first.data.model).toBe(BACKUP_MODEL);
    expect(primary.hits).toHaveLength(1);
    await sleep(100); // the hold-off's push through pub/sub
    const counter = { requests: 0 };
    for (let i = 0; i < 3; i++) {
      const { response, request_id: requestId } = await claude(b, { maxRetries: 2, counter }).messages.create(ask(`agent b ${i}`)).withResponse();
      expect(requestId).toMatch(/^req_backup_/);
      expect(response.headers.get('x-stormgate-fallback')).toBe('held_off');
    }
    expect(counter.requests).toBe(3);
    expect(primary.hits).toHaveLength(1);
  });

  it('streams broken mid-answer on both instances fill one failure window: the breaker opens fleet-wide, and the next agent on either goes to the backup', async () => {
    const primary = await startMock();
    const backup = await startMock();
    const o = fleetYaml(primary.url, backup.url);
    const text = yaml({ ...o, primaryExtra: 'breaker: { minRequests: 4, failureRate: 0.5, windowS: 10, consecutiveFailures: 1000, openS: 30 }' }).replace('breaker: false, breaker:', 'breaker:');
    const a = await startGateway(parseConfig(text, 'a.yaml', {}));
    const b = await startGateway(parseConfig(text, 'b.yaml', {}));
    primary.setFaults({ stream: { errorAfterChunks: 1 } });
    for (const g of [a, b, a, b]) {
      const err = await claude(g).messages.stream(ask('Tell me about my parcel, in detail please')).finalMessage().catch((e: unknown) => e);
      expect(err).toBeInstanceOf(Anthropic.APIError);
      await sleep(120); // outcome counts reach Redis in batches at most 50 ms apart
    }
    expect(requestsTo(primary)).toHaveLength(4);
    for (const g of [a, b]) {
      let fallback: string | null = null;
      const until = Date.now() + 2_000;
      while (fallback !== 'breaker_open' && Date.now() < until) {
        const { response } = await claude(g).messages.create(ask('next agent')).withResponse();
        fallback = response.headers.get('x-stormgate-fallback');
        if (fallback !== 'breaker_open') await sleep(100);
      }
      expect(fallback).toBe('breaker_open');
    }
    // At most the one call that may have raced the opening reached the primary.
    expect(requestsTo(primary).length).toBeLessThanOrEqual(5);
  });

  it('an instance started after the fleet held the primary off sends it nothing: a streaming agent on it gets the backup\'s stream at once', async () => {
    const primary = await fakeAnthropic((res, n) => overloaded(res, n, { 'retry-after': '20' }));
    const backup = await startMock();
    const text = yaml({ ...fleetYaml(primary.origin, backup.url), primaryExtra: undefined });
    const a = await startGateway(parseConfig(text, 'a.yaml', {}));
    await claude(a).messages.create(ask('agent a')).withResponse();
    expect(primary.hits).toHaveLength(1);
    const late = await startGateway(parseConfig(text, 'late.yaml', {}));
    const stream = claude(late, { maxRetries: 2 }).messages.stream(ask('Where is my parcel?'));
    const final = await stream.finalMessage();
    const { response } = await stream.withResponse();
    expect(final.model).toBe(BACKUP_MODEL);
    expect(final.content).toEqual([expect.objectContaining({ type: 'text', text: 'Mock answer to: Where is my parcel?' })]);
    expect(response.headers.get('x-stormgate-fallback')).toBe('held_off');
    expect(primary.hits).toHaveLength(1);
  });

  it('the retry budget is the fleet\'s: once one instance spent the route\'s one retry, the other sends its call once and the SDK gets the 529 once', async () => {
    const primary = await startMock();
    const text = yaml({
      primary: primary.url,
      top: `state: { redis: "${redis().url}", keyPrefix: suite40-budget-${Date.now()} }`,
      retry: '{ maxAttempts: 3, backoff: { baseMs: 10, capMs: 20 } }',
    }).replace('budget: { ratio: 10, minRetriesPerSecond: 100 }', 'budget: { ratio: 0, minRetriesPerSecond: 0.1, windowS: 10 }');
    const logs: string[] = [];
    const a = await startGateway(parseConfig(text, 'a.yaml', {}));
    const b = await startGateway(parseConfig(text, 'b.yaml', {}), { logs });
    primary.brownout('529', 60_000);
    const errA = await claude(a).messages.create(ask('agent a')).catch((e: unknown) => e);
    expect(errA).toBeInstanceOf(Anthropic.OverloadedError);
    expect(requestsTo(primary)).toHaveLength(2); // the first attempt and the window's one retry
    const counter = { requests: 0 };
    const errB = await apiError(claude(b, { maxRetries: 2, counter }).messages.create(ask('agent b')));
    expect(errB).toBeInstanceOf(Anthropic.OverloadedError);
    expect(errB.headers?.get('x-should-retry')).toBe('false');
    expect(counter.requests).toBe(1);
    expect(requestsTo(primary)).toHaveLength(3);
    const until = Date.now() + 1_000;
    let line: Record<string, unknown> | undefined;
    while (!line && Date.now() < until) {
      line = logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.route === 'claude');
      if (!line) await sleep(10);
    }
    expect(line?.retriesStopped).toBe('budget');
  });

  it('with no backup, the other instance answers an open breaker 503 circuit_open with retry-after; sent once by the Anthropic SDK', async () => {
    const primary = await startMock();
    const o = { ...fleetYaml(primary.url, ''), backup: undefined };
    const text = yaml(o).replace('breaker: false, breaker:', 'breaker:');
    const a = await startGateway(parseConfig(text, 'a.yaml', {}));
    const b = await startGateway(parseConfig(text, 'b.yaml', {}));
    primary.brownout('529', 60_000);
    for (let i = 0; i < 4; i++) {
      await claude(a).messages.create(ask(`agent a ${i}`)).catch(() => undefined);
      await sleep(300);
    }
    const sentByA = requestsTo(primary).length;
    const counter = { requests: 0 };
    const err = await apiError(claude(b, { maxRetries: 2, counter }).messages.create(ask('agent b')));
    expect(err).toBeInstanceOf(Anthropic.ServiceUnavailableError);
    expect(err.status).toBe(503);
    expect((err.error as { error?: { code?: string } }).error?.code).toBe('circuit_open');
    expect(err.type).toBe('api_error');
    expect(Number(err.headers?.get('retry-after'))).toBeGreaterThan(0);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.requestID).toBeTruthy();
    expect(requestsTo(primary)).toHaveLength(sentByA);
    // The SDK retries a 503 by default: told not to, it sends the call once.
    expect(counter.requests).toBe(1);
  });
});
