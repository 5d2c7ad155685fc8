// A gateway whose provider baseUrl points at itself sends every request back to itself, and each copy again, until
// its sockets run out: a retry storm the gateway makes. It takes one exported variable: the default config reads the
// provider's address from OPENAI_BASE_URL, which is also what points the agents at the gateway, and set in the shell
// that starts it, it does both. Each instance names itself in a Via entry (RFC 9110 7.6.3) on what it sends upstream;
// a request that comes back with it is answered at once instead of being sent out again. The stormgate entries a
// request arrived with go upstream too, before this instance's own (as a proxy appends itself to Via): a fleet whose
// provider address is its own load balancer sends a request from one instance to another and back, and each instance
// must see its own name in it however many others it passed on the way.
import { randomUUID } from 'node:crypto';

export interface LoopGuard {
  /** The `via` header of every request this instance sends upstream. */
  readonly via: string;
  /** Did this request come from this very instance? */
  cameBack(via: string | string[] | undefined): boolean;
}

/** A new name for an instance (`stormgate-` and 8 hex digits): buildServer makes one, for its Via entry and its log lines. */
export function instanceName(): string {
  return `stormgate-${randomUUID().slice(0, 8)}`;
}

/** `name`: the instance's (instanceName), which its log lines carry too. */
export function loopGuard(name = instanceName()): LoopGuard {
  return {
    via: `1.1 ${name}`,
    cameBack: (via) => via !== undefined && (Array.isArray(via) ? via.join(', ') : via).includes(name),
  };
}

/** A Via entry an instance of the gateway wrote (loopGuard's form): the only ones passed on upstream. */
const STORMGATE_ENTRY = /^1\.1 stormgate-[0-9a-f]{8}$/;
/** Entries passed on at most: a chain of gateways is a few long; a client's header must not grow every request upstream. */
const MAX_ENTRIES = 16;

/**
 * The `via` to send upstream: the gateways' entries the request arrived with (none of the client's own text), then
 * this instance's `own`.
 */
export function upstreamVia(own: string, incoming: string | string[] | undefined): string {
  if (incoming === undefined) return own;
  const entries = (Array.isArray(incoming) ? incoming.join(',') : incoming)
    .split(',')
    .map((e) => e.trim())
    .filter((e) => STORMGATE_ENTRY.test(e) && e !== own);
  return [...new Set(entries)].slice(-MAX_ENTRIES).concat(own).join(', ');
}
