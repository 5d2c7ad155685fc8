// Whether the Redis the store uses may evict its keys: every key the gateway writes has a time to live, so under any
// evicting maxmemory-policy (allkeys-*, and volatile-*, the default of AWS ElastiCache and Azure Cache) memory pressure
// drops them like any cache entry. A breaker record, a budget or a hold-off lost that way is rebuilt by the fleet's next
// change; a running idempotency claim is not, and a repeat on another instance then runs the request a second time.
import type { Logger } from 'pino';
import type { RedisConnection } from './redis-client.ts';

/** The eviction policy Redis reports in INFO memory, when it evicts (maxmemory set, a policy other than noeviction). */
export function evictingPolicy(infoMemory: string): string | undefined {
  const maxmemory = Number(/^maxmemory:(\d+)/m.exec(infoMemory)?.[1] ?? 0);
  const policy = /^maxmemory_policy:(\S+)/m.exec(infoMemory)?.[1];
  return maxmemory > 0 && policy !== undefined && policy !== 'noeviction' ? policy : undefined;
}

/**
 * Reads the policy on each new connection (the README's ACL allows INFO) and warns once per policy: an operator learns
 * at start-up, not from a coupon given twice, that the Redis can drop what the gateway promises to keep. Never throws.
 */
export class MemoryPolicyCheck {
  readonly #warned = new Set<string>();

  constructor(
    private readonly client: RedisConnection,
    private readonly logger: Logger | undefined,
  ) {}

  async check(): Promise<void> {
    try {
      const policy = evictingPolicy(await this.client.info('memory'));
      if (policy === undefined || this.#warned.has(policy)) return;
      this.#warned.add(policy);
      this.logger?.warn(
        { maxmemoryPolicy: policy },
        'state store: Redis may evict the gateway\'s keys under memory pressure (maxmemory-policy is not noeviction): an evicted '
          + 'idempotency claim lets a repeat run its request again. Give the gateway a Redis with maxmemory-policy noeviction',
      );
    } catch {
      // Not known: nothing to say. The store's own commands report an unusable Redis.
    }
  }
}
