// What an upstream's error means for the attempt: the code, the wait hint and the account refusal read from an error
// body, or from an error reported inside a 2xx (an error event, a failed Response). Bytes and headers in, an outcome
// out: the attempt decides nothing here, the outcome table does.
import { ACCOUNT_429_CODES, accountStatusOfError, classify, CONTENT_POLICY_CODES, CONTEXT_LENGTH_CODES, isAccountSpentMessage, isContentRefusalMessage, isContextLengthMessage, isOverRateLimitMessage, namesError, OVER_RATE_LIMIT_CODE, RATE_LIMIT_CODES, REGION_REFUSED_CODE, REQUEST_FAULT_CODES, THREAD_STATE_CODES, type AttemptOutcome } from '../policy/outcome.ts';
import { MAX_WAIT_HINT_MS, parseWaitHint, retryInfoHint, tokenRoomHint, type WaitHint } from '../policy/wait-hint.ts';
import type { UpstreamStreamError } from '../streaming/stream-events.ts';
import { printable } from '../http/request-body.ts';
import { withoutKey } from './key-echo.ts';
import { stringOrNull, upstreamErrorFields } from '../errors.ts';
import { firstHeader, type HeaderBag } from '../header-bag.ts';

/** An HTTP error answer's outcome: its status, the code its body names, and the wait hint of its headers or body. */
export function httpOutcome(status: number, headers: HeaderBag, body: Buffer, nowMs: number): AttemptOutcome {
  const fields = errorFieldsOf(body);
  // Google refuses a key it does not know with a 400: read as the client's request, the provider's answer reached the
  // client, nothing failed over and the target was never held. It is the gateway's key, the 401 it stands for.
  if (status === 400 && isGoogleKeyRefusal(fields)) return { kind: 'http', status: 401, errorCode: 'invalid_api_key', hint: undefined };
  // Nor is a location Google does not serve the client's: the gateway's deployment (where it calls from), which every
  // request from it meets. The 403 OpenAI answers the same refusal with, under its code.
  if (status === 400 && isGoogleLocationRefusal(fields)) return { kind: 'http', status: 403, errorCode: REGION_REFUSED_CODE, hint: undefined };
  // OpenRouter's in-flight spending budget: the cost of the requests running now fills what the balance covers, and
  // its 402 says when to come back (retry-after). Read as a 402, the gateway's billing, it held the target for 60 s
  // fleet-wide and answered every client 502, though the next turn was seconds away: many concurrent agents are
  // exactly what fills it. It is the 429 it stands for, a limit on concurrent spend.
  if (status === 402 && isInFlightBudget(fields)) return httpOutcome(429, headers, body, nowMs);
  // Azure API Management's quota-by-key, in front of the provider, refuses a spent quota with a 403 and a Retry-After
  // for when it renews. Read as the gateway's credentials refused, the target was held 60 s at a time through the
  // whole quota period, probed again each time, and clients were told of a configuration problem with no wait. It is
  // the 429 of a limit whose end is known. Without the Retry-After its end is not known: the credentials path stays.
  if (isQuotaRefusal(status, headers, body, nowMs)) return httpOutcome(429, headers, body, nowMs);
  const errorCode = errorCodeOfFields(status, fields);
  // A request larger than the whole limit fits after no wait: its retry-after, a rate limit's habit, is no hint, and
  // passed on it invited the client to send it again then.
  if (errorCode === OVER_RATE_LIMIT_CODE) return { kind: 'http', status, errorCode, hint: undefined };
  // Only a rate limit's refusal waits for the token limits' reset: a 429 that names the account (insufficient_quota)
  // comes back after no reset, and its upstream_auth_error was told a retry-after from one.
  const rateLimited = classify({ kind: 'http', status, errorCode, hint: undefined }).cls === 'rate-limited';
  // Said before guessed: the provider's own hints, in its headers or its body's RetryInfo, come before the token reset.
  const hint = parseWaitHint(headers, nowMs) ?? retryInfoHint(fields) ?? relayedHint(fields, nowMs) ?? (rateLimited ? tokenRoomHint(headers, nowMs) : undefined);
  const param = status === 404 ? otherParamOf(fields) : undefined;
  const unknownUrl = status === 404 && param === undefined && isUnknownUrl(errorCode, fields);
  return { kind: 'http', status, errorCode, hint, ...(param !== undefined && { param }), ...(unknownUrl && { unknownUrl: true as const }), ...saidShouldRetry(headers) };
}

/**
 * The upstream's own `x-should-retry`, read as the OpenAI and Anthropic SDKs read it (openai-node's shouldRetry):
 * exactly `true` or `false`, else not said. Its meaning for the retry is the outcome table's (policy/outcome.ts classify).
 */
function saidShouldRetry(headers: HeaderBag): { shouldRetry?: boolean } {
  const said = firstHeader(headers, 'x-should-retry');
  return said === 'true' || said === 'false' ? { shouldRetry: said === 'true' } : {};
}

/**
 * Whether a 404 says the URL is not there, as a wrong `baseUrl` meets it on every request: OpenAI's "Invalid URL (POST
 * /v1/...)", Anthropic's and Azure's bare "Not Found" / "Resource not found", or no error object at all (a web
 * server's page, FastAPI's `{"detail": "Not Found"}`, Go's "404 page not found"). Counted as the client's bad request,
 * it read as clients sending bad ones, and the error-share alert stayed silent through the outage. Any other 404 names
 * something of the request (a model, a deployment, a conversation, a file): the client's.
 */
function isUnknownUrl(errorCode: string | null, error: ErrorFields | undefined): boolean {
  if (error === undefined || typeof error.message !== 'string') return true;
  if (errorCode !== null && /model|deployment/i.test(errorCode)) return false;
  return /^(?:invalid url\b|unknown url\b|cannot (?:get|post)\b|(?:resource |page )?not found\.?$)/i.test(error.message.trim());
}

/**
 * The wait a router relays in its error's metadata when no header of its own says it: OpenRouter's 429 puts the
 * limit's headers there (its `free-models-per-day`: `"metadata": {"headers": {"X-RateLimit-Remaining": "0",
 * "X-RateLimit-Reset": "<Unix ms>"}}`; a provider's limit behind it: `"retry_after_seconds": 17, "headers":
 * {"Retry-After": "17"}`), read as those headers would be (wait-hint.ts). Without it the attempts went back into the
 * limit at the backoff's pace, and a daily limit's client was told no wait. Like RetryInfo, this request's hint only:
 * the limit may be one provider's behind the router, which routes the next request elsewhere (no hold-off).
 */
function relayedHint(error: { metadata?: unknown } | undefined, nowMs: number): WaitHint | undefined {
  const metadata = error?.metadata as { headers?: unknown; retry_after_seconds?: unknown } | null | undefined;
  if (metadata === null || typeof metadata !== 'object') return undefined;
  const relayed = metadata.headers;
  if (relayed !== null && typeof relayed === 'object' && !Array.isArray(relayed)) {
    const bag: HeaderBag = {};
    for (const [name, value] of Object.entries(relayed as Record<string, unknown>)) {
      if (typeof value === 'string' || typeof value === 'number') bag[name.toLowerCase()] = String(value);
    }
    const fromHeaders = parseWaitHint(bag, nowMs);
    if (fromHeaders !== undefined) return { ...fromHeaders, fleetWide: false };
  }
  const seconds = metadata.retry_after_seconds;
  if (typeof seconds !== 'number' || !Number.isFinite(seconds) || seconds <= 0) return undefined;
  return { delayMs: Math.min(MAX_WAIT_HINT_MS, Math.ceil(seconds * 1000)), source: 'retry-after', fleetWide: false };
}

/**
 * The field a 404 names when it is not the model: the Responses API's `previous_response_id` it has not stored (or no
 * longer), an `input` item not kept under `store: false`. Such a 404 says the model exists; read as "no such model",
 * it gave a learned model's target key back, and that model's traffic went to `<provider>/other` for good.
 */
function otherParamOf(error: ErrorFields | undefined): string | undefined {
  const param = error?.param;
  return typeof param === 'string' && param !== '' && param !== 'model' ? param : undefined;
}

/**
 * The `error.code` of an OpenAI error body (or `error.type` of an Anthropic one): the classification needs it. Some
 * compatible servers send the status as a number there (`"code": 429`) and the name in `type` (`insufficient_quota`):
 * the name is what the classification knows, so a code that is not a name gives way to a type that is, and is read
 * as its digits only when there is none (as the client is given it, errors.ts). A 4xx without a named code whose
 * message says the prompt is over the model's window (vLLM, SGLang, OpenRouter, ...) is `context_length_exceeded`,
 * which is what sends it to the route's contextWindowFallback. A 429 (or 413) whose message says the request alone is
 * larger than the provider's token limit is OVER_RATE_LIMIT_CODE, whatever code it names: no retry can fit it. A 403
 * that flags the request's content (OpenRouter's moderation metadata, xAI's words) is `content_policy_violation`.
 */
export function errorCodeOf(status: number, body: Buffer): string | null {
  // The attempt (wholeResult) has already dropped a byte order mark.
  return errorCodeOfFields(status, errorFieldsOf(body));
}

function errorCodeOfFields(status: number, error: ErrorFields | undefined): string | null {
  if (error === undefined) return null;
  const { code, type, message } = error;
  if ((status === 429 || status === 413) && typeof message === 'string' && isOverRateLimitMessage(message)) return OVER_RATE_LIMIT_CODE;
  if (status === 403 && (isModerationFlag(error) || (typeof message === 'string' && isContentRefusalMessage(message)))) return 'content_policy_violation';
  if (status === 429 && typeof message === 'string' && isAccountSpentMessage(message)) return 'insufficient_quota';
  // Anthropic names what the SDK acts on in error.details.error_code, beside a generic type (not_found_error).
  const detailCode = typeof error.details === 'object' && error.details !== null ? (error.details as { error_code?: unknown }).error_code : undefined;
  if (typeof detailCode === 'string' && THREAD_STATE_CODES.has(detailCode)) return detailCode;
  // A spent account told by its type beside a finer code (OpenAI's 429 `credit_balance_exhausted`, type
  // insufficient_quota): the type is what the classification knows. Read by the code, it was a rate limit, retried
  // and held off as one, where no wait brings the credit back.
  if (status === 429 && typeof type === 'string' && ACCOUNT_429_CODES.has(type) && !(typeof code === 'string' && ACCOUNT_429_CODES.has(code))) return type;
  if (typeof code === 'string' && namesError(code, type)) return code;
  if (status >= 400 && status < 500 && typeof message === 'string' && isContextLengthMessage(message)) return 'context_length_exceeded';
  return typeof type === 'string' ? type : stringOrNull(code);
}

/**
 * API Management's 403 for a spent quota-by-key quota whose renewal its Retry-After names: the 429 it stands for, in
 * APIM's words whatever the family of the provider behind it (attempt.ts reads it before any family translates it).
 */
export function isQuotaRefusal(status: number, headers: HeaderBag, body: Buffer, nowMs: number): boolean {
  return status === 403 && isQuotaPeriodSpent(body) && parseWaitHint(headers, nowMs) !== undefined;
}

/**
 * API Management's refusal of a spent quota-by-key quota: `{"statusCode": 403, "message": "Out of call volume quota.
 * Quota will be replenished in 00:05:00."}` (or "Out of bandwidth quota"), APIM's own body, not the provider's.
 */
function isQuotaPeriodSpent(body: Buffer): boolean {
  try {
    const parsed = JSON.parse(body.toString('utf8')) as { statusCode?: unknown; message?: unknown } | null;
    return parsed?.statusCode === 403 && typeof parsed.message === 'string' && /^out of (?:call volume|bandwidth) quota\b/i.test(parsed.message);
  } catch {
    return false;
  }
}

/** OpenRouter's 402 for a full in-flight budget (`error.metadata.limit_source`), which passes, unlike a spent balance. */
function isInFlightBudget(error: { metadata?: unknown } | undefined): boolean {
  const m = error?.metadata as { limit_source?: unknown } | null | undefined;
  return typeof m === 'object' && m !== null && m.limit_source === 'openrouter_in_flight_budget';
}

/**
 * OpenRouter's 403 for an input its moderation flagged carries what was flagged in `error.metadata` (`reasons`,
 * `flagged_input`): a content-policy decision on the request, however its status reads.
 */
function isModerationFlag(error: { metadata?: unknown }): boolean {
  const m = error.metadata as { reasons?: unknown; flagged_input?: unknown } | null | undefined;
  return typeof m === 'object' && m !== null && (Array.isArray(m.reasons) || typeof m.flagged_input === 'string');
}

/**
 * Google's answer to a key it does not know (Gemini's OpenAI-compatible endpoint, as its native API): `400
 * INVALID_ARGUMENT` "API key not valid. Please pass a valid API key.", told by its ErrorInfo detail's `reason`
 * (`API_KEY_INVALID`, also sent for an expired key), a structured field, never words a client sent.
 */
function isGoogleKeyRefusal(error: { details?: unknown } | undefined): boolean {
  const details = error?.details;
  if (!Array.isArray(details)) return false;
  return details.some((d: unknown) => {
    const info = d as { '@type'?: unknown; reason?: unknown } | null;
    return typeof info?.['@type'] === 'string' && info['@type'].endsWith('google.rpc.ErrorInfo') && info.reason === 'API_KEY_INVALID';
  });
}

/**
 * How Google says it does not serve the place the gateway calls from: `400 FAILED_PRECONDITION` "User location is not
 * supported for the API use." (a host or egress outside Gemini's available regions), or "Gemini API free tier is not
 * available in your country. Please enable billing on your project in Google AI Studio." Anchored at the start, as
 * Google writes them: FAILED_PRECONDITION also names a request's own state (a file not yet ACTIVE), which stays the
 * client's 400.
 */
const GOOGLE_LOCATION_MESSAGE = /^(?:user location is not supported for the api use|gemini api free tier is not available in your country)\b/i;

/** Google's refusal of the gateway's location (Gemini's OpenAI-compatible endpoint, as its native API). */
function isGoogleLocationRefusal(error: { status?: unknown; message?: unknown } | undefined): boolean {
  return error?.status === 'FAILED_PRECONDITION' && typeof error.message === 'string' && GOOGLE_LOCATION_MESSAGE.test(error.message.trimStart());
}

/** The status and code of an OpenAI-shaped error body that names the gateway's own account, if it is one. */
export function accountErrorOf(body: Buffer): { status: number; code: string } | undefined {
  const error = errorFieldsOf(body);
  const code = typeof error?.code === 'string' ? error.code : undefined;
  const type = typeof error?.type === 'string' ? error.type : undefined;
  const status = accountStatusOfError(code, type);
  return status === undefined ? undefined : { status, code: (code ?? type)! };
}

/** The fields of an upstream's error object the outcome is read from. */
type ErrorFields = { code?: unknown; type?: unknown; message?: unknown; metadata?: unknown; details?: unknown; status?: unknown; param?: unknown };

/**
 * The `error` object of an OpenAI-shaped body, when the body is JSON and has one (also inside the one-element list
 * Gemini's OpenAI-compatible endpoint answers, `[{"error": {...}}]`); the body itself in the flat shape vLLM
 * (before 0.8) and Mistral answer with, `{"object": "error", "message", "type", "code"}`; or, for an error that is only
 * its message (`{"error": "..."}`, Ollama's native API, TGI), that message (errors.ts upstreamErrorFields).
 */
function errorFieldsOf(body: Buffer): ErrorFields | undefined {
  if (body.length === 0) return undefined;
  try {
    return upstreamErrorFields(JSON.parse(body.toString('utf8')));
  } catch {
    return undefined;
  }
}

/**
 * An attempt that failed before its first output. outcome: when it is not the broken stream `failure` describes (an
 * abort, a timeout, the status an error stands for); answer: the error body of that status, passed on as it would have
 * come (the upstream's 400 for an error that blames the request, its 429 for a rate limit); event: the data of the
 * upstream's error event, for a family that reads its own (errorEventMeaning).
 */
export type ErrorVerdict = { failure: string; outcome?: AttemptOutcome; answer?: Buffer; event?: Buffer };

/**
 * What an upstream error reported inside a 2xx means (pipeline/first-output.ts errorBeforeOutput); `what` names where it
 * came, `apiKey` is the key the provider was sent (key-echo.ts).
 */
export function errorVerdict(err: UpstreamStreamError | undefined, what: string, apiKey: string): ErrorVerdict {
  const code = err?.code;
  // The code says what went wrong (Anthropic's `overloaded_error`, OpenAI's `server_error`), where the client would
  // otherwise read only that the stream broke; it is the provider's word, so it goes printable and short. Without the
  // key first: a server that quotes it there handed it to the client in the 502's message, cut at 64 characters
  // (of a project key's 160) where no later search could find it.
  const failure = code === undefined ? what : `${what}: ${printable(withoutKey(code, apiKey), 64)}`;
  // The gateway's own account (no quota, a refused key): the credentials row decides, never a retry on this target.
  const account = accountStatusOfError(code, err?.type);
  if (account !== undefined) return { failure, outcome: { kind: 'http', status: account, errorCode: code ?? err?.type ?? null, hint: undefined } };
  // Without a named code (none, the status as digits, the type again), an over-long prompt is told by its words, as in a whole error.
  const named = code !== undefined && namesError(code, err?.type) ? code : err?.message !== undefined && isContextLengthMessage(err.message) ? 'context_length_exceeded' : code;
  const status = (named === undefined ? undefined : statusOfErrorCode(named)) ?? saidStatus(err);
  if (status === undefined) return { failure };
  const error = { message: err!.message ?? named, type: err!.type ?? (status === 429 ? 'rate_limit_error' : 'invalid_request_error'), param: err!.param ?? null, code: code ?? null };
  // A rate limit the request alone is larger than (the Responses API reports OpenAI's "Request too large" this way too).
  const errorCode = status === 429 && err!.message !== undefined && isOverRateLimitMessage(err!.message) ? OVER_RATE_LIMIT_CODE : named ?? null;
  return { failure, outcome: { kind: 'http', status, errorCode, hint: undefined }, answer: Buffer.from(JSON.stringify({ error })) };
}

/**
 * The status an error code inside a 2xx stands for, when it is not a broken stream: 400 for one that blames the request
 * (a content policy, the context length, an input it cannot use); 429 for a rate limit, named or as its status (the Responses API reports one
 * as a response.failed or an error event after response.created: read as a broken stream, it was retried at the
 * backoff's pace, counted as a breaker failure, where a 429 never opens it, and ended as a 502).
 */
function statusOfErrorCode(code: string): 400 | 429 | undefined {
  if (RATE_LIMIT_CODES.has(code)) return 429;
  return CONTENT_POLICY_CODES.has(code) || CONTEXT_LENGTH_CODES.has(code) || REQUEST_FAULT_CODES.has(code) ? 400 : undefined;
}

/**
 * The status an error inside a 2xx says it stands for, when its code names none the gateway knows: Groq's stream
 * error carries it (`"code": "tool_use_failed", "status_code": 400`, the 400 its whole answer gets). Read as a broken
 * stream, the request was retried, counted by the breaker and ended as a 502 without Groq's message.
 */
function saidStatus(err: UpstreamStreamError | undefined): 400 | 429 | undefined {
  return err?.status === 400 || err?.status === 429 ? err.status : undefined;
}
