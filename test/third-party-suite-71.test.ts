// Third-party failure-scenario suite 71: an outside team putting stormgate in front of OpenAI-COMPATIBLE services
// other than OpenAI (`family: openai` providers pointed at OpenRouter, DeepSeek, Mistral, Together), written from the
// README ("Retries" and its wait hints, "Streaming", "Errors") and from what those services put on the wire, found in
// their docs, their SDKs' types and the errors users post in issues. Driven with the official `openai` 6.x SDK over
// real HTTP on 127.0.0.1 against scripted upstreams (test/helpers/scripted-upstreams.ts). Earlier suites (11, 36, 49,
// 67, provider-quirks, stream-chunk-quirks, upstream-error-types, bare-ratelimit-reset) cover the error shapes, the
// SSE framings, the top-level `error` chunk with `finish_reason: "error"`, vLLM's `abort`; this one covers:
//  1. a finish_reason that says the provider stopped the answer, with no top-level `error` beside it: OpenRouter's
//     `"error"` (its choice types carry their own `error`; "error if the model finishes the request with an error"),
//     the same value in Mistral's and Together's finish reasons, and DeepSeek's documented
//     `"insufficient_system_resource"` ("the request is interrupted due to insufficient resource of the inference
//     system"). In a stream after the first output: never a clean end (the SDK raises); before it: a failed attempt,
//     retried; in a whole answer: a broken answer, retried, never handed to the SDK as a completion.
//  2. OpenRouter's 429 inside a 200 whole answer (`{"error":{"message":"Provider returned error","code":429,
//     "metadata":{"raw":"error code: 1015","provider_name":"Kluster"}},"user_id":...}`, BerriAI/litellm#8448): the
//     429 it stands for, as the same error in a stream's first event is (README "Streaming"): never a breaker failure,
//     the client's 429, not a 502.
//  3. OpenRouter's wait hint inside its 429's body, where its error metadata relays the limit's headers (its own
//     `free-models-per-day`: `"metadata":{"headers":{"X-RateLimit-Limit":"50","X-RateLimit-Remaining":"0",
//     "X-RateLimit-Reset":"<Unix ms>"}}`; a provider's upstream limit: `"retry_after_seconds":17,
//     "headers":{"Retry-After":"17"}`) with no such HTTP header, as Gemini's RetryInfo is read from its body.
// Found here: all three. (1) a finish_reason "error" or "insufficient_system_resource" was read as a clean finish:
// a cut answer reached the SDK complete, and an empty one before any output was the answer. (2) was a bad_stream:
// counted by the breaker (one OpenRouter brownout of rate limits opened it) and answered 502. (3) was no hint: the
// daily limit was retried at once and the client told no wait.
// Bounds are generous: a loaded 2-core machine.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { streamedText } from './helpers/chat-stream.ts';
import { expectOpenAIError, sdkError } from './helpers/openai-error.ts';
import { cc, completion, delta, DONE, healthy, json, type Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams, type UpstreamsGateway } from './helpers/scripted-upstreams.ts';

const gw = useScriptedUpstreams();
const messages = [{ role: 'user' as const, content: 'Summarise the incident.' }];
const ONE = [{ provider: 'a' }];

/** A raw chat call over fetch, for the stream's last bytes. */
async function raw(g: UpstreamsGateway, body: Record<string, unknown>) {
  const r = await fetch(`${g.s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ messages, ...body }) });
  return { status: r.status, headers: r.headers, text: await r.text() };
}

/** OpenRouter's chunk ending a choice with an error: the choice carries the error, finish_reason "error". */
const orChoiceError = (code: number, message: string) =>
  `data: ${JSON.stringify({
    id: 'gen-1747139735-abc',
    provider: 'Together',
    model: 'meta-llama/llama-3.3-70b-instruct',
    object: 'chat.completion.chunk',
    created: 1747139735,
    choices: [{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: 'error', native_finish_reason: 'error', logprobs: null, error: { code, message } }],
  })}\n\n`;

/** A stream that says some words, then ends the answer with `finish`, then [DONE]. */
const cutWith = (finish: string, last: string = cc([delta({}, finish)])): Script => ({
  steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'The outage began at ' })]), cc([delta({ content: '09:14 when' })]), last, DONE],
});

// ---------------------------------------------------------------------------------------------------------------
describe('a finish_reason that says the provider stopped the answer, without a top-level error', () => {
  it("OpenRouter's per-choice error (finish_reason \"error\") after the first output: the SDK raises, never a clean end that looks complete", async () => {
    const g = await gw({ a: () => cutWith('error', orChoiceError(502, 'Provider disconnected unexpectedly')) }, ONE);
    const stream = await g.client.chat.completions.create({ model: 'meta-llama/llama-3.3-70b-instruct', messages, stream: true });
    const { text, err } = await streamedText(stream);
    expect(text).toBe('The outage began at 09:14 when');
    expect(err).toBeInstanceOf(OpenAI.APIError);
    // On the wire: the gateway's error event, and no [DONE] after it.
    const r = await raw(g, { model: 'meta-llama/llama-3.3-70b-instruct', stream: true });
    expect(r.status).toBe(200);
    expect(r.text).not.toContain('[DONE]');
    const last = r.text.trim().split('\n\n').at(-1)!;
    expect(JSON.parse(last.replace(/^data: ?/, '')).error).toBeTruthy();
  });

  it('Mistral\'s and Together\'s bare finish_reason "error" after the first output ends the stream with the error event the SDK raises', async () => {
    const g = await gw({ a: () => cutWith('error') }, ONE);
    const { text, err } = await streamedText(await g.client.chat.completions.create({ model: 'mistral-large-latest', messages, stream: true }));
    expect(text).toBe('The outage began at 09:14 when');
    expect(err).toBeInstanceOf(OpenAI.APIError);
  });

  it("DeepSeek's finish_reason \"insufficient_system_resource\" after the first output: the answer was interrupted, the SDK raises", async () => {
    const g = await gw({ a: () => cutWith('insufficient_system_resource') }, ONE);
    const { text, err } = await streamedText(await g.client.chat.completions.create({ model: 'deepseek-chat', messages, stream: true }));
    expect(text).toBe('The outage began at 09:14 when');
    expect(err).toBeInstanceOf(OpenAI.APIError);
  });

  it('finish_reason "error" before any output is a failed attempt: retried, and the SDK gets the second attempt\'s whole answer', async () => {
    let n = 0;
    const g = await gw(
      { a: (body) => (++n === 1 ? { steps: [': OPENROUTER PROCESSING\n\n', orChoiceError(502, 'Provider returned error'), DONE] } : healthy('09:14, a bad deploy')(body, n)) },
      ONE,
    );
    const { data: stream, response } = await g.client.chat.completions.create({ model: 'meta-llama/llama-3.3-70b-instruct', messages, stream: true }).withResponse();
    const { text, err } = await streamedText(stream);
    expect(err).toBeUndefined();
    expect(text).toBe('09:14, a bad deploy');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(g.seen.a).toHaveLength(2);
  });

  it('a whole answer DeepSeek interrupted (insufficient_system_resource) is a broken answer: retried, and the retry\'s answer reaches the SDK', async () => {
    let n = 0;
    const g = await gw({ a: () => (++n === 1 ? completion('The outage began at', 'deepseek-chat', 'insufficient_system_resource') : completion('The outage began at 09:14.', 'deepseek-chat')) }, ONE);
    const { data, response } = await g.client.chat.completions.create({ model: 'deepseek-chat', messages }).withResponse();
    expect(data.choices[0]?.message.content).toBe('The outage began at 09:14.');
    expect(data.choices[0]?.finish_reason).toBe('stop');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
  });

  it('a whole answer that finished with "error" on every attempt: 502 upstream_bad_response with x-should-retry false, never an empty completion', async () => {
    const g = await gw({ a: () => completion('', 'mistral-large-latest', 'error') }, ONE);
    const err = await sdkError(g.client.chat.completions.create({ model: 'mistral-large-latest', messages }));
    expect(err.status).toBe(502);
    expect(err.code).toBe('upstream_bad_response');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(g.seen.a).toHaveLength(2);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe("OpenRouter's 429 inside a 200 whole answer (BerriAI/litellm#8448)", () => {
  const in200 = () =>
    json(200, { error: { message: 'Provider returned error', code: 429, metadata: { raw: 'error code: 1015', provider_name: 'Kluster' } }, user_id: 'user_2abc' });

  it('is the 429 it stands for: retried as one, then the client\'s 429 in the OpenAI shape, not a 502', async () => {
    const g = await gw({ a: in200 }, ONE);
    const err = await sdkError(g.client.chat.completions.create({ model: 'meta-llama/llama-3.3-70b-instruct', messages }));
    expect(err.status).toBe(429);
    expect(err.message).toContain('Provider returned error');
    expect(err.code).toBe('429');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(g.seen.a).toHaveLength(2);
    expect(g.seen.a![1]!.headers['x-retry-reason']).toBe('status_429');
    const r = await raw(g, { model: 'meta-llama/llama-3.3-70b-instruct' });
    expect(r.status).toBe(429);
    expectOpenAIError(JSON.parse(r.text), '429', 'rate_limit_error');
  });

  it('never opens the breaker, as a 429 answer does not: the next request still goes to OpenRouter', async () => {
    const g = await gw({ a: in200 }, ONE, { provider: { breaker: { consecutiveFailures: 1, openS: 30 } } });
    for (let i = 0; i < 3; i++) {
      const err = await sdkError(g.client.chat.completions.create({ model: 'meta-llama/llama-3.3-70b-instruct', messages }));
      expect(err.status).toBe(429);
    }
    expect(g.seen.a).toHaveLength(6);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe("OpenRouter's wait hint in its 429 body's metadata, with no such HTTP header", () => {
  it('free-models-per-day: the relayed X-RateLimit-Reset (Unix ms, hours away) is past maxWaitHintMs: one attempt, passed on with retry-after', async () => {
    const resetMs = Date.now() + 3 * 3600_000;
    const g = await gw(
      {
        a: () =>
          json(429, {
            error: {
              message: 'Rate limit exceeded: free-models-per-day. Add 10 credits to unlock 1000 free model requests per day',
              code: 429,
              metadata: { headers: { 'X-RateLimit-Limit': '50', 'X-RateLimit-Remaining': '0', 'X-RateLimit-Reset': String(resetMs) }, provider_name: null },
            },
            user_id: 'user_2abc',
          }),
      },
      ONE,
      { route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } } },
    );
    const err = await sdkError(g.client.chat.completions.create({ model: 'meta-llama/llama-3.3-70b-instruct:free', messages }));
    expect(err.status).toBe(429);
    expect(err.message).toContain('free-models-per-day');
    expect(g.seen.a).toHaveLength(1);
    const after = Number(err.headers?.get('retry-after'));
    expect(after).toBeGreaterThan(3 * 3600 - 120);
    expect(after).toBeLessThanOrEqual(3 * 3600 * 1.2 + 2);
    expect(err.headers?.get('x-should-retry')).toBe('false');
  });

  it("a provider's upstream limit relayed as retry_after_seconds and headers.Retry-After: waited out (about 1 s, not the backoff), then the retry answers", async () => {
    let n = 0;
    const at: number[] = [];
    const g = await gw(
      {
        a: (body) => {
          at.push(Date.now());
          if (++n > 1) return healthy('answered after the wait')(body, n);
          return json(429, {
            error: {
              message: 'Provider returned error',
              code: 429,
              metadata: {
                raw: 'meta-llama/llama-3.3-70b-instruct:free is temporarily rate-limited upstream. Please retry shortly',
                provider_name: 'Venice',
                is_byok: false,
                retry_after_seconds: 1,
                retry_after_seconds_raw: 0.807,
                headers: { 'Retry-After': '1' },
              },
            },
            user_id: 'user_2abc',
          });
        },
      },
      ONE,
    );
    const { data, response } = await g.client.chat.completions.create({ model: 'meta-llama/llama-3.3-70b-instruct:free', messages }).withResponse();
    expect(data.choices[0]?.message.content).toBe('answered after the wait');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(at[1]! - at[0]!).toBeGreaterThanOrEqual(950);
  });
});
