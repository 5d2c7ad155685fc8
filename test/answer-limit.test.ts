// A whole answer is held in memory before it is passed on, so its size is bounded: a broken provider sending
// hundreds of MB must not exhaust the gateway's memory.
import { createServer } from 'node:http';
import { request } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';
import { readWithin } from '../src/pipeline/attempt.ts';

let close: (() => Promise<void>) | undefined;
afterEach(async () => {
  await close?.();
  close = undefined;
});

async function serve(send: (res: import('node:http').ServerResponse) => void): Promise<string> {
  const server = createServer((_req, res) => send(res));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  close = () => new Promise((r) => server.close(() => r()));
  return `http://127.0.0.1:${(server.address() as { port: number }).port}`;
}

describe('reading a whole answer', () => {
  it('stops at the limit when the answer has no length, and reads an answer within it whole', async () => {
    const url = await serve((res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      for (let i = 0; i < 10; i++) res.write('x'.repeat(1000));
      res.end();
    });
    const over = await request(url);
    expect(await readWithin(over.body, 5_000, undefined)).toBeUndefined();
    const within = await request(url);
    expect((await readWithin(within.body, 20_000, undefined))?.length).toBe(10_000);
  });

  it('refuses at once an answer whose content-length is over the limit', async () => {
    const url = await serve((res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': '10000' });
      res.end('x'.repeat(10_000));
    });
    const res = await request(url);
    expect(await readWithin(res.body, 5_000, 10_000)).toBeUndefined();
  });
});
