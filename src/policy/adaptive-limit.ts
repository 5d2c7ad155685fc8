// The adaptive concurrency limit of one target (provider and model), pure: AIMD with slow start, and per-class caps
// so that lower classes (batch) shrink to their floor before the limit that the top class (online) lives under is cut.
// A rate-limit signal (429, 529) cuts at most once per round trip; a success adds one per round trip.

export interface LimitSettings {
  /** The provider pool's capacity: the limit never goes above it. */
  max: number;
  min: number;
  /** Multiplier on a rate-limit signal, in (0, 1). */
  decrease: number;
  /** Each class's minShare, highest class first. */
  minShares: readonly number[];
}

/** Answers counted since a share was last taken, refused (429, 529) and not, and the limit and time they began at. */
interface Tally {
  ok: number;
  refused: number;
  limit: number;
  fromMs: number;
}

/**
 * A burst of rate-limit signals: where the limit and caps were when it began, its worst round trip's refused share
 * and the limit that round trip's answers were sent under, and the shares' sum and count (their mean is the noise's).
 */
interface Burst {
  fromLimit: number;
  fromCaps: number[];
  peakShare: number;
  peakLimit: number;
  shareSum: number;
  windows: number;
}

export interface LimitState {
  /** Attempts in flight allowed to the target, all classes together. Fractional: it grows by 1/limit per success. */
  limit: number;
  /** Per class cap, highest class first; caps[0] is unused (the top class lives under `limit` alone). */
  caps: number[];
  /** While set and above `limit`, the limit is in slow start (+1 per success, doubling per round trip). */
  slowStartTo: number | undefined;
  /**
   * Half the limit a burst of rate-limit signals found (TCP's ssthresh): once the burst is over (a quiet round trip),
   * a limit the burst took below it slow-starts back to it.
   */
  recoverTo?: number;
  lastDecreaseAtMs: number;
  /** The last rate-limit signal of any kind: growth waits a few round trips after it, so probing stays rare. */
  lastSignalAtMs: number;
  /** Answers since the refused share was last taken, kept during a burst and while refusals are noise. */
  tally?: Tally;
  /** The burst of rate-limit signals going on: where the limit and caps were when it began, and its refused shares. */
  burst?: Burst;
  /**
   * Rate-limit signals found not to be about our concurrency (cutting it did not make them fewer: another client of
   * the same key, a provider refusing a share of all requests): their usual share, which is ignored.
   */
  noiseShare?: number;
}

/** Round trips without a rate-limit signal before the limit grows again: at most ~1% of attempts probe too far. */
const QUIET_ROUND_TRIPS = 10;
/** Answers a round trip's refused share needs before it is read (at a low limit, over several round trips). */
const MIN_WINDOW_ANSWERS = 10;
/** Answers per share taken while refusals are noise: enough that a share twice the usual is no fluke. */
const NOISE_WINDOW_ANSWERS = 40;
const burstOver = (st: LimitState, nowMs: number, roundTripMs: number) => nowMs - st.lastSignalAtMs >= QUIET_ROUND_TRIPS * roundTripMs;
const counted = (t: Tally | undefined, refused: boolean, st: LimitState, nowMs: number): Tally => ({
  ok: (t?.ok ?? 0) + (refused ? 0 : 1),
  refused: (t?.refused ?? 0) + (refused ? 1 : 0),
  limit: t?.limit ?? st.limit,
  fromMs: t?.fromMs ?? nowMs,
});
/**
 * The refused share of the tally once it holds `min` answers over at least `spanMs`, else undefined. A span of whole
 * round trips, since 429s come back at once and answers a round trip later: forty answers in a row may be all of one.
 */
const shareOf = (t: Tally, min: number, nowMs = t.fromMs, spanMs = 0) => (t.ok + t.refused >= min && nowMs - t.fromMs >= spanMs ? t.refused / (t.ok + t.refused) : undefined);

export function initialLimit(s: LimitSettings): LimitState {
  return { limit: s.max, caps: s.minShares.map(() => s.max), slowStartTo: undefined, lastDecreaseAtMs: Number.NEGATIVE_INFINITY, lastSignalAtMs: Number.NEGATIVE_INFINITY };
}

/**
 * The limit's floor: minLimit, but never above the ceiling. The config lets minLimit exceed maxConcurrent (or the
 * maxConnections it defaults to), and the first 429 then raised the limit past the pool's capacity.
 */
function floorOf(s: LimitSettings): number {
  return Math.min(s.min, s.max);
}

/** A class's floor under the current limit: its minShare of it, at least one slot. */
function classFloor(st: LimitState, s: LimitSettings, cls: number): number {
  return Math.max(1, Math.floor((s.minShares[cls] ?? 0) * st.limit));
}

/** How many attempts of `cls` may be in flight to the target. */
export function classLimit(st: LimitState, cls: number): number {
  const cap = cls === 0 ? st.limit : Math.min(st.limit, st.caps[cls] ?? st.limit);
  return Math.max(1, Math.floor(cap));
}

/**
 * The upstream said "too many" (429, 529) while `inUse` of our attempts (this one included) were in flight to it, so
 * it takes fewer than that. At once, the lowest class above its floor is clamped to one below what it had in flight
 * (else the limit itself): without this, every slot a 429 frees is taken by the next waiter and answered 429 again.
 * And at most once per round trip, the multiplicative cut (x decrease), lowest class first, then the limit.
 */
export function onRateLimited(st: LimitState, s: LimitSettings, nowMs: number, roundTripMs: number, inUse: InUse): LimitState {
  if (st.noiseShare !== undefined) {
    st = noiseTallied(st, true, nowMs, roundTripMs);
    if (st.noiseShare !== undefined) return st;
  }
  // A limit that is not binding cannot be too high: a 429 while far below it (a quota window, another client of the
  // same key) says nothing about our concurrency, and cutting on it would ratchet the limit down to nothing.
  if (!binding(st, inUse)) return st;
  // The first signal of a burst (none for a round trip) notes where the limit may slow-start back to: a quota window
  // answers every request in flight with 429 and the clamps follow them down to one, and growing back one slot per
  // round trip kept the provider idle long after the window.
  const recoverTo = nowMs - st.lastSignalAtMs >= roundTripMs ? Math.floor(st.limit / 2) : st.recoverTo;
  // The cuts are judged over a longer run: until the limit may grow again (refusals at a low rate leave quiet round trips).
  const burstStarts = st.burst === undefined || burstOver(st, nowMs, roundTripMs);
  let burst: Burst = burstStarts ? { fromLimit: st.limit, fromCaps: st.caps, peakShare: 0, peakLimit: st.limit, shareSum: 0, windows: 0 } : st.burst!;
  let tally: Tally | undefined = counted(burstStarts ? undefined : st.tally, true, st, nowMs);
  const clamped = { ...clampToObserved(st, s, inUse), lastSignalAtMs: nowMs, recoverTo, burst, tally };
  if (nowMs - st.lastDecreaseAtMs < roundTripMs) return clamped;
  // Once per round trip, with the cut: the share of the answers since the last one.
  const share = shareOf(tally, MIN_WINDOW_ANSWERS);
  if (share !== undefined) {
    const sentUnder = tally.limit;
    const peak = share > burst.peakShare ? { peakShare: share, peakLimit: sentUnder } : {};
    burst = { ...burst, ...peak, shareSum: burst.shareSum + share, windows: burst.windows + 1 };
    tally = undefined;
    if (notOurConcurrency(burst, sentUnder, share)) {
      // Cutting did not help, so the cuts were wrong: back to where the burst began (the limit slow-starts there), and
      // from now on refusals at this share are ignored. Kept on, they took the limit to 1 and online queued behind it.
      const noiseShare = burst.shareSum / burst.windows;
      return { ...clamped, caps: [...burst.fromCaps], slowStartTo: burst.fromLimit, recoverTo: undefined, burst: undefined, tally: undefined, noiseShare, lastDecreaseAtMs: nowMs };
    }
  }
  const judged = { ...clamped, burst, tally };
  const caps = [...judged.caps];
  for (let k = caps.length - 1; k >= 1; k--) {
    const floor = classFloor(judged, s, k);
    if (Math.min(caps[k]!, judged.limit) > floor) {
      caps[k] = Math.max(floor, Math.min(caps[k]!, judged.limit) * s.decrease);
      return { ...judged, caps, slowStartTo: undefined, lastDecreaseAtMs: nowMs };
    }
  }
  const limit = Math.max(floorOf(s), judged.limit * s.decrease);
  return { ...judged, limit, caps: caps.map((c) => Math.min(c, limit)), slowStartTo: undefined, lastDecreaseAtMs: nowMs };
}

/**
 * An answer while refusals are noise. Every two round trips (and forty answers) their share is taken: clearly more
 * than usual (twice and 10 points more, or halfway to all refused, whichever is less) says the provider's capacity
 * binds on top of them, and far less (a third) that they stopped: either way they are signals again.
 */
function noiseTallied(st: LimitState, refused: boolean, nowMs: number, roundTripMs: number): LimitState {
  const tally = counted(st.tally, refused, st, nowMs);
  const share = shareOf(tally, NOISE_WINDOW_ANSWERS, nowMs, 2 * roundTripMs);
  if (share === undefined) return { ...st, tally };
  const noise = st.noiseShare!;
  const usual = share <= Math.min(2 * noise + 0.1, (1 + noise) / 2) && share >= noise / 3;
  return usual ? { ...st, tally: undefined } : { ...st, noiseShare: undefined, tally: undefined };
}

/**
 * Have this burst's cuts shown that the refusals are not about our concurrency? When they are, fewer attempts in
 * flight means fewer refused: a provider that takes C in flight refuses 1 - C/limit of them, so answers sent under half
 * the limit of the burst's worst round trip are refused at most 1 - 2(1 - its share) of the time (never, for a share up
 * to a half). When the share stays where it was under half that limit, the refusals come whatever we do (another
 * client of the same key, a provider refusing a share of everything), and cutting further only starves our own queue.
 * A worst share over 0.6 (a quota window, far too many in flight) is never judged so: there cutting is what the
 * provider asks for.
 */
function notOurConcurrency(burst: Burst, sentUnder: number, share: number): boolean {
  if (burst.peakShare > 0.6 || sentUnder > burst.peakLimit / 2) return false;
  const ifOurs = Math.max(0, 1 - (1 - burst.peakShare) * (burst.peakLimit / sentUnder));
  return share >= burst.peakShare / 2 && share >= ifOurs + 0.1;
}

/** Attempts of one target in flight when a signal came, all classes and per class (highest first), and requests waiting for it. */
interface InUse {
  total: number;
  byClass: readonly number[];
  waiting?: number;
  /**
   * The target's rate-limit signals earlier in this round trip. A 429 comes back in a few ms and gives its slot back at
   * once, and its retry sleeps in its backoff, neither in flight nor waiting: a flood the provider refused looked like
   * a few requests far below the limit, and each of its 429s was ignored (9 to 28 of them before the first answer).
   */
  refusedLately?: number;
}

/** Is the limit (or a class's cap) what holds the target's traffic back right now: requests wait, or in flight within a tenth of it? */
function binding(st: LimitState, inUse: InUse): boolean {
  if ((inUse.waiting ?? 0) > 0 || inUse.total + (inUse.refusedLately ?? 0) >= Math.floor(st.limit * 0.9)) return true;
  for (let k = 1; k < st.caps.length; k++) if ((inUse.byClass[k] ?? 0) >= Math.floor(classLimit(st, k) * 0.9)) return true;
  return false;
}

function clampToObserved(st: LimitState, s: LimitSettings, inUse: InUse): LimitState {
  if (inUse.total <= 0) return st;
  for (let k = st.caps.length - 1; k >= 1; k--) {
    const floor = classFloor(st, s, k);
    const had = inUse.byClass[k] ?? 0;
    if (had > floor && classLimit(st, k) >= had) {
      const caps = [...st.caps];
      caps[k] = Math.max(floor, had - 1);
      return { ...st, caps };
    }
  }
  const limit = Math.max(floorOf(s), Math.min(st.limit, inUse.total - 1));
  return limit < st.limit ? { ...st, limit, caps: st.caps.map((c) => Math.min(c, limit)) } : st;
}

/**
 * An answer came back fine: grow back what was cut, top class first (online's cap before batch's), and the limit
 * itself last. Batch thus takes the sawtooth of probing for capacity, and online's room is left alone. In slow start
 * (after an outage) the limit comes first, +1 per success.
 * Otherwise one slot per round trip, as AIMD adds one per feedback delay: the provider says whether one more attempt
 * was too many when it answers it (roundTripMs), not when a stream it answered ends. Successes come one per
 * `holdMs / limit` (a slot is held for the whole stream), so each adds holdMs / roundTripMs / limit, at most one:
 * at 1/limit, a limit a 429 burst cut from 128 to 64 under 30 s streams took half an hour to grow back.
 */
export function onSuccess(st: LimitState, s: LimitSettings, nowMs: number, roundTripMs: number, holdMs = roundTripMs): LimitState {
  if (st.noiseShare !== undefined) {
    st = noiseTallied(st, false, nowMs, roundTripMs);
  } else if (st.burst !== undefined) {
    st = burstOver(st, nowMs, roundTripMs) ? { ...st, burst: undefined, tally: undefined } : { ...st, tally: counted(st.tally, false, st, nowMs) };
  }
  // A burst of rate-limit signals is over (a quiet round trip): a limit it took below half of where it began slow-starts back there.
  const to = st.recoverTo;
  if (to !== undefined && st.limit < to && nowMs - st.lastSignalAtMs >= roundTripMs) {
    st = { ...st, recoverTo: undefined, slowStartTo: Math.max(to, st.slowStartTo ?? 0) };
  }
  const slowStart = st.slowStartTo !== undefined && st.limit < st.slowStartTo;
  if (!slowStart && nowMs - st.lastSignalAtMs < QUIET_ROUND_TRIPS * roundTripMs) return st;
  if (slowStart) {
    const limit = Math.min(s.max, st.limit + 1);
    return { ...st, limit, slowStartTo: limit < st.slowStartTo! ? st.slowStartTo : undefined };
  }
  const perRoundTrip = roundTripMs > 0 ? Math.max(1, holdMs / roundTripMs) : 1;
  for (let k = 1; k < st.caps.length; k++) {
    if (st.caps[k]! < st.limit) {
      const caps = [...st.caps];
      const cap = Math.max(1, caps[k]!);
      caps[k] = Math.min(st.limit, caps[k]! + Math.min(cap, perRoundTrip) / cap);
      return { ...st, caps, slowStartTo: undefined };
    }
  }
  if (st.limit >= s.max) return st;
  const step = Math.min(st.limit, perRoundTrip) / st.limit;
  const limit = Math.min(s.max, st.limit + step);
  return { ...st, limit, caps: st.caps.map((c) => Math.max(c, Math.min(c + step, limit))), slowStartTo: undefined };
}

/**
 * The target is back after an outage (its breaker closed, a hold-off ended): restart at half the limit it had, and
 * slow-start back to it; a second outage before the first's slow start is over slow-starts back to the first's limit.
 */
export function onRecovered(st: LimitState, s: LimitSettings): LimitState {
  const limit = Math.max(floorOf(s), Math.floor(st.limit / 2));
  return { ...st, limit, caps: st.caps.map((c) => Math.min(c, limit)), slowStartTo: Math.max(st.limit, st.slowStartTo ?? 0) };
}
