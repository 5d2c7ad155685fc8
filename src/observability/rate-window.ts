// Per-route counts over a sliding window of whole seconds, for the per-instance rate gauges
// (stormgate_retry_success_rate, stormgate_fallback_rate). Fleet-wide figures come from counters and recording rules:
// averaging ratios across instances is wrong.

interface Bucket {
  second: number;
  requests: number;
  retried: number;
  retriedOk: number;
  fallback: number;
}

interface WindowRates {
  /** Undefined when nothing was retried in the window. */
  retrySuccess: number | undefined;
  /** Undefined when there were no requests in the window. */
  fallback: number | undefined;
}

export class RateWindow {
  readonly #buckets = new Map<string, Bucket[]>();

  constructor(
    private readonly windowS: number,
    private readonly now: () => number,
  ) {}

  record(route: string, r: { retried: boolean; ok: boolean; fallback: boolean }): void {
    const b = this.#current(route);
    b.requests++;
    if (r.retried) b.retried++;
    if (r.retried && r.ok) b.retriedOk++;
    if (r.fallback) b.fallback++;
  }

  rates(route: string): WindowRates {
    const from = Math.floor(this.now() / 1000) - this.windowS;
    let requests = 0;
    let retried = 0;
    let retriedOk = 0;
    let fallback = 0;
    for (const b of this.#buckets.get(route) ?? []) {
      if (b.second <= from) continue;
      requests += b.requests;
      retried += b.retried;
      retriedOk += b.retriedOk;
      fallback += b.fallback;
    }
    return { retrySuccess: retried > 0 ? retriedOk / retried : undefined, fallback: requests > 0 ? fallback / requests : undefined };
  }

  routes(): IterableIterator<string> {
    return this.#buckets.keys();
  }

  #current(route: string): Bucket {
    const second = Math.floor(this.now() / 1000);
    let list = this.#buckets.get(route);
    if (!list) this.#buckets.set(route, (list = []));
    let b = list.at(-1);
    if (!b || b.second !== second) {
      b = { second, requests: 0, retried: 0, retriedOk: 0, fallback: 0 };
      list.push(b);
      while (list.length > 0 && list[0]!.second <= second - this.windowS) list.shift();
    }
    return b;
  }
}
