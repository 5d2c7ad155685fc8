// Review of how the gateway addresses, authenticates and reads the OpenAI-compatible families other than OpenAI and
// Anthropic themselves: Azure OpenAI (deployments, api-version, api-key) and compatible servers behind a path prefix.
import { describe, expect, it } from 'vitest';
import { FAST, useScriptedUpstreams } from './helpers/scripted-upstreams.ts';
import { chatCompletion } from './helpers/fake-provider.ts';

const start = useScriptedUpstreams();
const ok = () => ({ status: 200, headers: { 'content-type': 'application/json' }, steps: [chatCompletion('hi')] });
const json = (status: number, body: unknown, headers: Record<string, string> = {}) => ({ status, headers: { 'content-type': 'application/json', ...headers }, steps: [JSON.stringify(body)] });

describe('families on the wire (review 2026-12-06)', () => {
  it('azure: the provider api-version replaces the client one, once, and other query parameters survive', async () => {
    const g = await start({ az: { answer: ok, family: 'azure-openai' } }, [{ provider: 'az', model: 'dep-1' }]);
    const res = await fetch(`${g.s.baseURL}/chat/completions?api-version=2020-01-01&foo=bar`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: 'Bearer sk-client-secret', 'api-key': 'client-api-key' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x' }] }),
    });
    expect(res.status).toBe(200);
    const seen = g.seen.az![0]!;
    const url = new URL(seen.url, 'http://x');
    expect(url.pathname).toBe('/openai/deployments/dep-1/chat/completions');
    expect(url.searchParams.getAll('api-version')).toEqual(['2024-10-21']);
    expect(url.searchParams.get('foo')).toBe('bar');
    // Azure's own header with the provider's key; nothing of the client's credentials.
    expect(seen.headers['api-key']).toBe('az-key-0123456789');
    expect(seen.headers.authorization).toBeUndefined();
    expect(Object.values(seen.headers).join(' ')).not.toMatch(/sk-client-secret|client-api-key/);
  });

  it('openai-compatible behind a prefix with a trailing slash: one slash, no doubled /v1, the client key not sent', async () => {
    const g = await start({ up: { answer: ok, path: '/openai/v1/' } }, [{ provider: 'up' }]);
    await g.client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'x' }] });
    const seen = g.seen.up![0]!;
    expect(seen.url).toBe('/openai/v1/chat/completions');
    expect(seen.headers.authorization).toBe('Bearer up-key-0123456789');
  });

  it("azure: a content-filter 400 is the provider's safety decision, passed on and never failed over", async () => {
    const filtered = { error: { message: "The response was filtered due to the prompt triggering Azure OpenAI's content management policy.", type: null, param: 'prompt', code: 'content_filter', status: 400, innererror: { code: 'ResponsibleAIPolicyViolation' } } };
    const g = await start({ az: { answer: () => json(400, filtered), family: 'azure-openai' }, backup: ok }, [{ provider: 'az', model: 'dep-1' }, { provider: 'backup', model: 'm' }]);
    const err = await g.client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x' }] }).catch((e: unknown) => e);
    expect((err as { status?: number }).status).toBe(400);
    expect((err as { code?: string }).code).toBe('content_filter');
    expect(g.seen.backup).toHaveLength(0);
  });

  it("azure: a 429's retry-after-ms is waited, not retry-after's whole second", async () => {
    const limited = { error: { code: '429', message: 'Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 5 seconds.' } };
    const g = await start(
      { az: { answer: (_b, n) => (n === 1 ? json(429, limited, { 'retry-after': '5', 'retry-after-ms': '120' }) : ok()), family: 'azure-openai' } },
      [{ provider: 'az', model: 'dep-1' }],
      { route: { retry: { ...FAST.retry, maxAttempts: 2 } } },
    );
    const t0 = Date.now();
    const r = await g.client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x' }] });
    expect(r.choices[0]!.message.content).toBe('hi');
    expect(g.seen.az).toHaveLength(2);
    expect(Date.now() - t0).toBeLessThan(4_000);
  });

  it("xAI: its 400 for a prompt past the window (\"maximum prompt length is N\") goes to contextWindowFallback", async () => {
    // xAI's body: a status-like `code` and the message as `error`, a string.
    const tooLong = { code: 'Client specified an invalid argument', error: "This model's maximum prompt length is 131072 but the request contains 136973 tokens." };
    const g = await start({ xai: () => json(400, tooLong), big: ok }, [{ provider: 'xai', model: 'grok-3' }], { route: { contextWindowFallback: { provider: 'big', model: 'big-1' } } });
    const r = await g.client.chat.completions.create({ model: 'grok-3', messages: [{ role: 'user', content: 'x' }] });
    expect(r.choices[0]!.message.content).toBe('hi');
    expect(g.seen.big).toHaveLength(1);
  });

  it('xAI: a 400 that only quotes those words after others stays the client error', async () => {
    const quoted = { code: 'Client specified an invalid argument', error: "Invalid value for stop: This model's maximum prompt length is 131072 but the request contains 136973 tokens." };
    const g = await start({ xai: () => json(400, quoted), big: ok }, [{ provider: 'xai', model: 'grok-3' }], { route: { contextWindowFallback: { provider: 'big', model: 'big-1' } } });
    const err = await g.client.chat.completions.create({ model: 'grok-3', messages: [{ role: 'user', content: 'x' }] }).catch((e: unknown) => e);
    expect((err as { status?: number }).status).toBe(400);
    expect(g.seen.big).toHaveLength(0);
  });
});
