// Third-party failure-scenario suite 49: an outside team's suite, written from the README ("Retries", "Streaming",
// "Errors", "Failover and API families") for a gateway whose upstream is an OpenAI-COMPATIBLE server, each played
// byte for byte by a scripted node:http upstream on 127.0.0.1 (test/helpers/scripted-upstreams.ts), with the official
// `openai` 6.x SDK as the client through the gateway. Quirks are taken from what the servers send on the wire:
//  - vLLM: the flat `{"object":"error","message","type":"BadRequestError","code":400}` to a stream request, its 503
//    `ServiceUnavailableError` while sleeping, `finish_reason: "abort"` on every whole answer.
//  - Ollama (before 0.1.39 and SGLang): `finish_reason: ""` on every chunk until the last, no `[DONE]`, the
//    connection left open; its 404 "model not found, try pulling it first" for a model the config names.
//  - llama.cpp's llama-server: its 503 `unavailable_error` "Loading model" to a stream, the `timings` object on the
//    last chunk beside the usage.
//  - Hugging Face TGI: a 422 "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096" as a bare
//    string error, read as a context-length error.
//  - OpenRouter: `: OPENROUTER PROCESSING` comments before the first token, its usage chunk with `cost`, a
//    mid-stream error chunk with a numeric code inside an HTTP 200, its 402 for credits to a stream request.
//  - Groq: 429s whose only hint is `x-ratelimit-reset-requests: 2m59.56s` or `x-ratelimit-reset-tokens: 1.5s`.
//  - Together / Fireworks: 503s with Envoy's text/plain body and a bare `Service Unavailable`.
//  - LM Studio: "No models loaded" as a 404 (0.3.x) and as a 400 with `param: "model"` (later builds).
// Each scenario asserts what a gateway user sees: the answer after a retry, or the final status with an
// OpenAI-shaped error (type, code), x-should-retry, x-stormgate-attempts, the upstream attempts the fake counted,
// usage passed through, and streams ended properly.
// Found here: OpenRouter's in-band error with numeric code 429 was read as a broken stream, not the 429 it stands for
// (fixed). A design question, asserted as the gateway behaves today: LM Studio's 400 "No models loaded" (no failover).
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { streamedText } from './helpers/chat-stream.ts';
import { expectOpenAIError, sdkError } from './helpers/openai-error.ts';
import { cc, completion, delta, DONE, failsThen, healthy, json, type Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams, type UpstreamsGateway } from './helpers/scripted-upstreams.ts';
import { metricSum, requestLine } from './helpers/stack.ts';

const gw = useScriptedUpstreams();
const messages = [{ role: 'user' as const, content: 'Summarise the incident.' }];
const ONE = [{ provider: 'a' }];

type Chunk = OpenAI.Chat.Completions.ChatCompletionChunk;

/** A raw chat call over fetch, for what the SDK hides (the exact body, the headers, the stream's last bytes). */
async function raw(g: UpstreamsGateway, body: Record<string, unknown>) {
  const r = await fetch(`${g.s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ messages, ...body }) });
  return { status: r.status, headers: r.headers, text: await r.text() };
}

/** A chunk as a server that is not OpenAI frames it (its own id and fingerprint, extra top-level fields). */
const chunk = (choices: unknown[], extra: Record<string, unknown> = {}) =>
  `data: ${JSON.stringify({ id: 'chatcmpl-693', object: 'chat.completion.chunk', created: 1715427619, model: 'llama3.2', system_fingerprint: 'fp_ollama', choices, ...extra })}\n\n`;

// ---------------------------------------------------------------------------------------------------------------
describe('vLLM', () => {
  const VLLM_400 = { object: 'error', message: "'messages' must contain at least one user message", type: 'BadRequestError', param: null, code: 400 };

  it("answers a stream request's flat BadRequestError (code 400) as the client's 400 in the OpenAI shape, once, the code a string", async () => {
    const g = await gw({ a: () => json(400, VLLM_400) }, ONE, { route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } } });
    const err = await sdkError(g.client.chat.completions.create({ model: 'Qwen/Qwen2.5-7B-Instruct', messages, stream: true }));
    expect(err.status).toBe(400);
    expect(err.code).toBe('400');
    expect(err.type).toBe('BadRequestError');
    expect(err.message).toContain("'messages' must contain at least one user message");
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(g.seen.a).toHaveLength(1);
    // The body on the wire: exactly the four fields, `object` gone.
    const r = await raw(g, { model: 'Qwen/Qwen2.5-7B-Instruct', stream: true });
    expectOpenAIError(JSON.parse(r.text), '400', 'BadRequestError');
  });

  it("retries vLLM's 503 ServiceUnavailableError (the engine asleep) on a stream, and the SDK gets the second attempt's stream", async () => {
    const asleep = { object: 'error', message: 'The engine is sleeping; wake it up with /wake_up.', type: 'ServiceUnavailableError', param: null, code: 503 };
    const g = await gw({ a: failsThen(1, () => json(503, asleep), 'awake now') }, ONE);
    const { data: stream, response } = await g.client.chat.completions.create({ model: 'Qwen/Qwen2.5-7B-Instruct', messages, stream: true }).withResponse();
    const { text, err } = await streamedText(stream);
    expect(err).toBeUndefined();
    expect(text).toBe('awake now');
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(g.seen.a).toHaveLength(2);
    expect(g.seen.a![1]!.headers['x-retry-reason']).toBe('status_503');
  });

  it('answers 502 upstream_bad_response when every whole answer finished with "abort" (the replica draining), after maxAttempts', async () => {
    const g = await gw({ a: () => completion('half an ans', 'Qwen/Qwen2.5-7B-Instruct', 'abort') }, ONE);
    const err = await sdkError(g.client.chat.completions.create({ model: 'Qwen/Qwen2.5-7B-Instruct', messages }));
    expect(err.status).toBe(502);
    expect(err.code).toBe('upstream_bad_response');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.headers?.get('x-stormgate-attempts')).toBe('2');
    expect(g.seen.a).toHaveLength(2);
  });

  it('fails a stream whose every attempt aborts before any output over to the backup, which streams the answer', async () => {
    const abortFirst = (): Script => ({ steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({}, 'abort')]), DONE] });
    const g = await gw({ a: abortFirst, b: healthy('from the backup') }, [{ provider: 'a' }, { provider: 'b', model: 'gpt-4o-mini' }]);
    const { data: stream, response } = await g.client.chat.completions.create({ model: 'Qwen/Qwen2.5-7B-Instruct', messages, stream: true }).withResponse();
    const { text, err } = await streamedText(stream);
    expect(err).toBeUndefined();
    expect(text).toBe('from the backup');
    expect(response.headers.get('x-stormgate-target')).toContain('b');
    expect(response.headers.get('x-stormgate-attempts')).toBe('3');
    expect(g.seen.a).toHaveLength(2);
    expect(g.seen.b).toHaveLength(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('Ollama (and SGLang): finish_reason "" until the last chunk, no [DONE]', () => {
  const ollamaStream = (hold: boolean): Script => ({
    steps: [
      chunk([{ index: 0, delta: { role: 'assistant', content: ' Hello' }, finish_reason: '' }]),
      chunk([{ index: 0, delta: { role: 'assistant', content: ' there' }, finish_reason: '' }]),
      chunk([{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: 'stop' }]),
    ],
    hold,
  });

  it('ends a stream whose server finished but leaves the connection open without [DONE]: the SDK gets the whole text and a clean end, in seconds', async () => {
    const g = await gw({ a: () => ollamaStream(true) }, ONE, { provider: { timeouts: { connectMs: 1_000, firstTokenMs: 5_000, idleMs: 30_000 } } });
    const t0 = Date.now();
    const r = await raw(g, { model: 'llama3.2', stream: true });
    // The end comes from the finish and a quiet second, not from idleMs (30 s).
    expect(Date.now() - t0).toBeLessThan(10_000);
    expect(r.status).toBe(200);
    expect(r.text.trimEnd().endsWith('data: [DONE]')).toBe(true);
    expect(r.text).not.toContain('stream_interrupted');
    // The "" finishes go on as they came: the gateway does not rewrite the server's chunks.
    expect(r.text).toContain('"finish_reason":""');
    expect(g.seen.a).toHaveLength(1);
  });

  it('ends a stream cut after "" finishes only (no real finish) with an error the SDK raises, never a clean end', async () => {
    const cut = (): Script => ({
      steps: [chunk([{ index: 0, delta: { role: 'assistant', content: ' Hello' }, finish_reason: '' }]), chunk([{ index: 0, delta: { content: ' th' }, finish_reason: '' }]), 30, { destroy: true }],
    });
    const g = await gw({ a: cut }, ONE);
    const { text, err } = await streamedText(await g.client.chat.completions.create({ model: 'llama3.2', messages, stream: true }));
    expect(text).toBe(' Hello th');
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('stream_interrupted');
    expect(g.seen.a).toHaveLength(1);
  });

  it("fails Ollama's 404 'not found, try pulling it first' for a model the config names over to the backup", async () => {
    const notPulled = { error: { message: 'model "llama3.2:70b" not found, try pulling it first', type: 'api_error', param: null, code: null } };
    const g = await gw({ a: () => json(404, notPulled), b: healthy('from the cloud') }, [{ provider: 'a', model: 'llama3.2:70b' }, { provider: 'b', model: 'gpt-4o-mini' }]);
    const res = await g.client.chat.completions.create({ model: 'local-chat', messages }).withResponse();
    expect(res.data.choices[0]!.message.content).toBe('from the cloud');
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('error');
    expect(g.seen.a).toHaveLength(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe("llama.cpp's llama-server", () => {
  const LOADING = { error: { code: 503, message: 'Loading model', type: 'unavailable_error' } };
  const usage = { completion_tokens: 3, prompt_tokens: 11, total_tokens: 14 };
  const timings = { prompt_n: 11, prompt_ms: 41.2, predicted_n: 3, predicted_ms: 58.9, predicted_per_second: 50.9 };
  const llamaStream = (): Script => ({
    steps: [
      cc([delta({ role: 'assistant', content: null })]),
      cc([delta({ content: 'Disk ' })]),
      cc([delta({ content: 'full.' })]),
      cc([delta({}, 'stop')], { usage, timings }),
      DONE,
    ],
  });
  const threeAttempts = { route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed' as const, baseMs: 5, capMs: 5 } } } };

  it("retries the 503 'Loading model' twice on a stream, then passes the stream with its usage and timings on the last chunk", async () => {
    const g = await gw({ a: (_b, n) => (n <= 2 ? json(503, LOADING) : llamaStream()) }, ONE, threeAttempts);
    const { data: stream, response } = await g.client.chat.completions
      .create({ model: 'qwen2.5-7b-instruct-q4_k_m.gguf', messages, stream: true, stream_options: { include_usage: true } })
      .withResponse();
    const { text, err, chunks } = await streamedText(stream);
    expect(err).toBeUndefined();
    expect(text).toBe('Disk full.');
    const last = chunks.at(-1)! as Chunk & { timings?: unknown };
    expect(last.usage).toEqual(usage);
    expect(last.timings).toEqual(timings);
    expect(response.headers.get('x-stormgate-attempts')).toBe('3');
    expect(g.seen.a).toHaveLength(3);
    // Usage counted for the dashboards: the finish chunk's, once.
    expect(await metricSum(g.s, 'stormgate_tokens_total')).toBe(14);
  });

  it("answers a lone server still loading after maxAttempts with its 503 in the OpenAI shape: unavailable_error, code '503', x-should-retry false", async () => {
    const g = await gw({ a: () => json(503, LOADING) }, ONE, threeAttempts);
    const err = await sdkError(g.client.chat.completions.create({ model: 'qwen2.5-7b-instruct-q4_k_m.gguf', messages, stream: true }));
    expect(err.status).toBe(503);
    expect(err.type).toBe('unavailable_error');
    expect(err.code).toBe('503');
    expect(err.message).toContain('Loading model');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.headers?.get('x-stormgate-attempts')).toBe('3');
    expect(g.seen.a).toHaveLength(3);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('Hugging Face TGI', () => {
  it("sends TGI's 422 'inputs tokens + max_new_tokens must be <= 4096' (a bare string error) to the contextWindowFallback", async () => {
    const tooLong = { error: 'Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 3990 `inputs` tokens and 512 `max_new_tokens`', error_type: 'validation' };
    const g = await gw({ a: () => json(422, tooLong), big: healthy('from the long-context model') }, ONE, {
      route: { contextWindowFallback: { provider: 'big', model: 'gpt-4.1' } },
    });
    const res = await g.client.chat.completions.create({ model: 'tgi', messages }).withResponse();
    expect(res.data.choices[0]!.message.content).toBe('from the long-context model');
    expect(g.seen.a).toHaveLength(1);
    expect(g.seen.big).toHaveLength(1);
    expect(g.seen.big![0]!.body.model).toBe('gpt-4.1');
  });

  it("passes the same 422 on without a contextWindowFallback, never retried, its text as the message", async () => {
    const tooLong = { error: 'Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 3990 `inputs` tokens and 512 `max_new_tokens`', error_type: 'validation' };
    const g = await gw({ a: () => json(422, tooLong) }, ONE);
    const r = await raw(g, { model: 'tgi' });
    expect(r.status).toBe(422);
    expect(r.headers.get('x-should-retry')).toBe('false');
    const e = JSON.parse(r.text).error;
    expect(e.message).toBe(tooLong.error);
    expect(Object.keys(e).sort()).toEqual(['code', 'message', 'param', 'type']);
    expect(g.seen.a).toHaveLength(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('OpenRouter', () => {
  const orUsage = { prompt_tokens: 9, completion_tokens: 2, total_tokens: 11, cost: 0.0000132, is_byok: false, prompt_tokens_details: { cached_tokens: 0 } };

  it("streams through ': OPENROUTER PROCESSING' comments before the first token, and passes its usage chunk (cost included) on", async () => {
    const withComments = (): Script => ({
      steps: [
        ': OPENROUTER PROCESSING\n\n',
        200,
        ': OPENROUTER PROCESSING\n\n',
        200,
        cc([delta({ role: 'assistant', content: '' })]),
        cc([delta({ content: 'All clear.' })]),
        cc([delta({}, 'stop', 0, { native_finish_reason: 'stop' })]),
        cc([], { usage: orUsage, provider: 'DeepInfra' }),
        DONE,
      ],
    });
    const g = await gw({ a: withComments }, ONE);
    const { data: stream, response } = await g.client.chat.completions
      .create({ model: 'meta-llama/llama-3.3-70b-instruct', messages, stream: true, stream_options: { include_usage: true } })
      .withResponse();
    const { text, err, chunks } = await streamedText(stream);
    expect(err).toBeUndefined();
    expect(text).toBe('All clear.');
    expect(chunks.at(-1)!.usage).toEqual(orUsage);
    expect(response.headers.get('x-stormgate-attempts')).toBe('1');
    expect(g.seen.a).toHaveLength(1);
  });

  it('raises a mid-stream error chunk (HTTP 200, numeric code 502, finish_reason "error") in the SDK with its message and the code as a string', async () => {
    const midError = (): Script => ({
      steps: [
        cc([delta({ role: 'assistant', content: '' })]),
        cc([delta({ content: 'The root cause ' })]),
        30,
        `data: ${JSON.stringify({ id: 'gen-1', object: 'chat.completion.chunk', created: 1, model: 'x', error: { code: 502, message: 'Provider disconnected unexpectedly' }, choices: [{ index: 0, delta: { content: '' }, finish_reason: 'error' }] })}\n\n`,
        DONE,
      ],
    });
    const g = await gw({ a: midError, b: healthy('never') }, [{ provider: 'a' }, { provider: 'b' }]);
    const { text, err } = await streamedText(await g.client.chat.completions.create({ model: 'anthropic/claude-3.5-sonnet', messages, stream: true }));
    expect(text).toBe('The root cause ');
    expect(err).toBeInstanceOf(OpenAI.APIError);
    const e = err as InstanceType<typeof OpenAI.APIError>;
    expect(e.message).toContain('Provider disconnected unexpectedly');
    expect(e.code).toBe('502');
    // After the first output nothing is sent again, not even to the backup.
    expect(g.seen.a).toHaveLength(1);
    expect(g.seen.b).toHaveLength(0);
  });

  it('reads an in-band error chunk with numeric code 429 before any output as the 429 it stands for: retried as a rate limit, then passed on as one', async () => {
    // OpenRouter's error `code` is a number, the HTTP status it stands for ("429: You are being rate limited"), and once
    // its stream has begun it sends the error in a 200. Read as a broken stream, it was a 502 upstream_bad_response and
    // counted against the breaker, where the provider said it was rate limited (found by this suite, fixed).
    const rateLimited = (): Script => ({
      steps: [
        cc([delta({ role: 'assistant', content: '' })]),
        `data: ${JSON.stringify({ id: 'gen-2', object: 'chat.completion.chunk', created: 1, model: 'x', error: { code: 429, message: 'Rate limit exceeded: free-models-per-min.' }, choices: [{ index: 0, delta: { content: '' }, finish_reason: 'error' }] })}\n\n`,
        DONE,
      ],
    });
    const g = await gw({ a: rateLimited }, ONE);
    const err = await sdkError(g.client.chat.completions.create({ model: 'meta-llama/llama-3.3-70b-instruct:free', messages, stream: true }));
    expect(err.status).toBe(429);
    expect(err.type).toBe('rate_limit_error');
    expect(err.code).toBe('429');
    expect(err.message).toContain('Rate limit exceeded: free-models-per-min.');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.headers?.get('x-stormgate-attempts')).toBe('2');
    expect(g.seen.a).toHaveLength(2);
  });

  it("answers a lone OpenRouter's 402 to a stream request with 502 upstream_auth_error: one attempt, x-should-retry false, no retry-after, none of its body", async () => {
    const credits = { error: { code: 402, message: 'This request requires more credits, or fewer max_tokens. You requested up to 4096 tokens, but can only afford 1717.', metadata: { provider_name: null } } };
    const g = await gw({ a: () => json(402, credits) }, ONE, { route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } } });
    const err = await sdkError(g.client.chat.completions.create({ model: 'openai/gpt-4o', messages, stream: true }));
    expect(err.status).toBe(502);
    expect(err.code).toBe('upstream_auth_error');
    expect(err.message).not.toContain('afford');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.headers?.get('retry-after')).toBeNull();
    expect(g.seen.a).toHaveLength(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('Groq: the reset headers as the only hint', () => {
  const GROQ_429 = { error: { message: 'Rate limit reached for model `llama-3.3-70b-versatile` in organization `org_01` service tier `on_demand` on requests per minute (RPM): Limit 30, Used 30, Requested 1. Please try again in 2m59.56s.', type: 'requests', code: 'rate_limit_exceeded' } };

  it("reads x-ratelimit-reset-tokens: 1.5s (tokens remaining 0; requests remaining, their 2m59.56s reset ignored), waits it, and is answered", async () => {
    const headers = {
      'x-ratelimit-limit-requests': '14400',
      'x-ratelimit-remaining-requests': '14370',
      'x-ratelimit-reset-requests': '2m59.56s',
      'x-ratelimit-limit-tokens': '6000',
      'x-ratelimit-remaining-tokens': '0',
      'x-ratelimit-reset-tokens': '1.5s',
    };
    const g = await gw({ a: failsThen(1, () => json(429, { error: { ...GROQ_429.error, type: 'tokens' } }, headers), 'after the reset') }, ONE);
    const t0 = Date.now();
    const res = await g.client.chat.completions.create({ model: 'llama-3.3-70b-versatile', messages }).withResponse();
    const took = Date.now() - t0;
    expect(res.data.choices[0]!.message.content).toBe('after the reset');
    expect(took).toBeGreaterThanOrEqual(1_450);
    expect(took).toBeLessThan(10_000);
    expect(g.seen.a).toHaveLength(2);
  });

  it('passes a 429 whose retry-after (7 s) is past maxWaitHintMs on at once with x-should-retry true, then holds the target off without a request', async () => {
    const g = await gw({ a: () => json(429, GROQ_429, { 'retry-after': '7' }) }, ONE, {
      route: { retry: { maxAttempts: 2, maxWaitHintMs: 5_000, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } },
    });
    const first = await raw(g, { model: 'llama-3.3-70b-versatile' });
    expect(first.status).toBe(429);
    expect(Number(first.headers.get('retry-after'))).toBeGreaterThanOrEqual(7);
    expect(Number(first.headers.get('retry-after'))).toBeLessThanOrEqual(10);
    expect(first.headers.get('x-should-retry')).toBe('true');
    expect(first.headers.get('x-stormgate-attempts')).toBe('1');
    expectOpenAIError(JSON.parse(first.text), 'rate_limit_exceeded', 'requests');
    // A client that comes back as told, early, meets the hold-off, not Groq.
    const second = await raw(g, { model: 'llama-3.3-70b-versatile' });
    expect(second.status).toBe(429);
    expect(second.headers.get('x-should-retry')).toBe('true');
    expectOpenAIError(JSON.parse(second.text), 'provider_held_off', 'rate_limit_error');
    expect(g.seen.a).toHaveLength(1);
  });

  it("does not wait a requests reset of 2m59.56s (past maxWaitHintMs): the client gets the 429 at once with retry-after 180", async () => {
    const headers = { 'x-ratelimit-limit-requests': '30', 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '2m59.56s' };
    const g = await gw({ a: () => json(429, GROQ_429, headers) }, ONE);
    const t0 = Date.now();
    const r = await raw(g, { model: 'llama-3.3-70b-versatile' });
    expect(Date.now() - t0).toBeLessThan(3_000);
    expect(r.status).toBe(429);
    expect(r.headers.get('retry-after')).toBe('180');
    // Three minutes is past the 60 s the gateway tells a client to come back within.
    expect(r.headers.get('x-should-retry')).toBe('false');
    const e = expectOpenAIError(JSON.parse(r.text), 'rate_limit_exceeded', 'requests');
    expect(e.message).toContain('2m59.56s');
    expect(g.seen.a).toHaveLength(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('Together and Fireworks: 503s that are not JSON', () => {
  const ENVOY_503 = 'upstream connect error or disconnect/reset before headers. retried and the latest reset reason: remote connection failure, transport failure reason: delayed connect error: 111';

  it("retries Together's text/plain Envoy 503 on a stream, and the SDK gets the retry's stream", async () => {
    const envoy = (): Script => ({ status: 503, headers: { 'content-type': 'text/plain', server: 'envoy' }, steps: [ENVOY_503] });
    const g = await gw({ a: failsThen(1, envoy, 'through envoy') }, ONE);
    const { text, err } = await streamedText(await g.client.chat.completions.create({ model: 'meta-llama/Llama-3.3-70B-Instruct-Turbo', messages, stream: true }));
    expect(err).toBeUndefined();
    expect(text).toBe('through envoy');
    expect(g.seen.a).toHaveLength(2);
  });

  it("answers a lone Fireworks' bare 'Service Unavailable' text after its retries as an OpenAI-shaped 503 wrapping the text", async () => {
    const bare = (): Script => ({ status: 503, headers: { 'content-type': 'text/plain; charset=utf-8' }, steps: ['Service Unavailable'] });
    const g = await gw({ a: bare }, ONE);
    const r = await raw(g, { model: 'accounts/fireworks/models/llama-v3p1-8b-instruct' });
    expect(r.status).toBe(503);
    expect(r.headers.get('x-should-retry')).toBe('false');
    expect(r.headers.get('x-stormgate-attempts')).toBe('2');
    const e = JSON.parse(r.text).error;
    expect(Object.keys(e).sort()).toEqual(['code', 'message', 'param', 'type']);
    expect(e.message).toBe('upstream answered 503: Service Unavailable');
    expect(g.seen.a).toHaveLength(2);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('LM Studio: no model loaded', () => {
  const NO_MODELS = 'No models loaded. Please load a model in the developer page or use the `lms load` command.';

  it('fails its 404 (0.3.x) for the model the config names over to the cloud backup', async () => {
    const g = await gw(
      { a: () => json(404, { error: { message: NO_MODELS, type: 'invalid_request_error', param: 'model', code: 'model_not_found' } }), b: healthy('from the cloud') },
      [{ provider: 'a', model: 'qwen2.5-7b-instruct' }, { provider: 'b', model: 'gpt-4o-mini' }],
    );
    const res = await g.client.chat.completions.create({ model: 'local-chat', messages }).withResponse();
    expect(res.data.choices[0]!.message.content).toBe('from the cloud');
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('error');
    expect(g.seen.a).toHaveLength(1);
  });

  it('passes its later 400 (param "model", no code) for the model the config names on to the client, with no failover (design question)', async () => {
    // DESIGN QUESTION: the README fails over a config-named model's 400 only when its code is model_not_found or
    // model_not_available. LM Studio's later builds answer "No models loaded" as a 400 with `param: "model"` and no
    // code, which is the server's state (nothing loaded), not the client's request, and the cloud backup beside it
    // is never tried. Asserted as the gateway behaves today.
    const g = await gw(
      { a: () => json(400, { error: { message: NO_MODELS, type: 'invalid_request_error', param: 'model' } }), b: healthy('from the cloud') },
      [{ provider: 'a', model: 'qwen2.5-7b-instruct' }, { provider: 'b', model: 'gpt-4o-mini' }],
    );
    const err = await sdkError(g.client.chat.completions.create({ model: 'local-chat', messages }));
    expect(err.status).toBe(400);
    expect(err.message).toContain('No models loaded');
    expect(err.param).toBe('model');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(g.seen.a).toHaveLength(1);
    expect(g.seen.b).toHaveLength(0);
  });

  it('passes a whole answer and its usage through, counted once for the dashboards', async () => {
    const g = await gw({ a: () => completion('Loaded and answering.', 'qwen2.5-7b-instruct') }, ONE);
    const res = await g.client.chat.completions.create({ model: 'qwen2.5-7b-instruct', messages });
    expect(res.choices[0]!.message.content).toBe('Loaded and answering.');
    expect(res.usage).toEqual({ prompt_tokens: 12, completion_tokens: 4, total_tokens: 16 });
    expect(await metricSum(g.s, 'stormgate_tokens_total')).toBe(16);
    const line = await requestLine(g.s);
    expect(line.usage).toBeDefined();
  });
});


// ---------------------------------------------------------------------------------------------------------------
describe('Usage on the finish chunk itself, no [DONE], the connection left open (Ollama, older llama-server)', () => {
  const usage = { prompt_tokens: 26, completion_tokens: 3, total_tokens: 29 };
  const finishWithUsage = (): Script => ({
    steps: [
      chunk([{ index: 0, delta: { role: 'assistant', content: 'All ' }, finish_reason: '' }]),
      chunk([{ index: 0, delta: { role: 'assistant', content: 'good.' }, finish_reason: '' }]),
      chunk([{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: 'stop' }], { usage }),
    ],
    hold: true,
  });
  const longIdle = { timeouts: { connectMs: 1_000, firstTokenMs: 5_000, idleMs: 30_000 } };

  it('ends the stream of a client that asked for usage in seconds, not idleMs: the usage it waits for has come with the finish', async () => {
    const g = await gw({ a: finishWithUsage }, ONE, { provider: longIdle });
    const t0 = Date.now();
    const { text, err, chunks } = await streamedText(await g.client.chat.completions.create({ model: 'llama3.2', messages, stream: true, stream_options: { include_usage: true } }));
    expect(Date.now() - t0).toBeLessThan(10_000);
    expect(err).toBeUndefined();
    expect(text).toBe('All good.');
    expect(chunks.at(-1)!.usage).toEqual(usage);
    expect(await metricSum(g.s, 'stormgate_tokens_total')).toBe(29);
  });

  it('with streamUsage (the client did not ask): ends in seconds, the usage cut from the client\'s chunk and counted', async () => {
    const g = await gw({ a: finishWithUsage }, ONE, { provider: { ...longIdle, streamUsage: true } });
    const t0 = Date.now();
    const { text, err, chunks } = await streamedText(await g.client.chat.completions.create({ model: 'llama3.2', messages, stream: true }));
    expect(Date.now() - t0).toBeLessThan(10_000);
    expect(err).toBeUndefined();
    expect(text).toBe('All good.');
    expect(chunks.at(-1)!.choices[0]!.finish_reason).toBe('stop');
    expect(chunks.at(-1)!.usage ?? undefined).toBeUndefined();
    expect((g.seen.a![0]!.body.stream_options as Record<string, unknown>).include_usage).toBe(true);
    expect(await metricSum(g.s, 'stormgate_tokens_total')).toBe(29);
  });
});
