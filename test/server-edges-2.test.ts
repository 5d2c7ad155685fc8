// The gateway's own edges, second part: header values built from client input, fastify's and Node's own errors in the
// OpenAI shape, 405 with `allow`, the `model` parameter, and compressed or BOM-prefixed bodies.
import { connect } from 'node:net';
import { brotliCompressSync, deflateSync, gzipSync } from 'node:zlib';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { buildServer } from '../src/server.ts';
import { headerSafe } from '../src/http/header-safe.ts';
import { ConfigSchema } from '../src/config/schema.ts';
import { createLogger } from '../src/observability/logger.ts';
import { createMetrics } from '../src/observability/metrics.ts';
import { startMock } from '../src/mock/server.ts';
import { defaultConfig, testLogSink, useStacks, TEST_KEY, type Stack } from './helpers/stack.ts';
import { expectOpenAIError } from './helpers/openai-error.ts';

const startStack = useStacks();
let stack: Stack;

const messages = [{ role: 'user' as const, content: 'hi' }];


/** One request over real HTTP; the error checks every gateway error must pass. */
async function expectError(res: Response, status: number, code: string, type = 'invalid_request_error') {
  expect(res.status).toBe(status);
  expect(res.headers.get('content-type')).toMatch(/^application\/json/);
  expect(res.headers.get('x-should-retry')).toBe('false');
  return expectOpenAIError(await res.json(), code, type);
}

function post(path: string, body: string | Buffer | undefined, headers: Record<string, string> = { 'content-type': 'application/json' }) {
  return fetch(`${stack.url}${path}`, { method: 'POST', headers, body });
}

/** Sends raw bytes and returns the raw answer (for requests fetch would refuse to send). */
function rawHttp(port: number, request: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1', () => socket.write(request));
    let answer = '';
    socket.on('data', (d) => (answer += d.toString('latin1')));
    socket.on('end', () => resolve(answer));
    socket.on('close', () => resolve(answer));
    socket.on('error', reject);
  });
}

function port(s: Stack): number {
  return Number(new URL(s.url).port);
}

describe('header values the gateway builds from client input', () => {
  it('answers a model name with non-Latin-1 characters: one upstream call, 200, a writable x-stormgate-target', async () => {
    stack = await startStack({});
    const client = new OpenAI({ baseURL: stack.baseURL, apiKey: 'unused' });
    const model = 'gpt-4o\u202e<script>中文';
    const { data, response } = await client.chat.completions.create({ model, messages }).withResponse();
    expect(data.choices[0]!.message.content).toBeTruthy();
    expect(response.status).toBe(200);
    expect(response.headers.get('x-stormgate-target')).toBe('mock/gpt-4o%E2%80%AE<script>%E4%B8%AD%E6%96%87');
    const stream = await client.chat.completions.create({ model, messages, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text.length).toBeGreaterThan(0);
    // Billed once each: no SDK retry after a 500 the gateway made up after the upstream's 200.
    expect(stack.mock.stats().total).toBe(2);
  });

  it('caps a 20 KB model name in the header and the log line and still answers', async () => {
    stack = await startStack({});
    const client = new OpenAI({ baseURL: stack.baseURL, apiKey: 'unused' });
    const { response } = await client.chat.completions.create({ model: `gpt-4o-${'x'.repeat(20_000)}`, messages }).withResponse();
    expect(response.status).toBe(200);
    expect(response.headers.get('x-stormgate-target')!.length).toBeLessThanOrEqual(256);
    expect(stack.mock.stats().total).toBe(1);
    // One request must not write megabytes into its log line (the body limit is the name's only bound).
    const line = stack.logs.find((l) => l.includes('"msg":"request"'))!;
    expect(line.length).toBeLessThan(2_000);
  });

  it('headerSafe keeps visible ASCII, percent-encodes the rest as UTF-8, survives lone surrogates and caps the length', () => {
    expect(headerSafe('openai/gpt-4o mini')).toBe('openai/gpt-4o mini');
    expect(headerSafe('a\r\nset-cookie: x')).toBe('a%0D%0Aset-cookie: x');
    expect(headerSafe('é')).toBe('%C3%A9');
    expect(headerSafe('x\ud800y')).toBe('x%EF%BF%BDy');
    expect(headerSafe('y'.repeat(1000))).toHaveLength(256);
  });

  it('answers in the OpenAI shape when writing the answer fails, without the headers that made it fail', async () => {
    const mock = await startMock({ quiet: true, apiKey: TEST_KEY });
    const config = ConfigSchema.parse(defaultConfig(mock.url));
    const logs: string[] = [];
    const app = await buildServer(config, { logger: createLogger(config, testLogSink(logs)), metrics: createMetrics({ defaultMetrics: false }) });
    // Stands for any header Node refuses to write after the upstream answered: set once, on the first answer only.
    const poisoned = new WeakSet<object>();
    app.addHook('onSend', async (request, reply, payload) => {
      if (!poisoned.has(request)) {
        poisoned.add(request);
        reply.header('x-poison', 'a\u202eb');
      }
      return payload;
    });
    try {
      const url = await app.listen({ host: '127.0.0.1', port: 0 });
      const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 });
      const err = await client.chat.completions.create({ model: 'gpt-4o', messages }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(OpenAI.InternalServerError);
      const e = err as InstanceType<typeof OpenAI.InternalServerError>;
      expect(e.code).toBe('internal_error');
      expect(e.type).toBe('server_error');
      expect(e.headers.get('x-should-retry')).toBe('false');
      expect(e.headers.get('x-poison')).toBeNull();
      expect(e.headers.get('x-stormgate-request-id')).toBeTruthy();
      const lines = logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === 'request');
      expect(lines).toEqual([expect.objectContaining({ status: 500, outcome: 'gateway_error' })]);
    } finally {
      await app.close();
      await mock.close();
    }
  });
});

describe('fastify\'s and Node\'s own errors come in the OpenAI shape', () => {
  it('answers a URL fastify cannot decode with 400 bad_request', async () => {
    stack = await startStack({});
    const res = await post('/v1/chat/completions%', JSON.stringify({ model: 'gpt-4o', messages }));
    await expectError(res, 400, 'bad_request');
    const reqId = res.headers.get('x-stormgate-request-id');
    expect(reqId).toBeTruthy();
    expect(stack.mock.stats().total).toBe(0);
    const lines = stack.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.reqId === reqId);
    expect(lines).toEqual([expect.objectContaining({ msg: 'request', status: 400, method: 'POST' })]);
  });

  it('answers headers or a URL over Node\'s limit with 431 headers_too_large', async () => {
    stack = await startStack({});
    const res = await fetch(`${stack.baseURL}/models`, { headers: { 'x-big': 'b'.repeat(20_000) } });
    expect(res.headers.get('x-stormgate-request-id')).toMatch(/^[0-9a-f-]{36}$/);
    await expectError(res, 431, 'headers_too_large');
    await expectError(await fetch(`${stack.baseURL}/models/${'m'.repeat(20_000)}`), 431, 'headers_too_large');
  });

  it('refuses an x-stormgate-timeout-ms that is not a positive number of milliseconds', async () => {
    stack = await startStack({});
    for (const bad of ['abc', '0', '-5']) {
      const res = await fetch(`${stack.baseURL}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-stormgate-timeout-ms': bad },
        body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
      });
      await expectError(res, 400, 'bad_request');
    }
    expect(stack.mock.stats().total).toBe(0);
  });

  it('answers 408 to a client that never finishes sending its body, and closes the connection', async () => {
    stack = await startStack({ config: (url) => ({ ...defaultConfig(url), server: { host: '127.0.0.1', port: 0, requestTimeoutMs: 500 } }) });
    const socket = connect(port(stack), '127.0.0.1');
    let answer = '';
    socket.on('data', (d) => (answer += d.toString()));
    const closed = new Promise<void>((r) => socket.once('close', () => r()));
    socket.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"model":');
    const started = Date.now();
    await closed;
    expect(Date.now() - started).toBeLessThan(3_000);
    expect(answer).toMatch(/^HTTP\/1\.1 408 /);
    expect(answer).toContain('"code":"request_timeout"');
    expect(stack.mock.stats().total).toBe(0);
  });

  it('logs a client that closes half-way through its body once, as that request\'s own line', async () => {
    stack = await startStack({});
    const socket = connect(port(stack), '127.0.0.1');
    const closed = new Promise<void>((r) => socket.once('close', () => r()));
    socket.on('data', () => {});
    socket.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\nx-request-id: half-body\r\n\r\n{"model":');
    await new Promise((r) => setTimeout(r, 50));
    socket.end();
    await closed;
    await new Promise((r) => setTimeout(r, 100));
    const lines = stack.logs.map((l) => JSON.parse(l) as { msg: string; reqId?: string }).filter((l) => l.msg === 'request' || l.msg === 'client error');
    expect(lines.map((l) => [l.msg, l.reqId])).toEqual([['request', 'half-body']]);
  });

  it('writes no second answer when a request answered early (413) then times out sending its body', async () => {
    stack = await startStack({ config: (url) => ({ ...defaultConfig(url), server: { host: '127.0.0.1', port: 0, requestTimeoutMs: 500, bodyLimitBytes: 1000 } }) });
    const socket = connect(port(stack), '127.0.0.1');
    let answer = '';
    socket.on('data', (d) => (answer += d.toString()));
    const closed = new Promise<void>((r) => socket.once('close', () => r()));
    socket.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{"model":');
    await closed;
    expect(answer).toMatch(/^HTTP\/1\.1 413 /);
    // One status line, no 408 after it (a bare '408' may be part of the request id, a random UUID).
    expect(answer.match(/HTTP\/1\.1 \d{3} /g)).toEqual(['HTTP/1.1 413 ']);
  });

  it('answers an HTTP/1.1 request without a Host header with 400 in the OpenAI shape', async () => {
    stack = await startStack({});
    const answer = await rawHttp(port(stack), 'GET /v1/models HTTP/1.1\r\nconnection: close\r\n\r\n');
    expect(answer).toMatch(/^HTTP\/1\.1 400 /);
    expect(answer).toContain('"code":"bad_request"');
    expect(answer.toLowerCase()).toContain('x-stormgate-request-id');
  });

  it('answers a malformed HTTP request with 400 bad_request', async () => {
    stack = await startStack({});
    const answer = await rawHttp(port(stack), 'GET /v1/models HTTP/1.1\r\nHost: x\r\nbroken header line\r\n\r\n');
    expect(answer).toMatch(/^HTTP\/1\.1 400 /);
    expect(answer.toLowerCase()).toContain('x-should-retry: false');
    expectOpenAIError(JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)), 'bad_request');
  });

  it('answers every bad request to a managed path in the OpenAI shape with x-should-retry: false', async () => {
    stack = await startStack({ config: (url) => ({ ...defaultConfig(url), server: { port: 0, bodyLimitBytes: 1024 } }) });
    const chat = '/v1/chat/completions';
    await expectError(await post(chat, '{"model": "gpt-4o",'), 400, 'invalid_json');
    await expectError(await post(chat, ''), 400, 'invalid_body');
    await expectError(await post(chat, undefined, {}), 400, 'invalid_body');
    await expectError(await post(chat, 'hello', { 'content-type': 'text/plain' }), 415, 'unsupported_media_type');
    await expectError(await post(chat, JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x'.repeat(5000) }] })), 413, 'request_too_large');
    await expectError(await post('/v1/files', '{}'), 404, 'unknown_url');
    await expectError(await fetch(`${stack.baseURL}/chat/completions`), 405, 'method_not_allowed');
    expect(stack.mock.stats().total).toBe(0);
  });

  it('answers a passthrough request the provider cannot take with 502 upstream_unavailable', async () => {
    stack = await startStack({
      config: (url) => {
        const base = defaultConfig(url);
        return { ...base, providers: { ...base.providers, gone: { family: 'openai', baseUrl: 'http://127.0.0.1:1/v1', apiKey: TEST_KEY } }, passthrough: { provider: 'gone', paths: ['/v1/files'], methods: ['GET'] } };
      },
    });
    await expectError(await fetch(`${stack.url}/v1/files`), 502, 'upstream_unavailable', 'server_error');
  });

  it('keeps binary out of an invalid_json message', async () => {
    stack = await startStack({});
    const e = await expectError(await post('/v1/chat/completions', Buffer.from([0x1f, 0x8b, 0x08, 0x00, 0x01, 0x02])), 400, 'invalid_json');
    expect(e.message).toMatch(/^[\x20-\x7e]*$/);
  });
});

describe('405 with allow, the same for every method a path does not serve', () => {
  it('answers OPTIONS, GET, HEAD and PUT on a managed path with 405 and allow: POST', async () => {
    stack = await startStack({});
    for (const method of ['OPTIONS', 'GET', 'PUT', 'DELETE']) {
      const res = await fetch(`${stack.baseURL}/chat/completions`, { method, ...(method === 'PUT' && { body: 'x', headers: { 'content-type': 'text/plain' } }) });
      const e = await expectError(res, 405, 'method_not_allowed');
      expect(res.headers.get('allow')).toBe('POST');
      expect(e.message).toContain(method);
    }
    const head = await fetch(`${stack.baseURL}/chat/completions`, { method: 'HEAD' });
    expect(head.status).toBe(405);
    expect(head.headers.get('allow')).toBe('POST');
  });

  it('answers POST, PUT, DELETE and OPTIONS on /v1/models with 405 and allow: GET, HEAD', async () => {
    stack = await startStack({});
    for (const method of ['POST', 'PUT', 'DELETE', 'OPTIONS']) {
      for (const path of ['/models', '/models/gpt-4o']) {
        const res = await fetch(`${stack.baseURL}${path}`, { method, ...(method === 'POST' && { body: '{}', headers: { 'content-type': 'application/json' } }) });
        await expectError(res, 405, 'method_not_allowed');
        expect(res.headers.get('allow')).toBe('GET, HEAD');
      }
    }
    expect(stack.mock.stats().total).toBe(0);
  });
});

describe('the model parameter', () => {
  it('answers a missing, empty or non-string model with 400 and param "model", like OpenAI', async () => {
    stack = await startStack({ route: { match: { path: '/v1/chat/completions', models: ['gpt-4o*'] } } });
    const client = new OpenAI({ baseURL: stack.baseURL, apiKey: 'unused', maxRetries: 0 });
    for (const model of [undefined, '', 42, null, ['gpt-4o']]) {
      const err = await client.chat.completions.create({ model, messages } as never).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(OpenAI.BadRequestError);
      const e = err as InstanceType<typeof OpenAI.BadRequestError>;
      expect(e.param).toBe('model');
      expect(e.type).toBe('invalid_request_error');
      expect(e.message).toMatch(model === undefined || model === '' ? /you must provide a model parameter/ : /model must be a string/);
    }
    const unknown = await client.chat.completions.create({ model: 'llama-3', messages }).catch((e: unknown) => e);
    expect(unknown).toBeInstanceOf(OpenAI.NotFoundError);
    expect((unknown as InstanceType<typeof OpenAI.NotFoundError>).code).toBe('model_not_found');
    expect(stack.mock.stats().total).toBe(0);
  });

  it('needs a model on a route that serves any model, but not when every target names its own', async () => {
    stack = await startStack({
      config: (url) => {
        const base = defaultConfig(url);
        return { ...base, routes: [...base.routes.filter((r) => r.name !== 'embeddings'), { name: 'embeddings', match: { path: '/v1/embeddings' }, targets: [{ provider: 'mock', model: 'text-embedding-3-small' }] }] };
      },
    });
    const client = new OpenAI({ baseURL: stack.baseURL, apiKey: 'unused', maxRetries: 0 });
    await expect(client.chat.completions.create({ messages } as never)).rejects.toBeInstanceOf(OpenAI.BadRequestError);
    const pinned = await client.embeddings.create({ input: 'x' } as never);
    expect(pinned.data).toHaveLength(1);
    expect(stack.mock.requests().map((r) => r.model)).toEqual(['text-embedding-3-small']);
  });
});

describe('compressed and BOM-prefixed bodies', () => {
  const body = JSON.stringify({ model: 'gpt-4o', messages });

  it('decodes gzip, deflate and br bodies and forwards plain JSON', async () => {
    stack = await startStack({});
    const encoded = { gzip: gzipSync(body), deflate: deflateSync(body), br: brotliCompressSync(body) };
    for (const [encoding, bytes] of Object.entries(encoded)) {
      const res = await post('/v1/chat/completions', bytes, { 'content-type': 'application/json', 'content-encoding': encoding });
      expect(res.status, encoding).toBe(200);
      expect(((await res.json()) as { object: string }).object).toBe('chat.completion');
    }
    const seen = stack.mock.requests();
    expect(seen.map((r) => r.model)).toEqual(['gpt-4o', 'gpt-4o', 'gpt-4o']);
    expect(seen.every((r) => r.headers['content-encoding'] === undefined)).toBe(true);
  });

  it('answers a zip bomb with 413 as soon as it passes bodyLimitBytes, and broken gzip with 400', async () => {
    stack = await startStack({ config: (url) => ({ ...defaultConfig(url), server: { port: 0, bodyLimitBytes: 64 * 1024 } }) });
    const bomb = gzipSync(Buffer.alloc(16 * 1024 * 1024, 0x20));
    // Small on the wire: only its decoded size is over the limit.
    expect(bomb.length).toBeLessThan(64 * 1024);
    await expectError(await post('/v1/chat/completions', bomb, { 'content-type': 'application/json', 'content-encoding': 'gzip' }), 413, 'request_too_large');
    await expectError(await post('/v1/chat/completions', Buffer.from('not gzip at all'), { 'content-type': 'application/json', 'content-encoding': 'gzip' }), 400, 'invalid_body');
    // The connection is still usable after both.
    expect((await post('/v1/chat/completions', body)).status).toBe(200);
  });

  it('logs a gzip upload the client drops half-way, and sends nothing upstream', async () => {
    stack = await startStack({});
    const bytes = gzipSync(body);
    const { port } = new URL(stack.url);
    const socket = connect(Number(port), '127.0.0.1');
    await new Promise((resolve) => socket.once('connect', resolve));
    socket.write(
      `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\ncontent-length: ${bytes.length}\r\n\r\n`,
    );
    socket.write(bytes.subarray(0, 10));
    await new Promise((resolve) => setTimeout(resolve, 50));
    socket.destroy();
    // The request ends (its one log line is written) instead of waiting for a body that will never come.
    for (let i = 0; i < 40 && !stack.logs.some((l) => l.includes('"path":"/v1/chat/completions"')); i++) await new Promise((resolve) => setTimeout(resolve, 25));
    expect(stack.logs.some((l) => l.includes('"path":"/v1/chat/completions"'))).toBe(true);
    expect(stack.mock.requests()).toHaveLength(0);
  });

  it('answers an encoding it cannot decode with 415 naming it', async () => {
    stack = await startStack({});
    const e = await expectError(await post('/v1/chat/completions', body, { 'content-type': 'application/json', 'content-encoding': 'zstd' }), 415, 'unsupported_media_type');
    expect(e.message).toContain('zstd');
  });

  it('accepts a UTF-8 byte order mark before the JSON and does not forward it', async () => {
    stack = await startStack({});
    const res = await post('/v1/chat/completions', Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(body)]));
    expect(res.status).toBe(200);
    expect(stack.mock.requests()[0]!.model).toBe('gpt-4o');
  });
});
