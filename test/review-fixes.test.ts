// Review of the day's changes: each test names a problem found in them, and fails without its fix.
import { describe, expect, it } from 'vitest';
import { BreakerSchema } from '../src/config/schema.ts';
import { settingsForModel } from '../src/policy/breaker.ts';
import { BreakerBoard, type BreakerCause } from '../src/state/breaker-board.ts';
import { MemoryStore } from '../src/state/memory-store.ts';

describe('the breaker line names what moved the breaker', () => {
  it('a half-open round reopened by its failure share is not logged as a probe that succeeded', async () => {
    // closeAfter 4, failureRate 0.5: the first probe succeeds (half-open, one answer), two fail (three answered: too few
    // to judge), the fourth succeeds, and the round (two failures in four) reopens the breaker. The success did not trip
    // it: the round's failures did.
    const s = settingsForModel(BreakerSchema.parse({ closeAfter: 4, halfOpenProbes: 3, failureRate: 0.5, openS: 1 }), undefined);
    let now = 10_000;
    const lines: Array<{ from: string; to: string; cause: BreakerCause }> = [];
    const b = new BreakerBoard({ store: new MemoryStore(), now: () => now, random: () => 0, onTransition: (_t, from, to, cause) => lines.push({ from: from.state, to: to.state, cause }) });
    for (let i = 0; i < 5; i++) await b.record('p/m', s, 'failure', 10, undefined, { reason: 'status_503' });
    now += 2_000;
    const first = await b.admit('p/m', s, false, 5_000);
    await b.record('p/m', s, 'success', 10, first.admitted ? first.probe : undefined, { reason: 'ok' });
    expect(b.current('p/m').state).toBe('half-open');
    const probes = await Promise.all([0, 1, 2].map(() => b.admit('p/m', s, false, 5_000)));
    const [a, c, d] = probes.map((p) => (p.admitted ? p.probe : undefined));
    expect(a && c && d).toBeTruthy();
    await b.record('p/m', s, 'failure', 10, a, { reason: 'status_503' });
    await b.record('p/m', s, 'failure', 10, c, { reason: 'status_503' });
    expect(b.current('p/m').state).toBe('half-open');
    await b.record('p/m', s, 'success', 10, d, { reason: 'ok' });
    expect(b.current('p/m').state).toBe('open');
    const reopened = lines.find((l) => l.from === 'half-open' && l.to === 'open');
    expect(reopened).toBeDefined();
    expect(reopened!.cause.cause).not.toBe('probe_succeeded');
    expect(reopened!.cause).toMatchObject({ cause: 'probe_failure_rate', failures: 2, requests: 4 });
    expect(reopened!.cause.reason).not.toBe('ok');
  });
});
