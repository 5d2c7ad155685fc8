// A twentieth third-party failure-scenario suite, written from the README alone (its top, "Retry budget, circuit
// breaker, hold-offs, parking", "Priority pools", "Deadlines and timeouts", "Health, readiness, shutdown",
// "Deployment", "Logs and metrics") as a platform team that runs thousands of concurrent agents would test the gateway
// at the connection level before production: 500 concurrent clients (the official `openai` SDK 6.x at its defaults,
// and raw node:http sockets where an SDK cannot do what a real client or a load balancer does) against one gateway,
// and against two gateways sharing a real redis-server. Themes: a provider hiccup (the README's 15 s one, shortened to
// 2.5 s) under 500 agents that also retry on a fixed interval of their own, with upstream attempts counted against
// client calls; keep-alive connections reused across failures, and the gateway's idle timeout against a load
// balancer's; connection churn; connections that open and never send, trickle their headers or stall their body
// (slowloris) while real traffic flows; half-closed sockets; 500 clients leaving at once mid-wait (ghost requests:
// the provider must see the aborts, the pool and parking gauges must return to 0); file descriptors and heap after
// the storm; /healthz and /metrics during it; online requests during a batch flood of 500.
// Scaled for a shared 2-core machine (clients, gateways and the mock share this test process): 500 agents, not
// thousands; bounds are generous. The amplification each run measured is printed (console.info) for the record:
// 1.02-1.08 upstream requests per client call through the hiccup (the README's "1.02 to 1.05"), none of the SDK's
// own retries, a handful of the agents' own. No gateway bug was found at this level; the README now says what the
// gateway does with idle, silent and half-closed client connections (Deployment), which it did not.
import { once, setMaxListeners } from 'node:events';
import { readdirSync } from 'node:fs';
import { request as httpRequest, type IncomingMessage } from 'node:http';
import { connect, type Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import type { FastifyInstance } from 'fastify';
import OpenAI from 'openai';
import { Agent, fetch as undiciFetch } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import type { MockServer } from '../src/mock/server.ts';
import { createLogger } from '../src/observability/logger.ts';
import { createMetrics } from '../src/observability/metrics.ts';
import { buildServer } from '../src/server.ts';
import { leftOver, socketsTo, sums } from './helpers/cancel-storm.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { TEST_KEY, testLogSink, useExtraMocks } from './helpers/stack.ts';

const startMock = useExtraMocks();
const redisServer = useRedisServer();

type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];

const CHAT = '/v1/chat/completions';
const messages = [{ role: 'user' as const, content: 'Next step of the runbook, please.' }];
const BODY = JSON.stringify({ model: 'gpt-4o', messages });

// ---------------------------------------------------------------------------------------------------------------
// Gateways of the test's own: like helpers/stack.ts useGateways, but the test keeps the fastify instance, whose
// node:http server it asks for its open connections and its keep-alive settings.

interface Gw {
  app: FastifyInstance;
  url: string;
  logs: string[];
}

const running: FastifyInstance[] = [];
afterEach(async () => {
  await Promise.all(running.splice(0).map((g) => g.close()));
});

let prefixes = 0;

function configFor(mock: MockServer, o: { route?: Partial<RouteInput>; provider?: Partial<ProviderInput>; server?: Partial<ConfigInput['server']>; redis?: boolean } = {}): ConfigInput {
  return {
    server: { host: '127.0.0.1', port: 0, logLevel: 'info', ...o.server },
    providers: { mock: { family: 'openai', baseUrl: `${mock.url}/v1`, apiKey: TEST_KEY, maxConnections: 64, ...o.provider } },
    routes: [{ name: 'chat', match: { path: CHAT }, targets: [{ provider: 'mock' }], timeoutMs: 30_000, ...o.route }],
    ...(o.redis && { state: { redis: redisServer().url, keyPrefix: `tp20-${process.pid}-${++prefixes}`, commandTimeoutMs: 200 } }),
  };
}

async function startGateways(input: ConfigInput, n = 1): Promise<Gw[]> {
  const config = ConfigSchema.parse(input);
  const out: Gw[] = [];
  for (let i = 0; i < n; i++) {
    const logs: string[] = [];
    const app = await buildServer(config, { logger: createLogger(config, testLogSink(logs)), metrics: createMetrics({ defaultMetrics: false }) });
    running.push(app);
    out.push({ app, url: await app.listen({ host: '127.0.0.1', port: 0 }), logs });
  }
  return out;
}

const openConnections = (g: Gw): Promise<number> =>
  new Promise((resolve, reject) => g.app.server.getConnections((err, n) => (err ? reject(err) : resolve(n))));

async function metricsText(url: string): Promise<string> {
  return (await fetch(`${url}/metrics`)).text();
}

async function metric(urls: string | string[], prefix: string): Promise<number> {
  let sum = 0;
  for (const url of [urls].flat()) for (const l of (await metricsText(url)).split('\n')) if (l.startsWith(prefix)) sum += Number(l.split(' ').at(-1));
  return sum;
}

async function until(what: string, check: () => Promise<boolean> | boolean, withinMs = 10_000): Promise<void> {
  for (const end = Date.now() + withinMs; !(await check()); ) {
    if (Date.now() > end) throw new Error(`timed out waiting until ${what}`);
    await sleep(50);
  }
}

const received = (mock: MockServer, from = 0, to = Infinity) => mock.requests().filter((r) => r.path === CHAT && r.receivedAt >= from && r.receivedAt < to);
const pct = (xs: number[], p: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(xs.length * p))] ?? NaN;
const openFds = () => readdirSync('/proc/self/fd').length;

/** Polls a gateway's /healthz and /metrics every 100 ms until stopped; each probe's status and time. */
function probeOps(url: string) {
  const seen: Array<{ path: string; status: number; ms: number }> = [];
  let stopped = false;
  const loop = (async () => {
    while (!stopped) {
      for (const path of ['/healthz', '/metrics']) {
        const t = Date.now();
        const status = await fetch(`${url}${path}`).then(async (r) => (await r.arrayBuffer(), r.status), () => 0);
        seen.push({ path, status, ms: Date.now() - t });
      }
      await sleep(100);
    }
  })();
  return {
    async stop() {
      stopped = true;
      await loop;
      return seen;
    },
  };
}

// ---------------------------------------------------------------------------------------------------------------
// Agents: the official SDK at its defaults (maxRetries 2), each HTTP request it makes recorded; and on failure the
// agent's own fixed-interval retry loop on top (the incident's "agents retrying every second").

interface Wire {
  at: number;
  status: number;
  shouldRetry: string | null;
}

/** `dispatcher`: the agents' own connection pool (undici), closed when they stop, as a process that exits would. */
function sdk(url: string, wire: Wire[], dispatcher?: Agent, opts: ConstructorParameters<typeof OpenAI>[0] = {}): OpenAI {
  return new OpenAI({
    baseURL: `${url}/v1`,
    apiKey: 'sk-agent',
    fetch: async (input, init) => {
      const at = Date.now();
      try {
        const res = (await (dispatcher ? undiciFetch(input as string, { ...(init as object), dispatcher }) : fetch(input, init))) as Response;
        wire.push({ at, status: res.status, shouldRetry: res.headers.get('x-should-retry') });
        return res;
      } catch (e) {
        wire.push({ at, status: 0, shouldRetry: null });
        throw e;
      }
    },
    ...opts,
  });
}

interface Logical {
  start: number;
  end: number;
  ok: boolean;
  tries: number;
}

/**
 * `agents` closed-loop agents, each on a client of its own (round-robin over `urls`): a call, then `thinkMs` of
 * thinking; a call that failed is tried again by the agent every `retryEveryMs` until `giveUpMs` after it began.
 */
function agentStorm(urls: string[], o: { agents: number; thinkMs: number; retryEveryMs: number; giveUpMs: number }) {
  const wire: Wire[] = [];
  const done: Logical[] = [];
  const dispatcher = new Agent({ connections: 1_000 });
  const clients = Array.from({ length: o.agents }, (_, i) => sdk(urls[i % urls.length]!, wire, dispatcher));
  let stopped = false;
  const loops = clients.map(async (client, i) => {
    await sleep((i * o.thinkMs) / o.agents);
    while (!stopped) {
      const start = Date.now();
      for (let tries = 1; ; tries++) {
        let ok = false;
        try {
          await client.chat.completions.create({ model: 'gpt-4o', messages });
          ok = true;
        } catch (e) {
          if (!(e instanceof OpenAI.APIError)) throw e;
        }
        if (ok || Date.now() + o.retryEveryMs > start + o.giveUpMs) {
          done.push({ start, end: Date.now(), ok, tries });
          break;
        }
        await sleep(o.retryEveryMs);
      }
      await sleep(o.thinkMs);
    }
  });
  return {
    wire,
    done,
    async stop() {
      stopped = true;
      await Promise.all(loops);
    },
    /** The agents' process goes away: their connections close. */
    close: () => dispatcher.close(),
  };
}

// ---------------------------------------------------------------------------------------------------------------
// Raw connections, for what no SDK does: a fresh connection per request, a half-close, a slow or silent client.

interface RawAnswer {
  status: number;
  headers: IncomingMessage['headers'];
  body: string;
}

/** One chat completion on a connection of its own (no agent: `connection: close`). */
function churnRequest(origin: string): Promise<RawAnswer> {
  const { hostname, port } = new URL(origin);
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: hostname, port, path: CHAT, method: 'POST', agent: false, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(BODY) } }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
    });
    req.on('error', reject);
    req.end(BODY);
  });
}

function rawSocket(origin: string): Promise<Socket> {
  const { hostname, port } = new URL(origin);
  const socket = connect({ host: hostname, port: Number(port) });
  return once(socket, 'connect').then(() => socket);
}

/** Everything a raw socket receives until the server closes it, and when that was. */
function collect(socket: Socket): Promise<{ text: string; closedAt: number }> {
  let text = '';
  socket.setEncoding('utf8');
  socket.on('data', (d: string) => (text += d));
  socket.on('error', () => undefined);
  return new Promise((resolve) => socket.once('close', () => resolve({ text, closedAt: Date.now() })));
}

const statusOf = (raw: string) => Number(/^HTTP\/1\.1 (\d{3})/.exec(raw)?.[1] ?? 0);

// ---------------------------------------------------------------------------------------------------------------
describe('a 2.5 s provider hiccup under 500 agents that retry every 500 ms on their own', () => {
  /** 500 agents, each a call then 2 s of thinking: about 240 calls a second; the provider answers in 50 ms. */
  const LOAD = { agents: 500, thinkMs: 2_000, retryEveryMs: 500, giveUpMs: 20_000 };

  async function hiccup(instances: number) {
    const mock = await startMock({ faults: { latencyMs: 50 }, apiKey: TEST_KEY });
    const gws = await startGateways(configFor(mock, { redis: instances > 1 }), instances);
    const urls = gws.map((g) => g.url);
    const fdsBefore = openFds();
    const heapBefore = process.memoryUsage().heapUsed;
    const storm = agentStorm(urls, LOAD);
    // Steady state first: every agent has had an answer (a cold process on a busy machine takes a while), then a
    // second more to measure the load before the hiccup.
    await until('every agent has had an answer', () => storm.done.length >= LOAD.agents, 20_000);
    // The ops endpoints, polled from the steady state on (the test process's own warm-up, 500 clients compiling their
    // first request, is no gateway's doing).
    const ops = probeOps(urls[0]!);
    await sleep(1_500);
    const t0 = Date.now();
    const before = received(mock, t0 - 1_500, t0).length / 1.5;
    mock.brownout('503', 2_500);
    await sleep(2_500);
    const during = received(mock, t0, t0 + 2_500).length / 2.5;
    await sleep(4_000);
    await storm.stop();
    const seen = await ops.stop();
    const { wire, done } = storm;
    const up = received(mock);
    const inHiccup = done.filter((l) => l.start >= t0 - 500 && l.start < t0 + 2_500);
    const m = {
      instances,
      logical: done.length,
      clientHttp: wire.length,
      upstream: up.length,
      perClientCall: +(up.length / wire.length).toFixed(3),
      perLogical: +(up.length / done.length).toFixed(3),
      rpsBefore: +before.toFixed(1),
      rpsDuring: +during.toFixed(1),
      agentRetries: done.reduce((a, l) => a + l.tries - 1, 0),
      sdkRetries: wire.length - done.reduce((a, l) => a + l.tries, 0),
      failedLogical: done.filter((l) => !l.ok).length,
      hiccupP50Ms: pct(inHiccup.map((l) => l.end - l.start), 0.5),
      hiccupMaxMs: Math.max(...inHiccup.map((l) => l.end - l.start)),
      opsP99Ms: pct(seen.map((s) => s.ms), 0.99),
      opsMaxMs: Math.max(...seen.map((s) => s.ms)),
    };
    console.info('hiccup', JSON.stringify(m));
    // The incident: upstream QPS 3-4x during the hiccup. Here the breaker opens, the rest park, and only probes go:
    // the provider sees less during the hiccup than before it.
    // (About 240 calls a second are asked for; a shared 2-core machine running clients, gateways and the mock in one
    // process served 25-250, as busy as the other sessions on it left it.)
    // Measured 0.05-0.6 of the load before; 1.3 once, with the machine's load average at 10 (the load before was
    // then itself starved, and the failures of the attempts in flight as the hiccup began weigh more). The incident's
    // 3-4x still fails it.
    expect(before).toBeGreaterThan(10);
    expect(during / before).toBeLessThan(1.5);
    // Every logical request was answered, and amplification stays near one upstream request per client call
    // (README: "in a 12 s brownout under load all three clients cost 1.02 to 1.05 upstream requests per call").
    expect(m.failedLogical).toBe(0);
    expect(m.perClientCall).toBeLessThan(1.15);
    expect(m.perLogical).toBeLessThan(1.2);
    // Errors the agents saw are few and say x-should-retry: false, so the SDK adds nothing on top.
    const failed = wire.filter((w) => w.status !== 200);
    expect(failed.length / wire.length).toBeLessThan(0.05);
    expect(failed.every((w) => w.shouldRetry === 'false')).toBe(true);
    // /healthz and /metrics stayed answerable through the storm.
    expect(seen.length).toBeGreaterThan(20);
    expect(seen.every((s) => s.status === 200)).toBe(true);
    // (The probes share one event loop with 500 agents' clients and the mock: seconds at worst on a busy machine.)
    expect(m.opsP99Ms).toBeLessThan(3_000);
    expect(m.opsMaxMs).toBeLessThan(6_000);
    // Counters agree with what the provider saw; the breaker is closed again.
    await sleep(100);
    expect(await metric(urls, 'stormgate_upstream_attempts_total')).toBe(up.length);
    expect(await metric(urls, 'stormgate_requests_total{route="chat"')).toBe(wire.length);
    await until('the breakers close', async () => (await metric(urls, 'stormgate_breaker_state{target="mock/gpt-4o"}')) === 0, 5_000);
    // After the storm: nothing waiting, nothing held, and the process's descriptors back near where they were (the
    // clients' and the gateway's keep-alive connections close after their 4 s idle time; the gateway's own client
    // connections are closed by the clients).
    for (const url of urls) expect(leftOver(await metricsText(url))).toEqual([]);
    const held = { fds: openFds(), gatewayConnections: await Promise.all(gws.map(openConnections)), mockSockets: socketsTo(mock.port) };
    await storm.close();
    // What stays: the keep-alive connections of this test's own fetch() (its /metrics and /healthz probes).
    await until('the gateways hold no agent connection', async () => (await Promise.all(gws.map(openConnections))).every((n) => n <= 3), 3_000).catch(async (e) => {
      console.info('still open', await Promise.all(gws.map(openConnections)), openFds(), fdsBefore);
      throw e;
    });
    await until('file descriptors back near the start', () => openFds() <= fdsBefore + 20, 10_000);
    const heapGrowthMb = (process.memoryUsage().heapUsed - heapBefore) / 2 ** 20;
    console.info('after the storm', JSON.stringify({ held, fdsBefore, fdsAfter: openFds(), heapGrowthMb: Math.round(heapGrowthMb), mockSockets: socketsTo(mock.port) }));
    expect(heapGrowthMb).toBeLessThan(300);
    return m;
  }

  it('one gateway: the provider sees less during the hiccup, about one request per client call, every call answered', async () => {
    await hiccup(1);
  }, 45_000);

  it('two gateways on one redis-server: the same, fleet-wide', async () => {
    await hiccup(2);
  }, 45_000);
});

// ---------------------------------------------------------------------------------------------------------------
describe('ghost requests: 500 clients leave at once mid-wait', () => {
  it.each([1, 2])('%i gateway(s): in flight, queued for a slot and parked behind a hold-off: the provider sees the aborts, nothing more goes up, every gauge returns to 0', async (instances) => {
    // gpt-4o answers in 20 s through 32 connections (so 32 in flight, the rest queued for a slot); `held` answers
    // 429 with retry-after: 8, so its requests park behind the hold-off.
    const mock = await startMock({ faults: { latencyMs: 20_000, models: { held: { latencyMs: 20, errors: [{ status: 429, headers: { 'retry-after': '8' } }] } } }, apiKey: TEST_KEY });
    // With two instances, one redis-server: the hold-off is the fleet's, and the 32 slots are shared by demand.
    const gws = await startGateways(configFor(mock, { provider: { maxConnections: 32 }, redis: instances > 1 }), instances);
    const urls = gws.map((g) => g.url);
    const dispatcher = new Agent({ connections: 1_000 });
    const wire: Wire[] = [];
    const ctrl = new AbortController();
    setMaxListeners(1_000, ctrl.signal);
    const calls: Array<Promise<string>> = [];
    const call = (model: string, stream: boolean) => {
      const client = sdk(urls[calls.length % instances]!, wire, dispatcher);
      const p = (async () => {
        try {
          if (stream) for await (const _ of await client.chat.completions.create({ model, messages, stream: true }, { signal: ctrl.signal }));
          else await client.chat.completions.create({ model, messages }, { signal: ctrl.signal });
          return 'ok';
        } catch (e) {
          return e instanceof OpenAI.APIUserAbortError ? 'aborted' : `error ${(e as Error).message.slice(0, 80)}`;
        }
      })();
      calls.push(p);
    };
    // The hold-off first (one request gets the 429; it waits the 8 s hint itself, under maxWaitHintMs), then 99 that park.
    call('held', false);
    // (Known on the instance that got the 429; another learns of it from Redis when it first sees the target.)
    await until('the hold-off is in force', async () => (await metric(urls[0]!, 'stormgate_hold_remaining_seconds{target="mock/held",kind="hold_off",tier="all"}')) > 0, 5_000);
    for (let i = 0; i < 99; i++) call('held', i % 2 === 0);
    for (let i = 0; i < 400; i++) call('gpt-4o', i % 2 === 0);
    const fleet = async (name: string) => {
      let sum = 0;
      for (const url of urls) sum += sums(await metricsText(url)).get(name) ?? 0;
      return sum;
    };
    // (A fleet may briefly send a few more than 32 while the shares settle: README, "A fleet shares one maxConcurrent".)
    await until('the slots in flight, the rest queued and parked', async () => {
      const inflight = mock.stats().inflight;
      return inflight >= 32 && inflight === (await fleet('stormgate_pool_in_use')) && inflight + (await fleet('stormgate_pool_queue_depth')) === 400 && (await fleet('stormgate_parked_requests')) === 99;
    }, 10_000);
    expect(await fleet('stormgate_waiting_body_bytes')).toBeGreaterThan(0);
    // (Taken at the abort: a fleet's share exchange may start a few more attempts until then.)
    const upBefore = received(mock).length;
    const inflightBefore = mock.stats().inflight;
    // Everyone leaves at once.
    const leftAt = Date.now();
    ctrl.abort();
    const endings = await Promise.all(calls);
    expect(endings.every((e) => e === 'aborted')).toBe(true);
    // The 32 hung attempts were aborted upstream (the mock saw each client go) as soon as the gateway had read the
    // 500 closes (1.5 s at worst on a loaded machine; a few ms when it is idle), and nothing more reached the
    // provider: no queued or parked request went up after its client left.
    await until('the provider saw the aborts', () => mock.stats().inflight === 0 && mock.stats().aborted === inflightBefore, 6_000);
    const abortMs = Math.max(...mock.requests().filter((r) => r.aborted).map((r) => r.endedAt! - leftAt));
    console.info('ghosts', JSON.stringify({ instances, abortedUpstream: inflightBefore, lastAbortMs: abortMs }));
    expect(abortMs).toBeLessThan(5_000);
    await sleep(1_500);
    expect(received(mock).length).toBe(upBefore);
    for (const url of urls) expect(leftOver(await metricsText(url))).toEqual([]);
    for (const name of ['stormgate_pool_in_use', 'stormgate_pool_queue_depth', 'stormgate_parked_requests', 'stormgate_waiting_body_bytes']) expect(await fleet(name)).toBe(0);
    // Each of the 500 counted once, as a client that left; the upstream attempts as aborted.
    await until('500 requests counted as client_gone', async () => (await metric(urls, 'stormgate_requests_total{route="chat"')) === 500, 3_000);
    let gone = 0;
    for (const url of urls) gone += await sumOutcome(url, 'client_gone');
    expect(gone).toBe(500);
    // (An attempt still connecting as its client left is counted too, and never reached the provider: on a loaded
    // machine, as the fleet's shares settle, up to a pool's worth (a CI run counted 48 for 40 in flight), never more.)
    const abortedAttempts = await metric(urls, 'stormgate_upstream_attempts_total{target="mock/gpt-4o",status_class="aborted"}');
    expect(abortedAttempts).toBeGreaterThanOrEqual(inflightBefore);
    expect(abortedAttempts).toBeLessThanOrEqual(inflightBefore + 32);
    // And the gateway is at once fully usable: its pool is free for the next caller.
    await dispatcher.close();
    for (const g of gws) await until('the agents\u2019 connections are closed', async () => (await openConnections(g)) <= 3, 3_000);
    mock.patchFaults({ latencyMs: 20 });
    for (const url of urls) expect((await sdk(url, []).chat.completions.create({ model: 'gpt-4o', messages })).choices[0]?.message.content).toBeTruthy();
  }, 40_000);
});

async function sumOutcome(url: string, outcome: string): Promise<number> {
  return (await metricsText(url))
    .split('\n')
    .filter((l) => l.startsWith('stormgate_requests_total{route="chat"') && l.includes(`outcome="${outcome}"`))
    .reduce((a, l) => a + Number(l.split(' ').at(-1)), 0);
}

// ---------------------------------------------------------------------------------------------------------------
describe('slow, silent and half-closed clients while real traffic flows', () => {
  it('slowloris headers, stalled bodies and silent connections are closed after requestTimeoutMs; 300 real calls and the ops endpoints are not slowed', async () => {
    const mock = await startMock({ faults: { latencyMs: 50 }, apiKey: TEST_KEY });
    // requestTimeoutMs (README: "Longest a client may take to send its whole request, headers and body; past it the
    // gateway answers 408 and closes the connection"), shortened from its 60 s default.
    const [g] = await startGateways(configFor(mock, { server: { requestTimeoutMs: 2_000 } }));
    const url = g!.url;
    const attackers: Array<Promise<{ kind: string; text: string; closedAt: number; openedAt: number }>> = [];
    const openedAt = Date.now();
    const stopTrickle = new AbortController();
    for (let i = 0; i < 300; i++) {
      const kind = ['silent', 'slow-headers', 'stalled-body'][i % 3]!;
      const socket = await rawSocket(url);
      const ended = collect(socket).then((r) => ({ kind, openedAt, ...r }));
      attackers.push(ended);
      if (kind === 'slow-headers') {
        socket.write(`POST ${CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\n`);
        // One more header line every 300 ms, never the blank line that ends them.
        void (async () => {
          for (let n = 0; !socket.destroyed && !stopTrickle.signal.aborted; n++) {
            await sleep(300);
            if (!socket.destroyed) socket.write(`x-trickle-${n}: ${n}\r\n`);
          }
        })();
      } else if (kind === 'stalled-body') {
        socket.write(`POST ${CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{"model":"gpt`);
      }
    }
    // Meanwhile 300 real calls over about 3 s, and the ops endpoints polled.
    const ops = probeOps(url);
    const wire: Wire[] = [];
    const dispatcher = new Agent({ connections: 1_000 });
    const client = sdk(url, wire, dispatcher);
    const times = await Promise.all(
      Array.from({ length: 300 }, async (_, i) => {
        await sleep(i * 10);
        const t = Date.now();
        await client.chat.completions.create({ model: 'gpt-4o', messages });
        return Date.now() - t;
      }),
    );
    const results = await Promise.all(attackers);
    stopTrickle.abort();
    const seen = await ops.stop();
    await dispatcher.close();
    const closedAfter = results.map((r) => r.closedAt - r.openedAt);
    console.info('slow clients', JSON.stringify({ realP50: pct(times, 0.5), realP99: pct(times, 0.99), closedMinMs: Math.min(...closedAfter), closedMaxMs: Math.max(...closedAfter), statuses: tally(results.map((r) => `${r.kind} ${statusOf(r.text)}`)), opsMaxMs: Math.max(...seen.map((s) => s.ms)) }));
    // The real traffic was served as if nothing else happened (p99 0.9-1.9 s with this process's own 600 sockets on a
    // shared machine; 3.1 s once at a load average of 10).
    expect(wire.every((w) => w.status === 200)).toBe(true);
    expect(pct(times, 0.99)).toBeLessThan(5_000);
    expect(seen.every((s) => s.status === 200)).toBe(true);
    // Every slow connection was closed, none before its time and none much after it (Node checks every quarter of
    // requestTimeoutMs here); trickling a header line every 300 ms bought nothing.
    expect(Math.min(...closedAfter)).toBeGreaterThan(1_500);
    expect(Math.max(...closedAfter)).toBeLessThan(6_000);
    // Each was told why, in the OpenAI shape (408 request_timeout), the silent ones too.
    for (const r of results) {
      expect(statusOf(r.text)).toBe(408);
      expect(r.text).toContain('request_timeout');
    }
    // Nothing of them reached the provider, nor counts as a managed request answered.
    expect(received(mock).length).toBe(300);
    await until('only this test\u2019s own connections are left', async () => (await openConnections(g!)) <= 3, 3_000);
  }, 40_000);

  it('half-closed sockets: a client that ends its sending side before its answer is taken as gone, and leaves no ghost upstream', async () => {
    // The README says a client that disconnects has its upstream request aborted; a TCP half-close (FIN after the
    // request, still reading) is read the same way (Node's default, as nginx does: its 499). What a platform team
    // must know is that nothing is left running or held for it.
    const mock = await startMock({ faults: { latencyMs: 1_000, stream: { chunks: 4, chunkDelayMs: 50 } }, apiKey: TEST_KEY });
    const [g] = await startGateways(configFor(mock));
    const answers = await Promise.all(
      Array.from({ length: 100 }, async (_, i) => {
        const stream = i % 2 === 1;
        const body = JSON.stringify({ model: 'gpt-4o', messages, stream });
        const socket = await rawSocket(g!.url);
        const done = collect(socket);
        socket.write(`POST ${CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
        // Half-closed once the provider has it (in flight), or at once (before the gateway read it all, for some).
        await sleep(i % 4 === 0 ? 0 : 300);
        socket.end();
        return { stream, ...(await done) };
      }),
    );
    console.info('half-closed', JSON.stringify(tally(answers.map((a) => String(statusOf(a.text))))));
    // Nobody waited for an answer that never came: every connection was closed by the gateway at once.
    expect(answers.every((a) => a.text === '')).toBe(true);
    // Each attempt that reached the provider was aborted there within moments, and none was retried or sent again.
    // (Some went up after their client's FIN was already in the socket: on a busy event loop a request and the FIN
    // behind it are read in two turns, and the attempt is written in between; it is aborted at the next read.)
    await until('every request is logged', async () => (await sumOutcome(g!.url, 'client_gone')) === 100, 5_000);
    await until('the provider has nothing in flight', () => mock.stats().inflight === 0, 3_000);
    const up = received(mock);
    expect(up.length).toBeLessThanOrEqual(100);
    expect(up.every((r) => r.aborted && r.endedAt! - r.receivedAt < 1_000)).toBe(true);
    expect(new Set(up.map((r) => r.headers['x-client-request-id'])).size).toBe(up.length);
    expect(await sumOutcome(g!.url, 'client_gone')).toBe(100);
    expect(leftOver(await metricsText(g!.url))).toEqual([]);
    expect(await openConnections(g!)).toBeLessThanOrEqual(3);
  }, 30_000);
});

function tally(xs: string[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const x of xs) out[x] = (out[x] ?? 0) + 1;
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
describe('connections: churn, keep-alive across failures, and a load balancer in front', () => {
  it('500 requests, each on a new connection: all answered, every connection closed, the provider reached over a few kept connections', async () => {
    const mock = await startMock({ faults: { latencyMs: 30 }, apiKey: TEST_KEY });
    const [g] = await startGateways(configFor(mock));
    let connections = 0;
    g!.app.server.on('connection', () => connections++);
    const answers: RawAnswer[] = [];
    let peakMockSockets = 0;
    // 100 at a time, five waves.
    for (let wave = 0; wave < 5; wave++) {
      answers.push(...(await Promise.all(Array.from({ length: 100 }, () => churnRequest(g!.url)))));
      peakMockSockets = Math.max(peakMockSockets, socketsTo(mock.port));
    }
    expect(answers.every((a) => a.status === 200)).toBe(true);
    expect(connections).toBe(500);
    await until('every churned connection is closed', async () => (await openConnections(g!)) === 0, 2_000);
    // Upstream, the gateway reuses its keep-alive pool (64 connections at most here) instead of churning too.
    expect(peakMockSockets).toBeLessThanOrEqual(2 * 64);
    expect(received(mock).length).toBe(500);
  }, 30_000);

  it('keep-alive clients reuse their connections across 503s, circuit_open and 429s: the gateway answers errors without closing', async () => {
    const mock = await startMock({ faults: { latencyMs: 20 }, apiKey: TEST_KEY });
    // No parking: an open breaker answers 503 circuit_open at once.
    const [g] = await startGateways(configFor(mock, { route: { park: false, retry: { maxAttempts: 1 } } }));
    let connections = 0;
    g!.app.server.on('connection', () => connections++);
    const dispatcher = new Agent({ connections: 20 });
    const statuses: number[] = [];
    const closes: Array<string | undefined> = [];
    const send = async () => {
      const res = await undiciFetch(`${g!.url}${CHAT}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: BODY, dispatcher });
      await res.arrayBuffer();
      statuses.push(res.status);
      closes.push(res.headers.get('connection') ?? undefined);
    };
    const burst = (n: number) => Promise.all(Array.from({ length: n }, (_, i) => sleep(i * 2).then(send)));
    await burst(100);
    // 429 with retry-after (passed on, then provider_held_off while the hold-off lasts), then 503s that open the
    // breaker (503 circuit_open from then on: no parking here).
    mock.brownout('429', 1_000);
    await burst(100);
    await sleep(1_100);
    mock.brownout('503', 1_500);
    await burst(200);
    await burst(100);
    console.info('keep-alive across failures', JSON.stringify({ statuses: tally(statuses.map(String)), connections }));
    expect(statuses.filter((s) => s === 503).length).toBeGreaterThan(0);
    expect(statuses.filter((s) => s === 429).length).toBeGreaterThan(0);
    // 500 requests, a fifth of them or more errors, over 20 kept connections: no error answer closed its connection.
    expect(closes.filter((c) => c?.toLowerCase() === 'close')).toEqual([]);
    expect(connections).toBeLessThanOrEqual(20);
    await dispatcher.close();
  }, 30_000);

  it("the gateway's client-side idle timeout outlasts a load balancer's (AWS ALB's default 60 s), and says so in Keep-Alive", async () => {
    // A load balancer that keeps idle connections to its targets longer than the target does sends a request on a
    // connection the target is closing: a 502 for the client. The README (Deployment) gives the gateway's value.
    const mock = await startMock({ faults: { latencyMs: 5 }, apiKey: TEST_KEY });
    const [g] = await startGateways(configFor(mock));
    expect(g!.app.server.keepAliveTimeout).toBeGreaterThan(60_000);
    // Node checks idle connections' headers timer against headersTimeout: it must not cut a kept connection sooner.
    const socket = await rawSocket(g!.url);
    const got = collect(socket);
    const req = `POST ${CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(BODY)}\r\n\r\n${BODY}`;
    socket.write(req);
    await sleep(500);
    // Idle for 2.5 s (past the provider-side keepAliveMs of 4 s would be too long for a test; the point is the
    // client side), then the next request on the same connection.
    await sleep(2_500);
    expect(socket.destroyed).toBe(false);
    socket.write(req);
    await sleep(500);
    socket.end();
    const { text } = await got;
    const heads = text.split('HTTP/1.1 ').slice(1);
    expect(heads.map((h) => Number(h.slice(0, 3)))).toEqual([200, 200]);
    expect(/keep-alive: timeout=(\d+)/i.exec(text)?.[1]).toBe(String(Math.floor(g!.app.server.keepAliveTimeout / 1000)));
  }, 20_000);
});

// ---------------------------------------------------------------------------------------------------------------
describe('priority: online requests during a batch flood of 500', () => {
  it('the online calls are served promptly while 500 batch calls queue or are shed with 429 and a retry-after', async () => {
    // The provider takes 20 at a time (pool sized to it, as the README asks) and answers in 200 ms.
    const mock = await startMock({ faults: { latencyMs: 200, capacity: 20 }, apiKey: TEST_KEY });
    const [g] = await startGateways(configFor(mock, { provider: { pools: { maxConcurrent: 20 } } }));
    const url = g!.url;
    const dispatcher = new Agent({ connections: 1_000 });
    const batchWire: Wire[] = [];
    const batchClient = sdk(url, batchWire, dispatcher, { maxRetries: 0, defaultHeaders: { 'x-stormgate-priority': 'batch' } });
    const onlineWire: Wire[] = [];
    const onlineClient = sdk(url, onlineWire, dispatcher, { maxRetries: 0 });
    const batch = Promise.all(
      Array.from({ length: 500 }, async () => {
        try {
          await batchClient.chat.completions.create({ model: 'gpt-4o', messages });
          return 200;
        } catch (e) {
          const err = e as InstanceType<typeof OpenAI.APIError>;
          if (err.status === 429) expect(err.headers?.get('retry-after')).toMatch(/^\d+$/);
          return err.status ?? 0;
        }
      }),
    );
    await until('the batch flood fills the pool', async () => (await metric(url, 'stormgate_pool_queue_depth{provider="mock",priority="batch"}')) > 100, 5_000);
    const online = await Promise.all(
      Array.from({ length: 30 }, async (_, i) => {
        await sleep(i * 100);
        const t = Date.now();
        await onlineClient.chat.completions.create({ model: 'gpt-4o', messages });
        return Date.now() - t;
      }),
    );
    const batchStatuses = await batch;
    await dispatcher.close();
    console.info('priority', JSON.stringify({ onlineP50: pct(online, 0.5), onlineMax: Math.max(...online), batch: tally(batchStatuses.map(String)), upstream429: received(mock).filter((r) => r.status === 429).length }));
    // Every online call answered within a few provider answers of waiting (the batch backlog is 500 x 200 ms / 20 = 5 s
    // deep).
    expect(onlineWire.every((w) => w.status === 200)).toBe(true);
    expect(pct(online, 0.5)).toBeLessThan(1_000);
    expect(Math.max(...online)).toBeLessThan(2_500);
    // Batch: served or shed as the lowest class (429, told when to come back); nothing else.
    expect(batchStatuses.every((s) => s === 200 || s === 429)).toBe(true);
    expect(batchStatuses.filter((s) => s === 200).length).toBeGreaterThan(100);
    expect(leftOver(await metricsText(url))).toEqual([]);
  }, 40_000);
});
