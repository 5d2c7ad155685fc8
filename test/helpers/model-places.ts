// For the tests of the target keys a model name takes (fallback-keys, mutation-mut-today-23): one chat call's status
// as the SDK saw it, and the attempts /metrics counts for a target.
import OpenAI from 'openai';
import { metricSum, TEST_KEY, type Stack } from './stack.ts';

export async function status(client: OpenAI, model: string): Promise<number> {
  try {
    await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }] });
    return 200;
  } catch (err) {
    if (err instanceof OpenAI.APIError && err.status !== undefined) return err.status;
    throw err;
  }
}

export const attempts = (s: Stack, target: string, statusClass: string) => metricSum(s, `stormgate_upstream_attempts_total{target="${target}",status_class="${statusClass}"}`);

/** A primary (no breaker, so each failure goes on to the backup) and a backup whose breaker opens at 2 failures in a row. */
export function primaryAndBackupConfig(mockUrl: string, backupUrl: string) {
  return {
    server: { host: '127.0.0.1', port: 0, logLevel: 'info' as const },
    providers: {
      mock: { family: 'openai' as const, baseUrl: `${mockUrl}/v1`, apiKey: TEST_KEY, breaker: false as const },
      backup: { family: 'openai' as const, baseUrl: `${backupUrl}/v1`, apiKey: TEST_KEY, breaker: { consecutiveFailures: 2 } },
    },
    routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }, { provider: 'backup' }], retry: { maxAttempts: 1 }, park: false as const }],
  };
}
