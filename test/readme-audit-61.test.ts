// README claims checked as a new user meets them (audit 61), from the sections earlier audits touched least, each
// driven over real HTTP against the bundled mock or a provider of the test's own, with the official openai SDK or
// fetch: "Headers" (what a managed request takes from the client, what comes back), "Paths" (the passthrough's
// dropped headers both ways, its error shapes, its redirect, GET /v1/models in Anthropic's shape and when a provider's
// list fails), "Errors" (the intro's wrapping of foreign error shapes, TRACE, CONNECT, a request after
// `connection: close`), "Client keys" (a key beside a proxy's Basic credentials, a key in the query), "Logs and
// metrics" (the passthrough and client-limit series) and "The mock provider" (its request log, brownout answers, spec
// refusals, rate-limit refusals and headers). What earlier audits pin is not repeated where a claim was whole there.
// What did not hold: README "Logs and metrics" has model names in messages cut at 128 characters (as x-stormgate-target
// and the log lines cut them, with `…`), but a model_not_found message quoted up to 200 (and `...`), both on a managed
// path and on GET /v1/models/{model}: it is now cut as the others are. One README sentence was made exact: the
// x-stainless-* headers not sent upstream are x-stainless-timeout and x-stainless-read-timeout.
import { describe, expect, it } from 'vitest';
import type { IncomingMessage, ServerResponse } from 'node:http';
import OpenAI from 'openai';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { connect } from 'node:net';
import { parseAnswer } from './helpers/raw-http.ts';
import { rawGet } from './helpers/passthrough-files.ts';
import { RETRY_LOOP_ONLY, TEST_KEY, configServedBy, defaultConfig, scrapeMetrics, useStacks, type MetricSample } from './helpers/stack.ts';

const startStack = useStacks();
const startFake = useFakeProviders();

const CHAT = { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] };

function chat(url: string, headers: Record<string, string> = {}, body: unknown = CHAT): Promise<Response> {
  return fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
}

type ErrorBody = { message: string; type: string; param: string | null; code: string | null };
async function errorOf(res: Response | { body: string }): Promise<ErrorBody> {
  const body = (res instanceof Response ? await res.json() : JSON.parse(res.body)) as { error: ErrorBody };
  expect(Object.keys(body.error).sort()).toEqual(['code', 'message', 'param', 'type']);
  return body.error;
}

/** The value of the one series of `name` with exactly these labels (undefined when absent). */
function value(samples: MetricSample[], name: string, labels: Record<string, string>): number | undefined {
  return samples.find((s) => s.name === name && JSON.stringify(Object.entries(s.labels).sort()) === JSON.stringify(Object.entries(labels).sort()))?.value;
}

/**
 * Writes `request` byte for byte on a connection of its own and reads until the gateway closes it (or `waitMs` passes):
 * every status line that came, the first answer parsed, and whether the gateway closed the connection.
 */
function converse(url: string, request: string, waitMs = 3_000): Promise<{ statuses: number[]; first: NonNullable<ReturnType<typeof parseAnswer>>; closed: boolean }> {
  return new Promise((resolve, reject) => {
    const socket = connect(Number(new URL(url).port), '127.0.0.1');
    let text = '';
    const done = (closed: boolean) => {
      clearTimeout(timer);
      socket.destroy();
      const first = parseAnswer(text, true);
      if (!first) return reject(new Error(`no answer: ${JSON.stringify(text.slice(0, 300))}`));
      resolve({ statuses: [...text.matchAll(/^HTTP\/1\.1 (\d{3}) /gm)].map((m) => Number(m[1])), first, closed });
    };
    const timer = setTimeout(() => done(false), waitMs);
    socket.on('data', (d: Buffer) => (text += d.toString('latin1')));
    socket.on('end', () => done(true));
    socket.on('error', () => undefined);
    socket.write(request);
  });
}

/** A provider of the test's own that records each request (headers and URL) and answers with `answer`. */
async function recordingProvider(answer: (req: IncomingMessage, res: ServerResponse) => void): Promise<{ origin: string; seen: Array<{ url: string; method: string; headers: IncomingMessage['headers'] }> }> {
  const seen: Array<{ url: string; method: string; headers: IncomingMessage['headers'] }> = [];
  const fake = await startFake((req, res) => {
    seen.push({ url: req.url ?? '', method: req.method ?? '', headers: req.headers });
    req.resume();
    req.on('end', () => answer(req, res));
  });
  return { origin: fake.origin, seen };
}

const json = (res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void => {
  res.writeHead(status, { 'content-type': 'application/json', ...headers });
  res.end(typeof body === 'string' ? body : JSON.stringify(body));
};

/** The client's headers the README says go upstream as they came. */
const FORWARDED = {
      accept: 'application/json',
      'user-agent': 'audit61/1.0',
      'openai-beta': 'assistants=v2',
      'anthropic-beta': 'tools-2024',
      traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
      tracestate: 'vendor=1',
      baggage: 'team=qa',
      'x-stainless-lang': 'js',
      'x-stainless-retry-count': '0',
};

describe('README "Headers"', () => {
  it('sends upstream of the client only accept, user-agent, openai-beta, anthropic-beta, the trace headers and x-stainless-* but the two timeout ones', async () => {
    const s = await startStack(RETRY_LOOP_ONLY);
    const res = await chat(s.url, {
      ...FORWARDED,
      'x-stainless-timeout': '600',
      'x-stainless-read-timeout': '600',
      'openai-organization': 'org-client',
      'openai-project': 'proj-client',
      cookie: 'session=1',
      'proxy-authorization': 'Basic Zm9vOmJhcg==',
      'x-forwarded-for': '10.0.0.9',
      'x-custom': 'nope',
      'accept-language': 'fr',
    });
    expect(res.status).toBe(200);
    const [logged] = (await (await fetch(`${s.mock.url}/_mock/requests?limit=1`)).json()) as Array<{ headers: Record<string, string> }>;
    const h = logged!.headers;
    expect(h).toMatchObject({
      authorization: `Bearer ${TEST_KEY}`,
      'content-type': 'application/json',
      ...FORWARDED,
      'x-client-request-id': res.headers.get('x-stormgate-request-id')!,
    });
    expect(h['via']).toMatch(/^1\.1 stormgate-[0-9a-f]{8}$/);
    for (const dropped of ['x-stainless-timeout', 'x-stainless-read-timeout', 'openai-organization', 'openai-project', 'cookie', 'proxy-authorization', 'x-forwarded-for', 'x-custom', 'accept-language']) {
      expect(h[dropped], dropped).toBeUndefined();
    }
  });

  it('passes back x-request-id, request-id, apim-request-id and the openai-* three, writes application/json for Application/JSON, and drops rate-limit, organisation and cookie headers', async () => {
    const body = JSON.stringify({ id: 'chatcmpl-1', object: 'chat.completion', created: 1, model: 'gpt-4o', choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }] });
    const p = await recordingProvider((_req, res) => {
      res.writeHead(200, {
        'content-type': 'Application/JSON',
        'x-request-id': 'req_up_1',
        'request-id': 'req_anth_1',
        'apim-request-id': 'apim-1',
        'openai-processing-ms': '42',
        'openai-version': '2020-10-01',
        'openai-model': 'gpt-4o-2024-08-06',
        'openai-organization': 'org-company',
        'x-ratelimit-remaining-requests': '99',
        'x-ratelimit-reset-tokens': '1s',
        'set-cookie': '__cf_bm=abc',
      });
      res.end(body);
    });
    const s = await startStack({ config: (mockUrl) => configServedBy(mockUrl, 'up', `${p.origin}/v1`) });
    const res = await chat(s.url);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('application/json');
    expect(res.headers.get('x-request-id')).toBe('req_up_1');
    expect(res.headers.get('request-id')).toBe('req_anth_1');
    expect(res.headers.get('apim-request-id')).toBe('apim-1');
    expect(res.headers.get('openai-processing-ms')).toBe('42');
    expect(res.headers.get('openai-version')).toBe('2020-10-01');
    expect(res.headers.get('openai-model')).toBe('gpt-4o-2024-08-06');
    for (const dropped of ['openai-organization', 'x-ratelimit-remaining-requests', 'x-ratelimit-reset-tokens', 'set-cookie']) expect(res.headers.get(dropped), dropped).toBeNull();
    // The SDK gets an object, not a string.
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'x', maxRetries: 0 });
    const c = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    expect(c.choices[0]!.message.content).toBe('ok');
  });

  it('answers a stream as text/event-stream; charset=utf-8 whatever the provider wrote', async () => {
    const p = await recordingProvider((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(`data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta: { role: 'assistant', content: 'hey' }, finish_reason: null }] })}\n\n`);
      res.write(`data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] })}\n\n`);
      res.end('data: [DONE]\n\n');
    });
    const s = await startStack({ config: (mockUrl) => configServedBy(mockUrl, 'up', `${p.origin}/v1`) });
    const res = await chat(s.url, {}, { ...CHAT, stream: true });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
    expect(await res.text()).toContain('data: [DONE]');
  });
});

describe('README "Headers": Anthropic', () => {
  it('sends the client\'s anthropic-version on /v1/messages and 2023-06-01 on a translated chat, each with the provider\'s x-api-key, never the client\'s', async () => {
    const s = await startStack({
      config: (mockUrl) => ({
        ...defaultConfig(mockUrl, RETRY_LOOP_ONLY),
        providers: { claude: { family: 'anthropic', baseUrl: mockUrl, apiKey: TEST_KEY } },
        routes: [
          { name: 'messages', match: { path: '/v1/messages' }, targets: [{ provider: 'claude' }] },
          { name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'claude', model: 'claude-haiku-4-5' }] },
        ],
      }),
    });
    const messages = await fetch(`${s.url}/v1/messages`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'anthropic-version': '2023-01-01', 'x-api-key': 'sk-ant-client' },
      body: JSON.stringify({ model: 'claude-haiku-4-5', max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(messages.status).toBe(200);
    expect((await chat(s.url, { authorization: 'Bearer sk-client' })).status).toBe(200);
    const seen = (await (await fetch(`${s.mock.url}/_mock/requests`)).json()) as Array<{ path: string; headers: Record<string, string> }>;
    expect(seen.map((r) => [r.path, r.headers['anthropic-version'], r.headers['x-api-key'], r.headers['authorization']])).toEqual([
      ['/v1/messages', '2023-01-01', TEST_KEY, undefined],
      ['/v1/messages', '2023-06-01', TEST_KEY, undefined],
    ]);
  });
});

describe('README "Paths": passthrough', () => {
  const passthroughTo = (origin: string) =>
    startStack({ config: (mockUrl) => ({ ...configServedBy(mockUrl, 'files', `${origin}/v1`), passthrough: { provider: 'files', paths: ['/v1/files'], methods: ['GET'] } }) });

  it('drops the client\'s method overrides, who-it-is headers, organisation and credentials; answers carry x-should-retry: false and none of the provider\'s rate-limit, organisation, cookie or x-stormgate-* headers', async () => {
    const p = await recordingProvider((_req, res) =>
      json(res, 200, { object: 'list', data: [] }, { 'x-request-id': 'req_f', 'x-ratelimit-remaining-requests': '9', 'openai-organization': 'org-company', 'set-cookie': 'a=b', 'x-stormgate-attempts': '7', 'keep-alive': 'timeout=1' }),
    );
    const s = await passthroughTo(p.origin);
    const res = await rawGet(`${s.url}/v1/files?purpose=batch`, {
      'x-http-method-override': 'DELETE',
      'x-http-method': 'DELETE',
      'x-method-override': 'DELETE',
      'x-original-method': 'DELETE',
      'x-original-url': '/v1/files/file-1',
      'x-rewrite-url': '/v1/files/file-1',
      'x-forwarded-for': '10.1.1.1',
      forwarded: 'for=10.1.1.1',
      'x-real-ip': '10.1.1.1',
      'x-client-ip': '10.1.1.1',
      'true-client-ip': '10.1.1.1',
      'openai-organization': 'org-client',
      'openai-project': 'proj-client',
      authorization: 'Bearer client-key',
      'x-api-key': 'client-key',
      'api-key': 'client-key',
      cookie: 's=1',
      'x-stormgate-priority': 'batch',
      'x-retry-attempt': '2',
      'x-retry-reason': 'status_503',
      'x-kept': 'yes',
    });
    expect(res.status).toBe(200);
    expect(res.body).toBe('{"object":"list","data":[]}');
    expect(p.seen).toHaveLength(1);
    const up = p.seen[0]!;
    expect(up.method).toBe('GET');
    expect(up.url).toBe('/v1/files?purpose=batch');
    expect(up.headers['authorization']).toBe('Bearer files-key');
    expect(up.headers['x-client-request-id']).toBe(res.headers['x-stormgate-request-id']);
    expect(up.headers['x-kept']).toBe('yes');
    for (const dropped of ['x-http-method-override', 'x-http-method', 'x-method-override', 'x-original-method', 'x-original-url', 'x-rewrite-url', 'x-forwarded-for', 'forwarded', 'x-real-ip', 'x-client-ip', 'true-client-ip', 'openai-organization', 'openai-project', 'x-api-key', 'api-key', 'cookie', 'x-stormgate-priority', 'x-retry-attempt', 'x-retry-reason']) {
      expect(up.headers[dropped], dropped).toBeUndefined();
    }
    expect(res.headers['x-should-retry']).toBe('false');
    expect(res.headers['x-request-id']).toBe('req_f');
    for (const dropped of ['x-ratelimit-remaining-requests', 'openai-organization', 'set-cookie', 'x-stormgate-attempts']) expect(res.headers[dropped], dropped).toBeUndefined();
    expect(res.headers['keep-alive']).not.toBe('timeout=1');
  });

  it('answers a provider\'s 401 502 upstream_auth_error with the gateway\'s own message, and puts an HTML 500 in the OpenAI shape', async () => {
    let n = 0;
    const p = await recordingProvider((_req, res) => {
      n++;
      if (n === 1) return json(res, 401, { error: { message: 'Incorrect API key provided: files-key', type: 'invalid_request_error', param: null, code: 'invalid_api_key' } });
      res.writeHead(500, { 'content-type': 'text/html' });
      res.end('<html><head><title>500 Internal Server Error</title></head><body><h1>oops</h1></body></html>');
    });
    const s = await passthroughTo(p.origin);
    const auth = await fetch(`${s.url}/v1/files`);
    expect(auth.status).toBe(502);
    expect(auth.headers.get('x-should-retry')).toBe('false');
    const e1 = await errorOf(auth);
    expect(e1.code).toBe('upstream_auth_error');
    expect(e1.message).not.toContain('files-key');
    const html = await fetch(`${s.url}/v1/files`);
    expect(html.status).toBe(500);
    expect(html.headers.get('content-type')).toMatch(/^application\/json/);
    const e2 = await errorOf(html);
    expect(e2.message).toContain('500 Internal Server Error');
    expect(e2.message).not.toContain('<');
    expect(p.seen).toHaveLength(2); // one attempt each
  });

  it('gives a redirect to the provider\'s own address under a passthrough path as the gateway\'s path, and one elsewhere as it is', async () => {
    let n = 0;
    let origin = '';
    const p = await recordingProvider((_req, res) => {
      n++;
      res.writeHead(302, { location: n === 1 ? `${origin}/v1/files/file-abc/content` : 'https://storage.example.com/signed?sig=1' });
      res.end();
    });
    origin = p.origin;
    const s = await passthroughTo(p.origin);
    const own = await fetch(`${s.url}/v1/files/file-abc`, { redirect: 'manual' });
    expect(own.status).toBe(302);
    expect(own.headers.get('location')).toBe('/v1/files/file-abc/content');
    const elsewhere = await fetch(`${s.url}/v1/files/file-abc`, { redirect: 'manual' });
    expect(elsewhere.status).toBe(302);
    expect(elsewhere.headers.get('location')).toBe('https://storage.example.com/signed?sig=1');
  });

  it('passes on an error the gateway cannot decode (zstd) as "upstream answered <status>", and a 304 with its headers as given', async () => {
    const p = await recordingProvider((req, res) => {
      if (req.url === '/v1/files/zstd') {
        res.writeHead(500, { 'content-type': 'application/json', 'content-encoding': 'zstd' });
        return res.end(Buffer.from([0x28, 0xb5, 0x2f, 0xfd, 1, 2, 3]));
      }
      res.writeHead(304, { etag: '"v1"' });
      res.end();
    });
    const s = await passthroughTo(p.origin);
    const zstd = await fetch(`${s.url}/v1/files/zstd`, { headers: { 'accept-encoding': 'zstd' } });
    expect(zstd.status).toBe(500);
    expect(zstd.headers.get('content-encoding')).toBeNull();
    expect(await errorOf(zstd)).toEqual({ message: 'upstream answered 500', type: 'server_error', param: null, code: null });
    const notModified = await fetch(`${s.url}/v1/files/a`, { headers: { 'if-none-match': '"v1"' } });
    expect(notModified.status).toBe(304);
    expect(notModified.headers.get('etag')).toBe('"v1"');
    expect(notModified.headers.get('x-should-retry')).toBe('false');
  });
});

describe('README "Paths": GET /v1/models', () => {
  it('with anthropic-version, lists only the models of the /v1/messages routes, in Anthropic\'s shape, one page', async () => {
    const s = await startStack({
      config: (mockUrl) => ({
        ...defaultConfig(mockUrl, RETRY_LOOP_ONLY),
        providers: { mock: { family: 'openai', baseUrl: `${mockUrl}/v1`, apiKey: TEST_KEY }, claude: { family: 'anthropic', baseUrl: mockUrl, apiKey: TEST_KEY } },
        routes: [
          { name: 'chat', match: { path: '/v1/chat/completions', models: ['gpt-4o'] }, targets: [{ provider: 'mock' }] },
          { name: 'messages', match: { path: '/v1/messages', models: ['claude-haiku-4-5', 'claude-sonnet-4-6'] }, targets: [{ provider: 'claude' }] },
        ],
      }),
    });
    const anth = await fetch(`${s.url}/v1/models`, { headers: { 'anthropic-version': '2023-06-01' } });
    expect(anth.status).toBe(200);
    const page = (await anth.json()) as { data: Array<Record<string, unknown>>; has_more: boolean; first_id: string; last_id: string };
    expect(page.data.map((m) => m['id'])).toEqual(['claude-haiku-4-5', 'claude-sonnet-4-6']);
    expect(page.has_more).toBe(false);
    expect(page.first_id).toBe('claude-haiku-4-5');
    expect(page.last_id).toBe('claude-sonnet-4-6');
    for (const m of page.data) {
      expect(m['type']).toBe('model');
      expect(m['display_name']).toBe(m['id']);
      expect(typeof m['created_at']).toBe('string');
    }
    // The OpenAI shape without the header: every route's models, the config-only ones as {id, object, created: 0, owned_by}.
    const oai = (await (await fetch(`${s.url}/v1/models`)).json()) as { object: string; data: Array<Record<string, unknown>> };
    expect(oai.object).toBe('list');
    expect(oai.data).toEqual([
      { id: 'gpt-4o', object: 'model', created: 0, owned_by: 'mock' },
      { id: 'claude-haiku-4-5', object: 'model', created: 0, owned_by: 'claude' },
      { id: 'claude-sonnet-4-6', object: 'model', created: 0, owned_by: 'claude' },
    ]);
    // A model it does not list, asked in Anthropic's shape: 404 model_not_found in the shape both SDKs read.
    const missing = await fetch(`${s.url}/v1/models/gpt-4o`, { headers: { 'anthropic-version': '2023-06-01' } });
    expect(missing.status).toBe(404);
    const body = (await missing.json()) as { type: string; error: ErrorBody };
    expect(body.type).toBe('error');
    expect(body.error.type).toBe('not_found_error');
    expect(body.error.code).toBe('model_not_found');
  });

  it('a provider whose list answers 4xx lists none (200, empty); one that answers 5xx is an outage: 502 upstream_unavailable, x-should-retry: false', async () => {
    const four = await recordingProvider((_req, res) => json(res, 404, { error: { message: 'no', type: 'invalid_request_error', param: null, code: null } }));
    const s1 = await startStack({ config: (mockUrl) => configServedBy(mockUrl, 'up', `${four.origin}/v1`) });
    const empty = await fetch(`${s1.url}/v1/models`);
    expect(empty.status).toBe(200);
    expect(await empty.json()).toEqual({ object: 'list', data: [] });
    await s1.close();

    const five = await recordingProvider((_req, res) => json(res, 500, { error: { message: 'down', type: 'server_error', param: null, code: null } }));
    const s2 = await startStack({ config: (mockUrl) => configServedBy(mockUrl, 'up', `${five.origin}/v1`) });
    const out = await fetch(`${s2.url}/v1/models`);
    expect(out.status).toBe(502);
    expect(out.headers.get('x-should-retry')).toBe('false');
    expect((await errorOf(out)).code).toBe('upstream_unavailable');
    // "a passing 5xx ... retried twice, by undici's retry interceptor": three requests for one listing.
    expect(five.seen.filter((r) => r.url.startsWith('/v1/models'))).toHaveLength(3);
  });
});

describe('README "Errors": the intro', () => {
  it('wraps an HTML 502 as "upstream answered 502: " and the page\'s title; a numeric code goes on as text, an object code as null, {"error": "..."} as the message', async () => {
    const answers = [
      () => ({ status: 502, type: 'text/html', body: '<html><head><title>502 Bad Gateway</title></head><body><center>nginx</center></body></html>' }),
      () => ({ status: 400, type: 'application/json', body: JSON.stringify({ error: { message: 'bad thing', type: 'invalid_request_error', param: null, code: 1234 } }) }),
      () => ({ status: 400, type: 'application/json', body: JSON.stringify({ error: { message: 'bad obj', type: 'invalid_request_error', param: null, code: { a: 1 } } }) }),
      () => ({ status: 400, type: 'application/json', body: JSON.stringify({ error: 'model "x" not found, try pulling it first' }) }),
    ];
    let i = 0;
    const p = await recordingProvider((_req, res) => {
      const a = answers[i++]!();
      res.writeHead(a.status, { 'content-type': a.type });
      res.end(a.body);
    });
    const s = await startStack({ config: (mockUrl) => ({ ...configServedBy(mockUrl, 'up', `${p.origin}/v1`), routes: configServedBy(mockUrl, 'up', `${p.origin}/v1`).routes.map((r) => ({ ...r, retry: { maxAttempts: 1 } })) }) });
    const html = await chat(s.url);
    expect(html.status).toBe(502);
    const e1 = await errorOf(html);
    expect(e1.message).toBe('upstream answered 502: 502 Bad Gateway');
    const numeric = await chat(s.url);
    expect(numeric.status).toBe(400);
    expect(await errorOf(numeric)).toEqual({ message: 'bad thing', type: 'invalid_request_error', param: null, code: '1234' });
    const object = await chat(s.url);
    expect((await errorOf(object)).code).toBeNull();
    const text = await chat(s.url);
    expect(text.status).toBe(400);
    expect((await errorOf(text)).message).toBe('model "x" not found, try pulling it first');
  });

  it('answers TRACE on a managed path 405 method_not_allowed with allow: POST, and CONNECT 400 bad_request, closing the connection', async () => {
    const s = await startStack(RETRY_LOOP_ONLY);
    const trace = await converse(s.url, `TRACE /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`, 1_000);
    expect(trace.first.status).toBe(405);
    expect(trace.first.headers['allow']).toBe('POST');
    expect(trace.first.headers['x-should-retry']).toBe('false');
    expect((await errorOf(trace.first)).code).toBe('method_not_allowed');
    const conn = await converse(s.url, `CONNECT api.openai.com:443 HTTP/1.1\r\nHost: api.openai.com:443\r\n\r\n`);
    expect(conn.statuses).toEqual([400]);
    expect((await errorOf(conn.first)).code).toBe('bad_request');
    expect(conn.first.headers['x-should-retry']).toBe('false');
    expect(conn.closed).toBe(true);
  });

  it('gives a request sent after connection: close on the same connection no answer: the first is answered, then the connection closes', async () => {
    const s = await startStack(RETRY_LOOP_ONLY);
    const body = JSON.stringify(CHAT);
    const req = (extra: string) => `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n${extra}\r\n${body}`;
    const answer = await converse(s.url, req('connection: close\r\n') + req(''));
    expect(answer.statuses).toEqual([200]);
    expect(answer.closed).toBe(true);
    const stats = (await (await fetch(`${s.mock.url}/_mock/stats`)).json()) as { total: number };
    expect(stats.total).toBe(1);
  });
});

describe('README "Client keys"', () => {
  it('reads x-api-key beside a proxy\'s Basic authorization; a key repeated in ?key= is taken out of a passthrough URL, the rest going on as it came', async () => {
    const p = await recordingProvider((_req, res) => json(res, 200, { object: 'list', data: [] }));
    const s = await startStack({
      config: (mockUrl) => ({ ...configServedBy(mockUrl, 'files', `${p.origin}/v1`), auth: { keys: { agents: 'sk-client-agents-1' } }, passthrough: { provider: 'files', paths: ['/v1/files'] } }),
    });
    const basic = await fetch(`${s.url}/v1/files?limit=2`, { headers: { authorization: 'Basic dXNlcjpwYXNz', 'x-api-key': 'sk-client-agents-1' } });
    expect(basic.status).toBe(200);
    const inQuery = await fetch(`${s.url}/v1/files?key=sk-client-agents-1&limit=3&purpose=a+b`, { headers: { 'api-key': 'sk-client-agents-1' } });
    expect(inQuery.status).toBe(200);
    expect(p.seen.map((r) => r.url)).toEqual(['/v1/files?limit=2', '/v1/files?limit=3&purpose=a+b']);
    for (const r of p.seen) {
      expect(r.headers['authorization']).toBe('Bearer files-key');
      expect(JSON.stringify(r.headers)).not.toContain('sk-client-agents-1');
    }
  });

  it('answers a request without a key 401 invalid_api_key with www-authenticate, which the SDK raises at once; the ops paths need none', async () => {
    const s = await startStack({ config: (mockUrl) => ({ ...defaultConfig(mockUrl, RETRY_LOOP_ONLY), auth: { keys: { agents: 'sk-client-agents-1' } } }) });
    let requests = 0;
    const client = new OpenAI({
      baseURL: s.baseURL,
      apiKey: 'sk-wrong',
      fetch: (url, init) => {
        requests++;
        return fetch(url, init);
      },
    });
    const err = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.AuthenticationError);
    expect((err as InstanceType<typeof OpenAI.AuthenticationError>).code).toBe('invalid_api_key');
    expect((err as InstanceType<typeof OpenAI.AuthenticationError>).headers.get('www-authenticate')).toBe('Bearer realm="stormgate"');
    expect(requests).toBe(1);
    for (const ops of ['/healthz', '/readyz', '/metrics']) expect((await fetch(`${s.url}${ops}`)).status, ops).toBe(200);
    const stats = (await (await fetch(`${s.mock.url}/_mock/stats`)).json()) as { total: number };
    expect(stats.total).toBe(0);
  });
});

describe('README "Logs and metrics"', () => {
  it('counts passthrough requests in stormgate_passthrough_requests_total{path,status_class} (the gateway\'s own 401 and 502 included), and client refusals in stormgate_client_limited_total{client,by}', async () => {
    const p = await recordingProvider((req, res) => (req.url === '/v1/files/b' ? json(res, 403, { error: { message: 'no', type: 'x', param: null, code: null } }) : json(res, 200, { object: 'list', data: [] })));
    const s = await startStack({
      config: (mockUrl) => ({
        ...configServedBy(mockUrl, 'files', `${p.origin}/v1`),
        auth: { keys: { agents: 'sk-client-agents-1' }, limits: { agents: { requestsPerMinute: 60, burst: 3 } } },
        passthrough: { provider: 'files', paths: ['/v1/files'] },
      }),
    });
    const key = { authorization: 'Bearer sk-client-agents-1' };
    expect((await fetch(`${s.url}/v1/files/a`, { headers: key })).status).toBe(200);
    expect((await fetch(`${s.url}/v1/files/b`, { headers: key })).status).toBe(502); // a provider's 403: upstream_auth_error
    expect((await fetch(`${s.url}/v1/files`)).status).toBe(401);
    expect((await fetch(`${s.url}/v1/files`, { headers: key })).status).toBe(200);
    const limited = await fetch(`${s.url}/v1/files`, { headers: key });
    expect(limited.status).toBe(429);
    expect((await errorOf(limited)).code).toBe('client_rate_limited');
    const m = await scrapeMetrics(s.url);
    const pt = (status_class: string) => value(m, 'stormgate_passthrough_requests_total', { path: '/v1/files', status_class });
    expect([pt('2xx'), pt('4xx'), pt('5xx')]).toEqual([2, 2, 1]);
    expect(value(m, 'stormgate_client_limited_total', { client: 'agents', by: 'requests' })).toBe(1);
    // Not in the managed routes' series.
    expect(m.filter((x) => x.name === 'stormgate_requests_total' && x.value > 0)).toEqual([]);
  });
});

describe('README "Logs and metrics": model names cut at 128 characters', () => {
  it('quotes a 300-character model the gateway does not serve cut at 128 characters, in a chat\'s 404 and in GET /v1/models/{model}\'s', async () => {
    const s = await startStack({ config: (mockUrl) => ({ ...defaultConfig(mockUrl, RETRY_LOOP_ONLY), routes: [{ name: 'chat', match: { path: '/v1/chat/completions', models: ['gpt-4o'] }, targets: [{ provider: 'mock' }] }] }) });
    const long = `${'m'.repeat(127)}X${'z'.repeat(172)}`;
    const cut = `${'m'.repeat(127)}X…`;
    const viaChat = await chat(s.url, {}, { model: long, messages: [{ role: 'user', content: 'hi' }] });
    expect(viaChat.status).toBe(404);
    expect(await errorOf(viaChat)).toEqual({ message: `the model \`${cut}\` is not served by this gateway`, type: 'invalid_request_error', param: 'model', code: 'model_not_found' });
    const viaModels = await fetch(`${s.url}/v1/models/${long}`);
    expect(viaModels.status).toBe(404);
    expect((await errorOf(viaModels)).message).toBe(`the model \`${cut}\` does not exist or is not served by this gateway`);
  });
});

describe('README "The mock provider"', () => {
  it('GET /_mock/requests?limit=N gives the last N requests with their headers; POST /_mock/reset clears the log and counts, not the spec', async () => {
    const s = await startStack({ ...RETRY_LOOP_ONLY, faults: { latencyMs: 1 } });
    for (const tag of ['a', 'b', 'c']) expect((await chat(s.url, { 'user-agent': `ua-${tag}` })).status).toBe(200);
    const two = (await (await fetch(`${s.mock.url}/_mock/requests?limit=2`)).json()) as Array<{ path: string; method: string; headers: Record<string, string>; status: number }>;
    expect(two.map((r) => r.headers['user-agent'])).toEqual(['ua-b', 'ua-c']);
    expect(two[0]).toMatchObject({ method: 'POST', path: '/v1/chat/completions', status: 200 });
    expect((await fetch(`${s.mock.url}/_mock/reset`, { method: 'POST' })).status).toBe(200);
    expect(await (await fetch(`${s.mock.url}/_mock/requests`)).json()).toEqual([]);
    expect(((await (await fetch(`${s.mock.url}/_mock/stats`)).json()) as { total: number }).total).toBe(0);
    expect(((await (await fetch(`${s.mock.url}/_mock/faults`)).json()) as { latencyMs: number }).latencyMs).toBe(1);
  });

  it('brownouts: the default answer, a 429 brownout\'s retry-after of the seconds left, and a field other than mode and durationMs or a durationMs that is no number refused with 400', async () => {
    const s = await startStack(RETRY_LOOP_ONLY);
    const brown = (body: unknown) => fetch(`${s.mock.url}/_mock/brownout`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    const d = await brown({});
    expect(d.status).toBe(200);
    expect(await d.json()).toEqual({ ok: true, mode: '503', durationMs: 10000 });
    expect(await (await brown({ durationMs: 0 })).json()).toEqual({ ok: true, ended: '503', durationMs: 0 });
    expect(await (await brown({ durationMs: 0 })).json()).toEqual({ ok: true, ended: null, durationMs: 0 });
    expect(await (await brown({ mode: '429', durationMs: 5000 })).json()).toEqual({ ok: true, mode: '429', durationMs: 5000 });
    const direct = await fetch(`${s.mock.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${TEST_KEY}` }, body: JSON.stringify(CHAT) });
    expect(direct.status).toBe(429);
    expect(['4', '5']).toContain(direct.headers.get('retry-after'));
    expect((await brown({ mode: '429', duration: 5000 })).status).toBe(400);
    expect((await brown({ mode: '429', durationMs: '5000' })).status).toBe(400);
    await brown({ durationMs: 0 });
  });

  it('refuses a status outside 400-599, a negative delay, a rate over 1, a count that is not whole and a misspelt field (naming the closest), with 400 and the spec as it was', async () => {
    const s = await startStack({ ...RETRY_LOOP_ONLY, faults: { errors: [{ status: 503, rate: 0.5 }] } });
    const before = await (await fetch(`${s.mock.url}/_mock/faults`)).json();
    const put = (body: unknown, method = 'PUT') => fetch(`${s.mock.url}/_mock/faults`, { method, headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    const high = await put({ errors: [{ status: 600, rate: 1 }] });
    expect(high.status).toBe(400);
    for (const bad of [{ latencyMs: -1 }, { resetRate: 1.5 }, { hangRate: 2 }, { capacity: 2.5 }, { errors: [{ status: 503, rate: 1, times: 1.5 }] }]) {
      expect((await put(bad)).status, JSON.stringify(bad)).toBe(400);
    }
    const typo = await put({ erors: [{ status: 503, rate: 1 }] }, 'PATCH');
    expect(typo.status).toBe(400);
    expect(((await typo.json()) as { error: string }).error).toContain('did you mean "errors"');
    expect(await (await fetch(`${s.mock.url}/_mock/faults`)).json()).toEqual(before);
  });

  it('a rate limit refuses with OpenAI\'s 429 rate_limit_exceeded and no retry-after unless retryAfter is set; without one, x-ratelimit-limit-requests advertises 100000', async () => {
    const s = await startStack(RETRY_LOOP_ONLY);
    const direct = () => fetch(`${s.mock.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${TEST_KEY}` }, body: JSON.stringify(CHAT) });
    const free = await direct();
    expect(free.status).toBe(200);
    expect(free.headers.get('x-ratelimit-limit-requests')).toBe('100000');
    expect(free.headers.get('x-ratelimit-reset-requests')).toMatch(/^(\d+m)?\d+(\.\d+)?m?s$/);
    await fetch(`${s.mock.url}/_mock/faults`, { method: 'PATCH', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ rateLimit: { requestsPerMinute: 2, burstSeconds: 60 } }) });
    expect((await direct()).status).toBe(200);
    expect((await direct()).status).toBe(200);
    const refused = await direct();
    expect(refused.status).toBe(429);
    expect(refused.headers.get('retry-after')).toBeNull();
    expect(refused.headers.get('retry-after-ms')).toBeNull();
    const e = await errorOf(refused);
    expect(e).toMatchObject({ type: 'requests', param: null, code: 'rate_limit_exceeded' });
    expect(e.message).toMatch(/^Rate limit reached for gpt-4o in organization org-mock on requests per min \(RPM\): Limit 2, Used 2, Requested 1\. Please try again in /);
    await fetch(`${s.mock.url}/_mock/faults`, { method: 'PATCH', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ rateLimit: { requestsPerMinute: 2, retryAfter: true } }) });
    await direct();
    await direct();
    const hinted = await direct();
    expect(hinted.status).toBe(429);
    expect(Number(hinted.headers.get('retry-after-ms'))).toBeGreaterThan(0);
    expect(Number(hinted.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    const stats = (await (await fetch(`${s.mock.url}/_mock/stats`)).json()) as { rateLimited: { requests: number } };
    expect(stats.rateLimited.requests).toBe(2);
  });
});
