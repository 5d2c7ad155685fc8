// The body of a streamed answer: its opening (its first output, already in hand), which goes out at once, as the
// answer's first bytes are the time to first token, then the rest from an async generator, with backpressure.
// Written straight into the response when the server is its only reader (writeTo): piped as a Readable, every chunk
// also cost a push, a buffer, a Buffer copy of the text and a pipe's data event, about 5% of a stream's CPU. Read as a
// Readable otherwise (an idempotency key keeps a copy of what it reads). Destroying it (the client left) ends the
// generator.
import { Readable } from 'node:stream';
import type { ServerResponse } from 'node:http';

export class StreamBody extends Readable {
  readonly #first: string;
  readonly #rest: AsyncGenerator<string, unknown, undefined>;
  /** The opening has been handed out (to a reader, or to writeTo): the body can no longer be written directly. */
  #started = false;
  /** Written by writeTo: nothing is read from it as a Readable, which would take events from the response. */
  #direct = false;
  #pulling = false;

  constructor(first: string, rest: AsyncGenerator<string, unknown, undefined>) {
    super();
    this.#first = first;
    this.#rest = rest;
  }

  override _read(): void {
    if (this.#direct) return;
    if (!this.#started) {
      // Pushed when first asked for, not at construction: until then writeTo can still take the body over.
      this.#started = true;
      // The opening in hand: read() returns it at once. push() returning false waits for the next _read.
      if (this.#first.length > 0 && !this.push(this.#first)) return;
    }
    if (this.#pulling) return;
    this.#pulling = true;
    this.#rest.next().then(
      ({ value, done }) => {
        this.#pulling = false;
        if (this.destroyed) return;
        if (done) this.push(null);
        // push() returning true asks for more: Readable calls _read() again by itself.
        else this.push(value);
      },
      (err: unknown) => {
        this.#pulling = false;
        this.destroy(err instanceof Error ? err : new Error(String(err)));
      },
    );
  }

  override _destroy(err: Error | null, callback: (error?: Error | null) => void): void {
    // Not awaited: return() waits for a pending next(), which waits for the upstream. The owner's 'close' handler
    // (LiveStream.abandon) aborts the upstream, which settles it; the generator's cleanup then runs.
    this.#rest.return(undefined).catch(() => undefined);
    callback(err);
  }

  /**
   * Writes the whole answer into `res` (whose head is written): the opening now, the rest as it comes, waiting for
   * 'drain' when the response's buffer is full (the generator, held at its yield, reads nothing more from the
   * upstream), then ends it. The body is destroyed at the end (its 'close' is the stream's end, as when it is read
   * to its end) and fails as a read one would (its 'error'), when the generator throws. False, doing nothing, when the
   * body has been read already: it is then piped.
   */
  writeTo(res: ServerResponse): boolean {
    if (this.#started || this.destroyed) return false;
    this.#started = true;
    this.#direct = true;
    writeOpening(res, this.#first.length > 0 ? this.#first : null);
    void this.#pump(res);
    return true;
  }

  async #pump(res: ServerResponse): Promise<void> {
    const rest = this.#rest;
    try {
      for (;;) {
        // A destroyed response never drains, nor closes again: waiting on it would hold the generator for good.
        if (res.writableNeedDrain && !res.destroyed) await drained(res);
        if (this.destroyed || res.destroyed) return;
        const { value, done } = await rest.next();
        if (this.destroyed || res.destroyed) return;
        if (done) break;
        res.write(value);
      }
      res.end();
      this.destroy();
    } catch (err) {
      if (!this.destroyed) this.destroy(err instanceof Error ? err : new Error(String(err)));
    }
  }
}

/** Resolves when `res` can take more ('drain'), or will never ('close'). */
export function drained(res: ServerResponse): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve();
    };
    res.on('drain', done);
    res.on('close', done);
  });
}

/** The answer's first bytes, into a response whose head is written; null: none yet, the head alone goes out. */
export function writeOpening(res: ServerResponse, first: unknown): void {
  if (first !== null) {
    res.write(first);
    // http corks the socket on the first write and uncorks on the next tick; the first token does not wait for it.
    res.socket?.uncork();
  } else {
    // Started at the client's deadline before any event came (pipeline/early-start.ts): the head is what it waits for.
    res.flushHeaders();
  }
}
