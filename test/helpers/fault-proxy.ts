// A TCP proxy that does to the bytes between the gateway and a provider what a bad network does, in the manner of
// Toxiproxy's toxics: slices them into tiny pieces, limits their rate, delays them, resets or closes the connection
// after so many bytes, swallows them (a black hole), or closes a connection left idle. Each direction has its own
// toxics, chosen per connection (by its number, from 0), so a test can break the first connection and spare the rest.
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { seededRandom } from '../../src/policy/random.ts';
import { freePort } from './free-port.ts';

/** What happens to the bytes of one direction of one connection. */
interface Toxics {
  /** Delivered in pieces of min..max bytes (random boundaries), with delayMs between pieces. */
  slicer?: { min: number; max: number; delayMs?: number };
  /** At most this many bytes a second. */
  bytesPerSecond?: number;
  /** Each chunk held this long (plus 0..jitterMs, seeded), in order. */
  latencyMs?: number;
  jitterMs?: number;
  /** After this many bytes of the direction, the connection is reset (RST to the gateway, the provider side dropped). */
  resetAfterBytes?: number;
  /** After this many bytes, the gateway's side is ended (FIN) and the provider side dropped: limit_data. */
  closeAfterBytes?: number;
  /**
   * resetAfterBytes and closeAfterBytes count from the end of the response's head (its blank line), not from the
   * connection's first byte: a head's length varies from answer to answer (the mock's `openai-processing-ms` is "9"
   * for one and "12" for the next on a busy machine), so an offset into the body measured on one answer and counted
   * from the first byte landed a byte or two off on the next (before the finish chunk's end, say).
   */
  afterHead?: boolean;
  /** Everything is swallowed; the connection stays open (toxiproxy's timeout toxic with timeout 0). */
  blackhole?: boolean;
  /**
   * Set by the proxy once the reset, close or black hole has struck: one Toxics object given to several connections
   * strikes the first of them that carries the bytes, and the others pass clean (the gateway's pool may open a
   * connection it does not use at once, and a test cannot know which one its request takes).
   */
  spent?: boolean;
}

export interface ConnectionToxics {
  /** The request: gateway to provider. */
  up?: Toxics;
  /** The answer: provider to gateway. */
  down?: Toxics;
  /** A connection idle (no byte either way) this long is closed with a FIN to the gateway, as a server's keep-alive timeout does. */
  idleCloseMs?: number;
  /**
   * A request that comes on a connection which has carried an answer already is not passed on: the gateway's side is
   * ended (FIN) as it arrives, the race of a server closing an idle connection just as the client reuses it.
   */
  closeOnReuse?: boolean;
  /** As closeOnReuse, but the gateway's side is reset (RST) instead: the classic "socket hang up" of a kept connection. */
  resetOnReuse?: boolean;
}

export interface FaultProxy {
  port: number;
  /** Toxics of each new connection, by its number (0 for the first); undefined: a clean connection. */
  toxics: (connection: number) => ConnectionToxics | undefined;
  /** Connections accepted so far. */
  accepted(): number;
  /** Connections from the gateway still open. */
  open(): number;
  /** The numbers of the connections from the gateway still open. */
  openIds(): number[];
  /** The numbers of the connections a reset, close, black hole or strand() struck. */
  struck: number[];
  /** Bytes the provider sent on each connection, by number. */
  downBytes: number[];
  /** What the provider sent on each connection (before the toxics), by number. */
  downData: Buffer[][];
  /** The connections open now swallow whatever either side sends from now on, and stay open: a black hole on a kept connection. */
  strand(): void;
  /** Closes every open connection (FIN to the gateway), so the next request opens a connection of its own. */
  drop(): Promise<void>;
  close(): Promise<void>;
}

export async function startFaultProxy(targetPort: number, seed = 1): Promise<FaultProxy> {
  const port = await freePort();
  const random = seededRandom(seed);
  const sockets = new Set<Socket>();
  let accepted = 0;
  const openClients = new Set<Socket>();
  const stranded = new WeakSet<Socket>();
  const ids = new Map<Socket, number>();
  const struckIds: number[] = [];
  const downBytes: number[] = [];
  const downData: Buffer[][] = [];

  const server: Server = createServer((client) => {
    const n = accepted++;
    downBytes[n] = 0;
    downData[n] = [];
    const spec = proxy.toxics(n) ?? {};
    const upstream = createConnection({ host: '127.0.0.1', port: targetPort });
    for (const sock of [client, upstream]) {
      sockets.add(sock);
      sock.once('close', () => sockets.delete(sock));
      sock.on('error', () => undefined);
      sock.setNoDelay(true);
    }
    openClients.add(client);
    ids.set(client, n);
    client.once('close', () => openClients.delete(client));
    client.once('close', () => upstream.destroy());
    upstream.once('close', () => client.destroy());

    let idleTimer: NodeJS.Timeout | undefined;
    const touch = () => {
      if (spec.idleCloseMs === undefined) return;
      clearTimeout(idleTimer);
      idleTimer = setTimeout(() => {
        client.end();
        upstream.destroy();
      }, spec.idleCloseMs);
    };
    client.once('close', () => clearTimeout(idleTimer));
    touch();

    const direction = (from: Socket, to: Socket, t: Toxics, count?: (bytes: number) => void, record?: (chunk: Buffer) => void) => {
      const queue: Array<{ chunk: Buffer; at: number }> = [];
      let pumping = false;
      let sent = 0;
      let done = false;
      /** This connection is the one the toxics' reset, close or black hole struck (see Toxics.spent). */
      let struck = false;
      /** Where the head ends (afterHead), once seen; the last bytes looked at, for a blank line split between pieces. */
      let headEnd: number | undefined = t.afterHead ? undefined : 0;
      let headTail = '';
      const pump = async () => {
        pumping = true;
        while (queue.length > 0 && !done) {
          const { chunk, at } = queue.shift()!;
          record?.(chunk);
          if (t.latencyMs !== undefined) {
            const due = at + t.latencyMs + (t.jitterMs ? random() * t.jitterMs : 0);
            const wait = due - Date.now();
            if (wait > 0) await sleep(wait);
          }
          let pieces: Buffer[] = [chunk];
          if (t.slicer) {
            pieces = [];
            for (let i = 0; i < chunk.length; ) {
              const size = t.slicer.min + Math.floor(random() * (t.slicer.max - t.slicer.min + 1));
              pieces.push(chunk.subarray(i, i + size));
              i += size;
            }
          } else if (t.bytesPerSecond !== undefined) {
            // Pieces of at most a tenth of a second's worth, so the rate holds within a chunk too.
            const size = Math.max(1, Math.floor(t.bytesPerSecond / 10));
            pieces = [];
            for (let i = 0; i < chunk.length; i += size) pieces.push(chunk.subarray(i, i + size));
          }
          for (const piece of pieces) {
            if (done) return;
            if (headEnd === undefined) {
              const seen = headTail + piece.toString('latin1');
              const i = seen.indexOf('\r\n\r\n');
              if (i !== -1) headEnd = sent - headTail.length + i + 4;
              else headTail = seen.slice(-3);
            }
            const after = t.spent && !struck ? undefined : (t.resetAfterBytes ?? t.closeAfterBytes);
            const limit = after === undefined || headEnd === undefined ? undefined : headEnd + after;
            if (limit !== undefined && sent + piece.length >= limit) {
              const last = piece.subarray(0, limit - sent);
              done = true;
              t.spent = true;
              struckIds.push(n);
              count?.(last.length);
              if (t.resetAfterBytes !== undefined) {
                const reset = () => {
                  to.resetAndDestroy();
                  from.destroy();
                };
                if (last.length > 0) to.write(last, reset);
                else reset();
              } else {
                // A FIN after the last bytes; the other side goes once it is sent (destroyed sooner, the socket could
                // send a reset that loses those bytes in the gateway's kernel).
                to.end(last, () => from.destroy());
              }
              return;
            }
            if (t.slicer?.delayMs) await sleep(t.slicer.delayMs);
            if (t.bytesPerSecond !== undefined) await sleep((piece.length / t.bytesPerSecond) * 1000);
            if (to.destroyed) return;
            sent += piece.length;
            count?.(piece.length);
            to.write(piece);
            touch();
          }
        }
        pumping = false;
      };
      from.on('data', (chunk: Buffer) => {
        if (from === client && (spec.closeOnReuse || spec.resetOnReuse) && downBytes[n]! > 0 && !done) {
          done = true;
          struckIds.push(n);
          if (spec.resetOnReuse) client.resetAndDestroy();
          else client.end();
          upstream.destroy();
          return;
        }
        touch();
        if (t.blackhole && !t.spent && !struck) {
          t.spent = true;
          struck = true;
          struckIds.push(n);
        }
        if ((t.blackhole && struck) || stranded.has(client) || done) return;
        queue.push({ chunk, at: Date.now() });
        if (!pumping) void pump();
      });
      from.on('end', () => {
        // A half-close passes on once what was queued has gone.
        const wait = () => (queue.length > 0 || pumping ? setTimeout(wait, 5) : to.end());
        if (!(t.blackhole && struck)) wait();
      });
    };
    direction(client, upstream, spec.up ?? {});
    direction(upstream, client, spec.down ?? {}, (b) => (downBytes[n]! += b), (c) => downData[n]!.push(c));
  });
  server.listen(port, '127.0.0.1');
  await new Promise((resolve) => server.once('listening', resolve));

  const proxy: FaultProxy = {
    port,
    toxics: () => undefined,
    accepted: () => accepted,
    open: () => openClients.size,
    openIds: () => [...openClients].map((c) => ids.get(c)!),
    downBytes,
    downData,
    struck: struckIds,
    strand: () =>
      openClients.forEach((c) => {
        stranded.add(c);
        struckIds.push(ids.get(c)!);
      }),
    async drop() {
      for (const c of openClients) c.end();
      // Long enough for the gateway to see the FIN before it sends its next request.
      await sleep(50);
    },
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  return proxy;
}
