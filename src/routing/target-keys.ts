// A target is a provider and an upstream model: the unit providers rate-limit and fail by ("the model is
// overloaded"), so each model gets its own breaker, hold-off, budget and metric label. Models the config names always
// do; others are learned as clients send them, up to MAX_LEARNED_MODELS per provider, and past that share
// `<provider>/other`, so clients cannot grow Redis keys or label sets without bound. A name the provider answers with
// 404 (no such model) gives its place back, so made-up names cannot use the places up, and so do its places at the
// other targets of the request's route no request has tried it at yet (planned for a fallback the 404 kept it from),
// or made-up names would use up the backup's; so does a model unused for LEARNED_IDLE_MS when a new name needs its
// place, so a gateway that runs for months follows the models clients move to instead of lumping every newer one
// into `other`. Each instance learns for itself. Without learning, every model of a route that serves any model (the default config) would share one
// breaker, and one broken model would open it for all.
import type { Config } from '../config/schema.ts';
import { settingsForModel, type BreakerSettings } from '../policy/breaker.ts';

/** Models learned from traffic per provider, beyond the configured ones. */
export const MAX_LEARNED_MODELS = 32;
/** How long a learned model must have gone unused before a new name may take its place. */
export const LEARNED_IDLE_MS = 60 * 60 * 1000;
/** Names remembered as refused (404), across providers. */
const MAX_REFUSED = 1_024;

/** Model names fit for a key and a metric label: no separators or control characters, and not too long. */
const KEYABLE_MODEL = /^[A-Za-z0-9._:@/+-]{1,100}$/;

/** The key a provider's models share when they hold no place of their own. */
export function sharedKey(provider: string): string {
  return `${provider}/other`;
}

export class TargetKeys {
  readonly #known: ReadonlySet<string>;
  /** Per provider, each learned model and when a request last asked for it. */
  readonly #learned = new Map<string, Map<string, number>>();
  /** `<provider>/<model>` names the provider answered 404: never learned again (until pushed out by newer ones). */
  readonly #refused = new Set<string>();
  /**
   * `<provider>/<model>` of learned names no request has tried at the provider yet: planned for a fallback only. Given
   * back (release) when the name's request ends with a 404 for it; a subset of the learned ones, so bounded as they are.
   */
  readonly #untried = new Set<string>();
  readonly #config: Config;
  readonly #now: () => number;
  /** Told of a learned key that gave its place to a new name, so what was kept under it goes too. */
  onEvicted: ((key: string) => void) | undefined;

  constructor(config: Config, now: () => number = Date.now) {
    this.#config = config;
    this.#now = now;
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

  /** `<provider>/<model>` for a configured or learned model, else `<provider>/other`. */
  key(provider: string, upstreamModel: string | undefined): string {
    if (upstreamModel === undefined) return sharedKey(provider);
    if (this.#known.has(upstreamModel) || this.#learn(provider, upstreamModel)) return `${provider}/${upstreamModel}`;
    return sharedKey(provider);
  }

  /**
   * The provider says the model does not exist (404): its place goes back, and the name is not learned again.
   * Returns the key it had, when it had one of its own, now or until another request's 404 gave it back (requests
   * in flight at once each drop what they kept under it).
   */
  forget(provider: string, model: string): string | undefined {
    const key = `${provider}/${model}`;
    this.#settings.delete(key);
    this.#untried.delete(key);
    if (!this.#learned.get(provider)?.delete(model)) return this.#refused.has(key) ? key : undefined;
    this.#refused.add(key);
    // Bounded too: the oldest refusal goes first (a Set keeps insertion order).
    if (this.#refused.size > MAX_REFUSED) this.#refused.delete(this.#refused.values().next().value!);
    return key;
  }

  /** A request is about to try the target of this key: a learned name's place there is no longer only planned. */
  tried(key: string): void {
    this.#untried.delete(key);
  }

  /**
   * Another target of the route answered 404 for the name, which no request has tried at this provider: the place it
   * took here when its request was planned goes back, but the name is not refused (this provider may serve it).
   * Returns the key it had, when it gave it back now.
   */
  release(provider: string, model: string): string | undefined {
    const key = `${provider}/${model}`;
    if (!this.#untried.delete(key)) return undefined;
    this.#learned.get(provider)?.delete(model);
    this.#settings.delete(key);
    return key;
  }

  /**
   * The request planned a target under `key` and its name holds no place of its own now: a 404 (forget), another
   * request's release, or an eviction gave it back while the request was in flight (a client that left, a timeout,
   * a failover there), so what it counted under the key since goes as well.
   */
  givenBack(provider: string, model: string, key: string): boolean {
    // Asked at the end of every request: a name that holds its place (nearly all) costs two lookups.
    if (this.#known.has(model) || this.#learned.get(provider)?.has(model)) return false;
    return key !== sharedKey(provider);
  }

  #learn(provider: string, model: string): boolean {
    let learned = this.#learned.get(provider);
    if (learned === undefined) this.#learned.set(provider, (learned = new Map()));
    const now = this.#now();
    if (learned.delete(model)) {
      // Taken out and put back: the map's order is the order of last use, the longest unused first.
      learned.set(model, now);
      return true;
    }
    if (this.#refused.has(`${provider}/${model}`)) return false;
    // `other` is the overflow key itself; a name that could not be a label stays out too.
    if (model === 'other' || !KEYABLE_MODEL.test(model)) return false;
    if (learned.size >= MAX_LEARNED_MODELS && !this.#evictIdle(provider, learned, now)) return false;
    learned.set(model, now);
    this.#untried.add(`${provider}/${model}`);
    return true;
  }

  /** Gives the place of the longest-unused learned model, if it has been idle LEARNED_IDLE_MS, to a new name. */
  #evictIdle(provider: string, learned: Map<string, number>, now: number): boolean {
    const [oldest, usedAt] = learned.entries().next().value!;
    if (now - usedAt < LEARNED_IDLE_MS) return false;
    learned.delete(oldest);
    this.#settings.delete(`${provider}/${oldest}`);
    this.#untried.delete(`${provider}/${oldest}`);
    this.onEvicted?.(`${provider}/${oldest}`);
    return true;
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
