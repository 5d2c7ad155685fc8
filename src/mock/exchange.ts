// One request's lifetime inside the mock: its timers, its socket and how it ended.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { performance } from 'node:perf_hooks';
import type { RateLimit } from './faults.ts';
import type { StreamIO } from './sse.ts';
import type { MockRequestLog } from './stats.ts';

/** Which error shape and request-id header a path uses. */
export type Family = 'openai' | 'anthropic';

/** One request from arrival to its socket's close; every field is set up front for a stable shape. */
export class Exchange {
  readonly startedAt = performance.now();
  admitted = false;
  closed = false;
  destroyedByUs = false;
  /** performance.now() at which the provider would have finished it (set only with holdAbandoned). */
  wouldEndAt: number | undefined = undefined;
  /** The rate limit in force for this request's model and the key of its bucket, for the x-ratelimit-* headers. */
  rate: { limit: RateLimit; key: string } | undefined = undefined;
  private timer: NodeJS.Timeout | undefined = undefined;
  private wake: ((ok: boolean) => void) | undefined = undefined;
  readonly req: IncomingMessage;
  readonly res: ServerResponse;
  readonly entry: MockRequestLog;
  readonly family: Family;
  readonly requestId: string;

  constructor(req: IncomingMessage, res: ServerResponse, entry: MockRequestLog, family: Family, requestId: string) {
    this.req = req;
    this.res = res;
    this.entry = entry;
    this.family = family;
    this.requestId = requestId;
    entry.requestId = requestId;
  }

  /** Resolves true after ms, or false at once when the client goes away (the timer is cleared). */
  wait(ms: number): Promise<boolean> {
    if (this.closed) return Promise.resolve(false);
    return new Promise((resolve) => {
      this.wake = resolve;
      this.timer = setTimeout(() => {
        this.timer = undefined;
        this.wake = undefined;
        resolve(true);
      }, ms);
    });
  }

  /** Called once, from res 'close'. */
  markClosed(): void {
    this.closed = true;
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
    this.wake?.(false);
    this.wake = undefined;
  }

  /** Destroys the socket on purpose (reset, cut), so the close is not taken for a client abort. */
  destroy(): void {
    this.destroyedByUs = true;
    this.req.socket.destroy();
  }
}

/** The connection as the stream runner sees it: writes stop once the client is gone. */
export function streamIO(x: Exchange): StreamIO {
  const { res } = x;
  return {
    write: (t) => {
      if (!x.closed) res.write(t);
    },
    end: (t) => {
      if (!x.closed) res.end(t);
    },
    cut: (t) => {
      x.destroyedByUs = true;
      if (x.closed) return;
      // Destroy only once the events before the cut reached the socket.
      if (t === '') x.destroy();
      else res.write(t, () => x.destroy());
    },
    wait: (ms) => x.wait(ms),
    progress: (n) => {
      x.entry.chunksSent = n;
    },
  };
}
