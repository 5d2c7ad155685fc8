// What a request held off is told, on both sides of the 60 s line the SDKs draw (they ignore longer hints): a
// hold-off the provider asked for within a minute ends within it, spread included, and invites the SDK back; a longer
// one (capped at a minute for the gateway) tells every client what the provider asked for, never with an invitation.
import { describe, expect, it } from 'vitest';
import { useStacks, type Stack } from './helpers/stack.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import { HoldOffs, MAX_HOLD_OFF_MS } from '../src/state/hold-offs.ts';
import type { WaitHint } from '../src/policy/wait-hint.ts';

const start = useStacks();
/** The largest spread there is: a hold-off of a minute is pushed as far past it as it can be. */
const HIGHEST = () => 0.999_999;
const T = 1_700_000_000_000;
const hint = (delayMs: number): WaitHint => ({ delayMs, source: 'retry-after', fleetWide: true });

async function chat(s: Stack) {
  const res = await fetch(`${s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
  });
  const body = (await res.json()) as { error?: { code: string; message: string } };
  return { status: res.status, code: body.error?.code, message: body.error?.message ?? '', retryAfter: res.headers.get('retry-after'), shouldRetry: res.headers.get('x-should-retry') };
}

/** A gateway whose provider answers the first request 429 with this retry-after; no retries, no parking. */
function heldOffBy(retryAfter: string) {
  return start({
    faults: { errors: [{ status: 429, rate: 1, times: 1, headers: { 'retry-after': retryAfter } }] },
    route: { retry: { maxAttempts: 1 }, park: false },
    provider: { breaker: false },
    deps: { random: HIGHEST },
  });
}

describe('HoldOffs.start and askedUntil', () => {
  it('ends a hold-off the provider asked for within a minute within that minute, however large the spread', () => {
    const holdOffs = new HoldOffs(new MemoryStore(), () => T, HIGHEST);
    expect(holdOffs.start('p/m', hint(MAX_HOLD_OFF_MS))).toBe(T + MAX_HOLD_OFF_MS);
    expect(holdOffs.askedUntil('p/m')).toBe(T + MAX_HOLD_OFF_MS);
    // Short of the minute, the spread still applies, up to the minute.
    const other = new HoldOffs(new MemoryStore(), () => T, HIGHEST);
    expect(other.start('p/m', hint(30_000))).toBe(T + 31_000);
    expect(other.start('p/n', hint(59_500))).toBe(T + MAX_HOLD_OFF_MS);
  });

  it('caps a longer hold-off at a minute plus the spread and keeps the end the provider asked for', () => {
    const holdOffs = new HoldOffs(new MemoryStore(), () => T, HIGHEST);
    expect(holdOffs.start('p/m', hint(86_400_000))).toBe(T + 61_000);
    expect(holdOffs.until('p/m')).toBe(T + 61_000);
    expect(holdOffs.askedUntil('p/m')).toBe(T + 86_400_000);
  });

  it('forgets what a long hint asked for once a shorter one has replaced its hold-off', () => {
    let now = T;
    const holdOffs = new HoldOffs(new MemoryStore(), () => now, HIGHEST);
    holdOffs.start('p/m', hint(3_600_000));
    now += 62_000; // the hold-off is over: one request asked again, and was told 5 s
    expect(holdOffs.askedUntil('p/m')).toBeUndefined();
    expect(holdOffs.start('p/m', hint(5_000))).toBe(now + 5_500);
    expect(holdOffs.askedUntil('p/m')).toBe(now + 5_500);
  });

  it('keeps a long ask while a shorter hint leaves its hold-off as it was', () => {
    const holdOffs = new HoldOffs(new MemoryStore(), () => T, HIGHEST);
    holdOffs.start('p/m', hint(3_600_000));
    holdOffs.start('p/m', hint(2_000));
    expect(holdOffs.askedUntil('p/m')).toBe(T + 3_600_000);
  });
});

describe('provider_held_off on both sides of 60 s', () => {
  it('retry-after: 60 -> the next client gets retry-after 60 and x-should-retry: true (the spread stays inside the minute)', async () => {
    const s = await heldOffBy('60');
    const first = await chat(s);
    expect(first).toMatchObject({ status: 429, retryAfter: '60', shouldRetry: 'false' });
    const next = await chat(s);
    expect(next).toMatchObject({ status: 429, code: 'provider_held_off', retryAfter: '60', shouldRetry: 'true' });
    expect(s.mock.stats().total).toBe(1);
  });

  it('retry-after: 61 -> the next client gets retry-after 61 and x-should-retry: false', async () => {
    const s = await heldOffBy('61');
    expect(await chat(s)).toMatchObject({ status: 429, retryAfter: '61', shouldRetry: 'false' });
    expect(await chat(s)).toMatchObject({ status: 429, code: 'provider_held_off', retryAfter: '61', shouldRetry: 'false' });
    expect(s.mock.stats().total).toBe(1);
  });

  it('retry-after: 999999 -> every client is told the provider\'s wait (capped at a day), never invited back', async () => {
    const s = await heldOffBy('999999');
    expect(await chat(s)).toMatchObject({ status: 429, retryAfter: '86400', shouldRetry: 'false' });
    const next = await chat(s);
    expect(next).toMatchObject({ status: 429, code: 'provider_held_off', shouldRetry: 'false' });
    expect(Number(next.retryAfter)).toBeGreaterThanOrEqual(86_398);
    expect(Number(next.retryAfter)).toBeLessThanOrEqual(86_400);
    // The gateway itself asks again after a minute (plus the spread).
    expect(next.message).toMatch(/the gateway asks it again in 6[01] s/);
    expect(s.mock.stats().total).toBe(1);
  });
});

describe('retriesStopped when the target is held back after one attempt', () => {
  /** The request log lines of route chat. */
  const chatLines = (s: Stack) => s.logs.map((l) => JSON.parse(l) as Record<string, any>).filter((l) => l.route === 'chat');
  const settled = async (s: Stack, n: number) => {
    for (let i = 0; i < 100 && chatLines(s).length < n; i++) await new Promise((r) => setTimeout(r, 10));
    return chatLines(s);
  };

  it("says held_off, not retries_exhausted, for a retry that found another request's longer hold-off", async () => {
    // Two requests in flight together: one is told to come back in 1 s, the other in 30 s (past maxWaitHintMs, 20 s).
    // The first one's retry finds the target held off for the 30 s and the request ends after its only attempt.
    const s = await start({
      faults: {
        latencyMs: 200,
        errors: [
          { status: 429, times: 1, headers: { 'retry-after': '1' } },
          { status: 429, times: 1, headers: { 'retry-after': '30' } },
        ],
      },
      provider: { breaker: false },
    });
    await Promise.all([chat(s), chat(s)]);
    const lines = await settled(s, 2);
    expect(s.mock.stats().total).toBe(2);
    expect(lines.map((l) => l.attempts.length)).toEqual([1, 1]);
    expect(lines.map((l) => l.retriesStopped).sort()).toEqual(['held_off', 'wait_hint']);
  });

  it('says breaker_open, not retries_exhausted, for a retry the breaker its failure opened stopped', async () => {
    const s = await start({ faults: { errors: [{ status: 503 }] }, route: { park: false }, provider: { breaker: { consecutiveFailures: 1 } } });
    expect((await chat(s)).status).toBe(503);
    const [line] = await settled(s, 1);
    expect(line!.attempts).toHaveLength(1);
    expect(line!.retriesStopped).toBe('breaker_open');
  });
});
