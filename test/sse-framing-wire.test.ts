// SSE framing as real providers send it: CRLF, a BOM, comments, retry and event fields, multi-line data, reads split
// at every byte (inside multi-byte characters and terminators), and a 1 MB event.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { cc, delta, responsesHead, responsesTail, textDelta, useScriptedGateway, type Step } from './helpers/scripted-provider.ts';

const gw = useScriptedGateway();

const DONE = 'data: [DONE]\n\n';
const msgs = [{ role: 'user' as const, content: 'hi' }];
const crlf = (s: string) => s.replace(/\n/g, '\r\n');
/** Every byte its own write, with a pause, so each reaches the gateway as its own read. */
const bytewise = (s: string, upTo = Infinity): Step[] => {
  const b = Buffer.from(s);
  const out: Step[] = [];
  for (let i = 0; i < b.length; i++) {
    if (i < upTo) out.push(b.subarray(i, i + 1), 1);
    else {
      out.push(b.subarray(i));
      break;
    }
  }
  return out;
};
const TEXT = ['héllo ', '世界 ', '🎉🎉', ' done'];

async function chatText(client: OpenAI): Promise<string> {
  const final = await client.chat.completions.stream({ model: 'gpt-4o', messages: msgs }).finalChatCompletion();
  return final.choices[0]!.message.content ?? '';
}

describe('SSE framing', () => {
  it('F1 CRLF, BOM, comments, retry, event lines and multi-line data', async () => {
    const multi = `data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"gpt-4o",\ndata: "choices":[{"index":0,"delta":{"content":"${TEXT[1]}"},"finish_reason":null}]}\n\n`;
    const body = '\uFEFF' + crlf(': keep-alive\n\nretry: 3000\n\n' + cc([delta({ role: 'assistant', content: '' })]) + `event: message\n` + cc([delta({ content: TEXT[0] })]) + ': ping\n\n' + multi + cc([delta({ content: TEXT[2]! + TEXT[3]! })]) + cc([delta({}, 'stop')]) + DONE);
    const { client } = await gw(() => ({ steps: [body] }));
    expect(await chatText(client)).toBe(TEXT.join(''));
  });

  it('F2 byte by byte, across multi-byte characters and CRLF terminators', async () => {
    const body = crlf(cc([delta({ role: 'assistant', content: '' })]) + TEXT.map((t) => cc([delta({ content: t })])).join('') + cc([delta({}, 'stop')]) + DONE);
    const { client } = await gw(() => ({ steps: bytewise(body, 1400) }));
    expect(await chatText(client)).toBe(TEXT.join(''));
  });

  it('F2b byte by byte LF, with BOM', async () => {
    const body = '\uFEFF' + cc([delta({ role: 'assistant', content: '' })]) + TEXT.map((t) => cc([delta({ content: t })])).join('') + cc([delta({}, 'stop')]) + DONE;
    const { client } = await gw(() => ({ steps: bytewise(body, 1400) }));
    expect(await chatText(client)).toBe(TEXT.join(''));
  });

  it('F3 a 1 MB tool-call arguments delta', async () => {
    const big = JSON.stringify({ data: 'x'.repeat(1024 * 1024) });
    const body = cc([delta({ role: 'assistant', content: null })]) + cc([delta({ tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'save', arguments: '' } }] })]) + cc([delta({ tool_calls: [{ index: 0, function: { arguments: big } }] })]) + cc([delta({}, 'tool_calls')]) + DONE;
    const buf = Buffer.from(body);
    const steps: Step[] = [];
    for (let i = 0; i < buf.length; i += 50_000) steps.push(buf.subarray(i, i + 50_000), 2);
    const { client } = await gw(() => ({ steps }));
    const final = await client.chat.completions.stream({ model: 'gpt-4o', messages: msgs, tools: [{ type: 'function', function: { name: 'save', parameters: { type: 'object' } } }] }).finalChatCompletion();
    expect((final.choices[0]!.message.tool_calls![0] as { function: { arguments: string } }).function.arguments).toBe(big);
  });

  it('F4 Responses API, CRLF, byte by byte, BOM', async () => {
    const text = TEXT.join('');
    const body = '\uFEFF' + crlf([...responsesHead(), ...TEXT.map((t, i) => textDelta(t, 4 + i)), ': keep-alive\n\n', ...responsesTail(text, 10)].join(''));
    const { client } = await gw(() => ({ steps: bytewise(body, 3000) }));
    const final = await client.responses.stream({ model: 'gpt-4.1', input: 'hi' }).finalResponse();
    expect(final.status).toBe('completed');
    expect((final.output[0] as { content: Array<{ text: string }> }).content[0]!.text).toBe(text);
  });

  it('F5 events delivered several per packet with the terminator split', async () => {
    const body = crlf(cc([delta({ role: 'assistant', content: '' })]) + TEXT.map((t) => cc([delta({ content: t })])).join('') + cc([delta({}, 'stop')]) + DONE);
    const b = Buffer.from(body);
    // Split right after every '\r' (inside each \r\n\r\n).
    const steps: Step[] = [];
    let last = 0;
    for (let i = 0; i < b.length; i++) if (b[i] === 0x0d) { steps.push(b.subarray(last, i + 1), 3); last = i + 1; }
    steps.push(b.subarray(last));
    const { client } = await gw(() => ({ steps }));
    expect(await chatText(client)).toBe(TEXT.join(''));
  });
});
