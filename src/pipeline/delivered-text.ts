// What a stream has delivered to its client, kept for streamRecovery (stream-recovery.ts): the text a continuation
// has to carry on from, and whether anything but plain text went out, which no continuation can splice onto. Not in
// stream-recovery.ts: that module runs attempts, whose streams are LiveStreams, and the LiveStream that keeps this
// record would import the module that builds it.

export class DeliveredText {
  #text = '';
  #notPlainText = false;

  /** The first choice's text delivered so far. */
  get text(): string {
    return this.#text;
  }

  /**
   * A tool call started (never a half-sent tool call is continued), or content that is not plain text (a list of
   * parts): no recovery could splice onto it.
   */
  get notPlainText(): boolean {
    return this.#notPlainText;
  }

  /** One event passed on to the client ([DONE] aside), by its data. */
  note(data: string): void {
    try {
      const chunk = JSON.parse(data) as { choices?: Array<{ delta?: { content?: unknown; tool_calls?: unknown[] } }> };
      const delta = chunk.choices?.[0]?.delta;
      if (typeof delta?.content === 'string') this.#text += delta.content;
      if (Array.isArray(delta?.tool_calls) && delta.tool_calls.length > 0) this.#notPlainText = true;
      if (Array.isArray(delta?.content)) this.#notPlainText = true;
    } catch {
      // malformed events are not forwarded and deliver nothing
    }
  }
}
