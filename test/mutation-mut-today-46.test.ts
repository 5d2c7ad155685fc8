// Mutation round 46 on three modules no earlier round had mutated on their own: policy/wait-hint.ts (retry-after-ms,
// retry-after seconds and HTTP-dates, anthropic-ratelimit-*-reset RFC 3339, x-ratelimit-reset-* Go durations, Google's
// RetryInfo), providers/error-outcome.ts (what an upstream error body means: its code, hint, account refusal) and
// streaming/sse-parser.ts (the SSE framing). 110 hand mutants: 77 killed by the existing files, 24 killed here,
// 9 equivalent, 0 open (wait hints 46: 41/1/4; error outcome 35: 17/16/2; SSE parser 29: 19/7/3).
// Killed here, wait hints: an IMF-fixdate with text after its GMT.
// Killed here, error outcome: Google's unknown-key 401 from any status, from any detail with that reason; the body's
// RetryInfo taken over the header's retry-after; a 404's param at any status, `model` or "" as a param; refusal words
// and moderation metadata read as a content policy at any status, OpenRouter's reasons or flagged_input alone not
// enough, a null metadata thrown on; xAI's spent-credits words at any status; accountErrorOf's code after its type, its
// type ignored; errorVerdict's account code after its type, the code an over-long prompt's words gave put in the body,
// an over-rate-limit message renaming a 400's code.
// Killed here, SSE parser: CRLF then LF not an event end (its CR kept in the raw text), an unended event of exactly the
// limit refused, an oversized read given up one read late, a cut last character dropped at flush, every leading space
// stripped, a character split across reads broken, a line without a colon not read as a field.
// Equivalent, wait hints: tokenRoomHint's "no remaining header, no hint" (its one caller, httpOutcome, asks it only when
// parseWaitHint found none, which with no remaining headers already weighed every reset); utcMs's day check and its
// month > 11 check (a day or month out of range always moves the month or the year, which the round trip checks); an
// unknown Go unit read as 0 (the grammar admits only known units).
// Equivalent, error outcome: the empty-body shortcut (JSON.parse throws on it, caught the same); `param ?? null` in
// errorVerdict (UpstreamStreamError's param is string | null, never undefined).
// Equivalent, SSE parser: the comment-line skip (a leading colon makes an empty field name, ignored anyway); the text
// dropped in #giveUp and the state reset in flush (after either the parser is never read again).
// No bugs found.
// Pure functions and a parser, called directly with fixed clocks: every value is exact.
import { describe, expect, it } from 'vitest';
import { parseRetryAfterMs, parseWaitHint } from '../src/policy/wait-hint.ts';
import { accountErrorOf, errorCodeOf, errorVerdict, httpOutcome } from '../src/providers/error-outcome.ts';
import { MAX_EVENT_BYTES, SseEventTooLarge, SseParser } from '../src/streaming/sse-parser.ts';

const now = Date.UTC(2015, 9, 21, 7, 28, 0); // Wed, 21 Oct 2015 07:28:00 GMT
const json = (value: unknown) => Buffer.from(JSON.stringify(value));

describe('wait hints', () => {
  it('refuses an IMF-fixdate with anything after its GMT', () => {
    expect(parseRetryAfterMs('Wed, 21 Oct 2015 07:28:30 GMT', now)).toBe(30_000);
    expect(parseRetryAfterMs('Wed, 21 Oct 2015 07:28:30 GMT+0100', now)).toBeUndefined();
    expect(parseWaitHint({ 'retry-after': 'Wed, 21 Oct 2015 07:28:30 GMTX' }, now)).toBeUndefined();
  });
});

describe('httpOutcome', () => {
  const retryInfo = (delay: string) => ({ '@type': 'type.googleapis.com/google.rpc.RetryInfo', retryDelay: delay });

  it("reads Google's unknown-key refusal as the gateway's 401 only from a 400", () => {
    const details = [{ '@type': 'type.googleapis.com/google.rpc.ErrorInfo', reason: 'API_KEY_INVALID', domain: 'googleapis.com' }];
    const body = (code: number, status: string) => json({ error: { code, message: 'API key not valid. Please pass a valid API key.', status, details } });
    expect(httpOutcome(400, {}, body(400, 'INVALID_ARGUMENT'), now)).toMatchObject({ status: 401, errorCode: 'invalid_api_key' });
    // A 503 that carries the same detail is the provider's outage, retried as one: not a refused key.
    expect(httpOutcome(503, {}, body(503, 'UNAVAILABLE'), now)).toMatchObject({ status: 503 });
  });

  it("takes a header's wait over the body's RetryInfo when both came", () => {
    const body = json({ error: { code: 429, message: 'Resource has been exhausted', status: 'RESOURCE_EXHAUSTED', details: [retryInfo('29s')] } });
    expect(httpOutcome(429, { 'retry-after': '5' }, body, now)).toMatchObject({ hint: { delayMs: 5000, source: 'retry-after', fleetWide: true } });
    expect(httpOutcome(429, {}, body, now)).toMatchObject({ hint: { delayMs: 29_000, source: 'retry-info', fleetWide: false } });
  });

  it('names the field of a 404 only, and never when it is the model', () => {
    const body = (status: number, param: string, code: string) => json({ error: { message: 'no', type: 'invalid_request_error', param, code, status } });
    expect(httpOutcome(404, {}, body(404, 'previous_response_id', 'previous_response_not_found'), now)).toMatchObject({ status: 404, param: 'previous_response_id' });
    expect(httpOutcome(404, {}, body(404, 'model', 'model_not_found'), now)).not.toHaveProperty('param');
    // An empty param (some compatible servers send "param": "") names nothing: the model is what was not found.
    expect(httpOutcome(404, {}, body(404, '', 'model_not_found'), now)).not.toHaveProperty('param');
    expect(httpOutcome(400, {}, body(400, 'messages', 'invalid_value'), now)).not.toHaveProperty('param');
  });
});

describe('errorCodeOf', () => {
  const code = (status: number, error: Record<string, unknown>) => errorCodeOf(status, json({ error }));

  it("reads OpenRouter's 403 moderation flag from its reasons, or from its flagged input, alone", () => {
    expect(code(403, { code: 403, message: 'Input was flagged', metadata: { reasons: ['violence'] } })).toBe('content_policy_violation');
    expect(code(403, { code: 403, message: 'Input was flagged', metadata: { flagged_input: 'how do I ...' } })).toBe('content_policy_violation');
    expect(code(403, { code: 403, message: 'Input was flagged', metadata: { provider_name: 'x' } })).not.toBe('content_policy_violation');
    // A null metadata (JSON's "no metadata") is read as none, not thrown on.
    expect(code(403, { type: 'permission_error', message: 'Forbidden', metadata: null })).toBe('permission_error');
  });

  it('reads a moderation flag or refusal words as a content policy only on a 403', () => {
    // A 503 is the provider's outage whatever its body carries: retried, never the request's fault.
    expect(code(503, { type: 'server_error', message: 'Upstream unavailable', metadata: { reasons: ['overloaded'] } })).toBe('server_error');
    expect(code(503, { type: 'server_error', message: 'Content violates usage guidelines. Team: x' })).toBe('server_error');
  });

  it("reads xAI's spent-credits words as the account's only on a 429", () => {
    const spent = 'Your team abc has either used all available credits or reached its monthly spending limit.';
    expect(code(429, { code: 'rate_limit', message: spent })).toBe('insufficient_quota');
    expect(code(503, { type: 'server_error', message: spent })).toBe('server_error');
  });
});

describe('accountErrorOf: an error in a 200 that names the gateway account', () => {
  it('names it by its code before its type, and by its type alone', () => {
    expect(accountErrorOf(json({ error: { message: 'Incorrect API key provided', type: 'invalid_request_error', code: 'invalid_api_key' } })))
      .toEqual({ status: 401, code: 'invalid_api_key' });
    // Anthropic's shape, read in OpenAI terms: only a type.
    expect(accountErrorOf(json({ error: { type: 'authentication_error', message: 'invalid x-api-key' } }))).toEqual({ status: 401, code: 'authentication_error' });
    expect(accountErrorOf(json({ error: { type: 'billing_error', message: 'credit balance too low' } }))).toEqual({ status: 402, code: 'billing_error' });
    expect(accountErrorOf(json({ error: { type: 'invalid_request_error', code: 'invalid_value', message: 'no' } }))).toBeUndefined();
  });
});

describe("Google's unknown-key refusal", () => {
  it('is read from an ErrorInfo detail, not from any detail with that reason', () => {
    const body = (type: string) => json({ error: { code: 400, status: 'INVALID_ARGUMENT', message: 'Invalid request', details: [{ '@type': type, reason: 'API_KEY_INVALID' }] } });
    expect(httpOutcome(400, {}, body('type.googleapis.com/google.rpc.ErrorInfo'), now)).toMatchObject({ status: 401 });
    expect(httpOutcome(400, {}, body('type.googleapis.com/google.rpc.BadRequest'), now)).toMatchObject({ status: 400 });
  });
});

describe('errorVerdict: an error inside a 2xx', () => {
  it("names the gateway account's refusal by its code before its type", () => {
    const v = errorVerdict({ code: 'invalid_api_key', type: 'invalid_request_error', message: 'Incorrect API key provided', param: null }, 'an error event', '');
    expect(v.outcome).toEqual({ kind: 'http', status: 401, errorCode: 'invalid_api_key', hint: undefined });
    expect(errorVerdict({ code: undefined, type: 'authentication_error', message: 'invalid x-api-key', param: null }, 'an error event', '').outcome)
      .toMatchObject({ status: 401, errorCode: 'authentication_error' });
  });

  it('passes an over-long prompt told by its words on with the code it came with (none)', () => {
    const message = "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens (8000 in the messages, 1000 in the completion).";
    const v = errorVerdict({ code: undefined, type: undefined, message, param: null }, 'an error event', '');
    expect(v.outcome).toMatchObject({ status: 400, errorCode: 'context_length_exceeded' });
    expect(JSON.parse(v.answer!.toString()).error).toEqual({ message, type: 'invalid_request_error', param: null, code: null });
  });

  it('names a request over the rate limit only in a 429, not in the 400 another code stands for', () => {
    const message = 'Request too large for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Requested 50000.';
    expect(errorVerdict({ code: 'context_length_exceeded', type: undefined, message, param: null }, 'response.failed', '').outcome)
      .toMatchObject({ status: 400, errorCode: 'context_length_exceeded' });
  });
});

describe('the SSE parser', () => {
  const bytes = (s: string) => Buffer.from(s);

  it('holds an unended event of exactly the limit, and frames it when its end comes', () => {
    const p = new SseParser();
    expect(p.push(bytes(`data: ${'a'.repeat(MAX_EVENT_BYTES - 6)}`))).toEqual([]);
    const [event] = p.push(bytes('\n\n'));
    expect(event!.data!.length).toBe(MAX_EVENT_BYTES - 6);
  });

  it('ends an event at CRLF then LF without keeping the CR in its text', () => {
    const p = new SseParser();
    expect(p.push(bytes('data: {"a":1}\r\n\n: ping\r\n\n'))).toEqual([
      { raw: 'data: {"a":1}', data: '{"a":1}', event: null },
      { raw: ': ping', data: null, event: null },
    ]);
  });

  it('gives up at the read that takes an unended event over the limit, not at the next one', () => {
    const p = new SseParser();
    expect(() => p.push(bytes(`data: ${'a'.repeat(MAX_EVENT_BYTES)}`))).toThrow(SseEventTooLarge);
    // So does a read with an event end in it that completes no event before the oversized one (a stray blank line).
    const q = new SseParser();
    expect(() => q.push(bytes(`\n\ndata: ${'a'.repeat(MAX_EVENT_BYTES)}`))).toThrow(SseEventTooLarge);
  });

  it('ends an unterminated last event with the replacement for its cut character', () => {
    const p = new SseParser();
    expect(p.push(Buffer.concat([bytes('data: a'), Buffer.from([0xe2, 0x82])]))).toEqual([]);
    expect(p.flush()).toEqual({ raw: 'data: a\ufffd', data: 'a\ufffd', event: null });
  });

  it('drops one space after the colon, as the SSE spec says, and keeps the rest', () => {
    const p = new SseParser();
    expect(p.push(bytes('data:  two\ndata:\tthree\n\n')).map((e) => e.data)).toEqual([' two\n\tthree']);
  });

  it('joins a character split across two reads', () => {
    const p = new SseParser();
    const text = bytes('data: {"t":"€"}\n\n');
    const cut = text.indexOf(0xe2) + 1;
    expect([...p.push(text.subarray(0, cut)), ...p.push(text.subarray(cut))].map((e) => e.data)).toEqual(['{"t":"€"}']);
  });

  it('reads a line with no colon as its field name with an empty value', () => {
    const p = new SseParser();
    expect(p.push(bytes('data: a\ndata\n\n')).map((e) => e.data)).toEqual(['a\n']);
  });
});
