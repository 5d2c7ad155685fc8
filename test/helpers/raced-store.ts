// A state store whose breaker compare-and-set loses a race: another instance's write lands just before it.
import { MemoryStore } from '../../src/state/memory-store.ts';
import type { BreakerRecord } from '../../src/state/store.ts';

/** A store where another instance writes `raceWith` just before this instance's next compare-and-set, which then loses. */
export class RacedStore extends MemoryStore {
  raceWith: BreakerRecord | undefined;
  override async casBreaker(target: string, expectedGeneration: number, next: BreakerRecord): Promise<boolean> {
    const other = this.raceWith;
    this.raceWith = undefined;
    if (other) await super.casBreaker(target, this.getBreaker(target)?.generation ?? 0, other);
    return super.casBreaker(target, expectedGeneration, next);
  }
}
