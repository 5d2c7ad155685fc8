// A gateway whose provider baseUrl points at itself sends every request back to itself, and each copy again, until
// its sockets run out: a retry storm the gateway makes. It takes one exported variable: the default config reads the
// provider's address from OPENAI_BASE_URL, which is also what points the agents at the gateway, and set in the shell
// that starts it, it does both. Each instance names itself in a Via entry (RFC 9110 7.6.3) on what it sends upstream;
// a request that comes back with it is answered at once instead of being sent out again.
import { randomUUID } from 'node:crypto';

export interface LoopGuard {
  /** The `via` header of every request this instance sends upstream. */
  readonly via: string;
  /** Did this request come from this very instance? */
  cameBack(via: string | string[] | undefined): boolean;
}

export function loopGuard(): LoopGuard {
  const name = `stormgate-${randomUUID().slice(0, 8)}`;
  return {
    via: `1.1 ${name}`,
    cameBack: (via) => via !== undefined && (Array.isArray(via) ? via.join(', ') : via).includes(name),
  };
}
