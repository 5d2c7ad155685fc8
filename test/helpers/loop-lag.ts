// How long this process's event loop was held up: a loaded 2-core CI machine starves it for up to a second at a time,
// and a gateway in this process then answers that much later by the wall clock, with every timer of its own on time
// by its loop. A wall-clock bound on such a gateway leaves that time out, and still bounds the gateway as written.

/** Lateness of a tick past this, in ms, is a stall; below it, timer noise, which is not counted. */
const STALL_MS = 20;

export interface LoopLag {
  /** Ms the loop was held up (its stalls, summed) since measureLoopLag(). */
  lateMs(): number;
  stop(): void;
}

/** Starts measuring the event loop's stalls, by a timer every `tickMs`. */
export function measureLoopLag(tickMs = 10): LoopLag {
  let last = performance.now();
  let late = 0;
  const timer = setInterval(() => {
    const now = performance.now();
    const over = now - last - tickMs;
    if (over > STALL_MS) late += over;
    last = now;
  }, tickMs).unref();
  return { lateMs: () => late, stop: () => clearInterval(timer) };
}
