// Cases the flex-tier lot fuzz (test/pools-clients-model-fuzz.test.ts, runLotFuzz 'coupled' and 'independent') ran
// into, each decided against the README ("Hold-offs": a flex request parks under its tier's key in its target's queue,
// released in the same order as the default tier's and under the same limit) and pinned here, deterministic. None was
// a bug in the lot: each was the model's, fixed there; these hold the behaviour the model now expects.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ParkingLot, type TargetState, type Ticket } from '../src/pipeline/parking-lot.ts';
import { flexTierKey } from '../src/state/hold-offs.ts';

const T = 'p/a';
const FLEX = flexTierKey(T);

const opts = (deadlineAtMs: number, signal: AbortSignal = new AbortController().signal) => ({
  route: 'chat',
  deadlineAtMs,
  signal,
  maxQueue: 100,
  maxWaitMs: undefined,
  minAttemptMs: 0,
});

describe('the parking lot with a flex tier: cases the fuzz found', () => {
  let states: Record<string, TargetState>;
  let lot: ParkingLot;
  let released: string[];
  let tickets: Ticket[];
  beforeEach(() => {
    vi.useFakeTimers({ now: 0 });
    states = { [T]: { mode: 'available', slots: 1 }, [FLEX]: { mode: 'available', slots: 1 } };
    lot = new ParkingLot({ now: () => Date.now(), random: () => 0, stateOf: (key) => states[key]! });
    released = [];
    tickets = [];
  });
  afterEach(() => {
    lot.close();
    vi.useRealTimers();
  });
  const park = (key: string, deadlineAtMs: number, name: string, signal?: AbortSignal) =>
    void lot.park(key, opts(deadlineAtMs, signal)).then((r) => {
      if (r.kind === 'released') (released.push(name), tickets.push(r.ticket));
    });

  // Seed 20251611 and others ('independent'): a request whose key had a slot stayed behind one of the other key that had
  // none. The README's one order: "one that may not go now holds back every one after it". Production's flex key has
  // its target's slots whenever neither is blocked (target-state.ts), so only a script of unequal slots shows it.
  it('keeps a flex request behind a default-tier one ahead of it that has no slot, in one order', async () => {
    park(T, 10_000, 'default');
    park(FLEX, 20_000, 'flex');
    await vi.advanceTimersByTimeAsync(0);
    expect(released).toEqual(['default']);
    // The default key's one slot is taken; the flex key, scripted with more, waits behind the next default request.
    park(T, 15_000, 'default 2');
    states[FLEX] = { mode: 'available', slots: 5 };
    lot.notify(FLEX);
    await vi.advanceTimersByTimeAsync(300);
    expect(released).toEqual(['default']);
    tickets[0]!.done();
    await vi.advanceTimersByTimeAsync(0);
    expect(released).toEqual(['default', 'default 2', 'flex']);
  });

  // Seed 20251616 and others ('independent'): the default-tier request ahead left (its client went), and the flex one
  // behind it, with a slot of its key, went only at the lot's re-check: a parked request leaving pumps nothing.
  it('lets the request behind a parked one that left go by the re-check, within 250 ms', async () => {
    states[T] = { mode: 'available', slots: 0 };
    states[FLEX] = { mode: 'available', slots: 1 };
    const client = new AbortController();
    park(T, 10_000, 'default', client.signal);
    park(FLEX, 20_000, 'flex');
    await vi.advanceTimersByTimeAsync(0);
    expect(released).toEqual([]);
    client.abort();
    await vi.advanceTimersByTimeAsync(250);
    expect(released).toEqual(['flex']);
  });

  // Seed 5090 ('independent'): a default-tier newcomer went first in its own park() call, then two flex requests under
  // the flex key's larger limit; handled after them, the newcomer looked released beyond its key's slots. The lot counts
  // both tiers at each release: at its own, the newcomer's key had a slot.
  it('counts both tiers at each release, whichever key released it', async () => {
    states[T] = { mode: 'available', slots: 2 };
    states[FLEX] = { mode: 'blocked', availableAtMs: 60_000 };
    park(FLEX, 20_000, 'flex 1');
    park(FLEX, 21_000, 'flex 2');
    park(FLEX, 22_000, 'flex 3');
    await vi.advanceTimersByTimeAsync(0);
    states[FLEX] = { mode: 'available', slots: 3 };
    park(T, 10_000, 'default');
    await vi.advanceTimersByTimeAsync(0);
    // The default newcomer (earliest deadline) went first, 1 of its 2; the flex key's 3 let two more go, not three. Its
    // own answer is handled after theirs (its promise is only awaited once park() returns): the order seen is not the lot's.
    expect(released).toEqual(['flex 1', 'flex 2', 'default']);
    tickets[released.indexOf('default')]!.done();
    await vi.advanceTimersByTimeAsync(0);
    expect(released).toEqual(['flex 1', 'flex 2', 'default', 'flex 3']);
  });
});
