// Mutation tests of the stream recovery, flex-tier hold-off, hold metrics and told-spread changes of 45185f8..3ac0af8
// (98 mutants: 54 killed by the suite, 32 survivors killed here, 10 equivalent, 2 left): each case below kills
// a mutant the rest of the suite let live. Clocks, draws and upstreams are scripted where the numbers must be exact;
// the end-to-end cases use generous bounds.
import { connect } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { Redis } from 'ioredis';
import { afterEach, describe, expect, it } from 'vitest';
import { handedOverStream, upstream } from './helpers/live-stream.ts';
import { cc, completion, delta, json, recoveringToNext, scripted, type Answer, type ConfigShape, type Script, type Seen } from './helpers/scripted-provider.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { sdkError } from './helpers/openai-error.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { configServedBy, metricSum, useGateways, useStacks, type Stack } from './helpers/stack.ts';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { judgeStreamEnd } from '../src/pipeline/record-outcome.ts';
import type { Guards } from '../src/pipeline/target-attempts.ts';
import { flexTierKey, HoldOffs } from '../src/state/hold-offs.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import { RedisStore } from '../src/state/redis-store.ts';
import type { WaitHint } from '../src/policy/wait-hint.ts';
import type { ServerDeps } from '../src/server.ts';
import { pastHoldOff } from '../src/policy/hold-off-wait.ts';
import { unavailableAnswer } from '../src/pipeline/final-answer.ts';
import type { StreamEnd } from '../src/pipeline/live-stream.ts';
import type { StreamRecovery } from '../src/pipeline/live-stream.ts';
import { streamRecovery } from '../src/pipeline/stream-recovery.ts';
import { RequestAbort } from '../src/pipeline/request-abort.ts';
import { GatewayShutdown } from '../src/pipeline/abort-reasons.ts';
import type { ManagedRequest } from '../src/pipeline/handle-request.ts';
import type { TargetDeps, TargetPlan } from '../src/pipeline/target-attempts.ts';

const KEY = 'sk-mut5-provider-key';
const chunk = (content: string, finish: string | null = null): string =>
  `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content }, finish_reason: finish }] })}\n\n`;
const abortChunk = `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', choices: [{ index: 0, delta: {}, finish_reason: 'abort', stop_reason: null }] })}\n\n`;
const DONE = 'data: [DONE]\n\n';

describe('LiveStream at a break a continuation takes over', () => {
  it('runs a whenUpstreamDone callback registered after the break at once, before the stream has ended', async () => {
    const controller = new AbortController();
    const { live, ended } = handedOverStream({ first: chunk('Hel'), iterator: upstream(controller, [abortChunk, 60_000]), controller, apiKey: KEY });
    let ranDuringContinuation: boolean | undefined;
    live.recoverWith(async () => {
      let ran = false;
      live.whenUpstreamDone(() => (ran = true));
      ranDuringContinuation = ran;
      return {
        text: (async function* () {
          yield chunk('lo', 'stop') + DONE;
        })(),
        ended: (): StreamEnd => ({ kind: 'complete', events: 2, droppedMalformed: 0 }),
        target: 'backup/gpt-4o',
      };
    });
    for await (const _ of live.body());
    expect(ranDuringContinuation).toBe(true);
    expect((await ended).kind).toBe('recovered');
  });

  it("ends with the shutdown's one error event when the shutdown gives up the continuation's request: no cut reported after it", async () => {
    const controller = new AbortController();
    const { live, ended } = handedOverStream({ first: chunk('Hel'), iterator: upstream(controller, [chunk('lo') + abortChunk, 60_000]), controller, apiKey: KEY });
    live.recoverWith(async () => undefined);
    const body = live.body();
    await body.next();
    await body.next();
    live.interrupt();
    let rest = '';
    for await (const part of body) rest += part;
    expect(rest.match(/stream_interrupted/g)).toHaveLength(1);
    expect(rest).toContain('shutting down');
    expect(rest).not.toContain('the upstream stream was cut');
    expect((await ended).kind).toBe('shutdown');
  });
});

/** streamRecovery with its guards faked: `sent` counts the continuation's requests that reached the dispatcher. */
function recoverySetUp(o: { holdOffKey?: string; heldKeys?: string[]; onBudget?: () => void } = {}) {
  const taken: string[] = [];
  let sent = 0;
  const json = { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true };
  const req = { route: { name: 'chat', api: 'chat', config: { streamRecovery: 'continue', budget: { ratio: 0.1, windowS: 10, minRetriesPerSecond: 1 } } }, json, path: '/v1/chat/completions', query: '' } as unknown as ManagedRequest;
  const upstreamReq = { ok: true, request: { path: '/v1/chat/completions', headers: {}, body: Buffer.from(JSON.stringify(json)), translator: undefined } };
  const next = {
    key: 'q/gpt-4o',
    holdOffKey: o.holdOffKey ?? 'q/gpt-4o',
    breaker: undefined,
    budgetKey: 'chat q/gpt-4o',
    model: 'gpt-4o',
    label: 'q/gpt-4o',
    client: {
      config: { family: 'openai', prefill: false, timeouts: { connectMs: 1_000, firstTokenMs: 1_000, idleMs: 1_000 } },
      dispatcher: {
        request: () => {
          sent++;
          return new Promise(() => undefined);
        },
      },
    },
    upstream: () => upstreamReq,
  } as unknown as TargetPlan;
  const held = new Set(o.heldKeys ?? []);
  const deps = {
    now: () => 0,
    guards: {
      board: { availability: () => ({ kind: 'closed' }), current: () => ({ generation: 0 }) },
      holdOffs: { until: (k: string) => (held.has(k) ? 5_000 : undefined), credentialsHeldUntil: () => undefined },
      budget: {
        tryRetry: async (key: string) => {
          taken.push(key);
          o.onBudget?.();
          return true;
        },
      },
    },
  } as unknown as Pick<TargetDeps, 'guards' | 'now' | 'onAttempt' | 'onRetry' | 'onBudgetExhausted'>;
  return { req, next, deps, taken, sent: () => sent };
}

describe('a stream recovery', () => {
  it('sends nothing when the shutdown begins while the budget is being asked', async () => {
    const shutdown = new RequestAbort();
    const { req, next, deps, taken, sent } = recoverySetUp({ onBudget: () => shutdown.abort(new GatewayShutdown()) });
    const recover = streamRecovery(req, { choices: 1, usage: false } as never, next, new RequestAbort(), deps, []) as StreamRecovery;
    const got = await Promise.race([recover('Hel', 'stream_cut', shutdown, 30_000).catch(() => 'threw'), sleep(2_000, 'pending')]);
    expect(got).toBeUndefined();
    expect(taken).toEqual(['chat q/gpt-4o']);
    expect(sent()).toBe(0);
  });

  it("of a flex request is not sent to a next target whose flex tier is held off, nor takes a retry for it", async () => {
    const { req, next, deps, taken, sent } = recoverySetUp({ holdOffKey: 'q/gpt-4o#flex', heldKeys: ['q/gpt-4o#flex'] });
    const recover = streamRecovery(req, { choices: 1, usage: false } as never, next, new RequestAbort(), deps, []) as StreamRecovery;
    const got = await Promise.race([recover('Hel', 'stream_cut', new RequestAbort(), 30_000).catch(() => 'threw'), sleep(2_000, 'pending')]);
    expect(got).toBe('held_off');
    expect(taken).toEqual([]);
    expect(sent()).toBe(0);
  });
});

// ---- a client that stalls during a continuation, on each of its paths (fresh, spliced, prefilled) -----------------

const startProvider = useFakeProviders();
const startStack = useStacks();
const role = cc([delta({ role: 'assistant', content: '' })]);
/** More text than the sockets on the way hold (16 MB), the response left open. */
const flood = Array.from({ length: 256 }, () => cc([delta({ content: 'x'.repeat(64 * 1024) })]));
const PATHS: Record<string, { first: Script; next: Script; shape?: ConfigShape }> = {
  // Reasoning alone went out: the next target is asked afresh.
  fresh: { first: { steps: [role, cc([delta({ reasoning_content: 'Let me think.' })]), 30, { destroy: true }] }, next: { steps: [role, cc([delta({ content: 'Hello' })]), ...flood], hold: true } },
  // "Hel" went out, and q continues a prefill of it.
  prefilled: {
    first: { steps: [role, cc([delta({ content: 'Hel' })]), 30, { destroy: true }] },
    next: { steps: [role, cc([delta({ content: 'lo' })]), ...flood], hold: true },
    shape: (c) => ((c.providers.q as Record<string, unknown>).prefill = true),
  },
};

describe("a client that stops reading a stream recovery's continuation", () => {
  for (const [path, { first, next, shape }] of Object.entries(PATHS)) {
    it(`(${path}) is given up on: client-stalled logged and counted, its connection closed`, async () => {
      let n = 0;
      const play = scripted((_b, k) => (k === 1 ? first : next));
      const provider = await startProvider((req, res) => {
        n++;
        play(req, res);
      });
      const s = await startStack({
        config: (mockUrl) => {
          const c = configServedBy(mockUrl, 'p', `${provider.origin}/v1`);
          (c.providers.p as Record<string, unknown>).timeouts = { connectMs: 2000, firstTokenMs: 30000, idleMs: 30000 };
          recoveringToNext()(c, provider.origin);
          (c.providers.q as Record<string, unknown>).timeouts = { connectMs: 2000, firstTokenMs: 30000, idleMs: 100 };
          shape?.(c, provider.origin);
          return c;
        },
      });
      const socket = connect(Number(new URL(s.url).port), '127.0.0.1');
      let received = '';
      let socketClosed = false;
      socket.setEncoding('latin1');
      socket.on('data', (d: string) => {
        received += d;
        if (received.includes('stream recovered')) socket.pause();
      });
      socket.on('close', () => (socketClosed = true));
      socket.on('error', () => undefined);
      const body = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
      socket.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`);
      const deadline = Date.now() + 20_000;
      const until = async (done: () => boolean | Promise<boolean>) => {
        while (!(await done()) && Date.now() < deadline) await sleep(20);
      };
      try {
        await until(() => received.includes('stream recovered'));
        expect(received).toContain('stream recovered');
        expect(n).toBe(2);
        const connections = () => new Promise<number>((resolve) => s.gateway.server.getConnections((_e, c) => resolve(c)));
        await until(async () => (await connections()) === 0);
        expect(await connections()).toBe(0);
        socket.removeAllListeners('data');
        socket.resume();
        await until(() => socketClosed);
        expect(socketClosed).toBe(true);
        await until(async () => (await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="client-stalled"}')) === 1);
        expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="client-stalled"}')).toBe(1);
      } finally {
        socket.destroy();
      }
    }, 30_000);
  }
});

describe('the breaker of a target whose stream a continuation takes over', () => {
  it('hears how the stream broke at the break, while the continuation still runs', async () => {
    const controller = new AbortController();
    const { live, ended } = handedOverStream({ first: chunk('Hel'), iterator: upstream(controller, [abortChunk, 60_000]), controller, apiKey: KEY });
    const broke: string[] = [];
    const guards = { board: { streamBroke: (_k: string, _b: unknown, _j: unknown, facts: { reason: string }) => broke.push(facts.reason) }, holdOffs: { holdCredentials: () => undefined } } as unknown as Guards;
    const plan = { key: 'p/m', breaker: undefined, client: { config: { authHoldS: 60 } } } as unknown as TargetPlan;
    judgeStreamEnd(guards, plan, live, { generation: 0, atMs: 0 });
    let heardAtContinuation: string[] | undefined;
    live.recoverWith(async () => {
      heardAtContinuation = [...broke];
      return {
        text: (async function* () {
          yield chunk('lo', 'stop') + DONE;
        })(),
        ended: (): StreamEnd => ({ kind: 'complete', events: 2, droppedMalformed: 0 }),
        target: 'backup/gpt-4o',
      };
    });
    for await (const _ of live.body());
    expect(heardAtContinuation).toEqual(['stream_cut']);
    expect((await ended).kind).toBe('recovered');
    expect(broke).toEqual(['stream_cut']);
  });
});

// ---- Groq's flex tier, end to end --------------------------------------------------------------------------------

const messages = [{ role: 'user' as const, content: 'Summarise the incident report.' }];
const GROQ_498 = { error: { message: 'Flex tier capacity exceeded. Please try again later.', type: 'invalid_request_error', code: 'capacity_exceeded' } };
const GROQ = { provider: 'groq', model: 'llama-3.3-70b-versatile' };
const TOGETHER = { provider: 'together', model: 'meta-llama/Llama-3.3-70B-Instruct-Turbo' };
type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];

/** A gateway in front of scripted Groq (and Together, when answered), no breaker, draws of 0 unless `deps` says. */
async function groqGateway(
  answers: Record<string, Answer>,
  targets: RouteInput['targets'],
  o: { route?: Partial<RouteInput>; provider?: Partial<ProviderInput>; deps?: ServerDeps } = {},
): Promise<{ s: Stack; client: OpenAI; seen: Record<string, Seen[]> }> {
  const providers: ConfigInput['providers'] = {};
  const seen: Record<string, Seen[]> = {};
  for (const [name, answer] of Object.entries(answers)) {
    seen[name] = [];
    const p = await startProvider(scripted(answer, seen[name]));
    providers[name] = { family: 'openai', baseUrl: `${p.origin}/v1`, apiKey: `${name}-key-0123456789`, breaker: false, timeouts: { connectMs: 1_000, firstTokenMs: 5_000, idleMs: 5_000 }, ...o.provider } as ProviderInput;
  }
  const s = await startStack({
    config: () => ({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers,
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets, budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 }, park: false, ...o.route }],
    }),
    deps: { random: () => 0, ...o.deps },
  });
  return { s, seen, client: new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0 }) };
}
const flexAsk = (client: OpenAI) => client.chat.completions.create({ model: 'llama', messages, service_tier: 'flex' });
const defaultAsk = (client: OpenAI) => client.chat.completions.create({ model: 'llama', messages });
/** Retries 498 too, with parking on: where a hold-off the answer started counts as the request's own. */
const RETRY_498: Partial<RouteInput> = { retry: { maxAttempts: 2, retryOn: [498, 429], backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } }, park: { maxWaitMs: 10_000 } };

describe("a flex tier's hold-off, end to end", () => {
  it("is no hold-off of a default-tier request that Groq answered 498 all the same: its hint is waited out on Groq as a hint", async () => {
    let asked = 0;
    const { client, seen } = await groqGateway(
      { groq: () => (++asked === 1 ? json(498, GROQ_498, { 'retry-after': '1' }) : completion('from groq', GROQ.model)), together: () => completion('from together', TOGETHER.model) },
      [GROQ, TOGETHER],
      { route: RETRY_498 },
    );
    const res = await defaultAsk(client);
    expect(res.choices[0]!.message.content).toBe('from groq');
    expect(seen.groq).toHaveLength(2);
    expect(seen.together).toHaveLength(0);
  });

  it("is the own hold-off of the flex request it answered: that request moves on to the backup rather than wait", async () => {
    let asked = 0;
    const { client, seen } = await groqGateway(
      { groq: () => (++asked === 1 ? json(498, GROQ_498, { 'retry-after': '1' }) : completion('from groq', GROQ.model)), together: () => completion('from together', TOGETHER.model) },
      [GROQ, TOGETHER],
      { route: RETRY_498 },
    );
    const res = await flexAsk(client);
    expect(res.choices[0]!.message.content).toBe('from together');
    expect(seen.groq).toHaveLength(1);
  });

  it('lets a flex request parked for the tier go at once when a credential hold starts on its target', async () => {
    const refused = { error: { message: 'Invalid API Key', type: 'invalid_request_error', code: 'invalid_api_key' } };
    const { client, seen } = await groqGateway({ groq: (body) => (body.service_tier === 'flex' ? json(498, GROQ_498, { 'retry-after': '6' }) : json(401, refused)) }, [GROQ], {
      route: { retry: { maxAttempts: 1 }, park: { maxWaitMs: 20_000 } },
    });
    expect((await sdkError(flexAsk(client))).status).toBe(498);
    let settledAt: number | undefined;
    const parked = sdkError(flexAsk(client)).finally(() => (settledAt = Date.now()));
    await sleep(200);
    expect(settledAt).toBeUndefined();
    expect((await sdkError(defaultAsk(client))).status).toBe(502);
    const refusedAt = Date.now();
    const err = await parked;
    expect(err.status).toBe(502);
    // The flex tier's hold-off lasts 6 s: the parked request is answered by the credential hold, well before.
    expect(settledAt! - refusedAt).toBeLessThan(3_000);
    expect(seen.groq!.map((s) => s.body.service_tier ?? 'none')).toEqual(['flex', 'none']);
  });

  it("leaves no adaptive-limit series under the flex tier's key once its hold-off is over", async () => {
    const { s, client } = await groqGateway({ groq: (body) => (body.service_tier === 'flex' ? json(498, GROQ_498, { 'retry-after': '1' }) : completion('from groq', GROQ.model)) }, [GROQ]);
    expect((await defaultAsk(client)).choices[0]!.message.content).toBe('from groq');
    expect((await sdkError(flexAsk(client))).status).toBe(498);
    await sleep(1_500);
    const text = await (await fetch(`${s.url}/metrics`)).text();
    expect(text).toContain('stormgate_pool_limit{target="groq/llama-3.3-70b-versatile"}');
    expect(text).not.toMatch(/stormgate_pool_limit\{target="[^"]*#/);
  });

  it("leaves no adaptive-limit series under a location refusal's side key once its credential hold is over", async () => {
    const refusal = { error: { message: 'Country, region, or territory not supported', type: 'request_forbidden', code: 'unsupported_country_region_territory' } };
    let asked = 0;
    const { s, client } = await groqGateway({ groq: () => (++asked === 2 ? json(403, refusal) : completion('from groq', GROQ.model)) }, [GROQ], { provider: { authHoldS: 1 } });
    expect((await defaultAsk(client)).choices[0]!.message.content).toBe('from groq');
    expect((await sdkError(defaultAsk(client))).status).toBe(502);
    await sleep(1_500);
    const text = await (await fetch(`${s.url}/metrics`)).text();
    expect(text).toContain('stormgate_pool_limit{target="groq/llama-3.3-70b-versatile"}');
    expect(text).not.toMatch(/stormgate_pool_limit\{target="[^"]*#/);
  });

  it('tells a flex request held off by a long hint on the flex tier the end Groq asked for, past the minute', async () => {
    const { client, seen } = await groqGateway({ groq: () => json(498, GROQ_498, { 'retry-after': '120' }) }, [GROQ]);
    expect((await sdkError(flexAsk(client))).status).toBe(498);
    const held = await sdkError(flexAsk(client));
    expect(held.status).toBe(429);
    expect((held.error as { code?: string }).code).toBe('provider_held_off');
    expect(Number(held.headers?.get('retry-after'))).toBeGreaterThanOrEqual(119);
    expect(seen.groq).toHaveLength(1);
  });

  it("names the target alone, not its flex tier, to a flex request the target's own hold-off turns away", async () => {
    const limited = { error: { message: 'Rate limit reached', type: 'requests', code: 'rate_limit_exceeded' } };
    const { client } = await groqGateway({ groq: () => json(429, limited, { 'retry-after': '5' }) }, [GROQ], { route: { retry: { maxAttempts: 1 } } });
    expect((await sdkError(defaultAsk(client))).status).toBe(429);
    const held = await sdkError(flexAsk(client));
    expect((held.error as { code?: string }).code).toBe('provider_held_off');
    expect(held.message).toContain('groq/llama-3.3-70b-versatile');
    expect(held.message).not.toContain('flex');
  });

  it("starts the zero series of status_498 on the flex tier alone, never on the target's own", async () => {
    const { s, client } = await groqGateway({ groq: () => completion('from groq', GROQ.model) }, [GROQ]);
    await defaultAsk(client);
    const text = await (await fetch(`${s.url}/metrics`)).text();
    expect(text).toMatch(/stormgate_holds_started_total\{[^}]*tier="flex"[^}]*reason="status_498"\} 0/);
    expect(text).not.toMatch(/stormgate_holds_started_total\{[^}]*tier="all"[^}]*reason="status_498"/);
  });
});

describe("the flex tier's own hold-off, as the gauge reads it", () => {
  it("is none while only the target's hold-off is in force (which holds the tier's requests too)", () => {
    const T = 1_700_000_000_000;
    const holdOffs = new HoldOffs(new MemoryStore(), () => T, () => 0);
    const hint: WaitHint = { delayMs: 5_000, source: 'retry-after', fleetWide: true };
    holdOffs.start('groq/llama', hint);
    expect(holdOffs.until(flexTierKey('groq/llama'))).toBe(T + 5_000);
    expect(holdOffs.flexTierUntil('groq/llama')).toBeUndefined();
    holdOffs.start(flexTierKey('groq/llama'), { ...hint, delayMs: 8_000 });
    expect(holdOffs.flexTierUntil('groq/llama')).toBe(T + 8_000);
  });
});

const redisServer = useRedisServer();
const startGateway = useGateways();

describe('a flex request, the first an instance sends to a target another instance holds off (one Redis)', () => {
  it("reads the target's own hold-off before it goes, and is held off by it", async () => {
    const seen: Seen[] = [];
    const limited = { error: { message: 'Rate limit reached', type: 'requests', code: 'rate_limit_exceeded' } };
    const p = await startProvider(scripted(() => json(429, limited, { 'retry-after': '10' }), seen));
    const input: ConfigInput = {
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: { groq: { family: 'openai', baseUrl: `${p.origin}/v1`, apiKey: 'groq-key-0123456789', breaker: false } },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [GROQ], park: false, retry: { maxAttempts: 1 } }],
      state: { redis: redisServer().url, keyPrefix: `mut5flex${process.pid}`, commandTimeoutMs: 1000 },
    };
    const config = ConfigSchema.parse(input);
    const [a, b] = [await startGateway(config), await startGateway(config)].map((url) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sk-client', maxRetries: 0 }));
    expect((await sdkError(defaultAsk(a!))).status).toBe(429);
    const held = await sdkError(flexAsk(b!));
    expect(held.status).toBe(429);
    expect((held.error as { code?: string }).code).toBe('provider_held_off');
    expect(seen).toHaveLength(1);
  });
});

describe("the memory store's extend-only hold-off write", () => {
  it('says it started the hold-off when none was in force at nowMs, and not when it extended one', async () => {
    const store = new MemoryStore();
    const T = 1_700_000_000_000;
    expect(await store.setHoldOff('p/m', T + 1_000, T)).toBe(true);
    expect(await store.setHoldOff('p/m', T + 2_000, T + 500)).toBe(false);
    expect(await store.setHoldOff('p/m', T + 1_500, T + 500)).toBe(false);
    // Ended at T + 2 s: a write after that starts a new one.
    expect(await store.setHoldOff('p/m', T + 9_000, T + 3_000)).toBe(true);
  });
});

describe('streams the parking lot released after a hold-off', () => {
  it("give their place in the lot back when they end: the next parked stream goes then, not at its deadline", async () => {
    const limited = { error: { message: 'Rate limit reached', type: 'requests', code: 'rate_limit_exceeded' } };
    const answer: Script = { steps: [role, cc([delta({ content: 'Hi' })]), 100, cc([delta({}, 'stop')]), 'data: [DONE]\n\n'] };
    const play = scripted((_b, k) => (k === 1 ? json(429, limited, { 'retry-after': '1' }) : answer));
    const provider = await startProvider(play);
    const s = await startStack({
      config: (mockUrl) => {
        const c = configServedBy(mockUrl, 'p', `${provider.origin}/v1`);
        Object.assign(c.providers.p as Record<string, unknown>, { pools: { maxConcurrent: 1 } });
        for (const r of c.routes) Object.assign(r, { retry: { maxAttempts: 1 }, park: { maxWaitMs: 20_000 }, timeoutMs: 20_000 });
        return c;
      },
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client', maxRetries: 0, timeout: 30_000 });
    expect((await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages }))).status).toBe(429);
    const read = async () => {
      const stream = await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true });
      let text = '';
      for await (const c of stream) text += c.choices[0]?.delta?.content ?? '';
      return text;
    };
    const startedAt = Date.now();
    const texts = await Promise.all([read(), read(), read()]);
    expect(texts).toEqual(['Hi', 'Hi', 'Hi']);
    // A second for the hold-off, then three short streams one after another: far from the 20 s deadline.
    expect(Date.now() - startedAt).toBeLessThan(8_000);
  }, 30_000);
});

describe("the Redis store's extend-only hold-off write says whether it started the hold-off", () => {
  const stores: RedisStore[] = [];
  afterEach(async () => {
    await Promise.all(stores.splice(0).map((st) => st.close()));
  });
  const storeOf = (o: { url?: string; keyPrefix?: string; now?: () => number; commandTimeoutMs?: number } = {}) => {
    const st = new RedisStore({ config: { redis: o.url ?? redisServer().url, commandTimeoutMs: o.commandTimeoutMs ?? 500, keyPrefix: o.keyPrefix ?? `mut5-${process.pid}-${Math.random().toString(36).slice(2)}` }, ...(o.now && { now: o.now }) });
    stores.push(st);
    return st;
  };

  it('counts a hold-off that ended at the very millisecond of the write as over: a new start', async () => {
    const st = storeOf();
    expect(await st.ready()).toBe(true);
    const now = Date.now();
    expect(await st.setHoldOff('p/m', now + 1_000, now)).toBe(true);
    expect(await st.setHoldOff('p/m', now + 5_000, now + 1_000)).toBe(true);
  });

  it("reads the hold-off in force at the writer's own now, told in the fleet's time: an instance whose clock is ahead starts none in force", async () => {
    const keyPrefix = `mut5-skew-${process.pid}-${Math.random().toString(36).slice(2)}`;
    const ahead = () => Date.now() + 30_000;
    const a = storeOf({ keyPrefix, now: ahead });
    const b = storeOf({ keyPrefix });
    expect(await a.ready()).toBe(true);
    expect(await b.ready()).toBe(true);
    expect(await b.setHoldOff('p/m', Date.now() + 5_000, Date.now())).toBe(true);
    // The same hold-off, in force for 5 s more, extended by the instance 30 s ahead: no new start.
    expect(await a.setHoldOff('p/m', ahead() + 6_000, ahead())).toBe(false);
  });

  it('answers from its own view while Redis cannot be reached: a start, then an extension', async () => {
    const st = storeOf({ url: 'redis://127.0.0.1:1', commandTimeoutMs: 100 });
    expect(await st.ready()).toBe(false);
    const now = Date.now();
    expect(await st.setHoldOff('p/m', now + 1_000, now)).toBe(true);
    expect(await st.setHoldOff('p/m', now + 2_000, now + 500)).toBe(false);
  });

  it('answers from its own view when the write times out (Redis paused): an extension is no start', async () => {
    const st = storeOf({ commandTimeoutMs: 100 });
    expect(await st.ready()).toBe(true);
    const now = Date.now();
    expect(await st.setHoldOff('p/m', now + 5_000, now)).toBe(true);
    const admin = new Redis(redisServer().url);
    try {
      await admin.call('CLIENT', 'PAUSE', '400', 'ALL');
      expect(await st.setHoldOff('p/m', now + 8_000, now + 10)).toBe(false);
    } finally {
      await sleep(500);
      admin.disconnect();
    }
  });
});

describe('the counts and log lines of holds started', () => {
  const T = 1_700_000_000_000;
  const hint = (delayMs: number): WaitHint => ({ delayMs, source: 'retry-after', fleetWide: true });
  const settled = () => new Promise((resolve) => setImmediate(resolve));

  it('counts a credential hold that starts again after the last one ended', async () => {
    let now = T;
    const counted: string[] = [];
    const holdOffs = new HoldOffs(new MemoryStore(), () => now, () => 0, undefined, (h) => counted.push(h.reason));
    holdOffs.holdCredentials('p/m', 1_000, { reason: 'status_401', status: 401 });
    now = T + 5_000;
    holdOffs.holdCredentials('p/m', 1_000, { reason: 'status_403', status: 403 });
    await settled();
    expect(counted).toEqual(['status_401', 'status_403']);
  });

  it('writes the operator one line per hold-off started, none for the answers that extend it', () => {
    const starts: string[] = [];
    const holdOffs = new HoldOffs(new MemoryStore(), () => T, () => 0, (h) => starts.push(h.reason));
    holdOffs.start('p/m', hint(5_000), { reason: 'status_429', status: 429 });
    holdOffs.start('p/m', hint(8_000), { reason: 'status_503', status: 503 });
    expect(starts).toEqual(['status_429']);
  });

  it("counts a flex tier's hold-off under tier flex on the metrics page", async () => {
    const { s, client } = await groqGateway({ groq: (body) => (body.service_tier === 'flex' ? json(498, GROQ_498, { 'retry-after': '5' }) : completion('from groq', GROQ.model)) }, [GROQ]);
    expect((await sdkError(flexAsk(client))).status).toBe(498);
    await sleep(50);
    const text = await (await fetch(`${s.url}/metrics`)).text();
    expect(text).toMatch(/stormgate_holds_started_total\{target="groq\/llama-3.3-70b-versatile",kind="hold_off",tier="flex",reason="status_498"\} 1/);
    expect(text).not.toMatch(/stormgate_holds_started_total\{[^}]*tier="all"[^}]*reason="status_498"/);
  });
});

describe('the wait told to a client a hold-off turns away', () => {
  it('is the hold-off\'s end plus a spread of its own, when the hint the answer carried ends just there', () => {
    // A hint of 1 s and a hold-off ending in exactly 1 s: the client is told the end plus its spread (a fifth of it, at most 1 s).
    expect(pastHoldOff(1_000, 11_000, 10_000, () => 0.5)).toBe(1_100);
  });

  it('is at least 100 ms however close the hold-off is to its end, spread included', () => {
    const answer = unavailableAnswer({ reason: 'hold-off', target: 'p/m', retryAfterMs: 20, holdOffMs: 20, toldMs: 24 });
    expect(answer.headers['retry-after-ms']).toBe('100');
  });

  it('adds that spread in the 429 provider_held_off answer, and in the answer that started the hold-off, by the request\'s own draw', async () => {
    const T = 1_700_000_000_000;
    const limited = { error: { message: 'Rate limit reached', type: 'requests', code: 'rate_limit_exceeded' } };
    const { client } = await groqGateway({ groq: () => json(429, limited, { 'retry-after': '10' }) }, [GROQ], { route: { retry: { maxAttempts: 1 } }, deps: { now: () => T, random: () => 0.5 } });
    // The hold-off: 10 s plus its spread (0.5 of a tenth, at most 1 s) = 10.5 s; told past it: 0.5 of min(1 s, a fifth) more.
    const first = await sdkError(defaultAsk(client));
    expect(first.headers?.get('retry-after-ms')).toBe('11000');
    const held = await sdkError(defaultAsk(client));
    expect((held.error as { code?: string }).code).toBe('provider_held_off');
    expect(held.headers?.get('retry-after-ms')).toBe('11000');
  });
});
