// A 47th third-party suite: an outside team's "incident replay". The five incidents at the top of the README, each
// compressed to a few seconds and replayed end to end with the official `openai` SDK (6.x) as the agents' client,
// the bundled mock provider (faults set through its control endpoint, counts read from /_mock/stats and
// /_mock/requests) or a scripted upstream, all on 127.0.0.1. Where the incident is about what the gateway saves, the
// same agents run in the same test against the provider directly, so every claim is a measured A/B:
//  1. a provider hiccup (a 503 brownout) under 50 agents that retry on a fixed interval: upstream QPS against the
//     offered load, direct and through the gateway, and how soon the agents are served again;
//  2. exponential backoff without jitter against the default full-jitter: how spread out the retries of requests
//     that failed together arrive at the provider;
//  3. a tool that commits just after the agent's timeout: executions direct, through the gateway without a key, and
//     with an Idempotency-Key;
//  4. ghost requests: a client that leaves (or whose deadline header comes) while the gateway would keep retrying;
//  5. batch and online sharing one provider that answers 429 past its capacity: online success and latency, direct
//     and through the gateway's priority pool.
// Bounds are generous (a loaded 2-core machine); each test prints the numbers it measured on one `[tp47]` line.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import type { MockRequestLog, MockServer, MockStats } from '../src/mock/server.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { mockControl } from './helpers/mock-control.ts';
import { TEST_KEY, useExtraMocks, useGateways } from './helpers/stack.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();
const startFake = useFakeProviders();

type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];

const CHAT = '/v1/chat/completions';
const messages = [{ role: 'user' as const, content: 'Summarise the ticket and propose the next step.' }];

/** A gateway with one OpenAI-family provider (`up`) in front of `origin`, and one chat route to it. */
async function gateway(origin: string, o: { route?: Partial<RouteInput>; provider?: Partial<ProviderInput>; extraRoutes?: RouteInput[]; logs?: string[] } = {}): Promise<string> {
  const input: ConfigInput = {
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    providers: { up: { family: 'openai', baseUrl: `${origin}/v1`, apiKey: TEST_KEY, maxConnections: 256, ...o.provider } },
    routes: [{ name: 'chat', match: { path: CHAT }, targets: [{ provider: 'up' }], ...o.route }, ...(o.extraRoutes ?? [])],
  };
  return startGateway(ConfigSchema.parse(input), { logs: o.logs });
}

/** The official SDK pointed at `url` (a gateway or the provider itself). */
const sdk = (url: string, opts: ConstructorParameters<typeof OpenAI>[0] = {}) => new OpenAI({ baseURL: `${url}/v1`, apiKey: TEST_KEY, ...opts });

interface Call {
  start: number;
  end: number;
  /** HTTP status; -1 the SDK's timeout, -2 the caller's abort. */
  status: number;
  code?: string;
  headers?: Headers;
}

async function chat(client: OpenAI, reqOpts: OpenAI.RequestOptions = {}, model = 'gpt-4o'): Promise<Call> {
  const start = Date.now();
  try {
    await client.chat.completions.create({ model, messages }, reqOpts);
    return { start, end: Date.now(), status: 200 };
  } catch (e) {
    if (e instanceof OpenAI.APIConnectionTimeoutError) return { start, end: Date.now(), status: -1 };
    if (e instanceof OpenAI.APIUserAbortError) return { start, end: Date.now(), status: -2 };
    if (!(e instanceof OpenAI.APIError)) throw e;
    return { start, end: Date.now(), status: e.status ?? 0, code: (e.error as { code?: string } | undefined)?.code, headers: e.headers };
  }
}

const stats = (mock: MockServer) => mockControl(mock, 'GET', 'stats') as Promise<MockStats>;
const requestLog = async (mock: MockServer) => ((await mockControl(mock, 'GET', 'requests')) as MockRequestLog[]).filter((r) => r.path === CHAT);
const within = (log: MockRequestLog[], from: number, to: number) => log.filter((r) => r.receivedAt >= from && r.receivedAt < to);
/** Requests per second that reached the provider in [from, to). */
const qps = (log: MockRequestLog[], from: number, to: number) => within(log, from, to).length / ((to - from) / 1000);
const pct = (xs: number[], p: number) => (xs.length === 0 ? NaN : [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(xs.length * p))]!);
const share = <T>(xs: T[], f: (x: T) => boolean) => xs.filter(f).length / Math.max(1, xs.length);
const stdev = (xs: number[]) => {
  const mean = xs.reduce((a, b) => a + b, 0) / xs.length;
  return Math.sqrt(xs.reduce((a, b) => a + (b - mean) ** 2, 0) / xs.length);
};
/** The largest number of `ts` inside any window of `ms`. */
const densest = (ts: number[], ms: number) => Math.max(...ts.map((t) => ts.filter((u) => u >= t && u < t + ms).length));
const r2 = (x: number) => Math.round(x * 100) / 100;
const report = (what: string, numbers: Record<string, unknown>) => console.log(`[tp47] ${what}: ${JSON.stringify(numbers)}`);

// ---------------------------------------------------------------------------------------------------------------
describe('incident 1 replayed: a 2 s provider hiccup under 50 agents retrying every 250 ms', () => {
  /**
   * 50 agents in a closed loop: a logical request, and after its answer 1 s of thought before the next; a failed
   * call is sent again by the agent every `retryEveryMs` (the naive fixed-interval loop), the SDK's own retries off so
   * the loop is the only one, on both sides. Returns the logical requests and stops them on `stop()`.
   */
  function agents(client: OpenAI, n: number, retryEveryMs: number) {
    const done: Array<{ start: number; end: number; tries: number }> = [];
    let stopped = false;
    const loops = Array.from({ length: n }, async (_, i) => {
      await sleep((i * 1_000) / n);
      while (!stopped) {
        const start = Date.now();
        let tries = 0;
        for (;;) {
          tries++;
          const c = await chat(client);
          if (c.status === 200) break;
          if (stopped) return;
          await sleep(retryEveryMs);
        }
        done.push({ start, end: Date.now(), tries });
        await sleep(1_000);
      }
    });
    return {
      done,
      async stop() {
        stopped = true;
        await Promise.all(loops);
        return done;
      },
    };
  }

  /** Runs the replay against `url` with `mock` behind it: 2 s of normal load, a 2 s 503 brownout, 4 s after. */
  async function replay(url: string, mock: MockServer) {
    const run = agents(sdk(url, { maxRetries: 0 }), 50, 250);
    await sleep(2_000);
    const t0 = Date.now();
    await mockControl(mock, 'POST', 'brownout', { mode: '503', durationMs: 2_000 });
    await sleep(6_000);
    const done = await run.stop();
    const log = await requestLog(mock);
    const end = t0 + 2_000;
    const offered = qps(log, t0 - 1_500, t0);
    // The first logical request after the brownout that was served at its first try: the agents are served again.
    const servedAgain = done.filter((l) => l.start >= end && l.tries === 1).map((l) => l.end - end);
    // From the brownout's end, the first 250 ms window in which the provider answered at least half the offered load with 200s.
    let recoveredMs = Infinity;
    for (let t = end; t < end + 4_000; t += 250) {
      if (within(log, t, t + 250).filter((r) => r.status === 200).length * 4 >= offered * 0.5) {
        recoveredMs = t + 250 - end;
        break;
      }
    }
    return {
      offered: r2(offered),
      during: r2(qps(log, t0, end)),
      after: r2(qps(log, end, end + 2_000)),
      peak250ms: Math.max(...Array.from({ length: 24 }, (_, k) => within(log, t0 + k * 250, t0 + (k + 1) * 250).length * 4)),
      failedUpstream: within(log, t0, end + 4_000).filter((r) => r.status !== 200).length,
      recoveredMs,
      firstCleanAfterMs: Math.min(...servedAgain),
      logical: done.length,
    };
  }

  it('the provider sees near 3x the offered load from agents calling it directly, and about the offered load or less through the gateway; agents are served again within seconds', async () => {
    const direct = await startMock({ faults: { latencyMs: 50 }, apiKey: TEST_KEY });
    const d = await replay(direct.url, direct);

    const behind = await startMock({ faults: { latencyMs: 50 }, apiKey: TEST_KEY });
    const url = await gateway(behind.url);
    const g = await replay(url, behind);

    const ampDirect = d.during / d.offered;
    const ampGateway = g.during / g.offered;
    const ampGatewayAfter = g.after / g.offered;
    report('incident 1 (2 s 503 brownout, 50 agents, retry every 250 ms)', { direct: d, gateway: g, ampDirect: r2(ampDirect), ampGateway: r2(ampGateway), ampGatewayAfter: r2(ampGatewayAfter) });

    // The incident, direct: the fixed-interval loop multiplies the load while the provider is down.
    // About 4x: each agent's one call a second becomes four. (A CPU-starved test process sends fewer of them.)
    expect(d.offered).toBeGreaterThan(25);
    expect(ampDirect).toBeGreaterThan(2);
    // Through the gateway: the breaker opens, the agents' calls park, and the provider sees the first failures and
    // the probes, not a wall of retries; after the hiccup the parked backlog goes out paced, not 3-4x.
    expect(g.offered).toBeGreaterThan(25);
    expect(ampGateway).toBeLessThan(0.5);
    expect(ampGateway).toBeLessThan(ampDirect / 2.5);
    expect(ampGatewayAfter).toBeLessThan(2);
    // Its busiest 250 ms is the parked backlog released: at most one request per agent (50), never a retry wave.
    expect(g.peak250ms / 4).toBeLessThanOrEqual(55);
    expect(g.failedUpstream).toBeLessThan(d.failedUpstream / 3);
    // No prolonged outage: the provider answers the offered load again within a few seconds of the hiccup's end
    // (the parked requests' probes go 1 s, then 3 s into the outage), and new calls are served at their first try.
    expect(g.recoveredMs).toBeLessThan(3_500);
    expect(g.firstCleanAfterMs).toBeLessThan(4_000);
  }, 40_000);
});

// ---------------------------------------------------------------------------------------------------------------
describe('incident 2 replayed: 40 requests that fail together', () => {
  /** 40 SDK calls at once against a provider that refuses every first attempt with a bare 503; the retries' timing. */
  async function burst(strategy: 'exponential' | 'full-jitter') {
    const mock = await startMock({ faults: { latencyMs: 20, errors: [{ status: 503, firstAttemptsOnly: true }] }, apiKey: TEST_KEY });
    const logs: string[] = [];
    const url = await gateway(mock.url, {
      logs,
      provider: { breaker: false },
      route: { park: false, budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 }, retry: { maxAttempts: 3, backoff: { strategy, baseMs: 400, capMs: 2_000 } } },
    });
    const client = sdk(url, { maxRetries: 0 });
    const calls = await Promise.all(Array.from({ length: 40 }, () => chat(client)));
    const log = await requestLog(mock);
    const firsts = log.filter((r) => r.headers['x-retry-attempt'] === undefined);
    const retries = log.filter((r) => r.headers['x-retry-attempt'] !== undefined);
    // Each retry's wait, from its own first attempt's arrival (the gateway sends both with the request's x-client-request-id).
    const firstAt = new Map(firsts.map((r) => [r.headers['x-client-request-id'], r.receivedAt]));
    const waits = retries.map((r) => r.receivedAt - firstAt.get(r.headers['x-client-request-id'])!);
    // The retries' arrivals, from the first of them.
    const back = retries.map((r) => r.receivedAt).sort((a, b) => a - b).map((t, _, all) => t - all[0]!);
    // The wait the gateway drew for each retry, from its log line (what the policy decided, before any timer lateness).
    const drawn = logs
      .map((l) => JSON.parse(l) as { route?: string; attempts?: Array<{ attempt: number; waitMs: number }> })
      .filter((l) => l.route === 'chat')
      .flatMap((l) => (l.attempts ?? []).filter((a) => a.attempt > 0).map((a) => a.waitMs));
    return { calls, firsts, retries, waits, back, drawn };
  }

  it('exponential without jitter brings the burst back as a burst; full-jitter (the default) spreads it over the backoff', async () => {
    const exp = await burst('exponential');
    const jit = await burst('full-jitter');
    for (const b of [exp, jit]) {
      expect(b.calls.every((c) => c.status === 200)).toBe(true);
      expect(b.firsts).toHaveLength(40);
      expect(b.retries).toHaveLength(40);
    }
    const firstSpread = (b: typeof exp) => stdev(b.firsts.map((r) => r.receivedAt));
    const numbers = (b: typeof exp) => ({
      drawnMinMs: Math.min(...b.drawn),
      drawnMaxMs: Math.max(...b.drawn),
      drawnDensest50ms: densest(b.drawn, 50),
      failuresStdevMs: r2(firstSpread(b)),
      failuresDensest50ms: densest(b.firsts.map((r) => r.receivedAt), 50),
      waitMinMs: Math.min(...b.waits),
      waitMaxMs: Math.max(...b.waits),
      waitStdevMs: r2(stdev(b.waits)),
      waitIqrMs: pct(b.waits, 0.75) - pct(b.waits, 0.25),
      retriesStdevMs: r2(stdev(b.back)),
      retriesRangeMs: b.back.at(-1)!,
      densest50ms: densest(b.back, 50),
    });
    const e = numbers(exp);
    const j = numbers(jit);
    report('incident 2 (40 requests failed together, baseMs 400)', { exponential: e, fullJitter: j });

    for (const b of [exp, jit]) expect(b.drawn).toHaveLength(40);
    // No jitter: the gateway draws the same 400 ms for every retry, so the 40 wake as together as they failed (on an
    // idle machine 30-40 of them inside one 50 ms window at the provider).
    expect(new Set(exp.drawn)).toEqual(new Set([400]));
    expect(e.waitMinMs).toBeGreaterThan(380);
    // Full jitter: 40 draws from 0..400 ms, spread over it (about 5 in any 50 ms), so requests that failed together
    // are told different times.
    expect(j.drawnMinMs).toBeLessThan(100);
    expect(j.drawnMaxMs).toBeGreaterThan(300);
    expect(j.drawnMaxMs).toBeLessThanOrEqual(400);
    expect(j.drawnDensest50ms).toBeLessThanOrEqual(16);
    // ... and they arrive at the provider so: some retries within 150 ms of their failure (none can, without jitter),
    // the middle half of the waits over 100 ms wide. (Timing at the
    // provider, bounded loosely: on a loaded machine a stalled event loop delays timers by hundreds of ms.)
    expect(j.waitMinMs).toBeLessThan(150);
    expect(j.waitIqrMs).toBeGreaterThan(100);
  }, 30_000);
});

// ---------------------------------------------------------------------------------------------------------------
describe('incident 3 replayed: the tool that commits after the agent timed out', () => {
  /** A coupon tool: every request it receives commits 450 ms after arrival, client there or not, then answers. */
  async function couponTool() {
    const commits: number[] = [];
    const tool = await startFake((req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      req.on('end', () => {
        setTimeout(() => {
          commits.push(Date.now());
          if (!res.destroyed) res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ coupon: `C-${commits.length}` }));
        }, 450);
      });
    });
    return { tool, commits };
  }

  const toolRoute: RouteInput = {
    name: 'coupon-tool',
    match: { path: '/v1/tools/coupon' },
    targets: [{ provider: 'coupons', model: 'coupon-tool' }],
    retry: { retryOn: [429, 503] },
  };

  /** The agent's loop: up to 5 tries, SDK timeout 300 ms each, 100 ms apart; the same key on every try when given. */
  async function agentLoop(client: OpenAI, key?: string) {
    for (let tries = 1; tries <= 5; tries++) {
      try {
        const a = await client.post<{ coupon: string }>('/tools/coupon', { body: { user: 'u-47', amount: 10 }, timeout: 300, maxRetries: 0, ...(key && { headers: { 'Idempotency-Key': key } }) });
        return { coupon: a.coupon, tries };
      } catch (e) {
        if (!(e instanceof OpenAI.APIError)) throw e;
        await sleep(100);
      }
    }
    return { coupon: undefined, tries: 5 };
  }

  async function gatewayFor(origin: string) {
    const mock = await startMock({ apiKey: TEST_KEY });
    const input: ConfigInput = {
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: { up: { family: 'openai', baseUrl: `${mock.url}/v1`, apiKey: TEST_KEY }, coupons: { family: 'openai', baseUrl: `${origin}/v1`, apiKey: 'coupon-token', breaker: false } },
      routes: [{ name: 'chat', match: { path: CHAT }, targets: [{ provider: 'up' }] }, toolRoute],
    };
    return startGateway(ConfigSchema.parse(input));
  }

  it('five tries direct are five coupons, and five through the gateway without a key; with an Idempotency-Key, one coupon and the agent gets it', async () => {
    const direct = await couponTool();
    const d = await agentLoop(sdk(direct.tool.origin));
    await sleep(700);

    const nokey = await couponTool();
    const n = await agentLoop(sdk(await gatewayFor(nokey.tool.origin)));
    await sleep(700);

    const keyed = await couponTool();
    const url = await gatewayFor(keyed.tool.origin);
    const k = await agentLoop(sdk(url), 'call-47-coupon-1');
    await sleep(1_500);

    report('incident 3 (tool commits at 450 ms, agent timeout 300 ms, 5 tries)', {
      direct: { executions: direct.tool.hits(), commits: direct.commits.length, agentGotCoupon: d.coupon !== undefined },
      gatewayNoKey: { executions: nokey.tool.hits(), commits: nokey.commits.length, agentGotCoupon: n.coupon !== undefined },
      gatewayKeyed: { executions: keyed.tool.hits(), commits: keyed.commits.length, agentGotCoupon: k.coupon, tries: k.tries },
    });
    // The incident: every try is a new call that commits.
    expect(direct.commits).toHaveLength(5);
    expect(d.coupon).toBeUndefined();
    expect(nokey.commits).toHaveLength(5);
    // With the key: one execution, the run detached from the timed-out try, its answer handed to a later try.
    expect(keyed.tool.hits()).toBe(1);
    expect(keyed.commits).toHaveLength(1);
    expect(k.coupon).toBe('C-1');
    expect(k.tries).toBeGreaterThanOrEqual(2);
    // A repeat after the answer is the same coupon, replayed; still one execution.
    const again = await sdk(url).post<{ coupon: string }>('/tools/coupon', { body: { user: 'u-47', amount: 10 }, headers: { 'Idempotency-Key': 'call-47-coupon-1' } }).withResponse();
    expect(again.data.coupon).toBe('C-1');
    expect(again.response.headers.get('idempotent-replayed')).toBe('true');
    expect(keyed.tool.hits()).toBe(1);
  }, 30_000);
});

// ---------------------------------------------------------------------------------------------------------------
describe('incident 4 replayed: ghost requests', () => {
  /** A provider answering 503 to everything, and a gateway that would retry it 20 times 300 ms apart for 20 s. */
  async function stubborn() {
    const mock = await startMock({ faults: { latencyMs: 20, errors: [{ status: 503 }] }, apiKey: TEST_KEY });
    const url = await gateway(mock.url, {
      provider: { breaker: false },
      route: { park: false, timeoutMs: 20_000, minAttemptMs: 100, budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 }, retry: { maxAttempts: 20, backoff: { strategy: 'fixed', baseMs: 300, capMs: 300 } } },
    });
    return { mock, url };
  }

  /** Upstream attempts the provider received after `t` over the next `ms`, and what it still has in flight. */
  async function ghostsAfter(mock: MockServer, t: number, ms = 2_500) {
    await sleep(ms);
    const log = await requestLog(mock);
    return { ghosts: within(log, t + 20, t + ms).length, inflight: (await stats(mock)).inflight, total: log.length };
  }

  it('a client that gives up after 1.2 s (abort, no deadline header): no upstream attempt after it left, while the gateway would have gone on for 20 s', async () => {
    const { mock, url } = await stubborn();
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 1_200);
    const c = await chat(sdk(url, { maxRetries: 0 }), { signal: ac.signal });
    expect(c.status).toBe(-2);
    const during = (await stats(mock)).total;
    const after = await ghostsAfter(mock, c.end);
    report('incident 4a (client aborts at 1.2 s; gateway would retry 20x every 300 ms)', { upstreamWhileClientThere: during, ghostsIn2500msAfter: after.ghosts, inflightAfter: after.inflight });
    expect(during).toBeGreaterThanOrEqual(2);
    expect(during).toBeLessThanOrEqual(6);
    expect(after.ghosts).toBe(0);
    expect(after.inflight).toBe(0);
  }, 20_000);

  it("x-stormgate-timeout-ms: 1200 and the SDK's per-request timeout (x-stainless-timeout: 2) are deadlines: answered before them, x-should-retry false, and nothing upstream after", async () => {
    const { mock, url } = await stubborn();
    const client = sdk(url, { maxRetries: 2 });
    const a = await chat(client, { headers: { 'x-stormgate-timeout-ms': '1200' } });
    const aGhosts = await ghostsAfter(mock, a.end);
    const b = await chat(client, { timeout: 2_000 });
    const bLog = await requestLog(mock);
    const bGhosts = await ghostsAfter(mock, b.end);
    report('incident 4b (deadline headers)', {
      timeoutMsHeader: { answeredInMs: a.end - a.start, status: a.status, shouldRetry: a.headers?.get('x-should-retry'), upstream: aGhosts.total, ghosts: aGhosts.ghosts },
      stainlessTimeout: { answeredInMs: b.end - b.start, status: b.status, shouldRetry: b.headers?.get('x-should-retry'), upstream: within(bLog, b.start, b.end + 1).length, ghosts: bGhosts.ghosts },
    });
    for (const [call, ms, g] of [[a, 1_200, aGhosts], [b, 2_000, bGhosts]] as const) {
      // The gateway's own answer before the client's deadline, telling the SDK not to send it again.
      expect(call.status).toBe(503);
      expect(call.end - call.start).toBeLessThan(ms);
      expect(call.headers?.get('x-should-retry')).toBe('false');
      expect(g.ghosts).toBe(0);
      expect(g.inflight).toBe(0);
    }
    // The SDK sent each call once (maxRetries 2 notwithstanding): 1200 ms at 300 ms apart is 3-4 attempts, 2 s 5-7.
    expect(aGhosts.total).toBeGreaterThanOrEqual(2);
    expect(aGhosts.total).toBeLessThanOrEqual(5);
  }, 30_000);

  it('a hung provider: the attempt in flight is cut when the client leaves, and the provider holds nothing for it', async () => {
    const mock = await startMock({ faults: { hangRate: 1 }, apiKey: TEST_KEY });
    const url = await gateway(mock.url, { provider: { breaker: false }, route: { park: false, timeoutMs: 20_000 } });
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 800);
    const c = await chat(sdk(url, { maxRetries: 0 }), { signal: ac.signal });
    expect(c.status).toBe(-2);
    const after = await ghostsAfter(mock, c.end, 1_500);
    const log = await requestLog(mock);
    report('incident 4c (hung provider, client leaves at 0.8 s)', { upstream: log.length, aborted: log.filter((r) => r.aborted).length, ghosts: after.ghosts, inflight: after.inflight });
    expect(log).toHaveLength(1);
    expect(log[0]!.aborted).toBe(true);
    expect(after.ghosts).toBe(0);
    expect(after.inflight).toBe(0);
  }, 20_000);
  /** A gauge's sum over its series on the gateway's /metrics. */
  async function gaugeSum(url: string, name: string): Promise<number> {
    const text = await (await fetch(`${url}/metrics`)).text();
    return text
      .split('\n')
      .filter((l) => l.startsWith(`${name}{`) || l.startsWith(`${name} `))
      .reduce((sum, l) => sum + Number(l.split(' ').at(-1)), 0);
  }

  it('30 clients that leave while parked behind an open breaker: the lot carries no probe for them afterwards, and the provider hears nothing', async () => {
    const mock = await startMock({ faults: { latencyMs: 20 }, apiKey: TEST_KEY });
    const url = await gateway(mock.url);
    await mockControl(mock, 'POST', 'brownout', { mode: '503', durationMs: 5_000 });
    const ac = new AbortController();
    const client = sdk(url, { maxRetries: 0 });
    const calls = Promise.all(Array.from({ length: 30 }, () => chat(client, { signal: ac.signal })));
    await sleep(1_500);
    const parked = await gaugeSum(url, 'stormgate_parked_requests');
    ac.abort();
    const leftAt = Date.now();
    const out = await calls;
    // The next probe of a parked request would go 3 s into the outage; none may, nobody is waiting for it.
    const after = await ghostsAfter(mock, leftAt, 3_000);
    const parkedAfter = await gaugeSum(url, 'stormgate_parked_requests');
    report('incident 4d (30 clients leave after 1.5 s parked behind an open breaker)', {
      parkedBeforeLeaving: parked,
      parkedAfter,
      upstreamWhileThere: after.total - after.ghosts,
      ghostsIn3sAfter: after.ghosts,
      statuses: [...new Set(out.map((c) => c.status))],
    });
    expect(parked).toBeGreaterThan(0);
    expect(out.filter((c) => c.status === -2).length).toBe(parked);
    expect(after.ghosts).toBe(0);
    expect(after.inflight).toBe(0);
    expect(parkedAfter).toBe(0);
  }, 20_000);

  it('20 clients that leave while queued for a pool slot: only the 2 already in flight ever reach the provider', async () => {
    const mock = await startMock({ faults: { latencyMs: 1_500 }, apiKey: TEST_KEY });
    const url = await gateway(mock.url, { provider: { pools: { maxConcurrent: 2 } } });
    const ac = new AbortController();
    const client = sdk(url, { maxRetries: 0 });
    const calls = Promise.all(Array.from({ length: 20 }, () => chat(client, { signal: ac.signal })));
    await sleep(400);
    const queued = await gaugeSum(url, 'stormgate_pool_queue_depth');
    ac.abort();
    const leftAt = Date.now();
    const out = await calls;
    const after = await ghostsAfter(mock, leftAt, 2_500);
    const log = await requestLog(mock);
    report('incident 4e (20 clients leave while 18 queue for 2 slots)', { queuedBeforeLeaving: queued, upstream: log.length, abortedUpstream: log.filter((r) => r.aborted).length, ghosts: after.ghosts, queuedAfter: await gaugeSum(url, 'stormgate_pool_queue_depth') });
    expect(out.every((c) => c.status === -2)).toBe(true);
    expect(queued).toBe(18);
    expect(log).toHaveLength(2);
    expect(log.every((r) => r.aborted)).toBe(true);
    expect(after.ghosts).toBe(0);
    expect(after.inflight).toBe(0);
    expect(await gaugeSum(url, 'stormgate_pool_queue_depth')).toBe(0);
  }, 20_000);
});

// ---------------------------------------------------------------------------------------------------------------
describe('incident 5 replayed: batch and online share one provider that answers 429 past 8 at a time', () => {
  /** 40 batch agents calling back to back (waiting the retry-after they are told, else 200 ms, after a refusal). */
  function batchFlood(client: OpenAI, model?: string) {
    const calls: Call[] = [];
    let stopped = false;
    const loops = Array.from({ length: 40 }, async () => {
      while (!stopped) {
        const c = await chat(client, {}, model);
        calls.push(c);
        if (c.status !== 200) await sleep(Math.max(50, Number(c.headers?.get('retry-after-ms') ?? 200)));
      }
    });
    return {
      calls,
      async stop() {
        stopped = true;
        await Promise.all(loops);
      },
    };
  }

  /** 30 online calls, one every 80 ms, at the SDK's defaults (maxRetries 2), after 1 s of flood. */
  async function online(client: OpenAI, batch: OpenAI, batchModel?: string) {
    const flood = batchFlood(batch, batchModel);
    await sleep(1_000);
    const out: Array<Promise<Call>> = [];
    try {
      for (let i = 0; i < 30; i++) {
        out.push(chat(client));
        await sleep(80);
      }
      return { online: await Promise.all(out), batch: flood.calls };
    } finally {
      await flood.stop();
    }
  }

  const summary = (r: { online: Call[]; batch: Call[] }) => ({
    onlineOk: r2(share(r.online, (c) => c.status === 200)),
    onlineP50: pct(r.online.map((c) => c.end - c.start), 0.5),
    onlineP95: pct(r.online.map((c) => c.end - c.start), 0.95),
    batchCalls: r.batch.length,
    batchOk: r.batch.filter((c) => c.status === 200).length,
    batchShed: r.batch.filter((c) => c.code === 'load_shed').length,
  });

  it('direct, online calls meet the batch flood\'s 429s; through the gateway\'s priority pool they are all answered fast while batch queues', async () => {
    const faults = { latencyMs: 150, capacity: 8 };
    const direct = await startMock({ faults, apiKey: TEST_KEY });
    const d = await online(sdk(direct.url), sdk(direct.url, { maxRetries: 0 }));
    const dStats = await stats(direct);

    const behind = await startMock({ faults, apiKey: TEST_KEY });
    const url = await gateway(behind.url, { provider: { pools: { maxConcurrent: 8 } } });
    const g = await online(sdk(url), sdk(url, { maxRetries: 0, defaultHeaders: { 'x-stormgate-priority': 'batch' } }));
    const gStats = await stats(behind);

    const ds = summary(d);
    const gs = summary(g);
    report('incident 5 (capacity 8, 40 batch agents, 30 online calls)', {
      direct: { ...ds, provider429: dStats.byStatus['429'] ?? 0, providerTotal: dStats.total },
      gateway: { ...gs, provider429: gStats.byStatus['429'] ?? 0, providerTotal: gStats.total, maxInflight: gStats.maxInflight },
    });
    // The incident, direct: online users starve on the flood's 429s (the SDK's own retries do not save them in time).
    expect(ds.onlineOk < 0.9 || ds.onlineP95 > 2_000).toBe(true);
    // Through the gateway: every online call answered, at about the provider's latency plus a slot's turn.
    expect(gs.onlineOk).toBe(1);
    expect(gs.onlineP50).toBeLessThan(800);
    expect(gs.onlineP95).toBeLessThan(2_000);
    // Batch waits its turn in the pool's queue and is still served, and the provider barely
    // refuses: the pool keeps within its capacity.
    expect(gs.batchOk).toBeGreaterThan(20);
    expect((gStats.byStatus['429'] ?? 0) / gStats.total).toBeLessThan(0.05);
    expect(gStats.maxInflight).toBeLessThanOrEqual(9);
  }, 40_000);

  it('a batch route of its own (priority: batch, another model) sharing the provider pool: online answered, batch served behind it', async () => {
    const behind = await startMock({ faults: { latencyMs: 150, capacity: 8 }, apiKey: TEST_KEY });
    const url = await gateway(behind.url, {
      provider: { pools: { maxConcurrent: 8 } },
      route: { match: { path: CHAT, models: ['gpt-4o'] } },
      extraRoutes: [{ name: 'batch', match: { path: CHAT, models: ['gpt-4o-mini'] }, priority: 'batch', targets: [{ provider: 'up' }] }],
    });
    const g = await online(sdk(url), sdk(url, { maxRetries: 0 }), 'gpt-4o-mini');
    const st = await stats(behind);
    const gs = summary(g);
    report('incident 5b (batch route by model, maxConcurrent 8 = capacity)', { ...gs, provider429: st.byStatus['429'] ?? 0, providerTotal: st.total, maxInflight: st.maxInflight });
    expect(gs.onlineOk).toBe(1);
    expect(gs.onlineP50).toBeLessThan(800);
    expect(gs.onlineP95).toBeLessThan(2_000);
    expect(gs.batchOk).toBeGreaterThan(20);
    expect((st.byStatus['429'] ?? 0) / st.total).toBeLessThan(0.05);
  }, 40_000);

  it("the pool set 1.5x above the provider's capacity (README: within about 1.5x), batch by header: the adaptive limit learns the rest, online still answered", async () => {
    const behind = await startMock({ faults: { latencyMs: 150, capacity: 8 }, apiKey: TEST_KEY });
    const url = await gateway(behind.url, { provider: { pools: { maxConcurrent: 12 } } });
    const g = await online(sdk(url), sdk(url, { maxRetries: 0, defaultHeaders: { 'x-stormgate-priority': 'batch' } }));
    const st = await stats(behind);
    const gs = summary(g);
    report('incident 5c (batch by header, maxConcurrent 12 for capacity 8)', { ...gs, provider429: st.byStatus['429'] ?? 0, providerTotal: st.total, maxInflight: st.maxInflight });
    expect(gs.onlineOk).toBeGreaterThanOrEqual(0.95);
    expect(gs.onlineP50).toBeLessThan(800);
    expect(gs.batchOk).toBeGreaterThan(20);
    // The provider's refusals are the few it took to learn its capacity, not a storm.
    expect((st.byStatus['429'] ?? 0) / st.total).toBeLessThan(0.15);
  }, 40_000);
});
