// A chat stream translated from Anthropic's Messages SSE: text, a tool_use over input_json_delta pieces, usage.
import { describe, expect, it } from 'vitest';
import { useScriptedGateway } from './helpers/scripted-provider.ts';

const gw = useScriptedGateway((c, origin) => {
  c.providers.p = { family: 'anthropic', baseUrl: origin, apiKey: 'anthropic-key', breaker: false };
  c.routes = c.routes.filter((r) => r.match.path === '/v1/chat/completions').map((r) => ({ ...r, targets: [{ provider: 'p', model: 'claude-sonnet-4-5' }] }));
});
const aev = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;

describe('Anthropic translation on the wire', () => {
  it('A1 text then tool_use streamed, with usage, through chat.completions.stream', async () => {
    const args = '{"location": "Paris"}';
    const steps = [
      aev('message_start', { message: { id: 'msg_01', type: 'message', role: 'assistant', content: [], model: 'claude-sonnet-4-5', stop_reason: null, stop_sequence: null, usage: { input_tokens: 25, output_tokens: 1 } } }),
      aev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
      aev('ping', {}),
      aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Let me check ' } }),
      aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'héllo 🎉' } }),
      aev('content_block_stop', { index: 0 }),
      aev('content_block_start', { index: 1, content_block: { type: 'tool_use', id: 'toolu_01', name: 'get_weather', input: {} } }),
      ...args.match(/.{1,5}/g)!.map((p) => aev('content_block_delta', { index: 1, delta: { type: 'input_json_delta', partial_json: p } })),
      aev('content_block_stop', { index: 1 }),
      aev('message_delta', { delta: { stop_reason: 'tool_use', stop_sequence: null }, usage: { output_tokens: 40 } }),
      aev('message_stop', {}),
    ];
    const { client } = await gw(() => ({ steps }));
    const final = await client.chat.completions
      .stream({ model: 'gpt-4o', messages: [{ role: 'user', content: 'weather?' }], stream_options: { include_usage: true }, tools: [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { location: { type: 'string' } } } } }] })
      .finalChatCompletion();
    expect(final.choices[0]!.message.content).toBe('Let me check héllo 🎉');
    expect((final.choices[0]!.message.tool_calls![0] as { function: { arguments: string } }).function.arguments).toBe(args);
    expect(final.choices[0]!.finish_reason).toBe('tool_calls');
    expect(final.usage?.completion_tokens).toBe(40);
    expect(final.usage?.prompt_tokens).toBe(25);
  });

  it('A2 an overloaded_error event after output raises', async () => {
    const steps = [
      aev('message_start', { message: { id: 'msg_01', type: 'message', role: 'assistant', content: [], model: 'claude-sonnet-4-5', stop_reason: null, stop_sequence: null, usage: { input_tokens: 25, output_tokens: 1 } } }),
      aev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
      aev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Hi' } }),
      aev('error', { error: { type: 'overloaded_error', message: 'Overloaded' } }),
    ];
    const { client } = await gw(() => ({ steps }));
    await expect(client.chat.completions.stream({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x' }] }).finalChatCompletion()).rejects.toThrow(/Overloaded|upstream/);
  });
});
