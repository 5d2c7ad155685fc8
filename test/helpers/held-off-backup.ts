// A primary that asks once for a pause (1 s unless told), then answers one request at a time (`latencyMs` each), behind a backup that
// asks for 30 s pauses and so stays held off: the requests parked for the primary leave behind its release, paced.
import { setTimeout as sleep } from 'node:timers/promises';
import { parseConfig } from '../../src/config/load.ts';
import type { MockOptions, MockServer } from '../../src/mock/server.ts';
import type { Config } from '../../src/config/schema.ts';
import { eventually } from './redis-stores.ts';
import { scrapeMetrics, type MetricSample } from './stack.ts';

type StartMock = (opts?: MockOptions) => Promise<MockServer>;
type StartGateway = (config: Config, opts?: { logs?: string[] }) => Promise<string>;

export async function heldOffBackupStack(
  startMock: StartMock,
  startGateway: StartGateway,
  o: { latencyMs: number; maxAttempts: number; holdOffS?: number; maxWaitMs?: number },
): Promise<{ url: string; logs: string[]; primary: MockServer; backup: MockServer }> {
  const primary = await startMock({ faults: { latencyMs: o.latencyMs, errors: [{ status: 429, times: 1, headers: { 'retry-after': String(o.holdOffS ?? 1) } }] } });
  const backup = await startMock({ faults: { errors: [{ status: 429, headers: { 'retry-after': '30' } }] } });
  const logs: string[] = [];
  const yaml = `
server: { host: 127.0.0.1, port: 0 }
providers:
  primary: { family: openai, baseUrl: "${primary.url}/v1", apiKey: sk-primary, pools: { maxConcurrent: 1 } }
  backup: { family: openai, baseUrl: "${backup.url}/v1", apiKey: sk-backup }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: primary }, { provider: backup } ]
    retry: { maxAttempts: ${o.maxAttempts}, maxWaitHintMs: 60000 }
    park: { maxWaitMs: ${o.maxWaitMs ?? 1500} }
`;
  const url = await startGateway(parseConfig(yaml, 'held-off-backup.yaml', {}), { logs });
  return { url, logs, primary, backup };
}

export interface ParkAnswer {
  status: number;
  code: string | undefined;
  message: string | undefined;
}

/** A chat call that leaves the gateway 25 s (longer than any park wait here); resolves its status and error. */
function askChat(url: string): Promise<ParkAnswer> {
  return fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-stormgate-timeout-ms': '25000' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
  }).then(async (res) => {
    const body = (await res.json()) as { error?: { code?: string; message?: string } };
    return { status: res.status, code: body.error?.code, message: body.error?.message };
  });
}

/** Until the gateway at `url` holds off every target of `targets` (its stormgate_hold_remaining_seconds above 0). */
export async function untilHeldOff(url: string, targets: string[], withinMs = 10_000): Promise<void> {
  const heldOff = (samples: MetricSample[], target: string) =>
    samples.some((m) => m.name === 'stormgate_hold_remaining_seconds' && m.value > 0 && m.labels.target === target && m.labels.kind === 'hold_off' && m.labels.tier === 'all');
  await eventually(async () => {
    const samples = await scrapeMetrics(url);
    return targets.every((t) => heldOff(samples, t));
  }, withinMs);
}

/**
 * One request that meets the primary's 429, then four more 150 ms apart from 300 ms on (or from when `heldOff`
 * resolves), which park behind its hold-off and leave one at a time when it ends; resolves all five answers in the
 * order they were sent.
 */
export async function askFirstThenParked(url: string, heldOff: () => Promise<void> = () => sleep(300)): Promise<ParkAnswer[]> {
  const first = askChat(url);
  await heldOff();
  const parked: Array<Promise<ParkAnswer>> = [];
  for (let i = 0; i < 4; i++) {
    parked.push(askChat(url));
    await sleep(150);
  }
  return Promise.all([first, ...parked]);
}
