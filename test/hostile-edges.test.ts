// A hostile or buggy upstream, and a hostile client, at the edges a third-party security run found open: the key
// echoed in a content-type quoted by an error, in a passthrough error the provider compressed, a client's model name
// repeated into every chunk of a degraded stream, client hop-by-hop headers on passthrough requests, and a provider's
// x-stormgate-* headers on passthrough answers.
import { gunzipSync, gzipSync } from 'node:zlib';
import { request as httpRequest, type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from 'node:http';
import { connect } from 'node:net';
import { describe, expect, it } from 'vitest';
import { configServedBy, useStacks } from './helpers/stack.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { freePort } from './helpers/free-port.ts';

const startStack = useStacks();
const startProvider = useFakeProviders();

/** configServedBy gives the provider `<name>-key` (in TEST_SECRETS: the run's logs are checked for it too). */
const NAME = 'echoing';
const SECRET = `${NAME}-key`;

function stackServedBy(origin: string, extra: Record<string, unknown> = {}) {
  return startStack({
    config: (mockUrl) => ({
      ...configServedBy(mockUrl, NAME, `${origin}/v1`),
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: NAME }], retry: { maxAttempts: 1 }, park: false }],
      ...extra,
    }),
  });
}

const chat = (extra: Record<string, unknown> = {}) => ({
  method: 'POST',
  headers: { 'content-type': 'application/json' },
  body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], ...extra }),
});

describe("the provider's key echoed where the gateway quotes the answer", () => {
  it('is not in the error of a stream answered with JSON whose content-type quotes the key', async () => {
    const provider = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': `application/json; note=${String(req.headers.authorization)}` });
        res.end('{"id":"c","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}');
      });
    });
    const stack = await stackServedBy(provider.origin);
    const res = await fetch(`${stack.baseURL}/chat/completions`, chat({ stream: true }));
    expect(res.status).toBe(502);
    const text = await res.text();
    expect(text).toContain('a stream was asked for');
    expect(text).not.toContain(SECRET);
    await new Promise((r) => setTimeout(r, 50));
    expect(stack.logs.join('')).not.toContain(SECRET);
  });

  it('is not in a passthrough error the provider compressed (the client accepts gzip) or marked identity', async () => {
    const provider = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      req.on('end', () => {
        const body = Buffer.from(JSON.stringify({ error: { message: `no such file for ${String(req.headers.authorization)}`, type: 'invalid_request_error', param: null, code: null } }));
        const gzip = String(req.headers['accept-encoding']).includes('gzip');
        res.writeHead(404, { 'content-type': 'application/json', 'content-encoding': gzip ? 'gzip' : 'identity' });
        res.end(gzip ? gzipSync(body) : body);
      });
    });
    const stack = await stackServedBy(provider.origin, { passthrough: { provider: NAME, paths: ['/v1/files'], methods: ['GET'] } });
    for (const acceptEncoding of ['gzip, deflate, br', 'identity']) {
      const res = await new Promise<{ status: number; headers: IncomingHttpHeaders; body: Buffer }>((resolve, reject) => {
        const req = httpRequest(`${stack.url}/v1/files/file-1`, { headers: { 'accept-encoding': acceptEncoding } }, (r) => {
          const chunks: Buffer[] = [];
          r.on('data', (d: Buffer) => chunks.push(d));
          r.on('end', () => resolve({ status: r.statusCode ?? 0, headers: r.headers, body: Buffer.concat(chunks) }));
        });
        req.on('error', reject);
        req.end();
      });
      expect(res.status).toBe(404);
      const text = (res.headers['content-encoding'] === 'gzip' ? gunzipSync(res.body) : res.body).toString();
      expect(JSON.parse(text)).toMatchObject({ error: { message: 'no such file for Bearer [redacted]' } });
      expect(Number(res.headers['content-length'] ?? res.body.length)).toBe(res.body.length);
    }
  });

  it('is not in a passthrough error the provider compressed that decodes to more than the gateway reads of an error', async () => {
    // 70 KB of padding after the key: well under the read cap compressed, over it decoded.
    const provider = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      req.on('end', () => {
        const body = Buffer.from(JSON.stringify({ error: { message: `no such file for ${String(req.headers.authorization)} ${'.'.repeat(70_000)}`, type: 'invalid_request_error' } }));
        res.writeHead(404, { 'content-type': 'application/json', 'content-encoding': 'gzip' });
        res.end(gzipSync(body));
      });
    });
    const stack = await stackServedBy(provider.origin, { passthrough: { provider: NAME, paths: ['/v1/files'], methods: ['GET'] } });
    const res = await fetch(`${stack.url}/v1/files/file-1`, { headers: { 'accept-encoding': 'gzip' } });
    expect(res.status).toBe(404);
    const text = await res.text();
    expect(text).toContain('no such file for Bearer [redacted]');
    expect(text).not.toContain(SECRET);
  });
});

describe('a degraded stream for a client with a long model name', () => {
  it('does not repeat the name in every chunk of every choice (a 200 KB name was a 77 MB answer)', async () => {
    const closed = await freePort();
    const stack = await startStack({
      config: (mockUrl) => ({
        ...configServedBy(mockUrl, NAME, `http://127.0.0.1:${closed}/v1`),
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: NAME }], retry: { maxAttempts: 1 }, park: false, degraded: { message: 'Try again later.' } }],
      }),
    });
    const res = await fetch(`${stack.baseURL}/chat/completions`, chat({ model: `gpt-4o-${'x'.repeat(200_000)}`, n: 128, stream: true }));
    expect(res.status).toBe(200);
    expect(res.headers.get('x-stormgate-degraded')).toBe('true');
    const text = await res.text();
    expect(text).toContain('Try again later.');
    expect(text).toContain('data: [DONE]');
    // 128 choices x 3 chunks of about 250 bytes each, plus the name a few times at most.
    expect(text.length).toBeLessThan(1_000_000);
  });
});

describe("a client's hop-by-hop headers on a passthrough request", () => {
  it('are dropped, not forwarded (keep-alive and upgrade made undici refuse the request: 502 upstream_unavailable)', async () => {
    const seen: IncomingHttpHeaders[] = [];
    const provider = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      seen.push(req.headers);
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end('{"object":"list","data":[]}');
      });
    });
    const stack = await stackServedBy(provider.origin, { passthrough: { provider: NAME, paths: ['/v1/files'], methods: ['GET'] } });
    const { port } = new URL(stack.url);
    const hop = 'keep-alive: timeout=5\r\nupgrade: h2c\r\nte: trailers\r\ntrailer: x-checksum\r\nproxy-connection: keep-alive\r\n';
    const head = await new Promise<string>((resolve, reject) => {
      const socket = connect(Number(port), '127.0.0.1');
      let text = '';
      socket.on('data', (d: Buffer) => (text += d.toString()));
      socket.on('end', () => resolve(text));
      socket.on('error', reject);
      socket.write(`GET /v1/files HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n${hop}x-trace-note: kept\r\n\r\n`);
    });
    expect(head.split('\r\n')[0]).toBe('HTTP/1.1 200 OK');
    expect(seen).toHaveLength(1);
    for (const name of ['keep-alive', 'upgrade', 'te', 'trailer', 'proxy-connection']) expect(seen[0]![name]).toBeUndefined();
    expect(seen[0]!['x-trace-note']).toBe('kept');
  });
});

describe("a provider's x-stormgate-* headers on a passthrough answer", () => {
  it('do not replace the gateway\'s own (the client saw the provider\'s request id, the log line the gateway\'s)', async () => {
    const provider = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'application/json', 'x-stormgate-request-id': 'from-the-provider', 'x-stormgate-degraded': 'true' });
        res.end('{"object":"list","data":[]}');
      });
    });
    const stack = await stackServedBy(provider.origin, { passthrough: { provider: NAME, paths: ['/v1/files'], methods: ['GET'] } });
    const res = await fetch(`${stack.url}/v1/files`, { headers: { 'x-request-id': 'client-req-1' } });
    expect(res.status).toBe(200);
    await res.text();
    expect(res.headers.get('x-stormgate-request-id')).toBe('client-req-1');
    expect(res.headers.get('x-stormgate-degraded')).toBeNull();
  });
});
