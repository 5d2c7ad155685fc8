// A stream holds its pool slot until it ends, long after its first token: the wait told to a shed request (its
// retry-after) counts in how long slots are held, not in round trips to the first token.
//
// Found by a black-box run: 2,000 agents streaming 6 s answers through the default 128 slots. The online queue held
// its 1,000 for up to 50 s, while those shed (queue full) were told `retry-after-ms: 1400` (eight round trips of
// 175 ms to the first token), so each SDK spent its two retries within seconds and 744 agents failed.
import { describe, expect, it } from 'vitest';
import { useStacks, type Stack } from './helpers/stack.ts';

const start = useStacks();

async function stream(s: Stack): Promise<Response> {
  return fetch(`${s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', stream: true, messages: [{ role: 'user', content: 'hi' }] }),
  });
}

async function queuedOne(s: Stack): Promise<void> {
  for (let i = 0; i < 100; i++) {
    const text = await (await fetch(`${s.url}/metrics`)).text();
    if (/^stormgate_pool_queue_depth\{provider="mock",priority="online"\} 1$/m.test(text)) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error('the request never queued');
}

describe('the wait a shed request is told while streams hold the slots', () => {
  it('is how long the streams ahead hold their slots, not their time to first token', async () => {
    // One slot and one place in the queue; each stream's first token comes at once, its end 1.2 s later.
    const s = await start({
      faults: { stream: { chunks: 12, chunkDelayMs: 100 } },
      provider: { maxConnections: 1, pools: { classes: { online: { minShare: 0.5, maxQueue: 1 }, batch: { minShare: 0, maxQueue: 1 } } } },
    });
    // One stream to its end, so the pool has timed an answer.
    const first = await stream(s);
    expect(first.status).toBe(200);
    await first.text();

    const holding = await stream(s);
    expect(holding.status).toBe(200);
    const queued = stream(s);
    // Wait until the second is queued, then one more is shed: queue full.
    await queuedOne(s);
    const shed = await stream(s);
    expect(shed.status).toBe(503);
    expect(((await shed.json()) as { error: { code: string } }).error.code).toBe('load_shed');
    expect(shed.headers.get('x-should-retry')).toBe('true');
    // Two holds ahead of it (the stream in flight, the one queued): about 2.4 s. By round trips to the first token,
    // a few ms: an SDK would come straight back into the same full queue.
    expect(Number(shed.headers.get('retry-after-ms'))).toBeGreaterThanOrEqual(1_500);
    expect(Number(shed.headers.get('retry-after'))).toBeGreaterThanOrEqual(2);

    await holding.text();
    const last = await queued;
    expect(last.status).toBe(200);
    await last.text();
  });
});
