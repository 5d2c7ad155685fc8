// Third-party failure-scenario suite 59: RESOURCES under faults, as an operator running the gateway for weeks meets
// them. One gateway in-process (buildServer, as test/helpers/stack.ts does; its file descriptors and timers are this
// process's, so /proc/self/fd and process.getActiveResourcesInfo() read them) or as a process (/proc/<pid>/fd, RSS),
// in front of the bundled mock or a node:http upstream of the suite's own that trickles, driven over real HTTP by the
// openai SDK on undici Agents of the suite's own (closed before each "after" reading, so what is left is the gateway's).
// Written from the README ("Deadlines and timeouts", "Streaming", "Priority pools" on waiting bodies, "Logs and
// metrics" on bounded labels, "Retry budget ..." on Redis keys expiring):
// - a storm of 503s, resets, hangs, cuts, stalls, client aborts and deadlines: file descriptors, timers, sockets to the
//   provider and the gauges all back to their baseline; never more connections to the provider than maxConnections;
//   idle ones closed after keepAliveMs;
// - an upstream that trickles a huge whole answer one byte per 100 ms: bounded by responseMs per attempt, or by the
//   client's deadline; a stream that trickles bytes never completing an event, or pings forever before its first
//   output: bounded by idleMs / firstTokenMs; every trickling upstream request closed;
// - 200 concurrent streams, half aborted at seeded points: the other half whole, every abort seen upstream;
// - the heap across repeated rounds of 1 MB answers through 503s and cuts, and of 10 MB bodies near bodyLimitBytes
//   retried through 503s behind a small pool (the body resent intact, the waiting bytes back to 0);
// - distinct model names, wrong client keys, unknown paths, odd priorities and request ids in two rounds: the
//   /metrics series do not grow in the second round;
// - a fleet state in a real redis-server: no connection per request, every key with an expiry, no key per request;
// - the gateway as a process, three storms: its fd count back to baseline after each, its RSS not climbing;
// - close() with streams running, requests parked and calls hung: every descriptor and timer it took given back.
// Found here: no leak (16 scenarios pass). Noted for readers of such checks: undici unrefs its idle sockets, so the
// process's active handles miss the gateway's kept connections (the kernel's table is read instead), and
// expect.poll's own timers count as active Timeouts (readings are taken between finished sleeps).
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import OpenAI from 'openai';
import { Agent, fetch as undiciFetch, request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import { startMock, type FaultSpec, type MockServer } from '../src/mock/server.ts';
import { leftOver } from './helpers/cancel-storm.ts';
import { freePort } from './helpers/free-port.ts';
import { killNow, useGatewayProcesses, waitReady } from './helpers/gateway-process.ts';
import { startRedis, type RedisHandle } from './helpers/redis-server.ts';
import { seededRandom } from '../src/policy/random.ts';
import { pooled, sdkOn, settledHeap, tally, useInProcessGateways } from './helpers/in-process.ts';
import type { MetricSample } from './helpers/stack.ts';

const MB = 1024 * 1024;
const PROVIDER_KEY = 'sk-prov-suite59-0123456789abcdef';
const CLIENT_KEY = 'sk-client-suite59-0123456789';

// A forced GC without --expose-gc (as test/third-party-suite-41.test.ts does).
/**
 * The gateway's TCP connections to a provider's port, from the kernel's table (undici unrefs its idle sockets, so the
 * process's active handles do not show the ones it keeps): ESTABLISHED, and CLOSE_WAIT (the provider closed it, the
 * gateway has not yet: a socket left open). The table is the whole machine's (every test process, other runs): only the
 * sockets this process holds a descriptor of are counted.
 */
function connectionsTo(port: number): number {
  const hex = `:${port.toString(16).toUpperCase().padStart(4, '0')}`;
  const mine = ownSocketInodes();
  let n = 0;
  for (const file of ['/proc/self/net/tcp', '/proc/self/net/tcp6']) {
    let text = '';
    try {
      text = readFileSync(file, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const cols = line.trim().split(/\s+/);
      // sl, local_address, rem_address, st (01 ESTABLISHED, 08 CLOSE_WAIT), ..., inode (the tenth).
      if (cols[2]?.endsWith(hex) && (cols[3] === '01' || cols[3] === '08') && mine.has(cols[9]!)) n++;
    }
  }
  return n;
}

const fds = () => readdirSync('/proc/self/fd').length;

/** The inodes of the sockets this process has descriptors of (`socket:[123]` links in /proc/self/fd). */
function ownSocketInodes(): Set<string> {
  const inodes = new Set<string>();
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/self/fd/${fd}`));
      if (m) inodes.add(m[1]!);
    } catch {
      // Closed between the listing and the read.
    }
  }
  return inodes;
}
const timers = () => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;

/**
 * Waits (up to `withinMs`) until `value()` is at most `max`, and answers the last reading. Read between sleeps that
 * have ended, so no timer of the wait itself is counted (expect.poll's would be).
 */
async function settlesTo(value: () => number, max: number, withinMs = 5_000): Promise<number> {
  const until = Date.now() + withinMs;
  for (;;) {
    const v = value();
    if (v <= max || Date.now() > until) return v;
    await sleep(100);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Starting things, and closing them after each test.

const { startGateway, closeAfter } = useInProcessGateways();

type ProviderInput = ConfigInput['providers'][string];
type RouteInput = ConfigInput['routes'][number];

function gatewayConfig(upstream: string, o: { provider?: Partial<ProviderInput>; route?: Partial<RouteInput>; extra?: Partial<ConfigInput> } = {}): ConfigInput {
  return {
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    providers: {
      p: {
        family: 'openai',
        baseUrl: `${upstream}/v1`,
        apiKey: PROVIDER_KEY,
        maxConnections: 16,
        ...o.provider,
        timeouts: { connectMs: 1_000, firstTokenMs: 2_000, idleMs: 1_000, keepAliveMs: 1_000, ...o.provider?.timeouts },
      } as ProviderInput,
    },
    routes: [
      {
        name: 'chat',
        match: { path: '/v1/chat/completions' },
        targets: [{ provider: 'p' }],
        timeoutMs: 10_000,
        minAttemptMs: 200,
        retry: { maxAttempts: 2, backoff: { baseMs: 50, capMs: 200 } },
        budget: { ratio: 1, windowS: 10, minRetriesPerSecond: 200 },
        ...o.route,
      } as RouteInput,
    ],
    ...o.extra,
  };
}

async function mockWith(faults: FaultSpec): Promise<MockServer> {
  const mock = await startMock({ quiet: true, faults });
  closeAfter(mock);
  return mock;
}

const sdk = (url: string, agent: Agent, opts: { maxRetries?: number; apiKey?: string } = {}): OpenAI => sdkOn(url, agent, { apiKey: CLIENT_KEY, ...opts });

const statusOf = (err: unknown): string =>
  err instanceof OpenAI.APIUserAbortError
    ? 'aborted'
    : err instanceof OpenAI.APIError && err.status !== undefined
      ? `status ${err.status}`
      : err instanceof OpenAI.APIError
        ? `stream error ${(err.error as { code?: string } | undefined)?.code ?? err.message.slice(0, 40)}`
        : `error ${(err as Error).message.slice(0, 60)}`;


const series = (samples: MetricSample[], name: string) => samples.filter((s) => s.name === name);
const sum = (samples: MetricSample[], name: string, labels: Record<string, string> = {}) =>
  series(samples, name)
    .filter((s) => Object.entries(labels).every(([k, v]) => s.labels[k] === v))
    .reduce((n, s) => n + s.value, 0);

// ---------------------------------------------------------------------------------------------------------------
// An upstream of the suite's own, for what the mock does not do (trickles, big answers, bodies recorded by hash).

interface Upstream {
  origin: string;
  /** Requests whose response has not closed yet (a gateway that leaves closes it). */
  open(): number;
  sockets(): number;
  requests: number;
  close(): Promise<void>;
}

type Handler = (req: IncomingMessage, res: ServerResponse, body: Buffer, n: number) => void | Promise<void>;

async function startUpstream(handler: Handler): Promise<Upstream> {
  let open = 0;
  const sockets = new Set<Socket>();
  const server: Server = createServer((req, res) => {
    const n = u.requests++;
    open++;
    res.on('close', () => open--);
    const parts: Buffer[] = [];
    req.on('data', (d: Buffer) => parts.push(d));
    req.on('end', () => void Promise.resolve(handler(req, res, Buffer.concat(parts), n)).catch(() => res.destroy()));
  });
  server.keepAliveTimeout = 300;
  server.on('connection', (s: Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const u: Upstream = {
    origin: `http://127.0.0.1:${(server.address() as { port: number }).port}`,
    open: () => open,
    sockets: () => sockets.size,
    requests: 0,
    close: async () => {
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    },
  };
  closeAfter(u);
  return u;
}

const errorBody = (message: string, type = 'server_error') => JSON.stringify({ error: { message, type, param: null, code: null } });
const chunk = (delta: Record<string, string>, finish: string | null = null) =>
  `data: ${JSON.stringify({ id: 'chatcmpl-59', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
const completion = (content: string) =>
  JSON.stringify({
    id: 'chatcmpl-59',
    object: 'chat.completion',
    created: 1,
    model: 'gpt-4o',
    choices: [{ index: 0, message: { role: 'assistant', content }, logprobs: null, finish_reason: 'stop' }],
    usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 },
  });

/** Writes `text` one byte per `gapMs` until the response closes (or the text ends). */
async function trickle(res: ServerResponse, text: string, gapMs: number): Promise<void> {
  for (const ch of text) {
    if (res.destroyed) return;
    res.write(ch);
    await sleep(gapMs);
  }
}

const hi = [{ role: 'user' as const, content: 'hi' }];

// ---------------------------------------------------------------------------------------------------------------

describe('suite 59: descriptors, timers and connections after fault storms (in-process)', () => {
  it('1,200 calls through 503s, resets, hangs, cuts, stalls, client aborts and deadlines: fds, timers, sockets to the provider and gauges back to baseline', async () => {
    const mock = await mockWith({
      latencyMs: 5,
      stream: { chunks: 6, chunkDelayMs: 5 },
      models: {
        'gpt-4o': { latencyMs: 5, errors: [{ status: 503, rate: 0.2 }], resetRate: 0.05, hangRate: 0.03 },
        cutter: { stream: { chunks: 6, chunkDelayMs: 5, cutAfterChunks: 3 } },
        staller: { stream: { chunks: 6, chunkDelayMs: 5, stallAfterChunks: 2 } },
        slow: { latencyMs: 2_000 },
      },
    });
    const g = await startGateway(
      gatewayConfig(mock.url, {
        provider: { maxConnections: 12, pools: { maxConcurrent: 12 }, breaker: false, timeouts: { connectMs: 1_000, firstTokenMs: 800, idleMs: 400, responseMs: 800, keepAliveMs: 500 } },
        route: { park: false },
      }),
    );
    // Warm-up on an agent closed before the baseline: the gateway's lazy parts (pools, series, the target) exist.
    const warm = new Agent({ connections: 4 });
    for (let i = 0; i < 10; i++) await sdk(g.url, warm).chat.completions.create({ model: 'gpt-4o-mini', messages: hi });
    await warm.close();
    await expect.poll(() => connectionsTo(mock.port), { timeout: 5_000 }).toBe(0);
    await sleep(300);
    const fdBefore = fds();
    const timersBefore = timers();

    const agent = new Agent({ connections: 256 });
    const client = sdk(g.url, agent);
    let peakSockets = 0;
    const sampler = setInterval(() => (peakSockets = Math.max(peakSockets, connectionsTo(mock.port))), 50);
    const kinds = ['fault-whole', 'fault-stream', 'cut', 'stall', 'abort-whole', 'abort-stream', 'deadline', 'ok'] as const;
    const endings = await pooled(1_200, 80, async (i) => {
      const kind = kinds[i % kinds.length]!;
      const ctrl = new AbortController();
      const abortTimer = kind.startsWith('abort') ? setTimeout(() => ctrl.abort(), 5 + (i % 40)) : undefined;
      try {
        const model = kind === 'cut' ? 'cutter' : kind === 'stall' ? 'staller' : kind === 'deadline' ? 'slow' : kind === 'ok' ? 'gpt-4o-mini' : 'gpt-4o';
        const headers = kind === 'deadline' ? { 'x-stormgate-timeout-ms': '500' } : {};
        if (kind === 'fault-stream' || kind === 'cut' || kind === 'stall' || kind === 'abort-stream') {
          const s = await client.chat.completions.create({ model, stream: true, messages: [{ role: 'user', content: `c${i}` }] }, { signal: ctrl.signal, headers });
          for await (const _ of s) void _;
          return `${kind}: ${ctrl.signal.aborted ? 'aborted' : 'ok'}`;
        }
        await client.chat.completions.create({ model, messages: [{ role: 'user', content: `c${i}` }] }, { signal: ctrl.signal, headers });
        return `${kind}: ok`;
      } catch (err) {
        return `${kind}: ${statusOf(err)}`;
      } finally {
        clearTimeout(abortTimer);
      }
    });
    clearInterval(sampler);
    const t = tally(endings);
    // The storm was one: every kind of ending it was meant to have.
    expect(t['ok: ok'], JSON.stringify(t)).toBe(150);
    // A deadline of 500 ms on a model that takes 2 s: 504 at the deadline, or 503 load_shed at once when no slot of the
    // full pool is expected before it (the one wait rule).
    expect((t['deadline: status 504'] ?? 0) + (t['deadline: status 503'] ?? 0), JSON.stringify(t)).toBe(150);
    expect(t['cut: stream error stream_interrupted'] ?? 0, JSON.stringify(t)).toBeGreaterThan(0);
    expect(t['stall: stream error stream_interrupted'] ?? 0, JSON.stringify(t)).toBeGreaterThan(0);
    expect(Object.keys(t).filter((k) => k.includes(': error')), JSON.stringify(t)).toEqual([]);
    // Never more connections to the provider than maxConnections.
    expect(peakSockets).toBeLessThanOrEqual(12);

    // Back at baseline: no upstream request open, no gauge held, no timer, descriptor or socket left.
    await expect.poll(() => mock.stats().inflight, { timeout: 10_000, interval: 100 }).toBe(0);
    await expect.poll(async () => leftOver(await g.metricsText()), { timeout: 10_000, interval: 200 }).toEqual([]);
    await agent.close();
    await expect.poll(() => connectionsTo(mock.port), { timeout: 5_000, interval: 100 }).toBe(0);
    expect(await settlesTo(() => fds() - fdBefore, 2), 'descriptors left').toBeLessThanOrEqual(2);
    expect(await settlesTo(() => timers() - timersBefore, 0), 'timers left').toBeLessThanOrEqual(0);
  }, 90_000);

  it('connections kept to the provider after a burst of 100 concurrent calls are closed once idle for keepAliveMs, not held for good', async () => {
    const mock = await mockWith({ latencyMs: 50 });
    const g = await startGateway(gatewayConfig(mock.url, { provider: { maxConnections: 32, timeouts: { keepAliveMs: 800 } } }));
    const agent = new Agent({ connections: 128 });
    const client = sdk(g.url, agent);
    await Promise.all(Array.from({ length: 100 }, (_, i) => client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: `b${i}` }] })));
    const kept = connectionsTo(mock.port);
    expect(kept, 'the burst was served over several kept connections').toBeGreaterThan(4);
    expect(kept).toBeLessThanOrEqual(32);
    const t0 = Date.now();
    await expect.poll(() => connectionsTo(mock.port), { timeout: 5_000, interval: 50 }).toBe(0);
    expect(Date.now() - t0, 'closed about keepAliveMs after their last use').toBeLessThan(800 + 1_500);
    await agent.close();
  }, 30_000);
});

describe('suite 59: an upstream that trickles', () => {
  it('a huge whole answer trickled one byte per 100 ms: each attempt ends at responseMs, the client gets a 5xx in bounded time, every upstream request closed', async () => {
    const up = await startUpstream(async (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      await trickle(res, completion('x'.repeat(5 * MB)), 100);
    });
    const g = await startGateway(gatewayConfig(up.origin, { provider: { breaker: false, timeouts: { connectMs: 1_000, firstTokenMs: 2_000, idleMs: 1_000, responseMs: 1_500 } } }));
    const agent = new Agent();
    const t0 = Date.now();
    const err = await sdk(g.url, agent)
      .chat.completions.create({ model: 'gpt-4o', messages: hi })
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    const took = Date.now() - t0;
    expect(statusOf(err)).toMatch(/^status 50[24]$/);
    expect(up.requests, 'maxAttempts 2').toBe(2);
    // Two attempts of responseMs (1.5 s) and a backoff: not the route's 10 s, let alone the answer's 6 days.
    expect(took).toBeGreaterThan(2_900);
    expect(took).toBeLessThan(5_500);
    await expect.poll(() => up.open(), { timeout: 1_000, interval: 50 }).toBe(0);
    await agent.close();
  }, 30_000);

  it('without responseMs, the same trickle is answered 504 deadline_exceeded at the client\'s x-stormgate-timeout-ms, and the upstream request closed', async () => {
    const up = await startUpstream(async (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      await trickle(res, completion('x'.repeat(5 * MB)), 100);
    });
    const g = await startGateway(gatewayConfig(up.origin, { provider: { breaker: false } }));
    const agent = new Agent();
    const t0 = Date.now();
    const err = await sdk(g.url, agent)
      .chat.completions.create({ model: 'gpt-4o', messages: hi }, { headers: { 'x-stormgate-timeout-ms': '2000' } })
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    const took = Date.now() - t0;
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(504);
    expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('deadline_exceeded');
    expect(took).toBeGreaterThan(1_500);
    expect(took).toBeLessThan(3_000);
    await expect.poll(() => up.open(), { timeout: 1_000, interval: 50 }).toBe(0);
    await agent.close();
  }, 30_000);

  it('a started stream that then trickles bytes never completing an event is ended at idleMs with an error the SDK raises, and the upstream closed', async () => {
    const up = await startUpstream(async (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(chunk({ role: 'assistant', content: '' }));
      res.write(chunk({ content: 'Hello' }));
      // One event that never ends: `data: {"...` a byte at a time.
      await trickle(res, `data: ${JSON.stringify({ pad: 'y'.repeat(100_000) })}`, 100);
    });
    const g = await startGateway(gatewayConfig(up.origin, { provider: { breaker: false, timeouts: { connectMs: 1_000, firstTokenMs: 2_000, idleMs: 1_000 } } }));
    const agent = new Agent();
    const t0 = Date.now();
    let text = '';
    const err = await (async () => {
      const s = await sdk(g.url, agent).chat.completions.create({ model: 'gpt-4o', stream: true, messages: hi });
      for await (const c of s) text += c.choices[0]?.delta?.content ?? '';
    })().then(
      () => undefined,
      (e: unknown) => e,
    );
    const took = Date.now() - t0;
    expect(text).toBe('Hello');
    expect(statusOf(err)).toBe('stream error stream_interrupted');
    expect(took).toBeLessThan(1_000 + 2_000);
    await expect.poll(() => up.open(), { timeout: 1_000, interval: 50 }).toBe(0);
    await agent.close();
  }, 30_000);

  it('a stream that pings every 100 ms and never speaks is given up at firstTokenMs on each attempt (pings do not put it back), the upstream requests closed', async () => {
    const up = await startUpstream(async (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(chunk({ role: 'assistant', content: '' }));
      while (!res.destroyed) {
        res.write(': ping\n\n');
        await sleep(100);
      }
    });
    const g = await startGateway(gatewayConfig(up.origin, { provider: { breaker: false, timeouts: { connectMs: 1_000, firstTokenMs: 1_200, idleMs: 1_000 } } }));
    const agent = new Agent();
    const t0 = Date.now();
    const err = await (async () => {
      const s = await sdk(g.url, agent).chat.completions.create({ model: 'gpt-4o', stream: true, messages: hi });
      for await (const _ of s) void _;
    })().then(
      () => undefined,
      (e: unknown) => e,
    );
    const took = Date.now() - t0;
    expect(statusOf(err)).toMatch(/^status 50[24]$/);
    expect(up.requests).toBe(2);
    expect(took).toBeGreaterThan(2_300);
    expect(took).toBeLessThan(4_500);
    await expect.poll(() => up.open(), { timeout: 1_000, interval: 50 }).toBe(0);
    await agent.close();
  }, 30_000);

  it('a 503 whose error body trickles one byte per 100 ms, to a stream request: each attempt ends at firstTokenMs, the SDK gets a 5xx, every upstream request closed', async () => {
    const up = await startUpstream(async (_req, res) => {
      res.writeHead(503, { 'content-type': 'application/json' });
      await trickle(res, errorBody('overloaded ' + 'w'.repeat(50_000)), 100);
    });
    const g = await startGateway(gatewayConfig(up.origin, { provider: { breaker: false, timeouts: { connectMs: 1_000, firstTokenMs: 1_200, idleMs: 1_000 } } }));
    const agent = new Agent();
    const t0 = Date.now();
    const err = await (async () => {
      const s = await sdk(g.url, agent).chat.completions.create({ model: 'gpt-4o', stream: true, messages: hi });
      for await (const _ of s) void _;
    })().then(
      () => undefined,
      (e: unknown) => e,
    );
    const took = Date.now() - t0;
    expect(statusOf(err)).toMatch(/^status 50[234]$/);
    expect(up.requests).toBe(2);
    expect(took).toBeLessThan(2 * 1_200 + 2_000);
    await expect.poll(() => up.open(), { timeout: 1_000, interval: 50 }).toBe(0);
    await agent.close();
  }, 30_000);
});

describe('suite 59: concurrency and memory', () => {
  it('200 concurrent streams, 100 aborted at seeded points: the other 100 whole, every abort seen upstream, nothing left open', async () => {
    const mock = await mockWith({ stream: { chunks: 40, chunkDelayMs: 25 } });
    const g = await startGateway(gatewayConfig(mock.url, { provider: { maxConnections: 256, pools: { maxConcurrent: 256 } } }));
    await sleep(100);
    const fdBefore = fds();
    const timersBefore = timers();
    const rnd = seededRandom(59);
    const agent = new Agent({ connections: 256 });
    const client = sdk(g.url, agent);
    const endings = await Promise.all(
      Array.from({ length: 200 }, async (_, i) => {
        const abortAfter = i % 2 === 1 ? 1 + Math.floor(rnd() * 15) : undefined;
        const ctrl = new AbortController();
        let chunks = 0;
        let finish: string | null | undefined;
        try {
          const s = await client.chat.completions.create({ model: 'gpt-4o', stream: true, messages: [{ role: 'user', content: `s${i}` }] }, { signal: ctrl.signal });
          for await (const c of s) {
            if (c.choices[0]?.delta?.content) chunks++;
            finish ??= c.choices[0]?.finish_reason;
            if (abortAfter !== undefined && chunks >= abortAfter) {
              ctrl.abort();
              break;
            }
          }
          return abortAfter !== undefined ? 'aborted' : finish === 'stop' && chunks >= 16 ? 'whole' : `short ${chunks} ${finish}`;
        } catch (err) {
          return ctrl.signal.aborted ? 'aborted' : statusOf(err);
        }
      }),
    );
    expect(tally(endings)).toEqual({ aborted: 100, whole: 100 });
    await expect.poll(() => mock.stats().inflight, { timeout: 5_000, interval: 100 }).toBe(0);
    expect(mock.stats().aborted, 'every abort reached the provider').toBe(100);
    await expect.poll(async () => leftOver(await g.metricsText()), { timeout: 5_000, interval: 200 }).toEqual([]);
    const m = await g.metrics();
    expect(sum(m, 'stormgate_stream_ends_total', { end: 'client-gone' })).toBe(100);
    expect(sum(m, 'stormgate_stream_ends_total', { end: 'complete' })).toBe(100);
    await agent.close();
    await expect.poll(() => connectionsTo(mock.port), { timeout: 5_000, interval: 100 }).toBe(0);
    expect(await settlesTo(() => fds() - fdBefore, 2), 'descriptors left').toBeLessThanOrEqual(2);
    expect(await settlesTo(() => timers() - timersBefore, 0), 'timers left').toBeLessThanOrEqual(0);
  }, 60_000);

  it('six rounds of 1 MB answers through 503s and mid-body cuts: the heap after the last round is where it was after the second', async () => {
    const big = completion('z'.repeat(MB));
    const up = await startUpstream((req, res, body) => {
      // A first attempt: a 503 for some calls, an answer cut half-way for others; the retry is answered.
      const first = (req.headers['x-retry-attempt'] ?? '0') === '0';
      const n = Number(/ (\d+)"/.exec(body.toString())?.[1] ?? 0);
      if (first && n % 3 === 0) {
        res.writeHead(503, { 'content-type': 'application/json' });
        return void res.end(errorBody('overloaded'));
      }
      if (first && n % 3 === 1) {
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(big.length) });
        res.write(big.slice(0, big.length / 2));
        return void setTimeout(() => res.destroy(), 5);
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(big);
    });
    const g = await startGateway(gatewayConfig(up.origin, { provider: { breaker: false }, route: { retry: { maxAttempts: 3, backoff: { baseMs: 20, capMs: 50 } } } }));
    const heaps: number[] = [];
    for (let round = 0; round < 6; round++) {
      const agent = new Agent({ connections: 16 });
      const client = sdk(g.url, agent);
      const got = await pooled(40, 8, async (i) => {
        try {
          const r = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: `r${round} ${i}` }] });
          return r.choices[0]!.message.content!.length === MB ? 'ok' : 'short';
        } catch (err) {
          return statusOf(err);
        }
      });
      expect(tally(got), `round ${round}`).toEqual({ ok: 40 });
      await agent.close();
      heaps.push(await settledHeap());
    }
    await expect.poll(async () => leftOver(await g.metricsText()), { timeout: 5_000 }).toEqual([]);
    const growth = (heaps[5]! - heaps[1]!) / MB;
    expect(growth, `heap by round (MB): ${heaps.map((h) => (h / MB).toFixed(0)).join(', ')}`).toBeLessThan(20);
  }, 120_000);

  it('eight 10 MB bodies near bodyLimitBytes through two 503s each, queued behind a pool of 2: every attempt gets the body intact, the waiting bytes back to 0, the heap back', async () => {
    const seen = new Map<string, number>();
    const hashes: string[] = [];
    const up = await startUpstream(async (_req, res, body) => {
      const h = createHash('sha256').update(body).digest('hex');
      hashes.push(h);
      const n = (seen.get(h) ?? 0) + 1;
      seen.set(h, n);
      await sleep(100);
      if (n <= 2) {
        res.writeHead(503, { 'content-type': 'application/json' });
        return void res.end(errorBody('overloaded'));
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(completion(`got ${body.length}`));
    });
    const g = await startGateway(
      gatewayConfig(up.origin, {
        provider: { breaker: false, maxConnections: 2, pools: { maxConcurrent: 2, classes: { online: { minShare: 0.5, maxQueue: 50 } } } },
        route: { timeoutMs: 60_000, retry: { maxAttempts: 3, backoff: { baseMs: 50, capMs: 100 } } },
      }),
    );
    const agent = new Agent({ connections: 16 });
    const client = sdk(g.url, agent);
    // Each body a little under the default 10 MiB limit, all different.
    const bodies = Array.from({ length: 8 }, (_, i) => `${i}`.repeat(1) + 'q'.repeat(10 * MB - 400));
    const sentHashes = bodies.map((content) => createHash('sha256').update(JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content }] })).digest('hex'));
    await sleep(100);
    const heapBefore = await settledHeap();
    let peakWaiting = 0;
    const sampler = setInterval(() => void g.metrics().then((m) => (peakWaiting = Math.max(peakWaiting, sum(m, 'stormgate_waiting_body_bytes'))), () => {}), 50);
    const got = await Promise.all(
      bodies.map((content) =>
        client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content }] }).then(
          (r) => r.choices[0]!.message.content,
          (e: unknown) => statusOf(e),
        ),
      ),
    );
    clearInterval(sampler);
    expect(got.every((c) => /^got \d+$/.test(c ?? '')), JSON.stringify(got)).toBe(true);
    // 24 attempts, three per body; each the bytes the SDK sent (the SDK's JSON, byte for byte).
    expect(hashes.length).toBe(24);
    expect([...seen.values()]).toEqual(Array(8).fill(3));
    expect(new Set(seen.keys())).toEqual(new Set(sentHashes));
    expect(peakWaiting, 'bodies waited for the pool').toBeGreaterThan(5 * MB);
    await expect.poll(async () => leftOver(await g.metricsText()), { timeout: 5_000, interval: 100 }).toEqual([]);
    await agent.close();
    bodies.length = 0;
    const heapAfter = await settledHeap();
    expect((heapAfter - heapBefore) / MB, `heap ${(heapBefore / MB).toFixed(0)} -> ${(heapAfter / MB).toFixed(0)} MB`).toBeLessThan(30);
  }, 120_000);

  it('a whole answer past 128 MB is not held: reading stops at the cap, the attempt retried, 502 upstream_bad_response, the heap back where it was', async () => {
    const mb = Buffer.alloc(MB, 'x');
    let written = 0;
    const up = await startUpstream(async (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"id":"chatcmpl-59","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"');
      for (let i = 0; i < 160 && !res.destroyed; i++) {
        if (!res.write(mb)) await once(res, 'drain').catch(() => {});
        written += MB;
      }
      res.end('"},"finish_reason":"stop"}]}');
    });
    const g = await startGateway(gatewayConfig(up.origin, { provider: { breaker: false }, route: { timeoutMs: 60_000 } }));
    const agent = new Agent();
    const heapBefore = await settledHeap();
    let peakRss = 0;
    const rss0 = process.memoryUsage().rss;
    const sampler = setInterval(() => (peakRss = Math.max(peakRss, process.memoryUsage().rss)), 20);
    const err = await sdk(g.url, agent)
      .chat.completions.create({ model: 'gpt-4o', messages: hi })
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    clearInterval(sampler);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(502);
    expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('upstream_bad_response');
    expect(up.requests, 'maxAttempts 2').toBe(2);
    // Each attempt read to its cap (128 MB) and a few socket buffers at most, not the 160 MB on offer: cut off there.
    expect(written / MB).toBeLessThan(2 * 140);
    await expect.poll(() => up.open(), { timeout: 2_000, interval: 50 }).toBe(0);
    // One answer's cap in memory at a time, with room for its copies: not both attempts' bytes kept.
    expect((peakRss - rss0) / MB, 'RSS grew by').toBeLessThan(450);
    await agent.close();
    const heapAfter = await settledHeap();
    expect((heapAfter - heapBefore) / MB, 'heap kept after the answer').toBeLessThan(20);
  }, 120_000);
});

describe('suite 59: bounded metric labels over time', () => {
  it('two rounds of distinct models, wrong client keys, unknown paths, odd priorities and request ids: the second round adds no /metrics series', async () => {
    const mock = await mockWith({});
    const g = await startGateway(
      gatewayConfig(mock.url, {
        extra: { auth: { keys: { team: CLIENT_KEY } } },
      }),
    );
    const agent = new Agent({ connections: 32 });
    const client = sdk(g.url, agent);
    const round = async (r: number) => {
      await pooled(300, 20, async (i) => {
        const tag = `${r}-${i}-${Math.random().toString(36).slice(2, 8)}`;
        const calls: Array<Promise<unknown>> = [
          client.chat.completions.create({ model: `model-${tag}`, messages: hi }, { headers: { 'x-request-id': `req-${tag}`, 'x-stormgate-priority': i % 3 === 0 ? `prio-${tag}` : 'batch' } }),
          sdk(g.url, agent, { apiKey: `sk-wrong-${tag}` }).chat.completions.create({ model: 'gpt-4o', messages: hi }),
          undiciFetch(`${g.url}/v1/unknown-${tag}`, { method: 'POST', dispatcher: agent, headers: { authorization: `Bearer ${CLIENT_KEY}`, 'content-type': 'application/json' }, body: '{}' }).then((res) => res.arrayBuffer()),
        ];
        await Promise.allSettled(calls);
      });
      return (await g.metricsText()).split('\n').filter((l) => l && !l.startsWith('#'));
    };
    const first = await round(1);
    const second = await round(2);
    const added = second.map((l) => l.slice(0, l.lastIndexOf(' '))).filter((k) => !new Set(first.map((l) => l.slice(0, l.lastIndexOf(' ')))).has(k));
    expect(added, 'series born in the second round').toEqual([]);
    // Learned model names: at most 32 labels of their own, the rest p/other (README, Logs and metrics).
    const targets = new Set(second.map((l) => /target="([^"]*)"/.exec(l)?.[1]).filter((x) => x !== undefined));
    expect(targets.size, [...targets].join(' ')).toBeLessThanOrEqual(32 + 2);
    expect(targets.has('p/other')).toBe(true);
    expect(second.join('\n')).not.toMatch(/sk-wrong|unknown-|prio-|req-\d|model-2-/);
    await agent.close();
  }, 90_000);
});

describe('suite 59: fleet state in a real redis-server', () => {
  let redis: RedisHandle;
  let admin: Redis;
  beforeAll(async () => {
    redis = await startRedis();
    admin = new Redis(redis.url, { lazyConnect: true, maxRetriesPerRequest: 1 });
    // The restarts below break its connection too; it reconnects by itself.
    admin.on('error', () => {});
    await admin.connect();
  });
  afterAll(async () => {
    admin?.disconnect();
    await redis?.stop();
  });

  it('two rounds of 400 calls through 503s, 429 hold-offs and an open breaker: no Redis connection per request, every key expiring, no key per request', async () => {
    const mock = await mockWith({
      latencyMs: 5,
      models: {
        'gpt-4o': { errors: [{ status: 503, rate: 0.3 }] },
        limited: { errors: [{ status: 429, rate: 0.3, headers: { 'retry-after-ms': '200' } }] },
        down: { errors: [{ status: 503 }] },
      },
    });
    const prefix = `s59-${Date.now()}`;
    const g = await startGateway(
      gatewayConfig(mock.url, {
        provider: { breaker: { consecutiveFailures: 3, minRequests: 10, openS: 1 } },
        route: { park: false, timeoutMs: 5_000 },
        extra: { state: { redis: redis.url, keyPrefix: prefix } },
      }),
    );
    const clients = async () => Number(/connected_clients:(\d+)/.exec(await admin.info('clients'))![1]);
    const keys = async () => admin.keys(`${prefix}*`);
    const agent = new Agent({ connections: 64 });
    const client = sdk(g.url, agent);
    const round = async (r: number) =>
      pooled(400, 40, async (i) => {
        const model = ['gpt-4o', 'limited', 'down', `learned-${r}-${i % 5}`][i % 4]!;
        try {
          await client.chat.completions.create({ model, messages: [{ role: 'user', content: `r${r} ${i} ${Math.random()}` }] }, { headers: { 'x-request-id': `s59-${r}-${i}` } });
          return 'ok';
        } catch (err) {
          return statusOf(err);
        }
      });
    await client.chat.completions.create({ model: 'gpt-4o-mini', messages: hi });
    const connectedBefore = await clients();
    const t1 = tally(await round(1));
    expect(t1.ok ?? 0, JSON.stringify(t1)).toBeGreaterThan(100);
    expect(Object.keys(t1).filter((k) => k.startsWith('error')), JSON.stringify(t1)).toEqual([]);
    const keysAfter1 = await keys();
    const t2 = tally(await round(2));
    expect(t2.ok ?? 0, JSON.stringify(t2)).toBeGreaterThan(100);
    const keysAfter2 = await keys();
    expect(await clients(), 'Redis connections').toBe(connectedBefore);
    // Keys are per target and window, not per request: round 2's 400 requests (5 new model names) add a handful at most.
    expect(keysAfter2.length, keysAfter2.join('\n')).toBeLessThan(keysAfter1.length + 30);
    expect(keysAfter2.filter((k) => k.includes('s59-2-') || k.includes('r2 ')), 'a key per request').toEqual([]);
    const noExpiry: string[] = [];
    for (const k of keysAfter2) if ((await admin.pttl(k)) === -1) noExpiry.push(k);
    expect(noExpiry, 'keys without a time to live').toEqual([]);
    await agent.close();
  }, 90_000);

  it('a Redis restarted empty mid-storm: the gateway reconnects with as many connections as before, not one more per reconnect', async () => {
    const mock = await mockWith({ latencyMs: 5, models: { 'gpt-4o': { errors: [{ status: 503, rate: 0.2 }] } } });
    const prefix = `s59r-${Date.now()}`;
    const g = await startGateway(gatewayConfig(mock.url, { route: { park: false }, extra: { state: { redis: redis.url, keyPrefix: prefix } } }));
    const agent = new Agent({ connections: 32 });
    const client = sdk(g.url, agent);
    await client.chat.completions.create({ model: 'gpt-4o-mini', messages: hi });
    const clientsNow = async () => {
      const probe = new Redis(redis.url, { maxRetriesPerRequest: 1 });
      probe.on('error', () => {});
      try {
        return Number(/connected_clients:(\d+)/.exec(await probe.info('clients'))![1]) - 1;
      } finally {
        probe.disconnect();
      }
    };
    const before = await clientsNow();
    expect(before).toBeGreaterThan(0);
    let stop = false;
    const storm = (async () => {
      let n = 0;
      while (!stop) {
        await pooled(20, 10, (i) => client.chat.completions.create({ model: i % 2 ? 'gpt-4o' : 'gpt-4o-mini', messages: [{ role: 'user', content: `${n++}` }] }).catch(() => {}));
        await sleep(20);
      }
    })();
    for (let k = 0; k < 3; k++) {
      await sleep(500);
      await redis.restart();
      await expect.poll(async () => sum(await g.metrics(), 'stormgate_state_degraded'), { timeout: 15_000, interval: 200 }).toBe(0);
    }
    await sleep(500);
    stop = true;
    await storm;
    await expect.poll(clientsNow, { timeout: 10_000, interval: 300 }).toBe(before);
    await agent.close();
  }, 90_000);
});

describe('suite 59: closing the gateway', () => {
  it('close() with streams running, requests parked behind an open breaker and a hung call: every descriptor, timer and provider connection it took is given back', async () => {
    const mock = await mockWith({
      stream: { chunks: 200, chunkDelayMs: 20 },
      models: { down: { errors: [{ status: 503 }] }, hung: { hangRate: 1 } },
    });
        await sleep(100);
    const fdBefore = fds();
    const timersBefore = timers();
    const g = await startGateway(
      gatewayConfig(mock.url, {
        provider: { breaker: { consecutiveFailures: 2, minRequests: 100, openS: 30 } },
        route: { park: { maxQueue: 100 }, timeoutMs: 6_000 },
      }),
    );
    const agent = new Agent({ connections: 64 });
    const client = sdk(g.url, agent);
    // Open the breaker of `down`, then park calls on it.
    for (let i = 0; i < 3; i++) await client.chat.completions.create({ model: 'down', messages: hi }).catch(() => {});
    const calls = [
      ...Array.from({ length: 10 }, async () => {
        const s = await client.chat.completions.create({ model: 'gpt-4o', stream: true, messages: hi });
        for await (const _ of s) void _;
      }),
      ...Array.from({ length: 10 }, () => client.chat.completions.create({ model: 'down', messages: hi })),
      ...Array.from({ length: 5 }, () => client.chat.completions.create({ model: 'hung', messages: hi })),
    ].map((p) => p.then(() => 'ok', (e: unknown) => statusOf(e)));
    await expect.poll(async () => sum(await g.metrics(), 'stormgate_parked_requests'), { timeout: 5_000 }).toBeGreaterThan(0);
    await expect.poll(() => mock.stats().inflight, { timeout: 5_000 }).toBeGreaterThanOrEqual(15);
    await g.app.close();
    const ends = tally(await Promise.all(calls));
    expect(Object.keys(ends).filter((k) => k.startsWith('error')), JSON.stringify(ends)).toEqual([]);
    await agent.close();
    await expect.poll(() => mock.stats().inflight, { timeout: 5_000, interval: 100 }).toBe(0);
    await expect.poll(() => connectionsTo(mock.port), { timeout: 5_000, interval: 100 }).toBe(0);
    expect(await settlesTo(() => fds() - fdBefore, 0), 'descriptors left').toBeLessThanOrEqual(0);
    expect(await settlesTo(() => timers() - timersBefore, 0), 'timers left').toBeLessThanOrEqual(0);
  }, 60_000);
});

describe('suite 59: the gateway as a process', () => {
  const startProcess = useGatewayProcesses();

  it('three storms of 600 calls with faults and client aborts: its open descriptors back to baseline after each, its RSS not climbing', async () => {
    const mock = await mockWith({
      latencyMs: 5,
      stream: { chunks: 8, chunkDelayMs: 5 },
      models: {
        'gpt-4o': { errors: [{ status: 503, rate: 0.25 }], resetRate: 0.05 },
        cutter: { stream: { chunks: 8, chunkDelayMs: 5, cutAfterChunks: 3 } },
        hung: { hangRate: 1 },
      },
    });
    const port = await freePort();
    const gp = startProcess('suite59', {
      server: { host: '127.0.0.1', port, logLevel: 'warn' },
      providers: {
        p: { family: 'openai', baseUrl: `${mock.url}/v1`, apiKey: PROVIDER_KEY, maxConnections: 48, breaker: false, timeouts: { connectMs: 1_000, firstTokenMs: 800, idleMs: 500, responseMs: 600, keepAliveMs: 500 } },
      },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'p' }], park: false, retry: { maxAttempts: 2, backoff: { baseMs: 20, capMs: 50 } }, budget: { ratio: 1, windowS: 10, minRetriesPerSecond: 200 } }],
    });
    closeAfter({ close: () => killNow(gp.proc) });
    await waitReady(gp, port);
    const url = `http://127.0.0.1:${port}`;
    const pid = gp.proc.pid!;
    const procFds = () => readdirSync(`/proc/${pid}/fd`).length;
    const rssMb = () => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1]) / 1024;
    const warm = new Agent();
    for (let i = 0; i < 10; i++) await sdk(url, warm).chat.completions.create({ model: 'gpt-4o-mini', messages: hi });
    await warm.close();
    await sleep(1_000);
    const fdBase = procFds();
    const rss: number[] = [];
    for (let r = 0; r < 3; r++) {
      const agent = new Agent({ connections: 128 });
      const client = sdk(url, agent);
      const ends = await pooled(600, 60, async (i) => {
        const ctrl = new AbortController();
        const kind = i % 5;
        const timer = kind === 3 ? setTimeout(() => ctrl.abort(), 5 + (i % 30)) : undefined;
        try {
          if (kind === 1 || kind === 3) {
            const s = await client.chat.completions.create({ model: kind === 1 ? 'cutter' : 'gpt-4o', stream: true, messages: [{ role: 'user', content: `${r} ${i}` }] }, { signal: ctrl.signal });
            for await (const _ of s) void _;
            return 'done';
          }
          await client.chat.completions.create({ model: kind === 4 ? 'hung' : 'gpt-4o', messages: [{ role: 'user', content: `${r} ${i}` }] }, { signal: ctrl.signal });
          return 'ok';
        } catch (err) {
          return ctrl.signal.aborted ? 'aborted' : statusOf(err);
        } finally {
          clearTimeout(timer);
        }
      });
      const t = tally(ends);
      expect(Object.keys(t).filter((k) => k.startsWith('error')), JSON.stringify(t)).toEqual([]);
      await agent.close();
      await expect.poll(() => mock.stats().inflight, { timeout: 5_000, interval: 100 }).toBe(0);
      await expect.poll(async () => leftOver(await (await request(`${url}/metrics`, { reset: true })).body.text()), { timeout: 5_000, interval: 200 }).toEqual([]);
      await expect.poll(() => procFds() - fdBase, { timeout: 5_000, interval: 200 }).toBeLessThanOrEqual(2);
      rss.push(rssMb());
    }
    expect(rss[2]! - rss[0]!, `RSS by round (MB): ${rss.map((x) => x.toFixed(0)).join(', ')}`).toBeLessThan(40);
  }, 120_000);
});
