// The gateway's own edges: error shapes for bad input, which headers cross, request ids, /v1/models, passthrough.
import { request } from 'undici';
import { describe, expect, it } from 'vitest';
import { defaultConfig, useStacks, TEST_KEY, type Stack } from './helpers/stack.ts';
import { expectOpenAIError } from './helpers/openai-error.ts';

const startStack = useStacks();
let stack: Stack;


describe('bad input gets an OpenAI-shaped error', () => {
  it('answers malformed JSON with 400 invalid_json', async () => {
    stack = await startStack({});
    const res = await stack.gateway.inject({ method: 'POST', url: '/v1/chat/completions', headers: { 'content-type': 'application/json' }, payload: '{"model": "gpt-4o",' });
    expect(res.statusCode).toBe(400);
    expectOpenAIError(res.json(), 'invalid_json');
    expect(stack.mock.stats().total).toBe(0);
  });

  it('answers a JSON body that is not an object with 400', async () => {
    stack = await startStack({});
    const res = await stack.gateway.inject({ method: 'POST', url: '/v1/chat/completions', headers: { 'content-type': 'application/json' }, payload: '[1,2]' });
    expect(res.statusCode).toBe(400);
    expectOpenAIError(res.json(), 'invalid_body');
  });

  it('answers a body over bodyLimitBytes with 413', async () => {
    stack = await startStack({ config: (url) => ({ ...defaultConfig(url), server: { port: 0, bodyLimitBytes: 1024 } }) });
    const res = await fetch(`${stack.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x'.repeat(5000) }] }),
    });
    expect(res.status).toBe(413);
    const error = expectOpenAIError(await res.json(), 'request_too_large');
    // The limit itself, so the client knows how much to cut without asking the operator.
    expect(error.message).toBe('the request body is larger than server.bodyLimitBytes (1024 bytes)');
  });

  it('answers an unknown path with 404 unknown_url and a wrong method with 405', async () => {
    stack = await startStack({});
    const res = await stack.gateway.inject({ method: 'POST', url: '/v1/files', payload: {} });
    expect(res.statusCode).toBe(404);
    expectOpenAIError(res.json(), 'unknown_url');
    const get = await stack.gateway.inject({ method: 'GET', url: '/v1/chat/completions' });
    expect(get.statusCode).toBe(405);
    expectOpenAIError(get.json(), 'method_not_allowed');
  });

  it('answers a wrong method on its own endpoints (/healthz, /readyz, /metrics) with 405 and allow: GET, HEAD', async () => {
    stack = await startStack({});
    for (const url of ['/healthz', '/readyz', '/metrics']) {
      const post = await stack.gateway.inject({ method: 'POST', url, payload: {} });
      expect(post.statusCode, url).toBe(405);
      expect(post.headers.allow, url).toBe('GET, HEAD');
      expectOpenAIError(post.json(), 'method_not_allowed');
      expect((await stack.gateway.inject({ method: 'HEAD', url })).statusCode, url).toBe(200);
      expect((await stack.gateway.inject({ method: 'GET', url })).statusCode, url).toBe(200);
    }
  });

  it('answers a model no route serves with 404 model_not_found', async () => {
    stack = await startStack({ route: { match: { path: '/v1/chat/completions', models: ['gpt-4o*'] } } });
    const res = await stack.gateway.inject({ method: 'POST', url: '/v1/chat/completions', payload: { model: 'llama-3', messages: [] } });
    expect(res.statusCode).toBe(404);
    expectOpenAIError(res.json(), 'model_not_found');
    expect((res.json() as { error: { param: string } }).error.param).toBe('model');
    const ok = await stack.gateway.inject({ method: 'POST', url: '/v1/chat/completions', payload: { model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] } });
    expect(ok.statusCode).toBe(200);
  });

  it('answers a non-JSON content type with 415', async () => {
    stack = await startStack({});
    const res = await stack.gateway.inject({ method: 'POST', url: '/v1/chat/completions', headers: { 'content-type': 'text/plain' }, payload: 'hello' });
    expect(res.statusCode).toBe(415);
    expectOpenAIError(res.json(), 'unsupported_media_type');
  });
});

describe('headers across the gateway', () => {
  it('sends the provider key, never the client\'s credentials or cookies, and forwards what providers need', async () => {
    stack = await startStack({});
    await fetch(`${stack.baseURL}/chat/completions`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        authorization: 'Bearer client-secret',
        'x-api-key': 'client-x-api-key',
        'api-key': 'client-azure-key',
        cookie: 'session=abc',
        'openai-beta': 'assistants=v2',
        traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
        'x-stainless-timeout': '30',
        'x-request-id': 'client-req-42',
      },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    });
    const h = stack.mock.requests()[0]!.headers;
    expect(h.authorization).toBe(`Bearer ${TEST_KEY}`);
    expect(h['x-api-key']).toBeUndefined();
    expect(h['api-key']).toBeUndefined();
    expect(h.cookie).toBeUndefined();
    expect(h['openai-beta']).toBe('assistants=v2');
    expect(h.traceparent).toMatch(/^00-/);
    expect(h['x-stainless-timeout']).toBeUndefined();
    expect(h['x-client-request-id']).toBe('client-req-42');
  });

  it('returns its own request id and passes the upstream x-request-id back untouched', async () => {
    stack = await startStack({});
    const res = await fetch(`${stack.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-request-id': 'client-req-7' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(res.headers.get('x-stormgate-request-id')).toBe('client-req-7');
    expect(res.headers.get('x-request-id')).toMatch(/^req_/);
    const generated = await fetch(`${stack.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(generated.headers.get('x-stormgate-request-id')).toMatch(/^[0-9a-f-]{36}$/);
    const line = stack.logs.map((l) => JSON.parse(l)).find((l) => l.reqId === 'client-req-7');
    expect(line).toMatchObject({ route: 'chat', target: 'mock/gpt-4o', outcome: 'success', status: 200 });
    expect(line.upstreamRequestId).toMatch(/^req_/);
  });

  it('rewrites the model for a target that names one', async () => {
    stack = await startStack({ route: { targets: [{ provider: 'mock', model: 'gpt-4.1' }] } });
    const res = await stack.gateway.inject({ method: 'POST', url: '/v1/chat/completions', payload: { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] } });
    expect(res.statusCode).toBe(200);
    expect(stack.mock.requests()[0]!.model).toBe('gpt-4.1');
    expect(res.headers['x-stormgate-target']).toBe('mock/gpt-4.1');
  });

  it('never writes a provider key or client credential into its logs', async () => {
    stack = await startStack({ faults: { errors: [{ status: 401, rate: 1, message: `bad key ${TEST_KEY}` }] } });
    await stack.gateway.inject({ method: 'POST', url: '/v1/chat/completions', headers: { authorization: 'Bearer client-secret' }, payload: { model: 'gpt-4o', messages: [] } });
    const all = stack.logs.join('\n');
    expect(all).not.toContain(TEST_KEY);
    expect(all).not.toContain('client-secret');
  });
});

describe('a provider error that quotes the provider key', () => {
  it('reaches the client without the key, on a managed route', async () => {
    stack = await startStack({ faults: { errors: [{ status: 400, rate: 1, code: 'invalid_value', message: `the key ${TEST_KEY} may not use this model` }] } });
    const res = await stack.gateway.inject({ method: 'POST', url: '/v1/chat/completions', payload: { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] } });
    expect(res.statusCode).toBe(400);
    expect(res.body).not.toContain(TEST_KEY);
    expect(res.json()).toMatchObject({ error: { code: 'invalid_value', message: 'the key [redacted] may not use this model' } });
  });

  it('reaches the client without the key, on a passthrough path', async () => {
    stack = await startStack({
      faults: { errors: [{ status: 500, rate: 1, message: `internal error for ${TEST_KEY}` }] },
      config: (url) => {
        const base = defaultConfig(url);
        return { ...base, routes: base.routes.filter((r) => r.name !== 'embeddings'), passthrough: { provider: 'mock', paths: ['/v1/embeddings'], methods: ['POST'] } };
      },
    });
    const res = await fetch(`${stack.url}/v1/embeddings`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'text-embedding-3-small', input: 'x' }) });
    const text = await res.text();
    expect(res.status).toBe(500);
    expect(text).not.toContain(TEST_KEY);
    expect(JSON.parse(text)).toMatchObject({ error: { message: 'internal error for [redacted]' } });
  });
});

describe('passthrough', () => {
  it('is off by default: the gateway is no open relay for the provider key', async () => {
    stack = await startStack({});
    const res = await stack.gateway.inject({ method: 'GET', url: '/v1/files/file-abc/content' });
    expect(res.statusCode).toBe(404);
    expect(stack.mock.stats().total).toBe(0);
  });

  it('forwards exactly the configured paths and methods with the provider credentials and no retries', async () => {
    stack = await startStack({
      faults: { errors: [{ status: 503, rate: 1 }] },
      config: (url) => {
        const base = defaultConfig(url);
        return { ...base, routes: base.routes.filter((r) => r.name !== 'embeddings'), passthrough: { provider: 'mock', paths: ['/v1/embeddings'], methods: ['POST'] } };
      },
    });
    const res = await fetch(`${stack.url}/v1/embeddings`, {
      method: 'POST',
      headers: {
        authorization: 'Bearer client-secret',
        cookie: 'a=b',
        'proxy-authorization': 'Basic client-proxy',
        'openai-organization': 'org-someone-else',
        'openai-project': 'proj-someone-else',
        'x-stormgate-priority': 'batch',
        'content-type': 'application/json',
      },
      body: JSON.stringify({ model: 'text-embedding-3-small', input: 'x' }),
    });
    expect(res.status).toBe(503);
    // The gateway does not ask the SDK to repeat a passthrough call (one rule for x-should-retry).
    expect(res.headers.get('x-should-retry')).toBe('false');
    expect(stack.mock.stats().total).toBe(1);
    const h = stack.mock.requests()[0]!.headers;
    expect(h.authorization).toBe(`Bearer ${TEST_KEY}`);
    for (const dropped of ['cookie', 'proxy-authorization', 'openai-organization', 'openai-project', 'x-stormgate-priority']) expect(h[dropped], dropped).toBeUndefined();
    // The path is open, the method is not: 405 with allow, never forwarded.
    const get = await fetch(`${stack.url}/v1/embeddings`);
    expect(get.status).toBe(405);
    expect(get.headers.get('allow')).toBe('POST');
    expect(((await get.json()) as { error: { code: string } }).error.code).toBe('method_not_allowed');
    const del = await fetch(`${stack.url}/v1/embeddings/abc`, { method: 'DELETE' });
    expect(del.status).toBe(405);
    expect(((await del.json()) as { error: { message: string } }).error.message).toBe('DELETE is not allowed on /v1/embeddings/...; use POST');
    expect(stack.mock.stats().total).toBe(1);
  });

  it('answers HEAD on a GET path and 405 with allow for the methods it does not open', async () => {
    stack = await startStack({
      config: (url) => ({ ...defaultConfig(url), passthrough: { provider: 'mock', paths: ['/v1/files'], methods: ['GET'] } }),
    });
    // HEAD goes with GET: forwarded (the mock has no files: its own 404), not refused by the gateway.
    const head = await fetch(`${stack.url}/v1/files/file-abc`, { method: 'HEAD' });
    expect(head.status).not.toBe(405);
    expect(stack.mock.stats().total).toBe(1);
    const post = await fetch(`${stack.url}/v1/files/file-abc`, { method: 'POST', body: 'x' });
    expect(post.status).toBe(405);
    expect(post.headers.get('allow')).toBe('GET, HEAD');
    expect(stack.mock.stats().total).toBe(1);
  });

  it('passes the provider\'s connection headers (keep-alive and the like) back as the gateway\'s own', async () => {
    stack = await startStack({
      config: (url) => {
        const base = defaultConfig(url);
        return { ...base, routes: base.routes.filter((r) => r.name !== 'embeddings'), passthrough: { provider: 'mock', paths: ['/v1/embeddings'], methods: ['POST'] } };
      },
    });
    const managed = await request(`${stack.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x' }] }) });
    await managed.body.dump();
    const res = await request(`${stack.url}/v1/embeddings`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'text-embedding-3-small', input: 'x' }) });
    await res.body.dump();
    expect(res.statusCode).toBe(200);
    expect(res.headers['keep-alive']).toBe(managed.headers['keep-alive']);
  });

  it('passes no account headers back, answers the provider\'s 401 with the gateway\'s own error, and logs one line', async () => {
    stack = await startStack({
      faults: { errors: [{ status: 401, rate: 1, message: 'Incorrect API key provided: sk-open****f3a9' }] },
      config: (url) => {
        const base = defaultConfig(url);
        return { ...base, routes: base.routes.filter((r) => r.name !== 'embeddings'), passthrough: { provider: 'mock', paths: ['/v1/embeddings'], methods: ['POST'] } };
      },
    });
    const res = await fetch(`${stack.url}/v1/embeddings`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'text-embedding-3-small', input: 'x' }),
    });
    const text = await res.text();
    expect(res.status).toBe(502);
    expect(JSON.parse(text)).toMatchObject({ error: { code: 'upstream_auth_error', type: 'server_error' } });
    expect(text).not.toContain('sk-open');
    expect([...res.headers.keys()].filter((h) => h.startsWith('x-ratelimit-') || h === 'openai-organization')).toEqual([]);
    await new Promise((r) => setTimeout(r, 50));
    expect(stack.logs.filter((l) => l.includes('/v1/embeddings'))).toHaveLength(1);
  });
});
