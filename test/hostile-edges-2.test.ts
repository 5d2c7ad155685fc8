// More edges a security review found open: a passthrough error cut inside the key it quotes, a passthrough redirect's
// body quoting the key, client headers that name another method, path or client on a passthrough request, a model
// name that is a dot segment in an Azure deployment path, and names every object inherits (`constructor`) read from a
// client's content-encoding or an Anthropic answer as if they were known values.
import { gzipSync } from 'node:zlib';
import { request as httpRequest, type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from 'node:http';
import { describe, expect, it } from 'vitest';
import { configServedBy, useStacks } from './helpers/stack.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { rawGet as get } from './helpers/passthrough-files.ts';
import { expectOpenAIError } from './helpers/openai-error.ts';
import { MAX_ERROR_BODY_BYTES } from '../src/providers/read-capped.ts';

const startStack = useStacks();
const startProvider = useFakeProviders();

/** configServedBy gives the provider `<name>-key` (in TEST_SECRETS: the run's logs are checked for it too). */
const NAME = 'echoing';
const SECRET = `${NAME}-key`;

function filesPassthrough(origin: string, methods: Array<'GET' | 'POST' | 'DELETE'> = ['GET']) {
  return startStack({
    config: (mockUrl) => ({
      ...configServedBy(mockUrl, NAME, `${origin}/v1`),
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: NAME }], retry: { maxAttempts: 1 }, park: false }],
      passthrough: { provider: NAME, paths: ['/v1/files'], methods },
    }),
  });
}

describe('a passthrough error longer than the gateway reads of an error', () => {
  it('does not end in the start of the provider key when the cut falls inside it, plain or compressed', async () => {
    // The key starts 3 bytes before the cut: the client got all of `echoing-key` but its last 3 characters. A provider
    // that quotes the request (a file id) and the key lets the client move the cut to any place in the key.
    const prefix = '{"error":{"message":"';
    const pad = 'A'.repeat(MAX_ERROR_BODY_BYTES - prefix.length - (SECRET.length - 3));
    const provider = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      req.on('end', () => {
        const key = String(req.headers.authorization).replace(/^Bearer /, '');
        const body = Buffer.from(`${prefix}${pad}${key} is not allowed to read this file","type":"invalid_request_error","param":null,"code":null}}`);
        const gzip = req.url!.endsWith('/zipped');
        res.writeHead(404, { 'content-type': 'application/json', ...(gzip && { 'content-encoding': 'gzip' }) });
        res.end(gzip ? gzipSync(body) : body);
      });
    });
    const stack = await filesPassthrough(provider.origin);
    for (const path of ['/v1/files/plain', '/v1/files/zipped']) {
      const res = await get(`${stack.url}${path}`, { 'accept-encoding': 'gzip' });
      expect(res.status).toBe(404);
      expect(res.headers['content-encoding']).toBeUndefined();
      expect(res.body.endsWith(`${pad.slice(-10)}[redacted]`)).toBe(true);
      expect(res.body).not.toContain(SECRET.slice(0, 4));
    }
  });
});

describe('a passthrough redirect', () => {
  it('reaches the client without the provider key its body quotes, as an error would', async () => {
    const provider = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      req.on('end', () => {
        const auth = String(req.headers.authorization);
        res.writeHead(302, { location: 'https://files.example/v1/files/file-1', 'content-type': 'text/plain' });
        res.end(`Moved. Your request (authorization: ${auth}) goes to https://files.example/v1/files/file-1`);
      });
    });
    const stack = await filesPassthrough(provider.origin);
    const res = await get(`${stack.url}/v1/files/file-1`);
    expect(res.status).toBe(302);
    expect(res.headers.location).toBe('https://files.example/v1/files/file-1');
    expect(res.body).toBe('Moved. Your request (authorization: Bearer [redacted]) goes to https://files.example/v1/files/file-1');
    expect(Number(res.headers['content-length'] ?? res.body.length)).toBe(res.body.length);
  });
});

describe('a passthrough answer without a body', () => {
  it('a 304, and any answer to a HEAD, reach the client with the headers the provider gave them', async () => {
    const provider = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      req.on('end', () => {
        if (req.url!.endsWith('/cached')) return res.writeHead(304, { etag: '"v1"', 'cache-control': 'max-age=60' }).end();
        res.writeHead(302, { location: 'https://files.example/v1/files/file-1', 'content-type': 'text/plain', 'content-length': '5' });
        res.end(req.method === 'HEAD' ? undefined : 'Moved');
      });
    });
    const stack = await filesPassthrough(provider.origin);
    const cached = await get(`${stack.url}/v1/files/cached`, { 'if-none-match': '"v1"' });
    expect(cached.status).toBe(304);
    expect(cached.headers.etag).toBe('"v1"');
    // Re-sent as a body, it went out typed application/octet-stream: a cache takes a 304's headers over its stored ones.
    expect(cached.headers['content-type']).toBeUndefined();
    const head = await new Promise<{ status: number; headers: IncomingHttpHeaders }>((resolve, reject) => {
      const req = httpRequest(`${stack.url}/v1/files/moved`, { method: 'HEAD' }, (res) => {
        res.resume();
        resolve({ status: res.statusCode ?? 0, headers: res.headers });
      });
      req.on('error', reject);
      req.end();
    });
    expect(head.status).toBe(302);
    // The length of the body a GET would get, as the provider said; not the 0 of a body read from a HEAD.
    expect(head.headers['content-length']).toBe('5');
  });
});

describe("a client's headers on a passthrough request", () => {
  it('that name another method, path or client, or a retry the gateway never made, are not forwarded', async () => {
    const seen: Array<{ method: string; url: string; headers: IncomingHttpHeaders }> = [];
    const provider = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      seen.push({ method: req.method!, url: req.url!, headers: req.headers });
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end('{"object":"list","data":[]}');
      });
    });
    // GET only: a method override would make it a DELETE at a server that obeys one, with the gateway's key.
    const stack = await filesPassthrough(provider.origin, ['GET']);
    const forged = {
      'x-http-method-override': 'DELETE',
      'x-http-method': 'DELETE',
      'x-method-override': 'DELETE',
      'x-original-method': 'DELETE',
      'x-original-url': '/v1/organization/admin_api_keys',
      'x-rewrite-url': '/v1/organization/admin_api_keys',
      'x-forwarded-for': '10.0.0.1',
      'x-forwarded-host': 'attacker.example',
      'x-forwarded-proto': 'http',
      forwarded: 'for=10.0.0.1;host=attacker.example',
      'x-real-ip': '10.0.0.1',
      'x-client-ip': '10.0.0.1',
      'true-client-ip': '10.0.0.1',
      'x-retry-attempt': '3',
      'x-retry-reason': 'status_503',
    };
    const res = await get(`${stack.url}/v1/files/file-1`, { ...forged, 'x-trace-note': 'kept' });
    expect(res.status).toBe(200);
    expect(seen).toHaveLength(1);
    expect(seen[0]!.method).toBe('GET');
    expect(seen[0]!.url).toBe('/v1/files/file-1');
    for (const name of Object.keys(forged)) expect(seen[0]!.headers[name], name).toBeUndefined();
    expect(seen[0]!.headers['x-trace-note']).toBe('kept');
  });
});

describe('an Azure deployment named by the client', () => {
  it('is refused when it is `.` or `..`, which would move the request to a path above the deployments', async () => {
    const urls: string[] = [];
    const provider = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      urls.push(req.url!);
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ id: 'c', object: 'chat.completion', created: 1, model: 'm', choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }] }));
      });
    });
    const stack = await startStack({
      config: (mockUrl) => ({
        ...configServedBy(mockUrl, NAME, `${provider.origin}/v1`),
        providers: { azure: { family: 'azure-openai', baseUrl: provider.origin, apiKey: 'client-azure-key', apiVersion: '2024-10-21', breaker: false } },
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'azure' }], retry: { maxAttempts: 1 }, park: false }],
      }),
    });
    for (const model of ['..', '.']) {
      const res = await fetch(`${stack.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }] }),
      });
      expect(res.status).toBe(400);
      expect(expectOpenAIError(await res.json(), 'invalid_body').param).toBe('model');
    }
    expect(urls).toEqual([]);
    // A name with dots that is no dot segment is a deployment like any other.
    const ok = await fetch(`${stack.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: '...', messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(ok.status).toBe(200);
    expect(urls).toEqual(['/openai/deployments/.../chat/completions?api-version=2024-10-21']);
  });
});

describe('names every object inherits, read as protocol values', () => {
  it("a client's content-encoding `constructor` or `__proto__` gets 415 unsupported_media_type, not a 500", async () => {
    const provider = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      res.writeHead(500).end();
    });
    const stack = await filesPassthrough(provider.origin);
    for (const encoding of ['constructor', '__proto__', 'toString']) {
      const res = await fetch(`${stack.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'content-encoding': encoding },
        body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
      });
      expect(res.status, encoding).toBe(415);
      expectOpenAIError(await res.json(), 'unsupported_media_type');
    }
    expect(provider.hits()).toBe(0);
    expect(stack.logs.filter((l) => JSON.parse(l).level >= 50)).toEqual([]);
  });

  it("an Anthropic target's stop_reason `constructor` reads as an unknown one: finish_reason stop, not left out", async () => {
    const provider = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ id: 'msg_1', type: 'message', role: 'assistant', model: 'claude-x', content: [{ type: 'text', text: 'hi' }], stop_reason: 'constructor', usage: { input_tokens: 1, output_tokens: 1 } }));
      });
    });
    const stack = await startStack({
      config: (mockUrl) => ({
        ...configServedBy(mockUrl, NAME, `${provider.origin}/v1`),
        providers: { claude: { family: 'anthropic', baseUrl: provider.origin, apiKey: 'backup-key', breaker: false } },
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'claude', model: 'claude-x' }], retry: { maxAttempts: 1 }, park: false }],
      }),
    });
    const res = await fetch(`${stack.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(res.status).toBe(200);
    expect(((await res.json()) as { choices: Array<{ finish_reason: unknown }> }).choices[0]!.finish_reason).toBe('stop');
  });

  it("a client's URL fragment stays with the client: the query goes upstream without it, on managed and passthrough paths", async () => {
    const seen: string[] = [];
    const provider = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      seen.push(req.url ?? '');
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ id: 'c', object: 'chat.completion', created: 1, model: 'gpt-4o', choices: [{ index: 0, message: { role: 'assistant', content: 'hi' }, finish_reason: 'stop' }] }));
      });
    });
    const stack = await filesPassthrough(provider.origin);
    const send = (method: 'GET' | 'POST', path: string) =>
      new Promise<number>((resolve, reject) => {
        const req = httpRequest(`${stack.url}${path}`, { method, path, headers: { 'content-type': 'application/json' } }, (res) => {
          res.resume();
          resolve(res.statusCode ?? 0);
        });
        req.on('error', reject);
        req.end(method === 'POST' ? JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }) : undefined);
      });
    expect(await send('POST', '/v1/chat/completions?a=1#frag')).toBe(200);
    // A `?` inside the fragment is no query.
    expect(await send('POST', '/v1/chat/completions#frag?b=2')).toBe(200);
    expect(await send('GET', '/v1/files/file-1?limit=1#frag')).toBe(200);
    expect(seen).toEqual(['/v1/chat/completions?a=1', '/v1/chat/completions', '/v1/files/file-1?limit=1']);
  });
});
