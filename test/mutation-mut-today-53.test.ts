// Mutation round 53 on the day's new code: policy/wait-hint.ts (the upstream's clock, the bare x-ratelimit-reset),
// providers/error-outcome.ts (relayed hints, wrong-URL 404s, OpenRouter's in-flight budget 402), streaming/stream-events.ts
// (the STOPPED finish_reasons), pipeline/attempt.ts (a 429 inside a 200, compressed errors, the 402's 429),
// observability/zero-series.ts (a contextWindowFallback's series, each target's own retryOn) and
// pipeline/serve-targets.ts (endedWithClientVerdict). Each test here failed on a hand mutant the existing files let
// through, and passes on the code as it is.
import { describe, expect, it } from 'vitest';
import { MAX_WAIT_HINT_MS, parseWaitHint } from '../src/policy/wait-hint.ts';
import { cutShort, errorEventForClient } from '../src/streaming/stream-events.ts';
import type { SseEvent } from '../src/streaming/sse-parser.ts';
import { httpOutcome } from '../src/providers/error-outcome.ts';
import { ConfigSchema } from '../src/config/schema.ts';
import { createMetrics } from '../src/observability/metrics.ts';
import { configuredTargetKeys, zeroSeries } from '../src/observability/zero-series.ts';
import { TargetKeys } from '../src/routing/target-keys.ts';
import { defaultConfig } from './helpers/stack.ts';
import { sdkError } from './helpers/openai-error.ts';
import { json } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';

const now = Date.UTC(2015, 9, 21, 7, 28, 0); // a whole second, as an HTTP Date names
const httpDate = (ms: number) => new Date(ms).toUTCString();
const day = 24 * 3_600_000;

describe("wait-hint: the bounds of the upstream's clock", () => {
  it('keeps the gateway\'s clock for a Date exactly 2 s away, and takes the Date from 2 s and 1 ms', () => {
    const headers = { date: httpDate(now + 2_000), 'retry-after': httpDate(now + 7_000) };
    expect(parseWaitHint(headers, now)?.delayMs).toBe(7_000);
    // 1 ms more of skew: the Date is the upstream's clock, and the 5 s it asks for are 5 s.
    expect(parseWaitHint(headers, now - 1)?.delayMs).toBe(5_000);
  });

  it('still reads a Date exactly a day away as the upstream\'s clock, and one a day and 1 ms away as none', () => {
    const headers = { date: httpDate(now + day), 'retry-after': httpDate(now + day + 2_000) };
    expect(parseWaitHint(headers, now)?.delayMs).toBe(2_000);
    expect(parseWaitHint(headers, now - 1)?.delayMs).toBe(MAX_WAIT_HINT_MS);
  });

  it("ignores an age that is no whole number of seconds (negative, fractional), as it does one that is no number", () => {
    const kept = { date: httpDate(now - 30_000), 'retry-after': httpDate(now + 2_000) };
    for (const age of ['-30', '1.5', '30s', '+30']) expect(parseWaitHint({ ...kept, age }, now)?.delayMs, age).toBe(32_000);
  });
});

describe('wait-hint: a bare x-ratelimit-reset at the microseconds bound', () => {
  it('reads exactly 10^15 as no hint (microseconds), and one below it as Unix ms', () => {
    expect(parseWaitHint({ 'x-ratelimit-reset': '1000000000000000' }, now)).toBeUndefined();
    expect(parseWaitHint({ 'x-ratelimit-reset': String(now + 3_000) }, now)?.delayMs).toBe(3_000);
  });
});

describe('stream-events: each STOPPED finish_reason after the first output', () => {
  const ev = (data: unknown): SseEvent => {
    const text = JSON.stringify(data);
    return { raw: `data: ${text}`, data: text, event: null };
  };
  const chunk = (finish: string, extra: Record<string, unknown> = {}) => ({ object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content: 'lo' }, finish_reason: finish, ...extra }] });

  it.each(['abort', 'error', 'insufficient_system_resource'])('cuts the answer short on %j, keeping the text its chunk still carries', (reason) => {
    const short = cutShort('chat', ev(chunk(reason)));
    expect(short?.why).toBe(`the provider aborted the answer (finish_reason "${reason}")`);
    expect(JSON.parse(short!.left!.data!)).toEqual({ object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content: 'lo' }, finish_reason: null }] });
  });

  it("takes OpenRouter's per-choice error out with its finish_reason, and leaves another choice's error key alone", () => {
    const openRouter = chunk('error', { native_finish_reason: 'error', error: { code: 502, message: 'Upstream error' } });
    const left = JSON.parse(cutShort('chat', ev(openRouter))!.left!.data!) as { choices: Array<Record<string, unknown>> };
    expect(left.choices[0]).toEqual({ index: 0, delta: { content: 'lo' }, finish_reason: null, native_finish_reason: 'error' });
    const two = { object: 'chat.completion.chunk', choices: [{ index: 0, delta: {}, finish_reason: 'stop', error: 'kept' }, { index: 1, delta: {}, finish_reason: 'error' }] };
    expect((JSON.parse(cutShort('chat', ev(two))!.left!.data!) as { choices: unknown[] }).choices[0]).toEqual({ index: 0, delta: {}, finish_reason: 'stop', error: 'kept' });
  });

  it('names the reason of the stopped choice, not the first choice, in the error a first event is', () => {
    const two = { object: 'chat.completion.chunk', choices: [{ index: 0, delta: {}, finish_reason: 'stop' }, { index: 1, delta: {}, finish_reason: 'insufficient_system_resource' }] };
    expect(cutShort('chat', ev(two))?.why).toContain('insufficient_system_resource');
    expect(errorEventForClient('chat', ev({ choices: [{ index: 0, delta: {}, finish_reason: 'error' }] }))).toContain('finish_reason \\"error\\"');
  });
});

describe("error-outcome: the wait a router relays in its error's metadata", () => {
  const body = (metadata: unknown, extra: Record<string, unknown> = {}) => Buffer.from(JSON.stringify({ error: { message: 'Provider returned error', code: 429, metadata, ...extra } }));
  const hintOf = (b: Buffer, headers: Record<string, string> = {}) => {
    const o = httpOutcome(429, headers, b, now);
    return o.kind === 'http' ? o.hint : undefined;
  };

  it('reads retry_after_seconds rounded up to the ms, capped at maxWaitHintMs, this request\'s hint only', () => {
    expect(hintOf(body({ retry_after_seconds: 1.0004 }))).toEqual({ delayMs: 1001, source: 'retry-after', fleetWide: false });
    expect(hintOf(body({ retry_after_seconds: 10 * day }))?.delayMs).toBe(MAX_WAIT_HINT_MS);
  });

  it('takes no hint from a retry_after_seconds of 0, below it, or past any number (1e400 parses as Infinity)', () => {
    expect(hintOf(body({ retry_after_seconds: 0 }))).toBeUndefined();
    expect(hintOf(body({ retry_after_seconds: -3 }))).toBeUndefined();
    expect(hintOf(Buffer.from('{"error":{"message":"Provider returned error","code":429,"metadata":{"retry_after_seconds":1e400}}}'))).toBeUndefined();
  });

  it('reads the relayed headers whatever their case, a number as its digits, and never as a fleet-wide hold-off', () => {
    expect(hintOf(body({ headers: { 'Retry-After': '17' } }))).toEqual({ delayMs: 17_000, source: 'retry-after', fleetWide: false });
    expect(hintOf(body({ headers: { 'RETRY-AFTER-MS': 1500 } }))).toEqual({ delayMs: 1500, source: 'retry-after-ms', fleetWide: false });
    expect(hintOf(body({ headers: { 'X-RateLimit-Remaining': '0', 'X-RateLimit-Reset': String(now + 4_000) } }))?.delayMs).toBe(4_000);
  });

  it("comes after the answer's own headers and the body's RetryInfo, and before the token room", () => {
    const relayed = { retry_after_seconds: 9 };
    expect(hintOf(body(relayed), { 'retry-after': '2' })).toEqual({ delayMs: 2_000, source: 'retry-after', fleetWide: true });
    const retryInfo = { details: [{ '@type': 'type.googleapis.com/google.rpc.RetryInfo', retryDelay: '3s' }] };
    expect(hintOf(body(relayed, retryInfo))?.delayMs).toBe(3_000);
    const room = { 'x-ratelimit-remaining-tokens': '100', 'x-ratelimit-remaining-requests': '5', 'x-ratelimit-reset-tokens': '6s' };
    expect(hintOf(body(relayed), room)?.delayMs).toBe(9_000);
  });
});

describe('error-outcome: a 404 for a URL the provider does not have', () => {
  const unknownUrl = (b: unknown) => {
    const o = httpOutcome(404, {}, Buffer.from(typeof b === 'string' ? b : JSON.stringify(b)), now);
    return o.kind === 'http' && o.unknownUrl === true;
  };

  it('is one for an error with no message, Express\'s "Cannot POST", a bare "Not Found" with or without its period', () => {
    expect(unknownUrl({ error: { code: 404 } })).toBe(true);
    expect(unknownUrl({ error: { message: 'Cannot POST /v2/chat/completions' } })).toBe(true);
    expect(unknownUrl({ error: { message: 'Not Found.' } })).toBe(true);
    expect(unknownUrl({ error: { message: 'Unknown URL: /v1/chat' } })).toBe(true);
  });

  it('is none for a Not Found that goes on to name something, a deployment\'s code, or a field of the request', () => {
    expect(unknownUrl({ error: { message: 'Not found: the thread thread_abc' } })).toBe(false);
    expect(unknownUrl({ error: { code: 'DeploymentNotFound', message: 'Resource not found' } })).toBe(false);
    expect(unknownUrl({ error: { message: 'Not Found', param: 'file_id' } })).toBe(false);
  });
});

describe("error-outcome: OpenRouter's 402", () => {
  const of = (metadata: unknown) => httpOutcome(402, { 'retry-after': '3' }, Buffer.from(JSON.stringify({ error: { code: 402, message: 'Insufficient credits', metadata } })), now);

  it('for a full in-flight budget is the 429 it stands for, its retry-after the hint; any other limit_source stays a 402', () => {
    expect(of({ limit_source: 'openrouter_in_flight_budget' })).toMatchObject({ status: 429, hint: { delayMs: 3_000 } });
    expect(of({ limit_source: 'key_limit' })).toMatchObject({ status: 402 });
    expect(of(null)).toMatchObject({ status: 402 });
  });

  it('is only a 402: a 403 with that metadata keeps its status', () => {
    const o = httpOutcome(403, {}, Buffer.from(JSON.stringify({ error: { message: 'x', metadata: { limit_source: 'openrouter_in_flight_budget' } } })), now);
    expect(o).toMatchObject({ status: 403 });
  });
});

describe("zero-series: a contextWindowFallback's series and each target's own retryOn", () => {
  type Input = ReturnType<typeof defaultConfig>;
  const started = async (edit: (input: Input, chat: Input['routes'][number]) => void) => {
    const input = defaultConfig('http://127.0.0.1:9');
    input.providers.backup = { family: 'openai', baseUrl: 'http://127.0.0.1:9/v1', apiKey: 'backup-key' };
    for (const r of input.routes) {
      r.targets = [{ provider: 'mock', model: 'gpt-4o' }];
      if (r.name === 'chat') edit(input, r);
    }
    const config = ConfigSchema.parse(input);
    const metrics = createMetrics({ defaultMetrics: false });
    zeroSeries(config, metrics, new TargetKeys(config));
    return { config, text: await metrics.registry.metrics() };
  };

  it("zeroes a lone target's own retryOn, not the route's", async () => {
    const { text } = await started((_, chat) => {
      chat.retry = { retryOn: [503] };
      chat.targets = [{ provider: 'mock', model: 'gpt-4o', retry: { retryOn: [429] } }];
    });
    expect(text).toContain('stormgate_retry_count_total{route="chat",target="mock/gpt-4o",reason="status_429"} 0');
    expect(text).not.toContain('stormgate_retry_count_total{route="chat",target="mock/gpt-4o",reason="status_503"}');
  });

  it('makes no hand-over from a target to itself when the fallback is also one of the targets', async () => {
    const { text } = await started((_, chat) => {
      chat.targets = [{ provider: 'backup', model: 'gpt-4.1' }, { provider: 'mock', model: 'gpt-4o' }];
      chat.contextWindowFallback = { provider: 'mock', model: 'gpt-4o' };
    });
    expect(text).toContain('stormgate_fallbacks_total{route="chat",from="backup/gpt-4.1",to="mock/gpt-4o",reason="context_length"} 0');
    expect(text).not.toContain('from="mock/gpt-4o",to="mock/gpt-4o"');
  });

  it("counts the route's requests under the fallback's pool's lower classes too, and names its key among the configured", async () => {
    const { config, text } = await started((input, chat) => {
      input.providers.mock = { ...input.providers.mock!, pools: { classes: { online: {} } } } as Input['providers'][string];
      input.providers.backup = { ...input.providers.backup!, pools: { classes: { online: {}, batch: {} } } } as Input['providers'][string];
      chat.contextWindowFallback = { provider: 'backup', model: 'gpt-4.1-long' };
    });
    expect(text).toMatch(/stormgate_requests_total\{route="chat",target="mock\/gpt-4o",priority="batch",outcome="success"\} 0/);
    expect(configuredTargetKeys(config, new TargetKeys(config))).toContain('backup/gpt-4.1-long');
  });
});

describe('attempt: an error object in a 200 whole answer that is no rate limit', () => {
  const gw = useScriptedUpstreams();

  it('stays a broken answer (502 upstream_bad_response, retried), not the 400 its code names', async () => {
    const error = { message: "This model's maximum context length is 8192 tokens", code: 'context_length_exceeded', metadata: { provider_name: 'Kluster' } };
    const g = await gw({ a: () => json(200, { error }) }, [{ provider: 'a' }]);
    const err = await sdkError(g.client.chat.completions.create({ model: 'meta-llama/llama-3.3-70b-instruct', messages: [{ role: 'user', content: 'Hi' }] }));
    expect(err.status).toBe(502);
    expect(err.code).toBe('upstream_bad_response');
    expect(g.seen.a).toHaveLength(2);
  });
});
