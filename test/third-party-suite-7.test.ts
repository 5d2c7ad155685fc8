// A seventh third-party failure-scenario suite, written from the README as an outside team would for a gateway whose
// primary is a SELF-HOSTED OpenAI-compatible server and whose backup is a cloud one (config/examples/
// self-hosted-with-cloud-backup.yaml): vLLM, Ollama's /v1 endpoint, llama.cpp's llama-server, Hugging Face TGI,
// LocalAI and SGLang, each failing the way it does on the wire. A model still loading (llama-server's 503 "Loading
// model", nginx's 502 page while the model restarts, a server not yet listening), error bodies in the servers' own
// shapes (vLLM's flat `{"object":"error",...,"code":400}`, Ollama's, TGI's `{"error": "...", "error_type": ...}`,
// LocalAI's empty `type`), streams that say things their own way (`data:` without a space, no `[DONE]`, a usage chunk
// with no choices, `finish_reason: "length"` or `"abort"`, empty deltas, old llama-server's `error:` line, vLLM's
// error event with `code: 400` for an engine fault, Ollama's error written as a bare JSON line mid-stream), servers
// that close every connection, a hung GPU, and model listings in the servers' shapes. Every scenario drives a real
// gateway over HTTP with the official `openai` SDK (or fetch, where the raw wire matters) and counts what each server
// received.
import type { IncomingMessage, RequestListener, ServerResponse } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import type { MockServer } from '../src/mock/server.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { expectOpenAIError } from './helpers/openai-error.ts';
import { freePort } from './helpers/free-port.ts';
import { cc, delta, scripted, type Script, type Seen } from './helpers/scripted-provider.ts';
import { requestLine, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';

const startStack = useStacks();
const startMock = useExtraMocks();
const startProvider = useFakeProviders();

type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];
type APIError = InstanceType<typeof OpenAI.APIError>;

const messages = [{ role: 'user' as const, content: 'Summarise the on-call handover.' }];
const LLAMA = 'meta-llama/Llama-3.1-8B-Instruct';
const DONE = 'data: [DONE]\n\n';
const json = (status: number, body: unknown, headers: Record<string, string> = {}): Script => ({
  status,
  headers: { 'content-type': 'application/json', ...headers },
  steps: [typeof body === 'string' ? body : JSON.stringify(body)],
});
/** A whole chat completion as vLLM answers one. */
const completion = (content: string, finish = 'stop'): Script =>
  json(200, {
    id: 'chatcmpl-b2f1',
    object: 'chat.completion',
    created: 1741290958,
    model: LLAMA,
    choices: [{ index: 0, message: { role: 'assistant', content, tool_calls: [], reasoning_content: null }, logprobs: null, finish_reason: finish, stop_reason: null }],
    usage: { prompt_tokens: 21, total_tokens: 30, completion_tokens: 9, prompt_tokens_details: null },
    prompt_logprobs: null,
  });
/** A streamed answer: the role chunk, the text in pieces, the finish, [DONE]. */
const streamed = (pieces: string[], finish = 'stop'): Script => ({
  steps: [cc([delta({ role: 'assistant', content: '' })]), ...pieces.map((p) => cc([delta({ content: p })])), cc([delta({}, finish)]), DONE],
});
const answer = (body: Record<string, unknown>, text = 'All quiet overnight.'): Script => (body.stream === true ? streamed([text]) : completion(text));

/** llama-server while it loads its GGUF: every endpoint answers this. */
const LOADING = { error: { code: 503, message: 'Loading model', type: 'unavailable_error' } };
/** nginx in front of a model server that is restarting. */
const NGINX_502 = '<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx/1.25.3</center>\r\n</body>\r\n</html>\r\n';

interface Local {
  s: Stack;
  /** The requests the self-hosted server received (POST bodies). */
  seen: Seen[];
  hits: () => number;
  backup: MockServer | undefined;
  client: OpenAI;
  /** Chat requests the cloud backup received. */
  backupChats: () => number;
}

/**
 * A gateway whose chat route goes to the self-hosted server `script` plays (provider `local`), then, with `backup`,
 * to a bundled mock as the cloud (`cloud`, model gpt-4o-mini). No breaker, a budget that never refuses and no parking
 * unless a scenario asks, three attempts 5 ms apart, so each scenario checks its own mechanism and its counts.
 */
async function selfHosted(
  script: (body: Record<string, unknown>, n: number) => Script,
  opts: {
    backup?: boolean;
    /** The cloud as a provider only (for a contextWindowFallback), not a target of the route. */
    backupNotTarget?: boolean;
    /** The model the local target sends (the example config names one); the client's own when unset. */
    localModel?: string;
    local?: Partial<ProviderInput>;
    route?: Partial<RouteInput>;
    /** A handler of the test's own for GET requests (the model listing). */
    get?: RequestListener;
    /** The whole handler, when the test needs the raw socket. */
    handler?: RequestListener;
  } = {},
): Promise<Local> {
  const seen: Seen[] = [];
  const post = scripted(script, seen);
  const p = await startProvider(opts.handler ?? ((req, res) => (req.method === 'GET' ? (opts.get ?? notFound)(req, res) : post(req, res))));
  const backup = opts.backup ? await startMock({ quiet: true, apiKey: 'cloud-key' }) : undefined;
  const providers: ConfigInput['providers'] = {
    local: { family: 'openai', baseUrl: `${p.origin}/v1`, apiKey: 'none', breaker: false, timeouts: { connectMs: 1_000, firstTokenMs: 3_000, idleMs: 3_000 }, ...opts.local },
  };
  const targets: RouteInput['targets'] = [{ provider: 'local', ...(opts.localModel !== undefined && { model: opts.localModel }) }];
  if (backup) {
    providers.cloud = { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: 'cloud-key', breaker: false };
    if (!opts.backupNotTarget) targets.push({ provider: 'cloud', model: 'gpt-4o-mini' });
  }
  const s = await startStack({
    config: () => ({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers,
      routes: [
        {
          name: 'chat',
          match: { path: '/v1/chat/completions' },
          targets,
          retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } },
          budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 },
          park: false,
          ...opts.route,
        },
      ],
    }),
  });
  const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0 });
  const backupChats = () => backup?.requests().filter((r) => r.path === '/v1/chat/completions').length ?? 0;
  return { s, seen, hits: p.hits, backup, client, backupChats };
}

const notFound: RequestListener = (_req, res) => {
  res.writeHead(404, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ error: { code: 404, message: 'File Not Found', type: 'not_found_error' } }));
};

const failure = async (p: Promise<unknown>): Promise<APIError> => {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(OpenAI.APIError);
  return err as APIError;
};

/** A raw POST through the gateway, for what the wire carries (headers, the SSE text). */
async function post(s: Stack, body: Record<string, unknown>): Promise<{ status: number; headers: Headers; text: string }> {
  const res = await fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: LLAMA, messages, ...body }) });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

async function collect(stream: AsyncIterable<OpenAI.Chat.Completions.ChatCompletionChunk>): Promise<{ text: string; finish: string | null; usage: unknown; chunks: number }> {
  let text = '';
  let finish: string | null = null;
  let usage: unknown = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    text += chunk.choices[0]?.delta?.content ?? '';
    finish = chunk.choices[0]?.finish_reason ?? finish;
    if (chunk.usage) usage = chunk.usage;
  }
  return { text, finish, usage, chunks };
}

describe('a model that is still loading or restarting', () => {
  it("retries llama-server's 503 \"Loading model\" until the model is up, and the client gets the answer", async () => {
    const l = await selfHosted((body, n) => (n <= 2 ? json(503, LOADING) : answer(body)));
    const res = await l.client.chat.completions.create({ model: LLAMA, messages }).withResponse();
    expect(res.data.choices[0]!.message.content).toBe('All quiet overnight.');
    expect(l.seen.map((x) => x.headers['x-retry-reason'])).toEqual([undefined, 'status_503', 'status_503']);
    expect(res.response.headers.get('x-stormgate-attempts')).toBe('3');
  });

  it('fails a model that keeps loading over to the cloud backup after maxAttempts, and says why', async () => {
    const l = await selfHosted(() => json(503, LOADING), { backup: true, localModel: LLAMA });
    const res = await l.client.chat.completions.create({ model: 'assistant', messages }).withResponse();
    expect(res.data.choices[0]!.message.content).toBeTruthy();
    expect(res.data.model).toContain('gpt-4o-mini');
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(l.hits()).toBe(3);
    expect(l.backupChats()).toBe(1);
  });

  it("answers a lone server's loading 503 in the OpenAI shape with its message, bounded attempts, and x-should-retry: false, so the SDK does not multiply them", async () => {
    const l = await selfHosted(() => json(503, LOADING));
    const sdk = new OpenAI({ baseURL: l.s.baseURL, apiKey: 'k', maxRetries: 2 });
    const err = await failure(sdk.chat.completions.create({ model: LLAMA, messages }));
    expect(err.status).toBe(503);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.error).toEqual({ message: 'Loading model', type: 'unavailable_error', param: null, code: '503' });
    expect(l.hits()).toBe(3);
  });

  it("retries nginx's 502 HTML page while the model server restarts, and the answer comes once it is back", async () => {
    const l = await selfHosted((body, n) => (n === 1 ? { status: 502, headers: { 'content-type': 'text/html' }, steps: [NGINX_502] } : answer(body)));
    const a = await l.client.chat.completions.create({ model: LLAMA, messages });
    expect(a.choices[0]!.message.content).toBe('All quiet overnight.');
    expect(l.hits()).toBe(2);
  });

  it("never hands nginx's HTML to the SDK: a restart that outlasts the attempts is a 502 in the OpenAI shape", async () => {
    const l = await selfHosted(() => ({ status: 502, headers: { 'content-type': 'text/html' }, steps: [NGINX_502] }));
    const r = await post(l.s, {});
    expect(r.status).toBe(502);
    expect(r.headers.get('content-type')).toMatch(/^application\/json/);
    expect(r.headers.get('x-should-retry')).toBe('false');
    const e = expectOpenAIError(JSON.parse(r.text), null as never, 'server_error');
    expect(e.message).toMatch(/^upstream answered 502/);
    expect(l.hits()).toBe(3);
  });

  it("fails a reverse proxy's HTML 500 over to the cloud after the retries, with the cloud's answer", async () => {
    const l = await selfHosted(() => ({ status: 500, headers: { 'content-type': 'text/html; charset=utf-8' }, steps: ['<!DOCTYPE html><title>500 Internal Server Error</title><h1>Internal Server Error</h1>'] }), { backup: true, localModel: LLAMA });
    const res = await l.client.chat.completions.create({ model: 'assistant', messages }).withResponse();
    expect(res.data.choices[0]!.message.content).toBeTruthy();
    expect(res.response.headers.get('x-stormgate-target')).toBe('cloud/gpt-4o-mini');
    expect(l.hits()).toBe(3);
  });

  it('sends traffic to the cloud while vLLM is not yet listening (it binds its port only once the weights are loaded)', async () => {
    const backup = await startMock({ quiet: true, apiKey: 'cloud-key' });
    const port = await freePort();
    const s = await startStack({
      config: () => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers: {
          local: { family: 'openai', baseUrl: `http://127.0.0.1:${port}/v1`, apiKey: 'none', breaker: false, timeouts: { connectMs: 500 } },
          cloud: { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: 'cloud-key', breaker: false },
        },
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'local', model: LLAMA }, { provider: 'cloud', model: 'gpt-4o-mini' }], retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } }, park: false }],
      }),
    });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'k', maxRetries: 0 });
    const started = Date.now();
    const res = await client.chat.completions.create({ model: 'assistant', messages }).withResponse();
    expect(res.data.choices[0]!.message.content).toBeTruthy();
    expect(res.response.headers.get('x-stormgate-target')).toBe('cloud/gpt-4o-mini');
    expect(Date.now() - started).toBeLessThan(3_000);
  });

  it('retries a server killed after its headers, before its first token, and streams the whole answer from the retry', async () => {
    const l = await selfHosted((body, n) => (n === 1 ? { steps: [cc([delta({ role: 'assistant', content: '' })]), 20, { destroy: true }] } : answer(body)));
    const out = await collect(await l.client.chat.completions.create({ model: LLAMA, messages, stream: true }));
    expect(out.text).toBe('All quiet overnight.');
    expect(out.finish).toBe('stop');
    expect(l.hits()).toBe(2);
  });

  it('ends a stream whose server restarted mid-answer with an error the SDK raises, and sends it nowhere again', async () => {
    const l = await selfHosted(() => ({ steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'All quiet' })]), 30, { destroy: true }] }), { backup: true, localModel: LLAMA });
    const stream = await l.client.chat.completions.create({ model: 'assistant', messages, stream: true });
    let text = '';
    const err = await (async () => {
      for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    })().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Error);
    expect(text).toBe('All quiet');
    expect(l.hits()).toBe(1);
    expect(l.backupChats()).toBe(0);
  });

  it('moves on from a server that took the request and never answered (a hung GPU) after firstTokenMs, trying the cloud before a retry', async () => {
    const l = await selfHosted(() => ({ steps: [], hold: true }), { backup: true, localModel: LLAMA, local: { timeouts: { connectMs: 1_000, firstTokenMs: 400, idleMs: 3_000 } } });
    const started = Date.now();
    const res = await l.client.chat.completions.create({ model: 'assistant', messages, stream: true }).withResponse();
    const out = await collect(res.data);
    expect(out.text.length).toBeGreaterThan(0);
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('timeout');
    expect(l.hits()).toBe(1);
    expect(Date.now() - started).toBeLessThan(3_000);
  });
});

describe("the servers' error bodies", () => {
  it("passes vLLM's flat 400 BadRequestError on in the OpenAI shape, once, to no backup", async () => {
    const message = '1 validation error:\n  Value error, temperature must be non-negative, got -1.0.';
    const l = await selfHosted(() => json(400, { object: 'error', message, type: 'BadRequestError', param: null, code: 400 }), { backup: true });
    const err = await failure(l.client.chat.completions.create({ model: LLAMA, messages, temperature: -1 }));
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect(err.error).toEqual({ message, type: 'BadRequestError', param: null, code: '400' });
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(l.hits()).toBe(1);
    expect(l.backupChats()).toBe(0);
  });

  it("passes vLLM's 404 for a model the client named on as the client's error, to no backup", async () => {
    const message = 'The model `llama-3-70b` does not exist.';
    const l = await selfHosted(() => json(404, { object: 'error', message, type: 'NotFoundError', param: null, code: 404 }), { backup: true });
    const err = await failure(l.client.chat.completions.create({ model: 'llama-3-70b', messages }));
    expect(err).toBeInstanceOf(OpenAI.NotFoundError);
    expect(err.message).toContain(message);
    expect(l.hits()).toBe(1);
    expect(l.backupChats()).toBe(0);
  });

  it('goes to the cloud when vLLM answers 404 for the model the config names (served under another --served-model-name after a redeploy)', async () => {
    const l = await selfHosted(() => json(404, { object: 'error', message: `The model \`${LLAMA}\` does not exist.`, type: 'NotFoundError', param: null, code: 404 }), { backup: true, localModel: LLAMA });
    const res = await l.client.chat.completions.create({ model: 'assistant', messages }).withResponse();
    expect(res.data.choices[0]!.message.content).toBeTruthy();
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('error');
    expect(l.hits()).toBe(1);
  });

  it("passes Ollama's /v1 404 for a model not pulled on with Ollama's message", async () => {
    const message = 'model "llama3.1:8b" not found, try pulling it first';
    const l = await selfHosted(() => json(404, { error: { message, type: 'api_error', param: null, code: null } }));
    const err = await failure(l.client.chat.completions.create({ model: 'llama3.1:8b', messages }));
    expect(err).toBeInstanceOf(OpenAI.NotFoundError);
    expect(err.error).toEqual({ message, type: 'api_error', param: null, code: null });
    expect(l.hits()).toBe(1);
  });

  it("puts an error sent as a bare string (Ollama's native API, TGI) in the OpenAI shape with that string as its message", async () => {
    const message = 'model "llama3.1:8b" not found, try pulling it first';
    const l = await selfHosted(() => json(404, { error: message }));
    const r = await post(l.s, { model: 'llama3.1:8b' });
    expect(r.status).toBe(404);
    const e = expectOpenAIError(JSON.parse(r.text), null as never, 'invalid_request_error');
    expect(e.message).toBe(message);
  });

  it('reads an error in words alone for its classification too: a context error so worded goes to contextWindowFallback', async () => {
    const message = "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion).";
    const l = await selfHosted(() => json(400, { error: message }), { backup: true, backupNotTarget: true, localModel: LLAMA, route: { contextWindowFallback: { provider: 'cloud', model: 'gpt-4.1' } } });
    const res = await l.client.chat.completions.create({ model: 'assistant', messages }).withResponse();
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('context_length');
    expect(l.hits()).toBe(1);
  });

  // TGI's 424 (generation failed: CUDA out of memory) is the server failing, as a 5xx is, though a 4xx.
  it("fails TGI's 424 (generation failed) over to the cloud, and retries it first once retryOn lists it", async () => {
    const generation = { error: 'Request failed during generation: Server error: CUDA out of memory.', error_type: 'generation' };
    const plain = await selfHosted(() => json(424, generation), { backup: true });
    const a = await plain.client.chat.completions.create({ model: 'tgi', messages });
    expect(a.choices[0]!.message.content).toBeTruthy();
    expect([plain.hits(), plain.backupChats()]).toEqual([1, 1]);

    const listed = await selfHosted(() => json(424, generation), { backup: true, route: { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 }, retryOn: [424, 429, 500, 502, 503, 504, 'network', 'timeout'] } } });
    const b = await listed.client.chat.completions.create({ model: 'tgi', messages });
    expect(b.choices[0]!.message.content).toBeTruthy();
    expect(listed.seen.map((x) => x.headers['x-retry-reason'])).toEqual([undefined, 'status_424']);
    expect(listed.backupChats()).toBe(1);
  });

  it("passes TGI's 424 on as it is, its message in the OpenAI shape, when there is no backup", async () => {
    const generation = { error: 'Request failed during generation: Server error: CUDA out of memory.', error_type: 'generation' };
    const l = await selfHosted(() => json(424, generation));
    const err = await failure(l.client.chat.completions.create({ model: 'tgi', messages }));
    expect(err.status).toBe(424);
    expect((err.error as { message: string }).message).toBe(generation.error);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(l.hits()).toBe(1);
  });

  it("never retries TGI's 422 validation error, and passes its text on as the message", async () => {
    const message = 'Input validation error: `temperature` must be strictly positive';
    const l = await selfHosted(() => json(422, { error: message, error_type: 'validation' }), { backup: true });
    const err = await failure(l.client.chat.completions.create({ model: 'tgi', messages, temperature: 0 }));
    expect(err).toBeInstanceOf(OpenAI.UnprocessableEntityError);
    expect(err.message).toContain(message);
    expect((err.error as { message: string }).message).toBe(message);
    expect(l.hits()).toBe(1);
    expect(l.backupChats()).toBe(0);
  });

  it("retries TGI's 429 \"Model is overloaded\" (its queue is full), then fails over to the cloud", async () => {
    const l = await selfHosted(() => json(429, { error: 'Model is overloaded', error_type: 'overloaded' }), { backup: true, localModel: 'tgi' });
    const res = await l.client.chat.completions.create({ model: 'assistant', messages }).withResponse();
    expect(res.data.choices[0]!.message.content).toBeTruthy();
    expect(res.response.headers.get('x-stormgate-target')).toBe('cloud/gpt-4o-mini');
    expect(l.seen.map((x) => x.headers['x-retry-reason'])).toEqual([undefined, 'status_429', 'status_429']);
  });

  it("answers TGI's overload with a 429 the SDK may retry when there is no backup (x-should-retry false: the gateway already did)", async () => {
    const l = await selfHosted(() => json(429, { error: 'Model is overloaded', error_type: 'overloaded' }));
    const err = await failure(l.client.chat.completions.create({ model: 'tgi', messages }));
    expect(err).toBeInstanceOf(OpenAI.RateLimitError);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect((err.error as { message: string }).message).toBe('Model is overloaded');
    expect(l.hits()).toBe(3);
  });

  it("retries vLLM's 500 when its engine died, then fails over; the breaker counts it", async () => {
    const body = { object: 'error', message: 'EngineCore encountered an issue. See stack trace (above) for the root cause.', type: 'InternalServerError', param: null, code: 500 };
    const l = await selfHosted(() => json(500, body), { backup: true, localModel: LLAMA, local: { breaker: { consecutiveFailures: 3, openS: 30 } } });
    const first = await l.client.chat.completions.create({ model: 'assistant', messages }).withResponse();
    expect(first.response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(l.hits()).toBe(3);
    // The next request does not wait on a dead engine: the breaker sends it straight to the cloud.
    const second = await l.client.chat.completions.create({ model: 'assistant', messages }).withResponse();
    expect(second.response.headers.get('x-stormgate-fallback')).toBe('breaker_open');
    expect(l.hits()).toBe(3);
  });

  it("fills in LocalAI's empty error type, and gives its numeric code as a string", async () => {
    const message = 'could not load model: rpc error: code = Unavailable desc = error reading from server: EOF';
    const l = await selfHosted(() => json(500, { error: { code: 500, message, type: '' } }));
    const err = await failure(l.client.chat.completions.create({ model: 'phi-2', messages }));
    expect(err.status).toBe(500);
    expect(err.error).toEqual({ message, type: 'server_error', param: null, code: '500' });
    expect(l.hits()).toBe(3);
  });

  it("reads vLLM's context error (no OpenAI code) as context_length_exceeded: to the route's contextWindowFallback, streamed", async () => {
    const message = "This model's maximum context length is 8192 tokens. However, you requested 9120 tokens (8096 in the messages, 1024 in the completion). Please reduce the length of the messages or completion.";
    const l = await selfHosted(() => json(400, { object: 'error', message, type: 'BadRequestError', param: null, code: 400 }), {
      backup: true,
      backupNotTarget: true,
      localModel: LLAMA,
      route: { contextWindowFallback: { provider: 'cloud', model: 'gpt-4.1' } },
    });
    const res = await l.client.chat.completions.create({ model: 'assistant', messages, stream: true }).withResponse();
    const out = await collect(res.data);
    expect(out.text.length).toBeGreaterThan(0);
    expect(res.response.headers.get('x-stormgate-fallback')).toBe('context_length');
    expect(l.hits()).toBe(1);
  });

  it("passes vLLM's context error on without a contextWindowFallback: not retried, and not sent to a backup whose window is not the question", async () => {
    const message = "You passed 9000 input tokens and requested 1000 output tokens. However, the model's context length is only 8192 tokens, resulting in a maximum input length of 7192 tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=9000)";
    const l = await selfHosted(() => json(400, { error: { message, type: 'BadRequestError', param: 'input_tokens', code: 400 } }), { backup: true, localModel: LLAMA });
    const err = await failure(l.client.chat.completions.create({ model: 'assistant', messages }));
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect(err.error).toEqual({ message, type: 'BadRequestError', param: 'input_tokens', code: '400' });
    expect(l.hits()).toBe(1);
    expect(l.backupChats()).toBe(0);
    expect((await requestLine(l.s)).attempts[0].reason).toBe('context_length');
  });

  it("keeps llama-server's own fields on its context error (n_prompt_tokens, n_ctx) when passing it on", async () => {
    const error = { code: 400, message: 'the request exceeds the available context size, try increasing it', type: 'exceed_context_size_error', n_prompt_tokens: 5000, n_ctx: 4096 };
    const l = await selfHosted(() => json(400, { error }));
    const err = await failure(l.client.chat.completions.create({ model: 'qwen2.5', messages }));
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect(err.error).toEqual({ ...error, code: '400', param: null });
    expect(l.hits()).toBe(1);
  });
});

describe('streams in the servers\' own dialects', () => {
  it('reads `data:` lines without the space the SSE spec makes optional, and the SDK gets the whole text', async () => {
    const chunk = (d: Record<string, unknown>, finish: string | null = null) => cc([delta(d, finish)]).replace(/^data: /, 'data:');
    const l = await selfHosted(() => ({ steps: [chunk({ role: 'assistant', content: '' }), chunk({ content: 'All ' }), chunk({ content: 'quiet.' }), chunk({}, 'stop'), 'data:[DONE]\n\n'] }));
    const out = await collect(await l.client.chat.completions.create({ model: LLAMA, messages, stream: true }));
    expect(out).toMatchObject({ text: 'All quiet.', finish: 'stop' });
    expect(l.hits()).toBe(1);
  });

  it('ends a stream that finished but never sent [DONE] (older llama-server) cleanly, with a [DONE] added', async () => {
    const l = await selfHosted(() => ({ steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'All quiet.' })]), cc([delta({}, 'stop')], { timings: { predicted_n: 3 } })] }));
    const r = await post(l.s, { stream: true });
    expect(r.status).toBe(200);
    expect(r.text.trimEnd().endsWith('data: [DONE]')).toBe(true);
    expect(r.text).not.toContain('stream_interrupted');
    const out = await collect(await l.client.chat.completions.create({ model: LLAMA, messages, stream: true }));
    expect(out).toMatchObject({ text: 'All quiet.', finish: 'stop' });
    expect(l.hits()).toBe(2);
  });

  it('ends a stream closed cleanly mid-answer, with no finish and no [DONE] (an Ollama runner that crashed), with an error the SDK raises', async () => {
    const l = await selfHosted(() => ({ steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'All qu' })])] }));
    const stream = await l.client.chat.completions.create({ model: 'llama3.1:8b', messages, stream: true });
    const err = await collect(stream).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Error);
    expect(l.hits()).toBe(1);
  });

  it("hands the SDK vLLM's usage chunk with empty choices (include_usage) after the finish, then [DONE]", async () => {
    const usage = { prompt_tokens: 21, total_tokens: 24, completion_tokens: 3 };
    const l = await selfHosted(() => ({ steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'All quiet.' })]), cc([delta({}, 'stop', 0, { stop_reason: null })]), 200, cc([], { usage }), DONE] }));
    const out = await collect(await l.client.chat.completions.create({ model: LLAMA, messages, stream: true, stream_options: { include_usage: true } }));
    expect(out).toMatchObject({ text: 'All quiet.', finish: 'stop', usage });
    expect(l.seen[0]!.body.stream_options).toEqual({ include_usage: true });
  });

  it("waits for the usage chunk that comes without [DONE] and ends the stream after it, whole", async () => {
    const usage = { prompt_tokens: 21, total_tokens: 24, completion_tokens: 3 };
    const l = await selfHosted(() => ({ steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'All quiet.' })]), cc([delta({}, 'stop')]), 1_300, cc([], { usage })] }));
    const out = await collect(await l.client.chat.completions.create({ model: LLAMA, messages, stream: true, stream_options: { include_usage: true } }));
    expect(out).toMatchObject({ text: 'All quiet.', finish: 'stop', usage });
  });

  it('passes finish_reason "length" on as a finished answer: no retry, no error', async () => {
    const l = await selfHosted(() => streamed(['All quiet over'], 'length'));
    const out = await collect(await l.client.chat.completions.create({ model: LLAMA, messages, stream: true, max_tokens: 3 }));
    expect(out).toMatchObject({ text: 'All quiet over', finish: 'length' });
    expect(l.hits()).toBe(1);
  });

  it('passes a whole answer cut at max_tokens (finish_reason "length") on as it is', async () => {
    const l = await selfHosted(() => completion('All quiet over', 'length'));
    const a = await l.client.chat.completions.create({ model: LLAMA, messages, max_tokens: 3 });
    expect(a.choices[0]!.finish_reason).toBe('length');
    expect(l.hits()).toBe(1);
  });

  // vLLM finishes a request its engine stopped (a replica shutting down, a pause) with finish_reason "abort", then
  // [DONE] (vLLM issue #57082): an answer cut short, not a complete one.
  it('raises vLLM\'s finish_reason "abort" after output as an error in the SDK, never the clean end its [DONE] says', async () => {
    const l = await selfHosted(() => streamed(['All quiet'], 'abort'));
    const err = await collect(await l.client.chat.completions.create({ model: LLAMA, messages, stream: true })).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as APIError).message).toContain('finish_reason "abort"');
    expect(l.hits()).toBe(1);
    const r = await post(l.s, { stream: true });
    expect(r.text).toContain('All quiet');
    expect(r.text).not.toContain('"finish_reason":"abort"');
    expect(r.text).not.toContain('[DONE]');
  });

  it('retries vLLM\'s finish_reason "abort" before any output (the replica stopped it), and streams the retry', async () => {
    const l = await selfHosted((body, n) => (n === 1 ? streamed([], 'abort') : answer(body)));
    const out = await collect(await l.client.chat.completions.create({ model: LLAMA, messages, stream: true }));
    expect(out).toMatchObject({ text: 'All quiet overnight.', finish: 'stop' });
    expect(l.hits()).toBe(2);
  });

  it('retries vLLM\'s whole answer that finished with "abort" (the replica stopped it): the retry\'s answer reaches the SDK', async () => {
    const l = await selfHosted((body, n) => (n === 1 ? completion('All qu', 'abort') : answer(body)));
    const a = await l.client.chat.completions.create({ model: LLAMA, messages });
    expect(a.choices[0]!.message.content).toBe('All quiet overnight.');
    expect(l.seen.map((x) => x.headers['x-retry-reason'])).toEqual([undefined, 'bad_stream']);
  });

  it('keeps the first-token timer running through chunks with an empty delta: a server sending only `delta: {}` is timed out and retried', async () => {
    const empty = cc([delta({})]);
    const l = await selfHosted(
      (body, n) => (n === 1 ? { steps: [cc([delta({ role: 'assistant', content: '' })]), ...Array.from({ length: 30 }, (_, i) => (i % 2 === 0 ? empty : 100))] } : answer(body)),
      { local: { timeouts: { connectMs: 1_000, firstTokenMs: 500, idleMs: 3_000 } } },
    );
    const started = Date.now();
    const out = await collect(await l.client.chat.completions.create({ model: LLAMA, messages, stream: true }));
    expect(out.text).toBe('All quiet overnight.');
    expect(l.seen.map((x) => x.headers['x-retry-reason'])).toEqual([undefined, 'timeout_first_token']);
    expect(Date.now() - started).toBeLessThan(2_500);
  });

  it('streams through SSE comment keep-alives (sse-starlette\'s `: ping`) before and between the tokens', async () => {
    const ping = ': ping - 2025-03-06 19:55:58.123456+00:00\n\n';
    const l = await selfHosted(() => ({ steps: [ping, cc([delta({ role: 'assistant', content: '' })]), ping, cc([delta({ content: 'All ' })]), ping, cc([delta({ content: 'quiet.' })]), cc([delta({}, 'stop')]), DONE] }));
    const out = await collect(await l.client.chat.completions.create({ model: LLAMA, messages, stream: true }));
    expect(out).toMatchObject({ text: 'All quiet.', finish: 'stop' });
  });

  it("retries vLLM's error event before the first output (an engine fault it labels BadRequestError, code 400): not a verdict on the request", async () => {
    const vllmError = `data: ${JSON.stringify({ error: { object: 'error', message: 'Engine loop is not running. Inspect the stacktrace to find the original error.', type: 'BadRequestError', param: null, code: 400 } })}\n\n`;
    const l = await selfHosted((body, n) => (n === 1 ? { steps: [cc([delta({ role: 'assistant', content: '' })]), vllmError, DONE] } : answer(body)));
    const out = await collect(await l.client.chat.completions.create({ model: LLAMA, messages, stream: true }));
    expect(out.text).toBe('All quiet overnight.');
    expect(l.hits()).toBe(2);
  });

  it("ends a stream at vLLM's error event after output, followed by its [DONE], with the error the SDK raises: never a clean end", async () => {
    const message = 'Engine loop is not running.';
    const vllmError = `data: ${JSON.stringify({ error: { object: 'error', message, type: 'BadRequestError', param: null, code: 400 } })}\n\n`;
    const l = await selfHosted(() => ({ steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'All quiet' })]), vllmError, DONE] }));
    const stream = await l.client.chat.completions.create({ model: LLAMA, messages, stream: true });
    const err = await collect(stream).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as APIError).message).toContain(message);
    expect(l.hits()).toBe(1);
  });

  it("raises TGI's mid-stream string error (error_type generation) in the SDK with its text", async () => {
    const tgiError = `data: ${JSON.stringify({ error: 'Request failed during generation: Server error: CUDA out of memory.', error_type: 'generation' })}\n\n`;
    const l = await selfHosted(() => ({ steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'All' })]), tgiError] }));
    const err = await collect(await l.client.chat.completions.create({ model: 'tgi', messages, stream: true })).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect((err as APIError).message).toContain('CUDA out of memory');
  });

  it("retries TGI's string error event before the first output (a generation fault), and streams the retry", async () => {
    const tgiError = `data: ${JSON.stringify({ error: 'Request failed during generation: Server error: CUDA out of memory.', error_type: 'generation' })}\n\n`;
    const l = await selfHosted((body, n) => (n === 1 ? { steps: [tgiError] } : answer(body)));
    const out = await collect(await l.client.chat.completions.create({ model: 'tgi', messages, stream: true }));
    expect(out.text).toBe('All quiet overnight.');
    expect(l.hits()).toBe(2);
  });

  it("does not end cleanly on old llama-server's `error:` line (not an SSE field) after output: the SDK raises", async () => {
    const line = `error: ${JSON.stringify({ code: 500, message: 'failed to decode the batch, n_batch = 512, ret = -1', type: 'server_error' })}\n\n`;
    const l = await selfHosted(() => ({ steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'All' })]), line] }));
    const err = await collect(await l.client.chat.completions.create({ model: 'qwen2.5', messages, stream: true })).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Error);
    expect(l.hits()).toBe(1);
  });

  it("does not end cleanly on Ollama's error written mid-stream as a bare JSON line: the SDK raises", async () => {
    const line = `${JSON.stringify({ error: { message: 'an error was encountered while running the model: unexpected EOF', type: 'api_error', param: null, code: null } })}\n`;
    const l = await selfHosted(() => ({ steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'All' })]), line] }));
    const err = await collect(await l.client.chat.completions.create({ model: 'llama3.1:8b', messages, stream: true })).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Error);
    expect(l.hits()).toBe(1);
  });
});

describe('connections', () => {
  it('serves ten calls in a row from a server that closes the connection after every answer (Connection: close), one attempt each', async () => {
    const l = await selfHosted((body) => {
      const a = answer(body);
      return { ...a, headers: { ...a.headers, connection: 'close' } };
    });
    for (let i = 0; i < 10; i++) {
      const res = await l.client.chat.completions.create({ model: LLAMA, messages }).withResponse();
      expect(res.response.headers.get('x-stormgate-attempts')).toBe('1');
    }
    expect(l.hits()).toBe(10);
  });

  it('serves ten streams in a row from a server that closes each connection right after its answer without saying so', async () => {
    let n = 0;
    const l = await selfHosted(() => streamed(['ok']), {
      handler: (req: IncomingMessage, res: ServerResponse) => {
        req.resume();
        req.on('end', () => {
          n++;
          res.writeHead(200, { 'content-type': 'text/event-stream' });
          for (const step of streamed([`answer ${n}`]).steps) res.write(step as string);
          res.end(() => res.socket?.end());
        });
      },
    });
    for (let i = 1; i <= 10; i++) {
      const out = await collect(await l.client.chat.completions.create({ model: LLAMA, messages, stream: true }));
      expect(out.text).toMatch(/^answer \d+$/);
      await sleep(5);
    }
  });
});

describe('model listings in the servers\' shapes', () => {
  it("lists llama-server's model (its `models` beside `data`, its `meta` kept) for a route open to any model", async () => {
    const meta = { vocab_type: 2, n_vocab: 152064, n_ctx_train: 32768, n_embd: 3584, n_params: 7615616512, size: 4677120000 };
    const l = await selfHosted((body) => answer(body), {
      get: (_req, res) => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ models: [{ name: 'qwen2.5-7b-instruct-q4_k_m.gguf', model: 'qwen2.5-7b-instruct-q4_k_m.gguf', type: 'model' }], object: 'list', data: [{ id: 'qwen2.5-7b-instruct-q4_k_m.gguf', object: 'model', created: 1741290958, owned_by: 'llamacpp', meta }] }));
      },
    });
    const list = await l.client.models.list();
    const found = list.data.find((m) => m.id === 'qwen2.5-7b-instruct-q4_k_m.gguf') as (OpenAI.Models.Model & { meta?: unknown }) | undefined;
    expect(found).toMatchObject({ object: 'model', owned_by: 'llamacpp', meta });
  });

  it("lists Ollama's tagged models (ids with a colon, owned_by its namespace) and serves one the SDK retrieves", async () => {
    const l = await selfHosted((body) => answer(body), {
      get: (req, res) => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ object: 'list', data: [{ id: 'llama3.1:8b', object: 'model', created: 1741290958, owned_by: 'library' }, { id: 'hf.co/bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M', object: 'model', created: 1741290000, owned_by: 'bartowski' }] }));
      },
    });
    const ids = (await l.client.models.list()).data.map((m) => m.id);
    expect(ids).toEqual(expect.arrayContaining(['llama3.1:8b', 'hf.co/bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M']));
    const m = await l.client.models.retrieve('hf.co/bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M');
    expect(m.owned_by).toBe('bartowski');
  });
});
