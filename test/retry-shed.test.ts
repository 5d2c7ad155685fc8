// A retry the provider's pool cannot seat before the deadline: the request already went upstream, so the client gets
// that attempt's failure with x-should-retry: false, not a load_shed that invites the SDK to send it all over again.
import { describe, expect, it } from 'vitest';
import { recordingClient, RETRY_LOOP_ONLY, useStacks } from './helpers/stack.ts';

const start = useStacks(RETRY_LOOP_ONLY);

describe('a retry shed by the pool', () => {
  it('ends with the upstream failure and x-should-retry false, so the SDK does not retry on top of the gateway', async () => {
    // Two slots and so one retry slot (a fifth of maxConcurrent, at least one); the provider hangs, each attempt times
    // out after 300 ms, and no answer has timed a round trip: the second request's retry cannot expect its slot in time.
    const s = await start({
      faults: { hangRate: 1 },
      provider: { maxConnections: 2, timeouts: { responseMs: 300 } },
    });
    const { client, seen } = recordingClient(s, { maxRetries: 2 });
    const call = () => client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }, { timeout: 2_000 }).then(() => 200, (e: { status?: number }) => e.status);
    const statuses = await Promise.all([call(), call()]);
    // Each SDK call was sent once, answered as the provider left it ...
    expect(seen.map((r) => r.shouldRetry)).toEqual(['false', 'false']);
    expect(statuses).toEqual([504, 504]);
    // ... though a retry was refused a slot (else this test checks nothing), which the log line says.
    expect(s.logs.some((l) => l.includes('"retriesStopped":"shed"'))).toBe(true);
  });
});
