// Agent code written for OpenAI, served by an Anthropic target: the openai SDK against the gateway over real HTTP, the
// target a scripted provider that replays the Messages API's wire formats and refuses what the real API refuses
// (with its error bodies), so a divergence that would break unchanged OpenAI code shows at the client.
import { createHash } from 'node:crypto';
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { fastRetries, useScriptedGateway, type Script } from './helpers/scripted-provider.ts';

const gw = useScriptedGateway((c, origin) => {
  fastRetries(c, origin);
  c.providers.p = { family: 'anthropic', baseUrl: origin, apiKey: 'anthropic-key', breaker: false };
  c.routes = c.routes.filter((r) => r.match.path === '/v1/chat/completions').map((r) => ({ ...r, targets: [{ provider: 'p', model: 'claude-sonnet-4-5' }] }));
});

// ---- the Messages API, as it answers ----

const aev = (type: string, data: Record<string, unknown> = {}) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
const messageStart = (usage: Record<string, unknown>) =>
  aev('message_start', { message: { id: 'msg_01', type: 'message', role: 'assistant', content: [], model: 'claude-sonnet-4-5', stop_reason: null, stop_sequence: null, usage } });
const textStream = (text: string, stop_reason = 'end_turn'): string[] => [
  messageStart({ input_tokens: 12, output_tokens: 1 }),
  aev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
  aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text } }),
  aev('content_block_stop', { index: 0 }),
  aev('message_delta', { delta: { stop_reason, stop_sequence: null }, usage: { output_tokens: 3 } }),
  aev('message_stop'),
];
const message = (content: unknown[], stop_reason = 'end_turn'): Script => ({
  headers: { 'content-type': 'application/json' },
  steps: [JSON.stringify({ id: 'msg_02', type: 'message', role: 'assistant', model: 'claude-sonnet-4-5', content, stop_reason, stop_sequence: null, usage: { input_tokens: 9, output_tokens: 4 } })],
});
/** A 400 as Anthropic sends it. */
const invalid = (msg: string): Script => ({
  status: 400,
  headers: { 'content-type': 'application/json' },
  steps: [JSON.stringify({ type: 'error', error: { type: 'invalid_request_error', message: msg }, request_id: 'req_011' })],
});

const JPEG = '/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAgGBgcGBQgHBwcJCQgKDA';
const PNG = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==';
const bytesType = (data: string) => (data.startsWith('/9j/') ? 'image/jpeg' : data.startsWith('iVBORw0KGgo') ? 'image/png' : 'unknown');

/** What the real API refuses in a request OpenAI takes, with its messages (seen in production), else undefined. */
function anthropicRefusal(body: Record<string, unknown>): Script | undefined {
  const userId = (body.metadata as { user_id?: string } | undefined)?.user_id;
  if (userId !== undefined && /@/.test(userId)) return invalid('metadata.user_id: user_id appears to contain an email address. Please send a uuid or hash value instead.');
  if (userId !== undefined && userId.length > 256) return invalid('metadata.user_id: String should have at most 256 characters');
  const messages = body.messages as Array<{ content: Array<{ type: string; id?: string; source?: { type: string; media_type?: string; data?: string } }> }>;
  const blocks = messages.flatMap((m) => m.content);
  if (blocks.some((b) => b.type === 'tool_use' || b.type === 'tool_result') && !(Array.isArray(body.tools) && body.tools.length > 0)) {
    return invalid('Requests which include `tool_use` or `tool_result` blocks must define tools.');
  }
  const toolUseIds = blocks.filter((b) => b.type === 'tool_use').map((b) => b.id);
  if (new Set(toolUseIds).size !== toolUseIds.length) return invalid('messages.3.content.0: `tool_use` ids must be unique');
  const format = (body.output_config as { format?: { schema?: unknown } } | undefined)?.format;
  const unsupported = format ? unsupportedKeyword(format.schema) : undefined;
  if (unsupported) return invalid(`output_config.format.schema: ${unsupported}`);
  for (const [i, m] of messages.entries()) {
    for (const [j, b] of m.content.entries()) {
      if (b.type === 'image' && b.source?.type === 'base64' && bytesType(b.source.data ?? '') !== b.source.media_type) {
        return invalid(`messages.${i}.content.${j}.image.source.base64.data: Image does not match the provided media type ${b.source.media_type}`);
      }
    }
  }
  return undefined;
}

/** Structured outputs take a subset of JSON Schema; the first keyword outside it, as the API words it. */
function unsupportedKeyword(schema: unknown): string | undefined {
  if (typeof schema !== 'object' || schema === null) return undefined;
  const node = schema as Record<string, unknown>;
  const type = String(node.type ?? 'any');
  for (const key of ['minimum', 'maximum', 'exclusiveMinimum', 'minLength', 'maxLength', 'pattern', 'maxItems']) {
    if (key in node) return `For '${type}' type, property '${key}' is not supported`;
  }
  if (type === 'object' && node.additionalProperties !== false) return "For 'object' type, 'additionalProperties' must be explicitly set to false";
  const children = [node.items, ...Object.values((node.properties ?? {}) as object), ...Object.values((node.$defs ?? {}) as object), ...((node.anyOf ?? []) as unknown[])];
  for (const child of children) {
    const found = unsupportedKeyword(child);
    if (found) return found;
  }
  return undefined;
}

const question = [{ role: 'user' as const, content: 'Weather in Paris?' }];
const weather: OpenAI.ChatCompletionTool = { type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } };
const clock: OpenAI.ChatCompletionTool = { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } };

describe('an OpenAI agent served by an Anthropic target', () => {
  it('sends the end user\'s id as Anthropic takes it: an email address or a long id as its SHA-256, a uuid as it is', async () => {
    const { client, seen } = await gw((body) => anthropicRefusal(body) ?? message([{ type: 'text', text: 'Sunny.' }]));
    const sha256 = (s: string) => createHash('sha256').update(s).digest('hex');
    // OpenAI takes any string as `user`; an email address there is common.
    const answer = await client.chat.completions.create({ model: 'gpt-4o', messages: question, user: 'alice@example.com' });
    expect(answer.choices[0]!.message.content).toBe('Sunny.');
    expect(seen.at(-1)!.body.metadata).toEqual({ user_id: sha256('alice@example.com') });
    const long = `tenant-7/${'x'.repeat(300)}`;
    await client.chat.completions.create({ model: 'gpt-4o', messages: question, safety_identifier: long });
    expect(seen.at(-1)!.body.metadata).toEqual({ user_id: sha256(long) });
    const uuid = '3f2b8c1e-9d4a-4e7b-8f6c-2a1d0e9b7c5a';
    await client.chat.completions.create({ model: 'gpt-4o', messages: question, safety_identifier: uuid, user: 'alice@example.com' });
    expect(seen.at(-1)!.body.metadata).toEqual({ user_id: uuid });
  });

  it('sends a data: URL image as the type its bytes are, whatever the URL says (OpenAI reads the bytes too)', async () => {
    const { client, seen } = await gw((body) => anthropicRefusal(body) ?? message([{ type: 'text', text: 'A cat and a dog.' }]));
    const answer = await client.chat.completions.create({
      model: 'gpt-4o',
      messages: [{ role: 'user', content: [
        { type: 'text', text: 'What is in these?' },
        { type: 'image_url', image_url: { url: `data:image/png;base64,${JPEG}` } }, // a type hard-coded by the client
        { type: 'image_url', image_url: { url: `data:image/jpg;base64,${PNG}` } },
        { type: 'image_url', image_url: { url: 'https://example.com/cat.webp', detail: 'low' } },
      ] }],
    });
    expect(answer.choices[0]!.message.content).toBe('A cat and a dog.');
    expect((seen[0]!.body.messages as Array<{ content: unknown[] }>)[0]!.content.slice(1)).toEqual([
      { type: 'image', source: { type: 'base64', media_type: 'image/jpeg', data: JPEG } },
      { type: 'image', source: { type: 'base64', media_type: 'image/png', data: PNG } },
      { type: 'image', source: { type: 'url', url: 'https://example.com/cat.webp' } },
    ]);
  });

  it('streams parallel tool calls in OpenAI\'s chunk shapes, which stream().finalChatCompletion() assembles, with usage', async () => {
    const steps = [
      messageStart({ input_tokens: 849, cache_creation_input_tokens: 7, cache_read_input_tokens: 100, output_tokens: 10 }),
      aev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
      aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Checking.' } }),
      aev('content_block_stop', { index: 0 }),
      aev('content_block_start', { index: 1, content_block: { type: 'tool_use', id: 'toolu_01A', name: 'get_weather', input: {} } }),
      aev('content_block_delta', { index: 1, delta: { type: 'input_json_delta', partial_json: '' } }),
      aev('ping'),
      aev('content_block_delta', { index: 1, delta: { type: 'input_json_delta', partial_json: '{"city": "Pa' } }),
      aev('content_block_delta', { index: 1, delta: { type: 'input_json_delta', partial_json: 'ris"}' } }),
      aev('content_block_stop', { index: 1 }),
      // A tool without parameters: Anthropic streams no input at all.
      aev('content_block_start', { index: 2, content_block: { type: 'tool_use', id: 'toolu_01B', name: 'get_time', input: {} } }),
      aev('content_block_delta', { index: 2, delta: { type: 'input_json_delta', partial_json: '' } }),
      aev('content_block_stop', { index: 2 }),
      aev('message_delta', { delta: { stop_reason: 'tool_use', stop_sequence: null, stop_details: null }, usage: { input_tokens: 849, cache_creation_input_tokens: 7, cache_read_input_tokens: 100, output_tokens: 47 } }),
      aev('message_stop'),
    ];
    const { client, seen } = await gw(() => ({ steps }));
    const chunks: OpenAI.ChatCompletionChunk[] = [];
    const stream = client.chat.completions.stream({ model: 'gpt-4o', messages: question, tools: [weather, clock], tool_choice: 'required', stream_options: { include_usage: true } });
    stream.on('chunk', (c) => chunks.push(c));
    const final = await stream.finalChatCompletion();
    const calls = chunks.flatMap((c) => c.choices[0]?.delta.tool_calls ?? []);
    expect(calls.filter((c) => c.id !== undefined)).toEqual([
      { index: 0, id: 'toolu_01A', type: 'function', function: { name: 'get_weather', arguments: '' } },
      { index: 1, id: 'toolu_01B', type: 'function', function: { name: 'get_time', arguments: '' } },
    ]);
    expect(calls.filter((c) => c.id === undefined).every((c) => Object.keys(c).sort().join() === 'function,index' && Object.keys(c.function!).join() === 'arguments')).toBe(true);
    expect(final.choices[0]).toMatchObject({
      finish_reason: 'tool_calls',
      message: { content: 'Checking.', tool_calls: [
        { id: 'toolu_01A', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } },
        { id: 'toolu_01B', type: 'function', function: { name: 'get_time', arguments: '{}' } },
      ] },
    });
    // The usage chunk comes last, with no choices; prompt_tokens count cache reads and writes, as OpenAI's do.
    expect(chunks.at(-1)).toMatchObject({ choices: [], usage: { prompt_tokens: 956, completion_tokens: 47, total_tokens: 1003, prompt_tokens_details: { cached_tokens: 100 } } });
    expect(seen[0]!.body).toMatchObject({ stream: true, tool_choice: { type: 'any' }, tools: [{ name: 'get_weather' }, { name: 'get_time' }] });
  });

  it('round-trips tool results and maps the request fields an agent sets; finish reasons come back in OpenAI\'s terms', async () => {
    const stops = ['end_turn', 'max_tokens', 'tool_use', 'stop_sequence', 'refusal'];
    const { client, seen } = await gw((_body, n) => message([{ type: 'text', text: 'ok' }], stops[(n - 1) % stops.length]));
    const history: OpenAI.ChatCompletionMessageParam[] = [
      { role: 'system', content: 'Be brief.' },
      ...question,
      { role: 'assistant', content: null, tool_calls: [
        { id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } },
        { id: 'call_2', type: 'function', function: { name: 'get_time', arguments: '{}' } },
      ] },
      { role: 'tool', tool_call_id: 'call_1', content: '18°C' },
      { role: 'tool', tool_call_id: 'call_2', content: '14:00' },
      { role: 'developer', content: 'Answer in French.' },
    ];
    const choices: Array<OpenAI.ChatCompletionToolChoiceOption | undefined> = ['auto', 'none', 'required', { type: 'function', function: { name: 'get_time' } }, undefined];
    const finishes: string[] = [];
    for (const tool_choice of choices) {
      const r = await client.chat.completions.create({ model: 'gpt-4o', messages: history, tools: [weather, clock], ...(tool_choice && { tool_choice }), stop: ['END'], max_completion_tokens: 300 });
      finishes.push(r.choices[0]!.finish_reason);
    }
    expect(finishes).toEqual(['stop', 'length', 'tool_calls', 'stop', 'content_filter']);
    expect(seen.map((s) => s.body.tool_choice)).toEqual([{ type: 'auto' }, { type: 'none' }, { type: 'any' }, { type: 'tool', name: 'get_time' }, undefined]);
    expect(seen[0]!.body).toMatchObject({ system: 'Be brief.\n\nAnswer in French.', stop_sequences: ['END'], max_tokens: 300 });
    expect(seen[0]!.body.messages).toEqual([
      { role: 'user', content: [{ type: 'text', text: 'Weather in Paris?' }] },
      { role: 'assistant', content: [
        { type: 'tool_use', id: 'call_1', name: 'get_weather', input: { city: 'Paris' } },
        { type: 'tool_use', id: 'call_2', name: 'get_time', input: {} },
      ] },
      // Consecutive tool messages: one user turn of tool_result blocks.
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'call_1', content: '18°C' }, { type: 'tool_result', tool_use_id: 'call_2', content: '14:00' }] },
    ]);
  });

  it('serves an agent loop whose calls a compatible server numbered per answer, and its final summary asked without tools', async () => {
    const { client, seen } = await gw((body) => anthropicRefusal(body) ?? message([{ type: 'text', text: 'Paris: 18°C at 14:00, then 19°C.' }]));
    // call_0 in every answer, as servers that number each answer's calls send; OpenAI pairs each result with the call before it.
    const round = (result: string): OpenAI.ChatCompletionMessageParam[] => [
      { role: 'assistant', content: '', tool_calls: [{ id: 'call_0', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_0', content: result },
    ];
    const history: OpenAI.ChatCompletionMessageParam[] = [...question, ...round('18°C'), ...round('19°C')];
    const next = await client.chat.completions.create({ model: 'gpt-4o', messages: history, tools: [weather] });
    expect(next.choices[0]!.message.content).toBe('Paris: 18°C at 14:00, then 19°C.');
    // The last turn of the loop: a summary of what the tools found, with no tools to call any more.
    const summary = await client.chat.completions.create({ model: 'gpt-4o', messages: [...history, { role: 'user', content: 'Sum it up.' }] });
    expect(summary.choices[0]!.message.content).toBe('Paris: 18°C at 14:00, then 19°C.');
    expect(seen[1]!.body).toMatchObject({ tools: [{ name: 'get_weather', input_schema: { type: 'object' } }], tool_choice: { type: 'none' } });
    expect((seen[1]!.body.messages as Array<{ content: Array<{ id?: string; tool_use_id?: string }> }>).slice(1).map((m) => m.content[0]!.id ?? m.content[0]!.tool_use_id))
      .toEqual(['call_0', 'call_0', 'call_0_2', 'call_0_2']);
  });

  it('parses structured output whose zod schema has bounds, which Anthropic\'s structured outputs refuse as JSON Schema keywords', async () => {
    const review = { score: 7, summary: 'Clear, two nits.', tags: ['style'] };
    const { client, seen } = await gw((body) => anthropicRefusal(body) ?? message([{ type: 'text', text: JSON.stringify(review) }]));
    const Review = z.object({ score: z.number().int().min(1).max(10), summary: z.string().max(280), tags: z.array(z.string()).max(3) });
    const answer = await client.chat.completions.parse({ model: 'gpt-4o', messages: question, response_format: zodResponseFormat(Review, 'review') });
    expect(answer.choices[0]!.message.parsed).toEqual(review);
    expect(JSON.stringify(seen[0]!.body.output_config)).toContain('{minimum: 1, maximum: 10}');
  });

  const overloaded = aev('error', { error: { type: 'overloaded_error', message: 'Overloaded' } });

  it('an overloaded_error event before the first output is retried, unseen by the client', async () => {
    const { client, seen } = await gw((_b, n) => ({ steps: n === 1 ? [messageStart({ input_tokens: 12, output_tokens: 1 }), aev('ping'), overloaded] : textStream('Hello') }));
    const whole = await client.chat.completions.stream({ model: 'gpt-4o', messages: question }).finalChatCompletion();
    expect(whole.choices[0]!.message.content).toBe('Hello');
    expect(seen).toHaveLength(2);
  });

  it('an overloaded_error event after the first output is raised by the SDK, as OpenAI\'s own error event is', async () => {
    const { client, seen } = await gw(() => ({ steps: [...textStream('Hel').slice(0, 3), overloaded] }));
    const err = (await client.chat.completions.stream({ model: 'gpt-4o', messages: question }).finalChatCompletion().catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err).toMatchObject({ code: 'overloaded', type: 'server_error', message: 'Overloaded' });
    expect(seen).toHaveLength(1);
  });
});
