// JSON in and out with every number as it was written. Tool inputs cross the translation as JSON values (Anthropic's
// `input`) on one side and JSON text (OpenAI's `arguments`) on the other, and JSON.parse rounds what a double cannot
// hold: a 64-bit id such as 1729384756102938475 became 1729384756102938400, another record, where a stream (its
// partial_json passed on as text) kept it. Node 20 has no JSON.rawJSON; so a number of more than 15 significant digits
// (or one a double cannot hold at all, 1e400) is read as a tagged string, and written back as its digits. Pure.
// Not lossless-json: its parser walks every character in JavaScript, 100 ms for a 1 MB chat body with one 16-digit run
// in its text (native JSON.parse: 1 to 5 ms), on the request path of every renamed or translated request; here the
// strings are skipped with indexOf and the parse stays native.
import { randomUUID } from 'node:crypto';

// A string no JSON text sent to or by the gateway holds: a NUL and a random id of this process.
const NONCE = randomUUID();
// The run of characters a number of 16 or more significant digits needs, or the exponent of 3 digits one a double
// cannot hold needs (1e400): texts without either skip the scan. Gated on the run alone, a lone 1e400 went out as null.
const MAYBE_LONG = /\d(?:[\d.]{15}|[eE][+-]?\d{3})/;
const NUMBER = /-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?/y;
const TAGGED = new RegExp(`"\\\\u0000${NONCE}:(-?[0-9][0-9.eE+-]*)"`, 'g');

/**
 * JSON.parse, with numbers a double would round read as tagged strings that stringifyExact writes back as they came.
 * `parsed`, the text already read by JSON.parse, is returned as it is when the text holds no such number.
 */
export function parseExact(text: string, parsed?: unknown): unknown {
  if (!MAYBE_LONG.test(text)) return parsed === undefined ? JSON.parse(text) : parsed;
  return JSON.parse(tagLongNumbers(text));
}

/** JSON.stringify, with the numbers parseExact tagged written as they were read. */
export function stringifyExact(value: unknown): string {
  const text = JSON.stringify(value);
  return text.includes(NONCE) ? text.replace(TAGGED, '$1') : text;
}

function tagLongNumbers(text: string): string {
  let out = '';
  let from = 0;
  let i = 0;
  while (i < text.length) {
    const c = text.charCodeAt(i);
    if (c === 0x22) {
      const end = stringEnd(text, i);
      if (end < 0) break; // an unterminated string: JSON.parse says so
      i = end;
      continue;
    }
    if (c === 0x2d || (c >= 0x30 && c <= 0x39)) {
      NUMBER.lastIndex = i;
      const token = NUMBER.exec(text)?.[0];
      if (token === undefined) break; // malformed: JSON.parse says so
      if (significantDigits(token) > 15 || !Number.isFinite(Number(token))) {
        out += `${text.slice(from, i)}"\\u0000${NONCE}:${token}"`;
        from = i + token.length;
      }
      i += token.length;
      continue;
    }
    i++;
  }
  return from === 0 ? text : out + text.slice(from);
}

/** The index after the string opening at `open`, found by its quotes (a regex over a 10 MB string overflows its stack); -1 if it never ends. */
function stringEnd(text: string, open: number): number {
  for (let from = open + 1; ; ) {
    const quote = text.indexOf('"', from);
    if (quote < 0) return -1;
    let backslashes = 0;
    while (text.charCodeAt(quote - 1 - backslashes) === 0x5c) backslashes++;
    if (backslashes % 2 === 0) return quote + 1;
    from = quote + 1;
  }
}

function significantDigits(token: string): number {
  const mantissa = token.replace(/[eE].*$/, '').replace(/[-.]/g, '');
  return mantissa.replace(/^0+/, '').length;
}
