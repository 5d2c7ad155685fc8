// auth.limits: a client past its request rate is told when to come back, before its body is read or a provider is
// asked. A fleet of agents retrying in a loop of its own is held to its rate here, whatever the provider's state.
import type { Config } from '../config/schema.ts';
import { GatewayError } from '../errors.ts';
import { jitterWaitHintMs } from '../policy/backoff.ts';
import { rateOf, type Rate } from '../policy/client-rate.ts';
import type { Random } from '../policy/random.ts';
import type { StateStore } from '../state/store.ts';

/** The refusal for a client over its rate, or undefined when admitted; undefined (no promise) for a client without a limit. */
export type ClientLimit = (client: string) => Promise<GatewayError | undefined> | undefined;

interface ClientLimitsDeps {
  store: Pick<StateStore, 'takeRate'>;
  now: () => number;
  random: Random;
  /** Counts a refusal, by client name. */
  onLimited: (client: string) => void;
}

export function clientLimits(limits: NonNullable<Config['auth']>['limits'], deps: ClientLimitsDeps): ClientLimit | undefined {
  if (limits === undefined || Object.keys(limits).length === 0) return undefined;
  const rates = new Map<string, Rate>(Object.entries(limits).map(([name, l]) => [name, rateOf(l.requestsPerMinute, l.burst)]));
  const anyClient = rates.get('*');
  return (client) => {
    const rate = rates.get(client) ?? anyClient;
    if (rate === undefined) return undefined;
    return deps.store.takeRate(client, rate, deps.now()).then((waitMs) => {
      if (waitMs <= 0) return undefined;
      deps.onLimited(client);
      // Clients refused together are told apart (x 1-1.2), or they would all come back for the same one slot.
      const retryAfterMs = jitterWaitHintMs(waitMs, deps.random);
      return new GatewayError('client_rate_limited', `client "${client}" is over its rate of ${formatRate(rate)}; retry after ${retryAfterMs} ms`, { shouldRetry: true, retryAfterMs });
    });
  };
}

function formatRate(rate: Rate): string {
  const perMinute = Math.round((60_000 / rate.intervalMs) * 1000) / 1000;
  return `${perMinute} requests per minute (burst ${rate.burst})`;
}
