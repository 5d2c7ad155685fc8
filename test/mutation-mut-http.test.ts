// Mutation testing of http/, config/ and the providers' header and key-echo code: each test here kills a change to
// the code that the rest of the suite let through (a boundary moved by one, a dropped call, a list shortened), so it
// names the behaviour that change would have broken. Pure functions, called directly: every value is exact.
import Fastify, { type FastifyInstance } from 'fastify';
import { pino } from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { admission } from '../src/http/admission.ts';
import { clientAuth } from '../src/http/client-auth.ts';
import { headerSafe } from '../src/http/header-safe.ts';
import { PassThrough } from 'node:stream';
import { gzipSync } from 'node:zlib';
import { GatewayError } from '../src/errors.ts';
import { contentEncoding, decodeBody, parseJsonBody, printable } from '../src/http/request-body.ts';
import { parseConfig } from '../src/config/load.ts';
import { configErrorOf, validConfigText } from './helpers/config-text.ts';
import { loopGuard } from '../src/http/loop-guard.ts';
import { headerWithoutKey, withoutKey, withoutKeyCut } from '../src/providers/key-echo.ts';
import { forwardedRequestHeaders, forwardedResponseHeaders } from '../src/providers/headers.ts';

const KEY = 'sk-live-0123456789abcdef';

describe('a provider key quoted where a cut falls', () => {
  it('is taken out when the cut leaves all of the key but its last character', () => {
    const text = `{"error":"bad key ${KEY.slice(0, -1)}`;
    expect(withoutKeyCut(text, KEY)).toBe('{"error":"bad key [redacted]');
    expect(withoutKeyCut(Buffer.from(text), KEY).toString()).toBe('{"error":"bad key [redacted]');
  });

  it('is taken out from four characters of its start, and three are left as ordinary text', () => {
    expect(withoutKeyCut('quoted sk-l', KEY)).toBe('quoted [redacted]');
    expect(withoutKeyCut('quoted sk-', KEY)).toBe('quoted sk-');
  });

  it('is taken out everywhere it is quoted whole, not only the first time', () => {
    expect(withoutKey(`${KEY} and again ${KEY}`, KEY)).toBe('[redacted] and again [redacted]');
  });
});

describe('a header value that quotes the provider key', () => {
  it('loses the key whether it is one value or a list of them', () => {
    expect(headerWithoutKey(`Bearer ${KEY}`, KEY)).toBe('Bearer [redacted]');
    expect(headerWithoutKey([`a ${KEY}`, 7, 'plain'], KEY)).toEqual(['a [redacted]', 7, 'plain']);
    expect(headerWithoutKey(undefined, KEY)).toBeUndefined();
  });
});

describe('the headers that cross the gateway', () => {
  it('forwards the idempotency key and the SDK description upstream, never the SDK timeouts or the credentials', () => {
    const out = forwardedRequestHeaders({
      authorization: `Bearer ${KEY}`,
      cookie: 'a=b',
      'idempotency-key': 'k-1',
      'x-stainless-lang': 'js',
      'x-stainless-timeout': '600',
      'x-stainless-read-timeout': '600',
      accept: ['application/json', 'text/event-stream'],
    });
    expect(out).toEqual({ 'idempotency-key': 'k-1', 'x-stainless-lang': 'js', accept: 'application/json, text/event-stream' });
  });

  it("passes Anthropic's request-id on as x-request-id too, without the key an upstream echoed in it", () => {
    expect(forwardedResponseHeaders({ 'request-id': `req_${KEY}`, 'x-internal': 'no' }, KEY)).toEqual({ 'request-id': 'req_[redacted]', 'x-request-id': 'req_[redacted]' });
    expect(forwardedResponseHeaders({ 'request-id': 'a', 'x-request-id': 'b' }, KEY)).toEqual({ 'request-id': 'a', 'x-request-id': 'b' });
  });
});

/** A bare fastify app behind the gateway's onRequest admission, so what admission decides is seen on its own. */
const apps: FastifyInstance[] = [];
afterEach(async () => {
  await Promise.all(apps.splice(0).map((a) => a.close()));
});
function admittingApp(opts: { keys?: Record<string, string>; phase?: 'serving' | 'draining' | 'closing'; allowedHosts?: string[] }): FastifyInstance {
  const app = Fastify();
  apps.push(app);
  const admit = admission({
    config: { server: { host: '127.0.0.1', ...(opts.allowedHosts && { allowedHosts: opts.allowedHosts }) } as never, auth: opts.keys && { keys: opts.keys } },
    loop: loopGuard(),
    logger: pino({ level: 'silent' }),
    managedPaths: new Set(['/v1/chat/completions']),
    opsPaths: new Set(['/healthz']),
    drain: { phase: opts.phase ?? 'serving' },
  });
  app.addHook('onRequest', (request, reply, done) => {
    if (admit(request, reply)) done();
  });
  app.post('/v1/chat/completions', async (request) => ({ served: true, client: request.client ?? null }));
  app.get('/healthz', async () => ({ ok: true }));
  return app;
}
const chat = (app: FastifyInstance, url = '/v1/chat/completions', headers: Record<string, string> = {}) =>
  app.inject({ method: 'POST', url, headers: { host: 'localhost', 'content-type': 'application/json', ...headers }, payload: {} });

describe('admission before the body', () => {
  it('names the client whose key it took, and says a missing key and a wrong one apart, with a Bearer challenge', async () => {
    const app = admittingApp({ keys: { agents: 'client-key-agents-1' } });
    expect((await chat(app, undefined, { authorization: 'Bearer client-key-agents-1' })).json()).toEqual({ served: true, client: 'agents' });
    const missing = await chat(app);
    expect(missing.statusCode).toBe(401);
    expect(missing.headers['www-authenticate']).toBe('Bearer realm="stormgate"');
    expect(missing.json().error.message).toContain('needs a client key');
    const wrong = await chat(app, undefined, { 'x-api-key': 'client-key-agents-2' });
    expect(wrong.statusCode).toBe(401);
    expect(wrong.json().error.message).toContain('not one of this gateway');
    expect(wrong.body).not.toContain('client-key-agents-2');
    expect((await app.inject({ method: 'GET', url: '/healthz', headers: { host: 'localhost' } })).statusCode).toBe(200);
  });

  it('refuses a Host it does not answer to, naming it', async () => {
    const app = admittingApp({});
    const res = await chat(app, undefined, { host: 'evil.example' });
    expect(res.statusCode).toBe(403);
    expect(res.json().error.message).toContain('"evil.example"');
    expect((await chat(app)).statusCode).toBe(200);
  });

  it('refuses new managed requests once closing, however the path is spelled, and serves them while draining', async () => {
    const closing = admittingApp({ phase: 'closing' });
    for (const url of ['/v1/chat/completions', '/v1/chat/completions?x=1', '/v1/chat/%63ompletions']) {
      const res = await chat(closing, url);
      expect(res.statusCode, url).toBe(503);
      expect(res.json().error.code, url).toBe('gateway_draining');
    }
    expect((await closing.inject({ method: 'GET', url: '/healthz', headers: { host: 'localhost' } })).statusCode).toBe(200);
    expect((await chat(admittingApp({ phase: 'draining' }))).statusCode).toBe(200);
  });
});

describe('${VAR} in config values', () => {
  const env = { OPENAI_API_KEY: 'sk-test' };

  it('turns $${ into a literal ${ in a value that references no variable', () => {
    const config = parseConfig(validConfigText().replace('apiKey: ${OPENAI_API_KEY}', () => 'apiKey: "pa$${ss"'), 'gw.yaml', env);
    expect(config.providers.openai!.apiKey).toBe('pa${ss');
  });

  it("quotes a default written in the file, which is no secret, rather than naming a variable that is not set", () => {
    const text = validConfigText().replace('baseUrl: https://api.openai.com/v1', 'baseUrl: "${BASE_URL:-not-a-url}"');
    expect(configErrorOf(text, env).message).toBe('gw.yaml:4: providers.openai.baseUrl: expected a URL such as https://api.example.com/v1, received "not-a-url"');
    expect(configErrorOf(text, { ...env, BASE_URL: 'secret-ish' }).message).toContain('received the value of $BASE_URL');
  });
});

describe('the managed request body', () => {
  const codeOf = (f: () => unknown) => {
    try {
      f();
    } catch (err) {
      return (err as GatewayError).code;
    }
    return 'accepted';
  };

  it('reads the content coding in any case and with spaces, takes identity as none, and refuses the unknown', () => {
    expect(contentEncoding(' GZip ')).toBe('gzip');
    expect(contentEncoding('x-gzip')).toBe('x-gzip');
    expect(contentEncoding('Identity')).toBeUndefined();
    expect(contentEncoding('')).toBeUndefined();
    expect(codeOf(() => contentEncoding('zstd'))).toBe('unsupported_media_type');
    expect(codeOf(() => contentEncoding('constructor'))).toBe('unsupported_media_type');
    expect(codeOf(() => contentEncoding('hasownproperty'))).toBe('unsupported_media_type');
  });

  /** Feeds `chunks` to decodeBody and collects what comes out, or the error it ends with. */
  async function decoded(chunks: Buffer[], limit: number, opts: { endUpload?: boolean } = {}) {
    const upload = new PassThrough();
    const out = decodeBody(upload, 'gzip', limit) as PassThrough & { receivedEncodedLength: number };
    const got: Buffer[] = [];
    const ended = new Promise<Error | undefined>((resolve) => {
      out.on('data', (c: Buffer) => got.push(c));
      out.on('end', () => resolve(undefined));
      out.on('error', resolve);
    });
    for (const c of chunks) upload.write(c);
    if (opts.endUpload === false) upload.destroy();
    else upload.end();
    const err = await ended;
    return { err, text: Buffer.concat(got).toString(), encoded: out.receivedEncodedLength };
  }

  it('passes a body of exactly the limit, counts the encoded bytes of every chunk, and refuses one byte more with 413', async () => {
    const body = Buffer.from('x'.repeat(1000));
    const gz = gzipSync(body);
    const whole = await decoded([gz.subarray(0, 10), gz.subarray(10)], 1000);
    expect(whole).toEqual({ err: undefined, text: body.toString(), encoded: gz.length });
    const over = await decoded([gz], 999);
    expect((over.err as GatewayError).code).toBe('request_too_large');
  });

  it('adds up the decoded size over every chunk the decoder gives, and reads on past the limit so the 413 can be answered', async () => {
    // zlib hands out 16 KiB at a time: each chunk alone is under the limit, their sum is not.
    const gz = gzipSync(Buffer.alloc(64 * 1024, 0x20));
    const upload = new PassThrough();
    const out = decodeBody(upload, 'gzip', 40_000) as PassThrough & { receivedEncodedLength: number };
    out.resume();
    const err = await new Promise<Error>((resolve) => {
      out.on('error', resolve);
      upload.write(gz);
    });
    expect((err as GatewayError).code).toBe('request_too_large');
    // The rest of the upload is still read (and dropped), not left for the client to stall on.
    const before = out.receivedEncodedLength;
    upload.write(Buffer.alloc(100));
    await new Promise((r) => setImmediate(r));
    expect(out.receivedEncodedLength).toBe(before + 100);
    upload.end();
  });

  it('passes on the reason the upload failed', async () => {
    const upload = new PassThrough();
    const out = decodeBody(upload, 'gzip', 1000);
    const err = new Promise<Error>((resolve) => out.on('error', resolve));
    upload.destroy(new Error('socket reset by peer'));
    expect((await err).message).toBe('socket reset by peer');
  });

  it('ends with an error, not a wait, when the client drops the upload half-way', async () => {
    const gz = gzipSync(Buffer.from('y'.repeat(5000)));
    const cut = await decoded([gz.subarray(0, 20)], 100_000, { endUpload: false });
    expect(cut.err?.message).toContain('closed the connection');
  });

  it('takes a JSON object after a byte order mark, and refuses an empty, non-UTF-8 or non-object body', () => {
    const ok = parseJsonBody(Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from('{"a":1}')]));
    expect(ok).toEqual({ raw: Buffer.from('{"a":1}'), json: { a: 1 } });
    expect((parseJsonBody(Buffer.from([0xef, 0xbb, 0xbf])) as GatewayError).code).toBe('invalid_body');
    expect((parseJsonBody(Buffer.from([0x7b, 0x22, 0xe9, 0x22, 0x3a, 0x31, 0x7d])) as GatewayError).code).toBe('invalid_json');
    expect((parseJsonBody(Buffer.from('[1]')) as GatewayError).code).toBe('invalid_body');
    expect((parseJsonBody(Buffer.from('null')) as GatewayError).code).toBe('invalid_body');
    const bad = parseJsonBody(Buffer.from('{"a":\u0001')) as GatewayError;
    expect(bad.code).toBe('invalid_json');
    expect(bad.message).not.toMatch(/[\x00-\x1f]/);
  });

  it('echoes client text printable and cut: C1 controls and replacement characters become ?, 200 characters kept', () => {
    expect(printable('a\u0085b\ufffdc\u007f\u0000')).toBe('a?b?c??');
    expect(printable('m'.repeat(200))).toBe('m'.repeat(200));
    expect(printable('m'.repeat(201))).toBe(`${'m'.repeat(200)}...`);
  });
});

describe('a reference that is not a variable name', () => {
  it('is refused when it starts with a digit, as the shell would not read it', () => {
    const text = validConfigText().replace('apiKey: ${OPENAI_API_KEY}', () => 'apiKey: "${9LIVES}"');
    expect(configErrorOf(text, { '9LIVES': 'x' }).message).toContain('invalid reference "${9LIVES}"');
  });
});

describe('client keys', () => {
  const check = clientAuth({ agents: 'client-key-agents-1' })!;

  it('takes the key from any SDK header, Bearer in any case, with surrounding spaces trimmed', () => {
    expect(check({ authorization: 'bearer  client-key-agents-1 ' })).toEqual({ ok: true, client: 'agents' });
    expect(check({ 'api-key': 'client-key-agents-1' })).toEqual({ ok: true, client: 'agents' });
    expect(check({ 'x-api-key': ' client-key-agents-1\t' })).toEqual({ ok: true, client: 'agents' });
  });

  it('reads the other headers when authorization holds no Bearer key, and calls blank headers missing', () => {
    expect(check({ authorization: 'Basic dXNlcjpwYXNz', 'x-api-key': 'client-key-agents-1' })).toEqual({ ok: true, client: 'agents' });
    expect(check({ authorization: 'Bearer    ', 'api-key': 'client-key-agents-1' })).toEqual({ ok: true, client: 'agents' });
    expect(check({ 'x-api-key': '   ' })).toEqual({ ok: false, reason: 'missing' });
    expect(check({})).toEqual({ ok: false, reason: 'missing' });
    expect(check({ 'x-api-key': 'client-key-agents-2' })).toEqual({ ok: false, reason: 'invalid' });
  });

  it('leaves the gateway open only when no key is configured', () => {
    expect(clientAuth(undefined)).toBeUndefined();
    expect(clientAuth({})).toBeUndefined();
  });
});

describe('header values the gateway writes', () => {
  it('percent-encodes as upper-case two-digit UTF-8 bytes, DEL included, and keeps 256 characters', () => {
    expect(headerSafe('gpt\u0009é\u007f~')).toBe('gpt%09%C3%A9%7F~');
    expect(headerSafe('m'.repeat(256))).toBe('m'.repeat(256));
    expect(headerSafe('m'.repeat(257))).toBe('m'.repeat(256));
  });
});
