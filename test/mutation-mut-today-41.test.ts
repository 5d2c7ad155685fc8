// Mutation round 41 on the day's changes (an answer past idempotency.memoryBytes kept as not kept, auth.priority and
// a contextWindowFallback checked against every routed provider's classes, the wait histograms to 120 s, a keyed
// stream started at its client's deadline): a test for each mutant the existing tests let live.
import { request as httpRequest, type IncomingMessage, type ServerResponse } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { createMetrics } from '../src/observability/metrics.ts';
import { KeptKeys } from '../src/state/kept-keys.ts';
import { chatChunk as chunk, eventStream, useFakeProviders, type FakeProvider } from './helpers/fake-provider.ts';
import { configServedBy, defaultConfig, parseMetrics, requestLine, useStacks, type Stack } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();

describe('an answer and idempotency.memoryBytes (KeptKeys.settle)', () => {
  const answerOf = (bodyBytes: number) => ({ status: 200, headers: { 'content-type': 'application/json' }, kind: 'whole' as const, body: Buffer.alloc(bodyBytes, 0x20) });
  const done = (bodyBytes: number) => ({ state: 'done' as const, fingerprint: 'fp', bytes: bodyBytes, answer: answerOf(bodyBytes) });

  it('an answer whose body fits the cap but whose record (key, headers, overhead) does not is kept as not kept, not stored and dropped', () => {
    const keys = new KeptKeys(1_000);
    keys.settle('k', done(900), 60_000, 0);
    // Its body alone (900) fits; what the cap counts of it does not: a repeat is told, not run again.
    expect(keys.read('k', 1)).toEqual({ state: 'done', fingerprint: 'fp', bytes: 900 });
  });

  it('an answer whose record is exactly the cap is kept whole, as eviction lets a store hold exactly its cap', () => {
    // The bytes the store counts for one such record, found by eviction alone: the smallest cap that holds two.
    const twoFit = (cap: number) => {
      const keys = new KeptKeys(cap);
      keys.settle('a', done(100), 60_000, 0);
      keys.settle('b', done(100), 60_000, 0);
      return keys.read('a', 1) !== undefined;
    };
    let cap = 1;
    while (!twoFit(cap)) cap++;
    const recordBytes = cap / 2;
    expect(Number.isInteger(recordBytes)).toBe(true);
    const atCap = new KeptKeys(recordBytes);
    atCap.settle('c', done(100), 60_000, 0);
    expect(atCap.read('c', 1)).toMatchObject({ answer: { body: answerOf(100).body } });
    const belowCap = new KeptKeys(recordBytes - 1);
    belowCap.settle('c', done(100), 60_000, 0);
    expect(belowCap.read('c', 1)).toEqual({ state: 'done', fingerprint: 'fp', bytes: 100 });
  });
});

describe('a repeat of a key whose answer passed idempotency.memoryBytes', () => {
  it('is told so by name: 409 idempotency_answer_not_kept naming memoryBytes, not maxAnswerBytes alone, which it did not pass', async () => {
    const s = await startStack({ config: (url) => ({ ...defaultConfig(url), idempotency: { memoryBytes: 512 } }) });
    const body = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    const post = () => fetch(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': 'mem-1' }, body });
    expect((await post()).status).toBe(200);
    const repeat = await post();
    expect(repeat.status).toBe(409);
    const { error } = (await repeat.json()) as { error: { code: string; message: string } };
    expect(error.code).toBe('idempotency_answer_not_kept');
    expect(error.message).toContain('idempotency.memoryBytes');
  });
});

describe("auth.priority checked against every provider a route sends to (and a fallback's)", () => {
  const provider = (classes?: Record<string, { minShare: number }>) => ({ family: 'openai' as const, baseUrl: 'http://127.0.0.1:9/v1', apiKey: 'k', ...(classes && { pools: { classes } }) });
  const local = { interactive: { minShare: 0.5 }, bulk: { minShare: 0.1 } };
  const jobsAt = (cls: string): ConfigInput['auth'] => ({ keys: { jobs: 'sk-jobs-0000000000000001' }, priority: { jobs: cls } });
  const issuesOf = (input: ConfigInput): string[] => {
    const r = ConfigSchema.safeParse(input);
    return r.success ? [] : r.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`);
  };

  it('past a provider that has the class, still finds the next that lacks it, and names it once for two that lack it', () => {
    const issues = issuesOf({
      providers: { vllm: provider(local), openai: provider(), azure: provider() },
      routes: [
        { name: 'local', match: { path: '/v1/completions' }, priority: 'interactive', targets: [{ provider: 'vllm' }] },
        { name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'openai' }] },
        { name: 'embed', match: { path: '/v1/embeddings' }, targets: [{ provider: 'azure' }] },
      ],
      auth: jobsAt('bulk'),
    });
    expect(issues).toHaveLength(1);
    expect(issues[0]).toMatch(/^auth\.priority\.jobs: "bulk" is not a priority class of provider "openai", which route "chat" sends to/);
  });

  it('names the first route that sends to the provider, not the last', () => {
    const issues = issuesOf({
      providers: { vllm: provider(local), openai: provider() },
      routes: [
        { name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'openai' }] },
        { name: 'local', match: { path: '/v1/completions' }, priority: 'interactive', targets: [{ provider: 'vllm' }] },
        { name: 'embed', match: { path: '/v1/embeddings' }, targets: [{ provider: 'openai' }] },
      ],
      auth: jobsAt('bulk'),
    });
    expect(issues).toEqual([expect.stringMatching(/provider "openai", which route "chat" sends to/)]);
  });

  it('a class of no provider is one issue, not one more for each provider that lacks it', () => {
    const issues = issuesOf({
      providers: { vllm: provider(local), openai: provider() },
      routes: [
        { name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'openai' }] },
        { name: 'local', match: { path: '/v1/completions' }, priority: 'interactive', targets: [{ provider: 'vllm' }] },
      ],
      auth: jobsAt('nightly'),
    });
    expect(issues).toEqual([expect.stringMatching(/^auth\.priority\.jobs: "nightly" is not a priority class of any provider/)]);
  });

  it('a route to an unknown provider is reported as such, the auth.priority check passing over it (no TypeError)', () => {
    const issues = issuesOf({
      providers: { openai: provider() },
      routes: [
        { name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'openai' }] },
        { name: 'ghost', match: { path: '/v1/completions' }, targets: [{ provider: 'nowhere' }] },
      ],
      auth: jobsAt('batch'),
    });
    expect(issues).toEqual([expect.stringMatching(/^routes\.1\.targets\.0\.provider: .*nowhere/)]);
  });
});

describe('the wait histograms, between 30 s and 120 s', () => {
  it('tell a 45 s wait for a slot from a 97 s one, and a 97 s first token from a 45 s one: buckets at 60 and 120 in both', async () => {
    const m = createMetrics({ defaultMetrics: false });
    m.poolWait.observe({ provider: 'mock', priority: 'online' }, 45);
    m.ttft.observe({ route: 'chat' }, 97);
    const samples = parseMetrics(await m.registry.metrics());
    const bucket = (name: string, le: string) => samples.find((s) => s.name === name && s.labels.le === le)?.value;
    expect(bucket('stormgate_pool_wait_seconds_bucket', '30')).toBe(0);
    expect(bucket('stormgate_pool_wait_seconds_bucket', '60')).toBe(1);
    expect(bucket('stormgate_ttft_seconds_bucket', '60')).toBe(0);
    expect(bucket('stormgate_ttft_seconds_bucket', '120')).toBe(1);
  });
});

describe("a keyed stream and its client's deadline (x-stormgate-timeout-ms: 4000, the gateway's 3750 ms)", () => {
  const BODY = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'think' }], stream: true });
  const answer = chunk({ role: 'assistant', content: 'Hello' }, null) + chunk({}, 'stop') + 'data: [DONE]\n\n';

  /** The head at once, then the answer `afterMs` later. */
  const thinking = (res: ServerResponse, afterMs: number) => {
    res.flushHeaders();
    const timer = setTimeout(() => res.end(answer), afterMs);
    res.on('close', () => clearTimeout(timer));
  };

  const gatewayTo = (p: FakeProvider, routeTimeoutMs?: number): Promise<Stack> =>
    startStack({
      config: (mockUrl) => {
        const c = configServedBy(mockUrl, 'thinking', `${p.origin}/v1`);
        c.providers.thinking!.timeouts = { firstTokenMs: 20_000 };
        if (routeTimeoutMs !== undefined) c.routes = c.routes.map((r) => ({ ...r, timeoutMs: routeTimeoutMs }));
        return c;
      },
    });

  const post = (s: Stack, key: string, headers: Record<string, string> = {}) =>
    fetch(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key, ...headers }, body: BODY });

  it('that waited for an earlier run under its key (which gave the key back) starts at its deadline counted from its arrival, the wait included', async () => {
    let hits = 0;
    const p = await startProvider((req, res) => {
      hits++;
      if (hits === 1) {
        // The first run: refused after 3 s, a 4xx that gives the key back.
        req.resume();
        const timer = setTimeout(() => {
          res.writeHead(400, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ error: { message: 'refused once', type: 'invalid_request_error', code: 'invalid_value' } }));
        }, 3_000);
        res.on('close', () => clearTimeout(timer));
        return;
      }
      eventStream((r) => thinking(r, 6_000))(req, res);
    });
    const s = await gatewayTo(p);
    const first = post(s, 'waited-1');
    await sleep(300);
    const started = Date.now();
    const res = await post(s, 'waited-1', { 'x-stormgate-timeout-ms': '4000' });
    const headAfterMs = Date.now() - started;
    expect((await first).status).toBe(400);
    expect(res.status).toBe(200);
    // At 3750 ms from its arrival; counted from its own run's start (~2.7 s later) it came at ~6.5 s, past the client.
    expect(headAfterMs).toBeGreaterThan(2_500);
    expect(headAfterMs).toBeLessThan(5_200);
    expect(await res.text()).toContain('Hello');
    // Its own line, after the first run's (400).
    const lines = () => s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.route === 'chat');
    await expect.poll(() => lines()[1]).toMatchObject({ startedEarly: true, idempotency: 'run', streamEnd: 'complete' });
    expect(hits).toBe(2);
  });

  it('whose body took 2.5 s to arrive starts at its deadline counted from its head, the upload included', async () => {
    const p = await startProvider(eventStream((r) => thinking(r, 5_000)));
    const s = await gatewayTo(p);
    const body = Buffer.from(BODY);
    const started = Date.now();
    const head = await new Promise<IncomingMessage>((resolve, reject) => {
      const req = httpRequest(`${s.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'content-length': String(body.length), 'idempotency-key': 'slow-body-1', 'x-stormgate-timeout-ms': '4000' },
      });
      req.on('response', resolve);
      req.on('error', reject);
      req.write(body.subarray(0, 10));
      setTimeout(() => req.end(body.subarray(10)), 2_500);
    });
    const headAfterMs = Date.now() - started;
    expect(head.statusCode).toBe(200);
    // At 3750 ms from the head; counted from the body's end it came at ~6.25 s.
    expect(headAfterMs).toBeGreaterThan(2_500);
    expect(headAfterMs).toBeLessThan(5_000);
    let text = '';
    for await (const part of head) text += String(part);
    expect(text).toContain('Hello');
    expect(await requestLine(s)).toMatchObject({ startedEarly: true, idempotency: 'run' });
  });

  it("whose provider's head comes after the client's deadline: nothing to start then, and at the route's deadline it ends 504, not started", async () => {
    // Route timeoutMs 3000 (the gateway's 2750 ms); the client's 1000 (750 ms). The head comes at 1.5 s, the answer at 6.5 s.
    const p = await startProvider((req, res) => {
      req.resume();
      const timer = setTimeout(() => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        thinking(res, 5_000);
      }, 1_500);
      res.on('close', () => clearTimeout(timer));
    });
    const s = await gatewayTo(p, 3_000);
    const started = Date.now();
    const res = await post(s, 'late-head-1', { 'x-stormgate-timeout-ms': '1000' });
    const tookMs = Date.now() - started;
    expect(res.status).toBe(504);
    await res.text();
    // Bounded by the route's timeout, not the client's: held past 750 ms, ended at 2750 ms.
    expect(tookMs).toBeGreaterThan(2_000);
    expect(tookMs).toBeLessThan(5_000);
    expect(p.hits()).toBe(1);
  });
});

describe("a keyed stream's timer for its client's deadline", () => {
  const timers = () => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;

  it('is cleared when the stream starts and when the request fails before it: none left behind for the client\'s 100 s', async () => {
    // The gateway runs in this process: a timer left for each request would hold its context (its body) that long.
    const s = await startStack({ faults: { stream: { chunks: 3 }, errors: [{ status: 400, code: 'invalid_value', message: 'refused', times: 10 }] } });
    const body = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    const post = (key: string) =>
      fetch(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-stormgate-timeout-ms': '100000' }, body }).then(async (r) => {
        await r.text();
        return r.status;
      });
    const before = timers();
    const statuses: number[] = [];
    for (let i = 0; i < 20; i++) statuses.push(await post(`timer-${i}`));
    expect(statuses.filter((st) => st === 400)).toHaveLength(10);
    expect(statuses.filter((st) => st === 200)).toHaveLength(10);
    await sleep(200);
    // Ten of each; left behind, they would be ten more apiece.
    expect(timers() - before).toBeLessThan(5);
  });
});
