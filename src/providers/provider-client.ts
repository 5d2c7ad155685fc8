// One keep-alive undici Pool per provider, and the provider's API family (how to address and authenticate it).
// undici's own timers are coarse backstops here: the precise first-token, idle and response timers run on the
// request's signal in pipeline/attempt.ts.
import { Pool, type Dispatcher } from 'undici';
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
  const url = new URL(config.baseUrl);
  const dispatcher =
    opts.dispatcher ??
    new Pool(url.origin, {
      // An unset `connections` means unlimited in undici: always bound it.
      connections: config.maxConnections,
      connect: { timeout: config.timeouts.connectMs },
      headersTimeout: opts.backstopMs,
      bodyTimeout: opts.backstopMs,
      // A provider's Keep-Alive hint may shorten the time, never lengthen it past what the config allows.
      keepAliveTimeout: config.timeouts.keepAliveMs,
      keepAliveMaxTimeout: config.timeouts.keepAliveMs,
    });
  return { name, config, dispatcher, disabled: config.optional && config.apiKey === '' };
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
