// A request whose retries on the primary ran out before the primary's breaker opened (two 503s, maxAttempts 2: too
// few for consecutiveFailures) is done with the primary. It then found the backup's breaker open and parked for the
// backup alone, with no alternate to watch: the primary, its breaker closed all along, is nothing the lot can watch.
// The lot released it to each of the backup's probes (1, 3, 7 and 12 s into the park, all failing) and, once the next
// probe time was past its last chance, it ended at once: 503 after 13.8 s, the backup probe's own 503, while the
// primary had answered every newcomer since 2 s into the park. Its last look (only taken at a lot timeout with more
// than one blocked target) never took in a target whose retries ran out.
// Skipped: a design question, not built. The fix that passes it (after a park, the last look gives a target whose
// retries ran out one more attempt, paid from the retry budget; answered 200 by the primary at 13.7 s and 18.2 s in
// two runs, deadline 19 s) makes retry.maxAttempts no longer a hard cap per target, which the README and the issue
// state; and it still answers late (the lot cannot learn that a target with a closed breaker recovered without sending
// it a request). Kept as the sequence and the numbers for that decision.
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import type { MockServer } from '../src/mock/server.ts';
import { useExtraMocks, useGateways } from './helpers/stack.ts';
import { mockControl } from './helpers/mock-control.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();

const brownout = (m: MockServer, body: { mode?: string; durationMs: number }) => mockControl(m, 'POST', 'brownout', body);

function yaml(primary: string, backup: string): string {
  // A side route opens the backup's breaker with no request parked for it (park: false).
  return `
server: { host: 127.0.0.1, port: 0 }
providers:
  primary: { family: openai, baseUrl: "${primary}/v1", apiKey: sk-primary }
  backup: { family: openai, baseUrl: "${backup}/v1", apiKey: sk-backup }
routes:
  - name: open-backup
    match: { path: /v1/chat/completions, models: [open-backup] }
    targets: [ { provider: backup, model: gpt-4o } ]
    retry: { maxAttempts: 1 }
    park: false
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: primary }, { provider: backup } ]
    retry: { maxAttempts: 2, backoff: { baseMs: 10, capMs: 20 } }
`;
}

describe('a request parked for a backup that stays down, after its retries on the primary ran out', () => {
  it.skip('is answered by the primary that came back meanwhile, not with a stale 503', { timeout: 60_000 }, async () => {
    const primary = await startMock();
    const backup = await startMock();
    const logs: string[] = [];
    const url = await startGateway(parseConfig(yaml(primary.url, backup.url), 'park-stale.yaml', {}), { logs });
    const post = async (model: string, timeoutMs: number) => {
      const started = Date.now();
      const r = await fetch(`${url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-stormgate-timeout-ms': String(timeoutMs) },
        body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }] }),
      });
      await r.text();
      return { status: r.status, target: r.headers.get('x-stormgate-target'), tookMs: Date.now() - started };
    };
    await brownout(primary, { mode: '503', durationMs: 120_000 });
    await brownout(backup, { mode: '503', durationMs: 120_000 });
    // Six failures in a row open the backup's breaker (consecutiveFailures 5).
    for (let i = 0; i < 6; i++) expect((await post('open-backup', 2_000)).status).toBe(503);
    const parked = post('gpt-4o', 20_000);
    await sleep(2_000);
    await brownout(primary, { durationMs: 0 });
    // The primary answers again: a newcomer is served by it at once.
    const newcomer = await post('gpt-4o', 5_000);
    expect(newcomer).toMatchObject({ status: 200, target: 'primary/gpt-4o' });
    const answer = await parked;
    expect(answer).toMatchObject({ status: 200, target: 'primary/gpt-4o' });
    // Answered before its deadline, by one more attempt on the primary after the park.
    expect(answer.tookMs).toBeLessThan(19_500);
    type Line = { status?: number; route?: string; attempts?: Array<{ target: string; status?: number }>; parkedMs?: number };
    const line = logs.map((l) => JSON.parse(l) as Line).find((l) => l.route === 'chat' && (l.parkedMs ?? 0) > 0);
    const onPrimary = line?.attempts?.filter((a) => a.target === 'primary/gpt-4o').map((a) => a.status);
    expect(onPrimary).toEqual([503, 503, 200]);
  });
});
