// One table from transport error codes (undici's `code`, Node's errno) to outcomes. Classify by code, never by message.
import { errors } from 'undici';
import type { AttemptOutcome } from '../policy/outcome.ts';

// Not ETIMEDOUT: undici's connect timeout (connectMs) fires long before the kernel's, so an ETIMEDOUT comes from an
// established connection (retransmissions unanswered), after the request may have been sent: a lost connection.
const TIMEOUT_CODES: Record<string, 'connect' | 'headers' | 'idle'> = {
  UND_ERR_CONNECT_TIMEOUT: 'connect',
  UND_ERR_HEADERS_TIMEOUT: 'headers',
  UND_ERR_BODY_TIMEOUT: 'idle',
};

/** Errors undici and Node raise for a request they refuse to send: a header value with a line break, a bad argument. */
const INVALID_REQUEST_CODES = new Set(['UND_ERR_INVALID_ARG', 'ERR_INVALID_CHAR', 'ERR_INVALID_HTTP_TOKEN', 'ERR_INVALID_ARG_TYPE', 'ERR_INVALID_ARG_VALUE']);

/** zlib's codes (Z_DATA_ERROR, ...) and brotli's (ERR__ERROR_FORMAT_...): a compressed answer that does not decode. */
const DECODE_ERROR_CODE = /^Z_|^ERR__ERROR|BROTLI/;

/**
 * An answer whose headers came and whose body broke off (a connection lost mid-body, a chunk that does not parse):
 * the provider was answering, so the request ran; an unusable answer, not a provider out of reach.
 */
export class AnswerCut extends Error {
  constructor(override readonly cause: Error) {
    super(cause.message);
  }
}

/** What an error that cut an answer after its headers means: a timeout stays one; a lost connection is a cut answer. */
export function cutOutcome(err: unknown, what: string): AttemptOutcome {
  const outcome = transportOutcome(err);
  return outcome.kind === 'network' ? { kind: 'bad-stream', detail: `${what} (${outcome.code})`, ran: true } : outcome;
}

/** Maps an error thrown by undici (or the socket under it) to an attempt outcome. Unknown errors count as network failures. */
export function transportOutcome(err: unknown): AttemptOutcome {
  const code = errorCode(err);
  const phase = code ? TIMEOUT_CODES[code] : undefined;
  if (phase) return { kind: 'timeout', phase };
  if (code && INVALID_REQUEST_CODES.has(code)) return { kind: 'internal', code };
  // The stream had started: the provider was answering, in bytes that are not what their encoding says.
  if (code && DECODE_ERROR_CODE.test(code)) return { kind: 'bad-stream', detail: `the answer does not decode (${code})`, ran: true };
  // The provider answered (it ran the request), with more header bytes than undici reads (16 KB).
  if (code === 'UND_ERR_HEADERS_OVERFLOW') return { kind: 'bad-stream', detail: 'the answer\'s headers are too large', ran: true };
  // The provider answered in bytes that are not HTTP/1.1 (a broken status line or header, a server of another protocol
  // on that port). undici's parser error carries no code: read as a network failure, the client was told the provider
  // "could not be reached (last: UNKNOWN)", and the operator looked for a connectivity problem. It may have run the request.
  // (No code only through an undici slip, which looks llhttp's code up by number in a table keyed by name: fixed, it
  // gives HPE_* codes, read the same.)
  if ((code === undefined || code.startsWith('HPE_')) && isParserError(err)) return { kind: 'bad-stream', detail: 'the answer is not valid HTTP/1.1', ran: true };
  // undici reports any parser error met once a content-length header was read (a second content-length that differs,
  // one beside transfer-encoding, one that is no number, a control byte in a later header) as this mismatch, before
  // the headers reach the gateway. The provider answered, in bytes that are not HTTP/1.1, as above.
  if (code === 'UND_ERR_RES_CONTENT_LENGTH_MISMATCH') return { kind: 'bad-stream', detail: 'the answer is not valid HTTP/1.1 (its length does not match its content-length)', ran: true };
  // llhttp reads any three digits as a status; below 100 (000-099) undici fails its own assertion while parsing the
  // answer's head. Errors reach here only from a request undici was running, so that is undici refusing what it read.
  if (code === 'ERR_ASSERTION') return { kind: 'bad-stream', detail: 'the answer is not valid HTTP/1.1 (undici refused its head: a status below 100?)', ran: true };
  if (code === 'UND_ERR_SOCKET' && isUnreadableStatus(err)) return { kind: 'bad-stream', detail: 'the answer began with an informational status (100 or 101) the gateway never asked for', ran: true };
  return { kind: 'network', code: code ?? 'UNKNOWN' };
}

function errorCode(err: unknown): string | undefined {
  let e = err as { code?: unknown; cause?: unknown } | undefined;
  // undici wraps socket errors; the errno code sits on the cause.
  for (let depth = 0; e && depth < 3; depth++) {
    if (typeof e.code === 'string' && e.code !== 'UND_ERR_SOCKET') return e.code;
    if (typeof e.code === 'string' && !e.cause) return e.code;
    e = e.cause as typeof e;
  }
  return undefined;
}

/** undici's HTTPParserError, itself or as the cause of the error that reports it. */
function isParserError(err: unknown): boolean {
  return err instanceof errors.HTTPParserError || (err as { cause?: unknown } | undefined)?.cause instanceof errors.HTTPParserError;
}

/**
 * undici refuses a `100 Continue` the gateway never asked for (RFC 9110 15.2 would have a client skip it; some servers
 * and proxies send one before every answer) and a `101` without an upgrade: it destroys the connection with a
 * SocketError whose only mark is its message, the code being every socket error's. The provider was answering, so
 * it ran the request; read as a lost connection, the client was told it "could not be reached".
 */
function isUnreadableStatus(err: unknown): boolean {
  const e = err instanceof errors.SocketError ? err : (err as { cause?: unknown } | undefined)?.cause;
  return e instanceof errors.SocketError && (e.message === 'bad response' || e.message === 'bad upgrade');
}
