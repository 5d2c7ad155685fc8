// Adversarial review and mutation testing of the core request path (serve-targets, target-attempts, slot-attempt,
// attempt, final-answer, record-outcome, retry-wait, deadline): each test names a promise of the README that a small
// change to one of those files broke while every other test still passed.
import { describe, expect, it } from 'vitest';
import { computeDeadline } from '../src/policy/deadline.ts';
import { attemptInSlot } from '../src/pipeline/slot-attempt.ts';
import { unavailableAnswer } from '../src/pipeline/final-answer.ts';
import { RequestAbort } from '../src/pipeline/request-abort.ts';
import type { TargetPlan } from '../src/pipeline/target-attempts.ts';
import { defaultConfig, metricSum, RETRY_LOOP_ONLY, useStacks, type Stack } from './helpers/stack.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';

const start = useStacks(RETRY_LOOP_ONLY);
const startProvider = useFakeProviders();

function post(s: Stack, headers: Record<string, string> = {}, body: Record<string, unknown> = {}) {
  return fetch(`${s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], ...body }),
  });
}

describe("the client's sub-second timeout", () => {
  it("keeps a fraction of a second in the Python SDK's x-stainless-read-timeout as it is: only a 0 is read as 1 s", () => {
    expect(computeDeadline({ routeTimeoutMs: 120_000, marginMs: undefined, headers: { 'x-stainless-read-timeout': '0.5' } })).toMatchObject({ timeoutMs: 500, source: 'x-stainless-read-timeout' });
    expect(computeDeadline({ routeTimeoutMs: 120_000, marginMs: undefined, headers: { 'x-stainless-timeout': '0.25' } }).timeoutMs).toBe(250);
    expect(computeDeadline({ routeTimeoutMs: 120_000, marginMs: undefined, headers: { 'x-stainless-timeout': '0' } }).timeoutMs).toBe(1_000);
  });

  it('answers a Python client with a 0.2 s read timeout before it gives up, not at 1 s less the margin', async () => {
    const s = await start({ faults: { hangRate: 1 } });
    // Warmed up first (connections, the first request's compilation), so that the one timed is the deadline alone.
    expect((await post(s, { 'x-stormgate-timeout-ms': '100' })).status).toBe(504);
    const started = Date.now();
    const res = await post(s, { 'x-stainless-read-timeout': '0.2' });
    const elapsed = Date.now() - started;
    expect(res.status).toBe(504);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('deadline_exceeded');
    // The deadline is 50 ms (200 ms less the 250 ms margin leaves the 50 ms sliver); read as 1 s it was 750 ms.
    expect(elapsed).toBeLessThan(600);
  });
});

/** A plan whose pool grants a slot at once and whose provider must never be reached. */
function slotPlan(sent: string[]): TargetPlan {
  const slot = { release: () => {}, answered: () => {}, unsent: () => {} };
  return {
    pool: { acquire: async () => ({ ok: true, slot, queued: false }), sending: () => () => {} },
    client: {
      config: { timeouts: { connectMs: 1000, firstTokenMs: 1000, idleMs: 1000 }, family: 'openai' },
      dispatcher: {
        request: () => {
          sent.push('request');
          return new Promise(() => {});
        },
      },
    },
  } as unknown as TargetPlan;
}

describe('no attempt at the deadline, by the clock', () => {
  it('sends nothing when the slot comes at the very millisecond of the deadline', async () => {
    const sent: string[] = [];
    const deadlineAtMs = 1_000_000;
    const ctx = { route: { config: { minAttemptMs: 0 } }, api: 'chat', stream: false, shape: {}, signal: new RequestAbort(), deadlineAtMs } as never;
    const upstream = { path: '/v1/chat/completions', headers: {}, body: '{}' } as never;
    const r = await attemptInSlot(ctx, slotPlan(sent), upstream, { retry: false, released: false }, () => deadlineAtMs);
    expect(r.kind).toBe('expired');
    expect(r.kind === 'expired' && r.result.outcome).toEqual({ kind: 'aborted', by: 'deadline' });
    expect(sent).toEqual([]);
  });
});

async function until(check: () => boolean, timeoutMs = 3_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > end) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 10));
  }
}

describe('a client that leaves', () => {
  it('aborts an upstream stream still waiting for its first token at once, not at its first-token timer', async () => {
    // firstTokenMs (30 s) runs on the attempt's own controller, which the client's leaving must reach.
    const s = await start({ faults: { stream: { firstTokenDelayMs: 20_000 } } });
    const client = new AbortController();
    const answer = fetch(`${s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', stream: true, messages: [{ role: 'user', content: 'hi' }] }),
      signal: client.signal,
    }).catch(() => undefined);
    await until(() => s.mock.requests().length === 1);
    await new Promise((r) => setTimeout(r, 100));
    client.abort();
    await answer;
    await until(() => s.mock.requests()[0]?.aborted === true, 3_000);
    expect(s.mock.stats().total).toBe(1);
  });
});

describe('an attempt for a request already aborted', () => {
  it.each([false, true])('sends nothing upstream (stream: %s), and reports the abort', async (stream) => {
    const { runAttempt } = await import('../src/pipeline/attempt.ts');
    const sent: string[] = [];
    const signal = new RequestAbort();
    signal.abort(new Error('client gone'));
    const client = {
      config: { timeouts: { connectMs: 1000, firstTokenMs: 1000, idleMs: 1000, responseMs: 1000 }, family: 'openai' },
      dispatcher: {
        request: () => {
          sent.push('request');
          return new Promise(() => {});
        },
      },
    };
    const r = await runAttempt({ client, api: 'chat', path: '/v1/chat/completions', headers: {}, body: '{}', stream, shape: {}, translator: undefined, requestSignal: signal, now: Date.now } as never);
    expect(sent).toEqual([]);
    expect(r.outcome.kind).toBe('aborted');
  });
});

describe('the one wait rule, once the own hold-off stretches the wait', () => {
  it("takes no retry whose wait, lengthened to the end of the hold-off its own hint started, leaves less than minAttemptMs", async () => {
    // The hold-off's spread draws 0.999 (its end: the hint x 1.1), the hint's jitter 0 (the hint itself): the hint's
    // wait fits before the deadline with minAttemptMs to spare, the wait to the hold-off's end does not.
    const random = () => (new Error().stack?.includes('hold-offs.ts') ? 0.999 : 0);
    const s = await start({
      faults: { errors: [{ status: 503, rate: 1, headers: { 'retry-after': '5' } }] },
      route: { ...RETRY_LOOP_ONLY.route, minAttemptMs: 100, deadlineMarginMs: 0 },
      deps: { random },
    });
    const started = Date.now();
    // 5400 ms: after the first answer (up to 300 ms on a loaded machine), 5000 + 100 fits; 5500 + 2 + 100 does not.
    const res = await post(s, { 'x-stormgate-timeout-ms': '5400' });
    expect(res.status).toBe(503);
    expect(s.mock.stats().total).toBe(1);
    expect(Date.now() - started).toBeLessThan(3_000);
  });
});

describe('a backoff the client cuts short', () => {
  it('ends the request there: the retry it paid for is the only one taken from the budget, and nothing more is sent', async () => {
    // A floor of 10 retries over the window; the first 503 pays one and waits 2 s, and the client leaves meanwhile.
    const s = await start({
      faults: { errors: [{ status: 503, rate: 1 }] },
      route: { budget: { ratio: 0.1, windowS: 10, minRetriesPerSecond: 1 }, park: false, retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 2_000, capMs: 2_000 } } },
    });
    const client = new AbortController();
    const answer = fetch(`${s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
      signal: client.signal,
    }).catch(() => undefined);
    await until(() => s.mock.requests().length === 1);
    await new Promise((r) => setTimeout(r, 200));
    client.abort();
    await answer;
    await new Promise((r) => setTimeout(r, 300));
    expect(s.mock.stats().total).toBe(1);
    expect(await metricSum(s, 'stormgate_retry_budget_remaining{route="chat"}')).toBe(9);
  });
});

describe('decorrelated jitter after a wait hint', () => {
  it("grows from the backoff's own previous wait, not from the provider's hint: a hint is no step of the chain", async () => {
    const sleeps: number[] = [];
    const s = await start({
      faults: {
        errors: [
          // A hint for this request only (a reset header, no hold-off), then a 503 with none.
          { status: 429, times: 1, headers: { 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '1s' } },
          { status: 503, times: 1 },
        ],
      },
      route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 3, backoff: { strategy: 'decorrelated-jitter', baseMs: 10, capMs: 5_000 } } },
      deps: {
        random: () => 0.5,
        sleep: async (ms) => {
          sleeps.push(ms);
        },
      },
    });
    const res = await post(s);
    expect(res.status).toBe(200);
    expect(s.mock.stats().total).toBe(3);
    // The hint's wait (1 s x 1.1), then random(base, base x 3) = 20 ms: from the hint, it was random(10, 3.3 s).
    expect(sleeps).toEqual([1_100, 20]);
  });
});

describe('an answer that comes after its attempt was aborted', () => {
  it("is let go of (its body destroyed, the connection freed), never left open with nobody reading it", async () => {
    const { runAttempt } = await import('../src/pipeline/attempt.ts');
    const signal = new RequestAbort();
    let answer!: (res: unknown) => void;
    let destroyed = 0;
    const client = {
      config: { timeouts: { connectMs: 1000, firstTokenMs: 5000, idleMs: 1000 }, family: 'openai' },
      dispatcher: { request: () => new Promise((resolve) => (answer = resolve)) },
    };
    const attempt = runAttempt({ client, api: 'chat', path: '/v1/chat/completions', headers: {}, body: '{}', stream: true, shape: {}, translator: undefined, requestSignal: signal, now: Date.now } as never);
    await new Promise((r) => setTimeout(r, 5));
    signal.abort(new Error('client gone'));
    expect((await attempt).outcome.kind).toBe('aborted');
    // undici resolved the request in the same tick as the abort: the answer is nobody's.
    answer({ statusCode: 200, headers: {}, body: { destroy: () => destroyed++ } });
    await new Promise((r) => setTimeout(r, 5));
    expect(destroyed).toBe(1);
  });
});

describe("a parked request's failed probe", () => {
  it("costs the request none of its own attempts: the breaker's attempt, lent, and the retry it had left still goes", async () => {
    // 503, 503, then answers. The first 503 opens the breaker (one failure in a row, nothing succeeded before); the
    // request parks with one retry left, is released as the probe, and the probe fails; parked again, its retry is
    // the next probe, and it is answered.
    const s = await start({
      faults: { errors: [{ status: 503, times: 2 }] },
      provider: { breaker: { consecutiveFailures: 1, openS: 5, probeWhileParkedMs: 100, probeWhileParkedMaxMs: 200 } },
      route: { budget: RETRY_LOOP_ONLY.route!.budget, park: {}, retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } },
    });
    const res = await post(s, { 'x-stormgate-timeout-ms': '5000' });
    expect(s.mock.stats().total).toBe(3);
    expect(res.status).toBe(200);
    // x-retry-attempt numbers the requests the provider saw, the probe included, not the attempts the request paid.
    expect(s.mock.requests().map((r) => r.headers['x-retry-attempt'])).toEqual([undefined, '1', '2']);
  });
});

describe("an open breaker's answer", () => {
  it('tells the SDK not to retry (the provider is the problem, not the gateway), with the wait until the next probe', () => {
    const a = unavailableAnswer({ reason: 'breaker', target: 'mock/gpt-4o', retryAfterMs: 5_000 });
    expect(a.status).toBe(503);
    expect(a.body.error.code).toBe('circuit_open');
    expect(a.headers).toEqual({ 'x-should-retry': 'false', 'retry-after-ms': '5000', 'retry-after': '5' });
  });
});

describe('a newcomer to a held-off target whose hold-off outlasts its deadline', () => {
  it('is answered at once, not parked until its deadline comes near', async () => {
    const s = await start({
      faults: { errors: [{ status: 429, times: 1, headers: { 'retry-after': '3' } }] },
      route: { ...RETRY_LOOP_ONLY.route, park: {} },
    });
    // The first request's hint is longer than its time left: answered at once, it starts a 3 s hold-off.
    const first = await post(s, { 'x-stormgate-timeout-ms': '1000' });
    expect(first.status).toBe(429);
    const started = Date.now();
    // 2750 ms to its deadline: the hold-off ends past it (less minAttemptMs, 1 s): no wait can lead to an attempt.
    const res = await post(s, { 'x-stormgate-timeout-ms': '3000' });
    const elapsed = Date.now() - started;
    expect(res.status).toBe(429);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe('provider_held_off');
    expect(s.mock.stats().total).toBe(1);
    // Parked, it waited until 1750 ms (its deadline less minAttemptMs) for the same answer.
    expect(elapsed).toBeLessThan(1_000);
  });
});

describe('a request that went upstream and finds the park queue full', () => {
  it("ends with the upstream's failure it got (x-should-retry: false), not a park_queue_full inviting the SDK to send it again", async () => {
    // By the prompt: `slow` answers 503 after 400 ms, `limit` 429 with retry-after 2 at once.
    const provider = await startProvider((req, res) => {
      let body = '';
      req.on('data', (c) => (body += c));
      req.on('end', () => {
        const answer = (status: number, headers: Record<string, string> = {}) => {
          res.writeHead(status, { 'content-type': 'application/json', ...headers });
          res.end(JSON.stringify({ error: { message: `upstream ${status}`, type: 'server_error', param: null, code: `upstream_${status}` } }));
        };
        if (body.includes('slow')) setTimeout(() => answer(503), 400);
        else if (body.includes('limit')) answer(429, { 'retry-after': '2' });
        else answer(500);
      });
    });
    const s = await start({
      config: (url) => {
        const base = defaultConfig(url, {
          provider: { breaker: false },
          route: { ...RETRY_LOOP_ONLY.route, park: { maxQueue: 1 }, retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } } },
        });
        return { ...base, providers: { mock: { ...base.providers.mock!, baseUrl: `${provider.origin}/v1` } } };
      },
    });
    const ask = (content: string, headers: Record<string, string> = {}, signal?: AbortSignal) =>
      fetch(`${s.baseURL}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...headers },
        body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content }] }),
        signal,
      });
    // B goes upstream; while it is there, C's 429 starts a 2 s hold-off (C itself ends at once: its deadline is nearer).
    const b = ask('slow');
    await new Promise((r) => setTimeout(r, 50));
    expect((await ask('limit', { 'x-stormgate-timeout-ms': '1000' })).status).toBe(429);
    // A newcomer parks for the hold-off and fills the queue.
    const parked = new AbortController();
    const a = ask('other', {}, parked.signal).catch(() => undefined);
    await new Promise((r) => setTimeout(r, 50));
    // B's 503 comes: its retry is due while the hold-off lasts, and the queue has no room for it.
    const res = await b;
    const body = (await res.json()) as { error: { code: string } };
    parked.abort();
    await a;
    expect(res.status).toBe(503);
    expect(body.error.code).toBe('upstream_503');
    expect(res.headers.get('x-should-retry')).toBe('false');
  });
});
