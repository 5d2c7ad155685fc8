// README claims checked by running them (audit 45: quick start, requests and headers, retries, wait hints, deadlines,
// streaming, failover, breaker, parking, hold-offs, pools), pinned here where no other test held them end to end, and
// the one the README had wrong: x-stormgate-target cuts a long model name at 128 characters (with `…`), not at 256.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { describe, expect, it, vi } from 'vitest';
import { RETRY_LOOP_ONLY, TEST_KEY, defaultConfig, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';

const startStack = useStacks();
const startMock = useExtraMocks();

const CHAT = { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] };

function chat(s: Stack, headers: Record<string, string> = {}, body: unknown = CHAT): Promise<Response> {
  return fetch(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
}

/** The request line of the request with this id, once written. */
async function lineOf(s: Stack, id: string | null): Promise<Record<string, unknown>> {
  let line: Record<string, unknown> | undefined;
  await vi.waitFor(() => {
    line = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.reqId === id);
    expect(line).toBeDefined();
  }, { timeout: 5_000, interval: 20 });
  return line!;
}

describe('x-stormgate-target', () => {
  it('percent-encodes a model name beyond visible ASCII and cuts one past 128 characters there, with …', async () => {
    const s = await startStack(RETRY_LOOP_ONLY);
    const model = `gpt-é${'m'.repeat(300)}`;
    const res = await chat(s, {}, { ...CHAT, model });
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    const shown = `${model.slice(0, 128)}…`;
    expect(res.headers.get('x-stormgate-target')).toBe(`mock/${encodeURIComponent(shown).replaceAll('%2F', '/')}`);
  });
});

describe('the headers of a managed request', () => {
  it('sends upstream the provider key, via and x-client-request-id, and of the client only what the README lists', async () => {
    const s = await startStack(RETRY_LOOP_ONLY);
    const traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
    const res = await chat(s, {
      authorization: 'Bearer client-secret-a45',
      cookie: 'session=a45',
      'openai-organization': 'org-client',
      'x-stainless-timeout': '30',
      'x-stainless-read-timeout': '30',
      'x-stainless-os': 'Linux',
      'openai-beta': 'assistants=v2',
      traceparent,
      'x-custom': 'dropped',
    });
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    const sent = s.mock.requests().at(-1)!.headers;
    expect(sent.authorization).toBe(`Bearer ${TEST_KEY}`);
    expect(sent['x-client-request-id']).toBe(res.headers.get('x-stormgate-request-id'));
    expect(sent.via).toMatch(/^1\.1 stormgate-/);
    expect(sent['x-stainless-os']).toBe('Linux');
    expect(sent['openai-beta']).toBe('assistants=v2');
    expect(sent.traceparent).toBe(traceparent);
    for (const dropped of ['cookie', 'openai-organization', 'x-stainless-timeout', 'x-stainless-read-timeout', 'x-custom']) expect(sent[dropped], dropped).toBeUndefined();
  });

  it("passes back the provider's x-request-id and openai-processing-ms, not its x-ratelimit-* headers", async () => {
    const s = await startStack(RETRY_LOOP_ONLY);
    const res = await chat(s);
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    expect(res.headers.get('x-request-id')).toMatch(/^req_/);
    expect(res.headers.get('openai-processing-ms')).not.toBeNull();
    // The mock sends its quota headers on every answer.
    expect(s.mock.requests()).toHaveLength(1);
    expect([...res.headers.keys()].filter((h) => h.startsWith('x-ratelimit-'))).toEqual([]);
  });
});

describe("the SDKs' timeouts as the request's deadline", () => {
  it("reads openai's per-request timeout in whole seconds (1500 as 1 s), not its client-wide one; Anthropic's client-wide one too", async () => {
    const s = await startStack(RETRY_LOOP_ONLY);
    const openai = new OpenAI({ baseURL: s.baseURL, apiKey: 'unused', timeout: 3_000 });
    const clientWide = await openai.chat.completions.create(CHAT as never).withResponse();
    expect((await lineOf(s, clientWide.response.headers.get('x-stormgate-request-id'))).deadlineSource).toBe('route');
    const perRequest = await openai.chat.completions.create(CHAT as never, { timeout: 1_500 }).withResponse();
    const line = await lineOf(s, perRequest.response.headers.get('x-stormgate-request-id'));
    expect(line).toMatchObject({ deadlineSource: 'x-stainless-timeout', budgetMs: 750 });

    const s2 = await startStack({
      config: (mockUrl) => ({
        ...defaultConfig(mockUrl, RETRY_LOOP_ONLY),
        providers: { claude: { family: 'anthropic', baseUrl: mockUrl, apiKey: TEST_KEY, breaker: false } },
        routes: [{ name: 'messages', match: { path: '/v1/messages' }, targets: [{ provider: 'claude' }], park: false }],
      }),
    });
    const anthropic = new Anthropic({ baseURL: s2.url, apiKey: 'unused', timeout: 4_000 });
    const message = await anthropic.messages.create({ model: 'claude-sonnet-4-6', max_tokens: 20, messages: [{ role: 'user', content: 'hi' }] }).withResponse();
    expect(await lineOf(s2, message.response.headers.get('x-stormgate-request-id'))).toMatchObject({ deadlineSource: 'x-stainless-timeout', budgetMs: 3_750 });
  });
});

describe('a first-token timeout', () => {
  it('moves on from a target another can answer after one attempt, is retried on the last, and the 504 counts both', async () => {
    const backup = await startMock({ faults: { stream: { firstTokenDelayMs: 3_000 } } });
    const s = await startStack({
      faults: { stream: { firstTokenDelayMs: 3_000 } },
      config: (mockUrl) => {
        const base = defaultConfig(mockUrl, RETRY_LOOP_ONLY);
        const timeouts = { firstTokenMs: 300 };
        return {
          ...base,
          providers: {
            mock: { ...base.providers.mock!, timeouts },
            backup: { family: 'openai', baseUrl: `${backup.url}/v1`, apiKey: TEST_KEY, breaker: false, timeouts },
          },
          routes: [{
            name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'mock' }, { provider: 'backup' }], ...RETRY_LOOP_ONLY.route,
            retry: { maxAttempts: 3, backoff: { strategy: 'fixed', baseMs: 10, capMs: 10 } },
          }],
        };
      },
    });
    const res = await chat(s, {}, { ...CHAT, stream: true });
    expect(res.status).toBe(504);
    expect(res.headers.get('x-should-retry')).toBe('false');
    expect(res.headers.get('x-stormgate-attempts')).toBe('4');
    const body = (await res.json()) as { error: { code: string; message: string } };
    expect(body.error.code).toBe('upstream_timeout');
    expect(body.error.message).toBe('upstream backup/gpt-4o timed out after 3 attempts (last: first token timeout); 4 attempts in all: mock/gpt-4o 1, backup/gpt-4o 3');
    expect(s.mock.stats().total).toBe(1);
    expect(backup.stats().total).toBe(3);
  });
});

describe('a 503 whose retry-after is past maxWaitHintMs', () => {
  it('invites the request that got it back, and holds the target off: the next one gets 429 provider_held_off without an attempt', async () => {
    const s = await startStack({ ...RETRY_LOOP_ONLY, faults: { errors: [{ status: 503, headers: { 'retry-after': '30' } }] } });
    const first = await chat(s);
    expect(first.status).toBe(503);
    expect(first.headers.get('x-should-retry')).toBe('true');
    expect(Number(first.headers.get('retry-after'))).toBeGreaterThanOrEqual(30);
    await first.arrayBuffer();
    const next = await chat(s);
    expect(next.status).toBe(429);
    expect(next.headers.get('x-should-retry')).toBe('true');
    expect(next.headers.get('x-stormgate-attempts')).toBe('0');
    expect(((await next.json()) as { error: { code: string } }).error.code).toBe('provider_held_off');
    expect(s.mock.stats().total).toBe(1);
  });
});
