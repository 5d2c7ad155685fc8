import { describe, expect, it } from 'vitest';
import { classify, isOverRateLimitMessage, isRetryable, mayHaveRun, OUTCOME_TABLE, OVER_RATE_LIMIT_CODE, retryReasons, type AttemptOutcome, type TimeoutPhase } from '../src/policy/outcome.ts';
import { errorCodeOf, errorVerdict, httpOutcome } from '../src/providers/error-outcome.ts';
import type { RetryOn } from '../src/config/schema.ts';

const DEFAULT_RETRY_ON: RetryOn[] = [429, 500, 502, 503, 504, 529, 'network', 'timeout'];
const http = (status: number, errorCode: string | null = null, hint?: number): AttemptOutcome => ({
  kind: 'http',
  status,
  errorCode,
  hint: hint === undefined ? undefined : { delayMs: hint, source: 'retry-after', fleetWide: true },
});

describe('the outcome table', () => {
  const cases: Array<[string, AttemptOutcome, string, boolean]> = [
    ['2xx', { kind: 'ok', status: 200 }, 'success', false],
    ['400', http(400, 'invalid_value'), 'client-error', false],
    ['404', http(404), 'client-error', false],
    ['422', http(422), 'client-error', false],
    ['400 context_length_exceeded', http(400, 'context_length_exceeded'), 'context-length', false],
    ['400 content_policy_violation', http(400, 'content_policy_violation'), 'content-policy', false],
    ['401', http(401, 'invalid_api_key'), 'credentials', false],
    ['402', http(402, 'insufficient_quota'), 'credentials', false],
    ['403', http(403), 'credentials', false],
    ['429 insufficient_quota', http(429, 'insufficient_quota'), 'credentials', false],
    ['429 without a hint', http(429, 'rate_limit_exceeded'), 'rate-limited', true],
    ['429 with a hint', http(429, 'rate_limit_exceeded', 1000), 'rate-limited', true],
    ['500', http(500), 'server-error', true],
    ['502', http(502), 'server-error', true],
    ['503', http(503), 'server-error', true],
    ['504', http(504), 'server-error', true],
    ['501 (not in retryOn)', http(501), 'server-error', false],
    ['408 (the provider timed out; not in retryOn)', http(408), 'server-error', false],
    ['529', http(529, 'overloaded_error'), 'overloaded', true],
    // Groq's flex tier at capacity: failed over, retried only where retryOn lists 498; its own class (the tier's, not the target's).
    ['498 capacity_exceeded', http(498, 'capacity_exceeded'), 'flex-capacity', false],
    ['connect error', { kind: 'network', code: 'ECONNREFUSED' }, 'network', true],
    ['certificate the gateway refuses', { kind: 'network', code: 'DEPTH_ZERO_SELF_SIGNED_CERT' }, 'tls', false],
    // The provider's alerts that say the two ends cannot agree: every attempt gets the same one.
    ['client certificate required (mutual TLS)', { kind: 'network', code: 'ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED' }, 'tls', false],
    ['handshake failure alert', { kind: 'network', code: 'ERR_SSL_SSLV3_ALERT_HANDSHAKE_FAILURE' }, 'tls', false],
    ['unknown CA alert', { kind: 'network', code: 'ERR_SSL_TLSV1_ALERT_UNKNOWN_CA' }, 'tls', false],
    ['protocol version alert', { kind: 'network', code: 'ERR_SSL_TLSV1_ALERT_PROTOCOL_VERSION' }, 'tls', false],
    ['unrecognized name alert (SNI)', { kind: 'network', code: 'ERR_SSL_TLSV1_UNRECOGNIZED_NAME' }, 'tls', false],
    ['no TLS version enabled', { kind: 'network', code: 'ERR_SSL_NO_PROTOCOLS_AVAILABLE' }, 'tls', false],
    ['a TLS version the gateway does not speak', { kind: 'network', code: 'ERR_SSL_UNSUPPORTED_PROTOCOL' }, 'tls', false],
    // Alerts about this connection only (the provider's own failure, a record damaged on the way): another may pass.
    ['internal error alert', { kind: 'network', code: 'ERR_SSL_TLSV1_ALERT_INTERNAL_ERROR' }, 'network', true],
    ['user cancelled alert', { kind: 'network', code: 'ERR_SSL_TLSV1_ALERT_USER_CANCELLED' }, 'network', true],
    ['bad record MAC alert', { kind: 'network', code: 'ERR_SSL_SSLV3_ALERT_BAD_RECORD_MAC' }, 'network', true],
    ['connect timeout', { kind: 'timeout', phase: 'connect' }, 'timeout', true],
    ['first-token timeout', { kind: 'timeout', phase: 'first-token' }, 'timeout', true],
    ['malformed stream before output', { kind: 'bad-stream', detail: 'malformed', ran: true }, 'bad-stream', true],
    ['client abort', { kind: 'aborted', by: 'client' }, 'aborted', false],
    ['deadline', { kind: 'aborted', by: 'deadline' }, 'aborted', false],
  ];
  for (const [name, outcome, cls, retryable] of cases) {
    it(`maps ${name} to ${cls}, ${retryable ? 'retryable' : 'not retried'} under the default retryOn`, () => {
      const c = classify(outcome);
      expect(c.cls).toBe(cls);
      expect(isRetryable(c, DEFAULT_RETRY_ON)).toBe(retryable);
    });
  }

  it('never retries 400, 401, 403, 404 or 422 even when retryOn lists them', () => {
    for (const status of [400, 401, 403, 404, 422]) {
      expect(isRetryable(classify(http(status)), [status, 'network'])).toBe(false);
    }
  });

  it('fails a capacity_exceeded over whatever its status, but never retries it on a status that is never retried', () => {
    expect(classify(http(400, 'capacity_exceeded'))).toMatchObject({ cls: 'overloaded', retryKey: null });
    expect(isRetryable(classify(http(498, 'capacity_exceeded')), [...DEFAULT_RETRY_ON, 498])).toBe(true);
  });

  it('retries other 4xx only when retryOn lists them', () => {
    expect(isRetryable(classify(http(409)), DEFAULT_RETRY_ON)).toBe(false);
    expect(isRetryable(classify(http(409)), [...DEFAULT_RETRY_ON, 409])).toBe(true);
  });

  it('retries nothing that retryOn leaves out', () => {
    expect(isRetryable(classify(http(503)), [429])).toBe(false);
    expect(isRetryable(classify({ kind: 'network', code: 'ECONNRESET' }), [503, 'timeout'])).toBe(false);
    expect(isRetryable(classify({ kind: 'timeout', phase: 'idle' }), [503, 'network'])).toBe(false);
  });

  it('hides the provider body of credential errors and passes the client its own mistakes', () => {
    expect(OUTCOME_TABLE.credentials.passThrough).toBe(false);
    expect(OUTCOME_TABLE['client-error'].passThrough).toBe(true);
    expect(OUTCOME_TABLE['content-policy'].passThrough).toBe(true);
  });

  it('gives short, bounded reasons for x-retry-reason and metrics', () => {
    expect(classify(http(503)).reason).toBe('status_503');
    expect(classify({ kind: 'timeout', phase: 'first-token' }).reason).toBe('timeout_first_token');
    expect(classify({ kind: 'network', code: 'ECONNRESET' }).reason).toBe('network');
  });
});

describe('the table\'s failover columns', () => {
  it('ends the request on a safety decision, a thread only the client can replay, a disconnect or a drain; rejects it on the client\'s own mistakes; otherwise hands over', () => {
    const ends = Object.entries(OUTCOME_TABLE).filter(([, row]) => row.failover === 'end').map(([cls]) => cls);
    const rejects = Object.entries(OUTCOME_TABLE).filter(([, row]) => row.failover === 'reject').map(([cls]) => cls);
    expect(ends.sort()).toEqual(['aborted', 'content-policy', 'shutdown', 'thread-state']);
    expect(rejects.sort()).toEqual(['client-error', 'context-length']);
  });

  it('passes on as a verdict exactly the upstream\'s judgements of the request, and only those it passes through', () => {
    const verdicts = Object.entries(OUTCOME_TABLE).filter(([, row]) => row.verdict).map(([cls]) => cls);
    expect(verdicts.sort()).toEqual(['client-error', 'content-policy', 'context-length', 'over-rate-limit', 'thread-state']);
    for (const cls of verdicts) expect(OUTCOME_TABLE[cls as keyof typeof OUTCOME_TABLE].passThrough).toBe(true);
  });

  it('names the gateway\'s own configuration as the fallback reason, and moves on at once only from a silent target', () => {
    expect(OUTCOME_TABLE.credentials.fallback).toBe('credentials');
    expect(OUTCOME_TABLE.redirect.fallback).toBe('redirect');
    expect(OUTCOME_TABLE.timeout.fallback).toBe('timeout');
    expect(OUTCOME_TABLE['server-error'].fallback).toBe('error');
    expect(Object.entries(OUTCOME_TABLE).filter(([, row]) => row.nextFirst).map(([cls]) => cls)).toEqual(['timeout']);
  });
});

describe('the retry reasons a route\'s retryOn allows', () => {
  it('holds every reason classify() gives an outcome that retryOn lets be retried, and nothing else', () => {
    const phases: TimeoutPhase[] = ['connect', 'headers', 'first-token', 'idle', 'response'];
    const outcomes: AttemptOutcome[] = [
      ...[408, 409, 429, 500, 502, 503, 504, 529].map((status) => http(status)),
      ...phases.map((phase): AttemptOutcome => ({ kind: 'timeout', phase })),
      { kind: 'network', code: 'ECONNRESET' },
      { kind: 'network', code: 'EMFILE' },
      { kind: 'bad-stream', detail: 'malformed', ran: true },
    ];
    for (const retryOn of [DEFAULT_RETRY_ON, [429, 408, 409] as RetryOn[], ['network'] as RetryOn[], ['timeout'] as RetryOn[]]) {
      const allowed = new Set(retryReasons(retryOn));
      const retried = new Set(outcomes.map(classify).filter((c) => isRetryable(c, retryOn)).map((c) => c.reason));
      // The idle timer is retryable by class, but runs only after output, when no attempt is retried.
      retried.delete('timeout_idle');
      expect([...allowed].sort(), JSON.stringify(retryOn)).toEqual([...retried].sort());
    }
  });
});

describe('a request the gateway could not send', () => {
  it('is its own fault: never retried, nothing for the breaker or the limit', async () => {
    const { transportOutcome } = await import('../src/providers/transport-errors.ts');
    const outcome = transportOutcome(Object.assign(new Error('invalid authorization header'), { code: 'UND_ERR_INVALID_ARG' }));
    expect(outcome).toEqual({ kind: 'internal', code: 'UND_ERR_INVALID_ARG' });
    const c = classify(outcome);
    expect(isRetryable(c, DEFAULT_RETRY_ON)).toBe(false);
    expect(OUTCOME_TABLE[c.cls]).toMatchObject({ breaker: 'ignore-request', limit: 'none', holdOff: false });
  });
});

describe('transport errors', () => {
  it('reads undici\'s connect timeout as one that never sent, and an ETIMEDOUT (an established connection) as lost', async () => {
    const { transportOutcome } = await import('../src/providers/transport-errors.ts');
    const connect = transportOutcome(Object.assign(new Error('Connect Timeout Error'), { code: 'UND_ERR_CONNECT_TIMEOUT' }));
    expect(connect).toEqual({ kind: 'timeout', phase: 'connect' });
    expect(mayHaveRun(connect)).toBe(false);
    const lost = transportOutcome(Object.assign(new Error('other side closed'), { code: 'UND_ERR_SOCKET', cause: Object.assign(new Error('read ETIMEDOUT'), { code: 'ETIMEDOUT' }) }));
    expect(lost).toEqual({ kind: 'network', code: 'ETIMEDOUT' });
    expect(mayHaveRun(lost)).toBe(true);
  });
});

describe('an attempt cut short by the instance\'s own shutdown', () => {
  it('says nothing to the breaker, however long it ran: a drain must not open a breaker the fleet shares', () => {
    const c = classify({ kind: 'aborted', by: 'shutdown' });
    expect(c.cls).toBe('shutdown');
    expect(OUTCOME_TABLE[c.cls]).toMatchObject({ retryable: false, breaker: 'ignore' });
    expect(OUTCOME_TABLE[classify({ kind: 'aborted', by: 'deadline' }).cls].breaker).toBe('slow-call');
  });
});

describe('an outcome the provider may already have run', () => {
  it('is a timeout after connecting, a connection lost after sending, a stream that had started, a 500 or a proxy\'s 502/504; never a refusal, a 503 or a 429', () => {
    const cases: Array<[AttemptOutcome, boolean]> = [
      [{ kind: 'timeout', phase: 'first-token' }, true],
      [{ kind: 'timeout', phase: 'headers' }, true],
      [{ kind: 'timeout', phase: 'response' }, true],
      [{ kind: 'timeout', phase: 'connect' }, false],
      [{ kind: 'network', code: 'ECONNRESET' }, true],
      [{ kind: 'network', code: 'UNKNOWN' }, true],
      [{ kind: 'network', code: 'ECONNREFUSED' }, false],
      [{ kind: 'network', code: 'ENOTFOUND' }, false],
      [{ kind: 'network', code: 'ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED' }, false],
      [{ kind: 'network', code: 'ERR_SSL_TLSV1_ALERT_INTERNAL_ERROR' }, true],
      [{ kind: 'bad-stream', detail: 'stream ended before any output', ran: true }, true],
      // A proxy's HTML page or an error delivered with a 200 is no run of the request.
      [{ kind: 'bad-stream', detail: 'the upstream answered text/html, not JSON', ran: false }, false],
      [{ kind: 'http', status: 500, errorCode: null, hint: undefined }, true],
      [{ kind: 'http', status: 502, errorCode: null, hint: undefined }, true],
      [{ kind: 'http', status: 504, errorCode: null, hint: undefined }, true],
      [{ kind: 'http', status: 503, errorCode: null, hint: undefined }, false],
      [{ kind: 'http', status: 429, errorCode: 'rate_limit_exceeded', hint: undefined }, false],
      [{ kind: 'internal', code: 'ERR_INVALID_CHAR' }, false],
    ];
    for (const [outcome, expected] of cases) expect(mayHaveRun(outcome), JSON.stringify(outcome)).toBe(expected);
  });
});

describe('a request larger than the whole token limit', () => {
  const openai =
    'Request too large for gpt-4o in organization org-abc on tokens per min (TPM): Limit 30000, Requested 36278. The input or output tokens must be reduced in order to run successfully. Visit https://platform.openai.com/account/rate-limits to learn more.';
  const groq = 'Request too large for model `llama-3.1-70b-versatile` in organization `org_01` service tier `on_demand` on tokens per minute (TPM): Limit 6000, Requested 7431, please reduce your message size and try again.';

  it("is told by OpenAI's and Groq's words, and only when the request is over the limit", () => {
    expect(isOverRateLimitMessage(openai)).toBe(true);
    expect(isOverRateLimitMessage(groq)).toBe(true);
    expect(isOverRateLimitMessage('Request too large for gpt-4o on tokens per day (TPD): Limit 90000, Requested 95000.')).toBe(true);
    // A rate limit the request would fit once the window moves on: waiting helps.
    expect(isOverRateLimitMessage('Rate limit reached for gpt-4o in organization org-abc on tokens per min (TPM): Limit 30000, Used 29000, Requested 2000.')).toBe(false);
    expect(isOverRateLimitMessage('Request too large for gpt-4o on tokens per min (TPM): Limit 30000, Requested 30000.')).toBe(false);
    // Quoted, not said: a message that merely contains the words.
    expect(isOverRateLimitMessage(`upstream said: ${openai}`)).toBe(false);
  });

  it('is neither retried nor a hold-off nor a cut of the limit, and moves on to the next target', () => {
    for (const status of [429, 413]) {
      const c = classify({ kind: 'http', status, errorCode: OVER_RATE_LIMIT_CODE, hint: { delayMs: 20_000, source: 'retry-after', fleetWide: true } });
      expect(c).toEqual({ cls: 'over-rate-limit', retryKey: null, reason: 'request_over_rate_limit' });
      expect(isRetryable(c, [...DEFAULT_RETRY_ON, 413])).toBe(false);
      expect(OUTCOME_TABLE[c.cls]).toMatchObject({ holdOff: false, limit: 'none', breaker: 'ignore-request', failover: 'next', passThrough: true });
    }
  });

  it("is read from the error body whatever code it names, and from an error inside a 2xx (the Responses API's response.failed)", () => {
    const body = (status: number) => errorCodeOf(status, Buffer.from(JSON.stringify({ error: { message: openai, type: 'tokens', param: null, code: 'rate_limit_exceeded' } })));
    expect(body(429)).toBe(OVER_RATE_LIMIT_CODE);
    expect(body(413)).toBe(OVER_RATE_LIMIT_CODE);
    expect(body(400)).toBe('rate_limit_exceeded');
    // Its retry-after is a rate limit's habit, after which the request fits no better: no hint.
    const whole = Buffer.from(JSON.stringify({ error: { message: openai, type: 'tokens', param: null, code: 'rate_limit_exceeded' } }));
    expect(httpOutcome(429, { 'retry-after': '20' }, whole, 0)).toEqual({ kind: 'http', status: 429, errorCode: OVER_RATE_LIMIT_CODE, hint: undefined });
    const v = errorVerdict({ code: 'rate_limit_exceeded', message: openai, type: undefined, param: null }, 'response.failed', '');
    expect(v.outcome).toMatchObject({ kind: 'http', status: 429, errorCode: OVER_RATE_LIMIT_CODE });
    expect(errorVerdict({ code: 'rate_limit_exceeded', message: 'Rate limit reached for gpt-4o', type: undefined, param: null }, 'response.failed', '').outcome).toMatchObject({ errorCode: 'rate_limit_exceeded' });
  });
});

describe("the upstream's own x-should-retry", () => {
  const said = (status: number, shouldRetry: boolean, errorCode: string | null = null): AttemptOutcome => ({ kind: 'http', status, errorCode, hint: undefined, shouldRetry });
  const body = Buffer.from(JSON.stringify({ error: { message: 'busy', type: 'server_error', param: null, code: null } }));

  it('is read from an error answer as the SDKs read it: "true" or "false", anything else is not said', () => {
    expect(httpOutcome(503, { 'x-should-retry': 'false' }, body, 0)).toMatchObject({ kind: 'http', status: 503, shouldRetry: false });
    expect(httpOutcome(409, { 'x-should-retry': 'true' }, body, 0)).toMatchObject({ kind: 'http', status: 409, shouldRetry: true });
    expect(httpOutcome(503, { 'x-should-retry': ['false', 'true'] }, body, 0)).toMatchObject({ shouldRetry: false });
    for (const value of [undefined, 'False', 'yes', '']) expect(httpOutcome(503, value === undefined ? {} : { 'x-should-retry': value }, body, 0)).not.toHaveProperty('shouldRetry');
  });

  it('"false" marks the classification as no retry on this target, keeping its class, retry key and reason (so failover is unchanged)', () => {
    for (const [status, code] of [[503, null], [500, null], [429, 'rate_limit_exceeded'], [529, 'overloaded_error'], [409, null]] as const) {
      const plain = classify(http(status, code));
      const told = classify(said(status, false, code));
      expect(told).toEqual({ ...plain, upstreamNoRetry: true });
      // retryOn's consent, which failover of an outcome that may have run goes by, is the operator's and stays.
      expect(isRetryable(told, [...DEFAULT_RETRY_ON, 409])).toBe(isRetryable(plain, [...DEFAULT_RETRY_ON, 409]));
    }
  });

  it('"true" adds no retry: a status retryOn leaves out, or one never retried, stays unretried', () => {
    for (const status of [409, 408, 400, 404, 501]) {
      const told = classify(said(status, true));
      expect(told).toEqual(classify(http(status)));
      expect(isRetryable(told, DEFAULT_RETRY_ON)).toBe(false);
    }
    expect(isRetryable(classify(said(400, true)), [400])).toBe(false);
  });
});
