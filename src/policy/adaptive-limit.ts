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

export interface LimitState {
  /** Attempts in flight allowed to the target, all classes together. Fractional: it grows by 1/limit per success. */
  limit: number;
  /** Per class cap, highest class first; caps[0] is unused (the top class lives under `limit` alone). */
  caps: number[];
  /** While set and above `limit`, the limit is in slow start (+1 per success, doubling per round trip). */
  slowStartTo: number | undefined;
  lastDecreaseAtMs: number;
}

export function initialLimit(s: LimitSettings): LimitState {
  return { limit: s.max, caps: s.minShares.map(() => s.max), slowStartTo: undefined, lastDecreaseAtMs: Number.NEGATIVE_INFINITY };
}

/** A class's floor under the current limit: its minShare of it, at least one slot. */
export function classFloor(st: LimitState, s: LimitSettings, cls: number): number {
  return Math.max(1, Math.floor((s.minShares[cls] ?? 0) * st.limit));
}

/** How many attempts of `cls` may be in flight to the target. */
export function classLimit(st: LimitState, cls: number): number {
  const cap = cls === 0 ? st.limit : Math.min(st.limit, st.caps[cls] ?? st.limit);
  return Math.max(1, Math.floor(cap));
}

/** The upstream said "too many" (429, 529): shrink the lowest class above its floor, else the limit itself. */
export function onRateLimited(st: LimitState, s: LimitSettings, nowMs: number, roundTripMs: number): LimitState {
  if (nowMs - st.lastDecreaseAtMs < roundTripMs) return st;
  const caps = [...st.caps];
  for (let k = caps.length - 1; k >= 1; k--) {
    const floor = classFloor(st, s, k);
    if (Math.min(caps[k]!, st.limit) > floor) {
      caps[k] = Math.max(floor, Math.min(caps[k]!, st.limit) * s.decrease);
      return { ...st, caps, slowStartTo: undefined, lastDecreaseAtMs: nowMs };
    }
  }
  const limit = Math.max(s.min, st.limit * s.decrease);
  return { ...st, limit, caps: caps.map((c) => Math.min(c, limit)), slowStartTo: undefined, lastDecreaseAtMs: nowMs };
}

/** An answer came back fine: grow the limit (slow start, then additive); once it is at its maximum, the classes' caps, top first. */
export function onSuccess(st: LimitState, s: LimitSettings): LimitState {
  if (st.limit < s.max) {
    const step = st.slowStartTo !== undefined && st.limit < st.slowStartTo ? 1 : 1 / st.limit;
    const limit = Math.min(s.max, st.limit + step);
    return { ...st, limit, slowStartTo: st.slowStartTo !== undefined && limit < st.slowStartTo ? st.slowStartTo : undefined };
  }
  for (let k = 1; k < st.caps.length; k++) {
    if (st.caps[k]! < st.limit) {
      const caps = [...st.caps];
      caps[k] = Math.min(st.limit, caps[k]! + 1 / Math.max(1, caps[k]!));
      return { ...st, caps };
    }
  }
  return st;
}

/** The target is back after an outage (its breaker closed): restart at half the limit it had, and slow-start back. */
export function onRecovered(st: LimitState, s: LimitSettings): LimitState {
  const limit = Math.max(s.min, Math.floor(st.limit / 2));
  return { ...st, limit, caps: st.caps.map((c) => Math.min(c, limit)), slowStartTo: st.limit };
}
