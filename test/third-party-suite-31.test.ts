// A thirty-first third-party suite, written from the README alone ("Priority pools, adaptive concurrency, load
// shedding" and its bullet "Request and token rates per target", "Failover and API families" with "Anthropic clients
// (/v1/messages)", "Deadlines and timeouts", "Streaming", "Errors", "The mock provider" and its `rateLimit`, the
// configuration reference for `providers.<name>.pools`), as an outside team evaluating LLM gateways would test THE
// PROVIDER RATES MEETING THE REST OF THE PRODUCT, which test/provider-rate.test.ts checks alone: a rate with a backup
// target behind it (of the same family and of Anthropic's), streams under a rate, two models of one provider paced
// separately and two aliases of one model paced together, online and batch classes under a request and a token rate,
// a client's deadline shorter than its turn (shed at once, and the SDK's own retry coming back at the right time),
// how the token estimate counts `n`, `max_completion_tokens` and a call larger than a minute's worth, retries taking
// turns like first attempts, the gateway pacing under the mock's real OpenAI-style rate limit (no 429 reaches the
// provider's count), the metrics and log fields the README names, and bad rate settings refused at start-up.
// Black box over real HTTP on 127.0.0.1: the official `openai` (6.x) and `@anthropic-ai/sdk` clients against
// gateways started as the other suites start them, in front of the bundled mock provider. Timing bounds are generous
// (a loaded 2-core machine); rates are hundreds a minute with small bursts, so each test takes seconds.
// Found and fixed: a bad `tokensPerMinute` (`tokensPerMinute: lots`) was refused without the value found ("expected
// number, received string"), where the README promises it "except a credential's": every key with "token" (or "key")
// in its name was taken for a credential (src/config/zod-issues.ts: a key named for a quantity, `...Ms`,
// `...PerMinute`, `...Tokens`, is not; `firstTokenMs: 30s` was hidden the same way).
// Left as design questions (reported, not built): the token rate holds a minute's worth at once and has no `burst`,
// so against a provider that enforces its TPM over a second (the mock's `burstSeconds: 1`, which the README says
// OpenAI may do) 10 calls of ~520 tokens at once under `tokensPerMinute: 54000` met 8 upstream 429s; and a retry the
// rate cannot serve in time ends with the provider's message alone (`retriesStopped: shed` only in the log line),
// where "Priority pools" says the message says the retry found no slot ("Logs and metrics" says an upstream error
// keeps the provider's message).
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import { loadConfigFile } from '../src/config/load.ts';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import type { FaultSpec, MockRequestLog, MockServer } from '../src/mock/server.ts';
import { sdkError } from './helpers/openai-error.ts';
import { scrapeMetrics, TEST_KEY, useExtraMocks, useGateways } from './helpers/stack.ts';

const startMock = useExtraMocks();
const startGateway = useGateways();

type ProviderInput = ConfigInput['providers'][string];
type RouteInput = ConfigInput['routes'][number];
type Pools = NonNullable<ProviderInput['pools']>;

const ask = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'Summarise the incident report.' }] };
const CLAUDE = 'claude-sonnet-4-6';

/** The most arrivals in any window of `ms` (a window opening at each arrival). */
function mostIn(requests: readonly MockRequestLog[], ms: number): number {
  const at = requests.map((r) => r.receivedAt).sort((a, b) => a - b);
  let most = 0;
  for (let i = 0, j = 0; i < at.length; i++) {
    while (at[i]! - at[j]! >= ms) j++;
    most = Math.max(most, i - j + 1);
  }
  return most;
}

/** First to last arrival, in ms. */
function spanOf(requests: readonly MockRequestLog[]): number {
  const at = requests.map((r) => r.receivedAt);
  return Math.max(...at) - Math.min(...at);
}

const openaiProvider = (mock: MockServer, pools?: Pools, extra: Partial<ProviderInput> = {}): ProviderInput => ({
  family: 'openai',
  baseUrl: `${mock.url}/v1`,
  apiKey: TEST_KEY,
  breaker: false,
  ...(pools ? { pools } : {}),
  ...extra,
});
const anthropicProvider = (mock: MockServer, pools?: Pools): ProviderInput => ({ family: 'anthropic', baseUrl: mock.url, apiKey: TEST_KEY, breaker: false, ...(pools ? { pools } : {}) });

/** A route with no parking, a budget that never refuses and a short minAttemptMs, so what a test sees is the pacing. */
const route = (name: string, path: string, targets: RouteInput['targets'], extra: Partial<RouteInput> = {}): RouteInput => ({
  name,
  match: { path },
  targets,
  park: false,
  minAttemptMs: 200,
  budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 },
  ...extra,
});

interface Rig {
  url: string;
  baseURL: string;
  logs: string[];
}

async function gateway(providers: Record<string, ProviderInput>, routes: RouteInput[], extra: Partial<ConfigInput> = {}): Promise<Rig> {
  const logs: string[] = [];
  const url = await startGateway(ConfigSchema.parse({ server: { host: '127.0.0.1', port: 0, logLevel: 'info' }, providers, routes, ...extra }), { logs });
  return { url, baseURL: `${url}/v1`, logs };
}

/** One paced provider `mock` behind the chat route. */
async function pacedGateway(pools: Pools, o: { faults?: FaultSpec; route?: Partial<RouteInput> } = {}): Promise<Rig & { mock: MockServer }> {
  const mock = await startMock({ apiKey: TEST_KEY, faults: o.faults });
  const rig = await gateway({ mock: openaiProvider(mock, pools) }, [route('chat', '/v1/chat/completions', [{ provider: 'mock' }], o.route)]);
  return { ...rig, mock };
}

/** An SDK client with `timeoutMs` to live on every call (the README's client-wide deadline header), no SDK retries. */
const clientOf = (r: Rig, timeoutMs?: number, maxRetries = 0) =>
  new OpenAI({ baseURL: r.baseURL, apiKey: 'sk-client', maxRetries, defaultHeaders: timeoutMs ? { 'x-stormgate-timeout-ms': String(timeoutMs) } : {} });

type Outcome = { ok: true; ms: number; headers: Headers; model: string; text: string } | { ok: false; ms: number; status?: number; code?: string | null; headers?: Headers; shouldRetry?: string | null; retryAfterMs?: number };

/** One chat call through the SDK: what came back (answer and headers, or the SDK's error) and how long it took. */
async function call(client: OpenAI, body: object = ask, opts: OpenAI.RequestOptions = {}): Promise<Outcome> {
  const t0 = Date.now();
  try {
    const { data, response } = await client.chat.completions.create({ ...ask, ...body } as OpenAI.ChatCompletionCreateParamsNonStreaming, opts).withResponse();
    return { ok: true, ms: Date.now() - t0, headers: response.headers, model: data.model, text: data.choices[0]?.message.content ?? '' };
  } catch (err) {
    const e = err as InstanceType<typeof OpenAI.APIError>;
    if (!(e instanceof OpenAI.APIError)) throw err;
    return { ok: false, ms: Date.now() - t0, status: e.status, code: e.code, headers: e.headers, shouldRetry: e.headers?.get('x-should-retry'), retryAfterMs: Number(e.headers?.get('retry-after-ms')) };
  }
}

const answered = (outs: Outcome[]) => outs.filter((o): o is Extract<Outcome, { ok: true }> => o.ok);
const refused = (outs: Outcome[]) => outs.filter((o): o is Extract<Outcome, { ok: false }> => !o.ok);

/** The chat route's request log lines. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- a log line is JSON: tests read whatever field they check
const requestLines = (r: Rig, name = 'chat'): Array<Record<string, any>> => r.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.route === name);

// ---------------------------------------------------------------------------------------------------------------

describe('a rate with a backup target behind it', () => {
  /** A primary paced at one a second and an unpaced backup of the same family. */
  async function withBackup(primaryPools: Pools, backupPools?: Pools) {
    const primary = await startMock({ apiKey: TEST_KEY });
    const backup = await startMock({ apiKey: TEST_KEY });
    const rig = await gateway({ primary: openaiProvider(primary, primaryPools), backup: openaiProvider(backup, backupPools) }, [
      route('chat', '/v1/chat/completions', [{ provider: 'primary' }, { provider: 'backup' }]),
    ]);
    return { ...rig, primary, backup };
  }

  it('sends a call the primary\'s rate cannot serve before its deadline to the backup at once, and answers every call', async () => {
    // One a second at the primary: of 5 calls with 2.5 s to live, the turns at 0, 1 and 2 s may go there; the others
    // cannot have theirs in time ("rate-limited past the client's deadline": the next target answers).
    const r = await withBackup({ requestsPerMinute: 60, burst: 1 });
    const outs = await Promise.all(Array.from({ length: 5 }, () => call(clientOf(r, 2_500))));
    expect(refused(outs)).toEqual([]);
    const viaPrimary = r.primary.requests().length;
    const viaBackup = r.backup.requests().length;
    expect(viaPrimary).toBeGreaterThanOrEqual(2);
    expect(viaPrimary).toBeLessThanOrEqual(3);
    expect(viaPrimary + viaBackup).toBe(5);
    // The ones the backup answered were moved on at once (the pool shed them), not after waiting at the primary.
    const moved = answered(outs).filter((o) => o.headers.get('x-stormgate-fallback') !== null);
    expect(moved).toHaveLength(viaBackup);
    for (const o of moved) {
      expect(o.headers.get('x-stormgate-fallback')).toBe('shed');
      expect(o.ms).toBeLessThan(1_500);
    }
    const fallbacks = (await scrapeMetrics(r.url)).filter((m) => m.name === 'stormgate_fallbacks_total' && m.labels.reason === 'shed');
    expect(fallbacks.reduce((a, m) => a + m.value, 0)).toBe(viaBackup);
  });

  it('keeps a call that can wait for its turn at the primary rather than sending it to the backup', async () => {
    // 10 a second, 2 at once, 6 calls with 10 s to live: every turn comes well in time, so none moves on.
    const r = await withBackup({ requestsPerMinute: 600, burst: 2 });
    const outs = await Promise.all(Array.from({ length: 6 }, () => call(clientOf(r, 10_000))));
    expect(answered(outs)).toHaveLength(6);
    expect(r.primary.requests()).toHaveLength(6);
    expect(r.backup.requests()).toHaveLength(0);
    expect(spanOf(r.primary.requests())).toBeGreaterThanOrEqual(300);
  });

  it('sheds a call neither target\'s rate can serve in time with load_shed and a retry-after, sending it nowhere', async () => {
    // Both paced at one a second: 6 calls with 1.5 s to live; each target takes its turns at 0 and 1 s at most.
    const r = await withBackup({ requestsPerMinute: 60, burst: 1 }, { requestsPerMinute: 60, burst: 1 });
    const outs = await Promise.all(Array.from({ length: 6 }, () => call(clientOf(r, 1_500))));
    const sent = r.primary.requests().length + r.backup.requests().length;
    expect(answered(outs)).toHaveLength(sent);
    expect(sent).toBeGreaterThanOrEqual(2);
    expect(sent).toBeLessThanOrEqual(4);
    for (const o of refused(outs)) {
      // Nothing was sent for it, so it is told to come back (a load_shed, never the final failure of an attempt).
      expect(o.status).toBe(503);
      expect(o.code).toBe('load_shed');
      expect(o.shouldRetry).toBe('true');
      expect(o.retryAfterMs).toBeGreaterThan(0);
      expect(o.retryAfterMs).toBeLessThanOrEqual(60_000);
      expect(o.ms).toBeLessThan(1_200);
    }
  });

  it('tells a call both targets shed the soonest either expects a turn for it, not the primary\'s wait', async () => {
    // The primary: one every 20 s; the backup: one every 2 s. Each spends its burst of one on the first two calls.
    const r = await withBackup({ requestsPerMinute: 3, burst: 1 }, { requestsPerMinute: 30, burst: 1 });
    const client = clientOf(r, 1_000);
    expect((await call(client)).ok).toBe(true);
    expect((await call(client)).ok).toBe(true);
    const third = await call(client);
    expect(third.ok).toBe(false);
    if (third.ok) return;
    expect(third.code).toBe('load_shed');
    // The backup's turn is about 2 s away (the primary's about 20 s): that is when the call can come back and be served.
    expect(third.retryAfterMs).toBeGreaterThan(500);
    expect(third.retryAfterMs).toBeLessThan(5_000);
    expect(r.primary.requests().length + r.backup.requests().length).toBe(2);
  });

  it('sends a retry the primary\'s rate cannot serve in time to the backup, and without one ends with the attempt\'s failure', async () => {
    // The primary fails every first attempt (503); its retry's turn is a second away, past a 1 s deadline.
    const failsFirst = { errors: [{ status: 503, firstAttemptsOnly: true }] } as FaultSpec;
    const primary = await startMock({ apiKey: TEST_KEY, faults: failsFirst });
    const backup = await startMock({ apiKey: TEST_KEY });
    const pools = { requestsPerMinute: 60, burst: 1 };
    const both = await gateway({ primary: openaiProvider(primary, pools), backup: openaiProvider(backup) }, [route('chat', '/v1/chat/completions', [{ provider: 'primary' }, { provider: 'backup' }])]);
    const moved = await call(clientOf(both, 1_000));
    expect(moved).toMatchObject({ ok: true });
    expect((moved as Extract<Outcome, { ok: true }>).headers.get('x-stormgate-fallback')).toBe('shed');
    expect(primary.requests()).toHaveLength(1);
    expect(backup.requests()).toHaveLength(1);
    // Alone, the primary's failure is the answer: something was sent, so it is not a load_shed that invites the SDK
    // back on top of the gateway's attempt, and the log line says what stopped the retry.
    primary.reset();
    const alone = await gateway({ primary: openaiProvider(primary, pools) }, [route('chat', '/v1/chat/completions', [{ provider: 'primary' }])]);
    const failed = await call(clientOf(alone, 1_000));
    expect(failed).toMatchObject({ ok: false, status: 503, shouldRetry: 'false' });
    expect((failed as Extract<Outcome, { ok: false }>).code).not.toBe('load_shed');
    expect(primary.requests()).toHaveLength(1);
    await sleep(50);
    expect(requestLines(alone)[0]).toMatchObject({ status: 503, retriesStopped: 'shed' });
  });

  it('moves a call the OpenAI primary\'s rate cannot serve to an Anthropic backup, answered in the chat completion shape', async () => {
    const primary = await startMock({ apiKey: TEST_KEY });
    const claude = await startMock({ apiKey: TEST_KEY });
    const r = await gateway({ openai: openaiProvider(primary, { requestsPerMinute: 60, burst: 1 }), claude: anthropicProvider(claude) }, [
      route('chat', '/v1/chat/completions', [{ provider: 'openai' }, { provider: 'claude', model: CLAUDE }]),
    ]);
    const outs = await Promise.all(Array.from({ length: 4 }, () => call(clientOf(r, 2_000), { max_tokens: 64 })));
    expect(refused(outs)).toEqual([]);
    const viaClaude = answered(outs).filter((o) => o.headers.get('x-stormgate-fallback') === 'shed');
    expect(viaClaude.length).toBeGreaterThanOrEqual(2);
    expect(viaClaude.length + primary.requests().length).toBe(4);
    for (const o of viaClaude) {
      // The fallback's own model, translated back to a chat completion with its text.
      expect(o.model).toBe(CLAUDE);
      expect(o.text.length).toBeGreaterThan(0);
    }
    expect(claude.requests().every((q) => q.path === '/v1/messages')).toBe(true);
  });

  it('streams a call the primary\'s rate moved to the backup, whole, with the fallback named on the stream\'s headers', async () => {
    const r = await withBackup({ requestsPerMinute: 60, burst: 1 });
    const client = clientOf(r, 1_500);
    const streamOne = async () => {
      const { data, response } = await client.chat.completions.create({ ...ask, stream: true }).withResponse();
      let text = '';
      let finish: string | null | undefined;
      for await (const chunk of data) {
        text += chunk.choices[0]?.delta.content ?? '';
        finish ??= chunk.choices[0]?.finish_reason;
      }
      return { text, finish, fallback: response.headers.get('x-stormgate-fallback') };
    };
    const outs = await Promise.all(Array.from({ length: 3 }, streamOne));
    for (const o of outs) {
      expect(o.text.length).toBeGreaterThan(0);
      expect(o.finish).toBe('stop');
    }
    expect(outs.filter((o) => o.fallback === 'shed')).toHaveLength(r.backup.requests().length);
    expect(r.backup.requests().length).toBeGreaterThanOrEqual(1);
    expect(r.backup.requests().every((q) => q.stream)).toBe(true);
  });
});

// ---------------------------------------------------------------------------------------------------------------

describe('streams under a rate', () => {
  it('paces a crowd of SDK streams at the rate and its burst, each streamed whole', async () => {
    const r = await pacedGateway({ requestsPerMinute: 600, burst: 2 });
    const client = clientOf(r);
    const texts = await Promise.all(
      Array.from({ length: 14 }, async () => {
        let text = '';
        for await (const chunk of await client.chat.completions.create({ ...ask, stream: true })) text += chunk.choices[0]?.delta.content ?? '';
        return text;
      }),
    );
    expect(texts.every((t) => t.length > 0)).toBe(true);
    const seen = r.mock.requests();
    expect(seen).toHaveLength(14);
    expect(seen.every((q) => q.stream)).toBe(true);
    // 10 a second and 2 at once: 14 streams take over a second to start, never more than 13 in any second.
    expect(mostIn(seen, 1_000)).toBeLessThanOrEqual(13);
    expect(spanOf(seen)).toBeGreaterThanOrEqual(900);
  });

  it('refuses a stream that cannot have its turn before its deadline before any event, as an error the SDK raises', async () => {
    // One a second; 1 s to live (less the 250 ms margin): the second call's turn, a second away, is too late.
    const r = await pacedGateway({ requestsPerMinute: 60, burst: 1 });
    const client = clientOf(r, 1_000);
    await client.chat.completions.create(ask); // takes the one turn there is
    const t0 = Date.now();
    const err = await sdkError(
      (async () => {
        for await (const _chunk of await client.chat.completions.create({ ...ask, stream: true })) throw new Error('no event was expected');
      })(),
    );
    expect(Date.now() - t0).toBeLessThan(1_000);
    expect(err.status).toBe(503);
    expect(err.code).toBe('load_shed');
    expect(err.headers?.get('x-should-retry')).toBe('true');
    expect(Number(err.headers?.get('retry-after-ms'))).toBeGreaterThanOrEqual(300);
    expect(r.mock.requests()).toHaveLength(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------

describe('rates per target: per model', () => {
  it('paces two models of one provider separately, each at the whole rate', async () => {
    // Two a second each, one at once: 3 calls of each model at once.
    const r = await pacedGateway({ requestsPerMinute: 120, burst: 1 });
    const client = clientOf(r);
    const outs = await Promise.all(['gpt-4o', 'gpt-4o-mini'].flatMap((model) => Array.from({ length: 3 }, () => call(client, { model }))));
    expect(answered(outs)).toHaveLength(6);
    const seen = r.mock.requests();
    const of = (model: string) => seen.filter((q) => q.model === model);
    for (const model of ['gpt-4o', 'gpt-4o-mini']) {
      expect(of(model)).toHaveLength(3);
      // Each model at its own rate: half a second apart (less a little bunching on the wire).
      expect(mostIn(of(model), 400)).toBe(1);
      expect(spanOf(of(model))).toBeGreaterThanOrEqual(800);
    }
    // ... and neither behind the other: each model's first went at once.
    const firsts = ['gpt-4o', 'gpt-4o-mini'].map((m) => Math.min(...of(m).map((q) => q.receivedAt)));
    expect(Math.abs(firsts[0]! - firsts[1]!)).toBeLessThan(300);
    // Both together ran over the same second or so, not one after the other (which would take 2.5 s).
    expect(spanOf(seen)).toBeLessThan(2_000);
  });

  it('paces two aliases of one provider model together: the provider counts the model, not the alias', async () => {
    const mock = await startMock({ apiKey: TEST_KEY });
    const r = await gateway({ mock: openaiProvider(mock, { requestsPerMinute: 120, burst: 1 }) }, [
      route('fast', '/v1/chat/completions', [{ provider: 'mock', model: 'gpt-4o' }], { match: { path: '/v1/chat/completions', models: ['fast'] } }),
      route('smart', '/v1/chat/completions', [{ provider: 'mock', model: 'gpt-4o' }], { match: { path: '/v1/chat/completions', models: ['smart'] } }),
    ]);
    const client = clientOf(r);
    const outs = await Promise.all(['fast', 'smart', 'fast', 'smart'].map((model) => call(client, { model })));
    expect(answered(outs)).toHaveLength(4);
    const seen = mock.requests();
    expect(seen.every((q) => q.model === 'gpt-4o')).toBe(true);
    // One gpt-4o rate of two a second: 4 calls over ~1.5 s, never two within 400 ms (each alias at the whole rate
    // would send two at once, twice).
    expect(mostIn(seen, 400)).toBe(1);
    expect(spanOf(seen)).toBeGreaterThanOrEqual(1_200);
  });
});

// ---------------------------------------------------------------------------------------------------------------

describe('classes under a rate', () => {
  it('sheds a batch call that cannot have its turn in time with 429 load_shed (the lowest class), an online one with 503', async () => {
    const r = await pacedGateway({ requestsPerMinute: 60, burst: 1 });
    const client = clientOf(r, 1_000);
    expect((await call(client)).ok).toBe(true); // the turn there was
    const [online, batch] = await Promise.all([call(client), call(client, ask, { headers: { 'x-stormgate-priority': 'batch' } })]);
    expect(online).toMatchObject({ ok: false, status: 503, code: 'load_shed', shouldRetry: 'true' });
    expect(batch).toMatchObject({ ok: false, status: 429, code: 'load_shed', shouldRetry: 'true' });
    for (const o of refused([online, batch])) {
      expect(o.retryAfterMs).toBeGreaterThan(0);
      expect(o.ms).toBeLessThan(1_000);
    }
    expect(r.mock.requests()).toHaveLength(1);
    const sheds = (await scrapeMetrics(r.url)).filter((m) => m.name === 'stormgate_shed_total' && m.value > 0);
    expect(sheds.map((m) => [m.labels.priority, m.labels.reason, m.value]).sort()).toEqual([
      ['batch', 'deadline', 1],
      ['online', 'deadline', 1],
    ]);
  });

  it('lets an online call past a batch call the token rate holds back; later batch calls wait behind it', async () => {
    // 60,000 tokens a minute (1,000 a second, a minute's worth at once). A batch call of ~59,960 tokens empties the
    // bucket; the next batch call needs ~3,000 (about 3 s); an online call of ~120 and a small batch call come after.
    const r = await pacedGateway({ tokensPerMinute: 60_000 });
    const client = clientOf(r, 20_000);
    const as = (id: string, priority = 'online') => ({ headers: { 'x-request-id': `s31-${id}`, 'x-stormgate-priority': priority } });
    expect((await call(client, { max_tokens: 59_950 }, as('drain', 'batch'))).ok).toBe(true);
    const bigBatch = call(client, { max_tokens: 3_000 }, as('big-batch', 'batch'));
    await sleep(150);
    const smallBatch = call(client, { max_tokens: 10 }, as('small-batch', 'batch'));
    await sleep(50);
    const online = await call(client, { max_tokens: 100 }, as('online'));
    expect(online.ok).toBe(true);
    expect(online.ms).toBeLessThan(1_500);
    const [big, small] = await Promise.all([bigBatch, smallBatch]);
    expect(big.ok && small.ok).toBe(true);
    expect(big.ms).toBeGreaterThan(1_500);
    // What the provider saw, in order: the drain, the online call, then the held-back batch call before the small
    // one of its class behind it.
    expect(r.mock.requests().map((q) => q.headers['x-client-request-id'])).toEqual(['s31-drain', 's31-online', 's31-big-batch', 's31-small-batch']);
  });
});

// ---------------------------------------------------------------------------------------------------------------

describe('a client deadline shorter than the turn', () => {
  it('sheds at once a call whose SDK timeout ends before its turn, with the time to the turn, and sends nothing', async () => {
    const r = await pacedGateway({ requestsPerMinute: 60, burst: 1 });
    const client = new OpenAI({ baseURL: r.baseURL, apiKey: 'sk-client', maxRetries: 0 });
    expect((await call(client)).ok).toBe(true);
    // A per-request timeout is sent as x-stainless-timeout (whole seconds): a 1.5 s timeout is a deadline of about 1 s.
    const shed = await call(client, ask, { timeout: 1_500 });
    expect(shed).toMatchObject({ ok: false, status: 503, code: 'load_shed', shouldRetry: 'true' });
    expect(shed.ms).toBeLessThan(800);
    const wait = (shed as Extract<Outcome, { ok: false }>).retryAfterMs!;
    expect(wait).toBeGreaterThanOrEqual(300);
    expect(wait).toBeLessThanOrEqual(2_000);
    expect(r.mock.requests()).toHaveLength(1);
  });

  it('brings the SDK back with its default retries when its turn comes, so each call reaches the provider once', async () => {
    // One a second; 3 calls with 1.5 s timeouts: the first goes, the others are told their turns (1 s, 2 s) and the
    // SDK waits that long before sending them again.
    const r = await pacedGateway({ requestsPerMinute: 60, burst: 1 });
    let sdkRequests = 0;
    const client = new OpenAI({
      baseURL: r.baseURL,
      apiKey: 'sk-client',
      fetch: async (url, init) => {
        sdkRequests++;
        return fetch(url, init);
      },
    });
    const t0 = Date.now();
    const outs = await Promise.all(Array.from({ length: 3 }, () => call(client, ask, { timeout: 1_500 })));
    expect(refused(outs)).toEqual([]);
    const seen = r.mock.requests();
    expect(seen).toHaveLength(3);
    expect(r.mock.stats().byStatus['429']).toBeUndefined();
    // At most one more SDK request per call it was told to wait: it came back when told, not hammering.
    expect(sdkRequests).toBeLessThanOrEqual(6);
    expect(Date.now() - t0).toBeLessThan(5_000);
    expect(spanOf(seen)).toBeGreaterThanOrEqual(1_600);
  });
});

// ---------------------------------------------------------------------------------------------------------------

describe('the token estimate under a token rate', () => {
  it('counts the completion cap, max_tokens or max_completion_tokens, times n', async () => {
    // 12,000 tokens a minute; n: 3 with max_tokens 2,000 is ~6,020 tokens: two fit (the second a moment later), the
    // third would wait ~30 s. With 5 s to live, two are sent and two told at once to come back.
    const r = await pacedGateway({ tokensPerMinute: 12_000 });
    const outs = await Promise.all(Array.from({ length: 4 }, () => call(clientOf(r, 5_000), { max_tokens: 2_000, n: 3 })));
    expect(answered(outs)).toHaveLength(2);
    expect(r.mock.requests()).toHaveLength(2);
    for (const o of refused(outs)) {
      expect(o).toMatchObject({ status: 503, code: 'load_shed', shouldRetry: 'true' });
      expect(o.retryAfterMs).toBeGreaterThanOrEqual(15_000);
      expect(o.ms).toBeLessThan(2_500);
    }
    // max_completion_tokens counts as max_tokens does: of 6 calls of ~4,020 tokens, 3 fit in 12,000 (and a moment).
    const again = await pacedGateway({ tokensPerMinute: 12_000 });
    const outs2 = await Promise.all(Array.from({ length: 6 }, () => call(clientOf(again, 5_000), { max_completion_tokens: 4_000 })));
    expect(answered(outs2)).toHaveLength(3);
    expect(again.mock.requests()).toHaveLength(3);
  });

  it('sends a call larger than a minute\'s worth once the rate is full, and tells the next one the wait', async () => {
    const r = await pacedGateway({ tokensPerMinute: 6_000 });
    const big = await call(clientOf(r, 5_000), { max_tokens: 10_000 });
    expect(big.ok).toBe(true);
    expect(big.ms).toBeLessThan(1_500);
    const next = await call(clientOf(r, 5_000), { max_tokens: 1_000 });
    expect(next).toMatchObject({ ok: false, status: 503, code: 'load_shed', shouldRetry: 'true' });
    expect(r.mock.requests()).toHaveLength(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------

describe('retries under a rate', () => {
  it('gives retries their turns like first attempts: the provider never sees more than the rate', async () => {
    // Half the attempts fail with 503 (deterministic), so ~16 attempts for 8 calls, at 10 a second and 2 at once.
    const r = await pacedGateway({ requestsPerMinute: 600, burst: 2 }, { faults: { errors: [{ status: 503, rate: 0.5 }] } as FaultSpec, route: { retry: { maxAttempts: 5, backoff: { baseMs: 20, capMs: 50 } } } });
    const outs = await Promise.all(Array.from({ length: 8 }, () => call(clientOf(r, 20_000))));
    expect(answered(outs)).toHaveLength(8);
    const seen = r.mock.requests();
    expect(seen.length).toBeGreaterThanOrEqual(14);
    expect(mostIn(seen, 1_000)).toBeLessThanOrEqual(13);
    expect(spanOf(seen)).toBeGreaterThanOrEqual(1_000);
  });
});

// ---------------------------------------------------------------------------------------------------------------

describe('pacing under the provider\'s own rate limit (the mock\'s rateLimit)', () => {
  // The mock refuses past 600 a minute, its bucket a second's worth deep (10), as OpenAI may enforce a minute's limit.
  const limited = { rateLimit: { requestsPerMinute: 600, burstSeconds: 1 } } as FaultSpec;

  it('without a rate a crowd meets the provider\'s 429s; with requestsPerMinute a little under it, all are answered and none refused', async () => {
    const crowd = async (pools?: Pools) => {
      const mock = await startMock({ apiKey: TEST_KEY, faults: limited });
      const r = await gateway({ mock: openaiProvider(mock, pools) }, [route('chat', '/v1/chat/completions', [{ provider: 'mock' }], { retry: { maxAttempts: 1 } })]);
      const outs = await Promise.all(Array.from({ length: 24 }, () => call(clientOf(r, 10_000))));
      return { refused: refused(outs).length, stats: mock.stats() };
    };
    const unpaced = await crowd();
    expect(unpaced.stats.rateLimited.requests).toBeGreaterThan(0);
    expect(unpaced.refused).toBeGreaterThan(0);
    const paced = await crowd({ requestsPerMinute: 540, burst: 2 });
    expect(paced.refused).toBe(0);
    expect(paced.stats.rateLimited).toEqual({ requests: 0, tokens: 0 });
    expect(paced.stats.byStatus['429']).toBeUndefined();
  });

  it('paces a token rate the provider enforces by the second when tokenBurst says so: without it, a minute\'s worth at once meets token 429s', async () => {
    // The provider: 60,000 tokens a minute, its bucket a second's worth (1,000). Each call counts ~520 (max_tokens 500).
    const byTheSecond = { rateLimit: { tokensPerMinute: 60_000, burstSeconds: 1 } } as FaultSpec;
    const crowd = async (pools: Pools) => {
      const mock = await startMock({ apiKey: TEST_KEY, faults: byTheSecond });
      const r = await gateway({ mock: openaiProvider(mock, pools) }, [route('chat', '/v1/chat/completions', [{ provider: 'mock' }], { retry: { maxAttempts: 1 } })]);
      const client = clientOf(r, 10_000);
      const outs = await Promise.all(Array.from({ length: 10 }, () => call(client, { max_tokens: 500 })));
      return { refused: refused(outs).length, stats: mock.stats() };
    };
    const minuteDeep = await crowd({ tokensPerMinute: 54_000 });
    expect(minuteDeep.stats.rateLimited.tokens).toBeGreaterThan(0);
    const secondDeep = await crowd({ tokensPerMinute: 54_000, tokenBurst: 900 });
    expect(secondDeep.refused).toBe(0);
    expect(secondDeep.stats.rateLimited).toEqual({ requests: 0, tokens: 0 });
  });

  it('paces Anthropic SDK agents on /v1/messages under the account\'s limit: all answered, none refused', async () => {
    const mock = await startMock({ apiKey: TEST_KEY, faults: limited });
    const r = await gateway({ claude: anthropicProvider(mock, { requestsPerMinute: 540, burst: 2 }) }, [route('messages', '/v1/messages', [{ provider: 'claude' }], { retry: { maxAttempts: 1 } })]);
    const client = new Anthropic({ baseURL: r.url, apiKey: 'sk-client', maxRetries: 0 });
    const msgs = await Promise.all(Array.from({ length: 16 }, () => client.messages.create({ model: CLAUDE, max_tokens: 64, messages: [{ role: 'user', content: 'Status?' }] })));
    expect(msgs.every((m) => m.type === 'message')).toBe(true);
    expect(mock.stats().byStatus['429']).toBeUndefined();
    expect(mostIn(mock.requests(), 1_000)).toBeLessThanOrEqual(11);
  });

  it('sheds an Anthropic SDK call that cannot have its turn in time in Anthropic\'s error shape, told to come back', async () => {
    const mock = await startMock({ apiKey: TEST_KEY });
    const r = await gateway({ claude: anthropicProvider(mock, { requestsPerMinute: 60, burst: 1 }) }, [route('messages', '/v1/messages', [{ provider: 'claude' }])]);
    const client = new Anthropic({ baseURL: r.url, apiKey: 'sk-client', maxRetries: 0, defaultHeaders: { 'x-stormgate-timeout-ms': '1000' } });
    const body = { model: CLAUDE, max_tokens: 64, messages: [{ role: 'user' as const, content: 'Status?' }] };
    await client.messages.create(body);
    const err = (await client.messages.create(body).catch((e: unknown) => e)) as InstanceType<typeof Anthropic.APIError>;
    expect(err).toBeInstanceOf(Anthropic.APIError);
    expect(err.status).toBe(503);
    const e = err.error as { type: string; error: { type: string; code: string } };
    expect(e.type).toBe('error');
    expect(e.error.code).toBe('load_shed');
    expect(err.headers?.get('x-should-retry')).toBe('true');
    expect(Number(err.headers?.get('retry-after-ms'))).toBeGreaterThan(0);
    expect(mock.requests()).toHaveLength(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------

describe('what the operator sees of the pacing', () => {
  it('shows the waits in stormgate_pool_wait_seconds and the log lines\' slotWaitMs, the sheds in stormgate_shed_total', async () => {
    // 5 a second, 1 at once: 8 calls with 1.2 s to live; the turns in time are sent, the rest shed for the deadline.
    const r = await pacedGateway({ requestsPerMinute: 300, burst: 1 });
    const outs = await Promise.all(Array.from({ length: 8 }, () => call(clientOf(r, 1_200))));
    const ok = answered(outs).length;
    const shed = refused(outs).length;
    expect(ok).toBeGreaterThanOrEqual(3);
    expect(shed).toBeGreaterThanOrEqual(1);
    expect(ok + shed).toBe(8);
    const metrics = await scrapeMetrics(r.url);
    const one = (name: string, labels: Record<string, string>) =>
      metrics.filter((m) => m.name === name && Object.entries(labels).every(([k, v]) => m.labels[k] === v)).reduce((a, m) => a + m.value, 0);
    expect(one('stormgate_pool_wait_seconds_count', { provider: 'mock', priority: 'online' })).toBeGreaterThanOrEqual(ok);
    expect(one('stormgate_pool_wait_seconds_sum', { provider: 'mock', priority: 'online' })).toBeGreaterThan(0.5);
    expect(one('stormgate_shed_total', { priority: 'online', reason: 'deadline' })).toBe(shed);
    await sleep(100);
    const waits = requestLines(r)
      .flatMap((l) => (l.attempts as Array<{ slotWaitMs?: number }> | undefined) ?? [])
      .map((a) => a.slotWaitMs ?? 0);
    expect(Math.max(...waits)).toBeGreaterThanOrEqual(300);
  });
});

// ---------------------------------------------------------------------------------------------------------------

describe('bad rate settings are refused at start-up', () => {
  let dir: string | undefined;
  afterEach(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
    dir = undefined;
  });
  const file = (pools: string): string => {
    dir ??= mkdtempSync(join(tmpdir(), 'suite31-'));
    const path = join(dir, `gw-${Math.random().toString(36).slice(2)}.yaml`);
    writeFileSync(
      path,
      ['providers:', '  openai:', '    family: openai', '    baseUrl: "http://127.0.0.1:9/v1"', '    apiKey: k', '    pools:', ...pools.split('\n').map((l) => `      ${l}`), 'routes:', '  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: openai } ] }', ''].join('\n'),
    );
    return path;
  };
  const refusal = (path: string): string => {
    try {
      loadConfigFile(path, {});
    } catch (err) {
      return (err as Error).message;
    }
    throw new Error('the config loaded');
  };

  it('names the file, the line, the YAML path and what was expected, with the value found', () => {
    let p = file('requestsPerMinute: 600\nburst: 0');
    expect(refusal(p)).toMatch(new RegExp(`${p.replace(/[.]/g, '\\.')}:8(:\\d+)?: providers\\.openai\\.pools\\.burst: .*(1|least|positive)`));
    p = file('requestsPerMinute: 600\nburst: 2.5');
    expect(refusal(p)).toMatch(/:8(:\d+)?: providers\.openai\.pools\.burst: .*integer/);
    p = file('requestsPerMinute: -60');
    expect(refusal(p)).toMatch(/:7(:\d+)?: providers\.openai\.pools\.requestsPerMinute: .*-60/);
    p = file('tokensPerMinute: lots');
    expect(refusal(p)).toMatch(/:7(:\d+)?: providers\.openai\.pools\.tokensPerMinute: expected number, received string \("lots"\)/);
    // A misspelt rate gets the key meant, and every problem is reported in one pass.
    const msg = refusal(file('requestPerMinute: 600\ntokensPerMinute: 0'));
    expect(msg).toMatch(/:7(:\d+)?: providers\.openai\.pools: unknown key "requestPerMinute"; did you mean "requestsPerMinute"\?/);
    expect(msg).toMatch(/:8(:\d+)?: providers\.openai\.pools\.tokensPerMinute: must be >= 1, got 0/);
  });

  it('takes a rate from the environment as a number, and refuses a burst with no rate to be a burst of', () => {
    const p = file('requestsPerMinute: ${OPENAI_RPM}');
    const cfg = loadConfigFile(p, { OPENAI_RPM: '480' });
    expect(cfg.providers.openai!.pools?.requestsPerMinute).toBe(480);
    expect(refusal(file('burst: 5'))).toMatch(/providers\.openai\.pools\.burst[\s\S]*requestsPerMinute/);
  });

  it('stops the CLI with the refusal on stderr and exit code 2, no stack trace', async () => {
    const p = file('requestsPerMinute: 600\nburst: 0');
    const { OPENAI_API_KEY: _drop, STORMGATE_CONFIG: _drop2, ...env } = process.env;
    const child = spawn(process.execPath, ['--import', 'tsx', 'src/main.ts', '--config', p], { env, stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const [code] = (await once(child, 'exit')) as [number | null];
    expect(code).toBe(2);
    expect(stderr).toContain(`${p}:8`);
    expect(stderr).toMatch(/providers\.openai\.pools\.burst/);
    expect(stderr).not.toMatch(/\n\s+at /);
  });
});
