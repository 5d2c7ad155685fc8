// Incremental Server-Sent Events framing: bytes in, whole events out, each with its raw text so the gateway can
// forward exactly what the provider sent without re-serialising it.

export interface SseEvent {
  /**
   * The event's text as received, without the blank line that ended it; for a heartbeat of empty data, its comment
   * lines (or `:`).
   */
  readonly raw: string;
  /** The `data:` lines joined with "\n"; null when the event had none (a comment or a bare `event:`) or empty data (a bare `data:`). */
  readonly data: string | null;
  /** The `event:` field, when present. */
  readonly event: string | null;
}

// Two line endings in a row; mixed ones too (LF then CRLF, CRLF then LF), which the SSE spec allows.
const EVENT_END = /\r\n\r\n|\n\r\n|\r\n\n|\n\n|\r\r/;

/** The largest event the gateway holds (a Responses API `response.completed` carries the whole answer). */
export const MAX_EVENT_BYTES = 16 * 1024 * 1024;

/** A provider sent an event larger than MAX_EVENT_BYTES, or one that never ends: a broken stream. */
export class SseEventTooLarge extends Error {
  constructor() {
    super(`an event larger than ${MAX_EVENT_BYTES / 1024 / 1024} MB`);
  }
}

export class SseParser {
  /** Text of an event not yet ended, in the pieces it came in: joined once its end arrives, not on every read. */
  #pieces: string[] = [];
  #length = 0;
  /** The last 3 characters of the pieces, for an event end split over several short reads. */
  #tail = '';
  /** An event outgrew the limit in a read that completed others before it: those were returned, the next call throws. */
  #tooLarge = false;
  readonly #decoder = new TextDecoder();

  /**
   * Feeds bytes and returns every event they complete; throws SseEventTooLarge when an event outgrows the limit (at
   * the next call, push or flush, when the read that did so completed events before it: they are the provider's too).
   */
  push(chunk: Uint8Array): SseEvent[] {
    if (this.#tooLarge) throw new SseEventTooLarge();
    const text = this.#decoder.decode(chunk, { stream: true });
    // Only the new text (and the last 3 characters before it, for a line break split across reads) can hold the end
    // of the event: an endless line is not searched again from its start on every read.
    if (!EVENT_END.test(this.#tail + text)) {
      if (text.length > 0) this.#pieces.push(text);
      this.#length += text.length;
      this.#tail = (this.#tail + text).slice(-3);
      if (this.#length > MAX_EVENT_BYTES) this.#giveUp([]);
      return [];
    }
    let buffer = this.#pieces.join('') + text;
    const events: SseEvent[] = [];
    let match: RegExpExecArray | null;
    while ((match = EVENT_END.exec(buffer)) !== null) {
      const raw = buffer.slice(0, match.index);
      buffer = buffer.slice(match.index + match[0].length);
      if (raw.length > 0) events.push(parseEvent(raw));
    }
    this.#pieces = buffer.length > 0 ? [buffer] : [];
    this.#length = buffer.length;
    this.#tail = buffer.slice(-3);
    return this.#length > MAX_EVENT_BYTES ? this.#giveUp(events) : events;
  }

  /**
   * An event has outgrown the limit: its text is let go, and SseEventTooLarge thrown now, or at the next call when
   * this read completed events before it. Thrown at once, those were lost with it: an output delta read together with
   * the oversized event's first 16 MB never reached the client, or a first output was taken for a broken stream. (Only
   * a read that large does it: undici's are some 64 KB; the events are judged in their order whatever the reads.)
   */
  #giveUp(completed: SseEvent[]): SseEvent[] {
    this.#tooLarge = true;
    this.#pieces = [];
    if (completed.length === 0) throw new SseEventTooLarge();
    return completed;
  }

  /** Whatever is left when the stream ends: an event the provider never terminated. */
  flush(): SseEvent | undefined {
    if (this.#tooLarge) throw new SseEventTooLarge();
    const rest = (this.#pieces.join('') + this.#decoder.decode()).trim();
    this.#pieces = [];
    this.#length = 0;
    this.#tail = '';
    return rest.length > 0 ? parseEvent(rest) : undefined;
  }
}

function parseEvent(raw: string): SseEvent {
  let data: string | null = null;
  let event: string | null = null;
  const lines = raw.split(/\r\n|\n|\r/);
  for (const line of lines) {
    if (line.startsWith(':')) continue;
    const colon = line.indexOf(':');
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'data') data = data === null ? value : `${data}\n${value}`;
    else if (field === 'event') event = value;
  }
  // A bare `data:` is a heartbeat some providers and proxies send. The SSE spec dispatches no event with empty data,
  // so it is a keep-alive, like a comment; read as data it is malformed JSON (a retry before the first output, a
  // broken tool call after it), and passed on as it came the SDKs would JSON.parse "" and throw. It goes on as a
  // comment. So does an `event:` line with no data at all (`event: ping`): the spec dispatches nothing for it either,
  // and the SDKs, which do, would throw on its missing data. An `event: error` is kept: with or without data, it is
  // the upstream's error (eventMeaning).
  if (data === '' || (data === null && event !== null && event !== 'error')) return { raw: lines.filter((l) => l.startsWith(':')).join('\n') || ':', data: null, event };
  return { raw, data, event };
}
