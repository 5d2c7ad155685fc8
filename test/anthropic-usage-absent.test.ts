// A chat completion served by an Anthropic-family target whose answer came without usage (a proxy in front of
// Anthropic that leaves it out): the translation invents no usage of 0 tokens. Invented, it reached the client as a
// real usage, and the gateway read it as one: a client under auth.limits.<name>.tokensPerMinute was charged 0 tokens,
// not even its prompt, and stormgate_tokens_total counted 0. Left out, the answer is settled as any answer without
// usage is: its prompt estimate plus the output it delivered (characters / 4). The official `openai` SDK over real HTTP
// against a hand-rolled Anthropic-shaped upstream; what the client was charged is read from its next request's
// refusal, as in test/client-rate-whole-delivered.test.ts.
import type { IncomingMessage, ServerResponse } from 'node:http';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { RETRY_LOOP_ONLY, TEST_KEY, requestLine, useStacks, type Stack } from './helpers/stack.ts';

const start = useStacks();
const startProvider = useFakeProviders();

/** 3 tokens a minute: a token each 20 s, a bucket of 3. */
const TOKENS_PER_MINUTE = 3;
const MS_PER_TOKEN = 60_000 / TOKENS_PER_MINUTE;
const MODEL = 'claude-sonnet-4-6';
const TEXT = 'm'.repeat(120); // 30 tokens' worth

type Body = Record<string, unknown>;

/** An Anthropic Messages answer with `usage` as given (left out when undefined). */
const messageAnswer = (usage?: unknown) => ({
  id: 'msg_1',
  type: 'message',
  role: 'assistant',
  model: MODEL,
  content: [{ type: 'text', text: TEXT }],
  stop_reason: 'end_turn',
  stop_sequence: null,
  ...(usage !== undefined && { usage }),
});

/** An Anthropic Messages stream: message_start's and message_delta's usage as given (left out when undefined). */
function messageStream(usage?: { start: unknown; delta: unknown }): string {
  const { usage: _left, content: _none, ...message } = messageAnswer();
  const events: Array<[string, Body]> = [
    ['message_start', { type: 'message_start', message: { ...message, content: [], stop_reason: null, ...(usage && { usage: usage.start }) } }],
    ['content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } }],
    ['content_block_delta', { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: TEXT.slice(0, 60) } }],
    ['content_block_delta', { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: TEXT.slice(60) } }],
    ['content_block_stop', { type: 'content_block_stop', index: 0 }],
    ['message_delta', { type: 'message_delta', delta: { stop_reason: 'end_turn', stop_sequence: null }, ...(usage && { usage: usage.delta }) }],
    ['message_stop', { type: 'message_stop' }],
  ];
  return events.map(([event, data]) => `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`).join('');
}

/** An Anthropic-shaped upstream: /v1/messages answered whole or streamed, as the request asks, by `answer`. */
async function upstream(answer: { whole: () => unknown; stream: () => string }): Promise<string> {
  const p = await startProvider((req: IncomingMessage, res: ServerResponse) => {
    let raw = '';
    req.on('data', (d: Buffer) => (raw += d.toString()));
    req.on('end', () => {
      if (!(req.url ?? '').endsWith('/v1/messages')) {
        res.writeHead(404, { 'content-type': 'application/json' }).end('{"type":"error","error":{"type":"not_found_error","message":"no such path"}}');
        return;
      }
      const body = JSON.parse(raw) as Body;
      if (body.stream === true) res.writeHead(200, { 'content-type': 'text/event-stream' }).end(answer.stream());
      else res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(answer.whole()));
    });
  });
  return p.origin;
}

/** A gateway whose chat route goes to the Anthropic upstream, the client `agents` under TOKENS_PER_MINUTE. */
async function gateway(answer: { whole: () => unknown; stream: () => string }): Promise<{ stack: Stack; agents: OpenAI }> {
  const origin = await upstream(answer);
  const stack = await start({
    config: () => ({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: { claude: { family: 'anthropic', baseUrl: origin, apiKey: TEST_KEY, breaker: false } },
      routes: [{ name: 'chat', match: { path: '/v1/chat/completions' }, targets: [{ provider: 'claude' }], ...RETRY_LOOP_ONLY.route }],
      auth: { keys: { agents: 'key-agents' }, limits: { agents: { tokensPerMinute: TOKENS_PER_MINUTE } } },
    }),
    // No spread on the retry-after: it is the wait itself.
    deps: { random: () => 0 },
  });
  return { stack, agents: new OpenAI({ baseURL: stack.baseURL, apiKey: 'key-agents', maxRetries: 0 }) };
}

/** What a body reserves for its prompt: its bytes / 4, rounded up (the SDK sends the params as JSON, in order). */
const promptEstimate = (params: object) => Math.ceil(Buffer.byteLength(JSON.stringify(params)) / 4);

/** The tokens the client was charged so far, read from the refusal of its next request (see client-rate-whole-delivered). */
async function charged(stack: Stack, agents: OpenAI): Promise<number> {
  await until(() => stack.logs.some((l) => l.includes('"outcome"')));
  const refused = await agents.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'hi' }] }).catch((e: unknown) => e);
  expect(refused).toBeInstanceOf(OpenAI.RateLimitError);
  const waitMs = Number((refused as InstanceType<typeof OpenAI.RateLimitError>).headers.get('retry-after-ms'));
  return TOKENS_PER_MINUTE - 1 + Math.round(waitMs / MS_PER_TOKEN);
}

const messages = [{ role: 'user' as const, content: 'Tell me everything about retry storms, please.' }];
const noUsage = { whole: () => messageAnswer(), stream: () => messageStream() };

describe('a chat answer translated from an Anthropic answer that came without usage', () => {
  it('is whole without usage, and charged its prompt estimate and its output, not 0 tokens', async () => {
    const { stack, agents } = await gateway(noUsage);
    const params = { model: MODEL, messages };
    const answer = await agents.chat.completions.create(params);
    expect(answer.choices[0]!.message.content).toBe(TEXT);
    expect(answer.usage).toBeUndefined();
    expect(await charged(stack, agents)).toBe(promptEstimate(params) + 30);
    // Nothing counted as if reported: no usage in the log line, none in stormgate_tokens_total.
    expect((await requestLine(stack)).usage).toBeUndefined();
  });

  it('is whole without usage when the upstream sent `usage: null` or an empty one', async () => {
    for (const usage of [null, {}]) {
      const { agents } = await gateway({ whole: () => messageAnswer(usage), stream: () => messageStream() });
      const answer = await agents.chat.completions.create({ model: MODEL, messages });
      expect(answer.usage).toBeUndefined();
    }
  });

  it('streams no usage chunk for include_usage, and is charged its prompt estimate and its output', async () => {
    const { stack, agents } = await gateway(noUsage);
    const params = { model: MODEL, messages, stream: true as const, stream_options: { include_usage: true } };
    const stream = await agents.chat.completions.create(params);
    let text = '';
    const usages: unknown[] = [];
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? '';
      if (chunk.usage != null) usages.push(chunk.usage);
    }
    expect(text).toBe(TEXT);
    expect(usages).toEqual([]);
    expect(await charged(stack, agents)).toBe(promptEstimate(params) + 30);
    expect((await requestLine(stack)).usage).toBeUndefined();
  });

  it('streams without usage for a client that did not ask for it, charged the same way', async () => {
    const { stack, agents } = await gateway(noUsage);
    const params = { model: MODEL, messages, stream: true as const };
    const stream = await agents.chat.completions.create(params);
    for await (const chunk of stream) expect(chunk.usage ?? undefined).toBeUndefined();
    expect(await charged(stack, agents)).toBe(promptEstimate(params) + 30);
  });
});

describe('a chat answer translated from an Anthropic answer that came with usage', () => {
  it('carries it, whole and streamed, and is charged it', async () => {
    const usage = { input_tokens: 7, output_tokens: 4 };
    const reported = { start: { input_tokens: 7, output_tokens: 1 }, delta: { output_tokens: 4 } };
    const { stack, agents } = await gateway({ whole: () => messageAnswer(usage), stream: () => messageStream(reported) });
    const answer = await agents.chat.completions.create({ model: MODEL, messages });
    expect(answer.usage).toMatchObject({ prompt_tokens: 7, completion_tokens: 4, total_tokens: 11 });
    expect(await charged(stack, agents)).toBe(11);
    const { stack: streamed, agents: streaming } = await gateway({ whole: () => messageAnswer(usage), stream: () => messageStream(reported) });
    const stream = await streaming.chat.completions.create({ model: MODEL, messages, stream: true, stream_options: { include_usage: true } });
    const usages: unknown[] = [];
    for await (const chunk of stream) if (chunk.usage != null) usages.push(chunk.usage);
    expect(usages).toEqual([expect.objectContaining({ prompt_tokens: 7, completion_tokens: 4, total_tokens: 11 })]);
    expect(await charged(streamed, streaming)).toBe(11);
  });
});

async function until(check: () => boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error('timed out waiting');
    await new Promise((r) => setTimeout(r, 10));
  }
}
