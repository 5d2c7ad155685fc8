// Incremental Server-Sent Events framing: bytes in, whole events out, each with its raw text so the gateway can
// forward exactly what the provider sent without re-serialising it.

export interface SseEvent {
  /** The event's text as received, without the blank line that ended it. */
  readonly raw: string;
  /** The `data:` lines joined with "\n"; null when the event had none (a comment or a bare `event:`). */
  readonly data: string | null;
  /** The `event:` field, when present. */
  readonly event: string | null;
}

const EVENT_END = /\r\n\r\n|\n\n|\r\r/;

export class SseParser {
  #buffer = '';
  readonly #decoder = new TextDecoder();

  /** Feeds bytes and returns every event they complete. */
  push(chunk: Uint8Array): SseEvent[] {
    this.#buffer += this.#decoder.decode(chunk, { stream: true });
    const events: SseEvent[] = [];
    let match: RegExpExecArray | null;
    while ((match = EVENT_END.exec(this.#buffer)) !== null) {
      const raw = this.#buffer.slice(0, match.index);
      this.#buffer = this.#buffer.slice(match.index + match[0].length);
      if (raw.length > 0) events.push(parseEvent(raw));
    }
    return events;
  }

  /** Whatever is left when the stream ends: an event the provider never terminated. */
  flush(): SseEvent | undefined {
    const rest = (this.#buffer + this.#decoder.decode()).trim();
    this.#buffer = '';
    return rest.length > 0 ? parseEvent(rest) : undefined;
  }
}

function parseEvent(raw: string): SseEvent {
  let data: string | null = null;
  let event: string | null = null;
  for (const line of raw.split(/\r\n|\n|\r/)) {
    if (line.startsWith(':')) continue;
    const colon = line.indexOf(':');
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'data') data = data === null ? value : `${data}\n${value}`;
    else if (field === 'event') event = value;
  }
  return { raw, data, event };
}
