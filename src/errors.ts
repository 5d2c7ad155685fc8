// One table of the gateway's own errors and one builder of the OpenAI error body: every path uses these,
// so clients and SDKs always see `{"error":{"message","type","param","code"}}` with a status that fits.
import { withoutBom } from './http/byte-order-mark.ts';

type OpenAIErrorType = 'invalid_request_error' | 'server_error' | 'rate_limit_error' | 'authentication_error';

export interface OpenAIErrorBody {
  error: { message: string; type: string; param: string | null; code: string | null };
}

interface ErrorDef {
  status: number;
  type: OpenAIErrorType;
}

/** Every error code the gateway itself answers with. The README's "Errors" table lists the same codes (a test checks). */
export const ERROR_CODES = {
  invalid_json: { status: 400, type: 'invalid_request_error' },
  invalid_body: { status: 400, type: 'invalid_request_error' },
  unsupported_media_type: { status: 415, type: 'invalid_request_error' },
  request_too_large: { status: 413, type: 'invalid_request_error' },
  bad_request: { status: 400, type: 'invalid_request_error' },
  headers_too_large: { status: 431, type: 'invalid_request_error' },
  request_timeout: { status: 408, type: 'invalid_request_error' },
  expectation_failed: { status: 417, type: 'invalid_request_error' },
  invalid_api_key: { status: 401, type: 'invalid_request_error' },
  host_not_allowed: { status: 403, type: 'invalid_request_error' },
  unknown_url: { status: 404, type: 'invalid_request_error' },
  method_not_allowed: { status: 405, type: 'invalid_request_error' },
  model_not_found: { status: 404, type: 'invalid_request_error' },
  invalid_idempotency_key: { status: 400, type: 'invalid_request_error' },
  idempotency_key_reused: { status: 422, type: 'invalid_request_error' },
  idempotency_key_in_progress: { status: 409, type: 'invalid_request_error' },
  idempotency_answer_not_kept: { status: 409, type: 'invalid_request_error' },
  upstream_auth_error: { status: 502, type: 'server_error' },
  upstream_redirect: { status: 502, type: 'server_error' },
  upstream_unavailable: { status: 502, type: 'server_error' },
  upstream_bad_response: { status: 502, type: 'server_error' },
  upstream_timeout: { status: 504, type: 'server_error' },
  deadline_exceeded: { status: 504, type: 'server_error' },
  circuit_open: { status: 503, type: 'server_error' },
  provider_held_off: { status: 429, type: 'rate_limit_error' },
  client_rate_limited: { status: 429, type: 'rate_limit_error' },
  park_queue_full: { status: 503, type: 'server_error' },
  load_shed: { status: 503, type: 'server_error' },
  gateway_draining: { status: 503, type: 'server_error' },
  no_target: { status: 503, type: 'server_error' },
  stream_interrupted: { status: 502, type: 'server_error' },
  internal_error: { status: 500, type: 'server_error' },
  loop_detected: { status: 508, type: 'server_error' },
} as const satisfies Record<string, ErrorDef>;

type ErrorCode = keyof typeof ERROR_CODES;

/** An error the gateway answers with. `headers` carries retry-after and friends; x-should-retry is decided by `shouldRetry`. */
export class GatewayError extends Error {
  readonly status: number;
  readonly type: string;
  readonly param: string | null;
  /** True only when the gateway itself asks the client to come back after a known, short wait. */
  readonly shouldRetry: boolean;
  /** Wait the client should observe before coming back, when known. */
  readonly retryAfterMs: number | undefined;
  /** Headers the answer needs besides the retry ones (e.g. `allow` on a 405). */
  readonly headers: Record<string, string>;

  constructor(
    readonly code: ErrorCode,
    message: string,
    opts: { param?: string | null; shouldRetry?: boolean; retryAfterMs?: number; status?: number; headers?: Record<string, string> } = {},
  ) {
    super(message);
    const def = ERROR_CODES[code];
    this.status = opts.status ?? def.status;
    this.type = this.status === 429 ? 'rate_limit_error' : def.type;
    this.param = opts.param ?? null;
    this.shouldRetry = opts.shouldRetry ?? false;
    this.retryAfterMs = opts.retryAfterMs;
    this.headers = opts.headers ?? {};
  }

  toBody(): OpenAIErrorBody {
    return errorBody(this.message, this.type, this.code, this.param);
  }
}

/**
 * A draining instance's answer to new work, or to a retry it has no time left to wait for: another instance can serve
 * it, so the SDK is invited back, after `retryAfterMs` (the retry's wait left) when that is longer than a second.
 */
export function drainingError(retryAfterMs = 0): GatewayError {
  // At least a second: the load balancer is still taking the instance out of its list.
  return new GatewayError('gateway_draining', 'this gateway instance is shutting down; another instance can serve the request', { shouldRetry: true, retryAfterMs: Math.max(1_000, retryAfterMs) });
}

/**
 * A draining instance's answer to a request the grace end cut while its attempt was in flight, when that request
 * commits at the provider as it is taken (a background response, a conversation's turn): the provider may have taken
 * it, so the SDK is not invited back. Sent again, by another instance, it would queue a second job beside the first,
 * or add the turn to the conversation twice.
 */
export function drainingCutError(): GatewayError {
  return new GatewayError(
    'gateway_draining',
    'this gateway instance is shutting down and cut the request after it was sent: the provider may have taken it (a background response runs on, a conversation has its turn), so it is not to be sent again as it is',
  );
}

/** A path called with a method it does not serve; `allow` lists the ones it does (RFC 9110, 15.5.6). */
export function methodNotAllowed(method: string, path: string, allowed: readonly string[]): GatewayError {
  return new GatewayError('method_not_allowed', `${method} is not allowed on ${path}; use ${allowed.join(' or ')}`, { headers: { allow: allowed.join(', ') } });
}

/** A managed request without a usable `model`, in the words OpenAI's own API uses. */
export function missingModel(got: unknown): GatewayError {
  const why = got === undefined || got === '' ? 'you must provide a model parameter' : `model must be a string, not ${got === null ? 'null' : Array.isArray(got) ? 'an array' : typeof got}`;
  return new GatewayError('invalid_body', why, { param: 'model' });
}

export function errorBody(message: string, type: string, code: string | null, param: string | null = null): OpenAIErrorBody {
  return { error: { message, type, param, code } };
}

/** The x-should-retry rule in one place: only a short wait the gateway knows the end of invites the SDK back. */
export function retryHeaders(shouldRetry: boolean, retryAfterMs: number | undefined): Record<string, string> {
  const headers: Record<string, string> = { 'x-should-retry': 'false' };
  if (retryAfterMs !== undefined) {
    headers['retry-after-ms'] = String(Math.ceil(retryAfterMs));
    headers['retry-after'] = String(Math.ceil(retryAfterMs / 1000));
    // Older OpenAI SDKs ignore hints over 60 s and retry after their own short backoff; v6 waits out any hint, however
    // long, holding the caller: either way only a short wait is worth an invitation.
    if (shouldRetry && retryAfterMs <= 60_000) headers['x-should-retry'] = 'true';
  }
  return headers;
}

/**
 * Makes an upstream error body safe to hand to the client in the OpenAI shape: a well-formed OpenAI error (or an
 * Anthropic one, whose `error` has a `message` too) passes as it is, its own fields kept (Azure's `innererror` says
 * which content filter fired, Anthropic's `details`), with any of the four the shape needs filled in; the flat
 * `{"object": "error", "message", ...}` of vLLM and Mistral is put in that shape, and so is an error that is only
 * its message (`{"error": "..."}`, Ollama's native API and TGI); anything else is wrapped (an HTML page from a load
 * balancer by its title or text, never its markup).
 */
export function normaliseUpstreamErrorBody(status: number, body: Buffer | undefined): OpenAIErrorBody {
  const raw = body && withoutBom(body);
  if (raw && raw.length > 0) {
    try {
      const parsed = unlisted(JSON.parse(raw.toString('utf8')));
      if (isOpenAIErrorBody(parsed)) {
        const e = parsed.error;
        const type = typeof e.type === 'string' && e.type !== '' ? e.type : typeOfStatus(status);
        // Its other top-level fields stay too (Anthropic's `type: "error"` and `request_id`, for an Anthropic client).
        return { ...parsed, error: { ...e, message: e.message, type, param: stringOrNull(e.param), code: stringOrNull(e.code) } };
      }
      // vLLM before 0.8, Mistral and Cerebras answer the same four fields flat: wrapped whole, the client's message was
      // that JSON, cut at 200 characters, and its code null (Mistral's validation details go on as their JSON).
      if (isFlatErrorBody(parsed)) {
        const type = typeof parsed.type === 'string' && parsed.type !== '' ? parsed.type : typeOfStatus(status);
        const message = typeof parsed.message === 'string' ? parsed.message : JSON.stringify(parsed.message);
        return errorBody(message, type, stringOrNull(parsed.code), stringOrNull(parsed.param));
      }
      // Ollama's native API and Hugging Face TGI say the error in words alone (`{"error": "model \"x\" not found"}`,
      // TGI with an `error_type` beside it): wrapped whole, the client's message was that JSON, quotes escaped.
      if (isStringErrorBody(parsed)) return errorBody(parsed.error, typeOfStatus(status), null);
    } catch {
      // not JSON: fall through to the wrapped form
    }
  }
  const text = raw ? wrappedText(raw) : '';
  return errorBody(`upstream answered ${status}${text ? `: ${text}` : ''}`, typeOfStatus(status), null);
}

const HTML_PAGE = /^\s*<(?:!doctype|html|head|body|title|center|h1|p)\b/i;

/**
 * The words of a body that is not an error of any known shape, cut at 200 characters. An HTML page (a load balancer's
 * 502, a captive portal) gives its title, else its text without the tags: its markup in `error.message` went into
 * every client's log ("upstream answered 502: <!DOCTYPE html><html><head>...").
 */
function wrappedText(raw: Buffer): string {
  const head = raw.toString('utf8', 0, Math.min(raw.length, 8192));
  let text = head.slice(0, 200);
  if (HTML_PAGE.test(head)) {
    const title = /<title[^>]*>([^<]*)</i.exec(head)?.[1];
    text = title?.trim() ? title : head.replace(/<(script|style)\b[\s\S]*?(?:<\/\1>|$)/gi, ' ').replace(/<[^>]*>?/g, ' ');
    text = text.replace(/&nbsp;/g, ' ').replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&quot;/g, '"').replace(/&amp;/g, '&');
  }
  return text.replace(/\s+/g, ' ').trim().slice(0, 200);
}

function typeOfStatus(status: number): string {
  return status >= 500 ? 'server_error' : status === 429 ? 'rate_limit_error' : 'invalid_request_error';
}

/**
 * An error's `code` or `param` as the OpenAI shape types it. Some OpenAI-compatible servers send `"code": 400` or
 * `"code": 1234`: an SDK or a client that switches on a string code must not get a number, so it goes on as "400".
 * Anything else that is not a string (an object, a list, a boolean) says nothing a client could match on: null.
 */
export function stringOrNull(v: unknown): string | null {
  if (typeof v === 'string') return v;
  return typeof v === 'number' && Number.isFinite(v) ? String(v) : null;
}

/**
 * The error object of a parsed upstream error body, for its classification: `error` in the OpenAI shape (also inside
 * Gemini's one-element list), the flat body of vLLM (before 0.8) and Mistral, or the message of an error that is only
 * a string. The same shapes the client is given (normaliseUpstreamErrorBody).
 */
export function upstreamErrorFields(parsed: unknown): { code?: unknown; type?: unknown; message?: unknown } | undefined {
  const body = unlisted(parsed);
  if (typeof body !== 'object' || body === null) return undefined;
  const error = (body as { error?: unknown }).error;
  if (typeof error === 'object' && error !== null) return error;
  if (isStringErrorBody(body)) return { message: body.error };
  return isFlatErrorBody(body) ? body : undefined;
}

/** Gemini's OpenAI-compatible endpoint answers its errors as a one-element list: the element. */
function unlisted(parsed: unknown): unknown {
  return Array.isArray(parsed) && parsed.length === 1 ? (parsed[0] as unknown) : parsed;
}

/**
 * The four fields flat: beside `"object": "error"` (vLLM before 0.8, Mistral), or with a `type` and a `code` and no
 * `object` (Cerebras: `{"message", "type", "param", "code"}`). Mistral's 422 has its validation details, an object,
 * as the message.
 */
function isFlatErrorBody(v: unknown): v is { message: unknown; type?: unknown; code?: unknown; param?: unknown } {
  const o = v as { object?: unknown; message?: unknown; type?: unknown } | null;
  if (typeof o !== 'object' || o === null || !(o.object === 'error' || (typeof o.type === 'string' && 'code' in o))) return false;
  return typeof o.message === 'string' || (typeof o.message === 'object' && o.message !== null);
}

/** An error that is only its message: `{"error": "..."}` (Ollama's native API, TGI with its `error_type`). */
function isStringErrorBody(v: unknown): v is { error: string } {
  const e = (v as { error?: unknown } | null)?.error;
  return typeof e === 'string' && e !== '';
}

/** Whether an upstream error's bytes are JSON in the OpenAI shape already (`{"error": {"message", ...}}`). */
export function isOpenAIErrorJson(body: Buffer): boolean {
  try {
    return isOpenAIErrorBody(JSON.parse(withoutBom(body).toString('utf8')));
  } catch {
    return false;
  }
}

function isOpenAIErrorBody(v: unknown): v is { error: { message: string; type?: unknown; code?: unknown; param?: unknown } } {
  const e = (v as { error?: { message?: unknown } } | null)?.error;
  return typeof e === 'object' && e !== null && typeof e.message === 'string';
}
