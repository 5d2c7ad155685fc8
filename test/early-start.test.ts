// A stream on the client's own deadline starts at that deadline when its provider has begun answering but sent no
// token yet (pipeline/early-start.ts): the client gets the head in time, as it would from the provider directly; what
// is left of the attempt's firstTokenMs bounds the silence until the first token, and idleMs the gaps after it.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { chatChunk as chunk, eventStream, useFakeProviders, type FakeProvider } from './helpers/fake-provider.ts';
import { configServedBy, metricSum, requestLine, useStacks } from './helpers/stack.ts';

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

const gatewayTo = (p: FakeProvider, timeouts: { firstTokenMs?: number; idleMs?: number } = {}) =>
  startStack({
    config: (mockUrl) => {
      const c = configServedBy(mockUrl, 'thinking', `${p.origin}/v1`);
      c.providers.thinking!.timeouts = timeouts;
      return c;
    },
  });

/** A client whose SDK timeout is 1 s (the gateway's deadline, its margin taken off: 750 ms). */
const clientOf = (baseURL: string) => new OpenAI({ baseURL, apiKey: 'client-key', maxRetries: 0, defaultHeaders: { 'x-stormgate-timeout-ms': '1000' } });

/** Reads a chat stream to its end: its text and finish_reason, or the error it ended with. */
async function readChat(stream: AsyncIterable<OpenAI.Chat.Completions.ChatCompletionChunk>): Promise<{ text: string; finish?: string; error?: Error }> {
  let text = '';
  let finish: string | undefined;
  try {
    for await (const c of stream) {
      text += c.choices[0]?.delta?.content ?? '';
      finish = c.choices[0]?.finish_reason ?? finish;
    }
  } catch (error) {
    return { text, error: error as Error };
  }
  return { text, ...(finish !== undefined && { finish }) };
}

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

  it('ends with an error event the SDK raises when the provider then stays silent past firstTokenMs', async () => {
    const p = await thinkingProvider(undefined);
    const s = await gatewayTo(p, { firstTokenMs: 1_500, idleMs: 500 });
    const stream = await clientOf(s.baseURL).chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    const { error } = await readChat(stream);
    expect(String(error)).toMatch(/stalled/);
    expect(p.hits()).toBe(1);
    expect(s.logs.join('')).toMatch(/"startedEarly":true.*"streamEnd":"stalled"|"streamEnd":"stalled".*"startedEarly":true/);
  });
});

/** A stream call whose head comes at the client's deadline (1 s), well before its first token; resolves its whole text. */
async function wholeAnswerStartedEarly(call: () => Promise<{ data: AsyncIterable<OpenAI.Chat.Completions.ChatCompletionChunk>; response: Response }>): Promise<string> {
  const started = Date.now();
  const { data: stream, response } = await call();
  expect(Date.now() - started).toBeLessThan(1_800);
  const got = await readChat(stream);
  expect(response.status).toBe(200);
  expect(got.error).toBeUndefined();
  expect(got.finish).toBe('stop');
  expect(got.text.length).toBeGreaterThan(0);
  return got.text;
}

describe('a stream started at the client\'s deadline, from a model that thinks past it (the bundled mock)', () => {
  /** The mock sends its headers and role chunk at once, and its first token `thinkMs` later; idleMs is far shorter. */
  const thinking = (thinkMs: number) =>
    startStack({ faults: { stream: { firstTokenDelayMs: thinkMs, chunks: 3 } }, provider: { breaker: false, timeouts: { firstTokenMs: 3_000, idleMs: 400 } } });

  it('waits for the first token as long as firstTokenMs allows, not idleMs: the whole answer comes', async () => {
    // Started at ~750 ms; the first token at ~2 s is over 1 s of silence later, past idleMs, within firstTokenMs.
    const s = await thinking(2_000);
    await wholeAnswerStartedEarly(() => clientOf(s.baseURL).chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true }).withResponse());
    const line = await requestLine(s);
    expect(line).toMatchObject({ startedEarly: true, streamEnd: 'complete' });
    // Its time to first token is the token's, not the early start's.
    expect(line.ttftMs).toBeGreaterThanOrEqual(1_900);
    expect(await metricSum(s, 'stormgate_ttft_seconds_sum{route="chat"}')).toBeGreaterThanOrEqual(1.9);
    expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="complete"}')).toBe(1);
  });

  it('ends with the stall error event once the attempt\'s firstTokenMs has passed without a token, counted from its start', async () => {
    const s = await thinking(10_000);
    const started = Date.now();
    const stream = await clientOf(s.baseURL).chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    const { error, text } = await readChat(stream);
    const endedAfterMs = Date.now() - started;
    expect(String(error)).toMatch(/stalled: no first token within 3000 ms/);
    expect(text).toBe('');
    // firstTokenMs from the attempt's start (not from the early start, 750 ms later); a loaded machine's lag allowed.
    expect(endedAfterMs).toBeGreaterThanOrEqual(2_900);
    expect(endedAfterMs).toBeLessThan(4_500);
    const line = await requestLine(s);
    expect(line).toMatchObject({ startedEarly: true, streamEnd: 'stalled', outcome: 'stream_error' });
    expect(line.ttftMs).toBeUndefined();
    expect(await metricSum(s, 'stormgate_ttft_seconds_count{route="chat"}')).toBe(0);
    expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="stalled"}')).toBe(1);
  });
});

describe('a stream under an Idempotency-Key, from a model that thinks past the client\'s timeout', () => {
  // The run is bounded by the route's timeout, not the client's (its repeats wait for its answer), but the client's
  // timeout still starts its stream: held to its first token, the SDK gave up at 1 s, its retries found the run still
  // going (409 after 409), and the answer was kept for no one.
  it('starts at the client\'s deadline as without a key; the answer is kept, and a repeat gets it again', async () => {
    const s = await startStack({ faults: { stream: { firstTokenDelayMs: 2_000, chunks: 3 } }, provider: { breaker: false, timeouts: { firstTokenMs: 5_000, idleMs: 400 } } });
    // The SDK's timeout as a call passes it (sent as x-stainless-timeout: 1).
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    const body = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'hi' }], stream: true as const };
    const headers = { 'Idempotency-Key': 'thinking-call-1' };
    const text = await wholeAnswerStartedEarly(() => client.chat.completions.create(body, { headers, timeout: 1_000 }).withResponse());
    expect(await requestLine(s)).toMatchObject({ startedEarly: true, streamEnd: 'complete', idempotency: 'run' });
    // The answer was kept: the repeat gets it again, byte for byte, and nothing more goes upstream.
    const again = await client.chat.completions.create(body, { headers, timeout: 5_000 }).withResponse();
    expect(again.response.headers.get('idempotent-replayed')).toBe('true');
    expect((await readChat(again.data)).text).toBe(text);
    expect(s.mock.requests().filter((r) => r.path === '/v1/chat/completions')).toHaveLength(1);
  });
});
