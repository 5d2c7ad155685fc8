// streamRecovery: continue sends a continuation through the next target's pool, as any attempt on that target goes:
// it takes a slot of the request's class, waits for one like any attempt (shed when its class queue is full, or when
// no slot can be expected within the idle limit of the stream it continues), holds it for its upstream's life and gives
// it back however it ends. Without a slot, a primary that cut many streams at once sent every continuation to the
// backup at once, past its maxConcurrent: the burst the pools are there to stop.
import { once } from 'node:events';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { createMetrics, type Metrics } from '../src/observability/metrics.ts';
import { cc, delta, DONE } from './helpers/scripted-provider.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { metricSum, useStacks, type Stack } from './helpers/stack.ts';
import { streamUntil } from './helpers/chat-stream.ts';
import { recoveryConfig } from './helpers/recovery-config.ts';

const role = cc([delta({ role: 'assistant', content: '' })]);
const SSE = { 'content-type': 'text/event-stream' };
/** Generous for a loaded two-core machine. */
const PROMPTLY_MS = 5_000;

/** The primary: every stream sends "Hel" and is held open until cut() resets them all (or the `k`th alone, by arrival). */
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
  return { handler, cut: (k?: number) => (k === undefined ? open : [open[k]!]).forEach((res) => res.socket?.destroy()) };
}

/**
 * The backup: each continuation answers "Hello" at once (spliced on after the delivered "Hel"), then " there." once
 * released: after `holdMs`, or when finish() is called. Counts the requests it has open at once.
 */
function backup(holdMs?: number) {
  let finish!: () => void;
  const gate = new Promise<void>((resolve) => (finish = resolve));
  const up = { seen: 0, inFlight: 0, maxInFlight: 0, closed: [] as boolean[], finish, cutAgain: false };
  const handler = (req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on('end', () => {
      const k = up.seen++;
      up.closed[k] = false;
      up.inFlight++;
      up.maxInFlight = Math.max(up.maxInFlight, up.inFlight);
      let over = false;
      const done = () => {
        if (over) return;
        over = true;
        up.inFlight--;
      };
      res.on('close', () => {
        up.closed[k] = true;
        done();
      });
      res.writeHead(200, SSE);
      res.write(role + cc([delta({ content: 'Hello' })]));
      void (holdMs === undefined ? gate : sleep(holdMs)).then(() => {
        if (res.destroyed) return;
        if (up.cutAgain) return void res.socket?.destroy();
        // Counted out before its end reaches the gateway, which only then gives the slot to the next continuation.
        done();
        res.end(cc([delta({ content: ' there.' })]) + cc([delta({}, 'stop')]) + DONE);
      });
    });
  };
  return { handler, up };
}

const until = streamUntil;

const inUseAtQ = (s: Stack) => metricSum(s, 'stormgate_pool_in_use{provider="q"');
const queuedAtQ = (s: Stack) => metricSum(s, 'stormgate_pool_queue_depth{provider="q"');

describe('a streamRecovery continuation takes a slot in the next target\'s pool', () => {
  const startProvider = useFakeProviders();
  const startStack = useStacks();
  // Registered after the stacks' clean-up, so it runs first: a continuation still held would keep the gateway's close waiting.
  let finishHeld: (() => void) | undefined;
  afterEach(() => finishHeld?.());

  /** `pIdleMs`: the idle limit of the primary's streams, which bounds a continuation's wait for a slot. */
  async function start(opts: { holdMs?: number; maxQueue?: number; graceMs?: number; metrics?: Metrics; pIdleMs?: number } = {}) {
    const p = primary();
    const q = backup(opts.holdMs);
    finishHeld = q.up.finish;
    const pServer = await startProvider(p.handler);
    const qServer = await startProvider(q.handler);
    const s = await startStack({
      ...(opts.metrics && { deps: { metrics: opts.metrics } }),
      config: () =>
        recoveryConfig({
          pOrigin: pServer.origin,
          qOrigin: qServer.origin,
          pIdleMs: opts.pIdleMs,
          qPools: { maxConcurrent: 1, classes: { online: { minShare: 0, maxQueue: opts.maxQueue ?? 100 } } },
          ...(opts.graceMs !== undefined && { extra: { drain: { preStopMs: 0, graceMs: opts.graceMs } } }),
        }),
    });
    return { client: new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 }), s, p, q: q.up };
  }

  it('makes a second continuation wait for the first one\'s slot: the backup never has two at once, and both streams complete', async () => {
    const { client, s, p, q } = await start({ holdMs: 300 });
    const a = await until(client, 'Hel');
    const b = await until(client, 'Hel');
    // Both streams cut at once, after their first output.
    p.cut();
    const [ra, rb] = await Promise.all([a.rest(), b.rest()]);
    expect(ra).toEqual({ text: 'Hello there.' });
    expect(rb).toEqual({ text: 'Hello there.' });
    expect(q.seen).toBe(2);
    expect(q.maxInFlight).toBe(1);
    expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="recovered"}')).toBe(2);
    // Both slots given back, and the second continuation's wait counted as the pool's waits are.
    await expect.poll(() => inUseAtQ(s), { timeout: PROMPTLY_MS }).toBe(0);
    expect(await queuedAtQ(s)).toBe(0);
    expect(await metricSum(s, 'stormgate_pool_wait_seconds_count{provider="q",priority="online"}')).toBe(2);
  });

  it('gives the slot back when the continuation is cut too, and lets the next continuation have it', async () => {
    const { client, s, p, q } = await start({ holdMs: 100 });
    q.cutAgain = true;
    const a = await until(client, 'Hel');
    const b = await until(client, 'Hel');
    p.cut();
    const results = await Promise.all([a.rest(), b.rest()]);
    for (const r of results) {
      expect(r.text).toBe('Hello');
      expect((r.err as InstanceType<typeof OpenAI.APIError>).code).toBe('stream_interrupted');
    }
    expect([q.seen, q.maxInFlight]).toEqual([2, 1]);
    await expect.poll(() => inUseAtQ(s), { timeout: PROMPTLY_MS }).toBe(0);
  });

  it('ends a continuation its class queue cannot take with the error event, never a clean end', async () => {
    const { client, s, p, q } = await start({ maxQueue: 0 });
    const a = await until(client, 'Hel');
    const b = await until(client, 'Hel');
    const ended: Array<{ text: string; err?: unknown }> = [];
    const both = Promise.all([a.rest(), b.rest()].map((r) => r.then((x) => (ended.push(x), x))));
    p.cut();
    // One continuation holds q's one slot (q holds its answer); the other is shed at once.
    await expect.poll(() => ended.length, { timeout: PROMPTLY_MS }).toBe(1);
    const shed = ended[0]!;
    expect(shed.text).toBe('Hel');
    expect(shed.err).toBeInstanceOf(OpenAI.APIError);
    expect((shed.err as InstanceType<typeof OpenAI.APIError>).code).toBe('stream_interrupted');
    expect(q.seen).toBe(1);
    expect(await metricSum(s, 'stormgate_shed_total{priority="online",reason="queue_full"}')).toBe(1);
    q.finish();
    await both;
    expect(ended[1]).toEqual({ text: 'Hello there.' });
    expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="cut"}')).toBe(1);
    expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="recovered"}')).toBe(1);
    await expect.poll(() => inUseAtQ(s), { timeout: PROMPTLY_MS }).toBe(0);
  });

  it('ends a continuation that can expect no slot within the broken stream\'s idle limit with the error event, at once', async () => {
    // 1.5 s of silence allowed, less minAttemptMs (1 s): the half second left is less than the wait the pool expects
    // behind one continuation (a second, before any answer is timed).
    const { client, s, p, q } = await start({ pIdleMs: 1_500 });
    const a = await until(client, 'Hel');
    const b = await until(client, 'Hel');
    const aRest = a.rest();
    const bRest = b.rest();
    p.cut(0);
    await expect.poll(() => q.seen, { timeout: PROMPTLY_MS }).toBe(1);
    p.cut(1);
    const shed = await Promise.race([bRest, sleep(PROMPTLY_MS, { text: 'still waiting', err: undefined })]);
    expect(shed.text).toBe('Hel');
    expect((shed.err as InstanceType<typeof OpenAI.APIError>).code).toBe('stream_interrupted');
    expect(await metricSum(s, 'stormgate_shed_total{priority="online",reason="deadline"}')).toBe(1);
    expect(q.seen).toBe(1);
    q.finish();
    expect(await aRest).toEqual({ text: 'Hello there.' });
  });

  it('gives the slot back when the client leaves during the continuation, and when it leaves waiting for the slot', async () => {
    const { client, s, p, q } = await start();
    const a = await until(client, 'Hel');
    const b = await until(client, 'Hel');
    const aRest = a.rest();
    const bEnded = b.rest();
    // a's continuation takes the slot; b's, cut after it, waits for it.
    p.cut(0);
    await expect.poll(() => q.seen, { timeout: PROMPTLY_MS }).toBe(1);
    expect(await inUseAtQ(s)).toBe(1);
    p.cut(1);
    await expect.poll(() => queuedAtQ(s), { timeout: PROMPTLY_MS }).toBe(1);
    b.abort();
    await bEnded;
    await expect.poll(() => queuedAtQ(s), { timeout: PROMPTLY_MS }).toBe(0);
    expect(await inUseAtQ(s)).toBe(1);
    a.abort();
    await aRest;
    await expect.poll(() => inUseAtQ(s), { timeout: PROMPTLY_MS }).toBe(0);
    // a's continuation's upstream request is aborted; b's never went.
    await expect.poll(() => q.closed[0], { timeout: PROMPTLY_MS }).toBe(true);
    expect(q.seen).toBe(1);
    expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="client-gone"}')).toBe(2);
  });

  it('gives the slot back when the shutdown ends the continuation, and ends one waiting for the slot with the shutdown\'s error event', async () => {
    const metrics = createMetrics({ defaultMetrics: false });
    const { client, s, p, q } = await start({ graceMs: 300, metrics });
    const a = await until(client, 'Hel');
    const b = await until(client, 'Hel');
    const ended = Promise.all([a.rest(), b.rest()]);
    p.cut();
    await expect.poll(() => queuedAtQ(s), { timeout: PROMPTLY_MS }).toBe(1);
    await expect.poll(() => q.seen, { timeout: PROMPTLY_MS }).toBe(1);
    expect(await inUseAtQ(s)).toBe(1);
    const serverClosed = once(s.gateway.server, 'close');
    await s.gateway.drain();
    const results = await Promise.race([ended, sleep(PROMPTLY_MS, 'still streaming' as const)]);
    expect(results).not.toBe('still streaming');
    for (const r of results as Array<{ text: string; err?: unknown }>) {
      expect(r.err).toBeInstanceOf(OpenAI.APIError);
      expect((r.err as InstanceType<typeof OpenAI.APIError>).code).toBe('stream_interrupted');
      expect((r.err as InstanceType<typeof OpenAI.APIError>).message).toContain('the gateway instance is shutting down');
    }
    await Promise.race([serverClosed, sleep(PROMPTLY_MS)]);
    // /metrics went with the server: the gauges are read from the registry it filled.
    await expect.poll(async () => gauge(metrics, 'poolInUse'), { timeout: PROMPTLY_MS }).toBe(0);
    expect(await gauge(metrics, 'poolQueueDepth')).toBe(0);
    await expect.poll(() => q.closed[0], { timeout: PROMPTLY_MS }).toBe(true);
    expect(q.seen).toBe(1);
  });
});

/** The sum of q's series of a pool gauge, collected as a scrape would. */
async function gauge(metrics: Metrics, name: 'poolInUse' | 'poolQueueDepth'): Promise<number> {
  metrics.collectPools();
  const { values } = await metrics[name].get();
  return values.filter((v) => v.labels.provider === 'q').reduce((sum, v) => sum + v.value, 0);
}
