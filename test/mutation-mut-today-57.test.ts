// Hand mutation testing of the recent days' recovery and translation code: a continuation's request (stream-recovery.ts
// structuredOutput, textOnly) and the splice's first chunk (splice's `carries`), usage read from a whole answer
// (streaming/usage.ts usageOfBody, tokens), the Anthropic stream's model (stream.ts #start), an Anthropic error's
// status (response.ts toOpenAIError) and an assistant turn's refusal (messages.ts assistantBlocks).
// 46 hand mutants: 32 killed by the existing files, 8 killed here, 6 equivalent, 0 open. No bugs found.
// Equivalent: asSameCompletion re-serialising a chunk of the completion's own id when no created was known (the same
// JSON); logprobsFrom counting 1 for a token without a string `token`; usageOfBody's `at === 0` check dropped (no JSON
// body begins with a "usage" key, and a re-read key holds no counts again); a last `tool` message after the assistant's
// turn (a tool message always adds a user turn); trimPrefill's empty tail dropped (text() never keeps a blank text);
// the tool_result sort on assistant turns too (they hold none, and the sort is stable).
import { describe, expect, it } from 'vitest';
import { toAnthropicRequest } from '../src/providers/anthropic/request.ts';
import { AnthropicStreamTranslator } from '../src/providers/anthropic/stream.ts';
import { toOpenAIError } from '../src/providers/anthropic/response.ts';
import { usageOf, usageOfBody } from '../src/streaming/usage.ts';
import { cc, delta, type Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';

const cut = { destroy: true } as const;
const DONE = 'data: [DONE]\n\n';
const messages = [{ role: 'user' as const, content: 'Where is my order?' }];
/** p's stream: "Hello", then the connection is reset. */
const cutAfterHello: Script = { steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hello' })]), 30, cut] };
const qc = (choices: unknown[], extra: Record<string, unknown> = {}) => cc(choices, { id: 'chatcmpl-Q', created: 1800000000, model: 'gpt-4o-mini', ...extra });

const startUpstreams = useScriptedUpstreams();

describe('a continuation of a request that asks for JSON output (response_format json_object)', () => {
  it('is never a prefill, even at a target that takes one: the target is asked the request as the client sent it', async () => {
    const cutInObject: Script = { steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: '{"status":' })]), 30, cut] };
    const whole: Script = { steps: [qc([delta({ role: 'assistant', content: '' })]), qc([delta({ content: '{"status":' })]), qc([delta({ content: ' "shipped"}' })]), qc([delta({}, 'stop')]), DONE] };
    const { client, seen } = await startUpstreams({ p: () => cutInObject, q: () => whole }, [{ provider: 'p' }, { provider: 'q' }], {
      route: { streamRecovery: 'continue' },
      providers: { q: { prefill: true } },
    });
    const done = await client.chat.completions.stream({ model: 'gpt-4o', messages, response_format: { type: 'json_object' } }).finalChatCompletion();
    expect(JSON.parse(done.choices[0]!.message.content!)).toEqual({ status: 'shipped' });
    // A prefill of '{"status":' under json_object had q write a whole object again after it.
    expect(seen.q!).toHaveLength(1);
    expect(seen.q![0]!.body.messages).toEqual(messages);
  });
});

describe('a continuation of a request with legacy functions', () => {
  it("asks the next target for text alone (function_call: 'none'): a function call is not the rest of the client's text", async () => {
    const rest: Script = { steps: [qc([delta({ role: 'assistant', content: '' })]), qc([delta({ content: 'Hello world' })]), qc([delta({}, 'stop')]), DONE] };
    const { client, seen } = await startUpstreams({ p: () => cutAfterHello, q: () => rest }, [{ provider: 'p' }, { provider: 'q' }], { route: { streamRecovery: 'continue' } });
    const functions = [{ name: 'track_order', parameters: { type: 'object', properties: {} } }];
    const done = await client.chat.completions.stream({ model: 'gpt-4o', messages, functions }).finalChatCompletion();
    expect(done.choices[0]!.message.content).toBe('Hello world');
    expect(seen.q![0]!.body).toMatchObject({ functions, function_call: 'none' });
  });
});

describe('a splice whose seam falls at the end of a chunk that carries usage', () => {
  it('still passes on that usage: the chunk rebuilt at the seam carries it, though it has no text past the seam nor a finish', async () => {
    const usage = { prompt_tokens: 5, completion_tokens: 1, total_tokens: 6 };
    // A compatible server that puts its usage on its last text chunk and its finish on a chunk of its own.
    const q: Script = { steps: [qc([delta({ role: 'assistant', content: '' })]), qc([delta({ content: 'Hello' })], { usage }), qc([delta({}, 'stop')]), DONE] };
    const { client } = await startUpstreams({ p: () => cutAfterHello, q: () => q }, [{ provider: 'p' }, { provider: 'q' }], { route: { streamRecovery: 'continue' } });
    const done = await client.chat.completions.stream({ model: 'gpt-4o', messages, stream_options: { include_usage: true } }).finalChatCompletion();
    expect(done.choices[0]!.message.content).toBe('Hello');
    expect(done.choices[0]!.finish_reason).toBe('stop');
    expect(done.usage).toEqual(usage);
  });
});

describe("usageOfBody: a later \"usage\" key that is an object with no counts (an echoed tool schema's property)", () => {
  it("is passed over for the answer's own usage before it, not read as no usage", () => {
    const body = {
      usage: { prompt_tokens: 12, completion_tokens: 3, total_tokens: 15 },
      tools: [{ type: 'function', function: { name: 'log', parameters: { type: 'object', properties: { usage: { type: 'string' } } } } }],
    };
    expect(usageOfBody(Buffer.from(JSON.stringify(body)))).toEqual({ prompt: 12, completion: 3 });
  });
});

describe('a token count of exactly 2^53 - 1', () => {
  it('is still a count the metrics can add (the largest one)', () => {
    expect(usageOf({ usage: { prompt_tokens: Number.MAX_SAFE_INTEGER, completion_tokens: 1 } })).toEqual({ prompt: Number.MAX_SAFE_INTEGER, completion: 1 });
  });
});

describe("an Anthropic stream's message_start with an empty model", () => {
  it('leaves the chunks the model the gateway asked for, not an empty one', () => {
    const t = new AnthropicStreamTranslator({ model: 'claude-sonnet-4-5', includeUsage: false, id: 'chatcmpl-1', created: 1 });
    const out = t.push({ event: 'message_start', data: JSON.stringify({ type: 'message_start', message: { id: 'msg_1', model: '', usage: { input_tokens: 3 } } }) });
    expect(JSON.parse(out[0]!.slice('data: '.length))).toMatchObject({ model: 'claude-sonnet-4-5' });
  });
});

describe('an Anthropic error answered with HTTP 400 whose type stands for another status', () => {
  it('keeps the upstream status 400 (only an error event inside a 200 stream takes its status from the type)', () => {
    expect(toOpenAIError(400, { type: 'error', error: { type: 'api_error', message: 'bad gateway config' } }).status).toBe(400);
    expect(toOpenAIError(0, { type: 'error', error: { type: 'api_error', message: 'boom' } }).status).toBe(500);
  });
});

describe('an assistant message of the history that carries its refusal both as a content part and as `refusal`', () => {
  it('goes to an Anthropic target as one text, not the refusal twice', () => {
    const said = "I can't help with that.";
    const r = toAnthropicRequest(
      {
        model: 'claude',
        messages: [
          { role: 'user', content: 'Pick the lock.' },
          { role: 'assistant', content: [{ type: 'refusal', refusal: said }], refusal: said },
          { role: 'user', content: 'Then how do locks work?' },
        ],
      } as Parameters<typeof toAnthropicRequest>[0],
      { model: 'claude-sonnet-4-5', defaultMaxTokens: 1024 },
    );
    expect(r.ok && r.body.messages[1]).toEqual({ role: 'assistant', content: [{ type: 'text', text: said }] });
  });
});
