// What the two parking-lot fuzzers share (pools-model-fuzz.test.ts, one client; pools-clients-model-fuzz.test.ts,
// clients and the flex tier): the request as the driver and the model see it, and the model's plain questions about
// the requests (parked, out, ahead in the lot's order). Their drivers stay apart: the clients fuzzer's keys, turns and
// displacement change most of each step's checks.
import { expect } from 'vitest';
import type { Metrics } from '../../src/observability/metrics.ts';
import type { ParkingLot, Ticket } from '../../src/pipeline/parking-lot.ts';
import { gaugeValue } from './model-fuzz.ts';

/** One request parked (perhaps again and again, lent to probes that failed), as the driver and the model see it. */
export interface LotReq {
  id: number;
  target: string;
  route: string;
  cls: number;
  deadlineAtMs: number;
  /** park.maxWaitMs: all its waits together. */
  maxWaitMs: number | undefined;
  /** Time parked before the current wait (serve-targets.ts's parkedMs). */
  parkedMs: number;
  parkedAtMs: number;
  /** The limit the current wait was given (what was left of maxWaitMs). */
  waitLeftMs: number | undefined;
  /** The explicit notBeforeMs of the current wait (probe permits out until then). */
  notBeforeMs: number | undefined;
  /**
   * The target was unavailable at some moment of the current wait: once it is back, the release window decides when
   * the request goes, not the moment it parked with (a breaker another instance's probe closed early lets it go
   * sooner).
   */
  awaySincePark: boolean;
  bytes: number;
  lowest: boolean;
  ctrl: AbortController;
  state: 'parked' | 'released' | 'done';
  /** Order of the current wait's arrival. */
  seq: number;
  ticket?: Ticket;
  streaming: boolean;
}

/** A new request's bookkeeping before its first park() (the fields no draw decides). */
export function unparked(nowMs: number): Pick<LotReq, 'parkedMs' | 'parkedAtMs' | 'waitLeftMs' | 'notBeforeMs' | 'awaySincePark' | 'state' | 'seq' | 'streaming'> {
  return { parkedMs: 0, parkedAtMs: nowMs, waitLeftMs: undefined, notBeforeMs: undefined, awaySincePark: false, state: 'done', seq: 0, streaming: false };
}

/** The model's questions about `reqs` (the run's requests, as they grow) with the routes' minAttemptMs. */
export function lotQueries<R extends LotReq>(reqs: readonly R[], minAttemptMs: number) {
  return {
    parked: (target?: string) => reqs.filter((r) => r.state === 'parked' && (target === undefined || r.target === target)),
    /** Released and still out on `target`, of class `upTo` or higher; `attemptsOnly`: without streams begun (probes). */
    inflight: (target: string, upTo: number, attemptsOnly: boolean) =>
      reqs.filter((r) => r.state === 'released' && r.target === target && r.cls <= upTo && !(attemptsOnly && r.streaming)).length,
    /** Past this moment the request cannot be sent (less than minAttemptMs left). */
    cutoff: (r: R) => r.deadlineAtMs - minAttemptMs,
    /** Ahead in the lot's order: higher class, then earlier deadline, then earlier arrival. */
    ahead: (a: R, b: R) => a.cls < b.cls || (a.cls === b.cls && (a.deadlineAtMs < b.deadlineAtMs || (a.deadlineAtMs === b.deadlineAtMs && a.seq < b.seq))),
  };
}

/** Each route's parked requests within its park.maxQueue, and its gauge saying as many. */
export async function expectRouteQueues(reqs: readonly LotReq[], routes: ReadonlyMap<string, number>, metrics: Metrics, where: string): Promise<void> {
  for (const route of routes.keys()) {
    const count = reqs.filter((r) => r.state === 'parked' && r.route === route).length;
    expect(count, `${route}'s park.maxQueue, ${where}`).toBeLessThanOrEqual(routes.get(route)!);
    expect(gaugeValue(await metrics.parked.get(), { route }) ?? 0, `stormgate_parked_requests{route="${route}"}, ${where}`).toBe(count);
  }
}

/** The wind-down's first move: every parked client leaves, every attempt out ends. */
export function letAllGo(reqs: readonly LotReq[]): void {
  for (const r of reqs.filter((x) => x.state === 'parked')) r.ctrl.abort();
  for (const r of reqs.filter((x) => x.state === 'released')) {
    r.state = 'done';
    r.ticket!.done();
  }
}

/** A wait begins at `nowMs`: its limit is what is left of maxWaitMs after the waits before it. */
export function beginWait(r: LotReq, nowMs: number, notBeforeMs: number | undefined): void {
  r.parkedAtMs = nowMs;
  r.waitLeftMs = r.maxWaitMs === undefined ? undefined : Math.max(0, r.maxWaitMs - r.parkedMs);
  r.notBeforeMs = notBeforeMs;
}

/** What park() is given for `r`'s current wait (the clients fuzzer adds the client). */
export function parkOptions(r: LotReq, maxQueue: number, minAttemptMs: number): Parameters<ParkingLot['park']>[1] {
  return {
    route: r.route,
    deadlineAtMs: r.deadlineAtMs,
    signal: r.ctrl.signal,
    maxQueue,
    maxWaitMs: r.waitLeftMs,
    minAttemptMs,
    cls: r.cls,
    bodyBytes: r.bytes,
    lowestClass: r.lowest,
    ...(r.notBeforeMs !== undefined && { notBeforeMs: r.notBeforeMs }),
  };
}

/** An outcome the lot reported: [kind, when, target pumped (a release's), what the release was judged by]. */
export type LotOutcome<S> = [kind: string, atMs: number, pumped: string | undefined, stateThen: S | undefined];

/**
 * Takes the outcome that is `target`'s answer of `kind` out of those reported. Outcomes are in settle order, but the
 * promise of a request settled within its own park() call is handled after those of the others the call settled: the
 * first outcome of its kind (and target) is its.
 */
export function takeOutcome<S>(outcomes: Array<LotOutcome<S>>, kind: string, target: string): LotOutcome<S> | undefined {
  const i = outcomes.findIndex((o) => o[0] === kind && (kind !== 'released' || o[2] === target));
  return i === -1 ? undefined : outcomes.splice(i, 1)[0];
}
