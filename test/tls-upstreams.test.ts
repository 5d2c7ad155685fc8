// Providers on https:// (every real one is): a private CA the operator trusts per provider (`tls.caFile`), a
// certificate the gateway refuses (untrusted, expired, for another name) named by its TLS code and never retried on
// the same target nor counted against the provider's health, as is a handshake the provider refuses with an alert
// (a client certificate it asks for, a TLS version it lacks), a handshake that stalls bounded by connectMs, streams and
// kept-alive connections over TLS, a TLS connection reset mid-stream, and TLS through the egress proxy's tunnel.
import { writeFileSync } from 'node:fs';
import { createServer as createHttpServer, type Server as HttpServer } from 'node:http';
import { connect, createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { createSecureContext, TLSSocket, type SecureVersion } from 'node:tls';
import OpenAI from 'openai';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError, loadConfigFile } from '../src/config/load.ts';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { createProviderClients } from '../src/providers/provider-client.ts';
import { configServedBy, countingClient, RETRY_LOOP_ONLY, requestLine, TEST_KEY, useStacks, type Stack } from './helpers/stack.ts';
import { makeTestCerts, type TestCerts } from './helpers/tls-certs.ts';

let certs: TestCerts;
beforeAll(() => {
  certs = makeTestCerts();
});
afterAll(() => certs.remove());

interface TlsFront {
  port: number;
  /** TCP connections accepted, and TLS handshakes completed on them. */
  connections: number;
  handshakes: number;
  /** Where the decrypted bytes go: the mock's port, set once the mock runs. */
  target: number;
  close(): Promise<void>;
}

interface FrontOptions {
  /** Accept connections and never answer the ClientHello. */
  stall?: boolean;
  /** Reset the TCP connection once the provider's bytes passed to the gateway hold this string this many times. */
  resetAfter?: { marker: string; count: number };
  /** Ask for a client certificate signed by the test CA (mutual TLS), and refuse the handshake without one. */
  requestCert?: boolean;
  /** The TLS versions the front speaks. */
  versions?: { min: SecureVersion; max: SecureVersion };
  /** Answer the ClientHello with this fatal TLS alert (its number), as a terminator in trouble does. */
  alert?: number;
}

/** A TLS terminator on 127.0.0.1 in front of the mock provider, presenting `cert`. */
async function startTlsFront(cert: string, opts: FrontOptions = {}): Promise<TlsFront> {
  const secureContext = createSecureContext({ key: certs.key, cert, ...(opts.requestCert && { ca: certs.ca }), minVersion: opts.versions?.min, maxVersion: opts.versions?.max });
  const sockets = new Set<Socket>();
  const front: TlsFront = { port: 0, connections: 0, handshakes: 0, target: 0, close: async () => {} };
  const server: Server = createServer((raw) => {
    front.connections++;
    sockets.add(raw);
    raw.on('close', () => sockets.delete(raw));
    raw.on('error', () => {});
    if (opts.stall) return;
    // A TLS 1.2 record: fatal (2), the alert's number.
    if (opts.alert !== undefined) return void raw.once('data', () => raw.end(Buffer.from([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, opts.alert!])));
    const tls = new TLSSocket(raw, { isServer: true, secureContext, requestCert: opts.requestCert ?? false, rejectUnauthorized: opts.requestCert ?? false });
    tls.on('error', () => raw.destroy());
    tls.on('secure', () => {
      front.handshakes++;
      const upstream = connect(front.target, '127.0.0.1');
      sockets.add(upstream);
      upstream.on('close', () => {
        sockets.delete(upstream);
        tls.destroy();
      });
      upstream.on('error', () => {});
      tls.on('close', () => upstream.destroy());
      tls.pipe(upstream);
      let seen = 0;
      upstream.on('data', (chunk: Buffer) => {
        tls.write(chunk);
        if (!opts.resetAfter) return;
        seen += chunk.toString().split(opts.resetAfter.marker).length - 1;
        if (seen >= opts.resetAfter.count) setImmediate(() => raw.resetAndDestroy());
      });
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  front.port = (server.address() as AddressInfo).port;
  front.close = async () => {
    for (const s of sockets) s.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  };
  fronts.push(front);
  return front;
}

const fronts: TlsFront[] = [];
afterEach(async () => {
  await Promise.all(fronts.splice(0).map((f) => f.close()));
});
const start = useStacks();

type ProviderInput = ConfigInput['providers'][string];

/** Every route served by `secure` (the front, over https) alone, or with `fallback`, by the mock over http after it. */
function gatewayTo(front: TlsFront, provider: Partial<ProviderInput> = {}, route: Partial<ConfigInput['routes'][number]> = {}, fallback = false): Promise<Stack> {
  return start({
    config: (mockUrl) => {
      front.target = Number(new URL(mockUrl).port);
      const base = configServedBy(mockUrl, 'secure', `https://127.0.0.1:${front.port}/v1`);
      return {
        ...base,
        providers: { ...base.providers, secure: { ...base.providers['secure']!, apiKey: TEST_KEY, ...provider } },
        routes: base.routes.map((r) => ({ ...r, targets: fallback ? [{ provider: 'secure' }, { provider: 'mock' }] : r.targets, ...route })),
      };
    },
  });
}

const ask = (client: OpenAI) => client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });

async function streamText(client: OpenAI): Promise<string> {
  let text = '';
  const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
  for await (const c of stream) text += c.choices[0]?.delta?.content ?? '';
  return text;
}

describe('a provider behind a private CA', () => {
  it('is trusted with tls.caFile: whole and streamed answers, over one kept-alive TLS connection', async () => {
    const front = await startTlsFront(certs.good);
    const s = await gatewayTo(front, { tls: { caFile: certs.caFile } });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    for (let i = 0; i < 3; i++) {
      expect((await ask(client)).choices[0]?.message.content).toBeTruthy();
      expect(await streamText(client)).not.toBe('');
    }
    expect(s.mock.stats().total).toBe(6);
    expect(front.connections).toBe(1);
    expect(front.handshakes).toBe(1);
  });

  it('is trusted with tls.caFile on a passthrough path too', async () => {
    const front = await startTlsFront(certs.good);
    const s = await start({
      config: (mockUrl) => {
        front.target = Number(new URL(mockUrl).port);
        const base = configServedBy(mockUrl, 'secure', `https://127.0.0.1:${front.port}/v1`);
        return {
          ...base,
          providers: { ...base.providers, secure: { ...base.providers['secure']!, apiKey: TEST_KEY, tls: { caFile: certs.caFile } } },
          routes: base.routes.filter((r) => r.name !== 'embeddings'),
          passthrough: { provider: 'secure', paths: ['/v1/embeddings'], methods: ['POST'] },
        };
      },
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    const res = await client.embeddings.create({ model: 'text-embedding-3-small', input: 'hi' });
    expect(res.data[0]?.embedding.length).toBeGreaterThan(0);
    expect(front.handshakes).toBe(1);
  });

  it('accepts any certificate with rejectUnauthorized: false, and warns at start-up that it does', async () => {
    const front = await startTlsFront(certs.selfSigned);
    const s = await gatewayTo(front, { tls: { rejectUnauthorized: false } });
    expect((await ask(new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 }))).choices[0]?.message.content).toBeTruthy();
    const warning = s.logs.map((l) => JSON.parse(l) as { level: number; msg: string; provider?: string }).find((l) => l.provider === 'secure' && l.level === 40);
    expect(warning?.msg).toMatch(/rejectUnauthorized: false.*any certificate/);
  });

  it('fails start-up, naming the field and the file, when tls.caFile cannot be read or holds no certificate', () => {
    const clients = (caFile: string) => {
      const input = configServedBy('http://127.0.0.1:1', 'secure', 'https://127.0.0.1:2/v1');
      input.providers['secure'] = { ...input.providers['secure']!, tls: { caFile } };
      return () => createProviderClients(ConfigSchema.parse(input));
    };
    expect(clients(`${certs.dir}/missing.pem`)).toThrow(/^providers\.secure\.tls\.caFile: cannot read .*missing\.pem \(ENOENT\)$/);
    expect(clients(`${certs.dir}/ip.ext`)).toThrow(/^providers\.secure\.tls\.caFile: .*ip\.ext holds no PEM certificate/);
    writeFileSync(`${certs.dir}/truncated.pem`, certs.ca.slice(0, 120) + '\n-----END CERTIFICATE-----\n');
    expect(clients(`${certs.dir}/truncated.pem`)).toThrow(/^providers\.secure\.tls\.caFile: .*truncated\.pem holds a certificate that does not parse/);
  });

  it('reports an unusable tls.caFile as a config problem when the config file is loaded', () => {
    const file = `${certs.dir}/gateway.yaml`;
    writeFileSync(
      file,
      `providers:\n  vllm: { family: openai, baseUrl: "https://127.0.0.1:8000/v1", apiKey: none, tls: { caFile: "${certs.dir}/nope.pem" } }\n` +
        'routes:\n  - { name: chat, match: { path: /v1/chat/completions }, targets: [{ provider: vllm }] }\n',
    );
    expect(() => loadConfigFile(file, {})).toThrow(ConfigError);
    expect(() => loadConfigFile(file, {})).toThrow(`${file}:2: providers.vllm.tls.caFile: cannot read ${certs.dir}/nope.pem (ENOENT)`);
  });

  it('refuses tls on a provider whose baseUrl is http://', () => {
    const input = configServedBy('http://127.0.0.1:1', 'plain', 'http://127.0.0.1:2/v1');
    input.providers['plain'] = { ...input.providers['plain']!, tls: { caFile: '/etc/ssl/ca.pem' } };
    const parsed = ConfigSchema.safeParse(input);
    expect(parsed.success).toBe(false);
    expect(JSON.stringify(parsed.error?.issues)).toMatch(/https:\/\//);
  });
});

describe('a certificate the gateway does not trust', () => {
  const cases = [
    { name: 'self-signed', cert: () => certs.selfSigned, caFile: false, code: 'DEPTH_ZERO_SELF_SIGNED_CERT' },
    { name: 'signed by a CA it was not given', cert: () => certs.good, caFile: false, code: 'UNABLE_TO_VERIFY_LEAF_SIGNATURE' },
    { name: 'expired', cert: () => certs.expired, caFile: true, code: 'CERT_HAS_EXPIRED' },
    { name: 'for another name', cert: () => certs.wrongName, caFile: true, code: 'ERR_TLS_CERT_ALTNAME_INVALID' },
  ];
  it.each(cases)('$name: one handshake, a 502 naming $code that the SDK does not retry, the code in the log', async ({ cert, caFile, code }) => {
    const front = await startTlsFront(cert());
    const s = await gatewayTo(front, caFile ? { tls: { caFile: certs.caFile } } : {});
    const { client, counter } = countingClient(s);
    const err = (await ask(client).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.status).toBe(502);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.message).toContain(code);
    expect(err.message).toMatch(/tls\.caFile/);
    // What the certificate says (its names, its issuer) is for the operator's tools, not the client.
    expect(err.message).not.toMatch(/other\.example|stormgate test CA|altnames/);
    expect(counter.requests).toBe(1);
    // Every retry would fail the same way: the certificate does not change between two attempts.
    expect(front.connections).toBe(1);
    expect(front.handshakes).toBe(0);
    const line = await requestLine(s);
    expect(line.attempts).toEqual([expect.objectContaining({ reason: 'tls', code })]);
    expect(s.mock.stats().total).toBe(0);
  });

  it('an https:// baseUrl on a plain http port: one attempt, a 502 naming ERR_SSL_WRONG_VERSION_NUMBER and the baseUrl', async () => {
    const s = await start({ config: (mockUrl) => configServedBy(mockUrl, 'plain', `${mockUrl.replace('http:', 'https:')}/v1`) });
    const err = (await ask(new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 })).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err.status).toBe(502);
    expect(err.message).toMatch(/ERR_SSL_WRONG_VERSION_NUMBER.*baseUrl/);
    expect((await requestLine(s)).attempts).toEqual([expect.objectContaining({ reason: 'tls', code: 'ERR_SSL_WRONG_VERSION_NUMBER' })]);
  });

  it('hands the request to the next target, even on a route whose retryOn leaves network out: nothing was sent', async () => {
    const front = await startTlsFront(certs.selfSigned);
    const s = await gatewayTo(front, {}, { retry: { maxAttempts: 3, retryOn: [503] } }, true);
    const res = await ask(new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 })).withResponse();
    expect(res.response.headers.get('x-stormgate-target')).toMatch(/^mock/);
    expect(front.connections).toBe(1);
    expect(front.handshakes).toBe(0);
    expect(s.mock.stats().total).toBe(1);
  });

  it("does not open the provider's breaker: every client is told the TLS code, never circuit_open", async () => {
    const front = await startTlsFront(certs.selfSigned);
    // The provider's breaker on (consecutiveFailures 5), the budget out of the way.
    const s = await gatewayTo(front, { breaker: {} }, { budget: RETRY_LOOP_ONLY.route!.budget, park: false });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    for (let i = 0; i < 7; i++) {
      const err = (await ask(client).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
      expect(err.message).toContain('DEPTH_ZERO_SELF_SIGNED_CERT');
    }
    expect(s.logs.join('\n')).not.toMatch(/breaker open/);
  });
});

describe('a provider that refuses the handshake with a TLS alert', () => {
  const cases = [
    { name: 'asks for a client certificate (mutual TLS, TLS 1.3)', front: { requestCert: true }, code: 'ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED', fix: /client certificate \(mutual TLS\)/ },
    { name: 'asks for a client certificate over TLS 1.2', front: { requestCert: true, versions: { min: 'TLSv1.2', max: 'TLSv1.2' } }, code: 'ERR_SSL_SSLV3_ALERT_HANDSHAKE_FAILURE', fix: /client certificate \(mutual TLS\).*TLS version or cipher/ },
    { name: 'speaks TLS 1.0 only', front: { versions: { min: 'TLSv1', max: 'TLSv1' } }, code: 'ERR_SSL_TLSV1_ALERT_PROTOCOL_VERSION', fix: /TLS version or cipher/ },
  ] satisfies Array<{ name: string; front: FrontOptions; code: string; fix: RegExp }>;
  it.each(cases)('$name: one attempt, a 502 naming $code and what to fix, nothing for the breaker', async ({ front: opts, code, fix }) => {
    const front = await startTlsFront(certs.good, opts);
    const s = await gatewayTo(front, { tls: { caFile: certs.caFile }, breaker: {} }, { budget: RETRY_LOOP_ONLY.route!.budget, park: false });
    const { client, counter } = countingClient(s, { maxRetries: 0 });
    for (let i = 0; i < 6; i++) {
      const err = (await ask(client).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
      expect(err).toBeInstanceOf(OpenAI.APIError);
      expect(err.status).toBe(502);
      expect(err.headers?.get('x-should-retry')).toBe('false');
      // Never circuit_open: five refusals in a row are no sign of the provider's health.
      expect(err.message).toContain(code);
      expect(err.message).toMatch(fix);
    }
    expect(counter.requests).toBe(6);
    expect(front.connections).toBe(6);
    expect(front.handshakes).toBe(0);
    expect((await requestLine(s)).attempts).toEqual([expect.objectContaining({ reason: 'tls', code })]);
    expect(s.mock.stats().total).toBe(0);
  });

  it('hands the request to the next target at once when it asks for a client certificate', async () => {
    const front = await startTlsFront(certs.good, { requestCert: true });
    const s = await gatewayTo(front, { tls: { caFile: certs.caFile } }, { retry: { maxAttempts: 3 } }, true);
    const res = await ask(new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 })).withResponse();
    expect(res.response.headers.get('x-stormgate-target')).toMatch(/^mock/);
    expect(front.connections).toBe(1);
  });

  it('retries an internal error alert, which says nothing about the next connection, as a network failure', async () => {
    const front = await startTlsFront(certs.good, { alert: 80 });
    const s = await gatewayTo(front, { tls: { caFile: certs.caFile } }, { retry: { maxAttempts: 3 } });
    const err = (await ask(new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 })).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err.status).toBe(502);
    expect(err.message).toMatch(/could not be reached after 3 attempts \(last: ERR_SSL_TLSV1_ALERT_INTERNAL_ERROR\)/);
    expect(front.connections).toBe(3);
  });
});

describe('TLS timing and streams', () => {
  it('bounds a handshake the provider never answers by connectMs, as a connect timeout', async () => {
    const front = await startTlsFront(certs.good, { stall: true });
    const s = await gatewayTo(front, { tls: { caFile: certs.caFile }, timeouts: { connectMs: 300 } }, { retry: { maxAttempts: 1 } });
    const started = Date.now();
    const err = (await ask(new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 })).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err.status).toBe(504);
    expect(err.message).toMatch(/connect timeout/);
    expect(Date.now() - started).toBeLessThan(1_500);
    expect(front.connections).toBe(1);
  });

  it('ends a stream whose TLS connection is reset mid-answer with an error event the SDK raises, without a retry', async () => {
    const front = await startTlsFront(certs.good, { resetAfter: { marker: '"content":"', count: 6 } });
    const s = await gatewayTo(front, { tls: { caFile: certs.caFile } });
    s.mock.setFaults({ stream: { chunks: 20, chunkDelayMs: 20 } });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    let text = '';
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    await expect(
      (async () => {
        for await (const c of stream) text += c.choices[0]?.delta?.content ?? '';
      })(),
    ).rejects.toThrow(/cut|ended before the answer was complete/);
    expect(text).not.toBe('');
    expect(front.handshakes).toBe(1);
    expect(s.mock.stats().total).toBe(1);
    expect(await requestLine(s)).toMatchObject({ outcome: 'stream_error', streamEnd: 'cut' });
  });
});

describe('an https provider through the egress proxy', () => {
  let proxy: HttpServer;
  let proxyUrl: string;
  const tunnels: string[] = [];
  beforeAll(async () => {
    proxy = createHttpServer((_req, res) => res.writeHead(405).end());
    proxy.on('connect', (req, client: Socket, head: Buffer) => {
      tunnels.push(req.url ?? '');
      client.on('error', () => {});
      const [host, port] = (req.url ?? '').split(':');
      const upstream = connect(Number(port), host!, () => {
        client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
        upstream.write(head);
        upstream.pipe(client).pipe(upstream);
      });
      upstream.on('error', () => client.destroy());
      client.on('close', () => upstream.destroy());
    });
    await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
    proxyUrl = `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    proxy.closeAllConnections();
    await new Promise<void>((resolve) => proxy.close(() => resolve()));
  });

  it('verifies the provider against tls.caFile inside the tunnel, and streams through it', async () => {
    tunnels.length = 0;
    const front = await startTlsFront(certs.good);
    const s = await gatewayTo(front, { proxy: proxyUrl, tls: { caFile: certs.caFile } });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    expect((await ask(client)).choices[0]?.message.content).toBeTruthy();
    expect(await streamText(client)).not.toBe('');
    expect(tunnels).toEqual([`127.0.0.1:${front.port}`]);
    expect(front.handshakes).toBe(1);
  });

  it('names the TLS code of a certificate refused inside the tunnel, not the proxy, and does not retry it', async () => {
    const front = await startTlsFront(certs.selfSigned);
    const s = await gatewayTo(front, { proxy: proxyUrl });
    const err = (await ask(new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 })).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err.status).toBe(502);
    expect(err.message).toContain('DEPTH_ZERO_SELF_SIGNED_CERT');
    expect(err.message).not.toMatch(/egress proxy/);
    expect(front.connections).toBe(1);
  });

  it('names the alert of a provider that asks for a client certificate inside the tunnel, and does not retry it', async () => {
    const front = await startTlsFront(certs.good, { requestCert: true });
    const s = await gatewayTo(front, { proxy: proxyUrl, tls: { caFile: certs.caFile } });
    const err = (await ask(new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 })).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err.status).toBe(502);
    expect(err.message).toMatch(/ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED.*client certificate/);
    expect(front.connections).toBe(1);
  });
});
