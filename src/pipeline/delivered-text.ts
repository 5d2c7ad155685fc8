// What a stream has delivered to its client, kept for streamRecovery (stream-recovery.ts): the text a continuation
// has to carry on from, whether reasoning went out before it, and whether anything but plain text went out, which no
// continuation can splice onto. Not in stream-recovery.ts: that module runs attempts, whose streams are LiveStreams,
// and the LiveStream that keeps this record would import the module that builds it.
import { nonEmpty, present } from '../streaming/stream-events.ts';
import { SseParser, type SseEvent } from '../streaming/sse-parser.ts';

/** The id and created time of the completion a client began to get (its first chunk's). */
interface CompletionIdentity {
  id: string;
  created: unknown;
}

/** A chat chunk as far as what it delivers is read. */
export type DeliveredChunk = { id?: unknown; created?: unknown; choices?: Array<{ delta?: Record<string, unknown> }> };

export class DeliveredText {
  #text = '';
  #completion: CompletionIdentity | undefined;
  #reasoning = false;
  #notPlainText = false;

  /** The first choice's text delivered so far. */
  get text(): string {
    return this.#text;
  }

  /**
   * Reasoning went out (`reasoning_content`, `reasoning`): a stream cut after its thoughts alone has begun its answer
   * for the client, though no text of it is there to continue.
   */
  get reasoning(): boolean {
    return this.#reasoning;
  }

  /**
   * A tool call started (never a half-sent tool call is continued), content that is not plain text (a list of parts),
   * or output that is no text at all (a refusal, audio, a legacy function_call): no recovery could splice onto it,
   * nor follow it with another answer.
   */
  get notPlainText(): boolean {
    return this.#notPlainText;
  }

  /** The id and created time of the completion the client began to get, once a chunk has carried them. */
  get completion(): CompletionIdentity | undefined {
    return this.#completion;
  }

  /** One event passed on to the client ([DONE] aside), as readEvent parsed it (or a continuation's, read before its seam). */
  noteChunk(chunk: DeliveredChunk | null): void {
    if (typeof chunk !== 'object' || chunk === null) return;
    if (this.#completion === undefined && typeof chunk.id === 'string') this.#completion = { id: chunk.id, created: chunk.created };
    const delta = chunk.choices?.[0]?.delta;
    if (typeof delta !== 'object' || delta === null) return;
    if (typeof delta.content === 'string') this.#text += delta.content;
    if (nonEmpty(delta.reasoning_content) || nonEmpty(delta.reasoning)) this.#reasoning = true;
    if (Array.isArray(delta.tool_calls) && delta.tool_calls.length > 0) this.#notPlainText = true;
    if (Array.isArray(delta.content) || nonEmpty(delta.refusal) || present(delta.function_call) || present(delta.audio)) this.#notPlainText = true;
  }
}

/**
 * A continuation's events as chunks of the completion the client began to get: its id and created time on each (the
 * model that wrote them is left as it is). OpenAI's chunks of one completion all carry the same ones; the next
 * target's own, from the seam on, made the SDK helper's finalChatCompletion() report the continuation's id, and a
 * client that groups chunks by id saw two answers.
 */
export async function* asSameCompletion(texts: AsyncIterable<string>, completion: CompletionIdentity): AsyncGenerator<string> {
  const parser = new SseParser();
  const framed = (events: SseEvent[]) => events.map((ev) => `${sameCompletion(ev, completion)}\n\n`).join('');
  for await (const text of texts) {
    const out = framed(parser.push(Buffer.from(text)));
    if (out !== '') yield out;
  }
  const tail = parser.flush();
  if (tail) yield framed([tail]);
}

/** One event's text, its chunk's id and created made the completion's (any other event as it came). */
function sameCompletion(ev: SseEvent, completion: CompletionIdentity): string {
  if (ev.data === null || ev.event !== null || !ev.data.startsWith('{')) return ev.raw;
  try {
    const chunk = JSON.parse(ev.data) as Record<string, unknown>;
    if (typeof chunk.id !== 'string') return ev.raw;
    if (chunk.id === completion.id && (completion.created === undefined || chunk.created === completion.created)) return ev.raw;
    return `data: ${JSON.stringify({ ...chunk, id: completion.id, ...(completion.created !== undefined && { created: completion.created }) })}`;
  } catch {
    return ev.raw;
  }
}
