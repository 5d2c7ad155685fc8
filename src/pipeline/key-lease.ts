// A run's claim on its idempotency key is a lease: written for idempotency.leaseMs and renewed by its own instance
// every third of that while the run goes on. An instance that dies mid-run (SIGKILL, the OOM killer, a node lost)
// renews nothing, and its claim lapses within the lease: the agent's retry on another instance then runs the call.
// Written for the route's whole timeout plus 30 s instead, the claim of a dead run held the key that long (150 s by
// default), and every retry meanwhile waited for a run nobody was running, then got 409.
import type { StateStore } from '../state/store.ts';

interface KeyLease {
  /** The run's answer is a stream, read on (past the claim's cap too) until stop(): renewed now and while it is read. */
  streaming(): void;
  /** The run has ended (its answer kept, or the key given back): no more renewals. */
  stop(): void;
}

interface KeyLeaseDeps {
  store: StateStore;
  now: () => number;
  /** idempotency.leaseMs. */
  leaseMs: number;
}

/**
 * Renews the owner's claim on `key` every third of the lease (two renewals can fail before it lapses), each for the
 * lease, but never past `capAtMs` until the answer is a stream: a whole answer comes within the route's timeout, and a
 * run still going past that (a bug) lets its key go then, as before leases. The store renews the owner's claim only
 * (redis-scripts.ts RENEW_KEY): one that lapsed, or that another request has claimed since, is left as it is.
 */
export function holdLease(key: string, owner: string, capAtMs: number, deps: KeyLeaseDeps): KeyLease {
  const { store, now, leaseMs } = deps;
  let streaming = false;
  let ended = false;
  let timer: NodeJS.Timeout | undefined;
  const stopTimer = () => {
    clearInterval(timer);
    timer = undefined;
  };
  const renew = () => {
    const nowMs = now();
    const lifetimeMs = streaming ? leaseMs : Math.min(leaseMs, capAtMs - nowMs);
    if (lifetimeMs <= 0) return stopTimer();
    void store.renewKey(key, owner, lifetimeMs, nowMs);
  };
  const start = () => {
    // unref: a run's renewals never keep the process up (a drain waits for the run itself).
    if (!ended) timer ??= setInterval(renew, Math.ceil(leaseMs / 3)).unref();
  };
  start();
  return {
    streaming() {
      if (ended) return;
      streaming = true;
      // At once: the last renewal may have stopped at the cap, which comes before the next one.
      renew();
      start();
    },
    stop() {
      ended = true;
      stopTimer();
    },
  };
}
