// Mutants of 2026-12-04's changes that the other tests let live: the wait a retry expects for the retry cap
// (pools.maxConcurrentRetries), counted from the retries ahead of it as the pool serves them (its client's own and of
// each other client's at most as many again and one, higher classes' all, a cap's worth per round of a slot's hold),
// and the mock's and the CLI's parts. On the fake clock the pool's injected now() reads; answers hold their slot 1 s
// (the pool's first guess, nothing timed).
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ConfigError, parseConfig } from '../src/config/load.ts';
import type { Acquired, ProviderPool, SlotRequest } from '../src/pools/provider-pool.ts';
import { slot } from './helpers/client-pool.ts';
import { track } from './helpers/floor-pool.ts';
import { rateReq, retryCapPool, retryReq } from './helpers/rate-pool.ts';

beforeEach(() => vi.useFakeTimers({ now: 0 }));
afterEach(() => vi.useRealTimers());

/** Queues `r` (its deadline far, so it waits). */
function waiting(p: ProviderPool, r: SlotRequest): void {
  void p.acquire(r);
}

/** What a newcomer's acquire comes to at once: undefined while it waits. */
async function atOnce(p: ProviderPool, r: SlotRequest): Promise<Acquired | undefined> {
  const acquired = track(p.acquire(r));
  await vi.advanceTimersByTimeAsync(0);
  return acquired.answer;
}

describe('the retries a retry expects ahead of it for the retry cap', () => {
  it('are of another client\'s at most as many again and one, not its whole queue', async () => {
    const p = retryCapPool(10, 1);
    await slot(p, retryReq({ client: 'c' }));
    for (let i = 0; i < 3; i++) waiting(p, retryReq({ client: 'b' }));
    // One of b's goes before it, then it: two rounds, 2 s, within its 2.5 s (b's whole queue: four rounds).
    expect(await atOnce(p, retryReq({ client: 'a', deadlineAtMs: Date.now() + 2_500 }))).toBeUndefined();
    p.close();
  });

  it('are retries: its client\'s first attempts waiting for a slot take none of the cap', async () => {
    const p = retryCapPool(2, 1);
    await slot(p, rateReq({ client: 'a' }));
    await slot(p, retryReq({ client: 'c' }));
    for (let i = 0; i < 3; i++) waiting(p, rateReq({ client: 'a' }));
    // Its slot comes in two rounds (four ahead of it and itself, two slots a round), 2 s; the cap in one.
    expect(await atOnce(p, retryReq({ client: 'a', deadlineAtMs: Date.now() + 2_500 }))).toBeUndefined();
    p.close();
  });

  it('count its own class\'s waiting retries once', async () => {
    const p = retryCapPool(10, 1);
    await slot(p, retryReq({ client: 'c' }));
    waiting(p, retryReq({ client: 'a' }));
    // Its client's retry, then it: 2 s.
    expect(await atOnce(p, retryReq({ client: 'a', deadlineAtMs: Date.now() + 2_500 }))).toBeUndefined();
    p.close();
  });

  it('include every higher class\'s waiting retry: a batch retry behind two online ones is shed at once', async () => {
    const p = retryCapPool(10, 1);
    await slot(p, retryReq());
    waiting(p, retryReq());
    waiting(p, retryReq());
    // Three rounds of the cap (3 s) before its turn; its slot alone would come in one.
    expect(await atOnce(p, retryReq({ cls: 1, deadlineAtMs: Date.now() + 2_500 }))).toMatchObject({ ok: false, reason: 'deadline' });
    p.close();
  });

  it('fill a round a cap\'s worth at a time, a part round counting whole', async () => {
    const p = retryCapPool(10, 2);
    await slot(p, retryReq());
    await slot(p, retryReq());
    waiting(p, retryReq());
    // Both in flight end and the one waiting and it go: one round, 1 s.
    expect(await atOnce(p, retryReq({ deadlineAtMs: Date.now() + 1_500 }))).toBeUndefined();
    // Now two wait ahead: the third of the round after, 2 s (half a round is a whole one).
    expect(await atOnce(p, retryReq({ deadlineAtMs: Date.now() + 1_500 }))).toMatchObject({ ok: false, reason: 'deadline' });
    p.close();
  });
});

describe('the variables a config error names as client keys (auth.keys)', () => {
  /** The ConfigError of a config text, with no variable set. */
  const errorOf = (auth: string): ConfigError => {
    const text = ['providers:', '  p:', '    family: openai', '    baseUrl: http://127.0.0.1:1/v1', '    apiKey: "${MUT15_PROVIDER_KEY}"', 'routes:', '  - name: chat', '    match: { path: /v1/chat/completions }', '    targets: [{ provider: p }]', auth].join('\n');
    try {
      parseConfig(text, 'gw.yaml', {});
    } catch (err) {
      if (err instanceof ConfigError) return err;
      throw err;
    }
    throw new Error('parsed');
  };

  it('are those of auth.keys alone: a client\'s limit elsewhere under auth is no client key', () => {
    const err = errorOf('auth:\n  keys:\n    team: "${MUT15_TEAM_KEY}"\n  limits:\n    team: { requestsPerMinute: "${MUT15_TEAM_RPM}" }');
    expect([...err.missingEnv].sort()).toEqual(['MUT15_PROVIDER_KEY', 'MUT15_TEAM_KEY', 'MUT15_TEAM_RPM']);
    expect(err.clientKeyEnv).toEqual(['MUT15_TEAM_KEY']);
  });

  it('leave out a variable that a provider\'s key reads as well', () => {
    const err = errorOf('auth:\n  keys:\n    team: "${MUT15_PROVIDER_KEY}"');
    expect(err.missingEnv).toEqual(['MUT15_PROVIDER_KEY']);
    expect(err.clientKeyEnv).toEqual([]);
  });
});
