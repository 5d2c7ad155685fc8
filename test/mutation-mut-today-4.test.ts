// Mutation testing of Groq's 498 hold-offs, Google's location refusal, passthrough 403 content refusals and
// reasoning_effort -> Anthropic thinking: each test here kills a mutant the other suites let live (a condition
// dropped, a bound moved, a header kept), and the model ids Anthropic, Bedrock and Vertex really use are read for the
// thinking form they take. Pure functions unit-level; the passthrough through a real gateway with the openai SDK.
import type { RequestListener } from 'node:http';
import { gzipSync } from 'node:zlib';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { classify } from '../src/policy/outcome.ts';
import { message, messageStream } from '../src/mock/anthropic-responses.ts';
import { checkMessagesRequest } from '../src/mock/anthropic-strict.ts';
import type { AnswerContext } from '../src/mock/openai-responses.ts';
import type { StreamPlan } from '../src/mock/sse.ts';
import { thinkingForm, type OpenAIChatRequest } from '../src/providers/anthropic/index.ts';
import { httpOutcome } from '../src/providers/error-outcome.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { expectOpenAIError, sdkError } from './helpers/openai-error.ts';
import { json, scripted, type Script } from './helpers/scripted-provider.ts';
import { useStacks } from './helpers/stack.ts';
import { accepted, translate } from './helpers/thinking-translate.ts';

const startStack = useStacks();
const startProvider = useFakeProviders();

// ---------------------------------------------------------------------------------------------------------------
const LOCATION = 'User location is not supported for the API use.';
const FREE_TIER = 'Gemini API free tier is not available in your country. Please enable billing on your project in Google AI Studio.';
const google = (message: string, status = 'FAILED_PRECONDITION') => Buffer.from(JSON.stringify([{ error: { code: 400, message, status } }]));
const outcome = (status: number, body: Buffer) => httpOutcome(status, {}, body, 0);
const REGION = { kind: 'http', status: 403, errorCode: 'unsupported_country_region_territory', hint: undefined };

describe("Google's location refusal (httpOutcome)", () => {
  it("reads the free tier's country refusal as the gateway's location, like the user-location one", () => {
    expect(outcome(400, google(LOCATION))).toEqual(REGION);
    expect(outcome(400, google(FREE_TIER))).toEqual(REGION);
  });

  it('reads the message after leading white space, as Google could pad it', () => {
    expect(outcome(400, google(`\n  ${LOCATION}`))).toEqual(REGION);
  });

  it('keeps a 400 whose message only quotes the refusal after other words (the client\'s request)', () => {
    expect(outcome(400, google(`Your prompt said: "${LOCATION}"`))).toMatchObject({ status: 400 });
  });

  it('needs FAILED_PRECONDITION: the same words under INVALID_ARGUMENT stay the 400 they are', () => {
    expect(outcome(400, google(LOCATION, 'INVALID_ARGUMENT'))).toMatchObject({ status: 400 });
  });

  it('reads only a 400 so: another status with the same body keeps its own meaning', () => {
    expect(outcome(503, google(LOCATION))).toMatchObject({ status: 503 });
    expect(classify(outcome(503, google(LOCATION))).cls).toBe('server-error');
  });
});

describe('the region row of the outcome table', () => {
  it('names the deployment only on a 403: a 401 with the region code is still the key', () => {
    expect(classify({ kind: 'http', status: 403, errorCode: 'unsupported_country_region_territory', hint: undefined }).reason).toBe('unsupported_country_region_territory');
    expect(classify({ kind: 'http', status: 401, errorCode: 'unsupported_country_region_territory', hint: undefined })).toMatchObject({ cls: 'credentials', reason: 'status_401' });
  });
});

// ---------------------------------------------------------------------------------------------------------------
const MODERATION = {
  error: {
    code: 403,
    message: 'openai/gpt-4o requires moderation on OpenAI. Your input was flagged for "violence/graphic". No credits were charged.',
    metadata: { reasons: ['violence/graphic'], flagged_input: 'describe the crash scene in...' },
  },
};
const KEY = 'images-key-0123456789';

/** A gateway whose passthrough forwards `paths` (POST and GET) to a provider playing `answer`. */
async function passthrough(answer: (() => Script) | RequestListener, paths = ['/v1/images/generations']) {
  const p = await startProvider(answer.length === 0 ? scripted(answer as () => Script) : (answer as RequestListener));
  const s = await startStack({
    config: () => ({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: { images: { family: 'openai', baseUrl: `${p.origin}/v1`, apiKey: KEY, breaker: false } },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'images' }], park: false }],
      passthrough: { provider: 'images', paths, methods: ['POST', 'GET'] },
    }),
  });
  return { p, s, client: new OpenAI({ baseURL: s.baseURL, apiKey: 'sk-client-not-a-provider-key', maxRetries: 0 }) };
}
const generate = (client: OpenAI) => client.images.generate({ model: 'openai/gpt-image-1', prompt: 'a crash scene' });

describe('a passthrough 401 or 403', () => {
  it('passes on a gzip-compressed content refusal decoded, without its content-encoding', async () => {
    const { s } = await passthrough(() => ({ status: 403, headers: { 'content-type': 'application/json', 'content-encoding': 'gzip' }, steps: [gzipSync(JSON.stringify(MODERATION))] }));
    const res = await fetch(`${s.baseURL}/images/generations`, {
      method: 'POST',
      headers: { authorization: 'Bearer sk-client', 'content-type': 'application/json', 'accept-encoding': 'gzip' },
      body: JSON.stringify({ prompt: 'x' }),
    });
    expect(res.status).toBe(403);
    expect(res.headers.get('content-encoding')).toBeNull();
    const body = (await res.json()) as { error: { message: string } };
    expect(body.error.message).toContain('Your input was flagged');
  });

  it('answers a content refusal sent as text/plain as JSON, the OpenAI shape it is', async () => {
    const { s } = await passthrough(() => json(403, MODERATION, { 'content-type': 'text/plain; charset=utf-8' }));
    const res = await fetch(`${s.baseURL}/images/generations`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"prompt":"x"}' });
    expect(res.status).toBe(403);
    expect(res.headers.get('content-type')).toMatch(/^application\/json/);
    expect(((await res.json()) as { error: { message: string } }).error.message).toContain('Your input was flagged');
  });

  it('reads a content refusal that opens with a byte order mark as the refusal, not the key', async () => {
    const { client } = await passthrough(() => json(403, `\uFEFF${JSON.stringify(MODERATION)}`));
    const err = await sdkError(generate(client));
    expect(err.status).toBe(403);
    expect(err.message).toContain('Your input was flagged');
  });

  it("keeps a 401 the gateway's key whatever its body says, a moderation flag included", async () => {
    const { client } = await passthrough(() => json(401, MODERATION));
    const err = await sdkError(generate(client));
    expect(err.status).toBe(502);
    expectOpenAIError({ error: err.error }, 'upstream_auth_error', 'server_error');
  });

  it("answers a 403 whose body breaks off with the gateway's upstream_auth_error", async () => {
    const { client } = await passthrough(() => ({ status: 403, headers: { 'content-type': 'application/json' }, steps: ['{"error": {"message": "Project does not have access with key ', 20, { destroy: true }] }));
    const err = await sdkError(generate(client));
    expect(err.status).toBe(502);
    expectOpenAIError({ error: err.error }, 'upstream_auth_error', 'server_error');
    expect(err.message).not.toContain(KEY);
  });

  it("answers a HEAD's 403 (no body to read) with the gateway's upstream_auth_error, not the provider's status", async () => {
    const refuse: RequestListener = (_req, res) => res.writeHead(403, { 'content-type': 'application/json', 'content-length': '64' }).end();
    const { s } = await passthrough(refuse, ['/v1/files']);
    const res = await fetch(`${s.baseURL}/files`, { method: 'HEAD' });
    expect(res.status).toBe(502);
  });

  it('drains a refused answer it does not pass on, so the upstream connection is kept for the next call', async () => {
    const { p, client } = await passthrough(() => json(401, { error: { message: 'x'.repeat(64 * 1024), type: 'invalid_request_error', code: 'invalid_api_key' } }));
    for (let i = 0; i < 3; i++) expect((await sdkError(generate(client))).status).toBe(502);
    expect(p.hits()).toBe(3);
    expect(p.sockets).toHaveLength(1);
  });
});

// ---------------------------------------------------------------------------------------------------------------

describe('reasoning_effort -> thinking, at the edges', () => {
  it("keeps the client's max_tokens on the adaptive form too: the effort adds nothing to it", () => {
    const body = translate({ reasoning_effort: 'high', max_completion_tokens: 3000 }, { model: 'claude-opus-4-7' });
    expect(body.thinking).toEqual({ type: 'adaptive', display: 'summarized' });
    expect(body.max_tokens).toBe(3000);
    accepted(body);
  });

  it('gives the budget at most half of an odd max_tokens (rounded down)', () => {
    expect(translate({ reasoning_effort: 'high', max_tokens: 10001 }).thinking).toEqual({ type: 'enabled', budget_tokens: 5000 });
    expect(translate({ reasoning_effort: 'high', max_tokens: 2047 }).thinking).toBeUndefined();
    expect(translate({ reasoning_effort: 'high', max_tokens: 2048 }).thinking).toEqual({ type: 'enabled', budget_tokens: 1024 });
  });
});

describe("thinkingForm reads the ids Anthropic, Bedrock and Vertex use", () => {
  it.each([
    // Anthropic's API
    ['claude-3-7-sonnet-20250219', 'budget'],
    ['claude-3-7-sonnet-latest', 'budget'],
    ['claude-sonnet-4-20250514', 'budget'],
    ['claude-opus-4-0', 'budget'],
    ['claude-opus-4-1-20250805', 'budget'],
    ['claude-sonnet-4-5', 'budget'],
    ['claude-haiku-4-5-20251001', 'budget'],
    ['claude-opus-4-5-20251101', 'budget'],
    ['claude-opus-4-6', 'budget'],
    ['claude-sonnet-4-6', 'budget'],
    ['claude-opus-4-7', 'adaptive'],
    ['claude-3-5-haiku-latest', undefined],
    ['claude-3-5-sonnet-20241022', undefined],
    ['claude-3-opus-20240229', undefined],
    ['claude-3-haiku-20240307', undefined],
    ['claude-2.1', undefined],
    ['claude-instant-1.2', undefined],
    // Bedrock: model ids, cross-region inference profiles, an inference profile's ARN
    ['us.anthropic.claude-sonnet-4-5-20250929-v1:0', 'budget'],
    ['global.anthropic.claude-sonnet-4-5-20250929-v1:0', 'budget'],
    ['anthropic.claude-3-7-sonnet-20250219-v1:0', 'budget'],
    ['apac.anthropic.claude-sonnet-4-20250514-v1:0', 'budget'],
    ['anthropic.claude-haiku-4-5-20251001-v1:0', 'budget'],
    ['us.anthropic.claude-opus-4-6-v1', 'budget'],
    ['arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-7-sonnet-20250219-v1:0', 'budget'],
    ['anthropic.claude-3-5-sonnet-20241022-v2:0', undefined],
    ['anthropic.claude-v2:1', undefined],
    ['anthropic.claude-instant-v1', undefined],
    // Vertex AI
    ['claude-sonnet-4-5@20250929', 'budget'],
    ['claude-3-7-sonnet@20250219', 'budget'],
    ['claude-opus-4@20250514', 'budget'],
    ['claude-opus-4-1@20250805', 'budget'],
    ['claude-haiku-4-5@20251001', 'budget'],
    ['claude-3-5-sonnet-v2@20241022', undefined],
    ['claude-3-5-haiku@20241022', undefined],
    // Dotted versions (OpenRouter's and LiteLLM's spelling): the minor read as it is, never taken for .0
    ['anthropic/claude-3.7-sonnet', 'budget'],
    ['anthropic/claude-sonnet-4.5', 'budget'],
    ['anthropic/claude-opus-4.7', 'adaptive'],
    ['claude-opus-4.7-20260101', 'adaptive'],
    ['anthropic/claude-3.5-haiku', undefined],
  ] as const)('%s takes thinking in the %s form', (model, form) => {
    expect(thinkingForm(model)).toBe(form);
    // The translation sends the form the mock, like Anthropic, takes for that model.
    const body = translate({ reasoning_effort: 'medium' }, { model });
    expect(body.thinking?.type).toBe(form === undefined ? undefined : form === 'budget' ? 'enabled' : 'adaptive');
    accepted(body);
  });
});

describe('reasoning_effort -> thinking beside sampling (sampling: forward)', () => {
  it('thinks at top_p 0.95, the lowest Anthropic takes with thinking', () => {
    const body = translate({ reasoning_effort: 'low', top_p: 0.95 }, { sampling: 'forward' });
    expect(body).toMatchObject({ top_p: 0.95, thinking: { type: 'enabled', budget_tokens: 1024 } });
    accepted(body);
  });
});

describe('reasoning_effort -> thinking: what counts as the client\'s', () => {
  it('reads max_tokens: null and max_completion_tokens: null as no limit of the client\'s', () => {
    const body = translate({ reasoning_effort: 'high', max_tokens: null, max_completion_tokens: null } as Partial<OpenAIChatRequest>);
    expect(body).toMatchObject({ max_tokens: 4096 + 16384, thinking: { type: 'enabled', budget_tokens: 16384 } });
  });

  it('sends no thinking when tool results and a new line of the user\'s end the conversation (one user turn)', () => {
    const weather = { type: 'function' as const, function: { name: 'get_weather', parameters: { type: 'object', properties: {} } } };
    const body = translate({
      reasoning_effort: 'high',
      tools: [weather],
      messages: [
        { role: 'user', content: 'Weather in Paris?' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{}' } }] },
        { role: 'tool', tool_call_id: 'call_1', content: '18C' },
        { role: 'user', content: 'Answer in Fahrenheit.' },
      ],
    });
    expect(body.messages.at(-1)!.content.map((b) => b.type)).toEqual(['tool_result', 'text']);
    expect(body.thinking).toBeUndefined();
    accepted(body);
  });
});

describe("the mock's thinking checks, at their bounds", () => {
  const base = { model: 'claude-sonnet-4-5', max_tokens: 4096, messages: [{ role: 'user', content: 'hi' }] };
  const check = (extra: Record<string, unknown>) => () => checkMessagesRequest({ ...base, ...extra });

  it('takes thinking turned off, and a budget of exactly 1024', () => {
    expect(check({ thinking: { type: 'disabled' } })).not.toThrow();
    expect(check({ thinking: { type: 'enabled', budget_tokens: 1024 } })).not.toThrow();
    expect(check({ thinking: { type: 'enabled', budget_tokens: 1023 } })).toThrow(/greater than or equal to 1024/);
  });

  it('takes the display Claude 4.7 defaults to (omitted) and summarized, and no other', () => {
    const adaptive = (display: string) => check({ model: 'claude-opus-4-7', thinking: { type: 'adaptive', display } });
    expect(adaptive('omitted')).not.toThrow();
    expect(adaptive('summarized')).not.toThrow();
    expect(adaptive('full')).toThrow(/display/);
  });

  it('takes the adaptive form from Claude 4.6, not on 4.5', () => {
    expect(check({ model: 'claude-opus-4-6', thinking: { type: 'adaptive' } })).not.toThrow();
    expect(check({ model: 'claude-sonnet-4-5', thinking: { type: 'adaptive' } })).toThrow(/adaptive thinking is not supported/);
  });

  it('refuses an effort Anthropic does not have', () => {
    expect(check({ model: 'claude-opus-4-7', thinking: { type: 'adaptive' }, output_config: { effort: 'max' } })).not.toThrow();
    expect(check({ model: 'claude-opus-4-7', thinking: { type: 'adaptive' }, output_config: { effort: 'extreme' } })).toThrow(/output_config.effort/);
  });
});

describe("the mock's thinking checks: sampling and the last assistant turn", () => {
  const base = { model: 'claude-sonnet-4-5', max_tokens: 4096, messages: [{ role: 'user', content: 'hi' }], thinking: { type: 'enabled', budget_tokens: 1024 } };
  const check = (extra: Record<string, unknown>) => () => checkMessagesRequest({ ...base, ...extra });

  it('refuses top_p under 0.95 and any top_k, and takes top_p 0.95', () => {
    expect(check({ top_p: 0.95 })).not.toThrow();
    expect(check({ top_p: 0.9 })).toThrow(/top_p/);
    expect(check({ top_k: 5 })).toThrow(/top_k/);
  });

  it('takes a last assistant turn that opens with a thinking or a redacted_thinking block', () => {
    const prefill = (block: Record<string, unknown>) => check({ messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: [block, { type: 'text', text: 'Well' }] }] });
    expect(prefill({ type: 'thinking', thinking: 'Hm.', signature: 'sig' })).not.toThrow();
    expect(prefill({ type: 'redacted_thinking', data: 'EmwKAhgBEgy3va3pzix/LafPsn4a' })).not.toThrow();
    expect(prefill({ type: 'text', text: 'So' })).toThrow(/must start with a thinking block/);
  });
});

describe("the mock's answers with thinking", () => {
  let n = 0;
  const ctx: AnswerContext = { id: (prefix) => `${prefix}${++n}`, created: 1_700_000_000, chunks: 2 };
  const base = { model: 'claude-sonnet-4-5', max_tokens: 8192, messages: [{ role: 'user', content: 'Why is the sky blue?' }] };
  const budget = { ...base, thinking: { type: 'enabled', budget_tokens: 2048 } };
  const omitted = { ...base, model: 'claude-opus-4-7', thinking: { type: 'adaptive', display: 'omitted' } };
  type Block = { type: string; thinking?: string; signature?: string };
  type Message = { content: Block[]; usage: { output_tokens: number } };
  /** A stream plan's events, in order, as the client parses them. */
  const events = (plan: StreamPlan) =>
    [plan.head, ...plan.chunks, plan.tail, plan.done].join('').split('\n\n').filter(Boolean).map((frame) => JSON.parse(frame.split('\n').find((l) => l.startsWith('data: '))!.slice(6)) as Record<string, unknown> & { type: string; index?: number });

  it('opens a non-stream answer with the thinking block, an omitted display included (its text empty)', () => {
    expect((message(omitted, ctx) as Message).content[0]).toMatchObject({ type: 'thinking', thinking: '', signature: expect.any(String) });
    expect((message(budget, ctx) as Message).content.map((b) => b.type)).toEqual(['thinking', 'text']);
  });

  it('reads an adaptive request without an effort as high, Anthropic\'s default', () => {
    const adaptive = { ...base, model: 'claude-opus-4-7', thinking: { type: 'adaptive' } };
    expect((message(adaptive, ctx) as Message).content[0]!.thinking).toBe('Thinking it over (adaptive, effort high).');
  });

  it('counts the thinking in output_tokens', () => {
    const without = (message(base, ctx) as Message).usage.output_tokens;
    expect((message(budget, ctx) as Message).usage.output_tokens).toBeGreaterThan(without);
  });

  it('streams the thinking as block 0 (text, then signature) and numbers the answer\'s blocks on from 1', () => {
    const ev = events(messageStream(budget, ctx));
    const at = (type: string) => ev.filter((e) => e.type === type).map((e) => e.index);
    expect(at('content_block_start')).toEqual([0, 1]);
    expect(at('content_block_stop')).toEqual([0, 1]);
    const deltas = ev.filter((e) => e.type === 'content_block_delta' && e.index === 0).map((e) => (e['delta'] as { type: string }).type);
    expect(deltas).toEqual(['thinking_delta', 'signature_delta']);
  });

  it('streams an omitted thinking block with its signature and no thinking_delta', () => {
    const ev = events(messageStream(omitted, ctx));
    const deltas = ev.filter((e) => e.type === 'content_block_delta' && e.index === 0).map((e) => (e['delta'] as { type: string }).type);
    expect(deltas).toEqual(['signature_delta']);
  });

  it('numbers parallel tool calls after the thinking block: 1, 2, each closed once', () => {
    const tools = [{ name: 'a', input_schema: { type: 'object' } }, { name: 'b', input_schema: { type: 'object' } }];
    const ev = events(messageStream({ ...budget, tools, tool_choice: { type: 'auto' } }, ctx));
    expect(ev.filter((e) => e.type === 'content_block_start').map((e) => e.index)).toEqual([0, 1, 2]);
    expect(ev.filter((e) => e.type === 'content_block_stop').map((e) => e.index)).toEqual([0, 1, 2]);
  });
});
