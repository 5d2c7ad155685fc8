// Mutation testing of src/pipeline/ (target-attempts, serve-targets, plan-targets, parking-lot, idempotent-request,
// final-answer, stream-break, stream-recovery): each test here fails on a change to that code the rest of the suite
// let through. Pure parts are tested directly, on fake timers where the lot's clock matters.
import { PassThrough } from 'node:stream';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { AttemptTimeout } from '../src/pipeline/abort-reasons.ts';
import { failureAnswer, unavailableAnswer, withSkipNote } from '../src/pipeline/final-answer.ts';
import type { RequestSummary } from '../src/pipeline/handle-request.ts';
import { claimKey, type IdempotencyDeps } from '../src/pipeline/idempotent-request.ts';
import type { LiveStream } from '../src/pipeline/live-stream.ts';
import { ParkingLot, type TargetState } from '../src/pipeline/parking-lot.ts';
import { brokenBy, errorEventBreaks } from '../src/pipeline/stream-break.ts';
import { classify } from '../src/policy/outcome.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import type { SseEvent } from '../src/streaming/sse-parser.ts';
import type { UpstreamStreamError } from '../src/streaming/stream-events.ts';
import { cc, delta, recoveringToNext, useScriptedGateway, type ConfigShape } from './helpers/scripted-provider.ts';
import { streamedText } from './helpers/chat-stream.ts';

describe('stream-break: what a break after the first output means to the breaker', () => {
  const ev = (data: string | null): SseEvent => ({ raw: `data: ${data ?? ''}`, data, event: null });
  const err = (code: string | undefined, type?: string): UpstreamStreamError => ({ message: undefined, code, type, param: null });

  it('names a stall stream_stalled and a cut stream_cut, with the socket code cut to 64 characters', () => {
    expect(brokenBy(new AttemptTimeout('idle', 1_000), undefined)).toEqual({ reason: 'stream_stalled' });
    expect(brokenBy(new Error('socket'), { code: 'ECONNRESET' })).toEqual({ reason: 'stream_cut', code: 'ECONNRESET' });
    expect(brokenBy(undefined, { code: 'X'.repeat(100) })).toEqual({ reason: 'stream_cut', code: 'X'.repeat(64) });
    expect(brokenBy(undefined, null)).toEqual({ reason: 'stream_cut' });
  });

  it('counts a server error event against the provider, and not one that blames the request or is a rate limit', () => {
    expect(errorEventBreaks(err('server_error'), ev('{}'), undefined, '')).toEqual({ reason: 'stream_error', code: 'server_error' });
    expect(errorEventBreaks(err(undefined), ev(null), undefined, '')).toEqual({ reason: 'stream_error' });
    expect(errorEventBreaks(err('content_filter'), ev('{}'), undefined, '')).toBeUndefined();
    expect(errorEventBreaks(err('rate_limit_exceeded'), ev('{}'), undefined, '')).toBeUndefined();
  });

  it("reads a family's own event by its family when the codes say nothing: a request's fault is no breaker failure", () => {
    const invalid = () => ({ status: 400, body: Buffer.from('{"error":{"type":"invalid_request_error","message":"bad"}}') });
    expect(errorEventBreaks(err(undefined), ev('{"type":"error"}'), invalid, '')).toBeUndefined();
    const overloaded = () => ({ status: 529, body: Buffer.from('{"error":{"type":"overloaded_error"}}') });
    expect(errorEventBreaks(err(undefined), ev('{"type":"error"}'), overloaded, '')).toEqual({ reason: 'stream_error' });
  });
});

describe('final-answer: what the client is told', () => {
  const refused = { outcome: { kind: 'network' as const, code: 'ECONNREFUSED' } };
  const facts = (attempts: Array<[string, number]>) => ({ result: refused, cls: classify(refused.outcome), retryAfterMs: undefined, attempts, target: 'a', budgetMs: 1_000 });

  it('counts the attempts in all only when more than one target was tried', () => {
    expect(failureAnswer(facts([['a', 2]])).body.error.message).toBe('upstream a could not be reached after 2 attempts (last: ECONNREFUSED)');
    expect(failureAnswer(facts([['b', 1], ['a', 1]])).body.error.message).toBe('upstream a could not be reached after 1 attempt (last: ECONNREFUSED); 2 attempts in all: b 1, a 1');
  });

  it("passes an upstream's own error on without its content-type (the gateway writes its own body)", () => {
    const result = { outcome: { kind: 'http' as const, status: 400, errorCode: null, hint: undefined }, status: 400, headers: { 'content-type': 'text/plain', 'x-request-id': 'req-1' }, body: Buffer.from('bad') };
    const answer = failureAnswer({ ...facts([['a', 1]]), result, cls: classify(result.outcome) });
    expect(answer.status).toBe(400);
    expect(answer.headers['content-type']).toBeUndefined();
  });

  it('names in its skip note only the targets other than the one that answered', () => {
    const answer = failureAnswer(facts([['a', 1]]));
    const noted = withSkipNote(answer, 'a', [{ target: 'a', reason: 'held off' }, { target: 'b', reason: 'circuit breaker open' }]);
    expect(noted.body.error.message).toMatch(/; not tried: b \(circuit breaker open\)$/);
    expect(withSkipNote(answer, 'a', [{ target: 'a', reason: 'held off' }])).toBe(answer);
  });
});

describe('final-answer: a hold-off answer', () => {
  it('names when the gateway asks the provider again only when that is sooner than the provider asked for', () => {
    const same = unavailableAnswer({ reason: 'hold-off', target: 't', retryAfterMs: 5_000, holdOffMs: 5_000 });
    expect(same.body.error.message).toBe('target t asked for no requests for another 5 s');
    const sooner = unavailableAnswer({ reason: 'hold-off', target: 't', retryAfterMs: 5_000, holdOffMs: 3_000 });
    expect(sooner.body.error.message).toBe('target t asked for no requests for another 5 s (the gateway asks it again in 3 s)');
  });
});

/** Recovery to `q`, whose breaker opens at one failure. */
const startRecovering = useScriptedGateway(recoveringToNext({ consecutiveFailures: 1, openS: 60 }));

describe('stream-recovery: the guards of a retry', () => {
  it('sends no continuation to a next target whose breaker is open: the client gets the cut', async () => {
    const failed = { status: 503, headers: { 'content-type': 'application/json' }, steps: ['{"error":{"message":"down","type":"server_error"}}'] };
    const { client, seen } = await startRecovering((_body, n) =>
      n <= 2
        ? failed
        : n === 3
          ? { steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hel' })]), 30, { destroy: true }] }
          : { steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hello' })]), cc([delta({}, 'stop')]), 'data: [DONE]\n\n'] },
    );
    const messages = [{ role: 'user' as const, content: 'hi' }];
    // p fails, and so does q: q's breaker opens.
    await expect(client.chat.completions.create({ model: 'gpt-4o', messages })).rejects.toThrow();
    expect(seen.length).toBe(2);
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages, stream: true });
    const { text, err } = await streamedText(stream);
    expect(String(err)).toMatch(/cut/);
    expect(text).toBe('Hel');
    expect(seen.length).toBe(3);
  });
});

describe('idempotent-request: an answer of exactly maxAnswerBytes', () => {
  const MAX = 64;
  const summary = { route: 'tool', target: 'mock/tool', priority: 'online', outcome: 'success', attempts: [], budgetMs: 1_000, deadlineSource: 'route', skipped: [] } as unknown as RequestSummary;
  const keyed = (key: string) => ({ key, fingerprint: 'fp', owner: `o-${Math.random()}`, keptMs: 60_000, runningMs: 60_000, waitUntilMs: Date.now() + 1_000, clientGone: () => false, pastGrace: () => false });

  it('is kept, whole or streamed, and replayed: only a longer one is not', async () => {
    const deps: IdempotencyDeps = { store: new MemoryStore(), config: { enabled: true, ttlMs: 60_000, maxAnswerBytes: MAX, memoryBytes: 1 << 20, leaseMs: 10_000 }, now: () => Date.now(), random: () => 0 };
    const whole = await claimKey(keyed('whole'), deps);
    if (whole.kind !== 'run') throw new Error('expected to run');
    whole.keep({ status: 200, headers: {}, body: Buffer.alloc(MAX, 0x61), summary });
    await whole.ended;
    const again = await claimKey(keyed('whole'), deps);
    expect(again.kind === 'replay' && again.answer.body.length).toBe(MAX);

    const streamed = await claimKey(keyed('stream'), deps);
    if (streamed.kind !== 'run') throw new Error('expected to run');
    const upstream = new PassThrough();
    const ended = { ...summary, streamEnd: { kind: 'complete', events: 2, droppedMalformed: 0 } } as unknown as RequestSummary;
    const out = streamed.keep({ status: 200, headers: {}, body: upstream, summary: ended, live: { clientStallMs: 20_000 } as unknown as LiveStream });
    (out.body as PassThrough).on('data', () => undefined);
    upstream.write(Buffer.alloc(MAX / 2, 0x62));
    upstream.end(Buffer.alloc(MAX / 2, 0x62));
    await streamed.ended;
    const replay = await claimKey(keyed('stream'), deps);
    expect(replay.kind === 'replay' && replay.answer.body.length).toBe(MAX);
  });
});

describe('parking-lot: boundaries', () => {
  let state: TargetState;
  let lot: ParkingLot;
  let random: () => number;
  beforeEach(() => {
    vi.useFakeTimers({ now: 0 });
    state = { mode: 'blocked', availableAtMs: 60_000 };
    random = () => 0;
    lot = new ParkingLot({ now: () => Date.now(), random: () => random(), stateOf: () => state });
  });
  afterEach(() => {
    lot.close();
    vi.useRealTimers();
  });
  const opts = (deadlineAtMs: number, minAttemptMs = 0) => ({ route: 'chat', deadlineAtMs, signal: new AbortController().signal, maxQueue: 100, maxWaitMs: undefined, minAttemptMs });

  it('times a request out when the target comes back at its very cut-off, as its timer would: never released with exactly minAttemptMs left', async () => {
    let result: string | undefined;
    void lot.park('t', opts(5_000, 1_000)).then((r) => (result = r.kind));
    // The clock reaches the cut-off while no timer runs (a busy event loop); the target's recovery is heard of first.
    vi.setSystemTime(4_000);
    state = { mode: 'available', slots: 10 };
    lot.notify('t');
    await Promise.resolve();
    expect(result).toBe('timeout');
  });

  it('lets a stream that ended count no more against the probes: one probe at a time after it', async () => {
    state = { mode: 'available', slots: 1 };
    const first = await lot.park('t', opts(60_000));
    if (first.kind !== 'released') throw new Error('expected a release');
    first.ticket.streaming();
    first.ticket.done();
    state = { mode: 'probing', slots: 1 };
    const kinds: string[] = [];
    for (let i = 0; i < 2; i++) void lot.park('t', opts(60_000)).then((r) => kinds.push(r.kind));
    await vi.advanceTimersByTimeAsync(0);
    expect(kinds).toEqual(['released']);
  });

  /** Parks one request while the target is blocked and brings it back at 1 s: a release window of 200 ms to 1.2 s. */
  async function inReleaseWindow(): Promise<void> {
    void lot.park('t', opts(60_000));
    await vi.advanceTimersByTimeAsync(1_000);
    state = { mode: 'available', slots: 10 };
    lot.notify('t');
  }

  it('holds a newcomer in the release window until its own not-before, when that is later than the window', async () => {
    random = () => 0.99;
    await inReleaseWindow();
    let at: number | undefined;
    void lot.park('t', { ...opts(60_000), notBeforeMs: 1_500 }).then(() => (at = Date.now()));
    await vi.advanceTimersByTimeAsync(1_000);
    expect(at).toBe(1_500);
  });

  it('releases a newcomer whose cut-off comes inside the release window before its cut-off, not times it out', async () => {
    random = () => 0.99;
    await inReleaseWindow();
    let result: string | undefined;
    void lot.park('t', opts(1_100)).then((r) => (result = r.kind));
    await vi.advanceTimersByTimeAsync(200);
    expect(result).toBe('released');
  });

  it('releases requests with the same deadline in the order they parked', async () => {
    const order: string[] = [];
    for (const id of ['a', 'b', 'c']) void lot.park('t', opts(5_000)).then(() => order.push(id));
    state = { mode: 'available', slots: 3 };
    lot.notify('t');
    await vi.advanceTimersByTimeAsync(0);
    expect(order).toEqual(['a', 'b', 'c']);
  });
});

/** Every route of the scripted provider retries on an exponential backoff without jitter: 20 ms, then 40 ms. */
const exponential: ConfigShape = (c) => {
  for (const r of c.routes as Array<Record<string, unknown>>) r.retry = { maxAttempts: 3, backoff: { strategy: 'exponential', baseMs: 20, capMs: 1_000 } };
};
const startExponential = useScriptedGateway(exponential);

describe('target-attempts: the backoff between retries', () => {
  it('waits the first step of the backoff before the first retry, the second before the second', async () => {
    const failed = { status: 503, headers: { 'content-type': 'application/json' }, steps: ['{"error":{"message":"down","type":"server_error"}}'] };
    const ok = { headers: { 'content-type': 'application/json' }, steps: [JSON.stringify({ id: 'c', object: 'chat.completion', created: 1, model: 'gpt-4o', choices: [{ index: 0, message: { role: 'assistant', content: 'hi' }, finish_reason: 'stop' }] })] };
    const { client, s } = await startExponential((_body, n) => (n <= 2 ? failed : ok));
    await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    await expect.poll(() => s.logs.find((l) => l.includes('"reqId"'))).toBeDefined();
    const line = JSON.parse(s.logs.find((l) => l.includes('"reqId"'))!) as { attempts: Array<{ waitMs: number; reason: string }> };
    expect(line.attempts.map((a) => [a.reason, a.waitMs])).toEqual([['status_503', 0], ['status_503', 20], ['ok', 40]]);
  });
});

/** The chat route goes to `p`, then `q` (the same scripted server), and retries only 503s: not a timeout, after which the provider may have run it. */
const noTimeoutRetries: ConfigShape = (c, origin) => {
  c.providers.q = { family: 'openai', baseUrl: `${origin}/v1`, apiKey: 'q-key', breaker: false };
  for (const r of c.routes) {
    if (r.name !== 'chat') continue;
    r.targets = [{ provider: 'p' }, { provider: 'q' }];
    r.retry = { maxAttempts: 2, retryOn: [503] };
  }
};
const startNoTimeoutRetries = useScriptedGateway(noTimeoutRetries);

describe('serve-targets: a request the provider may have run', () => {
  it('is not sent to the next target when the route leaves timeout out of retryOn', async () => {
    const { client, seen } = await startNoTimeoutRetries(
      (_body, n) => (n === 1 ? { steps: [], hold: true } : { steps: [cc([delta({ role: 'assistant', content: 'ok' }, 'stop')]), 'data: [DONE]\n\n'] }),
      { firstTokenMs: 300 },
    );
    const err = await client.chat.completions
      .create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true })
      .then(async (stream) => {
        for await (const _ of stream) void _;
        return 'answered';
      })
      .catch((e: { status?: number }) => e.status);
    expect(err).toBe(504);
    expect(seen.length).toBe(1);
  });
});
