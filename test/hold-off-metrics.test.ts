// Hold-offs as the on-call sees them: stormgate_holds_started_total counts each hold (a provider's pause, a flex tier's,
// a refused key's) once when it starts, fleet-wide once, and stormgate_hold_remaining_seconds shows the seconds left
// of each hold the instance knows of at scrape time. Clocks and draws are injected where the numbers must be exact;
// the end-to-end case goes through the openai SDK and the bundled mock with real time and generous bounds.
import OpenAI from 'openai';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import type { WaitHint } from '../src/policy/wait-hint.ts';
import { flexTierKey, HoldOffs, type HoldStart } from '../src/state/hold-offs.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import type { StateStore } from '../src/state/store.ts';
import { RedisStore } from '../src/state/redis-store.ts';
import type { ServerDeps } from '../src/server.ts';
import { useRedisServer } from './helpers/redis-server.ts';
import { eventually } from './helpers/redis-stores.ts';
import { TEST_KEY, useStacks, type Stack } from './helpers/stack.ts';

const T = 1_700_000_000_000;
const hint = (delayMs: number): WaitHint => ({ delayMs, source: 'retry-after', fleetWide: true });
/** Lets the store's answer to a write reach the listeners (a memory store answers at once). */
const settled = () => new Promise((resolve) => setImmediate(resolve));

/** A HoldOffs whose starts (the log line's) and fleet starts (the counter's) are recorded. */
function recorded(store: StateStore, now: () => number) {
  const starts: HoldStart[] = [];
  const counted: HoldStart[] = [];
  const holdOffs = new HoldOffs(store, now, () => 0, (h) => starts.push(h), (h) => counted.push(h));
  return { holdOffs, starts, counted };
}

describe('the count of holds started', () => {
  it('counts a hold-off once when it starts, not for each answer that extends it, and again once it has ended', async () => {
    let now = T;
    const { holdOffs, counted } = recorded(new MemoryStore(), () => now);
    holdOffs.start('p/m', hint(5_000), { reason: 'status_429', status: 429 });
    now += 1_000;
    holdOffs.start('p/m', hint(10_000), { reason: 'status_429', status: 429 }); // the 429 storm extends it
    holdOffs.start('p/m', hint(1_000), { reason: 'status_503', status: 503 });
    await settled();
    expect(counted).toEqual([{ kind: 'hold-off', target: 'p/m', untilMs: T + 5_000, hintMs: 5_000, reason: 'status_429', status: 429 }]);
    now = T + 11_000; // over
    holdOffs.start('p/m', hint(2_000), { reason: 'status_529', status: 529 });
    await settled();
    expect(counted.map((h) => [h.reason, h.untilMs])).toEqual([
      ['status_429', T + 5_000],
      ['status_529', T + 13_000],
    ]);
  });

  it("tells a flex tier's hold-off and a credential hold apart, each counted once", async () => {
    let now = T;
    const { holdOffs, counted } = recorded(new MemoryStore(), () => now);
    holdOffs.start(flexTierKey('groq/llama'), hint(5_000), { reason: 'status_498', status: 498 });
    holdOffs.start(flexTierKey('groq/llama'), hint(6_000), { reason: 'status_498', status: 498 });
    holdOffs.holdCredentials('groq/llama', 60_000, { reason: 'status_401', status: 401 });
    now += 1_000;
    holdOffs.holdCredentials('groq/llama', 60_000, { reason: 'status_401', status: 401 }); // renewed by the next refusal
    await settled();
    expect(counted.map(({ kind, target, tier, reason }) => ({ kind, target, tier, reason }))).toEqual([
      { kind: 'hold-off', target: 'groq/llama', tier: 'flex', reason: 'status_498' },
      { kind: 'credentials', target: 'groq/llama', tier: undefined, reason: 'status_401' },
    ]);
    // The target's own hold-off is another hold: the flex tier's does not stand for it.
    holdOffs.start('groq/llama', hint(5_000), { reason: 'status_429', status: 429 });
    await settled();
    expect(counted).toHaveLength(3);
  });

  it('counts a hold this instance heard of from the store as none of its own (another instance started it)', async () => {
    const store = new MemoryStore();
    const here = recorded(store, () => T);
    const there = recorded(store, () => T);
    there.holdOffs.start('p/m', hint(5_000), { reason: 'status_429', status: 429 });
    here.holdOffs.start('p/m', hint(8_000), { reason: 'status_429', status: 429 });
    await settled();
    expect([there.counted.length, here.counted.length]).toEqual([1, 0]);
  });
});

describe('the count of holds started, across a fleet on Redis', () => {
  const redis = useRedisServer();

  async function fleetOf(n: number): Promise<RedisStore[]> {
    const keyPrefix = `holdmetric-${process.pid}-${Math.random().toString(36).slice(2)}`;
    const stores = Array.from({ length: n }, () => new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 500, keyPrefix } }));
    for (const s of stores) expect(await s.ready()).toBe(true);
    return stores;
  }

  it('tells only the first of two instances whose answers start the same hold-off at once that it started it', async () => {
    const stores = await fleetOf(2);
    try {
      const now = Date.now();
      // Neither has heard of the other's yet: both write the line, one counts.
      const [a, b] = stores.map((s) => recorded(s, () => now));
      a!.holdOffs.start('p/m', hint(5_000), { reason: 'status_429', status: 429 });
      b!.holdOffs.start('p/m', hint(6_000), { reason: 'status_429', status: 429 });
      expect([a!.starts.length, b!.starts.length]).toEqual([1, 1]);
      await eventually(() => a!.counted.length + b!.counted.length > 0, 5_000);
      await sleep(200);
      expect(a!.counted.length + b!.counted.length).toBe(1);
    } finally {
      await Promise.all(stores.map((s) => s.close()));
    }
  });

  it('answers a write that started the hold-off true, one that extended it false, and one after its end true again', async () => {
    const [store] = await fleetOf(1);
    try {
      const now = Date.now();
      expect(await store!.setHoldOff('p/m', now + 1_000, now)).toBe(true);
      expect(await store!.setHoldOff('p/m', now + 2_000, now + 500)).toBe(false);
      expect(await store!.setHoldOff('p/m', now + 1_500, now + 500)).toBe(false); // shorter: nothing written
      // The ended hold-off's key stays for its grace: still a new start.
      expect(await store!.setHoldOff('p/m', now + 9_000, now + 3_000)).toBe(true);
    } finally {
      await store!.close();
    }
  });
});

// ---- over HTTP -------------------------------------------------------------------------------------------------

const start = useStacks();

function sampleOf(text: string, name: string, labels: Record<string, string>): number | undefined {
  const want = Object.entries(labels);
  for (const line of text.split('\n')) {
    const m = /^(\w+)\{([^}]*)\} (\S+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const got = Object.fromEntries([...m[2]!.matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
    if (Object.keys(got).length === want.length && want.every(([k, v]) => got[k] === v)) return Number(m[3]);
  }
  return undefined;
}

async function scrape(s: Stack): Promise<string> {
  return (await fetch(`${s.url}/metrics`)).text();
}

const HELD_OFF = { target: 'mock/gpt-4o', kind: 'hold_off', tier: 'all' };
const CREDENTIALS = { target: 'mock/gpt-4o', kind: 'credentials', tier: 'all' };

/** A gateway whose provider answers its first request 429 with this retry-after; no retries, no parking. */
function heldOffBy(retryAfter: string, deps: ServerDeps = {}) {
  return start({
    faults: { errors: [{ status: 429, rate: 1, times: 1, headers: { 'retry-after': retryAfter } }] },
    route: { retry: { maxAttempts: 1 }, park: false },
    provider: { breaker: false },
    deps,
  });
}

describe('stormgate_hold_remaining_seconds', () => {
  it('reads 0 for a target served without any hold, for hold-offs and credential holds, with no flex series', async () => {
    const s = await start();
    const res = await fetch(`${s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    const text = await scrape(s);
    expect(sampleOf(text, 'stormgate_hold_remaining_seconds', HELD_OFF)).toBe(0);
    expect(sampleOf(text, 'stormgate_hold_remaining_seconds', CREDENTIALS)).toBe(0);
    expect(text).not.toMatch(/stormgate_hold_remaining_seconds\{[^}]*tier="flex"/);
    // The counter's series start at zero, for every reason a hold can start with.
    expect(sampleOf(text, 'stormgate_holds_started_total', { ...HELD_OFF, reason: 'status_429' })).toBe(0);
    expect(sampleOf(text, 'stormgate_holds_started_total', { ...HELD_OFF, tier: 'flex', reason: 'status_498' })).toBe(0);
    expect(sampleOf(text, 'stormgate_holds_started_total', { ...CREDENTIALS, reason: 'insufficient_quota' })).toBe(0);
  });

  it('reads the seconds left by the clock, at scrape time, and 0 once the hold-off is over', async () => {
    let now = Date.now();
    const s = await heldOffBy('10', { now: () => now, random: () => 0 });
    const res = await fetch(`${s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(res.status).toBe(429);
    await res.arrayBuffer();
    expect(sampleOf(await scrape(s), 'stormgate_hold_remaining_seconds', HELD_OFF)).toBe(10);
    now += 3_500;
    expect(sampleOf(await scrape(s), 'stormgate_hold_remaining_seconds', HELD_OFF)).toBe(6.5);
    now += 6_500;
    const text = await scrape(s);
    expect(sampleOf(text, 'stormgate_hold_remaining_seconds', HELD_OFF)).toBe(0);
    expect(sampleOf(text, 'stormgate_holds_started_total', { ...HELD_OFF, reason: 'status_429' })).toBe(1);
  });

  it('shows a credential hold beside the hold-offs, counted under credentials with its reason', async () => {
    let now = Date.now();
    const s = await start({
      faults: { errors: [{ status: 401, code: 'invalid_api_key' }] },
      provider: { authHoldS: 30, breaker: false },
      route: { park: false },
      deps: { now: () => now },
    });
    const res = await fetch(`${s.baseURL}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    });
    await res.arrayBuffer();
    let text = await scrape(s);
    expect(sampleOf(text, 'stormgate_hold_remaining_seconds', CREDENTIALS)).toBe(30);
    expect(sampleOf(text, 'stormgate_hold_remaining_seconds', HELD_OFF)).toBe(0);
    expect(sampleOf(text, 'stormgate_holds_started_total', { ...CREDENTIALS, reason: 'status_401' })).toBe(1);
    now += 30_000;
    text = await scrape(s);
    expect(sampleOf(text, 'stormgate_hold_remaining_seconds', CREDENTIALS)).toBe(0);
  });
});

describe('a provider that asks for a pause, through the openai SDK', () => {
  it('counts the hold-off once, shows its seconds left while it lasts, and 0 once it is over', async () => {
    const s = await heldOffBy('3');
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: TEST_KEY, maxRetries: 0 });
    const ask = () => client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    const first = await ask().catch((e: unknown) => e);
    expect(first).toBeInstanceOf(OpenAI.RateLimitError);
    // Held off: the next request is turned away without going upstream, and extends nothing.
    const second = await ask().catch((e: unknown) => e);
    expect(second).toBeInstanceOf(OpenAI.RateLimitError);
    expect((second as InstanceType<typeof OpenAI.RateLimitError>).code).toBe('provider_held_off');
    const during = await scrape(s);
    expect(sampleOf(during, 'stormgate_holds_started_total', { ...HELD_OFF, reason: 'status_429' })).toBe(1);
    const left = sampleOf(during, 'stormgate_hold_remaining_seconds', HELD_OFF)!;
    expect(left).toBeGreaterThan(0);
    expect(left).toBeLessThanOrEqual(3.3);
    await expect.poll(async () => sampleOf(await scrape(s), 'stormgate_hold_remaining_seconds', HELD_OFF), { timeout: 10_000, interval: 200 }).toBe(0);
    // The provider is back: answered, and the hold-off was counted once.
    expect((await ask()).choices[0]?.message).toBeDefined();
    expect(sampleOf(await scrape(s), 'stormgate_holds_started_total', { ...HELD_OFF, reason: 'status_429' })).toBe(1);
  });
});
