// An eleventh third-party failure-scenario suite, written from the README ("Retries", "Failover and API families",
// "Retry budget, circuit breaker, hold-offs", "Streaming", "What the client sees", "Errors") as a team whose gateway
// fronts HOSTED OpenAI-compatible providers would test it: Groq, DeepSeek, Mistral, Together, Fireworks, OpenRouter,
// xAI, Perplexity and Cerebras, as primaries and backups of each other and of OpenAI. Each one fails the way it does on
// the wire (shapes taken from their docs and from the errors users post in GitHub issues): Groq's 498 flex-tier
// capacity and its 413 "Request too large ... (TPM)", DeepSeek's 402 "Insufficient Balance" and the blank lines and
// `: keep-alive` comments it sends while busy, Mistral's flat errors (a 429 with no headers, a 422 whose message is an
// object, code 3505 "Service tier capacity exceeded"), OpenRouter's errors inside a 200 stream, its numeric codes, its
// 402/408/502 and moderation 403, Together's and Fireworks' overloads and HTML pages, xAI's `{"code","error"}` body,
// Cerebras' unwrapped `{"message","type","param","code"}`. Every scenario drives a real gateway over HTTP with the
// official `openai` SDK and counts what each scripted upstream (a node:http server on 127.0.0.1) received.
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { sdkError } from './helpers/openai-error.ts';
import { describe, expect, it } from 'vitest';
import { cc, completion, delta, DONE, failsThen, healthy, json, streamed, type Script } from './helpers/scripted-provider.ts';
import { countingClient, requestLine } from './helpers/stack.ts';
import { useScriptedUpstreams, type UpstreamsGateway } from './helpers/scripted-upstreams.ts';



const messages = [{ role: 'user' as const, content: 'Draft the release note.' }];

const html = (status: number, page: string): Script => ({ status, headers: { 'content-type': 'text/html' }, steps: [page] });

const gw = useScriptedUpstreams();
type Gw = UpstreamsGateway;

const chat = (g: Gw, model = 'llama-3.3-70b-versatile') => g.client.chat.completions.create({ model, messages }).withResponse();

// ---------------------------------------------------------------------------------------------------------------
// Wire shapes, as the providers send them.

/** Groq's 498 on the flex service tier: the tier is at capacity and the request was not processed. */
const GROQ_498 = {
  error: { message: 'Flex tier capacity exceeded. This is a known issue and we are working on it. Please try again later.', type: 'invalid_request_error', code: 'capacity_exceeded' },
};
/** Groq's 413: one request larger than the whole tokens-per-minute limit of the organisation's tier. */
const GROQ_413 = {
  error: {
    message:
      'Request too large for model `llama-3.3-70b-versatile` in organization `org_01hx` service tier `on_demand` on tokens per minute (TPM): Limit 6000, Requested 7431, please reduce your message size and try again. Need more tokens? Upgrade to Dev Tier today at https://console.groq.com/settings/billing',
    type: 'tokens',
    code: 'rate_limit_exceeded',
  },
};
const GROQ_429 = {
  error: {
    message:
      'Rate limit reached for model `llama-3.3-70b-versatile` in organization `org_01hx` service tier `on_demand` on requests per minute (RPM): Limit 30, Used 30, Requested 1. Please try again in 1s. Visit https://console.groq.com/docs/rate-limits for more information.',
    type: 'requests',
    code: 'rate_limit_exceeded',
  },
};
/** Groq's rate-limit headers: `retry-after` in seconds, resets in Go durations, per-day requests and per-minute tokens. */
const groqHeaders = (retryAfterS: number) => ({
  'retry-after': String(retryAfterS),
  'x-ratelimit-limit-requests': '14400',
  'x-ratelimit-limit-tokens': '6000',
  'x-ratelimit-remaining-requests': '14370',
  'x-ratelimit-remaining-tokens': '5811',
  'x-ratelimit-reset-requests': '2m59.56s',
  'x-ratelimit-reset-tokens': '1.89s',
});
const GROQ_503 = {
  error: {
    message: 'llama-3.3-70b-versatile is currently over capacity. Please try again and back off exponentially. Visit https://groqstatus.com to see if there is an ongoing incident.',
    type: 'internal_server_error',
    code: 'service_unavailable',
  },
};
const DEEPSEEK_402 = { error: { message: 'Insufficient Balance', type: 'unknown_error', param: null, code: 'invalid_request_error' } };
const DEEPSEEK_503 = { error: { message: 'Server overloaded, please try again later.', type: 'server_error', param: null, code: 'invalid_request_error' } };
const MISTRAL_429 = { object: 'error', message: 'Rate limit exceeded', type: 'rate_limited', param: null, code: '1300' };
const MISTRAL_CAPACITY = { object: 'error', message: 'Service tier capacity exceeded for this model.', type: 'service_tier_capacity_exceeded', param: null, code: '3505' };
/** The same capacity error as users saw it earlier, typed as the request's fault though it came as a 429. */
const MISTRAL_CAPACITY_OLD = { object: 'error', message: 'Service tier capacity exceeded for this model.', type: 'invalid_request_error', param: null, code: null };
const MISTRAL_422 = {
  object: 'error',
  message: { detail: [{ type: 'missing', loc: ['body', 'messages', 0, 'content'], msg: 'Field required', input: { role: 'user' } }] },
  type: 'invalid_request_message_error',
  param: null,
  code: null,
};
const OPENROUTER_402 = { error: { code: 402, message: 'Insufficient credits. Add more using https://openrouter.ai/settings/credits' }, user_id: 'user_2x9' };
const OPENROUTER_408 = { error: { code: 408, message: 'Timed out' }, user_id: 'user_2x9' };
const OPENROUTER_502 = {
  error: { code: 502, message: 'Provider returned error', metadata: { raw: 'upstream connect error or disconnect/reset before headers', provider_name: 'DeepInfra' } },
  user_id: 'user_2x9',
};
const OPENROUTER_MODERATION = {
  error: {
    code: 403,
    message: 'openai/gpt-4o requires moderation on OpenAI. Your input was flagged for "violence/graphic". No credits were charged.',
    metadata: { reasons: ['violence/graphic'], flagged_input: 'describe the crash scene in...', provider_name: 'OpenAI', model_slug: 'openai/gpt-4o' },
  },
  user_id: 'user_2x9',
};
const TOGETHER_503 = { id: 'o9X2kLm-2kFHot-9a1f', error: { message: 'The server is overloaded or not ready yet.', type: 'server_error', param: null, code: null } };
const TOGETHER_404 = {
  id: 'o9X2kLm-2kFHot-9a20',
  error: { message: 'Unable to access model meta-llama/Llama-3-70b-chat-hf. Please visit https://api.together.ai/models to view the list of supported models.', type: 'invalid_request_error', param: null, code: 'model_not_available' },
};
const FIREWORKS_500_HTML =
  '<!DOCTYPE html>\n<html><head><title>500 Internal Server Error</title></head><body><center><h1>500 Internal Server Error</h1></center><hr><center>cloudflare</center></body></html>\n';
const XAI_CREDITS_429 = {
  code: 'Some resource has been exhausted',
  error:
    'Your team 16f2151a-40f4-4a80-8ad0-cae00c27e8dd has either used all available credits or reached its monthly spending limit. To continue making API requests, please purchase more credits or raise your spending limit.',
};
const CEREBRAS_429 = { message: 'Requests per minute limit exceeded - too many requests sent.', type: 'too_many_requests_error', param: 'quota', code: 'request_quota_exceeded' };
const CEREBRAS_HEADERS = {
  'x-ratelimit-limit-requests-day': '14400',
  'x-ratelimit-limit-tokens-minute': '60000',
  'x-ratelimit-remaining-requests-day': '14302',
  'x-ratelimit-remaining-tokens-minute': '60000',
  'x-ratelimit-reset-requests-day': '33011.38',
  'x-ratelimit-reset-tokens-minute': '11.38',
};
const PERPLEXITY_401_HTML = '<html>\r\n<head><title>401 Authorization Required</title></head>\r\n<body>\r\n<center><h1>401 Authorization Required</h1></center>\r\n<hr><center>openresty/1.27.1.1</center>\r\n</body>\r\n</html>\r\n';

// ---------------------------------------------------------------------------------------------------------------
describe('Groq', () => {
  it('fails a 498 flex-tier capacity error over to the next target after one request: capacity_exceeded is the provider at capacity, not the request', async () => {
    const g = await gw({ groq: () => json(498, GROQ_498), together: healthy('from together') }, [{ provider: 'groq' }, { provider: 'together', model: 'meta-llama/Llama-3.3-70B-Instruct-Turbo' }]);
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const res = await client.chat.completions.create({ model: 'llama-3.3-70b-versatile', messages }).withResponse();
    expect(res.data.choices[0]!.message.content).toBe('from together');
    expect(res.response.headers.get('x-stormgate-target')).toContain('together');
    expect(counter.requests).toBe(1);
    expect(g.seen.groq).toHaveLength(1);
    expect(g.seen.together).toHaveLength(1);
  });

  it('passes a 498 on as it came when no other target can answer, not retried (498 is in no default retryOn), and tells the SDK not to retry', async () => {
    const g = await gw({ groq: () => json(498, GROQ_498) }, [{ provider: 'groq' }]);
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const err = await sdkError(client.chat.completions.create({ model: 'llama-3.3-70b-versatile', messages }));
    expect(err.status).toBe(498);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect((err.error as { code?: string }).code).toBe('capacity_exceeded');
    expect(counter.requests).toBe(1);
    expect(g.seen.groq).toHaveLength(1);
  });

  it("fails a 413 'Request too large ... TPM: Limit 6000, Requested 7431' over to the next target at once, never retried on Groq", async () => {
    const g = await gw({ groq: () => json(413, GROQ_413), deepseek: healthy('from deepseek', 'deepseek-chat') }, [{ provider: 'groq' }, { provider: 'deepseek', model: 'deepseek-chat' }], {
      route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5 } } },
    });
    const res = await chat(g);
    expect(res.data.choices[0]!.message.content).toBe('from deepseek');
    expect(res.data.model).toBe('deepseek-chat');
    expect(res.response.headers.get('x-stormgate-target')).toBe('deepseek/deepseek-chat');
    expect(g.seen.groq).toHaveLength(1);
    expect(g.seen.deepseek).toHaveLength(1);
  });

  it("answers a lone Groq's 413 as it came with x-should-retry false and no retry-after, and holds nothing off: the next small call goes through", async () => {
    const g = await gw({ groq: (body) => ((body.messages as unknown[]).length > 1 ? json(413, GROQ_413, { 'retry-after': '7' }) : completion('small one', 'llama-3.3-70b-versatile')) }, [{ provider: 'groq' }], {
      route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5 } } },
    });
    const big = Array.from({ length: 4 }, (_, i) => ({ role: 'user' as const, content: `chapter ${i} `.repeat(200) }));
    const err = await sdkError(g.client.chat.completions.create({ model: 'llama-3.3-70b-versatile', messages: big }));
    expect(err.status).toBe(413);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.headers?.get('retry-after')).toBeNull();
    expect(err.message).toContain('Limit 6000, Requested 7431');
    const t0 = Date.now();
    const small = await chat(g);
    expect(Date.now() - t0).toBeLessThan(1_000);
    expect(small.data.choices[0]!.message.content).toBe('small one');
    expect(g.seen.groq).toHaveLength(2);
    // The log says why: not a rate limit a wait ends.
    expect(JSON.stringify(await requestLine(g.s))).toContain('request_over_rate_limit');
  });

  it("waits out a lone Groq's 429 retry-after (1 s; its x-ratelimit-reset-requests of 2m59.56s is not the hint) and is answered on the retry", async () => {
    const g = await gw({ groq: failsThen(1, () => json(429, GROQ_429, groqHeaders(1)), 'after the wait') }, [{ provider: 'groq' }]);
    const t0 = Date.now();
    const res = await chat(g);
    const took = Date.now() - t0;
    expect(res.data.choices[0]!.message.content).toBe('after the wait');
    expect(took).toBeGreaterThanOrEqual(950);
    expect(took).toBeLessThan(8_000);
    expect(g.seen.groq).toHaveLength(2);
    expect(g.seen.groq![1]!.headers['x-retry-reason']).toBe('status_429');
  });

  it("moves to the backup at once on Groq's 429 with retry-after: 3, and sends the next request straight there while Groq is held off", async () => {
    // It moves on only where it can come back: parking on (README "Hold-offs").
    const g = await gw({ groq: () => json(429, GROQ_429, groqHeaders(3)), openai: healthy('from openai') }, [{ provider: 'groq' }, { provider: 'openai', model: 'gpt-4o-mini' }], {
      route: { park: { maxQueue: 100 } },
    });
    const t0 = Date.now();
    const first = await chat(g);
    expect(Date.now() - t0).toBeLessThan(1_500);
    expect(first.data.choices[0]!.message.content).toBe('from openai');
    const second = await chat(g);
    expect(second.response.headers.get('x-stormgate-fallback')).toBe('held_off');
    expect(g.seen.groq).toHaveLength(1);
    expect(g.seen.openai).toHaveLength(2);
  });

  it("retries Groq's 503 'over capacity' and, still over capacity, fails over to Fireworks (retries_exhausted)", async () => {
    const g = await gw({ groq: () => json(503, GROQ_503), fireworks: healthy('from fireworks') }, [{ provider: 'groq' }, { provider: 'fireworks', model: 'accounts/fireworks/models/llama-v3p3-70b-instruct' }]);
    const res = await chat(g);
    expect(res.data.choices[0]!.message.content).toBe('from fireworks');
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(g.seen.groq).toHaveLength(2);
    expect(g.seen.fireworks).toHaveLength(1);
  });

  it("gives the SDK a lone Groq's 503 after the gateway's own retries with x-should-retry false: 2 upstream requests, 1 SDK request", async () => {
    const g = await gw({ groq: () => json(503, GROQ_503) }, [{ provider: 'groq' }]);
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const err = await sdkError(client.chat.completions.create({ model: 'llama-3.3-70b-versatile', messages }));
    expect(err.status).toBe(503);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.message).toContain('over capacity');
    expect(counter.requests).toBe(1);
    expect(g.seen.groq).toHaveLength(2);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('DeepSeek', () => {
  it("takes a 402 'Insufficient Balance' (code invalid_request_error) as the gateway's billing: fails over, then skips DeepSeek while it is held", async () => {
    const g = await gw({ deepseek: () => json(402, DEEPSEEK_402), openai: healthy('from openai') }, [{ provider: 'deepseek' }, { provider: 'openai', model: 'gpt-4o' }]);
    const first = await chat(g, 'deepseek-chat');
    expect(first.data.choices[0]!.message.content).toBe('from openai');
    expect(first.response.headers.get('x-stormgate-fallback')).toBe('credentials');
    const second = await chat(g, 'deepseek-chat');
    expect(second.response.headers.get('x-stormgate-fallback')).toBe('credentials');
    expect(g.seen.deepseek).toHaveLength(1);
    expect(g.seen.openai).toHaveLength(2);
  });

  it("answers a lone DeepSeek's 402 with 502 upstream_auth_error, x-should-retry false and no retry-after", async () => {
    const g = await gw({ deepseek: () => json(402, DEEPSEEK_402) }, [{ provider: 'deepseek' }]);
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const err = await sdkError(client.chat.completions.create({ model: 'deepseek-chat', messages }));
    expect(err.status).toBe(502);
    expect((err.error as { code?: string }).code).toBe('upstream_auth_error');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.headers?.get('retry-after')).toBeNull();
    expect(counter.requests).toBe(1);
    expect(g.seen.deepseek).toHaveLength(1);
  });

  it("retries DeepSeek's 503 'Server overloaded' and is answered by the second attempt", async () => {
    const g = await gw({ deepseek: failsThen(1, () => json(503, DEEPSEEK_503), 'second time lucky') }, [{ provider: 'deepseek' }]);
    const res = await chat(g, 'deepseek-chat');
    expect(res.data.choices[0]!.message.content).toBe('second time lucky');
    expect(res.response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(g.seen.deepseek).toHaveLength(2);
  });

  it('reads a whole answer that DeepSeek keeps alive with blank lines before its JSON (as it does while busy) as the answer', async () => {
    const body = JSON.stringify({
      id: 'b1f0',
      object: 'chat.completion',
      created: 1741290958,
      model: 'deepseek-chat',
      choices: [{ index: 0, message: { role: 'assistant', content: 'after the blank lines' }, logprobs: null, finish_reason: 'stop' }],
      usage: { prompt_tokens: 10, completion_tokens: 4, total_tokens: 14 },
    });
    const g = await gw({ deepseek: () => ({ status: 200, headers: { 'content-type': 'application/json' }, steps: ['\n', 100, '\n', 100, '\n', body] }) }, [{ provider: 'deepseek' }]);
    const res = await chat(g, 'deepseek-chat');
    expect(res.data.choices[0]!.message.content).toBe('after the blank lines');
    expect(g.seen.deepseek).toHaveLength(1);
  });

  it("streams deepseek-reasoner's reasoning_content, sent after `: keep-alive` comments, before its content, to the SDK whole", async () => {
    const g = await gw(
      {
        deepseek: () => ({
          steps: [
            ': keep-alive\n\n',
            150,
            ': keep-alive\n\n',
            150,
            cc([delta({ role: 'assistant', content: null, reasoning_content: '' })]),
            cc([delta({ content: null, reasoning_content: 'The user wants ' })]),
            cc([delta({ content: null, reasoning_content: 'a release note.' })]),
            cc([delta({ content: 'v2.1: ', reasoning_content: null })]),
            cc([delta({ content: 'faster retries.', reasoning_content: null })]),
            cc([delta({ content: '', reasoning_content: null }, 'stop')], { usage: { prompt_tokens: 10, completion_tokens: 30, total_tokens: 40, completion_tokens_details: { reasoning_tokens: 20 } } }),
            DONE,
          ],
        }),
      },
      [{ provider: 'deepseek' }],
    );
    const stream = await g.client.chat.completions.create({ model: 'deepseek-reasoner', messages, stream: true });
    let reasoning = '';
    let text = '';
    for await (const chunk of stream) {
      const d = chunk.choices[0]?.delta as { content?: string | null; reasoning_content?: string | null } | undefined;
      reasoning += d?.reasoning_content ?? '';
      text += d?.content ?? '';
    }
    expect(reasoning).toBe('The user wants a release note.');
    expect(text).toBe('v2.1: faster retries.');
    expect(g.seen.deepseek).toHaveLength(1);
  });

  it('times out a DeepSeek stream that sends only `: keep-alive` past firstTokenMs, and fails it over to the backup', async () => {
    const g = await gw(
      { deepseek: () => ({ steps: Array.from({ length: 40 }, (_, i) => (i % 2 === 0 ? ': keep-alive\n\n' : 100)), hold: true }), openai: healthy('from openai') },
      [{ provider: 'deepseek' }, { provider: 'openai', model: 'gpt-4o' }],
      { providers: { deepseek: { timeouts: { connectMs: 1_000, firstTokenMs: 600, idleMs: 5_000 } } } },
    );
    const stream = await g.client.chat.completions.create({ model: 'deepseek-chat', messages, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text).toBe('from openai');
    // A silent target is not retried when another can answer (README "When a request moves on": timeout).
    expect(g.seen.deepseek).toHaveLength(1);
    expect(g.seen.openai).toHaveLength(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('Mistral', () => {
  it('retries a 429 that has no headers at all (the jittered backoff) and is answered on the retry', async () => {
    const g = await gw({ mistral: failsThen(1, () => json(429, MISTRAL_429), 'bonjour') }, [{ provider: 'mistral' }]);
    const res = await chat(g, 'mistral-large-latest');
    expect(res.data.choices[0]!.message.content).toBe('bonjour');
    expect(g.seen.mistral).toHaveLength(2);
  });

  it("answers a lone Mistral's headerless 429, after its retries, in the OpenAI shape with its message and code as they were", async () => {
    const g = await gw({ mistral: () => json(429, MISTRAL_429) }, [{ provider: 'mistral' }]);
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const err = await sdkError(client.chat.completions.create({ model: 'mistral-large-latest', messages }));
    expect(err.status).toBe(429);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.error).toMatchObject({ message: 'Rate limit exceeded', type: 'rate_limited', code: '1300' });
    expect(counter.requests).toBe(1);
    expect(g.seen.mistral).toHaveLength(2);
  });

  it.each([
    ['code 3505', MISTRAL_CAPACITY],
    ['typed invalid_request_error', MISTRAL_CAPACITY_OLD],
  ])("fails 'Service tier capacity exceeded for this model' (a 429, %s) over to the backup, never blamed on the client", async (_, body) => {
    const g = await gw({ mistral: () => json(429, body), together: healthy('from together') }, [{ provider: 'mistral' }, { provider: 'together', model: 'mistralai/Mixtral-8x22B-Instruct-v0.1' }]);
    const res = await chat(g, 'mistral-large-latest');
    expect(res.data.choices[0]!.message.content).toBe('from together');
    expect(g.seen.mistral!.length).toBeGreaterThanOrEqual(1);
    expect(g.seen.together).toHaveLength(1);
  });

  it("passes Mistral's 422 (its message an object of validation details) to the SDK as a 422 whose message is a string, never failed over", async () => {
    const g = await gw({ mistral: () => json(422, MISTRAL_422), openai: healthy('from openai') }, [{ provider: 'mistral' }, { provider: 'openai', model: 'gpt-4o' }]);
    const res = await fetch(`${g.s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'mistral-large-latest', messages }) });
    expect(res.status).toBe(422);
    expect(res.headers.get('x-should-retry')).toBe('false');
    const e = ((await res.json()) as { error: Record<string, unknown> }).error;
    expect(typeof e.message).toBe('string');
    expect(e.message).toContain('Field required');
    expect(e.type).toBe('invalid_request_message_error');
    const err = await sdkError(g.client.chat.completions.create({ model: 'mistral-large-latest', messages }));
    expect(err.status).toBe(422);
    expect(err.message).toContain('Field required');
    expect(g.seen.mistral).toHaveLength(2);
    expect(g.seen.openai).toHaveLength(0);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('OpenRouter', () => {
  /** OpenRouter's chunk for a provider that failed mid-generation: a top-level error beside finish_reason "error". */
  const orError = (code: number, message: string) =>
    `data: ${JSON.stringify({
      id: 'gen-1739458867-kUKF',
      provider: 'DeepInfra',
      model: 'meta-llama/llama-3.3-70b-instruct',
      object: 'chat.completion.chunk',
      created: 1739458867,
      error: { code, message, metadata: { provider_name: 'DeepInfra' } },
      choices: [{ index: 0, delta: { content: '' }, finish_reason: 'error', native_finish_reason: 'error' }],
    })}\n\n`;

  it('retries an error sent inside a 200 stream before any output (finish_reason "error"), and the SDK gets the second attempt\'s text', async () => {
    const g = await gw(
      {
        openrouter: failsThen(1, () => ({
          steps: [': OPENROUTER PROCESSING\n\n', cc([delta({ role: 'assistant', content: '' })]), orError(502, 'Provider disconnected'), DONE],
        }), 'second provider answered'),
      },
      [{ provider: 'openrouter' }],
    );
    const stream = await g.client.chat.completions.create({ model: 'meta-llama/llama-3.3-70b-instruct', messages, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text).toBe('second provider answered');
    expect(g.seen.openrouter).toHaveLength(2);
  });

  it('fails an OpenRouter stream whose only chunk is the in-band error over to the backup when it keeps failing', async () => {
    const g = await gw(
      { openrouter: () => ({ steps: [cc([delta({ role: 'assistant', content: '' })]), orError(503, 'No instances available'), DONE] }), openai: healthy('from openai') },
      [{ provider: 'openrouter' }, { provider: 'openai', model: 'gpt-4o' }],
    );
    const stream = await g.client.chat.completions.create({ model: 'meta-llama/llama-3.3-70b-instruct', messages, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text).toBe('from openai');
    expect(g.seen.openai).toHaveLength(1);
  });

  it('ends a stream whose in-band error comes after the first text with an error the SDK raises, the text so far delivered', async () => {
    const g = await gw(
      { openrouter: () => ({ steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'The release ' })]), 50, orError(502, 'Provider disconnected'), DONE] }) },
      [{ provider: 'openrouter' }],
    );
    const stream = await g.client.chat.completions.create({ model: 'meta-llama/llama-3.3-70b-instruct', messages, stream: true });
    let text = '';
    const err = await (async () => {
      try {
        for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
      } catch (e) {
        return e;
      }
      return undefined;
    })();
    expect(text).toBe('The release ');
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(g.seen.openrouter).toHaveLength(1);
  });

  it("passes ': OPENROUTER PROCESSING' comments and blank keep-alive lines before a whole answer as no answer problem", async () => {
    const g = await gw(
      {
        openrouter: (body) =>
          body.stream === true
            ? { steps: [': OPENROUTER PROCESSING\n\n', 100, ': OPENROUTER PROCESSING\n\n', ...streamed('streamed after processing').steps] }
            : { status: 200, headers: { 'content-type': 'application/json' }, steps: ['\n\n', 100, '\n\n', completion('whole after processing', 'openai/gpt-4o').steps[0]!] },
      },
      [{ provider: 'openrouter' }],
    );
    const whole = await chat(g, 'openai/gpt-4o');
    expect(whole.data.choices[0]!.message.content).toBe('whole after processing');
    const stream = await g.client.chat.completions.create({ model: 'openai/gpt-4o', messages, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text).toBe('streamed after processing');
    expect(g.seen.openrouter).toHaveLength(2);
  });

  it('takes a 402 with a numeric code ("Insufficient credits") as the billing of the gateway: fails over to OpenAI with credentials', async () => {
    const g = await gw({ openrouter: () => json(402, OPENROUTER_402), openai: healthy('from openai') }, [{ provider: 'openrouter' }, { provider: 'openai', model: 'gpt-4o' }]);
    const res = await chat(g, 'openai/gpt-4o');
    expect(res.data.choices[0]!.message.content).toBe('from openai');
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('credentials');
    expect(g.seen.openrouter).toHaveLength(1);
  });

  it("fails OpenRouter's 408 'Timed out' over to the next target (the provider's failure, like a 5xx), not retried when retryOn leaves 408 out", async () => {
    const g = await gw({ openrouter: () => json(408, OPENROUTER_408), openai: healthy('from openai') }, [{ provider: 'openrouter' }, { provider: 'openai', model: 'gpt-4o' }]);
    const res = await chat(g, 'openai/gpt-4o');
    expect(res.data.choices[0]!.message.content).toBe('from openai');
    expect(g.seen.openrouter).toHaveLength(1);
    expect(g.seen.openai).toHaveLength(1);
  });

  it("answers a lone OpenRouter's 502 'Provider returned error' after its retries with the message, the numeric code as a string, and x-should-retry false", async () => {
    const g = await gw({ openrouter: () => json(502, OPENROUTER_502) }, [{ provider: 'openrouter' }]);
    const res = await fetch(`${g.s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'openai/gpt-4o', messages }) });
    expect(res.status).toBe(502);
    expect(res.headers.get('x-should-retry')).toBe('false');
    const e = ((await res.json()) as { error: Record<string, unknown> }).error;
    expect(e.message).toBe('Provider returned error');
    expect(e.code).toBe('502');
    expect(g.seen.openrouter).toHaveLength(2);
  });

  it('passes a moderation 403 (input flagged) to the client as the content-policy decision it is: no failover, no credential hold', async () => {
    let flag = true;
    const g = await gw(
      { openrouter: (body) => (flag ? json(403, OPENROUTER_MODERATION) : healthy('clean input answered')(body, 0)), openai: healthy('from openai') },
      [{ provider: 'openrouter' }, { provider: 'openai', model: 'gpt-4o' }],
    );
    const err = await sdkError(g.client.chat.completions.create({ model: 'openai/gpt-4o', messages }));
    expect(err.status).toBe(403);
    expect(err.message).toContain('flagged');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(g.seen.openai).toHaveLength(0);
    // One user's flagged input does not take OpenRouter away from everyone else for authHoldS.
    flag = false;
    const next = await chat(g, 'openai/gpt-4o');
    expect(next.data.choices[0]!.message.content).toBe('clean input answered');
    expect(g.seen.openrouter).toHaveLength(2);
    expect(g.seen.openai).toHaveLength(0);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('Together and Fireworks', () => {
  it("retries Together's 503 'The server is overloaded or not ready yet.' then fails over to Fireworks", async () => {
    const g = await gw({ together: () => json(503, TOGETHER_503), fireworks: healthy('from fireworks') }, [
      { provider: 'together', model: 'meta-llama/Llama-3.3-70B-Instruct-Turbo' },
      { provider: 'fireworks', model: 'accounts/fireworks/models/llama-v3p3-70b-instruct' },
    ]);
    const res = await chat(g, 'llama-70b');
    expect(res.data.choices[0]!.message.content).toBe('from fireworks');
    expect(g.seen.together).toHaveLength(2);
    expect(g.seen.fireworks).toHaveLength(1);
  });

  it("answers a lone Fireworks' 500 HTML page, after its retries, as an OpenAI-shaped 500 the SDK reads, x-should-retry false", async () => {
    const g = await gw({ fireworks: () => html(500, FIREWORKS_500_HTML) }, [{ provider: 'fireworks' }]);
    const { client, counter } = countingClient(g.s, { maxRetries: 2 });
    const err = await sdkError(client.chat.completions.create({ model: 'accounts/fireworks/models/llama-v3p3-70b-instruct', messages }));
    expect(err.status).toBe(500);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(typeof (err.error as { message?: unknown }).message).toBe('string');
    expect(counter.requests).toBe(1);
    expect(g.seen.fireworks).toHaveLength(2);
  });

  it("tries the next target on Together's 404 model_not_available for a model the config named, never retried", async () => {
    const g = await gw({ together: () => json(404, TOGETHER_404), fireworks: healthy('from fireworks') }, [
      { provider: 'together', model: 'meta-llama/Llama-3-70b-chat-hf' },
      { provider: 'fireworks', model: 'accounts/fireworks/models/llama-v3p3-70b-instruct' },
    ]);
    const res = await chat(g, 'llama-70b');
    expect(res.data.choices[0]!.message.content).toBe('from fireworks');
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('error');
    expect(g.seen.together).toHaveLength(1);
  });

  it("tries the next target on Together's 400 model_not_available (a non-serverless model) for a model the config named", async () => {
    // Together answers a model that needs a dedicated endpoint with a 400: the operator's choice of model, as its 404 is.
    const dedicated = { error: { message: 'Unable to access non-serverless model meta-llama/Llama-3-70b-chat-hf. Please visit https://api.together.ai/models to view the list of supported models, or create a dedicated endpoint.', type: 'invalid_request_error', param: null, code: 'model_not_available' } };
    const g = await gw({ together: () => json(400, dedicated), fireworks: healthy('from fireworks') }, [
      { provider: 'together', model: 'meta-llama/Llama-3-70b-chat-hf' },
      { provider: 'fireworks', model: 'accounts/fireworks/models/llama-v3p3-70b-instruct' },
    ]);
    const res = await chat(g, 'llama-70b');
    expect(res.data.choices[0]!.message.content).toBe('from fireworks');
    expect(g.seen.together).toHaveLength(1);
    // The client's own name for a model: its 400 as it came.
    const own = await gw({ together: () => json(400, dedicated), fireworks: healthy('from fireworks') }, [{ provider: 'together' }, { provider: 'fireworks', model: 'accounts/fireworks/models/llama-v3p3-70b-instruct' }]);
    const err = await sdkError(own.client.chat.completions.create({ model: 'meta-llama/Llama-3-70b-chat-hf', messages }));
    expect(err.status).toBe(400);
    expect(own.seen.fireworks).toHaveLength(0);
  });

  it("gives the client Together's 404 for a model the client named itself, not failed over", async () => {
    const g = await gw({ together: () => json(404, TOGETHER_404), fireworks: healthy('from fireworks') }, [{ provider: 'together' }, { provider: 'fireworks', model: 'accounts/fireworks/models/llama-v3p3-70b-instruct' }]);
    const err = await sdkError(g.client.chat.completions.create({ model: 'meta-llama/Llama-3-70b-chat-hf', messages }));
    expect(err.status).toBe(404);
    expect((err.error as { code?: string }).code).toBe('model_not_available');
    expect(g.seen.together).toHaveLength(1);
    expect(g.seen.fireworks).toHaveLength(0);
  });

  it("opens Together's breaker after a run of 503s, so later requests go to Fireworks without touching Together", async () => {
    const g = await gw(
      { together: () => json(503, TOGETHER_503), fireworks: healthy('from fireworks') },
      [{ provider: 'together', model: 'meta-llama/Llama-3.3-70B-Instruct-Turbo' }, { provider: 'fireworks', model: 'accounts/fireworks/models/llama-v3p3-70b-instruct' }],
      { providers: { together: { breaker: { consecutiveFailures: 4, openS: 30 } } } },
    );
    for (let i = 0; i < 3; i++) {
      await chat(g, 'llama-70b');
      await sleep(150);
    }
    const before = g.seen.together!.length;
    expect(before).toBeGreaterThanOrEqual(4);
    const res = await chat(g, 'llama-70b');
    expect(res.data.choices[0]!.message.content).toBe('from fireworks');
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('breaker_open');
    expect(g.seen.together).toHaveLength(before);
  });
});

// ---------------------------------------------------------------------------------------------------------------
describe('xAI, Cerebras, Perplexity', () => {
  it("takes xAI's 429 'used all available credits or reached its monthly spending limit' as the gateway's billing, not a rate limit", async () => {
    const g = await gw({ xai: () => json(429, XAI_CREDITS_429), openai: healthy('from openai') }, [{ provider: 'xai' }, { provider: 'openai', model: 'gpt-4o' }], {
      route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5 } } },
    });
    const res = await chat(g, 'grok-3');
    expect(res.data.choices[0]!.message.content).toBe('from openai');
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('credentials');
    expect(g.seen.xai).toHaveLength(1);
  });

  it("answers a lone xAI's credits 429 as 502 upstream_auth_error, without the team id its body quotes", async () => {
    const g = await gw({ xai: () => json(429, XAI_CREDITS_429) }, [{ provider: 'xai' }]);
    const res = await fetch(`${g.s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'grok-3', messages }) });
    expect(res.status).toBe(502);
    expect(res.headers.get('x-should-retry')).toBe('false');
    const text = await res.text();
    expect(text).toContain('upstream_auth_error');
    expect(text).not.toContain('16f2151a');
    expect(g.seen.xai).toHaveLength(1);
  });

  it("retries Cerebras' unwrapped 429 (code request_quota_exceeded: a rate, not the account) and fails over to Groq", async () => {
    const g = await gw({ cerebras: () => json(429, CEREBRAS_429, CEREBRAS_HEADERS), groq: healthy('from groq') }, [{ provider: 'cerebras' }, { provider: 'groq', model: 'llama-3.3-70b-versatile' }]);
    const res = await chat(g, 'llama-3.3-70b');
    expect(res.data.choices[0]!.message.content).toBe('from groq');
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(g.seen.cerebras).toHaveLength(2);
  });

  it("gives the SDK a lone Cerebras' unwrapped 429 in the OpenAI shape, its message and code as they were", async () => {
    const g = await gw({ cerebras: () => json(429, CEREBRAS_429, CEREBRAS_HEADERS) }, [{ provider: 'cerebras' }]);
    const err = await sdkError(g.client.chat.completions.create({ model: 'llama-3.3-70b', messages }));
    expect(err.status).toBe(429);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.error).toMatchObject({ message: CEREBRAS_429.message, code: 'request_quota_exceeded' });
    expect(g.seen.cerebras).toHaveLength(2);
  });

  it("sends Cerebras' unwrapped 400 context_length_exceeded to the route's contextWindowFallback", async () => {
    const CEREBRAS_CONTEXT = { message: 'Please reduce the length of the messages or completion. Current length is 9120 while limit is 8192', type: 'invalid_request_error', param: 'messages', code: 'context_length_exceeded' };
    const g = await gw({ cerebras: () => json(400, CEREBRAS_CONTEXT), openai: healthy('from the long window') }, [{ provider: 'cerebras' }], {
      route: { contextWindowFallback: { provider: 'openai', model: 'gpt-4.1' } },
    });
    const res = await chat(g, 'llama3.1-8b');
    expect(res.data.choices[0]!.message.content).toBe('from the long window');
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('context_length');
    expect(g.seen.cerebras).toHaveLength(1);
    expect(g.seen.openai).toHaveLength(1);
  });

  it("takes Perplexity's 401 HTML page (openresty) as the gateway's key: fails over with credentials, no HTML to the client", async () => {
    const g = await gw({ perplexity: () => html(401, PERPLEXITY_401_HTML), openai: healthy('from openai') }, [{ provider: 'perplexity' }, { provider: 'openai', model: 'gpt-4o-search-preview' }]);
    const res = await chat(g, 'sonar-pro');
    expect(res.data.choices[0]!.message.content).toBe('from openai');
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('credentials');
    expect(g.seen.perplexity).toHaveLength(1);
  });

  it("streams Perplexity's chunks with their citations and search_results fields through to the SDK untouched", async () => {
    const extra = { citations: ['https://example.com/a'], search_results: [{ title: 'A', url: 'https://example.com/a', date: '2025-01-02' }] };
    const g = await gw(
      {
        perplexity: () => ({
          steps: [
            cc([delta({ role: 'assistant', content: 'Per [1], ' })], extra),
            cc([delta({ content: 'it shipped.' })], extra),
            cc([delta({ content: '' }, 'stop')], { ...extra, usage: { prompt_tokens: 5, completion_tokens: 6, total_tokens: 11, search_context_size: 'low' } }),
            DONE,
          ],
        }),
      },
      [{ provider: 'perplexity' }],
    );
    const stream = await g.client.chat.completions.create({ model: 'sonar-pro', messages, stream: true });
    let text = '';
    let citations: unknown;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? '';
      citations = (chunk as unknown as { citations?: unknown }).citations ?? citations;
    }
    expect(text).toBe('Per [1], it shipped.');
    expect(citations).toEqual(['https://example.com/a']);
  });
});
