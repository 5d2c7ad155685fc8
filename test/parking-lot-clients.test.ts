// The parking lot's turns between clients (auth.keys), on a fake clock: within a class, a parked request of the client
// with the fewest released still out goes first (then the one served longest ago), then deadline order; classes and
// the slots still come first; requests of no client keep the deadline order.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ParkingLot, type Ticket, type TargetState } from '../src/pipeline/parking-lot.ts';
import { WaitingBodies } from '../src/pools/waiting-bodies.ts';

let state: TargetState;
let lot: ParkingLot;

beforeEach(() => {
  vi.useFakeTimers({ now: 0 });
  state = { mode: 'blocked', availableAtMs: 1_000 };
  lot = new ParkingLot({ now: () => Date.now(), random: () => 0, stateOf: () => state });
});
afterEach(() => {
  lot.close();
  vi.useRealTimers();
});

const opts = (client: string | undefined, deadlineAtMs: number, cls = 0) => ({ route: 'chat', deadlineAtMs, signal: new AbortController().signal, maxQueue: 1_000, maxWaitMs: undefined, minAttemptMs: 0, cls, client });

/** Parks `label`ed requests; records the order of release and keeps the tickets, in `out`, to end them one by one. */
function park(order: string[], out: Ticket[], label: string, client: string | undefined, deadlineAtMs: number, cls = 0): void {
  void lot.park('t', opts(client, deadlineAtMs, cls)).then((r) => {
    if (r.kind !== 'released') return;
    order.push(label);
    out.push(r.ticket);
  });
}

async function endOne(out: Ticket[]): Promise<void> {
  out.shift()!.done();
  await vi.advanceTimersByTimeAsync(0);
}

describe('the parking lot, between clients', () => {
  it("releases a quiet client's request beside a flood parked before it, not after all of it", async () => {
    const order: string[] = [];
    const out: Ticket[] = [];
    for (let i = 0; i < 6; i++) park(order, out, `flood${i}`, 'flood', 10_000 + i);
    park(order, out, 'quiet0', 'quiet', 20_000);
    park(order, out, 'quiet1', 'quiet', 20_001);
    state = { mode: 'available', slots: 2 };
    await vi.advanceTimersByTimeAsync(1_000);
    // Two slots: the earliest deadline first, then the client with none out.
    expect(order).toEqual(['flood0', 'quiet0']);
    await endOne(out); // flood0's: flood 0 out, quiet 1
    expect(order.at(-1)).toBe('flood1');
    await endOne(out); // quiet0's: quiet 0 out, flood 1
    expect(order.at(-1)).toBe('quiet1');
    for (let i = 0; i < 5; i++) await endOne(out);
    expect(order).toEqual(['flood0', 'quiet0', 'flood1', 'quiet1', 'flood2', 'flood3', 'flood4', 'flood5']);
  });

  it('takes turns between clients with as many out, longest served ago first', async () => {
    const order: string[] = [];
    const out: Ticket[] = [];
    for (let i = 0; i < 3; i++) park(order, out, `a${i}`, 'a', 10_000 + i);
    for (let i = 0; i < 3; i++) park(order, out, `b${i}`, 'b', 20_000 + i);
    state = { mode: 'available', slots: 1 };
    await vi.advanceTimersByTimeAsync(1_000);
    for (let i = 0; i < 5; i++) await endOne(out);
    expect(order).toEqual(['a0', 'b0', 'a1', 'b1', 'a2', 'b2']);
  });

  it('goes by released requests out before turns: a client with two out waits for one with one, though served earlier', async () => {
    const order: string[] = [];
    const out: Ticket[] = [];
    state = { mode: 'available', slots: 3 };
    park(order, out, 'b0', 'b', 10_000);
    park(order, out, 'b1', 'b', 10_001);
    park(order, out, 'a0', 'a', 10_002);
    await vi.advanceTimersByTimeAsync(0);
    park(order, out, 'b2', 'b', 11_000);
    park(order, out, 'a1', 'a', 12_000);
    await vi.advanceTimersByTimeAsync(0);
    expect(order).toEqual(['b0', 'b1', 'a0']);
    // a0 ends: a has none out, b two. a's turn, though b was served longer ago and b2's deadline is earlier.
    out.splice(2, 1)[0]!.done();
    await vi.advanceTimersByTimeAsync(0);
    expect(order.at(-1)).toBe('a1');
  });

  it('does not let clients that come one request at a time starve one with a queue', async () => {
    const order: string[] = [];
    const out: Ticket[] = [];
    state = { mode: 'available', slots: 1 };
    for (let i = 0; i < 4; i++) park(order, out, `q${i}`, 'queue', 10_000 + i);
    await vi.advanceTimersByTimeAsync(0);
    // Agents of their own keys, each parking one request while the slot is out, each forgotten once answered.
    for (let n = 1; n <= 3; n++) {
      park(order, out, `x${n}`, `agent${n}`, 5_000 + n);
      await endOne(out);
    }
    await endOne(out);
    await endOne(out);
    // The queue's turns alternate with the newcomers'. Counted as never served, each newcomer went before the queue
    // every time (q0, x1, x2, x3, q1: with agents enough, q1 never).
    expect(order).toEqual(['q0', 'x1', 'q1', 'x2', 'x3', 'q2']);
  });

  it('keeps the deadline order for requests of no client', async () => {
    const order: string[] = [];
    const out: Ticket[] = [];
    for (const d of [5_000, 3_000, 4_000, 6_000]) park(order, out, `d${d}`, undefined, d);
    state = { mode: 'available', slots: 1 };
    await vi.advanceTimersByTimeAsync(1_000);
    for (let i = 0; i < 3; i++) await endOne(out);
    expect(order).toEqual(['d3000', 'd4000', 'd5000', 'd6000']);
  });

  it('lets a higher class go first, whatever the clients hold', async () => {
    const order: string[] = [];
    const out: Ticket[] = [];
    park(order, out, 'batch-quiet', 'quiet', 5_000, 1);
    park(order, out, 'online-flood0', 'flood', 9_000, 0);
    park(order, out, 'online-flood1', 'flood', 9_001, 0);
    state = { mode: 'available', slots: 1 };
    await vi.advanceTimersByTimeAsync(1_000);
    for (let i = 0; i < 2; i++) await endOne(out);
    expect(order).toEqual(['online-flood0', 'online-flood1', 'batch-quiet']);
  });

  it("counts a client's released requests out in the class it takes turns in, not its requests of another class", async () => {
    const order: string[] = [];
    const out: Ticket[] = [];
    state = { mode: 'available', slots: 3 };
    // a's two batch requests and b's online one go at once: a holds two of batch's, b one of online's.
    park(order, out, 'a-batch0', 'a', 5_000, 1);
    park(order, out, 'a-batch1', 'a', 5_001, 1);
    park(order, out, 'b-online0', 'b', 5_002, 0);
    await vi.advanceTimersByTimeAsync(0);
    expect(order).toEqual(['a-batch0', 'a-batch1', 'b-online0']);
    state = { mode: 'blocked', availableAtMs: 1_000 };
    lot.notify('t');
    park(order, out, 'a-online', 'a', 10_000, 0);
    park(order, out, 'b-online1', 'b', 10_001, 0);
    // Online has one slot left (its own class's one out of two); batch's out do not count against online's.
    state = { mode: 'available', slots: 2 };
    await vi.advanceTimersByTimeAsync(1_000);
    // In online, a holds none and b one: a's turn (as in the pools, whose fair share is per class).
    expect(order.slice(3)).toEqual(['a-online']);
  });

  it("gives a quiet client's request one of the release window's first moments, not the last behind a flood's", async () => {
    // Plenty of slots: the window is what paces the release after the outage, and its moments go out in turns too.
    const draws = [0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9];
    const spreading = new ParkingLot({ now: () => Date.now(), random: () => draws.shift()!, stateOf: () => state });
    const order: string[] = [];
    state = { mode: 'blocked', availableAtMs: 5_000 };
    for (let i = 0; i < 9; i++) void spreading.park('t', opts('flood', 60_000 + i)).then((r) => r.kind === 'released' && order.push(`flood${i}`));
    void spreading.park('t', opts('quiet', 70_000)).then((r) => r.kind === 'released' && order.push('quiet'));
    await vi.advanceTimersByTimeAsync(4_999);
    state = { mode: 'available', slots: 64 };
    await vi.advanceTimersByTimeAsync(2_000);
    spreading.close();
    // Window: 0.2 x 5 s = 1 s. The quiet request parked after the flood's 9 goes with the flood's first, not at 0.9 s.
    expect(order.slice(0, 2)).toEqual(['flood0', 'quiet']);
    expect(order).toHaveLength(10);
  });

  it('passes over a client whose request may not go yet (the probe permits out until later), for one that may', async () => {
    const order: string[] = [];
    const out: Ticket[] = [];
    state = { mode: 'available', slots: 1 };
    park(order, out, 'flood0', 'flood', 10_000);
    park(order, out, 'flood1', 'flood', 10_001);
    // Not released before 3 s, its turn or not (SlotRequest's notBeforeMs: the probe permits are out until then).
    void lot.park('t', { ...opts('quiet', 20_000), notBeforeMs: 3_000 }).then((r) => {
      if (r.kind === 'released') (order.push('quiet-later'), out.push(r.ticket));
    });
    await vi.advanceTimersByTimeAsync(0);
    expect(order).toEqual(['flood0']);
    await endOne(out);
    expect(order).toEqual(['flood0', 'flood1']);
    await vi.advanceTimersByTimeAsync(3_000);
    await endOne(out);
    expect(order).toEqual(['flood0', 'flood1', 'quiet-later']);
  });

  it('forgets a client once nothing of it is parked or out, and counts one that comes back afresh', async () => {
    const order: string[] = [];
    const out: Ticket[] = [];
    park(order, out, 'gone0', 'gone', 5_000);
    state = { mode: 'available', slots: 1 };
    await vi.advanceTimersByTimeAsync(1_000);
    await endOne(out);
    // 'gone' holds nothing now: parked again, it and another client take turns from even.
    state = { mode: 'blocked', availableAtMs: 2_000 };
    lot.notify('t');
    park(order, out, 'other0', 'other', 6_000);
    park(order, out, 'gone1', 'gone', 5_500);
    park(order, out, 'other1', 'other', 8_000);
    state = { mode: 'available', slots: 1 };
    await vi.advanceTimersByTimeAsync(1_000);
    for (let i = 0; i < 2; i++) await endOne(out);
    // Neither has been served since: the earliest deadline goes first (remembered, gone's release at 1 s would have put
    // other first).
    expect(order).toEqual(['gone0', 'gone1', 'other0', 'other1']);
  });
});

describe("a full route's parking queue, between clients", () => {
  const parkAs = (client: string, maxQueue: number, extra: { bodyBytes?: number } = {}) => lot.park('t', { ...opts(client, 60_000), maxQueue, ...extra });

  it("gives the newest place of the client with the most parked to a newcomer of another client", async () => {
    const flood = [0, 1, 2, 3].map(() => parkAs('flood', 4));
    const quiet = parkAs('quiet', 4);
    // flood's newest is answered as a newcomer to a full queue would have been (503 park_queue_full upstream of here).
    expect(await flood[3]).toEqual({ kind: 'full' });
    expect(lot.waiting('t')).toBe(4);
    // flood's own newcomer finds no one to displace: 3 of flood against 1 of quiet is one too few.
    expect(await parkAs('flood', 4)).toEqual({ kind: 'full' });
    state = { mode: 'available', slots: 10 };
    await vi.advanceTimersByTimeAsync(1_000);
    expect((await quiet).kind).toBe('released');
    for (const p of flood.slice(0, 3)) expect((await p).kind).toBe('released');
  });

  it('turns the newcomer away when no client has two more parked than its own', async () => {
    const parked = [parkAs('a', 2), parkAs('b', 2)];
    expect(await parkAs('c', 2)).toEqual({ kind: 'full' });
    expect(await parkAs('a', 2)).toEqual({ kind: 'full' });
    state = { mode: 'available', slots: 10 };
    await vi.advanceTimersByTimeAsync(1_000);
    for (const p of parked) expect((await p).kind).toBe('released');
  });

  it('displaces no one for a newcomer whose body does not fit, even in the place of the one it would displace', async () => {
    const bodies = new WaitingBodies(1_000);
    lot = new ParkingLot({ now: () => Date.now(), random: () => 0, stateOf: () => state, bodies });
    const flood = [0, 1].map(() => lot.park('t', { ...opts('flood', 60_000), maxQueue: 2, bodyBytes: 400 }));
    // 400 held once flood's newest gives its 400 back: 400 + 700 is over the 1,000.
    expect(await lot.park('t', { ...opts('quiet', 60_000), maxQueue: 2, bodyBytes: 700 })).toEqual({ kind: 'full' });
    expect(lot.waiting('t')).toBe(2);
    expect(bodies.bytes).toBe(800);
    state = { mode: 'available', slots: 10 };
    await vi.advanceTimersByTimeAsync(1_000);
    for (const p of flood) expect((await p).kind).toBe('released');
  });

  it('counts the body of the request it displaces as freed: a newcomer that fits in its place parks', async () => {
    const bodies = new WaitingBodies(1_000);
    lot = new ParkingLot({ now: () => Date.now(), random: () => 0, stateOf: () => state, bodies });
    const flood = [0, 1].map(() => lot.park('t', { ...opts('flood', 60_000), maxQueue: 2, bodyBytes: 400 }));
    // 800 + 500 is over the cap; 400 + 500, once flood's newest gives its 400 back, is not.
    const quiet = lot.park('t', { ...opts('quiet', 60_000), maxQueue: 2, bodyBytes: 500 });
    expect(await flood[1]).toEqual({ kind: 'full' });
    expect(bodies.bytes).toBe(900);
    state = { mode: 'available', slots: 10 };
    await vi.advanceTimersByTimeAsync(1_000);
    expect((await quiet).kind).toBe('released');
    expect((await flood[0]!).kind).toBe('released');
  });
});

describe("a full route's parking queue, counts", () => {
  it("forgets what a client had parked once it left: a client that has gone is no one's place to take", async () => {
    state = { mode: 'available', slots: 10 };
    const gone = await Promise.all([0, 1, 2].map(() => lot.park('t', { ...opts('gone', 60_000), maxQueue: 3 })));
    expect(gone.map((r) => r.kind)).toEqual(['released', 'released', 'released']);
    for (const r of gone) if (r.kind === 'released') r.ticket.done();
    state = { mode: 'blocked', availableAtMs: 5_000 };
    lot.notify('t');
    const a = [0, 1, 2].map(() => lot.park('t', { ...opts('a', 60_000), maxQueue: 3 }));
    const quiet = lot.park('t', { ...opts('quiet', 60_000), maxQueue: 3 });
    // 'a' holds the whole queue now: its newest gives its place.
    expect(await a[2]).toEqual({ kind: 'full' });
    state = { mode: 'available', slots: 10 };
    await vi.advanceTimersByTimeAsync(5_000);
    expect((await quiet).kind).toBe('released');
  });
});

describe("a full route's parking queue, between classes", () => {
  it("gives no higher class's place to a newcomer of a lower class: a batch newcomer does not turn an online request away", async () => {
    const online = [0, 1, 2].map(() => lot.park('t', { ...opts('flood', 60_000, 0), maxQueue: 3 }));
    const outcomes: string[] = [];
    online.forEach((p, i) => void p.then((r) => outcomes.push(`online${i}:${r.kind}`)));
    const late = lot.park('t', { ...opts('quiet', 60_000, 1), maxQueue: 3 });
    await vi.advanceTimersByTimeAsync(0);
    expect(await Promise.race([late, Promise.resolve({ kind: 'parked' })])).toEqual({ kind: 'full' });
    expect(outcomes).toEqual([]);
    expect(lot.waiting('t')).toBe(3);
    // A flood entry of the newcomer's class or a lower one is its to take: the newest of those.
    const batch = lot.park('t', { ...opts('flood', 60_000, 1), maxQueue: 4 });
    const quiet = lot.park('t', { ...opts('quiet', 60_000, 1), maxQueue: 4 });
    expect(await batch).toEqual({ kind: 'full' });
    state = { mode: 'available', slots: 10 };
    await vi.advanceTimersByTimeAsync(1_000);
    expect((await quiet).kind).toBe('released');
    for (const p of online) expect((await p).kind).toBe('released');
  });
});

describe("a full route's parking queue, counts through every way out", () => {
  it('forgets a request that timed out, was aborted or was displaced: the client keeps no place it no longer holds', async () => {
    const ac = new AbortController();
    const flood = [
      lot.park('t', { ...opts('flood', 60_000), maxQueue: 4, signal: ac.signal }),
      lot.park('t', { ...opts('flood', 60_000), maxQueue: 4, maxWaitMs: 100 }),
      lot.park('t', { ...opts('flood', 60_000), maxQueue: 4 }),
      lot.park('t', { ...opts('flood', 60_000), maxQueue: 4 }),
    ];
    // Full: quiet takes flood's newest place (flood 3, quiet 1).
    const quiet = lot.park('t', { ...opts('quiet', 60_000), maxQueue: 4 });
    expect(await flood[3]).toEqual({ kind: 'full' });
    ac.abort();
    expect(await flood[0]).toEqual({ kind: 'aborted' });
    await vi.advanceTimersByTimeAsync(100);
    expect(await flood[1]).toEqual({ kind: 'timeout' });
    // flood 1, quiet 1, and two places free: 'c' and 'd' park; then, full, no one has two more than 'e' (none).
    const c = ['c', 'd'].map((name) => lot.park('t', { ...opts(name, 60_000), maxQueue: 4 }));
    expect(lot.waiting('t')).toBe(4);
    expect(await lot.park('t', { ...opts('e', 60_000), maxQueue: 4 })).toEqual({ kind: 'full' });
    lot.close();
    for (const p of [flood[2]!, quiet, ...c]) expect((await p).kind).toBe('closing');
  });
});
