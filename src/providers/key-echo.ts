// A provider's error can quote the credentials it was sent (some OpenAI-compatible servers echo the whole key in a
// 400 or 500). Provider errors reach the client as they are, so the key a provider was sent is taken out first.
// Only that provider's key: it never saw another.

const REDACTED = '[redacted]';
/** Shorter "keys" (a local server's `x`) would redact ordinary words. */
const MIN_KEY_LENGTH = 8;

/** `text` without `key`; the same object when the key is not in it (the common case costs one search). */
export function withoutKey<T extends Buffer | string>(text: T, key: string): T {
  if (key.length < MIN_KEY_LENGTH || !text.includes(key)) return text;
  const clean = text.toString().replaceAll(key, REDACTED);
  return (typeof text === 'string' ? clean : Buffer.from(clean)) as T;
}

/** A header value (one string, or a list of them) without `key`. */
export function headerWithoutKey(value: unknown, key: string): unknown {
  if (typeof value === 'string') return withoutKey(value, key);
  return Array.isArray(value) ? value.map((v) => (typeof v === 'string' ? withoutKey(v, key) : v)) : value;
}
