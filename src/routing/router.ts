// Route matching: path, then model. Routes are tried in file order and the first match wins; everything a match
// needs is compiled once at start-up so the hot path only compares strings.
import type { Config, RouteConfig, TargetConfig } from '../config/schema.ts';

/** What kind of API a managed path speaks; decides how streams are read. `messages` is Anthropic's Messages API. */
export type ApiKind = 'chat' | 'completions' | 'responses' | 'embeddings' | 'messages' | 'other';

export interface CompiledRoute {
  readonly config: RouteConfig;
  readonly name: string;
  readonly api: ApiKind;
  /** Exact model names the route serves (listed by GET /v1/models). */
  readonly exactModels: readonly string[];
  /** True when the route serves models it cannot list (no filter, or globs). */
  readonly open: boolean;
  matchesModel(model: string | undefined): boolean;
  /** Upstream model for a target: its override, else the client's model. */
  upstreamModel(target: TargetConfig, clientModel: string | undefined): string | undefined;
}

type RouteMatch = { route: CompiledRoute } | { error: 'unknown_url' | 'model_not_found' };

export interface Router {
  match(path: string, model: string | undefined): RouteMatch;
  readonly routes: readonly CompiledRoute[];
  /** Every path a managed route listens on. */
  readonly paths: ReadonlySet<string>;
}

const API_BY_PATH: Record<string, ApiKind> = {
  '/v1/chat/completions': 'chat',
  '/v1/completions': 'completions',
  '/v1/responses': 'responses',
  '/v1/embeddings': 'embeddings',
  '/v1/messages': 'messages',
};

/** The API a route's path speaks, as the router reads it. */
export function apiKindOf(path: string): ApiKind {
  return API_BY_PATH[path] ?? 'other';
}

/**
 * `*` matches any run of characters; everything else is literal. Matched part by part, each at its first place after
 * the one before (the leftmost place is never worse for a glob that has no other wildcard): the model name is the
 * client's, and a regular expression with two `.*` backtracks quadratically on a long one that does not match (a
 * 50 KB name against `*gpt*mini` held the event loop for seconds).
 */
export function globMatcher(glob: string): (text: string) => boolean {
  const parts = glob.split('*');
  const first = parts[0]!;
  const last = parts.at(-1)!;
  const middle = parts.slice(1, -1);
  return (text) => {
    if (parts.length === 1) return text === glob;
    if (text.length < first.length + last.length || !text.startsWith(first) || !text.endsWith(last)) return false;
    let at = first.length;
    const end = text.length - last.length;
    for (const part of middle) {
      const found = text.indexOf(part, at);
      if (found === -1 || found + part.length > end) return false;
      at = found + part.length;
    }
    return true;
  };
}

function compileRoute(config: RouteConfig): CompiledRoute {
  const patterns = config.match.models;
  const exact = patterns?.filter((p) => !p.includes('*')) ?? [];
  const exactSet = new Set(exact);
  const globs = patterns?.filter((p) => p.includes('*')).map(globMatcher) ?? [];
  return {
    config,
    name: config.name,
    api: apiKindOf(config.match.path),
    exactModels: exact,
    open: patterns === undefined || globs.length > 0,
    matchesModel: patterns === undefined
      ? () => true
      : (model) => model !== undefined && (exactSet.has(model) || globs.some((matches) => matches(model))),
    upstreamModel: (target, clientModel) => target.model ?? clientModel,
  };
}

export function createRouter(config: Config): Router {
  const routes = config.routes.map(compileRoute);
  const byPath = new Map<string, CompiledRoute[]>();
  for (const r of routes) {
    const list = byPath.get(r.config.match.path) ?? [];
    list.push(r);
    byPath.set(r.config.match.path, list);
  }
  return {
    routes,
    paths: new Set(byPath.keys()),
    match(path, model) {
      const candidates = byPath.get(path);
      if (!candidates) return { error: 'unknown_url' };
      for (const route of candidates) if (route.matchesModel(model)) return { route };
      return { error: 'model_not_found' };
    },
  };
}
