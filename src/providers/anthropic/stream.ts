// Anthropic's named SSE events -> OpenAI chat.completion.chunk events, one upstream event at a time.
// Anthropic numbers content blocks (text, thinking, tool_use, ...) in one sequence; OpenAI numbers tool calls
// alone, so the translator keeps a map from block index to what the block is. It never invents a clean end:
// a stream cut before message_delta/message_stop is left for the gateway's live stream to end with its error event.
import { parseExact, stringifyExact } from '../exact-json.ts';
import { clientToolName, completionId, reportsUsage, toFinishReason, toOpenAIError, toOpenAIUsage } from './response.ts';
import type { AnthropicUsage, OpenAIChatCompletionChunk, OpenAIChunkDelta, OpenAIFinishReason } from './types.ts';

type AnthropicStreamErrorCode = 'malformed_event' | 'unexpected_event';

/** An upstream event the translator cannot read; the gateway treats it as a malformed event (a broken stream). */
export class AnthropicStreamError extends Error {
  constructor(
    readonly code: AnthropicStreamErrorCode,
    message: string,
  ) {
    super(message);
    this.name = 'AnthropicStreamError';
  }
}

interface AnthropicStreamOptions {
  /** Used until message_start names the answering model, and if it never does. */
  model?: string;
  /** The client asked for stream_options.include_usage: send a usage chunk before [DONE], if the upstream reported usage. */
  includeUsage: boolean;
  /** Anthropic's name -> the client's, for tool names respelled for Anthropic (toAnthropicRequest's `toolNames`). */
  toolNames?: ReadonlyMap<string, string>;
  /** Chunk id; default `chatcmpl-` + the Anthropic message id. */
  id?: string;
  /** Unix seconds; default now. */
  created?: number;
}

/** A tool_use block is `open` from its content_block_start to its content_block_stop: its input may be incomplete. */
type Block = { kind: 'text' | 'thinking' | 'other' } | { kind: 'tool'; toolIndex: number; args: boolean; input: unknown; open: boolean };

interface Data {
  type?: unknown;
  index?: unknown;
  message?: { id?: unknown; model?: unknown; usage?: AnthropicUsage };
  content_block?: { type?: unknown; id?: unknown; name?: unknown; input?: unknown; text?: unknown; thinking?: unknown };
  delta?: { type?: unknown; text?: unknown; partial_json?: unknown; thinking?: unknown; stop_reason?: unknown };
  usage?: AnthropicUsage;
  error?: unknown;
}

const DONE = 'data: [DONE]\n\n';
// Sent for Anthropic's ping so that the gateway's idle timer sees the stream is alive; SSE readers skip comments.
const PING = ': ping\n\n';

/** Translates Anthropic stream events into OpenAI chunk SSE text. One instance per upstream stream. */
export class AnthropicStreamTranslator {
  readonly #includeUsage: boolean;
  readonly #toolNames: ReadonlyMap<string, string> | undefined;
  readonly #created: number;
  #id: string | undefined;
  #model: string;
  #started = false;
  #finish: OpenAIFinishReason | null = null;
  #over = false;
  /** An event could not be read (push threw): a message_stop with no stop_reason before it is then no clean end. */
  #unreadable = false;
  #tools = 0;
  readonly #blocks = new Map<number, Block>();
  #usage: AnthropicUsage = {};

  constructor(opts: AnthropicStreamOptions) {
    this.#includeUsage = opts.includeUsage;
    this.#toolNames = opts.toolNames;
    this.#id = opts.id;
    this.#model = opts.model ?? '';
    this.#created = opts.created ?? Math.floor(Date.now() / 1000);
  }

  /**
   * The upstream's usage so far (message_start's, updated by message_delta's), in Anthropic's terms; undefined while
   * it has reported none (before message_start, or from a proxy that leaves usage out), not zero tokens.
   */
  get usage(): AnthropicUsage | undefined {
    return reportsUsage(this.#usage) ? this.#usage : undefined;
  }

  /** Takes one upstream event; returns the complete SSE events (`data: ...\n\n`) to send, possibly none. */
  push(event: { event: string | null; data: string | null }): string[] {
    if (this.#over || event.data === null) return [];
    try {
      return this.#push(event as { event: string | null; data: string });
    } catch (err) {
      this.#unreadable = true;
      throw err;
    }
  }

  #push(event: { event: string | null; data: string }): string[] {
    let data: Data;
    try {
      data = parseExact(event.data) as Data; // a tool input given whole keeps its digits (#blockStop)
    } catch {
      throw new AnthropicStreamError('malformed_event', `malformed ${event.event ?? 'unnamed'} event: ${event.data.slice(0, 200)}`);
    }
    if (typeof data !== 'object' || data === null || Array.isArray(data)) {
      throw new AnthropicStreamError('malformed_event', `the ${event.event ?? 'unnamed'} event's data is not a JSON object`);
    }
    const type = typeof data.type === 'string' ? data.type : event.event;
    switch (type) {
      case 'message_start':
        return this.#start(data);
      case 'content_block_start':
        return this.#blockStart(data);
      case 'content_block_delta':
        return this.#blockDelta(data);
      case 'content_block_stop':
        return this.#blockStop(data);
      case 'message_delta':
        return this.#messageDelta(data);
      case 'message_stop':
        return this.#stop();
      case 'ping':
        return [PING];
      case 'error':
        return this.#error(data);
      default:
        // An error object in data without a type is an error all the same: a proxy in front of Anthropic may write it
        // so (`{"error": {...}}`, no `event:` line); dropped, the stream stalled until a timeout that named no overload.
        if (typeof data.type !== 'string' && data.error != null) return this.#error(data);
        return []; // Anthropic may add event types within an API version; ignoring them is the documented contract
    }
  }

  #error(data: Data): string[] {
    this.#over = true;
    return [`data: ${JSON.stringify({ error: toOpenAIError(0, data).body.error })}\n\n`];
  }

  /** Call when the upstream stream ends: completes an answer that finished without its message_stop. */
  end(): string[] {
    if (this.#over || this.#finish === null) return [];
    return this.#stop();
  }

  #start(data: Data): string[] {
    const msg = data.message ?? {};
    this.#id ??= completionId(msg.id);
    if (typeof msg.model === 'string' && msg.model !== '') this.#model = msg.model;
    this.#usage = { ...msg.usage };
    return this.#role();
  }

  // The first chunk OpenAI sends carries only the role; clients (and the gateway) expect it before any content.
  #role(): string[] {
    if (this.#started) return [];
    this.#started = true;
    return [this.#chunk({ role: 'assistant', content: '' })];
  }

  #blockStart(data: Data): string[] {
    const index = blockIndex(data);
    const block = data.content_block ?? {};
    const out = this.#role();
    if (block.type === 'tool_use') {
      const toolIndex = this.#tools++;
      this.#blocks.set(index, { kind: 'tool', toolIndex, args: false, input: block.input, open: true });
      const fn = { name: clientToolName(block.name, this.#toolNames), arguments: '' };
      out.push(this.#chunk({ tool_calls: [{ index: toolIndex, id: String(block.id), type: 'function', function: fn }] }));
    } else if (block.type === 'text' || block.type === 'thinking') {
      this.#blocks.set(index, { kind: block.type });
      const initial = block.type === 'text' ? block.text : block.thinking;
      if (typeof initial === 'string' && initial !== '') {
        out.push(this.#chunk(block.type === 'text' ? { content: initial } : { reasoning_content: initial }));
      }
    } else {
      this.#blocks.set(index, { kind: 'other' }); // redacted thinking, server tools: no chat.completions form
    }
    return out;
  }

  #blockDelta(data: Data): string[] {
    const delta = data.delta ?? {};
    const block = this.#blocks.get(blockIndex(data));
    const out = this.#role();
    if (delta.type === 'text_delta' && typeof delta.text === 'string' && delta.text !== '') {
      out.push(this.#chunk({ content: delta.text }));
    } else if (delta.type === 'thinking_delta' && typeof delta.thinking === 'string' && delta.thinking !== '') {
      out.push(this.#chunk({ reasoning_content: delta.thinking }));
    } else if (delta.type === 'input_json_delta') {
      // A server tool's block (server_tool_use) streams its input too; it has no chat.completions form, like the block.
      if (block?.kind === 'other') return out;
      // Arguments with nowhere to go would silently corrupt a tool call: better to fail the stream.
      if (block?.kind !== 'tool') {
        throw new AnthropicStreamError('unexpected_event', `input_json_delta for block ${String(data.index)}, which is not a tool_use block`);
      }
      if (typeof delta.partial_json === 'string' && delta.partial_json !== '') {
        block.args = true;
        out.push(this.#chunk({ tool_calls: [{ index: block.toolIndex, function: { arguments: delta.partial_json } }] }));
      }
    }
    return out; // signature_delta and citations_delta have no chat.completions form
  }

  #blockStop(data: Data): string[] {
    const block = this.#blocks.get(blockIndex(data));
    if (block?.kind === 'tool') block.open = false;
    // A tool without parameters streams no input at all; OpenAI clients JSON.parse the arguments, so send "{}".
    if (block?.kind !== 'tool' || block.args) return [];
    block.args = true;
    const input = block.input !== null && typeof block.input === 'object' ? block.input : {};
    return [this.#chunk({ tool_calls: [{ index: block.toolIndex, function: { arguments: stringifyExact(input) } }] })];
  }

  #messageDelta(data: Data): string[] {
    const u = data.usage ?? {};
    // message_delta usage is cumulative; a null field means "unchanged since message_start". Counts only grow: an
    // Anthropic-compatible server that writes `input_tokens: 0` there (SGLang did, on purpose) does not undo the input
    // message_start reported, which billed the prompt as 0 tokens (laterUsage reads a native stream the same way).
    const usage = this.#usage as Record<string, unknown>;
    for (const [key, value] of Object.entries(u)) {
      if (value == null) continue;
      const before = usage[key];
      usage[key] = typeof value === 'number' && typeof before === 'number' ? Math.max(before, value) : value;
    }
    const stop = data.delta?.stop_reason;
    if (typeof stop !== 'string' || this.#finish !== null) return [];
    this.#finish = toFinishReason(stop);
    return [...this.#role(), this.#chunk({}, this.#finish)];
  }

  #stop(): string[] {
    this.#over = true;
    // A message_stop with no stop_reason while a tool_use block is still open (no content_block_stop): its input may
    // be cut anywhere. Made up as a finish, the client got a call with half its arguments as a whole answer, which an
    // agent would run; with no [DONE] either, the gateway's live stream ends it as the cut it is.
    if (this.#finish === null && [...this.#blocks.values()].some((b) => b.kind === 'tool' && b.open)) return [];
    const out = this.#role();
    // No message_delta came (a server that sends none): the answer stopped, unless an event that could not be read
    // (that message_delta, cut or garbled, or an error written as text) went before: then no finish is made up, and
    // the [DONE] with none before it is a cut for the gateway's live stream, not an answer ended well.
    if (this.#finish === null && !this.#unreadable) {
      this.#finish = 'stop';
      out.push(this.#chunk({}, 'stop'));
    }
    // Only usage the upstream reported: a usage chunk of zeros reads as a real usage of 0 tokens (reportsUsage). The
    // client then has none, as from an OpenAI-compatible server that sends no usage chunk despite include_usage.
    const usage = this.usage;
    if (this.#includeUsage && usage) out.push(this.#frame({ ...this.#base(), choices: [], usage: toOpenAIUsage(usage) }));
    out.push(DONE);
    return out;
  }

  #base(): Omit<OpenAIChatCompletionChunk, 'choices'> {
    // Every chunk of one answer carries the same id, one made for it if no message_start named it.
    const id = (this.#id ??= completionId(undefined));
    return { id, object: 'chat.completion.chunk', created: this.#created, model: this.#model, system_fingerprint: null };
  }

  #chunk(delta: OpenAIChunkDelta, finish: OpenAIFinishReason | null = null): string {
    const chunk: OpenAIChatCompletionChunk = { ...this.#base(), choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }] };
    // OpenAI marks every chunk but the last with usage: null when usage was asked for.
    if (this.#includeUsage) chunk.usage = null;
    return this.#frame(chunk);
  }

  #frame(chunk: OpenAIChatCompletionChunk): string {
    return `data: ${JSON.stringify(chunk)}\n\n`;
  }
}

function blockIndex(data: Data): number {
  if (typeof data.index !== 'number') throw new AnthropicStreamError('malformed_event', `${String(data.type)} event without a block index`);
  return data.index;
}
