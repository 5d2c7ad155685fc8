// Fleet-wide hold-offs: when a provider says "come back in N seconds" (retry-after, retry-after-ms on a 429, 503, 529
// or Groq's 498 capacity_exceeded), no instance sends that target new attempts until then. x-ratelimit-reset-* hints never start one: a token
// bucket refills continuously, and one large prompt must not stop a fleet for minutes.
// A 498 holds off the target's flex service tier only, under a key of its own (flexTierKey): the requests that ask for
// that tier read it as well as the target's, the others never do, so a full flex tier (batch jobs) holds no online
// request on the default tier off the target.
// Credential holds (the provider refused the gateway's own key or billing) are a second kind, kept under their own
// state key: a hold-off ends by itself and is worth waiting for (park, retry-after), a refused key is not (someone has
// to fix the configuration), so requests skip a credential-held target at once instead of waiting for it.
import { ACCOUNT_429_CODES, REGION_REFUSED_CODE } from '../policy/outcome.ts';
import type { WaitHint } from '../policy/wait-hint.ts';
import type { Random } from '../policy/random.ts';
import type { StateStore } from './store.ts';

/**
 * 498: Groq's flex tier at capacity (`capacity_exceeded`); without a hold-off, every flex request in the window it
 * named went to it again. Only the outcome table's rows with `holdOff` get here (pipeline/record-outcome.ts), so a 498
 * that means anything else (a client-error) starts none, and capacity_exceeded's row holds off the flex tier alone.
 */
const FLEX_TIER_STATUS = 498;
const HOLD_OFF_STATUSES = new Set([429, FLEX_TIER_STATUS, 503, 529]);
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

/** Suffix of the key of a target's flex service tier: its hold-offs hold only the requests that ask for that tier. */
const FLEX_SUFFIX = '#flex';
/**
 * A side key, kept beside a credential hold for as long as it (same end): the hold is for a location the provider does
 * not serve (unsupported_country_region_territory), not for the key or the billing. Fleet-wide, so every instance
 * names the right reason to the requests it turns away.
 */
const LOCATION_SUFFIX = '#location';
/** The credential hold's reason a LOCATION_SUFFIX key stands for: the classification's reason for a refused location. */
const LOCATION_REASON = REGION_REFUSED_CODE;

/** The hold-off key of a target's flex service tier (`<target>#flex`), which its requests park under too. */
export function flexTierKey(target: string): string {
  return target + FLEX_SUFFIX;
}

/** Is this a flex tier's hold-off key (not a target's own)? */
export function isFlexTierKey(key: string): boolean {
  return key.endsWith(FLEX_SUFFIX);
}

/** The target a hold-off key is about: the key itself, or the target of a flex tier's key. */
export function targetOfHoldOffKey(key: string): string {
  return isFlexTierKey(key) ? key.slice(0, -FLEX_SUFFIX.length) : key;
}

/** Is this state key a credential hold (not a target's own key)? For listeners of the store's changes. */
export function isCredentialHoldKey(key: string): boolean {
  return key.endsWith(CREDENTIALS_SUFFIX);
}

/**
 * Is this state key one a long hint leaves beside its hold-off, or one that names a credential hold's reason (not a
 * target's own key)? For listeners of changes.
 */
export function isSideKey(key: string): boolean {
  return key.endsWith(ASKED_SUFFIX) || key.endsWith(LONG_SUFFIX) || key.endsWith(LOCATION_SUFFIX);
}

/** The target a credential hold's state key is about. */
export function targetOfCredentialHold(key: string): string {
  return key.slice(0, -CREDENTIALS_SUFFIX.length);
}

/**
 * The longest hold-off one answer starts. A provider that asks for more (retry-after: 120) is asked again by one
 * request when it ends (reask); a hint that is wrong by hours cannot take a target out for hours.
 */
export const MAX_HOLD_OFF_MS = 60_000;

/**
 * How long the request that asks a provider again at the end of a capped hold-off holds the others back: the time a
 * refusal takes to come back, with room. Every request that arrived before the first answer went too, and at high
 * traffic a provider that had asked for an hour (a daily quota) got a burst of them each minute, each one refused.
 */
export const REASK_HOLD_MS = 2_000;

/**
 * Does this answer start a fleet-wide hold-off? A fleet-wide hint of any length: one longer than the route waits
 * (maxWaitHintMs) is not retried, and the more reason for every other request to stay away meanwhile.
 */
export function startsHoldOff(status: number, hint: WaitHint | undefined): hint is WaitHint {
  return HOLD_OFF_STATUSES.has(status) && hint !== undefined && hint.fleetWide && hint.delayMs > 0;
}

/** The reason of a credential hold an account refusal inside a started stream set (record-outcome.ts). */
export const ACCOUNT_REFUSED_IN_STREAM = 'account_refused_in_stream';

/**
 * Every reason a hold can start for (the attempt's classification reason), by kind and tier: a hold-off's is its
 * status (only HOLD_OFF_STATUSES start one, 498 only a flex tier's), a credential hold's the status or the account code
 * the provider refused the gateway's key or billing with. Fixed sets, so bounded as metric labels.
 */
export const HOLD_REASONS = {
  holdOff: [...HOLD_OFF_STATUSES].filter((s) => s !== FLEX_TIER_STATUS).map((s) => `status_${s}`),
  flexTier: [`status_${FLEX_TIER_STATUS}`],
  credentials: ['status_401', 'status_402', 'status_403', REGION_REFUSED_CODE, ...ACCOUNT_429_CODES, ACCOUNT_REFUSED_IN_STREAM],
} as const;

/**
 * A hold-off or credential hold this instance started while none was in force (one extended is no news): the operator's
 * one line about it, and (once the store confirms no instance had started it meanwhile) the count of holds started. `reason` is the attempt's (status_429, status_401, ...), `hintMs` the wait the provider asked for.
 */
export interface HoldStart {
  kind: 'hold-off' | 'credentials';
  target: string;
  /** A hold-off of the target's flex service tier only. */
  tier?: 'flex';
  untilMs: number;
  reason: string;
  status?: number;
  hintMs?: number;
}

/** The later of two ends, either of which may be absent. */
function later(a: number | undefined, b: number | undefined): number | undefined {
  return a === undefined ? b : b === undefined ? a : Math.max(a, b);
}

export class HoldOffs {
  /** Per key, the first claim heard of after the end of its capped hold-off (`long`: that end), for isReaskHold. */
  readonly #claimsHeard = new Map<string, { long: number; untilMs: number }>();

  constructor(
    private readonly store: StateStore,
    private readonly now: () => number,
    private readonly random: Random,
    private readonly onStart?: (start: HoldStart) => void,
    /**
     * A hold this instance started, as onStart, once the store has confirmed that none was in force fleet-wide either:
     * of instances whose answers start the same hold at once (before the news from Redis reaches them), only the
     * first one the store heard is told, so a count of starts summed over the fleet counts each once.
     */
    private readonly onFleetStart?: (start: HoldStart) => void,
  ) {}

  /** Tells both listeners of a hold this instance started, the fleet's once the store's write says it started it. */
  #started(start: HoldStart, write: Promise<boolean>): void {
    this.onStart?.(start);
    const onFleetStart = this.onFleetStart;
    if (onFleetStart) void write.then((started) => started && onFleetStart(start));
  }

  /**
   * When the hold-off of a key ends, if one is in force: a target's own, or for a flex tier's key (flexTierKey) the
   * later of the tier's and its target's, both of which hold that tier's requests.
   */
  until(key: string): number | undefined {
    return isFlexTierKey(key) ? later(this.#until(key), this.#until(targetOfHoldOffKey(key))) : this.#until(key);
  }

  /**
   * When the hold-off of the target's flex tier alone ends, if one is in force: not the target's own, which holds that
   * tier too (until(flexTierKey(target)) has both). For a gauge that shows each hold-off once.
   */
  flexTierUntil(target: string): number | undefined {
    return this.#until(flexTierKey(target));
  }

  /** When the hold under this state key ends, if it is still in force. */
  #until(key: string): number | undefined {
    const until = this.store.getHoldOff(key);
    return until !== undefined && until > this.now() ? until : undefined;
  }

  /** Keeps requests off the target for a fixed time: the provider refused the gateway's own credentials or billing. */
  holdCredentials(target: string, ms: number, cause: { reason: string; status?: number } = { reason: 'credentials' }): void {
    const fresh = this.credentialsHeldUntil(target) === undefined;
    const untilMs = Math.ceil(this.now() + ms);
    // The side key first, as a long hint's: a request that sees the hold must not miss why it is held.
    if (cause.reason === LOCATION_REASON) void this.store.setHoldOff(target + LOCATION_SUFFIX, untilMs);
    const write = this.store.setHoldOff(target + CREDENTIALS_SUFFIX, untilMs, this.now());
    if (fresh) this.#started({ kind: 'credentials', target, untilMs, ...cause }, write);
  }

  /**
   * Why the target's credential hold is in force, where that is told apart: a location the provider does not serve
   * (LOCATION_REASON) while the hold's end is the one that refusal set; undefined otherwise (credentials or billing).
   */
  credentialsHeldFor(target: string): typeof LOCATION_REASON | undefined {
    const until = this.credentialsHeldUntil(target);
    return until !== undefined && this.store.getHoldOff(target + LOCATION_SUFFIX) === until ? LOCATION_REASON : undefined;
  }

  /**
   * When a held-off request may come back, as the provider asked: the hold-off's end, or the later end a hint over
   * MAX_HOLD_OFF_MS asked for (the hold-off was capped, and the one request that asks again then is likely told the
   * same). Undefined when no hold-off is in force. Of two long hints, the longer ask counts until a short one replaces
   * them: both say "more than a minute".
   */
  askedUntil(key: string): number | undefined {
    return isFlexTierKey(key) ? later(this.#askedUntil(key), this.#askedUntil(targetOfHoldOffKey(key))) : this.#askedUntil(key);
  }

  #askedUntil(key: string): number | undefined {
    const until = this.#until(key);
    if (until === undefined || this.store.getHoldOff(key + LONG_SUFFIX) !== until) return until;
    return Math.max(until, this.store.getHoldOff(key + ASKED_SUFFIX) ?? 0);
  }

  /**
   * For a request about to go to a target: undefined when it may (nothing to ask again); else, the end of a hold-off
   * capped short of what the provider asked for (a hint over MAX_HOLD_OFF_MS) has come, the provider's own end has
   * not, and this request is the one to ask again when the promise resolves true: its claim holds the others back for
   * REASK_HOLD_MS (a short hold-off, fleet-wide; of instances claiming at once, only the one the store heard first
   * asks), so they wait for its answer rather than all go into the refusal it is likely to get. False: another one
   * asks, and its hold is in force. A flex tier's key asks for the target's own capped hold-off too.
   */
  reask(key: string): Promise<boolean> | undefined {
    const target = targetOfHoldOffKey(key);
    const due = this.#reaskDue(key) ? key : key !== target && this.#reaskDue(target) ? target : undefined;
    if (due === undefined) return undefined;
    const now = this.now();
    return this.store.setHoldOff(due, Math.ceil(now + REASK_HOLD_MS), now);
  }

  /**
   * Is the hold-off of this key a capped one that has ended, before the end the provider asked for? The stored end,
   * kept after it passed, is still the capped hold-off's (`#long`): once a request asked again, it is that request's
   * short hold's, so the next request after it goes as any other.
   */
  #reaskDue(key: string): boolean {
    const ended = this.store.getHoldOff(key);
    const now = this.now();
    if (ended === undefined || ended > now || this.store.getHoldOff(key + LONG_SUFFIX) !== ended) return false;
    return (this.store.getHoldOff(key + ASKED_SUFFIX) ?? 0) > now;
  }

  /**
   * Is a hold-off of this key that ends at untilMs the short hold of a request asking again (reask), not a pause the
   * provider asked for? For listeners of changes, once per change: the target's adaptive limit restarted at half once
   * at the capped hold-off's end, and the short hold's end halved it again. The first short hold heard of after the
   * capped hold-off's end is the claim (this instance's or a rival's), and so is one ending within REASK_HOLD_MS of it
   * (a rival instance's claim made at the same moment); a later one is the provider's: the side keys stay until the
   * end it asked for (an hour, for a daily quota), and every short hold-off in that hour was taken for a claim.
   */
  isReaskHold(key: string, untilMs: number): boolean {
    const now = this.now();
    const long = this.store.getHoldOff(key + LONG_SUFFIX);
    if (long === undefined || long > now || long === untilMs || untilMs > now + 2 * REASK_HOLD_MS) return false;
    if ((this.store.getHoldOff(key + ASKED_SUFFIX) ?? 0) <= now) return false;
    const claim = this.#claimsHeard.get(key);
    if (claim?.long === long) return untilMs <= claim.untilMs + REASK_HOLD_MS;
    this.#claimsHeard.set(key, { long, untilMs });
    return true;
  }

  /** When the target's credential hold ends, if it is still in force. */
  credentialsHeldUntil(target: string): number | undefined {
    return this.#until(target + CREDENTIALS_SUFFIX);
  }

  /**
   * While the fleet's state of a target this instance has not looked at yet is being read (its first sight): resolves
   * once it is in. The store's read of the target key brings its breaker record and hold-off, that of the credential
   * key its credential hold. A store keeps only what it was asked about, so an instance that never sent to the target
   * has not heard of what another one started; its first request must not go into it.
   */
  firstRead(key: string): Promise<void> | undefined {
    // Asked on every request: no promise or array once all are in. The store reads them in one batch.
    const target = targetOfHoldOffKey(key);
    const holdOff = this.#firstRead(target);
    const credentials = this.store.firstRead?.(target + CREDENTIALS_SUFFIX);
    const location = this.store.firstRead?.(target + LOCATION_SUFFIX);
    // A flex tier's request reads the tier's hold-off too.
    const tier = key === target ? undefined : this.#firstRead(key);
    if (holdOff === undefined && credentials === undefined && location === undefined && tier === undefined) return undefined;
    return Promise.all([holdOff, credentials, location, tier]).then(() => undefined);
  }

  /** The first read of a hold-off key and its long hint's side keys; undefined once all are in. */
  #firstRead(key: string): Promise<void> | undefined {
    const holdOff = this.store.firstRead?.(key);
    const asked = this.store.firstRead?.(key + ASKED_SUFFIX);
    const long = this.store.firstRead?.(key + LONG_SUFFIX);
    if (holdOff === undefined && asked === undefined && long === undefined) return undefined;
    return Promise.all([holdOff, asked, long]).then(() => undefined);
  }

  /**
   * Drops what the store keeps for a target key given back (see StateStore.forget), its credential hold's key too:
   * every request looks that key up, and the Redis store watches (and re-reads at each reconnect) whatever it was
   * asked about, so each made-up model name would otherwise stay behind in it for good.
   */
  forget(target: string): void {
    this.store.forget(target + CREDENTIALS_SUFFIX);
    this.store.forget(target + LOCATION_SUFFIX);
    for (const key of [target, flexTierKey(target)]) {
      this.#claimsHeard.delete(key);
      this.store.forget(key);
      this.store.forget(key + ASKED_SUFFIX);
      this.store.forget(key + LONG_SUFFIX);
    }
  }

  /**
   * Starts (or extends) the hold-off of a key (a target's, or its flex tier's: flexTierKey); returns when it ends. A hint within MAX_HOLD_OFF_MS ends within it,
   * spread included: a held-off request is invited back (x-should-retry) only for a wait of at most 60 s, and a spread
   * that pushed a 60 s hint to 61 s took that from it. A longer hint is capped at MAX_HOLD_OFF_MS plus the spread, and
   * its own end is kept (askedUntil), so every request held off meanwhile is told what the first one was.
   */
  start(key: string, hint: WaitHint, cause: { reason: string; status?: number } = { reason: 'wait_hint' }): number {
    const now = this.now();
    // Only a hold-off that starts is news to the operator: each answer of a 429 storm extends the one in force.
    const fresh = this.#until(key) === undefined;
    const spread = this.random() * Math.min(MAX_SPREAD_MS, Math.min(hint.delayMs, MAX_HOLD_OFF_MS) * 0.1);
    let untilMs: number;
    if (hint.delayMs <= MAX_HOLD_OFF_MS) {
      untilMs = Math.ceil(now + Math.min(hint.delayMs + spread, MAX_HOLD_OFF_MS));
    } else {
      untilMs = Math.ceil(now + MAX_HOLD_OFF_MS + spread);
      // Side keys first: a request that sees the hold-off must not miss what it was asked for.
      void this.store.setHoldOff(key + ASKED_SUFFIX, Math.ceil(now + hint.delayMs));
      void this.store.setHoldOff(key + LONG_SUFFIX, untilMs);
    }
    const write = this.store.setHoldOff(key, untilMs, now);
    const target = targetOfHoldOffKey(key);
    if (fresh) this.#started({ kind: 'hold-off', target, ...(key !== target && { tier: 'flex' as const }), untilMs, hintMs: hint.delayMs, ...cause }, write);
    return untilMs;
  }
}
