// Review of the observability stack as an SRE adopting it would run it, with a real Prometheus (2026-12-06).
// Found: stormgate_request_duration_seconds ended at 120 s (the default deadline), yet a started stream is bound by no
// deadline (only idleMs between its events), so streams of 3 to 10 minutes all fell in +Inf and the dashboard's
// latency quantiles, through histogram_quantile, read 120 s for them; the "Pool wait p95" panel ignored the dashboard's
// priority variable, which every other pool panel applies.
import { createServer, type Server } from 'node:http';
import { once } from 'node:events';
import type { AddressInfo } from 'node:net';
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import { createMetrics } from '../src/observability/metrics.ts';
import { allPanels, query, readDashboard, startPrometheus, type PrometheusHandle } from './helpers/prometheus.ts';
import { scrapeMetrics, TEST_KEY, useStacks } from './helpers/stack.ts';

const startStack = useStacks();

let prometheus: PrometheusHandle | undefined;
let exporter: Server | undefined;
afterEach(async () => {
  await prometheus?.stop();
  prometheus = undefined;
  if (exporter) {
    exporter.closeAllConnections();
    await new Promise((r) => exporter!.close(r));
    exporter = undefined;
  }
});

describe('stormgate_request_duration_seconds against streams that outlast the deadline', () => {
  it('a started stream outlives its route\'s timeoutMs: its duration is bounded by no deadline', async () => {
    // 6 chunks 500 ms apart: about 3 s of stream on a route whose deadline is 1.5 s.
    const s = await startStack({ route: { timeoutMs: 1500 }, faults: { stream: { chunks: 6, chunkDelayMs: 500 } } });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: TEST_KEY, maxRetries: 0 });
    const stream = await client.chat.completions.create({ model: 'gpt-4o-mini', stream: true, messages: [{ role: 'user', content: 'a long answer' }] });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text.length).toBeGreaterThan(0);
    const samples = await scrapeMetrics(s.url);
    const sum = samples.find((x) => x.name === 'stormgate_request_duration_seconds_sum' && x.labels.route === 'chat' && x.labels.attempt === 'first');
    expect(sum?.value).toBeGreaterThan(2.5);
  });

  it('Prometheus reads the median of 4- to 8-minute streams as minutes, not as the 120 s of the last bucket', async () => {
    const m = createMetrics({ defaultMetrics: false });
    m.requestDuration.observe({ route: 'chat', attempt: 'first' }, 0); // the series exists before the streams end
    exporter = createServer((_req, res) => {
      void m.registry.metrics().then((text) => res.writeHead(200, { 'content-type': m.registry.contentType }).end(text));
    });
    exporter.listen(0, '127.0.0.1');
    await once(exporter, 'listening');
    const { port } = exporter.address() as AddressInfo;
    prometheus = await startPrometheus({ scrapeTargets: [`127.0.0.1:${port}`], ruleFiles: [] });
    const expr = 'histogram_quantile(0.5, sum by (le) (rate(stormgate_request_duration_seconds_bucket{route="chat"}[1m])))';
    const median = async (): Promise<number | undefined> => {
      const r = await query(prometheus!.url, expr);
      const v = (r.data?.result as Array<{ value: [number, string] }> | undefined)?.[0]?.value[1];
      return v === undefined ? undefined : Number(v);
    };
    // Scraped once with only the zero: then the streams end.
    const seen = Date.now();
    while (Date.now() - seen < 15_000) {
      const r = await query(prometheus.url, 'count_over_time(stormgate_request_duration_seconds_count[1m])');
      if (Number((r.data?.result as Array<{ value: [number, string] }> | undefined)?.[0]?.value[1] ?? 0) >= 2) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    for (let i = 0; i < 40; i += 1) m.requestDuration.observe({ route: 'chat', attempt: 'first' }, 240 + i * 6);
    let value: number | undefined;
    const deadline = Date.now() + 15_000;
    while (Date.now() < deadline) {
      value = await median();
      if (value !== undefined && Number.isFinite(value)) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    // The real median is 357 s; past the last finite bucket, histogram_quantile answers that bucket's bound.
    expect(value).toBeGreaterThan(240);
    expect(value).toBeLessThan(600);
  });
});

describe('the dashboard\'s pool panels', () => {
  it('filter by the provider and priority variables alike', () => {
    const pool = allPanels(readDashboard()).flatMap((p) => (p.targets ?? []).map((t) => ({ panel: p.title, expr: t.expr ?? '' })))
      .filter((t) => /stormgate_pool_(in_use|queue_depth|client_in_use|client_queue_depth|wait_seconds)/.test(t.expr));
    expect(pool.length).toBeGreaterThan(4);
    for (const t of pool) {
      expect(t.expr, t.panel).toContain('provider=~"$provider"');
      expect(t.expr, t.panel).toContain('priority=~"$priority"');
    }
  });
});

describe('the time to first token and pool wait histograms on a route with a longer deadline than the default', () => {
  it('keep buckets past 120 s, so a p95 of waits of minutes (a reasoning model\'s route, timeoutMs 600000) is not read as the last bucket', async () => {
    const m = createMetrics({ defaultMetrics: false });
    m.ttft.observe({ route: 'reasoning' }, 400);
    m.poolWait.observe({ provider: 'p', priority: 'online' }, 400);
    const text = await m.registry.metrics();
    for (const [name, labels] of [['stormgate_ttft_seconds', 'route="reasoning"'], ['stormgate_pool_wait_seconds', 'provider="p",priority="online"']]) {
      expect(text).toContain(`${name}_bucket{le="300",${labels}} 0`);
      expect(text).toContain(`${name}_bucket{le="600",${labels}} 1`);
    }
  });
});
