// Mutation round 43 on the day's changes: policy/hold-off-wait.ts, serve-targets.ts's wait for a request's own
// hold-off, a class's maxShare in the pool (and its wait estimate), the live stream's held-back error event, the
// `raised` reading of an error field, and the client key taken out of the query. A test for each mutant the existing
// tests let live that a user could see.
import { beforeEach, describe, expect, it, vi } from 'vitest';
import { withoutKeyInQuery } from '../src/http/client-auth.ts';
import { serveTargets, type ServeDeps } from '../src/pipeline/serve-targets.ts';
import { newRun, type RequestContext } from '../src/pipeline/target-attempts.ts';
import { rateOf } from '../src/policy/client-rate.ts';
import { ProviderPool, type SlotRequest } from '../src/pools/provider-pool.ts';
import { streamedText } from './helpers/chat-stream.ts';
import { cc, delta, recoveringToNext, useScriptedGateway, type Script } from './helpers/scripted-provider.ts';
import { scriptedAnswers, scriptedPlan } from './helpers/scripted-serve.ts';

// serve-targets.ts alone, for the tests that set `script.on`: tryTarget answers from a script, noting the clock and the
// run it was called with; nothing holds a target once the lot's wait ran out (heldBack). Otherwise the real code runs.
const script = vi.hoisted(() => ({
  on: false,
  answers: new Map<string, unknown[]>(),
  calls: [] as Array<{ key: string; atMs: number; waitMs: number; retryPaid: boolean }>,
  clock: { now: 0 },
}));
vi.mock('../src/pipeline/target-attempts.ts', async (importOriginal) => {
  const real = await importOriginal<typeof import('../src/pipeline/target-attempts.ts')>();
  return {
    ...real,
    heldBack: (...args: Parameters<typeof real.heldBack>) => (script.on ? undefined : real.heldBack(...args)),
    tryTarget: async (...args: Parameters<typeof real.tryTarget>) => {
      if (!script.on) return real.tryTarget(...args);
      const [, plan, run] = args as unknown as [RequestContext, { key: string }, ReturnType<typeof newRun>];
      script.calls.push({ key: plan.key, atMs: script.clock.now, waitMs: run.waitMs, retryPaid: run.retryPaid });
      const next = script.answers.get(plan.key)?.shift();
      if (next === undefined) throw new Error(`no answer scripted for ${plan.key}`);
      return next as never;
    },
  };
});

const startRecovering = useScriptedGateway(recoveringToNext());
/** The primary's key, long enough to be taken out of what the provider quotes of it (key-echo.ts). */
const P_KEY = 'sk-proj-primary-0123456789abcdefghij';
const startRecoveringKeyed = useScriptedGateway((c, origin) => {
  recoveringToNext()(c, origin);
  c.providers.p!.apiKey = P_KEY;
});

const flush = () => new Promise((r) => setImmediate(r));
const req = (cls: number): SlotRequest => ({ cls, target: 'p/m', retry: false, deadlineAtMs: 60_000, minAttemptMs: 0, signal: new AbortController().signal });

describe("a class's maxShare of 1 (the config's default)", () => {
  /** Half a 10-slot fleet pool is this instance's, the rest of the fleet idle: its 5 slots held, `queued` more waiting. */
  async function fleetWait(maxShare: number | undefined, queued: number): Promise<number> {
    const p = new ProviderPool(
      { provider: 'p', capacity: 10, retryCapacity: 10, classes: [{ name: 'online', minShare: 0, maxQueue: 100, ...(maxShare !== undefined && { maxShare }) }], decrease: 0.9, minLimit: 1 },
      () => 0,
    );
    p.setShare(0.5, 0);
    for (let i = 0; i < 5 + queued; i++) void p.acquire(req(0));
    await flush();
    return p.expectedWaitMs(0, 'p/m');
  }

  it('bounds nothing: in a fleet, the wait estimate counts the turns the instance may grow to, as with no maxShare', async () => {
    // Nine queued ahead of it: with the idle fleet's 10 slots in reach, its turn is one round trip away; bounded by
    // this instance's 5 as if they were a class's share, two, and the one wait rule shed requests that had time.
    const none = await fleetWait(undefined, 9);
    expect(none).toBeGreaterThan(0);
    expect(await fleetWait(1, 9)).toBe(none);
  });
});

describe("a class its maxShare holds back, under its target's request rate (pools.requestsPerMinute)", () => {
  /** batch holds both slots of its 0.2 share of 10, its target's rate (if any) spent by them: its next request's wait. */
  async function heldBackWait(rates: ConstructorParameters<typeof ProviderPool>[0]['rates']): Promise<number> {
    vi.useFakeTimers({ now: 0 });
    try {
      const p = new ProviderPool(
        { provider: 'p', capacity: 10, retryCapacity: 10, classes: [{ name: 'online', minShare: 0, maxQueue: 10 }, { name: 'batch', minShare: 0, maxShare: 0.2, maxQueue: 10 }], decrease: 0.9, minLimit: 1, rates },
        () => Date.now(),
      );
      const held = [p.acquire(req(1)), p.acquire(req(1))];
      await vi.advanceTimersByTimeAsync(100);
      expect((await Promise.all(held)).every((a) => a.ok)).toBe(true);
      const ms = p.expectedWaitMs(1, 'p/m');
      p.close();
      return ms;
    } finally {
      vi.useRealTimers();
    }
  }

  it('waits for a slot of its share, not only for its turn of the rate: eight idle slots are not its', async () => {
    // A turn of the rate 100 ms away, but no slot of batch's comes before a round trip: estimated by the idle pool's
    // free slots, the wait was the rate's alone, and the retry-after told sent the client back into the same refusal.
    const bySlot = await heldBackWait(undefined);
    expect(bySlot).toBeGreaterThan(0);
    expect(await heldBackWait({ requests: rateOf(600, 1) })).toBe(bySlot);
  });
});

describe('a request waiting out the hold-off its own 429 started, no other target answering (serve-targets.ts waitOutOwnHoldOff)', () => {
  const clock = script.clock;
  const { failed503, ok } = scriptedAnswers(clock);
  beforeEach(() => {
    script.on = true;
    clock.now = 1_000_000;
    script.answers.clear();
    script.calls.length = 0;
    return () => {
      script.on = false;
      script.answers.clear();
    };
  });

  /** Serves one request on targets a (primary) and b with parking off; sleeps move the clock. */
  async function serve() {
    const sleeps: number[] = [];
    const budget = { counted: 0, taken: 0 };
    const ctx = {
      route: { name: 'chat', config: { minAttemptMs: 100, budget: {} } },
      deadlineAtMs: clock.now + 30_000,
      signal: new AbortController().signal,
      skipped: [],
      attempts: [],
      parkable: true,
    } as unknown as RequestContext;
    const deps = {
      now: () => clock.now,
      sleep: async (ms: number) => {
        sleeps.push(ms);
        clock.now += ms;
      },
      lot: { waiting: () => 0, park: async () => ({ kind: 'timeout' }) },
      guards: {
        holdOffs: { credentialsHeldFor: () => undefined },
        budget: {
          countRetry: async () => void budget.counted++,
          tryRetry: async () => (budget.taken++, true),
        },
      },
    } as unknown as ServeDeps;
    const served = await serveTargets(ctx, ['a', 'b'].map(scriptedPlan), undefined, false, deps);
    return { served, sleeps, budget };
  }

  it('pays for its one retry once when the first wait found the hold-off not quite over: the budget counts one retry, not two', async () => {
    // a's 429 starts a 3 s hold-off (its own); b fails; after the wait, a still reads that same hold-off (its end read
    // a millisecond late): the request waits again, then is answered.
    const endsAt = clock.now + 3_000;
    script.answers.set('a', [
      { kind: 'unavailable', reason: 'hold-off', availableAtMs: endsAt, own: true },
      { kind: 'unavailable', reason: 'hold-off', availableAtMs: endsAt },
      ok,
    ]);
    script.answers.set('b', [failed503]);
    const r = await serve();
    expect(r.served).toMatchObject({ kind: 'ok', plan: { key: 'a' } });
    expect(script.calls.map((c) => c.key)).toEqual(['a', 'b', 'a', 'a']);
    expect(r.sleeps).toHaveLength(2);
    // One retry went to a after its 429, paced by the hold-off: counted once in the budget, never taken from it.
    expect(r.budget).toEqual({ counted: 1, taken: 0 });
    expect(script.calls.at(-1)!.retryPaid).toBe(true);
  });
});

describe("the provider's error event after the first output, held back while streamRecovery asks the next target (live-stream.ts #holdsError)", () => {
  const overloadAfterHel: Script = {
    steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hel' })]), `data: ${JSON.stringify({ error: { message: 'The server is overloaded', type: 'server_error', code: 'server_error' } })}\n\n`],
  };
  const hello: Script = { steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hello' })]), cc([delta({}, 'stop')]), 'data: [DONE]\n\n'] };

  it("is the continuation's reason: sent as x-retry-reason stream_error and counted so, not as a cut", async () => {
    const { client, seen, s } = await startRecovering((_body, n) => (n === 1 ? overloadAfterHel : hello));
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    const { text, err } = await streamedText(stream);
    expect(err).toBeUndefined();
    expect(text).toBe('Hello');
    expect(seen).toHaveLength(2);
    expect([seen[1]!.headers['x-retry-attempt'], seen[1]!.headers['x-retry-reason']]).toEqual(['1', 'stream_error']);
    const retries = async (reason: string) =>
      (await (await fetch(`${s.url}/metrics`)).text()).split('\n').filter((l) => l.startsWith('stormgate_retry_count_total{') && l.includes(`reason="${reason}"`)).reduce((sum, l) => sum + Number(l.split(' ').at(-1)), 0);
    await expect.poll(() => retries('stream_error')).toBe(1);
    expect(await retries('stream_cut')).toBe(0);
  });

  it("reaches the client without the provider's key it quotes, when the next target cannot continue", async () => {
    const quoting: Script = {
      steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hel' })]), `data: ${JSON.stringify({ error: { message: `upstream worker failed for key ${P_KEY}`, type: 'server_error', code: 'server_error' } })}\n\n`],
    };
    const busy: Script = { status: 503, headers: { 'content-type': 'application/json' }, steps: ['{"error":{"message":"busy","type":"server_error"}}'] };
    const { client, seen } = await startRecoveringKeyed((_body, n) => (n === 1 ? quoting : busy));
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    const { text, err } = await streamedText(stream);
    expect(seen).toHaveLength(2);
    expect(text).toBe('Hel');
    expect(String(err)).toMatch(/upstream worker failed for key/);
    expect(String(err)).not.toContain(P_KEY);
  });
});

describe("the client's key repeated in the query (client-auth.ts withoutKeyInQuery)", () => {
  const KEY = 'sk-client-0123456789';

  it("is taken out though a later parameter's value holds a '?': the query starts at the first one", () => {
    expect(withoutKeyInQuery(`/v1/files?key=${KEY}&q=why?`, KEY)).toBe('/v1/files?q=why?');
    expect(withoutKeyInQuery(`/v1/files?api-key=${KEY}&next=/v1/files?after=f1`, KEY)).toBe('/v1/files?next=/v1/files?after=f1');
  });

  it('is taken out when written alone, with no name: the key pasted after the ?', () => {
    expect(withoutKeyInQuery(`/v1/files?${KEY}`, KEY)).toBe('/v1/files');
    expect(withoutKeyInQuery(`/v1/files?limit=5&${encodeURIComponent(KEY)}&order=asc`, KEY)).toBe('/v1/files?limit=5&order=asc');
    // A bare parameter that is not the key goes on as it came.
    expect(withoutKeyInQuery('/v1/files?verbose&limit=5', KEY)).toBe('/v1/files?verbose&limit=5');
  });

  it('is taken out with the spaces or line end a client left around it, as the key is read from its header', () => {
    expect(withoutKeyInQuery(`/v1/files?limit=5&key=%20${KEY}%0A`, KEY)).toBe('/v1/files?limit=5');
  });

  it("is taken out when written as a form writes it, a space as '+' (URLSearchParams, an HTML form)", () => {
    const spaced = 'team a 0123456789';
    const query = new URLSearchParams({ limit: '5', key: spaced }).toString();
    expect(query).toBe('limit=5&key=team+a+0123456789');
    expect(withoutKeyInQuery(`/v1/files?${query}`, spaced)).toBe('/v1/files?limit=5');
  });

  it("is taken out when it holds a '%' no escape follows, written as it is: the value is read as it came", () => {
    const percent = 'pass%word-0123456789';
    expect(withoutKeyInQuery(`/v1/files?key=${percent}&limit=5`, percent)).toBe('/v1/files?limit=5');
  });
});
