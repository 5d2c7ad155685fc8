// Picks the state store from the config: Redis when `state.redis` is set, else in-process.
import type { Logger } from 'pino';
import type { StateConfig } from '../config/schema.ts';
import { MemoryStore } from './memory-store.ts';
import { RedisStore } from './redis-store.ts';
import type { StateStore } from './store.ts';

export interface StateStoreDeps {
  logger?: Logger;
  /** Clock; default Date.now. */
  now?: () => number;
}

/** A RedisStore when `config.redis` is a non-empty URL or a Sentinel/Cluster object, else a MemoryStore. */
export function createStateStore(config: StateConfig, deps: StateStoreDeps = {}): StateStore {
  const { redis } = config;
  if (redis === undefined || redis === '') return new MemoryStore();
  return new RedisStore({ config, logger: deps.logger, now: deps.now });
}
