// A provider of a test's own, for wire behaviour the bundled mock does not have (compressed answers, a response that
// outlives its [DONE], a 200 that is no answer): a node:http server on a free loopback port, closed after each test.
import { createServer, type RequestListener, type Server, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { once } from 'node:events';
import { afterEach } from 'vitest';

export interface FakeProvider {
  /** Its origin, e.g. http://127.0.0.1:4711 (append /v1 for an OpenAI-style baseUrl). */
  origin: string;
  /** Requests it has received. */
  hits(): number;
  /** Connections the gateway opened to it. */
  sockets: Socket[];
}

/** Registers the after-each clean-up; call at the top of a test file, then start providers in its tests. */
export function useFakeProviders(): (handler: RequestListener) => Promise<FakeProvider> {
  const servers: Server[] = [];
  afterEach(async () => {
    for (const s of servers.splice(0)) {
      s.closeAllConnections();
      await new Promise((resolve) => s.close(resolve));
    }
  });
  return async (handler) => {
    let hits = 0;
    const sockets: Socket[] = [];
    const server = createServer((req, res) => {
      hits++;
      handler(req, res);
    });
    server.on('connection', (socket: Socket) => sockets.push(socket));
    servers.push(server);
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    return { origin: `http://127.0.0.1:${(server.address() as { port: number }).port}`, hits: () => hits, sockets };
  };
}

/** A whole chat.completion answering `content`, as JSON text. */
export const chatCompletion = (content: string): string =>
  JSON.stringify({
    id: 'chatcmpl-1',
    object: 'chat.completion',
    created: 1,
    model: 'gpt-4o',
    choices: [{ index: 0, message: { role: 'assistant', content }, finish_reason: 'stop' }],
    usage: { prompt_tokens: 1, completion_tokens: 2, total_tokens: 3 },
  });

/** One chat.completion.chunk event, framed for the wire. */
export const chatChunk = (delta: Record<string, string>, finish: string | null): string =>
  `data: ${JSON.stringify({ id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;

/**
 * A handler that answers 503 the first request whose body holds `word`, and a chat.completion every other; `sent()`
 * counts the requests that held it.
 */
export function failsOnce(word: string): RequestListener & { sent: () => number } {
  let sent = 0;
  const handler: RequestListener = (req, res) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c));
    req.on('end', () => {
      if (body.includes(word) && sent++ === 0) res.writeHead(503, { 'content-type': 'application/json' }).end('{"error":{"message":"busy","type":"server_error"}}');
      else res.writeHead(200, { 'content-type': 'application/json' }).end(chatCompletion('ok'));
    });
  };
  return Object.assign(handler, { sent: () => sent });
}

/** A handler that reads each request's body, then answers 200 with an event stream's head and leaves the rest to `then`. */
export const eventStream =
  (then: (res: ServerResponse) => void): RequestListener =>
  (req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      then(res);
    });
  };
