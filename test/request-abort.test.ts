import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { Agent, request } from 'undici';
import { createServer } from 'node:http';
import { asAbortSignal, RequestAbort } from '../src/pipeline/request-abort.ts';

describe('RequestAbort', () => {
  it('calls each listener once, with the reason set, and never one added after the abort', () => {
    const a = new RequestAbort();
    const calls: unknown[] = [];
    a.signal.addEventListener('abort', () => calls.push(a.signal.reason), { once: true });
    const removed = () => calls.push('removed');
    a.signal.addEventListener('abort', removed);
    a.signal.removeEventListener('abort', removed);
    const why = new Error('why');
    a.abort(why);
    a.abort(new Error('again'));
    a.signal.addEventListener('abort', () => calls.push('late'));
    expect(calls).toEqual([why]);
    expect(a.signal.aborted).toBe(true);
    expect(a.signal.reason).toBe(why);
  });

  it('gives an AbortError as the reason when none is given, like AbortController', () => {
    const a = new RequestAbort();
    a.abort();
    expect((a.signal.reason as DOMException).name).toBe('AbortError');
  });

  it("keeps calling listeners when one throws, and does not throw to abort()'s caller", async () => {
    const a = new RequestAbort();
    const seen: string[] = [];
    const thrown = new Promise<unknown>((resolve) => process.once('uncaughtException', resolve));
    a.signal.addEventListener('abort', () => {
      throw new Error('listener failed');
    });
    a.signal.addEventListener('abort', () => seen.push('second'));
    expect(() => a.abort()).not.toThrow();
    expect(seen).toEqual(['second']);
    expect(((await thrown) as Error).message).toBe('listener failed');
  });

  it('cuts a node:timers/promises sleep short', async () => {
    const a = new RequestAbort();
    const started = Date.now();
    setTimeout(() => a.abort(new Error('stop')), 20);
    await expect(sleep(5_000, undefined, { signal: asAbortSignal(a.signal) })).rejects.toMatchObject({ name: 'AbortError' });
    expect(Date.now() - started).toBeLessThan(2_000);
  });

  it('works as the signal of undici requests, finished and aborted in flight', async () => {
    const server = createServer((req, res) => {
      if (req.url === '/hang') return;
      res.end('ok');
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as { port: number };
    const agent = new Agent();
    try {
      const done = new RequestAbort();
      const res = await request(`http://127.0.0.1:${port}/`, { dispatcher: agent, signal: asAbortSignal(done.signal) });
      expect(await res.body.text()).toBe('ok');
      const hanging = new RequestAbort();
      const pending = request(`http://127.0.0.1:${port}/hang`, { dispatcher: agent, signal: asAbortSignal(hanging.signal) });
      setTimeout(() => hanging.abort(new Error('client gone')), 20);
      await expect(pending).rejects.toThrow('client gone');
    } finally {
      await agent.destroy();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });
});
