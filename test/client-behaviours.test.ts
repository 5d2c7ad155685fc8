// What clients do to the HTTP server itself: hold connections open (idle, never sending a request, or stalled half-way
// through a body) while the gateway shuts down, and send an `expect` header. Raw sockets, because fetch and the SDKs
// never do the first on purpose.
import { once } from 'node:events';
import { request, type IncomingMessage } from 'node:http';
import { connect, type Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { defaultConfig, startStack, type Stack, type StackOptions } from './helpers/stack.ts';
import { expectOpenAIError } from './helpers/openai-error.ts';

/** Generous for a loaded two-core machine; without the sweep, close() waits for the client, i.e. forever. */
const PROMPTLY_MS = 3_000;
const GRACE_MS = 600;

let stack: Stack | undefined;
let closing: Promise<unknown> | undefined;
const sockets: Socket[] = [];
afterEach(async () => {
  // Whatever a test left open is let go first, so a close() that hung (the bug) can finish; fetch's own keep-alive
  // connections are not in `sockets`.
  for (const s of sockets.splice(0)) s.destroy();
  if (closing) stack?.gateway.server.closeAllConnections();
  await (closing ?? stack?.gateway.close());
  await stack?.mock.close();
  stack = closing = undefined;
});

async function start(opts: StackOptions = {}): Promise<Stack> {
  stack = await startStack(opts);
  return stack;
}

async function socketTo(s: Stack): Promise<Socket> {
  const socket = connect(Number(new URL(s.url).port), '127.0.0.1');
  sockets.push(socket);
  await once(socket, 'connect');
  return socket;
}

/** A keep-alive connection that has had one request answered and stays open. */
async function idleKeepAlive(s: Stack): Promise<Socket> {
  const socket = await socketTo(s);
  socket.write('GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n');
  await once(socket, 'data');
  return socket;
}

/** How long `work` took in ms, or Infinity when it had not finished after `boundMs`. */
async function timed(work: Promise<unknown>, boundMs = PROMPTLY_MS): Promise<number> {
  const started = Date.now();
  const done = await Promise.race([work.then(() => true), sleep(boundMs, false)]);
  return done ? Date.now() - started : Infinity;
}

async function readAll(body: ReadableStream<Uint8Array>): Promise<string> {
  let text = '';
  for await (const chunk of body) text += new TextDecoder().decode(chunk);
  return text;
}

describe('shutting down with clients holding connections open', () => {
  it('close() finishes promptly beside a connection that never sent a request and an idle keep-alive one', async () => {
    const s = await start();
    await socketTo(s);
    await idleKeepAlive(s);
    closing = s.gateway.close();
    expect(await timed(closing)).toBeLessThan(PROMPTLY_MS);
  });

  it('close() waits for a stream in flight, then finishes promptly although its keep-alive connection stays open', async () => {
    const s = await start({ faults: { stream: { chunks: 6, chunkDelayMs: 100 } } });
    const res = await fetch(`${s.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true }),
    });
    closing = s.gateway.close();
    // The stream is not cut by the close: it completes.
    expect((await readAll(res.body!)).trimEnd().endsWith('data: [DONE]')).toBe(true);
    expect(await timed(closing)).toBeLessThan(PROMPTLY_MS);
  });

  it('a drain with only idle connections left ends without waiting out graceMs', async () => {
    const s = await start({ config: (url) => ({ ...defaultConfig(url), drain: { preStopMs: 0, graceMs: 20_000 } }) });
    await socketTo(s);
    await idleKeepAlive(s);
    const drained = s.gateway.drain();
    closing = drained;
    expect(await timed(drained)).toBeLessThan(PROMPTLY_MS);
    expect(s.logs.join('')).not.toContain('grace period over');
  });
});

describe('expect', () => {
  const body = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });

  it('answers an expectation other than 100-continue with an OpenAI-shaped 417 expectation_failed, and closes', async () => {
    const s = await start();
    const socket = await socketTo(s);
    let out = '';
    socket.on('data', (d: Buffer) => (out += d.toString()));
    socket.write(
      `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n` +
        'expect: something-else\r\nx-request-id: req-expect-1\r\n\r\n',
    );
    // The gateway closes the connection itself: the body the client holds back is never read.
    await Promise.race([once(socket, 'close'), sleep(PROMPTLY_MS)]);
    expect(socket.readableEnded).toBe(true);
    const [statusLine, ...rest] = out.split('\r\n');
    expect(statusLine).toBe('HTTP/1.1 417 Expectation Failed');
    const headers = rest.slice(0, rest.indexOf('')).map((l) => l.toLowerCase());
    expect(headers).toEqual(expect.arrayContaining(['content-type: application/json', 'connection: close', 'x-should-retry: false', 'x-request-id: req-expect-1']));
    const e = expectOpenAIError(JSON.parse(out.slice(out.indexOf('\r\n\r\n') + 4)), 'expectation_failed');
    expect(e.message).toContain('something-else');
    expect(s.mock.stats().total).toBe(0);
  });

  it('still answers 100 Continue to expect: 100-continue (curl sends it for bodies over 1 KB) and serves the request', async () => {
    const s = await start();
    const req = request(`${s.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), expect: '100-continue' },
    });
    // Node's client holds the body back until the server's 100 Continue, as curl does (for up to a second).
    let continued = false;
    req.once('continue', () => {
      continued = true;
      req.end(body);
    });
    const [res] = (await once(req, 'response')) as [IncomingMessage];
    expect(continued).toBe(true);
    expect(res.statusCode).toBe(200);
    expect((JSON.parse(await text(res)) as { object: string }).object).toBe('chat.completion');
  });
});

async function text(res: IncomingMessage): Promise<string> {
  let out = '';
  for await (const chunk of res) out += String(chunk);
  return out;
}

const BODY = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });

interface Stalled {
  socket: Socket;
  /** Everything the gateway wrote to the connection. */
  received(): string;
  /** Resolves once the gateway has closed the connection (or the client has), with whether it did within `ms`. */
  closedWithin(ms: number): Promise<boolean>;
}

/**
 * A request whose headers promise `length` bytes of body, of which only `sent` come; resolves once the gateway has
 * seen the request (its body is then being read).
 */
async function stalledRequest(s: Stack, path = '/v1/chat/completions', opts: { length?: number; sent?: string; id?: string; method?: string } = {}): Promise<Stalled> {
  const socket = connect(Number(new URL(s.url).port), '127.0.0.1');
  sockets.push(socket);
  await once(socket, 'connect');
  let out = '';
  socket.on('data', (d: Buffer) => (out += d.toString()));
  const closed = once(socket, 'close').then(() => true);
  const seen = once(s.gateway.server, 'request');
  socket.write(
    `${opts.method ?? 'POST'} ${path} HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: ${opts.length ?? 1000}\r\n` +
      `x-request-id: ${opts.id ?? 'stalled-1'}\r\n\r\n${opts.sent ?? '{"model":"'}`,
  );
  await seen;
  // The first bytes of the body are in, and read: the rest never comes.
  await sleep(50);
  return { socket, received: () => out, closedWithin: (ms) => Promise.race([closed, sleep(ms, false)]) };
}

/** The status line, lower-cased headers and parsed JSON body of one HTTP answer read off a raw socket. */
function parseAnswer(raw: string): { statusLine: string; headers: string[]; body: unknown } {
  const end = raw.indexOf('\r\n\r\n');
  const [statusLine, ...headers] = raw.slice(0, end).split('\r\n');
  return { statusLine: statusLine!, headers: headers.map((h) => h.toLowerCase()), body: JSON.parse(raw.slice(end + 4)) };
}

/** close() with a request stalled on `path`: it must end promptly and close the connection; resolves what the client got. */
async function closeWithStalled(s: Stack, path: string, id: string): Promise<string> {
  const stalled = await stalledRequest(s, path, { id });
  closing = s.gateway.close();
  expect(await timed(closing)).toBeLessThan(PROMPTLY_MS);
  expect(await stalled.closedWithin(PROMPTLY_MS)).toBe(true);
  return stalled.received();
}

function expectDrainingAnswer(raw: string, requestId: string): void {
  const { statusLine, headers, body } = parseAnswer(raw);
  expect(statusLine).toBe('HTTP/1.1 503 Service Unavailable');
  expect(headers).toEqual(expect.arrayContaining(['connection: close', 'x-should-retry: true', `x-request-id: ${requestId}`, 'content-type: application/json; charset=utf-8']));
  expectOpenAIError(body, 'gateway_draining', 'server_error');
}

describe('a client stalled half-way through its body while the gateway shuts down', () => {
  it('close() answers it 503 gateway_draining at once and closes its connection, without waiting for the rest', async () => {
    const s = await start();
    expectDrainingAnswer(await closeWithStalled(s, '/v1/chat/completions', 'stalled-close'), 'stalled-close');
    // Logged once, as the 503 it got; nothing went upstream.
    const lines = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.reqId === 'stalled-close');
    expect(lines.map((l) => [l.msg, l.status])).toEqual([['request', 503]]);
    // Nothing else said about it: no warning of an answer sent twice when the body's read ends with the connection.
    expect(s.logs.filter((l) => (JSON.parse(l) as { level: number }).level >= 40)).toEqual([]);
    expect(s.mock.stats().total).toBe(0);
  });

  it('a drain gives it the grace period, then answers it 503 gateway_draining and ends without waiting for it', async () => {
    const s = await start({ config: (url) => ({ ...defaultConfig(url), drain: { preStopMs: 0, graceMs: GRACE_MS } }) });
    const stalled = await stalledRequest(s, '/v1/chat/completions', { id: 'stalled-drain' });
    const started = Date.now();
    const drained = s.gateway.drain();
    closing = drained;
    // Not cut while the grace period lasts: the body may still come.
    await sleep(GRACE_MS / 2);
    expect(stalled.received()).toBe('');
    expect(await timed(drained, GRACE_MS + PROMPTLY_MS)).toBeLessThan(GRACE_MS + PROMPTLY_MS);
    expect(Date.now() - started).toBeGreaterThanOrEqual(GRACE_MS - 50);
    expect(await stalled.closedWithin(PROMPTLY_MS)).toBe(true);
    expectDrainingAnswer(stalled.received(), 'stalled-drain');
  });

  it('serves a body that arrives whole within the drain\'s grace period as usual', async () => {
    const s = await start({ config: (url) => ({ ...defaultConfig(url), drain: { preStopMs: 0, graceMs: 5_000 } }) });
    const half = BODY.slice(0, 10);
    const stalled = await stalledRequest(s, '/v1/chat/completions', { length: Buffer.byteLength(BODY), sent: half, id: 'late-body' });
    const drained = s.gateway.drain();
    closing = drained;
    await sleep(200);
    stalled.socket.write(BODY.slice(10));
    expect(await timed(drained, 5_000)).toBeLessThan(5_000);
    // Answered during the drain with Connection: close: the gateway closes the connection once the answer is written,
    // and the drain can end before the client has read it all.
    expect(await stalled.closedWithin(PROMPTLY_MS)).toBe(true);
    const { statusLine, headers, body } = parseAnswer(stalled.received());
    expect(statusLine).toBe('HTTP/1.1 200 OK');
    expect(headers).toContain('connection: close');
    expect((body as { object: string }).object).toBe('chat.completion');
  });

  it('close() answers a request on a path no route serves the same way: its body was being read too', async () => {
    const s = await start();
    expectDrainingAnswer(await closeWithStalled(s, '/v1/nothing-here', 'stalled-404'), 'stalled-404');
  });

  it('close() closes a connection whose request was answered while the rest of its body never came', async () => {
    const s = await start();
    // A wrong method gets its 405 before the body is read; Node then waits for the rest of it to free the connection.
    const stalled = await stalledRequest(s, '/v1/chat/completions', { method: 'PUT' });
    await vi.waitFor(() => expect(stalled.received()).toMatch(/^HTTP\/1\.1 405/), { timeout: 2_000, interval: 10 });
    closing = s.gateway.close();
    expect(await timed(closing)).toBeLessThan(PROMPTLY_MS);
    expect(await stalled.closedWithin(PROMPTLY_MS)).toBe(true);
  });

  it('close() cuts a passthrough upload that stopped half-way: its body goes to the provider as it comes, so it cannot be answered', async () => {
    const s = await start({ config: (url) => ({ ...defaultConfig(url), passthrough: { provider: 'mock', paths: ['/v1/files'], methods: ['POST'] } }) });
    expect(await closeWithStalled(s, '/v1/files', 'stalled-upload')).toBe('');
  });
});
