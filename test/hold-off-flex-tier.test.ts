// A flex tier's hold-off (Groq's 498 capacity_exceeded) and a credential hold's reason, as the state keeps them: the
// tier's key holds only the requests that ask for the tier (and the target's own hold-offs hold them too), the parking
// lot's queue of those requests stands where its target does but for the tier's hold-off, and a location refusal's
// hold says so to every instance that shares the store. Times and draws are injected: every number is exact.
import { describe, expect, it } from 'vitest';
import { BreakerBoard } from '../src/state/breaker-board.ts';
import { flexTierKey, HoldOffs, isFlexTierKey, isSideKey, targetOfHoldOffKey } from '../src/state/hold-offs.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import { targetStateOf } from '../src/pipeline/target-state.ts';
import { classify, OUTCOME_TABLE } from '../src/policy/outcome.ts';
import type { WaitHint } from '../src/policy/wait-hint.ts';

const T = 1_700_000_000_000;
const hint = (delayMs: number): WaitHint => ({ delayMs, source: 'retry-after', fleetWide: true });
const FLEX = flexTierKey('groq/llama');

describe("a flex tier's hold-off", () => {
  it("reads Groq's 498 capacity_exceeded as the flex tier's capacity: its hint holds that tier off, and neither the breaker nor the limit hears of it", () => {
    const c = classify({ kind: 'http', status: 498, errorCode: 'capacity_exceeded', hint: hint(5_000) });
    expect(c).toEqual({ cls: 'flex-capacity', retryKey: 498, reason: 'status_498' });
    expect(OUTCOME_TABLE[c.cls]).toMatchObject({ holdOff: 'flex-tier', breaker: 'ignore-request', limit: 'none', failover: 'next' });
    // Another status naming capacity_exceeded is the provider overloaded, as before.
    expect(classify({ kind: 'http', status: 503, errorCode: 'capacity_exceeded', hint: undefined }).cls).toBe('overloaded');
  });

  it('holds the tier key and not its target; the target\'s own hold-off holds the tier too, the later end counting', () => {
    let now = T;
    const holdOffs = new HoldOffs(new MemoryStore(), () => now, () => 0);
    expect(holdOffs.start(FLEX, hint(5_000))).toBe(T + 5_000);
    expect(holdOffs.until(FLEX)).toBe(T + 5_000);
    expect(holdOffs.until('groq/llama')).toBeUndefined();
    holdOffs.start('groq/llama', hint(8_000));
    expect(holdOffs.until(FLEX)).toBe(T + 8_000);
    expect(holdOffs.askedUntil(FLEX)).toBe(T + 8_000);
    now = T + 8_000;
    expect(holdOffs.until(FLEX)).toBeUndefined();
  });

  it("tells a flex request held off by a long hint the end the provider asked for, whichever key it was on", () => {
    const holdOffs = new HoldOffs(new MemoryStore(), () => T, () => 0);
    holdOffs.start(FLEX, hint(120_000));
    expect(holdOffs.until(FLEX)).toBe(T + 60_000);
    expect(holdOffs.askedUntil(FLEX)).toBe(T + 120_000);
    expect(holdOffs.askedUntil('groq/llama')).toBeUndefined();
  });

  it('names the target and the tier to the operator, not the tier key', () => {
    const starts: unknown[] = [];
    const holdOffs = new HoldOffs(new MemoryStore(), () => T, () => 0, (h) => starts.push(h));
    holdOffs.start(FLEX, hint(5_000), { reason: 'status_498', status: 498 });
    expect(starts).toEqual([{ kind: 'hold-off', target: 'groq/llama', tier: 'flex', untilMs: T + 5_000, hintMs: 5_000, reason: 'status_498', status: 498 }]);
  });

  it('tells a tier key from a target key and from the side keys listeners skip', () => {
    expect(isFlexTierKey(FLEX)).toBe(true);
    expect(isFlexTierKey('groq/llama')).toBe(false);
    expect(targetOfHoldOffKey(FLEX)).toBe('groq/llama');
    expect(targetOfHoldOffKey('groq/llama')).toBe('groq/llama');
    expect(isSideKey(`${FLEX}#long`)).toBe(true);
    expect(isSideKey(FLEX)).toBe(false);
  });

  it("waits for the first read of the tier's keys for a flex request, and forgets them with the target", async () => {
    const unread = new Set([`${FLEX}#asked`]);
    const store = Object.assign(new MemoryStore(), { firstRead: (key: string) => (unread.has(key) ? Promise.resolve() : undefined) });
    const holdOffs = new HoldOffs(store, () => T, () => 0);
    expect(holdOffs.firstRead('groq/llama')).toBeUndefined();
    expect(holdOffs.firstRead(FLEX)).toBeInstanceOf(Promise);
    holdOffs.start(FLEX, hint(5_000));
    holdOffs.forget('groq/llama');
    expect(holdOffs.until(FLEX)).toBeUndefined();
  });

  it("blocks the parking lot's flex queue for the tier's hold-off, leaves the target's queue free, and follows the target's credential hold", () => {
    const now = () => T;
    const store = new MemoryStore();
    const holdOffs = new HoldOffs(store, now, () => 0);
    const board = new BreakerBoard({ store, now, random: () => 0 });
    const stateOf = targetStateOf({ holdOffs, board, breakerSettings: () => undefined, limitOf: () => 4, now });
    holdOffs.start(FLEX, hint(5_000));
    expect(stateOf(FLEX)).toEqual({ mode: 'blocked', availableAtMs: T + 5_000 });
    expect(stateOf('groq/llama')).toEqual({ mode: 'available', slots: 4 });
    // Nothing waits for a refused key: the parked flex requests go, and skip the target at once.
    holdOffs.holdCredentials('groq/llama', 60_000);
    expect(stateOf(FLEX)).toEqual({ mode: 'available', slots: Number.MAX_SAFE_INTEGER });
  });
});

describe("a credential hold's reason", () => {
  it('says a location refusal started it, to another instance that shares the store too, while its end is that refusal\'s', () => {
    let now = T;
    const store = new MemoryStore();
    const here = new HoldOffs(store, () => now, () => 0);
    const there = new HoldOffs(store, () => now, () => 0);
    here.holdCredentials('gemini/flash', 60_000, { reason: 'unsupported_country_region_territory', status: 403 });
    expect(there.credentialsHeldFor('gemini/flash')).toBe('unsupported_country_region_territory');
    // A refused key extends the hold: it is no longer the location's alone.
    now = T + 1_000;
    here.holdCredentials('gemini/flash', 60_000, { reason: 'status_401', status: 401 });
    expect(there.credentialsHeldFor('gemini/flash')).toBeUndefined();
    expect(there.credentialsHeldUntil('gemini/flash')).toBe(T + 61_000);
  });

  it('names no reason for a hold of the key or the billing, nor once the hold is over', () => {
    let now = T;
    const holdOffs = new HoldOffs(new MemoryStore(), () => now, () => 0);
    holdOffs.holdCredentials('p/m', 60_000, { reason: 'insufficient_quota', status: 429 });
    expect(holdOffs.credentialsHeldFor('p/m')).toBeUndefined();
    holdOffs.holdCredentials('q/m', 1_000, { reason: 'unsupported_country_region_territory', status: 403 });
    now = T + 1_000;
    expect(holdOffs.credentialsHeldFor('q/m')).toBeUndefined();
  });
});
