// The per-instance rate gauges cover the last 60 s: with nothing to divide in that time they have no value, rather
// than the last one standing forever.
import { describe, expect, it } from 'vitest';
import { createMetrics } from '../src/observability/metrics.ts';
import { RequestRecorder } from '../src/observability/pipeline-metrics.ts';
import type { RequestSummary } from '../src/pipeline/handle-request.ts';

const retried: RequestSummary = {
  route: 'chat',
  target: 'p/m',
  outcome: 'success',
  attempts: [
    { target: 'p/m', attempt: 0, reason: 'status_503', status: 503, waitMs: 0, durationMs: 5 },
    { target: 'b/m', attempt: 0, reason: 'ok', status: 200, waitMs: 10, durationMs: 5 },
  ],
  budgetMs: 1000,
  deadlineSource: 'route',
  fallback: 'retries_exhausted',
  skipped: [],
};

describe('the rate gauges', () => {
  it('show the last 60 s, and nothing once that window is empty', async () => {
    let now = 1_000_000;
    const m = createMetrics({ defaultMetrics: false });
    new RequestRecorder(m, () => now).record(retried, 0.02);
    const text = () => m.registry.metrics();
    expect(await text()).toMatch(/stormgate_retry_success_rate\{route="chat"\} 1/);
    expect(await text()).toMatch(/stormgate_fallback_rate\{route="chat"\} 1/);
    now += 61_000;
    expect(await text()).not.toMatch(/stormgate_retry_success_rate\{/);
    expect(await text()).not.toMatch(/stormgate_fallback_rate\{/);
  });

  it('each read on its own (a registry asked for one metric) is up to date, not only after the other was read', async () => {
    let now = 1_000_000;
    const m = createMetrics({ defaultMetrics: false });
    new RequestRecorder(m, () => now).record(retried, 0.02);
    expect(await m.registry.getSingleMetricAsString('stormgate_fallback_rate')).toMatch(/stormgate_fallback_rate\{route="chat"\} 1/);
    now += 61_000;
    expect(await m.registry.getSingleMetricAsString('stormgate_fallback_rate')).not.toMatch(/stormgate_fallback_rate\{/);
  });
});
