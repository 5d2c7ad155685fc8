// A request parks for the target expected back first; its other targets, away too when it parked, are its alternates.
// Should one come back (breaker closed, hold-off over) while its own is still away, it leaves the lot (`moved`) to try
// it, at a random moment of the next second: parked for a primary whose probes kept failing, it used to be told only
// at its last chance, and a backup that was back waited out the primary's outage unused.
import { describe, expect, it, vi } from 'vitest';
import { ParkingLot, type TargetState } from '../src/pipeline/parking-lot.ts';
import { flexTierKey } from '../src/state/hold-offs.ts';
import { useLotFixture } from './helpers/lot-fixture.ts';

const f = useLotFixture();
const { states, looked, outcomes } = f;

const opts = (deadlineAtMs: number, alternates?: string[]) => ({ route: 'chat', deadlineAtMs, signal: new AbortController().signal, maxQueue: 100, maxWaitMs: undefined, minAttemptMs: 500, ...(alternates && { alternates }) });

describe('a parked request and its alternates', () => {
  it('leaves when an alternate closes its breaker while its own target is still away', async () => {
    let result: string | undefined;
    void f.lot.park('primary', opts(30_000, ['backup'])).then((r) => (result = r.kind));
    await vi.advanceTimersByTimeAsync(5_000);
    expect(result).toBeUndefined();
    states.set('backup', { mode: 'available', slots: 4 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    expect(result).toBe('moved');
    expect(outcomes).toEqual(['moved']);
    expect(f.lot.waiting('primary')).toBe(0);
  });

  it('sends one request, the first in order, to carry the probe of an alternate only probing; none without alternates', async () => {
    const results: string[] = [];
    void f.lot.park('primary', opts(30_000, ['backup'])).then((r) => results.push(`a:${r.kind}`));
    void f.lot.park('primary', opts(20_000, ['backup'])).then((r) => results.push(`b:${r.kind}:${r.kind === 'moved' ? r.probe : ''}`));
    void f.lot.park('primary', opts(10_000)).then((r) => results.push(`c:${r.kind}`));
    states.set('backup', { mode: 'probing', slots: 1 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    // Agents that each wait for their answer, all parked: no newcomer would probe the backup. It is told whose probe
    // it carries (it parks for that target should its breaker give the probe only to a parked request).
    expect(results).toEqual(['b:moved:backup']);
    expect(outcomes).toEqual(['moved']);
    expect(f.lot.waiting('primary')).toBe(2);
    // Its probe out, the backup stays probing: nobody else goes, however often the lot looks.
    for (let i = 0; i < 4; i++) {
      f.lot.notify('backup');
      await vi.advanceTimersByTimeAsync(200);
    }
    expect(results).toEqual(['b:moved:backup']);
    // The probe closed the breaker: the others watching it leave over the next second.
    states.set('backup', { mode: 'available', slots: 4 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    expect(results).toEqual(['b:moved:backup', 'a:moved']);
    expect(f.lot.waiting('primary')).toBe(1);
  });

  it('moves no more while the one moved waits parked for the alternate itself (no permit for it), nor after a failed probe', async () => {
    const results: string[] = [];
    for (const [name, d] of [['a', 10_000], ['b', 20_000], ['c', 30_000]] as const) void f.lot.park('primary', opts(d, ['backup'])).then((r) => results.push(`${name}:${r.kind}`));
    states.set('backup', { mode: 'probing', slots: 1 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    expect(results).toEqual(['a:moved']);
    // Another instance's probe holds the permit: the moved request parks again, for the backup, until one is free.
    void f.lot.park('backup', { ...opts(10_000, ['primary']), notBeforeMs: Date.now() + 5_000 }).then((r) => results.push(`a2:${r.kind}`));
    await vi.advanceTimersByTimeAsync(3_000);
    expect(results).toEqual(['a:moved']);
    // The probe failed: the breaker reopens, and nothing moves until it may probe again.
    states.set('backup', { mode: 'blocked', availableAtMs: 8_000 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(1_000);
    expect(results).toEqual(['a:moved']);
  });

  it('sends another once the window is over when the alternate still waits for a probe (the one moved was lost), and again after a failed probe', async () => {
    const results: string[] = [];
    for (const [name, d] of [['a', 10_000], ['b', 20_000], ['c', 30_000]] as const) void f.lot.park('primary', opts(d, ['backup'])).then((r) => results.push(`${name}:${r.kind}`));
    states.set('backup', { mode: 'probing', slots: 1 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(999);
    expect(results).toEqual(['a:moved']);
    // Its client left on the way: nothing probes the backup. A second later the lot looks by its own timer.
    await vi.advanceTimersByTimeAsync(1);
    expect(results).toEqual(['a:moved', 'b:moved']);
    // That probe failed: the breaker reopens until 5 s; then the last one carries the next probe.
    states.set('backup', { mode: 'blocked', availableAtMs: 5_000 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(2_000);
    expect(results).toEqual(['a:moved', 'b:moved']);
    states.set('backup', { mode: 'probing', slots: 1 });
    await vi.advanceTimersByTimeAsync(2_000);
    expect(results).toEqual(['a:moved', 'b:moved', 'c:moved']);
  });

  it('fills the probe slots a half-open alternate has after its first probe succeeded, not more', async () => {
    const results: string[] = [];
    for (let i = 0; i < 6; i++) void f.lot.park('primary', opts(10_000 + i, ['backup'])).then((r) => results.push(`${i}:${r.kind}`));
    states.set('backup', { mode: 'probing', slots: 1 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(50);
    expect(results).toEqual(['0:moved']);
    // Half-open: three probes at a time, one of them the first (its answer in, but within the window).
    states.set('backup', { mode: 'probing', slots: 3 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    expect(results).toEqual(['0:moved', '1:moved', '2:moved']);
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(500);
    expect(results).toHaveLength(3);
  });

  it('leaves when an alternate held off comes back by the clock (no one tells the lot a hold-off ended)', async () => {
    states.set('backup', { mode: 'blocked', availableAtMs: 3_000 });
    let result: string | undefined;
    void f.lot.park('primary', opts(30_000, ['backup'])).then((r) => (result = r.kind));
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
    f.random = () => draws.shift() ?? 0;
    for (const d of [30_000, 30_000, 2_400]) void f.lot.park('primary', opts(d, ['backup'])).then(() => at.push(Date.now()));
    await vi.advanceTimersByTimeAsync(1_000);
    states.set('backup', { mode: 'available', slots: 4 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(1_000);
    // Deadline order in the queue: the 2.4 s one first (0.9 s drawn, but half its time left is 0.7 s), then 100 ms, 500 ms.
    expect(at.sort((a, b) => a - b)).toEqual([1_100, 1_500, 1_700]);
  });

  it('is released to its own target as usual when that comes back first, and watches no alternate that was available when it parked', async () => {
    states.set('backup', { mode: 'available', slots: 4 });
    let result: string | undefined;
    void f.lot.park('primary', opts(30_000, ['backup'])).then((r) => (result = r.kind));
    await vi.advanceTimersByTimeAsync(1_000);
    // Available when it parked (the caller found it unavailable by other means): watching it would move the request
    // back and forth at once, in a loop.
    expect(result).toBeUndefined();
    states.set('primary', { mode: 'available', slots: 1 });
    f.lot.notify('primary');
    await vi.advanceTimersByTimeAsync(0);
    expect(result).toBe('released');
  });

  it('times out rather than leave with less than minAttemptMs left', async () => {
    let result: string | undefined;
    void f.lot.park('primary', opts(2_000, ['backup'])).then((r) => (result = r.kind));
    vi.setSystemTime(1_600);
    states.set('backup', { mode: 'available', slots: 4 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    // Not moved (the clock is past its cut-off, its timer late as on a busy event loop): its timer times it out.
    expect(result).toBeUndefined();
    await vi.advanceTimersByTimeAsync(1_500);
    expect(outcomes).toEqual(['timeout']);
  });
});

// Review of the lot's moves to carry a probing alternate's probes (parking-lot.ts #moveToAlternates): what wakes the
// lot while the alternate's own parked hold its probes, and how often.
describe('requests moved to carry an alternate probe', () => {
  it('do not spin the lot while the one moved waits parked for the alternate past the window', async () => {
    const results: string[] = [];
    for (const [name, d] of [['a', 20_000], ['b', 30_000]] as const) void f.lot.park('primary', opts(d, ['backup'])).then((r) => results.push(`${name}:${r.kind}`));
    states.set('backup', { mode: 'probing', slots: 1 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    expect(results).toEqual(['a:moved']);
    // Another instance's probe holds the permit: the moved request parks for the backup until one is free (10 s).
    void f.lot.park('backup', { ...opts(20_000, ['primary']), notBeforeMs: Date.now() + 10_000 }).then((r) => results.push(`a2:${r.kind}`));
    await vi.advanceTimersByTimeAsync(1_500);
    looked.length = 0;
    await vi.advanceTimersByTimeAsync(5_000);
    expect(results).toEqual(['a:moved']);
    // A look a second (or a few for the backup's own queue) is fine; one a millisecond is not.
    expect(looked.length).toBeLessThan(200);
  });

  it('looks again by itself when the alternate\'s own parked leave without carrying its probe', async () => {
    const results: string[] = [];
    // Parked for the backup itself, probing, waiting for a permit held elsewhere; its client will leave.
    states.set('backup', { mode: 'probing', slots: 1 });
    const gone = new AbortController();
    void f.lot.park('backup', { ...opts(30_000), signal: gone.signal, notBeforeMs: 20_000 }).then((r) => results.push(`b:${r.kind}`));
    states.set('backup', { mode: 'blocked', availableAtMs: 60_000 });
    void f.lot.park('primary', opts(30_000, ['backup'])).then((r) => results.push(`p:${r.kind}`));
    states.set('backup', { mode: 'probing', slots: 1 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(1_000);
    expect(results).toEqual([]);
    gone.abort();
    await vi.advanceTimersByTimeAsync(2_500);
    // Nothing else will probe the backup now: the request parked for the primary carries its probe.
    expect(results).toEqual(['b:aborted', 'p:moved']);
  });

  it("are not held back by the alternate's flex-tier requests its tier's own hold-off keeps parked (they carry no probe)", async () => {
    const results: string[] = [];
    const flex = flexTierKey('backup');
    states.set(flex, { mode: 'blocked', availableAtMs: 60_000 });
    void f.lot.park(flex, opts(90_000)).then((r) => results.push(`f:${r.kind}`));
    void f.lot.park('primary', opts(30_000, ['backup'])).then((r) => results.push(`p:${r.kind}`));
    states.set('backup', { mode: 'probing', slots: 1 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    expect(results).toEqual(['p:moved']);
  });

  it('are not sent while the probe released from the alternate\'s own queue is out; once it is over, one is', async () => {
    const results: string[] = [];
    states.set('backup', { mode: 'probing', slots: 1 });
    const probe = await f.lot.park('backup', opts(30_000));
    expect(probe.kind).toBe('released');
    void f.lot.park('primary', opts(30_000, ['backup'])).then((r) => results.push(`p:${r.kind}`));
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(3_000);
    expect(results).toEqual([]);
    // The probe's answer came and the breaker still wants one (another half-open probe): the lot looks by itself.
    if (probe.kind === 'released') probe.ticket.done();
    await vi.advanceTimersByTimeAsync(1_100);
    expect(results).toEqual(['p:moved']);
  });

  it('start a new window when the alternate probes again after a failed probe within the last', async () => {
    const results: string[] = [];
    for (const [name, d] of [['a', 20_000], ['b', 30_000]] as const) void f.lot.park('primary', opts(d, ['backup'])).then((r) => results.push(`${name}:${r.kind}`));
    states.set('backup', { mode: 'probing', slots: 1 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(100);
    expect(results).toEqual(['a:moved']);
    states.set('backup', { mode: 'blocked', availableAtMs: 300 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(100);
    states.set('backup', { mode: 'probing', slots: 1 });
    await vi.advanceTimersByTimeAsync(150);
    expect(results).toEqual(['a:moved', 'b:moved']);
  });

  it('cost no scan of the parked per release while their own target is back and the alternate only probing', async () => {
    vi.useRealTimers();
    const N = 20_000;
    const releaseAll = async (backup: TargetState): Promise<number> => {
      f.lot.close();
      f.lot = new ParkingLot({ now: () => Date.now(), random: () => 0, stateOf: (k) => states.get(k) ?? { mode: 'available', slots: 10 } });
      states.set('primary', { mode: 'blocked', availableAtMs: Date.now() + 60_000 });
      states.set('backup', { mode: 'blocked', availableAtMs: Date.now() + 60_000 });
      let released = 0;
      for (let i = 0; i < N; i++)
        void f.lot.park('primary', { ...opts(Date.now() + 30_000, ['backup']), maxQueue: N }).then((r) => {
          released++;
          if (r.kind === 'released') r.ticket.done();
        });
      states.set('backup', backup);
      states.set('primary', { mode: 'available', slots: 10 });
      const t0 = process.hrtime.bigint();
      f.lot.notify('primary');
      for (let i = 0; i < 1_000 && released < N; i++) await new Promise((r) => setImmediate(r));
      expect(released).toBe(N);
      return Number(process.hrtime.bigint() - t0) / 1e6;
    };
    const blockedMs = await releaseAll({ mode: 'blocked', availableAtMs: Date.now() + 60_000 });
    // Each release's done() pumps the queue: a scan of every parked request per pump was n² (20,000: 2.6 s, not 0.6).
    const probingMs = await releaseAll({ mode: 'probing', slots: 1 });
    expect(probingMs, `released in ${probingMs.toFixed(0)} ms, ${blockedMs.toFixed(0)} ms with the backup blocked`).toBeLessThan(blockedMs * 2 + 500);
  });
});
