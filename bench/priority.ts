// `npm run bench:priority`: the noisy neighbour. Online traffic at 30% of a provider's capacity, alone and then next
// to a batch flood of ten times the capacity in flight, through one gateway whose pool is set above the provider's
// real capacity: the adaptive limit has to find it from the 429s, and the priority classes have to keep online fast
// while batch gets what online leaves. Writes bench/results/priority.{md,json}.
//   npm run bench:priority -- [--strict] [--quick] [--latency-jitter-ms N] [--poisson] [--tenants]
// Exits 0 even when a target is missed (the table says so), unless --strict is given. --quick: a 40 s smoke test of the
// bench itself, too short for the figures to mean anything; its report goes to $TMPDIR/stormgate-bench/priority/.
// --latency-jitter-ms N: the provider adds a uniform 0..N ms to each answer; the report goes to
// bench/results/priority.jitter.{md,json}, so the run (a steady 200 ms) keeps its own files. --poisson: online
// requests arrive with exponential gaps (seeded) instead of evenly spaced; the report goes to priority[.jitter].poisson.*.
// --tenants: the flood is another tenant's (its own client key) in online's class, not batch: the fair share between a
// class's clients keeps online fast, not the classes; the report goes to priority.tenants[...].*.
import { execFileSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { availableParallelism, cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { request } from 'undici';
import type { MockStats } from '../src/mock/server.ts';
import { benchArgs } from './lib/args.ts';
import { cpuWindow, readCpu, type CpuReading } from './lib/cpu.ts';
import { startGatewayProcess, startMockProcess, type Child } from './lib/processes.ts';
import { commit, log } from './lib/run-info.ts';
import { checks, runFigures, timeline, windowsOf, type Timeline } from './priority/figures.ts';
import { scanGatewayLog } from './priority/gateway-log.ts';
import { checksTable, writePriorityReport, type CpuFigures } from './priority/report.ts';
import { startSampler } from './priority/sampler.ts';
import { floodHeaders, gatewayConfig, SETTINGS, TENANT_KEYS } from './priority/settings.ts';
import { batchClosedLoop, epochMs, onlineOpenLoop } from './priority/traffic.ts';

const RESULTS_DIR = 'bench/results';
const WORK_DIR = join(tmpdir(), 'stormgate-bench', 'priority');

/** Another bench on this machine would share its cores with this one and spoil both: say so loudly. */
function otherBenches(): string[] {
  try {
    const out = execFileSync('pgrep', ['-af', 'bench/(storm|overhead)\\.ts'], { encoding: 'utf8' });
    return out.split('\n').filter((l) => l.trim() !== '');
  } catch {
    return [];
  }
}

async function mockControl<T>(mockUrl: string, method: 'GET' | 'POST', path: string): Promise<T> {
  const res = await request(`${mockUrl}${path}`, { method });
  const json = (await res.body.json()) as T;
  if (res.statusCode !== 200) throw new Error(`mock ${method} ${path} answered ${res.statusCode}: ${JSON.stringify(json)}`);
  return json;
}

/** Untimed requests of both classes first: cold JIT, empty connection pools and a fresh round-trip estimate are not the baseline. */
async function warmUp(url: string): Promise<void> {
  for (let round = 0; round < 6; round++) {
    await Promise.all(
      Array.from({ length: 20 }, async (_, i) => {
        const res = await request(`${url}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', ...(i % 2 === 1 ? floodHeaders() : { authorization: `Bearer ${TENANT_KEYS.online}` }) },
          body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'warm-up' }] }),
        });
        const text = await res.body.text();
        if (res.statusCode !== 200) throw new Error(`warm-up request to ${url} answered ${res.statusCode}: ${text.slice(0, 300)}`);
      }),
    );
  }
}

/** CPU readings at the phase boundaries: the gateway's, the mock's, the load generator's own, and the machine's. */
interface CpuMark {
  gateway: CpuReading;
  mock: CpuReading;
  self: NodeJS.CpuUsage;
  atMs: number;
}

function markCpu(gateway: Child, mock: Child): CpuMark {
  const pids = [process.pid, gateway.proc.pid!, mock.proc.pid!];
  return { gateway: readCpu(gateway.proc.pid!, pids), mock: readCpu(mock.proc.pid!, pids), self: process.cpuUsage(), atMs: performance.now() };
}

function cpuBetween(a: CpuMark, b: CpuMark): { other: number | undefined; cores: CpuFigures['cores'][string] } {
  const n = availableParallelism();
  const wallMs = b.atMs - a.atMs;
  const g = cpuWindow(a.gateway, b.gateway, n);
  const m = cpuWindow(a.mock, b.mock, n);
  const selfMs = (b.self.user + b.self.system - a.self.user - a.self.system) / 1000;
  return {
    other: g.otherShare,
    cores: { loadGenerator: selfMs / wallMs, gateway: g.serverMs === undefined ? undefined : g.serverMs / wallMs, mock: m.serverMs === undefined ? undefined : m.serverMs / wallMs },
  };
}

async function main(): Promise<number> {
  const values = benchArgs(
    { strict: { type: 'boolean', default: false }, quick: { type: 'boolean', default: false }, 'latency-jitter-ms': { type: 'string' }, poisson: { type: 'boolean', default: false }, tenants: { type: 'boolean', default: false } },
    'usage: npm run bench:priority -- [--tenants] [--quick] [--poisson] [--latency-jitter-ms N] [--strict]\n  --tenants              the flood as another tenant of the online class (client keys), not as batch\n  --quick                a short smoke run\n  --poisson              Poisson arrivals for the online traffic\n  --latency-jitter-ms N  random extra latency at the mock\n  --strict               exit 1 when a target is missed\n',
  );
  const jitterMs = values['latency-jitter-ms'] === undefined ? 0 : Number(values['latency-jitter-ms']);
  if (!Number.isFinite(jitterMs) || jitterMs < 0) throw new Error(`--latency-jitter-ms wants a number of ms >= 0, got ${values['latency-jitter-ms']}`);
  if (values.poisson) SETTINGS.online.arrivals = 'poisson';
  SETTINGS.tenants = values.tenants;
  if (jitterMs > 0) {
    SETTINGS.faults.latencyJitterMs = jitterMs;
    SETTINGS.capacityRps = SETTINGS.faults.capacity / ((SETTINGS.faults.latencyMs + jitterMs / 2) / 1000);
  }
  // A smoke test of the bench itself (about 40 s): too short for the flood to converge, so its figures mean little.
  if (values.quick) Object.assign(SETTINGS.timeline, { onlineWarmupMs: 2_000, baselineMs: 5_000, floodMs: 15_000, batchWindowMs: 10_000, convergedWindowMs: 5_000 });
  mkdirSync(WORK_DIR, { recursive: true });
  const others = otherBenches();
  if (others.length > 0) log(`WARNING: another bench is running on this machine; both runs will be noisy:\n  ${others.join('\n  ')}`);
  log(`processes' logs and configs: ${WORK_DIR}`);
  const began = Date.now();
  const tl = SETTINGS.timeline;

  const mock = await startMockProcess({ faults: SETTINGS.faults, logFile: join(WORK_DIR, 'mock.log') });
  let gateway: Child | undefined;
  const gatewayLogFile = join(WORK_DIR, 'gateway.log');
  try {
    gateway = await startGatewayProcess({ mockUrl: mock.url, configFile: join(WORK_DIR, 'gateway.yaml'), logFile: gatewayLogFile, config: gatewayConfig });
    await warmUp(gateway.url);
    await mockControl(mock.url, 'POST', '/_mock/reset');

    // Start on a whole second, so the phases line up with the mock's per-second counts; online starts its warm-up before.
    const startAt = Math.ceil((Date.now() + tl.onlineWarmupMs) / 1000) * 1000 + 1000;
    const t: Timeline = { startAt, floodAt: startAt + tl.baselineMs, endAt: startAt + tl.baselineMs + tl.floodMs };
    log(`online: ${tl.onlineWarmupMs / 1000} s of warm-up, ${tl.baselineMs / 1000} s alone, then ${SETTINGS.batch.clients} batch clients for ${tl.floodMs / 1000} s ...`);

    const sampler = startSampler(gateway.url, mock.url, SETTINGS.metricsEveryMs);
    const marks: CpuMark[] = [];
    const gw = gateway;
    const markAt = (at: number) => new Promise<void>((resolve) => setTimeout(() => (marks.push(markCpu(gw, mock)), resolve()), Math.max(0, at - epochMs())));
    const progress = setInterval(() => {
      const s = Math.round((epochMs() - startAt) / 1000);
      if (s >= 0 && s <= (t.endAt - startAt) / 1000) log(`  ${s} s`);
    }, 10_000);
    const cpuMarks = Promise.all([markAt(t.startAt), markAt(t.floodAt), markAt(t.endAt)]);
    const [online, batch] = await Promise.all([
      onlineOpenLoop({ url: gateway.url, rate: SETTINGS.online.rate, startAt: t.startAt - tl.onlineWarmupMs, endAt: t.endAt, connections: SETTINGS.online.connections, timeoutMs: SETTINGS.online.timeoutMs, arrivals: SETTINGS.online.arrivals }),
      batchClosedLoop({ url: gateway.url, startAt: t.floodAt, endAt: t.endAt, ...SETTINGS.batch }),
    ]);
    await cpuMarks;
    clearInterval(progress);
    const samples = await sampler.stop();
    const stats = await mockControl<MockStats>(mock.url, 'GET', '/_mock/stats');
    await gateway.stop();
    await mock.stop();

    const [m0, m1, m2] = marks as [CpuMark, CpuMark, CpuMark];
    const base = cpuBetween(m0, m1);
    const flood = cpuBetween(m1, m2);
    const windows = windowsOf(t);
    const { onlineHandlerMs, ...gatewayLog } = scanGatewayLog(gatewayLogFile, {
      baseline: windows['baseline']!,
      convergence: windows['convergence']!,
      converged: windows['converged']!,
      'after the flood': [t.endAt, Number.POSITIVE_INFINITY],
    });
    const figures = runFigures(t, online.records, batch.records, stats.perSecond, onlineHandlerMs);
    const result = checks(figures);
    const outDir = values.quick ? WORK_DIR : RESULTS_DIR;
    const file = `priority${values.tenants ? '.tenants' : ''}${jitterMs > 0 ? '.jitter' : ''}${values.poisson ? '.poisson' : ''}`;
    writePriorityReport(join(outDir, `${file}.md`), join(outDir, `${file}.json`), {
      date: new Date().toISOString(),
      node: process.version,
      nproc: availableParallelism(),
      cpu: cpus()[0]?.model ?? 'unknown',
      commit: commit(),
      durationS: (Date.now() - began) / 1000,
      checks: result,
      figures,
      online: { maxSendLagMs: online.maxSendLagMs },
      batch: { shedWaitMs: batch.shedWaitMs, answers: batch.records.length },
      cpuUse: { otherShare: { baseline: base.other, flood: flood.other }, cores: { baseline: base.cores, flood: flood.cores } },
      gatewayLog,
      timeline: timeline(t, online.records, batch.records, stats.perSecond, samples),
      samples,
      files: { workDir: WORK_DIR },
    });
    process.stdout.write(`\n${checksTable(result)}\n\n`);
    const otherText = [base.other, flood.other].map((o) => (o === undefined ? 'n/a' : `${(100 * o).toFixed(0)}%`)).join(' / ');
    process.stdout.write(`other processes' CPU (baseline / flood): ${otherText}; load generator's max send lag ${online.maxSendLagMs.toFixed(0)} ms\n`);
    process.stdout.write(`report: ${outDir}/${file}.md, ${outDir}/${file}.json\n`);
    return values.strict && result.some((c) => !c.pass) ? 1 : 0;
  } finally {
    await gateway?.stop();
    await mock.stop();
  }
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`bench:priority failed: ${(err as Error)?.stack ?? String(err)}\n`);
    process.exit(1);
  },
);
