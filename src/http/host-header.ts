// The Host header a request must carry (RFC 9112 3.2): an HTTP/1.1 request without one, or with more than one, is
// answered 400. Node's parser lets both through: it drops every Host line after the first, so a request whose two
// Host lines a proxy in front read the other way round reached the pipeline as if it had one.
// And which names a gateway on a loopback address answers to: a web page the operator opens can point a DNS name of
// its own at 127.0.0.1 (DNS rebinding) and then call the gateway as its own origin, reading the answers paid for with
// the company's keys. A browser can only send a DNS name with a dot there; a loopback IP, `localhost` and a name
// without a dot are what local clients and proxies use.
import { BlockList, isIP } from 'node:net';
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

/**
 * Which Host names the gateway answers to, from its config: every name when it listens beyond loopback (a load
 * balancer, a Kubernetes service name reach it by their own names) or when `allowedHosts` holds `*`; else the local
 * names and `allowedHosts`. Undefined: every name.
 */
export function hostAllowance(server: { host: string; allowedHosts?: readonly string[] | undefined }): ((hostHeader: string) => boolean) | undefined {
  const extra = server.allowedHosts;
  if (extra?.includes('*')) return undefined;
  if (extra === undefined && !isLoopback(server.host)) return undefined;
  const names = new Set((extra ?? []).map((n) => n.toLowerCase()));
  return (hostHeader) => {
    const name = hostName(hostHeader);
    return isLocalName(name) || names.has(name);
  };
}

const LOOPBACK = new BlockList();
LOOPBACK.addSubnet('127.0.0.0', 8, 'ipv4');
LOOPBACK.addAddress('::1', 'ipv6');

/** An address only this machine reaches: `localhost`, 127.0.0.0/8, ::1 in any spelling (bracketed, IPv4-mapped too). */
export function isLoopback(address: string): boolean {
  const bare = address.replace(/^\[(.*)\]$/, '$1').toLowerCase();
  const family = isIP(bare);
  return bare === 'localhost' || (family !== 0 && LOOPBACK.check(bare, family === 4 ? 'ipv4' : 'ipv6'));
}

/** The name of a Host header, lower case, without its port. */
function hostName(hostHeader: string): string {
  const host = hostHeader.toLowerCase();
  if (host.startsWith('[')) return host.slice(0, host.indexOf(']') + 1);
  const colon = host.indexOf(':');
  return colon === -1 ? host : host.slice(0, colon);
}

/** An IP literal (the connection came to loopback, so a browser sent it only for a loopback address), `localhost`, or a name without a dot. */
function isLocalName(name: string): boolean {
  if (!name.includes('.') || name.startsWith('[') || isIP(name) !== 0) return true;
  return name === 'localhost' || name.endsWith('.localhost');
}
