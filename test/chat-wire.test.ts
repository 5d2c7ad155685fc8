// Chat completions, legacy completions and embeddings through the SDK's helpers: tool calls over many deltas, usage
// chunks, n = 2, logprobs, refusals, structured outputs, a reasoning model's silence, base64 embeddings.
import { z } from 'zod';
import { zodResponseFormat } from 'openai/helpers/zod';
import { describe, expect, it } from 'vitest';
import { cc, delta, fastRetries, useScriptedGateway } from './helpers/scripted-provider.ts';

const gw = useScriptedGateway(fastRetries);

const DONE = 'data: [DONE]\n\n';
const msgs = [{ role: 'user' as const, content: 'hi' }];
const usage = { prompt_tokens: 9, completion_tokens: 12, total_tokens: 21, prompt_tokens_details: { cached_tokens: 0 }, completion_tokens_details: { reasoning_tokens: 0 } };

describe('chat, completions and embeddings on the wire', () => {
  it('C1 parallel tool calls split over many deltas', async () => {
    const a1 = '{"location":"Paris, France"}';
    const a2 = '{"location":"Tokyo, Japan"}';
    const steps: string[] = [cc([delta({ role: 'assistant', content: null, refusal: null })])];
    steps.push(cc([delta({ tool_calls: [{ index: 0, id: 'call_a', type: 'function', function: { name: 'get_weather', arguments: '' } }] })]));
    for (const piece of a1.match(/.{1,4}/g)!) steps.push(cc([delta({ tool_calls: [{ index: 0, function: { arguments: piece } }] })]));
    steps.push(cc([delta({ tool_calls: [{ index: 1, id: 'call_b', type: 'function', function: { name: 'get_weather', arguments: '' } }] })]));
    for (const piece of a2.match(/.{1,4}/g)!) steps.push(cc([delta({ tool_calls: [{ index: 1, function: { arguments: piece } }] })]));
    steps.push(cc([delta({}, 'tool_calls')]), cc([], { usage }), DONE);
    const { client } = await gw(() => ({ steps }));
    const stream = client.chat.completions.stream({ model: 'gpt-4o', messages: msgs, stream_options: { include_usage: true }, tools: [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { location: { type: 'string' } } } } }] });
    const final = await stream.finalChatCompletion();
    expect(final.choices[0]!.message.tool_calls!.map((t) => (t as { function: { arguments: string } }).function.arguments)).toEqual([a1, a2]);
    expect(final.usage?.total_tokens).toBe(21);
  });

  it('C2 usage chunk then connection dropped', async () => {
    const { client } = await gw(() => ({ steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hi' })]), cc([delta({}, 'stop')]), cc([], { usage }), 20, { destroy: true }] }));
    const final = await client.chat.completions.stream({ model: 'gpt-4o', messages: msgs, stream_options: { include_usage: true } }).finalChatCompletion();
    expect(final.choices[0]!.message.content).toBe('Hi');
    expect(final.usage?.total_tokens).toBe(21);
  });

  it('C3 n=2 with logprobs and refusal', async () => {
    const lp = { content: [{ token: 'Hi', logprob: -0.1, bytes: [72, 105], top_logprobs: [] }], refusal: null };
    const { client } = await gw(() => ({
      steps: [
        cc([delta({ role: 'assistant', content: '' }, null, 0), delta({ role: 'assistant', content: '' }, null, 1)]),
        cc([{ ...delta({ content: 'Hi' }, null, 0), logprobs: lp }]),
        cc([delta({ refusal: "I'm sorry" }, null, 1)]),
        cc([delta({}, 'stop', 0)]),
        cc([delta({}, 'stop', 1)]),
        DONE,
      ],
    }));
    const final = await client.chat.completions.stream({ model: 'gpt-4o', messages: msgs, n: 2, logprobs: true }).finalChatCompletion();
    expect(final.choices[0]!.message.content).toBe('Hi');
    expect(final.choices[0]!.logprobs?.content?.[0]?.token).toBe('Hi');
    expect(final.choices[1]!.message.refusal).toBe("I'm sorry");
  });

  it('C4 structured outputs parse, stream and not', async () => {
    const json = '{"name":"Ada","age":36}';
    const { client } = await gw((b) =>
      b.stream
        ? { steps: [cc([delta({ role: 'assistant', content: '' })]), ...json.match(/.{1,5}/g)!.map((p) => cc([delta({ content: p })])), cc([delta({}, 'stop')]), DONE] }
        : { headers: { 'content-type': 'application/json' }, steps: [JSON.stringify({ id: 'chatcmpl-9', object: 'chat.completion', created: 1, model: 'gpt-4o', choices: [{ index: 0, message: { role: 'assistant', content: json, refusal: null }, logprobs: null, finish_reason: 'stop' }], usage })] },
    );
    const schema = zodResponseFormat(z.object({ name: z.string(), age: z.number().int() }), 'person');
    const parsed = await client.chat.completions.parse({ model: 'gpt-4o', messages: msgs, response_format: schema });
    expect(parsed.choices[0]!.message.parsed).toEqual({ name: 'Ada', age: 36 });
    const s = await client.chat.completions.stream({ model: 'gpt-4o', messages: msgs, response_format: schema }).finalChatCompletion();
    expect(s.choices[0]!.message.parsed).toEqual({ name: 'Ada', age: 36 });
    void z;
  });

  it('C5 reasoning model: role chunk, long silence under firstTokenMs, then content', async () => {
    const { client, seen } = await gw(() => ({ steps: [cc([delta({ role: 'assistant', content: '', refusal: null })]), 1500, cc([delta({ content: 'Yes' })]), cc([delta({}, 'stop')]), DONE] }), { firstTokenMs: 2500 });
    const final = await client.chat.completions.stream({ model: 'o3-mini', messages: msgs, reasoning_effort: 'high' }).finalChatCompletion();
    expect(final.choices[0]!.message.content).toBe('Yes');
    expect(seen.length).toBe(1);
  });

  it('C6 finish then cut while usage was asked and not sent', async () => {
    const { client } = await gw(() => ({ steps: [cc([delta({ role: 'assistant', content: '' })]), cc([delta({ content: 'Hi' })]), cc([delta({}, 'stop')]), 20, { destroy: true }] }));
    const r = await client.chat.completions
      .stream({ model: 'gpt-4o', messages: msgs, stream_options: { include_usage: true } })
      .finalChatCompletion()
      .then((f) => `ok usage=${JSON.stringify(f.usage)}`, (e: Error) => `err ${e.message}`);
    // Documented: a finished answer cut before its usage chunk gets [DONE] (the usage is lost, the text is whole).
    expect(r).toBe('ok usage=undefined');
  });

  it('C7 legacy completions stream', async () => {
    const t = (text: string, finish: string | null = null) => `data: ${JSON.stringify({ id: 'cmpl-1', object: 'text_completion', created: 1, model: 'gpt-3.5-turbo-instruct', choices: [{ text, index: 0, logprobs: null, finish_reason: finish }] })}\n\n`;
    const { client } = await gw(() => ({ steps: [t('Hel'), t('lo'), t('', 'length'), DONE] }));
    const st = await client.completions.create({ model: 'gpt-3.5-turbo-instruct', prompt: 'Say', stream: true });
    let text = '';
    for await (const c of st) text += c.choices[0]?.text ?? '';
    expect(text).toBe('Hello');
  });

  it('C8 embeddings base64 large batch', async () => {
    const dims = 1536;
    const n = 512;
    const vec = (i: number) => {
      const f = new Float32Array(dims);
      for (let j = 0; j < dims; j++) f[j] = (i * dims + j) / 1e6;
      return Buffer.from(f.buffer).toString('base64');
    };
    const { client, seen } = await gw((b) => ({
      headers: { 'content-type': 'application/json' },
      steps: [JSON.stringify({ object: 'list', data: (b.input as string[]).map((_, i) => ({ object: 'embedding', index: i, embedding: b.encoding_format === 'base64' ? vec(i) : [0] })), model: 'text-embedding-3-small', usage: { prompt_tokens: 8, total_tokens: 8 } })],
    }));
    const r = await client.embeddings.create({ model: 'text-embedding-3-small', input: Array.from({ length: n }, (_, i) => `text ${i}`) });
    expect(seen[0]!.body.encoding_format).toBe('base64');
    expect(r.data.length).toBe(n);
    expect(r.data[7]!.embedding.length).toBe(dims);
    expect(r.data[7]!.embedding[3]).toBeCloseTo((7 * dims + 3) / 1e6, 6);
  });
});
