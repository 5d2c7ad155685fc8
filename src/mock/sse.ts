// Server-sent events for every API family, with the stream faults applied in one place.
// A family only builds a StreamPlan (pre-encoded events); runStream decides what reaches the wire.
import type { StreamFaults } from './faults.ts';

/** An SSE event with only a data line (OpenAI chat and completions). */
export function dataEvent(payload: unknown): string {
  return `data: ${JSON.stringify(payload)}\n\n`;
}

/** An SSE event with an event name (Anthropic messages, OpenAI responses). */
export function namedEvent(name: string, payload: unknown): string {
  return `event: ${name}\ndata: ${JSON.stringify(payload)}\n\n`;
}

/** The terminal event of OpenAI chat and completion streams. */
export const DONE_EVENT = 'data: [DONE]\n\n';

/** Default number of content chunks in a stream. */
export const DEFAULT_CHUNKS = 5;

/** One answer as SSE, cut into the parts the stream faults act on. */
export interface StreamPlan {
  /** Sent right after the headers: role-only chunk, message_start, response.created, ... */
  head: string;
  /** The events that carry output, one entry per content chunk. */
  chunks: string[];
  /** Finish events: finish_reason chunk, usage chunk, content_block_stop + message_delta, ... */
  tail: string;
  /** The terminal event that `omitDone` leaves out. */
  done: string;
  /** What `malformedAtChunk` sends in place of a content chunk. */
  malformed: string;
  /**
   * The API's own mid-stream error event that `errorAfterChunks` ends the stream with, given the content chunks sent
   * (a function because the Responses API numbers every event, this one included).
   */
  error(chunksSent: number): string;
}

/** The connection as runStream sees it; the server owns sockets and timers. */
export interface StreamIO {
  write(text: string): void;
  end(text: string): void;
  /** Writes text, then destroys the socket once it is flushed. */
  cut(text: string): void;
  /** Resolves true after ms, or false as soon as the client goes away (the timer is cleared). */
  wait(ms: number): Promise<boolean>;
  /** Called after each content chunk is queued, for the request log. */
  progress(chunksSent: number): void;
}

/** How a stream ended from the server's side. */
type StreamEnd = 'done' | 'cut' | 'stalled' | 'error' | 'gone';

/**
 * Sends a plan with the faults applied. Events with no delay between them are written together,
 * so a fault-free stream costs one write after the headers.
 */
export async function runStream(plan: StreamPlan, faults: StreamFaults, io: StreamIO): Promise<StreamEnd> {
  const n = plan.chunks.length;
  const cutAt = faults.cutAfterChunks === undefined ? -1 : Math.min(faults.cutAfterChunks, n);
  const stallAt = faults.stallAfterChunks === undefined ? -1 : Math.min(faults.stallAfterChunks, n);
  const errorAt = faults.errorAfterChunks === undefined ? -1 : Math.min(faults.errorAfterChunks, n);
  let pending = plan.head + (faults.pingBeforeFirstToken === true ? ': ping\n\n' : '');

  for (let i = 0; ; i++) {
    if (i === cutAt) {
      io.cut(pending);
      return 'cut';
    }
    if (i === stallAt) {
      // The connection stays open with nothing more to say, until the client gives up.
      io.write(pending);
      return 'stalled';
    }
    if (i === errorAt) {
      // As the providers do: the error event is the stream's last, and the response ends cleanly after it.
      io.end(pending + plan.error(i));
      return 'error';
    }
    if (i === n) break;
    const delayMs = i === 0 ? (faults.firstTokenDelayMs ?? 0) : (faults.chunkDelayMs ?? 0);
    if (delayMs > 0) {
      if (pending !== '') io.write(pending);
      pending = '';
      if (!(await io.wait(delayMs))) return 'gone';
    }
    pending += i === faults.malformedAtChunk ? plan.malformed : plan.chunks[i];
    io.progress(i + 1);
  }
  io.end(pending + plan.tail + (faults.omitDone === true ? '' : plan.done));
  return 'done';
}
