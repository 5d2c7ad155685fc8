// A stream recovery asked for once the instance's shutdown has begun (the break read as the drain's grace period ran
// out) sends nothing upstream: it must take nothing from the retry budget either. The budget is the fleet's (Redis),
// shared with the instances that stay up through a rolling deploy: each stream the shutdown caught at its break spent a
// retry of theirs, and counted a budget refusal once the budget ran low, for a continuation that was never going to go.
import { describe, expect, it } from 'vitest';
import type { StreamRecovery } from '../src/pipeline/live-stream.ts';
import { streamRecovery } from '../src/pipeline/stream-recovery.ts';
import { RequestAbort } from '../src/pipeline/request-abort.ts';
import { GatewayShutdown } from '../src/pipeline/abort-reasons.ts';
import type { ManagedRequest } from '../src/pipeline/handle-request.ts';
import type { TargetDeps, TargetPlan } from '../src/pipeline/target-attempts.ts';

function setUp() {
  const taken: string[] = [];
  const exhausted: string[] = [];
  const json = { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true };
  const req = { route: { name: 'chat', api: 'chat', config: { streamRecovery: 'continue', budget: { ratio: 0.1, windowS: 10, minRetriesPerSecond: 1 } } }, json, path: '/v1/chat/completions', query: '' } as unknown as ManagedRequest;
  const upstream = { ok: true, request: { path: '/v1/chat/completions', headers: {}, body: Buffer.from(JSON.stringify(json)), translator: undefined } };
  const next = {
    key: 'q/gpt-4o',
    holdOffKey: 'q/gpt-4o',
    breaker: undefined,
    budgetKey: 'chat q/gpt-4o',
    model: 'gpt-4o',
    label: 'q/gpt-4o',
    client: { config: { family: 'openai', prefill: false } },
    upstream: () => upstream,
  } as unknown as TargetPlan;
  const deps = {
    now: () => 0,
    guards: {
      board: { availability: () => ({ kind: 'closed' }), current: () => ({ generation: 0 }) },
      holdOffs: { until: () => undefined, credentialsHeldUntil: () => undefined },
      budget: {
        tryRetry: async (key: string) => {
          taken.push(key);
          return false;
        },
      },
    },
    onBudgetExhausted: (_route: string, target: string) => exhausted.push(target),
  } as unknown as Pick<TargetDeps, 'guards' | 'now' | 'onAttempt' | 'onRetry' | 'onBudgetExhausted'>;
  return { req, next, deps, taken, exhausted };
}

describe('a stream recovery asked for after the shutdown began', () => {
  it('takes no retry from the budget, nor counts a refusal, and sends nothing', async () => {
    const { req, next, deps, taken, exhausted } = setUp();
    const recover = streamRecovery(req, { choices: 1, usage: false } as never, next, new RequestAbort(), deps, []) as StreamRecovery;
    const shutdown = new RequestAbort();
    shutdown.abort(new GatewayShutdown());
    expect(await recover('Hel', 'stream_cut', shutdown, 30_000)).toBeUndefined();
    expect(taken).toEqual([]);
    expect(exhausted).toEqual([]);
  });

  it('nor once its client has gone', async () => {
    const { req, next, deps, taken } = setUp();
    const signal = new RequestAbort();
    const recover = streamRecovery(req, { choices: 1, usage: false } as never, next, signal, deps, []) as StreamRecovery;
    signal.abort(new Error('client gone'));
    expect(await recover('Hel', 'stream_cut', new RequestAbort(), 30_000)).toBeUndefined();
    expect(taken).toEqual([]);
  });

  it('still asks the budget while neither has happened (the refusal counted)', async () => {
    const { req, next, deps, taken, exhausted } = setUp();
    const recover = streamRecovery(req, { choices: 1, usage: false } as never, next, new RequestAbort(), deps, []) as StreamRecovery;
    expect(await recover('Hel', 'stream_cut', new RequestAbort(), 30_000)).toBe('budget');
    expect(taken).toEqual(['chat q/gpt-4o']);
    expect(exhausted).toEqual(['q/gpt-4o']);
  });
});
