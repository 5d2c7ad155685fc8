// A provider's error can quote the credentials it was sent (some OpenAI-compatible servers echo the whole key in a
// 400 or 500). Provider errors reach the client as they are, so the key a provider was sent is taken out first.
// Only that provider's key: it never saw another.

const REDACTED = '[redacted]';
/** Shorter "keys" (a local server's `x`) would redact ordinary words. */
const MIN_KEY_LENGTH = 8;

/**
 * The forms a provider may quote `key` in: as it is, and as a JSON encoder writes it in a string (`"` and `\\`
 * escaped; `/` as `\/` in PHP's and some Java encoders; `<` `>` `&` as `\u003c` in Go's, and `=` `'` too in Gson's,
 * Java's default) or a URL encodes it. A key of letters, digits, `-` and `_` (most providers') has the one form. Made
 * once per key: a gateway has a few.
 */
function formsOf(key: string): readonly string[] {
  let forms = FORMS.get(key);
  if (forms === undefined) {
    const json = JSON.stringify(key).slice(1, -1);
    const hex = (c: string) => `\\u00${c.charCodeAt(0).toString(16)}`;
    const goJson = json.replace(/[<>&]/g, hex);
    // Gson escapes `=` by default: a base64 key quoted by a Java server differed from the key in its padding alone.
    const gson = json.replace(/[<>&=']/g, hex);
    // Longest first, so that no form is replaced inside a longer one that holds it.
    forms = [...new Set([key, json, json.replaceAll('/', '\\/'), goJson, goJson.replaceAll('/', '\\/'), gson, encodeURIComponent(key)])].sort((a, b) => b.length - a.length);
    FORMS.set(key, forms);
  }
  return forms;
}
const FORMS = new Map<string, readonly string[]>();

/** `text` without `key` in any of its forms; the same object when none is in it (the common case costs one search). */
export function withoutKey<T extends Buffer | string>(text: T, key: string): T {
  if (key.length < MIN_KEY_LENGTH) return text;
  const forms = formsOf(key);
  const found = forms.length === 1 ? (text.includes(key) ? forms : []) : forms.filter((form) => text.includes(form));
  if (found.length === 0) return text;
  let clean = text.toString();
  for (const form of found) clean = clean.replaceAll(form, REDACTED);
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
  // The longest start of any form: an escaped key's start may end like a shorter start of the key as it is.
  let longest = 0;
  for (const form of formsOf(key)) {
    for (let n = Math.min(form.length - 1, s.length); n >= Math.max(MIN_KEY_START, longest + 1); n--) {
      if (s.endsWith(form.slice(0, n))) {
        longest = n;
        break;
      }
    }
  }
  if (longest === 0) return clean;
  const cut = `${s.slice(0, s.length - longest)}${REDACTED}`;
  return (typeof text === 'string' ? cut : Buffer.from(cut)) as T;
}

/** A header value (one string, or a list of them) without `key`. */
export function headerWithoutKey(value: unknown, key: string): unknown {
  if (typeof value === 'string') return withoutKey(value, key);
  return Array.isArray(value) ? value.map((v) => (typeof v === 'string' ? withoutKey(v, key) : v)) : value;
}
