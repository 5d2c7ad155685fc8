// Starts a real, throwaway Prometheus on a free loopback port for the observability tests: it scrapes the given
// targets every second and evaluates the given rule files every second. The process and its temp dir are removed when
// the test stops it, and killed/removed when the test process exits, even after a failed test.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { isAbsolute, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse as parseYaml, stringify } from 'yaml';
import { freePort } from './free-port.ts';

interface PrometheusOptions {
  /** host:port of every endpoint to scrape at /metrics. */
  scrapeTargets: string[];
  /** Rule files (recording and alerting) to load; relative paths resolve against the working directory. */
  ruleFiles: string[];
}

export interface PrometheusHandle {
  /** http://127.0.0.1:<port> */
  url: string;
  /** SIGTERM, waits for the process to exit, removes the temp dir. */
  stop(): Promise<void>;
}

/** One PromQL answer of /api/v1/query. */
export interface QueryResult {
  status: 'success' | 'error';
  error?: string;
  errorType?: string;
  data?: { resultType: string; result: Array<{ metric: Record<string, string>; value?: [number, string]; values?: unknown[] }> | [number, string] };
}

const running = new Map<ChildProcess, string>();
process.on('exit', () => {
  for (const [child, dir] of running) {
    child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
});

/** Starts prometheus and resolves once /-/ready answers 200. */
export async function startPrometheus(opts: PrometheusOptions): Promise<PrometheusHandle> {
  const dir = mkdtempSync(join(tmpdir(), 'stormgate-prometheus-'));
  const configFile = join(dir, 'prometheus.yml');
  writeFileSync(
    configFile,
    stringify({
      global: { scrape_interval: '1s', scrape_timeout: '1s', evaluation_interval: '1s' },
      rule_files: opts.ruleFiles.map((f) => (isAbsolute(f) ? f : resolve(f))),
      scrape_configs: [{ job_name: 'stormgate', metrics_path: '/metrics', static_configs: [{ targets: opts.scrapeTargets }] }],
    }),
  );
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const args = [
    `--config.file=${configFile}`,
    `--storage.tsdb.path=${join(dir, 'data')}`,
    `--web.listen-address=127.0.0.1:${port}`,
    '--web.enable-lifecycle',
    '--log.level=warn',
  ];
  const child = spawn('prometheus', args, { stdio: ['ignore', 'pipe', 'pipe'] });
  running.set(child, dir);
  let output = '';
  const keep = (chunk: Buffer) => (output = (output + chunk.toString()).slice(-4000));
  child.stdout?.on('data', keep);
  child.stderr?.on('data', keep);
  let spawnError: Error | undefined;
  child.once('error', (err) => (spawnError = err));

  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = once(child, 'exit');
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
      await exited;
      clearTimeout(timer);
    }
    running.delete(child);
    rmSync(dir, { recursive: true, force: true });
  };

  const deadline = Date.now() + 15_000;
  while (Date.now() < deadline) {
    if (spawnError) {
      await stop();
      throw new Error(`could not start prometheus (${spawnError.message}); run \`npm run pretest\` to install it`);
    }
    if (child.exitCode !== null) {
      await stop();
      throw new Error(`prometheus exited with ${child.exitCode}:\n${output}`);
    }
    if (await ready(url)) return { url, stop };
    await new Promise((r) => setTimeout(r, 50));
  }
  await stop();
  throw new Error(`prometheus on port ${port} was not ready within 15 s:\n${output}`);
}

/** GET /api/v1/query?query=... at the current time. */
export async function query(prometheusUrl: string, promql: string): Promise<QueryResult> {
  const res = await fetch(`${prometheusUrl}/api/v1/query`, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ query: promql }),
  });
  return (await res.json()) as QueryResult;
}

async function ready(url: string): Promise<boolean> {
  try {
    const res = await fetch(`${url}/-/ready`, { signal: AbortSignal.timeout(1_000) });
    await res.arrayBuffer();
    return res.status === 200;
  } catch {
    return false;
  }
}

// --- The shipped observability files, for the dashboard and Prometheus tests ----------------------------------------

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** Paths (absolute) of the files grafana/README.md describes. */
/** Polls `check` every 100 ms until it holds (a scrape, a rule's evaluation), else fails naming `what`. */
export async function waitUntil(what: string, check: () => Promise<boolean>, withinMs = 20_000): Promise<void> {
  for (const end = Date.now() + withinMs; !(await check()); ) {
    if (Date.now() > end) throw new Error(`timed out waiting until ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** A query's one value (undefined when it has none); more than one series is the test's mistake. */
export async function queryScalar(prometheusUrl: string, promql: string): Promise<number | undefined> {
  const r = await query(prometheusUrl, promql);
  if (r.status !== 'success') throw new Error(`${promql}: ${r.error}`);
  const result = r.data!.result as Array<{ value: [number, string] }>;
  if (result.length > 1) throw new Error(`${promql}: ${result.length} series`);
  return result[0] ? Number(result[0].value[1]) : undefined;
}

export const SHIPPED = {
  root: ROOT,
  dashboard: join(ROOT, 'grafana/dashboards/stormgate.json'),
  datasources: join(ROOT, 'grafana/provisioning/datasources/prometheus.yml'),
  dashboardProvider: join(ROOT, 'grafana/provisioning/dashboards/stormgate.yml'),
  prometheusConfig: join(ROOT, 'grafana/prometheus/prometheus.yml'),
  recordingRules: join(ROOT, 'grafana/prometheus/rules/recording.yml'),
  alertRules: join(ROOT, 'grafana/prometheus/rules/alerts.yml'),
  ruleTests: join(ROOT, 'grafana/prometheus/tests/rules.test.yml'),
  compose: join(ROOT, 'docker-compose.yml'),
  dockerConfig: join(ROOT, 'config/docker.yaml'),
} as const;

interface DashboardTarget {
  refId?: string;
  expr?: string;
  datasource?: { type?: string; uid?: string };
}

interface DashboardPanel {
  id?: number;
  type: string;
  title?: string;
  datasource?: { type?: string; uid?: string };
  gridPos?: { h: number; w: number; x: number; y: number };
  targets?: DashboardTarget[];
  panels?: DashboardPanel[];
}

interface DashboardVariable {
  name: string;
  type: string;
  datasource?: { type?: string; uid?: string };
  query?: string | { query?: string };
  definition?: string;
}

interface Dashboard {
  uid: string;
  title: string;
  panels: DashboardPanel[];
  templating?: { list: DashboardVariable[] };
}

export function readDashboard(): Dashboard {
  return JSON.parse(readFileSync(SHIPPED.dashboard, 'utf8')) as Dashboard;
}

/** Every panel, those inside collapsed rows included. */
export function allPanels(dashboard: Dashboard): DashboardPanel[] {
  return dashboard.panels.flatMap((p) => [p, ...(p.panels ?? [])]);
}

/** Every PromQL expression of the dashboard's panels, with the panel it belongs to. */
export function dashboardQueries(dashboard: Dashboard): Array<{ panel: string; refId: string; expr: string }> {
  return allPanels(dashboard).flatMap((p) =>
    (p.targets ?? []).map((t) => ({ panel: `${p.id} ${p.title ?? ''}`, refId: t.refId ?? '?', expr: t.expr ?? '' })),
  );
}

/** `label_values(metric, label)` of each query variable. */
export function dashboardVariables(dashboard: Dashboard): Array<{ name: string; metric: string; label: string }> {
  return (dashboard.templating?.list ?? [])
    .filter((v) => v.type === 'query')
    .map((v) => {
      const text = typeof v.query === 'string' ? v.query : (v.query?.query ?? v.definition ?? '');
      const m = /^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$/.exec(text.trim());
      if (!m) throw new Error(`dashboard variable ${v.name}: expected label_values(metric, label), got "${text}"`);
      return { name: v.name, metric: m[1]!, label: m[2]! };
    });
}

/** Replaces Grafana's variables with what Prometheus can run: intervals by 1m (5m for the range), the rest by `.*`. */
export function withoutGrafanaVariables(expr: string): string {
  return expr
    .replace(/\$\{?__rate_interval\}?/g, '1m')
    .replace(/\$\{?__interval\}?/g, '1m')
    .replace(/\$\{?__range\}?/g, '5m')
    .replace(/\$\{(\w+)(:\w+)?\}|\$(\w+)/g, '.*');
}

interface RuleFile {
  groups: Array<{
    name: string;
    rules: Array<{ record?: string; alert?: string; expr: string; for?: string; labels?: Record<string, string>; annotations?: Record<string, string> }>;
  }>;
}

export function readRules(file: string): RuleFile {
  return parseYaml(readFileSync(file, 'utf8')) as RuleFile;
}

/** Names the shipped recording rules define. */
export function recordedNames(): string[] {
  return readRules(SHIPPED.recordingRules).groups.flatMap((g) => g.rules.flatMap((r) => (r.record ? [r.record] : [])));
}

/** `<figure> > 0.15` -> `<figure>`: an alert expression without its final threshold comparison; undefined if it has none. */
export function withoutThreshold(expr: string): string | undefined {
  const m = /^([\s\S]*?)\s*(?:>=|<=|==|!=|>|<)\s*(?:bool\s+)?[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?\s*$/i.exec(expr.trim());
  return m ? m[1] : undefined;
}

/**
 * The figures an alert expression compares, its threshold removed: the figure itself and, for a ratio alert with a
 * minimum count, `(<ratio> and on (...) <events> >= N) > X`, the ratio and the event count (each has data under traffic
 * even where the count is too small for the alert).
 */
export function alertFigures(expr: string): string[] | undefined {
  const figure = withoutThreshold(expr);
  if (figure === undefined) return undefined;
  const guarded = /^\(([\s\S]+?) and on \([^)]*\) ([\s\S]+)\)$/.exec(figure.trim());
  if (!guarded) return [figure];
  const events = withoutThreshold(guarded[2]!);
  return events === undefined ? undefined : [guarded[1]!, events];
}

const PROMQL_WORDS = new Set(['by', 'without', 'on', 'ignoring', 'group_left', 'group_right', 'bool', 'and', 'or', 'unless', 'offset', 'inf', 'nan', 'atan2']);

/** Metric names a PromQL expression reads (functions, keywords, label names and durations left out). */
export function metricNames(expr: string): string[] {
  const bare = withoutGrafanaVariables(expr)
    .replace(/"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`/g, '""') // strings
    .replace(/\{[^}]*\}/g, ' ') // label matchers
    .replace(/\[[^\]]*\]/g, ' ') // ranges and subqueries
    .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, ' ') // label lists
    .replace(/\boffset\s+-?[0-9a-z]+/g, ' ');
  const names = new Set<string>();
  for (const m of bare.matchAll(/(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?/g)) {
    if (m[2] !== undefined) continue; // a function or an aggregation
    if (PROMQL_WORDS.has(m[1]!.toLowerCase())) continue;
    names.add(m[1]!);
  }
  return [...names];
}
