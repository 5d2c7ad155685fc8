// The cancellation storms of test/cancel-fuzz*.test.ts: the policy and faults they run under, the seeded plan of
// openai SDK calls (shape, instance, cancellation), one call as planned, and the readings that show a leak once the
// storm has settled (gauges not back at zero, the request count, sockets to a provider).
import { Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';

/** The providers' pools, and connections: small, so requests queue for slots. */
export const SLOTS = 4;

/** A small pool with both classes, quick breakers, short timers: the parts of a provider's config the storms share. */
export const STORM_PROVIDER = {
  maxConnections: SLOTS,
  pools: { maxConcurrent: SLOTS, classes: { online: { minShare: 0.5, maxQueue: 40 }, batch: { minShare: 0.25, maxQueue: 40 } } },
  breaker: { consecutiveFailures: 3, minRequests: 10, openS: 1, probeWhileParkedMs: 200, probeWhileParkedMaxMs: 400 },
  timeouts: { connectMs: 1_000, firstTokenMs: 1_500, idleMs: 700, responseMs: 2_500 },
};

/** The routes' policy: retries with backoff, a budget that lets them through, parking. */
export const STORM_ROUTE = {
  timeoutMs: 6_000,
  minAttemptMs: 300,
  retry: { maxAttempts: 3, backoff: { baseMs: 300, capMs: 1_000 }, maxWaitHintMs: 2_000 },
  budget: { ratio: 1, windowS: 10, minRetriesPerSecond: 50 },
  park: { maxQueue: 60 },
};

/** The primary, per model: latency, 429 with retry-after, 503, hangs, a slow first token, streams that stall mid-way. */
export const PRIMARY_FAULTS = {
  latencyMs: 40,
  latencyJitterMs: 120,
  stream: { chunks: 6, chunkDelayMs: 40 },
  models: {
    'gpt-4o': { errors: [{ status: 503, rate: 0.15 }, { status: 429, rate: 0.1, headers: { 'retry-after': '1' } }], hangRate: 0.03 },
    'slow-first': { stream: { chunks: 5, firstTokenDelayMs: 700, chunkDelayMs: 60 }, latencyMs: 150 },
    staller: { stream: { chunks: 6, chunkDelayMs: 30, stallAfterChunks: 2 } },
    'solo-a': { errors: [{ status: 503, rate: 0.3 }, { status: 429, rate: 0.1, headers: { 'retry-after-ms': '800' } }] },
  },
};

/** `solo-*` models are served by the primary alone (they park through its hold-offs and open breaker). */
export const MODELS = ['gpt-4o', 'gpt-4o', 'gpt-4o', 'slow-first', 'staller', 'solo-a', 'solo-a'];

type Cancel = { kind: 'none' } | { kind: 'early' | 'timed'; afterMs: number } | { kind: 'mid-stream'; afterChunks: number };

export interface Call {
  i: number;
  /** Which gateway it goes to. */
  at: number;
  model: string;
  stream: boolean;
  batch: boolean;
  key?: string;
  timeoutMs?: number;
  cancel: Cancel;
  startAtMs: number;
}

/**
 * The storm's calls, drawn from the seeded source: arrival times over `spreadMs`, instance (of `instances`), shape and
 * cancellation. A few keys (`${keys}-key-N`), so repeats meet their run in flight and after its answer.
 */
export function plan(random: () => number, n: number, spreadMs: number, keys: string, instances = 1): Call[] {
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(random() * xs.length)]!;
  return Array.from({ length: n }, (_, i) => {
    const stream = random() < 0.5;
    const r = random();
    const cancel: Cancel =
      r < 0.45 ? { kind: 'none' }
      : r < 0.55 ? { kind: 'early', afterMs: Math.floor(random() * 30) }
      : r < 0.85 || !stream ? { kind: 'timed', afterMs: 30 + Math.floor(random() * 3_000) }
      : { kind: 'mid-stream', afterChunks: 1 + Math.floor(random() * 3) };
    return {
      i,
      at: instances > 1 ? Math.floor(random() * instances) : 0,
      model: pick(MODELS),
      stream,
      batch: random() < 0.4,
      key: random() < 0.2 ? `${keys}-key-${Math.floor(random() * 12)}` : undefined,
      timeoutMs: random() < 0.3 ? 800 + Math.floor(random() * 4_000) : undefined,
      cancel,
      startAtMs: Math.floor(random() * spreadMs),
    };
  });
}

/** A keyed call's body follows its key (model, stream or not), so a repeat is never 422 idempotency_key_reused. */
export function keyedShape(key: string): { model: string; stream: boolean } {
  const h = [...key].reduce((a, ch) => (a * 31 + ch.charCodeAt(0)) >>> 0, 7);
  return { stream: h % 2 === 0, model: MODELS[(h >>> 1) % MODELS.length]! };
}

export type Ending = 'ok' | 'aborted' | `status ${number}` | `error ${string}`;

/** One SDK call as planned, on its instance's client; how it ended. */
export async function run(clients: OpenAI[], c: Call): Promise<Ending> {
  await sleep(c.startAtMs);
  const client = clients[c.at]!;
  const ctrl = new AbortController();
  const timer = c.cancel.kind === 'early' || c.cancel.kind === 'timed' ? setTimeout(() => ctrl.abort(), c.cancel.afterMs) : undefined;
  const headers: Record<string, string> = {};
  if (c.batch) headers['x-stormgate-priority'] = 'batch';
  if (c.key) headers['Idempotency-Key'] = c.key;
  if (c.timeoutMs) headers['x-stormgate-timeout-ms'] = String(c.timeoutMs);
  const messages = [{ role: 'user' as const, content: c.key ? `call under ${c.key}` : `call ${c.i}` }];
  const { model, stream } = c.key ? keyedShape(c.key) : c;
  try {
    if (stream) {
      const s = await client.chat.completions.create({ model, messages, stream: true }, { headers, signal: ctrl.signal });
      let chunks = 0;
      for await (const chunk of s) {
        if (chunk.choices[0]?.delta?.content) chunks++;
        // A user who cancels stops reading too: a read after the abort can wait for ever in the client (the fetch
        // cancels a body its reader has locked, which throws, and no longer hears of the closed connection), while
        // the gateway has ended the request.
        if (c.cancel.kind === 'mid-stream' && chunks >= c.cancel.afterChunks) {
          ctrl.abort();
          return 'aborted';
        }
      }
    } else {
      await client.chat.completions.create({ model, messages }, { headers, signal: ctrl.signal });
    }
    return 'ok';
  } catch (err) {
    if (ctrl.signal.aborted || err instanceof OpenAI.APIUserAbortError) return 'aborted';
    if (err instanceof OpenAI.APIError && err.status !== undefined) return `status ${err.status}`;
    return `error ${(err as Error).message.slice(0, 60)}`;
  } finally {
    clearTimeout(timer);
  }
}

/** How many calls ended each way. */
export function tally(endings: Ending[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const e of endings) out[e] = (out[e] ?? 0) + 1;
  return out;
}

/** The sum of the series of one metric (every label set) on a gateway's /metrics, by the metric's name. */
export function sums(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (line.startsWith('#') || line === '') continue;
    const name = line.slice(0, line.search(/[{ ]/));
    out.set(name, (out.get(name) ?? 0) + Number(line.split(' ').at(-1)));
  }
  return out;
}

/** Series of the gauges that must be back at zero once nothing runs, with their values when they are not. */
export function leftOver(text: string): string[] {
  const gauges = ['stormgate_pool_in_use', 'stormgate_pool_queue_depth', 'stormgate_waiting_body_bytes', 'stormgate_parked_requests'];
  return text.split('\n').filter((l) => gauges.some((g) => l.startsWith(`${g}{`) || l.startsWith(`${g} `)) && !l.endsWith(' 0'));
}

/** Sockets of this process connected to a port (a gateway's connections to a mock: both run in the test's process). */
export function socketsTo(port: number): number {
  const handles = (process as unknown as { _getActiveHandles(): unknown[] })._getActiveHandles();
  return handles.filter((h) => h instanceof Socket && h.remotePort === port && !h.destroyed).length;
}
