// Hand mutation testing of the latest changes: the runs another request holds in Redis that an instance saw, waited
// for while Redis is away (state/redis-kept-keys.ts #runsSeen, #noteSighting, #sightingOf, and the lease runtime.ts passes
// it), the arguments kept for the [DONE] rule (streaming/answer-progress.ts) and the choices read from one parse
// (streaming/stream-events.ts), and why streamRecovery did not continue a broken stream (recoveryRefused).
// 39 hand mutants: 19 killed by the existing files, 18 killed here, 2 equivalent, 0 open. No bug in the code; one test
// (mutation-mut-today-36's "does not take another request's running claim...") asserted the behaviour ff73ba0 changed,
// and failed on main: it now waits out the 1 s lease it gives the store before its repeat runs.
// Equivalent: #noteSighting's sweep of lapsed sightings dropped (memory only: #sightingOf reads every sighting's lapse), and
// the arguments kept after a choice's finish (once one has finished, cutByDone judges by the finishes, not by them).
// The kept keys run on a real redis-server the test cuts the store off (a TCP proxy); their clock is the nowMs each
// call is given. The gateway's lease, end to end, on two in-process gateways with the `openai` SDK.
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { startRedis } from './helpers/redis-server.ts';
import { cutAndFleet, eventually, running } from './helpers/redis-stores.ts';
import { askFleet as ask, metricOf, useRedisFleets } from './helpers/redis-fleet.ts';
import { AnswerProgress } from '../src/streaming/answer-progress.ts';
import { readEvent, type StreamShape } from '../src/streaming/stream-events.ts';
import type { SseEvent } from '../src/streaming/sse-parser.ts';
import type { ManagedRequest } from '../src/pipeline/handle-request.ts';
import type { RecoveryRefusal, StreamRecovery } from '../src/pipeline/live-stream.ts';
import { RequestAbort } from '../src/pipeline/request-abort.ts';
import { streamRecovery } from '../src/pipeline/stream-recovery.ts';
import type { TargetDeps, TargetPlan } from '../src/pipeline/target-attempts.ts';
import { cc, delta, recoveringToNext, useScriptedGateway, type Script } from './helpers/scripted-provider.ts';
import { requestLine } from './helpers/stack.ts';

const LEASE = 5_000;

describe("another request's run seen holding its key in Redis, while Redis is away", () => {
  it('is waited for until a lease after the last sighting, and not from then on', async () => {
    const f = await cutAndFleet({ prefix: 'mut58-lease', keyLeaseMs: LEASE });
    try {
      const t = Date.now();
      expect(await f.fleet.claimKey('k', running('theirs', t), 30_000)).toBeUndefined();
      expect(await f.cut.readKey('k', t)).toMatchObject({ state: 'running', owner: 'theirs' });
      await f.away();
      // A repeat looking again, and a new repeat claiming the key here: both wait for the run.
      expect(await f.cut.readKey('k', t + LEASE - 1)).toMatchObject({ state: 'running', owner: 'theirs' });
      expect(await f.cut.claimKey('k', running('repeat', t + LEASE - 1), 30_000)).toMatchObject({ state: 'running', owner: 'theirs' });
      // A lease since it was seen, its claim would have lapsed unrenewed: the key is free here, and a repeat runs.
      expect(await f.cut.readKey('k', t + LEASE)).toBeUndefined();
      expect(await f.cut.claimKey('k', running('later', t + LEASE), 30_000)).toBeUndefined();
    } finally {
      await f.close();
    }
  }, 30_000);

  it('is waited for when the claim alone saw it (no look after it)', async () => {
    const f = await cutAndFleet({ prefix: 'mut58-claim', keyLeaseMs: LEASE });
    try {
      const t = Date.now();
      expect(await f.fleet.claimKey('k', running('theirs', t), 30_000)).toBeUndefined();
      expect(await f.cut.claimKey('k', running('repeat', t), 30_000)).toMatchObject({ state: 'running', owner: 'theirs' });
      await f.away();
      expect(await f.cut.claimKey('k', running('next', t + 1), 30_000)).toMatchObject({ state: 'running', owner: 'theirs' });
    } finally {
      await f.close();
    }
  }, 30_000);

  it('is not waited for once a later look found the key free (the run gave it back)', async () => {
    const f = await cutAndFleet({ prefix: 'mut58-free', keyLeaseMs: LEASE });
    try {
      const t = Date.now();
      expect(await f.fleet.claimKey('k', running('theirs', t), 30_000)).toBeUndefined();
      expect(await f.cut.readKey('k', t)).toMatchObject({ state: 'running' });
      await f.fleet.releaseKey('k', 'theirs');
      expect(await f.cut.readKey('k', t + 1)).toBeUndefined();
      await f.away();
      // Away, a repeat here runs (as with no key at all) rather than wait for a run that is over.
      expect(await f.cut.claimKey('k', running('repeat', t + 2), 30_000)).toBeUndefined();
    } finally {
      await f.close();
    }
  }, 30_000);

  it('is waited for by a claim whose own command timed out and took the store off Redis', async () => {
    const f = await cutAndFleet({ prefix: 'mut58-timeout', keyLeaseMs: LEASE });
    try {
      const t = Date.now();
      expect(await f.fleet.claimKey('k', running('theirs', t), 30_000)).toBeUndefined();
      expect(await f.cut.readKey('k', t)).toMatchObject({ state: 'running', owner: 'theirs' });
      // Redis's traffic is dropped: two looks time out (each answered from what was seen), and the third timeout in a
      // row, the claim's, degrades the store while the claim is on its way.
      f.proxy.swallow(true);
      expect(await f.cut.readKey('k', t + 1)).toMatchObject({ state: 'running', owner: 'theirs' });
      expect(await f.cut.readKey('k', t + 2)).toMatchObject({ state: 'running', owner: 'theirs' });
      expect(f.cut.degraded).toBe(false);
      expect(await f.cut.claimKey('k', running('repeat', t + 3), 30_000)).toMatchObject({ state: 'running', owner: 'theirs' });
      expect(f.cut.degraded).toBe(true);
    } finally {
      f.proxy.swallow(false);
      await f.close();
    }
  }, 30_000);

  it("takes no run of this instance's own for another's: one given back while Redis is away is not waited for", async () => {
    const f = await cutAndFleet({ prefix: 'mut58-own', keyLeaseMs: LEASE });
    try {
      const t = Date.now();
      expect(await f.cut.claimKey('k', running('run', t), 30_000)).toBeUndefined();
      // A repeat on the same instance finds the run in Redis: this instance's own, which it knows of already.
      expect(await f.cut.claimKey('k', running('repeat', t + 1), 30_000)).toMatchObject({ state: 'running', owner: 'run' });
      await f.away();
      await f.cut.releaseKey('k', 'run'); // its upstream failed: the key is given back
      expect(await f.cut.claimKey('k', running('again', t + 2), 30_000)).toBeUndefined();
    } finally {
      await f.close();
    }
  }, 30_000);
});

describe('idempotency.leaseMs bounds how long a repeat waits, Redis away, for a run it saw on another instance', () => {
  const startFleet = useRedisFleets();

  it('with leaseMs 1000, a repeat whose sighting is a second old runs the call rather than wait to its deadline', async () => {
    const redis = await startRedis();
    try {
      const f = await startFleet({ latencyMs: 8_000 }, [redis.url, redis.url], { idempotency: { leaseMs: 1_000 } });
      const [a, b] = f.urls as [string, string];
      const upstream = () => f.mock.requests().length;
      const key = randomUUID();
      const headers = (timeoutMs: number) => ({ 'Idempotency-Key': key, 'x-stormgate-timeout-ms': String(timeoutMs) });
      const run = ask(a, headers(20_000));
      await eventually(() => upstream() === 1, 3_000);
      const repeat = ask(b, headers(15_000));
      await sleep(500); // B has found A's run in Redis
      await redis.stop();
      await eventually(async () => (await metricOf(b, 'stormgate_state_degraded')) === 1, 5_000);
      // Waited for until its claim would have lapsed (1 s): then B runs it, as a repeat with no key in Redis does.
      // Waited for a default lease (10 s), the upstream still had one request when the run had ended.
      await eventually(() => upstream() === 2, 5_000);
      expect((await run).status).toBe(200);
      expect((await repeat).status).toBe(200);
    } finally {
      await redis.stop();
    }
  }, 40_000);
});

/** A chat stream's events as the LiveStream passes them to AnswerProgress: read once (readEvent), its parse handed on. */
function progressOf(events: unknown[], shape: StreamShape = { choices: 1, usage: false }): AnswerProgress {
  const progress = new AnswerProgress('chat', shape);
  for (const data of events) {
    const text = JSON.stringify(data);
    const ev: SseEvent = { raw: `data: ${text}`, data: text, event: null };
    const { meaning, parsed } = readEvent('chat', ev);
    progress.passed(meaning, ev, parsed);
  }
  return progress;
}
const cutByDone = (events: unknown[]) => progressOf(events).cutByDone();
const calls = (...tc: Array<{ index: number; id?: string; arguments: string }>) => ({
  object: 'chat.completion.chunk',
  choices: [{ index: 0, delta: { tool_calls: tc.map(({ index, id, arguments: a }) => ({ index, ...(id && { id, type: 'function' }), function: { ...(id && { name: 'lookup' }), arguments: a } })) }, finish_reason: null }],
});

describe('the [DONE] rule on tool call arguments', () => {
  it('judges parallel calls whose argument pieces come interleaved each on its own: whole ones are no cut, a broken one is', () => {
    const opened = [calls({ index: 0, id: 'call_1', arguments: '' }), calls({ index: 1, id: 'call_2', arguments: '' })];
    const interleaved = [...opened, calls({ index: 0, arguments: '{"order":' }), calls({ index: 1, arguments: '{"sku": "A-1"}' }), calls({ index: 0, arguments: ' 42}' })];
    expect(cutByDone(interleaved)).toBeUndefined();
    expect(cutByDone(interleaved.slice(0, -1))).toMatch(/tool call's arguments/);
    // Both in one chunk, the second without an id: still two calls.
    expect(cutByDone([calls({ index: 0, id: 'call_1', arguments: '{"order": 42}' }, { index: 1, arguments: '{"sku": "A-1"}' })])).toBeUndefined();
  });

  it('keeps exactly 1 MiB of arguments to judge by ("longer than" it are not)', () => {
    const head = '{"a": "';
    const exact = head + 'x'.repeat(1024 * 1024 - head.length);
    expect(cutByDone([calls({ index: 0, id: 'call_1', arguments: exact })])).toMatch(/tool call's arguments/);
    expect(cutByDone([calls({ index: 0, id: 'call_1', arguments: `${exact}x` })])).toBeUndefined();
  });
});

describe('n = 2: which choices have a tool call open', () => {
  it('not one whose delta carries an empty tool_calls list beside another choice\'s call', () => {
    const TWO: StreamShape = { choices: 2, usage: false };
    const call = { index: 0, id: 'call_1', type: 'function', function: { name: 'lookup', arguments: '{"order": 42}' } };
    const both = {
      object: 'chat.completion.chunk',
      choices: [{ index: 0, delta: { content: 'Your order', tool_calls: [] }, finish_reason: null }, { index: 1, delta: { tool_calls: [call] }, finish_reason: null }],
    };
    const progress = progressOf([both], TWO);
    expect(progress.toolCallOpen).toBe(true);
    // Choice 1's call is over at its finish; choice 0 is text: a malformed event now drops text, breaks no call.
    const after = progressOf([both, { object: 'chat.completion.chunk', choices: [{ index: 1, delta: {}, finish_reason: 'tool_calls' }] }], TWO);
    expect(after.toolCallOpen).toBe(false);
  });
});

/**
 * streamRecovery's answer for a continuation of "Hel" to a next target q whose guards and request are as given: the
 * refusal the request's log line names (recoveryRefused), before any request goes.
 */
async function refusal(o: { breaker?: string; held?: 'hold-off' | 'credentials'; family?: string; model?: string; expressible?: boolean }): Promise<RecoveryRefusal | 'sent'> {
  const json = { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true };
  const req = { route: { name: 'chat', api: 'chat', config: { streamRecovery: 'continue', budget: { ratio: 0.1, windowS: 10, minRetriesPerSecond: 1 } } }, json, path: '/v1/chat/completions', query: '' } as unknown as ManagedRequest;
  const upstreamReq = o.expressible === false ? { ok: false } : { ok: true, request: { path: '/v1/chat/completions', headers: {}, body: Buffer.from(JSON.stringify(json)), translator: undefined } };
  let asked = false;
  const next = {
    key: 'q/m', holdOffKey: 'q/m', breaker: undefined, budgetKey: 'chat q/m', model: o.model ?? 'gpt-4o', label: 'q/m',
    client: { config: { family: o.family ?? 'openai', baseUrl: 'http://127.0.0.1:9/v1', apiKey: 'q-key-0123456789', timeouts: { connectMs: 1_000, firstTokenMs: 1_000, idleMs: 1_000 } } },
    upstream: () => upstreamReq,
  } as unknown as TargetPlan;
  const deps = {
    now: () => 0,
    guards: {
      board: { availability: () => ({ kind: o.breaker ?? 'closed' }) },
      holdOffs: { until: () => (o.held === 'hold-off' ? 5_000 : undefined), credentialsHeldUntil: () => (o.held === 'credentials' ? 5_000 : undefined) },
      budget: {
        tryRetry: async () => {
          asked = true;
          return false; // no further: a request that would go is refused by the budget here
        },
      },
    },
  } as unknown as Pick<TargetDeps, 'guards' | 'now' | 'onAttempt' | 'onRetry' | 'onBudgetExhausted'>;
  const recover = streamRecovery(req, { choices: 1, usage: false }, next, new RequestAbort().signal, deps, []) as StreamRecovery;
  const got = await recover('Hel', 'stream_cut', new RequestAbort().signal, 30_000);
  return got === 'budget' && asked ? 'sent' : (got as RecoveryRefusal);
}

describe('why streamRecovery did not continue (recoveryRefused), by the next target', () => {
  it("names its breaker, its hold-off or its credentials' hold, another family, and a request it cannot be sent", async () => {
    expect(await refusal({})).toBe('sent');
    expect(await refusal({ breaker: 'open' })).toBe('breaker_not_closed');
    expect(await refusal({ breaker: 'half-open' })).toBe('breaker_not_closed');
    expect(await refusal({ held: 'hold-off' })).toBe('held_off');
    expect(await refusal({ held: 'credentials' })).toBe('held_off');
    // Claude 4.6 takes no prefill, and another family's model will not begin with the words the first one wrote.
    expect(await refusal({ family: 'anthropic', model: 'claude-sonnet-4-6' })).toBe('other_family');
    expect(await refusal({ family: 'anthropic', model: 'claude-sonnet-4-5' })).toBe('sent');
    expect(await refusal({ expressible: false })).toBe('not_expressible');
  });
});

const role = cc([delta({ role: 'assistant', content: '' })]);
const cutAfterHel: Script = { steps: [role, cc([delta({ content: 'Hel' })]), 30, { destroy: true }] };
const hello: Script = { steps: [role, cc([delta({ content: 'Hello' })]), cc([delta({}, 'stop')]), 'data: [DONE]\n\n'] };

describe('a broken stream not continued, in its log line', () => {
  const start = useScriptedGateway(recoveringToNext());
  const startOneSlot = useScriptedGateway((c, origin) => {
    recoveringToNext()(c, origin);
    c.providers.q!.pools = { maxConcurrent: 1 };
  });
  const ask = (client: OpenAI) => client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
  const drain = async (stream: AsyncIterable<unknown>) => {
    try {
      for await (const _chunk of stream) {
        // read to the stream's end or its error event
      }
      return 'ended';
    } catch {
      return 'error';
    }
  };

  it('says no_text when the output it delivered had none', async () => {
    // A server that puts its text in `text` (as a completion's choice has it), not in the delta: output, but no text.
    const { client, s } = await start((_b, n) => (n === 1 ? { steps: [role, cc([{ index: 0, text: 'Hel', delta: {}, finish_reason: null }]), 30, { destroy: true }] } : hello));
    expect(await drain(await ask(client))).toBe('error');
    expect((await requestLine(s)).recoveryRefused).toBe('no_text');
  });

  it("says not_sent when the next target's pool had no slot for the continuation within the stream's idle limit", async () => {
    // q takes one request at once: the first stream's continuation holds it (q never answers); the second's waits.
    const { client, s, seen } = await startOneSlot((_b, n) => (n === 2 ? ('hang' as unknown as Script) : n === 4 ? hello : cutAfterHel), { idleMs: 1_500 });
    const first = await ask(client);
    const firstRead = first[Symbol.asyncIterator]();
    await firstRead.next(); // its "Hel" is out; it breaks, and its continuation takes q's slot
    await expect.poll(() => seen.length, { timeout: 5_000 }).toBe(2);
    expect(await drain(await ask(client))).toBe('error');
    await expect.poll(() => s.logs.map((l) => JSON.parse(l) as { recoveryRefused?: string }).find((l) => l.recoveryRefused)?.recoveryRefused, { timeout: 5_000 }).toBe('not_sent');
    first.controller.abort();
  }, 20_000);
});

describe('an event whose data is JSON but no object', () => {
  it('is malformed (dropped, not passed to the SDK as a chunk), in every API that reads JSON', () => {
    for (const data of ['null', '42', '"Hello"', 'false']) {
      const ev: SseEvent = { raw: `data: ${data}`, data, event: null };
      for (const api of ['chat', 'completions', 'responses', 'messages'] as const) expect(readEvent(api, ev)).toEqual({ meaning: 'malformed' });
    }
  });
});
