// An SRE's check of the metrics against ground truth: what the provider (the bundled mock) saw and what the client got.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { metricSum, requestLine, TEST_KEY, useStacks } from './helpers/stack.ts';

const stack = useStacks();

/** A chat route served by an Anthropic target: the OpenAI <-> Anthropic translation. */
const translatedChat = (url: string) => ({
  server: { host: '127.0.0.1', port: 0, logLevel: 'info' as const },
  providers: { claude: { family: 'anthropic' as const, baseUrl: url, apiKey: TEST_KEY, breaker: false as const } },
  routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'claude', model: 'claude-sonnet-4-6' }] }],
});

describe('stormgate_tokens_total', () => {
  it('bills a translated Anthropic stream whose client did not ask for a usage chunk: Anthropic reports usage in every stream', async () => {
    const s = await stack({ config: translatedChat });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'x', maxRetries: 0 });
    // The whole answer's usage, as the client sees it: the ground truth the stream's tokens must match.
    const whole = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? '';
    expect(text.length).toBeGreaterThan(0);
    await new Promise((r) => setTimeout(r, 100));
    expect(s.mock.stats().total).toBe(2);
    // Both answers billed: the stream's usage came in its message_start and message_delta events.
    expect(await metricSum(s, 'stormgate_tokens_total{route="chat",target="claude/claude-sonnet-4-6",kind="prompt"}')).toBe(2 * whole.usage!.prompt_tokens);
    expect(await metricSum(s, 'stormgate_tokens_total{route="chat",target="claude/claude-sonnet-4-6",kind="completion"}')).toBe(2 * whole.usage!.completion_tokens);
  });

  it('bills a translated stream with include_usage once, as the usage chunk the client got says', async () => {
    const s = await stack({ config: translatedChat });
    const client = new OpenAI({ baseURL: s.baseURL, apiKey: 'x', maxRetries: 0 });
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true, stream_options: { include_usage: true } });
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const chunk of stream) usage = chunk.usage ?? usage;
    await new Promise((r) => setTimeout(r, 100));
    expect(await metricSum(s, 'stormgate_tokens_total{route="chat",target="claude/claude-sonnet-4-6",kind="prompt"}')).toBe(usage!.prompt_tokens);
    expect(await metricSum(s, 'stormgate_tokens_total{route="chat",target="claude/claude-sonnet-4-6",kind="completion"}')).toBe(usage!.completion_tokens);
  });
});

describe('stormgate_retry_budget_exhausted_total', () => {
  // A spent budget: not one retry allowed. The client's own retry (x-stainless-retry-count > 0) counts as a retry.
  const spent = { route: { budget: { ratio: 0, windowS: 10, minRetriesPerSecond: 0 }, park: false as const, retry: { maxAttempts: 3 } }, provider: { breaker: false as const } };
  const clientRetry = (s: { url: string }) =>
    fetch(`${s.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-stainless-retry-count': '1' },
      body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }),
    });

  it('counts no refused retry for a client\'s retry that was answered at once: the gateway wanted no retry', async () => {
    const s = await stack(spent);
    const res = await clientRetry(s);
    await res.arrayBuffer();
    expect(res.status).toBe(200);
    expect(s.mock.stats().total).toBe(1);
    expect(await metricSum(s, 'stormgate_retry_budget_exhausted_total{route="chat"')).toBe(0);
  });

  it('counts the retry the budget refused when the client\'s retry failed, and names the budget in the log', async () => {
    const s = await stack({ ...spent, faults: { errors: [{ status: 503, times: 1 }] } });
    const res = await clientRetry(s);
    await res.arrayBuffer();
    expect(res.status).toBe(503);
    expect(s.mock.stats().total).toBe(1);
    expect(await metricSum(s, 'stormgate_retry_budget_exhausted_total{route="chat"')).toBe(1);
    expect((await requestLine(s)).retriesStopped).toBe('budget');
  });
});
