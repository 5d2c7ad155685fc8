// The storm bench's report: one table per scenario (a row per figure, a column per run), the targets with PASS/FAIL,
// Redis propagation, what the gateway's log said, and the settings. Also the JSON (figures and per-second series,
// not the per-request records) and the charts.
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import type { RunFigures } from './figures.ts';
import type { GatewayLogSummary } from './gateway-log.ts';
import type { PropagationResult } from './propagation.ts';
import { percent } from '../lib/stats.ts';
import { MODE_LABELS, modesOf, type Mode, type Scenario } from './scenarios.ts';
import type { TargetCheck } from './targets.ts';

export interface ScenarioReport {
  scenario: Scenario;
  figures: Record<Mode, RunFigures>;
  /** Upstream requests per second, by run, as [seconds since the start, count]. */
  series: Record<Mode, Array<[number, number]>>;
  /** Brownout start and end, seconds since the start of traffic (as sent to the mock). */
  brownoutS: [number, number];
  gatewayLog: GatewayLogSummary | undefined;
  upstreamPastDeadline: Record<Mode, { count: number; of: number; maxMs: number }>;
  upstreamMaxInflight: Record<Mode, number>;
  /** Runs thrown away and run again because the machine was busy and the load generator fell behind. */
  discarded: Array<{ mode: Mode; otherCpuShare: number; maxSendLagMs: number; summary: string }>;
}

interface StormReport {
  date: string;
  node: string;
  nproc: number;
  cpu: string;
  commit: string;
  scenarios: ScenarioReport[];
  propagation: PropagationResult | undefined;
  checks: TargetCheck[];
  durationS: number;
}

const pct = (x: number) => percent(x);
const cores = (x: number | undefined) => (x === undefined ? '–' : `${x.toFixed(2)} cores`);
const ms = (x: number) => (Number.isNaN(x) ? 'n/a' : `${Math.round(x).toLocaleString('en-US')} ms`);

const ROWS: Array<[string, (f: RunFigures) => string]> = [
  ['logical client requests', (f) => f.logical.toLocaleString('en-US')],
  ['upstream requests (at the mock)', (f) => f.upstream.toLocaleString('en-US')],
  ['steady-state upstream rate', (f) => `${f.steadyRps.toFixed(0)}/s`],
  ['amplification during the brownout', (f) => `${f.amplification.toFixed(2)}x`],
  ['peak upstream rate during the brownout / steady', (f) => `${f.peakBrownoutRatio.toFixed(2)}x`],
  ['peak upstream rate in the 10 s after / steady', (f) => `${f.peakRecoveryRatio.toFixed(2)}x`],
  ['success rate', (f) => pct(f.successRate)],
  ['success ≥ 99% per second again, after recovery', (f) => (f.recoveryS === null ? 'never (within the recovery phase)' : `${f.recoveryS} s`)],
  ['client latency p50 (retries included)', (f) => ms(f.p50Ms)],
  ['client latency p99 (retries included)', (f) => ms(f.p99Ms)],
  ['requests answered after the client\'s deadline', (f) => `${f.lateAnswers.toLocaleString('en-US')} (${f.timedOutAttempts.toLocaleString('en-US')} attempts timed out)`],
  ['upstream 429s in the 10 s after recovery', (f) => pct(f.share429After)],
  ['upstream 429s (whole run)', (f) => f.upstream429.toLocaleString('en-US')],
  ['final outcomes', (f) => Object.entries(f.outcomes).sort(([, a], [, b]) => b - a).map(([k, v]) => `${k}: ${v}`).join(', ')],
  ['load generator: max send lag, CPU', (f) => `${ms(f.maxSendLagMs)}, ${f.loadGeneratorCores.toFixed(2)} cores`],
  ['CPU of the mock / the gateway', (f) => `${cores(f.mockCores)} / ${cores(f.gatewayCores)}`],
  ['other processes\' CPU (share of the machine)', (f) => (f.otherCpuShare === undefined ? 'n/a' : pct(f.otherCpuShare))],
];

function scenarioTable(r: ScenarioReport): string {
  const MODES = modesOf(r.scenario);
  const head = `| Figure | ${MODES.map((m) => MODE_LABELS[m]).join(' | ')} |`;
  const rows = ROWS.map(([name, f]) => `| ${name} | ${MODES.map((m) => f(r.figures[m])).join(' | ')} |`);
  const past = `| upstream requests open longer than the client's timeout | ${MODES.map((m) => {
    const p = r.upstreamPastDeadline[m];
    return `${p.count} of the last ${p.of.toLocaleString('en-US')} (longest ${ms(p.maxMs)})`;
  }).join(' | ')} |`;
  const inflight = `| most upstream requests in flight at once | ${MODES.map((m) => r.upstreamMaxInflight[m].toLocaleString('en-US')).join(' | ')} |`;
  return [head, `|---|${MODES.map(() => '---').join('|')}|`, ...rows, past, inflight].join('\n');
}

/** A load generator that fell behind, or a busy machine, makes the tails and the timeouts the neighbour's. */
function noiseNote(r: ScenarioReport): string {
  const MODES = modesOf(r.scenario);
  const rerun = r.discarded
    .map((d) => `Discarded and run again: ${MODE_LABELS[d.mode]} (other processes ${pct(d.otherCpuShare)} of the machine, load generator up to ${ms(d.maxSendLagMs)} behind; it had: ${d.summary}).\n\n`)
    .join('');
  const noisy = MODES.filter((m) => r.figures[m].maxSendLagMs > 250 || (r.figures[m].otherCpuShare ?? 0) > 0.25);
  if (noisy.length === 0) return rerun;
  return `${rerun}**Noisy:** ${noisy.map((m) => MODE_LABELS[m]).join('; ')}: the load generator fell more than 250 ms behind its schedule, or other processes used more than 25% of the machine. Its timers fire late too, so client timeouts and latency tails are partly the machine's; rerun on a quiet machine before trusting them.

`;
}

function gatewayLogSection(g: GatewayLogSummary | undefined): string {
  if (!g) return '';
  const problems =
    g.problems.length === 0
      ? 'No warnings or errors besides breaker transitions.'
      : g.problems.map((p) => `- ${p.count} × level ${p.level} "${p.msg}", e.g. \`${p.example.replace(/`/g, "'")}\``).join('\n');
  const breaker = g.breaker.length === 0 ? 'none' : g.breaker.map((b) => b.to).join(' → ');
  return `Gateway log (${g.lines.toLocaleString('en-US')} lines, ${g.requestLines.toLocaleString('en-US')} requests; answered: ${Object.entries(g.byStatus)
    .map(([k, v]) => `${k} × ${v}`)
    .join(', ')}). Answered more than 50 ms after its own deadline: ${g.pastDeadline} (at most ${Math.round(g.maxOverDeadlineMs)} ms past); after the client's own timeout, by the gateway's clock: ${g.pastClientDeadline}.
Upstream attempts started with less than minAttemptMs left before the deadline: ${g.lateStarts}${g.lateStarts > 0 ? ` (median ${Math.round(g.lateStartMedianLeftMs)} ms left)` : ''}. Breaker: ${breaker}.
${problems}${g.unparsed.length > 0 ? `\nLines that are not JSON:\n\`\`\`\n${g.unparsed.join('\n')}\n\`\`\`` : ''}`;
}

function markdown(r: StormReport): string {
  const checks = ['| Scenario | Target | Value | Required | Result |', '|---|---|---|---|---|', ...r.checks.map((c) => `| ${c.scenario} | ${c.name} | ${c.value} | ${c.target} | ${c.pass ? 'PASS' : '**FAIL**'} |`)].join('\n');
  const p = r.propagation;
  const prop = p
    ? `| writes | p50 | p99 | max | not seen within 1 s |\n|---:|---:|---:|---:|---:|\n| ${p.writes} | ${p.p50Ms.toFixed(2)} ms | ${p.p99Ms.toFixed(2)} ms | ${p.maxMs.toFixed(2)} ms | ${p.missed} |`
    : 'Not measured (skipped).';
  const sections = r.scenarios.map((s) => {
    const sc = s.scenario;
    return `## ${sc.title}

${sc.rate} logical requests/s (open loop) for ${sc.steadyMs / 1000} s steady, ${sc.brownoutMs / 1000} s brownout (\`${sc.brownoutMode}\`), ${sc.recoveryMs / 1000} s recovery;
client timeout ${sc.clientTimeoutMs / 1000} s per request. Mock faults: \`${JSON.stringify(sc.faults)}\`. Chart: [${sc.name === 'brownout-503' ? 'storm.svg' : `storm-${sc.name}.svg`}](${sc.name === 'brownout-503' ? 'storm.svg' : `storm-${sc.name}.svg`}).

${scenarioTable(s)}

${noiseNote(s)}${gatewayLogSection(s.gatewayLog)}
`;
  });
  return `# stormgate retry-storm benchmark

Generated by \`npm run bench:storm\` (bench/storm.ts) on ${r.date}: node ${r.node}, ${r.nproc} CPUs (${r.cpu}), commit ${r.commit}; took ${Math.round(r.durationS)} s.
Each run starts a fresh mock provider (and gateway) in their own processes; the users are the official \`openai\` SDK in the
bench's process. See bench/README.md for how each figure is measured.

## Targets

${checks}

${sections.join('\n')}
## Breaker propagation through Redis

Two \`RedisStore\`s on a throwaway \`redis-server\`; each of ${p?.writes ?? 0} CAS writes on A is timed until B's synchronous \`getBreaker\` shows it.

${prop}
`;
}

export function writeStormReport(mdFile: string, jsonFile: string, r: StormReport): void {
  mkdirSync(dirname(mdFile), { recursive: true });
  writeFileSync(mdFile, markdown(r));
  writeFileSync(jsonFile, `${JSON.stringify(r, null, 2)}\n`);
}
