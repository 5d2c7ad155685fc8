// Closing the HTTP server waits for every connection to end. Node closes the idle keep-alive ones once, when close()
// begins, but not one that turns idle later (a stream that ends), and it counts a connection that never sent a
// request as busy (so its headers timeout can apply), a timeout it stops checking at close(). A client holding either
// open would hold close() until it hangs up: SIGINT would never exit, and a drain would wait out its whole graceMs.
// So would a client that sent its headers and part of its body, then stopped: its request has not reached the
// pipeline (the body is read whole first), yet Node waits for it up to requestTimeoutMs.
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';

/** How often a closing server looks again: a connection that turned idle holds close() up to this long. */
const SWEEP_MS = 100;

/**
 * Answers a request whose body is still arriving when the cut comes (503, closing the connection); false when it
 * cannot, and the connection is destroyed instead.
 */
type AnswerUnfinished = (res: ServerResponse) => boolean;

/** Closes, while the server closes, the connections no answer is owed on; requests in flight (streams too) finish. */
export interface CloseSweep {
  /** Sweeps now, then every SWEEP_MS until stop(); from preClose. */
  start(): void;
  /**
   * From now on, each sweep also ends the requests whose body is still arriving (the drain's grace is over, or the
   * server closes without one); sweeps now.
   */
  cutUnfinishedBodies(): void;
  /**
   * The answers owed now and not started yet go out with `Connection: close` (a drain begins): the onRequest hook
   * tells only the requests that arrive from now on.
   */
  closeAfterAnswers(): void;
  /** From onClose: the server has closed. */
  stop(): void;
}

/** Watches `server`'s connections from now on, so that a sweep knows which never carried a request and which still await a body. */
export function closeSweep(server: Server, answerUnfinished: AnswerUnfinished, everyMs = SWEEP_MS): CloseSweep {
  // A request whose head is only half in when the server closes is cut too: no byte of an answer has gone out, so the
  // client sees a reset it can retry elsewhere, and a client that never finishes its head cannot hold close().
  /**
   * Each connection's request in progress, as its response (the request is `res.req`): held while its answer is owed
   * or its body is still arriving, and no longer (an idle keep-alive connection must not keep the last request and its
   * body in memory); null between requests; undefined while the connection has carried none.
   */
  const current = new Map<Socket, ServerResponse | null | undefined>();
  server.on('connection', (socket: Socket) => {
    current.set(socket, undefined);
    socket.once('close', () => current.delete(socket));
  });
  // A connection's requests come one after another: the body of the one before has arrived whole before the next begins.
  server.on('request', (req: IncomingMessage, res: ServerResponse) => {
    current.set(req.socket, res);
    res.on('finish', answered);
  });
  let timer: NodeJS.Timeout | undefined;
  let cutting = false;
  const sweep = (): void => {
    server.closeIdleConnections();
    for (const [socket, res] of current) {
      if (res === undefined) socket.destroy();
      else if (res !== null && cutting && !res.req.complete) endUnfinished(socket, res);
    }
  };
  const endUnfinished = (socket: Socket, res: ServerResponse): void => {
    // Answered already (a 405, a 503 while closing) and only the rest of the body is awaited: nothing is owed.
    if (res.headersSent) {
      if (res.writableFinished) socket.destroy();
      return;
    }
    if (!answerUnfinished(res)) socket.destroy();
  };
  // Listeners shared by every request (`this` is the emitter): no closure per request.
  function answered(this: ServerResponse): void {
    // Answered before its body was read (a 405): the connection waits for the rest, and is watched until it comes.
    if (this.req.complete) done(this.req);
    else this.req.once('end', bodyArrived);
  }
  function bodyArrived(this: IncomingMessage): void {
    done(this);
  }
  function done(req: IncomingMessage): void {
    if (current.get(req.socket)?.req === req) current.set(req.socket, null);
  }
  return {
    start() {
      if (timer) return;
      sweep();
      // A drain past its grace period exits without waiting for close(): the sweep must not keep the process alive.
      timer = setInterval(sweep, everyMs).unref();
    },
    cutUnfinishedBodies() {
      cutting = true;
      sweep();
    },
    closeAfterAnswers() {
      // Node writes `Connection: close` for it and closes the connection once the answer is written.
      for (const res of current.values()) if (res && !res.headersSent) res.shouldKeepAlive = false;
    },
    stop() {
      clearInterval(timer);
      timer = undefined;
    },
  };
}
