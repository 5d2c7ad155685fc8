// Second adversarial review of the passthrough paths (README "Paths", `passthrough.*`), as a user of the official
// `openai` SDK 6.x meets them: uploads streamed both ways, binary answers byte-exact, encoded ids and queries,
// redirects, HEAD and OPTIONS, compressed answers, aborts mid-upload and mid-download, logs and metrics.
// Against a raw node:http upstream of the test's own (the bundled mock serves no files, audio, batches or uploads).
// Found and fixed: a passthrough upload whose body did not arrive within server.requestTimeoutMs got its 408 on the bare
// socket under a fresh request id, while the request's own line said `clientGone: true` with no status and
// stormgate_passthrough_requests_total counted `client_gone` (the managed paths had this fixed in suite 62): the upstream
// call is now ended with the 408 as its reason, and the error handler answers it as the request's own answer
// (src/providers/passthrough.ts endPassthroughCall, src/server.ts answerTimedOut). Pinned too: that bound is on the
// whole upload, not a gap, so a steady upload longer than requestTimeoutMs is cut (README, Client connections).
import { createHash, randomBytes } from 'node:crypto';
import { request as httpRequest, type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { gzipSync } from 'node:zlib';
import OpenAI, { toFile } from 'openai';
import { describe, expect, it } from 'vitest';
import { configServedBy, parseMetrics, useStacks, type Stack } from './helpers/stack.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';

const startStack = useStacks();
const startProvider = useFakeProviders();
const MB = 1024 * 1024;
const KEY = 'files-key';
const sha = (b: Buffer | ArrayBuffer) => createHash('sha256').update(Buffer.from(b as ArrayBuffer)).digest('hex');

interface Seen {
  method: string;
  url: string;
  headers: IncomingHttpHeaders;
  bytes: number;
  hash: string;
  /** The request's body was cut before its end (the gateway, or its client, gave up). */
  aborted?: boolean;
  done: Promise<void>;
}

type Handler = (req: IncomingMessage, res: ServerResponse, seen: Seen) => void;

/** An upstream that hashes every body as it streams in (never holding it) and leaves the answer to `handler`. */
async function upstream(handler: Handler) {
  const seen: Seen[] = [];
  const p = await startProvider((req, res) => {
    const hash = createHash('sha256');
    let end!: () => void;
    const s: Seen = { method: req.method ?? '', url: req.url ?? '', headers: req.headers, bytes: 0, hash: '', done: new Promise((r) => (end = r)) };
    seen.push(s);
    req.on('data', (c: Buffer) => {
      s.bytes += c.length;
      hash.update(c);
    });
    req.on('end', () => {
      s.hash = hash.digest('hex');
      end();
    });
    req.on('aborted', () => ((s.aborted = true), end()));
    req.on('close', () => {
      if (!req.complete) s.aborted = true;
      end();
    });
    handler(req, res, s);
  });
  return { ...p, seen };
}

async function gateway(origin: string, opts: { bodyLimitBytes?: number; paths?: string[] } = {}): Promise<Stack> {
  return startStack({
    config: (mockUrl) => {
      const base = configServedBy(mockUrl, 'files', `${origin}/v1`);
      return {
        ...base,
        server: { ...base.server, ...(opts.bodyLimitBytes && { bodyLimitBytes: opts.bodyLimitBytes }) },
        passthrough: { provider: 'files', paths: opts.paths ?? ['/v1/files', '/v1/batches', '/v1/uploads', '/v1/audio'], methods: ['GET', 'POST', 'DELETE'] },
      };
    },
  });
}

const sdk = (s: Stack, opts: Partial<ConstructorParameters<typeof OpenAI>[0]> = {}) => new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0, ...opts });
const json = (res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}) =>
  res.writeHead(status, { 'content-type': 'application/json', ...headers }).end(JSON.stringify(body));

const fileObject = (id: string, bytes = 1) => ({ id, object: 'file', bytes, created_at: 1, filename: 'f.jsonl', purpose: 'batch', status: 'processed' });

describe('uploads and downloads streamed both ways', () => {
  it('streams a 50 MB multipart upload to the provider as it arrives (bodyLimitBytes 1 MB), byte for byte, once', async () => {
    // The SDK's toFile reads a stream whole before it sends it; a client with the file on disk streams it, as here.
    const up = await upstream((req, res, s) => void s.done.then(() => json(res, 200, fileObject('file-big', s.bytes))));
    const s = await gateway(up.origin, { bodyLimitBytes: MB });
    const boundary = '----stormgate-review-boundary';
    const head = Buffer.from(`--${boundary}\r\ncontent-disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--${boundary}\r\ncontent-disposition: form-data; name="file"; filename="big.jsonl"\r\ncontent-type: application/octet-stream\r\n\r\n`);
    const tail = Buffer.from(`\r\n--${boundary}--\r\n`);
    const chunk = randomBytes(MB);
    const sent = createHash('sha256');
    const req = httpRequest(`${s.url}/v1/files`, { method: 'POST', agent: false, headers: { authorization: 'Bearer sk-client-not-a-provider-key', 'content-type': `multipart/form-data; boundary=${boundary}`, 'content-length': String(head.length + 50 * MB + tail.length) } });
    const answer = new Promise<{ status: number; body: string }>((resolve, reject) => {
      req.on('response', (res) => {
        let body = '';
        res.on('data', (d: Buffer) => (body += d));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      });
      req.on('error', reject);
    });
    const write = (b: Buffer) => (sent.update(b), req.write(b) ? Promise.resolve() : new Promise<void>((r) => req.once('drain', () => r())));
    await write(head);
    for (let i = 0; i < 50; i++) {
      // Half the file, then nothing more until the provider has most of it: a gateway that held the body would stall here.
      if (i === 25) {
        const until = Date.now() + 15_000;
        while ((up.seen[0]?.bytes ?? 0) < 20 * MB && Date.now() < until) await sleep(20);
        expect(up.seen[0]?.bytes ?? 0, 'the provider had nothing of the first half while the client waited').toBeGreaterThanOrEqual(20 * MB);
      }
      await write(chunk);
    }
    await write(tail);
    req.end();
    const got = await answer;
    expect(got.status).toBe(200);
    await up.seen[0]!.done;
    expect(up.seen).toHaveLength(1);
    expect(up.seen[0]!.hash).toBe(sent.digest('hex'));
    expect(up.seen[0]!.headers.authorization).toBe(`Bearer ${KEY}`);
  }, 60_000);

  it('passes a 20 MB files.content download and an audio.speech answer on byte for byte', async () => {
    const blob = randomBytes(20 * MB);
    const mp3 = randomBytes(3 * MB);
    const up = await upstream((req, res) => {
      req.resume();
      if (req.url === '/v1/files/file-out/content') {
        res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': String(blob.length) });
        for (let at = 0; at < blob.length; at += MB) res.write(blob.subarray(at, at + MB));
        return void res.end();
      }
      if (req.url === '/v1/audio/speech') return void res.writeHead(200, { 'content-type': 'audio/mpeg' }).end(mp3);
      json(res, 404, { error: { message: 'no', type: 'invalid_request_error', param: null, code: null } });
    });
    const s = await gateway(up.origin);
    const content = await sdk(s).files.content('file-out');
    expect(content.headers.get('content-length')).toBe(String(blob.length));
    expect(sha(await content.arrayBuffer())).toBe(sha(blob));
    const speech = await sdk(s).audio.speech.create({ model: 'gpt-4o-mini-tts', voice: 'alloy', input: 'hi' });
    expect(speech.headers.get('content-type')).toBe('audio/mpeg');
    expect(sha(await speech.arrayBuffer())).toBe(sha(mp3));
  }, 60_000);

  it('passes a gzip answer on as the provider sent it (content-encoding kept, bytes untouched), and the SDK reads it', async () => {
    const list = { object: 'list', data: [fileObject('file-1')], has_more: false, first_id: 'file-1', last_id: 'file-1' };
    const zipped = gzipSync(JSON.stringify(list));
    const blob = randomBytes(MB);
    const zippedBlob = gzipSync(blob);
    const up = await upstream((req, res) => {
      req.resume();
      if (req.url?.startsWith('/v1/files/file-z/content')) return void res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-encoding': 'gzip', 'content-length': String(zippedBlob.length) }).end(zippedBlob);
      res.writeHead(200, { 'content-type': 'application/json', 'content-encoding': 'gzip', 'content-length': String(zipped.length), vary: 'accept-encoding' }).end(zipped);
    });
    const s = await gateway(up.origin);
    const page = await sdk(s).files.list();
    expect(page.data.map((f) => f.id)).toEqual(['file-1']);
    const raw = await rawHttp(`${s.url}/v1/files`, { 'accept-encoding': 'gzip' });
    expect(raw.headers['content-encoding']).toBe('gzip');
    expect(raw.body.equals(zipped)).toBe(true);
    const content = await sdk(s).files.content('file-z');
    expect(sha(await content.arrayBuffer())).toBe(sha(blob));
  });
});

describe('ids and queries with encoded characters', () => {
  it('forwards files.list pagination (after, limit, purpose) with its query as the client wrote it', async () => {
    const up = await upstream((req, res) => {
      req.resume();
      json(res, 200, { object: 'list', data: [], has_more: false });
    });
    const s = await gateway(up.origin);
    await sdk(s).files.list({ after: 'file-a&b=c/d?e', limit: 2, purpose: 'batch' });
    const q = new URL(`http://x${up.seen[0]!.url}`).searchParams;
    expect(up.seen[0]!.url.split('?')[0]).toBe('/v1/files');
    expect(q.get('after')).toBe('file-a&b=c/d?e');
    expect(q.get('limit')).toBe('2');
    expect(q.get('purpose')).toBe('batch');
    // And the page after, as the SDK's auto-pagination asks for it.
    const up2 = await upstream((req, res) => {
      req.resume();
      const after = new URL(`http://x${req.url}`).searchParams.get('after');
      json(res, 200, after ? { object: 'list', data: [fileObject('file-2')], has_more: false } : { object: 'list', data: [fileObject('file-1')], has_more: true });
    });
    const s2 = await gateway(up2.origin);
    const ids: string[] = [];
    for await (const f of sdk(s2).files.list({ limit: 1 })) ids.push(f.id);
    expect(ids).toEqual(['file-1', 'file-2']);
    expect(up2.seen.map((r) => r.url)).toEqual(['/v1/files?limit=1', '/v1/files?limit=1&after=file-1']);
  });

  it('never lets an encoded id leave the passthrough path upstream (files.retrieve of a traversal)', async () => {
    const up = await upstream((req, res) => {
      req.resume();
      json(res, 200, fileObject('x'));
    });
    const s = await gateway(up.origin, { paths: ['/v1/files'] });
    for (const id of ['file-abc/../../batches', '..', '%2e%2e', '../batches', 'file-abc%2F..%2F..%2Fbatches', '..\\..\\batches']) {
      // The SDK itself refuses `.` and `..` as an id (its path() check); what it lets through must stay under the path.
      await Promise.resolve().then(() => sdk(s).files.retrieve(id)).catch(() => undefined);
      await Promise.resolve().then(() => sdk(s).files.content(id)).catch(() => undefined);
    }
    expect(up.seen.length).toBeGreaterThan(0);
    for (const r of up.seen) {
      // Read as a provider that decodes the path once, then resolves dot segments, would read it.
      const out: string[] = [];
      for (const seg of decodeURIComponent(r.url.split('?')[0]!).replaceAll('\\', '/').split('/')) {
        if (seg === '..') out.pop();
        else if (seg !== '.') out.push(seg);
      }
      const resolved = out.join('/');
      expect(resolved, r.url).toMatch(/^\/v1\/files(\/|$)/);
    }
  });
});

describe('methods the SDKs do not send', () => {
  it('answers HEAD on a download with its headers (content-length, type) and no body', async () => {
    const blob = randomBytes(1234);
    const up = await upstream((req, res) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': String(blob.length) });
      res.end(req.method === 'HEAD' ? undefined : blob);
    });
    const s = await gateway(up.origin);
    const head = await rawHttp(`${s.url}/v1/files/file-1/content`, {}, 'HEAD');
    expect(head.status).toBe(200);
    expect(head.headers['content-length']).toBe('1234');
    expect(head.headers['content-type']).toBe('application/octet-stream');
    expect(head.body.length).toBe(0);
    expect(up.seen.map((r) => r.method)).toEqual(['HEAD']);
  });

  it('answers OPTIONS 405 with allow, not forwarded', async () => {
    const up = await upstream((req, res) => json(res, 200, {}));
    const s = await gateway(up.origin);
    const res = await rawHttp(`${s.url}/v1/files/file-1`, {}, 'OPTIONS');
    expect(res.status).toBe(405);
    expect(String(res.headers.allow).split(/,\s*/).sort()).toEqual(['DELETE', 'GET', 'HEAD', 'POST']);
    expect(up.seen).toHaveLength(0);
  });
});

describe('redirects from the provider', () => {
  it('passes a redirect on with the key taken out of its Location', async () => {
    const up = await upstream((req, res) => {
      req.resume();
      if (req.url === '/v1/files/file-r/content') return void res.writeHead(302, { location: `/v1/files/file-s/content?sig=${KEY}` }).end();
      if (req.url?.startsWith('/v1/files/file-s/content')) return void res.writeHead(200, { 'content-type': 'text/plain' }).end('moved');
      json(res, 404, {});
    });
    const s = await gateway(up.origin);
    const raw = await rawHttp(`${s.url}/v1/files/file-r/content`);
    expect(raw.status).toBe(302);
    expect(String(raw.headers.location)).not.toContain(KEY);
    expect(String(raw.headers.location)).toMatch(/^\/v1\/files\/file-s\/content/);
  });
});

describe('redirects to the provider\'s own address', () => {
  it('an absolute Location under the provider\'s baseUrl comes back as the gateway\'s path; one elsewhere (a signed download) goes on as it is', async () => {
    let origin = '';
    const up = await upstream((req, res) => {
      req.resume();
      if (req.url === '/v1/files/file-r/content') return void res.writeHead(307, { location: `${origin}/v1/files/file-s/content?part=2` }).end();
      if (req.url === '/v1/files/file-x/content') return void res.writeHead(302, { location: 'https://downloads.example.com/file-x?sig=abc' }).end();
      if (req.url === '/v1/files/file-o/content') return void res.writeHead(302, { location: `${origin}/other/place` }).end();
      json(res, 404, {});
    });
    origin = up.origin;
    const s = await gateway(up.origin);
    // Followed as given, the client would call the provider itself, without the key, past every policy.
    const own = await rawHttp(`${s.url}/v1/files/file-r/content`);
    expect(own.status).toBe(307);
    expect(own.headers.location).toBe('/v1/files/file-s/content?part=2');
    expect((await rawHttp(`${s.url}/v1/files/file-x/content`)).headers.location).toBe('https://downloads.example.com/file-x?sig=abc');
    // Outside the baseUrl's path, no path of the gateway's reaches it: as it is.
    expect((await rawHttp(`${s.url}/v1/files/file-o/content`)).headers.location).toBe(`${up.origin}/other/place`);
  });

  it('a passthrough path without /v1 gets its own path back, and one to a path passthrough does not serve goes on as it is', async () => {
    let origin = '';
    const up = await upstream((req, res) => {
      req.resume();
      if (req.url === '/v1/vector_stores/vs-1') return void res.writeHead(301, { location: `${origin}/v1/vector_stores/vs-2` }).end();
      if (req.url === '/v1/vector_stores/vs-3') return void res.writeHead(302, { location: `${origin}/v1/models/m` }).end();
      json(res, 404, {});
    });
    origin = up.origin;
    const s = await gateway(up.origin, { paths: ['/vector_stores'] });
    expect((await rawHttp(`${s.url}/vector_stores/vs-1`)).headers.location).toBe('/vector_stores/vs-2');
    expect((await rawHttp(`${s.url}/vector_stores/vs-3`)).headers.location).toBe(`${up.origin}/v1/models/m`);
  });
});

describe('the client leaving', () => {
  it('ends the upstream upload when the client goes mid-upload', async () => {
    const up = await upstream((req, res, s) => void s.done.then(() => json(res, 200, fileObject('f'))));
    const s = await gateway(up.origin, { bodyLimitBytes: MB });
    const req = httpRequest(`${s.url}/v1/files`, { method: 'POST', agent: false, headers: { 'content-type': 'multipart/form-data; boundary=x', 'content-length': String(100 * MB) } });
    req.on('error', () => undefined);
    for (let i = 0; i < 4; i++) req.write(randomBytes(256 * 1024));
    const until = Date.now() + 5_000;
    while ((up.seen[0]?.bytes ?? 0) < MB && Date.now() < until) await sleep(20);
    req.destroy();
    const left = Date.now();
    while (!up.seen[0]?.aborted && Date.now() < left + 5_000) await sleep(20);
    expect(up.seen).toHaveLength(1);
    expect(up.seen[0]!.aborted).toBe(true);
    expect(Date.now() - left).toBeLessThan(2_000);
    await sleep(200);
    const line = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.path === '/v1/files');
    expect(line).toMatchObject({ clientGone: true });
  });

  it('ends the upstream download when the client aborts mid-download, and counts and logs it', async () => {
    let upstreamClosed = false;
    const up = await upstream((req, res) => {
      req.resume();
      res.on('close', () => (upstreamClosed = !res.writableFinished));
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      const timer = setInterval(() => res.write(randomBytes(64 * 1024)), 20);
      res.on('close', () => clearInterval(timer));
    });
    const s = await gateway(up.origin);
    const ac = new AbortController();
    const content = await sdk(s).files.content('file-1', { signal: ac.signal });
    const reader = content.body!.getReader();
    await reader.read();
    ac.abort();
    const until = Date.now() + 5_000;
    while (!upstreamClosed && Date.now() < until) await sleep(50);
    expect(upstreamClosed).toBe(true);
    await sleep(200);
    const line = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.path === '/v1/files/file-1/content');
    expect(line).toMatchObject({ status: 200 });
    const metrics = parseMetrics(await (await fetch(`${s.url}/metrics`)).text());
    const counted = metrics.filter((m) => m.name === 'stormgate_passthrough_requests_total' && m.labels.path === '/v1/files' && m.value > 0);
    expect(counted.map((m) => m.labels.status_class)).toEqual(['2xx']);
  });
});

describe('a passthrough upload that does not arrive in time', () => {
  it('answers its 408 as the request\'s own answer: its id, a line with status 408 and request_timeout, counted 4xx, the upstream ended', async () => {
    const up = await upstream((req, res, s) => void s.done.then(() => !s.aborted && json(res, 200, fileObject('f'))));
    const s = await startStack({
      config: (mockUrl) => {
        const base = configServedBy(mockUrl, 'files', `${up.origin}/v1`);
        return { ...base, server: { ...base.server, requestTimeoutMs: 1_500 }, passthrough: { provider: 'files', paths: ['/v1/files'], methods: ['POST'] } };
      },
    });
    // Part of a multipart upload, then nothing: the client's link stalled (server.requestTimeoutMs bounds it).
    const answer = await new Promise<{ status: number; headers: IncomingHttpHeaders; body: string }>((resolve, reject) => {
      const req = httpRequest(`${s.url}/v1/files`, { method: 'POST', agent: false, headers: { 'content-type': 'multipart/form-data; boundary=x', 'content-length': String(4 * MB), 'x-request-id': 'stalled-upload-1' } }, (res) => {
        let body = '';
        res.on('data', (d: Buffer) => (body += d));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
      });
      req.on('error', reject);
      req.write(randomBytes(MB));
    });
    expect(answer.status).toBe(408);
    expect(JSON.parse(answer.body)).toMatchObject({ error: { code: 'request_timeout' } });
    expect(answer.headers['x-should-retry']).toBe('false');
    expect(answer.headers.connection).toBe('close');
    // The request's own id, as on a managed path: the client's support ticket names the line that tells what happened.
    expect(answer.headers['x-stormgate-request-id']).toBe('stalled-upload-1');
    const until = Date.now() + 3_000;
    while (!up.seen[0]?.aborted && Date.now() < until) await sleep(20);
    expect(up.seen).toHaveLength(1);
    expect(up.seen[0]!.aborted).toBe(true);
    await sleep(200);
    const lines = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.reqId === 'stalled-upload-1');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ path: '/v1/files', status: 408, errorCode: 'request_timeout' });
    expect(lines[0]!.clientGone).toBeUndefined();
    const metrics = parseMetrics(await (await fetch(`${s.url}/metrics`)).text());
    const counted = metrics.filter((m) => m.name === 'stormgate_passthrough_requests_total' && m.value > 0);
    expect(counted.map((m) => m.labels.status_class)).toEqual(['4xx']);
  });
});

describe('a passthrough upload longer than server.requestTimeoutMs', () => {
  it('is cut at requestTimeoutMs however steadily it arrives (README: the bound is on the whole request): 408, the upstream ended', async () => {
    const up = await upstream((req, res, s) => void s.done.then(() => !s.aborted && json(res, 200, fileObject('f'))));
    const s = await startStack({
      config: (mockUrl) => {
        const base = configServedBy(mockUrl, 'files', `${up.origin}/v1`);
        return { ...base, server: { ...base.server, requestTimeoutMs: 1_500 }, passthrough: { provider: 'files', paths: ['/v1/files'], methods: ['POST'] } };
      },
    });
    const started = Date.now();
    const answer = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = httpRequest(`${s.url}/v1/files`, { method: 'POST', agent: false, headers: { 'content-type': 'multipart/form-data; boundary=x', 'content-length': String(10 * MB) } }, (res) => {
        let body = '';
        res.on('data', (d: Buffer) => (body += d));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      });
      req.on('error', reject);
      // 256 KB every 100 ms: 2.5 MB/s, never a gap, 4 s for the whole.
      void (async () => {
        for (let i = 0; i < 40 && !req.destroyed; i++) {
          req.write(randomBytes(256 * 1024));
          await sleep(100);
        }
      })();
    });
    expect(answer.status).toBe(408);
    expect(Date.now() - started).toBeLessThan(3_500);
    const until = Date.now() + 3_000;
    while (!up.seen[0]?.aborted && Date.now() < until) await sleep(20);
    expect(up.seen[0]!.aborted).toBe(true);
    expect(up.seen[0]!.bytes).toBeLessThan(10 * MB);
  });
});

describe('the rest of the SDK surface through passthrough', () => {
  it('serves files.delete, batches create/retrieve/cancel/list and uploads (create, parts, complete)', async () => {
    const up = await upstream((req, res, s) => {
      void s.done.then(() => {
        const path = req.url!.split('?')[0]!;
        if (req.method === 'DELETE') return json(res, 200, { id: 'file-1', object: 'file', deleted: true });
        if (path === '/v1/batches' && req.method === 'POST') return json(res, 200, { id: 'batch_1', object: 'batch', status: 'validating' });
        if (path === '/v1/batches/batch_1/cancel') return json(res, 200, { id: 'batch_1', object: 'batch', status: 'cancelling' });
        if (path.startsWith('/v1/batches/')) return json(res, 200, { id: 'batch_1', object: 'batch', status: 'in_progress' });
        if (path === '/v1/batches') return json(res, 200, { object: 'list', data: [{ id: 'batch_1', object: 'batch' }], has_more: false });
        if (path === '/v1/uploads') return json(res, 200, { id: 'upload_1', object: 'upload', status: 'pending' });
        if (path === '/v1/uploads/upload_1/parts') return json(res, 200, { id: `part_${s.hash.slice(0, 8)}`, object: 'upload.part', upload_id: 'upload_1' });
        if (path === '/v1/uploads/upload_1/complete') return json(res, 200, { id: 'upload_1', object: 'upload', status: 'completed' });
        json(res, 404, { error: { message: 'no', type: 'invalid_request_error', param: null, code: null } });
      });
    });
    const s = await gateway(up.origin);
    const c = sdk(s);
    expect((await c.files.delete('file-1')).deleted).toBe(true);
    expect((await c.batches.create({ input_file_id: 'file-1', endpoint: '/v1/chat/completions', completion_window: '24h' })).id).toBe('batch_1');
    expect((await c.batches.retrieve('batch_1')).status).toBe('in_progress');
    expect((await c.batches.cancel('batch_1')).status).toBe('cancelling');
    expect((await c.batches.list()).data.map((b) => b.id)).toEqual(['batch_1']);
    const upload = await c.uploads.create({ bytes: 2 * MB, filename: 'x.jsonl', mime_type: 'text/jsonl', purpose: 'batch' });
    const part = randomBytes(2 * MB);
    const p = await c.uploads.parts.create(upload.id, { data: await toFile(part, 'part') });
    expect(p.upload_id).toBe('upload_1');
    expect((await c.uploads.complete(upload.id, { part_ids: [p.id] })).status).toBe('completed');
    for (const r of up.seen) expect(r.headers.authorization).toBe(`Bearer ${KEY}`);
  });
});

/** A request through node:http on a connection of its own, the body as bytes (never decoded). */
function rawHttp(url: string, headers: Record<string, string> = {}, method = 'GET'): Promise<{ status: number; headers: IncomingHttpHeaders; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(url, { method, headers, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (d: Buffer) => chunks.push(d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
    });
    req.on('error', reject);
    req.end();
  });
}
