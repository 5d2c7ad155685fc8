// reasoning_effort on a chat completion translated for an Anthropic target: extended thinking where the target takes
// it, and no thinking (never a 400) where Anthropic would refuse it. The mapping as a pure function, the bundled
// mock's refusals of what real Anthropic refuses, and a failover end to end with the openai SDK.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { ConfigSchema } from '../src/config/schema.ts';
import { checkMessagesRequest } from '../src/mock/anthropic-strict.ts';
import { thinkingForm, type OpenAIChatRequest } from '../src/providers/anthropic/index.ts';
import { defaultConfig, RETRY_LOOP_ONLY, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';
import { accepted, ask, budgets, translate } from './helpers/thinking-translate.ts';

const weather = { type: 'function' as const, function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } };


describe('reasoning_effort -> thinking (toAnthropicRequest)', () => {
  it.each([
    ['low', 1024],
    ['medium', 4096],
    ['high', 16384],
    ['xhigh', 24576],
  ] as const)('effort %s asks for the configured budget, and adds it to defaultMaxTokens when the client set no max_tokens', (effort, budget) => {
    const body = translate({ reasoning_effort: effort });
    expect(body.thinking).toEqual({ type: 'enabled', budget_tokens: budget });
    expect(body.max_tokens).toBe(4096 + budget);
    accepted(body);
  });

  it('keeps the client\'s max_tokens, and gives thinking at most half of it', () => {
    const body = translate({ reasoning_effort: 'high', max_completion_tokens: 10000 });
    expect(body).toMatchObject({ max_tokens: 10000, thinking: { type: 'enabled', budget_tokens: 5000 } });
    accepted(body);
    expect(translate({ reasoning_effort: 'low', max_tokens: 30000 }).thinking).toEqual({ type: 'enabled', budget_tokens: 1024 });
  });

  it('asks for no thinking when half the client\'s max_tokens is under Anthropic\'s 1024 minimum', () => {
    const body = translate({ reasoning_effort: 'high', max_tokens: 2000 });
    expect(body.thinking).toBeUndefined();
    expect(body.max_tokens).toBe(2000);
  });

  it.each([['none'], ['minimal'], ['extreme'], [undefined], [null]])('asks for no thinking for reasoning_effort %s', (effort) => {
    const body = translate({ reasoning_effort: effort as string | null | undefined });
    expect(body.thinking).toBeUndefined();
    expect(body.max_tokens).toBe(4096);
  });

  it('ignores reasoning_effort with thinking: false, as before', () => {
    expect(translate({ reasoning_effort: 'high' }, { thinking: false })).not.toHaveProperty('thinking');
  });

  it.each<[string, Partial<OpenAIChatRequest>]>([
    ['tool_choice required (forced tool use)', { tools: [weather], tool_choice: 'required' }],
    ['a named tool_choice', { tools: [weather], tool_choice: { type: 'function', function: { name: 'get_weather' } } }],
    ['allowed_tools in required mode', { tools: [weather], tool_choice: { type: 'allowed_tools', allowed_tools: { mode: 'required', tools: [{ type: 'function', function: { name: 'get_weather' } }] } } }],
    ['a prefill (an assistant message last)', { messages: [...ask, { role: 'assistant', content: 'Suppose there are finitely many' }] }],
    [
      'tool results last (the next step of an agent loop: its tool calls carry no thinking block)',
      {
        tools: [weather],
        messages: [
          { role: 'user', content: 'Weather in Paris?' },
          { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
          { role: 'tool', tool_call_id: 'call_1', content: '18C, cloudy' },
        ],
      },
    ],
  ])('sends no thinking, and the request still goes, with %s', (_name, extra) => {
    const body = translate({ reasoning_effort: 'high', ...extra });
    expect(body.thinking).toBeUndefined();
    expect(body.max_tokens).toBe(4096);
    accepted(body);
    // What the mapping avoids: the same request with thinking is a 400 at Anthropic.
    expect(() => checkMessagesRequest({ ...body, thinking: { type: 'enabled', budget_tokens: 1024 }, max_tokens: 5120 } as never)).toThrow();
  });

  it('thinks with tool_choice auto, and on a new question after a finished tool loop', () => {
    const loop = translate({
      reasoning_effort: 'medium',
      tools: [weather],
      tool_choice: 'auto',
      messages: [
        { role: 'user', content: 'Weather in Paris?' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{}' } }] },
        { role: 'tool', tool_call_id: 'call_1', content: '18C' },
        { role: 'assistant', content: 'It is 18C.' },
        { role: 'user', content: 'And tomorrow?' },
      ],
    });
    expect(loop.thinking).toEqual({ type: 'enabled', budget_tokens: 4096 });
    accepted(loop);
  });

  it('with sampling: forward, thinks only at temperature 1 / top_p of at least 0.95', () => {
    expect(translate({ reasoning_effort: 'high', temperature: 0.2 }, { sampling: 'forward' }).thinking).toBeUndefined();
    expect(translate({ reasoning_effort: 'high', top_p: 0.5 }, { sampling: 'forward' }).thinking).toBeUndefined();
    const at1 = translate({ reasoning_effort: 'high', temperature: 1 }, { sampling: 'forward' });
    expect(at1.thinking).toBeDefined();
    accepted(at1);
    // Dropped (the default), temperature cannot clash.
    expect(translate({ reasoning_effort: 'high', temperature: 0.2 }).thinking).toBeDefined();
  });

  it('asks Claude 4.7 and later for adaptive thinking at the effort, its text displayed, beside a response format', () => {
    const body = translate(
      { reasoning_effort: 'medium', response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: {}, additionalProperties: false } } } },
      { model: 'claude-opus-4-7' },
    );
    expect(body.thinking).toEqual({ type: 'adaptive', display: 'summarized' });
    expect(body.output_config).toMatchObject({ effort: 'medium', format: { type: 'json_schema' } });
    expect(body.max_tokens).toBe(4096 + 4096);
    accepted(body);
    expect(translate({ reasoning_effort: 'xhigh' }, { model: 'claude-sonnet-5' }).output_config).toEqual({ effort: 'high' });
  });

  it.each([
    ['claude-3-7-sonnet-20250219', 'budget'],
    ['claude-sonnet-4-20250514', 'budget'],
    ['claude-opus-4-1-20250805', 'budget'],
    ['us.anthropic.claude-sonnet-4-5-20250929-v1:0', 'budget'],
    ['claude-haiku-4-5', 'budget'],
    ['claude-opus-4-6', 'budget'],
    ['claude-opus-4-7', 'adaptive'],
    ['claude-opus-5', 'adaptive'],
    ['claude-3-5-sonnet-20241022', undefined],
    ['claude-3-opus-20240229', undefined],
    ['claude-2.1', undefined],
    ['my-claude-alias', undefined],
    ['claude-mythos-preview', undefined],
  ])('reads %s as taking thinking in the %s form', (model, form) => {
    expect(thinkingForm(model)).toBe(form);
    const body = translate({ reasoning_effort: 'low' }, { model });
    expect(body.thinking?.type).toBe(form === undefined ? undefined : form === 'budget' ? 'enabled' : 'adaptive');
    accepted(body);
  });
});

describe('the mock refuses thinking as Anthropic does', () => {
  const base = { model: 'claude-sonnet-4-5', max_tokens: 4096, messages: [{ role: 'user', content: 'hi' }] };
  it.each<[string, Record<string, unknown>, RegExp]>([
    ['a budget under 1024', { thinking: { type: 'enabled', budget_tokens: 512 } }, /greater than or equal to 1024/],
    ['a budget not under max_tokens', { thinking: { type: 'enabled', budget_tokens: 4096 } }, /max_tokens` must be greater/],
    ['a temperature', { thinking: { type: 'enabled', budget_tokens: 1024 }, temperature: 0.5 }, /temperature/],
    ['forced tool use', { thinking: { type: 'enabled', budget_tokens: 1024 }, tools: [{ name: 't', input_schema: { type: 'object' } }], tool_choice: { type: 'any' } }, /forces tool use/],
    ['a prefill', { thinking: { type: 'enabled', budget_tokens: 1024 }, messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: 'Well' }] }, /must start with a thinking block/],
    ['a model before 3.7', { model: 'claude-3-5-sonnet-20241022', thinking: { type: 'enabled', budget_tokens: 1024 } }, /does not support thinking/],
    ['the budget form on 4.7', { model: 'claude-opus-4-7', thinking: { type: 'enabled', budget_tokens: 1024 } }, /adaptive/],
  ])('refuses %s', (_name, extra, message) => {
    expect(() => checkMessagesRequest({ ...base, ...extra })).toThrow(message);
  });
});

describe('failover from an OpenAI reasoning model to Claude', () => {
  const startStack = useStacks();
  const startBackup = useExtraMocks();

  async function stack(thinking?: false): Promise<Stack> {
    const backup = await startBackup({ quiet: true, apiKey: 'backup-key' });
    return startStack({
      faults: { errors: [{ status: 503 }] },
      config: (url) => {
        const base = defaultConfig(url, { provider: RETRY_LOOP_ONLY.provider, route: { ...RETRY_LOOP_ONLY.route, retry: { maxAttempts: 1 } } });
        const claude = { family: 'anthropic' as const, baseUrl: backup.url, apiKey: 'backup-key', breaker: false as const, ...(thinking === false && { thinking }) };
        return {
          ...base,
          providers: { ...base.providers, claude },
          routes: base.routes.map((r) => (r.match.path === '/v1/chat/completions' ? { ...r, targets: [{ provider: 'mock' }, { provider: 'claude', model: 'claude-sonnet-4-5' }] } : r)),
        };
      },
    });
  }
  const sdk = (s: Stack) => new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });

  it('sends reasoning_effort high as the configured budget, and the thinking comes back as reasoning_content', async () => {
    const s = await stack();
    const { data, response } = await sdk(s).chat.completions.create({ model: 'o3', messages: ask, reasoning_effort: 'high' }).withResponse();
    expect(response.headers.get('x-stormgate-target')).toBe('claude/claude-sonnet-4-5');
    const message = data.choices[0]!.message as typeof data.choices[0]['message'] & { reasoning_content?: string };
    expect(message.reasoning_content).toBe('Thinking it over (budget_tokens 16384).');
    expect(message.content).toBeTruthy();
  });

  it('streams the thinking as reasoning_content deltas before the answer', async () => {
    const s = await stack();
    const stream = await sdk(s).chat.completions.create({ model: 'o3', messages: ask, reasoning_effort: 'high', stream: true });
    let reasoning = '';
    let content = '';
    for await (const chunk of stream) {
      const delta = chunk.choices[0]?.delta as { content?: string | null; reasoning_content?: string } | undefined;
      if (delta?.reasoning_content) {
        expect(content).toBe(''); // thinking first
        reasoning += delta.reasoning_content;
      }
      content += delta?.content ?? '';
    }
    expect(reasoning).toBe('Thinking it over (budget_tokens 16384).');
    expect(content).not.toBe('');
  });

  it('answers a forced tool call without thinking, not with a 400', async () => {
    const s = await stack();
    const data = await sdk(s).chat.completions.create({ model: 'o3', messages: ask, reasoning_effort: 'high', tools: [weather], tool_choice: 'required' });
    const message = data.choices[0]!.message as typeof data.choices[0]['message'] & { reasoning_content?: string };
    expect(message.tool_calls?.[0]).toMatchObject({ function: { name: 'get_weather' } });
    expect(message.reasoning_content).toBeUndefined();
  });

  it('with thinking: false, ignores reasoning_effort as before', async () => {
    const s = await stack(false);
    const data = await sdk(s).chat.completions.create({ model: 'o3', messages: ask, reasoning_effort: 'high' });
    expect((data.choices[0]!.message as { reasoning_content?: string }).reasoning_content).toBeUndefined();
  });
});

describe('config', () => {
  it('defaults to the budgets, and refuses one under Anthropic\'s minimum', () => {
    const providers = (p: object) => ({ providers: { c: { family: 'anthropic', baseUrl: 'https://api.anthropic.com', apiKey: 'k', ...p } }, routes: [{ name: 'r', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'c', model: 'claude-sonnet-4-5' }] }] });
    expect(ConfigSchema.parse(providers({})).providers['c']!.thinking).toEqual(budgets);
    expect(ConfigSchema.parse(providers({ thinking: { high: 32000 } })).providers['c']!.thinking).toEqual({ ...budgets, high: 32000 });
    expect(ConfigSchema.safeParse(providers({ thinking: { low: 512 } })).success).toBe(false);
  });
});
