// Mutation tests (QA mut28) for the attempt in its pool slot and a stream's beginning and end: slot-attempt.ts,
// first-output.ts, stream-ends.ts and stream-break.ts. Each test fails on one change to that code that the rest of
// the suite let through.
import { afterEach, describe, expect, it, vi } from 'vitest';
import { readUntilFirstOutput } from '../src/pipeline/first-output.ts';
import { EarlyStart } from '../src/pipeline/early-start.ts';
import type { StreamTranslator } from '../src/providers/families.ts';
import { attemptInSlot } from '../src/pipeline/slot-attempt.ts';
import { ClientGone, GatewayShutdown } from '../src/pipeline/abort-reasons.ts';
import { RequestAbort } from '../src/pipeline/request-abort.ts';
import type { AttemptResult } from '../src/pipeline/attempt.ts';
import type { TargetPlan } from '../src/pipeline/target-attempts.ts';
import type { SlotRequest } from '../src/pools/provider-pool.ts';
import { rateOf } from '../src/policy/client-rate.ts';
import { ratePool, rateReq, trackGrant } from './helpers/rate-pool.ts';
import OpenAI from 'openai';
import { chatChunk as wireChunk, eventStream, useFakeProviders } from './helpers/fake-provider.ts';
import { configServedBy, useStacks } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();

/** What an attempt sent upstream answers (slot-attempt.ts's runAttempt) when a test scripts it, and how many were sent. */
const upstream = vi.hoisted(() => ({ answer: undefined as unknown, sent: 0, tookMs: 0, clock: { ms: 0 } }));
vi.mock('../src/pipeline/attempt.ts', async (importOriginal) => {
  const real = await importOriginal<typeof import('../src/pipeline/attempt.ts')>();
  return {
    ...real,
    runAttempt: async (...args: Parameters<typeof real.runAttempt>) => {
      if (upstream.answer === undefined) return real.runAttempt(...args);
      upstream.sent++;
      upstream.clock.ms += upstream.tookMs;
      return upstream.answer;
    },
  };
});
afterEach(() => {
  upstream.answer = undefined;
  upstream.sent = 0;
  upstream.tookMs = 0;
  upstream.clock.ms = 0;
  vi.useRealTimers();
});

/** An upstream body of the given reads, then its end. */
function upstreamOf(...reads: string[]): AsyncIterator<Buffer> {
  const left = reads.map((r) => Buffer.from(r));
  return { next: async () => (left.length > 0 ? { value: left.shift()!, done: false } : { value: undefined, done: true }) };
}
const ONE = { choices: 1, usage: false } as const;
const chatChunk = (content: string) => `data: ${JSON.stringify({ object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content }, finish_reason: null }] })}\n\n`;

describe('a stream before its first output (first-output.ts)', () => {
  it('passes on a stream whose only answer is its finish (a content filter that let no text out), not retried as empty', async () => {
    // Azure and OpenAI end a filtered answer with a chunk that has a finish_reason and no content: that is the
    // answer, which the client reads; read as "no output yet", it was retried and ended as a 502.
    const p = await startProvider(eventStream((res) => res.end(wireChunk({ role: 'assistant' }, null) + wireChunk({}, 'content_filter') + 'data: [DONE]\n\n')));
    const s = await startStack({ config: (mockUrl) => configServedBy(mockUrl, 'filtered', `${p.origin}/v1`) });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    const finishes: Array<string | null | undefined> = [];
    for await (const c of stream) finishes.push(c.choices[0]?.finish_reason);
    expect(finishes).toContain('content_filter');
    expect(p.hits()).toBe(1);
  });

  it('withdraws its early-start offer once the first output came: the deadline then finds no attempt waiting to start', async () => {
    // Left offered, a later attempt of the same request (a retry still waiting for its answer's headers) was taken for
    // one that had begun: the deadline "started" it, aborted nothing, and the request ran on past the client's deadline.
    const early = new EarlyStart();
    const first = await readUntilFirstOutput('chat', ONE, upstreamOf(chatChunk('Hi')), undefined, early, '');
    expect('failure' in first).toBe(false);
    expect(early.take()).toBe(false);

    const failed = new EarlyStart();
    expect(await readUntilFirstOutput('chat', ONE, upstreamOf('data: {not json\n\n'), undefined, failed, '')).toEqual({ failure: 'malformed event before any output' });
    expect(failed.take()).toBe(false);
  });

  it('hands the upstream\'s own error event on with its verdict, not its translation (its family reads its status from it)', async () => {
    // Anthropic's overloaded_error before any output is its 529; translated for a chat client it no longer says so.
    const overloaded = '{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}';
    const toChat: StreamTranslator = {
      push: (e) => [{ ...e, event: null, raw: 'data: {"error":{"message":"Overloaded","type":"server_error"}}', data: '{"error":{"message":"Overloaded","type":"server_error"}}' }],
      end: () => [],
      usage: () => undefined,
    };
    const verdict = await readUntilFirstOutput('chat', ONE, upstreamOf(`event: error\ndata: ${overloaded}\n\n`), toChat, undefined, '');
    expect('failure' in verdict && verdict.event?.toString()).toBe(overloaded);
  });

  it('fails the attempt as a malformed event when the translator cannot read one before any output, not as a broken connection', async () => {
    const throwing: StreamTranslator = {
      push: () => {
        throw new SyntaxError('Unexpected token');
      },
      end: () => [],
      usage: () => undefined,
    };
    expect(await readUntilFirstOutput('chat', ONE, upstreamOf('event: message_start\ndata: {"type":\n\n'), throwing, undefined, '')).toEqual({ failure: 'malformed event before any output' });
  });
});

/** A pool that grants at once (or after a queue, `queued`) and notes what the request asked and what was done with its slot. */
function spyPlan(queued = false, grant: 'ok' | 'aborted' = 'ok') {
  const done: string[] = [];
  const asked: SlotRequest[] = [];
  const holds: Array<[string, number]> = [];
  const slot = { release: () => done.push('release'), unsent: () => done.push('unsent'), answered: () => done.push('answered') };
  const pool = {
    acquire: async (r: SlotRequest) => {
      asked.push(r);
      return grant === 'ok' ? { ok: true, slot, queued } : { ok: false, reason: 'aborted', retryAfterMs: 0 };
    },
    holdLowerClasses: (target: string, untilMs: number) => holds.push([target, untilMs]),
    sending: () => () => {},
  };
  return { plan: { pool, cls: 0, limitKey: 'p/a', client: {} } as unknown as TargetPlan, done, asked, holds };
}
const ctxOf = (extra: Record<string, unknown> = {}) =>
  ({ route: { config: { minAttemptMs: 250 } }, api: 'chat', stream: false, shape: {}, signal: new RequestAbort(), deadlineAtMs: 600_000, ...extra }) as never;
const request = { path: '/v1/chat/completions', headers: {}, body: '{}' } as never;
const clock = () => upstream.clock.ms;
const answer = (status: number, headers: Record<string, string> = {}): AttemptResult => ({ outcome: status === 200 ? { kind: 'ok', status } : { kind: 'http', status, errorCode: undefined, hint: undefined }, status, headers, body: Buffer.from('{}') } as AttemptResult);

describe('an attempt in its pool slot (slot-attempt.ts)', () => {
  it('gives back both the slot and the rate turn of a request whose slot came at its deadline: the next waiter goes at once', async () => {
    vi.useFakeTimers({ now: 0 });
    // One slot, one request a second: kept, either one made the next waiter wait.
    const p = ratePool({ requests: rateOf(60, 1) }, 1);
    const plan = { pool: p, cls: 0, limitKey: 'p/a', client: {} } as unknown as TargetPlan;
    const r = await attemptInSlot(ctxOf({ deadlineAtMs: 0 }), plan, request, { retry: false, released: false }, Date.now);
    expect(r.kind).toBe('expired');
    const log: Array<[string, number]> = [];
    void trackGrant(p, 'next', rateReq(), log);
    await vi.advanceTimersByTimeAsync(0);
    expect(log).toEqual([['next', 0]]);
    expect(upstream.sent).toBe(0);
    p.close();
  });

  it('tells the pool what the request is: a retry, released by the lot, its tokens, and the minimum time an attempt needs', async () => {
    upstream.answer = answer(200);
    const { plan, asked } = spyPlan();
    await attemptInSlot(ctxOf({ tokens: 1_234 }), plan, request, { retry: true, released: true }, clock);
    expect(asked[0]).toMatchObject({ retry: true, released: true, tokens: 1_234, minAttemptMs: 250, deadlineAtMs: 600_000 });
  });

  it('counts only the wait in the queue as the slot wait, and only the upstream time as the attempt\'s duration', async () => {
    upstream.answer = answer(200);
    upstream.tookMs = 700;
    // A slot had at once: no slot wait, even when the clock moved while the grant was handed over.
    const atOnce = spyPlan(false);
    const ticking = () => (upstream.clock.ms += 3);
    const first = await attemptInSlot(ctxOf(), atOnce.plan, request, { retry: false, released: false }, ticking);
    expect(first.kind === 'done' && first.slotWaitMs).toBe(0);
    // Queued: its wait (the clock's 2 s before the grant) is the slot wait, not part of the attempt's duration.
    upstream.clock.ms = 0;
    const queued = spyPlan(true);
    let calls = 0;
    const queuedClock = () => (calls++ === 0 ? 0 : 2_000 + upstream.clock.ms);
    const second = await attemptInSlot(ctxOf(), queued.plan, request, { retry: false, released: false }, queuedClock);
    expect(second.kind === 'done' && [second.slotWaitMs, second.durationMs]).toEqual([2_000, 700]);
  });

  it('gives the rate turn back when the connection was refused (nothing was written), and not after a reset mid-request', async () => {
    upstream.answer = { outcome: { kind: 'network', code: 'ECONNREFUSED' } };
    const refused = spyPlan();
    const r = await attemptInSlot(ctxOf(), refused.plan, request, { retry: false, released: false }, clock);
    r.kind === 'done' && r.release();
    expect(refused.done).toEqual(['unsent', 'release']);
    upstream.answer = { outcome: { kind: 'network', code: 'ECONNRESET' } };
    const reset = spyPlan();
    const r2 = await attemptInSlot(ctxOf(), reset.plan, request, { retry: false, released: false }, clock);
    r2.kind === 'done' && r2.release();
    expect(reset.done).toEqual(['release']);
  });

  it('tells the pool an answered attempt was answered (its time paces the wait estimates), and not a failed one', async () => {
    upstream.answer = answer(200);
    const ok = spyPlan();
    const r = await attemptInSlot(ctxOf(), ok.plan, request, { retry: false, released: false }, clock);
    r.kind === 'done' && r.release();
    expect(ok.done).toEqual(['answered', 'release']);
    upstream.answer = answer(503);
    const failed = spyPlan();
    const f = await attemptInSlot(ctxOf(), failed.plan, request, { retry: false, released: false }, clock);
    f.kind === 'done' && f.release();
    expect(failed.done).toEqual(['release']);
  });

  it('holds the lower classes back when a success says the quota is nearly spent, and not on a 429 saying the same', async () => {
    const low = { 'x-ratelimit-limit-requests': '100', 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '20s' };
    upstream.answer = answer(200, low);
    const ok = spyPlan();
    await attemptInSlot(ctxOf(), ok.plan, request, { retry: false, released: false }, clock);
    expect(ok.holds).toEqual([['p/a', 20_000]]);
    // A 429's own hint and hold-off speak for it; its headers hold no class back beyond them.
    upstream.answer = answer(429, low);
    const limited = spyPlan();
    await attemptInSlot(ctxOf(), limited.plan, request, { retry: false, released: false }, clock);
    expect(limited.holds).toEqual([]);
  });

  it('keeps a stream\'s slot until its upstream is done, not until the caller is through with the outcome', async () => {
    let upstreamDone: (() => void) | undefined;
    upstream.answer = { ...answer(200), stream: { whenUpstreamDone: (fn: () => void) => (upstreamDone = fn) } };
    const s = spyPlan();
    const r = await attemptInSlot(ctxOf({ stream: true }), s.plan, request, { retry: false, released: false }, clock);
    r.kind === 'done' && r.release();
    expect(s.done).toEqual(['answered']);
    upstreamDone?.();
    expect(s.done).toEqual(['answered', 'release']);
  });

  it.each([
    ['the client left', new ClientGone(), 'client'],
    ['the gateway shut down', new GatewayShutdown(), 'shutdown'],
  ])('reports a request aborted in the queue because %s as that, not as its deadline', async (_what, reason, by) => {
    const signal = new RequestAbort();
    signal.abort(reason);
    const s = spyPlan(false, 'aborted');
    const r = await attemptInSlot(ctxOf({ signal }), s.plan, request, { retry: false, released: false }, clock);
    expect(r.kind === 'expired' && r.result.outcome).toEqual({ kind: 'aborted', by });
    expect(upstream.sent).toBe(0);
  });
});
