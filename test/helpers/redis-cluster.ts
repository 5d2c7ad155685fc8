// Starts a real, throwaway Redis Cluster (a few masters, no replicas) on free loopback ports for integration tests:
// one redis-server per node, joined by `redis-cli --cluster create`. Forms in about a second. Every process it starts
// is killed when the test process exits, even after a failed test, and its node files are removed. With TLS it is
// reached as managed clusters are: by a host name its certificate names (`localhost`), never by address.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { freePort } from './free-port.ts';

export interface RedisClusterHandle {
  /** The masters, as `state.redis.cluster` takes them. */
  nodes: Array<{ host: string; port: number }>;
  /** SIGSTOP on every node, or on the one on `port`: connections are still accepted, nothing is answered. Returns the SIGCONT. */
  freeze(port?: number): () => void;
  /** The port of the master that holds `key`'s slot. */
  masterOf(key: string): Promise<number>;
  stop(): Promise<void>;
}

/** A test CA and a server certificate for `localhost` (its only name: no IP address), as PEM files. */
interface TestCertificates {
  ca: string;
  cert: string;
  key: string;
}

/** Why a cluster cannot be started here (redis-cli, which forms it, comes with Debian's redis-tools), or undefined. */
export function clusterUnavailable(opts: { tls?: boolean } = {}): string | undefined {
  for (const bin of ['redis-server', 'redis-cli']) {
    if (spawnSync(bin, ['--version']).error) return `${bin} is not installed (apt-get install redis-server redis-tools)`;
  }
  if (opts.tls) {
    if (spawnSync('openssl', ['version']).error) return 'openssl is not installed (it makes the test certificates)';
    if (spawnSync('redis-cli', ['--tls', '--version']).status !== 0) return 'redis-cli was built without TLS';
  }
  return undefined;
}

/** Makes a CA and a certificate it signed for `localhost` in dir, with openssl. */
export function makeCertificates(dir: string): TestCertificates {
  const files = { ca: join(dir, 'ca.pem'), cert: join(dir, 'server.pem'), key: join(dir, 'server.key') };
  const caKey = join(dir, 'ca.key');
  const csr = join(dir, 'server.csr');
  const ext = join(dir, 'ext.cnf');
  const steps: string[][] = [
    ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', caKey, '-out', files.ca, '-days', '1', '-subj', '/CN=stormgate test CA'],
    ['req', '-newkey', 'rsa:2048', '-nodes', '-keyout', files.key, '-out', csr, '-subj', '/CN=localhost'],
    ['x509', '-req', '-in', csr, '-CA', files.ca, '-CAkey', caKey, '-CAcreateserial', '-out', files.cert, '-days', '1', '-extfile', ext],
  ];
  spawnSync('sh', ['-c', `printf 'subjectAltName=DNS:localhost\n' > '${ext}'`]);
  for (const args of steps) {
    const run = spawnSync('openssl', args, { encoding: 'utf8' });
    if (run.status !== 0) throw new Error(`openssl ${args[0]} failed: ${run.stderr}`);
  }
  return files;
}

const children = new Set<ChildProcess>();
process.on('exit', () => {
  for (const child of children) child.kill('SIGKILL');
});

/**
 * Starts `masters` cluster nodes, joins them, and resolves once every node reports `cluster_state:ok`. With `tls`, the
 * nodes speak only TLS (cluster bus too) and announce themselves as `localhost`.
 */
export async function startRedisCluster(masters = 3, opts: { tls?: TestCertificates } = {}): Promise<RedisClusterHandle> {
  try {
    return await startCluster(masters, opts.tls);
  } catch (err) {
    // A free port found and then taken by another process before the node bound it (a busy machine, tests in
    // parallel): the node exits at once. Once more, on fresh ports.
    if (!(err instanceof NodeExited)) throw err;
    return startCluster(masters, opts.tls);
  }
}

class NodeExited extends Error {}

async function startCluster(masters: number, tls: TestCertificates | undefined): Promise<RedisClusterHandle> {
  const dir = mkdtempSync(join(tmpdir(), 'stormgate-cluster-'));
  const started: ChildProcess[] = [];
  /** Per node's port: its output once it has exited, else undefined. */
  const exits = new Map<number, () => string | undefined>();
  const stop = async () => {
    await Promise.all(started.map(async (child) => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = once(child, 'exit');
      child.kill('SIGKILL');
      await exited;
    }));
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    const nodes: Array<{ host: string; port: number }> = [];
    for (let i = 0; i < masters; i++) {
      // The bus port is set apart: port + 10000, its default, may be taken or past 65535. The node timeout is long
      // enough that a node a test freezes for a few seconds is not failed by the others (which would fail the cluster).
      const [port, busPort] = [await freePort(), await freePort()];
      const listen = tls
        ? ['--port', '0', '--tls-port', String(port), '--tls-cert-file', tls.cert, '--tls-key-file', tls.key, '--tls-ca-cert-file', tls.ca,
          '--tls-auth-clients', 'no', '--tls-cluster', 'yes', '--cluster-announce-hostname', 'localhost', '--cluster-preferred-endpoint-type', 'hostname']
        : ['--port', String(port)];
      const args = [...listen, '--cluster-port', String(busPort), '--bind', '127.0.0.1', '--cluster-enabled', 'yes',
        '--cluster-config-file', `nodes-${port}.conf`, '--cluster-node-timeout', '5000', '--save', '', '--appendonly', 'no',
        '--protected-mode', 'no', '--dir', dir];
      const child = spawn('redis-server', args, { stdio: ['ignore', 'pipe', 'pipe'] });
      let output = '';
      for (const stream of [child.stdout, child.stderr]) stream.on('data', (d: Buffer) => (output = (output + d.toString()).slice(-2_000)));
      exits.set(port, () => (child.exitCode === null ? undefined : output));
      children.add(child);
      started.push(child);
      child.once('exit', () => children.delete(child));
      nodes.push({ host: tls ? 'localhost' : '127.0.0.1', port });
    }
    await Promise.all(nodes.map((n) => untilAnswers(n.port, tls, exits.get(n.port)!)));
    const cliTls = tls ? ['--tls', '--cacert', tls.ca] : [];
    const create = spawnSync('redis-cli', [...cliTls, '--cluster', 'create', ...nodes.map((n) => `127.0.0.1:${n.port}`), '--cluster-replicas', '0', '--cluster-yes'],
      { encoding: 'utf8', timeout: 20_000 });
    if (create.status !== 0) throw new Error(`redis-cli --cluster create failed:\n${create.stdout}${create.stderr}`);
    await Promise.all(nodes.map((n) => untilClusterOk(n.port, tls)));
    const freeze = (port?: number) => {
      const frozen = started.filter((_, i) => port === undefined || nodes[i]!.port === port);
      for (const child of frozen) child.kill('SIGSTOP');
      return () => frozen.forEach((child) => child.kill('SIGCONT'));
    };
    const masterOf = async (key: string) => {
      const conn = new Redis({ port: nodes[0]!.port, host: nodes[0]!.host, ...(tls && { tls: { ca: readFileSync(tls.ca) } }) });
      try {
        const slot = await conn.cluster('KEYSLOT', key);
        const ranges = await conn.cluster('SLOTS');
        return ranges.find(([from, to]) => slot >= from && slot <= to)![2]![1];
      } finally {
        conn.disconnect();
      }
    };
    return { nodes, freeze, masterOf, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

async function untilAnswers(port: number, tls: TestCertificates | undefined, exited: () => string | undefined): Promise<void> {
  await untilInfo(port, tls, () => true, exited);
}

async function untilClusterOk(port: number, tls: TestCertificates | undefined): Promise<void> {
  await untilInfo(port, tls, (info) => info.includes('cluster_state:ok'));
}

async function untilInfo(port: number, tls: TestCertificates | undefined, ok: (clusterInfo: string) => boolean, exited?: () => string | undefined): Promise<void> {
  const deadline = Date.now() + 15_000;
  const host = tls ? 'localhost' : '127.0.0.1';
  for (;;) {
    const output = exited?.();
    if (output !== undefined) throw new NodeExited(`cluster node on port ${port} exited:\n${output}`);
    const conn = new Redis({
      port, host, lazyConnect: true, retryStrategy: () => null, maxRetriesPerRequest: 0,
      ...(tls && { tls: { ca: readFileSync(tls.ca) } }),
    });
    conn.on('error', () => undefined);
    try {
      await conn.connect();
      if (ok(await conn.cluster('INFO'))) return;
    } catch {
      // not up yet
    } finally {
      conn.disconnect();
    }
    if (Date.now() > deadline) throw new Error(`cluster node on port ${port} not ready within 15 s`);
    await sleep(50);
  }
}
