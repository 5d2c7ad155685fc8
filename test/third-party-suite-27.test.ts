// A twenty-seventh third-party suite, written from the README alone ("Paths" and `passthrough.*` in the configuration
// reference, "Headers", "Errors", "What the client sees", "Deadlines and timeouts", "Client keys", "Logs and metrics",
// "What a retry may repeat" in Failover and API families) as an outside agent-platform team would test THE REST OF THE
// OPENAI API SURFACE through the gateway: the calls an agent platform makes besides chat. File uploads
// (`files.create` with `toFile`, multipart/form-data, a few MB, over `server.bodyLimitBytes`), audio transcriptions
// (multipart), file downloads (`files.content`, several MB, streamed), batches, vector stores, `models.retrieve`, all
// through `passthrough`; moderations and image generations on managed routes of their own. Questions: is each served
// as the README says (routed: retried by the route's policy; passthrough: sent once); are multipart bodies and answers
// byte-exact (boundary, binary content); what a client gets under upstream faults (503, 429 with retry-after, a reset
// mid-upload or after it, a hang, an HTML page from a proxy) on a passthrough path against a routed one, and whether an
// upload is ever sent twice (the SDK at its default maxRetries is the client); the provider key swapped in and the
// client key never forwarded; a client's abort ending the upstream request; client keys on passthrough paths; unknown
// paths and methods; one log line per request.
// Black box over real HTTP with the official `openai` SDK (6.x) against a scripted OpenAI-compatible upstream on
// 127.0.0.1 (the bundled mock serves no files, audio, images, batches or vector stores) and the bundled mock for chat.
// Found and fixed: a passthrough error not in the OpenAI shape (an HTML 502 from a proxy in front of the provider) went
// to the client as read, so the SDK raised a 502 with no code and a page of HTML as its message, against "Every error
// has the OpenAI shape": it is now put in that shape as on the managed routes (src/providers/passthrough.ts; one longer
// than the 64 KB read still goes on as read). Everything else held: uploads over bodyLimitBytes forwarded byte for byte
// with their boundary, an 8 MB download streamed, every fault on a passthrough path sent once with
// x-should-retry: false (so the SDK at maxRetries 2 never sent an upload twice), a routed moderation and image retried
// by the route, keys swapped, aborts reaching the provider. Also found: a passthrough call was bounded by
// passthrough.timeoutMs alone, not the client's timeout headers, so an SDK whose own timeout was shorter gave up first
// and sent the upload again itself (three uploads for one call): now answered 504 deadline_exceeded before the
// client's timeout, as a managed route is. Passthrough traffic was in no metric.
import { createHash, randomBytes } from 'node:crypto';
import type { IncomingHttpHeaders, RequestListener } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI, { toFile } from 'openai';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { expectOpenAIError, sdkError } from './helpers/openai-error.ts';
import { defaultConfig, parseMetrics, RETRY_LOOP_ONLY, useStacks, type Stack } from './helpers/stack.ts';

const startStack = useStacks();
const startProvider = useFakeProviders();

/** The provider's key and the client's (both in test/helpers/test-secrets.ts, so the run's log sweep checks them). */
const PROVIDER_KEY = 'sk-s27-provider-0123456789abcdef';
const CLIENT_KEY = 'sg-s27-agents-key-0123456789';
const MB = 1024 * 1024;

type RouteInput = ConfigInput['routes'][number];

// ---------------------------------------------------------------------------------------------------------------
// The upstream: an OpenAI-compatible server of the test's own, with the files, audio, images, moderations, batches and
// vector stores the bundled mock does not serve, and a script of faults per "METHOD /path".

interface Seen {
  method: string;
  url: string;
  headers: IncomingHttpHeaders;
  body: Buffer;
  /** The connection closed before the answer was complete (the gateway, or its client, gave up). */
  cutAt?: number;
}

/** What the upstream does with the next request on a path instead of answering it as the API would. */
type Step =
  | { kind: 'answer'; status: number; headers?: Record<string, string>; body: string }
  /** Drops the connection once this many bytes of the body have arrived (an upload cut by a proxy's reset). */
  | { kind: 'reset-after'; bytes: number }
  /** Reads the whole body, runs the call (a file is created), then drops the connection: the "may have run" case. */
  | { kind: 'run-then-reset' }
  /** Reads the whole body and never answers. */
  | { kind: 'hang' };

interface FakeOpenAI {
  origin: string;
  seen: Seen[];
  files: Map<string, { bytes: Buffer; filename: string; purpose: string; contentType: string }>;
  /** Queues steps for the next requests on `key` ("POST /v1/files"). */
  script(key: string, ...steps: Step[]): void;
  /** Replaces how a file's content is sent (for the streaming test). */
  download?: (res: import('node:http').ServerResponse, bytes: Buffer) => void;
}

const json = (res: import('node:http').ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}) =>
  res.writeHead(status, { 'content-type': 'application/json', 'x-request-id': `req_up_${Math.random().toString(16).slice(2, 10)}`, ...headers }).end(JSON.stringify(body));

const errorBody = (message: string, type = 'server_error', code: string | null = null) => JSON.stringify({ error: { message, type, param: null, code } });

async function startFakeOpenAI(): Promise<FakeOpenAI> {
  const seen: Seen[] = [];
  const files: FakeOpenAI['files'] = new Map();
  const steps = new Map<string, Step[]>();
  let nextId = 1;
  const fake: FakeOpenAI = {
    origin: '',
    seen,
    files,
    script: (key, ...more) => steps.set(key, [...(steps.get(key) ?? []), ...more]),
  };
  const createFile = async (s: Seen) => {
    const form = await new Response(s.body, { headers: { 'content-type': s.headers['content-type'] ?? '' } }).formData();
    const file = form.get('file') as File;
    const id = `file-${nextId++}`;
    files.set(id, { bytes: Buffer.from(await file.arrayBuffer()), filename: file.name, purpose: String(form.get('purpose')), contentType: file.type });
    return { id, object: 'file', bytes: file.size, created_at: 1, filename: file.name, purpose: String(form.get('purpose')), status: 'processed' };
  };
  const handler: RequestListener = (req, res) => {
    const path = (req.url ?? '').split('?')[0]!;
    const s: Seen = { method: req.method ?? '', url: req.url ?? '', headers: req.headers, body: Buffer.alloc(0) };
    seen.push(s);
    res.on('close', () => {
      if (!res.writableFinished) s.cutAt = Date.now();
    });
    const step = steps.get(`${s.method} ${path}`)?.shift();
    const chunks: Buffer[] = [];
    let received = 0;
    req.on('data', (c: Buffer) => {
      chunks.push(c);
      received += c.length;
      if (step?.kind === 'reset-after' && received >= step.bytes) req.socket.destroy();
    });
    req.on('end', () => {
      s.body = Buffer.concat(chunks);
      void answer(s, path, step, res).catch((err: Error) => json(res, 500, { error: { message: err.message, type: 'server_error', param: null, code: null } }));
    });
  };
  const answer = async (s: Seen, path: string, step: Step | undefined, res: import('node:http').ServerResponse) => {
    if (step?.kind === 'answer') return void res.writeHead(step.status, { 'content-type': 'application/json', ...step.headers }).end(step.body);
    if (step?.kind === 'hang') return;
    if (step?.kind === 'run-then-reset') {
      await createFile(s);
      return void res.socket?.destroy();
    }
    const [, , resource, id, sub] = path.split('/');
    if (resource === 'files' && s.method === 'POST' && !id) return json(res, 200, await createFile(s));
    if (resource === 'files' && s.method === 'GET' && !id) return json(res, 200, { object: 'list', data: [...files.keys()].map((f) => ({ id: f, object: 'file' })), has_more: false });
    if (resource === 'files' && id && sub === 'content') {
      const f = files.get(id);
      if (!f) return json(res, 404, { error: { message: `No such File object: ${id}`, type: 'invalid_request_error', param: 'id', code: null } });
      if (fake.download) return fake.download(res, f.bytes);
      return void res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': String(f.bytes.length) }).end(f.bytes);
    }
    if (resource === 'files' && id && s.method === 'GET') return json(res, 200, { id, object: 'file', bytes: files.get(id)?.bytes.length ?? 0, filename: files.get(id)?.filename });
    if (resource === 'files' && id && s.method === 'DELETE') return json(res, 200, { id, object: 'file', deleted: files.delete(id) });
    if (resource === 'audio') {
      const form = await new Response(s.body, { headers: { 'content-type': s.headers['content-type'] ?? '' } }).formData();
      const audio = Buffer.from(await (form.get('file') as File).arrayBuffer());
      return json(res, 200, { text: `heard ${audio.length} bytes, sha256 ${createHash('sha256').update(audio).digest('hex')}, model ${String(form.get('model'))}` });
    }
    if (resource === 'batches' && s.method === 'POST' && !id) {
      const body = JSON.parse(s.body.toString()) as { input_file_id: string; endpoint: string };
      return json(res, 200, { id: 'batch_1', object: 'batch', endpoint: body.endpoint, input_file_id: body.input_file_id, status: 'validating', completion_window: '24h', created_at: 1 });
    }
    if (resource === 'batches' && id) return json(res, 200, { id, object: 'batch', endpoint: '/v1/chat/completions', status: 'in_progress', completion_window: '24h', created_at: 1 });
    if (resource === 'batches') return json(res, 200, { object: 'list', data: [{ id: 'batch_1', object: 'batch' }], first_id: 'batch_1', last_id: 'batch_1', has_more: false });
    if (resource === 'vector_stores' && s.method === 'POST') return json(res, 200, { id: 'vs_1', object: 'vector_store', name: (JSON.parse(s.body.toString()) as { name: string }).name, status: 'completed', created_at: 1 });
    if (resource === 'moderations') return json(res, 200, { id: 'modr-1', model: 'omni-moderation-latest', results: [{ flagged: false, categories: {}, category_scores: {} }] });
    if (resource === 'images') return json(res, 200, { created: 1, data: [{ b64_json: IMAGE_B64 }] });
    json(res, 404, { error: { message: `Invalid URL (${s.method} ${path})`, type: 'invalid_request_error', param: null, code: null } });
  };
  const p = await startProvider(handler);
  fake.origin = p.origin;
  return fake;
}

/** A 1.5 MB "image": bigger than any chat answer, so a gateway that cut or re-encoded it would show. */
const IMAGE_B64 = randomBytes(1.1 * MB).toString('base64');

// ---------------------------------------------------------------------------------------------------------------
// The gateway: chat on the bundled mock; moderations and image generations on managed routes to the upstream; files,
// batches, audio and vector stores passed through to it. `server.bodyLimitBytes` at 1 MB, below the uploads.

const FAST: Partial<RouteInput> = { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } };

interface Opts {
  passthroughTimeoutMs?: number;
  methods?: Array<'GET' | 'POST' | 'DELETE'>;
  auth?: ConfigInput['auth'];
}

async function gateway(fake: FakeOpenAI, opts: Opts = {}): Promise<Stack> {
  return startStack({
    config: (mockUrl) => {
      const base = defaultConfig(mockUrl, RETRY_LOOP_ONLY);
      return {
        ...base,
        server: { ...base.server, bodyLimitBytes: MB },
        providers: {
          ...base.providers,
          openai: { family: 'openai', baseUrl: `${fake.origin}/v1`, apiKey: PROVIDER_KEY, breaker: false, timeouts: { connectMs: 1_000, idleMs: 3_000 } },
        },
        routes: [
          ...base.routes.filter((r) => r.name === 'chat'),
          { name: 'moderations', match: { path: '/v1/moderations' }, targets: [{ provider: 'openai' }], ...FAST },
          { name: 'images', match: { path: '/v1/images/generations' }, targets: [{ provider: 'openai' }], ...FAST },
        ],
        passthrough: {
          provider: 'openai',
          paths: ['/v1/files', '/v1/batches', '/v1/audio', '/v1/vector_stores'],
          methods: opts.methods ?? ['GET', 'POST', 'DELETE'],
          ...(opts.passthroughTimeoutMs && { timeoutMs: opts.passthroughTimeoutMs }),
        },
        ...(opts.auth && { auth: opts.auth }),
      };
    },
  });
}

/** What the client put on the wire for each multipart request: the exact bytes and content-type (boundary). */
interface Sent {
  contentType: string;
  body: Buffer;
}

/**
 * The SDK at its defaults (maxRetries 2) with a fetch that serialises each multipart body once, so the test knows the
 * bytes and boundary the client sent, and counts the HTTP requests the SDK made (its own retries included).
 */
function client(s: Stack, opts: { apiKey?: string } = {}): { sdk: OpenAI; sent: Sent[]; requests: () => number } {
  const sent: Sent[] = [];
  let requests = 0;
  const sdk = new OpenAI({
    baseURL: s.baseURL,
    apiKey: opts.apiKey ?? CLIENT_KEY,
    fetch: async (url, init) => {
      // The SDK probes FormData support with a fetch of `data:,` before its first upload: not a request to anyone.
      if (String(url).startsWith('http')) requests++;
      if (!(init?.body instanceof FormData)) return fetch(url, init);
      const req = new Request(url, init);
      const body = Buffer.from(await req.arrayBuffer());
      sent.push({ contentType: req.headers.get('content-type') ?? '', body });
      return fetch(url, { method: req.method, headers: req.headers, body, signal: init.signal });
    },
  });
  return { sdk, sent, requests: () => requests };
}

/** A binary payload with what multipart framing fears: CRLFs, dashes, a fake boundary, NUL bytes, invalid UTF-8. */
function awkwardBytes(size: number): Buffer {
  const b = randomBytes(size);
  const nasty = Buffer.from('\r\n--formdata-undici-0\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--\r\n\x00\xff\xfe');
  for (let at = 0; at + nasty.length < size; at += 64 * 1024) nasty.copy(b, at);
  return b;
}

const sha = (b: Buffer | ArrayBuffer) => createHash('sha256').update(Buffer.from(b as ArrayBuffer)).digest('hex');

/** The request log lines of a stack whose path starts with `prefix`, waited for (a line follows its answer by a tick). */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- a log line is JSON: tests read whatever field they check
async function linesFor(s: Stack, prefix: string, count: number): Promise<Array<Record<string, any>>> {
  const until = Date.now() + 2_000;
  for (;;) {
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    const lines = s.logs.map((l) => JSON.parse(l) as Record<string, any>).filter((l) => typeof l.path === 'string' && l.path.startsWith(prefix));
    if (lines.length >= count || Date.now() > until) return lines;
    await sleep(20);
  }
}

/** Nothing the client sent as its credentials reached the provider, and the provider got its own key. */
function expectKeySwapped(h: IncomingHttpHeaders): void {
  expect(h.authorization).toBe(`Bearer ${PROVIDER_KEY}`);
  expect(JSON.stringify(h)).not.toContain(CLIENT_KEY);
}

// ---------------------------------------------------------------------------------------------------------------

describe('uploads and downloads pass through byte for byte', () => {
  it('forwards a 3 MB files.create (toFile, multipart) over bodyLimitBytes as the client sent it: same bytes, same boundary, the provider key', async () => {
    const fake = await startFakeOpenAI();
    const s = await gateway(fake);
    const { sdk, sent } = client(s);
    const payload = awkwardBytes(3 * MB);
    const { data: file, response } = await sdk.files.create({ file: await toFile(payload, 'train ü.jsonl', { type: 'application/jsonl' }), purpose: 'batch' }).withResponse();
    expect(file).toMatchObject({ object: 'file', bytes: payload.length, filename: 'train ü.jsonl', purpose: 'batch' });
    const up = fake.seen.filter((r) => r.method === 'POST');
    expect(up).toHaveLength(1);
    expect(up[0]!.headers['content-type']).toBe(sent[0]!.contentType);
    expect(up[0]!.body.length).toBe(sent[0]!.body.length);
    expect(up[0]!.body.equals(sent[0]!.body)).toBe(true);
    expect(fake.files.get(file.id)!.bytes.equals(payload)).toBe(true);
    expectKeySwapped(up[0]!.headers);
    // The gateway's request id names the call upstream; the SDK is told not to repeat it.
    expect(up[0]!.headers['x-client-request-id']).toBe(response.headers.get('x-stormgate-request-id'));
    expect(response.headers.get('x-should-retry')).toBe('false');
  });

  it('forwards audio.transcriptions.create (multipart with a model field) byte for byte, and its answer', async () => {
    const fake = await startFakeOpenAI();
    const s = await gateway(fake);
    const { sdk, sent } = client(s);
    const wav = awkwardBytes(1.5 * MB);
    const t = await sdk.audio.transcriptions.create({ file: await toFile(wav, 'call.wav', { type: 'audio/wav' }), model: 'whisper-1' });
    expect(t.text).toBe(`heard ${wav.length} bytes, sha256 ${sha(wav)}, model whisper-1`);
    const up = fake.seen.find((r) => r.url === '/v1/audio/transcriptions')!;
    expect(up.body.equals(sent[0]!.body)).toBe(true);
    expect(up.headers['content-type']).toBe(sent[0]!.contentType);
    expectKeySwapped(up.headers);
  });

  it('streams an 8 MB files.content download: the client has its first megabyte before the provider sends the rest, and all of it intact', async () => {
    const fake = await startFakeOpenAI();
    const big = randomBytes(8 * MB);
    fake.files.set('file-big', { bytes: big, filename: 'out.jsonl', purpose: 'batch_output', contentType: 'application/octet-stream' });
    let clientHasFirstMB!: () => void;
    const firstMB = new Promise<void>((resolve) => (clientHasFirstMB = resolve));
    // Half, then nothing more until the client has read a megabyte: a gateway that held the body whole would wait forever.
    fake.download = (res, bytes) => {
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      res.write(bytes.subarray(0, 2 * MB));
      void firstMB.then(() => res.end(bytes.subarray(2 * MB)));
    };
    const s = await gateway(fake);
    const res = await fetch(`${s.url}/v1/files/file-big/content`, { headers: { authorization: `Bearer ${CLIENT_KEY}` } });
    expect(res.status).toBe(200);
    const chunks: Buffer[] = [];
    let got = 0;
    const reader = res.body!.getReader();
    const read = (async () => {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) return;
        chunks.push(Buffer.from(value));
        got += value.length;
        if (got >= MB) clientHasFirstMB();
      }
    })();
    await Promise.race([read, sleep(15_000).then(() => Promise.reject(new Error(`stuck at ${got} bytes: the gateway held the download`)))]);
    expect(sha(Buffer.concat(chunks))).toBe(sha(big));

    // And through the SDK, as an agent fetches a batch's output.
    fake.download = undefined;
    const { sdk } = client(s);
    const content = await sdk.files.content('file-big');
    expect(sha(await content.arrayBuffer())).toBe(sha(big));
  });

  it('serves the rest of the files, batches and vector stores API: list, retrieve, delete, batches.create/retrieve/list, vectorStores.create', async () => {
    const fake = await startFakeOpenAI();
    const s = await gateway(fake);
    const { sdk } = client(s);
    const file = await sdk.files.create({ file: await toFile(Buffer.from('{"custom_id":"1"}\n'), 'in.jsonl'), purpose: 'batch' });
    expect((await sdk.files.retrieve(file.id)).id).toBe(file.id);
    const page = await sdk.files.list({ limit: 2, purpose: 'batch' });
    expect(page.data.map((f) => f.id)).toEqual([file.id]);
    const batch = await sdk.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
    expect(batch).toMatchObject({ id: 'batch_1', input_file_id: file.id, status: 'validating' });
    expect((await sdk.batches.retrieve('batch_1')).status).toBe('in_progress');
    expect((await sdk.batches.list({ limit: 5 })).data.map((b) => b.id)).toEqual(['batch_1']);
    const vs = await sdk.vectorStores.create({ name: 'runbooks' });
    expect(vs).toMatchObject({ id: 'vs_1', name: 'runbooks' });
    expect((await sdk.files.delete(file.id)).deleted).toBe(true);
    // The query string goes on as it came; the assistants beta header too (vector stores need it).
    expect(fake.seen.find((r) => r.url.startsWith('/v1/files?'))!.url).toBe('/v1/files?limit=2&purpose=batch');
    expect(fake.seen.find((r) => r.url === '/v1/vector_stores')!.headers['openai-beta']).toBe('assistants=v2');
    for (const r of fake.seen) expectKeySwapped(r.headers);
  });

  it('answers models.retrieve itself: a routed model object, and 404 model_not_found for one no route serves', async () => {
    const fake = await startFakeOpenAI();
    const s = await gateway(fake);
    const { sdk } = client(s);
    const listed = (await sdk.models.list()).data.map((m) => m.id);
    expect(listed.length).toBeGreaterThan(0);
    expect((await sdk.models.retrieve(listed[0]!)).id).toBe(listed[0]);
    const err = await sdkError(sdk.models.retrieve('no-such-model-anywhere'));
    expect(err.status).toBe(404);
    expect(err.code).toBe('model_not_found');
  });
});

describe('moderations and image generations on managed routes: retried by the route', () => {
  it('retries a moderation the provider answers 503 twice, and the client sees one success', async () => {
    const fake = await startFakeOpenAI();
    fake.script('POST /v1/moderations', { kind: 'answer', status: 503, body: errorBody('overloaded') }, { kind: 'answer', status: 503, body: errorBody('overloaded') });
    const s = await gateway(fake);
    const { sdk } = client(s);
    const { data, response } = await sdk.moderations.create({ model: 'omni-moderation-latest', input: 'is this fine?' }).withResponse();
    expect(data.results[0]!.flagged).toBe(false);
    expect(fake.seen.filter((r) => r.url === '/v1/moderations')).toHaveLength(3);
    expect(response.headers.get('x-stormgate-attempts')).toBe('3');
    expect(response.headers.get('x-stormgate-route')).toBe('moderations');
  });

  it('waits out an image generation\'s 429 retry-after and passes the 1.5 MB image on intact', async () => {
    const fake = await startFakeOpenAI();
    fake.script('POST /v1/images/generations', { kind: 'answer', status: 429, headers: { 'retry-after': '1' }, body: errorBody('slow down', 'requests', 'rate_limit_exceeded') });
    const s = await gateway(fake);
    const { sdk, requests } = client(s);
    const started = Date.now();
    const img = await sdk.images.generate({ model: 'gpt-image-1', prompt: 'a lighthouse in a storm' });
    expect(Date.now() - started).toBeGreaterThanOrEqual(950);
    expect(img.data![0]!.b64_json).toBe(IMAGE_B64);
    expect(requests()).toBe(1);
    expect(fake.seen.filter((r) => r.url === '/v1/images/generations')).toHaveLength(2);
  });
});

describe('faults on a passthrough path: sent once, answered clearly, never a second upload', () => {
  it('passes a 503 with retry-after on files.create on once: one upload, x-should-retry false, so the SDK does not repeat it', async () => {
    const fake = await startFakeOpenAI();
    fake.script('POST /v1/files', { kind: 'answer', status: 503, headers: { 'retry-after': '1' }, body: errorBody('The server is overloaded') });
    const s = await gateway(fake);
    const { sdk, requests } = client(s);
    const err = await sdkError(sdk.files.create({ file: await toFile(awkwardBytes(2 * MB), 'a.jsonl'), purpose: 'batch' }));
    expect(err.status).toBe(503);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expectOpenAIError(err.error ? { error: err.error } : undefined, null as unknown as string, 'server_error');
    expect(requests()).toBe(1);
    expect(fake.seen.filter((r) => r.method === 'POST')).toHaveLength(1);
  });

  it('passes a 429 with retry-after on batches.retrieve on once, without the provider\'s rate-limit headers', async () => {
    const fake = await startFakeOpenAI();
    fake.script('GET /v1/batches/batch_1', {
      kind: 'answer',
      status: 429,
      headers: { 'retry-after': '2', 'x-ratelimit-remaining-requests': '0', 'openai-organization': 'org-secret-billing' },
      body: errorBody('Rate limit reached for requests', 'requests', 'rate_limit_exceeded'),
    });
    const s = await gateway(fake);
    const { sdk, requests } = client(s);
    const err = await sdkError(sdk.batches.retrieve('batch_1'));
    expect(err.status).toBe(429);
    expect(err.code).toBe('rate_limit_exceeded');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.headers?.get('x-ratelimit-remaining-requests')).toBeNull();
    expect(err.headers?.get('openai-organization')).toBeNull();
    expect(requests()).toBe(1);
    expect(fake.seen).toHaveLength(1);
  });

  it('answers 502 upstream_unavailable when the provider ran the upload and dropped the connection: one file, not two', async () => {
    const fake = await startFakeOpenAI();
    fake.script('POST /v1/files', { kind: 'run-then-reset' });
    const s = await gateway(fake);
    const { sdk, requests } = client(s);
    const err = await sdkError(sdk.files.create({ file: await toFile(awkwardBytes(MB), 'a.jsonl'), purpose: 'batch' }));
    expect(err.status).toBe(502);
    expect(err.code).toBe('upstream_unavailable');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(requests()).toBe(1);
    expect(fake.files.size).toBe(1);
  });

  it('never sends an upload cut mid-body by the provider twice: each client request is at most one upstream request', async () => {
    const fake = await startFakeOpenAI();
    fake.script('POST /v1/files', { kind: 'reset-after', bytes: 512 * 1024 }, { kind: 'reset-after', bytes: 512 * 1024 }, { kind: 'reset-after', bytes: 512 * 1024 });
    const s = await gateway(fake);
    const { sdk, requests } = client(s);
    const err = await sdk.files.create({ file: await toFile(awkwardBytes(3 * MB), 'a.jsonl'), purpose: 'batch' }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(OpenAI.APIError);
    const status = (err as InstanceType<typeof OpenAI.APIError>).status;
    if (status !== undefined) {
      // The gateway's answer reached the client: the provider's failure, said once.
      expect(status).toBe(502);
      expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('upstream_unavailable');
    }
    expect(fake.seen.filter((r) => r.method === 'POST').length).toBe(requests());
    expect(fake.files.size).toBe(0);
  });

  it('answers a hung upload 504 upstream_timeout at passthrough.timeoutMs, ends the upstream request, and sends it once', async () => {
    const fake = await startFakeOpenAI();
    fake.script('POST /v1/files', { kind: 'hang' });
    const s = await gateway(fake, { passthroughTimeoutMs: 1_000 });
    const { sdk, requests } = client(s);
    const started = Date.now();
    const err = await sdkError(sdk.files.create({ file: await toFile(awkwardBytes(MB), 'a.jsonl'), purpose: 'batch' }));
    const answeredAt = Date.now();
    expect(err.status).toBe(504);
    expect(err.code).toBe('upstream_timeout');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(answeredAt - started).toBeGreaterThanOrEqual(900);
    expect(answeredAt - started).toBeLessThan(8_000);
    expect(requests()).toBe(1);
    const up = fake.seen.filter((r) => r.method === 'POST');
    expect(up).toHaveLength(1);
    await sleep(300);
    expect(up[0]!.cutAt).toBeDefined();
  });

  it('ends the upstream upload when the client aborts while waiting for the answer (no ghost)', async () => {
    const fake = await startFakeOpenAI();
    fake.script('POST /v1/files', { kind: 'hang' });
    const s = await gateway(fake);
    const { sdk } = client(s);
    const left = new AbortController();
    const call = sdk.files.create({ file: await toFile(awkwardBytes(MB), 'a.jsonl'), purpose: 'batch' }, { signal: left.signal });
    const until = Date.now() + 5_000;
    while (!fake.seen.some((r) => r.method === 'POST' && r.body.length > 0) && Date.now() < until) await sleep(20);
    left.abort();
    await expect(call).rejects.toThrow();
    const leftAt = Date.now();
    await sleep(700);
    const up = fake.seen.filter((r) => r.method === 'POST');
    expect(up).toHaveLength(1);
    expect(up[0]!.cutAt).toBeDefined();
    expect(up[0]!.cutAt! - leftAt).toBeLessThan(500);
  });

  it('gives the client an OpenAI-shaped error when a proxy in front of the provider answers an HTML 502, sent once', async () => {
    const fake = await startFakeOpenAI();
    fake.script('GET /v1/batches', { kind: 'answer', status: 502, headers: { 'content-type': 'text/html' }, body: '<html><body><h1>502 Bad Gateway</h1>nginx</body></html>' });
    const s = await gateway(fake);
    const { sdk, requests } = client(s);
    const err = await sdkError(sdk.batches.list());
    expect(err.status).toBe(502);
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(err.headers?.get('content-type')).toMatch(/^application\/json/);
    expectOpenAIError({ error: err.error }, null as unknown as string, 'server_error');
    expect((err.error as { message: string }).message).toContain('502 Bad Gateway');
    expect(requests()).toBe(1);
    expect(fake.seen).toHaveLength(1);
  });
});

describe('the client\'s own timeout on a passthrough path', () => {
  it('answers 504 deadline_exceeded before an SDK\'s shorter timeout, x-should-retry false: one upload, ended upstream, not three', async () => {
    const fake = await startFakeOpenAI();
    fake.script('POST /v1/files', { kind: 'hang' }, { kind: 'hang' }, { kind: 'hang' });
    const s = await gateway(fake);
    const { sdk, requests } = client(s);
    // A per-request timeout: the SDK sends it as x-stainless-timeout (whole seconds). Bound by passthrough.timeoutMs
    // alone, the SDK gave up first and sent the upload again itself, three times at maxRetries 2.
    const started = Date.now();
    const err = await sdkError(sdk.files.create({ file: await toFile(awkwardBytes(256 * 1024), 'a.jsonl'), purpose: 'batch' }, { timeout: 2_000 }));
    expect(Date.now() - started).toBeLessThan(2_000);
    expect(err.status).toBe(504);
    expect(err.code).toBe('deadline_exceeded');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(requests()).toBe(1);
    await sleep(300);
    const up = fake.seen.filter((r) => r.method === 'POST');
    expect(up).toHaveLength(1);
    expect(up[0]!.cutAt).toBeDefined();
  });

  it('leaves a download whose headers came before the client\'s timeout to the client, however long it takes', async () => {
    const fake = await startFakeOpenAI();
    const bytes = randomBytes(64 * 1024);
    fake.files.set('file-slow', { bytes, filename: 'out.jsonl', purpose: 'batch_output', contentType: 'application/octet-stream' });
    // The headers and a first part at once, the rest a second later: past the client's 1 s.
    fake.download = (res, all) => {
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      res.write(all.subarray(0, 1024));
      setTimeout(() => res.end(all.subarray(1024)), 1_000);
    };
    const s = await gateway(fake);
    const res = await fetch(`${s.url}/v1/files/file-slow/content`, { headers: { authorization: `Bearer ${CLIENT_KEY}`, 'x-stormgate-timeout-ms': '1000' } });
    expect(res.status).toBe(200);
    expect(Buffer.from(await res.arrayBuffer()).equals(bytes)).toBe(true);
  });
});

describe('passthrough traffic in the metrics', () => {
  it('counts each passthrough request in stormgate_passthrough_requests_total by its path and answer class, none in the managed routes\' series', async () => {
    const fake = await startFakeOpenAI();
    fake.script('GET /v1/batches', { kind: 'answer', status: 503, body: errorBody('overloaded') });
    fake.script('POST /v1/files', { kind: 'hang' });
    const s = await gateway(fake);
    const { sdk } = client(s);
    const metric = async () =>
      parseMetrics(await (await fetch(`${s.url}/metrics`)).text()).filter((m) => m.name === 'stormgate_passthrough_requests_total');
    // Every path and class at zero from the start, so that increase() counts a first outage.
    const before = await metric();
    expect(before.filter((m) => m.labels.path === '/v1/batches').map((m) => [m.labels.status_class, m.value])).toEqual(
      ['2xx', '3xx', '4xx', '5xx', 'client_gone'].map((c) => [c, 0]),
    );
    await sdk.files.list();
    await sdk.files.list();
    await sdkError(sdk.batches.list());
    await sdk.files.retrieve('file-a');
    const left = new AbortController();
    const upload = sdk.files.create({ file: await toFile(awkwardBytes(1024), 'a.jsonl'), purpose: 'batch' }, { signal: left.signal, maxRetries: 0 });
    const until = Date.now() + 5_000;
    while (!fake.seen.some((r) => r.method === 'POST') && Date.now() < until) await sleep(20);
    left.abort();
    await expect(upload).rejects.toThrow();
    await sleep(200);
    const after = await metric();
    const count = (path: string, status_class: string) => after.find((m) => m.labels.path === path && m.labels.status_class === status_class)?.value;
    expect(count('/v1/files', '2xx')).toBe(3);
    expect(count('/v1/batches', '5xx')).toBe(1);
    expect(count('/v1/files', 'client_gone')).toBe(1);
    const managed = parseMetrics(await (await fetch(`${s.url}/metrics`)).text()).filter(
      (m) => /^stormgate_(requests|upstream_attempts)_total$/.test(m.name) && m.value > 0,
    );
    expect(managed).toEqual([]);
    expect(await linesFor(s, '/v1/', 5)).toHaveLength(5);
  });
});

describe('client keys, unknown paths and methods', () => {
  it('applies auth.keys to passthrough paths: no key, 401 and nothing forwarded; the agents key, forwarded with the provider key in its place', async () => {
    const fake = await startFakeOpenAI();
    const s = await gateway(fake, { auth: { keys: { agents: CLIENT_KEY } } });
    const anonymous = await fetch(`${s.url}/v1/files`, { method: 'POST', headers: { 'content-type': 'multipart/form-data; boundary=x' }, body: '--x--\r\n' });
    expect(anonymous.status).toBe(401);
    expectOpenAIError(await anonymous.json(), 'invalid_api_key');
    const wrong = await sdkError(client(s, { apiKey: 'sg-s27-wrong-guess' }).sdk.files.list());
    expect(wrong.status).toBe(401);
    expect(fake.seen).toHaveLength(0);
    const viaXApiKey = await fetch(`${s.url}/v1/batches`, { headers: { 'x-api-key': CLIENT_KEY } });
    expect(viaXApiKey.status).toBe(200);
    const file = await client(s).sdk.files.create({ file: await toFile(awkwardBytes(MB), 'a.jsonl'), purpose: 'batch' });
    expect(file.object).toBe('file');
    expect(fake.seen).toHaveLength(2);
    for (const r of fake.seen) {
      expectKeySwapped(r.headers);
      expect(r.headers['x-api-key']).toBeUndefined();
    }
    const lines = await linesFor(s, '/v1/', 4);
    expect(lines.filter((l) => l.status === 200).map((l) => l.client)).toEqual(['agents', 'agents']);
  });

  it('answers a path nothing serves 404 unknown_url, and a method passthrough does not open 405 with allow, neither forwarded', async () => {
    const fake = await startFakeOpenAI();
    const s = await gateway(fake, { methods: ['GET', 'POST'] });
    const { sdk } = client(s);
    const ft = await sdkError(sdk.fineTuning.jobs.create({ model: 'gpt-4o-mini', training_file: 'file-1' }));
    expect(ft.status).toBe(404);
    expect(ft.code).toBe('unknown_url');
    expect(ft.headers?.get('x-should-retry')).toBe('false');
    // A path that only starts like an open one is not under it.
    const lookalike = await fetch(`${s.url}/v1/files-admin`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
    expect(lookalike.status).toBe(404);
    expectOpenAIError(await lookalike.json(), 'unknown_url');
    const del = await sdkError(sdk.files.delete('file-1'));
    expect(del.status).toBe(405);
    expect(del.code).toBe('method_not_allowed');
    expect(del.headers?.get('allow')).toMatch(/GET/);
    expect(fake.seen).toHaveLength(0);
  });
});

describe('logs of passthrough traffic', () => {
  it('writes one line per passthrough request: its id, path, status, and the error code of an error', async () => {
    const fake = await startFakeOpenAI();
    fake.script('GET /v1/batches/batch_9', { kind: 'answer', status: 404, body: errorBody('No batch found with id batch_9', 'invalid_request_error', 'not_found') });
    const s = await gateway(fake);
    const { sdk } = client(s);
    const { response } = await sdk.files.create({ file: await toFile(awkwardBytes(MB), 'a.jsonl'), purpose: 'batch' }).withResponse();
    const missing = await sdkError(sdk.batches.retrieve('batch_9'));
    expect(missing.status).toBe(404);
    expect(missing.code).toBe('not_found');
    await sleep(100);
    const lines = await linesFor(s, '/v1/', 2);
    expect(lines).toHaveLength(2);
    expect(lines[0]).toMatchObject({ reqId: response.headers.get('x-stormgate-request-id'), status: 200 });
    // The path asked for, not the passthrough route's pattern (/v1/batches/*).
    expect(lines[1]).toMatchObject({ status: 404, errorCode: 'not_found', path: '/v1/batches/batch_9' });
    for (const l of s.logs) {
      expect(l).not.toContain(PROVIDER_KEY);
      expect(l).not.toContain(CLIENT_KEY);
    }
  });

  it('writes one line, not two, for a request the provider never answered, with what failed as upstreamCode', async () => {
    const fake = await startFakeOpenAI();
    fake.script('GET /v1/batches/batch_7', { kind: 'hang' });
    const s = await gateway(fake, { passthroughTimeoutMs: 500 });
    const { sdk } = client(s);
    const err = await sdkError(sdk.batches.retrieve('batch_7'));
    expect(err.status).toBe(504);
    await sleep(100);
    const id = err.headers?.get('x-stormgate-request-id');
    // Every line of the request (reply-from wrote a warn line "response errored" of its own, with a stack).
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    const all = s.logs.map((l) => JSON.parse(l) as Record<string, any>).filter((l) => l.reqId === id);
    expect(all).toHaveLength(1);
    expect(all[0]).toMatchObject({ msg: 'request', path: '/v1/batches/batch_7', status: 504, errorCode: 'upstream_timeout', upstreamCode: 'UND_ERR_HEADERS_TIMEOUT' });
  });
});
