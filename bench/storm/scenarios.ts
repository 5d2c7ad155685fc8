// The incidents the storm bench replays, and the ways each is run. Everything a reader needs to know about
// the load (rate, phases, client timeout) and the provider (faults, brownout) is in this one file.
import type { FaultSpec } from '../../src/mock/server.ts';

/** How the clients reach the provider and retry. */
export type Mode = 'direct-sdk' | 'direct-naive' | 'gateway' | 'gateway-rate';

/** The ways a scenario is run unless it names its own. */
export const MODES: readonly Mode[] = ['direct-sdk', 'direct-naive', 'gateway'];

export const MODE_LABELS: Record<Mode, string> = {
  'direct-sdk': 'direct, SDK retries (maxRetries 2)',
  'direct-naive': 'direct, naive 1 s retries (4 attempts)',
  gateway: 'through stormgate, SDK retries',
  'gateway-rate': 'through stormgate, pools.requestsPerMinute',
};

export interface Scenario {
  name: string;
  title: string;
  /** Logical requests per second, arriving on a wall-clock schedule (open loop) whatever happened to earlier ones. */
  rate: number;
  steadyMs: number;
  brownoutMs: number;
  recoveryMs: number;
  brownoutMode: '503' | 'hang';
  /** Per-request SDK timeout: sent as x-stainless-timeout, so the gateway learns the client's deadline. */
  clientTimeoutMs: number;
  faults: FaultSpec;
  /** After the last arrival, how long to wait for answers before giving up on the rest (counted as unfinished). */
  drainMs: number;
  /** The ways it is run. Default: MODES. */
  modes?: readonly Mode[];
  /** The provider's pools.requestsPerMinute in the gateway-rate mode. */
  gatewayRequestsPerMinute?: number;
}

export const modesOf = (s: Scenario): readonly Mode[] => s.modes ?? MODES;

/**
 * Scenario 1: a 15 s brownout of 503s (without retry-after, as the mock sends them) under steady traffic. The
 * provider's capacity (400 concurrent at 200 ms, so 2000 requests/s) is far above the 200 requests/s users send,
 * so it can absorb the retries: what the bench shows is how much traffic the retries add, not a collapse.
 */
export const BROWNOUT_503: Scenario = {
  name: 'brownout-503',
  title: 'Scenario 1: 15 s brownout (every request answered 503)',
  rate: 200,
  steadyMs: 10_000,
  brownoutMs: 15_000,
  recoveryMs: 20_000,
  brownoutMode: '503',
  clientTimeoutMs: 20_000,
  faults: { latencyMs: 200, capacity: 400 },
  drainMs: 30_000,
};

/**
 * Scenario 2: the provider stops answering for 15 s (requests hang) and clients time out at 5 s. Latency grows with
 * the provider's concurrency (2 ms per request in flight: 200 requests/s settle at about 70 in flight and 330 ms),
 * and abandoned requests keep their slot for the latency they were given (holdAbandoned), as a real provider keeps
 * working on them. The capacity (1500 in flight) is well above what 200 requests/s need, and below what the hung
 * attempts, their retries and the retries of the 429s add up to when the provider comes back.
 */
export const HANG: Scenario = {
  name: 'hang',
  title: 'Scenario 2: 15 s hang (no answer), clients time out at 5 s',
  rate: 200,
  steadyMs: 10_000,
  brownoutMs: 15_000,
  recoveryMs: 20_000,
  brownoutMode: 'hang',
  clientTimeoutMs: 5_000,
  faults: { latencyMs: 200, latencyPerInflightMs: 2, capacity: 1500, holdAbandoned: true },
  drainMs: 25_000,
};

/**
 * Scenario 3: scenario 1's brownout in front of a provider whose limit is a rate, as OpenAI's are: 24,000 requests per
 * minute (400 a second, twice what users send), enforced over a second (burstSeconds: 1, as OpenAI may enforce a
 * minute's limit over shorter spans), its 429s without retry-after, as OpenAI's are. The backlog the brownout leaves
 * (retries, parked requests) meets the rate at recovery. Run a fourth way too: through the gateway with
 * pools.requestsPerMinute 5% under the provider's limit, so the pool paces what it sends.
 */
export const RATE_LIMIT: Scenario = {
  ...BROWNOUT_503,
  name: 'rate-limit',
  title: 'Scenario 3: 15 s brownout in front of a 24,000 requests/min rate limit',
  faults: { ...BROWNOUT_503.faults, rateLimit: { requestsPerMinute: 24_000, burstSeconds: 1 } },
  modes: [...MODES, 'gateway-rate'],
  gatewayRequestsPerMinute: 22_800,
};

/** The route's minAttemptMs (the gateway's default, not set in the config): no attempt may start with less left. */
export const MIN_ATTEMPT_MS = 1000;

/** The gateway's config for both scenarios: the mock as its one provider, a short breaker, parking on (its default). */
export function gatewayConfig(port: number, mockUrl: string, logLevel: 'info' | 'warn', requestsPerMinute?: number): string {
  return `# Written by bench/storm.ts for one run; overwritten by the next.
server: { host: 127.0.0.1, port: ${port}, logLevel: ${logLevel} }
providers:
  mock:
    family: openai
    baseUrl: "${mockUrl}/v1"
    apiKey: sk-bench
    breaker: { openS: 5 }${requestsPerMinute === undefined ? '' : `\n    pools: { requestsPerMinute: ${requestsPerMinute} }`}
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: mock } ]
`;
}
