// One keep-alive undici Pool per provider, and the provider's API family (how to address and authenticate it).
// undici's own timers are coarse backstops here: the precise first-token, idle and response timers run on the
// request's signal in pipeline/attempt.ts.
import { errors, Pool, ProxyAgent, type buildConnector, type Dispatcher } from 'undici';
import type { Config, ProviderConfig } from '../config/schema.ts';

export interface ProviderClient {
  readonly name: string;
  readonly config: ProviderConfig;
  readonly dispatcher: Dispatcher;
  /** An optional provider without a key: skipped as a target. */
  readonly disabled: boolean;
}

export interface ProviderClientOptions {
  /** Tests and embedders may pass their own dispatcher (e.g. an undici MockAgent). */
  dispatcher?: Dispatcher;
  /** Coarse backstop for headers and body reads, in ms: above every route timeout. */
  backstopMs: number;
}

export function createProviderClient(name: string, config: ProviderConfig, opts: ProviderClientOptions): ProviderClient {
  const { origin } = new URL(config.baseUrl);
  const poolOptions = {
    // An unset `connections` means unlimited in undici: always bound it.
    connections: config.maxConnections,
    headersTimeout: opts.backstopMs,
    bodyTimeout: opts.backstopMs,
    // A provider's Keep-Alive hint may shorten the time, never lengthen it past what the config allows.
    keepAliveTimeout: config.timeouts.keepAliveMs,
    keepAliveMaxTimeout: config.timeouts.keepAliveMs,
  };
  const dispatcher =
    opts.dispatcher ??
    (config.proxy
      ? // Requests name no origin (each provider has its own dispatcher): the proxy's agent needs one.
        viaProxy(config.proxy, config.timeouts.connectMs, poolOptions).compose((dispatch) => (o, handler) => dispatch({ ...o, origin }, handler))
      : new Pool(origin, { ...poolOptions, connect: { timeout: config.timeouts.connectMs } }));
  return { name, config, dispatcher, disabled: config.optional && config.apiKey === '' };
}

/**
 * An agent whose connections to the provider are tunnelled (HTTP CONNECT) through the company's egress proxy; a
 * user:password in its URL is sent as Basic proxy credentials. undici's own connect timeout does not reach a tunnel:
 * `connectMs` bounds the whole way there, the connection to the proxy, its answer to CONNECT and the TLS handshake
 * through the tunnel, and one that runs out is a connect timeout (never sent).
 */
export function viaProxy(proxy: string, connectMs: number, options: Omit<ProxyAgent.Options, 'uri'>): ProxyAgent {
  const { username, password } = new URL(proxy);
  return new ProxyAgent({
    ...options,
    uri: proxy,
    // undici sends the URL's credentials only when both are there: a token given as the user name alone was dropped.
    ...(username !== '' && { token: `Basic ${Buffer.from(`${decodeURIComponent(username)}:${decodeURIComponent(password)}`).toString('base64')}` }),
    proxyTls: { timeout: connectMs },
    requestTls: { timeout: connectMs },
    factory: (origin, opts) => new Pool(origin, { ...(opts as Pool.Options), connect: boundedTunnel((opts as { connect: buildConnector.connector }).connect, connectMs) }),
  });
}

/**
 * The proxy closed the connection in answer to CONNECT, with no status (restarting, shedding load). undici reads its
 * "other side closed" (UND_ERR_SOCKET) as a passing socket error and opens the next connection at once, for as long
 * as the request waits: about a thousand CONNECTs a second for one request. Under a code of its own the request fails,
 * as one the proxy refused: nothing reached the provider.
 */
class TunnelClosed extends Error {
  readonly code = 'PROXY_CLOSED';
  constructor(override readonly cause: Error) {
    super('the egress proxy closed the connection in answer to CONNECT');
  }
}

/**
 * The tunnel's connect, bounded: undici waits for the proxy's answer to CONNECT as for any answer's headers (300 s),
 * and a request waiting for its connection does not see its own abort until the connection is made or fails. A proxy
 * that took the connection and never answered held a stream past its first-token timer and its deadline.
 */
function boundedTunnel(connect: buildConnector.connector, connectMs: number): buildConnector.connector {
  return (opts, callback) => {
    // ProxyAgent passes this signal on to its CONNECT: aborted, it closes the connection to the proxy.
    const abort = new AbortController();
    let settled = false;
    const timer = setTimeout(() => {
      settled = true;
      abort.abort();
      callback(new errors.ConnectTimeoutError(`Connect Timeout Error (through the egress proxy to ${opts.hostname}, timeout: ${connectMs}ms)`), null);
    }, connectMs);
    connect({ ...opts, signal: abort.signal } as buildConnector.Options, (...args: Parameters<buildConnector.Callback>) => {
      if (settled) {
        args[1]?.destroy();
        return;
      }
      settled = true;
      clearTimeout(timer);
      const [err] = args;
      if (err && (err as { code?: unknown }).code === 'UND_ERR_SOCKET') callback(new TunnelClosed(err), null);
      else callback(...args);
    });
  };
}

export function createProviderClients(config: Config, dispatcher?: Dispatcher): Map<string, ProviderClient> {
  const backstopMs = Math.max(...config.routes.map((r) => r.timeoutMs)) + 5_000;
  const clients = new Map<string, ProviderClient>();
  for (const [name, provider] of Object.entries(config.providers)) {
    clients.set(name, createProviderClient(name, provider, { dispatcher, backstopMs }));
  }
  return clients;
}

export async function closeProviderClients(clients: Map<string, ProviderClient>, ownDispatcher: boolean): Promise<void> {
  if (!ownDispatcher) return;
  await Promise.all([...clients.values()].map((c) => c.dispatcher.close()));
}
