// Ghost requests: nothing may reach a provider once the request's deadline has passed, even when the event loop is so
// busy that the deadline's timer (and a parked request's cut-off timer) have not run yet. An upstream answer is handled
// in an I/O callback; what it leads to in that callback (a breaker change that releases parked requests, a failover to
// the next target) runs as one promise chain to undici, which writes on an idle keep-alive socket in the check phase
// of the same turn of the loop: before any timer can fire. Only the clock can tell such a request that its time is up.
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { createMetrics, type Metrics } from '../src/observability/metrics.ts';
import { CONSECUTIVE_QUIET_MS } from '../src/policy/breaker.ts';
import { defaultConfig, TEST_KEY, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';

const start = useStacks();
const startBackup = useExtraMocks();

function chat(s: Stack, id: string, timeoutMs: number) {
  return fetch(`${s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-stormgate-timeout-ms': String(timeoutMs), 'x-stainless-test-id': id },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
  }).then(async (res) => ({ status: res.status, body: (await res.json()) as { error?: { code: string } } }));
}

/**
 * Metrics whose upstream-attempt count, once armed, busy-waits `ms` on the next attempt of `statusClass`: the gateway's
 * event loop does nothing else meanwhile, timers included (a stand-in for an instance loaded by a release burst). The
 * count is taken in the attempt's own I/O callback, before the breaker hears of it.
 */
function stallingMetrics(statusClass: string, ms: number): { metrics: Metrics; arm: () => void } {
  const metrics = createMetrics({ defaultMetrics: false });
  let armed = false;
  const inc = metrics.upstreamAttempts.inc.bind(metrics.upstreamAttempts);
  metrics.upstreamAttempts.inc = ((labels: { status_class?: string }, value?: number) => {
    if (armed && labels?.status_class === statusClass) {
      armed = false;
      const until = Date.now() + ms;
      while (Date.now() < until);
    }
    return inc(labels as never, value);
  }) as typeof metrics.upstreamAttempts.inc;
  return { metrics, arm: () => (armed = true) };
}

/** The requests a mock received for one test id, as ms past the given deadline. */
function receivedAfter(requests: ReturnType<Stack['mock']['requests']>, id: string, deadlineAtMs: number) {
  return requests.filter((r) => r.headers['x-stainless-test-id'] === id && r.receivedAt > deadlineAtMs).map((r) => ({ afterDeadlineMs: r.receivedAt - deadlineAtMs }));
}

describe('a request whose deadline passes while the event loop is busy', () => {
  it('is not sent upstream when a probe\'s answer releases it from the park after its deadline', async () => {
    const { metrics, arm } = stallingMetrics('2xx', 2_500);
    const s = await start({
      faults: { latencyMs: 100 },
      provider: { breaker: { consecutiveFailures: 1, openS: 30, probeWhileParkedMs: 200 } },
      route: { retry: { maxAttempts: 1 } },
      deps: { metrics },
    });
    // Idle keep-alive connections to the provider, as on any instance with traffic.
    await Promise.all(['a', 'b', 'c', 'd'].map((id) => chat(s, `warm-${id}`, 10_000)));
    s.mock.setFaults({ latencyMs: 300, errors: [{ status: 503, times: 1 }] });
    // One 503 opens the breaker, once no success has come for CONSECUTIVE_QUIET_MS (a run of failures among successes does not).
    await sleep(CONSECUTIVE_QUIET_MS);
    expect((await chat(s, 'opener', 10_000)).status).toBe(503);
    // A patient request parks and, 200 ms later, lends the breaker its probe (300 ms at the provider).
    const patient = chat(s, 'patient', 20_000);
    await sleep(250);
    arm();
    // A request with a 2.25 s deadline parks behind the probe's permit (its cut-off 1.25 s from now).
    const sentAt = Date.now();
    const hurried = chat(s, 'hurried', 2_500);
    expect((await patient).status).toBe(200);
    const answer = await hurried;
    await sleep(100);
    // Before the fix the provider received it about half a second after its deadline (the probe's success released it
    // in the stalled callback; the deadline's timer aborted it a moment later). It leaves the park at its cut-off now.
    expect(receivedAfter(s.mock.requests(), 'hurried', sentAt + 2_250)).toEqual([]);
    expect(answer.status).toBe(503);
    expect(answer.body.error?.code).toBe('circuit_open');
  });

  it('is not sent to the next target when the failure that hands it over is handled after its deadline', async () => {
    const { metrics, arm } = stallingMetrics('5xx', 2_000);
    const backup = await startBackup({ quiet: true, apiKey: 'backup-key' });
    const s = await start({
      faults: { errors: [{ status: 503, rate: 1 }] },
      config: (url) => {
        const base = defaultConfig(url, { provider: { breaker: false }, route: { retry: { maxAttempts: 1 }, park: false } });
        return {
          ...base,
          providers: {
            mock: { family: 'openai', baseUrl: `${url}/v1`, apiKey: TEST_KEY, breaker: false },
            backup: { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: 'backup-key', breaker: false },
          },
          routes: base.routes.map((r) => (r.name === 'chat' ? { ...r, targets: [{ provider: 'mock' }, { provider: 'backup' }] } : r)),
        };
      },
      deps: { metrics },
    });
    // Idle keep-alive connections to both providers: every request fails over from the primary's 503 to the backup.
    await Promise.all(['a', 'b', 'c', 'd'].map((id) => chat(s, `warm-${id}`, 10_000)));
    arm();
    // Deadline 1.5 s; the primary's 503 is handled 2 s late.
    const sentAt = Date.now();
    const answer = await chat(s, 'late', 1_750);
    await sleep(100);
    expect(receivedAfter(backup.requests(), 'late', sentAt + 1_500)).toEqual([]);
    expect(answer.status).toBe(504);
    expect(answer.body.error?.code).toBe('deadline_exceeded');
    // Nothing went to the backup: neither the request's log line nor the upstream-attempt count may say it did.
    const line = s.logs.map((l) => JSON.parse(l) as { attempts?: Array<{ target: string }> }).filter((l) => Array.isArray(l.attempts)).at(-1)!;
    expect(line.attempts!.map((a) => a.target)).toEqual(['mock/gpt-4o']);
    const text = await (await fetch(`${s.url}/metrics`)).text();
    expect(text.split('\n').filter((l) => l.startsWith('stormgate_upstream_attempts_total') && l.includes('backup') && l.includes('aborted') && !l.endsWith(' 0'))).toEqual([]);
  });
});
