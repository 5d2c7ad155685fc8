// A request parked for the target expected back first (the primary, its probes failing) is not told when another
// target comes back. Found in a new user's run: with both breakers open, then the backup recovered while the primary
// still failed, 25 of 30 parked requests waited to their deadlines and got 503 circuit_open from a healthy backup.
// At its last chance the request now looks at every target once more before it ends.
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
});
