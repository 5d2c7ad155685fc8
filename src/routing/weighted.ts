// strategy: weighted. Smooth weighted round-robin (as nginx does it): deterministic, evenly interleaved, exact over
// every cycle of the weights, unlike random draws. Targets that cannot take requests now (breaker open, held off)
// sit the round out; the others stay behind the chosen one as fallbacks.

interface Weighted {
  readonly key: string;
  readonly weight: number;
}

export class WeightedPicker<W extends Weighted = Weighted> {
  readonly #current = new Map<string, Map<string, number>>();

  constructor(private readonly available: (target: W) => boolean) {}

  /** The targets in the order to try them: this round's pick first, then the rest in config order. */
  order<T extends W>(route: string, targets: T[]): T[] {
    const eligible = targets.filter((t) => this.available(t));
    if (eligible.length === 0) return targets;
    let current = this.#current.get(route);
    if (!current) this.#current.set(route, (current = new Map()));
    let total = 0;
    let best: T | undefined;
    for (const t of eligible) {
      const c = (current.get(t.key) ?? 0) + t.weight;
      current.set(t.key, c);
      total += t.weight;
      if (!best || c > current.get(best.key)!) best = t;
    }
    current.set(best!.key, current.get(best!.key)! - total);
    return [best!, ...targets.filter((t) => t !== best)];
  }

  /**
   * Drops a target key given back (TargetKeys: a made-up model's, an idle one's) from every route: a route of any model
   * keeps a count for each key it ever ordered, so such names would grow it without bound. A key still in use starts
   * again from zero, a round's worth of unevenness.
   */
  forget(key: string): void {
    for (const current of this.#current.values()) current.delete(key);
  }

  /** The counts kept, all routes together. */
  get size(): number {
    let n = 0;
    for (const current of this.#current.values()) n += current.size;
    return n;
  }
}
