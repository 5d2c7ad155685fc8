// Review of the lot's moves to carry a probing alternate's probes (parking-lot.ts #moveToAlternates): what wakes the
// lot while the alternate's own parked hold its probes, and how often.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ParkingLot, type TargetState } from '../src/pipeline/parking-lot.ts';
import { flexTierKey } from '../src/state/hold-offs.ts';

const states = new Map<string, TargetState>();
let lot: ParkingLot;
let looks = 0;
const outcomes: string[] = [];

beforeEach(() => {
  vi.useFakeTimers({ now: 0 });
  states.clear();
  states.set('primary', { mode: 'blocked', availableAtMs: 60_000 });
  states.set('backup', { mode: 'blocked', availableAtMs: 60_000 });
  outcomes.length = 0;
  looks = 0;
  lot = new ParkingLot({
    now: () => Date.now(),
    random: () => 0,
    stateOf: (k) => {
      looks++;
      return states.get(k) ?? { mode: 'available', slots: 10 };
    },
    onOutcome: (_r, o) => outcomes.push(o),
  });
});
afterEach(() => {
  lot.close();
  vi.useRealTimers();
});

const opts = (deadlineAtMs: number, alternates?: string[]) => ({ route: 'chat', deadlineAtMs, signal: new AbortController().signal, maxQueue: 100, maxWaitMs: undefined, minAttemptMs: 500, ...(alternates && { alternates }) });

describe('requests moved to carry an alternate probe', () => {
  it('do not spin the lot while the one moved waits parked for the alternate past the window', async () => {
    const results: string[] = [];
    for (const [name, d] of [['a', 20_000], ['b', 30_000]] as const) void lot.park('primary', opts(d, ['backup'])).then((r) => results.push(`${name}:${r.kind}`));
    states.set('backup', { mode: 'probing', slots: 1 });
    lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    expect(results).toEqual(['a:moved']);
    // Another instance's probe holds the permit: the moved request parks for the backup until one is free (10 s).
    void lot.park('backup', { ...opts(20_000, ['primary']), notBeforeMs: Date.now() + 10_000 }).then((r) => results.push(`a2:${r.kind}`));
    await vi.advanceTimersByTimeAsync(1_500);
    looks = 0;
    await vi.advanceTimersByTimeAsync(5_000);
    expect(results).toEqual(['a:moved']);
    // A look a second (or a few for the backup's own queue) is fine; one a millisecond is not.
    expect(looks).toBeLessThan(200);
  });

  it('looks again by itself when the alternate\'s own parked leave without carrying its probe', async () => {
    const results: string[] = [];
    // Parked for the backup itself, probing, waiting for a permit held elsewhere; its client will leave.
    states.set('backup', { mode: 'probing', slots: 1 });
    const gone = new AbortController();
    void lot.park('backup', { ...opts(30_000), signal: gone.signal, notBeforeMs: 20_000 }).then((r) => results.push(`b:${r.kind}`));
    states.set('backup', { mode: 'blocked', availableAtMs: 60_000 });
    void lot.park('primary', opts(30_000, ['backup'])).then((r) => results.push(`p:${r.kind}`));
    states.set('backup', { mode: 'probing', slots: 1 });
    lot.notify('backup');
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
    void lot.park(flex, opts(90_000)).then((r) => results.push(`f:${r.kind}`));
    void lot.park('primary', opts(30_000, ['backup'])).then((r) => results.push(`p:${r.kind}`));
    states.set('backup', { mode: 'probing', slots: 1 });
    lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    expect(results).toEqual(['p:moved']);
  });

  it('are not sent while the probe released from the alternate\'s own queue is out; once it is over, one is', async () => {
    const results: string[] = [];
    states.set('backup', { mode: 'probing', slots: 1 });
    const probe = await lot.park('backup', opts(30_000));
    expect(probe.kind).toBe('released');
    void lot.park('primary', opts(30_000, ['backup'])).then((r) => results.push(`p:${r.kind}`));
    lot.notify('backup');
    await vi.advanceTimersByTimeAsync(3_000);
    expect(results).toEqual([]);
    // The probe's answer came and the breaker still wants one (another half-open probe): the lot looks by itself.
    if (probe.kind === 'released') probe.ticket.done();
    await vi.advanceTimersByTimeAsync(1_100);
    expect(results).toEqual(['p:moved']);
  });

  it('start a new window when the alternate probes again after a failed probe within the last', async () => {
    const results: string[] = [];
    for (const [name, d] of [['a', 20_000], ['b', 30_000]] as const) void lot.park('primary', opts(d, ['backup'])).then((r) => results.push(`${name}:${r.kind}`));
    states.set('backup', { mode: 'probing', slots: 1 });
    lot.notify('backup');
    await vi.advanceTimersByTimeAsync(100);
    expect(results).toEqual(['a:moved']);
    states.set('backup', { mode: 'blocked', availableAtMs: 300 });
    lot.notify('backup');
    await vi.advanceTimersByTimeAsync(100);
    states.set('backup', { mode: 'probing', slots: 1 });
    await vi.advanceTimersByTimeAsync(150);
    expect(results).toEqual(['a:moved', 'b:moved']);
  });

  it('cost no scan of the parked per release while their own target is back and the alternate only probing', async () => {
    vi.useRealTimers();
    const N = 20_000;
    const releaseAll = async (backup: TargetState): Promise<number> => {
      lot.close();
      lot = new ParkingLot({ now: () => Date.now(), random: () => 0, stateOf: (k) => states.get(k) ?? { mode: 'available', slots: 10 } });
      states.set('primary', { mode: 'blocked', availableAtMs: Date.now() + 60_000 });
      states.set('backup', { mode: 'blocked', availableAtMs: Date.now() + 60_000 });
      let released = 0;
      for (let i = 0; i < N; i++)
        void lot.park('primary', { ...opts(Date.now() + 30_000, ['backup']), maxQueue: N }).then((r) => {
          released++;
          if (r.kind === 'released') r.ticket.done();
        });
      states.set('backup', backup);
      states.set('primary', { mode: 'available', slots: 10 });
      const t0 = process.hrtime.bigint();
      lot.notify('primary');
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
