// A chat stream read through the openai SDK as a user's loop would, for the tests that check what the client got of
// an answer that may break: the text its deltas carried, and the error the SDK raised for the break, if one did.
import type OpenAI from 'openai';
import type { ChatCompletionChunk } from 'openai/resources/chat/completions';

export async function streamedText(stream: AsyncIterable<ChatCompletionChunk>): Promise<{ text: string; err: Error | undefined }> {
  let text = '';
  try {
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  } catch (e) {
    return { text, err: e as Error };
  }
  return { text, err: undefined };
}

export type ReadRest = () => Promise<{ text: string; err?: unknown }>;

/** Opens a streamed request and reads it until `wanted` has come; `rest` reads on to its end, or to its error. */
export async function streamUntil(client: OpenAI, wanted: string): Promise<{ rest: ReadRest; abort: () => void }> {
  const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], stream: true });
  const it = stream[Symbol.asyncIterator]();
  let text = '';
  while (text !== wanted) {
    const { value, done } = await it.next();
    if (done) throw new Error(`the stream ended at ${JSON.stringify(text)}`);
    text += value.choices[0]?.delta?.content ?? '';
  }
  const rest: ReadRest = async () => {
    try {
      for (;;) {
        const { value, done } = await it.next();
        if (done) return { text };
        text += value.choices[0]?.delta?.content ?? '';
      }
    } catch (err) {
      return { text, err };
    }
  };
  return { rest, abort: () => stream.controller.abort() };
}

/** Tool calls as the deltas assemble them, by (choice, call) index, with how many deltas named each call's id. */
export function toolCalls(chunks: ChatCompletionChunk[], choice = 0) {
  const calls: Record<number, { id?: string; name?: string; args: string; ids: number }> = {};
  for (const chunk of chunks) {
    for (const c of chunk.choices.filter((x) => x.index === choice)) {
      for (const t of c.delta?.tool_calls ?? []) {
        const call = (calls[t.index] ??= { args: '', ids: 0 });
        if (t.id) {
          call.id = t.id;
          call.ids++;
        }
        if (t.function?.name) call.name = t.function.name;
        call.args += t.function?.arguments ?? '';
      }
    }
  }
  return calls;
}
