// Third-party failure-scenario suite 37: an outside team's checklist of gateway failure modes, written from the README
// alone ("Retries" and its wait hints, "Deadlines and timeouts", "Streaming", "What the client sees", "Errors", "Paths")
// and driven as users drive a gateway: the official `openai` 6.x SDK (fetch where the SDK cannot say it) over real
// HTTP on 127.0.0.1, against the bundled mock provider through its documented control endpoint, or against the
// suite's own node:http upstream where the fault is one the mock cannot produce; a real redis-server for the fleet.
//  1. wait hints as servers and proxies write them: HTTP-dates past and in the obsolete formats RFC 9110 still has a
//     recipient accept, a retry-after of centuries, garbage, x-ratelimit-reset-tokens as odd Go durations
//  2. whole answers that break: half a JSON body then silence or a close, an error object inside a 200 (once, always)
//  3. streams: SSE's `id:`/`retry:` fields and CRLF, include_usage through a retry, parallel tool calls one character
//     per write, a 200 stream that never sends an event, an end without finish or [DONE]
//  4. clients: one leaving during a long backoff, one whose deadline is shorter than the hint, a storm of 200 during
//     a brownout
//  5. the HTTP surface: the body limit to the byte, media types in capitals, unknown paths and models through the SDK
//  6. a fleet on one Redis: a hold-off announced as an HTTP-date is kept by the other instance
// Every test asserts what a client or the provider can see: statuses, the OpenAI error shape, x-should-retry,
// retry-after, x-stormgate-attempts, and how many requests the upstream received.
// Found here:
// - A `retry-after` in either of the two HTTP-date formats RFC 9110 (5.6.7) has every recipient accept beside the
//   IMF-fixdate (RFC 850's `Sunday, 06-Nov-94 08:49:37 GMT` and asctime's `Sun Nov  6 08:49:37 1994`) was dropped as
//   malformed: the gateway retried at the backoff's pace into the provider's pause and started no hold-off. Both are
//   now read (src/policy/wait-hint.ts).
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { once } from 'node:events';
import type { Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import type { MockServer } from '../src/mock/server.ts';
import { mockControl } from './helpers/mock-control.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { useExtraMocks, useGateways } from './helpers/stack.ts';
import { expectOpenAIError, sdkError } from './helpers/openai-error.ts';
import { streamedText } from './helpers/chat-stream.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();
const redis = useRedisServer();

// --- the suite's own upstream: node:http, counting what it received ------------------------------------------------

type Handler = (req: IncomingMessage, res: ServerResponse, n: number, body: Record<string, unknown>) => void;

interface Seen {
  at: number;
  aborted: boolean;
  headers: IncomingMessage['headers'];
  body: Record<string, unknown>;
}
interface Upstream {
  origin: string;
  seen: Seen[];
}

const servers: Server[] = [];
const sockets = new Set<Socket>();
afterEach(async () => {
  for (const s of sockets) s.destroy();
  sockets.clear();
  for (const s of servers.splice(0)) {
    s.closeAllConnections();
    await new Promise((done) => s.close(done));
  }
});

async function upstream(handler: Handler): Promise<Upstream> {
  const u: Upstream = { origin: '', seen: [] };
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      let body: Record<string, unknown> = {};
      try {
        body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as Record<string, unknown>;
      } catch {
        // not JSON: the test looks at the count only
      }
      const n = u.seen.length;
      const entry: Seen = { at: Date.now(), aborted: false, headers: req.headers, body };
      u.seen.push(entry);
      res.on('close', () => {
        if (!res.writableFinished) entry.aborted = true;
      });
      handler(req, res, n, body);
    });
  });
  server.on('connection', (s: Socket) => sockets.add(s));
  servers.push(server);
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  u.origin = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
  return u;
}

const KEY = 'sk-suite37-upstream-key-0123456789abcdef';

const completion = (content: string) =>
  JSON.stringify({
    id: 'chatcmpl-s37',
    object: 'chat.completion',
    created: 1_700_000_000,
    model: 'gpt-4o',
    choices: [{ index: 0, message: { role: 'assistant', content }, finish_reason: 'stop' }],
    usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 },
  });
const chunk = (delta: Record<string, unknown>, finish: string | null = null, extra: Record<string, unknown> = {}) =>
  JSON.stringify({ id: 'chatcmpl-s37', object: 'chat.completion.chunk', created: 1_700_000_000, model: 'gpt-4o', choices: [{ index: 0, delta, finish_reason: finish }], ...extra });
const events = (parts: string[]) => [
  `data: ${chunk({ role: 'assistant', content: '' })}\n\n`,
  ...parts.map((p) => `data: ${chunk({ content: p })}\n\n`),
  `data: ${chunk({}, 'stop')}\n\n`,
  'data: [DONE]\n\n',
];
const json = (res: ServerResponse, status: number, body: string, headers: Record<string, string> = {}) =>
  res.writeHead(status, { 'content-type': 'application/json', ...headers }).end(body);
const overloaded = JSON.stringify({ error: { message: 'The server is overloaded', type: 'server_error', param: null, code: null } });
const rateLimited = JSON.stringify({ error: { message: 'Rate limit reached for gpt-4o', type: 'tokens', param: null, code: 'rate_limit_exceeded' } });
const sseHead = (res: ServerResponse) => {
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  res.flushHeaders();
};
async function trickle(res: ServerResponse, pieces: Array<string | Buffer>, pauseMs = 2): Promise<void> {
  for (const p of pieces) {
    if (res.destroyed) return;
    res.write(p);
    await sleep(pauseMs);
  }
}

// HTTP-dates `secondsFromNow` away, in the three formats RFC 9110 5.6.7 has a recipient accept.
const DAYS = ['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat'];
const LONG_DAYS = ['Sunday', 'Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday'];
const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];
const two = (n: number) => String(n).padStart(2, '0');
const clock = (d: Date) => `${two(d.getUTCHours())}:${two(d.getUTCMinutes())}:${two(d.getUTCSeconds())}`;
// Rounded up to the next whole second, so "2 s from now" never reads as less than 2 s.
const at = (secondsFromNow: number) => new Date(Math.ceil((Date.now() + secondsFromNow * 1000) / 1000) * 1000);
const imfDate = (s: number) => at(s).toUTCString();
const rfc850Date = (s: number) => {
  const d = at(s);
  return `${LONG_DAYS[d.getUTCDay()]}, ${two(d.getUTCDate())}-${MONTHS[d.getUTCMonth()]}-${two(d.getUTCFullYear() % 100)} ${clock(d)} GMT`;
};
const asctimeDate = (s: number) => {
  const d = at(s);
  return `${DAYS[d.getUTCDay()]} ${MONTHS[d.getUTCMonth()]} ${String(d.getUTCDate()).padStart(2, ' ')} ${clock(d)} ${d.getUTCFullYear()}`;
};

// --- the gateway, from YAML ------------------------------------------------------------------------------------------

interface Gateway {
  url: string;
  client(sdkRetries?: number): OpenAI;
  logs: string[];
}

interface GatewayOptions {
  timeouts?: string;
  retry?: string;
  server?: string;
  extra?: string;
  budget?: string;
  breaker?: string;
  park?: string;
}

async function gatewayFor(origin: string, o: GatewayOptions = {}): Promise<Gateway> {
  const yaml = `
server:
  host: 127.0.0.1
  port: 0
  logLevel: info
${o.server ?? ''}
providers:
  fake:
    family: openai
    baseUrl: ${origin}/v1
    apiKey: ${KEY}
    breaker: ${o.breaker ?? 'false'}
    timeouts: ${o.timeouts ?? '{ connectMs: 2000 }'}
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: fake } ]
    retry: ${o.retry ?? '{ maxAttempts: 3, backoff: { baseMs: 20, capMs: 50 } }'}
    budget: ${o.budget ?? '{ ratio: 10, minRetriesPerSecond: 100 }'}
    park: ${o.park ?? 'false'}
${o.extra ?? ''}`;
  const logs: string[] = [];
  const url = await startGateway(parseConfig(yaml, 'suite37.yaml', {}), { logs });
  return {
    url,
    logs,
    client: (sdkRetries = 0) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused-by-the-gateway', maxRetries: sdkRetries, logLevel: 'off' }),
  };
}

const ask = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'hi' }] };
const askStream = { ...ask, stream: true as const };

async function post(url: string, body: string | Buffer, headers: Record<string, string> = {}, path = '/v1/chat/completions') {
  const res = await fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    // kept as text
  }
  return { status: res.status, headers: res.headers, body: parsed as Record<string, unknown>, text };
}

/** Seconds of a retry-after header, or NaN. */
const retryAfterS = (h: Headers | undefined) => Number(h?.get('retry-after') ?? Number.NaN);

// --- the mock, through its control endpoint --------------------------------------------------------------------------

const control = mockControl;
const mockStats = (m: MockServer) => control(m, 'GET', 'stats') as Promise<{ total: number; byStatus: Record<string, number> }>;

// =====================================================================================================================

describe('wait hints as servers and proxies write them', () => {
  it('a 503 whose retry-after is an HTTP-date already past is no hint: the jittered backoff retries at once, and it is answered', async () => {
    const u = await upstream((_req, res, n) => (n === 0 ? json(res, 503, overloaded, { 'retry-after': imfDate(-30) }) : json(res, 200, completion('after the past date'))));
    const g = await gatewayFor(u.origin);
    const started = Date.now();
    const { data, response } = await g.client().chat.completions.create(ask).withResponse();
    expect(data.choices[0]!.message.content).toBe('after the past date');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(Date.now() - started).toBeLessThan(900);
    expect(u.seen).toHaveLength(2);
    expect(u.seen[1]!.headers['x-retry-attempt']).toBe('1');
    expect(u.seen[1]!.headers['x-retry-reason']).toBe('status_503');
  });

  it('a lone 503 with a past HTTP-date on a route that does not retry: no retry-after of 0 reaches the client, and the SDK does not retry', async () => {
    const u = await upstream((_req, res) => json(res, 503, overloaded, { 'retry-after': imfDate(-5) }));
    const g = await gatewayFor(u.origin, { retry: '{ maxAttempts: 1 }' });
    const err = await sdkError(g.client(2).chat.completions.create(ask));
    expect(err.status).toBe(503);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    const ra = err.headers?.get('retry-after');
    expect(ra === null || ra === undefined || Number(ra) > 0).toBe(true);
    expect(err.headers?.get('retry-after-ms')).not.toBe('0');
    expect(u.seen).toHaveLength(1);
  });

  it("a 429 whose retry-after is an RFC 850 date (RFC 9110's obsolete format a recipient must still accept) is waited out", async () => {
    const u = await upstream((_req, res, n) => (n === 0 ? json(res, 429, rateLimited, { 'retry-after': rfc850Date(2) }) : json(res, 200, completion('after the rfc850 date'))));
    const g = await gatewayFor(u.origin);
    const started = Date.now();
    const { data } = await g.client().chat.completions.create(ask).withResponse();
    expect(data.choices[0]!.message.content).toBe('after the rfc850 date');
    expect(u.seen).toHaveLength(2);
    // The date names a whole second 2 to 3 s away; the wait is the time to it (x 1 to 1.2), not a 20-50 ms backoff.
    expect(u.seen[1]!.at - u.seen[0]!.at).toBeGreaterThanOrEqual(1_500);
    expect(Date.now() - started).toBeLessThan(6_000);
  });

  it('a 429 whose retry-after is an asctime date (the third HTTP-date format) is waited out the same way', async () => {
    const u = await upstream((_req, res, n) => (n === 0 ? json(res, 429, rateLimited, { 'retry-after': asctimeDate(2) }) : json(res, 200, completion('after the asctime date'))));
    const g = await gatewayFor(u.origin);
    const { data } = await g.client().chat.completions.create(ask).withResponse();
    expect(data.choices[0]!.message.content).toBe('after the asctime date');
    expect(u.seen).toHaveLength(2);
    expect(u.seen[1]!.at - u.seen[0]!.at).toBeGreaterThanOrEqual(1_500);
  });

  it('a retry-after of ten billion seconds: one upstream request, the client told at most a day, and the next request is held off unsent', async () => {
    const u = await upstream((_req, res) => json(res, 429, rateLimited, { 'retry-after': '9999999999' }));
    const g = await gatewayFor(u.origin);
    const started = Date.now();
    const err = await sdkError(g.client(2).chat.completions.create(ask));
    expect(Date.now() - started).toBeLessThan(2_000);
    expect(err.status).toBe(429);
    expect(retryAfterS(err.headers)).toBeGreaterThan(86_000);
    expect(retryAfterS(err.headers)).toBeLessThanOrEqual(86_400 + 1);
    expect(err.headers?.get('x-should-retry')).toBe('false'); // far past 60 s: not an invitation
    expect(u.seen).toHaveLength(1);

    const next = await sdkError(g.client(2).chat.completions.create(ask));
    expect(next.status).toBe(429);
    expectOpenAIError({ error: next.error }, 'provider_held_off', (next.error as { type: string }).type);
    expect(retryAfterS(next.headers)).toBeGreaterThan(86_000);
    expect(next.headers?.get('x-should-retry')).toBe('false');
    expect(u.seen).toHaveLength(1);
  });

  it("a retry-after that is no number nor date ('soon', '1e3', '-2', '0x10') is ignored: the backoff retries at once, no hold-off", async () => {
    const bad = ['soon', '1e3', '-2', '0x10'];
    const u = await upstream((_req, res, n) => (n % 2 === 0 ? json(res, 503, overloaded, { 'retry-after': bad[n / 2]! }) : json(res, 200, completion(`ok ${n}`))));
    const g = await gatewayFor(u.origin);
    const started = Date.now();
    for (let i = 0; i < bad.length; i++) {
      const { response } = await g.client().chat.completions.create(ask).withResponse();
      expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    }
    expect(Date.now() - started).toBeLessThan(3_000);
    expect(u.seen).toHaveLength(8);
  });

  it("x-ratelimit-reset-tokens '1h2m3s' with no tokens left: past maxWaitHintMs, one attempt, told ~3723 s; not a fleet hold-off", async () => {
    const u = await upstream((_req, res, n) =>
      n === 0
        ? json(res, 429, rateLimited, { 'x-ratelimit-remaining-tokens': '0', 'x-ratelimit-reset-tokens': '1h2m3s', 'x-ratelimit-remaining-requests': '99', 'x-ratelimit-reset-requests': '120ms' })
        : json(res, 200, completion('next one goes')),
    );
    const g = await gatewayFor(u.origin);
    const err = await sdkError(g.client().chat.completions.create(ask));
    expect(err.status).toBe(429);
    expect(retryAfterS(err.headers)).toBeGreaterThanOrEqual(3_723);
    expect(retryAfterS(err.headers)).toBeLessThan(3_723 * 1.25);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(u.seen).toHaveLength(1);
    // The reset is this request's hint only: the next request goes upstream.
    const { data } = await g.client().chat.completions.create(ask).withResponse();
    expect(data.choices[0]!.message.content).toBe('next one goes');
    expect(u.seen).toHaveLength(2);
  });

  it("x-ratelimit-reset-tokens written '0h0m1.2s' (hours and minutes of zero) is a 1.2 s wait, taken before the one retry", async () => {
    const u = await upstream((_req, res, n) =>
      n === 0 ? json(res, 429, rateLimited, { 'x-ratelimit-remaining-tokens': '0', 'x-ratelimit-reset-tokens': '0h0m1.2s' }) : json(res, 200, completion('after 1.2 s')),
    );
    const g = await gatewayFor(u.origin);
    const { data } = await g.client().chat.completions.create(ask).withResponse();
    expect(data.choices[0]!.message.content).toBe('after 1.2 s');
    expect(u.seen).toHaveLength(2);
    const gap = u.seen[1]!.at - u.seen[0]!.at;
    expect(gap).toBeGreaterThanOrEqual(1_150);
    expect(gap).toBeLessThan(4_000);
  });

  it("an x-ratelimit-reset-tokens that is no Go duration ('2', '1 minute', an epoch) is ignored: the backoff decides, quickly", async () => {
    const forms = ['2', '1 minute', String(Math.floor(Date.now() / 1000) + 60)];
    const u = await upstream((_req, res, n) =>
      n % 2 === 0 ? json(res, 429, rateLimited, { 'x-ratelimit-remaining-tokens': '0', 'x-ratelimit-reset-tokens': forms[n / 2]! }) : json(res, 200, completion(`ok ${n}`)),
    );
    const g = await gatewayFor(u.origin);
    const started = Date.now();
    for (let i = 0; i < forms.length; i++) {
      const { response } = await g.client().chat.completions.create(ask).withResponse();
      expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    }
    expect(Date.now() - started).toBeLessThan(3_000);
    expect(u.seen).toHaveLength(6);
  });
});

describe('whole answers that break', () => {
  it('a whole answer whose multi-byte characters are cut between TCP writes (and between chunked frames) arrives intact', async () => {
    const content = 'Grüße aus Zürich 日本語 🌩️⚡ '.repeat(50);
    const u = await upstream((_req, res) => {
      const body = Buffer.from(completion(content));
      res.writeHead(200, { 'content-type': 'application/json' });
      const pieces: Buffer[] = [];
      for (let i = 0; i < body.length; i += 7) pieces.push(body.subarray(i, i + 7));
      void trickle(res, pieces, 0).then(() => res.end());
    });
    const g = await gatewayFor(u.origin);
    const { data } = await g.client().chat.completions.create(ask).withResponse();
    expect(data.choices[0]!.message.content).toBe(content);
    expect(u.seen).toHaveLength(1);
  });

  it('headers and half the JSON, then silence: the attempt ends at responseMs, is retried, and the retry answers', async () => {
    const u = await upstream((_req, res, n) => {
      if (n > 0) return json(res, 200, completion('the retry answered'));
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write(completion('never finished').slice(0, 60));
    });
    const g = await gatewayFor(u.origin, { timeouts: '{ connectMs: 2000, responseMs: 800 }' });
    const started = Date.now();
    const { data, response } = await g.client().chat.completions.create(ask).withResponse();
    expect(data.choices[0]!.message.content).toBe('the retry answered');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(Date.now() - started).toBeGreaterThanOrEqual(700);
    expect(Date.now() - started).toBeLessThan(5_000);
    expect(u.seen).toHaveLength(2);
    expect(String(u.seen[1]!.headers['x-retry-reason'])).toMatch(/^timeout/);
    await sleep(100);
    expect(u.seen[0]!.aborted).toBe(true);
  });

  it('half a JSON body then a clean close, on every attempt: 502 upstream_bad_response after the route\'s attempts, the SDK sends nothing more', async () => {
    const u = await upstream((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' }); // no content-length: the close ends the body
      res.end(completion('cut').slice(0, 70));
    });
    const g = await gatewayFor(u.origin);
    const err = await sdkError(g.client(2).chat.completions.create(ask));
    expect(err.status).toBe(502);
    expectOpenAIError({ error: err.error }, 'upstream_bad_response', (err.error as { type: string }).type);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(u.seen).toHaveLength(3);
  });

  it("a 503 whose body breaks off mid-JSON is still that 503: its retry-after: 1 waited out, then answered", async () => {
    const u = await upstream((_req, res, n) => {
      if (n > 0) return json(res, 200, completion('after the broken 503'));
      res.writeHead(503, { 'content-type': 'application/json', 'retry-after': '1' });
      res.write(overloaded.slice(0, 30));
      setTimeout(() => res.socket?.destroy(), 20);
    });
    const g = await gatewayFor(u.origin);
    const { data, response } = await g.client().chat.completions.create(ask).withResponse();
    expect(data.choices[0]!.message.content).toBe('after the broken 503');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(u.seen).toHaveLength(2);
    expect(u.seen[1]!.at - u.seen[0]!.at).toBeGreaterThanOrEqual(950);
    expect(u.seen[1]!.headers['x-retry-reason']).toBe('status_503');
  });

  it('a server that streams SSE to a request that asked for a whole answer: no JSON object, retried, then 502 upstream_bad_response', async () => {
    const u = await upstream((_req, res) => {
      sseHead(res);
      void trickle(res, events(['not ', 'what ', 'was ', 'asked'])).then(() => res.end());
    });
    const g = await gatewayFor(u.origin);
    const err = await sdkError(g.client(2).chat.completions.create(ask));
    expect(err.status).toBe(502);
    expectOpenAIError({ error: err.error }, 'upstream_bad_response', (err.error as { type: string }).type);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(u.seen).toHaveLength(3);
  });

  it('an error object inside a 200 once, then a real answer: the client gets the answer, never the error as a completion', async () => {
    const u = await upstream((_req, res, n) =>
      n === 0 ? json(res, 200, JSON.stringify({ error: { message: 'model crashed', type: 'server_error', param: null, code: null } })) : json(res, 200, completion('second try')),
    );
    const g = await gatewayFor(u.origin);
    const { data, response } = await g.client().chat.completions.create(ask).withResponse();
    expect(data.choices[0]!.message.content).toBe('second try');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(u.seen).toHaveLength(2);
  });

  it("an error inside a 200 that quotes the gateway's key on every attempt: the client's 502 carries no trace of the key", async () => {
    const u = await upstream((req, res) =>
      json(res, 200, JSON.stringify({ error: { message: `bad request with header ${String(req.headers.authorization)}`, type: 'server_error', param: null, code: null } }), {
        'x-request-id': `req-${KEY}`,
      }),
    );
    const g = await gatewayFor(u.origin);
    const r = await post(g.url, JSON.stringify(ask));
    expect(r.status).toBe(502);
    expectOpenAIError(r.body, 'upstream_bad_response', (r.body.error as { type: string }).type);
    expect(r.text).not.toContain(KEY);
    expect(r.text).not.toContain(KEY.slice(0, 20));
    for (const [, v] of r.headers) expect(v).not.toContain(KEY);
    expect(u.seen).toHaveLength(3);
  });
});

describe('streams', () => {
  it("a stream whose text is followed by [DONE] with no finish_reason ever sent: the server's own end, passed on as it came, one request", async () => {
    const u = await upstream((_req, res) => {
      sseHead(res);
      const ev = events(['no ', 'finish']);
      void trickle(res, [...ev.slice(0, 3), ev[4]!]).then(() => res.end());
    });
    const g = await gatewayFor(u.origin);
    const { text, err } = await streamedText(await g.client().chat.completions.create(askStream));
    expect(err).toBeUndefined();
    expect(text).toBe('no finish');
    expect(u.seen).toHaveLength(1);
  });

  it("SSE `id:` and `retry:` fields, `event: message` lines and CRLF endings: the SDK's text whole, one upstream request", async () => {
    const u = await upstream((_req, res) => {
      sseHead(res);
      const wire = events(['alpha ', 'beta ', 'gamma']).map((e, i) => `id: ${i}\r\n${i === 0 ? 'retry: 3000\r\n' : ''}event: message\r\n${e.replace(/\n/g, '\r\n')}`);
      void trickle(res, wire).then(() => res.end());
    });
    const g = await gatewayFor(u.origin);
    const { text, err } = await streamedText(await g.client().chat.completions.create(askStream));
    expect(err).toBeUndefined();
    expect(text).toBe('alpha beta gamma');
    expect(u.seen).toHaveLength(1);
  });

  it('include_usage through a retried stream: the client asked, gets exactly one usage chunk (the answering attempt\'s), sent upstream as asked', async () => {
    const u = await upstream((_req, res, n) => {
      if (n === 0) return json(res, 503, overloaded);
      sseHead(res);
      const wire = [
        ...events(['counted ', 'once']).slice(0, -1),
        `data: ${JSON.stringify({ id: 'chatcmpl-s37', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [], usage: { prompt_tokens: 7, completion_tokens: 2, total_tokens: 9 } })}\n\n`,
        'data: [DONE]\n\n',
      ];
      void trickle(res, wire).then(() => res.end());
    });
    const g = await gatewayFor(u.origin);
    const stream = await g.client().chat.completions.create({ ...askStream, stream_options: { include_usage: true } });
    const usages: unknown[] = [];
    let text = '';
    for await (const c of stream) {
      if (c.usage) usages.push(c.usage);
      text += c.choices[0]?.delta?.content ?? '';
    }
    expect(text).toBe('counted once');
    expect(usages).toEqual([{ prompt_tokens: 7, completion_tokens: 2, total_tokens: 9 }]);
    expect(u.seen).toHaveLength(2);
    for (const s of u.seen) expect(s.body.stream_options).toMatchObject({ include_usage: true });
  });

  it('two parallel tool calls whose arguments arrive one character per TCP write, interleaved: both calls whole and parseable', async () => {
    const argsA = JSON.stringify({ city: 'Zürich', days: 3 });
    const argsB = JSON.stringify({ query: 'weather "today"', lang: 'de' });
    const u = await upstream((_req, res) => {
      sseHead(res);
      const tc = (index: number, fn: Record<string, unknown>, id?: string) =>
        `data: ${chunk({ tool_calls: [{ index, ...(id ? { id, type: 'function' } : {}), function: fn }] })}\n\n`;
      const wire: string[] = [`data: ${chunk({ role: 'assistant', content: null })}\n\n`, tc(0, { name: 'get_weather', arguments: '' }, 'call_a'), tc(1, { name: 'search', arguments: '' }, 'call_b')];
      for (let i = 0; i < Math.max(argsA.length, argsB.length); i++) {
        if (i < argsA.length) wire.push(tc(0, { arguments: argsA[i] }));
        if (i < argsB.length) wire.push(tc(1, { arguments: argsB[i] }));
      }
      wire.push(`data: ${chunk({}, 'tool_calls')}\n\n`, 'data: [DONE]\n\n');
      // Every event split in two TCP writes, the cut inside its JSON.
      void trickle(res, wire.flatMap((e) => [e.slice(0, 25), e.slice(25)]), 1).then(() => res.end());
    });
    const g = await gatewayFor(u.origin);
    const final = await g.client().chat.completions.stream({ ...askStream, tools: [{ type: 'function', function: { name: 'get_weather', parameters: {} } }, { type: 'function', function: { name: 'search', parameters: {} } }] }).finalChatCompletion();
    const calls = final.choices[0]!.message.tool_calls!;
    expect(calls.map((c) => c.id)).toEqual(['call_a', 'call_b']);
    expect(calls.map((c) => (c.type === 'function' ? JSON.parse(c.function.arguments) : null))).toEqual([JSON.parse(argsA), JSON.parse(argsB)]);
    expect(final.choices[0]!.finish_reason).toBe('tool_calls');
    expect(u.seen).toHaveLength(1);
  });

  it('a 200 stream that sends its headers and then no event at all: firstTokenMs ends it, the retry streams, the first upstream request is ended', async () => {
    const u = await upstream((_req, res, n) => {
      sseHead(res);
      if (n === 0) return; // headers, then nothing
      void trickle(res, events(['second ', 'attempt'])).then(() => res.end());
    });
    const g = await gatewayFor(u.origin, { timeouts: '{ connectMs: 2000, firstTokenMs: 700, idleMs: 10000 }' });
    const { data: stream, response } = await g.client().chat.completions.create(askStream).withResponse();
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    const { text, err } = await streamedText(stream);
    expect(err).toBeUndefined();
    expect(text).toBe('second attempt');
    expect(u.seen).toHaveLength(2);
    expect(u.seen[1]!.headers['x-retry-reason']).toBe('timeout_first_token');
    await sleep(100);
    expect(u.seen[0]!.aborted).toBe(true);
  });

  it('a stream that ends after some text with neither a finish_reason nor [DONE]: the SDK raises, never a clean end that looks whole', async () => {
    const u = await upstream((_req, res) => {
      sseHead(res);
      void trickle(res, events(['half ', 'an ', 'answer']).slice(0, 3), 10).then(() => res.end());
    });
    const g = await gatewayFor(u.origin);
    const { text, err } = await streamedText(await g.client(2).chat.completions.create(askStream));
    expect(text).toBe('half an ');
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('stream_interrupted');
    await sleep(100);
    expect(u.seen).toHaveLength(1); // after the first output: no retry, and the SDK did not send it again
  });
});

describe('clients that leave, or cannot wait', () => {
  it('a streaming client that aborts during a 2 s retry-after wait: the wait is cancelled and no retry is ever sent', async () => {
    const u = await upstream((_req, res) => json(res, 503, overloaded, { 'retry-after': '2' }));
    const g = await gatewayFor(u.origin);
    const ac = new AbortController();
    const call = g.client().chat.completions.create(askStream, { signal: ac.signal });
    await sleep(400);
    expect(u.seen).toHaveLength(1);
    ac.abort();
    const err = await call.then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.APIUserAbortError);
    await sleep(3_000);
    expect(u.seen).toHaveLength(1);
  }, 15_000);

  it("a client whose deadline (x-stormgate-timeout-ms 1500) is shorter than the 503's 3 s hint: answered at once with the hint, one upstream request", async () => {
    const u = await upstream((_req, res) => json(res, 503, overloaded, { 'retry-after': '3' }));
    const g = await gatewayFor(u.origin);
    const started = Date.now();
    const r = await post(g.url, JSON.stringify(ask), { 'x-stormgate-timeout-ms': '1500' });
    expect(Date.now() - started).toBeLessThan(1_000);
    expect(r.status).toBe(503);
    expect(Object.keys(r.body.error as object).sort()).toEqual(['code', 'message', 'param', 'type']);
    expect(r.headers.get('x-should-retry')).toBe('true'); // one upstream request, a hint it would not wait: invited back after it
    expect(retryAfterS(r.headers)).toBeGreaterThanOrEqual(3);
    expect(retryAfterS(r.headers)).toBeLessThanOrEqual(5);
    expect(r.headers.get('x-stormgate-request-id')).toMatch(/\S/);
    await sleep(500);
    expect(u.seen).toHaveLength(1);
  });

  it('200 concurrent SDK calls during a 503 brownout (mock, default budget): every call a 503 the SDK does not repeat, upstream attempts bounded', async () => {
    const mock = await startMock({ quiet: true });
    await control(mock, 'POST', 'brownout', { mode: '503', durationMs: 60_000 });
    const g = await gatewayFor(mock.url, {
      retry: '{ maxAttempts: 3, backoff: { baseMs: 50, capMs: 200 } }',
      budget: '{ ratio: 0.1, windowS: 10, minRetriesPerSecond: 1 }',
    });
    const client = g.client(2);
    const results = await Promise.all(
      Array.from({ length: 200 }, (_, i) =>
        client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: `storm ${i}` }] }, { timeout: 20_000 }).then(
          () => 'ok',
          (e: unknown) => e,
        ),
      ),
    );
    for (const e of results) {
      expect(e).toBeInstanceOf(OpenAI.APIError);
      const err = e as InstanceType<typeof OpenAI.APIError>;
      expect(err.status).toBe(503);
      expect(err.headers?.get('x-should-retry')).toBe('false');
      expect(Object.keys(err.error as object).sort()).toEqual(['code', 'message', 'param', 'type']);
    }
    // 200 first attempts, and retries only as the budget allows (10% of requests, or its floor of 10 per window):
    // not the 600 of 3 attempts each, nor 1,800 with the SDK's retries on top.
    const total = (await mockStats(mock)).total;
    expect(total).toBeGreaterThanOrEqual(200);
    expect(total).toBeLessThanOrEqual(200 + 30);
  }, 40_000);
});

describe('the HTTP surface', () => {
  it('a body of exactly bodyLimitBytes goes upstream; one byte more is 413 request_too_large, nothing sent, the SDK does not retry', async () => {
    const u = await upstream((_req, res) => json(res, 200, completion('fits')));
    const limit = 4096;
    const g = await gatewayFor(u.origin, { server: `  bodyLimitBytes: ${limit}` });
    const base = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: '' }] });
    const exact = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x'.repeat(limit - base.length) }] });
    expect(Buffer.byteLength(exact)).toBe(limit);
    const ok = await post(g.url, exact);
    expect(ok.status).toBe(200);
    expect(u.seen).toHaveLength(1);

    const over = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'x'.repeat(limit - base.length + 1) }] };
    const err = await sdkError(g.client(2).chat.completions.create(over));
    expect(err.status).toBe(413);
    expectOpenAIError({ error: err.error }, 'request_too_large');
    expect((err.error as { message: string }).message).toContain(String(limit));
    expect(u.seen).toHaveLength(1);
  });

  it("a content-type in capitals with parameters ('Application/JSON; Charset=UTF-8') is JSON: answered, not 415", async () => {
    const u = await upstream((_req, res) => json(res, 200, completion('capitals are fine')));
    const g = await gatewayFor(u.origin);
    const r = await post(g.url, JSON.stringify(ask), { 'content-type': 'Application/JSON; Charset=UTF-8' });
    expect(r.status).toBe(200);
    expect((r.body.choices as Array<{ message: { content: string } }>)[0]!.message.content).toBe('capitals are fine');
    expect(u.seen).toHaveLength(1);
  });

  it('JSON sent as text/plain (a curl habit) is 415 unsupported_media_type in the OpenAI shape, nothing sent upstream', async () => {
    const u = await upstream((_req, res) => json(res, 200, completion('never')));
    const g = await gatewayFor(u.origin);
    const r = await post(g.url, JSON.stringify(ask), { 'content-type': 'text/plain' });
    expect(r.status).toBe(415);
    expectOpenAIError(r.body, 'unsupported_media_type');
    expect(r.headers.get('x-should-retry')).toBe('false');
    const truncated = await post(g.url, '{"model": "gpt-4o", "messages": [');
    expect(truncated.status).toBe(400);
    expectOpenAIError(truncated.body, 'invalid_json');
    expect(u.seen).toHaveLength(0);
  });

  it('an unknown path through the SDK is 404 unknown_url in the OpenAI shape, its request id the one the SDK reports', async () => {
    const u = await upstream((_req, res) => json(res, 200, completion('never')));
    const g = await gatewayFor(u.origin);
    const err = await sdkError(g.client(2).post('/assistants/nope', { body: { model: 'gpt-4o' } }));
    expect(err.status).toBe(404);
    expectOpenAIError({ error: err.error }, 'unknown_url');
    expect(err.requestID).toBeTruthy();
    expect(err.headers?.get('x-stormgate-request-id')).toBe(err.requestID);
    expect(u.seen).toHaveLength(0);
  });

  it('the models list through the SDK names the routed models; retrieving one nobody serves is 404 model_not_found', async () => {
    const mock = await startMock({ quiet: true });
    const g = await gatewayFor(mock.url, { extra: '' });
    const client = g.client();
    const ids: string[] = [];
    for await (const m of client.models.list()) ids.push(m.id);
    expect(ids.length).toBeGreaterThan(0);
    expect(ids).toContain('gpt-4o');
    const err = await sdkError(client.models.retrieve('no-such-model-s37'));
    expect(err.status).toBe(404);
    expectOpenAIError({ error: err.error }, 'model_not_found');
    const body = JSON.stringify(await client.models.list().then((p) => p.data));
    expect(body).not.toContain(KEY);
  });

  it('a HEAD or an OPTIONS on the chat path is 405 with allow: POST, and nothing goes upstream', async () => {
    const u = await upstream((_req, res) => json(res, 200, completion('never')));
    const g = await gatewayFor(u.origin);
    for (const method of ['HEAD', 'OPTIONS']) {
      const res = await fetch(`${g.url}/v1/chat/completions`, { method, headers: { origin: 'http://localhost:3000', 'access-control-request-method': 'POST' } });
      const text = await res.text();
      expect(res.status).toBe(405);
      expect(res.headers.get('allow')).toBe('POST');
      if (method === 'OPTIONS') expectOpenAIError(JSON.parse(text), 'method_not_allowed');
      else expect(text).toBe('');
    }
    expect(u.seen).toHaveLength(0);
  });
});

describe('a fleet on one redis-server', () => {
  it("a 429's retry-after given as an HTTP-date on instance A holds instance B off too: B's caller is told, nothing sent, then served after it", async () => {
    const u = await upstream((_req, res, n) => (n === 0 ? json(res, 429, rateLimited, { 'retry-after': imfDate(3) }) : json(res, 200, completion(`served ${n}`))));
    const state = `state:\n  redis: ${redis().url}\n  keyPrefix: "suite37-fleet-${Date.now()}:"\n`;
    const a = await gatewayFor(u.origin, { retry: '{ maxAttempts: 1 }', extra: state });
    const b = await gatewayFor(u.origin, { retry: '{ maxAttempts: 1 }', extra: state });
    const first = await sdkError(a.client().chat.completions.create(ask));
    expect(first.status).toBe(429);
    expect(u.seen).toHaveLength(1);

    const started = Date.now();
    const held = await sdkError(b.client().chat.completions.create(ask));
    expect(Date.now() - started).toBeLessThan(1_000);
    expect(held.status).toBe(429);
    expectOpenAIError({ error: held.error }, 'provider_held_off', (held.error as { type: string }).type);
    expect(held.headers?.get('x-should-retry')).toBe('true');
    expect(retryAfterS(held.headers)).toBeGreaterThanOrEqual(1);
    expect(retryAfterS(held.headers)).toBeLessThanOrEqual(5);
    expect(u.seen).toHaveLength(1);

    // The SDK on B, retries on, waits the hold-off out as told and is served by the one request it then sends.
    const { data } = await b.client(2).chat.completions.create(ask).withResponse();
    expect(data.choices[0]!.message.content).toBe('served 1');
    expect(u.seen).toHaveLength(2);
    expect(u.seen[1]!.at - u.seen[0]!.at).toBeGreaterThanOrEqual(1_900);
  }, 20_000);
});
