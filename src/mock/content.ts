// Deterministic content of the mock's answers: text, token counts, ids, embeddings.
// Everything here is cheap and allocation-light because it runs on every request of a benchmark.
import { randomBytes } from 'node:crypto';
import { seededRandom } from '../policy/random.ts';

/** Characters of the prompt echoed back in an answer. */
const ECHO_CHARS = 40;

/** The answer text for a prompt: the same prompt always gives the same text. */
export function answerText(prompt: string): string {
  return `Mock answer to: ${prompt.slice(0, ECHO_CHARS)}`;
}

/** The text that continues an assistant prefill (Anthropic), deterministic like answerText. */
export function continuationText(prefill: string): string {
  return ` and so the mock continues after ${prefill.length} characters.`;
}

/** Arguments of every mock tool call. */
export const TOOL_ARGUMENTS = '{"x":1}';

/** Splits text into n consecutive pieces (some may be empty when n > text length). */
export function splitText(text: string, n: number): string[] {
  const count = Math.max(1, Math.floor(n));
  const out: string[] = new Array(count);
  for (let i = 0; i < count; i++) {
    out[i] = text.slice(Math.floor((i * text.length) / count), Math.floor(((i + 1) * text.length) / count));
  }
  return out;
}

/** A rough token count (4 characters a token), never 0, so usage numbers look plausible. */
export function countTokens(text: string): number {
  return Math.max(1, Math.ceil(text.length / 4));
}

/**
 * The text cut at a token cap (max_tokens), as a model stops when it reaches one: countTokens of the cut text is the
 * cap, so usage stays consistent. Undefined when there is no cap (absent, not a number, under 1) or the text fits.
 */
export function capText(text: string, maxTokens: unknown): string | undefined {
  if (typeof maxTokens !== 'number' || !(maxTokens >= 1) || countTokens(text) <= maxTokens) return undefined;
  return text.slice(0, Math.floor(maxTokens) * 4);
}

/** Text of a message `content`: a string, or an array of parts with `text` (OpenAI and Anthropic). */
export function contentText(content: unknown): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  let out = '';
  for (const part of content) {
    if (typeof part === 'string') out += part;
    else if (part !== null && typeof part === 'object' && typeof (part as { text?: unknown }).text === 'string') {
      out += (part as { text: string }).text;
    }
  }
  return out;
}

/** Total characters of every message's text, for prompt token counts. */
export function promptChars(messages: unknown): number {
  if (!Array.isArray(messages)) return contentText(messages).length;
  let n = 0;
  for (const m of messages) n += contentText((m as { content?: unknown } | null)?.content).length;
  return n;
}

/** The text of the last message with the given role ('' when there is none). */
export function lastText(messages: unknown, role: string): string {
  if (!Array.isArray(messages)) return '';
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i] as { role?: unknown; content?: unknown } | null;
    if (m?.role === role) return contentText(m.content);
  }
  return '';
}

/**
 * Makes unique ids cheaply: a random per-process prefix plus a counter, instead of
 * random bytes per id (ids only need to be unique, not unguessable).
 */
export function idSource(): (prefix: string) => string {
  const base = randomBytes(6).toString('hex');
  let n = 0;
  return (prefix) => `${prefix}${base}${(n++).toString(16).padStart(10, '0')}`;
}

/** Dimensions of a mock embedding when the request asks for none. */
const EMBEDDING_DIMENSIONS = 8;

/** A deterministic unit vector for a text; values are float32-exact so base64 and float agree. */
export function embeddingOf(text: string, dimensions = EMBEDDING_DIMENSIONS): number[] {
  // FNV-1a over the text seeds the PRNG: same text, same vector.
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193);
  const random = seededRandom(h);
  const v: number[] = new Array(dimensions);
  let norm = 0;
  for (let i = 0; i < dimensions; i++) {
    const x = random() * 2 - 1;
    v[i] = x;
    norm += x * x;
  }
  norm = Math.sqrt(norm) || 1;
  for (let i = 0; i < dimensions; i++) v[i] = Math.fround(v[i]! / norm);
  return v;
}

/** Little-endian float32 base64, the format the openai SDK decodes by default. */
export function float32Base64(v: number[]): string {
  const buf = Buffer.allocUnsafe(v.length * 4);
  for (let i = 0; i < v.length; i++) buf.writeFloatLE(v[i]!, i * 4);
  return buf.toString('base64');
}

/**
 * A value that satisfies a JSON Schema, for structured outputs (OpenAI's `response_format: json_schema`, Anthropic's
 * `output_config.format`): the SDKs' `parse()` helpers JSON.parse and validate the answer, which free text would fail.
 * Covers what zod and pydantic emit: objects, arrays, scalars, enum/const, anyOf/oneOf and local `$ref`s.
 */
export function schemaExample(schema: unknown, root: unknown = schema, depth = 0): unknown {
  if (schema === null || typeof schema !== 'object' || depth > 16) return null;
  const s = schema as Record<string, unknown>;
  if (typeof s['$ref'] === 'string') {
    let target: unknown = root;
    for (const key of s['$ref'].replace(/^#\/?/, '').split('/').filter((k) => k !== '')) target = (target as Record<string, unknown> | null)?.[key];
    return schemaExample(target, root, depth + 1);
  }
  if ('const' in s) return s['const'];
  if (Array.isArray(s['enum']) && s['enum'].length > 0) return s['enum'][0];
  const alt = (s['anyOf'] ?? s['oneOf']) as unknown[] | undefined;
  if (Array.isArray(alt) && alt.length > 0) return schemaExample(alt[0], root, depth + 1);
  const type = Array.isArray(s['type']) ? (s['type'] as unknown[]).find((t) => t !== 'null') : s['type'];
  switch (type) {
    case 'object': {
      const out: Record<string, unknown> = {};
      const props = (s['properties'] ?? {}) as Record<string, unknown>;
      for (const [k, v] of Object.entries(props)) out[k] = schemaExample(v, root, depth + 1);
      return out;
    }
    case 'array':
      return [schemaExample(s['items'], root, depth + 1)];
    case 'string':
      return 'mock';
    case 'integer':
    case 'number':
      return typeof s['minimum'] === 'number' ? s['minimum'] : 1;
    case 'boolean':
      return true;
    default:
      return s['properties'] !== undefined ? schemaExample({ ...s, type: 'object' }, root, depth + 1) : null;
  }
}

/** Chat logprobs for a text, one entry per piece (as OpenAI's `logprobs.content`), with `top` alternatives each. */
export function logprobsOf(text: string, top: number) {
  const tokens = text.match(/\S+\s*|\s+/g) ?? [];
  const entry = (token: string) => ({ token, logprob: -0.01, bytes: [...Buffer.from(token)] });
  return tokens.map((t) => ({ ...entry(t), top_logprobs: Array.from({ length: top }, (_, i) => (i === 0 ? entry(t) : { ...entry(`${t}~${i}`), logprob: -1 - i })) }));
}
