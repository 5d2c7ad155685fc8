// Real provider quirks, each as the provider sends it: OpenAI's account 429s (billing_not_active), Anthropic's account
// problems as a plain 400, Cloudflare's 520 and 524, a 200 whose body a close-delimited connection cut, a bare `data:`
// heartbeat in a stream, and a wait hint of zero. Over real HTTP where the wire matters, as pure policy where it does not.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, RetrySchema, type ConfigInput } from '../src/config/schema.ts';
import { ACCOUNT_429_CODES, classify, isRetryable, mayHaveRun, type AttemptOutcome } from '../src/policy/outcome.ts';
import { toOpenAIError } from '../src/providers/anthropic/response.ts';
import { jsonEnd, notAnAnswer } from '../src/providers/answer-shape.ts';
import { SseParser } from '../src/streaming/sse-parser.ts';
import { eventMeaning } from '../src/streaming/stream-events.ts';
import { parseWaitHint } from '../src/policy/wait-hint.ts';
import { decideRetryWait, type WaitInputs } from '../src/policy/retry-wait.ts';
import { backoffDelayMs } from '../src/policy/backoff.ts';
import { seededRandom } from '../src/policy/random.ts';
import type { Socket } from 'node:net';
import type { ErrorRule } from '../src/mock/faults.ts';
import type { MockServer } from '../src/mock/server.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { cc, delta, useScriptedGateway } from './helpers/scripted-provider.ts';
import { configServedBy, defaultConfig, RETRY_LOOP_ONLY, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';

const startStack = useStacks();
const startMock = useExtraMocks();
const startProvider = useFakeProviders();
const scriptedGateway = useScriptedGateway((c) => {
  for (const r of c.routes as Array<Record<string, unknown>>) r.retry = { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 10, capMs: 10 } };
});

const DEFAULT_RETRY_ON = RetrySchema.parse({}).retryOn;
const http = (status: number, errorCode: string | null = null): AttemptOutcome => ({ kind: 'http', status, errorCode, hint: undefined });
const messages = [{ role: 'user' as const, content: 'hi' }];
const fastRetry = { maxAttempts: 3, backoff: { strategy: 'fixed' as const, baseMs: 5, capMs: 5 } };

interface Answer {
  status: number;
  headers: Headers;
  text: string;
  ms: number;
}

async function chat(s: Stack, extra: Record<string, unknown> = {}): Promise<Answer> {
  const started = Date.now();
  const res = await fetch(`${s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', messages, ...extra }),
  });
  return { status: res.status, headers: res.headers, text: await res.text(), ms: Date.now() - started };
}

const errorOf = (a: Answer) => (JSON.parse(a.text) as { error: { code: string | null; message: string } }).error;

/** The stack's mock as the only chat target (`mock`), or first of two with a second mock (`backup`) after it. */
async function mockStack(errors: ErrorRule[], opts: { backup?: 'openai' | 'anthropic'; primary?: 'anthropic' } = {}): Promise<{ s: Stack; backup?: MockServer; claude?: MockServer }> {
  const claude = opts.primary === 'anthropic' ? await startMock({ faults: { errors }, quiet: true, apiKey: 'claude-key' }) : undefined;
  const backup = opts.backup ? await startMock({ quiet: true, apiKey: 'backup-key' }) : undefined;
  const s = await startStack({
    faults: claude ? undefined : { errors },
    config: (url) => {
      const base = defaultConfig(url, { ...RETRY_LOOP_ONLY, route: { ...RETRY_LOOP_ONLY.route, retry: fastRetry } });
      const providers: ConfigInput['providers'] = { ...base.providers };
      const targets: Array<{ provider: string; model?: string }> = [];
      if (claude) {
        providers.claude = { family: 'anthropic', baseUrl: claude.url, apiKey: 'claude-key', breaker: false };
        targets.push({ provider: 'claude', model: 'claude-sonnet-4-5' });
      }
      targets.push({ provider: 'mock' });
      if (backup) providers.backup = { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: 'backup-key', breaker: false };
      if (backup) targets.push({ provider: 'backup', model: 'gpt-4.1' });
      return { ...base, providers, routes: base.routes.map((r) => (r.name === 'chat' ? { ...r, targets } : r)) };
    },
  });
  return { s, ...(backup && { backup }), ...(claude && { claude }) };
}

describe('an OpenAI 429 that is the account, not a rate (billing_not_active and friends)', () => {
  it('is the credentials class, never retried, whatever retryOn says', () => {
    for (const code of ['insufficient_quota', 'billing_not_active', 'access_terminated']) {
      expect(ACCOUNT_429_CODES.has(code)).toBe(true);
      const c = classify(http(429, code));
      expect(c).toEqual({ cls: 'credentials', retryKey: null, reason: code });
      expect(isRetryable(c, [...DEFAULT_RETRY_ON, 429])).toBe(false);
    }
    expect(classify(http(429, 'rate_limit_exceeded')).cls).toBe('rate-limited');
  });

  // OpenAI has sent it both ways: the code in `code`, or `code: null` and the code in `type` only.
  it.each([
    ['in code', 'billing_not_active'],
    ['in type only', null],
  ])('answers 502 upstream_auth_error after one attempt, with the code %s', async (_name, code) => {
    let hits = 0;
    const p = await startProvider((req, res) => {
      req.resume();
      req.on('end', () => {
        hits++;
        res.writeHead(429, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ error: { message: 'Your account is not active, please check your billing details on our website.', type: 'billing_not_active', param: null, code } }));
      });
    });
    const s = await startStack({ config: (url) => configServedBy(url, 'p', `${p.origin}/v1`) });
    const a = await chat(s);
    expect(a.status).toBe(502);
    expect(errorOf(a).code).toBe('upstream_auth_error');
    expect(a.text).not.toContain('billing details');
    expect(a.headers.get('x-should-retry')).toBe('false');
    expect(a.headers.get('retry-after')).toBeNull();
    expect(hits).toBe(1);
  });

  it('fails over to the next target at once and holds the refused one', async () => {
    const { s, backup } = await mockStack([{ status: 429, code: 'billing_not_active', type: 'billing_not_active' }], { backup: 'openai' });
    for (let i = 0; i < 2; i++) {
      const a = await chat(s);
      expect(a.status).toBe(200);
      expect(a.headers.get('x-stormgate-target')).toBe('backup/gpt-4.1');
      expect(a.headers.get('x-stormgate-fallback')).toBe('credentials');
    }
    // The second request skipped the held target without sending it anything.
    expect(s.mock.stats().total).toBe(1);
    expect(backup!.stats().total).toBe(2);
  });
});

describe('an Anthropic account problem sent as a 400 invalid_request_error', () => {
  const CREDIT = 'Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.';
  const DISABLED = 'This organization has been disabled.';
  const anthropic400 = (message: string) => ({ type: 'error', error: { type: 'invalid_request_error', message } });

  it('maps to the 402 or 403 it is, which the outcome table reads as the gateway\'s credentials', () => {
    const credit = toOpenAIError(400, anthropic400(CREDIT));
    expect(credit.status).toBe(402);
    expect(credit.body.error).toMatchObject({ type: 'insufficient_quota', code: 'insufficient_quota', message: CREDIT });
    const disabled = toOpenAIError(400, JSON.stringify(anthropic400(DISABLED)));
    expect(disabled.status).toBe(403);
    expect(disabled.body.error.type).toBe('permission_error');
    for (const { status } of [credit, disabled]) expect(classify(http(status)).cls).toBe('credentials');
    // A 400 about the request itself stays the client's.
    expect(toOpenAIError(400, anthropic400('messages: at least one message is required')).status).toBe(400);
  });

  it('is not read into a 400 that quotes the client\'s words: one request must not hold the target for every client', () => {
    // Anthropic's validation quotes an unknown content block type, or anthropic-beta value, that the client sent.
    for (const quoted of [CREDIT, DISABLED]) {
      const echo = toOpenAIError(400, anthropic400(`messages.0.content.0: Input tag '${quoted}' found using 'type' does not match any of the expected tags: 'text', 'image'`));
      expect(echo.status).toBe(400);
      expect(classify(http(echo.status)).cls).toBe('client-error');
      expect(toOpenAIError(400, anthropic400(`Unexpected value(s) \`${quoted}\` for the \`anthropic-beta\` header.`)).status).toBe(400);
    }
  });

  it.each([
    ['credit balance too low', CREDIT],
    ['organization disabled', DISABLED],
  ])('on "%s": never passes the body on, holds the target, fails over to the next', async (_name, message) => {
    const { s, claude } = await mockStack([{ status: 400, message }], { primary: 'anthropic' });
    for (let i = 0; i < 2; i++) {
      const a = await chat(s);
      expect(a.status).toBe(200);
      expect(a.headers.get('x-stormgate-target')).toBe('mock/gpt-4o');
      expect(a.headers.get('x-stormgate-fallback')).toBe('credentials');
    }
    expect(claude!.stats().total).toBe(1);
  });

  it('answers 502 upstream_auth_error without the provider\'s body when the Anthropic target is the only one', async () => {
    const claude = await startMock({ faults: { errors: [{ status: 400, message: CREDIT }] }, quiet: true, apiKey: 'claude-key' });
    const s = await startStack({
      config: (url) => {
        const base = defaultConfig(url, { ...RETRY_LOOP_ONLY, route: { ...RETRY_LOOP_ONLY.route, retry: fastRetry } });
        return {
          ...base,
          providers: { ...base.providers, claude: { family: 'anthropic', baseUrl: claude.url, apiKey: 'claude-key', breaker: false } },
          routes: base.routes.map((r) => (r.name === 'chat' ? { ...r, targets: [{ provider: 'claude', model: 'claude-sonnet-4-5' }] } : r)),
        };
      },
    });
    const a = await chat(s);
    expect(a.status).toBe(502);
    expect(errorOf(a).code).toBe('upstream_auth_error');
    expect(a.text).not.toContain('credit balance');
    expect(a.headers.get('x-should-retry')).toBe('false');
    expect(claude.stats().total).toBe(1);
  });
});

describe('Cloudflare\'s 520 and 524 in front of a provider', () => {
  it('may have run the request, like a proxy\'s 502 or 504; 521, 522 and 523 never reached the origin', () => {
    for (const status of [502, 504, 520, 524]) expect(mayHaveRun(http(status))).toBe(true);
    for (const status of [503, 521, 522, 523]) expect(mayHaveRun(http(status))).toBe(false);
    for (const status of [520, 524]) {
      expect(classify(http(status))).toEqual({ cls: 'server-error', retryKey: status, reason: `status_${status}` });
      expect(isRetryable(classify(http(status)), DEFAULT_RETRY_ON)).toBe(true);
      expect(isRetryable(classify(http(status)), [502, 504])).toBe(false);
    }
  });

  /** A provider behind Cloudflare: its first `failures` answers are Cloudflare's `status` page, then real answers. */
  async function behindCloudflare(status: number, failures: number): Promise<{ url: string; hits: () => number }> {
    let n = 0;
    const p = await startProvider((req, res) => {
      req.resume();
      req.on('end', () => {
        if (n++ < failures) {
          res.writeHead(status, { 'content-type': 'text/html; charset=UTF-8', server: 'cloudflare' });
          res.end(`<html><head><title>api.example.com | ${status}: Cloudflare</title></head><body>Error code ${status}</body></html>`);
          return;
        }
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ id: 'chatcmpl-cf', object: 'chat.completion', created: 1, model: 'gpt-4o', choices: [{ index: 0, message: { role: 'assistant', content: 'through' }, finish_reason: 'stop' }] }));
      });
    });
    return { url: `${p.origin}/v1`, hits: p.hits };
  }

  it.each([502, 504, 520, 524])('retries a %i under the default retryOn, like the others', async (status) => {
    const cf = await behindCloudflare(status, 1);
    const s = await startStack({ config: (url) => configServedBy(url, 'cf', cf.url) });
    const a = await chat(s);
    expect(a.status).toBe(200);
    expect(a.headers.get('x-stormgate-attempts')).toBe('2');
    expect(cf.hits()).toBe(2);
  });

  it.each([502, 504, 520, 524])('neither retries nor fails over a %i when retryOn leaves it out: it may have run', async (status) => {
    const cf = await behindCloudflare(status, 1);
    const s = await startStack({
      config: (url) => {
        const c = configServedBy(url, 'cf', cf.url);
        return { ...c, routes: c.routes.map((r) => ({ ...r, targets: [{ provider: 'cf' }, { provider: 'mock' }], retry: { ...fastRetry, retryOn: [429, 503, 'network'] } })) };
      },
    });
    const a = await chat(s);
    expect(a.status).toBe(status);
    expect(cf.hits()).toBe(1);
    expect(s.mock.stats().total).toBe(0);
  });

  it('is in the default retryOn of a route, a target and a contextWindowFallback alike', () => {
    const config = ConfigSchema.parse({
      providers: { p: { family: 'openai', baseUrl: 'http://127.0.0.1:9/v1', apiKey: 'k' } },
      routes: [{ name: 'r', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'p' }] }],
    });
    expect(config.routes[0]!.retry.retryOn).toEqual(expect.arrayContaining([502, 504, 520, 524]));
  });
});

describe('a 200 whose body the connection cut', () => {
  const whole = JSON.stringify({
    id: 'chatcmpl-cut', object: 'chat.completion', created: 1, model: 'gpt-4o',
    choices: [{ index: 0, message: { role: 'assistant', content: 'a {brace} and a "quote" \\ inside' }, finish_reason: 'stop' }],
    usage: { prompt_tokens: 1, completion_tokens: 2, total_tokens: 3 },
  });
  // Cut just after the message object: it still begins with `{`, ends with `}` and has its "choices".
  const cut = whole.slice(0, whole.indexOf('}') + 1);
  const judge = (body: string) => notAnAnswer({ api: 'chat', stream: false, contentType: 'application/json', ownFamily: true }, Buffer.from(body));

  it('is told from a whole answer by its brackets, strings and escapes considered, at every cut', () => {
    expect(cut.endsWith('}')).toBe(true);
    expect(judge(whole)).toBeUndefined();
    expect(judge(`\n ${whole} \n`)).toBeUndefined();
    expect(judge(cut)).toEqual({ detail: expect.stringMatching(/cut before its end/), ran: true });
    for (const doc of [whole, JSON.stringify({ a: '}{"\\', b: [1, { c: '\\\\' }, []], d: {}, e: '\\"}' })]) {
      const b = Buffer.from(doc);
      expect(jsonEnd(b, 0, b.length - 1)).toBe(b.length - 1);
      for (let n = 1; n < b.length; n++) expect(jsonEnd(b, 0, n - 1)).toBe(-1);
    }
    // Trailing bytes after a whole object are no cut: not the provider's answer at all.
    expect(judge(`${whole}{"x":1}`)).toEqual({ detail: 'the upstream answer is not a whole JSON object', ran: false });
  });

  it('costs far less than a JSON.parse on a 3 MB embeddings answer', () => {
    const random = seededRandom(3);
    const data = Array.from({ length: 160 }, (_, index) => ({ object: 'embedding', index, embedding: Array.from({ length: 1536 }, () => Number((random() - 0.5).toFixed(9))) }));
    const body = Buffer.from(JSON.stringify({ object: 'list', data, model: 'text-embedding-3-small', usage: { prompt_tokens: 8, total_tokens: 8 } }));
    expect(body.length).toBeGreaterThan(3_000_000);
    const embeddings = (b: Buffer) => notAnAnswer({ api: 'embeddings', stream: false, contentType: 'application/json', ownFamily: true }, b);
    for (let i = 0; i < 5; i++) expect(embeddings(body)).toBeUndefined();
    const runs = 20;
    const started = performance.now();
    for (let i = 0; i < runs; i++) embeddings(body);
    const perRunMs = (performance.now() - started) / runs;
    // About 0.5 ms on a busy 2-core machine (JSON.parse: over 20 ms); the bound leaves room for a loaded test run.
    expect(perRunMs).toBeLessThan(10);
    expect(embeddings(body.subarray(0, body.lastIndexOf('}', body.length - 2) + 1))?.ran).toBe(true);
  });

  /** A provider whose first answer is `first` written raw on the socket, the rest whole. */
  async function cuttingProvider(first: (socket: Socket) => void): Promise<{ url: string; hits: () => number }> {
    let n = 0;
    const p = await startProvider((req, res) => {
      req.resume();
      req.on('end', () => {
        if (n++ === 0) return first(res.socket!);
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(whole);
      });
    });
    return { url: `${p.origin}/v1`, hits: p.hits };
  }

  it('is retried when the body had no length and ended with the connection (close-delimited)', async () => {
    const p = await cuttingProvider((socket) => {
      socket.write(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n${cut}`);
      setTimeout(() => socket.end(), 10);
    });
    const s = await startStack({ config: (url) => configServedBy(url, 'p', p.url) });
    const { data, response } = await new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 }).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(data.usage?.total_tokens).toBe(3);
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(p.hits()).toBe(2);
  });

  it('is retried when a chunked body lost its last chunk', async () => {
    const p = await cuttingProvider((socket) => {
      socket.write(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n${cut.length.toString(16)}\r\n${cut}\r\n`);
      setTimeout(() => socket.destroy(), 10);
    });
    const s = await startStack({ config: (url) => configServedBy(url, 'p', p.url) });
    const a = await chat(s);
    expect(a.status).toBe(200);
    expect((JSON.parse(a.text) as { usage: { total_tokens: number } }).usage.total_tokens).toBe(3);
    expect(a.headers.get('x-stormgate-attempts')).toBe('2');
  });

  it('ends in the gateway\'s 502, never a 200, when every attempt is cut', async () => {
    let hits = 0;
    const p = await startProvider((req, res) => {
      req.resume();
      req.on('end', () => {
        hits++;
        res.socket!.write(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n${cut}`);
        setTimeout(() => res.socket?.end(), 10);
      });
    });
    const s = await startStack({ config: (url) => configServedBy(url, 'p', `${p.origin}/v1`) });
    const a = await chat(s);
    expect(a.status).toBe(502);
    expect(errorOf(a).message).toMatch(/cut before its end/);
    expect(hits).toBe(3);
  });
});

describe('a bare `data:` heartbeat in a stream', () => {
  it('is framed as a keep-alive, passed on as a comment', () => {
    const p = new SseParser();
    const events = p.push(Buffer.from('data:\n\ndata: \r\n\r\n: hb\ndata:\n\nevent: ping\ndata:\n\ndata: {"a":1}\n\n'));
    expect(events.map((e) => [e.raw, e.data, e.event])).toEqual([
      [':', null, null],
      [':', null, null],
      [': hb', null, null],
      [':', null, 'ping'],
      ['data: {"a":1}', '{"a":1}', null],
    ]);
    for (const ev of events.slice(0, 4)) expect(eventMeaning('chat', ev)).toBe('keepalive');
    // An event line without any data is dispatched by no SSE client that keeps to the spec, and thrown on by the SDKs.
    expect(p.push(Buffer.from('event: keepalive\n\n: note\nevent: ping\n\nevent: error\n\n')).map((e) => [e.raw, e.data, e.event])).toEqual([
      [':', null, 'keepalive'],
      [': note', null, 'ping'],
      ['event: error', null, 'error'],
    ]);
    expect(p.push(Buffer.from('data:'))).toEqual([]);
    expect(p.flush()).toEqual({ raw: ':', data: null, event: null });
  });

  const HB = 'data:\n\n';
  const tool = (args: string, first = false) =>
    cc([delta({ tool_calls: [{ index: 0, ...(first && { id: 'call_1', type: 'function' }), function: { ...(first && { name: 'f' }), arguments: args } }] })]);

  it('before the first output and inside a tool call: the answer streams whole, the SDK never sees it', async () => {
    const { client, seen } = await scriptedGateway(() => ({
      steps: [cc([delta({ role: 'assistant', content: '' })]), HB, 'event: ping\n\n', tool('{"a":', true), HB, tool('1}'), 'event: ping\n\n', cc([delta({}, 'tool_calls')]), 'data: [DONE]\n\n'],
    }));
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    let args = '';
    let finish: string | null | undefined;
    for await (const chunk of stream) {
      args += chunk.choices[0]?.delta?.tool_calls?.[0]?.function?.arguments ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    expect(args).toBe('{"a":1}');
    expect(finish).toBe('tool_calls');
    expect(seen).toHaveLength(1);
  });

  it('keeps an idle stream alive, like a comment, and reaches the client as one', async () => {
    // idleMs 1 s; 1.6 s without output, a heartbeat every 200 ms. The 800 ms left between beats is for a loaded CI
    // machine, where the gateway can be starved for a few hundred ms while the next beat waits in its socket.
    const gap = Array.from({ length: 8 }, () => [200, HB]).flat();
    const { s, seen } = await scriptedGateway(
      () => ({ steps: [cc([delta({ role: 'assistant', content: 'one ' })]), ...gap, cc([delta({ content: 'two' }, 'stop')]), 'data: [DONE]\n\n'] }),
      { idleMs: 1_000 },
    );
    const res = await fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages, stream: true }) });
    const text = await res.text();
    expect(res.status).toBe(200);
    expect(text).toContain('"two"');
    expect(text).toMatch(/data: \[DONE\]\n\n$/);
    expect(text).not.toMatch(/^data:\s*$/m);
    expect(text).toContain(':\n\n');
    expect(text).not.toContain('stream_interrupted');
    expect(seen).toHaveLength(1);
  });
});

describe('a wait hint of zero', () => {
  const now = Date.UTC(2015, 9, 21, 7, 28, 0);

  it('is no hint: skipped for the next source, or none at all', () => {
    expect(parseWaitHint({ 'retry-after': '0' }, now)).toBeUndefined();
    expect(parseWaitHint({ 'retry-after-ms': '0' }, now)).toBeUndefined();
    expect(parseWaitHint({ 'retry-after-ms': '0.0', 'retry-after': '0' }, now)).toBeUndefined();
    expect(parseWaitHint({ 'retry-after': 'Wed, 21 Oct 2015 07:27:00 GMT' }, now)).toBeUndefined();
    expect(parseWaitHint({ 'retry-after': 'Wed, 21 Oct 2015 07:28:00 GMT' }, now)).toBeUndefined();
    expect(parseWaitHint({ 'x-ratelimit-reset-requests': '0s', 'x-ratelimit-remaining-requests': '0' }, now)).toBeUndefined();
    expect(parseWaitHint({ 'anthropic-ratelimit-requests-reset': '2015-10-21T07:28:00Z' }, now)).toBeUndefined();
    expect(parseWaitHint({ 'retry-after-ms': '0', 'retry-after': '2' }, now)).toEqual({ delayMs: 2000, source: 'retry-after', fleetWide: true });
    expect(parseWaitHint({ 'retry-after': '0', 'x-ratelimit-reset-tokens': '1s' }, now)).toEqual({ delayMs: 1000, source: 'x-ratelimit-reset', fleetWide: false });
    // The smallest wait that is one still counts.
    expect(parseWaitHint({ 'retry-after-ms': '0.2' }, now)?.delayMs).toBe(1);
  });

  it('gives way to the jittered backoff in the retry wait, seeded random and fixed clock', () => {
    const retry = RetrySchema.parse({ backoff: { strategy: 'full-jitter', baseMs: 200, capMs: 3000 } });
    const base: WaitInputs = { retry, hint: undefined, retryIndex: 1, prevDelayMs: undefined, nowMs: now, deadlineAtMs: now + 60_000, minAttemptMs: 1_000, random: seededRandom(7) };
    for (const source of ['retry-after', 'retry-after-ms'] as const) {
      const expected = backoffDelayMs(retry.backoff, 1, undefined, seededRandom(7));
      const d = decideRetryWait({ ...base, hint: { delayMs: 0, source, fleetWide: true }, random: seededRandom(7) });
      expect(d).toEqual({ wait: true, delayMs: expected, fromHint: false });
      expect(expected).toBeGreaterThan(0);
    }
    // Many requests told "0" at the same moment spread over the backoff's range instead of all coming back at once.
    const random = seededRandom(42);
    const waits = Array.from({ length: 200 }, () => decideRetryWait({ ...base, retryIndex: 0, hint: { delayMs: 0, source: 'retry-after', fleetWide: true }, random }));
    const delays = waits.map((w) => (w.wait ? w.delayMs : -1));
    expect(Math.min(...delays)).toBeGreaterThanOrEqual(0);
    expect(Math.max(...delays)).toBeLessThanOrEqual(200);
    expect(new Set(delays).size).toBeGreaterThan(100);
    // No deadline answer hands the client a retry-after of 0 either.
    expect(decideRetryWait({ ...base, hint: { delayMs: 0, source: 'retry-after', fleetWide: true }, nowMs: now + 59_500 })).toEqual({ wait: false, why: 'deadline', retryAfterMs: undefined });
  });

  it('over HTTP: the retry waits the backoff, and the client is not told retry-after: 0', async () => {
    const s = await startStack({
      faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '0', 'retry-after-ms': '0' } }] },
      ...RETRY_LOOP_ONLY,
      route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 300, capMs: 300 } } },
    });
    const retried = await chat(s);
    expect(retried.status).toBe(200);
    expect(retried.headers.get('x-stormgate-attempts')).toBe('2');
    expect(retried.ms).toBeGreaterThanOrEqual(290);

    s.mock.setFaults({ errors: [{ status: 429, headers: { 'retry-after': '0', 'retry-after-ms': '0' } }] });
    const refused = await chat(s);
    expect(refused.status).toBe(429);
    expect(refused.headers.get('retry-after')).toBeNull();
    expect(refused.headers.get('retry-after-ms')).toBeNull();
  });
});
