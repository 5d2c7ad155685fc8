// Closing the HTTP server waits for every connection to end. Node closes the idle keep-alive ones once, when close()
// begins, but not one that turns idle later (a stream that ends), and it counts a connection that never sent a
// request as busy (so its headers timeout can apply), a timeout it stops checking at close(). A client holding either
// open would hold close() until it hangs up: SIGINT would never exit, and a drain would wait out its whole graceMs.
import type { IncomingMessage, Server } from 'node:http';
import type { Socket } from 'node:net';

/** How often a closing server looks again: a connection that turned idle holds close() up to this long. */
const SWEEP_MS = 100;

/** Closes, while the server closes, the connections no answer is owed on; requests in flight (streams too) finish. */
export interface CloseSweep {
  /** Sweeps now, then every SWEEP_MS until stop(); from preClose. */
  start(): void;
  /** From onClose: the server has closed. */
  stop(): void;
}

/** Watches `server`'s connections from now on, so that a sweep knows which ones never carried a request. */
export function closeSweep(server: Server, everyMs = SWEEP_MS): CloseSweep {
  // A request whose head is only half in when the server closes is cut too: no byte of an answer has gone out, so the
  // client sees a reset it can retry elsewhere, and a client that never finishes its head cannot hold close().
  const unused = new Set<Socket>();
  server.on('connection', (socket: Socket) => {
    unused.add(socket);
    socket.once('close', () => unused.delete(socket));
  });
  server.on('request', (req: IncomingMessage) => unused.delete(req.socket));
  let timer: NodeJS.Timeout | undefined;
  const sweep = (): void => {
    server.closeIdleConnections();
    for (const socket of unused) socket.destroy();
  };
  return {
    start() {
      if (timer) return;
      sweep();
      // A drain past its grace period exits without waiting for close(): the sweep must not keep the process alive.
      timer = setInterval(sweep, everyMs).unref();
    },
    stop() {
      clearInterval(timer);
      timer = undefined;
    },
  };
}
