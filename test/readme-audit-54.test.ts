// README claims checked as a new user meets them (audit 54): "Idempotency keys", "Client keys", "Paths" and
// "Deployment"'s paragraph on NODE_OPTIONS=--max-semi-space-size, driven with the official openai SDK (and fetch where
// the SDK cannot send what is checked) against the bundled mock over real HTTP. What earlier audits and tests hold (the
// Host check on loopback, x-api-key and api-key, the key headers, the passthrough's header lists, the error table) is
// not repeated. One README sentence was made exact: the throughput the bench measured without the flag was 0.22x and
// 0.23x direct, not 0.22x alone (bench/README.md "Node flags").
import OpenAI from 'openai';
import { readFileSync } from 'node:fs';
import { request } from 'node:http';
import { gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { ConfigError, parseConfig } from '../src/config/load.ts';
import { freePort } from './helpers/free-port.ts';
import { useGatewayProcesses, waitReady } from './helpers/gateway-process.ts';
import { expectOpenAIError, sdkError } from './helpers/openai-error.ts';
import { RETRY_LOOP_ONLY, TEST_KEY, defaultConfig, scrapeMetrics, useStacks, type Stack } from './helpers/stack.ts';

const startStack = useStacks(RETRY_LOOP_ONLY);
const startProcess = useGatewayProcesses();

const README = readFileSync('README.md', 'utf8');
const msgs = [{ role: 'user' as const, content: 'hi' }];
const chatBody = JSON.stringify({ model: 'gpt-4o', messages: msgs });
const sdk = (s: Stack, opts: Partial<ConstructorParameters<typeof OpenAI>[0]> = {}) => new OpenAI({ baseURL: s.baseURL, apiKey: 'client', maxRetries: 0, logLevel: 'off', ...opts });

/** A POST of `body` to a gateway path with these headers; status, headers and the body's text. */
async function post(s: Stack, path: string, body: string | Buffer, headers: Record<string, string> = {}): Promise<{ status: number; headers: Headers; text: string }> {
  const res = await fetch(`${s.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

/** A stack's parsed log lines (JSON). */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- a log line is JSON: tests read whatever field they check
const logLines = (s: Stack) => s.logs.flatMap((l) => l.split('\n')).filter(Boolean).map((l) => JSON.parse(l) as Record<string, any>);

/** The stack's log lines that pass `keep`, once there are `count` of them (a request's line follows its answer by a tick). */
async function linesOnce(s: Stack, keep: (l: Record<string, unknown>) => boolean, count: number): Promise<ReturnType<typeof logLines>> {
  const until = Date.now() + 2_000;
  for (;;) {
    const lines = logLines(s).filter(keep);
    if (lines.length >= count || Date.now() > until) return lines;
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** The sum of a metric's series on a stack's /metrics that carry these labels. */
async function series(s: Stack, name: string, labels: Record<string, string>): Promise<number> {
  return (await scrapeMetrics(s.url)).filter((m) => m.name === name && Object.entries(labels).every(([k, v]) => m.labels[k] === v)).reduce((sum, m) => sum + m.value, 0);
}

/** A GET of a gateway path with this Host header (fetch will not set Host; node:http does). */
function getWithHost(url: string, path: string, host: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(`${url}${path}`, { headers: { host } }, (res) => {
      let body = '';
      res.on('data', (d: Buffer) => (body += d.toString()));
      res.on('end', () => resolve({ status: res.statusCode!, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

/** The message a config is refused with at start-up (fails the test if it loads). */
function refusal(yaml: string, env: Record<string, string> = {}): string {
  try {
    parseConfig(yaml, 'audit54.yaml', env);
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return (e as Error).message;
  }
  throw new Error(`config loaded: ${yaml}`);
}

describe('README "Idempotency keys"', () => {
  it("the openai SDK's idempotencyKey option sends nothing (two runs); the header in `headers` runs once, a repeat gets the answer byte for byte with idempotent-replayed, and the key goes upstream", async () => {
    const s = await startStack();
    const client = sdk(s);
    const viaOption = [
      await client.chat.completions.create({ model: 'gpt-4o', messages: msgs }, { idempotencyKey: 'opt-call-1' }).withResponse(),
      await client.chat.completions.create({ model: 'gpt-4o', messages: msgs }, { idempotencyKey: 'opt-call-1' }).withResponse(),
    ];
    expect(s.mock.requests()).toHaveLength(2);
    for (const r of s.mock.requests()) expect(r.headers['idempotency-key']).toBeUndefined();
    for (const { response } of viaOption) expect(response.headers.get('idempotent-replayed')).toBeNull();

    s.mock.reset();
    const first = await post(s, '/v1/chat/completions', chatBody, { 'Idempotency-Key': 'call-1' });
    const repeat = await post(s, '/v1/chat/completions', chatBody, { 'Idempotency-Key': 'call-1' });
    expect(first.status).toBe(200);
    expect(repeat.status).toBe(200);
    expect(repeat.text).toBe(first.text);
    expect(first.headers.get('idempotent-replayed')).toBeNull();
    expect(repeat.headers.get('idempotent-replayed')).toBe('true');
    for (const h of ['x-request-id', 'x-stormgate-target']) expect(repeat.headers.get(h), h).toBe(first.headers.get(h));
    expect(s.mock.requests()).toHaveLength(1);
    expect(s.mock.requests()[0]!.headers['idempotency-key']).toBe('call-1');
    // Logged as a run and a replay, and counted as replayed.
    const lines = await linesOnce(s, (l) => l.idempotency !== undefined, 2);
    expect(lines.map((l) => l.idempotency)).toEqual(['run', 'replayed']);
    expect(await series(s, 'stormgate_requests_total', { route: 'chat', outcome: 'replayed' })).toBe(1);
  });

  it('replays a stream byte for byte, its events included', async () => {
    const s = await startStack();
    const body = JSON.stringify({ model: 'gpt-4o', messages: msgs, stream: true, stream_options: { include_usage: true } });
    const first = await post(s, '/v1/chat/completions', body, { 'Idempotency-Key': 'stream-1' });
    const repeat = await post(s, '/v1/chat/completions', body, { 'Idempotency-Key': 'stream-1' });
    expect(first.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
    expect(first.text).toContain('data: [DONE]');
    expect(repeat.text).toBe(first.text);
    expect(repeat.headers.get('idempotent-replayed')).toBe('true');
    expect(s.mock.requests()).toHaveLength(1);
  });

  it("plays the README's SDK case: provider at 1.5 s, SDK timeout 1 s, one upstream request, the answer on the SDK's retry", async () => {
    const s = await startStack({ faults: { latencyMs: 1500 } });
    const client = sdk(s, { maxRetries: 2, timeout: 1000 });
    const answer = await client.chat.completions.create({ model: 'gpt-4o', messages: msgs }, { headers: { 'Idempotency-Key': 'slow-call' } }).withResponse();
    expect(answer.data.choices[0]!.message.content).toBeTruthy();
    expect(answer.response.headers.get('idempotent-replayed')).toBe('true');
    expect(s.mock.requests()).toHaveLength(1);
  });

  it('gives the key back after a run that ended in an error: the next repeat runs the request again', async () => {
    const s = await startStack({ route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 1 } } });
    s.mock.brownout('503', 60_000);
    const failed = await post(s, '/v1/chat/completions', chatBody, { 'Idempotency-Key': 'err-1' });
    expect(failed.status).toBe(503);
    s.mock.brownout('503', 0);
    const again = await post(s, '/v1/chat/completions', chatBody, { 'Idempotency-Key': 'err-1' });
    expect(again.status).toBe(200);
    expect(again.headers.get('idempotent-replayed')).toBeNull();
    expect(s.mock.requests()).toHaveLength(2);
  });

  it('scopes a key by client key and path: two clients run twice, another path with another body is no reuse; a key that is not visible ASCII is 400', async () => {
    const s = await startStack({
      config: (mockUrl) => ({ ...defaultConfig(mockUrl, RETRY_LOOP_ONLY), auth: { keys: { team_a: 'key-team-a-audit54', team_b: 'key-team-b-audit54' } } }),
    });
    const as = (key: string) => ({ authorization: `Bearer ${key}`, 'Idempotency-Key': 'shared-key' });
    const a1 = await post(s, '/v1/chat/completions', chatBody, as('key-team-a-audit54'));
    const b1 = await post(s, '/v1/chat/completions', chatBody, as('key-team-b-audit54'));
    const a2 = await post(s, '/v1/chat/completions', chatBody, as('key-team-a-audit54'));
    expect([a1.status, b1.status, a2.status]).toEqual([200, 200, 200]);
    expect(b1.headers.get('idempotent-replayed')).toBeNull();
    expect(a2.headers.get('idempotent-replayed')).toBe('true');
    expect(s.mock.requests()).toHaveLength(2);
    const embed = await post(s, '/v1/embeddings', JSON.stringify({ model: 'text-embedding-3-small', input: 'hi' }), as('key-team-a-audit54'));
    expect(embed.status).toBe(200);
    expect(s.mock.requests()).toHaveLength(3);
    // The same JSON with other spacing is another body: 422, nothing sent.
    const respaced = await post(s, '/v1/chat/completions', JSON.stringify(JSON.parse(chatBody), null, 1), as('key-team-a-audit54'));
    expect(respaced.status).toBe(422);
    expectOpenAIError(JSON.parse(respaced.text), 'idempotency_key_reused');
    // 255 visible ASCII characters are a key; a space is not.
    const longest = await post(s, '/v1/chat/completions', chatBody, { authorization: 'Bearer key-team-a-audit54', 'Idempotency-Key': '~'.repeat(255) });
    expect(longest.status).toBe(200);
    expect(s.mock.requests()).toHaveLength(4);
    const spaced = await post(s, '/v1/chat/completions', chatBody, { authorization: 'Bearer key-team-a-audit54', 'Idempotency-Key': 'a b' });
    expect(spaced.status).toBe(400);
    expectOpenAIError(JSON.parse(spaced.text), 'invalid_idempotency_key');
    expect(s.mock.requests()).toHaveLength(4);
  });

  it('bodyAsKeyMs: a request without a key has its body and query as its key; another query is another call', async () => {
    const s = await startStack({
      config: (mockUrl) => {
        const c = defaultConfig(mockUrl, RETRY_LOOP_ONLY);
        return { ...c, routes: c.routes.map((r) => (r.name === 'chat' ? { ...r, idempotency: { bodyAsKeyMs: 60_000 } } : r)) };
      },
    });
    const first = await post(s, '/v1/chat/completions', chatBody);
    const repeat = await post(s, '/v1/chat/completions', chatBody);
    expect(repeat.text).toBe(first.text);
    expect(repeat.headers.get('idempotent-replayed')).toBe('true');
    expect(s.mock.requests()).toHaveLength(1);
    const other = await post(s, '/v1/chat/completions?user=2', chatBody);
    expect(other.status).toBe(200);
    expect(other.headers.get('idempotent-replayed')).toBeNull();
    const otherBody = await post(s, '/v1/chat/completions', JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'another call' }] }));
    expect(otherBody.headers.get('idempotent-replayed')).toBeNull();
    expect(s.mock.requests()).toHaveLength(3);
    // Off on the other routes: the same body twice runs twice.
    const e = JSON.stringify({ model: 'text-embedding-3-small', input: 'hi' });
    await post(s, '/v1/embeddings', e);
    await post(s, '/v1/embeddings', e);
    expect(s.mock.requests()).toHaveLength(5);
  });

  it('bodyAsKeyMs: a repeat past N ms of the answer runs anew', async () => {
    const s = await startStack({
      config: (mockUrl) => {
        const c = defaultConfig(mockUrl, RETRY_LOOP_ONLY);
        return { ...c, routes: c.routes.map((r) => (r.name === 'chat' ? { ...r, idempotency: { bodyAsKeyMs: 300 } } : r)) };
      },
    });
    await post(s, '/v1/chat/completions', chatBody);
    expect((await post(s, '/v1/chat/completions', chatBody)).headers.get('idempotent-replayed')).toBe('true');
    await new Promise((r) => setTimeout(r, 700));
    expect((await post(s, '/v1/chat/completions', chatBody)).headers.get('idempotent-replayed')).toBeNull();
    expect(s.mock.requests()).toHaveLength(2);
  });

  it('idempotency.enabled false only forwards the header; passthrough paths never read keys', async () => {
    const s = await startStack({ config: (mockUrl) => ({ ...defaultConfig(mockUrl, RETRY_LOOP_ONLY), idempotency: { enabled: false } }) });
    for (let i = 0; i < 2; i++) expect((await post(s, '/v1/chat/completions', chatBody, { 'Idempotency-Key': 'off-1' })).headers.get('idempotent-replayed')).toBeNull();
    expect(s.mock.requests().map((r) => r.headers['idempotency-key'])).toEqual(['off-1', 'off-1']);
    await s.close();

    const p = await startStack({
      config: (mockUrl) => ({ ...defaultConfig(mockUrl, RETRY_LOOP_ONLY), passthrough: { provider: 'mock', paths: ['/v1/files'], methods: ['POST'] } }),
    });
    for (let i = 0; i < 2; i++) {
      const r = await post(p, '/v1/files', '{"purpose":"batch"}', { 'Idempotency-Key': 'upload-1' });
      expect(r.headers.get('idempotent-replayed')).toBeNull();
    }
    expect(p.mock.requests().filter((r) => r.path === '/v1/files')).toHaveLength(2);
  });
});

describe('README "Client keys"', () => {
  it('answers every Host on an address beyond loopback unless server.allowedHosts is set, then the list; ["*"] on loopback answers every name', async () => {
    const withServer = (server: Record<string, unknown>) => (mockUrl: string) => {
      const c = defaultConfig(mockUrl, RETRY_LOOP_ONLY);
      return { ...c, server: { ...c.server, ...server } };
    };
    // The stack listens on 127.0.0.1 whatever the config says; the Host check follows server.host.
    const open = await startStack({ config: withServer({ host: '0.0.0.0' }) });
    expect((await getWithHost(open.url, '/v1/models', 'stormgate.ns.svc.cluster.local')).status).toBe(200);
    await open.close();

    const listed = await startStack({ config: withServer({ host: '0.0.0.0', allowedHosts: ['gw.example.com'] }) });
    expect((await getWithHost(listed.url, '/v1/models', 'gw.example.com')).status).toBe(200);
    const svc = await getWithHost(listed.url, '/v1/models', 'stormgate.ns.svc.cluster.local');
    expect(svc.status).toBe(403);
    expectOpenAIError(JSON.parse(svc.body), 'host_not_allowed');
    await listed.close();

    const star = await startStack({ config: withServer({ allowedHosts: ['*'] }) });
    expect((await getWithHost(star.url, '/v1/models', 'rebind.attacker.example')).status).toBe(200);
  });

  it('logs the client name, never its key; a refusal is logged with status 401 and counted rejected; the ops paths need no key', async () => {
    const key = 'sk-client-agents-audit54-secret';
    const s = await startStack({ config: (mockUrl) => ({ ...defaultConfig(mockUrl, RETRY_LOOP_ONLY), auth: { keys: { agents: key } } }) });
    const ok = await sdk(s, { apiKey: key }).chat.completions.create({ model: 'gpt-4o', messages: msgs });
    expect(ok.choices[0]!.message.content).toBeTruthy();
    const err = await sdkError(sdk(s, { apiKey: 'sk-wrong-audit54' }).chat.completions.create({ model: 'gpt-4o', messages: msgs }));
    expect(err).toBeInstanceOf(OpenAI.AuthenticationError);
    for (const path of ['/healthz', '/readyz', '/metrics']) expect((await fetch(`${s.url}${path}`)).status, path).toBe(200);
    const lines = await linesOnce(s, (l) => l.reqId !== undefined && l.path === '/v1/chat/completions', 2);
    expect(lines.find((l) => l.status === 200)?.client).toBe('agents');
    expect(lines.find((l) => l.status === 401)).toBeDefined();
    expect(s.logs.join('')).not.toContain(key);
    expect(s.mock.requests()[0]!.headers.authorization).toBe(`Bearer ${TEST_KEY}`);
    expect(await series(s, 'stormgate_requests_total', { outcome: 'rejected' })).toBe(1);
  });

  it('a client past its rate gets 429 client_rate_limited with x-should-retry and retry-after-ms, which the openai SDK waits out', async () => {
    const key = 'sk-client-paced-audit54';
    const s = await startStack({
      config: (mockUrl) => ({ ...defaultConfig(mockUrl, RETRY_LOOP_ONLY), auth: { keys: { paced: key }, limits: { paced: { requestsPerMinute: 60, burst: 1 } } } }),
    });
    expect((await post(s, '/v1/chat/completions', chatBody, { authorization: `Bearer ${key}` })).status).toBe(200);
    const refused = await post(s, '/v1/chat/completions', chatBody, { authorization: `Bearer ${key}` });
    expect(refused.status).toBe(429);
    expectOpenAIError(JSON.parse(refused.text), 'client_rate_limited', 'rate_limit_error');
    expect(refused.headers.get('x-should-retry')).toBe('true');
    const waitMs = Number(refused.headers.get('retry-after-ms'));
    expect(waitMs).toBeGreaterThan(0);
    expect(waitMs).toBeLessThanOrEqual(3000);
    expect(Number(refused.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    let sent = 0;
    const client = sdk(s, { apiKey: key, maxRetries: 3, fetch: (u, i) => (sent++, fetch(u, i)) });
    const answer = await client.chat.completions.create({ model: 'gpt-4o', messages: msgs });
    expect(answer.choices[0]!.message.content).toBeTruthy();
    expect(sent).toBeGreaterThanOrEqual(2); // its first try was refused too, and waited out
    expect(s.mock.requests()).toHaveLength(2);
    expect(await series(s, 'stormgate_client_limited_total', { client: 'paced', by: 'requests' })).toBeGreaterThanOrEqual(1);
  });

  it('refuses at start-up an empty key, one key under two names, a key beyond ASCII, and a priority cap for a name that is no client or a class a provider lacks', () => {
    const base = (auth: string) => `providers:\n  p: { family: openai, baseUrl: "http://127.0.0.1:9/v1", apiKey: k }\nroutes:\n  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: p } ] }\n${auth}`;
    // Each refused at the key it is about, saying what is wrong.
    const cases: Array<[string, RegExp, Record<string, string>?]> = [
      ['auth:\n  keys: { a: "${EMPTY_KEY}" }\n', /auth\.keys\.a: is empty/, { EMPTY_KEY: '' }],
      ['auth:\n  keys: { a: same-key-1234, b: same-key-1234 }\n', /auth\.keys\.b: is the same key as client "a"/],
      ['auth:\n  keys: { a: "cl\u00e9-secr\u00e8te-1234" }\n', /auth\.keys\.a: holds a character beyond ASCII/],
      ['auth:\n  keys: { a: key-a-1234 }\n  priority: { nobody: batch }\n', /auth\.priority\.nobody: no client "nobody"/],
      ['auth:\n  keys: { a: key-a-1234 }\n  priority: { a: overnight }\n', /auth\.priority\.a: "overnight" is not a priority class/],
    ];
    for (const [auth, why, env] of cases) expect(refusal(base(auth), env ?? {})).toMatch(why);
    // A class that one provider a route sends to lacks (a contextWindowFallback's included), and a route's priority
    // one of its providers' pools lacks.
    const twoProviders = (route: string, extra = '') =>
      `providers:\n  p: { family: openai, baseUrl: "http://127.0.0.1:9/v1", apiKey: k }\n  q: { family: openai, baseUrl: "http://127.0.0.1:8/v1", apiKey: k, pools: { classes: { online: {} } } }\nroutes:\n  - { name: chat, match: { path: /v1/chat/completions }, ${route} }\n${extra}`;
    const capped = 'auth:\n  keys: { a: key-a-1234 }\n  priority: { a: batch }\n';
    expect(refusal(twoProviders('targets: [ { provider: p }, { provider: q } ]', capped))).toMatch(/auth\.priority\.a: "batch" is not a priority class of provider "q", which route "chat" sends to/);
    expect(refusal(twoProviders('targets: [ { provider: p } ], contextWindowFallback: { provider: q, model: big }', capped))).toMatch(/auth\.priority\.a: "batch" is not a priority class of provider "q"/);
    expect(refusal(twoProviders('targets: [ { provider: p }, { provider: q } ], priority: batch'))).toMatch(/routes\[0\]\.priority: priority "batch" is not a class of provider "q"/);
  });
});

describe('README "Paths"', () => {
  it('takes a gzip body, a UTF-8 byte order mark, and answers a zip bomb past bodyLimitBytes once decoded with 413', async () => {
    const s = await startStack();
    const gz = await post(s, '/v1/chat/completions', gzipSync(chatBody), { 'content-encoding': 'gzip' });
    expect(gz.status).toBe(200);
    const bom = await post(s, '/v1/chat/completions', Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(chatBody)]));
    expect(bom.status).toBe(200);
    const bomb = gzipSync(Buffer.concat([Buffer.from('{"model":"gpt-4o","messages":[{"role":"user","content":"'), Buffer.alloc(11 * 1024 * 1024, 0x61), Buffer.from('"}]}')]));
    expect(bomb.length).toBeLessThan(100_000);
    const big = await post(s, '/v1/chat/completions', bomb, { 'content-encoding': 'gzip' });
    expect(big.status).toBe(413);
    expect(s.mock.requests()).toHaveLength(2);
  });

  it('needs a string model (400, param model) unless every target of the route names its own, which is then sent', async () => {
    const s = await startStack({
      config: (mockUrl) => {
        const c = defaultConfig(mockUrl, RETRY_LOOP_ONLY);
        return { ...c, routes: c.routes.map((r) => (r.name === 'embeddings' ? { ...r, targets: [{ provider: 'mock', model: 'text-embedding-3-small' }] } : r)) };
      },
    });
    const bare = await post(s, '/v1/chat/completions', JSON.stringify({ messages: msgs }));
    expect(bare.status).toBe(400);
    expect(JSON.parse(bare.text).error.param).toBe('model');
    const numeric = await post(s, '/v1/chat/completions', JSON.stringify({ model: 4, messages: msgs }));
    expect(numeric.status).toBe(400);
    const embed = await post(s, '/v1/embeddings', JSON.stringify({ input: 'hi' }));
    expect(embed.status).toBe(200);
    expect(s.mock.requests().map((r) => r.model)).toEqual(['text-embedding-3-small']);
  });

  it("lists a config-only name as {id, object, created: 0, owned_by: its provider}, not a model only a target's override names; unknown paths 404 without passthrough", async () => {
    const s = await startStack({
      config: (mockUrl) => ({
        ...defaultConfig(mockUrl, RETRY_LOOP_ONLY),
        routes: [{ name: 'house', match: { path: '/v1/chat/completions', models: ['house-model'] }, targets: [{ provider: 'mock', model: 'override-only-model' }] }],
      }),
    });
    const client = sdk(s);
    const ids: string[] = [];
    for await (const m of client.models.list()) ids.push(m.id);
    expect(ids).toEqual(['house-model']);
    expect(await client.models.retrieve('house-model')).toEqual({ id: 'house-model', object: 'model', created: 0, owned_by: 'mock' });
    const err = await sdkError(client.models.retrieve('override-only-model'));
    expect(err.status).toBe(404);
    expect(err.code).toBe('model_not_found');
    // The request for the listed name goes upstream as the override.
    await client.chat.completions.create({ model: 'house-model', messages: msgs });
    expect(s.mock.requests().filter((r) => r.path === '/v1/chat/completions').map((r) => r.model)).toEqual(['override-only-model']);
    const files = await fetch(`${s.url}/v1/files`);
    expect(files.status).toBe(404);
    expectOpenAIError(await files.json(), 'unknown_url');
  });

  it('refuses a route path without its slash with a pointer to the slashed one, and a path with a wildcard', () => {
    const withPath = (path: string) => `providers:\n  p: { family: openai, baseUrl: "http://127.0.0.1:9/v1", apiKey: k }\nroutes:\n  - { name: r, match: { path: "${path}" }, targets: [ { provider: p } ] }\n`;
    expect(refusal(withPath('v1/embeddings'))).toContain('write "/v1/embeddings"');
    expect(refusal(withPath('/v1/*'))).toMatch(/routes\[0\]\.match\.path: "\/v1\/\*" must be a plain path/);
  });
});

describe('README "Deployment": NODE_OPTIONS=--max-semi-space-size=64', () => {
  const section = README.slice(README.indexOf('### Deployment'), README.indexOf('## The mock provider'));
  const paragraph = section.split('\n\n').find((p) => p.includes('--max-semi-space-size'))!;

  it('the image and the compose file leave node its default and let NODE_OPTIONS through: plain node in exec form, nothing setting it', () => {
    const dockerfile = readFileSync('Dockerfile', 'utf8');
    expect(dockerfile).not.toMatch(/NODE_OPTIONS|semi-space/);
    expect(dockerfile).not.toMatch(/^ENTRYPOINT/m);
    expect(dockerfile).toMatch(/^CMD \["node", "dist\/main\.js"/m);
    const compose = parseYaml(readFileSync('docker-compose.yml', 'utf8')) as { services: { gateway: { environment: string[] } } };
    expect(compose.services.gateway.environment.some((e) => e.startsWith('NODE_OPTIONS'))).toBe(false);
    expect(paragraph).toMatch(/The image leaves node's default/);
  });

  it("the README's figures are bench/README.md's (Node flags), and npm run bench passes --node-flags to the gateway process", () => {
    const bench = readFileSync('bench/README.md', 'utf8');
    const nodeFlags = bench.slice(bench.indexOf('## Node flags'), bench.indexOf('## Profiling'));
    expect(nodeFlags).toContain('CPU per request 196 and 180 µs against 250 and 236 µs');
    expect(paragraph).toContain('(196 and 180 µs against 250 and 236 µs)');
    expect(nodeFlags).toContain('peak RSS was 268 MB against 171 MB');
    expect(paragraph).toContain('(peak RSS 268 MB against 171 MB)');
    // bench: 0.29x and 0.26x with the flag, 0.22x and 0.23x without.
    expect(nodeFlags).toContain('throughput 0.29x and 0.26x direct against 0.22x and 0.23x');
    expect(paragraph.replace(/\s+/g, ' ')).toContain('raised throughput from 0.22-0.23x to 0.26-0.29x direct');
    expect(paragraph).toContain('bench/README.md#node-flags');
    const overhead = readFileSync('bench/overhead.ts', 'utf8');
    expect(overhead).toMatch(/nodeFlags: \[\.\.\.gatewayNodeFlags/);
  });

  it('a gateway started with NODE_OPTIONS=--max-semi-space-size=64 on every interface serves, and warns that it has no auth.keys', async () => {
    const port = await freePort();
    const s = await startStack();
    const g = startProcess('wide', {
      server: { host: '0.0.0.0', port },
      providers: { mock: { family: 'openai', baseUrl: `${s.mock.url}/v1`, apiKey: TEST_KEY } },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }] }],
    }, { NODE_OPTIONS: '--max-semi-space-size=64' });
    await waitReady(g, port);
    const res = await fetch(`http://127.0.0.1:${port}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: chatBody });
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    expect(g.output()).toContain("listening on 0.0.0.0 without auth.keys: anyone who reaches this port uses the providers' keys");
    g.proc.kill('SIGINT');
    expect(await g.exited).toBe(0);
  });
});
