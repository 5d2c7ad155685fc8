// Breaker, hold-off, retry budget and parking on one gateway instance (in-process state), over real HTTP.
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it, vi } from 'vitest';
import { defaultConfig, useStacks, type Stack, metricSum, requestLine } from './helpers/stack.ts';
import { startMock } from '../src/mock/server.ts';
import { LEARNED_IDLE_MS, MAX_LEARNED_MODELS } from '../src/routing/target-keys.ts';
import { WatchingStore } from './helpers/watching-store.ts';

const start = useStacks();
const FAST = { maxAttempts: 3, backoff: { strategy: 'fixed' as const, baseMs: 5, capMs: 5 } };

async function chat(s: Stack, headers: Record<string, string> = {}, model = 'gpt-4o') {
  const res = await fetch(`${s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }] }),
  });
  return { res, body: (await res.json()) as { error?: { code: string; message: string } } };
}

/** Five failures in a row open the breaker; short deadlines keep these requests from parking for long. */
async function openBreaker(s: Stack): Promise<void> {
  await Promise.all(Array.from({ length: 5 }, () => chat(s, { 'x-stormgate-timeout-ms': '600' })));
}

describe('the circuit breaker', () => {
  it('opens after five failures in a row; then requests fail fast with 503 circuit_open and reach no upstream', async () => {
    const s = await start({ faults: { errors: [{ status: 503, rate: 1 }] }, route: { retry: { maxAttempts: 1 }, park: false } });
    for (let i = 0; i < 5; i++) expect((await chat(s)).res.status).toBe(503);
    await sleep(20);
    const { res, body } = await chat(s);
    expect(res.status).toBe(503);
    expect(body.error?.code).toBe('circuit_open');
    expect(body.error?.message).toContain('mock/gpt-4o');
    expect(res.headers.get('x-should-retry')).toBe('false');
    expect(Number(res.headers.get('retry-after'))).toBeGreaterThan(25);
    expect(s.mock.stats().total).toBe(5);
    expect(await metricSum(s, 'stormgate_breaker_state{target="mock/gpt-4o"}')).toBe(1);
  });

  it('reports an open breaker whose open time is over as half-open, though no request came to probe it', async () => {
    const s = await start({
      faults: { errors: [{ status: 503, rate: 1 }] },
      route: { retry: { maxAttempts: 1 }, park: false },
      provider: { breaker: { consecutiveFailures: 2, openS: 0.2 } },
    });
    for (let i = 0; i < 2; i++) await chat(s);
    expect(await metricSum(s, 'stormgate_breaker_state{target="mock/gpt-4o"}')).toBe(1);
    await sleep(400);
    expect(await metricSum(s, 'stormgate_breaker_state{target="mock/gpt-4o"}')).toBe(2);
  });

  it('keeps one model\'s outage from opening the breaker of the provider\'s other models', async () => {
    const s = await start({
      faults: { models: { 'gpt-4o': { errors: [{ status: 503, rate: 1 }] } } },
      route: { retry: { maxAttempts: 1 }, park: false, match: { path: '/v1/chat/completions', models: ['gpt-4o', 'gpt-4o-mini'] } },
    });
    for (let i = 0; i < 6; i++) await chat(s);
    expect((await chat(s)).body.error?.code).toBe('circuit_open');
    expect((await chat(s, {}, 'gpt-4o-mini')).res.status).toBe(200);
  });

  it('gives models the config does not name their own breaker too (a route that serves any model)', async () => {
    const s = await start({
      faults: { models: { 'gpt-broken': { errors: [{ status: 503, rate: 1 }] } } },
      route: { retry: { maxAttempts: 1 }, park: false },
    });
    for (let i = 0; i < 6; i++) await chat(s, {}, 'gpt-broken');
    const broken = await chat(s, {}, 'gpt-broken');
    expect(broken.body.error?.code).toBe('circuit_open');
    expect(broken.body.error?.message).toContain('mock/gpt-broken');
    const healthy = await chat(s, {}, 'gpt-4o');
    expect(healthy.res.status).toBe(200);
    expect(await metricSum(s, 'stormgate_breaker_state{target="mock/gpt-4o"}')).toBe(0);
  });

  it('gives back the learned place of a model the provider answers 404', async () => {
    const s = await start({ faults: { models: { 'no-such-model': { errors: [{ status: 404, code: 'model_not_found' }] } } } });
    expect((await chat(s, {}, 'no-such-model')).res.status).toBe(404);
    // Learned at first sight, forgotten at the 404: its next request is counted under mock/other.
    await chat(s, {}, 'no-such-model');
    await sleep(20);
    const text = await (await fetch(`${s.url}/metrics`)).text();
    // Its series went with its place: made-up names leave no label behind.
    expect(text).not.toContain('no-such-model');
    expect(text).toMatch(/stormgate_upstream_attempts_total\{target="mock\/other",status_class="4xx"\} 1/);
  });

  it('gives a learned model unused for an hour its place to a new name, and drops its series', async () => {
    // Only Date is faked: the runtime's clock jumps an hour, timers and sockets run as ever.
    vi.useFakeTimers({ toFake: ['Date'] });
    try {
      const s = await start({});
      for (let i = 0; i < MAX_LEARNED_MODELS; i++) expect((await chat(s, {}, `model-${i}`)).res.status).toBe(200);
      await chat(s, {}, 'gpt-new');
      expect(await metricSum(s, 'stormgate_upstream_attempts_total{target="mock/other",status_class="2xx"}')).toBe(1);
      vi.setSystemTime(Date.now() + LEARNED_IDLE_MS);
      await chat(s, {}, 'gpt-new');
      const text = await (await fetch(`${s.url}/metrics`)).text();
      expect(text).toMatch(/stormgate_upstream_attempts_total\{target="mock\/gpt-new",status_class="2xx"\} 1/);
      // model-0, the longest unused, gave its place: its series went with it.
      expect(text).not.toContain('mock/model-0"');
      expect(text).toContain('mock/model-1"');
    } finally {
      vi.useRealTimers();
    }
  });

  it('keeps no metric series for made-up model names, however many', async () => {
    const s = await start({ faults: { errors: [{ status: 404, code: 'model_not_found' }] } });
    for (let i = 0; i < 40; i++) expect((await chat(s, {}, `made-up-${i}`)).res.status).toBe(404);
    // Several at once for one name: each drops what it kept under the name's key.
    for (let i = 0; i < 10; i++) {
      const answers = await Promise.all([0, 1, 2].map(() => chat(s, {}, `made-up-together-${i}`)));
      for (const a of answers) expect(a.res.status).toBe(404);
    }
    await sleep(50);
    const text = await (await fetch(`${s.url}/metrics`)).text();
    expect(text).not.toContain('made-up-');
    expect(text).toMatch(/stormgate_requests_total\{route="chat",target="mock\/other",priority="online",outcome="invalid_request"\} 70/);
  });

  it('keeps no series for a made-up name whose other request ended otherwise after its 404 (a client that left)', async () => {
    // The name's first request is answered slowly, its second gets the 404 at once (a rate of 0.5 fails the second of
    // every two): the first is still in flight under the name's key when the second gives the key back.
    const s = await start({ faults: { models: { 'made-up-slow': { latencyMs: 5_000, errors: [{ status: 404, code: 'model_not_found', rate: 0.5 }] } } } });
    const leaving = new AbortController();
    const first = fetch(`${s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'made-up-slow', messages: [{ role: 'user', content: 'hi' }] }),
      signal: leaving.signal,
    }).catch(() => undefined);
    await vi.waitFor(() => expect(s.mock.stats().total).toBe(1));
    expect((await chat(s, {}, 'made-up-slow')).res.status).toBe(404);
    leaving.abort();
    await first;
    await vi.waitFor(() => expect(s.logs.some((l) => l.includes('"clientGone":true'))).toBe(true));
    await sleep(50);
    const text = await (await fetch(`${s.url}/metrics`)).text();
    expect(text).not.toContain('made-up-slow');
    expect(text).toMatch(/stormgate_requests_total\{route="chat",target="mock\/other",priority="online",outcome="client_gone"\} 1/);
  });

  it('forgets every state key a made-up model name was looked up under, its credential hold\'s included', async () => {
    // A store that notes which keys the gateway asked about: the Redis store watches each one (and re-reads them all
    // from Redis at every reconnect) until it is told to forget it.
    const store = new WatchingStore();
    const s = await start({ faults: { errors: [{ status: 404, code: 'model_not_found' }] }, deps: { store } });
    for (let i = 0; i < 20; i++) expect((await chat(s, {}, `made-up-${i}`)).res.status).toBe(404);
    await sleep(20);
    const kept = [...store.asked].filter((k) => k.includes('made-up-') && !store.forgotten.has(k));
    expect(store.asked.size).toBeGreaterThan(0);
    expect(kept).toEqual([]);
  });

  it('lets requests parked on an open breaker go at once when a probe finds the gateway\'s credentials refused', async () => {
    const s = await start({
      faults: { errors: [{ status: 503, rate: 1 }] },
      route: { retry: FAST, timeoutMs: 10_000 },
      provider: { breaker: { probeWhileParkedMs: 500, openS: 60 } },
    });
    await openBreaker(s);
    await sleep(20);
    // The key is revoked during the outage: the next probe gets 401 and starts a credential hold.
    s.mock.setFaults({ errors: [{ status: 401, code: 'invalid_api_key' }] });
    const started = Date.now();
    const answers = await Promise.all(Array.from({ length: 5 }, () => chat(s).then((a) => ({ ...a, at: Date.now() - started }))));
    for (const a of answers) expect(a.body.error?.code).toBe('upstream_auth_error');
    // All soon after the first probe (about 500 ms), not one per probe interval or at the deadline.
    expect(Math.max(...answers.map((a) => a.at))).toBeLessThan(2_000);
    expect(s.mock.stats().byStatus['401']).toBe(1);
  });

  it('parks requests during an outage, sends only probes upstream, and answers them when the provider recovers', async () => {
    const s = await start({
      faults: { errors: [{ status: 503, rate: 1 }] },
      route: { retry: FAST, timeoutMs: 10_000 },
      provider: { breaker: { probeWhileParkedMs: 300, closeAfter: 2 } },
    });
    await openBreaker(s);
    await sleep(20);
    const before = s.mock.stats().total;
    const pending = Array.from({ length: 20 }, () => chat(s));
    await sleep(1_000);
    const duringOutage = s.mock.stats().total - before;
    expect(duringOutage).toBeGreaterThanOrEqual(1);
    expect(duringOutage).toBeLessThanOrEqual(5);
    s.mock.setFaults({});
    const results = await Promise.all(pending);
    if (results.some((r) => r.res.status !== 200)) console.log(s.logs.filter((l) => l.includes('"status":503')).join('\n'));
    expect(results.map((r) => r.res.status)).toEqual(new Array(20).fill(200));
    expect(await metricSum(s, 'stormgate_park_outcomes_total{route="chat",outcome="released"}')).toBeGreaterThanOrEqual(20);
    expect(await metricSum(s, 'stormgate_parked_requests')).toBe(0);
  });

  it('backs off the probes of a long outage: a lone parked request sends a handful, not one every probeWhileParkedMs', async () => {
    const s = await start({
      faults: { errors: [{ status: 503, rate: 1 }] },
      route: { retry: FAST, timeoutMs: 3_000 },
      provider: { breaker: { probeWhileParkedMs: 100 } },
    });
    await openBreaker(s);
    await sleep(20);
    const before = s.mock.stats().total;
    const { res } = await chat(s);
    expect(res.status).toBe(503);
    // Probes 100, 200, 400, 800 and 1600 ms apart: at most 5 in its 3 s (one every 100 ms made about 25).
    const probes = s.mock.stats().total - before;
    expect(probes).toBeGreaterThanOrEqual(3);
    expect(probes).toBeLessThanOrEqual(5);
  });

  it('bounds a request\'s whole time parked by park.maxWaitMs, however many failed probes it lent its attempt to', async () => {
    const s = await start({
      faults: { errors: [{ status: 503, rate: 1 }] },
      route: { retry: FAST, timeoutMs: 10_000, park: { maxWaitMs: 1_500 } },
      provider: { breaker: { probeWhileParkedMs: 300 } },
    });
    await openBreaker(s);
    await sleep(20);
    const started = Date.now();
    const { res, body } = await chat(s);
    const tookMs = Date.now() - started;
    // Released to a probe that failed, it parked again, each time with a fresh 1.5 s: it waited for the probes 300,
    // 600 and 1,200 ms apart, then 1.5 s more for the next (2.4 s away), 3.6 s in all.
    expect(tookMs).toBeGreaterThanOrEqual(1_400);
    expect(tookMs).toBeLessThan(2_800);
    expect(res.status).toBe(503);
    expect(res.headers.get('x-should-retry')).toBe('false');
    expect(body.error).toBeDefined();
  });

  it('lets the next probe go when one hangs past its permit, instead of holding the parked requests to their deadline', async () => {
    const s = await start({
      faults: { errors: [{ status: 503, rate: 1 }] },
      route: { retry: FAST, timeoutMs: 9_000 },
      provider: { breaker: { probeWhileParkedMs: 200, closeAfter: 1 }, timeouts: { firstTokenMs: 700 } },
    });
    await openBreaker(s);
    // The provider hangs: the first probe never answers. Then it recovers.
    s.mock.setFaults({ hangRate: 1 });
    const pending = Array.from({ length: 5 }, () => chat(s));
    await sleep(500);
    s.mock.setFaults({});
    const started = Date.now();
    const doneAt: number[] = [];
    const results = await Promise.all(pending.map((p) => p.then((r) => (doneAt.push(Date.now() - started), r))));
    // The request that lent its attempt to the hung probe waits for it to its deadline; the others need not: the
    // probe's permit (firstTokenMs, 700 ms) is over long before their deadline (9 s), and the next probe goes then.
    expect(results.map((r) => r.res.status).sort()).toEqual([200, 200, 200, 200, 504]);
    expect(doneAt.sort((a, b) => a - b)[3]).toBeLessThan(4_000);
  });

  it('answers a parked request at its deadline with 504 and x-should-retry: false', async () => {
    const s = await start({ faults: { errors: [{ status: 503, rate: 1 }] }, route: { retry: FAST, minAttemptMs: 100 } });
    await openBreaker(s);
    // The provider now hangs: the probe released after probeWhileParkedMs never answers.
    s.mock.setFaults({ hangRate: 1 });
    const started = Date.now();
    const { res, body } = await chat(s, { 'x-stormgate-timeout-ms': '1500' });
    expect(res.status).toBe(504);
    expect(body.error?.code).toBe('deadline_exceeded');
    expect(res.headers.get('x-should-retry')).toBe('false');
    expect(Date.now() - started).toBeLessThan(1_500);
  });

  it('sends requests to the next target at once while the primary\'s breaker is open', async () => {
    const backup = await startMock({ quiet: true });
    try {
      const s = await start({
        faults: { errors: [{ status: 503, rate: 1 }] },
        config: (url) => {
          const base = defaultConfig(url, { route: { retry: { maxAttempts: 1 } } });
          return {
            ...base,
            providers: { ...base.providers, backup: { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: 'k' } },
            routes: base.routes.map((r) => ({ ...r, targets: [{ provider: 'mock' }, { provider: 'backup' }] })),
          };
        },
      });
      for (let i = 0; i < 5; i++) expect((await chat(s)).res.status).toBe(200);
      await sleep(20);
      const primaryBefore = s.mock.stats().total;
      const { res } = await chat(s);
      expect(res.status).toBe(200);
      expect(res.headers.get('x-stormgate-target')).toBe('backup/gpt-4o');
      expect(res.headers.get('x-stormgate-attempts')).toBe('1');
      expect(s.mock.stats().total).toBe(primaryBefore);
    } finally {
      await backup.close();
    }
  });
});

describe('hold-offs', () => {
  it('sends nothing to a target inside the window it asked for, then carries on', async () => {
    const s = await start({
      faults: { errors: [{ status: 429, rate: 1, times: 1, headers: { 'retry-after-ms': '800' } }] },
      route: { retry: FAST },
      provider: { breaker: false },
    });
    const first = chat(s);
    // The others start once the gateway has had the 429 (a fixed sleep is not enough on a busy machine: one of them
    // went out before the 429 came back, and no gateway can heed a hold-off it has not been told of yet).
    await vi.waitFor(async () => expect(await metricSum(s, 'stormgate_upstream_attempts_total{target="mock/gpt-4o",status_class="4xx"}')).toBe(1), { timeout: 5_000, interval: 10 });
    const others = Array.from({ length: 5 }, () => chat(s));
    const results = await Promise.all([first, ...others]);
    expect(results.every((r) => r.res.status === 200)).toBe(true);
    const [limited, ...rest] = s.mock.requests();
    expect(limited!.status).toBe(429);
    for (const r of rest) expect(r.receivedAt - limited!.receivedAt).toBeGreaterThanOrEqual(790);
  });

  it('answers 429 provider_held_off with retry-after and x-should-retry: true when it cannot park', async () => {
    const s = await start({
      faults: { errors: [{ status: 429, rate: 1, times: 1, headers: { 'retry-after': '5' } }] },
      route: { retry: { maxAttempts: 1 }, park: false },
    });
    expect((await chat(s)).res.status).toBe(429);
    const { res, body } = await chat(s);
    expect(res.status).toBe(429);
    expect(body.error?.code).toBe('provider_held_off');
    expect(res.headers.get('x-should-retry')).toBe('true');
    expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(4);
    expect(s.mock.stats().total).toBe(1);
  });

  it('holds off on a hint longer than maxWaitHintMs too (not retried, but nobody else goes meanwhile), for at most a minute', async () => {
    for (const [retryAfter, heldS] of [['30', 30], ['600', 60]] as const) {
      const s = await start({
        faults: { errors: [{ status: 429, rate: 1, times: 1, headers: { 'retry-after': retryAfter } }] },
        // Parking allowed: a hold-off longer than maxWaitHintMs is not waited out parked either.
        route: { retry: { maxAttempts: 3, maxWaitHintMs: 20_000 } },
      });
      const first = await chat(s);
      expect(first.res.status).toBe(429);
      // The provider's hint, to the end of the hold-off it started (its spread: at most a second more), plus the
      // request's own spread within a minute (at most a second more again).
      const told = Number(first.res.headers.get('retry-after'));
      expect(told).toBeGreaterThanOrEqual(Number(retryAfter));
      expect(told).toBeLessThanOrEqual(Number(retryAfter) + (Number(retryAfter) <= 60 ? 2 : 1));
      const { res, body } = await chat(s);
      expect(body.error?.code).toBe('provider_held_off');
      // The client is told what the provider asked for; the gateway holds off for at most a minute (plus its spread).
      const remaining = Number(res.headers.get('retry-after'));
      expect(remaining).toBeGreaterThanOrEqual(Number(retryAfter) - 2);
      expect(remaining).toBeLessThanOrEqual(Number(retryAfter) + (Number(retryAfter) <= 60 ? 2 : 1));
      expect(res.headers.get('x-should-retry')).toBe(Number(retryAfter) <= 60 ? 'true' : 'false');
      if (heldS < Number(retryAfter)) expect(body.error?.message).toMatch(/the gateway asks it again in (59|60|61) s/);
      expect(s.mock.stats().total).toBe(1);
    }
  });

  it('answers a newcomer that cannot wait out what holds the parked requests at once, with the real retry-after', async () => {
    const s = await start({
      faults: { errors: [{ status: 429, rate: 1, times: 1, headers: { 'retry-after': '2' } }] },
      route: { retry: { maxAttempts: 1 } },
      provider: { breaker: false },
    });
    expect((await chat(s)).res.status).toBe(429);
    const parked = chat(s); // parks for the 2 s hold-off
    await sleep(100);
    const started = Date.now();
    const { res, body } = await chat(s, { 'x-stormgate-timeout-ms': '1500' });
    // At once, not parked to its deadline (1.25 s): the bound leaves a loaded machine's lag room on both sides.
    expect(Date.now() - started).toBeLessThan(900);
    expect(res.status).toBe(429);
    expect(body.error?.code).toBe('provider_held_off');
    expect(res.headers.get('x-should-retry')).toBe('true');
    // The hold-off's 2 s and its spread, rounded up.
    expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(2);
    expect(Number(res.headers.get('retry-after'))).toBeLessThanOrEqual(3);
    expect((await parked).res.status).toBe(200);
  });

  it('keeps the wait of a request that got a hint within hint x [1, 1.2], its own hold-off included', async () => {
    const s = await start({
      faults: { errors: [{ status: 429, firstAttemptsOnly: true, headers: { 'retry-after-ms': '1000' } }] },
      route: { retry: { maxAttempts: 2 }, budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 } },
      provider: { breaker: false },
    });
    // One model each: each request's hint starts a hold-off of its own.
    const results = await Promise.all(Array.from({ length: 20 }, (_, i) => chat(s, {}, `gpt-hint-${i}`)));
    expect(results.every((r) => r.res.status === 200)).toBe(true);
    const byModel = new Map<string, number[]>();
    for (const r of s.mock.requests()) byModel.set(r.model!, [...(byModel.get(r.model!) ?? []), r.receivedAt]);
    for (const [model, [first, retry]] of byModel) {
      const waited = retry! - first!;
      expect(waited, model).toBeGreaterThanOrEqual(990);
      // 1.2 x 1000 ms, and timer slack for a loaded 2-core machine (20 requests' answers handled on one loop).
      expect(waited, model).toBeLessThanOrEqual(1_400);
    }
  });

  it('never holds a fleet off on x-ratelimit-reset-* hints', async () => {
    const s = await start({
      faults: { errors: [{ status: 429, rate: 1, times: 1, headers: { 'x-ratelimit-reset-requests': '5s', 'x-ratelimit-remaining-requests': '0' } }] },
      route: { retry: { maxAttempts: 1 }, park: false },
    });
    expect((await chat(s)).res.status).toBe(429);
    expect((await chat(s)).res.status).toBe(200);
  });
});

describe('the retry budget', () => {
  it('keeps retries within ratio x requests (with the floor) however bad the upstream is', async () => {
    const s = await start({
      faults: { errors: [{ status: 503, rate: 1 }] },
      route: { retry: FAST, park: false, budget: { ratio: 0.1, windowS: 10, minRetriesPerSecond: 0.1 } },
      provider: { breaker: false },
    });
    for (let i = 0; i < 30; i++) {
      const { res } = await chat(s);
      expect(res.status).toBe(503);
      expect(res.headers.get('x-should-retry')).toBe('false');
    }
    const retries = s.mock.stats().total - 30;
    expect(retries).toBeLessThanOrEqual(3);
    expect(retries).toBeGreaterThanOrEqual(1);
    expect(await metricSum(s, 'stormgate_retry_budget_exhausted_total')).toBeGreaterThan(0);
  });

  it('keeps a budget per priority class: a batch flood that spent its retries leaves the online requests theirs', async () => {
    const s = await start({
      faults: { errors: [{ status: 503, rate: 1 }] },
      route: { retry: FAST, park: false, budget: { ratio: 0.1, windowS: 10, minRetriesPerSecond: 0.1 } },
      provider: { breaker: false },
    });
    for (let i = 0; i < 30; i++) expect((await chat(s, { 'x-stormgate-priority': 'batch' })).res.status).toBe(503);
    const batchAttempts = s.mock.stats().total;
    expect(batchAttempts - 30).toBeLessThanOrEqual(3);
    // The batch budget is spent; the online one (floor: 1 retry in the window) is untouched.
    expect((await chat(s, { 'x-stormgate-priority': 'batch' })).res.status).toBe(503);
    expect(s.mock.stats().total).toBe(batchAttempts + 1);
    expect((await chat(s)).res.status).toBe(503);
    expect(s.mock.stats().total).toBe(batchAttempts + 3);
  });

  it('says so when the budget refused the retry: in the gateway\'s message and in the log line', async () => {
    const s = await start({
      faults: { resetRate: 1 },
      route: { retry: FAST, park: false, budget: { ratio: 0, windowS: 10, minRetriesPerSecond: 0 } },
      provider: { breaker: false },
    });
    const { res, body } = await chat(s);
    expect(res.status).toBe(502);
    expect(s.mock.stats().total).toBe(1);
    expect(body.error?.message).toMatch(/after 1 attempt \(last: .*\); not retried: the retry budget is spent$/);
    const line = await requestLine(s);
    expect(line).toMatchObject({ outcome: 'gateway_error', retriesStopped: 'budget' });
  });

  it('names the deadline, not a wait hint, when a backoff without any hint no longer fits before it', async () => {
    const s = await start({
      faults: { errors: [{ status: 500, rate: 1 }] },
      route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 2_000, capMs: 2_000 } }, park: false },
      provider: { breaker: false },
    });
    const { res } = await chat(s, { 'x-stormgate-timeout-ms': '1000' });
    expect(res.status).toBe(500);
    expect(s.mock.stats().total).toBe(1);
    const line = await requestLine(s);
    expect(line).toMatchObject({ outcome: 'upstream_error', retriesStopped: 'deadline' });
  });

  it('serves a client-declared retry once but never retries it when the budget is spent', async () => {
    const s = await start({
      faults: { errors: [{ status: 503, rate: 1 }] },
      route: { retry: FAST, park: false, budget: { ratio: 0, windowS: 10, minRetriesPerSecond: 0 } },
      provider: { breaker: false },
    });
    const { res } = await chat(s, { 'x-stainless-retry-count': '1' });
    expect(res.status).toBe(503);
    expect(s.mock.stats().total).toBe(1);
  });
});

describe('parking limits', () => {
  it('rejects with 503 park_queue_full, retry-after and x-should-retry: true when the queue is full', async () => {
    const s = await start({ faults: { errors: [{ status: 503, rate: 1 }] }, route: { retry: { maxAttempts: 1 }, park: { maxQueue: 1 } } });
    await openBreaker(s);
    const parked = chat(s, { 'x-stormgate-timeout-ms': '3000' });
    await sleep(50);
    const { res, body } = await chat(s);
    expect(res.status).toBe(503);
    expect(body.error?.code).toBe('park_queue_full');
    expect(res.headers.get('x-should-retry')).toBe('true');
    expect(res.headers.get('retry-after')).toBeTruthy();
    await parked;
  });
});

describe('a newcomer after the provider is back, while the breaker still says open', () => {
  it('parks and probes at once when parked requests may probe, instead of a 503 until openS is over', async () => {
    const s = await start({
      faults: { errors: [{ status: 503, rate: 1, times: 1 }] },
      provider: { breaker: { consecutiveFailures: 1, openS: 30 } },
      route: { retry: { maxAttempts: 1 } },
    });
    expect((await chat(s)).res.status).toBe(503);
    // Past probeWhileParkedMs (1 s): a parked request may probe now, though openS (30 s) is far from over.
    await sleep(1_200);
    const { res } = await chat(s, { 'x-stormgate-timeout-ms': '5000' });
    expect(res.status).toBe(200);
    expect(s.mock.stats().total).toBe(2);
  });
});

describe('while another request holds the probe', () => {
  /** A breaker past openUntil whose one probe permit a slow request holds. */
  async function probing(park: boolean) {
    const s = await start({
      faults: { latencyMs: 50, errors: [{ status: 503, rate: 1, times: 1 }] },
      provider: { breaker: { consecutiveFailures: 1, openS: 1 } },
      route: { retry: { maxAttempts: 1 }, ...(park ? {} : { park: false }) },
    });
    expect((await chat(s, { 'x-stormgate-timeout-ms': '500' })).res.status).toBe(503);
    await sleep(1_100);
    s.mock.setFaults({ latencyMs: 1_500 });
    const probe = chat(s);
    await sleep(100);
    return { s, probe };
  }

  it('tells a request that cannot park when a permit may be back, not "retry in 0 s"', async () => {
    const { s, probe } = await probing(false);
    const { res } = await chat(s);
    expect(res.status).toBe(503);
    expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect((await probe).res.status).toBe(200);
  });

  it('parks a request without spinning: it waits for the permits instead of being released and refused in a loop', async () => {
    const { s, probe } = await probing(true);
    const cpu = process.cpuUsage();
    const started = Date.now();
    const parked = chat(s, { 'x-stormgate-timeout-ms': '5000' });
    expect((await probe).res.status).toBe(200);
    const used = process.cpuUsage(cpu);
    expect((used.user + used.system) / 1000).toBeLessThan(0.5 * (Date.now() - started));
    expect((await parked).res.status).toBe(200);
  });
});

describe('a burst of 429s with retry-after', () => {
  it('ends as the provider asked: every request waits out the hold-off and is answered, the budget counts but does not refuse', async () => {
    const s = await start({
      faults: { latencyMs: 100, errors: [{ status: 429, rate: 1, headers: { 'retry-after': '1' } }] },
      route: { budget: { ratio: 0.1, windowS: 10, minRetriesPerSecond: 0.1 } },
    });
    const pending = Array.from({ length: 30 }, () => chat(s, { 'x-stormgate-timeout-ms': '10000' }));
    // The provider's rate-limit window is over long before the second it asked for.
    await sleep(300);
    s.mock.setFaults({ latencyMs: 100 });
    const results = await Promise.all(pending);
    expect(results.map((r) => r.res.status)).toEqual(Array(30).fill(200));
    const requests = s.mock.requests().sort((a, b) => a.receivedAt - b.receivedAt);
    const first429 = requests.find((r) => r.status === 429)!;
    // Nothing but the first attempts inside the second the provider asked for.
    expect(requests.filter((r) => r.receivedAt - first429.receivedAt < 1_000 && r.status !== 429)).toEqual([]);
  });
});
