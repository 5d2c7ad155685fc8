// Third-party failure-scenario suite 60: the HTTP protocol edges a chaos suite for LLM gateways throws at one, on what
// the earlier suites covered least. Upstream statuses a provider (or the proxy in front of it) rarely answers: 408,
// 409, 410, 413, 415, 424, 425, 499, 501, 505, 507 and Cloudflare's 520 to 524 with their HTML pages, each checked
// against the README's outcome rules (retried or not, failed over or not) and for the OpenAI error shape, status and
// x-should-retry the SDK gets; redirects that point at a live host; upstream framing the parser must refuse (two
// content-lengths, a control byte in a header, a body longer than its content-length); browser-ish clients (a CORS
// preflight, HEAD, PUT/PATCH/DELETE, a 20 KB URL, path spellings); and request bodies in charsets, encodings and
// shapes a JSON endpoint meets (UTF-16 declared, form-encoded, `null`, arrays, 100,000 levels of nesting, numbers past
// 2^53, duplicate keys).
// Driven with the official `openai` SDK over real HTTP on 127.0.0.1 through the gateway to scripted upstreams, and
// raw sockets where an SDK cannot express the request or the answer. Bounds are generous: a loaded 2-core machine.
// Found here: an upstream answer whose header block llhttp refused once a content-length had been read (a second,
// different content-length; one beside transfer-encoding: chunked; one that is no number; a control byte in a later
// header) reached the client as 502 upstream_unavailable, "could not be reached (last: UND_ERR_RES_CONTENT_LENGTH_MISMATCH)",
// since undici reports such a parser error as a length mismatch; it is now upstream_bad_response, as any answer that is not
// HTTP/1.1. And an upstream status past 599 (LinkedIn's 999, a broken proxy's 600), passed on as the upstream's status,
// was one the gateway could not write: a 500 internal_error; it is now 502 upstream_bad_response, retried as one.
import { once } from 'node:events';
import { gzipSync } from 'node:zlib';
import { createServer, type Server } from 'node:http';
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import { expectOpenAIError, sdkError } from './helpers/openai-error.ts';
import { rawRequest, useRawUpstreams } from './helpers/raw-http.ts';
import { completion, healthy, json, streamed, type Answer, type Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';

const gw = useScriptedUpstreams();
const rawUpstream = useRawUpstreams();

const CHAT = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'hi' }] };
const CHAT_TEXT = JSON.stringify(CHAT);

/** An error page as a proxy in front of a provider (Cloudflare, nginx, a load balancer) serves it. */
const html = (status: number, title: string): Script => ({
  status,
  headers: { 'content-type': 'text/html; charset=UTF-8' },
  steps: [`<!DOCTYPE html>\n<html><head><title>${title}</title><style>body{font:14px}</style></head><body><h1>${title}</h1><p>cf-ray: 8d1e2f3a4b5c6d7e</p></body></html>`],
});
const apiError = (status: number, message: string, code: string | null = null, type = 'invalid_request_error'): Script =>
  json(status, { error: { message, type, param: null, code } });

/** The gateway's answer to one chat completion sent with fetch: status, headers and parsed body. */
async function post(url: string, body: string | Buffer, headers: Record<string, string> = { 'content-type': 'application/json' }, method = 'POST') {
  const res = await fetch(url, { method, headers, body: method === 'GET' || method === 'HEAD' ? undefined : body });
  const text = await res.text();
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = text;
  }
  return { status: res.status, headers: res.headers, body: parsed, text };
}

// ---------------------------------------------------------------------------------------------------------------
// Upstream statuses rarely seen, each with the README's rule.

interface StatusCase {
  status: number;
  answer: Script;
  /** Is it sent again to the same target under the default retryOn? */
  retried: boolean;
  /** Is the next target asked after it (README: 4xx end the request; 408, 424 and 5xx move on)? */
  failsOver: boolean;
  /** Words the client's error message must carry. */
  says: string;
}

const CASES: StatusCase[] = [
  { status: 408, answer: apiError(408, 'The operation was timeout.', 'timeout', 'server_error'), retried: false, failsOver: true, says: 'The operation was timeout.' },
  { status: 409, answer: apiError(409, 'A conflicting request is already being processed.', 'conflict'), retried: false, failsOver: false, says: 'conflicting request' },
  { status: 410, answer: apiError(410, 'The model `gpt-4-0314` has been deprecated.', 'model_deprecated'), retried: false, failsOver: false, says: 'has been deprecated' },
  { status: 413, answer: html(413, '413 Request Entity Too Large'), retried: false, failsOver: false, says: '413 Request Entity Too Large' },
  { status: 415, answer: apiError(415, "Unsupported content type: 'text/plain'.", 'unsupported_media_type'), retried: false, failsOver: false, says: 'Unsupported content type' },
  { status: 424, answer: json(424, { error: 'Request failed during generation: Server error: CUDA out of memory.' }), retried: false, failsOver: true, says: 'CUDA out of memory' },
  { status: 425, answer: apiError(425, 'Too early.', null), retried: false, failsOver: false, says: 'Too early' },
  { status: 499, answer: html(499, '499 Client Closed Request'), retried: false, failsOver: false, says: '499 Client Closed Request' },
  { status: 501, answer: html(501, '501 Not Implemented'), retried: false, failsOver: true, says: '501 Not Implemented' },
  { status: 505, answer: html(505, '505 HTTP Version Not Supported'), retried: false, failsOver: true, says: '505 HTTP Version Not Supported' },
  { status: 507, answer: apiError(507, 'Insufficient storage for the KV cache.', null, 'server_error'), retried: false, failsOver: true, says: 'Insufficient storage' },
  { status: 520, answer: html(520, 'api.example.com | 520: Web server is returning an unknown error'), retried: true, failsOver: true, says: '520: Web server is returning an unknown error' },
  { status: 521, answer: html(521, 'api.example.com | 521: Web server is down'), retried: false, failsOver: true, says: '521: Web server is down' },
  { status: 522, answer: html(522, 'api.example.com | 522: Connection timed out'), retried: false, failsOver: true, says: '522: Connection timed out' },
  { status: 523, answer: html(523, 'api.example.com | 523: Origin is unreachable'), retried: false, failsOver: true, says: '523: Origin is unreachable' },
  { status: 524, answer: html(524, 'api.example.com | 524: A timeout occurred'), retried: true, failsOver: true, says: '524: A timeout occurred' },
];

describe('an upstream status rarely seen, through the openai SDK', () => {
  it.each(CASES)('$status alone: retried only if the default retryOn lists it, then the SDK gets it in the OpenAI shape with x-should-retry false', async (c) => {
    const g = await gw({ primary: () => c.answer }, [{ provider: 'primary' }]);
    const err = await sdkError(g.client.chat.completions.create(CHAT));
    expect(err.status).toBe(c.status);
    expect(g.seen.primary).toHaveLength(c.retried ? 2 : 1);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    const e = expectOpenAIError(err.error ? { error: err.error } : undefined, (err.error as { code: string | null }).code as string, (err.error as { type: string }).type);
    expect(String(e.message)).toContain(c.says);
    // A proxy's page is named by its title: no markup reaches the client's log.
    expect(String(e.message)).not.toMatch(/<[a-z!/]/i);
  });

  it.each(CASES)('$status from the primary: the backup is asked only where the README says the request moves on', async (c) => {
    const g = await gw({ primary: () => c.answer, backup: healthy('from backup') }, [{ provider: 'primary' }, { provider: 'backup' }]);
    if (c.failsOver) {
      const res = await g.client.chat.completions.create(CHAT).withResponse();
      expect(res.data.choices[0]!.message.content).toBe('from backup');
      expect(res.response.headers.get('x-stormgate-fallback')).toBeTruthy();
      expect(res.response.headers.get('x-stormgate-attempts')).toBe(String(g.seen.primary!.length + 1));
    } else {
      const err = await sdkError(g.client.chat.completions.create(CHAT));
      expect(err.status).toBe(c.status);
      expect(g.seen.backup).toHaveLength(0);
    }
    expect(g.seen.primary).toHaveLength(c.retried ? 2 : 1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
// Redirects that point at a live host.

describe('a redirect on a POST that points at a live host', () => {
  const servers: Server[] = [];
  afterEach(async () => {
    for (const s of servers.splice(0)) {
      s.closeAllConnections();
      await new Promise((done) => s.close(done));
    }
  });
  /** A host the redirect points at, counting what reaches it. */
  async function elsewhere() {
    const hits: Array<{ url: string; auth: string | undefined }> = [];
    const server = createServer((req, res) => {
      hits.push({ url: req.url ?? '', auth: req.headers.authorization });
      req.resume();
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(JSON.parse(completion('stolen', 'gpt-4o').steps[0] as string)));
    });
    servers.push(server);
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    return { origin: `http://127.0.0.1:${(server.address() as { port: number }).port}`, hits };
  }

  it.each([301, 302, 303, 307, 308])('%i is never followed: the host it names gets nothing, the key does not leave, whole or streamed', async (status) => {
    const other = await elsewhere();
    const g = await gw({ primary: () => ({ status, headers: { location: `${other.origin}/v1/chat/completions?key=primary-key-0123456789`, 'content-type': 'text/html' }, steps: ['<a href="x">Moved</a>'] }) }, [{ provider: 'primary' }]);
    const err = await sdkError(g.client.chat.completions.create(CHAT));
    expect(err.status).toBe(502);
    expect((err.error as { code: string }).code).toBe('upstream_redirect');
    expect(err.message).not.toContain('primary-key-0123456789');
    const streamErr = await sdkError(g.client.chat.completions.create({ ...CHAT, stream: true }));
    expect(streamErr.status).toBe(502);
    expect(other.hits).toEqual([]);
    expect(g.seen.primary).toHaveLength(2);
  });
});

// ---------------------------------------------------------------------------------------------------------------
// Upstream framing that an HTTP/1.1 parser must refuse.

describe('an upstream answer whose framing is broken', () => {
  const body = completion('framed', 'gpt-4o').steps[0] as string;
  const gatewayOver = async (origin: string) => gw({}, [{ provider: 'raw' }], { extra: { providers: { raw: { family: 'openai', baseUrl: `${origin}/v1`, apiKey: 'raw-key-0123456789', breaker: false } } } });

  // undici reports a parser error met after a content-length header (llhttp refusing the header block) as
  // UND_ERR_RES_CONTENT_LENGTH_MISMATCH, before any header reached the gateway: the provider answered, in bytes that
  // are not HTTP/1.1, so the README's 502 upstream_bad_response, not upstream_unavailable's "could not be reached".
  it.each([
    ['two content-lengths that disagree', (b: string) => `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${b.length}\r\ncontent-length: 10\r\n\r\n${b}`],
    ['a content-length beside transfer-encoding: chunked', (b: string) => `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${b.length}\r\ntransfer-encoding: chunked\r\n\r\n${b.length.toString(16)}\r\n${b}\r\n0\r\n\r\n`],
    ['a content-length that is no number', (b: string) => `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12abc\r\n\r\n${b}`],
    ['a NUL byte in a header after the content-length', (b: string) => `HTTP/1.1 200 OK\r\ncontent-length: ${b.length}\r\ncontent-type: application/json\r\nx-request-id: req_\u0000abc\r\n\r\n${b}`],
    ['a NUL byte in a header before the content-length', (b: string) => `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-request-id: req_\u0000abc\r\ncontent-length: ${b.length}\r\n\r\n${b}`],
    ['a body shorter than its content-length, then the close', (b: string) => `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: ${b.length + 40}\r\n\r\n${b}`],
  ])('%s: 502 upstream_bad_response after the retry (the provider answered), never "could not be reached"', async (_what, answer) => {
    const up = await rawUpstream(() => answer(body));
    const g = await gatewayOver(up.origin);
    const err = await sdkError(g.client.chat.completions.create(CHAT));
    expect(err.status).toBe(502);
    expect((err.error as { code: string }).code).toBe('upstream_bad_response');
    expect(err.message).not.toContain('could not be reached');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(up.requests).toHaveLength(2);
  });

  it('a stream request answered with a content-length beside transfer-encoding: chunked: the SDK gets 502 upstream_bad_response, no stream', async () => {
    const up = await rawUpstream(() => `HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n`);
    const g = await gatewayOver(up.origin);
    const err = await sdkError(g.client.chat.completions.create({ ...CHAT, stream: true }));
    expect(err.status).toBe(502);
    expect((err.error as { code: string }).code).toBe('upstream_bad_response');
  });

  // RFC 9110 15: a status is three digits from 100 to 599; llhttp reads any three digits. LinkedIn answers 999 to
  // clients it takes for bots, and broken proxies answer 600-something. Passed on as the upstream's status, it is one
  // no HTTP server can write: the gateway answered 500 internal_error, its own bug by the README's table.
  it.each([[600, false], [999, false], [600, true]])('an upstream status %i (stream %s): 502 upstream_bad_response in the OpenAI shape, not a 500', async (status, stream) => {
    const up = await rawUpstream(() => `HTTP/1.1 ${status} Request denied\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`);
    const g = await gatewayOver(up.origin);
    const err = await sdkError(g.client.chat.completions.create({ ...CHAT, stream }));
    expect(err.status).toBe(502);
    expect((err.error as { code: string }).code).toBe('upstream_bad_response');
    expect(err.message).toContain(String(status));
    expect(err.headers?.get('x-should-retry')).toBe('false');
  });

  // llhttp reads any three digits, 000 to 099 too; undici then fails its own assertion (statusCode >= 100) inside the
  // parser, and the gateway told the client the provider "could not be reached (last: ERR_ASSERTION)".
  it.each([['099', false], ['000', false], ['099', true]])('an upstream status %s (stream %s): 502 upstream_bad_response, not unreachable', async (status, stream) => {
    const up = await rawUpstream(() => `HTTP/1.1 ${status} Odd\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`);
    const g = await gatewayOver(up.origin);
    const err = await sdkError(g.client.chat.completions.create({ ...CHAT, stream }));
    expect(err.status).toBe(502);
    expect((err.error as { code: string }).code).toBe('upstream_bad_response');
    expect(err.message).not.toContain('ERR_ASSERTION');
  });

  it('a body longer than its content-length on a kept-alive connection: the first answer is whole, the next request is answered too', async () => {
    const up = await rawUpstream(() => `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}GARBAGE AFTER THE BODY\r\n`, false);
    const g = await gatewayOver(up.origin);
    for (let i = 0; i < 3; i++) {
      const done = await g.client.chat.completions.create(CHAT);
      expect(done.choices[0]!.message.content).toBe('framed');
    }
  });

  // RFC 9110 8.4.1.3: a recipient treats x-gzip as gzip; content codings are case-insensitive (8.4.1).
  it.each([['x-gzip', false], ['GZIP', false], ['x-gzip', true], ['GZIP', true]])('an answer in content-encoding %s (stream %s) is decoded: the SDK gets its text, one upstream request', async (enc, stream) => {
    const plain = stream ? (streamed('coded').steps as string[]).join('') : body;
    const up = await rawUpstream(() => {
      const zipped = gzipSync(plain);
      return Buffer.concat([Buffer.from(`HTTP/1.1 200 OK\r\ncontent-type: ${stream ? 'text/event-stream' : 'application/json'}\r\ncontent-encoding: ${enc}\r\ncontent-length: ${zipped.length}\r\n\r\n`), zipped]);
    });
    const g = await gatewayOver(up.origin);
    let text = '';
    if (stream) for await (const chunk of await g.client.chat.completions.create({ ...CHAT, stream: true })) text += chunk.choices[0]?.delta.content ?? '';
    else text = (await g.client.chat.completions.create(CHAT)).choices[0]!.message.content ?? '';
    expect(text).toBe(stream ? 'coded' : 'framed');
    expect(up.requests).toHaveLength(1);
  });

  it('a 103 Early Hints before the answer: the SDK gets the 200 answer, one upstream request', async () => {
    const up = await rawUpstream(() => `HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`);
    const g = await gatewayOver(up.origin);
    const done = await g.client.chat.completions.create(CHAT);
    expect(done.choices[0]!.message.content).toBe('framed');
    expect(up.requests).toHaveLength(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
// Browser-ish clients and odd request lines on a managed path.

describe('a browser-ish client on /v1/chat/completions', () => {
  const origin = (g: { s: { baseURL: string } }) => g.s.baseURL.replace(/\/v1$/, '');

  it('a CORS preflight (OPTIONS) gets 405 in the OpenAI shape with allow: POST, no CORS grant, and nothing upstream', async () => {
    const g = await gw({ primary: healthy('x') }, [{ provider: 'primary' }]);
    const res = await fetch(`${g.s.baseURL}/chat/completions`, {
      method: 'OPTIONS',
      headers: { origin: 'https://evil.example', 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization, content-type' },
    });
    expect(res.status).toBe(405);
    expect(res.headers.get('allow')).toBe('POST');
    expect(res.headers.get('access-control-allow-origin')).toBeNull();
    expect(res.headers.get('x-should-retry')).toBe('false');
    expectOpenAIError(await res.json(), 'method_not_allowed');
    expect(g.seen.primary).toHaveLength(0);
  });

  it.each(['PUT', 'PATCH', 'DELETE', 'GET'])('%s gets 405 in the OpenAI shape with allow: POST, and nothing upstream', async (method) => {
    const g = await gw({ primary: healthy('x') }, [{ provider: 'primary' }]);
    const res = await post(`${g.s.baseURL}/chat/completions`, CHAT_TEXT, { 'content-type': 'application/json' }, method);
    expect(res.status).toBe(405);
    expect(res.headers.get('allow')).toBe('POST');
    expectOpenAIError(res.body, 'method_not_allowed');
    expect(g.seen.primary).toHaveLength(0);
  });

  it('HEAD gets 405 with allow: POST and no body', async () => {
    const g = await gw({ primary: healthy('x') }, [{ provider: 'primary' }]);
    const res = await rawRequest(origin(g), `HEAD /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n`, { noBody: true });
    expect(res.status).toBe(405);
    expect(res.headers.allow).toBe('POST');
    expect(res.body).toBe('');
    expect(g.seen.primary).toHaveLength(0);
  });

  it('a 20 KB query string gets 431 headers_too_large in the OpenAI shape, and a 20 KB header too', async () => {
    const g = await gw({ primary: healthy('x') }, [{ provider: 'primary' }]);
    const long = await post(`${g.s.baseURL}/chat/completions?pad=${'a'.repeat(20_000)}`, CHAT_TEXT);
    expect(long.status).toBe(431);
    expectOpenAIError(long.body, 'headers_too_large');
    expect(long.headers.get('x-should-retry')).toBe('false');
    const big = await post(`${g.s.baseURL}/chat/completions`, CHAT_TEXT, { 'content-type': 'application/json', 'x-trace': 'b'.repeat(20_000) });
    expect(big.status).toBe(431);
    expectOpenAIError(big.body, 'headers_too_large');
    expect(g.seen.primary).toHaveLength(0);
  });

  // Only an escape of an unreserved character is the same path (RFC 3986 6.2.2.2); every other spelling is another
  // path, which no route serves: it must not reach the provider as the route's, nor crash the gateway.
  it.each([
    ['/v1/chat/completions/', 404],
    ['//v1/chat/completions', 404],
    ['/v1//chat/completions', 404],
    ['/v1/chat%2Fcompletions', 404],
    ['/v1/x/../chat/completions', 404],
    ['/v1/chat/./completions', 404],
    ['/V1/CHAT/COMPLETIONS', 404],
    ['/v1/chat/completions;x=1', 404],
    ['/v1/chat/completions%00', 404],
    ['/v1/chat/%63ompletions', 200],
  ])('%s: %i (404 unknown_url in the OpenAI shape with nothing upstream, or the route)', async (path, status) => {
    const g = await gw({ primary: healthy('served') }, [{ provider: 'primary' }]);
    const res = await rawRequest(origin(g), `POST ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${CHAT_TEXT.length}\r\nConnection: close\r\n\r\n${CHAT_TEXT}`);
    expect(res.status).toBe(status);
    if (status === 200) {
      expect(g.seen.primary).toHaveLength(1);
      expect(g.seen.primary![0]!.url).toBe('/v1/chat/completions');
    } else {
      expectOpenAIError(JSON.parse(res.body), 'unknown_url');
      expect(res.headers['x-should-retry']).toBe('false');
      expect(g.seen.primary).toHaveLength(0);
    }
  });

  it('a query string on the route path is served, the upstream path unchanged', async () => {
    const g = await gw({ primary: healthy('served') }, [{ provider: 'primary' }]);
    const res = await post(`${g.s.baseURL}/chat/completions?trace=1`, CHAT_TEXT);
    expect(res.status).toBe(200);
    expect(g.seen.primary![0]!.url.split('?')[0]).toBe('/v1/chat/completions');
  });
});

// ---------------------------------------------------------------------------------------------------------------
// Request bodies a JSON endpoint meets.

describe('a request body in an odd charset, encoding or shape', () => {
  it('declared charset=utf-16 and sent as UTF-16LE: 400 invalid_json, nothing upstream', async () => {
    const g = await gw({ primary: healthy('x') }, [{ provider: 'primary' }]);
    const res = await post(`${g.s.baseURL}/chat/completions`, Buffer.from(`\ufeff${CHAT_TEXT}`, 'utf16le'), { 'content-type': 'application/json; charset=utf-16' });
    expect(res.status).toBe(400);
    expectOpenAIError(res.body, 'invalid_json');
    expect(g.seen.primary).toHaveLength(0);
  });

  it('form-encoded gets 415 unsupported_media_type, nothing upstream', async () => {
    const g = await gw({ primary: healthy('x') }, [{ provider: 'primary' }]);
    const res = await post(`${g.s.baseURL}/chat/completions`, `model=gpt-4o&messages=hi`, { 'content-type': 'application/x-www-form-urlencoded' });
    expect(res.status).toBe(415);
    expectOpenAIError(res.body, 'unsupported_media_type');
    expect(g.seen.primary).toHaveLength(0);
  });

  it.each(['', 'null', '[]', `[${CHAT_TEXT}]`, '"gpt-4o"', '42', 'true'])('%j gets 400 in the OpenAI shape, nothing upstream', async (text) => {
    const g = await gw({ primary: healthy('x') }, [{ provider: 'primary' }]);
    const res = await post(`${g.s.baseURL}/chat/completions`, text);
    expect(res.status).toBe(400);
    expectOpenAIError(res.body, 'invalid_body');
    expect(g.seen.primary).toHaveLength(0);
  });

  it('a UTF-8 BOM before the JSON is served, and the provider gets JSON it can parse', async () => {
    const g = await gw({ primary: healthy('bom ok') }, [{ provider: 'primary' }]);
    const res = await post(`${g.s.baseURL}/chat/completions`, `\ufeff${CHAT_TEXT}`);
    expect(res.status).toBe(200);
    expect(g.seen.primary![0]!.raw!.charCodeAt(0)).not.toBe(0xfeff);
  });

  it.each([
    ['messages content', (deep: string) => `{"model":"gpt-4o","messages":[{"role":"user","content":${deep}}]}`],
    ['metadata', (deep: string) => `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"metadata":${deep}}`],
  ])('100,000 levels of nesting in %s: an answer in the OpenAI shape (not a 500), and the gateway serves the next request', async (_where, build) => {
    const g = await gw({ primary: healthy('still up') }, [{ provider: 'primary' }]);
    const deep = '['.repeat(100_000) + ']'.repeat(100_000);
    const res = await post(`${g.s.baseURL}/chat/completions`, build(deep));
    expect(res.status).toBeLessThan(500);
    if (res.status !== 200) expectOpenAIError(res.body, 'invalid_body');
    const next = await g.client.chat.completions.create(CHAT);
    expect(next.choices[0]!.message.content).toBe('still up');
  });

  it('numbers past 2^53 and past a double reach the provider as the client wrote them', async () => {
    const g = await gw({ primary: healthy('x') }, [{ provider: 'primary' }]);
    const text = `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"seed":9007199254740993,"metadata":{"n":"1"},"logit_bias":{"50256":-100.0000000000000000001},"temperature":1e-400}`;
    const res = await post(`${g.s.baseURL}/chat/completions`, text);
    expect(res.status).toBe(200);
    expect(g.seen.primary![0]!.raw).toContain('9007199254740993');
    expect(g.seen.primary![0]!.raw).toContain('1e-400');
  });

  it("duplicate model keys: the provider is asked for the model the gateway routed, and for one model only", async () => {
    const g = await gw({ primary: healthy('x'), backup: healthy('y') }, [{ provider: 'primary', model: 'gpt-4o-mini' }]);
    const text = `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"model":"o1-pro"}`;
    const res = await post(`${g.s.baseURL}/chat/completions`, text);
    expect(res.status).toBe(200);
    const raw = g.seen.primary![0]!.raw!;
    expect(raw.match(/"model"/g)).toHaveLength(1);
    expect(g.seen.primary![0]!.body.model).toBe('gpt-4o-mini');
  });

  it('a gzip-encoded request body with a lying content-encoding (says gzip, is plain): 400 invalid_body, nothing upstream', async () => {
    const g = await gw({ primary: healthy('x') }, [{ provider: 'primary' }]);
    const res = await post(`${g.s.baseURL}/chat/completions`, CHAT_TEXT, { 'content-type': 'application/json', 'content-encoding': 'gzip' });
    expect(res.status).toBe(400);
    expectOpenAIError(res.body, 'invalid_body');
    expect(g.seen.primary).toHaveLength(0);
  });
});

// The status rules hold for stream requests: a failover before the first byte, an error raised by the SDK.
describe('a stream request meets a rare status', () => {
  it('501 from the primary, a stream to the backup: the SDK reads the backup\'s stream', async () => {
    const answer: Answer = (b) => (b.stream === true ? streamed('streamed backup') : completion('x', 'gpt-4o'));
    const g = await gw({ primary: () => html(501, '501 Not Implemented'), backup: answer }, [{ provider: 'primary' }, { provider: 'backup' }]);
    let text = '';
    for await (const chunk of await g.client.chat.completions.create({ ...CHAT, stream: true })) text += chunk.choices[0]?.delta.content ?? '';
    expect(text).toBe('streamed backup');
  });

  it("a 410 to a stream request: the SDK raises it with the provider's message, not a stream", async () => {
    const g = await gw({ primary: () => apiError(410, 'The model `gpt-4-0314` has been deprecated.', 'model_deprecated') }, [{ provider: 'primary' }]);
    const err = await sdkError(g.client.chat.completions.create({ ...CHAT, stream: true }));
    expect(err.status).toBe(410);
    expect(err.message).toContain('deprecated');
    expect(err).toBeInstanceOf(OpenAI.APIError);
  });
});
