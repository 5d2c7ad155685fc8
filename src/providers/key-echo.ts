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

/**
 * Of a key a cut can leave this much at the end of what is kept; a shorter start tells no more than a key's public
 * prefix (`sk-`), and taking it out would change ordinary text that happens to end like a key begins.
 */
const MIN_KEY_START = 4;

/**
 * `text`, the first part of a longer body, without `key` and without the start of the key the cut may have left at
 * its end: a provider that quotes the key where the cut falls would otherwise hand the client all of it but its last
 * characters (and a client can move the cut, by the length of what the provider quotes of its request).
 */
export function withoutKeyCut<T extends Buffer | string>(text: T, key: string): T {
  const clean = withoutKey(text, key);
  if (key.length < MIN_KEY_LENGTH) return clean;
  const s = clean.toString();
  for (let n = Math.min(key.length - 1, s.length); n >= MIN_KEY_START; n--) {
    if (!s.endsWith(key.slice(0, n))) continue;
    const cut = `${s.slice(0, s.length - n)}${REDACTED}`;
    return (typeof text === 'string' ? cut : Buffer.from(cut)) as T;
  }
  return clean;
}

/** A header value (one string, or a list of them) without `key`. */
export function headerWithoutKey(value: unknown, key: string): unknown {
  if (typeof value === 'string') return withoutKey(value, key);
  return Array.isArray(value) ? value.map((v) => (typeof v === 'string' ? withoutKey(v, key) : v)) : value;
}
