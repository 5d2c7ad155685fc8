// streamRecovery: continue, when the client stops reading during the continuation: the continuation is another
// LiveStream, with the client-stall timer of its own target, and the stream it continues stopped its own timers at the
// break. A continuation ends as the stream it continues would: the client is given up on (`client-stalled`), its
// connection closed, the request logged and counted, and the continuation's upstream request aborted.
import { connect } from 'node:net';
import { describe, expect, it } from 'vitest';
import { cc, delta, recoveringToNext, scripted, type Script } from './helpers/scripted-provider.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { configServedBy, metricSum, useStacks } from './helpers/stack.ts';
import { createMetrics } from '../src/observability/metrics.ts';

const startProvider = useFakeProviders();
const startStack = useStacks();

const role = cc([delta({ role: 'assistant', content: '' })]);
/** The first target's answer: "Hel", then a cut. */
const cutAfterHel: Script = { steps: [role, cc([delta({ content: 'Hel' })]), 30, { destroy: true }] };
/** The next target's: "Hello", then more text than the sockets on the way hold (16 MB), its response left open. */
const longAnswer: Script = { steps: [role, cc([delta({ content: 'Hello' })]), ...Array.from({ length: 256 }, () => cc([delta({ content: 'x'.repeat(64 * 1024) })]))], hold: true };

describe('a client that stops reading a stream recovery\'s continuation', () => {
  it('is given up on within the stall limit: client-stalled logged and counted, its connection closed, the continuation\'s upstream aborted', async () => {
    const closed: number[] = [];
    let n = 0;
    const play = scripted((_b, k) => (k === 1 ? cutAfterHel : longAnswer));
    const provider = await startProvider((req, res) => {
      const k = ++n;
      res.on('close', () => closed.push(k));
      play(req, res);
    });
    const metrics = createMetrics({ defaultMetrics: false });
    const inUseAtQ = async () => {
      metrics.collectPools();
      return (await metrics.poolInUse.get()).values.filter((v) => v.labels.provider === 'q').reduce((sum, v) => sum + v.value, 0);
    };
    const s = await startStack({
      deps: { metrics },
      config: (mockUrl) => {
        const c = configServedBy(mockUrl, 'p', `${provider.origin}/v1`);
        // The broken stream's own stall limit is long (300 s); the continuation's target stalls its client in a second.
        (c.providers.p as Record<string, unknown>).timeouts = { connectMs: 2000, firstTokenMs: 30000, idleMs: 30000 };
        recoveringToNext()(c, provider.origin);
        (c.providers.q as Record<string, unknown>).timeouts = { connectMs: 2000, firstTokenMs: 30000, idleMs: 100 };
        return c;
      },
    });
    const socket = connect(Number(new URL(s.url).port), '127.0.0.1');
    let received = '';
    let socketClosed = false;
    socket.setEncoding('latin1');
    socket.on('data', (d: string) => {
      received += d;
      // Stops reading once the continuation has begun, keeping the connection open.
      if (received.includes('stream recovered')) socket.pause();
    });
    socket.on('close', () => (socketClosed = true));
    socket.on('error', () => undefined);
    const body = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    socket.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`);
    // Bounds, not waits: ten idle periods of the continuation's target are a second, counted once the sockets' buffers
    // are full, which takes longer on a loaded machine.
    const deadline = Date.now() + 20_000;
    const until = async (done: () => boolean | Promise<boolean>) => {
      while (!(await done()) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    };
    try {
      await until(() => received.includes('stream recovered'));
      expect(received).toContain('stream recovered');
      // The continuation holds a slot of q's pool until it ends, and gives it back when its client is given up on
      // (read from the registry: a scrape's keep-alive connection would be one more connection to the gateway).
      expect(await inUseAtQ()).toBe(1);
      const connections = () => new Promise<number>((resolve) => s.gateway.server.getConnections((_e, c) => resolve(c)));
      await until(async () => (await connections()) === 0);
      expect(await connections()).toBe(0);
      // Paused, the client hears the close only once it reads what was buffered before it.
      socket.removeAllListeners('data');
      socket.resume();
      await until(() => socketClosed);
      expect(socketClosed).toBe(true);
      await until(() => s.logs.join('').includes('"streamEnd"'));
      expect(s.logs.join('')).toContain('"streamEnd":"client-stalled"');
      expect(await metricSum(s, 'stormgate_requests_total{route="chat"')).toBe(1);
      expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="client-stalled"}')).toBe(1);
      // The continuation's upstream response (the second request) is closed too.
      await until(() => closed.includes(2));
      expect(closed).toContain(2);
      await until(async () => (await inUseAtQ()) === 0);
      expect(await inUseAtQ()).toBe(0);
    } finally {
      socket.destroy();
    }
  }, 30_000);
});
