// Mutation tests (QA mut30) for the pure policy modules src/policy/adaptive-limit.ts, target-rate.ts, client-rate.ts,
// hold-off-wait.ts and for src/http/admission.ts: each pins a behaviour that a plausible wrong change (a comparison
// flipped at an edge, a floor dropped, a clock read against the wrong event) left every covering suite passing.
// Pure functions on fixed clocks and fixed draws; admission through a gateway in front of the bundled mock.
import { describe, expect, it } from 'vitest';
import { ConfigSchema } from '../src/config/schema.ts';
import { classLimit, initialLimit, onRateLimited, onRecovered, onSuccess, type LimitSettings } from '../src/policy/adaptive-limit.ts';
import { rateOf } from '../src/policy/client-rate.ts';
import { rateGiveBack, rateSpend, rateWait, type TargetDues, type TargetRates } from '../src/policy/target-rate.ts';
import { defaultConfig, RETRY_LOOP_ONLY, useExtraMocks, useGateways } from './helpers/stack.ts';

describe('the adaptive limit', () => {
  /** Requests wait for a slot: the limit binds whatever is in flight (and nothing in flight is clamped to). */
  const WAITING = { total: 0, byClass: [0, 0], waiting: 1 };

  it('notes where to slow-start back to at the burst\'s first signal, not again at each later cut of the same burst', () => {
    // Signals 60 ms apart (a round trip is 100 ms) are one burst: its start (20) says slow-start back to 10, and the
    // second cut at 120 ms, a round trip after the first but not after the last signal, must not halve that again.
    const s: LimitSettings = { max: 20, min: 1, decrease: 0.5, minShares: [1] };
    let st = onRateLimited(initialLimit(s), s, 0, 100, WAITING);
    st = onRateLimited(st, s, 60, 100, WAITING);
    st = onRateLimited(st, s, 120, 100, WAITING);
    expect(st.limit).toBe(5);
    expect(st.recoverTo).toBe(10);
    // A quiet round trip later, the first success starts the slow start back to 10.
    expect(onSuccess(st, s, 300, 100)).toMatchObject({ limit: 6, slowStartTo: 10 });
  });

  it('never cuts a lower class\'s cap below its minShare of the limit, however deep the decrease', () => {
    // Batch's floor is half the limit (5 of 10): a decrease of 0.3 would take its cap to 3.
    const s: LimitSettings = { max: 10, min: 1, decrease: 0.3, minShares: [0.5, 0.5] };
    const cut = onRateLimited(initialLimit(s), s, 0, 100, WAITING);
    expect(cut.limit).toBe(10);
    expect(classLimit(cut, 1)).toBe(5);
  });

  it('rounds a class\'s floor down: a minShare of 0.5 under a limit of 9 keeps batch 4 slots, not 5', () => {
    // The pool's floor hold rounds the same share down (Math.floor(minShare x limit)): rounded up here, batch kept a
    // slot more than its floor when 429s said to shrink it, the slot online then waited for.
    const s: LimitSettings = { max: 9, min: 1, decrease: 0.1, minShares: [0.5, 0.5] };
    const cut = onRateLimited(initialLimit(s), s, 0, 100, WAITING);
    expect(cut.limit).toBe(9);
    expect(classLimit(cut, 1)).toBe(4);
  });

  it('lets a class no more attempts than its fractional cap rounded down, and the top class no more than the limit\'s', () => {
    // A cut of 0.95 leaves fractions: a cap of 9.5 is 9 in flight, or the cut would take a whole slot later than said.
    const s: LimitSettings = { max: 10, min: 1, decrease: 0.95, minShares: [0.5, 0.1] };
    const cut = onRateLimited(initialLimit(s), s, 0, 100, WAITING);
    expect(cut.caps[1]).toBeCloseTo(9.5, 9);
    expect(classLimit(cut, 1)).toBe(9);
    expect(classLimit({ ...cut, limit: 7.6 }, 0)).toBe(7);
  });

  it('clamps the limit, not batch, when a 429 finds batch at its floor already', () => {
    // Batch has exactly its floor (half of 10) in flight: it cannot give up a slot, so the clamp falls on the limit
    // (10 in flight, so 9). Taken as a clamp of batch to its floor, it left the limit at 10 and the cut that follows
    // took the limit itself rather than batch's share.
    const s: LimitSettings = { max: 10, min: 1, decrease: 0.9, minShares: [0.5, 0.5] };
    const st = onRateLimited(initialLimit(s), s, 0, 100, { total: 10, byClass: [5, 5] });
    expect(st.limit).toBe(9);
    expect(classLimit(st, 1)).toBe(8);
  });

  it('restarts at half an odd limit rounded down after an outage, and slow-starts back to exactly that limit', () => {
    const s: LimitSettings = { max: 20, min: 1, decrease: 0.9, minShares: [1] };
    let st = onRecovered({ ...initialLimit(s), limit: 9 }, s);
    expect(st).toMatchObject({ limit: 4, slowStartTo: 9 });
    for (let i = 0; i < 5; i++) st = onSuccess(st, s, 1_000 + i, 100);
    // +1 per success: 5, 6, 7, 8, 9, and the slow start is over at the limit it had, not half a slot past it.
    expect(st).toMatchObject({ limit: 9, slowStartTo: undefined });
  });

  it('takes the share of refusals judged noise over two whole round trips, not one, however many answers came', () => {
    // 429s come back at once and answers a round trip later: forty answers inside one round trip may all be of one
    // kind, so the noise is judged again only once two round trips have passed.
    const s: LimitSettings = { max: 100, min: 1, decrease: 0.9, minShares: [0.5, 0.1] };
    const noisy = { ...initialLimit(s), noiseShare: 0.3, tally: { ok: 39, refused: 0, limit: 100, fromMs: 0 } };
    expect(onSuccess(noisy, s, 150, 100).noiseShare).toBe(0.3);
    expect(onSuccess(noisy, s, 199, 100).noiseShare).toBe(0.3);
    expect(onSuccess(noisy, s, 200, 100).noiseShare).toBeUndefined();
  });
});

describe('a target\'s rates', () => {
  it('gives back the request a grant spent on an attempt that was never sent', () => {
    // A burst of one request: spent, the next waits an interval; given back, the next goes at once.
    const rates = { requests: rateOf(60, 1) } satisfies TargetRates;
    const dues: TargetDues = {};
    rateSpend(dues, rates, 1_000, 0);
    expect(rateWait(dues, rates, 1_000, 0)).toBe(1_000);
    rateGiveBack(dues, rates, 1_000, 0);
    expect(dues.requests).toBeUndefined();
    expect(rateWait(dues, rates, 1_000, 0)).toBe(0);
  });
});

describe('admission, through a gateway in front of the bundled mock', () => {
  const startGateway = useGateways();
  const startMock = useExtraMocks();

  it('never counts the ops endpoints, open without a client key, against the "*" client rate', async () => {
    // A "*" rate of one request a minute: a probe every few seconds (no key: it is not a client) must neither be
    // refused nor use up a rate, or a kubelet's liveness probe is answered 429 and the pod restarted.
    const mock = await startMock();
    const config = ConfigSchema.parse({
      ...defaultConfig(mock.url, RETRY_LOOP_ONLY),
      auth: { keys: { agents: 'key-agents' }, limits: { '*': { requestsPerMinute: 1, burst: 1 } } },
    });
    const url = await startGateway(config);
    const probes = [];
    for (const path of ['/healthz', '/healthz', '/readyz', '/readyz', '/metrics', '/metrics']) probes.push((await fetch(`${url}${path}`)).status);
    expect(probes).toEqual([200, 200, 200, 200, 200, 200]);
    const chat = await fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: 'Bearer key-agents', 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(chat.status).toBe(200);
  });
});
