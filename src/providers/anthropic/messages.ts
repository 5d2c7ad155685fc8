// OpenAI's message list -> Anthropic's top-level `system` plus user/assistant turns. Anthropic has no `tool` role
// (tool results are user content), needs tool calls as content blocks, rejects empty text blocks, and wants turns
// to alternate starting with the user; OpenAI allows all of these. Anything with no Anthropic form throws
// `Inexpressible`, which toAnthropicRequest turns into `{ ok: false }`.
import type {
  AnthropicAssistantBlock,
  AnthropicImageBlock,
  AnthropicImageMediaType,
  AnthropicMessageParam,
  AnthropicTextBlock,
  AnthropicUserBlock,
  OpenAIMessage,
  OpenAITextPart,
} from './types.ts';
import type { ToolNames } from './tool-names.ts';
import { parseExact } from '../exact-json.ts';

/** The request asks for something the Anthropic target cannot do; the message says what, `param` which field. */
export class Inexpressible extends Error {
  constructor(
    message: string,
    readonly param?: string,
  ) {
    super(message);
  }
}

/** What the conversation becomes: the system prompt (if any) and turns that alternate, starting with the user. */
interface AnthropicConversation {
  system: string | undefined;
  messages: AnthropicMessageParam[];
}

const IMAGE_TYPES: ReadonlySet<string> = new Set(['image/jpeg', 'image/png', 'image/gif', 'image/webp']);
// The media type, then parameters each opening with `;`: no two parts of the pattern can take the same characters, so
// a URL that is no such thing fails in one pass (`[^;,]+[^,]*` retried every split of a long one: 50 KB held the
// event loop for seconds, a 10 MB body for hours).
const DATA_URL = /^data:([^;,]+)(?:;[^;,]*)*?;base64,(.*)$/s;
// Anthropic refuses a conversation that opens with the assistant on some platforms (Bedrock, Vertex); a minimal
// user turn keeps such a history (a greeting-first chat UI) sendable without rewriting what the assistant said.
const OPENING_USER_TURN = '.';

/** Translates the whole message list; throws Inexpressible. */
export function toAnthropicConversation(input: unknown, names: ToolNames): AnthropicConversation {
  if (!Array.isArray(input)) throw new Inexpressible('messages must be an array', 'messages');
  const system: string[] = [];
  const turns: AnthropicMessageParam[] = [];
  const ids = new ToolIds();
  for (const [i, raw] of (input as OpenAIMessage[]).entries()) {
    const msg = raw as OpenAIMessage | null;
    switch (msg?.role) {
      case 'system':
      case 'developer': {
        // Anthropic has one system prompt; a late system message joins it (its position in the chat is lost). One
        // with no non-whitespace text says nothing, and Anthropic refuses it (400 "system: text content blocks must
        // contain non-whitespace text"), so it is left out, as whitespace-only text parts are.
        const text = textOf(msg.content, `messages[${i}]`);
        if (text.trim() !== '') system.push(text);
        break;
      }
      case 'user':
        append(turns, 'user', userBlocks(msg.content, `messages[${i}]`));
        break;
      case 'assistant':
        append(turns, 'assistant', assistantBlocks(msg, `messages[${i}]`, ids, names));
        break;
      case 'tool':
        if (typeof msg.tool_call_id !== 'string') throw new Inexpressible(`messages[${i}].tool_call_id must be a string`, `messages[${i}].tool_call_id`);
        append(turns, 'user', [{ type: 'tool_result', tool_use_id: ids.result(msg.tool_call_id), content: toolResultContent(msg.content, i) }]);
        break;
      case 'function':
        throw new Inexpressible(`messages[${i}]: the legacy "function" role is not supported for an Anthropic target; use tools`, `messages[${i}].role`);
      default:
        throw new Inexpressible(`messages[${i}]: unknown role ${JSON.stringify((msg as { role?: unknown } | null)?.role)}`, `messages[${i}].role`);
    }
  }
  trimPrefill(turns);
  if (turns.length === 0) throw new Inexpressible('messages: an Anthropic target needs at least one user or assistant message', 'messages');
  // A last user message with no text, left out, would end the conversation on the assistant's turn, which Anthropic
  // reads as a prefill to continue instead of a question to answer.
  const lastRole = (input as Array<{ role?: unknown } | null>).at(-1)?.role;
  if ((lastRole === 'user' || lastRole === 'tool') && turns.at(-1)?.role === 'assistant') {
    const at = input.length - 1;
    throw new Inexpressible(`messages[${at}].content: an Anthropic target refuses a last message with no text`, `messages[${at}].content`);
  }
  // So would a last system or developer message after the assistant's turn ("now summarize"): it joins the one system
  // prompt, and the conversation ends on the assistant, which Anthropic continues (or, Claude 4.6 on, refuses) where
  // OpenAI writes a new reply that follows the instruction.
  if ((lastRole === 'system' || lastRole === 'developer') && turns.at(-1)?.role === 'assistant') {
    const at = input.length - 1;
    throw new Inexpressible(`messages[${at}]: an Anthropic target cannot answer a ${lastRole} message that follows the assistant's last turn (it would continue that turn); send it before the last assistant message, or add a user message after it`, `messages[${at}]`);
  }
  if (turns[0]?.role === 'assistant') turns.unshift({ role: 'user', content: [{ type: 'text', text: OPENING_USER_TURN }] });
  return { system: system.length > 0 ? system.join('\n\n') : undefined, messages: turns };
}

type Blocks = AnthropicUserBlock[] | AnthropicAssistantBlock[];

/**
 * Tool-call ids as Anthropic takes them: of letters, digits, `_` and `-` (other servers' ids such as
 * `functions.get_weather:0` would be refused with a 400), and each used once in the conversation. Anthropic answers
 * 400 to a repeated one ("`tool_use` ids must be unique"); OpenAI pairs a result with the call before it, and servers
 * that number the calls of each answer (`call_0`) repeat ids from turn to turn. A repeated id gets a suffix, and a
 * tool result takes the oldest unanswered call of its id, so call and result still pair. An empty id (servers that
 * give none) is refused by Anthropic's pattern too, and becomes `call`, paired the same way. One instance per conversation.
 */
class ToolIds {
  readonly #used = new Set<string>();
  /** The client's id -> the ids its calls were given that no result has taken yet, oldest first. */
  readonly #unanswered = new Map<string, string[]>();

  call(id: string): string {
    const base = idCharacters(id) || 'call';
    let given = base;
    for (let n = 2; this.#used.has(given); n++) given = `${base}_${n}`;
    this.#used.add(given);
    const pending = this.#unanswered.get(id);
    if (pending) pending.push(given);
    else this.#unanswered.set(id, [given]);
    return given;
  }

  result(id: string): string {
    return this.#unanswered.get(id)?.shift() ?? idCharacters(id);
  }
}

const idCharacters = (id: string) => id.replace(/[^A-Za-z0-9_-]/g, '_');

/**
 * A conversation that ends on the assistant's turn is a prefill to Anthropic, which refuses one ending in whitespace
 * (400): its last text goes without it, and a turn left with nothing goes altogether.
 */
function trimPrefill(turns: AnthropicMessageParam[]): void {
  const last = turns.at(-1);
  if (last?.role !== 'assistant') return;
  const blocks = last.content as AnthropicAssistantBlock[];
  const tail = blocks.at(-1);
  if (tail?.type !== 'text') return;
  tail.text = tail.text.trimEnd();
  if (tail.text === '') blocks.pop();
  if (blocks.length === 0) turns.pop();
}

/** Adds a turn, merging it into the previous one of the same role: Anthropic wants strict alternation. */
function append(turns: AnthropicMessageParam[], role: 'user' | 'assistant', blocks: Blocks): void {
  if (blocks.length === 0) return; // an empty turn is a 400 upstream and carries nothing
  const last = turns[turns.length - 1];
  if (last?.role === role) {
    (last.content as Array<AnthropicUserBlock | AnthropicAssistantBlock>).push(...blocks);
    // A user turn that answers tool calls must list its tool_result blocks before anything else.
    if (role === 'user') last.content.sort((a, b) => Number(b.type === 'tool_result') - Number(a.type === 'tool_result'));
    return;
  }
  turns.push({ role, content: blocks } as AnthropicMessageParam);
}

function textOf(content: unknown, where: string): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) throw new Inexpressible(`${where}.content must be a string or an array of text parts`, `${where}.content`);
  return content
    .map((part: { type?: unknown; text?: unknown }, j) => {
      if (part?.type !== 'text' || typeof part.text !== 'string') throw new Inexpressible(`${where}.content[${j}] must be a text part`, `${where}.content[${j}]`);
      return part.text;
    })
    .join('\n');
}

/** Anthropic refuses text blocks with no non-whitespace text (400); such a block says nothing, so it is left out. */
function text(t: string): AnthropicTextBlock[] {
  return t.trim().length > 0 ? [{ type: 'text', text: t }] : [];
}

function userBlocks(content: unknown, where: string): AnthropicUserBlock[] {
  if (typeof content === 'string') return text(content);
  if (!Array.isArray(content)) throw new Inexpressible(`${where}.content must be a string or an array of parts`, `${where}.content`);
  return content.flatMap((part: Record<string, unknown> | null, j): AnthropicUserBlock[] => {
    const at = `${where}.content[${j}]`;
    switch (part?.['type']) {
      case 'text':
        if (typeof part['text'] !== 'string') throw new Inexpressible(`${at}.text must be a string`, `${at}.text`);
        return text(part['text']);
      case 'image_url':
        return [imageBlock((part['image_url'] as { url?: unknown } | undefined)?.url, at)];
      case 'file':
        return [pdfBlock(part['file'] as { file_data?: unknown; filename?: unknown } | undefined, at)];
      case 'input_audio':
        throw new Inexpressible(`${at}: audio input is not supported by an Anthropic target`, at);
      default:
        throw new Inexpressible(`${at}: unsupported content part type ${JSON.stringify(part?.['type'])}`, at);
    }
  });
}

function imageBlock(url: unknown, at: string): AnthropicImageBlock {
  if (typeof url !== 'string') throw new Inexpressible(`${at}.image_url.url must be a string`, `${at}.image_url.url`);
  if (/^https?:\/\//i.test(url)) return { type: 'image', source: { type: 'url', url } };
  const m = DATA_URL.exec(url);
  // image/jpg is not a registered type, but common in data: URLs (and accepted by OpenAI): it means image/jpeg.
  const written = m?.[1]?.toLowerCase();
  const data = m?.[2] ?? '';
  // OpenAI reads the image's bytes and ignores a wrong type in the URL (a JPEG sent as data:image/png, common when the
  // type is hard-coded); Anthropic answers 400 "Image does not match the provided media type". The bytes decide.
  const mediaType = imageTypeOf(data) ?? (written === 'image/jpg' ? 'image/jpeg' : written);
  if (!m || mediaType === undefined) throw new Inexpressible(`${at}: an image must be an http(s) URL or a base64 data: URL`, `${at}.image_url.url`);
  if (!IMAGE_TYPES.has(mediaType)) throw new Inexpressible(`${at}: image type ${mediaType} is not supported (jpeg, png, gif, webp)`, `${at}.image_url.url`);
  return { type: 'image', source: { type: 'base64', media_type: mediaType as AnthropicImageMediaType, data } };
}

/** The type an image's first bytes (its signature) say it has, when it is one Anthropic takes. */
function imageTypeOf(base64: string): AnthropicImageMediaType | undefined {
  const head = Buffer.from(base64.slice(0, 16), 'base64'); // 12 bytes: enough for RIFF....WEBP
  const ascii = (from: number, to: number) => head.toString('latin1', from, to);
  if (head[0] === 0x89 && ascii(1, 4) === 'PNG') return 'image/png';
  if (head[0] === 0xff && head[1] === 0xd8 && head[2] === 0xff) return 'image/jpeg';
  if (ascii(0, 4) === 'GIF8') return 'image/gif';
  if (ascii(0, 4) === 'RIFF' && ascii(8, 12) === 'WEBP') return 'image/webp';
  return undefined;
}

// Only inline PDFs have an Anthropic form: an OpenAI file_id points into OpenAI's own file store.
function pdfBlock(file: { file_data?: unknown; filename?: unknown } | undefined, at: string): AnthropicUserBlock {
  const m = typeof file?.file_data === 'string' ? DATA_URL.exec(file.file_data) : null;
  if (!m || m[1]?.toLowerCase() !== 'application/pdf') {
    throw new Inexpressible(`${at}: only inline PDF files (file_data as a base64 data: URL) are supported by an Anthropic target`, `${at}.file`);
  }
  const title = typeof file?.filename === 'string' ? { title: file.filename } : {};
  return { type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: m[2] ?? '' }, ...title };
}

function assistantBlocks(msg: Extract<OpenAIMessage, { role: 'assistant' }>, where: string, ids: ToolIds, names: ToolNames): AnthropicAssistantBlock[] {
  if (msg.function_call != null) throw new Inexpressible(`${where}.function_call (legacy) is not supported; use tool_calls`, `${where}.function_call`);
  if (msg.audio != null) throw new Inexpressible(`${where}.audio is not supported by an Anthropic target`, `${where}.audio`);
  const blocks: AnthropicAssistantBlock[] = [];
  const content = msg.content;
  if (typeof content === 'string') blocks.push(...text(content));
  else if (Array.isArray(content)) {
    for (const [j, part] of content.entries()) {
      // What the assistant refused with is still what it said.
      const t = part?.type === 'text' ? part.text : part?.type === 'refusal' ? part.refusal : undefined;
      if (typeof t !== 'string') throw new Inexpressible(`${where}.content[${j}] must be a text or refusal part`, `${where}.content[${j}]`);
      blocks.push(...text(t));
    }
  } else if (content != null) throw new Inexpressible(`${where}.content must be a string, an array of parts or null`, `${where}.content`);
  if (blocks.length === 0 && typeof msg.refusal === 'string') blocks.push(...text(msg.refusal));
  if (msg.tool_calls != null && !Array.isArray(msg.tool_calls)) throw new Inexpressible(`${where}.tool_calls must be an array`, `${where}.tool_calls`);
  for (const [j, call] of (msg.tool_calls ?? []).entries()) {
    const at = `${where}.tool_calls[${j}]`;
    if (call?.type !== 'function') throw new Inexpressible(`${at}: only function tool calls are supported by an Anthropic target`, `${at}.type`);
    if (typeof call.id !== 'string' || typeof call.function?.name !== 'string') {
      throw new Inexpressible(`${at} needs an id and a function name`, at);
    }
    blocks.push({ type: 'tool_use', id: ids.call(call.id), name: names.of(call.function.name), input: toolInput(call.function.arguments, at) });
  }
  return blocks;
}

// Anthropic takes tool input as a JSON object, OpenAI as a string: a string that is not an object cannot cross.
function toolInput(args: unknown, at: string): Record<string, unknown> {
  if (args === undefined || args === '') return {};
  let parsed: unknown;
  try {
    // Exact: a 64-bit id keeps its digits; the request is written with stringifyExact (families.ts).
    parsed = parseExact(String(args));
  } catch {
    throw new Inexpressible(`${at}.function.arguments is not valid JSON`, `${at}.function.arguments`);
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) {
    throw new Inexpressible(`${at}.function.arguments must be a JSON object`, `${at}.function.arguments`);
  }
  return parsed as Record<string, unknown>;
}

function toolResultContent(content: unknown, i: number): string | AnthropicTextBlock[] {
  if (typeof content === 'string') return content;
  textOf(content, `messages[${i}]`); // only text parts may pass
  const blocks = (content as OpenAITextPart[]).flatMap((p) => text(p.text));
  return blocks.length > 0 ? blocks : '';
}
