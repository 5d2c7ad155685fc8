// Starts a real, throwaway redis-server on a free loopback port for integration tests. Every process it starts is
// killed when the test process exits, even after a failed test, so no server outlives its run.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createConnection } from 'node:net';
import { tmpdir } from 'node:os';
import { Redis, type RedisOptions } from 'ioredis';
import { afterAll, beforeAll } from 'vitest';
import { freePort } from './free-port.ts';

export interface RedisHandle {
  /** redis://127.0.0.1:<port> */
  url: string;
  port: number;
  /** SIGTERM, then waits for the process to exit. */
  stop(): Promise<void>;
  /** Starts a fresh (empty) server on the same port, as after a crash or failover. */
  restart(): Promise<void>;
  /** SIGKILL, without waiting. */
  kill(): void;
  /** SIGSTOP: connections are still accepted, nothing is answered. Returns the SIGCONT. */
  freeze(): () => void;
}

const children = new Set<ChildProcess>();
process.on('exit', () => {
  for (const child of children) child.kill('SIGKILL');
});

/** One redis-server for a test file: started before its tests, stopped after them; the getter gives its handle. */
export function useRedisServer(): () => RedisHandle {
  let redis: RedisHandle | undefined;
  beforeAll(async () => {
    redis = await startRedis();
  });
  afterAll(async () => {
    await redis?.stop();
  });
  return () => redis!;
}

/**
 * useRedisServer, with a client of the test's own to drive the server with (CONFIG SET, CLIENT PAUSE, DEBUG SLEEP):
 * `redis()` and `admin()` are the server and that client, from beforeAll on. `options` are the client's (say
 * maxRetriesPerRequest: 1, for a check that Redis is up to answer at once while it is stopped); its connection errors,
 * which a test stopping or freezing the server causes, are expected and not reported.
 */
export function useRedisServerWithAdmin(options: RedisOptions = {}): { redis: () => RedisHandle; admin: () => Redis } {
  let redis: RedisHandle | undefined;
  let admin: Redis | undefined;
  beforeAll(async () => {
    redis = await startRedis();
    admin = new Redis(redis.url, options);
    admin.on('error', () => undefined);
  });
  afterAll(async () => {
    admin?.disconnect();
    await redis?.stop();
  });
  return { redis: () => redis!, admin: () => admin! };
}

/** Starts redis-server on a free port and resolves once it answers PING. */
export async function startRedis(): Promise<RedisHandle> {
  let port = await freePort();
  let child: ChildProcess;
  // A port free when picked can be taken before redis-server binds it (another test file's process, in a full CI run):
  // such a start is tried again on another port.
  for (let tries = 1; ; tries++) {
    try {
      child = await launch(port);
      break;
    } catch (err) {
      if (tries >= 5 || !String((err as Error).message).includes('Address already in use')) throw err;
      port = await freePort();
    }
  }
  return {
    url: `redis://127.0.0.1:${port}`,
    port,
    stop: () => stop(child),
    restart: async () => {
      await stop(child);
      child = await launch(port);
    },
    kill: () => void child.kill('SIGKILL'),
    freeze: () => {
      const frozen = child;
      frozen.kill('SIGSTOP');
      return () => void frozen.kill('SIGCONT');
    },
  };
}

async function launch(port: number): Promise<ChildProcess> {
  const args = ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--daemonize', 'no', '--protected-mode', 'no', '--dir', tmpdir()];
  const child = spawn('redis-server', args, { stdio: ['ignore', 'pipe', 'pipe'] });
  children.add(child);
  child.once('exit', () => children.delete(child));
  let output = '';
  const keep = (chunk: Buffer) => (output = (output + chunk.toString()).slice(-2000));
  child.stdout?.on('data', keep);
  child.stderr?.on('data', keep);
  const spawnError = new Promise<never>((_, reject) => child.once('error', reject));
  spawnError.catch(() => undefined);

  const deadline = Date.now() + 10_000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`redis-server exited with ${child.exitCode}:\n${output}`);
    if (await Promise.race([ping(port), spawnError])) return child;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  child.kill('SIGKILL');
  throw new Error(`redis-server on port ${port} did not answer PING within 10 s:\n${output}`);
}

/** One raw PING over TCP: true on +PONG. */
function ping(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = createConnection({ host: '127.0.0.1', port });
    const done = (ok: boolean) => {
      socket.destroy();
      resolve(ok);
    };
    socket.setTimeout(500, () => done(false));
    socket.once('error', () => done(false));
    socket.once('connect', () => socket.write('PING\r\n'));
    socket.once('data', (data) => done(data.toString().startsWith('+PONG')));
  });
}

async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = once(child, 'exit');
  child.kill('SIGTERM');
  await exited;
}
