// Raw HTTP/1.1 on both sides, for what neither an SDK nor node:http will send: a client's request written byte for byte
// (odd paths, methods, framing) and an upstream whose answer is written byte for byte (two content-lengths, a header
// with a control byte). Each upstream is closed after the test that started it.
import { once } from 'node:events';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { request as httpRequest, type IncomingHttpHeaders } from 'node:http';
import { afterEach } from 'vitest';

export interface RawAnswer {
  status: number;
  /** Header names in lower case; a repeated header's values joined with ", ". */
  headers: Record<string, string>;
  body: string;
  /** Did the gateway close the connection after its answer? */
  closed: boolean;
}

/** Parses the first HTTP/1.1 answer in `text` (a content-length or chunked body, or whatever came before the close). */
export function parseAnswer(text: string, closed: boolean): RawAnswer | undefined {
  const end = text.indexOf('\r\n\r\n');
  if (end < 0) return undefined;
  const [statusLine, ...lines] = text.slice(0, end).split('\r\n');
  const headers: Record<string, string> = {};
  for (const line of lines) {
    const i = line.indexOf(':');
    const name = line.slice(0, i).trim().toLowerCase();
    const value = line.slice(i + 1).trim();
    headers[name] = headers[name] === undefined ? value : `${headers[name]}, ${value}`;
  }
  let body = text.slice(end + 4);
  if (headers['content-length'] !== undefined) {
    if (Buffer.byteLength(body) < Number(headers['content-length'])) return closed ? { status: Number(statusLine!.split(' ')[1]), headers, body, closed } : undefined;
    body = Buffer.from(body).subarray(0, Number(headers['content-length'])).toString();
  } else if (headers['transfer-encoding'] === 'chunked') {
    let out = '';
    let rest = body;
    for (;;) {
      const nl = rest.indexOf('\r\n');
      if (nl < 0) return closed ? { status: Number(statusLine!.split(' ')[1]), headers, body: out, closed } : undefined;
      const size = parseInt(rest.slice(0, nl), 16);
      if (size === 0) break;
      if (rest.length < nl + 2 + size + 2) return closed ? { status: Number(statusLine!.split(' ')[1]), headers, body: out, closed } : undefined;
      out += rest.slice(nl + 2, nl + 2 + size);
      rest = rest.slice(nl + 2 + size + 2);
    }
    body = out;
  } else if (!closed && !/^HTTP\/1\.1 (1\d\d|204|304)/.test(statusLine!)) return undefined;
  return { status: Number(statusLine!.split(' ')[1]), headers, body, closed };
}

/**
 * Writes `request` as it is to the server at `url`'s port and reads the first whole answer (or what came before the
 * connection closed), waiting up to `waitMs`. `noBody`: the answer to a HEAD, whose content-length announces nothing.
 */
export function rawRequest(url: string, request: string | Buffer, opts: { waitMs?: number; noBody?: boolean } = {}): Promise<RawAnswer> {
  const { port } = new URL(url);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), '127.0.0.1');
    let text = '';
    let closed = false;
    const timer = setTimeout(() => finish(true), opts.waitMs ?? 5_000);
    const finish = (force = false) => {
      const headEnd = text.indexOf('\r\n\r\n');
      const parsed = opts.noBody && headEnd >= 0 ? parseAnswer(text.slice(0, headEnd + 4).replace(/content-length: \d+\r\n/i, ''), true) : parseAnswer(text, closed);
      if (parsed === undefined && !force && !closed) return;
      clearTimeout(timer);
      socket.destroy();
      if (parsed) resolve({ ...parsed, closed: parsed.closed || closed });
      else reject(new Error(`no answer: ${JSON.stringify(text.slice(0, 300))}`));
    };
    socket.on('data', (d: Buffer) => {
      text += d.toString('latin1');
      finish();
    });
    socket.on('close', () => {
      closed = true;
      finish(true);
    });
    socket.on('error', () => undefined);
    socket.write(request);
  });
}

export interface RawUpstream {
  /** Its origin, e.g. http://127.0.0.1:4711 (append /v1 for an OpenAI-style baseUrl). */
  origin: string;
  /** The requests it received, each as its raw text. */
  requests: string[];
}

/** Reads a socket's requests as they come whole (head and content-length body), each as its raw text. */
export function onRawRequests(socket: Socket, onRequest: (request: string) => void): void {
  let buf = '';
  socket.on('error', () => undefined);
  socket.on('data', (d: Buffer) => {
    buf += d.toString('latin1');
    for (;;) {
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      const length = Number(/\r\ncontent-length: *(\d+)/i.exec(buf.slice(0, end))?.[1] ?? 0);
      if (buf.length < end + 4 + length) return;
      const request = buf.slice(0, end + 4 + length);
      buf = buf.slice(end + 4 + length);
      onRequest(request);
    }
  });
}

/**
 * Registers the after-each clean-up; then each call starts a TCP server on 127.0.0.1 that, for every request it reads
 * whole (head and content-length body), writes `answer(n)` (n from 1) byte for byte and, with `close`, closes.
 */
export function useRawUpstreams(): (answer: (n: number) => string | Buffer, close?: boolean) => Promise<RawUpstream> {
  const servers: Server[] = [];
  const sockets: Socket[] = [];
  afterEach(async () => {
    for (const s of sockets.splice(0)) s.destroy();
    for (const s of servers.splice(0)) await new Promise((done) => s.close(done));
  });
  return async (answer, close = true) => {
    const requests: string[] = [];
    const server = createServer((socket) => {
      sockets.push(socket);
      onRawRequests(socket, (request) => {
        requests.push(request);
        socket.write(answer(requests.length));
        if (close) socket.end();
      });
    });
    servers.push(server);
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    return { origin: `http://127.0.0.1:${(server.address() as { port: number }).port}`, requests };
  };
}

/** A GET on its own connection: the status and headers, the body read and dropped. */
export function rawGet(url: string): Promise<{ status: number; headers: IncomingHttpHeaders }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(url, { agent: false }, (res) => {
      res.resume();
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers }));
    });
    req.on('error', reject);
    req.end();
  });
}
