// A stream on the client's own deadline starts at that deadline when its provider has begun answering but sent no
// token yet (pipeline/early-start.ts): the client gets the head in time, as it would from the provider directly, and
// the stream is bounded by its idle timeout from there.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { chatChunk as chunk, eventStream, useFakeProviders, type FakeProvider } from './helpers/fake-provider.ts';
import { configServedBy, useStacks } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();

/** Sends the stream's headers at once and nothing else; `answerAfterMs` later (never, if undefined) the answer. */
function thinkingProvider(answerAfterMs: number | undefined): Promise<FakeProvider> {
  return startProvider(
    eventStream((res) => {
      res.flushHeaders();
      if (answerAfterMs === undefined) return;
      const timer = setTimeout(() => res.end(chunk({ role: 'assistant', content: 'Hello' }, null) + chunk({}, 'stop') + 'data: [DONE]\n\n'), answerAfterMs);
      res.on('close', () => clearTimeout(timer));
    }),
  );
}

const gatewayTo = (p: FakeProvider, idleMs = 30_000) =>
  startStack({
    config: (mockUrl) => {
      const c = configServedBy(mockUrl, 'thinking', `${p.origin}/v1`);
      c.providers.thinking!.timeouts = { idleMs };
      return c;
    },
  });

describe('a stream started at the client\'s deadline', () => {
  it('sends the head at the deadline, before any event, then the answer when it comes', async () => {
    // The first token comes well after the client's deadline (1 s; the gateway's, margin taken off: 750 ms), so a
    // head held for it cannot pass for one sent at the deadline, however late a loaded machine runs the timers.
    const p = await thinkingProvider(2_500);
    const s = await gatewayTo(p);
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0, defaultHeaders: { 'x-stormgate-timeout-ms': '1000' } });
    const started = Date.now();
    const { data: stream, response } = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true }).withResponse();
    const headAfterMs = Date.now() - started;
    let text = '';
    for await (const c of stream) text += c.choices[0]?.delta?.content ?? '';
    expect(response.status).toBe(200);
    // At the deadline: not before it (the gateway could still retry until then), nor with the first token. On a quiet
    // machine it comes at ~750 ms, before the client's 1 s; the upper bound leaves a loaded event loop a second of lag.
    expect(headAfterMs).toBeGreaterThanOrEqual(700);
    expect(headAfterMs).toBeLessThan(2_000);
    expect(text).toBe('Hello');
    expect(p.hits()).toBe(1);
    expect(s.logs.join('')).toContain('"startedEarly":true');
  });

  it('ends with an error event the SDK raises when the provider then stays silent past idleMs', async () => {
    const p = await thinkingProvider(undefined);
    const s = await gatewayTo(p, 500);
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0, defaultHeaders: { 'x-stormgate-timeout-ms': '1000' } });
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    const err = await (async () => {
      for await (const _ of stream) {
        // no events come
      }
    })().catch((e: unknown) => e as Error);
    expect(String(err)).toMatch(/stalled/);
    expect(p.hits()).toBe(1);
    expect(s.logs.join('')).toMatch(/"startedEarly":true.*"streamEnd":"stalled"|"streamEnd":"stalled".*"startedEarly":true/);
  });
});
