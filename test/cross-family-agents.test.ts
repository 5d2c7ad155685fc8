// Agent conversations that cross API families: turns of one tool-calling conversation (the `openai` SDK's own messages
// appended as agents append them) served by an OpenAI-compatible primary and, when it fails, by an Anthropic backup,
// then by the primary again. The backup is the bundled mock held to the real Messages API's request rules
// (src/mock/anthropic-strict.ts): any 400 it gives on a translated request is a translation bug the real API would
// show exactly when the backup is needed. Also pins those rules and their error shape, and checks agent-shaped
// requests against them at the translator.
import OpenAI from 'openai';
import type { ChatCompletionMessageParam, ChatCompletionTool } from 'openai/resources/chat/completions';
import { describe, expect, it } from 'vitest';
import { checkMessagesRequest } from '../src/mock/anthropic-strict.ts';
import { MockRequestError } from '../src/mock/errors.ts';
import type { MockServer } from '../src/mock/server.ts';
import { toAnthropicRequest, type OpenAIChatRequest } from '../src/providers/anthropic/index.ts';
import { defaultConfig, RETRY_LOOP_ONLY, TEST_KEY, useExtraMocks, useStacks, type Stack } from './helpers/stack.ts';

const startStack = useStacks();
const startMock = useExtraMocks();

// A 1x1 PNG, as a data: URL an agent attaches (a screenshot tool's result, say).
const PNG = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==';

const tool = (name: string): ChatCompletionTool => ({
  type: 'function',
  function: { name, description: `the ${name} tool`, parameters: { type: 'object', properties: { path: { type: 'string' } } } },
});

/** The primary (`oai`, the stack's mock) and the strict Anthropic backup (`claude`), one attempt each: a 503 fails over. */
async function crossFamily(): Promise<{ s: Stack; claude: MockServer }> {
  const claude = await startMock({ apiKey: 'claude-key' });
  const s = await startStack({
    config: (url) => {
      const base = defaultConfig(url, RETRY_LOOP_ONLY);
      return {
        ...base,
        providers: { ...base.providers, claude: { family: 'anthropic', baseUrl: claude.url, apiKey: 'claude-key', breaker: false } },
        routes: base.routes.map((r) =>
          r.name === 'chat' ? { ...r, targets: [{ provider: 'mock' }, { provider: 'claude', model: 'claude-sonnet-4-5' }], retry: { maxAttempts: 1 } } : r,
        ),
      };
    },
  });
  return { s, claude };
}

const primaryDown = (s: Stack) => s.mock.setFaults({ errors: [{ status: 503 }] });
const primaryUp = (s: Stack) => s.mock.setFaults({});

interface Turn {
  target: string | null;
  message: OpenAI.Chat.Completions.ChatCompletionMessage;
}

/**
 * One agent step: the request, the answer's message appended to the history as the SDK gave it (content null beside
 * tool calls, refusal null), and a tool message for each call. Streamed steps put the message together from the chunks.
 */
async function step(client: OpenAI, history: ChatCompletionMessageParam[], params: Partial<OpenAI.Chat.Completions.ChatCompletionCreateParamsNonStreaming>, stream = false): Promise<Turn> {
  let turn: Turn;
  if (stream) {
    const { data, response } = await client.chat.completions.create({ model: 'gpt-4o', messages: history, ...params, stream: true }).withResponse();
    const calls: Array<{ id: string; type: 'function'; function: { name: string; arguments: string } }> = [];
    let content: string | null = null;
    for await (const chunk of data) {
      const delta = chunk.choices[0]?.delta;
      if (delta?.content) content = (content ?? '') + delta.content;
      for (const c of delta?.tool_calls ?? []) {
        calls[c.index] ??= { id: c.id ?? '', type: 'function', function: { name: c.function?.name ?? '', arguments: '' } };
        calls[c.index]!.function.arguments += c.function?.arguments ?? '';
      }
    }
    const message = { role: 'assistant', content, refusal: null, ...(calls.length > 0 && { tool_calls: calls }) } as OpenAI.Chat.Completions.ChatCompletionMessage;
    turn = { target: response.headers.get('x-stormgate-target'), message };
  } else {
    const { data, response } = await client.chat.completions.create({ model: 'gpt-4o', messages: history, ...params }).withResponse();
    turn = { target: response.headers.get('x-stormgate-target'), message: data.choices[0]!.message };
  }
  history.push(turn.message as ChatCompletionMessageParam);
  for (const call of turn.message.tool_calls ?? []) {
    if (call.type !== 'function') continue;
    history.push({ role: 'tool', tool_call_id: call.id, content: `${call.function.name} says ok` });
  }
  return turn;
}

const callNames = (t: Turn) => (t.message.tool_calls ?? []).map((c) => (c.type === 'function' ? c.function.name : c.type));
const sdk = (s: Stack) => new OpenAI({ baseURL: s.baseURL, apiKey: 'client-key', maxRetries: 0 });

describe('agent loops that fail over between an OpenAI primary and a strict Anthropic backup', () => {
  it('keeps a parallel-tool-call conversation going across families and back, streamed and whole', async () => {
    const { s, claude } = await crossFamily();
    const client = sdk(s);
    const tools = [tool('read_file'), tool('list_dir')];
    const history: ChatCompletionMessageParam[] = [
      { role: 'system', content: 'You are a coding agent.' },
      { role: 'developer', content: 'Prefer small diffs.' },
      { role: 'user', content: 'Look at the repo.' },
    ];
    const turns: Turn[] = [];
    // OpenAI calls both tools (call_ ids); Anthropic answers their results; a new question goes to Anthropic with
    // a mid-conversation system message, images and an empty assistant content; OpenAI gets the toolu_ ids back.
    turns.push(await step(client, history, { tools }));
    primaryDown(s);
    turns.push(await step(client, history, { tools, max_completion_tokens: 300, temperature: 2 }, true));
    history.push({ role: 'system', content: 'The user is in a hurry.' });
    history.push({
      role: 'user',
      content: [
        { type: 'text', text: 'And this screenshot?' },
        { type: 'image_url', image_url: { url: `data:image/png;base64,${PNG}` } },
        { type: 'image_url', image_url: { url: 'https://example.com/diagram.png' } },
      ],
    });
    turns.push(await step(client, history, { tools, tool_choice: 'required', parallel_tool_calls: false, stop: 'END' }));
    turns.push(await step(client, history, { tools, stop: ['END', 'STOP'], reasoning_effort: 'low' }, true));
    history.push({ role: 'assistant', content: '' });
    history.push({ role: 'user', content: 'Now list the directory.' });
    turns.push(await step(client, history, { tools, tool_choice: { type: 'function', function: { name: 'list_dir' } } }, true));
    primaryUp(s);
    turns.push(await step(client, history, { tools }));

    expect(turns.map((t) => t.target)).toEqual(['mock/gpt-4o', 'claude/claude-sonnet-4-5', 'claude/claude-sonnet-4-5', 'claude/claude-sonnet-4-5', 'claude/claude-sonnet-4-5', 'mock/gpt-4o']);
    expect(callNames(turns[0]!)).toEqual(['read_file', 'list_dir']);
    expect(turns[0]!.message.tool_calls![0]!.id).toMatch(/^call_/);
    expect(callNames(turns[1]!)).toEqual([]); // the answer to the tool results
    expect(callNames(turns[2]!)).toEqual(['read_file']); // required, one at a time
    expect(turns[2]!.message.tool_calls![0]!.id).toMatch(/^toolu_/);
    expect(callNames(turns[4]!)).toEqual(['list_dir']);
    expect(claude.requests().filter((r) => r.status === 400)).toEqual([]);
  });

  it("calls back a tool whose name Anthropic's pattern refuses (an MCP server's `fs.read_file`) by its own name", async () => {
    const { s, claude } = await crossFamily();
    const client = sdk(s);
    const tools = [tool('fs.read_file'), tool('github/create_issue'), tool('fs_read_file')];
    const history: ChatCompletionMessageParam[] = [{ role: 'user', content: 'Open the README and file an issue.' }];
    const turns: Turn[] = [];
    turns.push(await step(client, history, { tools })); // OpenAI-compatible primary: its names as they are
    primaryDown(s);
    turns.push(await step(client, history, { tools })); // the dotted names are in the history now
    history.push({ role: 'user', content: 'Again, please.' });
    turns.push(await step(client, history, { tools }));
    turns.push(await step(client, history, { tools }, true));
    history.push({ role: 'user', content: 'Only the issue.' });
    turns.push(await step(client, history, { tools, tool_choice: { type: 'function', function: { name: 'github/create_issue' } } }, true));
    primaryUp(s);
    turns.push(await step(client, history, { tools }));

    expect(claude.requests().filter((r) => r.status === 400)).toEqual([]);
    expect(turns.map((t) => t.target?.split('/')[0])).toEqual(['mock', 'claude', 'claude', 'claude', 'claude', 'mock']);
    expect(callNames(turns[2]!)).toEqual(['fs.read_file', 'github/create_issue', 'fs_read_file']);
    expect(callNames(turns[4]!)).toEqual(['github/create_issue']);
  });

  it('calls back a tool whose name is longer than Anthropic takes by its own name', async () => {
    const { s } = await crossFamily();
    primaryDown(s);
    const long = `mcp__${'very_long_server_name_'.repeat(6)}__search`; // 143 characters, over 128
    const { choices } = await sdk(s).chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'Search.' }], tools: [tool(long)] });
    expect(choices[0]!.message.tool_calls?.map((c) => (c.type === 'function' ? c.function.name : ''))).toEqual([long]);
  });
});

/** Agent-shaped chat requests the translator must turn into one the real API takes, or refuse; never a 400 upstream. */
const call = (id: string, name = 'read_file', args = '{}') => ({ id, type: 'function' as const, function: { name, arguments: args } });
const AGENT_REQUESTS: Array<[string, Record<string, unknown>]> = [
  [
    'parallel calls answered by several tool messages, one empty, a system message between them',
    {
      messages: [
        { role: 'user', content: 'q' },
        { role: 'assistant', content: null, tool_calls: [call('call_1'), call('toolu_01AbC', 'list_dir')] },
        { role: 'tool', tool_call_id: 'call_1', content: 'r1' },
        { role: 'system', content: 'late system' },
        { role: 'tool', tool_call_id: 'toolu_01AbC', content: '' },
      ],
      tools: [tool('read_file'), tool('list_dir')],
    },
  ],
  [
    'a tool result of whitespace-only parts',
    { messages: [{ role: 'user', content: 'q' }, { role: 'assistant', content: '\n', tool_calls: [call('c1')] }, { role: 'tool', tool_call_id: 'c1', content: [{ type: 'text', text: ' ' }] }], tools: [tool('read_file')] },
  ],
  [
    'a user message between two tool results of one turn',
    {
      messages: [
        { role: 'user', content: 'q' },
        { role: 'assistant', content: null, tool_calls: [call('c1'), call('c2')] },
        { role: 'tool', tool_call_id: 'c1', content: 'x' },
        { role: 'user', content: 'also this' },
        { role: 'tool', tool_call_id: 'c2', content: 'y' },
      ],
      tools: [tool('read_file')],
    },
  ],
  [
    'ids that repeat from turn to turn (call_0) and ids with dots and colons',
    {
      messages: [
        { role: 'user', content: 'q' },
        { role: 'assistant', content: null, tool_calls: [call('call_0'), call('functions.read_file:1')] },
        { role: 'tool', tool_call_id: 'call_0', content: 'x' },
        { role: 'tool', tool_call_id: 'functions.read_file:1', content: 'x' },
        { role: 'assistant', content: null, tool_calls: [call('call_0')] },
        { role: 'tool', tool_call_id: 'call_0', content: 'y' },
      ],
      tools: [tool('read_file')],
    },
  ],
  [
    'a tool call with an empty id, from a server that gives none',
    { messages: [{ role: 'user', content: 'q' }, { role: 'assistant', content: null, tool_calls: [call('')] }, { role: 'tool', tool_call_id: '', content: 'x' }], tools: [tool('read_file')] },
  ],
  [
    'a last turn asking for a summary without tools, after tool calls',
    { messages: [{ role: 'user', content: 'q' }, { role: 'assistant', content: null, tool_calls: [call('c1', 'fs.read')] }, { role: 'tool', tool_call_id: 'c1', content: 'x' }, { role: 'user', content: 'summarize' }] },
  ],
  [
    'dotted and slashed tool names, in tools, history and tool_choice',
    {
      messages: [{ role: 'user', content: 'q' }, { role: 'assistant', content: null, tool_calls: [call('c1', 'fs.read')] }, { role: 'tool', tool_call_id: 'c1', content: 'x' }],
      tools: [tool('fs.read'), tool('gh/issue')],
      tool_choice: { type: 'function', function: { name: 'gh/issue' } },
    },
  ],
  ['tool_choice none with parallel_tool_calls false', { messages: [{ role: 'user', content: 'q' }], tools: [tool('a')], tool_choice: 'none', parallel_tool_calls: false }],
  ['temperature 2, n 1, top_p, stop as a string', { messages: [{ role: 'user', content: 'q' }], temperature: 2, top_p: 0.5, n: 1, stop: 'END' }],
];

describe('agent-shaped requests at the translator, against the real API rules', () => {
  for (const sampling of ['drop', 'forward'] as const) {
    it.each(AGENT_REQUESTS)(`${sampling}: %s`, (_name, body) => {
      const out = toAnthropicRequest({ model: 'gpt-4o', ...body } as unknown as OpenAIChatRequest, { model: 'claude-sonnet-4-5', defaultMaxTokens: 1024, sampling });
      expect(out.ok).toBe(true);
      if (out.ok) expect(() => checkMessagesRequest(out.body as unknown as Record<string, unknown>)).not.toThrow();
    });
  }
});

describe("the mock's Anthropic endpoint refuses what the real Messages API refuses", () => {
  const user = (content: unknown) => ({ role: 'user', content });
  const use = (id: string, name = 'a') => ({ type: 'tool_use', id, name, input: {} });
  const result = (id: string) => ({ type: 'tool_result', tool_use_id: id, content: 'ok' });
  const tools = [{ name: 'a', input_schema: { type: 'object' } }];
  const cases: Array<[string, Record<string, unknown>, string]> = [
    ['an empty text block', { messages: [user([{ type: 'text', text: '' }])] }, 'messages: text content blocks must be non-empty'],
    ['a whitespace-only text block alone', { messages: [user([{ type: 'text', text: '\n' }])] }, 'messages: text content blocks must contain non-whitespace text'],
    ['a message with no content', { messages: [user('q'), { role: 'assistant', content: [] }, user('r')] }, 'messages.1: all messages must have non-empty content except for the optional final assistant message'],
    ['a tool name with a dot', { messages: [user('q')], tools: [{ name: 'fs.read', input_schema: { type: 'object' } }] }, "tools.0.custom.name: String should match pattern '^[a-zA-Z0-9_-]{1,128}$'"],
    ['a tool name over 128 characters', { messages: [user('q')], tools: [{ name: 'a'.repeat(129), input_schema: { type: 'object' } }] }, 'tools.0.custom.name: String should have at most 128 characters'],
    ['two tools of one name', { messages: [user('q')], tools: [...tools, ...tools] }, 'tools: Tool names must be unique.'],
    ['a tool_use id with a colon', { messages: [user('q'), { role: 'assistant', content: [use('functions.a:0')] }, user([result('functions.a:0')])], tools }, "messages.1.content.0.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'"],
    ['a tool_use left unanswered', { messages: [user('q'), { role: 'assistant', content: [use('t1'), use('t2')] }, user([result('t1')])], tools }, '`tool_use` ids were found without `tool_result` blocks immediately after: t2'],
    ['a tool_result after text', { messages: [user('q'), { role: 'assistant', content: [use('t1')] }, user([{ type: 'text', text: 'hi' }, result('t1')])], tools }, 'messages.2: Did not find 1 `tool_result` block(s) at the beginning of this message'],
    ['a tool_result of no call', { messages: [user('q'), { role: 'assistant', content: [use('t1')] }, user([result('t1'), result('t9')])], tools }, 'unexpected `tool_use_id` found in `tool_result` blocks: t9'],
    ['a repeated tool_use id', { messages: [user('q'), { role: 'assistant', content: [use('t1')] }, user([result('t1')]), { role: 'assistant', content: [use('t1')] }, user([result('t1')])], tools }, '`tool_use` ids must be unique'],
    ['a tool_choice forcing a tool the request does not define', { messages: [user('q')], tools, tool_choice: { type: 'tool', name: 'nope' } }, "tool_choice.name: Tool 'nope' not found in tools"],
    ['a tool_choice of no known type', { messages: [user('q')], tools, tool_choice: { type: 'function', name: 'a' } }, "tool_choice: Input tag 'function' found using 'type' does not match any of the expected tags"],
    ['tool blocks without tools', { messages: [user('q'), { role: 'assistant', content: [use('t1')] }, user([result('t1')])] }, 'Requests which include `tool_use` or `tool_result` blocks must define tools.'],
    ['temperature over 1', { messages: [user('q')], temperature: 2 }, 'temperature: Input should be less than or equal to 1'],
    ['a whitespace-only stop sequence', { messages: [user('q')], stop_sequences: ['\n'] }, 'stop_sequences: each stop sequence must contain non-whitespace'],
    ['a bmp image', { messages: [user([{ type: 'image', source: { type: 'base64', media_type: 'image/bmp', data: 'Qk0=' } }])] }, "media_type: Input should be 'image/jpeg', 'image/png', 'image/gif' or 'image/webp'"],
  ];

  it.each(cases)('%s: a 400 in the API error shape', async (_name, fields, message) => {
    const mock = await startMock({ apiKey: TEST_KEY });
    for (const path of ['/v1/messages', '/v1/messages/count_tokens']) {
      const res = await fetch(`${mock.url}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-api-key': TEST_KEY, 'anthropic-version': '2023-06-01' },
        body: JSON.stringify({ model: 'claude-sonnet-4-5', max_tokens: 64, ...fields }),
      });
      expect(res.status).toBe(400);
      const body = (await res.json()) as { type: string; error: { type: string; message: string }; request_id: string };
      expect(body).toMatchObject({ type: 'error', error: { type: 'invalid_request_error' } });
      expect(body.error.message).toContain(message);
      expect(body.request_id).toMatch(/^req_/);
    }
  });

  it('takes what the real API takes: merged consecutive turns, whitespace beside text, tool results first, a prefill', () => {
    const ok = (fields: Record<string, unknown>) => expect(() => checkMessagesRequest({ model: 'm', max_tokens: 5, ...fields })).not.toThrow();
    ok({ messages: [user('a'), user('b'), { role: 'assistant', content: 'c' }, { role: 'assistant', content: 'd' }, user('e')] });
    ok({ messages: [user([{ type: 'text', text: ' ' }, { type: 'text', text: 'real' }])] });
    ok({ messages: [user('q'), { role: 'assistant', content: [use('t1'), use('t2')] }, user([result('t1')]), user([result('t2'), { type: 'text', text: 'more' }])], tools });
    ok({ messages: [user('q'), { role: 'assistant', content: '' }] });
    expect(() => checkMessagesRequest({ messages: [user('')] })).toThrow(MockRequestError);
  });
});
