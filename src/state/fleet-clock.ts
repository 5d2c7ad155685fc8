// The fleet's clock is Redis's. The instances' wall clocks disagree (NTP skew of seconds; a VM resumed from suspend is
// minutes off until NTP catches up), and every time an instance writes to Redis is read by the others against their
// own clocks: a breaker's openUntilMs, a hold-off's end, the second a budget or outcome count falls in, a probe
// permit's expiry, when an instance last told its demand. Read against a clock 30 s off, an instance ahead wiped the
// fleet's budget counts and outcome windows (older than its window) and took the probe permits of the others
// (expired, by its clock), and its hold-offs and breakers held the fleet off 30 s longer; one behind had its counts
// wiped by the others, its hold-offs ignored and its breakers probed at once. So each Redis store measures how far its
// clock is from Redis's, writes times in Redis's and reads them back in its own. Pure: the store does the asking.

/**
 * Skew under this is not corrected, nor is a change of the skew under it: a measurement is only as good as half its
 * round trip, and a store whose clock agrees with Redis's (the same machine's, NTP's) keeps times to the millisecond.
 */
const CLOCK_TOLERANCE_MS = 500;

export class FleetClock {
  /** This instance's clock minus Redis's, in ms (within CLOCK_TOLERANCE_MS of it); 0 where the two agreed that closely when it last changed. */
  #skewMs = 0;

  get skewMs(): number {
    return this.#skewMs;
  }

  /** Is a reading whose round trip took this long good enough to use? (Half of it is the reading's error.) */
  static usable(beforeMs: number, afterMs: number): boolean {
    const roundTripMs = afterMs - beforeMs;
    return roundTripMs >= 0 && roundTripMs < 2 * CLOCK_TOLERANCE_MS;
  }

  /**
   * One reading: this instance's clock just before Redis was asked and just after it answered, and Redis's time in
   * the answer. Returns whether the skew in use changed. A reading that is not usable changes nothing.
   */
  observe(beforeMs: number, redisMs: number, afterMs: number): boolean {
    if (!Number.isFinite(redisMs) || !FleetClock.usable(beforeMs, afterMs)) return false;
    const measured = Math.round((beforeMs + afterMs) / 2 - redisMs);
    // Judged by the measured skew, not the rounded one: a clock about the tolerance off would flip between 0 and it.
    if (Math.abs(measured - this.#skewMs) < CLOCK_TOLERANCE_MS) return false;
    this.#skewMs = Math.abs(measured) < CLOCK_TOLERANCE_MS ? 0 : measured;
    return true;
  }

  /** A time of this instance's clock, as Redis's clock has it. 0 stays 0 (a record's "not set"). */
  toFleet(localMs: number): number {
    return localMs === 0 ? 0 : localMs - this.#skewMs;
  }

  /** A time of Redis's clock (another instance's write), as this instance's clock has it. 0 stays 0. */
  toLocal(fleetMs: number): number {
    return fleetMs === 0 ? 0 : fleetMs + this.#skewMs;
  }
}

/** Redis's time from the `server` section of INFO (server_time_usec), in ms; undefined when it has none. */
export function redisTimeMs(infoServer: string): number | undefined {
  const match = /^server_time_usec:(\d+)\r?$/m.exec(infoServer);
  return match ? Number(match[1]) / 1000 : undefined;
}
