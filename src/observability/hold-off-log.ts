// The operator's lines about hold-offs that start. A provider that answers a share of requests with 429 and a short
// hint starts a new hold-off as soon as the last one is over: 5% 429s with 300 ms hints were up to three warnings a
// second per target, one per 429, which buried everything else. The first start of a target (a flex tier apart) is
// written at once, as before; the starts that follow within a window are counted, and written as one line when it
// ends, for as long as they go on. The level stays warn: a target turned away is what the operator must see, and a
// quieter level would not have made fewer lines at the default one. stormgate_holds_started_total still counts each.
import type { Logger } from 'pino';
import { flexTierKey, type HoldStart } from '../state/hold-offs.ts';

/** How long the starts that follow a target's logged one are counted before one line reports them. */
export const HOLD_OFF_LOG_WINDOW_MS = 10_000;

interface Window {
  timer: NodeJS.Timeout;
  target: string;
  tier: 'flex' | undefined;
  /** Starts since the window opened (the one that opened it aside). */
  starts: number;
  longestRetryAfterMs: number | undefined;
  statuses: Set<number>;
  untilMs: number;
}

export class HoldOffLog {
  readonly #logger: Logger;
  readonly #now: () => number;
  readonly #windowMs: number;
  readonly #windows = new Map<string, Window>();
  #closed = false;

  constructor(logger: Logger, now: () => number, windowMs: number = HOLD_OFF_LOG_WINDOW_MS) {
    this.#logger = logger;
    this.#now = now;
    this.#windowMs = windowMs;
  }

  /** A hold-off this instance started (HoldOffs' onStart, kind 'hold-off'). */
  started(h: HoldStart): void {
    if (this.#closed) return;
    const key = h.tier === 'flex' ? flexTierKey(h.target) : h.target;
    const open = this.#windows.get(key);
    if (open) {
      open.starts++;
      if (h.hintMs !== undefined) open.longestRetryAfterMs = Math.max(open.longestRetryAfterMs ?? 0, h.hintMs);
      if (h.status !== undefined) open.statuses.add(h.status);
      open.untilMs = Math.max(open.untilMs, h.untilMs);
      return;
    }
    this.#logger.warn(
      { target: h.target, tier: h.tier, reason: h.reason, status: h.status, retryAfterMs: h.hintMs, until: new Date(h.untilMs).toISOString() },
      'hold-off started: the provider asked for a pause',
    );
    this.#open(key, h.target, h.tier);
  }

  /** Writes the counts of the windows still open (a shutdown must not lose them) and stops their timers. */
  close(): void {
    this.#closed = true;
    for (const w of this.#windows.values()) {
      clearTimeout(w.timer);
      this.#report(w);
    }
    this.#windows.clear();
  }

  #open(key: string, target: string, tier: 'flex' | undefined): void {
    const timer = setTimeout(() => {
      const w = this.#windows.get(key)!;
      this.#windows.delete(key);
      // Starts went on through the window: a new one counts the next, so a long run of them is a line per window.
      if (this.#report(w)) this.#open(key, target, tier);
    }, this.#windowMs).unref();
    this.#windows.set(key, { timer, target, tier, starts: 0, longestRetryAfterMs: undefined, statuses: new Set(), untilMs: this.#now() });
  }

  #report(w: Window): boolean {
    if (w.starts === 0) return false;
    this.#logger.warn(
      {
        target: w.target,
        tier: w.tier,
        starts: w.starts,
        windowS: this.#windowMs / 1000,
        statuses: [...w.statuses],
        longestRetryAfterMs: w.longestRetryAfterMs,
        until: new Date(w.untilMs).toISOString(),
      },
      'hold-off started again: the provider keeps asking for pauses',
    );
    return true;
  }
}
