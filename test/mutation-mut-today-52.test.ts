// Mutation round 52 on three modules no earlier round had mutated on their own: providers/content-decoding.ts (the
// content-encodings a provider sends unasked: which are decoded, a decompression bomb cut), observability/rate-window.ts
// (the per-route window behind stormgate_retry_success_rate and stormgate_fallback_rate) and streaming/hidden-usage.ts
// (the usage the gateway asked for and the client did not, taken out of its chunks). 43 hand mutants: 22 killed by the
// existing files, 15 killed here, 5 equivalent, 1 left as a question (content decoding 15: 5/9/1; rate window 14:
// 11/1/2; hidden usage 14: 6/5/2, and a usage chunk whose `usage` is no object, kept without it or dropped).
// One of them showed a defect, fixed in pipeline/attempt.ts: a whole (non-streaming) error that a provider gzipped,
// under the 64 KB error cap compressed and over it decoded, reached the client with no message at all, where the same
// error uncompressed, or on a stream request, came with its first 64 KB.
import { Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { gzipSync } from 'node:zlib';
import OpenAI from 'openai';
import { describe, expect, it, vi } from 'vitest';
import { RateWindow } from '../src/observability/rate-window.ts';
import { decodedPrefix, decodedStream, decodedWhole, encodingOf } from '../src/providers/content-decoding.ts';
import { takeUsageOut } from '../src/streaming/hidden-usage.ts';
import { SseParser, type SseEvent } from '../src/streaming/sse-parser.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { configServedBy, useStacks } from './helpers/stack.ts';

// Every gunzip the module makes, kept to see how much of its input it read (a bomb must be left once the cap is met).
const gunzips = vi.hoisted(() => [] as Array<{ bytesWritten: number }>);
vi.mock('node:zlib', async (original) => {
  const zlib = await original<typeof import('node:zlib')>();
  return {
    ...zlib,
    createGunzip: (...args: Parameters<typeof zlib.createGunzip>) => {
      const g = zlib.createGunzip(...args);
      gunzips.push(g);
      return g;
    },
  };
});

const startProvider = useFakeProviders();
const startStack = useStacks();

async function readAll(stream: NodeJS.ReadableStream): Promise<string> {
  const chunks: Buffer[] = [];
  await pipeline(stream, new Writable({ write: (c: Buffer, _e, done) => (chunks.push(c), done()) }));
  return Buffer.concat(chunks).toString();
}

describe('content-decoding: which content-encodings are decoded, and how far', () => {
  it("names x-gzip (HTTP/1.1's alias of gzip) an encoding it decodes, and decodes it whole and as a stream", async () => {
    const zipped = gzipSync('{"ok":true}');
    expect(encodingOf({ 'content-encoding': 'x-gzip' })).toBe('x-gzip');
    expect((await decodedWhole(zipped, 'x-gzip', 1024))?.bytes.toString()).toBe('{"ok":true}');
    const { Readable } = await import('node:stream');
    expect(await readAll(decodedStream(Readable.from([zipped]), 'x-gzip'))).toBe('{"ok":true}');
  });

  it('decodes no stacked encoding (gzip, then br) sent as two header lines, and reads a name with spaces round it', () => {
    expect(encodingOf({ 'content-encoding': ['gzip', 'br'] })).toBeUndefined();
    expect(encodingOf({ 'content-encoding': ['gzip'] })).toBe('gzip');
    expect(encodingOf({ 'content-encoding': ' GZIP ' })).toBe('gzip');
  });

  it('cuts a whole body that decodes past maxBytes (a bomb): nothing of it, and not whole, never the bad-data undefined', async () => {
    const bomb = gzipSync(Buffer.alloc(4 * 1024 * 1024));
    expect(bomb.length).toBeLessThan(64 * 1024);
    expect(await decodedWhole(bomb, 'gzip', 1024 * 1024)).toEqual({ bytes: Buffer.alloc(0), whole: false });
    expect((await decodedWhole(bomb, 'gzip', 8 * 1024 * 1024))?.bytes.length).toBe(4 * 1024 * 1024);
  });

  it("decodes a prefix of exactly maxBytes from a bomb, and leaves the rest of the bomb's input unread", async () => {
    const bomb = gzipSync(Buffer.alloc(64 * 1024 * 1024, 'a'));
    gunzips.length = 0;
    const prefix = await decodedPrefix(bomb, 'gzip', 1000);
    expect(prefix?.toString()).toBe('a'.repeat(1000));
    expect(gunzips).toHaveLength(1);
    // Decoded to its end, the whole input is read (and 64 MB held before the cut): left at the cap, a fraction of it.
    expect(gunzips[0]!.bytesWritten).toBeLessThan(bomb.length / 2);
  });
});

describe('a whole answer: an error a provider gzipped that decodes past the error cap', () => {
  it('reaches the client with the text its first 64 KB decode to, as it would uncompressed or on a stream', async () => {
    const error = { error: { message: `temperature is not supported with this model; ${'see the documentation '.repeat(4000)}`, type: 'invalid_request_error', code: 'unsupported_parameter', param: 'temperature' } };
    const zipped = gzipSync(JSON.stringify(error));
    expect(zipped.length).toBeLessThan(64 * 1024);
    const p = await startProvider((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(400, { 'content-type': 'application/json', 'content-encoding': 'gzip' });
        res.end(zipped);
      });
    });
    const s = await startStack({ config: (mockUrl) => configServedBy(mockUrl, 'zipped', `${p.origin}/v1`) });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    const err = (await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err.status).toBe(400);
    expect(err.message).toContain('temperature is not supported with this model');
    expect(p.hits()).toBe(1);
  });
});

describe('rate-window: a request counts in the whole second it came in', () => {
  it('counts one recorded late in second 0 through second 59, and not in second 60 (its second is floored, not rounded)', () => {
    let now = 600;
    const w = new RateWindow(60, () => now);
    w.record('chat', { retried: true, ok: true, fallback: true });
    now = 59_900;
    expect(w.rates('chat')).toEqual({ retrySuccess: 1, fallback: 1 });
    now = 60_100;
    expect(w.rates('chat')).toEqual({ retrySuccess: undefined, fallback: undefined });
  });
});

const event = (text: string): SseEvent => new SseParser().push(Buffer.from(`${text}\n\n`))[0]!;
/** What a client's SSE parser reads of the event the gateway writes. */
const reread = (ev: SseEvent): SseEvent => event(ev.raw);

describe('takeUsageOut: what reaches the client of a chunk split over several data lines, or named', () => {
  it('writes a chunk whose data spans lines, with "usage": null, as one data line a client reads as the same JSON', () => {
    const ev = event('data: {"choices":[{"index":0,\ndata: "delta":{"content":"a"}}],"usage":null}');
    const { left } = takeUsageOut(ev);
    expect(left!.raw.split('\n').every((l) => l.startsWith('data: '))).toBe(true);
    expect(JSON.parse(reread(left!).data!)).toEqual({ choices: [{ index: 0, delta: { content: 'a' } }] });
  });

  it('writes the data of a chunk with choices and a usage on several lines once, not once per line', () => {
    const ev = event('data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],\ndata: "usage":{"prompt_tokens":3,"completion_tokens":4}}');
    const { left, usage } = takeUsageOut(ev);
    expect(usage).toMatchObject({ prompt: 3, completion: 4 });
    expect(left!.raw).toBe('data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}');
  });

  it('drops an empty data line with the other data lines it replaces', () => {
    const ev = event('data: {"choices":[{"index":0,"delta":{"content":"a"}}],\ndata\ndata: "usage":{"prompt_tokens":3,"completion_tokens":4}}');
    expect(takeUsageOut(ev).left!.raw).toBe('data: {"choices":[{"index":0,"delta":{"content":"a"}}]}');
  });

  it("keeps the event's name (an `event: error` is judged by it) on a chunk it rewrites", () => {
    const ev = event('event: error\ndata: {"error":{"message":"overloaded"},"usage":null}');
    const { left } = takeUsageOut(ev);
    expect(left!.event).toBe('error');
    expect(left!.data).toBe('{"error":{"message":"overloaded"}}');
  });

  it('drops a usage chunk that has no choices key at all, as one with `choices: []`', () => {
    const { left, usage } = takeUsageOut(event('data: {"id":"c1","object":"chat.completion.chunk","usage":{"prompt_tokens":3,"completion_tokens":2}}'));
    expect(left).toBeUndefined();
    expect(usage).toMatchObject({ prompt: 3, completion: 2 });
  });
});
