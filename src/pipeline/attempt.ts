// One upstream attempt: send, time it, and report the outcome. For a stream the attempt ends at the first
// output-bearing event (or its failure); what follows is the LiveStream's job. Timers run on this attempt's own
// RequestAbort, linked to the request's signal (client gone or deadline).
import type { Dispatcher } from 'undici';
import type { ProviderClient } from '../providers/provider-client.ts';
import type { AttemptOutcome } from '../policy/outcome.ts';
import { AnswerCut, cutOutcome, transportOutcome } from '../providers/transport-errors.ts';
import type { ApiKind } from '../routing/router.ts';
import { upstreamErrorIn, upstreamErrorInText, type StreamShape } from '../streaming/stream-events.ts';
import { abortOutcome, AttemptTimeout } from './abort-reasons.ts';
import { afterFinishWaitMs, LiveStream } from './live-stream.ts';
import { brokenBeforeOutput, readUntilFirstOutput } from './first-output.ts';
import { accountErrorOf, errorCodeOf, errorVerdict, httpOutcome, isQuotaRefusal, type ErrorVerdict } from '../providers/error-outcome.ts';
import { requestWhole } from '../providers/whole-answer.ts';
import { failedResponse, notAnAnswer } from '../providers/answer-shape.ts';
import { MAX_ERROR_BODY_BYTES, readCapped } from '../providers/read-capped.ts';
import { decodedPrefix, decodedStream, decodedWhole, encodingOf } from '../providers/content-decoding.ts';
import { bodyChunks } from '../providers/body-chunks.ts';
import { withoutKey } from '../providers/key-echo.ts';
import type { ResponseTranslator, StreamTranslator } from '../providers/families.ts';
import { asAbortSignal, RequestAbort, type RequestSignal } from './request-abort.ts';
import type { EarlyStart } from './early-start.ts';
import { withoutBom } from '../http/byte-order-mark.ts';
import { firstHeader, type HeaderBag } from '../header-bag.ts';

interface AttemptRequest {
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
  /** Takes out of a stream's events the usage the gateway asked for and the client did not (UpstreamRequest.hideUsage). */
  hideUsage?: (() => StreamTranslator) | undefined;
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
      const answer = await requestWhole(req.client.dispatcher, { path: req.path, method: 'POST', headers: req.headers, body: req.body, signal, maxBytes: bodyCap, errorGapMs: idleMs });
      const encoding = encodingOf(answer.headers);
      // An answer cut at its cap is judged by its size alone.
      if (encoding === undefined || (!answer.whole && answer.statusCode < 300)) return wholeResult(req, answer.statusCode, answer.headers, answer.body, answer.whole);
      const decoded = answer.whole ? await decodedWhole(answer.body, encoding, bodyCap(answer.statusCode)) : undefined;
      if (answer.whole && !decoded) return { outcome: { kind: 'bad-stream', detail: `the answer is not valid ${encoding} data`, ran: false }, status: answer.statusCode, headers: answer.headers };
      // An error cut short (at its cap, on the wire, or decoding past its cap though its compressed bytes were under
      // it) is read for what of it decodes up to the cap, as a stream request's is: its compressed bytes, read as text,
      // were the client's error message, and an error decoding past the cap was none at all.
      if (!decoded?.whole && (answer.statusCode < 200 || answer.statusCode >= 300)) return wholeResult(req, answer.statusCode, answer.headers, (await decodedPrefix(answer.body, encoding, MAX_ERROR_BODY_BYTES)) ?? Buffer.alloc(0), false);
      return wholeResult(req, answer.statusCode, answer.headers, decoded!.bytes, decoded!.whole);
    }
    const res = await untilAborted(req.client.dispatcher.request({ path: req.path, method: 'POST', headers: req.headers, body: req.body, signal: asAbortSignal(signal) }), signal);
    const { headers } = res;
    const status = res.statusCode;
    const encoding = encodingOf(headers);
    const body = encoding === undefined ? res.body : decodedStream(res.body, encoding);
    // An error, or an answer that is not a stream after all: read whole (within its cap) and judged like any other;
    // an error by its status and headers, with as much of its body as came before a break or an idleMs silence (read-capped.ts).
    if (status < 200 || status >= 300 || !isEventStream(headers)) {
      const { bytes, whole } = await readCapped(body as AsyncIterable<Buffer> & { destroy(err?: Error): void }, bodyCap(status), () => status >= 300 && !signal.aborted, status >= 300 ? idleMs : undefined);
      return wholeResult(req, status, headers, bytes, whole);
    }
    // Another family's events translated, or an OpenAI-family stream's usage that only the gateway asked for taken out.
    const translate = req.translator?.stream() ?? req.hideUsage?.();
    const first = await readUntilFirstOutput(req.api, req.shape, bodyChunks(body, signal), translate, req.earlyStart, req.client.config.apiKey).catch((err: unknown) => brokenBeforeOutput(err, signal));
    if ('failure' in first) {
      body.destroy();
      return failureResult(req, first, status, headers);
    }
    handedOff = true;
    // Handed over before its first output (started early at the client's deadline, or a background or conversation
    // response at its response.created), the stream's silence until that output is the first-token timer's, as it was
    // until now: pings do not put it back. Otherwise the first token is here: from now on the stream's idle timer bounds it.
    const beforeOutput = first.pendingRead !== undefined || req.shape.startsAtCreated !== undefined;
    if (!beforeOutput) clearTimeout(timer);
    else if (first.pendingRead === undefined) {
      // Such a response's answer starts at its response.created: its silence until its first output (a model
      // thinking, a job queued) may last firstTokenMs from there, or idleMs when that is longer, as any started stream's.
      clearTimeout(timer);
      const quietMs = Math.max(firstTokenMs, idleMs);
      timer = setTimeout(() => own!.abort(new AttemptTimeout('first-token', quietMs)), quietMs);
    }
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
      ...(beforeOutput && { firstTokenTimer: timer! }),
      afterFinishMs: afterFinishWaitMs(req.client.config.family, idleMs),
      apiKey: req.client.config.apiKey,
      errorEventMeaning: req.errorEventMeaning,
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

/**
 * A stream's request, given up as soon as its signal aborts. undici's request() hears its signal only once the request
 * has a connection: a stream whose connection was still being made (a provider slow to accept, or not accepting at all)
 * waited out the whole connect timeout past its first-token timer and its deadline, and its client, told nothing by
 * the deadline, gave up on its own and retried. requestWhole settles at the abort the same way.
 */
function untilAborted(sent: Promise<Dispatcher.ResponseData>, signal: RequestSignal): Promise<Dispatcher.ResponseData> {
  return new Promise((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
    sent.then(
      (res) => {
        signal.removeEventListener('abort', onAbort);
        // An answer that comes after the abort is nobody's: its connection goes.
        if (signal.aborted) res.body.destroy();
        else resolve(res);
      },
      (err: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(err);
      },
    );
  });
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
  // llhttp reads any three digits as a status; HTTP has 100 to 599 (RFC 9110 15). One past them (LinkedIn's 999, a
  // broken proxy's 600), passed on as the upstream's status, is one the gateway cannot write: it answered 500.
  if (statusCode > 599) return { outcome: { kind: 'bad-stream', detail: `the answer's status ${statusCode} is no HTTP status`, ran: true }, status: statusCode, headers };
  if (statusCode < 200 || statusCode >= 300) {
    // A byte order mark before the JSON is dropped here, once: the client's JSON.parse would refuse it as the gateway's does.
    const error = withoutKey(withoutBom(received), req.client.config.apiKey);
    // A gateway in front of the provider refusing in its own words (APIM's spent quota) is no family's error: read as
    // it came. Translated first, it was "the Anthropic target answered HTTP 403", the gateway's credentials refused.
    if (isQuotaRefusal(statusCode, headers, error, req.now())) return { outcome: httpOutcome(statusCode, headers, error, req.now()), status: statusCode, headers, body: error };
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
  const wrong = notAnAnswer({ api: req.api, stream: req.stream, contentType: quoted, ownFamily: req.translator === undefined }, raw);
  if (wrong !== undefined) {
    // An error object with a 200 that names the gateway's own account is the 429, 402, 401 or 403 it stands for.
    const account = wrong.ran ? undefined : accountErrorOf(raw);
    if (account) return accountResult(account, headers);
    const meant = wrong.ran ? undefined : familyErrorIn200(req, raw, headers) ?? rateLimitIn200(req, raw, status, headers);
    if (meant) return meant;
    return { outcome: { kind: 'bad-stream', detail: wrong.detail, ran: wrong.ran }, status, headers };
  }
  // A Response whose status is failed is judged as its stream's response.failed before any output would be: retried
  // (or the 400, or the credentials path, that its error code stands for), never handed on as an answer.
  const failed = req.translator ? undefined : failedResponse(req.api, raw);
  if (failed) return createdResponse(failureResult(req, errorVerdict(upstreamErrorIn(failed), 'the response failed', req.client.config.apiKey), status, headers));
  const body = req.translator ? translateBody(req.translator, raw) : raw;
  if (body === undefined) {
    // Another family's error object with a 200 (Anthropic's {"type":"error"}), read in OpenAI terms as above.
    const account = accountErrorOf(req.translator!.error(statusCode, raw).body);
    if (account) return accountResult(account, headers);
    return familyErrorIn200(req, raw, headers) ?? { outcome: { kind: 'bad-stream', detail: 'the answer could not be translated', ran: false }, status, headers };
  }
  return { outcome: { kind: 'ok', status }, status, headers, body };
}

/**
 * A failed Response's result: the status it stands for (a rate limit's 429) is one the provider answered after it had
 * created the Response, which a request that commits on send is not sent again after (policy/outcome.ts maySendAgain).
 */
function createdResponse(result: AttemptResult): AttemptResult {
  return result.outcome.kind === 'http' ? { ...result, outcome: { ...result.outcome, created: true } } : result;
}

/** The attempt's result for an upstream error reported inside a 2xx (errorVerdict). */
function failureResult(req: AttemptRequest, verdict: ErrorVerdict, status: number, headers: HeaderBag): AttemptResult {
  // One that rejects the request itself (a content policy, the context length): the upstream's verdict, passed on as
  // the 400 it would have been, never retried nor routed around. A rate limit: the 429 it would have been.
  if (verdict.answer && verdict.outcome?.kind === 'http') return { outcome: verdict.outcome, status: verdict.outcome.status, headers, body: withoutKey(verdict.answer, req.client.config.apiKey) };
  // A family's own error event that stands for an error answer (Anthropic's overload in a 200 stream is its 529): that
  // answer, judged as it would have been with its status, and passed on (once retries are over) as the family sent it,
  // or, to a client of another API the request was translated from, in that API's shape.
  const meaning = verdict.outcome === undefined && verdict.event !== undefined ? req.errorEventMeaning?.(verdict.event) : undefined;
  if (meaning) {
    const outcome: AttemptOutcome = { kind: 'http', status: meaning.status, errorCode: errorCodeOf(meaning.status, meaning.body), hint: undefined };
    return { outcome, status: meaning.status, headers, body: withoutKey(req.translator ? meaning.body : verdict.event!, req.client.config.apiKey) };
  }
  // One that stands for a status (the gateway's account) is logged with that status, as it would have come.
  const failedStatus = verdict.outcome?.kind === 'http' ? verdict.outcome.status : status;
  return { outcome: verdict.outcome ?? { kind: 'bad-stream', detail: verdict.failure, ran: true }, status: failedStatus, headers };
}

/**
 * A family's own error object answered with a 200 (a relay in front of Anthropic that puts its errors in a 200 body):
 * the error answer its type stands for, as the same object in an error event before a stream's first output is
 * (`overloaded_error` a 529, ...). Read as a body that is not an answer, an overload reached the client as a 502.
 */
function familyErrorIn200(req: AttemptRequest, raw: Buffer, headers: HeaderBag): AttemptResult | undefined {
  const meaning = req.errorEventMeaning?.(raw);
  if (!meaning) return undefined;
  const outcome: AttemptOutcome = { kind: 'http', status: meaning.status, errorCode: errorCodeOf(meaning.status, meaning.body), hint: undefined };
  return { outcome, status: meaning.status, headers, body: withoutKey(req.translator ? meaning.body : raw, req.client.config.apiKey) };
}

/**
 * A rate limit's error object answered with a 200 (OpenRouter's `{"error": {"message": "Provider returned error",
 * "code": 429, ...}}`, BerriAI/litellm#8448): the 429 it stands for, as the same error in a stream's first event is
 * (errorVerdict). Read as a body that is not an answer, each one counted as a breaker failure and the client was
 * answered 502. Other errors in a 200 stay what the README says: a failed attempt, retried and failed over.
 */
function rateLimitIn200(req: AttemptRequest, raw: Buffer, status: number, headers: HeaderBag): AttemptResult | undefined {
  const verdict = errorVerdict(upstreamErrorInText(raw.toString('utf8')), 'an error in a 200 answer', req.client.config.apiKey);
  return verdict.outcome?.kind === 'http' && verdict.outcome.status === 429 ? failureResult(req, verdict, status, headers) : undefined;
}

function accountResult(account: { status: number; code: string }, headers: HeaderBag): AttemptResult {
  return { outcome: { kind: 'http', status: account.status, errorCode: account.code, hint: undefined }, status: account.status, headers };
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
  return firstHeader(headers, 'content-type')?.toLowerCase();
}

function isEventStream(headers: HeaderBag): boolean {
  return contentTypeOf(headers)?.startsWith('text/event-stream') ?? false;
}
