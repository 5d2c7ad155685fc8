// A TCP proxy on a free loopback port, for cutting one client off a server that keeps running (and keeps its data):
// a network partition, as one gateway sees it, while the rest of the fleet still reaches Redis.
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import { freePort } from './free-port.ts';

export interface TcpProxy {
  port: number;
  /** Drops every connection and refuses new ones, until resume(). */
  cut(): Promise<void>;
  /** Accepts connections again, on the same port (nothing to do when it does already). */
  resume(): Promise<void>;
  close(): Promise<void>;
}

export async function startTcpProxy(targetPort: number): Promise<TcpProxy> {
  const port = await freePort();
  const sockets = new Set<Socket>();
  let server: Server | undefined;

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
        client.pipe(upstream).pipe(client);
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
  return { port, cut: stop, resume: listen, close: stop };
}
