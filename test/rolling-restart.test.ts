// A Kubernetes rolling update as the SDK users behind it see it: two gateway processes on one Redis behind a
// round-robin load balancer that polls /readyz (an endpoint controller) and sends each new connection to a ready
// instance, steady traffic from the `openai` SDK (streamed and not, with and without retries, some under idempotency
// keys), then A is sent SIGTERM and replaced by A', then B by B'. What is checked is the README's drain promise: no
// request fails in a way the SDK could not retry safely, no stream is cut silently, nothing runs twice upstream
// because of the restart, a key's run is answered once across it, and the provider sees about one request per call.
import { randomBytes } from 'node:crypto';
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI, { APIConnectionError, APIError } from 'openai';
import { Agent, request as httpRequest, type IncomingMessage } from 'node:http';
import { afterAll, describe, expect, it } from 'vitest';
import { startMock, type MockServer } from '../src/mock/server.ts';
import { answerText } from '../src/mock/content.ts';
import { freePort } from './helpers/free-port.ts';
import { useGatewayProcesses, waitReady, type GatewayProcess } from './helpers/gateway-process.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { defaultConfig, startStack } from './helpers/stack.ts';

const redis = useRedisServer();
// The info-level log lines of a whole run, to show an unsafe failure's request.
const startProcess = useGatewayProcesses({ keepOutputChars: 2_000_000 });
let mock: MockServer | undefined;
let lb: LoadBalancer | undefined;
afterAll(async () => {
  await lb?.close();
  await mock?.close();
});

/** A gateway process (a pod): its name and port besides. */
interface Instance extends GatewayProcess {
  name: string;
  port: number;
}

/** Starts `src/main.ts` on a fresh port, in front of the mock, on the shared Redis. */
async function startInstance(name: string, keyPrefix: string): Promise<Instance> {
  const port = await freePort();
  const g = startProcess(name, {
    server: { host: '127.0.0.1', port, logLevel: 'info' },
    providers: { mock: { family: 'openai', baseUrl: `${mock!.url}/v1`, apiKey: 'k', maxConnections: 64 } },
    routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }] }],
    state: { redis: redis().url, keyPrefix },
    drain: { preStopMs: 1_000, graceMs: 10_000 },
  });
  return { ...g, name, port };
}

const ready = (instance: Instance) => waitReady(instance, instance.port, 15_000);

interface LoadBalancer {
  port: number;
  add(instance: Instance): void;
  /** Which instance each accepted connection went to, in order. */
  connections: string[];
  close(): Promise<void>;
}

/**
 * A Service in front of the pods: /readyz polled every 100 ms (one failure takes an instance out), each new TCP
 * connection sent round-robin to a ready instance, connections already open left where they are (conntrack).
 */
async function startLoadBalancer(): Promise<LoadBalancer> {
  const backends: Array<{ instance: Instance; ready: boolean; gone: boolean }> = [];
  const sockets = new Set<Socket>();
  const connections: string[] = [];
  let next = 0;
  let polling = true;
  const poll = async () => {
    while (polling) {
      await Promise.all(
        backends.filter((b) => !b.gone).map(async (b) => {
          const ok = await fetch(`http://127.0.0.1:${b.instance.port}/readyz`, { signal: AbortSignal.timeout(500) }).then((r) => r.ok, () => false);
          b.ready = ok;
          if (!ok && b.instance.proc.exitCode !== null) b.gone = true;
        }),
      );
      await sleep(100);
    }
  };
  const polled = poll();
  const server: Server = createServer((client) => {
    const ready = backends.filter((b) => b.ready && !b.gone);
    sockets.add(client);
    client.once('close', () => sockets.delete(client));
    client.on('error', () => undefined);
    if (ready.length === 0) return void client.destroy();
    const backend = ready[next++ % ready.length]!;
    connections.push(backend.instance.name);
    const upstream = createConnection({ host: '127.0.0.1', port: backend.instance.port });
    sockets.add(upstream);
    upstream.once('close', () => sockets.delete(upstream));
    upstream.on('error', () => undefined);
    client.pipe(upstream).pipe(client);
    client.once('close', () => upstream.destroy());
    upstream.once('close', () => client.destroy());
  });
  const port = await freePort();
  await new Promise<void>((r) => server.listen(port, '127.0.0.1', r));
  return {
    port,
    connections,
    add: (instance) => void backends.push({ instance, ready: false, gone: false }),
    close: async () => {
      polling = false;
      await polled;
      for (const s of sockets) s.destroy();
      await new Promise((r) => server.close(r));
    },
  };
}

/** One HTTP exchange the SDK made (an attempt), as its fetch saw it. */
interface Attempt {
  call: string;
  /** Rejected before any response header: `network` (with its code) or `aborted` (the SDK's own timeout). */
  failed?: string;
  status?: number;
  shouldRetry?: string | null;
  retryAfter?: string | null;
  replayed?: string | null;
  stream?: boolean;
  /** How the body ended: `end` (cleanly), `error` (a reset after bytes), `cancelled` (by the reader). */
  bodyEnd?: 'end' | 'error' | 'cancelled';
  text?: string;
  at?: number;
  headers?: Record<string, string>;
}

const attempts: Attempt[] = [];

/**
 * The SDK's fetch, recording each attempt: its headers and how its body ended. `route` may send an attempt elsewhere
 * (the first attempt of a call straight to one instance).
 */
function recordingFetch(route: (url: string, n: number) => string = (u) => u): typeof fetch {
  const seen = new Map<string, number>();
  return async (input, init) => {
    const headers = new Headers(init?.headers);
    const call = headers.get('traceparent')!.split('-')[1]!;
    const n = (seen.get(call) ?? 0) + 1;
    seen.set(call, n);
    const attempt: Attempt = { call };
    attempts.push(attempt);
    let res: Response;
    try {
      res = await fetch(route(String(input), n), init);
    } catch (err) {
      const cause = (err as { cause?: { code?: string } }).cause;
      attempt.failed = init?.signal?.aborted ? 'aborted' : `network ${cause?.code ?? (err as Error).message}`;
      throw err;
    }
    attempt.status = res.status;
    attempt.at = Date.now();
    attempt.headers = Object.fromEntries([...res.headers].filter(([k]) => k.startsWith('x-')));
    attempt.shouldRetry = res.headers.get('x-should-retry');
    attempt.retryAfter = res.headers.get('retry-after');
    attempt.replayed = res.headers.get('idempotent-replayed');
    attempt.stream = (res.headers.get('content-type') ?? '').startsWith('text/event-stream');
    if (!res.body) return res;
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    attempt.text = '';
    const body = new ReadableStream<Uint8Array>({
      async pull(controller) {
        try {
          const { value, done } = await reader.read();
          if (done) {
            attempt.bodyEnd ??= 'end';
            controller.close();
          } else {
            attempt.text += decoder.decode(value, { stream: true });
            controller.enqueue(value);
          }
        } catch (err) {
          attempt.bodyEnd ??= 'error';
          controller.error(err);
        }
      },
      cancel(reason) {
        attempt.bodyEnd ??= 'cancelled';
        return reader.cancel(reason);
      },
    });
    return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
}

/** A logical call: what the SDK user got in the end. */
interface Call {
  id: string;
  stream: boolean;
  maxRetries: number;
  keyed: boolean;
  /** `ok`, or the SDK's error: its class and status. */
  outcome: string;
  content?: string;
}

function traceparent(): { id: string; header: string } {
  const id = randomBytes(16).toString('hex');
  return { id, header: `00-${id}-${randomBytes(8).toString('hex')}-01` };
}

/** One call through `client`; the prompt carries the call's id, so the answer (the mock echoes it) is the call's own. */
async function makeCall(client: OpenAI, stream: boolean, keyed: boolean, extra: { timeout?: number; model?: string; key?: string; repeats?: string } = {}): Promise<Call> {
  // A repeat under a key is the same call again: the same body (and trace id).
  const { id, header } = extra.repeats !== undefined ? { id: extra.repeats, header: `00-${extra.repeats}-${randomBytes(8).toString('hex')}-01` } : traceparent();
  const prompt = `call ${id.slice(0, 12)}`;
  const headers: Record<string, string> = { traceparent: header };
  if (keyed) headers['Idempotency-Key'] = extra.key ?? `key-${id}`;
  const call: Call = { id, stream, maxRetries: client.maxRetries, keyed, outcome: 'ok' };
  const body = { model: extra.model ?? 'gpt-4o', messages: [{ role: 'user' as const, content: prompt }] };
  const options = { headers, ...(extra.timeout !== undefined && { timeout: extra.timeout }) };
  try {
    if (stream) {
      const events = await client.chat.completions.create({ ...body, stream: true }, options);
      call.content = '';
      for await (const event of events) call.content += event.choices[0]?.delta.content ?? '';
    } else {
      const answer = await client.chat.completions.create(body, options);
      call.content = answer.choices[0]?.message.content ?? '';
    }
    if (call.content !== answerText(prompt)) call.outcome = 'wrong content';
  } catch (err) {
    call.outcome = err instanceof APIConnectionError ? err.constructor.name : err instanceof APIError ? `${err.constructor.name} ${err.status} ${(err.error as { code?: string } | undefined)?.code}` : `raw ${(err as Error).name}: ${(err as Error).message}`;
  }
  return call;
}

function countBy<T>(list: readonly T[], key: (item: T) => string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const item of list) out[key(item)] = (out[key(item)] ?? 0) + 1;
  return out;
}

/** What a finished attempt says about retrying: fine when the SDK can retry it safely, else why not. */
function unsafeFailure(a: Attempt): string | undefined {
  if (a.failed !== undefined) return undefined; // before any byte of an answer: a network error, or the SDK's timeout
  if (a.status! >= 400) {
    if (a.shouldRetry !== 'true' || a.retryAfter === null) return `status ${a.status} x-should-retry ${a.shouldRetry} retry-after ${a.retryAfter}`;
    return undefined;
  }
  if (a.bodyEnd === 'error') return `${a.stream ? 'stream' : 'body'} reset after ${a.text?.length} chars`;
  if (a.stream && a.bodyEnd === 'end') {
    const text = a.text!.trimEnd();
    const events = text.split('\n\n').map((e) => e.replace(/^data: /, ''));
    if (!events.at(-1)!.includes('[DONE]') && !events.at(-1)!.startsWith('{"error"')) return `stream ended silently: ${events.at(-1)?.slice(0, 80)}`;
  }
  return undefined;
}

describe('a rolling restart of two gateways behind a load balancer', () => {
  it('loses no request the SDK could not retry, cuts no stream silently and runs nothing twice upstream', { timeout: 60_000 }, async () => {
    const keyPrefix = `rolling-${randomBytes(4).toString('hex')}`;
    mock = await startMock({
      quiet: true,
      faults: {
        latencyMs: 60,
        latencyJitterMs: 80,
        // A few 503s, which the gateway retries itself (they show in the amplification).
        errors: [{ status: 503, rate: 0.05, firstAttemptsOnly: true }],
        stream: { chunks: 8, chunkDelayMs: 300 },
        // For the keyed call whose SDK times out before its answer.
        models: { 'slow-model': { latencyMs: 2_500 } },
      },
    });
    const [a, b] = await Promise.all([startInstance('A', keyPrefix), startInstance('B', keyPrefix)]);
    lb = await startLoadBalancer();
    lb.add(a);
    lb.add(b);
    await Promise.all([ready(a), ready(b)]);
    await sleep(250); // the LB has seen them ready

    const baseURL = `http://127.0.0.1:${lb.port}/v1`;
    const retrying = new OpenAI({ apiKey: 'k', baseURL, fetch: recordingFetch() });
    const once0 = new OpenAI({ apiKey: 'k', baseURL, maxRetries: 0, fetch: recordingFetch() });
    const calls: Promise<Call>[] = [];
    let traffic = true;
    let seq = 0;
    const workers = Array.from({ length: 8 }, async () => {
      while (traffic && calls.length < 1_000) {
        const n = seq++;
        const call = makeCall(n % 3 === 0 ? once0 : retrying, n % 3 === 1, n % 5 < 2);
        calls.push(call);
        await call;
        // A moment between a user's calls (and a turn of the event loop, whatever the call did).
        await sleep(20);
      }
    });

    await sleep(1_500);
    // Keyed calls whose runs are on A when it is told to go.
    const onA = `http://127.0.0.1:${a.port}/v1`;
    const direct = (url: string) => new OpenAI({ apiKey: 'k', baseURL: url, maxRetries: 0, fetch: recordingFetch() });
    // 1. A stream under a key, on A; repeated on B while it runs, and on A' once A is gone.
    const streamKey = `stream-${keyPrefix}`;
    const streamId = randomBytes(16).toString('hex');
    const keyedStream = makeCall(direct(onA), true, true, { key: streamKey, repeats: streamId });
    // 2. A slow call under a key whose SDK times out at 1 s and retries (through the LB) while A drains.
    const slowKey = `slow-${keyPrefix}`;
    const slowClient = new OpenAI({ apiKey: 'k', baseURL, maxRetries: 4, fetch: recordingFetch((u, n) => (n === 1 ? u.replace(baseURL, onA) : u)) });
    const slowCall = makeCall(slowClient, false, true, { key: slowKey, model: 'slow-model', timeout: 1_000, repeats: randomBytes(16).toString('hex') });
    await sleep(400);

    const roll = { startedAt: Date.now(), aExit: 0, bExit: 0 };
    a.proc.kill('SIGTERM');
    const aPrime = await startInstance('A2', keyPrefix);
    lb.add(aPrime);
    const repeatOnB = makeCall(direct(`http://127.0.0.1:${b.port}/v1`), true, true, { key: streamKey, repeats: streamId });
    await ready(aPrime);
    expect(await a.exited).toBe(0);
    roll.aExit = Date.now() - roll.startedAt;
    const repeatOnAPrime = makeCall(direct(`http://127.0.0.1:${aPrime.port}/v1`), true, true, { key: streamKey, repeats: streamId });
    await sleep(500);

    b.proc.kill('SIGTERM');
    const bPrime = await startInstance('B2', keyPrefix);
    lb.add(bPrime);
    await ready(bPrime);
    await sleep(1_500);
    traffic = false;
    await Promise.all(workers);
    expect(await b.exited).toBe(0);
    roll.bExit = Date.now() - roll.startedAt;

    const done = await Promise.all(calls);
    const keyedCalls = await Promise.all([keyedStream, repeatOnB, repeatOnAPrime, slowCall]);
    const upstream = mock.requests().filter((r) => r.path === '/v1/chat/completions');

    // What the SDK users got.
    const failures = done.filter((c) => c.outcome !== 'ok');
    const byKind = (list: Call[]) => countBy(list, (c) => c.outcome);
    // Every attempt that failed, by what the client saw.
    const failedAttempts = attempts.filter((x) => x.failed !== undefined || (x.status ?? 200) >= 400);
    const attemptKinds = countBy(failedAttempts, (x) => x.failed ?? `${x.status} should-retry=${x.shouldRetry}`);
    // Upstream answers per call (a 200 whose body the mock finished).
    const answered = countBy(upstream.filter((r) => r.status === 200 && !r.aborted), (r) => r.headers['traceparent']?.split('-')[1] ?? '?');
    const twice = Object.entries(answered).filter(([, n]) => n > 1).map(([id, times]) => ({ id, times, call: done.find((c) => c.id === id) }));
    const figures = {
      calls: done.length,
      streams: done.filter((c) => c.stream).length,
      keyed: done.filter((c) => c.keyed).length,
      noRetryCalls: done.filter((c) => c.maxRetries === 0).length,
      failures: byKind(failures),
      failuresByMaxRetries: { 0: failures.filter((c) => c.maxRetries === 0).length, 2: failures.filter((c) => c.maxRetries === 2).length },
      sdkAttempts: attempts.length,
      failedAttempts: attemptKinds,
      upstreamRequests: upstream.length,
      upstreamByStatus: mock.stats().byStatus,
      amplification: Number((upstream.length / (done.length + 4)).toFixed(3)),
      lbConnections: countBy(lb.connections, (n) => n),
      roll,
    };
    console.log(JSON.stringify(figures, null, 1));

    const unsafe = attempts.map((x) => ({ x, why: unsafeFailure(x) })).filter((u) => u.why !== undefined);
    for (const u of unsafe) for (const i of [a, b, aPrime, bPrime]) console.log(i.name, i.output().split('\n').filter((l) => l.includes(u.x.headers?.['x-stormgate-request-id'] ?? '??')).join('\n'));
    for (const u of unsafe) console.log(JSON.stringify({ why: u.why, attempt: u.x, upstream: upstream.filter((r) => r.headers['traceparent']?.includes(u.x.call)).map((r) => ({ status: r.status, at: r.receivedAt - roll.startedAt, ended: (r.endedAt ?? 0) - roll.startedAt, headers: r.headers })) }, null, 1));
    expect(unsafe.map((u) => u.why)).toEqual([]);
    // The SDK with retries loses nothing; without, only answers it was told to retry (or reached no instance).
    expect(failures.filter((c) => c.maxRetries > 0)).toEqual([]);
    for (const c of failures) expect(c.outcome).toMatch(/^(APIConnectionError|InternalServerError 503 gateway_draining)$/);
    expect(twice).toEqual([]);
    // The keyed calls across the restart: one run each, and every repeat got that run's answer.
    expect(keyedCalls.map((c) => c.outcome)).toEqual(['ok', 'ok', 'ok', 'ok']);
    const runs = (key: string) => upstream.filter((r) => r.headers['idempotency-key'] === key && r.status === 200).length;
    expect([runs(streamKey), runs(slowKey)]).toEqual([1, 1]);
    // The repeats on B (waiting for A's run) and on A' (after it) got that run's answer again.
    expect(attempts.filter((x) => x.call === streamId && x.status === 200).map((x) => x.replayed)).toEqual([null, 'true', 'true']);
    expect(figures.amplification).toBeLessThan(1.3);
    expect(done.length).toBeGreaterThan(40);
  });
});

describe('a draining instance and its keep-alive clients', () => {
  /** A chat request over `agent`; resolves the answer's status, its connection header and the socket it used. */
  function ask(url: string, agent: Agent, stream: boolean): Promise<{ status: number; connection: string | undefined; socket: unknown; body: string }> {
    return new Promise((resolve, reject) => {
      const req = httpRequest(`${url}/v1/chat/completions`, { method: 'POST', agent, headers: { 'content-type': 'application/json' } }, (res: IncomingMessage) => {
        let body = '';
        res.on('data', (d: Buffer) => (body += d.toString()));
        res.on('end', () => resolve({ status: res.statusCode!, connection: res.headers.connection, socket: req.socket, body }));
      });
      req.on('error', reject);
      req.end(JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream }));
    });
  }

  it('answers with Connection: close while readiness is off, so keep-alive clients reconnect through the balancer', async () => {
    const s = await startStack({ faults: { stream: { chunks: 2 } }, config: (url) => ({ ...defaultConfig(url), drain: { preStopMs: 1_500, graceMs: 2_000 } }) });
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    let drained: Promise<void> | undefined;
    try {
      const before = await ask(s.url, agent, false);
      expect([before.status, before.connection]).toEqual([200, 'keep-alive']);
      drained = s.gateway.drain();
      // Still served during preStopMs (a balancer may not have seen the readiness yet), but the connection is let go
      // after the answer, not kept for a request that would meet the closing instance.
      const whole = await ask(s.url, agent, false);
      expect([whole.status, whole.connection]).toEqual([200, 'close']);
      expect(whole.socket).toBe(before.socket);
      const stream = await ask(s.url, agent, true);
      expect([stream.status, stream.connection]).toEqual([200, 'close']);
      expect(stream.socket).not.toBe(whole.socket);
      expect(stream.body.trimEnd().endsWith('data: [DONE]')).toBe(true);
    } finally {
      agent.destroy();
      await drained;
      await s.close();
    }
  });
});
