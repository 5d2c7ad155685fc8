// Error bodies of the mock, in the shapes the official SDKs parse. One table of defaults by status,
// so a fault rule only names the status and still gets the provider's real error type and code.
import type { Family } from './exchange.ts';
import type { ErrorRule } from './faults.ts';

/** Everything needed to render an error in either API family. */
export interface ErrorDetails {
  status: number;
  message: string;
  /** OpenAI `error.type`. */
  type: string;
  code: string | null;
  param: string | null;
  /** Anthropic's `error.details.error_code` (e.g. `thread_not_found`), which the Anthropic SDK acts on. Default: none. */
  anthropicErrorCode?: string;
}

/** A request the mock refuses before any fault is considered (bad JSON, missing field, bad key). */
export class MockRequestError extends Error {
  readonly status: number;
  readonly code: string | null;
  readonly param: string | null;
  readonly anthropicErrorCode: string | undefined;

  constructor(status: number, message: string, opts: { code?: string | null; param?: string | null; anthropicErrorCode?: string } = {}) {
    super(message);
    this.status = status;
    this.code = opts.code ?? null;
    this.param = opts.param ?? null;
    this.anthropicErrorCode = opts.anthropicErrorCode;
  }

  details(): ErrorDetails {
    const d: ErrorDetails = { ...errorDetails(this.status), message: this.message, code: this.code, param: this.param };
    if (this.anthropicErrorCode !== undefined) d.anthropicErrorCode = this.anthropicErrorCode;
    return d;
  }
}

const OPENAI_DEFAULTS: Record<number, { type: string; code: string | null; message: string }> = {
  400: { type: 'invalid_request_error', code: null, message: 'Invalid request (mock).' },
  401: { type: 'invalid_request_error', code: 'invalid_api_key', message: 'Incorrect API key provided (mock).' },
  403: { type: 'invalid_request_error', code: 'permission_denied', message: 'Permission denied (mock).' },
  404: { type: 'invalid_request_error', code: null, message: 'Not found (mock).' },
  429: { type: 'requests', code: 'rate_limit_exceeded', message: 'Rate limit reached for requests (mock). Please try again later.' },
  500: { type: 'server_error', code: null, message: 'The server had an error while processing your request (mock).' },
  502: { type: 'server_error', code: 'bad_gateway', message: 'Bad gateway (mock).' },
  503: { type: 'server_error', code: 'service_unavailable', message: 'The server is overloaded or not ready yet (mock).' },
  504: { type: 'server_error', code: 'gateway_timeout', message: 'Gateway timeout (mock).' },
  529: { type: 'overloaded_error', code: 'overloaded', message: 'Overloaded (mock).' },
};

const ANTHROPIC_TYPES: Record<number, string> = {
  400: 'invalid_request_error',
  401: 'authentication_error',
  403: 'permission_error',
  404: 'not_found_error',
  413: 'request_too_large',
  429: 'rate_limit_error',
  500: 'api_error',
  529: 'overloaded_error',
};

/** Error details for a status, with a rule's fields laid over the defaults. */
export function errorDetails(status: number, rule?: ErrorRule): ErrorDetails {
  const d = OPENAI_DEFAULTS[status] ??
    (status >= 500
      ? { type: 'server_error', code: null, message: `Server error ${status} (mock).` }
      : { type: 'invalid_request_error', code: null, message: `Request failed with status ${status} (mock).` });
  return {
    status,
    message: rule?.message ?? d.message,
    type: rule?.type ?? d.type,
    code: rule?.code ?? d.code,
    param: rule?.param ?? null,
  };
}

/**
 * Anthropic's overload for Anthropic paths (529 overloaded_error). OpenAI sends no 529: its documented overload is
 * 503 "The engine is currently overloaded, please try again later", which OpenAI paths get instead.
 */
export function overloadedDetails(family: Family): ErrorDetails {
  if (family === 'anthropic') return errorDetails(529);
  return { ...errorDetails(503), code: null, message: 'The engine is currently overloaded, please try again later (mock).' };
}

/** `{ "error": { message, type, param, code } }` */
export function openaiErrorBody(d: ErrorDetails): string {
  return JSON.stringify({ error: { message: d.message, type: d.type, param: d.param, code: d.code } });
}

/**
 * `{ type: 'error', error: { type, message } }`. The type always follows the status, since a
 * rule's `type` is written for OpenAI; only the message carries over.
 */
export function anthropicErrorBody(d: ErrorDetails, requestId: string): string {
  const type = ANTHROPIC_TYPES[d.status] ?? (d.status >= 500 ? 'api_error' : 'invalid_request_error');
  const details = d.anthropicErrorCode === undefined ? {} : { details: { error_code: d.anthropicErrorCode } };
  return JSON.stringify({ type: 'error', error: { type, message: d.message, ...details }, request_id: requestId });
}
