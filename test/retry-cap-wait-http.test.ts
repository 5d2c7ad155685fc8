// A retry behind the retry cap (pools.maxConcurrentRetries: 1) over real HTTP: the bundled mock fails every first
// attempt (500) and answers the retries, the openai SDK is the client (no retries of its own), the provider paced at a
// request a second so a turn of its rate is always near. Behind a retry that ends soon, a retry waits for the cap and
// is served; behind one held by a stream longer than its deadline, it gets its answer at once (the first attempt's
// 500, x-should-retry false), not at its last chance. Timing bounds are generous (a loaded 2-core machine).
import { describe, expect, it } from 'vitest';
import { RETRY_LOOP_ONLY, recordingClient, useStacks, type Stack } from './helpers/stack.ts';

const FIRST_FAILS = [{ status: 500, firstAttemptsOnly: true }];

const start = useStacks({
  route: { ...RETRY_LOOP_ONLY.route, retry: { backoff: { baseMs: 20, capMs: 50 } } },
  provider: { ...RETRY_LOOP_ONLY.provider, pools: { maxConcurrent: 10, maxConcurrentRetries: 1, requestsPerMinute: 60, burst: 1 } },
});

const ask = (s: Stack, model: string, timeout: number, signal?: AbortSignal) => {
  const { client, seen } = recordingClient(s, { maxRetries: 0 });
  const started = Date.now();
  // The timeout on the request itself: only then does the SDK send it (x-stainless-timeout) for the gateway's deadline.
  const done = client.chat.completions
    .create({ model, messages: [{ role: 'user', content: 'hi' }] }, { signal, timeout })
    .then(
      () => ({ status: 200, ms: Date.now() - started }),
      (e: { status?: number }) => ({ status: e.status, ms: Date.now() - started }),
    );
  return { done, seen };
};

const streamFor = (s: Stack, model: string, signal: AbortSignal) => {
  const { client } = recordingClient(s, { maxRetries: 0, timeout: 60_000 });
  return client.chat.completions
    .create({ model, stream: true, messages: [{ role: 'user', content: 'hi' }] }, { signal })
    .then(async (stream) => {
      for await (const _ of stream) void _;
    })
    .catch(() => undefined);
};

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('a retry waiting for the retry cap, over HTTP', () => {
  it('is served behind a retry that ends soon', async () => {
    const s = await start({ faults: { errors: FIRST_FAILS, models: { holder: { errors: FIRST_FAILS, latencyMs: 1_500 } } } });
    const holder = ask(s, 'holder', 20_000);
    // The holder's first attempt takes the rate's turn at once and its retry the next one, a second later: it then holds the cap 1.5 s.
    await sleep(1_300);
    const behind = ask(s, 'gpt-4o', 20_000);
    expect((await holder.done).status).toBe(200);
    expect((await behind.done).status).toBe(200);
    // Its retry waited for the slot the holder's retry had (else the cap held nothing here).
    const lines = s.logs.map((l) => JSON.parse(l) as { model?: string; attempts?: Array<{ slotWaitMs?: number }> });
    const waited = lines.flatMap((l) => l.attempts ?? []).some((a) => (a.slotWaitMs ?? 0) > 200);
    expect(waited).toBe(true);
  }, 30_000);

  it('is answered at once behind a stream holding the cap past its deadline, not at its last chance', async () => {
    const long = (chunks: number) => ({ errors: FIRST_FAILS, stream: { chunks, chunkDelayMs: 500 } });
    // warm: a first attempt that times answers at 6 s a slot; holder: a retry that streams for 30 s (cut when done).
    const s = await start({ faults: { errors: FIRST_FAILS, models: { warm: { stream: { chunks: 12, chunkDelayMs: 500 } }, holder: long(60) } } });
    const stop = new AbortController();
    const warm = streamFor(s, 'warm', stop.signal);
    const holder = streamFor(s, 'holder', stop.signal);
    await warm;
    // The warm stream has ended (t ≈ 6 s); the holder's retry (from t ≈ 2 s) holds the one retry slot until t ≈ 32 s.
    // Made sure of, for a loaded machine: its retry is streaming, with far more than the request's 5 s of it left
    // (at most 40 of its 60 chunks sent: 10 s to go).
    const holderRetries = () => s.mock.requests().filter((r) => r.model === 'holder' && r.headers['x-retry-attempt'] !== undefined);
    const holding = () => holderRetries().some((r) => r.endedAt === undefined && (r.chunksSent ?? 0) <= 40);
    for (const until = Date.now() + 20_000; !holding() && Date.now() < until; ) await sleep(50);
    const seen = JSON.stringify(holderRetries().map((r) => ({ endedAt: r.endedAt, chunksSent: r.chunksSent })));
    expect(holding(), `the holder's retry streams, with most of its chunks to come (its retries: ${seen})`).toBe(true);
    const behind = ask(s, 'gpt-4o', 5_000);
    const answer = await behind.done;
    stop.abort();
    await holder;
    // The 500 of its first attempt, not retried by the SDK: the pool could not seat its retry before its deadline.
    expect(answer.status).toBe(500);
    expect(behind.seen.map((r) => r.shouldRetry)).toEqual(['false']);
    // At once: its last chance was ~3.75 s (a 5 s timeout less the margin and minAttemptMs).
    expect(answer.ms).toBeLessThan(2_500);
    expect(s.logs.some((l) => l.includes('"retriesStopped":"shed"'))).toBe(true);
    // Room for a loaded machine: 6 s of warm stream and up to 20 s to see the holder streaming come before the ask
    // (the wait for the holder's retry ran out at 10 s once under the full suite's load; alone the test takes ~10 s).
  }, 90_000);
});
