// The two neighbours. Online: open loop, requests leave on a wall-clock schedule whether or not earlier ones were
// answered, latency from the *scheduled* time (a stalled gateway cannot slow the arrivals and hide its queueing).
// Batch: closed loop, each client on its own keep-alive connection sends its next request when the last one ends, so
// 1000 requests stay in flight at the cost of one undici Pool, and the load generator stays light on a small machine.
// Plain undici, no SDK and no client retries: what is measured is what the gateway answered.
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { Pool } from 'undici';
import { seededRandom } from '../../src/policy/random.ts';
import { floodHeaders, TENANT_KEYS } from './settings.ts';

const PATH = '/v1/chat/completions';
const BODY = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });

/** ms since the epoch with sub-ms resolution: the same clock as the mock's per-second buckets and the gateway's log. */
export const epochMs = (): number => performance.timeOrigin + performance.now();

interface Answer {
  /** HTTP status; 0 when there was none (connection error, client timeout). */
  status: number;
  /** The OpenAI error code of a non-200 (`load_shed`, `rate_limit_exceeded`, ...), or the transport error's code. */
  code?: string;
  retryAfterMs?: number;
  shouldRetry: boolean;
  /** x-stormgate-attempts: upstream attempts the gateway made. */
  attempts?: number;
}

export interface OnlineRecord extends Answer {
  /** Sent as x-request-id (`online-<n>`), so the gateway's log line of the request can be found. */
  id: string;
  /** Scheduled send time, ms since the epoch. */
  at: number;
  /** From the scheduled send time to the whole answer; undefined when still pending after the drain. */
  latencyMs: number | undefined;
}

export interface BatchRecord extends Answer {
  /** When the answer was complete, ms since the epoch. */
  endAt: number;
  latencyMs: number;
}

async function send(pool: Pool, headers: Record<string, string>, timeoutMs: number): Promise<Answer> {
  try {
    const res = await pool.request({ path: PATH, method: 'POST', headers, body: BODY, headersTimeout: timeoutMs, bodyTimeout: timeoutMs });
    const attemptsHeader = res.headers['x-stormgate-attempts'];
    const attempts = typeof attemptsHeader === 'string' ? Number(attemptsHeader) : undefined;
    if (res.statusCode === 200) {
      await res.body.dump({ limit: Number.POSITIVE_INFINITY });
      return { status: 200, shouldRetry: false, ...(attempts !== undefined && { attempts }) };
    }
    const text = await res.body.text();
    let code: string | undefined;
    try {
      code = (JSON.parse(text) as { error?: { code?: string } }).error?.code ?? undefined;
    } catch {
      code = 'unparsable_body';
    }
    const ra = Number(res.headers['retry-after-ms']);
    return {
      status: res.statusCode,
      ...(code !== undefined && { code }),
      ...(Number.isFinite(ra) && ra >= 0 && { retryAfterMs: ra }),
      shouldRetry: res.headers['x-should-retry'] === 'true',
      ...(attempts !== undefined && { attempts }),
    };
  } catch (err) {
    return { status: 0, code: (err as { code?: string }).code ?? 'network', shouldRetry: false };
  }
}

interface OnlineOptions {
  url: string;
  rate: number;
  /** First scheduled arrival and the end of arrivals, ms since the epoch. */
  startAt: number;
  endAt: number;
  connections: number;
  timeoutMs: number;
  /** 'uniform': one request every 1/rate s (as wrk2). 'poisson': exponential gaps of mean 1/rate (seeded), as independent users arrive. */
  arrivals: 'uniform' | 'poisson';
}

interface OnlineResult {
  records: OnlineRecord[];
  /** Largest delay of a send behind its schedule: large values mean the load generator, not the gateway, was late. */
  maxSendLagMs: number;
}

/** Scheduled send times, ms since the epoch, in [startAt, endAt). */
function arrivalTimes(o: Pick<OnlineOptions, 'rate' | 'startAt' | 'endAt' | 'arrivals'>): number[] {
  const out: number[] = [];
  const meanMs = 1000 / o.rate;
  if (o.arrivals === 'uniform') {
    for (let at = o.startAt; at < o.endAt; at = o.startAt + out.length * meanMs) out.push(at);
    return out;
  }
  const random = seededRandom(20_240_601);
  for (let at = o.startAt; at < o.endAt; at += -Math.log(1 - random()) * meanMs) out.push(at);
  return out;
}

/** Starts the open loop; resolves when every request it sent has been answered (or given up on by the client). */
export async function onlineOpenLoop(o: OnlineOptions): Promise<OnlineResult> {
  const pool = new Pool(o.url, { connections: o.connections, pipelining: 1 });
  const headers = { 'content-type': 'application/json', authorization: `Bearer ${TENANT_KEYS.online}`, 'x-stormgate-timeout-ms': String(o.timeoutMs) };
  const schedule = arrivalTimes(o);
  const total = schedule.length;
  const records: OnlineRecord[] = [];
  const inflight: Array<Promise<void>> = [];
  let maxSendLagMs = 0;
  let sent = 0;
  await sleep(Math.max(0, o.startAt - epochMs()));
  while (sent < total) {
    const now = epochMs();
    // Every request whose time has come leaves now: a late tick catches up instead of dropping arrivals.
    while (sent < total && schedule[sent]! <= now) {
      const at = schedule[sent]!;
      maxSendLagMs = Math.max(maxSendLagMs, now - at);
      const rec: OnlineRecord = { id: `online-${sent}`, at, latencyMs: undefined, status: 0, shouldRetry: false };
      records.push(rec);
      inflight.push(
        send(pool, { ...headers, 'x-request-id': rec.id }, o.timeoutMs + 2_000).then((a) => {
          Object.assign(rec, a);
          rec.latencyMs = epochMs() - at;
        }),
      );
      sent++;
    }
    // A 1 ms timer: fine for a 6.7 ms mean interval, and it leaves the CPU to the gateway and the mock.
    await sleep(1);
  }
  await Promise.all(inflight);
  await pool.close();
  return { records, maxSendLagMs };
}

interface BatchOptions {
  url: string;
  clients: number;
  startAt: number;
  /** No client starts a request after this, ms since the epoch. */
  endAt: number;
  rampMs: number;
  timeoutMs: number;
  shedWaitCapMs: number;
  errorPauseMs: number;
}

interface BatchResult {
  records: BatchRecord[];
  /** Time clients spent waiting out load_shed retry-after hints, in total (ms). */
  shedWaitMs: number;
}

/** Closed loop: `clients` workers, each sending its next batch request when the last one ended, until `endAt`. */
export async function batchClosedLoop(o: BatchOptions): Promise<BatchResult> {
  const pool = new Pool(o.url, { connections: o.clients, pipelining: 1 });
  const headers = {
    'content-type': 'application/json',
    ...floodHeaders(),
    'x-stormgate-timeout-ms': String(o.timeoutMs),
  };
  const records: BatchRecord[] = [];
  let shedWaitMs = 0;
  const worker = async (i: number) => {
    await sleep(Math.max(0, o.startAt + (i * o.rampMs) / o.clients - epochMs()));
    while (epochMs() < o.endAt) {
      const t = performance.now();
      const a = await send(pool, headers, o.timeoutMs + 2_000);
      records.push({ ...a, endAt: epochMs(), latencyMs: performance.now() - t });
      if (a.status === 200) continue;
      // An SDK honours retry-after when the gateway says x-should-retry: true; any other failure gets a short pause.
      const hinted = a.shouldRetry && a.retryAfterMs !== undefined;
      const waitMs = Math.min(hinted ? Math.min(a.retryAfterMs!, o.shedWaitCapMs) : o.errorPauseMs, Math.max(0, o.endAt - epochMs()));
      if (hinted) shedWaitMs += waitMs;
      await sleep(waitMs);
    }
  };
  await Promise.all(Array.from({ length: o.clients }, (_, i) => worker(i)));
  await pool.close();
  return { records, shedWaitMs };
}
