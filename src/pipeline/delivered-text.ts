// What a stream has delivered to its client, kept for streamRecovery (stream-recovery.ts): the text a continuation
// has to carry on from, whether reasoning went out before it, and whether anything but plain text went out, which no
// continuation can splice onto. Not in stream-recovery.ts: that module runs attempts, whose streams are LiveStreams,
// and the LiveStream that keeps this record would import the module that builds it.
import { nonEmpty, present } from '../streaming/stream-events.ts';

export class DeliveredText {
  #text = '';
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

  /** One event passed on to the client ([DONE] aside), by its data. */
  note(data: string): void {
    try {
      const chunk = JSON.parse(data) as { choices?: Array<{ delta?: Record<string, unknown> }> };
      const delta = chunk.choices?.[0]?.delta;
      if (delta === undefined) return;
      if (typeof delta.content === 'string') this.#text += delta.content;
      if (nonEmpty(delta.reasoning_content) || nonEmpty(delta.reasoning)) this.#reasoning = true;
      if (Array.isArray(delta.tool_calls) && delta.tool_calls.length > 0) this.#notPlainText = true;
      if (Array.isArray(delta.content) || nonEmpty(delta.refusal) || present(delta.function_call) || present(delta.audio)) this.#notPlainText = true;
    } catch {
      // malformed events are not forwarded and deliver nothing
    }
  }
}
