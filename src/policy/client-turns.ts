// Whose turn it is between the clients (auth.keys) of a priority class, in the provider pools and in the parking lot:
// the client holding the fewest goes first (slots in use, or released requests still out), and of clients holding as
// many, the one served longest ago. Fewest held rather than turns alone: a tenant whose answers take a minute holds
// what it was given that long, and turns would give it as much as one whose answers take a second.

/** A client's standing in a class: what it holds now, and when it was last served (a count of services). */
export interface Standing {
  held: number;
  servedAt: number;
}

/** Negative when `a`'s client goes first, positive when `b`'s does, 0 when neither does (arrival or deadline decides). */
export function turnOrder(a: Standing, b: Standing): number {
  return a.held !== b.held ? a.held - b.held : a.servedAt - b.servedAt;
}

/**
 * The standing of a client that comes (or comes back, forgotten once it held and waited for nothing), `served`
 * services so far: served just before the latest, after every client served earlier. Counted as never served, clients
 * of one request at a time, forgotten between their requests, went before a client that kept a queue every time, and
 * its turn never came (0 of 20 slots in a test).
 */
export function newcomer(served: number): Standing {
  return { held: 0, servedAt: served - 0.5 };
}
