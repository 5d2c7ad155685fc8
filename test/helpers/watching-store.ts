// An in-process store that notes which state keys the gateway asked about and which it told the store to forget: the
// Redis store watches each key it is asked about (and re-reads them all at every reconnect) until told to forget it,
// so a key asked about and never forgotten is a leak there.
import { MemoryStore } from '../../src/state/memory-store.ts';

export class WatchingStore extends MemoryStore {
  readonly asked = new Set<string>();
  readonly forgotten = new Set<string>();
  override getBreaker(target: string) {
    this.asked.add(target);
    return super.getBreaker(target);
  }
  override getHoldOff(target: string) {
    this.asked.add(target);
    return super.getHoldOff(target);
  }
  override forget(target: string) {
    this.forgotten.add(target);
    super.forget(target);
  }
}
