// Review of the parking lot's one queue per target for both service tiers (the target's key and its flex tier's):
// the wake-ups while one tier is held alone, the release windows of tiers back at once or one after the other, the
// probes shared by both tiers, and a seeded property run over random parks, state changes, answers and aborts.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ParkingLot, type TargetState, type Ticket } from '../src/pipeline/parking-lot.ts';
import { flexTierKey } from '../src/state/hold-offs.ts';

const T = 'groq/llama';
const FLEX = flexTierKey(T);

beforeEach(() => vi.useFakeTimers({ now: 0 }));
afterEach(() => vi.useRealTimers());

const opts = (deadlineAtMs: number, over: { cls?: number; minAttemptMs?: number; signal?: AbortSignal } = {}) => ({
  route: 'chat',
  deadlineAtMs,
  signal: over.signal ?? new AbortController().signal,
  maxQueue: 1_000,
  maxWaitMs: undefined,
  minAttemptMs: over.minAttemptMs ?? 0,
  ...(over.cls !== undefined && { cls: over.cls }),
});

describe("the parking lot's tiers, reviewed", () => {
  let states: Record<string, TargetState>;
  let looks: number;
  let random: () => number;
  let lot: ParkingLot;
  beforeEach(() => {
    states = { [T]: { mode: 'blocked', availableAtMs: 1_000 }, [FLEX]: { mode: 'blocked', availableAtMs: 1_000 } };
    looks = 0;
    random = () => 0;
    lot = new ParkingLot({ now: () => Date.now(), random: () => random(), stateOf: (key) => (looks++, states[key]!) });
  });
  afterEach(() => lot.close());

  it('wakes at the end of a hold-off that holds the flex tier alone, with no re-check meanwhile once nothing else waits', async () => {
    states[T] = { mode: 'available', slots: 1 };
    states[FLEX] = { mode: 'blocked', availableAtMs: 60_000 };
    let flex: string | undefined;
    void lot.park(FLEX, opts(120_000)).then((r) => (flex = r.kind));
    const parkedDefault = lot.park(T, opts(120_000));
    const d = await parkedDefault;
    expect(d.kind).toBe('released');
    looks = 0;
    // The default tier's request is out and nothing of its tier waits: the flex tier's request waits for its hold-off
    // alone, with no 250 ms re-checks for 60 s.
    await vi.advanceTimersByTimeAsync(59_000);
    expect(looks).toBe(0);
    if (d.kind === 'released') d.ticket.done();
    states[FLEX] = { mode: 'available', slots: 1 };
    await vi.advanceTimersByTimeAsync(1_000 + 1_000);
    expect(flex).toBe('released');
  });

  it('re-checks every 250 ms, no faster, while default-tier requests wait for the limit and the flex tier is held', async () => {
    states[T] = { mode: 'available', slots: 1 };
    states[FLEX] = { mode: 'blocked', availableAtMs: 60_000 };
    void lot.park(FLEX, opts(120_000));
    const first = await lot.park(T, opts(120_000));
    void lot.park(T, opts(120_000));
    expect(first.kind).toBe('released');
    looks = 0;
    await vi.advanceTimersByTimeAsync(10_000);
    // Two keys looked at per re-check, four re-checks a second.
    expect(looks).toBeLessThanOrEqual(2 * 41);
    expect(looks).toBeGreaterThan(0);
  });

  it("gives a tier that comes back after the other a window of its own, and leaves the other's moments as they were", async () => {
    // The target's hold-off ends at 1 s; the flex tier's own lasts to 2 s.
    states[FLEX] = { mode: 'blocked', availableAtMs: 2_000 };
    let draws = 0;
    random = () => (draws++, 0.5);
    const releasedAt: Array<[string, number]> = [];
    const park = (key: string, name: string, deadline: number) =>
      void lot.park(key, opts(deadline)).then((r) => r.kind === 'released' && releasedAt.push([name, Date.now()]));
    park(T, 'default', 60_000);
    park(FLEX, 'flex', 50_000);
    await vi.advanceTimersByTimeAsync(999);
    states[T] = { mode: 'available', slots: 64 };
    await vi.advanceTimersByTimeAsync(1);
    // Only the default tier's request drew its moment: 0.5 x (0.2 x 1 s).
    expect(draws).toBe(1);
    await vi.advanceTimersByTimeAsync(999);
    states[FLEX] = { mode: 'available', slots: 64 };
    await vi.advanceTimersByTimeAsync(1_000);
    expect(draws).toBe(2);
    // The flex tier was away 2 s: its window is 400 ms, its moment the middle of it.
    expect(releasedAt).toEqual([
      ['default', 1_100],
      ['flex', 2_200],
    ]);
  });

  it('lets out one probe for the target while it is probing, whichever tier the parked requests are on', async () => {
    const out: Ticket[] = [];
    const order: string[] = [];
    for (const [key, name, d] of [[FLEX, 'flex', 10_000], [T, 'default', 20_000], [FLEX, 'flex 2', 30_000]] as const) {
      void lot.park(key, opts(d)).then((r) => r.kind === 'released' && (order.push(name), out.push(r.ticket)));
    }
    await vi.advanceTimersByTimeAsync(999);
    states[T] = { mode: 'probing', slots: 1 };
    states[FLEX] = { mode: 'probing', slots: 1 };
    await vi.advanceTimersByTimeAsync(300);
    expect(order).toEqual(['flex']);
    // A stream begun is no probe any more: the next may go.
    out[0]!.streaming();
    await vi.advanceTimersByTimeAsync(0);
    expect(order).toEqual(['flex', 'default']);
  });

  it('lets a default-tier request of a lower class go past a higher-class flex request its own hold-off holds', async () => {
    states[T] = { mode: 'available', slots: 1 };
    states[FLEX] = { mode: 'blocked', availableAtMs: 30_000 };
    let batch: string | undefined;
    void lot.park(FLEX, opts(60_000, { cls: 0 }));
    void lot.park(T, opts(60_000, { cls: 2 })).then((r) => (batch = r.kind));
    await vi.advanceTimersByTimeAsync(0);
    expect(batch).toBe('released');
  });

  it('counts parked requests per route across both tiers, and answers every one on close', async () => {
    const changes: number[] = [];
    const counted = new ParkingLot({ now: () => Date.now(), random: () => 0, stateOf: (key) => states[key]!, onParkedChange: (_r, d) => changes.push(d) });
    const all = [counted.park(T, { ...opts(60_000), maxQueue: 2 }), counted.park(FLEX, { ...opts(60_000), maxQueue: 2 }), counted.park(FLEX, { ...opts(60_000), maxQueue: 2 })];
    expect((await all[2]!).kind).toBe('full');
    counted.close();
    expect((await Promise.all(all.slice(0, 2))).map((r) => r.kind)).toEqual(['closing', 'closing']);
    expect(changes.reduce((a, b) => a + b, 0)).toBe(0);
  });
});

/** A seeded generator, so a failing seed replays. */
function seeded(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s * 1_664_525 + 1_013_904_223) >>> 0;
    return s / 2 ** 32;
  };
}

describe("the parking lot's tiers under random traffic (seeded)", () => {
  // The target's state, and the flex tier's as target-state.ts derives it: held by the target's hold-off and breaker,
  // and by its own hold-off alone.
  for (let seed = 1; seed <= 150; seed++) {
    it(`never releases past the limit or while held, never strands a request, keeps its counts (seed ${seed})`, async () => {
      const r = seeded(seed);
      let mode: 'blocked' | 'probing' | 'available' = 'blocked';
      let blockedUntil = 1_000;
      let flexUntil = 0;
      let slots = 2;
      const stateOf = (key: string): TargetState => {
        const now = Date.now();
        if (mode === 'blocked' && blockedUntil > now) return { mode: 'blocked', availableAtMs: blockedUntil };
        if (key === FLEX && flexUntil > now) return { mode: 'blocked', availableAtMs: flexUntil };
        return mode === 'probing' ? { mode: 'probing', slots: 1 } : { mode: 'available', slots };
      };
      let looks = 0;
      let parked = 0;
      const lot = new ParkingLot({ now: () => Date.now(), random: r, stateOf: (k) => (looks++, stateOf(k)), onParkedChange: (_r, d) => (parked += d) });
      const out: Array<{ cls: number; ticket: Ticket; streaming: boolean }> = [];
      const pending = new Set<number>();
      const errors: string[] = [];
      let id = 0;
      const park = (key: string) => {
        const n = id++;
        const cls = r() < 0.3 ? 1 : 0;
        const ac = new AbortController();
        pending.add(n);
        void lot.park(key, { ...opts(Date.now() + 2_000 + Math.floor(r() * 20_000), { cls, minAttemptMs: 100, signal: ac.signal }) }).then((res) => {
          pending.delete(n);
          if (res.kind !== 'released') return;
          const st = stateOf(key);
          if (st.mode === 'blocked') errors.push(`${key} released while held, at ${Date.now()}`);
          else {
            const before = out.filter((o) => o.cls <= cls && !(st.mode === 'probing' && o.streaming)).length;
            if (before >= st.slots) errors.push(`${key} released with ${before} out of ${st.slots} (${st.mode}), at ${Date.now()}`);
          }
          out.push({ cls, ticket: res.ticket, streaming: false });
        });
        if (r() < 0.05) setTimeout(() => ac.abort(), Math.floor(r() * 3_000));
      };
      for (let step = 0; step < 60; step++) {
        const x = r();
        if (x < 0.35) park(r() < 0.5 ? T : FLEX);
        else if (x < 0.5 && out.length > 0) out.splice(Math.floor(r() * out.length), 1)[0]!.ticket.done();
        else if (x < 0.55 && out.length > 0) {
          const o = out[Math.floor(r() * out.length)]!;
          o.streaming = true;
          o.ticket.streaming();
        } else if (x < 0.65) {
          const y = r();
          if (y < 0.3) [mode, blockedUntil] = ['blocked', Date.now() + Math.floor(r() * 3_000)];
          else if (y < 0.5) mode = 'probing';
          else if (y < 0.7) [mode, slots] = ['available', 1 + Math.floor(r() * 4)];
          else flexUntil = Date.now() + Math.floor(r() * 3_000);
          // The store tells the lot of most changes; the others it sees at its next wake-up.
          if (r() < 0.7) lot.notify(r() < 0.5 ? T : FLEX);
        }
        const before = looks;
        const ms = Math.floor(r() * 600);
        await vi.advanceTimersByTimeAsync(ms);
        // Two keys, a re-check every 250 ms, and the moments of a release window: never a loop.
        if (ms >= 200 && (looks - before) / ms > 0.2) errors.push(`${looks - before} looks in ${ms} ms, at ${Date.now()}`);
        if (parked !== pending.size) errors.push(`parked gauge ${parked}, parked ${pending.size}`);
      }
      // Everything back and nothing out: within the longest release window (1 s) and a re-check, nobody is left.
      [mode, slots, flexUntil] = ['available', 1_000, 0];
      lot.notify(T);
      for (const o of out.splice(0)) o.ticket.done();
      await vi.advanceTimersByTimeAsync(1_300);
      if (pending.size > 0) errors.push(`${pending.size} stranded`);
      lot.close();
      expect(errors.slice(0, 3)).toEqual([]);
    });
  }
});
