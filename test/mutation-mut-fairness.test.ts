// Tests that kill mutants of the fair share between a class's clients (provider-pool.ts) which the pool's other tests
// let live: which client a freed slot goes to among three, when a client's entry is forgotten, which waiter a full
// queue displaces (of several clients, of several lanes, past gone ones), the bytes a displacement gives back, the
// retry-after of a shed waiter and the deadline a flooding client's newcomer is judged by; end to end, a stream
// recovery's continuation waits for its slot as its client's.
import type { IncomingMessage, ServerResponse } from 'node:http';
import OpenAI from 'openai';
import { afterEach, describe, expect, it } from 'vitest';
import type { ProviderPool, Acquired, Slot, SlotRequest } from '../src/pools/provider-pool.ts';
import { clientPool, clientReq, flush, slot, type ClientPoolOptions } from './helpers/client-pool.ts';
import { WaitingBodies } from '../src/pools/waiting-bodies.ts';
import { cc, delta, DONE } from './helpers/scripted-provider.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { metricSum, useStacks } from './helpers/stack.ts';
import { recoveryConfig } from './helpers/recovery-config.ts';

const pool = (o: ClientPoolOptions = {}) => clientPool({ capacity: 1, ...o });
const req = (client: string, extra: Partial<SlotRequest> = {}) => clientReq(client, extra);

/** Queues a request labelled `label`: its grant goes to `order` and its slot to `held`; its outcome to `out[label]`. */
function queue(p: ProviderPool, label: string, r: SlotRequest, log: { order: string[]; held: Slot[]; out: Record<string, Acquired> }): void {
  void p.acquire(r).then((a) => {
    log.out[label] = a;
    if (!a.ok) return;
    log.order.push(label);
    log.held.push(a.slot);
  });
}
const newLog = () => ({ order: [] as string[], held: [] as Slot[], out: {} as Record<string, Acquired> });

describe('a freed slot among clients holding as many', () => {
  it('goes to the one served longest ago, then to a newcomer, then to the one served last', async () => {
    const p = pool();
    const log = newLog();
    const x = await slot(p, req('x'));
    queue(p, 'a0', req('a'), log);
    queue(p, 'a1', req('a'), log);
    queue(p, 'b0', req('b'), log);
    queue(p, 'b1', req('b'), log);
    await flush();
    x.release();
    await flush();
    log.held.shift()!.release();
    await flush();
    expect(log.order).toEqual(['a0', 'b0']);
    // a was served before b; c comes now, after both: a's turn, then c's, then b's.
    queue(p, 'c0', req('c'), log);
    await flush();
    for (let i = 0; i < 3; i++) {
      log.held.shift()!.release();
      await flush();
    }
    expect(log.order).toEqual(['a0', 'b0', 'a1', 'c0', 'b1']);
  });

  it("picks the fewest held among three clients' lanes, whatever their order", async () => {
    const p = pool({ capacity: 4 });
    const log = newLog();
    const aHeld = [await slot(p, req('a')), await slot(p, req('a'))];
    const cHeld = await slot(p, req('c'));
    const x = await slot(p, req('x'));
    // Lanes made in the order a, b, c; a holds 2, b none, c 1.
    queue(p, 'a0', req('a'), log);
    queue(p, 'b0', req('b'), log);
    queue(p, 'c0', req('c'), log);
    await flush();
    x.release();
    await flush();
    expect(log.order).toEqual(['b0']);
    void aHeld;
    void cHeld;
  });
});

describe("a client's entry, once it holds and waits for nothing", () => {
  it('is forgotten after its slot is given back: it comes back as a newcomer, not as served long ago', async () => {
    const p = pool();
    const log = newLog();
    (await slot(p, req('a'))).release();
    const b = await slot(p, req('b'));
    queue(p, 'c0', req('c'), log);
    queue(p, 'a0', req('a'), log);
    await flush();
    b.release();
    await flush();
    // c and a came at the same moment: by arrival. Remembered as served at the first grant, a went first.
    expect(log.order).toEqual(['c0']);
  });

  it('is forgotten after its waiter leaves: it comes back as a newcomer, not as one that came long ago', async () => {
    const p = pool();
    const log = newLog();
    const x = await slot(p, req('x'));
    const gone = new AbortController();
    queue(p, 'a-gone', req('a', { signal: gone.signal }), log);
    await flush();
    gone.abort();
    x.release();
    const y = await slot(p, req('y'));
    queue(p, 'c0', req('c'), log);
    queue(p, 'a0', req('a'), log);
    await flush();
    y.release();
    await flush();
    expect(log.order).toEqual(['c0']);
  });
});

describe('a full class queue gives a newcomer a place', () => {
  it('of the client waiting the most, of several waiting two more', async () => {
    const p = pool({ maxQueue: 5 });
    const log = newLog();
    await slot(p, req('x'));
    for (let i = 0; i < 2; i++) queue(p, `a${i}`, req('a'), log);
    for (let i = 0; i < 3; i++) queue(p, `b${i}`, req('b'), log);
    await flush();
    queue(p, 'c0', req('c'), log);
    await flush();
    expect(Object.keys(log.out)).toEqual(['b2']);
    expect(log.out.b2).toMatchObject({ ok: false, reason: 'queue_full' });
  });

  it("of that client's newest, not another client's newer one", async () => {
    const p = pool({ maxQueue: 5 });
    const log = newLog();
    await slot(p, req('x'));
    for (let i = 0; i < 3; i++) queue(p, `b${i}`, req('b'), log);
    for (let i = 0; i < 2; i++) queue(p, `a${i}`, req('a'), log);
    await flush();
    queue(p, 'c0', req('c'), log);
    await flush();
    expect(Object.keys(log.out)).toEqual(['b2']);
  });

  it("of that client's newest across its lanes (targets)", async () => {
    const p = pool({ maxQueue: 3 });
    const log = newLog();
    await slot(p, req('x'));
    // Lane t1 (made first): b0, b2; lane t2: b1. The newest is b2, at the end of the first lane looked at.
    queue(p, 'b0', req('b', { target: 'p/t1' }), log);
    queue(p, 'b1', req('b', { target: 'p/t2' }), log);
    queue(p, 'b2', req('b', { target: 'p/t1' }), log);
    await flush();
    queue(p, 'c0', req('c'), log);
    await flush();
    expect(Object.keys(log.out)).toEqual(['b2']);
  });

  it('of its newest still waiting, past one gone at the end of its lane', async () => {
    const p = pool({ maxQueue: 3 });
    const log = newLog();
    await slot(p, req('x'));
    const gone = new AbortController();
    queue(p, 'b0', req('b', { target: 'p/t2' }), log);
    queue(p, 'b1', req('b', { target: 'p/t1' }), log);
    queue(p, 'b-gone', req('b', { target: 'p/t1', signal: gone.signal }), log);
    await flush();
    gone.abort();
    queue(p, 'm0', req('m'), log);
    await flush();
    expect(p.snapshot().queued[0]).toBe(3);
    queue(p, 'c0', req('c'), log);
    await flush();
    expect(log.out.b1).toMatchObject({ ok: false, reason: 'queue_full' });
    expect(p.snapshot().queued[0]).toBe(3);
  });

  it("with the bytes of the body it displaces given back: a body that fits only then waits", async () => {
    const bodies = new WaitingBodies(1_000);
    const p = pool({ maxQueue: 2, bodies });
    const log = newLog();
    await slot(p, req('x'));
    queue(p, 'b0', req('b', { bodyBytes: 500 }), log);
    queue(p, 'b1', req('b', { bodyBytes: 500 }), log);
    await flush();
    queue(p, 'c0', req('c', { bodyBytes: 500 }), log);
    await flush();
    expect(log.out.b1).toMatchObject({ ok: false, reason: 'queue_full' });
    expect(log.out.c0).toBeUndefined();
    expect(bodies.bytes).toBe(1_000);
  });

  it("and the displaced waiter is told its own client's wait", async () => {
    const p = pool({ maxQueue: 4 });
    const log = newLog();
    await slot(p, req('b'));
    for (let i = 0; i < 4; i++) queue(p, `b${i}`, req('b'), log);
    await flush();
    queue(p, 'c0', req('c'), log);
    await flush();
    // Told when it gives its place (before c's waits): behind b's own 3 (no answer timed: 1 s each), not one turn.
    expect(log.out.b3).toEqual({ ok: false, reason: 'queue_full', retryAfterMs: 4_000 });
  });
});

describe("a flooding client's newcomer", () => {
  it('is shed for its deadline at once, judged by its own queue, not by one turn', async () => {
    const p = pool();
    await slot(p, req('flood'));
    for (let i = 0; i < 50; i++) void p.acquire(req('flood'));
    await flush();
    const answer = await Promise.race([p.acquire(req('flood', { deadlineAtMs: 5_000 })), flush().then(() => 'still waiting' as const)]);
    expect(answer).toMatchObject({ ok: false, reason: 'deadline' });
  });
});

describe("a stream recovery's continuation, end to end", () => {
  const startProvider = useFakeProviders();
  const startStack = useStacks();
  const SSE = { 'content-type': 'text/event-stream' };
  const role = cc([delta({ role: 'assistant', content: '' })]);
  let finishAll: (() => void) | undefined;
  afterEach(() => finishAll?.());

  it("waits for its slot as its client's: a quiet tenant's continuation goes before a flooding one's queued first", async () => {
    // The primary sends "Hel" and holds each stream open until cut; the backup (one slot) records each continuation's
    // user message and holds it until finished.
    const open: ServerResponse[] = [];
    const primary = (r: IncomingMessage, res: ServerResponse) => {
      r.resume();
      r.on('end', () => {
        res.writeHead(200, SSE);
        res.write(role + cc([delta({ content: 'Hel' })]));
        open.push(res);
      });
    };
    const seen: string[] = [];
    const finishers: Array<() => void> = [];
    const backup = (r: IncomingMessage, res: ServerResponse) => {
      let body = '';
      r.on('data', (c: Buffer) => (body += c.toString()));
      r.on('end', () => {
        const messages = (JSON.parse(body) as { messages: Array<{ role: string; content: string }> }).messages;
        seen.push(messages.find((m) => m.role === 'user')!.content);
        res.writeHead(200, SSE);
        res.write(role + cc([delta({ content: 'Hello' })]));
        finishers.push(() => res.end(cc([delta({ content: ' there.' })]) + cc([delta({}, 'stop')]) + DONE));
      });
    };
    finishAll = () => finishers.splice(0).forEach((f) => f());
    const pServer = await startProvider(primary);
    const qServer = await startProvider(backup);
    const s = await startStack({
      config: () =>
        recoveryConfig({
          pOrigin: pServer.origin,
          qOrigin: qServer.origin,
          qPools: { maxConcurrent: 1, classes: { online: { minShare: 0, maxQueue: 100 } } },
          extra: { auth: { keys: { flood: 'key-flood', quiet: 'key-quiet' } } },
        }),
    });
    const sdk = (apiKey: string) => new OpenAI({ baseURL: s.baseURL, apiKey, maxRetries: 0 });
    const streams: Array<Promise<string>> = [];
    const begin = async (apiKey: string, content: string) => {
      const stream = await sdk(apiKey).chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content }], stream: true });
      const it = stream[Symbol.asyncIterator]();
      let text = '';
      while (text !== 'Hel') text += (await it.next()).value?.choices[0]?.delta?.content ?? '';
      streams.push(
        (async () => {
          try {
            for (;;) {
              const { value, done } = await it.next();
              if (done) return text;
              text += value.choices[0]?.delta?.content ?? '';
            }
          } catch {
            return text;
          }
        })(),
      );
    };
    await begin('key-flood', 'f1');
    await begin('key-flood', 'f2');
    await begin('key-quiet', 'q1');
    const queued = () => metricSum(s, 'stormgate_pool_queue_depth{provider="q"');
    // f1's continuation takes q's one slot; then f2's queues, then q1's.
    open[0]!.socket?.destroy();
    await expect.poll(() => seen.length, { timeout: 5_000 }).toBe(1);
    open[1]!.socket?.destroy();
    await expect.poll(queued, { timeout: 5_000 }).toBe(1);
    open[2]!.socket?.destroy();
    await expect.poll(queued, { timeout: 5_000 }).toBe(2);
    // f1's ends: flood was served last, so quiet's continuation goes first, though f2's queued before it.
    finishers.shift()!();
    await expect.poll(() => seen.length, { timeout: 5_000 }).toBe(2);
    expect(seen).toEqual(['f1', 'q1']);
    finishers.shift()!();
    await expect.poll(() => seen.length, { timeout: 5_000 }).toBe(3);
    finishAll();
    expect(await Promise.all(streams)).toEqual(['Hello there.', 'Hello there.', 'Hello there.']);
  });
});
