// GET /v1/models: the models the routes serve. Exact names come from the config; routes that serve any model (no
// filter, or globs) add the provider's own list, filtered by their globs and cached so listing never adds load.
import type { ProviderClient } from '../providers/provider-client.ts';
import { globToRegExp, type Router } from './router.ts';

interface ModelEntry {
  id: string;
  object: 'model';
  created: number;
  owned_by: string;
}

const CACHE_MS = 5 * 60_000;
const FETCH_TIMEOUT_MS = 5_000;

/** How a family lists its models; azure-openai deployments are not listable with a key, and disabled providers are not asked. */
function modelsRequest(client: ProviderClient): { path: string; headers: Record<string, string> } | undefined {
  const { config } = client;
  if (client.disabled) return undefined;
  const basePath = new URL(config.baseUrl).pathname.replace(/\/+$/, '');
  if (config.family === 'openai') return { path: `${basePath}/models`, headers: { authorization: `Bearer ${config.apiKey}` } };
  if (config.family === 'anthropic') return { path: `${basePath.replace(/\/v1$/, '')}/v1/models`, headers: { 'x-api-key': config.apiKey, 'anthropic-version': config.anthropicVersion } };
  return undefined;
}

export function createModelsList(router: Router, providers: ReadonlyMap<string, ProviderClient>) {
  const cache = new Map<string, { at: number; ids: string[] }>();

  async function providerModels(name: string): Promise<string[]> {
    const hit = cache.get(name);
    if (hit && Date.now() - hit.at < CACHE_MS) return hit.ids;
    const client = providers.get(name)!;
    const listing = modelsRequest(client);
    if (!listing) return [];
    try {
      const res = await client.dispatcher.request({
        path: listing.path,
        method: 'GET',
        headers: listing.headers,
        signal: AbortSignal.timeout(FETCH_TIMEOUT_MS),
      });
      const body = (await res.body.json()) as { data?: Array<{ id?: unknown }> };
      const ids = res.statusCode === 200 && Array.isArray(body.data) ? body.data.map((m) => m.id).filter((id): id is string => typeof id === 'string') : [];
      cache.set(name, { at: Date.now(), ids });
      return ids;
    } catch {
      // A provider that cannot list its models must not break the listing; try again on the next call.
      return hit?.ids ?? [];
    }
  }

  return {
    async list(): Promise<{ object: 'list'; data: ModelEntry[] }> {
      const owners = new Map<string, string>();
      for (const route of router.routes) {
        for (const id of route.exactModels) owners.set(id, route.config.targets[0]!.provider);
        for (const t of route.config.targets) if (t.model) owners.set(t.model, t.provider);
        if (!route.open) continue;
        const globs = route.config.match.models?.filter((p) => p.includes('*')).map(globToRegExp);
        for (const provider of new Set(route.config.targets.map((t) => t.provider))) {
          for (const id of await providerModels(provider)) {
            if (!globs || globs.some((g) => g.test(id))) if (!owners.has(id)) owners.set(id, provider);
          }
        }
      }
      return { object: 'list', data: [...owners].map(([id, owned_by]) => ({ id, object: 'model', created: 0, owned_by })) };
    },
  };
}
