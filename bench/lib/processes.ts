// Starts the mock provider and the gateway as child processes. Each gets its own process so the load generator,
// the gateway and the mock never share an event loop: a shared loop would charge the client's work to the gateway.
// Both run as compiled JavaScript (`npm run build`, then `node dist/...`), as the Docker image runs the gateway:
// under tsx's loader every function creation also pays for esbuild's name-keeping helper.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { openSync, closeSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { request } from 'undici';

export interface Child {
  url: string;
  proc: ChildProcess;
  /** SIGTERM, then SIGKILL if the process has not exited after 5 s. */
  stop(): Promise<void>;
}

/** Asks the OS for a free port. Another process could take it before we use it; on a bench machine it does not. */
export async function freePort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve));
  const address = srv.address();
  await new Promise<void>((resolve) => srv.close(() => resolve()));
  if (address === null || typeof address === 'string') throw new Error('no port from the OS');
  return address.port;
}

let built = false;

/** Compiles src/ to dist/ once per bench run, so the processes run the code of this checkout. */
function ensureBuilt(): void {
  if (built) return;
  execFileSync(process.platform === 'win32' ? 'npm.cmd' : 'npm', ['run', '--silent', 'build'], { stdio: 'inherit' });
  built = true;
}

/** Runs a compiled entry point (dist/...) in plain node, so `--cpu-prof` and friends apply to it directly. */
export function spawnNode(entry: string, args: string[], logFile: string, nodeFlags: string[] = []): ChildProcess {
  const out = openSync(logFile, 'w');
  const proc = spawn(process.execPath, [...nodeFlags, entry, ...args], { stdio: ['ignore', out, out] });
  // The child holds its own copy of the descriptor.
  closeSync(out);
  return proc;
}

export async function waitReady(url: string, proc: ChildProcess, name: string, logFile: string): Promise<void> {
  const deadline = Date.now() + 20_000;
  while (Date.now() < deadline) {
    if (proc.exitCode !== null) throw new Error(`${name} exited with code ${proc.exitCode} before it was ready; see ${logFile}`);
    try {
      const res = await request(url, { method: 'GET', headersTimeout: 1_000, bodyTimeout: 1_000 });
      await res.body.dump();
      // Any answer means the listener is up (the mock has no /healthz and answers 404 there).
      return;
    } catch {
      await sleep(100);
    }
  }
  proc.kill('SIGKILL');
  throw new Error(`${name} was not ready within 20 s; see ${logFile}`);
}

export function stopper(proc: ChildProcess): () => Promise<void> {
  return async () => {
    if (proc.exitCode !== null || proc.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
    proc.kill('SIGTERM');
    const timer = setTimeout(() => proc.kill('SIGKILL'), 5_000);
    await exited;
    clearTimeout(timer);
  };
}

interface MockOptions {
  faults: unknown;
  logFile: string;
}

/** The bundled mock provider (src/mock/main.ts, compiled) on a free port. */
export async function startMockProcess(opts: MockOptions): Promise<Child> {
  ensureBuilt();
  const port = await freePort();
  const proc = spawnNode('dist/mock/main.js', ['--port', String(port), '--quiet', '--faults', JSON.stringify(opts.faults)], opts.logFile, []);
  const url = `http://127.0.0.1:${port}`;
  await waitReady(`${url}/healthz`, proc, 'mock', opts.logFile);
  return { url, proc, stop: stopper(proc) };
}

interface GatewayOptions {
  mockUrl: string;
  configFile: string;
  logFile: string;
  /** Extra node flags for the gateway process, e.g. ['--cpu-prof', '--cpu-prof-dir=...']. Default: none. */
  nodeFlags?: string[];
  /** Writes the gateway's YAML config for its port and the mock's URL. Default: the overhead bench's chat route. */
  config?: (port: number, mockUrl: string) => string;
}

/** The gateway (src/main.ts, compiled) with request logging at info, in front of the mock. */
export async function startGatewayProcess(opts: GatewayOptions): Promise<Child> {
  const port = await freePort();
  writeFileSync(opts.configFile, (opts.config ?? gatewayConfig)(port, opts.mockUrl));
  ensureBuilt();
  const proc = spawnNode('dist/main.js', ['--config', opts.configFile], opts.logFile, opts.nodeFlags ?? []);
  const url = `http://127.0.0.1:${port}`;
  await waitReady(`${url}/healthz`, proc, 'gateway', opts.logFile);
  return { url, proc, stop: stopper(proc) };
}

/** The production shape of a chat route (retries on, default timeouts), so the bench pays for what users run. */
function gatewayConfig(port: number, mockUrl: string): string {
  return `# Written by bench/overhead.ts for one run; overwritten by the next.
server: { host: 127.0.0.1, port: ${port}, logLevel: info }
providers:
  mock: { family: openai, baseUrl: "${mockUrl}/v1", apiKey: sk-bench, maxConnections: 128 }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: mock } ]
# The bench stops the gateway with SIGTERM: no load balancer to wait for, so no pre-stop pause.
drain: { preStopMs: 0, graceMs: 2000 }
`;
}
