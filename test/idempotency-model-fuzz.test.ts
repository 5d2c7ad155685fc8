// Seeded model-based tests of idempotency keys (README "Idempotency keys"): random sequences of requests under a few
// keys (the same body, another body, repeats while the run goes on, clients that leave), runs that end in every way
// (an answer, one too long to keep, an error that gives the key back, a stream read to its end or broken, its client
// gone), time passing past claims and ttlMs, and answers enough to pass memoryBytes, beside a plain model written from
// the README. The unit part drives claimKey() and its run (pipeline/idempotent-request.ts) on the in-process store with
// a fake clock; the fleet part drives two RedisStores on one real redis-server, stopped and restarted mid-sequence.
// A disagreement found this way also has a small named test (at the end).
import { randomUUID } from 'node:crypto';
import { PassThrough } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { isDeepStrictEqual } from 'node:util';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { GatewayError } from '../src/errors.ts';
import type { PipelineAnswer, RequestSummary } from '../src/pipeline/handle-request.ts';
import { claimKey, type IdempotencyDeps, type KeyClaim } from '../src/pipeline/idempotent-request.ts';
import type { LiveStream } from '../src/pipeline/live-stream.ts';
import { STREAM_END_KINDS, endedWhole, type StreamEndKind } from '../src/pipeline/stream-ends.ts';
import { seededRandom, type Random } from '../src/policy/random.ts';
import { WaitingBodies } from '../src/pools/waiting-bodies.ts';
import { SWEEP_EVERY_MS } from '../src/state/kept-keys.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import { RedisStore } from '../src/state/redis-store.ts';
import type { KeptAnswer, StateStore } from '../src/state/store.ts';
import { startRedis, useRedisServerWithAdmin, type RedisHandle } from './helpers/redis-server.ts';
import { eventually } from './helpers/redis-stores.ts';
import { startTcpProxy } from './helpers/tcp-proxy.ts';

// A repeat looks again after a sleep from node:timers/promises: routed through the global timers, so the fake clock of
// the unit part drives the looks too (the fleet part runs on the real timers, which this is then).
vi.mock('node:timers/promises', async (importOriginal) => {
  const real = await importOriginal<typeof import('node:timers/promises')>();
  return { ...real, setTimeout: <T>(ms: number, value?: T) => new Promise<T>((resolve) => globalThis.setTimeout(() => resolve(value as T), ms)) };
});

/** A failing case names its seed and step; FUZZ_SEED and FUZZ_SEEDS move and widen the hunt, as in the other fuzz files. */
const SEEDS = Number(process.env.FUZZ_SEEDS ?? 1);
const BASE_SEED = Number(process.env.FUZZ_SEED ?? 20_250_611);

// The README's numbers: a repeat looks every 75-150 ms; a claim is a lease its run renews (idempotency.leaseMs) for
// the route's timeoutMs plus 30 s at most, and while a stream is read.
const LOOK_MAX_MS = 150;
const TIMEOUT_MS = 20_000;
const RUNNING_MS = TIMEOUT_MS + 30_000;
/** Slack for "looks every 150 ms at most": a look that lands on the tick the answer did counts for the next one. */
const LOOK_SLACK_MS = LOOK_MAX_MS + 10;

function gen(random: Random) {
  const int = (lo: number, hi: number) => lo + Math.floor(random() * (hi - lo + 1));
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(random() * xs.length)]!;
  const chance = (p: number) => random() < p;
  return { int, pick, chance };
}

/** Lets what a step set going (settles, stream ends, the looks' store calls) run to where it waits on the clock. */
async function flush(): Promise<void> {
  for (let i = 0; i < 6; i++) await new Promise((resolve) => setImmediate(resolve));
}

const summary = (outcome: RequestSummary['outcome']): RequestSummary =>
  ({ route: 'tool', target: 'mock/tool', priority: 'online', outcome, attempts: [], budgetMs: TIMEOUT_MS, deadlineSource: 'route', skipped: [] }) as RequestSummary;

// ------------------------------------------------------------------------------------------------------------------
// The model: one key's state as the README describes it.
// ------------------------------------------------------------------------------------------------------------------

type ModelKey =
  | { kind: 'free'; sinceMs: number }
  /** A run holds the key; a whole answer's claim lapses at lapseAtMs, a stream's is renewed while it is read. */
  | { kind: 'running'; owner: string; fp: string; sinceMs: number; lapseAtMs: number }
  /** How a run ended; `answer` absent: longer than maxAnswerBytes. `seq`: the order answers were kept in (eviction). */
  | { kind: 'done'; fp: string; answer: KeptAnswer | undefined; bytes: number; sinceMs: number; expiresAtMs: number; seq: number };

/** The key's state at `t`, with the claims that lapsed and the answers that expired by then taken out. */
function viewAt(k: ModelKey, t: number): ModelKey {
  if (k.kind === 'running' && k.lapseAtMs <= t) return { kind: 'free', sinceMs: k.lapseAtMs };
  if (k.kind === 'done' && k.expiresAtMs <= t) return { kind: 'free', sinceMs: k.expiresAtMs };
  return k;
}

/** The bytes an answer is counted for, at least (README: "headers and records counted"): its body and headers. */
function lowerBytes(a: KeptAnswer): number {
  let n = a.body.length;
  for (const [name, value] of Object.entries(a.headers)) n += name.length + value.length;
  return n;
}
/** At most: with a record's own bookkeeping, generously. */
const upperBytes = (key: string, fp: string, a: KeptAnswer | undefined) => (a ? lowerBytes(a) : 0) + key.length + fp.length + 512;

// ------------------------------------------------------------------------------------------------------------------
// The unit part: claimKey() and its run on the in-process store, fake clock.
// ------------------------------------------------------------------------------------------------------------------

interface Req {
  id: number;
  key: string;
  fp: string;
  owner: string;
  bodyBytes: number;
  sentAtMs: number;
  /** ttlMs for a key the client sent; a route's bodyAsKeyMs for a body that is its key (odd keys here). */
  keptMs: number;
  waitUntilMs: number;
  goneAtMs?: number;
  state: 'pending' | 'done';
  outcome?: string;
}

interface Run {
  req: Req;
  claim: KeyClaim & { kind: 'run' };
  startedAtMs: number;
  phase: 'pipeline' | 'stream' | 'ended';
  stream?: { upstream: PassThrough; client?: PassThrough; chunks: Buffer[]; answer: PipelineAnswer; clientLeft: boolean };
}

interface UnitOptions {
  steps: number;
  keys: number;
  ttlMs: number;
  bodyAsKeyMs: number;
  maxAnswerBytes: number;
  memoryBytes: number;
}

/** Runs one seeded sequence; returns what went wrong (empty when the store agreed with the model throughout). */
async function unitSequence(seed: number, o: UnitOptions): Promise<string[]> {
  const g = gen(seededRandom(seed));
  const store: StateStore = new MemoryStore({ keptBytes: o.memoryBytes });
  const bodies = new WaitingBodies(1e12);
  const deps: IdempotencyDeps = { store, config: { enabled: true, ttlMs: o.ttlMs, maxAnswerBytes: o.maxAnswerBytes, memoryBytes: o.memoryBytes, leaseMs: 10_000 }, now: () => Date.now(), random: seededRandom(seed ^ 0x5eed), bodies };
  const keys = Array.from({ length: o.keys }, (_, i) => `key-${i}`);
  const model = new Map<string, ModelKey>(keys.map((k) => [k, { kind: 'free', sinceMs: Date.now() }]));
  const requests: Req[] = [];
  const runs: Run[] = [];
  const problems: string[] = [];
  const log: string[] = [];
  let seq = 0;
  let step = 0;
  const fail = (what: string) => problems.push(`seed ${seed} step ${step} t+${Date.now() - T0}: ${what}\n  recent: ${log.slice(-14).join('\n          ')}`);
  const note = (what: string) => log.push(`#${step} t+${Date.now() - T0} ${what}`);

  /** What the request's claimKey came back with, checked against the model at the moment it did. */
  const claimed = (req: Req, result: KeyClaim | GatewayError) => {
    const t = Date.now();
    req.state = 'done';
    const v = viewAt(model.get(req.key)!, t);
    const outcome = result instanceof GatewayError ? result.code : result.kind;
    req.outcome = outcome;
    note(`r${req.id} (${req.key} ${req.fp}) -> ${outcome} [model ${v.kind}${v.kind !== 'free' ? ' ' + v.fp : ''}]`);
    if (result instanceof GatewayError) {
      if (result.code === 'idempotency_key_reused') {
        if (v.kind === 'free' || v.fp === req.fp) fail(`r${req.id} got 422 reused, but the key holds ${v.kind === 'free' ? 'nothing' : 'the same body'}`);
      } else if (result.code === 'idempotency_answer_not_kept') {
        if (v.kind !== 'done' || v.answer !== undefined || v.fp !== req.fp) fail(`r${req.id} got 409 not kept; model: ${v.kind}`);
      } else if (result.code === 'idempotency_key_in_progress') {
        const gaveUp = req.goneAtMs !== undefined || t + LOOK_MAX_MS >= req.waitUntilMs;
        // It saw a run of its body at its last look, at most 150 ms ago.
        const sawRun = (v.kind === 'running' && v.fp === req.fp) || t - v.sinceMs <= LOOK_SLACK_MS;
        if (!gaveUp || !sawRun) fail(`r${req.id} got 409 in progress (gave up: ${gaveUp}, a run to see: ${sawRun})`);
      } else fail(`r${req.id} failed with ${result.code}`);
      return;
    }
    if (result.kind === 'replay') {
      if (v.kind !== 'done' || v.fp !== req.fp || v.answer === undefined) return fail(`r${req.id} replayed, but the model has ${v.kind}`);
      if (!isDeepStrictEqual(result.answer, v.answer)) fail(`r${req.id} replayed another answer than the one kept`);
      return;
    }
    // A run: the key must be free (or its answer dropped for room: the probe checks that order).
    if (v.kind === 'running') fail(`r${req.id} runs while r-owner ${v.owner} still holds the key: two runs at once`);
    if (v.kind === 'done') evictions.push({ key: req.key, seq: v.seq, atMs: t });
    model.set(req.key, { kind: 'running', owner: req.owner, fp: req.fp, sinceMs: t, lapseAtMs: t + RUNNING_MS });
    runs.push({ req, claim: result, startedAtMs: t, phase: 'pipeline' });
  };
  /** Answers dropped for room, seen when a claim or a probe found them gone: checked for order at the step's end. */
  const evictions: Array<{ key: string; seq: number; atMs: number }> = [];

  const send = () => {
    const key = g.pick(keys);
    const held = model.get(key)!;
    // Mostly the key's own body (a retry), sometimes another (a client that reuses keys).
    const fp = held.kind !== 'free' && g.chance(0.85) ? held.fp : g.pick(['body-a', 'body-b', 'body-c']);
    const waitMs = g.pick([50, 200, 600, 2_000, TIMEOUT_MS - 1_000]);
    const keptMs = keys.indexOf(key) % 2 === 1 ? o.bodyAsKeyMs : o.ttlMs;
    const req: Req = { id: requests.length, key, fp, owner: `owner-${requests.length}`, keptMs, bodyBytes: g.int(10, 500), sentAtMs: Date.now(), waitUntilMs: Date.now() + waitMs, state: 'pending' };
    requests.push(req);
    note(`send r${req.id} ${key} ${fp} wait ${waitMs}`);
    claimKey(
      { key, fingerprint: fp, owner: req.owner, keptMs, runningMs: RUNNING_MS, bodyBytes: req.bodyBytes, waitUntilMs: req.waitUntilMs, clientGone: () => req.goneAtMs !== undefined, pastGrace: () => false },
      deps,
    ).then(
      (r) => claimed(req, r),
      (err: unknown) => (err instanceof GatewayError ? claimed(req, err) : fail(`r${req.id} threw ${String(err)}`)),
    );
  };

  /** The model's side of a run's end: its answer kept (unless another run holds the key), or the key given back. */
  const ended = (run: Run, kept: { answer: KeptAnswer | undefined; bytes: number } | undefined) => {
    run.phase = 'ended';
    const t = Date.now();
    const v = viewAt(model.get(run.req.key)!, t);
    const own = v.kind === 'running' && v.owner === run.req.owner;
    if (kept === undefined) {
      if (own) model.set(run.req.key, { kind: 'free', sinceMs: t });
      return;
    }
    // Not over another run's claim (taken after this one's lapsed).
    if (v.kind === 'running' && !own) return;
    model.set(run.req.key, { kind: 'done', fp: run.req.fp, answer: kept.answer, bytes: kept.bytes, sinceMs: t, expiresAtMs: t + run.req.keptMs, seq: ++seq });
  };

  const endWhole = (run: Run) => {
    const how = g.pick(['answer', 'answer', 'answer', 'error', 'gateway', 'degraded', 'throw'] as const);
    note(`end r${run.req.id} ${how}`);
    if (how === 'throw') {
      run.claim.giveBack();
      return ended(run, undefined);
    }
    if (how === 'answer') {
      const size = g.chance(0.15) ? g.int(o.maxAnswerBytes - 5, o.maxAnswerBytes + 50) : g.int(0, Math.floor(o.maxAnswerBytes * 0.8));
      const body = Buffer.alloc(size, 0x61 + (run.req.id % 26));
      const headers = { 'content-type': 'application/json', 'x-request-id': `req-${run.req.id}`, 'x-stormgate-target': 'mock/tool', ...(g.chance(0.5) && { 'x-upstream-padding': 'p'.repeat(g.int(1, 300)) }) };
      run.claim.keep({ status: 200, headers, body, summary: summary('success') });
      const answer: KeptAnswer | undefined = size <= o.maxAnswerBytes ? { status: 200, headers, kind: 'whole', body, target: 'mock/tool', priority: 'online' } : undefined;
      return ended(run, { answer, bytes: size });
    }
    // An upstream error after the retries the route allows, the gateway's own answer, a degraded answer: no answer kept.
    const status = how === 'error' ? g.pick([400, 429, 500, 502]) : how === 'gateway' ? 503 : 200;
    const outcome = how === 'error' ? 'upstream_error' : how === 'gateway' ? 'shed' : 'degraded';
    run.claim.keep({ status, headers: { 'content-type': 'application/json' }, body: Buffer.from('{"error":{}}'), summary: summary(outcome) });
    ended(run, undefined);
  };

  const startStream = (run: Run) => {
    note(`stream r${run.req.id}`);
    const upstream = new PassThrough();
    const headers = { 'content-type': 'text/event-stream', 'x-request-id': `req-${run.req.id}`, 'x-stormgate-target': 'mock/tool' };
    const answer: PipelineAnswer = { status: 200, headers, body: upstream, summary: summary('success'), live: { clientStallMs: 20_000 } as unknown as LiveStream };
    const first = Buffer.from(`data: {"n":0,"r":${run.req.id}}\n\n`);
    upstream.write(first);
    const out = run.claim.keep(answer);
    const client = out.body as PassThrough;
    client.on('data', () => undefined);
    client.on('error', () => undefined);
    run.phase = 'stream';
    run.stream = { upstream, client, chunks: [first], answer, clientLeft: false };
    // Renewed every 10 s while it is read: it does not lapse (model).
    const m = model.get(run.req.key)!;
    if (m.kind === 'running' && m.owner === run.req.owner) m.lapseAtMs = Infinity;
  };

  const streamChunk = (run: Run) => {
    const chunk = Buffer.from(`data: {"n":${run.stream!.chunks.length},"pad":"${'x'.repeat(g.int(0, 200))}"}\n\n`);
    run.stream!.chunks.push(chunk);
    run.stream!.upstream.write(chunk);
  };

  const endStream = async (run: Run) => {
    const s = run.stream!;
    const kind = g.pick<StreamEndKind>([...STREAM_END_KINDS, 'complete', 'complete']);
    const abrupt = !endedWhole(kind) && g.chance(0.5);
    note(`stream end r${run.req.id} ${kind}${abrupt ? ' (destroyed)' : ''}`);
    s.answer.summary.streamEnd = { kind, events: s.chunks.length, droppedMalformed: 0 };
    if (abrupt) s.upstream.destroy();
    else {
      if (endedWhole(kind)) {
        const done = Buffer.from('data: [DONE]\n\n');
        s.chunks.push(done);
        s.upstream.write(done);
      }
      s.upstream.end();
    }
    await flush();
    if (run.phase !== 'stream') return;
    if (!endedWhole(kind)) return ended(run, undefined);
    const body = Buffer.concat(s.chunks);
    const answer: KeptAnswer | undefined = body.length <= o.maxAnswerBytes ? { status: 200, headers: s.answer.headers, kind: 'stream', body, target: 'mock/tool', priority: 'online' } : undefined;
    ended(run, { answer, bytes: body.length });
  };

  /** Everything the store holds agrees with the model: the key's claim or answer, nothing past ttl, memory bounded. */
  /** `claimsDuring`: the runs that may have held a claim at some moment of the step (live at its start, or started in it). */
  const probe = async (stepStartMs: number, aliveAtStart: Array<{ key: string; m: ModelKey & { kind: 'done' } }>, claimsDuring: number) => {
    const t = Date.now();
    let presentLower = 0;
    const present = new Map<string, ModelKey & { kind: 'done' }>();
    for (const key of keys) {
      const v = viewAt(model.get(key)!, t);
      // A read drops an expired record: the free keys are read only now and then, so expired ones stay in the map
      // between, as they do in a gateway, for the byte cap to count or not.
      if (v.kind === 'free' && step % 20 !== 0) continue;
      const r = await store.readKey(key, t);
      if (v.kind === 'free') {
        if (r !== undefined) fail(`${key}: the store holds a ${r.state} record (${r.fingerprint}) the model does not: ${r.state === 'running' ? 'a claim left held' : 'kept past ttl or given back'}`);
      } else if (v.kind === 'running') {
        if (r?.state !== 'running' || r.owner !== v.owner) fail(`${key}: ${v.owner}'s claim should hold it; the store has ${r ? r.state + ' ' + (r.state === 'running' ? r.owner : r.fingerprint) : 'nothing'}`);
      } else if (r === undefined) {
        // Dropped for room (memoryBytes): checked below.
        evictions.push({ key, seq: v.seq, atMs: t });
        model.set(key, { kind: 'free', sinceMs: t });
      } else if (r.state !== 'done' || r.fingerprint !== v.fp || r.bytes !== v.bytes || !isDeepStrictEqual(r.answer, v.answer)) {
        fail(`${key}: the store's record is not the answer kept (${r.state} ${r.fingerprint})`);
      } else {
        present.set(key, v);
        if (v.answer) presentLower += lowerBytes(v.answer);
      }
    }
    if (presentLower > o.memoryBytes) fail(`answers of ${presentLower} bytes kept, memoryBytes is ${o.memoryBytes}`);
    // Oldest first: an answer dropped for room leaves none older than it kept; and only when room was short.
    for (const e of evictions.splice(0)) {
      for (const [key, m] of present) if (m.seq < e.seq) fail(`${e.key}'s answer (#${e.seq}) was dropped for room while ${key}'s, older (#${m.seq}), is still kept`);
      // A claim is counted against the cap while held: one held when the answer was dropped may have ended since (the
      // sequence's end ends every run in one step; seed 9004).
      const running = Math.max(claimsDuring, keys.map((k) => model.get(k)!).filter((m) => m.kind === 'running').length);
      const newer = aliveAtStart.filter(({ m }) => m.seq >= e.seq).reduce((n, { key, m }) => n + upperBytes(key, m.fp, m.answer), 0);
      const justKept = [...model.entries()].filter(([, m]) => m.kind === 'done' && m.sinceMs >= stepStartMs).reduce((n, [key, m]) => n + upperBytes(key, (m as ModelKey & { kind: 'done' }).fp, (m as ModelKey & { kind: 'done' }).answer), 0);
      if (newer + justKept + running * 600 <= o.memoryBytes) fail(`${e.key}'s answer (#${e.seq}) was dropped with room to spare (${newer + justKept} bytes of answers, memoryBytes ${o.memoryBytes})`);
    }
    // Every waiting repeat has been answered once it could be: its client gone, its deadline, or the run's end seen.
    let waitingBytes = 0;
    for (const req of requests) {
      if (req.state !== 'pending') continue;
      waitingBytes += req.bodyBytes;
      const v = viewAt(model.get(req.key)!, t);
      if (req.goneAtMs !== undefined && t - req.goneAtMs >= LOOK_SLACK_MS) fail(`r${req.id} still waits ${t - req.goneAtMs} ms after its client left`);
      if (t >= req.waitUntilMs) fail(`r${req.id} still waits past its own deadline`);
      if (!(v.kind === 'running' && v.fp === req.fp) && t - Math.max(v.sinceMs, req.sentAtMs) >= LOOK_SLACK_MS) fail(`r${req.id} still waits, ${t - v.sinceMs} ms after its key went ${v.kind}`);
    }
    if (bodies.bytes < 0 || bodies.bytes > waitingBytes) fail(`waiting bodies count ${bodies.bytes} bytes, the waiting repeats hold ${waitingBytes}`);
  };

  for (step = 0; step < o.steps && problems.length === 0; step++) {
    const stepStartMs = Date.now();
    // For the room an answer dropped for room had: one expired less than SWEEP_EVERY_MS ago may still take some.
    const aliveAtStart = keys.flatMap((key) => {
      const m = viewAt(model.get(key)!, stepStartMs - SWEEP_EVERY_MS);
      return m.kind === 'done' ? [{ key, m }] : [];
    });
    const live = runs.filter((r) => r.phase !== 'ended');
    const runsAtStart = runs.length;
    const pending = requests.filter((r) => r.state === 'pending');
    const roll = g.int(0, 99);
    if (roll < 30) send();
    else if (roll < 34 && pending.length > 0) {
      const req = g.pick(pending);
      req.goneAtMs = Date.now();
      note(`client of r${req.id} leaves`);
    } else if (roll < 50 && live.some((r) => r.phase === 'pipeline')) {
      const run = g.pick(live.filter((r) => r.phase === 'pipeline'));
      // A stream's first output comes within the route's timeout (its deadline); a whole answer may come late (a run
      // on an instance cut off so long its claim lapsed).
      if (Date.now() - run.startedAtMs < TIMEOUT_MS && g.chance(0.35)) startStream(run);
      else endWhole(run);
    } else if (roll < 58 && live.some((r) => r.phase === 'stream')) {
      const run = g.pick(live.filter((r) => r.phase === 'stream'));
      if (g.chance(0.6)) streamChunk(run);
      else if (g.chance(0.2) && !run.stream!.clientLeft) {
        note(`stream client of r${run.req.id} leaves`);
        run.stream!.clientLeft = true;
        run.stream!.client!.destroy();
      } else await endStream(run);
    } else {
      const ms = g.pick([g.int(1, 160), g.int(1, 160), g.int(100, 1_500), g.int(1_000, 8_000), g.int(o.ttlMs / 2, o.ttlMs + 5_000), RUNNING_MS + g.int(-50, 50)]);
      note(`advance ${ms} ms`);
      await vi.advanceTimersByTimeAsync(ms);
    }
    await flush();
    await probe(stepStartMs, aliveAtStart, live.length + runs.length - runsAtStart);
  }

  // The sequence's end: every run ends, every repeat is answered, and no key is left held by a claim.
  const endStartMs = Date.now();
  const aliveAtEnd = keys.flatMap((key) => {
    const m = viewAt(model.get(key)!, endStartMs - SWEEP_EVERY_MS);
    return m.kind === 'done' ? [{ key, m }] : [];
  });
  const liveAtEnd = runs.filter((r) => r.phase !== 'ended').length;
  const runsAtEnd = runs.length;
  for (const run of runs.filter((r) => r.phase !== 'ended')) {
    if (run.phase === 'pipeline') endWhole(run);
    else await endStream(run);
  }
  await vi.advanceTimersByTimeAsync(TIMEOUT_MS);
  await flush();
  for (const run of runs.filter((r) => r.phase === 'pipeline')) endWhole(run);
  await flush();
  step = o.steps;
  await probe(endStartMs, aliveAtEnd, liveAtEnd + runs.length - runsAtEnd);
  if (requests.some((r) => r.state === 'pending')) fail('repeats still waiting at the end');
  for (const key of keys) {
    const r = await store.readKey(key, Date.now());
    if (r?.state === 'running') fail(`${key} is still claimed (${r.owner}) after every run ended`);
  }
  if (bodies.bytes !== 0) fail(`waiting bodies still count ${bodies.bytes} bytes`);
  await store.close();
  return problems;
}

const T0 = 1_800_000_000_000;

describe('idempotency keys against the README model: in-process store, fake clock', () => {
  const rejections: unknown[] = [];
  const onRejection = (err: unknown) => rejections.push(err);
  beforeEach(() => {
    vi.useFakeTimers({ now: T0, toFake: ['setTimeout', 'clearTimeout', 'setInterval', 'clearInterval', 'Date'] });
    process.on('unhandledRejection', onRejection);
  });
  afterEach(() => {
    vi.useRealTimers();
    process.off('unhandledRejection', onRejection);
  });

  it.each(Array.from({ length: SEEDS }, (_, i) => BASE_SEED + i))('agrees with the model over 2,500 random steps (seed %i)', async (seed) => {
    const problems = await unitSequence(seed, { steps: 2_500, keys: 10, ttlMs: 60_000, bodyAsKeyMs: 4_000, maxAnswerBytes: 1_500, memoryBytes: 5_000 });
    expect(problems.slice(0, 3).join('\n\n')).toBe('');
    expect(rejections).toEqual([]);
  });
});

// ------------------------------------------------------------------------------------------------------------------
// The fleet part: two RedisStores on one real redis-server, real time, Redis stopped and restarted (empty) mid-run.
// ------------------------------------------------------------------------------------------------------------------

interface FleetRun {
  id: number;
  inst: number;
  key: string;
  fp: string;
  claim: KeyClaim & { kind: 'run' };
  /**
   * No other instance may run the key beside it once the fleet is on Redis (README): claimed in Redis while the fleet
   * was on it, or claimed in the process while Redis was away with no other record of the key about (no run of it,
   * no answer another instance may keep), which its instance claims in Redis once back. False once another run
   * starts beside it: in the moment before the claims are made again, both may run.
   */
  fleetWide: boolean;
  /** Claimed in Redis (its instance was on it then). */
  inRedis: boolean;
  /**
   * Claimed outside the clean fleet while another instance's record of the key was about (an answer or an end it may
   * keep and write back once on Redis): that record may be what Redis holds when this run ends, so this run's answer
   * may stay on its own instance, as under a claim (seed 7784 under load: instance 1's end of a run of another body,
   * written back after Redis restarted, held the key when instance 0's run of body-0 ended).
   */
  contested: boolean;
  /**
   * `underClaim`: another run was going when this one ended, and may have held the key in Redis, so its answer may
   * have stayed on its instance.
   * `offRedis`: its instance was off Redis when it ended, so its end waited for Redis to come back.
   */
  ended?: { atMs: number; body?: Buffer; tooLong?: boolean; clean: boolean; epoch: number; underClaim?: boolean; offRedis?: boolean };
}

interface FleetReq {
  id: number;
  inst: number;
  key: string;
  fp: string;
  sentAtMs: number;
  waitUntilMs: number;
  goneAtMs?: number;
  pending: boolean;
  outcome?: string;
}

/** How long a kept answer lasts here (ttlMs), and the slack real timers and Redis's own expiry get. */
const FLEET_KEPT_MS = 4_000;
const FLEET_SLACK_MS = 400;
/** How long a run's end may take to reach Redis, and a claim to come back (a loaded machine): a claim sent meanwhile runs. */
const SETTLED_MS = 300;
/** After both stores are back on Redis, the moment the README allows before their claims are made again. */
const RECLAIM_GRACE_MS = 700;

async function fleetSequence(seed: number, redis: RedisHandle, admin: () => import('ioredis').Redis, steps: number): Promise<string[]> {
  const g = gen(seededRandom(seed));
  const keyPrefix = `idemfuzz-${randomUUID()}`;
  const stores = [0, 1].map(() => new RedisStore({ config: { redis: redis.url, commandTimeoutMs: 250, keyPrefix } }));
  const deps: IdempotencyDeps[] = stores.map((store, i) => ({ store, config: { enabled: true, ttlMs: FLEET_KEPT_MS, maxAnswerBytes: 2_000, memoryBytes: 1 << 20, leaseMs: 10_000 }, now: Date.now, random: seededRandom(seed + i + 1) }));
  const keys = ['key-0', 'key-1', 'key-2'];
  const usual = new Map(keys.map((k, i) => [k, `body-${i}`]));
  const runs: FleetRun[] = [];
  const reqs: FleetReq[] = [];
  const problems: string[] = [];
  const log: string[] = [];
  const T = Date.now();
  let step = 0;
  let redisUp = true;
  let epoch = 0;
  let stops = 0;
  /** From when the fleet is on Redis with every claim made again (README), until Redis is stopped. */
  let cleanFromMs = Date.now();
  const clean = () => redisUp && Date.now() >= cleanFromMs && stores.every((s) => !s.degraded);
  const fail = (what: string) => problems.push(`fleet seed ${seed} step ${step} t+${Date.now() - T}: ${what}\n  recent: ${log.slice(-(Number(process.env.FUZZ_LOG ?? 16))).join('\n          ')}`);
  const note = (what: string) => log.push(`#${step} t+${Date.now() - T} ${what}`);
  try {
    for (const s of stores) if (!(await s.ready())) throw new Error('a store did not get on Redis');

    const claimed = (req: FleetReq, result: KeyClaim | GatewayError) => {
      const t = Date.now();
      req.pending = false;
      req.outcome = result instanceof GatewayError ? result.code : result.kind;
      const live = runs.filter((r) => r.key === req.key && r.ended === undefined);
      const endedRuns = runs.filter((r) => r.key === req.key && r.ended !== undefined);
      note(`r${req.id}@${req.inst} (${req.key} ${req.fp}) -> ${req.outcome}${clean() ? '' : ' (not clean)'}`);
      if (result instanceof GatewayError) {
        if (result.code === 'idempotency_key_reused') {
          // A request still waiting for its claim's reply may hold the key already (another instance read it first).
          const other = runs.some((r) => r.key === req.key && r.fp !== req.fp && (r.ended === undefined || r.ended.atMs >= req.sentAtMs)) || reqs.some((r) => r.pending && r.key === req.key && r.fp !== req.fp) || endedRuns.some((r) => r.fp !== req.fp && !r.ended!.tooLong && r.ended!.body && r.ended!.atMs + FLEET_KEPT_MS + FLEET_SLACK_MS > t) || endedRuns.some((r) => r.fp !== req.fp && r.ended!.tooLong);
          if (!other) fail(`r${req.id} got 422 reused, but no request of another body holds ${req.key}`);
        } else if (result.code === 'idempotency_answer_not_kept') {
          if (!endedRuns.some((r) => r.fp === req.fp && r.ended!.tooLong)) fail(`r${req.id} got 409 not kept, but no run of its body had an answer too long`);
        } else if (result.code === 'idempotency_key_in_progress') {
          if (req.goneAtMs === undefined && t + LOOK_MAX_MS + FLEET_SLACK_MS < req.waitUntilMs) fail(`r${req.id} got 409 in progress ${req.waitUntilMs - t} ms before its deadline`);
        } else fail(`r${req.id} failed with ${result.code}`);
        return;
      }
      if (result.kind === 'replay') {
        const from = endedRuns.find((r) => r.ended!.body !== undefined && r.ended!.body.equals(result.answer.body));
        if (from === undefined) return fail(`r${req.id} replayed an answer no run under ${req.key} gave`);
        if (from.fp !== req.fp) fail(`r${req.id} replayed the answer of another body`);
        if (from.ended!.atMs + FLEET_KEPT_MS + FLEET_SLACK_MS < t) fail(`r${req.id} replayed an answer ${t - from.ended!.atMs} ms old: kept past ttlMs`);
        return;
      }
      const isClean = clean();
      for (const r of live) {
        // The instance knows its own runs, Redis there or not (README: "each instance keeps its own").
        if (r.inst === req.inst) fail(`r${req.id} runs ${req.key} on instance ${req.inst}, which is still running it (run ${r.id}): twice on one instance`);
        else if (isClean && r.fleetWide) fail(`r${req.id} runs ${req.key} on instance ${req.inst} while run ${r.id} on instance ${r.inst} holds it in Redis: twice in the fleet`);
      }
      if (isClean) {
        const shared = endedRuns.filter((r) => r.ended!.clean && !r.ended!.underClaim && r.ended!.epoch === epoch && r.ended!.body && r.ended!.atMs + FLEET_KEPT_MS - FLEET_SLACK_MS > t && r.ended!.atMs + SETTLED_MS < t);
        if (shared.length > 0) fail(`r${req.id} runs ${req.key} again while run ${shared.at(-1)!.id}'s answer is kept in Redis`);
        // A run that held its key in Redis, or claimed it in the process with no other record of it about, and ended
        // while its instance was off Redis: its answer is written there once the instance is back (README), unless
        // another run has touched the key since.
        for (const r of endedRuns) {
          const end = r.ended!;
          // Only an end its instance held for Redis's return, and only in the Redis it returned to: an end written while
          // on Redis (in the moment before the claims are made again, too), or written back before a later restart,
          // was lost with the rest when that Redis restarted empty (README: "A Redis that restarted empty"; seed 20250616).
          if (!end.offRedis || epoch !== end.epoch + 1 || !(r.inRedis || r.fleetWide) || !end.body || end.atMs + FLEET_KEPT_MS - FLEET_SLACK_MS <= t || cleanFromMs <= end.atMs) continue;
          if (runs.every((o) => o === r || o.key !== r.key || (o.ended !== undefined && o.ended.atMs <= end.atMs))) fail(`r${req.id} runs ${req.key} again: run ${r.id}'s answer, given while Redis was away, never reached Redis`);
        }
      } else for (const r of live) r.fleetWide = false; // the moment before the claims are made again: both may run (README)
      const inRedis = redisUp && !stores[req.inst]!.degraded;
      // Claimed in the process: in Redis too once its instance is back, unless another instance's record of the key
      // gets there first (a run beside it, or an answer that instance keeps and writes back).
      const alone = live.length === 0 && !endedRuns.some((r) => r.inst !== req.inst && r.ended!.atMs + FLEET_KEPT_MS + FLEET_SLACK_MS > t);
      runs.push({ id: req.id, inst: req.inst, key: req.key, fp: req.fp, claim: result, fleetWide: isClean || (!inRedis && alone), inRedis, contested: !isClean && !alone });
    };

    const send = () => {
      const inst = g.int(0, 1);
      const key = g.pick(keys);
      const fp = g.chance(0.88) ? usual.get(key)! : 'body-other';
      const waitMs = g.pick([100, 400, 1_500, 4_000]);
      const req: FleetReq = { id: reqs.length, inst, key, fp, sentAtMs: Date.now(), waitUntilMs: Date.now() + waitMs, pending: true };
      reqs.push(req);
      note(`send r${req.id}@${inst} ${key} ${fp} wait ${waitMs}`);
      claimKey(
        { key, fingerprint: fp, owner: `owner-${req.id}`, keptMs: FLEET_KEPT_MS, runningMs: 60_000, waitUntilMs: req.waitUntilMs, clientGone: () => req.goneAtMs !== undefined, pastGrace: () => false },
        deps[inst]!,
      ).then(
        (r) => claimed(req, r),
        (err: unknown) => (err instanceof GatewayError ? claimed(req, err) : fail(`r${req.id} threw ${String(err)}`)),
      );
    };

    const end = async (run: FleetRun) => {
      const how = g.pick(['answer', 'answer', 'long', 'error', 'throw'] as const);
      const t = Date.now();
      const isClean = clean();
      note(`end run ${run.id}@${run.inst} ${how}${isClean ? '' : ' (not clean)'}`);
      if (how === 'throw') {
        run.ended = { atMs: t, clean: isClean, epoch };
        run.claim.giveBack();
      } else if (how === 'error') {
        run.ended = { atMs: t, clean: isClean, epoch };
        run.claim.keep({ status: 502, headers: { 'content-type': 'application/json' }, body: Buffer.from('{"error":{}}'), summary: summary('upstream_error') });
      } else {
        const body = Buffer.from(JSON.stringify({ run: run.id, pad: 'x'.repeat(how === 'long' ? 2_500 : g.int(0, 300)) }));
        // README "Where keys live": a run claimed in the process while Redis was away claims its key in Redis once its
        // instance is back; a repeat on another instance in the moment before runs, claiming the key in Redis first.
        // Either way a run going when this one ends may hold the key in Redis: this answer is then kept on its own
        // instance, not over that claim; and if that claim's run ends in an error, it gives the key back ("Only
        // answers are kept") and a repeat on the other instance runs again (seed 20250614).
        const underClaim = run.contested || runs.some((o) => o !== run && o.key === run.key && o.ended === undefined);
        run.ended = { atMs: t, clean: isClean, epoch, underClaim, offRedis: !redisUp || stores[run.inst]!.degraded, ...(how === 'long' ? { tooLong: true } : { body }) };
        run.claim.keep({ status: 200, headers: { 'content-type': 'application/json', 'x-request-id': `req-${run.id}` }, body, summary: summary('success') });
      }
      await run.claim.ended;
    };

    for (step = 0; step < steps && problems.length === 0; step++) {
      const live = runs.filter((r) => r.ended === undefined);
      const pending = reqs.filter((r) => r.pending);
      const roll = g.int(0, 99);
      if (roll < 35) send();
      else if (roll < 58 && live.length > 0) await end(g.pick(live));
      else if (roll < 62 && pending.length > 0) {
        const req = g.pick(pending);
        req.goneAtMs = Date.now();
        note(`client of r${req.id} leaves`);
      } else if (roll < 66 && redisUp && stops < 2 && step > 10) {
        stops++;
        redisUp = false;
        note('redis stops');
        cleanFromMs = Number.POSITIVE_INFINITY;
        await redis.stop();
        await eventually(() => stores.every((s) => s.degraded), 5_000);
      } else if (!redisUp && roll < 78) {
        note('redis restarts, empty');
        await redis.restart();
        epoch++;
        redisUp = true;
        await eventually(() => stores.every((s) => !s.degraded), 10_000);
        cleanFromMs = Date.now() + RECLAIM_GRACE_MS;
      } else await sleep(g.int(20, 250));
      const t = Date.now();
      for (const req of reqs) {
        if (!req.pending) continue;
        if (t > req.waitUntilMs + 1_000) fail(`r${req.id} still waits ${t - req.waitUntilMs} ms past its own deadline`);
        if (req.goneAtMs !== undefined && t > req.goneAtMs + 1_000) fail(`r${req.id} still waits ${t - req.goneAtMs} ms after its client left`);
      }
    }

    // The end: Redis back, every run ended, every repeat answered; then no claim is left held, in Redis or in either process.
    if (!redisUp) {
      note('redis restarts, empty');
      await redis.restart();
      epoch++;
      redisUp = true;
      await eventually(() => stores.every((s) => !s.degraded), 10_000);
      cleanFromMs = Date.now() + RECLAIM_GRACE_MS;
    }
    // Repeats answered and runs ended, again, until neither is left: a repeat may still turn into a run.
    for (let round = 0; round < 20 && (reqs.some((r) => r.pending) || runs.some((r) => r.ended === undefined)); round++) {
      for (const run of runs.filter((r) => r.ended === undefined)) await end(run);
      await eventually(() => reqs.every((r) => !r.pending), 6_000).catch(() => fail('repeats still waiting at the end'));
    }
    await sleep(500);
    for (const key of await admin().keys(`${keyPrefix}:*idempotency*`)) {
      const raw = await admin().getBuffer(key);
      if (raw?.subarray(0, 18).toString() === '{"state":"running"') fail(`${key} is still claimed in Redis after every run ended: ${raw.toString().slice(0, 120)}`);
    }
    for (const [i, s] of stores.entries()) {
      for (const key of keys) if ((await s.readKey(key, Date.now()))?.state === 'running') fail(`${key} still reads as running on instance ${i}`);
    }
  } finally {
    await Promise.all(stores.map((s) => s.close()));
    if (!redisUp) await redis.restart();
  }
  return problems;
}

describe('idempotency keys against the README model: two instances on one Redis, stopped and restarted', () => {
  const { redis, admin } = useRedisServerWithAdmin();
  // The test's own client sees Redis stop too.
  beforeEach(() => void admin().on('error', () => undefined));
  const rejections: unknown[] = [];
  const onRejection = (err: unknown) => rejections.push(err);
  beforeEach(() => void process.on('unhandledRejection', onRejection));
  afterEach(() => void process.off('unhandledRejection', onRejection));

  it.each(Array.from({ length: SEEDS }, (_, i) => BASE_SEED + i))('agrees with the model over 150 random steps (seed %i)', async (seed) => {
    const problems = await fleetSequence(seed, redis(), admin, 150);
    expect(problems.slice(0, 3).join('\n\n')).toBe('');
    expect(rejections).toEqual([]);
  });
});

// ------------------------------------------------------------------------------------------------------------------
// What the fuzz found, each as a small named test.
// ------------------------------------------------------------------------------------------------------------------

describe('found by the fuzz', () => {
  it('a repeat that reaches the instance running its key when Redis goes away mid-run waits for that run and gets its answer', async () => {
    // Found as "runs key-1 on instance 0, which is still running it": the run held its key in Redis; Redis went away;
    // the agent's retry came back to the same gateway, found no key in the process, and ran the call a second time.
    const own = await startRedis();
    const store = new RedisStore({ config: { redis: own.url, commandTimeoutMs: 250, keyPrefix: `idemfuzz-${randomUUID()}` } });
    try {
      expect(await store.ready()).toBe(true);
      const deps: IdempotencyDeps = { store, config: { enabled: true, ttlMs: 60_000, maxAnswerBytes: 1 << 20, memoryBytes: 1 << 20, leaseMs: 10_000 }, now: Date.now, random: () => 0.5 };
      const request = (owner: string) => ({ key: 'coupon-call', fingerprint: 'body', owner, keptMs: 60_000, runningMs: RUNNING_MS, waitUntilMs: Date.now() + 5_000, clientGone: () => false, pastGrace: () => false });
      const first = await claimKey(request('first'), deps);
      expect(first.kind).toBe('run');
      await own.stop();
      await eventually(() => store.degraded, 5_000);
      let repeat: KeyClaim | undefined;
      const repeated = claimKey(request('retry'), deps).then((r) => (repeat = r));
      await sleep(400);
      expect(repeat).toBeUndefined();
      const body = Buffer.from('{"coupon":"ONE"}');
      (first as KeyClaim & { kind: 'run' }).keep({ status: 200, headers: { 'content-type': 'application/json' }, body, summary: summary('success') });
      await repeated;
      expect(repeat).toMatchObject({ kind: 'replay', answer: { status: 200, body } });
    } finally {
      await store.close();
      await own.stop();
    }
  });

  it('a run claimed in the process while Redis was away claims its key in Redis once its instance is back: a repeat on another instance waits for it and gets its answer', async () => {
    // Found as "r21 runs key-2 again while run 10's answer is kept in Redis" (fleet seed 20250614), when a run claimed
    // in the process stayed there: the repeat on the other instance found the key free in Redis and ran, and once that
    // run failed and gave the key back, a repeat there ran a third time. README "Where keys live": its instance now
    // claims it in Redis when it is back on Redis.
    const own = await startRedis();
    const keyPrefix = `idemfuzz-${randomUUID()}`;
    const stores = [0, 1].map(() => new RedisStore({ config: { redis: own.url, commandTimeoutMs: 250, keyPrefix } }));
    try {
      for (const s of stores) expect(await s.ready()).toBe(true);
      const deps = stores.map((store): IdempotencyDeps => ({ store, config: { enabled: true, ttlMs: 60_000, maxAnswerBytes: 1 << 20, memoryBytes: 1 << 20, leaseMs: 10_000 }, now: Date.now, random: () => 0.5 }));
      const request = (owner: string) => ({ key: 'coupon-call', fingerprint: 'body', owner, keptMs: 60_000, runningMs: RUNNING_MS, waitUntilMs: Date.now() + 8_000, clientGone: () => false, pastGrace: () => false });
      await own.stop();
      await eventually(() => stores.every((s) => s.degraded), 5_000);
      const first = await claimKey(request('first'), deps[0]!);
      expect(first.kind).toBe('run');
      await own.restart();
      await eventually(() => stores.every((s) => !s.degraded), 10_000);
      // Its claim is sent as its instance comes back; read here from Redis, through the other instance.
      await eventually(async () => (await stores[1]!.readKey('coupon-call', Date.now()))?.state === 'running', 2_000);
      let repeat: KeyClaim | undefined;
      const repeated = claimKey(request('repeat'), deps[1]!).then((r) => (repeat = r));
      await sleep(400);
      expect(repeat).toBeUndefined();
      const body = Buffer.from('{"coupon":"ONE"}');
      const firstRun = first as KeyClaim & { kind: 'run' };
      firstRun.keep({ status: 200, headers: { 'content-type': 'application/json' }, body, summary: summary('success') });
      await firstRun.ended;
      await repeated;
      expect(repeat).toMatchObject({ kind: 'replay', answer: { status: 200, body } });
    } finally {
      await Promise.all(stores.map((s) => s.close()));
      await own.stop();
    }
  });

  it('a run claimed in the process keeps its answer on its instance when another instance claimed the key in Redis before it was back', async () => {
    // README "Where keys live": in the moment before an instance is back on Redis, a repeat on another instance finds
    // the key free there and runs; the first run's answer is not written over that claim, and when that run ends in an
    // error it gives the key back ("Only answers are kept"), so a repeat waiting for it on that instance runs again.
    const own = await startRedis();
    const proxy = await startTcpProxy(own.port);
    const keyPrefix = `idemfuzz-${randomUUID()}`;
    const stores = [`redis://127.0.0.1:${proxy.port}`, own.url].map((redis) => new RedisStore({ config: { redis, commandTimeoutMs: 250, keyPrefix } }));
    try {
      for (const s of stores) expect(await s.ready()).toBe(true);
      const deps = stores.map((store): IdempotencyDeps => ({ store, config: { enabled: true, ttlMs: 60_000, maxAnswerBytes: 1 << 20, memoryBytes: 1 << 20, leaseMs: 10_000 }, now: Date.now, random: () => 0.5 }));
      const request = (owner: string) => ({ key: 'coupon-call', fingerprint: 'body', owner, keptMs: 60_000, runningMs: RUNNING_MS, waitUntilMs: Date.now() + 8_000, clientGone: () => false, pastGrace: () => false });
      await proxy.cut();
      await eventually(() => stores[0]!.degraded, 5_000);
      const first = await claimKey(request('first'), deps[0]!);
      expect(first.kind).toBe('run');
      const second = await claimKey(request('second'), deps[1]!);
      expect(second.kind).toBe('run');
      await proxy.resume();
      await eventually(() => !stores[0]!.degraded, 10_000);
      let repeat: KeyClaim | undefined;
      const repeated = claimKey(request('repeat'), deps[1]!).then((r) => (repeat = r));
      const body = Buffer.from('{"coupon":"ONE"}');
      const firstRun = first as KeyClaim & { kind: 'run' };
      firstRun.keep({ status: 200, headers: { 'content-type': 'application/json' }, body, summary: summary('success') });
      await firstRun.ended;
      // Its own instance replays it; Redis still holds the second run's claim, which the repeat waits for.
      expect(await claimKey(request('on-first'), deps[0]!)).toMatchObject({ kind: 'replay', answer: { status: 200, body } });
      await sleep(400);
      expect(repeat).toBeUndefined();
      const secondRun = second as KeyClaim & { kind: 'run' };
      secondRun.keep({ status: 502, headers: { 'content-type': 'application/json' }, body: Buffer.from('{"error":{}}'), summary: summary('upstream_error') });
      await secondRun.ended;
      await repeated;
      expect(repeat?.kind).toBe('run');
    } finally {
      await Promise.all(stores.map((s) => s.close()));
      await proxy.close();
      await own.stop();
    }
  });
});
