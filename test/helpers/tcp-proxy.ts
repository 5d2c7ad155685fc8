// A TCP proxy on a free loopback port, for cutting one client off a server that keeps running (and keeps its data):
// a network partition, as one gateway sees it, while the rest of the fleet still reaches Redis. Or for swallowing what
// its connections carry while they stay open, as a middlebox that drops a connection's traffic does (toxiproxy's
// `timeout` toxic with timeout 0, a stateful firewall that lost the connection, a replaced pod's old address).
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import { Transform } from 'node:stream';
import { freePort } from './free-port.ts';

export interface TcpProxy {
  port: number;
  /** Drops every connection and refuses new ones, until resume(). */
  cut(): Promise<void>;
  /** Accepts connections again, on the same port (nothing to do when it does already). */
  resume(): Promise<void>;
  /** While on, the open connections stay open but what either side sends is dropped (lost for good, not held). */
  swallow(on: boolean): void;
  /** The connections open now stay open and drop whatever either side sends, for good; new ones pass as usual. */
  strand(): void;
  /** New connections go to this port from now on; the open ones stay where they are (a DNS name that moved). */
  point(targetPort: number): void;
  close(): Promise<void>;
}

export async function startTcpProxy(initialTarget: number): Promise<TcpProxy> {
  const port = await freePort();
  let targetPort = initialTarget;
  const sockets = new Set<Socket>();
  let server: Server | undefined;
  let swallowing = false;
  /** Connections stranded by strand(), by their client side. */
  const stranded = new WeakSet<Socket>();
  const clients = new Set<Socket>();

  const listen = () =>
    new Promise<void>((resolve, reject) => {
      if (server) return resolve(); // already accepting
      const s = createServer((client) => {
        const upstream = createConnection({ host: '127.0.0.1', port: targetPort });
        for (const sock of [client, upstream]) {
          sockets.add(sock);
          sock.once('close', () => sockets.delete(sock));
          sock.on('error', () => undefined);
        }
        clients.add(client);
        client.once('close', () => clients.delete(client));
        const gate = () => new Transform({ transform: (chunk, _enc, done) => done(null, swallowing || stranded.has(client) ? undefined : chunk) });
        client.pipe(gate()).pipe(upstream).pipe(gate()).pipe(client);
        client.once('close', () => upstream.destroy());
        upstream.once('close', () => client.destroy());
      });
      s.once('error', reject);
      s.listen(port, '127.0.0.1', () => resolve());
      server = s;
    });
  const stop = async () => {
    const s = server;
    server = undefined;
    for (const sock of sockets) sock.destroy();
    if (s) await new Promise<void>((resolve) => s.close(() => resolve()));
  };

  await listen();
  return { port, cut: stop, resume: listen, swallow: (on) => void (swallowing = on), strand: () => clients.forEach((c) => stranded.add(c)), point: (p) => void (targetPort = p), close: stop };
}
