// `npm run bench:storm`: replays the retry-storm incident and shows what the gateway changes. Two scenarios (a 503
// brownout, a hang), each run three ways (direct with the SDK's retries, direct with naive 1 s retries, through the
// gateway) under open-loop traffic; then how fast a breaker change crosses Redis. Writes bench/results/storm.{md,json}
// and the charts storm.svg (scenario 1) and storm-hang.svg (scenario 2).
//   npm run bench:storm -- [--strict] [--only brownout-503|hang|rate-limit|propagation]
// Exits 0 even when a target is missed (the table says so), unless --strict is given.
import { mkdirSync, writeFileSync } from 'node:fs';
import { availableParallelism, cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { benchArgs } from './lib/args.ts';
import { upstreamChart } from './storm/chart.ts';
import { runFigures, type RunFigures } from './storm/figures.ts';
import { measurePropagation, type PropagationResult } from './storm/propagation.ts';
import { writeStormReport, type ScenarioReport } from './storm/report.ts';
import { runMode, type RunResult } from './storm/run.ts';
import { BROWNOUT_503, HANG, MODE_LABELS, modesOf, RATE_LIMIT, type Mode, type Scenario } from './storm/scenarios.ts';
import { checkBrownout503, checkHang, checkPropagation, checkRateLimit, type TargetCheck } from './storm/targets.ts';
import { commit, log } from './lib/run-info.ts';

const RESULTS_DIR = 'bench/results';
const WORK_DIR = join(tmpdir(), 'stormgate-bench', 'storm');
const COLORS: Record<Mode, string> = { 'direct-sdk': '#d62728', 'direct-naive': '#ff7f0e', gateway: '#1f77b4', 'gateway-rate': '#2ca02c' };
/** The gateway config's breaker openS (scenarios.ts), for the recovery target. */
const OPEN_S = 5;

function summary(f: RunFigures): string {
  const rec = f.recoveryS === null ? 'never' : `${f.recoveryS} s`;
  return `upstream ${f.upstream} (429s ${f.upstream429}), amplification ${f.amplification.toFixed(2)}x, peak ${f.peakBrownoutRatio.toFixed(2)}x, success ${(100 * f.successRate).toFixed(1)}%, recovered ${rec}, p99 ${Math.round(f.p99Ms)} ms, late ${f.lateAnswers}, 429 after ${(100 * f.share429After).toFixed(1)}%`;
}

/** Upstream requests per second since the start of traffic; the mock has no bucket for a second without arrivals. */
function upstreamSeries(r: RunResult): Array<[number, number]> {
  const counts = new Map(r.upstream.map((b) => [b.second - r.startAt / 1000, b.total]));
  const last = Math.max(0, ...counts.keys());
  return Array.from({ length: last + 1 }, (_, t): [number, number] => [t, counts.get(t) ?? 0]);
}

/**
 * A run during which neighbours took much of the machine and the load generator fell behind says more about the
 * neighbours than about retries: it is run again, at most RERUNS times per bench so the whole stays under 12 minutes.
 * The report lists every discarded run.
 */
const RERUNS = 2;
let rerunsLeft = RERUNS;
const disturbed = (f: RunFigures) => (f.otherCpuShare ?? 0) > 0.4 && f.maxSendLagMs > 250;

async function runScenario(s: Scenario): Promise<ScenarioReport> {
  log(`${s.title}`);
  const runs = {} as Record<Mode, RunResult>;
  const figures = {} as Record<Mode, RunFigures>;
  const discarded: ScenarioReport['discarded'] = [];
  const MODES = modesOf(s);
  for (const mode of MODES) {
    for (;;) {
      log(`  ${MODE_LABELS[mode]} ...`);
      runs[mode] = await runMode(s, mode, WORK_DIR);
      figures[mode] = runFigures(runs[mode]);
      log(`    ${summary(figures[mode])}`);
      if (!disturbed(figures[mode]) || rerunsLeft === 0) break;
      rerunsLeft--;
      discarded.push({ mode, otherCpuShare: figures[mode].otherCpuShare!, maxSendLagMs: figures[mode].maxSendLagMs, summary: summary(figures[mode]) });
      log(`    other processes used ${(100 * figures[mode].otherCpuShare!).toFixed(0)}% of the machine and the load generator fell behind: running it again`);
    }
  }
  const per = <T>(f: (r: RunResult) => T) => Object.fromEntries(MODES.map((m) => [m, f(runs[m])])) as Record<Mode, T>;
  const g = runs.gateway;
  return {
    scenario: s,
    figures,
    series: per(upstreamSeries),
    brownoutS: [(g.brownoutAt - g.startAt) / 1000, (g.brownoutEndAt - g.startAt) / 1000],
    gatewayLog: g.gatewayLog,
    upstreamPastDeadline: per((r) => r.upstreamPastDeadline),
    upstreamMaxInflight: per((r) => r.upstreamMaxInflight),
    discarded,
  };
}

function writeChart(file: string, r: ScenarioReport): void {
  const s = r.scenario;
  const series = modesOf(s).map((m) => ({ label: MODE_LABELS[m], color: COLORS[m], points: r.series[m] }));
  const xMax = (s.steadyMs + s.brownoutMs + s.recoveryMs) / 1000 + 10;
  writeFileSync(file, upstreamChart(`${s.title}: upstream requests per second`, series, r.brownoutS, xMax));
}

async function main(): Promise<number> {
  const values = benchArgs(
    {
      strict: { type: 'boolean', default: false },
      only: { type: 'string' },
    },
    'usage: npm run bench:storm -- [--only brownout-503|hang|rate-limit|propagation] [--strict]\n  --only    run one scenario\n  --strict  exit 1 when a target is missed\n',
  );
  const parts = [BROWNOUT_503.name, HANG.name, RATE_LIMIT.name, 'propagation'];
  if (values.only !== undefined && !parts.includes(values.only)) throw new Error(`--only takes one of ${parts.join(', ')}, got "${values.only}"`);
  const wanted = (name: string) => values.only === undefined || values.only === name;
  // One part alone must not replace the full run's report in bench/results (the README's figures): its report and
  // charts go to the work directory instead.
  const out = values.only === undefined ? RESULTS_DIR : WORK_DIR;
  mkdirSync(WORK_DIR, { recursive: true });
  mkdirSync(out, { recursive: true });
  log(`processes' logs and configs: ${WORK_DIR}`);
  const began = Date.now();

  const scenarios: ScenarioReport[] = [];
  const checks: TargetCheck[] = [];
  if (wanted(BROWNOUT_503.name)) {
    const r = await runScenario(BROWNOUT_503);
    scenarios.push(r);
    checks.push(...checkBrownout503('1: 503 brownout', r.figures, OPEN_S, r.gatewayLog?.pastClientDeadline));
    writeChart(join(out, 'storm.svg'), r);
  }
  if (wanted(HANG.name)) {
    const r = await runScenario(HANG);
    scenarios.push(r);
    checks.push(...checkHang('2: hang', r.figures, r.gatewayLog?.pastClientDeadline, r.upstreamPastDeadline.gateway));
    writeChart(join(out, `storm-${HANG.name}.svg`), r);
  }
  if (wanted(RATE_LIMIT.name)) {
    const r = await runScenario(RATE_LIMIT);
    scenarios.push(r);
    checks.push(...checkRateLimit('3: rate limit', r.figures));
    writeChart(join(out, `storm-${RATE_LIMIT.name}.svg`), r);
  }
  let propagation: PropagationResult | undefined;
  if (wanted('propagation')) {
    log('breaker propagation through Redis ...');
    propagation = await measurePropagation(200);
    log(`    p50 ${propagation.p50Ms.toFixed(2)} ms, p99 ${propagation.p99Ms.toFixed(2)} ms, missed ${propagation.missed}`);
    checks.push(checkPropagation(propagation.missed > 0 ? Number.POSITIVE_INFINITY : propagation.p99Ms));
  }

  writeStormReport(join(out, 'storm.md'), join(out, 'storm.json'), {
    date: new Date().toISOString(),
    node: process.version,
    nproc: availableParallelism(),
    cpu: cpus()[0]?.model ?? 'unknown',
    commit: commit(),
    scenarios,
    propagation,
    checks,
    durationS: (Date.now() - began) / 1000,
  });
  for (const c of checks) process.stdout.write(`${c.pass ? 'PASS' : 'FAIL'}  [${c.scenario}] ${c.name}: ${c.value} (target ${c.target})\n`);
  process.stdout.write(`report: ${join(out, 'storm.md')}\n`);
  return values.strict && checks.some((c) => !c.pass) ? 1 : 0;
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`bench:storm failed: ${(err as Error)?.stack ?? String(err)}\n`);
    process.exit(1);
  },
);
