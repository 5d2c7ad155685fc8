// A whole (non-streaming) answer read straight off undici's dispatcher: its status, headers and body bytes. undici's
// request() builds a Readable body, an async resource and a consumer for every response; a whole answer needs none
// of them, and it is the gateway's most common request.
import type { Dispatcher } from 'undici';
import type { IncomingHttpHeaders } from 'node:http';
import type { RequestSignal } from '../pipeline/request-abort.ts';
import { AnswerCut } from './transport-errors.ts';

interface WholeAnswer {
  statusCode: number;
  headers: IncomingHttpHeaders;
  /**
   * The body, or its first `maxBytes` when it was larger (`whole` false; the connection is then closed); for an error
   * status whose body broke off, what came of it (`whole` false).
   */
  body: Buffer;
  whole: boolean;
}

interface WholeRequest {
  path: string;
  method: 'POST' | 'GET';
  headers: Record<string, string>;
  body: Buffer | string;
  signal: RequestSignal;
  /** How much of the body to keep, by status: errors are read for their code, answers whole. */
  maxBytes: (statusCode: number) => number;
  /**
   * Longest silence inside an error's body (status 300 and up), in ms: past it the error is what came of it, as one
   * whose body breaks off is. Its status and headers already said what it is; waiting for its wording until the
   * deadline turned a balancer's 503 into a 504 with no backup asked, and a 429's retry-after into nothing.
   */
  errorGapMs?: number | undefined;
}

/**
 * Sends the request and resolves with the answer once its body is complete (or its cap is reached). Rejects with
 * undici's own error for a connection that fails before the answer's headers, with AnswerCut for one that fails
 * after them, and with the signal's reason when the signal aborts it.
 */
export function requestWhole(dispatcher: Dispatcher, req: WholeRequest): Promise<WholeAnswer> {
  // Nothing is sent for a request that is over already.
  if (req.signal.aborted) return Promise.reject(req.signal.reason);
  return new Promise((resolve, reject) => {
    dispatcher.dispatch({ path: req.path, method: req.method, headers: req.headers, body: req.body }, new WholeAnswerHandler(req, resolve, reject));
  });
}

class WholeAnswerHandler implements Dispatcher.DispatchHandler {
  #statusCode = 0;
  #headers: IncomingHttpHeaders = {};
  #chunks: Buffer[] = [];
  #size = 0;
  #maxBytes = 0;
  #controller: Dispatcher.DispatchController | undefined;
  #settled = false;
  #gap: NodeJS.Timeout | undefined;
  // Before the request has a connection (queued in the pool) there is nothing to abort yet: the promise settles at
  // once, and the request is dropped when undici gets to it.
  readonly #onAbort = () => {
    const reason = this.req.signal.reason as Error;
    if (this.#controller) this.#controller.abort(reason);
    else this.onResponseError(undefined, reason);
  };

  constructor(
    private readonly req: WholeRequest,
    private readonly resolve: (answer: WholeAnswer) => void,
    private readonly reject: (err: unknown) => void,
  ) {
    req.signal.addEventListener('abort', this.#onAbort, { once: true });
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.#controller = controller;
    if (this.req.signal.aborted) controller.abort(this.req.signal.reason as Error);
  }

  onResponseStart(controller: Dispatcher.DispatchController, statusCode: number, headers: IncomingHttpHeaders): void {
    // An informational answer (100, 103) is followed by the real one.
    if (statusCode < 200) return;
    this.#statusCode = statusCode;
    this.#headers = headers;
    this.#maxBytes = this.req.maxBytes(statusCode);
    const gapMs = this.req.errorGapMs;
    if (statusCode >= 300 && gapMs !== undefined) {
      this.#gap = setTimeout(() => {
        this.#settle(false);
        // The rest is not waited for: the connection goes, rather than carry a half-read body to the next request.
        controller.abort(new Error(`no byte of the error's body for ${gapMs} ms`));
      }, gapMs);
    }
  }

  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.#settled) return;
    this.#gap?.refresh();
    if (this.#size + chunk.length > this.#maxBytes) {
      this.#chunks.push(chunk.subarray(0, this.#maxBytes - this.#size));
      this.#size = this.#maxBytes;
      this.#settle(false);
      // The rest is not read: the connection goes, rather than carry it to the next request.
      controller.abort(new Error(`answer larger than ${this.#maxBytes} bytes`));
      return;
    }
    this.#chunks.push(chunk);
    this.#size += chunk.length;
  }

  onResponseEnd(): void {
    this.#settle(true);
  }

  onResponseError(_controller: Dispatcher.DispatchController | undefined, err: Error): void {
    if (this.#settled) return;
    // An error status whose body broke is still that error: its status and headers (a 429's retry-after) are the
    // provider's verdict, the body only its wording. Read as a lost connection, a 429 with retry-after was retried at
    // the backoff's pace, its hint and hold-off lost, and counted by the breaker as the provider's failure.
    if (this.#statusCode >= 300 && err !== this.req.signal.reason) return this.#settle(false);
    this.#settled = true;
    clearTimeout(this.#gap);
    this.req.signal.removeEventListener('abort', this.#onAbort);
    // After a 2xx's headers, the provider was answering: the error cut its answer (the signal's own reason aside).
    const answering = this.#statusCode >= 200 && this.#statusCode < 300;
    this.reject(answering && err !== this.req.signal.reason ? new AnswerCut(err) : err);
  }

  #settle(whole: boolean): void {
    if (this.#settled) return;
    this.#settled = true;
    clearTimeout(this.#gap);
    this.req.signal.removeEventListener('abort', this.#onAbort);
    const body = this.#chunks.length === 1 ? this.#chunks[0]! : Buffer.concat(this.#chunks, this.#size);
    this.resolve({ statusCode: this.#statusCode, headers: this.#headers, body, whole });
  }
}
