// `npm run bench`: what the gateway costs compared to calling the provider directly. Starts the bundled mock
// provider and the gateway in their own processes, measures throughput, latency under a fixed rate and streams'
// time to first token, each directly and through the gateway, and writes bench/results/overhead.{md,json}.
//   npm run bench -- [--strict] [--rounds N] [--profile]
// Exits 0 even when a target is missed (the table says so), unless --strict is given.
import { mkdirSync, statSync } from 'node:fs';
import { availableParallelism, cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { request } from 'undici';
import { benchArgs } from './lib/args.ts';
import { cpuWindow, readCpu } from './lib/cpu.ts';
import { CHAT_PATH, closedLoop, openLoop, streamTtft } from './lib/load.ts';
import { startGatewayProcess, startMockProcess, type Child } from './lib/processes.ts';
import { figures, markdownTable, otherLoad, referenceFigures, referenceTable, writeReport, type Measured, type Round, type Side } from './lib/report.ts';
import { startReferences, type Reference } from './lib/references.ts';
import { commit, log } from './lib/run-info.ts';

const SETTINGS = {
  throughput: { connections: 64, warmupMs: 1_000, durationMs: 5_000 },
  latency: { rate: 500, connections: 64, warmupMs: 1_000, durationMs: 5_000 },
  ttft: { count: 200, warmup: 20, parallel: 1 },
  // latencyMs 0: the mock answers at once, so everything measured beyond it is HTTP and the gateway.
  mockFaults: { latencyMs: 0, stream: { chunks: 5, chunkDelayMs: 5 } },
};

const RESULTS_DIR = 'bench/results';
const WORK_DIR = join(tmpdir(), 'stormgate-bench');

/** One request each way before measuring: a broken setup should fail loudly, not produce a table of zeros. */
async function smokeTest(url: string, name: string): Promise<void> {
  const res = await request(`${url}${CHAT_PATH}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: 'Bearer sk-bench' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
  });
  const text = await res.body.text();
  if (res.statusCode !== 200) throw new Error(`${name} answered ${res.statusCode} to a chat completion: ${text.slice(0, 300)}`);
}

interface Target {
  url: string;
  /** The process that serves this side's requests: the mock (direct) or the gateway. */
  serverPid: number;
  /** Every process of the bench, for telling their CPU use from other processes'. */
  benchPids: number[];
}

/** Runs one measurement on both sides, in the given order, and logs each result as it lands. */
async function both<T>(order: Array<keyof Side<T>>, targets: Side<Target>, run: (url: string) => Promise<T>, show: (r: T) => string): Promise<Side<Measured<T>>> {
  const out: Partial<Side<Measured<T>>> = {};
  for (const side of order) {
    const { url, serverPid, benchPids } = targets[side];
    const before = readCpu(serverPid, benchPids);
    const r = await run(url);
    const cpu = cpuWindow(before, readCpu(serverPid, benchPids), availableParallelism());
    out[side] = { ...r, cpu };
    const other = cpu.otherShare === undefined ? '' : `, other processes ${(100 * cpu.otherShare).toFixed(0)}% CPU`;
    log(`    ${side.padEnd(7)} ${show(r)}${other}`);
  }
  return out as Side<Measured<T>>;
}

/**
 * Untimed load on both sides first: the load generator, the mock and the gateway all start with cold JIT
 * and empty pools, and whichever side the first round measured first would pay for that.
 */
async function warmUp(targets: Side<Target>, refs: Reference[]): Promise<void> {
  log('warm-up');
  for (const { url } of [targets.direct, targets.gateway]) {
    await closedLoop(url, { ...SETTINGS.throughput, warmupMs: 0, durationMs: 2_000 });
    await streamTtft(url, { count: 50, warmup: 0, parallel: 1 });
  }
  for (const ref of refs) {
    if (!ref.child) continue;
    await closedLoop(ref.child.url, { ...SETTINGS.throughput, warmupMs: 0, durationMs: 2_000 });
    if (ref.streams) await streamTtft(ref.child.url, { count: 50, warmup: 0, parallel: 1 });
  }
}

/** The throughput closed loop through each reference proxy that runs here. */
async function referenceRuns(refs: Reference[], benchPids: number[]): Promise<Round['references']> {
  const out: Round['references'] = {};
  for (const ref of refs) {
    if (!ref.child) continue;
    const pid = ref.servingPid ?? ref.child.proc.pid!;
    const before = readCpu(pid, [...benchPids, pid]);
    const r = await closedLoop(ref.child.url, SETTINGS.throughput);
    out[ref.name] = { ...r, cpu: cpuWindow(before, readCpu(pid, [...benchPids, pid]), availableParallelism()) };
    log(`    ${ref.name}: ${Math.round(r.rps)} req/s, ${r.errors} errors`);
  }
  return out;
}

/** Streams through each reference proxy that passes them on, right after the round's own, for the same noise. */
async function referenceStreams(refs: Reference[], into: Round['references']): Promise<void> {
  for (const ref of refs) {
    if (!ref.child || !ref.streams) continue;
    const r = await streamTtft(ref.child.url, SETTINGS.ttft);
    into[ref.name]!.ttft = r;
    log(`    ${ref.name}: median ${r.p50Ms.toFixed(2)} ms, p99 ${r.p99Ms.toFixed(2)} ms, ${r.errors} errors`);
  }
}

async function round(i: number, targets: Side<Target>, refs: Reference[]): Promise<Round> {
  // Alternate which side goes first, so a slow drift of the machine (thermal, a neighbour) does not favour one side.
  const order: Array<'direct' | 'gateway'> = i % 2 === 0 ? ['direct', 'gateway'] : ['gateway', 'direct'];
  log(`round ${i + 1}`);
  log('  throughput');
  const throughput = await both(order, targets, (u) => closedLoop(u, SETTINGS.throughput), (r) => `${Math.round(r.rps)} req/s, ${r.errors} errors`);
  const references = await referenceRuns(refs, targets.direct.benchPids);
  log('  latency');
  const latency = await both(order, targets, (u) => openLoop(u, SETTINGS.latency), (r) => `p50 ${r.p50Ms.toFixed(2)} ms, p99 ${r.p99Ms.toFixed(2)} ms, ${r.errors} errors, max send lag ${r.maxSendLagMs.toFixed(1)} ms`);
  log('  time to first token');
  const ttft = await both(order, targets, (u) => streamTtft(u, SETTINGS.ttft), (r) => `median ${r.p50Ms.toFixed(2)} ms, p99 ${r.p99Ms.toFixed(2)} ms, ${r.errors} errors`);
  await referenceStreams(refs, references);
  // The raw samples served their percentiles; the JSON keeps only the summaries.
  for (const side of order) {
    latency[side].samplesMs = [];
    ttft[side].samplesMs = [];
  }
  return { throughput, latency, ttft, references };
}

async function main(): Promise<number> {
  const values = benchArgs(
    {
      strict: { type: 'boolean', default: false },
      rounds: { type: 'string', default: '3' },
      profile: { type: 'boolean', default: false },
      'node-flags': { type: 'string', default: '' },
    },
    'usage: npm run bench -- [--rounds N] [--strict] [--profile] [--node-flags "FLAGS"]\n  --rounds N            rounds of each measurement, the median reported (default 3)\n  --strict              exit 1 when a target is missed\n  --profile             also write a CPU profile of the gateway\n  --node-flags "FLAGS"  node flags for the gateway process, e.g. "--max-semi-space-size=64"\n',
  );
  const rounds = Number(values.rounds);
  const gatewayNodeFlags = values['node-flags'].split(' ').filter((f) => f !== '');
  if (!Number.isInteger(rounds) || rounds < 1) throw new Error(`--rounds must be a positive integer, got ${values.rounds}`);
  mkdirSync(WORK_DIR, { recursive: true });
  const profileDir = join(WORK_DIR, 'profiles');
  const gatewayLog = join(WORK_DIR, 'gateway.log');

  const mock = await startMockProcess({ faults: SETTINGS.mockFaults, logFile: join(WORK_DIR, 'mock.log') });
  let gateway: Child | undefined;
  let refs: Reference[] = [];
  const results: Round[] = [];
  try {
    gateway = await startGatewayProcess({
      mockUrl: mock.url,
      configFile: join(WORK_DIR, 'gateway.yaml'),
      logFile: gatewayLog,
      nodeFlags: [...gatewayNodeFlags, ...(values.profile ? ['--cpu-prof', `--cpu-prof-dir=${profileDir}`] : [])],
    });
    log(`mock ${mock.url}, gateway ${gateway.url} (logs in ${WORK_DIR})`);
    const benchPids = [process.pid, mock.proc.pid!, gateway.proc.pid!];
    const targets = {
      direct: { url: mock.url, serverPid: mock.proc.pid!, benchPids },
      gateway: { url: gateway.url, serverPid: gateway.proc.pid!, benchPids },
    };
    await smokeTest(mock.url, 'the mock');
    await smokeTest(gateway.url, 'the gateway');
    refs = await startReferences(mock.url, WORK_DIR);
    for (const ref of refs) {
      if (ref.child) await smokeTest(ref.child.url, ref.name);
      else log(`${ref.name}: ${ref.missing}`);
    }
    await warmUp(targets, refs);
    for (let i = 0; i < rounds; i++) results.push(await round(i, targets, refs));
  } finally {
    // SIGTERM lets the gateway close cleanly, which is also when node writes its --cpu-prof file.
    await gateway?.stop();
    for (const ref of refs) await ref.child?.stop();
    await mock.stop();
  }

  const figs = figures(results, { connections: SETTINGS.throughput.connections, rate: SETTINGS.latency.rate });
  const refFigs = referenceFigures(results, refs);
  const errors = (side: 'direct' | 'gateway') =>
    results.reduce((n, r) => n + r.throughput[side].errors + r.latency[side].errors + r.ttft[side].errors, 0);
  writeReport(join(RESULTS_DIR, 'overhead.md'), join(RESULTS_DIR, 'overhead.json'), figs, refFigs, {
    date: new Date().toISOString(),
    node: process.version,
    nproc: availableParallelism(),
    cpu: cpus()[0]?.model.trim() ?? 'unknown',
    commit: commit(),
    rounds,
    settings: SETTINGS,
    errors: { direct: errors('direct'), gateway: errors('gateway') },
    otherLoad: otherLoad(results),
    gatewayLog: { path: gatewayLog, bytes: statSync(gatewayLog).size },
    gatewayNodeFlags,
  });
  process.stdout.write(`\n${markdownTable(figs)}\n\n${referenceTable(figs, refFigs)}\n\nWritten to ${RESULTS_DIR}/overhead.md and overhead.json.\n`);
  if (values.profile) process.stdout.write(`Gateway CPU profile (.cpuprofile) in ${profileDir}\n`);
  const missed = figs.filter((f) => f.pass === false).map((f) => f.name);
  if (missed.length > 0) process.stdout.write(`Missed: ${missed.join('; ')}\n`);
  return values.strict && missed.length > 0 ? 1 : 0;
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`bench: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exit(1);
  },
);
