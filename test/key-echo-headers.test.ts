// A provider that echoes the credentials it was sent, in its response headers and in its model list, must not hand
// the gateway's key to clients or to the log: managed answers (whole, streamed, errors), /v1/models and passthrough.
import { request as httpRequest } from 'node:http';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { describe, expect, it } from 'vitest';
import { configServedBy, useStacks } from './helpers/stack.ts';
import { chatChunk, useFakeProviders } from './helpers/fake-provider.ts';
import { expectOpenAIError } from './helpers/openai-error.ts';

const startStack = useStacks();
const startProvider = useFakeProviders();

/** configServedBy gives the provider `<name>-key`; long enough to be redacted (key-echo.ts ignores keys under 8 characters). */
const NAME = 'echoing';
const SECRET = `${NAME}-key`;

/** Echoes the authorization it got in the headers the gateway passes on, and in whatever it answers. */
function echoing(req: IncomingMessage, res: ServerResponse): void {
  req.resume();
  req.on('end', () => {
    const auth = String(req.headers.authorization ?? '');
    const echo = { 'x-request-id': `req_${auth}`, 'openai-model': auth, 'x-echo': auth, 'www-authenticate': auth };
    const url = req.url ?? '';
    if (url.endsWith('/models')) {
      res.writeHead(200, { 'content-type': 'application/json', ...echo });
      res.end(JSON.stringify({ object: 'list', data: [{ id: 'gpt-4o', object: 'model', created: 1, owned_by: auth, note: `listed for ${auth}` }] }));
    } else if (url.includes('/files')) {
      res.writeHead(url.endsWith('/denied') ? 401 : 200, { 'content-type': 'application/json', ...echo });
      res.end('{"object":"list","data":[]}');
    } else if (url.includes('/stream')) {
      res.writeHead(200, { 'content-type': 'text/event-stream', ...echo });
      res.end(`${chatChunk({ role: 'assistant', content: 'hi' }, null)}${chatChunk({}, 'stop')}data: [DONE]\n\n`);
    } else if (url.includes('/fail')) {
      res.writeHead(500, { 'content-type': 'application/json', ...echo });
      res.end(JSON.stringify({ error: { message: 'boom', type: 'server_error', param: null, code: null } }));
    } else {
      res.writeHead(200, { 'content-type': 'application/json', ...echo });
      res.end(JSON.stringify({ id: 'c', object: 'chat.completion', created: 1, model: 'gpt-4o', choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }] }));
    }
  });
}

async function stackWithEcho(opts: { passthrough?: boolean } = {}) {
  const provider = await startProvider(echoing);
  return startStack({
    config: (mockUrl) => {
      const base = configServedBy(mockUrl, NAME, `${provider.origin}/v1`);
      return {
        ...base,
        routes: [
          { name: 'ok', match: { path: '/v1/chat/completions' }, targets: [{ provider: NAME }], retry: { maxAttempts: 1 }, park: false },
        ],
        ...(opts.passthrough && { passthrough: { provider: NAME, paths: ['/v1/files'], methods: ['GET' as const, 'POST' as const] } }),
      };
    },
  });
}

function headerText(res: Response): string {
  return [...res.headers].map(([k, v]) => `${k}: ${v}`).join('\n');
}

describe("the provider's key echoed back in headers and listings", () => {
  it('is not in the headers of a managed answer, nor in the request log line', async () => {
    const stack = await stackWithEcho();
    const res = await fetch(`${stack.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: 'Bearer sk-client-not-a-provider-key' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(res.status).toBe(200);
    await res.text();
    expect(headerText(res)).not.toContain(SECRET);
    // The upstream's request id still reaches the client, with the key taken out.
    expect(res.headers.get('x-request-id')).toBe('req_Bearer [redacted]');
    await new Promise((r) => setTimeout(r, 50));
    expect(stack.logs.join('')).not.toContain(SECRET);
  });

  it('is not in the headers of a failed attempt passed on (upstream 500)', async () => {
    const provider = await startProvider((req, res) => {
      req.url = '/fail';
      echoing(req, res);
    });
    const stack = await startStack({
      config: (mockUrl) => ({ ...configServedBy(mockUrl, NAME, `${provider.origin}/v1`), routes: [{ name: 'f', match: { path: '/v1/chat/completions' }, targets: [{ provider: NAME }], retry: { maxAttempts: 1 }, park: false }] }),
    });
    const res = await fetch(`${stack.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(res.status).toBe(500);
    expect(res.headers.get('content-type')).toMatch(/^application\/json/);
    expect(Object.keys(((await res.json()) as { error: object }).error).sort()).toEqual(['code', 'message', 'param', 'type']);
    expect(headerText(res)).not.toContain(SECRET);
  });

  it('is not in the headers of a stream', async () => {
    const provider = await startProvider((req, res) => {
      req.url = '/stream';
      echoing(req, res);
    });
    const stack = await startStack({
      config: (mockUrl) => ({ ...configServedBy(mockUrl, NAME, `${provider.origin}/v1`), routes: [{ name: 's', match: { path: '/v1/chat/completions' }, targets: [{ provider: NAME }], retry: { maxAttempts: 1 }, park: false }] }),
    });
    const res = await fetch(`${stack.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', stream: true, messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(res.status).toBe(200);
    expect(await res.text()).toContain('[DONE]');
    expect(headerText(res)).not.toContain(SECRET);
    await new Promise((r) => setTimeout(r, 50));
    expect(stack.logs.join('')).not.toContain(SECRET);
  });

  it('is not in GET /v1/models nor GET /v1/models/{model}', async () => {
    const stack = await stackWithEcho();
    const list = await (await fetch(`${stack.baseURL}/models`)).text();
    expect(list).toContain('gpt-4o');
    expect(list).not.toContain(SECRET);
    const one = await (await fetch(`${stack.baseURL}/models/gpt-4o`)).text();
    expect(one).toContain('gpt-4o');
    expect(one).not.toContain(SECRET);
  });

  it('is not in the headers of a passthrough answer, nor of its 401 turned into upstream_auth_error', async () => {
    const stack = await stackWithEcho({ passthrough: true });
    const ok = await fetch(`${stack.url}/v1/files`, { headers: { authorization: 'Bearer sk-client-not-a-provider-key' } });
    expect(ok.status).toBe(200);
    await ok.text();
    expect(headerText(ok)).not.toContain(SECRET);
    const denied = await fetch(`${stack.url}/v1/files/denied`);
    expect(denied.status).toBe(502);
    expectOpenAIError(await denied.json(), 'upstream_auth_error', 'server_error');
    expect(headerText(denied)).not.toContain(SECRET);
  });
});

describe('passthrough with Expect: 100-continue', () => {
  it('forwards the upload instead of answering 502 upstream_unavailable (undici refuses the expect header)', async () => {
    const stack = await stackWithEcho({ passthrough: true });
    const { port } = new URL(stack.url);
    const body = JSON.stringify({ purpose: 'batch', padding: 'x'.repeat(2000) });
    const status = await new Promise<number>((resolve, reject) => {
      const req = httpRequest(
        { host: '127.0.0.1', port, method: 'POST', path: '/v1/files', headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), expect: '100-continue' } },
        (res) => {
          res.resume();
          res.on('end', () => resolve(res.statusCode ?? 0));
        },
      );
      req.on('continue', () => req.end(body));
      req.on('error', reject);
    });
    expect(status).toBe(200);
  });
});
