// Mutation testing of the day's changes: the watch for clients' undeclared retries (state/client-repeats.ts, its
// arrival in serve-managed.ts and its end in server.ts), the one-queue-per-target parking lot with its per-key tiers,
// and a stream recovery's continuation through the next target's pool. Each test here kills a mutant the other suites
// let live (a bound moved, a field of the key dropped, an outcome counted as a failure); the watch and the lot with
// fake clocks, the wiring over real HTTP with the bundled mock.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ParkingLot, type TargetState } from '../src/pipeline/parking-lot.ts';
import { flexTierKey } from '../src/state/hold-offs.ts';
import { ClientRepeats, type Arrival } from '../src/state/client-repeats.ts';
import { ConfigSchema } from '../src/config/schema.ts';
import { createMetrics } from '../src/observability/metrics.ts';
import { zeroSeries } from '../src/observability/zero-series.ts';
import { TargetKeys } from '../src/routing/target-keys.ts';
import { defaultConfig, metricSum, useStacks, type Stack } from './helpers/stack.ts';
import type { IncomingMessage, ServerResponse } from 'node:http';
import OpenAI from 'openai';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { cc, delta, DONE } from './helpers/scripted-provider.ts';
import { streamUntil } from './helpers/chat-stream.ts';
import { recoveryConfig } from './helpers/recovery-config.ts';

const arrival = (body: string, over: Partial<Arrival> = {}): Arrival => ({ client: undefined, path: '/v1/chat/completions', query: '', priority: undefined, rawBody: Buffer.from(body), windowMs: 1_000, ...over });

describe('ClientRepeats, at its edges', () => {
  it('hashes nothing once its only failure was forgotten by a successful repeat, though that window has not ended', () => {
    let now = 0;
    const repeats = new ClientRepeats(() => now);
    repeats.ended(arrival('q1'), true);
    now = 100;
    const again = arrival('q1');
    expect(repeats.isRepeat(again)).toBe(true);
    repeats.ended(again, false);
    expect(repeats.size).toBe(0);
    // Same length as the forgotten failure, within its old window: nothing is kept, so nothing is hashed.
    const next = arrival('q2');
    expect(repeats.isRepeat(next)).toBe(false);
    expect(next.key).toBeUndefined();
  });

  it('forgets the lengths of failures it forgot once they all expired: a body of such a length is not hashed', () => {
    let now = 0;
    const repeats = new ClientRepeats(() => now);
    repeats.ended(arrival('aaa'), true);
    now = 1_000;
    expect(repeats.isRepeat(arrival('bbb'))).toBe(false);
    repeats.ended(arrival('ccccc'), true);
    now = 1_100;
    // Only the 5-byte failure is kept: a 3-byte body repeats none.
    const three = arrival('ddd');
    expect(repeats.isRepeat(three)).toBe(false);
    expect(three.key).toBeUndefined();
    const five = arrival('eeeee');
    expect(repeats.isRepeat(five)).toBe(false);
    expect(five.key).toBeDefined();
  });

  it('is no repeat at the very end of its window while another failure keeps the watch on, and drops it then', () => {
    let now = 0;
    const repeats = new ClientRepeats(() => now);
    repeats.ended(arrival('a'), true);
    repeats.ended(arrival('b', { windowMs: 5_000 }), true);
    now = 1_000;
    expect(repeats.isRepeat(arrival('a'))).toBe(false);
    expect(repeats.size).toBe(1);
    expect(repeats.isRepeat(arrival('b'))).toBe(true);
  });

  it('keeps a failure of a long window after a shorter one that came later has expired', () => {
    let now = 0;
    const repeats = new ClientRepeats(() => now);
    repeats.ended(arrival('long', { windowMs: 5_000 }), true);
    repeats.ended(arrival('shrt'), true);
    now = 2_000;
    expect(repeats.isRepeat(arrival('long'))).toBe(true);
  });

  it('sweeps a failure whose window ends exactly at the next failure', () => {
    let now = 0;
    const repeats = new ClientRepeats(() => now);
    repeats.ended(arrival('a'), true);
    now = 1_000;
    repeats.ended(arrival('b'), true);
    expect(repeats.size).toBe(1);
  });

  it('past its cap forgets the failure renewed longest ago, not the one first seen: a renewed failure is the newest', () => {
    let now = 0;
    const repeats = new ClientRepeats(() => now, 2);
    repeats.ended(arrival('a'), true);
    now = 10;
    repeats.ended(arrival('b'), true);
    now = 20;
    const again = arrival('a');
    expect(repeats.isRepeat(again)).toBe(true);
    repeats.ended(again, true);
    now = 30;
    repeats.ended(arrival('c'), true);
    expect(repeats.size).toBe(2);
    expect(repeats.isRepeat(arrival('a'))).toBe(true);
    expect(repeats.isRepeat(arrival('b'))).toBe(false);
  });
});

describe("a key's character beyond ASCII", () => {
  it('is named by its code point, one past U+FFFF included (not half of its surrogate pair)', () => {
    const input = defaultConfig('http://127.0.0.1:9');
    const parsed = ConfigSchema.safeParse({ ...input, providers: { mock: { ...input.providers.mock!, apiKey: 'sk-test-\u{1F511}-0123456789' } } });
    expect(parsed.success).toBe(false);
    const message = parsed.error!.issues.map((i) => i.message).join('\n');
    expect(message).toContain('beyond ASCII (U+1F511,');
    expect(message).not.toContain('0123456789');
  });
});

describe('stormgate_client_retries_total at start-up', () => {
  it('has both kinds of client retry at zero for every route, before any request', async () => {
    const config = ConfigSchema.parse(defaultConfig('http://127.0.0.1:9'));
    const metrics = createMetrics({ defaultMetrics: false });
    zeroSeries(config, metrics, new TargetKeys(config));
    const text = await metrics.registry.metrics();
    for (const how of ['declared', 'repeat']) expect(text).toContain(`stormgate_client_retries_total{route="chat",how="${how}"} 0`);
  });
});

const start = useStacks();
const FAILING = { faults: { errors: [{ status: 503, rate: 1 }] }, provider: { breaker: false as const } };
const ROUTE = { retry: { maxAttempts: 1 }, park: false as const };

type Line = Record<string, unknown>;
async function lines(s: Stack, n: number): Promise<Line[]> {
  for (let i = 0; i < 300; i++) {
    const found = s.logs.map((l) => JSON.parse(l) as Line).filter((l) => l.route === 'chat');
    if (found.length >= n) return found;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error(`fewer than ${n} request lines`);
}

/** Sends a raw body and waits for its log line: requests go one at a time, each ended before the next arrives. */
async function send(s: Stack, body: string, opts: { headers?: Record<string, string>; query?: string } = {}): Promise<{ status: number; line: Line }> {
  const before = (await lines(s, 0)).length;
  const res = await fetch(`${s.baseURL}/chat/completions${opts.query ?? ''}`, { method: 'POST', headers: { 'content-type': 'application/json', ...opts.headers }, body });
  await res.arrayBuffer();
  const line = (await lines(s, before + 1))[before]!;
  return { status: res.status, line };
}

const BODY = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'book a table' }] });

describe('what a repeat is, through the gateway', () => {
  it('the same bytes, path, query and x-stormgate-priority: another priority, another query or the same JSON spelt otherwise is no repeat', async () => {
    const s = await start({ ...FAILING, route: ROUTE });
    expect((await send(s, BODY)).status).toBe(503);
    const batch = await send(s, BODY, { headers: { 'x-stormgate-priority': 'batch' } });
    const query = await send(s, BODY, { query: '?trace=1' });
    const spelt = await send(s, JSON.stringify(JSON.parse(BODY), null, 1));
    expect([batch.line.clientRetry, query.line.clientRetry, spelt.line.clientRetry]).toEqual([undefined, undefined, undefined]);
    // Each of them failed in turn: its own repeat is one.
    expect((await send(s, BODY, { headers: { 'x-stormgate-priority': 'batch' } })).line.clientRetry).toBe('repeat');
    expect((await send(s, BODY, { query: '?trace=1' })).line.clientRetry).toBe('repeat');
    expect((await send(s, BODY)).line.clientRetry).toBe('repeat');
    // A repeat that says it is a retry is named by what it said.
    expect((await send(s, BODY, { headers: { 'x-stainless-retry-count': '1' } })).line.clientRetry).toBe('declared');
  });

  it("tells clients apart by their keys: another client's same body is no repeat", async () => {
    const keys = { agents: 'sk-agents-0123456789abcdef', batch: 'sk-batch-0123456789abcdef' };
    const s = await start({ ...FAILING, config: (url) => ({ ...defaultConfig(url, { route: ROUTE, provider: FAILING.provider }), auth: { keys } }) });
    const as = (key: string) => ({ headers: { authorization: `Bearer ${key}` } });
    expect((await send(s, BODY, as(keys.agents))).status).toBe(503);
    expect((await send(s, BODY, as(keys.batch))).line.clientRetry).toBeUndefined();
    expect((await send(s, BODY, as(keys.agents))).line.clientRetry).toBe('repeat');
  });

  it('keeps a failure for windowS seconds by the gateway clock, not milliseconds', async () => {
    let offsetMs = 0;
    const s = await start({ ...FAILING, route: { ...ROUTE, budget: { repeats: { windowS: 60 } } }, deps: { now: () => Date.now() + offsetMs } });
    expect((await send(s, BODY)).status).toBe(503);
    offsetMs += 30_000;
    expect((await send(s, BODY)).line.clientRetry).toBe('repeat');
    // Renewed by that failed repeat: 59 s later still one, 61 s after the last failure no longer.
    offsetMs += 59_000;
    expect((await send(s, BODY)).line.clientRetry).toBe('repeat');
    offsetMs += 61_000;
    expect((await send(s, BODY)).line.clientRetry).toBeUndefined();
  });

  it("counts a degraded answer as answered: its client has text and does not retry, so the same body next is no repeat", async () => {
    const s = await start({
      ...FAILING,
      config: (url) => {
        const input = defaultConfig(url, { route: ROUTE, provider: FAILING.provider });
        return { ...input, routes: input.routes.map((r) => (r.name === 'chat' ? { ...r, degraded: { message: 'busy, try later' } } : r)) };
      },
    });
    const first = await send(s, BODY);
    expect(first.status).toBe(200);
    expect(first.line.outcome).toBe('degraded');
    expect((await send(s, BODY)).line.clientRetry).toBeUndefined();
  });

  it('counts a replayed answer as answered: the same body after the replay is no repeat', async () => {
    const s = await start({ faults: { errors: [{ status: 503, rate: 1, times: 1 }] }, provider: { breaker: false }, route: ROUTE });
    const keyed = { headers: { 'idempotency-key': 'order-42' } };
    expect((await send(s, BODY, keyed)).status).toBe(503);
    const run = await send(s, BODY, keyed);
    expect(run.status).toBe(200);
    expect(run.line.clientRetry).toBe('repeat');
    const replay = await send(s, BODY, keyed);
    expect(replay.line.outcome).toBe('replayed');
    expect((await send(s, BODY)).line.clientRetry).toBeUndefined();
  });
});

const T = 'groq/llama';
const FLEX = flexTierKey(T);

describe("the parking lot's tiers in one queue, at their edges", () => {
  let states: Record<string, TargetState>;
  let looks: number;
  let random: () => number;
  let lot: ParkingLot;
  const released: Array<[string, number]> = [];
  const park = (key: string, name: string, deadlineAtMs: number, over: { signal?: AbortSignal; notBeforeMs?: number } = {}) =>
    lot
      .park(key, { route: 'chat', deadlineAtMs, signal: over.signal ?? new AbortController().signal, maxQueue: 100, maxWaitMs: undefined, minAttemptMs: 0, ...(over.notBeforeMs !== undefined && { notBeforeMs: over.notBeforeMs }) })
      .then((r) => {
        if (r.kind === 'released') released.push([name, Date.now()]);
        return r;
      });
  beforeEach(() => {
    vi.useFakeTimers({ now: 0 });
    states = { [T]: { mode: 'available', slots: 64 }, [FLEX]: { mode: 'available', slots: 64 } };
    looks = 0;
    random = () => 0;
    released.length = 0;
    lot = new ParkingLot({ now: () => Date.now(), random: () => random(), stateOf: (key) => (looks++, states[key]!) });
  });
  afterEach(() => {
    lot.close();
    vi.useRealTimers();
  });

  it("releases a flex tier's requests when told its key changed, not only at the end its hold-off had", async () => {
    states[FLEX] = { mode: 'blocked', availableAtMs: 60_000 };
    void park(FLEX, 'flex', 120_000);
    await vi.advanceTimersByTimeAsync(100);
    expect(released).toEqual([]);
    // The tier's hold-off went early (another instance's answer): the lot is told under the tier's key.
    states[FLEX] = { mode: 'available', slots: 64 };
    lot.notify(FLEX);
    await vi.advanceTimersByTimeAsync(0);
    expect(released).toEqual([['flex', 100]]);
  });

  it('measures the window of tiers back at once from the earliest of their spells away', async () => {
    random = () => 0.99;
    // The flex tier is held alone from 0; a target-wide hold-off from 2 s holds both; both end at 4 s.
    states[FLEX] = { mode: 'blocked', availableAtMs: 4_000 };
    void park(FLEX, 'flex', 120_000);
    await vi.advanceTimersByTimeAsync(2_000);
    states[T] = { mode: 'blocked', availableAtMs: 4_000 };
    void park(T, 'default', 120_000);
    await vi.advanceTimersByTimeAsync(1_999);
    states[T] = { mode: 'available', slots: 64 };
    states[FLEX] = { mode: 'available', slots: 64 };
    // Away 4 s: a window of 800 ms (not the 400 ms of the target's own 2 s), both near its end.
    await vi.advanceTimersByTimeAsync(501);
    expect(released).toEqual([]);
    await vi.advanceTimersByTimeAsync(500);
    expect(released.map(([n]) => n).sort()).toEqual(['default', 'flex']);
    for (const [, at] of released) expect(at).toBeGreaterThanOrEqual(4_790);
  });

  it("parks a flex newcomer behind its own tier's release window, which the target's requests did not have", async () => {
    random = () => 0.99;
    states[FLEX] = { mode: 'blocked', availableAtMs: 2_000 };
    void park(FLEX, 'first', 120_000);
    await vi.advanceTimersByTimeAsync(1_999);
    states[FLEX] = { mode: 'available', slots: 64 };
    await vi.advanceTimersByTimeAsync(101);
    // Back at 2 s after 2 s away: the first flex request's moment is near the end of a 400 ms window.
    void park(FLEX, 'newcomer', 100_000);
    await vi.advanceTimersByTimeAsync(0);
    expect(released).toEqual([]);
    await vi.advanceTimersByTimeAsync(400);
    expect(released.map(([n]) => n).sort()).toEqual(['first', 'newcomer']);
    for (const [, at] of released) expect(at).toBeGreaterThanOrEqual(2_396);
  });

  it('once a tier\'s last parked request left by the clock or its client, stops the 250 ms re-checks for it', async () => {
    states[T] = { mode: 'available', slots: 1 };
    states[FLEX] = { mode: 'blocked', availableAtMs: 60_000 };
    const first = await park(T, 'first', 120_000);
    expect(first.kind).toBe('released');
    const late = park(T, 'late', 5_000);
    const gone = new AbortController();
    const left = park(T, 'left', 120_000, { signal: gone.signal });
    void park(FLEX, 'flex', 120_000);
    // One default-tier request leaves by the clock, seen at a pump before its timer fires; the other's client leaves.
    vi.setSystemTime(5_000);
    lot.notify(T);
    expect((await late).kind).toBe('timeout');
    gone.abort();
    expect((await left).kind).toBe('aborted');
    await vi.advanceTimersByTimeAsync(1_000);
    looks = 0;
    // Only the flex request waits, for its tier's hold-off alone: no re-check until it ends.
    await vi.advanceTimersByTimeAsync(10_000);
    expect(looks).toBeLessThanOrEqual(2);
  });

  it("measures a tier's spell away from when a request of it parked, not from pumps while it had none parked", async () => {
    random = () => 0.99;
    states[T] = { mode: 'blocked', availableAtMs: 10_000 };
    states[FLEX] = { mode: 'blocked', availableAtMs: 10_000 };
    // A default-tier request parks and leaves: its tier stays in the queue, empty.
    const gone = new AbortController();
    const left = park(T, 'left', 120_000, { signal: gone.signal });
    gone.abort();
    await left;
    // The lot looks at the target while a flex request waits, then that one leaves too.
    const flexGone = new AbortController();
    const flex = park(FLEX, 'flex', 120_000, { signal: flexGone.signal });
    await vi.advanceTimersByTimeAsync(5_000);
    lot.notify(T);
    flexGone.abort();
    await flex;
    await vi.advanceTimersByTimeAsync(4_000);
    void park(T, 'late', 120_000);
    await vi.advanceTimersByTimeAsync(999);
    states[T] = { mode: 'available', slots: 64 };
    // Parked 1 s before the end: a window of 200 ms, not the second of a spell counted from 0.
    await vi.advanceTimersByTimeAsync(300);
    expect(released.map(([n]) => n)).toEqual(['late']);
  });

  it('wakes at the earliest end of the keys that hold its requests, whichever tier parked first', async () => {
    states[T] = { mode: 'blocked', availableAtMs: 1_000 };
    states[FLEX] = { mode: 'blocked', availableAtMs: 5_000 };
    void park(T, 'default', 120_000);
    void park(FLEX, 'flex', 120_000);
    // The target's hold-off is renewed to 2 s before its end: the lot finds that out when it wakes at 1 s.
    await vi.advanceTimersByTimeAsync(500);
    states[T] = { mode: 'blocked', availableAtMs: 2_000 };
    await vi.advanceTimersByTimeAsync(1_499);
    states[T] = { mode: 'available', slots: 64 };
    await vi.advanceTimersByTimeAsync(1);
    expect(released).toEqual([['default', 2_000]]);
  });

  it("arms a wake-up for a held tier's end when a re-check released the last of the other tier's requests", async () => {
    states[T] = { mode: 'available', slots: 1 };
    states[FLEX] = { mode: 'blocked', availableAtMs: 5_000 };
    expect((await park(T, 'first', 120_000)).kind).toBe('released');
    void park(T, 'second', 120_000);
    void park(FLEX, 'flex', 120_000);
    // The limit rises with no word to the lot: its 250 ms re-check lets the second request go.
    states[T] = { mode: 'available', slots: 2 };
    await vi.advanceTimersByTimeAsync(250);
    expect(released.map(([n]) => n)).toEqual(['first', 'second']);
    // Only the flex request waits, for its tier's hold-off alone: the lot looks again at its end, not before (a wake-up
    // armed for no time at all, setTimeout(Infinity), fires at once in Node, with a TimeoutOverflowWarning).
    looks = 0;
    await vi.advanceTimersByTimeAsync(3_000);
    expect(looks).toBe(0);
    // Both tiers' requests count against the target's one limit: two are out, so a third slot for the flex request.
    states[FLEX] = { mode: 'available', slots: 3 };
    await vi.advanceTimersByTimeAsync(2_000);
    expect(released.map(([n]) => n)).toEqual(['first', 'second', 'flex']);
  });

  it('keeps to its 250 ms re-checks while a held flex request has a moment of its own already past', async () => {
    states[T] = { mode: 'available', slots: 1 };
    states[FLEX] = { mode: 'blocked', availableAtMs: 60_000 };
    expect((await park(T, 'first', 120_000)).kind).toBe('released');
    void park(T, 'waiting', 120_000);
    void park(FLEX, 'flex', 120_000, { notBeforeMs: 10 });
    await vi.advanceTimersByTimeAsync(100);
    looks = 0;
    await vi.advanceTimersByTimeAsync(10_000);
    expect(looks).toBeLessThanOrEqual(2 * 41);
    expect(looks).toBeGreaterThan(0);
  });
});

const SSE = { 'content-type': 'text/event-stream' };
const role = cc([delta({ role: 'assistant', content: '' })]);
/** Generous for a loaded two-core machine. */
const PROMPTLY_MS = 5_000;

describe("a stream recovery's continuation in the next target's pool", () => {
  const startProvider = useFakeProviders();
  const startStack = useStacks();
  const release: Array<() => void> = [];
  afterEach(() => release.splice(0).forEach((f) => f()));

  /** The primary: every stream sends "Hel" and is held open until cut(k) resets the k-th. */
  function primary() {
    const open: ServerResponse[] = [];
    const handler = (req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, SSE);
        res.write(role + cc([delta({ content: 'Hel' })]));
        open.push(res);
      });
    };
    return { handler, cut: (k: number) => open[k]!.socket?.destroy() };
  }

  /** The backup: `first(res)` answers its first request; the others get "Hello", then " there." once let go. */
  function backup(first?: (res: ServerResponse) => void) {
    let letGo!: () => void;
    const gate = new Promise<void>((resolve) => (letGo = resolve));
    release.push(() => letGo());
    const up = { seen: 0, inFlight: 0, maxInFlight: 0, letGo };
    const handler = (req: IncomingMessage, res: ServerResponse) => {
      req.resume();
      req.on('end', () => {
        const k = up.seen++;
        if (k === 0 && first) return first(res);
        up.inFlight++;
        up.maxInFlight = Math.max(up.maxInFlight, up.inFlight);
        res.on('close', () => up.inFlight--);
        res.writeHead(200, SSE);
        res.write(role + cc([delta({ content: 'Hello' })]));
        void gate.then(() => res.destroyed || res.end(cc([delta({ content: ' there.' })]) + cc([delta({}, 'stop')]) + DONE));
      });
    };
    return { handler, up };
  }

  async function start(pHandler: ReturnType<typeof primary>['handler'], qHandler: ReturnType<typeof backup>['handler'], qPools: Record<string, unknown>) {
    const pServer = await startProvider(pHandler);
    const qServer = await startProvider(qHandler);
    const s = await startStack({ config: () => recoveryConfig({ pOrigin: pServer.origin, qOrigin: qServer.origin, qPools }) });
    return { client: new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 }), s };
  }

  const untilHel = async (client: OpenAI) => (await streamUntil(client, 'Hel')).rest;
  const inUseAtQ = (s: Stack) => metricSum(s, 'stormgate_pool_in_use{provider="q"');
  const queuedAtQ = (s: Stack) => metricSum(s, 'stormgate_pool_queue_depth{provider="q"');

  it('does not send a continuation that waited for its slot into the hold-off the continuation before it brought about, and gives that one\'s slot back', async () => {
    const p = primary();
    let answer429!: () => void;
    const q = backup((res) => {
      answer429 = () => {
        res.writeHead(429, { 'content-type': 'application/json', 'retry-after': '30' });
        res.end(JSON.stringify({ error: { message: 'slow down', type: 'rate_limit_error', code: 'rate_limit_exceeded' } }));
      };
    });
    const { client, s } = await start(p.handler, q.handler, { maxConcurrent: 1, classes: { online: { minShare: 0, maxQueue: 100 } } });
    const a = await untilHel(client);
    const b = await untilHel(client);
    const aRest = a();
    const bRest = b();
    p.cut(0);
    await expect.poll(() => q.up.seen, { timeout: PROMPTLY_MS }).toBe(1);
    p.cut(1);
    await expect.poll(() => queuedAtQ(s), { timeout: PROMPTLY_MS }).toBe(1);
    // a's continuation is refused with a 429 and a retry-after: the backup is held off before b's gets the slot.
    answer429();
    const [ra, rb] = await Promise.all([aRest, bRest]);
    for (const r of [ra, rb]) {
      expect(r.text).toBe('Hel');
      expect((r.err as InstanceType<typeof OpenAI.APIError>).code).toBe('stream_interrupted');
    }
    expect(q.up.seen).toBe(1);
    await expect.poll(() => inUseAtQ(s), { timeout: PROMPTLY_MS }).toBe(0);
    expect(await queuedAtQ(s)).toBe(0);
  });

  it("is no retry of the backup's own: its pool's retry cap does not hold continuations back", async () => {
    const p = primary();
    const q = backup();
    const { client, s } = await start(p.handler, q.handler, { maxConcurrent: 4, maxConcurrentRetries: 1 });
    const a = await untilHel(client);
    const b = await untilHel(client);
    const aRest = a();
    const bRest = b();
    p.cut(0);
    p.cut(1);
    await expect.poll(() => q.up.inFlight, { timeout: PROMPTLY_MS }).toBe(2);
    q.up.letGo();
    expect(await aRest).toEqual({ text: 'Hello there.' });
    expect(await bRest).toEqual({ text: 'Hello there.' });
    await expect.poll(() => inUseAtQ(s), { timeout: PROMPTLY_MS }).toBe(0);
  });
});
