// Reads Redis's clock for the store, at every new connection and on a timer: the I/O beside fleet-clock.ts's pure
// arithmetic, apart from the commands that only convert times with it.
import type { Logger } from 'pino';
import { FleetClock, redisTimeMs } from './fleet-clock.ts';
import { safeError } from './redis-errors.ts';
import type { RedisHealth } from './redis-health.ts';
import type { ScriptClient } from './redis-scripts.ts';

/**
 * How often Redis's clock is read again: a VM resumed from suspend, or a clock NTP stepped, moves this instance's
 * clock against the fleet's at once, and the shared state would be read that far off until the next reading.
 */
const CLOCK_READ_MS = 10_000;
/** Readings of Redis's clock taken at most, one after another, for one whose round trip is short enough to use. */
const CLOCK_READINGS = 3;

interface RedisClockReaderDeps {
  client: ScriptClient;
  /** Where the readings go: the store converts every time it sends or reads with it. */
  clock: FleetClock;
  health: RedisHealth;
  logger: Logger | undefined;
  now: () => number;
  /** How often Redis's clock is read again, in ms. Default: CLOCK_READ_MS. */
  clockReadMs: number | undefined;
  /** This instance's clock stepped against Redis's by skewDeltaMs since the last reading. */
  onStep: (skewDeltaMs: number) => void;
  /** The first reading found this instance's clock skewMs off Redis's (what was stamped before took them to agree). */
  onFirstReading?: (skewMs: number) => void;
}

export class RedisClockReader {
  readonly #deps: RedisClockReaderDeps;
  /** Redis's clock has been read once (or could not be: then the clocks are taken to agree, as before there was a reading). */
  #read = false;
  readonly #timer: NodeJS.Timeout;

  constructor(deps: RedisClockReaderDeps) {
    this.#deps = deps;
    this.#timer = setInterval(() => void (deps.health.usable() && this.read()), deps.clockReadMs ?? CLOCK_READ_MS).unref();
  }

  get done(): boolean {
    return this.#read;
  }

  close(): void {
    clearInterval(this.#timer);
  }

  /**
   * Reads Redis's clock (INFO's server_time_usec: the README's ACL allows INFO, not TIME) and, where this instance's is
   * off by more than the tolerance, from then on writes and reads times in Redis's. Never throws: unread, the clocks
   * are taken to agree.
   */
  async read(): Promise<void> {
    const { client, clock, logger, now } = this.#deps;
    try {
      // A reading is as good as half its round trip: one slowed by a busy event loop is taken again, a few times.
      let beforeMs = 0;
      let afterMs = Number.POSITIVE_INFINITY;
      let redisMs: number | undefined;
      for (let i = 0; i < CLOCK_READINGS && !FleetClock.usable(beforeMs, afterMs); i++) {
        beforeMs = now();
        const info = await client.info('server');
        afterMs = now();
        redisMs = redisTimeMs(info);
        if (redisMs === undefined) throw new Error('INFO server has no server_time_usec');
      }
      const skewBeforeMs = clock.skewMs;
      if (clock.observe(beforeMs, redisMs!, afterMs)) {
        if (clock.skewMs === 0) logger?.info("this instance's clock agrees with Redis's again");
        else logger?.warn({ skewMs: clock.skewMs }, "this instance's clock is off Redis's: shared times are kept in Redis's");
        // Stepped since the last reading: what this instance holds moves with its clock, then is read again.
        if (this.#read) this.#deps.onStep(clock.skewMs - skewBeforeMs);
        else this.#deps.onFirstReading?.(clock.skewMs);
      }
    } catch (err) {
      if (!this.#read) logger?.warn({ error: safeError(err) }, "state store could not read Redis's clock: instance clocks are taken to agree");
    }
    this.#read = true;
  }
}
