// A seeded soak of the features that meet on the request path: the one-queue parking lot (flex and default tier of a
// target parked together, the flex tier held off alone by a 498 capacity_exceeded), a streamRecovery continuation's
// slot in the next target's pool, the client-repeats watch counting undeclared retries against the budget, streamUsage
// asking OpenAI-family streams for their usage and hiding it from clients that did not ask, and recovered streams
// billing both targets. One gateway (in-process state), then two sharing a real redis-server, front a primary and a
// backup of the test's own (node:http, seeded faults switched phase by phase: 503s, 429s with retry-after, 498 on flex
// requests, resets, streams cut or stalled after their first output, slow first tokens), small pools, while openai SDK
// clients (SDK retries, or none and a fixed-interval loop of their own; streamed or not; flex or default tier; online
// or batch; include_usage or not; some leaving mid-stream) run. Afterwards: gauges at zero, nothing pending, one log
// line and one count per request, answers within their deadlines, attempts logged as the upstreams saw them, tokens
// billed as the log lines say, no usage a client did not ask for, no stream ended clean without its finish, and the
// process's handles back near where they began. STORMGATE_SOAK_SEED replays a run, STORMGATE_SOAK_MS lengthens it and STORMGATE_SOAK_RATE (calls a second) thickens it.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { once } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import type { FastifyInstance } from 'fastify';
import OpenAI from 'openai';
import { Agent, fetch as undiciFetch } from 'undici';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { createLogger } from '../src/observability/logger.ts';
import { createMetrics } from '../src/observability/metrics.ts';
import { seededRandom } from '../src/policy/random.ts';
import { buildServer } from '../src/server.ts';
import { leftOver, sums } from './helpers/cancel-storm.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { testLogSink } from './helpers/stack.ts';

const redis = useRedisServer();
const started: FastifyInstance[] = [];
const upstreams: Upstream[] = [];
afterEach(async () => {
  await Promise.all(started.splice(0).map((g) => g.close()));
  await Promise.all(upstreams.splice(0).map((u) => u.close()));
});

const SEED = Number(process.env.STORMGATE_SOAK_SEED ?? 8_2026);
const RUN_MS = Number(process.env.STORMGATE_SOAK_MS ?? 18_000);
/** Calls started per second of the run. */
const CALLS_PER_S = Number(process.env.STORMGATE_SOAK_RATE ?? 14);
const CHAT = '/v1/chat/completions';
const ROUTE_TIMEOUT_MS = 6_000;
const CHUNKS = 6;
/** How late past its deadline an answer may come on a loaded 2-core machine running gateways, upstreams and clients. */
const LATE_BOUND_MS = 3_000;

// ---------------------------------------------------------------------------------------------------------------
// The upstreams: one node:http server each, answering chat completions as OpenAI does (usage only when asked, with
// `"usage": null` on every other chunk then), the same text for the same prompt on both (so a continuation splices),
// and a seeded fault per request from the phase's mix.

interface Mix {
  name: string;
  e503?: number;
  e429?: number;
  /** 498 capacity_exceeded with retry-after, on requests that ask for the flex tier only. */
  e498?: number;
  reset?: number;
  /** A stream destroyed after its first content chunk. */
  cut?: number;
  /** A stream that goes quiet after its first content chunk, until the gateway leaves. */
  stall?: number;
  /** A first content chunk 1.1 s late (inside firstTokenMs), or 2.2 s (past it). */
  slowFirst?: number;
  tooSlowFirst?: number;
}

const MIXES: Mix[] = [
  { name: 'calm' },
  { name: '503s', e503: 0.3 },
  { name: '429 retry-after 1', e429: 0.15, e503: 0.05 },
  { name: 'flex full (498)', e498: 0.6 },
  { name: 'cuts', cut: 0.35 },
  { name: 'stalls', stall: 0.2, cut: 0.1 },
  { name: 'slow first tokens', slowFirst: 0.3, tooSlowFirst: 0.1 },
  { name: 'resets', reset: 0.15, e503: 0.1 },
  { name: 'down', e503: 1 },
  { name: 'everything', e503: 0.1, e429: 0.05, e498: 0.3, reset: 0.05, cut: 0.15, stall: 0.05, slowFirst: 0.1 },
];

interface Received {
  reqId: string;
  flex: boolean;
  stream: boolean;
  askedUsage: boolean;
  retryAttempt: string | undefined;
  fault: string;
  /** The usage it reported (a whole answer, or the usage chunk of a stream that ran to its end). */
  usage?: { prompt: number; completion: number };
}

interface Upstream {
  name: string;
  origin: string;
  received: Received[];
  inflight(): number;
  maxInflight(): number;
  setMix(m: Mix): void;
  close(): Promise<void>;
}

const textOf = (prompt: string, i: number) => `${prompt.length % 7}w${i} `;

async function startUpstream(name: string, seed: number): Promise<Upstream> {
  const random = seededRandom(seed);
  let mix: Mix = MIXES[0]!;
  let inflight = 0;
  let maxInflight = 0;
  const received: Received[] = [];
  const sockets = new Set<Socket>();
  const chunk = (fields: Record<string, unknown>, usageNull: boolean) =>
    `data: ${JSON.stringify({ id: `chatcmpl-${name}`, object: 'chat.completion.chunk', created: 1741290958, model: 'gpt-4o-2024-08-06', ...fields, ...(usageNull && { usage: null }) })}\n\n`;
  const handle = async (req: IncomingMessage, res: ServerResponse, raw: string) => {
    const body = JSON.parse(raw) as { stream?: boolean; service_tier?: string; stream_options?: { include_usage?: boolean }; messages: Array<{ content: string }> };
    const prompt = body.messages.map((m) => m.content).join(' ');
    const r: Received = {
      reqId: String(req.headers['x-client-request-id'] ?? '?'),
      flex: body.service_tier === 'flex',
      stream: body.stream === true,
      askedUsage: body.stream_options?.include_usage === true,
      retryAttempt: req.headers['x-retry-attempt'] as string | undefined,
      fault: 'ok',
    };
    received.push(r);
    const draw = random();
    let acc = 0;
    const hit = (p: number | undefined) => (acc += p ?? 0) > draw;
    const usage = { prompt: 10 + (prompt.length % 13), completion: CHUNKS };
    const json = (status: number, payload: unknown, headers: Record<string, string> = {}) => {
      res.writeHead(status, { 'content-type': 'application/json', ...headers });
      res.end(JSON.stringify(payload));
    };
    const error = (status: number, code: string | null, headers: Record<string, string> = {}, type = 'server_error') =>
      json(status, { error: { message: `${name}: ${status}`, type, param: null, code } }, headers);
    await sleep(20 + Math.floor(random() * 40));
    if (res.destroyed) return;
    if (hit(mix.e503)) return (r.fault = '503'), error(503, null);
    if (hit(mix.e429)) return (r.fault = '429'), error(429, 'rate_limit_exceeded', { 'retry-after': '1' }, 'requests');
    if (r.flex && hit(mix.e498)) return (r.fault = '498'), error(498, 'capacity_exceeded', { 'retry-after': '2' }, 'capacity_exceeded');
    if (hit(mix.reset)) return (r.fault = 'reset'), req.socket.destroy();
    if (!r.stream) {
      r.usage = usage;
      return json(200, {
        id: `chatcmpl-${name}`,
        object: 'chat.completion',
        created: 1741290958,
        model: 'gpt-4o-2024-08-06',
        choices: [{ index: 0, message: { role: 'assistant', content: Array.from({ length: CHUNKS }, (_, i) => textOf(prompt, i)).join('') }, logprobs: null, finish_reason: 'stop' }],
        usage: { prompt_tokens: usage.prompt, completion_tokens: usage.completion, total_tokens: usage.prompt + usage.completion },
      });
    }
    const cut = r.stream && hit(mix.cut);
    const stall = !cut && hit(mix.stall);
    const slow = !cut && !stall && hit(mix.slowFirst);
    const tooSlow = !cut && !stall && !slow && hit(mix.tooSlowFirst);
    r.fault = cut ? 'cut' : stall ? 'stall' : slow ? 'slow-first' : tooSlow ? 'too-slow-first' : 'ok';
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(chunk({ choices: [{ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }] }, r.askedUsage));
    if (slow || tooSlow) await sleep(slow ? 1_100 : 2_200);
    for (let i = 0; i < CHUNKS; i++) {
      if (res.destroyed) return;
      res.write(chunk({ choices: [{ index: 0, delta: { content: textOf(prompt, i) }, logprobs: null, finish_reason: null }] }, r.askedUsage));
      await sleep(30);
      // After the first output has been read: a cut, or silence until the gateway's idle timer ends it.
      if (i === 0 && cut) return req.socket.destroy();
      if (i === 0 && stall) return;
    }
    if (res.destroyed) return;
    res.write(chunk({ choices: [{ index: 0, delta: {}, logprobs: null, finish_reason: 'stop' }] }, r.askedUsage));
    if (r.askedUsage) {
      r.usage = usage;
      res.write(chunk({ choices: [], usage: { prompt_tokens: usage.prompt, completion_tokens: usage.completion, total_tokens: usage.prompt + usage.completion } }, false));
    }
    res.end('data: [DONE]\n\n');
  };
  const server: Server = createServer((req, res) => {
    inflight++;
    maxInflight = Math.max(maxInflight, inflight);
    let done = false;
    const end = () => {
      if (!done) inflight--;
      done = true;
    };
    res.on('close', end);
    let raw = '';
    req.on('data', (d: Buffer) => (raw += d.toString()));
    req.on('end', () => void handle(req, res, raw).catch(() => res.destroy()));
  });
  server.on('connection', (s: Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const u: Upstream = {
    name,
    origin: `http://127.0.0.1:${(server.address() as { port: number }).port}`,
    received,
    inflight: () => inflight,
    maxInflight: () => maxInflight,
    setMix: (m) => (mix = m),
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise((resolve) => server.close(resolve));
    },
  };
  upstreams.push(u);
  return u;
}

// ---------------------------------------------------------------------------------------------------------------
// The config: both targets OpenAI-family with streamUsage, small pools with both classes, quick breakers, parking,
// streamRecovery continue, repeats counted against the budget.

function soakConfig(primary: string, backup: string, redisUrl?: string): ConfigInput {
  const provider = (url: string, apiKey: string, maxConcurrent: number) => ({
    family: 'openai' as const,
    baseUrl: `${url}/v1`,
    apiKey,
    streamUsage: true,
    maxConnections: 8,
    pools: { maxConcurrent, classes: { online: { minShare: 0.5, maxQueue: 40 }, batch: { minShare: 0.25, maxQueue: 40 } } },
    breaker: { openS: 2, probeWhileParkedMs: 300, probeWhileParkedMaxMs: 800 },
    timeouts: { connectMs: 1_000, firstTokenMs: 1_600, idleMs: 700, responseMs: 3_000 },
  });
  return {
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    ...(redisUrl && { state: { redis: redisUrl, keyPrefix: `soak8-${process.pid}-${Date.now()}`, commandTimeoutMs: 300 } }),
    providers: { primary: provider(primary, 'sk-soak8-primary-0123456789', 6), backup: provider(backup, 'sk-soak8-backup-0123456789', 4) },
    routes: [
      {
        name: 'chat',
        match: { path: CHAT },
        targets: [{ provider: 'primary' }, { provider: 'backup' }],
        timeoutMs: ROUTE_TIMEOUT_MS,
        minAttemptMs: 300,
        retry: { maxAttempts: 3, backoff: { baseMs: 100, capMs: 600 }, maxWaitHintMs: 2_500 },
        budget: { repeats: { windowS: 30, countAsRetries: true } },
        park: { maxQueue: 100 },
        streamRecovery: 'continue',
      },
    ],
  };
}

// ---------------------------------------------------------------------------------------------------------------
// The clients.

interface Call {
  id: string;
  at: number;
  startAtMs: number;
  stream: boolean;
  flex: boolean;
  batch: boolean;
  includeUsage: boolean;
  /** 'sdk': the SDK's own retries (maxRetries 2); 'loop': maxRetries 0 and a fixed-interval loop of its own. */
  retries: 'sdk' | 'loop';
  /** A deadline of the client's own, in x-stormgate-timeout-ms. */
  timeoutMs?: number;
  cancel?: { afterMs: number } | { afterChunks: number };
}

function planCalls(random: () => number, n: number, instances: number): Call[] {
  const bursts = Array.from({ length: Math.max(2, Math.round(RUN_MS / 3_000)) }, () => Math.floor(random() * (RUN_MS - 2_000)));
  return Array.from({ length: n }, (_, i): Call => {
    const stream = random() < 0.6;
    const r = random();
    const cancel = r < 0.06 ? { afterMs: 50 + Math.floor(random() * 2_500) } : r < 0.16 && stream ? { afterChunks: 1 + Math.floor(random() * 3) } : undefined;
    return {
      id: `s8-${i}`,
      at: Math.floor(random() * instances),
      startAtMs: random() < 0.4 ? bursts[Math.floor(random() * bursts.length)]! + Math.floor(random() * 150) : Math.floor(random() * (RUN_MS - 1_000)),
      stream,
      flex: random() < 0.35,
      batch: random() < 0.3,
      includeUsage: stream && random() < 0.5,
      retries: random() < 0.5 ? 'sdk' : 'loop',
      timeoutMs: random() < 0.2 ? 1_500 + Math.floor(random() * 2_500) : undefined,
      cancel,
    };
  }).sort((a, b) => a.startAtMs - b.startAtMs);
}

/** One HTTP request a client sent (the SDK's retries and the loop's each one), and what came of it at the fetch. */
interface Sent {
  reqId: string;
  sentAt: number;
  /** When the response's headers came; undefined when the fetch failed (aborted, reset). */
  answeredAt?: number;
  status?: number;
  timeoutMs?: number;
}

function recordingFetch(sent: Map<string, Sent>, agent: Agent): typeof fetch {
  const counts = new Map<string, number>();
  return async (url, init) => {
    const headers = new Headers(init?.headers);
    const id = headers.get('x-request-id') ?? '?';
    counts.set(id, (counts.get(id) ?? 0) + 1);
    const reqId = `${id}.${counts.get(id)!}`;
    headers.set('x-request-id', reqId);
    const t = headers.get('x-stormgate-timeout-ms');
    const s: Sent = { reqId, sentAt: Date.now(), timeoutMs: t ? Number(t) : undefined };
    sent.set(reqId, s);
    const res = (await undiciFetch(url as string, { ...(init as object), headers: Object.fromEntries(headers.entries()), dispatcher: agent })) as unknown as Response;
    s.answeredAt = Date.now();
    s.status = res.status;
    return res;
  };
}

type Ending = 'ok' | 'aborted' | 'stream-error' | `status ${number}` | `bad ${string}`;

interface Settled {
  call: Call;
  ending: Ending;
  tries: number;
  /** Violations seen by the client itself. */
  seen: string[];
}

/** One try of a call (one SDK call, with the SDK's retries if it has them). */
async function tryOnce(client: OpenAI, c: Call, seen: string[]): Promise<Ending> {
  const ctrl = new AbortController();
  const timer = c.cancel && 'afterMs' in c.cancel ? setTimeout(() => ctrl.abort(), c.cancel.afterMs) : undefined;
  const headers: Record<string, string> = { 'x-request-id': c.id };
  if (c.batch) headers['x-stormgate-priority'] = 'batch';
  if (c.timeoutMs !== undefined) headers['x-stormgate-timeout-ms'] = String(c.timeoutMs);
  const body = {
    model: 'gpt-4o',
    messages: [{ role: 'user' as const, content: `soak8 call ${c.id}` }],
    ...(c.flex && { service_tier: 'flex' as const }),
  };
  try {
    if (!c.stream) {
      const r = await client.chat.completions.create(body, { headers, signal: ctrl.signal });
      if (!r.choices[0]?.finish_reason || typeof r.choices[0].message.content !== 'string') return `bad whole answer ${JSON.stringify(r).slice(0, 200)}`;
      return 'ok';
    }
    const s = await client.chat.completions.create({ ...body, stream: true, ...(c.includeUsage && { stream_options: { include_usage: true } }) }, { headers, signal: ctrl.signal });
    let chunks = 0;
    let finish: string | null | undefined;
    let usages = 0;
    let text = '';
    for await (const chunk of s) {
      if ('usage' in chunk) {
        if (!c.includeUsage) seen.push(`${c.id}: a usage field it did not ask for: ${JSON.stringify(chunk).slice(0, 200)}`);
        else if (chunk.usage) usages++;
      }
      const content = chunk.choices[0]?.delta?.content;
      if (content) {
        chunks++;
        text += content;
      }
      finish ??= chunk.choices[0]?.finish_reason;
      if (c.cancel && 'afterChunks' in c.cancel && chunks >= c.cancel.afterChunks) {
        // A user who cancels stops reading: a read after the abort can wait for ever in the client (cancel-storm.ts).
        ctrl.abort();
        break;
      }
    }
    if (!finish) return ctrl.signal.aborted ? 'aborted' : `bad stream ended clean after ${chunks} chunks without its finish`;
    const want = Array.from({ length: CHUNKS }, (_, i) => textOf(`soak8 call ${c.id}`, i)).join('');
    if (text !== want) seen.push(`${c.id}: stream text ${JSON.stringify(text)}, expected ${JSON.stringify(want)}`);
    if (c.includeUsage && usages !== 1) seen.push(`${c.id}: asked for usage, got ${usages} usage chunks in a finished stream`);
    return 'ok';
  } catch (err) {
    if (ctrl.signal.aborted || err instanceof OpenAI.APIUserAbortError) return 'aborted';
    if (err instanceof OpenAI.APIError && err.status === undefined) return err.code === 'stream_interrupted' ? 'stream-error' : `bad stream error ${err.code}: ${err.message}`;
    if (err instanceof OpenAI.APIError) return `status ${err.status}`;
    return `bad ${(err as Error).message?.slice(0, 160)}`;
  } finally {
    clearTimeout(timer);
  }
}

async function runCall(clients: Map<string, OpenAI>, c: Call): Promise<Settled> {
  await sleep(c.startAtMs);
  const client = clients.get(`${c.at}/${c.retries}`)!;
  const seen: string[] = [];
  let ending = await tryOnce(client, c, seen);
  let tries = 1;
  // The fixed-interval loop: the same body again 400 ms after any failure, up to three tries (undeclared repeats).
  while (c.retries === 'loop' && tries < 3 && ending !== 'ok' && ending !== 'aborted' && !ending.startsWith('bad')) {
    await sleep(400);
    ending = await tryOnce(client, c, seen);
    tries++;
  }
  return { call: c, ending, tries, seen };
}

// ---------------------------------------------------------------------------------------------------------------
// The run.

type Line = {
  reqId: string;
  method?: string;
  path?: string;
  status?: number;
  route?: string;
  target?: string;
  outcome?: string;
  clientGone?: boolean;
  clientRetry?: string;
  streamEnd?: string;
  attempts?: Array<{ target: string; reason: string; status?: number }>;
  usage?: { prompt: number; completion: number };
  continuationUsage?: { target: string; usage: { prompt: number; completion: number } };
};

/** The series of a metric on /metrics text, as [labels, value]. */
function series(text: string, name: string): Array<[string, number]> {
  return text
    .split('\n')
    .filter((l) => l.startsWith(`${name}{`) || l.startsWith(`${name} `))
    .map((l) => [l.slice(name.length, l.lastIndexOf(' ')), Number(l.split(' ').at(-1))]);
}

function shuffled<T>(xs: T[], random: () => number): T[] {
  const out = [...xs];
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [out[i], out[j]] = [out[j]!, out[i]!];
  }
  return out;
}

const handleTally = () => {
  const out: Record<string, number> = {};
  for (const r of process.getActiveResourcesInfo()) out[r] = (out[r] ?? 0) + 1;
  return out;
};

async function soak(instances: number, redisUrl: string | undefined, seed: number) {
  const crashes: unknown[] = [];
  const onCrash = (err: unknown) => crashes.push(err);
  process.on('unhandledRejection', onCrash);
  try {
    const random = seededRandom(seed);
    const primary = await startUpstream('primary', seed + 1);
    const backup = await startUpstream('backup', seed + 2);
    const config = ConfigSchema.parse(soakConfig(primary.origin, backup.origin, redisUrl));
    const logs: string[] = [];
    const urls: string[] = [];
    const received: string[][] = [];
    for (let i = 0; i < instances; i++) {
      const g = await buildServer(config, { logger: createLogger(config, testLogSink(logs)), metrics: createMetrics({ defaultMetrics: false }) });
      started.push(g);
      const mine: string[] = [];
      received.push(mine);
      g.server.on('request', (req: IncomingMessage) => {
        if (req.url?.startsWith(CHAT)) mine.push(String(req.headers['x-request-id']));
      });
      urls.push(await g.listen({ host: '127.0.0.1', port: 0 }));
    }
    const sent = new Map<string, Sent>();
    // The clients' connections on an agent of their own, closed once the run is over: what is left then is the
    // gateways' and upstreams' own.
    const agent = new Agent({ connections: 200 });
    const clients = new Map<string, OpenAI>();
    for (let at = 0; at < instances; at++) {
      clients.set(`${at}/sdk`, new OpenAI({ baseURL: `${urls[at]}/v1`, apiKey: 'sk-soak8-client', fetch: recordingFetch(sent, agent) }));
      clients.set(`${at}/loop`, new OpenAI({ baseURL: `${urls[at]}/v1`, apiKey: 'sk-soak8-client', maxRetries: 0, fetch: recordingFetch(sent, agent) }));
    }
    // A first quiet request per instance and upstream, so the handles counted below include the keep-alive ones.
    for (const u of urls) for (let k = 0; k < 2; k++) await (await fetch(`${u}/metrics`)).text();
    const handlesBefore = handleTally();

    // Phases: every 1.2 to 2.2 s the primary takes the next mix of a seeded shuffle (so each comes once), and the
    // backup, two times in three, a seeded draw; both calm for the last 3 s.
    const phases: Array<{ atMs: number; up: Upstream; mix: Mix }> = [];
    const order = shuffled(MIXES.slice(1), random);
    for (let at = 500, k = 0; at < RUN_MS - 3_000; at += 1_200 + Math.floor(random() * 1_000), k++) {
      const mix = order[k % order.length]!;
      phases.push({ atMs: at, up: primary, mix });
      // While the primary breaks streams after their first output the backup is calm (and was, the phase before), so
      // continuations have somewhere to go: what recovery does with a backup that fails too, other phases show.
      const breaks = (m: Mix) => m.cut !== undefined || m.stall !== undefined;
      if (breaks(mix) || breaks(order[(k + 1) % order.length]!)) phases.push({ atMs: at, up: backup, mix: MIXES[0]! });
      else if (random() < 0.67) phases.push({ atMs: at + 300, up: backup, mix: MIXES[Math.floor(random() * MIXES.length)]! });
    }
    phases.push({ atMs: RUN_MS - 3_000, up: primary, mix: MIXES[0]! }, { atMs: RUN_MS - 3_000, up: backup, mix: MIXES[0]! });
    const calls = planCalls(random, Math.round((RUN_MS / 1_000) * CALLS_PER_S), instances);

    const t0 = Date.now();
    const schedule = (async () => {
      for (const p of phases) {
        await sleep(Math.max(0, t0 + p.atMs - Date.now()));
        p.up.setMix(p.mix);
      }
    })();
    const settled = await Promise.all(calls.map((c) => runCall(clients, c)));
    await schedule;
    const clientsDoneAt = Date.now();

    const requests = () => received.reduce((n, r) => n + r.length, 0);
    const metricsTexts = () => Promise.all(urls.map(async (u) => (await fetch(`${u}/metrics`)).text()));
    // Settle: gauges at zero, nothing at the upstreams, every request counted and logged.
    await vi.waitFor(
      async () => {
        const texts = await metricsTexts();
        for (const [i, text] of texts.entries()) {
          expect(leftOver(text), `instance ${i}: gauges not back at zero; seed ${seed}`).toEqual([]);
          expect(sums(text).get('stormgate_requests_total'), `instance ${i}: requests counted vs received; seed ${seed}`).toBe(received[i]!.length);
        }
        expect(primary.inflight() + backup.inflight(), 'requests still open at the upstreams').toBe(0);
        expect(logs.filter((l) => l.includes(`"path":"${CHAT}"`)).length, 'request log lines').toBe(requests());
      },
      { timeout: ROUTE_TIMEOUT_MS + 8_000, interval: 200 },
    );
    const settleMs = Date.now() - clientsDoneAt;
    await sleep(300);
    const texts = await metricsTexts();
    await agent.close();
    await sleep(200);
    const handlesAfter = handleTally();

    const violations: string[] = [];
    const v = (what: string) => violations.push(what);
    const tally = (xs: string[]) => Object.fromEntries([...xs.reduce((m, x) => m.set(x, (m.get(x) ?? 0) + 1), new Map<string, number>())].sort());
    const metric = (name: string) => texts.reduce((n, t) => n + (sums(t).get(name) ?? 0), 0);
    const up = [...primary.received.map((r) => ({ ...r, at: 'primary' })), ...backup.received.map((r) => ({ ...r, at: 'backup' }))];

    // 1. Every pool's gauges at zero, nothing parked (checked above; again, after the pause).
    for (const [i, text] of texts.entries()) {
      for (const l of leftOver(text)) v(`instance ${i}: ${l}`);
      for (const [labels, value] of series(text, 'stormgate_pool_in_use')) if (value !== 0) v(`instance ${i}: stormgate_pool_in_use${labels} ${value}`);
      for (const [labels, value] of series(text, 'stormgate_pool_queue_depth')) if (value !== 0) v(`instance ${i}: stormgate_pool_queue_depth${labels} ${value}`);
      for (const [labels, value] of series(text, 'stormgate_parked_requests')) if (value !== 0) v(`instance ${i}: stormgate_parked_requests${labels} ${value}`);
    }

    // 2. One log line and one count per request received.
    const lines = logs.map((l) => JSON.parse(l) as Line).filter((l) => l.method !== undefined && l.path === CHAT);
    const lineOf = new Map<string, Line>();
    for (const l of lines) {
      if (lineOf.has(l.reqId)) v(`two request log lines for ${l.reqId}`);
      lineOf.set(l.reqId, l);
    }
    const allReceived = received.flat();
    if (new Set(allReceived).size !== allReceived.length) v('a request id received twice');
    for (const id of allReceived) if (!lineOf.has(id)) v(`${id}: received, never logged`);
    if (lines.length !== allReceived.length) v(`${lines.length} log lines for ${allReceived.length} requests`);
    if (metric('stormgate_requests_total') !== allReceived.length) v(`stormgate_requests_total ${metric('stormgate_requests_total')} for ${allReceived.length} requests`);

    // 3. No answer after its deadline (the client's own, or the route's) plus a generous bound.
    let answersChecked = 0;
    for (const s of sent.values()) {
      if (s.answeredAt === undefined) continue;
      answersChecked++;
      const deadline = Math.min(ROUTE_TIMEOUT_MS, s.timeoutMs ?? Infinity);
      if (s.answeredAt - s.sentAt > deadline + LATE_BOUND_MS) v(`${s.reqId}: answered (${s.status}) ${s.answeredAt - s.sentAt} ms after it was sent, deadline ${deadline} ms: ${JSON.stringify(lineOf.get(s.reqId)).slice(0, 400)}`);
    }

    // 4. Attempts in the log lines are what the upstreams received (an attempt cut while it connected never arrived).
    const upstreamByReq = new Map<string, number>();
    for (const e of up) upstreamByReq.set(e.reqId, (upstreamByReq.get(e.reqId) ?? 0) + 1);
    let loggedAttempts = 0;
    let unseen = 0;
    for (const [reqId, l] of lineOf) {
      const seenUp = upstreamByReq.get(reqId) ?? 0;
      const logged = l.attempts?.length ?? 0;
      const cut = (l.attempts ?? []).filter((a) => ['client_abort', 'deadline', 'aborted'].includes(a.reason)).length;
      loggedAttempts += logged;
      unseen += logged - seenUp;
      if (logged < seenUp || logged - seenUp > cut) v(`${reqId}: ${logged} attempts logged, ${seenUp} upstream requests: ${JSON.stringify(l.attempts).slice(0, 400)}`);
    }
    for (const id of upstreamByReq.keys()) if (!lineOf.has(id)) v(`${id}: seen upstream, no log line`);
    if (metric('stormgate_upstream_attempts_total') !== loggedAttempts) v(`stormgate_upstream_attempts_total ${metric('stormgate_upstream_attempts_total')}, attempts in the log ${loggedAttempts}`);

    // 5. Tokens billed per target are the log lines' usage and continuationUsage.
    const billed = new Map<string, number>();
    const bill = (target: string | undefined, u: { prompt: number; completion: number } | undefined) => {
      if (target === undefined || u === undefined) return;
      billed.set(target, (billed.get(target) ?? 0) + u.prompt + u.completion);
    };
    for (const l of lines) {
      bill(l.target, l.usage);
      bill(l.continuationUsage?.target, l.continuationUsage?.usage);
    }
    const tokens = new Map<string, number>();
    for (const text of texts) {
      for (const [labels, value] of series(text, 'stormgate_tokens_total')) {
        const target = /target="([^"]+)"/.exec(labels)![1]!;
        tokens.set(target, (tokens.get(target) ?? 0) + value);
      }
    }
    for (const target of new Set([...billed.keys(), ...tokens.keys()])) {
      if ((billed.get(target) ?? 0) !== (tokens.get(target) ?? 0)) v(`tokens of ${target}: stormgate_tokens_total ${tokens.get(target) ?? 0}, log lines ${billed.get(target) ?? 0}`);
    }
    // What the upstreams reported in answers that ran whole is at least what was billed (a client that left before the
    // usage chunk was read billed nothing for it).
    const reported = up.reduce((n, e) => n + (e.usage ? e.usage.prompt + e.usage.completion : 0), 0);
    const billedAll = [...billed.values()].reduce((a, b) => a + b, 0);
    if (billedAll > reported) v(`billed ${billedAll} tokens, the upstreams reported ${reported}`);
    // streamUsage: every stream upstream asked for its usage.
    const unasked = up.filter((e) => e.stream && !e.askedUsage);
    if (unasked.length > 0) v(`${unasked.length} streams sent upstream without include_usage (streamUsage: true)`);

    // 6. The clients' own checks: no usage they did not ask for, no stream ended clean without its finish.
    for (const s of settled) {
      for (const x of s.seen) v(x);
      if (s.ending.startsWith('bad')) v(`${s.call.id}: ${s.ending}`);
    }

    // 7. Handles: back near where they began. Kept-alive connections from the gateways to the upstreams stay (at most
    // maxConnections per provider and instance, both ends in this process), and a few more for what is closing.
    const sockets = (t: Record<string, number>) => t['TCPSocketWrap'] ?? 0;
    const kept = 2 * 8 * 2 * instances;
    if (sockets(handlesAfter) > sockets(handlesBefore) + kept + 10) v(`sockets grew from ${sockets(handlesBefore)} to ${sockets(handlesAfter)} (bound: ${kept} kept alive): ${JSON.stringify(handlesAfter)}`);
    const others = (t: Record<string, number>) => Object.entries(t).reduce((n, [k, c]) => n + (k === 'TCPSocketWrap' ? 0 : c), 0);
    if (others(handlesAfter) > others(handlesBefore) + 10) v(`handles other than sockets grew: ${JSON.stringify(handlesBefore)} -> ${JSON.stringify(handlesAfter)}`);

    for (const c of crashes) v(`unhandled: ${String((c as Error)?.stack ?? c)}`);

    const streamEnds = tally(lines.filter((l) => l.streamEnd).map((l) => l.streamEnd!));
    const figures = {
      seed,
      instances,
      calls: calls.length,
      kinds: tally(calls.map((c) => `${c.stream ? 'stream' : 'whole'}/${c.flex ? 'flex' : 'default'}/${c.batch ? 'batch' : 'online'}/${c.retries}${c.includeUsage ? '/usage' : ''}`)),
      cancels: tally(calls.filter((c) => c.cancel).map((c) => ('afterMs' in c.cancel! ? 'timed' : 'mid-stream'))),
      clientRequests: allReceived.length,
      loopTries: settled.filter((s) => s.call.retries === 'loop').reduce((n, s) => n + s.tries, 0),
      upstreamRequests: up.length,
      faults: { primary: tally(primary.received.map((r) => r.fault)), backup: tally(backup.received.map((r) => r.fault)) },
      maxInflight: [primary.maxInflight(), backup.maxInflight()],
      endings: tally(settled.map((s) => s.ending.replace(/^bad .*/, 'bad'))),
      outcomes: tally(lines.map((l) => l.outcome ?? '?')),
      streamEnds,
      clientRetries: tally(lines.filter((l) => l.clientRetry).map((l) => l.clientRetry!)),
      continuations: lines.filter((l) => l.continuationUsage).length,
      retries: metric('stormgate_retry_count_total'),
      budgetRefused: metric('stormgate_retry_budget_exhausted_total'),
      shed: metric('stormgate_shed_total'),
      parkOutcomes: tally(texts.flatMap((t) => series(t, 'stormgate_park_outcomes_total').flatMap(([l, n]) => Array<string>(n).fill(/outcome="(\w+)"/.exec(l)?.[1] ?? '?')))),
      tokens: Object.fromEntries(tokens),
      answersChecked,
      unseenAttempts: unseen,
      handles: { before: handlesBefore, after: handlesAfter },
      settleMs,
      phases: phases.map((p) => `${(p.atMs / 1000).toFixed(1)}s ${p.up.name}: ${p.mix.name}`),
    };
    console.log(`soak-today-features figures: ${JSON.stringify(figures, null, 1)}`);
    console.log(`soak-today-features: ${violations.length} violations`);
    expect(violations, `seed ${seed}`).toEqual([]);
    // The run did what it is for: continuations, repeats, flex hold-offs, parking, hidden usage.
    expect(figures.continuations + (streamEnds['recovered'] ?? 0), 'recovered streams').toBeGreaterThan(0);
  } finally {
    process.off('unhandledRejection', onCrash);
  }
}

describe("a seeded soak of today's features on the request path", () => {
  it(`one gateway, in-process state (seed ${SEED})`, async () => {
    await soak(1, undefined, SEED);
  }, 90_000);

  it(`two gateways sharing a real Redis (seed ${SEED + 100})`, async () => {
    await soak(2, redis().url, SEED + 100);
  }, 90_000);
});
