// An SRE's adversarial review of the metrics and the request log (2026-12-06), driven over real HTTP against the
// bundled mock: clients that send made-up model names, paths and priorities by the thousand, aborts mid-retry,
// deadlines, cut streams and failovers while Prometheus scrapes, and upstream errors that echo the provider's key.
// What the README promises (labels bounded to config names and fixed sets, one line per request, no key in a log)
// is checked against ground truth: the mock's own count of what it was sent.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { MAX_LEARNED_MODELS } from '../src/routing/target-keys.ts';
import { pooled } from './helpers/in-process.ts';
import { chatChunk, useFakeProviders } from './helpers/fake-provider.ts';
import { scripted } from './helpers/scripted-provider.ts';
import { configServedBy, parseMetrics, RETRY_LOOP_ONLY, TEST_KEY, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';

const stack = useStacks();
const extraMocks = useExtraMocks();
const fakeProviders = useFakeProviders();

const chat = (s: Stack, body: Record<string, unknown>, init: { headers?: Record<string, string>; signal?: AbortSignal } = {}) =>
  fetch(`${s.url}/v1/chat/completions`, {
    method: 'POST',
    signal: init.signal,
    headers: { 'content-type': 'application/json', ...init.headers },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], ...body }),
  });

const scrapeText = async (s: Stack) => (await fetch(`${s.url}/metrics`)).text();

/** Every target key a scrape names (the `target` label, and a hand-over's `from` and `to`). */
function targetsOf(samples: ReturnType<typeof parseMetrics>): Set<string> {
  const keys = samples.flatMap((x) => (x.name === 'stormgate_fallbacks_total' ? [x.labels.from, x.labels.to] : [x.labels.target]));
  return new Set(keys.filter((t): t is string => t !== undefined && t !== 'none'));
}

/** What is wrong with a Prometheus text exposition: bad lines, a family without HELP/TYPE or with two, a series twice, a value no stormgate metric may have. */
function expositionProblems(text: string): string[] {
  const problems: string[] = [];
  const help = new Set<string>();
  const type = new Map<string, string>();
  const series = new Set<string>();
  for (const line of text.split('\n')) {
    if (line === '') continue;
    const comment = /^# (HELP|TYPE) (\S+) (.*)$/.exec(line);
    if (comment) {
      const [, kind, name] = comment;
      const seen = kind === 'HELP' ? help.has(name!) : type.has(name!);
      if (seen) problems.push(`${kind} twice: ${name}`);
      if (kind === 'HELP') help.add(name!);
      else type.set(name!, comment[3]!);
      continue;
    }
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$/.exec(line);
    if (!m) {
      problems.push(`unparsable: ${line}`);
      continue;
    }
    const [, name, labels = '', raw] = m;
    if (series.has(name + labels)) problems.push(`series twice: ${name}${labels}`);
    series.add(name + labels);
    const family = type.has(name!) ? name! : name!.replace(/_(bucket|sum|count)$/, '');
    if (!type.has(family) || !help.has(family)) problems.push(`no HELP/TYPE before ${name}`);
    if (!name!.startsWith('stormgate_')) continue;
    const value = Number(raw);
    if (!Number.isFinite(value) || value < 0) problems.push(`value ${raw}: ${line}`);
    if (name!.endsWith('_rate') && value > 1) problems.push(`ratio above 1: ${line}`);
  }
  return problems;
}

describe('label cardinality against clients that make names up', () => {
  it('2,000 requests with distinct model names, paths and priorities grow no label past the learned-model allowance', async () => {
    const s = await stack();
    await pooled(2_000, 32, async (i) => {
      const model = `made-up-${randomUUID()}`;
      const res =
        i % 4 === 0
          ? await chat(s, { model }, { headers: { 'x-stormgate-priority': `tier-${randomUUID()}` } })
          : i % 4 === 1
            ? await fetch(`${s.url}/v1/${randomUUID()}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' })
            : i % 4 === 2
              ? await fetch(`${s.url}/${randomUUID()}/x?key=${randomUUID()}`)
              : await fetch(`${s.url}/v1/embeddings`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model, input: 'x' }) });
      await res.arrayBuffer();
    });
    const samples = parseMetrics(await scrapeText(s));
    const targets = targetsOf(samples);
    // The first names learned keep their places; every later one shares `mock/other`.
    expect(targets.has('mock/other')).toBe(true);
    expect(targets.size).toBeLessThanOrEqual(MAX_LEARNED_MODELS + 1);
    // No client text reaches another label: priorities are the pool's classes, routes the config's.
    expect(new Set(samples.map((x) => x.labels.priority).filter(Boolean))).toEqual(new Set(['online', 'batch', 'none']));
    expect(new Set(samples.map((x) => x.labels.route).filter(Boolean))).toEqual(new Set(['chat', 'embeddings', 'completions', 'responses', 'none']));
    for (const x of samples) for (const v of Object.values(x.labels)) expect(v).not.toMatch(/[0-9a-f]{8}-[0-9a-f]{4}-.*tier|\/x$/);
    // The 1,000 on paths no route serves (404 unknown_url) are counted, as rejected, under no route: a client with a
    // wrong base URL shows on the dashboards, not only in the logs.
    const rejected = samples.find((x) => x.name === 'stormgate_requests_total' && x.labels.route === 'none' && x.labels.outcome === 'rejected');
    expect(rejected?.value).toBe(1_000);
    // One request line each, paths without their query (a key in it stays out of the log).
    const lines = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.reqId !== undefined);
    expect(lines).toHaveLength(2_000);
    expect(new Set(lines.map((l) => l.reqId)).size).toBe(2_000);
    expect(s.logs.join('')).not.toContain('?key=');
  }, 120_000);

  it('made-up names the provider answers 404 leave no series behind, scraped while they come and go', async () => {
    const s = await stack({ faults: { latencyMs: 5, latencyJitterMs: 20, errors: [{ status: 404, code: 'model_not_found', param: 'model', rate: 0.5 }, { status: 503, rate: 0.2 }] } });
    let stop = false;
    const problems: string[] = [];
    const scraper = (async () => {
      while (!stop) problems.push(...expositionProblems(await scrapeText(s)));
    })();
    await pooled(1_500, 40, async (i) => {
      const res = await chat(s, { model: i % 3 === 0 ? `kept-${i % 45}` : `m-${randomUUID()}`, stream: i % 2 === 0 });
      await res.arrayBuffer();
    });
    stop = true;
    await scraper;
    expect(problems).toEqual([]);
    const last = parseMetrics(await scrapeText(s));
    const targets = targetsOf(last);
    expect(targets.size).toBeLessThanOrEqual(MAX_LEARNED_MODELS + 1);
  }, 120_000);

  it('a made-up name streaming while its twin gets the 404 leaves no series and no pool entry once the stream ends', async () => {
    const fake = await fakeProviders(
      scripted((body) =>
        body.stream
          ? { steps: [chatChunk({ role: 'assistant', content: 'a' }, null), 300, chatChunk({ content: 'b' }, 'stop'), 'data: [DONE]\n\n'] }
          : { status: 404, headers: { 'content-type': 'application/json' }, steps: [JSON.stringify({ error: { message: 'The model does not exist', type: 'invalid_request_error', code: 'model_not_found', param: null } })] },
      ),
    );
    const s = await stack({ config: (u) => configServedBy(u, 'fake', `${fake.origin}/v1`) });
    // Ten names, each sent twice at once: a stream the provider serves, and a request it answers 404.
    await Promise.all(
      Array.from({ length: 10 }, async (_, i) => {
        const model = `made-up-twice-${i}`;
        const streamed = chat(s, { model, stream: true });
        await sleep(100);
        const refused = await chat(s, { model });
        expect(refused.status).toBe(404);
        await refused.arrayBuffer();
        const res = await streamed;
        expect(res.status).toBe(200);
        expect(await res.text()).toContain('[DONE]');
      }),
    );
    await sleep(300);
    const samples = parseMetrics(await scrapeText(s));
    // None names them: not the counters of the streams that ended after the 404, nor the scrape-time gauges of their
    // pool entries (stormgate_pool_limit, the breaker's and the holds').
    expect(samples.filter((x) => x.labels.target?.includes('made-up-twice')).map((x) => `${x.name}${JSON.stringify(x.labels)}`)).toEqual([]);
    // Each request is counted once all the same: the streams under the shared key, the 404s under the route's.
    const requests = samples.filter((x) => x.name === 'stormgate_requests_total');
    expect(requests.reduce((a, x) => a + x.value, 0)).toBe(20);
    expect(requests.find((x) => x.labels.target === 'fake/other' && x.labels.outcome === 'success')?.value).toBe(10);
  }, 30_000);
});

describe('metrics under failures, aborts and failover, scraped concurrently', () => {
  it('every scrape is valid exposition text, ratios stay in 0..1, gauges settle at 0, and each request is counted and logged once', async () => {
    const backup = await extraMocks({ apiKey: 'backup-key' });
    const s = await stack({
      faults: { latencyMs: 20, latencyJitterMs: 30, errors: [{ status: 503, rate: 0.3 }, { status: 429, rate: 0.05, headers: { 'retry-after': '0.2' } }], resetRate: 0.05, stream: { chunkDelayMs: 10, chunks: 6 } },
      config: (mockUrl) => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: {
          mock: { family: 'openai', baseUrl: `${mockUrl}/v1`, apiKey: TEST_KEY, maxConnections: 8, pools: { classes: { online: { minShare: 0.5, maxQueue: 20 }, batch: { minShare: 0.1, maxQueue: 20 } } } },
          backup: { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: 'backup-key', maxConnections: 64 },
        },
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock', model: 'gpt-4o' }, { provider: 'backup', model: 'gpt-4o-mini' }], timeoutMs: 3_000, park: { maxQueue: 30 } }],
      }),
    });
    let arrived = 0;
    s.gateway.server.on('request', (req: { url?: string }) => {
      if (req.url?.startsWith('/v1/chat')) arrived++;
    });
    const problems: string[] = [];
    let stop = false;
    let scrapes = 0;
    const scraper = (async () => {
      while (!stop) {
        problems.push(...expositionProblems(await scrapeText(s)));
        scrapes++;
      }
    })();
    await pooled(600, 24, async (i) => {
      const ac = new AbortController();
      if (i % 5 === 0) setTimeout(() => ac.abort(), 5 + (i % 60));
      try {
        const headers: Record<string, string> = { ...(i % 7 === 0 && { 'x-stormgate-timeout-ms': '50' }), ...(i % 4 === 0 && { 'x-stormgate-priority': 'batch' }) };
        const res = await chat(s, { model: 'gpt-4o', stream: i % 2 === 0, messages: [{ role: 'user', content: `hi ${i}` }] }, { signal: ac.signal, headers });
        await res.arrayBuffer();
      } catch {
        // aborted by the test
      }
    });
    await sleep(1_000);
    stop = true;
    await scraper;
    const text = await scrapeText(s);
    expect([...new Set([...problems, ...expositionProblems(text)])]).toEqual([]);
    expect(scrapes).toBeGreaterThan(5);
    const samples = parseMetrics(text);
    const sum = (name: string) => samples.filter((x) => x.name === name).reduce((a, x) => a + x.value, 0);
    for (const gauge of ['stormgate_parked_requests', 'stormgate_pool_in_use', 'stormgate_pool_queue_depth', 'stormgate_waiting_body_bytes']) expect(sum(gauge), gauge).toBe(0);
    // Every request that reached the gateway is counted once and has one line.
    expect(sum('stormgate_requests_total')).toBe(arrived);
    const lines = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.reqId !== undefined);
    expect(lines).toHaveLength(arrived);
    expect(new Set(lines.map((l) => l.reqId)).size).toBe(arrived);
    // The fallback counter and the hand-overs agree with the log lines.
    expect(sum('stormgate_fallback_requests_total')).toBe(lines.filter((l) => l.outcome === 'success' && l.fallback !== undefined).length);
  }, 120_000);

  it('clients leaving mid-retry: the attempts and retries counted are the ones the provider saw, and the log says the same', async () => {
    const s = await stack({
      ...RETRY_LOOP_ONLY,
      route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 5, backoff: { baseMs: 30, capMs: 60 } } } as never,
      faults: { latencyMs: 40, latencyJitterMs: 40, errors: [{ status: 503, rate: 0.7 }], stream: { chunkDelayMs: 15, chunks: 6 } },
    });
    await pooled(300, 30, async (i) => {
      const ac = new AbortController();
      setTimeout(() => ac.abort(), 30 + ((i * 37) % 300));
      try {
        const res = await chat(s, { model: 'gpt-4o', stream: i % 2 === 0, messages: [{ role: 'user', content: `hi ${i}` }] }, { signal: ac.signal });
        await res.arrayBuffer();
      } catch {
        // aborted by the test
      }
    });
    await sleep(1_000);
    const seen = (await (await fetch(`${s.mock.url}/_mock/requests?limit=100000`)).json()) as Array<{ headers?: Record<string, string> }>;
    const retriesSeen = seen.filter((r) => (r.headers?.['x-retry-attempt'] ?? '0') !== '0').length;
    const samples = parseMetrics(await scrapeText(s));
    const sum = (name: string) => samples.filter((x) => x.name === name).reduce((a, x) => a + x.value, 0);
    const attempts = sum('stormgate_upstream_attempts_total');
    const retries = sum('stormgate_retry_count_total');
    // An attempt the client's leaving cut off while its body was on the way may never reach the mock's log: only those
    // (status class `aborted`) may be missing there.
    const aborted = samples.filter((x) => x.name === 'stormgate_upstream_attempts_total' && x.labels.status_class === 'aborted').reduce((a, x) => a + x.value, 0);
    expect(attempts).toBeGreaterThanOrEqual(seen.length);
    expect(attempts - seen.length).toBeLessThanOrEqual(Math.min(aborted, 3));
    expect(retries).toBeGreaterThanOrEqual(retriesSeen);
    expect(retries - retriesSeen).toBeLessThanOrEqual(attempts - seen.length);
    // The log lines say exactly what the counters count.
    const lines = s.logs.map((l) => JSON.parse(l) as { reqId?: string; attempts?: Array<{ attempt: number }> }).filter((l) => l.reqId !== undefined);
    expect(lines.reduce((a, l) => a + (l.attempts?.length ?? 0), 0)).toBe(attempts);
    expect(lines.reduce((a, l) => a + (l.attempts?.filter((x) => x.attempt > 0).length ?? 0), 0)).toBe(retries);
    // Clients that left are neither a retry's success nor its failure.
    const rate = samples.find((x) => x.name === 'stormgate_retry_success_rate');
    if (rate) expect(rate.value).toBeGreaterThanOrEqual(0);
  }, 60_000);
});

describe('keys in the log', () => {
  for (const status of [400, 404, 422, 429, 500, 503, 401]) {
    it(`an upstream ${status} that quotes the provider's key in every field reaches neither the log, the metrics nor the client`, async () => {
      const s = await stack({ ...RETRY_LOOP_ONLY, faults: { errors: [{ status, code: TEST_KEY, param: `key=${TEST_KEY}`, type: TEST_KEY, message: `bad key ${TEST_KEY}` }] } });
      for (const stream of [false, true]) {
        const res = await chat(s, { model: 'gpt-4o', stream }, { headers: { authorization: 'Bearer client-secret' } });
        expect(await res.text()).not.toContain(TEST_KEY);
        for (const [, v] of res.headers) expect(v).not.toContain(TEST_KEY);
      }
      await sleep(200);
      const logs = s.logs.join('');
      expect(logs).not.toContain(TEST_KEY);
      expect(logs).not.toContain('client-secret');
      expect(await scrapeText(s)).not.toContain(TEST_KEY);
    });
  }
});
