// The chunks of a streamed answer's body, read as Readable's own async iterator reads them, except at a failure:
// undici destroys a response's body ("other side closed") when the provider closes the connection before the
// response's chunked end, and Readable's iterator drops whatever the body still holds once it is destroyed. Bytes the
// provider sent before the close (the finish chunk, [DONE]) were lost whenever the gateway had not yet asked for them:
// a finished answer became a cut on a busy instance, and passed on whole on an idle one.
import { finished, type Readable } from 'node:stream';

/**
 * Yields the body's chunks; at a failure, first the ones already read from the provider, then the error. Not once the
 * gateway itself has aborted the request (`signal`: its deadline, a stall, the client gone): nothing more goes out then.
 */
export async function* bodyChunks(body: Readable, signal: { readonly aborted: boolean }): AsyncGenerator<Buffer, void, undefined> {
  let wake: (() => void) | undefined;
  let ended: { error: Error | undefined } | undefined;
  const onReadable = () => wake?.();
  body.on('readable', onReadable);
  const stop = finished(body, { writable: false }, (err) => {
    ended = { error: err ?? undefined };
    wake?.();
  });
  try {
    for (;;) {
      const chunk = signal.aborted ? null : (body.read() as Buffer | null);
      if (chunk !== null) {
        yield chunk;
        continue;
      }
      if (ended) {
        if (ended.error) throw ended.error;
        return;
      }
      await new Promise<void>((resolve) => (wake = resolve));
      wake = undefined;
    }
  } finally {
    body.off('readable', onReadable);
    stop();
    // As Readable's iterator does: a reader that stops early (the client left, the answer is over) lets the body go.
    body.destroy();
  }
}
