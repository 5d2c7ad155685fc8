// The run's figures and targets, from the clients' records (online by scheduled time, batch by completion time), the
// provider's per-second counts and the gateway's metrics samples; and the per-second timeline of the report.
import type { MockStats } from '../../src/mock/server.ts';
import { percent, percentile } from '../lib/stats.ts';
import type { Sample } from './sampler.ts';
import { SETTINGS } from './settings.ts';
import type { BatchRecord, OnlineRecord } from './traffic.ts';

/** Times of the run, ms since the epoch (whole seconds, so they line up with the mock's per-second buckets). */
export interface Timeline {
  startAt: number;
  floodAt: number;
  endAt: number;
}

export interface OnlineFigures {
  requests: number;
  ok: number;
  successRate: number;
  /** Latency of the successes, from the scheduled send time to the whole answer. */
  p50Ms: number;
  p99Ms: number;
  maxMs: number;
  /**
   * p99 of the gateway's own time for the same successes (its log's durationMs, from parsed headers to the answer), and
   * p99 of the rest (client latency - gateway time: the load generator, the network, accepting and parsing the request).
   */
  handlerP99Ms: number;
  outsideP99Ms: number;
  /** Answered requests per second (200s), over the window. */
  okRps: number;
  /** Failures by status and code, e.g. "429 rate_limit_exceeded": 3. */
  failures: Record<string, number>;
  /** Successes the gateway needed more than one upstream attempt for (x-stormgate-attempts > 1). */
  retried: number;
}

interface BatchFigures {
  /** Batch answers completed in the window, by outcome. */
  ok: number;
  okRps: number;
  failures: Record<string, number>;
  /** Capacity left by online: capacityRps - online's answered rate in the same window. */
  leftRps: number;
  shareOfLeft: number;
  p50Ms: number;
}

interface UpstreamFigures {
  answered: number;
  status429: number;
  share429: number;
  byStatus: Record<string, number>;
}

export interface Figures {
  windows: Record<string, [number, number]>;
  onlineBaseline: OnlineFigures;
  onlineFlood: OnlineFigures;
  onlineFloodConverged: OnlineFigures;
  /** Online p99 allowed with the flood: p99Factor x baseline p99 + p99AddMs. */
  p99LimitMs: number;
  batch: BatchFigures;
  upstreamConverged: UpstreamFigures;
  upstreamConvergence: UpstreamFigures;
}

export interface Check {
  name: string;
  value: string;
  target: string;
  pass: boolean;
}

const failureKey = (r: { status: number; code?: string }) => (r.code === undefined ? String(r.status) : `${r.status} ${r.code}`);

function onlineFigures(records: readonly OnlineRecord[], [from, to]: [number, number], handlerMs: ReadonlyMap<string, number>): OnlineFigures {
  const inWindow = records.filter((r) => r.at >= from && r.at < to);
  const ok = inWindow.filter((r) => r.status === 200);
  const lat = ok.map((r) => r.latencyMs!);
  const failures: Record<string, number> = {};
  for (const r of inWindow) if (r.status !== 200) failures[failureKey(r)] = (failures[failureKey(r)] ?? 0) + 1;
  return {
    requests: inWindow.length,
    ok: ok.length,
    successRate: inWindow.length === 0 ? Number.NaN : ok.length / inWindow.length,
    p50Ms: percentile(lat, 50),
    p99Ms: percentile(lat, 99),
    maxMs: lat.length === 0 ? Number.NaN : Math.max(...lat),
    handlerP99Ms: percentile(ok.flatMap((r) => (handlerMs.has(r.id) ? [handlerMs.get(r.id)!] : [])), 99),
    outsideP99Ms: percentile(ok.flatMap((r) => (handlerMs.has(r.id) ? [r.latencyMs! - handlerMs.get(r.id)!] : [])), 99),
    okRps: ok.length / ((to - from) / 1000),
    failures,
    retried: ok.filter((r) => (r.attempts ?? 1) > 1).length,
  };
}

function batchFigures(records: readonly BatchRecord[], onlineOkRps: number, [from, to]: [number, number]): BatchFigures {
  const inWindow = records.filter((r) => r.endAt >= from && r.endAt < to);
  const ok = inWindow.filter((r) => r.status === 200);
  const failures: Record<string, number> = {};
  for (const r of inWindow) if (r.status !== 200) failures[failureKey(r)] = (failures[failureKey(r)] ?? 0) + 1;
  const okRps = ok.length / ((to - from) / 1000);
  const leftRps = SETTINGS.capacityRps - onlineOkRps;
  return { ok: ok.length, okRps, failures, leftRps, shareOfLeft: okRps / leftRps, p50Ms: percentile(ok.map((r) => r.latencyMs), 50) };
}

/** The provider's answers by status in [from, to), from its per-second buckets (endings are counted per second). */
function upstreamFigures(perSecond: MockStats['perSecond'], [from, to]: [number, number]): UpstreamFigures {
  const byStatus: Record<string, number> = {};
  for (const b of perSecond) {
    if (b.second * 1000 < from || b.second * 1000 >= to) continue;
    for (const [k, v] of Object.entries(b.byStatus)) byStatus[k] = (byStatus[k] ?? 0) + v;
  }
  const answered = Object.values(byStatus).reduce((a, b) => a + b, 0);
  const status429 = byStatus['429'] ?? 0;
  return { answered, status429, share429: answered === 0 ? Number.NaN : status429 / answered, byStatus };
}

/** The run's windows, ms since the epoch. */
export function windowsOf(t: Timeline): Record<string, [number, number]> {
  const tl = SETTINGS.timeline;
  return {
    baseline: [t.startAt, t.floodAt],
    flood: [t.floodAt, t.endAt],
    convergence: [t.floodAt, t.endAt - tl.convergedWindowMs],
    batchWindow: [t.endAt - tl.batchWindowMs, t.endAt],
    converged: [t.endAt - tl.convergedWindowMs, t.endAt],
  };
}

export function runFigures(
  t: Timeline,
  online: readonly OnlineRecord[],
  batch: readonly BatchRecord[],
  perSecond: MockStats['perSecond'],
  handlerMs: ReadonlyMap<string, number>,
): Figures {
  const windows = windowsOf(t);
  const onlineBaseline = onlineFigures(online, windows['baseline']!, handlerMs);
  const onlineInBatchWindow = onlineFigures(online, windows['batchWindow']!, handlerMs);
  return {
    windows,
    onlineBaseline,
    onlineFlood: onlineFigures(online, windows['flood']!, handlerMs),
    onlineFloodConverged: onlineInBatchWindow,
    p99LimitMs: SETTINGS.targets.p99Factor * onlineBaseline.p99Ms + SETTINGS.targets.p99AddMs,
    batch: batchFigures(batch, onlineInBatchWindow.okRps, windows['batchWindow']!),
    upstreamConverged: upstreamFigures(perSecond, windows['converged']!),
    upstreamConvergence: upstreamFigures(perSecond, windows['convergence']!),
  };
}

const pct = (x: number, digits = 1) => percent(x, digits);

export function checks(f: Figures): Check[] {
  const T = SETTINGS.targets;
  const batchS = SETTINGS.timeline.batchWindowMs / 1000;
  const convS = SETTINGS.timeline.convergedWindowMs / 1000;
  return [
    {
      name: 'Online success rate during the flood',
      value: `${pct(f.onlineFlood.successRate, 2)} (${f.onlineFlood.ok}/${f.onlineFlood.requests})`,
      target: `>= ${pct(T.onlineSuccess)}`,
      pass: f.onlineFlood.successRate >= T.onlineSuccess,
    },
    {
      name: 'Online p99 during the flood',
      value: `${f.onlineFlood.p99Ms.toFixed(0)} ms (without: ${f.onlineBaseline.p99Ms.toFixed(0)} ms, ratio ${(f.onlineFlood.p99Ms / f.onlineBaseline.p99Ms).toFixed(2)})`,
      target: `<= ${T.p99Factor} x without + ${T.p99AddMs} ms = ${f.p99LimitMs.toFixed(0)} ms`,
      pass: f.onlineFlood.p99Ms <= f.p99LimitMs,
    },
    {
      name: `Batch throughput, share of the capacity online leaves (last ${batchS} s)`,
      value: `${pct(f.batch.shareOfLeft)} (${f.batch.okRps.toFixed(0)} of ${f.batch.leftRps.toFixed(0)} req/s)`,
      target: `>= ${pct(T.batchShare, 0)}`,
      pass: f.batch.shareOfLeft >= T.batchShare,
    },
    {
      name: `Upstream answers that are 429, after convergence (last ${convS} s)`,
      value: `${pct(f.upstreamConverged.share429, 2)} (${f.upstreamConverged.status429}/${f.upstreamConverged.answered})`,
      target: `<= ${pct(T.upstream429, 0)}`,
      pass: f.upstreamConverged.share429 <= T.upstream429,
    },
  ];
}

export interface SecondRow {
  /** Seconds since the start of the run. */
  s: number;
  onlineSent: number;
  onlineOk: number;
  onlineP99Ms: number;
  batchOk: number;
  batchFailed: number;
  mock200: number;
  mock429: number;
  mockInflight: number | undefined;
  limit: number | undefined;
  inUseOnline: number | undefined;
  inUseBatch: number | undefined;
  queuedBatch: number | undefined;
  /** Batch requests shed by the gateway in that second (from the shed counter). */
  shedBatch: number | undefined;
}

/** One row per second of the run: online by scheduled second, batch by completion second, the last sample in each second. */
export function timeline(t: Timeline, online: readonly OnlineRecord[], batch: readonly BatchRecord[], perSecond: MockStats['perSecond'], samples: readonly Sample[]): SecondRow[] {
  const rows: SecondRow[] = [];
  const seconds = Math.round((t.endAt - t.startAt) / 1000);
  const shedOf = (s: Sample | undefined) => (s === undefined ? undefined : Object.entries(s.shed).filter(([k]) => k.startsWith('batch/')).reduce((a, [, v]) => a + v, 0));
  for (let i = 0; i < seconds; i++) {
    const from = t.startAt + i * 1000;
    const to = from + 1000;
    const o = online.filter((r) => r.at >= from && r.at < to);
    const ok = o.filter((r) => r.status === 200);
    const b = batch.filter((r) => r.endAt >= from && r.endAt < to);
    const bucket = perSecond.find((x) => x.second * 1000 === from);
    const inSecond = samples.filter((s) => s.at >= from && s.at < to);
    const sample = inSecond.at(-1);
    const before = samples.filter((s) => s.at < from).at(-1);
    const shedNow = shedOf(sample);
    const shedBefore = shedOf(before) ?? 0;
    rows.push({
      s: i,
      onlineSent: o.length,
      onlineOk: ok.length,
      onlineP99Ms: percentile(
        ok.map((r) => r.latencyMs!),
        99,
      ),
      batchOk: b.filter((r) => r.status === 200).length,
      batchFailed: b.filter((r) => r.status !== 200).length,
      mock200: bucket?.byStatus['200'] ?? 0,
      mock429: bucket?.byStatus['429'] ?? 0,
      mockInflight: sample?.mockInflight,
      limit: sample === undefined || Object.keys(sample.limit).length === 0 ? undefined : Math.min(...Object.values(sample.limit)),
      inUseOnline: sample?.inUse['online'],
      inUseBatch: sample?.inUse['batch'],
      queuedBatch: sample?.queued['batch'],
      shedBatch: shedNow === undefined ? undefined : shedNow - shedBefore,
    });
  }
  return rows;
}
