// The bytes of request bodies held by the requests that wait (for a pool slot, parked, or repeating an idempotency key
// whose run goes on), across the instance. Each holds its body until it goes: the raw bytes (outside the heap) and the
// parsed JSON (about as large again, on it), and a copy more when its model is swapped or it is translated for
// Anthropic. The queues bound requests, not bytes: 7,000 batch requests of 300 KB took the heap past Node's default
// limit and the process died, every online request with it.
import { getHeapStatistics } from 'node:v8';

/** Without server.maxWaitingBodyBytes: a quarter of the heap limit, so the parsed bodies (two copies at most) fill half. */
export function defaultWaitingBodyBytes(): number {
  return Math.floor(getHeapStatistics().heap_size_limit / 4);
}

export class WaitingBodies {
  #bytes = 0;

  constructor(readonly maxBytes: number) {}

  /** Bytes held by waiting requests now. */
  get bytes(): number {
    return this.#bytes;
  }

  /**
   * Counts a body that is to wait; false, counting nothing, when it would pass the cap. A pool's lowest class (batch)
   * fills only half of it, so a batch flood leaves the other half to the classes above. Alone, a body always fits:
   * one larger than the cap must still be able to wait its turn.
   */
  take(bytes: number, lowest: boolean): boolean {
    const cap = lowest ? this.maxBytes / 2 : this.maxBytes;
    if (this.#bytes > 0 && this.#bytes + bytes > cap) return false;
    this.#bytes += bytes;
    return true;
  }

  /**
   * As take, for a newcomer that takes a waiting request's place: the cap is checked as if the displaced request's
   * `displacedBytes` were already given back, so a swap is not refused for bytes that leave with it. Counts only the
   * newcomer's: the displaced request gives its own back when it leaves, as any waiter does.
   */
  takeInPlaceOf(bytes: number, lowest: boolean, displacedBytes: number): boolean {
    this.#bytes -= displacedBytes;
    const fits = this.take(bytes, lowest);
    this.#bytes += displacedBytes;
    return fits;
  }

  /** Counts a body that waits whatever the cap says (a request the parking lot released was admitted when it parked). */
  add(bytes: number): void {
    this.#bytes += bytes;
  }

  /** Its request stopped waiting (a slot, a release, a shed, an abort). */
  give(bytes: number): void {
    this.#bytes -= bytes;
  }
}
