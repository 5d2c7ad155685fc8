// Review of the Responses API and passthrough paths (2026-12-05): what a passthrough passes back when it cannot read
// the provider's error, and what its log line says of an answer the provider broke off.
import { randomBytes } from 'node:crypto';
import { gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { FILES_PROVIDER, filesPassthrough } from './helpers/passthrough-files.ts';
import { useStacks } from './helpers/stack.ts';

const startStack = useStacks();
const startProvider = useFakeProviders();
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** configServedBy's key for the passthrough's provider. */
const KEY = `${FILES_PROVIDER}-key`;

/** Everything of a body the client can read, decoded as fetch decodes it; a body that breaks off keeps what came. */
async function readable(res: Response): Promise<string> {
  const reader = res.body!.getReader();
  let text = '';
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return text;
      text += Buffer.from(value).toString('latin1');
    }
  } catch {
    return text;
  }
}

describe('a passthrough error in a content-encoding the gateway cannot decode', () => {
  // zstd (which clients that accept it, curl and httpx with zstandard, ask providers for) or a stacked coding: the
  // gateway cannot search it for the key, and the client's fetch decodes it. Node 20 has no zstd, so the test stacks gzip.
  const twice = (text: string) => gzipSync(gzipSync(text));

  it('never hands the client the key a redirect body quotes', async () => {
    const provider = await startProvider((req, res) => {
      req.resume();
      res.writeHead(307, { location: '/v1/files/file-abc', 'content-type': 'text/plain', 'content-encoding': 'gzip, gzip' }).end(twice(`moved; you sent ${String(req.headers.authorization)}`));
    });
    const s = await filesPassthrough(startStack, provider.origin);
    const res = await fetch(`${s.url}/v1/files/old`, { redirect: 'manual' });
    expect(res.status).toBe(307);
    expect(await readable(res)).not.toContain(KEY);
  });

  it('never hands the client the key an error longer than the read cap quotes', async () => {
    const provider = await startProvider((req, res) => {
      req.resume();
      const noise = randomBytes(100_000).toString('base64');
      res.writeHead(400, { 'content-type': 'text/plain', 'content-encoding': 'gzip, gzip' }).end(twice(`you sent ${String(req.headers.authorization)} ${noise}`));
    });
    const s = await filesPassthrough(startStack, provider.origin);
    const res = await fetch(`${s.url}/v1/files/file-abc`);
    expect(res.status).toBe(400);
    const text = await readable(res);
    expect(text).not.toContain(KEY);
    // What it says instead is the gateway's own error, in the OpenAI shape, not undecodable bytes.
    expect(res.headers.get('content-encoding')).toBeNull();
    expect((JSON.parse(text) as { error: { message: string } }).error.message).toMatch(/^upstream answered 400/);
  });
});

describe('a passthrough answer the provider breaks off after its headers', () => {
  it('is logged as the provider\'s break (upstreamCode), not as a client that left', async () => {
    const provider = await startProvider((req, res) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      res.write('a'.repeat(100));
      setTimeout(() => res.socket?.destroy(), 100);
    });
    const s = await filesPassthrough(startStack, provider.origin);
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client', maxRetries: 0 });
    // The client sees the break (never a download that looks complete) ...
    await expect(client.files.content('file-abc').then((r) => r.text())).rejects.toThrow();
    await sleep(200);
    const line = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.path === '/v1/files/file-abc/content');
    // ... and the operator too: it stayed, the provider cut it.
    expect(line).toBeDefined();
    expect(line!.clientGone).toBeUndefined();
    expect(line!.upstreamCode).toBe('UND_ERR_SOCKET');
  });

  it('while a client that leaves mid-download is still the client leaving', async () => {
    const provider = await startProvider((req, res) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      const tick = setInterval(() => res.write('a'.repeat(100)), 20);
      res.on('close', () => clearInterval(tick));
    });
    const s = await filesPassthrough(startStack, provider.origin);
    const left = new AbortController();
    const res = await fetch(`${s.url}/v1/files/file-abc/content`, { signal: left.signal });
    await res.body!.getReader().read();
    left.abort();
    await sleep(300);
    const line = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.path === '/v1/files/file-abc/content');
    expect(line?.clientGone).toBe(true);
    expect(line?.upstreamCode).toBeUndefined();
  });
});
