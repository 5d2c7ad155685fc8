// What a request reserves of its client's token rate as it is admitted (policy/client-rate.ts reserveTokens), from its
// body alone: no tokenizer, since the estimate is settled against the answer's usage once it comes.
import type { ApiKind } from '../routing/router.ts';
import type { TokenEstimate } from './client-rate.ts';

/** Bytes of a request body per token of the estimate: about what BPE tokenizers average on English text and JSON. */
export const BYTES_PER_TOKEN = 4;

/**
 * What an image sent inline reserves, whatever its size: about the most a provider counts for one. Anthropic counts
 * width × height / 750 of an image scaled to at most ~1.15 megapixels (1568 px on its long side): ~1,600; OpenAI's
 * high detail counts 85 + 170 a 512 px tile of an image scaled to 2048 × 768 at most: 1,445. Counted by its bytes / 4,
 * a 1 MB image reserved ~262,000 tokens.
 */
export const INLINE_IMAGE_TOKENS = 1_600;

/**
 * Bodies up to this size are estimated by their bytes alone, with no walk: the walk for inline payloads costs a
 * large body little next to its JSON.parse, and a small one has no payload worth discounting (a 48 KiB image at
 * bytes / 4 is 12,000 tokens, its allowance 1,600).
 */
export const INLINE_WALK_FROM_BYTES = 64 * 1024;

/** Strings shorter than this are never taken for an inline payload (nothing to gain; the walk skips them at once). */
const MIN_PAYLOAD_CHARS = 1024;

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
 * A request's estimated tokens: the prompt as its body's bytes / 4, rounded up (the prompt is most of a body, and the
 * rest, the model's name and the JSON around it, keeps the estimate on the safe side; every prompt of a batch is in
 * it), plus the completion cap the body states, times the choices asked for (`n`, chat and completions, and on
 * completions for each prompt of a batch, promptCount). A body without a cap reserves its prompt only:
 * what it will generate is unknown until its usage comes. A body over INLINE_WALK_FROM_BYTES is read for base64
 * payloads sent inline (inlinePayloads): their bytes leave the count, and each adds what a provider counts for it.
 */
export function tokenEstimate(api: ApiKind, bodyBytes: number, json: Readonly<Record<string, unknown>>): TokenEstimate {
  const inline = bodyBytes > INLINE_WALK_FROM_BYTES ? inlinePayloads(json) : undefined;
  const prompt = inline
    ? Math.ceil(Math.max(0, bodyBytes - inline.chars) / BYTES_PER_TOKEN) + inline.tokens
    : Math.ceil(bodyBytes / BYTES_PER_TOKEN);
  const cap = CAP_FIELDS[api].map((f) => json[f]).find((v) => v !== undefined && v !== null);
  if (!isCount(cap)) return { prompt, completion: 0 };
  const n = api === 'chat' || api === 'completions' ? json.n : undefined;
  const choices = (isCount(n) && n > 1 ? n : 1) * (api === 'completions' ? promptCount(json.prompt) : 1);
  return { prompt, completion: Math.min(cap * choices, MAX_COMPLETION_ESTIMATE) };
}

/**
 * The prompts of a legacy completion (`prompt`, /v1/completions): a list of strings or of token lists is a batch,
 * answered with `n` choices for each prompt (index prompt × n + k), in one answer or one stream; anything else (a
 * string, one token list: a list of numbers, a list of mixed kinds the provider refuses) is one prompt.
 */
export function promptsOf(prompt: unknown): readonly unknown[] {
  if (!Array.isArray(prompt) || prompt.length === 0) return [prompt];
  return prompt.every((p) => typeof p === 'string' || Array.isArray(p)) ? prompt : [prompt];
}

/**
 * How many prompts a legacy completion sends (promptsOf): counted as one, a batch's stream ended at its first
 * prompt's finish (streamShapeOf), and its estimate reserved one prompt's completion cap for all.
 */
export function promptCount(prompt: unknown): number {
  return promptsOf(prompt).length;
}

/** tokenEstimate's total: what a target's token rate (pools.tokensPerMinute) counts a request for. */
export function estimatedTokens(api: ApiKind, bodyBytes: number, json: Readonly<Record<string, unknown>>): number {
  const { prompt, completion } = tokenEstimate(api, bodyBytes, json);
  return prompt + completion;
}

/**
 * The base64 payloads a body sends inline, in any API's shape: a `data:` URL (chat's image_url.url, the Responses
 * API's input_image.image_url, file_data of a chat `file` or an input_file), or a `data` / `file_data` string that is
 * all base64 (Anthropic's image or document `source.data`, chat's input_audio.data). `chars`: their length in the
 * body; `tokens`: what they reserve instead, INLINE_IMAGE_TOKENS an image, and a file (a PDF, audio) its decoded
 * bytes / 4: a PDF's pages count as text and an image each (Anthropic: 1,500 to 3,000 tokens a page), more than a
 * text PDF's few KB a page come to at bytes / 4, so a file keeps its size's count (base64's third over it aside).
 * One walk of the parsed body, without recursion (a deeply nested body must not overflow the stack).
 */
function inlinePayloads(json: unknown): { chars: number; tokens: number } {
  let chars = 0;
  let tokens = 0;
  const stack: unknown[] = [json];
  while (stack.length > 0) {
    const v = stack.pop();
    if (typeof v !== 'object' || v === null) continue;
    if (Array.isArray(v)) {
      for (const item of v) if (typeof item === 'object' && item !== null) stack.push(item);
      continue;
    }
    const o = v as Record<string, unknown>;
    for (const key in o) {
      const s = o[key];
      if (typeof s !== 'string') {
        if (typeof s === 'object' && s !== null) stack.push(s);
        continue;
      }
      if (s.length < MIN_PAYLOAD_CHARS) continue;
      const media = mediaOf(s, key, o);
      if (media === undefined) continue;
      chars += s.length;
      tokens += media.startsWith('image/') ? INLINE_IMAGE_TOKENS : Math.ceil((s.length - s.indexOf(',') - 1) * 0.75 / BYTES_PER_TOKEN);
    }
  }
  return { chars, tokens };
}

/** Base64 throughout, padded or not (no spaces: prose fails at its first one). */
const BASE64 = /^[A-Za-z0-9+/]+={0,2}$/;

/**
 * The media type of a base64 payload at `o[key]` (long already): a data URL's own; Anthropic's `media_type` beside
 * `data`; '' when unknown (counted as a file). Undefined: not a payload.
 */
function mediaOf(s: string, key: string, o: Record<string, unknown>): string | undefined {
  if (s.startsWith('data:')) {
    const comma = s.indexOf(',');
    if (comma === -1 || comma > 256 || !s.slice(0, comma).endsWith(';base64')) return undefined;
    return s.slice(5, s.indexOf(';')).toLowerCase();
  }
  if ((key !== 'data' && key !== 'file_data') || !BASE64.test(s)) return undefined;
  return typeof o.media_type === 'string' ? o.media_type.toLowerCase() : '';
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
