// An exponentially weighted moving average that starts from its first sample: the initial guess stands only until
// something has been measured, so one early sample is not dragged towards a made-up value for the next dozen.

export class MovingAverage {
  #value: number;
  #sampled = false;

  /** `weight`: the share of each new sample (0.2: about the last ten samples count). */
  constructor(initial: number, private readonly weight = 0.2) {
    this.#value = initial;
  }

  get value(): number {
    return this.#value;
  }

  add(sample: number): void {
    this.#value = this.#sampled ? (1 - this.weight) * this.#value + this.weight * sample : sample;
    this.#sampled = true;
  }
}
