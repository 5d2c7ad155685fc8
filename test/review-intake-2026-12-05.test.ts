// Adversarial review of the HTTP edge (2026-12-05): what a hostile or sloppy client sends before the pipeline (content
// codings on requests whose body is never read, odd methods), over raw sockets, as third-party test suites do.
import { connect } from 'node:net';
import { describe, expect, it } from 'vitest';
import { useStacks } from './helpers/stack.ts';
import { expectOpenAIError } from './helpers/openai-error.ts';

const startStack = useStacks();

/** Writes `bytes` on a connection of its own and reads until the gateway closes it (or `waitMs` pass). */
function exchange(url: string, bytes: Buffer): Promise<{ status: number; head: string; body: string }> {
  const { port } = new URL(url);
  return new Promise((resolve) => {
    const socket = connect(Number(port), '127.0.0.1');
    let text = '';
    socket.on('data', (d: Buffer) => (text += d.toString('latin1')));
    socket.on('error', () => undefined);
    const done = () => {
      const [head = '', ...rest] = text.split('\r\n\r\n');
      resolve({ status: Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1] ?? 0), head, body: rest.join('\r\n\r\n') });
    };
    const timer = setTimeout(() => socket.destroy(), 5_000);
    socket.on('close', () => {
      clearTimeout(timer);
      done();
    });
    socket.write(bytes);
  });
}

/** A request as written, `connection: close` so the gateway ends the exchange. */
function request(method: string, path: string, headers: Record<string, string>, body: string | Buffer = ''): Buffer {
  const bytes = Buffer.isBuffer(body) ? body : Buffer.from(body);
  const all = { host: '127.0.0.1', 'content-length': String(bytes.length), connection: 'close', ...headers };
  const head = `${method} ${path} HTTP/1.1\r\n${Object.entries(all).map(([k, v]) => `${k}: ${v}\r\n`).join('')}\r\n`;
  return Buffer.concat([Buffer.from(head, 'latin1'), bytes]);
}

describe('a compressed body the gateway never reads', () => {
  it('that is not what its content-encoding says is answered, and the gateway lives on (it crashed the process)', async () => {
    // GET /v1/models reads no body; a POST of text/plain is refused 415 before its body is read. The decoder ran on the
    // unread upload all the same, and its error, with nobody listening, was an uncaught exception.
    const stack = await startStack();
    const garbage = 'this is not gzip';
    const models = await exchange(stack.url, request('GET', '/v1/models', { 'content-encoding': 'gzip', 'content-type': 'application/json' }, garbage));
    expect(models.status).toBe(200);
    const text = await exchange(stack.url, request('POST', '/v1/chat/completions', { 'content-encoding': 'gzip', 'content-type': 'text/plain' }, garbage));
    expect(text.status).toBe(415);
    expectOpenAIError(JSON.parse(text.body), 'unsupported_media_type');
    const none = await exchange(stack.url, request('POST', '/v1/chat/completions', { 'content-encoding': 'deflate' }, garbage));
    expect(none.status).toBe(415);
    // Still serving.
    expect((await fetch(`${stack.url}/healthz`)).status).toBe(200);
  });
});

describe('a method fastify does not route by default', () => {
  it('on a path the gateway serves is 405 with allow, as README promises for every other method (TRACE, PROPFIND, QUERY were 404)', async () => {
    const stack = await startStack();
    for (const [method, path, allow] of [
      ['TRACE', '/v1/chat/completions', 'POST'],
      ['PROPFIND', '/v1/embeddings', 'POST'],
      ['QUERY', '/v1/chat/completions', 'POST'],
      ['TRACE', '/v1/models', 'GET, HEAD'],
      ['MKCOL', '/v1/models/gpt-4o', 'GET, HEAD'],
      ['TRACE', '/healthz', 'GET, HEAD'],
    ] as const) {
      const res = await exchange(stack.url, request(method, path, {}));
      expect(res.status, `${method} ${path}`).toBe(405);
      expect(res.head).toMatch(new RegExp(`\\r\\nallow: ${allow}\\r\\n`, 'i'));
      expectOpenAIError(JSON.parse(res.body), 'method_not_allowed');
    }
    // A path nobody serves stays 404, whatever the method.
    const unknown = await exchange(stack.url, request('TRACE', '/v1/nothing', {}));
    expect(unknown.status).toBe(404);
    expectOpenAIError(JSON.parse(unknown.body), 'unknown_url');
  });

  it('CONNECT gets an answer in the OpenAI shape, not a connection closed without one', async () => {
    const stack = await startStack();
    const res = await exchange(stack.url, Buffer.from('CONNECT 127.0.0.1:443 HTTP/1.1\r\nhost: 127.0.0.1:443\r\n\r\n'));
    expect(res.status).toBe(400);
    expect(res.head).toMatch(/\r\nx-should-retry: false(\r\n|$)/i);
    expect(expectOpenAIError(JSON.parse(res.body), 'bad_request').message).toMatch(/CONNECT/);
    // Node takes its listeners off a CONNECT's socket: a client that resets it while the answer is written must not
    // make an uncaught 'error' of the write.
    await Promise.all(
      Array.from({ length: 10 }, () =>
        new Promise<void>((resolve) => {
          const socket = connect(Number(new URL(stack.url).port), '127.0.0.1', () => {
            socket.write(`CONNECT 127.0.0.1:443 HTTP/1.1\r\nhost: 127.0.0.1:443\r\n\r\n${'x'.repeat(100_000)}`);
            socket.resetAndDestroy();
          });
          socket.on('error', () => undefined);
          socket.on('close', () => resolve());
        }),
      ),
    );
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect((await fetch(`${stack.url}/healthz`)).status).toBe(200);
  });
});

describe('a second Host header', () => {
  it('behind 2,000 others is still seen and answered 400 (Node dropped every header past its 2,000th)', async () => {
    const stack = await startStack();
    const padding = Object.fromEntries(Array.from({ length: 2_100 }, (_, i) => [`x-${i}`, '1']));
    const body = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    // The padding is within Node's 16 KB of headers; the second Host comes after it.
    const res = await exchange(stack.url, request('POST', '/v1/chat/completions', { 'content-type': 'application/json', ...padding, Host: 'elsewhere.example' }, body));
    expect(res.status).toBe(400);
    expect(expectOpenAIError(JSON.parse(res.body), 'bad_request').message).toMatch(/more than one Host/);
    expect(stack.mock.requests()).toHaveLength(0);
  });
});
