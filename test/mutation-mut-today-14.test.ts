// Mutation tests for the day's changes (QA rev14): the wait estimate of a request its target's rate holds while slots
// are free (src/pools/provider-pool.ts #expectedWait: every slot it needs must be free, the pool's, its target's and its
// class's, and a lower class's quota hold still holds it; the token rate's shed names pools.tokenBurst), GET /v1/models
// beside a disabled provider (src/routing/models-list.ts: a bug, the model that answers a route whose every target names
// its own was the disabled first target's), and the mock's Anthropic-shaped listing. Each test kills a mutant the suites
// of the day let live; pool tests run on a fake clock (a round trip is 1 s until one is timed).
import OpenAI from 'openai';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { rateOf } from '../src/policy/client-rate.ts';
import { targetRates } from '../src/policy/target-rate.ts';
import { ProviderPool, type Acquired, type SlotRequest } from '../src/pools/provider-pool.ts';
import { RATE_CLASSES, ratePool, rateReq } from './helpers/rate-pool.ts';
import { startMock } from '../src/mock/server.ts';
import { TEST_KEY, useStacks } from './helpers/stack.ts';

const pool = ratePool;
const req = rateReq;

/** Asks for a slot and notes when (fake ms) the answer came, granted or shed. */
async function answeredAt(p: ProviderPool, r: SlotRequest): Promise<{ acquired: Acquired; atMs: number }> {
  const pending = p.acquire(r).then((acquired) => ({ acquired, atMs: Date.now() }));
  await vi.advanceTimersByTimeAsync(5_000);
  return pending;
}

/** Takes `n` slots of the class on the target and keeps them. */
async function hold(p: ProviderPool, n: number, extra: Partial<SlotRequest> = {}) {
  const slots = [];
  for (let i = 0; i < n; i++) {
    const a = await p.acquire(req(extra));
    if (!a.ok) throw new Error('no slot');
    slots.push(a.slot);
  }
  return slots;
}

// 120 a minute: once its burst is spent, the next turn is 500 ms away. A request with 800 ms to live (100 ms for an
// attempt) can wait for that turn, not for a slot's round trip (1 s).
const SHORT = { deadlineAtMs: 800, minAttemptMs: 100 };

describe('a request its rate holds, with every slot it needs free, waits for its turn (fake clock)', () => {
  beforeEach(() => vi.useFakeTimers({ now: 0 }));
  afterEach(() => vi.useRealTimers());

  it('when its target has exactly one slot free (maxConcurrent 1): not shed for a round trip', async () => {
    const p = pool({ requests: rateOf(120, 1) }, 1);
    (await hold(p, 1))[0]!.release();
    expect(await answeredAt(p, req(SHORT))).toMatchObject({ acquired: { ok: true }, atMs: 500 });
    p.close();
  });

  it("is shed at once when another target holds the provider's every slot: the pool's slots hold it too", async () => {
    const p = pool({ requests: rateOf(120, 1) }, 1);
    (await hold(p, 1))[0]!.release();
    await hold(p, 1, { target: 'p/b' });
    // Not queued to be shed at its last chance (700 ms), told 500 ms.
    expect(await answeredAt(p, req(SHORT))).toEqual({ acquired: { ok: false, reason: 'deadline', retryAfterMs: 1_000 }, atMs: 0 });
    p.close();
  });

  it("is shed at once when 429s cut its target's limit to what is in flight, though the pool has room", async () => {
    const p = pool({ requests: rateOf(120, 4) }, 4);
    const slots = await hold(p, 4);
    // Clamped to one below the 4 in flight: 3 of 4 slots, all taken once one comes back.
    p.observe('p/a', 'rate-limited', 1_000);
    slots[0]!.release();
    expect(p.limitOf('p/a')).toBe(3);
    expect(await answeredAt(p, req(SHORT))).toMatchObject({ acquired: { ok: false, reason: 'deadline' }, atMs: 0 });
    p.close();
  });

  it("is shed at once when its class's cap (cut by 429s) is what is in flight, though its target has room", async () => {
    const p = pool({ requests: rateOf(120, 4) }, 4);
    const slots = await hold(p, 4, { cls: 1 });
    p.observe('p/a', 'rate-limited', 1_000);
    slots[0]!.release();
    slots[1]!.release();
    expect(await answeredAt(p, req({ ...SHORT, cls: 1 }))).toMatchObject({ acquired: { ok: false, reason: 'deadline' }, atMs: 0 });
    p.close();
  });

  it("counts its own class's slots against the class's cap, not the higher classes' (waits with one of its class's free)", async () => {
    // Batch's cap cut to 2 (a 429 with its 4 in flight, in a pool of 5); one of them left, beside two online.
    const p = pool({ requests: rateOf(120, 6) }, 5);
    const batch = await hold(p, 4, { cls: 1 });
    p.observe('p/a', 'rate-limited', 1_000);
    for (const s of batch.slice(1)) s.release();
    await hold(p, 2);
    expect(await answeredAt(p, req({ ...SHORT, cls: 1 }))).toMatchObject({ acquired: { ok: true }, atMs: 500 });
    p.close();
  });

  it("is shed at once while a lower class is held for its target's quota: the hold, not its rate's turn, holds it", async () => {
    const p = pool({ requests: rateOf(120, 1) });
    (await hold(p, 1, { cls: 1 }))[0]!.release();
    p.holdLowerClasses('p/a', 5_000);
    expect(await answeredAt(p, req({ cls: 1, deadlineAtMs: 3_000, minAttemptMs: 100 }))).toEqual({ acquired: { ok: false, reason: 'deadline', retryAfterMs: 5_000 }, atMs: 0 });
    p.close();
  });

  it("waits only for its rate's turn while the lower classes' hold is for higher classes (online is not held)", async () => {
    const p = pool({ requests: rateOf(120, 1) });
    (await hold(p, 1))[0]!.release();
    p.holdLowerClasses('p/a', 5_000);
    expect(await answeredAt(p, req(SHORT))).toMatchObject({ acquired: { ok: true }, atMs: 500 });
    p.close();
  });

  it("waits for a lower class's quota hold to end, not a round trip, when it ends first (slots free, answers slow)", async () => {
    const p = pool({ requests: rateOf(120, 1) });
    // Answers of 5 s each time the round trip the estimate uses.
    for (let i = 0; i < 12; i++) {
      const [slot] = await hold(p, 1);
      slot!.answered();
      await vi.advanceTimersByTimeAsync(5_000);
      slot!.release();
    }
    (await hold(p, 1, { cls: 1 }))[0]!.release();
    const t0 = Date.now();
    p.holdLowerClasses('p/a', t0 + 2_000);
    const { acquired, atMs } = await answeredAt(p, req({ cls: 1, deadlineAtMs: t0 + 3_000, minAttemptMs: 100 }));
    expect(acquired.ok).toBe(true);
    // The hold's wake-up comes a millisecond after it ends.
    expect(atMs - t0).toBeGreaterThanOrEqual(2_000);
    expect(atMs - t0).toBeLessThan(2_100);
    p.close();
  });

  it('is told a round trip, not 0, when no rate holds it but the retry cap does', async () => {
    const p = new ProviderPool({ provider: 'p', capacity: 50, retryCapacity: 1, classes: RATE_CLASSES, decrease: 0.9, minLimit: 1, rates: { requests: rateOf(6_000, 100) } }, () => Date.now());
    await hold(p, 1, { retry: true });
    expect(await answeredAt(p, req({ ...SHORT, retry: true }))).toEqual({ acquired: { ok: false, reason: 'deadline', retryAfterMs: 1_000 }, atMs: 0 });
    p.close();
  });
});

describe("a token rate's shed names pools.tokenBurst only when one under a minute's worth holds it", () => {
  it('not for the default burst of a rate that is not a whole number (a minute\'s worth, rounded down)', () => {
    const p = pool(targetRates({ tokensPerMinute: 1000.5 }));
    expect(p.rateShedWhy('token_rate', 'online')).toBe("provider p's token rate (1000.5/min, pools.tokensPerMinute) leaves no turn for class online before the request's deadline");
    p.close();
  });
});

describe('GET /v1/models beside a disabled provider', () => {
  const startStack = useStacks();
  const messages = [{ role: 'user' as const, content: 'hi' }];

  it("lists the model that answers a route whose every target names its own, when the first target's provider is disabled", async () => {
    // A cloud-first route whose first provider has no key: every name is answered by the backup's model, so that one is
    // listed (owned by its provider), not the disabled first target's.
    const stack = await startStack({
      config: (url) => ({
        server: { host: '127.0.0.1', port: 0 },
        providers: {
          spare: { family: 'openai', baseUrl: `${url}/v1`, apiKey: '', optional: true },
          openai: { family: 'openai', baseUrl: `${url}/v1`, apiKey: TEST_KEY },
        },
        routes: [
          { name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'spare', model: 'spare-llama' }, { provider: 'openai', model: 'gpt-4o-mini' }] },
          // The disabled target would pass the client's name on; skipped, every name goes to gpt-4.1.
          { name: 'completions', match: { path: '/v1/completions' }, targets: [{ provider: 'spare' }, { provider: 'openai', model: 'gpt-4.1' }] },
        ],
      }),
    });
    const client = new OpenAI({ baseURL: stack.baseURL, apiKey: 'unused', maxRetries: 0 });
    const ids: string[] = [];
    for await (const m of client.models.list()) ids.push(m.id);
    expect(ids).toEqual(['gpt-4o-mini', 'gpt-4.1']);
    expect(await client.models.retrieve('gpt-4o-mini')).toMatchObject({ owned_by: 'openai' });
    expect((await client.chat.completions.create({ model: 'gpt-4o-mini', messages })).model).toMatch(/^gpt-4o-mini/);
    expect((await client.completions.create({ model: 'gpt-4.1', prompt: 'hi', max_tokens: 5 })).model).toMatch(/^gpt-4\.1/);
    await expect(client.models.retrieve('spare-llama')).rejects.toBeInstanceOf(OpenAI.NotFoundError);
  });
});

describe("the mock's GET /v1/models asked as Anthropic's API is", () => {
  it('names the first and last model of its page (first_id, last_id), as Anthropic does', async () => {
    const mock = await startMock();
    try {
      const res = await fetch(`${mock.url}/v1/models`, { headers: { 'x-api-key': TEST_KEY, 'anthropic-version': '2023-06-01' } });
      const page = (await res.json()) as { data: Array<{ id: string }>; first_id: string; last_id: string; has_more: boolean };
      expect(page).toMatchObject({ first_id: page.data[0]!.id, last_id: page.data.at(-1)!.id, has_more: false });
      expect(page.first_id).not.toBe(page.last_id);
    } finally {
      await mock.close();
    }
  });
});
