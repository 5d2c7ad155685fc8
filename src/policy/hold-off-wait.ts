// How a retry's wait and the wait a client is told meet a hold-off on the target (the fleet's pause after a provider's
// wait hint): pure arithmetic on times, kept apart from the attempt loop that applies it.
import type { ParkConfig } from '../config/schema.ts';
import type { Random } from './random.ts';
import type { WaitHint } from './wait-hint.ts';

/** Margin past a hold-off's end for a wait that is to outlast it: a timer may fire a millisecond early. */
export const HOLD_OFF_SLACK_MS = 2;

/**
 * A hint at least this long, in an answer that starts a hold-off, sends its request on to the next target rather than
 * wait: a pause, not a backoff (Azure's retry-after-ms of 150 ms is waited out on the target the route prefers).
 */
const MOVE_ON_AFTER_MS = 1_000;

/**
 * A wait to tell the client, lengthened to the end of a hold-off that would turn it away when it came back, with a
 * spread of its own past that end (toldPastHoldOff).
 */
export function pastHoldOff(retryAfterMs: number | undefined, holdOffUntil: number | undefined, nowMs: number, random: Random): number | undefined {
  if (retryAfterMs === undefined || holdOffUntil === undefined || holdOffUntil - nowMs < retryAfterMs) return retryAfterMs;
  return toldPastHoldOff(holdOffUntil - nowMs, random);
}

/** The longest wait the SDKs are invited back for (x-should-retry): a spread never takes a wait past it. */
const LONGEST_INVITED_MS = 60_000;

/**
 * The wait told to a client that a hold-off turns away (or that started it), `heldForMs` to its end: that end plus a
 * spread of its own, as the gateway's own retries get (waitPastHoldOff). The SDKs wait exactly what they are told:
 * told the end alone, every agent the hold-off turned away came back at its last millisecond, all at once. Only a
 * wait the SDKs are invited back for (at most a minute), and never past that minute; a longer one is the provider's
 * word, told as it is.
 */
export function toldPastHoldOff(heldForMs: number, random: Random): number {
  if (heldForMs > LONGEST_INVITED_MS) return heldForMs;
  return Math.min(waitPastHoldOff(0, heldForMs, random), LONGEST_INVITED_MS);
}

/**
 * The end of the hold-off the request's own answer started, when it leaves the target for the next one meanwhile: a
 * pause (a hint of MOVE_ON_AFTER_MS or more), as every newcomer leaves it. Should no other target answer, it comes back
 * for this one: parked, or, with parking off or a hold-off longer than park.maxWaitMs, waiting the rest out itself
 * (serve-targets.ts).
 */
export function leavesUntil(hint: WaitHint | undefined, ownHoldOff: number | undefined): number | undefined {
  if (ownHoldOff === undefined || hint === undefined || hint.delayMs < MOVE_ON_AFTER_MS) return undefined;
  return ownHoldOff;
}

/**
 * Whether a request that left a target for the hold-off its own answer started waits the rest of it out itself when no
 * other target answered, rather than in the parking lot: with parking off, or a hold-off longer than what is left of
 * park.maxWaitMs. It waited there before it left; moving on must not cost it the answer the wait gets.
 */
export function waitsOutOwnHoldOff(park: ParkConfig | false, heldForMs: number, parkedMs: number): boolean {
  return park === false || (park.maxWaitMs !== undefined && heldForMs > park.maxWaitMs - parkedMs);
}

/**
 * The retry's wait when the fleet's hold-off on the target may outlast it: its own, or the hold-off's end plus a
 * jitter of its own (up to a fifth of the hold-off, at most a second), so requests that were all held do not all come
 * back at the hold-off's last millisecond.
 */
export function waitPastHoldOff(ownMs: number, heldForMs: number, random: Random): number {
  if (heldForMs <= ownMs) return ownMs;
  return heldForMs + random() * Math.min(1_000, 0.2 * heldForMs);
}
