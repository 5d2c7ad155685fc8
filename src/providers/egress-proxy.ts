// A provider reached through the company's egress proxy: undici's ProxyAgent tunnels each connection with HTTP
// CONNECT. What it leaves out is added here: a bound on the whole way to the provider, and codes that say the proxy
// refused (nothing was sent, so the request is retried and fails over like one that could not connect).
import { errors, Pool, ProxyAgent, type buildConnector } from 'undici';
import { PROXY_REFUSAL, UNREACHABLE_CODES } from '../policy/outcome.ts';
import { boundedConnector } from './connect-timer.ts';

/**
 * An agent whose connections to the provider are tunnelled (HTTP CONNECT) through the company's egress proxy; a
 * user:password in its URL is sent as Basic proxy credentials. undici's own connect timeout does not reach a tunnel:
 * `connectMs` (boundedTunnel) bounds the whole way there, the connection to the proxy, its answer to CONNECT and the TLS handshake
 * through the tunnel, and one that runs out is a connect timeout (never sent).
 */
export function viaProxy(proxy: string, connectMs: number, options: Omit<ProxyAgent.Options, 'uri'>): ProxyAgent {
  const { username, password } = new URL(proxy);
  return new ProxyAgent({
    ...options,
    uri: proxy,
    // undici sends the URL's credentials only when both are there: a token given as the user name alone was dropped.
    ...(username !== '' && { token: `Basic ${Buffer.from(`${decodeURIComponent(username)}:${decodeURIComponent(password)}`).toString('base64')}` }),
    factory: (origin, opts) => new Pool(origin, { ...(opts as Pool.Options), connect: boundedTunnel((opts as { connect: buildConnector.connector }).connect, connectMs, proxyHost(proxy)) }),
  });
}

/** The proxy as a message names it: host:port, never the credentials its URL may carry. */
export function proxyHost(proxy: string): string {
  return new URL(proxy).host;
}

/**
 * The proxy refused the tunnel, with a status (407: its credentials, 403: the host is not allowed, 502: it could not
 * reach the provider) or by closing or resetting the connection in answer to CONNECT (restarting, shedding load, a
 * firewall that blocks the host). undici reports a status as a RequestAbortedError, the code of a request its caller
 * aborted, with the status in the message alone; a close (UND_ERR_SOCKET) as a passing socket error, after which it
 * opened the next connection at once, about a thousand CONNECTs a second for one request; a reset (ECONNRESET) as one
 * after the request was sent, that may have run. Under a code of its own (PROXY_407, PROXY_CLOSED), raised here where
 * nothing else can raise them, the request fails as one that never reached the provider, on the managed routes and
 * the passthrough alike. So does a proxy that could not be reached at all (its port refused the connection, its name
 * did not resolve): undici passes on the errno of the connection to the proxy, which read as the provider's own
 * (ECONNREFUSED), and the operator looked at the provider, which the gateway never connects to through a proxy.
 */
class TunnelRefused extends Error {
  constructor(
    readonly code: string,
    message: string,
    override readonly cause: Error,
  ) {
    super(message);
  }
}

/** What an error that failed the way through the proxy says, by code: before the tunnel was up, nothing was sent. */
function tunnelError(err: Error, proxy: string): Error {
  const code = (err as { code?: unknown }).code;
  // The only connection the gateway makes itself is the one to the proxy: the proxy connects to the provider.
  if (typeof code === 'string' && UNREACHABLE_CODES.has(code)) return new TunnelRefused(`${PROXY_REFUSAL}${code}`, `the egress proxy ${proxy} could not be reached (${code})`, err);
  if (code === 'UND_ERR_SOCKET' || code === 'ECONNRESET') return new TunnelRefused(`${PROXY_REFUSAL}CLOSED`, 'the egress proxy closed the connection in answer to CONNECT', err);
  const refused = err instanceof errors.RequestAbortedError ? /^Proxy response \((\d{3})\) !== 200 when HTTP Tunneling$/.exec(err.message) : null;
  return refused ? new TunnelRefused(`${PROXY_REFUSAL}${refused[1]}`, `the egress proxy refused the tunnel (${refused[1]})`, err) : err;
}

/**
 * The tunnel's connect, bounded: undici waits for the proxy's answer to CONNECT as for any answer's headers (300 s),
 * and a request waiting for its connection does not see its own abort until the connection is made or fails. A proxy
 * that took the connection and never answered held a stream past its first-token timer and its deadline.
 */
function boundedTunnel(connect: buildConnector.connector, connectMs: number, proxy: string): buildConnector.connector {
  return boundedConnector(
    (opts, callback) => {
      // ProxyAgent passes this signal on to its CONNECT: aborted, it closes the connection to the proxy.
      const abort = new AbortController();
      connect({ ...opts, signal: abort.signal } as buildConnector.Options, callback);
      return () => abort.abort();
    },
    connectMs,
    (opts) => `through the egress proxy to ${opts.hostname}`,
    (err) => tunnelError(err, proxy),
  );
}
