// OpenAI answers an overload with a code of its own: a 503 `server_is_overloaded` (type service_unavailable_error,
// "The server is overloaded") and `slow_down` (type rate_limit_error: traffic grown faster than it can take, "reduce
// your request rate"; a 429 now, a 503 before), both from its error-codes guide. Their remedy is a lower rate. Read as
// a plain 5xx, neither cut the target's adaptive concurrency limit (a 529 or a 429 does): the gateway went on sending
// as many at once into the overload. Now they are the provider at capacity (policy/outcome.ts CAPACITY_CODES):
// retried and failed over as before, counted by the breaker, and each cuts the adaptive limit. A plain 503 still does
// not. Inside a 200 stream, before any output, `slow_down` is the 429 it stands for. The same guide's 429
// `credit_balance_exhausted` (type insufficient_quota) was read by its code as a rate limit: retried and held off,
// where no wait brings the credit back; its type says the account, the gateway's own (502 upstream_auth_error).
// Real HTTP: scripted upstreams and the official `openai` SDK; the limit is read from /metrics.
import { describe, expect, it } from 'vitest';
import { errorCodeOf } from '../src/providers/error-outcome.ts';
import { classify } from '../src/policy/outcome.ts';
import { sdkError } from './helpers/openai-error.ts';
import { cc, delta, json, type Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams, type UpstreamsGateway } from './helpers/scripted-upstreams.ts';

const gw = useScriptedUpstreams();
const ask = { model: 'gpt-4o', messages: [{ role: 'user' as const, content: 'hi' }] };
const MAX = 8;

const overloaded = (code: string | null, type: string, message: string) => (): Script => json(503, { error: { message, type, param: null, code } });

async function poolLimit(g: UpstreamsGateway): Promise<number> {
  const text = await (await fetch(`${g.s.url}/metrics`)).text();
  return Number(/^stormgate_pool_limit\{target="a\/gpt-4o"\} ([\d.]+)$/m.exec(text)?.[1]);
}

/** Sends rounds of MAX requests at once (each failing), then reads the target's adaptive limit. */
async function limitAfterBursts(answer: () => Script): Promise<number> {
  const g = await gw({ a: answer }, [{ provider: 'a', model: 'gpt-4o' }], { provider: { maxConnections: MAX }, route: { retry: { maxAttempts: 1 } } });
  for (let i = 0; i < 4; i++) await Promise.all(Array.from({ length: MAX }, () => g.client.chat.completions.create(ask).catch((e: unknown) => e)));
  return poolLimit(g);
}

describe("OpenAI's overload codes", () => {
  it('classifies server_is_overloaded and a 503 slow_down as the provider at capacity; a 429 slow_down stays a rate limit', () => {
    expect(classify({ kind: 'http', status: 503, errorCode: 'server_is_overloaded', hint: undefined })).toMatchObject({ cls: 'overloaded', retryKey: 503 });
    expect(classify({ kind: 'http', status: 503, errorCode: 'slow_down', hint: undefined })).toMatchObject({ cls: 'overloaded', retryKey: 503 });
    expect(classify({ kind: 'http', status: 429, errorCode: 'slow_down', hint: undefined })).toMatchObject({ cls: 'rate-limited', retryKey: 429 });
    expect(classify({ kind: 'http', status: 503, errorCode: 'server_error', hint: undefined })).toMatchObject({ cls: 'server-error' });
  });

  it('a burst of 503 server_is_overloaded cuts the adaptive limit; the same burst of plain 503s does not', async () => {
    expect(await limitAfterBursts(overloaded('server_is_overloaded', 'service_unavailable_error', 'The server is overloaded. Please try again later.'))).toBeLessThan(MAX);
    expect(await limitAfterBursts(overloaded(null, 'server_error', 'The server had an error while processing your request.'))).toBe(MAX);
  });

  it('a 503 slow_down cuts the adaptive limit too', async () => {
    expect(await limitAfterBursts(overloaded('slow_down', 'rate_limit_error', 'Please reduce your request rate.'))).toBeLessThan(MAX);
  });

  it('a slow_down error event before any output reaches the client as the 429 it stands for, with its message', async () => {
    const event = `data: ${JSON.stringify({ error: { message: 'Please reduce your request rate.', type: 'rate_limit_error', param: null, code: 'slow_down' } })}\n\n`;
    const g = await gw({ a: () => ({ steps: [cc([delta({ role: 'assistant', content: '' })]), event] }) }, [{ provider: 'a' }], { route: { retry: { maxAttempts: 1 } } });
    const err = await sdkError(g.client.chat.completions.create({ ...ask, stream: true }));
    expect(err.status).toBe(429);
    expect((err.error as { code?: string }).code).toBe('slow_down');
    expect(JSON.stringify(err.error)).toContain('reduce your request rate');
  });
});

describe("OpenAI's spent-credit 429 with a code finer than its type", () => {
  const spent = { error: { message: 'Your credit balance is exhausted. Add credits to continue.', type: 'insufficient_quota', param: null, code: 'credit_balance_exhausted' } };

  it('is read by its type: the account, not a rate', () => {
    expect(errorCodeOf(429, Buffer.from(JSON.stringify(spent)))).toBe('insufficient_quota');
    expect(errorCodeOf(429, Buffer.from(JSON.stringify({ error: { ...spent.error, code: 'insufficient_quota' } })))).toBe('insufficient_quota');
    // A rate limit's own type stays a rate limit.
    expect(errorCodeOf(429, Buffer.from(JSON.stringify({ error: { ...spent.error, type: 'rate_limit_error', code: 'slow_down' } })))).toBe('slow_down');
  });

  it('is the gateway\'s own billing: tried once, 502 upstream_auth_error, the target held (the next request sends nothing)', async () => {
    const g = await gw({ a: () => json(429, spent, { 'retry-after': '1' }) }, [{ provider: 'a' }], { route: { retry: { maxAttempts: 3 } } });
    const err = await sdkError(g.client.chat.completions.create(ask));
    expect(err.status).toBe(502);
    expect((err.error as { code?: string }).code).toBe('upstream_auth_error');
    expect(err.headers?.get('x-should-retry')).toBe('false');
    expect(g.seen.a).toHaveLength(1);
    await sdkError(g.client.chat.completions.create(ask));
    expect(g.seen.a).toHaveLength(1);
  });
});
