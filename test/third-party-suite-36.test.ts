// Third-party failure-scenario suite 36: an outside QA team's suite for LLM gateways, which brings ITS OWN fake
// upstream instead of the gateway's bundled mock: a hand-rolled node:http server (and, where node:http would not send
// what real servers send, a raw node:net one) that imitates what other projects' fakes and real providers' edge cases
// put on the wire. Written from the README ("Retries" with its wait hints, "Deadlines and timeouts", "Streaming",
// "What the client sees", "Errors", "Failover and API families" for Anthropic), driven with the official `openai` 6.x
// SDK and `@anthropic-ai/sdk` over real HTTP on 127.0.0.1, the gateway configured with the README's YAML.
//  1. SSE framing variants: bare CR line endings, one byte per TCP write (multi-byte characters cut), many events in
//     one write with `event:` lines, `data:` without its space and `:` comments, a last event without its blank line
//     and no [DONE], a ping flood before the first token (the first-token timeout still fires), a cut mid-event.
//  2. Whole answers: minimal JSON, JSON sent as text/plain or with no content-type, a content-length too long or too
//     short, chunked framing broken after the JSON, a 200 with an error object, a load balancer's HTML 502, 429s with
//     retry-after 0 / 1.5 / -1 / 120 and retry-after-ms, a 503 with connection: close, idle keep-alive sockets closed
//     (silently, or reset as the next request comes), headers then nothing (responseMs, the client's deadline),
//     1xx informational answers before the final one, a very large answer.
//  3. Anthropic's own API: `event: ping` before message_start, an overloaded_error event before and after the first
//     output, a 529 with retry-after.
// What is asserted is what the README promises the client: statuses, the OpenAI error shape, x-should-retry and
// retry-after, what the SDK raises (never a clean end that looks complete), and how many requests the fake upstream
// counted (no ghost requests, no retry storms, the SDK's own retries not multiplying the gateway's).
// Found here:
// - A whole completion labelled `text/plain` (or `application/octet-stream`) was refused for its label alone: a failed
//   attempt, retried (the provider ran and billed each one), then `502 upstream_bad_response`, though the README judges
//   a 2xx by its bytes (a JSON object with the API's result field is the answer). The label now names only what a body
//   that is no object is; the answer goes on as `application/json`, which the SDK parses.
// - An unsolicited `100 Continue` before the 200 (RFC 9110 15.2: a client skips a 1xx it did not expect) makes undici
//   destroy the connection with SocketError('bad response'): the client was told the provider "could not be reached"
//   (`upstream_unavailable`) though it ran the request on each attempt. Now the `upstream_bad_response` a garbled answer
//   gets (`bad_stream`); undici still cannot read such a provider (README, Streaming).
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createNetServer, type Server as NetServer, type Socket } from 'node:net';
import { once } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import { useGateways } from './helpers/stack.ts';
import { expectOpenAIError, sdkError } from './helpers/openai-error.ts';
import { streamedText } from './helpers/chat-stream.ts';

const startGateway = useGateways();

// --- the fake upstream: the test's own, counting what it was sent ------------------------------------------------

type Handler = (req: IncomingMessage, res: ServerResponse, n: number) => void;

interface Upstream {
  origin: string;
  /** Requests received, in order, with when they came and whether the gateway dropped them before the answer ended. */
  seen: Array<{ path: string; at: number; aborted: boolean; headers: IncomingMessage['headers'] }>;
  /** TCP connections the gateway opened. */
  connections: number;
}

const servers: Array<Server | NetServer> = [];
const openSockets = new Set<Socket>();
afterEach(async () => {
  for (const s of openSockets) s.destroy();
  openSockets.clear();
  for (const s of servers.splice(0)) {
    if ('closeAllConnections' in s) s.closeAllConnections();
    await new Promise((resolve) => s.close(resolve));
  }
});

/** A node:http server answering every request with `handler` (its body read first; n counts from 0). */
async function upstream(handler: Handler): Promise<Upstream> {
  const u: Upstream = { origin: '', seen: [], connections: 0 };
  const server = createServer((req, res) => {
    const n = u.seen.length;
    const entry = { path: req.url ?? '', at: Date.now(), aborted: false, headers: req.headers };
    u.seen.push(entry);
    res.on('close', () => {
      if (!res.writableFinished) entry.aborted = true;
    });
    req.resume();
    req.on('end', () => handler(req, res, n));
  });
  server.on('connection', (s: Socket) => {
    u.connections++;
    openSockets.add(s);
  });
  servers.push(server);
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  u.origin = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
  return u;
}

/**
 * A raw HTTP/1.1 server on node:net, for what node:http will not do: keep-alive without a `Keep-Alive: timeout` hint,
 * closing idle sockets silently, resetting one as a request arrives. `onRequest` returns the bytes to answer with, or
 * 'reset' to reset the connection without answering.
 */
async function rawUpstream(onRequest: (n: number, idleMs: number) => string | 'reset', idleCloseMs?: number): Promise<Upstream> {
  const u: Upstream = { origin: '', seen: [], connections: 0 };
  const server = createNetServer((socket) => {
    u.connections++;
    openSockets.add(socket);
    let buf = Buffer.alloc(0);
    let lastAnswer = Date.now();
    let idle: NodeJS.Timeout | undefined;
    socket.on('error', () => {});
    socket.on('data', (chunk) => {
      clearTimeout(idle);
      buf = Buffer.concat([buf, chunk]);
      for (;;) {
        const head = buf.indexOf('\r\n\r\n');
        if (head < 0) return;
        const headers = buf.subarray(0, head).toString('latin1');
        const length = Number(/content-length:\s*(\d+)/i.exec(headers)?.[1] ?? 0);
        if (buf.length < head + 4 + length) return;
        buf = buf.subarray(head + 4 + length);
        const n = u.seen.length;
        u.seen.push({ path: headers.split(' ')[1] ?? '', at: Date.now(), aborted: false, headers: {} });
        const answer = onRequest(n, Date.now() - lastAnswer);
        if (answer === 'reset') return void socket.resetAndDestroy();
        socket.write(answer);
        lastAnswer = Date.now();
        if (idleCloseMs !== undefined) idle = setTimeout(() => socket.end(), idleCloseMs);
      }
    });
  });
  servers.push(server);
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  u.origin = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
  return u;
}

// --- what real servers send ---------------------------------------------------------------------------------------

const completion = (content: string, extra: Record<string, unknown> = {}) =>
  JSON.stringify({
    id: 'chatcmpl-s36',
    object: 'chat.completion',
    created: 1_700_000_000,
    model: 'gpt-4o',
    choices: [{ index: 0, message: { role: 'assistant', content }, finish_reason: 'stop' }],
    usage: { prompt_tokens: 3, completion_tokens: 5, total_tokens: 8 },
    ...extra,
  });

const chunk = (delta: Record<string, unknown>, finish: string | null = null) =>
  JSON.stringify({ id: 'chatcmpl-s36', object: 'chat.completion.chunk', created: 1_700_000_000, model: 'gpt-4o', choices: [{ index: 0, delta, finish_reason: finish }] });

/** A chat stream's events as an OpenAI-compatible server writes them (LF, `data: `, [DONE]). */
const chatEvents = (parts: string[]): string[] => [
  `data: ${chunk({ role: 'assistant', content: '' })}\n\n`,
  ...parts.map((p) => `data: ${chunk({ content: p })}\n\n`),
  `data: ${chunk({}, 'stop')}\n\n`,
  'data: [DONE]\n\n',
];

const json = (res: ServerResponse, status: number, body: string, headers: Record<string, string> = {}) =>
  res.writeHead(status, { 'content-type': 'application/json', ...headers }).end(body);

const sseHead = (res: ServerResponse) => {
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  res.flushHeaders();
};

/** Writes `pieces` one at a time, each its own TCP write (a short pause between, so each is its own read). */
async function trickle(res: ServerResponse, pieces: Array<string | Buffer>, pauseMs = 2): Promise<void> {
  for (const p of pieces) {
    if (res.destroyed) return;
    res.write(p);
    await sleep(pauseMs);
  }
}

const busy = JSON.stringify({ error: { message: 'The server is overloaded', type: 'server_error', param: null, code: null } });
const rateLimited = JSON.stringify({ error: { message: 'Rate limit reached for gpt-4o', type: 'requests', param: null, code: 'rate_limit_exceeded' } });

// --- the gateway, from the README's YAML --------------------------------------------------------------------------

interface Gateway {
  url: string;
  /** An openai client with its own retries off, unless `sdkRetries` is given. */
  openai(sdkRetries?: number): OpenAI;
  anthropic(sdkRetries?: number): Anthropic;
  logs: string[];
}

interface GatewayOptions {
  timeouts?: string;
  retry?: string;
  anthropicRetry?: string;
}

/** One OpenAI-compatible provider (and an Anthropic one) at `origin`, chat and /v1/messages routed to them. */
async function gatewayFor(origin: string, o: GatewayOptions = {}): Promise<Gateway> {
  const yaml = `
server:
  host: 127.0.0.1
  port: 0
  logLevel: info
providers:
  fake:
    family: openai
    baseUrl: ${origin}/v1
    apiKey: sk-fake-upstream-0123456789
    breaker: false
    timeouts: ${o.timeouts ?? '{ connectMs: 2000 }'}
  claude:
    family: anthropic
    baseUrl: ${origin}
    apiKey: sk-ant-fake-0123456789
    breaker: false
    timeouts: ${o.timeouts ?? '{ connectMs: 2000 }'}
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: fake } ]
    retry: ${o.retry ?? '{ maxAttempts: 3, backoff: { baseMs: 20, capMs: 50 } }'}
    budget: { ratio: 10, minRetriesPerSecond: 100 }
    park: false
  - name: messages
    match: { path: /v1/messages }
    targets: [ { provider: claude } ]
    retry: ${o.anthropicRetry ?? o.retry ?? '{ maxAttempts: 3, backoff: { baseMs: 20, capMs: 50 } }'}
    budget: { ratio: 10, minRetriesPerSecond: 100 }
    park: false
`;
  const config = parseConfig(yaml, 'suite36.yaml', {});
  const logs: string[] = [];
  const url = await startGateway(config, { logs });
  return {
    url,
    logs,
    openai: (sdkRetries = 0) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused-by-the-gateway', maxRetries: sdkRetries, logLevel: 'off' }),
    anthropic: (sdkRetries = 0) => new Anthropic({ baseURL: url, apiKey: 'unused-by-the-gateway', maxRetries: sdkRetries, logLevel: 'off' }),
  };
}

const ask = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'hi' }] };
const askStream = { ...ask, stream: true as const };

/** A chat completion sent with fetch: status, headers and parsed body. */
async function post(g: Gateway, headers: Record<string, string> = {}, body: unknown = ask) {
  const res = await fetch(`${g.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = text;
  }
  return { status: res.status, headers: res.headers, body: parsed as Record<string, unknown>, text };
}

// ===================================================================================================================

describe('SSE framing the way other servers write it', () => {
  it('bare CR line endings (allowed by the SSE spec) reach the SDK as the same text, one upstream request', async () => {
    const u = await upstream((_req, res) => {
      sseHead(res);
      void trickle(res, chatEvents(['Storm ', 'gate ', 'über ', '🌩️']).map((e) => e.replace(/\n/g, '\r'))).then(() => res.end());
    });
    const g = await gatewayFor(u.origin);
    const { text, err } = await streamedText(await g.openai().chat.completions.create(askStream));
    expect(err).toBeUndefined();
    expect(text).toBe('Storm gate über 🌩️');
    expect(u.seen).toHaveLength(1);
  });

  it('one byte per TCP write, multi-byte characters cut between writes, \\r\\n cut between \\r and \\n: the text arrives whole', async () => {
    const u = await upstream((_req, res) => {
      sseHead(res);
      const wire = Buffer.from(chatEvents(['héllo ', 'wörld ', '日本語 ', '🌩️⚡']).join('').replace(/\n/g, '\r\n'));
      const bytes = [...wire].map((b) => Buffer.from([b]));
      void (async () => {
        for (let i = 0; i < bytes.length; i++) {
          if (res.destroyed) return;
          res.write(bytes[i]!);
          if (i % 8 === 0) await sleep(1);
        }
        res.end();
      })();
    });
    const g = await gatewayFor(u.origin);
    const stream = g.openai().chat.completions.stream(askStream);
    const final = await stream.finalChatCompletion();
    expect(final.choices[0]!.message.content).toBe('héllo wörld 日本語 🌩️⚡');
    expect(final.choices[0]!.message.content).not.toContain('\uFFFD');
    expect(final.choices[0]!.finish_reason).toBe('stop');
    expect(u.seen).toHaveLength(1);
  });

  it('every event in one write, with `event:` lines, `data:` without its space and `:` comment pings between: passed on, none dropped', async () => {
    const u = await upstream((_req, res) => {
      sseHead(res);
      const wire =
        ': ping\n\n' +
        `event: completion\ndata:${chunk({ role: 'assistant', content: '' })}\n\n` +
        `: keep-alive\n\nevent: completion\ndata:${chunk({ content: 'one ' })}\n\n` +
        `data:${chunk({ content: 'two ' })}\n\n: OPENROUTER PROCESSING\n\n` +
        `event: completion\ndata: ${chunk({ content: 'three' })}\n\n` +
        `data:${chunk({}, 'stop')}\n\ndata:[DONE]\n\n`;
      res.end(wire);
    });
    const g = await gatewayFor(u.origin);
    const final = await g.openai().chat.completions.stream(askStream).finalChatCompletion();
    expect(final.choices[0]!.message.content).toBe('one two three');
    expect(final.choices[0]!.finish_reason).toBe('stop');
    expect(u.seen).toHaveLength(1);
    const line = g.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.route === 'chat');
    expect(line?.droppedMalformed).toBeUndefined();
  });

  it('a finish event without its closing blank line and no [DONE], the connection closed: the SDK ends cleanly with the whole text', async () => {
    const u = await upstream((_req, res) => {
      sseHead(res);
      const events = chatEvents(['all ', 'of ', 'it']).slice(0, -1); // no [DONE]
      events[events.length - 1] = events.at(-1)!.replace(/\n\n$/, '\n');
      void trickle(res, events).then(() => res.end());
    });
    const g = await gatewayFor(u.origin);
    const final = await g.openai().chat.completions.stream(askStream).finalChatCompletion();
    expect(final.choices[0]!.message.content).toBe('all of it');
    expect(final.choices[0]!.finish_reason).toBe('stop');
    // On the wire: the finish chunk, then the [DONE] the gateway added.
    const raw = await fetch(`${g.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(askStream) }).then((r) => r.text());
    expect(raw).toContain('"finish_reason":"stop"');
    expect(raw.trimEnd().endsWith('data: [DONE]')).toBe(true);
    expect(u.seen).toHaveLength(2);
  });

  it('a ping flood before the first token (comments and bare data: heartbeats every 40 ms): firstTokenMs still fires, attempts bounded', async () => {
    const u = await upstream((_req, res) => {
      sseHead(res);
      res.write(`data: ${chunk({ role: 'assistant', content: '' })}\n\n`);
      const t = setInterval(() => {
        if (res.destroyed) return clearInterval(t);
        res.write(': ping\n\ndata:\n\n');
      }, 40);
      res.on('close', () => clearInterval(t));
    });
    const g = await gatewayFor(u.origin, { timeouts: '{ connectMs: 2000, firstTokenMs: 600, idleMs: 30000 }', retry: '{ maxAttempts: 2, backoff: { baseMs: 20, capMs: 50 } }' });
    const started = Date.now();
    const err = await sdkError(g.openai(2).chat.completions.create(askStream));
    const took = Date.now() - started;
    expect(err.status).toBe(504);
    expectOpenAIError(err.error ? { error: err.error } : {}, 'upstream_timeout', (err.error as { type: string }).type);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    // Two attempts of 600 ms each, not the 30 s idle limit the pings keep resetting; the SDK did not send it again.
    expect(took).toBeGreaterThanOrEqual(1_100);
    expect(took).toBeLessThan(6_000);
    expect(u.seen).toHaveLength(2);
    await sleep(100);
    expect(u.seen.every((s) => s.aborted)).toBe(true);
  });

  it('cut in the middle of an event after the first output: the SDK raises stream_interrupted, nothing sent upstream again', async () => {
    const u = await upstream((_req, res) => {
      sseHead(res);
      const full = chatEvents(['first ', 'second ']);
      void trickle(res, [...full.slice(0, 3), full[3]!.slice(0, 40)], 20).then(() => res.socket?.destroy());
    });
    const g = await gatewayFor(u.origin);
    const { text, err } = await streamedText(await g.openai(2).chat.completions.create(askStream));
    expect(text).toBe('first second ');
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('stream_interrupted');
    await sleep(100);
    expect(u.seen).toHaveLength(1);
  });
});

describe('whole answers the way other servers write them', () => {
  it('a minimal completion (no id, no usage, no created) is handed over as it came', async () => {
    const u = await upstream((_req, res) => json(res, 200, JSON.stringify({ choices: [{ index: 0, message: { role: 'assistant', content: 'bare' }, finish_reason: 'stop' }] })));
    const g = await gatewayFor(u.origin);
    const { data, response } = await g.openai().chat.completions.create(ask).withResponse();
    expect(data.choices[0]!.message.content).toBe('bare');
    expect(data.usage).toBeUndefined();
    expect(response.headers.get('x-stormgate-attempts')).toBe('1');
    expect(u.seen).toHaveLength(1);
  });

  it.each([
    ['text/plain', { 'content-type': 'text/plain; charset=utf-8' }],
    ['no content-type at all', {}],
  ])('a completion sent as %s: the SDK gets the completion object, not a string', async (_name, headers) => {
    const u = await upstream((_req, res) => {
      res.writeHead(200, headers as Record<string, string>);
      res.end(completion('labelled wrong'));
    });
    const g = await gatewayFor(u.origin);
    const data = await g.openai().chat.completions.create(ask);
    expect(typeof data).toBe('object');
    expect(data.choices?.[0]?.message.content).toBe('labelled wrong');
    expect(u.seen).toHaveLength(1);
  });

  it('a content-length longer than the body (then closed), or shorter (a proxy that truncated it): a cut answer, retried, never passed on', async () => {
    const u = await upstream((_req, res, n) => {
      const body = completion(n % 2 === 0 ? 'cut on the wire' : `whole ${n}`);
      if (n % 2 === 1) return json(res, 200, body);
      const length = n === 0 ? body.length + 40 : body.length - 30;
      res.socket!.end(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${length}\r\n\r\n${body}`);
    });
    const g = await gatewayFor(u.origin);
    for (const expected of ['whole 1', 'whole 3']) {
      const { data, response } = await g.openai().chat.completions.create(ask).withResponse();
      expect(data.choices[0]!.message.content).toBe(expected);
      expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    }
    expect(u.seen).toHaveLength(4);
  });

  it('chunked framing broken after a whole JSON body (no last chunk, garbage instead): retried, then 502 upstream_bad_response', async () => {
    const u = await upstream((_req, res) => {
      const body = completion('looks whole');
      res.socket!.end(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n${body.length.toString(16)}\r\n${body}\r\nzz\r\n`);
    });
    const g = await gatewayFor(u.origin);
    const err = await sdkError(g.openai(2).chat.completions.create(ask));
    expect(err.status).toBe(502);
    expect((err.error as { code: string }).code).toBe('upstream_bad_response');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(u.seen).toHaveLength(3); // the route's 3 attempts; the SDK's 2 retries sent nothing
  });

  it('a 200 whose body is an error object: never a success, retried, 502 upstream_bad_response; SDK retries do not multiply it', async () => {
    const u = await upstream((_req, res) => json(res, 200, JSON.stringify({ error: { message: 'upstream model crashed', type: 'server_error', code: 'internal' } })));
    const g = await gatewayFor(u.origin);
    const err = await sdkError(g.openai(2).chat.completions.create(ask));
    expect(err.status).toBe(502);
    expect((err.error as { code: string }).code).toBe('upstream_bad_response');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(u.seen).toHaveLength(3);
  });

  it("a load balancer's HTML 502 page: retried, then the client's 502 in the OpenAI shape (the page wrapped), no SDK retries on top", async () => {
    const html = '<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway</h1></center><hr><center>nginx</center></body></html>';
    const u = await upstream((_req, res) => res.writeHead(502, { 'content-type': 'text/html' }).end(html));
    const g = await gatewayFor(u.origin);
    const r = await post(g);
    expect(r.status).toBe(502);
    expect(r.headers.get('content-type')).toMatch(/application\/json/);
    const e = r.body.error as Record<string, unknown>;
    expect(Object.keys(e).sort()).toEqual(['code', 'message', 'param', 'type']);
    expect(r.headers.get('x-should-retry')).toBe('false');
    expect(u.seen).toHaveLength(3);
    // The SDK at its default retries: a 502 it would retry by status, but x-should-retry: false holds it back.
    const err = await sdkError(g.openai(2).chat.completions.create(ask));
    expect(err.status).toBe(502);
    expect(u.seen).toHaveLength(6);
  });

  it('a 429 with retry-after: 0 on a route that does not retry: passed on without retry-after: 0, the SDK does not retry', async () => {
    const u = await upstream((_req, res) => json(res, 429, rateLimited, { 'retry-after': '0' }));
    const g = await gatewayFor(u.origin, { retry: '{ maxAttempts: 1 }' });
    const err = await sdkError(g.openai(2).chat.completions.create(ask));
    expect(err.status).toBe(429);
    expect(err.headers?.get('retry-after')).not.toBe('0');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect((err.error as { code: string }).code).toBe('rate_limit_exceeded');
    expect(u.seen).toHaveLength(1);
  });

  it('a 429 with retry-after: 1.5 (fractional seconds) is waited out, 1.5 to 1.8 s, then answered', async () => {
    const u = await upstream((_req, res, n) => (n === 0 ? json(res, 429, rateLimited, { 'retry-after': '1.5' }) : json(res, 200, completion('after the wait'))));
    const g = await gatewayFor(u.origin);
    const data = await g.openai().chat.completions.create(ask);
    expect(data.choices[0]!.message.content).toBe('after the wait');
    expect(u.seen).toHaveLength(2);
    const gap = u.seen[1]!.at - u.seen[0]!.at;
    expect(gap).toBeGreaterThanOrEqual(1_450);
    expect(gap).toBeLessThan(3_000);
  });

  it('a 429 with a negative retry-after is no hint: the backoff decides (a quick retry), and no hold-off follows', async () => {
    const u = await upstream((_req, res, n) => (n === 0 ? json(res, 429, rateLimited, { 'retry-after': '-1' }) : json(res, 200, completion('soon'))));
    const g = await gatewayFor(u.origin);
    const data = await g.openai().chat.completions.create(ask);
    expect(data.choices[0]!.message.content).toBe('soon');
    expect(u.seen[1]!.at - u.seen[0]!.at).toBeLessThan(800);
    // No hold-off: the next request goes upstream at once.
    expect((await post(g)).status).toBe(200);
    expect(u.seen).toHaveLength(3);
  });

  it('retry-after-ms beside retry-after: the milliseconds decide (250 ms waited, not 7 s)', async () => {
    const u = await upstream((_req, res, n) => (n === 0 ? json(res, 429, rateLimited, { 'retry-after-ms': '250', 'retry-after': '7' }) : json(res, 200, completion('ms wins'))));
    const g = await gatewayFor(u.origin);
    const data = await g.openai().chat.completions.create(ask);
    expect(data.choices[0]!.message.content).toBe('ms wins');
    const gap = u.seen[1]!.at - u.seen[0]!.at;
    expect(gap).toBeGreaterThanOrEqual(240);
    expect(gap).toBeLessThan(2_000);
  });

  it('a 429 asking for 120 s: passed on at once with that wait and x-should-retry: false; the next request is held off, not sent', async () => {
    const u = await upstream((_req, res) => json(res, 429, rateLimited, { 'retry-after': '120' }));
    const g = await gatewayFor(u.origin);
    const started = Date.now();
    const err = await sdkError(g.openai(2).chat.completions.create(ask));
    expect(Date.now() - started).toBeLessThan(2_000);
    expect(err.status).toBe(429);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(Number(err.headers?.get('retry-after'))).toBeGreaterThanOrEqual(115);
    const next = await post(g);
    expect(next.status).toBe(429);
    expectOpenAIError(next.body, 'provider_held_off', (next.body.error as { type: string }).type);
    expect(next.headers.get('x-should-retry')).toBe('false');
    expect(Number(next.headers.get('retry-after'))).toBeGreaterThan(60);
    expect(u.seen).toHaveLength(1);
  });

  it('a 503 with connection: close: the retry goes on a new connection and is answered', async () => {
    const u = await upstream((_req, res, n) => (n === 0 ? json(res, 503, busy, { connection: 'close' }) : json(res, 200, completion('fresh socket'))));
    const g = await gatewayFor(u.origin);
    const { data, response } = await g.openai().chat.completions.create(ask).withResponse();
    expect(data.choices[0]!.message.content).toBe('fresh socket');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(u.seen).toHaveLength(2);
    expect(u.connections).toBe(2);
  });

  it('an upstream that silently closes keep-alive sockets idle for 1 s (no Keep-Alive hint): later requests never fail, one attempt each', async () => {
    const body = completion('kept');
    const answer = `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
    const u = await rawUpstream(() => answer, 1_000);
    const g = await gatewayFor(u.origin);
    for (let i = 0; i < 3; i++) {
      if (i > 0) await sleep(1_300);
      const r = await post(g);
      expect(r.status).toBe(200);
      expect(r.headers.get('x-stormgate-attempts')).toBe('1');
    }
    expect(u.seen).toHaveLength(3);
    expect(u.connections).toBe(3);
  });

  it('a stale pooled connection reset as the next request arrives: retried on a new one, never a client error', async () => {
    const body = completion('after a reset');
    const answer = `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
    // A request on a connection idle for 800 ms or more finds it closing: reset, unanswered.
    const u = await rawUpstream((n, idleMs) => (n > 0 && idleMs >= 800 ? 'reset' : answer));
    const g = await gatewayFor(u.origin);
    expect((await post(g)).status).toBe(200);
    await sleep(1_000);
    const { data, response } = await g.openai().chat.completions.create(ask).withResponse();
    expect(data.choices[0]!.message.content).toBe('after a reset');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(u.seen).toHaveLength(3);
  });

  it('headers then nothing, with responseMs: each attempt ends at responseMs, then 504 upstream_timeout, no SDK retries on top', async () => {
    const u = await upstream((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.flushHeaders();
    });
    const g = await gatewayFor(u.origin, { timeouts: '{ connectMs: 2000, responseMs: 400 }', retry: '{ maxAttempts: 2, backoff: { baseMs: 20, capMs: 50 } }' });
    const started = Date.now();
    const err = await sdkError(g.openai(2).chat.completions.create(ask));
    expect(err.status).toBe(504);
    expect((err.error as { code: string }).code).toBe('upstream_timeout');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(Date.now() - started).toBeLessThan(5_000);
    await sleep(100);
    expect(u.seen).toHaveLength(2);
    expect(u.seen.every((s) => s.aborted)).toBe(true);
  });

  it("headers then nothing, no responseMs: the client's 1.5 s timeout header bounds it, 504 deadline_exceeded, the upstream request ended", async () => {
    const u = await upstream((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.flushHeaders();
    });
    const g = await gatewayFor(u.origin);
    const started = Date.now();
    const r = await post(g, { 'x-stormgate-timeout-ms': '1500' });
    const took = Date.now() - started;
    expect(r.status).toBe(504);
    expectOpenAIError(r.body, 'deadline_exceeded', (r.body.error as { type: string }).type);
    expect(r.headers.get('x-should-retry')).toBe('false');
    expect(took).toBeGreaterThanOrEqual(1_000);
    expect(took).toBeLessThan(2_000);
    await sleep(100);
    expect(u.seen).toHaveLength(1);
    expect(u.seen[0]!.aborted).toBe(true);
  });

  it('a 103 Early Hints before the final 200 (a CDN in front of the provider): the answer goes through, one request', async () => {
    const u = await upstream((_req, res) => {
      res.writeEarlyHints({ link: '</v1/models>; rel=preload' });
      json(res, 200, completion('after early hints'));
    });
    const g = await gatewayFor(u.origin);
    const data = await g.openai().chat.completions.create(ask);
    expect(data.choices[0]!.message.content).toBe('after early hints');
    expect(u.seen).toHaveLength(1);
  });

  it("an unsolicited 100 Continue before the final 200 (undici refuses it): told the provider answered unreadably, not that it could not be reached", async () => {
    const u = await upstream((_req, res) => {
      res.writeContinue();
      json(res, 200, completion('after a 100'));
    });
    const g = await gatewayFor(u.origin);
    const err = await sdkError(g.openai(2).chat.completions.create(ask));
    // RFC 9110 15.2 has a client skip a 1xx it did not expect; undici (the gateway's HTTP client) destroys the
    // connection instead. The provider ran the request on each attempt: the client must not be told it was unreachable.
    expect(err.status).toBe(502);
    expect((err.error as { code: string }).code).toBe('upstream_bad_response');
    expect(err.message).not.toContain('could not be reached');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(u.seen).toHaveLength(3);
    const line = g.logs.map((l) => JSON.parse(l) as { route?: string; attempts?: Array<{ reason: string }> }).find((l) => l.route === 'chat');
    expect(line?.attempts?.map((a) => a.reason)).toEqual(['bad_stream', 'bad_stream', 'bad_stream']);
  });

  it('a very large answer (8 MB of content, whole) and a long stream (3,000 chunks) arrive intact', async () => {
    const big = 'x'.repeat(8 * 1024 * 1024 - 7) + 'the end';
    const parts = Array.from({ length: 3_000 }, (_, i) => `${i} `);
    const u = await upstream((_req, res, n) => {
      if (n === 0) return json(res, 200, completion(big));
      sseHead(res);
      res.end(chatEvents(parts).join(''));
    });
    const g = await gatewayFor(u.origin);
    const whole = await g.openai().chat.completions.create(ask);
    expect(whole.choices[0]!.message.content?.length).toBe(big.length);
    expect(whole.choices[0]!.message.content?.endsWith('the end')).toBe(true);
    const final = await g.openai().chat.completions.stream(askStream).finalChatCompletion();
    expect(final.choices[0]!.message.content).toBe(parts.join(''));
    expect(u.seen).toHaveLength(2);
  });
});

// --- Anthropic's own API ------------------------------------------------------------------------------------------

const ev = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
const messageStart = ev('message_start', {
  message: { id: 'msg_s36', type: 'message', role: 'assistant', model: 'claude-sonnet-4-6', content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 5, output_tokens: 1 } },
});
const textDelta = (text: string) => ev('content_block_delta', { index: 0, delta: { type: 'text_delta', text } });
const messageEvents = (parts: string[]) => [
  messageStart,
  ev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
  ...parts.map(textDelta),
  ev('content_block_stop', { index: 0 }),
  ev('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 7 } }),
  ev('message_stop', {}),
];
const overloadedEvent = ev('error', { error: { type: 'overloaded_error', message: 'Overloaded' } });
const messagesBody = { model: 'claude-sonnet-4-6', max_tokens: 256, messages: [{ role: 'user' as const, content: 'hi' }] };

describe("Anthropic's own API through the gateway", () => {
  it('`event: ping` before message_start and between deltas: the Anthropic SDK gets the whole message, one request', async () => {
    const u = await upstream((_req, res) => {
      sseHead(res);
      const [start, ...rest] = messageEvents(['Hello', ', ', 'Claude']);
      const ping = ev('ping', {});
      void trickle(res, [ping, ping, start!, ping, ...rest.slice(0, 2), ping, ...rest.slice(2)], 10).then(() => res.end());
    });
    const g = await gatewayFor(u.origin);
    const message = await g.anthropic().messages.stream(messagesBody).finalMessage();
    expect(message.content).toHaveLength(1);
    expect(message.content[0]).toMatchObject({ type: 'text', text: 'Hello, Claude' });
    expect(message.stop_reason).toBe('end_turn');
    expect(u.seen).toHaveLength(1);
  });

  it('an overloaded_error event before the first output is the 529 it stands for: retried, then answered', async () => {
    const u = await upstream((_req, res, n) => {
      sseHead(res);
      if (n === 0) return void res.end(ev('ping', {}) + messageStart + overloadedEvent);
      void trickle(res, messageEvents(['second ', 'time'])).then(() => res.end());
    });
    const g = await gatewayFor(u.origin);
    const message = await g.anthropic().messages.stream(messagesBody).finalMessage();
    expect(message.content[0]).toMatchObject({ type: 'text', text: 'second time' });
    expect(u.seen).toHaveLength(2);
    expect(u.seen[1]!.headers['x-retry-attempt']).toBe('1');
  });

  it('an overloaded_error event after the first output: the Anthropic SDK raises it, nothing is sent again', async () => {
    const u = await upstream((_req, res) => {
      sseHead(res);
      const events = messageEvents(['partial ', 'answer']);
      void trickle(res, [...events.slice(0, 3), overloadedEvent], 10).then(() => res.end());
    });
    const g = await gatewayFor(u.origin);
    let text = '';
    let raised: unknown;
    try {
      const stream = await g.anthropic(2).messages.create({ ...messagesBody, stream: true });
      for await (const e of stream) if (e.type === 'content_block_delta' && e.delta.type === 'text_delta') text += e.delta.text;
    } catch (err) {
      raised = err;
    }
    expect(text).toBe('partial ');
    expect(raised).toBeInstanceOf(Anthropic.APIError);
    expect(JSON.stringify((raised as InstanceType<typeof Anthropic.APIError>).error)).toContain('overloaded_error');
    await sleep(100);
    expect(u.seen).toHaveLength(1);
  });

  it('a 529 with retry-after: 1 is waited out (1 to 1.2 s) and retried; the Anthropic SDK gets the message', async () => {
    const overloaded = JSON.stringify({ type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } });
    const u = await upstream((_req, res, n) => {
      if (n === 0) return json(res, 529, overloaded, { 'retry-after': '1' });
      json(res, 200, JSON.stringify({ id: 'msg_s36', type: 'message', role: 'assistant', model: 'claude-sonnet-4-6', content: [{ type: 'text', text: 'back' }], stop_reason: 'end_turn', stop_sequence: null, usage: { input_tokens: 5, output_tokens: 1 } }));
    });
    const g = await gatewayFor(u.origin);
    const message = await g.anthropic().messages.create(messagesBody);
    expect(message.content[0]).toMatchObject({ type: 'text', text: 'back' });
    expect(u.seen).toHaveLength(2);
    const gap = u.seen[1]!.at - u.seen[0]!.at;
    expect(gap).toBeGreaterThanOrEqual(950);
    expect(gap).toBeLessThan(2_500);
  });
});
