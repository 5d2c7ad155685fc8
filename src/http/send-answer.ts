// Writing an answer to the client: the pipeline's (a stream's first output at once) or an error, in the shape the
// route's clients read.
import type { OutgoingHttpHeaders } from 'node:http';
import { Readable } from 'node:stream';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { upstreamErrorFields, type GatewayError, type OpenAIErrorBody } from '../errors.ts';
import { toAnthropicShape } from '../providers/anthropic/index.ts';
import { MAX_ERROR_BODY_BYTES } from '../providers/read-capped.ts';
import { errorAnswer } from '../pipeline/final-answer.ts';
import type { PipelineAnswer } from '../pipeline/handle-request.ts';
import { StreamBody, writeOpening } from '../streaming/stream-body.ts';
import { withoutBom } from './byte-order-mark.ts';
import { safeHeaders } from './header-safe.ts';

/** The `code` of the error body each request was answered with, for its log line (`errorCode`). */
const errorCodes = new WeakMap<object, string>();

/**
 * The error code the request's client was answered with (a status of 400 or more), if its body named one. Not
 * providers/error-outcome.ts errorCodeOf, which is the code the outcome table classifies an upstream error by.
 */
export function answeredErrorCode(request: FastifyRequest): string | undefined {
  return errorCodes.get(request);
}

/**
 * Notes the error code of an answer's body (an OpenAI-shaped object, or the bytes of an upstream error passed on).
 * `request` is any fastify request: passthrough's is typed for any raw server, which FastifyRequest's default is not.
 */
export function noteErrorCode(request: object, body: unknown): void {
  let parsed = body;
  // An upstream error passed on byte for byte: parsed only when no larger than an error body is ever read (an answer is not).
  if (Buffer.isBuffer(body)) {
    if (body.length > MAX_ERROR_BODY_BYTES) return;
    try {
      parsed = JSON.parse(withoutBom(body).toString('utf8'));
    } catch {
      return;
    }
  }
  // Read as the client's error body is made (Gemini's list, a flat vLLM or Mistral body); Gemini's code is a number.
  const code = upstreamErrorFields(parsed)?.code;
  if (typeof code === 'string' || (typeof code === 'number' && Number.isFinite(code))) errorCodes.set(request, String(code).slice(0, 128));
}

/** The provider's request id of a passthrough answer passed on, for its log line (`upstreamRequestId`). */
const passthroughRequestIds = new WeakMap<object, string>();

/** Notes a passthrough answer's request id (`x-request-id`), read from the provider's headers without its key. */
export function notePassthroughRequestId(request: object, id: string): void {
  passthroughRequestIds.set(request, id.slice(0, 256));
}

/** The provider's request id of the passthrough answer the request was given, if it carried one. */
export function passthroughRequestId(request: FastifyRequest): string | undefined {
  return passthroughRequestIds.get(request);
}

/** An error the gateway answers itself, with the request's id: what the SDKs show, and what its log line carries. */
export function sendError(reply: FastifyReply, err: GatewayError): FastifyReply {
  const answer = errorAnswer(err);
  noteErrorCode(reply.request, answer.body);
  reply.header('x-request-id', reply.request.id);
  return reply.code(answer.status).headers(safeHeaders({ ...answer.headers, ...err.headers })).type('application/json').send(clientShaped(reply, answer.status, answer.body));
}

/**
 * Is the request on a route whose clients speak Anthropic's API (the route's `anthropic` config), or, from a client
 * that sent `anthropic-version`, on the model listing (it answers in Anthropic's shape) or on a path no route serves
 * (Claude Code's `/v1/messages/count_tokens` where only `/v1/messages` is routed: the SDK reads its 404 and request id)?
 */
function speaksAnthropic(reply: FastifyReply): boolean {
  const config = reply.request.routeOptions.config as { anthropic?: boolean; anthropicByHeader?: boolean } | undefined;
  return config?.anthropic === true || ((config?.anthropicByHeader === true || reply.request.is404) && sentAnthropicVersion(reply.request));
}

/** A client that sends anthropic-version speaks Anthropic's API (the Anthropic SDKs always send it). */
export function sentAnthropicVersion(request: FastifyRequest): boolean {
  return request.headers['anthropic-version'] !== undefined;
}

/**
 * An error body as the route's clients read it: the OpenAI shape; for Anthropic's API that shape with Anthropic's
 * `type: "error"` and error type, and the request id also as `request-id`, the header the Anthropic SDKs read.
 */
function clientShaped(reply: FastifyReply, status: number, body: OpenAIErrorBody): OpenAIErrorBody {
  if (!speaksAnthropic(reply)) return body;
  if (reply.getHeader('request-id') === undefined) reply.header('request-id', reply.getHeader('x-request-id') ?? reply.request.id);
  return toAnthropicShape(status, body);
}

/** Writes the pipeline's answer. A stream that cannot be sent is closed, so its upstream connection is not left open. */
export function sendAnswer(reply: FastifyReply, answer: PipelineAnswer): FastifyReply {
  reply.code(answer.status);
  const { body } = answer;
  if (!(body instanceof Readable)) {
    if (answer.status >= 400) {
      // An error the gateway made itself has no provider's id: the SDKs show ours instead (err.requestID, request_id),
      // which is the one the gateway's log lines carry.
      if (answer.headers['x-request-id'] === undefined) reply.header('x-request-id', reply.request.id);
      noteErrorCode(reply.request, body);
    }
    reply.headers(safeHeaders(answer.headers));
    return Buffer.isBuffer(body) ? reply.send(body) : reply.type('application/json').send(answer.status >= 400 ? clientShaped(reply, answer.status, body as OpenAIErrorBody) : body);
  }
  try {
    return sendStream(reply, body, answer.headers);
  } catch (err) {
    body.destroy();
    throw err;
  }
}

/**
 * A stream's first output is the time to first token: its head and first chunk leave now, in one write, not after
 * the ticks reply.send(stream) takes to start its pipe (every pending promise of the request runs first). fastify
 * still runs onResponse on the response's 'finish' (so the request is logged and counted once). The body is
 * destroyed when the response closes first (the client left; the body's 'close' aborts the upstream), and the
 * response when the body fails: what stream.pipeline() does, without the AbortController it makes and aborts per
 * call (with a DOMException and an event dispatch each, a sixteenth of a stream's CPU).
 */
function sendStream(reply: FastifyReply, body: Readable, headers: Record<string, string>): FastifyReply {
  const res = reply.raw;
  // The answer's headers go straight into the head, not through fastify's reply (set one by one, then copied out).
  // Throws before hijacking when a header value cannot be written: the error handler answers then.
  res.writeHead(reply.statusCode, Object.assign(reply.getHeaders() as OutgoingHttpHeaders, safeHeaders(headers)));
  reply.hijack();
  // The pipeline's own body, not read by anyone else (an idempotency key's copy): written straight into the response.
  if (!(body instanceof StreamBody && body.writeTo(res))) {
    writeOpening(res, body.read());
    body.pipe(res);
  }
  body.once('error', (err) => {
    reply.log.warn({ err }, 'stream answer failed after it started');
    res.destroy();
  });
  res.once('close', () => {
    if (!body.destroyed) body.destroy();
  });
  // The client left before this listener was there (its 'close' has fired): the body goes now, as it would have then.
  if (res.destroyed && !body.destroyed) body.destroy();
  // Destroyed before its end without an error (a client that stopped reading: pipeline's client-stalled): pipe()
  // only unpipes (writeTo only stops), which would leave the connection and its unread megabytes open for as long as
  // the client keeps it.
  body.once('close', () => {
    if (!res.writableEnded) res.destroy();
  });
  return reply;
}

/** Forgets every header an answer had set (in fastify and on the raw response), keeping the request id. */
export function clearHeaders(request: FastifyRequest, reply: FastifyReply): void {
  for (const name of Object.keys(reply.getHeaders())) reply.removeHeader(name);
  for (const name of reply.raw.getHeaderNames()) reply.raw.removeHeader(name);
  reply.header('x-stormgate-request-id', request.id);
}
