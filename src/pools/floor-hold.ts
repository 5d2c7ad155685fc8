// An instance the fleet left no slot of its own (the others' demand fills maxConcurrent, and its share rounds to none)
// still has one: setShare never goes below a slot, so an instance is never shut out while Redis is away. That slot is
// beyond what the provider takes, though: an idle instance's first online calls there met the provider's 429 while
// another instance's batch flood held all of it (test/fleet-online-first.test.ts: 2 to 10 of B's attempts refused,
// and B's adaptive limit cut to 1-3 for what A's batch did). So a newcomer above the lowest class waits for that slot
// until the fleet has made room: its demand is exchanged at once, and once an exchange backs a share, the others shrink
// at their next exchange (within one refresh) and their batch beyond it ends. The lowest class starts no hold: the
// floor slot is what keeps it from starving, and the fleet would rarely back its share anyway (batch is split by
// demand); but while a hold is in force it waits too, or it would take the floor slot the held request waits for.
// Pure: the pool owns the timer and the clock.
import { REFRESH_MS } from './fleet-share.ts';

/**
 * After the exchange that backs a share: every other instance exchanges within a refresh, and half of one more for
 * the attempts they hold beyond their new share to be answered.
 */
export const FLOOR_SETTLE_MS = REFRESH_MS * 1.5;
/**
 * The longest a hold lasts whatever the fleet says (Redis away, a slow exchange, a class the fleet never backs): then
 * the floor slot is used as it always was. Enough for an exchange and the settle after it.
 */
export const FLOOR_HOLD_MAX_MS = REFRESH_MS * 2;

/**
 * Did the fleet's exchange leave this instance only the floor slot? Its share of `capacity` rounds to no slot while the
 * rest of the fleet's demand covers all of it. (With room left, the floor slot is real room and nobody need wait.)
 */
export function onlyTheFloor(capacity: number, share: number, othersDemand: number): boolean {
  return sharedSlots(capacity, share) < 1 && othersDemand >= capacity;
}

/** The slots a share of `capacity` gives, before the pool's floor of one. */
export function sharedSlots(capacity: number, share: number): number {
  return Math.round(capacity * share);
}

/**
 * When higher classes may take the floor slot: hold states from one exchange to the next. `armed`: the last exchange
 * left only the floor, and the next newcomer above the lowest class starts a hold. A hold ends a settle after the last
 * exchange that gave this instance more slots (the others heard of that demand at theirs, within a refresh; going at
 * the settle of the first one sent the slots a later one gave into attempts the others still held: 2 of B's 10 online
 * calls met a 429 first), or at its cap, whichever is first. One hold per exchange that says "only the floor", so
 * while Redis is away (no exchange answers) at most one newcomer's hold starts, and it lasts up to the cap.
 */
export class FloorHold {
  #armed = false;
  #untilMs = 0;
  #capMs = 0;
  /** Slots the exchanges of the hold in force gave so far. */
  #slots = 0;

  constructor(private readonly now: () => number) {}

  /** An exchange answered: `slots` of this instance's own (sharedSlots), `floorOnly` as onlyTheFloor judged it. */
  exchanged(floorOnly: boolean, slots: number): void {
    const now = this.now();
    if (this.#untilMs > now) {
      if (!floorOnly && slots > this.#slots) {
        this.#slots = slots;
        this.#untilMs = Math.min(this.#capMs, now + FLOOR_SETTLE_MS);
      }
      return;
    }
    this.#armed = floorOnly;
  }

  /** A newcomer above the lowest class arrives: true when it starts a hold (the pool then asks for an exchange now). */
  arrive(): boolean {
    if (!this.#armed) return false;
    this.#armed = false;
    this.#slots = 0;
    this.#capMs = this.#untilMs = this.now() + FLOOR_HOLD_MAX_MS;
    return true;
  }

  /** The fleet would give no held class a slot of its own: waiting longer only delays them. */
  end(): void {
    this.#untilMs = Math.min(this.#untilMs, this.now());
  }

  /** Higher classes wait until then (0 or past: they do not). */
  get untilMs(): number {
    return this.#untilMs;
  }

  holds(): boolean {
    return this.#untilMs > this.now();
  }
}
