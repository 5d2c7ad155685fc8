// A twenty-first third-party failure-scenario suite, written from the README alone ("Client keys" with `auth.limits`,
// "Priority pools, adaptive concurrency, load shedding", "Retry budget, circuit breaker, hold-offs, parking", "What the
// client sees", "Errors", "Logs and metrics") as a platform team would test one shared gateway before onboarding many
// internal tenants (teams), each with a client key of its own: noisy neighbours. Themes: a tenant whose agents loop
// on 429s with no backoff (the other tenants must not notice, the provider must not see the loop, the breaker and the
// retry budget must not count it); a tenant with a token rate sending a few huge prompts (the overdraft); `"*"` beside
// named limits; a batch-only tenant (auth.priority) flooding a provider that refuses past its concurrency while an
// online tenant keeps its share; the `openai` SDK's own retries (maxRetries 2, its default) against
// client_rate_limited, bucketed per 100 ms; two gateways on one real redis-server holding a tenant to one fleet rate,
// with Redis stopped and started again mid-run; per-tenant metrics and log lines; config mistakes.
// Scaled for a shared 2-core machine (clients, gateways and mocks share this test process); bounds are generous, and
// what each run measured is printed (console.info) for the record.
// Found: the slots told to refused requests were kept per instance, so two gateways on one Redis told each slot twice
// (8 of 40 SDK calls ran out of retries, 15 with three gateways; now kept beside the rate, in the store); an unquoted
// `*` key under auth.limits failed with the YAML parser's "Alias ending in : is ambiguous" (now: quote it). Left as a
// design question: the told queue never gives a slot back, so a tenant's loop pushes its later refusals far ahead.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import type { MockServer } from '../src/mock/server.ts';
import { clientRates, rateOf } from '../src/policy/client-rate.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import { RedisStore } from '../src/state/redis-store.ts';
import type { StateStore } from '../src/state/store.ts';
import { startRedis } from './helpers/redis-server.ts';
import { loopFor } from './helpers/load-loops.ts';
import { defaultConfig, parseMetrics, useExtraMocks, useGateways, type MetricSample } from './helpers/stack.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();

const CHAT = '/v1/chat/completions';
const KEYS = {
  looper: 'sk-tenant-looper-6f1d2a',
  alpha: 'sk-tenant-alpha-91c0be',
  beta: 'sk-tenant-beta-3e77a4',
  analytics: 'sk-tenant-analytics-5b20',
  research: 'sk-tenant-research-c4d1',
  batch: 'sk-tenant-batch-jobs-8aa3',
  online: 'sk-tenant-online-0d9e',
  vip: 'sk-tenant-vip-77e2',
} as const;
type Tenant = keyof typeof KEYS;
type AuthInput = NonNullable<ConfigInput['auth']>;

const messages = [{ role: 'user' as const, content: 'Summarise the ticket.' }];

async function tenantGateway(mock: MockServer, auth: Partial<AuthInput>, extra: { provider?: Partial<ConfigInput['providers'][string]>; logs?: string[]; state?: ConfigInput['state'] } = {}) {
  const base = defaultConfig(mock.url, { provider: extra.provider });
  const config = ConfigSchema.parse({ ...base, state: extra.state, auth: { keys: { ...KEYS }, ...auth } });
  return startGateway(config, { logs: extra.logs });
}

interface Answer {
  status: number;
  code?: string;
  headers: Headers;
  ms: number;
}

/** One chat call with fetch as `tenant`: its status, error code, headers and time taken. */
async function call(url: string, tenant: Tenant, body: Record<string, unknown> = { model: 'gpt-4o', messages }, headers: Record<string, string> = {}): Promise<Answer> {
  const t0 = performance.now();
  const res = await fetch(`${url}${CHAT}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${KEYS[tenant]}`, 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  const json = (await res.json().catch(() => undefined)) as { error?: { code?: string } } | undefined;
  return { status: res.status, code: json?.error?.code, headers: res.headers, ms: performance.now() - t0 };
}

async function metrics(url: string): Promise<MetricSample[]> {
  return parseMetrics(await (await fetch(`${url}/metrics`)).text());
}
const sumOf = (samples: MetricSample[], name: string, labels: Record<string, string> = {}) =>
  samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v)).reduce((a, s) => a + s.value, 0);

function quantile(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
}

describe('a tenant whose agents loop on 429s with no backoff', () => {
  it('is held to its rate at the gateway: the provider sees its rate, the other tenants see no change, nothing upstream counts the loop', async () => {
    const mock = await startMock({ faults: { latencyMs: 20 } });
    const logs: string[] = [];
    // The looper is held to 10 a second (burst 10); alpha and beta fall under "*", far above what they send.
    const url = await tenantGateway(mock, { limits: { looper: { requestsPerMinute: 600, burst: 10 }, '*': { requestsPerMinute: 60_000 } } }, { logs });
    const quiet = (tenant: Tenant) => new OpenAI({ baseURL: `${url}/v1`, apiKey: KEYS[tenant], maxRetries: 0 });
    const neighbour = async (client: OpenAI) => {
      const t0 = performance.now();
      const ok = await client.chat.completions.create({ model: 'gpt-4o', messages }).then(() => true, () => false);
      return { ok, ms: performance.now() - t0 };
    };
    const neighbours = (ms: number) => Promise.all([loopFor(ms, 3, () => neighbour(quiet('alpha'))), loopFor(ms, 3, () => neighbour(quiet('beta')))]).then((r) => r.flat());

    // Before: the neighbours alone.
    const before = await neighbours(1500);
    // During: the looper's 8 agents call again the moment they are refused, ignoring retry-after (its own model name,
    // so the provider's log tells its requests apart).
    const loopStart = performance.now();
    const [during, loop] = await Promise.all([neighbours(3000), loopFor(3000, 8, () => call(url, 'looper', { model: 'gpt-4o-mini', messages }))]);
    const loopSeconds = (performance.now() - loopStart) / 1000;

    const upstreamLoop = mock.requests().filter((r) => r.model === 'gpt-4o-mini').length;
    // After the loop: a refused request used up nothing, so the rate has room again one slot on (100 ms) ...
    await sleep(150);
    const afterLoop = await call(url, 'looper', { model: 'gpt-4o-mini', messages });
    // ... but the queue of slots told to the loop's refusals (none of which waited) runs far ahead: a polite request
    // refused now is told to wait behind all of them (Client keys; a design question, see the report).
    const polite = await Promise.all(Array.from({ length: 12 }, () => call(url, 'looper', { model: 'gpt-4o-mini', messages })));
    const politeRefused = polite.find((a) => a.status === 429);
    const refused = [...loop, ...polite].filter((a) => a.status === 429);
    const admitted = loop.filter((a) => a.status === 200);
    const p = (xs: { ms: number }[], q: number) => Math.round(quantile(xs.map((x) => x.ms), q));
    console.info(
      `looper: ${loop.length} calls in ${loopSeconds.toFixed(1)} s, ${admitted.length} admitted, ${refused.length} refused, ${upstreamLoop} seen upstream; ` +
        `neighbours before: ${before.length} calls p50 ${p(before, 0.5)} ms p95 ${p(before, 0.95)} ms; during: ${during.length} calls p50 ${p(during, 0.5)} ms p95 ${p(during, 0.95)} ms`,
    );

    console.info(`after the loop: one slot on ${afterLoop.status}; a polite request refused then is told ${politeRefused?.headers.get('retry-after-ms')} ms, x-should-retry ${politeRefused?.headers.get('x-should-retry')}`);
    expect(afterLoop.status).toBe(200);
    expect(politeRefused?.code).toBe('client_rate_limited');
    // The loop is held to its rate at the gateway: a burst, then ten a second.
    expect(loop.length).toBeGreaterThan(200);
    // Each refusal asked back exactly when its told wait is within 60 s (later ones, far down the queue, are not).
    const askedBack = (a: Answer) => (Number(a.headers.get('retry-after-ms')) <= 60_000 ? 'true' : 'false');
    expect(refused.filter((a) => a.code !== 'client_rate_limited' || !(Number(a.headers.get('retry-after-ms')) > 0) || a.headers.get('x-should-retry') !== askedBack(a))).toEqual([]);
    expect(upstreamLoop).toBe(admitted.length);
    expect(mock.requests().filter((r) => r.model === 'gpt-4o-mini').length).toBe(upstreamLoop + 1 + polite.filter((a) => a.status === 200).length);
    expect(upstreamLoop).toBeLessThanOrEqual(10 + Math.ceil(10 * loopSeconds) + 2);
    expect(upstreamLoop).toBeGreaterThanOrEqual(10 + Math.floor(10 * loopSeconds * 0.5));
    // Its neighbours are all answered, and not made slow.
    expect(before.every((c) => c.ok) && during.every((c) => c.ok)).toBe(true);
    expect(p(during, 0.95)).toBeLessThan(Math.max(1000, 5 * p(before, 0.95)));

    const samples = await metrics(url);
    // Per tenant: the looper's refusals, each once, by the request rate; none for its neighbours.
    expect(sumOf(samples, 'stormgate_client_limited_total', { client: 'looper', by: 'requests' })).toBe(refused.length);
    expect(samples.filter((s) => s.name === 'stormgate_client_limited_total' && s.labels.client !== 'looper' && s.value > 0)).toEqual([]);
    // Nothing upstream counts the refusals: no attempts, no retries, no budget refusals, the breakers closed and never moved.
    expect(sumOf(samples, 'stormgate_upstream_attempts_total')).toBe(mock.stats().total);
    expect(sumOf(samples, 'stormgate_retry_count_total')).toBe(0);
    expect(sumOf(samples, 'stormgate_retry_budget_exhausted_total')).toBe(0);
    expect(sumOf(samples, 'stormgate_breaker_transitions_total')).toBe(0);
    expect(samples.filter((s) => s.name === 'stormgate_breaker_state').every((s) => s.value === 0)).toBe(true);
    // Refusals are requests answered before any route took them: outside every route's ratios.
    expect(sumOf(samples, 'stormgate_requests_total', { outcome: 'rejected', route: 'none' })).toBe(refused.length);
    expect(sumOf(samples, 'stormgate_requests_total', { route: 'chat' })).toBe(mock.stats().total);

    // Log lines name the tenant, never its key.
    await sleep(50);
    const lines = logs.map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines.filter((l) => l.client === 'looper' && l.status === 429).length).toBe(refused.length);
    expect(lines.some((l) => l.client === 'alpha' && l.status === 200)).toBe(true);
    for (const key of Object.values(KEYS)) expect(logs.join('').includes(key)).toBe(false);
  });
});

describe('a tenant with a token rate sending huge prompts (the overdraft)', () => {
  // The mock counts a prompt's characters / 4 as its tokens: 40,000 characters are 10,000 prompt tokens.
  const huge = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'x'.repeat(40_000) }] };

  it('admits a huge request on a full rate (more than a minute\'s worth, it fits no other way), and holds the tenant until the overdraft is paid back', async () => {
    const mock = await startMock();
    const logs: string[] = [];
    const url = await tenantGateway(mock, { limits: { analytics: { tokensPerMinute: 6000 }, research: { tokensPerMinute: 6000 } } }, { logs });
    const first = await call(url, 'analytics', huge);
    expect(first.status).toBe(200);
    const refused = await call(url, 'analytics');
    expect(refused.status).toBe(429);
    expect(refused.code).toBe('client_rate_limited');
    // About 4,000 tokens over a 100-a-second rate: about 40 s, within 60 s, so the SDK is asked back.
    const waitMs = Number(refused.headers.get('retry-after-ms'));
    expect(waitMs).toBeGreaterThan(35_000);
    expect(waitMs).toBeLessThanOrEqual(41_000 * 1.2);
    expect(refused.headers.get('x-should-retry')).toBe('true');
    // Another tenant with the same rate is not held by this one's debt.
    expect((await call(url, 'research')).status).toBe(200);
    expect(mock.stats().total).toBe(2);
    const samples = await metrics(url);
    expect(sumOf(samples, 'stormgate_client_limited_total', { client: 'analytics', by: 'tokens' })).toBe(1);
    // The answered line carries the tokens a platform team charges the tenant for, under its name.
    await sleep(50);
    const line = logs.map((l) => JSON.parse(l) as Record<string, any>).find((l) => l.client === 'analytics' && l.status === 200);
    expect(line?.usage?.prompt).toBeGreaterThanOrEqual(10_000);
  });

  it('of several huge requests at once only one is admitted (each reserves its estimate); a wait past 60 s is told as such, and the SDK does not retry it', async () => {
    const mock = await startMock({ faults: { latencyMs: 200 } });
    const url = await tenantGateway(mock, { limits: { analytics: { tokensPerMinute: 6000 } } });
    // Three at once of 30,000 tokens each: the first reserves its estimate (five minutes' worth, so only on a full
    // rate), which leaves none for the others; counted only once answered, all three were let in (15 minutes' worth).
    const huger = { ...huge, messages: [{ role: 'user' as const, content: 'x'.repeat(120_000) }] };
    const three = await Promise.all([call(url, 'analytics', huger), call(url, 'analytics', huger), call(url, 'analytics', huger)]);
    expect(three.map((a) => a.status).sort()).toEqual([200, 429, 429]);
    expect(mock.stats().total).toBe(1);
    let sent = 0;
    const sdk = new OpenAI({ baseURL: `${url}/v1`, apiKey: KEYS.analytics, fetch: async (u, init) => (sent++, fetch(u, init)) }); // maxRetries 2
    const err = (await sdk.chat.completions.create({ model: 'gpt-4o', messages }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.RateLimitError>;
    expect(err).toBeInstanceOf(OpenAI.RateLimitError);
    const waitMs = Number(err.headers.get('retry-after-ms'));
    console.info(`three huge requests at once: one admitted, ~30,000 tokens on a 6,000/min rate; the next is told ${Math.round(waitMs / 1000)} s`);
    // About 24,000 tokens over: about 240 s, past 60 s: x-should-retry false, and the SDK does not come back.
    expect(waitMs).toBeGreaterThan(200_000);
    expect(err.headers.get('x-should-retry')).toBe('false');
    expect(sent).toBe(1);
  });

  it('a tenant streaming huge prompts without include_usage is counted by its prompt\'s estimate, or its usage where the provider has streamUsage: true', async () => {
    const drain = async (stream: AsyncIterable<unknown>) => {
      for await (const _ of stream) void _;
    };
    const after: Record<string, number> = {};
    for (const streamUsage of [false, true]) {
      const mock = await startMock();
      const url = await tenantGateway(mock, { limits: { analytics: { tokensPerMinute: 6000 } } }, { provider: { streamUsage } });
      const sdk = new OpenAI({ baseURL: `${url}/v1`, apiKey: KEYS.analytics, maxRetries: 0 });
      await drain(await sdk.chat.completions.create({ ...huge, stream: true }));
      after[String(streamUsage)] = (await call(url, 'analytics')).status;
    }
    // Without usage the stream keeps what it reserved for its prompt (README: its body's bytes / 4), so the tenant's
    // 10,000-token streams no longer cost its rate nothing.
    expect(after).toEqual({ false: 429, true: 429 });
  });
});

describe('"*" beside named limits', () => {
  it('every tenant not named gets a rate of its own from "*"; a named tenant has its own rate, not "*"\'s', async () => {
    const mock = await startMock();
    const url = await tenantGateway(mock, { limits: { '*': { requestsPerMinute: 60, burst: 2 }, vip: { requestsPerMinute: 6000, burst: 20 } } });
    const statuses = async (tenant: Tenant, n: number) => {
      const out: number[] = [];
      for (let i = 0; i < n; i++) out.push((await call(url, tenant)).status);
      return out;
    };
    expect(await statuses('alpha', 3)).toEqual([200, 200, 429]);
    // beta is not held by alpha's use of "*": its own burst.
    expect(await statuses('beta', 3)).toEqual([200, 200, 429]);
    expect(await statuses('vip', 15)).toEqual(Array(15).fill(200));
    // Without "*", a tenant not named is not limited.
    const mock2 = await startMock();
    const url2 = await tenantGateway(mock2, { limits: { vip: { requestsPerMinute: 60, burst: 1 } } });
    const free: number[] = [];
    for (let i = 0; i < 15; i++) free.push((await call(url2, 'alpha')).status);
    expect(free).toEqual(Array(15).fill(200));
  });
});

describe('a batch-only tenant flooding a provider in a 429 storm', () => {
  const storms: Array<[string, NonNullable<Parameters<typeof startMock>[0]>['faults'], number, number]> = [
    // A provider that takes 6 at a time and refuses past that (429), behind a pool of 9 (the README's 1.5x).
    ['refusing past a concurrency of 6, maxConcurrent 9', { latencyMs: 100, capacity: 6 }, 9, 0.9],
    // A provider refusing 3 in 10 whatever the concurrency (another client of the same key), bare 429s.
    ['refusing 3 in 10 with bare 429s, maxConcurrent 6', { latencyMs: 100, errors: [{ status: 429, rate: 0.3 }] }, 6, 0.6],
  ];
  it.each(storms)('%s: the online tenant keeps its share; the batch tenant cannot promote itself with x-stormgate-priority', async (_name, faults, maxConcurrent, onlineShare) => {
    const mock = await startMock({ faults });
    const logs: string[] = [];
    const url = await tenantGateway(mock, { priority: { batch: 'batch' } }, { provider: { pools: { maxConcurrent } }, logs });
    const batch = new OpenAI({ baseURL: `${url}/v1`, apiKey: KEYS.batch, maxRetries: 0, defaultHeaders: { 'x-stormgate-priority': 'online' } });
    const online = new OpenAI({ baseURL: `${url}/v1`, apiKey: KEYS.online, maxRetries: 0 });
    const timed = async (client: OpenAI) => {
      const t0 = performance.now();
      const status = await client.chat.completions.create({ model: 'gpt-4o', messages }).then(() => 200, (e: { status?: number }) => e.status ?? 0);
      return { status, ms: performance.now() - t0 };
    };
    const floodDone = loopFor(3500, 40, () => timed(batch));
    await sleep(300);
    const onlineCalls = await loopFor(2800, 3, () => timed(online), 50);
    const flood = await floodDone;
    const statusCount = (xs: { status: number }[]) => xs.reduce<Record<number, number>>((m, x) => ((m[x.status] = (m[x.status] ?? 0) + 1), m), {});
    const onlineOk = onlineCalls.filter((c) => c.status === 200);
    const samples = await metrics(url);
    console.info(
      `${_name}: batch flood ${flood.length} calls ${JSON.stringify(statusCount(flood))}; online ${onlineCalls.length} calls ${JSON.stringify(statusCount(onlineCalls))}, ` +
        `p50 ${Math.round(quantile(onlineCalls.map((c) => c.ms), 0.5))} ms p95 ${Math.round(quantile(onlineCalls.map((c) => c.ms), 0.95))} ms; provider ${JSON.stringify(mock.stats().byStatus)}; ` +
        `limit ${samples.filter((s) => s.name === 'stormgate_pool_limit').map((s) => s.value).join(',')}`,
    );
    const why = (client: string) => JSON.stringify(logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.client === client && l.status === 429).reduce<Record<string, number>>((m, l) => ((m[`${String(l.retriesStopped)}/${(l.attempts as unknown[] | undefined)?.length ?? 0}`] = (m[`${String(l.retriesStopped)}/${(l.attempts as unknown[] | undefined)?.length ?? 0}`] ?? 0) + 1), m), {}));
    console.info(`${_name}: why online 429s (retriesStopped/attempts) ${why('online')}; batch ${why('batch')}`);
    expect(onlineCalls.length).toBeGreaterThanOrEqual(10);
    expect(onlineOk.length / onlineCalls.length).toBeGreaterThanOrEqual(onlineShare);
    expect(quantile(onlineCalls.map((c) => c.ms), 0.5)).toBeLessThan(1500);
    // What online lost, it lost to the provider's refusals and its own class's retry budget (10% of online's requests,
    // at least one a second: a 30% refusal rate needs more), never to batch: no retry shed for a slot batch held.
    const onlineLines = logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.client === 'online' && l.status !== 200);
    expect(onlineLines.filter((l) => l.retriesStopped !== 'budget' && l.retriesStopped !== 'retries_exhausted')).toEqual([]);
    // Whatever batch was refused, it was refused as batch, never promoted to online.
    expect(sumOf(samples, 'stormgate_requests_total', { route: 'chat', priority: 'online' })).toBe(onlineCalls.length);
    expect(sumOf(samples, 'stormgate_requests_total', { route: 'chat', priority: 'batch' })).toBe(flood.length);
  });
});

describe('two online tenants on one pool: the class shared between tenants', () => {
  it('a tenant within its rate that holds many slots does not queue the quiet one behind it, in one class or with its key at batch', async () => {
    const measure = async (priority: AuthInput['priority']) => {
      const mock = await startMock({ faults: { latencyMs: 300 } });
      const url = await tenantGateway(mock, { priority }, { provider: { pools: { maxConcurrent: 8 } } });
      const noisy = new OpenAI({ baseURL: `${url}/v1`, apiKey: KEYS.alpha, maxRetries: 0 });
      const quiet = new OpenAI({ baseURL: `${url}/v1`, apiKey: KEYS.beta, maxRetries: 0 });
      const flood = loopFor(2500, 48, () => noisy.chat.completions.create({ model: 'gpt-4o', messages }).then(() => 200, (e: { status?: number }) => e.status ?? 0));
      await sleep(300);
      const quietCalls = await loopFor(1800, 1, async () => {
        const t0 = performance.now();
        await quiet.chat.completions.create({ model: 'gpt-4o', messages });
        return performance.now() - t0;
      });
      await flood;
      return Math.round(quantile(quietCalls, 0.5));
    };
    const shared = await measure(undefined);
    const demoted = await measure({ alpha: 'batch' });
    console.info(`quiet tenant's p50 beside 48 concurrent calls of another on 8 slots (300 ms answers): both online ${shared} ms; the noisy one at batch ${demoted} ms`);
    // Served by class, then by client (the one holding the fewest slots first): in one class the quiet tenant takes the
    // next slot freed, as it does with the noisy key at batch, instead of waiting its turn behind the other's queue
    // (48 / 8 x 300 ms, about 1.8 s, by arrival alone, and its own 300 ms answer: 2.1 s a call). About 0.3 to 0.5 s on
    // a quiet machine; a loaded 2-core one (a whole CI run beside other work) measured 1.48 s.
    expect(shared).toBeLessThan(1600);
    expect(demoted).toBeLessThan(1600);
  });
});

describe("the SDK's own retries against client_rate_limited", () => {
  it('40 agents refused together wait what they are told, come back spread over the slots, and get in', async () => {
    const mock = await startMock({ faults: { latencyMs: 10 } });
    const url = await tenantGateway(mock, { limits: { alpha: { requestsPerMinute: 600, burst: 5 } } });
    interface Sent {
      agent: number;
      try: number;
      at: number;
      status?: number;
      toldMs?: number;
      answeredAt?: number;
    }
    const sent: Sent[] = [];
    const t0 = performance.now();
    const agent = (i: number) => {
      let n = 0;
      return new OpenAI({
        baseURL: `${url}/v1`,
        apiKey: KEYS.alpha, // maxRetries: 2, the SDK's default
        fetch: async (u, init) => {
          const s: Sent = { agent: i, try: n++, at: performance.now() - t0 };
          sent.push(s);
          const res = await fetch(u, init);
          s.status = res.status;
          s.answeredAt = performance.now() - t0;
          if (res.status === 429) s.toldMs = Number(res.headers.get('retry-after-ms'));
          return res;
        },
      });
    };
    const results = await Promise.all(Array.from({ length: 40 }, (_, i) => agent(i).chat.completions.create({ model: 'gpt-4o', messages }).then(() => true, () => false)));

    // Each retry came after the wait the refusal before it told (the SDK waits exactly that).
    for (const s of sent.filter((x) => x.try > 0)) {
      const prev = sent.find((x) => x.agent === s.agent && x.try === s.try - 1)!;
      expect(s.at - prev.answeredAt!).toBeGreaterThanOrEqual(prev.toldMs! - 5);
    }
    // Per 100 ms window: admitted, refused, and refused clients coming back.
    const windows = new Map<number, { admitted: number; refused: number; returns: number; returnsAdmitted: number }>();
    for (const s of sent) {
      const w = windows.get(Math.floor(s.at / 100)) ?? { admitted: 0, refused: 0, returns: 0, returnsAdmitted: 0 };
      if (s.status === 200) w.admitted++;
      else w.refused++;
      if (s.try > 0) w.returns++;
      if (s.try > 0 && s.status === 200) w.returnsAdmitted++;
      windows.set(Math.floor(s.at / 100), w);
    }
    const rows = [...windows.entries()].sort((a, b) => a[0] - b[0]);
    const ok = results.filter(Boolean).length;
    const maxReturns = Math.max(...rows.map(([, w]) => w.returns));
    // Returns only: first tries are timed as the test process sent them, and a loaded machine sent half of the 40 in
    // the second window (a CI run: 13 admitted there, all first tries, let in as the gateway received them, at its rate).
    const maxAdmittedLater = Math.max(...rows.filter(([k]) => k > 0).map(([, w]) => w.returnsAdmitted));
    console.info(
      `40 SDK agents, 600/min burst 5: ${ok} answered, ${sent.length} HTTP requests, last at ${Math.round(Math.max(...sent.map((s) => s.at)))} ms; ` +
        `most returns in one 100 ms window ${maxReturns}, most returns admitted in one after the first ${maxAdmittedLater}; ` +
        `windows (admitted/refused/returns): ${rows.map(([k, w]) => `${k}:${w.admitted}/${w.refused}/${w.returns}`).join(' ')}`,
    );
    // At ten a second, three tries each over a few seconds: most get in.
    expect(ok).toBeGreaterThanOrEqual(30);
    // The provider saw the rate, never the refusals.
    expect(mock.stats().total).toBe(sent.filter((s) => s.status === 200).length);
    // They did not all come back at once: told successive slots, they came back spread out.
    expect(maxReturns).toBeLessThanOrEqual(10);
    expect(maxAdmittedLater).toBeLessThanOrEqual(4);
  });
});

describe('two gateways on one redis-server', () => {
  it('hold a tenant to one fleet-wide rate; with Redis stopped each holds it to the whole rate alone; the fleet rate returns with Redis', async () => {
    const redis = await startRedis();
    try {
      const mock = await startMock();
      const state = { redis: redis.url, keyPrefix: `s21-${randomUUID()}`, commandTimeoutMs: 200 };
      const auth = { limits: { alpha: { requestsPerMinute: 1200, burst: 10 }, analytics: { tokensPerMinute: 6000 } } }; // alpha: 20 a second
      const urls = [await tenantGateway(mock, auth, { state }), await tenantGateway(mock, auth, { state })];
      // Each gateway gets about 40 a second from alpha, twice the rate; beta on the same gateways goes on unlimited.
      const phase = async (ms: number) => {
        const t0 = performance.now();
        const answers = (await Promise.all(urls.map((u) => loopFor(ms, 2, () => call(u, 'alpha'), 40)))).flat();
        return { s: (performance.now() - t0) / 1000, admitted: answers.filter((a) => a.status === 200).length, refused: answers.filter((a) => a.status === 429).length, other: answers.filter((a) => a.status !== 200 && a.status !== 429).length };
      };
      const shared = await phase(2000);
      // The token rate is the fleet's too: a huge prompt answered through one gateway holds the tenant at the other.
      expect((await call(urls[0]!, 'analytics', { model: 'gpt-4o', messages: [{ role: 'user', content: 'x'.repeat(40_000) }] })).status).toBe(200);
      await sleep(100); // tokens are counted after the answer, off the request path
      expect((await call(urls[1]!, 'analytics')).code).toBe('client_rate_limited');
      await redis.stop();
      await sleep(300);
      const away = await phase(2000);
      const degraded = await Promise.all(urls.map(async (u) => sumOf(await metrics(u), 'stormgate_state_degraded')));
      await redis.restart();
      // Recovers by itself: wait until both are back on Redis (reconnects are at most 2 s apart).
      const until = performance.now() + 10_000;
      while (performance.now() < until) {
        const d = await Promise.all(urls.map(async (u) => sumOf(await metrics(u), 'stormgate_state_degraded')));
        if (d.every((x) => x === 0)) break;
        await sleep(100);
      }
      const back = await phase(2000);
      const betaOk = (await Promise.all(Array.from({ length: 10 }, (_, i) => call(urls[i % 2]!, 'beta')))).every((a) => a.status === 200);
      console.info(`alpha at 20/s (burst 10), sent ~80/s over two gateways: shared ${JSON.stringify(shared)}, Redis away ${JSON.stringify(away)}, back ${JSON.stringify(back)}`);
      expect(degraded).toEqual([1, 1]);
      expect(shared.other + away.other + back.other).toBe(0);
      // One rate for the fleet: a burst and 20 a second, not twice that.
      expect(shared.admitted).toBeLessThanOrEqual(10 + 20 * shared.s + 3);
      // Not held below it: all it sent, when a loaded machine sent fewer (a CI run's loops sent 25 in 2.2 s, none refused).
      expect(shared.admitted).toBeGreaterThanOrEqual(Math.min(shared.admitted + shared.refused, 10 + 20 * shared.s * 0.6));
      // Redis away: each instance the whole rate on its own, so at most twice it (a fresh burst each).
      expect(away.admitted).toBeLessThanOrEqual(2 * (10 + 20 * away.s) + 3);
      expect(away.admitted).toBeGreaterThanOrEqual(Math.min(away.admitted + away.refused, 10 + 20 * away.s * 0.6));
      // Back on Redis (an empty one: a fresh burst), one rate again.
      expect(back.admitted).toBeLessThanOrEqual(10 + 20 * back.s + 3);
      expect(betaOk).toBe(true);
    } finally {
      await redis.stop();
    }
  });
});

describe("the SDK's own retries against client_rate_limited, across two gateways on one redis-server", () => {
  // Refused together, clients are told successive slots (Client keys). Each gateway used to keep the slots it told on
  // its own, so in a fleet of two every slot was told twice: half the returns were refused again (26 of 52 in one run,
  // 39 of 58 with three gateways), and 8 of 40 calls ran out of the SDK's two retries (15 with three), where one
  // gateway alone answered 40 of 40. The slots told are now kept with the rate, in Redis.
  it('40 agents split over two gateways come back spread over the fleet rate, and get in as with one gateway', async () => {
    const redis = await startRedis();
    try {
      const mock = await startMock({ faults: { latencyMs: 10 } });
      const state = { redis: redis.url, keyPrefix: `s21-${randomUUID()}`, commandTimeoutMs: 500 };
      const auth = { limits: { alpha: { requestsPerMinute: 600, burst: 5 } } };
      const urls = [await tenantGateway(mock, auth, { state }), await tenantGateway(mock, auth, { state })];
      const sent: Array<{ try: number; status: number }> = [];
      const results = await Promise.all(
        Array.from({ length: 40 }, (_, i) => {
          let n = 0;
          const sdk = new OpenAI({
            baseURL: `${urls[i % 2]}/v1`,
            apiKey: KEYS.alpha, // maxRetries: 2, the SDK's default
            fetch: async (u, init) => {
              const entry = { try: n++, status: 0 };
              const res = await fetch(u, init);
              entry.status = res.status;
              sent.push(entry);
              return res;
            },
          });
          return sdk.chat.completions.create({ model: 'gpt-4o', messages }).then(() => true, () => false);
        }),
      );
      const returns = sent.filter((s) => s.try > 0);
      const refusedAgain = returns.filter((s) => s.status === 429).length;
      // First tries let in past the burst of 5: a loaded test process sends the 40 over a second or more, and each one
      // sent late takes a slot a refused agent was told, which refuses that agent again once (a CI run: 11 returns
      // refused again, of about 30). With slots told twice it was half the returns whenever they were sent.
      const lateFirstTries = Math.max(0, sent.filter((s) => s.try === 0 && s.status === 200).length - 5);
      console.info(`two gateways, 40 SDK agents: ${results.filter(Boolean).length} answered, ${sent.length} HTTP requests, ${refusedAgain} of ${returns.length} returns refused again, ${lateFirstTries} first tries let in past the burst`);
      expect(results.filter(Boolean).length).toBeGreaterThanOrEqual(36);
      expect(refusedAgain).toBeLessThanOrEqual(returns.length * 0.3 + lateFirstTries);
      expect(mock.stats().total).toBe(sent.filter((s) => s.status === 200).length);
    } finally {
      await redis.stop();
    }
  });
});

describe('the slots told to refused requests, in the store', () => {
  it('two RedisStores on one server tell successive slots to refusals alternating between them; the MemoryStore as one instance', async () => {
    const redis = await startRedis();
    const keyPrefix = `s21-told-${randomUUID()}`;
    const a = new RedisStore({ config: { redis: redis.url, commandTimeoutMs: 500, keyPrefix } });
    const b = new RedisStore({ config: { redis: redis.url, commandTimeoutMs: 500, keyPrefix } });
    try {
      expect(await a.ready()).toBe(true);
      expect(await b.ready()).toBe(true);
      const requests = rateOf(600, 1); // one per 100 ms
      const now = Date.now();
      const told = async (store: Pick<StateStore, 'admitClient'>) => (await store.admitClient('alpha', { requests }, now))?.waitMs;
      expect(await told(a)).toBeUndefined(); // the burst
      // Refused at the same moment, on either instance: 100, 200, 300, 400 ms, each slot told once across the fleet.
      const fleet = [await told(a), await told(b), await told(a), await told(b)];
      expect(fleet.map((ms) => Math.round(ms! / 100))).toEqual([1, 2, 3, 4]);
      const memory = new MemoryStore();
      expect(await told(memory)).toBeUndefined();
      expect([await told(memory), await told(memory)].map((ms) => Math.round(ms! / 100))).toEqual([1, 2]);
      // A refusal by tokens is told the end of the debt (no slot), never earlier than the queue already told.
      const tokens = clientRates({ tokensPerMinute: 600 }).tokens!;
      memory.spendTokens('beta', tokens, 1200, now); // 600 over: a minute, and a token's 100 ms for the next request
      expect((await memory.admitClient('beta', { tokens }, now))?.waitMs).toBeCloseTo(60_100, 0);
    } finally {
      await Promise.all([a.close(), b.close()]);
      await redis.stop();
    }
  });
});

describe('config mistakes a platform team makes onboarding tenants', () => {
  const yaml = (auth: string) => `
providers:
  openai: { family: openai, baseUrl: "http://127.0.0.1:9/v1", apiKey: k }
routes:
  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: openai } ] }
auth:
${auth}
`;
  it('names the path and what is expected, at start-up', () => {
    // A limit for a tenant not yet given a key (onboarded in the limits first).
    expect(() => parseConfig(yaml('  keys: { alpha: key-a }\n  limits: { beta: { requestsPerMinute: 600 } }'), 'gateway.yaml', {})).toThrow(/auth\.limits\.beta[\s\S]*no client "beta" in auth\.keys/);
    // A priority for a tenant with no key, and a class no provider has.
    expect(() => parseConfig(yaml('  keys: { alpha: key-a }\n  priority: { batch-jobs: batch }'), 'gateway.yaml', {})).toThrow(/auth\.priority\.batch-jobs[\s\S]*no client "batch-jobs"/);
    expect(() => parseConfig(yaml('  keys: { alpha: key-a }\n  priority: { alpha: bulk }'), 'gateway.yaml', {})).toThrow(/auth\.priority\.alpha[\s\S]*"bulk" is not a priority class/);
    // Two tenants given the same key: the log could not tell them apart, nor their limits.
    expect(() => parseConfig(yaml('  keys: { alpha: key-a, beta: key-a }'), 'gateway.yaml', {})).toThrow(/auth\.keys\.beta[\s\S]*same key as client "alpha"/);
    // Limits with no keys at all.
    expect(() => parseConfig(yaml('  keys: {}\n  limits: { "*": { requestsPerMinute: 600 } }'), 'gateway.yaml', {})).toThrow(/auth\.keys/);
    // "*" unquoted is a YAML alias, not a name. The parser said "Alias ending in : is ambiguous" after three
    // "Unexpected ... token" lines; the loader now says to quote it, block or flow style.
    const quoteIt = /gateway\.yaml:9: an unquoted \* is a YAML alias, not a name: quote it \("\*": \.\.\.\)/;
    expect(() => parseConfig(yaml('  keys: { alpha: key-a }\n  limits:\n    *: { requestsPerMinute: 600 }'), 'gateway.yaml', {})).toThrow(quoteIt);
    expect(() => parseConfig(yaml('  keys: { alpha: key-a }\n  limits:\n    *:\n      requestsPerMinute: 600'), 'gateway.yaml', {})).toThrow(quoteIt);
    expect(() => parseConfig(yaml('  keys: { alpha: key-a }\n  limits: { alpha: { requestsPerMinute: 6 }, *: { requestsPerMinute: 60 } }'), 'gateway.yaml', {})).toThrow(/gateway\.yaml:8: an unquoted \*/);
    // An alias that is one (a merge key) is not taken for it.
    expect(() => parseConfig(yaml('  keys: { alpha: key-a, beta: key-b }\n  limits:\n    alpha: &l { requestsPerMinute: 600 }\n    beta: *l'), 'gateway.yaml', {})).not.toThrow();
  });
});
