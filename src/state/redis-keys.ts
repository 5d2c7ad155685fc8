// The Redis wire format of the state store: key layout, the breaker hash, and the pub/sub messages.
// Every key of one target (or budget) carries the same hash tag `{...}`, so each script touches one slot and runs on
// Redis Cluster unchanged.
import type { ClientRates, Rate, RateKind } from '../policy/client-rate.ts';
import type { BreakerRecord, StateChange } from './store.ts';

/** Key and channel names under one prefix. */
export class RedisKeys {
  readonly #prefix: string;
  /** The one channel every instance publishes changes on. */
  readonly events: string;

  constructor(keyPrefix: string) {
    this.#prefix = keyPrefix ? `${keyPrefix}:` : '';
    this.events = `${this.#prefix}events`;
  }

  /** Per-second outcome counts of one breaker generation; a new generation is a new key, hence a fresh window. */
  outcomes(target: string, generation: number): string {
    return `${this.#prefix}{${target}}:outcomes:${generation}`;
  }

  /** The breaker record, one hash field per BreakerRecord field. */
  breaker(target: string): string {
    return `${this.#prefix}{${target}}:breaker`;
  }

  /** Sorted set of half-open probe permits, scored by expiry (ms). */
  permits(target: string): string {
    return `${this.#prefix}{${target}}:permits`;
  }

  /** The hold-off's end (ms), expiring a while after it. */
  holdOff(target: string): string {
    return `${this.#prefix}{${target}}:hold-off`;
  }

  /**
   * Each instance's demand on a provider's pool, per priority class: field = instance id, value = `<d0>,<d1>,...:<ms>`.
   * A key of its own (not `:demand`, whose values were one number): a fleet upgraded one instance at a time never has
   * an instance drop the others' fields as malformed.
   */
  demand(pool: string): string {
    return `${this.#prefix}{pool/${pool}}:demand-by-class`;
  }

  /**
   * Written by the degraded store's health check; expires at once. Beside `key` (a key of this prefix: same hash tag,
   * so the same Cluster slot) when the check is about that key's slot.
   */
  probe(key?: string): string {
    return key === undefined ? `${this.#prefix}{probe}:probe` : `${key}:probe`;
  }

  /**
   * Every key that shares `key`'s hash tag (one target's, or one budget's), as a pattern `redis-cli --scan --pattern`
   * takes; a key with nothing after its tag (an idempotency record) is its own pattern.
   */
  sameTag(key: string): string {
    return key.replace(/\}:[^{}]*$/, '}:*');
  }

  /** An idempotency key's record (state/kept-keys.ts): `key` is already scoped and hashed, so each has a slot of its own. */
  idempotency(key: string): string {
    return `${this.#prefix}idempotency:{${key}}`;
  }

  /** Per-second request (`r:<sec>`) and retry (`x:<sec>`) counts of one retry budget. */
  budget(budgetKey: string): string {
    return `${this.#prefix}{${budgetKey}}:budget`;
  }

  /**
   * A limited client's due time under one of its rates (auth.limits; policy/client-rate.ts), ms in Redis's clock; one
   * hash tag for both. The rate is in the name: a due time is a debt at its own rate, and one left by a slower limit (a
   * burst at one a minute leaves an hour to pay back) held the client past a raised one, across the restart that raised it.
   */
  clientRate(client: string, kind: RateKind, rate: Rate | undefined): string {
    return `${this.#prefix}{client/${client}}:${kind}:${rate ? `${rate.intervalMs}/${rate.burst}` : 'none'}`;
  }
  /**
   * The latest time a refused request of the client was told to come back (the queue of refused requests), ms in Redis's
   * clock. Under the request rate's name too: a queue told at a slower rate is not one a raised rate waits behind.
   */
  clientTold(client: string, rates: ClientRates): string {
    return `${this.clientRate(client, 'requests', rates.requests)}:told`;
  }

}

const BREAKER_STATES = new Set<BreakerRecord['state']>(['closed', 'open', 'half-open']);

/** The record as the flat `field, value, ...` list HSET takes. */
export function encodeBreaker(r: BreakerRecord): string[] {
  return [
    'state', r.state,
    'sinceMs', String(r.sinceMs),
    'openUntilMs', String(r.openUntilMs),
    'probeSuccesses', String(r.probeSuccesses),
    'generation', String(r.generation),
    // Stamped with the generation they belong to: an older instance's compare-and-set HSETs only the fields it knows,
    // so the counts would outlive their spell (closed, then tripped afresh, by that instance) and slow the next one's
    // probes, or reopen its half-open breaker early.
    'failedProbes', String(r.failedProbes ?? 0),
    'failedProbesGeneration', String(r.generation),
    // A stamp of its own: the release before this one writes failedProbesGeneration too (not probeFailures), so that
    // stamp would pass off a half-open spell's failures as its reopened record's, and the next first probe's success
    // would reopen the breaker on them.
    'probeFailures', String(r.probeFailures ?? 0),
    'probeFailuresGeneration', String(r.generation),
  ];
}

/** Reads a record from HGETALL's object or a script's flat list; undefined when absent or malformed. */
export function decodeBreaker(raw: Record<string, string> | string[]): BreakerRecord | undefined {
  const h: Record<string, string | undefined> = Array.isArray(raw) ? pairsToObject(raw) : raw;
  const state = h.state as BreakerRecord['state'] | undefined;
  if (!state || !BREAKER_STATES.has(state)) return undefined;
  const record: BreakerRecord = {
    state,
    sinceMs: Number(h.sinceMs),
    openUntilMs: Number(h.openUntilMs),
    probeSuccesses: Number(h.probeSuccesses),
    generation: Number(h.generation),
  };
  if (!Object.values(record).every((v) => typeof v === 'string' || Number.isFinite(v))) return undefined;
  // Absent from records an older instance wrote: none; left behind under another generation by an older instance's
  // write over a newer one's record: none either. (A published record carries no stamp: it is its writer's own.)
  const stamp = h.failedProbesGeneration;
  const current = stamp === undefined || Number(stamp) === record.generation;
  const failedProbes = current ? Number(h.failedProbes ?? 0) : 0;
  if (Number.isInteger(failedProbes) && failedProbes > 0) record.failedProbes = failedProbes;
  // Its own stamp (see encodeBreaker); without one, only a published record's (no stamp at all) is current.
  const ownStamp = h.probeFailuresGeneration;
  const probeFailuresCurrent = ownStamp === undefined ? stamp === undefined : Number(ownStamp) === record.generation;
  const probeFailures = probeFailuresCurrent ? Number(h.probeFailures ?? 0) : 0;
  if (Number.isInteger(probeFailures) && probeFailures > 0) record.probeFailures = probeFailures;
  return record;
}

function pairsToObject(flat: string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (let i = 0; i + 1 < flat.length; i += 2) out[flat[i]!] = flat[i + 1]!;
  return out;
}

/** A change as published; `src` names the instance that made it, so it can skip its own. */
export type ChangeMessage = StateChange & { src: string };

export function encodeChange(change: StateChange, src: string): string {
  return JSON.stringify({ ...change, src });
}

/** Parses a published change; undefined for anything that is not one (another tool on the channel, an old format). */
export function decodeChange(message: string): ChangeMessage | undefined {
  let m: unknown;
  try {
    m = JSON.parse(message);
  } catch {
    return undefined;
  }
  if (typeof m !== 'object' || m === null) return undefined;
  const { kind, target, src } = m as Record<string, unknown>;
  if (typeof target !== 'string' || typeof src !== 'string') return undefined;
  if (kind === 'hold-off') {
    const untilMs = (m as { untilMs?: unknown }).untilMs;
    return typeof untilMs === 'number' && Number.isFinite(untilMs) ? { kind, target, untilMs, src } : undefined;
  }
  if (kind === 'breaker') {
    const raw = (m as { record?: unknown }).record;
    if (typeof raw !== 'object' || raw === null) return undefined;
    const record = decodeBreaker(Object.fromEntries(Object.entries(raw).map(([k, v]) => [k, String(v)])));
    return record ? { kind, target, record, src } : undefined;
  }
  return undefined;
}
