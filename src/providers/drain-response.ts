// Reading the rest of an upstream response whose answer is over (its [DONE] or terminal event came) while the
// response is not (the chunked body's last bytes are on their way), so undici keeps the connection for the next request
// instead of closing it, which would cost the next stream a new TCP and TLS handshake. Apart from the stream that
// passes events on: nothing read here reaches a client, and it runs after that stream has ended.

/**
 * The last bytes come within milliseconds: they are read up to this many and for this long, and a response that
 * lingers longer is closed rather than hold its pool slot.
 */
const DRAIN_MAX_BYTES = 64 * 1024;
const DRAIN_MS = 250;

/**
 * Reads what is left of `iterator` (see DRAIN_MS), then calls `done`; `close` aborts the upstream request, for a
 * response that lingers or sends too much.
 */
export function drainResponse(iterator: AsyncIterator<Buffer>, close: () => void, done: () => void): void {
  const timer = setTimeout(close, DRAIN_MS);
  const over = () => {
    clearTimeout(timer);
    done();
  };
  let bytes = 0;
  const next = (): void => {
    iterator.next().then(({ done: ended, value }) => {
      if (ended) return over();
      bytes += value.length;
      if (bytes <= DRAIN_MAX_BYTES) return next();
      close();
      over();
    }, over);
  };
  next();
}
