// Adversarial review of the OpenAI <-> Anthropic translation (2026-12-06): inputs translated wrong rather than
// refused, driven with the official `openai` SDK through the gateway against scripted Anthropic upstreams on 127.0.0.1.
import { describe, expect, it } from 'vitest';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';
import { cc, delta, json, type Script } from './helpers/scripted-provider.ts';
import { parseExact, stringifyExact } from '../src/providers/exact-json.ts';

const start = useScriptedUpstreams();

/** An Anthropic SSE event as Anthropic frames it: its name, then data carrying the same type. */
const aev = (type: string, data: string) => `event: ${type}\ndata: {"type":"${type}",${data}}\n\n`;
const MESSAGE_START = aev('message_start', '"message":{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":1}}');
const TOOL_END = [aev('message_delta', '"delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":9}'), aev('message_stop', '')];

// Written as Anthropic writes them: the digits JSON.parse rounds (a 64-bit id past 2^53, a decimal of 20 digits).
const ID = '1729384756102938475';
const AMOUNT = '12345678901234.56789';
const INPUT_TEXT = `{"tweet_id":${ID},"amount":${AMOUNT},"n":3}`;

/** A whole Anthropic answer calling `lookup` with INPUT_TEXT as its input, as raw JSON text. */
const toolAnswer: Script = {
  status: 200,
  headers: { 'content-type': 'application/json' },
  steps: [
    `{"id":"msg_01","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"tool_use","id":"toolu_01","name":"lookup","input":${INPUT_TEXT}}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":9}}`,
  ],
};
const tools = [{ type: 'function' as const, function: { name: 'lookup', parameters: { type: 'object', properties: { tweet_id: { type: 'integer' }, amount: { type: 'number' }, n: { type: 'integer' } } } } }];
const claude = [{ provider: 'a', model: 'claude-sonnet-4-5' }];

describe('numbers JSON.parse would round, in tool inputs crossing the translation', () => {
  it('a whole answer gives the tool call its arguments with every digit Anthropic wrote, as its stream does', async () => {
    const { client } = await start({ a: { answer: () => toolAnswer, family: 'anthropic' } }, claude);
    const answer = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'look up that tweet' }], tools });
    const call = answer.choices[0]!.message.tool_calls![0]! as { function: { arguments: string } };
    expect(call.function.arguments).toContain(`"tweet_id":${ID}`); // was 1729384756102938400: another tweet
    expect(call.function.arguments).toContain(`"amount":${AMOUNT}`); // was 12345678901234.568
    expect(call.function.arguments).toContain('"n":3');
    expect(answer.choices[0]!.finish_reason).toBe('tool_calls');
  });

  it('a streamed tool_use whose whole input came in its content_block_start (a compatible server) keeps every digit', async () => {
    const steps = [MESSAGE_START, aev('content_block_start', `"index":0,"content_block":{"type":"tool_use","id":"toolu_01","name":"lookup","input":${INPUT_TEXT}}`), aev('content_block_stop', '"index":0'), ...TOOL_END];
    const { client } = await start({ a: { answer: () => ({ steps }), family: 'anthropic' } }, claude);
    const st = client.chat.completions.stream({ model: 'gpt-4o', messages: [{ role: 'user', content: 'look up that tweet' }], tools });
    const done = await st.finalChatCompletion();
    const args = (done.choices[0]!.message.tool_calls![0]! as { function: { arguments: string } }).function.arguments;
    expect(args).toContain(`"tweet_id":${ID}`);
    expect(args).toContain(`"amount":${AMOUNT}`);
  });

  it('a tool call in the history reaches Anthropic as its arguments wrote it, not rounded', async () => {
    const { client, seen } = await start({ a: { answer: () => toolAnswer, family: 'anthropic' } }, claude);
    await client.chat.completions.create({
      model: 'gpt-4o',
      tools,
      messages: [
        { role: 'user', content: 'look up that tweet' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'lookup', arguments: `{"tweet_id": ${ID}, "amount": ${AMOUNT}}` } }] },
        { role: 'tool', tool_call_id: 'call_1', content: 'found' },
      ],
    });
    const raw = seen.a![0]!.raw!;
    expect(raw).toContain(`"tweet_id":${ID}`);
    expect(raw).toContain(`"amount":${AMOUNT}`);
  });

  it('an Anthropic client\'s tool_use input reaches the target model it is renamed for with every digit (/v1/messages)', async () => {
    const answer = { status: 200, headers: { 'content-type': 'application/json' }, steps: [JSON.stringify({ id: 'msg_02', type: 'message', role: 'assistant', model: 'claude-sonnet-4-5', content: [{ type: 'text', text: 'ok' }], stop_reason: 'end_turn', stop_sequence: null, usage: { input_tokens: 9, output_tokens: 1 } })] };
    const { s, seen } = await start({ a: { answer: () => answer, family: 'anthropic' } }, claude, { path: '/v1/messages' });
    // As the Python SDK writes it (its json writes a big int exactly; JSON.stringify cannot): sent as raw text.
    const body = `{"model":"claude-sonnet-4-6","max_tokens":64,"tools":[{"name":"lookup","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"look it up"},{"role":"assistant","content":[{"type":"tool_use","id":"toolu_01","name":"lookup","input":${INPUT_TEXT}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_01","content":"found"}]}]}`;
    const res = await fetch(`${s.url}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01', 'x-api-key': 'client-key' }, body });
    expect(res.status).toBe(200);
    const raw = seen.a![0]!.raw!;
    expect(raw).toContain('"model":"claude-sonnet-4-5"'); // swapped for the target's
    expect(raw).toContain(`"tweet_id":${ID}`); // was 1729384756102938400
    expect(raw).toContain(`"amount":${AMOUNT}`);
  });
});

describe('stream recovery onto an Anthropic model named with a dot (OpenRouter and LiteLLM spell them so)', () => {
  it('sends no prefill to anthropic/claude-sonnet-4.6, which refuses one: read as 4.0, a 400 spent a retry', async () => {
    const cut: Script = { steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'The answer is ' })]), 50, { destroy: true }] };
    const refusal = json(400, { type: 'error', error: { type: 'invalid_request_error', message: 'Prefilling assistant messages is not supported for this model.' } });
    const { client, seen } = await start({ p: () => cut, a: { answer: () => refusal, family: 'anthropic' } }, [{ provider: 'p' }, { provider: 'a', model: 'anthropic/claude-sonnet-4.6' }], {
      route: { streamRecovery: 'continue', retry: { maxAttempts: 1 } },
    });
    let text = '';
    const err = await (async () => {
      const st = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'what is it?' }], stream: true });
      for await (const chunk of st) text += chunk.choices[0]?.delta.content ?? '';
    })().then(() => undefined, (e: unknown) => e);
    expect(text).toBe('The answer is ');
    expect(err).toBeDefined(); // the cut stream ends in an error event, as with no recovery
    expect(seen.a).toHaveLength(0); // no prefill sent to a model that refuses one (a prefill of 4.5 and older is tested in prefill.test.ts)
  });
});


describe('exact JSON (src/providers/exact-json.ts)', () => {
  it('keeps every number a double would round, wherever it sits, and reads the rest as JSON.parse does', () => {
    const text = '{"id":-1729384756102938475,"f":12345678901234.56789,"big":1e400,"small":1.5,"n":[9007199254740993,2],"s":"12345678901234567890 \\"q\\" \\\\","id2":1,"id2":2}';
    const parsed = parseExact(text) as Record<string, unknown>;
    expect(parsed['small']).toBe(1.5);
    expect(parsed['s']).toBe('12345678901234567890 "q" \\');
    expect(parsed['id2']).toBe(2);
    expect(stringifyExact(parsed)).toBe('{"id":-1729384756102938475,"f":12345678901234.56789,"big":1e400,"small":1.5,"n":[9007199254740993,2],"s":"12345678901234567890 \\"q\\" \\\\","id2":2}');
    // Texts with no long digit run take JSON.parse's own path, errors included.
    expect(stringifyExact(parseExact('{"a":[1,2.5,"x"]}'))).toBe('{"a":[1,2.5,"x"]}');
    expect(() => parseExact('{"a":1')).toThrow(SyntaxError);
    expect(() => parseExact('{"a":12345678901234567')).toThrow();
  });
});
