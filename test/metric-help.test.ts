// A metric's HELP is what an operator reads in Prometheus and Grafana: where it lists a label's values, it must list
// every value the gateway writes, or a series (a client that stalled a stream, a redirect from a wrong baseUrl) looks
// like something the docs never mentioned.
import { describe, expect, it } from 'vitest';
import { createMetrics } from '../src/observability/metrics.ts';
import { STATUS_CLASSES } from '../src/observability/pipeline-metrics.ts';
import { STREAM_END_KINDS } from '../src/pipeline/stream-ends.ts';
import { HOLD_REASONS } from '../src/state/hold-offs.ts';

async function helpOf(name: string): Promise<string> {
  const m = createMetrics({ defaultMetrics: false });
  const line = (await m.registry.metrics()).split('\n').find((l) => l.startsWith(`# HELP ${name} `));
  return line ?? '';
}

/** The values a HELP text names, as whole words (`cut` must not be found inside `client-cut`). */
function missing(help: string, values: readonly string[]): string[] {
  return values.filter((v) => !new RegExp(`(^|[\\s(,:])${v.replace(/[-]/g, '\\-')}(?=[\\s),:.]|$)`).test(help));
}

describe('metric HELP texts', () => {
  it('stormgate_stream_ends_total names every way a stream ends', async () => {
    expect(missing(await helpOf('stormgate_stream_ends_total'), STREAM_END_KINDS)).toEqual([]);
  });

  it('stormgate_retry_budget_remaining says it sums every budget of the route: each priority class and target', async () => {
    // One budget per route, priority class and target (RetryBudget.key); the gauge, labelled by route alone, sums them.
    const help = await helpOf('stormgate_retry_budget_remaining');
    expect(help).toMatch(/summed/);
    expect(help).toMatch(/priority class/);
    expect(help).toMatch(/target/);
  });

  it('stormgate_holds_started_total names every kind, tier and reason a hold starts with', async () => {
    const help = await helpOf('stormgate_holds_started_total');
    expect(missing(help, ['hold_off', 'credentials', 'all', 'flex', ...HOLD_REASONS.holdOff, ...HOLD_REASONS.flexTier, ...HOLD_REASONS.credentials])).toEqual([]);
  });

  it('stormgate_hold_remaining_seconds names every kind and tier', async () => {
    expect(missing(await helpOf('stormgate_hold_remaining_seconds'), ['hold_off', 'credentials', 'all', 'flex'])).toEqual([]);
  });

  it('stormgate_upstream_attempts_total names every status class', async () => {
    expect(missing(await helpOf('stormgate_upstream_attempts_total'), STATUS_CLASSES)).toEqual([]);
  });
});
