// Mutation review of the parking lot (src/pipeline/parking-lot.ts), its probe moves above all: each case below failed
// with one hand mutation of the lot that the lot's other tests let through (a probe carried twice in one window, to the
// wrong target or not at all; a timer, listener or watch kept after a request left).
import { describe, expect, it, vi } from 'vitest';
import { useLotFixture } from './helpers/lot-fixture.ts';

const f = useLotFixture();
const { states, looked } = f;

const opts = (deadlineAtMs: number, alternates?: string[]) => ({ route: 'chat', deadlineAtMs, signal: new AbortController().signal, maxQueue: 100, maxWaitMs: undefined, minAttemptMs: 500, ...(alternates && { alternates }) });

/** Parks `names` for the primary, deadlines 10 s apart in that order, and records how each leaves (`name:kind:probe`). */
function parkAll(names: string[], alternates: string[], results: string[]): void {
  names.forEach((name, i) =>
    void f.lot.park('primary', opts(20_000 + i * 10_000, alternates)).then((r) => results.push(`${name}:${r.kind}${r.kind === 'moved' && r.probe ? `:${r.probe}` : ''}`)),
  );
}

describe('requests moved to carry a probing alternate\'s probes', () => {
  it('are one per window when a window begins at the exact end of the last, however often the lot looks in it', async () => {
    const results: string[] = [];
    parkAll(['a', 'b', 'c'], ['backup'], results);
    states.set('backup', { mode: 'probing', slots: 1 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    expect(results).toEqual(['a:moved:backup']);
    // The first was lost on its way: at the window's end (by the lot's own timer) the next carries the probe...
    await vi.advanceTimersByTimeAsync(1_000);
    expect(results).toEqual(['a:moved:backup', 'b:moved:backup']);
    // ...and that begins a new window: the lot looking again in it (a notify, the same millisecond or later) sends no other.
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(500);
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    expect(results).toEqual(['a:moved:backup', 'b:moved:backup']);
  });

  it('are sent while only streams are out of the alternate\'s own queue (a stream begun is no probe)', async () => {
    const results: string[] = [];
    // Released to the backup while it was up; its answer is a long stream, still running when the backup fails.
    states.set('backup', { mode: 'available', slots: 4 });
    const stream = await f.lot.park('backup', opts(120_000));
    expect(stream.kind).toBe('released');
    if (stream.kind === 'released') stream.ticket.streaming();
    states.set('backup', { mode: 'blocked', availableAtMs: 30_000 });
    parkAll(['a'], ['backup'], results);
    states.set('backup', { mode: 'probing', slots: 1 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    expect(results).toEqual(['a:moved:backup']);
    if (stream.kind === 'released') stream.ticket.done();
  });

  it('are taken from requests whose own target is probing too, its permits out elsewhere', async () => {
    const results: string[] = [];
    // The primary may be probed, but another instance holds its permit until 10 s: its parked wait for that.
    states.set('primary', { mode: 'probing', slots: 1 });
    void f.lot.park('primary', { ...opts(30_000, ['backup']), notBeforeMs: 10_000 }).then((r) => results.push(`a:${r.kind}:${r.kind === 'moved' ? r.probe : ''}`));
    await vi.advanceTimersByTimeAsync(0);
    expect(results).toEqual([]);
    states.set('backup', { mode: 'probing', slots: 1 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    expect(results).toEqual(['a:moved:backup']);
  });

  it('watch an alternate that was probing when they parked, and carry its probe once nothing else will', async () => {
    const results: string[] = [];
    states.set('backup', { mode: 'probing', slots: 1 });
    // Parked for the backup itself, waiting for a permit held elsewhere: it holds the backup's probes. Its client leaves.
    const gone = new AbortController();
    void f.lot.park('backup', { ...opts(30_000), signal: gone.signal, notBeforeMs: 20_000 }).then((r) => results.push(`own:${r.kind}`));
    // The backup probing (not blocked) when the primary's request parks: an alternate all the same.
    parkAll(['a'], ['backup'], results);
    await vi.advanceTimersByTimeAsync(1_000);
    expect(results).toEqual([]);
    gone.abort();
    await vi.advanceTimersByTimeAsync(2_500);
    expect(results).toEqual(['own:aborted', 'a:moved:backup']);
  });

  it('carry the probe of the alternate that is probing, not of another one blocked listed before it', async () => {
    const results: string[] = [];
    states.set('other', { mode: 'blocked', availableAtMs: 60_000 });
    parkAll(['a', 'b'], ['other', 'backup'], results);
    states.set('backup', { mode: 'probing', slots: 1 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    expect(results).toEqual(['a:moved:backup']);
  });

  it('are one per probing alternate, each its own slots: two alternates probing take one request each', async () => {
    const results: string[] = [];
    states.set('b1', { mode: 'blocked', availableAtMs: 60_000 });
    states.set('b2', { mode: 'blocked', availableAtMs: 60_000 });
    parkAll(['a', 'b', 'c'], ['b1', 'b2'], results);
    states.set('b1', { mode: 'probing', slots: 1 });
    states.set('b2', { mode: 'probing', slots: 1 });
    f.lot.notify('b1');
    await vi.advanceTimersByTimeAsync(0);
    expect(results).toEqual(['a:moved:b1', 'b:moved:b2']);
  });

  it('fill only the probe slots the alternate\'s own released probes leave free', async () => {
    const results: string[] = [];
    // Half-open: three probes at a time; one is out already, released from the backup's own queue.
    states.set('backup', { mode: 'probing', slots: 3 });
    const own = await f.lot.park('backup', opts(60_000));
    expect(own.kind).toBe('released');
    states.set('backup', { mode: 'blocked', availableAtMs: 60_000 });
    parkAll(['a', 'b', 'c', 'd'], ['backup'], results);
    states.set('backup', { mode: 'probing', slots: 3 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(500);
    // Two more carry its probes: a third would find no permit and park again, for the backup.
    expect(results).toEqual(['a:moved:backup', 'b:moved:backup']);
    if (own.kind === 'released') own.ticket.done();
  });

  it('start afresh for a key given back (forget): its last window does not hold the next probe back', async () => {
    const results: string[] = [];
    parkAll(['a', 'b'], ['backup'], results);
    states.set('backup', { mode: 'probing', slots: 1 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(100);
    expect(results).toEqual(['a:moved:backup']);
    f.lot.forget('backup');
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(0);
    expect(results).toEqual(['a:moved:backup', 'b:moved:backup']);
  });
});

describe('a parked request with alternates', () => {
  it('is released to its own target when both come back, paced by its limit, not moved past the release to the alternate', async () => {
    const results: string[] = [];
    parkAll(['a', 'b', 'c'], ['backup'], results);
    await vi.advanceTimersByTimeAsync(5_000);
    // Both back at once; the primary's limit restarts at one.
    states.set('backup', { mode: 'available', slots: 4 });
    states.set('primary', { mode: 'available', slots: 1 });
    f.lot.notify('primary');
    await vi.advanceTimersByTimeAsync(2_000);
    // The others wait for the primary's slot: moved, they would go around the lot's pacing.
    expect(results).toEqual(['a:released']);
    expect(f.lot.waiting('primary')).toBe(2);
  });

  it('leaves for an alternate back before its cut-off, its moment drawn late in the second or not', async () => {
    let result: string | undefined;
    f.random = () => 0.9;
    // 1.5 s left, 1 s of it needed for an attempt: half its time left (750 ms) is past its cut-off (500 ms).
    void f.lot.park('primary', { ...opts(1_500, ['backup']), minAttemptMs: 1_000 }).then((r) => (result = r.kind));
    states.set('backup', { mode: 'available', slots: 4 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(1_000);
    expect(result).toBe('moved');
  });
});

describe('a request parked for its own target', () => {
  it('parked behind a release window that ends past its cut-off is released at its last moment, not timed out', async () => {
    const results: string[] = [];
    parkAll(['a'], [], results);
    await vi.advanceTimersByTimeAsync(5_000);
    // Back after 5 s away: those parked leave over a second (a fifth of it); a newcomer parks behind that window.
    states.set('primary', { mode: 'available', slots: 10 });
    f.lot.notify('primary');
    await vi.advanceTimersByTimeAsync(0);
    expect(results).toEqual(['a:released']);
    let at: number | undefined;
    // 1.2 s to go, 0.5 s of it for the attempt: its cut-off (700 ms from now) comes before the window's end (1 s).
    void f.lot.park('primary', opts(Date.now() + 1_200)).then((r) => {
      results.push(`n:${r.kind}`);
      at = Date.now();
    });
    await vi.advanceTimersByTimeAsync(1_000);
    expect(results).toEqual(['a:released', 'n:released']);
    expect(at).toBe(5_699);
  });

  it('times out when the lot looks at its cut-off, its timer not run yet (as the timer would have)', async () => {
    const results: string[] = [];
    parkAll(['a'], [], results);
    // The cut-off (20 s less 0.5 s) by the clock; the target back at that moment.
    vi.setSystemTime(19_500);
    states.set('primary', { mode: 'available', slots: 10 });
    f.lot.notify('primary');
    await vi.advanceTimersByTimeAsync(0);
    expect(results).toEqual(['a:timeout']);
  });
});

describe('a request that leaves the lot', () => {
  it('frees one slot however often its ticket says done', async () => {
    const results: string[] = [];
    states.set('primary', { mode: 'available', slots: 1 });
    const first = await f.lot.park('primary', opts(60_000));
    expect(first.kind).toBe('released');
    parkAll(['b', 'c'], [], results);
    await vi.advanceTimersByTimeAsync(0);
    expect(results).toEqual([]);
    if (first.kind === 'released') {
      first.ticket.done();
      first.ticket.done();
    }
    await vi.advanceTimersByTimeAsync(0);
    // One slot, one out: c waits for b's.
    expect(results).toEqual(['b:released']);
  });

  it('counts its stream once however often its ticket says streaming: the next outage sends one probe at a time', async () => {
    const results: string[] = [];
    states.set('primary', { mode: 'available', slots: 4 });
    const first = await f.lot.park('primary', opts(60_000));
    expect(first.kind).toBe('released');
    if (first.kind === 'released') {
      first.ticket.streaming();
      first.ticket.streaming();
      first.ticket.done();
    }
    // The primary failed again and may be probed: one probe, whoever is parked.
    states.set('primary', { mode: 'probing', slots: 1 });
    parkAll(['b', 'c'], [], results);
    await vi.advanceTimersByTimeAsync(500);
    expect(results).toEqual(['b:released']);
  });

  it('leaves no timer behind once released (its wait timer runs to its deadline otherwise)', async () => {
    states.set('primary', { mode: 'available', slots: 1 });
    const r = await f.lot.park('primary', opts(300_000));
    expect(r.kind).toBe('released');
    expect(vi.getTimerCount()).toBe(0);
    if (r.kind === 'released') r.ticket.done();
  });

  it('stops listening to its request\'s signal once released', async () => {
    const listeners = new Set<() => void>();
    const signal = {
      aborted: false,
      reason: undefined,
      addEventListener: (_t: 'abort', l: () => void) => void listeners.add(l),
      removeEventListener: (_t: 'abort', l: () => void) => void listeners.delete(l),
    };
    states.set('primary', { mode: 'available', slots: 1 });
    const r = await f.lot.park('primary', { ...opts(300_000), signal });
    expect(r.kind).toBe('released');
    expect(listeners.size).toBe(0);
  });

  it('watches its alternates no more: the lot asks nothing of them for the requests left', async () => {
    const gone = new AbortController();
    void f.lot.park('primary', { ...opts(30_000, ['backup']), signal: gone.signal });
    void f.lot.park('primary', opts(40_000));
    gone.abort();
    await vi.advanceTimersByTimeAsync(0);
    looked.length = 0;
    states.set('primary', { mode: 'blocked', availableAtMs: 50_000 });
    f.lot.notify('primary');
    await vi.advanceTimersByTimeAsync(1_000);
    expect(looked).not.toContain('backup');
  });

  it('of a key given back leaves no timer of its queue behind (forget)', async () => {
    const gone = new AbortController();
    // Held off: its queue wakes at the hold-off's end.
    states.set('p/made-up', { mode: 'blocked', availableAtMs: 200_000 });
    void f.lot.park('p/made-up', { ...opts(300_000), signal: gone.signal });
    gone.abort();
    await vi.advanceTimersByTimeAsync(0);
    f.lot.forget('p/made-up');
    expect(vi.getTimerCount()).toBe(0);
  });
});
