// Is a whole 2xx body the answer its API promises? JSON where a stream was asked for, a captive portal's HTML, an
// empty or cut body, an error delivered with a 200 (some routers do that) or JSON with no choice in it is not: passed
// on, the SDKs would return garbage, crash on `choices[0]` or end a stream with no chunks and no error. Judged from
// the content-type and the bytes, never by a second JSON.parse of every answer. Paths the gateway does not know
// (api "other") may answer anything.
// A body whose length the transport never knew (no content-length, not chunked: it ends when the connection does)
// arrives "whole" however early the connection closed; so does one its server cut and framed as whole (a proxy that
// truncates an answer and writes its own content-length, a chunked answer ended cleanly after its writer failed).
// Cut after a nested object's `}`, it still begins with `{` and ends with `}`: only the brackets outside strings,
// counted, tell (jsonEnd, with the bytes' own indexOf; a 3 MB embeddings answer takes about 0.5 ms, JSON.parse of it
// over 20 ms).
import type { ApiKind } from '../routing/router.ts';
import { bomLength } from '../http/byte-order-mark.ts';
import { stoppedInBytes, stoppedMessage } from '../streaming/stream-events.ts';

/** The APIs whose `stream: true` makes the provider answer with server-sent events; all of them answer JSON otherwise. */
const STREAMING_APIS: ReadonlySet<ApiKind> = new Set(['chat', 'completions', 'responses', 'messages']);

/** The top-level field every answer of the API carries; APIs not listed are not judged beyond being JSON. */
const ANSWER_FIELD: Partial<Record<ApiKind, string>> = {
  chat: '"choices"',
  completions: '"choices"',
  embeddings: '"data"',
  responses: '"output"',
  messages: '"content"',
};

/** A list that must not be empty (a Responses `output` may be, while the response is queued). */
const NON_EMPTY: ReadonlySet<string> = new Set(['"choices"']);
/**
 * Fields that must hold a list, not `null`: some routers answer a 200 with `{"choices": null, "error": {...}}`, and
 * the SDK returns it as a completion whose `choices[0]` throws. (A Responses `output` key may also occur earlier in
 * `instructions`, as a function_call_output's string, so only these are checked.)
 */
const LIST: ReadonlySet<string> = new Set(['"choices"', '"data"']);

const WHITESPACE = new Set([0x20, 0x09, 0x0a, 0x0d]);

interface AnswerContext {
  api: ApiKind;
  /** The client asked for a stream (and got a whole body). */
  stream: boolean;
  contentType: string | undefined;
  /** The body is in the OpenAI shape the client expects (for another family, the translator judges the fields). */
  ownFamily: boolean;
}

/**
 * Why a 2xx body is not an answer. `ran`: it is the start of an answer cut before its end (the provider ran the
 * request), as opposed to something else altogether (a proxy's page, an error, an empty body).
 */
interface NotAnAnswer {
  detail: string;
  ran: boolean;
}

/** Why `body` is not an answer, or undefined when it looks like one. */
export function notAnAnswer({ api, stream, contentType, ownFamily }: AnswerContext, body: Buffer): NotAnAnswer | undefined {
  if (api === 'other') return undefined;
  if (stream && STREAMING_APIS.has(api)) return not(`a stream was asked for and the upstream answered ${contentType ?? 'without a content-type'}`);
  // A byte order mark before the object is no reason to refuse the answer (the client gets it without, attempt.ts).
  const first = skipSpace(body, bomLength(body));
  let last = body.length - 1;
  while (last > first && WHITESPACE.has(body[last]!)) last--;
  // The bytes decide, not the label: a whole completion some servers label `text/plain` (or send without a
  // content-type) is the answer, which the client gets as `application/json`; refused for its label, it was run and
  // billed once per attempt and the client got a 502. The label only names what a body that is no object is.
  if (contentType !== undefined && !contentType.includes('json') && body[first] !== 0x7b) return not(`the upstream answered ${contentType.split(';')[0]}, not JSON`);
  if (first >= body.length) return not('the upstream answered with an empty body');
  if (body[first] !== 0x7b) return not('the upstream answer is not a whole JSON object');
  // Another family's answer is parsed by its translator anyway, which refuses a cut one: no scan for it. A framed body
  // is scanned too: its framing says the server sent all it meant to, not that it meant to send a whole answer, and a
  // cut one ending in `}` reached the SDK as a SyntaxError, no retry, logged as a success.
  if (ownFamily) {
    const end = jsonEnd(body, first, last);
    if (end === -1) return { detail: 'the upstream answer was cut before its end: its JSON object never closes', ran: true };
    if (end !== last) return not('the upstream answer is not a whole JSON object');
  } else if (body[last] !== 0x7d) {
    return not('the upstream answer is not a whole JSON object');
  }
  const missing = ownFamily ? missingField(api, body) : undefined;
  if (missing !== undefined) return not(missing);
  // An answer its server stopped short (vLLM's abort when its engine stopped the request, DeepSeek's
  // insufficient_system_resource, OpenRouter's and Mistral's error): what it had so far, with a finish_reason that is
  // no OpenAI value (stream-events.ts STOPPED). Passed on, the SDK returned the part (or nothing) as a whole completion.
  const stopped = ownFamily && (api === 'chat' || api === 'completions') ? stoppedInBytes(body) : undefined;
  if (stopped !== undefined) return { detail: stoppedMessage(stopped), ran: true };
  return undefined;
}

const not = (detail: string): NotAnAnswer => ({ detail, ran: false });

/**
 * A whole Responses API answer whose own `status` is `failed`, parsed; undefined for any other. It is the non-stream
 * form of `response.failed` (a 200 with `output: []` and the reason in `error`): passed on, the SDK returns it as a
 * result, and an agent reads an empty turn where a stream's failure would have been retried. Only a body that says
 * "failed" somewhere is parsed, and only its top-level status counts: a web or file search item fails on its own.
 */
export function failedResponse(api: ApiKind, body: Buffer): Record<string, unknown> | undefined {
  if (api !== 'responses' || body.indexOf('"failed"') === -1) return undefined;
  try {
    const parsed = JSON.parse(body.toString('utf8')) as { status?: unknown } | null;
    return parsed !== null && typeof parsed === 'object' && parsed.status === 'failed' ? parsed : undefined;
  } catch {
    return undefined;
  }
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
/** `"` first: a string hides the brackets in it. Then the openers `{` `[`, then the closers `}` `]`. */
const STRUCTURAL = [QUOTE, 0x7b, 0x5b, 0x7d, 0x5d] as const;

/**
 * Where the JSON value that opens at `first` closes, looking no further than `last`; -1 when it does not close by
 * then (a cut body). Brackets are counted outside strings only. It jumps from one structural byte to the next with
 * Buffer.indexOf (memchr): a byte-by-byte loop takes 30 times as long on the digits of an embeddings answer.
 */
export function jsonEnd(body: Buffer, first: number, last: number): number {
  const view = body.subarray(0, last + 1);
  // The next position of each STRUCTURAL byte, or -1 when none is left.
  const next = STRUCTURAL.map((b) => view.indexOf(b, first));
  let depth = 0;
  for (;;) {
    let kind = -1;
    let at = view.length;
    for (let k = 0; k < next.length; k++) {
      const p = next[k]!;
      if (p !== -1 && p < at) {
        at = p;
        kind = k;
      }
    }
    if (kind === -1) return -1;
    if (kind === 0) {
      // indexOf leaps over a long string without escapes (base64 embeddings); once an escaped quote shows the string
      // has them (JSON inside a tool call's arguments), a loop over its bytes beats one indexOf call per quote.
      let close = view.indexOf(QUOTE, at + 1);
      if (close !== -1 && escaped(view, close)) close = closingQuote(view, close + 1);
      if (close === -1) return -1;
      for (let k = 0; k < next.length; k++) if (next[k] !== -1 && next[k]! <= close) next[k] = view.indexOf(STRUCTURAL[k]!, close + 1);
      continue;
    }
    depth += kind <= 2 ? 1 : -1;
    if (depth === 0) return at;
    next[kind] = view.indexOf(STRUCTURAL[kind]!, at + 1);
  }
}

/** The quote that ends a string whose bytes from `from` on are read one by one, or -1. */
function closingQuote(body: Buffer, from: number): number {
  for (let i = from; i < body.length; i++) {
    const b = body[i];
    if (b === BACKSLASH) i++;
    else if (b === QUOTE) return i;
  }
  return -1;
}

/** Is the quote at `at` escaped: preceded by an odd run of backslashes? */
function escaped(body: Buffer, at: number): boolean {
  let i = at - 1;
  while (i >= 0 && body[i] === BACKSLASH) i--;
  return (at - 1 - i) % 2 === 1;
}

function missingField(api: ApiKind, body: Buffer): string | undefined {
  const field = ANSWER_FIELD[api];
  if (field === undefined) return undefined;
  const name = field.slice(1, -1);
  let at = body.indexOf(field);
  if (at === -1) return body.includes('"error"') ? 'the upstream answered 2xx with an error, not an answer' : `the upstream answer has no ${name}`;
  let list = listAt(body, at + field.length);
  // The same quoted word as a string value (a model or deployment named `data`) is not the key: the key is the first
  // occurrence a colon follows. A normal answer's first occurrence is its key, so this costs it nothing.
  while (list === 'value') {
    at = body.indexOf(field, at + field.length);
    list = at === -1 ? 'none' : listAt(body, at + field.length);
  }
  if (LIST.has(field) && list === 'none') {
    return body.includes('"error"') ? 'the upstream answered 2xx with an error, not an answer' : `the upstream answer's ${name} are not a list`;
  }
  if (NON_EMPTY.has(field) && list === 'empty') return `the upstream answer's ${name} are empty`;
  return undefined;
}

/** What follows at `from`: `: [ ]` (empty), `: [` and more (a list), no colon (a string value), or anything else (none). */
function listAt(body: Buffer, from: number): 'empty' | 'list' | 'none' | 'value' {
  let i = skipSpace(body, from);
  if (body[i] !== 0x3a) return 'value';
  i = skipSpace(body, i + 1);
  if (body[i] !== 0x5b) return 'none';
  return body[skipSpace(body, i + 1)] === 0x5d ? 'empty' : 'list';
}

function skipSpace(body: Buffer, from: number): number {
  let i = from;
  while (i < body.length && WHITESPACE.has(body[i]!)) i++;
  return i;
}
