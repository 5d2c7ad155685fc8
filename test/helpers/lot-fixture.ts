// The parking lot on a fake clock, as its unit tests drive it: two targets, `primary` and `backup`, blocked for a
// minute; any other key available with 10 probe slots. Each test sets `states` and calls `lot.notify(key)` as the
// breaker board would, and may set `random` (the lot's draws, 0 by default). `looked` is every key the lot asked the
// state of (a lot that spins asks thousands of times a second); `outcomes` each park outcome it reported.
import { afterEach, beforeEach, vi } from 'vitest';
import { ParkingLot, type TargetState } from '../../src/pipeline/parking-lot.ts';

export interface LotFixture {
  readonly states: Map<string, TargetState>;
  readonly looked: string[];
  readonly outcomes: string[];
  lot: ParkingLot;
  random: () => number;
}

export function useLotFixture(): LotFixture {
  const f = { states: new Map<string, TargetState>(), looked: [] as string[], outcomes: [] as string[], random: () => 0 } as LotFixture;
  beforeEach(() => {
    vi.useFakeTimers({ now: 0 });
    f.states.clear();
    f.states.set('primary', { mode: 'blocked', availableAtMs: 60_000 });
    f.states.set('backup', { mode: 'blocked', availableAtMs: 60_000 });
    f.looked.length = 0;
    f.outcomes.length = 0;
    f.random = () => 0;
    f.lot = new ParkingLot({
      now: () => Date.now(),
      random: () => f.random(),
      stateOf: (k) => {
        f.looked.push(k);
        return f.states.get(k) ?? { mode: 'available', slots: 10 };
      },
      onOutcome: (_r, o) => f.outcomes.push(o),
    });
  });
  afterEach(() => {
    f.lot.close();
    vi.useRealTimers();
  });
  return f;
}
