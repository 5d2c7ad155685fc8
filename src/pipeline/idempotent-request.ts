// A managed request under an idempotency key runs once. The first to claim the key runs it, detached from its client:
// a client that gives up (the tool call timed out at 3 s while the provider committed at 3.1 s) comes back under the
// same key and waits for that run's answer instead of starting a second one. A repeat after the answer gets it again.
// What is kept, and for how long, is in the state store: a fleet shares it through Redis.
import { randomUUID } from 'node:crypto';
import { PassThrough, Readable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import type { IdempotencyConfig } from '../config/schema.ts';
import type { WaitingBodies } from '../pools/waiting-bodies.ts';
import { drainingError, GatewayError } from '../errors.ts';
import { computeDeadline } from '../policy/deadline.ts';
import { fingerprintOf, IDEMPOTENCY_HEADER, idempotencyKeyOf, nextLookMs, repeatVerdict, scopedKey } from '../policy/idempotency.ts';
import type { CompiledRoute } from '../routing/router.ts';
import type { KeptAnswer, KeyRecord, StateStore } from '../state/store.ts';
import type { ManagedRequest, PipelineAnswer, RequestSummary } from './handle-request.ts';
import { holdLease } from './key-lease.ts';
import { backgroundRunsOn, endedWhole } from './stream-ends.ts';
import { streamShapeOf } from '../streaming/stream-events.ts';

export interface IdempotencyDeps {
  store: StateStore;
  /** waitForRedisMs is the Redis store's (redis-kept-keys.ts): the pipeline sees its claims only. */
  config: Omit<IdempotencyConfig, 'waitForRedisMs'>;
  now: () => number;
  random: () => number;
  /** The bytes of waiting bodies, shared with the pools and the parking lot: a repeat holds its body while it waits. */
  bodies?: WaitingBodies;
  /**
   * The owners of this instance's runs still going: with the state store away, a repeat's 409 says its run may be on
   * another instance only when it is none of these (a repeat of a run here was told to look elsewhere).
   */
  runsHere?: Set<string>;
}

/**
 * How long a run may hold its key past the route's timeout, its lease renewed (key-lease.ts), before it lets it go
 * unless its answer is a stream still being read: a whole answer comes within the route's timeout, a stream's output
 * may run on for minutes after it.
 */
const CLAIM_SLACK_MS = 30_000;

interface KeyedRequest {
  /** scopedKey() of the client's key. */
  key: string;
  /** fingerprintOf() of the request's body and query string. */
  fingerprint: string;
  /** The client sent no key: the body is the key (routes[].idempotency.bodyAsKeyMs). Refusals say so. */
  bodyIsKey?: boolean;
  /** This request's own claim id: a claim whose reply was lost is known again by it. */
  owner: string;
  /** How long its answer is kept for repeats: idempotency.ttlMs for a key the client sent, the route's bodyAsKeyMs for its body. */
  keptMs: number;
  /**
   * How long a run holds its key at most, from its claim, unless its answer is a stream still being read: the route's
   * timeout and CLAIM_SLACK_MS. Within it the claim is a lease of idempotency.leaseMs its instance renews.
   */
  runningMs: number;
  /** Bytes of the request's body: a repeat holds them while it waits, counted against server.maxWaitingBodyBytes. */
  bodyBytes?: number;
  /** When a repeat stops waiting for the run it found (its own deadline), ms since the epoch. */
  waitUntilMs: number;
  /** True once the repeat's client has left: it stops waiting. */
  clientGone: () => boolean;
  /** True once the instance is past its drain's grace period: a waiting repeat is answered 503 gateway_draining. */
  pastGrace: () => boolean;
  /**
   * A Responses API stream with `background: true`, or one that adds to a stored `conversation`: once its
   * response.created reached the client, the response runs on at the provider whatever becomes of the stream (or the
   * conversation has the turn), so a stream that broke after it is kept, not given back.
   */
  committedAtCreated?: boolean;
}

/** A managed request as the server has it, before the pipeline: what the pipeline gets, and whose it is. */
interface ArrivedRequest extends Pick<ManagedRequest, 'route' | 'path' | 'query' | 'rawBody' | 'json' | 'headers'> {
  /** The client key's name, when auth is on. */
  client: string | undefined;
  /** Since the request's head arrived, ms. */
  receivedMs: number;
  clientGone: () => boolean;
  pastGrace: () => boolean;
}

/**
 * The request's idempotency key, scoped, with what a repeat needs; undefined without one (or with keys off). Without
 * an Idempotency-Key, on a route with bodyAsKeyMs, the body is the key: an agent's retry sends the same bytes again.
 */
export function keyedRequest(req: ArrivedRequest, deps: IdempotencyDeps): KeyedRequest | undefined {
  if (!deps.config.enabled) return undefined;
  const sent = idempotencyKeyOf(req.headers);
  if (sent instanceof Error) throw new GatewayError('invalid_idempotency_key', sent.message, { param: IDEMPOTENCY_HEADER });
  // A key the client sent keeps its answer for ttlMs; without one, the body is the key only where the route says so.
  const keptMs = sent === undefined ? req.route.config.idempotency?.bodyAsKeyMs : deps.config.ttlMs;
  if (keptMs === undefined) return undefined;
  const fingerprint = fingerprintOf(req.rawBody, req.query);
  const { timeoutMs, deadlineMarginMs } = req.route.config;
  // A repeat waits for the run it finds at most until its own client would give up.
  const waited = computeDeadline({ routeTimeoutMs: timeoutMs, marginMs: deadlineMarginMs, headers: req.headers });
  return {
    // A space is no part of a key a client can send: no sent key can name a body's record, and replay its answer.
    key: scopedKey(req.client, req.path, sent ?? `body: ${fingerprint}`),
    fingerprint,
    bodyIsKey: sent === undefined,
    owner: randomUUID(),
    bodyBytes: req.rawBody.length,
    keptMs,
    runningMs: timeoutMs + CLAIM_SLACK_MS,
    waitUntilMs: deps.now() - req.receivedMs + waited.budgetMs,
    clientGone: req.clientGone,
    pastGrace: req.pastGrace,
    committedAtCreated: streamShapeOf(req.route.api, req.json).startsAtCreated !== undefined,
  };
}

export type KeyClaim =
  /**
   * This request runs: hand its answer to keep() before sending it, or giveBack() the key if it has none. `ended`
   * settles once the key holds how the run ended (a drain waits for it before it closes the store).
   */
  | { kind: 'run'; keep: (answer: PipelineAnswer) => PipelineAnswer; giveBack: () => void; ended: Promise<void> }
  /** A repeat: the answer the run under the key got. */
  | { kind: 'replay'; answer: KeptAnswer };

/** Claims the key, or waits for the run that holds it; throws the GatewayError a repeat that cannot be served gets. */
export async function claimKey(req: KeyedRequest, deps: IdempotencyDeps): Promise<KeyClaim> {
  const held = { waiting: false };
  try {
    return await claimOrWait(req, deps, held);
  } finally {
    if (held.waiting) deps.bodies?.give(req.bodyBytes ?? 0);
  }
}

/** claimKey's loop; `held.waiting` once its body counts among the waiting ones. */
async function claimOrWait(req: KeyedRequest, deps: IdempotencyDeps, held: { waiting: boolean }): Promise<KeyClaim> {
  const { store } = deps;
  let claimedAtMs = 0;
  const claim = () => {
    claimedAtMs = deps.now();
    // A lease: the run renews it (key-lease.ts); a claim whose instance died lapses within it.
    const leaseMs = Math.min(deps.config.leaseMs, req.runningMs);
    return store.claimKey(req.key, { state: 'running', fingerprint: req.fingerprint, sinceMs: claimedAtMs, owner: req.owner }, leaseMs);
  };
  let record = await claim();
  for (;;) {
    if (record === undefined) return run(req, deps, claimedAtMs);
    // Its own claim found again: the reply to it was lost (a Redis timeout), and it is this request's to run.
    if (record.state === 'running' && record.owner === req.owner) return run(req, deps, record.sinceMs);
    const verdict = repeatVerdict(record, req.fingerprint);
    if (verdict === 'replay') return { kind: 'replay', answer: (record as KeyRecord & { state: 'done' }).answer! };
    if (verdict === 'mismatch') {
      throw new GatewayError('idempotency_key_reused', 'this Idempotency-Key was sent before with a different request body; a new request needs a new key');
    }
    if (verdict === 'not-kept') {
      const bytes = (record as KeyRecord & { state: 'done' }).bytes;
      const again = req.bodyIsKey ? 'it runs again once bodyAsKeyMs has passed since that answer' : 'send a new key to run it again';
      throw new GatewayError(
        'idempotency_answer_not_kept',
        `${requestUnder(req)} has run, but its answer (${bytes} bytes) was longer than idempotency.maxAnswerBytes (or, kept in the process, idempotency.memoryBytes) and was not kept; ${again}`,
      );
    }
    // Running: look again shortly, until it ends, the repeat's own deadline, or its client leaves.
    const waitMs = nextLookMs(deps.random);
    // A repeat holds its body (and its connection) while it waits, as a queued request does, and nothing else bounds
    // how many wait on one run: 2,500 agents repeating one key of 300 KB behind a hanging provider took a 512 MB heap
    // past its limit. It fills only the half a pool's lowest class does: it takes nothing of a provider, and can come back.
    held.waiting ||= deps.bodies?.take(req.bodyBytes ?? 0, true) ?? true;
    const shed = !held.waiting;
    if (shed || req.pastGrace() || req.clientGone() || deps.now() + waitMs >= req.waitUntilMs) {
      // A claim whose reply was lost may be this request's own, unknown to it: given back (its owner's only), or the
      // key stayed held for runningMs with nothing running under it, and every repeat waited for it and got a 409.
      void store.releaseKey(req.key, req.owner);
      // As the requests in the pipeline are at that point: another instance can serve it (x-should-retry: true).
      if (req.pastGrace()) throw drainingError();
      const again = req.bodyIsKey ? 'send it again for its answer' : 'send it again, with the same key, for its answer';
      const full = shed ? ', and the request bodies waiting in the instance are at server.maxWaitingBodyBytes' : '';
      // Redis away: the run waited for may be one of another instance's, or one this instance cannot see (waitForRedisMs).
      const runOwner = record.state === 'running' ? record.owner : undefined;
      const elsewhere = store.degraded && !(runOwner !== undefined && deps.runsHere?.has(runOwner));
      const running = elsewhere ? 'may still be running on another instance (the state store is away)' : 'is still running';
      throw new GatewayError('idempotency_key_in_progress', `${requestUnder(req)} ${running}${full}; ${again}`, {
        shouldRetry: true,
        retryAfterMs: 1000,
      });
    }
    await sleep(waitMs);
    record = await store.readKey(req.key, deps.now());
    // Given back (its run ended without an answer to keep) or lapsed: this repeat runs it, if it is the first to claim it.
    if (record === undefined) record = await claim();
  }
}

/** The request a repeat found under its key, as its refusals name it: a keyless one never sent an Idempotency-Key. */
function requestUnder(req: KeyedRequest): string {
  return req.bodyIsKey ? 'the same request (this body, on a route with idempotency.bodyAsKeyMs)' : 'the request under this Idempotency-Key';
}

/**
 * The run's side of the key: keeps its answer when it is one (a whole 2xx, or a stream read to its end), else gives the
 * key back, and the next repeat runs the request again. A failure the provider may have run (a 500, a timeout) cannot
 * be told from one it did not, and kept, it would fail the key's every retry for ttlMs, for a chat call that costs only
 * tokens to run again. A stream is read to its end whether or not its client is still there. The claim, made at
 * `claimedAtMs`, is renewed from now until the run ends (key-lease.ts).
 */
function run(req: KeyedRequest, deps: IdempotencyDeps, claimedAtMs: number): KeyClaim & { kind: 'run' } {
  const { store, config } = deps;
  const { key, fingerprint, owner } = req;
  const lease = holdLease(key, owner, claimedAtMs + req.runningMs, { store, now: deps.now, leaseMs: config.leaseMs });
  let end!: () => void;
  const ended = new Promise<void>((resolve) => (end = resolve));
  deps.runsHere?.add(owner);
  void ended.finally(() => deps.runsHere?.delete(owner));
  const giveBack = () => {
    lease.stop();
    void store.releaseKey(key, owner).finally(end);
  };
  const keep = (answer: PipelineAnswer): PipelineAnswer => {
    if (answer.summary.outcome !== 'success') {
      giveBack();
      return answer;
    }
    const settle = (kind: 'whole' | 'stream', body: Buffer | undefined, bytes: number) => {
      lease.stop();
      const { target, priority } = answer.summary;
      const kept = body !== undefined && { answer: { status: answer.status, headers: answer.headers, kind, body, target, priority } };
      void store.settleKey(key, { state: 'done', fingerprint, bytes, ...kept }, req.keptMs, deps.now(), owner).finally(end);
    };
    const { body } = answer;
    if (Buffer.isBuffer(body)) {
      settle('whole', body.length <= config.maxAnswerBytes ? body : undefined, body.length);
      return answer;
    }
    // A stream the gateway answers is a LiveStream's; nothing else streams a success.
    const { live } = answer;
    if (!(body instanceof Readable) || live === undefined) {
      giveBack();
      return answer;
    }
    lease.streaming();
    return {
      ...answer,
      // A client that stops reading is let go well before the stream would give up on it (and cut the run with it).
      body: readToTheEnd(body, config.maxAnswerBytes, live.clientStallMs / 2, (kept, bytes) => {
        const how = answer.summary.streamEnd?.kind;
        if (how !== undefined && endedWhole(how)) settle('stream', kept, bytes);
        // A background response broken off while it may still run at the provider: a repeat that ran it again would
        // start a second one beside it (what the gateway never does itself). It gets the same id, to retrieve it by.
        // A conversation's turn likewise: given back, the key let a repeat append the turn to the conversation again.
        else if (req.committedAtCreated && how !== undefined && backgroundRunsOn(how)) settle('stream', kept, bytes);
        else giveBack();
      }),
    };
  };
  return { kind: 'run', keep, giveBack, ended };
}

/**
 * The stream as its client reads it, while every chunk is also kept (up to maxBytes). The client's pace holds the
 * upstream back as before; once the client has left, the rest is read anyway, so the answer its repeat waits for is
 * whole. A client still connected that takes nothing for `letGoAfterMs` is let go (its connection closed, as when a
 * stream's client stalls) and the rest read without it: held back, the stream would give up on its stalled client
 * and cut the run with it, and the key would go back with the provider's work thrown away.
 */
function readToTheEnd(body: Readable, maxBytes: number, letGoAfterMs: number, done: (kept: Buffer | undefined, bytes: number) => void): Readable {
  const out = new PassThrough();
  let chunks: Buffer[] | undefined = [];
  let bytes = 0;
  let ended = false;
  let letGo: NodeJS.Timeout | undefined;
  // A stream body is bytes (streaming/stream-body.ts pushes its events into a byte-mode Readable).
  const take = (chunk: Buffer) => {
    bytes += chunk.length;
    if (chunks && bytes <= maxBytes) chunks.push(chunk);
    else chunks = undefined;
    if (out.destroyed || out.write(chunk)) return;
    body.pause();
    letGo ??= setTimeout(() => out.destroy(), letGoAfterMs);
  };
  // What is already in hand (the first output, which the server writes with the head at once) goes through now.
  for (let chunk = body.read() as Buffer | null; chunk !== null; chunk = body.read() as Buffer | null) take(chunk);
  body.on('data', take);
  out.on('drain', () => {
    clearTimeout(letGo);
    letGo = undefined;
    body.resume();
  });
  out.once('close', () => {
    clearTimeout(letGo);
    body.resume();
  });
  body.once('end', () => {
    ended = true;
    done(chunks && Buffer.concat(chunks), bytes);
    out.end();
  });
  body.once('close', () => {
    // Cut short without its end (the instance shut down, the upstream failed hard): no answer to keep.
    if (!ended) done(undefined, bytes);
    if (!out.destroyed && !ended) out.destroy();
  });
  body.once('error', (err) => out.destroy(err));
  return out;
}

/** The kept answer as the pipeline's answer shape, for the server to send as it sends any other. */
export function replayed(kept: KeptAnswer): { status: number; headers: Record<string, string>; body: Buffer } {
  return { status: kept.status, headers: { ...kept.headers, 'idempotent-replayed': 'true' }, body: kept.body };
}

/**
 * What the request log and the metrics know of a replay: the route, the target key and priority class the run was
 * counted under (not x-stormgate-target, which names the model as the client sent it: no bounded label), no attempts.
 */
export function replaySummary(route: CompiledRoute, kept: KeptAnswer): RequestSummary {
  return { route: route.name, target: kept.target, priority: kept.priority, outcome: 'replayed', attempts: [], budgetMs: 0, deadlineSource: 'route', skipped: [], idempotency: 'replayed' };
}
