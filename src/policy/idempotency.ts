// Idempotency keys, the pure part: which header values are keys, what one key names (whose, where), when two requests
// under it are the same request, and what becomes of a repeat.
// The I/O (the store, waiting, capturing a stream) is in pipeline/idempotent-request.ts.
import { createHash } from 'node:crypto';
import type { KeyRecord } from '../state/store.ts';
import type { HeaderBag } from '../header-bag.ts';

/** The IETF draft's header (draft-ietf-httpapi-idempotency-key-header), as Stripe, PayPal and OpenAI spell it. */
export const IDEMPOTENCY_HEADER = 'idempotency-key';
/** Visible ASCII, 1 to 255 characters: a UUID, a Stripe-style key, the Stainless SDKs' `stainless-node-retry-<uuid>`. */
const KEY = /^[\x21-\x7e]{1,255}$/;

/** The client's key; undefined without one; an Error naming what is wrong with one that cannot be a key. */
export function idempotencyKeyOf(headers: HeaderBag): string | undefined | Error {
  const value = headers[IDEMPOTENCY_HEADER];
  if (value === undefined) return undefined;
  // Node joins a header sent more than once with ", " (an array only where a caller built the bag itself).
  if (Array.isArray(value) || value.includes(', ')) return new Error(`send one ${IDEMPOTENCY_HEADER} header, not several`);
  const key = value.trim();
  if (!KEY.test(key)) return new Error(`${IDEMPOTENCY_HEADER} must be 1 to 255 visible ASCII characters (a UUID, say)`);
  return key;
}

/**
 * The key as the store knows it: hashed with the client it belongs to (its client key's name, when auth is on) and the
 * path, so two clients, or two endpoints, that pick the same key never share an answer, and no key a client chooses
 * reaches Redis as it was sent.
 */
export function scopedKey(client: string | undefined, path: string, key: string): string {
  return createHash('sha256').update(`${client ?? ''}\n${path}\n${key}`).digest('base64url');
}

/**
 * What makes two requests under one key the same request: their bodies, byte for byte, and their query strings (sent
 * upstream with them: a tool may take its arguments there). Without a query, the body's hash alone, as before.
 */
export function fingerprintOf(rawBody: Buffer, query = ''): string {
  const hash = createHash('sha256');
  // No JSON body starts with '?': a query and a body never hash as another body.
  if (query !== '') hash.update(`${query}\n`);
  return hash.update(rawBody).digest('base64url');
}

/** What a request that finds its key taken does. */
type RepeatVerdict =
  /** The first request is still running: wait for its answer. */
  | 'wait'
  /** Its answer is kept: send it again. */
  | 'replay'
  /** It was answered, but the answer was too long to keep. */
  | 'not-kept'
  /** The key was used for a different request. */
  | 'mismatch';

export function repeatVerdict(record: KeyRecord, fingerprint: string): RepeatVerdict {
  // A running record this version could not read (state/redis-store.ts) has no fingerprint to compare: wait for it.
  if (record.fingerprint !== fingerprint && record.fingerprint !== '') return 'mismatch';
  if (record.state === 'running') return 'wait';
  return record.answer ? 'replay' : 'not-kept';
}

/** How often a repeat looks again at a running key: each look is one store round trip, spread so waiters do not align. */
export function nextLookMs(random: () => number): number {
  return 75 + Math.floor(random() * 75);
}
