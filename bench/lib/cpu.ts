// CPU accounting from /proc (Linux only; elsewhere every reading is undefined and the report leaves it out).
// Two uses: CPU time per request of the server process, which shows the gateway's cost even when the machine
// is too small to saturate it cleanly; and CPU used by processes other than the bench's three, which tells a
// noisy run (a neighbour's test suite, an npm install) from a real regression.
import { readFileSync } from 'node:fs';

/** Linux's USER_HZ: 100 on every mainstream distribution, so /proc times come in 10 ms ticks. */
const TICK_MS = 10;

/** user + system CPU time of one process, in ms. */
function processCpuMs(pid: number): number | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // The command name (field 2) may contain spaces: count fields from the ')' that closes it.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) * TICK_MS;
  } catch {
    return undefined;
  }
}

/** Busy time of all CPUs together (everything but idle and iowait), in ms. */
function machineBusyMs(): number | undefined {
  try {
    const [user, nice, system, , , irq, softirq, steal] = readFileSync('/proc/stat', 'utf8').split('\n', 1)[0]!.split(/\s+/).slice(1).map(Number);
    return (user! + nice! + system! + irq! + softirq! + steal!) * TICK_MS;
  } catch {
    return undefined;
  }
}

export interface CpuReading {
  atMs: number;
  server: number | undefined;
  ours: number | undefined;
  machine: number | undefined;
}

export interface CpuWindow {
  /** CPU ms the server process used in the window. */
  serverMs: number | undefined;
  /** Share of the machine's total CPU capacity used by processes other than ours, 0..1. */
  otherShare: number | undefined;
}

/** `server` is the process under test; `ours` lists every process of the bench (load generator included). */
export function readCpu(server: number, ours: readonly number[]): CpuReading {
  const times = ours.map(processCpuMs);
  const known = times.every((t) => t !== undefined);
  return {
    atMs: performance.now(),
    server: processCpuMs(server),
    ours: known ? times.reduce<number>((a, b) => a + b!, 0) : undefined,
    machine: machineBusyMs(),
  };
}

export function cpuWindow(a: CpuReading, b: CpuReading, cores: number): CpuWindow {
  const wallS = (b.atMs - a.atMs) / 1000;
  const d = (x: number | undefined, y: number | undefined) => (x === undefined || y === undefined ? undefined : y - x);
  const server = d(a.server, b.server);
  const ours = d(a.ours, b.ours);
  const machine = d(a.machine, b.machine);
  return {
    serverMs: server,
    otherShare: ours === undefined || machine === undefined ? undefined : Math.max(0, machine - ours) / (wallS * 1000 * cores),
  };
}
