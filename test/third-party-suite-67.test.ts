// Third-party suite 67: what real providers, and the CDNs, load balancers and proxies in front of them, do at the HTTP
// level, written as an outside tester of LLM gateways would, beyond what the bundled mock's flags produce. The
// provider is a raw `node:net` server of the test's own (it writes the answer byte for byte: wrong content-length,
// 1xx before the answer, trailers, huge headers, compressed bodies, a reset on a kept-alive socket), the backup a
// `node:http` one; the agent is the official `openai` SDK (maxRetries: 0) over real HTTP on 127.0.0.1. Each case
// checks what the README says the gateway does: retried or not, failed over or not, counted by the breaker or not,
// and what the client gets.
// Found here: an error answer whose body stalls after its headers (a balancer's 503 page, a 429 with retry-after,
// whose body never ends) was waited on until the request's deadline: a 504 deadline_exceeded after the whole deadline,
// the backup never asked and the retry-after never honoured. Its gaps are now bounded by the provider's idleMs, and
// the error is judged by its status and headers with what came of its body, as one whose body breaks off is.
import { createServer, type Server, type Socket } from 'node:net';
import { once } from 'node:events';
import { brotliCompressSync, gzipSync } from 'node:zlib';
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { chatCompletion, useFakeProviders } from './helpers/fake-provider.ts';
import { sdkError } from './helpers/openai-error.ts';
import { onRawRequests } from './helpers/raw-http.ts';
import { useGateways } from './helpers/stack.ts';

const startGateway = useGateways();
const startFake = useFakeProviders();

const PROVIDER_KEY = 'sk-provider-secret-67-0123456789abcdef';

// ---- a raw provider: every request read whole, answered by `answer` with the socket in hand ----
type Answer = (socket: Socket, n: number, request: string) => void;
const rawServers: Server[] = [];
const rawSockets: Socket[] = [];
afterEach(async () => {
  for (const s of rawSockets.splice(0)) s.destroy();
  for (const s of rawServers.splice(0)) await new Promise((done) => s.close(done));
});

async function rawProvider(answer: Answer): Promise<{ origin: string; hits: () => number; connections: () => number }> {
  let n = 0;
  let connections = 0;
  const server = createServer((socket) => {
    connections++;
    rawSockets.push(socket);
    onRawRequests(socket, (request) => answer(socket, ++n, request));
  });
  rawServers.push(server);
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return { origin: `http://127.0.0.1:${(server.address() as { port: number }).port}`, hits: () => n, connections: () => connections };
}

/** A response's bytes: status line, headers as given (no content-length added), then the body. */
function wire(status: string, headers: Record<string, string | number>, body: Buffer | string = ''): Buffer {
  const head = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join('');
  return Buffer.concat([Buffer.from(`HTTP/1.1 ${status}\r\n${head}\r\n`, 'latin1'), Buffer.isBuffer(body) ? body : Buffer.from(body)]);
}
/** A JSON answer with its content-length (overridable in `extra`). */
const jsonWire = (status: string, body: Buffer | string, extra: Record<string, string | number> = {}): Buffer =>
  wire(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), ...extra }, body);
/** One chunk of a chunked body. */
const chunk = (data: Buffer | string): Buffer => {
  const b = Buffer.isBuffer(data) ? data : Buffer.from(data);
  return Buffer.concat([Buffer.from(`${b.length.toString(16)}\r\n`), b, Buffer.from('\r\n')]);
};
const errorJson = (message: string, code: string | null = null, type = 'server_error') => JSON.stringify({ error: { message, type, param: null, code } });

const OK = chatCompletion('ok');
const event = (content: string) =>
  `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta: { content }, finish_reason: null }] })}\n\n`;
const FINISH = `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] })}\n\ndata: [DONE]\n\n`;
const HTML_502 = '<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway</h1></center><hr><center>cloudflare</center></body></html>\n';

// ---- the gateway: provider p (raw), optionally backup b (healthy), one route ----
interface Setup {
  backup?: boolean;
  maxAttempts?: number;
  breaker?: ConfigInput['providers'][string]['breaker'];
  timeouts?: Record<string, number>;
  timeoutMs?: number;
}

async function gateway(answer: Answer, setup: Setup = {}) {
  const p = await rawProvider(answer);
  let backupHits = 0;
  const b = await startFake((req, res) => {
    backupHits++;
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString()));
    req.on('end', () => {
      if (body.includes('"stream":true')) res.writeHead(200, { 'content-type': 'text/event-stream' }).end(event('backup') + FINISH);
      else res.writeHead(200, { 'content-type': 'application/json' }).end(chatCompletion('backup'));
    });
  });
  const logs: string[] = [];
  const config = ConfigSchema.parse({
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    providers: {
      p: { family: 'openai', baseUrl: `${p.origin}/v1`, apiKey: PROVIDER_KEY, breaker: setup.breaker ?? false, ...(setup.timeouts && { timeouts: setup.timeouts }) },
      b: { family: 'openai', baseUrl: `${b.origin}/v1`, apiKey: 'b-key-0123456789', breaker: false },
    },
    routes: [
      {
        name: 'chat',
        match: { path: '/v1/chat/completions' },
        targets: setup.backup ? [{ provider: 'p' }, { provider: 'b' }] : [{ provider: 'p' }],
        park: false,
        timeoutMs: setup.timeoutMs ?? 20_000,
        retry: { maxAttempts: setup.maxAttempts ?? 2, backoff: { strategy: 'fixed', baseMs: 20 } },
      },
    ],
  } satisfies ConfigInput);
  const url = await startGateway(config, { logs });
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0 });
  const ask = () => client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }).withResponse();
  const askStream = async () => {
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    let text = '';
    for await (const c of stream) text += c.choices[0]?.delta?.content ?? '';
    return text;
  };
  /** Warn-level log messages (the breaker opening, a credential hold). */
  const warnings = () => logs.map((l) => JSON.parse(l) as { level: number; msg: string }).filter((l) => l.level >= 40).map((l) => l.msg);
  return { p, backupHits: () => backupHits, ask, askStream, warnings, logs };
}

describe('a CDN or load balancer in front of the provider', () => {
  it('a 502 HTML page is retried, then reaches the SDK as an OpenAI-shaped 502 with no HTML in it and x-should-retry: false', async () => {
    const g = await gateway((s) => s.write(wire('502 Bad Gateway', { 'content-type': 'text/html', 'content-length': Buffer.byteLength(HTML_502) }, HTML_502)));
    const err = await sdkError(g.ask());
    expect(err.status).toBe(502);
    expect(err.message).not.toMatch(/<html|<center/i);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(g.p.hits()).toBe(2);
  });

  it('a 503 with an empty body is retried and then failed over to the backup', async () => {
    const g = await gateway((s) => s.write(wire('503 Service Unavailable', { 'content-length': 0 })), { backup: true });
    const { data, response } = await g.ask();
    expect(data.choices[0]!.message.content).toBe('backup');
    expect(response.headers.get('x-stormgate-attempts')).toBe('3');
    expect(g.p.hits()).toBe(2);
  });

  it('a 504 HTML page from the balancer goes to the backup and opens the breaker', async () => {
    const g = await gateway((s) => s.write(wire('504 Gateway Time-out', { 'content-type': 'text/html', 'content-length': 30 }, '<html><body>504</body></html>\n')), {
      backup: true,
      maxAttempts: 1,
      breaker: { consecutiveFailures: 1, openS: 30 },
    });
    expect((await g.ask()).data.choices[0]!.message.content).toBe('backup');
    expect(g.warnings()).toContain('breaker open');
  });

  it('a content-length longer than what was sent, then close: a cut answer, retried, then 502 upstream_bad_response', async () => {
    const g = await gateway((s) => {
      s.write(jsonWire('200 OK', OK, { 'content-length': OK.length + 50 }));
      s.end();
    });
    const err = await sdkError(g.ask());
    expect(err.status).toBe(502);
    expect(err.code).toBe('upstream_bad_response');
    expect(g.p.hits()).toBe(2);
  });

  it('a content-length shorter than what was sent: the cut JSON is retried, and the extra bytes do not poison the next request on that pool', async () => {
    const g = await gateway((s, n) => s.write(jsonWire('200 OK', OK, n === 1 ? { 'content-length': OK.length - 10 } : {})));
    const { data, response } = await g.ask();
    expect(data.choices[0]!.message.content).toBe('ok');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect((await g.ask()).data.choices[0]!.message.content).toBe('ok');
    expect(g.p.hits()).toBe(3);
  });
});

describe('compressed answers the gateway never asked for', () => {
  it('a gzipped 429 with retry-after: 1 is read as the rate limit it is, waited out, and the retry answers', async () => {
    const g = await gateway((s, n) =>
      s.write(n === 1 ? jsonWire('429 Too Many Requests', gzipSync(errorJson('Rate limit reached', 'rate_limit_exceeded', 'requests')), { 'content-encoding': 'gzip', 'retry-after': '1' }) : jsonWire('200 OK', OK)),
    );
    const started = Date.now();
    const { data } = await g.ask();
    expect(data.choices[0]!.message.content).toBe('ok');
    expect(Date.now() - started).toBeGreaterThanOrEqual(950);
    expect(g.p.hits()).toBe(2);
  });

  it('a brotli-encoded event stream reaches the SDK as events', async () => {
    const g = await gateway((s) => {
      const body = brotliCompressSync(event('he') + event('llo') + FINISH);
      s.write(wire('200 OK', { 'content-type': 'text/event-stream', 'content-encoding': 'br', 'content-length': body.length }, body));
    });
    expect(await g.askStream()).toBe('hello');
  });

  it('a gzipped JSON answer is decoded; one labelled gzip that is not is a bad answer, not passed on as garbage', async () => {
    const good = await gateway((s) => s.write(jsonWire('200 OK', gzipSync(OK), { 'content-encoding': 'gzip' })));
    expect((await good.ask()).data.choices[0]!.message.content).toBe('ok');
    const bad = await gateway((s) => s.write(jsonWire('200 OK', OK, { 'content-encoding': 'gzip' })), { maxAttempts: 1 });
    const err = await sdkError(bad.ask());
    expect([err.status, err.code]).toEqual([502, 'upstream_bad_response']);
  });
});

describe('kept-alive upstream connections', () => {
  it('a provider that closes the connection right after each answer costs one upstream request per call, no retry', async () => {
    const g = await gateway((s) => {
      s.write(jsonWire('200 OK', OK));
      setImmediate(() => s.end());
    });
    for (let i = 0; i < 3; i++) {
      const { response } = await g.ask();
      expect(response.headers.get('x-stormgate-attempts')).toBe('1');
    }
    expect(g.p.hits()).toBe(3);
  });

  it('a reset of the kept-alive connection on the next request is retried once and answered (documented as a request that may have run)', async () => {
    let answered = 0;
    const g = await gateway((s) => {
      if (answered++ === 1) return void s.resetAndDestroy();
      s.write(jsonWire('200 OK', OK));
    });
    await g.ask();
    const { data, response } = await g.ask();
    expect(data.choices[0]!.message.content).toBe('ok');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(g.p.connections()).toBe(2);
  });
});

describe('a 2xx that is no answer', () => {
  it('200 application/json that is not JSON (a proxy\'s text) and truncated JSON are retried, then 502 upstream_bad_response', async () => {
    for (const body of ['upstream connect error or disconnect/reset before headers. reset reason: overflow', OK.slice(0, 40)]) {
      const g = await gateway((s) => s.write(jsonWire('200 OK', body)));
      const err = await sdkError(g.ask());
      expect([err.status, err.code]).toEqual([502, 'upstream_bad_response']);
      expect(g.p.hits()).toBe(2);
    }
  });

  it('a 200 whose body is an {"error": ...} object goes to the backup', async () => {
    const g = await gateway((s) => s.write(jsonWire('200 OK', '{"error":{"message":"Internal error","code":500}}')), { backup: true, maxAttempts: 1 });
    expect((await g.ask()).data.choices[0]!.message.content).toBe('backup');
  });

  it('a stream whose first event is data: {"error": ...} with 200 (vLLM, OpenRouter) goes to the backup before the client sees a byte', async () => {
    const g = await gateway(
      (s) => s.write(Buffer.concat([wire('200 OK', { 'content-type': 'text/event-stream', 'transfer-encoding': 'chunked' }), chunk('data: {"error":{"message":"upstream overloaded","code":503}}\n\n'), Buffer.from('0\r\n\r\n')])),
      { backup: true, maxAttempts: 1 },
    );
    expect(await g.askStream()).toBe('backup');
  });

  it('a 200 with an empty body, and a 204, are bad answers (502 upstream_bad_response), not empty completions', async () => {
    for (const answer of [jsonWire('200 OK', ''), wire('204 No Content', {})]) {
      const g = await gateway((s) => s.write(answer), { maxAttempts: 1 });
      const err = await sdkError(g.ask());
      expect([err.status, err.code]).toEqual([502, 'upstream_bad_response']);
    }
  });
});

describe('HTTP framing quirks', () => {
  it('103 Early Hints before the answer is skipped; the answer reaches the SDK', async () => {
    const g = await gateway((s) => s.write(Buffer.concat([wire('103 Early Hints', { link: '</style.css>; rel=preload' }), jsonWire('200 OK', OK)])));
    const { data, response } = await g.ask();
    expect(data.choices[0]!.message.content).toBe('ok');
    expect(response.headers.get('x-stormgate-attempts')).toBe('1');
  });

  it('an unsolicited 100 Continue before the answer is refused by undici, as the README documents: 502 upstream_bad_response', async () => {
    const g = await gateway((s) => s.write(Buffer.concat([wire('100 Continue', {}), jsonWire('200 OK', OK)])), { maxAttempts: 1 });
    const err = await sdkError(g.ask());
    expect([err.status, err.code]).toEqual([502, 'upstream_bad_response']);
    expect(err.message).toMatch(/informational status/);
  });

  it('a chunked answer with trailers is read whole', async () => {
    const g = await gateway((s) =>
      s.write(Buffer.concat([wire('200 OK', { 'content-type': 'application/json', 'transfer-encoding': 'chunked', trailer: 'x-checksum' }), chunk(OK.slice(0, 20)), chunk(OK.slice(20)), Buffer.from('0\r\nx-checksum: abc\r\n\r\n')])),
    );
    expect((await g.ask()).data.choices[0]!.message.content).toBe('ok');
  });

  it('headers larger than undici reads (a 70 KB debug header) make a bad answer that goes to the backup', async () => {
    const g = await gateway((s) => s.write(jsonWire('200 OK', OK, { 'x-debug-trace': 'a'.repeat(70_000) })), { backup: true, maxAttempts: 1 });
    expect((await g.ask()).data.choices[0]!.message.content).toBe('backup');
  });
});

describe('a rotated key', () => {
  it('a 401 or 403 that echoes the gateway\'s key: 502 upstream_auth_error, the key in neither message nor body', async () => {
    for (const status of ['401 Unauthorized', '403 Forbidden']) {
      const g = await gateway((s, _n, req) => {
        const key = /authorization: *Bearer (\S+)/i.exec(req)?.[1] ?? '';
        s.write(jsonWire(status, errorJson(`Incorrect API key provided: ${key}. You can find your API key at https://example.invalid`, 'invalid_api_key', 'invalid_request_error')));
      });
      const err = await sdkError(g.ask());
      expect([err.status, err.code]).toEqual([502, 'upstream_auth_error']);
      expect(JSON.stringify(err.error) + err.message).not.toContain(PROVIDER_KEY.slice(8));
      expect(g.p.hits()).toBe(1);
    }
  });

  it('a gzipped 400 that quotes the key is passed on decoded, with the key taken out', async () => {
    const g = await gateway((s, _n, req) => {
      const key = /authorization: *Bearer (\S+)/i.exec(req)?.[1] ?? '';
      s.write(jsonWire('400 Bad Request', gzipSync(errorJson(`bad request for key ${key}`, 'invalid_value', 'invalid_request_error')), { 'content-encoding': 'gzip' }));
    });
    const err = await sdkError(g.ask());
    expect(err.status).toBe(400);
    expect(err.message).toContain('bad request for key');
    expect(err.message).not.toContain(PROVIDER_KEY.slice(8));
  });
});

describe('statuses a provider or its CDN answers, classified as the README says', () => {
  // [status line, goes to the backup, upstream requests to p (maxAttempts 2, default retryOn), opens the breaker]
  const cases: Array<[string, boolean, number, boolean]> = [
    ['408 Request Timeout', true, 1, true], // the provider's own timeout (Azure): a failure, failed over; 408 is not in the default retryOn
    ['409 Conflict', false, 1, false], // another 4xx: the upstream's answer, not retried unless retryOn lists it
    ['422 Unprocessable Entity', false, 1, false], // never retried
    ['425 Too Early', false, 1, false], // another 4xx
    ['499 Client Closed Request', false, 1, false], // another 4xx
    ['520 Unknown Error', true, 2, true], // Cloudflare: may have run; in the default retryOn
    ['522 Connection Timed Out', true, 1, true], // Cloudflare never reached the origin: failed over, not in retryOn
    ['524 A Timeout Occurred', true, 2, true], // Cloudflare: may have run; in the default retryOn
  ];
  for (const [status, failsOver, hits, opensBreaker] of cases) {
    it(`${status}: ${failsOver ? 'the backup answers' : 'the client gets it'}, ${hits} request(s) to the provider, breaker ${opensBreaker ? 'counts it' : 'does not'}`, async () => {
      const answer: Answer = (s) => s.write(jsonWire(status, errorJson('x')));
      const g = await gateway(answer, { backup: true });
      if (failsOver) expect((await g.ask()).data.choices[0]!.message.content).toBe('backup');
      else {
        const err = await sdkError(g.ask());
        expect(err.status).toBe(Number(status.slice(0, 3)));
        expect(err.headers?.get('x-should-retry')).toBe('false');
      }
      expect(g.p.hits()).toBe(hits);
      expect(g.backupHits()).toBe(failsOver ? 1 : 0);
      // The breaker, on a gateway of its own whose breaker opens at the first failure it counts.
      const counted = await gateway(answer, { backup: true, maxAttempts: 1, breaker: { consecutiveFailures: 1, openS: 30 } });
      await counted.ask().catch(() => undefined);
      expect(counted.warnings().includes('breaker open')).toBe(opensBreaker);
    });
  }
});

describe('an error answer whose body stalls after its headers', () => {
  // A balancer's 503 page, or a 429 with retry-after, whose body never ends (a proxy forwarding a hung upstream's
  // error, a content-length larger than what it sends on a kept connection). Its status and headers already say what
  // it is; the body only words it.
  const stalling = (head: Buffer, firstBytes: string) => (s: Socket) => s.write(Buffer.concat([head, chunk(firstBytes)]));

  it('a 503 whose HTML body stalls goes to the backup after idleMs, not at the deadline', async () => {
    const g = await gateway(stalling(wire('503 Service Unavailable', { 'content-type': 'text/html', 'transfer-encoding': 'chunked' }), '<html><body>'), {
      backup: true,
      maxAttempts: 1,
      timeouts: { idleMs: 500 },
      timeoutMs: 15_000,
    });
    const started = Date.now();
    expect((await g.ask()).data.choices[0]!.message.content).toBe('backup');
    expect(Date.now() - started).toBeLessThan(6_000);
  });

  it('a 429 with retry-after: 1 whose body stalls is still a rate limit: waited out, and the retry answers', async () => {
    const g = await gateway(
      (s, n) => {
        if (n === 1) s.write(wire('429 Too Many Requests', { 'content-type': 'application/json', 'retry-after': '1', 'content-length': 200 }, '{"error":{"message":"Rate limit'));
        else s.write(jsonWire('200 OK', OK));
      },
      { timeouts: { idleMs: 500 }, timeoutMs: 15_000 },
    );
    const started = Date.now();
    const { data, response } = await g.ask();
    expect(data.choices[0]!.message.content).toBe('ok');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    // The retry-after was honoured (a hold-off of 1 s, with its spread), and the stalled body not waited for.
    expect(Date.now() - started).toBeGreaterThanOrEqual(950);
    expect(Date.now() - started).toBeLessThan(8_000);
  });

  it('the same for a stream request: a stalled 503 body goes to the backup after idleMs, before firstTokenMs', async () => {
    const g = await gateway(stalling(wire('503 Service Unavailable', { 'content-type': 'text/html', 'transfer-encoding': 'chunked' }), '<html><body>'), {
      backup: true,
      maxAttempts: 1,
      timeouts: { idleMs: 500, firstTokenMs: 12_000 },
      timeoutMs: 15_000,
    });
    const started = Date.now();
    expect(await g.askStream()).toBe('backup');
    expect(Date.now() - started).toBeLessThan(6_000);
  });
});
