import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';

/**
 * A loopback port that is free now and that the OS does not hand out by itself: one below the ephemeral range, which
 * every outgoing connection and every listen on port 0 draws from. A port from port 0 was taken between this call and
 * the gateway process's listen in a full run (a test's own fetch got it as its local port); one below the range can
 * only meet another freePort's draw of the same port, one in thousands.
 */
export async function freePort(): Promise<number> {
  const ceiling = ephemeralLow() - 1;
  const floor = Math.max(1_024, ceiling - 15_000);
  for (let i = 0; i < 50 && ceiling > floor; i++) {
    const port = floor + Math.floor(Math.random() * (ceiling - floor));
    if (await bindable(port)) return port;
  }
  return listenOn(0);
}

/** The first port of the OS's ephemeral range (Linux's default when it cannot be read). */
function ephemeralLow(): number {
  try {
    const low = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]);
    return Number.isInteger(low) && low > 0 ? low : 32_768;
  } catch {
    return 32_768;
  }
}

async function bindable(port: number): Promise<boolean> {
  return listenOn(port).then(() => true, () => false);
}

/** Listens on the port (0: any), closes again and answers the port it had. */
async function listenOn(port: number): Promise<number> {
  const server = createServer();
  server.listen(port, '127.0.0.1');
  await Promise.race([once(server, 'listening'), once(server, 'error').then(([err]) => Promise.reject(err))]);
  const address = server.address();
  await new Promise((resolve) => server.close(resolve));
  if (address === null || typeof address === 'string') throw new Error('no port');
  return address.port;
}
