// Mutation round 42 on the day's changes: a request that left a target for the hold-off its own 429 started waits the
// rest out itself (parking off, or park.maxWaitMs too short), a class's maxShare, parseExact given the parsed body, the
// provider key taken out of an error code before the 64-character cut, a caFile from ${ENV} named by its variable, and
// budget counts moved to Redis's clock at its first reading. A test for each mutant the existing tests let live, and
// two bugs found: a lone 1e400 went out as null (the scan's gate saw no long number), and a request released by the
// lot to a target whose answer then started a hold-off lost it as its own when every target was looked at again.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { loadConfigFile, parseConfig } from '../src/config/load.ts';
import { serveTargets, type ServeDeps } from '../src/pipeline/serve-targets.ts';
import { errorEventBreaks } from '../src/pipeline/stream-break.ts';
import { newRun, type RequestContext } from '../src/pipeline/target-attempts.ts';
import { ProviderPool, type SlotRequest } from '../src/pools/provider-pool.ts';
import { errorVerdict } from '../src/providers/error-outcome.ts';
import { parseExact, stringifyExact } from '../src/providers/exact-json.ts';
import { FleetClock } from '../src/state/fleet-clock.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import { RedisBudget } from '../src/state/redis-budget.ts';
import { RedisKeys } from '../src/state/redis-keys.ts';
import { RetryBudget } from '../src/state/retry-budget.ts';
import { configErrorOf, validConfigText } from './helpers/config-text.ts';
import { scriptedAnswers, scriptedPlan } from './helpers/scripted-serve.ts';

// serve-targets.ts alone: tryTarget answers from a script, noting the clock and the run it was called with; nothing
// holds a target once the lot's wait ran out (heldBack).
const script = vi.hoisted(() => ({
  answers: new Map<string, unknown[]>(),
  calls: [] as Array<{ key: string; atMs: number; waitMs: number; retryPaid: boolean }>,
  clock: { now: 0 },
}));
vi.mock('../src/pipeline/target-attempts.ts', async (importOriginal) => {
  const real = await importOriginal<typeof import('../src/pipeline/target-attempts.ts')>();
  return {
    ...real,
    heldBack: () => undefined,
    tryTarget: async (_ctx: RequestContext, plan: { key: string }, run: ReturnType<typeof newRun>) => {
      script.calls.push({ key: plan.key, atMs: script.clock.now, waitMs: run.waitMs, retryPaid: run.retryPaid });
      const next = script.answers.get(plan.key)?.shift();
      if (next === undefined) throw new Error(`no answer scripted for ${plan.key}`);
      return next as never;
    },
  };
});

const flush = () => new Promise((r) => setImmediate(r));
const req = (cls: number): SlotRequest => ({ cls, target: 'p/m', retry: false, deadlineAtMs: 60_000, minAttemptMs: 0, signal: new AbortController().signal });

/** How many slots class `cls` gets at once from an idle pool, asking for `asks` of them (the rest wait). */
async function grantedAtOnce(p: ProviderPool, cls: number, asks: number): Promise<number> {
  let granted = 0;
  for (let i = 0; i < asks; i++) void p.acquire(req(cls)).then((a) => a.ok && granted++);
  await flush();
  return granted;
}

const pool = (capacity: number, online: { maxShare?: number }, batch: { maxShare?: number }) =>
  new ProviderPool(
    { provider: 'p', capacity, retryCapacity: capacity, classes: [{ name: 'online', minShare: 0, maxQueue: 100, ...online }, { name: 'batch', minShare: 0, maxQueue: 100, ...batch }], decrease: 0.9, minLimit: 1 },
    () => 0,
  );

describe("a class's maxShare (pools.classes.<c>.maxShare)", () => {
  it('is a share it holds at most: a fraction of a slot is not given (0.75 of 10 slots is 7)', async () => {
    const p = pool(10, {}, { maxShare: 0.75 });
    expect(await grantedAtOnce(p, 1, 10)).toBe(7);
    // The three left are the other class's, idle or not.
    expect(await grantedAtOnce(p, 0, 3)).toBe(3);
  });

  it("binds the highest class too: online's long streams leave batch its part", async () => {
    const p = pool(10, { maxShare: 0.5 }, {});
    expect(await grantedAtOnce(p, 0, 10)).toBe(5);
    expect(await grantedAtOnce(p, 1, 5)).toBe(5);
  });

  it("is a share of this instance's part of the pool in a fleet, not of the whole maxConcurrent", async () => {
    const p = pool(10, {}, { maxShare: 0.8 });
    // Half the fleet's capacity is this instance's: 5 slots, of which batch may hold 4.
    p.setShare(0.5);
    expect(await grantedAtOnce(p, 1, 10)).toBe(4);
    expect(await grantedAtOnce(p, 0, 1)).toBe(1);
  });
});

describe('pools.classes.<c>.maxShare in the config', () => {
  const env = { OPENAI_API_KEY: 'sk-test' };
  const classes = (shares: string) => validConfigText().replace('    apiKey:', `    pools:\n      classes: { ${shares} }\n    apiKey:`);

  it('caps no class when left out: each default class may take every idle slot, as before maxShare', () => {
    expect(parseConfig(validConfigText(), 'gw.yaml', env).providers.openai!.pools.classes).toEqual({
      online: { minShare: 0.5, maxShare: 1, maxQueue: 1000 },
      batch: { minShare: 0.1, maxShare: 1, maxQueue: 10000 },
    });
    expect(parseConfig(classes('online: {}, batch: { minShare: 0.2 }'), 'gw.yaml', env).providers.openai!.pools.classes['batch']!.maxShare).toBe(1);
  });

  it('takes a maxShare equal to the minShare: a class held to exactly its share', () => {
    expect(parseConfig(classes('online: { minShare: 0.5 }, batch: { minShare: 0.3, maxShare: 0.3 }'), 'gw.yaml', env).providers.openai!.pools.classes['batch']).toEqual({ minShare: 0.3, maxShare: 0.3, maxQueue: 1000 });
  });

  it('refuses a maxShare of 0 or past 1: a share of the pool, more than nothing', () => {
    expect(configErrorOf(classes('online: {}, batch: { maxShare: 0 }'), env).message).toMatch(/pools\.classes\.batch\.maxShare/);
    expect(configErrorOf(classes('online: {}, batch: { maxShare: 1.5 }'), env).message).toMatch(/pools\.classes\.batch\.maxShare/);
  });
});

describe('exact JSON numbers (parseExact, stringifyExact)', () => {
  const roundTrip = (text: string) => stringifyExact(parseExact(text, JSON.parse(text)));

  it('keeps the smallest integer a double rounds (2^53 + 1, 16 digits) when it is the only long number in the text', () => {
    expect(roundTrip('{"id":9007199254740993}')).toBe('{"id":9007199254740993}');
    expect(roundTrip('{"f":0.1000000000000001}')).toBe('{"f":0.1000000000000001}');
  });

  it('keeps a number a double cannot hold at all (1e400) as written, with or without a long number beside it', () => {
    // Read alone as JSON.parse reads it, it was Infinity and went out as null: 1e400 was kept only when the text
    // happened to hold a 16-digit run too.
    expect(roundTrip('{"big":1e400}')).toBe('{"big":1e400}');
    expect(roundTrip('{"big":-1E+400,"small":1.5}')).toBe('{"big":-1E+400,"small":1.5}');
    expect(roundTrip('{"big":1e400,"id":9007199254740993}')).toBe('{"big":1e400,"id":9007199254740993}');
  });

  it('hands back the value already parsed when the text holds no long number, and parses the text otherwise', () => {
    const parsed = { a: 1 };
    expect(parseExact('{"a":1}', parsed)).toBe(parsed);
    expect(parseExact('{"a":12345678901234567}', parsed)).not.toBe(parsed);
  });
});

describe('a request that left a target for the hold-off its own 429 started, no other target answering (serve-targets.ts waitOutOwnHoldOff)', () => {
  const clock = script.clock;
  const { failed503, ok, ownHoldOff } = scriptedAnswers(clock);
  beforeEach(() => {
    clock.now = 1_000_000;
    script.answers.clear();
    script.calls.length = 0;
  });
  afterEach(() => {
    script.answers.clear();
  });

  /** Serves one request on targets a (primary) and b, parking off unless `park` is given; sleeps move the clock. */
  async function serve(o: { park?: false | { maxQueue: number; maxWaitMs?: number }; graceLeftMs?: number; sleep?: (ms: number) => Promise<void>; deadlineMs?: number; parks?: unknown[]; parkMs?: number } = {}) {
    const waited: Array<[string, number]> = [];
    const sleeps: number[] = [];
    const budget = { counted: 0, taken: 0 };
    const ctx = {
      route: { name: 'chat', config: { minAttemptMs: 100, budget: {} } },
      deadlineAtMs: clock.now + (o.deadlineMs ?? 30_000),
      signal: new AbortController().signal,
      skipped: [],
      attempts: [],
      parkable: true,
      onWaited: (kind: string, ms: number) => kind !== 'parked' && waited.push([kind, ms]),
      ...(o.graceLeftMs !== undefined && { graceLeftMs: () => o.graceLeftMs }),
    } as unknown as RequestContext;
    const deps = {
      now: () => clock.now,
      sleep:
        o.sleep ??
        (async (ms: number) => {
          sleeps.push(ms);
          clock.now += ms;
        }),
      lot: {
        waiting: () => 0,
        park: async () => {
          clock.now += o.parkMs ?? 0;
          waited.push(['lot', o.parkMs ?? 0]);
          return o.parks?.shift() ?? { kind: 'timeout' };
        },
      },
      guards: {
        holdOffs: { credentialsHeldFor: () => undefined },
        budget: {
          countRetry: async () => void budget.counted++,
          tryRetry: async () => (budget.taken++, false),
        },
      },
    } as unknown as ServeDeps;
    const served = await serveTargets(ctx, ['a', 'b'].map(scriptedPlan), undefined, o.park ?? false, deps);
    return { served, waited, sleeps, budget };
  }

  it('with parking off, waits the rest out past its end, then retries there, its retry paced (counted, not taken from the budget) and its wait shown', async () => {
    script.answers.set('a', [ownHoldOff(3_000), ok]);
    script.answers.set('b', [failed503]);
    const r = await serve();
    expect(r.served).toMatchObject({ kind: 'ok', plan: { key: 'a' } });
    expect(script.calls.map((c) => c.key)).toEqual(['a', 'b', 'a']);
    const back = script.calls[2]!;
    // Past the hold-off's end (a timer may fire a millisecond early, and the target would still be held off).
    expect(back.atMs).toBeGreaterThan(1_003_000);
    expect(back.atMs).toBeLessThan(1_003_100);
    // The time it waited is the wait before that attempt in the log, and the onWaited metric's backoff.
    expect(back.waitMs).toBe(back.atMs - 1_000_000);
    expect(r.waited).toEqual([['backoff', back.waitMs]]);
    // Paced as the same wait taken before it left would have been: a spent budget does not refuse it.
    expect(back.retryPaid).toBe(true);
    expect(r.budget).toEqual({ counted: 1, taken: 0 });
  });

  it('waits out its own hold-off, not an earlier target\'s longer one that held it back', async () => {
    // b, the backup, gets the 429 after a was found held off by someone else's 20 s hold-off.
    script.answers.set('a', [{ kind: 'unavailable', reason: 'hold-off', availableAtMs: clock.now + 20_000 }, { kind: 'unavailable', reason: 'hold-off', availableAtMs: clock.now + 20_000 }]);
    script.answers.set('b', [ownHoldOff(2_000), ok]);
    const r = await serve();
    expect(r.served).toMatchObject({ kind: 'ok', plan: { key: 'b' } });
    expect(r.sleeps).toHaveLength(1);
    expect(r.sleeps[0]).toBeLessThan(2_100);
    // The retry that went is b's: its run shows the wait and was paid for (a's run, never retried, neither).
    const back = script.calls.at(-1)!;
    expect([back.key, back.waitMs, back.retryPaid]).toEqual(['b', r.sleeps[0], true]);
  });

  it('with parking on and a park.maxWaitMs the hold-off outlasts, waits it out itself rather than park', async () => {
    script.answers.set('a', [ownHoldOff(3_000), ok]);
    script.answers.set('b', [failed503]);
    const r = await serve({ park: { maxQueue: 10, maxWaitMs: 500 } });
    expect(r.served).toMatchObject({ kind: 'ok', plan: { key: 'a' } });
    expect(r.waited.map(([kind]) => kind)).toEqual(['backoff']);
  });

  it('released by the lot to the target that then started its hold-off, still waits it out itself when what is left of maxWaitMs cannot cover it', async () => {
    // Both down, b back first: parked 2 s of its 4 s maxWaitMs, released to b, whose 429 starts a 3 s hold-off. It
    // leaves b for a, which the released pass did not look at, and every target is looked at again: a fails, and b is
    // held off, by the hold-off its own answer started.
    script.answers.set('a', [{ kind: 'unavailable', reason: 'breaker', availableAtMs: clock.now + 4_000 }, failed503]);
    script.answers.set('b', [{ kind: 'unavailable', reason: 'breaker', availableAtMs: clock.now + 2_000 }, ownHoldOff(5_000), { kind: 'unavailable', reason: 'hold-off', availableAtMs: clock.now + 5_000 }, ok]);
    const r = await serve({ park: { maxQueue: 10, maxWaitMs: 4_000 }, parks: [{ kind: 'released', ticket: { done: () => {} } }], parkMs: 2_000 });
    expect(script.calls.map((c) => c.key)).toEqual(['a', 'b', 'b', 'a', 'b', 'b']);
    // Parked for it as a newcomer would, the lot let it wait the 2 s left of the 3 s: it ended with a's 503 where
    // waiting got the answer, as it does for a request that got its 429 without parking first.
    expect(r.served).toMatchObject({ kind: 'ok', plan: { key: 'b' } });
    expect(r.waited.map(([kind]) => kind)).toEqual(['lot', 'backoff']);
  });

  it('while the instance drains, ends at once with the backup\'s failure when the grace left cannot hold the wait and an attempt', async () => {
    script.answers.set('a', [ownHoldOff(3_000)]);
    script.answers.set('b', [failed503]);
    // 3 s and its slack, then minAttemptMs (100 ms): 3,102 ms do not fit in 3,050.
    const r = await serve({ graceLeftMs: 3_050 });
    expect(r.served).toMatchObject({ kind: 'failed', plan: { key: 'b' } });
    expect(r.sleeps).toEqual([]);
    const fits = await (async () => {
      script.answers.set('a', [ownHoldOff(3_000), ok]);
      script.answers.set('b', [failed503]);
      return serve({ graceLeftMs: 3_200 });
    })();
    expect(fits.served).toMatchObject({ kind: 'ok', plan: { key: 'a' } });
  });

  it('ends at once with the backup\'s failure when its deadline, after the backup\'s attempt, cannot hold the wait and an attempt', async () => {
    // The hint fitted when a answered; the backup's 503 took time the wait needed.
    script.answers.set('a', [ownHoldOff(3_000)]);
    script.answers.set('b', [failed503]);
    const r = await serve({ deadlineMs: 3_050 });
    expect(r.served).toMatchObject({ kind: 'failed', plan: { key: 'b' } });
    expect(r.sleeps).toEqual([]);
    script.answers.set('a', [ownHoldOff(3_000), ok]);
    script.answers.set('b', [failed503]);
    expect((await serve({ deadlineMs: 3_200 })).served).toMatchObject({ kind: 'ok', plan: { key: 'a' } });
  });

  it('ends as its abort says when its client leaves during the wait, on the target it waited for, sending nothing more', async () => {
    script.answers.set('a', [ownHoldOff(3_000)]);
    script.answers.set('b', [failed503]);
    const r = await serve({
      sleep: async () => {
        throw new Error('aborted');
      },
    });
    expect(r.served).toMatchObject({ kind: 'failed', plan: { key: 'a' }, failure: { result: { outcome: { kind: 'aborted', by: 'client' } } } });
    expect(script.calls.map((c) => c.key)).toEqual(['a', 'b']);
  });
});

describe("counts stamped before the first reading of Redis's clock (RedisBudget.firstClockReading)", () => {
  const KEY = RetryBudget.key('chat', 'online', 'p/m');
  const cfg = { ratio: 0.5, windowS: 10, minRetriesPerSecond: 0 };

  /** A budget whose Redis answers from `usable` on; what flush sends, by kind: [second, count] pairs. */
  function budget() {
    const sent: Record<string, number[][]> = {};
    const health = { up: false, usable: () => health.up, answered: () => {}, failed: () => {} };
    const client = {
      sgAddCounts: async (_key: string, _ttl: number, _max: number, field: string, ...pairs: number[]) => {
        for (let i = 0; i < pairs.length; i += 2) (sent[field] ??= []).push([pairs[i]!, pairs[i + 1]!]);
      },
    };
    const b = new RedisBudget({ client, keys: new RedisKeys('t'), local: new MemoryStore(), health, clock: new FleetClock(), now: () => 1_000_000_000 } as never);
    return { b, sent, health };
  }

  it("move, requests and retries alike, from the middle of their second by the skew, to the second of Redis's clock they fall in most", async () => {
    const { b, sent, health } = budget();
    // Counted on local state at 1,000,000,000 ms of this instance's clock, 600.3 s ahead of Redis's.
    b.addRequests(KEY, 10, 1_000_000_000);
    b.addRequests(KEY, 2, 1_000_001_999);
    expect(await b.takeRetry(KEY, cfg, 1_000_000_000, false)).toBe(true);
    b.firstClockReading(600_300);
    health.up = true;
    b.flush();
    await flush();
    // 1,000,000.5 s - 600.3 s = 999,400.2 s: seconds 999,400 and 999,401 of Redis's clock.
    expect(sent).toEqual({ r: [[999_400, 10], [999_401, 2]], x: [[999_400, 1]] });
    b.close();
  });
});

describe("a provider's key quoted in the code of an error event, across the 64-character cut", () => {
  // The key starts before the cut and ends past it: cut first, the key's first 34 characters were no longer the key.
  const KEY = 'sk-proj-' + 'Q7w'.repeat(20);
  const code = `upstream_failure_for_key_${KEY}`;
  const ev = { raw: 'data: {}', data: '{}', event: null };

  it("is out of the code the breaker's log line names", () => {
    const broke = errorEventBreaks({ message: undefined, code, type: undefined, param: null }, ev, undefined, KEY);
    expect(broke).toEqual({ reason: 'stream_error', code: 'upstream_failure_for_key_[redacted]' });
  });

  it("is out of the failure the client's 502 quotes", () => {
    const verdict = errorVerdict({ message: undefined, code, type: undefined, param: null }, 'error event before any output', KEY);
    expect(verdict.failure).toBe('error event before any output: upstream_failure_for_key_[redacted]');
    expect(verdict.failure).not.toContain(KEY.slice(0, 12));
  });
});

describe('a tls.caFile given by ${ENV}, in every problem start-up names', () => {
  const dir = mkdtempSync(join(tmpdir(), 'mut42-ca-'));
  const config = (file: string) => {
    const path = join(dir, 'gw.yaml');
    writeFileSync(path, validConfigText().replace('    apiKey:', '    tls: { caFile: "${MY_CA}" }\n    apiKey:'));
    return () => loadConfigFile(path, { OPENAI_API_KEY: 'sk-test', MY_CA: file });
  };

  it('is named by its variable when the file holds no certificate, or one that does not parse', () => {
    try {
      const notPem = join(dir, 'secret-name-not-pem.txt');
      writeFileSync(notPem, 'not a certificate');
      expect(config(notPem)).toThrow(/caFile: the file \$\{MY_CA\} names holds no PEM certificate/);
      const broken = join(dir, 'secret-name-broken.pem');
      writeFileSync(broken, '-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n');
      expect(config(broken)).toThrow(/caFile: the file \$\{MY_CA\} names holds a certificate that does not parse/);
      expect(config(broken)).not.toThrow(/secret-name/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
