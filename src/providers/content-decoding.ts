// Answers a provider (or a proxy in front of it) compressed although the gateway never asked: decoded before they are
// judged, translated or passed on. Only such answers pay anything; the common, uncompressed one is not wrapped.
// (undici's decompress interceptor wraps every request's handler, and is experimental: a warning at every start.)
import { pipeline, type Readable } from 'node:stream';
import { promisify } from 'node:util';
import { brotliDecompress, createBrotliDecompress, createGunzip, createInflate, gunzip, inflate } from 'node:zlib';
import type { HeaderBag } from '../header-bag.ts';

const STREAMS = { gzip: createGunzip, 'x-gzip': createGunzip, deflate: createInflate, br: createBrotliDecompress } as const;
const WHOLE = { gzip: promisify(gunzip), 'x-gzip': promisify(gunzip), deflate: promisify(inflate), br: promisify(brotliDecompress) } as const;
type Encoding = keyof typeof STREAMS;

/** The answer's content-encoding when it is one the gateway decodes; undefined for none, identity or an unknown one. */
export function encodingOf(headers: HeaderBag): Encoding | undefined {
  const raw = headers['content-encoding'];
  if (raw === undefined) return undefined;
  const name = (Array.isArray(raw) ? raw.join(',') : raw).trim().toLowerCase();
  return Object.hasOwn(STREAMS, name) ? (name as Encoding) : undefined;
}

/** The body decoded as it arrives; destroying either end (an abort) destroys both. */
export function decodedStream(body: Readable, encoding: Encoding): Readable {
  return pipeline(body, STREAMS[encoding](), () => {});
}

/**
 * A whole body, decoded, up to maxBytes decoded (a decompression bomb is cut there: `whole` false); undefined when the
 * bytes are not valid data of that encoding.
 */
export async function decodedWhole(bytes: Buffer, encoding: Encoding, maxBytes: number): Promise<{ bytes: Buffer; whole: boolean } | undefined> {
  try {
    return { bytes: await WHOLE[encoding](bytes, { maxOutputLength: maxBytes }), whole: true };
  } catch (err) {
    if ((err as { code?: unknown }).code === 'ERR_BUFFER_TOO_LARGE') return { bytes: Buffer.alloc(0), whole: false };
    return undefined;
  }
}

/**
 * A body's first maxBytes decoded, and what decodes before data that is cut or bad; undefined when nothing decodes.
 * For an error whose key must be taken out: it is searched in what the client will read, not in the encoded bytes.
 */
export async function decodedPrefix(bytes: Buffer, encoding: Encoding, maxBytes: number): Promise<Buffer | undefined> {
  const chunks: Buffer[] = [];
  let size = 0;
  const decoder = STREAMS[encoding]();
  decoder.end(bytes);
  try {
    for await (const chunk of decoder as AsyncIterable<Buffer>) {
      chunks.push(chunk);
      size += chunk.length;
      if (size >= maxBytes) break; // leaving the loop destroys the decoder: a bomb is cut here
    }
  } catch {
    // Cut or bad data: what decoded before it stands.
  }
  return size === 0 ? undefined : Buffer.concat(chunks, size).subarray(0, maxBytes);
}
