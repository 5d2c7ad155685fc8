// Idempotency keys kept in the process (the in-process store, and the Redis store's stand-in while Redis is away),
// and the one wire format both stores' records share in Redis.
import type { KeptAnswer, KeyRecord } from './store.ts';

interface Entry {
  record: KeyRecord;
  expiresAtMs: number;
  bytes: number;
}

/**
 * What a record holds besides its answer's body, roughly (the Map's entry, the objects, the fingerprint): counted too,
 * with the key and the answer's headers, or small answers (a tool's `{"ok":true}` under its provider's kilobyte of
 * headers) kept many times the cap.
 */
const RECORD_OVERHEAD_BYTES = 256;

/** How often a store over its cap looks for expired records among all it holds (#evict). */
export const SWEEP_EVERY_MS = 1_000;

/** The bytes a record is counted for against the cap. */
function sizeOf(key: string, record: KeyRecord): number {
  let bytes = RECORD_OVERHEAD_BYTES + key.length + record.fingerprint.length;
  const answer = record.state === 'done' ? record.answer : undefined;
  if (answer) {
    bytes += answer.body.length;
    for (const [name, value] of Object.entries(answer.headers)) bytes += name.length + value.length;
  }
  return bytes;
}

/**
 * Records by key, each until it expires, and at most `maxBytes` of them in all: past it the oldest records go first
 * (a Map iterates in insertion order, and a record is re-inserted whenever it is written).
 */
export class KeptKeys {
  readonly #entries = new Map<string, Entry>();
  readonly #maxBytes: number;
  #bytes = 0;
  #sweptAtMs = Number.NEGATIVE_INFINITY;

  constructor(maxBytes: number) {
    this.#maxBytes = maxBytes;
  }

  claim(key: string, claim: KeyRecord & { state: 'running' }, runningMs: number): KeyRecord | undefined {
    const held = this.read(key, claim.sinceMs);
    if (held) return held;
    const nowMs = claim.sinceMs;
    this.#put(key, claim, nowMs + runningMs);
    this.#evict(nowMs);
    return undefined;
  }

  read(key: string, nowMs: number): KeyRecord | undefined {
    const entry = this.#entries.get(key);
    if (entry === undefined) return undefined;
    if (entry.expiresAtMs > nowMs) return entry.record;
    this.#delete(key, entry);
    return undefined;
  }

  renew(key: string, owner: string, runningMs: number, nowMs: number): void {
    const entry = this.#entries.get(key);
    if (entry && ownedBy(entry.record, owner) && entry.expiresAtMs > nowMs) entry.expiresAtMs = nowMs + runningMs;
  }

  settle(key: string, record: KeyRecord & { state: 'done' }, ttlMs: number, nowMs: number, owner?: string): void {
    const held = owner === undefined ? undefined : this.read(key, nowMs);
    if (held?.state === 'running' && held.owner !== owner) return;
    // An answer that alone passes the cap went at once, its key left free, and the agent's retry ran the call again:
    // kept as an answer not kept instead (409 idempotency_answer_not_kept), as one past maxAnswerBytes is.
    const bytes = sizeOf(key, record);
    if (bytes <= this.#maxBytes) this.#put(key, record, nowMs + ttlMs, bytes);
    else this.#put(key, { state: 'done', fingerprint: record.fingerprint, bytes: record.bytes }, nowMs + ttlMs);
    this.#evict(nowMs);
  }

  /** Removes the owner's running claim; without an owner, whatever the key holds. */
  release(key: string, owner?: string): void {
    const entry = this.#entries.get(key);
    if (entry && (owner === undefined || ownedBy(entry.record, owner))) this.#delete(key, entry);
  }

  /**
   * The records still in force, each with when it lapses, oldest first: the Redis store sends them to Redis once it is
   * back (redis-kept-keys.ts sendLocalKeys). A walk over the Map, no copy: it holds what memoryBytes lets it.
   */
  *held(nowMs: number): Generator<[key: string, record: KeyRecord, untilMs: number]> {
    for (const [key, { record, expiresAtMs }] of this.#entries) if (expiresAtMs > nowMs) yield [key, record, expiresAtMs];
  }

  #put(key: string, record: KeyRecord, expiresAtMs: number, bytes = sizeOf(key, record)): void {
    this.release(key);
    this.#entries.set(key, { record, expiresAtMs, bytes });
    this.#bytes += bytes;
  }

  #delete(key: string, entry: Entry): void {
    this.#entries.delete(key);
    this.#bytes -= entry.bytes;
  }

  /**
   * Drops expired records from the oldest end, then, while over the byte cap, every expired record and the oldest
   * ended ones. Expired ones first wherever they are: records live for different times (ttlMs, a route's bodyAsKeyMs),
   * so one that lapsed may sit behind an older one still in force, and must not cost it its place. That walk is over
   * every record (a millisecond for 50,000), so at most once in SWEEP_EVERY_MS: a full store is over its cap at every
   * answer kept.
   */
  #evict(nowMs: number): void {
    if (this.#bytes > this.#maxBytes && nowMs - this.#sweptAtMs >= SWEEP_EVERY_MS) {
      this.#sweptAtMs = nowMs;
      for (const [key, entry] of this.#entries) if (entry.expiresAtMs <= nowMs) this.#delete(key, entry);
    }
    for (const [key, entry] of this.#entries) {
      if (entry.expiresAtMs > nowMs && this.#bytes <= this.#maxBytes) return;
      // A running record is a claim, not memory: it stays until its request ends or its claim lapses.
      if (entry.record.state === 'running' && entry.expiresAtMs > nowMs) continue;
      this.#delete(key, entry);
    }
  }
}

function ownedBy(record: KeyRecord, owner: string): boolean {
  return record.state === 'running' && record.owner === owner;
}

/**
 * A record as one Redis string: a JSON line of everything but the answer's body, then the body's bytes as they are
 * (a stream's events, an embeddings answer: no base64 to grow them by a third).
 */
export function encodeKeyRecord(record: KeyRecord): Buffer {
  // `state` first: the Lua scripts tell a running claim by the value's first bytes (redis-scripts.ts).
  if (record.state === 'running') return Buffer.from(JSON.stringify({ state: record.state, fingerprint: record.fingerprint, sinceMs: record.sinceMs, owner: record.owner }) + '\n');
  const { answer, ...rest } = record;
  const meta = answer ? { ...rest, answer: { status: answer.status, headers: answer.headers, kind: answer.kind, target: answer.target, priority: answer.priority } } : rest;
  return Buffer.concat([Buffer.from(JSON.stringify(meta) + '\n'), answer?.body ?? Buffer.alloc(0)]);
}

/** The record encodeKeyRecord wrote; undefined for anything else (a key another program wrote, a damaged value). */
export function decodeKeyRecord(raw: Buffer): KeyRecord | undefined {
  const cut = raw.indexOf(0x0a);
  if (cut === -1) return undefined;
  let meta: unknown;
  try {
    meta = JSON.parse(raw.subarray(0, cut).toString('utf8'));
  } catch {
    return undefined;
  }
  if (typeof meta !== 'object' || meta === null) return undefined;
  const m = meta as Record<string, unknown>;
  if (typeof m.fingerprint !== 'string') return undefined;
  if (m.state === 'running' && typeof m.sinceMs === 'number') {
    return { state: 'running', fingerprint: m.fingerprint, sinceMs: m.sinceMs, ...(typeof m.owner === 'string' && { owner: m.owner }) };
  }
  if (m.state !== 'done' || typeof m.bytes !== 'number') return undefined;
  const a = m.answer as Partial<KeptAnswer> | undefined;
  if (a === undefined) return { state: 'done', fingerprint: m.fingerprint, bytes: m.bytes };
  if (typeof a.status !== 'number' || typeof a.headers !== 'object' || a.headers === null || (a.kind !== 'whole' && a.kind !== 'stream')) return undefined;
  // A copy: the decoded value must not pin the whole reply buffer it came in.
  const body = Buffer.from(raw.subarray(cut + 1));
  const labels = { ...(typeof a.target === 'string' && { target: a.target }), ...(typeof a.priority === 'string' && { priority: a.priority }) };
  return { state: 'done', fingerprint: m.fingerprint, bytes: m.bytes, answer: { status: a.status, headers: a.headers as Record<string, string>, kind: a.kind!, body, ...labels } };
}
