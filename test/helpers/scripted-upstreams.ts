// A gateway in front of several scripted upstreams (scripted-provider.ts), one server each, named as the config's
// providers: for suites that play providers' failures on the wire and watch what each upstream received.
import OpenAI from 'openai';
import type { ConfigInput } from '../../src/config/schema.ts';
import { useFakeProviders } from './fake-provider.ts';
import { scripted, type Answer, type Seen } from './scripted-provider.ts';
import { useStacks, type Stack, type StackOptions } from './stack.ts';

type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];

/** Fast, deterministic retries, a budget that never refuses and no parking, unless a scenario asks otherwise. */
export const FAST: Partial<RouteInput> = {
  retry: { maxAttempts: 2, backoff: { strategy: 'fixed', baseMs: 5, capMs: 5 } },
  budget: { ratio: 10, windowS: 10, minRetriesPerSecond: 1000 },
  park: false,
};

export type Family = 'openai' | 'azure-openai' | 'anthropic';
/** Where each kind of upstream's API lives under its origin, as its baseUrl names it. */
const BASE_PATH: Record<Family, string> = { openai: '/v1', 'azure-openai': '', anthropic: '' };

/** An upstream: its answers, or its answers with its family and the path its baseUrl names (default: the family's). */
export type Upstream = Answer | { answer: Answer; family?: Family; path?: string };

export interface UpstreamsGateway {
  s: Stack;
  /** An SDK client that never retries by itself. */
  client: OpenAI;
  /** What each named upstream received. */
  seen: Record<string, Seen[]>;
}

export interface UpstreamsOptions {
  /** Settings of the one route (on top of FAST). */
  route?: Partial<RouteInput>;
  /** The route's path. Default: /v1/chat/completions. */
  path?: string;
  /** Settings of every provider. */
  provider?: Partial<ProviderInput>;
  /** Settings of one provider, by name. */
  providers?: Record<string, Partial<ProviderInput>>;
  /** Other top-level config. */
  extra?: Partial<ConfigInput>;
  /** The gateway's injected parts (a clock, a random source). */
  deps?: StackOptions['deps'];
}

/**
 * A gateway whose one route (chat completions unless `path` says) goes to `targets`, each provider played by its
 * Upstream on a server of its own, with no breaker. Call at the top of a test file: it registers the clean-up.
 */
export function useScriptedUpstreams(): (ups: Record<string, Upstream>, targets: RouteInput['targets'], opts?: UpstreamsOptions) => Promise<UpstreamsGateway> {
  const startProvider = useFakeProviders();
  const startStack = useStacks();
  return async (ups, targets, opts = {}) => {
    const providers: ConfigInput['providers'] = {};
    const seen: Record<string, Seen[]> = {};
    for (const [name, up] of Object.entries(ups)) {
      const { answer, family = 'openai', path } = typeof up === 'function' ? { answer: up } : up;
      seen[name] = [];
      const p = await startProvider(scripted(answer, seen[name]));
      providers[name] = {
        family,
        baseUrl: `${p.origin}${path ?? BASE_PATH[family]}`,
        apiKey: `${name}-key-0123456789`,
        breaker: false,
        timeouts: { connectMs: 1_000, firstTokenMs: 5_000, idleMs: 5_000 },
        ...(family === 'azure-openai' ? { apiVersion: '2024-10-21' } : {}),
        ...opts.provider,
        ...opts.providers?.[name],
      } as ProviderInput;
    }
    const s = await startStack({
      config: () => ({
        server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
        providers,
        routes: [{ name: 'chat', match: { path: opts.path ?? '/v1/chat/completions' }, targets, ...FAST, ...opts.route }],
        ...opts.extra,
      }),
      ...(opts.deps && { deps: opts.deps }),
    });
    return { s, seen, client: new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0 }) };
  };
}
