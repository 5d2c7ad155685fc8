// Review and hand mutation of parking's alternates (a request parked for the target expected back first watches its
// other targets, and leaves the lot, `moved`, once one of them is back while its own is still away).
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ParkingLot, type TargetState } from '../src/pipeline/parking-lot.ts';

const farAway = { mode: 'blocked', availableAtMs: Number.MAX_SAFE_INTEGER } as const;

const states = new Map<string, TargetState>();
/** Each key the lot asked stateOf about, in order. */
const asked: string[] = [];
let lot: ParkingLot;
const outcomes: string[] = [];

const opts = (deadlineAtMs: number, more: { alternates?: string[]; signal?: AbortSignal; client?: string; maxQueue?: number; maxWaitMs?: number; notBeforeMs?: number } = {}) => ({
  route: 'chat',
  deadlineAtMs,
  signal: more.signal ?? new AbortController().signal,
  maxQueue: more.maxQueue ?? 100,
  maxWaitMs: more.maxWaitMs,
  minAttemptMs: 500,
  ...(more.alternates && { alternates: more.alternates }),
  ...(more.client !== undefined && { client: more.client }),
  ...(more.notBeforeMs !== undefined && { notBeforeMs: more.notBeforeMs }),
});

describe('a parked request watching alternates', () => {
  beforeEach(() => {
    vi.useFakeTimers({ now: 0 });
    states.clear();
    states.set('primary', { mode: 'blocked', availableAtMs: 60_000 });
    states.set('backup', { mode: 'blocked', availableAtMs: 60_000 });
    asked.length = 0;
    outcomes.length = 0;
    lot = new ParkingLot({
      now: () => Date.now(),
      random: () => 0,
      stateOf: (k) => (asked.push(k), states.get(k) ?? { mode: 'available', slots: 10 }),
      onOutcome: (_r, o) => outcomes.push(o),
    });
  });
  afterEach(() => {
    lot.close();
    vi.useRealTimers();
  });

  it('goes to its own target when that and an alternate come back at once: released, not moved', async () => {
    let result: string | undefined;
    void lot.park('primary', opts(30_000, { alternates: ['backup'] })).then((r) => (result = r.kind));
    await vi.advanceTimersByTimeAsync(1_000);
    states.set('backup', { mode: 'available', slots: 4 });
    states.set('primary', { mode: 'available', slots: 4 });
    lot.notify('primary');
    await vi.advanceTimersByTimeAsync(0);
    expect(result).toBe('released');
  });

  it("hears its alternate's flex tier come back when the target's breaker closes (runtime notifies the target's key)", async () => {
    states.set('backup#flex', { mode: 'blocked', availableAtMs: 60_000 });
    let result: string | undefined;
    void lot.park('primary', opts(30_000, { alternates: ['backup#flex'] })).then((r) => (result = r.kind));
    await vi.advanceTimersByTimeAsync(1_000);
    states.set('backup#flex', { mode: 'available', slots: 4 });
    lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    expect(result).toBe('moved');
  });

  it("leaves at the end of an alternate's hold-off while its own target probes without a permit for it (no 250 ms re-check late)", async () => {
    states.set('primary', { mode: 'probing', slots: 1 });
    states.set('backup', { mode: 'blocked', availableAtMs: 3_100 });
    let at: number | undefined;
    void lot.park('primary', opts(30_000, { alternates: ['backup'], notBeforeMs: 10_000 })).then((r) => r.kind === 'moved' && (at = Date.now()));
    await vi.advanceTimersByTimeAsync(3_099);
    states.set('backup', { mode: 'available', slots: 4 });
    await vi.advanceTimersByTimeAsync(1);
    expect(at).toBe(3_100);
  });

  it('drops the moment it was given to leave when the alternate went away again before it, and gets a new one when it is back', async () => {
    const at: number[] = [];
    const draws = [0.5, 0.9, 0.3, 0.6];
    lot = new ParkingLot({ now: () => Date.now(), random: () => draws.shift() ?? 0, stateOf: (k) => states.get(k) ?? { mode: 'available', slots: 10 } });
    for (let i = 0; i < 2; i++) void lot.park('primary', opts(30_000, { alternates: ['backup'] })).then((r) => r.kind === 'moved' && at.push(Date.now()));
    await vi.advanceTimersByTimeAsync(1_000);
    states.set('backup', { mode: 'available', slots: 4 });
    lot.notify('backup');
    await vi.advanceTimersByTimeAsync(200);
    // Its breaker open again (a failed request), its probe 60 s away: leaving at 1.5 and 1.9 s, they found every
    // target away and parked again (test/parking-lot-edges.test.ts).
    states.set('backup', { mode: 'blocked', availableAtMs: 60_000 });
    lot.notify('backup');
    await vi.advanceTimersByTimeAsync(1_000);
    expect(at).toEqual([]);
    // Back again at 2.2 s: new moments (the ones kept from 1.5 and 1.9 s would send both at once).
    states.set('backup', { mode: 'available', slots: 4 });
    lot.notify('backup');
    await vi.advanceTimersByTimeAsync(1_000);
    expect(at).toEqual([2_500, 2_800]);
  });

  it('stops watching once each watcher has left, however it left (moved, released, timeout, aborted, displaced)', async () => {
    const gone: string[] = [];
    const park = (o: Parameters<typeof opts>[1], deadlineAtMs = 30_000) => void lot.park('primary', opts(deadlineAtMs, { maxQueue: 3, ...o })).then((r) => gone.push(r.kind));
    const aborter = new AbortController();
    park({ alternates: ['backup'], client: 'x', signal: aborter.signal });
    park({ alternates: ['backup'], client: 'x', maxWaitMs: 2_000 });
    park({ alternates: ['backup'], client: 'x' });
    // Full: a newcomer of another client takes the newest place of the fullest client (displaced: full).
    park({ client: 'y' });
    await vi.advanceTimersByTimeAsync(0);
    expect(gone).toEqual(['full']);
    aborter.abort();
    await vi.advanceTimersByTimeAsync(2_500);
    expect(gone).toEqual(['full', 'aborted', 'timeout']);
    // Moved, and released: a watcher each.
    park({ alternates: ['backup'], client: 'z' });
    states.set('backup', { mode: 'available', slots: 4 });
    lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    states.set('backup', { mode: 'blocked', availableAtMs: 60_000 });
    park({ alternates: ['backup'], client: 'z' }, 20_000);
    // Released to its own target, first in deadline order (one slot): the primary is away again before y's turn.
    states.set('primary', { mode: 'available', slots: 1 });
    lot.notify('primary');
    await vi.advanceTimersByTimeAsync(0);
    states.set('primary', { mode: 'blocked', availableAtMs: 60_000 });
    expect(gone.slice(0, 4)).toEqual(['full', 'aborted', 'timeout', 'moved']);
    expect(gone.filter((g) => g === 'released')).toHaveLength(1);
    expect(lot.waiting('primary')).toBe(1);
    // One request still parked, watching nothing: the backup's changes are none of its queue's business.
    asked.length = 0;
    states.set('backup', { mode: 'available', slots: 4 });
    lot.notify('backup');
    expect(asked).toEqual([]);
  });
});

describe('the cost of watching alternates with thousands parked', () => {
  // Every parked request of a primary-and-backup route with both down watches the backup. Each pump scanned the whole
  // queue for alternates that were back, so parking n requests cost n²: 20,000 parked took 7 s of event loop, not 1 s;
  // and each notify of any target (a hold-off extended by each 429 of a storm elsewhere) scanned every watched entry.
  const fill = (n: number, alternates: string[] | undefined) => {
    const states = new Map<string, TargetState>([['p/a', farAway], ['p/b', farAway]]);
    const lot = new ParkingLot({ now: Date.now, random: Math.random, stateOf: (k) => states.get(k) ?? { mode: 'available', slots: 10 } });
    const signal = new AbortController().signal;
    const started = performance.now();
    for (let i = 0; i < n; i++) void lot.park('p/a', { route: 'r', deadlineAtMs: Date.now() + 600_000, signal, maxQueue: 1e9, maxWaitMs: undefined, minAttemptMs: 500, ...(alternates && { alternates }) });
    return { lot, tookMs: performance.now() - started };
  };

  it('parks requests with alternates about as fast as those without', { timeout: 60_000 }, () => {
    const plain = fill(20_000, undefined);
    plain.lot.close();
    const watching = fill(20_000, ['p/b']);
    watching.lot.close();
    expect(watching.tookMs).toBeLessThan(2 * plain.tookMs + 1_000);
  });

  it('does not scan the parked for a notify of a target none of them watches', { timeout: 60_000 }, () => {
    const { lot } = fill(20_000, ['p/b']);
    const started = performance.now();
    for (let i = 0; i < 2_000; i++) lot.notify('p/c');
    const tookMs = performance.now() - started;
    lot.close();
    expect(tookMs).toBeLessThan(500);
  });
});
