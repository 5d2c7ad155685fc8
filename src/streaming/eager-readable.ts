// The body of a streamed answer: a Readable over the LiveStream's async generator, like Readable.from, except that
// the generator starts at once. A stream's first chunk (its first output) is already in hand when the answer is
// made, so it sits in the buffer when the response pipe starts reading, instead of waiting for the pipe to ask.
import { Readable } from 'node:stream';

export function eagerReadable(chunks: AsyncGenerator<string, unknown, undefined>): Readable {
  let pulling = false;
  const readable = new Readable({
    read() {
      if (!pulling) pull();
    },
    destroy(err, callback) {
      // Not awaited: return() waits for a pending next(), which waits for the upstream. The owner's 'close' handler
      // (LiveStream.abandon) aborts the upstream, which settles it; the generator's cleanup then runs.
      chunks.return(undefined).catch(() => undefined);
      callback(err);
    },
  });
  function pull(): void {
    pulling = true;
    chunks.next().then(
      ({ value, done }) => {
        pulling = false;
        if (readable.destroyed) return;
        if (done) readable.push(null);
        else if (readable.push(value)) pull();
      },
      (err: unknown) => {
        pulling = false;
        readable.destroy(err instanceof Error ? err : new Error(String(err)));
      },
    );
  }
  pull();
  return readable;
}
