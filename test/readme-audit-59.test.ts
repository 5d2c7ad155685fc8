// README claims checked as a new user meets them (audit 59): "Deadlines and timeouts" (the margin, the timeout headers
// and their refusals, the early start of a stream on the client's deadline and its stall), "What the client sees" (the
// request id, x-stormgate-attempts after three 503s and the backup's answer, the gateway's own errors' x-request-id,
// x-should-retry on a hint over maxWaitHintMs and on a route of maxAttempts 1), `degraded` (which requests a fixed text
// answers) and `streamRecovery: continue` (its SSE comment, x-retry-attempt and x-retry-reason upstream, the metrics),
// run by hand against `npm run mock` and `npm start`; they held. What did not: README "Logs and metrics" has the
// counters for the label values the config names start at zero, and README "Retries" names three reasons a
// streamRecovery continuation is retried for (`stream_cut`, `stream_stalled`, `stream_error`), but a route with
// streamRecovery had only the first two of stormgate_retry_count_total at zero: a continuation past the provider's own
// error event (an overload mid-answer, the commonest break) made its series with its first increment, which
// increase() does not count. Nor had a target with a `retry` of its own (which replaces the route's, README "Failover
// and API families") its retryOn's reasons at zero: the route's were zeroed for it, reasons it never retries for.
import { describe, expect, it } from 'vitest';
import { ConfigSchema } from '../src/config/schema.ts';
import { createMetrics } from '../src/observability/metrics.ts';
import { zeroSeries } from '../src/observability/zero-series.ts';
import { TargetKeys } from '../src/routing/target-keys.ts';
import { defaultConfig } from './helpers/stack.ts';

/** stormgate_retry_count_total's lines at zero once a config is started, with the chat route made by `edit`. */
async function zeroRetryLines(edit: (chat: ReturnType<typeof defaultConfig>['routes'][number]) => void): Promise<string> {
  const input = defaultConfig('http://127.0.0.1:9');
  input.providers.backup = { family: 'openai', baseUrl: 'http://127.0.0.1:9/v1', apiKey: 'backup-key' };
  for (const r of input.routes) {
    r.targets = [{ provider: 'mock', model: 'gpt-4o' }];
    if (r.name === 'chat') edit(r);
  }
  const config = ConfigSchema.parse(input);
  const metrics = createMetrics({ defaultMetrics: false });
  zeroSeries(config, metrics, new TargetKeys(config));
  return (await metrics.registry.metrics()).split('\n').filter((l) => l.startsWith('stormgate_retry_count_total{route="chat"')).join('\n');
}

describe('a target with a retry of its own, before its first request', () => {
  it("has its own retryOn's reasons at zero, not the route's", async () => {
    const text = await zeroRetryLines((chat) => {
      chat.retry = { retryOn: [503] };
      chat.targets = [{ provider: 'mock', model: 'gpt-4o' }, { provider: 'backup', model: 'gpt-4.1', retry: { retryOn: [429, 'network'] } }];
    });
    expect(text).toContain('stormgate_retry_count_total{route="chat",target="mock/gpt-4o",reason="status_503"} 0');
    expect(text).toContain('stormgate_retry_count_total{route="chat",target="backup/gpt-4.1",reason="status_429"} 0');
    expect(text).toContain('stormgate_retry_count_total{route="chat",target="backup/gpt-4.1",reason="network"} 0');
    expect(text).not.toContain('target="backup/gpt-4.1",reason="status_503"');
    expect(text).not.toContain('target="mock/gpt-4o",reason="status_429"');
  });
});

describe('a route with streamRecovery: continue, before its first request', () => {
  it('has every reason a continuation is counted under at zero, stream_error (past an error event) included', async () => {
    const input = defaultConfig('http://127.0.0.1:9');
    for (const r of input.routes) {
      r.targets = [{ provider: 'mock', model: 'gpt-4o' }];
      if (r.name === 'chat') r.streamRecovery = 'continue';
    }
    const metrics = createMetrics({ defaultMetrics: false });
    zeroSeries(ConfigSchema.parse(input), metrics, new TargetKeys(ConfigSchema.parse(input)));
    const text = await metrics.registry.metrics();
    for (const reason of ['stream_cut', 'stream_stalled', 'stream_error']) {
      expect(text).toContain(`stormgate_retry_count_total{route="chat",target="mock/gpt-4o",reason="${reason}"} 0`);
    }
  });
});

// Audit 59's second design question, built: a route's contextWindowFallback is one of its targets for the counters
// too. Its series (requests, retries, the hand-over to it) were made by its first use, which increase() does not count:
// the first prompts too long for the primary showed no fallback at all.
describe("a route's contextWindowFallback, before its first request", () => {
  it('has its request and retry series at zero, and the context_length hand-over to it from each target', async () => {
    const input = defaultConfig('http://127.0.0.1:9');
    input.providers.backup = { family: 'openai', baseUrl: 'http://127.0.0.1:9/v1', apiKey: 'backup-key' };
    for (const r of input.routes) {
      r.targets = [{ provider: 'mock', model: 'gpt-4o' }];
      if (r.name === 'chat') r.contextWindowFallback = { provider: 'backup', model: 'gpt-4.1-long', retry: { retryOn: [429] } };
    }
    const config = ConfigSchema.parse(input);
    const metrics = createMetrics({ defaultMetrics: false });
    zeroSeries(config, metrics, new TargetKeys(config));
    const text = await metrics.registry.metrics();
    expect(text).toContain('stormgate_requests_total{route="chat",target="backup/gpt-4.1-long",priority="online",outcome="success"} 0');
    expect(text).toContain('stormgate_retry_count_total{route="chat",target="backup/gpt-4.1-long",reason="status_429"} 0');
    expect(text).toContain('stormgate_fallbacks_total{route="chat",from="mock/gpt-4o",to="backup/gpt-4.1-long",reason="context_length"} 0');
    // Only that hand-over: the fallback is tried for a prompt too long, for no other reason.
    expect(text).not.toContain('to="backup/gpt-4.1-long",reason="retries_exhausted"');
  });
});
