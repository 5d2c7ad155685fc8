// Priority pools and adaptive limits, with a fake clock: class order, bounded queues, deadline-aware rejection,
// AIMD steps, and batch shrinking before online.
import { describe, expect, it } from 'vitest';
import { classLimit, initialLimit, onRateLimited, onRecovered, onSuccess, type LimitSettings, type LimitState } from '../src/policy/adaptive-limit.ts';
import { quotaLowUntil } from '../src/policy/quota-headers.ts';
import { ProviderPool, type Slot, type SlotRequest } from '../src/pools/provider-pool.ts';

/** In flight at the limit: the limit binds, so 429s count (no clamp: nothing was seen above the floors). */
const NONE = { total: 1_000, byClass: [0, 0] };
const flush = () => new Promise((r) => setImmediate(r));
const settings: LimitSettings = { max: 100, min: 1, decrease: 0.9, minShares: [0.5, 0.1] };

const req = (cls: number, extra: Partial<SlotRequest> = {}): SlotRequest => ({ cls, target: 'p/m', retry: false, deadlineAtMs: 60_000, minAttemptMs: 0, signal: new AbortController().signal, ...extra });
const slot = async (p: ProviderPool, r: SlotRequest): Promise<Slot> => {
  const a = await p.acquire(r);
  if (!a.ok) throw new Error(`not acquired: ${a.reason}`);
  return a.slot;
};
/** Two slots held by `held`'s class, then batch and online wait (batch first): the order in which they get a slot. */
async function grantOrder(p: ProviderPool, held: Slot[]): Promise<string[]> {
  const order: string[] = [];
  void p.acquire(req(1)).then((a) => a.ok && order.push('batch'));
  void p.acquire(req(0)).then((a) => a.ok && order.push('online'));
  for (const h of held) {
    h.release();
    await flush();
  }
  return order;
}

describe('the adaptive limit', () => {
  it('shrinks batch to its floor before it cuts the limit online lives under', () => {
    let st = { ...initialLimit(settings), caps: [100, 100] };
    let now = 0;
    const seen: Array<[number, number]> = [];
    for (let i = 0; i < 40; i++) {
      st = onRateLimited(st, settings, (now += 1_000), 500, NONE);
      seen.push([Math.floor(st.limit), classLimit(st, 1)]);
    }
    // First the batch cap falls while the limit stays at 100 ...
    expect(seen[0]).toEqual([100, 90]);
    const atFloor = seen.findIndex(([, batch]) => batch === 10);
    expect(atFloor).toBeGreaterThan(10);
    expect(seen.slice(0, atFloor).every(([limit]) => limit === 100)).toBe(true);
    // ... and only then the limit itself.
    expect(seen.at(-1)![0]).toBeLessThan(100);
  });

  it('cuts at most once per round trip', () => {
    const st = onRateLimited({ ...initialLimit(settings), caps: [100, 100] }, settings, 1_000, 500, NONE);
    expect(onRateLimited(st, settings, 1_200, 500, NONE).caps).toEqual(st.caps);
    expect(onRateLimited(st, settings, 1_500, 500, NONE).caps).not.toEqual(st.caps);
  });

  it('multiplies the limit by `decrease`, then grows batch back before the limit', () => {
    let st = { ...initialLimit(settings), caps: [100, 10] };
    st = onRateLimited(st, settings, 0, 1, NONE);
    expect(st.limit).toBeCloseTo(90);
    expect(st.caps[1]).toBe(10);
    // Batch's cap grows first (one per round trip of its own size) ...
    for (let i = 0; i < 10; i++) st = onSuccess(st, settings, 1e9, 1);
    expect(st.caps[1]).toBeGreaterThan(10.9);
    expect(st.limit).toBeCloseTo(90);
    // ... and the limit once batch has caught up with it: one per round trip.
    st = { ...st, caps: [90, 90] };
    const before = st.limit;
    for (let i = 0; i < 90; i++) st = onSuccess(st, settings, 1e9, 1);
    expect(st.limit).toBeGreaterThan(before + 0.9);
    expect(st.limit).toBeLessThan(before + 1.1);
  });

  it('grows one slot per round trip to the first token, not per stream held: long streams grow back as fast', () => {
    // A limit of 50 under 30 s streams whose first token comes in 1 s: a success every 0.6 s (50 slots, 30 s each).
    const cut = { ...initialLimit(settings), limit: 50, caps: [50, 50] };
    let st = cut;
    for (let i = 0; i < 50; i++) st = onSuccess(st, settings, 1e9, 1_000, 30_000);
    // 50 successes take about one hold time, 30 s (less as the limit grows): up to thirty round trips, one slot each.
    expect(st.limit).toBeGreaterThan(70);
    expect(st.limit).toBeLessThan(81);
    // Whole answers (held as long as their round trip) keep one slot per limit's worth of successes.
    let whole = cut;
    for (let i = 0; i < 50; i++) whole = onSuccess(whole, settings, 1e9, 1_000, 1_000);
    expect(whole.limit).toBeCloseTo(51, 0);
  });

  it('restarts at half after an outage and slow-starts back, doubling per round trip', () => {
    let st = onRecovered({ ...initialLimit(settings), limit: 80 }, settings);
    expect(st.limit).toBe(40);
    for (let i = 0; i < 40; i++) st = onSuccess(st, settings, 1e9, 1);
    expect(st.limit).toBe(80);
    st = onSuccess(st, settings, 1e9, 1);
    expect(st.limit).toBeLessThan(81);
  });

  it('slow-starts back to the limit before the first of two outages, not to the halved one', () => {
    let st = onRecovered({ ...initialLimit(settings), limit: 80 }, settings);
    st = onRecovered(st, settings);
    expect(st.limit).toBe(20);
    for (let i = 0; i < 60; i++) st = onSuccess(st, settings, 1e9, 1);
    expect(st.limit).toBe(80);
  });

  it('clamps at once to one below what was in flight when the provider said no', () => {
    // Batch had 20 in flight (above its floor of 10): clamped to 19, then the round trip's cut: 19 x 0.9.
    const st = onRateLimited({ ...initialLimit(settings), caps: [100, 100] }, settings, 0, 1_000, { total: 21, byClass: [1, 20], waiting: 5 });
    expect(classLimit(st, 1)).toBe(17);
    expect(st.limit).toBe(100);
    // Batch at its floor: the limit itself is clamped to what was in flight, less one.
    const low = onRateLimited({ ...initialLimit(settings), caps: [100, 100] }, settings, 0, 1_000, { total: 11, byClass: [6, 5], waiting: 5 });
    expect(Math.floor(low.limit)).toBe(10);
  });

  it('slow-starts back to half of where a burst of 429s began once it is over, however low its clamps took the limit', () => {
    // A quota window: every request in flight gets a 429 as they drain, and the limit follows them down.
    let st = initialLimit(settings);
    let now = 1_000;
    for (let inUse = 100; inUse > 1; inUse--) st = onRateLimited(st, settings, (now += 1), 100, { total: inUse, byClass: [inUse, 0], waiting: 10 });
    expect(st.limit).toBeLessThanOrEqual(2);
    // The window is over: one slot more per success, doubling per round trip, up to 50; then the usual +1 per round trip.
    now += 200;
    for (let i = 0; i < 60; i++) st = onSuccess(st, settings, (now += 1), 100);
    expect(st.limit).toBe(50);
  });

  it('grows again only after some quiet round trips', () => {
    const st = onRateLimited({ ...initialLimit(settings), caps: [100, 50] }, settings, 1_000, 100, NONE);
    const grown = (t: number) => onSuccess(st, settings, t, 100);
    expect([grown(1_500).limit, grown(1_500).caps]).toEqual([st.limit, st.caps]);
    expect(grown(2_100).caps).not.toEqual(st.caps);
  });

  it('ignores 429s that come while the limit is far from binding (a quota window, not our concurrency)', () => {
    const st = initialLimit(settings);
    let now = 0;
    let cur = st;
    for (let i = 0; i < 100; i++) cur = onRateLimited(cur, settings, (now += 700), 200, { total: 30, byClass: [30, 0] });
    expect(cur).toBe(st);
  });

  it('counts the 429s earlier in the round trip as in flight: a flood refused at once is our concurrency, however few it holds now', () => {
    // 30 in flight of 100 when each comes (the refused gave their slots back at once, their retries sleep in backoff):
    // alone, far from binding; with the 60 refused earlier in this round trip, within a tenth of the limit.
    const st = initialLimit(settings);
    expect(onRateLimited(st, settings, 1_000, 200, { total: 30, byClass: [30, 0], refusedLately: 59 })).toBe(st);
    expect(onRateLimited(st, settings, 1_000, 200, { total: 30, byClass: [30, 0], refusedLately: 60 }).limit).toBeLessThan(100);
  });

  it('never goes below minLimit', () => {
    let st = { ...initialLimit(settings), caps: [100, 10] };
    for (let i = 0; i < 200; i++) st = onRateLimited(st, settings, i * 10, 1, NONE);
    expect(st.limit).toBe(1);
  });
});

describe('the provider pool', () => {
  function pool(capacity = 2, maxQueue = 3) {
    let now = 0;
    const p = new ProviderPool(
      { provider: 'p', capacity, retryCapacity: 1, classes: [{ name: 'online', minShare: 0.5, maxQueue }, { name: 'batch', minShare: 0, maxQueue }], decrease: 0.9, minLimit: 1 },
      () => now,
    );
    return { p, tick: (ms: number) => (now += ms) };
  }

  it('serves waiting online requests before batch ones that came earlier', async () => {
    const { p } = pool();
    expect(await grantOrder(p, [await slot(p, req(1)), await slot(p, req(1))])).toEqual(['online', 'batch']);
  });

  it('keeps what a class\'s maxShare leaves free for the others, idle or not: batch\'s long streams never take the last slots', async () => {
    const p = new ProviderPool(
      { provider: 'p', capacity: 10, retryCapacity: 10, classes: [{ name: 'online', minShare: 0.5, maxQueue: 10 }, { name: 'batch', minShare: 0.1, maxShare: 0.8, maxQueue: 10 }], decrease: 0.9, minLimit: 1 },
      () => 0,
    );
    const batch = await Promise.all(Array.from({ length: 8 }, () => slot(p, req(1))));
    let ninth: Slot | undefined;
    void p.acquire(req(1)).then((a) => a.ok && (ninth = a.slot));
    await flush();
    // The pool is idle past batch's 8 slots, and still the ninth batch request waits ...
    expect(ninth).toBeUndefined();
    // ... while online requests arriving take the two kept free at once.
    const online = [await p.acquire(req(0)), await p.acquire(req(0))];
    expect(online.map((a) => a.ok && !a.queued)).toEqual([true, true]);
    // A batch slot given back goes to the batch waiter: it is back under its share.
    batch[0]!.release();
    await flush();
    expect(ninth).toBeDefined();
    expect(p.snapshot().inUse).toEqual([2, 8]);
  });

  it('tells a class its maxShare holds back a wait of its share\'s turns, not of the idle pool\'s', async () => {
    const share = (maxShare: number) => {
      const p = new ProviderPool(
        { provider: 'p', capacity: 10, retryCapacity: 10, classes: [{ name: 'online', minShare: 0, maxQueue: 10 }, { name: 'batch', minShare: 0, maxShare, maxQueue: 10 }], decrease: 0.9, minLimit: 1 },
        () => 0,
      );
      return p;
    };
    const waitBehind = async (p: ProviderPool) => {
      await slot(p, req(1));
      await slot(p, req(1));
      for (let i = 0; i < 4; i++) void p.acquire(req(1));
      await flush();
      return p.expectedWaitMs(1, 'p/m');
    };
    // Two slots of batch's share held, four queued: three rounds of two for the fifth. Estimated by the idle pool's
    // eight spare slots, it was one round, as for a class with no share (whose four took slots at once).
    expect(await waitBehind(share(0.2))).toBe(3 * (await waitBehind(share(1))));
  });

  it('gives a class with a maxShare too small for one slot of the pool one slot still', async () => {
    const p = new ProviderPool(
      { provider: 'p', capacity: 2, retryCapacity: 2, classes: [{ name: 'online', minShare: 0, maxQueue: 10 }, { name: 'batch', minShare: 0, maxShare: 0.1, maxQueue: 10 }], decrease: 0.9, minLimit: 1 },
      () => 0,
    );
    expect((await p.acquire(req(1))).ok).toBe(true);
    let second = false;
    void p.acquire(req(1)).then((a) => (second = a.ok));
    await flush();
    expect(second).toBe(false);
  });

  it('reads a class name from a header whatever its case and surrounding spaces', () => {
    const { p } = pool();
    expect(p.classIndex('batch')).toBe(1);
    expect(p.classIndex(' Batch ')).toBe(1);
    expect(p.classIndex('ONLINE')).toBe(0);
    expect(p.classIndex('bulk')).toBeUndefined();
    // Sent twice, the header is one comma-joined value: the lowest class it names.
    expect(p.classIndex('batch, online')).toBe(1);
    expect(p.classIndex('online,Batch')).toBe(1);
    expect(p.classIndex('bulk, online')).toBe(0);
    expect(p.classIndex('bulk, ')).toBeUndefined();
  });

  it('gives an idle slot to a first attempt queued behind retries waiting for the retry share, not a load_shed', async () => {
    // Four slots, one for retries; a queue of two. One retry holds the retry share, two more wait for it.
    const { p } = pool(4, 2);
    await slot(p, req(0, { retry: true }));
    const waiting = [p.acquire(req(0, { retry: true })), p.acquire(req(0, { retry: true }))];
    await flush();
    // Three slots are idle: first attempts take them, though the class queue is full of retries they may not use.
    const firsts = await Promise.all([p.acquire(req(0)), p.acquire(req(0)), p.acquire(req(0))]);
    expect(firsts.map((a) => (a.ok ? 'slot' : a.reason))).toEqual(['slot', 'slot', 'slot']);
    expect(p.snapshot().inUse).toEqual([4, 0]);
    expect(waiting).toHaveLength(2);
  });

  it('lets batch use capacity online leaves idle', async () => {
    const { p } = pool(4);
    for (let i = 0; i < 4; i++) await slot(p, req(1));
    expect(p.snapshot().inUse).toEqual([0, 4]);
  });

  it('bounds each class queue and sheds the overflow with an estimated retry-after', async () => {
    const { p } = pool(1, 2);
    await slot(p, req(1));
    void p.acquire(req(1));
    void p.acquire(req(1));
    const shed = await p.acquire(req(1));
    expect(shed).toMatchObject({ ok: false, reason: 'queue_full' });
    expect((shed as { retryAfterMs: number }).retryAfterMs).toBeGreaterThan(0);
  });

  it('queues a request the parking lot released though the class queue is full: it waited, and the lot paces what it lets go', async () => {
    const { p } = pool(1, 1);
    const held = await slot(p, req(0));
    void p.acquire(req(0));
    expect(await p.acquire(req(0))).toMatchObject({ ok: false, reason: 'queue_full' });
    let released = false;
    void p.acquire(req(0, { released: true })).then((a) => (released = a.ok));
    await flush();
    expect(p.snapshot().queued).toEqual([2, 0]);
    // It waits its turn: the slot goes to the waiter that came first, the next one to it.
    held.release();
    await flush();
    expect(released).toBe(false);
    expect(p.snapshot().queued).toEqual([1, 0]);
  });

  it('assumes a second per round trip until an answer is timed, then takes the first timing as it is', async () => {
    const { p } = pool(1, 0);
    await slot(p, req(1));
    // Nothing timed yet: one slot, nobody ahead, about one round trip.
    expect(p.expectedWaitMs(1, 'p/m')).toBe(1_000);
    p.observe('p/m', 'success', 2_400);
    expect(p.expectedWaitMs(1, 'p/m')).toBe(2_400);
    // Later timings move it smoothly.
    p.observe('p/m', 'success', 400);
    expect(p.expectedWaitMs(1, 'p/m')).toBe(2_000);
  });

  it('rejects at once a request that cannot expect a slot before its deadline', async () => {
    const { p } = pool(1);
    const s = await slot(p, req(0));
    p.observe('p/m', 'success', 2_000); // round trips take ~2 s now
    s.release();
    await slot(p, req(0));
    expect(await p.acquire(req(0, { deadlineAtMs: 300 }))).toMatchObject({ ok: false, reason: 'deadline' });
  });

  it('caps retries in flight', async () => {
    const { p } = pool(4);
    await slot(p, req(0, { retry: true }));
    let second = false;
    void p.acquire(req(0, { retry: true })).then(() => (second = true));
    await flush();
    expect(second).toBe(false);
    expect((await p.acquire(req(0))).ok).toBe(true);
  });

  it('leaves the queue at once when the request is aborted', async () => {
    const { p } = pool(1);
    await slot(p, req(0));
    const ctl = new AbortController();
    const waiting = p.acquire(req(0, { signal: ctl.signal }));
    ctl.abort();
    expect(await waiting).toEqual({ ok: false, reason: 'aborted' });
    expect(p.snapshot().queued).toEqual([0, 0]);
  });

  it('sheds a waiter still queued when less than minAttemptMs is left, instead of holding it to a 504', async () => {
    const { p } = pool(1);
    await slot(p, req(0));
    const started = Date.now();
    const waiting = p.acquire(req(0, { deadlineAtMs: 1_200, minAttemptMs: 1_000 }));
    expect(await waiting).toMatchObject({ ok: false, reason: 'deadline' });
    expect(Date.now() - started).toBeLessThan(1_000);
    expect(p.snapshot().queued).toEqual([0, 0]);
  });

  it('holds batch back while the provider\'s quota is nearly spent, online still goes', async () => {
    const { p, tick } = pool(4);
    p.holdLowerClasses('p/m', 1_000);
    expect((await p.acquire(req(0))).ok).toBe(true);
    let batch = false;
    void p.acquire(req(1)).then((a) => (batch = a.ok));
    await flush();
    expect(batch).toBe(false);
    tick(1_001);
    p.observe('p/m', 'success', 10);
    await flush();
    expect(batch).toBe(true);
  });
});

describe('quota headers', () => {
  it('says when a nearly spent quota resets', () => {
    expect(quotaLowUntil({ 'x-ratelimit-limit-requests': '1000', 'x-ratelimit-remaining-requests': '3', 'x-ratelimit-reset-requests': '2s' }, 10_000)).toBe(12_000);
    expect(quotaLowUntil({ 'x-ratelimit-limit-requests': '1000', 'x-ratelimit-remaining-requests': '500', 'x-ratelimit-reset-requests': '2s' }, 10_000)).toBeUndefined();
    expect(quotaLowUntil({ 'anthropic-ratelimit-requests-limit': '50', 'anthropic-ratelimit-requests-remaining': '0', 'anthropic-ratelimit-requests-reset': '2026-01-01T00:00:05Z' }, Date.parse('2026-01-01T00:00:00Z'))).toBe(Date.parse('2026-01-01T00:00:05Z'));
    expect(quotaLowUntil({ 'x-ratelimit-remaining-requests': 'lots' }, 0)).toBeUndefined();
  });
});

describe('the pool and the one wait rule', () => {
  it('does not grant a slot to a waiter whose deadline no longer leaves time for an attempt', async () => {
    let now = 0;
    const p = new ProviderPool(
      { provider: 'p', capacity: 1, retryCapacity: 1, classes: [{ name: 'online', minShare: 0, maxQueue: 10 }], decrease: 0.9, minLimit: 1 },
      () => now,
    );
    const held = await p.acquire({ cls: 0, target: 'p/m', retry: false, deadlineAtMs: 60_000, minAttemptMs: 0, signal: new AbortController().signal });
    const waiting = p.acquire({ cls: 0, target: 'p/m', retry: false, deadlineAtMs: 1_500, minAttemptMs: 1_000, signal: new AbortController().signal });
    now = 800; // only 700 ms left: less than minAttemptMs
    if (held.ok) held.slot.release();
    expect(await waiting).toMatchObject({ ok: false, reason: 'deadline' });
    expect(p.snapshot().inUse).toEqual([0]);
  });
});

/** A 20-slot pool of online (minShare 0.5) and batch (0.1) on a clock the test moves (`clock.now`). */
function onlineAndBatch(maxQueue: number): { p: ProviderPool; clock: { now: number } } {
  const clock = { now: 0 };
  const classes = [{ name: 'online', minShare: 0.5, maxQueue }, { name: 'batch', minShare: 0.1, maxQueue }];
  return { p: new ProviderPool({ provider: 'p', capacity: 20, retryCapacity: 20, classes, decrease: 0.9, minLimit: 1 }, () => clock.now), clock };
}

describe('class floors under a cut limit', () => {
  it('does not hand batch its minShare of the full pool once 429s have cut the target limit below it', async () => {
    // maxConcurrent 20 with batch's minShare 0.1 is a floor of 2 slots; a provider whose capacity fell to 2 (a third-party
    // run: 429 storm, batch flood) cut the limit to 2, and batch's "floor" was the whole limit: online queued behind it.
    const { p, clock } = onlineAndBatch(100);
    const take = (cls: number) => slot(p, req(cls));
    // A batch flood takes the idle pool, one more waits (the limit binds), and the provider answers 429s.
    const flood = await Promise.all(Array.from({ length: 20 }, () => take(1)));
    const queued = p.acquire(req(1));
    for (let i = 0; i < 100 && Math.floor(p.limitOf('p/m')) > 2; i++) {
      p.observe('p/m', 'rate-limited', 0);
      clock.now += 1_001;
    }
    expect(Math.floor(p.limitOf('p/m'))).toBe(2);
    for (const s of flood) s.release();
    const q = await queued;
    if (q.ok) q.slot.release();
    // Two online attempts fill the limit; then batch and online wait, batch first.
    expect(await grantOrder(p, [await take(0), await take(0)])).toEqual(['online', 'batch']);
  });
});

describe('the adaptive limit under a steady share of 429s', () => {
  // Growth waits QUIET_ROUND_TRIPS without any 429, which a provider refusing a steady share of requests whatever our
  // concurrency never gives: every cut stayed, and the limit fell to 1 (a third-party run: online p50 0.2 s -> 4.6 s).
  it('climbs back from a flood that cut it to 1 when the provider refuses 3 in 10 requests whatever the concurrency', async () => {
    const { p, clock } = onlineAndBatch(1000);
    const held: Slot[] = [];
    let clients = 40; // a flood first, then online's steady 4 (10 req/s of 200 ms answers need 2 slots)
    let inFlightOrQueued = 0;
    const issue = () => {
      inFlightOrQueued++;
      void p.acquire({ cls: 0, target: 'p/m', retry: false, deadlineAtMs: 1e9, minAttemptMs: 0, signal: new AbortController().signal }).then((a) => {
        if (a.ok) held.push(a.slot);
      });
    };
    let answered = 0;
    for (let step = 0; step < 300; step++) {
      if (step === 50) clients = 4;
      while (inFlightOrQueued < clients) issue();
      await flush();
      clock.now += 200;
      for (const s of held.splice(0)) {
        // Exactly 3 of every 10 answers are 429s, spread evenly (the bundled mock's `--error 429:0.3`).
        const limited = Math.floor(((answered + 1) * 3) / 10) > Math.floor((answered * 3) / 10);
        answered++;
        p.observe('p/m', limited ? 'rate-limited' : 'success', 200);
        s.release();
        inFlightOrQueued--;
      }
    }
    // 50 s after the flood: online's 4 concurrent requests should not be queuing behind a limit of 1.
    expect(Math.floor(p.limitOf('p/m'))).toBeGreaterThanOrEqual(4);
  });
});

describe('refusals that are not about our concurrency', () => {
  type Refusals = (inFlight: number, roundTrip: number) => number;
  /** A provider that takes `capacity` in flight and refuses the rest at once. */
  const atCapacity = (capacity: number): Refusals => (inFlight) => Math.max(0, inFlight - capacity);
  /** A provider that refuses `k` in 10 of whatever is sent (spread evenly over round trips), whatever the concurrency. */
  const inTen = (k: number): Refusals => (inFlight, r) => Math.floor(((r + 1) * inFlight * k) / 10) - Math.floor((r * inFlight * k) / 10);
  const threeInTen = inTen(3);

  /**
   * Round trips with the limit binding (requests wait): the refusals come back first, then the answers a round trip
   * later. Returns the state, whether refusals were ever judged noise, and the refused share of the last ten.
   */
  function run(from: LimitState, refusals: Refusals, roundTrips: number, startMs = 0) {
    let st = from;
    let now = startMs;
    let refused = 0;
    let answered = 0;
    let judgedNoise = false;
    for (let r = 0; r < roundTrips; r++) {
      const inFlight = Math.floor(st.limit);
      const over = Math.min(inFlight, refusals(inFlight, r));
      for (let i = 0; i < over; i++) st = onRateLimited(st, settings, now + 1 + i * 0.01, 100, { total: inFlight - i, byClass: [inFlight - i, 0], waiting: 50 });
      for (let i = 0; i < inFlight - over; i++) st = onSuccess(st, settings, now + 100, 100);
      if (r >= roundTrips - 10) {
        refused += over;
        answered += inFlight;
      }
      judgedNoise ||= st.noiseShare !== undefined;
      now += 100;
    }
    return { st, judgedNoise, share: refused / answered, endMs: now };
  }
  const at = (limit: number): LimitState => ({ ...initialLimit(settings), limit, caps: [limit, limit] });

  it('are not so judged when cutting the limit makes them fewer: a provider at capacity, from 1.7 to 3 times it', () => {
    for (const start of [100, 75, 60]) {
      const r = run(at(start), atCapacity(35), 300);
      expect(r.judgedNoise).toBe(false);
      expect(Math.floor(r.st.limit)).toBeLessThanOrEqual(36);
      expect(r.share).toBeLessThan(0.05);
    }
  });

  it('are not so judged after a short burst at a small provider: 16 of 24 refused is two in three', () => {
    // A moving average of the refused share (from 0) read 16 quick 429s as 0.56; the clamps cut the limit to 8 at
    // once, slow start took it back to 12, where a provider taking 8 refuses one in three: judged against 0.56 that
    // looked like noise, and the limit went back to 24 for good, with two in three attempts refused.
    for (const [start, capacity] of [[24, 8], [20, 8], [12, 4]] as const) {
      const r = run(at(start), atCapacity(capacity), 300);
      expect(r.judgedNoise).toBe(false);
      expect(Math.floor(r.st.limit)).toBeLessThanOrEqual(capacity + 1);
      expect(r.share).toBeLessThan(0.05);
    }
  });

  it('are judged noise when halving the limit leaves their share as it was, and the limit goes back', () => {
    const r = run(at(60), threeInTen, 100);
    expect(r.judgedNoise).toBe(true);
    expect(r.st.noiseShare).toBeGreaterThan(0.2);
    expect(r.st.limit).toBeGreaterThanOrEqual(54);
  });

  it('are read as signals again once they clearly grow, from noise of one in two as well (twice that is more than all)', () => {
    const noisy = run(at(60), inTen(5), 100);
    expect(noisy.st.noiseShare).toBeGreaterThan(0.4);
    const r = run(noisy.st, atCapacity(8), 300, noisy.endMs);
    expect(r.st.noiseShare).toBeUndefined();
    expect(Math.floor(r.st.limit)).toBeLessThanOrEqual(9);
  });

  it('are read as signals again once they clearly grow: the provider\'s capacity binds on top of the noise', () => {
    const noisy = run(at(60), threeInTen, 100);
    expect(noisy.st.noiseShare).toBeDefined();
    const r = run(noisy.st, atCapacity(20), 300, noisy.endMs);
    expect(r.st.noiseShare).toBeUndefined();
    expect(Math.floor(r.st.limit)).toBeLessThanOrEqual(21);
    expect(r.share).toBeLessThan(0.05);
  });
});

describe('a class queue longer than anyone looks down at once', () => {
  /** Two slots, one for retries; one retry holds the retry share and a first attempt the other slot. */
  async function busyPool(maxQueue: number) {
    const p = new ProviderPool(
      { provider: 'p', capacity: 2, retryCapacity: 1, classes: [{ name: 'online', minShare: 0, maxQueue }], decrease: 0.9, minLimit: 1 },
      () => 0,
    );
    // A deadline far enough away that the wait estimate (thousands ahead, two slots) sheds none of them.
    const req = (retry: boolean): SlotRequest => ({ cls: 0, target: 'p/m', retry, deadlineAtMs: 2_000_000_000, minAttemptMs: 0, signal: new AbortController().signal });
    await slot(p, req(true));
    const held = await slot(p, req(false));
    return { p, req, held };
  }

  it('gives a freed slot to the first waiter that can use it, behind thousands held back by the retry share, not to a newcomer', async () => {
    const { p, req, held } = await busyPool(10_000);
    // 5,000 retries wait for the retry share; then a first attempt queues for the busy pool.
    for (let i = 0; i < 5_000; i++) void p.acquire(req(true));
    let first = false;
    void p.acquire(req(false)).then((a) => (first = a.ok));
    held.release();
    await flush();
    // The freed slot is the first attempt's (it came before the newcomer); the newcomer waits behind it.
    expect(first).toBe(true);
    let newcomer = false;
    void p.acquire(req(false)).then((a) => (newcomer = a.ok));
    await flush();
    expect(newcomer).toBe(false);
    expect(p.snapshot().queued).toEqual([5_001]);
  });

  it('serves waiters of a class in arrival order across targets and retries, whatever the queue length', async () => {
    const { p, req, held } = await busyPool(10_000);
    const order: string[] = [];
    for (let i = 0; i < 3_000; i++) void p.acquire(req(true));
    // First attempts for two targets, interleaved, behind the retries.
    for (let i = 0; i < 6; i++) {
      const r = { ...req(false), target: i % 2 === 0 ? 'p/a' : 'p/b' };
      void p.acquire(r).then((a) => {
        if (!a.ok) return;
        order.push(`${r.target}#${i}`);
        // Each answer over at once: its slot goes to the next in line.
        a.slot.release();
      });
    }
    held.release();
    for (let i = 0; i < 10; i++) await flush();
    expect(order).toEqual(['p/a#0', 'p/b#1', 'p/a#2', 'p/b#3', 'p/a#4', 'p/b#5']);
  });

  it('keeps a lower class\'s minShare for its waiter behind thousands held back by their own target', async () => {
    const p = new ProviderPool(
      { provider: 'p', capacity: 4, retryCapacity: 4, classes: [{ name: 'online', minShare: 0, maxQueue: 10_000 }, { name: 'batch', minShare: 0.5, maxQueue: 10_000 }], decrease: 0.9, minLimit: 1 },
      () => 0,
    );
    const req = (cls: number, target: string): SlotRequest => ({ cls, target, retry: false, deadlineAtMs: 2_000_000_000, minAttemptMs: 0, signal: new AbortController().signal });
    try {
      // Online holds every slot; p/a's quota is nearly spent, so its batch waiters (3,000) are held back; one batch
      // request for p/b waits behind them, and online waits too.
      const held = await Promise.all(Array.from({ length: 4 }, () => slot(p, req(0, 'p/m'))));
      p.holdLowerClasses('p/a', 1_000_000_000);
      for (let i = 0; i < 3_000; i++) void p.acquire(req(1, 'p/a'));
      let batch = false;
      void p.acquire(req(1, 'p/b')).then((a) => (batch = a.ok));
      void p.acquire(req(0, 'p/m'));
      held[0]!.release();
      await flush();
      // Batch is under its floor (half the pool): the freed slot is the p/b batch request's, not online's.
      expect(batch).toBe(true);
      expect(p.snapshot().inUse).toEqual([3, 1]);
    } finally {
      p.close();
    }
  });
});

describe('forget', () => {
  // A route on a path the gateway has no API for holds its slots under `<target> <route>` (plan-targets.ts limitKey):
  // forgotten by the bare key alone (a made-up model's 404), each such name left its entry behind for good.
  it('drops the entries a route of its own kept under the target, not only the bare one', async () => {
    const { p } = onlineAndBatch(10);
    for (const target of ['p/made-up', 'p/made-up audio', 'p/made-up-2 audio']) {
      const a = await p.acquire({ cls: 0, target, retry: false, deadlineAtMs: 1e9, minAttemptMs: 0, signal: new AbortController().signal });
      if (a.ok) a.slot.release();
    }
    p.forget('p/made-up');
    expect(p.snapshot().limits.map(([k]) => k)).toEqual(['p/made-up-2 audio']);
  });
});
