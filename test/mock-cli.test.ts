// `npm run mock` as the README runs it: a SIGTERM that npm passes on (docker stop, a process manager, `kill <npm pid>`)
// must stop the mock, not leave it listening on its port with nobody left to stop it.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { connect } from 'node:net';
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';

let shell: ChildProcess | undefined;
let listener: number | undefined;
afterEach(() => {
  if (shell && shell.exitCode === null && shell.signalCode === null) shell.kill('SIGKILL');
  // The mock the script started, whatever became of the shell between them.
  if (listener !== undefined) {
    try {
      process.kill(listener, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  shell = listener = undefined;
});

/** Whether something accepts connections on the port. */
function accepting(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1');
    socket.once('connect', () => (socket.destroy(), resolve(true)));
    socket.once('error', () => resolve(false));
  });
}

/** The pid of the process holding the listening TCP socket on the port (Linux /proc), to clean up after a failure. */
function pidListeningOn(port: number): number | undefined {
  const hex = `:${port.toString(16).toUpperCase().padStart(4, '0')}`;
  const inode = readFileSync('/proc/net/tcp', 'utf8')
    .split('\n')
    .map((line) => line.trim().split(/\s+/))
    .find((f) => f[1]?.endsWith(hex) === true && f[3] === '0A')?.[9];
  if (inode === undefined) return undefined;
  for (const pid of readdirSync('/proc').filter((e) => /^\d+$/.test(e))) {
    try {
      if (readdirSync(`/proc/${pid}/fd`).some((fd) => readlinkSync(`/proc/${pid}/fd/${fd}`) === `socket:[${inode}]`)) return Number(pid);
    } catch {
      // gone, or not ours to read
    }
  }
  return undefined;
}

describe('npm run mock', () => {
  it.skipIf(process.platform !== 'linux')('stops on the SIGTERM npm passes on to its script', async () => {
    // What npm runs for `npm run mock -- --port 0`: the script in a shell (dash on Debian), node_modules/.bin on the
    // PATH; npm passes a signal it gets on to that shell's process.
    const script = (JSON.parse(readFileSync('package.json', 'utf8')) as { scripts: { mock: string } }).scripts.mock;
    shell = spawn('sh', ['-c', `${script} --port 0`], {
      env: { ...process.env, PATH: `${join(process.cwd(), 'node_modules/.bin')}:${process.env.PATH}` },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    shell.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    shell.stderr!.on('data', (d: Buffer) => (out += d.toString()));
    await expect.poll(() => /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(out), { timeout: 20_000, interval: 20 }).not.toBeNull();
    const port = Number(/listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(out)![1]);
    listener = pidListeningOn(port);
    expect(await accepting(port)).toBe(true);

    const exited = once(shell, 'exit');
    shell.kill('SIGTERM');
    await exited;
    // The port is free again: the mock itself stopped, not only the shell in front of it.
    await expect.poll(() => accepting(port), { timeout: 10_000, interval: 50 }).toBe(false);
  });
});
