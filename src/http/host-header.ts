// The Host header a request must carry (RFC 9112 3.2): an HTTP/1.1 request without one, or with more than one, is
// answered 400. Node's parser lets both through: it drops every Host line after the first, so a request whose two
// Host lines a proxy in front read the other way round reached the pipeline as if it had one.
import type { IncomingMessage } from 'node:http';

/** Why the request's Host header makes it unanswerable, or undefined when it is usable. */
export function hostHeaderFault(req: IncomingMessage): string | undefined {
  if (req.headers.host === undefined) {
    return req.httpVersionMajor === 1 && req.httpVersionMinor === 1 ? 'an HTTP/1.1 request needs a Host header' : undefined;
  }
  // rawHeaders alternates names and values, as sent.
  const raw = req.rawHeaders;
  let lines = 0;
  for (let i = 0; i < raw.length; i += 2) if (raw[i]!.length === 4 && raw[i]!.toLowerCase() === 'host' && ++lines > 1) return 'the request has more than one Host header';
  return undefined;
}
