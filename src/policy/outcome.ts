// The one outcome table: every upstream outcome maps to what it means for retry, the breaker, hold-offs, the adaptive
// limit and failover (OutcomeRow's columns). A new policy adds a column here, never a branch in the pipeline.
import type { RetryOn } from '../config/schema.ts';
import type { WaitHint } from './wait-hint.ts';

/** Which per-attempt timer fired. */
export type TimeoutPhase = 'connect' | 'headers' | 'first-token' | 'idle' | 'response';

/** What one attempt ended with, as seen by the pipeline. */
export type AttemptOutcome =
  | { kind: 'ok'; status: number }
  /**
   * `param`: for a 404, the request field the error names when it is not `model` (a `previous_response_id`, an `input`
   * item the provider does not have): the request's own reference is missing, not the model. `created`: the status a
   * failed Response stands for (a whole answer whose status is failed): the provider created and stored that Response,
   * so it took the request, as a stream's response.created says it did. `unknownUrl`: a 404 that says the URL is not
   * there (OpenAI's "Invalid URL", a bare "Not Found", a web server's page), not what of the request is missing: a
   * wrong `baseUrl`, which no client request can be faulted for. `shouldRetry`: the upstream's own `x-should-retry`
   * (`true` or `false`, as the OpenAI and Anthropic SDKs read it), when it sent one.
   */
  | { kind: 'http'; status: number; errorCode: string | null; hint: WaitHint | undefined; param?: string; created?: true; unknownUrl?: true; shouldRetry?: boolean }
  | { kind: 'network'; code: string }
  | { kind: 'timeout'; phase: TimeoutPhase }
  /**
   * No usable answer: a stream that broke before its first output event (a malformed event, an error event, an early
   * end), or a 2xx that is not the API's answer. `ran`: the provider was producing an answer (a stream had started,
   * a whole answer came too large), as opposed to a body that is no answer at all (a proxy's HTML page, an error).
   */
  | { kind: 'bad-stream'; detail: string; ran: boolean }
  /** The gateway could not send the request at all (an invalid header value, say): its own fault, not the target's. */
  | { kind: 'internal'; code: string }
  | { kind: 'aborted'; by: 'client' | 'deadline' | 'shutdown' };

type OutcomeClass =
  | 'success'
  | 'client-error'
  | 'context-length'
  | 'content-policy'
  | 'thread-state'
  | 'credentials'
  | 'redirect'
  | 'rate-limited'
  | 'over-rate-limit'
  | 'server-error'
  | 'overloaded'
  | 'flex-capacity'
  | 'network'
  | 'local-resource'
  | 'tls'
  | 'timeout'
  | 'bad-stream'
  | 'internal'
  | 'aborted'
  | 'shutdown';

interface OutcomeRow {
  /** May this class be retried at all (then `retryOn` decides)? */
  retryable: boolean;
  /** Does the client get the upstream's own status and body (its request was wrong), or the gateway's error? */
  passThrough: boolean;
  /**
   * What the outcome tells the target's circuit breaker; `slow-call` means failure only past slowCallMs. `ignore`: not
   * counted, but the target's doing (refusing, silent, misconfigured), so a probe that gets it is inconclusive and the
   * next probe waits (BreakerBoard.record). `ignore-request`: this request's alone (its service tier, its size, a header
   * the gateway could not send), so a probe that gets it gives its permit back with no verdict and the next goes at once.
   */
  breaker: 'success' | 'failure' | 'ignore' | 'ignore-request' | 'slow-call';
  /**
   * May a fleet-wide wait hint (retry-after, retry-after-ms) on this outcome hold the target off for every instance?
   * `flex-tier`: only its flex service tier, which only requests that ask for that tier read (HoldOffs.flexTierKey).
   */
  holdOff: boolean | 'flex-tier';
  /** What it does to the target's adaptive concurrency limit: other 5xx are the breaker's business, not the limit's. */
  limit: 'success' | 'rate-limited' | 'none';
  /**
   * What it means for the request's other targets: `end` the request (a safety decision, a disconnect, a drain);
   * `reject` the request as it is (the client's fault, unless an earlier target was down: then a fallback's own
   * limits, and the request moves on); or hand over to the `next` target.
   */
  failover: 'end' | 'reject' | 'next';
  /** Is it the upstream's verdict on the request itself: passed on as it is, never with a note, never a degraded answer? */
  verdict: boolean;
  /** The fallback reason (stormgate_fallbacks_total's reason label) when the next target takes over. */
  fallback: 'credentials' | 'redirect' | 'timeout' | 'error';
  /** Is the next target tried before this one is retried? A silent target's retry would likely wait out the same timer. */
  nextFirst: boolean;
}

export const OUTCOME_TABLE: Readonly<Record<OutcomeClass, OutcomeRow>> = {
  success: { retryable: false, passThrough: true, breaker: 'success', holdOff: false, limit: 'success', failover: 'next', verdict: false, fallback: 'error', nextFirst: false },
  // A client's mistake says the provider is up and answering.
  'client-error': { retryable: true, passThrough: true, breaker: 'success', holdOff: false, limit: 'none', failover: 'reject', verdict: true, fallback: 'error', nextFirst: false }, // only statuses in retryOn (a 409, say), never NEVER_RETRY
  'context-length': { retryable: false, passThrough: true, breaker: 'success', holdOff: false, limit: 'none', failover: 'reject', verdict: true, fallback: 'error', nextFirst: false },
  'content-policy': { retryable: false, passThrough: true, breaker: 'success', holdOff: false, limit: 'none', failover: 'end', verdict: true, fallback: 'error', nextFirst: false },
  // A conversation the provider holds for the client (Anthropic's message threads) that this target cannot continue:
  // the client's SDK replays it whole, which any target can serve. After an outage it is no fallback's limit to hide
  // behind the outage (the replay would be served; the earlier failure would leave the conversation stuck).
  'thread-state': { retryable: false, passThrough: true, breaker: 'success', holdOff: false, limit: 'none', failover: 'end', verdict: true, fallback: 'error', nextFirst: false },
  // The gateway's key or billing: the provider's body can echo the key. Not the provider's health either.
  credentials: { retryable: false, passThrough: false, breaker: 'ignore', holdOff: false, limit: 'none', failover: 'next', verdict: false, fallback: 'credentials', nextFirst: false },
  // A 3xx on an API endpoint is the gateway's configuration (a baseUrl on http that the provider moves to https, a host
  // that moved), the credentials' sibling: the same target answers the same way, so no retry there, while the next
  // target may well answer. The redirect is never followed: the body and the key would go to a host nobody configured.
  // Nor is it the provider's health: it answered at once, and an open breaker would turn a configuration mistake into
  // fleet-wide circuit_open answers whose retry-after promises a recovery only a fix of the config brings.
  redirect: { retryable: false, passThrough: false, breaker: 'ignore', holdOff: false, limit: 'none', failover: 'next', verdict: false, fallback: 'redirect', nextFirst: false },
  // A rate limit is the provider protecting itself, not failing: the breaker stays out of it; hold-offs handle it.
  'rate-limited': { retryable: true, passThrough: true, breaker: 'ignore', holdOff: true, limit: 'rate-limited', failover: 'next', verdict: false, fallback: 'error', nextFirst: false },
  // One request larger than the whole per-minute limit: no wait lets it through here, so no retry; nor does it say
  // anything of the provider's load, so no hold-off (its retry-after held every request off) and no cut of the limit.
  // Another target, with a limit of its own, may take it.
  'over-rate-limit': { retryable: false, passThrough: true, breaker: 'ignore-request', holdOff: false, limit: 'none', failover: 'next', verdict: true, fallback: 'error', nextFirst: false },
  'server-error': { retryable: true, passThrough: true, breaker: 'failure', holdOff: true, limit: 'none', failover: 'next', verdict: false, fallback: 'error', nextFirst: false },
  overloaded: { retryable: true, passThrough: true, breaker: 'failure', holdOff: true, limit: 'rate-limited', failover: 'next', verdict: false, fallback: 'error', nextFirst: false },
  // The provider's flex tier at capacity (Groq's 498): the batch traffic that opted into it, not the target. Its hint
  // holds off that tier alone, and neither the breaker nor the adaptive limit hears of it: counted, a full flex tier
  // opened the breaker (or cut the limit) of the online requests on the default tier beside it. Nor does it say anything
  // as a probe: a default-tier request parked behind it is the next probe at once.
  'flex-capacity': { retryable: true, passThrough: true, breaker: 'ignore-request', holdOff: 'flex-tier', limit: 'none', failover: 'next', verdict: false, fallback: 'error', nextFirst: false },
  network: { retryable: true, passThrough: false, breaker: 'failure', holdOff: false, limit: 'none', failover: 'next', verdict: false, fallback: 'error', nextFirst: false },
  // The gateway's own process is out of descriptors (its open-files limit, a crowd of streams): nothing reached the
  // provider, whose health is not in question. Counted as a failure, it opened the breaker (fleet-wide, with Redis) and
  // parked every request on a healthy provider. A retry may find a descriptor freed by a stream that ended.
  'local-resource': { retryable: true, passThrough: false, breaker: 'ignore', holdOff: false, limit: 'none', failover: 'next', verdict: false, fallback: 'error', nextFirst: false },
  // The gateway refused the provider's certificate (untrusted, expired, for another name) or its port speaks no TLS:
  // the handshake fails, so nothing was sent, and every retry fails the same way until someone changes the certificate
  // or the config. Nor is it the provider's health: an open breaker would hide the TLS code behind circuit_open, whose
  // retry-after promises a recovery only that change brings. The next target, with a certificate of its own, may answer.
  tls: { retryable: false, passThrough: false, breaker: 'ignore', holdOff: false, limit: 'none', failover: 'next', verdict: false, fallback: 'error', nextFirst: false },
  timeout: { retryable: true, passThrough: false, breaker: 'failure', holdOff: false, limit: 'none', failover: 'next', verdict: false, fallback: 'timeout', nextFirst: true },
  'bad-stream': { retryable: true, passThrough: false, breaker: 'failure', holdOff: false, limit: 'none', failover: 'next', verdict: false, fallback: 'error', nextFirst: false },
  // Nothing reached the provider: retrying would fail the same way, and the provider's health is not in question.
  internal: { retryable: false, passThrough: false, breaker: 'ignore-request', holdOff: false, limit: 'none', failover: 'next', verdict: false, fallback: 'error', nextFirst: false },
  aborted: { retryable: false, passThrough: false, breaker: 'slow-call', holdOff: false, limit: 'none', failover: 'end', verdict: false, fallback: 'error', nextFirst: false },
  // The instance is going away, not the provider: a drain must never open a breaker the fleet shares.
  shutdown: { retryable: false, passThrough: false, breaker: 'ignore', holdOff: false, limit: 'none', failover: 'end', verdict: false, fallback: 'error', nextFirst: false },
};

/** Statuses that say the client's request is wrong: retrying them can never help, whatever retryOn says. */
const NEVER_RETRY = new Set([400, 401, 403, 404, 422]);
/**
 * 429 codes that are the company's account, not a rate: no quota left (`insufficient_quota`), billing not set up or
 * lapsed (`billing_not_active`), access revoked (`access_terminated`). No wait ends them, only a fix of the account.
 */
export const ACCOUNT_429_CODES: ReadonlySet<string> = new Set(['insufficient_quota', 'billing_not_active', 'access_terminated']);
/**
 * The status an error inside a 2xx stands for when it names the gateway's own account, not the request nor the
 * provider's health: OpenAI's Responses API starts a stream (`response.created`) and only then sends
 * `insufficient_quota` as an `event: error`, Anthropic sends `billing_error` as an `error` event, and some routers
 * answer a whole error object with a 200. Read as a broken answer, it was retried on the same target and counted as a
 * breaker failure (five in a row opened the breaker, whose circuit_open promises a recovery only a fix of the account
 * brings); read as the 429, 402, 401 or 403 it stands for, it takes the credentials row like the same answer given as a
 * status. `type` counts as well as `code`: the Anthropic translation names billing in both, authentication in `type` only.
 */
export function accountStatusOfError(code: string | undefined, type: string | undefined): 401 | 402 | 403 | 429 | undefined {
  if ((code !== undefined && ACCOUNT_429_CODES.has(code)) || (type !== undefined && ACCOUNT_429_CODES.has(type))) return 429;
  // Anthropic's own (a /v1/messages route passes its events and bodies on untranslated): the 402 it answers it with.
  if (type === 'billing_error') return 402;
  if (code === 'invalid_api_key' || type === 'authentication_error') return 401;
  if (type === 'permission_error') return 403;
  return undefined;
}
/** `exceed_context_size_error`: llama.cpp's server names it in `type` (its `code` is the status, 400). */
export const CONTEXT_LENGTH_CODES: ReadonlySet<string> = new Set(['context_length_exceeded', 'string_above_max_length', 'exceed_context_size_error']);
/**
 * How OpenAI-compatible servers that name no code for it say a prompt is longer than the model's window: vLLM and
 * DeepSeek ("This model's maximum context length is 8192 tokens. However, ..."; vLLM 0.11 to 0.15, when the prompt and
 * max_tokens together pass the window: "'max_tokens' or 'max_completion_tokens' is too large: 1000. This model's maximum
 * context length is ..."; vLLM 0.16 on: "You passed 9000 input tokens and requested 1000 output tokens. However, the
 * model's context length is only 8192 tokens, ..."), xAI ("This model's maximum prompt length is 131072 but the request
 * contains 136973 tokens.", the body's `error` string), OpenRouter ("This endpoint's maximum
 * context length is ..."), SGLang and Together ("The input (9000 tokens) is longer than the model's context length
 * (8192 tokens)."), Mistral ("Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum
 * context length"), Gemini ("The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."),
 * llama.cpp before its error type, Hugging Face TGI (a 422: "Input validation error: `inputs` tokens + `max_new_tokens` must
 * be <= 4096. Given: ...", or "... `inputs` must have less than 4096 tokens. Given: ..."). Read as a plain 400, the request never reached
 * `contextWindowFallback` (LiteLLM's context_window_fallbacks had the same hole: its issues #10793, #12680). Anchored
 * at the start of the message, as these servers write it: a validation error that quotes what the client sent must not
 * read as one.
 */
const CONTEXT_LENGTH_MESSAGE =
  /^(?:this (?:model|endpoint)'s maximum context length is \d|this model's maximum prompt length is \d+ but the request contains \d+ tokens|'max_tokens' or 'max_completion_tokens' is too large: \d+\. this model's maximum context length is \d|you passed \d+ input (?:tokens|characters)\b[^.]*\. however, the model's context length is only \d|the input \(\d+ tokens\) is longer than the model's context length|prompt contains \d+ tokens\b[^.]*\btoo large for model with \d+ maximum context length|requested token count exceeds the model's maximum context length|the request exceeds the available context size|the input token count \(\d+\) exceeds the maximum number of tokens allowed|input validation error: `inputs` (?:tokens \+ `max_new_tokens` must be <= \d|must have less than \d+ tokens\. given: \d))/i;

/**
 * Does an error's `code` name what went wrong? Not the status as digits (`"400"`, vLLM, OpenRouter), nor its `type`
 * said again (DeepSeek's `"code": "invalid_request_error"` on its context error): those leave the message to tell it.
 */
export function namesError(code: string, type: unknown): boolean {
  return !/^\d+$/.test(code) && code !== type;
}

/** Does a 4xx error's message, from a server that gave no code naming it, say the prompt exceeds the context window? */
export function isContextLengthMessage(message: string): boolean {
  return CONTEXT_LENGTH_MESSAGE.test(message.trimStart());
}
/**
 * Anthropic's `error.details.error_code` for a message thread this target cannot continue: the Anthropic SDK answers
 * each by replaying the whole conversation (`thread_unsupported_request`: by going on without a thread).
 */
export const THREAD_STATE_CODES: ReadonlySet<string> = new Set(['thread_not_found', 'thread_already_continued', 'thread_continue_in_flight', 'thread_unsupported_request']);

/** `invalid_prompt`: the Responses API's "your prompt was flagged as potentially violating our usage policy". */
export const CONTENT_POLICY_CODES: ReadonlySet<string> = new Set(['content_policy_violation', 'content_filter', 'invalid_prompt', 'image_content_policy_violation']);
/**
 * Codes that name a rate limit: OpenAI's 429 `rate_limit_exceeded`, which the Responses API also reports inside a 2xx
 * (ResponseError.code of a `response.failed`, or an `error` event) once it has sent `response.created`; and the status
 * itself, which OpenRouter sends as the code (`"code": 429`, read as its digits) in the 200 of a stream it had begun;
 * OpenAI's `slow_down` (type rate_limit_error), a rate grown too fast.
 */
export const RATE_LIMIT_CODES: ReadonlySet<string> = new Set(['rate_limit_exceeded', '429', 'slow_down']);
/**
 * Codes of the Responses API's `response.failed` (ResponseError.code) that say the request itself is at fault (an
 * input image it cannot use): sending it again, here or to another target, gets the same answer.
 */
export const REQUEST_FAULT_CODES: ReadonlySet<string> = new Set([
  'invalid_image', 'invalid_image_format', 'invalid_base64_image', 'invalid_image_url', 'image_too_large', 'image_too_small',
  'image_parse_error', 'invalid_image_mode', 'image_file_too_large', 'unsupported_image_media_type', 'empty_image_file',
  'failed_to_download_image', 'image_file_not_found',
]);

/**
 * How a provider says one request is larger than its whole token limit per minute (or day), so that no wait can let
 * it through: OpenAI's 429 `rate_limit_exceeded` "Request too large for gpt-4o in organization org-... on tokens per
 * min (TPM): Limit 30000, Requested 36278. The input or output tokens must be reduced in order to run successfully.",
 * and Groq's 413 in the same words ("... on tokens per minute (TPM): Limit 6000, Requested 7431, please reduce your
 * message size"). Read as a rate limit, it was retried maxAttempts times into the same refusal, and its retry-after
 * held the target off for every request, of every instance, that would have fitted.
 */
const OVER_RATE_LIMIT_MESSAGE = /^request too large for .*? on tokens per (?:min|minute|day) \(\w+\): limit (\d+), requested (\d+)/i;

/** The error code error-outcome.ts gives such an answer, whatever code the provider named (`rate_limit_exceeded`). */
export const OVER_RATE_LIMIT_CODE = 'request_over_rate_limit';

/** Does a 429's (or 413's) message say the request alone is larger than the provider's token limit? */
export function isOverRateLimitMessage(message: string): boolean {
  const m = OVER_RATE_LIMIT_MESSAGE.exec(message.trimStart());
  return m !== null && Number(m[2]) > Number(m[1]);
}

/**
 * How a provider that names no account code says a 429 is the account's spend, not a rate: xAI's `{"code": "Some
 * resource has been exhausted", "error": "Your team <id> has either used all available credits or reached its monthly
 * spending limit. ..."}`. No wait ends it, only credits: read as a rate limit, it was retried maxAttempts times on every
 * request, and its body, naming the team, went to the client. Anchored at the start, as xAI writes it.
 */
const ACCOUNT_SPENT_MESSAGE = /^your team \S+ has either used all available credits or reached its monthly spending limit/i;

/** Does a 429's message, with no account code beside it, say the account has no credits left? */
export function isAccountSpentMessage(message: string): boolean {
  return ACCOUNT_SPENT_MESSAGE.test(message.trimStart());
}

/**
 * Codes that say the provider is at capacity, not that the request is wrong: Groq's `capacity_exceeded`; OpenAI's 503
 * `server_is_overloaded` ("The server is overloaded") and `slow_down` (traffic grown faster than it can take; a 429 now,
 * a 503 before), whose remedy is a lower rate, which read as a plain 5xx nothing lowered (no adaptive limit cut).
 */
const CAPACITY_CODES: ReadonlySet<string> = new Set(['capacity_exceeded', 'server_is_overloaded', 'slow_down']);

/**
 * How a provider whose 403 code does not tell a refused request from a refused team says it is the request: xAI's
 * `{"code": "permission-denied", "error": "Content violates usage guidelines. "}` (its team refused the endpoint has the
 * same code, other words). Read as the gateway's key, one user's prompt was routed around the safety decision and held
 * the target from every request for authHoldS. Anchored at the start, as xAI writes it: words quoted after others are
 * not this refusal.
 */
const CONTENT_REFUSAL_MESSAGE = /^content violates usage guidelines\b/i;

/** Does a 403's message, with no content-policy code beside it, say the request's content was refused? */
export function isContentRefusalMessage(message: string): boolean {
  return CONTENT_REFUSAL_MESSAGE.test(message.trimStart());
}

/**
 * The provider does not serve the country the gateway calls from: OpenAI's 403 `unsupported_country_region_territory`
 * ("Country, region, or territory not supported"), and Google's location refusal, read as it (error-outcome.ts).
 */
export const REGION_REFUSED_CODE = 'unsupported_country_region_territory';

export interface Classification {
  cls: OutcomeClass;
  /** Which `retryOn` entry governs this outcome; null when none can. */
  retryKey: RetryOn | null;
  /** Short, bounded reason for x-retry-reason, logs and metric labels. */
  reason: string;
  /**
   * The upstream said a repeat will not help (`x-should-retry: false`): no retry on the target that answered, whatever
   * retryOn says (its retry key stays: whether the request may go to the next target is still retryOn's, as for the
   * same status without the header). Its `true` is no column here: retryOn is the operator's policy, and a status it
   * leaves out (a 409, a 408) or one never retried (NEVER_RETRY) is not retried because the provider invites it.
   */
  upstreamNoRetry?: true;
}

export function classify(outcome: AttemptOutcome): Classification {
  switch (outcome.kind) {
    case 'ok':
      return { cls: 'success', retryKey: null, reason: 'ok' };
    case 'network':
      // Its own reason: under `network`, the retry count blamed the provider for the gateway's own limit.
      if (LOCAL_RESOURCE_CODES.has(outcome.code)) return { cls: 'local-resource', retryKey: 'network', reason: 'local_resource' };
      if (refusedTls(outcome.code)) return { cls: 'tls', retryKey: null, reason: 'tls' };
      return { cls: 'network', retryKey: 'network', reason: 'network' };
    case 'timeout':
      return { cls: 'timeout', retryKey: 'timeout', reason: timeoutReason(outcome.phase) };
    case 'bad-stream':
      // A broken stream before any output is a broken answer in transit, like a reset connection.
      return { cls: 'bad-stream', retryKey: 'network', reason: 'bad_stream' };
    case 'internal':
      return { cls: 'internal', retryKey: null, reason: 'internal' };
    case 'aborted':
      if (outcome.by === 'shutdown') return { cls: 'shutdown', retryKey: null, reason: 'shutdown' };
      return { cls: 'aborted', retryKey: null, reason: outcome.by === 'client' ? 'client_abort' : outcome.by };
    case 'http': {
      const c = classifyStatus(outcome.status, outcome.errorCode);
      return outcome.shouldRetry === false ? { ...c, upstreamNoRetry: true } : c;
    }
  }
}

function timeoutReason(phase: TimeoutPhase): string {
  return `timeout_${phase.replace('-', '_')}`;
}

/** Timers that can fire before a stream's first output or a whole answer: the idle timer runs only after output, when no retry is made. */
const RETRIED_TIMEOUT_PHASES: readonly TimeoutPhase[] = ['connect', 'headers', 'first-token', 'response'];

/**
 * Every reason classify() can give an outcome that a route's retryOn lets be retried: the retry counter's series are
 * made at start-up for each, so a dashboard's rate() sees its first retry.
 */
export function retryReasons(retryOn: readonly RetryOn[]): string[] {
  return retryOn.flatMap((r) => {
    if (typeof r === 'number') return [`status_${r}`];
    if (r === 'network') return ['network', 'bad_stream', 'local_resource'];
    return RETRIED_TIMEOUT_PHASES.map(timeoutReason);
  });
}

function classifyStatus(status: number, errorCode: string | null): Classification {
  const reason = `status_${status}`;
  // Before the credentials, for a 403 only: OpenRouter answers a moderation flag on the input with one. Read as the
  // gateway's key, one user's flagged prompt was routed around the safety decision and held the target from every
  // request for authHoldS. A 401 or 402 is the key or the billing whatever code it names: passed on as a content
  // decision, its body (which can quote the key) reached the client and the backup was never asked.
  if (status !== 401 && status !== 402 && errorCode && CONTENT_POLICY_CODES.has(errorCode)) return { cls: 'content-policy', retryKey: null, reason: 'content_policy' };
  if (status >= 400 && status < 500 && errorCode && THREAD_STATE_CODES.has(errorCode)) return { cls: 'thread-state', retryKey: null, reason: 'thread_state' };
  // A refused location is the gateway's deployment, not its key: the reason says so, where status_403 sent the operator to the key.
  if (status === 403 && errorCode === REGION_REFUSED_CODE) return { cls: 'credentials', retryKey: null, reason: REGION_REFUSED_CODE };
  // 402 Payment Required: Anthropic's billing_error, OpenRouter's credits; the company's billing, like a 429 insufficient_quota.
  if (status === 401 || status === 402 || status === 403) return { cls: 'credentials', retryKey: null, reason };
  // The reason is the code itself: one of a fixed set, so bounded as a metric label.
  if (status === 429 && errorCode !== null && ACCOUNT_429_CODES.has(errorCode)) return { cls: 'credentials', retryKey: null, reason: errorCode };
  if ((status === 429 || status === 413) && errorCode === OVER_RATE_LIMIT_CODE) return { cls: 'over-rate-limit', retryKey: null, reason: OVER_RATE_LIMIT_CODE };
  if (errorCode && CONTEXT_LENGTH_CODES.has(errorCode)) return { cls: 'context-length', retryKey: null, reason: 'context_length' };
  if (status === 429) return { cls: 'rate-limited', retryKey: 429, reason };
  // The provider timed out (Azure answers 408 "The operation was timeout"), or its model failed while generating (424:
  // Hugging Face TGI's "Request failed during generation", CUDA out of memory; Bedrock's ModelErrorException): its
  // failure, not the request's; retried only if retryOn lists it, but never the end of the request while another
  // target can answer.
  if (status === 408 || status === 424) return { cls: 'server-error', retryKey: status, reason };
  if (status === 529) return { cls: 'overloaded', retryKey: 529, reason };
  // The provider at capacity, whatever status it chose: Groq's flex tier answers 498 `capacity_exceeded` ("try again
  // later"). Read as a client's 4xx, it ended the request though the next target could answer it. Groq answers a 498
  // only to a request on its flex tier: that tier's capacity, not the target's.
  if (status === 498 && errorCode !== null && CAPACITY_CODES.has(errorCode)) return { cls: 'flex-capacity', retryKey: 498, reason };
  if (errorCode !== null && CAPACITY_CODES.has(errorCode)) return { cls: 'overloaded', retryKey: NEVER_RETRY.has(status) ? null : status, reason };
  if (status >= 500) return { cls: 'server-error', retryKey: status, reason };
  if (status >= 400) return { cls: 'client-error', retryKey: NEVER_RETRY.has(status) ? null : status, reason };
  if (status >= 300) return { cls: 'redirect', retryKey: null, reason };
  // A 1xx that ends an exchange from an API endpoint: nothing the client can use; treat like a bad gateway.
  return { cls: 'server-error', retryKey: 502, reason };
}

/** The gateway's process (EMFILE) or the host (ENFILE) has no file descriptor left for a new connection. */
const LOCAL_RESOURCE_CODES: ReadonlySet<string> = new Set(['EMFILE', 'ENFILE']);

/** A connection that could not be made: refused, no route, no DNS answer, no local address. */
export const UNREACHABLE_CODES: ReadonlySet<string> = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH', 'EADDRNOTAVAIL']);

/**
 * A TLS handshake the gateway gave up: the provider's certificate did not verify (OpenSSL's verify codes, as Node names
 * them, and Node's own host name check), the port answered the ClientHello in plain HTTP (an https:// baseUrl on an
 * http server), or the gateway's OpenSSL offers no version the provider speaks (NO_PROTOCOLS_AVAILABLE,
 * UNSUPPORTED_PROTOCOL) or will not talk to a server that old (no secure renegotiation, a weak DH key). Each comes
 * before a byte of the request is sent, and comes again on every attempt.
 */
const TLS_REFUSED_CODES: ReadonlySet<string> = new Set([
  'UNABLE_TO_GET_ISSUER_CERT', 'UNABLE_TO_GET_ISSUER_CERT_LOCALLY', 'UNABLE_TO_VERIFY_LEAF_SIGNATURE', 'DEPTH_ZERO_SELF_SIGNED_CERT',
  'SELF_SIGNED_CERT_IN_CHAIN', 'CERT_HAS_EXPIRED', 'CERT_NOT_YET_VALID', 'ERROR_IN_CERT_NOT_BEFORE_FIELD', 'ERROR_IN_CERT_NOT_AFTER_FIELD',
  'UNABLE_TO_DECRYPT_CERT_SIGNATURE', 'UNABLE_TO_DECODE_ISSUER_PUBLIC_KEY', 'CERT_SIGNATURE_FAILURE', 'CERT_CHAIN_TOO_LONG', 'CERT_REVOKED',
  'INVALID_CA', 'PATH_LENGTH_EXCEEDED', 'INVALID_PURPOSE', 'CERT_UNTRUSTED', 'CERT_REJECTED', 'HOSTNAME_MISMATCH',
  'ERR_TLS_CERT_ALTNAME_INVALID', 'ERR_SSL_WRONG_VERSION_NUMBER', 'ERR_SSL_NO_PROTOCOLS_AVAILABLE', 'ERR_SSL_UNSUPPORTED_PROTOCOL',
  'ERR_SSL_UNSAFE_LEGACY_RENEGOTIATION_DISABLED', 'ERR_SSL_DH_KEY_TOO_SMALL',
]);

/**
 * A TLS alert the provider sent: OpenSSL's reasons for a received alert are exactly those named `sslv3 ...`,
 * `tlsv1 ...` and `tlsv13 ...` (ERR_SSL_TLSV1_ALERT_UNKNOWN_CA; some without ALERT: ERR_SSL_TLSV1_UNRECOGNIZED_NAME,
 * the SNI's). Most say the two ends cannot agree: a client certificate asked for (mutual TLS) that the gateway does not
 * send (TLSV13_ALERT_CERTIFICATE_REQUIRED, or HANDSHAKE_FAILURE before TLS 1.3), no version or cipher in common
 * (PROTOCOL_VERSION, HANDSHAKE_FAILURE, INSUFFICIENT_SECURITY), a host name it does not serve. Read as `network`,
 * each was retried maxAttempts times to the same answer, counted against the breaker, and the client was told the
 * provider "could not be reached".
 */
const TLS_ALERT = /^ERR_SSL_(?:SSLV3|TLSV1|TLSV13)_/;

/**
 * Alerts about this one connection, which the next one may well pass: the provider's own failure (INTERNAL_ERROR,
 * a terminator short of memory or of its key store), a handshake it gave up (USER_CANCELLED, a restart), or a record
 * damaged on the way (BAD_RECORD_MAC, DECRYPTION_FAILED, RECORD_OVERFLOW). They stay network failures.
 */
const TRANSIENT_TLS_ALERTS: ReadonlySet<string> = new Set([
  'ERR_SSL_TLSV1_ALERT_INTERNAL_ERROR', 'ERR_SSL_TLSV1_ALERT_USER_CANCELLED', 'ERR_SSL_SSLV3_ALERT_BAD_RECORD_MAC',
  'ERR_SSL_TLSV1_ALERT_DECRYPTION_FAILED', 'ERR_SSL_TLSV1_ALERT_RECORD_OVERFLOW',
]);

/** A TLS handshake that fails the same way on every attempt, until a certificate or the config changes. */
function refusedTls(code: string): boolean {
  return TLS_REFUSED_CODES.has(code) || (TLS_ALERT.test(code) && !TRANSIENT_TLS_ALERTS.has(code));
}

/** Network errors raised before the request left: nothing reached the provider (refused, no route, no DNS answer, no socket). */
const NOT_SENT_CODES = new Set([...UNREACHABLE_CODES, ...LOCAL_RESOURCE_CODES]);

/**
 * Statuses that may come after the request ran: an error in the middle of processing (500), or a proxy in front of
 * the provider that lost its upstream or gave up waiting for it (502, 504). Cloudflare, in front of several providers,
 * has two more of the kind: 520 (the origin reset the connection or sent an empty or unreadable answer) and 524 (the
 * origin took the connection and sent no answer within 100 s). Its 521, 522 and 523 say it never reached the origin.
 */
const MAY_HAVE_RUN_STATUSES = new Set([500, 502, 504, 520, 524]);

/**
 * The network codes of a tunnel the egress proxy refused (PROXY_407) or closed (PROXY_CLOSED), or of a proxy that
 * could not be reached at all (PROXY_ECONNREFUSED: the errno of the connection to the proxy), start with this.
 */
export const PROXY_REFUSAL = 'PROXY_';

/** The egress proxy refused the way to the provider, or could not be reached: nothing reached the provider. */
export function refusedByProxy(code: string): boolean {
  return code.startsWith(PROXY_REFUSAL);
}

/** The egress proxy itself could not be reached (PROXY_ECONNREFUSED, PROXY_ENOTFOUND, ...), as opposed to one that answered. */
export function proxyUnreachable(code: string): boolean {
  return refusedByProxy(code) && UNREACHABLE_CODES.has(code.slice(PROXY_REFUSAL.length));
}

/**
 * Might the provider have run the request? A timeout after the connection was made, a connection lost after the
 * request was sent, a 500 or a proxy's 502, 504, 520 or 524 say nothing about whether it was processed: sending it
 * again (a retry or a failover) may run it twice. `retryOn` is the route's consent to that, for the next target as for
 * this one.
 */
export function mayHaveRun(outcome: AttemptOutcome): boolean {
  switch (outcome.kind) {
    case 'timeout':
      return outcome.phase !== 'connect';
    case 'network':
      // A TLS refusal comes in the handshake, before the provider reads a byte of the request.
      return !unwritten(outcome.code);
    case 'bad-stream':
      return outcome.ran;
    case 'http':
      return MAY_HAVE_RUN_STATUSES.has(outcome.status);
    default:
      return false;
  }
}

/**
 * Did an attempt reach its provider, as its log record has it (pipeline/target-attempts.ts AttemptRecord: its reason
 * and network code)? Not one whose connection was never made (refused, unreachable, no socket, a TLS handshake
 * refused, the egress proxy's refusal, the connect timer) nor one the gateway could not send: nothing of the request
 * was written, and no provider counts its tokens. A connection lost once the request could be written may have.
 */
export function reachedProvider(attempt: { reason: string; code?: string | undefined }): boolean {
  if (attempt.reason === timeoutReason('connect') || attempt.reason === 'internal') return false;
  return attempt.code === undefined || !unwritten(attempt.code);
}

/**
 * An outcome no byte of the request was written for: the connect timer, a connection refused or unreachable, a TLS
 * handshake or the egress proxy refusing it, a request the gateway could not send (internal). The provider never saw
 * it, so it used none of the provider's rate: the same attempts reachedProvider says did not reach one.
 */
export function neverSent(outcome: AttemptOutcome): boolean {
  if (outcome.kind === 'internal') return true;
  return outcome.kind === 'timeout' ? outcome.phase === 'connect' : outcome.kind === 'network' && unwritten(outcome.code);
}

/** A network error code raised before any of the request was written. */
function unwritten(code: string): boolean {
  return NOT_SENT_CODES.has(code) || refusedTls(code) || refusedByProxy(code);
}

/** May this outcome be retried under the route's `retryOn`? */
export function isRetryable(c: Classification, retryOn: readonly RetryOn[]): boolean {
  return OUTCOME_TABLE[c.cls].retryable && c.retryKey !== null && retryOn.includes(c.retryKey);
}

/**
 * May a failed attempt's request be sent again, as a retry or to the next target? The route's `retryOn` decides
 * (isRetryable), except for a request that commits at the provider as it is taken (`commitsOnSend`: a Responses API
 * request with a `conversation`, whose input the provider appends to it, or with `background: true`, a job that runs
 * on at the provider once queued). Such a request is never sent again after an attempt that may have been taken and
 * got no answer (a timeout once the connection was made, a connection lost once the request was written, a stream
 * broken before its first output, a failed Response: its stream's response.created had begun the answer): the
 * conversation would have the turn twice, or a second job would run. A status the provider answered (a 429, a 5xx)
 * is retried as retryOn says, as it is for any request.
 */
export function maySendAgain(c: Classification, outcome: AttemptOutcome, retryOn: readonly RetryOn[], commitsOnSend: boolean): boolean {
  if (commitsOnSend && (outcome.kind === 'http' ? outcome.created === true : mayHaveRun(outcome))) return false;
  return isRetryable(c, retryOn);
}
