// The figures of one run, from the clients' records and the mock's per-second counts. Seconds are whole unix seconds
// (the mock's buckets); runs start on a whole second, so the phases fall on bucket boundaries to within a few ms.
import { percentile } from '../lib/stats.ts';
import type { RunResult } from './run.ts';
import type { Logical } from './traffic.ts';

export interface RunFigures {
  /** Logical client requests (users' requests, retries not counted). */
  logical: number;
  /** Requests that reached the mock provider, retries included. */
  upstream: number;
  /** Mean upstream requests per second in the steady phase (its first second left out: partly warm-up). */
  steadyRps: number;
  /** Upstream requests in the brownout's seconds / logical requests that arrived in the same seconds. */
  amplification: number;
  /** Highest upstream requests per second during the brownout / steadyRps. */
  peakBrownoutRatio: number;
  /** Highest upstream requests per second in the 10 s after the brownout / steadyRps. */
  peakRecoveryRatio: number;
  successRate: number;
  /**
   * Seconds after the brownout's end until the share of successful answers, among those completed in each second,
   * is at least 99% in that second and every later one of the recovery phase; null when that never happens.
   */
  recoveryS: number | null;
  /** Of the logical request, from its scheduled arrival to its final answer (retries and waits included). */
  p50Ms: number;
  p99Ms: number;
  /** Logical requests with at least one attempt the client abandoned at its deadline (no answer had come by then). */
  lateAnswers: number;
  /** Attempts the clients abandoned at their deadline. */
  timedOutAttempts: number;
  /** Share of upstream requests answered 429 in the 10 s after the brownout. */
  share429After: number;
  /** Upstream requests answered 429 over the whole run. */
  upstream429: number;
  /** Final outcomes of the logical requests: '200', '503', 'timeout', ... */
  outcomes: Record<string, number>;
  unfinished: number;
  maxSendLagMs: number;
  /** The load generator's CPU, in cores: near 1, it could not keep up and its timers fired late. */
  loadGeneratorCores: number;
  otherCpuShare: number | undefined;
  /** CPU of the mock and the gateway over the run, in cores (undefined off Linux, or without a gateway). */
  mockCores: number | undefined;
  gatewayCores: number | undefined;
}

const AFTER_S = 10;

/** Unix seconds [from, to) of a phase given in ms: rounded, since every phase starts within ms of a whole second. */
function seconds(fromMs: number, toMs: number): number[] {
  const out: number[] = [];
  for (let s = Math.round(fromMs / 1000); s < Math.round(toMs / 1000); s++) out.push(s);
  return out;
}

export function runFigures(r: RunResult): RunFigures {
  const bySecond = new Map(r.upstream.map((b) => [b.second, b]));
  const total = (s: number) => bySecond.get(s)?.total ?? 0;
  const sum = (ss: number[], f: (s: number) => number) => ss.reduce((a, s) => a + f(s), 0);

  const steady = seconds(r.startAt + 1000, r.brownoutAt);
  const brownout = seconds(r.brownoutAt, r.brownoutEndAt);
  const after = seconds(r.brownoutEndAt, r.brownoutEndAt + AFTER_S * 1000);
  const steadyRps = sum(steady, total) / steady.length;
  const reqs = r.traffic.requests;
  const arrivedIn = (ss: number[]) => reqs.filter((q) => q.at >= ss[0]! * 1000 && q.at < (ss.at(-1)! + 1) * 1000).length;
  const upstreamAfter = sum(after, total);
  const finished = reqs.filter((q) => q.endAt !== undefined);
  const latencies = finished.map((q) => q.endAt! - q.at);
  const outcomes: Record<string, number> = {};
  for (const q of reqs) outcomes[q.outcome] = (outcomes[q.outcome] ?? 0) + 1;

  return {
    logical: reqs.length,
    upstream: r.upstreamTotal,
    steadyRps,
    amplification: sum(brownout, total) / arrivedIn(brownout),
    peakBrownoutRatio: Math.max(...brownout.map(total)) / steadyRps,
    peakRecoveryRatio: Math.max(...after.map(total)) / steadyRps,
    successRate: reqs.filter((q) => q.ok).length / reqs.length,
    recoveryS: recoverySeconds(reqs, r.brownoutEndAt, r.arrivalsEndAt),
    p50Ms: percentile(latencies, 50),
    p99Ms: percentile(latencies, 99),
    lateAnswers: reqs.filter((q) => q.clientTimeouts > 0).length,
    timedOutAttempts: reqs.reduce((a, q) => a + q.clientTimeouts, 0),
    share429After: upstreamAfter === 0 ? 0 : sum(after, (s) => bySecond.get(s)?.byStatus['429'] ?? 0) / upstreamAfter,
    upstream429: r.upstream.reduce((a, b) => a + (b.byStatus['429'] ?? 0), 0),
    outcomes,
    unfinished: reqs.length - finished.length,
    maxSendLagMs: r.traffic.maxSendLagMs,
    loadGeneratorCores: r.traffic.cpuCores,
    otherCpuShare: r.cpu.otherShare,
    mockCores: r.mockCores,
    gatewayCores: r.gatewayCores,
  };
}

/** Success share of the answers completed in each second after `fromMs`, until `toMs`; NaN for a second without any. */
function successPerSecond(reqs: readonly Logical[], fromMs: number, toMs: number): number[] {
  const n = Math.floor((toMs - fromMs) / 1000);
  const done = new Array<number>(n).fill(0);
  const ok = new Array<number>(n).fill(0);
  for (const q of reqs) {
    if (q.endAt === undefined || q.endAt < fromMs) continue;
    const k = Math.floor((q.endAt - fromMs) / 1000);
    if (k >= n) continue;
    done[k]!++;
    if (q.ok) ok[k]!++;
  }
  return done.map((d, k) => (d === 0 ? Number.NaN : ok[k]! / d));
}

function recoverySeconds(reqs: readonly Logical[], fromMs: number, toMs: number): number | null {
  const shares = successPerSecond(reqs, fromMs, toMs);
  // A second without any answer is not a recovered second: the users are still waiting.
  let k = shares.length;
  while (k > 0 && shares[k - 1]! >= 0.99) k--;
  return k === shares.length ? null : k;
}
