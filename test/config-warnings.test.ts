import { describe, expect, it } from 'vitest';
import { ConfigSchema, type ConfigInput } from '../src/config/schema.ts';
import { configWarnings } from '../src/config/warnings.ts';
import { TEST_KEY, useStacks } from './helpers/stack.ts';

type RouteInput = ConfigInput['routes'][number];
type ProviderInput = ConfigInput['providers'][string];

const warningsOf = (opts: { provider?: Partial<ProviderInput>; route?: Partial<RouteInput> } = {}): string[] =>
  configWarnings(
    ConfigSchema.parse({
      providers: { p: { family: 'openai', baseUrl: 'https://api.openai.com/v1', apiKey: 'k', ...opts.provider } as ProviderInput },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'p' }], ...opts.route }],
    }),
  );

describe('configWarnings', () => {
  it('says nothing about the shipped defaults', () => {
    expect(warningsOf()).toEqual([]);
  });

  it('warns about an openai baseUrl with no path, which sends every request to /chat/completions at the root', () => {
    expect(warningsOf({ provider: { baseUrl: 'https://api.openai.com' } })).toEqual([
      'provider p: baseUrl https://api.openai.com has no path, so requests go to https://api.openai.com/chat/completions; OpenAI and most compatible servers want https://api.openai.com/v1 (the gateway adds only the endpoint\'s path)',
    ]);
    expect(warningsOf({ provider: { baseUrl: 'http://127.0.0.1:9000/' } })).toEqual([expect.stringMatching(/^provider p: baseUrl http:\/\/127\.0\.0\.1:9000 has no path.* want http:\/\/127\.0\.0\.1:9000\/v1 /)]);
  });

  it('takes any other path of an OpenAI-compatible server, and the bare origin of azure-openai and anthropic', () => {
    for (const baseUrl of ['https://example.com/openai/v1', 'https://generativelanguage.googleapis.com/v1beta/openai', 'http://127.0.0.1:11434/api/v1', 'https://api.openai.com/v1/']) {
      expect(warningsOf({ provider: { baseUrl } }), baseUrl).toEqual([]);
    }
    expect(warningsOf({ provider: { family: 'azure-openai', baseUrl: 'https://example.openai.azure.com', apiVersion: '2024-10-21' } as Partial<ProviderInput> })).toEqual([]);
    expect(warningsOf({ provider: { family: 'anthropic', baseUrl: 'https://api.anthropic.com' } })).toEqual([]);
  });

  it('warns about streamUsage where it cannot work: an anthropic provider, an Azure api-version that refuses stream_options', () => {
    expect(warningsOf({ provider: { family: 'anthropic', baseUrl: 'https://api.anthropic.com', streamUsage: true } })).toEqual([expect.stringMatching(/^provider p: streamUsage does nothing for an anthropic provider/)]);
    const azure = (apiVersion: string) => warningsOf({ provider: { family: 'azure-openai', baseUrl: 'https://example.openai.azure.com', apiVersion, streamUsage: true } as Partial<ProviderInput> });
    expect(azure('2024-06-01')).toEqual([expect.stringMatching(/^provider p: streamUsage sends stream_options, which Azure's api-version 2024-06-01 refuses .* raise apiVersion or turn streamUsage off$/)]);
    expect(azure('2024-08-01-preview')).toHaveLength(1);
    for (const ok of ['2024-09-01-preview', '2024-10-21', '2025-04-01-preview', 'preview', 'v1']) expect(azure(ok), ok).toEqual([]);
    expect(warningsOf({ provider: { streamUsage: true } })).toEqual([]);
  });

  it('warns about a burst or tokenBurst past a minute\'s worth of its rate, which no provider limited per minute takes at once', () => {
    expect(warningsOf({ provider: { pools: { requestsPerMinute: 100, burst: 500 } } })).toEqual([
      "provider p: pools.burst 500 is more than a minute's worth of pools.requestsPerMinute (100): after a quiet spell a target is sent 500 at once, past what a provider limited to 100 a minute takes; set it at most 100",
    ]);
    expect(warningsOf({ provider: { pools: { tokensPerMinute: 18_000, tokenBurst: 30_000 } } })).toEqual([expect.stringMatching(/^provider p: pools\.tokenBurst 30000 is more than a minute's worth of pools\.tokensPerMinute \(18000\)/)]);
    expect(warningsOf({ provider: { pools: { requestsPerMinute: 100, burst: 100, tokensPerMinute: 18_000, tokenBurst: 18_000 } } })).toEqual([]);
  });

  it('names the route, the statuses and why for retryOn statuses the gateway never retries, wherever retryOn is', () => {
    expect(warningsOf({ route: { retry: { retryOn: [400, 404, 422, 429, 500, 'network'] } } })).toEqual([
      'route chat: retry.retryOn lists 400 (the request itself is wrong), 404 (the request itself is wrong), 422 (the request itself is wrong), which the gateway never retries whatever retryOn says: the same request would get the same answer, so they are ignored',
    ]);
    expect(warningsOf({ route: { targets: [{ provider: 'p', retry: { retryOn: [401, 402, 403, 408, 409, 413] } }] } })).toEqual([
      'route chat: targets[0].retry.retryOn lists 401 (the gateway\'s key or billing), 402 (the gateway\'s key or billing), 403 (the gateway\'s key or billing), which the gateway never retries whatever retryOn says: the same request would get the same answer, so they are ignored',
    ]);
    expect(warningsOf({ route: { contextWindowFallback: { provider: 'p', retry: { retryOn: [404] } } } })).toEqual([expect.stringMatching(/^route chat: contextWindowFallback\.retry\.retryOn lists 404 .* so it is ignored$/)]);
  });

  it('warns about a timeoutMs that leaves no more than minAttemptMs, so no retry can ever wait', () => {
    expect(warningsOf({ route: { timeoutMs: 800 } })).toEqual([
      'route chat: timeoutMs 800 leaves 550 ms after its deadline margin, no more than minAttemptMs 1000: no wait is ever taken, so a failed attempt is never retried and an unavailable target never parked; raise timeoutMs or lower minAttemptMs',
    ]);
    // The margin counts: 1200 ms less the default 250 ms is under the default minAttemptMs.
    expect(warningsOf({ route: { timeoutMs: 1200 } })).toHaveLength(1);
    expect(warningsOf({ route: { timeoutMs: 1200, deadlineMarginMs: 0, minAttemptMs: 500 } })).toEqual([]);
    expect(warningsOf({ route: { timeoutMs: 5000, minAttemptMs: 5000 } })).toHaveLength(1);
  });

  it('says nothing of a maxConcurrentRetries above maxConcurrent: retries may then take the whole pool, as the number says', () => {
    expect(warningsOf({ provider: { maxConnections: 10, pools: { maxConcurrent: 10, maxConcurrentRetries: 50 } } })).toEqual([]);
  });
});

describe('start-up', () => {
  const stack = useStacks();

  it('logs each warning once at warn level when the gateway starts', async () => {
    const s = await stack({ config: (mockUrl) => ({
      providers: { mock: { family: 'openai', baseUrl: mockUrl, apiKey: TEST_KEY } },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }], retry: { retryOn: [400, 500] } }],
    }) });
    const warnings = s.logs.map((l) => JSON.parse(l) as { level: number; msg: string }).filter((l) => l.level === 40).map((l) => l.msg);
    expect(warnings.filter((m) => /^provider mock: baseUrl .* has no path/.test(m))).toHaveLength(1);
    expect(warnings.filter((m) => /^route chat: retry\.retryOn lists 400 /.test(m))).toHaveLength(1);
  });
});
