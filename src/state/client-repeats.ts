// Which requests this instance answered with an error a moment ago, by client and body: a client that sends the same
// body again soon after is retrying, whether or not it says so. The openai and Anthropic SDKs say so
// (x-stainless-retry-count); agent frameworks that retry on their own (LangChain's AsyncCaller, six times; the Vercel
// AI SDK; a loop that tries again every second) do not. Counted as new requests, their retries take nothing from the
// retry budget and enlarge it (the budget is a share of requests), so the gateway's own retries multiply theirs: the
// watch names them (log, metric) and, where the route says so (budget.repeats.countAsRetries), the budget counts them
// as the retries they are. Kept per instance, in memory: a lookup on the request path must not wait for Redis, and a
// repeat that reaches another instance is counted as a request, as before.
import { fingerprintOf, scopedKey } from '../policy/idempotency.ts';

/** A request as the watch needs it: whose, where, what; its key is worked out once, when first needed. */
export interface Arrival {
  client: string | undefined;
  path: string;
  query: string;
  /** The x-stormgate-priority it asked for, if any: a batch job's failure does not make an online request a retry. */
  priority: string | undefined;
  rawBody: Buffer;
  /** How long a failure of this request makes a repeat of it a retry (the route's budget.repeats.windowS). */
  windowMs: number;
  key?: string;
}

/** Enough for a storm of distinct failing bodies; past it the oldest are forgotten (their repeats count as requests). */
const MAX_ENTRIES = 10_000;

interface Failure {
  /** When its failure stops making a repeat a retry. */
  until: number;
  bodyLength: number;
}

export class ClientRepeats {
  /** Key -> the failure kept. Oldest first: an entry is moved to the end when renewed. */
  readonly #failures = new Map<string, Failure>();
  /** The latest of their ends: past it, every entry has expired. */
  #lastUntilMs = 0;
  /**
   * How many failures kept have each body length: a body of another length repeats none, and is not hashed. Counted,
   * not a set, so it holds the lengths of the failures kept and no more (a set cleared only once every failure had
   * expired grew with each new length for as long as failures kept coming).
   */
  readonly #lengths = new Map<number, number>();

  constructor(
    private readonly now: () => number,
    private readonly maxEntries = MAX_ENTRIES,
  ) {}

  get size(): number {
    return this.#failures.size;
  }

  /** The distinct body lengths held (for tests: bounded by size). */
  get lengthsHeld(): number {
    return this.#lengths.size;
  }

  /** On arrival: whether the same client sent the same body to the same path (at the same priority) and this instance failed it, lately. */
  isRepeat(a: Arrival): boolean {
    // Nothing failed lately (nearly always): no body is hashed.
    if (this.#failures.size === 0) return false;
    const now = this.now();
    // Every failure kept is past its window: forgotten at once, or with no later failure to sweep them, one failure
    // long ago would have every body of its length hashed for the rest of the process's life.
    if (now >= this.#lastUntilMs) {
      this.#failures.clear();
      this.#lengths.clear();
      return false;
    }
    if (!this.#lengths.has(a.rawBody.length)) return false;
    const key = keyOf(a);
    const failure = this.#failures.get(key);
    if (failure === undefined) return false;
    if (failure.until > now) return true;
    this.#forget(key, failure);
    return false;
  }

  /**
   * At the request's end: a failure is remembered for the request's window (renewed by each failed repeat, so an agent
   * retrying every few seconds stays counted); a repeat that succeeded is forgotten, so the same question asked again
   * later is a new request.
   */
  ended(a: Arrival, failed: boolean): void {
    if (!failed) {
      if (a.key !== undefined) this.#forgetKey(a.key);
      return;
    }
    const key = keyOf(a);
    this.#forgetKey(key);
    const until = this.now() + a.windowMs;
    this.#failures.set(key, { until, bodyLength: a.rawBody.length });
    this.#lengths.set(a.rawBody.length, (this.#lengths.get(a.rawBody.length) ?? 0) + 1);
    this.#lastUntilMs = Math.max(this.#lastUntilMs, until);
    this.#sweep();
  }

  /** Drops expired entries from the oldest end, then the oldest past the cap. */
  #sweep(): void {
    const now = this.now();
    for (const [key, failure] of this.#failures) {
      if (failure.until > now && this.#failures.size <= this.maxEntries) break;
      this.#forget(key, failure);
    }
  }

  #forgetKey(key: string): void {
    const failure = this.#failures.get(key);
    if (failure !== undefined) this.#forget(key, failure);
  }

  #forget(key: string, failure: Failure): void {
    this.#failures.delete(key);
    const left = (this.#lengths.get(failure.bodyLength) ?? 1) - 1;
    if (left === 0) this.#lengths.delete(failure.bodyLength);
    else this.#lengths.set(failure.bodyLength, left);
  }
}

function keyOf(a: Arrival): string {
  a.key ??= scopedKey(a.client, `${a.path}\n${a.priority ?? ''}`, fingerprintOf(a.rawBody, a.query));
  return a.key;
}
