import { once } from 'node:events';
import { createServer } from 'node:net';

/** A loopback port the OS says is free now (another process could take it before use; on a test machine none does). */
export async function freePort(): Promise<number> {
  const server = createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const address = server.address();
  server.close();
  if (address === null || typeof address === 'string') throw new Error('no port');
  return address.port;
}
