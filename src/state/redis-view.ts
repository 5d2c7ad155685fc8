// This instance's view of the fleet's breaker records and hold-offs: what getBreaker/getHoldOff answer synchronously
// on the request path. The Redis store feeds it from its own writes, pub/sub messages and re-reads, and it fires
// onChange exactly once for each change it takes in, whichever of those brought it.
import type { BreakerRecord, StateChange } from './store.ts';

export class FleetView {
  readonly #breakers = new Map<string, BreakerRecord>();
  readonly #holdOffs = new Map<string, number>();
  readonly #listeners = new Set<(change: StateChange) => void>();
  readonly #onListenerError: (err: unknown) => void;

  constructor(onListenerError: (err: unknown) => void) {
    this.#onListenerError = onListenerError;
  }

  breaker(target: string): BreakerRecord | undefined {
    return this.#breakers.get(target);
  }

  holdOff(target: string): number | undefined {
    return this.#holdOffs.get(target);
  }

  /**
   * Takes in a breaker record. A message or our own write only moves forward (every transition bumps the generation,
   * and a late message must not undo a newer one); what Redis answered to a read is the truth as it stands, even when
   * it is older (Redis lost data, or we changed things alone while degraded).
   */
  putBreaker(target: string, record: BreakerRecord, authoritative: boolean): void {
    const current = this.#breakers.get(target);
    if (current && (authoritative ? sameBreaker(current, record) : current.generation >= record.generation)) return;
    this.#breakers.set(target, record);
    this.#emit({ kind: 'breaker', target, record });
  }

  /** Compare-and-set on the view alone: the degraded stand-in for the Redis script, with the same rule. */
  casBreaker(target: string, expectedGeneration: number, next: BreakerRecord): boolean {
    if ((this.#breakers.get(target)?.generation ?? 0) !== expectedGeneration) return false;
    this.#breakers.set(target, next);
    this.#emit({ kind: 'breaker', target, record: next });
    return true;
  }

  /**
   * Moves every time held by deltaMs (0 stays 0: not set), and fires onChange for each: this instance's clock was
   * stepped against Redis's (a VM resumed, NTP), so what it holds is that far off its clock now. A re-read would not
   * mend it alone: hold-offs only extend, and one held too long would be written back to Redis for the fleet.
   * A hold-off already over by `nowMs` moves without a word: announced, it read as one that had just ended, and the
   * target's adaptive limit restarted at half again (runtime.ts) for a hold-off over long ago.
   */
  rebase(deltaMs: number, nowMs: number): void {
    if (deltaMs === 0) return;
    const move = (ms: number) => (ms === 0 ? 0 : ms + deltaMs);
    for (const [target, r] of this.#breakers) {
      const record = withTimes(r, move);
      this.#breakers.set(target, record);
      this.#emit({ kind: 'breaker', target, record });
    }
    for (const [target, untilMs] of this.#holdOffs) {
      this.#holdOffs.set(target, move(untilMs));
      if (move(untilMs) > nowMs) this.#emit({ kind: 'hold-off', target, untilMs: move(untilMs) });
    }
  }

  forget(target: string): void {
    this.#breakers.delete(target);
    this.#holdOffs.delete(target);
  }

  /**
   * Extends the hold-off (never shortens it) and fires onChange if it moved, and is still in force at `nowMs`. One over
   * already (Redis keeps a hold-off's key a minute past its end, for a late reader) is kept without a word, as rebase
   * does: announced, it read as one that had just ended, and the target's adaptive limit restarted at half (runtime.ts)
   * on every instance that first looked the target up, or came back to Redis, within a minute of a hold-off it never saw.
   */
  putHoldOff(target: string, untilMs: number, nowMs = Number.NEGATIVE_INFINITY): void {
    if ((this.#holdOffs.get(target) ?? 0) >= untilMs) return;
    this.#holdOffs.set(target, untilMs);
    if (untilMs > nowMs) this.#emit({ kind: 'hold-off', target, untilMs });
  }

  onChange(listener: (change: StateChange) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  clearListeners(): void {
    this.#listeners.clear();
  }

  #emit(change: StateChange): void {
    // A throwing listener must not break the store's message handling or the other listeners.
    for (const listener of this.#listeners) {
      try {
        listener(change);
      } catch (err) {
        this.#onListenerError(err);
      }
    }
  }
}

function sameBreaker(a: BreakerRecord, b: BreakerRecord): boolean {
  return a.generation === b.generation && a.state === b.state && a.sinceMs === b.sinceMs
    && a.openUntilMs === b.openUntilMs && a.probeSuccesses === b.probeSuccesses && (a.failedProbes ?? 0) === (b.failedProbes ?? 0)
    && (a.probeFailures ?? 0) === (b.probeFailures ?? 0);
}

/** A breaker record with its times (sinceMs, openUntilMs) mapped: to or from Redis's clock, or moved with this one's. */
export function withTimes(record: BreakerRecord, map: (ms: number) => number): BreakerRecord {
  return { ...record, sinceMs: map(record.sinceMs), openUntilMs: map(record.openUntilMs) };
}
