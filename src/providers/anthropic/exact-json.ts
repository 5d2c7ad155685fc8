// JSON in and out with every number as it was written. Tool inputs cross the translation as JSON values (Anthropic's
// `input`) on one side and JSON text (OpenAI's `arguments`) on the other, and JSON.parse rounds what a double cannot
// hold: a 64-bit id such as 1729384756102938475 became 1729384756102938400, another record, where a stream (its
// partial_json passed on as text) kept it. Node 20 has no JSON.rawJSON: a text that may hold such a number is read by
// lossless-json, which keeps the number's digits; the native JSON.stringify writes them back through toJSON and a tag.
import { randomUUID } from 'node:crypto';
import { isSafeNumber, parse } from 'lossless-json';

// A string no JSON text sent to or by the gateway holds: a NUL and a random id of this process.
const NONCE = randomUUID();
const TAG = `\u0000${NONCE}:`;
// The run of characters a number of 16 or more significant digits needs: texts without one (nearly all) skip the
// slower lossless parse.
const MAYBE_LONG = /\d[\d.]{15}/;
// The tagged digits as JSON.stringify writes the tag's string (its NUL escaped).
const TAGGED = new RegExp(`"\\\\u0000${NONCE}:(-?[0-9][0-9.eE+-]*)"`, 'g');

/** A number a double would round, kept as its digits; written back by stringifyExact as they came. */
class ExactNumber {
  constructor(readonly digits: string) {}
  toJSON(): string {
    return TAG + this.digits;
  }
  valueOf(): number {
    return Number(this.digits);
  }
}

const parseNumber = (digits: string): number | ExactNumber => (isSafeNumber(digits) ? Number(digits) : new ExactNumber(digits));
// As JSON.parse does: the last of a repeated key holds (lossless-json refuses the text by default).
const lastOfRepeatedKey = ({ newValue }: { newValue: unknown }) => newValue;

/** May `text` hold a number a double would round? False is certain; true only a maybe. */
export function mayHoldLongNumbers(text: string): boolean {
  return MAYBE_LONG.test(text);
}

/** JSON.parse, with numbers a double would round kept as their digits, which stringifyExact writes back as they came. */
export function parseExact(text: string): unknown {
  return MAYBE_LONG.test(text) ? parse(text, null, { parseNumber, onDuplicateKey: lastOfRepeatedKey }) : JSON.parse(text);
}

/** JSON.stringify, with the numbers parseExact kept written as they were read. */
export function stringifyExact(value: unknown): string {
  const text = JSON.stringify(value);
  return text.includes(NONCE) ? text.replace(TAGGED, '$1') : text;
}
