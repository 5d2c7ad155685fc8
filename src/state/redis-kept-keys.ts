// Idempotency keys in Redis, with the in-process stand-in while Redis is away and the runs' ends written back after:
// apart from the store, whose breaker and budget state never needs a run's owner.
import type { MemoryStore } from './memory-store.ts';
import { decodeKeyRecord, encodeKeyRecord } from './kept-keys.ts';
import { isCommandTimeout } from './redis-errors.ts';
import type { RedisHealth } from './redis-health.ts';
import type { RedisKeys } from './redis-keys.ts';
import type { ScriptClient } from './redis-scripts.ts';
import type { KeyRecord } from './store.ts';

/** How a run under an idempotency key ended, to be written to Redis: its kept answer, or its owner's claim given back. */
type KeyEnd = { record: KeyRecord & { state: 'done' }; owner: string | undefined; untilMs: number } | { record?: undefined; owner: string; untilMs: number };

/** The most runs of other requests remembered as seen in Redis (#runsSeen): a few MB at most. */
const MAX_SIGHTINGS = 10_000;

/** sendLocalKeys' records sent before it waits for their replies: what a request's Redis command may wait behind. */
const SEND_BATCH_BYTES = 256 * 1024;

interface RedisKeptKeysDeps {
  client: ScriptClient;
  keys: RedisKeys;
  local: MemoryStore;
  health: RedisHealth;
  now: () => number;
  /** How long a run's claim lasts unrenewed (idempotency.leaseMs): a run seen in Redis is taken as going on that long. */
  keyLeaseMs: number;
  /** idempotency.waitForRedisMs: see #claimAway. */
  waitForRedisMs: number;
}

/**
 * Idempotency keys: in Redis when it is usable, else in the process (a repeat that reaches another instance then runs
 * again, as it would with no key at all).
 */
export class RedisKeptKeys {
  readonly #deps: RedisKeptKeysDeps;
  /**
   * Idempotency keys this instance claimed in Redis (or may have: the claim's answer was lost), until their claims lapse;
   * `claim` once the claim is known to be this instance's run (see claimAgain).
   */
  readonly #claimedInRedis = new Map<string, { owner: string; untilMs: number; claim?: KeyRecord & { state: 'running' } }>();
  /**
   * How runs under keys of #claimedInRedis ended while Redis was away (a kept answer, or no record: the key given back),
   * each until it would have lapsed in Redis anyway: written when Redis is back. Else the run's claim stayed there for
   * the route's timeout plus ttlMs, and every repeat on the fleet waited for a run that was over, then got a 409.
   */
  readonly #keyEnds = new Map<string, KeyEnd>();
  /**
   * Runs of other requests this instance found holding their keys in Redis, each until its claim would lapse unless
   * renewed (a lease from the last sighting). While Redis is away, a repeat of such a run waits for it, and gets
   * idempotency_key_in_progress at its deadline, rather than claim the key in the process and run the call beside it:
   * Redis gone for a second while an agent's retry waited for the run on another instance, the coupon went out twice.
   */
  readonly #runsSeen = new Map<string, { record: KeyRecord & { state: 'running' }; untilMs: number }>();
  /** Recoveries so far: a walk of sendLocalKeys goes on while it is the latest one's. */
  #sendRounds = 0;

  constructor(deps: RedisKeptKeysDeps) {
    this.#deps = deps;
  }

  async claimKey(key: string, claim: KeyRecord & { state: 'running' }, runningMs: number): Promise<KeyRecord | undefined> {
    const { client, keys, local, health } = this.#deps;
    // A run this instance claimed while Redis was away is looked for here first: Redis back, its repeats would else
    // claim the key there and run it a second time.
    const here = await local.readKey(key, claim.sinceMs);
    if (here !== undefined) return here;
    if (!health.usable()) return this.#claimAway(key, claim, runningMs);
    const redisKey = keys.idempotency(key);
    try {
      const held = await client.sgClaimKeyBuffer(redisKey, encodeKeyRecord(claim).toString('utf8'), runningMs);
      health.answered();
      if (held === null) this.#claimedInRedis.set(key, { owner: claim.owner!, untilMs: claim.sinceMs + runningMs, claim });
      // A value this version cannot read (a newer one's, a damaged one) is taken as a request running under the key.
      const found = held === null ? undefined : (decodeKeyRecord(held) ?? { state: 'running', fingerprint: '', sinceMs: claim.sinceMs });
      this.#noteSighting(key, found, claim.sinceMs);
      return found;
    } catch (err) {
      health.failed(err, redisKey);
      // Such a claim may turn out not to be its own (the repeat gets the answer): nothing ends it; it goes once lapsed.
      // First: another request's lapsed one under this key holds it no more, and must not keep this one out below.
      for (const [k, c] of this.#claimedInRedis) if (c.untilMs <= claim.sinceMs) this.#claimedInRedis.delete(k);
      // The script may have run, and the claim be this request's in Redis: remembered, so its end reaches Redis. Not
      // over another request's here: that one holds the key, and this claim cannot have taken it.
      const remembered = this.#claimedInRedis.get(key);
      if (remembered === undefined || remembered.owner === claim.owner) this.#claimedInRedis.set(key, { owner: claim.owner!, untilMs: claim.sinceMs + runningMs });
      // A lone timeout leaves the store on Redis: the request looks again (readKey) and finds out whether the claim is
      // its own, rather than claiming here while another instance may be running the key. Redis away: claimed here.
      if (health.usable()) return { state: 'running', fingerprint: claim.fingerprint, sinceMs: claim.sinceMs };
      return this.#claimAway(key, claim, runningMs);
    }
  }

  /**
   * A claim while Redis is away. A run this instance knows of under the key (its own, or another's it saw in Redis)
   * is waited for. Else the request runs on local state (availability before run-once), unless Redis went away less
   * than waitForRedisMs ago: then the key may be held in Redis by a run on another instance (an SDK's retry reaches
   * another instance than its first attempt did), and taken for such a run, whose owner is unknown, the request waits
   * for Redis as a repeat waits for a run, or gets idempotency_key_in_progress at its deadline. Redis frozen for 1.5 s
   * under 36 agents whose SDKs retried each call after 1.2 s, 33 of the 36 calls ran twice without it.
   */
  #claimAway(key: string, claim: KeyRecord & { state: 'running' }, runningMs: number): Promise<KeyRecord | undefined> | KeyRecord {
    const { health, local, waitForRedisMs } = this.#deps;
    const known = this.#ownRun(key, claim.sinceMs) ?? this.#sightingOf(key, claim.sinceMs);
    if (known !== undefined) return known;
    const awayMs = health.degradedForMs();
    if (awayMs !== undefined && awayMs < waitForRedisMs) return { state: 'running', fingerprint: claim.fingerprint, sinceMs: claim.sinceMs };
    return local.claimKey(key, claim, runningMs);
  }

  /** What a command on Redis found under the key, for #runsSeen: another request's run, or anything else, which ends the sighting. */
  #noteSighting(key: string, record: KeyRecord | undefined, nowMs: number): void {
    this.#runsSeen.delete(key);
    const mine = this.#claimedInRedis.get(key);
    if (record?.state !== 'running' || (mine !== undefined && mine.owner === record.owner)) return;
    this.#runsSeen.set(key, { record, untilMs: nowMs + this.#deps.keyLeaseMs });
    // Oldest first (each sighting moves its key last): the lapsed ones go as new ones come, and past MAX_SIGHTINGS the
    // oldest in force too (a long lease under many repeats): that repeat then runs on local state, as before sightings.
    for (const [k, { untilMs }] of this.#runsSeen) {
      if (untilMs > nowMs && this.#runsSeen.size <= MAX_SIGHTINGS) break;
      this.#runsSeen.delete(k);
    }
  }

  /** Another request's run this instance found holding the key in Redis, unless its claim would have lapsed by now. */
  #sightingOf(key: string, nowMs: number): (KeyRecord & { state: 'running' }) | undefined {
    const seen = this.#runsSeen.get(key);
    return seen !== undefined && seen.untilMs > nowMs ? seen.record : undefined;
  }

  /**
   * This instance's own run under the key, claimed in Redis before Redis went away and still going: a repeat that
   * reaches this instance meanwhile waits for it. Else it found the key free in the process and ran the request a
   * second time beside it, on the very instance that knows of the run (a gateway that lost Redis mid-run, the agent's
   * retry coming back to it: the coupon twice).
   */
  #ownRun(key: string, nowMs: number): (KeyRecord & { state: 'running' }) | undefined {
    const claimed = this.#claimedInRedis.get(key);
    return claimed?.claim !== undefined && claimed.untilMs > nowMs ? claimed.claim : undefined;
  }

  async readKey(key: string, nowMs: number): Promise<KeyRecord | undefined> {
    const { client, keys, local, health } = this.#deps;
    const away = async () => (await local.readKey(key, nowMs)) ?? this.#sightingOf(key, nowMs);
    if (!health.usable()) return away();
    const redisKey = keys.idempotency(key);
    try {
      const raw = await client.getBuffer(redisKey);
      health.answered();
      const record = raw === null ? undefined : decodeKeyRecord(raw);
      this.#noteSighting(key, record, nowMs);
      if (raw === null) return local.readKey(key, nowMs);
      // A claim whose reply was lost turns out to be this instance's: its request runs it now (idempotent-request.ts).
      const claimed = this.#claimedInRedis.get(key);
      if (record?.state === 'running' && claimed !== undefined && record.owner === claimed.owner) claimed.claim = record;
      return record;
    } catch (err) {
      health.failed(err, redisKey);
      return away();
    }
  }

  async renewKey(key: string, owner: string, runningMs: number, nowMs: number): Promise<void> {
    const { client, keys, local, health } = this.#deps;
    await local.renewKey(key, owner, runningMs, nowMs);
    const claimed = this.#claimedInRedis.get(key);
    if (claimed?.owner === owner) claimed.untilMs = nowMs + runningMs;
    if (!health.usable()) return;
    const redisKey = keys.idempotency(key);
    try {
      await client.sgRenewKey(redisKey, owner, runningMs);
      health.answered();
    } catch (err) {
      health.failed(err, redisKey);
    }
  }

  async settleKey(key: string, record: KeyRecord & { state: 'done' }, ttlMs: number, nowMs: number, owner?: string): Promise<void> {
    const { keys, local: memory, health } = this.#deps;
    // A claim taken while Redis was away lives in the process, where its repeats look: it is settled there too.
    const local = (await memory.readKey(key, nowMs)) !== undefined;
    if (local || !health.usable()) await memory.settleKey(key, record, ttlMs, nowMs, owner);
    if (!health.usable()) return this.#endLater(key, { record, owner, untilMs: nowMs + ttlMs });
    const redisKey = keys.idempotency(key);
    try {
      // A run claimed in the process: a key the fleet answered in Redis meanwhile keeps that answer, which its repeats got.
      await this.#writeEnd(redisKey, record, owner, ttlMs, local);
      health.answered();
      if (owner === undefined || this.#claimedInRedis.get(key)?.owner === owner) this.#claimedInRedis.delete(key);
    } catch (err) {
      health.failed(err, redisKey);
      if (!local) await memory.settleKey(key, record, ttlMs, nowMs, owner);
      this.#endLater(key, { record, owner, untilMs: nowMs + ttlMs });
    }
  }

  /**
   * How a run ended, in Redis: with its owner, not over another request's running claim (redis-scripts.ts SETTLE_KEY);
   * `ownOnly`, not over another run's answer either.
   */
  #writeEnd(redisKey: string, record: KeyRecord & { state: 'done' }, owner: string | undefined, ttlMs: number, ownOnly = false): Promise<unknown> {
    const bytes = encodeKeyRecord(record);
    const { client } = this.#deps;
    return owner === undefined ? client.set(redisKey, bytes, 'PX', ttlMs) : client.sgSettleKey(redisKey, owner, bytes, ttlMs, ownOnly ? '1' : '0');
  }

  async releaseKey(key: string, owner: string): Promise<void> {
    const { client, keys, local, health } = this.#deps;
    await local.releaseKey(key, owner);
    const until = () => this.#claimedInRedis.get(key)?.untilMs ?? 0;
    if (!health.usable()) return this.#endLater(key, { owner, untilMs: until() });
    const redisKey = keys.idempotency(key);
    try {
      await client.sgReleaseKey(redisKey, owner);
      health.answered();
      if (this.#claimedInRedis.get(key)?.owner === owner) this.#claimedInRedis.delete(key);
    } catch (err) {
      health.failed(err, redisKey);
      this.#endLater(key, { owner, untilMs: until() });
    }
  }

  /**
   * A run's end that did not reach Redis, for a key claimed there: written once Redis is back (sendKeyEnds). Not
   * after a lone timeout, which leaves the store on Redis: the write it timed out on was sent, and Redis runs it.
   */
  #endLater(key: string, end: KeyEnd): void {
    // A give-back is its owner's: a repeat that gave up waiting does not end the run this instance holds the key for.
    const claimed = this.#claimedInRedis.get(key);
    if (claimed === undefined || (end.owner !== undefined && claimed.owner !== end.owner)) return;
    this.#claimedInRedis.delete(key);
    if (this.#deps.health.usable()) return;
    this.#keyEnds.set(key, end);
  }

  /**
   * Redis is back: the runs still going here claim their keys again where Redis no longer has them (a Redis restarted
   * without persistence, a failover to a replica that had not got the claim). Else a repeat on another instance found
   * the key free and ran the request a second time beside the run, which is what the key is there to prevent. A key
   * another request claimed meanwhile keeps that claim.
   */
  claimAgain(): void {
    const { client, keys, health } = this.#deps;
    const nowMs = this.#deps.now();
    for (const [key, { claim, untilMs }] of this.#claimedInRedis) {
      if (claim === undefined || untilMs <= nowMs) continue;
      const redisKey = keys.idempotency(key);
      client.sgClaimKeyBuffer(redisKey, encodeKeyRecord(claim).toString('utf8'), Math.ceil(untilMs - nowMs)).then(
        () => health.answered(),
        (err: unknown) => health.failed(err, redisKey),
      );
    }
  }

  /**
   * Redis is back: what this instance kept in the process while Redis was away goes there too, where Redis has nothing
   * under the key. A run still going claims its key (the claim script, for what is left of its lease) and joins the
   * runs claimed in Redis: its renewals and its end reach Redis, and it claims again after the next outage. An answer
   * (or the record of one too long to keep) is written for the rest of its ttlMs. Else a repeat on another instance
   * found the key free in Redis and ran the call a second time (and a third, when that run failed and gave the key
   * back). A key the fleet claimed or answered in Redis meanwhile keeps what it has: both ran, and this record stays here.
   */
  sendLocalKeys(): void {
    void this.#sendLocalKeys(++this.#sendRounds);
  }

  /**
   * sendLocalKeys' walk, a batch of SEND_BATCH_BYTES at a time: sent all at once, 64 MiB of kept answers held every
   * request's Redis command behind them past commandTimeoutMs, the store degraded, recovered, sent them all again, and
   * flapped for good. A later recovery's walk takes over from this one; one with Redis away again stops (the next sends all).
   */
  async #sendLocalKeys(round: number): Promise<void> {
    const { client, keys, local, health } = this.#deps;
    let batch: Promise<unknown>[] = [];
    let bytes = 0;
    /** A key the batch wrote, when one of its commands timed out. */
    let timedOut: string | undefined;
    for (const [key, record, untilMs] of local.heldKeys(this.#deps.now())) {
      if (bytes >= SEND_BATCH_BYTES) {
        await Promise.allSettled(batch);
        if (timedOut !== undefined) await this.#drained(timedOut, round);
        batch = [];
        bytes = 0;
        timedOut = undefined;
      }
      if (round !== this.#sendRounds || !health.usable()) return;
      const nowMs = this.#deps.now();
      if (untilMs <= nowMs) continue;
      const redisKey = keys.idempotency(key);
      const leftMs = Math.ceil(untilMs - nowMs);
      const failed = (err: unknown) => {
        if (isCommandTimeout(err)) timedOut = redisKey;
        health.failed(err, redisKey);
      };
      const encoded = encodeKeyRecord(record);
      bytes += encoded.length;
      if (record.state === 'done') {
        batch.push(client.set(redisKey, encoded, 'PX', leftMs, 'NX').then(() => health.answered(), failed));
        continue;
      }
      // A run of this instance that holds the key in Redis already (claimAgain claims it).
      if (this.#claimedInRedis.get(key)?.claim !== undefined) continue;
      const owner = record.owner!;
      // Remembered before the answer, as a claim whose answer is lost is: a run that ends meanwhile ends in Redis too.
      this.#claimedInRedis.set(key, { owner, untilMs });
      const sent = client.sgClaimKeyBuffer(redisKey, encoded.toString('utf8'), leftMs).then((held) => {
        health.answered();
        const claimed = this.#claimedInRedis.get(key);
        if (claimed?.owner !== owner || claimed.claim !== undefined) return;
        // Found held: by this very claim (an earlier one, whose answer was lost), or by another run, which keeps the key.
        const found = held === null ? record : decodeKeyRecord(held);
        if (found?.state === 'running' && found.owner === owner) claimed.claim = record;
        else this.#claimedInRedis.delete(key);
      }, failed);
      batch.push(sent);
    }
  }

  /**
   * Until Redis has answered a read of `redisKey` sent after the batch (answers come in order, on the key's connection):
   * a command that timed out is still on its way. Taken for answered, the walk sent the next batch every commandTimeoutMs
   * while Redis had not taken the last, and requests waited behind several. The read's own timeouts are the walk's wait,
   * not the request path's: they are not reported.
   */
  async #drained(redisKey: string, round: number): Promise<void> {
    const { client, health } = this.#deps;
    while (round === this.#sendRounds && health.usable()) {
      try {
        await client.exists(redisKey);
        health.answered();
        return;
      } catch (err) {
        if (!isCommandTimeout(err)) return;
      }
    }
  }

  /** Redis is back: the runs that ended meanwhile end there too, unless their claims have lapsed by themselves. */
  sendKeyEnds(): void {
    const { client, keys, health } = this.#deps;
    const nowMs = this.#deps.now();
    for (const [key, end] of this.#keyEnds) {
      this.#keyEnds.delete(key);
      if (end.untilMs <= nowMs) continue;
      const redisKey = keys.idempotency(key);
      const sent = end.record ? this.#writeEnd(redisKey, end.record, end.owner, end.untilMs - nowMs) : client.sgReleaseKey(redisKey, end.owner);
      sent.then(
        () => health.answered(),
        (err: unknown) => {
          health.failed(err, redisKey);
          if (!health.usable() && !this.#keyEnds.has(key)) this.#keyEnds.set(key, end);
        },
      );
    }
  }
}
