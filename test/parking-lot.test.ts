// The parking lot: bounded, deadline-ordered, released at a slow-start pace, nothing released while blocked.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ParkingLot, type TargetState } from '../src/pipeline/parking-lot.ts';

let state: TargetState;
let lot: ParkingLot;
const outcomes: string[] = [];

beforeEach(() => {
  vi.useFakeTimers({ now: 0 });
  state = { mode: 'blocked', availableAtMs: 1_000 };
  outcomes.length = 0;
  lot = new ParkingLot({ now: () => Date.now(), stateOf: () => state, onOutcome: (_r, o) => outcomes.push(o) });
});
afterEach(() => {
  lot.close();
  vi.useRealTimers();
});

const opts = (deadlineAtMs: number, signal = new AbortController().signal, maxQueue = 100) => ({ route: 'chat', deadlineAtMs, signal, maxQueue, maxWaitMs: undefined });

describe('the parking lot', () => {
  it('releases nothing while the target is blocked, then in deadline order', async () => {
    const order: number[] = [];
    const parked = [5_000, 3_000, 4_000].map((d) => lot.park('t', opts(d)).then((r) => (r.kind === 'released' && order.push(d), r)));
    await vi.advanceTimersByTimeAsync(999);
    expect(order).toEqual([]);
    state = { mode: 'available', slots: 2 };
    await vi.advanceTimersByTimeAsync(1);
    // Two slots: the two earliest deadlines go first.
    expect(order).toEqual([3_000, 4_000]);
    const first = await parked[1]!;
    if (first.kind === 'released') first.ticket.done();
    await vi.advanceTimersByTimeAsync(0);
    expect(order).toEqual([3_000, 4_000, 5_000]);
  });

  it('keeps released requests in flight within the target\'s limit, whatever it is now', async () => {
    state = { mode: 'available', slots: 2 };
    const released: Array<{ done(): void }> = [];
    for (let i = 0; i < 20; i++) void lot.park('t', opts(10_000 + i)).then((r) => r.kind === 'released' && released.push(r.ticket));
    await vi.advanceTimersByTimeAsync(0);
    expect(released).toHaveLength(2);
    state = { mode: 'available', slots: 6 };
    released.splice(0).forEach((t) => t.done());
    await vi.advanceTimersByTimeAsync(0);
    expect(released).toHaveLength(6);
    state = { mode: 'available', slots: 1 };
    released.splice(0).forEach((t) => t.done());
    await vi.advanceTimersByTimeAsync(0);
    expect(released).toHaveLength(1);
  });

  it('lets only `slots` requests through while probing', async () => {
    state = { mode: 'probing', slots: 1 };
    let n = 0;
    for (let i = 0; i < 5; i++) void lot.park('t', opts(10_000)).then((r) => r.kind === 'released' && n++);
    await vi.advanceTimersByTimeAsync(0);
    expect(n).toBe(1);
  });

  it('rejects when the route\'s queue is full', async () => {
    for (let i = 0; i < 2; i++) void lot.park('t', opts(10_000, undefined, 2));
    expect(await lot.park('t', opts(10_000, undefined, 2))).toEqual({ kind: 'full' });
    expect(outcomes).toContain('full');
  });

  it('lets a request whose client left (or whose deadline passed) leave at once', async () => {
    const ctl = new AbortController();
    const p = lot.park('t', opts(10_000, ctl.signal));
    ctl.abort();
    expect(await p).toEqual({ kind: 'aborted' });
    expect(lot.waiting('t')).toBe(0);
  });

  it('answers every parked request at once when closed', async () => {
    const p = lot.park('t', opts(10_000));
    lot.close();
    expect(await p).toEqual({ kind: 'closing' });
  });
});
