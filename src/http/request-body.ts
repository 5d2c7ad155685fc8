// The managed API's request body: an optional content coding (gzip, deflate, br) decoded within the body limit, then
// one JSON object, kept as the raw bytes to forward unchanged and as the parsed object the pipeline reads.
import { isUtf8 } from 'node:buffer';
import { PassThrough, type Readable, type Transform } from 'node:stream';
import { createBrotliDecompress, createGunzip, createInflate } from 'node:zlib';
import { GatewayError } from '../errors.ts';
import { withoutBom } from './byte-order-mark.ts';

export interface ParsedBody {
  raw: Buffer;
  json: Record<string, unknown>;
}

const DECODERS: Record<string, () => Transform> = { gzip: createGunzip, 'x-gzip': createGunzip, deflate: createInflate, br: createBrotliDecompress };

/** The body's content coding, undefined when none; one the gateway cannot decode gets 415 naming it. */
export function contentEncoding(header: string | undefined): string | undefined {
  const encoding = header?.trim().toLowerCase();
  if (!encoding || encoding === 'identity') return undefined;
  // Own names only: `in` also finds what every object inherits, and `content-encoding: constructor` made a 500.
  if (!Object.hasOwn(DECODERS, encoding)) {
    throw new GatewayError('unsupported_media_type', `content-encoding ${printable(encoding)} is not supported; send the body uncompressed or with gzip, deflate or br`);
  }
  return encoding;
}

/**
 * A compressed body, decoded as it arrives. bodyLimitBytes bounds the decoded size (a zip bomb gets 413 as soon as it
 * passes the limit, not once inflated); fastify checks the encoded length against content-length through
 * `receivedEncodedLength`. The request itself is never destroyed, so the error can still be answered.
 */
export function decodeBody(payload: Readable, encoding: string, limit: number): Readable {
  const decoder = DECODERS[encoding]!();
  const out = Object.assign(new PassThrough(), { receivedEncodedLength: 0 });
  // A body fastify never reads (GET /v1/models, a text/plain POST answered 415) is decoded all the same: its error,
  // with no reader listening, was an uncaught exception that ended the process. A reader adds its own listener.
  out.on('error', () => undefined);
  let decoded = 0;
  const fail = (err: GatewayError) => {
    payload.unpipe(decoder);
    payload.resume();
    decoder.destroy();
    out.destroy(err);
  };
  payload.on('data', (chunk: Buffer) => {
    out.receivedEncodedLength += chunk.length;
  });
  decoder.on('data', (chunk: Buffer) => {
    decoded += chunk.length;
    if (decoded > limit) fail(new GatewayError('request_too_large', `the request body decompresses to more than server.bodyLimitBytes (${limit} bytes)`));
    else out.write(chunk);
  });
  decoder.on('end', () => out.end());
  decoder.on('error', (err) => fail(new GatewayError('invalid_body', `the request body is not valid ${encoding} data: ${err.message}`)));
  // pipe() forwards no errors: a client that drops the upload half-way must not leave the body parser waiting.
  const aborted = (err?: Error) => {
    if (out.destroyed) return;
    decoder.destroy();
    out.destroy(err ?? new Error('the client closed the connection before the request body was complete'));
  };
  payload.once('error', aborted);
  payload.once('close', () => {
    if (!payload.readableEnded) aborted();
  });
  payload.pipe(decoder);
  return out;
}

/** The managed API's body: a JSON object, a UTF-8 byte order mark tolerated (and not forwarded). */
export function parseJsonBody(body: Buffer): ParsedBody | GatewayError {
  const raw = withoutBom(body);
  if (raw.length === 0) return new GatewayError('invalid_body', 'the request body is empty; send a JSON object');
  // JSON on the wire is UTF-8 (RFC 8259 8.1). Other bytes (Latin-1 text, a UTF-16 body) parse with their characters
  // turned into U+FFFD: an OpenAI-compatible target got the raw bytes, which it refuses or reads its own way, while a
  // translated one (Anthropic) got the replaced text in silence. The check is a vectorised scan, far below the parse.
  if (!isUtf8(raw)) return new GatewayError('invalid_json', 'the request body is not valid UTF-8, as JSON sent over the network must be (RFC 8259); send it UTF-8 encoded');
  let json: unknown;
  try {
    json = JSON.parse(raw.toString('utf8'));
  } catch (e) {
    // JSON.parse quotes the input: keep binary and control characters out of the message.
    return new GatewayError('invalid_json', `the request body is not valid JSON: ${printable((e as Error).message)}`);
  }
  if (typeof json !== 'object' || json === null || Array.isArray(json)) return new GatewayError('invalid_body', 'the request body must be a JSON object');
  return { raw, json: json as Record<string, unknown> };
}

/** Client text for an error message (a model name, a content-type): long text is cut, nothing unprintable echoed. */
export function printable(text: string, max = 200): string {
  const clean = text.replace(/[\x00-\x1f\x7f-\x9f\ufffd]/g, '?');
  return clean.length > max ? `${clean.slice(0, max)}...` : clean;
}
