// HTTP/1.1 on both sides of the gateway, as a third-party tester sees it. Upstream: a provider's content-type read as
// the case-insensitive media type it is, a whole answer handed to the SDK as JSON, an answer that is not HTTP at all.
// Client side: the Host header, expect: 100-continue before a refusal, a body that is not UTF-8, and a slow upload
// that spends the client's deadline.
import { once } from 'node:events';
import { connect, createServer, type AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import OpenAI from 'openai';
import { request as undiciRequest } from 'undici';
import { describe, expect, it } from 'vitest';
import { chatChunk, useFakeProviders } from './helpers/fake-provider.ts';
import { configServedBy, defaultConfig, metricSum, useStacks } from './helpers/stack.ts';
import { hostAllowance } from '../src/http/host-header.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();

const completion = JSON.stringify({ id: 'chatcmpl-1', object: 'chat.completion', created: 1, model: 'gpt-4o', choices: [{ index: 0, message: { role: 'assistant', content: 'Hello' }, finish_reason: 'stop' }] });
const events = chatChunk({ content: 'Hel' }, null) + chatChunk({ content: 'lo' }, null) + chatChunk({}, 'stop') + 'data: [DONE]\n\n';

describe("a provider's content-type", () => {
  // model name: the content-type the provider answers with (none for "none").
  const provider = () =>
    startProvider((req, res) => {
      let body = '';
      req.on('data', (d: Buffer) => (body += d.toString()));
      req.on('end', () => {
        const { model, stream } = JSON.parse(body) as { model: string; stream?: boolean };
        res.writeHead(200, model === 'none' ? {} : { 'content-type': model });
        res.end(stream ? events : completion);
      });
    });

  it('in capitals is the media type it names: one upstream request, no 502 (RFC 9110: types are case-insensitive)', async () => {
    const p = await provider();
    const s = await startStack({ config: (mockUrl) => configServedBy(mockUrl, 'caps', `${p.origin}/v1`) });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    let text = '';
    for await (const c of await client.chat.completions.create({ model: 'Text/Event-Stream', messages: [{ role: 'user', content: 'hi' }], stream: true })) text += c.choices[0]?.delta?.content ?? '';
    expect(text).toBe('Hello');
    expect(p.hits()).toBe(1);
    const whole = await client.chat.completions.create({ model: 'Application/JSON; Charset=UTF-8', messages: [{ role: 'user', content: 'hi' }] });
    expect(whole.choices[0]!.message.content).toBe('Hello');
    expect(p.hits()).toBe(2);
  });

  it('missing from a whole answer still reaches the SDK as JSON: application/json, not a string without choices', async () => {
    const p = await provider();
    const s = await startStack({ config: (mockUrl) => configServedBy(mockUrl, 'bare', `${p.origin}/v1`) });
    const res = await fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'none', messages: [{ role: 'user', content: 'hi' }] }) });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('application/json');
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    const whole = await client.chat.completions.create({ model: 'none', messages: [{ role: 'user', content: 'hi' }] });
    expect(whole.choices[0]!.message.content).toBe('Hello');
  });
});

describe('the Host header', () => {
  /** Sends `head` and the chat body on a raw socket; resolves with everything the gateway wrote before closing. */
  const raw = (url: string, head: string): Promise<string> =>
    new Promise((resolve) => {
      const body = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
      const socket = connect(Number(new URL(url).port), '127.0.0.1');
      let answer = '';
      socket.on('data', (d) => (answer += d.toString()));
      socket.on('close', () => resolve(answer));
      socket.write(`POST /v1/chat/completions HTTP/1.1\r\n${head}content-type: application/json\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n${body}`);
    });

  it('repeated is a 400 in the OpenAI shape, as a missing one is, and nothing goes upstream (RFC 9112 3.2)', async () => {
    const s = await startStack({});
    const answer = await raw(s.url, 'Host: gateway.internal\r\nHost: evil.example\r\n');
    expect(answer).toMatch(/^HTTP\/1\.1 400 /);
    expect(answer.toLowerCase()).toContain('x-should-retry: false');
    expect(JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4))).toMatchObject({ error: { code: 'bad_request', message: 'the request has more than one Host header' } });
    expect(s.mock.stats().total).toBe(0);
    // One Host line, as every client sends, is served.
    expect(await raw(s.url, 'Host: gateway\r\n')).toMatch(/^HTTP\/1\.1 200 /);
  });

  it('naming a DNS name is refused on a loopback address (DNS rebinding from a web page), unless server.allowedHosts has it', async () => {
    const s = await startStack({});
    const refused = await raw(s.url, 'Host: rebind.attacker.example:8080\r\n');
    expect(refused).toMatch(/^HTTP\/1\.1 403 /);
    expect(JSON.parse(refused.slice(refused.indexOf('\r\n\r\n') + 4))).toMatchObject({ error: { code: 'host_not_allowed', type: 'invalid_request_error' } });
    expect(s.mock.stats().total).toBe(0);
    // The local names: loopback IPs, localhost and its subdomains, names without a dot.
    for (const host of ['127.0.0.1:8080', '[::1]:8080', 'localhost', 'api.localhost:8080', 'stormgate']) expect(await raw(s.url, `Host: ${host}\r\n`)).toMatch(/^HTTP\/1\.1 200 /);
    const named = await startStack({ config: (mockUrl) => ({ ...defaultConfig(mockUrl), server: { host: '127.0.0.1', port: 0, allowedHosts: ['Gateway.Corp.Example'] } }) });
    expect(await raw(named.url, 'Host: gateway.corp.example\r\n')).toMatch(/^HTTP\/1\.1 200 /);
    expect(await raw(named.url, 'Host: other.corp.example\r\n')).toMatch(/^HTTP\/1\.1 403 /);
    const any = await startStack({ config: (mockUrl) => ({ ...defaultConfig(mockUrl), server: { host: '127.0.0.1', port: 0, allowedHosts: ['*'] } }) });
    expect(await raw(any.url, 'Host: rebind.attacker.example\r\n')).toMatch(/^HTTP\/1\.1 200 /);
    // Listening beyond loopback (Docker, Kubernetes), the gateway is reached by its service names: every name is answered.
    expect(hostAllowance({ host: '0.0.0.0' })).toBeUndefined();
    expect(hostAllowance({ host: '::1' })!('evil.example')).toBe(false);
    for (const host of ['::ffff:127.0.0.1', '0:0:0:0:0:0:0:1', '127.0.0.2']) expect(hostAllowance({ host })!('evil.example')).toBe(false);
  });
});

describe('expect: 100-continue', () => {
  /** Sends a request's head only, as curl does with `expect: 100-continue`; resolves with what came back before the close. */
  const headOnly = (url: string, head: string): Promise<string> =>
    new Promise((resolve) => {
      const socket = connect(Number(new URL(url).port), '127.0.0.1');
      let answer = '';
      socket.on('data', (d) => (answer += d.toString()));
      socket.on('close', () => resolve(answer));
      // Told to continue, the client would have to upload the body: after a moment, what came back is the answer.
      setTimeout(() => {
        socket.destroy();
        resolve(answer);
      }, 2_000);
      socket.write(`${head}Host: x\r\ncontent-type: application/json\r\ncontent-length: 5000000\r\nexpect: 100-continue\r\n\r\n`);
    });

  it('is not told to continue when the request is refused anyway: its body is never uploaded for a 401 or 405', async () => {
    const s = await startStack({ config: (mockUrl) => ({ ...defaultConfig(mockUrl), auth: { keys: { agents: 'sk-client-key-0123' } } }) });
    const cases: Array<[string, number, string]> = [
      ['POST /v1/chat/completions HTTP/1.1\r\nauthorization: Bearer wrong-key\r\n', 401, 'invalid_api_key'],
      ['PUT /v1/chat/completions HTTP/1.1\r\nauthorization: Bearer sk-client-key-0123\r\n', 405, 'method_not_allowed'],
    ];
    for (const [head, status, code] of cases) {
      const answer = await headOnly(s.url, head);
      // The final answer comes first, and the connection closes after it (the body may still be on its way).
      expect(answer).toMatch(new RegExp(`^HTTP/1\\.1 ${status} `));
      expect(answer).not.toContain('100 Continue');
      expect(answer.toLowerCase()).toContain('connection: close');
      expect(JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4))).toMatchObject({ error: { code } });
    }
    expect(s.mock.stats().total).toBe(0);
  });

  // Before, only a managed path's content-length past the limit was answered first: a wrong content-type got its 100
  // Continue (curl then uploaded the whole body) and only then its 415, and an unknown path's oversized body its 413.
  it('is not told to continue when its headers decide the answer: a content-type that is not JSON (415), a body past the limit anywhere (413)', async () => {
    const s = await startStack({ config: (mockUrl) => ({ ...defaultConfig(mockUrl), server: { host: '127.0.0.1', port: 0, bodyLimitBytes: 100_000 } }) });
    const cases: Array<[string, number, string]> = [
      ['POST /v1/chat/completions HTTP/1.1\r\ncontent-type: text/plain\r\ncontent-length: 5000\r\n', 415, 'unsupported_media_type'],
      ['POST /v1/chat/completions HTTP/1.1\r\ncontent-type: multipart/form-data; boundary=x\r\ncontent-length: 5000\r\n', 415, 'unsupported_media_type'],
      ['POST /v1/embeddings HTTP/1.1\r\ncontent-length: 5000\r\n', 415, 'unsupported_media_type'],
      ['POST /v1/chat/completions HTTP/1.1\r\ncontent-type: application/json\r\ncontent-encoding: zstd\r\ncontent-length: 5000\r\n', 415, 'unsupported_media_type'],
      ['POST /v1/not-a-route HTTP/1.1\r\ncontent-type: application/json\r\ncontent-length: 5000000\r\n', 413, 'request_too_large'],
    ];
    for (const [head, status, code] of cases) {
      const { answer, closed } = await rawHead(s.url, `${head}Host: x\r\nexpect: 100-continue\r\n\r\n`);
      expect(answer).toMatch(new RegExp(`^HTTP/1\\.1 ${status} `));
      expect(answer).not.toContain('100 Continue');
      // The body may still come: the connection closes after the answer.
      expect(closed).toBe(true);
      expect(JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4))).toMatchObject({ error: { code } });
    }
    // JSON in any case, with parameters, is told to continue and served.
    const body = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    const { answer: served } = await rawHead(s.url, `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: Application/JSON; charset=utf-8\r\ncontent-length: ${body.length}\r\nexpect: 100-continue\r\nconnection: close\r\n\r\n`, body);
    expect(served).toMatch(/^HTTP\/1\.1 100 Continue\r\n\r\nHTTP\/1\.1 200 /);
    expect(s.mock.stats().total).toBe(1);
  });
});

/**
 * Sends a request's head, and `body` once told to continue; resolves with what came back before the close (or 2 s),
 * and whether the gateway closed the connection.
 */
function rawHead(url: string, head: string, body?: string): Promise<{ answer: string; closed: boolean }> {
  return new Promise((resolve) => {
    const socket = connect(Number(new URL(url).port), '127.0.0.1');
    let answer = '';
    socket.on('data', (d) => {
      answer += d.toString();
      if (body !== undefined && answer === 'HTTP/1.1 100 Continue\r\n\r\n') socket.write(body);
    });
    socket.on('close', () => resolve({ answer, closed: true }));
    setTimeout(() => {
      socket.destroy();
      resolve({ answer, closed: false });
    }, 2_000);
    socket.write(head);
  });
}

describe('expect: 100-continue with a body past server.bodyLimitBytes', () => {
  it('is answered 413 without being told to continue (curl would upload all of it first); one within the limit is told, and served', async () => {
    const s = await startStack({ config: (mockUrl) => ({ ...defaultConfig(mockUrl), server: { host: '127.0.0.1', port: 0, bodyLimitBytes: 100_000 } }) });
    const send = (length: number, body?: string): Promise<string> =>
      new Promise((resolve) => {
        const socket = connect(Number(new URL(s.url).port), '127.0.0.1');
        let answer = '';
        socket.on('data', (d) => {
          answer += d.toString();
          if (body !== undefined && answer === 'HTTP/1.1 100 Continue\r\n\r\n') socket.write(body);
        });
        socket.on('close', () => resolve(answer));
        setTimeout(() => {
          socket.destroy();
          resolve(answer);
        }, 2_000);
        socket.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: ${length}\r\nexpect: 100-continue\r\nconnection: close\r\n\r\n`);
      });
    const refused = await send(50_000_000);
    expect(refused).toMatch(/^HTTP\/1\.1 413 /);
    expect(refused).not.toContain('100 Continue');
    expect(JSON.parse(refused.slice(refused.indexOf('\r\n\r\n') + 4))).toMatchObject({ error: { code: 'request_too_large' } });
    const body = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    const served = await send(body.length, body);
    expect(served).toMatch(/^HTTP\/1\.1 100 Continue\r\n\r\nHTTP\/1\.1 200 /);
  });
});

describe('a request body that is not UTF-8', () => {
  it('is refused with 400 invalid_json, not parsed into U+FFFD and sent on (raw to one target, replaced to another)', async () => {
    const s = await startStack({});
    const json = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'café' }] });
    for (const [body, contentType] of [
      [Buffer.from(json, 'latin1'), 'application/json'],
      [Buffer.from(`\ufeff${json}`, 'utf16le'), 'application/json; charset=utf-16'],
    ] as const) {
      const res = await fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': contentType }, body });
      expect(res.status).toBe(400);
      expect(res.headers.get('x-should-retry')).toBe('false');
      expect(await res.json()).toMatchObject({ error: { code: 'invalid_json', message: expect.stringContaining('not valid UTF-8') } });
    }
    expect(s.mock.stats().total).toBe(0);
    // The same text in UTF-8 is served.
    const ok = await fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: Buffer.from(json, 'utf8') });
    expect(ok.status).toBe(200);
  });
});

describe('a body that takes a while to arrive', () => {
  it("spends the client's deadline too: the answer comes before the client's timeout, counted from the request's head", async () => {
    // The provider takes 2 s; the client gives the request 3 s (x-stormgate-timeout-ms) and needs 2 s to upload its body.
    const s = await startStack({ faults: { latencyMs: 2_000 } });
    const body = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x'.repeat(4000) }] });
    const started = Date.now();
    const answer = await new Promise<string>((resolve) => {
      const socket = connect(Number(new URL(s.url).port), '127.0.0.1');
      let out = '';
      socket.on('data', (d) => (out += d.toString()));
      socket.on('close', () => resolve(out));
      socket.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\nx-stormgate-timeout-ms: 3000\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n`);
      const pieces = 4;
      const size = Math.ceil(body.length / pieces);
      for (let i = 0; i < pieces; i++) setTimeout(() => socket.write(body.slice(i * size, (i + 1) * size)), i * 650);
    });
    const elapsed = Date.now() - started;
    // Counted from the body's end, the deadline let a 2 s attempt begin 2 s in: a 200 at 4 s, a second after the client gave up.
    expect(answer).toMatch(/^HTTP\/1\.1 504 /);
    expect(answer).toContain('"code":"deadline_exceeded"');
    expect(elapsed).toBeLessThan(3_500);
  });
});

describe('a body still arriving when the deadline passes', () => {
  // Before, the deadline was only looked at once the body had arrived whole: a client trickling its body got its 504
  // when the upload ended (here after 8 s, for a 1.5 s timeout), long after it had given up.
  it('is answered 504 at the deadline (OpenAI shape, x-should-retry: false), and the rest of its body is not read', async () => {
    const s = await startStack({});
    const body = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x'.repeat(4000) }] });
    const started = Date.now();
    const { answer, closedAtMs } = await new Promise<{ answer: string; closedAtMs: number }>((resolve) => {
      const socket = connect(Number(new URL(s.url).port), '127.0.0.1');
      let out = '';
      socket.on('data', (d) => (out += d.toString()));
      socket.on('error', () => {});
      // 40 pieces, one each 200 ms: the upload would end 8 s in.
      const pieces = 40;
      const size = Math.ceil(body.length / pieces);
      const timers = Array.from({ length: pieces }, (_, i) => setTimeout(() => socket.writable && socket.write(body.slice(i * size, (i + 1) * size)), i * 200));
      socket.on('close', () => {
        for (const t of timers) clearTimeout(t);
        resolve({ answer: out, closedAtMs: Date.now() - started });
      });
      socket.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\nx-stormgate-timeout-ms: 1500\r\ncontent-length: ${body.length}\r\n\r\n`);
    });
    expect(answer).toMatch(/^HTTP\/1\.1 504 /);
    expect(answer.toLowerCase()).toContain('x-should-retry: false');
    expect(JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4))).toMatchObject({ error: { code: 'deadline_exceeded', type: expect.any(String), message: expect.any(String) } });
    // At the deadline (1.25 s after the head), not when the upload would have ended; the connection is closed.
    expect(closedAtMs).toBeLessThan(5_000);
    // A client that reads the answer while it sends (undici, the SDKs' fetch) gets it, not a broken connection.
    const slowBody = async function* () {
      for (let i = 0; i < body.length; i += 100) {
        yield Buffer.from(body.slice(i, i + 100));
        await new Promise((r) => setTimeout(r, 200));
      }
    };
    const res = await undiciRequest(`${s.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'content-length': String(body.length), 'x-stormgate-timeout-ms': '1500' },
      body: Readable.from(slowBody()),
    });
    expect(res.statusCode).toBe(504);
    expect(res.headers['x-should-retry']).toBe('false');
    expect(await res.body.json()).toMatchObject({ error: { code: 'deadline_exceeded' } });
    expect(s.mock.stats().total).toBe(0);
    // Counted as what it was, a deadline, not as a refused request.
    expect(await metricSum(s, 'stormgate_requests_total{route="none",target="none",priority="none",outcome="deadline"}')).toBe(2);
  });
});

describe('a provider whose answer is not HTTP', () => {
  it('gave an unusable answer (502 upstream_bad_response), not one of a provider that "could not be reached (last: UNKNOWN)"', async () => {
    // A status line and a header line undici's parser refuses: the provider was answering.
    const server = createServer((socket) => {
      socket.on('error', () => {});
      socket.on('data', () => socket.write('HTTP/1.1 200 OK\r\nbroken header line\r\ncontent-length: 2\r\n\r\n{}'));
    });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    try {
      const origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
      const s = await startStack({ config: (mockUrl) => configServedBy(mockUrl, 'broken', `${origin}/v1`) });
      const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
      for (const stream of [false, true]) {
        const err = (await client.chat.completions.create({ model: 'gpt-4o', stream, messages: [{ role: 'user', content: 'hi' }] }).then(() => undefined, (e: unknown) => e)) as { status?: number; code?: string; message: string };
        expect(err).toMatchObject({ status: 502, code: 'upstream_bad_response' });
        expect(err.message).toContain('not valid HTTP/1.1');
      }
    } finally {
      server.close();
    }
  });
});
