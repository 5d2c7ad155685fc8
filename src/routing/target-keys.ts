// A target is a provider and an upstream model. State keys and metric labels name the model only when the config
// names it; any other model a client sends shares `<provider>/other`, so clients cannot grow Redis keys or label sets.
import type { Config } from '../config/schema.ts';
import { settingsForModel, type BreakerSettings } from '../policy/breaker.ts';

export class TargetKeys {
  readonly #known: ReadonlySet<string>;
  readonly #config: Config;

  constructor(config: Config) {
    this.#config = config;
    const known = new Set<string>();
    for (const route of config.routes) {
      for (const m of route.match.models ?? []) if (!m.includes('*')) known.add(m);
      for (const t of route.targets) if (t.model) known.add(t.model);
    }
    for (const p of Object.values(config.providers)) {
      if (p.breaker) for (const m of Object.keys(p.breaker.models)) known.add(m);
    }
    this.#known = known;
  }

  /** `<provider>/<model>` for a configured model, else `<provider>/other`. */
  key(provider: string, upstreamModel: string | undefined): string {
    return `${provider}/${upstreamModel !== undefined && this.#known.has(upstreamModel) ? upstreamModel : 'other'}`;
  }

  readonly #settings = new Map<string, BreakerSettings | undefined>();

  /** The breaker settings of a target key; undefined when its provider has the breaker off. Merged once per key. */
  breakerSettings(key: string): BreakerSettings | undefined {
    if (this.#settings.has(key)) return this.#settings.get(key);
    const slash = key.indexOf('/');
    const breaker = this.#config.providers[key.slice(0, slash)]?.breaker;
    const settings = breaker ? settingsForModel(breaker, key.slice(slash + 1)) : undefined;
    this.#settings.set(key, settings);
    return settings;
  }
}
