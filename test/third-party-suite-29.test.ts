// A twenty-ninth third-party suite, written from the README alone ("Paths" on request bodies, "Errors" and its table,
// "What the client sees", "Retries" on wait hints and `x-ratelimit-reset-*`, "Retry budget, circuit breaker, hold-offs,
// parking" on hold-offs, "Failover and API families" with "Anthropic clients (/v1/messages)", "Streaming", "Headers")
// as an outside team evaluating LLM gateways would test THE WIRE BETWEEN CLIENT AND GATEWAY, the part earlier suites
// touched least: request bodies as SDKs, browsers and proxies send them (gzip, deflate and br bodies through the
// `openai` SDK's fetch, chunked uploads of unknown length, `Expect: 100-continue`, mixed-case codings, broken data, a
// zip bomb, codings the gateway cannot read) with retries upstream, which must resend the DECODED bytes; HTTP/1.1
// pipelining and many streams sharing a few keep-alive connections, half of them cancelled mid-stream with
// AbortController; the `openai` and `@anthropic-ai/sdk` clients mixed on routes to one Anthropic account, where a
// hold-off or an open breaker that one family's traffic started must reach the other in its own SDK's error shape; a
// provider's window of 429s told only by `x-ratelimit-remaining-*` / `x-ratelimit-reset-*` (Go durations), which a
// retry waits out for its own request and which starts no hold-off; and the "What the client sees" rules (the OpenAI
// shape, `x-should-retry`, `retry-after(-ms)` with every `true`, `x-request-id` naming the gateway's log line) applied
// to every error the gateway makes that one gateway can be driven to, on the OpenAI and the Anthropic paths.
// Black box over real HTTP on 127.0.0.1: the official `openai` (6.x) and `@anthropic-ai/sdk` clients, raw fetch and
// node:http / node:net where the wire itself is the point, the bundled mock provider, and upstreams of the test's own
// that keep every byte they receive. Bounds are generous: the suite runs on a loaded 2-core machine.
// Found and fixed: a keep-alive connection whose request had been answered before its body came in (a 413 for a
// content-length past server.bodyLimitBytes) was marked for good, so any later request on it that Node's parser
// refused (headers over 16 KB: 431) got its socket closed with no answer, which fetch raises as "other side closed"
// (src/http/client-errors.ts: the mark is now the early-answered request's, for as long as its body is unread).
// Left as a design question: a 429 window told only by x-ratelimit-reset-* starts no hold-off, so its retries are the
// retry budget's; at the default budget half of 20 concurrent calls got a final 429 with x-should-retry: false (and
// retry-after-ms ~1 s) while the window had a second left. The window test gives the route a budget that allows them.
import { request as httpRequest, Agent as HttpAgent, type IncomingMessage } from 'node:http';
import { connect } from 'node:net';
import { once } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { brotliCompressSync, deflateSync, gzipSync } from 'node:zlib';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { Agent } from 'undici';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { freePort } from './helpers/free-port.ts';
import { expectOpenAIError, sdkError } from './helpers/openai-error.ts';
import { cc, completion, delta, DONE, json, play, type Script } from './helpers/scripted-provider.ts';
import { metricSum, TEST_KEY, useStacks, type Stack } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();

// ---------------------------------------------------------------------------------------------------------------
// An upstream of the test's own that keeps every request's raw bytes and headers, and answers by script.

interface Received {
  url: string;
  headers: IncomingMessage['headers'];
  raw: Buffer;
  at: number;
}
type Answer = (body: Record<string, unknown>, n: number, url: string) => Script;

async function recorder(answer: Answer): Promise<{ origin: string; got: Received[] }> {
  const got: Received[] = [];
  const p = await startProvider((req, res) => {
    const parts: Buffer[] = [];
    req.on('data', (d: Buffer) => parts.push(d));
    req.on('end', () => {
      const raw = Buffer.concat(parts);
      got.push({ url: req.url ?? '', headers: req.headers, raw, at: Date.now() });
      let body: Record<string, unknown> = {};
      try {
        body = JSON.parse(raw.toString()) as Record<string, unknown>;
      } catch {
        // what the gateway must never send: the test reads `raw`
      }
      void play(res, answer(body, got.length, req.url ?? ''));
    });
  });
  return { origin: p.origin, got };
}

const busy = (headers: Record<string, string> = {}) => json(503, { error: { message: 'busy', type: 'server_error', param: null, code: null } }, headers);
const rateLimited = (headers: Record<string, string>) =>
  json(429, { error: { message: 'Rate limit reached for gpt-4o on requests per min (RPM): Limit 500, Used 500, Requested 1.', type: 'requests', param: null, code: 'rate_limit_exceeded' } }, headers);
const streamOf = (words: string[]): Script => ({ steps: [cc([delta({ role: 'assistant', content: '' })]), ...words.map((w) => cc([delta({ content: w })])), cc([delta({}, 'stop')]), DONE] });
const answerWith = (text: string): Answer => (body) => (body.stream === true ? streamOf([text]) : completion(text, 'gpt-4o'));

/** A gateway whose chat route goes to one provider at `origin` alone: three quick attempts, no breaker, no parking. */
function oneProvider(origin: string, extra: { route?: Record<string, unknown>; provider?: Record<string, unknown>; server?: Record<string, unknown> } = {}) {
  return (): ConfigInput => ({
    server: { host: '127.0.0.1', port: 0, logLevel: 'info', ...extra.server },
    providers: { p: { family: 'openai', baseUrl: `${origin}/v1`, apiKey: 'p-key-0123456789', breaker: false, ...extra.provider } },
    routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'p' }], park: false, retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 20 } }, ...extra.route }],
  });
}

const CHAT = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'Summarise the incident report in one line, please: ' + 'x'.repeat(200) }] };
const encoders = { gzip: gzipSync, deflate: deflateSync, br: brotliCompressSync } as const;
type Coding = keyof typeof encoders;

/** A fetch for the SDK that compresses every JSON body it sends with `coding`, as a client trimming upload size does. */
function compressingFetch(coding: Coding, sent: Buffer[] = []): typeof fetch {
  return async (input, init) => {
    if (typeof init?.body !== 'string') return fetch(input, init);
    const plain = Buffer.from(init.body);
    sent.push(plain);
    const headers = new Headers(init.headers);
    headers.set('content-encoding', coding);
    return fetch(input, { ...init, headers, body: encoders[coding](plain) });
  };
}

const post = (url: string, body: NonNullable<RequestInit['body']>, headers: Record<string, string>, extra: RequestInit = {}) =>
  fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body, ...extra });

// ---------------------------------------------------------------------------------------------------------------

describe('compressed and chunked request bodies (Paths: gzip, deflate, br; bodyLimitBytes once decoded)', () => {
  it('a gzip body from the openai SDK is decoded once: the provider gets the plain JSON on the first attempt and on its retry', async () => {
    const up = await recorder((body, n) => (n === 1 ? busy() : answerWith('done')(body, n, '')));
    const s = await startStack({ config: oneProvider(up.origin) });
    const sent: Buffer[] = [];
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0, fetch: compressingFetch('gzip', sent) });

    const { data, response } = await client.chat.completions.create(CHAT).withResponse();
    expect(data.choices[0]!.message.content).toBe('done');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(up.got).toHaveLength(2);
    for (const g of up.got) {
      expect(g.headers['content-encoding']).toBeUndefined();
      expect(JSON.parse(g.raw.toString())).toEqual(JSON.parse(sent[0]!.toString()));
      if (g.headers['content-length'] !== undefined) expect(Number(g.headers['content-length'])).toBe(g.raw.length);
    }
    expect(up.got[1]!.raw.equals(up.got[0]!.raw)).toBe(true);
    expect(up.got[1]!.headers['x-retry-attempt']).toBe('1');
  });

  it.each(['deflate', 'br'] as const)('a %s body on a stream whose first attempt breaks before its first output: retried with the same decoded bytes, the stream whole', async (coding) => {
    const up = await recorder((_body, n) => (n === 1 ? { steps: [cc([delta({ role: 'assistant', content: '' })]), { destroy: true }] } : streamOf(['The ', 'deploy ', 'rolled ', 'back.'])));
    const s = await startStack({ config: oneProvider(up.origin) });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0, fetch: compressingFetch(coding) });

    let text = '';
    for await (const chunk of await client.chat.completions.create({ ...CHAT, stream: true })) text += chunk.choices[0]?.delta.content ?? '';
    expect(text).toBe('The deploy rolled back.');
    expect(up.got).toHaveLength(2);
    expect(up.got.map((g) => g.headers['content-encoding'])).toEqual([undefined, undefined]);
    expect(JSON.parse(up.got[0]!.raw.toString())).toMatchObject({ ...CHAT, stream: true });
    expect(up.got[1]!.raw.equals(up.got[0]!.raw)).toBe(true);
  });

  it('a chunked upload of unknown length (a gzip body streamed in pieces, no content-length) is read whole and retried whole', async () => {
    const up = await recorder((body, n) => (n === 1 ? busy() : answerWith('chunked ok')(body, n, '')));
    const s = await startStack({ config: oneProvider(up.origin) });
    const zipped = gzipSync(Buffer.from(JSON.stringify(CHAT)));
    const pieces = [zipped.subarray(0, 7), zipped.subarray(7, 40), zipped.subarray(40)];
    const body = new ReadableStream<Uint8Array>({
      async pull(controller) {
        const next = pieces.shift();
        if (next === undefined) return controller.close();
        await sleep(80);
        controller.enqueue(new Uint8Array(next));
      },
    });
    const res = await post(s.url, body, { 'content-encoding': 'gzip' }, { duplex: 'half' } as RequestInit);
    expect(res.status).toBe(200);
    expect(((await res.json()) as { choices: Array<{ message: { content: string } }> }).choices[0]!.message.content).toBe('chunked ok');
    expect(up.got).toHaveLength(2);
    for (const g of up.got) expect(JSON.parse(g.raw.toString())).toEqual(CHAT);
  });

  it('content codings are case-insensitive (RFC 9110 8.4.1): GZIP and Deflate are decoded like gzip and deflate', async () => {
    const up = await recorder(answerWith('ok'));
    const s = await startStack({ config: oneProvider(up.origin) });
    for (const [coding, encode] of [['GZIP', gzipSync], ['Deflate', deflateSync], ['Br', brotliCompressSync]] as const) {
      const res = await post(s.url, encode(Buffer.from(JSON.stringify(CHAT))), { 'content-encoding': coding });
      expect([coding, res.status]).toEqual([coding, 200]);
      await res.arrayBuffer();
    }
    expect(up.got).toHaveLength(3);
    for (const g of up.got) expect(JSON.parse(g.raw.toString())).toEqual(CHAT);
  });

  it('Expect: 100-continue with a gzip body: the body is asked for, decoded and answered (node:http, as a proxy sends it)', async () => {
    const up = await recorder(answerWith('continued'));
    const s = await startStack({ config: oneProvider(up.origin) });
    const zipped = gzipSync(Buffer.from(JSON.stringify(CHAT)));
    const agent = new HttpAgent({ keepAlive: false });
    const req = httpRequest(`${s.url}/v1/chat/completions`, {
      method: 'POST',
      agent,
      headers: { 'content-type': 'application/json', 'content-encoding': 'gzip', 'content-length': zipped.length, expect: '100-continue' },
    });
    let continued = false;
    req.on('continue', () => {
      continued = true;
      req.end(zipped);
    });
    req.flushHeaders();
    const [res] = (await once(req, 'response')) as [IncomingMessage];
    const parts: Buffer[] = [];
    for await (const d of res) parts.push(d as Buffer);
    agent.destroy();
    expect(continued).toBe(true);
    expect(res.statusCode).toBe(200);
    expect(JSON.parse(Buffer.concat(parts).toString()).choices[0].message.content).toBe('continued');
    expect(JSON.parse(up.got[0]!.raw.toString())).toEqual(CHAT);
  });

  it('what the gateway cannot read is the client\'s error in the OpenAI shape, x-should-retry: false, and nothing goes upstream', async () => {
    const up = await recorder(answerWith('never'));
    const s = await startStack({ config: oneProvider(up.origin, { server: { bodyLimitBytes: 100_000 } }) });
    const plain = Buffer.from(JSON.stringify(CHAT));
    const bomb = gzipSync(Buffer.from(JSON.stringify({ ...CHAT, messages: [{ role: 'user', content: 'a'.repeat(5_000_000) }] })));
    expect(bomb.length).toBeLessThan(100_000);
    const cases: Array<[string, NonNullable<RequestInit['body']>, Record<string, string>, number, string]> = [
      ['a gzip bomb (5 MB once decoded, under the limit compressed)', bomb, { 'content-encoding': 'gzip' }, 413, 'request_too_large'],
      ['broken gzip data', Buffer.concat([gzipSync(plain).subarray(0, 30), Buffer.from('garbage')]), { 'content-encoding': 'gzip' }, 400, 'invalid_body'],
      ['"gzip" on a body that is not compressed', plain, { 'content-encoding': 'gzip' }, 400, 'invalid_body'],
      ['zstd, which the gateway does not decode', plain, { 'content-encoding': 'zstd' }, 415, 'unsupported_media_type'],
      ['compress (LZW)', plain, { 'content-encoding': 'compress' }, 415, 'unsupported_media_type'],
    ];
    for (const [what, body, headers, status, code] of cases) {
      const res = await post(s.url, body, headers);
      expect([what, res.status]).toEqual([what, status]);
      expect([what, res.headers.get('x-should-retry')]).toEqual([what, 'false']);
      expect(res.headers.get('x-request-id')).toBe(res.headers.get('x-stormgate-request-id'));
      const e = expectOpenAIError(await res.json(), code);
      if (code === 'request_too_large') expect(e.message).toContain('100000');
    }
    expect(up.got).toHaveLength(0);
  });
});

// ---------------------------------------------------------------------------------------------------------------

describe('HTTP/1.1 connection reuse: pipelining, many streams on a few keep-alive connections, aborts mid-stream', () => {
  it('two requests pipelined on one socket get their two answers, in order, on that socket', async () => {
    const up = await recorder((body, n) => completion(`answer ${n}`, 'gpt-4o'));
    const s = await startStack({ config: oneProvider(up.origin) });
    const { port } = new URL(s.url);
    const one = JSON.stringify({ ...CHAT, messages: [{ role: 'user', content: 'first' }] });
    const two = JSON.stringify({ ...CHAT, messages: [{ role: 'user', content: 'second' }] });
    const head = (b: string, last: boolean) =>
      `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(b)}\r\n${last ? 'connection: close\r\n' : ''}\r\n${b}`;
    const sock = connect(Number(port), '127.0.0.1');
    await once(sock, 'connect');
    sock.write(head(one, false) + head(two, true));
    let raw = '';
    sock.on('data', (d: Buffer) => (raw += d.toString()));
    await once(sock, 'close');
    const statuses = [...raw.matchAll(/HTTP\/1\.1 (\d{3})/g)].map((m) => m[1]);
    expect(statuses).toEqual(['200', '200']);
    expect(raw.indexOf('answer 1')).toBeGreaterThan(0);
    expect(raw.indexOf('answer 2')).toBeGreaterThan(raw.indexOf('answer 1'));
    expect(up.got.map((g) => (JSON.parse(g.raw.toString()) as typeof CHAT).messages[0]!.content)).toEqual(['first', 'second']);
  });

  it('a keep-alive connection whose last request got 413 before its body came in still answers the next request: its 431 in the OpenAI shape, not a closed socket', async () => {
    const up = await recorder(answerWith('ok'));
    const s = await startStack({ config: oneProvider(up.origin, { server: { bodyLimitBytes: 50_000 } }) });
    const dispatcher = new Agent({ connections: 1, pipelining: 1 });
    try {
      const send = (headers: Record<string, string>, body: string) =>
        fetch(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body, dispatcher } as unknown as RequestInit);
      for (const [what, headers, body, status, code] of [
        ['headers over 16 KB', { 'x-padding': 'h'.repeat(20_000) }, JSON.stringify(CHAT), 431, 'headers_too_large'],
        ['a well-formed request', {}, JSON.stringify(CHAT), 200, undefined],
      ] as const) {
        const big = await send({}, JSON.stringify({ ...CHAT, pad: 'p'.repeat(200_000) }));
        expect(big.status).toBe(413);
        await big.arrayBuffer();
        const res = await send(headers, body).catch((e: unknown) => e as Error);
        expect([what, res instanceof Response ? res.status : String(res)]).toEqual([what, status]);
        if (code !== undefined && res instanceof Response) {
          expectOpenAIError(await res.json(), code);
          expect(res.headers.get('x-should-retry')).toBe('false');
        } else if (res instanceof Response) await res.arrayBuffer();
      }
    } finally {
      await dispatcher.close();
    }
  });

  it('24 streams over 3 keep-alive connections, every other one aborted mid-stream: the rest arrive whole, the provider sees each abort, the connections carry on', async () => {
    const s = await startStack({ faults: { stream: { chunks: 12, chunkDelayMs: 40 } }, provider: { breaker: false } });
    const dispatcher = new Agent({ connections: 3, pipelining: 1, keepAliveTimeout: 30_000 });
    const client = new OpenAI({
      baseURL: s.baseURL,
      apiKey: 'unused',
      maxRetries: 0,
      fetch: (url, init) => fetch(url, { ...init, dispatcher } as unknown as RequestInit),
    });
    try {
      const run = async (i: number) => {
        const ctrl = new AbortController();
        const stream = await client.chat.completions.create({ ...CHAT, stream: true }, { signal: ctrl.signal });
        let chunks = 0;
        let finish: string | null | undefined;
        try {
          for await (const c of stream) {
            if (c.choices[0]?.delta.content) chunks++;
            finish = c.choices[0]?.finish_reason ?? finish;
            if (i % 2 === 1 && chunks === 3) {
              // Stops reading, as a user who cancels does: a read after the abort can wait for ever in the client.
              ctrl.abort();
              break;
            }
          }
        } catch (err) {
          if (i % 2 === 0) throw err;
          expect((err as Error).name).toMatch(/Abort/);
        }
        return { i, chunks, finish };
      };
      const results = await Promise.all(Array.from({ length: 24 }, (_, i) => run(i)));
      for (const r of results.filter((r) => r.i % 2 === 0)) expect(r).toMatchObject({ chunks: 12, finish: 'stop' });
      for (const r of results.filter((r) => r.i % 2 === 1)) expect(r.chunks).toBe(3);
      // The gateway ends the aborted requests upstream: nothing left in flight at the mock, nor in the gateway's pool.
      const until = Date.now() + 5_000;
      const aborted = () => s.mock.requests().filter((r) => r.aborted).length;
      while (Date.now() < until && ((await metricSum(s, 'stormgate_pool_in_use{')) > 0 || aborted() < 12)) await sleep(50);
      expect(await metricSum(s, 'stormgate_pool_in_use{')).toBe(0);
      expect(s.mock.requests()).toHaveLength(24);
      expect(aborted()).toBe(12);
      // The same few connections serve the next burst.
      const again = await Promise.all(Array.from({ length: 6 }, () => client.chat.completions.create(CHAT)));
      expect(again.every((a) => a.choices[0]!.finish_reason === 'stop')).toBe(true);
    } finally {
      await dispatcher.close();
    }
  });
});

// ---------------------------------------------------------------------------------------------------------------

describe('the openai and @anthropic-ai/sdk clients mixed on routes to one Anthropic account', () => {
  const MODEL = 'claude-sonnet-4-6';
  /** The bundled mock as an Anthropic account, served on /v1/chat/completions (translated) and /v1/messages alike. */
  const bothFamilies = (opts: { breaker?: Record<string, unknown> | false; park?: false; maxAttempts?: number } = {}) => (mockUrl: string): ConfigInput => ({
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    providers: { claude: { family: 'anthropic', baseUrl: mockUrl, apiKey: TEST_KEY, breaker: opts.breaker ?? false } },
    routes: [
      { name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'claude' }], park: opts.park ?? false, retry: { maxAttempts: opts.maxAttempts ?? 1 } },
      { name: 'messages', match: { path: '/v1/messages' }, targets: [{ provider: 'claude' }], park: opts.park ?? false, retry: { maxAttempts: opts.maxAttempts ?? 1 } },
    ],
  });
  const clients = (s: Stack, maxRetries = 0) => ({
    openai: new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries }),
    anthropic: new Anthropic({ baseURL: s.url, apiKey: 'unused', maxRetries }),
  });
  const ask = { model: MODEL, max_tokens: 64, messages: [{ role: 'user' as const, content: 'Status of the rollout?' }] };

  it('both SDKs, streaming and not, side by side: each gets its own API, the account gets Anthropic requests with its own key only', async () => {
    const s = await startStack({ config: bothFamilies() });
    const { openai, anthropic } = clients(s);
    const [chat, chatText, msg, msgText] = await Promise.all([
      openai.chat.completions.create(ask),
      (async () => {
        let t = '';
        for await (const c of await openai.chat.completions.create({ ...ask, stream: true })) t += c.choices[0]?.delta.content ?? '';
        return t;
      })(),
      anthropic.messages.create(ask),
      anthropic.messages.stream(ask).finalText(),
    ]);
    expect(chat.object).toBe('chat.completion');
    expect(chat.choices[0]!.message.content!.length).toBeGreaterThan(0);
    expect(chatText.length).toBeGreaterThan(0);
    expect(msg.type).toBe('message');
    expect(msgText.length).toBeGreaterThan(0);
    const seen = s.mock.requests();
    expect(seen).toHaveLength(4);
    for (const r of seen) {
      expect(r.path).toBe('/v1/messages');
      expect(r.headers['x-api-key']).toBe(TEST_KEY);
      expect(r.headers.authorization).toBeUndefined();
    }
  });

  it("a hold-off one family's 429 started turns the other family away too, each in its SDK's shape, and both SDKs come back after it and succeed", async () => {
    const s = await startStack({ config: bothFamilies({ maxAttempts: 2 }) });
    s.mock.setFaults({ errors: [{ status: 429, times: 1, headers: { 'retry-after': '2' }, message: 'Number of request tokens has exceeded your per-minute rate limit' }] });
    const { openai, anthropic } = clients(s);
    const t0 = Date.now();
    // The openai SDK's call meets the 429 (a 2 s hint, no other target: it waits it out itself).
    const first = openai.chat.completions.create(ask);
    await sleep(300);
    const aErr = await anthropic.messages.create(ask).then(
      () => undefined,
      (e: unknown) => e as InstanceType<typeof Anthropic.APIError>,
    );
    expect(aErr).toBeInstanceOf(Anthropic.RateLimitError);
    expect(aErr!.status).toBe(429);
    expect(aErr!.error).toMatchObject({ type: 'error', error: { type: 'rate_limit_error', code: 'provider_held_off' } });
    expect(aErr!.headers?.get('x-should-retry')).toBe('true');
    const aWaitMs = Number(aErr!.headers?.get('retry-after-ms'));
    expect(aWaitMs).toBeGreaterThan(500);
    expect(aWaitMs).toBeLessThanOrEqual(2_400 + 1_000);
    expect(aErr!.requestID).toBe(aErr!.headers?.get('x-stormgate-request-id'));

    const oErr = await sdkError(openai.chat.completions.create(ask));
    expect(oErr.status).toBe(429);
    expectOpenAIError(oErr.error === undefined ? undefined : { error: oErr.error }, 'provider_held_off', oErr.type as string);
    expect(oErr.code).toBe('provider_held_off');
    expect(oErr.headers?.get('x-should-retry')).toBe('true');
    expect(Number(oErr.headers?.get('retry-after-ms'))).toBeGreaterThan(300);

    expect((await first).choices[0]!.finish_reason).toBe('stop');
    expect(Date.now() - t0).toBeGreaterThanOrEqual(1_900);
    // At their default retries both SDKs wait what they were told and are answered.
    const patient = clients(s, 2);
    s.mock.setFaults({ errors: [{ status: 429, times: 1, headers: { 'retry-after': '1' } }] });
    const starter = patient.anthropic.messages.create(ask);
    await sleep(200);
    const [a, o] = await Promise.all([patient.anthropic.messages.create(ask), patient.openai.chat.completions.create(ask)]);
    expect(a.type).toBe('message');
    expect(o.choices[0]!.finish_reason).toBe('stop');
    expect((await starter).type).toBe('message');
    // The provider saw one request per call and the single 429: no retry storm from either SDK.
    expect(s.mock.stats().byStatus['429']).toBe(2);
  });

  it('a breaker opened by Anthropic-SDK traffic (529s on /v1/messages) answers openai-SDK chat calls circuit_open with a retry-after, and vice versa in the Anthropic shape', async () => {
    const s = await startStack({ config: bothFamilies({ breaker: { consecutiveFailures: 3, openS: 30 } }) });
    s.mock.setFaults({ errors: [{ status: 529 }] });
    const { openai, anthropic } = clients(s);
    for (let i = 0; i < 3; i++) {
      const err = await anthropic.messages.create(ask).then(
        () => undefined,
        (e: unknown) => e as InstanceType<typeof Anthropic.APIError>,
      );
      expect(err?.status).toBe(529);
    }
    // The run of failures opens it once 250 ms pass with no success.
    await sleep(400);
    await anthropic.messages.create(ask).catch(() => undefined);
    const upstreamBefore = s.mock.requests().length;
    const oErr = await sdkError(openai.chat.completions.create(ask));
    expect(oErr.status).toBe(503);
    expect(oErr.code).toBe('circuit_open');
    expect(oErr.headers?.get('x-should-retry')).toBe('false');
    expect(Number(oErr.headers?.get('retry-after'))).toBeGreaterThan(0);
    expect(oErr.requestID).toBe(oErr.headers?.get('x-stormgate-request-id'));
    const aErr = await anthropic.messages.create(ask).then(
      () => undefined,
      (e: unknown) => e as InstanceType<typeof Anthropic.APIError>,
    );
    expect(aErr?.status).toBe(503);
    expect(aErr?.error).toMatchObject({ type: 'error', error: { type: 'api_error', code: 'circuit_open' } });
    expect(aErr?.requestID).toBe(aErr?.headers?.get('x-stormgate-request-id'));
    expect(s.mock.requests().length).toBe(upstreamBefore);
  });

  it("the gateway's own 404s for a model no route serves: each SDK's error names the gateway's request id, in its own shape", async () => {
    const s = await startStack({
      config: (mockUrl) => {
        const c = bothFamilies()(mockUrl);
        for (const r of c.routes) r.match = { ...r.match, models: ['claude-*'] };
        return c;
      },
    });
    const { openai, anthropic } = clients(s);
    const oErr = await sdkError(openai.chat.completions.create({ ...ask, model: 'gpt-4o' }));
    expect([oErr.status, oErr.code]).toEqual([404, 'model_not_found']);
    expect(oErr.requestID).toBe(oErr.headers?.get('x-stormgate-request-id'));
    const aErr = await anthropic.messages.create({ ...ask, model: 'gpt-4o' }).then(
      () => undefined,
      (e: unknown) => e as InstanceType<typeof Anthropic.APIError>,
    );
    expect(aErr).toBeInstanceOf(Anthropic.NotFoundError);
    expect(aErr?.error).toMatchObject({ type: 'error', error: { type: 'not_found_error', code: 'model_not_found' } });
    expect(aErr?.requestID).toBe(aErr?.headers?.get('x-stormgate-request-id'));
    expect(s.mock.requests()).toHaveLength(0);
  });
});

// ---------------------------------------------------------------------------------------------------------------

describe("a provider's window of 429s told by x-ratelimit-remaining-* / x-ratelimit-reset-* (Go durations)", () => {
  const window429 = (resetHeader: string, remainingHeader: string, remaining: string, reset: string) =>
    rateLimited({ [remainingHeader]: remaining, [resetHeader]: reset, 'x-ratelimit-limit-requests': '500' });

  it('remaining-requests 0 and reset-requests 600ms: the retry waits out the reset (x U(1, 1.2)) and succeeds; a request sent meanwhile is not held off', async () => {
    const up = await recorder((body, n) => (n === 1 ? window429('x-ratelimit-reset-requests', 'x-ratelimit-remaining-requests', '0', '600ms') : answerWith('ok')(body, n, '')));
    const s = await startStack({ config: oneProvider(up.origin) });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 });
    const t0 = Date.now();
    const first = client.chat.completions.create(CHAT).withResponse();
    await sleep(150);
    const second = await client.chat.completions.create(CHAT).withResponse();
    expect(second.response.headers.get('x-stormgate-attempts')).toBe('1');
    const { data, response } = await first;
    expect(data.choices[0]!.message.content).toBe('ok');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(up.got).toHaveLength(3);
    // Arrival order: the 429, the second call (no hold-off), then the retry after 600-720 ms.
    const retry = up.got.find((g) => g.headers['x-retry-attempt'] === '1')!;
    expect(up.got[1]!.headers['x-retry-attempt']).toBeUndefined();
    const waited = retry.at - up.got[0]!.at;
    expect(waited).toBeGreaterThanOrEqual(580);
    expect(waited).toBeLessThan(2_500);
    expect(Date.now() - t0).toBeLessThan(5_000);
  });

  it('a reset for a limit whose remaining is not 0 is no hint: the jittered backoff decides, not the 5s reset', async () => {
    const up = await recorder((body, n) => (n === 1 ? window429('x-ratelimit-reset-requests', 'x-ratelimit-remaining-requests', '42', '5s') : answerWith('ok')(body, n, '')));
    const s = await startStack({ config: oneProvider(up.origin) });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 });
    const t0 = Date.now();
    const { response } = await client.chat.completions.create(CHAT).withResponse();
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(Date.now() - t0).toBeLessThan(2_500);
  });

  it('reset-tokens 6m0s with remaining-tokens 0 is over maxWaitHintMs: one attempt, the client told retry-after ~360 s with x-should-retry: false', async () => {
    const up = await recorder(() => rateLimited({ 'x-ratelimit-remaining-tokens': '0', 'x-ratelimit-reset-tokens': '6m0s', 'x-ratelimit-remaining-requests': '499', 'x-ratelimit-reset-requests': '120ms' }));
    const s = await startStack({ config: oneProvider(up.origin) });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 2 });
    const t0 = Date.now();
    const err = await sdkError(client.chat.completions.create(CHAT));
    expect(Date.now() - t0).toBeLessThan(3_000);
    expect(err.status).toBe(429);
    expect(err.code).toBe('rate_limit_exceeded');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    const retryAfter = Number(err.headers?.get('retry-after'));
    expect(retryAfter).toBeGreaterThanOrEqual(360);
    expect(retryAfter).toBeLessThanOrEqual(432 + 1);
    // Neither the gateway nor the SDK (told no) sent it again.
    expect(up.got).toHaveLength(1);
    // No hold-off from a reset header: the next call goes upstream.
    await client.chat.completions.create(CHAT).catch(() => undefined);
    expect(up.got).toHaveLength(2);
  });

  it('a window of 429s 1.5 s long under 20 concurrent calls: each waits out its own reset, all succeed after the window, at most two upstream attempts each', async () => {
    let windowEnd = 0;
    const goDuration = (ms: number) => (ms >= 1000 ? `${(ms / 1000).toFixed(3)}s` : `${Math.max(1, Math.round(ms))}ms`);
    const up = await recorder((body, n) => {
      const left = windowEnd - Date.now();
      if (left > 0) return window429('x-ratelimit-reset-requests', 'x-ratelimit-remaining-requests', '0', goDuration(left));
      return answerWith(`ok ${n}`)(body, n, '');
    });
    // A reset header starts no hold-off, so these retries are the budget's to allow: one that lets them all.
    const s = await startStack({ config: oneProvider(up.origin, { route: { budget: { ratio: 1, windowS: 10, minRetriesPerSecond: 100 } } }) });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 });
    windowEnd = Date.now() + 1_500;
    const calls = await Promise.all(
      Array.from({ length: 20 }, async (_, i) => {
        await sleep(i * 30);
        const { data, response } = await client.chat.completions.create(CHAT).withResponse();
        return { content: data.choices[0]!.message.content!, attempts: Number(response.headers.get('x-stormgate-attempts')), done: Date.now() };
      }),
    );
    for (const c of calls) {
      expect(c.content).toMatch(/^ok /);
      expect(c.attempts).toBe(2);
      expect(c.done).toBeGreaterThanOrEqual(windowEnd - 20);
    }
    expect(up.got.length).toBe(40);
    // Every retry arrived after the window closed (its reset x U(1, 1.2) waited out), none inside it.
    for (const g of up.got.filter((x) => x.headers['x-retry-attempt'] === '1')) expect(g.at).toBeGreaterThanOrEqual(windowEnd - 20);
  });
});

// ---------------------------------------------------------------------------------------------------------------

describe('"What the client sees" on every error the gateway makes', () => {
  /**
   * One gateway that can be driven to each of its own errors: client keys (one limited to a request a minute), a route
   * by model to an upstream that misbehaves by model name, one to a provider nobody listens for, one with a short
   * response timer.
   */
  async function everythingGateway() {
    const up = await recorder((body) => {
      switch (body.model) {
        case 'auth-broken':
          return json(401, { error: { message: 'Incorrect API key provided: p-key-***6789.', type: 'invalid_request_error', param: null, code: 'invalid_api_key' } });
        case 'moved':
          return { status: 301, headers: { location: 'https://api.example.com/v1/chat/completions' }, steps: [''] };
        case 'portal':
          return { status: 200, headers: { 'content-type': 'text/html' }, steps: ['<html><body>Sign in to the Wi-Fi</body></html>'] };
        case 'slow':
          return { ...completion('late', 'slow'), steps: [3_000, JSON.stringify({})] };
        case 'busy-long':
          return rateLimited({ 'retry-after': '30' });
        default:
          return completion('ok', String(body.model));
      }
    });
    const deadPort = await freePort();
    const s = await startStack({
      config: () => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info', bodyLimitBytes: 50_000 },
        auth: { keys: { team: 'sk-team-0123456789', tiny: 'sk-tiny-0123456789' }, limits: { tiny: { requestsPerMinute: 6, burst: 1 } } },
        providers: {
          p: { family: 'openai', baseUrl: `${up.origin}/v1`, apiKey: 'p-key-0123456789', breaker: false, timeouts: { responseMs: 400 } },
          dead: { family: 'openai', baseUrl: `http://127.0.0.1:${deadPort}/v1`, apiKey: 'dead-key-0123456789', breaker: false },
        },
        routes: [
          { name: 'dead', match: { path: '/v1/chat/completions', models: ['dead'] }, targets: [{ provider: 'dead' }], park: false, retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 10 } } },
          { name: 'chat', match: { path: '/v1/chat/completions', models: ['gpt-4o', 'auth-broken', 'moved', 'portal', 'slow', 'busy-long'] }, targets: [{ provider: 'p' }], park: false, retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 10 }, maxWaitHintMs: 1_000 } },
        ],
      }),
    });
    return { s, up };
  }

  interface Case {
    what: string;
    status: number;
    code: string;
    send: (url: string) => Promise<Response>;
  }
  const TEAM = { authorization: 'Bearer sk-team-0123456789' };
  const chat = (model: string, headers: Record<string, string> = {}) => (url: string) => post(url, JSON.stringify({ ...CHAT, model }), { ...TEAM, ...headers });
  const cases: Case[] = [
    { what: 'no client key', status: 401, code: 'invalid_api_key', send: (url) => post(url, JSON.stringify(CHAT), {}) },
    { what: 'a body that is not JSON', status: 400, code: 'invalid_json', send: (url) => post(url, '{"model": "gpt-4o",', TEAM) },
    { what: 'a JSON list', status: 400, code: 'invalid_body', send: (url) => post(url, '[1,2]', TEAM) },
    { what: 'text/plain', status: 415, code: 'unsupported_media_type', send: (url) => post(url, JSON.stringify(CHAT), { ...TEAM, 'content-type': 'text/plain' }) },
    { what: 'a body over bodyLimitBytes', status: 413, code: 'request_too_large', send: (url) => post(url, JSON.stringify({ ...CHAT, pad: 'p'.repeat(60_000) }), TEAM) },
    { what: 'a timeout header that is no number', status: 400, code: 'bad_request', send: chat('gpt-4o', { 'x-stormgate-timeout-ms': 'soon' }) },
    { what: 'headers over 16 KB', status: 431, code: 'headers_too_large', send: chat('gpt-4o', { 'x-padding': 'h'.repeat(20_000) }) },
    { what: 'an unknown path', status: 404, code: 'unknown_url', send: (url) => fetch(`${url}/v1/assistants`, { method: 'POST', headers: { ...TEAM, 'content-type': 'application/json' }, body: '{}' }) },
    { what: 'GET on a managed path', status: 405, code: 'method_not_allowed', send: (url) => fetch(`${url}/v1/chat/completions`, { headers: TEAM }) },
    { what: 'a model no route serves', status: 404, code: 'model_not_found', send: chat('gpt-3.5-turbo') },
    { what: 'an Idempotency-Key of 300 characters', status: 400, code: 'invalid_idempotency_key', send: chat('gpt-4o', { 'idempotency-key': 'k'.repeat(300) }) },
    { what: "a provider refusing the gateway's key", status: 502, code: 'upstream_auth_error', send: chat('auth-broken') },
    { what: 'a provider redirecting', status: 502, code: 'upstream_redirect', send: chat('moved') },
    { what: 'a provider nobody listens for', status: 502, code: 'upstream_unavailable', send: chat('dead') },
    { what: 'a captive portal answering 200 HTML', status: 502, code: 'upstream_bad_response', send: chat('portal') },
    { what: 'a provider slower than responseMs', status: 504, code: 'upstream_timeout', send: chat('slow') },
    { what: "the client's own deadline", status: 504, code: 'deadline_exceeded', send: chat('slow', { 'x-stormgate-timeout-ms': '300' }) },
  ];

  it('each: the OpenAI shape (exactly four fields), x-should-retry, x-request-id = x-stormgate-request-id, JSON content-type, and nothing upstream for what the gateway refused itself', async () => {
    const { s, up } = await everythingGateway();
    for (const c of cases) {
      const before = up.got.length;
      const res = await c.send(s.url).catch((e: unknown) => {
        throw new Error(`${c.what}: ${String(e)}`);
      });
      const body = (await res.json()) as { error: Record<string, unknown> };
      expect([c.what, res.status, body.error?.code]).toEqual([c.what, c.status, c.code]);
      expect(Object.keys(body.error).sort()).toEqual(['code', 'message', 'param', 'type']);
      expect(typeof body.error.message).toBe('string');
      expect([c.what, res.headers.get('content-type')]).toEqual([c.what, expect.stringMatching(/^application\/json/)]);
      expect([c.what, res.headers.get('x-should-retry')]).toEqual([c.what, 'false']);
      expect(res.headers.get('retry-after')).toBeNull();
      const id = res.headers.get('x-stormgate-request-id');
      expect(id).toBeTruthy();
      expect([c.what, res.headers.get('x-request-id')]).toEqual([c.what, id]);
      if (c.status < 500) expect([c.what, up.got.length]).toEqual([c.what, before]);
      // The provider's key never reaches the client, whatever the provider said.
      expect(JSON.stringify(body)).not.toContain('p-key-0123456789');
    }
  });

  it("the errors that invite a client back carry x-should-retry: true with retry-after-ms and retry-after that agree; the provider's long hint is told, not invited", async () => {
    const { s, up } = await everythingGateway();
    const tinyAsk = () => post(s.url, JSON.stringify(CHAT), { authorization: 'Bearer sk-tiny-0123456789' });
    expect((await tinyAsk()).status).toBe(200);
    const limited = await tinyAsk();
    expectOpenAIError(await limited.json(), 'client_rate_limited', 'rate_limit_error');
    const inviteds: Response[] = [limited];

    // The provider's 30 s retry-after is over maxWaitHintMs (1 s): told to the client with x-should-retry: true (<= 60 s).
    const told = await chat('busy-long')(s.url);
    expect(told.status).toBe(429);
    expect(((await told.json()) as { error: { code: string } }).error.code).toBe('rate_limit_exceeded');
    inviteds.push(told);
    // The hold-off it started turns the next one away without going upstream.
    const before = up.got.length;
    const held = await chat('busy-long')(s.url);
    expectOpenAIError(await held.json(), 'provider_held_off', 'rate_limit_error');
    expect(up.got.length).toBe(before);
    inviteds.push(held);

    for (const res of inviteds) {
      expect(res.status).toBe(429);
      expect(res.headers.get('x-should-retry')).toBe('true');
      const ms = Number(res.headers.get('retry-after-ms'));
      const sec = Number(res.headers.get('retry-after'));
      expect(ms).toBeGreaterThan(0);
      expect(ms).toBeLessThanOrEqual(60_000 + 12_000);
      expect(Math.abs(sec - Math.ceil(ms / 1000))).toBeLessThanOrEqual(1);
    }
    const heldMs = Number(held.headers.get('retry-after-ms'));
    expect(heldMs).toBeGreaterThan(25_000);
    expect(heldMs).toBeLessThanOrEqual(30_000 * 1.2 + 1_000 + 500);
  });

  it('on /v1/messages the same errors come in the shape both SDKs read: "type": "error", the Anthropic type, the code unchanged', async () => {
    const s = await startStack({
      config: (mockUrl) => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info', bodyLimitBytes: 50_000 },
        providers: { claude: { family: 'anthropic', baseUrl: mockUrl, apiKey: TEST_KEY, breaker: false, timeouts: { responseMs: 300 } } },
        routes: [{ name: 'messages', match: { path: '/v1/messages', models: ['claude-*'] }, targets: [{ provider: 'claude' }], park: false, retry: { maxAttempts: 1 } }],
      }),
    });
    s.mock.setFaults({ models: { 'claude-slow': { latencyMs: 3_000 } } });
    const msg = (body: unknown, headers: Record<string, string> = {}) =>
      fetch(`${s.url}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01', ...headers }, body: typeof body === 'string' ? body : JSON.stringify(body) });
    const base = { model: 'claude-sonnet-4-6', max_tokens: 16, messages: [{ role: 'user', content: 'hi' }] };
    const cases: Array<[string, Promise<Response>, number, string, string]> = [
      ['not JSON', msg('{"model":'), 400, 'invalid_json', 'invalid_request_error'],
      ['too large', msg({ ...base, pad: 'p'.repeat(60_000) }), 413, 'request_too_large', 'request_too_large'],
      ['unknown model', msg({ ...base, model: 'gpt-4o' }), 404, 'model_not_found', 'not_found_error'],
      ['response timer', msg({ ...base, model: 'claude-slow' }), 504, 'upstream_timeout', 'timeout_error'],
      ['deadline', msg({ ...base, model: 'claude-slow' }, { 'x-stormgate-timeout-ms': '250' }), 504, 'deadline_exceeded', 'timeout_error'],
    ];
    for (const [what, pending, status, code, anthropicType] of cases) {
      const res = await pending;
      const body = (await res.json()) as { type: string; error: Record<string, unknown> };
      expect([what, res.status]).toEqual([what, status]);
      expect([what, body.type, body.error.type, body.error.code]).toEqual([what, 'error', anthropicType, code]);
      expect(typeof body.error.message).toBe('string');
      expect(res.headers.get('x-should-retry')).toBe('false');
      expect(res.headers.get('x-request-id')).toBe(res.headers.get('x-stormgate-request-id'));
    }
  });
});
