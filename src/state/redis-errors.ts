// Telling a misconfigured Redis from one that is away, and describing Redis errors without leaking credentials.
// Redis names an error by the first word of its reply (WRONGPASS, NOAUTH, NOPERM, ERR ...): that word is its code.
// ioredis attaches the failed command to the error, and for AUTH that command carries the password, so an ioredis
// error is never logged as it is.

/** A Redis answer that says the gateway's Redis settings are wrong: waiting or reconnecting will not fix it. */
export interface ConfigProblem {
  /** Stable name of the problem, for tests and dashboards. */
  kind: 'credentials' | 'password-missing' | 'permissions' | 'database';
  /** The setting to check, in the config's own words. */
  setting: string;
  /** One line for the log: what is wrong and what to do. */
  message: string;
  /** Redis's own words (never a credential: Redis does not echo them). */
  redisError: string;
}

const PROBLEMS: Array<{ test: RegExp; problem: Omit<ConfigProblem, 'redisError'> }> = [
  {
    test: /^(?:Ready check failed: )?WRONGPASS\b|^(?:Ready check failed: )?ERR invalid (?:username-)?password/,
    problem: {
      kind: 'credentials',
      setting: 'state.redis username/password',
      message: 'state store: Redis refused the configured credentials. This is a configuration problem, not an outage: '
        + 'check the username and password in state.redis (the URL\'s user:password@ part, or state.redis.username and '
        + 'password) against the server\'s ACL or requirepass. Serving from local state until Redis accepts them.',
    },
  },
  {
    test: /^(?:Ready check failed: )?NOAUTH\b/,
    problem: {
      kind: 'password-missing',
      setting: 'state.redis password',
      message: 'state store: Redis requires a password and state.redis gives none. This is a configuration problem, not '
        + 'an outage: set the password in state.redis (redis://:PASSWORD@host:port, or state.redis.password). Serving '
        + 'from local state until then.',
    },
  },
  {
    // A command, key or channel a script may not use is refused with an ERR that names the script (Redis 7), not a
    // NOPERM: "can't run this command or subcommand", "can't access at least one of the keys", "can't publish to the channel".
    test: /^(?:Ready check failed: )?NOPERM\b|^ERR The user executing the script can't (?:run this command|access at least one of the keys|publish to the channel)/,
    problem: {
      kind: 'permissions',
      setting: 'the ACL of the state.redis user',
      message: 'state store: the Redis user in state.redis may not run a command the gateway needs. This is a '
        + 'configuration problem, not an outage: check that user\'s ACL (it needs scripting, pub/sub, hashes, strings, '
        + 'sorted sets and keyspace (PEXPIRE) on the keyPrefix keys and channel). Serving from local state where Redis refuses.',
    },
  },
  {
    test: /^ERR (?:DB index is out of range|invalid DB index|SELECT is not allowed in cluster mode)/,
    problem: {
      kind: 'database',
      setting: 'state.redis db',
      message: 'state store: Redis refused the configured database. This is a configuration problem, not an outage: '
        + 'check the db index in state.redis (the URL\'s /<db> path, or state.redis.db) against the server\'s '
        + '`databases` setting (Redis Cluster has only db 0). Not using Redis, so state stays local to this instance.',
    },
  },
];

/** The configuration problem an error from Redis reports, if it reports one; undefined for outages and the like. */
export function configProblem(err: unknown): ConfigProblem | undefined {
  // A Cluster that found no usable node keeps the last node's error beside its own.
  for (const e of [err, (err as { lastNodeError?: unknown } | null)?.lastNodeError]) {
    const message = errorMessage(e);
    if (message === undefined) continue;
    const found = PROBLEMS.find((p) => p.test.test(message));
    if (found) return { ...found.problem, redisError: message.replace(/^Ready check failed: /, '') };
  }
  return undefined;
}

/**
 * What may be logged of an error from ioredis: its type, message and code, never the command it failed (AUTH's password).
 * Logged as `error`, not `err`: pino's err serializer would take it for an Error and rename its type `Object`.
 */
export function safeError(err: unknown): { type: string; message: string; code?: string } | undefined {
  if (err === undefined || err === null) return undefined;
  if (!(err instanceof Error)) return { type: typeof err, message: String(err) };
  const code = (err as { code?: unknown }).code;
  return { type: err.name, message: err.message, ...(typeof code === 'string' ? { code } : {}) };
}

function errorMessage(err: unknown): string | undefined {
  if (err instanceof Error) return err.message;
  return typeof err === 'string' ? err : undefined;
}

/**
 * Redis refused a write because it is a replica: on a name that follows the primary (ElastiCache's primary endpoint,
 * Azure Cache, a VIP), the old primary after a failover, still holding the connections it had. Scripts say so too
 * (`READONLY You can't write against a read only replica. script: ...`).
 */
export function isReadOnly(err: unknown): boolean {
  return err instanceof Error && /^READONLY\b/.test(err.message);
}

/**
 * A key of the gateway's holds a value of another type (`WRONGTYPE ...`, from a script too): something else writes
 * under its keyPrefix.
 */
export function isWrongType(err: unknown): boolean {
  return err instanceof Error && /^WRONGTYPE\b/.test(err.message);
}

/** ioredis's commandTimeout rejects with a plain Error and no code: its message is all there is to tell it by. */
export function isCommandTimeout(err: unknown): boolean {
  return err instanceof Error && err.message === 'Command timed out';
}
