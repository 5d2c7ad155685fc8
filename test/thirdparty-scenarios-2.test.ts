// Failure scenarios ported from other LLM gateways' resilience suites and from the bug reports they received (LiteLLM's
// router tests and issues: context-window fallbacks, cooldowns, retry policies, streaming fallbacks; Portkey's retry
// on status codes and request timeouts; Envoy's retry_on reset / connect-failure; OpenRouter's keep-alive comments;
// Kong and Helicone reports of stream hangs and duplicate requests), replayed against stormgate's YAML equivalents
// with the official openai SDK, as a user would.
import type { IncomingMessage, RequestListener, ServerResponse } from 'node:http';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { describe, expect, it, vi } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import type { FaultSpec, MockServer } from '../src/mock/server.ts';
import { retryInfoHint } from '../src/policy/wait-hint.ts';
import { requestLine, TEST_KEY, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';
import { chatChunk, chatCompletion, useFakeProviders } from './helpers/fake-provider.ts';

const startStack = useStacks();
const startBackup = useExtraMocks();
const startProvider = useFakeProviders();

type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];

interface Pair {
  s: Stack;
  backup: MockServer;
}

/**
 * `primary` (the stack's mock, or `primaryUrl` when given: a fake provider's origin) in front of `backup` (a second
 * mock): the shape of LiteLLM's `fallbacks: [{gpt-4o: [backup]}]` and Portkey's fallback strategy. No breaker, a
 * budget that never refuses and no parking unless a scenario asks for them, so each one checks its own mechanism.
 */
async function pair(opts: {
  primaryUrl?: string;
  faults?: FaultSpec;
  backupFaults?: FaultSpec;
  route?: Partial<RouteInput>;
  primary?: Partial<ProviderInput>;
  backupProvider?: Partial<ProviderInput>;
  /** Only the primary as a target (the backup stays a provider, e.g. for contextWindowFallback). */
  alone?: boolean;
  contextWindowFallback?: boolean;
}): Promise<Pair> {
  const backup = await startBackup({ faults: opts.backupFaults, quiet: true, apiKey: 'backup-key' });
  const s = await startStack({
    faults: opts.faults,
    config: (mockUrl) => ({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: {
        primary: { family: 'openai', baseUrl: opts.primaryUrl ? `${opts.primaryUrl}/v1` : `${mockUrl}/v1`, apiKey: TEST_KEY, breaker: false, ...opts.primary },
        backup: { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: 'backup-key', breaker: false, ...opts.backupProvider },
      },
      routes: [
        {
          name: 'chat',
          match: { path: '/v1/chat/completions' },
          targets: opts.alone ? [{ provider: 'primary' }] : [{ provider: 'primary' }, { provider: 'backup', model: 'gpt-4.1' }],
          ...(opts.contextWindowFallback && { contextWindowFallback: { provider: 'backup', model: 'gpt-4.1-long' } }),
          retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } },
          budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 },
          park: false,
          ...opts.route,
        },
        {
          name: 'embeddings',
          match: { path: '/v1/embeddings' },
          targets: opts.alone ? [{ provider: 'primary' }] : [{ provider: 'primary' }, { provider: 'backup' }],
          retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } },
          budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 },
          park: false,
        },
      ],
    }),
  });
  return { s, backup };
}

const sdk = (s: Stack, opts: NonNullable<ConstructorParameters<typeof OpenAI>[0]> = {}) =>
  new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0, ...opts });
const messages = [{ role: 'user' as const, content: 'Summarise this contract.' }];

/** A provider's handler that answers once it has read the whole request. */
const afterBody =
  (answer: (req: IncomingMessage, res: ServerResponse) => void): RequestListener =>
  (req, res) => {
    req.resume();
    req.on('end', () => answer(req, res));
  };

/** A provider that answers every request with one status, headers and JSON body (after reading the request). */
const answering =
  (status: number, body: unknown, headers: Record<string, string> = {}): RequestListener =>
  afterBody((_req, res) => {
    res.writeHead(status, { 'content-type': 'application/json', ...headers });
    res.end(typeof body === 'string' ? body : JSON.stringify(body));
  });

/** A streamed chat whose answer must be a call of the `lookup` tool. */
const lookupCall = (s: Stack) =>
  sdk(s).chat.completions.create({
    model: 'gpt-4o',
    messages,
    stream: true,
    tools: [{ type: 'function', function: { name: 'lookup', parameters: { type: 'object', properties: { id: { type: 'string' } } } } }],
    tool_choice: { type: 'function', function: { name: 'lookup' } },
  });

const chatPaths = (m: MockServer) => m.requests().filter((r) => r.path === '/v1/chat/completions');

describe('LiteLLM context_window_fallbacks: the context error of an OpenAI-compatible server', () => {
  // LiteLLM issue #12680 (vLLM's error, top-level and with the status as its code) and #10793 (SGLang's message):
  // without a `context_length_exceeded` code, the context error was not recognised and the fallback never ran.
  const contextErrors: Array<[string, unknown, number?]> = [
    [
      "vLLM (its own top-level shape, code 400)",
      { object: 'error', message: "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens (8000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.", type: 'BadRequestError', param: null, code: 400 },
    ],
    [
      'vLLM (OpenAI shape, code 400)',
      { error: { message: "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens. Please reduce the length of the messages or completion.", type: 'BadRequestError', param: null, code: 400 } },
    ],
    // vLLM's current wordings: before them, only the legacy "This model's maximum context length is ..." was read.
    [
      'vLLM 0.11 to 0.15 (prompt and max_tokens past the window)',
      { object: 'error', message: "'max_tokens' or 'max_completion_tokens' is too large: 1000. This model's maximum context length is 8192 tokens and your request has 7500 input tokens (1000 > 8192 - 7500).", type: 'BadRequestError', param: null, code: 400 },
    ],
    [
      'vLLM 0.16 and later',
      { error: { message: "You passed 9000 input tokens and requested 1000 output tokens. However, the model's context length is only 8192 tokens, resulting in a maximum input length of 7192 tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=9000)", type: 'BadRequestError', param: 'input_tokens', code: 400 } },
    ],
    ['SGLang / Together', { error: { message: "The input (9000 tokens) is longer than the model's context length (8192 tokens).", type: 'invalid_request_error', param: null, code: null } }],
    ['llama.cpp server', { error: { code: 400, message: 'the request exceeds the available context size, try increasing it', type: 'exceed_context_size_error' } }],
    ['OpenRouter', { error: { message: "This endpoint's maximum context length is 131072 tokens. However, you requested about 200000 tokens (200000 of text input). Please reduce the length of either one.", code: 400 } }],
    ['Mistral', { object: 'error', message: 'Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum context length', type: 'invalid_request_error', param: null, code: null }],
    // DeepSeek's code only says its type again: it names nothing, and the message tells what went wrong.
    [
      'DeepSeek (its code repeats its type)',
      { error: { message: "This model's maximum context length is 65536 tokens. However, you requested 70000 tokens (70000 in the messages, 0 in the completion). Please reduce the length of the messages or completion.", type: 'invalid_request_error', param: null, code: 'invalid_request_error' } },
    ],
    // TGI says it in a 422, its error a bare string.
    ['Hugging Face TGI (prompt and max_new_tokens past the window)', { error: 'Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 `inputs` tokens and 200 `max_new_tokens`', error_type: 'validation' }, 422],
    ['Hugging Face TGI (prompt past the input limit)', { error: 'Input validation error: `inputs` must have less than 1024 tokens. Given: 2000', error_type: 'validation' }, 422],
  ];
  for (const [who, body, status = 400] of contextErrors) {
    it(`goes to contextWindowFallback for ${who}`, async () => {
      const primary = await startProvider(answering(status, body));
      const { s, backup } = await pair({ primaryUrl: primary.origin, alone: true, contextWindowFallback: true });
      const res = await sdk(s).chat.completions.create({ model: 'llama-3.1-8b', messages }).withResponse();
      expect(res.data.choices[0]!.message.content).toBeTruthy();
      expect(res.response.headers.get('x-stormgate-fallback')).toBe('context_length');
      expect(chatPaths(backup).map((r) => r.model)).toEqual(['gpt-4.1-long']);
      expect(primary.hits()).toBe(1);
    });
  }

  it("passes vLLM's flat context error on in the OpenAI shape when the route has no fallback: its message, its code as a string", async () => {
    const message = "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens. Please reduce the length of the messages or completion.";
    const primary = await startProvider(answering(400, { object: 'error', message, type: 'BadRequestError', param: null, code: 400 }));
    const { s } = await pair({ primaryUrl: primary.origin, alone: true });
    const err = await sdk(s).chat.completions.create({ model: 'llama-3.1-8b', messages }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    const e = err as InstanceType<typeof OpenAI.BadRequestError>;
    expect(e.error).toEqual({ message, type: 'BadRequestError', param: null, code: '400' });
    expect(primary.hits()).toBe(1);
  });

  it('does not read a context error into a 400 whose message only quotes the words (a validation error echoing the input)', async () => {
    const primary = await startProvider(
      answering(400, { error: { message: "Invalid 'messages[0].name': \"This model's maximum context length is 5\" is not a valid name.", type: 'invalid_request_error', param: 'messages[0].name', code: null } }),
    );
    const { s, backup } = await pair({ primaryUrl: primary.origin, alone: true, contextWindowFallback: true });
    const err = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect(chatPaths(backup)).toHaveLength(0);
  });

  it.each([
    ['in words only (OpenRouter: the status as its code)', { message: "This endpoint's maximum context length is 131072 tokens. However, you requested about 200000 tokens.", code: 400 }],
    [
      "DeepSeek's, whose code repeats its type",
      { message: "This model's maximum context length is 65536 tokens. However, you requested 70000 tokens.", type: 'invalid_request_error', param: null, code: 'invalid_request_error' },
    ],
  ])('goes to contextWindowFallback for a context error sent as an event before the first output: %s', async (_what, error) => {
    const primary = await startProvider(afterBody((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(chatChunk({ role: 'assistant', content: '' }, null));
      res.end(`data: ${JSON.stringify({ error })}\n\n`);
    }));
    const { s, backup } = await pair({ primaryUrl: primary.origin, alone: true, contextWindowFallback: true });
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
    expect(text.length).toBeGreaterThan(0);
    expect(primary.hits()).toBe(1);
    expect(chatPaths(backup).map((r) => r.model)).toEqual(['gpt-4.1-long']);
  });

  it('still passes a 400 that only mentions tokens (max_tokens too large) on as it is, to no fallback', async () => {
    const primary = await startProvider(
      answering(400, { error: { message: 'max_tokens is too large: 100000. This model supports at most 16384 completion tokens, whereas you provided 100000.', type: 'invalid_request_error', param: 'max_tokens', code: 'invalid_value' } }),
    );
    const { s, backup } = await pair({ primaryUrl: primary.origin, alone: true, contextWindowFallback: true });
    const err = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, max_tokens: 100000 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect((err as InstanceType<typeof OpenAI.BadRequestError>).code).toBe('invalid_value');
    expect(chatPaths(backup)).toHaveLength(0);
  });

  it("sends a stream whose context error comes before it begins to the fallback, and streams the fallback's answer", async () => {
    const primary = await startProvider(answering(400, { error: { message: "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.", type: 'invalid_request_error', param: 'messages', code: 'context_length_exceeded' } }));
    const { s, backup } = await pair({ primaryUrl: primary.origin, alone: true, contextWindowFallback: true });
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
    expect(text.length).toBeGreaterThan(0);
    expect(chatPaths(backup).map((r) => r.model)).toEqual(['gpt-4.1-long']);
  });
});

describe("LiteLLM router retries and cooldowns", () => {
  it('waits out a 429 retry-after of 1 s on the same deployment and answers (test_router_retries: RateLimitError)', async () => {
    const { s } = await pair({ alone: true, faults: { errors: [{ status: 429, headers: { 'retry-after': '1' }, times: 1 }] } });
    const t0 = Date.now();
    const res = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(res.data.choices[0]!.message.content).toBeTruthy();
    expect(Date.now() - t0).toBeGreaterThanOrEqual(950);
    expect(res.response.headers.get('x-stormgate-attempts')).toBe('2');
    const attempts = chatPaths(s.mock);
    expect(attempts[1]!.headers['x-retry-reason']).toBe('status_429');
  });

  it('honours a retry-after given as an HTTP-date, not the backoff', async () => {
    const at = new Date(Date.now() + 2_000).toUTCString(); // second resolution: 1 to 2 s from now
    const { s } = await pair({ alone: true, faults: { errors: [{ status: 503, headers: { 'retry-after': at }, times: 1 }] } });
    const t0 = Date.now();
    await sdk(s).chat.completions.create({ model: 'gpt-4o', messages });
    expect(Date.now() - t0).toBeGreaterThanOrEqual(900);
  });

  it('puts a deployment whose 429 asks for more than maxWaitHintMs in cooldown: this request and the next go to the backup, the next without touching it', async () => {
    const { s, backup } = await pair({ faults: { errors: [{ status: 429, headers: { 'retry-after': '20' } }] }, route: { retry: { maxAttempts: 2, maxWaitHintMs: 1_000 } } });
    const first = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(first.response.headers.get('x-stormgate-fallback')).toBe('wait_hint');
    const second = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(second.response.headers.get('x-stormgate-fallback')).toBe('held_off');
    expect(chatPaths(s.mock)).toHaveLength(1);
    expect(chatPaths(backup)).toHaveLength(2);
  });

  it('answers a lone deployment in cooldown with 429 and the remaining retry-after, and the SDK is told it may come back', async () => {
    const { s } = await pair({ alone: true, faults: { errors: [{ status: 429, headers: { 'retry-after': '30' } }] }, route: { retry: { maxAttempts: 2, maxWaitHintMs: 1_000 } } });
    const first = await fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages }) });
    expect(first.status).toBe(429);
    expect(Number(first.headers.get('retry-after'))).toBeGreaterThanOrEqual(29);
    const second = await fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages }) });
    expect(second.status).toBe(429);
    expect(((await second.json()) as { error: { code: string } }).error.code).toBe('provider_held_off');
    expect(Number(second.headers.get('retry-after'))).toBeGreaterThan(25);
    expect(second.headers.get('x-should-retry')).toBe('true');
    expect(chatPaths(s.mock)).toHaveLength(1);
  });

  it('opens the breaker after allowed_fails: the next request goes to the backup without touching the primary', async () => {
    const { s, backup } = await pair({
      faults: { errors: [{ status: 500 }] },
      primary: { breaker: { consecutiveFailures: 2, openS: 30 } },
      route: { retry: { maxAttempts: 1 } },
    });
    for (let i = 0; i < 2; i++) await sdk(s).chat.completions.create({ model: 'gpt-4o', messages });
    await new Promise((r) => setTimeout(r, 300)); // the run's "no success for 250 ms"
    await sdk(s).chat.completions.create({ model: 'gpt-4o', messages });
    const before = chatPaths(s.mock).length;
    const res = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('breaker_open');
    expect(chatPaths(s.mock)).toHaveLength(before);
    expect(chatPaths(backup).length).toBeGreaterThanOrEqual(3);
  });

  it('with maxAttempts 1 (num_retries=0) sends one attempt, and the SDK with its own retries does not send the request again', async () => {
    const { s } = await pair({ alone: true, faults: { errors: [{ status: 503 }] }, route: { retry: { maxAttempts: 1 } } });
    let sent = 0;
    const client = sdk(s, { maxRetries: 3, fetch: async (url, init) => (sent++, fetch(url, init)) });
    const err = await client.chat.completions.create({ model: 'gpt-4o', messages }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.InternalServerError);
    expect(sent).toBe(1);
    expect(chatPaths(s.mock)).toHaveLength(1);
  });

  it('spreads weighted traffic only to the deployment not in cooldown (simple-shuffle with one deployment cooling down)', async () => {
    const { s, backup } = await pair({
      faults: { errors: [{ status: 429, headers: { 'retry-after': '20' }, times: 1 }] },
      route: { strategy: 'weighted', retry: { maxAttempts: 1, maxWaitHintMs: 1_000 } },
    });
    for (let i = 0; i < 6; i++) await sdk(s).chat.completions.create({ model: 'gpt-4o', messages });
    expect(chatPaths(s.mock)).toHaveLength(1);
    expect(chatPaths(backup)).toHaveLength(6);
  });
});

describe('Portkey: retry on status codes, wait hints, request timeout', () => {
  it('retries only the statuses retryOn lists: a 502 left out is not retried', async () => {
    const { s } = await pair({ alone: true, faults: { errors: [{ status: 502, times: 1 }] }, route: { retry: { maxAttempts: 3, retryOn: [429, 503] } } });
    const err = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).catch((e: unknown) => e);
    expect((err as { status?: number }).status).toBe(502);
    expect(chatPaths(s.mock)).toHaveLength(1);
  });

  it("waits retry-after-ms (use_retry_after_header), not the route's long backoff", async () => {
    const { s } = await pair({ alone: true, faults: { errors: [{ status: 503, headers: { 'retry-after-ms': '150' }, times: 1 }] }, route: { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5_000, capMs: 5_000 } } } });
    const t0 = Date.now();
    await sdk(s).chat.completions.create({ model: 'gpt-4o', messages });
    const took = Date.now() - t0;
    expect(took).toBeGreaterThanOrEqual(140);
    expect(took).toBeLessThan(2_000);
  });

  it('ends an attempt at request_timeout (responseMs), aborts it upstream and answers from the backup', async () => {
    // maxAttempts 2: a silent target is not retried while another can answer.
    const { s, backup } = await pair({ faults: { latencyMs: 5_000 }, primary: { timeouts: { responseMs: 300 } } });
    const t0 = Date.now();
    const res = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(Date.now() - t0).toBeLessThan(2_000);
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('timeout');
    expect(chatPaths(backup)).toHaveLength(1);
    expect(chatPaths(s.mock)).toHaveLength(1);
    // No ghost: the abort reaches the provider a moment after the client's answer on a loaded machine.
    await expect.poll(() => s.mock.stats().inflight, { timeout: 2_000 }).toBe(0);
  });
});

describe("Envoy retry_on: reset, connect-failure", () => {
  it('retries a connection reset before any answer (retry_on: reset) and answers from the same target', async () => {
    let n = 0;
    const primary = await startProvider(afterBody((req, res) => {
      if (n++ === 0) req.socket.destroy();
      else res.writeHead(200, { 'content-type': 'application/json' }).end(chatCompletion('after a reset'));
    }));
    const { s } = await pair({ primaryUrl: primary.origin, alone: true });
    const res = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(res.data.choices[0]!.message.content).toBe('after a reset');
    expect(res.response.headers.get('x-stormgate-attempts')).toBe('2');
    expect(primary.hits()).toBe(2);
  });

  it('fails over at once on a refused connection (connect-failure), whatever retryOn says', async () => {
    // Port 9 (discard) on loopback: nothing listens there, the connection is refused.
    const { s, backup } = await pair({ primaryUrl: 'http://127.0.0.1:9', route: { retry: { maxAttempts: 3, retryOn: [429] } } });
    const res = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(res.response.headers.get('x-stormgate-fallback')).toBeTruthy();
    expect(chatPaths(backup)).toHaveLength(1);
  });
});

describe('streaming fallbacks', () => {
  it('answers a stream from the backup when the primary answers 500 first, with one role chunk only', async () => {
    const { s, backup } = await pair({ faults: { errors: [{ status: 500 }] } });
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    let roles = 0;
    let text = '';
    for await (const chunk of stream) {
      if (chunk.choices[0]?.delta.role) roles++;
      text += chunk.choices[0]?.delta.content ?? '';
    }
    expect(roles).toBe(1);
    expect(text.length).toBeGreaterThan(0);
    expect(chatPaths(backup)).toHaveLength(1);
  });

  it("gives a real status, not a 200 with an error event, when the fallback's stream also fails before content (LiteLLM #38610)", async () => {
    const { s } = await pair({ faults: { stream: { cutAfterChunks: 0 } }, backupFaults: { stream: { cutAfterChunks: 0 } } });
    const res = await fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages, stream: true }) });
    expect(res.status).toBe(502);
    expect(res.headers.get('content-type')).toContain('application/json');
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('upstream_bad_response');
  });

  it.each([
    ['an error event after the role chunk (bifrost #5395, helm-api #381: preamble, then an overload)', chatChunk({ role: 'assistant', content: '' }, null) + `data: ${JSON.stringify({ error: { message: 'The server is overloaded', type: 'server_error', code: 'server_is_overloaded' } })}\n\n`],
    ['a 200 stream that ends with no event at all, not an empty answer (stella #2748)', ''],
  ])('fails over on %s', async (_what, events) => {
    const primary = await startProvider(afterBody((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(events);
    }));
    const { s, backup } = await pair({ primaryUrl: primary.origin, route: { retry: { maxAttempts: 1 } } });
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
    expect(text.length).toBeGreaterThan(0);
    expect(chatPaths(backup)).toHaveLength(1);
  });

  it.each([
    ['content_filter', "a stream the provider's content filter ended before any text (Azure)"],
    ['stop', 'an empty answer that finished (no text), streamed'],
  ])('passes on %s: %s, as the provider gave it, not retried nor failed over', async (reason) => {
    const primary = await startProvider(afterBody((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(chatChunk({ role: 'assistant', content: '' }, null));
      res.write(chatChunk({}, reason));
      res.end('data: [DONE]\n\n');
    }));
    const { s, backup } = await pair({ primaryUrl: primary.origin });
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    const finishes: Array<string | null | undefined> = [];
    for await (const chunk of stream) finishes.push(chunk.choices[0]?.finish_reason);
    expect(finishes).toContain(reason);
    expect(primary.hits()).toBe(1);
    expect(chatPaths(backup)).toHaveLength(0);
  });

  it('ends a tool-call stream cut in the middle of its arguments with an error the SDK raises, never a clean end with half the arguments', async () => {
    const { s } = await pair({ faults: { stream: { cutAfterChunks: 1 } } });
    const stream = await lookupCall(s);
    let args = '';
    const err = await (async () => {
      for await (const chunk of stream) args += chunk.choices[0]?.delta.tool_calls?.[0]?.function?.arguments ?? '';
    })().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Error);
    expect(String(err)).toMatch(/cut|interrupted/);
  });

  it("serves a tool call from the backup when the primary answers 503, with the backup's arguments whole", async () => {
    const { s, backup } = await pair({ faults: { errors: [{ status: 503 }] } });
    const stream = await lookupCall(s);
    let args = '';
    let name = '';
    for await (const chunk of stream) {
      args += chunk.choices[0]?.delta.tool_calls?.[0]?.function?.arguments ?? '';
      name += chunk.choices[0]?.delta.tool_calls?.[0]?.function?.name ?? '';
    }
    expect(name).toBe('lookup');
    expect(() => JSON.parse(args) as unknown).not.toThrow();
    expect(chatPaths(backup)).toHaveLength(1);
  });
});

describe("OpenRouter's keep-alives", () => {
  it('streams through ": OPENROUTER PROCESSING" comments before the first token', async () => {
    const primary = await startProvider(afterBody((req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      let n = 0;
      const t = setInterval(() => {
        if (n++ < 4) {
          res.write(': OPENROUTER PROCESSING\n\n');
          return;
        }
        clearInterval(t);
        res.write(chatChunk({ role: 'assistant', content: 'Hel' }, null));
        res.write(chatChunk({ content: 'lo' }, null));
        res.write(chatChunk({}, 'stop'));
        res.end('data: [DONE]\n\n');
      }, 100);
    }));
    const { s } = await pair({ primaryUrl: primary.origin, alone: true, primary: { timeouts: { firstTokenMs: 3_000, idleMs: 3_000 } } });
    const stream = await sdk(s).chat.completions.create({ model: 'openai/gpt-4o', messages, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
    expect(text).toBe('Hello');
    expect(primary.hits()).toBe(1);
  });

  it('takes a whole answer that whitespace kept alive before its JSON began', async () => {
    const primary = await startProvider(afterBody((req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('\n');
      setTimeout(() => res.write('\n  \n'), 50);
      setTimeout(() => res.end(chatCompletion('kept alive')), 100);
    }));
    const { s } = await pair({ primaryUrl: primary.origin, alone: true });
    const res = await sdk(s).chat.completions.create({ model: 'openai/gpt-4o', messages });
    expect(res.choices[0]!.message.content).toBe('kept alive');
    expect(primary.hits()).toBe(1);
  });
});

describe('Kong and Helicone reports: timeouts honoured, no duplicate requests', () => {
  it("answers before the SDK's per-request timeout, and the SDK does not send the request again", async () => {
    const { s } = await pair({ alone: true, faults: { latencyMs: 10_000 } });
    let sent = 0;
    const client = sdk(s, { maxRetries: 2, fetch: async (url, init) => (sent++, fetch(url, init)) });
    const t0 = Date.now();
    const err = await client.chat.completions.create({ model: 'gpt-4o', messages }, { timeout: 2_000 }).catch((e: unknown) => e);
    expect(Date.now() - t0).toBeLessThan(2_000);
    expect((err as { status?: number }).status).toBe(504);
    expect(sent).toBe(1);
    // No ghost: the abort reaches the provider a moment after the client's answer on a loaded machine.
    await expect.poll(() => s.mock.stats().inflight, { timeout: 2_000 }).toBe(0);
  });

  it('does not multiply attempts: a 503 storm with SDK retries on gives maxAttempts upstream requests per call', async () => {
    const { s } = await pair({ alone: true, faults: { errors: [{ status: 503 }] }, route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } } });
    let sent = 0;
    const client = sdk(s, { maxRetries: 2, fetch: async (url, init) => (sent++, fetch(url, init)) });
    await Promise.all(Array.from({ length: 5 }, () => client.chat.completions.create({ model: 'gpt-4o', messages }).catch(() => undefined)));
    expect(sent).toBe(5);
    expect(chatPaths(s.mock)).toHaveLength(15);
  });

  it('forwards the Idempotency-Key unchanged on every attempt', async () => {
    const { s } = await pair({ alone: true, faults: { errors: [{ status: 503, times: 1 }] } });
    await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }, { headers: { 'Idempotency-Key': 'order-42' } });
    const keys = chatPaths(s.mock).map((r) => r.headers['idempotency-key']);
    expect(keys).toEqual(['order-42', 'order-42']);
  });
});

describe('embeddings', () => {
  it('fail over to the same model at the backup during a brownout, with vectors the SDK decodes', async () => {
    const { s, backup } = await pair({ faults: { errors: [{ status: 503 }] } });
    const res = await sdk(s).embeddings.create({ model: 'text-embedding-3-small', input: ['a', 'b'] });
    expect(res.data).toHaveLength(2);
    expect(res.data[0]!.embedding.length).toBeGreaterThan(0);
    const sent = backup.requests().filter((r) => r.path === '/v1/embeddings');
    expect(sent.map((r) => r.model)).toEqual(['text-embedding-3-small']);
  });
});

describe('the log line of a failed-over request', () => {
  it('names the fallback reason and each attempt', async () => {
    const { s } = await pair({ faults: { errors: [{ status: 503 }] } });
    await sdk(s).chat.completions.create({ model: 'gpt-4o', messages });
    const line = await requestLine(s);
    expect(line.attempts.length).toBe(3);
    expect(JSON.stringify(line)).toContain('retries_exhausted');
  });
});

describe('retry storms and wait hints under a deadline', () => {
  it("keeps a fleet of callers' retries within the budget while every attempt fails (a retry storm)", async () => {
    const { s } = await pair({
      alone: true,
      faults: { errors: [{ status: 503 }] },
      route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } }, budget: { ratio: 0.1, windowS: 10, minRetriesPerSecond: 1 } },
    });
    const client = sdk(s, { maxRetries: 2 });
    await Promise.all(Array.from({ length: 40 }, () => client.chat.completions.create({ model: 'gpt-4o', messages }).catch(() => undefined)));
    // 40 first attempts; retries at most 10% of them, or the floor of 1 a second over the 10 s window.
    expect(chatPaths(s.mock).length).toBeLessThanOrEqual(40 + 10);
  });

  it("answers at once when the provider's retry-after is longer than the client's deadline, passing the hint on", async () => {
    const { s } = await pair({ alone: true, faults: { errors: [{ status: 503, headers: { 'retry-after': '5' } }] } });
    const t0 = Date.now();
    const res = await fetch(`${s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-stainless-timeout': '2' },
      body: JSON.stringify({ model: 'gpt-4o', messages }),
    });
    expect(Date.now() - t0).toBeLessThan(1_000);
    expect(res.status).toBe(503);
    expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(4);
    expect(chatPaths(s.mock)).toHaveLength(1);
  });

  it("ends a stream that stalls after its first output within idleMs, with an error the SDK raises (a stream that hangs)", async () => {
    const { s } = await pair({ alone: true, faults: { stream: { stallAfterChunks: 2 } }, primary: { timeouts: { idleMs: 300 } } });
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    const t0 = Date.now();
    const err = await (async () => {
      for await (const chunk of stream) void chunk;
    })().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Error);
    expect(Date.now() - t0).toBeLessThan(2_000);
    // No ghost: the abort reaches the provider a moment after the client's answer on a loaded machine.
    await expect.poll(() => s.mock.stats().inflight, { timeout: 2_000 }).toBe(0);
  });
});

describe('what a failed-over stream carries', () => {
  it("streams the backup's usage chunk (include_usage) and its model name", async () => {
    const { s } = await pair({ faults: { errors: [{ status: 503 }] } });
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true, stream_options: { include_usage: true } });
    let usage: unknown;
    const models = new Set<string>();
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      models.add(chunk.model);
    }
    expect(usage).toMatchObject({ total_tokens: expect.any(Number) });
    expect([...models]).toEqual(['gpt-4.1']);
  });

  it('tries both weighted targets when both fail, and names the last one that failed', async () => {
    const { s, backup } = await pair({ faults: { errors: [{ status: 503 }] }, backupFaults: { errors: [{ status: 503 }] }, route: { strategy: 'weighted' } });
    const err = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).catch((e: unknown) => e);
    expect((err as { status?: number }).status).toBe(503);
    expect(chatPaths(s.mock)).toHaveLength(2);
    expect(chatPaths(backup)).toHaveLength(2);
    expect((err as { headers?: Headers }).headers?.get('x-should-retry')).toBe('false');
  });
});

describe('a deployment retired behind a model the operator named', () => {
  // LiteLLM's fallbacks cover a deployment that answers NotFound (a retired model, a deleted Azure deployment): the
  // client named `gpt-4o`; the `model` the target sends in its place is the operator's, and so is its 404.
  it("goes to the backup when the primary's 404 is about the target's own model, not the client's", async () => {
    const primary = await startProvider(
      answering(404, { error: { message: 'The model `gpt-4-0314` has been deprecated, learn more here: https://platform.openai.com/docs/deprecations', type: 'invalid_request_error', param: null, code: 'model_not_found' } }),
    );
    const backup = await startBackup({ quiet: true, apiKey: 'backup-key' });
    const s = await startStack({
      config: () => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: {
          primary: { family: 'openai', baseUrl: `${primary.origin}/v1`, apiKey: TEST_KEY, breaker: false },
          backup: { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: 'backup-key', breaker: false },
        },
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'primary', model: 'gpt-4-0314' }, { provider: 'backup', model: 'gpt-4.1' }], park: false }],
      }),
    });
    const res = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(res.data.model).toBe('gpt-4.1');
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('error');
    expect(chatPaths(backup)).toHaveLength(1);
  });

  it('does the same for an Anthropic agent whose primary target names a retired Claude model', async () => {
    const primary = await startProvider(answering(404, { type: 'error', error: { type: 'not_found_error', message: 'model: claude-3-opus-20240229' } }));
    const backup = await startBackup({ quiet: true });
    const s = await startStack({
      config: () => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: {
          claude: { family: 'anthropic', baseUrl: primary.origin, apiKey: TEST_KEY, breaker: false },
          backup: { family: 'anthropic', baseUrl: backup.url, apiKey: 'backup-key', breaker: false },
        },
        routes: [{ name: 'messages', match: { path: '/v1/messages' }, targets: [{ provider: 'claude', model: 'claude-3-opus-20240229' }, { provider: 'backup', model: 'claude-sonnet-4-6' }], park: false }],
      }),
    });
    const client = new Anthropic({ baseURL: s.url, apiKey: 'client-x-api-key', maxRetries: 0 });
    const message = await client.messages.create({ model: 'claude-opus', max_tokens: 64, messages: [{ role: 'user', content: 'hi' }] });
    expect(message.model).toBe('claude-sonnet-4-6');
    expect(primary.hits()).toBe(1);
  });

  it("still ends with the primary's 404 when the model is the client's own (a name it made up), never asking the backup", async () => {
    const primary = await startProvider(answering(404, { error: { message: 'The model `gpt-5-ultra` does not exist or you do not have access to it.', type: 'invalid_request_error', param: null, code: 'model_not_found' } }));
    const { s, backup } = await pair({ primaryUrl: primary.origin });
    const err = await sdk(s).chat.completions.create({ model: 'gpt-5-ultra', messages }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.NotFoundError);
    expect(chatPaths(backup)).toHaveLength(0);
  });
});

describe('Anthropic agents on /v1/messages (LiteLLM #38610)', () => {
  const overloadedAfterStart: RequestListener = afterBody((req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const start = { type: 'message_start', message: { id: 'msg_1', type: 'message', role: 'assistant', model: 'claude-sonnet-4-6', content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 5, output_tokens: 1 } } };
    res.write(`event: message_start\ndata: ${JSON.stringify(start)}\n\n`);
    res.write('event: ping\ndata: {"type": "ping"}\n\n');
    res.end(`event: error\ndata: ${JSON.stringify({ type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } })}\n\n`);
  });

  async function messagesStack(primaryOrigin: string, backupOrigin: string): Promise<Stack> {
    return startStack({
      config: () => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: {
          claude: { family: 'anthropic', baseUrl: primaryOrigin, apiKey: TEST_KEY, breaker: false },
          backup: { family: 'anthropic', baseUrl: backupOrigin, apiKey: 'backup-key', breaker: false },
        },
        routes: [
          {
            name: 'messages',
            match: { path: '/v1/messages' },
            targets: [{ provider: 'claude' }, { provider: 'backup', model: 'claude-haiku-4-5' }],
            retry: { maxAttempts: 1 },
            budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 },
            park: false,
          },
        ],
      }),
    });
  }

  it("answers a real 529, not a 200 stream with message_start and an error, when the fallback's stream also fails before content", async () => {
    const primary = await startProvider(overloadedAfterStart);
    const backup = await startProvider(overloadedAfterStart);
    const s = await messagesStack(primary.origin, backup.origin);
    const res = await fetch(`${s.url}/v1/messages`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01' },
      body: JSON.stringify({ model: 'claude-sonnet-4-6', max_tokens: 64, stream: true, messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(res.status).toBe(529);
    expect(((await res.json()) as { error: { type: string } }).error.type).toBe('overloaded_error');
    expect(primary.hits()).toBe(1);
    expect(backup.hits()).toBe(1);
  });

  it("serves the backup's stream to the Anthropic SDK when only the primary overloads after message_start", async () => {
    const primary = await startProvider(overloadedAfterStart);
    const backup = await startBackup({ quiet: true });
    const s = await messagesStack(primary.origin, backup.url);
    const client = new Anthropic({ baseURL: s.url, apiKey: 'client-x-api-key', maxRetries: 0 });
    const message = await client.messages.stream({ model: 'claude-sonnet-4-6', max_tokens: 64, messages: [{ role: 'user', content: 'hi' }] }).finalMessage();
    expect(message.stop_reason).toBe('end_turn');
    expect(backup.requests().map((r) => r.model)).toEqual(['claude-haiku-4-5']);
  });
});

describe("Gemini's OpenAI-compatible endpoint: errors as a list, the wait in the body", () => {
  // Google answers `[{"error": {...}}]`, and a 429's wait as a RetryInfo detail (`"retryDelay": "29s"`), with no
  // retry-after header (Aider #3694, llxprt-code #813, cline #5202: clients that retried at once into the same quota).
  const exhausted = (delay: string) => [
    {
      error: {
        code: 429,
        message: 'You exceeded your current quota, please check your plan and billing details.',
        status: 'RESOURCE_EXHAUSTED',
        details: [
          { '@type': 'type.googleapis.com/google.rpc.QuotaFailure', violations: [{ quotaMetric: 'generativelanguage.googleapis.com/generate_requests_per_model' }] },
          { '@type': 'type.googleapis.com/google.rpc.RetryInfo', retryDelay: delay },
        ],
      },
    },
  ];

  it('waits out a retryDelay of 1.5 s given in the body before the retry, as it would a retry-after', async () => {
    let n = 0;
    const primary = await startProvider(afterBody((req, res) => {
      if (n++ === 0) res.writeHead(429, { 'content-type': 'application/json' }).end(JSON.stringify(exhausted('1.5s')));
      else res.writeHead(200, { 'content-type': 'application/json' }).end(chatCompletion('after the quota'));
    }));
    const { s } = await pair({ primaryUrl: primary.origin, alone: true, route: { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } } });
    const t0 = Date.now();
    const res = await sdk(s).chat.completions.create({ model: 'gemini-2.5-flash', messages });
    expect(res.choices[0]!.message.content).toBe('after the quota');
    expect(Date.now() - t0).toBeGreaterThanOrEqual(1_450);
  });

  it('goes to the backup at once when the retryDelay is longer than maxWaitHintMs, instead of retrying into the quota', async () => {
    const primary = await startProvider(answering(429, exhausted('29s')));
    const { s, backup } = await pair({ primaryUrl: primary.origin, route: { retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 }, maxWaitHintMs: 20_000 } } });
    const res = await sdk(s).chat.completions.create({ model: 'gemini-2.5-flash', messages }).withResponse();
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('wait_hint');
    expect(primary.hits()).toBe(1);
    expect(chatPaths(backup)).toHaveLength(1);
  });

  it("tells the client the body's wait as retry-after when no other target can answer", async () => {
    const primary = await startProvider(answering(429, exhausted('29s')));
    const { s } = await pair({ primaryUrl: primary.origin, alone: true });
    const res = await fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gemini-2.5-flash', messages }) });
    expect(res.status).toBe(429);
    expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(29);
    expect(primary.hits()).toBe(1);
  });

  it("passes a list-wrapped error on in the OpenAI shape, the provider's message whole", async () => {
    const message = 'Please use a valid role: user, model.';
    const primary = await startProvider(answering(400, [{ error: { code: 400, message, status: 'INVALID_ARGUMENT' } }]));
    const { s } = await pair({ primaryUrl: primary.origin, alone: true });
    const err = await sdk(s).chat.completions.create({ model: 'gemini-2.5-flash', messages }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect((err as InstanceType<typeof OpenAI.BadRequestError>).error).toMatchObject({ message, code: '400' });
  });

  it("sends Gemini's context error to contextWindowFallback", async () => {
    const primary = await startProvider(answering(400, [{ error: { code: 400, message: 'The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).', status: 'INVALID_ARGUMENT' } }]));
    const { s, backup } = await pair({ primaryUrl: primary.origin, alone: true, contextWindowFallback: true });
    await sdk(s).chat.completions.create({ model: 'gemini-2.5-flash', messages });
    expect(chatPaths(backup).map((r) => r.model)).toEqual(['gpt-4.1-long']);
  });
});

describe('retryInfoHint (pure)', () => {
  const info = (retryDelay: unknown) => ({ details: [{ '@type': 'type.googleapis.com/google.rpc.RetryInfo', retryDelay }] });
  it('reads a protobuf Duration in seconds, fractions included, as a hint for the one request', () => {
    expect(retryInfoHint(info('29s'))).toEqual({ delayMs: 29_000, source: 'retry-info', fleetWide: false });
    expect(retryInfoHint(info('0.250000001s'))?.delayMs).toBe(251);
  });
  it('ignores a zero, a malformed or a missing delay, and details of other types', () => {
    for (const bad of ['0s', '-1s', '29', '1e3s', 'soon', 29, null]) expect(retryInfoHint(info(bad))).toBeUndefined();
    expect(retryInfoHint({ details: [{ '@type': 'type.googleapis.com/google.rpc.QuotaFailure', retryDelay: '5s' }] })).toBeUndefined();
    expect(retryInfoHint(undefined)).toBeUndefined();
    expect(retryInfoHint({ details: 'x' })).toBeUndefined();
  });
});

describe('what opens a deployment\'s breaker (LiteLLM: no cooldown on BadRequestError)', () => {
  it("does not open the breaker on a run of the client's 400s: the next valid request still goes to the primary", async () => {
    const { s, backup } = await pair({
      faults: { errors: [{ status: 400, message: "Invalid value for 'temperature'", times: 6 }] },
      primary: { breaker: { consecutiveFailures: 2, openS: 30 } },
      route: { retry: { maxAttempts: 1 } },
    });
    for (let i = 0; i < 6; i++) await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).catch(() => undefined);
    await new Promise((r) => setTimeout(r, 300));
    const res = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).withResponse();
    expect(res.response.headers.get('x-stormgate-fallback')).toBeNull();
    expect(chatPaths(backup)).toHaveLength(0);
  });

  it('does not open the breaker on 429s: the limit is the provider protecting itself', async () => {
    const { s, backup } = await pair({
      alone: true,
      faults: { errors: [{ status: 429, times: 6 }] },
      primary: { breaker: { consecutiveFailures: 2, openS: 30 } },
      route: { retry: { maxAttempts: 1 } },
    });
    for (let i = 0; i < 6; i++) await sdk(s).chat.completions.create({ model: 'gpt-4o', messages }).catch(() => undefined);
    await new Promise((r) => setTimeout(r, 300));
    const res = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages });
    expect(res.choices[0]!.message.content).toBeTruthy();
    expect(chatPaths(backup)).toHaveLength(0);
  });
});

describe("the SDK's own retry, invited by the gateway", () => {
  it('comes back after a hold-off the gateway announced, and is answered, with no extra upstream request', async () => {
    const { s } = await pair({ alone: true, faults: { errors: [{ status: 429, headers: { 'retry-after': '2' }, times: 1 }] }, route: { retry: { maxAttempts: 2, maxWaitHintMs: 500 } } });
    let sent = 0;
    const client = sdk(s, { maxRetries: 3, fetch: async (url, init) => (sent++, fetch(url, init)) });
    const t0 = Date.now();
    const res = await client.chat.completions.create({ model: 'gpt-4o', messages });
    expect(res.choices[0]!.message.content).toBeTruthy();
    expect(Date.now() - t0).toBeGreaterThanOrEqual(1_900);
    expect(sent).toBeLessThanOrEqual(3);
    expect(chatPaths(s.mock)).toHaveLength(2);
  });
});

describe("the SDK's own retry, invited by the gateway, lands after the hold-off", () => {
  it('is told the wait to the end of the hold-off its 429 started, not the bare hint, so its one retry is answered', async () => {
    // Hold-offs end at hint + a random spread; the SDK waits retry-after-ms to the millisecond. A fixed draw (half the
    // spread: 100 ms on a 2 s hint) keeps the test deterministic.
    const random = vi.spyOn(Math, 'random').mockReturnValue(0.5);
    try {
      const { s } = await pair({ alone: true, faults: { errors: [{ status: 429, headers: { 'retry-after': '2' }, times: 1 }] }, route: { retry: { maxAttempts: 2, maxWaitHintMs: 500 } } });
      let sent = 0;
      const client = sdk(s, { maxRetries: 1, fetch: async (url, init) => (sent++, fetch(url, init)) });
      const res = await client.chat.completions.create({ model: 'gpt-4o', messages });
      expect(res.choices[0]!.message.content).toBeTruthy();
      expect(sent).toBe(2);
      expect(chatPaths(s.mock)).toHaveLength(2);
    } finally {
      random.mockRestore();
    }
  });
});

describe('silent providers that look alive (Kong / Envoy reports: "stream hangs", "timeout ignored")', () => {
  it('moves a stream that sends only keep-alive comments past firstTokenMs to the backup', async () => {
    const primary = await startProvider(afterBody((req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const t = setInterval(() => res.write(': ping\n\n'), 100);
      res.on('close', () => clearInterval(t));
    }));
    const { s, backup } = await pair({ primaryUrl: primary.origin, primary: { timeouts: { firstTokenMs: 500 } } });
    const t0 = Date.now();
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
    expect(text.length).toBeGreaterThan(0);
    expect(Date.now() - t0).toBeLessThan(2_500);
    expect(primary.hits()).toBe(1);
    expect(chatPaths(backup)).toHaveLength(1);
  });

  it('ends a whole answer whose headers came at once but whose body never does at responseMs, and answers from the backup', async () => {
    const primary = await startProvider(afterBody((req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.flushHeaders();
      res.write('{"id":"chatcmpl-1",');
    }));
    const { s, backup } = await pair({ primaryUrl: primary.origin, primary: { timeouts: { responseMs: 500 } } });
    const t0 = Date.now();
    const res = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages });
    expect(res.choices[0]!.message.content).toBeTruthy();
    expect(Date.now() - t0).toBeLessThan(2_500);
    expect(chatPaths(backup)).toHaveLength(1);
  });

  it('takes a stream labelled text/event-stream; charset=utf-8 as the stream it is', async () => {
    const primary = await startProvider(afterBody((req, res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
      res.write(chatChunk({ role: 'assistant', content: 'ok' }, null));
      res.write(chatChunk({}, 'stop'));
      res.end('data: [DONE]\n\n');
    }));
    const { s } = await pair({ primaryUrl: primary.origin, alone: true });
    const stream = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
    expect(text).toBe('ok');
    expect(primary.hits()).toBe(1);
  });
});
