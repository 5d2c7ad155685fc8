// Small request helpers shared by the API and control handlers.
import type { IncomingHttpHeaders, IncomingMessage } from 'node:http';

/** Largest request body the mock reads; beyond it the request gets 413. */
const BODY_LIMIT_BYTES = 16 * 1024 * 1024;

/** Reads the whole body; calls back with undefined when it exceeds the limit. */
export function readBody(req: IncomingMessage, done: (body: Buffer | undefined) => void): void {
  const chunks: Buffer[] = [];
  let size = 0;
  req.on('data', (chunk: Buffer) => {
    size += chunk.length;
    // Keep draining past the limit so the connection stays usable for the 413.
    if (size <= BODY_LIMIT_BYTES) chunks.push(chunk);
  });
  req.on('end', () => done(size > BODY_LIMIT_BYTES ? undefined : chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, size)));
}

/** Parses a JSON object body; an empty body is `{}`. Throws on anything else. */
export function parseJsonObject(raw: Buffer): Record<string, unknown> {
  if (raw.length === 0) return {};
  const value: unknown = JSON.parse(raw.toString('utf8'));
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new Error('body must be a JSON object');
  return value as Record<string, unknown>;
}

/** Node's header object with every value as one string. */
export function flattenHeaders(headers: IncomingHttpHeaders): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name in headers) {
    const v = headers[name];
    out[name] = Array.isArray(v) ? v.join(', ') : (v ?? '');
  }
  return out;
}

/** Path without the query string. */
export function pathOf(url: string | undefined): string {
  if (url === undefined) return '/';
  const q = url.indexOf('?');
  return q === -1 ? url : url.slice(0, q);
}
