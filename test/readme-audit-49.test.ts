// README claims checked by running them (audit 49: "Health, readiness, shutdown" on a real process, "Deployment" (client
// connections, the nginx block's numbers, config/docker.yaml served as the compose stack serves it), grafana/README.md
// (its table of files, the recording rules and alerts tables, the Prometheus config of "Without Docker", the demo
// profile's mock), and "Tests and benchmarks" (scripts, options, results files)), pinned here where no earlier audit
// held them. Two README sentences were made exact rather than the code changed: a signal during start-up's wait for
// Redis stops the start-up once that wait (at most a second) is over, not at once; and one that comes while npm itself
// is still loading, before it runs the script, ends npm by the signal (nothing has started), not with exit 0.
import { once } from 'node:events';
import { existsSync, mkdtempSync, readFileSync, readdirSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import { Agent, request as httpRequest, type IncomingHttpHeaders } from 'node:http';
import { connect, createServer as createNetServer, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { parse as parseYaml } from 'yaml';
import { loadConfigFile } from '../src/config/load.ts';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { createMetrics } from '../src/observability/metrics.ts';
import { freePort } from './helpers/free-port.ts';
import { useOneGatewayProcess } from './helpers/gateway-process.ts';
import { mockCli } from './helpers/mock-cli.ts';
import { mockControl } from './helpers/mock-control.ts';
import { RETRY_LOOP_ONLY, TEST_KEY, defaultConfig, requestLine, useExtraMocks, useStacks } from './helpers/stack.ts';

const ROOT = join(import.meta.dirname, '..');
const read = (path: string): string => readFileSync(join(ROOT, path), 'utf8');
const README = read('README.md');
const GRAFANA_README = read('grafana/README.md');

/** The README's text from `heading` to the next heading of its level or above. */
function section(text: string, heading: string): string {
  const start = text.indexOf(`${heading}\n`);
  if (start < 0) throw new Error(`no section ${heading}`);
  const level = /^#+/.exec(heading)![0];
  const rest = text.slice(start + heading.length + 1);
  const end = rest.search(new RegExp(`^#{1,${level.length}} `, 'm'));
  return end < 0 ? rest : rest.slice(0, end);
}

/** The rows of the first markdown table in `text`, as cells (backticks kept). */
function tableRows(text: string): string[][] {
  const lines = text.split('\n').filter((l) => l.startsWith('|'));
  return lines.slice(2).map((l) => l.slice(1, -1).split(/(?<!\\)\|/).map((c) => c.trim()));
}

const CHAT = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'hi' }] };

/** A raw TCP connection to a port: what it received so far, and when it closed. */
function rawConnection(port: number): { socket: Socket; received: () => string; closed: Promise<number> } {
  const socket = connect(port, '127.0.0.1');
  let text = '';
  socket.on('data', (d: Buffer) => (text += d.toString()));
  socket.on('error', () => {});
  const closed = once(socket, 'close').then(() => Date.now());
  return { socket, received: () => text, closed };
}

/** One HTTP/1.1 request over node:http (whose headers keep `connection` and `keep-alive`, which fetch hides). */
function nodeRequest(url: string, path: string, opts: { method?: string; body?: unknown; agent?: Agent; headers?: Record<string, string> } = {}): Promise<{ status: number; headers: IncomingHttpHeaders; body: string; reused: boolean }> {
  return new Promise((resolve, reject) => {
    const body = opts.body === undefined ? undefined : JSON.stringify(opts.body);
    const req = httpRequest(`${url}${path}`, { method: opts.method ?? (body ? 'POST' : 'GET'), agent: opts.agent, headers: { ...(body ? { 'content-type': 'application/json' } : {}), ...opts.headers } }, (res) => {
      let text = '';
      res.on('data', (d: Buffer) => (text += d.toString()));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: text, reused: req.reusedSocket }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

describe('Health, readiness, shutdown (README), on a real gateway process', () => {
  const one = useOneGatewayProcess();
  const start = (drain: { preStopMs: number; graceMs: number }, stream = { chunks: 4, chunkDelayMs: 10 }) => one.start({ faults: { stream }, drain, logLevel: 'info' });

  it('SIGTERM: /readyz 503 "draining" (naming the store) at once, requests still served for preStopMs with Connection: close, then idle connections closed, new ones refused, and exit 0 long before graceMs', async () => {
    const { url, port } = await start({ preStopMs: 1_500, graceMs: 30_000 });
    // An idle keep-alive client: it never holds the exit.
    const idle = rawConnection(port);
    idle.socket.write('GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n');
    while (!idle.received().includes('"status":"ok"')) await sleep(10);
    const ready = await nodeRequest(url, '/readyz');
    expect(ready.status).toBe(200);
    expect(JSON.parse(ready.body)).toEqual({ status: 'ready', store: 'memory', degraded: false });

    const sentAt = Date.now();
    one.gateway!.proc.kill('SIGTERM');
    await sleep(150);
    const draining = await nodeRequest(url, '/readyz');
    expect(draining.status).toBe(503);
    expect(JSON.parse(draining.body)).toEqual({ status: 'draining', store: 'memory', degraded: false });
    expect(draining.headers.connection).toBe('close');

    // Still served during preStopMs, through the SDK; each answer closes its connection.
    const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'any', maxRetries: 0 });
    const { data, response } = await client.chat.completions.create(CHAT).withResponse();
    expect(data.choices[0]!.message.content).toBeTruthy();
    expect(Date.now() - sentAt).toBeLessThan(1_500);
    const served = await nodeRequest(url, '/v1/chat/completions', { body: CHAT });
    expect(served.status).toBe(200);
    expect(served.headers.connection).toBe('close');
    expect(response.status).toBe(200);

    // preStopMs over: the idle connection closed (within 100 ms, plus a loaded machine's slack), new ones refused.
    const idleClosedAt = await idle.closed;
    expect(idleClosedAt - sentAt).toBeGreaterThanOrEqual(1_400);
    expect(idleClosedAt - sentAt).toBeLessThan(1_500 + 1_000);
    // (A connection made at the very moment the listening socket closes, still in its backlog, is reset instead.)
    await sleep(300);
    const late = await nodeRequest(url, '/healthz').then(() => 'answered', (err: NodeJS.ErrnoException) => err.code);
    expect(late).toBe('ECONNREFUSED');
    expect(await one.gateway!.exited).toBe(0);
    expect(Date.now() - sentAt).toBeLessThan(10_000);
  });

  it('SIGTERM: a new request on a connection busy with a stream gets 503 gateway_draining, x-should-retry: true and a retry-after of at least 1 s; the stream finishes', async () => {
    const { port } = await start({ preStopMs: 300, graceMs: 20_000 }, { chunks: 20, chunkDelayMs: 100 });
    const conn = rawConnection(port);
    const streamBody = JSON.stringify({ ...CHAT, stream: true });
    conn.socket.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(streamBody)}\r\n\r\n${streamBody}`);
    while (!conn.received().includes('data: ')) await sleep(10);
    one.gateway!.proc.kill('SIGTERM');
    await sleep(800);
    const body = JSON.stringify(CHAT);
    conn.socket.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    await conn.closed;
    const text = conn.received();
    expect(text).toContain('data: [DONE]');
    const second = text.slice(text.indexOf('HTTP/1.1', 10));
    expect(second).toMatch(/^HTTP\/1\.1 503 /);
    expect(second).toMatch(/\r\nx-should-retry: true\r\n/i);
    expect(Number(/\r\nretry-after: (\d+)\r\n/i.exec(second)?.[1])).toBeGreaterThanOrEqual(1);
    expect(second).toContain('"code":"gateway_draining"');
    expect(await one.gateway!.exited).toBe(0);
  });

  it('a SIGTERM during start-up\'s wait for Redis stops it once that wait is over: the Redis connections closed, the port never opened, exit 0', async () => {
    // A "Redis" that takes connections and never answers: start-up waits for it (up to a second).
    const redisSockets: Socket[] = [];
    let closedByGateway = 0;
    const silentRedis = createNetServer((socket) => {
      redisSockets.push(socket);
      socket.on('error', () => {});
      socket.resume();
      socket.on('end', () => closedByGateway++);
    });
    silentRedis.listen(0, '127.0.0.1');
    await once(silentRedis, 'listening');
    try {
      const port = await freePort();
      const gateway = one.spawn({
        server: { host: '127.0.0.1', port },
        providers: { p: { family: 'openai', baseUrl: 'http://127.0.0.1:1/v1', apiKey: 'k' } },
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'p' }] }],
        state: { redis: `redis://127.0.0.1:${(silentRedis.address() as { port: number }).port}` },
      });
      while (redisSockets.length === 0) {
        expect(gateway.proc.exitCode, gateway.output()).toBeNull();
        await sleep(5);
      }
      const sentAt = Date.now();
      gateway.proc.kill('SIGTERM');
      expect(await gateway.exited).toBe(0);
      // Once the wait is over (it is not cut short): at most a second, and the start-up stops before the port.
      expect(Date.now() - sentAt).toBeLessThan(5_000);
      const out = gateway.output();
      expect(out.indexOf('starting on local state: Redis is not ready yet')).toBeGreaterThanOrEqual(0);
      expect(out.indexOf('stopped during start-up')).toBeGreaterThan(out.indexOf('starting on local state'));
      expect(out).not.toMatch(/listening/i);
      expect(await fetch(`http://127.0.0.1:${port}/healthz`).then(() => 'answered', () => 'closed')).toBe('closed');
      await sleep(100);
      expect(closedByGateway).toBe(redisSockets.length);
    } finally {
      for (const socket of redisSockets) socket.destroy();
      silentRedis.close();
    }
  });

  it('SIGINT closes at once (no preStopMs), exit 0; SIGHUP is logged as a warning and ignored', async () => {
    const { url } = await start({ preStopMs: 10_000, graceMs: 30_000 });
    // The file is read once, at start: a changed file and a SIGHUP change nothing.
    writeFileSync(one.gateway!.file, readFileSync(one.gateway!.file, 'utf8').replace('/v1/chat/completions', '/v1/embeddings'));
    one.gateway!.proc.kill('SIGHUP');
    await sleep(300);
    expect(one.gateway!.proc.exitCode).toBeNull();
    expect((await nodeRequest(url, '/readyz')).status).toBe(200);
    expect((await nodeRequest(url, '/v1/chat/completions', { body: CHAT })).status).toBe(200);
    const warning = one.gateway!.output().split('\n').filter(Boolean).map((l) => JSON.parse(l) as { level: number; msg: string }).find((l) => l.msg.startsWith('SIGHUP ignored'));
    expect(warning?.level).toBe(40);
    const sentAt = Date.now();
    one.gateway!.proc.kill('SIGINT');
    expect(await one.gateway!.exited).toBe(0);
    expect(Date.now() - sentAt).toBeLessThan(5_000);
  });

  it('when the grace period is over, a running stream ends with an error the openai SDK raises ("the gateway instance is shutting down"), and the process exits 0', async () => {
    const { url } = await start({ preStopMs: 0, graceMs: 600 }, { chunks: 100, chunkDelayMs: 100 });
    const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'any', maxRetries: 0 });
    const stream = await client.chat.completions.create({ ...CHAT, stream: true });
    let chunks = 0;
    const failure = (async () => {
      for await (const _ of stream) if (++chunks === 1) one.gateway!.proc.kill('SIGTERM');
    })().then(() => undefined, (err: Error) => err);
    const err = await failure;
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err!.message).toContain('the gateway instance is shutting down');
    expect(chunks).toBeGreaterThan(1);
    expect(await one.gateway!.exited).toBe(0);
  });
});

describe('npm start and signals (README "Health, readiness, shutdown")', () => {
  /** `npm start -- --config FILE` in its own process group (killed whole afterwards), with its output. */
  function npmStart(file: string): { proc: ChildProcess; output: () => string; exited: Promise<number | null> } {
    const proc = spawn('npm', ['start', '--silent', '--', '--config', file], { cwd: ROOT, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    proc.stdout!.on('data', (d: Buffer) => (output += d.toString()));
    proc.stderr!.on('data', (d: Buffer) => (output += d.toString()));
    const exited = once(proc, 'exit').then(([code]) => code as number | null);
    return { proc, output: () => output, exited };
  }
  let started: ChildProcess | undefined;
  let dir: string | undefined;
  afterEach(() => {
    if (started?.pid) {
      try {
        process.kill(-started.pid, 'SIGKILL');
      } catch {
        // The group is gone already.
      }
    }
    if (dir) rmSync(dir, { recursive: true, force: true });
    started = dir = undefined;
  });
  const configFile = (port: number): string => {
    dir = mkdtempSync(join(tmpdir(), 'audit49-npm-'));
    const file = join(dir, 'gw.yaml');
    writeFileSync(file, `server: { host: 127.0.0.1, port: ${port} }
providers: { p: { family: openai, baseUrl: "http://127.0.0.1:1/v1", apiKey: k } }
routes: [ { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: p } ] } ]
drain: { preStopMs: 200, graceMs: 5000 }
`);
    return file;
  };

  it('the start script execs node, so a SIGTERM sent to npm drains the gateway, which exits 0 (npm too)', async () => {
    expect(JSON.parse(read('package.json')).scripts.start).toMatch(/^exec node /);
    const port = await freePort();
    const run = npmStart(configFile(port));
    started = run.proc;
    const deadline = Date.now() + 30_000;
    while (!(await fetch(`http://127.0.0.1:${port}/readyz`).then((r) => r.ok, () => false))) {
      expect(Date.now() < deadline && run.proc.exitCode === null, run.output()).toBe(true);
      await sleep(100);
    }
    run.proc.kill('SIGTERM');
    expect(await run.exited).toBe(0);
    expect(await fetch(`http://127.0.0.1:${port}/healthz`).then(() => 'answered', () => 'closed')).toBe('closed');
  }, 60_000);

  // A SIGTERM while npm start loads tsx and the modules (after npm started node): cli.test.ts holds that start-up
  // where it is (a fifo for tsx's tsconfig), so the signal lands there whatever the machine's load; a sleep here did not.

  it('a SIGTERM while npm itself is still loading, before it runs the script, ends npm by the signal, with nothing started', async () => {
    const port = await freePort();
    const run = npmStart(configFile(port));
    started = run.proc;
    await sleep(50);
    expect(childPids(run.proc.pid!).some((pid) => isNode(pid))).toBe(false);
    run.proc.kill('SIGTERM');
    await run.exited;
    expect(run.proc.signalCode).toBe('SIGTERM');
    await sleep(500);
    expect(await fetch(`http://127.0.0.1:${port}/healthz`).then(() => 'answered', () => 'closed')).toBe('closed');
  }, 60_000);

  it('Node raises its soft open-files limit to the hard one (README Deployment)', () => {
    const out = execFileSync('sh', ['-c', `ulimit -Sn 256; exec "${process.execPath}" -e 'process.stdout.write(require("fs").readFileSync("/proc/self/limits","utf8"))'`], { encoding: 'utf8' });
    const [, soft, hard] = /^Max open files\s+(\S+)\s+(\S+)/m.exec(out)!;
    expect(soft).toBe(hard);
  });
});

/** The processes whose parent is `pid`, and theirs. */
function childPids(pid: number): number[] {
  const out: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid === pid) out.push(Number(entry), ...childPids(Number(entry)));
    } catch {
      // Gone meanwhile.
    }
  }
  return out;
}

/** Whether process `pid` is the gateway's node, after the script's shell exec'd it. */
function isNode(pid: number): boolean {
  try {
    return readlinkSync(`/proc/${pid}/exe`) === process.execPath && readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('early-signals');
  } catch {
    return false;
  }
}

describe('a drain, in process (README "Health, readiness, shutdown")', () => {
  const startStack = useStacks();
  const startBackup = useExtraMocks();

  it('answers a parked request at once when preStopMs is over, with 503, x-should-retry: true and a retry-after, not at its deadline', async () => {
    const s = await startStack({
      faults: { errors: [{ status: 503, rate: 1 }] },
      config: (mockUrl) => {
        const c = defaultConfig(mockUrl, { route: { retry: { maxAttempts: 1 } }, provider: { breaker: { minRequests: 1, openS: 60 } } });
        return { ...c, drain: { preStopMs: 500, graceMs: 20_000 } };
      },
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'any', maxRetries: 0 });
    await client.chat.completions.create(CHAT).catch(() => undefined);
    await sleep(100);
    // The breaker is open: this one parks (the provider still answers 503, so no probe lets it go).
    const parkedAt = Date.now();
    const parked = nodeRequest(s.url, '/v1/chat/completions', { body: CHAT });
    await sleep(200);
    const drained = (s.gateway as unknown as { drain(): Promise<void> }).drain();
    const answer = await parked;
    expect(answer.status).toBe(503);
    expect(answer.headers['x-should-retry']).toBe('true');
    expect(Number(answer.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    expect(Date.now() - parkedAt).toBeGreaterThanOrEqual(200 + 450);
    expect(Date.now() - parkedAt).toBeLessThan(200 + 500 + 1_500);
    await drained;
  });

  it('from SIGTERM on, hands a retry whose wait would pass the grace end to the route\'s next target at once', async () => {
    const backup = await startBackup({ apiKey: 'backup-key' });
    const s = await startStack({
      faults: { errors: [{ status: 503, rate: 1 }] },
      config: (mockUrl) => {
        const c = defaultConfig(mockUrl, RETRY_LOOP_ONLY);
        return {
          ...c,
          providers: { ...c.providers, backup: { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: 'backup-key', breaker: false } },
          // A fixed 3 s backoff (no wait hint: a 503 with one would hold the target off and hand over at once anyway).
          routes: [{ ...c.routes[0]!, targets: [{ provider: 'mock' }, { provider: 'backup' }], retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 3_000, capMs: 3_000 } } }],
          drain: { preStopMs: 300, graceMs: 1_000 },
        };
      },
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'any', maxRetries: 0 });
    // Serving: the backoff is waited out, the second attempt fails too, then the backup answers.
    const servingAt = Date.now();
    const served = await client.chat.completions.create(CHAT).withResponse();
    expect(served.response.headers.get('x-stormgate-target')).toBe('backup/gpt-4o');
    expect(Date.now() - servingAt).toBeGreaterThanOrEqual(2_900);
    const drained = (s.gateway as unknown as { drain(): Promise<void> }).drain();
    const sentAt = Date.now();
    const { data, response } = await client.chat.completions.create(CHAT).withResponse();
    expect(data.choices[0]!.message.content).toBeTruthy();
    expect(response.headers.get('x-stormgate-target')).toBe('backup/gpt-4o');
    expect(Date.now() - sentAt).toBeLessThan(1_300);
    await drained;
  });
});

describe('grace over, in process: the stream\'s end is counted', () => {
  const startStack = useStacks();
  it('counts a stream the grace period ended in stormgate_stream_ends_total{end="shutdown"} and as a stream_error request', async () => {
    const metrics = createMetrics({ defaultMetrics: false });
    const s = await startStack({
      faults: { stream: { chunks: 100, chunkDelayMs: 100 } },
      config: (mockUrl) => ({ ...defaultConfig(mockUrl), drain: { preStopMs: 0, graceMs: 300 } }),
      deps: { metrics },
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'any', maxRetries: 0 });
    const stream = await client.chat.completions.create({ ...CHAT, stream: true });
    const read = (async () => {
      for await (const _ of stream);
    })().then(() => undefined, (err: Error) => err);
    await (s.gateway as unknown as { drain(): Promise<void> }).drain();
    expect(await read).toBeInstanceOf(OpenAI.APIError);
    const text = await metrics.registry.metrics();
    expect(text).toMatch(/^stormgate_stream_ends_total\{[^}]*end="shutdown"[^}]*\} 1$/m);
    expect(text).toMatch(/^stormgate_requests_total\{[^}]*outcome="stream_error"[^}]*\} 1$/m);
  });
});

describe('Deployment (README): client connections', () => {
  const startStack = useStacks();

  it('answers say Keep-Alive: timeout=72 by default (server.keepAliveTimeoutMs 72000), above AWS ALB\'s 60 s', async () => {
    const s = await startStack();
    expect(s.config.server.keepAliveTimeoutMs).toBe(72_000);
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    const res = await nodeRequest(s.url, '/v1/chat/completions', { body: CHAT, agent });
    expect(res.status).toBe(200);
    expect(res.headers['keep-alive']).toBe('timeout=72');
    agent.destroy();
  });

  it('keeps the connection open after error answers (an upstream 503, a 429, circuit_open): the next request rides the same socket', async () => {
    const s = await startStack({
      faults: { errors: [{ status: 503, rate: 1 }] },
      route: { retry: { maxAttempts: 1 }, park: false },
      provider: { breaker: { failureRate: 0.5, minRequests: 1, windowS: 10, openS: 30 } },
    });
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    const first = await nodeRequest(s.url, '/v1/chat/completions', { body: CHAT, agent });
    expect(first.status).toBe(503);
    expect(first.headers.connection).toBe('keep-alive');
    // Until the breaker has opened (its window is read a moment after the failure is recorded), all on one socket.
    let open = first;
    for (let i = 0; i < 20 && JSON.parse(open.body).error.code !== 'circuit_open'; i++) {
      await sleep(50);
      open = await nodeRequest(s.url, '/v1/chat/completions', { body: CHAT, agent });
      expect(open.status).toBe(503);
      expect(open.reused).toBe(true);
      expect(open.headers.connection).toBe('keep-alive');
    }
expect(JSON.parse(open.body).error.code).toBe('circuit_open');
    const limited = await nodeRequest(s.url, '/v1/embeddings', { body: { model: 'text-embedding-3-small', input: 'x' }, agent });
    expect(limited.reused).toBe(true);
    await mockControl(s.mock, 'PUT', 'faults', { errors: [{ status: 429, rate: 1 }] });
    const tooMany = await nodeRequest(s.url, '/v1/completions', { body: { model: 'gpt-3.5-turbo-instruct', prompt: 'x' }, agent });
    expect(tooMany.status).toBe(429);
    expect(tooMany.headers.connection).toBe('keep-alive');
    const after = await nodeRequest(s.url, '/healthz', { agent });
    expect(after.reused).toBe(true);
    agent.destroy();
  });

  it('answers a connection that trickles its headers, and one that sends nothing, 408 request_timeout and closes it requestTimeoutMs after it began (up to a quarter later)', async () => {
    const s = await startStack({ config: (mockUrl) => ({ ...defaultConfig(mockUrl), server: { host: '127.0.0.1', port: 0, requestTimeoutMs: 1_000 } }) });
    const port = Number(new URL(s.url).port);
    const trickle = rawConnection(port);
    const silent = rawConnection(port);
    const openedAt = Date.now();
    trickle.socket.write('POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n');
    const timer = setInterval(() => trickle.socket.writable && trickle.socket.write('x'), 100);
    const [trickleClosed, silentClosed] = await Promise.all([trickle.closed, silent.closed]);
    clearInterval(timer);
    for (const [conn, closedAt] of [[trickle, trickleClosed], [silent, silentClosed]] as const) {
      expect(conn.received()).toMatch(/^HTTP\/1\.1 408 /);
      expect(conn.received()).toContain('"code":"request_timeout"');
      expect(closedAt - openedAt).toBeGreaterThanOrEqual(900);
      expect(closedAt - openedAt).toBeLessThan(1_000 + 250 + 1_000);
    }
  });

  it('gives headers 60 s at most whatever requestTimeoutMs is, and checks every quarter of requestTimeoutMs', async () => {
    const s = await startStack({ config: (mockUrl) => ({ ...defaultConfig(mockUrl), server: { host: '127.0.0.1', port: 0, requestTimeoutMs: 120_000 } }) });
    expect(s.gateway.server.requestTimeout).toBe(120_000);
    expect(s.gateway.server.headersTimeout).toBe(60_000);
    expect((s.gateway.server as unknown as { connectionsCheckingInterval: number }).connectionsCheckingInterval).toBe(30_000);
  });

  it('marks each stream X-Accel-Buffering: no, so nginx passes its events on with proxy_buffering on', async () => {
    const s = await startStack();
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'any', maxRetries: 0 });
    const { data: stream, response } = await client.chat.completions.create({ ...CHAT, stream: true }).withResponse();
    for await (const _ of stream);
    expect(response.headers.get('x-accel-buffering')).toBe('no');
  });

  it('takes a client that half-closes before its answer as gone: no answer, the request logged client_gone', async () => {
    const s = await startStack({ faults: { latencyMs: 1_500 } });
    const conn = rawConnection(Number(new URL(s.url).port));
    const body = JSON.stringify(CHAT);
    conn.socket.end(`POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`);
    await conn.closed;
    expect(conn.received()).toBe('');
    const line = await requestLine(s);
    expect(line.outcome).toBe('client_gone');
  });

  it('answers Host: gateways (nginx\'s default Host, the upstream block\'s name: no dot) on a loopback address', async () => {
    const s = await startStack();
    const res = await nodeRequest(s.url, '/v1/chat/completions', { body: CHAT, headers: { host: 'gateways' } });
    expect(res.status).toBe(200);
  });
});

describe('Deployment (README): the nginx block against the gateway\'s defaults', () => {
  const deployment = section(README, '### Deployment');
  const nginx = /```nginx\n([\s\S]*?)```/.exec(deployment)![1]!;
  const defaults = ConfigSchema.parse({
    providers: { p: { family: 'openai', baseUrl: 'http://127.0.0.1:1/v1', apiKey: 'k' } },
    routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'p' }] }],
    passthrough: { provider: 'p', paths: ['/v1/files'] },
  });

  it('proxy_read_timeout above the default routes[].timeoutMs and passthrough.timeoutMs (120 s); client_max_body_size above bodyLimitBytes (10 MiB); nginx keepalive_timeout (60 s) below keepAliveTimeoutMs (72 s)', () => {
    const readTimeoutS = Number(/proxy_read_timeout (\d+)s;/.exec(nginx)![1]);
    expect(defaults.routes[0]!.timeoutMs).toBe(120_000);
    expect(defaults.passthrough!.timeoutMs).toBe(120_000);
    expect(readTimeoutS * 1000).toBeGreaterThan(defaults.routes[0]!.timeoutMs);
    const maxBody = /client_max_body_size (\d+)m;/.exec(nginx)![1];
    expect(defaults.server.bodyLimitBytes).toBe(10 * 1024 * 1024);
    expect(Number(maxBody) * 1024 * 1024).toBeGreaterThan(defaults.server.bodyLimitBytes);
    expect(defaults.server.keepAliveTimeoutMs).toBeGreaterThan(60_000);
    expect(deployment).toContain('(120 s by default)');
  });

  const startStack = useStacks();
  it('answers a body over bodyLimitBytes 413 request_too_large, naming the limit (what nginx\'s own 413 page would hide)', async () => {
    const s = await startStack();
    const big = JSON.stringify({ ...CHAT, messages: [{ role: 'user', content: 'x'.repeat(10 * 1024 * 1024) }] });
    const res = await fetch(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: big });
    expect(res.status).toBe(413);
    const err = ((await res.json()) as { error: { code: string; message: string } }).error;
    expect(err.code).toBe('request_too_large');
    expect(err.message).toContain('10485760');
  });
});

describe('grafana/README.md and config/docker.yaml', () => {
  it('lists in "What is where" only paths that exist, and the values it names are the files\' own', () => {
    const rows = tableRows(section(GRAFANA_README, '## What is where'));
    expect(rows.length).toBeGreaterThanOrEqual(10);
    for (const [paths] of rows) for (const p of paths!.matchAll(/`([^`]+)`/g)) expect(existsSync(join(ROOT, p[1]!)), p[1]).toBe(true);
    const ds = parseYaml(read('grafana/provisioning/datasources/prometheus.yml')).datasources[0];
    expect([ds.uid, ds.url, ds.jsonData.timeInterval]).toEqual(['stormgate-prometheus', 'http://prometheus:9090', '5s']);
    const dashboard = JSON.parse(read('grafana/dashboards/stormgate.json')) as { uid: string };
    expect(dashboard.uid).toBe('stormgate');
    const provider = parseYaml(read('grafana/provisioning/dashboards/stormgate.yml')).providers[0];
    expect([provider.options.path, provider.folder]).toEqual(['/var/lib/grafana/dashboards', 'stormgate']);
    const prom = parseYaml(read('grafana/prometheus/prometheus.yml'));
    expect(prom.global.scrape_interval).toBe('5s');
    expect(prom.scrape_configs[0].static_configs[0].targets).toEqual(['gateway:8080']);
    expect(prom.scrape_configs[0].metrics_path ?? '/metrics').toBe('/metrics');
    expect(prom.rule_files).toEqual(['rules/recording.yml', 'rules/alerts.yml']);
    // Grafana reloads the JSON within 30 s; the provisioned dashboard cannot be saved from the UI.
    expect([provider.updateIntervalSeconds, provider.allowUiUpdates]).toEqual([30, false]);
    const grafana = parseYaml(read('docker-compose.yml')).services.grafana.environment;
    expect(grafana).toMatchObject({ GF_AUTH_ANONYMOUS_ENABLED: 'true', GF_AUTH_ANONYMOUS_ORG_ROLE: 'Viewer', GF_SECURITY_ADMIN_PASSWORD: '${GRAFANA_ADMIN_PASSWORD:-admin}' });
    expect(grafana.GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH).toBe('/var/lib/grafana/dashboards/stormgate.json');
    const dockerfile = read('Dockerfile');
    expect(dockerfile).toMatch(/^FROM node:20-slim AS runtime$/m);
    expect(dockerfile).toMatch(/^USER node$/m);
    expect(dockerfile).toMatch(/^EXPOSE 8080$/m);
    expect(dockerfile).toMatch(/^HEALTHCHECK [\s\S]*\/healthz/m);
  });

  it('"The dashboard": variables route, target, provider, priority (multi-select, All by default) and the rows it lists, in order', () => {
    const dashboard = JSON.parse(read('grafana/dashboards/stormgate.json')) as { templating: { list: Array<{ name: string; multi: boolean; includeAll: boolean; current: { text: string[] } }> }; panels: Array<{ type: string; title: string }> };
    expect(dashboard.templating.list.map((v) => [v.name, v.multi, v.includeAll, v.current.text])).toEqual(['route', 'target', 'provider', 'priority'].map((n) => [n, true, true, ['All']]));
    const rows = dashboard.panels.filter((p) => p.type === 'row').map((p) => p.title);
    const listed = [...section(GRAFANA_README, '## The dashboard').matchAll(/^- \*\*([^*]+)\*\*/gm)].map((m) => m[1]!);
    expect(rows.map((r) => r.split(':')[0])).toEqual(listed);
  });

  it('runs the rule unit tests it names (promtool test rules), and the tests it names exist', () => {
    const out = execFileSync('promtool', ['test', 'rules', 'tests/rules.test.yml'], { cwd: join(ROOT, 'grafana/prometheus'), encoding: 'utf8' });
    expect(out).toContain('SUCCESS');
    for (const m of section(GRAFANA_README, '## Tests').matchAll(/`(test\/[\w.-]+\.test\.ts)`/g)) expect(existsSync(join(ROOT, m[1]!)), m[1]).toBe(true);
  });

  it('has every ratio rule answer nothing, not NaN, where its denominator is 0 (> 0 on the denominator)', () => {
    const rules = (parseYaml(read('grafana/prometheus/rules/recording.yml')).groups as Array<{ rules: Array<{ record: string; expr: string }> }>).flatMap((g) => g.rules);
    const ratios = rules.filter((r) => r.record.includes(':ratio_'));
    expect(ratios.length).toBeGreaterThanOrEqual(7);
    for (const r of ratios) expect(r.expr, r.record).toMatch(/>\s*0\b/);
  });

  it('names in "Recording rules" exactly the rules of rules/recording.yml, each with the labels it keeps', () => {
    const rules = (parseYaml(read('grafana/prometheus/rules/recording.yml')).groups as Array<{ rules: Array<{ record: string; expr: string }> }>).flatMap((g) => g.rules);
    const rows = tableRows(section(GRAFANA_README, '## Recording rules'));
    expect(rows.map((r) => r[0]!.replace(/`/g, '')).sort()).toEqual(rules.map((r) => r.record).sort());
    for (const [name, labels] of rows) {
      const rule = rules.find((r) => r.record === name!.replace(/`/g, ''))!;
      const kept = /^\s*sum(?: by \(([^)]*)\))?/.exec(rule.expr)?.[1] ?? '';
      const want = labels === '(none)' ? [] : labels!.split(',').map((l) => l.trim());
      expect(kept.split(',').map((l) => l.trim()).filter(Boolean).sort(), name).toEqual(want.sort());
    }
  });

  it('names in "Alerts" exactly the alerts of rules/alerts.yml, with their expression, for and severity', () => {
    const alerts = (parseYaml(read('grafana/prometheus/rules/alerts.yml')).groups as Array<{ rules: Array<{ alert: string; expr: string; for: string; labels: { severity: string }; annotations: Record<string, string> }> }>).flatMap((g) => g.rules);
    const rows = tableRows(section(GRAFANA_README, '## Alerts'));
    expect(rows.map((r) => r[0]!.replace(/`/g, '')).sort()).toEqual(alerts.map((a) => a.alert).sort());
    for (const [name, expression, forCell, severity] of rows) {
      const alert = alerts.find((a) => a.alert === name!.replace(/`/g, ''))!;
      expect(/^`([^`]+)`/.exec(expression!)![1], name).toBe(alert.expr.replace(/\s+/g, ' ').trim());
      expect(forCell, name).toBe(alert.for);
      expect(severity, name).toBe(alert.labels.severity);
      expect(Object.keys(alert.annotations).sort(), name).toEqual(['description', 'summary']);
    }
  });

  it('"Without Docker": its Prometheus config, with the repository\'s path, passes promtool check config (rules included)', () => {
    const yaml = /### Without Docker[\s\S]*?```yaml\n([\s\S]*?)```/.exec(GRAFANA_README)![1]!.replaceAll('/path/to/stormgate', ROOT);
    const dir = mkdtempSync(join(tmpdir(), 'audit49-prom-'));
    try {
      writeFileSync(join(dir, 'stormgate-prometheus.yml'), yaml);
      const out = execFileSync('promtool', ['check', 'config', join(dir, 'stormgate-prometheus.yml')], { encoding: 'utf8' });
      expect(out).toMatch(/SUCCESS: \d+ rules found/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('config/docker.yaml: 0.0.0.0:8080, OpenAI\'s URL by default, the compose Redis, Anthropic skipped without its key and claude-sonnet-4-6 by default with it', () => {
    const file = join(ROOT, 'config/docker.yaml');
    const base = { STORMGATE_API_KEY: 'sg', OPENAI_API_KEY: 'sk-x', REDIS_URL: 'redis://redis:6379' };
    const plain = loadConfigFile(file, base);
    expect([plain.server.host, plain.server.port]).toEqual(['0.0.0.0', 8080]);
    expect(plain.providers.openai!.baseUrl).toBe('https://api.openai.com/v1');
    expect(plain.state.redis).toBe('redis://redis:6379');
    expect(plain.providers.anthropic!.apiKey).toBe('');
    const withAnthropic = loadConfigFile(file, { ...base, ANTHROPIC_API_KEY: 'sk-ant' });
    expect(withAnthropic.routes.find((r) => r.name === 'chat')!.targets[1]).toMatchObject({ provider: 'anthropic', model: 'claude-sonnet-4-6' });
    expect(() => loadConfigFile(file, { OPENAI_API_KEY: 'sk-x' }), 'STORMGATE_API_KEY is required').toThrow(/STORMGATE_API_KEY/);
  });

  const startStack = useStacks();
  const startBackup = useExtraMocks();
  it('config/docker.yaml served: /metrics and /healthz open, a request without the key 401 invalid_api_key (the SDK does not retry), and with ANTHROPIC_API_KEY the chat route fails over to Anthropic', async () => {
    const anthropic = await startBackup({ apiKey: 'sk-ant-test' });
    const s = await startStack({
      faults: { errors: [{ status: 503, rate: 1 }] },
      config: (mockUrl) => {
        const c = loadConfigFile(join(ROOT, 'config/docker.yaml'), {
          STORMGATE_API_KEY: 'sg-compose-key',
          OPENAI_API_KEY: TEST_KEY,
          OPENAI_BASE_URL: `${mockUrl}/v1`,
          ANTHROPIC_API_KEY: 'sk-ant-test',
          ANTHROPIC_BASE_URL: anthropic.url,
        }) as ConfigInput;
        return { ...c, server: { ...c.server, host: '127.0.0.1', port: 0, logLevel: 'info' } };
      },
    });
    expect((await fetch(`${s.url}/metrics`)).status).toBe(200);
    expect((await fetch(`${s.url}/healthz`)).status).toBe(200);
    let requests = 0;
    const counting: typeof fetch = (url, init) => {
      requests++;
      return fetch(url, init);
    };
    const wrong = new OpenAI({ baseURL: s.baseURL, apiKey: 'not-the-key', fetch: counting });
    const err = await wrong.chat.completions.create(CHAT).then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.AuthenticationError);
    expect((err as InstanceType<typeof OpenAI.AuthenticationError>).code).toBe('invalid_api_key');
    expect(requests).toBe(1);
    const right = new OpenAI({ baseURL: s.baseURL, apiKey: 'sg-compose-key', maxRetries: 0 });
    const { data, response } = await right.chat.completions.create(CHAT).withResponse();
    expect(data.choices[0]!.message.content).toBeTruthy();
    expect(response.headers.get('x-stormgate-target')).toBe('anthropic/claude-sonnet-4-6');
    expect(response.headers.get('x-stormgate-fallback')).toBeTruthy();
  });
});

describe('grafana/README.md "Demo without API keys": the mock of the demo profile', () => {
  const runMock = mockCli();
  it('runs with 5% 429s carrying retry-after-ms: 500 checked before a 503 rule of a fifth, 2% resets and 50-150 ms latency', async () => {
    const compose = parseYaml(read('docker-compose.yml'));
    const args = (compose.services.mock.command as string[]).slice(4);
    const hostAt = args.indexOf('--host');
    const portAt = args.indexOf('--port');
    const own = args.filter((_, i) => ![hostAt, hostAt + 1, portAt, portAt + 1].includes(i));
    const run = await runMock(['--host', '127.0.0.1', ...own]);
    const faults = (await (await fetch(`${run.url}/_mock/faults`)).json()) as Record<string, unknown>;
    expect(faults).toMatchObject({
      latencyMs: 50,
      latencyJitterMs: 100,
      resetRate: 0.02,
      errors: [
        { status: 429, rate: 0.05, headers: { 'retry-after-ms': '500' } },
        { status: 503, rate: 0.2 },
      ],
    });
    const loadgen = compose.services.loadgen;
    expect(loadgen.image).toBe('node:20-slim');
    expect(loadgen.environment.RPS).toBe('20');
    expect(loadgen.environment.BROWNOUT_EVERY_S).toBe('300');
    const script = (loadgen.command as string[])[2]!;
    expect(script).toContain('n % 2 === 0');
    expect(script).toContain("n % 5 === 0) headers['x-stormgate-priority'] = 'batch'");
    expect(script).toContain("mode: '503', durationMs: 20000");
  });
});

describe('Tests and benchmarks (README)', () => {
  const pkg = JSON.parse(read('package.json')) as { scripts: Record<string, string>; devDependencies: Record<string, string>; overrides: Record<string, Record<string, string>> };

  it('has the npm scripts it names, a pretest that checks redis-server, prometheus, promtool and nginx, and the older SDKs as aliases with zod 4 for openai 4.x and 5.x', () => {
    for (const script of ['test', 'pretest', 'bench', 'bench:storm', 'bench:priority', 'mock', 'start', 'build']) expect(pkg.scripts[script], script).toBeTruthy();
    const pretest = read(pkg.scripts.pretest!.replace(/^tsx /, ''));
    for (const tool of ['redis-server', 'prometheus', 'promtool', 'nginx', 'nginx-light', 'apt-get']) expect(pretest, tool).toContain(tool);
    expect(pkg.devDependencies['openai-v4']).toMatch(/^npm:openai@4\./);
    expect(pkg.devDependencies['openai-v5']).toMatch(/^npm:openai@5\./);
    expect(pkg.devDependencies['anthropic-sdk-v0']).toMatch(/^npm:@anthropic-ai\/sdk@0\./);
    expect(pkg.devDependencies['openai']).toMatch(/^6\./);
    expect(pkg.overrides).toEqual({ 'openai-v4': { zod: '$zod' }, 'openai-v5': { zod: '$zod' } });
  });

  it('each bench\'s --help lists its options, --only rate-limit and --tenants among them, and the results files it cites exist', () => {
    const help = (file: string) => execFileSync(process.execPath, ['--import', 'tsx', file, '--help'], { cwd: ROOT, encoding: 'utf8', timeout: 60_000 });
    expect(help('bench/overhead.ts')).toMatch(/^usage: npm run bench -- /);
    expect(help('bench/storm.ts')).toMatch(/--only [^\n]*\brate-limit\b/);
    expect(help('bench/priority.ts')).toMatch(/--tenants/);
    const tests = section(README, '## Tests and benchmarks');
    const cited = [...tests.matchAll(/(bench\/(?:results\/)?[\w.-]+\.(?:md|svg))/g)].map((m) => m[1]!);
    expect(cited).toEqual(expect.arrayContaining(['bench/README.md', 'bench/results/overhead.md', 'bench/results/storm.md', 'bench/results/storm.svg', 'bench/results/storm-hang.svg', 'bench/results/priority.md', 'bench/results/priority.tenants.md']));
    for (const file of cited) expect(existsSync(join(ROOT, file)), file).toBe(true);
  }, 120_000);
});
