// A stream whose first output arrived before the deadline has started: the deadline must not cut it afterwards,
// even when the gateway was still busy with the attempt's bookkeeping (a probe's result written to a shared store,
// one round trip to Redis) when the deadline fired. Cut then, the client got a 200, the first chunk, and a clean end:
// a truncated answer with no error event and no [DONE].
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { useStacks } from './helpers/stack.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import type { BreakerRecord } from '../src/state/store.ts';

const start = useStacks();

/** The in-process store with a compare-and-set as slow as a Redis round trip on a busy network. */
class SlowCasStore extends MemoryStore {
  casDelayMs = 0;
  override async casBreaker(target: string, expectedGeneration: number, next: BreakerRecord): Promise<boolean> {
    if (this.casDelayMs > 0) await sleep(this.casDelayMs);
    return super.casBreaker(target, expectedGeneration, next);
  }
}

describe('a stream whose first output came in time', () => {
  it('is answered whole when the deadline fires while its probe result is being written', async () => {
    const store = new SlowCasStore();
    const s = await start({
      faults: { errors: [{ status: 500, times: 1 }], stream: { chunks: 5, chunkDelayMs: 20 } },
      route: { retry: { maxAttempts: 1 }, park: false },
      provider: { breaker: { consecutiveFailures: 1, openS: 0.2, halfOpenProbes: 1, closeAfter: 1 } },
      deps: { store },
    });
    const chat = (stream: boolean, headers: Record<string, string> = {}) =>
      fetch(`${s.baseURL}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...headers },
        body: JSON.stringify({ model: 'gpt-4o', stream, messages: [{ role: 'user', content: 'hi' }] }),
      });
    expect((await chat(false)).status).toBe(500);
    await sleep(300);
    // The probe: its first token comes at once; writing its success takes longer than what is left of the deadline.
    store.casDelayMs = 600;
    const res = await chat(true, { 'x-stormgate-timeout-ms': '600' });
    expect(res.status).toBe(200);
    const text = await res.text();
    expect(text).toContain('data: [DONE]');
  });
});
