// Token usage from an answer (whole, or a stream's usage event), so cost dashboards bill the target that answered.

export interface Usage {
  prompt: number;
  completion: number;
}

/** The fields a usage counts tokens in, in any of the APIs. */
const COUNT_KEYS = ['prompt_tokens', 'completion_tokens', 'input_tokens', 'output_tokens', 'cache_read_input_tokens', 'cache_creation_input_tokens'];

/**
 * Usage from a parsed answer or event: chat/completions/embeddings (`prompt_tokens`), Responses and Anthropic
 * (`input_tokens`; an Anthropic stream's message_start holds it in `message`). Anthropic counts the prompt tokens read
 * from and written to its prompt cache apart from `input_tokens` (an agent's cached turn: a few input tokens, tens of
 * thousands read from the cache); they are prompt tokens billed all the same, as the chat translation counts them.
 */
export function usageOf(parsed: unknown): Usage | undefined {
  type Holder = { usage?: Record<string, unknown> | null };
  const p = parsed as (Holder & { response?: Holder; message?: Holder }) | null;
  const u = p?.usage ?? p?.response?.usage ?? p?.message?.usage;
  // A usage whose counts are all null or absent (`{}`) reports nothing: no usage, not a free answer of 0 tokens.
  if (!u || typeof u !== 'object' || !COUNT_KEYS.some((k) => u[k] != null)) return undefined;
  const cached = u.prompt_tokens === undefined ? tokens(u.cache_read_input_tokens) + tokens(u.cache_creation_input_tokens) : 0;
  return countable(tokens(u.prompt_tokens ?? u.input_tokens) + cached, tokens(u.completion_tokens ?? u.output_tokens));
}

/**
 * A token count as the metrics can add it: a number from 0 to 2^53; NaN otherwise, which makes the usage none. The
 * tokens counter throws on a negative or infinite increment, and the request then had no log line and no metrics; and
 * past 2^53 (a server's `1e20`) a double no longer holds every integer: the target's counter, once there, counted no
 * later answer's few thousand tokens again, and the client's token rate was held for ever.
 */
function tokens(v: unknown): number {
  const n = Number(v ?? 0);
  return n >= 0 && n <= Number.MAX_SAFE_INTEGER ? n : Number.NaN;
}

function countable(prompt: number, completion: number): Usage | undefined {
  return Number.isFinite(prompt) && Number.isFinite(completion) ? { prompt, completion } : undefined;
}

/**
 * A stream's usage so far, given the usage in its latest event. Counts only grow: an Anthropic stream reports its
 * input in message_start and its output in message_delta (whose input count may be missing, read as 0).
 */
export function laterUsage(before: Usage | undefined, latest: Usage | undefined): Usage | undefined {
  if (!before || !latest) return latest ?? before;
  return { prompt: Math.max(before.prompt, latest.prompt), completion: Math.max(before.completion, latest.completion) };
}

/**
 * Usage from a whole answer's body; undefined for bodies that carry none. Only the usage object's text is parsed, not
 * the whole answer, which would cost every request a second JSON.parse of its body; and it is read as a stream's
 * usage is (usageOf): a regex of digits read `"prompt_tokens": -5` or `"NaN"` as no prompt (the client charged its
 * completion alone, its prompt's estimate given back) and `1e20` as 1, where the same usage streamed is none.
 */
export function usageOfBody(body: Buffer): Usage | undefined {
  // The last "usage" key is the answer's in every API (it comes after the echoed tools, whose schemas may name a
  // property so); but the Responses API echoes the request's metadata after it, whose keys are the client's: a
  // `"usage": "nightly-eval"` there held no counts, and the answer was billed nothing. A few keys back, no more.
  let at = body.lastIndexOf(USAGE_KEY);
  for (let tries = 0; at !== -1 && tries < USAGE_KEYS_TRIED; tries++) {
    const usage = usageAt(body, at);
    if (usage !== NO_COUNTS) return usage;
    at = at === 0 ? -1 : body.lastIndexOf(USAGE_KEY, at - 1);
  }
  return undefined;
}

const USAGE_KEYS_TRIED = 4;
const USAGE_KEY = '"usage"';
/** The longest usage object read (OpenAI's with every detail, pretty-printed, is about 500 bytes). */
const USAGE_OBJECT_MAX_BYTES = 4096;
/** A `"usage"` key whose value holds no counts (a string, null, a tool schema's property): an earlier key may be the answer's. */
const NO_COUNTS = Symbol('no counts');

/** Usage from the object after the `"usage"` key at `at` (undefined when its counts are none a counter can take). */
function usageAt(body: Buffer, at: number): Usage | undefined | typeof NO_COUNTS {
  const from = at + USAGE_KEY.length;
  const text = body.toString('utf8', from, Math.min(body.length, from + USAGE_OBJECT_MAX_BYTES));
  const open = /^\s*:\s*\{/.exec(text);
  if (!open) return NO_COUNTS;
  const end = objectEnd(text, open[0].length - 1);
  if (end === -1) return NO_COUNTS;
  let usage: unknown;
  try {
    usage = JSON.parse(text.slice(open[0].length - 1, end + 1));
  } catch {
    return NO_COUNTS;
  }
  if (!COUNT_KEYS.some((k) => Object.hasOwn(usage as object, k))) return NO_COUNTS;
  return usageOf({ usage });
}

/** The index of the `}` that closes the object opened at `from`, its brackets counted outside strings; -1 if none. */
function objectEnd(text: string, from: number): number {
  let depth = 0;
  let inString = false;
  for (let i = from; i < text.length; i++) {
    const c = text[i];
    if (inString) {
      if (c === '\\') i++;
      else if (c === '"') inString = false;
    } else if (c === '"') inString = true;
    else if (c === '{' || c === '[') depth++;
    else if ((c === '}' || c === ']') && --depth === 0) return i;
  }
  return -1;
}
