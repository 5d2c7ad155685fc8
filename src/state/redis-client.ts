// Builds the ioredis connections of the state store from `state.redis`: a URL, Sentinel, or Cluster. Every option is
// chosen to fail fast: the request path must never wait on a Redis that is away.
import { Cluster, Redis, type ClusterNode, type ClusterOptions, type Command, type RedisOptions } from 'ioredis';
import type { StateConfig } from '../config/schema.ts';
import { isReadOnly } from './redis-errors.ts';

export type RedisConnection = Redis | Cluster;

/** Reconnect delay after the n-th failed attempt: 50 ms doubling, capped at 2 s, so a returning Redis is found quickly. */
function reconnectDelayMs(attempt: number): number {
  return Math.min(50 * 2 ** Math.max(0, attempt - 1), 2000);
}

/**
 * At most one reconnect per this long for READONLY answers: the name may still point at the old primary for a while
 * after a failover (DNS), or for good (a replica's address in `state.redis`); reconnecting at every refused write would
 * hammer it with new connections, and the store's health check writes once a second anyway.
 */
export const READONLY_RECONNECT_MS = 1000;

/**
 * ioredis's `reconnectOnError` for a single Redis (a URL, or Sentinel's master): a READONLY answer means the connection
 * is held by a primary that was demoted to a replica, which keeps its clients' connections, so no reply, timeout or
 * close ever told the store to leave it: every write failed, and the store stayed degraded until the connection dropped
 * by chance. A new connection follows the name (or asks Sentinel) to the new primary. 1, not 2 (reconnect and resend):
 * with the offline queue off, ioredis refuses the resend on the closing connection, and the store has already answered
 * from local state. `now` is injectable for tests.
 */
export function reconnectOnReadOnly(now: () => number = Date.now): (err: Error) => 1 | false {
  let lastMs = Number.NEGATIVE_INFINITY;
  return (err) => {
    if (!isReadOnly(err) || now() - lastMs < READONLY_RECONNECT_MS) return false;
    lastMs = now();
    return 1;
  };
}

/**
 * Opens one connection. `subscriber` connections carry no command timeout (SUBSCRIBE is not on the request path) and
 * are resubscribed by the store itself on every 'ready', so it can re-read state right after.
 */
export function connectRedis(config: StateConfig, opts: { subscriber: boolean }): RedisConnection {
  const redis = config.redis;
  if (redis === undefined || redis === '') throw new Error('state.redis is not set; use the in-process store');
  const common: RedisOptions = {
    // A command issued while disconnected fails at once instead of queueing behind a reconnect.
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    autoResendUnfulfilledCommands: false,
    autoResubscribe: false,
    commandTimeout: opts.subscriber ? undefined : config.commandTimeoutMs,
    connectTimeout: Math.max(1000, config.commandTimeoutMs * 10),
    connectionName: opts.subscriber ? 'stormgate-sub' : 'stormgate',
  };
  // Not for a Cluster: its replicas answer MOVED, not READONLY, and a failover there changes the slot map instead.
  const single: RedisOptions = { ...common, retryStrategy: reconnectDelayMs, reconnectOnError: reconnectOnReadOnly() };
  if (typeof redis === 'string') return new Redis(redis, single);

  const auth: RedisOptions = {
    username: redis.username,
    password: redis.password,
    db: redis.db,
    tls: redis.tls ? {} : undefined,
  };
  if (redis.cluster) {
    const { enableOfflineQueue, commandTimeout, ...nodeOptions } = { ...common, ...auth };
    const clusterOptions: ClusterOptions = {
      enableOfflineQueue,
      clusterRetryStrategy: reconnectDelayMs,
      // ioredis resolves the seed nodes' host names and connects to the addresses, so over TLS it checked the server's
      // certificate against an IP it does not name (ERR_TLS_CERT_ALTNAME_INVALID) and never connected: AWS ElastiCache
      // (cluster mode, in-transit encryption; Serverless) and any cluster whose certificate names its hosts. Kept as
      // names, the socket resolves them and TLS checks the name.
      ...(auth.tls && { dnsLookup: keepHostName }),
      // The node connections bound only the Cluster's own commands with it (see StoreCluster).
      redisOptions: { ...nodeOptions, commandTimeout: commandTimeout === undefined ? undefined : common.connectTimeout },
    };
    return new StoreCluster(redis.cluster, clusterOptions, commandTimeout);
  }
  if (redis.sentinels) {
    return new Redis({ ...single, ...auth, sentinels: redis.sentinels, name: redis.name });
  }
  throw new Error('state.redis needs a URL, `sentinels` with `name`, or `cluster`');
}

/**
 * Where `state.redis` points, for the log: host:port of a URL (6379 when it names none), or the Sentinel master's name
 * and its sentinels, or the Cluster's seed nodes. Never a user name or password.
 */
export function redisAddress(redis: NonNullable<StateConfig['redis']>): string {
  const nodes = (list: Array<{ host: string; port: number }>) => list.map((n) => `${n.host}:${n.port}`).join(',');
  if (typeof redis !== 'string') {
    if (redis.cluster) return `cluster ${nodes(redis.cluster)}`;
    return `sentinel ${redis.name ?? ''} via ${nodes(redis.sentinels ?? [])}`;
  }
  if (!URL.canParse(redis)) return 'an unparsable state.redis URL';
  const { hostname, port } = new URL(redis);
  return `${hostname}:${port || '6379'}`;
}

function keepHostName(hostname: string, callback: (err: NodeJS.ErrnoException | null, address: string) => void): void {
  callback(null, hostname);
}

/**
 * A Cluster whose command timeout bounds the commands sent once it is ready (the store's), not the ones it sends while
 * it (re)connects. ioredis queues its CLUSTER SLOTS (on a new connection each time) and its ready check (CLUSTER INFO)
 * on node connections that are not open yet, so a node-level commandTimeout of 50 ms had to cover the TCP connect
 * (and a TLS handshake, and AUTH) as well: on an event loop busy for a moment, or a Redis a few milliseconds away over
 * TLS, the Cluster failed to start ("Failed to refresh slots cache"), and where connecting always takes that long it
 * never did, the store staying on local state while a single Redis at the same distance worked. Those commands keep the
 * connect timeout as their bound.
 */
class StoreCluster extends Cluster {
  readonly commandTimeoutMs: number | undefined;

  constructor(nodes: ClusterNode[], options: ClusterOptions, commandTimeoutMs: number | undefined) {
    super(nodes, options);
    this.commandTimeoutMs = commandTimeoutMs;
  }

  override sendCommand(command: Command, ...rest: unknown[]): unknown {
    // Set first, this wins: a command's timer is set once, so the node connection's longer one does not replace it.
    // A MOVED or ASK redirection resends the same command, still under this one timer.
    if (this.commandTimeoutMs !== undefined && this.status === 'ready') command.setTimeout(this.commandTimeoutMs);
    return (super.sendCommand as (...args: unknown[]) => unknown)(command, ...rest);
  }
}
