// Requests in flight when the breaker opened fail after it (the provider was down for them too). Their failures must
// not count towards the next run of consecutive failures once probes have closed the breaker again: the run was broken
// by the probes' successes, and a recovered target must take consecutiveFailures new failures in a row to reopen.
import { describe, expect, it } from 'vitest';
import { BreakerSchema, } from '../src/config/schema.ts';
import { settingsForModel } from '../src/policy/breaker.ts';
import { BreakerBoard } from '../src/state/breaker-board.ts';
import { MemoryStore } from '../src/state/memory-store.ts';

const s = settingsForModel(BreakerSchema.parse({ closeAfter: 1 }), undefined);

describe('the breaker board after an outage', () => {
  it('does not reopen a recovered breaker on its first failure because of stragglers from before', async () => {
    let now = 10_000;
    const store = new MemoryStore();
    const transitions: string[] = [];
    const b = new BreakerBoard({ store, now: () => now, random: () => 0, onTransition: (_t, from, to) => transitions.push(`${from.state}->${to.state}`) });
    // Twenty requests in flight to a provider that went down: the fifth failure opens the breaker...
    for (let i = 0; i < 5; i++) await b.record('p/m', s, 'failure', 10, undefined);
    // ...and the fifteen still in flight fail after it.
    for (let i = 0; i < 15; i++) await b.record('p/m', s, 'failure', 10, undefined);
    now += 31_000;
    const probe = await b.admit('p/m', s, false, 5_000);
    expect(probe.admitted && probe.probe).toBeTruthy();
    await b.record('p/m', s, 'success', 10, probe.admitted ? probe.probe : undefined);
    expect(transitions).toEqual(['closed->open', 'open->closed']);
    // One failure after the recovery: one in a row, not sixteen.
    await b.record('p/m', s, 'failure', 10, undefined);
    expect(transitions).toEqual(['closed->open', 'open->closed']);
  });
});
