// Mutation-found gaps in providers/passthrough.ts, http/send-answer.ts and http/drain.ts: the account headers a
// passthrough answer must not carry, a hop-by-hop header a provider's `connection` names in capitals, a compressed
// credential refusal answered readable, the 128-character cut of a log line's errorCode, a stream body destroyed when
// its client left before it was sent, and a second drain() that changes nothing.
import { gzipSync } from 'node:zlib';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { Readable } from 'node:stream';
import Fastify from 'fastify';
import { describe, expect, it } from 'vitest';
import { sendAnswer } from '../src/http/send-answer.ts';
import type { PipelineAnswer } from '../src/pipeline/handle-request.ts';
import { defaultConfig, requestLine, useStacks } from './helpers/stack.ts';
import { setTimeout as sleep } from 'node:timers/promises';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { filesPassthrough as filesPassthroughOf, rawGet as get } from './helpers/passthrough-files.ts';
import { ask, configFor } from './helpers/one-provider.ts';
import { expectOpenAIError } from './helpers/openai-error.ts';

const startStack = useStacks();
const startProvider = useFakeProviders();

const filesPassthrough = (origin: string) => filesPassthroughOf(startStack, origin);

describe("a passthrough answer's account headers", () => {
  it('drops the provider\'s openai-project, anthropic-ratelimit-* and x-stormgate-* headers, and keeps the others', async () => {
    const provider = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      res.writeHead(200, {
        'content-type': 'application/json',
        'openai-project': 'proj_company',
        'anthropic-ratelimit-requests-remaining': '17',
        'x-stormgate-request-id': 'forged-by-provider',
        'openai-processing-ms': '12',
      });
      res.end('{"object":"list","data":[]}');
    });
    const stack = await filesPassthrough(provider.origin);
    const res = await fetch(`${stack.url}/v1/files`);
    expect(res.status).toBe(200);
    await res.text();
    expect(res.headers.get('openai-project')).toBeNull();
    expect(res.headers.get('anthropic-ratelimit-requests-remaining')).toBeNull();
    expect(res.headers.get('x-stormgate-request-id')).not.toBe('forged-by-provider');
    expect(res.headers.get('openai-processing-ms')).toBe('12');
  });
});

describe("a passthrough answer's hop-by-hop headers", () => {
  it("drops a header the provider's connection names in capitals (header names are case-insensitive)", async () => {
    const provider = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'application/json', connection: 'keep-alive, X-Hop-Only', 'x-hop-only': 'for-the-gateway', 'x-end-to-end': 'kept' });
      res.end('{"object":"list","data":[]}');
    });
    const stack = await filesPassthrough(provider.origin);
    const res = await get(`${stack.url}/v1/files`);
    expect(res.status).toBe(200);
    expect(res.headers['x-hop-only']).toBeUndefined();
    expect(res.headers['x-end-to-end']).toBe('kept');
  });
});

describe('a compressed passthrough credential refusal', () => {
  it("is answered 502 upstream_auth_error in plain JSON, the provider's content-encoding dropped", async () => {
    const provider = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      res.writeHead(401, { 'content-type': 'application/json', 'content-encoding': 'gzip' });
      res.end(gzipSync('{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}'));
    });
    const stack = await filesPassthrough(provider.origin);
    const res = await get(`${stack.url}/v1/files/file-abc`, { 'accept-encoding': 'gzip' });
    expect(res.status).toBe(502);
    expect(res.headers['content-encoding']).toBeUndefined();
    expectOpenAIError(JSON.parse(res.body), 'upstream_auth_error', 'server_error');
  });
});

describe("a request's log line errorCode", () => {
  it("is the provider's error code cut at 128 characters, however long the provider made it", async () => {
    const code = `quota_${'x'.repeat(300)}`;
    const p = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      res.writeHead(400, { 'content-type': 'application/json' }).end(JSON.stringify({ error: { message: 'no', type: 'invalid_request_error', param: null, code } }));
    });
    const s = await startStack({ config: configFor(p.origin, {}) });
    expect((await ask(s.url)).status).toBe(400);
    const line = await requestLine(s);
    expect(line.errorCode).toBe(code.slice(0, 128));
  });
});

describe('a stream answer whose client left before it was sent', () => {
  it('destroys the stream body at once (its close aborts the upstream), not never', async () => {
    const app = Fastify();
    let body: Readable | undefined;
    app.get('/s', async (_request, reply) => {
      reply.raw.destroy();
      await sleep(20);
      body = new Readable({ read() {} });
      body.push('data: {}\n\n');
      return sendAnswer(reply, { status: 200, headers: { 'content-type': 'text/event-stream' }, body } as unknown as PipelineAnswer);
    });
    const url = await app.listen({ host: '127.0.0.1', port: 0 });
    try {
      await fetch(`${url}/s`).catch(() => undefined);
      await expect.poll(() => body?.destroyed, { timeout: 2_000 }).toBe(true);
    } finally {
      body?.destroy();
      await app.close();
    }
  });
});

describe('a second SIGTERM while draining', () => {
  it('changes nothing: the second drain() returns at once, not after a second preStopMs', async () => {
    const s = await startStack({ config: (mockUrl) => ({ ...defaultConfig(mockUrl), drain: { preStopMs: 1_000, graceMs: 500 } }) });
    const first = s.gateway.drain();
    await sleep(20);
    const again = Date.now();
    await s.gateway.drain();
    expect(Date.now() - again).toBeLessThan(500);
    await first;
  });
});
