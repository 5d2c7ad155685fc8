// A real nginx in front of gateways, started by a test the way an unprivileged user would run it: its own config in a
// temp dir (`nginx -p DIR -c FILE -g 'daemon off; ...'`), every path it writes (logs, pid, temp files) inside that dir,
// listening on a free 127.0.0.1 port; killed and the dir removed after each test.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { accessSync, constants, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir, userInfo } from 'node:os';
import { delimiter, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach } from 'vitest';
import { freePort } from './free-port.ts';

/** The nginx binary: on PATH, or at /usr/sbin/nginx, which a non-root PATH often leaves out (Debian's nginx-light). */
export function nginxBinary(): string {
  const dirs = [...(process.env.PATH ?? '').split(delimiter).filter(Boolean), '/usr/sbin'];
  for (const dir of dirs) {
    try {
      accessSync(join(dir, 'nginx'), constants.X_OK);
      return join(dir, 'nginx');
    } catch {
      // not here
    }
  }
  throw new Error('nginx is not installed (Debian: apt-get install -y nginx-light; scripts/ensure-services.ts does it for npm test)');
}

export interface Nginx {
  /** http://127.0.0.1:PORT */
  url: string;
  port: number;
  /** The access log so far, one entry per request nginx answered (its start-up probe left out). */
  accessLog(): AccessEntry[];
  errorLog(): string;
}

export interface AccessEntry {
  /** nginx's status to the client. */
  status: number;
  /** Every upstream nginx tried for the request, in order, and the status each gave (`502` for none, as nginx logs). */
  tries: Array<{ addr: string; status: string }>;
  uri: string;
}

/**
 * One access-log line per request: nginx's status to the client, every upstream it tried (`, ` between tries) with
 * the status each gave: what a test reads to count nginx's own retries.
 */
const LOG_FORMAT = `log_format tries '$status|$upstream_addr|$upstream_status|$request_uri';`;

function parseAccess(line: string): AccessEntry {
  const [status, addrs, statuses, uri] = line.split('|') as [string, string, string, string];
  const codes = statuses.split(', ');
  return { status: Number(status), tries: addrs === '-' ? [] : addrs.split(', ').map((addr, i) => ({ addr, status: codes[i] ?? '-' })), uri };
}

const running = new Set<ChildProcess>();
process.on('exit', () => {
  for (const child of running) child.kill('SIGTERM');
});

/**
 * Registers the after-each clean-up; the function it returns starts an nginx whose `http {}` block holds `http` (a
 * server block must `listen PORT`, which is replaced by the free port chosen).
 */
export function useNginx(): (http: string) => Promise<Nginx> {
  const started: Array<{ child: ChildProcess; dir: string }> = [];
  afterEach(async () => {
    for (const { child, dir } of started.splice(0)) {
      if (child.exitCode === null && child.signalCode === null) {
        // SIGTERM, nginx's fast shutdown, ends its workers too: a SIGKILL to the master would leave them running.
        const gone = once(child, 'exit');
        child.kill('SIGTERM');
        await gone;
      }
      rmSync(dir, { recursive: true, force: true });
    }
  });
  return async (http) => {
    const dir = mkdtempSync(join(tmpdir(), 'stormgate-nginx-'));
    const port = await freePort();
    // As root the workers would switch to `nobody`, who cannot write in a temp dir of root's: they run as the caller.
    const user = process.getuid?.() === 0 ? `user ${userInfo().username};` : '';
    const temps = ['client_body', 'proxy', 'fastcgi', 'uwsgi', 'scgi'].map((t) => `${t}_temp_path ${join(dir, t)};`).join('\n  ');
    const conf = `${user}
worker_processes 1;
error_log ${join(dir, 'error.log')} info;
events { worker_connections 1024; }
http {
  ${LOG_FORMAT}
  access_log ${join(dir, 'access.log')} tries;
  ${temps}
  ${http.replaceAll('listen PORT', `listen 127.0.0.1:${port}`)}
}
`;
    const file = join(dir, 'nginx.conf');
    writeFileSync(file, conf);
    const child = spawn(nginxBinary(), ['-p', dir, '-c', file, '-e', join(dir, 'error.log'), '-g', `daemon off; pid ${join(dir, 'nginx.pid')};`], { stdio: ['ignore', 'pipe', 'pipe'] });
    started.push({ child, dir });
    running.add(child);
    child.once('exit', () => running.delete(child));
    let output = '';
    child.stdout!.on('data', (d: Buffer) => (output += d.toString()));
    child.stderr!.on('data', (d: Buffer) => (output += d.toString()));
    const read = (name: string) => {
      try {
        return readFileSync(join(dir, name), 'utf8');
      } catch {
        return '';
      }
    };
    const url = `http://127.0.0.1:${port}`;
    const until = Date.now() + 10_000;
    for (;;) {
      if (child.exitCode !== null) throw new Error(`nginx exited with ${child.exitCode}:\n${output}\n${read('error.log')}`);
      // Any answer (a 502 when no gateway is up yet) means it listens.
      if (await fetch(`${url}/nginx-started`).then(() => true, () => false)) break;
      if (Date.now() > until) throw new Error(`nginx did not listen within 10 s:\n${output}\n${read('error.log')}`);
      await sleep(25);
    }
    return {
      url,
      port,
      accessLog: () => read('access.log').split('\n').filter((l) => l !== '').map(parseAccess).filter((e) => e.uri !== '/nginx-started'),
      errorLog: () => read('error.log'),
    };
  };
}
