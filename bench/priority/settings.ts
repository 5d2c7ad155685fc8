// Everything a reader needs to know about the noisy-neighbour run in one file: the provider (mock faults), the load
// (online rate, batch clients), the timeline and its windows, the targets, and the gateway's config.
import type { FaultSpec } from '../../src/mock/server.ts';

/** Mutable only so that `--quick` can shorten the timeline for a smoke test. */
export const SETTINGS = {
  /**
   * The provider: 200 ms per answer, at most 100 in flight; beyond that, 429 rate_limit_exceeded at once.
   * `--latency-jitter-ms N` adds a uniform 0..N ms to each answer (a less steady provider).
   */
  faults: { latencyMs: 200, capacity: 100 } as FaultSpec & { latencyMs: number; capacity: number },
  /** capacity / mean latency: what the provider can answer per second, all classes together. */
  capacityRps: 100 / 0.2,
  /** The gateway's pool: ABOVE the provider's real capacity, so the adaptive limit has to find it from the 429s. */
  maxConcurrent: 120,
  maxConnections: 128,
  online: {
    /** 30% of the capacity: ~30 in flight at 200 ms. Open loop: arrivals on a wall-clock schedule. */
    rate: 150,
    /** Evenly spaced by default; `--poisson` sends them with exponential gaps (same mean), as independent users arrive. */
    arrivals: 'uniform' as 'uniform' | 'poisson',
    /** Client connections (keep-alive, one request each at a time); far more than the ~30 in flight, so the client never queues. */
    connections: 200,
    /** Sent as x-stormgate-timeout-ms; the client itself gives up 2 s later. */
    timeoutMs: 10_000,
  },
  batch: {
    /** Closed-loop clients, each on its own keep-alive connection: ten times the provider's capacity in flight. */
    clients: 1_000,
    /** The clients start one after another over this time (1000 connects at once would overflow the listen backlog). */
    rampMs: 1_000,
    /** Sent as x-stormgate-timeout-ms: a batch job can wait. */
    timeoutMs: 30_000,
    /** After a `load_shed` answer with x-should-retry: true, a client waits retry-after-ms (at most this long), as an SDK would. */
    shedWaitCapMs: 5_000,
    /** After any other failure, a client pauses this long before its next request, so a failing gateway is not hammered in a tight loop. */
    errorPauseMs: 100,
  },
  timeline: {
    /** Online runs at its rate this long before the baseline starts, unmeasured: JIT, connections, round-trip estimates. */
    onlineWarmupMs: 5_000,
    /** Online alone. */
    baselineMs: 20_000,
    /** Online plus the batch flood; online keeps its schedule throughout. */
    floodMs: 50_000,
    /** Batch throughput is averaged over the flood's last `batchWindowMs`. */
    batchWindowMs: 30_000,
    /** The provider's 429 share is taken over the flood's last `convergedWindowMs` ("after convergence"). */
    convergedWindowMs: 20_000,
  },
  targets: {
    onlineSuccess: 0.999,
    /** Online p99 with the flood <= p99Factor x p99 without it + p99AddMs. */
    p99Factor: 1.2,
    p99AddMs: 20,
    /** Batch throughput >= this share of (capacity - online rate). */
    batchShare: 0.8,
    /** Upstream answers that are 429, after convergence. */
    upstream429: 0.01,
  },
  retry: { maxAttempts: 3, backoff: { strategy: 'full-jitter' as const, baseMs: 25, capMs: 250 } },
  /**
   * `--tenants`: the flood is another tenant's, in online's own class (no x-stormgate-priority), each tenant with its
   * client key: the fair share between a class's clients, not the classes, keeps online fast.
   */
  tenants: false,
  metricsEveryMs: 1_000,
};

/** The keys online and batch traffic send (checked only with `--tenants`, where they are the tenants' client keys). */
export const TENANT_KEYS = { online: 'sk-tenant-online', batch: 'sk-tenant-flood' };

/** The headers of the flood's requests: the batch class, or with `--tenants` another tenant in online's class. */
export function floodHeaders(): Record<string, string> {
  return SETTINGS.tenants ? { authorization: `Bearer ${TENANT_KEYS.batch}` } : { authorization: `Bearer ${TENANT_KEYS.batch}`, 'x-stormgate-priority': 'batch' };
}

/**
 * The gateway's config: the mock as its one provider with the default priority classes (online minShare 0.5, batch
 * minShare 0.1), maxConcurrent above the provider's capacity, one chat route whose priority is the default (online);
 * batch requests lower themselves with x-stormgate-priority. Retries with a small backoff, the default retry budget,
 * the default breaker (429s do not count as failures, so it stays out of this run).
 */
export function gatewayConfig(port: number, mockUrl: string): string {
  const r = SETTINGS.retry;
  const auth = SETTINGS.tenants ? `auth: { keys: { online: ${TENANT_KEYS.online}, flood: ${TENANT_KEYS.batch} } }\n` : '';
  return `# Written by bench/priority.ts for one run; overwritten by the next.
server: { host: 127.0.0.1, port: ${port}, logLevel: info }
providers:
  mock:
    family: openai
    baseUrl: "${mockUrl}/v1"
    apiKey: sk-bench
    maxConnections: ${SETTINGS.maxConnections}
    pools:
      maxConcurrent: ${SETTINGS.maxConcurrent}
      classes:
        online: { minShare: 0.5, maxQueue: 1000 }
        batch: { minShare: 0.1, maxQueue: 10000 }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: mock } ]
    retry:
      maxAttempts: ${r.maxAttempts}
      backoff: { strategy: ${r.backoff.strategy}, baseMs: ${r.backoff.baseMs}, capMs: ${r.backoff.capMs} }
# The bench stops the gateway with SIGTERM: no load balancer to wait for, so no pre-stop pause.
drain: { preStopMs: 0, graceMs: 2000 }
${auth}`;
}
