// Third-party failure-scenario suite 41: an outside QA team's soak/leak checks. After a fault storm, is the gateway
// back at its baseline? One gateway is built in-process (buildServer, as test/helpers/stack.ts does, with an
// in-process MemoryStore passed in so the idempotency records can be counted) in front of the suite's own node:http
// fake provider on 127.0.0.1, and driven over real HTTP by the openai SDK on an undici Agent of the suite's own (closed
// before the "after" readings, so what is left is the gateway's). Written from the README ("Retry budget, circuit
// breaker, hold-offs, parking", "Priority pools", "Idempotency keys", "Logs and metrics"):
// - 2,000 calls through a 503 brownout, the breaker open, requests parked and the provider's recovery: nothing parked,
//   nothing in a pool or its queue, no upstream request open, active handles and timers back near their count before,
//   and the heap (after a forced GC) near where it was;
// - hundreds of clients that leave mid-stream, mid-pool-queue and mid-park: every upstream request closed, no
//   MaxListenersExceededWarning, no unhandled rejection;
// - thousands of distinct idempotency keys under a short `idempotency.ttlMs`: a repeat after the TTL runs again, and
//   the expired records are gone from the store (and their bytes from the heap) once the next key is written;
// - hundreds of made-up model names the provider answers 404: the /metrics target labels stay bounded (configured
//   models, at most 32 learned ones, `<provider>/other`), and no series of a refused name is left.
// Found here: no leak (four scenarios pass, three runs in a row). Noted for the maintainers: expired idempotency
// records are dropped lazily (the next keyed write sweeps them); a gateway that stops receiving keyed requests keeps
// up to `idempotency.memoryBytes` of expired answers until one comes. Bounded, so no fix.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { once } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { Agent } from 'undici';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import { leftOver } from './helpers/cancel-storm.ts';
import { pooled, sdkOn, settledHeap, tally, useInProcessGateways, type InProcessGateway } from './helpers/in-process.ts';
import type { MetricSample } from './helpers/stack.ts';

// ---------------------------------------------------------------------------------------------------------------
// A forced GC without --expose-gc (vitest's config has no per-file execArgv): V8's flag set at run time, and `gc`
// taken from a fresh context, where V8 installs it.
const MB = 1024 * 1024;

// ---------------------------------------------------------------------------------------------------------------
// The fake provider: OpenAI chat completions, whole or streamed; a switch for a 503 brownout; 404 model_not_found for
// any model named `made-up-*`; requests still open counted (a response's 'close', so a gateway that leaves counts).

interface Provider {
  origin: string;
  /** 'ok' answers, '503' answers every chat call 503 (a brownout). */
  mode: 'ok' | '503';
  /** Delay before a whole answer (or a stream's head), ms. */
  delayMs: number;
  /** Stream chunks and the gap between them. */
  chunks: number;
  chunkGapMs: number;
  /** Bytes of padding in a whole answer's content (idempotency records with some weight). */
  padBytes: number;
  /** Models answered 503 whatever the mode (a model that is down). */
  down: Set<string>;
  hits: number;
  inflight(): number;
  sockets(): number;
  close(): Promise<void>;
}

const errorBody = (message: string, type: string, code: string | null) => JSON.stringify({ error: { message, type, param: null, code } });
const chunkOf = (delta: Record<string, string>, finish: string | null) =>
  `data: ${JSON.stringify({ id: 'chatcmpl-41', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;

async function startProvider(): Promise<Provider> {
  let inflight = 0;
  const sockets = new Set<Socket>();
  const handle = async (req: IncomingMessage, res: ServerResponse, raw: string) => {
    const body = JSON.parse(raw) as { model: string; stream?: boolean };
    await sleep(p.delayMs);
    if (res.destroyed) return;
    if (body.model.startsWith('made-up-')) {
      res.writeHead(404, { 'content-type': 'application/json' });
      return void res.end(errorBody(`The model \`${body.model}\` does not exist or you do not have access to it.`, 'invalid_request_error', 'model_not_found'));
    }
    if (p.mode === '503' || p.down.has(body.model)) {
      res.writeHead(503, { 'content-type': 'application/json' });
      return void res.end(errorBody('The server is overloaded', 'server_error', null));
    }
    if (!body.stream) {
      res.writeHead(200, { 'content-type': 'application/json' });
      return void res.end(
        JSON.stringify({
          id: 'chatcmpl-41',
          object: 'chat.completion',
          created: 1,
          model: body.model,
          choices: [{ index: 0, message: { role: 'assistant', content: 'ok ' + 'x'.repeat(p.padBytes) }, logprobs: null, finish_reason: 'stop' }],
          usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 },
        }),
      );
    }
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(chunkOf({ role: 'assistant', content: '' }, null));
    for (let i = 0; i < p.chunks; i++) {
      if (res.destroyed) return;
      res.write(chunkOf({ content: `w${i} ` }, null));
      await sleep(p.chunkGapMs);
    }
    if (res.destroyed) return;
    res.write(chunkOf({}, 'stop'));
    res.end('data: [DONE]\n\n');
  };
  const server: Server = createServer((req, res) => {
    p.hits++;
    inflight++;
    let done = false;
    res.on('close', () => {
      if (!done) inflight--;
      done = true;
    });
    let raw = '';
    req.on('data', (d: Buffer) => (raw += d.toString()));
    req.on('end', () => void handle(req, res, raw).catch(() => res.destroy()));
  });
  // Idle keep-alive connections close soon, so the handle counts after a storm are not the pool's idle sockets.
  server.keepAliveTimeout = 300;
  server.on('connection', (s: Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const p: Provider = {
    origin: `http://127.0.0.1:${(server.address() as { port: number }).port}`,
    mode: 'ok',
    delayMs: 5,
    chunks: 4,
    chunkGapMs: 10,
    padBytes: 0,
    down: new Set(),
    hits: 0,
    inflight: () => inflight,
    sockets: () => sockets.size,
    close: async () => {
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    },
  };
  return p;
}

// ---------------------------------------------------------------------------------------------------------------
// The gateway, in-process; the clients, on an Agent of their own.

const { startGateway: startInProcess, closeAfter } = useInProcessGateways();

type Gateway = InProcessGateway & { store: MemoryStore };

async function startGateway(provider: Provider, over: { provider?: Record<string, unknown>; route?: Record<string, unknown>; extra?: Partial<ConfigInput> } = {}): Promise<Gateway> {
  const input = {
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    providers: {
      p: {
        family: 'openai',
        baseUrl: `${provider.origin}/v1`,
        apiKey: 'p-key-leak41-0123456789',
        maxConnections: 32,
        pools: { maxConcurrent: 32, classes: { online: { minShare: 0.5, maxQueue: 2_000 }, batch: { minShare: 0, maxQueue: 2_000 } } },
        breaker: { consecutiveFailures: 5, minRequests: 20, openS: 1, probeWhileParkedMs: 200, probeWhileParkedMaxMs: 400 },
        timeouts: { connectMs: 1_000, firstTokenMs: 4_000, idleMs: 2_000 },
        ...over.provider,
      },
    },
    routes: [
      {
        name: 'chat',
        match: { path: '/v1/chat/completions' },
        targets: [{ provider: 'p' }],
        timeoutMs: 10_000,
        minAttemptMs: 300,
        retry: { maxAttempts: 2, backoff: { baseMs: 50, capMs: 200 } },
        budget: { ratio: 1, windowS: 10, minRetriesPerSecond: 100 },
        park: { maxQueue: 2_000 },
        ...over.route,
      },
    ],
    ...over.extra,
  } satisfies ConfigInput;
  const store = new MemoryStore({ keptBytes: ConfigSchema.parse(input).idempotency.memoryBytes });
  // Scrapes on a kept connection: a new one can be refused while hundreds of clients connect at once.
  return { ...(await startInProcess(input, { store, keptScrapeConnection: true })), store };
}

const clientOn = (url: string, agent: Agent, maxRetries = 0): OpenAI => sdkOn(url, agent, { apiKey: 'sk-leak41-client', maxRetries });

const statusOf = (err: unknown): string =>
  err instanceof OpenAI.APIUserAbortError ? 'aborted' : err instanceof OpenAI.APIError && err.status !== undefined ? `status ${err.status}` : `error ${(err as Error).message.slice(0, 50)}`;


/** Active resources by type (Timeout, TCPSocketWrap, ...). */
function resources(): Record<string, number> {
  const out: Record<string, number> = {};
  for (const r of process.getActiveResourcesInfo()) out[r] = (out[r] ?? 0) + 1;
  return out;
}

/** Types whose count grew by more than `slack` over `before`. */
function grown(before: Record<string, number>, after: Record<string, number>, slack: number): string[] {
  return Object.entries(after)
    .filter(([type, n]) => n - (before[type] ?? 0) > slack)
    .map(([type, n]) => `${type}: ${before[type] ?? 0} -> ${n}`);
}

const series = (samples: MetricSample[], name: string) => samples.filter((s) => s.name === name);

/** Watches the process for warnings and unhandled rejections while a scenario runs. */
function watchProcess() {
  const warnings: string[] = [];
  const rejections: unknown[] = [];
  const onWarning = (w: Error) => warnings.push(`${w.name}: ${w.message}`);
  const onRejection = (r: unknown) => rejections.push(r);
  process.on('warning', onWarning);
  process.on('unhandledRejection', onRejection);
  return {
    warnings,
    rejections,
    stop() {
      process.off('warning', onWarning);
      process.off('unhandledRejection', onRejection);
    },
  };
}

// ---------------------------------------------------------------------------------------------------------------

describe('suite 41: back to baseline after fault storms', () => {
  it('2,000 calls through a 503 brownout, an open breaker, parking and recovery leave nothing parked, in use, open or growing', async () => {
    const watch = watchProcess();
    try {
      const provider = await startProvider();
      closeAfter(provider);
      const g = await startGateway(provider);
      // Warm-up on an agent closed before the baseline: the gateway's lazy parts (pools, series, the target) exist.
      const warm = new Agent({ connections: 4 });
      const warmClient = clientOn(g.url, warm);
      for (let i = 0; i < 20; i++) await warmClient.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: `warm ${i}` }] });
      await warm.close();
      await expect.poll(() => provider.sockets(), { timeout: 5_000 }).toBe(0);
      await sleep(200);
      const handlesBefore = resources();
      const heapBefore = await settledHeap();

      const agent = new Agent({ connections: 128 });
      const client = clientOn(g.url, agent);
      const N = 2_000;
      const t0 = Date.now();
      // The brownout: 503s from 0.6 s to 2.6 s of the run; the breaker opens, calls park, probes find the provider back.
      const schedule = (async () => {
        await sleep(600);
        provider.mode = '503';
        await sleep(2_000);
        provider.mode = 'ok';
      })();
      let peakParked = 0;
      const sampler = setInterval(() => {
        void g.metrics().then((m) => (peakParked = Math.max(peakParked, series(m, 'stormgate_parked_requests').reduce((n, s) => n + s.value, 0))), () => {});
      }, 150);
      const endings = await pooled(N, 100, async (i) => {
        // Paced over about 5 s, so the storm spans before, during and after the brownout.
        await sleep(Math.max(0, t0 + (i * 5_000) / N - Date.now()));
        try {
          const stream = i % 4 === 0;
          if (stream) {
            const s = await client.chat.completions.create({ model: 'gpt-4o', stream: true, messages: [{ role: 'user', content: `c${i}` }] });
            for await (const _ of s) void _;
          } else {
            await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: `c${i}` }] }, { headers: i % 3 === 0 ? { 'x-stormgate-priority': 'batch' } : {} });
          }
          return 'ok';
        } catch (err) {
          return statusOf(err);
        }
      });
      await schedule;
      clearInterval(sampler);
      const t = tally(endings);
      // The storm did what it was for: calls parked, and most were served (parked through the brownout, or retried).
      expect(peakParked, `peak parked; endings ${JSON.stringify(t)}`).toBeGreaterThan(0);
      expect(t.ok ?? 0, JSON.stringify(t)).toBeGreaterThan(N * 0.7);
      expect(Object.keys(t).filter((k) => k.startsWith('error')), JSON.stringify(t)).toEqual([]);

      // Back at baseline: nothing parked, no pool slot or queue place held, no upstream request open.
      await expect
        .poll(async () => leftOver(await g.metricsText()), { timeout: 10_000, interval: 200 })
        .toEqual([]);
      const m = await g.metrics();
      expect(series(m, 'stormgate_parked_requests').every((s) => s.value === 0)).toBe(true);
      expect(series(m, 'stormgate_pool_in_use').length).toBeGreaterThan(0);
      expect(series(m, 'stormgate_breaker_state').filter((s) => s.value !== 0), 'a breaker left open').toEqual([]);
      expect(provider.inflight()).toBe(0);
      const counted = series(m, 'stormgate_requests_total').reduce((n, s) => n + s.value, 0);
      expect(counted, 'every call counted once (warm-up included)').toBe(N + 20);

      // Handles: the clients' agent closed, the provider's idle connections closed by its keep-alive timeout.
      await agent.close();
      await expect.poll(() => provider.sockets(), { timeout: 5_000 }).toBe(0);
      await expect.poll(() => grown(handlesBefore, resources(), 8), { timeout: 5_000, interval: 200 }).toEqual([]);
      // The heap after a forced GC: near where it was (loosely: vitest and V8 keep some of the storm's garbage too).
      const heapAfter = await settledHeap();
      expect((heapAfter - heapBefore) / MB, `heap ${(heapBefore / MB).toFixed(1)} MB -> ${(heapAfter / MB).toFixed(1)} MB`).toBeLessThan(25);

      expect(watch.warnings.filter((w) => w.includes('MaxListeners'))).toEqual([]);
      expect(watch.rejections).toEqual([]);
    } finally {
      watch.stop();
    }
  }, 60_000);

  it('hundreds of clients leaving mid-stream, mid-queue and mid-park close every upstream request, with no listener warning or unhandled rejection', async () => {
    const watch = watchProcess();
    try {
      const provider = await startProvider();
      closeAfter(provider);
      provider.chunks = 30;
      provider.chunkGapMs = 60;
      // A small pool, so most calls queue for a slot; a configured model that is down, so its calls park.
      const g = await startGateway(provider, {
        provider: { maxConnections: 8, pools: { maxConcurrent: 8, classes: { online: { minShare: 0.5, maxQueue: 1_000 }, batch: { minShare: 0, maxQueue: 1_000 } } } },
      });
      const handlesBefore = resources();
      const agent = new Agent({ connections: 512 });
      const client = clientOn(g.url, agent);

      // A model that is down: its breaker opens, and its calls park.
      provider.down.add('gpt-4o-down');
      const opener = await pooled(10, 5, async (i) => {
        try {
          // A short deadline: once the breaker is open these park, and would wait out the route's 10 s.
          await client.chat.completions.create({ model: 'gpt-4o-down', messages: [{ role: 'user', content: `open ${i}` }] }, { headers: { 'x-stormgate-timeout-ms': '1500' } });
          return 'ok';
        } catch (err) {
          return statusOf(err);
        }
      });
      expect(opener.every((e) => e.startsWith('status')), JSON.stringify(tally(opener))).toBe(true);
      await expect
        .poll(async () => series(await g.metrics(), 'stormgate_breaker_state').find((s) => s.labels.target === 'p/gpt-4o-down')?.value ?? 0, { timeout: 5_000 })
        .toBeGreaterThan(0);

      const kinds = ['mid-stream', 'mid-queue-stream', 'mid-queue-whole', 'mid-park'] as const;
      const N = 400;
      let peakParked = 0;
      const sampler = setInterval(() => {
        void g.metrics().then((m) => (peakParked = Math.max(peakParked, series(m, 'stormgate_parked_requests').reduce((n, s) => n + s.value, 0))), () => {});
      }, 100);
      const endings = await Promise.all(
        Array.from({ length: N }, async (_, i) => {
          const kind = kinds[i % kinds.length]!;
          const ctrl = new AbortController();
          const timer =
            kind === 'mid-stream' ? undefined : setTimeout(() => ctrl.abort(), 150 + ((i * 37) % 900));
          try {
            if (kind === 'mid-park') {
              await client.chat.completions.create({ model: 'gpt-4o-down', messages: [{ role: 'user', content: `p${i}` }] }, { signal: ctrl.signal });
              return `${kind}: ok`;
            }
            if (kind === 'mid-queue-whole') {
              await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: `w${i}` }] }, { signal: ctrl.signal });
              return `${kind}: ok`;
            }
            const s = await client.chat.completions.create({ model: 'gpt-4o', stream: true, messages: [{ role: 'user', content: `s${i}` }] }, { signal: ctrl.signal });
            let chunks = 0;
            for await (const c of s) {
              if (c.choices[0]?.delta?.content) chunks++;
              if (kind === 'mid-stream' && chunks >= 2) {
                // Stops reading, as a user who cancels does: a read after the abort can wait for ever in the client.
                ctrl.abort();
                break;
              }
            }
            // The SDK ends a stream's iteration quietly when its signal aborts.
            return `${kind}: ${ctrl.signal.aborted ? 'aborted' : 'ok'}`;
          } catch (err) {
            return `${kind}: ${ctrl.signal.aborted ? 'aborted' : statusOf(err)}`;
          } finally {
            clearTimeout(timer);
          }
        }),
      );
      clearInterval(sampler);
      const t = tally(endings);
      expect(t['mid-stream: aborted'], JSON.stringify(t)).toBe(N / 4);
      expect(t['mid-park: aborted'] ?? 0, JSON.stringify(t)).toBeGreaterThan(N / 8);
      expect(peakParked, JSON.stringify(t)).toBeGreaterThan(0);
      expect(Object.keys(t).filter((k) => k.includes('error')), JSON.stringify(t)).toEqual([]);

      // Every upstream request the gateway opened is closed, and its gauges are back at zero.
      await expect.poll(() => provider.inflight(), { timeout: 10_000, interval: 100 }).toBe(0);
      await expect.poll(async () => leftOver(await g.metricsText()), { timeout: 10_000, interval: 200 }).toEqual([]);
      await agent.close();
      await expect.poll(() => provider.sockets(), { timeout: 5_000 }).toBe(0);
      await expect.poll(() => grown(handlesBefore, resources(), 8), { timeout: 5_000, interval: 200 }).toEqual([]);
      expect(watch.warnings.filter((w) => w.includes('MaxListeners')), watch.warnings.join('\n')).toEqual([]);
      expect(watch.rejections).toEqual([]);
    } finally {
      watch.stop();
    }
  }, 60_000);

  it('thousands of distinct idempotency keys expire after idempotency.ttlMs: repeats run again, and the records and their bytes go', async () => {
    const TTL_MS = 1_500;
    const provider = await startProvider();
    closeAfter(provider);
    provider.delayMs = 0;
    provider.padBytes = 16 * 1024;
    const g = await startGateway(provider, { extra: { idempotency: { ttlMs: TTL_MS } } });
    const agent = new Agent({ connections: 64 });
    const client = clientOn(g.url, agent);
    const ask = (key: string) => client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: `call ${key}` }] }, { headers: { 'Idempotency-Key': key } });
    const held = () => [...g.store.heldKeys(Date.now())].length;
    await ask('warm-0');
    const heapBefore = await settledHeap();

    const N = 2_000;
    const t0 = Date.now();
    await pooled(N, 50, (i) => ask(`leak41-key-${i}`));
    const writtenInMs = Date.now() - t0;
    expect(provider.hits).toBe(N + 1);
    // Kept: a repeat now is replayed, and most records are still in force (those within the TTL of their answer).
    const replay = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: `call leak41-key-${N - 1}` }] }, { headers: { 'Idempotency-Key': `leak41-key-${N - 1}` } }).withResponse();
    expect(replay.response.headers.get('idempotent-replayed')).toBe('true');
    expect(provider.hits).toBe(N + 1);
    if (writtenInMs < TTL_MS / 2) expect(held()).toBeGreaterThan(N / 2);

    const heapKept = await settledHeap();
    // Past the TTL: nothing in force, and a repeat runs again (the README: kept "for idempotency.ttlMs after it was given").
    await sleep(TTL_MS + 300);
    expect(held()).toBe(0);
    await ask('leak41-key-0');
    expect(provider.hits).toBe(N + 2);
    // That write swept the expired records: the store holds only the new one, and the answers that were kept (16 KiB each) are gone from memory.
    expect(held()).toBe(1);
    const heapAfter = await settledHeap();
    const readings = `heap and buffers: ${(heapBefore / MB).toFixed(1)} MB before, ${(heapKept / MB).toFixed(1)} MB with the answers kept, ${(heapAfter / MB).toFixed(1)} MB after`;
    expect((heapAfter - heapBefore) / MB, readings).toBeLessThan(6);
    await expect.poll(async () => leftOver(await g.metricsText()), { timeout: 5_000 }).toEqual([]);
    await agent.close();
  }, 60_000);

  it('hundreds of made-up model names answered 404 leave the target labels on /metrics bounded, and none of their series', async () => {
    const provider = await startProvider();
    closeAfter(provider);
    const g = await startGateway(provider);
    const agent = new Agent({ connections: 64 });
    const client = clientOn(g.url, agent);
    // A few real models learned first, so a made-up name has places to take and give back.
    for (const m of ['gpt-4o', 'gpt-4o-mini', 'o3']) await client.chat.completions.create({ model: m, messages: [{ role: 'user', content: 'hi' }] });
    const targets = async () => new Set((await g.metrics()).map((s) => s.labels.target).filter((t): t is string => t !== undefined && t !== 'none'));
    const before = await targets();
    expect(before).toEqual(new Set(['p/gpt-4o', 'p/gpt-4o-mini', 'p/o3']));
    const heapBefore = await settledHeap();

    const N = 600;
    const endings = await pooled(N, 40, async (i) => {
      try {
        await client.chat.completions.create({ model: `made-up-${i}`, messages: [{ role: 'user', content: 'hi' }] });
        return 'ok';
      } catch (err) {
        return statusOf(err);
      }
    });
    expect(tally(endings)).toEqual({ 'status 404': N });
    // The same made-up names sent several at once (one's 404 gives the key back while the others are in flight under
    // it), a quarter of those callers leaving before their answer.
    provider.delayMs = 60;
    const copies = await Promise.all(
      Array.from({ length: 150 * 4 }, async (_, i) => {
        const ctrl = new AbortController();
        const timer = i % 4 === 3 ? setTimeout(() => ctrl.abort(), 20 + (i % 70)) : undefined;
        try {
          await client.chat.completions.create({ model: `made-up-twice-${i >> 2}`, messages: [{ role: 'user', content: 'hi' }] }, { signal: ctrl.signal });
          return 'ok';
        } catch (err) {
          return ctrl.signal.aborted ? 'aborted' : statusOf(err);
        } finally {
          clearTimeout(timer);
        }
      }),
    );
    expect(Object.keys(tally(copies)).sort(), JSON.stringify(tally(copies))).toEqual(expect.arrayContaining(['status 404']));
    expect(Object.keys(tally(copies)).filter((k) => k !== 'status 404' && k !== 'aborted'), JSON.stringify(tally(copies))).toEqual([]);
    provider.delayMs = 5;
    await expect.poll(() => provider.inflight(), { timeout: 5_000 }).toBe(0);
    // Still served as ever: the real models keep their own targets, a new real name still gets one.
    await client.chat.completions.create({ model: 'gpt-4.1', messages: [{ role: 'user', content: 'hi' }] });
    await expect.poll(async () => leftOver(await g.metricsText()), { timeout: 5_000 }).toEqual([]);
    const after = await targets();
    // The README: at most 32 learned per provider, past that `<provider>/other`; a 404'd name gives its place back and
    // what was kept under it (metric series among it) goes too.
    expect([...after].filter((t) => t.startsWith('p/made-up-')), 'series of refused names left on /metrics').toEqual([]);
    expect(after.size).toBeLessThanOrEqual(1 + 32 + 1);
    expect(after.has('p/gpt-4.1'), [...after].join(', ')).toBe(true);
    const text = await g.metricsText();
    expect(text.split('\n').length, 'the /metrics exposition grew with the made-up names').toBeLessThan(2_000);
    const heapAfter = await settledHeap();
    expect((heapAfter - heapBefore) / MB, `heap ${(heapBefore / MB).toFixed(1)} MB -> ${(heapAfter / MB).toFixed(1)} MB`).toBeLessThan(15);
    await agent.close();
  }, 60_000);
});
