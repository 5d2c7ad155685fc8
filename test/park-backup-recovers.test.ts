// A request parked for the target expected back first (the primary, its probes failing) is not told when another
// target comes back. Found in a new user's run: with both breakers open, then the backup recovered while the primary
// still failed, 25 of 30 parked requests waited to their deadlines and got 503 circuit_open from a healthy backup.
// At its last chance the request now looks at every target once more before it ends; and the backup, an alternate it
// watches while parked, moves it as soon as its breaker closes (a newcomer's probe), not only then.
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import type { MockServer } from '../src/mock/server.ts';
import { useExtraMocks, useGateways } from './helpers/stack.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();

const brownout = async (m: MockServer, body: { mode?: string; durationMs: number }) => {
  const res = await fetch(`${m.url}/_mock/brownout`, { method: 'POST', body: JSON.stringify(body) });
  expect(res.status).toBe(200);
};

function yaml(primary: string, backup: string): string {
  return `
server: { host: 127.0.0.1, port: 0 }
providers:
  primary: { family: openai, baseUrl: "${primary}/v1", apiKey: sk-primary, breaker: { openS: 2 } }
  backup: { family: openai, baseUrl: "${backup}/v1", apiKey: sk-backup, breaker: { openS: 2 } }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: primary }, { provider: backup } ]
    retry: { maxAttempts: 2, backoff: { baseMs: 10, capMs: 20 } }
`;
}

describe('a request parked for a primary that stays down', () => {
  it('is answered by a backup that came back meanwhile, at its last chance at the latest, not 503 circuit_open', { timeout: 40_000 }, async () => {
    const primary = await startMock();
    const backup = await startMock();
    const url = await startGateway(parseConfig(yaml(primary.url, backup.url), 'park-backup.yaml', {}));
    const client = (timeoutMs: number) =>
      new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0, logLevel: 'off', defaultHeaders: { 'x-stormgate-timeout-ms': String(timeoutMs) } });
    const ask = (timeoutMs: number) =>
      client(timeoutMs)
        .chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] })
        .withResponse()
        .then((r) => ({ status: 200, target: r.response.headers.get('x-stormgate-target') }))
        .catch((e: { status?: number; code?: string }) => ({ status: e.status ?? 0, target: e.code ?? null }));

    // Both providers down: both breakers open (five failures in a row, a quarter second without a success).
    await brownout(primary, { mode: '503', durationMs: 120_000 });
    await brownout(backup, { mode: '503', durationMs: 120_000 });
    for (let i = 0; i < 20; i++) void ask(1_500);
    await sleep(1_800);
    // The backup comes back; the primary stays down. Past openS (2 s), both may be probed.
    await brownout(backup, { durationMs: 0 });
    await sleep(2_500);
    const answers = await Promise.all(Array.from({ length: 30 }, () => ask(6_000)));
    expect(answers.map((a) => a.status)).toEqual(Array(30).fill(200));
    expect(answers.every((a) => a.target?.startsWith('backup'))).toBe(true);
  });

  it('leaves the lot for the backup as soon as the backup closes its breaker, long before its own deadline', { timeout: 40_000 }, async () => {
    const primary = await startMock();
    const backup = await startMock();
    const logs: string[] = [];
    const url = await startGateway(parseConfig(yaml(primary.url, backup.url), 'park-backup-moved.yaml', {}), { logs });
    const ask = (timeoutMs: number) => {
      const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0, logLevel: 'off', defaultHeaders: { 'x-stormgate-timeout-ms': String(timeoutMs) } });
      const started = Date.now();
      return client.chat.completions
        .create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] })
        .withResponse()
        .then((r) => ({ status: 200, target: r.response.headers.get('x-stormgate-target'), atMs: Date.now() }))
        .catch((e: { status?: number; code?: string }) => ({ status: e.status ?? 0, target: e.code ?? null, atMs: Date.now() }))
        .then((a) => ({ ...a, tookMs: a.atMs - started }));
    };
    await brownout(primary, { mode: '503', durationMs: 120_000 });
    await brownout(backup, { mode: '503', durationMs: 120_000 });
    for (let i = 0; i < 20; i++) void ask(1_500);
    await sleep(1_800);
    // Parked with 25 s to go: their last chance is 20 s away.
    const parked = Array.from({ length: 10 }, () => ask(25_000));
    await sleep(300);
    await brownout(backup, { durationMs: 0 });
    const backAtMs = Date.now();
    // Newcomers: once the backup's breaker may probe (openS, 2 s), one of them probes it and closes it.
    const newcomers: Array<ReturnType<typeof ask>> = [];
    for (let i = 0; i < 8; i++) {
      newcomers.push(ask(6_000));
      await sleep(400);
    }
    const answers = await Promise.all(parked);
    expect(answers.map((a) => a.status)).toEqual(Array(10).fill(200));
    expect(answers.every((a) => a.target?.startsWith('backup'))).toBe(true);
    // Closed within about 2 s of its recovery (openS), and left within a second of that: 12 s leaves room for a loaded
    // machine and is still far before their last chance (about 22 s after this moment).
    for (const a of answers) expect(a.atMs - backAtMs).toBeLessThan(12_000);
    await Promise.all(newcomers);
    // Their log lines name the primary as passed over, never the backup that answered them.
    type Line = { status?: number; target?: string; skipped?: Array<{ target: string }>; attempts?: Array<{ target: string; waitMs: number }> };
    const served = logs.map((l) => JSON.parse(l) as Line).filter((l) => l.status === 200 && l.target?.startsWith('backup'));
    expect(served.length).toBeGreaterThanOrEqual(10);
    for (const l of served) expect((l.skipped ?? []).map((k) => k.target).filter((t) => t.startsWith('backup'))).toEqual([]);
    // The parked ones' backup attempt shows the seconds they waited in the lot before it.
    const waits = served.map((l) => l.attempts?.find((a) => a.target.startsWith('backup'))?.waitMs ?? 0);
    expect(waits.filter((w) => w >= 1_500).length).toBeGreaterThanOrEqual(10);
  });
});
