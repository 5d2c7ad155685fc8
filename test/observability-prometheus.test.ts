// The shipped Prometheus config, recording and alerting rules and the Grafana dashboard, checked with the real tools:
// promtool on the files, then a real Prometheus scraping a gateway under fault-injected load, which must parse and
// answer every dashboard query, every recording rule and every alert expression (threshold removed; a ratio and its minimum count apart) with data.
import { spawnSync } from 'node:child_process';
import { Writable } from 'node:stream';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { startMock, type MockServer } from '../src/mock/server.ts';
import { createLogger } from '../src/observability/logger.ts';
import { buildServer } from '../src/server.ts';
import {
  SHIPPED,
  dashboardQueries,
  dashboardVariables,
  query,
  readDashboard,
  readRules,
  recordedNames,
  startPrometheus,
  withoutGrafanaVariables,
  alertFigures,
  type PrometheusHandle,
  type QueryResult,
} from './helpers/prometheus.ts';

const KEY = 'sk-test-stormgate-0123456789';

function promtool(...args: string[]): { status: number | null; output: string } {
  const r = spawnSync('promtool', args, { encoding: 'utf8', input: '', cwd: SHIPPED.root });
  if (r.error) throw new Error(`promtool: ${r.error.message}; run \`npm run pretest\` to install prometheus`);
  return { status: r.status, output: `${r.stdout}${r.stderr}` };
}

describe('promtool on the shipped Prometheus files', () => {
  it('accepts prometheus.yml and finds its rule files', () => {
    const r = promtool('check', 'config', SHIPPED.prometheusConfig);
    expect(r.output).toContain('2 rule files found');
    expect(r.status, r.output).toBe(0);
  });

  it('accepts the recording and alerting rules', () => {
    const r = promtool('check', 'rules', SHIPPED.recordingRules, SHIPPED.alertRules);
    expect(r.status, r.output).toBe(0);
  });

  it('passes the rule unit tests: each alert fires at its threshold after its `for`, and not before', () => {
    const r = promtool('test', 'rules', SHIPPED.ruleTests);
    expect(r.status, r.output).toBe(0);
  });

  it('gives every alert a `for`, a severity, a summary and a description', () => {
    const alerts = readRules(SHIPPED.alertRules).groups.flatMap((g) => g.rules);
    expect(alerts.map((a) => a.alert).sort()).toEqual([
      'StormgateBreakerOpen',
      'StormgateClientErrorRateHigh',
      'StormgateCredentialsRefused',
      'StormgateFallbackRateHigh',
      'StormgateRetryBudgetExhausted',
      'StormgateRetryRateHigh',
      'StormgateShedRateHigh',
      'StormgateStateStoreDegraded',
      'StormgateStreamErrorsHigh',
      'StormgateTargetHeldOff',
    ]);
    for (const a of alerts) {
      expect(a.for, a.alert).toMatch(/^\d+[smh]$/);
      expect(['warning', 'critical'], a.alert).toContain(a.labels?.severity);
      expect(a.annotations?.summary, a.alert).toBeTruthy();
      expect(a.annotations?.description, a.alert).toBeTruthy();
      expect(alertFigures(a.expr), `${a.alert} ends with a threshold comparison`).toBeDefined();
    }
  });
});

const LOAD_KEY = 'sk-load-client-key-4fq9';

describe('the shipped rules and dashboard against a gateway under fault-injected load', () => {
  let primary: MockServer | undefined;
  let backup: MockServer | undefined;
  let solo: MockServer | undefined;
  let gateway: FastifyInstance | undefined;
  let prometheus: PrometheusHandle | undefined;
  let gatewayUrl = '';
  const answers: Record<string, number> = {};

  beforeAll(async () => {
    // primary: 503s, 429s with a wait hint, connection resets; backup: healthy; solo: a 503 brownout mid-load.
    primary = await startMock({
      quiet: true,
      apiKey: KEY,
      faults: {
        latencyMs: 10,
        errors: [{ status: 503, rate: 0.2 }, { status: 429, rate: 0.1, headers: { 'retry-after-ms': '30' } }],
        resetRate: 0.05,
        stream: { chunks: 3, chunkDelayMs: 5 },
      },
    });
    backup = await startMock({ quiet: true, apiKey: KEY, faults: { latencyMs: 10, stream: { chunks: 3 } } });
    solo = await startMock({ quiet: true, apiKey: KEY, faults: { latencyMs: 10 } });
    const input: ConfigInput = {
      server: { host: '127.0.0.1', port: 0, logLevel: 'warn' },
      providers: {
        // A small pool, so requests queue for slots and some are shed.
        primary: {
          family: 'openai', baseUrl: `${primary.url}/v1`, apiKey: KEY, maxConnections: 16,
          pools: { maxConcurrent: 6, classes: { online: { minShare: 0.5, maxQueue: 8 }, batch: { minShare: 0.1, maxQueue: 2 } } },
        },
        backup: { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: KEY },
        // A breaker that opens after 3 failures in a row and probes soon: requests park while it is open.
        solo: { family: 'openai', baseUrl: `${solo.url}/v1`, apiKey: KEY, breaker: { consecutiveFailures: 3, minRequests: 5, openS: 0.5, probeWhileParkedMs: 200 } },
      },
      routes: [
        {
          name: 'chat', match: { path: '/v1/chat/completions', models: ['gpt-*'] },
          targets: [{ provider: 'primary' }, { provider: 'backup' }],
          timeoutMs: 5000, minAttemptMs: 100,
          retry: { maxAttempts: 2, backoff: { baseMs: 10, capMs: 50 } },
          budget: { ratio: 10, minRetriesPerSecond: 1000 },
        },
        {
          name: 'solo', match: { path: '/v1/chat/completions', models: ['solo-*'] },
          targets: [{ provider: 'solo' }],
          timeoutMs: 2500, minAttemptMs: 100,
          retry: { maxAttempts: 1 },
          degraded: { message: 'busy, try again later' },
        },
      ],
      // A client key with a rate it never reaches: the dashboard's client-limit panel has its series at zero.
      auth: { keys: { load: LOAD_KEY }, limits: { load: { requestsPerMinute: 6_000_000, burst: 1_000_000 } } },
      // A passthrough path: the dashboard's passthrough panel has its series (at zero, from the start).
      passthrough: { provider: 'backup', paths: ['/v1/files'] },
    };
    const config = ConfigSchema.parse(input);
    const sink = new Writable({ write: (_chunk, _enc, cb) => cb() });
    // The gateway's own metrics registry, Node's default process metrics included, as in production.
    gateway = await buildServer(config, { logger: createLogger(config, sink) });
    gatewayUrl = await gateway.listen({ host: '127.0.0.1', port: 0 });
    prometheus = await startPrometheus({
      scrapeTargets: [new URL(gatewayUrl).host],
      ruleFiles: [SHIPPED.recordingRules, SHIPPED.alertRules],
    });
    // The traffic starts once Prometheus has the counters at their start: the ratio rules have no value (not NaN)
    // when nothing moved between two scrapes, so a first scrape after the load would leave them empty.
    for (const until = Date.now() + 15_000; Date.now() < until; ) {
      const up = await query(prometheus.url, 'up == 1');
      if (Array.isArray(up.data?.result) && up.data.result.length > 0) break;
      await new Promise((r) => setTimeout(r, 200));
    }

    // ~4 s of traffic: 8 clients on the chat route (half streamed, a third in the batch class), 3 on the solo route,
    // whose upstream answers 503 to everything from 1 s to 2.5 s.
    const until = Date.now() + 4_000;
    let n = 0;
    const client = async (model: string, i: number) => {
      while (Date.now() < until) {
        const stream = n++ % 2 === 0;
        const headers: Record<string, string> = { 'content-type': 'application/json', authorization: `Bearer ${LOAD_KEY}` };
        if (i % 3 === 0) headers['x-stormgate-priority'] = 'batch';
        const body = { model, stream, ...(stream ? { stream_options: { include_usage: true } } : {}), messages: [{ role: 'user', content: 'hi' }] };
        let key: string;
        try {
          const res = await fetch(`${gatewayUrl}/v1/chat/completions`, { method: 'POST', headers, body: JSON.stringify(body) });
          await res.arrayBuffer();
          key = `${model} ${res.status}${res.headers.get('x-stormgate-degraded') ? ' degraded' : ''}`;
        } catch (err) {
          key = `${model} ${(err as Error).message}`;
        }
        answers[key] = (answers[key] ?? 0) + 1;
      }
    };
    const brownout = setTimeout(() => solo!.brownout('503', 1_500), 1_000);
    await Promise.all([...Array.from({ length: 8 }, (_, i) => client('gpt-4o', i)), ...Array.from({ length: 3 }, (_, i) => client('solo-1', i + 1))]);
    clearTimeout(brownout);
  }, 60_000);

  afterAll(async () => {
    await prometheus?.stop();
    await gateway?.close();
    await Promise.all([primary?.close(), backup?.close(), solo?.close()]);
  });

  /** Queries until every expression has data or the time is up (new series need two scrapes and a rule evaluation). */
  async function queryAll(exprs: string[], timeoutMs = 15_000): Promise<Map<string, QueryResult>> {
    const results = new Map<string, QueryResult>();
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const pending = exprs.filter((e) => !hasData(results.get(e)));
      await Promise.all(pending.map(async (e) => results.set(e, await query(prometheus!.url, e))));
      if (exprs.every((e) => hasData(results.get(e))) || Date.now() > deadline) return results;
      if (exprs.some((e) => results.get(e)?.status === 'error')) return results;
      await new Promise((r) => setTimeout(r, 500));
    }
  }

  function hasData(r: QueryResult | undefined): boolean {
    return r?.status === 'success' && Array.isArray(r.data?.result) && r.data.result.length > 0;
  }

  function problems(results: Map<string, QueryResult>, label: (expr: string) => string): string[] {
    return [...results].flatMap(([expr, r]) =>
      r.status !== 'success' ? [`${label(expr)}: ${r.errorType}: ${r.error}`] : hasData(r) ? [] : [`${label(expr)}: no data`],
    );
  }

  it('served the load with retries, fallbacks, parking and degraded answers', () => {
    const total = Object.values(answers).reduce((a, b) => a + b, 0);
    expect(total, JSON.stringify(answers)).toBeGreaterThan(50);
    expect(answers['gpt-4o 200'], JSON.stringify(answers)).toBeGreaterThan(0);
  });

  it('promtool check metrics finds no problem in the gateway\'s own metrics', async () => {
    const text = await (await fetch(`${gatewayUrl}/metrics`)).text();
    expect(text).toContain('stormgate_requests_total');
    const all = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
    const findings = `${all.stdout}${all.stderr}`.split('\n').filter((l) => l.trim() !== '');
    // prom-client's default Node.js metrics name three gauges *_total; they are not the gateway's to rename.
    const allowed = /^nodejs_active_(handles|requests|resources)_total non-counter metrics should not have "_total" suffix$/;
    expect(findings.filter((l) => !allowed.test(l))).toEqual([]);
    expect([0, 3]).toContain(all.status);
    // The gateway's own families alone: no finding at all.
    const own = text.split('\n').filter((l) => /^(# (HELP|TYPE) )?stormgate_/.test(l)).join('\n') + '\n';
    const mine = spawnSync('promtool', ['check', 'metrics'], { input: own, encoding: 'utf8' });
    expect(`${mine.stdout}${mine.stderr}`.trim()).toBe('');
    expect(mine.status).toBe(0);
  });

  it('loads every rule and evaluates it without error', async () => {
    const res = (await (await fetch(`${prometheus!.url}/api/v1/rules`)).json()) as {
      data: { groups: Array<{ name: string; rules: Array<{ name: string; health: string; lastError?: string }> }> };
    };
    const loaded = res.data.groups.flatMap((g) => g.rules);
    const shipped = [SHIPPED.recordingRules, SHIPPED.alertRules].flatMap((f) => readRules(f).groups.flatMap((g) => g.rules));
    expect(loaded.map((r) => r.name).sort()).toEqual(shipped.map((r) => r.record ?? r.alert).sort());
    await expect.poll(async () => {
      const again = (await (await fetch(`${prometheus!.url}/api/v1/rules`)).json()) as typeof res;
      return again.data.groups.flatMap((g) => g.rules).filter((r) => r.health !== 'ok').map((r) => `${r.name}: ${r.health} ${r.lastError ?? ''}`);
    }, { timeout: 10_000, interval: 500 }).toEqual([]);
  });

  it('has data for every recording rule', async () => {
    const names = recordedNames();
    expect(names).toContain('stormgate:retry_success:ratio_rate5m');
    expect(names).toContain('stormgate:fallback:ratio_rate5m');
    expect(names).toContain('stormgate:amplification:ratio_rate5m');
    expect(problems(await queryAll(names), (e) => e)).toEqual([]);
  });

  it('has data for every alert expression without its threshold', async () => {
    const alerts = readRules(SHIPPED.alertRules).groups.flatMap((g) => g.rules);
    const exprs = new Map(alerts.flatMap((a) => alertFigures(a.expr)!.map((e) => [e, a.alert!] as const)));
    expect(problems(await queryAll([...exprs.keys()]), (e) => `${exprs.get(e)} (${e})`)).toEqual([]);
  });

  it('parses and has data for every query of the dashboard', async () => {
    const queries = dashboardQueries(readDashboard());
    expect(queries.length).toBeGreaterThan(20);
    const byExpr = new Map(queries.map((q) => [withoutGrafanaVariables(q.expr), `panel ${q.panel} ${q.refId}`]));
    expect(problems(await queryAll([...byExpr.keys()]), (e) => `${byExpr.get(e)}: ${e}`)).toEqual([]);
  });

  it('has values for every dashboard variable', async () => {
    const missing: string[] = [];
    for (const v of dashboardVariables(readDashboard())) {
      const url = `${prometheus!.url}/api/v1/label/${v.label}/values?${new URLSearchParams({ 'match[]': v.metric })}`;
      const res = (await (await fetch(url)).json()) as { status: string; data: string[] };
      if (res.status !== 'success' || res.data.length === 0) missing.push(`${v.name}: label_values(${v.metric}, ${v.label})`);
    }
    expect(missing).toEqual([]);
  });
});
