// Clients that stop reading their answer while keeping the connection open (a hung consumer, a proxy that stopped
// reading): the gateway holds a whole answer in memory until it is taken, so it must not hold it for ever.
import { connect } from 'node:net';
import { describe, expect, it } from 'vitest';
import { useFakeProviders, type FakeProvider } from './helpers/fake-provider.ts';
import { configServedBy, useStacks, type Stack } from './helpers/stack.ts';

const fakeProvider = useFakeProviders();
const start = useStacks();

/** An answer larger than the sockets' buffers on the way (a few MB on loopback), so most of it waits in the gateway. */
const BIG_ANSWER = JSON.stringify({
  id: 'chatcmpl-big',
  object: 'chat.completion',
  created: 1,
  model: 'gpt-4o',
  choices: [{ index: 0, message: { role: 'assistant', content: 'x'.repeat(16 * 1024 * 1024) }, finish_reason: 'stop' }],
});

/** A gateway whose one provider answers BIG_ANSWER, with an idle period of 100 ms: a client stall is a second. */
async function bigAnswerStack(passthrough = false): Promise<Stack & { provider: FakeProvider }> {
  const provider = await fakeProvider((req, res) => {
    req.resume();
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(BIG_ANSWER);
  });
  const s = await start({
    config: (mockUrl) => {
      const c = configServedBy(mockUrl, 'big', `${provider.origin}/v1`);
      c.providers.big = { ...c.providers.big!, timeouts: { idleMs: 100 } };
      if (passthrough) c.passthrough = { provider: 'big', paths: ['/v1/files'], methods: ['GET'] };
      return c;
    },
  });
  return Object.assign(s, { provider });
}

const CHAT = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
const CHAT_REQUEST = `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${CHAT.length}\r\n\r\n${CHAT}`;

/**
 * Sends `request` on a connection that takes the first bytes of the answer and then reads nothing more, keeping the
 * connection open; resolves once the gateway has closed it and logged `logged`. Bounds, not waits: ten idle periods
 * are a second, counted once the sockets' buffers are full, which takes longer on a loaded machine.
 */
async function stallUntilClosed(s: Stack, request: string, logged: string, deadline = Date.now() + 20_000): Promise<void> {
  const { port } = new URL(s.url);
  const socket = connect(Number(port), '127.0.0.1');
  let received = 0;
  socket.on('data', (d: Buffer) => {
    received += d.length;
    socket.pause();
  });
  socket.on('error', () => undefined);
  socket.write(request);
  const until = async (done: () => boolean | Promise<boolean>) => {
    while (!(await done()) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  };
  try {
    const connections = () => new Promise<number>((resolve) => s.gateway.server.getConnections((_e, n) => resolve(n)));
    await until(() => received > 0);
    expect(received).toBeGreaterThan(0);
    expect(await connections()).toBe(1);
    await until(async () => (await connections()) === 0);
    expect(await connections()).toBe(0);
    await until(() => s.logs.join('').includes(logged));
    expect(s.logs.join('')).toContain(logged);
  } finally {
    socket.destroy();
  }
}

describe('a client that stops reading a whole answer', () => {
  it("has its connection closed after ten idle periods of the provider, as a stream's is, instead of pinning the answer", async () => {
    const s = await bigAnswerStack();
    await stallUntilClosed(s, CHAT_REQUEST, '"outcome":"client_gone"');
    expect(s.logs.join('')).toContain('"clientStalled":true');
  });

  it('on a passthrough path, has its connection closed too, which frees the upstream connection it held', async () => {
    const s = await bigAnswerStack(true);
    const deadline = Date.now() + 20_000;
    await stallUntilClosed(s, 'GET /v1/files/file-abc/content HTTP/1.1\r\nhost: x\r\n\r\n', '"clientGone":true', deadline);
    // The provider's side of the connection the download held is closed too.
    while (!s.provider.sockets.every((c) => c.destroyed) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    expect(s.provider.sockets.every((c) => c.destroyed)).toBe(true);
  });

  it('is not one that reads slowly: pauses of several idle periods each, the whole answer arrives, and the connection is kept', async () => {
    const s = await bigAnswerStack();
    const { port } = new URL(s.url);
    const socket = connect(Number(port), '127.0.0.1');
    socket.on('error', () => undefined);
    let text = '';
    socket.setEncoding('latin1');
    let reading = false;
    socket.on('data', (d: string) => {
      text += d;
      if (reading) return;
      // Reads for 50 ms, then nothing for four idle periods: slow, yet never a second without taking something.
      reading = true;
      setTimeout(() => {
        socket.pause();
        setTimeout(() => {
          reading = false;
          socket.resume();
        }, 400);
      }, 50);
    });
    /** Waits until `n` answers have come whole on the connection (their content-length read). */
    const answers = async (n: number): Promise<string[]> => {
      const deadline = Date.now() + 60_000;
      for (;;) {
        const found: string[] = [];
        let rest = text;
        while (found.length < n) {
          const head = rest.indexOf('\r\n\r\n');
          const length = /content-length: (\d+)/i.exec(rest.slice(0, head))?.[1];
          if (head === -1 || length === undefined || rest.length < head + 4 + Number(length)) break;
          found.push(rest.slice(head + 4, head + 4 + Number(length)));
          rest = rest.slice(head + 4 + Number(length));
        }
        if (found.length === n) return found;
        if (socket.destroyed || Date.now() > deadline) throw new Error(`${found.length} of ${n} answers came (${text.length} bytes)`);
        await new Promise((r) => setTimeout(r, 50));
      }
    };
    try {
      socket.write(CHAT_REQUEST);
      expect((await answers(1))[0]).toBe(BIG_ANSWER);
      // Idle longer than the stall limit between requests: the keep-alive timeout applies then, not the stall's.
      await new Promise((r) => setTimeout(r, 1_500));
      socket.write(CHAT_REQUEST);
      expect((await answers(2))[1]).toBe(BIG_ANSWER);
      expect(s.logs.join('')).not.toContain('clientStalled');
    } finally {
      socket.destroy();
    }
  });
});

describe('the stall limit of a whole answer', () => {
  /** A provider that answers `first` at once and `second` (a request whose message says slow) after 1.5 s. */
  async function twoSpeedStack(idleMs: number): Promise<Stack> {
    const provider = await fakeProvider((req, res) => {
      let body = '';
      req.on('data', (d: Buffer) => (body += d));
      req.on('end', () => {
        const slow = body.includes('slow');
        const answer = JSON.stringify({ id: 'c', object: 'chat.completion', created: 1, model: 'gpt-4o', choices: [{ index: 0, message: { role: 'assistant', content: slow ? 'second' : 'first' }, finish_reason: 'stop' }] });
        setTimeout(() => {
          res.writeHead(200, { 'content-type': 'application/json' });
          res.end(answer);
        }, slow ? 1_500 : 0);
      });
    });
    return start({
      config: (mockUrl) => {
        const c = configServedBy(mockUrl, 'p', `${provider.origin}/v1`);
        c.providers.p = { ...c.providers.p!, timeouts: { idleMs } };
        return c;
      },
    });
  }
  const chat = (content: string) => {
    const b = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content }] });
    return `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${b.length}\r\n\r\n${b}`;
  };

  it('does not cut a request pipelined behind it that waits on its provider longer than the limit', async () => {
    // Ten idle periods of 50 ms: a stall limit of half a second, a third of what the second request waits.
    const s = await twoSpeedStack(50);
    const socket = connect(Number(new URL(s.url).port), '127.0.0.1');
    let text = '';
    let closed = false;
    socket.setEncoding('latin1');
    socket.on('data', (d: string) => (text += d));
    socket.on('close', () => (closed = true));
    socket.on('error', () => undefined);
    try {
      socket.write(chat('fast') + chat('slow'));
      const deadline = Date.now() + 20_000;
      while (!text.includes('"second"') && !closed && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
      expect(text).toContain('"first"');
      expect(text).toContain('"second"');
      expect(closed).toBe(false);
    } finally {
      socket.destroy();
    }
  });

  it('of an idle period near the longest timer is no timer overflow (a warning on every answer)', async () => {
    const s = await twoSpeedStack(2 ** 31 - 1);
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(w.name);
    process.on('warning', onWarning);
    try {
      const res = await fetch(`${s.baseURL}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'fast' }] }) });
      expect(res.status).toBe(200);
      await res.text();
      await new Promise((r) => setImmediate(r));
      expect(warnings).not.toContain('TimeoutOverflowWarning');
    } finally {
      process.off('warning', onWarning);
    }
  });
});
