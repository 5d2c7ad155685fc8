// A client's token rate (auth.limits.<name>.tokensPerMinute) settled for a whole (non-stream) answer that came
// without usage, as self-hosted servers (vLLM, llama.cpp, proxies) often send it: charged its prompt estimate and the
// output it delivered (characters / 4, at most the completion cap), as a stream without usage is. Charged its prompt
// alone, a client behind such a route used any number of output tokens under its rate. The official `openai` SDK over
// real HTTP, against a hand-rolled upstream (the bundled mock always sends a whole answer's usage); what the client was
// charged is read from the next request's refusal, as in test/client-rate-delivered.test.ts.
import type { IncomingMessage, ServerResponse } from 'node:http';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import type { ConfigInput } from '../src/config/schema.ts';
import { outputCharsOfAnswer } from '../src/streaming/stream-events.ts';
import { useFakeProviders } from './helpers/fake-provider.ts';
import { RETRY_LOOP_ONLY, TEST_KEY, useStacks, type Stack } from './helpers/stack.ts';

const start = useStacks();
const startProvider = useFakeProviders();

/** 3 tokens a minute: a token each 20 s, a bucket of 3. */
const TOKENS_PER_MINUTE = 3;
const MS_PER_TOKEN = 60_000 / TOKENS_PER_MINUTE;

type Body = Record<string, unknown>;
/** What the upstream answers a request's body with (a whole JSON answer), by the path it was sent to. */
type Answers = Partial<Record<'chat' | 'responses' | 'messages', (body: Body) => unknown>>;

/** A chat completion without usage, as vLLM answers with usage left out: `choices` as given. */
const chatAnswer = (choices: unknown[]) => ({ id: 'chatcmpl-1', object: 'chat.completion', created: 1, model: 'llama-3', choices });
const message = (fields: Body, index = 0) => ({ index, message: { role: 'assistant', ...fields }, finish_reason: 'stop' });

/** An upstream that answers each API's path with a whole answer (the test's) and keeps the bodies it was sent. */
async function upstream(answers: Answers): Promise<{ origin: string; seen: Body[] }> {
  const seen: Body[] = [];
  const p = await startProvider((req: IncomingMessage, res: ServerResponse) => {
    let raw = '';
    req.on('data', (d: Buffer) => (raw += d.toString()));
    req.on('end', () => {
      const body = JSON.parse(raw) as Body;
      seen.push(body);
      const url = req.url ?? '';
      const answer = url.endsWith('/chat/completions') ? answers.chat : url.endsWith('/responses') ? answers.responses : url.endsWith('/messages') ? answers.messages : undefined;
      if (!answer) {
        res.writeHead(404, { 'content-type': 'application/json' }).end('{"error":{"message":"no such path"}}');
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(answer(body)));
    });
  });
  return { origin: p.origin, seen };
}

/** A gateway whose chat, Responses and Messages routes go to `answers`' upstream, the client `agents` under `tokensPerMinute`. */
async function gateway(answers: Answers, tokensPerMinute = TOKENS_PER_MINUTE): Promise<{ stack: Stack; agents: OpenAI; seen: Body[] }> {
  const up = await upstream(answers);
  const route = (name: string, path: string, provider: string): ConfigInput['routes'][number] => ({ name, match: { path }, targets: [{ provider }], ...RETRY_LOOP_ONLY.route });
  const stack = await start({
    config: () => ({
      server: { host: '127.0.0.1', port: 0, logLevel: 'info' },
      providers: {
        selfhosted: { family: 'openai', baseUrl: `${up.origin}/v1`, apiKey: TEST_KEY, breaker: false },
        claude: { family: 'anthropic', baseUrl: up.origin, apiKey: TEST_KEY, breaker: false },
      },
      routes: [route('chat', '/v1/chat/completions', 'selfhosted'), route('responses', '/v1/responses', 'selfhosted'), route('messages', '/v1/messages', 'claude')],
      auth: { keys: { agents: 'key-agents' }, limits: { agents: { tokensPerMinute } } },
    }),
    // No spread on the retry-after: it is the wait itself.
    deps: { random: () => 0 },
  });
  return { stack, agents: new OpenAI({ baseURL: stack.baseURL, apiKey: 'key-agents', maxRetries: 0 }), seen: up.seen };
}

/** What a body reserves for its prompt: its bytes / 4, rounded up (the SDK sends the params as JSON, in order). */
const promptEstimate = (params: object) => Math.ceil(Buffer.byteLength(JSON.stringify(params)) / 4);

/** The first request's end: it is settled as its log line is written (after the settlement). */
async function firstEnded(stack: Stack): Promise<void> {
  await until(() => stack.logs.some((l) => l.includes('"outcome"')));
}

/**
 * The tokens the client was charged so far, read from the refusal of its next request: due - (burst - 1) × interval
 * is the wait, so the charge is burst - 1 + wait / interval, less the time since the first reservation (under 10 s).
 */
async function charged(stack: Stack, agents: OpenAI): Promise<number> {
  await firstEnded(stack);
  const refused = await agents.chat.completions.create({ model: 'llama-3', messages: [{ role: 'user', content: 'hi' }] }).catch((e: unknown) => e);
  expect(refused).toBeInstanceOf(OpenAI.RateLimitError);
  const waitMs = Number((refused as InstanceType<typeof OpenAI.RateLimitError>).headers.get('retry-after-ms'));
  return TOKENS_PER_MINUTE - 1 + Math.round(waitMs / MS_PER_TOKEN);
}

const messages = [{ role: 'user' as const, content: 'Tell me everything about retry storms, please.' }];

describe('a token rate settled for a whole answer that came without usage', () => {
  it('holds the client to its rate after a large whole answer without usage, as after a stream without usage', async () => {
    // 600 a minute (10 a second, 600 at once): the ~30-token prompt fits; the answer's 4,000 characters (1,000 tokens)
    // overdraw the rate by about 430, which takes about 43 s to pay back. Charged its prompt alone, the client was
    // let in again at once, and could go on asking for answers of any length.
    const { stack, agents, seen } = await gateway({ chat: () => chatAnswer([message({ content: 'x'.repeat(4_000) })]) }, 600);
    const answer = await agents.chat.completions.create({ model: 'llama-3', messages });
    expect(answer.choices[0]!.message.content).toHaveLength(4_000);
    expect(answer.usage).toBeUndefined();
    await firstEnded(stack);
    const next = await agents.chat.completions.create({ model: 'llama-3', messages }).catch((e: unknown) => e);
    expect(next).toBeInstanceOf(OpenAI.RateLimitError);
    const err = next as InstanceType<typeof OpenAI.RateLimitError>;
    expect(err.code).toBe('client_rate_limited');
    const overdraft = promptEstimate({ model: 'llama-3', messages }) + 1_000 - 600;
    expect(Number(err.headers.get('retry-after-ms'))).toBeGreaterThan((overdraft - 10) * 100);
    expect(Number(err.headers.get('retry-after-ms'))).toBeLessThanOrEqual((overdraft + 1) * 100);
    // The refused request never reached the upstream.
    expect(seen).toHaveLength(1);
  });

  it('charges the prompt and every choice\'s text, reasoning, refusal and tool call of a chat answer (characters / 4)', async () => {
    const choices = [
      message({ content: 'a'.repeat(100), reasoning_content: 'r'.repeat(40), reasoning: 'r'.repeat(40) }),
      message({ content: null, refusal: 'I cannot.', tool_calls: [{ id: 'c1', type: 'function', function: { name: 'get', arguments: '{"city":"Paris"}' } }] }, 1),
    ];
    const { stack, agents } = await gateway({ chat: () => chatAnswer(choices) });
    const params = { model: 'llama-3', messages, n: 2 };
    await agents.chat.completions.create(params);
    // 100 + 40 (reasoning once, under either name) + 9 + 3 + 16: 168 characters, 42 tokens.
    expect(await charged(stack, agents)).toBe(promptEstimate(params) + 42);
  });

  it('charges a legacy-style completion\'s text and no more of the output than the completion cap reserved', async () => {
    const { stack, agents } = await gateway({ chat: () => chatAnswer([message({ content: 'y'.repeat(400) })]) });
    // A cap of 5: the server answered past it (100 tokens' worth), charged the cap.
    const params = { model: 'llama-3', messages, max_tokens: 5 };
    await agents.chat.completions.create(params);
    expect(await charged(stack, agents)).toBe(promptEstimate(params) + 5);
  });

  it('charges the usage a whole answer reported, when it did', async () => {
    const { stack, agents } = await gateway({ chat: () => ({ ...chatAnswer([message({ content: 'z'.repeat(400) })]), usage: { prompt_tokens: 7, completion_tokens: 4, total_tokens: 11 } }) });
    await agents.chat.completions.create({ model: 'llama-3', messages });
    expect(await charged(stack, agents)).toBe(11);
  });

  it('charges a Responses API answer\'s output text, refusal, reasoning and tool arguments', async () => {
    const output = [
      { type: 'reasoning', id: 'rs_1', summary: [{ type: 'summary_text', text: 's'.repeat(20) }], content: [{ type: 'reasoning_text', text: 't'.repeat(12) }] },
      { type: 'function_call', id: 'fc_1', call_id: 'call_1', name: 'lookup', arguments: '{"q":"storms"}', status: 'completed' },
      { type: 'message', id: 'msg_1', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text: 'o'.repeat(200), annotations: [] }, { type: 'refusal', refusal: 'no' }] },
    ];
    const { stack, agents } = await gateway({ responses: () => ({ id: 'resp_1', object: 'response', created_at: 1, status: 'completed', model: 'llama-3', output, usage: null }) });
    const params = { model: 'llama-3', input: 'Tell me everything about retry storms, please.' };
    const answer = await agents.responses.create(params);
    expect(answer.output_text).toHaveLength(200);
    // 20 + 12 + 14 + 200 + 2: 248 characters, 62 tokens.
    expect(await charged(stack, agents)).toBe(promptEstimate(params) + 62);
  });

  it('charges an Anthropic Messages answer\'s text, thinking and tool input', async () => {
    const content = [
      { type: 'thinking', thinking: 'h'.repeat(40), signature: 'sig' },
      { type: 'text', text: 'm'.repeat(120) },
      { type: 'tool_use', id: 'toolu_1', name: 'lookup', input: { q: 'storms' } },
    ];
    const { stack, agents } = await gateway({ messages: () => ({ id: 'msg_1', type: 'message', role: 'assistant', model: 'claude-sonnet-4-6', content, stop_reason: 'tool_use', stop_sequence: null }) });
    const params = { model: 'claude-sonnet-4-6', max_tokens: 4_096, messages };
    const answer = await agents.post<{ content: unknown[] }>('/messages', { body: params });
    expect(answer.content).toHaveLength(3);
    // 40 + 120 + 14 (the input as JSON: {"q":"storms"}): 174 characters, 44 tokens; the rest of the cap given back.
    expect(await charged(stack, agents)).toBe(promptEstimate(params) + 44);
  });
});

describe('the output a whole answer carries (outputCharsOfAnswer)', () => {
  it('counts what the stream path counts of each shape, and nothing of a body it cannot read', () => {
    const body = (v: unknown) => Buffer.from(JSON.stringify(v));
    expect(outputCharsOfAnswer('chat', body(chatAnswer([message({ content: [{ type: 'text', text: 'abc' }] }), null, { message: null }])))).toBe(3);
    expect(outputCharsOfAnswer('chat', body(chatAnswer([message({ content: 'ab', function_call: { name: 'f', arguments: '{}' }, audio: { transcript: 'hey' } })])))).toBe(2 + 1 + 2 + 3);
    expect(outputCharsOfAnswer('completions', body({ object: 'text_completion', choices: [{ index: 0, text: 'abcd' }, { index: 1, text: 'ef' }] }))).toBe(6);
    expect(outputCharsOfAnswer('responses', body({ object: 'response', output: [{ type: 'custom_tool_call', input: 'x = 1' }, { type: 'web_search_call', status: 'completed' }, null] }))).toBe(5);
    expect(outputCharsOfAnswer('messages', body({ type: 'message', content: [{ type: 'redacted_thinking', data: 'AAAA' }, { type: 'server_tool_use', input: {} }] }))).toBe(2);
    expect(outputCharsOfAnswer('embeddings', body({ object: 'list', data: [{ embedding: [0.1] }] }))).toBe(0);
    expect(outputCharsOfAnswer('other', body({ choices: [{ message: { content: 'abc' } }] }))).toBe(0);
    expect(outputCharsOfAnswer('chat', Buffer.from('{not json'))).toBe(0);
    expect(outputCharsOfAnswer('chat', Buffer.from('null'))).toBe(0);
  });
});

async function until(check: () => boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error('timed out waiting');
    await new Promise((r) => setTimeout(r, 10));
  }
}
