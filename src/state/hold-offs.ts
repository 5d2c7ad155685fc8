// Fleet-wide hold-offs: when a provider says "come back in N seconds" (retry-after, retry-after-ms on a 429, 503 or
// 529), no instance sends that target new attempts until then. x-ratelimit-reset-* hints never start one: a token
// bucket refills continuously, and one large prompt must not stop a fleet for minutes.
// Credential holds (the provider refused the gateway's own key or billing) are a second kind, kept under their own
// state key: a hold-off ends by itself and is worth waiting for (park, retry-after), a refused key is not (someone has
// to fix the configuration), so requests skip a credential-held target at once instead of waiting for it.
import type { WaitHint } from '../policy/wait-hint.ts';
import type { Random } from '../policy/random.ts';
import type { StateStore } from './store.ts';

const HOLD_OFF_STATUSES = new Set([429, 503, 529]);
/** Spread added to a hold-off's end so a fleet told the same time does not come back at the same millisecond. */
const MAX_SPREAD_MS = 1_000;
/** Suffix of a credential hold's state key: shared through the store like a hold-off, never read as one. */
const CREDENTIALS_SUFFIX = '#credentials';

/** Is this state key a credential hold (not a target's own key)? For listeners of the store's changes. */
export function isCredentialHoldKey(key: string): boolean {
  return key.endsWith(CREDENTIALS_SUFFIX);
}

/** The target a credential hold's state key is about. */
export function targetOfCredentialHold(key: string): string {
  return key.slice(0, -CREDENTIALS_SUFFIX.length);
}

/**
 * The longest hold-off one answer starts. A provider that asks for more (retry-after: 120) is asked again by one
 * request when it ends; a hint that is wrong by hours cannot take a target out for hours.
 */
export const MAX_HOLD_OFF_MS = 60_000;

/**
 * Does this answer start a fleet-wide hold-off? A fleet-wide hint of any length: one longer than the route waits
 * (maxWaitHintMs) is not retried, and the more reason for every other request to stay away meanwhile.
 */
export function startsHoldOff(status: number, hint: WaitHint | undefined): hint is WaitHint {
  return HOLD_OFF_STATUSES.has(status) && hint !== undefined && hint.fleetWide && hint.delayMs > 0;
}

export class HoldOffs {
  constructor(
    private readonly store: StateStore,
    private readonly now: () => number,
    private readonly random: Random,
  ) {}

  /** When the target's hold-off ends, if it is still in force. */
  until(target: string): number | undefined {
    const until = this.store.getHoldOff(target);
    return until !== undefined && until > this.now() ? until : undefined;
  }

  /** Keeps requests off the target for a fixed time: the provider refused the gateway's own credentials or billing. */
  holdCredentials(target: string, ms: number): void {
    void this.store.setHoldOff(target + CREDENTIALS_SUFFIX, Math.ceil(this.now() + ms));
  }

  /** When the target's credential hold ends, if it is still in force. */
  credentialsHeldUntil(target: string): number | undefined {
    const until = this.store.getHoldOff(target + CREDENTIALS_SUFFIX);
    return until !== undefined && until > this.now() ? until : undefined;
  }

  /**
   * While the fleet's state of a target this instance has not looked at yet is being read (its first sight): resolves
   * once it is in. The store's read of the target key brings its breaker record and hold-off, that of the credential
   * key its credential hold. A store keeps only what it was asked about, so an instance that never sent to the target
   * has not heard of what another one started; its first request must not go into it.
   */
  firstRead(target: string): Promise<void> | undefined {
    // Asked on every request: no promise or array once both are in.
    const holdOff = this.store.firstRead?.(target);
    const credentials = this.store.firstRead?.(target + CREDENTIALS_SUFFIX);
    if (holdOff === undefined) return credentials;
    return credentials === undefined ? holdOff : Promise.all([holdOff, credentials]).then(() => undefined);
  }

  /**
   * Drops what the store keeps for a target key given back (see StateStore.forget), its credential hold's key too:
   * every request looks that key up, and the Redis store watches (and re-reads at each reconnect) whatever it was
   * asked about, so each made-up model name would otherwise stay behind in it for good.
   */
  forget(target: string): void {
    this.store.forget(target);
    this.store.forget(target + CREDENTIALS_SUFFIX);
  }

  /** Starts (or extends) the target's hold-off; returns when it ends. */
  start(target: string, hint: WaitHint): number {
    const delayMs = Math.min(hint.delayMs, MAX_HOLD_OFF_MS);
    const spread = this.random() * Math.min(MAX_SPREAD_MS, delayMs * 0.1);
    const untilMs = Math.ceil(this.now() + delayMs + spread);
    void this.store.setHoldOff(target, untilMs);
    return untilMs;
  }
}
