// What a passthrough request does upstream: one attempt whatever the provider answers, the gateway's request id sent
// along as on the managed routes, and the provider's timeouts as its bound (undici's own defaults are 300 s).
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import { describe, expect, it } from 'vitest';
import { configServedBy, defaultConfig, useStacks } from './helpers/stack.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { FILES_PROVIDER, filesPassthrough as filesPassthroughOf } from './helpers/passthrough-files.ts';

const startStack = useStacks();
const startProvider = useFakeProviders();

const NAME = FILES_PROVIDER;
const filesPassthrough = (origin: string) => filesPassthroughOf(startStack, origin);

describe('passthrough retries', () => {
  it('sends a GET the provider answers 503 (with retry-after) once, and passes the 503 on', async () => {
    const provider = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      res.writeHead(503, { 'content-type': 'application/json', 'retry-after': '0' });
      res.end('{"error":{"message":"overloaded","type":"server_error","param":null,"code":null}}');
    });
    const stack = await filesPassthrough(provider.origin);
    const res = await fetch(`${stack.url}/v1/files/file-abc`);
    expect(res.status).toBe(503);
    expect(res.headers.get('x-should-retry')).toBe('false');
    await res.text();
    // reply-from's default sent it up to 11 times (10 retries on a 503 to a GET).
    await new Promise((r) => setTimeout(r, 200));
    expect(provider.hits()).toBe(1);
  });

  it('sends a GET whose connection the provider drops once: 502 upstream_unavailable', async () => {
    const provider = await startProvider((req: IncomingMessage) => {
      req.socket.destroy();
    });
    const stack = await filesPassthrough(provider.origin);
    const res = await fetch(`${stack.url}/v1/files/file-abc`);
    expect(res.status).toBe(502);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('upstream_unavailable');
    await new Promise((r) => setTimeout(r, 200));
    expect(provider.hits()).toBe(1);
  });
});

describe('passthrough request id', () => {
  it('sends the gateway\'s request id upstream as x-client-request-id, in place of any the client set', async () => {
    const seen: IncomingHttpHeaders[] = [];
    const provider = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      seen.push(req.headers);
      req.resume();
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"object":"list","data":[]}');
    });
    const stack = await filesPassthrough(provider.origin);
    const given = await fetch(`${stack.url}/v1/files`, { headers: { 'x-request-id': 'client-req-7', 'x-client-request-id': 'forged' } });
    await given.text();
    const made = await fetch(`${stack.url}/v1/files`);
    await made.text();
    expect(seen.map((h) => h['x-client-request-id'])).toEqual(['client-req-7', made.headers.get('x-stormgate-request-id')]);
    expect(made.headers.get('x-stormgate-request-id')).toMatch(/^[0-9a-f-]{36}$/);
  });
});

describe('passthrough deadline', () => {
  it('answers 504 upstream_timeout once the provider has sent no answer headers for passthrough.timeoutMs', async () => {
    const stack = await startStack({
      faults: { hangRate: 1 },
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl);
        return { ...base, routes: base.routes.filter((r) => r.name !== 'embeddings'), passthrough: { provider: 'mock', paths: ['/v1/embeddings'], methods: ['POST'], timeoutMs: 300 } };
      },
    });
    const started = Date.now();
    const res = await fetch(`${stack.url}/v1/embeddings`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'text-embedding-3-small', input: 'x' }),
      signal: AbortSignal.timeout(10_000),
    });
    const elapsedMs = Date.now() - started;
    expect(res.status).toBe(504);
    expect(res.headers.get('x-should-retry')).toBe('false');
    const body = (await res.json()) as { error: { code: string; type: string; message: string } };
    expect(body.error).toMatchObject({ code: 'upstream_timeout', type: 'server_error' });
    expect(body.error.message).toContain('UND_ERR_HEADERS_TIMEOUT');
    expect(elapsedMs).toBeGreaterThanOrEqual(250);
    expect(elapsedMs).toBeLessThan(3_000);
    expect(stack.mock.stats().total).toBe(1);
  });

  it('cuts an error answer whose body stalls for timeouts.idleMs: 504 upstream_timeout', async () => {
    const provider = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      // Headers and the start of an error, then nothing: the gateway reads a passthrough error whole.
      res.writeHead(500, { 'content-type': 'application/json' });
      res.write('{"error":');
    });
    const stack = await startStack({
      config: (mockUrl) => {
        const base = configServedBy(mockUrl, NAME, `${provider.origin}/v1`);
        const files = base.providers[NAME]!;
        return {
          ...base,
          providers: { ...base.providers, [NAME]: { ...files, timeouts: { firstTokenMs: 5_000, idleMs: 300 } } },
          passthrough: { provider: NAME, paths: ['/v1/files'], methods: ['GET'] },
        };
      },
    });
    const started = Date.now();
    const res = await fetch(`${stack.url}/v1/files/file-abc`, { signal: AbortSignal.timeout(10_000) });
    expect(res.status).toBe(504);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('upstream_timeout');
    expect(Date.now() - started).toBeLessThan(3_000);
  });
});
