// Hand mutation testing of the observability code (src/observability/*, src/http/request-log.ts): each test here
// kills a mutant the rest of the suite let live, where the mutant shows a user a wrong number on a dashboard, a
// missing series an alert needs, or a secret in a log line.
import { Writable } from 'node:stream';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { accessLogger, createLogger } from '../src/observability/logger.ts';
import { createMetrics, type Metrics } from '../src/observability/metrics.ts';
import { forgetTargetSeries, RequestRecorder } from '../src/observability/pipeline-metrics.ts';
import { collectAtScrape } from '../src/observability/scrape-gauges.ts';
import { zeroSeries } from '../src/observability/zero-series.ts';
import { ConfigSchema } from '../src/config/schema.ts';
import { TargetKeys } from '../src/routing/target-keys.ts';
import type { RequestSummary } from '../src/pipeline/handle-request.ts';
import { chatCompletion, useFakeProviders } from './helpers/fake-provider.ts';
import { configFor } from './helpers/one-provider.ts';
import { eventually } from './helpers/redis-stores.ts';
import { defaultConfig, parseMetrics, scrapeMetrics, TEST_KEY, useStacks } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();

const ok: RequestSummary = {
  route: 'chat',
  target: 'p/m',
  outcome: 'success',
  attempts: [{ target: 'p/m', attempt: 0, reason: 'ok', status: 200, waitMs: 0, durationMs: 5 }],
  budgetMs: 1000,
  deadlineSource: 'route',
  skipped: [],
};
const retriedOk: RequestSummary = {
  ...ok,
  attempts: [{ target: 'p/m', attempt: 0, reason: 'status_503', status: 503, waitMs: 0, durationMs: 5 }, ...ok.attempts],
};

/** The gauge's value for route chat, or undefined when it has no series. */
async function gauge(m: Metrics, name: string): Promise<number | undefined> {
  return parseMetrics(await m.registry.metrics()).find((s) => s.name === name && s.labels.route === 'chat')?.value;
}

describe('the rate gauges (stormgate_retry_success_rate, stormgate_fallback_rate) cover the last 60 s', () => {
  it('count a request for 60 whole seconds, its own included, and not in the 61st', async () => {
    let now = 1_000_000; // second 1000, at its start
    const m = createMetrics({ defaultMetrics: false });
    new RequestRecorder(m, () => now).record(retriedOk, 0.01);
    now = 1_059_999;
    expect(await gauge(m, 'stormgate_retry_success_rate')).toBe(1);
    expect(await gauge(m, 'stormgate_fallback_rate')).toBe(0);
    now = 1_060_000;
    expect(await gauge(m, 'stormgate_retry_success_rate')).toBeUndefined();
    expect(await gauge(m, 'stormgate_fallback_rate')).toBeUndefined();
  });

  it('keep counting under steady traffic past the first minute: old seconds leave, new ones come in', async () => {
    let now = 1_000_000;
    const m = createMetrics({ defaultMetrics: false });
    const rec = new RequestRecorder(m, () => now);
    // One request a second for 90 s: a retried success for the first 45, then plain ones.
    for (let s = 0; s < 90; s++, now += 1000) rec.record(s < 45 ? retriedOk : ok, 0.01);
    now -= 1000;
    // The window holds seconds 30..89: 15 retried successes, all successes.
    expect(await gauge(m, 'stormgate_retry_success_rate')).toBe(1);
    expect(await gauge(m, 'stormgate_fallback_rate')).toBe(0);
    now += 15_000;
    // Seconds 45..104: nothing retried any more.
    expect(await gauge(m, 'stormgate_retry_success_rate')).toBeUndefined();
    expect(await gauge(m, 'stormgate_fallback_rate')).toBe(0);
  });
});

/** A counter's value for the labels given (every other label free), summed. */
async function counter(m: Metrics, name: string, labels: Record<string, string>): Promise<number> {
  const samples = parseMetrics(await m.registry.metrics()).filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v));
  return samples.reduce((sum, s) => sum + s.value, 0);
}

describe('RequestRecorder', () => {
  it('leaves a retried request whose client left out of stormgate_retried_requests_total, as out of the gauge', async () => {
    const m = createMetrics({ defaultMetrics: false });
    const rec = new RequestRecorder(m, () => 1_000_000);
    rec.record({ ...retriedOk, outcome: 'client_gone' }, 0.01);
    expect(await counter(m, 'stormgate_retried_requests_total', { route: 'chat' })).toBe(0);
    expect(await gauge(m, 'stormgate_retry_success_rate')).toBeUndefined();
    expect(await gauge(m, 'stormgate_fallback_rate')).toBeUndefined();
    rec.record(retriedOk, 0.01);
    expect(await counter(m, 'stormgate_retried_requests_total', { route: 'chat', result: 'success' })).toBe(1);
    expect(await counter(m, 'stormgate_requests_total', { route: 'chat' })).toBe(2);
  });

  it('counts a request answered by a fallback only when the fallback answered: a failed one is no fallback answer', async () => {
    const m = createMetrics({ defaultMetrics: false });
    const rec = new RequestRecorder(m, () => 1_000_000);
    rec.record({ ...retriedOk, outcome: 'upstream_error', fallback: 'retries_exhausted' }, 0.01);
    rec.record({ ...retriedOk, fallback: 'retries_exhausted' }, 0.01);
    rec.record(ok, 0.01);
    rec.record(ok, 0.01);
    expect(await counter(m, 'stormgate_fallback_requests_total', { route: 'chat' })).toBe(1);
    expect(await gauge(m, 'stormgate_fallback_rate')).toBe(0.25);
    expect(await gauge(m, 'stormgate_retry_success_rate')).toBe(0.5);
    expect(await counter(m, 'stormgate_retried_requests_total', { route: 'chat', result: 'failure' })).toBe(1);
  });

  it('files each duration under first or retry, TTFT in seconds, leaves replays out of the latency, counts client retries', async () => {
    const m = createMetrics({ defaultMetrics: false });
    const rec = new RequestRecorder(m, () => 1_000_000);
    rec.record({ ...ok, ttftMs: 250, clientRetry: 'declared' }, 0.3);
    rec.record(retriedOk, 2);
    rec.record({ ...ok, outcome: 'replayed', attempts: [] }, 0.001);
    expect(await counter(m, 'stormgate_request_duration_seconds_count', { route: 'chat', attempt: 'first' })).toBe(1);
    expect(await counter(m, 'stormgate_request_duration_seconds_sum', { route: 'chat', attempt: 'first' })).toBeCloseTo(0.3, 6);
    expect(await counter(m, 'stormgate_request_duration_seconds_count', { route: 'chat', attempt: 'retry' })).toBe(1);
    expect(await counter(m, 'stormgate_ttft_seconds_sum', { route: 'chat' })).toBeCloseTo(0.25, 6);
    expect(await counter(m, 'stormgate_ttft_seconds_bucket', { route: 'chat', le: '0.1' })).toBe(0);
    expect(await counter(m, 'stormgate_ttft_seconds_bucket', { route: 'chat', le: '0.25' })).toBe(1);
    expect(await counter(m, 'stormgate_client_retries_total', { route: 'chat', how: 'declared' })).toBe(1);
    expect(await counter(m, 'stormgate_requests_total', { route: 'chat', outcome: 'replayed' })).toBe(1);
  });

  it('bills prompt and completion tokens apart, a recovered stream\'s continuation to the target it went to', async () => {
    const m = createMetrics({ defaultMetrics: false });
    new RequestRecorder(m, () => 1_000_000).record({ ...ok, usage: { prompt: 7, completion: 3 }, continuationUsage: { target: 'b/m', usage: { prompt: 11, completion: 5 } } }, 0.01);
    expect(await counter(m, 'stormgate_tokens_total', { target: 'p/m', kind: 'prompt' })).toBe(7);
    expect(await counter(m, 'stormgate_tokens_total', { target: 'p/m', kind: 'completion' })).toBe(3);
    expect(await counter(m, 'stormgate_tokens_total', { target: 'b/m', kind: 'prompt' })).toBe(11);
    expect(await counter(m, 'stormgate_tokens_total', { target: 'b/m', kind: 'completion' })).toBe(5);
  });
});

describe('stormgate_upstream_attempts_total over real HTTP', () => {
  it('counts a 200 that is no answer under status_class bad_stream (a value of the series started at zero), and its retry under reason bad_stream', async () => {
    let n = 0;
    const p = await startProvider((req, res) => {
      req.resume();
      if (n++ === 0) res.writeHead(200, { 'content-type': 'text/html' }).end('<html>maintenance</html>');
      else res.writeHead(200, { 'content-type': 'application/json' }).end(chatCompletion('ok'));
    });
    const s = await startStack({ config: configFor(p.origin, { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } }) });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    const answer = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    expect(answer.choices[0]!.message.content).toBe('ok');
    const after = (await scrapeMetrics(s.url)).filter((x) => x.name === 'stormgate_upstream_attempts_total' && x.value > 0);
    expect(after.map((x) => [x.labels.target, x.labels.status_class, x.value]).sort()).toEqual([
      ['p/gpt-4o', '2xx', 1],
      ['p/gpt-4o', 'bad_stream', 1],
    ]);
    const retries = (await scrapeMetrics(s.url)).filter((x) => x.name === 'stormgate_retry_count_total' && x.value > 0);
    expect(retries.map((x) => [x.labels.reason, x.value])).toEqual([['bad_stream', 1]]);
  });
});

describe('forgetTargetSeries', () => {
  it('removes a given-back key\'s hand-overs, to it and from it, and leaves every other series', async () => {
    const m = createMetrics({ defaultMetrics: false });
    m.fallbacks.inc({ route: 'chat', from: 'p/made-up', to: 'q/made-up', reason: 'error' });
    m.fallbacks.inc({ route: 'chat', from: 'q/made-up', to: 'r/made-up', reason: 'error' });
    m.fallbacks.inc({ route: 'chat', from: 'p/m', to: 'q/m', reason: 'error' });
    m.requests.inc({ route: 'chat', target: 'q/made-up', priority: 'online', outcome: 'upstream_error' });
    await forgetTargetSeries(m, 'q/made-up');
    const left = parseMetrics(await m.registry.metrics()).filter((x) => x.name === 'stormgate_fallbacks_total' || x.name === 'stormgate_requests_total');
    expect(left.map((x) => [x.labels.from, x.labels.to, x.labels.target])).toEqual([['p/m', 'q/m', undefined]]);
  });
});

describe('the loggers redact every client credential header, wherever a line puts the headers', () => {
  const lines: string[] = [];
  const sink = new Writable({
    write(chunk, _enc, cb) {
      lines.push(String(chunk));
      cb();
    },
  });
  const HEADERS = ['authorization', 'api-key', 'x-api-key'];

  for (const [name, make] of [
    ['createLogger', () => createLogger({ server: { logLevel: 'info' } } as Parameters<typeof createLogger>[0], sink)],
    ['accessLogger', () => accessLogger(createLogger({ server: { logLevel: 'info' } } as Parameters<typeof createLogger>[0], sink))],
  ] as const) {
    it(`${name}: under req.headers and under headers, each of ${HEADERS.join(', ')}`, () => {
      lines.length = 0;
      const log = make();
      for (const h of HEADERS) {
        log.info({ req: { headers: { [h]: `secret-req-${h}`, 'user-agent': 'kept' } } }, 'x');
        log.info({ headers: { [h]: `secret-top-${h}`, 'user-agent': 'kept' } }, 'x');
      }
      expect(lines).toHaveLength(6);
      for (const line of lines) {
        expect(line).not.toContain('secret-');
        expect(line).toContain('[redacted]');
        expect(line).toContain('kept');
      }
    });
  }

  it('writes no line below the configured level', () => {
    lines.length = 0;
    const log = createLogger({ server: { logLevel: 'warn' } } as Parameters<typeof createLogger>[0], sink);
    log.info('not written');
    log.warn('written');
    expect(lines.map((l) => (JSON.parse(l) as { msg: string }).msg)).toEqual(['written']);
  });
});

describe('the request line over real HTTP', () => {
  const lines = (logs: string[]) => logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.reqId !== undefined);

  it('logs a path without its query: a key a client put in the query string stays out of the log', async () => {
    const s = await startStack();
    const res = await fetch(`${s.url}/v1/nope?key=secret-in-query&api_key=secret-2`, { headers: { 'x-request-id': 'q' } });
    expect(res.status).toBe(404);
    await res.arrayBuffer();
    const line = lines(s.logs).find((l) => l.reqId === 'q');
    expect(line).toMatchObject({ path: '/v1/nope', status: 404 });
    expect(s.logs.join('')).not.toContain('secret-');
  });

  it('cuts a client\'s unknown x-stormgate-priority to 64 characters in the line: a header cannot bloat every line', async () => {
    const s = await startStack();
    const asked = `batch-${'x'.repeat(300)}`;
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }, { headers: { 'x-stormgate-priority': asked, 'x-request-id': 'p' } });
    const line = lines(s.logs).find((l) => l.reqId === 'p');
    expect(line?.unknownPriority).toBe(asked.slice(0, 64));
  });

  it('always writes, at warn, the line of a stream one malformed event was dropped from, however few plain successes are kept', async () => {
    const s = await startStack({
      faults: { models: { 'gpt-4o-mini': { stream: { chunks: 5, malformedAtChunk: 2 } } } },
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl);
        return { ...base, server: { ...base.server, logSuccessRate: 0 } };
      },
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    for (const [model, id] of [['gpt-4o', 'plain'], ['gpt-4o-mini', 'dropped']] as const) {
      const stream = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }], stream: true }, { headers: { 'x-request-id': id } });
      for await (const _ of stream);
    }
    // The line is written once the stream has closed on the gateway's side, which may come after the client's last read.
    await eventually(() => lines(s.logs).length > 0, 5_000);
    const written = lines(s.logs);
    expect(written.map((l) => l.reqId)).toEqual(['dropped']);
    expect(written[0]).toMatchObject({ level: 40, msg: 'stream events dropped as malformed', droppedMalformed: 1, streamEnd: 'complete', outcome: 'success' });
  });
});

describe('the gauges read at scrape time', () => {
  const T = 1_700_000_000_000;
  /** A gateway of one route to p/m, whose pool has also served the learnt key p/other, over fake state. */
  function scraped(state: { breaker?: Record<string, { state: string; openUntilMs: number }>; until?: Record<string, number>; creds?: Record<string, number>; flex?: Record<string, number> }) {
    let now = T;
    const config = ConfigSchema.parse({
      providers: { p: { family: 'openai', baseUrl: 'http://127.0.0.1:9/v1', apiKey: 'p-key-0123456789' } },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'p', model: 'm' }] }],
    });
    const m = createMetrics({ defaultMetrics: false });
    const pool = { settings: { provider: 'p', classes: [] }, snapshot: () => ({ inUse: [], queued: [], clients: [], limits: [['p/other', 7.6]] }) };
    collectAtScrape(m, {
      config,
      targetKeys: new TargetKeys(config, () => now),
      pools: { all: () => [pool] } as never,
      bodies: { bytes: 0 } as never,
      board: { current: (t: string) => state.breaker?.[t] ?? { state: 'closed', openUntilMs: 0 } } as never,
      holdOffs: { until: (t: string) => state.until?.[t], credentialsHeldUntil: (t: string) => state.creds?.[t], flexTierUntil: (t: string) => state.flex?.[t] } as never,
      budget: { remainingByRoute: async () => new Map([['chat', 7]]) } as never,
      now: () => now,
      breakersChanged: () => [],
      holdsLearnt: () => [],
    });
    const read = async (name: string) =>
      parseMetrics(await m.registry.metrics())
        .filter((x) => x.name === name)
        .map((x) => [Object.values(x.labels).join(' '), x.value]);
    return { read, at: (ms: number) => (now = T + ms) };
  }

  it('shows an open breaker as half-open from the moment its open time is over, for served learnt keys too', async () => {
    const g = scraped({ breaker: { 'p/m': { state: 'open', openUntilMs: T + 5_000 }, 'p/other': { state: 'half-open', openUntilMs: 0 } } });
    g.at(4_999);
    expect(await g.read('stormgate_breaker_state')).toEqual([['p/m', 1], ['p/other', 2]]);
    g.at(5_000);
    expect(await g.read('stormgate_breaker_state')).toEqual([['p/m', 2], ['p/other', 2]]);
    expect(await g.read('stormgate_pool_limit')).toEqual([['p/other', 7]]);
    expect(await g.read('stormgate_retry_budget_remaining')).toEqual([['chat', 7]]);
  });

  it('shows each hold in seconds left, by kind, 0 once over; a flex tier\'s series only while held; credentials held as 1', async () => {
    const flex: Record<string, number> = { 'p/m': T + 1_000 };
    const g = scraped({ until: { 'p/m': T + 2_500 }, creds: { 'p/other': T + 60_000 }, flex });
    expect(await g.read('stormgate_credentials_held')).toEqual([['p/m', 0], ['p/other', 1]]);
    expect(await g.read('stormgate_hold_remaining_seconds')).toEqual([
      ['p/m hold_off all', 2.5],
      ['p/m credentials all', 0],
      ['p/m hold_off flex', 1],
      ['p/other hold_off all', 0],
      ['p/other credentials all', 60],
    ]);
    g.at(3_000);
    expect((await g.read('stormgate_hold_remaining_seconds')).slice(0, 3)).toEqual([
      ['p/m hold_off all', 0],
      ['p/m credentials all', 0],
      ['p/m hold_off flex', 0],
    ]);
    delete flex['p/m']; // the store forgot the flex tier's hold
    expect((await g.read('stormgate_hold_remaining_seconds')).map(([labels]) => labels)).not.toContain('p/m hold_off flex');
  });
});

describe('the series a fresh gateway starts at zero', () => {
  const config = ConfigSchema.parse({
    providers: {
      p: { family: 'openai', baseUrl: 'http://127.0.0.1:9/v1', apiKey: 'p-key-0123456789' },
      q: { family: 'openai', baseUrl: 'http://127.0.0.1:9/v1', apiKey: 'q-key-0123456789', breaker: { failureRate: 0.6 } },
    },
    routes: [
      {
        name: 'chat',
        match: { path: '/v1/responses', models: ['gpt-*', 'a'] },
        targets: [{ provider: 'p' }, { provider: 'q' }, { provider: 'p', model: 'c' }],
        streamRecovery: 'continue',
      },
    ],
    auth: { keys: { team: 'team-key-0123456789' }, limits: { team: { tokensPerMinute: 1000 } } },
    passthrough: { provider: 'p', paths: ['/v1/files'] },
  });
  const fresh = async () => {
    const m = createMetrics({ defaultMetrics: false });
    const keys = new TargetKeys(config, () => 0);
    const series = zeroSeries(config, m, keys);
    const has = async (name: string, labels: Record<string, string>) =>
      parseMetrics(await m.registry.metrics()).some((x) => x.name === name && x.value === 0 && Object.entries(labels).every(([k, v]) => x.labels[k] === v));
    return { m, series, has };
  };

  it('every hand-over of a route, to each later target, every outcome, status class, retry reason and hold of its target keys', async () => {
    const { has, m } = await fresh();
    const expected: Array<[string, Record<string, string>]> = [
      ['stormgate_retried_requests_total', { route: 'chat', result: 'failure' }],
      ['stormgate_fallbacks_total', { from: 'p/a', to: 'q/a', reason: 'breaker_open' }],
      ['stormgate_fallbacks_total', { from: 'q/a', to: 'p/c', reason: 'held_off' }],
      ['stormgate_fallbacks_total', { from: 'p/a', to: 'p/c', reason: 'retries_exhausted' }],
      ['stormgate_park_outcomes_total', { route: 'chat', outcome: 'timeout' }],
      ['stormgate_ttft_seconds_count', { route: 'chat' }],
      ['stormgate_stream_ends_total', { route: 'chat', end: 'cut' }],
      ['stormgate_breaker_transitions_total', { target: 'p/a', to: 'open' }],
      ['stormgate_breaker_transitions_total', { target: 'q/a', to: 'half-open' }],
      ['stormgate_retry_count_total', { target: 'q/a', reason: 'stream_cut' }],
      ['stormgate_retry_count_total', { target: 'p/c', reason: 'stream_stalled' }],
      ['stormgate_client_limited_total', { client: 'team', by: 'tokens' }],
      ['stormgate_passthrough_requests_total', { path: '/v1/files', status_class: 'client_gone' }],
      ['stormgate_upstream_attempts_total', { target: 'p/c', status_class: 'internal' }],
      ['stormgate_upstream_attempts_total', { target: 'q/a', status_class: 'aborted' }],
      ['stormgate_holds_started_total', { target: 'p/a', kind: 'credentials', reason: 'status_401' }],
      ['stormgate_holds_started_total', { target: 'q/a', kind: 'hold_off', tier: 'flex', reason: 'status_498' }],
    ];
    const missing = [];
    for (const [name, labels] of expected) if (!(await has(name, labels))) missing.push([name, labels]);
    expect(missing).toEqual([]);
    // A pattern names no key: no series is made up for one no request uses; nor a rate the client has none of.
    const text = await m.registry.metrics();
    expect(text).not.toContain('gpt-*');
    expect(text).not.toContain('p/other');
    expect(text).not.toMatch(/stormgate_client_limited_total\{client="team",by="requests"\}/);
  });

  it('starts a given-back key\'s series at zero again when a request brings it back', async () => {
    const { m, series, has } = await fresh();
    series.zeroOnce('chat', 'p/learnt');
    expect(await has('stormgate_upstream_attempts_total', { target: 'p/learnt', status_class: '5xx' })).toBe(true);
    await forgetTargetSeries(m, 'p/learnt');
    series.forget('p/learnt');
    expect(await has('stormgate_upstream_attempts_total', { target: 'p/learnt', status_class: '5xx' })).toBe(false);
    series.zeroOnce('chat', 'p/learnt');
    expect(await has('stormgate_upstream_attempts_total', { target: 'p/learnt', status_class: '5xx' })).toBe(true);
  });
});

describe('stormgate_requests_total on a fresh gateway', () => {
  it('starts every outcome at zero under each priority class a route\'s requests can take (x-stormgate-priority lowers it), so a batch burst shows in increase()', async () => {
    const s = await startStack({
      faults: { models: { m: { errors: [{ status: 400, rate: 1 }] } } },
      config: (mockUrl) => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: { mock: { family: 'openai', baseUrl: `${mockUrl}/v1`, apiKey: TEST_KEY } },
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock', model: 'm' }], park: false }],
      }),
    });
    const series = async (priority: string) =>
      (await scrapeMetrics(s.url))
        .filter((x) => x.name === 'stormgate_requests_total' && x.labels.route === 'chat' && x.labels.priority === priority)
        .map((x) => [x.labels.outcome, x.value]);
    const zeroes = (await series('online')).map(([outcome]) => [outcome, 0]);
    expect(zeroes.length).toBeGreaterThan(5);
    expect(await series('batch')).toEqual(zeroes);
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    const err = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }, { headers: { 'x-stormgate-priority': 'batch' } }).catch((e: unknown) => e);
    expect((err as { status?: number }).status).toBe(400);
    expect((await series('batch')).filter(([, v]) => v !== 0)).toEqual([['invalid_request', 1]]);
  });
});
