// GET /v1/models and GET /v1/models/{model}: the models a client can request, by the router's own rule. Exact names
// come from the config; routes that serve any model (no filter, or globs) add the lists of the providers that would get
// the client's model, filtered by the route. Provider lists are fetched in parallel, once per provider, and cached
// (failures too), so listing never adds load to a provider that is struggling.
import { interceptors, type Dispatcher } from 'undici';
import type { ProviderClient } from '../providers/provider-client.ts';
import { withoutKey } from '../providers/key-echo.ts';
import type { TargetConfig } from '../config/schema.ts';
import type { CompiledRoute, Router } from './router.ts';
import { GatewayError } from '../errors.ts';

/** A provider's own fields (context windows, capabilities on some servers) are kept beside these. */
interface ModelEntry {
  id: string;
  object: 'model';
  created: number;
  owned_by: string;
  [field: string]: unknown;
}

interface ModelsListOptions {
  now?: () => number;
  /** How long a provider's list is kept: 5 minutes. */
  cacheMs?: number;
  /** How long a failed fetch stands before the provider is asked again: 30 s (the last good list is served meanwhile). */
  failureCacheMs?: number;
  /** A listing waits at most this long for a provider: 2 s. */
  fetchTimeoutMs?: number;
}

interface CacheEntry {
  at: number;
  ok: boolean;
  /** A failure that says nothing of what it lists: a 5xx, no answer, a broken body. Not a 4xx (it lists none here). */
  outage?: boolean;
  models: ModelEntry[];
}

/** A listing the provider answered with a 4xx: it has none to give (no such path, a key that may not list). */
class NoListing extends Error {}

/** How a family lists its models; azure-openai deployments are not listable with a key, and disabled providers are not asked. */
function modelsRequest(client: ProviderClient): { path: string; headers: Record<string, string> } | undefined {
  const { config } = client;
  if (client.disabled) return undefined;
  const basePath = new URL(config.baseUrl).pathname.replace(/\/+$/, '');
  if (config.family === 'openai') return { path: `${basePath}/models`, headers: { authorization: `Bearer ${config.apiKey}` } };
  if (config.family === 'anthropic') return { path: `${basePath.replace(/\/v1$/, '')}/v1/models`, headers: { 'x-api-key': config.apiKey, 'anthropic-version': config.anthropicVersion } };
  return undefined;
}

/**
 * The providers whose own models a route can serve: those of targets that pass the client's model on. A target with a
 * `model:` override (a fallback to another provider's model) sends its own model whatever the client asked, so its
 * provider's list says nothing about what clients may request.
 */
function listingProviders(route: CompiledRoute): string[] {
  if (!route.open) return [];
  return [...new Set(route.config.targets.filter((t) => t.model === undefined).map((t) => t.provider))];
}

/**
 * The model that answers a route for any model whose every target sends its own (a self-hosted model with a cloud
 * fallback): whatever name a client sends, its first target's model answers, so that name is the one to list (asked
 * for, it is served by that very model). No provider's list can say what such a route serves, and without it the
 * listing was empty. A fallback's model is not listed: asked for by name, the first target's would answer it.
 * `targets`: the route's targets whose provider is enabled (a disabled one is skipped: the next answers every name).
 */
function answeringModel(route: CompiledRoute, targets: readonly TargetConfig[]): string | undefined {
  const first = targets[0]?.model;
  // Weighted targets answer by turns: no one model answers a name.
  if (!route.open || first === undefined || route.config.strategy !== 'fallback' || targets.some((t) => t.model === undefined)) return undefined;
  return route.matchesModel(first) ? first : undefined;
}

/**
 * A provider's model object as the OpenAI API lists it: an OpenAI-compatible one as the provider sent it (apps sort
 * by `created`), an Anthropic one (`{ type, id, display_name, created_at }`) translated.
 */
function modelEntry(raw: unknown, client: ProviderClient): ModelEntry | undefined {
  if (typeof raw !== 'object' || raw === null) return undefined;
  const m = raw as Record<string, unknown>;
  if (typeof m.id !== 'string') return undefined;
  if (client.config.family === 'openai') {
    return { ...m, id: m.id, object: 'model', created: typeof m.created === 'number' ? m.created : 0, owned_by: typeof m.owned_by === 'string' ? m.owned_by : client.name };
  }
  const created = typeof m.created_at === 'string' ? Math.floor(Date.parse(m.created_at) / 1000) : Number.NaN;
  // Its own fields stay beside the OpenAI ones: an Anthropic client listing through the gateway reads them.
  return { ...m, id: m.id, object: 'model', created: Number.isFinite(created) ? created : 0, owned_by: client.name };
}

function unlistedError(providers: string[]): GatewayError {
  return new GatewayError('upstream_unavailable', `the model list of ${providers.map((p) => `\`${p}\``).join(', ')} could not be fetched; try again later`);
}

/** A listed model as Anthropic's API describes one (`type`, `display_name`, `created_at`), its other fields kept. */
export function asAnthropicModel(m: ModelEntry): ModelEntry {
  // A provider's `created` is any number it sends (in ms, or µs, on some servers): past the dates a Date holds,
  // toISOString() throws, and one such model made the whole listing a 500.
  const date = new Date(m.created * 1000);
  const createdAt = typeof m.created_at === 'string' ? m.created_at : Number.isNaN(date.getTime()) ? new Date(0).toISOString() : date.toISOString();
  return { ...m, type: 'model', display_name: typeof m.display_name === 'string' ? m.display_name : m.id, created_at: createdAt };
}

/** The listing as Anthropic's API pages it (one page: `has_more` false), for the Anthropic SDKs' models.list(). */
export function asAnthropicPage(list: { data: ModelEntry[] }): { data: ModelEntry[]; has_more: false; first_id: string | null; last_id: string | null } {
  const data = list.data.map(asAnthropicModel);
  return { data, has_more: false, first_id: data[0]?.id ?? null, last_id: data.at(-1)?.id ?? null };
}

export function createModelsList(router: Router, providers: ReadonlyMap<string, ProviderClient>, opts: ModelsListOptions = {}) {
  const now = opts.now ?? Date.now;
  const cacheMs = opts.cacheMs ?? 5 * 60_000;
  const failureCacheMs = opts.failureCacheMs ?? 30_000;
  const fetchTimeoutMs = opts.fetchTimeoutMs ?? 2_000;
  const cache = new Map<string, CacheEntry>();
  // A fetch in flight is shared: concurrent listings never send a provider a second request.
  const inFlight = new Map<string, Promise<ModelEntry[]>>();

  // A listing is an idempotent GET: undici's retry interceptor takes a provider's passing 5xx or reset (twice, quickly,
  // within the fetch's timeout), so one of them does not empty the listing for failureCacheMs.
  const retrying = new Map<string, Dispatcher>();
  const dispatcherOf = (client: ProviderClient): Dispatcher => {
    let d = retrying.get(client.name);
    if (!d) retrying.set(client.name, (d = client.dispatcher.compose(interceptors.retry({ maxRetries: 2, minTimeout: 100, maxTimeout: 500 }))));
    return d;
  };

  async function fetchModels(client: ProviderClient, listing: { path: string; headers: Record<string, string> }): Promise<ModelEntry[]> {
    const res = await dispatcherOf(client).request({ path: listing.path, method: 'GET', headers: listing.headers, signal: AbortSignal.timeout(fetchTimeoutMs) });
    if (res.statusCode !== 200) {
      await res.body.dump();
      throw res.statusCode >= 400 && res.statusCode < 500 ? new NoListing(`status ${res.statusCode}`) : new Error(`status ${res.statusCode}`);
    }
    // A server that echoes the credentials it was sent (in an id, an owner) must not put the key in the listing.
    const body = JSON.parse(withoutKey(await res.body.text(), client.config.apiKey)) as { data?: unknown[] };
    if (!Array.isArray(body.data)) throw new Error('no data array');
    return body.data.map((m) => modelEntry(m, client)).filter((m): m is ModelEntry => m !== undefined);
  }

  function providerModels(name: string): Promise<ModelEntry[]> | ModelEntry[] {
    const hit = cache.get(name);
    if (hit && now() - hit.at < (hit.ok ? cacheMs : failureCacheMs)) return hit.models;
    const pending = inFlight.get(name);
    if (pending) return pending;
    const client = providers.get(name);
    const listing = client && modelsRequest(client);
    if (!client || !listing) return [];
    const fetching = fetchModels(client, listing).then(
      (models) => {
        cache.set(name, { at: now(), ok: true, models });
        return models;
      },
      (err: unknown) => {
        // A provider that cannot list its models must not break the listing, nor be asked again at every listing:
        // its last good list stands until the failure expires.
        const models = hit?.models ?? [];
        cache.set(name, { at: now(), ok: false, outage: !(err instanceof NoListing), models });
        return models;
      },
    );
    inFlight.set(name, fetching);
    void fetching.finally(() => inFlight.delete(name));
    return fetching;
  }

  // A route whose every target's provider is disabled (optional, no key) answers each request 503 no_target.
  const enabled = (t: TargetConfig): boolean => providers.get(t.provider)?.disabled !== true;
  const servable = (route: CompiledRoute): boolean => route.config.targets.some(enabled);
  // The provider that would get a name only the config gives: the first target's whose provider is enabled.
  const owner = (route: CompiledRoute): string => (route.config.targets.find(enabled) ?? route.config.targets[0]!).provider;
  // Whether a request for `id` on the route's path would reach a target: routing takes the first route that matches
  // it, so one whose targets are all disabled also takes a model a later route lists.
  const reachable = (route: CompiledRoute, id: string): boolean => {
    const match = router.match(route.config.match.path, id);
    return 'route' in match && servable(match.route);
  };

  /**
   * `paths`: only the models of routes on these paths (what the client can call); all routes' when not given.
   * `unlisted`: the providers whose list could not be fetched, with no good one to stand in for it.
   */
  async function listing(paths?: ReadonlySet<string>): Promise<{ data: ModelEntry[]; unlisted: string[]; routes: readonly CompiledRoute[] }> {
    const routes = paths === undefined ? router.routes : router.routes.filter((r) => paths.has(r.config.match.path));
    const names = [...new Set(routes.flatMap(listingProviders))];
    const lists = new Map(await Promise.all(names.map(async (name) => [name, await providerModels(name)] as const)));
    const unlisted = names.filter((name) => cache.get(name)?.outage === true && lists.get(name)!.length === 0);
    const models = new Map<string, ModelEntry>();
    const add = (route: CompiledRoute, m: ModelEntry): void => {
      if (!models.has(m.id) && reachable(route, m.id)) models.set(m.id, m);
    };
    // File order, first wins, as in routing: a model is described by the provider that would get it first. A name
    // only the config gives has no provider object: its owner is that provider's name in the config.
    for (const route of routes) {
      for (const id of route.exactModels) add(route, { id, object: 'model', created: 0, owned_by: owner(route) });
      const served = answeringModel(route, route.config.targets.filter(enabled));
      if (served !== undefined) add(route, { id: served, object: 'model', created: 0, owned_by: owner(route) });
      for (const provider of listingProviders(route)) {
        for (const m of lists.get(provider) ?? []) if (route.matchesModel(m.id)) add(route, m);
      }
    }
    return { data: [...models.values()], unlisted, routes };
  }

  return {
    /**
     * The listing. Nothing to list because the providers that would say could not be asked is their outage, not "no
     * models": an empty list there read as the gateway serving none, and clients that list at start showed no models.
     */
    async list(paths?: ReadonlySet<string>): Promise<{ object: 'list'; data: ModelEntry[] }> {
      const { data, unlisted } = await listing(paths);
      if (data.length === 0 && unlisted.length > 0) throw unlistedError(unlisted);
      return { object: 'list', data };
    },
    /**
     * The model object for GET /v1/models/{model}, when the listing holds it; undefined when it does not. A name a
     * provider that could not be asked may serve (a route would send it there) is not known to be missing: its
     * outage, not a 404 model_not_found.
     */
    async retrieve(id: string, paths?: ReadonlySet<string>): Promise<ModelEntry | undefined> {
      const { data, unlisted, routes } = await listing(paths);
      const found = data.find((m) => m.id === id);
      const unknowable = (r: CompiledRoute) => r.matchesModel(id) && listingProviders(r).some((p) => unlisted.includes(p));
      if (found === undefined && routes.some(unknowable)) throw unlistedError(unlisted);
      return found;
    },
  };
}
