// Third-party failure-scenario suite 52: an outside team that has lived through retry storms, writing from the README
// alone ("Retry budget, circuit breaker, hold-offs, parking", "Shared state", "Priority pools, adaptive concurrency",
// "Retries" and its wait hints, "The mock provider"), on RECOVERY: when a provider comes back after an outage or a
// rate-limit window, does the gateway flood it the moment it is back (a thundering herd on recovery), or does traffic
// return gradually and fairly? Agents are the official `openai` 6.x SDK (maxRetries as the README advises: the
// default 2, or 0 where a scenario counts the gateway's own requests) over real HTTP on 127.0.0.1, against the bundled
// mock provider with faults set at run time through its control endpoint (brownouts, capacity, 429 with hints); the
// ground truth is the mock's request log (`receivedAt`, `endedAt`, status) and `GET /_mock/stats` (`maxInflight`).
// Fleets are 2 or 3 gateways on one real redis-server started on a free loopback port (test/helpers/redis-server.ts).
//  1. The breaker's way back on one instance: after `openS` one probe alone; after it succeeds at most
//     `halfOpenProbes` at a time until `closeAfter` successes close it; a failed probe reopens it for another `openS`.
//  2. The same across a fleet: one probe per round fleet-wide, `halfOpenProbes` fleet-wide, a failed probe seen by all;
//     Redis restarting (empty) while the breaker is open sends nothing early and recovers by itself.
//  3. Parked requests released when the target is back: nothing parked goes out while it is away (only probes, spaced
//     as `probeWhileParkedMs` doubles), released at the adaptive limit restarted at half and spread over the release
//     window, online before batch, nearer deadlines first; released retries are not refused by the budget.
//  4. Hold-offs: a `retry-after` one instance got holds every instance; requests told the same time come back spread
//     by the promised x random(1, 1.2) (or the fifth of the hold-off), never before its end; those turned away with
//     `provider_held_off` are each told a spread `retry-after`; a `retry-after: 0` starts nothing; two instances
//     releasing their parked backlogs at its end; Redis restarting (empty) while it runs.
//  5. The adaptive limit after a hold-off and after the breaker closes: restarts at half and climbs back (not at
//     once); a provider back with less capacity is met with few 429s.
//  6. Per-model faults: one model down or held off does not hold back the healthy one, nor its recovery.
//  7. The retry budget refills after its window.
// Bounds are generous: the suite runs on a loaded 2-core machine (two runs alone: 28 of 28, about 73 s each).
// Found here: no flood on recovery, and no bug. Where the README had to be read closely, or leaves a choice open:
//  - `circuit_open` carries x-should-retry false (the provider's state, not the gateway's bottleneck), so SDK agents
//    at maxRetries 2 send one HTTP request per call into an open breaker; only an app's own loop comes back;
//  - a run of failures opens the breaker only after 250 ms without a success: right after a warm-up call it takes
//    more than `consecutiveFailures` calls (openWith keeps calling until it reads open);
//  - on a parking route with retries, the call whose failure opens the breaker parks its retry and carries the
//    parked probes (a failed probe costs it no attempt) until its deadline: with probeWhileParkedMaxMs 400 and 20 s,
//    one SDK call was 43 upstream requests, one at a time (as documented; with the defaults, one every 5 s);
//  - `POST /_mock/reset` also restarts the fault rules' counters (a `times: 1` rule fires again): now in the README.
// Design questions for the maintainers (measured, not encoded as failures):
//  - parked requests are no demand in the fleet's share exchange ("slots in use plus waiting"), so two instances each
//    releasing a parked backlog when a hold-off ends split maxConcurrent 8 as if idle: 12 in flight at the provider
//    (one instance at its whole 8 beside the other's 4) for a few hundred ms, inside the README's allowance for
//    "idle instances that all get a burst at once" (10 for 6), though the backlog was known 2 s ahead. Should a
//    parked backlog count as demand, so shares are right at the moment of release?
//  - after the breaker closes, the limit reads 5, not half of 8: the success that closed it (or a probe answering
//    just after) counts in the slow start. "Restarts at half" does not say whether the closing success is its first.
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import type { MockRequestLog, MockServer, MockStats } from '../src/mock/server.ts';
import { seededRandom } from '../src/policy/random.ts';
import { mockControl } from './helpers/mock-control.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { defaultConfig, scrapeMetrics, TEST_KEY, useExtraMocks, useGateways, useStacks, type Stack, type StackOptions } from './helpers/stack.ts';

const startStack = useStacks();
const startGateway = useGateways();
const startMock = useExtraMocks();
const redisServer = useRedisServer();

const CHAT = '/v1/chat/completions';
const TARGET = 'mock/gpt-4o';
const messages = [{ role: 'user' as const, content: 'Is the provider back?' }];

// ---------------------------------------------------------------------------------------------------------------
// Small tools of this suite.

/** An agent: the openai SDK at the gateway, maxRetries as given (the SDK's default is 2). */
const agent = (url: string, maxRetries = 2, headers: Record<string, string> = {}) =>
  new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sk-agent-of-suite-52', maxRetries, defaultHeaders: headers, timeout: 30_000 });

interface Outcome {
  status: number;
  code?: string;
  at: number;
}

/** One agent call's outcome: 200, or the status and code the SDK raised. */
async function call(client: OpenAI, opts: { model?: string; headers?: Record<string, string>; content?: string } = {}): Promise<Outcome> {
  try {
    await client.chat.completions.create(
      { model: opts.model ?? 'gpt-4o', messages: opts.content ? [{ role: 'user', content: opts.content }] : messages },
      { headers: opts.headers },
    );
    return { status: 200, at: Date.now() };
  } catch (e) {
    if (!(e instanceof OpenAI.APIError)) throw e;
    return { status: e.status ?? 0, code: e.code ?? undefined, at: Date.now() };
  }
}

/** One call with fetch, to read the headers the SDK hides: status, code, retry-after-ms, x-should-retry. */
async function raw(url: string, headers: Record<string, string> = {}, model = 'gpt-4o') {
  const res = await fetch(`${url}${CHAT}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model, messages }),
  });
  const body = (await res.json()) as { error?: { code?: string } };
  return {
    status: res.status,
    code: body.error?.code,
    retryAfterMs: res.headers.get('retry-after-ms') === null ? undefined : Number(res.headers.get('retry-after-ms')),
    retryAfter: res.headers.get('retry-after'),
    shouldRetry: res.headers.get('x-should-retry'),
    at: Date.now(),
  };
}

/** The value of one gauge series on a gateway (`labels` all matched), or NaN when absent. */
async function gauge(url: string, name: string, labels: Record<string, string> = {}): Promise<number> {
  const samples = (await scrapeMetrics(url)).filter((m) => m.name === name && Object.entries(labels).every(([k, v]) => m.labels[k] === v));
  return samples.length === 0 ? NaN : samples.reduce((s, m) => s + m.value, 0);
}

const breakerState = (url: string, target = TARGET) => gauge(url, 'stormgate_breaker_state', { target });
const poolLimit = (url: string, target = TARGET) => gauge(url, 'stormgate_pool_limit', { target });

/** Waits (up to `ms`) until `cond` holds. */
async function until(cond: () => boolean | Promise<boolean>, what: string, ms = 8_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`never happened: ${what}`);
    await sleep(10);
  }
}

const chatLog = (m: MockServer, model?: string): MockRequestLog[] =>
  m.requests().filter((r) => r.path === CHAT && (model === undefined || r.model === model));

const stats = async (m: MockServer) => (await mockControl(m, 'GET', 'stats')) as MockStats;

/** The most arrivals in any `ms` window (sliding, starting at each arrival). */
function mostInWindow(times: number[], ms = 100): number {
  const t = [...times].sort((a, b) => a - b);
  let most = 0;
  for (let i = 0, j = 0; i < t.length; i++) {
    while (t[i]! - t[j]! >= ms) j++;
    most = Math.max(most, i - j + 1);
  }
  return most;
}

/** The most requests in flight at the provider at once, from the log's arrival and end times. */
function mostInFlight(rs: MockRequestLog[]): number {
  const ev: Array<[number, number]> = [];
  for (const r of rs) ev.push([r.receivedAt, 1], [r.endedAt ?? Number.MAX_SAFE_INTEGER, -1]);
  ev.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let now = 0;
  let most = 0;
  for (const [, d] of ev) most = Math.max(most, (now += d));
  return most;
}

/** How long (ms, in all) more than `n` requests were in flight at the provider at once. */
function msAbove(rs: MockRequestLog[], n: number): number {
  const ev: Array<[number, number]> = [];
  for (const r of rs) ev.push([r.receivedAt, 1], [r.endedAt ?? Number.MAX_SAFE_INTEGER, -1]);
  ev.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let now = 0;
  let total = 0;
  for (let i = 0; i < ev.length; i++) {
    now += ev[i]![1];
    if (now > n && i + 1 < ev.length) total += ev[i + 1]![0] - ev[i]![0];
  }
  return total;
}

/** Upstream arrivals, sorted. */
const arrivals = (rs: MockRequestLog[]) => rs.map((r) => r.receivedAt).sort((a, b) => a - b);

/** Gaps between consecutive arrivals. */
const gaps = (t: number[]) => t.slice(1).map((x, i) => x - t[i]!);

/** A fleet of `n` gateways of one config on the suite's redis-server, with a key prefix of its own. */
let prefixes = 0;
async function fleet(n: number, input: ConfigInput): Promise<string[]> {
  const config = ConfigSchema.parse({ ...input, state: { redis: redisServer().url, keyPrefix: `suite52-${process.pid}-${prefixes++}`, commandTimeoutMs: 500 } });
  const urls: string[] = [];
  for (let i = 0; i < n; i++) urls.push(await startGateway(config));
  return urls;
}

/** One answered call at each gateway, so each has looked the target up (the fleet pushes breaker changes to those). */
async function warm(urls: string[]): Promise<void> {
  for (const u of urls) expect((await call(agent(u, 0))).status).toBe(200);
}

/**
 * Drives the breaker open on `url` with failing calls sent one after another (the SDK at maxRetries 0), at least `k`
 * of them, until it reads open: a run of failures opens it only once no success came for 250 ms (README), so a run
 * right after a warm-up call takes a little longer. Stops as soon as it is open, so no call of its own parks.
 */
async function openWith(url: string, k: number): Promise<Outcome[]> {
  const out: Outcome[] = [];
  for (let i = 0; (await breakerState(url)) !== 1; i++) {
    if (i >= 40) throw new Error('the breaker did not open');
    out.push(await call(agent(url, 0)));
    if (out.length >= k) await sleep(40);
  }
  return out;
}

/**
 * openWith for a route that parks: the call whose failure opens the breaker parks its retry (and carries the parked
 * probes until its deadline), so the calls are not awaited; they are returned, to be awaited (not judged) at the end.
 */
async function openParked(url: string): Promise<Array<Promise<Outcome>>> {
  const calls: Array<Promise<Outcome>> = [];
  for (let i = 0; (await breakerState(url)) !== 1; i++) {
    if (i >= 40) throw new Error('the breaker did not open');
    let settled = false;
    const p = call(agent(url, 0)).finally(() => (settled = true));
    calls.push(p);
    while (!settled && (await breakerState(url)) !== 1) await sleep(10);
    if (calls.length >= 3) await sleep(40);
  }
  return calls;
}

const BREAKER = { consecutiveFailures: 3, openS: 0.8, halfOpenProbes: 3, closeAfter: 3 };

// ---------------------------------------------------------------------------------------------------------------
/** The breaker opened by a brownout, the provider healthy again and its counts cleared, and openS gone by: the probe's turn. */
async function recoveredAfterOpenS(s: Stack): Promise<void> {
  s.mock.brownout('503', 60_000);
  await openWith(s.url, 3);
  await mockControl(s.mock, 'POST', 'brownout', { durationMs: 0 });
  await mockControl(s.mock, 'POST', 'reset');
  await sleep(BREAKER.openS * 1.1 * 1000 + 100);
}

describe('1. the breaker\'s way back, one instance', () => {
  const noPark = (faults: StackOptions['faults'] = { latencyMs: 300 }): Promise<Stack> =>
    startStack({ faults, provider: { breaker: BREAKER, maxConnections: 16 }, route: { retry: { maxAttempts: 1 }, park: false } });

  it('after openS, a crowd of 12 agents at once: one request alone reaches the provider (the probe); the others are told 503 circuit_open with a retry-after (x-should-retry false), not sent', async () => {
    const s = await noPark();
    await recoveredAfterOpenS(s);
    const crowd = await Promise.all(Array.from({ length: 12 }, () => raw(s.url)));
    expect(crowd.filter((c) => c.status === 200)).toHaveLength(1);
    const refused = crowd.filter((c) => c.status !== 200);
    // circuit_open is the provider's state, not the gateway's bottleneck: x-should-retry false (What the client sees).
    expect(refused.map((c) => `${c.status} ${c.code} ${c.shouldRetry}`)).toEqual(refused.map(() => '503 circuit_open false'));
    expect(refused.every((c) => c.retryAfterMs !== undefined && c.retryAfterMs > 0)).toBe(true);
    expect(chatLog(s.mock)).toHaveLength(1);
  });

  it('after the probe succeeds: at most halfOpenProbes (3) at a time at the provider until closeAfter (3) successes close the breaker; then the breaker reads closed', async () => {
    const s = await noPark();
    await recoveredAfterOpenS(s);
    // 10 agents that keep calling (maxRetries 0, one call after another) through the half-open spell.
    const stop = Date.now() + 2_000;
    const loops = Array.from({ length: 10 }, async () => {
      const seen: Outcome[] = [];
      while (Date.now() < stop) {
        const o = await call(agent(s.url, 0));
        seen.push(o);
        if (o.status !== 200) await sleep(30);
      }
      return seen;
    });
    await Promise.all(loops);
    const log = chatLog(s.mock);
    expect(log.every((r) => r.status === 200)).toBe(true);
    // Up to the third success (the close): never more than three in flight.
    const closeAt = log.map((r) => r.endedAt!).sort((a, b) => a - b)[2]!;
    const halfOpen = log.filter((r) => r.receivedAt < closeAt);
    // In flight is what halfOpenProbes bounds: a probe answered frees its slot for another before the close, so up to
    // one more per success short of it may go (CI saw 5: the probe, three, and one into the second's slot).
    expect(halfOpen.length).toBeLessThanOrEqual(1 + BREAKER.halfOpenProbes + BREAKER.closeAfter - 1);
    expect(mostInFlight(halfOpen)).toBeLessThanOrEqual(3);
    // The first went alone (the probe after openS).
    const t = arrivals(log);
    expect(t[1]! - t[0]!).toBeGreaterThanOrEqual(250);
    expect(await breakerState(s.url)).toBe(0);
  });

  it('a probe that fails reopens it: while the provider stays down, the provider sees one request per openS, never two together', async () => {
    const s = await noPark({});
    s.mock.brownout('503', 60_000);
    await openWith(s.url, 3);
    await mockControl(s.mock, 'POST', 'reset');
    const stop = Date.now() + 3_000;
    await Promise.all(
      Array.from({ length: 6 }, async () => {
        while (Date.now() < stop) {
          await call(agent(s.url, 0));
          await sleep(40);
        }
      }),
    );
    const t = arrivals(chatLog(s.mock));
    // Probes at about 0.8-0.88 s apart: 3 s holds at most 4.
    expect(t.length).toBeGreaterThanOrEqual(2);
    expect(t.length).toBeLessThanOrEqual(4);
    expect(Math.min(...gaps(t))).toBeGreaterThanOrEqual(BREAKER.openS * 1000 - 100);
    // The gauge reads half-open (2) once openS has gone by with no call since the last probe failed, so read alone after
    // the loops it depends on where the scrape falls in the 0.8 s cycle (under load it read 2). Read right after a call
    // instead: turned away while open, or the next probe, which fails and reopens it; open (1) either way. Again only
    // when that read itself came past openS (2 again), never when it read closed.
    let state = NaN;
    for (let i = 0; i < 5 && !(state === 0 || state === 1); i++) {
      await call(agent(s.url, 0));
      state = await breakerState(s.url);
    }
    expect(state).toBe(1);
  });

  it('SDK agents at maxRetries 2 meet the open breaker (parking off): each call is one HTTP request (x-should-retry false), the provider sees only spaced probes, and agents that come back after the retry-after-ms they were told are answered once it is back', async () => {
    const s = await noPark({ latencyMs: 50 });
    s.mock.brownout('503', 60_000);
    await openWith(s.url, 3);
    const t0 = Date.now();
    let sdkCalls = 0;
    let httpRequests = 0;
    const client = new OpenAI({
      baseURL: s.baseURL,
      apiKey: 'sk-agent-of-suite-52',
      maxRetries: 2,
      fetch: async (u, init) => {
        httpRequests++;
        return fetch(u, init);
      },
    });
    const back = sleep(1_500).then(() => mockControl(s.mock, 'POST', 'brownout', { durationMs: 0 }));
    const endedAt = back.then(() => Date.now());
    const errors: string[] = [];
    const out = await Promise.all(
      Array.from({ length: 16 }, async (_, i) => {
        await sleep(i * 40);
        for (let k = 0; k < 10; k++) {
          sdkCalls++;
          try {
            await client.chat.completions.create({ model: 'gpt-4o', messages });
            return 200;
          } catch (e) {
            if (!(e instanceof OpenAI.APIError)) throw e;
            errors.push(`${e.status} ${e.code} ${e.headers?.get('x-should-retry')}`);
            // An app's own loop: back after the wait it was told (README: retry-after-ms), at most 2 s.
            await sleep(Math.min(2_000, Number(e.headers?.get('retry-after-ms') ?? 500)));
          }
        }
        return 0;
      }),
    );
    await back;
    expect(out.filter((x) => x !== 200)).toEqual([]);
    // Refused by the open breaker, or (the few probes' carriers while it was still down) the provider's own 503.
    expect(errors.filter((e) => e !== '503 circuit_open false' && e !== '503 service_unavailable false')).toEqual([]);
    expect(errors.filter((e) => e === '503 service_unavailable false').length).toBeLessThanOrEqual(3);
    // x-should-retry false on circuit_open: the SDK never multiplied a call.
    expect(httpRequests).toBe(sdkCalls);
    const recovered = await endedAt;
    const duringOpen = arrivals(chatLog(s.mock).filter((r) => r.receivedAt >= t0 && r.receivedAt < recovered));
    if (duringOpen.length > 1) expect(Math.min(...gaps(duringOpen))).toBeGreaterThanOrEqual(BREAKER.openS * 1000 - 100);
    expect(duringOpen.length).toBeLessThanOrEqual(3);
    expect(Date.now() - t0).toBeLessThan(8_000);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('2. the breaker\'s way back across a fleet on one Redis', () => {
  const fleetInput = (mockUrl: string, park = false): ConfigInput =>
    defaultConfig(mockUrl, { provider: { breaker: BREAKER, maxConnections: 16 }, route: { retry: { maxAttempts: 1 }, park: park ? {} : false } });

  it.each([2, 3])('%i instances: the breaker one opened is open on all; after openS a crowd at every instance sends ONE probe fleet-wide, then at most 3 at a time until closed on all', async (n) => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 300 } });
    const urls = await fleet(n, fleetInput(mock.url));
    await warm(urls);
    mock.brownout('503', 60_000);
    await openWith(urls[0]!, 3);
    for (const u of urls) await until(async () => (await breakerState(u)) === 1, `open on ${u}`);
    mock.brownout('503', 0);
    mock.reset();
    await sleep(BREAKER.openS * 1.1 * 1000 + 150);
    const first = await Promise.all(urls.flatMap((u) => Array.from({ length: 5 }, () => raw(u))));
    expect(first.filter((r) => r.status === 200)).toHaveLength(1);
    expect(chatLog(mock)).toHaveLength(1);
    // Half-open: keep every instance busy; the provider never has more than three until the breaker closes.
    const stop = Date.now() + 2_500;
    await Promise.all(urls.flatMap((u) => Array.from({ length: 4 }, async () => {
      while (Date.now() < stop && (await breakerState(u)) !== 0) {
        await raw(u);
        await sleep(20);
      }
    })));
    for (const u of urls) await until(async () => (await breakerState(u)) === 0, `closed on ${u}`, 3_000);
    const log = chatLog(mock);
    const closeAt = log.map((r) => r.endedAt!).sort((a, b) => a - b)[2]!;
    expect(mostInFlight(log.filter((r) => r.receivedAt < closeAt))).toBeLessThanOrEqual(3);
  });

  it('a probe from instance B that fails reopens the breaker for A and C too: nothing reaches the provider for another openS', async () => {
    const mock = await startMock({ apiKey: TEST_KEY });
    const urls = await fleet(3, fleetInput(mock.url));
    await warm(urls);
    mock.brownout('503', 60_000);
    await openWith(urls[0]!, 3);
    for (const u of urls) await until(async () => (await breakerState(u)) === 1, `open on ${u}`);
    mock.reset();
    const stop = Date.now() + 2_600;
    await Promise.all(urls.flatMap((u) => Array.from({ length: 3 }, async () => {
      while (Date.now() < stop) {
        await raw(u);
        await sleep(30);
      }
    })));
    const t = arrivals(chatLog(mock));
    expect(t.length).toBeGreaterThanOrEqual(2);
    expect(t.length).toBeLessThanOrEqual(4);
    expect(Math.min(...gaps(t))).toBeGreaterThanOrEqual(BREAKER.openS * 1000 - 100);
  });

  it('Redis restarts (empty) while the fleet\'s breaker is open: no instance sends more than its probes before the provider is back, the store recovers by itself, and every parked agent is answered', async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 50 } });
    const input = fleetInput(mock.url, true);
    (input.providers.mock as { breaker: unknown }).breaker = { ...BREAKER, openS: 2, probeWhileParkedMs: 400, probeWhileParkedMaxMs: 800 };
    const urls = await fleet(2, input);
    await warm(urls);
    mock.brownout('503', 60_000);
    await openWith(urls[0]!, 3);
    // Open on each, or open with its openS (2 s) gone by, which the gauge reads as half-open (2) until a call comes:
    // a slow push under load reached an instance after that, and it read 2 from then on. Never closed (0) or absent.
    for (const u of urls) await until(async () => [1, 2].includes(await breakerState(u)), `open on ${u}`);
    const t0 = Date.now();
    const parked = urls.flatMap((u) => Array.from({ length: 8 }, () => call(agent(u, 2))));
    await sleep(200);
    await redisServer().restart();
    await sleep(800);
    const sentDuring = chatLog(mock).filter((r) => r.receivedAt >= t0);
    mock.brownout('503', 0);
    const all = await Promise.all(parked);
    expect(all.filter((o) => o.status !== 200)).toEqual([]);
    // Only probes while it was down: spaced, never a burst.
    expect(mostInWindow(arrivals(sentDuring), 300)).toBeLessThanOrEqual(2);
    for (const u of urls) await until(async () => (await gauge(u, 'stormgate_state_degraded')) === 0, `back on Redis: ${u}`, 6_000);
    // No more upstream requests than calls plus the probes: nothing was sent twice into the recovery.
    expect(chatLog(mock).filter((r) => r.status === 200)).toHaveLength(16 + urls.length);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('3. parked requests, released when the target is back', () => {
  const PARK_BREAKER = { consecutiveFailures: 3, openS: 5, halfOpenProbes: 3, closeAfter: 3, probeWhileParkedMs: 200, probeWhileParkedMaxMs: 800 };
  const parkStack = (extra: StackOptions = {}) =>
    startStack({
      faults: { latencyMs: 100 },
      deps: { random: seededRandom(52) },
      ...extra,
      provider: { breaker: PARK_BREAKER, maxConnections: 16, pools: { maxConcurrent: 8 }, ...extra.provider },
      route: { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 20, capMs: 20 } }, timeoutMs: 30_000, ...extra.route },
    });

  /** Opens the breaker with three failing calls (left to park) and waits until it reads open. */
  async function opened(s: Stack): Promise<Promise<Outcome>[]> {
    s.mock.brownout('503', 60_000);
    const openers = [0, 1, 2].map((i) => sleep(i * 20).then(() => call(agent(s.url, 0))));
    await until(async () => (await breakerState(s.url)) === 1, 'the breaker open');
    return openers;
  }

  it('while the provider is down nothing parked goes out but the probes, spaced as probeWhileParkedMs doubles (0.2, 0.4, 0.8 s ...)', async () => {
    const s = await parkStack();
    const before = Date.now();
    const openers = await opened(s);
    const t0 = Date.now();
    const crowd = Array.from({ length: 30 }, () => call(agent(s.url)));
    await sleep(2_500);
    const during = arrivals(chatLog(s.mock).filter((r) => r.receivedAt >= t0));
    s.mock.brownout('503', 0);
    // The three that opened it may end with the brownout's 503 (their attempts spent before it opened): not counted.
    await Promise.all(openers);
    const all = await Promise.all(crowd);
    expect(all.filter((o) => o.status !== 200)).toEqual([]);
    // Probes at about 0.2, 0.6, 1.4, 2.2 s after the opening: never 30, never two at once.
    expect(during.length).toBeGreaterThanOrEqual(2);
    expect(during.length).toBeLessThanOrEqual(6);
    expect(Math.min(...gaps(during))).toBeGreaterThanOrEqual(150);
    // The wait doubles: the last gap is longer than the first. Counted from the opening, not from t0: under load the
    // breaker read open late, t0 fell past the first probe (or two), and the gaps left were equal (0.8 s each). The
    // openers' attempts come at once (503 with no latency, 20 ms backoff); the first probe is the first arrival
    // probeWhileParkedMs after them.
    const sinceOpening = arrivals(chatLog(s.mock).filter((r) => r.receivedAt >= before));
    const firstProbe = sinceOpening.findIndex((x, i) => i > 0 && x - sinceOpening[i - 1]! >= 150);
    const g = gaps(sinceOpening.slice(firstProbe).filter((x) => x <= during.at(-1)!));
    expect(g.length).toBeGreaterThanOrEqual(2);
    expect(g.at(-1)!).toBeGreaterThan(g[0]!);
  });

  it('40 parked agents after a 2 s outage: all answered; never more than maxConcurrent (8) at the provider, at most 3 while half-open, and spread out rather than in one 100 ms burst', async () => {
    const s = await parkStack();
    const openers = await opened(s);
    const crowd = Array.from({ length: 40 }, (_, i) => sleep(i * 10).then(() => call(agent(s.url))));
    await sleep(2_000);
    await mockControl(s.mock, 'POST', 'reset');
    await mockControl(s.mock, 'POST', 'brownout', { durationMs: 0 });
    // The three that opened it may end with the brownout's 503 (their attempts spent before it opened): not counted.
    await Promise.all(openers);
    const all = await Promise.all(crowd);
    expect(all.filter((o) => o.status !== 200)).toEqual([]);
    const log = chatLog(s.mock);
    expect(log.filter((r) => r.status === 200).length).toBeGreaterThanOrEqual(40);
    expect(log.filter((r) => r.status === 200).length).toBeLessThanOrEqual(43);
    expect((await stats(s.mock)).maxInflight).toBeLessThanOrEqual(8);
    // The releases after the close (the third success): the limit restarted at half (4) and slow-starts to 8.
    const closeAt = log.filter((r) => r.status === 200).map((r) => r.endedAt!).sort((a, b) => a - b)[2]!;
    expect(mostInFlight(log.filter((r) => r.receivedAt < closeAt))).toBeLessThanOrEqual(3);
    const after = arrivals(log.filter((r) => r.receivedAt >= closeAt));
    expect(mostInWindow(after, 100)).toBeLessThanOrEqual(8);
    expect(after.at(-1)! - after[0]!).toBeGreaterThanOrEqual(300);
  });

  it('online before batch: 15 batch agents parked first and 15 online after them; once back, the online ones reach the provider first', async () => {
    const s = await parkStack();
    const openers = await opened(s);
    const batch = Array.from({ length: 15 }, (_, i) => call(agent(s.url, 2), { headers: { 'x-stormgate-priority': 'batch' }, content: `batch ${i}` }));
    await sleep(200);
    const online = Array.from({ length: 15 }, (_, i) => call(agent(s.url, 2), { content: `online ${i}` }));
    await sleep(1_200);
    await mockControl(s.mock, 'POST', 'reset');
    await mockControl(s.mock, 'POST', 'brownout', { durationMs: 0 });
    await Promise.all(openers);
    const all = await Promise.all([...batch, ...online]);
    expect(all.filter((o) => o.status !== 200)).toEqual([]);
    // Told apart by when each agent got its answer (the mock's log does not carry the class).
    const onlineDone = (await Promise.all(online)).map((o) => o.at).sort((a, b) => a - b);
    const batchDone = (await Promise.all(batch)).map((o) => o.at).sort((a, b) => a - b);
    const median = (t: number[]) => t[Math.floor(t.length / 2)]!;
    expect(median(onlineDone)).toBeLessThan(median(batchDone));
    // The first ten answered after the provider came back: online ones, at least eight.
    const firstTen = [...onlineDone.map((t) => ({ t, k: 'o' })), ...batchDone.map((t) => ({ t, k: 'b' }))].sort((a, b) => a.t - b.t).slice(0, 10);
    expect(firstTen.filter((x) => x.k === 'o').length).toBeGreaterThanOrEqual(8);
  });

  it('nearer deadlines first within a class: agents parked with 25 s to live are released before those with 60 s who parked before them', async () => {
    const s = await parkStack({ route: { timeoutMs: 90_000 } });
    const openers = await opened(s);
    const far = Array.from({ length: 12 }, () => call(agent(s.url, 2), { headers: { 'x-stormgate-timeout-ms': '60000' } }));
    await sleep(200);
    const near = Array.from({ length: 12 }, () => call(agent(s.url, 2), { headers: { 'x-stormgate-timeout-ms': '25000' } }));
    await sleep(1_000);
    await mockControl(s.mock, 'POST', 'brownout', { durationMs: 0 });
    const [farDone, nearDone] = await Promise.all([Promise.all(far), Promise.all(near)]);
    await Promise.all(openers);
    expect([...farDone, ...nearDone].filter((o) => o.status !== 200)).toEqual([]);
    const median = (o: Outcome[]) => o.map((x) => x.at).sort((a, b) => a - b)[6]!;
    expect(median(nearDone)).toBeLessThan(median(farDone));
  });

  it('an online newcomer that comes while 30 parked batch requests are being released does not queue behind them', async () => {
    const s = await parkStack({ faults: { latencyMs: 200 } });
    const openers = await opened(s);
    const batch = Array.from({ length: 30 }, (_, i) => call(agent(s.url, 2), { headers: { 'x-stormgate-priority': 'batch' }, content: `b${i}` }));
    await sleep(1_000);
    await mockControl(s.mock, 'POST', 'brownout', { durationMs: 0 });
    // As soon as the first batch answer is in (the breaker closed or closing), an online agent calls.
    await until(() => chatLog(s.mock).some((r) => r.status === 200), 'the first answer after the outage');
    await sleep(100);
    const t = Date.now();
    const online = await call(agent(s.url, 0), { content: 'online newcomer' });
    const batchDone = await Promise.all(batch);
    await Promise.all(openers);
    expect(online.status).toBe(200);
    expect(batchDone.filter((o) => o.status !== 200)).toEqual([]);
    // Answered in a round trip or three, not after the batch backlog (30 x 200 ms over at most 8 slots: 750 ms and more).
    expect(online.at - t).toBeLessThan(1_500);
    const batchLast = Math.max(...batchDone.map((o) => o.at));
    expect(online.at).toBeLessThan(batchLast);
  });

  it('retries that waited parked are not refused by a tight budget (ratio 0.1): 20 agents whose first attempts hung (responseMs) are all answered once the provider is back, none refused', async () => {
    // A hang timed out at responseMs: every first attempt fails, so every agent has a retry to make, and makes it from
    // the lot. Each retry waits 500 ms first, by when the breaker is open: with the 20 ms backoff the others use, a
    // loaded machine spread the first timeouts past it (the breaker opens on a run of failures with nothing else out,
    // or a run four times consecutiveFailures long) and an early retry, the agent's last attempt, went into the hang.
    const s = await parkStack({
      route: { budget: { ratio: 0.1, windowS: 10, minRetriesPerSecond: 0.1 }, retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 500, capMs: 500 } } },
      provider: { timeouts: { responseMs: 300 } },
    });
    s.mock.brownout('hang', 60_000);
    const first = Array.from({ length: 20 }, () => call(agent(s.url, 0)));
    await until(async () => (await breakerState(s.url)) === 1, 'the breaker open');
    await sleep(800);
    await mockControl(s.mock, 'POST', 'brownout', { durationMs: 0 });
    const all = await Promise.all(first);
    expect(all.filter((o) => o.status !== 200)).toEqual([]);
    const text = await (await fetch(`${s.url}/metrics`)).text();
    const exhausted = text.split('\n').filter((l) => l.startsWith('stormgate_retry_budget_exhausted_total')).reduce((n, l) => n + Number(l.split(' ').at(-1)), 0);
    expect(exhausted).toBe(0);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('4. hold-offs from a retry-after, and the way back from them', () => {
  const holdInput = (mockUrl: string, park = true, maxWaitHintMs = 5_000): ConfigInput =>
    defaultConfig(mockUrl, { provider: { breaker: false, maxConnections: 32 }, route: { retry: { maxAttempts: 3, maxWaitHintMs }, timeoutMs: 20_000, park: park ? {} : false } });

  it.each([
    ['retry-after', '1'],
    ['retry-after-ms', '1000'],
  ])('a 429 with %s %s at instance A holds every instance: B\'s agents send nothing before it ends, and all are answered after', async (header, value) => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 30 } });
    const [a, b] = await fleet(2, holdInput(mock.url));
    await mockControl(mock, 'PUT', 'faults', { latencyMs: 30, errors: [{ status: 429, times: 1, code: 'rate_limit_exceeded', headers: { [header]: value } }] });
    const first = call(agent(a!, 0));
    await until(() => chatLog(mock).some((r) => r.status === 429), 'the 429');
    const t429 = chatLog(mock).find((r) => r.status === 429)!.endedAt!;
    await sleep(100);
    const fromB = await Promise.all([first, ...Array.from({ length: 10 }, () => call(agent(b!, 2)))]);
    expect(fromB.filter((o) => o.status !== 200)).toEqual([]);
    const after = chatLog(mock).filter((r) => r.status === 200);
    expect(after).toHaveLength(11);
    // Nothing before the hold-off ends (less a little for the two clocks: both are this process's).
    expect(Math.min(...after.map((r) => r.receivedAt)) - t429).toBeGreaterThanOrEqual(950);
  });

  it('30 agents at once into a 1 s rate-limit window (429 retry-after: 1): none sent again before it ends, then spread by the jitter and the release window, not in one 100 ms burst; all answered', async () => {
    const s = await startStack({
      faults: { latencyMs: 30 },
      provider: { breaker: false, maxConnections: 64 },
      route: { retry: { maxAttempts: 3, maxWaitHintMs: 5_000 }, timeoutMs: 20_000, budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 } },
    });
    // A rate-limit window of a second: every request in it gets 429 with retry-after: 1.
    await mockControl(s.mock, 'POST', 'brownout', { mode: '429', durationMs: 1_000 });
    const out = await Promise.all(Array.from({ length: 30 }, () => call(agent(s.url, 0))));
    expect(out.filter((o) => o.status !== 200)).toEqual([]);
    const log = chatLog(s.mock);
    const firstRefusal = Math.min(...log.filter((r) => r.status === 429).map((r) => r.endedAt!));
    expect(log.filter((r) => r.status === 429).length).toBeLessThanOrEqual(6);
    const back = arrivals(log.filter((r) => r.status === 200));
    expect(back[0]! - firstRefusal).toBeGreaterThanOrEqual(950);
    expect(back.at(-1)! - back[0]!).toBeGreaterThanOrEqual(100);
    expect(mostInWindow(back, 100)).toBeLessThanOrEqual(24);
  });

  it('agents turned away during a hold-off (parking off) are each told a retry-after-ms of their own, past its end; their SDK comes back then and none is sent before', async () => {
    const mock = await startMock({ apiKey: TEST_KEY });
    // maxWaitHintMs 1 s: the 2 s hint is not waited out, the request that got it is answered with it.
    const [a] = await fleet(1, holdInput(mock.url, false, 1_000));
    await mockControl(mock, 'PUT', 'faults', { errors: [{ status: 429, times: 1, code: 'rate_limit_exceeded', headers: { 'retry-after': '2' } }] });
    const started = await raw(a!);
    expect(started.status).toBe(429);
    const tHold = chatLog(mock)[0]!.endedAt!;
    const told = await Promise.all(Array.from({ length: 12 }, () => raw(a!)));
    expect(told.every((t) => t.status === 429 && t.code === 'provider_held_off' && t.shouldRetry === 'true')).toBe(true);
    const until_ = told.map((t) => t.at + t.retryAfterMs!);
    // Each told at least what is left of the 2 s, and not all the same moment.
    expect(Math.min(...until_) - tHold).toBeGreaterThanOrEqual(1_900);
    expect(new Set(told.map((t) => t.retryAfterMs)).size).toBeGreaterThan(3);
    expect(Math.max(...until_) - Math.min(...until_)).toBeGreaterThanOrEqual(50);
    // The SDK (maxRetries 2) waits what it is told: nobody reaches the provider before the hold-off ends.
    const sdkOut = await Promise.all(Array.from({ length: 8 }, () => call(agent(a!, 2))));
    expect(sdkOut.filter((o) => o.status !== 200)).toEqual([]);
    const oks = chatLog(mock).filter((r) => r.status === 200);
    expect(Math.min(...oks.map((r) => r.receivedAt)) - tHold).toBeGreaterThanOrEqual(1_950);
  });

  it('two instances with 20 parked agents each when a 2 s hold-off ends: each instance keeps to maxConcurrent (8) and the fleet exceeds it only as briefly as the README allows (parked requests are no demand); nothing before its end', async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 200 } });
    const input = holdInput(mock.url);
    (input.providers.mock as { pools: unknown }).pools = { maxConcurrent: 8 };
    const [a, b] = await fleet(2, input);
    await warm([a!, b!]);
    await mockControl(mock, 'PUT', 'faults', { latencyMs: 200, errors: [{ status: 429, times: 1, code: 'rate_limit_exceeded', headers: { 'retry-after': '2' } }] });
    const starter = call(agent(a!, 0));
    await until(() => chatLog(mock).some((r) => r.status === 429), 'the 429');
    const t429 = chatLog(mock).find((r) => r.status === 429)!.endedAt!;
    await sleep(100);
    // Each instance's agents marked in an allowlisted header the gateway forwards, so the provider's log tells them apart.
    const crowd = [a!, b!].flatMap((u, i) => Array.from({ length: 20 }, () => call(agent(u, 2, { baggage: `who=${i}` }))));
    const out = await Promise.all([starter, ...crowd]);
    expect(out.filter((o) => o.status !== 200)).toEqual([]);
    const log = chatLog(mock).filter((r) => r.receivedAt > t429);
    expect(log).toHaveLength(41);
    expect(Math.min(...log.map((r) => r.receivedAt)) - t429).toBeGreaterThanOrEqual(1_950);
    // Each instance alone keeps to the pool (8), restarted at half.
    for (const who of ['who=0', 'who=1']) expect(mostInFlight(log.filter((r) => r.headers.baggage === who))).toBeLessThanOrEqual(8);
    // The fleet splits maxConcurrent by demand, exchanged twice a second, and parked requests are no demand until
    // released: the README allows idle instances that all get a burst at once to exceed it briefly (10 for 6 across
    // 3, under a second). Seen here: 12 for 8 (one instance at 8 beside the other's 4) for a few hundred ms.
    expect(mostInFlight(log)).toBeLessThanOrEqual(Math.ceil((8 * 10) / 6));
    expect(msAbove(log, 8)).toBeLessThan(1_000);
    // Arrivals are stamped by the mock, whose process a loaded machine stalls too: a CI run saw 13 in 100 ms (12 at the
    // release, one of the next wave stamped beside them). The bound is the in-flight one: a herd would be all 41.
    expect(mostInWindow(arrivals(log), 100)).toBeLessThanOrEqual(Math.ceil((8 * 10) / 6));
  });

  it('Redis restarts (empty) during a 2 s hold-off: neither instance that knew of it sends anything before it ends', async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: { latencyMs: 30 } });
    const [a, b] = await fleet(2, holdInput(mock.url, false, 1_000));
    await warm([a!, b!]);
    await mockControl(mock, 'PUT', 'faults', { latencyMs: 30, errors: [{ status: 429, times: 1, code: 'rate_limit_exceeded', headers: { 'retry-after': '2' } }] });
    expect((await raw(a!)).status).toBe(429);
    const t429 = chatLog(mock).find((r) => r.status === 429)!.endedAt!;
    // B hears of it by pub/sub, a moment after A's answer: read from its gauge, so the wait itself sends nothing.
    await until(async () => (await gauge(b!, 'stormgate_hold_remaining_seconds', { target: TARGET, kind: 'hold_off', tier: 'all' })) > 0, 'B held off too', 2_000);
    await redisServer().restart();
    // Agents keep calling both instances (parking off: turned away with provider_held_off) until the hold-off is over.
    const seen: string[] = [];
    while (Date.now() - t429 < 1_800) {
      for (const u of [a!, b!]) seen.push((await raw(u)).code ?? '200');
      await sleep(50);
    }
    expect(chatLog(mock).filter((r) => r.receivedAt > t429 && r.receivedAt < t429 + 1_950)).toEqual([]);
    expect(seen.every((c) => c === 'provider_held_off')).toBe(true);
    await sleep(600);
    expect((await raw(b!)).status).toBe(200);
  });

  it('a 429 with retry-after: 0 starts no hold-off: the agents beside it are not held back', async () => {
    const mock = await startMock({ apiKey: TEST_KEY });
    const [a] = await fleet(1, holdInput(mock.url, false));
    await mockControl(mock, 'PUT', 'faults', { errors: [{ status: 429, times: 1, code: 'rate_limit_exceeded', headers: { 'retry-after': '0' } }] });
    const first = await raw(a!);
    const t = Date.now();
    const next = await Promise.all(Array.from({ length: 5 }, () => raw(a!)));
    expect(first.status).toBe(200);
    expect(first.retryAfter).toBeNull();
    expect(next.every((n) => n.status === 200)).toBe(true);
    expect(Date.now() - t).toBeLessThan(1_000);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('5. the adaptive limit on the way back', () => {
  /** Samples the pool limit every 25 ms while `work` runs. */
  async function sampled(url: string, work: Promise<unknown>): Promise<number[]> {
    const seen: number[] = [];
    let done = false;
    void work.finally(() => (done = true));
    while (!done) {
      seen.push(await poolLimit(url));
      await sleep(25);
    }
    seen.push(await poolLimit(url));
    return seen;
  }

  it('after a hold-off ends the limit restarts at half (8 -> 4) and slow-starts back to 8 over later round trips, not at once', async () => {
    const s = await startStack({
      faults: { latencyMs: 150 },
      provider: { breaker: false, maxConnections: 16, pools: { maxConcurrent: 8 } },
      route: { retry: { maxAttempts: 3, maxWaitHintMs: 5_000 }, timeoutMs: 20_000 },
    });
    expect((await call(agent(s.url, 0))).status).toBe(200);
    expect(await poolLimit(s.url)).toBe(8);
    await mockControl(s.mock, 'PUT', 'faults', { latencyMs: 150, errors: [{ status: 503, times: 1, headers: { 'retry-after': '1' } }] });
    const t0 = Date.now();
    const loops = Array.from({ length: 12 }, async () => {
      while (Date.now() - t0 < 3_500) await call(agent(s.url, 0));
    });
    const seen = await sampled(s.url, Promise.all(loops));
    const firstHalf = seen.findIndex((v) => v === 4);
    expect(firstHalf).toBeGreaterThanOrEqual(0);
    expect(seen.at(-1)).toBe(8);
    // Grows back over at least a couple of samples: 4 -> 8 by doubling per round trip (150 ms), not in one step.
    const back = seen.slice(firstHalf).findIndex((v) => v === 8);
    expect(back).toBeGreaterThanOrEqual(2);
    expect(Math.min(...seen)).toBeGreaterThanOrEqual(4);
  });

  it('after the breaker closes the same: released parked requests never find 8 free slots in the first round trip; the limit reads about half (4, and the closing probe\'s success) first, then climbs to 8', async () => {
    const s = await startStack({
      faults: { latencyMs: 150 },
      provider: { breaker: { consecutiveFailures: 3, openS: 5, halfOpenProbes: 3, closeAfter: 3, probeWhileParkedMs: 200, probeWhileParkedMaxMs: 400 }, maxConnections: 16, pools: { maxConcurrent: 8 } },
      route: { retry: { maxAttempts: 2 }, timeoutMs: 20_000 },
    });
    s.mock.brownout('503', 60_000);
    const openers = await openParked(s.url);
    const crowd = Array.from({ length: 30 }, (_, i) => sleep(i * 10).then(() => call(agent(s.url, 2))));
    await sleep(600);
    s.mock.brownout('503', 0);
    const seen = await sampled(s.url, Promise.all(crowd));
    await Promise.all(openers);
    expect((await Promise.all(crowd)).filter((o) => o.status !== 200)).toEqual([]);
    // Half of 8 is 4; the success that closed the breaker (or a probe's answering just after) counts in the slow
    // start, one more each (seen: 5). Never straight back at 8.
    const low = seen.findIndex((v) => v <= 5);
    expect(low).toBeGreaterThanOrEqual(0);
    expect(Math.max(...seen.slice(low))).toBe(8);
  });

  it('a provider back with less capacity (4, maxConcurrent 6): 30 agents through the recovery meet few capacity 429s and are all answered', async () => {
    const s = await startStack({
      faults: { latencyMs: 150 },
      provider: { breaker: { consecutiveFailures: 3, openS: 5, probeWhileParkedMs: 200, probeWhileParkedMaxMs: 400 }, maxConnections: 16, pools: { maxConcurrent: 6 } },
      route: { retry: { maxAttempts: 3 }, timeoutMs: 20_000 },
    });
    s.mock.brownout('503', 60_000);
    const openers = await openParked(s.url);
    const crowd = Array.from({ length: 30 }, (_, i) => sleep(i * 10).then(() => call(agent(s.url, 2))));
    await sleep(600);
    await mockControl(s.mock, 'PATCH', 'faults', { capacity: 4 });
    await mockControl(s.mock, 'POST', 'reset');
    await mockControl(s.mock, 'POST', 'brownout', { durationMs: 0 });
    const out = await Promise.all(crowd);
    await Promise.all(openers);
    expect(out.filter((o) => o.status !== 200)).toEqual([]);
    const st = await stats(s.mock);
    // A half-limit restart (3) is under the capacity: the slow start to 6 meets at most a round trip's overshoot.
    expect(st.byStatus['429'] ?? 0).toBeLessThanOrEqual(8);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('6. per-model faults', () => {
  const perModel = (faults: StackOptions['faults']) =>
    startStack({
      faults,
      provider: { breaker: { consecutiveFailures: 3, openS: 5, probeWhileParkedMs: 300, probeWhileParkedMaxMs: 600 }, maxConnections: 16, pools: { maxConcurrent: 8 } },
      route: { retry: { maxAttempts: 2, maxWaitHintMs: 5_000 }, timeoutMs: 20_000 },
    });

  it('gpt-4o down (its breaker open, 20 agents parked on it): gpt-4o-mini agents answered at its latency, its breaker closed, its limit whole', async () => {
    const s = await perModel({ latencyMs: 50, models: { 'gpt-4o': { latencyMs: 50, errors: [{ status: 503 }] } } });
    const openers = await openParked(s.url);
    const parked = Array.from({ length: 20 }, () => call(agent(s.url, 2)));
    const t = Date.now();
    const mini = await Promise.all(Array.from({ length: 12 }, () => call(agent(s.url, 0), { model: 'gpt-4o-mini' })));
    expect(mini.every((o) => o.status === 200)).toBe(true);
    expect(Math.max(...mini.map((o) => o.at)) - t).toBeLessThan(1_500);
    expect(await breakerState(s.url, 'mock/gpt-4o-mini')).toBe(0);
    expect(await poolLimit(s.url, 'mock/gpt-4o-mini')).toBe(8);
    await mockControl(s.mock, 'PUT', 'faults', { latencyMs: 50 });
    expect((await Promise.all(parked)).filter((o) => o.status !== 200)).toEqual([]);
    await Promise.all(openers);
  });

  it('gpt-4o held off by a 429 retry-after: 3: gpt-4o-mini is not held: its agents go at once', async () => {
    const s = await perModel({ latencyMs: 30, models: { 'gpt-4o': { latencyMs: 30, errors: [{ status: 429, times: 1, headers: { 'retry-after': '3' } }] } } });
    const held = call(agent(s.url, 0));
    await until(() => chatLog(s.mock).some((r) => r.status === 429), 'the 429');
    const t = Date.now();
    const mini = await Promise.all(Array.from({ length: 8 }, () => call(agent(s.url, 0), { model: 'gpt-4o-mini' })));
    expect(mini.every((o) => o.status === 200)).toBe(true);
    expect(Math.max(...mini.map((o) => o.at)) - t).toBeLessThan(1_000);
    expect((await held).status).toBe(200);
  });

  it('gpt-4o\'s recovery (30 parked released) does not hold back gpt-4o-mini agents calling through it', async () => {
    const s = await perModel({ latencyMs: 200 });
    await mockControl(s.mock, 'PUT', 'faults', { latencyMs: 200, models: { 'gpt-4o': { latencyMs: 200, errors: [{ status: 503 }] } } });
    const openers = await openParked(s.url);
    const parked = Array.from({ length: 30 }, (_, i) => sleep(i * 10).then(() => call(agent(s.url, 2))));
    await sleep(500);
    await mockControl(s.mock, 'PUT', 'faults', { latencyMs: 200 });
    const mini: Outcome[] = [];
    const stop = Date.now() + 1_500;
    const t = Date.now();
    while (Date.now() < stop) {
      const before = Date.now();
      const o = await call(agent(s.url, 0), { model: 'gpt-4o-mini' });
      expect(o.status).toBe(200);
      expect(o.at - before).toBeLessThan(800);
      mini.push(o);
    }
    expect(mini.length).toBeGreaterThanOrEqual(3);
    expect(Date.now() - t).toBeLessThan(5_000);
    expect((await Promise.all(parked)).filter((o) => o.status !== 200)).toEqual([]);
    await Promise.all(openers);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('7. the retry budget refills', () => {
  it('spent by a burst of failures (ratio 0.1, windowS 2), it refuses retries; a window later the same failures are retried and answered', async () => {
    const s = await startStack({
      faults: { latencyMs: 20 },
      provider: { breaker: false, maxConnections: 32 },
      route: { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 20, capMs: 20 } }, budget: { ratio: 0.1, windowS: 2, minRetriesPerSecond: 1 }, park: false },
    });
    // Every first attempt fails with a 500; every retry passes.
    await mockControl(s.mock, 'PUT', 'faults', { latencyMs: 20, errors: [{ status: 500, firstAttemptsOnly: true }] });
    const burst = await Promise.all(Array.from({ length: 20 }, (_, i) => call(agent(s.url, 0), { content: `burst ${i}` })));
    const served = burst.filter((o) => o.status === 200).length;
    expect(served).toBeGreaterThanOrEqual(1);
    expect(served).toBeLessThanOrEqual(5);
    expect(await gauge(s.url, 'stormgate_retry_budget_exhausted_total')).toBeGreaterThanOrEqual(15);
    await sleep(2_300);
    // The window has slid past the burst: its floor (1 a second over 2 s) grants two retries again.
    const later: Outcome[] = [];
    for (let i = 0; i < 2; i++) later.push(await call(agent(s.url, 0), { content: `later ${i}` }));
    expect(later.map((o) => o.status)).toEqual([200, 200]);
  });
});
