// Review of the watch for clients' undeclared retries: once every failure it remembers is past its window, it must go
// back to hashing no body (the README's "nothing is hashed while nothing has failed"), not hash every request's body
// for the rest of the process's life because one request failed once.
import { describe, expect, it } from 'vitest';
import { ClientRepeats, type Arrival } from '../src/state/client-repeats.ts';
import { useStacks, type Stack } from './helpers/stack.ts';

const arrival = (body: string, over: Partial<Arrival> = {}): Arrival => ({ client: undefined, path: '/v1/chat/completions', query: '', priority: undefined, rawBody: Buffer.from(body), windowMs: 1_000, ...over });

describe('ClientRepeats, reviewed', () => {
  it('hashes no body once every failure it remembers is past its window, though no later failure swept them', () => {
    let now = 0;
    const repeats = new ClientRepeats(() => now);
    repeats.ended(arrival('failed once'), true);
    repeats.ended(arrival('failed on a long window', { windowMs: 5_000 }), true);
    now = 4_999;
    const during = arrival('another q 1');
    expect(repeats.isRepeat(during)).toBe(false);
    // Within a window, every arrival of a failed body's length is hashed: it may repeat a failure.
    expect(during.key).toBeDefined();
    now = 5_000;
    const later = arrival('another q 2');
    expect(repeats.isRepeat(later)).toBe(false);
    expect(later.key).toBeUndefined();
    expect(repeats.size).toBe(0);
  });

  it('still knows a repeat after forgetting expired ones, and a renewed failure keeps the watch on', () => {
    let now = 0;
    const repeats = new ClientRepeats(() => now);
    repeats.ended(arrival('q'), true);
    now = 900;
    const again = arrival('q');
    expect(repeats.isRepeat(again)).toBe(true);
    repeats.ended(again, true);
    now = 1_500;
    expect(repeats.isRepeat(arrival('q'))).toBe(true);
    now = 1_900;
    expect(repeats.isRepeat(arrival('q'))).toBe(false);
    expect(repeats.size).toBe(0);
  });
});

const start = useStacks();

async function requestLines(s: Stack, n: number): Promise<Array<Record<string, unknown>>> {
  for (let i = 0; i < 200; i++) {
    const found = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.route === 'chat');
    if (found.length >= n) return found;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error(`fewer than ${n} request lines`);
}

describe('what makes the next identical request a repeat, through the gateway', () => {
  const body = JSON.stringify({ model: 'gpt-4o', stream: true, messages: [{ role: 'user', content: 'tell a story' }] });
  const post = (s: Stack, signal?: AbortSignal) => fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body, ...(signal && { signal }) });

  it('a stream cut after its first bytes reached the client (stream_error) is a failure its repeat retries', async () => {
    const s = await start({ faults: { stream: { chunks: 6, cutAfterChunks: 2 } }, route: { park: false }, provider: { breaker: false } });
    const res = await post(s);
    expect(res.status).toBe(200);
    await res.text();
    await requestLines(s, 1);
    await (await post(s)).text();
    const [first, second] = await requestLines(s, 2);
    expect(first!.outcome).toBe('stream_error');
    expect(second!.clientRetry).toBe('repeat');
  });

  it('a stream read to its end is no failure: the same body again is a new request', async () => {
    const s = await start({ faults: { stream: { chunks: 3 } }, route: { park: false }, provider: { breaker: false } });
    await (await post(s)).text();
    await requestLines(s, 1);
    await (await post(s)).text();
    const [first, second] = await requestLines(s, 2);
    expect(first!.outcome).toBe('success');
    expect(second!.clientRetry).toBeUndefined();
  });
});
