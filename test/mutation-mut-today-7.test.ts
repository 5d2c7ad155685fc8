// Mutation tests, second round over the day's changes: mutants test/mutation-mut-today-6.test.ts left alive. A stream
// recovery's continuation given up at the marker, on each of its three paths (abandon), and recorded while its slot is
// held; a credential hold that lets a request parked on its target go at once; and a flex tier's hold-off, whose spell
// away the lot counts from when the store told of it. The continuation is driven by hand (a real pool, a real upstream
// over HTTP, faked guards) so that the client can leave exactly at the marker. (The redaction of the provider's request
// id in the log line is tested in test/upstream-request-id-log.test.ts.)
import type { IncomingMessage, ServerResponse } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { Pool } from 'undici';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { createMetrics } from '../src/observability/metrics.ts';
import { createLogger } from '../src/observability/logger.ts';
import { Pools } from '../src/pools/pools.ts';
import { prepareUpstream } from '../src/providers/families.ts';
import type { ProviderClient } from '../src/providers/provider-client.ts';
import type { ManagedRequest } from '../src/pipeline/handle-request.ts';
import { RequestAbort } from '../src/pipeline/request-abort.ts';
import type { StreamRecovery } from '../src/pipeline/live-stream.ts';
import { streamRecovery } from '../src/pipeline/stream-recovery.ts';
import type { TargetDeps, TargetPlan } from '../src/pipeline/target-attempts.ts';
import { createRuntime, type Runtime } from '../src/runtime.ts';
import { flexTierKey, HoldOffs } from '../src/state/hold-offs.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { handedOverStream, upstream } from './helpers/live-stream.ts';
import { cc, delta } from './helpers/scripted-provider.ts';
import { metricSum, testLogSink, useStacks } from './helpers/stack.ts';
import { sdkError } from './helpers/openai-error.ts';

const SSE = { 'content-type': 'text/event-stream' };
const role = cc([delta({ role: 'assistant', content: '' })]);
/** Generous for a loaded two-core machine. */
const PROMPTLY_MS = 5_000;
const MARKER = ': stormgate stream recovered from the next target';

const startProvider = useFakeProviders();

// ---- a continuation driven by hand ----------------------------------------------------------------------------------

/** What the next target (q) saw: each request's body, and whether its response was closed by the gateway. */
interface Upstream {
  bodies: Array<Record<string, unknown>>;
  closed: boolean[];
}

const dispatchers: Pool[] = [];
const pools: Pools[] = [];
afterEach(async () => {
  for (const p of pools.splice(0)) p.close();
  await Promise.all(dispatchers.splice(0).map((d) => d.destroy()));
});

/**
 * A stream recovery to q, a real provider over HTTP whose pool holds 2 slots, with its guards faked (always free, the
 * budget always grants). `answer` answers each of q's requests.
 */
async function recoveryTo(answer: (res: ServerResponse) => void, q: Partial<ConfigInput['providers'][string]> = {}) {
  const seen: Upstream = { bodies: [], closed: [] };
  const server = await startProvider((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const k = seen.bodies.length;
      seen.bodies.push(JSON.parse(Buffer.concat(chunks).toString()) as Record<string, unknown>);
      seen.closed[k] = false;
      res.on('close', () => (seen.closed[k] = true));
      answer(res);
    });
  });
  const timeouts = { connectMs: 2_000, firstTokenMs: 10_000, idleMs: 10_000 };
  const config = ConfigSchema.parse({
    server: { host: '127.0.0.1', port: 0 },
    providers: {
      p: { family: 'openai', baseUrl: 'http://127.0.0.1:9/v1', apiKey: 'p-key-0123456789', breaker: false, timeouts },
      q: { family: 'openai', baseUrl: `${server.origin}/v1`, apiKey: 'q-key-0123456789', breaker: false, timeouts, pools: { maxConcurrent: 2 }, ...q },
    },
    routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'p' }, { provider: 'q' }], streamRecovery: 'continue' }],
  } satisfies ConfigInput);
  const all = new Pools(config, Date.now);
  pools.push(all);
  const dispatcher = new Pool(server.origin);
  dispatchers.push(dispatcher);
  const provider = config.providers.q!;
  const client: ProviderClient = { name: 'q', config: provider, dispatcher, disabled: false };
  const json = { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true };
  const rawBody = Buffer.from(JSON.stringify(json));
  const routeConfig = config.routes[0]!;
  const req = { route: { name: 'chat', api: 'chat', config: routeConfig }, json, rawBody, path: '/v1/chat/completions', query: '', headers: {} } as unknown as ManagedRequest;
  const pool = all.of('q');
  const plan = {
    key: 'q/gpt-4o',
    sharesHoldOffs: true,
    holdOffKey: 'q/gpt-4o',
    limitKey: 'q/gpt-4o',
    label: 'q/gpt-4o',
    model: 'gpt-4o',
    ownModel: false,
    client,
    upstream: () => prepareUpstream(provider, { api: 'chat', clientPath: '/v1/chat/completions', query: '', json, rawBody, model: 'gpt-4o' }),
    retry: routeConfig.retry,
    weight: 1,
    breaker: undefined,
    budgetKey: 'chat q/gpt-4o',
    pool,
    cls: 0,
    className: pool.settings.classes[0]!.name,
  } as unknown as TargetPlan;
  const deps = {
    now: Date.now,
    guards: {
      board: { availability: () => ({ kind: 'closed' }), current: () => ({ generation: 0 }), record: async () => undefined, streamBroke: () => undefined },
      holdOffs: { until: () => undefined, credentialsHeldUntil: () => undefined, holdCredentials: () => undefined, start: () => 0, reask: () => undefined },
      budget: { tryRetry: async () => true },
    },
  } as unknown as Pick<TargetDeps, 'guards' | 'now' | 'onAttempt' | 'onRetry' | 'onBudgetExhausted'>;
  const recovery = streamRecovery(req, { choices: 1, usage: false }, plan, new RequestAbort(), deps, []) as StreamRecovery;
  const inUse = () => pool.snapshot().inUse.reduce((a, b) => a + b, 0);
  return { recovery, seen, inUse, limit: () => pool.limitOf('q/gpt-4o') };
}

/** q's continuation: its head at once, then nothing, its response held open (until the gateway lets go of it). */
const holdsOpen =
  (...events: string[]) =>
  (res: ServerResponse) => {
    res.writeHead(200, SSE);
    res.write(role + events.join(''));
  };

const PATHS = {
  // Reasoning alone went out: q is asked the request afresh.
  fresh: { first: cc([delta({ reasoning_content: 'Let me think.' })]), next: holdsOpen(cc([delta({ content: 'Hello' })])), q: {} },
  // "Hel" went out; q takes no prefill, and its answer begins with "Hel": spliced on.
  spliced: { first: cc([delta({ content: 'Hel' })]), next: holdsOpen(cc([delta({ content: 'Hello' })])), q: {} },
  // "Hel" went out; q continues a prefill of it.
  prefilled: { first: cc([delta({ content: 'Hel' })]), next: holdsOpen(cc([delta({ content: 'lo' })])), q: { prefill: true } },
};

describe("a client that leaves at a stream recovery's marker, before the continuation is read", () => {
  for (const [path, { first, next, q }] of Object.entries(PATHS)) {
    it(`(${path}) has the continuation's upstream request aborted and its pool slot given back`, async () => {
      const { recovery, seen, inUse } = await recoveryTo(next, q);
      const controller = new AbortController();
      // The stream to continue: its first output, then a reset.
      const { live, ended } = handedOverStream({ first: role + first, iterator: upstream(controller, [new Error('socket hang up')]), controller, idleMs: 10_000 });
      live.recoverWith(recovery);
      const body = live.body();
      expect((await body.next()).value).toContain(path === 'fresh' ? 'Let me think.' : 'Hel');
      const marker = await body.next();
      expect(marker.value).toContain(MARKER);
      // The continuation went, on the path named, and holds q's slot.
      expect(seen.bodies).toHaveLength(1);
      const messages = seen.bodies[0]!.messages as Array<{ role: string; content: string }>;
      expect(messages.at(-1)).toEqual(path === 'prefilled' ? { role: 'assistant', content: 'Hel' } : { role: 'user', content: 'hi' });
      expect(inUse()).toBe(1);
      // The client leaves right there: its body is given up at the marker.
      await body.return(undefined);
      await expect.poll(() => seen.closed[0], { timeout: PROMPTLY_MS }).toBe(true);
      await expect.poll(inUse, { timeout: PROMPTLY_MS }).toBe(0);
      expect((await ended).kind).toBe('client-gone');
    });
  }
});

describe("a continuation's answer, as its target's adaptive limit hears it", () => {
  it("is heard with the continuation's slot still held: a 429 at the limit cuts it", async () => {
    // q takes 2 at once; the continuation is the one in flight, refused with no wait hint (so no hold-off): with its
    // slot counted, 1 of a limit of 2 is in flight, which binds (within a tenth): the limit is cut to 1. Counted
    // without it (its slot given back first), nothing was in flight, and a 429 then says nothing of concurrency.
    const { recovery, seen, limit, inUse } = await recoveryTo((res) => {
      res.writeHead(429, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { message: 'Rate limit reached', type: 'requests', code: 'rate_limit_exceeded' } }));
    });
    expect(limit()).toBe(2);
    expect(await recovery('Hel', 'stream_cut', new RequestAbort(), 10_000)).toBe('failed');
    expect(seen.bodies).toHaveLength(1);
    expect(limit()).toBe(1);
    expect(inUse()).toBe(0);
  });
});

// ---- a credential hold on a target with requests parked on it ---------------------------------------------------------

const startStack = useStacks();
const ask = (client: OpenAI) => client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });

describe('a credential hold that starts on a target requests are parked on', () => {
  it("lets them go at once (here to their 502), not at the end of the hold-off they parked for", async () => {
    let asked = 0;
    const q = await startProvider((req, res) => {
      req.resume();
      req.on('end', () => {
        asked++;
        res.writeHead(429, { 'content-type': 'application/json', 'retry-after': '15' });
        res.end(JSON.stringify({ error: { message: 'Rate limit reached', type: 'requests', code: 'rate_limit_exceeded' } }));
      });
    });
    // The store the gateway shares with its fleet (Redis, in production): another instance writes the hold there.
    const store = new MemoryStore();
    const s = await startStack({
      deps: { store },
      config: () =>
        ({
          server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
          providers: { q: { family: 'openai', baseUrl: `${q.origin}/v1`, apiKey: 'q-key-0123456789', breaker: false } },
          routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'q' }], retry: { maxAttempts: 1 }, park: { maxWaitMs: 30_000 } }],
        }) as ConfigInput,
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0 });
    // The first request's 429 holds q off for 15 s; the second parks for it.
    expect((await sdkError(ask(client))).status).toBe(429);
    const parked = sdkError(ask(client));
    await expect.poll(() => metricSum(s, 'stormgate_parked_requests{route="chat"}'), { timeout: PROMPTLY_MS }).toBe(1);
    // Another instance's request is refused q's key: q is credential-held, fleet-wide.
    new HoldOffs(store, Date.now, Math.random).holdCredentials('q/gpt-4o', 60_000, { reason: 'status_401', status: 401 });
    const err = await Promise.race([parked, sleep(PROMPTLY_MS, 'still parked' as const)]);
    expect(err).not.toBe('still parked');
    expect((err as Awaited<typeof parked>).status).toBe(502);
    expect(asked).toBe(1);
    expect(await metricSum(s, 'stormgate_parked_requests{route="chat"}')).toBe(0);
  });
});

// ---- a flex tier's hold-off, as the runtime tells the lot of it --------------------------------------------------------

describe("the lot's release window after a flex tier's hold-off, with the runtime's wiring", () => {
  const T0 = 1_000_000;
  const TARGET = 'q/gpt-4o';
  const FLEX = flexTierKey(TARGET);
  let runtime: Runtime | undefined;
  beforeEach(() => vi.useFakeTimers({ now: T0 }));
  afterEach(async () => {
    await runtime?.close();
    runtime = undefined;
    vi.useRealTimers();
  });

  it('is measured from when the store told of the hold-off, not from the next re-check of the parked', async () => {
    const config = ConfigSchema.parse({
      server: { host: '127.0.0.1', port: 0, logLevel: 'silent' },
      providers: { q: { family: 'openai', baseUrl: 'http://127.0.0.1:9/v1', apiKey: 'q-key-0123456789', breaker: false } },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'q' }] }],
    } satisfies ConfigInput);
    const store = new MemoryStore();
    runtime = await createRuntime(config, { logger: createLogger(config, testLogSink([])), metrics: createMetrics({ defaultMetrics: false }), store, now: () => Date.now(), random: () => 0.99 });
    let releasedAt: number | undefined;
    // A flex request parked while its tier is free, not to go before its moment 10 s on: the lot re-checks every 250 ms.
    const parked = runtime.lot.park(FLEX, { route: 'chat', deadlineAtMs: T0 + 120_000, signal: new AbortController().signal, maxQueue: 100, maxWaitMs: undefined, minAttemptMs: 0, notBeforeMs: T0 + 10_000 });
    void parked.then((r) => {
      releasedAt = Date.now();
      if (r.kind === 'released') r.ticket.done();
    });
    await vi.advanceTimersByTimeAsync(260);
    // Another instance's 498: the flex tier is held off for 2 s, from 260 ms (between two re-checks).
    await store.setHoldOff(FLEX, T0 + 2_260, T0 + 260);
    // Back at 2.26 s after 2 s away: a window of a fifth of that (400 ms), the request at 0.99 of it (396 ms). Counted
    // from the next re-check (500 ms) the spell was 1.76 s, and the request went 48 ms sooner.
    await vi.advanceTimersByTimeAsync(2_630 - 260);
    expect(releasedAt).toBeUndefined();
    await vi.advanceTimersByTimeAsync(100);
    expect(releasedAt).toBe(T0 + 2_656);
    expect((await parked).kind).toBe('released');
  });
});
