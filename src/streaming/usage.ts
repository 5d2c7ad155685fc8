// Token usage from an answer (whole, or a stream's usage event), so cost dashboards bill the target that answered.

export interface Usage {
  prompt: number;
  completion: number;
}

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
  if (!u || typeof u !== 'object') return undefined;
  const cached = u.prompt_tokens === undefined ? tokens(u.cache_read_input_tokens) + tokens(u.cache_creation_input_tokens) : 0;
  return countable(tokens(u.prompt_tokens ?? u.input_tokens) + cached, tokens(u.completion_tokens ?? u.output_tokens));
}

/**
 * A token count as the metrics can add it: a finite number, at least 0; NaN otherwise, which makes the usage none. The
 * tokens counter throws on a negative or infinite increment, and the request then had no log line and no metrics.
 */
function tokens(v: unknown): number {
  const n = Number(v ?? 0);
  return Number.isFinite(n) && n >= 0 ? n : Number.NaN;
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

const USAGE_FIELDS = /"(prompt_tokens|completion_tokens|input_tokens|output_tokens|cache_read_input_tokens|cache_creation_input_tokens)"\s*:\s*(\d+)/g;

/**
 * Usage from a whole answer's body; undefined for bodies that carry none. Read from the usage object's text rather
 * than by parsing the whole answer, which would cost every request a second JSON.parse of its body.
 */
export function usageOfBody(body: Buffer): Usage | undefined {
  // The last "usage" key is the answer's in every API (it comes after the echoed tools, whose schemas may name a
  // property so); but the Responses API echoes the request's metadata after it, whose keys are the client's: a
  // `"usage": "nightly-eval"` there held no counts, and the answer was billed nothing. A few keys back, no more.
  let at = body.lastIndexOf('"usage"');
  for (let tries = 0; at !== -1 && tries < USAGE_KEYS_TRIED; tries++) {
    const usage = usageAt(body, at);
    if (usage !== undefined) return usage;
    at = at === 0 ? -1 : body.lastIndexOf('"usage"', at - 1);
  }
  return undefined;
}

const USAGE_KEYS_TRIED = 4;

/** Usage from the object after the `"usage"` key at `at`; undefined when it holds no counts. */
function usageAt(body: Buffer, at: number): Usage | undefined {
  const text = body.toString('utf8', at, Math.min(body.length, at + 600));
  let prompt: number | undefined;
  let completion: number | undefined;
  // Anthropic's prompt-cache counts, apart from its input_tokens (see usageOf).
  const cache = { cache_read_input_tokens: undefined as number | undefined, cache_creation_input_tokens: undefined as number | undefined };
  for (const m of text.matchAll(USAGE_FIELDS)) {
    if (m[1] === 'prompt_tokens' || m[1] === 'input_tokens') prompt ??= Number(m[2]);
    else if (m[1] === 'cache_read_input_tokens' || m[1] === 'cache_creation_input_tokens') cache[m[1]] ??= Number(m[2]);
    else completion ??= Number(m[2]);
  }
  const cached = text.includes('"prompt_tokens"') ? 0 : (cache.cache_read_input_tokens ?? 0) + (cache.cache_creation_input_tokens ?? 0);
  if (prompt === undefined && completion === undefined && cached === 0) return undefined;
  // Digits enough to pass Number.MAX_VALUE are Infinity.
  return countable((prompt ?? 0) + cached, completion ?? 0);
}
