// auth.limits: a client past its rates is told when to come back, before its body is read or a provider is asked. A
// fleet of agents retrying in a loop of its own is held to its rate here, whatever the provider's state.
import type { ClientLimitConfig } from '../config/schema.ts';
import { GatewayError } from '../errors.ts';
import { clientRates, limitOf, retryAfterOf, type ClientRates, type Rate, type RateKind } from '../policy/client-rate.ts';
import type { Random } from '../policy/random.ts';
import type { StateStore } from '../state/store.ts';
import type { Usage } from '../streaming/usage.ts';

export interface ClientLimit {
  /** The refusal for a client over its rates, or undefined when admitted; undefined (no promise) for a client without limits. */
  admit(client: string): Promise<GatewayError | undefined> | undefined;
  /** Counts what a client's answered request used against its token rate, if it has one. */
  used(client: string, usage: readonly (Usage | undefined)[]): void;
}

interface ClientLimitsDeps {
  store: Pick<StateStore, 'admitClient' | 'spendTokens'>;
  now: () => number;
  random: Random;
  /** Counts a refusal, by client name and the rate that refused. */
  onLimited: (client: string, by: RateKind) => void;
}

export function clientLimits(limits: Record<string, ClientLimitConfig> | undefined, deps: ClientLimitsDeps): ClientLimit | undefined {
  if (limits === undefined || Object.keys(limits).length === 0) return undefined;
  const rates: Record<string, ClientRates> = Object.fromEntries(Object.entries(limits).map(([name, l]) => [name, clientRates(l)]));
  const ratesOf = (client: string) => limitOf(rates, client);
  return {
    admit(client) {
      const r = ratesOf(client);
      if (r === undefined) return undefined;
      const nowMs = deps.now();
      return deps.store.admitClient(client, r, nowMs).then((refusal) => {
        if (refusal === undefined) return undefined;
        deps.onLimited(client, refusal.by);
        const retryAfterMs = retryAfterOf(refusal, r, deps.random);
        return new GatewayError('client_rate_limited', `client "${client}" is over its rate of ${rateText(r, refusal.by)}; retry after ${retryAfterMs} ms`, { shouldRetry: true, retryAfterMs });
      });
    },
    used(client, usage) {
      const rate = ratesOf(client)?.tokens;
      if (rate === undefined) return;
      const tokens = usage.reduce((sum, u) => sum + (u ? u.prompt + u.completion : 0), 0);
      if (tokens > 0) deps.store.spendTokens(client, rate, tokens, deps.now());
    },
  };
}

function rateText(r: ClientRates, by: RateKind): string {
  const perMinute = (rate: Rate) => Math.round((60_000 / rate.intervalMs) * 1000) / 1000;
  return by === 'requests' ? `${perMinute(r.requests!)} requests per minute (burst ${r.requests!.burst})` : `${perMinute(r.tokens!)} tokens per minute`;
}
