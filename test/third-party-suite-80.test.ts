// An eightieth third-party failure-scenario suite: a team whose agents use the official `@anthropic-ai/sdk`
// (Claude Code style: long system prompts and tool lists under prompt caching, `anthropic-beta` flags, streaming)
// pointed at the gateway's `/v1/messages`. Written from the README ("Failover and API families": Anthropic clients,
// "Headers", "Paths", "Retries", "What the client sees") to cover what the earlier Anthropic suites leave out: the
// request's bytes as the account gets them (a prompt cache keyed on what the agent wrote, on a retry and a failover
// too), repeated header lines, the SDK's x-stainless-* headers, count_tokens and batches by the README's rules, the
// APIError subclass each failure reaches the app as, and a stream's pings, usage and abort. A provider of the test's
// own, on 127.0.0.1, plays Anthropic and records every request's raw bytes and header lines.
import { request as httpRequest, type IncomingMessage, type ServerResponse } from 'node:http';
import { once } from 'node:events';
import { gzipSync } from 'node:zlib';
import { setTimeout as sleep } from 'node:timers/promises';
import Anthropic from '@anthropic-ai/sdk';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { play, type Script } from './helpers/scripted-provider.ts';
import { aev } from './helpers/tool-stream.ts';
import { TEST_KEY, useStacks, type Stack } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();

type RouteInput = ConfigInput['routes'][number];
type ApiError = InstanceType<typeof Anthropic.APIError>;

const MODEL = 'claude-sonnet-4-6';
const BACKUP_MODEL = 'claude-haiku-4-5';

// ---------------------------------------------------------------------------------------------------------------
// The account: what it got, byte for byte, and what it answers.

interface Hit {
  method: string;
  url: string;
  /** The body's bytes as they came. */
  raw: Buffer;
  /** Header lines as they came, name and value (repeated lines stay apart). */
  lines: Array<[string, string]>;
  headers: IncomingMessage['headers'];
  /** Set when the gateway closed the request before the answer ended (an abort). */
  closedEarly: boolean;
}

interface Account {
  origin: string;
  hits: Hit[];
}

type Answer = (hit: Hit, n: number) => Script | 'hang';

async function account(answer: Answer): Promise<Account> {
  const hits: Hit[] = [];
  const p = await startProvider((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const lines: Array<[string, string]> = [];
      for (let i = 0; i < req.rawHeaders.length; i += 2) lines.push([req.rawHeaders[i]!.toLowerCase(), req.rawHeaders[i + 1]!]);
      const hit: Hit = { method: req.method ?? '', url: req.url ?? '', raw: Buffer.concat(chunks), lines, headers: req.headers, closedEarly: false };
      hits.push(hit);
      res.on('close', () => (hit.closedEarly = !res.writableFinished));
      const script = answer(hit, hits.length);
      if (script !== 'hang') void play(res, script);
    });
  });
  return { origin: p.origin, hits };
}

const errorBody = (type: string, text: string, requestId = 'req_011CErr') => ({ type: 'error', error: { type, message: text }, request_id: requestId });
const json = (status: number, body: unknown, headers: Record<string, string> = {}): Script => ({
  status,
  headers: { 'content-type': 'application/json', ...headers },
  steps: [typeof body === 'string' ? body : JSON.stringify(body)],
});
const usage = { input_tokens: 12, cache_creation_input_tokens: 2048, cache_read_input_tokens: 30_000, output_tokens: 9, cache_creation: { ephemeral_5m_input_tokens: 0, ephemeral_1h_input_tokens: 2048 } };
const message = (text = 'Done.', model = MODEL) => ({ id: 'msg_01Abc', type: 'message', role: 'assistant', model, content: [{ type: 'text', text }], stop_reason: 'end_turn', stop_sequence: null, usage });
const whole = (text = 'Done.', model = MODEL): Script => json(200, message(text, model), { 'request-id': 'req_011CWhole' });
const overloaded = (): Script => json(529, errorBody('overloaded_error', 'Overloaded', 'req_011C529'), { 'request-id': 'req_011C529' });

// ---------------------------------------------------------------------------------------------------------------
// The gateway: a /v1/messages route to the account (and a backup account of another model), count_tokens if asked.

interface GwOptions {
  backup?: Account;
  route?: Partial<RouteInput>;
  countRoute?: boolean;
}

async function gateway(primary: Account, opts: GwOptions = {}): Promise<Stack> {
  const timeouts = { connectMs: 2_000, firstTokenMs: 10_000, idleMs: 10_000 };
  return startStack({
    config: () => ({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: {
        claude: { family: 'anthropic', baseUrl: primary.origin, apiKey: TEST_KEY, breaker: false, timeouts },
        ...(opts.backup && { backup: { family: 'anthropic' as const, baseUrl: opts.backup.origin, apiKey: 'backup-key-0123456789', breaker: false, timeouts } }),
      },
      routes: [
        {
          name: 'agents',
          match: { path: '/v1/messages', models: ['claude-*'] },
          targets: [{ provider: 'claude' }, ...(opts.backup ? [{ provider: 'backup', model: BACKUP_MODEL }] : [])],
          timeoutMs: 20_000,
          budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 },
          park: false,
          retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 10, capMs: 10 }, maxWaitHintMs: 5_000 },
          ...opts.route,
        },
        ...(opts.countRoute ? [{ name: 'count', match: { path: '/v1/messages/count_tokens' }, targets: [{ provider: 'claude' }], retry: { maxAttempts: 2 }, park: false } as RouteInput] : []),
      ],
    }),
  });
}

interface Sent {
  url: string;
  headers: Headers;
  body: string | undefined;
}
interface Got {
  status: number;
  headers: Headers;
}

/** The official SDK at its defaults (maxRetries 2) unless told, recording what it sent and got on the wire. */
function agent(s: Stack, opts: { maxRetries?: number; timeout?: number } = {}): { client: Anthropic; sent: Sent[]; got: Got[] } {
  const sent: Sent[] = [];
  const got: Got[] = [];
  const client = new Anthropic({
    baseURL: s.url,
    apiKey: 'agent-key-not-the-provider',
    ...opts,
    fetch: async (input, init) => {
      sent.push({ url: String(input), headers: new Headers(init?.headers), body: typeof init?.body === 'string' ? init.body : undefined });
      const res = await fetch(input, init);
      got.push({ status: res.status, headers: res.headers });
      return res;
    },
  });
  return { client, sent, got };
}

const fail = (p: Promise<unknown>) => p.then(() => new Error('resolved'), (e: unknown) => e) as Promise<ApiError>;

// A Claude Code style turn: a long system prompt cached for an hour, tools whose last one closes a cache breakpoint,
// a history with a tool call (a 64-bit id in its input) and its result, and a user block cached for five minutes.
const EXTENDED_TTL = 'extended-cache-ttl-2025-04-11';
const cachedTurn = {
  model: MODEL,
  max_tokens: 4096,
  system: [
    { type: 'text' as const, text: 'You are Claude Code, a coding agent. Café ☕ — 日本語 — "quoted" \\ back\u2028slash.', cache_control: { type: 'ephemeral' as const, ttl: '1h' as const } },
    { type: 'text' as const, text: 'Project notes: the build uses pnpm.' },
  ],
  tools: [
    { name: 'read_file', description: 'Read a file', input_schema: { type: 'object' as const, properties: { path: { type: 'string' } }, required: ['path'] } },
    { name: 'edit_file', description: 'Edit a file', input_schema: { type: 'object' as const, properties: { path: { type: 'string' }, patch: { type: 'string' } } }, cache_control: { type: 'ephemeral' as const, ttl: '1h' as const } },
  ],
  messages: [
    { role: 'user' as const, content: 'Fix the failing test.' },
    { role: 'assistant' as const, content: [{ type: 'tool_use' as const, id: 'toolu_01A', name: 'read_file', input: { path: 'src/cart.ts', inode: 0 } }] },
    {
      role: 'user' as const,
      content: [
        { type: 'tool_result' as const, tool_use_id: 'toolu_01A', content: 'export const total = 1;' },
        { type: 'text' as const, text: 'Now patch it.', cache_control: { type: 'ephemeral' as const } },
      ],
    },
  ],
};

// ---------------------------------------------------------------------------------------------------------------


/** A raw HTTP request with header lines as given (repeated ones stay apart). */
async function rawPost(url: string, lines: Array<[string, string]>, body: Buffer): Promise<{ status: number; headers: IncomingMessage['headers']; body: string }> {
  const u = new URL(url);
  const req = httpRequest({ host: u.hostname, port: u.port, path: u.pathname + u.search, method: 'POST', headers: [['host', u.host], ...lines].flat() as unknown as Record<string, string> });
  req.end(body);
  const [res] = (await once(req, 'response')) as [IncomingMessage];
  const chunks: Buffer[] = [];
  for await (const c of res) chunks.push(c as Buffer);
  return { status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString() };
}

const SSE = { 'content-type': 'text/event-stream', 'request-id': 'req_011CStream' };
const start = aev('message_start', { message: { ...message(), content: [], stop_reason: null, usage: { ...usage, output_tokens: 1 } } });
const ping = aev('ping');
const textOpen = aev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } });
const textDelta = (text: string) => aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text } });
const blockStop = aev('content_block_stop', { index: 0 });
const finish = aev('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { ...usage, output_tokens: 9 } });
const stop = aev('message_stop');

describe("what the account gets: the agent's bytes, which its prompt cache is keyed on", () => {
  it('sends the SDK body byte for byte (cache_control with ttl 1h on system, tools and a message block), and the same bytes again on the retry after a 529', async () => {
    const primary = await account((_h, n) => (n === 1 ? overloaded() : whole()));
    const s = await gateway(primary);
    const { client, sent, got } = agent(s);
    const msg = await client.beta.messages.create({ ...cachedTurn, betas: [EXTENDED_TTL] });
    expect(sent).toHaveLength(1);
    const bytes = Buffer.from(sent[0]!.body!);
    expect(primary.hits.map((h) => h.raw.equals(bytes))).toEqual([true, true]);
    expect(primary.hits.map((h) => h.headers['anthropic-beta'])).toEqual([EXTENDED_TTL, EXTENDED_TTL]);
    expect(primary.hits.map((h) => h.headers['content-length'])).toEqual([String(bytes.length), String(bytes.length)]);
    // What the account billed reaches the agent as it was: the 1-hour cache write and the cache read.
    expect(msg.usage).toEqual(usage);
    expect(msg._request_id).toBe('req_011CWhole');
    expect([got[0]!.status, got[0]!.headers.get('x-stormgate-attempts')]).toEqual([200, '2']);
  });

  it("fails over to a backup account of another model with only the model's value changed: key order, breakpoints and ttl as written", async () => {
    const primary = await account(() => overloaded());
    const backup = await account(() => whole('From the backup.', BACKUP_MODEL));
    const s = await gateway(primary, { backup });
    const { client, sent } = agent(s);
    const msg = await client.messages.create(cachedTurn);
    expect([msg.model, primary.hits.length, backup.hits.length, sent.length]).toEqual([BACKUP_MODEL, 2, 1, 1]);
    const written = sent[0]!.body!;
    expect(written).toContain(`"model":"${MODEL}"`);
    expect(backup.hits[0]!.raw.toString('utf8')).toBe(written.replace(`"model":"${MODEL}"`, `"model":"${BACKUP_MODEL}"`));
    expect(primary.hits.every((h) => h.raw.toString('utf8') === written)).toBe(true);
  });

  it('sends a body written by hand (its spacing, escapes and key order) as its bytes; a gzipped one and one after a byte order mark as the JSON they hold', async () => {
    const primary = await account(() => whole());
    const s = await gateway(primary);
    const handWritten = Buffer.from(
      '{\n  "messages": [ {"content": [{"type":"text","text":"caf\\u00e9 \\/ \\ud83d\\ude80", "cache_control": {"ttl":"1h","type":"ephemeral"}}], "role":"user"} ],\n' +
        '  "max_tokens": 1.0e3, "model" : "claude-sonnet-4-6",\n  "system": [{"cache_control":{"type":"ephemeral"},"text":"Be brief.","type":"text"}]\n}\n',
    );
    const head: Array<[string, string]> = [['content-type', 'application/json'], ['anthropic-version', '2023-06-01'], ['x-api-key', 'agent-key']];
    expect((await rawPost(`${s.url}/v1/messages`, head, handWritten)).status).toBe(200);
    expect(primary.hits[0]!.raw.equals(handWritten)).toBe(true);
    const sdkBody = Buffer.from(JSON.stringify(cachedTurn));
    expect((await rawPost(`${s.url}/v1/messages`, [...head, ['content-encoding', 'gzip']], gzipSync(sdkBody))).status).toBe(200);
    expect((await rawPost(`${s.url}/v1/messages`, head, Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), sdkBody]))).status).toBe(200);
    for (const h of primary.hits.slice(1)) {
      expect(h.raw.equals(sdkBody)).toBe(true);
      expect(h.headers['content-encoding']).toBeUndefined();
    }
  });
});

describe('headers the account gets', () => {
  it("anthropic-beta sent on two lines arrives as one list; the agent's anthropic-version as it is, the provider's when none; x-stainless-* but the timeout; never the agent's key", async () => {
    const primary = await account((h) => (String(h.raw).includes('"stream":true') ? { headers: SSE, steps: [start, textOpen, textDelta('ok'), blockStop, finish, stop] } : whole()));
    const s = await gateway(primary);
    const body = Buffer.from(JSON.stringify({ model: MODEL, max_tokens: 5, messages: [{ role: 'user', content: 'hi' }] }));
    const lines: Array<[string, string]> = [['content-type', 'application/json'], ['anthropic-beta', EXTENDED_TTL], ['anthropic-beta', 'interleaved-thinking-2025-05-14,context-1m-2025-08-07'], ['x-api-key', 'agent-key']];
    expect((await rawPost(`${s.url}/v1/messages`, [...lines, ['anthropic-version', '2023-01-01']], body)).status).toBe(200);
    expect((await rawPost(`${s.url}/v1/messages`, lines, body)).status).toBe(200);
    const anthropicLines = (h: Hit) => h.lines.filter(([n]) => n.startsWith('anthropic-'));
    const betas = `${EXTENDED_TTL}, interleaved-thinking-2025-05-14,context-1m-2025-08-07`;
    expect(anthropicLines(primary.hits[0]!)).toEqual([['anthropic-beta', betas], ['anthropic-version', '2023-01-01']]);
    expect(anthropicLines(primary.hits[1]!)).toEqual([['anthropic-beta', betas], ['anthropic-version', '2023-06-01']]);

    // The SDK's own headers, on a stream with a client-wide timeout (sent as x-stainless-timeout).
    const { client, sent } = agent(s, { timeout: 120_000 });
    await client.messages.stream({ model: MODEL, max_tokens: 5, messages: [{ role: 'user', content: 'hi' }] }).finalMessage();
    const stainless = [...sent[0]!.headers].filter(([n]) => n.startsWith('x-stainless-'));
    expect(stainless).toContainEqual(['x-stainless-timeout', '120']);
    const upstream = primary.hits[2]!;
    expect(upstream.lines.filter(([n]) => n.startsWith('x-stainless-')).sort()).toEqual(stainless.filter(([n]) => n !== 'x-stainless-timeout').sort());
    expect(upstream.headers['anthropic-version']).toBe(sent[0]!.headers.get('anthropic-version'));
    for (const h of primary.hits) {
      expect(h.headers['x-api-key']).toBe(TEST_KEY);
      expect(h.headers.authorization).toBeUndefined();
      // One line each: a second x-api-key or anthropic-version beside the gateway's would be the agent's.
      for (const name of ['x-api-key', 'anthropic-version', 'anthropic-beta']) expect(h.lines.filter(([n]) => n === name).length).toBeLessThanOrEqual(1);
    }
  });
});

describe('count_tokens and batches, by the README\'s "Anthropic clients"', () => {
  it('messages.countTokens on a route of its own: the body byte for byte, cache_control included, and the count back; the beta call adds its betas', async () => {
    const primary = await account((h) => (h.url.startsWith('/v1/messages/count_tokens') ? json(200, { input_tokens: 31_337 }, { 'request-id': 'req_011CCount' }) : whole()));
    const s = await gateway(primary, { countRoute: true });
    const { client, sent } = agent(s);
    const counted = await client.messages.countTokens({ model: MODEL, system: cachedTurn.system, tools: cachedTurn.tools, messages: cachedTurn.messages });
    expect(counted).toEqual({ input_tokens: 31_337 });
    expect(counted._request_id).toBe('req_011CCount');
    const beta = await client.beta.messages.countTokens({ model: MODEL, messages: cachedTurn.messages, betas: [EXTENDED_TTL] });
    expect(beta.input_tokens).toBe(31_337);
    expect(primary.hits.map((h) => [h.method, h.url.split('?')[0]])).toEqual([
      ['POST', '/v1/messages/count_tokens'],
      ['POST', '/v1/messages/count_tokens'],
    ]);
    expect(primary.hits.map((h, i) => h.raw.equals(Buffer.from(sent[i]!.body!)))).toEqual([true, true]);
    expect(primary.hits[1]!.headers['anthropic-beta']).toBe(sent[1]!.headers.get('anthropic-beta'));
    expect(primary.hits[1]!.headers['anthropic-beta']).toContain(EXTENDED_TTL);
    expect(new URL(primary.hits[1]!.url, 'http://x').search).toBe(new URL(sent[1]!.url).search);
  });

  it("with only /v1/messages routed: countTokens, batches.create and batches.retrieve get NotFoundError 404 unknown_url in Anthropic's shape, sent once, nothing upstream", async () => {
    const primary = await account(() => whole());
    const s = await gateway(primary);
    const { client, got } = agent(s);
    const calls: Array<[string, () => Promise<unknown>]> = [
      ['POST /v1/messages/count_tokens', () => client.messages.countTokens({ model: MODEL, messages: [{ role: 'user', content: 'hi' }] })],
      ['POST /v1/messages/batches', () => client.messages.batches.create({ requests: [{ custom_id: 'job-1', params: { model: MODEL, max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] } }] })],
      ['GET /v1/messages/batches/msgbatch_01', () => client.messages.batches.retrieve('msgbatch_01')],
    ];
    for (const [what, call] of calls) {
      const err = await fail(call());
      expect(err).toBeInstanceOf(Anthropic.NotFoundError);
      expect(err.status).toBe(404);
      expect(err.error).toMatchObject({ type: 'error', error: { type: 'not_found_error', code: 'unknown_url', message: `no route for ${what}` } });
      expect(err.requestID).toBe(got.at(-1)!.headers.get('x-stormgate-request-id'));
    }
    expect(got.map((g) => [g.status, g.headers.get('x-should-retry')])).toEqual([
      [404, 'false'],
      [404, 'false'],
      [404, 'false'],
    ]);
    expect(primary.hits).toHaveLength(0);
  });
});

describe('failures as the app catches them (the SDK at its default maxRetries 2)', () => {
  const rateHeaders = () => ({
    'retry-after': '1',
    'anthropic-ratelimit-requests-limit': '50',
    'anthropic-ratelimit-requests-remaining': '0',
    'anthropic-ratelimit-requests-reset': new Date(Date.now() + 1_000).toISOString(),
    'anthropic-ratelimit-tokens-remaining': '0',
  });
  // The class each status reaches the app as (any constructor: the subclasses' constructors type their status).
  const cases: Array<[string, number, string, () => Record<string, string>, abstract new (...args: never[]) => Error, number]> = [
    ['529 overloaded_error with x-should-retry: true', 529, 'overloaded_error', () => ({ 'x-should-retry': 'true' }), Anthropic.OverloadedError, 2],
    ['500 api_error', 500, 'api_error', () => ({}), Anthropic.InternalServerError, 2],
    ['429 rate_limit_error with retry-after and anthropic-ratelimit-*', 429, 'rate_limit_error', rateHeaders, Anthropic.RateLimitError, 2],
    ['413 request_too_large', 413, 'request_too_large', () => ({}), Anthropic.ContentTooLargeError, 1],
    ['400 invalid_request_error', 400, 'invalid_request_error', () => ({}), Anthropic.BadRequestError, 1],
  ];
  it.each(cases)('%s: raised once as its class, with the body and request id Anthropic sent', async (_name, status, type, headers, errorClass, attempts) => {
    const primary = await account(() => json(status, errorBody(type, `the ${type}`, `req_011C${status}`), { 'request-id': `req_011C${status}`, ...headers() }));
    const s = await gateway(primary);
    const { client, got } = agent(s);
    const err = await fail(client.messages.create(cachedTurn));
    expect(err).toBeInstanceOf(errorClass);
    if (status !== 529) expect(err).not.toBeInstanceOf(Anthropic.OverloadedError);
    expect([err.status, err.type, err.requestID]).toEqual([status, type, `req_011C${status}`]);
    expect(err.error).toEqual({ type: 'error', error: { type, message: `the ${type}`, param: null, code: null }, request_id: `req_011C${status}` });
    expect(got).toHaveLength(1);
    expect(got[0]!.headers.get('x-should-retry')).toBe('false');
    expect(got[0]!.headers.get('x-stormgate-attempts')).toBe(String(attempts));
    expect([...got[0]!.headers.keys()].filter((n) => n.startsWith('anthropic-ratelimit'))).toEqual([]);
    if (status === 429) expect(Number(got[0]!.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect(primary.hits).toHaveLength(attempts);
  });
});

describe('streams through messages.stream()', () => {
  it("passes pings and every event on byte for byte; finalMessage() has the account's usage, cache tokens included, and its request id", async () => {
    const steps = [start, ping, textOpen, ping, textDelta('Hel'), 20, ping, textDelta('lo.'), blockStop, finish, stop];
    const primary = await account(() => ({ headers: SSE, steps }));
    const s = await gateway(primary);
    const res = await fetch(`${s.url}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01', 'x-api-key': 'k' }, body: JSON.stringify({ ...cachedTurn, stream: true }) });
    expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/);
    expect(await res.text()).toBe(steps.filter((x) => typeof x === 'string').join(''));
    const stream = agent(s).client.messages.stream(cachedTurn);
    const texts: string[] = [];
    stream.on('text', (t) => texts.push(t));
    const final = await stream.finalMessage();
    expect(texts.join('')).toBe('Hello.');
    expect(final.usage).toEqual(usage);
    expect(stream.request_id).toBe('req_011CStream');
    expect(primary.hits).toHaveLength(2);
  });

  it('an api_error event after the first text: finalMessage() rejects with an APIError of that type, the text so far seen, nothing sent again', async () => {
    const primary = await account(() => ({ headers: SSE, steps: [start, textOpen, textDelta('Working on'), 20, aev('error', { error: { type: 'api_error', message: 'Internal server error' }, request_id: 'req_011CMid' })] }));
    const s = await gateway(primary);
    const { client, got } = agent(s);
    const stream = client.messages.stream(cachedTurn);
    const texts: string[] = [];
    stream.on('text', (t) => texts.push(t));
    const err = await fail(stream.finalMessage());
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(err).not.toBeInstanceOf(Anthropic.APIUserAbortError);
    expect(err.type).toBe('api_error');
    expect(err.error).toMatchObject({ type: 'error', error: { type: 'api_error', message: 'Internal server error' } });
    expect(texts.join('')).toBe('Working on');
    await sleep(300);
    expect([got.length, primary.hits.length]).toEqual([1, 1]);
  });

  it('an AbortSignal while the gateway holds a stream of pings before its first output: APIUserAbortError at once, the upstream request closed, no retry', async () => {
    const pings = Array.from({ length: 200 }, () => [ping, 50]).flat();
    const primary = await account(() => ({ headers: SSE, steps: [start, ...pings], hold: true }));
    const s = await gateway(primary);
    const { client } = agent(s);
    const controller = new AbortController();
    const stream = client.messages.stream(cachedTurn, { signal: controller.signal });
    // The pings flowing (the account has the request), however slow a loaded machine is to get it there.
    for (let i = 0; i < 100 && primary.hits.length === 0; i++) await sleep(50);
    await sleep(200);
    expect(primary.hits).toHaveLength(1);
    const t0 = Date.now();
    controller.abort();
    const err = await fail(stream.finalMessage());
    expect(err).toBeInstanceOf(Anthropic.APIUserAbortError);
    expect(Date.now() - t0).toBeLessThan(2_000);
    for (let i = 0; i < 100 && !primary.hits[0]!.closedEarly; i++) await sleep(50);
    expect(primary.hits[0]!.closedEarly).toBe(true);
    await sleep(500);
    expect(primary.hits).toHaveLength(1);
  });
});
