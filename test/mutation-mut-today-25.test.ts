// Mutation-found gaps in pipeline/idempotent-request.ts: a key given back while several repeats wait (one of them runs
// the request, not each), how soon a waiting repeat gets the run's answer, an answer of exactly maxAnswerBytes (kept,
// whole and streamed), keys scoped by path, the 409 a repeat out of time gets (retry-after-ms 1000, as documented), an
// error answer's key given back at once, a run not cut by its client's timeout, and a repeat that takes over the run.
import { Readable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import type { PipelineAnswer, RequestSummary } from '../src/pipeline/handle-request.ts';
import { claimKey, keyedRequest, type IdempotencyDeps, type KeyClaim } from '../src/pipeline/idempotent-request.ts';
import type { LiveStream } from '../src/pipeline/live-stream.ts';
import type { CompiledRoute } from '../src/routing/router.ts';
import { MemoryStore } from '../src/state/memory-store.ts';
import { useStacks } from './helpers/stack.ts';

const start = useStacks();
const BODY = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'give the user one coupon' }] };

function depsWith(store: MemoryStore, maxAnswerBytes = 1 << 20): IdempotencyDeps {
  return { store, config: { enabled: true, ttlMs: 60_000, maxAnswerBytes, memoryBytes: 1 << 26, leaseMs: 10_000 }, now: Date.now, random: () => 0 };
}

/** A keyed request as claimKey gets it, `owner` its own. */
function keyed(owner: string, key = 'k') {
  return { key, fingerprint: 'fp-1', owner, keptMs: 60_000, runningMs: 60_000, waitUntilMs: Date.now() + 10_000, clientGone: () => false, pastGrace: () => false };
}

const SUMMARY: RequestSummary = { route: 'chat', target: 'mock/gpt-4o', outcome: 'success', attempts: [], budgetMs: 0, deadlineSource: 'route', skipped: [] };

function wholeAnswer(body: Buffer): PipelineAnswer {
  return { status: 200, headers: { 'content-type': 'application/json' }, body, summary: { ...SUMMARY } };
}

function asRun(claim: KeyClaim): KeyClaim & { kind: 'run' } {
  if (claim.kind !== 'run') throw new Error(`expected a run, got a ${claim.kind}`);
  return claim;
}

describe('a key given back while repeats wait for it', () => {
  it('one of the waiting repeats runs the request; the other waits for that run and gets its answer', async () => {
    const store = new MemoryStore();
    const deps = depsWith(store);
    const first = asRun(await claimKey(keyed('first'), deps));
    const repeats = [claimKey(keyed('second'), deps), claimKey(keyed('third'), deps)];
    await sleep(200);
    // The first run ends in an error: its key goes back, and the next repeat runs the request again (once).
    first.giveBack();
    await first.ended;
    const settled = await Promise.race([Promise.any(repeats), sleep(3_000).then(() => undefined)]);
    expect(settled?.kind).toBe('run');
    const runner = asRun(settled!);
    // The second run takes a while: the other repeat looks at the key meanwhile, and must find it taken.
    await sleep(500);
    runner.keep(wholeAnswer(Buffer.from('{"coupon":1}')));
    await runner.ended;
    const kinds = (await Promise.all(repeats)).map((c) => c.kind).sort();
    // Both ran, before: two coupons for one call.
    expect(kinds).toEqual(['replay', 'run']);
  });
});

describe('a run that ends in an error answer', () => {
  it('gives its key back at once: the next request under it runs, and the run\'s end settles (a drain waits for it)', async () => {
    const store = new MemoryStore();
    const deps = depsWith(store);
    const run = asRun(await claimKey(keyed('first'), deps));
    const failed: PipelineAnswer = { status: 500, headers: { 'content-type': 'application/json' }, body: Buffer.from('{"error":{}}'), summary: { ...SUMMARY, outcome: 'upstream_error' } };
    expect(run.keep(failed)).toBe(failed);
    // Held until its lease lapsed (10 s) instead, every repeat meanwhile waited for a run that had ended.
    expect(await Promise.race([run.ended.then(() => 'ended'), sleep(2_000).then(() => 'still held')])).toBe('ended');
    expect(await store.readKey('k', Date.now())).toBeUndefined();
    expect((await claimKey(keyed('second'), deps)).kind).toBe('run');
  });
});

describe('a repeat waiting for a run', () => {
  it('gets the answer within a look (75 to 150 ms) of the run\'s end, not a second later', async () => {
    const store = new MemoryStore();
    const deps = depsWith(store);
    const first = asRun(await claimKey(keyed('first'), deps));
    const t0 = Date.now();
    const repeat = claimKey(keyed('second'), deps);
    await sleep(250);
    first.keep(wholeAnswer(Buffer.from('{"coupon":1}')));
    const got = await repeat;
    expect(got.kind).toBe('replay');
    // Answered at ~250 ms plus at most one look (random 0: 75 ms); a look every second would answer at 1000 ms.
    expect(Date.now() - t0).toBeLessThan(750);
  });
});

describe('an answer of exactly maxAnswerBytes', () => {
  it('is kept when whole: a repeat gets it again', async () => {
    const store = new MemoryStore();
    const deps = depsWith(store, 64);
    const body = Buffer.from(`{"t":"${'x'.repeat(64 - 8)}"}`);
    expect(body.length).toBe(64);
    const run = asRun(await claimKey(keyed('first'), deps));
    run.keep(wholeAnswer(body));
    await run.ended;
    const again = await claimKey(keyed('second'), deps);
    expect(again.kind).toBe('replay');
    expect(again.kind === 'replay' && again.answer.body.equals(body)).toBe(true);
  });

  it('is kept when streamed: a repeat gets its events again', async () => {
    const store = new MemoryStore();
    const deps = depsWith(store, 64);
    const events = [Buffer.from(`data: {"a":"${'y'.repeat(64 - 30)}"}\n\n`), Buffer.from('data: [DONE]\n\n')];
    expect(Buffer.concat(events).length).toBe(64);
    const summary: RequestSummary = { ...SUMMARY };
    const run = asRun(await claimKey(keyed('first'), deps));
    const upstream = new Readable({ read() {} });
    const live = { clientStallMs: 10_000 } as unknown as LiveStream;
    const sent = run.keep({ status: 200, headers: { 'content-type': 'text/event-stream' }, body: upstream, live, summary });
    const read = (async () => {
      const chunks: Buffer[] = [];
      for await (const chunk of sent.body as Readable) chunks.push(chunk as Buffer);
      return Buffer.concat(chunks);
    })();
    for (const e of events) upstream.push(e);
    summary.streamEnd = { kind: 'complete', events: 2, droppedMalformed: 0 } as RequestSummary['streamEnd'];
    upstream.push(null);
    expect((await read).equals(Buffer.concat(events))).toBe(true);
    await run.ended;
    const again = await claimKey(keyed('second'), deps);
    expect(again.kind).toBe('replay');
    expect(again.kind === 'replay' && again.answer.body.equals(Buffer.concat(events))).toBe(true);
  });
});

describe('a key is scoped by path', () => {
  it('the same Idempotency-Key and body on two paths names two keys, on one path one', () => {
    const deps = depsWith(new MemoryStore());
    const route = { config: { timeoutMs: 60_000, deadlineMarginMs: 0 }, api: 'chat' } as unknown as CompiledRoute;
    const req = (path: string, client?: string) =>
      keyedRequest(
        { route, path, query: '', rawBody: Buffer.from(JSON.stringify(BODY)), json: BODY, headers: { 'idempotency-key': 'k-1' }, client, receivedMs: 0, clientGone: () => false, pastGrace: () => false },
        deps,
      )!.key;
    expect(req('/v1/chat/completions')).toBe(req('/v1/chat/completions'));
    expect(req('/v1/chat/completions')).not.toBe(req('/v1/tools/coupon'));
    expect(req('/v1/chat/completions', 'team-a')).not.toBe(req('/v1/chat/completions', 'team-b'));
  });
});

describe('a repeat out of its own time while the run goes on', () => {
  it('gets 409 idempotency_key_in_progress with x-should-retry: true and retry-after-ms: 1000', async () => {
    const s = await start({ faults: { latencyMs: 1500 } });
    const send = (timeout?: string) =>
      fetch(`${s.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': 'k-409', ...(timeout !== undefined && { 'x-stormgate-timeout-ms': timeout }) },
        body: JSON.stringify(BODY),
      });
    const run = send();
    await sleep(50);
    const res = await send('500');
    expect(res.status).toBe(409);
    expect(res.headers.get('x-should-retry')).toBe('true');
    expect(res.headers.get('retry-after-ms')).toBe('1000');
    expect((await run).status).toBe(200);
  });
});

describe('a repeat that runs the request after the run before it gave the key back', () => {
  it('runs under the route\'s whole timeoutMs, not what its wait for the first run left of it', async () => {
    // The route gives a run 6 s (5.7 s after the margin). The first run hangs, and its deadline gives the key back.
    const s = await start({ route: { timeoutMs: 6000 }, faults: { latencyMs: 20_000 } });
    const send = () =>
      fetch(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': 'k-late' }, body: JSON.stringify(BODY) });
    const first = send();
    await sleep(3000);
    // The repeat waits ~2.7 s for the first run, then runs the request itself: the provider now takes 4.3 s.
    s.mock.setFaults({ latencyMs: 4300 });
    const repeat = send();
    expect((await first).status).toBe(504);
    const res = await repeat;
    // Counted from the repeat's arrival, its run had ~3 s left and was cut at its deadline (504, the key given back).
    expect(res.status).toBe(200);
    expect(res.headers.get('idempotent-replayed')).toBeNull();
  }, 20_000);
});

describe("a run's client timeout", () => {
  it('does not cut the run: a client that says 600 ms still gets the 1.2 s answer, and a repeat gets it again', async () => {
    const s = await start({ faults: { latencyMs: 1200 } });
    const send = () =>
      fetch(`${s.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': 'k-own-timeout', 'x-stormgate-timeout-ms': '600' },
        body: JSON.stringify(BODY),
      });
    const res = await send();
    // Cut at the client's 600 ms (504), the key went back and the agent's retry ran the call again.
    expect(res.status).toBe(200);
    const again = await send();
    expect(again.status).toBe(200);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(s.mock.requests().filter((r) => r.path === '/v1/chat/completions')).toHaveLength(1);
  });
});
