// Builds the ioredis connections of the state store from `state.redis`: a URL, Sentinel, or Cluster. Every option is
// chosen to fail fast: the request path must never wait on a Redis that is away.
import { Cluster, Redis, type ClusterOptions, type RedisOptions } from 'ioredis';
import type { StateConfig } from '../config/schema.ts';

export type RedisConnection = Redis | Cluster;

/** Reconnect delay after the n-th failed attempt: 50 ms doubling, capped at 2 s, so a returning Redis is found quickly. */
export function reconnectDelayMs(attempt: number): number {
  return Math.min(50 * 2 ** Math.max(0, attempt - 1), 2000);
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
  if (typeof redis === 'string') return new Redis(redis, { ...common, retryStrategy: reconnectDelayMs });

  const auth: RedisOptions = {
    username: redis.username,
    password: redis.password,
    db: redis.db,
    tls: redis.tls ? {} : undefined,
  };
  if (redis.cluster) {
    const { enableOfflineQueue, ...nodeOptions } = { ...common, ...auth };
    const clusterOptions: ClusterOptions = {
      enableOfflineQueue,
      clusterRetryStrategy: reconnectDelayMs,
      redisOptions: nodeOptions,
    };
    return new Cluster(redis.cluster, clusterOptions);
  }
  if (redis.sentinels) {
    return new Redis({ ...common, ...auth, sentinels: redis.sentinels, name: redis.name, retryStrategy: reconnectDelayMs });
  }
  throw new Error('state.redis needs a URL, `sentinels` with `name`, or `cluster`');
}
