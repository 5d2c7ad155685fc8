// Errors raised outside the pipeline, in the OpenAI error shape: what Node's HTTP server refuses (on the raw socket or
// response, before fastify sees a request), and fastify's own or passthrough's errors.
import { randomUUID } from 'node:crypto';
import { ServerResponse, STATUS_CODES, type IncomingMessage } from 'node:http';
import type { Socket } from 'node:net';
import type { FastifyBaseLogger, FastifyRequest } from 'fastify';
import { GatewayError } from '../errors.ts';
import { errorAnswer, type ErrorAnswer } from '../pipeline/final-answer.ts';
import { refusedByProxy } from '../policy/outcome.ts';
import { printable } from './request-body.ts';

/** The request of a connection that was answered before its body had come in (see markAnsweredEarly). */
const ANSWERED_EARLY = new WeakMap<Socket, IncomingMessage>();

/**
 * An answer went out before the request's body was read to its end: that request gets no second answer. Once Node has
 * read (and dropped) the rest of its body, the kept-alive connection's next request is a new one, answered as any.
 */
export function markAnsweredEarly(request: FastifyRequest): void {
  const socket = request.raw.socket;
  if (socket && !request.raw.complete) ANSWERED_EARLY.set(socket, request.raw);
}

/**
 * Answers a request fastify already has, whose body is still arriving, with `error` through its own reply (its id, its
 * line and count); false when it cannot, and the answer goes on the raw socket instead.
 */
type AnswerInFlight = (res: ServerResponse, error: GatewayError) => boolean;

/** Node's HTTP parser refused the request: answer in the OpenAI shape on the raw socket, then close it. */
export function answerClientError(err: Error & { code?: string }, socket: Socket, log: FastifyBaseLogger, answerInFlight?: AnswerInFlight): void {
  // A reset connection has no one to answer (https://nodejs.org/api/http.html#event-clienterror).
  if (err.code === 'ECONNRESET' || socket.destroyed) return;
  const inFlight = answerOn(socket);
  // A later request on the connection is malformed (pipelined behind requests still being answered, or bytes after a
  // `connection: close` one): those requests were read whole and went upstream. Answered here, the 400 went out first,
  // and the client read it as the first one's answer (billed, and lost); or, a stream's head already sent, the stream
  // was cut. Their answers go out, then the connection closes.
  if (inFlight instanceof ServerResponse && inFlight.req.complete) {
    if (!CLOSING.has(socket)) {
      CLOSING.add(socket);
      log.info({ code: err.code }, 'client error after a request still being answered: the connection closes after its answers');
      closeAfterAnswers(socket);
    }
    return;
  }
  // The request was answered already (413, 400, 503 before its body came in) and its body then timed out: a second
  // answer on the same connection would be garbage to the client. Close it.
  if (ANSWERED_EARLY.get(socket)?.complete === false || inFlight?.headersSent) {
    socket.destroy();
    return;
  }
  // The client closed its side half-way through a request it had started: nobody to answer, and the request (parsed,
  // with its id) gets its own line as one whose client left. A second line here would log it twice.
  if (err.code === 'HPE_INVALID_EOF_STATE' && inFlight !== undefined) {
    socket.destroy();
    return;
  }
  const gatewayError =
    err.code === 'HPE_HEADER_OVERFLOW'
      ? new GatewayError('headers_too_large', 'the request headers (the URL included) are larger than the gateway accepts')
      : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
        ? new GatewayError('request_timeout', 'the request did not arrive in time')
        : new GatewayError('bad_request', `the HTTP request is malformed (${err.code ?? 'parse error'})`);
  // A body that stopped arriving: its request was parsed and has an id, a log line and a count of its own. Answered on
  // the raw socket, its 408 carried another id, and its line said the client had left (client_gone, no status).
  if (err.code === 'ERR_HTTP_REQUEST_TIMEOUT' && inFlight instanceof ServerResponse && answerInFlight?.(inFlight, gatewayError)) return;
  answerOnSocket(socket, gatewayError, err.code, log);
}

/** The answer the connection is writing now (Node's own field: no public API names it), if any. */
function answerOn(socket: Socket): ServerResponse | undefined {
  return (socket as Socket & { _httpMessage?: ServerResponse | null })._httpMessage ?? undefined;
}

/** Connections that close once the answers they owe are written (a malformed request behind them). */
const CLOSING = new WeakSet<Socket>();

/**
 * Ends `socket` once the answer it is writing, and any queued behind it (Node hands the socket to the next one as the
 * answer finishes, before this listener runs), are written.
 */
function closeAfterAnswers(socket: Socket): void {
  const res = answerOn(socket);
  if (!res) {
    socket.end();
    // A client that keeps its side open must not hold the socket.
    setTimeout(() => socket.destroy(), 1_000).unref();
    return;
  }
  // Not shouldKeepAlive = false: Node would close the connection after this answer, and drop those queued behind it.
  res.once('close', () => setImmediate(() => closeAfterAnswers(socket)));
}

/**
 * A CONNECT asks a forward proxy for a tunnel (RFC 9110 9.3.6), which the gateway is not. Node hands it to no request
 * handler, and with no 'connect' listener closed the connection without a word.
 */
export function answerConnect(socket: Socket, log: FastifyBaseLogger): void {
  // Node takes its own listeners off a CONNECT's socket: a client's reset would be an uncaught 'error'.
  socket.on('error', () => socket.destroy());
  answerOnSocket(socket, new GatewayError('bad_request', 'CONNECT is not served: the gateway is no forward proxy; send the request itself to it'), 'CONNECT', log);
}

/** An answer written on the raw socket (no request reached fastify), then the socket closed. */
function answerOnSocket(socket: Socket, gatewayError: GatewayError, code: string | undefined, log: FastifyBaseLogger): void {
  // No request was parsed, so no id came with it: a fresh one, as every answer carries one (and the log line names it).
  const requestId = randomUUID();
  log.info({ reqId: requestId, code, status: gatewayError.status }, 'client error');
  if (!socket.writable) {
    socket.destroy();
    return;
  }
  const answer = errorAnswer(gatewayError);
  const body = JSON.stringify(answer.body);
  const head = Object.entries(closingHeaders(answer, body, requestId)).map(([k, v]) => `${k}: ${v}\r\n`).join('');
  socket.end(`HTTP/1.1 ${answer.status} ${STATUS_CODES[answer.status]}\r\n${head}\r\n${body}`);
  // A client that keeps its side open must not hold the socket.
  setTimeout(() => socket.destroy(), 1_000).unref();
}

/**
 * A request whose `expect` the gateway cannot meet (anything but 100-continue, RFC 9110 10.1.1): 417 in the OpenAI
 * shape, where Node would send an empty one. Node hands it over before fastify sees it, so no hook runs for it.
 */
export function answerUnmetExpectation(req: IncomingMessage, res: ServerResponse, requestId: string, log: FastifyBaseLogger): void {
  const err = new GatewayError('expectation_failed', `the gateway cannot meet \`expect: ${printable(req.headers.expect ?? '', 64)}\`; send the request without it, or with \`expect: 100-continue\``);
  log.info({ reqId: requestId, code: err.code, status: err.status }, 'client error');
  const answer = errorAnswer(err);
  const body = JSON.stringify(answer.body);
  // The body it was about to send (or sends anyway) is never read: the connection closes after the answer.
  res.writeHead(answer.status, closingHeaders(answer, body, requestId));
  res.end(body);
}

/** The head of an answer given outside fastify: the OpenAI error, the request id, and the connection closed after it. */
function closingHeaders(answer: ErrorAnswer, body: string, requestId: string): Record<string, string> {
  return { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(body)), connection: 'close', 'x-stormgate-request-id': requestId, 'x-request-id': requestId, ...answer.headers };
}

/** Passthrough requests the provider could not answer, by the code of what failed (undici's), for their log line. */
const upstreamCodes = new WeakMap<object, string>();

/**
 * Why a passthrough request got no answer from its provider (UND_ERR_HEADERS_TIMEOUT, ECONNREFUSED, ...), if it got
 * none, or why the answer broke off after its headers (notePassthroughBreak).
 */
export function passthroughUpstreamCode(request: FastifyRequest): string | undefined {
  return upstreamCodes.get(request);
}

/**
 * A passthrough answer the provider broke off after its headers (reset, a gap over idleMs): the gateway then closes the
 * client's connection itself, which is no client leaving (RequestEnds), and the line names what failed. `request` is
 * any fastify request: passthrough's is typed for any raw server, which FastifyRequest's default is not.
 */
export function notePassthroughBreak(request: object, err: unknown): void {
  const code = (err as { code?: unknown } | null)?.code;
  upstreamCodes.set(request, printable(String(code ?? 'broken'), 64));
}

/** fastify's own errors (body too large, bad media type, a URL it cannot decode) and passthrough's in the OpenAI shape. */
export function toGatewayError(err: unknown, request: FastifyRequest): GatewayError {
  if (err instanceof GatewayError) return err;
  const e = err as { code?: string; statusCode?: number; message?: string };
  switch (e.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      // fastify's own message ("Request body is too large") names no size: the route's limit does.
      return new GatewayError('request_too_large', `the request body is larger than server.bodyLimitBytes (${request.routeOptions.bodyLimit} bytes)`);
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE': {
      const type = request.headers['content-type'];
      return new GatewayError('unsupported_media_type', type ? `content-type ${printable(type)} is not supported; send application/json` : 'the request has a body but no content-type; send application/json');
    }
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
    case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH':
      return new GatewayError('invalid_body', e.message ?? 'the request body is empty or broken');
    case 'FST_ERR_BAD_URL':
      return new GatewayError('bad_request', `the URL cannot be decoded: ${printable(request.url)}`);
  }
  // Passthrough's proxy (reply-from, undici) could not get an answer from the provider.
  if (e.code !== undefined && (e.code.startsWith('FST_REPLY_FROM_') || e.code.startsWith('UND_ERR_') || e.code === 'ECONNRESET')) {
    // reply-from wraps undici's error: its code says which timer fired (UND_ERR_HEADERS_TIMEOUT: timeouts.firstTokenMs).
    const cause = (e as { cause?: { code?: unknown; message?: unknown } }).cause;
    // The gateway's own reason for ending the upstream request (the client's deadline: providers/passthrough.ts).
    if (cause instanceof GatewayError) return cause;
    const code = cause?.code ?? e.code;
    upstreamCodes.set(request, printable(String(code), 64));
    if (e.statusCode === 504 || code === 'UND_ERR_BODY_TIMEOUT') return new GatewayError('upstream_timeout', `the provider did not answer the passthrough request in time (${printable(String(code))})`);
    // The egress proxy's own failure (providers/egress-proxy.ts): its message names the proxy, never its credentials.
    const proxy = typeof code === 'string' && refusedByProxy(code) && typeof cause?.message === 'string' ? `: ${printable(cause.message)}` : '';
    return new GatewayError('upstream_unavailable', `the provider could not be reached for the passthrough request${proxy} (${printable(String(code))})`);
  }
  if (e.statusCode !== undefined && e.statusCode >= 400 && e.statusCode < 500) {
    return new GatewayError('bad_request', printable(e.message ?? 'bad request'), { status: e.statusCode });
  }
  request.log.error({ err }, 'unhandled error');
  return new GatewayError('internal_error', 'the gateway failed to handle the request');
}
