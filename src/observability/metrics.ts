// Every stormgate_* metric, in one file. Labels are bounded: route and target names come from the config,
// reasons and outcomes from fixed sets; never user ids or raw model strings from clients.
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

export interface Metrics {
  readonly registry: Registry;
  readonly requests: Counter<'route' | 'target' | 'priority' | 'outcome'>;
  readonly retriedRequests: Counter<'route' | 'result'>;
  readonly fallbackRequests: Counter<'route'>;
  readonly clientRetries: Counter<'route' | 'how'>;
  readonly clientLimited: Counter<'client' | 'by'>;
  readonly retrySuccessRate: Gauge<'route'>;
  readonly fallbackRate: Gauge<'route'>;
  readonly tokens: Counter<'route' | 'target' | 'kind'>;
  readonly budgetRemaining: Gauge<'route'>;
  readonly upstreamAttempts: Counter<'target' | 'status_class'>;
  readonly retries: Counter<'route' | 'target' | 'reason'>;
  readonly requestDuration: Histogram<'route' | 'attempt'>;
  readonly ttft: Histogram<'route'>;
  readonly streamEnds: Counter<'route' | 'end'>;
  readonly budgetExhausted: Counter<'route' | 'target'>;
  readonly parked: Gauge<'route'>;
  readonly parkOutcomes: Counter<'route' | 'outcome'>;
  readonly breakerState: Gauge<'target'>;
  readonly breakerTransitions: Counter<'target' | 'to'>;
  readonly credentialsHeld: Gauge<'target'>;
  readonly holdsStarted: Counter<'target' | 'kind' | 'tier' | 'reason'>;
  readonly holdRemaining: Gauge<'target' | 'kind' | 'tier'>;
  readonly stateDegraded: Gauge;
  readonly poolInUse: Gauge<'provider' | 'priority'>;
  readonly poolQueueDepth: Gauge<'provider' | 'priority'>;
  readonly poolClientInUse: Gauge<'provider' | 'priority' | 'client'>;
  readonly poolClientQueueDepth: Gauge<'provider' | 'priority' | 'client'>;
  readonly poolWait: Histogram<'provider' | 'priority'>;
  readonly poolLimit: Gauge<'target'>;
  readonly waitingBodyBytes: Gauge;
  readonly shed: Counter<'priority' | 'reason'>;
  readonly fallbacks: Counter<'route' | 'from' | 'to' | 'reason'>;
  readonly degraded: Counter<'route' | 'reason'>;
  readonly passthroughRequests: Counter<'path' | 'status_class'>;
  /** Fill gauges at scrape time; set by whoever owns the numbers (scrape-gauges.ts, RequestRecorder). */
  collectPools: () => void;
  collectBreakers: () => void;
  collectCredentials: () => void;
  collectHolds: () => void;
  collectRates: () => void;
  collectBudgets: () => Promise<void> | void;
}

export function createMetrics(opts: { defaultMetrics?: boolean } = {}): Metrics {
  const registry = new Registry();
  // Replaced by the runtime; the gauges below call it through `metrics`, which exists by the time anyone scrapes.
  let metrics: Metrics;
  if (opts.defaultMetrics ?? true) collectDefaultMetrics({ register: registry });
  const registers = [registry];
  metrics = {
    collectPools: () => {},
    collectBreakers: () => {},
    collectCredentials: () => {},
    collectHolds: () => {},
    collectRates: () => {},
    collectBudgets: () => {},
    registry,
    requests: new Counter({
      name: 'stormgate_requests_total',
      help: 'Client requests answered, by route, the target that answered (or failed last), priority class and outcome (invalid_request: a verdict on the client\'s own request, a provider\'s 400 or 422 say; upstream_error: the provider\'s failure passed on).',
      labelNames: ['route', 'target', 'priority', 'outcome'] as const,
      registers,
    }),
    retriedRequests: new Counter({
      name: 'stormgate_retried_requests_total',
      help: 'Client requests that needed more than one attempt, by route and whether they finally succeeded (result: success|failure).',
      labelNames: ['route', 'result'] as const,
      registers,
    }),
    fallbackRequests: new Counter({
      name: 'stormgate_fallback_requests_total',
      help: 'Client requests answered by a fallback target, by route.',
      labelNames: ['route'] as const,
      registers,
    }),
    clientRetries: new Counter({
      name: 'stormgate_client_retries_total',
      help: 'Requests that are a client\'s own retry, by route and how the gateway knew: declared (x-stainless-retry-count above 0, the openai and Anthropic SDKs; the retry budget counts it as a retry) or repeat (the same body from the same client soon after this instance failed it: a client retrying without saying so; counted as a retry by the budget only with budget.repeats.countAsRetries).',
      labelNames: ['route', 'how'] as const,
      registers,
    }),
    clientLimited: new Counter({
      name: 'stormgate_client_limited_total',
      help: 'Requests refused 429 client_rate_limited because their client was past its rate (auth.limits), by client name and the rate that refused (requests or tokens); these are also in stormgate_requests_total{outcome="rejected"} when on a managed path or one no route serves.',
      labelNames: ['client', 'by'] as const,
      registers,
    }),
    retrySuccessRate: new Gauge({
      name: 'stormgate_retry_success_rate',
      help: 'Share of retried requests that finally succeeded, over this instance\'s last 60 s (fleet figure: the recording rule stormgate:retry_success:ratio_rate5m).',
      labelNames: ['route'] as const,
      registers,
      collect: () => metrics.collectRates(),
    }),
    fallbackRate: new Gauge({
      name: 'stormgate_fallback_rate',
      help: 'Share of requests answered by a fallback target, over this instance\'s last 60 s (fleet figure: the recording rule stormgate:fallback:ratio_rate5m).',
      labelNames: ['route'] as const,
      registers,
      // Its own read too: filled only by the retry rate's, it was as old as that gauge's last read.
      collect: () => metrics.collectRates(),
    }),
    tokens: new Counter({
      name: 'stormgate_tokens_total',
      help: 'Tokens in the answers\' usage, by route, the target that answered, and kind (prompt|completion).',
      labelNames: ['route', 'target', 'kind'] as const,
      registers,
    }),
    budgetRemaining: new Gauge({
      name: 'stormgate_retry_budget_remaining',
      help: 'Retries the route\'s budgets still allow in their current window, summed over every budget (priority class and target) of the route this instance has served.',
      labelNames: ['route'] as const,
      registers,
      collect: () => metrics.collectBudgets(),
    }),
    upstreamAttempts: new Counter({
      name: 'stormgate_upstream_attempts_total',
      help: 'Requests sent upstream, by target and status class (2xx, 3xx: a redirect, 4xx, 5xx, network, timeout, aborted, internal: a request undici refused to send, bad_stream: a 2xx that was not the answer or a stream broken before its first output).',
      labelNames: ['target', 'status_class'] as const,
      registers,
    }),
    retries: new Counter({
      name: 'stormgate_retry_count_total',
      help: 'Retries the gateway made, by route, target and the reason of the failed attempt.',
      labelNames: ['route', 'target', 'reason'] as const,
      registers,
    }),
    requestDuration: new Histogram({
      name: 'stormgate_request_duration_seconds',
      help: 'Time from a request arriving to its answer ending (a stream: its last event; a client that left: its leaving), by whether it needed more than one attempt. Replays of an idempotency key\'s answer are out.',
      labelNames: ['route', 'attempt'] as const,
      // Past the default deadline (120 s): a started stream is bound by no deadline (only idleMs between its events),
      // and a long generation runs for minutes; ending at 120, a p95 of 5-minute streams read 120 s.
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800],
      registers,
    }),
    ttft: new Histogram({
      name: 'stormgate_ttft_seconds',
      help: 'Time from a streamed request arriving to its first output event (retries and waits included; a stream started early at the client\'s deadline once its output comes).',
      labelNames: ['route'] as const,
      // Past the default deadline (120 s), to a route's longer one (a reasoning model's, minutes): a first token behind a
      // queue comes late, and past the last bucket a quantile reads as it.
      buckets: [0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600],
      registers,
    }),
    streamEnds: new Counter({
      name: 'stormgate_stream_ends_total',
      help: 'How streamed answers ended: complete, done-added, cut, stalled, upstream-error, client-gone, client-stalled, recovered, shutdown.',
      labelNames: ['route', 'end'] as const,
      registers,
    }),
    budgetExhausted: new Counter({
      name: 'stormgate_retry_budget_exhausted_total',
      help: 'Retries the retry budget refused, by route and target.',
      labelNames: ['route', 'target'] as const,
      registers,
    }),
    parked: new Gauge({
      name: 'stormgate_parked_requests',
      help: 'Requests waiting for an unavailable target, by route.',
      labelNames: ['route'] as const,
      registers,
    }),
    parkOutcomes: new Counter({
      name: 'stormgate_park_outcomes_total',
      help: 'How parked requests left the queue: released, full (rejected), timeout, aborted (deadline or client), closing.',
      labelNames: ['route', 'outcome'] as const,
      registers,
    }),
    breakerState: new Gauge({
      name: 'stormgate_breaker_state',
      help: 'Circuit breaker state by target: 0 closed, 1 open, 2 half-open.',
      labelNames: ['target'] as const,
      registers,
      collect: () => metrics.collectBreakers(),
    }),
    breakerTransitions: new Counter({
      name: 'stormgate_breaker_transitions_total',
      help: 'Breaker transitions this instance made, by target and new state.',
      labelNames: ['target', 'to'] as const,
      registers,
    }),
    credentialsHeld: new Gauge({
      name: 'stormgate_credentials_held',
      help: 'Credential hold by target: 1 while the provider refused the gateway\'s own key (401, 402, 403, 429 insufficient_quota) and requests skip the target for authHoldS, else 0.',
      labelNames: ['target'] as const,
      registers,
      collect: () => metrics.collectCredentials(),
    }),
    holdsStarted: new Counter({
      name: 'stormgate_holds_started_total',
      help: 'Holds started (not extended) on a target, each counted once fleet-wide by the instance whose answer started it, by target, kind (hold_off: the provider asked for a pause with retry-after on a 429, 503 or 529, or a 498 on the flex tier; credentials: it refused the gateway\'s own key or billing), tier (all: every request to the target; flex: only those of the flex service tier) and reason (the answer\'s: status_429, status_503, status_529, status_498 for a hold-off; status_401, status_402, status_403, unsupported_country_region_territory, insufficient_quota, billing_not_active, access_terminated, account_refused_in_stream for a credential hold).',
      labelNames: ['target', 'kind', 'tier', 'reason'] as const,
      registers,
    }),
    holdRemaining: new Gauge({
      name: 'stormgate_hold_remaining_seconds',
      help: 'Seconds left of the hold in force on a target as this instance knows it (its own and, with Redis, the fleet\'s), by target, kind (hold_off, credentials) and tier (all: every request to the target; flex: the flex service tier\'s own hold-off, present only while one is in force); 0 when none.',
      labelNames: ['target', 'kind', 'tier'] as const,
      registers,
      collect: () => metrics.collectHolds(),
    }),
    stateDegraded: new Gauge({
      name: 'stormgate_state_degraded',
      help: '1 while the shared state store (Redis) cannot be reached and local state stands in, else 0.',
      registers,
    }),
    poolInUse: new Gauge({
      name: 'stormgate_pool_in_use',
      help: 'Attempts in flight in a provider\'s pool, by priority class.',
      labelNames: ['provider', 'priority'] as const,
      registers,
      collect: () => metrics.collectPools(),
    }),
    poolQueueDepth: new Gauge({
      name: 'stormgate_pool_queue_depth',
      help: 'Requests waiting for a slot in a provider\'s pool, by priority class.',
      labelNames: ['provider', 'priority'] as const,
      registers,
    }),
    // Which tenant holds a class's slots, and who waits: the fair share between clients, seen. A series per client key
    // (auth.keys: the label is bounded by the config) and class.
    poolClientInUse: new Gauge({
      name: 'stormgate_pool_client_in_use',
      help: 'Attempts in flight in a provider\'s pool, by priority class and client (auth.keys).',
      labelNames: ['provider', 'priority', 'client'] as const,
      registers,
    }),
    poolClientQueueDepth: new Gauge({
      name: 'stormgate_pool_client_queue_depth',
      help: 'Requests waiting for a slot in a provider\'s pool, by priority class and client (auth.keys).',
      labelNames: ['provider', 'priority', 'client'] as const,
      registers,
    }),
    poolWait: new Histogram({
      name: 'stormgate_pool_wait_seconds',
      help: 'Time requests waited for a pool slot, by provider and priority class.',
      labelNames: ['provider', 'priority'] as const,
      // Past the default deadline (120 s), to a route's longer one: ending at 30, a p95 of waits of 60 to 100 s read 30 s.
      buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600],
      registers,
    }),
    poolLimit: new Gauge({
      name: 'stormgate_pool_limit',
      help: 'The adaptive concurrency limit of a target (provider and model; with the route, for a route on a path with no known API).',
      labelNames: ['target'] as const,
      registers,
    }),
    waitingBodyBytes: new Gauge({
      name: 'stormgate_waiting_body_bytes',
      help: 'Bytes of request bodies held by requests waiting for a pool slot, parked, or repeating a running idempotency key (bounded by server.maxWaitingBodyBytes).',
      registers,
    }),
    fallbacks: new Counter({
      name: 'stormgate_fallbacks_total',
      help: 'Requests handed from one target to the next, by route, from, to and reason.',
      labelNames: ['route', 'from', 'to', 'reason'] as const,
      registers,
    }),
    degraded: new Counter({
      name: 'stormgate_degraded_total',
      help: 'Requests answered with the route\'s degraded answer, by route and reason.',
      labelNames: ['route', 'reason'] as const,
      registers,
    }),
    passthroughRequests: new Counter({
      name: 'stormgate_passthrough_requests_total',
      help: 'Requests on passthrough paths, by the configured path they fell under and the class of their answer (client_gone: the client left before any).',
      labelNames: ['path', 'status_class'] as const,
      registers,
    }),
    shed: new Counter({
      name: 'stormgate_shed_total',
      help: 'Requests shed by a pool (its class queue full, the bodies of waiting requests at server.maxWaitingBodyBytes, or no slot expected before the deadline, or none within the route\'s park.maxWaitMs), by priority and reason.',
      labelNames: ['priority', 'reason'] as const,
      registers,
    }),
  };
  return metrics;
}
