// Mutation tests of the parking lot's turns between clients (parking-lot.ts turnAt, the LotClient counts, #spread's
// turns): each case kills a mutant the lot's other tests let live. Fake timers; the lot's clock is the fake clock
// unless a case moves it ahead of the timers (a busy event loop whose timers are late).
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ParkingLot, type Ticket, type TargetState } from '../src/pipeline/parking-lot.ts';
import { flexTierKey } from '../src/state/hold-offs.ts';

let states: Map<string, TargetState>;
let ahead: number;
let lot: ParkingLot;

beforeEach(() => {
  vi.useFakeTimers({ now: 0 });
  ahead = 0;
  states = new Map([['t', { mode: 'blocked', availableAtMs: 1_000 }]]);
  lot = new ParkingLot({ now: () => Date.now() + ahead, random: () => 0, stateOf: (key) => states.get(key) ?? states.get('t')! });
});
afterEach(() => {
  lot.close();
  vi.useRealTimers();
});

const opts = (client: string, deadlineAtMs: number, cls = 0) => ({
  route: 'chat', deadlineAtMs, signal: new AbortController().signal, maxQueue: 1_000, maxWaitMs: undefined, minAttemptMs: 0, cls, client });

interface Log {
  order: string[];
  out: Map<string, Ticket>;
  outcomes: Map<string, string>;
}

function park(log: Log, label: string, client: string, deadlineAtMs: number, cls = 0, key = 't', more: { maxWaitMs?: number; minAttemptMs?: number } = {}): void {
  void lot.park(key, { ...opts(client, deadlineAtMs, cls), ...more }).then((r) => {
    log.outcomes.set(label, r.kind);
    if (r.kind !== 'released') return;
    log.order.push(label);
    log.out.set(label, r.ticket);
  });
}

const newLog = (): Log => ({ order: [], out: new Map(), outcomes: new Map() });

async function done(log: Log, label: string): Promise<void> {
  log.out.get(label)!.done();
  await vi.advanceTimersByTimeAsync(0);
}

describe('the parking lot between clients, mutation cases', () => {
  it('forgets a client whose last parked request timed out, so it comes back as a newcomer, not with its old turn', async () => {
    const log = newLog();
    states.set('t', { mode: 'available', slots: 1 });
    park(log, 'g0', 'gone', 60_000);
    // g1 waits 50 ms at most; g0 holds the slot.
    park(log, 'g1', 'gone', 60_001, 0, 't', { maxWaitMs: 50 });
    await vi.advanceTimersByTimeAsync(0);
    expect(log.order).toEqual(['g0']); // gone served at release 1
    park(log, 'k0', 'keep', 70_000);
    park(log, 'k1', 'keep', 70_001);
    park(log, 'k2', 'keep', 70_002);
    await vi.advanceTimersByTimeAsync(0);
    // keep came after release 1 (served at 0.5): its turn before gone's (served at 1), though g1's deadline is earlier.
    await done(log, 'g0');
    expect(log.order).toEqual(['g0', 'k0']);
    await vi.advanceTimersByTimeAsync(60);
    expect(log.outcomes.get('g1')).toBe('timeout'); // gone holds and parks nothing now: forgotten
    park(log, 'o0', 'other', 65_000); // a newcomer after release 2 (1.5)
    await done(log, 'k0');
    expect(log.order.at(-1)).toBe('o0'); // release 3
    park(log, 'g2', 'gone', 64_000); // gone back: a newcomer after release 3 (2.5)
    await done(log, 'o0');
    // keep (served at 2) goes before gone come back (2.5); remembered as served at 1, gone would have gone first.
    expect(log.order.at(-1)).toBe('k1');
    await done(log, 'k1');
    expect(log.order.at(-1)).toBe('g2');
  });

  it('passes over a client whose request is past its cut-off by the clock, though its timer has not fired', async () => {
    const log = newLog();
    states.set('t', { mode: 'available', slots: 1 });
    park(log, 'a0', 'a', 60_000);
    park(log, 'a1', 'a', 60_001);
    await vi.advanceTimersByTimeAsync(0);
    // b holds nothing: its turn. Its deadline is after a1's, its cut-off (10 s of minAttemptMs) before.
    park(log, 'b0', 'b', 70_000, 0, 't', { minAttemptMs: 10_000 });
    await vi.advanceTimersByTimeAsync(0);
    // The event loop is late: the lot's clock is past b0's cut-off, its timer not yet run.
    ahead = 60_000.5;
    log.out.get('a0')!.done();
    await vi.advanceTimersByTimeAsync(0);
    expect(log.order).toEqual(['a0', 'a1']);
    expect(log.outcomes.get('b0')).toBe('timeout');
  });

  it("does not release another client's flex-tier request past its own tier's slots, for its turn", async () => {
    const log = newLog();
    const flex = flexTierKey('t');
    states.set('t', { mode: 'available', slots: 3 });
    states.set(flex, { mode: 'available', slots: 1 });
    park(log, 'a0', 'a', 60_000);
    await vi.advanceTimersByTimeAsync(0);
    expect(log.order).toEqual(['a0']); // one out: the flex tier's one slot is taken, the default tier has two
    states.set('t', { mode: 'blocked', availableAtMs: 1_000 });
    lot.notify('t');
    park(log, 'a1', 'a', 61_000);
    park(log, 'b0', 'b', 62_000, 0, flex);
    states.set('t', { mode: 'available', slots: 3 });
    await vi.advanceTimersByTimeAsync(1_000);
    // b holds none, a one: b's turn, but its tier has no slot; a1 goes.
    expect(log.order).toEqual(['a0', 'a1']);
  });

  it('keeps the earlier deadline between two clients of equal standing while a third, foremost, may not go yet', async () => {
    const log = newLog();
    states.set('t', { mode: 'available', slots: 1 });
    // z never served (-0.5), not before 10 s; w served at release 1; x and y come after it, as newcomers (0.5 each).
    void lot.park('t', { ...opts('z', 30_000), notBeforeMs: 10_000 }).then((r) => r.kind === 'released' && log.order.push('z0'));
    park(log, 'w0', 'w', 20_000);
    await vi.advanceTimersByTimeAsync(0);
    park(log, 'x0', 'x', 21_000);
    park(log, 'y0', 'y', 22_000);
    await done(log, 'w0');
    // z's turn, but it may not go: of x and y, as even, the earlier deadline.
    expect(log.order).toEqual(['w0', 'x0']);
  });

  it("never takes a lower class's request for the turn of a class's client that may not go yet", async () => {
    const log = newLog();
    states.set('t', { mode: 'available', slots: 1 });
    // b never served (-0.5), not before 10 s; a served at release 1, one more parked; c's batch came after (0.5).
    void lot.park('t', { ...opts('b', 6_000), notBeforeMs: 10_000 }).then((r) => r.kind === 'released' && log.order.push('b-online'));
    park(log, 'a-online0', 'a', 5_000);
    park(log, 'a-online1', 'a', 5_001);
    await vi.advanceTimersByTimeAsync(0);
    park(log, 'c-batch', 'c', 5_500, 1);
    await done(log, 'a-online0');
    // Online's turn is b's, which may not go: a's goes, never batch's.
    expect(log.order).toEqual(['a-online0', 'a-online1']);
  });

  it("hands out the release window's moments class by class before turn by turn", async () => {
    const draws = [0, 0.25, 0.5, 0.75];
    const spreading = new ParkingLot({ now: () => Date.now(), random: () => draws.shift()!, stateOf: () => states.get('t')! });
    const releasedAt = new Map<string, number>();
    states.set('t', { mode: 'blocked', availableAtMs: 5_000 });
    for (const [label, client, cls] of [['on-a0', 'a', 0], ['on-a1', 'a', 0], ['on-a2', 'a', 0], ['batch-b0', 'b', 1]] as const) {
      void spreading.park('t', opts(client, 60_000, cls)).then((r) => r.kind === 'released' && releasedAt.set(label, Date.now()));
    }
    await vi.advanceTimersByTimeAsync(4_999);
    states.set('t', { mode: 'available', slots: 64 });
    await vi.advanceTimersByTimeAsync(2_000);
    spreading.close();
    // Window 1 s: online's three first (0, 250, 500 ms), batch's last (750 ms), though it is b's first.
    expect([...releasedAt.entries()]).toEqual([
      ['on-a0', 5_000],
      ['on-a1', 5_250],
      ['on-a2', 5_500],
      ['batch-b0', 5_750],
    ]);
  });
});
