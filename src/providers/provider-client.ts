// One keep-alive undici Pool per provider, and the provider's API family (how to address and authenticate it).
// undici's own timers are coarse backstops here: the precise first-token, idle and response timers run on the
// request's signal in pipeline/attempt.ts.
import { Pool, ProxyAgent, type Dispatcher } from 'undici';
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
 * `connectMs` bounds the connection to the proxy and the TLS handshake through it.
 */
export function viaProxy(proxy: string, connectMs: number, options: Omit<ProxyAgent.Options, 'uri'>): ProxyAgent {
  return new ProxyAgent({ ...options, uri: proxy, proxyTls: { timeout: connectMs }, requestTls: { timeout: connectMs } });
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
