// Mutation round 45 on two modules no earlier round had mutated: pipeline/degraded-answer.ts (why a request gets the
// route's degraded answer, whether a fixed text can answer it, the completion written) and policy/quota-headers.ts (when
// a provider's quota is nearly spent, so lower classes wait for its reset). 78 hand mutants: 39 killed by the existing
// files, 37 killed here, 2 equivalent, 0 open (degraded answer 51: 30/21/0; quota headers 27: 9/16/2).
// Killed here, degraded answer: an aborted attempt always 'deadline'; park_full named shed; a closing instance given the
// answer; top_logprobs, audio and modalities no longer refused; a null tool_choice thrown on; the model of a body
// without one; n not capped at 128 (or at 127), a fractional n; a stream flag that is not `true`; the role chunk's empty
// content, cache-control, refusal, logprobs and system_fingerprint dropped; created in ms; the usage chunk sent unasked.
// Killed here, quota headers: the 2% share (x10), decimal counts, a count with white space after it, a count that is no
// number beside a reset, the edge of 2% (`>=`), the floor of one request, a limit assumed when none came, the later of
// two resets (min, first), OpenAI's token limit, Anthropic's tokens / input / output limits and its token limit alone,
// a leap-second reset, a remaining count assumed from a reset alone.
// Equivalent: the early return before Anthropic's limits (only skips when neither requests- nor tokens-remaining came:
// Anthropic sends them with every input/output count) and a missing OpenAI reset read as now (`at > nowMs` drops it).
// One bug: an Anthropic reset with white space after it (undici passes a value's trailing white space on) held nothing
// back, while the count beside it and the wait hints trimmed it; fixed in quota-headers.ts.
// Pure functions, called directly on fixed clocks: every value is exact.
import { describe, expect, it } from 'vitest';
import { degradedAnswer, degradedFits, degradedReason } from '../src/pipeline/degraded-answer.ts';
import type { ManagedRequest } from '../src/pipeline/handle-request.ts';
import type { Served } from '../src/pipeline/serve-targets.ts';
import { quotaLowUntil } from '../src/policy/quota-headers.ts';

const NOW = 1_000_000;

describe('quotaLowUntil: when the quota is nearly spent', () => {
  const openai = (limit: string | undefined, remaining: string | undefined, reset = '2s', kind = 'requests') => ({
    ...(limit !== undefined && { [`x-ratelimit-limit-${kind}`]: limit }),
    ...(remaining !== undefined && { [`x-ratelimit-remaining-${kind}`]: remaining }),
    [`x-ratelimit-reset-${kind}`]: reset,
  });

  it('is 2% of the limit left, no more: 10% left is not nearly spent', () => {
    expect(quotaLowUntil(openai('1000', '100'), NOW)).toBeUndefined();
    expect(quotaLowUntil(openai('1000', '21'), NOW)).toBeUndefined();
    // Exactly 2% left is nearly spent.
    expect(quotaLowUntil(openai('1000', '20'), NOW)).toBe(NOW + 2000);
  });

  it('is at least one request left, with or without a limit header', () => {
    expect(quotaLowUntil(openai(undefined, '1'), NOW)).toBe(NOW + 2000);
    expect(quotaLowUntil(openai('10', '1'), NOW)).toBe(NOW + 2000);
    // No limit header: two left are not "nearly spent".
    expect(quotaLowUntil(openai(undefined, '2'), NOW)).toBeUndefined();
  });

  it('reads a decimal count, and no count that is not a number, even beside a reset', () => {
    expect(quotaLowUntil(openai('100', '0.5'), NOW)).toBe(NOW + 2000);
    expect(quotaLowUntil(openai('1000', 'lots'), NOW)).toBeUndefined();
    expect(quotaLowUntil(openai('1000', '-1'), NOW)).toBeUndefined();
  });

  it('says nothing from a reset alone, without a remaining count', () => {
    expect(quotaLowUntil(openai('1000', undefined), NOW)).toBeUndefined();
    expect(quotaLowUntil({ 'anthropic-ratelimit-requests-remaining': '40', 'anthropic-ratelimit-requests-limit': '50', 'anthropic-ratelimit-tokens-reset': new Date(NOW + 5000).toISOString() }, NOW)).toBeUndefined();
  });

  it('holds for nothing when the reset is now or past', () => {
    expect(quotaLowUntil(openai('1000', '0', '0s'), NOW)).toBeUndefined();
    expect(quotaLowUntil({ 'anthropic-ratelimit-requests-remaining': '0', 'anthropic-ratelimit-requests-reset': new Date(NOW - 1000).toISOString() }, NOW)).toBeUndefined();
    expect(quotaLowUntil({ 'anthropic-ratelimit-requests-remaining': '0', 'anthropic-ratelimit-requests-reset': new Date(NOW).toISOString() }, NOW)).toBeUndefined();
  });

  it('reads the token limit too, and of two limits nearly spent holds until the later reset', () => {
    expect(quotaLowUntil(openai('30000', '100', '3s', 'tokens'), NOW)).toBe(NOW + 3000);
    const both = { ...openai('1000', '0', '2s'), ...openai('30000', '100', '5s', 'tokens') };
    expect(quotaLowUntil(both, NOW)).toBe(NOW + 5000);
    const reversed = { ...openai('1000', '0', '5s'), ...openai('30000', '100', '2s', 'tokens') };
    expect(quotaLowUntil(reversed, NOW)).toBe(NOW + 5000);
  });

  const at = (ms: number) => new Date(ms).toISOString();
  const anthropic = (kind: string, remaining: string, resetMs: number, extra: Record<string, string> = {}) => ({
    'anthropic-ratelimit-requests-remaining': '49',
    'anthropic-ratelimit-requests-limit': '50',
    [`anthropic-ratelimit-${kind}-limit`]: '100000',
    [`anthropic-ratelimit-${kind}-remaining`]: remaining,
    [`anthropic-ratelimit-${kind}-reset`]: at(resetMs),
    ...extra,
  });

  it("reads each of Anthropic's limits: tokens, input tokens, output tokens", () => {
    expect(quotaLowUntil(anthropic('tokens', '100', NOW + 4000), NOW)).toBe(NOW + 4000);
    expect(quotaLowUntil(anthropic('input-tokens', '100', NOW + 6000), NOW)).toBe(NOW + 6000);
    expect(quotaLowUntil(anthropic('output-tokens', '100', NOW + 7000), NOW)).toBe(NOW + 7000);
  });

  it("reads Anthropic's token limit when the answer names no request limit", () => {
    const h = { 'anthropic-ratelimit-tokens-limit': '100000', 'anthropic-ratelimit-tokens-remaining': '100', 'anthropic-ratelimit-tokens-reset': at(NOW + 4000) };
    expect(quotaLowUntil(h, NOW)).toBe(NOW + 4000);
  });

  it('reads a reset at a leap second (RFC 3339 allows :60), as the wait hints do', () => {
    const nowMs = Date.parse('2026-12-31T23:59:00Z');
    const h = { 'anthropic-ratelimit-requests-remaining': '0', 'anthropic-ratelimit-requests-reset': '2026-12-31T23:59:60Z' };
    expect(quotaLowUntil(h, nowMs)).toBe(Date.parse('2026-12-31T23:59:59Z'));
  });

  // undici hands a header value over with its trailing white space ("3   "), as the server sent it.
  it('reads a count and a reset with white space after them, as undici passes them on', () => {
    expect(quotaLowUntil(openai('1000', '3 ', '2s\t'), NOW)).toBe(NOW + 2000);
    expect(quotaLowUntil(openai('1000', '\t0'), NOW)).toBe(NOW + 2000);
    const h = { 'anthropic-ratelimit-requests-limit': '50 ', 'anthropic-ratelimit-requests-remaining': '0 ', 'anthropic-ratelimit-requests-reset': `${at(NOW + 3000)}  ` };
    expect(quotaLowUntil(h, NOW)).toBe(NOW + 3000);
  });

  it('reads the first value of a header sent twice', () => {
    const h = { 'anthropic-ratelimit-requests-remaining': ['0', '0'], 'anthropic-ratelimit-requests-reset': [at(NOW + 3000), at(NOW + 9000)] };
    expect(quotaLowUntil(h, NOW)).toBe(NOW + 3000);
    expect(quotaLowUntil({ 'x-ratelimit-remaining-requests': ['0', '500'], 'x-ratelimit-reset-requests': ['2s', '9s'] }, NOW)).toBe(NOW + 2000);
  });
});

const failed = (cls: string, outcome: Record<string, unknown> = { kind: 'http', status: 500 }) =>
  ({ kind: 'failed', plan: {}, failure: { kind: 'failed', result: { outcome }, cls: { cls } } }) as unknown as Exclude<Served, { kind: 'ok' }>;
const served = (kind: string) => ({ kind, plan: {} }) as unknown as Exclude<Served, { kind: 'ok' }>;

describe('degradedReason: who gets the degraded answer, and why', () => {
  it('a failure of the targets, but not the upstream verdict on the request itself', () => {
    expect(degradedReason(failed('server-error'))).toBe('failed');
    expect(degradedReason(failed('rate-limited'))).toBe('failed');
    expect(degradedReason(failed('context-length'))).toBeUndefined();
    expect(degradedReason(failed('content-policy'))).toBeUndefined();
  });

  it('an attempt the deadline cut, but not one its client or a shutdown cut', () => {
    expect(degradedReason(failed('timeout', { kind: 'aborted', by: 'deadline' }))).toBe('deadline');
    expect(degradedReason(failed('timeout', { kind: 'aborted', by: 'client' }))).toBeUndefined();
    expect(degradedReason(failed('timeout', { kind: 'aborted', by: 'shutdown' }))).toBeUndefined();
  });

  it('each other way a request is not served, by its own reason; a closing instance never', () => {
    expect(degradedReason(served('unavailable'))).toBe('unavailable');
    expect(degradedReason(served('shed'))).toBe('shed');
    expect(degradedReason(served('park-full'))).toBe('park_full');
    expect(degradedReason(served('auth-held'))).toBe('failed');
    expect(degradedReason(served('closing'))).toBeUndefined();
  });
});

describe('degradedFits: whether a fixed text can answer the request', () => {
  const base = { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] };
  it('a plain chat, and one with tools it may or may not call', () => {
    expect(degradedFits(base)).toBe(true);
    expect(degradedFits({ ...base, tool_choice: 'auto' })).toBe(true);
    expect(degradedFits({ ...base, tool_choice: 'none' })).toBe(true);
    expect(degradedFits({ ...base, tool_choice: null })).toBe(true);
    expect(degradedFits({ ...base, response_format: { type: 'text' } })).toBe(true);
    expect(degradedFits({ ...base, logprobs: false, top_logprobs: 0 })).toBe(true);
    expect(degradedFits({ ...base, modalities: ['text'], audio: null })).toBe(true);
    expect(degradedFits({ ...base, tool_choice: { type: 'allowed_tools', allowed_tools: { mode: 'auto', tools: [] } } })).toBe(true);
  });

  it('not structured output', () => {
    expect(degradedFits({ ...base, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: {} } } })).toBe(false);
    expect(degradedFits({ ...base, response_format: { type: 'json_object' } })).toBe(false);
  });

  it('not token log probabilities', () => {
    expect(degradedFits({ ...base, logprobs: true })).toBe(false);
    expect(degradedFits({ ...base, top_logprobs: 1 })).toBe(false);
  });

  it('not audio output', () => {
    expect(degradedFits({ ...base, audio: { voice: 'alloy', format: 'wav' } })).toBe(false);
    expect(degradedFits({ ...base, modalities: ['text', 'audio'] })).toBe(false);
  });

  it('not a forced tool call', () => {
    expect(degradedFits({ ...base, tool_choice: 'required' })).toBe(false);
    expect(degradedFits({ ...base, tool_choice: { type: 'function', function: { name: 'f' } } })).toBe(false);
    expect(degradedFits({ ...base, tool_choice: { type: 'custom', custom: { name: 'g' } } })).toBe(false);
    expect(degradedFits({ ...base, tool_choice: { type: 'allowed_tools', allowed_tools: { mode: 'required', tools: [] } } })).toBe(false);
  });
});

describe('degradedAnswer: the completion written', () => {
  const req = (json: Record<string, unknown>) => ({ json }) as unknown as ManagedRequest;
  const text = async (body: unknown) => {
    let s = '';
    for await (const chunk of body as AsyncIterable<Buffer | string>) s += chunk.toString();
    return s;
  };
  const events = (s: string) => s.split('\n\n').filter(Boolean).map((e) => e.replace(/^data: /, ''));

  it('a chat completion: the message, one choice for each of n, the reason in its header', async () => {
    const before = Math.floor(Date.now() / 1000);
    const a = degradedAnswer(req({ model: 'gpt-4o', n: 3 }), 'Busy.', 'shed');
    expect(a.status).toBe(200);
    expect(a.headers).toEqual({ 'x-stormgate-degraded': 'true', 'x-stormgate-degraded-reason': 'shed', 'content-type': 'application/json' });
    const c = JSON.parse((a.body as Buffer).toString()) as Record<string, unknown>;
    expect(c.id).toMatch(/^chatcmpl-degraded-[0-9a-f-]{36}$/);
    expect(c.created).toBeGreaterThanOrEqual(before);
    expect(c.created).toBeLessThanOrEqual(Math.floor(Date.now() / 1000));
    expect(c).toMatchObject({ object: 'chat.completion', model: 'gpt-4o', system_fingerprint: null, usage: { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 } });
    expect(c.choices).toEqual([0, 1, 2].map((index) => ({ index, message: { role: 'assistant', content: 'Busy.', refusal: null }, logprobs: null, finish_reason: 'stop' })));
  });

  it('one choice for n that is not a whole number above one; 128 at most', () => {
    const choices = (json: Record<string, unknown>) => (JSON.parse((degradedAnswer(req(json), 'x', 'failed').body as Buffer).toString()) as { choices: unknown[] }).choices.length;
    expect(choices({ model: 'm' })).toBe(1);
    expect(choices({ model: 'm', n: 1 })).toBe(1);
    expect(choices({ model: 'm', n: 2 })).toBe(2);
    expect(choices({ model: 'm', n: 2.5 })).toBe(1);
    expect(choices({ model: 'm', n: '3' })).toBe(1);
    expect(choices({ model: 'm', n: 128 })).toBe(128);
    expect(choices({ model: 'm', n: 129 })).toBe(128);
  });

  it("the client's model, cut as in labels, or stormgate-degraded when it sent none usable", () => {
    const model = (json: Record<string, unknown>) => (JSON.parse((degradedAnswer(req(json), 'x', 'failed').body as Buffer).toString()) as { model: string }).model;
    expect(model({ model: 'gpt-4o-mini' })).toBe('gpt-4o-mini');
    expect(model({})).toBe('stormgate-degraded');
    expect(model({ model: 42 })).toBe('stormgate-degraded');
    expect(model({ model: 'm'.repeat(10_000) }).length).toBeLessThan(200);
  });

  it('a stream: role, text and finish for each choice, the usage only when asked for, then [DONE]', async () => {
    const a = degradedAnswer(req({ model: 'gpt-4o', stream: true, n: 2 }), 'Busy.', 'unavailable');
    expect(a.status).toBe(200);
    expect(a.headers).toEqual({ 'x-stormgate-degraded': 'true', 'x-stormgate-degraded-reason': 'unavailable', 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' });
    const ev = events(await text(a.body));
    expect(ev.at(-1)).toBe('[DONE]');
    const chunks = ev.slice(0, -1).map((e) => JSON.parse(e) as { id: string; object: string; model: string; system_fingerprint: null; choices: Array<{ index: number; delta: unknown; logprobs: null; finish_reason: string | null }> });
    expect(chunks).toHaveLength(6);
    for (const c of chunks) expect(c).toMatchObject({ id: chunks[0]!.id, object: 'chat.completion.chunk', model: 'gpt-4o', system_fingerprint: null });
    expect(chunks.map((c) => c.choices)).toEqual([
      [{ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }],
      [{ index: 1, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }],
      [{ index: 0, delta: { content: 'Busy.' }, logprobs: null, finish_reason: null }],
      [{ index: 1, delta: { content: 'Busy.' }, logprobs: null, finish_reason: null }],
      [{ index: 0, delta: {}, logprobs: null, finish_reason: 'stop' }],
      [{ index: 1, delta: {}, logprobs: null, finish_reason: 'stop' }],
    ]);
    expect(ev.join('')).not.toContain('usage');
  });

  it('a stream whose client asked for usage gets the usage chunk of zeros, with no choices, before [DONE]', async () => {
    const a = degradedAnswer(req({ model: 'gpt-4o', stream: true, stream_options: { include_usage: true } }), 'Busy.', 'failed');
    const ev = events(await text(a.body));
    expect(ev).toHaveLength(5);
    expect(ev[4]).toBe('[DONE]');
    expect(JSON.parse(ev[3]!)).toMatchObject({ object: 'chat.completion.chunk', choices: [], usage: { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 } });
    const noUsage = degradedAnswer(req({ model: 'gpt-4o', stream: true, stream_options: { include_usage: false } }), 'Busy.', 'failed');
    expect(events(await text(noUsage.body))).toHaveLength(4);
  });

  it('a whole answer for a stream flag that is not true', () => {
    const a = degradedAnswer(req({ model: 'gpt-4o', stream: 'true' }), 'Busy.', 'failed');
    expect(a.headers['content-type']).toBe('application/json');
    expect(Buffer.isBuffer(a.body)).toBe(true);
  });
});
