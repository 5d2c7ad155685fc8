// The Grafana dashboard and its provisioning, read as files: unique panel ids, a datasource on every query, and only
// metric names the gateway exports or the shipped recording rules define. Plus the compose wiring around them.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { loadConfigFile } from '../src/config/load.ts';
import { createMetrics } from '../src/observability/metrics.ts';
import {
  SHIPPED,
  allPanels,
  dashboardQueries,
  dashboardVariables,
  metricNames,
  readDashboard,
  readRules,
  recordedNames,
} from './helpers/prometheus.ts';

interface DatasourceFile {
  datasources: Array<{ name: string; uid: string; type: string; url: string }>;
}

/** Series names the gateway exports: counters and gauges as named, histograms as _bucket, _sum and _count. */
function exportedSeries(): Set<string> {
  const names = new Set<string>();
  for (const m of createMetrics({ defaultMetrics: false }).registry.getMetricsAsArray()) {
    const { name, type } = m as unknown as { name: string; type: string };
    if (type === 'histogram') for (const suffix of ['_bucket', '_sum', '_count']) names.add(name + suffix);
    else if (type === 'summary') for (const suffix of ['', '_sum', '_count']) names.add(name + suffix);
    else names.add(name);
  }
  return names;
}

/** The labels of each series the dashboard reads: an exported metric's own, or what a recording rule keeps. */
function metricLabels(): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const m of createMetrics({ defaultMetrics: false }).registry.getMetricsAsArray()) {
    const { name, type, labelNames } = m as unknown as { name: string; type: string; labelNames?: string[] };
    const labels = [...(labelNames ?? []), 'instance', 'job'];
    out.set(name, labels);
    if (type === 'histogram') for (const suffix of ['_bucket', '_sum', '_count']) out.set(name + suffix, suffix === '_bucket' ? [...labels, 'le'] : labels);
  }
  for (const rule of readRules(SHIPPED.recordingRules).groups.flatMap((g) => g.rules)) {
    if (rule.record) out.set(rule.record, keptLabels(rule.expr, out) ?? []);
  }
  return out;
}

/** The labels a query's result keeps: its outermost aggregation's `by`, or a bare series' own; undefined if neither. */
function keptLabels(expr: string, labels: Map<string, string[]>): string[] | undefined {
  const e = expr.trim();
  const list = (s: string) => s.split(',').map((l) => l.trim()).filter(Boolean);
  const quantile = /^histogram_quantile\(\s*[\d.]+\s*,\s*(?:sum|max|min) by \(([^)]*)\)/.exec(e);
  if (quantile) return list(quantile[1]!).filter((l) => l !== 'le');
  const by = /^(?:sum|max|min|avg|count) by \(([^)]*)\)/.exec(e);
  if (by) return list(by[1]!);
  if (/^(?:sum|max|min|avg|count)\s*\(/.test(e)) return [];
  const bare = /^([a-zA-Z_:][\w:]*)(?:\{[^}]*\})?$/.exec(e);
  return bare ? labels.get(bare[1]!) : undefined;
}

const dashboard = readDashboard();
const datasource = (parseYaml(readFileSync(SHIPPED.datasources, 'utf8')) as DatasourceFile).datasources[0]!;

describe('grafana/dashboards/stormgate.json', () => {
  it('gives every panel a unique id', () => {
    const ids = allPanels(dashboard).map((p) => p.id);
    expect(ids.every((id) => Number.isInteger(id))).toBe(true);
    expect(new Set(ids).size).toBe(ids.length);
  });

  it('puts the provisioned Prometheus datasource on every panel, query and variable', () => {
    expect(datasource).toMatchObject({ type: 'prometheus', uid: 'stormgate-prometheus' });
    const wanted = { type: 'prometheus', uid: datasource.uid };
    const panels = allPanels(dashboard).filter((p) => p.type !== 'row');
    expect(panels.length).toBeGreaterThan(0);
    for (const panel of panels) {
      expect(panel.datasource, `panel ${panel.id} ${panel.title}`).toEqual(wanted);
      expect(panel.targets?.length ?? 0, `panel ${panel.id} ${panel.title} has no query`).toBeGreaterThan(0);
      const refIds = panel.targets!.map((t) => t.refId);
      expect(new Set(refIds).size, `panel ${panel.id}: refIds ${refIds.join(',')}`).toBe(refIds.length);
      for (const target of panel.targets!) {
        expect(target.datasource, `panel ${panel.id} ${panel.title} query ${target.refId}`).toEqual(wanted);
        expect(target.expr?.trim(), `panel ${panel.id} query ${target.refId}`).toBeTruthy();
      }
    }
    for (const variable of dashboard.templating?.list ?? []) expect(variable.datasource, `variable ${variable.name}`).toEqual(wanted);
  });

  it('uses only metric names the gateway exports or the shipped recording rules define', () => {
    const known = new Set([...exportedSeries(), ...recordedNames()]);
    const used = new Set<string>();
    for (const q of dashboardQueries(dashboard)) for (const name of metricNames(q.expr)) used.add(name);
    for (const v of dashboardVariables(dashboard)) used.add(v.metric);
    expect(used.size).toBeGreaterThan(10);
    expect([...used].filter((name) => !known.has(name))).toEqual([]);
  });

  it('shows the figures the issue asks for', () => {
    const exprs = dashboardQueries(dashboard).map((q) => q.expr).join('\n');
    for (const needle of [
      'stormgate_requests_total',
      'stormgate_retry_count_total',
      'stormgate:retry_success:ratio_rate5m',
      'stormgate:fallback:ratio_rate5m',
      'stormgate:amplification:ratio_rate5m',
      'stormgate_tokens_total',
      'stormgate_parked_requests',
      'stormgate_breaker_state',
      'stormgate_retry_budget_remaining',
      'stormgate_pool_in_use',
      'stormgate_pool_queue_depth',
      'stormgate_ttft_seconds_bucket',
      'stormgate_state_degraded',
      'stormgate_shed_total',
      'stormgate:request_errors:ratio_rate5m',
    ]) {
      expect(exprs, needle).toContain(needle);
    }
    expect(exprs).toMatch(/histogram_quantile\(0\.5, sum by \(attempt, le\) \(rate\(stormgate_request_duration_seconds_bucket/);
    expect(exprs).toMatch(/histogram_quantile\(0\.99, sum by \(attempt, le\) \(rate\(stormgate_request_duration_seconds_bucket/);
  });

  it('names in each legend only labels its query keeps, and filters every figure with a route label by $route', () => {
    const labels = metricLabels();
    const problems: string[] = [];
    let legends = 0;
    for (const panel of allPanels(dashboard)) {
      for (const t of (panel.targets ?? []) as Array<{ refId?: string; expr?: string; legendFormat?: string }>) {
        const where = `panel ${panel.id} ${panel.title} ${t.refId}`;
        const kept = keptLabels(t.expr ?? '', labels);
        if (kept === undefined) {
          problems.push(`${where}: cannot tell the labels of ${t.expr}`);
          continue;
        }
        for (const m of (t.legendFormat ?? '').matchAll(/\{\{\s*(\w+)\s*\}\}/g)) {
          legends++;
          if (!kept.includes(m[1]!)) problems.push(`${where}: legend {{${m[1]}}} is not a label of ${t.expr} (${kept.join(', ') || 'none'})`);
        }
        // Every series with a route label follows the route variable; the per-instance amplification cannot (the
        // attempts counter has no route label, so its denominator is fleet-wide as well).
        if (panel.title === 'Amplification') continue;
        for (const sel of (t.expr ?? '').matchAll(/([a-zA-Z_:][\w:]*)(\{[^}]*\})?(?=\s*(?:\[|\)|$|\s))/g)) {
          const name = sel[1]!;
          if (!labels.has(name) || !labels.get(name)!.includes('route')) continue;
          if (!(sel[2] ?? '').includes('route=~"$route"')) problems.push(`${where}: ${name} not filtered by the route variable`);
        }
      }
    }
    expect(legends).toBeGreaterThan(30);
    expect(problems).toEqual([]);
  });

  it('lays panels out on the 24-column grid without overlaps', () => {
    const boxes = dashboard.panels.map((p) => ({ id: p.id, ...p.gridPos! }));
    for (const b of boxes) {
      expect(b.x + b.w, `panel ${b.id}`).toBeLessThanOrEqual(24);
      expect(b.h, `panel ${b.id}`).toBeGreaterThan(0);
    }
    for (const a of boxes) {
      for (const b of boxes) {
        if (a === b) continue;
        const overlap = a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h;
        expect(overlap, `panels ${a.id} and ${b.id} overlap`).toBe(false);
      }
    }
  });
});

describe('the shipped recording rules', () => {
  it('are named stormgate:<what>:<how> and read only exported metrics', () => {
    const exported = exportedSeries();
    const rules = readRules(SHIPPED.recordingRules).groups.flatMap((g) => g.rules);
    expect(rules.length).toBeGreaterThan(0);
    for (const rule of rules) {
      expect(rule.record, JSON.stringify(rule)).toMatch(/^stormgate:[a-z0-9_]+:[a-z0-9_]+$/);
      expect(metricNames(rule.expr).filter((n) => !exported.has(n)), rule.record).toEqual([]);
    }
  });

  it('alerts read only exported metrics and recorded series', () => {
    const known = new Set([...exportedSeries(), ...recordedNames()]);
    for (const rule of readRules(SHIPPED.alertRules).groups.flatMap((g) => g.rules)) {
      expect(metricNames(rule.expr).filter((n) => !known.has(n)), rule.alert).toEqual([]);
    }
  });
});

describe('docker-compose.yml wiring', () => {
  interface Compose {
    services: Record<string, { volumes?: string[]; ports?: string[]; profiles?: string[]; environment?: string[] | Record<string, string> }>;
  }
  const compose = parseYaml(readFileSync(SHIPPED.compose, 'utf8')) as Compose;

  it('mounts paths that exist in the repository', () => {
    const mounts = Object.values(compose.services).flatMap((s) => s.volumes ?? []).filter((v) => v.startsWith('./'));
    expect(mounts.length).toBeGreaterThanOrEqual(3);
    for (const mount of mounts) expect(existsSync(join(SHIPPED.root, mount.split(':')[0]!)), mount).toBe(true);
  });

  it('points Grafana at the compose Prometheus and its dashboard provider at the mounted dashboards', () => {
    expect(datasource.url).toBe('http://prometheus:9090');
    const grafana = compose.services.grafana!.volumes!;
    expect(grafana).toContain('./grafana/provisioning:/etc/grafana/provisioning:ro');
    const provider = (parseYaml(readFileSync(SHIPPED.dashboardProvider, 'utf8')) as { providers: Array<{ options: { path: string } }> }).providers[0]!;
    expect(grafana).toContain(`./grafana/dashboards:${provider.options.path}:ro`);
    expect(compose.services.prometheus!.volumes).toContain('./grafana/prometheus:/etc/prometheus:ro');
  });

  it('scrapes the gateway where config/docker.yaml makes it listen', () => {
    const config = loadConfigFile(SHIPPED.dockerConfig, { OPENAI_API_KEY: 'sk-test', REDIS_URL: 'redis://redis:6379', STORMGATE_API_KEY: 'client-key' });
    expect(config.server.host).toBe('0.0.0.0');
    // Listening on every interface, it serves only clients with the key compose passes on (the loadgen sends it too).
    expect(config.auth?.keys).toEqual({ default: 'client-key' });
    expect(compose.services.gateway!.environment).toContain('STORMGATE_API_KEY');
    const prom = parseYaml(readFileSync(SHIPPED.prometheusConfig, 'utf8')) as { scrape_configs: Array<{ static_configs: Array<{ targets: string[] }> }> };
    expect(prom.scrape_configs.flatMap((c) => c.static_configs.flatMap((s) => s.targets))).toEqual([`gateway:${config.server.port}`]);
    expect(compose.services.gateway!.ports).toContain(`${config.server.port}:${config.server.port}`);
    expect(compose.services.gateway!.environment).toContain('REDIS_URL=redis://redis:6379');
    expect(config.state.redis).toBe('redis://redis:6379');
    expect(compose.services.mock!.profiles).toEqual(['demo']);
  });
});
