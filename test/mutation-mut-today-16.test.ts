// Mutants of 2026-12-04's changes that the other tests let live: a parked request's last look at every target once
// its wait in the lot ran out (serve-targets.ts `lastLook`) must not park it again; a whole answer labelled text/plain
// is judged by its first byte after the white space; undici's refusal of a 101 it did not ask for is an answer the
// provider ran, as its refusal of a 100 is; the wait a retry expects for the retry cap (a holder past its hold, the
// retries waiting of a higher class that were seated, the Retry-After of a retry shed at its last chance); the output
// a Responses API answer without usage is charged (a refusal part, a code interpreter's code); an Anthropic usage of
// prompt-cache counts alone is a usage reported.
import { setTimeout as sleep } from 'node:timers/promises';
import { errors } from 'undici';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import { notAnAnswer } from '../src/providers/answer-shape.ts';
import { outputCharsOfAnswer } from '../src/streaming/stream-events.ts';
import { reportsUsage, toOpenAIResponse } from '../src/providers/anthropic/response.ts';
import { AnswerCut, transportOutcome } from '../src/providers/transport-errors.ts';
import { retryTurnMs } from '../src/pools/provider-pool.ts';
import type { MockServer } from '../src/mock/server.ts';
import { slot } from './helpers/client-pool.ts';
import { track } from './helpers/floor-pool.ts';
import { retryCapPool, retryReq } from './helpers/rate-pool.ts';
import { useExtraMocks, useGateways } from './helpers/stack.ts';

const startGateway = useGateways();
const startMock = useExtraMocks();

const brownout = async (m: MockServer, body: { mode?: string; durationMs: number }) => {
  const res = await fetch(`${m.url}/_mock/brownout`, { method: 'POST', body: JSON.stringify(body) });
  expect(res.status).toBe(200);
};

describe('a request whose park.maxWaitMs ran out with two targets down', () => {
  it('takes its last look and ends then, not parked again until its deadline', { timeout: 40_000 }, async () => {
    const primary = await startMock();
    const backup = await startMock();
    const url = await startGateway(
      parseConfig(
        `
server: { host: 127.0.0.1, port: 0 }
providers:
  primary: { family: openai, baseUrl: "${primary.url}/v1", apiKey: sk-primary }
  backup: { family: openai, baseUrl: "${backup.url}/v1", apiKey: sk-backup }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: primary }, { provider: backup } ]
    retry: { maxAttempts: 2, backoff: { baseMs: 10, capMs: 20 } }
    park: { maxWaitMs: 400 }
`,
        'mut16-park.yaml',
        {},
      ),
    );
    const ask = (timeoutMs: number) =>
      fetch(`${url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-stormgate-timeout-ms': String(timeoutMs) },
        body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
      }).then(async (res) => ({ status: res.status, body: (await res.json()) as { error?: { code?: string } } }));
    // Both providers down: both breakers open (five failures in a row, a quarter second without a success).
    await brownout(primary, { mode: '503', durationMs: 120_000 });
    await brownout(backup, { mode: '503', durationMs: 120_000 });
    await Promise.all(Array.from({ length: 8 }, () => ask(1_000)));
    await sleep(300);
    const started = Date.now();
    const answer = await ask(15_000);
    const tookMs = Date.now() - started;
    expect(answer.status).toBe(503);
    // 0.4 s in the lot and a last look (about 1 s in all, measured quiet); parked again at each look, it waited on
    // toward its deadline (6.6 s of a 9 s one, measured), far past park.maxWaitMs.
    expect(tookMs).toBeLessThan(6_000);
  });
});

describe('a whole answer labelled text/plain', () => {
  it('is the answer when its object starts after white space, as one labelled JSON is', () => {
    const answer = '\n  {"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}\n';
    expect(notAnAnswer({ api: 'chat', stream: false, contentType: 'text/plain', ownFamily: true }, Buffer.from(answer))).toBeUndefined();
    expect(notAnAnswer({ api: 'chat', stream: false, contentType: 'text/plain', ownFamily: true }, Buffer.from('\n  hello'))).toEqual({ detail: 'the upstream answered text/plain, not JSON', ran: false });
    // No label at all: the bytes alone say what it is.
    expect(notAnAnswer({ api: 'chat', stream: false, contentType: undefined, ownFamily: true }, Buffer.from('hello'))).toMatchObject({ detail: 'the upstream answer is not a whole JSON object' });
    expect(notAnAnswer({ api: 'chat', stream: false, contentType: undefined, ownFamily: true }, Buffer.from(''))).toMatchObject({ detail: 'the upstream answered with an empty body' });
  });
});

describe('undici\'s refusal of an informational status the gateway never asked for', () => {
  it('is an unreadable answer the provider ran, for a 101 without an upgrade as for a 100', () => {
    for (const message of ['bad response', 'bad upgrade']) {
      expect(transportOutcome(new errors.SocketError(message, null as never))).toMatchObject({ kind: 'bad-stream', ran: true });
    }
    // Any other socket error is a lost connection.
    expect(transportOutcome(new errors.SocketError('other side closed', null as never))).toEqual({ kind: 'network', code: 'UND_ERR_SOCKET' });
  });

  it('is read the same as the cause of the error that reports it', () => {
    expect(transportOutcome(new AnswerCut(new errors.SocketError('bad response', null as never)))).toMatchObject({ kind: 'bad-stream', ran: true });
  });
});

describe('the wait a retry expects for the retry cap', () => {
  describe('on the fake clock (answers hold their slot 1 s, the pool\'s first guess)', () => {
    beforeEach(() => vi.useFakeTimers({ now: 0 }));
    afterEach(() => vi.useRealTimers());

    it('no longer counts a higher class\'s retry that waited and was seated', async () => {
      const p = retryCapPool(10, 1);
      const first = await slot(p, retryReq());
      const waited = track(p.acquire(retryReq()));
      first.release();
      await vi.advanceTimersByTimeAsync(0);
      expect(waited.answer).toMatchObject({ ok: true });
      // One online retry in flight, none waiting: the batch retry's turn is a round away (1 s), within its 1.5 s.
      const batch = track(p.acquire(retryReq({ cls: 1, deadlineAtMs: Date.now() + 1_500 })));
      await vi.advanceTimersByTimeAsync(0);
      expect(batch.answer).toBeUndefined();
      p.close();
    });

    it('tells a retry shed at its last chance the rounds of the cap still ahead of it', async () => {
      const p = retryCapPool(10, 1);
      await slot(p, retryReq());
      for (let i = 0; i < 3; i++) void p.acquire(retryReq());
      // Four rounds of the cap (4 s) within its 4.5 s: it waits; the holder never ends, and at its last chance the
      // three ahead of it are still three rounds away (its slot alone, one).
      const last = track(p.acquire(retryReq({ deadlineAtMs: Date.now() + 4_500 })));
      await vi.advanceTimersByTimeAsync(0);
      expect(last.answer).toBeUndefined();
      await vi.advanceTimersByTimeAsync(4_600);
      const shed = last.answer;
      expect(shed).toMatchObject({ ok: false, reason: 'deadline' });
      expect((shed as { retryAfterMs: number }).retryAfterMs).toBeGreaterThanOrEqual(2_500);
      p.close();
    });
  });

  it('counts a holder past its hold as ending now, never as having ended in the past', () => {
    // None in flight, a full round of the cap ahead (the queued ones take the first round): a whole hold.
    expect(retryTurnMs([], 5_000, 1_000, 2, 2)).toBe(1_000);
    expect(retryTurnMs([4_600, 4_900], 5_000, 1_000, 2, 0)).toBe(600);
    // Granted 10 s ago for an answer that takes 1 s: its place frees now, not 9 s ago (the next rounds would shrink).
    expect(retryTurnMs([-5_000, 4_900], 5_000, 1_000, 2, 0)).toBe(0);
  });

  it('waits for the place that frees for it, not the first: one retry ahead takes the nearest holder\'s place', () => {
    // Cap 2, holders ending in 0.5 s and 20 s, one retry ahead: its turn is the second place, 20 s away.
    expect(retryTurnMs([-19_500, 0], 0, 20_000, 2, 1)).toBe(20_000);
    // One in flight, one place unused: the retry ahead takes the unused one, this one the holder's at 0.5 s.
    expect(retryTurnMs([-19_500], 0, 20_000, 2, 1)).toBe(500);
    // Three rounds ahead of it: the places free again a hold after each one's first turn.
    expect(retryTurnMs([-19_500, 0], 0, 20_000, 2, 5)).toBe(20_000 + 2 * 20_000);
    // More in flight than the cap (a fleet share shrank it to 1): a place frees once the excess has ended.
    expect(retryTurnMs([-19_500, -10_000, 0], 0, 20_000, 1, 0)).toBe(20_000);
  });
});

describe('the output a whole Responses API answer carries (outputCharsOfAnswer)', () => {
  it('counts a message\'s refusal part and a code interpreter\'s code', () => {
    const answer = {
      object: 'response',
      output: [
        { type: 'message', role: 'assistant', content: [{ type: 'refusal', refusal: 'no way' }] },
        { type: 'code_interpreter_call', id: 'ci_1', code: 'print(1)', outputs: [] },
      ],
    };
    expect(outputCharsOfAnswer('responses', Buffer.from(JSON.stringify(answer)))).toBe(6 + 8);
  });
});

describe('an Anthropic answer\'s usage', () => {
  it('is reported when it holds any token count, prompt-cache counts alone included', () => {
    expect(reportsUsage({ cache_read_input_tokens: 40 })).toBe(true);
    expect(reportsUsage({ cache_creation_input_tokens: 12 })).toBe(true);
    expect(reportsUsage({})).toBe(false);
    const msg = { id: 'msg_1', type: 'message', role: 'assistant', model: 'claude', content: [{ type: 'text', text: 'hi' }], stop_reason: 'end_turn', usage: { cache_read_input_tokens: 40 } };
    expect(toOpenAIResponse(msg as never, { model: 'claude' }).usage).toMatchObject({ prompt_tokens: 40, prompt_tokens_details: { cached_tokens: 40 } });
  });
});
