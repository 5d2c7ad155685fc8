// The pipeline reports events; this turns them into metrics. It never reaches inside the pipeline.
import type { AttemptResult } from '../pipeline/attempt.ts';
import type { PipelineDeps, RequestSummary } from '../pipeline/handle-request.ts';
import type { Counter, Gauge } from 'prom-client';
import { sharedKey, type TargetKeys } from '../routing/target-keys.ts';
import type { Metrics } from './metrics.ts';
import { RateWindow } from './rate-window.ts';

/** Every value of the status_class label: the HTTP classes an API answers with, and the ways an attempt fails without one. */
export const STATUS_CLASSES = ['2xx', '3xx', '4xx', '5xx', 'bad_stream', 'timeout', 'network', 'aborted', 'internal'] as const;

function statusClass(result: AttemptResult): string {
  const o = result.outcome;
  switch (o.kind) {
    case 'ok':
    case 'http':
      return `${Math.floor(o.status / 100)}xx`;
    case 'bad-stream':
      return 'bad_stream';
    default:
      return o.kind;
  }
}

export function metricsObserver(m: Metrics): Pick<PipelineDeps, 'onAttempt' | 'onRetry' | 'onStreamEnd' | 'onBudgetExhausted' | 'onFallback' | 'onDegraded'> {
  return {
    onAttempt: (_route, target, result) => m.upstreamAttempts.inc({ target, status_class: statusClass(result) }),
    onRetry: (route, target, reason) => m.retries.inc({ route, target, reason }),
    onStreamEnd: (route, end) => m.streamEnds.inc({ route, end: end.kind }),
    onBudgetExhausted: (route, target) => m.budgetExhausted.inc({ route, target }),
    onFallback: (route, from, to, reason) => m.fallbacks.inc({ route, from, to, reason }),
    onDegraded: (route, reason) => m.degraded.inc({ route, reason }),
  };
}

/**
 * Removes every series labelled with a target key that was given back (a made-up model name the provider answered
 * 404), so such names cannot grow the label sets without bound.
 */
export async function forgetTargetSeries(m: Metrics, target: string): Promise<void> {
  const metrics: Array<Counter<string> | Gauge<string>> = [m.requests, m.upstreamAttempts, m.tokens, m.budgetExhausted, m.retries, m.fallbacks, m.poolLimit, m.breakerState, m.breakerTransitions, m.credentialsHeld, m.holdsStarted, m.holdRemaining];
  for (const metric of metrics) {
    const { values } = await metric.get();
    for (const { labels } of values) {
      const l = labels as Record<string, string | number | undefined>;
      if (l.target === target || l.from === target || l.to === target) metric.remove(l);
    }
  }
}

/**
 * The key a target is counted under now: its own while its model holds a place (configured, or learned and not given
 * back), else its provider's shared `<provider>/other` (RequestRecorder's `labelOf`).
 */
export function keptTargetLabel(keys: Pick<TargetKeys, 'givenBack'>): (target: string) => string {
  return (target) => {
    const slash = target.indexOf('/');
    if (slash < 0) return target;
    const provider = target.slice(0, slash);
    return keys.givenBack(provider, target.slice(slash + 1), target) ? sharedKey(provider) : target;
  };
}

/** The outcome of a request on a managed path answered before the pipeline took it (its count's and its log line's). */
export type RejectedOutcome = 'rejected' | 'gateway_error' | 'deadline' | 'client_gone';

/**
 * The labels of a request on a managed path answered before any route took it (invalid or oversized body, no usable
 * model, a bad timeout header, no client key, a draining instance): no route, target or priority served it.
 */
export const REJECTED_LABELS = { route: 'none', target: 'none', priority: 'none', outcome: 'rejected' } as const;

/** Records each client request once its answer is complete (a stream: once it ended), and keeps the rate window. */
export class RequestRecorder {
  readonly #window: RateWindow;

  /**
   * `labelOf`: the key a request's target is counted under now. A request counted as it ends (a stream: at its last
   * event) may end after its made-up model name was given back (its twin's 404 came while it streamed): counted under
   * the name, it made the series forgetTargetSeries had just removed again, for good; under `<provider>/other` it is
   * counted once all the same. Defaults to the key as it is.
   */
  constructor(
    private readonly m: Metrics,
    now: () => number,
    private readonly labelOf: (target: string) => string = (target) => target,
  ) {
    this.#window = new RateWindow(60, now);
    m.collectRates = () => {
      for (const route of this.#window.routes()) {
        const r = this.#window.rates(route);
        // Nothing to divide in the last 60 s: no value, rather than the last one standing forever.
        if (r.retrySuccess !== undefined) m.retrySuccessRate.set({ route }, r.retrySuccess);
        else m.retrySuccessRate.remove({ route });
        if (r.fallback !== undefined) m.fallbackRate.set({ route }, r.fallback);
        else m.fallbackRate.remove({ route });
      }
    };
  }

  /**
   * A request on a managed path answered without the pipeline's answer (a 4xx, or a 503 while draining: `rejected`;
   * a 500 from a bug in the gateway: `gateway_error`; a deadline that passed while the body was still arriving:
   * `deadline`; a client that left before the pipeline took it, a repeat waiting for its key's run: `client_gone`):
   * counted, so the request count is every request a client sent, but out of the rate window and the histograms,
   * which are the pipeline's.
   */
  rejected(outcome: RejectedOutcome = 'rejected'): void {
    this.m.requests.inc({ ...REJECTED_LABELS, outcome });
  }

  record(s: RequestSummary, durationS: number): void {
    const { m } = this;
    const route = s.route;
    // A replay names the key of the run it repeats, which may be another instance's (never learned here): as it is.
    const target = s.target === undefined ? 'none' : s.outcome === 'replayed' ? s.target : this.labelOf(s.target);
    m.requests.inc({ route, target, priority: s.priority ?? 'none', outcome: s.outcome });
    const retried = s.attempts.length > 1;
    const ok = s.outcome === 'success';
    // A replay (an idempotency key's answer sent again, at once or after waiting for the run) is not a request the
    // route served: no attempt of its own, so out of the first-attempt latency, which it would pull down.
    if (s.outcome !== 'replayed') m.requestDuration.observe({ route, attempt: retried ? 'retry' : 'first' }, durationS);
    // A client that left is neither a retry's success nor its failure: out of the counter, as out of the gauge below.
    if (retried && s.outcome !== 'client_gone') m.retriedRequests.inc({ route, result: ok ? 'success' : 'failure' });
    if (ok && s.fallback) m.fallbackRequests.inc({ route });
    if (s.clientRetry) m.clientRetries.inc({ route, how: s.clientRetry });
    if (s.ttftMs !== undefined) m.ttft.observe({ route }, s.ttftMs / 1000);
    const continuation = s.continuationUsage && { target: this.labelOf(s.continuationUsage.target), usage: s.continuationUsage.usage };
    for (const [billed, usage] of [[target, s.usage], [continuation?.target, continuation?.usage]] as const) {
      if (billed === undefined || usage === undefined) continue;
      m.tokens.inc({ route, target: billed, kind: 'prompt' }, usage.prompt);
      m.tokens.inc({ route, target: billed, kind: 'completion' }, usage.completion);
    }
    // Nor out of its rates.
    if (s.outcome !== 'client_gone' && s.outcome !== 'replayed') this.#window.record(route, { retried, ok, fallback: ok && s.fallback !== undefined });
  }
}
