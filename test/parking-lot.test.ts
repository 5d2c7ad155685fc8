// The parking lot: bounded, deadline-ordered, released at a slow-start pace, nothing released while blocked.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ParkingLot, type TargetState } from '../src/pipeline/parking-lot.ts';
import { flexTierKey } from '../src/state/hold-offs.ts';

let state: TargetState;
let lot: ParkingLot;
/** Where in the release window each request leaves; 0 (at once) unless a test spreads them. */
let random: () => number;
const outcomes: string[] = [];

beforeEach(() => {
  vi.useFakeTimers({ now: 0 });
  state = { mode: 'blocked', availableAtMs: 1_000 };
  outcomes.length = 0;
  random = () => 0;
  lot = new ParkingLot({ now: () => Date.now(), random: () => random(), stateOf: () => state, onOutcome: (_r, o) => outcomes.push(o) });
});
afterEach(() => {
  lot.close();
  vi.useRealTimers();
});

const opts = (deadlineAtMs: number, signal = new AbortController().signal, maxQueue = 100) => ({ route: 'chat', deadlineAtMs, signal, maxQueue, maxWaitMs: undefined, minAttemptMs: 0 });

describe('the parking lot', () => {
  it('keeps no queue for a target given back (a made-up model name the provider refused) once nothing waits on it', async () => {
    for (let i = 0; i < 50; i++) void lot.park(`p/made-up-${i}`, { ...opts(5_000), maxWaitMs: 100 });
    const waiting = lot.park('p/made-up-still-parked', opts(5_000));
    await vi.advanceTimersByTimeAsync(100);
    for (let i = 0; i < 50; i++) lot.forget(`p/made-up-${i}`);
    lot.forget('p/made-up-still-parked');
    // The one still waiting keeps its queue (and its place in it).
    expect(lot.size).toBe(1);
    expect(lot.waiting('p/made-up-still-parked')).toBe(1);
    state = { mode: 'available', slots: 1 };
    lot.notify('p/made-up-still-parked');
    expect((await waiting).kind).toBe('released');
  });

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

  it('times a request out when less than minAttemptMs would be left, instead of releasing it to a doomed attempt', async () => {
    state = { mode: 'blocked', availableAtMs: 4_500 };
    let result: string | undefined;
    void lot.park('t', { ...opts(5_000), minAttemptMs: 1_000 }).then((r) => (result = r.kind));
    await vi.advanceTimersByTimeAsync(3_999);
    expect(result).toBeUndefined();
    await vi.advanceTimersByTimeAsync(1);
    expect(result).toBe('timeout');
    state = { mode: 'available', slots: 10 };
    lot.notify('t');
    expect(outcomes).toEqual(['timeout']);
  });

  it('times a request out when the target comes back after its cut-off, though its timer has not fired yet', async () => {
    // A busy event loop: the clock moves past the cut-off (and the deadline) while no timer runs, and the target's
    // recovery (a probe's answer, handled in an I/O callback) is what the lot hears of first.
    state = { mode: 'blocked', availableAtMs: 60_000 };
    let result: string | undefined;
    void lot.park('t', { ...opts(5_000), minAttemptMs: 1_000 }).then((r) => (result = r.kind));
    vi.setSystemTime(5_200);
    state = { mode: 'probing', slots: 3 };
    lot.notify('t');
    await Promise.resolve();
    expect(result).toBe('timeout');
    expect(lot.waiting('t')).toBe(0);
  });

  it('never puts a request\'s moment in the release window past its cut-off', async () => {
    state = { mode: 'blocked', availableAtMs: 1_000 };
    random = () => 0.9;
    let result: string | undefined;
    void lot.park('t', { ...opts(2_100), minAttemptMs: 1_000 }).then((r) => (result = r.kind));
    await vi.advanceTimersByTimeAsync(999);
    state = { mode: 'available', slots: 10 };
    await vi.advanceTimersByTimeAsync(200);
    expect(result).toBe('released');
  });

  it('spreads the requests released when the target comes back over a fifth of its time away, not all at once', async () => {
    // A provider that said "come back in 1.5 s": 10 requests parked on its hold-off.
    state = { mode: 'blocked', availableAtMs: 1_500 };
    const draws = [0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9];
    random = () => draws.shift()!;
    const releasedAt: number[] = [];
    for (let i = 0; i < 10; i++) void lot.park('t', opts(60_000 + i)).then((r) => r.kind === 'released' && releasedAt.push(Date.now()));
    await vi.advanceTimersByTimeAsync(1_499);
    state = { mode: 'available', slots: 64 };
    await vi.advanceTimersByTimeAsync(1_000);
    // Window: 0.2 x 1.5 s = 300 ms after the hold-off ends, each request at its own draw.
    expect(releasedAt).toEqual([1_500, 1_530, 1_560, 1_590, 1_620, 1_650, 1_680, 1_710, 1_740, 1_770]);
  });

  it('keeps deadline order inside the release window, whatever order the random draws come in', async () => {
    state = { mode: 'blocked', availableAtMs: 1_000 };
    const draws = [0.9, 0.5, 0.1];
    random = () => draws.shift()!;
    const released: Array<[number, number]> = [];
    for (const d of [30_000, 10_000, 20_000]) void lot.park('t', opts(d)).then((r) => r.kind === 'released' && released.push([d, Date.now()]));
    await vi.advanceTimersByTimeAsync(999);
    state = { mode: 'available', slots: 64 };
    await vi.advanceTimersByTimeAsync(1_000);
    // Window: 0.2 x 1 s = 200 ms; the draws, sorted, go to the requests in deadline order.
    expect(released).toEqual([
      [10_000, 1_020],
      [20_000, 1_100],
      [30_000, 1_180],
    ]);
  });

  it('caps the release window at a second, and at half of what is left of a request\'s deadline', async () => {
    state = { mode: 'blocked', availableAtMs: 30_000 };
    random = () => 0.99;
    const releasedAt: number[] = [];
    void lot.park('t', opts(120_000)).then((r) => r.kind === 'released' && releasedAt.push(Date.now()));
    void lot.park('t', opts(30_400)).then((r) => r.kind === 'released' && releasedAt.push(Date.now()));
    await vi.advanceTimersByTimeAsync(29_999);
    state = { mode: 'available', slots: 64 };
    await vi.advanceTimersByTimeAsync(2_000);
    expect(releasedAt).toEqual([30_200, 30_990]);
  });

  it('parks a newcomer behind the requests spread over the release window', async () => {
    state = { mode: 'blocked', availableAtMs: 1_000 };
    random = () => 0.5;
    const releasedAt: Array<[string, number]> = [];
    void lot.park('t', opts(60_000)).then((r) => r.kind === 'released' && releasedAt.push(['parked', Date.now()]));
    await vi.advanceTimersByTimeAsync(1_000);
    state = { mode: 'available', slots: 64 };
    lot.notify('t');
    // Window: 0.2 x 1 s = 200 ms; the parked request leaves at +100, the newcomer (latest deadline or not) at +200.
    void lot.park('t', opts(30_000)).then((r) => r.kind === 'released' && releasedAt.push(['newcomer', Date.now()]));
    await vi.advanceTimersByTimeAsync(500);
    expect(releasedAt).toEqual([
      ['parked', 1_100],
      ['newcomer', 1_200],
    ]);
  });

  it('measures the release window from the spell the waiting requests saw, not an earlier one nobody waited out', async () => {
    state = { mode: 'blocked', availableAtMs: 60_000 };
    random = () => 0.99;
    const gone = new AbortController();
    void lot.park('t', opts(120_000, gone.signal));
    await vi.advanceTimersByTimeAsync(10_000);
    gone.abort();
    // Much later, a short hold-off of 500 ms: its window is 100 ms, not a second.
    await vi.advanceTimersByTimeAsync(20_000);
    state = { mode: 'blocked', availableAtMs: 30_500 };
    const releasedAt: number[] = [];
    void lot.park('t', opts(120_000)).then((r) => r.kind === 'released' && releasedAt.push(Date.now()));
    await vi.advanceTimersByTimeAsync(500);
    state = { mode: 'available', slots: 64 };
    await vi.advanceTimersByTimeAsync(1_000);
    // About 30_600 (the timer ticks may add a millisecond or two); from the stale spell it would be about 31_500.
    expect(releasedAt).toHaveLength(1);
    expect(releasedAt[0]).toBeGreaterThanOrEqual(30_590);
    expect(releasedAt[0]).toBeLessThan(30_650);
  });

  it('answers requests still waiting for their moment when the lot closes', async () => {
    state = { mode: 'blocked', availableAtMs: 1_000 };
    random = () => 0.5;
    const result = lot.park('t', opts(60_000));
    await vi.advanceTimersByTimeAsync(999);
    state = { mode: 'available', slots: 64 };
    await vi.advanceTimersByTimeAsync(1);
    lot.close();
    expect((await result).kind).toBe('closing');
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

describe('the parking lot with priority classes', () => {
  it('releases an online request at once though batch requests released before it still hold the limit and more batch waits', async () => {
    state = { mode: 'available', slots: 1 };
    const batch = { ...opts(60_000), cls: 1 };
    // One batch request released and still out (waiting for its class's slot in the pool), nine more parked behind it.
    const first = await lot.park('t', batch);
    expect(first.kind).toBe('released');
    for (let i = 0; i < 9; i++) void lot.park('t', batch);
    await vi.advanceTimersByTimeAsync(10);
    expect(lot.waiting('t')).toBe(9);
    // An online newcomer does not queue behind batch...
    expect(lot.waiting('t', 0)).toBe(0);
    // ...and one that parks (a hold-off just ended, say) leaves ahead of them, paced only by online requests out.
    let online: string | undefined;
    void lot.park('t', { ...opts(60_000), cls: 0 }).then((r) => (online = r.kind));
    await vi.advanceTimersByTimeAsync(10);
    expect(online).toBe('released');
    expect(lot.waiting('t')).toBe(9);
  });

  it('lets parked online requests go before parked batch ones when the target comes back, whatever their deadlines', async () => {
    const order: string[] = [];
    void lot.park('t', { ...opts(30_000), cls: 1 }).then((r) => r.kind === 'released' && order.push('batch'));
    void lot.park('t', { ...opts(60_000), cls: 0 }).then((r) => r.kind === 'released' && order.push('online'));
    state = { mode: 'available', slots: 1 };
    lot.notify('t');
    await vi.advanceTimersByTimeAsync(10);
    expect(order).toEqual(['online']);
  });
});

describe("the parking lot with a target's flex tier", () => {
  // The states by key: the target's own, and its flex tier's (which its hold-offs hold too, target-state.ts).
  const T = 'groq/llama';
  const FLEX = flexTierKey(T);
  let states: Record<string, TargetState>;
  let tiered: ParkingLot;
  beforeEach(() => {
    states = { [T]: { mode: 'blocked', availableAtMs: 1_000 }, [FLEX]: { mode: 'blocked', availableAtMs: 1_000 } };
    tiered = new ParkingLot({ now: () => Date.now(), random: () => random(), stateOf: (key) => states[key]! });
  });
  afterEach(() => tiered.close());
  const back = (slots: number) => {
    states[T] = { mode: 'available', slots };
    states[FLEX] = { mode: 'available', slots };
  };

  it('releases what both tiers parked through a target-wide hold-off under one limit, not one per tier', async () => {
    const out: Array<{ done(): void }> = [];
    let most = 0;
    const note = (r: Awaited<ReturnType<ParkingLot['park']>>) => {
      if (r.kind !== 'released') return;
      out.push(r.ticket);
      most = Math.max(most, out.length);
    };
    for (let i = 0; i < 3; i++) void tiered.park(T, opts(60_000 + i)).then(note);
    for (let i = 0; i < 3; i++) void tiered.park(FLEX, opts(60_100 + i)).then(note);
    await vi.advanceTimersByTimeAsync(999);
    back(2);
    await vi.advanceTimersByTimeAsync(1);
    expect(out).toHaveLength(2);
    // Each one done lets one more go, never more than the limit out at once.
    while (out.length > 0) {
      out.shift()!.done();
      await vi.advanceTimersByTimeAsync(0);
    }
    expect(most).toBe(2);
    expect(tiered.waiting(T) + tiered.waiting(FLEX)).toBe(0);
  });

  it('releases both tiers in one deadline order when the target comes back', async () => {
    const order: string[] = [];
    const out: Array<{ done(): void }> = [];
    const park = (key: string, deadline: number, name: string) =>
      void tiered.park(key, opts(deadline)).then((r) => r.kind === 'released' && (order.push(name), out.push(r.ticket)));
    park(T, 10_000, 'default 10 s');
    park(FLEX, 20_000, 'flex 20 s');
    park(T, 30_000, 'default 30 s');
    park(FLEX, 15_000, 'flex 15 s');
    await vi.advanceTimersByTimeAsync(999);
    back(1);
    for (let i = 0; i < 4; i++) {
      await vi.advanceTimersByTimeAsync(1);
      expect(order).toHaveLength(i + 1);
      out.shift()!.done();
    }
    expect(order).toEqual(['default 10 s', 'flex 15 s', 'flex 20 s', 'default 30 s']);
  });

  it('has a flex newcomer queue behind default-tier requests parked for its target, and a default one not behind flex ones', async () => {
    void tiered.park(T, opts(60_000));
    await vi.advanceTimersByTimeAsync(10);
    expect(tiered.waiting(FLEX, 0)).toBe(1);
    // The flex tier's own hold-off holds its requests; the target is there for the default tier.
    states[T] = { mode: 'available', slots: 4 };
    states[FLEX] = { mode: 'blocked', availableAtMs: 5_000 };
    tiered.notify(T);
    await vi.advanceTimersByTimeAsync(10);
    expect(tiered.waiting(T, 0)).toBe(0);
    void tiered.park(FLEX, opts(60_000));
    expect(tiered.waiting(T, 0)).toBe(0);
    expect(tiered.waiting(FLEX, 0)).toBe(1);
  });

  it('parks a flex newcomer behind the default-tier requests spread over the release window', async () => {
    random = () => 0.5;
    const releasedAt: Array<[string, number]> = [];
    void tiered.park(T, opts(60_000)).then((r) => r.kind === 'released' && releasedAt.push(['parked', Date.now()]));
    await vi.advanceTimersByTimeAsync(1_000);
    back(64);
    tiered.notify(T);
    // Window: 0.2 x 1 s = 200 ms; the parked request leaves at +100, the flex newcomer at +200, as a default one would.
    void tiered.park(FLEX, opts(30_000)).then((r) => r.kind === 'released' && releasedAt.push(['flex newcomer', Date.now()]));
    await vi.advanceTimersByTimeAsync(500);
    expect(releasedAt).toEqual([
      ['parked', 1_100],
      ['flex newcomer', 1_200],
    ]);
  });

  it("lets default-tier requests go past flex ones the flex tier's own hold-off holds, which wait for that one only", async () => {
    states[T] = { mode: 'available', slots: 2 };
    states[FLEX] = { mode: 'blocked', availableAtMs: 5_000 };
    const releasedAt: Array<[string, number]> = [];
    const out: Array<{ done(): void }> = [];
    // The flex request's deadline is the earliest: first in the lot's order, yet it must hold nobody back.
    void tiered.park(FLEX, opts(30_000)).then((r) => r.kind === 'released' && (releasedAt.push(['flex', Date.now()]), out.push(r.ticket)));
    for (const d of [60_000, 61_000]) void tiered.park(T, opts(d)).then((r) => r.kind === 'released' && (releasedAt.push([`default ${d / 1000} s`, Date.now()]), out.push(r.ticket)));
    await vi.advanceTimersByTimeAsync(10);
    expect(releasedAt).toEqual([
      ['default 60 s', 0],
      ['default 61 s', 0],
    ]);
    out.splice(0).forEach((t) => t.done());
    await vi.advanceTimersByTimeAsync(4_980);
    expect(releasedAt).toHaveLength(2);
    states[FLEX] = { mode: 'available', slots: 2 };
    await vi.advanceTimersByTimeAsync(1_100);
    expect(releasedAt.map(([n]) => n)).toEqual(['default 60 s', 'default 61 s', 'flex']);
    expect(releasedAt[2]![1]).toBeGreaterThanOrEqual(5_000);
  });

  it('drops the queue of a target given back, its flex tier included, once nothing waits on either', async () => {
    back(4);
    const r = await tiered.park(FLEX, opts(60_000));
    expect(r.kind).toBe('released');
    tiered.forget(T);
    expect(tiered.size).toBe(1);
    if (r.kind === 'released') r.ticket.done();
    tiered.forget(T);
    expect(tiered.size).toBe(0);
  });
});
