// A provider pool of two classes (online, batch; no minShare floors) and slot requests of named clients: the setup of
// the tests of the fair share between a class's clients (provider-pool.ts).
import { ProviderPool, type PoolObserver, type Slot, type SlotRequest } from '../../src/pools/provider-pool.ts';
import type { WaitingBodies } from '../../src/pools/waiting-bodies.ts';

export const flush = () => new Promise((r) => setImmediate(r));

export interface ClientPoolOptions {
  capacity?: number;
  maxQueue?: number;
  retryCapacity?: number;
  bodies?: WaitingBodies;
  now?: () => number;
  observer?: PoolObserver;
}

export function clientPool({ capacity = 2, maxQueue = 100, retryCapacity = capacity, bodies, now = () => 0, observer = {} }: ClientPoolOptions = {}): ProviderPool {
  const classes = [
    { name: 'online', minShare: 0, maxQueue },
    { name: 'batch', minShare: 0, maxQueue },
  ];
  return new ProviderPool({ provider: 'p', capacity, retryCapacity, classes, decrease: 0.9, minLimit: 1 }, now, observer, bodies);
}

/** An online request for p/m of `client` (none: a request without a client key), with a deadline far off. */
export const clientReq = (client: string | undefined, extra: Partial<SlotRequest> = {}): SlotRequest => ({
  cls: 0,
  target: 'p/m',
  retry: false,
  deadlineAtMs: 600_000,
  minAttemptMs: 0,
  signal: new AbortController().signal,
  ...(client !== undefined && { client }),
  ...extra,
});

/** A slot the request gets at once. */
export async function slot(p: ProviderPool, r: SlotRequest): Promise<Slot> {
  const a = await p.acquire(r);
  if (!a.ok) throw new Error(`not acquired: ${a.reason}`);
  return a.slot;
}
