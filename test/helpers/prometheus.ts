// Starts a real, throwaway Prometheus on a free loopback port for the observability tests: it scrapes the given
// targets every second and evaluates the given rule files every second. The process and its temp dir are removed when
// the test stops it, and killed/removed when the test process exits, even after a failed test.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { isAbsolute, join, resolve } from 'node:path';
import { stringify } from 'yaml';

export interface PrometheusOptions {
  /** host:port of every endpoint to scrape at /metrics. */
  scrapeTargets: string[];
  /** Rule files (recording and alerting) to load; relative paths resolve against the working directory. */
  ruleFiles: string[];
}

export interface PrometheusHandle {
  /** http://127.0.0.1:<port> */
  url: string;
  /** SIGTERM, waits for the process to exit, removes the temp dir. */
  stop(): Promise<void>;
}

/** One PromQL answer of /api/v1/query. */
export interface QueryResult {
  status: 'success' | 'error';
  error?: string;
  errorType?: string;
  data?: { resultType: string; result: Array<{ metric: Record<string, string>; value?: [number, string]; values?: unknown[] }> | [number, string] };
}

const running = new Map<ChildProcess, string>();
process.on('exit', () => {
  for (const [child, dir] of running) {
    child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
});

/** Starts prometheus and resolves once /-/ready answers 200. */
export async function startPrometheus(opts: PrometheusOptions): Promise<PrometheusHandle> {
  const dir = mkdtempSync(join(tmpdir(), 'stormgate-prometheus-'));
  const configFile = join(dir, 'prometheus.yml');
  writeFileSync(
    configFile,
    stringify({
      global: { scrape_interval: '1s', scrape_timeout: '1s', evaluation_interval: '1s' },
      rule_files: opts.ruleFiles.map((f) => (isAbsolute(f) ? f : resolve(f))),
      scrape_configs: [{ job_name: 'stormgate', metrics_path: '/metrics', static_configs: [{ targets: opts.scrapeTargets }] }],
    }),
  );
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const args = [
    `--config.file=${configFile}`,
    `--storage.tsdb.path=${join(dir, 'data')}`,
    `--web.listen-address=127.0.0.1:${port}`,
    '--web.enable-lifecycle',
    '--log.level=warn',
  ];
  const child = spawn('prometheus', args, { stdio: ['ignore', 'pipe', 'pipe'] });
  running.set(child, dir);
  let output = '';
  const keep = (chunk: Buffer) => (output = (output + chunk.toString()).slice(-4000));
  child.stdout?.on('data', keep);
  child.stderr?.on('data', keep);
  let spawnError: Error | undefined;
  child.once('error', (err) => (spawnError = err));

  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = once(child, 'exit');
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
      await exited;
      clearTimeout(timer);
    }
    running.delete(child);
    rmSync(dir, { recursive: true, force: true });
  };

  const deadline = Date.now() + 15_000;
  while (Date.now() < deadline) {
    if (spawnError) {
      await stop();
      throw new Error(`could not start prometheus (${spawnError.message}); run \`npm run pretest\` to install it`);
    }
    if (child.exitCode !== null) {
      await stop();
      throw new Error(`prometheus exited with ${child.exitCode}:\n${output}`);
    }
    if (await ready(url)) return { url, stop };
    await new Promise((r) => setTimeout(r, 50));
  }
  await stop();
  throw new Error(`prometheus on port ${port} was not ready within 15 s:\n${output}`);
}

/** GET /api/v1/query?query=... at the current time. */
export async function query(prometheusUrl: string, promql: string): Promise<QueryResult> {
  const res = await fetch(`${prometheusUrl}/api/v1/query`, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ query: promql }),
  });
  return (await res.json()) as QueryResult;
}

async function ready(url: string): Promise<boolean> {
  try {
    const res = await fetch(`${url}/-/ready`, { signal: AbortSignal.timeout(1_000) });
    await res.arrayBuffer();
    return res.status === 200;
  } catch {
    return false;
  }
}

async function freePort(): Promise<number> {
  const server = createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const address = server.address();
  server.close();
  if (address === null || typeof address === 'string') throw new Error('no port');
  return address.port;
}
