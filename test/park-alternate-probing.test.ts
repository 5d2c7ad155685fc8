// Agents that each wait for their answer before sending the next, all parked for a primary that stays down, and a
// backup that recovered while its breaker was open: then only probing (a parked request may probe it 1 s after it
// opened). Nothing else probes it: there are no newcomers, and the primary's own probe hangs (no responseMs), holding
// the primary's one probe slot until that request's deadline. Measured before the lot sent a parked request to carry
// an alternate's probe: the parked requests were answered by the backup 22.5 to 23.2 s after it recovered (their
// last chance, 25 s deadlines). With the lot's move alone, a backup open for 10 s was answered 10.7 s after: the
// request moved to probe it parked for the primary again (probing too, its permit out), until openS let it probe
// unparked. Now one parked request leaves (`moved`, with the probe to carry), parks for the backup, is released to
// the probe, and the others follow once the backup's breaker closes: 0.7 to 1.4 s after it recovered.
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import type { MockServer } from '../src/mock/server.ts';
import { useExtraMocks, useGateways } from './helpers/stack.ts';
import { mockControl } from './helpers/mock-control.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();

const brownout = (m: MockServer, body: { mode?: string; durationMs: number }) => mockControl(m, 'POST', 'brownout', body);

const AGENTS = 6;

/** `backupBreaker`: the backup's breaker settings (openS 30 is the default). */
function yaml(primary: string, backup: string, backupBreaker = '{ openS: 30 }'): string {
  // Two side routes send one target each, to open its breaker with no request parked for it (park: false): a request
  // of the agents' route that failed on the primary before its breaker opened would park for the backup alone, and
  // carry the backup's probes as its own.
  return `
server: { host: 127.0.0.1, port: 0 }
providers:
  primary: { family: openai, baseUrl: "${primary}/v1", apiKey: sk-primary, breaker: { openS: 30 } }
  backup: { family: openai, baseUrl: "${backup}/v1", apiKey: sk-backup, breaker: ${backupBreaker} }
routes:
  - name: open-primary
    match: { path: /v1/chat/completions, models: [open-primary] }
    targets: [ { provider: primary, model: gpt-4o } ]
    retry: { maxAttempts: 1 }
    park: false
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

describe('requests parked for a primary that stays down, with no new traffic', () => {
  // The backup's breaker, open, may be probed by a parked request 1 s after it opened (probeWhileParkedMs), by anyone
  // after openS: 2 s, or 10 s (the request moved to probe it then parks for it, and is released to the probe at once).
  it.each([
    ['openS 2 s', '{ openS: 2 }'],
    ['openS 10 s', '{ openS: 10 }'],
  ])('probe a backup that recovered themselves (%s), answered within seconds, not when their wait runs out', { timeout: 60_000 }, async (_name, backupBreaker) => {
    const primary = await startMock();
    const backup = await startMock();
    const url = await startGateway(parseConfig(yaml(primary.url, backup.url, backupBreaker), 'park-alternate-probing.yaml', {}));
    const send = (model: string, signal?: AbortSignal) =>
      fetch(`${url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-stormgate-timeout-ms': '25000' },
        body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }] }),
        ...(signal && { signal }),
      });
    const openBreaker = async (model: string) => {
      for (let i = 0; i < 6; i++) await (await send(model)).arrayBuffer();
    };
    const answers: Array<{ agent: number; status: number; target: string | null; atMs: number }> = [];
    const stop = new AbortController();
    const agent = async (n: number) => {
      while (!stop.signal.aborted) {
        try {
          const res = await send('gpt-4o', stop.signal);
          await res.arrayBuffer();
          answers.push({ agent: n, status: res.status, target: res.headers.get('x-stormgate-target'), atMs: Date.now() });
          if (res.status !== 200) await sleep(20);
        } catch {
          return;
        }
      }
    };

    // Both down, both breakers open, the primary's first: the agents' requests park for it, expected back first, and
    // watch the backup. The primary then hangs: its first probe holds its permit, and its one probe slot in the lot,
    // until that request's deadline.
    await brownout(primary, { mode: '503', durationMs: 120_000 });
    await brownout(backup, { mode: '503', durationMs: 120_000 });
    await openBreaker('open-primary');
    await brownout(primary, { mode: 'hang', durationMs: 120_000 });
    await openBreaker('open-backup');
    const agents = Array.from({ length: AGENTS }, (_, i) => agent(i));
    await sleep(300);
    // The backup recovers, its breaker still open: the parked requests are the only traffic.
    await brownout(backup, { durationMs: 0 });
    const backAtMs = Date.now();
    const served = () => new Set(answers.filter((a) => a.status === 200 && a.target?.startsWith('backup')).map((a) => a.agent));
    const until = backAtMs + 20_000;
    while (Date.now() < until && served().size < AGENTS - 1) await sleep(100);
    const firstAnswerMs = [...served()].map((n) => answers.find((a) => a.agent === n && a.status === 200)!.atMs - backAtMs).sort((a, b) => a - b);
    stop.abort();
    await Promise.all(agents);
    // One agent carries the primary's hung probe; the others are answered by the backup: its probe time (under a
    // second from now), the probe and the breaker's close, and a second of spread. 7 s leaves room for a loaded machine
    // and is far before the hung probe's permit runs out (about 24 s from now) or the requests' last chance.
    expect(firstAnswerMs.length, `first backup answers ${firstAnswerMs.join(', ')} ms after it recovered`).toBe(AGENTS - 1);
    for (const ms of firstAnswerMs) expect(ms).toBeLessThan(7_000);
  });
});

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
