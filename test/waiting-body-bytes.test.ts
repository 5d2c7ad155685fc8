// The bytes of request bodies held by waiting requests (queued for a pool slot, or parked) are bounded across the
// instance: a batch flood of long prompts, queued behind a slow provider, held 2-3 times its bodies' size in memory and
// took the process past its heap limit, every online request dying with it. Past the cap newcomers are shed, and batch
// fills only half of it, so online requests still queue.
import { describe, expect, it, vi } from 'vitest';
import { metricSum, recordingClient, TEST_KEY, useStacks, type Stack } from './helpers/stack.ts';
import { ProviderPool, type SlotRequest } from '../src/pools/provider-pool.ts';
import { WaitingBodies } from '../src/pools/waiting-bodies.ts';
import { ParkingLot } from '../src/pipeline/parking-lot.ts';

const start = useStacks({ provider: { breaker: false } });
const flush = () => new Promise((r) => setImmediate(r));

/** A chat request whose body is about 100 KB (a long prompt). */
const LONG = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'x'.repeat(100_000) }] };

async function queued(s: Stack, priority: string, n: number): Promise<void> {
  await vi.waitFor(async () => expect(await metricSum(s, `stormgate_pool_queue_depth{provider="mock",priority="${priority}"}`)).toBe(n), { timeout: 5_000, interval: 20 });
}

describe('the bytes of waiting request bodies', () => {
  it('sheds the newcomer past the cap (batch at half of it) with load_shed and x-should-retry: true, while online still queues', async () => {
    // One slot, held by a request the provider never answers: everything after it waits.
    const g = await start({
      faults: { hangRate: 1 },
      config: (mockUrl) => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info', maxWaitingBodyBytes: 450_000 },
        providers: { mock: { family: 'openai', baseUrl: `${mockUrl}/v1`, apiKey: TEST_KEY, maxConnections: 1, breaker: false } },
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }], park: false }],
      }),
    });
    const { client, seen } = recordingClient(g, { maxRetries: 0 });
    const stop = new AbortController();
    const call = (priority: 'online' | 'batch') =>
      client.chat.completions
        .create(LONG, { headers: { 'x-stormgate-priority': priority }, timeout: 30_000, signal: stop.signal })
        .then(() => 200, (e: { status?: number }) => e.status ?? 'aborted');
    const pending = [call('online')];
    await vi.waitFor(() => expect(g.mock.requests().length).toBe(1), { timeout: 5_000, interval: 20 });
    try {
      // Batch: two bodies of 100 KB wait (half of 450 KB holds two), the third is shed, in batch's way: 429.
      pending.push(call('batch'), call('batch'));
      await queued(g, 'batch', 2);
      expect(await call('batch')).toBe(429);
      expect(seen.at(-1)).toMatchObject({ status: 429, code: 'load_shed', shouldRetry: 'true' });
      // Online has the other half: two more wait, and the one past the whole cap is shed (503).
      pending.push(call('online'), call('online'));
      await queued(g, 'online', 2);
      expect(await call('online')).toBe(503);
      expect(seen.at(-1)).toMatchObject({ status: 503, code: 'load_shed', shouldRetry: 'true' });
      expect(await metricSum(g, 'stormgate_shed_total{priority="batch",reason="body_bytes"}')).toBe(1);
      expect(await metricSum(g, 'stormgate_shed_total{priority="online",reason="body_bytes"}')).toBe(1);
      // Four bodies wait: the gauge an operator watches against the cap says so.
      const waiting = await metricSum(g, 'stormgate_waiting_body_bytes');
      expect(waiting).toBeGreaterThan(4 * 100_000);
      expect(waiting).toBeLessThanOrEqual(450_000);
    } finally {
      stop.abort();
      await Promise.all(pending);
    }
    await vi.waitFor(async () => expect(await metricSum(g, 'stormgate_waiting_body_bytes')).toBe(0), { timeout: 5_000, interval: 20 });
  });

  it('counts the body of a repeat waiting for its idempotency key\'s run, and answers one past half the cap 409 idempotency_key_in_progress with x-should-retry: true', async () => {
    // Nothing else bounds how many repeats wait on one run: 2,500 agents repeating one key with 300 KB bodies, behind a
    // hanging provider, took a 512 MB heap past its limit while the gauge said no body waited.
    const g = await start({
      faults: { hangRate: 1 },
      config: (mockUrl) => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info', maxWaitingBodyBytes: 450_000 },
        providers: { mock: { family: 'openai', baseUrl: `${mockUrl}/v1`, apiKey: TEST_KEY, maxConnections: 1, breaker: false } },
        // The run ends (upstream_timeout) soon after the test, and the stack's close with it.
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }], park: false, timeoutMs: 8_000 }],
      }),
    });
    const { client, seen } = recordingClient(g, { maxRetries: 0 });
    const stop = new AbortController();
    const call = () =>
      client.chat.completions
        .create(LONG, { headers: { 'Idempotency-Key': 'agent-call-1' }, timeout: 30_000, signal: stop.signal })
        .then(() => 200, (e: { status?: number }) => e.status ?? 'aborted');
    // The run: in flight (the provider never answers), not waiting.
    const pending = [call()];
    await vi.waitFor(() => expect(g.mock.requests().length).toBe(1), { timeout: 5_000, interval: 20 });
    try {
      // Repeats fill the half a batch does (225 KB: two bodies of 100 KB); the third is told to come back for the answer.
      pending.push(call(), call());
      await vi.waitFor(async () => expect(await metricSum(g, 'stormgate_waiting_body_bytes')).toBeGreaterThan(2 * 100_000), { timeout: 5_000, interval: 20 });
      const refused = await client.chat.completions.create(LONG, { headers: { 'Idempotency-Key': 'agent-call-1' }, timeout: 30_000 }).catch((e: Error) => e);
      expect(refused).toMatchObject({ status: 409, message: expect.stringContaining('server.maxWaitingBodyBytes') });
      expect(seen.at(-1)).toMatchObject({ status: 409, code: 'idempotency_key_in_progress', shouldRetry: 'true' });
      expect(g.mock.requests()).toHaveLength(1);
    } finally {
      stop.abort();
      await Promise.all(pending);
    }
    // Their clients gone, the repeats stop waiting and give their bytes back.
    await vi.waitFor(async () => expect(await metricSum(g, 'stormgate_waiting_body_bytes')).toBe(0), { timeout: 5_000, interval: 20 });
  });

  it('gives a waiter\'s bytes back when it gets its slot or leaves, and counts a request the parking lot released without shedding it', async () => {
    const bodies = new WaitingBodies(300);
    const pool = new ProviderPool({ provider: 'p', capacity: 1, retryCapacity: 1, classes: [{ name: 'online', minShare: 0.5, maxQueue: 100 }, { name: 'batch', minShare: 0.1, maxQueue: 100 }], decrease: 0.9, minLimit: 1 }, () => 0, {}, bodies);
    const req = (cls: number, extra: Partial<SlotRequest> = {}): SlotRequest => ({ cls, target: 'p/m', retry: false, deadlineAtMs: 600_000, minAttemptMs: 0, signal: new AbortController().signal, bodyBytes: 100, ...extra });
    const held = await pool.acquire(req(0));
    if (!held.ok) throw new Error('no slot');
    // In flight: not waiting, not counted.
    expect(bodies.bytes).toBe(0);
    const gone = new AbortController();
    const first = pool.acquire(req(1, { signal: gone.signal }));
    void pool.acquire(req(0));
    expect(bodies.bytes).toBe(200);
    // Batch may fill half (150): a second batch body does not fit; online fills the rest.
    expect(await pool.acquire(req(1))).toMatchObject({ ok: false, reason: 'body_bytes' });
    void pool.acquire(req(0));
    expect(await pool.acquire(req(0))).toMatchObject({ ok: false, reason: 'body_bytes' });
    // Released from the parking lot: admitted when it parked, it waits over the cap.
    void pool.acquire(req(0, { released: true }));
    expect(bodies.bytes).toBe(400);
    gone.abort();
    expect(await first).toMatchObject({ ok: false, reason: 'aborted' });
    expect(bodies.bytes).toBe(300);
    held.slot.release();
    await flush();
    expect(bodies.bytes).toBe(200);
  });

  it('answers a request that would park past the cap as a full queue, and gives a parked one\'s bytes back when it leaves', async () => {
    const bodies = new WaitingBodies(300);
    const lot = new ParkingLot({ now: () => Date.now(), random: () => 0, stateOf: () => ({ mode: 'blocked', availableAtMs: Date.now() + 60_000 }), bodies });
    const opts = (signal: AbortSignal, extra = {}) => ({ route: 'chat', deadlineAtMs: Date.now() + 60_000, signal, maxQueue: 100, maxWaitMs: undefined, minAttemptMs: 0, bodyBytes: 100, ...extra });
    const left = new AbortController();
    const parked = lot.park('t', opts(left.signal));
    expect(bodies.bytes).toBe(100);
    // Batch fills half the cap (150): a second body does not fit; online fills the rest.
    expect(await lot.park('t', opts(new AbortController().signal, { lowestClass: true }))).toEqual({ kind: 'full' });
    void lot.park('t', opts(new AbortController().signal));
    void lot.park('t', opts(new AbortController().signal));
    expect(bodies.bytes).toBe(300);
    expect(await lot.park('t', opts(new AbortController().signal))).toEqual({ kind: 'full' });
    left.abort();
    expect(await parked).toEqual({ kind: 'aborted' });
    expect(bodies.bytes).toBe(200);
    lot.close();
    expect(bodies.bytes).toBe(0);
  });
});
