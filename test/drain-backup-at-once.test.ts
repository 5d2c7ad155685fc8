// SIGTERM while a request sleeps in a retry backoff on its primary target, its route having a backup target. The
// drain's grace end is a deadline for the retry (the one wait rule, target-attempts.ts graceHolds): a backoff that
// began before SIGTERM used to be weighed against it only once it was over, so the request slept out the whole
// backoff and only then went to the backup (which answered at once), wasting the grace it had left. The drain's start
// now wakes it: a wait whose retry no longer fits before the grace end moves to the backup at once; one that fits
// keeps its plan. A request with no backup gets the drain's 503 gateway_draining at once (it used to wait the backoff
// out for it, and hold the instance's exit), told to come back when its wait would have ended; without a drain nothing
// changes.
// Real HTTP: a primary of the test's own (503 once, then answers), the bundled mock as the backup, drain() as SIGTERM.
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { ask, busyOnceThen } from './helpers/one-provider.ts';
import { TEST_KEY, useStacks } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();

const BACKOFF_MS = 3_000;

/**
 * A chat route on the primary p (at `origin`), then the bundled mock as its backup when `backup`: no parking, no
 * breaker, two attempts with a fixed backoff of BACKOFF_MS, minAttemptMs 1 s. The drain: preStopMs 500, graceMs
 * `graceMs`.
 */
function config(origin: string, o: { backup: boolean; graceMs: number; backoffMs?: number }) {
  return (mockUrl: string): ConfigInput => ({
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
    providers: {
      p: { family: 'openai', baseUrl: `${origin}/v1`, apiKey: 'p-key-0123456789', breaker: false },
      backup: { family: 'openai', baseUrl: `${mockUrl}/v1`, apiKey: TEST_KEY, breaker: false },
    },
    routes: [
      {
        name: 'chat',
        match: { path: '/v1/chat/completions' },
        targets: o.backup ? [{ provider: 'p' }, { provider: 'backup' }] : [{ provider: 'p' }],
        park: false,
        minAttemptMs: 1_000,
        retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: o.backoffMs ?? BACKOFF_MS, capMs: o.backoffMs ?? BACKOFF_MS } },
      },
    ],
    drain: { preStopMs: 500, graceMs: o.graceMs },
  });
}

describe('SIGTERM while a request sleeps in a backoff on its primary, with a backup target', () => {
  it('sends it to the backup as the drain begins when its retry would not fit the grace left: answered long before the backoff is over', async () => {
    // p's 503 at 0, a 3 s backoff to 3 s; the drain at 300 ms, the grace end at 3.8 s: 800 ms after the wait, less
    // than minAttemptMs. Before, the request slept to 3 s and then went to the backup.
    const p = await startProvider(busyOnceThen());
    const s = await startStack({ config: config(p.origin, { backup: true, graceMs: 3_000 }) });
    const startedAt = Date.now();
    const answer = ask(s.url);
    await sleep(300);
    const drained = s.gateway.drain();
    expect(await answer).toMatchObject({ status: 200 });
    expect(Date.now() - startedAt).toBeLessThan(BACKOFF_MS - 1_000);
    expect(p.hits()).toBe(1);
    expect(s.mock.requests()).toHaveLength(1);
    await drained;
  });

  it('with a grace period shorter than the backoff, is answered by the backup, not cut at the grace end with 503 gateway_draining', async () => {
    // The grace end at 1.3 s, inside the 3 s backoff: before, the grace end cut the wait and the client got 503
    // gateway_draining, its backup never tried.
    const p = await startProvider(busyOnceThen());
    const s = await startStack({ config: config(p.origin, { backup: true, graceMs: 500 }) });
    const answer = ask(s.url);
    await sleep(300);
    const drained = s.gateway.drain();
    expect(await answer).toMatchObject({ status: 200 });
    expect(p.hits()).toBe(1);
    expect(s.mock.requests()).toHaveLength(1);
    await drained;
  });

  it('keeps its plan when its retry fits the grace left: the primary is retried once the backoff is over', async () => {
    // A 1.5 s backoff, the drain at 300 ms, the grace end at 5.8 s: the retry and minAttemptMs fit well before it.
    const p = await startProvider(busyOnceThen());
    const s = await startStack({ config: config(p.origin, { backup: true, graceMs: 5_000, backoffMs: 1_500 }) });
    const startedAt = Date.now();
    const answer = ask(s.url);
    await sleep(300);
    const drained = s.gateway.drain();
    expect(await answer).toMatchObject({ status: 200 });
    expect(Date.now() - startedAt).toBeGreaterThanOrEqual(1_400);
    expect(p.hits()).toBe(2);
    expect(s.mock.requests()).toHaveLength(0);
    await drained;
  });
});

describe('SIGTERM while a request sleeps in a backoff on its only target', () => {
  it('is answered 503 gateway_draining as the drain begins, told to come back when its wait would have ended', async () => {
    // The same timing as the backup case: the wait ends at 3 s with 800 ms of grace left, less than minAttemptMs.
    // Before, the request slept to 3 s for the same 503 (with the one second floor as retry-after).
    const p = await startProvider(busyOnceThen());
    const s = await startStack({ config: config(p.origin, { backup: false, graceMs: 3_000 }) });
    const startedAt = Date.now();
    const answer = ask(s.url);
    await sleep(300);
    const drained = s.gateway.drain();
    const got = await answer;
    expect(Date.now() - startedAt).toBeLessThan(BACKOFF_MS - 1_000);
    expect(got).toMatchObject({ status: 503, code: 'gateway_draining' });
    // About 2.7 s: the backoff's 3 s less the 300 ms slept before the drain.
    expect(got.retryAfterMs).toBeGreaterThan(1_500);
    expect(got.retryAfterMs).toBeLessThanOrEqual(BACKOFF_MS);
    expect(p.hits()).toBe(1);
    await drained;
  });
});

describe('a backoff on the primary, with a backup target, and no drain', () => {
  it('is slept out and the primary retried, as ever', async () => {
    const p = await startProvider(busyOnceThen());
    const s = await startStack({ config: config(p.origin, { backup: true, graceMs: 3_000 }) });
    const startedAt = Date.now();
    expect(await ask(s.url)).toMatchObject({ status: 200 });
    expect(Date.now() - startedAt).toBeGreaterThanOrEqual(BACKOFF_MS - 100);
    expect(p.hits()).toBe(2);
    expect(s.mock.requests()).toHaveLength(0);
  });
});
