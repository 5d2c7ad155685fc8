// Tests that kill the mutants of the 3515f4b..f8f1035 changes that the existing tests let survive: the "Request too
// large" message read after leading whitespace, what vLLM's abort chunk still carries (usage, an event name), the
// abort as a cut in the LiveStream (its breaker facts, and before the first output of an early-started stream), a
// config error's quoted text (a URL's password masked, a client key at `auth` never quoted), the /v1/models answering
// model (weighted routes, a target that passes the name on, a provider's own object kept), and the fleet's floor hold
// (a new hold starting from no slots, an exchange that disarms, a share that rounds to a slot, the others' demand, the
// exchange asked for at once, a closed pool's timer). Unit tests on fake clocks, real HTTP only for the models list.
import OpenAI from 'openai';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { isOverRateLimitMessage } from '../src/policy/outcome.ts';
import { cutShort } from '../src/streaming/stream-events.ts';
import type { SseEvent } from '../src/streaming/sse-parser.ts';
import { handedOverStream, readAll, upstream } from './helpers/live-stream.ts';
import { configErrorOf, validConfigText } from './helpers/config-text.ts';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { createRouter } from '../src/routing/router.ts';
import { createModelsList } from '../src/routing/models-list.ts';
import { TEST_KEY, useStacks } from './helpers/stack.ts';
import { FLOOR_HOLD_MAX_MS, FLOOR_SETTLE_MS, FloorHold, onlyTheFloor } from '../src/pools/floor-hold.ts';
import type { ProviderPool, SlotRequest } from '../src/pools/provider-pool.ts';
import { fleetPool, slotRequest, track } from './helpers/floor-pool.ts';
import { shareFleetCapacity } from '../src/pools/fleet-share.ts';
import type { Pools } from '../src/pools/pools.ts';
import type { StateStore } from '../src/state/store.ts';

describe("OpenAI's 'Request too large'", () => {
  it('is told after leading whitespace too, as a message with a newline first is sent', () => {
    expect(isOverRateLimitMessage('\n  Request too large for gpt-4o in organization org-abc on tokens per min (TPM): Limit 30000, Requested 36278.')).toBe(true);
  });
});

describe('the rest of a chunk vLLM aborted', () => {
  const sse = (data: unknown, event: string | null = null): SseEvent => {
    const text = JSON.stringify(data);
    return { raw: `${event === null ? '' : `event: ${event}\n`}data: ${text}`, data: text, event };
  };

  it('keeps a chunk whose only other content is its usage: the client asked for it', () => {
    const usage = { prompt_tokens: 3, completion_tokens: 5, total_tokens: 8 };
    const short = cutShort('chat', sse({ object: 'chat.completion.chunk', choices: [{ index: 0, delta: {}, finish_reason: 'abort' }], usage }));
    expect(short?.left).toBeDefined();
    expect(JSON.parse(short!.left!.data!).usage).toEqual(usage);
  });

  it('keeps the event name the chunk came with', () => {
    const short = cutShort('chat', sse({ object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content: 'lo' }, finish_reason: 'abort' }] }, 'message'));
    expect(short!.left!.raw.startsWith('event: message\ndata: ')).toBe(true);
    expect(short!.left!.event).toBe('message');
  });
});

describe('vLLM\'s abort in a LiveStream', () => {
  const cc = (delta: Record<string, unknown>, finish: string | null = null) =>
    `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;

  it("tells the target's breaker it was a stream cut, as a dropped connection does", async () => {
    const controller = new AbortController();
    const { live, ended } = handedOverStream({ first: cc({ content: 'Hel' }), iterator: upstream(controller, [cc({ content: 'lo' }, 'abort'), 'data: [DONE]\n\n']), controller });
    const text = await readAll(live);
    expect(text).toContain('the upstream stream was cut: the provider aborted the answer');
    expect(await ended).toMatchObject({ kind: 'cut', upstreamBroke: { reason: 'stream_cut' } });
  });

  it('is a cut too in a stream handed over before its first output (started early at the deadline)', async () => {
    const controller = new AbortController();
    const { live, ended } = handedOverStream({
      first: cc({ role: 'assistant', content: '' }),
      iterator: upstream(controller, [cc({}, 'abort'), 'data: [DONE]\n\n']),
      controller,
      firstTokenLeftMs: 5_000,
    });
    const text = await readAll(live);
    expect(text).toContain('the upstream stream was cut: the provider aborted the answer');
    expect(await ended).toMatchObject({ kind: 'cut', upstreamBroke: { reason: 'stream_cut' } });
  });
});

describe('a config value of the wrong type, quoted', () => {
  const env = { OPENAI_API_KEY: 'sk-live-SECRET-0123' };

  it("masks a URL's password in the text it quotes", () => {
    expect(configErrorOf(validConfigText('state: redis://:hunter2@redis:6379\n'), env).message).toBe(
      'gw.yaml:10: state: expected object, received string ("redis://:[redacted]@redis:6379")',
    );
  });

  it('never quotes a client key written where the auth section belongs', () => {
    const message = configErrorOf(validConfigText('auth: sk-client-SECRET-42\n'), env).message;
    expect(message).toBe('gw.yaml:10: auth: expected object, received string');
    expect(message).not.toContain('SECRET');
  });
});

describe('the model that answers a route, in /v1/models', () => {
  const providers = {
    vllm: { family: 'openai' as const, baseUrl: 'http://127.0.0.1:9/v1', apiKey: 'k' },
    openai: { family: 'openai' as const, baseUrl: 'http://127.0.0.1:9/v1', apiKey: 'k' },
  };
  const listed = async (route: Record<string, unknown>) => {
    const config = ConfigSchema.parse({ providers, routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, ...route }] });
    return (await createModelsList(createRouter(config), new Map()).list()).data.map((m) => m.id);
  };

  it('is listed for a fallback route whose every target names its model', async () => {
    expect(await listed({ targets: [{ provider: 'vllm', model: 'llama' }, { provider: 'openai', model: 'gpt-4o-mini' }] })).toEqual(['llama']);
  });

  it('is none for a weighted route: its targets answer by turns', async () => {
    expect(await listed({ strategy: 'weighted', targets: [{ provider: 'vllm', model: 'llama' }, { provider: 'openai', model: 'gpt-4o-mini' }] })).toEqual([]);
  });

  it("is none when a target sends the client's own name on: that provider's list says what the route serves", async () => {
    expect(await listed({ targets: [{ provider: 'vllm', model: 'llama' }, { provider: 'openai' }] })).toEqual([]);
  });
});

describe("the answering model a provider's list already holds", () => {
  const startStack = useStacks();

  it("keeps the provider's own object (its created, its owner), as the first route to list it gave it", async () => {
    const stack = await startStack({
      config: (url): ConfigInput => ({
        server: { host: '127.0.0.1', port: 0 },
        providers: { openai: { family: 'openai', baseUrl: `${url}/v1`, apiKey: TEST_KEY } },
        routes: [
          { name: 'chat', match: { path: '/v1/chat/completions', models: ['gpt-4o*'] }, targets: [{ provider: 'openai' }] },
          { name: 'chat-any', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'openai', model: 'gpt-4o' }] },
        ],
      }),
    });
    const client = new OpenAI({ baseURL: stack.baseURL, apiKey: 'unused', maxRetries: 0 });
    const models: Array<{ id: string; created: number; owned_by: string }> = [];
    for await (const m of client.models.list()) models.push(m);
    const gpt4o = models.filter((m) => m.id === 'gpt-4o');
    expect(gpt4o).toHaveLength(1);
    // The mock's object (src/mock/openai-responses.ts), not one the config made up (created 0, owned by "openai").
    expect(gpt4o[0]!.created).toBeGreaterThan(0);
  });
});

describe('the floor hold', () => {
  afterEach(() => vi.useRealTimers());
  const clock = () => Date.now();

  it('starts each hold from no slots: a later hold ends a settle after an exchange that gives fewer slots than the last one did', () => {
    vi.useFakeTimers({ now: 0 });
    const h = new FloorHold(clock);
    h.exchanged(true, 0);
    h.arrive();
    vi.setSystemTime(100);
    h.exchanged(false, 3);
    vi.setSystemTime(5_000);
    h.exchanged(true, 0);
    expect(h.arrive()).toBe(true);
    vi.setSystemTime(5_100);
    h.exchanged(false, 2);
    expect(h.untilMs).toBe(5_100 + FLOOR_SETTLE_MS);
  });

  it('is disarmed by an exchange that leaves room again, before any newcomer came', () => {
    vi.useFakeTimers({ now: 0 });
    const h = new FloorHold(clock);
    h.exchanged(true, 0);
    h.exchanged(false, 3);
    expect(h.arrive()).toBe(false);
  });

  it('is not armed by a share that rounds to a slot of its own', () => {
    expect(onlyTheFloor(6, 0.1, 46)).toBe(false);
  });
});

describe('a pool in a fleet, and its floor hold', () => {
  afterEach(() => vi.useRealTimers());
  const pool = () => fleetPool();
  const req = slotRequest;

  it('holds no one when the share rounds to a slot, or the others leave room: judged on maxConcurrent, not on the slots it has now', async () => {
    vi.useFakeTimers({ now: 0 });
    for (const [share, others] of [[0.1, 46], [0, 5]] as const) {
      const p = pool();
      p.shareOnDemand(() => {});
      p.setShare(share, others);
      const online = track(p.acquire(req(0)));
      await vi.advanceTimersByTimeAsync(1);
      expect(online.answer, `share ${share}, others ${others}`).toMatchObject({ ok: true, queued: false });
      p.close();
    }
  });

  it("is not started by a batch newcomer, so the online one after it starts it and asks the fleet", async () => {
    vi.useFakeTimers({ now: 0 });
    const p = pool();
    const asked: number[][] = [];
    p.shareOnDemand(() => asked.push(p.demandByClass()));
    p.setShare(0, 46);
    expect(await p.acquire(req(1))).toMatchObject({ ok: true, queued: false });
    expect(asked).toEqual([]);
    const online = track(p.acquire(req(0)));
    await vi.advanceTimersByTimeAsync(1);
    expect(online.answer).toBeUndefined();
    expect(asked).toHaveLength(1);
    p.close();
  });

  it('does not start the settle at an exchange that gives it no slot of its own: the hold goes on to its cap', async () => {
    vi.useFakeTimers({ now: 0 });
    const p = pool();
    p.shareOnDemand(() => {});
    p.setShare(0, 46);
    const online = track(p.acquire(req(0)));
    await vi.advanceTimersByTimeAsync(100);
    p.setShare(0, 3);
    await vi.advanceTimersByTimeAsync(FLOOR_SETTLE_MS + 50);
    expect(online.answer).toBeUndefined();
    await vi.advanceTimersByTimeAsync(FLOOR_HOLD_MAX_MS);
    expect(online.answer).toMatchObject({ ok: true, queued: true });
    p.close();
  });

  it('leaves no timer behind once closed, after a hold a newcomer that could not wait started', async () => {
    vi.useFakeTimers({ now: 0 });
    const p = pool();
    p.shareOnDemand(() => {});
    p.setShare(0, 46);
    const got = await p.acquire(req(0, 1_500));
    expect(got).toMatchObject({ ok: true, queued: false });
    (got as { slot: { release(): void } }).slot.release();
    p.close();
    expect(vi.getTimerCount()).toBe(0);
  });
});

describe("the fleet's exchange for a pool", () => {
  afterEach(() => vi.useRealTimers());
  const OTHERS = [0, 46];

  function fleetOf(pool: ProviderPool) {
    const exchangeDemand = vi.fn(async (_p: string, demand: readonly number[]) => ({ totals: demand.map((d, k) => d + OTHERS[k]!), instances: 2 }));
    const stop = shareFleetCapacity({ all: () => [pool] } as unknown as Pools, { exchangeDemand } as unknown as StateStore, () => Date.now());
    return { exchangeDemand, stop };
  }
  const newPool = () => fleetPool();
  const online: SlotRequest = slotRequest(0);

  it('is asked at once for a held newcomer, with its demand counted, and gives the pool the others\' demand without its own', async () => {
    vi.useFakeTimers({ now: 0 });
    const pool = newPool();
    const setShare = vi.spyOn(pool, 'setShare');
    const { exchangeDemand, stop } = fleetOf(pool);
    await vi.advanceTimersByTimeAsync(1);
    expect(setShare.mock.calls.at(-1)!.slice(0, 2)).toEqual([0, 46]);
    void pool.acquire(online);
    await vi.advanceTimersByTimeAsync(1);
    // Before the next refresh (REFRESH_MS): the newcomer's own exchange.
    expect(exchangeDemand).toHaveBeenCalledTimes(2);
    expect(exchangeDemand.mock.calls[1]![1]).toEqual([1, 0]);
    expect(setShare.mock.calls.at(-1)![1]).toBe(46);
    stop();
    pool.close();
  });
});
