// Header values the gateway writes. Some carry what a client sent (x-stormgate-target names the client's model),
// and Node refuses a value with characters outside visible ASCII: refused after the upstream already answered (and
// billed), the answer would be lost.

const HEADER_VALUE_MAX = 256;
const UNSAFE_HEADER_CHAR = /[^\x20-\x7e]/u;
const UNSAFE_HEADER_CHARS = /[^\x20-\x7e]/gu;

/**
 * A header value Node will write: visible ASCII and spaces, anything else percent-encoded (as UTF-8), at most 256
 * characters. Values like x-stormgate-target carry the client's model name, and a value Node refuses would fail the
 * answer after the upstream already billed it.
 */
export function headerSafe(value: string): string {
  const safe = UNSAFE_HEADER_CHAR.test(value)
    ? value.replace(UNSAFE_HEADER_CHARS, (ch) => [...Buffer.from(ch, 'utf8')].map((b) => `%${b.toString(16).toUpperCase().padStart(2, '0')}`).join(''))
    : value;
  return safe.length > HEADER_VALUE_MAX ? safe.slice(0, HEADER_VALUE_MAX) : safe;
}

export function safeHeaders(headers: Record<string, string>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name in headers) out[name] = headerSafe(headers[name]!);
  return out;
}
