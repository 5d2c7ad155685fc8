// A chat stream read through the openai SDK as a user's loop would, for the tests that check what the client got of
// an answer that may break: the text its deltas carried, its chunks, and the error the SDK raised for the break, if one did.
import type OpenAI from 'openai';
import type { ChatCompletionChunk } from 'openai/resources/chat/completions';

export async function streamedText(
  stream: AsyncIterable<ChatCompletionChunk>,
): Promise<{ text: string; chunks: ChatCompletionChunk[]; err: Error | undefined }> {
  let text = '';
  const chunks: ChatCompletionChunk[] = [];
  try {
    for await (const chunk of stream) {
      chunks.push(chunk);
      text += chunk.choices[0]?.delta?.content ?? '';
    }
  } catch (e) {
    return { text, chunks, err: e as Error };
  }
  return { text, chunks, err: undefined };
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

/** A chat stream opened with fetch (no SDK), its first chunk read: for tests that stop or signal the gateway mid-stream. */
export async function openRawStream(url: string): Promise<ReadableStreamDefaultReader<Uint8Array>> {
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'a long answer' }], stream: true }),
  });
  const reader = res.body!.getReader();
  await reader.read();
  return reader;
}

/** The rest of a raw stream as text; a lost connection ends it (the text is then what the client had of it). */
export async function readRawRest(reader: ReadableStreamDefaultReader<Uint8Array>): Promise<string> {
  const decoder = new TextDecoder();
  let text = '';
  for (;;) {
    const { value, done } = await reader.read().catch(() => ({ value: undefined, done: true as const }));
    if (done) return text;
    text += decoder.decode(value, { stream: true });
  }
}
