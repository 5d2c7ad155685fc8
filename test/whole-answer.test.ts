import { createServer, type Server } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Pool } from 'undici';
import { requestWhole } from '../src/providers/whole-answer.ts';
import { RequestAbort } from '../src/pipeline/request-abort.ts';

let server: Server;
let pool: Pool;
let connections = 0;
let requests = 0;

beforeAll(async () => {
  server = createServer((req, res) => {
    requests++;
    req.resume();
    const url = req.url ?? '/';
    if (url === '/small') return res.end(JSON.stringify({ ok: true }));
    if (url === '/hints') {
      res.writeEarlyHints({ link: '</style.css>; rel=preload' });
      return res.end('{"after":"hints"}');
    }
    if (url === '/big-error') {
      res.writeHead(500, { 'content-type': 'application/json' });
      // Written in pieces, so the cap falls inside a chunk.
      for (let i = 0; i < 10; i++) res.write('x'.repeat(1_000));
      return res.end();
    }
    if (url === '/slow') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"partial":');
      return; // never ends
    }
    res.writeHead(404).end();
  });
  server.on('connection', () => connections++);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  pool = new Pool(`http://127.0.0.1:${(server.address() as { port: number }).port}`, { connections: 4 });
});

afterAll(async () => {
  await pool.destroy();
  server.closeAllConnections();
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

const get = (path: string, signal = new RequestAbort().signal, maxBytes: (status: number) => number = () => 1_000_000, via: Pool = pool) =>
  requestWhole(via, { path, method: 'GET', headers: {}, body: '', signal, maxBytes });

describe('requestWhole', () => {
  it('resolves with the status, the parsed headers and the whole body', async () => {
    const a = await get('/small');
    expect(a).toMatchObject({ statusCode: 200, whole: true });
    expect(a.headers['content-length']).toBe('11');
    expect(a.body.toString()).toBe('{"ok":true}');
  });

  it('skips an informational answer and returns the real one', async () => {
    const a = await get('/hints');
    expect(a.statusCode).toBe(200);
    expect(a.body.toString()).toBe('{"after":"hints"}');
    expect(a.headers.link).toBeUndefined();
  });

  it("keeps the first maxBytes of a larger body, by the answer's status, and closes that connection", async () => {
    const before = connections;
    const a = await get('/big-error', undefined, (status) => (status >= 500 ? 2_500 : 1_000_000));
    expect(a).toMatchObject({ statusCode: 500, whole: false });
    expect(a.body.length).toBe(2_500);
    // The unread rest is not carried into the next request: it gets a connection of its own.
    expect((await get('/small')).body.toString()).toBe('{"ok":true}');
    expect(connections).toBeGreaterThan(before);
  });

  it("rejects with the signal's reason when it aborts mid-body, and at once when it already has", async () => {
    const abort = new RequestAbort();
    const pending = get('/slow', abort.signal);
    setTimeout(() => abort.abort(new Error('deadline')), 50);
    await expect(pending).rejects.toThrow('deadline');
    // Already aborted: rejected without sending anything.
    const sent = requests;
    await expect(get('/small', abort.signal)).rejects.toThrow('deadline');
    expect(requests).toBe(sent);
  });

  it('rejects at once when aborted while still queued for a connection', async () => {
    const one = new Pool(`http://127.0.0.1:${(server.address() as { port: number }).port}`, { connections: 1 });
    const busy = new RequestAbort();
    const queued = new RequestAbort();
    try {
      const first = get('/slow', busy.signal, undefined, one);
      const second = get('/small', queued.signal, undefined, one);
      setTimeout(() => queued.abort(new Error('deadline while queued')), 30);
      const started = Date.now();
      await expect(second).rejects.toThrow('deadline while queued');
      expect(Date.now() - started).toBeLessThan(1_000);
      busy.abort(new Error('done'));
      await expect(first).rejects.toThrow('done');
    } finally {
      await one.destroy();
    }
  });

  it("rejects with undici's error when the connection fails", async () => {
    const dead = new Pool('http://127.0.0.1:1');
    try {
      await expect(requestWhole(dead, { path: '/', method: 'GET', headers: {}, body: '', signal: new RequestAbort().signal, maxBytes: () => 10 })).rejects.toMatchObject({
        code: 'ECONNREFUSED',
      });
    } finally {
      await dead.destroy();
    }
  });
});
