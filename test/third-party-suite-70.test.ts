// Third-party failure-scenario suite 70: an outside team's gateway suite (the kind LiteLLM's router tests, Portkey's
// gateway tests, Envoy's retry and outlier tests and chaos suites run), written from the README alone and driven as a
// user would: the official `openai` 6.x SDK over real HTTP on 127.0.0.1, against the bundled mock provider (faults
// changed at run time through `PUT /_mock/faults`, counted at `/_mock/stats`) and scripted upstreams
// (test/helpers/scripted-upstreams.ts) where the wire must carry what the mock does not. On what the earlier suites
// covered least:
//  1. two routes (two teams) sharing one target, a provider and its model: each route's retry budget is its own (one
//     team's 503 storm spends its budget, not the other's), while the target's hold-off is the target's (one team's
//     429 with retry-after keeps the other team's requests off it too, answered `429 provider_held_off`, invited back);
//  2. a provider that recovers slowly (every request failing, then half, then none): the upstream requests the mock
//     counts stay within the first attempts plus what the retry budget allows, every error has the OpenAI shape and
//     `x-should-retry`, and once the provider is healthy every call is answered at its first attempt;
//  3. a whole (non-streamed) answer whose 200 comes and whose JSON breaks off: the connection lost mid-body is a
//     network failure (retried and failed over as `retryOn` says, never passed on half), a cut body the server ends
//     cleanly is no answer (`bad_stream`);
//  4. parallel tool calls streamed and cut: mid-arguments, after the first output, the SDK's stream helper rejects
//     (never a tool call with half its arguments, and `streamRecovery: continue` asks no backup for it); before the
//     first output, the retry's whole calls reach the SDK, each one's arguments parseable;
//  5. an SDK timeout (`x-stainless-timeout`) shorter than the wait the gateway would take (a wait hint, a backoff): the
//     answer comes at once, well before the SDK gives up, with one upstream attempt and the right `x-should-retry`;
//  6. embeddings failed over from a browned-out primary, in the SDK's default base64 and with `dimensions`: the
//     vectors the SDK decodes are the backup's, as it gives them to a direct call;
//  7. a `retry-after` HTTP-date from an upstream whose clock is an hour behind or ahead, with a Date header of the same
//     clock: read against that Date, it is the 2 s it asks for (README "Wait hints").
//  8. a Claude agent (@anthropic-ai/sdk, per-request timeout) in a 429 brownout on /v1/messages: answered at once in
//     the Anthropic error shape with `x-should-retry: true`, the next agent turned away by the hold-off unsent;
// Found here: a date read against the gateway's clock alone was an hour's fleet-wide hold-off (clients told
// `retry-after: 3602`, `x-should-retry: false`) from an upstream an hour ahead, and no hint at all from one an hour
// behind; the answer's `Date` now decides when the two clocks disagree (src/policy/wait-hint.ts upstreamNowMs).
// Bounds are generous: a loaded 2-core machine.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { mockControl } from './helpers/mock-control.ts';
import { expectOpenAIError, sdkError } from './helpers/openai-error.ts';
import { cc, completion, delta, DONE, json, type Script } from './helpers/scripted-provider.ts';
import { FAST, useScriptedUpstreams } from './helpers/scripted-upstreams.ts';
import { scrapeMetrics, TEST_KEY, useExtraMocks, useStacks } from './helpers/stack.ts';

const startUpstreams = useScriptedUpstreams();
const startStack = useStacks();
const startMock = useExtraMocks();

/** The text of a chat request's last user message: how a scripted upstream tells its callers apart. */
const said = (body: Record<string, unknown>) => String((body.messages as Array<{ content: unknown }>).at(-1)?.content ?? '');
const ask = (text: string, model = 'gpt-4o') => ({ model, messages: [{ role: 'user' as const, content: text }] });
const fail503 = () => json(503, { error: { message: 'The server is overloaded', type: 'server_error', param: null, code: null } });

describe('two routes sharing one target (a provider and its model)', () => {
  const chat = '/v1/chat/completions';

  it("keeps each route's retry budget its own: one team's 503 storm spends its budget, the other team's retry still goes", async () => {
    let bTries = 0;
    const g = await startUpstreams(
      {
        shared: (body) => {
          if (said(body) === 'team-a') return fail503();
          return ++bTries === 1 ? fail503() : completion('b answered', 'gpt-4o');
        },
      },
      [{ provider: 'shared' }],
      {
        extra: {
          routes: ['team-a', 'team-b'].map((name) => ({
            name,
            match: { path: chat, models: [name] },
            targets: [{ provider: 'shared', model: 'gpt-4o' }],
            ...FAST,
            // One retry per 10 s window and no share of requests: the first failure spends it.
            budget: { ratio: 0, windowS: 10, minRetriesPerSecond: 0.1 },
          })),
        },
      },
    );
    const attempts: string[] = [];
    for (let i = 0; i < 4; i++) {
      const err = await sdkError(g.client.chat.completions.create(ask('team-a', 'team-a')));
      expect(err.status).toBe(503);
      expect(err.headers?.get('x-should-retry')).toBe('false');
      attempts.push(err.headers?.get('x-stormgate-attempts') ?? '');
    }
    // The first call got its retry; the budget then refused every later one.
    expect(attempts).toEqual(['2', '1', '1', '1']);
    expect(g.seen.shared).toHaveLength(5);

    const { data, response } = await g.client.chat.completions.create(ask('team-b', 'team-b')).withResponse();
    expect(data.choices[0]?.message.content).toBe('b answered');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(response.headers.get('x-stormgate-route')).toBe('team-b');

    const exhausted = (await scrapeMetrics(g.s.url)).filter((m) => m.name === 'stormgate_retry_budget_exhausted_total' && m.value > 0);
    expect(exhausted.map((m) => m.labels.route)).toEqual(['team-a']);
    expect(exhausted[0]!.value).toBe(3);
  });

  it("holds the target off for both: one team's 429 with retry-after turns the other team's requests away, invited back", async () => {
    const g = await startUpstreams(
      {
        shared: (body) =>
          said(body) === 'team-a'
            ? json(429, { error: { message: 'Rate limit reached for gpt-4o', type: 'requests', param: null, code: 'rate_limit_exceeded' } }, { 'retry-after': '3' })
            : completion('shared answered', 'gpt-4o'),
        backup: () => completion('backup answered', 'gpt-4o-mini'),
      },
      [{ provider: 'shared' }],
      {
        extra: {
          routes: [
            { name: 'team-a', match: { path: chat, models: ['team-a'] }, targets: [{ provider: 'shared', model: 'gpt-4o' }, { provider: 'backup', model: 'gpt-4o-mini' }], ...FAST },
            { name: 'team-b', match: { path: chat, models: ['team-b'] }, targets: [{ provider: 'shared', model: 'gpt-4o' }], ...FAST },
          ],
        },
      },
    );
    const a = await g.client.chat.completions.create(ask('team-a', 'team-a')).withResponse();
    expect(a.data.choices[0]?.message.content).toBe('backup answered');
    expect(a.response.headers.get('x-stormgate-fallback')).toBeTruthy();
    expect(g.seen.shared).toHaveLength(1);

    const t0 = Date.now();
    const err = await sdkError(g.client.chat.completions.create(ask('team-b', 'team-b')));
    expect(Date.now() - t0).toBeLessThan(1_500);
    expect(err.status).toBe(429);
    expectOpenAIError(err.error === undefined ? undefined : { error: err.error }, 'provider_held_off', (err.error as { type: string }).type);
    expect(err.headers?.get('x-should-retry')).toBe('true');
    const retryAfter = Number(err.headers?.get('retry-after'));
    expect(retryAfter).toBeGreaterThanOrEqual(1);
    expect(retryAfter).toBeLessThanOrEqual(5);
    expect(Number(err.headers?.get('retry-after-ms'))).toBeGreaterThan(0);
    // The other team's request never reached the held-off target.
    expect(g.seen.shared).toHaveLength(1);
  });
});

describe('a provider that recovers slowly: 100% failures, then 50%, then none', () => {
  it('keeps the upstream requests within first attempts plus the budget, and answers every call at once when healthy', async () => {
    const s = await startStack({
      faults: { errors: [{ status: 503, rate: 1 }] },
      config: (mockUrl) => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'warn' },
        providers: {
          mock: {
            family: 'openai',
            baseUrl: `${mockUrl}/v1`,
            apiKey: TEST_KEY,
            breaker: { minRequests: 6, windowS: 2, openS: 0.5, consecutiveFailures: 5, probeWhileParkedMs: 200, probeWhileParkedMaxMs: 400 },
          },
        },
        routes: [
          {
            name: 'chat',
            match: { path: '/v1/chat/completions' },
            targets: [{ provider: 'mock' }],
            retry: { maxAttempts: 3, backoff: { strategy: 'full-jitter', baseMs: 20, capMs: 100 } },
            budget: { ratio: 0.1, windowS: 10, minRetriesPerSecond: 1 },
            park: false,
            timeoutMs: 3_000,
          },
        ],
      }),
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client', maxRetries: 0 });
    const PHASE_MS = 1_500;
    const start = Date.now();
    const results: Array<{ at: number; status: number; attempts: number; shouldRetry: string | null }> = [];
    let stop = false;
    const agent = async () => {
      while (!stop) {
        const at = Date.now() - start;
        try {
          const { response } = await client.chat.completions.create(ask('hello')).withResponse();
          results.push({ at, status: 200, attempts: Number(response.headers.get('x-stormgate-attempts')), shouldRetry: null });
        } catch (e) {
          const err = e as InstanceType<typeof OpenAI.APIError>;
          expect(err).toBeInstanceOf(OpenAI.APIError);
          expect(Object.keys(err.error as object).sort()).toEqual(['code', 'message', 'param', 'type']);
          results.push({ at, status: err.status ?? 0, attempts: Number(err.headers?.get('x-stormgate-attempts') ?? 0), shouldRetry: err.headers?.get('x-should-retry') ?? null });
          await new Promise((r) => setTimeout(r, 20));
        }
      }
    };
    const agents = Array.from({ length: 8 }, agent);
    await new Promise((r) => setTimeout(r, PHASE_MS));
    await mockControl(s.mock, 'PUT', 'faults', { errors: [{ status: 503, rate: 0.5 }] });
    await new Promise((r) => setTimeout(r, PHASE_MS));
    await mockControl(s.mock, 'PUT', 'faults', {});
    const healthyAt = Date.now() - start;
    await new Promise((r) => setTimeout(r, 2 * PHASE_MS));
    stop = true;
    await Promise.all(agents);

    const stats = (await mockControl(s.mock, 'GET', 'stats')) as { total: number };
    const upstreamAttempts = results.reduce((n, r) => n + r.attempts, 0);
    // x-stormgate-attempts adds up to what the provider saw.
    expect(upstreamAttempts).toBe(stats.total);
    // Every attempt beyond a call's first is a retry: at most a tenth of the calls plus the floor (1 a second over the
    // 10 s window), with room for the window sliding during the run.
    const retries = results.reduce((n, r) => n + Math.max(0, r.attempts - 1), 0);
    expect(retries).toBeLessThanOrEqual(Math.ceil(0.1 * results.length) + 10 + 2);
    expect(stats.total).toBeLessThanOrEqual(results.length * 1.1 + 12);
    for (const r of results) {
      expect(r.attempts).toBeLessThanOrEqual(3);
      if (r.status !== 200) expect(['true', 'false']).toContain(r.shouldRetry);
    }
    // Healthy for 3 s: the last second's calls are all answered, each at its first attempt.
    const last = results.filter((r) => r.at > healthyAt + 2 * PHASE_MS - 1_000);
    expect(last.length).toBeGreaterThan(8);
    expect(last.every((r) => r.status === 200 && r.attempts === 1), JSON.stringify(last.filter((r) => r.status !== 200 || r.attempts !== 1))).toBe(true);
  }, 30_000);
});

describe('a whole answer whose 200 came and whose JSON broke off', () => {
  const whole = completion('the whole answer', 'gpt-4o').steps[0] as string;
  /** A 200 with the whole answer's content-length, half the body, then the connection lost. */
  const cutMidBody = (): Script => ({
    status: 200,
    headers: { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(whole)) },
    steps: [whole.slice(0, Math.floor(whole.length / 2)), 30, { destroy: true }],
  });

  it('retries it and fails over (bad_stream, default retryOn): the SDK gets the backup\'s whole answer, never half a JSON', async () => {
    const g = await startUpstreams({ primary: cutMidBody, backup: () => completion('backup answered', 'gpt-4o') }, [{ provider: 'primary' }, { provider: 'backup' }]);
    const { data, response } = await g.client.chat.completions.create(ask('hi')).withResponse();
    expect(data.choices[0]?.message.content).toBe('backup answered');
    expect(response.headers.get('x-stormgate-attempts')).toBe('3');
    expect(response.headers.get('x-stormgate-fallback')).toBeTruthy();
    expect(g.seen.primary).toHaveLength(2);
    // README (Streaming): a connection lost mid-body is a broken answer, `bad_stream`, as the retry's reason says.
    expect(g.seen.primary![1]!.headers['x-retry-reason']).toBe('bad_stream');
  });

  it('is not sent again without network in retryOn (the provider may have run it): a 502 in the OpenAI shape, not retried by the SDK', async () => {
    const g = await startUpstreams({ primary: cutMidBody, backup: () => completion('backup answered', 'gpt-4o') }, [{ provider: 'primary' }, { provider: 'backup' }], {
      route: { retry: { maxAttempts: 2, retryOn: [429, 503], backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } },
    });
    const err = await sdkError(g.client.chat.completions.create(ask('hi')));
    expect(err.status).toBe(502);
    expect(Object.keys(err.error as object).sort()).toEqual(['code', 'message', 'param', 'type']);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(g.seen.primary).toHaveLength(1);
    expect(g.seen.backup).toHaveLength(0);
  });

  it('takes a cut body the server ends cleanly (chunked, no content-length) for no answer: the backup answers', async () => {
    const cutClean = (): Script => ({ status: 200, headers: { 'content-type': 'application/json' }, steps: [whole.slice(0, 40)] });
    const g = await startUpstreams({ primary: cutClean, backup: () => completion('backup answered', 'gpt-4o') }, [{ provider: 'primary' }, { provider: 'backup' }]);
    const { data, response } = await g.client.chat.completions.create(ask('hi')).withResponse();
    expect(data.choices[0]?.message.content).toBe('backup answered');
    expect(g.seen.primary).toHaveLength(2);
    expect(g.seen.backup).toHaveLength(1);
    expect(response.headers.get('x-stormgate-attempts')).toBe('3');
  });
});

describe('parallel tool calls, streamed and cut', () => {
  const tools: OpenAI.Chat.ChatCompletionTool[] = ['get_weather', 'get_time'].map((name) => ({
    type: 'function',
    function: { name, parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } },
  }));
  const call = (index: number, id: string, name: string) => cc([delta({ tool_calls: [{ index, id, type: 'function', function: { name, arguments: '' } }] })]);
  const args = (index: number, piece: string) => cc([delta({ tool_calls: [{ index, function: { arguments: piece } }] })]);
  const role = cc([delta({ role: 'assistant', content: null })]);
  const wholeCalls: Script = {
    steps: [role, call(0, 'call_a', 'get_weather'), args(0, '{"city":'), args(0, '"Paris"}'), call(1, 'call_b', 'get_time'), args(1, '{"city":'), args(1, '"Tokyo"}'), cc([delta({}, 'tool_calls')]), DONE],
  };

  it('rejects in the SDK helper when cut mid-arguments after the first output; streamRecovery asks no backup for a half-sent call', async () => {
    const cut: Script = { steps: [role, call(0, 'call_a', 'get_weather'), args(0, '{"city":"Paris"}'), call(1, 'call_b', 'get_time'), args(1, '{"ci'), 30, { destroy: true }] };
    const g = await startUpstreams({ primary: () => cut, backup: () => wholeCalls }, [{ provider: 'primary' }, { provider: 'backup' }], {
      route: { streamRecovery: 'continue' },
    });
    const runner = g.client.chat.completions.stream({ ...ask('weather in Paris, time in Tokyo'), tools, parallel_tool_calls: true });
    const err = await runner.finalChatCompletion().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(g.seen.primary).toHaveLength(1);
    expect(g.seen.backup).toHaveLength(0);
  });

  it('retries a stream cut before its first output: the SDK helper gets both calls whole, their arguments parseable', async () => {
    let n = 0;
    const g = await startUpstreams({ primary: () => (++n === 1 ? { steps: [role, 20, { destroy: true }] } : wholeCalls) }, [{ provider: 'primary' }]);
    const final = await g.client.chat.completions.stream({ ...ask('weather in Paris, time in Tokyo'), tools, parallel_tool_calls: true }).finalChatCompletion();
    const calls = final.choices[0]?.message.tool_calls ?? [];
    expect(calls.map((c) => (c.type === 'function' ? [c.id, c.function.name, JSON.parse(c.function.arguments)] : c))).toEqual([
      ['call_a', 'get_weather', { city: 'Paris' }],
      ['call_b', 'get_time', { city: 'Tokyo' }],
    ]);
    expect(final.choices[0]?.finish_reason).toBe('tool_calls');
    expect(g.seen.primary).toHaveLength(2);
  });
});

describe('an SDK timeout shorter than the wait the gateway would take', () => {
  it('answers a 503 whose retry-after outlasts the SDK timeout at once: one attempt, invited back after the hint', async () => {
    const g = await startUpstreams({ up: () => json(503, { error: { message: 'overloaded', type: 'server_error', param: null, code: null } }, { 'retry-after': '5' }) }, [{ provider: 'up' }]);
    const t0 = Date.now();
    // A per-request timeout: the one the OpenAI JS SDK sends as x-stainless-timeout (README: not the client-wide one).
    const err = await sdkError(g.client.chat.completions.create(ask('hi'), { timeout: 2_000 }));
    expect(Date.now() - t0).toBeLessThan(1_500);
    expect(err).not.toBeInstanceOf(OpenAI.APIConnectionTimeoutError);
    expect(err.status).toBe(503);
    expect(err.headers?.get('x-stormgate-attempts')).toBe('1');
    expect(err.headers?.get('x-should-retry')).toBe('true');
    expect(Number(err.headers?.get('retry-after'))).toBeGreaterThanOrEqual(5);
    expect(g.seen.up).toHaveLength(1);
  });

  it('answers a 503 with no hint at once when the backoff is longer than the SDK timeout: one attempt, x-should-retry false', async () => {
    const g = await startUpstreams({ up: fail503 }, [{ provider: 'up' }], {
      route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 3_000, capMs: 3_000 } } },
    });
    const t0 = Date.now();
    // A per-request timeout: the one the OpenAI JS SDK sends as x-stainless-timeout (README: not the client-wide one).
    const err = await sdkError(g.client.chat.completions.create(ask('hi'), { timeout: 2_000 }));
    expect(Date.now() - t0).toBeLessThan(1_500);
    expect(err.status).toBe(503);
    expect(err.headers?.get('x-stormgate-attempts')).toBe('1');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(g.seen.up).toHaveLength(1);
  });
});

describe("a Claude agent on /v1/messages (@anthropic-ai/sdk) whose timeout is shorter than a 429's retry-after", () => {
  it('is answered at once, in the Anthropic shape, invited back; the next agent is turned away by the hold-off without an upstream call', async () => {
    const s = await startStack({
      config: (mockUrl) => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'warn' },
        providers: { claude: { family: 'anthropic', baseUrl: mockUrl, apiKey: TEST_KEY, breaker: false } },
        routes: [{ name: 'messages', match: { path: '/v1/messages' }, targets: [{ provider: 'claude' }], ...FAST }],
      }),
    });
    // A 10 s brownout of 429s, each with retry-after set to the seconds left.
    await mockControl(s.mock, 'POST', 'brownout', { mode: '429', durationMs: 10_000 });
    const claude = new Anthropic({ baseURL: s.url, apiKey: 'client', maxRetries: 0 });
    const params = { model: 'claude-sonnet-4-6', max_tokens: 64, messages: [{ role: 'user' as const, content: 'hi' }] };
    const caught = async (p: Promise<unknown>) => {
      const e = await p.then(() => undefined, (x: unknown) => x);
      expect(e).toBeInstanceOf(Anthropic.APIError);
      return e as InstanceType<typeof Anthropic.APIError>;
    };

    const t0 = Date.now();
    const first = await caught(claude.messages.create(params, { timeout: 2_000 }));
    expect(Date.now() - t0).toBeLessThan(1_500);
    expect(first.status).toBe(429);
    expect((first.error as { type: string; error: { type: string } }).type).toBe('error');
    expect((first.error as { error: { type: string } }).error.type).toBe('rate_limit_error');
    expect(first.headers?.get('x-should-retry')).toBe('true');
    expect(Number(first.headers?.get('retry-after'))).toBeGreaterThanOrEqual(8);

    const second = await caught(claude.messages.create(params, { timeout: 2_000 }));
    expect(second.status).toBe(429);
    const body = second.error as { type: string; error: { type: string; code: string } };
    expect(body.type).toBe('error');
    expect(body.error.type).toBe('rate_limit_error');
    expect(body.error.code).toBe('provider_held_off');
    expect(second.headers?.get('x-should-retry')).toBe('true');
    const stats = (await mockControl(s.mock, 'GET', 'stats')) as { total: number };
    expect(stats.total).toBe(1);
  });
});

describe('embeddings failed over from a browned-out primary', () => {
  it("gives the SDK the backup's vectors, base64 (the SDK's default) and float alike, with dimensions honoured", async () => {
    const backup = await startMock({ apiKey: TEST_KEY });
    const s = await startStack({
      config: (mockUrl) => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'warn' },
        providers: {
          primary: { family: 'openai', baseUrl: `${mockUrl}/v1`, apiKey: TEST_KEY, breaker: false },
          backup: { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: TEST_KEY, breaker: false },
        },
        routes: [{ name: 'embeddings', match: { path: '/v1/embeddings' }, targets: [{ provider: 'primary' }, { provider: 'backup' }], ...FAST }],
      }),
    });
    await mockControl(s.mock, 'POST', 'brownout', { mode: '503', durationMs: 30_000 });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client', maxRetries: 0 });
    const direct = new OpenAI({ baseURL: `${backup.url}/v1`, apiKey: TEST_KEY, maxRetries: 0 });
    const input = ['the first text', 'a second, longer text to embed'];

    const viaGateway = await client.embeddings.create({ model: 'text-embedding-3-small', input, dimensions: 8 }).withResponse();
    const fromBackup = await direct.embeddings.create({ model: 'text-embedding-3-small', input, dimensions: 8 });
    expect(viaGateway.response.headers.get('x-stormgate-fallback')).toBeTruthy();
    expect(viaGateway.data.data.map((d) => d.embedding)).toEqual(fromBackup.data.map((d) => d.embedding));
    expect(viaGateway.data.data.every((d) => d.embedding.length === 8 && d.embedding.every(Number.isFinite))).toBe(true);

    const floats = await client.embeddings.create({ model: 'text-embedding-3-small', input, dimensions: 8, encoding_format: 'float' });
    expect(floats.data.map((d) => d.embedding.map((x) => Math.fround(x)))).toEqual(fromBackup.data.map((d) => d.embedding.map((x) => Math.fround(x))));
    const log = (await mockControl(backup, 'GET', 'requests')) as Array<{ path: string }>;
    // Two through the gateway, one direct.
    expect(log.filter((r) => r.path === '/v1/embeddings').length).toBe(3);
  });
});

describe('retry-after as an HTTP-date from an upstream whose clock is an hour off (behind or ahead)', () => {
  /** The upstream's own clock, `skewMs` off: its Date header and its retry-after ("2 s from my now"). */
  const skewed429 = (skewMs: number) => {
    const theirs = Date.now() + skewMs;
    return json(429, { error: { message: 'Rate limit reached', type: 'requests', param: null, code: 'rate_limit_exceeded' } }, {
      date: new Date(theirs).toUTCString(),
      'retry-after': new Date(theirs + 2_000).toUTCString(),
    });
  };

  it.each([['behind', -3_600_000], ['ahead', 3_600_000]])('reads it against the answer\'s Date (clock %s): a 2 s wait, retried and answered', async (_, skewMs) => {
    const seenAt: number[] = [];
    const g = await startUpstreams(
      {
        up: (_body, n) => {
          seenAt.push(Date.now());
          return n === 1 ? skewed429(skewMs) : completion('ok', 'gpt-4o');
        },
      },
      [{ provider: 'up' }],
    );
    const { data, response } = await g.client.chat.completions.create(ask('one')).withResponse();
    expect(data.choices[0]?.message.content).toBe('ok');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    // The 2 s asked for (x random(1, 1.2)): neither the past date's 5 ms backoff nor an hour.
    expect(seenAt[1]! - seenAt[0]!).toBeGreaterThanOrEqual(1_900);
    expect(seenAt[1]! - seenAt[0]!).toBeLessThan(6_000);
  });

  it('passes the 429 on with the 2 s as retry-after when it is not retried (maxAttempts 1), not an hour and not 0', async () => {
    const g = await startUpstreams({ up: () => skewed429(3_600_000) }, [{ provider: 'up' }], { route: { retry: { maxAttempts: 1 } } });
    const err = await sdkError(g.client.chat.completions.create(ask('hi')));
    expect(err.status).toBe(429);
    const retryAfterS = Number(err.headers?.get('retry-after'));
    expect(retryAfterS).toBeGreaterThanOrEqual(2);
    expect(retryAfterS).toBeLessThanOrEqual(3);
  });
});
