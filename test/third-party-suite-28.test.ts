// A twenty-eighth third-party suite, written from the README alone ("Streaming", "Deadlines and timeouts", "What the
// client sees", "Headers", "Client keys" (allowedHosts), "Errors", "Health, readiness, shutdown" and "Deployment") as a
// platform team would test THE GATEWAY BEHIND A REVERSE PROXY before production: a real nginx (Debian's nginx-light,
// started by the test as an unprivileged-style process, test/helpers/nginx.ts) in front of one gateway and, in an
// upstream block, of two. Two nginx setups: as installed (a bare proxy_pass: HTTP/1.0 to the gateway, proxy_buffering
// on, proxy_read_timeout 60 s, client_max_body_size 1m) and the usual LLM one (HTTP/1.1 kept alive, buffering off).
// Questions: do streams pass event by event with their first token at once, and whole answers intact, on both; does a
// client's abort through nginx (mid-stream, during a backoff) reach the gateway and end the upstream request; what
// happens when nginx's proxy_read_timeout is shorter than the gateway's retries (504s, the SDK's retries, ghosts); what
// nginx's proxy_next_upstream does with the gateway's own errors (attempts the provider saw: nginx tries x gateway
// retries x SDK retries); do x-should-retry and retry-after reach the SDK through nginx; keep-alive timeouts on both
// sides under bursts with idle gaps; a SIGTERM drain of one of two gateway processes behind nginx; body limits on both
// sides; the X-Forwarded-* / X-Real-IP / Host headers nginx adds. Black box over real HTTP, the official `openai` SDK
// (6.x) as the client, the bundled mock upstream; bounds generous (a loaded 2-core machine).
// Found: no gateway bug. Everything the README promises held through nginx: x-accel-buffering: no streams through
// nginx's default buffering (and ignoring it, nginx held the stream to its end), HTTP/1.0 streams close-delimited,
// aborts and nginx's own timeouts end the gateway's work (no ghost attempts), x-should-retry and retry-after-ms passed
// on, forwarding headers never reach the provider, a drain lost no call at the SDK's default retries (nginx's connect
// to the drained instance was refused and it went on to the other). What the README lacked, now in "Deployment" (Behind nginx): nginx's defaults
// that hurt. proxy_read_timeout 60 s below the default timeoutMs 120 s gives clients nginx's HTML 504, which the SDK
// retries (1 call: 3 SDK requests, 9 upstream attempts); client_max_body_size 1m below bodyLimitBytes gives nginx's
// own 413; proxy_next_upstream with http_50x non_idempotent replays each gateway error after its retries (4 upstream
// attempts for a maxAttempts of 2). Measured, not asserted: with the keep-alive timeouts the wrong way round (the
// gateway's 400 ms, nginx's 60 s) and bursts 396-404 ms apart, 0 of 120 calls failed on loopback (the race the README
// warns of did not show here). Design question, not built: open-source nginx does not read /readyz, so during
// preStopMs it keeps sending to a draining instance (served, with Connection: close) and moves on only when the port
// refuses connections; the connections nginx kept idle meanwhile are closed by the gateway at the end of preStopMs,
// and in about one run in three a POST nginx had just written into one was reset: nginx's own 502 (not replayed, a
// POST), retried by the SDK. Inherent to closing a kept HTTP/1.1 connection; now in the README, with "keep the SDK's
// retries on".
import { setTimeout as sleep } from 'node:timers/promises';
import { freePort } from './helpers/free-port.ts';
import { useGatewayProcesses, waitReady } from './helpers/gateway-process.ts';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import type { MockServer } from '../src/mock/server.ts';
import { useNginx, type Nginx } from './helpers/nginx.ts';
import { expectOpenAIError, sdkError } from './helpers/openai-error.ts';
import { defaultConfig, RETRY_LOOP_ONLY, useExtraMocks, useGateways, useStacks, type Stack, type StackOptions } from './helpers/stack.ts';

const startNginx = useNginx();
const startStack = useStacks();
const startMock = useExtraMocks();
const startGateway = useGateways();
const startProcess = useGatewayProcesses();

type RouteInput = ConfigInput['routes'][number];

const CHAT = '/v1/chat/completions';
const PROMPT = 'Summarise the ingress runbook for me.';
const messages = [{ role: 'user' as const, content: PROMPT }];
const ANSWER = `Mock answer to: ${PROMPT.slice(0, 40)}`;

// ---------------------------------------------------------------------------------------------------------------
// The two nginx setups a platform team meets: nginx as installed (a bare proxy_pass), and the setup LLM guides give.

/**
 * nginx at its defaults: `proxy_pass` and nothing else, so HTTP/1.0 to the gateway with a new connection per request,
 * proxy_buffering on, proxy_read_timeout 60 s, client_max_body_size 1m, proxy_next_upstream `error timeout`.
 */
const atDefaults = (origin: string, location = '') => `server { listen PORT; location / { proxy_pass ${origin}; ${location} } }`;

/**
 * The usual LLM ingress: HTTP/1.1 kept alive to the gateways (an upstream block with `keepalive`), no buffering, a read
 * timeout above the routes' timeoutMs and a body limit above the gateway's bodyLimitBytes.
 */
const llmSetup = (origins: string[], o: { location?: string; upstream?: string; readTimeout?: string } = {}) => `
upstream gateways { ${origins.map((u) => `server ${new URL(u).host};`).join(' ')} keepalive 16; ${o.upstream ?? ''} }
server { listen PORT; location / {
  proxy_pass http://gateways; proxy_http_version 1.1; proxy_set_header Connection "";
  proxy_buffering off; proxy_read_timeout ${o.readTimeout ?? '130s'}; client_max_body_size 11m; ${o.location ?? ''} } }`;

const SETUPS = [
  { name: 'nginx at its defaults', conf: (origin: string) => atDefaults(origin) },
  { name: 'the usual LLM setup', conf: (origin: string) => llmSetup([origin]) },
] as const;

/** An SDK client of the gateway through nginx; no retries of its own unless asked. */
const clientOf = (ng: Nginx, opts: NonNullable<ConstructorParameters<typeof OpenAI>[0]> = {}) =>
  new OpenAI({ baseURL: `${ng.url}/v1`, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0, ...opts });

/** A stack whose gateway records the HTTP version and the connections of what reaches it (nginx, here). */
async function watchedStack(opts: StackOptions = {}): Promise<Stack & { versions: string[]; connections: () => number }> {
  const s = await startStack(opts);
  const versions: string[] = [];
  let connections = 0;
  s.gateway.server.on('request', (req: { httpVersion: string }) => versions.push(req.httpVersion));
  s.gateway.server.on('connection', () => connections++);
  return Object.assign(s, { versions, connections: () => connections });
}

/** A streamed chat completion: its text and when each piece of it arrived (ms from the call). */
async function timedStream(client: OpenAI, signal?: AbortSignal, onPiece?: (n: number) => void): Promise<{ text: string; at: number[] }> {
  const t0 = performance.now();
  const stream = await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }, { signal });
  const at: number[] = [];
  let text = '';
  for await (const chunk of stream) {
    const piece = chunk.choices[0]?.delta?.content;
    if (!piece) continue;
    text += piece;
    at.push(performance.now() - t0);
    onPiece?.(at.length);
  }
  return { text, at };
}

async function eventually(what: string, check: () => boolean, timeoutMs = 5_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > end) throw new Error(`not in ${timeoutMs} ms: ${what}`);
    await sleep(25);
  }
}

const upstreamChats = (mock: MockServer) => mock.requests().filter((r) => r.path === CHAT);

/** An SDK client through nginx at the SDK's default retries, whose HTTP requests are counted. */
function countingClient(ng: Nginx): { client: OpenAI; sent: () => number } {
  let sent = 0;
  const client = clientOf(ng, {
    maxRetries: 2,
    fetch: async (url, init) => {
      sent++;
      return fetch(url, init);
    },
  });
  return { client, sent: () => sent };
}

/** Gateways in front of one mock, all of the default config with the route changed as given. */
async function gatewaysOf(mock: MockServer, n: number, route: Partial<RouteInput>): Promise<string[]> {
  const config = ConfigSchema.parse(defaultConfig(mock.url, { ...RETRY_LOOP_ONLY, route: { ...RETRY_LOOP_ONLY.route, ...route } }));
  return Promise.all(Array.from({ length: n }, () => startGateway(config)));
}

const FAST_RETRY: Partial<RouteInput> = { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 10, capMs: 10 } } };

// ---------------------------------------------------------------------------------------------------------------

describe('streams and answers through nginx', () => {
  it.each(SETUPS)('$name: a stream arrives event by event, its first token at once, the answer whole', async ({ conf }) => {
    const s = await watchedStack({ faults: { stream: { chunks: 6, chunkDelayMs: 250 } } });
    const ng = await startNginx(conf(s.url));
    const { text, at } = await timedStream(clientOf(ng));
    expect(text).toBe(ANSWER);
    // Six pieces 250 ms apart: passed on as they came, not held until the end (x-accel-buffering: no does this
    // for nginx's default proxy_buffering on).
    expect(at).toHaveLength(6);
    expect(at.at(-1)! - at[0]!).toBeGreaterThan(900);
    // A whole answer through the same nginx, and the gateway saw what nginx sends it.
    const whole = await clientOf(ng).chat.completions.create({ model: 'gpt-4o', messages });
    expect(whole.choices[0]!.message.content).toBe(ANSWER);
    expect(new Set(s.versions)).toEqual(new Set([conf === SETUPS[0].conf ? '1.0' : '1.1']));
  });

  it('nginx told to ignore x-accel-buffering (buffering on) holds the stream to its end: the header is what streams it', async () => {
    const s = await watchedStack({ faults: { stream: { chunks: 6, chunkDelayMs: 250 } } });
    const ng = await startNginx(atDefaults(s.url, 'proxy_ignore_headers X-Accel-Buffering;'));
    const { text, at } = await timedStream(clientOf(ng));
    expect(text).toBe(ANSWER);
    expect(at.at(-1)! - at[0]!).toBeLessThan(300);
  });

  it('the usual LLM setup keeps its connections to the gateway: 30 calls, a handful of connections, no error', async () => {
    const s = await watchedStack({ faults: { stream: { chunks: 3 } } });
    const ng = await startNginx(llmSetup([s.url]));
    const client = clientOf(ng);
    for (let round = 0; round < 10; round++) {
      const [a, b, c] = await Promise.all([
        timedStream(client),
        client.chat.completions.create({ model: 'gpt-4o', messages }),
        client.embeddings.create({ model: 'text-embedding-3-small', input: 'x' }),
      ]);
      expect(a.text).toBe(ANSWER);
      expect(b.choices[0]!.message.content).toBe(ANSWER);
      expect(c.data).toHaveLength(1);
    }
    expect(s.connections()).toBeLessThanOrEqual(6);
    expect(ng.accessLog().filter((e) => e.status !== 200)).toEqual([]);
  });
});

describe('a client that leaves, through nginx', () => {
  it.each(SETUPS)('$name: an abort mid-stream reaches the provider', async ({ conf }) => {
    const s = await watchedStack({ faults: { stream: { chunks: 6, stallAfterChunks: 2 } } });
    const ng = await startNginx(conf(s.url));
    const ac = new AbortController();
    // The SDK ends its stream quietly on the client's own abort.
    const { at } = await timedStream(clientOf(ng), ac.signal, (n) => n === 2 && ac.abort());
    expect(at).toHaveLength(2);
    await eventually('the provider saw the stream aborted', () => upstreamChats(s.mock)[0]?.aborted === true);
    await expect.poll(() => s.mock.stats().inflight, { timeout: 2_000 }).toBe(0);
  });

  it.each(SETUPS)('$name: an abort during a retry backoff ends the retries (no ghost attempts)', async ({ conf }) => {
    const s = await watchedStack({
      faults: { errors: [{ status: 503 }] },
      ...RETRY_LOOP_ONLY,
      route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 4, backoff: { strategy: 'fixed', baseMs: 1_500, capMs: 1_500 } } },
    });
    const ng = await startNginx(conf(s.url));
    const ac = new AbortController();
    const call = clientOf(ng).chat.completions.create({ model: 'gpt-4o', messages }, { signal: ac.signal }).catch((e: unknown) => e);
    await eventually('the first attempt', () => upstreamChats(s.mock).length === 1);
    await sleep(300);
    ac.abort();
    expect(await call).toBeInstanceOf(Error);
    // The backoff would have sent attempt 2 at 1.5 s and attempt 3 at 3 s.
    await sleep(3_500);
    expect(upstreamChats(s.mock)).toHaveLength(1);
  });
});

describe("nginx's proxy_read_timeout against the gateway's deadline", () => {
  const slowRetries: StackOptions = {
    faults: { errors: [{ status: 503 }] },
    ...RETRY_LOOP_ONLY,
    route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 8, backoff: { strategy: 'fixed', baseMs: 400, capMs: 400 } } },
  };

  it("shorter than the gateway's retries: nginx's own 504, which the SDK sends again, each time a retry series; none outlives nginx", async () => {
    const s = await watchedStack(slowRetries);
    const ng = await startNginx(llmSetup([s.url], { readTimeout: '1s' }));
    const { client, sent } = countingClient(ng);
    const err = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages }));
    // nginx's HTML page: no OpenAI error, no x-should-retry, so the SDK retried it as any 504.
    expect(err.status).toBe(504);
    expect(err.code).toBeUndefined();
    expect(err.headers?.get('x-should-retry')).toBeNull();
    expect(sent()).toBe(3);
    expect(ng.accessLog().map((e) => e.status)).toEqual([504, 504, 504]);
    // nginx closed its connection at each timeout: the gateway stopped there (no ghost retries after the last one).
    const attempts = upstreamChats(s.mock).length;
    expect(attempts).toBeGreaterThanOrEqual(5);
    await sleep(1_500);
    expect(upstreamChats(s.mock)).toHaveLength(attempts);
    await expect.poll(() => s.mock.stats().inflight, { timeout: 2_000 }).toBe(0);
    console.info(`proxy_read_timeout 1s < the gateway's retries: 1 call, 3 SDK requests, ${attempts} upstream attempts`);
  });

  it("the route's timeoutMs below proxy_read_timeout: the gateway's own answer, x-should-retry: false, one SDK request", async () => {
    const s = await watchedStack({ ...slowRetries, route: { ...slowRetries.route, timeoutMs: 900 } });
    const ng = await startNginx(llmSetup([s.url], { readTimeout: '1s' }));
    const { client, sent } = countingClient(ng);
    const err = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages }));
    expect(err.status).toBe(503);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(sent()).toBe(1);
    expect(upstreamChats(s.mock).length).toBeLessThanOrEqual(2);
  });
});

describe('two gateways in an nginx upstream block', () => {
  it("nginx's default proxy_next_upstream never replays a POST a gateway answered: the provider sees one retry series", async () => {
    const mock = await startMock({ faults: { errors: [{ status: 503 }] } });
    const ng = await startNginx(llmSetup(await gatewaysOf(mock, 2, FAST_RETRY)));
    const { client, sent } = countingClient(ng);
    const err = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages }));
    expect(err.status).toBe(503);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(sent()).toBe(1);
    expect(ng.accessLog()[0]!.tries).toHaveLength(1);
    expect(upstreamChats(mock)).toHaveLength(2);
  });

  it('proxy_next_upstream http_503 non_idempotent multiplies: every nginx try is a whole retry series of a gateway', async () => {
    const mock = await startMock({ faults: { errors: [{ status: 503 }] } });
    const gws = await gatewaysOf(mock, 2, FAST_RETRY);
    const ng = await startNginx(llmSetup(gws, { location: 'proxy_next_upstream error timeout http_502 http_503 http_504 non_idempotent;' }));
    const { client, sent } = countingClient(ng);
    const err = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages }));
    expect(err.status).toBe(503);
    expect(sent()).toBe(1);
    expect(ng.accessLog()[0]!.tries.map((t) => t.status)).toEqual(['503', '503']);
    expect(upstreamChats(mock)).toHaveLength(4);
  });

  it('a gateway that is down: nginx sends the POST to the other one (nothing was sent), every client answered', async () => {
    const mock = await startMock();
    const [up] = await gatewaysOf(mock, 1, {});
    const down = `http://127.0.0.1:${await freePort()}`;
    const ng = await startNginx(llmSetup([down, up!]));
    const client = clientOf(ng);
    for (let i = 0; i < 6; i++) expect((await client.chat.completions.create({ model: 'gpt-4o', messages })).choices[0]!.message.content).toBe(ANSWER);
    expect(upstreamChats(mock)).toHaveLength(6);
    expect(ng.accessLog().every((e) => e.status === 200)).toBe(true);
  });

  it("a provider's wait hint reaches the SDK through nginx: 429 with x-should-retry: true and retry-after-ms, then a hold-off", async () => {
    const mock = await startMock({ faults: { errors: [{ status: 429, code: 'rate_limit_exceeded', headers: { 'retry-after': '30' }, times: 1 }] } });
    const ng = await startNginx(llmSetup(await gatewaysOf(mock, 1, FAST_RETRY)));
    const client = clientOf(ng);
    const first = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages }));
    expect(first.status).toBe(429);
    expect(first.headers?.get('x-should-retry')).toBe('true');
    expect(Number(first.headers?.get('retry-after-ms'))).toBeGreaterThanOrEqual(30_000);
    expect(Number(first.headers?.get('retry-after'))).toBeGreaterThanOrEqual(30);
    const second = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages }));
    expect(second.status).toBe(429);
    expectOpenAIError({ error: second.error }, 'provider_held_off', 'rate_limit_error');
    expect(second.headers?.get('x-should-retry')).toBe('true');
    expect(upstreamChats(mock)).toHaveLength(1);
  });
});

describe('keep-alive between nginx and the gateway', () => {
  /** Bursts of concurrent calls with idle gaps between them; every status nginx answered. */
  async function bursts(ng: Nginx, gapsMs: number[]): Promise<number[]> {
    const client = clientOf(ng);
    const statuses: number[] = [];
    for (const gap of [0, ...gapsMs]) {
      await sleep(gap);
      const answers = await Promise.all(
        Array.from({ length: 8 }, () =>
          client.chat.completions.create({ model: 'gpt-4o', messages }).then(
            () => 200,
            (e: unknown) => (e instanceof OpenAI.APIError ? (e.status ?? 0) : -1),
          ),
        ),
      );
      statuses.push(...answers);
    }
    return statuses;
  }
  const withKeepAlive = (keepAliveTimeoutMs: number): StackOptions => ({
    config: (mockUrl) => {
      const base = defaultConfig(mockUrl);
      return { ...base, server: { ...base.server, keepAliveTimeoutMs } };
    },
  });

  it("nginx's keepalive_timeout below the gateway's keepAliveTimeoutMs: bursts with idle gaps get no 502", async () => {
    const s = await watchedStack(withKeepAlive(1_500));
    const ng = await startNginx(llmSetup([s.url], { upstream: 'keepalive_timeout 400ms;' }));
    const statuses = await bursts(ng, [300, 450, 1_600, 380, 900, 420, 2_000, 350, 600, 410]);
    expect(statuses.filter((st) => st !== 200)).toEqual([]);
    expect(ng.errorLog()).not.toMatch(/upstream prematurely closed|reset by peer/);
  });
});

describe('a graceful drain behind nginx', () => {
  it('SIGTERM to one of two gateway processes: no call through nginx fails (the SDK at its default retries), the other gateway takes over', async () => {
    const mock = await startMock({ faults: { latencyMs: 60 } });
    const ports = [await freePort(), await freePort()];
    const pods = ports.map((port, i) => {
      const base = defaultConfig(mock.url);
      return startProcess(`gw${i}`, { ...base, routes: [base.routes[0]], server: { ...base.server, port, logLevel: 'warn' }, drain: { preStopMs: 800, graceMs: 3_000 } });
    });
    await Promise.all(pods.map((p, i) => waitReady(p, ports[i]!)));
    const ng = await startNginx(llmSetup(ports.map((p) => `http://127.0.0.1:${p}`)));
    // The SDK at its default retries: nginx's own 502 (no x-should-retry) is retried by it, as any 502.
    const { client, sent } = countingClient(ng);
    const statuses: number[] = [];
    let stop = false;
    const loops = Array.from({ length: 6 }, async () => {
      while (!stop) {
        statuses.push(
          await client.chat.completions.create({ model: 'gpt-4o', messages }).then(
            () => 200,
            (e: unknown) => (e instanceof OpenAI.APIError ? (e.status ?? 0) : -1),
          ),
        );
      }
    });
    await sleep(1_000);
    pods[0]!.proc.kill('SIGTERM');
    expect(await pods[0]!.exited).toBe(0);
    const afterExit = statuses.length;
    await sleep(1_000);
    stop = true;
    await Promise.all(loops);
    const drained = `127.0.0.1:${ports[0]}`;
    const log = ng.accessLog();
    expect(statuses.length).toBeGreaterThan(afterExit);
    const errors = ng.errorLog().split('\n').filter((l) => l.includes('[error]'));
    expect(statuses.filter((st) => st !== 200), `${JSON.stringify(log.filter((e) => e.status !== 200))}\n${errors.join('\n')}`).toEqual([]);
    // What nginx answered itself: a POST it had written into a kept connection just as the draining gateway closed it
    // (an idle one, at the end of preStopMs) is a 502 nginx may not replay; seen in some runs, never more than one.
    const nginx502 = log.filter((e) => e.status === 502).length;
    expect(nginx502).toBeLessThanOrEqual(2);
    expect(sent()).toBe(statuses.length + nginx502);
    console.info(`drain behind nginx: ${statuses.length} calls; nginx sent ${log.filter((e) => e.tries.some((t) => t.addr === drained)).length} to the drained gateway, ${log.filter((e) => e.tries.length > 1).length} on to the other after a refused connect, ${nginx502} answered 502 (retried by the SDK)`);
  });
});

describe('limits and headers nginx adds', () => {
  const bigBody = (bytes: number) => [{ role: 'user' as const, content: 'x'.repeat(bytes) }];

  it("nginx's default client_max_body_size (1m) answers a 2 MB prompt with its own 413; set above bodyLimitBytes, the gateway's", async () => {
    const s = await watchedStack();
    const atDefault = await startNginx(atDefaults(s.url));
    const refused = await sdkError(clientOf(atDefault).chat.completions.create({ model: 'gpt-4o', messages: bigBody(2 * 1024 * 1024) }));
    expect(refused.status).toBe(413);
    expect(refused.code).toBeUndefined();
    const ng = await startNginx(llmSetup([s.url]));
    const ok = await clientOf(ng).chat.completions.create({ model: 'gpt-4o', messages: bigBody(2 * 1024 * 1024) });
    expect(ok.choices[0]!.message.content).toMatch(/^Mock answer to: x+$/);
    const tooLarge = await sdkError(clientOf(ng).chat.completions.create({ model: 'gpt-4o', messages: bigBody(10.5 * 1024 * 1024) }));
    expect(tooLarge.status).toBe(413);
    expectOpenAIError({ error: tooLarge.error }, 'request_too_large');
  });

  it('X-Forwarded-For, X-Real-IP and a public Host: never sent to the provider; the Host needs server.allowedHosts', async () => {
    const headers = `proxy_set_header Host llm.example.com; proxy_set_header X-Real-IP $remote_addr;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for; proxy_set_header X-Forwarded-Proto $scheme; proxy_set_header Forwarded "for=127.0.0.1";`;
    const refusedStack = await watchedStack();
    const refusing = await startNginx(llmSetup([refusedStack.url], { location: headers }));
    const refused = await sdkError(clientOf(refusing).chat.completions.create({ model: 'gpt-4o', messages }));
    expect(refused.status).toBe(403);
    expectOpenAIError({ error: refused.error }, 'host_not_allowed');

    const s = await watchedStack({
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl);
        return { ...base, server: { ...base.server, allowedHosts: ['llm.example.com'] } };
      },
    });
    const ng = await startNginx(llmSetup([s.url], { location: headers }));
    const client = clientOf(ng, { defaultHeaders: { 'x-forwarded-for': '203.0.113.7' } });
    await client.chat.completions.create({ model: 'gpt-4o', messages });
    await timedStream(client);
    for (const seen of upstreamChats(s.mock)) {
      expect(Object.keys(seen.headers).filter((h) => h.startsWith('x-forwarded') || ['x-real-ip', 'forwarded', 'host'].includes(h) && seen.headers[h]!.includes('example'))).toEqual([]);
    }
    expect(upstreamChats(s.mock)).toHaveLength(2);
  });
});
