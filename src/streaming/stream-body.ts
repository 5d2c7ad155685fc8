// The body of a streamed answer: a Readable that holds the answer's opening (its first output, already in hand)
// from the start, so the server can write it at once, and reads the rest from an async generator as it is asked
// for, with backpressure. Destroying it (the client left) ends the generator.
import { Readable } from 'node:stream';

export function streamBody(first: string, rest: AsyncGenerator<string, unknown, undefined>): Readable {
  let pulling = false;
  const readable = new Readable({
    read() {
      if (pulling) return;
      pulling = true;
      rest.next().then(
        ({ value, done }) => {
          pulling = false;
          if (readable.destroyed) return;
          if (done) readable.push(null);
          // push() returning true asks for more: Readable calls read() again by itself.
          else readable.push(value);
        },
        (err: unknown) => {
          pulling = false;
          readable.destroy(err instanceof Error ? err : new Error(String(err)));
        },
      );
    },
    destroy(err, callback) {
      // Not awaited: return() waits for a pending next(), which waits for the upstream. The owner's 'close' handler
      // (LiveStream.abandon) aborts the upstream, which settles it; the generator's cleanup then runs.
      rest.return(undefined).catch(() => undefined);
      callback(err);
    },
  });
  readable.push(first);
  return readable;
}
