// Open-loop user traffic made with the official openai SDK: logical requests arrive on a wall-clock schedule whether
// or not earlier ones failed, as users do. A closed loop would hide the storm: there, a retry takes the place of a new
// request instead of adding to it. Each logical request is one `chat.completions.create` call with a per-request
// timeout (the only way the JS SDK sends x-stainless-timeout), retried by the SDK itself or by a naive loop.
import { AsyncLocalStorage } from 'node:async_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { Agent, fetch as undiciFetch } from 'undici';

type ClientKind = 'sdk' | 'naive';

interface TrafficOptions {
  /** e.g. http://127.0.0.1:1234/v1 */
  baseURL: string;
  kind: ClientKind;
  rate: number;
  /** First arrival, ms since the epoch. */
  startAt: number;
  durationMs: number;
  timeoutMs: number;
  drainMs: number;
}

/** One user's request, from its scheduled arrival to its final answer, retries included. */
export interface Logical {
  /** Scheduled arrival, ms since the epoch (the same clock as the mock's per-second counts). */
  at: number;
  /** When the final answer or error reached the user; undefined when it was still pending after the drain. */
  endAt: number | undefined;
  ok: boolean;
  /** '200', the final HTTP status with its error code ('503 load_shed'), 'timeout' (the SDK gave up), 'network', 'unfinished'. */
  outcome: string;
  /** HTTP attempts the client made (the SDK's own retries included). */
  attempts: number;
  /** Attempts the client abandoned at its own deadline: no answer had come by then. */
  clientTimeouts: number;
}

export interface TrafficResult {
  requests: Logical[];
  /** Largest delay of a send behind its schedule: large values mean the load generator, not the server, was late. */
  maxSendLagMs: number;
  /** CPU the load generator's process used, as a share of one core, from the first arrival to the end of the drain. */
  cpuCores: number;
}

const BODY: OpenAI.ChatCompletionCreateParamsNonStreaming = { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] };
const NAIVE_ATTEMPTS = 4;
const NAIVE_WAIT_MS = 1_000;

export async function runTraffic(o: TrafficOptions): Promise<TrafficResult> {
  // Unlimited keep-alive connections, as Node's own fetch has; its own Agent so the run's sockets die with it.
  const agent = new Agent({ keepAliveTimeout: 10_000 });
  const stop = new AbortController();
  // Carries the logical request into the SDK's fetch calls, so the retries the SDK makes on its own count against it.
  const current = new AsyncLocalStorage<Logical>();
  const countingFetch = async (url: string | URL | Request, init?: RequestInit) => {
    const logical = current.getStore();
    if (logical) logical.attempts++;
    try {
      return await undiciFetch(url as string, { ...(init as object), dispatcher: agent });
    } catch (err) {
      // The SDK aborts an attempt's signal only when its timeout fires (or we stop the run).
      if (logical && init?.signal?.aborted && !stop.signal.aborted) logical.clientTimeouts++;
      throw err;
    }
  };
  const client = new OpenAI({
    baseURL: o.baseURL,
    apiKey: 'sk-bench',
    fetch: countingFetch as unknown as typeof fetch,
    logLevel: 'off',
    // The SDK's default (2 retries) for 'sdk'; the naive loop does its own.
    ...(o.kind === 'naive' && { maxRetries: 0 }),
  });
  // One signal per logical request, aborted when the drain ends: the SDK adds a listener to it on every attempt and
  // never removes it, so one signal shared by all would collect thousands.
  const live = new Set<AbortController>();
  stop.signal.addEventListener('abort', () => live.forEach((c) => c.abort()), { once: true });
  const once = (signal: AbortSignal) => client.chat.completions.create(BODY, { timeout: o.timeoutMs, signal });
  const naive = async (signal: AbortSignal) => {
    for (let i = 1; ; i++) {
      try {
        return await once(signal);
      } catch (err) {
        if (i === NAIVE_ATTEMPTS || signal.aborted) throw err;
        await sleep(NAIVE_WAIT_MS, undefined, { signal });
      }
    }
  };
  const call = (signal: AbortSignal) => (o.kind === 'sdk' ? once(signal) : naive(signal));
  const start = (logical: Logical) => {
    const ctl = new AbortController();
    live.add(ctl);
    return settle(logical, call(ctl.signal), stop.signal).finally(() => live.delete(ctl));
  };

  const requests: Logical[] = [];
  const pending: Promise<void>[] = [];
  const total = Math.round((o.durationMs / 1000) * o.rate);
  const intervalMs = 1000 / o.rate;
  let maxSendLagMs = 0;
  await sleep(Math.max(0, o.startAt - Date.now()));
  const cpuBefore = process.cpuUsage();
  for (let sent = 0; sent < total; ) {
    const now = Date.now();
    // Send every request whose time has come; a late tick catches up instead of dropping arrivals.
    while (sent < total && o.startAt + sent * intervalMs <= now) {
      const logical: Logical = { at: o.startAt + sent * intervalMs, endAt: undefined, ok: false, outcome: 'unfinished', attempts: 0, clientTimeouts: 0 };
      maxSendLagMs = Math.max(maxSendLagMs, now - logical.at);
      requests.push(logical);
      pending.push(current.run(logical, () => start(logical)));
      sent++;
    }
    await sleep(1);
  }
  const all = Promise.all(pending);
  const drained = new AbortController();
  await Promise.race([all, sleep(o.drainMs, undefined, { signal: drained.signal }).catch(() => undefined)]);
  drained.abort();
  stop.abort();
  await all;
  const cpu = process.cpuUsage(cpuBefore);
  const cpuCores = (cpu.user + cpu.system) / 1000 / (Date.now() - o.startAt);
  await agent.destroy();
  return { requests, maxSendLagMs, cpuCores };
}

async function settle(logical: Logical, answer: Promise<unknown>, stopped: AbortSignal): Promise<void> {
  try {
    await answer;
    logical.ok = true;
    logical.outcome = '200';
  } catch (err) {
    if (stopped.aborted) return;
    logical.outcome = outcomeOf(err);
  }
  logical.endAt = Date.now();
}

function outcomeOf(err: unknown): string {
  if (err instanceof OpenAI.APIConnectionTimeoutError) return 'timeout';
  if (err instanceof OpenAI.APIConnectionError) return 'network';
  // The status and the error code, when there is one: '503 load_shed' and '503' (the provider's) are different stories.
  if (err instanceof OpenAI.APIError && err.status !== undefined) return typeof err.code === 'string' ? `${err.status} ${err.code}` : String(err.status);
  return 'other';
}
