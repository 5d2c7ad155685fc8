// Turns the rounds into the figures of the overhead bench, and writes them as a Markdown table and as JSON.
// Each figure is the median over rounds; so is each ratio and each "added", computed per round first, because a
// round's direct and gateway runs ran back to back and share that moment's machine noise.
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import type { CpuWindow } from './cpu.ts';
import type { LatencyResult, ThroughputResult, TtftResult } from './load.ts';
import { median } from './stats.ts';

export interface Side<T> {
  direct: T;
  gateway: T;
}

/** One run's result with the CPU used around it: by the server (mock or gateway) and by other processes. */
export type Measured<T> = T & { cpu: CpuWindow };

export interface Round {
  throughput: Side<Measured<ThroughputResult>>;
  latency: Side<Measured<LatencyResult>>;
  ttft: Side<Measured<TtftResult>>;
  /** The throughput closed loop through each reference proxy (lib/references.ts), by name; streams' too where it passes them on. */
  references: Record<string, Measured<ThroughputResult> & { ttft?: TtftResult }>;
}

/** A reference proxy's throughput against the same round's direct run, as a median over rounds. */
interface ReferenceFigure {
  name: string;
  rps: number;
  ratio: number;
  cpuUsPerRequest: number;
  /** Median time to first token added against the same round's direct run; NaN where streams were not measured. */
  ttftAddedMs: number;
  /** Why it did not run, when it did not. */
  missing?: string;
}

export function referenceFigures(rounds: Round[], refs: Array<{ name: string; missing?: string }>): ReferenceFigure[] {
  return refs.map(({ name, missing }) => {
    if (missing !== undefined) return { name, rps: Number.NaN, ratio: Number.NaN, cpuUsPerRequest: Number.NaN, ttftAddedMs: Number.NaN, missing };
    const runs = rounds.map((r) => ({ run: r.references[name]!, direct: r.throughput.direct.rps, directTtftMs: r.ttft.direct.p50Ms }));
    return {
      name,
      rps: median(runs.map((x) => x.run.rps)),
      ratio: median(runs.map((x) => x.run.rps / x.direct)),
      cpuUsPerRequest: median(runs.map((x) => cpuPerRequestUs(x.run))),
      ttftAddedMs: median(runs.map((x) => (x.run.ttft ? x.run.ttft.p50Ms - x.directTtftMs : Number.NaN))),
    };
  });
}

export function referenceTable(figs: Figure[], refs: ReferenceFigure[]): string {
  const gateway = figs[0]!;
  const cpu = figs.find((f) => f.name.startsWith('Server CPU'));
  const ttft = figs.find((f) => f.name === 'Stream time to first token, median');
  const added = (ms: number | undefined) => (ms === undefined || Number.isNaN(ms) ? '–' : `${ms >= 0 ? '+' : '−'}${Math.abs(ms).toFixed(2)} ms`);
  const rows = [
    ...refs.map((r) =>
      r.missing !== undefined
        ? `| ${r.name} | – | – | – | – | not run: ${r.missing} |`
        : `| ${r.name} | ${num(r.rps, 'req/s')} req/s | ratio ${r.ratio.toFixed(2)} | ${num(r.cpuUsPerRequest, 'µs')} µs | ${added(r.ttftAddedMs)} | |`,
    ),
    `| stormgate (from the table above) | ${num(gateway.gateway, 'req/s')} req/s | ratio ${gateway.value.toFixed(2)} | ${cpu ? `${num(cpu.gateway, 'µs')} µs` : 'n/a'} | ${added(ttft?.value)} | |`,
  ];
  return ['| Proxy, same closed loop | Throughput | vs direct | CPU per request | Time to first token added | |', '|---|---:|---:|---:|---:|---|', ...rows].join('\n');
}

interface Figure {
  name: string;
  unit: string;
  direct: number;
  gateway: number;
  /** 'ratio' = gateway / direct; 'added' = gateway - direct. */
  compare: 'ratio' | 'added';
  value: number;
  /** Undefined for figures shown for context only. */
  target?: { op: '>=' | '<'; limit: number };
  pass?: boolean;
  perRound: Array<{ direct: number; gateway: number; value: number }>;
}

function figure(
  name: string,
  unit: string,
  rounds: Round[],
  pick: (r: Round) => Side<number>,
  compare: Figure['compare'],
  target?: Figure['target'],
): Figure {
  const perRound = rounds.map((r) => {
    const s = pick(r);
    return { direct: s.direct, gateway: s.gateway, value: compare === 'ratio' ? s.gateway / s.direct : s.gateway - s.direct };
  });
  const value = median(perRound.map((p) => p.value));
  const f: Figure = {
    name,
    unit,
    direct: median(perRound.map((p) => p.direct)),
    gateway: median(perRound.map((p) => p.gateway)),
    compare,
    value,
    perRound,
  };
  if (target !== undefined) {
    f.target = target;
    f.pass = target.op === '>=' ? value >= target.limit : value < target.limit;
  }
  return f;
}

export function figures(rounds: Round[], o: { connections: number; rate: number }): Figure[] {
  return [
    figure(`Throughput, ${o.connections} connections, closed loop`, 'req/s', rounds, (r) => ({ direct: r.throughput.direct.rps, gateway: r.throughput.gateway.rps }), 'ratio', { op: '>=', limit: 0.6 }),
    figure(`Latency p50 at ${o.rate} req/s, open loop`, 'ms', rounds, (r) => ({ direct: r.latency.direct.p50Ms, gateway: r.latency.gateway.p50Ms }), 'added'),
    figure(`Latency p99 at ${o.rate} req/s, open loop`, 'ms', rounds, (r) => ({ direct: r.latency.direct.p99Ms, gateway: r.latency.gateway.p99Ms }), 'added', { op: '<', limit: 3 }),
    figure('Stream time to first token, median', 'ms', rounds, (r) => ({ direct: r.ttft.direct.p50Ms, gateway: r.ttft.gateway.p50Ms }), 'added', { op: '<', limit: 1 }),
    figure('Stream time to first token, p99', 'ms', rounds, (r) => ({ direct: r.ttft.direct.p99Ms, gateway: r.ttft.gateway.p99Ms }), 'added'),
    figure('Server CPU per request (mock / gateway process), throughput run', 'µs', rounds, (r) => ({ direct: cpuPerRequestUs(r.throughput.direct), gateway: cpuPerRequestUs(r.throughput.gateway) }), 'ratio'),
  ];
}

function cpuPerRequestUs(run: Measured<ThroughputResult>): number {
  return run.cpu.serverMs === undefined ? Number.NaN : (1000 * run.cpu.serverMs) / run.allRequests;
}

/** Share of the machine's CPU that other processes used during each run: high values mean a noisy run. */
export function otherLoad(rounds: Round[]): { median: number; max: number } | undefined {
  const shares = rounds.flatMap((r) => [r.throughput, r.latency, r.ttft].flatMap((s) => [s.direct.cpu.otherShare, s.gateway.cpu.otherShare]));
  if (shares.some((s) => s === undefined)) return undefined;
  const known = shares as number[];
  return { median: median(known), max: Math.max(...known) };
}

const num = (v: number, unit: string) => (Number.isNaN(v) ? 'n/a' : unit === 'ms' ? v.toFixed(2) : Math.round(v).toLocaleString('en-US'));

export function markdownTable(figs: Figure[]): string {
  const rows = figs.map((f) => {
    const value = f.compare === 'ratio' ? `ratio ${f.value.toFixed(2)}` : `+${f.value.toFixed(2)} ms`.replace('+-', '−');
    const target = f.target === undefined ? '–' : f.compare === 'ratio' ? `${f.target.op} ${f.target.limit.toFixed(2)}` : `added ${f.target.op} ${f.target.limit} ms`;
    const verdict = f.pass === undefined ? '(info)' : f.pass ? 'pass' : '**FAIL**';
    return `| ${f.name} | ${num(f.direct, f.unit)} ${f.unit} | ${num(f.gateway, f.unit)} ${f.unit} | ${value} | ${target} | ${verdict} |`;
  });
  return ['| Figure | Direct to mock | Through gateway | Gateway vs direct | Target | Result |', '|---|---:|---:|---:|---|---|', ...rows].join('\n');
}

interface RunInfo {
  date: string;
  node: string;
  nproc: number;
  cpu: string;
  commit: string;
  rounds: number;
  settings: Record<string, unknown>;
  errors: Side<number>;
  /** Share of the machine's CPU used by other processes during the runs (undefined off Linux). */
  otherLoad: { median: number; max: number } | undefined;
  gatewayLog: { path: string; bytes: number };
  /** Node flags the gateway process ran with (`--node-flags`); none by default, as the Docker image runs it. */
  gatewayNodeFlags: string[];
}

function perRoundTable(figs: Figure[]): string {
  const rows = figs.map((f) => `| ${f.name} | ${f.perRound.map((p) => `${num(p.direct, f.unit)} / ${num(p.gateway, f.unit)}`).join(' | ')} |`);
  const head = figs[0]!.perRound.map((_, i) => `Round ${i + 1} (direct / gateway)`);
  return [`| Figure | ${head.join(' | ')} |`, `|---|${head.map(() => '---:').join('|')}|`, ...rows].join('\n');
}

function markdownReport(figs: Figure[], refs: ReferenceFigure[], info: RunInfo): string {
  const errorNote =
    info.errors.direct + info.errors.gateway === 0
      ? 'Every measured request got a 2xx answer (streams: a content event).'
      : `**Failed requests:** ${info.errors.direct} direct, ${info.errors.gateway} through the gateway; the figures above are suspect.`;
  const noise =
    info.otherLoad === undefined
      ? ''
      : `Other processes used a median ${(100 * info.otherLoad.median).toFixed(0)}% (at most ${(100 * info.otherLoad.max).toFixed(0)}%) of the machine's CPU during the runs${info.otherLoad.median > 0.1 ? ': a noisy machine, rerun on a quiet one before trusting small differences' : ''}.`;
  return `# stormgate overhead benchmark

Generated by \`npm run bench\` (bench/overhead.ts) on ${info.date}: node ${info.node}, ${info.nproc} CPUs (${info.cpu}), commit ${info.commit}.
Load generator, gateway and mock provider each run in their own process on this machine; the gateway logs every
request at level \`info\` to a file (${(info.gatewayLog.bytes / 1e6).toFixed(0)} MB written this run)${info.gatewayNodeFlags.length > 0 ? `, and runs with the node flags \`${info.gatewayNodeFlags.join(' ')}\`` : ''}.
Each figure is the median of ${info.rounds} rounds; direct and gateway runs alternate within each round. See bench/README.md for what each figure means.

${markdownTable(figs)}

${errorNote} ${noise}

## Reference proxies

The throughput closed loop (and, for a proxy that passes streams on as they come, the streams' time to first token),
in the same rounds, through proxies that apply no policy at all: what proxying alone costs on this machine. The minimal fastify proxy (bench/reference/fastify-proxy.mjs) is stormgate's own stack with
one request log line and nothing else; what separates it from stormgate is the pipeline (deadline, pool, budget,
breaker, metrics, retries and the fuller log line).

${referenceTable(figs, refs)}

## Per round

${perRoundTable(figs)}

## Settings

\`\`\`json
${JSON.stringify(info.settings, null, 2)}
\`\`\`
`;
}

export function writeReport(mdFile: string, jsonFile: string, figs: Figure[], refs: ReferenceFigure[], info: RunInfo): void {
  mkdirSync(dirname(mdFile), { recursive: true });
  writeFileSync(mdFile, markdownReport(figs, refs, info));
  writeFileSync(jsonFile, `${JSON.stringify({ ...info, figures: figs, references: refs }, null, 2)}\n`);
}
