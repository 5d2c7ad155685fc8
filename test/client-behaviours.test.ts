// What clients do to the HTTP server itself: hold connections open (idle, or never sending a request) while the
// gateway shuts down, and send an `expect` header. Raw sockets, because fetch and the SDKs never do the first on purpose.
import { once } from 'node:events';
import { request, type IncomingMessage } from 'node:http';
import { connect, type Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it } from 'vitest';
import { defaultConfig, startStack, type Stack, type StackOptions } from './helpers/stack.ts';
import { expectOpenAIError } from './helpers/openai-error.ts';

/** Generous for a loaded two-core machine; without the sweep, close() waits for the client, i.e. forever. */
const PROMPTLY_MS = 3_000;

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

/** How long `work` took in ms, or Infinity when it had not finished after PROMPTLY_MS. */
async function timed(work: Promise<unknown>): Promise<number> {
  const started = Date.now();
  const done = await Promise.race([work.then(() => true), sleep(PROMPTLY_MS, false)]);
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
