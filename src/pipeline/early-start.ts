// A stream request whose deadline is the client's own timeout (x-stainless-timeout, x-stormgate-timeout-ms): the
// SDKs' timeout runs until the answer's headers arrive, and a provider sends its headers (and a role chunk) at once,
// then may think for a long while before the first token. The gateway holds its headers until that token so it can
// still retry; at the client's deadline it would answer 504 where the provider itself would have been in time. So at
// the deadline, an attempt whose upstream has begun a 2xx stream starts the answer instead: headers and the events so
// far go out, and no retry is possible any more. The attempt's first-token timer runs on until the first output: the
// model may think as long as the provider's firstTokenMs allows, counted from the request's sending as without the
// early start, pings or not; from that output the stream's idle timeout bounds it, as any other.
// The route's own timeoutMs is the operator's bound on the answer's start: it still ends the request with a 504.

export class EarlyStart {
  #waiting: (() => void) | undefined;

  /** An attempt waiting for its first output says how to start its answer now; returns the offer's withdrawal. */
  offer(start: () => void): () => void {
    this.#waiting = start;
    return () => {
      if (this.#waiting === start) this.#waiting = undefined;
    };
  }

  /** The deadline: starts the waiting attempt's answer; false when none waits (the request then fails at its deadline). */
  take(): boolean {
    const start = this.#waiting;
    if (!start) return false;
    this.#waiting = undefined;
    start();
    return true;
  }
}
