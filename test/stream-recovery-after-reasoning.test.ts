// streamRecovery: continue, for a stream cut after its reasoning but before any text: the client has thoughts and no
// answer, so the next target is asked the original request afresh (nothing to prefill or match) and its stream, its
// own reasoning included, carries on the client's.
import { describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import type { ChatCompletionChunk } from 'openai/resources/chat/completions';
import { cc, delta, recoveringToNext, useScriptedGateway, type ConfigShape, type Script, type Seen } from './helpers/scripted-provider.ts';
import { metricSum, requestLine } from './helpers/stack.ts';

const cut = { destroy: true } as const;
const role = cc([delta({ role: 'assistant', content: '' })]);
const thought = (text: string) => cc([delta({ reasoning_content: text })]);
const said = (text: string) => cc([delta({ content: text })]);
const stop = cc([delta({}, 'stop')]);
const DONE = 'data: [DONE]\n\n';

/** p thinks, then is cut before its text. */
const thinksThenCut: Script = { steps: [role, thought('Let me'), thought(' think.'), 30, cut] };
/** q thinks on its own, then answers. */
const answers: Script = { steps: [role, thought('Six times seven.'), said('Forty'), said('-two.'), stop, DONE] };

const MESSAGES = [{ role: 'user' as const, content: 'What is six times seven?' }];

/** What the client's SDK made of the stream: its reasoning, its text, and the error it raised, if any. */
async function read(client: OpenAI, extra: Record<string, unknown> = {}): Promise<{ reasoning: string; text: string; err: Error | undefined }> {
  const stream = (await client.chat.completions.create({ model: 'gpt-4o', messages: MESSAGES, stream: true, ...extra })) as AsyncIterable<ChatCompletionChunk>;
  let reasoning = '';
  let text = '';
  try {
    for await (const c of stream) {
      reasoning += (c.choices[0]?.delta as { reasoning_content?: string } | undefined)?.reasoning_content ?? '';
      text += c.choices[0]?.delta?.content ?? '';
    }
  } catch (e) {
    return { reasoning, text, err: e as Error };
  }
  return { reasoning, text, err: undefined };
}

const start = useScriptedGateway(recoveringToNext());
/** q as a provider whose models continue a prefill. */
const prefilling: ConfigShape = (c, origin) => {
  recoveringToNext()(c, origin);
  (c.providers.q as Record<string, unknown>).prefill = true;
};
const startPrefilling = useScriptedGateway(prefilling);
const toQ = (seen: Seen[]) => seen.filter((r) => r.headers.authorization === 'Bearer q-key');

describe('a stream cut after its reasoning, before any text', () => {
  it('is finished by the next target, asked the original request, its reasoning and text passed on', async () => {
    const { client, seen, s } = await start((_b, n) => (n === 1 ? thinksThenCut : answers));
    const { reasoning, text, err } = await read(client);
    expect(err).toBeUndefined();
    expect(text).toBe('Forty-two.');
    // The thoughts the client had, then the next target's own: the reasoning behind the answer it gets.
    expect(reasoning).toBe('Let me think.Six times seven.');
    const asked = toQ(seen);
    expect(asked).toHaveLength(1);
    // No prefill: the request as the client sent it.
    expect(asked[0]!.body.messages).toEqual(MESSAGES);
    const line = await requestLine(s);
    expect(line.outcome).toBe('success');
    expect(line.streamEnd).toBe('recovered');
    expect(await metricSum(s, 'stormgate_stream_ends_total{route="chat",end="recovered"}')).toBe(1);
  });

  it('asks a target that continues a prefill the original request too: there is no text to prefill', async () => {
    const { client, seen } = await startPrefilling((_b, n) => (n === 1 ? thinksThenCut : answers));
    const { text, err } = await read(client);
    expect(err).toBeUndefined();
    expect(text).toBe('Forty-two.');
    expect(toQ(seen)[0]!.body.messages).toEqual(MESSAGES);
  });

  it('keeps the request\'s tools as they were: with no answer begun, a tool call is as good an answer as text', async () => {
    const { client, seen } = await start((_b, n) => (n === 1 ? thinksThenCut : answers));
    const tools = [{ type: 'function' as const, function: { name: 'get_weather', parameters: { type: 'object', properties: {} } } }];
    await read(client, { tools, tool_choice: 'auto' });
    expect(toQ(seen)[0]!.body).toMatchObject({ tools, tool_choice: 'auto' });
  });

  // DeepSeek-R1 style: the text after the thoughts begins with a paragraph break. The next answer need not.
  it.each(['Forty-two.', '\n\nForty-two.'])('takes text that is only whitespace for none: the next answer (%j) follows it, less its leading whitespace', async (next) => {
    const first: Script = { steps: [role, thought('Hmm.'), said('\n\n'), 30, cut] };
    const { client, seen } = await start((_b, n) => (n === 1 ? first : { steps: [role, said(next), stop, DONE] }));
    const { text, err } = await read(client);
    expect(err).toBeUndefined();
    expect(text).toBe('\n\nForty-two.');
    expect(toQ(seen)[0]!.body.messages).toEqual(MESSAGES);
  });

  it('is not recovered after a refusal: another answer glued to it would contradict it', async () => {
    const { client, seen } = await start((_b, n) => (n === 1 ? { steps: [role, thought('No.'), cc([delta({ refusal: 'I cannot help with that.' })]), 30, cut] } : answers));
    const { err } = await read(client);
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(toQ(seen)).toHaveLength(0);
  });
});
