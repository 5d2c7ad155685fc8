// A primary that asks once for a 1 s pause, then answers one request at a time (`latencyMs` each), behind a backup that
// asks for 30 s pauses and so stays held off: the requests parked for the primary leave behind its release, paced.
import { parseConfig } from '../../src/config/load.ts';
import type { MockOptions, MockServer } from '../../src/mock/server.ts';
import type { Config } from '../../src/config/schema.ts';

type StartMock = (opts?: MockOptions) => Promise<MockServer>;
type StartGateway = (config: Config, opts?: { logs?: string[] }) => Promise<string>;

export async function heldOffBackupStack(
  startMock: StartMock,
  startGateway: StartGateway,
  o: { latencyMs: number; maxAttempts: number },
): Promise<{ url: string; logs: string[]; primary: MockServer; backup: MockServer }> {
  const primary = await startMock({ faults: { latencyMs: o.latencyMs, errors: [{ status: 429, times: 1, headers: { 'retry-after': '1' } }] } });
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
    park: { maxWaitMs: 1500 }
`;
  const url = await startGateway(parseConfig(yaml, 'held-off-backup.yaml', {}), { logs });
  return { url, logs, primary, backup };
}
