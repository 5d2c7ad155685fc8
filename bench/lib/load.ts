// The three load shapes of the overhead bench. Each opens its own keep-alive undici Pool, warms it up (so connect
// time is never measured), measures, and closes it. Time comes from performance.now(): monotonic, sub-millisecond.
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { Pool } from 'undici';
import { percentile } from './stats.ts';

export const CHAT_PATH = '/v1/chat/completions';
const HEADERS = { 'content-type': 'application/json', authorization: 'Bearer sk-bench' };
const CHAT_BODY = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
const STREAM_BODY = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });

/** Requests that did not end in a 2xx with a whole body; any of these makes the run suspect. */
interface Failures {
  errors: number;
}

function newPool(url: string, connections: number): Pool {
  // pipelining 1: one request per connection at a time, like the HTTP/1.1 clients (SDKs) the gateway serves.
  return new Pool(url, { connections, pipelining: 1 });
}

/** One chat completion; resolves true on a 2xx with its body fully read. */
async function chat(pool: Pool): Promise<boolean> {
  try {
    const res = await pool.request({ path: CHAT_PATH, method: 'POST', headers: HEADERS, body: CHAT_BODY });
    await res.body.dump({ limit: Infinity });
    return res.statusCode >= 200 && res.statusCode < 300;
  } catch {
    return false;
  }
}

export interface ThroughputResult extends Failures {
  rps: number;
  /** Answers inside the measuring window. */
  requests: number;
  /** Answers of the whole run, warm-up included: the divisor for CPU time sampled around the whole run. */
  allRequests: number;
}

/**
 * Closed loop: `connections` workers, each sending its next request as soon as the last one is answered.
 * Only answers that complete inside the measuring window count, so the warm-up's tail is not credited.
 */
export async function closedLoop(url: string, o: { connections: number; warmupMs: number; durationMs: number }): Promise<ThroughputResult> {
  const pool = newPool(url, o.connections);
  const start = performance.now();
  const measureFrom = start + o.warmupMs;
  const end = measureFrom + o.durationMs;
  let ok = 0;
  let errors = 0;
  let all = 0;
  const worker = async () => {
    while (performance.now() < end) {
      const good = await chat(pool);
      all++;
      const t = performance.now();
      if (t < measureFrom || t > end) continue;
      if (good) ok++;
      else errors++;
    }
  };
  await Promise.all(Array.from({ length: o.connections }, worker));
  await pool.close();
  return { rps: ok / (o.durationMs / 1000), requests: ok, allRequests: all, errors };
}

export interface LatencyResult extends Failures {
  p50Ms: number;
  p99Ms: number;
  samplesMs: number[];
  /** Largest lag of the scheduler behind the wall clock; large values mean the client, not the server, was late. */
  maxSendLagMs: number;
}

/**
 * Open loop: requests leave on a wall-clock schedule whether or not earlier ones were answered, so a slow server
 * cannot slow the arrivals down and hide its own queueing (coordinated omission). Latency runs from the
 * *scheduled* send time, as in wrk2: a late send caused by a busy client counts against both sides equally.
 */
export async function openLoop(url: string, o: { rate: number; connections: number; warmupMs: number; durationMs: number }): Promise<LatencyResult> {
  const pool = newPool(url, o.connections);
  const intervalMs = 1000 / o.rate;
  const total = Math.round(((o.warmupMs + o.durationMs) / 1000) * o.rate);
  const warmupCount = Math.round((o.warmupMs / 1000) * o.rate);
  const samples: number[] = [];
  const inflight: Promise<void>[] = [];
  let errors = 0;
  let maxSendLagMs = 0;
  const start = performance.now();
  let sent = 0;
  while (sent < total) {
    const now = performance.now();
    // Send every request whose time has come; a late tick catches up instead of dropping arrivals.
    while (sent < total && start + sent * intervalMs <= now) {
      const scheduled = start + sent * intervalMs;
      const measured = sent >= warmupCount;
      maxSendLagMs = Math.max(maxSendLagMs, now - scheduled);
      inflight.push(
        chat(pool).then((good) => {
          if (!measured) return;
          if (good) samples.push(performance.now() - scheduled);
          else errors++;
        }),
      );
      sent++;
    }
    // setTimeout(1) wakes about every millisecond: fine for a 2 ms interval, and unlike a busy loop it leaves
    // the CPU to the servers (the machine may have only 2 cores for 3 processes).
    await sleep(1);
  }
  await Promise.all(inflight);
  await pool.close();
  return { p50Ms: percentile(samples, 50), p99Ms: percentile(samples, 99), samplesMs: samples, errors, maxSendLagMs };
}

export interface TtftResult extends Failures {
  p50Ms: number;
  p99Ms: number;
  samplesMs: number[];
}

/** Whether one SSE `data:` payload carries text: the role-only first chunk has `content: ""` and does not count. */
function carriesContent(data: string): boolean {
  if (data === '[DONE]') return false;
  try {
    const chunk = JSON.parse(data) as { choices?: Array<{ delta?: { content?: unknown } }> };
    return chunk.choices?.some((c) => typeof c.delta?.content === 'string' && c.delta.content !== '') ?? false;
  } catch {
    return false;
  }
}

/** One stream; resolves the ms from sending to the first content event, or undefined if it never came. */
async function oneStream(pool: Pool): Promise<number | undefined> {
  const started = performance.now();
  let ttft: number | undefined;
  try {
    const res = await pool.request({ path: CHAT_PATH, method: 'POST', headers: HEADERS, body: STREAM_BODY });
    if (res.statusCode !== 200) {
      await res.body.dump({ limit: Infinity });
      return undefined;
    }
    let buffered = '';
    res.body.setEncoding('utf8');
    // Read the whole stream (the connection is reused for the next one), but stamp the first content event.
    for await (const chunk of res.body) {
      if (ttft !== undefined) continue;
      buffered += chunk as string;
      let cut: number;
      while (ttft === undefined && (cut = buffered.indexOf('\n\n')) !== -1) {
        const event = buffered.slice(0, cut);
        buffered = buffered.slice(cut + 2);
        for (const line of event.split('\n')) {
          if (line.startsWith('data:') && carriesContent(line.slice(5).trim())) ttft = performance.now() - started;
        }
      }
    }
    return ttft;
  } catch {
    return undefined;
  }
}

/** Streams, `parallel` at a time, until `count` have been measured after `warmup` unmeasured ones. */
export async function streamTtft(url: string, o: { count: number; warmup: number; parallel: number }): Promise<TtftResult> {
  const pool = newPool(url, o.parallel);
  const samples: number[] = [];
  let errors = 0;
  let next = 0;
  const worker = async () => {
    while (next < o.warmup + o.count) {
      const measured = next++ >= o.warmup;
      const ttft = await oneStream(pool);
      if (!measured) continue;
      if (ttft === undefined) errors++;
      else samples.push(ttft);
    }
  };
  await Promise.all(Array.from({ length: o.parallel }, worker));
  await pool.close();
  return { p50Ms: percentile(samples, 50), p99Ms: percentile(samples, 99), samplesMs: samples, errors };
}
