// Settings the schema accepts (a config that starts today must keep starting) but that cannot do what they say:
// said once at start-up, so a new user learns it then rather than from a 404 or a retry that never comes.
import { classify, isRetryable } from '../policy/outcome.ts';
import { computeDeadline } from '../policy/deadline.ts';
import { apiKindOf } from '../routing/router.ts';
import type { Config, RetryConfig } from './schema.ts';

/** One sentence per setting that cannot work as written, each naming where it is. Pure: runtime.ts logs them. */
export function configWarnings(config: Config): string[] {
  return [...providerWarnings(config), ...routeWarnings(config)];
}

function providerWarnings(config: Config): string[] {
  return Object.entries(config.providers).flatMap(([name, p]) => [...baseUrlWarnings(name, p), ...streamUsageWarnings(name, p), ...burstWarnings(name, p)]);
}

/**
 * A burst past a minute's worth of its rate: no provider's bucket holds more than its minute's limit, so after a quiet
 * spell the target is sent more at once than the provider takes, and the rest meet its 429s.
 */
function burstWarnings(name: string, p: Config['providers'][string]): string[] {
  const { requestsPerMinute: rpm, burst, tokensPerMinute: tpm, tokenBurst } = p.pools;
  const over = (what: string, b: number | undefined, rate: number | undefined, rateKey: string) =>
    b !== undefined && rate !== undefined && b > rate
      ? [`provider ${name}: pools.${what} ${b} is more than a minute's worth of pools.${rateKey} (${rate}): after a quiet spell a target is sent ${b} at once, past what a provider limited to ${rate} a minute takes; set it at most ${rate}`]
      : [];
  return [...over('burst', burst, rpm, 'requestsPerMinute'), ...over('tokenBurst', tokenBurst, tpm, 'tokensPerMinute')];
}

/** Azure refused stream_options before its 2024-09-01-preview api-version: every stream would get a 400. */
const FIRST_AZURE_STREAM_OPTIONS = '2024-09-01';

function streamUsageWarnings(name: string, p: Config['providers'][string]): string[] {
  if (!p.streamUsage) return [];
  if (p.family === 'anthropic') return [`provider ${name}: streamUsage does nothing for an anthropic provider, whose streams report their usage always`];
  const dated = /^\d{4}-\d{2}-\d{2}/.exec(p.apiVersion ?? '')?.[0];
  if (p.family === 'azure-openai' && dated !== undefined && dated < FIRST_AZURE_STREAM_OPTIONS) {
    return [`provider ${name}: streamUsage sends stream_options, which Azure's api-version ${p.apiVersion} refuses (from ${FIRST_AZURE_STREAM_OPTIONS}-preview; 2024-10-21 is the first GA one): every streamed chat completion would get a 400; raise apiVersion or turn streamUsage off`];
  }
  return [];
}

/**
 * The openai family adds /chat/completions to the base as it is, while OpenAI and most compatible servers serve their
 * API under /v1: every request got the provider's 404. Only a bare origin warns: a compatible server may well put its
 * API under another path (/openai/v1, /v1beta/openai, /api/v1), and azure-openai takes the origin.
 */
function baseUrlWarnings(name: string, p: Config['providers'][string]): string[] {
  if (p.family !== 'openai' || new URL(p.baseUrl).pathname !== '/') return [];
  const base = p.baseUrl.replace(/\/+$/, '');
  return [`provider ${name}: baseUrl ${base} has no path, so requests go to ${base}/chat/completions; OpenAI and most compatible servers want ${base}/v1 (the gateway adds only the endpoint's path)`];
}

function routeWarnings(config: Config): string[] {
  return config.routes.flatMap((route) => {
    const at = `route ${route.name}`;
    const retries: Array<[string, RetryConfig | undefined]> = [
      ['retry', route.retry],
      ...route.targets.map((t, i): [string, RetryConfig | undefined] => [`targets[${i}].retry`, t.retry]),
      ['contextWindowFallback.retry', route.contextWindowFallback?.retry],
    ];
    const out = retries.flatMap(([path, retry]) => (retry ? ignoredRetryOn(`${at}: ${path}.retryOn`, retry) : []));
    // The one wait rule takes a wait only if minAttemptMs is left after it: a deadline no longer than that leaves none.
    const { budgetMs } = computeDeadline({ routeTimeoutMs: route.timeoutMs, marginMs: route.deadlineMarginMs, headers: {} });
    if (budgetMs <= route.minAttemptMs) {
      out.push(`${at}: timeoutMs ${route.timeoutMs} leaves ${budgetMs} ms after its deadline margin, no more than minAttemptMs ${route.minAttemptMs}: no wait is ever taken, so a failed attempt is never retried and an unavailable target never parked; raise timeoutMs or lower minAttemptMs`);
    }
    // Stream recovery continues chat completion streams alone: set on another API's route (an Anthropic SDK's
    // /v1/messages, the Responses API) it never runs, and every cut there reaches the client as its error event.
    if (route.streamRecovery === 'continue' && apiKindOf(route.match.path) !== 'chat') {
      out.push(`${at}: streamRecovery continue does nothing on ${route.match.path}: only chat completion streams (/v1/chat/completions) are continued; a stream cut here ends with its error event`);
    }
    return out;
  });
}

/** Why the outcome table never retries a class of status, in the words of its row. */
const NEVER_RETRIED_BECAUSE: Partial<Record<string, string>> = {
  'client-error': 'the request itself is wrong',
  credentials: 'the gateway\'s key or billing',
};

/** Statuses in retryOn that the outcome table never lets be retried, whatever retryOn says. */
function ignoredRetryOn(where: string, retry: RetryConfig): string[] {
  const ignored = retry.retryOn.flatMap((r) => {
    if (typeof r !== 'number') return [];
    const c = classify({ kind: 'http', status: r, errorCode: null, hint: undefined });
    return isRetryable(c, [r]) ? [] : [`${r} (${NEVER_RETRIED_BECAUSE[c.cls] ?? c.cls})`];
  });
  if (ignored.length === 0) return [];
  return [`${where} lists ${ignored.join(', ')}, which the gateway never retries whatever retryOn says: the same request would get the same answer, so ${ignored.length === 1 ? 'it is' : 'they are'} ignored`];
}
