// Second review of the claim made as a request goes at the end of a capped hold-off (slot-attempt.ts, target-attempts.ts
// stillThere, state/hold-offs.ts reask and isReaskHold): the await the claim adds between the slot and the send, and
// the limit's recovery after a later, genuine short hold-off.
import { describe, expect, it } from 'vitest';
import { attemptInSlot } from '../src/pipeline/slot-attempt.ts';
import { stillThere, type Guards, type TargetPlan } from '../src/pipeline/target-attempts.ts';
import { ClientGone } from '../src/pipeline/abort-reasons.ts';
import { RequestAbort } from '../src/pipeline/request-abort.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import { HoldOffs, MAX_HOLD_OFF_MS, REASK_HOLD_MS, isSideKey } from '../src/state/hold-offs.ts';
import type { WaitHint } from '../src/policy/wait-hint.ts';
import type { Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';

const T = 1_700_000_000_000;
const NO_SPREAD = () => 0;
const hint = (delayMs: number): WaitHint => ({ delayMs, source: 'retry-after', fleetWide: true });
const refused = { error: { message: 'You exceeded your current quota for the day.', type: 'requests', param: null, code: 'rate_limit_exceeded' } };
const dailyQuota: Script = { status: 429, headers: { 'content-type': 'application/json', 'retry-after': '3600' }, steps: [JSON.stringify(refused)] };

/** A pool that grants at once and notes what the slot was told; a client that notes whether anything was sent. */
function slotPlan() {
  const done: string[] = [];
  const sent: string[] = [];
  const slot = { release: () => done.push('release'), unsent: () => done.push('unsent'), answered: () => done.push('answered') };
  const pool = { acquire: async () => ({ ok: true, slot, queued: false }), holdLowerClasses: () => {}, sending: () => () => {} };
  const client = new Proxy({}, { get: (_t, p) => (sent.push(String(p)), () => Promise.reject(new Error('sent'))) });
  const plan = { pool, cls: 0, limitKey: 'p/m', key: 'p/m', holdOffKey: 'p/m', sharesHoldOffs: true, client } as unknown as TargetPlan;
  return { plan, done, sent };
}
const ctxOf = (extra: Record<string, unknown> = {}) =>
  ({ route: { config: { minAttemptMs: 250 } }, api: 'chat', stream: false, shape: {}, signal: new RequestAbort(), deadlineAtMs: T + 600_000, ...extra }) as never;
const request = { path: '/v1/chat/completions', headers: {}, body: '{}' } as never;

/** A store whose hold-off writes are answered after `release()`: Redis's round trip, which a client may not wait out. */
class SlowStore extends MemoryStore {
  #waiting: Array<() => void> = [];
  override async setHoldOff(target: string, untilMs: number, nowMs?: number): Promise<boolean> {
    const started = super.setHoldOff(target, untilMs, nowMs);
    await new Promise<void>((r) => this.#waiting.push(r));
    return started;
  }
  release(): void {
    for (const r of this.#waiting.splice(0)) r();
  }
}

/** A capped hold-off (a daily quota's retry-after: 3600) that has just ended: the next request to go asks again. */
function cappedEnded(store: MemoryStore) {
  let now = T;
  const holdOffs = new HoldOffs(store, () => now, NO_SPREAD);
  holdOffs.start('p/m', hint(3_600_000));
  now = T + MAX_HOLD_OFF_MS;
  const guards = { holdOffs, board: {}, budget: {} } as unknown as Guards;
  return { holdOffs, guards, now: () => now, setNow: (ms: number) => (now = ms) };
}

describe('the claim of the request that asks again, made as it goes (slot-attempt.ts)', () => {
  // Before the claim, nothing was awaited between the slot and the send; the claim's round trip (Redis) is one the
  // client can leave during. Sent anyway, the aborted attempt was counted as one that went upstream (attempts metric,
  // the log, the breaker's window) and its rate turn was kept, as for a request the provider saw.
  it('sends nothing and gives the slot back unsent when the client leaves while the claim is answered', async () => {
    const store = new SlowStore();
    const { guards, now } = cappedEnded(store);
    const { plan, done, sent } = slotPlan();
    const signal = new RequestAbort();
    const going = attemptInSlot(ctxOf({ signal }), plan, request, { retry: false, released: false }, now, stillThere(guards, plan, false, now));
    await new Promise((r) => setImmediate(r));
    signal.abort(new ClientGone());
    store.release();
    const r = await going;
    expect(r.kind).toBe('expired');
    expect(done).toEqual(['unsent', 'release']);
    expect(sent).toEqual([]);
  });

  // The deadline was checked after the claim: a request whose slot came at its deadline claimed, never went, and held
  // every other request back for REASK_HOLD_MS for nothing (the very thing claiming as it goes was meant to end).
  it('claims nothing for a request whose slot came at its deadline', async () => {
    const { holdOffs, guards, now } = cappedEnded(new MemoryStore());
    const { plan, done } = slotPlan();
    const r = await attemptInSlot(ctxOf({ deadlineAtMs: now() }), plan, request, { retry: false, released: false }, now, stillThere(guards, plan, false, now));
    expect(r.kind).toBe('expired');
    expect(done).toEqual(['unsent', 'release']);
    expect(holdOffs.until('p/m')).toBeUndefined(); // no request held back
    expect(holdOffs.reask('p/m')).toBeDefined(); // and the next one to go still asks
  });
});

describe('HoldOffs.isReaskHold', () => {
  /** What runtime.ts's listener decides for every hold-off change: true when it skips the limit's recovery. */
  function verdicts(store: MemoryStore, holdOffs: HoldOffs): Array<[number, boolean]> {
    const seen: Array<[number, boolean]> = [];
    store.onChange((c) => {
      if (c.kind === 'hold-off' && !isSideKey(c.target)) seen.push([c.untilMs, holdOffs.isReaskHold(c.target, c.untilMs)]);
    });
    return seen;
  }

  // The side keys a capped hold-off leaves stay until the provider's own end (an hour for a daily quota): any short
  // hold-off in that hour (a 429 with retry-after: 1 once the provider answers again) was taken for a reask's hold, and
  // the limit did not restart at half after it, as it does after every other hold-off (README "Adaptive limits").
  it('tells a genuine short hold-off later in the hour the provider asked for from the hold of the request that asked again', async () => {
    const store = new MemoryStore();
    const { holdOffs, setNow } = cappedEnded(store);
    const seen = verdicts(store, holdOffs);
    const claimedAt = T + MAX_HOLD_OFF_MS;
    expect(await holdOffs.reask('p/m')).toBe(true);
    expect(seen).toEqual([[claimedAt + REASK_HOLD_MS, true]]);
    // The provider answered the one that asked; ten minutes later it asks for a second's pause.
    setNow(claimedAt + 600_000);
    const untilMs = holdOffs.start('p/m', hint(1_000));
    expect(seen.at(-1)).toEqual([untilMs, false]);
  });

  it("still takes a rival instance's claim made at the same moment for a reask's hold", async () => {
    const store = new MemoryStore();
    const { holdOffs } = cappedEnded(store);
    const seen = verdicts(store, holdOffs);
    expect(await holdOffs.reask('p/m')).toBe(true);
    // Another instance's claim, a few milliseconds later, reaches this one through Redis.
    await store.setHoldOff('p/m', T + MAX_HOLD_OFF_MS + REASK_HOLD_MS + 15, T + MAX_HOLD_OFF_MS);
    expect(seen.map(([, reask]) => reask)).toEqual([true, true]);
  });
});

describe('the end of a capped hold-off while the breaker is half-open', () => {
  const startUpstreams = useScriptedUpstreams();
  // A probe passed no stillAvailable to attemptInSlot, so it claimed nothing: with halfOpenProbes: 3, three requests
  // went at the capped hold-off's end (each likely refused again), where README promises one; and with no claim made,
  // the first request after the probes was held back... by nothing, while the next one to go held the rest 2 s more.
  it('asks the provider again with one request, a probe included', async () => {
    const store = new MemoryStore();
    const { client, seen } = await startUpstreams(
      { primary: () => ({ ...dailyQuota, steps: [300, ...dailyQuota.steps] }) },
      [{ provider: 'primary' }],
      { deps: { store, random: NO_SPREAD }, providers: { primary: { breaker: { halfOpenProbes: 3, closeAfter: 3, openS: 30 } } } },
    );
    const now = Date.now();
    // The breaker opened and its spell is over (half-open: three probes at a time); the provider's capped hold-off
    // (retry-after: 3600, cut to 300 ms here) ended a moment ago.
    await store.casBreaker('primary/gpt-4o', 0, { state: 'half-open', sinceMs: now - 1_000, openUntilMs: now - 1_000, probeSuccesses: 0, generation: 1 });
    await store.setHoldOff('primary/gpt-4o#asked', now + 3_600_000);
    await store.setHoldOff('primary/gpt-4o#long', now - 100);
    await store.setHoldOff('primary/gpt-4o', now - 100, now - 200);
    const ask = () => client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }).then(() => 200, (e: { status?: number }) => e.status);
    const statuses = await Promise.all([ask(), ask(), ask()]);
    expect(seen.primary!.length).toBe(1);
    expect(statuses.sort()).toEqual([429, 429, 429]);
  });
});
