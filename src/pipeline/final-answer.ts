// What the client gets when no target produced an answer: the upstream's own error when the client's request was
// at fault (or the upstream's last status after retries), else the gateway's error naming what happened.
import { GatewayError, normaliseUpstreamErrorBody, retryHeaders, type OpenAIErrorBody } from '../errors.ts';
import { OUTCOME_TABLE, PROXY_REFUSAL, proxyUnreachable, REGION_REFUSED_CODE, refusedByProxy, type Classification } from '../policy/outcome.ts';
import { proxyHost } from '../providers/egress-proxy.ts';
import { forwardedResponseHeaders } from '../providers/headers.ts';
import { withoutKey } from '../providers/key-echo.ts';
import { printable } from '../http/request-body.ts';
import type { AttemptResult } from './attempt.ts';
import { firstHeader } from '../header-bag.ts';

export interface ErrorAnswer {
  status: number;
  headers: Record<string, string>;
  body: OpenAIErrorBody;
}

/** What the last failure's answer is built from (not breaker-board.ts's FailureFacts, an attempt's reason for its log line). */
interface FinalFailure {
  result: AttemptResult;
  cls: Classification;
  retryAfterMs: number | undefined;
  /** The retry budget refused the retry that would have come next: said in the gateway's own message. */
  budgetSpent?: boolean;
  /** The provider's pool had no slot for the retry that would have come next before the deadline: said in the message too. */
  retryShed?: boolean;
  /**
   * The request went upstream once and its retries stopped at a wait hint the gateway would not wait out (longer than
   * maxWaitHintMs or the time left): the client may come back after it, as every request the hold-off turns away is
   * told (x-should-retry: true up to 60 s). Told not to, the SDK gave up on a 429 the provider asked to retry in 2 s.
   */
  invite?: boolean;
  /** Attempts per target, in the order the targets were first tried (probes included). */
  attempts: ReadonlyArray<readonly [target: string, count: number]>;
  /** The target that failed last. */
  target: string;
  budgetMs: number;
  /** The key the failing target was sent, kept out of the upstream headers passed on. */
  apiKey?: string;
  /** The failing target's egress proxy (`providers.<name>.proxy`), named by host:port when it could not be reached. */
  proxy?: string;
}

export function failureAnswer(f: FinalFailure): ErrorAnswer {
  const { outcome } = f.result;
  if (outcome.kind === 'http' && OUTCOME_TABLE[f.cls.cls].passThrough) {
    const upstreamHeaders = f.result.headers ? forwardedResponseHeaders(f.result.headers, f.apiKey) : {};
    delete upstreamHeaders['content-type'];
    return {
      status: outcome.status,
      headers: { ...upstreamHeaders, ...retryHeaders(f.invite === true, f.retryAfterMs) },
      body: normaliseUpstreamErrorBody(outcome.status, f.result.body),
    };
  }
  return errorAnswer(gatewayErrorFor(f));
}

export function errorAnswer(err: GatewayError): ErrorAnswer {
  return { status: err.status, headers: retryHeaders(err.shouldRetry, err.retryAfterMs), body: err.toBody() };
}

/** Attempts per target, counted from the request's attempt records. */
export function attemptsByTarget(records: ReadonlyArray<{ target: string }>): Array<[string, number]> {
  const counts = new Map<string, number>();
  for (const r of records) counts.set(r.target, (counts.get(r.target) ?? 0) + 1);
  return [...counts];
}

/** "1 attempt", "3 attempts". */
function attemptCount(n: number): string {
  return `${n} attempt${n === 1 ? '' : 's'}`;
}

/** "3 attempts": the attempts on `target`, the one named in the message. */
function attemptsOn(attempts: FinalFailure['attempts'], target: string): string {
  return attemptCount(attempts.find(([t]) => t === target)?.[1] ?? 0);
}

function totalOf(attempts: FinalFailure['attempts']): number {
  return attempts.reduce((n, [, c]) => n + c, 0);
}

/** "a 2, b 3": attempts per target. */
function perTarget(attempts: FinalFailure['attempts']): string {
  return attempts.map(([t, c]) => `${t} ${c}`).join(', ');
}

/** "; 5 attempts in all: a 2, b 3" when other targets were tried too, else nothing. */
function allAttempts(attempts: FinalFailure['attempts']): string {
  return attempts.length < 2 ? '' : `; ${totalOf(attempts)} attempts in all: ${perTarget(attempts)}`;
}

function gatewayErrorFor(f: FinalFailure): GatewayError {
  const tried = attemptsOn(f.attempts, f.target);
  // Why one attempt and no more: a retry budget spent by a fleet-wide failure, not a bug in the retry policy.
  const all = `${allAttempts(f.attempts)}${f.budgetSpent ? '; not retried: the retry budget is spent' : ''}${f.retryShed ? "; not retried: the provider's pool had no slot for a retry before the deadline" : ''}`;
  const { outcome } = f.result;
  const opts = { retryAfterMs: f.retryAfterMs };
  switch (outcome.kind) {
    case 'http':
      if (f.cls.cls === 'redirect') {
        return new GatewayError(
          'upstream_redirect',
          `provider target ${f.target} answered a redirect (${outcome.status}, ${locationOf(f.result.headers, f.apiKey)}), which the gateway does not follow; check that provider's baseUrl (http instead of https? a host that moved?)${all}`,
        );
      }
      // Otherwise only credential problems get here: the provider's body may echo part of the key, so it is never passed
      // on; nor its retry-after, since no wait mends a key or a bill.
      return new GatewayError('upstream_auth_error', `provider target ${f.target} ${refused(f.cls.reason)}; this is a gateway ${setupOf(f.cls.reason)} problem, not the request's`);
    case 'network':
      if (f.cls.cls === 'local-resource') {
        return new GatewayError(
          'upstream_unavailable',
          `the gateway has no file descriptor left to connect to ${f.target} (${outcome.code}) after ${tried}; raise the gateway's open-files limit (ulimit -n, LimitNOFILE, the container's nofile): each stream holds two${all}`,
          opts,
        );
      }
      if (f.cls.cls === 'tls') {
        // The code alone: Node's message quotes the certificate's names, which are the operator's to look up.
        return new GatewayError('upstream_unavailable', `the TLS handshake with upstream ${f.target} failed after ${tried} (${outcome.code}): ${tlsFix(outcome.code)}${all}`, opts);
      }
      if (proxyUnreachable(outcome.code) && f.proxy) {
        return new GatewayError(
          'upstream_unavailable',
          `the egress proxy ${proxyHost(f.proxy)} could not be reached for upstream ${f.target} after ${tried} (last: ${outcome.code.slice(PROXY_REFUSAL.length)}); check that provider's proxy URL and that the proxy runs${all}`,
          opts,
        );
      }
      if (refusedByProxy(outcome.code)) {
        return new GatewayError(
          'upstream_unavailable',
          `the egress proxy refused to connect to upstream ${f.target} after ${tried} (last: ${outcome.code}; 407: the proxy refused the credentials in the provider's proxy URL, 403: it does not allow that host, 502 or 503: it could not reach it)${all}`,
          opts,
        );
      }
      return new GatewayError('upstream_unavailable', `upstream ${f.target} could not be reached after ${tried} (last: ${outcome.code})${all}`, opts);
    case 'timeout':
      return new GatewayError('upstream_timeout', `upstream ${f.target} timed out after ${tried} (last: ${outcome.phase.replace('-', ' ')} timeout)${all}`, opts);
    case 'internal':
      return new GatewayError(
        'internal_error',
        `the gateway could not send the request to ${f.target} (${outcome.code}); check that provider's configuration (a key or header value with a line break?)${all}`,
        opts,
      );
    case 'bad-stream':
      return new GatewayError('upstream_bad_response', `upstream ${f.target} gave no usable answer after ${tried} (last: ${outcome.detail})${all}`, opts);
    case 'aborted': {
      const where = f.attempts.length < 2 ? '' : `; ${perTarget(f.attempts)}`;
      return new GatewayError('deadline_exceeded', `the request's deadline of ${f.budgetMs} ms passed after ${attemptCount(totalOf(f.attempts))} (last target: ${f.target}${where})`, opts);
    }
    case 'ok':
      return new GatewayError('internal_error', 'a successful attempt was treated as a failure', opts);
  }
}

/** The alerts of a provider that wants a client certificate (mutual TLS): none sent, or (in principle) one refused. */
const CLIENT_CERT_ALERT = /_ALERT_(?:NO_CERTIFICATE|BAD_CERTIFICATE|UNSUPPORTED_CERTIFICATE|CERTIFICATE_\w+|UNKNOWN_CA|ACCESS_DENIED)$/;
/** No TLS version or cipher both ends accept, or a server too old for the gateway's OpenSSL: the provider's alert or the gateway's own refusal. */
const NO_COMMON_TLS = /_ALERT_(?:PROTOCOL_VERSION|INSUFFICIENT_SECURITY)$|^ERR_SSL_(?:NO_PROTOCOLS_AVAILABLE|UNSUPPORTED_PROTOCOL|UNSAFE_LEGACY_RENEGOTIATION_DISABLED|DH_KEY_TOO_SMALL)$/;
const NO_CLIENT_CERT = 'a client certificate (mutual TLS), which the gateway does not send';
const NO_COMMON_TLS_TEXT = "no TLS version or cipher with the gateway (which offers TLS 1.2 and 1.3, Node's defaults)";

/** What to check for a TLS handshake that failed by `code`: the baseUrl, the CA the gateway trusts, or the provider's TLS settings. */
function tlsFix(code: string): string {
  if (code === 'ERR_SSL_WRONG_VERSION_NUMBER') return "its port does not speak TLS: check that provider's baseUrl (https:// for a plain http:// server?)";
  if (CLIENT_CERT_ALERT.test(code)) return `the provider asks for ${NO_CLIENT_CERT}: let it accept the gateway without one, or reach it through a sidecar that presents one`;
  // Before TLS 1.3 a missing client certificate is refused with this alert too: it cannot tell the two apart.
  if (code === 'ERR_SSL_SSLV3_ALERT_HANDSHAKE_FAILURE') return `the provider refused the handshake: it may ask for ${NO_CLIENT_CERT}, or share ${NO_COMMON_TLS_TEXT}`;
  if (NO_COMMON_TLS.test(code)) return `the provider shares ${NO_COMMON_TLS_TEXT}: its TLS settings are what to change`;
  if (code.startsWith('ERR_SSL_')) return "the provider refused the handshake with that alert: check its TLS settings and the host name in that provider's baseUrl";
  return "for a provider behind a private CA, give its CA in that provider's tls.caFile; an expired certificate, or one for another host name, is the provider's to fix";
}

/**
 * Where a redirect pointed, for the operator who fixes the baseUrl: host and path only (a query or a user:password
 * part may hold a token), without the provider's key (a server may redirect to a URL with it in the path), printable.
 */
function locationOf(headers: AttemptResult['headers'], apiKey: string | undefined): string {
  const value = headers === undefined ? undefined : firstHeader(headers, 'location');
  if (typeof value !== 'string' || value.trim() === '') return 'no location given';
  const clean = apiKey === undefined ? value.trim() : withoutKey(value.trim(), apiKey);
  let shown: string;
  try {
    const url = new URL(clean);
    shown = `${url.host}${url.pathname}`;
  } catch {
    // A relative location (`/v2/chat/completions`): the provider's own host.
    shown = clean.split(/[?#]/, 1)[0]!;
  }
  return `location ${printable(shown, 200)}`;
}

/**
 * A target that cannot take the request now. A breaker is the provider's problem: x-should-retry stays false. A
 * hold-off is a window the gateway knows the end of: the SDK is invited back when that is at most 60 s away.
 * `retryAfterMs` is what the provider asked for (HoldOffs.askedUntil); `holdOffMs`, when shorter, is when the gateway
 * asks it again (a hold-off is capped at a minute): the client is told the provider's word, and not invited back.
 */
export function unavailableAnswer(u: { reason: 'breaker' | 'hold-off'; target: string; retryAfterMs: number; holdOffMs?: number; toldMs?: number }): ErrorAnswer {
  // A window that ends as the answer is written is no invitation to come back at once (`retry-after: 0`), nor
  // "retry in 0 s": at least 100 ms, as a shed request is told.
  const retryAfterMs = Math.max(100, u.retryAfterMs);
  const seconds = Math.ceil(retryAfterMs / 1000);
  if (u.reason === 'breaker') {
    return errorAnswer(new GatewayError('circuit_open', `target ${u.target} is unavailable: its circuit breaker is open; retry in ${seconds} s`, { retryAfterMs }));
  }
  // Against the unclamped wait: a hold-off that ends now is no capped one that "asks it again in 0 s".
  const again = u.holdOffMs !== undefined && u.holdOffMs < u.retryAfterMs ? ` (the gateway asks it again in ${Math.ceil(u.holdOffMs / 1000)} s)` : '';
  // The retry-after sent is `toldMs` when given: the hold-off's end plus a spread of the request's own (toldPastHoldOff).
  const told = Math.max(retryAfterMs, u.toldMs ?? 0);
  return errorAnswer(new GatewayError('provider_held_off', `target ${u.target} asked for no requests for another ${seconds} s${again}`, { retryAfterMs: told, shouldRetry: true }));
}

/**
 * The provider refused the gateway's credentials moments ago and the hold (authHoldS) is still on: answered at once,
 * without retry-after or an invitation to retry, since only a fix of the gateway's configuration helps.
 */
export function authHeldAnswer(u: { target: string; remainingMs: number; reason: string | undefined }): ErrorAnswer {
  const seconds = Math.ceil(u.remainingMs / 1000);
  return errorAnswer(
    new GatewayError('upstream_auth_error', `provider target ${u.target} ${refused(u.reason)} and is not used for another ${seconds} s; this is a gateway ${setupOf(u.reason)} problem, not the request's`),
  );
}

/**
 * What the provider refused of the gateway's own, with the reason's code when it is known (one of the outcome table's
 * fixed codes, never the provider's words): a location it does not serve is where the gateway calls from, and told
 * "credentials or billing" the operator went looking at a key that was fine.
 */
function refused(reason: string | undefined): string {
  if (reason === REGION_REFUSED_CODE) return `does not serve the location the gateway calls from (${reason})`;
  return `rejected the gateway's credentials or billing${reason === undefined ? '' : ` (${reason})`}`;
}

/** What the operator fixes: where the gateway is deployed (its egress), or its configuration (a key, a bill). */
function setupOf(reason: string | undefined): string {
  return reason === REGION_REFUSED_CODE ? 'deployment' : 'configuration';
}

/**
 * Every target was skipped because its family cannot express the request as sent (messages that are not a list,
 * `n` > 1 for Anthropic, ...): the client can change that, so it is a 400 with the reasons, not a gateway failure.
 */
export function inexpressibleAnswer(route: string, skips: ReadonlyArray<{ target: string; reason: string; param?: string }>): ErrorAnswer {
  const why = skips.map((s) => `${s.target}: ${s.reason}`).join('; ');
  const param = skips.find((s) => s.param !== undefined)?.param ?? null;
  return errorAnswer(new GatewayError('invalid_body', `no target of route ${route} can take this request as sent: ${why}`, { param }));
}

/** Appends the fallback's rejection to the earlier target's failure: both facts reach the client, the outage first. */
export function withRejectionNote(answer: ErrorAnswer, rejection: { target: string; result: AttemptResult }): ErrorAnswer {
  const { outcome } = rejection.result;
  const status = outcome.kind === 'http' ? outcome.status : 400;
  const why = normaliseUpstreamErrorBody(status, rejection.result.body).error.message;
  return withNote(answer, `the fallback ${rejection.target} rejected the request (${status}: ${truncate(why, 300)})`);
}

/**
 * Names the other targets the request never reached and why (a family that cannot express it, an open breaker): a
 * client told only of the primary's outage would not know its request could not have been failed over as sent.
 */
export function withSkipNote(answer: ErrorAnswer, answeredBy: string, skipped: ReadonlyArray<{ target: string; reason: string }>): ErrorAnswer {
  const others = skipped.filter((s) => s.target !== answeredBy);
  if (others.length === 0) return answer;
  return withNote(answer, `not tried: ${others.map((s) => `${s.target} (${truncate(s.reason, 200)})`).join(', ')}`);
}

function withNote(answer: ErrorAnswer, note: string): ErrorAnswer {
  // Not `replace(/\.?\s*$/, '')`: that retries the whitespace from every position of a run, and an upstream message
  // with 50 KB of spaces inside took seconds.
  const trimmed = answer.body.error.message.trimEnd();
  const message = trimmed.endsWith('.') ? trimmed.slice(0, -1) : trimmed;
  return { ...answer, body: { error: { ...answer.body.error, message: `${message}; ${note}` } } };
}

function truncate(s: string, max: number): string {
  return s.length <= max ? s : `${s.slice(0, max - 1)}…`;
}
