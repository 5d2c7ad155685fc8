// Deadlines and client disconnects over real HTTP: no attempt after the deadline, no ghost requests.
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { measureLoopLag } from './helpers/loop-lag.ts';
import { RETRY_LOOP_ONLY, useStacks, type Stack } from './helpers/stack.ts';

const start = useStacks(RETRY_LOOP_ONLY);


function post(s: Stack, headers: Record<string, string> = {}, signal?: AbortSignal, body: Record<string, unknown> = {}) {
  return fetch(`${s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], ...body }),
    signal,
  });
}

async function until(check: () => boolean, timeoutMs = 3_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > end) throw new Error('condition not met in time');
    await sleep(10);
  }
}

describe('deadlines', () => {
  it('answers 504 deadline_exceeded with x-should-retry: false at the client deadline and aborts the upstream request', async () => {
    const s = await start({ faults: { hangRate: 1 } });
    const lag = measureLoopLag();
    const started = Date.now();
    const res = await post(s, { 'x-stormgate-timeout-ms': '2000' });
    const elapsed = Date.now() - started;
    lag.stop();
    const body = (await res.json()) as { error: { code: string } };
    expect(res.status).toBe(504);
    expect(body.error.code).toBe('deadline_exceeded');
    expect(res.headers.get('x-should-retry')).toBe('false');
    // Budget = 2000 - max(250, 5%) = 1750 ms: the gateway answers before the client gives up (the upper bound leaves
    // room for a loaded 2-core machine's event-loop lag). That machine also stalls this process, the gateway's with it,
    // for up to a second: 2.9 s by the wall clock, with the gateway's timer on time by its loop. Stalls are left out.
    expect(elapsed).toBeGreaterThanOrEqual(1_700);
    expect(elapsed - lag.lateMs()).toBeLessThan(2_300);
    await until(() => s.mock.requests()[0]?.aborted === true);
    expect(s.mock.stats().total).toBe(1);
  });

  it('reads the SDK timeout header (x-stainless-timeout) as the client deadline', async () => {
    const s = await start({ faults: { hangRate: 1 } });
    const lag = measureLoopLag();
    const started = Date.now();
    const res = await post(s, { 'x-stainless-timeout': '1' });
    expect(res.status).toBe(504);
    expect(Date.now() - started - lag.lateMs()).toBeLessThan(1_000);
    lag.stop();
  });

  it('sends no request to the upstream after the deadline, and no retry whose wait would cross it', async () => {
    const s = await start({
      faults: { latencyMs: 150, errors: [{ status: 503, rate: 1 }] },
      // A wide margin: the gateway's deadline is 900 ms into the client's 1500, so a loaded test machine's event-loop
      // lag cannot carry an answer past the client's timeout or an attempt past the deadline.
      route: { retry: { maxAttempts: 10, backoff: { strategy: 'full-jitter', baseMs: 100, capMs: 400 } }, minAttemptMs: 200, deadlineMarginMs: 600 },
    });
    const lag = measureLoopLag();
    const started = Date.now();
    const res = await post(s, { 'x-stormgate-timeout-ms': '1500' });
    const answeredAt = Date.now();
    lag.stop();
    // Stalls of this process (the gateway's and the mock's with it) are left out of the wall-clock bounds.
    const lateMs = lag.lateMs();
    expect(res.status).toBe(503);
    expect(answeredAt - started - lateMs).toBeLessThan(1_500);
    const requests = s.mock.requests();
    expect(requests.length).toBeGreaterThanOrEqual(2);
    expect(requests.length).toBeLessThan(10);
    // No attempt starts within minAttemptMs of the deadline (900 ms): none reaches the mock after it, lag included.
    for (const r of requests) expect(r.receivedAt - lateMs).toBeLessThanOrEqual(started + 900);
    // Nothing arrives later either.
    const count = requests.length;
    await sleep(400);
    expect(s.mock.stats().total).toBe(count);
  });

  it('keeps the route timeout when the client asks for more time', async () => {
    const s = await start({ faults: { hangRate: 1 }, route: { timeoutMs: 800 } });
    const res = await post(s, { 'x-stormgate-timeout-ms': '60000', 'x-stainless-timeout': '600' });
    expect(res.status).toBe(504);
  });

  it('bounds a non-streaming attempt by responseMs and retries it as a timeout', async () => {
    const s = await start({
      faults: { latencyMs: 600 },
      provider: { timeouts: { responseMs: 200 } },
      route: { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 10, capMs: 10 } } },
    });
    const res = await post(s);
    const body = (await res.json()) as { error: { code: string; message: string } };
    expect(res.status).toBe(504);
    expect(body.error.code).toBe('upstream_timeout');
    expect(s.mock.stats().total).toBe(2);
  });
});

describe('client disconnects', () => {
  it('aborts the in-flight upstream request and makes no further attempt', async () => {
    const s = await start({ faults: { hangRate: 1 } });
    const ctl = new AbortController();
    const pending = post(s, {}, ctl.signal).catch((e: unknown) => e);
    await until(() => s.mock.stats().total === 1);
    ctl.abort();
    await pending;
    await until(() => s.mock.requests()[0]?.aborted === true);
    await sleep(300);
    expect(s.mock.stats().total).toBe(1);
  });

  it('cancels a backoff wait at once when the client goes away', async () => {
    const s = await start({
      faults: { errors: [{ status: 503, rate: 1 }] },
      route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 1_500, capMs: 1_500 } } },
    });
    const ctl = new AbortController();
    const pending = post(s, {}, ctl.signal).catch((e: unknown) => e);
    await until(() => s.mock.stats().total === 1);
    await sleep(50);
    ctl.abort();
    await pending;
    await sleep(1_800);
    expect(s.mock.stats().total).toBe(1);
  });

  it('aborts the upstream stream when the client leaves mid-stream', async () => {
    const s = await start({ faults: { stream: { chunks: 50, chunkDelayMs: 50 } } });
    const ctl = new AbortController();
    const res = await post(s, {}, ctl.signal, { stream: true });
    const reader = res.body!.getReader();
    await reader.read();
    ctl.abort();
    await until(() => s.mock.requests()[0]?.aborted === true);
    expect(s.mock.requests()[0]!.chunksSent ?? 0).toBeLessThan(50);
  });
});
