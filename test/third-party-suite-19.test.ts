// A nineteenth third-party failure-scenario suite, written from the README alone ("What happens to a request",
// "Retries", "Failover and API families", "Priority pools" on the bytes of waiting bodies, "Streaming", "Errors",
// "Paths", "Headers") as a team would test the gateway before putting MULTIMODAL and LARGE-PAYLOAD traffic through it:
// chat completions with base64 images of megabytes, hundreds of tool definitions, structured outputs, `n > 1`,
// `logprobs`, audio input, answers of megabytes streamed and whole, and /v1/embeddings with 2,048 inputs, under
// upstream faults (503s, resets while the body is still being uploaded, 429s with hints, answers cut mid-body, slow
// first tokens, an Anthropic backup).
// What such a team fears, and what each test checks at the upstream, byte for byte:
//   - a retry that sends other bytes than the first attempt did (every attempt's body is kept and compared);
//   - a body over `server.bodyLimitBytes` answered with anything but 413 in the OpenAI error shape;
//   - the bodies of requests parked behind a hold-off growing without bound (`server.maxWaitingBodyBytes`);
//   - a big answer cut on the wire and handed on as if whole;
//   - a multi-MB stream buffered instead of passed through event by event;
//   - an image translated wrongly for the Anthropic backup, or a request the backup cannot express sent to it anyway;
//   - headers mishandled around large bodies: content-length, a client's gzip body.
// Black box: real gateways over real HTTP, the official `openai` SDK as the client (its own retries off), upstreams
// of the test's own that record every byte they get. Timing bounds are generous: the suite runs on a loaded 2-core
// machine.
import { createHash } from 'node:crypto';
import { request as httpRequest, type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from 'node:http';
import { once } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { gzipSync } from 'node:zlib';
import OpenAI from 'openai';
import { describe, expect, it, vi } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { expectOpenAIError, sdkError } from './helpers/openai-error.ts';
import { cc, delta, DONE } from './helpers/scripted-provider.ts';
import { scrapeMetrics, useGateways } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startGateway = useGateways();

type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];

// ---------------------------------------------------------------------------------------------------------------
// Upstreams that record every byte of every attempt.

interface Hit {
  /** The bytes of the body that arrived (all of it, unless the upstream cut the upload). */
  raw: Buffer;
  headers: IncomingHttpHeaders;
  url: string;
  /** When the request's head arrived (Date.now()). */
  at: number;
  /** The body as JSON, when it arrived whole. */
  json?: Record<string, unknown>;
}

/** What an upstream does with its `n`th request (from 1). */
type Plan =
  /** Read the whole body, then answer. */
  | { answer: (res: ServerResponse, hit: Hit) => void | Promise<void> }
  /** Cut the connection once this many body bytes have arrived: a reset while the gateway is still uploading. */
  | { resetAfterBytes: number }
  /** Answer 503 and close the connection at once, without reading the body (a load balancer in front of a provider). */
  | { early503: true };

interface Upstream {
  origin: string;
  hits: Hit[];
}

async function upstream(plan: (n: number, hit: Hit) => Plan): Promise<Upstream> {
  const hits: Hit[] = [];
  const p = await startProvider((req: IncomingMessage, res: ServerResponse) => {
    const hit: Hit = { raw: Buffer.alloc(0), headers: req.headers, url: req.url ?? '', at: Date.now() };
    hits.push(hit);
    const chunks: Buffer[] = [];
    let got = 0;
    const step = plan(hits.length, hit);
    if ('early503' in step) {
      res.writeHead(503, { 'content-type': 'application/json', connection: 'close' });
      res.end(JSON.stringify({ error: { message: 'upstream connect error', type: 'server_error', param: null, code: null } }));
      req.socket.end();
      return;
    }
    req.on('data', (d: Buffer) => {
      chunks.push(d);
      got += d.length;
      if ('resetAfterBytes' in step && got >= step.resetAfterBytes) {
        hit.raw = Buffer.concat(chunks);
        req.socket.destroy();
      }
    });
    req.on('end', () => {
      hit.raw = Buffer.concat(chunks);
      try {
        hit.json = JSON.parse(hit.raw.toString('utf8')) as Record<string, unknown>;
      } catch {
        // left undefined: the test says what it expected
      }
      if ('answer' in step) void step.answer(res, hit);
    });
  });
  return { origin: p.origin, hits };
}

/** Every attempt's body arrived as it would from a plain client: its declared length is its real one, not compressed. */
function expectCleanUpload(hit: Hit): void {
  expect(hit.headers['content-encoding']).toBeUndefined();
  if (hit.headers['content-length'] !== undefined) expect(Number(hit.headers['content-length'])).toBe(hit.raw.length);
  else expect(hit.headers['transfer-encoding']).toBe('chunked');
}

const sha = (b: Buffer | string) => createHash('sha256').update(b).digest('hex');

// Answers.

const send = (res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}) => {
  const text = typeof body === 'string' ? body : JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(text)), ...headers });
  res.end(text);
};
const overloaded = (res: ServerResponse, headers: Record<string, string> = {}) =>
  send(res, 503, { error: { message: 'The server is overloaded or not ready yet.', type: 'server_error', param: null, code: null } }, headers);

function chatCompletion(contents: string[], extra: { logprobs?: unknown } = {}): Record<string, unknown> {
  return {
    id: 'chatcmpl-big',
    object: 'chat.completion',
    created: 1741290958,
    model: 'gpt-4o-2024-08-06',
    choices: contents.map((content, index) => ({ index, message: { role: 'assistant', content, refusal: null }, logprobs: extra.logprobs ?? null, finish_reason: 'stop' })),
    usage: { prompt_tokens: 90_000, completion_tokens: 40, total_tokens: 90_040 },
  };
}

// ---------------------------------------------------------------------------------------------------------------
// Large, multimodal requests.

/** A PNG of about `bytes` (a real signature and IHDR, then filler), as base64. */
function pngBase64(bytes: number, seed = 7): string {
  const head = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13, 0x49, 0x48, 0x44, 0x52]);
  const body = Buffer.alloc(bytes - head.length);
  let x = seed;
  for (let i = 0; i < body.length; i++) {
    x = (x * 1103515245 + 12345) >>> 0;
    body[i] = x >>> 24;
  }
  return Buffer.concat([head, body]).toString('base64');
}

/** `count` function tools, each with a JSON Schema of a few properties (an agent with a big MCP toolbox). */
function manyTools(count: number): OpenAI.Chat.Completions.ChatCompletionTool[] {
  return Array.from({ length: count }, (_, i) => ({
    type: 'function' as const,
    function: {
      name: `tool_${i}_lookup`,
      description: `Looks up record kind ${i} by its id and returns its fields as JSON. `.repeat(3),
      parameters: {
        type: 'object',
        properties: {
          id: { type: 'string', description: `the id of a kind-${i} record` },
          fields: { type: 'array', items: { type: 'string', enum: ['name', 'owner', 'created', 'status'] } },
          limit: { type: 'integer', minimum: 1, maximum: 100 },
        },
        required: ['id'],
        additionalProperties: false,
      },
    },
  }));
}

const invoiceSchema = {
  name: 'invoice_fields',
  strict: true,
  schema: {
    type: 'object',
    properties: { vendor: { type: 'string' }, total_cents: { type: 'integer' }, lines: { type: 'array', items: { type: 'string' } } },
    required: ['vendor', 'total_cents', 'lines'],
    additionalProperties: false,
  },
};

/** A chat request with an image of `imageBytes` as a data: URL, a long text, `tools` tool definitions and a schema. */
function multimodal(imageBytes: number, tools = 300, mime = 'image/png'): OpenAI.Chat.Completions.ChatCompletionCreateParamsNonStreaming {
  return {
    model: 'gpt-4o',
    messages: [
      { role: 'system', content: 'You extract invoice fields. Answer in the schema given.' },
      {
        role: 'user',
        content: [
          { type: 'text', text: 'Read this scanned invoice (é, 日本語, emoji 🧾 kept as they are).' },
          { type: 'image_url', image_url: { url: `data:${mime};base64,${pngBase64(imageBytes)}`, detail: 'high' } },
        ],
      },
    ],
    tools: manyTools(tools),
    response_format: { type: 'json_schema', json_schema: invoiceSchema },
  };
}

// ---------------------------------------------------------------------------------------------------------------
// Gateways in front of the recording upstreams.

/** Quick retries with no jitter, a budget that never refuses, no breaker. */
const QUIET: Partial<RouteInput> = {
  retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 20, capMs: 20 } },
  budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 },
  timeoutMs: 30_000,
};

interface GatewayOpts {
  /** Extra providers beside `primary` (an Anthropic backup, say): name -> [family, origin]. */
  more?: Record<string, ['openai' | 'anthropic', string]>;
  route?: Partial<RouteInput>;
  targets?: RouteInput['targets'];
  server?: Record<string, unknown>;
  provider?: Partial<ProviderInput>;
}

async function gatewayTo(primary: Upstream, opts: GatewayOpts = {}): Promise<{ url: string; client: OpenAI; logs: string[] }> {
  const provider = (family: 'openai' | 'anthropic', origin: string, name: string): ProviderInput =>
    ({
      family,
      baseUrl: family === 'openai' ? `${origin}/v1` : origin,
      apiKey: `${name}-provider-key-0123456789`,
      breaker: false,
      timeouts: { connectMs: 2_000, firstTokenMs: 10_000, idleMs: 10_000 },
      ...opts.provider,
    }) as ProviderInput;
  const providers: ConfigInput['providers'] = { primary: provider('openai', primary.origin, 'primary') };
  for (const [name, [family, origin]] of Object.entries(opts.more ?? {})) providers[name] = provider(family, origin, name);
  const targets = opts.targets ?? [{ provider: 'primary' }];
  const config = ConfigSchema.parse({
    server: { host: '127.0.0.1', port: 0, logLevel: 'info', ...opts.server },
    providers,
    routes: [
      { name: 'chat', match: { path: '/v1/chat/completions' }, targets, ...QUIET, ...opts.route },
      { name: 'embeddings', match: { path: '/v1/embeddings' }, targets: [{ provider: 'primary' }], ...QUIET, ...opts.route },
    ],
  });
  const logs: string[] = [];
  const url = await startGateway(config, { logs });
  return { url, logs, client: new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sk-client-0123', maxRetries: 0, timeout: 60_000 }) };
}

/** POSTs `body` (bytes as they are) to the gateway with fetch; status, headers and the parsed answer. */
async function post(url: string, path: string, body: Buffer | string, headers: Record<string, string> = {}) {
  const res = await fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
  const text = await res.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = text;
  }
  return { status: res.status, headers: res.headers, json: json as Record<string, unknown> };
}

// ---------------------------------------------------------------------------------------------------------------

describe('retries of large multimodal requests send the same bytes on every attempt', () => {
  it('a 3.5 MB request (a 2.5 MB image, 300 tools, json_schema, n: 2, logprobs) through a 503 and a 429 with retry-after-ms: identical bytes, the hint waited, every choice and its logprobs back', async () => {
    const logprobs = { content: [{ token: '{"', logprob: -0.01, bytes: [123, 34], top_logprobs: [{ token: '{"', logprob: -0.01, bytes: [123, 34] }] }], refusal: null };
    const answer = JSON.stringify({ vendor: 'ACME GmbH', total_cents: 129_900, lines: ['widgets'] });
    const up = await upstream((n) => ({
      answer: (res) => (n === 1 ? overloaded(res) : n === 2 ? send(res, 429, { error: { message: 'Rate limit reached for gpt-4o', type: 'requests', param: null, code: 'rate_limit_exceeded' } }, { 'retry-after-ms': '600' }) : send(res, 200, chatCompletion([answer, answer], { logprobs }))),
    }));
    const { client } = await gatewayTo(up);
    const params = { ...multimodal(2_500_000), n: 2, logprobs: true, top_logprobs: 1 };
    const sent = Buffer.from(JSON.stringify(params));
    expect(sent.length).toBeGreaterThan(3_500_000);

    const { data: completion, response } = await client.chat.completions.create(params).withResponse();

    expect(up.hits).toHaveLength(3);
    for (const hit of up.hits) {
      expectCleanUpload(hit);
      // The model is not swapped, so nothing is re-serialised: the client's bytes, byte for byte, every time.
      expect(sha(hit.raw)).toBe(sha(sent));
    }
    // The 429's hint was waited out (x U(1, 1.2)), not the 20 ms backoff.
    expect(up.hits[2]!.at - up.hits[1]!.at).toBeGreaterThanOrEqual(550);
    expect(up.hits[2]!.headers['x-retry-attempt']).toBe('2');
    expect(completion.choices).toHaveLength(2);
    expect(completion.choices.map((c) => c.message.content)).toEqual([answer, answer]);
    expect(completion.choices[1]!.logprobs).toEqual(logprobs);
    expect(response.headers.get('x-stormgate-attempts')).toBe('3');
  });

  it('a reset while the gateway is still uploading an 8 MB body, and a 503 sent before the body was read: the retry carries the whole body, identical', async () => {
    const up = await upstream((n) => (n === 1 ? { resetAfterBytes: 1_000_000 } : n === 2 ? { early503: true } : { answer: (res) => send(res, 200, chatCompletion(['read it'])) }));
    const { client } = await gatewayTo(up, { route: { retry: { maxAttempts: 3, retryOn: [503, 'network'], backoff: { strategy: 'fixed', baseMs: 20, capMs: 20 } } } });
    const params = multimodal(6_000_000, 10);
    const sent = Buffer.from(JSON.stringify(params));
    expect(sent.length).toBeGreaterThan(8_000_000);

    const completion = await client.chat.completions.create(params);

    expect(completion.choices[0]!.message.content).toBe('read it');
    expect(up.hits).toHaveLength(3);
    // The cut upload was the start of the same bytes; the last attempt got them all.
    expect(up.hits[0]!.raw.length).toBeGreaterThanOrEqual(1_000_000);
    expect(up.hits[0]!.raw.length).toBeLessThan(sent.length);
    expect(up.hits[0]!.raw.equals(sent.subarray(0, up.hits[0]!.raw.length))).toBe(true);
    expectCleanUpload(up.hits[2]!);
    expect(up.hits[2]!.raw.equals(sent)).toBe(true);
    expect(Number(up.hits[0]!.headers['content-length'])).toBe(sent.length);
    expect(Number(up.hits[1]!.headers['content-length'])).toBe(sent.length);
  });

  it('2,048 embedding inputs through a 503 and an answer cut mid-body: identical bytes on every attempt, all 2,048 vectors back exactly', async () => {
    const dims = 256;
    const vector = (i: number) => Float32Array.from({ length: dims }, (_, j) => Math.fround(Math.sin(i * 31 + j) / 7));
    const up = await upstream((n) => ({
      answer: (res, hit) => {
        if (n === 1) return overloaded(res, { 'retry-after-ms': '50' });
        const inputs = hit.json!.input as string[];
        const base64 = hit.json!.encoding_format === 'base64';
        const data = inputs.map((_, i) => ({ object: 'embedding', index: i, embedding: base64 ? Buffer.from(vector(i).buffer).toString('base64') : Array.from(vector(i)) }));
        const text = JSON.stringify({ object: 'list', data, model: 'text-embedding-3-small', usage: { prompt_tokens: 400_000, total_tokens: 400_000 } });
        if (n === 2) {
          // Its length says all of it; a proxy's idle timeout cuts it after a fifth.
          res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(text)) });
          res.write(text.slice(0, Math.floor(text.length / 5)));
          setTimeout(() => res.socket?.destroy(), 30);
          return;
        }
        send(res, 200, text);
      },
    }));
    const { client } = await gatewayTo(up);
    const input = Array.from({ length: 2048 }, (_, i) => `document ${i}: ${'lorem ipsum dolor sit amet '.repeat(36)}`);

    const result = await client.embeddings.create({ model: 'text-embedding-3-small', input });

    expect(up.hits).toHaveLength(3);
    for (const hit of up.hits) expectCleanUpload(hit);
    expect(up.hits[1]!.raw.equals(up.hits[0]!.raw)).toBe(true);
    expect(up.hits[2]!.raw.equals(up.hits[0]!.raw)).toBe(true);
    expect((up.hits[0]!.json!.input as string[]).length).toBe(2048);
    expect(result.data).toHaveLength(2048);
    for (const i of [0, 1, 1023, 2047]) {
      expect(result.data[i]!.index).toBe(i);
      expect(result.data[i]!.embedding).toEqual(Array.from(vector(i)));
    }
  });

  it('a gzip body from the client is decoded once: every attempt gets the same plain JSON, with its own length and no content-encoding', async () => {
    const up = await upstream((n) => ({ answer: (res) => (n === 1 ? overloaded(res) : send(res, 200, chatCompletion(['unzipped']))) }));
    const { url } = await gatewayTo(up);
    const plain = Buffer.from(JSON.stringify(multimodal(2_000_000, 50)));
    const zipped = gzipSync(plain);

    const res = await post(url, '/v1/chat/completions', zipped, { 'content-encoding': 'gzip' });

    expect(res.status).toBe(200);
    expect((res.json.choices as Array<{ message: { content: string } }>)[0]!.message.content).toBe('unzipped');
    expect(up.hits).toHaveLength(2);
    for (const hit of up.hits) {
      expectCleanUpload(hit);
      expect(hit.raw.equals(plain)).toBe(true);
    }
  });
});

describe('bodies over server.bodyLimitBytes', () => {
  const LIMIT = 1_000_000;

  it('answers 413 request_too_large in the OpenAI shape (naming the limit) to the SDK, streamed or not, and to a gzip bomb; a body of exactly the limit goes through', async () => {
    const up = await upstream(() => ({ answer: (res) => send(res, 200, chatCompletion(['fits'])) }));
    const { url, client } = await gatewayTo(up, { server: { bodyLimitBytes: LIMIT } });
    const tooBig = multimodal(900_000, 5);
    expect(JSON.stringify(tooBig).length).toBeGreaterThan(LIMIT);

    const whole = await sdkError(client.chat.completions.create(tooBig));
    expect(whole.status).toBe(413);
    expectOpenAIError({ error: whole.error }, 'request_too_large');
    expect((whole.error as { message: string }).message).toContain(String(LIMIT));
    expect(whole.headers?.get('x-should-retry')).toBe('false');

    const streamed = await sdkError(client.chat.completions.create({ ...tooBig, stream: true }));
    expect(streamed.status).toBe(413);
    expectOpenAIError({ error: streamed.error }, 'request_too_large');

    // 3 MB of JSON that gzip makes 10 KB: the limit holds for the decoded body.
    const bomb = gzipSync(Buffer.from(JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'a'.repeat(3_000_000) }] })));
    expect(bomb.length).toBeLessThan(LIMIT / 10);
    const zipped = await post(url, '/v1/chat/completions', bomb, { 'content-encoding': 'gzip' });
    expect(zipped.status).toBe(413);
    expectOpenAIError(zipped.json, 'request_too_large');

    // Exactly the limit: "larger than" is what is refused.
    const shell = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: '' }] });
    const exact = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x'.repeat(LIMIT - shell.length) }] });
    expect(exact.length).toBe(LIMIT);
    const fits = await post(url, '/v1/chat/completions', exact);
    expect(fits.status).toBe(200);

    // Only the one that fit went upstream.
    expect(up.hits).toHaveLength(1);
    expect(up.hits[0]!.raw.length).toBe(LIMIT);
  });

  it('a content-length past the limit with expect: 100-continue gets its 413 without sending the body', async () => {
    const up = await upstream(() => ({ answer: (res) => send(res, 200, chatCompletion(['no'])) }));
    const { url } = await gatewayTo(up, { server: { bodyLimitBytes: LIMIT } });
    const { port } = new URL(url);
    const req = httpRequest({ host: '127.0.0.1', port, method: 'POST', path: '/v1/chat/completions', headers: { 'content-type': 'application/json', 'content-length': String(8 * LIMIT), expect: '100-continue' } });
    let continued = false;
    req.on('continue', () => (continued = true));
    req.on('error', () => undefined);
    req.flushHeaders();
    const [res] = (await once(req, 'response')) as [IncomingMessage];
    const chunks: Buffer[] = [];
    for await (const c of res) chunks.push(c as Buffer);
    req.destroy();
    expect(res.statusCode).toBe(413);
    expect(continued).toBe(false);
    expectOpenAIError(JSON.parse(Buffer.concat(chunks).toString()), 'request_too_large');
    expect(up.hits).toHaveLength(0);
  });
});

describe('uploads that are slow or have no length', () => {
  it('a chunked upload (no content-length) past the limit gets 413 in the OpenAI shape, and nothing goes upstream', async () => {
    const up = await upstream(() => ({ answer: (res) => send(res, 200, chatCompletion(['no'])) }));
    const { url } = await gatewayTo(up, { server: { bodyLimitBytes: 1_000_000 } });
    const text = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'c'.repeat(1_500_000) }] });
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        const bytes = Buffer.from(text);
        for (let i = 0; i < bytes.length; i += 64 * 1024) controller.enqueue(bytes.subarray(i, i + 64 * 1024));
        controller.close();
      },
    });
    const res = await fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body, duplex: 'half' } as RequestInit);
    expect(res.status).toBe(413);
    expectOpenAIError(await res.json(), 'request_too_large');
    expect(up.hits).toHaveLength(0);
  });

  it('a 3 MB body still arriving at the client\'s deadline (x-stormgate-timeout-ms) is answered 504 deadline_exceeded then, with nothing sent upstream', async () => {
    const up = await upstream(() => ({ answer: (res) => send(res, 200, chatCompletion(['no'])) }));
    const { url } = await gatewayTo(up);
    const text = Buffer.from(JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 's'.repeat(3_000_000) }] }));
    const { port } = new URL(url);
    const started = Date.now();
    const req = httpRequest({ host: '127.0.0.1', port, method: 'POST', path: '/v1/chat/completions', headers: { 'content-type': 'application/json', 'content-length': String(text.length), 'x-stormgate-timeout-ms': '1500' } });
    req.on('error', () => undefined);
    // A slow uplink: 64 KB every 100 ms, about 5 s for the whole body.
    let stop = false;
    void (async () => {
      for (let i = 0; i < text.length && !stop; i += 64 * 1024) {
        req.write(text.subarray(i, i + 64 * 1024));
        await sleep(100);
      }
    })();
    const [res] = (await once(req, 'response')) as [IncomingMessage];
    const elapsed = Date.now() - started;
    stop = true;
    const chunks: Buffer[] = [];
    for await (const c of res) chunks.push(c as Buffer);
    req.destroy();
    expect(res.statusCode).toBe(504);
    expect(res.headers['x-should-retry']).toBe('false');
    expectOpenAIError(JSON.parse(Buffer.concat(chunks).toString()), 'deadline_exceeded', 'server_error');
    expect(elapsed).toBeGreaterThanOrEqual(1_000);
    expect(elapsed).toBeLessThan(4_000);
    expect(up.hits).toHaveLength(0);
  });
});

describe('the bytes of bodies parked behind a hold-off are bounded (server.maxWaitingBodyBytes)', () => {
  it('50 requests of 1 MB arriving during a 429 hold-off: those that fit the cap park and are answered with their own bytes after it, the rest get 503 park_queue_full with x-should-retry: true', async () => {
    const CAP = 6_000_000;
    const up = await upstream((n) => ({
      answer: (res) => (n === 1 ? send(res, 429, { error: { message: 'Rate limit reached', type: 'requests', param: null, code: 'rate_limit_exceeded' } }, { 'retry-after': '3' }) : send(res, 200, chatCompletion([`answer ${n}`]))),
    }));
    const { url, client } = await gatewayTo(up, { server: { maxWaitingBodyBytes: CAP }, route: { retry: { maxAttempts: 2 } } });
    const body = (i: number) => ({ model: 'gpt-4o', messages: [{ role: 'user' as const, content: `request ${String(i).padStart(3, '0')} ${'y'.repeat(1_000_000)}` }] });

    // The first request meets the 429: the target is held off for 3 s, and it waits the hint out itself.
    const first = client.chat.completions.create(body(0));
    await vi.waitFor(() => expect(up.hits).toHaveLength(1), { timeout: 10_000, interval: 20 });
    const heldAt = Date.now();

    const outcomes = await Promise.all(
      Array.from({ length: 50 }, (_, k) =>
        client.chat.completions
          .create(body(k + 1))
          .withResponse()
          .then(
            ({ data }) => ({ i: k + 1, status: 200, text: data.choices[0]!.message.content }),
            (e: InstanceType<typeof OpenAI.APIError>) => ({ i: k + 1, status: e.status, code: (e.error as { code?: string })?.code, retry: e.headers?.get('x-should-retry'), after: e.headers?.get('retry-after') }),
          ),
      ),
    ).then(async (all) => {
      return all;
    });
    await first;

    const shed = outcomes.filter((o) => o.status !== 200);
    const served = outcomes.filter((o) => o.status === 200);
    // At most the cap's worth waited (a body waits whatever the cap when nothing else does: at least one).
    expect(served.length).toBeGreaterThanOrEqual(1);
    expect(served.length).toBeLessThanOrEqual(Math.floor(CAP / 1_000_000));
    for (const o of shed) {
      expect(o).toMatchObject({ status: 503, code: 'park_queue_full', retry: 'true' });
      expect(Number((o as { after?: string }).after)).toBeGreaterThan(0);
    }
    // Nothing parked went upstream during the hold-off: after the 429, only the first request's own retry and the
    // parked ones, each with its own bytes.
    const later = up.hits.slice(1);
    expect(later).toHaveLength(1 + served.length);
    for (const hit of later) {
      expect(hit.at - heldAt).toBeGreaterThanOrEqual(2_000);
      expectCleanUpload(hit);
    }
    const sentBodies = new Set([0, ...served.map((o) => o.i)].map((i) => sha(JSON.stringify(body(i)))));
    expect(new Set(later.map((h) => sha(h.raw)))).toEqual(sentBodies);
    // Nothing waits now: every byte given back.
    await vi.waitFor(async () => expect((await scrapeMetrics(url)).find((s) => s.name === 'stormgate_waiting_body_bytes')?.value).toBe(0), { timeout: 5_000, interval: 50 });
  });
});

describe('a body larger than the whole cap of waiting bytes', () => {
  it('an 8 MB request parks alone under a 6 MB cap (a body waits whatever the cap when nothing else does) and is answered after the hold-off; a second one meanwhile gets 503 park_queue_full', async () => {
    // A hold-off of 8 s: both 8 MB bodies must be uploaded and parsed within it. On a starved 2-core machine that took
    // over 3 s (with a hold-off of 2 s, neither arrived before it ended, and the second was answered 200).
    const HOLD_S = 8;
    const up = await upstream((n) => ({
      answer: (res) => (n === 1 ? send(res, 429, { error: { message: 'Rate limit reached', type: 'requests', param: null, code: 'rate_limit_exceeded' } }, { 'retry-after': String(HOLD_S) }) : send(res, 200, chatCompletion([`answer ${n}`]))),
    }));
    const { url, client } = await gatewayTo(up, { server: { maxWaitingBodyBytes: 6_000_000 }, route: { retry: { maxAttempts: 1 } } });
    // Built before the hold-off starts: building them is the test's time, not the gateway's.
    const big = multimodal(6_000_000, 5);
    const other = multimodal(6_000_000, 6);
    const held = await sdkError(client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'small' }] }));
    expect(held.status).toBe(429);
    const heldAt = Date.now();

    const parked = client.chat.completions.create(big);
    // The first one is parked (its bytes counted) before the second comes.
    const parkedBytes = async () => (await scrapeMetrics(url)).find((s) => s.name === 'stormgate_waiting_body_bytes')?.value;
    await vi.waitFor(async () => expect(await parkedBytes()).toBeGreaterThan(0), { timeout: 20_000, interval: 50 });
    const parkedAt = Date.now() - heldAt;
    const second = await client.chat.completions.create(other).then(
      (r) => ({ status: 200, content: r.choices[0]?.message.content }),
      (e: InstanceType<typeof OpenAI.APIError>) => ({ status: e.status, code: (e.error as { code?: string })?.code, retry: e.headers?.get('x-should-retry') }),
    );
    const secondAt = Date.now() - heldAt;
    const when = `first parked ${parkedAt} ms, second answered ${secondAt} ms into a hold-off of ${HOLD_S} s`;
    expect(second, when).toEqual({ status: 503, code: 'park_queue_full', retry: 'true' });
    expect(secondAt, when).toBeLessThan(HOLD_S * 1_000);

    const answer = await parked;
    expect(answer.choices[0]!.message.content).toBe('answer 2');
    expect(up.hits).toHaveLength(2);
    expect(up.hits[1]!.raw.equals(Buffer.from(JSON.stringify(big)))).toBe(true);
    expect(up.hits[1]!.at - up.hits[0]!.at).toBeGreaterThanOrEqual(HOLD_S * 1_000 - 200);
  }, 45_000);
});

describe('large answers, whole and streamed', () => {
  it('a 4 MB answer cut mid-body (by its length, then by a close without length) is never handed on: the third attempt, gzip-encoded, reaches the client whole', async () => {
    const content = Array.from({ length: 4_000 }, (_, i) => `line ${i}: ${'ø'.repeat(480)}`).join('\n');
    const whole = JSON.stringify(chatCompletion([content]));
    const up = await upstream((n) => ({
      answer: (res) => {
        if (n === 1) {
          res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(whole)) });
          res.write(whole.slice(0, 1_500_000));
          setTimeout(() => res.socket?.destroy(), 30);
          return;
        }
        if (n === 2) {
          // No length, no chunking: the body ends with the connection, cut where an inner object closes in a `}`.
          const cut = whole.slice(0, whole.indexOf('"finish_reason"') - 1).replace(/,$/, '') + '}';
          res.socket!.end(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n${cut}`);
          return;
        }
        const zipped = gzipSync(whole);
        res.writeHead(200, { 'content-type': 'application/json', 'content-encoding': 'gzip', 'content-length': String(zipped.length) });
        res.end(zipped);
      },
    }));
    const { client } = await gatewayTo(up);

    const { data, response } = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'Write the whole ledger.' }] }).withResponse();

    expect(up.hits).toHaveLength(3);
    expect(up.hits[1]!.raw.equals(up.hits[0]!.raw)).toBe(true);
    expect(up.hits[2]!.raw.equals(up.hits[0]!.raw)).toBe(true);
    expect(sha(data.choices[0]!.message.content!)).toBe(sha(content));
    expect(data.choices[0]!.finish_reason).toBe('stop');
    expect(response.headers.get('content-encoding')).toBeNull();
  });

  it('a 3 MB stream is passed through event by event: the client reads its first half while the upstream waits to send the second', async () => {
    const PART = 'z'.repeat(64 * 1024);
    let clientHasFirstHalf!: () => void;
    const firstHalfSeen = new Promise<void>((resolve) => (clientHasFirstHalf = resolve));
    let gateOpened = false;
    const up = await upstream(() => ({
      answer: async (res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(cc([delta({ role: 'assistant', content: '' })]));
        for (let i = 0; i < 24; i++) res.write(cc([delta({ content: `${i}:${PART}` })]));
        // A gateway that buffers the answer never lets the client see the first half, and this never opens.
        gateOpened = await Promise.race([firstHalfSeen.then(() => true), sleep(15_000).then(() => false)]);
        for (let i = 24; i < 48; i++) res.write(cc([delta({ content: `${i}:${PART}` })]));
        res.write(cc([delta({}, 'stop')]));
        res.end(DONE);
      },
    }));
    const { client } = await gatewayTo(up, { provider: { timeouts: { connectMs: 2_000, firstTokenMs: 10_000, idleMs: 30_000 } } });

    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'Dump the table.' }], stream: true });
    const parts: string[] = [];
    let finish: string | null | undefined;
    for await (const chunk of stream) {
      const c = chunk.choices[0]?.delta?.content;
      if (c) parts.push(c);
      if (parts.length === 24) clientHasFirstHalf();
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }

    expect(gateOpened).toBe(true);
    expect(parts).toHaveLength(48);
    expect(parts.join('')).toBe(Array.from({ length: 48 }, (_, i) => `${i}:${PART}`).join(''));
    expect(finish).toBe('stop');
    expect(up.hits).toHaveLength(1);
  });

  it('a 2 MB stream cut after 1.5 MB, mid-event, ends with an error the SDK raises, never as a whole answer, and is not sent again', async () => {
    const PART = 'q'.repeat(50_000);
    const up = await upstream(() => ({
      answer: async (res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(cc([delta({ role: 'assistant', content: '' })]));
        for (let i = 0; i < 30; i++) res.write(cc([delta({ content: PART })]));
        // Half of one more event, then the connection goes: no half event may reach the client as text.
        const last = cc([delta({ content: 'h'.repeat(500_000) })]);
        res.write(last.slice(0, last.length / 2));
        await sleep(50);
        res.socket?.destroy();
      },
    }));
    const { client } = await gatewayTo(up);

    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'Translate the book.' }], stream: true });
    let text = '';
    let finish: string | null | undefined;
    let err: unknown;
    try {
      for await (const chunk of stream) {
        text += chunk.choices[0]?.delta?.content ?? '';
        finish = chunk.choices[0]?.finish_reason ?? finish;
      }
    } catch (e) {
      err = e;
    }

    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(String((err as Error).message)).toMatch(/interrupted|cut|stream/i);
    expect(finish).toBeUndefined();
    expect(text.length).toBeLessThanOrEqual(30 * PART.length);
    expect(PART.repeat(30).startsWith(text)).toBe(true);
    expect(text).not.toContain('h');
    expect(up.hits).toHaveLength(1);
  });

  it('one 4 MB event (a tool call writing a file) passes whole, and n: 2 streams keep each choice apart', async () => {
    const file = Array.from({ length: 40_000 }, (_, i) => `row ${i}, "quoted", \\ back\u00e9`).join('\n');
    const args = JSON.stringify({ path: 'out.csv', content: file });
    expect(args.length).toBeGreaterThan(1_000_000);
    const up = await upstream(() => ({
      answer: (res, hit) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        if (hit.json!.n === 2) {
          res.write(cc([delta({ role: 'assistant', content: '' }, null, 0), delta({ role: 'assistant', content: '' }, null, 1)]));
          for (let i = 0; i < 20; i++) res.write(cc([delta({ content: `a${i} ` }, null, i % 2)]));
          res.write(cc([delta({}, 'stop', 0), delta({}, 'stop', 1)]));
          res.end(DONE);
          return;
        }
        res.write(cc([delta({ role: 'assistant', content: null, tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'write_file', arguments: '' } }] })]));
        res.write(cc([delta({ tool_calls: [{ index: 0, function: { arguments: args } }] })]));
        res.write(cc([delta({}, 'tool_calls')]));
        res.end(DONE);
      },
    }));
    const { client } = await gatewayTo(up);

    const tools = [{ type: 'function' as const, function: { name: 'write_file', parameters: { type: 'object', properties: { path: { type: 'string' }, content: { type: 'string' } } } } }];
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'Export it.' }], tools, stream: true });
    let got = '';
    let finish: string | null | undefined;
    for await (const chunk of stream) {
      got += chunk.choices[0]?.delta?.tool_calls?.[0]?.function?.arguments ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    expect(sha(got)).toBe(sha(args));
    expect(finish).toBe('tool_calls');

    const two = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'Two drafts.' }], n: 2, stream: true });
    const byChoice = ['', ''];
    for await (const chunk of two) for (const c of chunk.choices) byChoice[c.index] += c.delta?.content ?? '';
    expect(byChoice).toEqual(['a0 a2 a4 a6 a8 a10 a12 a14 a16 a18 ', 'a1 a3 a5 a7 a9 a11 a13 a15 a17 a19 ']);
  });

  it('an audio answer whose first 2 s carry only audio deltas is output, not a silent stream: no first-token timeout, every audio byte through', async () => {
    const pcm = (i: number) => Buffer.alloc(96_000, i).toString('base64');
    const up = await upstream(() => ({
      answer: async (res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(cc([delta({ role: 'assistant', content: null })]));
        for (let i = 0; i < 8; i++) {
          await sleep(250);
          res.write(cc([delta({ audio: { id: 'audio_1', data: pcm(i), ...(i === 0 && { expires_at: 1741294558 }) } } as Record<string, unknown>)]));
        }
        res.write(cc([delta({ audio: { transcript: 'Hello there.' } } as Record<string, unknown>)]));
        res.write(cc([delta({}, 'stop')]));
        res.end(DONE);
      },
    }));
    const { client } = await gatewayTo(up, { provider: { timeouts: { connectMs: 2_000, firstTokenMs: 1_000, idleMs: 1_000 } } });

    const stream = await client.chat.completions.create({
      model: 'gpt-4o-audio-preview',
      modalities: ['text', 'audio'],
      audio: { voice: 'alloy', format: 'pcm16' },
      messages: [{ role: 'user', content: 'Say hello.' }],
      stream: true,
    });
    const data: string[] = [];
    let transcript = '';
    for await (const chunk of stream) {
      const audio = (chunk.choices[0]?.delta as { audio?: { data?: string; transcript?: string } } | undefined)?.audio;
      if (audio?.data) data.push(audio.data);
      transcript += audio?.transcript ?? '';
    }
    expect(data).toEqual(Array.from({ length: 8 }, (_, i) => pcm(i)));
    expect(transcript).toBe('Hello there.');
    expect(up.hits).toHaveLength(1);
  });

  it('a client that stops reading a 48 MB stream holds the upstream back (TCP backpressure), instead of the gateway buffering the answer', async () => {
    const PART = 'b'.repeat(64 * 1024);
    let written = 0;
    let finished = false;
    const up = await upstream(() => ({
      answer: async (res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(cc([delta({ role: 'assistant', content: '' })]));
        for (let i = 0; i < 768 && !res.destroyed; i++) {
          const ev = cc([delta({ content: PART })]);
          if (!res.write(ev)) await once(res, 'drain').catch(() => undefined);
          written += ev.length;
        }
        if (!res.destroyed) res.end(cc([delta({}, 'stop')]) + DONE);
        finished = true;
      },
    }));
    const { url } = await gatewayTo(up, { provider: { timeouts: { connectMs: 2_000, firstTokenMs: 10_000, idleMs: 10_000 } } });
    const { port } = new URL(url);
    const body = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'Everything, please.' }], stream: true });
    const req = httpRequest({ host: '127.0.0.1', port, method: 'POST', path: '/v1/chat/completions', headers: { 'content-type': 'application/json', 'content-length': String(body.length) } });
    req.end(body);
    const [res] = (await once(req, 'response')) as [IncomingMessage];
    expect(res.statusCode).toBe(200);
    res.pause();
    // The client takes nothing for 1.5 s: what the upstream got out is bounded by the sockets' buffers, not 48 MB.
    await sleep(1_500);
    const whilePaused = written;
    expect(finished).toBe(false);
    expect(whilePaused).toBeLessThan(28 * 1024 * 1024);
    // Read on: everything arrives, in order.
    let received = 0;
    let tail = '';
    res.on('data', (d: Buffer) => {
      received += d.length;
      tail = (tail + d.toString('latin1')).slice(-200);
    });
    res.resume();
    await once(res, 'end');
    expect(finished).toBe(true);
    expect(received).toBeGreaterThan(768 * PART.length);
    expect(tail).toContain('[DONE]');
  });

  it('a first token 1.5 s after the headers (within firstTokenMs) is waited for, not retried; the answer comes from the one attempt', async () => {
    const up = await upstream(() => ({
      answer: async (res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(cc([delta({ role: 'assistant', content: '' })]));
        await sleep(1_500);
        res.write(cc([delta({ content: 'slow but sure' })]));
        res.write(cc([delta({}, 'stop')]));
        res.end(DONE);
      },
    }));
    const { client } = await gatewayTo(up, { provider: { timeouts: { connectMs: 2_000, firstTokenMs: 6_000, idleMs: 6_000 } } });
    const stream = await client.chat.completions.create({ ...multimodal(1_000_000, 20), stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text).toBe('slow but sure');
    expect(up.hits).toHaveLength(1);
  });
});

describe('an Anthropic backup for multimodal requests', () => {
  const aev = (type: string, data: Record<string, unknown> = {}) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
  const claudeStream = (text: string) => [
    aev('message_start', { message: { id: 'msg_01', type: 'message', role: 'assistant', model: 'claude-sonnet-4-5', content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 5000, output_tokens: 1 } } }),
    aev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
    aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text } }),
    aev('content_block_stop', { index: 0 }),
    aev('message_delta', { delta: { stop_reason: 'end_turn', stop_sequence: null }, usage: { output_tokens: 9 } }),
    aev('message_stop'),
  ];

  it('a primary silent past firstTokenMs fails over to Claude with the image as base64 of the type its bytes are (a PNG sent as image/jpeg), a URL image as a URL, all 300 tools', async () => {
    const primary = await upstream(() => ({
      answer: (res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(cc([delta({ role: 'assistant', content: '' })]));
        // then nothing: no first token
      },
    }));
    const claude = await upstream(() => ({
      answer: (res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream', 'request-id': 'req_claude_1' });
        res.end(claudeStream('{"vendor":"ACME GmbH","total_cents":129900,"lines":["widgets"]}').join(''));
      },
    }));
    const { client } = await gatewayTo(primary, {
      more: { claude: ['anthropic', claude.origin] },
      targets: [{ provider: 'primary' }, { provider: 'claude', model: 'claude-sonnet-4-5' }],
      provider: { timeouts: { connectMs: 2_000, firstTokenMs: 1_000, idleMs: 10_000 } },
      route: { retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 20, capMs: 20 } } },
    });
    const params = multimodal(2_000_000, 300, 'image/jpeg');
    const base64 = (params.messages[1]!.content as Array<{ image_url?: { url: string } }>)[1]!.image_url!.url.split(',')[1]!;
    (params.messages[1]!.content as unknown[]).push({ type: 'image_url', image_url: { url: 'https://files.example.com/invoice-page-2.png' } });

    const { data: stream, response } = await client.chat.completions.create({ ...params, stream: true }).withResponse();
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';

    expect(JSON.parse(text)).toEqual({ vendor: 'ACME GmbH', total_cents: 129900, lines: ['widgets'] });
    expect(response.headers.get('x-stormgate-fallback')).toBe('timeout');
    expect(primary.hits).toHaveLength(1);
    expect(claude.hits).toHaveLength(1);
    const sent = claude.hits[0]!;
    expectCleanUpload(sent);
    expect(sent.url).toBe('/v1/messages');
    expect(sent.headers['x-api-key']).toBe('claude-provider-key-0123456789');
    const body = sent.json as { model: string; system: unknown; messages: Array<{ role: string; content: Array<Record<string, unknown>> }>; tools: Array<{ name: string; input_schema: unknown }> };
    expect(body.model).toBe('claude-sonnet-4-5');
    const user = body.messages.find((m) => m.role === 'user')!;
    const images = user.content.filter((b) => b.type === 'image');
    expect(images).toEqual([
      { type: 'image', source: { type: 'base64', media_type: 'image/png', data: base64 } },
      { type: 'image', source: { type: 'url', url: 'https://files.example.com/invoice-page-2.png' } },
    ]);
    expect(user.content.find((b) => b.type === 'text')).toMatchObject({ text: 'Read this scanned invoice (é, 日本語, emoji 🧾 kept as they are).' });
    expect(body.tools).toHaveLength(300);
    expect(body.tools[299]).toMatchObject({ name: 'tool_299_lookup', input_schema: { type: 'object', required: ['id'] } });
    // The schema went too (where exactly is the translation's business; that it is there is the client's).
    expect(sent.raw.toString()).toContain('total_cents');
  });

  it('Claude overloaded (529) then a 3 MB answer: the translated request is the same bytes on both attempts, and the answer reaches the SDK whole', async () => {
    const primary = await upstream(() => ({ answer: (res) => overloaded(res) }));
    const long = Array.from({ length: 30_000 }, (_, i) => `§${i} ${'données '.repeat(10)}`).join('\n');
    const claude = await upstream((n) => ({
      answer: (res) =>
        n === 1
          ? send(res, 529, { type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } })
          : send(res, 200, { id: 'msg_02', type: 'message', role: 'assistant', model: 'claude-sonnet-4-5', content: [{ type: 'text', text: long }], stop_reason: 'end_turn', stop_sequence: null, usage: { input_tokens: 9000, output_tokens: 700_000 } }),
    }));
    const { client } = await gatewayTo(primary, {
      more: { claude: ['anthropic', claude.origin] },
      targets: [{ provider: 'primary', retry: { maxAttempts: 1 } }, { provider: 'claude', model: 'claude-sonnet-4-5' }],
    });
    const params = multimodal(3_000_000, 100);

    const { data, response } = await client.chat.completions.create(params).withResponse();

    expect(sha(data.choices[0]!.message.content!)).toBe(sha(long));
    expect(data.choices[0]!.finish_reason).toBe('stop');
    expect(data.model).toBe('claude-sonnet-4-5');
    expect(response.headers.get('x-stormgate-fallback')).toBeTruthy();
    expect(claude.hits).toHaveLength(2);
    for (const hit of claude.hits) expectCleanUpload(hit);
    expect(claude.hits[1]!.raw.equals(claude.hits[0]!.raw)).toBe(true);
  });

  it('Claude refusing an image too large for it, after the primary\'s 503: the client gets the primary\'s failure with the backup\'s reason, never a 400 telling it to change a valid request', async () => {
    const primary = await upstream(() => ({ answer: (res) => overloaded(res) }));
    const claude = await upstream(() => ({
      answer: (res) => send(res, 400, { type: 'error', error: { type: 'invalid_request_error', message: 'messages.0.content.1.image.source.base64: image exceeds 5 MB maximum: 8000000 bytes > 5242880 bytes' } }),
    }));
    const { client } = await gatewayTo(primary, {
      more: { claude: ['anthropic', claude.origin] },
      targets: [{ provider: 'primary', retry: { maxAttempts: 1 } }, { provider: 'claude', model: 'claude-sonnet-4-5' }],
    });

    const err = await sdkError(client.chat.completions.create(multimodal(6_000_000, 5)));

    expect(err.status).toBe(503);
    expect(err.message).toMatch(/rejected the request \(400/);
    expect(err.message).toContain('image exceeds 5 MB maximum');
    expect(claude.hits).toHaveLength(1);
  });

  it('n: 2, logprobs and an audio input part are not sent to the Anthropic backup: the client gets the primary\'s 503, naming the target not tried', async () => {
    const primary = await upstream(() => ({ answer: (res) => overloaded(res) }));
    const claude = await upstream(() => ({ answer: (res) => send(res, 500, { type: 'error', error: { type: 'api_error', message: 'should not be called' } }) }));
    const { client } = await gatewayTo(primary, {
      more: { claude: ['anthropic', claude.origin] },
      targets: [{ provider: 'primary' }, { provider: 'claude', model: 'claude-sonnet-4-5' }],
      route: { retry: { maxAttempts: 1 } },
    });
    const wav = Buffer.concat([Buffer.from('RIFF\x24\x00\x10\x00WAVEfmt ', 'latin1'), Buffer.alloc(1_000_000, 1)]).toString('base64');
    const base = multimodal(500_000, 10);
    const cases: Array<[string, OpenAI.Chat.Completions.ChatCompletionCreateParamsNonStreaming]> = [
      ['n', { ...base, n: 2 }],
      ['logprobs', { ...base, logprobs: true, top_logprobs: 3 }],
      ['audio', { ...base, messages: [{ role: 'user', content: [{ type: 'text', text: 'Transcribe the call.' }, { type: 'input_audio', input_audio: { data: wav, format: 'wav' } }] }] }],
    ];
    for (const [why, params] of cases) {
      const err = await sdkError(client.chat.completions.create(params));
      expect(err.status, why).toBe(503);
      expect(err.message, why).toMatch(/not tried: claude/);
    }
    expect(claude.hits).toHaveLength(0);
    expect(primary.hits).toHaveLength(3);
  });
});
