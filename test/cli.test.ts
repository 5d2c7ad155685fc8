// The command line as a person meets it: mistakes get one line saying what to fix and exit 2, never a stack trace.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';

let blocker: Server | undefined;
let dir: string | undefined;

/** A one-route gateway config in a fresh temporary folder (removed after each test); `extra` is appended YAML. */
function gatewayConfig(port: number, logLevel: 'silent' | 'info', extra = ''): string {
  dir = mkdtempSync(join(tmpdir(), 'stormgate-cli-'));
  const file = join(dir, 'gw.yaml');
  writeFileSync(file, `server: { host: 127.0.0.1, port: ${port}, logLevel: ${logLevel} }
providers:
  p: { family: openai, baseUrl: "http://127.0.0.1:9/v1", apiKey: k }
routes:
  - { name: chat, match: { path: /v1/chat/completions }, targets: [ { provider: p } ] }
${extra}`);
  return file;
}
/** A gateway a test started, and the blocker's sockets: a test that fails must not leave them running (close() waits for sockets). */
let child: ChildProcess | undefined;
const sockets: Socket[] = [];
afterEach(async () => {
  if (child && child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  child = undefined;
  for (const socket of sockets.splice(0)) socket.destroy();
  if (blocker) await new Promise((r) => blocker!.close(r));
  if (dir) rmSync(dir, { recursive: true, force: true });
  blocker = dir = undefined;
});

async function run(args: string[], env: NodeJS.ProcessEnv = {}): Promise<{ code: number | null; stderr: string; stdout: string }> {
  const { OPENAI_API_KEY: _drop, STORMGATE_CONFIG: _drop2, ...base } = process.env;
  const child = spawn(process.execPath, ['--import', 'tsx', 'src/main.ts', ...args], { env: { ...base, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  let stdout = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  const [code] = (await once(child, 'exit')) as [number | null];
  return { code, stderr, stdout };
}

describe('stormgate on the command line', () => {
  it('names the missing key and points to the demo when the default config has no key', async () => {
    const { code, stderr } = await run([]);
    expect(code).toBe(2);
    expect(stderr).toMatch(/OPENAI_API_KEY/);
    expect(stderr).toMatch(/npm run demo/);
    // No client key is missing: no line about one (an empty "Set  in the environment: client keys").
    expect(stderr).not.toMatch(/auth\.keys/);
    expect(stderr).not.toMatch(/\n\s+at /);
  });

  it('--check validates a config without listening: 0 and a line when valid, its warnings on stderr; 2 and the file, line and path when not', async () => {
    // A port in use would stop a real start: --check binds nothing.
    blocker = createServer();
    await new Promise<void>((r) => blocker!.listen(0, '127.0.0.1', r));
    const taken = (blocker.address() as { port: number }).port;
    const good = gatewayConfig(taken, 'silent');
    const ok = await run(['--check', '--config', good]);
    expect(ok.code).toBe(0);
    expect(ok.stdout).toBe(`stormgate: config ${good} is valid (1 route, 1 provider)\n`);
    // A warning the gateway would log at start (streamRecovery where it does nothing) is printed, and still valid.
    writeFileSync(good, readFileSync(good, 'utf8').replace('targets: [ { provider: p } ] }', 'targets: [ { provider: p } ] }\n  - { name: emb, match: { path: /v1/embeddings }, targets: [ { provider: p } ], streamRecovery: continue }'));
    const warned = await run(['--check', '--config', good]);
    expect(warned.code).toBe(0);
    expect(warned.stderr).toMatch(/^stormgate: warning: .*streamRecovery/m);
    writeFileSync(good, readFileSync(good, 'utf8').replace('apiKey: k', 'apiKey: k, maxConections: 3'));
    const bad = await run(['--check', '--config', good]);
    expect(bad.code).toBe(2);
    expect(bad.stdout).toBe('');
    expect(bad.stderr).toMatch(new RegExp(`${good.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}:3: providers\\.p`));
    expect(bad.stderr).toMatch(/maxConnections/);
  });

  it('says a config file it cannot read is unreadable, not invalid', async () => {
    const { code, stderr } = await run(['--config', '/nonexistent/stormgate.yaml']);
    expect(code).toBe(2);
    expect(stderr.split('\n')[0]).toBe('stormgate: cannot read config');
    expect(stderr).toMatch(/\/nonexistent\/stormgate\.yaml: cannot read the config file: ENOENT/);
  });

  it('says a missing variable of auth.keys is a client key, and points to the demo only for a provider\'s key', async () => {
    // The demo (the bundled mock, no provider keys) is no way around a client key the config itself asks for.
    const file = gatewayConfig(0, 'silent', 'auth:\n  keys:\n    team: "${GAPS_TEAM_KEY}"\n');
    const alone = await run(['--config', file]);
    expect(alone.code).toBe(2);
    expect(alone.stderr).toMatch(/auth\.keys\.team: environment variable GAPS_TEAM_KEY is not set/);
    expect(alone.stderr).toMatch(/Set GAPS_TEAM_KEY in the environment: a client key \(auth\.keys\)/);
    expect(alone.stderr).not.toMatch(/npm run demo/);
    // With a provider's key missing too: each line says its own.
    writeFileSync(file, readFileSync(file, 'utf8').replace('apiKey: k', 'apiKey: "${GAPS_PROVIDER_KEY}"'));
    const both = await run(['--config', file]);
    expect(both.code).toBe(2);
    expect(both.stderr).toMatch(/Set GAPS_PROVIDER_KEY in the environment, or run `npm run demo`/);
    expect(both.stderr).toMatch(/Set GAPS_TEAM_KEY in the environment: a client key \(auth\.keys\)/);
    expect(both.stderr).not.toMatch(/GAPS_TEAM_KEY[^\n]*npm run demo/);
  });

  it('points to the demo for a missing provider key, not for a missing variable that is no key', async () => {
    // The demo replaces provider keys; a provider's URL or a Redis URL from the environment is no key, and the demo no way around it.
    const file = gatewayConfig(0, 'silent');
    writeFileSync(file, readFileSync(file, 'utf8').replace('"http://127.0.0.1:9/v1"', '"${GAPS_URL}"'));
    const url = await run(['--config', file]);
    expect(url.code).toBe(2);
    expect(url.stderr).toMatch(/providers\.p\.baseUrl: environment variable GAPS_URL is not set/);
    expect(url.stderr).toMatch(/Set GAPS_URL in the environment\.\n/);
    expect(url.stderr).not.toMatch(/npm run demo/);
    // With a provider's key missing too, one line names both, and the demo is offered for the key.
    writeFileSync(file, readFileSync(file, 'utf8').replace('apiKey: k', 'apiKey: "${GAPS_PROVIDER_KEY}"'));
    const both = await run(['--config', file]);
    expect(both.code).toBe(2);
    expect(both.stderr).toMatch(/Set GAPS_URL, GAPS_PROVIDER_KEY in the environment, or run `npm run demo`/);
  });

  it('answers an unknown option with the usage line', async () => {
    const { code, stderr } = await run(['--confg', 'x.yaml']);
    expect(code).toBe(2);
    expect(stderr).toMatch(/Unknown option '--confg'/);
    expect(stderr).toMatch(/usage: stormgate/);
    expect(stderr).not.toMatch(/\n\s+at /);
  });

  it('says that an empty --config names no file, and reads an empty STORMGATE_CONFIG as unset', async () => {
    const empty = await run(['--config', '']);
    expect(empty.code).toBe(2);
    expect(empty.stderr).toMatch(/^stormgate: --config needs a file name\nusage: stormgate/);
    const unset = await run([], { STORMGATE_CONFIG: '' });
    expect(unset.code).toBe(2);
    expect(unset.stderr).toMatch(/config\/gateway\.yaml:\d+: providers\.openai\.apiKey: environment variable OPENAI_API_KEY is not set/);
  });

  it('says which setting to change when its port is taken', async () => {
    blocker = createServer();
    await new Promise<void>((r) => blocker!.listen(0, '127.0.0.1', r));
    const port = (blocker.address() as { port: number }).port;
    const file = gatewayConfig(port, 'silent');
    const { code, stderr } = await run(['--config', file]);
    expect(code).toBe(2);
    expect(stderr).toContain(`cannot listen: port ${port} is in use on 127.0.0.1 (server.port in ${file})`);
    expect(stderr).not.toMatch(/\n\s+at /);
  });

  it('listens on --port in place of server.port, and says a bad one in a line', async () => {
    // The file's port is taken: --port alone lets a second instance (or an example) start from the same file.
    blocker = createServer();
    await new Promise<void>((r) => blocker!.listen(0, '127.0.0.1', r));
    const taken = (blocker.address() as { port: number }).port;
    const file = gatewayConfig(taken, 'silent');
    const free = createServer();
    await new Promise<void>((r) => free.listen(0, '127.0.0.1', r));
    const port = (free.address() as { port: number }).port;
    await new Promise((r) => free.close(r));
    child = spawn(process.execPath, ['--import', 'tsx', 'src/main.ts', '--config', file, '--port', String(port)], { stdio: 'ignore' });
    await expect.poll(() => fetch(`http://127.0.0.1:${port}/healthz`).then((r) => r.status, () => 0), { timeout: 20_000, interval: 100 }).toBe(200);
    child.kill('SIGINT');
    expect((await once(child, 'exit'))[0]).toBe(0);
    const inUse = await run(['--config', file, '--port', String(taken)]);
    expect(inUse.stderr).toContain(`cannot listen: port ${taken} is in use on 127.0.0.1 (--port)`);
    for (const bad of ['abc', '70000', '']) {
      const r = await run(['--config', file, `--port=${bad}`]);
      expect(r.code).toBe(2);
      expect(r.stderr).toMatch(/^stormgate: --port takes a port number from 0 to 65535/);
    }
  });

  // Before, `npm start` ran the tsx CLI: a SIGTERM while tsx and the gateway's modules loaded (a second or two on a busy
  // machine) ended the process with 143 (tsx relayed it, then killed the process that had not confirmed within 30 ms;
  // or the process had no handler yet). Once main.ts had one, the exit still waited for every module to load.
  it.skipIf(process.platform !== 'linux')('stops cleanly on a SIGTERM that comes while npm start is still loading', async () => {
    const file = gatewayConfig(0, 'info');
    // A slow start, held where it is: tsx reads its tsconfig from a pipe that stays empty until the signal is sent.
    const tsconfig = join(dirname(file), 'tsconfig.fifo');
    execFileSync('mkfifo', [tsconfig]);
    // What npm runs for `npm start -- --config <file>`: the package's start script in a shell, node_modules/.bin on the
    // PATH. The signal goes to the shell's process, as npm passes one on: the script's `exec` makes that the gateway.
    const start = (JSON.parse(readFileSync('package.json', 'utf8')) as { scripts: { start: string } }).scripts.start;
    const { OPENAI_API_KEY: _drop, STORMGATE_CONFIG: _drop2, ...env } = process.env;
    const gateway = spawn('sh', ['-c', `${start} --config "$0"`, file], {
      env: { ...env, TSX_TSCONFIG_PATH: tsconfig, PATH: `${join(process.cwd(), 'node_modules/.bin')}:${env.PATH}` },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    child = gateway;
    let out = '';
    gateway.stdout.on('data', (d: Buffer) => (out += d.toString()));
    gateway.stderr.on('data', (d: Buffer) => (out += d.toString()));
    let exit: [number | null, string | null] | undefined;
    gateway.once('exit', (...args) => (exit = args));
    await expect.poll(() => openingPipe(gateway.pid!), { timeout: 20_000, interval: 10 }).toBe(true);
    gateway.kill('SIGTERM');
    // Loading goes on: the pipe gets the tsconfig each time it is opened, until the process is gone.
    const tsconfigText = readFileSync('tsconfig.json');
    const until = Date.now() + 20_000;
    while (exit === undefined && Date.now() < until) {
      if (openingPipe(gateway.pid!)) await writeFile(tsconfig, tsconfigText);
      else await new Promise((r) => setTimeout(r, 10));
    }
    expect(exit).toEqual([0, null]);
    expect(out).toContain('stopped during start-up (SIGTERM)');
    expect(out).not.toContain('stormgate listening');
  });

  it('stops cleanly on SIGTERM while start-up is still waiting for Redis', async () => {
    // A Redis that accepts the connection and never answers: start-up waits for it (up to a second).
    blocker = createServer((socket) => sockets.push(socket));
    await new Promise<void>((r) => blocker!.listen(0, '127.0.0.1', r));
    const redisPort = (blocker.address() as { port: number }).port;
    const file = gatewayConfig(0, 'info', `state: { redis: "redis://127.0.0.1:${redisPort}" }\n`);
    const { OPENAI_API_KEY: _drop, STORMGATE_CONFIG: _drop2, ...env } = process.env;
    const gateway = spawn(process.execPath, ['--import', 'tsx', 'src/main.ts', '--config', file], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    child = gateway;
    let out = '';
    gateway.stdout.on('data', (d: Buffer) => (out += d.toString()));
    gateway.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const exited = once(gateway, 'exit') as Promise<[number | null, string | null]>;
    await once(blocker, 'connection');
    gateway.kill('SIGTERM');
    const [code, signal] = await exited;
    expect({ code, signal }).toEqual({ code: 0, signal: null });
    expect(out).toContain('stopped during start-up');
    expect(out).not.toContain('stormgate listening');
  });
});

/** Whether a thread of a process, or of one it started, waits for the other end of a pipe it opens. */
function openingPipe(pid: number): boolean {
  const parent = new Map<number, number>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      // pid (comm) state ppid ...: the name may hold spaces and parentheses, so it is cut at the last one.
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      parent.set(Number(entry), Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]));
    } catch {
      // gone in the meantime
    }
  }
  const under = (p: number): boolean => {
    for (let up: number | undefined = p; up !== undefined && up > 1; up = parent.get(up)) if (up === pid) return true;
    return false;
  };
  for (const p of parent.keys()) {
    if (!under(p)) continue;
    try {
      for (const task of readdirSync(`/proc/${p}/task`)) if (readFileSync(`/proc/${p}/task/${task}/wchan`, 'utf8') === 'wait_for_partner') return true;
    } catch {
      // gone in the meantime
    }
  }
  return false;
}
