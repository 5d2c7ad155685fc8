// Whether the Redis store may use Redis now, and how it comes back when not: one state machine that every command only
// reports to, so one place decides when the fleet's state is decided locally.
import { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { configProblem, isCommandTimeout, isReadOnly, isWrongType, safeError, type ConfigProblem } from './redis-errors.ts';
import type { RedisKeys } from './redis-keys.ts';
import type { ScriptClient } from './redis-scripts.ts';

/** While degraded on a live connection (timeouts, refused writes), how often a keyed write checks whether Redis takes writes again. */
const PROBE_INTERVAL_MS = 1000;
/**
 * After Redis refused a command for a configuration reason (an ACL without a command the gateway needs), how long the
 * store stays on local state before it tries Redis again: a PING would pass at once, and flapping helps nobody.
 */
const CONFIG_RETRY_MS = 30_000;
/**
 * A store that degrades again within this long of recovering is flapping (a Redis slow every other second): each such
 * flap doubles the health checks in a row that must pass before it recovers again, up to MAX_CLEAN_PROBES. Flipping
 * every second, the gauge read 0 at most scrapes and the degraded alert (`for: 2m`) never fired, two log lines a
 * second said so, and every flip changed where the fleet's state was decided.
 */
const FLAP_WINDOW_MS = 60_000;
const MAX_CLEAN_PROBES = 16;
/** Probes that time out in a row (a second apart) before the store drops the connection for a new one. */
const RECONNECT_AFTER_PROBE_TIMEOUTS = 2;
/** The health check's key expires this long after it is written. */
const PROBE_TTL_MS = 1000;
/**
 * Command timeouts in a row that make the store degraded. One alone is no outage: on a busy event loop the command's
 * timer can fire before the reply that is already waiting in the socket is read, and each such call is answered from
 * local state anyway. A lost connection degrades at once.
 */
const DEGRADE_AFTER_TIMEOUTS = 3;

interface RedisHealthDeps {
  /** The command connection: its events are watched here, and its health checked by keyed writes. */
  client: ScriptClient;
  keys: RedisKeys;
  logger: Logger | undefined;
  /** The store's clock (when Redis last refused the configuration, when the store last recovered). */
  now: () => number;
  commandTimeoutMs: number;
  /** Where `state.redis` points (redisAddress: host:port, no credentials), named in the degraded and recovered lines. */
  address: string;
  /** Redis's clock has been read on this connection: until then the store stays off it. */
  clockRead: () => boolean;
  /** Redis is usable again: what waited for it is sent, and the view read again. */
  onRecovered: () => void;
}

export class RedisHealth {
  readonly #client: ScriptClient;
  readonly #keys: RedisKeys;
  readonly #logger: Logger | undefined;
  readonly #now: () => number;
  readonly #clockRead: () => boolean;
  readonly #onRecovered: () => void;
  readonly #address: string;
  readonly #degradedListeners = new Set<(degraded: boolean) => void>();
  #probeTimer: NodeJS.Timeout | undefined;
  #lastError: unknown;
  /** A configuration problem Redis reported on the current command connection: it stays unused until a new one. */
  #misconfigured: ConfigProblem | undefined;
  /** Configuration problems already logged (once each, not at every reconnect); forgotten when a connection comes up sound. */
  readonly #reported = new Set<string>();
  /** When Redis last refused a command for a configuration reason (the store's clock). */
  #refusedAtMs: number | undefined;
  #degraded = false;
  #closed = false;
  #timeoutsInARow = 0;
  /** When (performance.now()) the last timeout counted in #timeoutsInARow fired. */
  #lastTimeoutMs = Number.NEGATIVE_INFINITY;
  readonly #commandTimeoutMs: number;
  /** Redis refused a write as a replica since the store last recovered (see onConnected). */
  #readOnly = false;
  /** The key of the last failed single-key command (see failed); forgotten on recovery. */
  #failedKey: string | undefined;
  /** Health checks that timed out in a row on the current connection (see #probe). */
  #probeTimeoutsInARow = 0;
  /** Health checks passed in a row while degraded, and how many it takes to recover (see FLAP_WINDOW_MS). */
  #cleanProbes = 0;
  #cleanProbesNeeded = 1;
  #recoveredAtMs = Number.NEGATIVE_INFINITY;
  /** When the store last degraded (the store's clock): the recovered line says how long it was on local state. */
  #degradedAtMs = 0;

  constructor(deps: RedisHealthDeps) {
    this.#client = deps.client;
    this.#keys = deps.keys;
    this.#logger = deps.logger;
    this.#now = deps.now;
    this.#commandTimeoutMs = deps.commandTimeoutMs;
    this.#clockRead = deps.clockRead;
    this.#onRecovered = deps.onRecovered;
    this.#address = deps.address;
    // 'connect' comes before AUTH and SELECT are answered: a new connection starts with a clean slate.
    this.#client.on('connect', () => (this.#misconfigured = undefined));
    // A connection that closes without an error event (a killed Redis) must not be reported with an older error.
    this.#client.on('close', () => {
      this.#lastError ??= new Error('connection to Redis closed');
      this.setDegraded(true);
    });
    // Connection errors are expected while Redis is away; the degraded warning reports the last one. Configuration
    // errors are not: they are logged as such (once each).
    this.#client.on('error', (err: unknown) => this.connectionError(err, true));
    this.#client.on('node error', (err: unknown) => this.connectionError(err, true));
  }

  get degraded(): boolean {
    return this.#degraded;
  }

  /** How long the store has been degraded, by the store's clock; undefined while it is not. */
  degradedForMs(): number | undefined {
    return this.#degraded ? this.#now() - this.#degradedAtMs : undefined;
  }

  get closed(): boolean {
    return this.#closed;
  }

  get misconfigured(): ConfigProblem | undefined {
    return this.#misconfigured;
  }

  usable(): boolean {
    return !this.#degraded && !this.#closed && this.#clockRead() && this.#client.status === 'ready';
  }

  onDegradedChange(listener: (degraded: boolean) => void): () => void {
    this.#degradedListeners.add(listener);
    return () => this.#degradedListeners.delete(listener);
  }

  /** The store closes: nothing changes from here, and the health checks stop. */
  close(): void {
    this.#closed = true;
    clearInterval(this.#probeTimer);
    this.#degradedListeners.clear();
  }

  /** A new command connection is ready: configuration problems seen before it may be logged again if they come back. */
  onConnected(): void {
    if (!this.#misconfigured) this.#reported.clear();
    // Two outages a new connection does not end by itself, and taken for their end, the store recovered, failed its
    // next write and flapped: a Cluster is ready as soon as any node answers, while the slot whose commands failed may
    // still be failing over; and after a READONLY (see reconnectOnReadOnly) a name that still points at the demoted
    // primary leads to it again. The health check's write (beside the failed key) says whether this connection is past
    // it; it runs now, not a second later.
    const unproven = this.#readOnly || (this.#failedKey !== undefined && !(this.#client instanceof Redis));
    if (this.#degraded && unproven) {
      this.#probe();
      return;
    }
    this.#onReady();
  }

  #onReady(): void {
    if (this.#closed) return;
    if (this.#misconfigured) {
      // Up, but not as configured (a database that does not exist leaves the connection on db 0): keep off it.
      this.setDegraded(true);
      return;
    }
    this.setDegraded(false);
    this.#onRecovered();
  }

  /**
   * `key`: what the failed command wrote, when it is one key. The health check writes beside the last such key (same
   * hash tag, so the same Cluster slot): on a Cluster whose master of that slot is failing over, a check on a fixed key
   * that another master holds passed at once, and the store came back, timed out again and was called flapping, each
   * time, until the failover was over.
   */
  failed(err: unknown, key?: string): void {
    this.#lastError = err;
    if (key !== undefined) this.#failedKey = key;
    if (isReadOnly(err)) this.#readOnly = true;
    // The store degrades all the same (which of its commands touch that key is not known here), but the health check
    // writes a key of its own and passes, so it comes back, meets the key again and flaps, for as long as the key is
    // there: named once, as what it is, not left to read as a Redis outage.
    if (isWrongType(err)) {
      const keys = key === undefined ? undefined : this.#keys.sameTag(key);
      this.#reportOnce(`wrongtype:${keys}`, () => this.#logger?.error({ keys, redisError: safeError(err)?.message }, 'state store: a key of the gateway holds a value of another type: another application writes under state.redis.keyPrefix. Give each its own prefix, or delete the key'));
    }
    const problem = configProblem(err);
    if (problem) {
      this.reportProblem(problem);
      this.#refusedAtMs = this.#now();
    }
    if (isCommandTimeout(err)) {
      // Timers that fire together (within half a timeout of the one counted) are one wait, not several: after an event
      // loop stall every command in flight times out in the same turn, before the replies already in the socket are
      // read. Counted one by one, one stall with three commands out degraded a healthy Redis (QA: both instances of a
      // fleet, as each released its ~1,000 parked requests after a brownout).
      const nowMs = performance.now();
      if (nowMs - this.#lastTimeoutMs < this.#commandTimeoutMs / 2) return;
      this.#lastTimeoutMs = nowMs;
      if (++this.#timeoutsInARow < DEGRADE_AFTER_TIMEOUTS) return;
    }
    this.setDegraded(true);
  }

  /**
   * Redis answered: the errors before it are over, so they are forgotten. One timeout is no outage (see
   * DEGRADE_AFTER_TIMEOUTS), and left behind it named a later, unrelated outage: a killed Redis, whose connection
   * closes with no error of its own, was logged as `Command timed out`, which sends an operator after a slow Redis.
   */
  answered(): void {
    this.#timeoutsInARow = 0;
    this.#lastTimeoutMs = Number.NEGATIVE_INFINITY;
    this.#lastError = undefined;
  }

  /** An 'error' event of a connection: a configuration problem is logged and, on the command connection, bars its use. */
  connectionError(err: unknown, commands: boolean): void {
    const problem = configProblem(err);
    if (problem) this.reportProblem(problem);
    if (commands) {
      this.#lastError = err;
      if (problem) this.#misconfigured = problem;
    } else if (!problem) {
      this.#logger?.debug({ error: safeError(err) }, 'state store subscriber connection error');
    }
  }

  /**
   * Logs a configuration problem at error level, once: ioredis reconnects every 2 s at most, and a wrong password
   * would otherwise fill the log (or, as a mere outage warning, hide among them). Never logs the failed command.
   */
  reportProblem(problem: ConfigProblem): void {
    this.#reportOnce(`${problem.kind}:${problem.redisError}`, () => this.#logger?.error({ problem: problem.kind, setting: problem.setting, redisError: problem.redisError }, problem.message));
  }

  #reportOnce(key: string, report: () => void): void {
    if (this.#reported.has(key)) return;
    this.#reported.add(key);
    report();
  }

  setDegraded(degraded: boolean): void {
    if (this.#closed || this.#degraded === degraded) return;
    this.#degraded = degraded;
    if (degraded) {
      this.#cleanProbesNeeded = this.#now() - this.#recoveredAtMs < FLAP_WINDOW_MS ? Math.min(MAX_CLEAN_PROBES, this.#cleanProbesNeeded * 2) : 1;
      this.#cleanProbes = 0;
      this.#degradedAtMs = this.#now();
      this.#logger?.warn({ redis: this.#address, error: safeError(this.#lastError), ...(this.#cleanProbesNeeded > 1 && { flapping: true }) }, 'state store degraded: using local state');
      // ioredis reconnects a dropped connection and emits 'ready'; a live but slow one needs a probe to come back.
      this.#probeTimer = setInterval(() => this.#probe(), PROBE_INTERVAL_MS).unref();
    } else {
      this.#timeoutsInARow = 0;
      this.#probeTimeoutsInARow = 0;
      this.#lastError = undefined;
      this.#failedKey = undefined;
      this.#readOnly = false;
      this.#recoveredAtMs = this.#now();
      this.#logger?.info({ redis: this.#address, degradedMs: this.#recoveredAtMs - this.#degradedAtMs }, 'state store recovered: using Redis');
      clearInterval(this.#probeTimer);
      this.#probeTimer = undefined;
    }
    for (const listener of this.#degradedListeners) listener(degraded);
  }

  #probe(): void {
    // A connection Redis refused the configuration on (a db it does not have left it on db 0) is not written to.
    if (this.#client.status !== 'ready' || this.#misconfigured) return;
    if (this.#refusedAtMs !== undefined && this.#now() - this.#refusedAtMs < CONFIG_RETRY_MS) return;
    // A keyed write, not PING: a Redis Cluster whose slots are down answers PING from every live node, and a Redis
    // that refuses writes (OOM under noeviction) answers reads; either way the store's next write would fail again.
    this.#client.sgProbe(this.#keys.probe(this.#failedKey), PROBE_TTL_MS).then(
      () => {
        if (++this.#cleanProbes >= this.#cleanProbesNeeded) this.#onReady();
      },
      (err: unknown) => {
        this.#cleanProbes = 0;
        this.#lastError = err;
        // ioredis reconnects for it (at most once a second), and the new connection is checked at its 'ready'.
        if (isReadOnly(err)) this.#readOnly = true;
        // Probes that time out in a row on a live connection: Redis is stopped or very slow, or the connection lost
        // traffic for good (a middlebox dropped it: toxiproxy's timeout toxic, a firewall that forgot the connection, a
        // replaced pod's old address). Answers are matched to commands in order, so after a lost one every answer on
        // this connection goes to the command before it, and no probe on it ever passes: a new connection is the way
        // back. On a stopped Redis the new one waits like the old one did.
        if (isCommandTimeout(err) && ++this.#probeTimeoutsInARow >= RECONNECT_AFTER_PROBE_TIMEOUTS) {
          this.#probeTimeoutsInARow = 0;
          this.#logger?.debug('state store: Redis has not answered on this connection for a while; reconnecting');
          this.#client.disconnect(true);
        }
      },
    );
  }
}
