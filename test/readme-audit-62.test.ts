// README claims checked as a new user meets them (audit 62), from the angles earlier audits left: "Retries"' sentence
// on a gateway in front saying x-should-retry: false (run here as it happens, one stormgate in front of another, not a
// scripted answer), "Logs and metrics"' series at zero on a fresh gateway, its histograms' buckets and the gauges
// absent until they mean something, the configuration reference's YAML mistakes (a `${VAR}` in `{ }`, a quoted
// number, an alias typo, a merge key given a scalar, a second document, a config path that is a directory) as the
// loader and `npm start`'s entry say them, the mock's flags refused with their usage, and the compose demo's mock run
// as docker-compose.yml starts it, its traffic counted against the comment above it. Every claim checked held: no
// README sentence or code was changed.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { parse as parseYaml } from 'yaml';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { configErrorOf, validConfigText } from './helpers/config-text.ts';
import { mockCli } from './helpers/mock-cli.ts';
import { mockControl } from './helpers/mock-control.ts';
import { defaultConfig, scrapeMetrics, useExtraMocks, useGateways, useStacks, type MetricSample } from './helpers/stack.ts';

const ask = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'hi' }] };
const fixed = { strategy: 'fixed' as const, baseMs: 5, capMs: 5 };

describe('README "Retries": a stormgate in front of a stormgate (x-should-retry: false "sent by gateways, this one included")', () => {
  const gateways = useGateways();
  const mocks = useExtraMocks();
  const gatewayOf = (input: ConfigInput, logs?: string[]) => gateways(ConfigSchema.parse(input), { logs });

  it("the inner's 503 after its own retries says false: the outer tries it once, not maxAttempts times, and hands over as upstream_no_retry", async () => {
    const failing = await mocks({ faults: { errors: [{ status: 503, rate: 1 }] } });
    const backup = await mocks();
    const inner = await gatewayOf({
      providers: { m: { family: 'openai', baseUrl: `${failing.url}/v1`, apiKey: 'k', breaker: false } },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'm' }], park: false, retry: { maxAttempts: 2, backoff: fixed } }],
    });
    const outerLogs: string[] = [];
    const outer = await gatewayOf(
      {
        providers: { inner: { family: 'openai', baseUrl: `${inner}/v1`, apiKey: 'k', breaker: false }, b: { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: 'k' } },
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'inner' }, { provider: 'b', model: 'gpt-4.1' }], park: false, retry: { maxAttempts: 3, backoff: fixed } }],
      },
      outerLogs,
    );
    // The inner alone: its own retries spent, a 503 that tells whoever is in front not to retry it.
    const direct = await fetch(`${inner}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(ask) });
    expect(direct.status).toBe(503);
    expect(direct.headers.get('x-should-retry')).toBe('false');
    expect(direct.headers.get('x-stormgate-attempts')).toBe('2');
    await direct.arrayBuffer();

    const client = new OpenAI({ baseURL: `${outer}/v1`, apiKey: 'x', maxRetries: 0 });
    const { data, response } = await client.chat.completions.create(ask).withResponse();
    expect(data.model).toBe('gpt-4.1');
    expect(response.headers.get('x-stormgate-fallback')).toBe('upstream_no_retry');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    // 2 attempts for the direct call, 2 for the outer's one request to the inner: the outer did not retry it.
    expect(((await mockControl(failing, 'GET', 'stats')) as { total: number }).total).toBe(4);
    const line = JSON.parse(outerLogs.find((l) => l.includes('"reqId"'))!);
    expect(line.attempts.map((a: { target: string; status: number }) => `${a.target} ${a.status}`)).toEqual(['inner/gpt-4o 503', 'b/gpt-4.1 200']);
    expect(line.fallback).toBe('upstream_no_retry');
  });

  it("the inner's 503 circuit_open says false beside its retry-after: the outer waits it out and is served once the inner's breaker probes", async () => {
    const provider = await mocks({ faults: { errors: [{ status: 503, times: 1 }] } });
    const inner = await gatewayOf({
      providers: { m: { family: 'openai', baseUrl: `${provider.url}/v1`, apiKey: 'k', breaker: { consecutiveFailures: 1, openS: 1, halfOpenProbes: 1, closeAfter: 1 } } },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'm' }], park: false, retry: { maxAttempts: 1 } }],
    });
    const outer = await gatewayOf({
      providers: { inner: { family: 'openai', baseUrl: `${inner}/v1`, apiKey: 'k', breaker: false } },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'inner' }], park: false, retry: { maxAttempts: 3, backoff: fixed } }],
    });
    const post = () => fetch(`${inner}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(ask) });
    expect((await post()).status).toBe(503); // the one failure that opens the inner's breaker
    const open = await post();
    expect(open.status).toBe(503);
    expect(((await open.json()) as { error: { code: string } }).error.code).toBe('circuit_open');
    expect(open.headers.get('x-should-retry')).toBe('false');
    // openS 1 s plus up to 10% jitter: 1 or 2 whole seconds, and the exact wait in retry-after-ms.
    expect(open.headers.get('retry-after')).toMatch(/^[12]$/);
    expect(Number(open.headers.get('retry-after-ms'))).toBeLessThanOrEqual(1100);

    const client = new OpenAI({ baseURL: `${outer}/v1`, apiKey: 'x', maxRetries: 0 });
    const started = Date.now();
    const { data, response } = await client.chat.completions.create(ask).withResponse();
    expect(data.choices[0]?.message.content).toBe('Mock answer to: hi');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(Date.now() - started).toBeGreaterThanOrEqual(200); // it waited for the inner's probe, not a 5 ms backoff
    expect(Date.now() - started).toBeLessThan(10_000);
  });
});

describe('README "Logs and metrics": a fresh gateway\'s series, buckets and gauges', () => {
  const stack = useStacks();
  const config = (url: string): ConfigInput => ({
    ...defaultConfig(url),
    routes: [
      { name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock', model: 'gpt-4o' }, { provider: 'mock', model: 'gpt-4o-mini' }], degraded: { message: 'sorry' } },
      { name: 'embeddings', match: { path: '/v1/embeddings' }, targets: [{ provider: 'mock', model: 'text-embedding-3-small' }] },
    ],
  });
  const values = (samples: MetricSample[], name: string, key: string, where: Record<string, string> = {}) =>
    samples.filter((m) => m.name === name && Object.entries(where).every(([k, v]) => m.labels[k] === v)).map((m) => m.labels[key]);

  it('has every way a stream ends at zero for a streaming route, degraded series only for the route that sets degraded, holds at zero but the flex tier\'s', async () => {
    const s = await stack({ config });
    const m = await scrapeMetrics(s.url);
    expect(values(m, 'stormgate_stream_ends_total', 'end', { route: 'chat' }).sort()).toEqual(
      ['complete', 'done-added', 'cut', 'stalled', 'upstream-error', 'client-gone', 'client-stalled', 'recovered', 'shutdown'].sort(),
    );
    expect(values(m, 'stormgate_stream_ends_total', 'end', { route: 'embeddings' })).toEqual([]);
    expect(values(m, 'stormgate_degraded_total', 'reason', { route: 'chat' }).sort()).toEqual(['deadline', 'failed', 'park_full', 'shed', 'unavailable']);
    expect(values(m, 'stormgate_degraded_total', 'reason', { route: 'embeddings' })).toEqual([]);
    // Every outcome under the route's class and the lower one of its pool; `rejected` under none.
    expect(values(m, 'stormgate_requests_total', 'priority', { route: 'chat', target: 'mock/gpt-4o', outcome: 'replayed' }).sort()).toEqual(['batch', 'online']);
    expect(m.find((x) => x.name === 'stormgate_requests_total' && x.labels.outcome === 'rejected')?.labels).toEqual({ route: 'none', target: 'none', priority: 'none', outcome: 'rejected' });
    expect(values(m, 'stormgate_upstream_attempts_total', 'status_class', { target: 'mock/gpt-4o-mini' }).sort()).toEqual(
      ['2xx', '3xx', '4xx', '5xx', 'aborted', 'bad_stream', 'internal', 'network', 'timeout'],
    );
    const holds = m.filter((x) => x.name === 'stormgate_hold_remaining_seconds' && x.labels.target === 'mock/gpt-4o');
    expect(holds.map((x) => `${x.labels.kind} ${x.labels.tier} ${x.value}`).sort()).toEqual(['credentials all 0', 'hold_off all 0']);
    // The 60 s gauges are absent until there is something to divide.
    expect(m.some((x) => x.name === 'stormgate_fallback_rate' || x.name === 'stormgate_retry_success_rate')).toBe(false);
  });

  it('buckets: a request\'s duration to 30 minutes, TTFT and pool waits to 10; after one stream the fallback rate is 0, the retry success rate still absent, the budget 10 × 10', async () => {
    const s = await stack({ config });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'x', maxRetries: 0 });
    for await (const _ of await client.chat.completions.create({ ...ask, stream: true })) void _;
    const m = await scrapeMetrics(s.url);
    const top = (name: string) => Math.max(...m.filter((x) => x.name === name && x.labels.le !== '+Inf').map((x) => Number(x.labels.le)));
    expect(top('stormgate_request_duration_seconds_bucket')).toBe(1800);
    expect(m.some((x) => x.name === 'stormgate_request_duration_seconds_bucket' && x.labels.le === '300')).toBe(true);
    expect(m.some((x) => x.name === 'stormgate_request_duration_seconds_bucket' && x.labels.le === '600')).toBe(true);
    expect(top('stormgate_ttft_seconds_bucket')).toBe(600);
    expect(top('stormgate_pool_wait_seconds_bucket')).toBe(600);
    const one = (name: string) => m.filter((x) => x.name === name && x.labels.route === 'chat');
    expect(one('stormgate_fallback_rate').map((x) => x.value)).toEqual([0]);
    expect(one('stormgate_retry_success_rate')).toEqual([]);
    // minRetriesPerSecond 10 × windowS 10: the floor, as one request's ratio share (0.1) is less.
    expect(one('stormgate_retry_budget_remaining').map((x) => x.value)).toEqual([100]);
  });
});

describe('README "Configuration reference": the YAML mistakes it names, as the loader says them', () => {
  const base = validConfigText();
  const env = { OPENAI_API_KEY: 'sk-audit62', PORT: '8123' };
  const refusal = (text: string): string => configErrorOf(text, env).message;

  it('a number from the environment: block style loads, `{ port: ${PORT} }` is a syntax error at its line with no YAML path, `"${PORT}"` a string refused with the fix', () => {
    expect(parseConfig(`${base}server:\n  port: \${PORT}\n`, 'gw.yaml', env).server.port).toBe(8123);
    expect(refusal(`${base}server: { port: \${PORT} }\n`)).toMatch(/^gw\.yaml:10: an unquoted \$\{VAR\} inside a flow mapping/);
    expect(refusal(`${base}server:\n  port: "\${PORT}"\n`)).toMatch(/^gw\.yaml:11: server\.port: expected number, received string .*write it without quotes/);
  });

  it('an alias to an anchor not set names its line, path and the closest anchor; a merge key given a scalar, and a second document, are refused at their lines', () => {
    expect(refusal(`${base}x-a: &defaults { host: 127.0.0.1 }\nserver: *defualts\n`)).toBe('gw.yaml:11: server: alias *defualts names no anchor set above it; did you mean *defaults?');
    expect(refusal(`${base}server:\n  <<: 5\n`)).toMatch(/^gw\.yaml:11: server: merge key << takes a mapping/);
    expect(refusal(`${base}---\nfoo: 1\n`)).toMatch(/^gw\.yaml:10:1: the file holds more than one YAML document/);
  });

  it('a config path that cannot be read at all (a directory) is `stormgate: cannot read config` with the system\'s reason, exit 2', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'audit62-'));
    const child = spawn(process.execPath, ['--import', 'tsx', 'src/main.ts', '--config', dir], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => (stderr += String(d)));
    const [code] = await once(child, 'exit');
    expect(code).toBe(2);
    expect(stderr.split('\n')[0]).toBe('stormgate: cannot read config');
    expect(stderr).toContain(`${dir}: cannot read the config file: EISDIR`);
  });
});

describe('README "The mock provider": flags and the compose demo\'s mock', () => {
  const runMock = mockCli();

  it('a flag with a value out of range or no number, and a --faults with a misspelt field, exit with the message and the usage', async () => {
    for (const [args, message] of [
      [['--rate-limit-rpm', '60', '--rate-limit-burst-seconds', '0'], 'rateLimit.burstSeconds must be a number over 0 and at most 60'],
      [['--rate-limit-rpm', '60', '--rate-limit-burst-seconds', 'abc'], '--rate-limit-burst-seconds must be a non-negative number, got "abc"'],
      [['--faults', '{"erors":[]}'], 'unknown fault spec field "erors"; did you mean "errors"?'],
    ] as const) {
      const run = await runMock(['--quiet', ...args]);
      const [code] = await run.exited;
      expect(run.url).toBeUndefined();
      expect(code).not.toBe(0);
      expect(run.out()).toContain(message);
      expect(run.out()).toContain('usage: npm run mock -- [options]');
    }
  });

  it('docker-compose.yml\'s demo mock, run with its own flags: 2% resets, 5% 429s with retry-after-ms 500, a fifth of the rest 503s, answers after at least 50 ms', async () => {
    const compose = parseYaml(readFileSync('docker-compose.yml', 'utf8')) as { services: { mock: { command: string[] } } };
    const args = compose.services.mock.command.slice(4).map((a) => (a === '0.0.0.0' ? '127.0.0.1' : a));
    const portAt = args.indexOf('--port');
    const run = await runMock(args.filter((_, i) => i !== portAt && i !== portAt + 1));
    const seen: Record<string, number> = {};
    const answeredMs: number[] = [];
    for (let i = 0; i < 100; i++) {
      const started = performance.now();
      let kind: string;
      try {
        const res = await fetch(`${run.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...ask, model: 'gpt-4o-mini' }) });
        await res.arrayBuffer();
        kind = res.status === 429 ? `429 ${res.headers.get('retry-after-ms')}` : String(res.status);
        if (res.status === 200) answeredMs.push(performance.now() - started);
      } catch (err) {
        kind = `reset ${(err as { cause?: { code?: string } }).cause?.code}`;
      }
      seen[kind] = (seen[kind] ?? 0) + 1;
    }
    // Faults are deterministic: resets first (2 of 100), then 5% of the rest (4 of 98) and a fifth of what is left (18 of 94).
    expect(seen).toEqual({ 'reset UND_ERR_SOCKET': 2, '429 500': 4, '503': 18, '200': 76 });
    expect(Math.min(...answeredMs)).toBeGreaterThanOrEqual(49);
  }, 60_000); // 100 calls one after another, each 50-150 ms at the mock
});
