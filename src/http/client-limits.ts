// auth.limits: a client past its rates is told when to come back, before its body is read or a provider is asked; a
// request whose estimated tokens do not fit its client's token rate, once its body is read. A fleet of agents retrying
// in a loop of its own is held to its rate here, whatever the provider's state.
import type { ClientLimitConfig } from '../config/schema.ts';
import { GatewayError } from '../errors.ts';
import { clientRates, deliveredTokens, limitOf, perMinute, retryAfterOf, settlement, usedTokens, type ClientRates, type ClientRefusal, type RateKind, type TokenEstimate } from '../policy/client-rate.ts';
import type { Random } from '../policy/random.ts';
import type { StateStore } from '../state/store.ts';
import type { Usage } from '../streaming/usage.ts';

export interface ClientLimit {
  /** The refusal for a client over its rates, or undefined when admitted; undefined (no promise) for a client without limits. */
  admit(client: string): Promise<GatewayError | undefined> | undefined;
  /**
   * Reserves a managed request's estimated tokens (its body read) against its client's token rate: the refusal when
   * they do not fit, else undefined; undefined (no promise) for a client without a token rate, which reserves nothing.
   */
  reserve(client: string, estimate: TokenEstimate): Promise<GatewayError | undefined> | undefined;
  /** Settles what a request reserved once it has ended, against what it used (settlement). */
  settle(client: string, reserved: TokenEstimate, ended: RequestEnded): void;
  /**
   * Whether a request of `client` that says it is its SDK's retry (x-stainless-retry-count) retries a refusal this
   * instance told it to come back from: it takes one of those refusals (see toldBack).
   */
  retriesRefusal(client: string): boolean;
}

/**
 * How long after the time it was told a refused request's retry is still taken for that refusal's: an SDK comes back
 * at the time told, give or take a loaded event loop.
 */
const TOLD_BACK_SLACK_MS = 10_000;

/** What a request that reserved tokens ended with, for its settlement. */
interface RequestEnded {
  /** Its answers' usage as the token metrics have it (none came: undefined entries only). */
  usage: readonly (Usage | undefined)[];
  /** Whether any of its attempts reached a provider. */
  sentUpstream: boolean;
  /**
   * The characters of output its client was passed (a stream's, or a whole answer's counted when it came without
   * usage): the completion when no usage came (settlement), and the least
   * completion counted when `usagePartial` (a stream that did not end whole: its usage may have come in part).
   */
  outputChars?: number;
  usagePartial?: boolean;
}

interface ClientLimitsDeps {
  store: Pick<StateStore, 'admitClient' | 'reserveTokens' | 'spendTokens'>;
  now: () => number;
  random: Random;
  /** Counts a refusal, by client name and the rate that refused. */
  onLimited: (client: string, by: RateKind) => void;
}

export function clientLimits(limits: Record<string, ClientLimitConfig> | undefined, deps: ClientLimitsDeps): ClientLimit | undefined {
  if (limits === undefined || Object.keys(limits).length === 0) return undefined;
  const rates: Record<string, ClientRates> = Object.fromEntries(Object.entries(limits).map(([name, l]) => [name, clientRates(l)]));
  const ratesOf = (client: string) => limitOf(rates, client);
  /**
   * Per client, the refusals told to come back within the minute (x-should-retry: true, so the SDKs do), until the
   * last of those times: their retries are the client's rate at work, not a provider's failure retried, and the retry
   * budget, shared by every client of a route, takes them as requests. Counted as retries, one tenant retrying the 429s
   * of its own rate spent the budget another tenant's 503 then lacked. This instance's refusals only: a retry that
   * reaches another instance of a fleet is a retry there, as before.
   */
  const toldBack = new Map<string, { owed: number; untilMs: number }>();
  return {
    admit(client) {
      const r = ratesOf(client);
      if (r === undefined) return undefined;
      const nowMs = deps.now();
      return deps.store.admitClient(client, r, nowMs).then((refusal) => refusal && refused(client, r, refusal));
    },
    reserve(client, estimate) {
      const r = ratesOf(client);
      if (r?.tokens === undefined) return undefined;
      const tokens = estimate.prompt + estimate.completion;
      return deps.store
        .reserveTokens(client, { ...r, tokens: r.tokens }, tokens, deps.now())
        .then((refusal) => refusal && refused(client, r, refusal, ` (this request's estimate: ${tokens} tokens, its body's bytes / 4 plus its completion cap)`));
    },
    settle(client, reserved, { usage, sentUpstream, outputChars = 0, usagePartial = false }) {
      const rate = ratesOf(client)?.tokens;
      if (rate === undefined) return;
      const used = usedTokens(usage, usagePartial ? deliveredTokens(outputChars, reserved.completion) : 0);
      const tokens = settlement(reserved, used, sentUpstream, outputChars);
      if (tokens !== 0) deps.store.spendTokens(client, rate, tokens, deps.now());
    },
    retriesRefusal(client) {
      const told = toldBack.get(client);
      if (told === undefined) return false;
      if (--told.owed <= 0 || deps.now() > told.untilMs) toldBack.delete(client);
      return told.untilMs >= deps.now();
    },
  };

  function refused(client: string, r: ClientRates, refusal: ClientRefusal, why = ''): GatewayError {
    deps.onLimited(client, refusal.by);
    const retryAfterMs = retryAfterOf(refusal, r, deps.random);
    if (retryAfterMs <= 60_000) {
      const told = toldBack.get(client);
      const untilMs = deps.now() + retryAfterMs + TOLD_BACK_SLACK_MS;
      if (told === undefined || told.untilMs < deps.now()) toldBack.set(client, { owed: 1, untilMs });
      else toldBack.set(client, { owed: told.owed + 1, untilMs: Math.max(told.untilMs, untilMs) });
    }
    return new GatewayError('client_rate_limited', `client "${client}" is over its rate of ${rateText(r, refusal.by)}${why}; retry after ${retryAfterMs} ms`, { shouldRetry: true, retryAfterMs });
  }
}

function rateText(r: ClientRates, by: RateKind): string {
  return by === 'requests' ? `${perMinute(r.requests!)} requests per minute (burst ${r.requests!.burst})` : `${perMinute(r.tokens!)} tokens per minute`;
}
