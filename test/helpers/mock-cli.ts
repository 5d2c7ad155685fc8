import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { afterEach } from 'vitest';

export interface MockCliRun {
  child: ChildProcess;
  /** The URL it listens on, once it does; undefined for a run that exited first (--help, a bad flag). */
  url: string | undefined;
  /** Everything it wrote so far, stdout and stderr. */
  out: () => string;
  exited: Promise<unknown[]>;
}

/**
 * Runs `npm run mock`'s entry (src/mock/main.ts) on a free port with `args`, for one describe block: with node and
 * tsx's loader, not the tsx binary, whose child a kill would leave behind; killed after each test if still running.
 */
export function mockCli(): (args: string[]) => Promise<MockCliRun> {
  let child: ChildProcess | undefined;
  afterEach(() => {
    if (child && child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    child = undefined;
  });
  return async (args) => {
    const c = spawn(process.execPath, ['--import', 'tsx', 'src/mock/main.ts', '--port', '0', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    child = c;
    let out = '';
    c.stdout!.on('data', (d: Buffer) => (out += String(d)));
    c.stderr!.on('data', (d: Buffer) => (out += String(d)));
    const exited = once(c, 'exit');
    while (!/listening on (\S+)/.test(out) && c.exitCode === null) await Promise.race([once(c.stdout!, 'data'), exited]);
    return { child: c, url: /listening on (\S+)/.exec(out)?.[1], out: () => out, exited };
  };
}
