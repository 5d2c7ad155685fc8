// The floor hold (src/pools/floor-hold.ts): an instance the fleet's exchange left no slot of its own still has the
// pool's floor of one, but that slot is beyond what the provider takes while another instance's batch holds all of it.
// A newcomer above the lowest class waits for the fleet to make room (its demand exchanged at once, then a settle for
// the others to shrink at their next exchange), at most FLOOR_HOLD_MAX_MS, and only once per "only the floor" exchange,
// so an instance cut off from Redis falls back to the floor slot as before. Fake clock throughout.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { FLOOR_HOLD_MAX_MS, FLOOR_SETTLE_MS, FloorHold, onlyTheFloor, sharedSlots } from '../src/pools/floor-hold.ts';
import type { Acquired, ProviderPool, SlotRequest } from '../src/pools/provider-pool.ts';
import { fleetPool, slotRequest, track } from './helpers/floor-pool.ts';
import { shareFleetCapacity } from '../src/pools/fleet-share.ts';
import type { Pools } from '../src/pools/pools.ts';
import type { StateStore } from '../src/state/store.ts';

beforeEach(() => vi.useFakeTimers({ now: 0 }));
afterEach(() => vi.useRealTimers());

describe('onlyTheFloor', () => {
  it("is true when the share rounds to no slot and the others' demand covers the capacity", () => {
    expect(onlyTheFloor(6, 0, 46)).toBe(true);
    expect(onlyTheFloor(6, 0.05, 6)).toBe(true);
  });

  it('is false when the others leave room, or the share is a slot of its own', () => {
    expect(onlyTheFloor(6, 0, 5)).toBe(false);
    expect(onlyTheFloor(6, 0.2, 46)).toBe(false);
    expect(sharedSlots(6, 0.2)).toBe(1);
  });
});

describe('FloorHold', () => {
  const clock = () => Date.now();

  it('holds nobody until an exchange says only the floor is left', () => {
    const h = new FloorHold(clock);
    expect(h.arrive()).toBe(false);
    h.exchanged(false, 3);
    expect(h.arrive()).toBe(false);
    expect(h.holds()).toBe(false);
  });

  it('holds the first newcomer after such an exchange up to the cap, and one hold per exchange', () => {
    const h = new FloorHold(clock);
    h.exchanged(true, 0);
    expect(h.arrive()).toBe(true);
    expect(h.untilMs).toBe(FLOOR_HOLD_MAX_MS);
    expect(h.arrive()).toBe(false);
    // No exchange answers (Redis away): the hold ends at its cap, and no newcomer starts another.
    vi.setSystemTime(FLOOR_HOLD_MAX_MS);
    expect(h.holds()).toBe(false);
    expect(h.arrive()).toBe(false);
  });

  it('ends a settle after the last exchange that gave more slots, never after the cap', () => {
    const h = new FloorHold(clock);
    h.exchanged(true, 0);
    h.arrive();
    vi.setSystemTime(50);
    h.exchanged(false, 3);
    expect(h.untilMs).toBe(50 + FLOOR_SETTLE_MS);
    vi.setSystemTime(200);
    h.exchanged(false, 3);
    expect(h.untilMs).toBe(50 + FLOOR_SETTLE_MS);
    vi.setSystemTime(400);
    h.exchanged(false, 5);
    expect(h.untilMs).toBe(FLOOR_HOLD_MAX_MS);
    // An exchange that still gives only the floor neither ends nor re-arms a hold in force.
    h.exchanged(true, 0);
    expect(h.untilMs).toBe(FLOOR_HOLD_MAX_MS);
    expect(h.arrive()).toBe(false);
  });

  it('is armed again by the next "only the floor" exchange once the hold is over', () => {
    const h = new FloorHold(clock);
    h.exchanged(true, 0);
    h.arrive();
    vi.setSystemTime(FLOOR_HOLD_MAX_MS + 1);
    h.exchanged(true, 0);
    expect(h.arrive()).toBe(true);
  });
});

describe('a pool in a fleet that left it only the floor slot', () => {
  const pool = () => fleetPool();
  const req = slotRequest;

  it('holds an online newcomer, asks the fleet at once with its demand counted, and lets it go a settle after a backing exchange', async () => {
    const p = pool();
    const asked: number[][] = [];
    p.shareOnDemand(() => asked.push(p.demandByClass()));
    p.setShare(0, 46);
    const online = track(p.acquire(req(0)));
    await vi.advanceTimersByTimeAsync(1);
    expect(online.answer).toBeUndefined();
    expect(asked).toEqual([[1, 0]]);
    vi.setSystemTime(100);
    p.setShare(0.5, 46);
    await vi.advanceTimersByTimeAsync(FLOOR_SETTLE_MS - 10);
    expect(online.answer).toBeUndefined();
    await vi.advanceTimersByTimeAsync(20);
    expect(online.answer).toMatchObject({ ok: true, queued: true });
    p.close();
  });

  it('does not hold the lowest class: the floor slot is there for it', async () => {
    const p = pool();
    p.shareOnDemand(() => {});
    p.setShare(0, 46);
    expect(await p.acquire(req(1))).toMatchObject({ ok: true, queued: false });
    p.close();
  });

  it('holds a batch newcomer too while a hold is in force: it must not take the floor slot the held online request waits for', async () => {
    const p = pool();
    p.shareOnDemand(() => {});
    p.setShare(0, 46);
    const online = track(p.acquire(req(0)));
    await vi.advanceTimersByTimeAsync(1);
    // Let in, the batch call would be the request beyond the provider's capacity the hold is there to keep back, and
    // the online one would wait behind it.
    const batch = track(p.acquire(req(1)));
    await vi.advanceTimersByTimeAsync(1);
    expect(batch.answer).toBeUndefined();
    await vi.advanceTimersByTimeAsync(FLOOR_HOLD_MAX_MS);
    // Served by class when the hold ends: online takes the floor slot, batch waits for it.
    expect(online.answer).toMatchObject({ ok: true });
    expect(batch.answer).toBeUndefined();
    (online.answer as { slot: { release(): void } }).slot.release();
    await vi.advanceTimersByTimeAsync(1);
    expect(batch.answer).toMatchObject({ ok: true });
    p.close();
  });

  it('lets the held requests go at once when an exchange says the fleet would no longer give them a slot of their own', async () => {
    const p = pool();
    p.shareOnDemand(() => {});
    p.setShare(0, 46, 1);
    const online = track(p.acquire(req(0)));
    const batch = track(p.acquire(req(1)));
    await vi.advanceTimersByTimeAsync(100);
    expect(online.answer).toBeUndefined();
    // The others' demand turned online (or outnumbers the slots): no exchange will make room, so waiting is only delay.
    p.setShare(0, 46, 0);
    await vi.advanceTimersByTimeAsync(1);
    expect(online.answer).toMatchObject({ ok: true, queued: true });
    expect(batch.answer).toBeUndefined();
    p.close();
  });

  it('takes the floor slot at its cap when no exchange answers (Redis away), and then holds no one', async () => {
    const p = pool();
    p.shareOnDemand(() => {});
    p.setShare(0, 46);
    const first = track(p.acquire(req(0)));
    await vi.advanceTimersByTimeAsync(FLOOR_HOLD_MAX_MS - 10);
    expect(first.answer).toBeUndefined();
    await vi.advanceTimersByTimeAsync(20);
    expect(first.answer).toMatchObject({ ok: true });
    (first.answer as { slot: { release(): void } }).slot.release();
    expect(await p.acquire(req(0))).toMatchObject({ ok: true, queued: false });
    p.close();
  });

  it('lets a request whose deadline cannot wait the hold out take the floor slot at once, rather than shed it', async () => {
    const p = pool();
    p.shareOnDemand(() => {});
    p.setShare(0, 46);
    expect(await p.acquire(req(0, 1_500))).toMatchObject({ ok: true, queued: false });
    p.close();
  });

  it('holds no one outside a fleet (no exchange to ask for): a share of none is the floor slot as before', async () => {
    const p = pool();
    p.setShare(0, 46);
    expect(await p.acquire(req(0))).toMatchObject({ ok: true, queued: false });
    p.close();
  });
});

describe("the fleet's exchange decides whether a hold can win a slot", () => {
  // The real exchange (fleet-share.ts) over a store whose other instances' demand per class is fixed.
  const fleetOf = (others: number[], instances: number) =>
    ({
      exchangeDemand: async (_pool: string, demand: readonly number[]) => ({ totals: demand.map((d, k) => d + (others[k] ?? 0)), instances }),
    }) as unknown as StateStore;
  const poolOf = (capacity: number) => fleetPool(capacity);
  const online = (): SlotRequest => slotRequest(0, 60_000);
  /** The answer an online newcomer has within `ms`, or undefined while it is still held. */
  const goesWithin = async (p: ProviderPool, ms: number) => {
    let answer: Acquired | undefined;
    void p.acquire(online()).then((a) => (answer = a));
    await vi.advanceTimersByTimeAsync(ms);
    return answer;
  };
  const share = (p: ProviderPool, store: StateStore) => shareFleetCapacity({ all: () => [p].values() } as unknown as Pools, store, () => Date.now());

  it("holds an online newcomer while another instance's batch fills the provider: the fleet gives it slots", async () => {
    const p = poolOf(6);
    const stop = share(p, fleetOf([0, 40], 2));
    await vi.advanceTimersByTimeAsync(1);
    let answer: Acquired | undefined;
    void p.acquire(online()).then((a) => (answer = a));
    await vi.advanceTimersByTimeAsync(100);
    expect(answer).toBeUndefined();
    await vi.advanceTimersByTimeAsync(FLOOR_HOLD_MAX_MS);
    expect(answer).toMatchObject({ ok: true, queued: true });
    stop();
    p.close();
  });

  it("does not hold an online newcomer when the others' demand is online too: the fleet would never make room", async () => {
    // 40 online calls on another instance: a newcomer here is 1 of 41 online, whose share of 6 slots rounds to none
    // however long it waits. Held, it took the floor slot a second later all the same.
    const p = poolOf(6);
    const stop = share(p, fleetOf([40, 0], 2));
    await vi.advanceTimersByTimeAsync(1);
    expect(await goesWithin(p, 100)).toMatchObject({ ok: true, queued: false });
    stop();
    p.close();
  });

  it('holds only the classes the fleet would make room for: critical above online elsewhere, not online beside it', async () => {
    const p = fleetPool(6, [{ name: 'critical', minShare: 0, maxQueue: 100 }, { name: 'online', minShare: 0.4, maxQueue: 100 }, { name: 'batch', minShare: 0.1, maxQueue: 100 }]);
    const stop = share(p, fleetOf([0, 40, 0], 2));
    await vi.advanceTimersByTimeAsync(1);
    const sameClass = { ...online(), cls: 1 };
    let onlineAnswer: Acquired | undefined;
    void p.acquire(sameClass).then((a) => (onlineAnswer = a));
    let criticalAnswer: Acquired | undefined;
    void p.acquire({ ...online(), cls: 0 }).then((a) => (criticalAnswer = a));
    await vi.advanceTimersByTimeAsync(100);
    expect(onlineAnswer).toMatchObject({ ok: true, queued: false });
    // Critical waits for the room the fleet gives it (3 slots from the exchange its arrival asked for), then goes.
    expect(criticalAnswer).toBeUndefined();
    await vi.advanceTimersByTimeAsync(FLOOR_HOLD_MAX_MS);
    expect(criticalAnswer).toMatchObject({ ok: true, queued: true });
    stop();
    p.close();
  });

  it('does not hold an online newcomer when there are more busy instances than slots', async () => {
    // maxConcurrent 2 over 5 instances, each with an online call: every share rounds to none, at every exchange.
    const p = poolOf(2);
    const stop = share(p, fleetOf([4, 0], 5));
    await vi.advanceTimersByTimeAsync(1);
    expect(await goesWithin(p, 100)).toMatchObject({ ok: true, queued: false });
    stop();
    p.close();
  });
});
