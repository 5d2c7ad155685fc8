// Mutants of 2026-12-04's later changes that the other tests let live: the hold-off start lines write nothing once
// closed (a start after close opened a window, and a timer, no one would report) and their repeated line's `until` is
// the latest end of the hold-offs it counts; a request's log line never names a target both as attempted and as
// passed over (serve-targets.ts: a target it was sent to is not "at capacity", nor "held off", a primary it parked for
// and was then served by included); the mock's fault spec refuses a field named like an object's own (`constructor`); the start-up line of a gateway whose Redis is not there names it, without its password.
import { createServer } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import pino from 'pino';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import { HOLD_OFF_LOG_WINDOW_MS, HoldOffLog } from '../src/observability/hold-off-log.ts';
import type { HoldStart } from '../src/state/hold-offs.ts';
import { assertFaultSpec } from '../src/mock/faults.ts';
import { heldOffBackupStack } from './helpers/held-off-backup.ts';
import { testLogSink, useExtraMocks, useGateways } from './helpers/stack.ts';
import { TEST_SECRETS } from './helpers/test-secrets.ts';

const T = 1_700_000_000_000;

function logged() {
  const raw: string[] = [];
  const log = new HoldOffLog(pino({ level: 'debug' }, testLogSink(raw)), () => Date.now());
  return { log, lines: () => raw.map((l) => JSON.parse(l) as Record<string, unknown>) };
}

const start = (target: string, hintMs: number): HoldStart => ({
  kind: 'hold-off', target, untilMs: Date.now() + hintMs, reason: 'status_429', status: 429, hintMs,
});

describe('the hold-off start lines, closed and counted', () => {
  beforeEach(() => vi.useFakeTimers({ now: T }));
  afterEach(() => vi.useRealTimers());

  it('writes nothing for a start after close, and leaves no timer behind', () => {
    const { log, lines } = logged();
    log.close();
    log.started(start('p/m', 300));
    log.started(start('p/m', 300));
    expect(lines()).toEqual([]);
    expect(vi.getTimerCount()).toBe(0);
  });

  it("says until the latest end of the hold-offs it counts, not the window's opening", () => {
    const { log, lines } = logged();
    log.started(start('p/m', 300));
    vi.advanceTimersByTime(1_000);
    log.started(start('p/m', 5_000)); // ends at T + 6 s
    vi.advanceTimersByTime(1_000);
    log.started(start('p/m', 300)); // ends sooner: the line still says T + 6 s
    vi.advanceTimersByTime(HOLD_OFF_LOG_WINDOW_MS);
    const again = lines().filter((l) => l.starts !== undefined);
    expect(again).toEqual([expect.objectContaining({ starts: 2, until: new Date(T + 6_000).toISOString(), longestRetryAfterMs: 5_000 })]);
  });
});

const startGateway = useGateways();
const startMock = useExtraMocks();

describe('the log line of requests parked behind the release after a hold-off', () => {
  it('never names a target both as attempted and as passed over', { timeout: 60_000 }, async () => {
    // As park-max-wait-release.test.ts: the primary asks once for a 1 s pause then answers one at a time, 1 s each; the
    // backup stays held off. Requests parked at different moments end every way: served after parking, shed.
    const { url, logs } = await heldOffBackupStack(startMock, startGateway, { latencyMs: 1_000, maxAttempts: 2 });
    const ask = (timeoutMs = 10_000) =>
      fetch(`${url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-stormgate-timeout-ms': String(timeoutMs) },
        body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
      }).then((res) => res.arrayBuffer().then(() => res.status));
    // The first is sent to both (the primary's 429, the backup's), then parks with the latest deadline: the requests
    // parked after it are let go first, and its maxWaitMs runs out behind them (its last look: the primary pacing).
    const all: Array<Promise<number>> = [ask(25_000)];
    await sleep(300);
    for (let i = 0; i < 8; i++) {
      all.push(ask());
      await sleep(120);
    }
    const statuses = await Promise.all(all);
    expect(statuses.filter((s) => s === 200).length).toBeGreaterThan(0);
    const lines = logs
      .map((l) => JSON.parse(l) as { attempts?: Array<{ target: string }>; skipped?: Array<{ target: string; reason: string }> })
      .filter((l) => l.attempts !== undefined || l.skipped !== undefined);
    expect(lines.length).toBeGreaterThanOrEqual(all.length);
    for (const l of lines) {
      const sent = new Set((l.attempts ?? []).map((a) => a.target));
      expect((l.skipped ?? []).filter((s) => sent.has(s.target)), JSON.stringify(l)).toEqual([]);
    }
  });
});

describe('a gateway started while its Redis is not there', () => {
  it('names the Redis it could not reach in its start-up line, never its password', { timeout: 30_000 }, async () => {
    // A port nothing listens on: taken, then given back.
    const port = await new Promise<number>((resolve) => {
      const srv = createServer().listen(0, '127.0.0.1', () => {
        const p = (srv.address() as { port: number }).port;
        srv.close(() => resolve(p));
      });
    });
    const secret = TEST_SECRETS[0]!;
    const logs: string[] = [];
    await startGateway(
      parseConfig(
        `
server: { host: 127.0.0.1, port: 0 }
state: { redis: "redis://app:${secret}@127.0.0.1:${port}/0", commandTimeoutMs: 200 }
providers:
  p: { family: openai, baseUrl: "http://127.0.0.1:${port}/v1", apiKey: sk-p }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: p } ]
`,
        'no-redis.yaml',
        {},
      ),
      { logs },
    );
    const line = logs.map((l) => JSON.parse(l) as { msg?: string; redis?: string }).find((l) => l.msg === 'starting on local state: Redis is not ready yet');
    expect(line).toMatchObject({ redis: `127.0.0.1:${port}` });
    expect(logs.join('\n')).not.toContain(secret);
  });
});

describe("the mock's fault spec", () => {
  it('refuses a field named like one every object has, at the top and for a model', () => {
    expect(() => assertFaultSpec(JSON.parse('{"constructor":{"latencyMs":5}}'))).toThrow(/unknown fault spec field "constructor"/);
    expect(() => assertFaultSpec(JSON.parse('{"models":{"gpt-4o":{"toString":1}}}'))).toThrow(/unknown fault spec field "toString"/);
  });
});
