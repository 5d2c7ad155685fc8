// What the mock saw: counters per status, path and second, and a bounded log of requests.

/** Counters since start or the last reset. */
export interface MockStats {
  total: number;
  inflight: number;
  maxInflight: number;
  aborted: number;
  /** By HTTP status, or 'reset', 'hang', 'aborted' (client left before any status). Counted when a request ends. */
  byStatus: Record<string, number>;
  byPath: Record<string, number>;
  /** The rate limit's 429s (rateLimit) by the limit they name; they count in byStatus['429'] too. */
  rateLimited: { requests: number; tokens: number };
  /** Arrivals (`total`) and endings (`byStatus`) per unix second, oldest first. */
  perSecond: Array<{ second: number; total: number; byStatus: Record<string, number> }>;
}

/** One received request. */
export interface MockRequestLog {
  id: number;
  /** ms since the epoch. */
  receivedAt: number;
  method: string;
  path: string;
  model?: string;
  stream: boolean;
  /** Lower-case names, all of them (authorization too: this is a test double). */
  headers: Record<string, string>;
  status?: number | 'reset' | 'hang';
  /** The client went away before the response finished. */
  aborted: boolean;
  /** The id this answer carries (`x-request-id`, or Anthropic's `request-id`): what the gateway logs as upstreamRequestId. */
  requestId?: string;
  endedAt?: number;
  chunksSent?: number;
}

/** Seconds of per-second history kept. */
const HISTORY_SECONDS = 3600;

type Bucket = { second: number; total: number; byStatus: Record<string, number> };

export class StatsCollector {
  private total = 0;
  private inflightNow = 0;
  private maxInflight = 0;
  private aborted = 0;
  private byStatus: Record<string, number> = {};
  private byPath: Record<string, number> = {};
  private rateLimitedBy = { requests: 0, tokens: 0 };
  private readonly seconds = new Map<number, Bucket>();

  get inflight(): number {
    return this.inflightNow;
  }

  private bucket(nowMs: number): Bucket {
    const second = Math.floor(nowMs / 1000);
    let b = this.seconds.get(second);
    if (b === undefined) {
      b = { second, total: 0, byStatus: {} };
      this.seconds.set(second, b);
      // Maps iterate in insertion order, so the first key is the oldest second.
      if (this.seconds.size > HISTORY_SECONDS) this.seconds.delete(this.seconds.keys().next().value!);
    }
    return b;
  }

  arrived(path: string, nowMs: number): void {
    this.total++;
    this.byPath[path] = (this.byPath[path] ?? 0) + 1;
    this.bucket(nowMs).total++;
  }

  admit(): void {
    this.inflightNow++;
    if (this.inflightNow > this.maxInflight) this.maxInflight = this.inflightNow;
  }

  release(): void {
    this.inflightNow--;
  }

  ended(status: string, aborted: boolean, nowMs: number): void {
    if (aborted) this.aborted++;
    this.byStatus[status] = (this.byStatus[status] ?? 0) + 1;
    const b = this.bucket(nowMs);
    b.byStatus[status] = (b.byStatus[status] ?? 0) + 1;
  }

  rateLimited(limit: 'requests' | 'tokens'): void {
    this.rateLimitedBy[limit]++;
  }

  /** Clears the counters; requests still in flight stay counted as in flight. */
  reset(): void {
    this.total = 0;
    this.aborted = 0;
    this.maxInflight = this.inflightNow;
    this.byStatus = {};
    this.byPath = {};
    this.rateLimitedBy = { requests: 0, tokens: 0 };
    this.seconds.clear();
  }

  snapshot(): MockStats {
    return {
      total: this.total,
      inflight: this.inflightNow,
      maxInflight: this.maxInflight,
      aborted: this.aborted,
      byStatus: { ...this.byStatus },
      byPath: { ...this.byPath },
      rateLimited: { ...this.rateLimitedBy },
      perSecond: [...this.seconds.values()].map((b) => ({ second: b.second, total: b.total, byStatus: { ...b.byStatus } })),
    };
  }
}

/** The last `capacity` entries, in a ring so that adding never copies the array. */
export class RequestLogRing {
  private readonly items: MockRequestLog[] = [];
  private readonly capacity: number;
  private next = 0;

  constructor(capacity = 10_000) {
    this.capacity = capacity;
  }

  add(entry: MockRequestLog): void {
    if (this.items.length < this.capacity) this.items.push(entry);
    else this.items[this.next] = entry;
    this.next = (this.next + 1) % this.capacity;
  }

  /** Oldest first; entries are live objects, copied so callers cannot disturb the ring. */
  list(): MockRequestLog[] {
    const ordered = this.items.length < this.capacity ? this.items : [...this.items.slice(this.next), ...this.items.slice(0, this.next)];
    return ordered.map((e) => ({ ...e, headers: { ...e.headers } }));
  }

  clear(): void {
    this.items.length = 0;
    this.next = 0;
  }
}
