// Review of the parking lot and client limits (2026-12-05): bugs found by reading the code against the README, each
// with the test that failed before its fix. Both are the same gap in serve-targets.ts: a request parked for a route's
// only target whose wait ran out was answered for what held the target when it parked, not when it was answered:
// - its hold-off over and the request waiting behind the release at the target's limit, it was told
//   `429 provider_held_off` "for another 1 s" (x-should-retry: true) where the README promises a load_shed;
// - the breaker reopened after a failed probe, it was told `retry-after-ms: 100` (the first probe's time, long past)
//   where the next probe was a second away.
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import { askFirstThenParked } from './helpers/held-off-backup.ts';
import { useExtraMocks, useGateways } from './helpers/stack.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();

describe('a request parked on a route\'s only target whose wait runs out behind the release after the target came back', () => {
  it('is shed (load_shed, max_wait), not told the hold-off that has ended', { timeout: 40_000 }, async () => {
    // The provider asks once for a 1 s pause, then answers one request at a time, 2 s each.
    const primary = await startMock({ faults: { latencyMs: 2_000, errors: [{ status: 429, times: 1, headers: { 'retry-after': '1' } }] } });
    const yaml = `
server: { host: 127.0.0.1, port: 0 }
providers:
  primary: { family: openai, baseUrl: "${primary.url}/v1", apiKey: sk-primary, pools: { maxConcurrent: 1 } }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: primary } ]
    retry: { maxAttempts: 1, maxWaitHintMs: 60000 }
    park: { maxWaitMs: 1500 }
`;
    const url = await startGateway(parseConfig(yaml, 'review.yaml', {}));
    const answers = await askFirstThenParked(url);
    // None is told the provider holds requests off: the hold-off ended a second in, and what held the later ones back
    // was the release at the provider's limit.
    for (const a of answers.slice(1)) expect(a.code).not.toBe('provider_held_off');
    const shed = answers.filter((a) => a.code === 'load_shed');
    expect(shed.length).toBeGreaterThan(0);
    for (const a of shed) {
      expect(a.status).toBe(503);
      expect(a.message).toContain('park.maxWaitMs');
    }
    const metrics = await (await fetch(`${url}/metrics`)).text();
    expect(metrics).toMatch(new RegExp(`^stormgate_shed_total\\{priority="online",reason="max_wait"\\} ${shed.length}$`, 'm'));
  });
});

describe("a request parked for a route's only target whose breaker reopened after a failed probe", () => {
  it('is told the next probe time when its wait runs out, not the first one it parked with', { timeout: 40_000 }, async () => {
    const provider = await startMock({ faults: { errors: [{ status: 500, rate: 1 }] } });
    const yaml = `
server: { host: 127.0.0.1, port: 0 }
providers:
  p:
    family: openai
    baseUrl: "${provider.url}/v1"
    apiKey: sk-p
    breaker: { consecutiveFailures: 1, openS: 30, probeWhileParkedMs: 1000, probeWhileParkedMaxMs: 5000 }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: p } ]
    retry: { maxAttempts: 1 }
    park: { maxWaitMs: 2000 }
`;
    const url = await startGateway(parseConfig(yaml, 'review.yaml', {}));
    const ask = () =>
      fetch(`${url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-stormgate-timeout-ms': '25000' },
        body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
      }).then(async (res) => ({ status: res.status, retryAfterMs: Number(res.headers.get('retry-after-ms')), code: ((await res.json()) as { error?: { code?: string } }).error?.code, atMs: Date.now() }));
    // Its 500 opens the breaker.
    expect((await ask()).status).toBe(500);
    const t0 = Date.now();
    // Both park: the first carries the probe at 1 s, which fails (the breaker reopens, its next probe 2 s on); the
    // second, still parked, runs out of park.maxWaitMs at 2 s, a second before that next probe.
    const carrier = ask();
    await sleep(50);
    const waiter = await ask();
    await carrier;
    expect(waiter.code).toBe('circuit_open');
    expect(waiter.atMs - t0).toBeGreaterThan(1_800);
    // The next probe is at about 3 s: told the first probe's time (1 s, long past), it was told 100 ms.
    expect(waiter.retryAfterMs).toBeGreaterThan(500);
  });
});
