// The pipeline's abort: AbortController's contract for the part of it the pipeline, undici and node:timers/promises
// use (aborted, reason, 'abort' listeners), without the cost of Node's EventTarget. Every request makes one (two for
// a stream) and hands it to undici, the pool and the sleeps. With Node's AbortController, its EventTarget set-up
// and listener bookkeeping were about 3% of the gateway's CPU per request in profiles of the overhead bench.

/** What the pipeline reads of a signal. A real AbortSignal has it too, so tests and callers may pass either. */
export interface RequestSignal {
  readonly aborted: boolean;
  readonly reason: unknown;
  addEventListener(type: 'abort', listener: () => void, options?: { once?: boolean }): void;
  removeEventListener(type: 'abort', listener: () => void): void;
}

/** What the pipeline does with a controller; AbortController has it too. */
export interface Aborter {
  readonly signal: RequestSignal;
  abort(reason?: unknown): void;
}

/**
 * Controller and signal in one object. A signal aborts once, so every listener runs at most once: `once` needs no
 * bookkeeping. undici tells an EventTarget by `addEventListener`, and timers/promises accepts any object with
 * `aborted`; both only add, remove and wait for 'abort'.
 */
export class RequestAbort implements Aborter, RequestSignal {
  aborted = false;
  reason: unknown = undefined;
  #listeners: Array<() => void> | undefined;

  get signal(): RequestAbort {
    return this;
  }

  abort(reason?: unknown): void {
    if (this.aborted) return;
    this.aborted = true;
    this.reason = reason ?? new DOMException('This operation was aborted', 'AbortError');
    const listeners = this.#listeners;
    this.#listeners = undefined;
    if (!listeners) return;
    for (const listener of listeners) {
      // As with an EventTarget, one listener's throw neither stops the others nor reaches the caller of abort().
      try {
        listener();
      } catch (err) {
        queueMicrotask(() => {
          throw err;
        });
      }
    }
  }

  addEventListener(_type: 'abort', listener: () => void, _options?: { once?: boolean }): void {
    // Like an EventTarget's: a listener added after the abort is never called.
    if (this.aborted) return;
    (this.#listeners ??= []).push(listener);
  }

  removeEventListener(_type: 'abort', listener: () => void): void {
    const listeners = this.#listeners;
    if (!listeners) return;
    const i = listeners.lastIndexOf(listener);
    if (i !== -1) listeners.splice(i, 1);
  }
}

/** For the APIs typed to take an AbortSignal (undici, timers/promises), which use only what RequestSignal has. */
export function asAbortSignal(signal: RequestSignal): AbortSignal {
  return signal as AbortSignal;
}
