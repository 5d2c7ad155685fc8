// Builders of tool-calling streams as OpenAI and Anthropic send them, for the suites that script an upstream's tool
// calls byte by byte (third-party suites 75 and 76), and the runnable tool their agents run.
import { cc, delta, type Script } from './scripted-provider.ts';

/** The opening delta of a call (id, type, name, empty arguments), as OpenAI streams it. */
export const opens = (index: number, id: string, name = 'get_weather') => ({ index, id, type: 'function', function: { name, arguments: '' } });
/** A later delta of a call: an arguments fragment only. */
export const args = (index: number, fragment: string) => ({ index, function: { arguments: fragment } });
export const toolChunk = (...calls: unknown[]) => cc([delta({ tool_calls: calls })]);
export const ROLE = cc([delta({ role: 'assistant', content: null })]);
export const FINISH_TOOLS = cc([delta({}, 'tool_calls')]);

/** Anthropic's SSE framing: the event line, then its data. */
export const aev = (type: string, fields: Record<string, unknown> = {}) => `event: ${type}\ndata: ${JSON.stringify({ type, ...fields })}\n\n`;
export const messageStart = (id = 'msg_01Tool', model = 'claude-sonnet-4-6') =>
  aev('message_start', { message: { id, type: 'message', role: 'assistant', model, content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 40, output_tokens: 1 } } });
export const anthropicSse = (steps: Script['steps']): Script => ({ headers: { 'content-type': 'text/event-stream', 'request-id': 'req_01ToolStream' }, steps });

/** A runnable get_weather for runTools(), recording every call it is asked to run. */
export function runnableWeather(ran: unknown[], parameters: Record<string, unknown>) {
  return {
    type: 'function' as const,
    function: {
      name: 'get_weather',
      description: 'Weather of a city',
      parameters,
      parse: (text: string) => JSON.parse(text) as { city: string },
      function: (a: { city: string }) => {
        ran.push(a);
        return `${a.city}: 14 °C, rain`;
      },
    },
  };
}
