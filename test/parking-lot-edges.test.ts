// Edge cases of the parking lot's waits reported in review: a request parked behind another instance's probe permit
// when the breaker closes; the probe moves a probing backup draws while another instance holds its permit; a request
// given a moment to move to an alternate that went away again before that moment.
import { describe, expect, it, vi } from 'vitest';
import { useLotFixture } from './helpers/lot-fixture.ts';

const f = useLotFixture();
const { states } = f;

const opts = (deadlineAtMs: number, more: { alternates?: string[]; notBeforeMs?: number; maxQueue?: number } = {}) => ({
  route: 'chat',
  deadlineAtMs,
  signal: new AbortController().signal,
  maxQueue: more.maxQueue ?? 100,
  maxWaitMs: undefined,
  minAttemptMs: 500,
  ...(more.alternates && { alternates: more.alternates }),
  ...(more.notBeforeMs !== undefined && { notBeforeMs: more.notBeforeMs }),
});

describe('a request parked with a probe time (notBeforeMs) when the breaker closes elsewhere', () => {
  it('parked while the breaker was open (blocked) leaves when it closes, before the probe time it parked with', async () => {
    states.set('primary', { mode: 'blocked', availableAtMs: 5_000 });
    let atMs: number | undefined;
    void f.lot.park('primary', opts(30_000, { notBeforeMs: 5_000 })).then((r) => r.kind === 'released' && (atMs = Date.now()));
    await vi.advanceTimersByTimeAsync(2_000);
    // Another instance's probe closed it: the release window (a fifth of 2 s; random 0: its start) decides.
    states.set('primary', { mode: 'available', slots: 4 });
    f.lot.notify('primary');
    await vi.advanceTimersByTimeAsync(0);
    expect(atMs).toBe(2_000);
  });

  // Design question, not built: parked while the breaker was probing (its one permit held by another instance until
  // 1 s, the pipeline's notBeforeMs: now + min(permit TTL, 1 s)), the request never saw the target away, so the close
  // at 300 ms is no return from away: it leaves at 1 000 ms, 700 ms after it could have. The lot's contract says so
  // ("not released before then, whatever the target's state says"), and the pools' model fuzz encodes it
  // (awaySincePark only for blocked). Run with `it` to see it fail: released at 1000, expected 300. A prototype that
  // ends such waits at the close (capped at the end of the tier's release window) passes it, and fails both lot cases
  // of test/pools-clients-model-fuzz.test.ts ("released before its notBeforeMs"): the contract would change.
  it.skip('parked while the breaker was probing (a permit out elsewhere) leaves when it closes, not at the permit\'s end', async () => {
    states.set('primary', { mode: 'probing', slots: 1 });
    let atMs: number | undefined;
    void f.lot.park('primary', opts(30_000, { notBeforeMs: 1_000 })).then((r) => r.kind === 'released' && (atMs = Date.now()));
    await vi.advanceTimersByTimeAsync(300);
    expect(atMs).toBeUndefined();
    states.set('primary', { mode: 'available', slots: 4 });
    f.lot.notify('primary');
    await vi.advanceTimersByTimeAsync(0);
    expect(atMs).toBe(300);
  });
});

/**
 * Drives the lot as the pipeline does while another instance holds every permit of both targets (both probing): a
 * request moved to carry the backup's probe, or released to the primary's, is refused a permit (admission: available
 * again in min(permit TTL, 1 s)) and parks again for the target expected back first (equal times: the primary, listed
 * first), with that wait as its notBeforeMs and the backup as its alternate. Returns the moves and releases per second.
 */
async function churn(backupSlots: number, parked: number, seconds: number): Promise<{ moved: number[]; released: number[] }> {
  const moved = Array.from({ length: seconds }, () => 0);
  const released = Array.from({ length: seconds }, () => 0);
  states.set('primary', { mode: 'probing', slots: 1 });
  states.set('backup', { mode: 'probing', slots: backupSlots });
  const park = (deadlineAtMs: number): void => {
    void f.lot.park('primary', opts(deadlineAtMs, { alternates: ['backup'], notBeforeMs: Date.now() + 1_000 })).then((r) => {
      const second = Math.floor(Date.now() / 1_000);
      if (second >= seconds) return;
      if (r.kind === 'moved') moved[second]!++;
      else if (r.kind === 'released') released[second]!++;
      else return;
      // The permit refused (a store round trip later), it gives its release back and parks again.
      setTimeout(() => {
        if (r.kind === 'released') r.ticket.done();
        park(deadlineAtMs);
      }, 5);
    });
  };
  for (let i = 0; i < parked; i++) park(120_000 + i * 1_000);
  await vi.advanceTimersByTimeAsync(seconds * 1_000);
  return { moved, released };
}

describe('probe moves while another instance holds the probing backup\'s permits', () => {
  it('move at most one request per probe slot per second (the churn measured: 10 s, 20 parked)', async () => {
    const one = await churn(1, 20, 10);
    expect(one.moved).toEqual([1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
    // Against the primary's own permit waits: each parked request is released once a second (its notBeforeMs) to be
    // refused the permit and park again, 19 a second of the 20. The moves add one a second to that.
    expect(one.released).toEqual([0, 19, 19, 19, 19, 19, 19, 19, 19, 19]);
  });

  it('move at most halfOpenProbes requests per second from a half-open backup (3 slots)', async () => {
    const three = await churn(3, 20, 10);
    expect(three.moved).toEqual([3, 3, 3, 3, 3, 3, 3, 3, 3, 3]);
    expect(three.released).toEqual([0, 17, 17, 17, 17, 17, 17, 17, 17, 17]);
  });
});

describe('a request given a moment to move to an alternate that came back', () => {
  it('stays parked when the alternate goes away again before that moment, and moves when it is back', async () => {
    f.random = () => 0.5;
    const results: string[] = [];
    void f.lot.park('primary', opts(30_000, { alternates: ['backup'] })).then((r) => results.push(`${r.kind}@${Date.now()}`));
    await vi.advanceTimersByTimeAsync(5_000);
    // The backup's breaker closes: the request is given a moment half a second on.
    states.set('backup', { mode: 'available', slots: 4 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(200);
    // It reopens before then: leaving, the request would find every target away and park again.
    states.set('backup', { mode: 'blocked', availableAtMs: 8_000 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(1_000);
    expect(results).toEqual([]);
    expect(f.lot.waiting('primary')).toBe(1);
    // Back for good: a new moment, half a second on.
    await vi.advanceTimersByTimeAsync(1_800);
    states.set('backup', { mode: 'available', slots: 4 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(1_000);
    expect(results).toEqual(['moved@8500']);
  });

  it('keeps its place in a full queue: a newcomer after the alternate went away again is the one refused', async () => {
    f.random = () => 0.5;
    const results: string[] = [];
    // The pipeline parks a moved request again when it finds every target away (a store round trip later).
    const park = (name: string): void => {
      void f.lot.park('primary', opts(30_000, { alternates: ['backup'], maxQueue: 1 })).then((r) => {
        results.push(`${name}:${r.kind}`);
        if (r.kind === 'moved') setTimeout(() => park(`${name}-again`), 5);
      });
    };
    park('old');
    await vi.advanceTimersByTimeAsync(5_000);
    states.set('backup', { mode: 'available', slots: 4 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(200);
    states.set('backup', { mode: 'blocked', availableAtMs: 60_000 });
    f.lot.notify('backup');
    await vi.advanceTimersByTimeAsync(302);
    // A newcomer for the same route, the queue's one place held.
    park('new');
    await vi.advanceTimersByTimeAsync(100);
    expect(results).toEqual(['new:full']);
    expect(f.lot.waiting('primary')).toBe(1);
  });
});
