// Hand mutation testing of Cerebras' windowed resets (policy/wait-hint.ts windowedResetHint), Groq's in-stream
// status_code (streaming/stream-events.ts upstreamErrorIn, providers/error-outcome.ts errorVerdict) and the upstream's own
// x-should-retry (pipeline/target-attempts.ts, observability/zero-series.ts targetRetryOn): each test kills a mutant
// that the feature's own tests let live.
import { describe, expect, it } from 'vitest';
import { ConfigSchema } from '../src/config/schema.ts';
import { createMetrics } from '../src/observability/metrics.ts';
import { zeroSeries } from '../src/observability/zero-series.ts';
import { parseWaitHint } from '../src/policy/wait-hint.ts';
import { errorVerdict } from '../src/providers/error-outcome.ts';
import { TargetKeys } from '../src/routing/target-keys.ts';
import { upstreamErrorIn } from '../src/streaming/stream-events.ts';
import { defaultConfig, requestLine } from './helpers/stack.ts';
import { sdkError } from './helpers/openai-error.ts';
import { healthy, json } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';

const NOW = Date.UTC(2026, 0, 1);

describe("Cerebras' windowed resets (x-ratelimit-reset-{requests,tokens}-{minute,hour,day}, seconds)", () => {
  it('reads an hour window as well as the minute and the day, as a hint for the one request', () => {
    expect(parseWaitHint({ 'x-ratelimit-remaining-requests-hour': '0', 'x-ratelimit-reset-requests-hour': '1800.5' }, NOW)).toEqual({
      delayMs: 1_800_500,
      source: 'x-ratelimit-reset',
      fleetWide: false,
    });
  });

  it('accepts a Go duration for the reset, as the docstring says', () => {
    expect(parseWaitHint({ 'x-ratelimit-remaining-tokens-minute': '0', 'x-ratelimit-reset-tokens-minute': '6m0s' }, NOW)?.delayMs).toBe(360_000);
  });

  it('waits for the latest reset among the used-up limits, not the first one listed, and never for one with room left', () => {
    const headers = {
      'x-ratelimit-remaining-requests-minute': '0',
      'x-ratelimit-reset-requests-minute': '20',
      'x-ratelimit-remaining-requests-day': '14302',
      'x-ratelimit-reset-requests-day': '80000',
      'x-ratelimit-remaining-tokens-day': '0',
      'x-ratelimit-reset-tokens-day': '50000',
    };
    expect(parseWaitHint(headers, NOW)?.delayMs).toBe(50_000_000);
  });

  it("comes after OpenAI's own x-ratelimit-reset-* when both are sent (the documented order)", () => {
    const headers = {
      'x-ratelimit-remaining-tokens': '0',
      'x-ratelimit-reset-tokens': '2s',
      'x-ratelimit-remaining-tokens-minute': '0',
      'x-ratelimit-reset-tokens-minute': '30',
    };
    expect(parseWaitHint(headers, NOW)?.delayMs).toBe(2_000);
  });
});

const WHAT = 'an error event before any output';

describe("an error event's status_code (Groq's) beside a code the gateway does not know", () => {
  it('is read only as an integer number', () => {
    expect(upstreamErrorIn({ error: { message: 'm', code: 'tool_use_failed', status_code: 400 } })?.status).toBe(400);
    expect(upstreamErrorIn({ error: { message: 'm', code: 'tool_use_failed', status_code: '400' } })).not.toHaveProperty('status');
    expect(upstreamErrorIn({ error: { message: 'm', code: 'tool_use_failed', status_code: 400.5 } })).not.toHaveProperty('status');
  });

  it('429 is a rate limit: its status, the rate_limit_error type, and no error code made up when none came', () => {
    const v = errorVerdict({ message: 'Rate limit reached, please slow down.', code: undefined, type: undefined, param: null, status: 429 }, WHAT, 'key');
    expect(v.outcome).toStrictEqual({ kind: 'http', status: 429, errorCode: null, hint: undefined });
    expect(JSON.parse(v.answer!.toString())).toEqual({ error: { message: 'Rate limit reached, please slow down.', type: 'rate_limit_error', param: null, code: null } });
  });

  it('a server status (500, 503) or one the gateway does not pass on (413) stays a broken stream, retried', () => {
    for (const status of [500, 503, 413]) {
      const v = errorVerdict({ message: 'The server had an error processing your request.', code: 'internal', type: undefined, param: null, status }, WHAT, 'key');
      expect(v).toEqual({ failure: `${WHAT}: internal` });
    }
  });

  it('never overrides the status a code the gateway knows stands for', () => {
    const v = errorVerdict({ message: 'Rate limit reached for tokens per minute.', code: 'rate_limit_exceeded', type: undefined, param: null, status: 400 }, WHAT, 'key');
    expect(v.outcome).toMatchObject({ kind: 'http', status: 429, errorCode: 'rate_limit_exceeded' });
  });
});

const gw = useScriptedUpstreams();
const messages = [{ role: 'user' as const, content: 'Summarise the incident.' }];
const TOO_LONG = { error: { message: "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.", type: 'invalid_request_error', param: 'messages', code: 'context_length_exceeded' } };

describe("the upstream's x-should-retry: false where the retry would not happen anyway", () => {
  it('a 400 that blames the request is answered as it came, and the log names no retry stopped: none was due', async () => {
    const g = await gw({ a: () => json(400, TOO_LONG, { 'x-should-retry': 'false' }) }, [{ provider: 'a' }]);
    const err = await sdkError(g.client.chat.completions.create({ model: 'small', messages }));
    expect(err.status).toBe(400);
    expect(err.code).toBe('context_length_exceeded');
    expect(g.seen.a).toHaveLength(1);
    const line = await requestLine(g.s);
    expect(line.status).toBe(400);
    expect(line.retriesStopped).toBeUndefined();
  });

  it('on a route of maxAttempts 1, a 503 fails over as retries_exhausted: no retry was there for the header to stop', async () => {
    const g = await gw({ a: () => json(503, { error: { message: 'busy', type: 'server_error' } }, { 'x-should-retry': 'false' }), b: healthy('from b', 'm') }, [{ provider: 'a' }, { provider: 'b' }], {
      route: { retry: { maxAttempts: 1 } },
    });
    const { response } = await g.client.chat.completions.create({ model: 'm', messages }).withResponse();
    expect(response.headers.get('x-stormgate-fallback')).toBe('retries_exhausted');
    expect(g.seen.a).toHaveLength(1);
  });
});

describe('retry reasons at zero for a provider that is two targets of a route', () => {
  it("has each of its keys carry the second target's own retryOn, not only the first's", async () => {
    const input = defaultConfig('http://127.0.0.1:9');
    for (const r of input.routes) {
      r.targets = [{ provider: 'mock', model: 'gpt-4o' }];
      if (r.name === 'chat') {
        r.retry = { retryOn: [503] };
        r.targets = [{ provider: 'mock', model: 'gpt-4o' }, { provider: 'mock', model: 'gpt-4.1', retry: { retryOn: [429, 'network'] } }];
      }
    }
    const config = ConfigSchema.parse(input);
    const metrics = createMetrics({ defaultMetrics: false });
    zeroSeries(config, metrics, new TargetKeys(config));
    const text = await metrics.registry.metrics();
    expect(text).toContain('stormgate_retry_count_total{route="chat",target="mock/gpt-4.1",reason="status_429"} 0');
    expect(text).toContain('stormgate_retry_count_total{route="chat",target="mock/gpt-4.1",reason="network"} 0');
  });
});
