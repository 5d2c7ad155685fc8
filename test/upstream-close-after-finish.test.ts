// A provider that closes its connection right after an answer's last events, without the chunked end of its response
// (a proxy's idle cut, a server that exits after writing): undici then destroys the response's body ("other side
// closed"), and what it had already read from the socket went with it whenever the gateway had not yet asked for it
// (its client was reading slowly, or the event loop was busy). A finished answer ended as a cut on a loaded instance
// (test/network-faults.test.ts failed 3 runs in 6 beside another test file) and whole on an idle one.
import { createServer, type Server, type Socket } from 'node:net';
import { once } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { Agent, request } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';
import { handedOverStream } from './helpers/live-stream.ts';
import { bodyChunks } from '../src/providers/body-chunks.ts';
import { chatChunk } from './helpers/fake-provider.ts';

const servers: Server[] = [];
const agents: Agent[] = [];
afterEach(async () => {
  await Promise.all(agents.splice(0).map((a) => a.close()));
  for (const s of servers.splice(0)) await new Promise((r) => s.close(r));
});

const frame = (text: string) => `${Buffer.byteLength(text).toString(16)}\r\n${text}\r\n`;

/** A provider that sends `first`, then (once `go` resolves) `last` and a FIN: the response's chunked end never comes. */
async function closingProvider(first: string, last: string, go: Promise<void>): Promise<string> {
  const server = createServer((socket: Socket) => {
    socket.once('data', async () => {
      socket.write(`HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n${frame(first)}`);
      await go;
      socket.end(frame(last));
    });
  });
  servers.push(server);
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return `http://127.0.0.1:${(server.address() as { port: number }).port}`;
}

describe('an answer whose provider closes the connection after its finish chunk, without the response\'s end', () => {
  it('reaches the client whole, with [DONE], when the bytes came while the gateway was busy with its client', async () => {
    let go!: () => void;
    const origin = await closingProvider(chatChunk({ content: 'Hel' }, null), chatChunk({ content: 'lo' }, 'stop'), new Promise<void>((r) => (go = r)));
    const agent = new Agent();
    agents.push(agent);
    const controller = new AbortController();
    const res = await request(`${origin}/v1/chat/completions`, { method: 'POST', body: '{}', dispatcher: agent, signal: controller.signal });
    // As runAttempt reads a stream: through bodyChunks, on the attempt's own signal.
    const iterator = bodyChunks(res.body, controller.signal);
    const first = await iterator.next();
    const { live, ended } = handedOverStream({ first: first.value as Buffer, iterator, controller, idleMs: 5_000 });
    let text = '';
    for await (const part of live.body()) {
      if (text === '') {
        // The client takes its time with the first part: meanwhile the provider sends its finish and closes, and
        // undici reads both and destroys the body.
        go();
        while (!res.body.destroyed) await sleep(5);
      }
      text += part;
    }
    expect(text).toContain('"finish_reason":"stop"');
    expect(text).not.toContain('stream_interrupted');
    expect(text.endsWith('data: [DONE]\n\n')).toBe(true);
    expect((await ended).kind).toBe('done-added');
  });
});
