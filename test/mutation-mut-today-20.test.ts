// Mutants of target-attempts.ts the other tests let live, killed here with tryTarget alone: the pool's slot and the
// outcome's recording scripted, the guards fakes that count what the budget is asked, the clock fixed. What the budget
// sees of a retry the target's going away interrupted (`retryPaid` when it was found gone in the pool's queue: paid
// once, not again when it comes back), of a released retry that fails and is released again (`releasedUnrefused`: once
// unrefused, then taken, and refused by a spent budget), and of a client's own retry (counted as a retry on its first
// target only: the fallback's first attempt is a request). Not here: dropping `ticket?.done()` where a target is found
// gone changes nothing a client sees (serve-targets.ts gives the ticket back after every answer but a stream's), and
// the shed after a failure and the held-off retry's `why` are killed by retry-shed and hold-off-retry-after.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import type { AttemptOutcome } from '../src/policy/outcome.ts';
import { RequestAbort } from '../src/pipeline/request-abort.ts';
import { newRun, payWaitedOutRetry, tryTarget, type RequestContext, type TargetDeps, type TargetPlan, type TargetResult } from '../src/pipeline/target-attempts.ts';
import type { Ticket } from '../src/pipeline/parking-lot.ts';
import { RetrySchema } from '../src/config/schema.ts';

type Answer = 'ok' | 503 | 'gone';
const script = vi.hoisted(() => ({
  answers: [] as Array<{ answer: 'ok' | 503 | 'gone'; then?: () => void }>,
  sent: [] as Array<Record<string, string>>,
}));

vi.mock('../src/pipeline/slot-attempt.ts', async (importOriginal) => {
  const real = await importOriginal<typeof import('../src/pipeline/slot-attempt.ts')>();
  const { classify: cls } = await import('../src/policy/outcome.ts');
  return {
    ...real,
    attemptInSlot: async (_ctx: unknown, _plan: unknown, upstream: { headers: Record<string, string> }) => {
      const next = script.answers.shift();
      if (!next) throw new Error('no answer scripted');
      next.then?.();
      if (next.answer === 'gone') return { kind: 'gone', reason: 'hold-off', availableAtMs: 10_000 };
      script.sent.push(upstream.headers);
      const outcome: AttemptOutcome = next.answer === 'ok' ? { kind: 'ok', status: 200 } : { kind: 'http', status: 503, errorCode: null, hint: undefined };
      return { kind: 'done', result: { outcome, status: outcome.status }, cls: cls(outcome), durationMs: 1, release: () => {}, slotWaitMs: 0 };
    },
  };
});
vi.mock('../src/pipeline/record-outcome.ts', async (importOriginal) => {
  const real = await importOriginal<typeof import('../src/pipeline/record-outcome.ts')>();
  return { ...real, recordOutcome: async () => undefined };
});

let heldUntil: number | undefined;
let retriesLeft: number;
let calls: string[];
let exhausted: number;

beforeEach(() => {
  script.answers = [];
  script.sent = [];
  heldUntil = undefined;
  retriesLeft = 0;
  calls = [];
  exhausted = 0;
});
afterEach(() => {
  expect(script.answers).toEqual([]);
});

const NOW = 1_000;

function deps(): TargetDeps {
  return {
    now: () => NOW,
    random: () => 0,
    sleep: async () => {},
    guards: {
      holdOffs: { firstRead: () => undefined, credentialsHeldUntil: () => undefined, until: () => heldUntil },
      board: {
        admit: async () => ({ admitted: true, probe: undefined }),
        availability: () => ({ kind: 'closed' }),
        current: () => ({ generation: 0 }),
        unused: () => {},
      },
      budget: {
        countRequest: () => void calls.push('countRequest'),
        countRetry: async () => {
          calls.push('countRetry');
          return retriesLeft > 0;
        },
        tryRetry: async () => {
          calls.push('tryRetry');
          return retriesLeft-- > 0;
        },
      },
    } as never,
    onBudgetExhausted: () => void exhausted++,
  };
}

function plan(label = 'p/gpt-4o', maxAttempts = 3): TargetPlan {
  return {
    key: label,
    sharesHoldOffs: true,
    holdOffKey: label,
    limitKey: label,
    label,
    model: 'gpt-4o',
    ownModel: false,
    client: { config: { timeouts: { firstTokenMs: 10_000, responseMs: 30_000 } } },
    upstream: () => ({ ok: true, request: { path: '/v1/chat/completions', headers: {}, body: '{}' } }),
    retry: RetrySchema.parse({ maxAttempts, backoff: { baseMs: 10, capMs: 20 } }),
    weight: 1,
    breaker: undefined,
    budgetKey: label,
    pool: {},
    cls: 0,
    className: 'default',
    lowestClass: true,
  } as unknown as TargetPlan;
}

function context(clientRetries = 0): RequestContext {
  return {
    route: { name: 'chat', config: { minAttemptMs: 0, park: {}, budget: {} } },
    api: 'chat',
    stream: false,
    shape: {},
    signal: new RequestAbort(),
    deadlineAtMs: NOW + 60_000,
    attempts: [],
    skipped: [],
    parkable: true,
    clientRetries,
  } as unknown as RequestContext;
}

const answers = (...a: Array<Answer | { answer: Answer; then: () => void }>) => {
  script.answers.push(...a.map((x) => (typeof x === 'object' ? x : { answer: x })));
};
const ticket = (): Ticket => ({ done: vi.fn(), streaming: vi.fn() });
const lone = { later: false, earlier: false };

describe('a retry found its target gone while it waited for a slot (retryPaid)', () => {
  it('is not taken from the budget again when it comes back without a release', async () => {
    const ctx = context();
    const p = plan();
    const run = newRun();
    retriesLeft = 1;
    // 503, its retry taken from the budget; queued for a slot, the target is held off meanwhile.
    answers(503, 'gone');
    const first = await tryTarget(ctx, p, run, deps(), lone);
    expect(first.kind).toBe('unavailable');
    expect(calls).toEqual(['countRequest', 'tryRetry']);
    // Back (a last look, a move): the retry goes, on the one the budget already gave.
    answers('ok');
    const second = await tryTarget(ctx, p, run, deps(), lone);
    expect(second.kind).toBe('ok');
    expect(calls).toEqual(['countRequest', 'tryRetry']);
    expect(exhausted).toBe(0);
    expect(ctx.attempts.map((a) => [a.attempt, a.reason])).toEqual([[0, 'status_503'], [1, 'ok']]);
    expect(script.sent[1]).toMatchObject({ 'x-retry-attempt': '1' });
  });

  it('is not counted in the budget a second time when the lot releases it', async () => {
    const ctx = context();
    const p = plan();
    const run = newRun();
    retriesLeft = 1;
    answers(503, 'gone');
    await tryTarget(ctx, p, run, deps(), lone);
    answers('ok');
    const second = await tryTarget(ctx, p, run, deps(), lone, ticket());
    expect(second.kind).toBe('ok');
    // One retry sent, one retry in the budget.
    expect(calls).toEqual(['countRequest', 'tryRetry']);
  });
});

describe('a first attempt that found its target gone while it waited for a slot (counted)', () => {
  it('is counted in the budget as one request, not again when it comes back and goes', async () => {
    const ctx = context();
    const p = plan();
    const run = newRun();
    answers('gone');
    expect((await tryTarget(ctx, p, run, deps(), lone)).kind).toBe('unavailable');
    answers('ok');
    expect((await tryTarget(ctx, p, run, deps(), lone, ticket())).kind).toBe('ok');
    // Mutation round 44: counted twice, every such request enlarged the budget (a share of requests) by a phantom one.
    expect(calls).toEqual(['countRequest']);
  });
});

describe('a retry that waited out its own hold-off outside the lot (payWaitedOutRetry)', () => {
  it('is counted in the budget once, however often the wait found the target still held off', async () => {
    const run = newRun();
    await payWaitedOutRetry(context(), plan(), run, deps());
    await payWaitedOutRetry(context(), plan(), run, deps());
    // Paced: counted, never taken; and once (mutation round 44: paid at each look, one retry spent two).
    expect(calls).toEqual(['countRetry']);
    expect(run.retryPaid).toBe(true);
  });
});

describe('a released retry that fails and parks again (releasedUnrefused)', () => {
  it('goes unrefused once; released again, it is taken from the budget, and a spent budget ends it', async () => {
    const ctx = context();
    const p = plan();
    const run = newRun();
    retriesLeft = 0;
    // Someone's hold-off outlasts each backoff: the retry waits for it in the lot, unpaid.
    const heldOff = () => {
      heldUntil = NOW + 10_000;
    };
    answers({ answer: 503, then: heldOff });
    expect((await tryTarget(ctx, p, run, deps(), lone)).kind).toBe('unavailable');
    expect(calls).toEqual(['countRequest']);
    // Released: counted, not refused, though the budget is spent. It fails again, and waits again.
    heldUntil = undefined;
    answers({ answer: 503, then: heldOff });
    expect((await tryTarget(ctx, p, run, deps(), lone, ticket())).kind).toBe('unavailable');
    expect(calls).toEqual(['countRequest', 'countRetry']);
    // Released again: the budget is asked, refuses, and the request ends with its last failure, nothing sent.
    heldUntil = undefined;
    const third = await tryTarget(ctx, p, run, deps(), lone, ticket());
    expect(third).toMatchObject({ kind: 'failed', why: 'budget', result: { status: 503 } });
    expect(calls).toEqual(['countRequest', 'countRetry', 'tryRetry']);
    expect(exhausted).toBe(1);
    expect(ctx.attempts).toHaveLength(2);
  });
});

describe('a client\'s own retry (x-stainless-retry-count > 0)', () => {
  it('is counted as a retry on its first target, and on the fallback after it as a request', async () => {
    const ctx = context(1);
    // The primary retries nothing (maxAttempts 1): its 503 sends the request on.
    const primary = plan('p/gpt-4o', 1);
    const fallback = plan('q/gpt-4o');
    retriesLeft = 5;
    answers(503);
    const failed = (await tryTarget(ctx, primary, newRun(), deps(), { later: true, earlier: false })) as TargetResult & { kind: 'failed' };
    expect(failed).toMatchObject({ kind: 'failed', why: 'retries_exhausted' });
    expect(calls).toEqual(['countRetry']);
    calls = [];
    answers('ok');
    expect((await tryTarget(ctx, fallback, newRun(), deps(), lone)).kind).toBe('ok');
    expect(calls).toEqual(['countRequest']);
  });

  it('leaves a fallback whose budget is spent its own retries: it is not the client\'s retry there', async () => {
    const ctx = context(1);
    ctx.attempts.push({ target: 'p/gpt-4o', attempt: 0, reason: 'status_503', status: 503, waitMs: 0, durationMs: 1 });
    retriesLeft = 0;
    const run = newRun();
    answers(503);
    const r = await tryTarget(ctx, plan('q/gpt-4o'), run, deps(), lone);
    // Refused by the budget when the retry is due (tryRetry), not marked noRetries up front by a counted retry.
    expect(r).toMatchObject({ kind: 'failed', why: 'budget' });
    expect(calls).toEqual(['countRequest', 'tryRetry']);
    expect(run.noRetries).toBe(false);
  });
});
