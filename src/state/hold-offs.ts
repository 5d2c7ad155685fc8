// Fleet-wide hold-offs: when a provider says "come back in N seconds" (retry-after, retry-after-ms on a 429, 503, 529
// or Groq's 498 capacity_exceeded), no instance sends that target new attempts until then. x-ratelimit-reset-* hints never start one: a token
// bucket refills continuously, and one large prompt must not stop a fleet for minutes.
// Credential holds (the provider refused the gateway's own key or billing) are a second kind, kept under their own
// state key: a hold-off ends by itself and is worth waiting for (park, retry-after), a refused key is not (someone has
// to fix the configuration), so requests skip a credential-held target at once instead of waiting for it.
import type { WaitHint } from '../policy/wait-hint.ts';
import type { Random } from '../policy/random.ts';
import type { StateStore } from './store.ts';

/**
 * 498: Groq's flex tier at capacity (`capacity_exceeded`), the provider overloaded as a 503 or 529 says it; without a
 * hold-off, every request in the window it named went to it again. Only the outcome table's rows with `holdOff` get
 * here (pipeline/record-outcome.ts), so a 498 that means anything else (a client-error) starts none.
 */
const HOLD_OFF_STATUSES = new Set([429, 498, 503, 529]);
/** Spread added to a hold-off's end so a fleet told the same time does not come back at the same millisecond. */
const MAX_SPREAD_MS = 1_000;
/** Suffix of a credential hold's state key: shared through the store like a hold-off, never read as one. */
const CREDENTIALS_SUFFIX = '#credentials';
/**
 * A hint over MAX_HOLD_OFF_MS starts a hold-off capped at that, and leaves two side keys, shared through the store
 * like a hold-off and never read as one: `#asked`, the end the provider asked for, and `#long`, the end of the
 * hold-off it started. The asked end counts only while the hold-off in force is that one (`#long` equals it): a later,
 * shorter hint that extended it is the provider's newer word.
 */
const ASKED_SUFFIX = '#asked';
const LONG_SUFFIX = '#long';

/** Is this state key a credential hold (not a target's own key)? For listeners of the store's changes. */
export function isCredentialHoldKey(key: string): boolean {
  return key.endsWith(CREDENTIALS_SUFFIX);
}

/** Is this state key one a long hint leaves beside its hold-off (not a target's own key)? For listeners of changes. */
export function isLongHintKey(key: string): boolean {
  return key.endsWith(ASKED_SUFFIX) || key.endsWith(LONG_SUFFIX);
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

/**
 * A hold-off or credential hold this instance started while none was in force (one extended is no news): the operator's
 * one line about it. `reason` is the attempt's (status_429, status_401, ...), `hintMs` the wait the provider asked for.
 */
export interface HoldStart {
  kind: 'hold-off' | 'credentials';
  target: string;
  untilMs: number;
  reason: string;
  status?: number;
  hintMs?: number;
}

export class HoldOffs {
  constructor(
    private readonly store: StateStore,
    private readonly now: () => number,
    private readonly random: Random,
    private readonly onStart?: (start: HoldStart) => void,
  ) {}

  /** When the target's hold-off ends, if it is still in force. */
  until(target: string): number | undefined {
    const until = this.store.getHoldOff(target);
    return until !== undefined && until > this.now() ? until : undefined;
  }

  /** Keeps requests off the target for a fixed time: the provider refused the gateway's own credentials or billing. */
  holdCredentials(target: string, ms: number, cause: { reason: string; status?: number } = { reason: 'credentials' }): void {
    const fresh = this.credentialsHeldUntil(target) === undefined;
    const untilMs = Math.ceil(this.now() + ms);
    void this.store.setHoldOff(target + CREDENTIALS_SUFFIX, untilMs);
    if (fresh) this.onStart?.({ kind: 'credentials', target, untilMs, ...cause });
  }

  /**
   * When a held-off request may come back, as the provider asked: the hold-off's end, or the later end a hint over
   * MAX_HOLD_OFF_MS asked for (the hold-off was capped, and the one request that asks again then is likely told the
   * same). Undefined when no hold-off is in force. Of two long hints, the longer ask counts until a short one replaces
   * them: both say "more than a minute".
   */
  askedUntil(target: string): number | undefined {
    const until = this.until(target);
    if (until === undefined || this.store.getHoldOff(target + LONG_SUFFIX) !== until) return until;
    return Math.max(until, this.store.getHoldOff(target + ASKED_SUFFIX) ?? 0);
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
    // Asked on every request: no promise or array once all are in. The store reads them in one batch.
    const holdOff = this.store.firstRead?.(target);
    const credentials = this.store.firstRead?.(target + CREDENTIALS_SUFFIX);
    const asked = this.store.firstRead?.(target + ASKED_SUFFIX);
    const long = this.store.firstRead?.(target + LONG_SUFFIX);
    if (holdOff === undefined && credentials === undefined && asked === undefined && long === undefined) return undefined;
    return Promise.all([holdOff, credentials, asked, long]).then(() => undefined);
  }

  /**
   * Drops what the store keeps for a target key given back (see StateStore.forget), its credential hold's key too:
   * every request looks that key up, and the Redis store watches (and re-reads at each reconnect) whatever it was
   * asked about, so each made-up model name would otherwise stay behind in it for good.
   */
  forget(target: string): void {
    this.store.forget(target);
    this.store.forget(target + CREDENTIALS_SUFFIX);
    this.store.forget(target + ASKED_SUFFIX);
    this.store.forget(target + LONG_SUFFIX);
  }

  /**
   * Starts (or extends) the target's hold-off; returns when it ends. A hint within MAX_HOLD_OFF_MS ends within it,
   * spread included: a held-off request is invited back (x-should-retry) only for a wait of at most 60 s, and a spread
   * that pushed a 60 s hint to 61 s took that from it. A longer hint is capped at MAX_HOLD_OFF_MS plus the spread, and
   * its own end is kept (askedUntil), so every request held off meanwhile is told what the first one was.
   */
  start(target: string, hint: WaitHint, cause: { reason: string; status?: number } = { reason: 'wait_hint' }): number {
    const now = this.now();
    // Only a hold-off that starts is news to the operator: each answer of a 429 storm extends the one in force.
    const fresh = this.until(target) === undefined;
    const spread = this.random() * Math.min(MAX_SPREAD_MS, Math.min(hint.delayMs, MAX_HOLD_OFF_MS) * 0.1);
    let untilMs: number;
    if (hint.delayMs <= MAX_HOLD_OFF_MS) {
      untilMs = Math.ceil(now + Math.min(hint.delayMs + spread, MAX_HOLD_OFF_MS));
      void this.store.setHoldOff(target, untilMs);
    } else {
      untilMs = Math.ceil(now + MAX_HOLD_OFF_MS + spread);
      // Side keys first: a request that sees the hold-off must not miss what it was asked for.
      void this.store.setHoldOff(target + ASKED_SUFFIX, Math.ceil(now + hint.delayMs));
      void this.store.setHoldOff(target + LONG_SUFFIX, untilMs);
      void this.store.setHoldOff(target, untilMs);
    }
    if (fresh) this.onStart?.({ kind: 'hold-off', target, untilMs, hintMs: hint.delayMs, ...cause });
    return untilMs;
  }
}
