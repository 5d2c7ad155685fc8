// Where a target stands, as the parking lot sees it: hold-offs and the breaker say whether parked requests may go, the
// pool's adaptive limit how many at a time. Apart from the lot, which takes it as `stateOf` so that its tests can
// script any state, and out of state/, whose stores know nothing of the lot: this composes them for it.
import { availability, type BreakerSettings } from '../policy/breaker.ts';
import type { BreakerBoard } from '../state/breaker-board.ts';
import { targetOfHoldOffKey, type HoldOffs } from '../state/hold-offs.ts';
import type { TargetState } from './parking-lot.ts';

interface TargetStateDeps {
  holdOffs: HoldOffs;
  board: BreakerBoard;
  /** The target key's breaker settings; undefined when its provider has the breaker off. */
  breakerSettings: (target: string) => BreakerSettings | undefined;
  /** The target's adaptive limit in its provider's pool. */
  limitOf: (target: string) => number;
  now: () => number;
}

/**
 * The parking lot's `stateOf`: the parking lot asks where a target stands; breakers and hold-offs answer. It asks by
 * the key its requests parked under (TargetPlan.holdOffKey): a flex tier's key stands where its target does, but for
 * the tier's own hold-off.
 */
export function targetStateOf({ holdOffs, board, breakerSettings, limitOf, now }: TargetStateDeps): (key: string) => TargetState {
  return (key) => {
    const target = targetOfHoldOffKey(key);
    // Nothing waits for a credential hold: requests parked for another reason go, and skip the target at once.
    if (holdOffs.credentialsHeldUntil(target) !== undefined) return { mode: 'available', slots: Number.MAX_SAFE_INTEGER };
    const held = holdOffs.until(key);
    if (held !== undefined) return { mode: 'blocked', availableAtMs: held };
    const available: TargetState = { mode: 'available', slots: Math.max(1, Math.floor(limitOf(target))) };
    const s = breakerSettings(target);
    if (!s) return available;
    const a = availability(board.current(target), s, now(), true);
    if (a.kind === 'closed') return available;
    if (a.kind === 'probing') return { mode: 'probing', slots: a.probes };
    return { mode: 'blocked', availableAtMs: a.probeAtMs };
  };
}
