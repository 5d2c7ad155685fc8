// streamRecovery: continue gives back what the broken attempt held as soon as the break is known, before its
// continuation starts: the pool slot of the provider it no longer talks to, and the upstream response (cut off if it is
// still open). Held until the continuation ended, a recovering stream kept a slot of a provider that was failing and a
// dead or stalled socket for the whole continuation: under a brownout that cut many streams, half the pool.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { cc, delta, DONE, recoveringToNext } from './helpers/scripted-provider.ts';
import { chatCompletion, useFakeProviders } from './helpers/fake-provider.ts';
import { configServedBy, metricSum, useStacks, type Stack } from './helpers/stack.ts';

const role = cc([delta({ role: 'assistant', content: '' })]);

/** How p's first answer breaks after "Hel": a vLLM abort chunk with the response left open, a reset, or silence. */
type Break = 'abort' | 'reset' | 'stall';

interface Upstream {
  /** p's responses, in order, with whether each is closed. */
  fromP: Array<{ closed: boolean }>;
  /** q's responses (the continuation), with whether each is closed. */
  fromQ: Array<{ closed: boolean }>;
  /** Lets the continuation, held after "Hello", finish. */
  finish(): void;
}

/**
 * One server for both providers (p, then q, told by the key): p's first answer breaks after "Hel" as `how` says and
 * its later ones (not streamed) answer "second"; q's continuation sends "Hello" and waits for finish() before " there.".
 */
function provider(how: Break, qAnswer: 'hello' | 'busy' = 'hello'): { handler: (req: IncomingMessage, res: ServerResponse) => void; up: Upstream } {
  let finish!: () => void;
  const gate = new Promise<void>((resolve) => (finish = resolve));
  const up: Upstream = { fromP: [], fromQ: [], finish };
  const handler = (req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on('end', () => {
      const toQ = req.headers.authorization === 'Bearer q-key';
      const list = toQ ? up.fromQ : up.fromP;
      const entry = { closed: false };
      list.push(entry);
      res.on('close', () => (entry.closed = true));
      if (toQ && qAnswer === 'busy') {
        res.writeHead(503, { 'content-type': 'application/json' });
        res.end('{"error":{"message":"busy","type":"server_error"}}');
        return;
      }
      if (!toQ && list.length > 1) {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(chatCompletion('second'));
        return;
      }
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      if (toQ) {
        res.write(role + cc([delta({ content: 'Hello' })]));
        void gate.then(() => res.end(cc([delta({ content: ' there.' })]) + cc([delta({}, 'stop')]) + DONE));
      } else if (list.length === 1) {
        res.write(role + cc([delta({ content: 'Hel' })]));
        if (how === 'abort') res.write(cc([delta({}, 'abort', 0, { stop_reason: null })]));
        // Left open: the abort's [DONE] never comes, nor does anything after a stall.
        else if (how === 'reset') setTimeout(() => res.socket?.destroy(), 30);
      }
    });
  };
  return { handler, up };
}

const inUseAtP = (s: Stack) => metricSum(s, 'stormgate_pool_in_use{provider="p"');

describe('streamRecovery: the broken attempt gives back its slot and its upstream before the continuation', () => {
  const startProvider = useFakeProviders();
  const startStack = useStacks();
  // Registered after the stacks' clean-up, so it runs first: a continuation still held would keep the gateway's close waiting.
  let finishHeld: (() => void) | undefined;
  afterEach(() => finishHeld?.());

  async function start(how: Break, qAnswer: 'hello' | 'busy' = 'hello') {
    const { handler, up } = provider(how, qAnswer);
    finishHeld = up.finish;
    const p = await startProvider(handler);
    const s = await startStack({
      config: (mockUrl) => {
        const c = configServedBy(mockUrl, 'p', `${p.origin}/v1`);
        // One slot at p: while the broken stream's continuation runs, another request to p needs the slot it held.
        Object.assign(c.providers.p as Record<string, unknown>, { pools: { maxConcurrent: 1 }, timeouts: { connectMs: 2000, firstTokenMs: 30000, idleMs: how === 'stall' ? 300 : 30000 } });
        recoveringToNext()(c, p.origin);
        return c;
      },
    });
    return { client: new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 }), s, up };
  }

  /** Opens the streamed request and reads it until the continuation's "Hello" is in; returns the rest of the read. */
  async function untilContinued(client: OpenAI) {
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    const it = stream[Symbol.asyncIterator]();
    let text = '';
    while (text !== 'Hello') {
      const { value, done } = await it.next();
      if (done) throw new Error(`the stream ended at ${JSON.stringify(text)}`);
      text += value.choices[0]?.delta?.content ?? '';
    }
    const rest = async () => {
      for (;;) {
        const { value, done } = await it.next();
        if (done) return text;
        text += value.choices[0]?.delta?.content ?? '';
      }
    };
    return { stream, rest };
  }

  for (const how of ['abort', 'reset', 'stall'] as const) {
    it(`(${how}) frees p's slot and closes p's response while the continuation streams, and gives the slot back once`, async () => {
      const { client, s, up } = await start(how);
      const { rest } = await untilContinued(client);
      expect(up.fromQ).toHaveLength(1);
      expect(up.fromQ[0]!.closed).toBe(false);
      // The broken upstream is let go of: its response closed, and p's slot free for the next request.
      await expect.poll(() => up.fromP[0]!.closed, { timeout: 3_000 }).toBe(true);
      expect(await inUseAtP(s)).toBe(0);
      const second = await Promise.race([
        client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }).then((r) => r.choices[0]!.message.content),
        new Promise((resolve) => setTimeout(() => resolve('still waiting for p\'s slot'), 5_000)),
      ]);
      expect(second).toBe('second');
      up.finish();
      expect(await rest()).toBe('Hello there.');
      // Given back once: the continuation's end releases nothing more (a second release would free a slot not held).
      expect(await inUseAtP(s)).toBe(0);
      expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="recovered"}')).toBe(1);
      expect(await metricSum(s, 'stormgate_upstream_attempts_total{target="p/gpt-4o"')).toBe(2);
      expect(await metricSum(s, 'stormgate_upstream_attempts_total{target="q/gpt-4o"')).toBe(1);
      // p still takes one request at a time, and it has one.
      const third = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
      expect(third.choices[0]!.message.content).toBe('second');
      expect(await inUseAtP(s)).toBe(0);
    });
  }

  it('gives the slot back once when the client leaves during the continuation', async () => {
    const { client, s, up } = await start('abort');
    const { stream } = await untilContinued(client);
    await expect.poll(() => up.fromP[0]!.closed, { timeout: 3_000 }).toBe(true);
    stream.controller.abort();
    await expect.poll(() => up.fromQ[0]!.closed, { timeout: 3_000 }).toBe(true);
    await expect.poll(() => s.logs.some((l) => l.includes('"reqId"')), { timeout: 3_000 }).toBe(true);
    expect(await inUseAtP(s)).toBe(0);
    const next = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    expect(next.choices[0]!.message.content).toBe('second');
    expect(await inUseAtP(s)).toBe(0);
    up.finish();
  });

  it('gives the slot back once when the continuation fails, and the client gets the original cut', async () => {
    const { client, s, up } = await start('abort', 'busy');
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    let text = '';
    let err: unknown;
    try {
      for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    } catch (e) {
      err = e;
    }
    expect(text).toBe('Hel');
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(up.fromQ).toHaveLength(1);
    await expect.poll(() => up.fromP[0]!.closed, { timeout: 3_000 }).toBe(true);
    expect(await inUseAtP(s)).toBe(0);
    const next = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    expect(next.choices[0]!.message.content).toBe('second');
    expect(await inUseAtP(s)).toBe(0);
    expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="cut"}')).toBe(1);
  });
});
