// serve-targets.ts on its own, for tests that script tryTarget and heldBack with vi.mock (the mock stays in the test
// file, where vitest hoists it): the plans, the request and the stub lot and clock that serveTargets is called with.
import type { ParkingLot } from '../../src/pipeline/parking-lot.ts';
import { serveTargets, type ServeDeps } from '../../src/pipeline/serve-targets.ts';
import type { RequestContext, TargetPlan } from '../../src/pipeline/target-attempts.ts';
import { classify } from '../../src/policy/outcome.ts';

export type ParkOutcome = Awaited<ReturnType<ParkingLot['park']>>;

/** A target plan with only what serveTargets reads (a route that shares hold-offs, as chat does): the pool's shed estimate is always 1,234 ms. */
export const scriptedPlan = (key: string): TargetPlan =>
  ({ key, label: key, holdOffKey: key, limitKey: key, sharesHoldOffs: true, cls: 0, className: 'online', lowestClass: false, ownModel: false, retry: { maxWaitHintMs: 10_000, retryOn: ['5xx', 'timeout'] }, pool: { shedWaiting: () => 1_234 } }) as unknown as TargetPlan;

export interface ScriptedServeOptions {
  /** How long each wait in the lot takes on the clock. Default 0. */
  parkMs?: number;
  /** The lot's count of requests waiting for `key`, given how many times this request has parked. Default 0. */
  waiting?: (key: string, parks: number) => number;
  /** The route's park settings. Default { maxQueue: 100 }. */
  park?: false | { maxQueue: number; maxWaitMs?: number };
}

/**
 * Serves one request on targets `keys` at `clock.now` (a 30 s deadline); the lot answers `parks` in turn, then
 * `timeout`, each wait moving the clock by `parkMs`.
 */
export async function serveScripted(clock: { now: number }, keys: string[], parks: ParkOutcome[], o: ScriptedServeOptions = {}) {
  const parked: string[] = [];
  const opts: Array<Record<string, unknown>> = [];
  const fallbacks: string[] = [];
  const ctx = {
    route: { name: 'chat', config: { minAttemptMs: 100 } },
    deadlineAtMs: clock.now + 30_000,
    signal: new AbortController().signal,
    skipped: [],
    attempts: [],
    parkable: true,
  } as unknown as RequestContext;
  const deps = {
    now: () => clock.now,
    lot: {
      waiting: (key: string) => o.waiting?.(key, parked.length) ?? 0,
      park: async (key: string, asked: Record<string, unknown>) => {
        parked.push(key);
        opts.push(asked);
        clock.now += o.parkMs ?? 0;
        return parks.shift() ?? { kind: 'timeout' };
      },
    },
    guards: { holdOffs: { credentialsHeldFor: () => undefined } },
    onFallback: (_route: string, from: string, to: string) => fallbacks.push(`${from}>${to}`),
  } as unknown as ServeDeps;
  const served = await serveTargets(ctx, keys.map(scriptedPlan), undefined, o.park ?? { maxQueue: 100 }, deps);
  return { served, parked, opts, fallbacks, skipped: ctx.skipped, attempts: ctx.attempts };
}

/** What a scripted tryTarget or heldBack answers: a 503 failure, a success, the target's own hold-off ending `inMs` from `clock.now`. */
export function scriptedAnswers(clock: { now: number }) {
  const http503 = { outcome: { kind: 'http', status: 503, errorCode: null, hint: undefined } } as const;
  return {
    http503,
    failed503: { kind: 'failed', result: http503, cls: classify(http503.outcome), retryAfterMs: undefined },
    ok: { kind: 'ok', result: { status: 200 } },
    ownHoldOff: (inMs: number) => ({ kind: 'unavailable', reason: 'hold-off', availableAtMs: clock.now + inMs, own: true }),
  };
}
