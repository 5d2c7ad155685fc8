// Is a whole 2xx body the answer its API promises? JSON where a stream was asked for, a captive portal's HTML, an
// empty or cut body, an error delivered with a 200 (some routers do that) or JSON with no choice in it is not: passed
// on, the SDKs would return garbage, crash on `choices[0]` or end a stream with no chunks and no error. Judged from
// the content-type and the bytes, never by a second JSON.parse of every answer. Paths the gateway does not know
// (api "other") may answer anything.
import type { ApiKind } from '../routing/router.ts';

/** The APIs whose `stream: true` makes the provider answer with server-sent events; all four answer JSON otherwise. */
const STREAMING_APIS: ReadonlySet<ApiKind> = new Set(['chat', 'completions', 'responses']);

/** The top-level field every answer of the API carries; APIs not listed are not judged beyond being JSON. */
const ANSWER_FIELD: Partial<Record<ApiKind, string>> = {
  chat: '"choices"',
  completions: '"choices"',
  embeddings: '"data"',
  responses: '"output"',
};

/** A list that must not be empty (a Responses `output` may be, while the response is queued). */
const NON_EMPTY: ReadonlySet<string> = new Set(['"choices"']);

const WHITESPACE = new Set([0x20, 0x09, 0x0a, 0x0d]);

export interface AnswerContext {
  api: ApiKind;
  /** The client asked for a stream (and got a whole body). */
  stream: boolean;
  contentType: string | undefined;
  /** The body is in the OpenAI shape the client expects (for another family, the translator judges the fields). */
  ownFamily: boolean;
}

/** Why `body` is not an answer, or undefined when it looks like one. */
export function notAnAnswer({ api, stream, contentType, ownFamily }: AnswerContext, body: Buffer): string | undefined {
  if (api === 'other') return undefined;
  if (stream && STREAMING_APIS.has(api)) return `a stream was asked for and the upstream answered ${contentType ?? 'without a content-type'}`;
  if (contentType !== undefined && !contentType.includes('json')) return `the upstream answered ${contentType.split(';')[0]}, not JSON`;
  const first = skipSpace(body, 0);
  let last = body.length - 1;
  while (last > first && WHITESPACE.has(body[last]!)) last--;
  if (first >= body.length) return 'the upstream answered with an empty body';
  if (body[first] !== 0x7b || body[last] !== 0x7d) return 'the upstream answer is not a whole JSON object';
  return ownFamily ? missingField(api, body) : undefined;
}

function missingField(api: ApiKind, body: Buffer): string | undefined {
  const field = ANSWER_FIELD[api];
  if (field === undefined) return undefined;
  const name = field.slice(1, -1);
  const at = body.indexOf(field);
  if (at === -1) return body.includes('"error"') ? 'the upstream answered 2xx with an error, not an answer' : `the upstream answer has no ${name}`;
  if (NON_EMPTY.has(field) && emptyListAt(body, at + field.length)) return `the upstream answer's ${name} are empty`;
  return undefined;
}

/** Does `: [ ]` follow at `from`? */
function emptyListAt(body: Buffer, from: number): boolean {
  let i = skipSpace(body, from);
  if (body[i] !== 0x3a) return false;
  i = skipSpace(body, i + 1);
  if (body[i] !== 0x5b) return false;
  return body[skipSpace(body, i + 1)] === 0x5d;
}

function skipSpace(body: Buffer, from: number): number {
  let i = from;
  while (i < body.length && WHITESPACE.has(body[i]!)) i++;
  return i;
}
