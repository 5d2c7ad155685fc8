// stormgate_ttft_seconds is the time to first token the client sees: from the request's arrival to its first output
// event, retries and their backoff included, and for every stream, one started early at the client's deadline too.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { chatChunk as chunk, eventStream, useFakeProviders } from './helpers/fake-provider.ts';
import { configServedBy, metricSum, RETRY_LOOP_ONLY, useStacks } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();

const ttft = async (s: Parameters<typeof metricSum>[0]) => ({
  count: await metricSum(s, 'stormgate_ttft_seconds_count{route="chat"}'),
  sum: await metricSum(s, 'stormgate_ttft_seconds_sum{route="chat"}'),
});

describe('the TTFT histogram', () => {
  it('counts a stream started early at the client\'s deadline, with the time its first output came', async () => {
    // Headers at once, the answer 1.5 s later: past the client's 1 s deadline (750 ms after the margin).
    const p = await startProvider(
      eventStream((res) => {
        res.flushHeaders();
        const timer = setTimeout(() => res.end(chunk({ role: 'assistant', content: 'Hello' }, null) + chunk({}, 'stop') + 'data: [DONE]\n\n'), 1_500);
        res.on('close', () => clearTimeout(timer));
      }),
    );
    const s = await startStack({ config: (mockUrl) => configServedBy(mockUrl, 'thinking', `${p.origin}/v1`) });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0, defaultHeaders: { 'x-stormgate-timeout-ms': '1000' } });
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    for await (const _ of stream) {
      // read to the end
    }
    expect(s.logs.join('')).toContain('"startedEarly":true');
    const { count, sum } = await ttft(s);
    expect(count).toBe(1);
    expect(sum).toBeGreaterThanOrEqual(1.4);
  });

  it('measures from the request\'s arrival: a retried stream\'s failed attempt and backoff are in it', async () => {
    // The first answer is a 503 at once; the retry waits 300 ms (fixed backoff), then streams after 300 ms.
    const s = await startStack({
      faults: { latencyMs: 300, errors: [{ status: 503, times: 1 }] },
      ...RETRY_LOOP_ONLY,
      route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 300, capMs: 300 } } },
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    for await (const _ of stream) {
      // read to the end
    }
    expect(s.mock.stats().total).toBe(2);
    const { count, sum } = await ttft(s);
    expect(count).toBe(1);
    // The 300 ms wait and the 300 ms answer: at least 0.55 s, where the answering attempt alone took ~0.3 s.
    expect(sum).toBeGreaterThanOrEqual(0.55);
  });
});
