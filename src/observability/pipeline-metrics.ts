// The pipeline reports events; this turns them into metrics. It never reaches inside the pipeline.
import type { AttemptResult } from '../pipeline/attempt.ts';
import type { PipelineDeps, RequestSummary } from '../pipeline/handle-request.ts';
import type { Metrics } from './metrics.ts';

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

/** One client request, once its answer is complete (for streams: once the stream ended). */
export function recordRequest(m: Metrics, s: RequestSummary, durationS: number): void {
  const route = s.route;
  m.requests.inc({ route, target: s.target ?? 'none', outcome: s.outcome });
  const retried = s.attempts.length > 1;
  m.requestDuration.observe({ route, attempt: retried ? 'retry' : 'first' }, durationS);
  if (s.ttftMs !== undefined) m.ttft.observe({ route }, s.ttftMs / 1000);
}
