// A whole answer is held in memory before it is passed on, so its size is bounded: a broken provider sending
// hundreds of MB must not exhaust the gateway's memory.
import { createServer } from 'node:http';
import { Pool } from 'undici';
import { afterEach, describe, expect, it } from 'vitest';
import { RequestAbort } from '../src/pipeline/request-abort.ts';
import { requestWhole } from '../src/providers/whole-answer.ts';

let close: (() => Promise<void>) | undefined;
let pool: Pool | undefined;
afterEach(async () => {
  await pool?.destroy();
  pool = undefined;
  await close?.();
  close = undefined;
});

/** The whole body, or undefined once it passes maxBytes (as the pipeline reads an answer). */
async function readWithin(url: string, maxBytes: number): Promise<Buffer | undefined> {
  pool ??= new Pool(url);
  const a = await requestWhole(pool, { path: '/', method: 'GET', headers: {}, body: '', signal: new RequestAbort().signal, maxBytes: () => maxBytes });
  return a.whole ? a.body : undefined;
}

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
    expect(await readWithin(url, 5_000)).toBeUndefined();
    expect((await readWithin(url, 20_000))?.length).toBe(10_000);
  });

  it('refuses an answer whose content-length is over the limit', async () => {
    const url = await serve((res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': '10000' });
      res.end('x'.repeat(10_000));
    });
    expect(await readWithin(url, 5_000)).toBeUndefined();
  });
});
