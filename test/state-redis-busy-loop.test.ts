// A healthy Redis behind a gateway whose event loop stalls (a major GC, a burst of parked requests released at once):
// every command in flight during the stall has its timer fire before its reply, already in the socket, is read.
// That is one late event loop, not three slow answers from Redis: the store must stay on Redis.
import { describe, expect, it } from 'vitest';
import { useRedisServer } from './helpers/redis-server.ts';
import { loggedStores } from './helpers/redis-stores.ts';

const redisServer = useRedisServer();
const store = loggedStores('busy-loop');

/** Blocks the event loop for `ms`, as a long GC pause or a synchronous burst of work does. */
function stall(ms: number): void {
  const end = Date.now() + ms;
  while (Date.now() < end);
}

describe('a gateway whose event loop stalls while several Redis commands are in flight', () => {
  it('stays on Redis: the commands timed out together once, not three times in a row', async () => {
    const { store: a, lines } = store(redisServer().url);
    expect(await a.ready()).toBe(true);
    const budget = { ratio: 0.1, windowS: 10, minRetriesPerSecond: 1 };
    for (let round = 0; round < 3; round++) {
      // Five retries asked for at once (commandTimeoutMs is 100), then the loop stalls for 400 ms before it reads.
      const calls = Array.from({ length: 5 }, () => a.takeRetry(`r${round}`, budget, Date.now()));
      stall(400);
      await Promise.all(calls);
      expect(a.degraded).toBe(false);
      await a.takeRetry('between', budget, Date.now()); // answered: a loaded gateway gets replies between stalls
    }
    expect(lines().filter((l) => l.msg.startsWith('state store degraded'))).toEqual([]);
  });
});
