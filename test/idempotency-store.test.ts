// Idempotency keys in both state stores (the in-process one and Redis, on a real redis-server), and their wire format.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { decodeKeyRecord, encodeKeyRecord, KeptKeys } from '../src/state/kept-keys.ts';
import { RedisStore } from '../src/state/redis-store.ts';
import type { KeyRecord } from '../src/state/store.ts';
import { claimKey } from '../src/pipeline/idempotent-request.ts';
import { startRedis, useRedisServerWithAdmin } from './helpers/redis-server.ts';
import { cutAndFleet, describeEachStore, eventually } from './helpers/redis-stores.ts';

const T = 1_700_000_000_000;
/** A running claim of `owner` (default: the fingerprint's own name), made at `sinceMs`. */
const running = (fingerprint: string, sinceMs: number, owner = `owner-${fingerprint}`): KeyRecord & { state: 'running' } => ({ state: 'running', fingerprint, sinceMs, owner });
/** An answer whose body is not UTF-8: a kept answer is bytes, never text. */
const BYTES = Buffer.from([0x7b, 0xff, 0x00, 0x0a, 0x0d, 0x7d]);
const DONE: KeyRecord & { state: 'done' } = {
  state: 'done',
  fingerprint: 'fp-1',
  bytes: BYTES.length,
  answer: { status: 200, headers: { 'content-type': 'application/json', 'x-stormgate-target': 'mock/gpt-4o' }, kind: 'whole', body: BYTES },
};

describe('the record format', () => {
  it('round-trips running and done records, a body of any bytes and a done record whose answer was not kept', () => {
    const running: KeyRecord = { state: 'running', fingerprint: 'fp-1', sinceMs: T };
    expect(decodeKeyRecord(encodeKeyRecord(running))).toEqual(running);
    expect(decodeKeyRecord(encodeKeyRecord(DONE))).toEqual(DONE);
    const notKept: KeyRecord = { state: 'done', fingerprint: 'fp-1', bytes: 5_000_000 };
    expect(decodeKeyRecord(encodeKeyRecord(notKept))).toEqual(notKept);
  });

  it('reads anything else as no record, never throws', () => {
    for (const raw of ['', 'no newline', '{not json\n', 'null\n', '{"state":"done"}\n', '{"state":"x","fingerprint":"a"}\n', '{"state":"done","fingerprint":"a","bytes":1,"answer":{"status":"200"}}\n']) {
      expect(decodeKeyRecord(Buffer.from(raw))).toBeUndefined();
    }
  });
});

describe('KeptKeys (in the process)', () => {
  it('keeps a record until it expires, by the clock it is given', () => {
    const keys = new KeptKeys(1024);
    expect(keys.claim('k', running('fp', T), 1000)).toBeUndefined();
    expect(keys.claim('k', running('fp', T + 999), 1000)).toEqual(running('fp', T));
    // The claim lapsed (an instance that died mid-request): the next request claims the key.
    expect(keys.claim('k', running('fp', T + 1000), 1000)).toBeUndefined();
    keys.settle('k', DONE, 5000, T + 1000);
    expect(keys.read('k', T + 5999)).toEqual(DONE);
    expect(keys.read('k', T + 6000)).toBeUndefined();
  });

  it('keeps at most its byte cap of answers, dropping the oldest first, and never drops a running claim for room', () => {
    const big: KeyRecord & { state: 'done' } = { ...DONE, bytes: 10_000, answer: { ...DONE.answer!, body: Buffer.alloc(10_000) } };
    const keys = new KeptKeys(2 * 10_000 + 2048);
    keys.claim('running', running('fp', T), 60_000);
    for (const k of ['a', 'b', 'c']) keys.settle(k, big, 60_000, T);
    expect(keys.read('a', T)).toBeUndefined();
    expect(keys.read('b', T)).toEqual(big);
    expect(keys.read('c', T)).toEqual(big);
    expect(keys.read('running', T)?.state).toBe('running');
  });

  it('makes room from expired records wherever they sit before dropping an older answer still in force', () => {
    // A key the client sent is kept ttlMs, a body that is its key a route's bodyAsKeyMs: the one written later may lapse
    // first, and was counted against the cap until read, so an older answer in force was dropped for room (fuzz seed 12033).
    const big: KeyRecord & { state: 'done' } = { ...DONE, bytes: 10_000, answer: { ...DONE.answer!, body: Buffer.alloc(10_000) } };
    const keys = new KeptKeys(2 * 10_000 + 2048);
    keys.settle('sent-key', big, 60_000, T);
    keys.settle('body-key', big, 1_000, T);
    keys.settle('next', big, 60_000, T + 2_000);
    expect(keys.read('sent-key', T + 2_000)).toEqual(big);
    expect(keys.read('next', T + 2_000)).toEqual(big);
    expect(keys.read('body-key', T + 2_000)).toBeUndefined();
  });

  it('counts an answer\'s headers and its record against the cap, not its body alone: small answers do not pass it', () => {
    // A provider's answer carries a kilobyte of headers (ids, rate limits, timings); a tool's body may be a few bytes.
    const headers = Object.fromEntries(Array.from({ length: 20 }, (_, i) => [`x-upstream-header-${i}`, 'v'.repeat(40)]));
    const small: KeyRecord & { state: 'done' } = { ...DONE, bytes: 2, answer: { ...DONE.answer!, headers, body: Buffer.from('{}') } };
    const keys = new KeptKeys(64 * 1024);
    for (let i = 0; i < 1000; i++) keys.settle(`k${i}`, small, 60_000, T);
    let kept = 0;
    for (let i = 0; i < 1000; i++) if (keys.read(`k${i}`, T)) kept++;
    // 1000 of them hold over a megabyte: the cap keeps fewer than 64.
    expect(kept).toBeLessThan(64);
    expect(keys.read('k999', T)).toEqual(small);
  });
});

describeEachStore((store) => {
  it('gives a key to one claim; the others get the running record, then the kept answer', async () => {
    const now = Date.now();
    const claims = await Promise.all([1, 2, 3].map(() => store().claimKey('k1', running('fp-1', now), 60_000)));
    expect(claims.filter((c) => c === undefined)).toHaveLength(1);
    expect(claims.filter((c) => c !== undefined)).toEqual([running('fp-1', now), running('fp-1', now)]);
    await store().settleKey('k1', DONE, 60_000, now);
    expect(await store().readKey('k1', now)).toEqual(DONE);
    expect(await store().claimKey('k1', running('fp-1', now), 60_000)).toEqual(DONE);
  });

  it('gives a key back: the next claim gets it', async () => {
    const now = Date.now();
    expect(await store().claimKey('k2', running('fp', now), 60_000)).toBeUndefined();
    await store().releaseKey('k2', 'owner-fp');
    expect(await store().readKey('k2', now)).toBeUndefined();
    expect(await store().claimKey('k2', running('fp', now), 60_000)).toBeUndefined();
  });

  it("gives back and renews its owner's claim only: not another's, taken since it lapsed, nor a kept answer", async () => {
    const now = Date.now();
    expect(await store().claimKey('k4', running('fp', now, 'second'), 60_000)).toBeUndefined();
    await store().releaseKey('k4', 'first');
    expect(await store().readKey('k4', now)).toEqual(running('fp', now, 'second'));
    await store().settleKey('k4', DONE, 60_000, now);
    await store().releaseKey('k4', 'second');
    expect(await store().readKey('k4', now)).toEqual(DONE);
    // Renewed, a claim outlives its first lifetime; another's renewal does nothing to it.
    // Real lifetimes (Redis keeps them): half a second of slack each way for a loaded machine.
    expect(await store().claimKey('k5', running('fp', Date.now(), 'mine'), 600)).toBeUndefined();
    await sleep(100);
    await store().renewKey('k5', 'mine', 1_200, Date.now());
    await store().renewKey('k5', 'theirs', 60_000, Date.now());
    await sleep(700);
    expect((await store().readKey('k5', Date.now()))?.state).toBe('running');
    await sleep(900);
    expect(await store().readKey('k5', Date.now())).toBeUndefined();
  });

  it("keeps an owner's answer, but not over another request's running claim (taken after the owner's lapsed)", async () => {
    const now = Date.now();
    expect(await store().claimKey('k6', running('fp-1', now, 'second'), 60_000)).toBeUndefined();
    await store().settleKey('k6', DONE, 60_000, now, 'first');
    expect(await store().readKey('k6', now)).toEqual(running('fp-1', now, 'second'));
    await store().settleKey('k6', DONE, 60_000, now, 'second');
    expect(await store().readKey('k6', now)).toEqual(DONE);
  });

  it('lets a claim lapse after runningMs and a kept answer after ttlMs', async () => {
    expect(await store().claimKey('k3', running('fp', Date.now()), 100)).toBeUndefined();
    await sleep(250);
    expect(await store().claimKey('k3', running('fp', Date.now()), 60_000)).toBeUndefined();
    await store().settleKey('k3', DONE, 100, Date.now());
    expect(await store().readKey('k3', Date.now())).toEqual(DONE);
    await sleep(250);
    expect(await store().readKey('k3', Date.now())).toBeUndefined();
  });
});

describe('RedisStore away', () => {
  it('keeps keys in the process while Redis cannot be reached, and claims in Redis again once it is back', async () => {
    const own = await startRedis();
    const store = new RedisStore({ config: { redis: own.url, commandTimeoutMs: 100, keyPrefix: `idem-${randomUUID()}` } });
    try {
      expect(await store.ready()).toBe(true);
      await own.stop();
      const now = Date.now();
      expect(await store.claimKey('k', running('fp', now), 60_000)).toBeUndefined();
      expect(await store.claimKey('k', running('fp', now), 60_000)).toEqual(running('fp', now));
      await store.settleKey('k', DONE, 60_000, now);
      expect(await store.readKey('k', now)).toEqual(DONE);
    } finally {
      await store.close();
      await own.stop();
    }
  });
});

describe('RedisStore away mid-run', () => {
  it('a key claimed in Redis whose run ended while Redis was away is given back, or its answer kept, in Redis once it is back', async () => {
    // One gateway loses Redis mid-run (a partition, a failover to a replica that has the claim); the fleet still reaches it.
    const { cut, fleet, away, back, close } = await cutAndFleet();
    try {
      const now = Date.now();
      expect(await cut.claimKey('failed', running('fp', now), 60_000)).toBeUndefined();
      expect(await cut.claimKey('answered', running('fp-1', now), 60_000)).toBeUndefined();
      // A repeat on the same instance gives up waiting (and gives back its own claim, if it had one): not the run's.
      await cut.releaseKey('answered', 'a-repeat-that-gave-up');
      await away();
      // The runs end while Redis is away: one without an answer, one with.
      await cut.releaseKey('failed', 'owner-fp');
      await cut.settleKey('answered', DONE, 60_000, Date.now());
      await back();
      // Not 'running' for the claim's whole lifetime (the route's timeout plus ttlMs), every repeat a 409.
      await eventually(async () => (await fleet.readKey('failed', Date.now())) === undefined, 2_000);
      expect(await fleet.claimKey('failed', running('fp', Date.now()), 60_000)).toBeUndefined();
      expect(await fleet.readKey('answered', Date.now())).toEqual(DONE);
    } finally {
      await close();
    }
  });
});

describe('RedisStore back from away', () => {
  it('claims in Redis the runs it claimed in the process meanwhile, and writes the answers it kept there, where the key is free', async () => {
    const { cut, fleet, admin, keyPrefix, away, back, close } = await cutAndFleet();
    try {
      await away();
      const now = Date.now();
      expect(await cut.claimKey('running', running('fp', now, 'mine'), 60_000)).toBeUndefined();
      expect(await cut.claimKey('answered', running('fp-1', now, 'mine-too'), 60_000)).toBeUndefined();
      await cut.settleKey('answered', DONE, 60_000, now, 'mine-too');
      expect(await cut.claimKey('given-back', running('fp', now, 'failed'), 60_000)).toBeUndefined();
      await cut.releaseKey('given-back', 'failed');
      // The fleet ran these keys meanwhile: what it holds in Redis stays.
      expect(await cut.claimKey('theirs', running('fp', now, 'mine'), 60_000)).toBeUndefined();
      expect(await fleet.claimKey('theirs', running('fp', now, 'theirs'), 60_000)).toBeUndefined();
      expect(await cut.claimKey('answered-there', running('fp-1', now, 'mine'), 60_000)).toBeUndefined();
      await cut.settleKey('answered-there', DONE, 60_000, now, 'mine');
      const theirAnswer = { ...DONE, answer: { ...DONE.answer!, body: Buffer.from('theirs') } };
      await fleet.settleKey('answered-there', theirAnswer, 60_000, now);
      await back();
      await eventually(async () => (await fleet.readKey('answered', Date.now())) !== undefined, 2_000);
      expect(await fleet.readKey('running', Date.now())).toEqual(running('fp', now, 'mine'));
      expect(await fleet.readKey('answered', Date.now())).toEqual(DONE);
      expect(await fleet.readKey('given-back', Date.now())).toBeUndefined();
      expect(await fleet.readKey('theirs', Date.now())).toEqual(running('fp', now, 'theirs'));
      expect(await fleet.readKey('answered-there', Date.now())).toEqual(theirAnswer);
      // The run claimed again is one of Redis's now: renewed there, and its end reaches it.
      await cut.renewKey('running', 'mine', 120_000, Date.now());
      expect(await admin.pttl(`${keyPrefix}:idempotency:{running}`)).toBeGreaterThan(60_000);
      await cut.settleKey('running', DONE, 60_000, Date.now(), 'mine');
      expect(await fleet.readKey('running', Date.now())).toEqual(DONE);
      // Its instance's own record of the other run stays its own.
      await cut.settleKey('theirs', DONE, 60_000, Date.now(), 'mine');
      expect(await fleet.readKey('theirs', Date.now())).toEqual(running('fp', now, 'theirs'));
    } finally {
      await close();
    }
  });
});

describe('RedisStore back from away, with much kept meanwhile', () => {
  it('a run claimed in the process that ends once its instance is back keeps its answer there when the fleet answered the key in Redis meanwhile', async () => {
    const { cut, fleet, away, back, close } = await cutAndFleet();
    try {
      await away();
      const now = Date.now();
      expect(await cut.claimKey('both-ran', running('fp-1', now, 'mine'), 60_000)).toBeUndefined();
      expect(await fleet.claimKey('both-ran', running('fp-1', now, 'theirs'), 60_000)).toBeUndefined();
      const theirAnswer = { ...DONE, answer: { ...DONE.answer!, body: Buffer.from('theirs') } };
      await fleet.settleKey('both-ran', theirAnswer, 60_000, now, 'theirs');
      await back();
      await cut.settleKey('both-ran', DONE, 60_000, Date.now(), 'mine');
      // The fleet's repeats got its answer: every later one gets the same (README "Where keys live").
      expect(await fleet.readKey('both-ran', Date.now())).toEqual(theirAnswer);
    } finally {
      await close();
    }
  });

  /** 48 answers of 1 MiB (maxAnswerBytes and memoryBytes as by default) kept by `cut` while Redis is away; then back. */
  async function keep48Away(cut: RedisStore, away: () => Promise<void>, back: () => Promise<void>): Promise<void> {
    await away();
    const now = Date.now();
    const body = Buffer.alloc(1024 * 1024, 97);
    for (let i = 0; i < 48; i++) {
      await cut.claimKey(`big-${i}`, running('fp', now, `o-${i}`), 60_000);
      await cut.settleKey(`big-${i}`, { ...DONE, bytes: body.length, answer: { ...DONE.answer!, body } }, 60_000, now, `o-${i}`);
    }
    await back();
  }
  const bigKeys = (keyPrefix: string) => Array.from({ length: 48 }, (_, i) => `${keyPrefix}:idempotency:{big-${i}}`);

  it('sends 48 MiB of answers kept while away a batch at a time: the request path on Redis is not held behind them past its timeout, and the store does not flap', async () => {
    // maxAnswerBytes and memoryBytes as by default (1 MiB, 64 MiB). commandTimeoutMs four times its default: a batch is
    // one answer here (1 MiB), which a starved test process (the proxy runs in it) took 260 ms to get through, and three
    // reads timing out behind it degraded the store at 100 (CI: 3 of 14 runs). Sent all at once, 48 MiB still hold them
    // past 200, 300 too, and the store degrades.
    const { cut, admin, keyPrefix, away, back, close } = await cutAndFleet({ commandTimeoutMs: 200 });
    try {
      await keep48Away(cut, away, back);
      // Requests on the instance, each with a Redis read: sent all at once, the answers held them past the timeout.
      const backAt = Date.now();
      let degradedAfterMs: number | undefined;
      for (const until = backAt + 3_000; Date.now() < until; await sleep(10)) {
        void cut.readKey('elsewhere', Date.now());
        if (cut.degraded) degradedAfterMs ??= Date.now() - backAt;
      }
      const sent = await admin.exists(...bigKeys(keyPrefix));
      expect(degradedAfterMs, `degraded ${degradedAfterMs} ms after Redis was back; ${sent} of 48 answers in Redis 3 s after`).toBeUndefined();
      await eventually(async () => (await admin.exists(...bigKeys(keyPrefix))) === 48, 5_000);
    } finally {
      await close();
    }
  });

  it('waits for a batch that timed out to be answered before it sends the next: a slow Redis does not get batch after batch piled behind it', async () => {
    // A timed-out command is still on its way. Taken for answered, the walk sent the next megabyte every commandTimeoutMs
    // while Redis had not taken the last, so requests waited behind several (CI, a loaded machine: the store flapped).
    const { cut, admin, keyPrefix, away, back, close } = await cutAndFleet({ commandTimeoutMs: 100 });
    try {
      await keep48Away(cut, away, back);
      // Redis takes no writes for over four timeouts: the batch in flight times out once, and the walk waits for it.
      await admin.call('CLIENT', 'PAUSE', '450', 'WRITE');
      await sleep(600);
      expect(cut.degraded).toBe(false);
      await eventually(async () => (await admin.exists(...bigKeys(keyPrefix))) === 48, 5_000);
      expect(cut.degraded).toBe(false);
    } finally {
      await close();
    }
  });
});

describe('a claim whose reply is lost', () => {
  const { redis, admin } = useRedisServerWithAdmin();

  it('is not taken in the process while Redis holds the key for another instance: the repeat waits and gets its answer', async () => {
    const keyPrefix = `idem-lost-${randomUUID()}`;
    const [a, b] = [100, 100].map((commandTimeoutMs) => new RedisStore({ config: { redis: redis().url, commandTimeoutMs, keyPrefix } }));
    try {
      expect(await a!.ready()).toBe(true);
      expect(await b!.ready()).toBe(true);
      expect(await a!.claimKey('k', running('fp-1', Date.now(), 'instance-a'), 60_000)).toBeUndefined();
      // Writes (the claim script among them) wait 300 ms: b's claim times out, and Redis runs it after.
      await admin().call('CLIENT', 'PAUSE', '300', 'WRITE');
      setTimeout(() => void a!.settleKey('k', DONE, 60_000, Date.now()), 450);
      const deps = { store: b!, config: { enabled: true, ttlMs: 60_000, maxAnswerBytes: 1 << 20, memoryBytes: 1 << 26, leaseMs: 10_000 }, now: Date.now, random: () => 0.5 };
      const repeat = await claimKey({ key: 'k', fingerprint: 'fp-1', owner: 'instance-b', keptMs: 600_000, runningMs: 60_000, waitUntilMs: Date.now() + 5_000, clientGone: () => false, pastGrace: () => false }, deps);
      expect(repeat).toEqual({ kind: 'replay', answer: DONE.answer });
      expect(b!.degraded).toBe(false);
    } finally {
      await Promise.all([a!.close(), b!.close()]);
    }
  });

  it('is found again as its own once Redis answers, and run', async () => {
    const store = new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 100, keyPrefix: `idem-own-${randomUUID()}` } });
    try {
      expect(await store.ready()).toBe(true);
      await admin().call('CLIENT', 'PAUSE', '300', 'WRITE');
      const deps = { store, config: { enabled: true, ttlMs: 60_000, maxAnswerBytes: 1 << 20, memoryBytes: 1 << 26, leaseMs: 10_000 }, now: Date.now, random: () => 0.5 };
      const claim = await claimKey({ key: 'k', fingerprint: 'fp-1', owner: 'me', keptMs: 600_000, runningMs: 60_000, waitUntilMs: Date.now() + 5_000, clientGone: () => false, pastGrace: () => false }, deps);
      expect(claim.kind).toBe('run');
      expect(await store.readKey('k', Date.now())).toMatchObject({ state: 'running', owner: 'me' });
    } finally {
      await store.close();
    }
  });

  it('is given back when the request gives up before it knows (its client left): the key is not held with nothing running it', async () => {
    const keyPrefix = `idem-gone-${randomUUID()}`;
    const store = new RedisStore({ config: { redis: redis().url, commandTimeoutMs: 100, keyPrefix } });
    try {
      expect(await store.ready()).toBe(true);
      // The claim times out, and Redis runs it after: the key is this request's, which does not know it.
      await admin().call('CLIENT', 'PAUSE', '300', 'WRITE');
      const deps = { store, config: { enabled: true, ttlMs: 60_000, maxAnswerBytes: 1 << 20, memoryBytes: 1 << 26, leaseMs: 10_000 }, now: Date.now, random: () => 0.5 };
      const given = claimKey({ key: 'k', fingerprint: 'fp-1', owner: 'me', keptMs: 600_000, runningMs: 60_000, waitUntilMs: Date.now() + 5_000, clientGone: () => true, pastGrace: () => false }, deps);
      await expect(given).rejects.toMatchObject({ code: 'idempotency_key_in_progress' });
      // The pause over, Redis has run the claim (and whatever followed it on the connection).
      await sleep(400);
      // Else every repeat waits for a run that never started and gets 409, for the claim's whole lifetime.
      await eventually(async () => (await admin().exists(`${keyPrefix}:idempotency:{k}`)) === 0, 2_000);
    } finally {
      await store.close();
    }
  });
});
