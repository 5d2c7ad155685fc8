// Reference proxies for the overhead bench's throughput figure: the same closed loop through a proxy with no
// policy at all, so the report shows what any proxy costs on this machine, apart from what stormgate adds.
// - fastify: bench/reference/fastify-proxy.mjs, the gateway's own stack (fastify, undici, pino) and nothing else;
// - nginx: a plain nginx reverse proxy with keep-alive upstream connections and an access log, when nginx is
//   installed (the yardstick: "a plain nginx reverse proxy reaches about 70% on such a machine").
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { spawn } from 'node:child_process';
import { freePort, spawnNode, stopper, waitReady, type Child } from './processes.ts';

export interface Reference {
  name: string;
  /** Undefined when the reference could not run here; `missing` then says why. */
  child?: Child;
  /** The process that serves the requests, for CPU per request: nginx's worker, not its master. */
  servingPid?: number;
  /** Does it pass a stream on as it comes (so its time to first token means something)? */
  streams?: boolean;
  missing?: string;
}

const NGINX_PATHS = ['/usr/sbin/nginx', '/usr/local/sbin/nginx', '/usr/local/nginx/sbin/nginx', '/opt/homebrew/bin/nginx'];

async function fastifyReference(mockUrl: string, workDir: string): Promise<Child> {
  const port = await freePort();
  const logFile = join(workDir, 'reference-fastify.log');
  const proc = spawnNode('bench/reference/fastify-proxy.mjs', [String(port), mockUrl, join(workDir, 'reference-fastify.requests.log')], logFile);
  const url = `http://127.0.0.1:${port}`;
  // It has no /healthz: its 404 there is enough to know it listens.
  await waitReady(`${url}/healthz`, proc, 'reference fastify proxy', logFile);
  return { url, proc, stop: stopper(proc) };
}

async function nginxReference(binary: string, mockUrl: string, workDir: string): Promise<Child> {
  const dir = join(workDir, 'nginx');
  mkdirSync(dir, { recursive: true });
  const port = await freePort();
  const upstream = new URL(mockUrl).host;
  // One worker, like the gateway's one process; keep-alive to the upstream, like the gateway's undici pool.
  writeFileSync(
    join(dir, 'nginx.conf'),
    `daemon off;
worker_processes 1;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections 4096; }
http {
  access_log ${dir}/access.log;
  client_body_temp_path ${dir}/body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  upstream mock { server ${upstream}; keepalive 128; }
  server {
    listen 127.0.0.1:${port};
    location / {
      proxy_pass http://mock;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
`,
  );
  const logFile = join(dir, 'stderr.log');
  const proc = spawn(binary, ['-p', dir, '-e', join(dir, 'error.log'), '-c', join(dir, 'nginx.conf')], { stdio: 'ignore' });
  const url = `http://127.0.0.1:${port}`;
  await waitReady(`${url}/healthz`, proc, 'reference nginx', logFile);
  return { url, proc, stop: stopper(proc) };
}

/** nginx's one worker (worker_processes 1), the child of its master; the master itself when /proc cannot tell. */
function workerPid(master: number): number {
  try {
    const children = readFileSync(`/proc/${master}/task/${master}/children`, 'utf8').trim().split(' ').filter(Boolean);
    return children.length === 1 ? Number(children[0]) : master;
  } catch {
    return master;
  }
}

export async function startReferences(mockUrl: string, workDir: string): Promise<Reference[]> {
  const fastify = await fastifyReference(mockUrl, workDir);
  const refs: Reference[] = [{ name: 'minimal fastify + undici proxy', child: fastify, servingPid: fastify.proc.pid!, streams: true }];
  const binary = NGINX_PATHS.find((p) => existsSync(p));
  if (binary === undefined) {
    refs.push({ name: 'nginx reverse proxy', missing: 'nginx is not installed (Debian: apt-get install nginx-light)' });
  } else {
    const nginx = await nginxReference(binary, mockUrl, workDir);
    refs.push({ name: 'nginx reverse proxy', child: nginx, servingPid: workerPid(nginx.proc.pid!) });
  }
  return refs;
}
