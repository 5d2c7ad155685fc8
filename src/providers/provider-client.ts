// One keep-alive undici Pool per provider, and the provider's API family (how to address and authenticate it).
// undici's own timers are coarse backstops here: the precise first-token, idle and response timers run on the
// request's signal in pipeline/attempt.ts.
import { Pool, type Dispatcher } from 'undici';
import { viaProxy } from './egress-proxy.ts';
import { timedConnector } from './connect-timer.ts';
import { providerTls } from './provider-tls.ts';
import type { Config, ProviderConfig } from '../config/schema.ts';

export interface ProviderClient {
  readonly name: string;
  readonly config: ProviderConfig;
  readonly dispatcher: Dispatcher;
  /** An optional provider without a key: skipped as a target. */
  readonly disabled: boolean;
}

interface ProviderClientOptions {
  /** Tests and embedders may pass their own dispatcher (e.g. an undici MockAgent). */
  dispatcher?: Dispatcher;
  /** Coarse backstop for headers and body reads, in ms: above every route timeout (and this provider's stream timers). */
  backstopMs: number;
}

function createProviderClient(name: string, config: ProviderConfig, opts: ProviderClientOptions): ProviderClient {
  const { origin } = new URL(config.baseUrl);
  const backstopMs = providerBackstopMs(config, opts.backstopMs);
  const poolOptions = {
    // An unset `connections` means unlimited in undici: always bound it.
    connections: config.maxConnections,
    headersTimeout: backstopMs,
    bodyTimeout: backstopMs,
    // A provider's Keep-Alive hint may shorten the time, never lengthen it past what the config allows.
    keepAliveTimeout: config.timeouts.keepAliveMs,
    keepAliveMaxTimeout: config.timeouts.keepAliveMs,
  };
  // Read even with an injected dispatcher: a caFile that cannot be used fails start-up either way.
  const tls = providerTls(name, config);
  const dispatcher =
    opts.dispatcher ??
    (config.proxy
      ? viaProxy(config.proxy, config.timeouts.connectMs, { ...poolOptions, requestTls: tls }).compose(toOrigin(origin))
      : new Pool(origin, { ...poolOptions, connect: timedConnector(config.timeouts.connectMs, tls) }));
  return { name, config, dispatcher, disabled: config.optional && config.apiKey === '' };
}

/**
 * undici's headers and body timers, a backstop only: above the routes' timeouts and above the provider's own stream
 * timers. A started stream's gaps are idleMs's, and one started early at the client's deadline (or a background
 * response) may be silent until firstTokenMs, as may a streamRecovery continuation, which no deadline bounds, until its
 * headers: set from the routes' timeoutMs alone, undici cut an 8 s gap of a stream allowed 15 s on a 1 s route (a
 * `cut` and a breaker failure, "Body Timeout Error") before the gateway's own timer was due.
 */
function providerBackstopMs(config: ProviderConfig, routesBackstopMs: number): number {
  const { idleMs, firstTokenMs } = config.timeouts;
  return Math.max(routesBackstopMs, Math.max(idleMs, firstTokenMs) + BACKSTOP_SLACK_MS);
}

/** How far undici's backstops lie past the timers they back (undici's own timers fire up to about a second late). */
const BACKSTOP_SLACK_MS = 5_000;

/** Requests name no origin (each provider has its own dispatcher): the proxy's agent, one for any origin, needs one. */
function toOrigin(origin: string): Dispatcher.DispatcherComposeInterceptor {
  return (dispatch) => (options, handler) => dispatch({ ...options, origin }, handler);
}

export function createProviderClients(config: Config, dispatcher?: Dispatcher): Map<string, ProviderClient> {
  const backstopMs = Math.max(...config.routes.map((r) => r.timeoutMs)) + BACKSTOP_SLACK_MS;
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
