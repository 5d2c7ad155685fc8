// A request that went upstream to one target and then finds every target unavailable (the one it tried opened its
// breaker on that very failure, another's pool is full): it ends with the failure it got, x-should-retry: false, not a
// load_shed or hold-off that invites the SDK to send it all over again on top of the attempt the provider may have run.
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { defaultConfig, recordingClient, RETRY_LOOP_ONLY, useExtraMocks, useStacks } from './helpers/stack.ts';

const extraMock = useExtraMocks();
const start = useStacks();

describe('a request that went upstream, then found no target that can take it', () => {
  it('ends with its upstream failure and x-should-retry false, not a load_shed from the full target', async () => {
    // The backup hangs: its attempt times out (responseMs) and that failure opens its breaker at once.
    const backup = await extraMock({ faults: { hangRate: 1 }, apiKey: 'backup-key' });
    const s = await start({
      faults: { latencyMs: 1_500 },
      config: (url) => {
        const base = defaultConfig(url, RETRY_LOOP_ONLY);
        return {
          ...base,
          providers: {
            // The primary takes one request at a time and queues none: a second one is shed at once.
            mock: { ...base.providers.mock!, maxConnections: 1, pools: { maxConcurrent: 1, classes: { online: { minShare: 0.5, maxQueue: 0 } } } },
            backup: { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: 'backup-key', timeouts: { responseMs: 300 }, breaker: { consecutiveFailures: 1, openS: 30 } },
          },
          routes: base.routes.map((r) => (r.name === 'chat' ? { ...r, targets: [{ provider: 'mock' }, { provider: 'backup' }], park: false } : r)),
        };
      },
    });
    // The primary's one slot is taken for 1.5 s.
    const busy = fetch(`${s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'busy' }] }),
    }).then((r) => r.arrayBuffer());
    await sleep(100);
    const { client, seen } = recordingClient(s, { maxRetries: 2 });
    const status = await client.chat.completions
      .create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }, { timeout: 5_000 })
      .then(() => 200, (e: { status?: number }) => e.status);
    await busy;
    // The backup ran (or may have run) the request once: the client is told of that timeout, and not invited back.
    expect(backup.requests().length).toBe(1);
    expect(seen).toEqual([{ status: 504, shouldRetry: 'false', code: 'upstream_timeout' }]);
    expect(status).toBe(504);
  });

  it('ends with its upstream failure, not a provider_held_off from the target it skipped', async () => {
    // The primary asks for 10 s, longer than the route waits out: it is held off and skipped. The backup hangs (two
    // attempts a request), and its third failure in a row opens its breaker: the second request's retry finds it open.
    const backup = await extraMock({ faults: { hangRate: 1 }, apiKey: 'backup-key' });
    const s = await start({
      faults: { errors: [{ status: 429, headers: { 'retry-after': '10' } }] },
      config: (url) => {
        const base = defaultConfig(url, RETRY_LOOP_ONLY);
        return {
          ...base,
          providers: {
            ...base.providers,
            backup: { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: 'backup-key', timeouts: { responseMs: 300 }, breaker: { consecutiveFailures: 3, openS: 30 } },
          },
          routes: base.routes.map((r) =>
            r.name === 'chat' ? { ...r, targets: [{ provider: 'mock' }, { provider: 'backup', retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 10, capMs: 10 } } }], park: false, retry: { maxAttempts: 1, maxWaitHintMs: 1_000 } } : r,
          ),
        };
      },
    });
    const chat = async () => {
      const res = await fetch(`${s.baseURL}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
      });
      const body = (await res.json()) as { error: { code: string } };
      return { status: res.status, shouldRetry: res.headers.get('x-should-retry'), code: body.error.code, target: res.headers.get('x-stormgate-target') };
    };
    expect(await chat()).toEqual({ status: 504, shouldRetry: 'false', code: 'upstream_timeout', target: 'backup/gpt-4o' });
    expect(await chat()).toEqual({ status: 504, shouldRetry: 'false', code: 'upstream_timeout', target: 'backup/gpt-4o' });
    expect(backup.requests().length).toBe(3);
  });
});
