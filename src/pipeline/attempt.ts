// One upstream attempt: send, time it, and report the outcome. For a stream the attempt ends at the first
// output-bearing event (or its failure); what follows is the LiveStream's job. Timers run on this attempt's own
// RequestAbort, linked to the request's signal (client gone or deadline).
import type { ProviderClient } from '../providers/provider-client.ts';
import type { AttemptOutcome } from '../policy/outcome.ts';
import { parseWaitHint, retryInfoHint } from '../policy/wait-hint.ts';
import { AnswerCut, cutOutcome, transportOutcome } from '../providers/transport-errors.ts';
import type { ApiKind } from '../routing/router.ts';
import { SseEventTooLarge, SseParser, type SseEvent } from '../streaming/sse-parser.ts';
import { eventMeaning, startsAnswer, upstreamErrorIn, upstreamErrorOf, type StreamShape, type UpstreamStreamError } from '../streaming/stream-events.ts';
import { accountStatusOfError, CONTENT_POLICY_CODES, CONTEXT_LENGTH_CODES, isContextLengthMessage, namesError, REQUEST_FAULT_CODES } from '../policy/outcome.ts';
import { AttemptTimeout, ClientGone, DeadlineReached, GatewayShutdown } from './abort-reasons.ts';
import { afterFinishWaitMs, LiveStream, translatedAfterOutput } from './live-stream.ts';
import { requestWhole } from '../providers/whole-answer.ts';
import { failedResponse, notAnAnswer } from '../providers/answer-shape.ts';
import { MAX_ERROR_BODY_BYTES, readCapped } from '../providers/read-capped.ts';
import { decodedStream, decodedWhole, encodingOf } from '../providers/content-decoding.ts';
import { bodyChunks } from '../providers/body-chunks.ts';
import { withoutKey } from '../providers/key-echo.ts';
import type { ResponseTranslator, StreamTranslator } from '../providers/families.ts';
import { asAbortSignal, RequestAbort, type RequestSignal } from './request-abort.ts';
import type { EarlyStart } from './early-start.ts';
import { printable } from '../http/request-body.ts';
import { withoutBom } from '../http/byte-order-mark.ts';
import { stringOrNull, upstreamErrorFields } from '../errors.ts';

type HeaderBag = Record<string, string | string[] | undefined>;

export interface AttemptRequest {
  client: ProviderClient;
  api: ApiKind;
  path: string;
  headers: Record<string, string>;
  body: Buffer | string;
  stream: boolean;
  shape: StreamShape;
  /** Turns another family's answers (Anthropic) into the OpenAI shape; undefined for OpenAI-compatible targets. */
  translator: ResponseTranslator | undefined;
  /** Reads a family's own error answers in OpenAI terms for their classification (UpstreamRequest.errorMeaning). */
  errorMeaning?: ((status: number, body: Buffer) => { status: number; body: Buffer }) | undefined;
  /** The error answer a family's error event before the first output stands for (UpstreamRequest.errorEventMeaning). */
  errorEventMeaning?: ((data: Buffer) => { status: number; body: Buffer } | undefined) | undefined;
  /** Aborted with ClientGone or DeadlineReached. */
  requestSignal: RequestSignal;
  /** For a stream whose deadline is the client's: lets the deadline start the answer before its first output. */
  earlyStart?: EarlyStart;
  now: () => number;
}

export interface AttemptResult {
  outcome: AttemptOutcome;
  status?: number;
  headers?: HeaderBag;
  /** The whole body of a finished answer, or (capped) of an error. */
  body?: Buffer;
  /** For a stream that produced its first output. */
  stream?: LiveStream;
  /** A stream whose answer the client's deadline started before its first output (early-start.ts). */
  startedEarly?: true;
}

/**
 * A whole answer is held in memory before it is passed on (it may be a failure to retry). The largest real ones are
 * embeddings of big batches (tens of MB); past this a provider is broken, not answering, and must not exhaust memory.
 */
const MAX_ANSWER_BYTES = 128 * 1024 * 1024;

export async function runAttempt(req: AttemptRequest): Promise<AttemptResult> {
  if (req.requestSignal.aborted) return { outcome: abortOutcome(req.requestSignal.reason) };
  const { firstTokenMs, responseMs, idleMs } = req.client.config.timeouts;
  const limitMs = req.stream ? firstTokenMs : responseMs;
  // Without a timer of its own (a non-streaming request without responseMs), the attempt runs on the request's
  // signal: one controller less per request on the hot path.
  const own = limitMs === undefined ? undefined : new RequestAbort();
  const signal = own?.signal ?? req.requestSignal;
  const forward = () => own!.abort(req.requestSignal.reason);
  let timer: NodeJS.Timeout | undefined;
  if (own) {
    req.requestSignal.addEventListener('abort', forward, { once: true });
    timer = setTimeout(() => own.abort(new AttemptTimeout(req.stream ? 'first-token' : 'response', limitMs!)), limitMs);
  }
  const release = () => {
    clearTimeout(timer);
    if (own) req.requestSignal.removeEventListener('abort', forward);
  };
  let handedOff = false;
  try {
    if (!req.stream) {
      const answer = await requestWhole(req.client.dispatcher, { path: req.path, method: 'POST', headers: req.headers, body: req.body, signal, maxBytes: bodyCap });
      const encoding = encodingOf(answer.headers);
      if (encoding === undefined || !answer.whole) return wholeResult(req, answer.statusCode, answer.headers, answer.body, answer.whole);
      const decoded = await decodedWhole(answer.body, encoding, bodyCap(answer.statusCode));
      if (!decoded) return { outcome: { kind: 'bad-stream', detail: `the answer is not valid ${encoding} data`, ran: false }, status: answer.statusCode, headers: answer.headers };
      return wholeResult(req, answer.statusCode, answer.headers, decoded.bytes, decoded.whole);
    }
    const res = await req.client.dispatcher.request({ path: req.path, method: 'POST', headers: req.headers, body: req.body, signal: asAbortSignal(signal) });
    const { headers } = res;
    const status = res.statusCode;
    const encoding = encodingOf(headers);
    const body = encoding === undefined ? res.body : decodedStream(res.body, encoding);
    // An error, or an answer that is not a stream after all: read whole (within its cap) and judged like any other.
    if (status < 200 || status >= 300 || !isEventStream(headers)) {
      const { bytes, whole } = await readCapped(body as AsyncIterable<Buffer> & { destroy(): void }, bodyCap(status));
      return wholeResult(req, status, headers, bytes, whole);
    }
    const translate = req.translator?.stream();
    const first = await readUntilFirstOutput(req.api, req.shape, bodyChunks(body, signal), translate, req.earlyStart).catch((err: unknown) => brokenBeforeOutput(err, signal));
    if ('failure' in first) {
      body.destroy();
      return failureResult(req, first, status, headers);
    }
    handedOff = true;
    // The first token is here: from now on the stream's idle timer bounds it, not the first-token timer.
    clearTimeout(timer);
    const stream = new LiveStream({
      api: req.api,
      shape: req.shape,
      head: first.head,
      pending: first.pending,
      parser: first.parser,
      iterator: first.iterator,
      pendingRead: first.pendingRead,
      translate,
      controller: own!,
      requestSignal: req.requestSignal,
      detach: release,
      idleMs,
      // A background response starts at its response.created: its silent thinking after it is firstTokenMs's to bound.
      ...(req.shape.background && { beforeOutputIdleMs: firstTokenMs }),
      afterFinishMs: afterFinishWaitMs(req.client.config.family, idleMs),
      apiKey: req.client.config.apiKey,
    });
    return { outcome: { kind: 'ok', status }, status, headers, stream, ...(first.pendingRead && { startedEarly: true }) };
  } catch (err) {
    if (signal.aborted) return { outcome: abortOutcome(signal.reason) };
    if (err instanceof AnswerCut) return { outcome: cutOutcome(err.cause, 'the answer was cut before its end') };
    return { outcome: transportOutcome(err) };
  } finally {
    // Every path above has read the body to its end or destroyed it, so the connection is already free.
    if (!handedOff) release();
  }
}

/** Errors are read for their code (and passed on) up to MAX_ERROR_BODY_BYTES; answers whole, up to MAX_ANSWER_BYTES. */
function bodyCap(status: number): number {
  return status >= 200 && status < 300 ? MAX_ANSWER_BYTES : MAX_ERROR_BODY_BYTES;
}

/**
 * What a whole answer means: an HTTP error (classified by its code from its first bytes), or an answer, unless it is
 * not one. `whole` is false for an answer cut at its cap.
 */
function wholeResult(req: AttemptRequest, statusCode: number, headers: HeaderBag, received: Buffer, whole: boolean): AttemptResult {
  if (statusCode < 200 || statusCode >= 300) {
    // A byte order mark before the JSON is dropped here, once: the client's JSON.parse would refuse it as the gateway's does.
    const error = withoutKey(withoutBom(received), req.client.config.apiKey);
    if (req.errorMeaning) {
      // The client gets the family's own error; the status and code it stands for decide the retry.
      const meaning = req.errorMeaning(statusCode, error);
      return { outcome: httpOutcome(meaning.status, headers, meaning.body, req.now()), status: statusCode, headers, body: error };
    }
    const { status, body } = req.translator ? req.translator.error(statusCode, error) : { status: statusCode, body: error };
    return { outcome: httpOutcome(status, headers, body, req.now()), status, headers, body };
  }
  const status = statusCode;
  if (!whole) return { outcome: { kind: 'bad-stream', detail: `the answer is larger than ${MAX_ANSWER_BYTES / 1024 / 1024} MB`, ran: true }, status, headers };
  // A 2xx that is not the answer is a failed attempt, retried and failed over like a 5xx (providers/answer-shape.ts).
  // The reason quotes the content-type, and reaches the client's error: a server that echoes the key it was sent
  // there must not hand it on, as it must not in the headers passed on.
  const contentType = contentTypeOf(headers);
  // The same for an answer, which is JSON on the APIs the gateway knows; a path it does not know may answer bytes
  // that are not text at all (audio), passed on as they came unless they say they are JSON.
  const raw = req.api !== 'other' || contentType?.includes('json') ? withoutBom(received) : received;
  const quoted = contentType === undefined ? undefined : withoutKey(contentType, req.client.config.apiKey);
  const framed = headers['content-length'] !== undefined || headers['transfer-encoding'] !== undefined;
  const wrong = notAnAnswer({ api: req.api, stream: req.stream, contentType: quoted, ownFamily: req.translator === undefined, framed }, raw);
  if (wrong !== undefined) {
    // An error object with a 200 that names the gateway's own account is the 429, 402, 401 or 403 it stands for.
    const account = wrong.ran ? undefined : accountErrorOf(raw);
    if (account) return accountResult(account, headers);
    return { outcome: { kind: 'bad-stream', detail: wrong.detail, ran: wrong.ran }, status, headers };
  }
  // A Response whose status is failed is judged as its stream's response.failed before any output would be: retried
  // (or the 400, or the credentials path, that its error code stands for), never handed on as an answer.
  const failed = req.translator ? undefined : failedResponse(req.api, raw);
  if (failed) return failureResult(req, errorVerdict(upstreamErrorIn(failed), 'the response failed'), status, headers);
  const body = req.translator ? translateBody(req.translator, raw) : raw;
  if (body === undefined) {
    // Another family's error object with a 200 (Anthropic's {"type":"error"}), read in OpenAI terms as above.
    const account = accountErrorOf(req.translator!.error(statusCode, raw).body);
    if (account) return accountResult(account, headers);
    return { outcome: { kind: 'bad-stream', detail: 'the answer could not be translated', ran: false }, status, headers };
  }
  return { outcome: { kind: 'ok', status }, status, headers, body };
}

/** The attempt's result for an upstream error reported inside a 2xx (errorVerdict). */
function failureResult(req: AttemptRequest, verdict: ErrorVerdict, status: number, headers: HeaderBag): AttemptResult {
  // One that rejects the request itself (a content policy, the context length): the upstream's verdict, passed on as
  // the 400 it would have been, never retried nor routed around.
  if (verdict.rejection) return { outcome: verdict.outcome!, status: 400, headers, body: withoutKey(verdict.rejection, req.client.config.apiKey) };
  // A family's own error event that stands for an error answer (Anthropic's overload in a 200 stream is its 529): that
  // answer, judged as it would have been with its status, and passed on (once retries are over) as the family sent it.
  const meaning = verdict.outcome === undefined && verdict.event !== undefined ? req.errorEventMeaning?.(verdict.event) : undefined;
  if (meaning) {
    const outcome: AttemptOutcome = { kind: 'http', status: meaning.status, errorCode: errorCodeOf(meaning.status, meaning.body), hint: undefined };
    return { outcome, status: meaning.status, headers, body: withoutKey(verdict.event!, req.client.config.apiKey) };
  }
  // One that stands for a status (the gateway's account) is logged with that status, as it would have come.
  const failedStatus = verdict.outcome?.kind === 'http' ? verdict.outcome.status : status;
  return { outcome: verdict.outcome ?? { kind: 'bad-stream', detail: verdict.failure, ran: true }, status: failedStatus, headers };
}

function accountResult(account: { status: number; code: string }, headers: HeaderBag): AttemptResult {
  return { outcome: { kind: 'http', status: account.status, errorCode: account.code, hint: undefined }, status: account.status, headers };
}

export function abortOutcome(reason: unknown): AttemptOutcome {
  if (reason instanceof AttemptTimeout) return { kind: 'timeout', phase: reason.phase };
  if (reason instanceof DeadlineReached) return { kind: 'aborted', by: 'deadline' };
  if (reason instanceof ClientGone) return { kind: 'aborted', by: 'client' };
  if (reason instanceof GatewayShutdown) return { kind: 'aborted', by: 'shutdown' };
  return { kind: 'aborted', by: 'client' };
}

function httpOutcome(status: number, headers: HeaderBag, body: Buffer, nowMs: number): AttemptOutcome {
  return { kind: 'http', status, errorCode: errorCodeOf(status, body), hint: parseWaitHint(headers, nowMs) ?? retryInfoHint(errorFieldsOf(body)) };
}

/**
 * The `error.code` of an OpenAI error body (or `error.type` of an Anthropic one): the classification needs it. Some
 * compatible servers send the status as a number there (`"code": 429`) and the name in `type` (`insufficient_quota`):
 * the name is what the classification knows, so a code that is not a name gives way to a type that is, and is read
 * as its digits only when there is none (as the client is given it, errors.ts). A 4xx without a named code whose
 * message says the prompt is over the model's window (vLLM, SGLang, OpenRouter, ...) is `context_length_exceeded`,
 * which is what sends it to the route's contextWindowFallback.
 */
function errorCodeOf(status: number, body: Buffer): string | null {
  // wholeResult has already dropped a byte order mark.
  const error = errorFieldsOf(body);
  if (error === undefined) return null;
  const { code, type, message } = error;
  if (typeof code === 'string' && namesError(code, type)) return code;
  if (status >= 400 && status < 500 && typeof message === 'string' && isContextLengthMessage(message)) return 'context_length_exceeded';
  return typeof type === 'string' ? type : stringOrNull(code);
}

/** The status and code of an OpenAI-shaped error body that names the gateway's own account, if it is one. */
function accountErrorOf(body: Buffer): { status: number; code: string } | undefined {
  const error = errorFieldsOf(body);
  const code = typeof error?.code === 'string' ? error.code : undefined;
  const type = typeof error?.type === 'string' ? error.type : undefined;
  const status = accountStatusOfError(code, type);
  return status === undefined ? undefined : { status, code: (code ?? type)! };
}

/**
 * The `error` object of an OpenAI-shaped body, when the body is JSON and has one (also inside the one-element list
 * Gemini's OpenAI-compatible endpoint answers, `[{"error": {...}}]`); or the body itself in the flat shape vLLM
 * (before 0.8) and Mistral answer with, `{"object": "error", "message", "type", "code"}`.
 */
function errorFieldsOf(body: Buffer): { code?: unknown; type?: unknown; message?: unknown } | undefined {
  if (body.length === 0) return undefined;
  try {
    return upstreamErrorFields(JSON.parse(body.toString('utf8')));
  } catch {
    return undefined;
  }
}

/** Another family's events, as OpenAI events; throws on a malformed one (the caller treats it as such). */
export function translateEvents(events: SseEvent[], translate: StreamTranslator | undefined): SseEvent[] {
  if (!translate) return events;
  const out: SseEvent[] = [];
  for (const ev of events) out.push(...translate.push(ev));
  return out;
}

function translateBody(translator: ResponseTranslator, raw: Buffer): Buffer | undefined {
  try {
    return translator.body(raw);
  } catch {
    return undefined;
  }
}

/** The answer's content-type in lower case: media types are case-insensitive (RFC 9110 8.3.1), `Application/JSON` is JSON. */
function contentTypeOf(headers: HeaderBag): string | undefined {
  const ct = headers['content-type'];
  return (Array.isArray(ct) ? ct[0] : ct)?.toLowerCase();
}

function isEventStream(headers: HeaderBag): boolean {
  return contentTypeOf(headers)?.startsWith('text/event-stream') ?? false;
}

type FirstOutput =
  /** pendingRead: the answer was started early (early-start.ts) while this read was in flight; the LiveStream takes it. */
  | { head: string; pending: SseEvent[]; parser: SseParser; iterator: AsyncIterator<Buffer>; pendingRead?: Promise<IteratorResult<Buffer>> }
  | ErrorVerdict;

/**
 * The provider had begun a 2xx stream when its connection broke (a cut a moment after the first token loses that
 * token with the socket): a stream broken before its output, which may have run, not a provider out of reach.
 */
function brokenBeforeOutput(err: unknown, signal: RequestSignal): FirstOutput {
  const outcome = signal.aborted ? abortOutcome(signal.reason) : cutOutcome(err, 'the stream broke before its first output');
  return { failure: outcome.kind === 'bad-stream' ? outcome.detail : outcome.kind, outcome };
}

/**
 * Reads events until one carries output; everything before it (role chunk, pings) is kept to forward in order.
 * Events are translated one at a time: once output has come, an event the translator cannot read is judged by the
 * LiveStream as any malformed one, even when it arrived in the same read; only before any output does it fail the attempt.
 */
async function readUntilFirstOutput(api: ApiKind, shape: StreamShape, iterator: AsyncIterator<Buffer>, translate: StreamTranslator | undefined, early: EarlyStart | undefined): Promise<FirstOutput> {
  const parser = new SseParser();
  let taken = false;
  let withdraw: (() => void) | undefined;
  const started =
    early &&
    new Promise<'start'>((resolve) => {
      withdraw = early.offer(() => {
        taken = true;
        resolve('start');
      });
    });
  try {
    const first = await readEvents(api, shape, parser, iterator, translate, started);
    // The deadline came just as the read that failed the attempt did: it took the early start instead of aborting the
    // request, so the attempt ends as the deadline's (no retry goes past it) rather than as a retryable failure.
    return taken && 'failure' in first ? DEADLINE_PASSED : first;
  } catch (err) {
    if (taken) return DEADLINE_PASSED;
    throw err;
  } finally {
    withdraw?.();
  }
}

const DEADLINE_PASSED: FirstOutput = { failure: 'the deadline passed', outcome: { kind: 'aborted', by: 'deadline' } };

async function readEvents(api: ApiKind, shape: StreamShape, parser: SseParser, iterator: AsyncIterator<Buffer>, translate: StreamTranslator | undefined, started: Promise<'start'> | undefined): Promise<FirstOutput> {
  let head = '';
  for (;;) {
    const read = iterator.next();
    const next = started ? await Promise.race([read, started]) : await read;
    if (next === 'start') return { head, pending: [], parser, iterator, pendingRead: read };
    const { value, done } = next;
    if (done) return { failure: 'stream ended before any output' };
    let raw: SseEvent[];
    try {
      raw = parser.push(value);
    } catch (err) {
      if (err instanceof SseEventTooLarge) return { failure: err.message };
      throw err;
    }
    for (let r = 0; r < raw.length; r++) {
      let events: SseEvent[];
      try {
        events = translateEvents([raw[r]!], translate);
      } catch {
        return { failure: 'malformed event before any output' };
      }
      for (let i = 0; i < events.length; i++) {
        const ev = events[i]!;
        const meaning = eventMeaning(api, ev);
        if (meaning === 'malformed') return { failure: 'malformed event before any output' };
        if (meaning === 'error') return errorBeforeOutput(ev);
        if (meaning === 'done') return { failure: 'stream ended before any output' };
        if (meaning === 'output' || meaning === 'finish' || startsAnswer(api, shape, ev)) {
          // The first output event itself is re-read by the LiveStream, which tracks finish and [DONE].
          return { head, pending: [...events.slice(i), ...translatedAfterOutput(raw.slice(r + 1), translate)], parser, iterator };
        }
        head += `${ev.raw}\n\n`;
      }
    }
  }
}

/**
 * An error event before any output: a broken stream, retried, unless its code says the request itself is at fault
 * (a content policy, the context length, an input the provider cannot use). Retrying that reruns a safety decision
 * and loses the provider's reason; it is answered as the upstream's 400 instead. One that names the gateway's own
 * account is the 429, 402, 401 or 403 it stands for (policy/outcome.ts accountStatusOfError).
 */
function errorBeforeOutput(ev: SseEvent): FirstOutput {
  const verdict = errorVerdict(upstreamErrorOf(ev), 'error event before any output');
  return ev.data === null ? verdict : { ...verdict, event: Buffer.from(ev.data) };
}

/**
 * An attempt that failed before its first output. outcome: when it is not the broken stream `failure` describes (an
 * abort, a timeout, the status an error stands for); rejection: the upstream's 400 body, for an error that blames the
 * request; event: the data of the upstream's error event, for a family that reads its own (errorEventMeaning).
 */
type ErrorVerdict = { failure: string; outcome?: AttemptOutcome; rejection?: Buffer; event?: Buffer };

/** What an upstream error reported inside a 2xx means (see errorBeforeOutput); `what` names where it came. */
function errorVerdict(err: UpstreamStreamError | undefined, what: string): ErrorVerdict {
  const code = err?.code;
  // The code says what went wrong (Anthropic's `overloaded_error`, OpenAI's `server_error`), where the client would
  // otherwise read only that the stream broke; it is the provider's word, so it goes printable and short.
  const failure = code === undefined ? what : `${what}: ${printable(code, 64)}`;
  // The gateway's own account (no quota, a refused key): the credentials row decides, never a retry on this target.
  const account = accountStatusOfError(code, err?.type);
  if (account !== undefined) return { failure, outcome: { kind: 'http', status: account, errorCode: code ?? err?.type ?? null, hint: undefined } };
  // Without a named code (none, the status as digits, the type again), an over-long prompt is told by its words, as in a whole error.
  const named = code !== undefined && namesError(code, err?.type) ? code : err?.message !== undefined && isContextLengthMessage(err.message) ? 'context_length_exceeded' : code;
  if (named === undefined || !(CONTENT_POLICY_CODES.has(named) || CONTEXT_LENGTH_CODES.has(named) || REQUEST_FAULT_CODES.has(named))) return { failure };
  const error = { message: err!.message ?? named, type: err!.type ?? 'invalid_request_error', param: err!.param, code: code ?? null };
  return { failure, outcome: { kind: 'http', status: 400, errorCode: named, hint: undefined }, rejection: Buffer.from(JSON.stringify({ error })) };
}
