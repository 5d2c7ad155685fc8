// A provider reached through the company's egress proxy (`providers.<name>.proxy`): managed routes, streams and the
// passthrough all tunnel through it with HTTP CONNECT, its credentials go to the proxy and nowhere else, and a proxy
// that refuses the tunnel is a provider out of reach (retried, never sent), not an answer that may have run.
import { createServer, type Server } from 'node:http';
import { connect, type AddressInfo, type Socket } from 'node:net';
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import type { ConfigInput } from '../src/config/schema.ts';
import { defaultConfig, requestLine, RETRY_LOOP_ONLY, TEST_KEY, useStacks } from './helpers/stack.ts';
import { TEST_SECRETS } from './helpers/test-secrets.ts';
import { freePort } from './helpers/free-port.ts';

const PROXY_USER = 'egress-user';
const PROXY_PASSWORD = TEST_SECRETS.find((s) => s.startsWith('egress-proxy-'))!;

interface ConnectProxy {
  url: string;
  /** Each CONNECT: the host:port asked for and the Proxy-Authorization it carried. */
  tunnels: Array<{ target: string; auth: string | undefined }>;
  /** Connections that carried a CONNECT and that the gateway has not closed. */
  openTunnels(): number;
  close(): Promise<void>;
}

/**
 * A forward proxy that answers CONNECT only (as egress proxies for HTTPS do); `refuse`: the status it refuses with;
 * `hang`: it takes the connection and the CONNECT, and never answers (an overloaded proxy, one whose upstream DNS hangs);
 * `drop`: it closes the connection in answer to CONNECT, with no status (a proxy restarting, one that sheds load);
 * `reset`: it resets the connection in answer to CONNECT (a firewall that blocks the host, a proxy under load).
 */
type ProxyBehaviour = { refuse?: number; hang?: boolean; drop?: boolean; reset?: boolean };
async function startConnectProxy(opts: ProxyBehaviour = {}): Promise<ConnectProxy> {
  const tunnels: ConnectProxy['tunnels'] = [];
  const sockets = new Set<Socket>();
  const server: Server = createServer((_req, res) => res.writeHead(405).end());
  let open = 0;
  server.on('connect', (req, client: Socket, head: Buffer) => {
    sockets.add(client);
    client.on('close', () => sockets.delete(client));
    client.on('error', () => {});
    tunnels.push({ target: req.url ?? '', auth: req.headers['proxy-authorization'] });
    open++;
    // The gateway's end (its FIN), or the socket's close, whichever comes first.
    let closed = false;
    const gone = () => {
      if (!closed) open--;
      closed = true;
    };
    client.on('end', gone);
    client.on('close', gone);
    if (opts.hang) return;
    if (opts.drop) {
      client.destroy();
      return;
    }
    if (opts.reset) {
      client.resetAndDestroy();
      return;
    }
    if (opts.refuse !== undefined) {
      client.end(`HTTP/1.1 ${opts.refuse} Refused\r\ncontent-length: 0\r\n\r\n`);
      return;
    }
    const [host, port] = (req.url ?? '').split(':');
    const upstream = connect(Number(port), host!, () => {
      client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      upstream.write(head);
      upstream.pipe(client);
      client.pipe(upstream);
    });
    sockets.add(upstream);
    upstream.on('close', () => sockets.delete(upstream));
    upstream.on('error', () => client.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://${PROXY_USER}:${PROXY_PASSWORD}@127.0.0.1:${port}`,
    tunnels,
    openTunnels: () => open,
    async close() {
      for (const s of sockets) s.destroy();
      // With the idle connections undici keeps to the proxy, which never carried a CONNECT.
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

const start = useStacks();
const proxies: ConnectProxy[] = [];
afterEach(async () => {
  await Promise.all(proxies.splice(0).map((p) => p.close()));
});
async function proxy(opts?: ProxyBehaviour): Promise<ConnectProxy> {
  const p = await startConnectProxy(opts);
  proxies.push(p);
  return p;
}

/**
 * Every route tries the mock through the proxy, then directly; one attempt each, and no `network` in retryOn: a request
 * that may have run is not sent again, and one the proxy refused never ran.
 */
function proxiedThenDirect(proxyUrl: string, route: Partial<ConfigInput['routes'][number]> = {}) {
  return (mockUrl: string): ConfigInput => {
    const base = defaultConfig(mockUrl, RETRY_LOOP_ONLY);
    return {
      ...base,
      providers: { ...base.providers, proxied: { ...base.providers['mock']!, proxy: proxyUrl } },
      routes: base.routes.map((r) => ({ ...r, targets: [{ provider: 'proxied' }, { provider: 'mock' }], retry: { maxAttempts: 1, retryOn: [503] }, ...route })),
    };
  };
}

const BASIC = `Basic ${Buffer.from(`${PROXY_USER}:${PROXY_PASSWORD}`).toString('base64')}`;

describe('a provider behind an egress proxy', () => {
  it('tunnels chat (whole and streamed) through the proxy, with its credentials, and keeps the connection', async () => {
    const p = await proxy();
    const s = await start({ provider: { proxy: p.url } });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 });
    const whole = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    expect(whole.choices[0]?.message.content).toBeTruthy();
    let text = '';
    for await (const chunk of await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true })) {
      text += chunk.choices[0]?.delta.content ?? '';
    }
    expect(text).not.toBe('');
    await client.embeddings.create({ model: 'text-embedding-3-small', input: 'hi' });
    const mockHost = new URL(s.mock.url).host;
    expect(p.tunnels.length).toBeGreaterThanOrEqual(1);
    // Keep-alive through the tunnel: three calls, one after the other, on one tunnel.
    expect(p.tunnels.length).toBeLessThan(3);
    for (const t of p.tunnels) expect(t).toEqual({ target: mockHost, auth: BASIC });
    // The provider's key went through the tunnel to the provider; the proxy's credentials went to the proxy only.
    const seen = s.mock.requests();
    expect(seen.length).toBe(3);
    for (const r of seen) {
      expect(r.headers['authorization']).toBe(`Bearer ${TEST_KEY}`);
      expect(r.headers['proxy-authorization']).toBeUndefined();
    }
    expect(s.logs.join('')).not.toContain(PROXY_PASSWORD);
  });

  it('treats a proxy that refuses the tunnel as a provider out of reach: retried, the provider never reached, a 502 that says so', async () => {
    const p = await proxy({ refuse: 407 });
    const s = await start({ ...RETRY_LOOP_ONLY, provider: { ...RETRY_LOOP_ONLY.provider, proxy: p.url }, route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 }, retryOn: [503, 'network'] } } });
    const res = await fetch(`${s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    });
    const body = (await res.json()) as { error: { message: string; type: string; code: string } };
    expect(res.status).toBe(502);
    expect(res.headers.get('x-should-retry')).toBe('false');
    expect(res.headers.get('x-stormgate-attempts')).toBe('3');
    expect(body.error.message).toContain('egress proxy refused');
    expect(body.error.message).toContain('PROXY_407');
    expect(p.tunnels.length).toBe(3);
    expect(s.mock.requests()).toEqual([]);
    const log = s.logs.join('');
    expect(log).toContain('PROXY_407');
    expect(log).not.toContain(PROXY_PASSWORD);
  });

  it('fails a refused tunnel over to a route without a second run, even where a lost connection would need consent', async () => {
    const p = await proxy({ refuse: 502 });
    const s = await start({ config: proxiedThenDirect(p.url) });
    const res = await fetch(`${s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get('x-stormgate-target')).toContain('mock');
    expect(p.tunnels.length).toBe(1);
  });

  it('bounds a proxy that never answers CONNECT by connectMs: a connect timeout, retried, never past the deadline', async () => {
    const p = await proxy({ hang: true });
    const s = await start({
      ...RETRY_LOOP_ONLY,
      provider: { ...RETRY_LOOP_ONLY.provider, proxy: p.url, timeouts: { connectMs: 300, firstTokenMs: 20_000 } },
      route: { ...RETRY_LOOP_ONLY.route, timeoutMs: 20_000, retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } },
    });
    // Before, undici waited for the proxy's answer to CONNECT for 300 s: a stream hung past its first-token timer and
    // its deadline (the attempt's abort waits for the connection), a whole request ran to its deadline on one attempt.
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0, timeout: 10_000 });
    for (const stream of [true, false]) {
      const started = Date.now();
      const err = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(OpenAI.APIError);
      expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(504);
      expect((err as InstanceType<typeof OpenAI.APIError>).message).toContain('connect timeout');
      expect((err as InstanceType<typeof OpenAI.APIError>).headers?.get('x-stormgate-attempts')).toBe('2');
      expect(Date.now() - started).toBeLessThan(5_000);
    }
    expect(p.tunnels.length).toBe(4);
    // The CONNECTs that were given up on do not stay open at the proxy.
    await expect.poll(() => p.openTunnels(), { timeout: 2_000 }).toBe(0);
  });

  // Before, undici took a closed connection for a passing socket error and opened the next at once: about a thousand
  // CONNECTs a second for one request, until its deadline, and no failover. A reset was an ECONNRESET like one after
  // the request was sent: it "may have run", so the route, with no consent to run a request twice, ended with a 502
  // "could not be reached (last: ECONNRESET)" and no failover.
  it.each([
    ['closes', { drop: true }],
    ['resets', { reset: true }],
  ])('takes a proxy that %s the connection in answer to CONNECT as a refusal: no reconnect loop, failed over without consent', async (_how, fault) => {
    const p = await proxy(fault);
    const s = await start({ config: proxiedThenDirect(p.url, { timeoutMs: 3_000 }) });
    const res = await fetch(`${s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    });
    await res.arrayBuffer();
    expect(res.status).toBe(200);
    expect(res.headers.get('x-stormgate-target')).toContain('mock');
    expect(p.tunnels.length).toBe(1);
    expect((await requestLine(s)).attempts[0]).toMatchObject({ target: 'proxied/gpt-4o', reason: 'network', code: 'PROXY_CLOSED' });
  });

  it('names the proxy\'s refusal in the passthrough\'s 502, as on the managed routes', async () => {
    const p = await proxy({ refuse: 407 });
    const s = await start({
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl);
        return { ...base, providers: { mock: { ...base.providers['mock']!, proxy: p.url } }, passthrough: { provider: 'mock', paths: ['/v1/files'], methods: ['GET'] } };
      },
    });
    const res = await fetch(`${s.baseURL}/files`);
    const body = (await res.json()) as { error: { message: string; code: string } };
    expect(res.status).toBe(502);
    expect(body.error.code).toBe('upstream_unavailable');
    // Before: "(UND_ERR_ABORTED)", undici's code for a request the caller aborted, and no word of the proxy.
    expect(body.error.message).toContain('PROXY_407');
    expect(s.mock.requests()).toEqual([]);
  });

  // Before, a proxy whose port refused the connection (not running, a wrong port in HTTPS_PROXY) gave "upstream
  // proxied/gpt-4o could not be reached (last: ECONNREFUSED)", and the passthrough the same of "the provider": the
  // operator looked at the provider, which the gateway never connects to when it has a proxy.
  it('names the egress proxy (host:port, never its credentials) that could not be reached, and fails over from it', async () => {
    const port = await freePort();
    const down = `http://${PROXY_USER}:${PROXY_PASSWORD}@127.0.0.1:${port}`;
    const s = await start({
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl, RETRY_LOOP_ONLY);
        return {
          ...base,
          providers: { ...base.providers, proxied: { ...base.providers['mock']!, proxy: down } },
          routes: base.routes.map((r) => (r.name === 'embeddings' ? { ...r, targets: [{ provider: 'proxied' }, { provider: 'mock' }] } : { ...r, targets: [{ provider: 'proxied' }] })),
          passthrough: { provider: 'proxied', paths: ['/v1/files'], methods: ['GET'] },
        };
      },
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 });
    const err = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }).then(
      () => undefined,
      (e: unknown) => e as InstanceType<typeof OpenAI.APIError>,
    );
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err!.status).toBe(502);
    expect(err!.message).toContain(`egress proxy 127.0.0.1:${port} could not be reached`);
    expect(err!.message).toContain('ECONNREFUSED');
    expect(err!.message).not.toContain(PROXY_PASSWORD);
    expect(err!.message).not.toContain(PROXY_USER);
    // Nothing reached the provider: the next target takes the request, without the route's consent to a second run.
    const answer = await client.embeddings.create({ model: 'text-embedding-3-small', input: 'hi' }).withResponse();
    expect(answer.response.headers.get('x-stormgate-target')).toContain('mock');
    const res = await fetch(`${s.baseURL}/files`);
    const body = (await res.json()) as { error: { message: string; code: string } };
    expect(res.status).toBe(502);
    expect(body.error.code).toBe('upstream_unavailable');
    expect(body.error.message).toContain(`egress proxy 127.0.0.1:${port} could not be reached`);
    expect(body.error.message).not.toContain(PROXY_PASSWORD);
    expect(s.mock.requests().map((r) => r.path)).toEqual(['/v1/embeddings']);
    expect(s.logs.join('')).not.toContain(PROXY_PASSWORD);
  });

  it('answers GET /v1/models within its time when the proxy never answers CONNECT', async () => {
    const p = await proxy({ hang: true });
    const s = await start({ provider: { proxy: p.url, timeouts: { connectMs: 300 } } });
    const started = Date.now();
    const res = await fetch(`${s.url}/v1/models`, { signal: AbortSignal.timeout(10_000) });
    await res.arrayBuffer();
    expect(Date.now() - started).toBeLessThan(5_000);
  });

  it('tunnels the passthrough through the same proxy', async () => {
    const p = await proxy();
    const s = await start({
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl);
        return { ...base, providers: { mock: { ...base.providers['mock']!, proxy: p.url } }, passthrough: { provider: 'mock', paths: ['/v1/files'], methods: ['GET'] } };
      },
    });
    const res = await fetch(`${s.baseURL}/files`);
    await res.arrayBuffer();
    expect(s.mock.requests().map((r) => r.path)).toEqual(['/v1/files']);
    expect(p.tunnels).toEqual([{ target: new URL(s.mock.url).host, auth: BASIC }]);
  });
  it('sends a user without a password (a token as the user name, as some proxies take it) as Basic credentials', async () => {
    const p = await proxy();
    const tokenOnly = p.url.replace(`${PROXY_USER}:${PROXY_PASSWORD}@`, `${PROXY_PASSWORD}@`);
    const s = await start({ provider: { proxy: tokenOnly } });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', maxRetries: 0 });
    await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    // undici sends credentials only for a user with a password: a token alone was dropped without a word.
    expect(p.tunnels.map((t) => t.auth)).toEqual([`Basic ${Buffer.from(`${PROXY_PASSWORD}:`).toString('base64')}`]);
  });
});

describe('the proxy setting', () => {
  const yaml = (proxyLine: string) => `
providers:
  openai: { family: openai, baseUrl: "http://127.0.0.1:9/v1", apiKey: k, ${proxyLine} }
routes:
  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: openai } ] }
`;

  it('reads an unset variable as no proxy', () => {
    const config = parseConfig(yaml('proxy: "${STORMGATE_TEST_UNSET_PROXY:-}"'), 'gateway.yaml', {});
    expect(config.providers['openai']!.proxy).toBe('');
  });

  it('refuses a password with a % that is not percent-encoding at start-up, saying how to write it, never the password', () => {
    // Before, undici's decodeURIComponent threw "URIError: URI malformed" with a stack trace when the gateway started.
    const env = { HTTPS_PROXY: `http://u:50%off-${PROXY_PASSWORD}@proxy:3128` };
    expect(() => parseConfig(yaml('proxy: "${HTTPS_PROXY}"'), 'gateway.yaml', env)).toThrow(/providers\.openai\.proxy.*%25/s);
    try {
      parseConfig(yaml('proxy: "${HTTPS_PROXY}"'), 'gateway.yaml', env);
    } catch (e) {
      expect(String(e)).not.toContain(PROXY_PASSWORD);
    }
    // Percent-encoded, it is taken.
    expect(parseConfig(yaml('proxy: "${HTTPS_PROXY}"'), 'gateway.yaml', { HTTPS_PROXY: `http://u:50%25off%40x@proxy:3128` }).providers['openai']!.proxy).toBe('http://u:50%25off%40x@proxy:3128');
  });

  it('refuses what is not an http(s) URL, naming the path and never the value of the variable', () => {
    expect(() => parseConfig(yaml('proxy: "${HTTPS_PROXY}"'), 'gateway.yaml', { HTTPS_PROXY: `socks9://u:${PROXY_PASSWORD}@proxy:1080` })).toThrow(/providers\.openai\.proxy: expected an http:\/\/ or https:\/\/ proxy URL/);
    try {
      parseConfig(yaml('proxy: "${HTTPS_PROXY}"'), 'gateway.yaml', { HTTPS_PROXY: `socks9://u:${PROXY_PASSWORD}@proxy:1080` });
    } catch (e) {
      expect(String(e)).not.toContain(PROXY_PASSWORD);
    }
  });
});
