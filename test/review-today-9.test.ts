// An adversarial review of the day's changes (passthrough: errors put in the OpenAI shape, the client's own deadline,
// stormgate_passthrough_requests_total): the bugs it found, each pinned by a test that failed before its fix.
// - stormgate_passthrough_requests_total counted a managed route's requests refused before the pipeline (400 invalid
//   JSON, 405) when a passthrough path sits under the route's, as the README's `/v1/responses/` does: the route's
//   path is the passthrough one without its slash (src/server.ts).
// - An upload still arriving when the client's deadline passed (or the provider dropped the connection mid-upload)
//   was answered 504 (502) with `connection: keep-alive`, its rest never read: the connection carried no next request,
//   which hung unanswered (src/server.ts: the connection closes after such an answer, as on a managed route).
// - x-stormgate-timeout-ms that is not a positive number was ignored on a passthrough path, where a managed route
//   answers 400 bad_request: the call ran to passthrough.timeoutMs, past the deadline the client meant to set
//   (src/providers/passthrough.ts).
// - A passthrough path configured with a trailing slash (`/v1/files/`) had its 405 guard under `/v1/files//*`: a
//   method it does not open under it got 404 unknown_url, not 405 with allow (src/server.ts).
// - An error answered while draining (a body that is not JSON, say) kept its connection open: the error handler clears
//   what the failed answer had set, the drain's `connection: close` with it (src/server.ts).
import { Agent, request, type IncomingMessage, type ServerResponse } from 'node:http';
import { connect } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { configFor } from './helpers/one-provider.ts';
import { parseMetrics, useStacks, type Stack } from './helpers/stack.ts';

const startProvider = useFakeProviders();
const stack = useStacks();

/** The non-zero series of stormgate_passthrough_requests_total, as `path class count`. */
async function passthroughCounts(s: Stack): Promise<string[]> {
  const samples = parseMetrics(await (await fetch(`${s.url}/metrics`)).text());
  return samples.filter((m) => m.name === 'stormgate_passthrough_requests_total' && m.value > 0).map((m) => `${m.labels.path} ${m.labels.status_class} ${m.value}`);
}

/** A provider that reads each request whole and answers 200 `{}`. */
const okProvider = () =>
  startProvider((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end('{}'));
  });

describe('stormgate_passthrough_requests_total beside a managed route whose path the passthrough one extends', () => {
  it("counts the passthrough's own requests only, not the route's refused before its pipeline", async () => {
    const p = await okProvider();
    const s = await stack({
      config: () => {
        const c = configFor(p.origin, {})();
        return {
          ...c,
          routes: [...c.routes, { name: 'responses', match: { path: '/v1/responses' }, targets: [{ provider: 'p' }], park: false }],
          passthrough: { provider: 'p', paths: ['/v1/responses/'], methods: ['GET', 'DELETE'] },
        };
      },
    });
    const invalid = await fetch(`${s.url}/v1/responses`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{not json' });
    expect(invalid.status).toBe(400);
    await invalid.text();
    const wrongMethod = await fetch(`${s.url}/v1/responses`);
    expect(wrongMethod.status).toBe(405);
    await wrongMethod.text();
    const retrieve = await fetch(`${s.url}/v1/responses/resp_1`);
    expect(retrieve.status).toBe(200);
    await retrieve.text();
    await sleep(50);
    expect(await passthroughCounts(s)).toEqual(['/v1/responses 2xx 1']);
  });
});

/**
 * Sends a 2 MB upload on a raw connection 4 KB at a time until an answer's head comes back, then the rest of the body
 * and a second request on the same connection. What came back after the first answer, and whether the connection closed.
 */
async function uploadThenAgain(url: string, headers: string): Promise<{ first: string; second: string; closed: boolean }> {
  const socket = connect(Number(new URL(url).port), '127.0.0.1');
  let got = '';
  let closed = false;
  socket.on('data', (d: Buffer) => (got += d.toString('latin1')));
  socket.on('close', () => (closed = true));
  socket.on('error', () => {});
  const total = 2 * 1024 * 1024;
  socket.write(`POST /v1/files HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/octet-stream\r\ncontent-length: ${total}\r\n${headers}\r\n`);
  let sent = 0;
  const until = Date.now() + 10_000;
  while (!got.includes('\r\n\r\n') && !closed && Date.now() < until) {
    socket.write(Buffer.alloc(4096));
    sent += 4096;
    await sleep(50);
  }
  await sleep(100);
  const first = got;
  got = '';
  if (!closed) socket.write(Buffer.alloc(total - sent));
  await sleep(300);
  if (!closed) socket.write('GET /v1/files HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n');
  // Either answered or closed: a connection left to hang is neither.
  for (let i = 0; i < 100 && !closed && !got.includes('\r\n\r\n'); i++) await sleep(20);
  socket.destroy();
  return { first, second: got, closed };
}

describe('an upload answered before its body had all come in', () => {
  it("closes the connection after the 504 at the client's deadline: it carries no next request to hang", async () => {
    const p = await okProvider();
    const s = await stack({ config: configFor(p.origin, {}, { passthrough: { provider: 'p', paths: ['/v1/files'], methods: ['GET', 'POST'] } }) });
    const { first, second, closed } = await uploadThenAgain(s.url, 'x-stormgate-timeout-ms: 1000\r\n');
    expect(first).toMatch(/^HTTP\/1\.1 504 /);
    expect(first).toContain('deadline_exceeded');
    expect(first.toLowerCase()).toContain('connection: close');
    expect(second === '' ? closed : second.startsWith('HTTP/1.1 ')).toBe(true);
  });

  it('closes it after the 502 of a provider that dropped the connection mid-upload too', async () => {
    const p = await startProvider((req: IncomingMessage, res: ServerResponse) => {
      if (req.method !== 'POST') return void res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
      setTimeout(() => req.socket.destroy(), 300);
    });
    const s = await stack({ config: configFor(p.origin, {}, { passthrough: { provider: 'p', paths: ['/v1/files'], methods: ['GET', 'POST'] } }) });
    const { first, second, closed } = await uploadThenAgain(s.url, '');
    expect(first).toMatch(/^HTTP\/1\.1 502 /);
    expect(first.toLowerCase()).toContain('connection: close');
    expect(second === '' ? closed : second.startsWith('HTTP/1.1 ')).toBe(true);
  });
});

describe('x-stormgate-timeout-ms that is not a positive number of milliseconds, on a passthrough path', () => {
  it('is answered 400 bad_request, as on a managed route, and nothing is forwarded', async () => {
    const p = await okProvider();
    const s = await stack({ config: configFor(p.origin, {}, { passthrough: { provider: 'p', paths: ['/v1/files'], methods: ['GET'] } }) });
    for (const value of ['0', '-5', 'soon', '1e3']) {
      const res = await fetch(`${s.url}/v1/files`, { headers: { 'x-stormgate-timeout-ms': value } });
      expect(res.status, value).toBe(400);
      expect(((await res.json()) as { error: { code: string; message: string } }).error).toMatchObject({ code: 'bad_request', message: expect.stringContaining('x-stormgate-timeout-ms') });
    }
    expect(p.hits()).toBe(0);
    // A good one is forwarded as before.
    expect((await fetch(`${s.url}/v1/files`, { headers: { 'x-stormgate-timeout-ms': '5000' } })).status).toBe(200);
  });
});

describe('a passthrough path configured with a trailing slash', () => {
  it('answers a method it does not open under it 405 with allow, as without the slash, and forwards none', async () => {
    const p = await okProvider();
    const s = await stack({ config: configFor(p.origin, {}, { passthrough: { provider: 'p', paths: ['/v1/files/'], methods: ['GET'] } }) });
    for (const path of ['/v1/files/file-1', '/v1/files/']) {
      const res = await fetch(`${s.url}${path}`, { method: 'DELETE' });
      expect(res.status, path).toBe(405);
      expect(res.headers.get('allow'), path).toBe('GET, HEAD');
      await res.text();
    }
    expect(p.hits()).toBe(0);
    expect((await fetch(`${s.url}/v1/files/file-1`)).status).toBe(200);
  });
});

describe('an error answered while draining', () => {
  it('closes its connection as every answer of a draining instance does (the error handler took the close off)', async () => {
    const p = await okProvider();
    const s = await stack({ config: configFor(p.origin, {}, { drain: { preStopMs: 1_500, graceMs: 500 } }) });
    const drained = s.gateway.drain();
    try {
      // A body that is not JSON: answered 400 by the error handler, which clears what the answer had set.
      const { status, connection } = await new Promise<{ status: number; connection: string | undefined }>((resolve, reject) => {
        const req = request(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, agent: new Agent({ keepAlive: true }) }, (res) => {
          res.resume();
          res.on('end', () => resolve({ status: res.statusCode ?? 0, connection: res.headers.connection }));
        });
        req.on('error', reject);
        req.end('{not json');
      });
      expect(status).toBe(400);
      expect(connection).toBe('close');
    } finally {
      await drained;
    }
  });
});
