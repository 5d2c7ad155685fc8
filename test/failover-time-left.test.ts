// A hand-over to the next target takes no wait, so the one wait rule's minAttemptMs does not hold it back: with little
// time left the backup is still asked, since a fast one (embeddings, a short answer, a stream's first token, after which
// the deadline no longer applies) answers in a few hundred ms. Declining it turned such answers into 504s.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { defaultConfig, RETRY_LOOP_ONLY, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';

const startStack = useStacks();
const startBackup = useExtraMocks();

/** Primary (the stack's mock) never answers and times out after `responseMs`; an OpenAI-family backup that answers. */
async function stack(responseMs: number): Promise<Stack & { backupRequests: () => number }> {
  const backup = await startBackup({ apiKey: 'backup-key' });
  const s = await startStack({
    faults: { hangRate: 1 },
    config: (url) => {
      const base = defaultConfig(url, { provider: { ...RETRY_LOOP_ONLY.provider, timeouts: { responseMs } }, route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 1 }, minAttemptMs: 500 } });
      return {
        ...base,
        providers: { ...base.providers, backup: { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: 'backup-key', breaker: false } },
        routes: base.routes.map((r) => (r.name === 'chat' ? { ...r, targets: [{ provider: 'mock' }, { provider: 'backup' }] } : r)),
      };
    },
  });
  return Object.assign(s, { backupRequests: () => backup.stats().total });
}

const ask = (s: Stack) =>
  new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 }).chat.completions
    .create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }, { headers: { 'x-stormgate-timeout-ms': '2000' } })
    .withResponse()
    .then(
      ({ response }) => ({ status: response.status, target: response.headers.get('x-stormgate-target'), code: undefined as string | null | undefined }),
      (err: InstanceType<typeof OpenAI.APIError>) => ({ status: err.status, target: err.headers?.get('x-stormgate-target') ?? null, code: err.code }),
    );

describe('failover with the time left', () => {
  it('hands over to the backup while minAttemptMs is left (the primary silent past its responseMs)', async () => {
    const s = await stack(100);
    expect(await ask(s)).toMatchObject({ status: 200, target: 'backup/gpt-4o' });
    expect(s.backupRequests()).toBe(1);
  });

  it('still hands over with less than minAttemptMs left, and a fast backup answers', async () => {
    // 2000 ms less the 250 ms margin: 1,750 ms; the primary's timeout at 1,400 ms leaves 350, under minAttemptMs (500).
    const s = await stack(1_400);
    expect(await ask(s)).toMatchObject({ status: 200, target: 'backup/gpt-4o' });
    expect(s.backupRequests()).toBe(1);
  });
});
