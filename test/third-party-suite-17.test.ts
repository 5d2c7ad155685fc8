// A seventeenth third-party suite, written from the README alone ("Errors", "Client keys", "Headers", "Paths", "Logs
// and metrics", "What the client sees", "Health, readiness, shutdown", the configuration reference) as an outside
// security team would test the gateway in a pen-test before a company puts it, holding the company's provider keys,
// in front of thousands of agents. Black box over real HTTP: gateways built from YAML whose provider keys come from
// environment variables, the official `openai` SDK where an agent would use it, and raw sockets (node:net) where a
// well-behaved client could not send what an attacker sends (duplicated or mixed-case credentials, control bytes,
// absolute-form request targets, bodies that never end). Upstream: providers of the test's own that misbehave on
// purpose (echoing the key they were sent into bodies, headers, redirects and stream events, split mid-key across
// writes) and the bundled mock provider. Themes: the provider key never leaves the gateway (answers, headers,
// /metrics, health, the request log, start-up errors); no open relay (passthrough off, passthrough on with path and
// header tricks, Host and X-Forwarded-*); no header or log injection; no unbounded metric series from client input;
// resource abuse answered in the OpenAI error shape; client keys. Bounds are generous: a loaded 2-core machine.
// Found here: the log line of a request the gateway answered with its own error (a provider's 401 made
// upstream_auth_error, a redirect made upstream_redirect) named the provider's request id as the provider sent it, so
// a server echoing the key in it (`x-request-id: req_<key>`) put the company key in the request log; and a provider key
// holding a character no header can carry (a zero-width space pasted with it) loaded, then every request was a 500.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import type { IncomingMessage, RequestListener, ServerResponse } from 'node:http';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { ConfigError, parseConfig } from '../src/config/load.ts';
import { useFakeProviders, type FakeProvider } from './helpers/fake-provider.ts';
import { useGateways } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startGateway = useGateways();

/** The company's provider keys, as the environment gives them to the gateway's YAML. */
const KEY = 'sk-pentest-live-4f9a1c7e2b8d6a3f5e0c';
const ANT_KEY = 'sk-ant-pentest-9b2e7d4c1a6f3e8b0d5c';
const AGENTS_KEY = 'sg-pentest-agents-key-31d7';
const BATCH_KEY = 'sg-pentest-batch-key-8c2e';

/**
 * Whether `text` gives away any of `key` beyond its public prefix: any 10 characters of it in a row (a key cut at a
 * body's cap, with only its last characters missing, is a leak too).
 */
function leaks(text: string, key: string): string | undefined {
  for (let i = 0; i + 10 <= key.length; i++) {
    const piece = key.slice(i, i + 10);
    if (piece.startsWith('sk-') || piece.startsWith('k-') || piece === key.slice(0, 10)) continue;
    if (text.includes(piece)) return piece;
  }
  return undefined;
}
const expectNoKey = (what: string, text: string) => {
  for (const k of [KEY, ANT_KEY]) expect(leaks(text, k), `${what} gives away part of ${k}: ${text.slice(0, 300)}`).toBeUndefined();
};

// ---------------------------------------------------------------------------------------------------------------
// Clients that misbehave: raw HTTP/1.1 over a socket.

interface RawAnswer {
  status: number;
  head: string;
  headers: Array<[string, string]>;
  body: string;
  text: string;
}

/** Sends `text` as it is on a new connection and reads until the server closes it (or `waitMs` passes). */
function rawSend(url: string, text: string | Buffer, waitMs = 3_000): Promise<RawAnswer> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    let out = '';
    const sock = connect(Number(port), hostname, () => sock.write(text));
    const done = () => {
      clearTimeout(timer);
      sock.destroy();
      const [head = '', ...rest] = out.split('\r\n\r\n');
      const lines = head.split('\r\n');
      const headers = lines.slice(1).map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()] as [string, string]);
      let body = rest.join('\r\n\r\n');
      if (headers.some(([n, v]) => n === 'transfer-encoding' && v === 'chunked')) body = unchunk(body);
      resolve({ status: Number(lines[0]?.split(' ')[1] ?? 0), head, headers, body, text: out });
    };
    const timer = setTimeout(done, waitMs);
    sock.on('data', (d: Buffer) => (out += d.toString('latin1')));
    sock.on('end', done);
    sock.on('error', (err) => (out ? done() : reject(err)));
  });
}

function unchunk(body: string): string {
  let out = '';
  let rest = body;
  for (;;) {
    const nl = rest.indexOf('\r\n');
    if (nl === -1) return out;
    const size = parseInt(rest.slice(0, nl), 16);
    if (!size) return out;
    out += rest.slice(nl + 2, nl + 2 + size);
    rest = rest.slice(nl + 2 + size + 2);
  }
}

/** A raw request: request line, headers as given (names in any case, repeated), a body; `Connection: close` added. */
function rawRequest(method: string, target: string, headers: Array<[string, string]>, body = ''): string {
  const lines = [`${method} ${target} HTTP/1.1`, ...headers.map(([n, v]) => `${n}: ${v}`)];
  if (!headers.some(([n]) => n.toLowerCase() === 'host')) lines.splice(1, 0, 'Host: 127.0.0.1');
  if (body !== '' && !headers.some(([n]) => /^(content-length|transfer-encoding)$/i.test(n))) lines.push(`Content-Length: ${Buffer.byteLength(body)}`);
  lines.push('Connection: close');
  return `${lines.join('\r\n')}\r\n\r\n${body}`;
}

/** The OpenAI error shape, exactly its four fields, with one of `codes`; the code. */
function expectErrorShape(text: string, codes: string[], what = ''): string {
  let body: { error?: Record<string, unknown> } | undefined;
  try {
    body = JSON.parse(text) as { error?: Record<string, unknown> };
  } catch {
    body = undefined;
  }
  expect(body?.error && Object.keys(body.error).sort(), `${what}: ${text.slice(0, 300)}`).toEqual(['code', 'message', 'param', 'type']);
  expect(codes, `${what}: ${text.slice(0, 300)}`).toContain(body!.error!.code);
  expect(typeof body!.error!.message).toBe('string');
  return body!.error!.code as string;
}

const chatBody = (model = 'gpt-4o', extra: Record<string, unknown> = {}) => JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }], ...extra });
const JSON_HEADERS: Array<[string, string]> = [['Content-Type', 'application/json']];

// ---------------------------------------------------------------------------------------------------------------
// Providers of the test's own.

interface Received {
  method: string;
  url: string;
  headers: IncomingMessage['headers'];
  rawHeaders: string[];
  body: Record<string, unknown> | undefined;
}

/** A provider that records every request and answers with `answer` (which gets the parsed JSON body, if any). */
async function provider(answer: (req: Received, res: ServerResponse) => void | Promise<void>): Promise<FakeProvider & { received: Received[] }> {
  const received: Received[] = [];
  const handler: RequestListener = (req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (d: Buffer) => chunks.push(d));
    req.on('end', () => {
      const text = Buffer.concat(chunks).toString();
      let body: Record<string, unknown> | undefined;
      try {
        body = text ? (JSON.parse(text) as Record<string, unknown>) : undefined;
      } catch {
        body = undefined;
      }
      const r: Received = { method: req.method ?? '', url: req.url ?? '', headers: req.headers, rawHeaders: req.rawHeaders, body };
      received.push(r);
      void answer(r, res);
    });
  };
  const p = await startProvider(handler);
  return { ...p, received };
}

const completionJson = (content = 'ok', model = 'gpt-4o') =>
  JSON.stringify({ id: 'chatcmpl-1', object: 'chat.completion', created: 1, model, choices: [{ index: 0, message: { role: 'assistant', content }, finish_reason: 'stop' }], usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } });
const chunk = (delta: Record<string, unknown>, finish: string | null = null) =>
  `data: ${JSON.stringify({ id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
const aev = (type: string, fields: object = {}) => `event: ${type}\ndata: ${JSON.stringify({ type, ...fields })}\n\n`;
const rev = (type: string, fields: object, seq: number) => `event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: seq, ...fields })}\n\n`;

/** Writes `text` in two pieces, cut in the middle of `key`, a moment apart (a TCP segment boundary inside the key). */
async function writeSplitAt(res: ServerResponse, text: string, key: string): Promise<void> {
  const at = text.indexOf(key);
  const cut = at === -1 ? Math.floor(text.length / 2) : at + Math.floor(key.length / 2);
  res.write(text.slice(0, cut));
  await sleep(30);
  res.write(text.slice(cut));
}

/**
 * The OpenAI-compatible provider of the secrets scenarios: it quotes the credentials it was sent wherever a careless
 * server might, picked by the request's model (or path).
 */
async function echoingOpenAI(): Promise<FakeProvider & { received: Received[] }> {
  return provider(async (req, res) => {
    const auth = String(req.headers.authorization ?? '');
    const key = auth.replace(/^Bearer /, '');
    const json = (status: number, body: unknown, headers: Record<string, string> = {}) => {
      res.writeHead(status, { 'content-type': 'application/json', ...headers });
      res.end(JSON.stringify(body));
    };
    if (req.method === 'GET' && req.url.startsWith('/v1/models')) {
      return json(200, { object: 'list', data: [{ id: 'gpt-4o', object: 'model', created: 1, owned_by: `org for ${key}` }] }, { 'x-request-id': `req_${key}` });
    }
    const model = String(req.body?.model ?? '');
    const echoHeaders = { 'x-request-id': `req_${key}`, 'www-authenticate': `Bearer realm="api", error="invalid_token", token="${key}"`, 'openai-model': key, 'x-ratelimit-remaining-requests': key };
    switch (model) {
      case 'echo-400':
        return json(400, { error: { message: `Invalid request sent with ${auth}`, type: 'invalid_request_error', param: key, code: key } }, echoHeaders);
      case 'echo-404':
        return json(404, { error: { message: `The model does not exist for key ${key}`, type: 'invalid_request_error', param: key, code: 'not_found' } }, echoHeaders);
      case 'echo-401':
        return json(401, { error: { message: `Incorrect API key provided: ${key}`, type: 'invalid_request_error', param: null, code: 'invalid_api_key' } }, echoHeaders);
      case 'echo-429':
        return json(429, { error: { message: `Rate limit reached for ${key}`, type: 'requests', param: null, code: 'rate_limit_exceeded' } }, { ...echoHeaders, 'retry-after': '600' });
      case 'echo-redirect':
        res.writeHead(307, { location: `https://${key}.evil.example/v1/${key}/chat?key=${key}`, ...echoHeaders, 'content-type': 'text/html' });
        return void res.end(`<a href="https://evil.example/?key=${key}">moved</a>`);
      case 'echo-html-503':
        res.writeHead(503, { 'content-type': 'text/html', ...echoHeaders });
        return void res.end(`<html><body>Service down; your credentials were ${auth}</body></html>`);
      case 'echo-big-500': {
        // An error longer than the gateway reads of one (64 KB in the README's passthrough), the key across the cut.
        const head = '{"error":{"type":"server_error","code":null,"param":null,"message":"';
        const pad = 'x'.repeat(64 * 1024 - head.length - 12);
        res.writeHead(500, { 'content-type': 'application/json' });
        return void res.end(`${head}${pad}${key}${' and more'.repeat(2000)}"}}`);
      }
      case 'echo-200':
        res.writeHead(200, { 'content-type': 'application/json', ...echoHeaders });
        return void res.end(completionJson('fine'));
      case 'echo-stream-mid': {
        res.writeHead(200, { 'content-type': 'text/event-stream', ...echoHeaders });
        res.write(chunk({ role: 'assistant', content: 'Hello' }));
        await sleep(20);
        await writeSplitAt(res, `data: ${JSON.stringify({ error: { message: `The server failed for ${auth}`, type: 'server_error', param: key, code: key } })}\n\n`, key);
        return void res.end();
      }
      case 'echo-stream-early': {
        res.writeHead(200, { 'content-type': 'text/event-stream', ...echoHeaders });
        await writeSplitAt(res, `data: ${JSON.stringify({ error: { message: `Invalid prompt from ${auth}`, type: 'invalid_request_error', param: null, code: 'invalid_prompt' } })}\n\n`, key);
        return void res.end();
      }
      case 'echo-responses-failed': {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        const response = { id: 'resp_1', object: 'response', created_at: 1, status: 'in_progress', model: 'gpt-4o', output: [], error: null };
        res.write(rev('response.created', { response }, 0));
        res.write(rev('response.output_text.delta', { item_id: 'msg_1', output_index: 0, content_index: 0, delta: 'Hel' }, 1));
        await sleep(20);
        await writeSplitAt(res, rev('response.failed', { response: { ...response, status: 'failed', error: { code: 'server_error', message: `failed for ${key}` } } }, 2), key);
        return void res.end();
      }
      default:
        return json(200, JSON.parse(completionJson('ok', model)) as unknown);
    }
  });
}

/** Anthropic's side of the secrets scenarios: its own error shapes and events, quoting the x-api-key it was sent. */
async function echoingAnthropic(): Promise<FakeProvider & { received: Received[] }> {
  return provider(async (req, res) => {
    const key = String(req.headers['x-api-key'] ?? '');
    const headers = { 'request-id': `req_${key}`, 'www-authenticate': `x-api-key ${key}` };
    const err = (status: number, type: string, message: string) => {
      res.writeHead(status, { 'content-type': 'application/json', ...headers });
      res.end(JSON.stringify({ type: 'error', error: { type, message } }));
    };
    if (req.method === 'GET') {
      res.writeHead(200, { 'content-type': 'application/json', ...headers });
      return void res.end(JSON.stringify({ data: [{ type: 'model', id: 'claude-sonnet-4-6', display_name: key, created_at: '2025-01-01T00:00:00Z' }], has_more: false }));
    }
    const model = String(req.body?.model ?? '');
    const message = { id: 'msg_1', type: 'message', role: 'assistant', model, content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 1, output_tokens: 1 } };
    if (model.endsWith('echo-400')) return err(400, 'invalid_request_error', `x-api-key ${key} is not allowed to use this model`);
    if (model.endsWith('echo-401')) return err(401, 'authentication_error', `invalid x-api-key: ${key}`);
    if (model.endsWith('echo-529')) return err(529, 'overloaded_error', `Overloaded (account ${key})`);
    res.writeHead(200, { 'content-type': 'text/event-stream', ...headers });
    res.write(aev('message_start', { message }));
    if (model.endsWith('echo-early')) {
      // An overload reported inside the 200 stream, before any output: the 529 it stands for.
      await writeSplitAt(res, aev('error', { error: { type: 'overloaded_error', message: `Overloaded for ${key}` } }), key);
      return void res.end();
    }
    res.write(aev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }));
    res.write(aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Hello' } }));
    await sleep(20);
    await writeSplitAt(res, aev('error', { error: { type: 'api_error', message: `Internal error for key ${key}` } }), key);
    res.end();
  });
}

const yamlOf = (text: string, env: Record<string, string>) => parseConfig(text, 'pentest.yaml', env);

/** What a whole HTTP answer says, headers and body, for the leak search. */
async function wholeText(res: Response): Promise<string> {
  return `${res.status}\n${[...res.headers].map(([n, v]) => `${n}: ${v}`).join('\n')}\n\n${await res.text()}`;
}

// ---------------------------------------------------------------------------------------------------------------

describe('the provider key never leaves the gateway', () => {
  it('is in no answer, header, stream event, listing, /metrics, health endpoint or log line, whatever the providers echo', async () => {
    const openai = await echoingOpenAI();
    const claude = await echoingAnthropic();
    const logs: string[] = [];
    const config = yamlOf(
      `server: { host: 127.0.0.1, port: 0, logLevel: info }
providers:
  openai: { family: openai, baseUrl: "${openai.origin}/v1", apiKey: "\${OPENAI_API_KEY}", breaker: false }
  claude: { family: anthropic, baseUrl: "${claude.origin}", apiKey: "\${ANTHROPIC_API_KEY}", breaker: false }
routes:
  - name: chat-claude
    match: { path: /v1/chat/completions, models: ["claude-*"] }
    targets: [ { provider: claude } ]
    retry: { maxAttempts: 2, backoff: { strategy: fixed, baseMs: 5, capMs: 5 } }
    park: false
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: openai } ]
    retry: { maxAttempts: 2, backoff: { strategy: fixed, baseMs: 5, capMs: 5 } }
    park: false
  - name: responses
    match: { path: /v1/responses }
    targets: [ { provider: openai } ]
    park: false
  - name: messages
    match: { path: /v1/messages }
    targets: [ { provider: claude } ]
    retry: { maxAttempts: 2, backoff: { strategy: fixed, baseMs: 5, capMs: 5 } }
    park: false
passthrough: { provider: openai, paths: [/v1/files], methods: [GET, POST] }
`,
      { OPENAI_API_KEY: KEY, ANTHROPIC_API_KEY: ANT_KEY },
    );
    const url = await startGateway(config, { logs });
    const seen: Array<[string, string]> = [];
    const post = async (path: string, body: string, headers: Record<string, string> = {}) => {
      const res = await fetch(`${url}${path}`, { method: 'POST', redirect: 'manual', headers: { 'content-type': 'application/json', 'accept-encoding': 'identity', ...headers }, body });
      const text = await wholeText(res);
      seen.push([`POST ${path} ${body.slice(0, 60)}`, text]);
      return { status: res.status, text };
    };

    // Whole answers and errors on chat completions, streamed and not.
    for (const model of ['echo-400', 'echo-404', 'echo-401', 'echo-429', 'echo-redirect', 'echo-html-503', 'echo-big-500', 'echo-200']) {
      const { status, text } = await post('/v1/chat/completions', chatBody(model));
      expect(status, `${model}: ${text.slice(0, 300)}`).toBeGreaterThanOrEqual(model === 'echo-200' ? 200 : 400);
    }
    for (const model of ['echo-stream-mid', 'echo-stream-early']) await post('/v1/chat/completions', chatBody(model, { stream: true }));
    await post('/v1/responses', JSON.stringify({ model: 'echo-responses-failed', input: 'hi', stream: true }));
    // Anthropic: its own API, and chat completions translated to it.
    const anthropicHeaders = { 'anthropic-version': '2023-06-01' };
    for (const model of ['claude-echo-400', 'claude-echo-401', 'claude-echo-529']) {
      await post('/v1/messages', JSON.stringify({ model, max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] }), anthropicHeaders);
      await post('/v1/chat/completions', chatBody(model));
    }
    for (const model of ['claude-echo-early', 'claude-echo-mid']) {
      await post('/v1/messages', JSON.stringify({ model, max_tokens: 10, stream: true, messages: [{ role: 'user', content: 'hi' }] }), anthropicHeaders);
      await post('/v1/chat/completions', chatBody(model, { stream: true }));
    }
    // Passthrough: an error, a redirect, an answer.
    for (const model of ['echo-400', 'echo-401', 'echo-redirect', 'echo-200']) await post('/v1/files', JSON.stringify({ model }));

    // What the SDK raises for a broken stream: its message is shown to users and logged by agents.
    const sdk = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0 });
    const raised = await (async () => {
      const stream = await sdk.chat.completions.create({ model: 'echo-stream-mid', messages: [{ role: 'user', content: 'hi' }], stream: true });
      for await (const _ of stream);
    })().then(
      () => undefined,
      (e: unknown) => e as Error,
    );
    expect(raised).toBeInstanceOf(Error);
    seen.push(['sdk stream error', `${raised?.message} ${JSON.stringify(raised)}`]);
    const failed = await sdk.chat.completions.create({ model: 'echo-400', messages: [{ role: 'user', content: 'hi' }] }).catch((e: unknown) => e as InstanceType<typeof OpenAI.APIError>);
    expect(failed).toBeInstanceOf(OpenAI.APIError);
    seen.push(['sdk error', `${(failed as Error).message} ${JSON.stringify(failed)}`]);

    // The gateway's own endpoints.
    for (const path of ['/metrics', '/healthz', '/readyz', '/v1/models', '/v1/models/gpt-4o']) {
      seen.push([`GET ${path}`, await wholeText(await fetch(`${url}${path}`))]);
    }
    seen.push(['GET /v1/models (anthropic)', await wholeText(await fetch(`${url}/v1/models`, { headers: anthropicHeaders }))]);

    // Everything reached the providers with the company's keys: the echoes were real.
    expect(openai.received.some((r) => r.headers.authorization === `Bearer ${KEY}`)).toBe(true);
    expect(claude.received.some((r) => r.headers['x-api-key'] === ANT_KEY)).toBe(true);
    await sleep(100);
    for (const [what, text] of seen) expectNoKey(what, text);
    // The request log: the provider's request id of a refused key's 401 (or a redirect) is named there, and it held the key.
    expect(logs.length).toBeGreaterThan(25);
    for (const line of logs) expectNoKey('a log line', line);
    expect(logs.some((l) => l.includes('"upstreamRequestId":"req_[redacted]"'))).toBe(true);
  });

  it('is in no start-up error: a key put where a URL, a port or a name belongs is named by its variable', async () => {
    const env = { OPENAI_API_KEY: KEY, OPENAI_BASE_URL: 'https://api.openai.com/v1' };
    const provider = (fields: string) => `providers:\n  openai:\n    family: openai\n${fields}\nroutes:\n  - name: chat\n    match: { path: /v1/chat/completions }\n    targets: [ { provider: openai } ]\n`;
    const mistakes = [
      // The two variables swapped.
      provider('    baseUrl: "${OPENAI_API_KEY}"\n    apiKey: "${OPENAI_BASE_URL}"'),
      provider('    baseUrl: "https://api.openai.com/v1?key=${OPENAI_API_KEY}"\n    apiKey: "${OPENAI_API_KEY}"'),
      provider('    baseUrl: "https://user:${OPENAI_API_KEY}@api.openai.com/v1"\n    apiKey: "${OPENAI_API_KEY}"'),
      provider('    baseUrl: https://api.openai.com/v1\n    apiKey: "${OPENAI_API_KEY}"\n    proxy: "${OPENAI_API_KEY}"'),
      `${provider('    baseUrl: https://api.openai.com/v1\n    apiKey: "${OPENAI_API_KEY}"')}server:\n  port: "\${OPENAI_API_KEY}"\n  allowedHosts: "\${OPENAI_API_KEY}"\n`,
      `${provider('    baseUrl: https://api.openai.com/v1\n    apiKey: "${OPENAI_API_KEY}"')}  - name: "\${OPENAI_API_KEY}"\n    match: { path: "/v1/\${OPENAI_API_KEY}", models: "\${OPENAI_API_KEY}" }\n    targets: [ { provider: "\${OPENAI_API_KEY}" } ]\n`,
      `${provider('    baseUrl: https://api.openai.com/v1\n    apiKey: "${OPENAI_API_KEY}"')}state: { redis: "\${OPENAI_API_KEY}", keyPrefix: "\${OPENAI_API_KEY}!" }\nauth:\n  keys: { a: "\${OPENAI_API_KEY}", b: "\${OPENAI_API_KEY}" }\n  priority: { a: "\${OPENAI_API_KEY}" }\n`,
      // The same mistakes with the key written inline next to a broken line.
      provider(`    baseUrl: https://api.openai.com/v1\n    apiKey: ${KEY}\n    apiKeys: ${KEY}\n    timeouts: { connectMs: "${KEY}"`),
      provider(`    baseUrl: https://api.openai.com/v1\n    apiKey: ${KEY}\n      extra: ${KEY}`),
    ];
    for (const text of mistakes) {
      let message = '';
      try {
        parseConfig(text, 'pentest.yaml', env);
      } catch (err) {
        expect(err).toBeInstanceOf(ConfigError);
        message = (err as Error).message;
      }
      expect(message, text).not.toBe('');
      expect(leaks(message, KEY), `${message}`).toBeUndefined();
    }

    // And the real command line: what reaches the terminal (and the container's log) when the gateway will not start.
    const dir = mkdtempSync(join(tmpdir(), 'stormgate-sec-'));
    try {
      const file = join(dir, 'gw.yaml');
      writeFileSync(file, `server: { host: 127.0.0.1, port: "\${OPENAI_API_KEY}", logLevel: info }\n${mistakes[0]!}`);
      const { STORMGATE_CONFIG: _drop, ...base } = process.env;
      const child = spawn(process.execPath, ['--import', 'tsx', 'src/main.ts', '--config', file], { env: { ...base, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      child.stdout.on('data', (d: Buffer) => (out += d.toString()));
      child.stderr.on('data', (d: Buffer) => (out += d.toString()));
      const [code] = (await once(child, 'exit')) as [number | null];
      expect(code).toBe(2);
      expect(out).toMatch(/OPENAI_API_KEY/);
      expect(leaks(out, KEY), out).toBeUndefined();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
  it('is refused at start-up when it holds a character beyond ASCII, instead of a 500 on every request', async () => {
    // A key pasted from a document or a chat: a zero-width space, a typographic quote. The gateway started, and undici
    // refused every request to the provider (UND_ERR_INVALID_ARG): 500 internal_error, which the README calls a bug.
    // A Latin-1 one (an é) went as a byte no provider's key holds: the target held off as a bad key.
    for (const pasted of [`${KEY}\u200b`, `${KEY.slice(0, 10)}\u2019${KEY.slice(11)}`, `${KEY.slice(0, 12)}\u00e9${KEY.slice(13)}`]) {
      let message = '';
      try {
        parseConfig(`providers:\n  openai: { family: openai, baseUrl: "https://api.openai.com/v1", apiKey: "\${OPENAI_API_KEY}" }\nroutes:\n  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: openai } ] }\n`, 'pentest.yaml', { OPENAI_API_KEY: pasted });
      } catch (err) {
        expect(err).toBeInstanceOf(ConfigError);
        message = (err as Error).message;
      }
      expect(message, JSON.stringify(pasted)).toMatch(/pentest\.yaml:2: providers\.openai\.apiKey: holds a character beyond ASCII \(U\+(200B|2019|00E9)/);
      expect(leaks(message, KEY), message).toBeUndefined();
    }
  });
});


// ---------------------------------------------------------------------------------------------------------------

/** A provider that answers every request with a small chat completion (or a model list), recording what it got. */
const plainProvider = () =>
  provider((req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    if (req.method === 'GET' && req.url.startsWith('/v1/models')) return void res.end(JSON.stringify({ object: 'list', data: [] }));
    if (req.url.includes('/messages')) return void res.end(JSON.stringify({ id: 'msg_1', type: 'message', role: 'assistant', model: 'claude-sonnet-4-6', content: [{ type: 'text', text: 'ok' }], stop_reason: 'end_turn', stop_sequence: null, usage: { input_tokens: 1, output_tokens: 1 } }));
    if (req.url.includes('/embeddings')) return void res.end(JSON.stringify({ object: 'list', data: [{ object: 'embedding', index: 0, embedding: [0.1] }], model: 'e', usage: { prompt_tokens: 1, total_tokens: 1 } }));
    res.end(req.method === 'HEAD' ? undefined : completionJson());
  });

/** The path a provider was asked for, dot segments and escapes resolved as a server that decodes first would read it. */
function resolvedPath(url: string): string {
  let path = url.split('?')[0]!;
  for (let i = 0; i < 3; i++) {
    try {
      path = decodeURIComponent(path);
    } catch {
      break;
    }
  }
  return new URL(`http://x${path.replaceAll('\\', '/').replace(/^\/*/, '/')}`).pathname.replace(/\/{2,}/g, '/');
}

/** Request targets an attacker tries in order to reach another path of the provider with the company's key. */
const PATH_TRICKS = [
  '/v1/files',
  '/v1/files/file-abc',
  '/v1/../v1/files',
  '/v1/chat/completions/../../v1/batches',
  '/v1/chat/completions/..',
  '/v1/chat/completions/%2e%2e/%2e%2e/v1/batches',
  '/v1/chat/completions%2f..%2f..%2fv1%2fbatches',
  '/v1/chat/completions/%252e%252e/%252e%252e/v1/batches',
  '/v1/chat/completions\\..\\..\\v1\\batches',
  '/v1/chat/completions/..;/..;/v1/batches',
  '//v1/chat/completions',
  '/v1//chat/completions',
  '/v1/chat/completions/',
  '/v1/chat/completions/.',
  '/v1/chat/completions./',
  '/V1/CHAT/COMPLETIONS',
  '/v1/chat/completions%00',
  '/v1/chat/completions%23/../../batches',
  '/v1/chat/completions%3f/../../batches',
  '/v1/models/../batches',
  '/v1/models/%2e%2e%2fbatches',
  '/v1/organization/api_keys',
  '/admin',
  '*',
];

describe('no open relay for the company key', () => {
  it('with passthrough off, no path but the managed ones reaches the provider, however it is spelled, with any method', async () => {
    const p = await plainProvider();
    const evil = await plainProvider();
    const config = yamlOf(
      `server: { host: 127.0.0.1, port: 0, logLevel: warn, allowedHosts: ["*"] }
providers:
  openai: { family: openai, baseUrl: "${p.origin}/v1", apiKey: "\${OPENAI_API_KEY}", breaker: false }
routes:
  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: openai } ], park: false }
`,
      { OPENAI_API_KEY: KEY },
    );
    const url = await startGateway(config);
    const evilHost = new URL(evil.origin).host;
    for (const target of PATH_TRICKS) {
      for (const method of ['GET', 'POST', 'PUT', 'DELETE', 'PATCH']) {
        const a = await rawSend(url, rawRequest(method, target, JSON_HEADERS, method === 'GET' ? '' : chatBody()));
        if (a.status === 200) continue; // the router's own reading of the managed path (README: /v1/chat/%63ompletions)
        expect([400, 404, 405], `${method} ${target}: ${a.head}`).toContain(a.status);
        expectErrorShape(a.body, a.status === 405 ? ['method_not_allowed'] : a.status === 404 ? ['unknown_url', 'model_not_found'] : ['bad_request'], `${method} ${target}`);
      }
    }
    // An absolute-form request target (RFC 9112 3.2.2), a Host and every X-Forwarded-* naming another server: the
    // request goes where the config says, or nowhere.
    const redirectors: Array<[string, string]> = [
      ['Host', evilHost],
      ['X-Forwarded-Host', evilHost],
      ['X-Forwarded-Proto', 'https'],
      ['X-Forwarded-Port', new URL(evil.origin).port],
      ['X-Forwarded-Prefix', '/v1/batches'],
      ['Forwarded', `host=${evilHost};proto=http`],
      ['X-Original-URL', '/v1/batches'],
      ['X-Rewrite-URL', '/v1/batches'],
      ['X-Original-Host', evilHost],
      ['X-Host', evilHost],
      ...JSON_HEADERS,
    ];
    for (const target of [`${evil.origin}/v1/chat/completions`, `http://${evilHost}/v1/batches`, `http://${evilHost}.`, '/v1/chat/completions']) {
      const a = await rawSend(url, rawRequest('POST', target, redirectors, chatBody()));
      expect([200, 400, 404], `${target}: ${a.head}`).toContain(a.status);
      if (a.status !== 200) expectErrorShape(a.body, ['bad_request', 'unknown_url'], target);
    }
    expect(evil.received).toEqual([]);
    // What reached the provider: its chat completions path (and the model list the gateway's own /v1/models reads),
    // and nothing of the client's forwarding headers.
    expect(p.received.length).toBeGreaterThan(0);
    for (const r of p.received) {
      expect(['POST /v1/chat/completions', 'GET /v1/models']).toContain(`${r.method} ${r.url.split('?')[0]}`);
      expect(r.headers.host).toBe(new URL(p.origin).host);
      for (const h of Object.keys(r.headers)) expect(h).not.toMatch(/^(x-forwarded-|forwarded$|x-original-|x-rewrite-|x-host$)/);
    }
  });

  it('with passthrough on, only the listed paths and methods reach the provider, and none of the tricks leaves them', async () => {
    const p = await plainProvider();
    const config = yamlOf(
      `server: { host: 127.0.0.1, port: 0, logLevel: warn }
providers:
  openai: { family: openai, baseUrl: "${p.origin}/v1", apiKey: "\${OPENAI_API_KEY}", breaker: false }
routes:
  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: openai } ], park: false }
passthrough: { provider: openai, paths: [/v1/files], methods: [GET] }
`,
      { OPENAI_API_KEY: KEY },
    );
    const url = await startGateway(config);
    const tricks = [
      ...PATH_TRICKS,
      '/v1/files/../batches',
      '/v1/files/%2e%2e/batches',
      '/v1/files/%2E%2E/batches',
      '/v1/files/.%2e/batches',
      '/v1/files/x/..%2f..%2fbatches',
      '/v1/files/x/%2F..%2F..%2Fbatches',
      '/v1/files/x\\..\\..\\batches',
      '/v1/files/x/%5c..%5c..%5cbatches',
      '/v1/files//..//batches',
      '/v1/files/x/..;/..;/batches',
      '/v1/files%2f..%2fbatches',
      '/v1/files..',
      '/v1/files-admin',
      '/v1/filesx/../batches',
      '/v1/files/x?/../../batches',
      '/v1/files/x#/../../batches',
      `http://127.0.0.1/v1/files/../batches`,
      'http://evil.example/v1/files/x',
    ];
    for (const target of tricks) {
      for (const method of ['GET', 'HEAD', 'POST', 'DELETE', 'PUT', 'PATCH', 'OPTIONS', 'TRACE']) {
        const a = await rawSend(url, rawRequest(method, target, JSON_HEADERS, ['GET', 'HEAD'].includes(method) ? '' : chatBody()));
        if (method !== 'HEAD' && a.status >= 400) expectErrorShape(a.body, ['bad_request', 'unknown_url', 'method_not_allowed', 'model_not_found'], `${method} ${target}: ${a.text.slice(0, 300)}`);
      }
    }
    // The header forms of another method or path are no way round either (README: dropped).
    await rawSend(url, rawRequest('GET', '/v1/files/file-abc', [['X-HTTP-Method-Override', 'DELETE'], ['X-Original-URL', '/v1/batches'], ['X-Forwarded-Prefix', '/v1/batches']]));
    for (const r of p.received) {
      // The managed route's own calls, and the model list the gateway's /v1/models reads.
      if ((r.method === 'POST' && r.url.split('?')[0] === '/v1/chat/completions') || (r.method === 'GET' && r.url === '/v1/models')) continue;
      expect(['GET', 'HEAD'], `${r.method} ${r.url}`).toContain(r.method);
      expect(resolvedPath(r.url), r.url).toMatch(/^\/v1\/files(\/|$)/);
      expect(r.headers.authorization).toBe(`Bearer ${KEY}`);
      for (const h of Object.keys(r.headers)) expect(h).not.toMatch(/^(x-forwarded-|forwarded$|x-original-|x-http-method)/);
    }
    expect(p.received.filter((r) => r.url.startsWith('/v1/files')).length).toBeGreaterThan(0);
  });

  it("never lets a client's credential headers, in any case or repeated, replace or sit beside the gateway's", async () => {
    const p = await plainProvider();
    const config = yamlOf(
      `server: { host: 127.0.0.1, port: 0, logLevel: warn }
providers:
  openai: { family: openai, baseUrl: "${p.origin}/v1", apiKey: "\${OPENAI_API_KEY}", breaker: false }
  claude: { family: anthropic, baseUrl: "${p.origin}", apiKey: "\${ANTHROPIC_API_KEY}", breaker: false }
  azure: { family: azure-openai, baseUrl: "${p.origin}", apiKey: "\${AZURE_KEY}", apiVersion: "2024-10-21", breaker: false }
routes:
  - { name: chat-claude, match: { path: /v1/chat/completions, models: ["claude-*"] }, targets: [ { provider: claude } ], park: false }
  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: openai } ], park: false }
  - { name: messages, match: { path: /v1/messages }, targets: [ { provider: claude } ], park: false }
  - { name: embeddings, match: { path: /v1/embeddings }, targets: [ { provider: azure } ], park: false }
passthrough: { provider: openai, paths: [/v1/files], methods: [GET, POST] }
`,
      { OPENAI_API_KEY: KEY, ANTHROPIC_API_KEY: ANT_KEY, AZURE_KEY: 'azure-key-0123456789abcdef0123456789' },
    );
    const url = await startGateway(config);
    const forged: Array<[string, string]> = [
      ['Authorization', 'Bearer sk-client-not-a-provider-key'],
      ['AUTHORIZATION', 'Bearer client-secret'],
      ['authorization', 'Basic Y2xpZW50OnNlY3JldA=='],
      ['Api-Key', 'client-azure-key'],
      ['API-KEY', 'client-azure-key'],
      ['X-Api-Key', 'client-x-api-key'],
      ['x-API-key', 'client-x-api-key'],
      ['Proxy-Authorization', 'Basic client-secret'],
      ['OpenAI-Organization', 'org-attacker'],
      ['OpenAI-Project', 'proj-attacker'],
      ['Cookie', 'session=client-secret'],
      ['anthropic-version', '2023-06-01'],
      ...JSON_HEADERS,
    ];
    const calls: Array<[string, string, string]> = [
      ['POST', '/v1/chat/completions', chatBody()],
      ['POST', '/v1/chat/completions', chatBody('claude-sonnet-4-6')],
      ['POST', '/v1/messages', JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 5, messages: [{ role: 'user', content: 'hi' }] })],
      ['POST', '/v1/embeddings', JSON.stringify({ model: 'embed-deployment', input: 'x' })],
      ['POST', '/v1/files', chatBody()],
      ['GET', '/v1/files/file-abc', ''],
    ];
    for (const [method, path, body] of calls) {
      const before = p.received.length;
      const a = await rawSend(url, rawRequest(method, path, forged, body));
      expect(a.status, `${path}: ${a.text.slice(0, 300)}`).toBe(200);
      expect(p.received.length).toBe(before + 1);
      const r = p.received.at(-1)!;
      const creds = [];
      for (let i = 0; i < r.rawHeaders.length; i += 2) {
        const name = r.rawHeaders[i]!.toLowerCase();
        if (/^(authorization|api-key|x-api-key|proxy-authorization|cookie|openai-organization|openai-project)$/.test(name)) creds.push(`${name}: ${r.rawHeaders[i + 1]}`);
      }
      const expected = r.url.includes('/messages') ? [`x-api-key: ${ANT_KEY}`] : r.url.includes('/openai/deployments/') ? ['api-key: azure-key-0123456789abcdef0123456789'] : [`authorization: Bearer ${KEY}`];
      expect(creds, `${method} ${path} reached ${r.url}`).toEqual(expected);
    }
  });
});

// ---------------------------------------------------------------------------------------------------------------

/** A gateway on one plain provider with its log lines, for the injection scenarios. */
async function plainGateway(extraYaml = '', server = 'logLevel: info') {
  const p = await plainProvider();
  const logs: string[] = [];
  const config = yamlOf(
    `server: { host: 127.0.0.1, port: 0, ${server} }
providers:
  openai: { family: openai, baseUrl: "${p.origin}/v1", apiKey: "\${OPENAI_API_KEY}", breaker: false }
routes:
  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: openai } ], park: false }
${extraYaml}`,
    { OPENAI_API_KEY: KEY },
  );
  const url = await startGateway(config, { logs });
  return { p, url, logs };
}

const headerOf = (a: RawAnswer, name: string) => a.headers.filter(([n]) => n === name).map(([, v]) => v);
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

describe('header and log injection', () => {
  it("echoes a client's x-request-id only when it is plausible; anything else gets an id of the gateway's own", async () => {
    const { p, url, logs } = await plainGateway();
    const plausible = 'trace-7f3a.b:c@d_e';
    const ok = await rawSend(url, rawRequest('POST', '/v1/chat/completions', [...JSON_HEADERS, ['X-Request-Id', plausible]], chatBody()));
    expect(ok.status).toBe(200);
    expect(headerOf(ok, 'x-stormgate-request-id')).toEqual([plausible]);
    expect(p.received.at(-1)!.headers['x-client-request-id']).toBe(plausible);

    const implausible: Array<Array<[string, string]>> = [
      [['X-Request-Id', 'a b']],
      [['X-Request-Id', '"},{"level":60,"msg":"forged"']],
      [['X-Request-Id', '<script>alert(1)</script>']],
      [['X-Request-Id', 'abc%0d%0aSet-Cookie:%20evil=1']],
      [['X-Request-Id', 'x'.repeat(129)]],
      [['X-Request-Id', 'y'.repeat(15_000)]],
      [['X-Request-Id', 'caf\u00e9\u00ff']],
      [['X-Request-Id', 'dup-one'], ['x-request-id', 'dup-two']],
      [['X-Request-Id', '']],
    ];
    for (const headers of implausible) {
      const a = await rawSend(url, rawRequest('POST', '/v1/chat/completions', [...JSON_HEADERS, ...headers], chatBody()));
      const what = headers.map(([, v]) => v.slice(0, 40)).join(' + ');
      expect(a.status, what).toBe(200);
      const [id] = headerOf(a, 'x-stormgate-request-id');
      expect(id, what).toMatch(UUID);
      expect(p.received.at(-1)!.headers['x-client-request-id'], what).toBe(id);
      expect(headerOf(a, 'set-cookie'), what).toEqual([]);
    }
    await sleep(50);
    // One JSON line per request, each the gateway's own: nothing a client sent became a line of its own.
    const lines = logs.map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines.filter((l) => l.msg === 'request')).toHaveLength(implausible.length + 1);
    expect(lines.some((l) => l.msg === 'forged' || l.level === 60)).toBe(false);
    expect(lines.map((l) => l.reqId)).toContain(plausible);
  });

  it('refuses control characters in any header with 400 in the OpenAI shape, and writes none back', async () => {
    const { p, url } = await plainGateway();
    const hostile: Array<[string, string]> = [
      ['X-Request-Id', 'abc\rSet-Cookie: evil=1'],
      ['X-Request-Id', 'abc\nSet-Cookie: evil=1'],
      ['X-Stormgate-Priority', 'online\u0000batch'],
      ['X-Stormgate-Timeout-Ms', '5000\u0001'],
      ['Idempotency-Key', 'key\u007f'],
      ['Anthropic-Version', '2023-06-01\u001b[31m'],
    ];
    for (const [name, value] of hostile) {
      const a = await rawSend(url, rawRequest('POST', '/v1/chat/completions', [...JSON_HEADERS, [name, value]], chatBody()));
      expect(a.status, JSON.stringify(value)).toBe(400);
      expectErrorShape(a.body, ['bad_request'], JSON.stringify(value));
      expect(headerOf(a, 'set-cookie')).toEqual([]);
    }
    // An obsolete line folding (RFC 9112 5.2) is no way to smuggle a second header either.
    const folded = await rawSend(url, `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nX-Request-Id: abc\r\n Set-Cookie: evil=1\r\nContent-Length: ${chatBody().length}\r\nConnection: close\r\n\r\n${chatBody()}`);
    expect(folded.status).toBe(400);
    expectErrorShape(folded.body, ['bad_request']);
    expect(p.received).toEqual([]);
  });

  it('answers client values it cannot take (priority, timeout, idempotency key) in the OpenAI shape, and logs them as inert text', async () => {
    const { p, url, logs } = await plainGateway();
    const cases: Array<[Array<[string, string]>, number, string | undefined]> = [
      [[['X-Stormgate-Timeout-Ms', '-5']], 400, 'bad_request'],
      [[['X-Stormgate-Timeout-Ms', 'Infinity']], 400, 'bad_request'],
      [[['X-Stormgate-Timeout-Ms', '1e400']], 400, 'bad_request'],
      [[['X-Stormgate-Timeout-Ms', 'NaN']], 400, 'bad_request'],
      [[['Idempotency-Key', 'caf\u00e9']], 400, 'invalid_idempotency_key'],
      [[['Idempotency-Key', 'k'.repeat(256)]], 400, 'invalid_idempotency_key'],
      [[['Idempotency-Key', 'one'], ['Idempotency-Key', 'two']], 400, 'invalid_idempotency_key'],
      // An unknown class is no class: the route's applies, and the log names what was asked (cut short).
      [[['X-Stormgate-Priority', `"},"level":60,"msg":"forged","x":"${'p'.repeat(5000)}`]], 200, undefined],
      [[['X-Stormgate-Priority', 'ünïcödé']], 200, undefined],
    ];
    for (const [headers, status, code] of cases) {
      const a = await rawSend(url, rawRequest('POST', '/v1/chat/completions', [...JSON_HEADERS, ...headers], chatBody()));
      expect(a.status, headers.join()).toBe(status);
      if (code) expectErrorShape(a.body, [code], headers.join());
    }
    await sleep(50);
    const lines = logs.map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines.some((l) => l.msg === 'forged' || l.level === 60)).toBe(false);
    for (const l of lines) expect(JSON.stringify(l).length).toBeLessThan(3_000);
    expect(p.received).toHaveLength(2);
  });

  it("writes a model name with line breaks and quotes into no header line and no log line of its own", async () => {
    const { p, url, logs } = await plainGateway();
    const models = [
      'gpt-4o\r\nSet-Cookie: evil=1\r\nX-Injected: yes',
      'gpt-4o"}\n{"level":60,"msg":"forged","reqId":"x',
      'gpt-4o\u2028\u2029\u0085',
      `gpt-4o${'\u0000'.repeat(3)}`,
      `gpt-4o-${'é'.repeat(300)}`,
    ];
    for (const model of models) {
      const a = await rawSend(url, rawRequest('POST', '/v1/chat/completions', JSON_HEADERS, chatBody(model)));
      expect(a.status, JSON.stringify(model)).toBe(200);
      expect(headerOf(a, 'set-cookie')).toEqual([]);
      expect(headerOf(a, 'x-injected')).toEqual([]);
      for (const [name, value] of a.headers) expect(value, name).toMatch(/^[\x20-\x7e]*$/);
      const [target] = headerOf(a, 'x-stormgate-target');
      expect(target!.length).toBeLessThanOrEqual(256);
    }
    expect(p.received).toHaveLength(models.length);
    await sleep(50);
    const lines = logs.map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines.filter((l) => l.msg === 'request')).toHaveLength(models.length);
    expect(lines.some((l) => l.msg === 'forged' || l.level === 60)).toBe(false);
    // Model names in labels, log lines and messages are cut at 128 characters (README).
    for (const l of lines) expect(String(l.target).length).toBeLessThanOrEqual('openai/'.length + 129);
  });
});

// ---------------------------------------------------------------------------------------------------------------

/** The number of series (sample lines) on a gateway's /metrics. */
async function seriesCount(url: string): Promise<{ count: number; text: string }> {
  const text = await (await fetch(`${url}/metrics`)).text();
  return { count: text.split('\n').filter((l) => l !== '' && !l.startsWith('#')).length, text };
}

/** Runs `n` tasks, `width` at a time. */
async function inParallel(n: number, width: number, task: (i: number) => Promise<unknown>): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: width }, async () => {
    while (next < n) await task(next++);
  }));
}

describe('metric series a client cannot multiply', () => {
  it('stay the same set however many model names, priorities, paths, request ids, idempotency keys and client keys arrive', async () => {
    const p = await plainProvider();
    const config = yamlOf(
      `server: { host: 127.0.0.1, port: 0, logLevel: warn }
providers:
  openai: { family: openai, baseUrl: "${p.origin}/v1", apiKey: "\${OPENAI_API_KEY}", breaker: false, pools: { maxConcurrent: 64, classes: { online: { minShare: 0.5 }, batch: { minShare: 0.1 } } } }
auth:
  keys: { agents: "\${AGENTS}", batch-jobs: "\${BATCH}" }
  priority: { batch-jobs: batch }
routes:
  - { name: named, match: { path: /v1/chat/completions, models: ["gpt-4o"] }, targets: [ { provider: openai } ], park: false }
  - { name: any, match: { path: /v1/chat/completions }, targets: [ { provider: openai } ], park: false }
passthrough: { provider: openai, paths: [/v1/files], methods: [GET] }
`,
      { OPENAI_API_KEY: KEY, AGENTS: AGENTS_KEY, BATCH: BATCH_KEY },
    );
    const url = await startGateway(config);
    const send = (i: number, phase: string) => {
      const kind = i % 6;
      const key = kind === 5 ? `sg-pentest-guess-${phase}-${i}` : i % 2 ? AGENTS_KEY : BATCH_KEY;
      const headers: Record<string, string> = {
        'content-type': 'application/json',
        authorization: `Bearer ${key}`,
        'x-request-id': `pentest-${phase}-rid-${i}`,
        'x-stormgate-priority': `pentest-${phase}-prio-${i}`,
        'idempotency-key': `pentest-${phase}-idem-${i}`,
      };
      const path = kind === 4 ? `/v1/pentest-${phase}-path-${i}` : kind === 3 ? `/v1/files/pentest-${phase}-file-${i}` : '/v1/chat/completions';
      const body = kind === 2 ? '{"model":' : chatBody(`pentest-${phase}-model-${i}`);
      return fetch(`${url}${path}`, { method: kind === 3 ? 'GET' : 'POST', headers, ...(kind !== 3 && { body }) }).then((r) => r.arrayBuffer());
    };
    // Every kind of request once, and more model names than the gateway learns (README: a route that serves any model
    // learns its names from traffic, a bounded number of them): the series that can exist, exist.
    await inParallel(120, 8, (i) => send(i, 'warm'));
    await fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${AGENTS_KEY}` }, body: chatBody('gpt-4o') }).then((r) => r.arrayBuffer());
    const before = await seriesCount(url);
    // Then a flood of new values of everything a client chooses.
    await inParallel(1_200, 16, (i) => send(i, 'flood'));
    const after = await seriesCount(url);
    expect(after.count, 'series added by the flood').toBe(before.count);
    // No value from the flood is a label (request ids, client keys, priorities, paths, idempotency keys, models).
    expect(after.text).not.toContain('pentest-flood');
    expect(after.text).not.toContain('sg-pentest');
    // The flood was served (it was not the 401s alone that kept the series in check).
    expect(p.received.filter((r) => String(r.body?.model ?? '').startsWith('pentest-flood')).length).toBeGreaterThan(300);
  });
});

// ---------------------------------------------------------------------------------------------------------------

describe('resource abuse', () => {
  it('answers bodies past server.bodyLimitBytes 413 in the OpenAI shape, however they are framed, and sends none upstream', async () => {
    const { p, url } = await plainGateway('passthrough: { provider: openai, paths: [/v1/files], methods: [POST] }\n', 'logLevel: warn, bodyLimitBytes: 65536');
    const big = chatBody('gpt-4o', { pad: 'x'.repeat(70_000) });
    const chunked = (body: string) => `${(body.length).toString(16)}\r\n${body}\r\n0\r\n\r\n`;
    const sends = [
      rawRequest('POST', '/v1/chat/completions', JSON_HEADERS, big),
      rawRequest('POST', '/v1/chat/completions', [...JSON_HEADERS, ['Transfer-Encoding', 'chunked']], chunked(big)),
      // A length past the limit is refused on its headers: the body need not come at all.
      rawRequest('POST', '/v1/chat/completions', [...JSON_HEADERS, ['Content-Length', '999999999999']]),
      rawRequest('POST', '/v1/chat/completions', [...JSON_HEADERS, ['Content-Length', '999999999999'], ['Expect', '100-continue']]),
    ];
    for (const text of sends) {
      const a = await rawSend(url, text);
      expect(a.status, a.text.slice(0, 200)).toBe(413);
      expectErrorShape(a.body, ['request_too_large']);
      expect(JSON.parse(a.body).error.message).toMatch(/65536/);
    }
    // Ambiguous framing (request smuggling): refused, never read two ways.
    const smuggle = await rawSend(url, `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n${chunked(chatBody())}`);
    expect(smuggle.status).toBe(400);
    expectErrorShape(smuggle.body, ['bad_request']);
    const twoLengths = await rawSend(url, `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${chatBody().length}\r\nContent-Length: 3\r\nConnection: close\r\n\r\n${chatBody()}`);
    expect(twoLengths.status).toBe(400);
    expectErrorShape(twoLengths.body, ['bad_request']);
    expect(p.received).toEqual([]);
  });

  it('answers JSON nested far deeper than any request needs with an answer, not a 500, and keeps serving', async () => {
    const p = await plainProvider();
    const config = yamlOf(
      `server: { host: 127.0.0.1, port: 0, logLevel: warn, bodyLimitBytes: 1048576 }
providers:
  openai: { family: openai, baseUrl: "${p.origin}/v1", apiKey: "\${OPENAI_API_KEY}", breaker: false }
  claude: { family: anthropic, baseUrl: "${p.origin}", apiKey: "\${ANTHROPIC_API_KEY}", breaker: false }
routes:
  - { name: chat-claude, match: { path: /v1/chat/completions, models: ["claude-*"] }, targets: [ { provider: claude } ], park: false }
  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: openai } ], park: false }
  - { name: messages, match: { path: /v1/messages }, targets: [ { provider: claude, model: claude-haiku-4-5 } ], park: false }
  - { name: tool, match: { path: /v1/tools/lookup }, targets: [ { provider: openai, model: lookup } ], idempotency: { bodyAsKeyMs: 1000 }, park: false }
`,
      { OPENAI_API_KEY: KEY, ANTHROPIC_API_KEY: ANT_KEY },
    );
    const url = await startGateway(config);
    const deep = (n: number) => `${'['.repeat(n)}${']'.repeat(n)}`;
    const bodies: Array<[string, string, Record<string, string>]> = [
      ['/v1/chat/completions', `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"metadata":${deep(200_000)}}`, { 'idempotency-key': 'deep-1' }],
      ['/v1/chat/completions', `{"model":"claude-sonnet-4-6","messages":[{"role":"user","content":${deep(100_000)}}]}`, {}],
      ['/v1/messages', `{"model":"claude-sonnet-4-6","max_tokens":5,"messages":[{"role":"user","content":"hi"}],"metadata":${deep(200_000)}}`, { 'anthropic-version': '2023-06-01' }],
      ['/v1/tools/lookup', `{"q":${deep(200_000)}}`, {}],
      ['/v1/chat/completions', `{"model":"gpt-4o","messages":${'{"a":'.repeat(100_000)}1${'}'.repeat(100_000)}}`, {}],
    ];
    for (const [path, body, headers] of bodies) {
      const res = await fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
      const text = await res.text();
      expect(res.status, `${path}: ${text.slice(0, 200)}`).toBeLessThan(500);
      if (res.status >= 400) expectErrorShape(text, ['invalid_body', 'invalid_json'], path);
    }
    const healthy = await fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: chatBody() });
    expect(healthy.status).toBe(200);
  });

  it('closes slow senders (headers or body trickled) with 408 in the OpenAI shape while other clients are served', async () => {
    const { url } = await plainGateway('', 'logLevel: warn, requestTimeoutMs: 1500');
    const { hostname, port } = new URL(url);
    const slow = Array.from({ length: 40 }, (_, i) => {
      const sock = connect(Number(port), hostname);
      let out = '';
      const closed = new Promise<string>((resolve) => {
        sock.on('data', (d: Buffer) => (out += d.toString()));
        sock.on('close', () => resolve(out));
        sock.on('error', () => undefined);
      });
      sock.write(
        i % 2
          ? `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"model":`
          : `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: `,
      );
      return { sock, closed };
    });
    const t0 = Date.now();
    for (let i = 0; i < 5; i++) {
      const res = await fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: chatBody() });
      expect(res.status).toBe(200);
      await res.arrayBuffer();
    }
    expect(Date.now() - t0).toBeLessThan(5_000);
    const answers = await Promise.race([Promise.all(slow.map((s) => s.closed)), sleep(15_000).then(() => undefined)]);
    for (const s of slow) s.sock.destroy();
    expect(answers, 'every slow sender is closed by the gateway').toBeDefined();
    for (const out of answers!) {
      if (out === '') continue; // Node may close a connection whose headers never ended without a word.
      expect(out).toMatch(/^HTTP\/1\.1 408 /);
      expectErrorShape(out.split('\r\n\r\n')[1]!, ['request_timeout']);
    }
    expect(answers!.filter((o) => o.startsWith('HTTP/1.1 408')).length).toBeGreaterThanOrEqual(20);
  });

  it("keeps a storm from the batch team's key (raising its priority by header) off the online agents' capacity", async () => {
    // Each answer takes 300 ms: capacity, not speed, is what the storm fights over.
    const p = await provider(async (_req, res) => {
      await sleep(300);
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(completionJson());
    });
    const logs: string[] = [];
    const config = yamlOf(
      `server: { host: 127.0.0.1, port: 0, logLevel: info }
providers:
  openai:
    family: openai
    baseUrl: "${p.origin}/v1"
    apiKey: "\${OPENAI_API_KEY}"
    breaker: false
    pools: { maxConcurrent: 8, classes: { online: { minShare: 0.7, maxQueue: 50 }, batch: { minShare: 0.1, maxQueue: 10 } } }
auth:
  keys: { agents: "\${AGENTS}", batch-jobs: "\${BATCH}" }
  priority: { batch-jobs: batch }
routes:
  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: openai } ], park: false, timeoutMs: 20000 }
`,
      { OPENAI_API_KEY: KEY, AGENTS: AGENTS_KEY, BATCH: BATCH_KEY },
    );
    const url = await startGateway(config, { logs });
    const call = (key: string, priority: string) =>
      fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${key}`, 'x-stormgate-priority': priority }, body: chatBody() }).then(async (r) => ({ status: r.status, retryAfter: r.headers.get('retry-after'), body: await r.text() }));
    const storm = Array.from({ length: 150 }, () => call(BATCH_KEY, 'online'));
    await sleep(100);
    const t0 = Date.now();
    const online = await Promise.all(Array.from({ length: 10 }, () => call(AGENTS_KEY, 'online')));
    const onlineMs = Date.now() - t0;
    const batch = await Promise.all(storm);
    expect(online.map((a) => a.status)).toEqual(Array(10).fill(200));
    // Ten calls of 300 ms on at least 5 online slots: two rounds, behind at most the batch calls already running.
    expect(onlineMs).toBeLessThan(6_000);
    const shed = batch.filter((a) => a.status !== 200);
    expect(shed.length).toBeGreaterThan(100);
    for (const a of shed) {
      expect(a.status).toBe(429);
      expectErrorShape(a.body, ['load_shed']);
      expect(Number(a.retryAfter)).toBeGreaterThan(0);
    }
    await sleep(50);
    const lines = logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === 'request');
    for (const l of lines.filter((x) => x.client === 'batch-jobs')) expect(l.priority).toBe('batch');
  });
});

// ---------------------------------------------------------------------------------------------------------------

describe('client keys', () => {
  it('answers every way of sending no key, or a wrong one, 401 invalid_api_key in the shape each API reads, and sends nothing upstream', async () => {
    const p = await plainProvider();
    const logs: string[] = [];
    const config = yamlOf(
      `server: { host: 127.0.0.1, port: 0, logLevel: info }
providers:
  openai: { family: openai, baseUrl: "${p.origin}/v1", apiKey: "\${OPENAI_API_KEY}", breaker: false }
  claude: { family: anthropic, baseUrl: "${p.origin}", apiKey: "\${ANTHROPIC_API_KEY}", breaker: false }
auth:
  keys: { agents: "\${AGENTS}" }
routes:
  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: openai } ], park: false }
  - { name: messages, match: { path: /v1/messages }, targets: [ { provider: claude } ], park: false }
passthrough: { provider: openai, paths: [/v1/files], methods: [GET, POST] }
`,
      { OPENAI_API_KEY: KEY, ANTHROPIC_API_KEY: ANT_KEY, AGENTS: AGENTS_KEY },
    );
    const url = await startGateway(config, { logs });
    const wrong: Array<Array<[string, string]>> = [
      [],
      [['Authorization', 'Bearer']],
      [['Authorization', 'Bearer ']],
      [['Authorization', 'Bearer sg-wrong-guess-key']],
      [['Authorization', `Bearer ${AGENTS_KEY.toUpperCase()}`]],
      [['Authorization', `Bearer ${AGENTS_KEY.slice(0, -1)}`]],
      [['Authorization', `Bearer ${AGENTS_KEY}x`]],
      [['Authorization', `Bearer ${AGENTS_KEY} ${AGENTS_KEY}`]],
      [['Authorization', `Basic ${Buffer.from(`agents:${AGENTS_KEY}`).toString('base64')}`]],
      [['Authorization', AGENTS_KEY]],
      [['Authorization', 'Bearer sg-wrong-guess-key'], ['X-Api-Key', AGENTS_KEY]],
      [['X-Api-Key', AGENTS_KEY], ['x-api-key', 'sg-wrong-guess-key']],
      [['Cookie', `api-key=${AGENTS_KEY}`]],
      [['Proxy-Authorization', `Bearer ${AGENTS_KEY}`]],
    ];
    const targets: Array<[string, string, string, Array<[string, string]>]> = [
      ['POST', '/v1/chat/completions', chatBody(), JSON_HEADERS],
      ['POST', `/v1/chat/completions?api-key=${AGENTS_KEY}&key=${AGENTS_KEY}`, chatBody(), JSON_HEADERS],
      ['POST', '/v1/messages', JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 5, messages: [{ role: 'user', content: 'hi' }] }), [...JSON_HEADERS, ['anthropic-version', '2023-06-01']]],
      ['GET', '/v1/models', '', []],
      ['GET', '/v1/files/file-abc', '', []],
      ['POST', '/v1/files', chatBody(), JSON_HEADERS],
      ['GET', '/v1/no-such-path', '', []],
      ['DELETE', '/v1/chat/completions', '', []],
    ];
    for (const [method, path, body, base] of targets) {
      for (const creds of wrong) {
        const a = await rawSend(url, rawRequest(method, path, [...base, ...creds], body));
        const what = `${method} ${path} with ${JSON.stringify(creds)}`;
        expect(a.status, what).toBe(401);
        expectErrorShape(a.body, ['invalid_api_key'], what);
        expect(headerOf(a, 'www-authenticate'), what).toEqual(['Bearer realm="stormgate"']);
        expect(headerOf(a, 'x-should-retry'), what).toEqual(['false']);
        expect(a.text, what).not.toContain('sg-wrong-guess-key');
        if (path === '/v1/messages') expect(JSON.parse(a.body).type, what).toBe('error');
      }
    }
    // The ops endpoints stay open; the key's own forms are all read.
    for (const path of ['/healthz', '/readyz', '/metrics']) expect((await rawSend(url, rawRequest('GET', path, []))).status, path).toBe(200);
    expect(p.received.filter((r) => r.method !== 'GET' || r.url !== '/v1/models')).toEqual([]);
    const right: Array<Array<[string, string]>> = [
      [['Authorization', `Bearer ${AGENTS_KEY}`]],
      [['authorization', `bearer ${AGENTS_KEY}`]],
      [['AUTHORIZATION', `BEARER \t ${AGENTS_KEY}  `]],
      [['X-Api-Key', AGENTS_KEY]],
      [['api-key', AGENTS_KEY]],
      [['Authorization', 'Basic cHJveHk6cGFzcw=='], ['X-Api-Key', AGENTS_KEY]],
    ];
    for (const creds of right) {
      const a = await rawSend(url, rawRequest('POST', '/v1/chat/completions', [...JSON_HEADERS, ...creds], chatBody()));
      expect(a.status, JSON.stringify(creds)).toBe(200);
      expect(p.received.at(-1)!.headers.authorization).toBe(`Bearer ${KEY}`);
      expect(p.received.at(-1)!.headers['x-api-key']).toBeUndefined();
    }
    await sleep(50);
    const lines = logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === 'request');
    expect(lines.filter((l) => l.status === 401).length).toBe(targets.length * wrong.length);
    expect(lines.filter((l) => l.client === 'agents').length).toBe(right.length);
    for (const l of logs) expect(l).not.toContain(AGENTS_KEY.slice(3));
  });
  it("never hands one client's answer to another under the same idempotency key or the same body", async () => {
    let n = 0;
    const p = await provider((req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(completionJson(`private answer #${++n} for ${String(req.headers['x-client-request-id'])}`));
    });
    const config = yamlOf(
      `server: { host: 127.0.0.1, port: 0, logLevel: warn }
providers:
  openai: { family: openai, baseUrl: "${p.origin}/v1", apiKey: "\${OPENAI_API_KEY}", breaker: false }
auth:
  keys: { agents: "\${AGENTS}", batch-jobs: "\${BATCH}" }
routes:
  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: openai } ], park: false }
  - { name: tool, match: { path: /v1/tools/coupon }, targets: [ { provider: openai, model: coupon } ], idempotency: { bodyAsKeyMs: 60000 }, park: false }
`,
      { OPENAI_API_KEY: KEY, AGENTS: AGENTS_KEY, BATCH: BATCH_KEY },
    );
    const url = await startGateway(config);
    const call = async (key: string, path: string, body: string, headers: Record<string, string> = {}) => {
      const res = await fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${key}`, ...headers }, body });
      return { status: res.status, replayed: res.headers.get('idempotent-replayed'), text: await res.text() };
    };
    const first = await call(AGENTS_KEY, '/v1/chat/completions', chatBody(), { 'idempotency-key': 'order-42' });
    const again = await call(AGENTS_KEY, '/v1/chat/completions', chatBody(), { 'idempotency-key': 'order-42' });
    expect(again.replayed).toBe('true');
    expect(again.text).toBe(first.text);
    // Another client guessing (or sharing by accident) the key: its own run, never the first client's answer.
    const other = await call(BATCH_KEY, '/v1/chat/completions', chatBody(), { 'idempotency-key': 'order-42' });
    expect(other.status).toBe(200);
    expect(other.replayed).toBeNull();
    expect(other.text).not.toBe(first.text);
    // The same for a tool route that takes the body as its key.
    const tool = JSON.stringify({ user: 'u-1', coupon: 'SAVE10' });
    const mine = await call(AGENTS_KEY, '/v1/tools/coupon', tool);
    const theirs = await call(BATCH_KEY, '/v1/tools/coupon', tool);
    expect(theirs.replayed).toBeNull();
    expect(theirs.text).not.toBe(mine.text);
    expect(p.received).toHaveLength(4);
  });
});
