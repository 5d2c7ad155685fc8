// Runs `src/main.ts` (or another entry: the production build's main.js) as a child process (a pod), for tests of what
// only a real process shows: SIGKILL, SIGTERM, a start-up that fails. Every child is killed when the test process
// exits, even after a failed test.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, afterEach } from 'vitest';
import { stringify } from 'yaml';
import { startMock, type FaultSpec, type MockServer } from '../../src/mock/server.ts';
import { freePort } from './free-port.ts';

export interface GatewayProcess {
  proc: ChildProcess;
  /** The config file it was started with. */
  file: string;
  /** Its exit code (null when a signal ended it). */
  exited: Promise<number | null>;
  /** What it wrote on stdout and stderr so far (the log lines, a start-up error). */
  output: () => string;
}

const children = new Set<ChildProcess>();
process.on('exit', () => {
  for (const child of children) child.kill('SIGKILL');
});

export interface GatewayProcessOptions {
  /** What node runs before `--config FILE`. Default: `src/main.ts` under tsx. */
  entry?: readonly string[];
  /** How much of the latest output output() keeps, in characters. Default: 200,000. */
  keepOutputChars?: number;
}

/**
 * Starts gateway processes for one test file from YAML (text, or an object turned into YAML) in a temp dir of the
 * file's own, with `env` added to (or, as undefined, taken from) the test's environment; kills what is left afterwards.
 */
export function useGatewayProcesses(options: GatewayProcessOptions = {}): (name: string, config: string | object, env?: Record<string, string | undefined>) => GatewayProcess {
  const { entry = ['--import', 'tsx', 'src/main.ts'], keepOutputChars = 200_000 } = options;
  let dir: string | undefined;
  afterAll(async () => {
    await Promise.all([...children].map(killNow));
    if (dir) rmSync(dir, { recursive: true, force: true });
  });
  return (name, config, env = {}) => {
    dir ??= mkdtempSync(join(tmpdir(), 'stormgate-procs-'));
    const file = join(dir, `${name}.yaml`);
    writeFileSync(file, typeof config === 'string' ? config : stringify(config));
    const childEnv: NodeJS.ProcessEnv = { ...process.env };
    for (const [k, v] of Object.entries(env)) {
      if (v === undefined) delete childEnv[k];
      else childEnv[k] = v;
    }
    const proc = spawn(process.execPath, [...entry, '--config', file], { env: childEnv, stdio: ['ignore', 'pipe', 'pipe'] });
    children.add(proc);
    proc.once('exit', () => children.delete(proc));
    let output = '';
    const keep = (d: Buffer) => (output = (output + d.toString()).slice(-keepOutputChars));
    proc.stdout!.on('data', keep);
    proc.stderr!.on('data', keep);
    const exited = once(proc, 'exit').then(([code]) => code as number | null);
    return { proc, file, exited, output: () => output };
  };
}

/** SIGKILLs a child still running and resolves once it is gone (a test's own process, ended with the test). */
export async function killNow(child: ChildProcess | undefined): Promise<void> {
  if (!child || child.exitCode !== null || child.signalCode !== null) return;
  const gone = once(child, 'exit');
  child.kill('SIGKILL');
  await gone;
}

/** Resolves once the process's /readyz answers 200; fails with its output if it exits or takes longer than `withinMs`. */
export async function waitReady(g: GatewayProcess, port: number, withinMs = 20_000): Promise<void> {
  const deadline = Date.now() + withinMs;
  while (Date.now() < deadline) {
    if (await fetch(`http://127.0.0.1:${port}/readyz`).then((r) => r.ok, () => false)) return;
    if (g.proc.exitCode !== null) break;
    await sleep(50);
  }
  throw new Error(`gateway on ${port} not ready:\n${g.output()}`);
}

export interface OneGatewayProcess {
  /** The test's gateway process and its mock, each killed or closed after the test. */
  gateway?: GatewayProcess;
  mock?: MockServer;
  /** Starts a gateway process from any config as the test's own. */
  spawn: (config: string | object) => GatewayProcess;
  /**
   * Starts a quiet mock with `faults` and a gateway process with one chat route to it (and `extra` config sections);
   * resolves the gateway's URL and port once it is ready.
   */
  start: (o: { faults?: FaultSpec; drain: { preStopMs: number; graceMs: number }; logLevel?: string; extra?: Record<string, unknown> }) => Promise<{ url: string; port: number }>;
}

/** One gateway process per test, in front of a mock of its own: for tests of signals, draining and what a pod does. */
export function useOneGatewayProcess(): OneGatewayProcess {
  const startProcess = useGatewayProcesses();
  let spawned = 0;
  const one: OneGatewayProcess = {
    spawn: (config) => (one.gateway = startProcess(`gateway-${++spawned}`, config)),
    async start({ faults = {}, drain, logLevel = 'warn', extra = {} }) {
      const mock = (one.mock = await startMock({ quiet: true, faults }));
      const port = await freePort();
      const gateway = one.spawn({
        server: { host: '127.0.0.1', port, logLevel },
        providers: { mock: { family: 'openai', baseUrl: `${mock.url}/v1`, apiKey: 'k' } },
        routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }] }],
        drain,
        ...extra,
      });
      await waitReady(gateway, port);
      return { url: `http://127.0.0.1:${port}`, port };
    },
  };
  afterEach(async () => {
    await killNow(one.gateway?.proc);
    await one.mock?.close();
    one.gateway = one.mock = undefined;
  });
  return one;
}
