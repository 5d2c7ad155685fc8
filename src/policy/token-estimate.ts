// What a request reserves of its client's token rate as it is admitted (policy/client-rate.ts reserveTokens), from its
// body alone: no tokenizer, since the estimate is settled against the answer's usage once it comes.
import type { ApiKind } from '../routing/router.ts';
import type { TokenEstimate } from './client-rate.ts';

/** Bytes of a request body per token of the estimate: about what BPE tokenizers average on English text and JSON. */
export const BYTES_PER_TOKEN = 4;

/** The body field that caps the completion, by API; the first one set counts (max_completion_tokens replaced max_tokens). */
const CAP_FIELDS: Record<ApiKind, readonly string[]> = {
  chat: ['max_completion_tokens', 'max_tokens'],
  completions: ['max_tokens'],
  responses: ['max_output_tokens'],
  messages: ['max_tokens'],
  embeddings: [],
  other: ['max_completion_tokens', 'max_tokens', 'max_output_tokens'],
};

/**
 * A request's estimated tokens: the prompt as its whole body's bytes / 4, rounded up (the prompt is most of a body, and
 * the rest, the model's name and the JSON around it, keeps the estimate on the safe side), plus the completion cap the
 * body states, times the choices asked for (`n`, chat and completions). A body without a cap reserves its prompt only:
 * what it will generate is unknown until its usage comes.
 */
export function tokenEstimate(api: ApiKind, bodyBytes: number, json: Readonly<Record<string, unknown>>): TokenEstimate {
  const prompt = Math.ceil(bodyBytes / BYTES_PER_TOKEN);
  const cap = CAP_FIELDS[api].map((f) => json[f]).find((v) => v !== undefined && v !== null);
  if (!isCount(cap)) return { prompt, completion: 0 };
  const n = api === 'chat' || api === 'completions' ? json.n : undefined;
  return { prompt, completion: Math.min(cap * (isCount(n) && n > 1 ? n : 1), MAX_COMPLETION_ESTIMATE) };
}

/**
 * The most a completion cap reserves: ten million tokens, past any model's output limit (providers refuse more). A
 * cap of 1e15 would otherwise set a due time Redis cannot hold as an expiry.
 */
const MAX_COMPLETION_ESTIMATE = 10_000_000;

/** A count a provider would take: a non-negative integer. Anything else is left to the provider to refuse. */
function isCount(v: unknown): v is number {
  return typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;
}
