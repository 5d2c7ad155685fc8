// A request parks for the target expected back first; its other targets, away too when it parked, are its alternates.
// Should one come back (breaker closed, hold-off over) while its own is still away, it leaves the lot (`moved`) to try
// it, at a random moment of the next second: parked for a primary whose probes kept failing, it used to be told only
// at its last chance, and a backup that was back waited out the primary's outage unused.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ParkingLot, type TargetState } from '../src/pipeline/parking-lot.ts';

const states = new Map<string, TargetState>();
let lot: ParkingLot;
let random: () => number;
const outcomes: string[] = [];

beforeEach(() => {
  vi.useFakeTimers({ now: 0 });
  states.clear();
  states.set('primary', { mode: 'blocked', availableAtMs: 60_000 });
  states.set('backup', { mode: 'blocked', availableAtMs: 60_000 });
  outcomes.length = 0;
  random = () => 0;
  lot = new ParkingLot({ now: () => Date.now(), random: () => random(), stateOf: (k) => states.get(k) ?? { mode: 'available', slots: 10 }, onOutcome: (_r, o) => outcomes.push(o) });
});
afterEach(() => {
  lot.close();
  vi.useRealTimers();
});

const opts = (deadlineAtMs: number, alternates?: string[]) => ({ route: 'chat', deadlineAtMs, signal: new AbortController().signal, maxQueue: 100, maxWaitMs: undefined, minAttemptMs: 500, ...(alternates && { alternates }) });

describe('a parked request and its alternates', () => {
  it('leaves when an alternate closes its breaker while its own target is still away', async () => {
    let result: string | undefined;
    void lot.park('primary', opts(30_000, ['backup'])).then((r) => (result = r.kind));
    await vi.advanceTimersByTimeAsync(5_000);
    expect(result).toBeUndefined();
    states.set('backup', { mode: 'available', slots: 4 });
    lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    expect(result).toBe('moved');
    expect(outcomes).toEqual(['moved']);
    expect(lot.waiting('primary')).toBe(0);
  });

  it('sends one request, the first in order, to carry the probe of an alternate only probing; none without alternates', async () => {
    const results: string[] = [];
    void lot.park('primary', opts(30_000, ['backup'])).then((r) => results.push(`a:${r.kind}`));
    void lot.park('primary', opts(20_000, ['backup'])).then((r) => results.push(`b:${r.kind}:${r.kind === 'moved' ? r.probe : ''}`));
    void lot.park('primary', opts(10_000)).then((r) => results.push(`c:${r.kind}`));
    states.set('backup', { mode: 'probing', slots: 1 });
    lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    // Agents that each wait for their answer, all parked: no newcomer would probe the backup. It is told whose probe
    // it carries (it parks for that target should its breaker give the probe only to a parked request).
    expect(results).toEqual(['b:moved:backup']);
    expect(outcomes).toEqual(['moved']);
    expect(lot.waiting('primary')).toBe(2);
    // Its probe out, the backup stays probing: nobody else goes, however often the lot looks.
    for (let i = 0; i < 4; i++) {
      lot.notify('backup');
      await vi.advanceTimersByTimeAsync(200);
    }
    expect(results).toEqual(['b:moved:backup']);
    // The probe closed the breaker: the others watching it leave over the next second.
    states.set('backup', { mode: 'available', slots: 4 });
    lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    expect(results).toEqual(['b:moved:backup', 'a:moved']);
    expect(lot.waiting('primary')).toBe(1);
  });

  it('moves no more while the one moved waits parked for the alternate itself (no permit for it), nor after a failed probe', async () => {
    const results: string[] = [];
    for (const [name, d] of [['a', 10_000], ['b', 20_000], ['c', 30_000]] as const) void lot.park('primary', opts(d, ['backup'])).then((r) => results.push(`${name}:${r.kind}`));
    states.set('backup', { mode: 'probing', slots: 1 });
    lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    expect(results).toEqual(['a:moved']);
    // Another instance's probe holds the permit: the moved request parks again, for the backup, until one is free.
    void lot.park('backup', { ...opts(10_000, ['primary']), notBeforeMs: Date.now() + 5_000 }).then((r) => results.push(`a2:${r.kind}`));
    await vi.advanceTimersByTimeAsync(3_000);
    expect(results).toEqual(['a:moved']);
    // The probe failed: the breaker reopens, and nothing moves until it may probe again.
    states.set('backup', { mode: 'blocked', availableAtMs: 8_000 });
    lot.notify('backup');
    await vi.advanceTimersByTimeAsync(1_000);
    expect(results).toEqual(['a:moved']);
  });

  it('sends another once the window is over when the alternate still waits for a probe (the one moved was lost), and again after a failed probe', async () => {
    const results: string[] = [];
    for (const [name, d] of [['a', 10_000], ['b', 20_000], ['c', 30_000]] as const) void lot.park('primary', opts(d, ['backup'])).then((r) => results.push(`${name}:${r.kind}`));
    states.set('backup', { mode: 'probing', slots: 1 });
    lot.notify('backup');
    await vi.advanceTimersByTimeAsync(999);
    expect(results).toEqual(['a:moved']);
    // Its client left on the way: nothing probes the backup. A second later the lot looks by its own timer.
    await vi.advanceTimersByTimeAsync(1);
    expect(results).toEqual(['a:moved', 'b:moved']);
    // That probe failed: the breaker reopens until 5 s; then the last one carries the next probe.
    states.set('backup', { mode: 'blocked', availableAtMs: 5_000 });
    lot.notify('backup');
    await vi.advanceTimersByTimeAsync(2_000);
    expect(results).toEqual(['a:moved', 'b:moved']);
    states.set('backup', { mode: 'probing', slots: 1 });
    await vi.advanceTimersByTimeAsync(2_000);
    expect(results).toEqual(['a:moved', 'b:moved', 'c:moved']);
  });

  it('fills the probe slots a half-open alternate has after its first probe succeeded, not more', async () => {
    const results: string[] = [];
    for (let i = 0; i < 6; i++) void lot.park('primary', opts(10_000 + i, ['backup'])).then((r) => results.push(`${i}:${r.kind}`));
    states.set('backup', { mode: 'probing', slots: 1 });
    lot.notify('backup');
    await vi.advanceTimersByTimeAsync(50);
    expect(results).toEqual(['0:moved']);
    // Half-open: three probes at a time, one of them the first (its answer in, but within the window).
    states.set('backup', { mode: 'probing', slots: 3 });
    lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    expect(results).toEqual(['0:moved', '1:moved', '2:moved']);
    lot.notify('backup');
    await vi.advanceTimersByTimeAsync(500);
    expect(results).toHaveLength(3);
  });

  it('leaves when an alternate held off comes back by the clock (no one tells the lot a hold-off ended)', async () => {
    states.set('backup', { mode: 'blocked', availableAtMs: 3_000 });
    let result: string | undefined;
    void lot.park('primary', opts(30_000, ['backup'])).then((r) => (result = r.kind));
    await vi.advanceTimersByTimeAsync(2_999);
    expect(result).toBeUndefined();
    // The hold-off's end: the state says so from now on; the lot looks by its own timer.
    states.set('backup', { mode: 'available', slots: 4 });
    await vi.advanceTimersByTimeAsync(1);
    expect(result).toBe('moved');
  });

  it('spreads those leaving over the next second, never past half their time left', async () => {
    const at: number[] = [];
    const draws = [0.9, 0.1, 0.5];
    random = () => draws.shift() ?? 0;
    for (const d of [30_000, 30_000, 2_400]) void lot.park('primary', opts(d, ['backup'])).then(() => at.push(Date.now()));
    await vi.advanceTimersByTimeAsync(1_000);
    states.set('backup', { mode: 'available', slots: 4 });
    lot.notify('backup');
    await vi.advanceTimersByTimeAsync(1_000);
    // Deadline order in the queue: the 2.4 s one first (0.9 s drawn, but half its time left is 0.7 s), then 100 ms, 500 ms.
    expect(at.sort((a, b) => a - b)).toEqual([1_100, 1_500, 1_700]);
  });

  it('is released to its own target as usual when that comes back first, and watches no alternate that was available when it parked', async () => {
    states.set('backup', { mode: 'available', slots: 4 });
    let result: string | undefined;
    void lot.park('primary', opts(30_000, ['backup'])).then((r) => (result = r.kind));
    await vi.advanceTimersByTimeAsync(1_000);
    // Available when it parked (the caller found it unavailable by other means): watching it would move the request
    // back and forth at once, in a loop.
    expect(result).toBeUndefined();
    states.set('primary', { mode: 'available', slots: 1 });
    lot.notify('primary');
    await vi.advanceTimersByTimeAsync(0);
    expect(result).toBe('released');
  });

  it('times out rather than leave with less than minAttemptMs left', async () => {
    let result: string | undefined;
    void lot.park('primary', opts(2_000, ['backup'])).then((r) => (result = r.kind));
    vi.setSystemTime(1_600);
    states.set('backup', { mode: 'available', slots: 4 });
    lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    // Not moved (the clock is past its cut-off, its timer late as on a busy event loop): its timer times it out.
    expect(result).toBeUndefined();
    await vi.advanceTimersByTimeAsync(1_500);
    expect(outcomes).toEqual(['timeout']);
  });
});
