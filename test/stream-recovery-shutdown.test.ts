// A stream that streamRecovery is continuing on the next target ends at the end of a drain's grace period as any
// stream does: with the stream_interrupted error event ("the gateway instance is shutting down") the SDKs raise, its
// continuation's upstream request aborted, and the gateway's close not held by it. The broken stream's own upstream
// was let go of at the break, so ending that one alone ended nothing: the continuation ran on until the exit cut it.
// Also what the client gets when its deadline passes during a continuation (nothing: a started stream is bounded by
// its idle timer, not by the deadline).
import { once } from 'node:events';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { cc, delta, DONE, recoveringToNext } from './helpers/scripted-provider.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { configServedBy, metricSum, requestLine, useStacks } from './helpers/stack.ts';
import { streamUntil } from './helpers/chat-stream.ts';

const role = cc([delta({ role: 'assistant', content: '' })]);
const GRACE_MS = 300;
/** Generous for a loaded two-core machine: the drain itself gives interrupted streams 500 ms after the grace period. */
const PROMPTLY_MS = 3_000;

/**
 * Where the continuation (q's answer) is held: `output`, after "Hello" (its first output, spliced on after the
 * delivered "Hel"); `headers`, before its response headers (its request sent, nothing answered).
 */
type HeldAt = 'output' | 'headers';

interface Upstream {
  /** q's responses, with whether each is closed (the gateway aborted its request, or it ended). */
  fromQ: Array<{ closed: boolean }>;
  /** Lets the held continuation finish. */
  finish(): void;
}

/** p breaks its stream after "Hel" (a reset); q's continuation is held where `heldAt` says until finish(). */
function provider(heldAt: HeldAt): { handler: (req: IncomingMessage, res: ServerResponse) => void; up: Upstream } {
  let finish!: () => void;
  const gate = new Promise<void>((resolve) => (finish = resolve));
  const up: Upstream = { fromQ: [], finish };
  const handler = (req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on('end', () => {
      if (req.headers.authorization !== 'Bearer q-key') {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(role + cc([delta({ content: 'Hel' })]));
        setTimeout(() => res.socket?.destroy(), 30);
        return;
      }
      const entry = { closed: false };
      up.fromQ.push(entry);
      res.on('close', () => (entry.closed = true));
      const rest = () => res.end(cc([delta({ content: ' there.' })]) + cc([delta({}, 'stop')]) + DONE);
      if (heldAt === 'headers') {
        void gate.then(() => {
          if (res.destroyed) return;
          res.writeHead(200, { 'content-type': 'text/event-stream' });
          res.write(role + cc([delta({ content: 'Hello' })]));
          rest();
        });
        return;
      }
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(role + cc([delta({ content: 'Hello' })]));
      void gate.then(() => !res.destroyed && rest());
    });
  };
  return { handler, up };
}

/** How long `work` took in ms, or Infinity when it had not finished after `boundMs`. */
async function timed(work: Promise<unknown>, boundMs = PROMPTLY_MS): Promise<number> {
  const started = Date.now();
  const done = await Promise.race([work.then(() => true), sleep(boundMs, false)]);
  return done ? Date.now() - started : Infinity;
}

describe('a stream being continued by streamRecovery', () => {
  const startProvider = useFakeProviders();
  const startStack = useStacks();
  // Registered after the stacks' clean-up, so it runs first: a continuation still held would keep the gateway's close waiting.
  let finishHeld: (() => void) | undefined;
  afterEach(() => finishHeld?.());

  async function start(heldAt: HeldAt, route: Record<string, unknown> = {}) {
    const { handler, up } = provider(heldAt);
    finishHeld = up.finish;
    const p = await startProvider(handler);
    const s = await startStack({
      config: (mockUrl) => {
        const c = configServedBy(mockUrl, 'p', `${p.origin}/v1`);
        Object.assign(c.providers.p as Record<string, unknown>, { timeouts: { connectMs: 2000, firstTokenMs: 30000, idleMs: 30000 } });
        recoveringToNext()(c, p.origin);
        Object.assign(c.providers.q as Record<string, unknown>, { timeouts: { connectMs: 2000, firstTokenMs: 30000, idleMs: 30000 } });
        for (const r of c.routes) if (r.name === 'chat') Object.assign(r, route);
        c.drain = { preStopMs: 0, graceMs: GRACE_MS };
        return c;
      },
    });
    return { client: new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 }), s, up };
  }

  const until = async (client: OpenAI, wanted: string) => (await streamUntil(client, wanted)).rest;

  for (const heldAt of ['output', 'headers'] as const) {
    it(`(held at its ${heldAt}) ends at the grace period's end with the shutdown's error event, its continuation's request aborted`, async () => {
      const { client, s, up } = await start(heldAt);
      const rest = await until(client, heldAt === 'output' ? 'Hello' : 'Hel');
      await expect.poll(() => up.fromQ.length, { timeout: 3_000 }).toBe(1);
      const serverClosed = once(s.gateway.server, 'close');
      const drained = s.gateway.drain();
      const ended = rest();
      expect(await timed(drained, GRACE_MS + PROMPTLY_MS)).toBeLessThan(GRACE_MS + PROMPTLY_MS);
      // The error event the README promises, which the SDK raises: not a reset, nor an end that looks clean.
      const { text, err } = await Promise.race([ended, sleep(PROMPTLY_MS, { text: 'still streaming', err: undefined })]);
      expect(text).toBe(heldAt === 'output' ? 'Hello' : 'Hel');
      expect(err).toBeInstanceOf(OpenAI.APIError);
      expect((err as InstanceType<typeof OpenAI.APIError>).message).toContain('the gateway instance is shutting down');
      expect((err as InstanceType<typeof OpenAI.APIError>).code).toBe('stream_interrupted');
      // The continuation's upstream request is aborted, and the gateway's close is not held by it.
      await expect.poll(() => up.fromQ[0]!.closed, { timeout: PROMPTLY_MS }).toBe(true);
      expect(await timed(serverClosed)).toBeLessThan(PROMPTLY_MS);
      // Logged (and counted) as a stream the shutdown ended; /metrics went with the server.
      const line = await requestLine(s);
      expect([line.outcome, line.streamEnd]).toEqual(['stream_error', 'shutdown']);
    });
  }

  it('is not cut by the deadline: a started stream (its continuation included) is bounded by its idle timer', async () => {
    const { client, s, up } = await start('output', { timeoutMs: 1_000 });
    const rest = await until(client, 'Hello');
    // Past the request's deadline, with the continuation still held.
    await sleep(1_500);
    expect(up.fromQ[0]!.closed).toBe(false);
    up.finish();
    expect(await rest()).toEqual({ text: 'Hello there.' });
    expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="recovered"}')).toBe(1);
  });
});
